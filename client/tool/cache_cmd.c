/* cache_cmd.c - `neoflow cache`: look at and maintain a tuning cache
 * (daemon/cache/nf_cache.h) from the command line.
 *
 *   neoflow cache stats  [--json]
 *   neoflow cache list   [--json]
 *   neoflow cache export FILE
 *   neoflow cache import FILE
 *   neoflow cache recover [FILE]
 *   neoflow cache verify [--full] [--fix]
 *   neoflow cache gc     [--max-mb N] [--older-than DAYS] [--keep-codegen VERSION]
 *                        [--drop-quarantine]
 *   all with [--cache PATH] [--allow-network-fs]
 *
 * stats, list, export and verify open the cache read-only, so they run
 * while neoflowd serves (SQLite's own locking and the busy timeout).
 * import, recover, gc and verify --fix write: they take the daemon's
 * writer lock ("<db>.lock") and refuse, naming the daemon's pid, while
 * a neoflowd holds it, so the tool never writes beside the daemon's
 * writer thread.  Exit status: 0 success, 1 an error (messages
 * "neoflow cache: <what>: <why>" on stderr; verify also exits 1 when it
 * finds a problem), 2 a usage error.
 *
 * For client/tool/neoflow.c:
 *   int nf__cli_cache(int argc, char **argv);  (argv[0] is "cache")
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nf_buf.h"
#include "nf_cache.h"
#include "nf_env.h"
#include "nf_kernel.h"
#include "nf_wire_sign.h"

int nf__cli_cache(int argc, char **argv);

static const char cache_usage[] =
    "usage: neoflow cache COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  stats                 entry, record and quarantine counts and sizes\n"
    "  list                  one line per entry, most recently used first: key (first\n"
    "                        16 hex digits), tier, time and default time in ms,\n"
    "                        speedup, binary size, hits, last use, graph, codegen;\n"
    "                        under an entry that tuning found no correct candidate\n"
    "                        for, why (it is not tuned again until the code\n"
    "                        generator or the search's check changes)\n"
    "  export FILE           write every verified entry and all records to a new\n"
    "                        cache file (an existing FILE is refused)\n"
    "  import FILE           merge a cache file: per key the better entry stays;\n"
    "                        entries whose digest does not verify are rejected\n"
    "  recover [FILE]        bring back what can be verified from a damaged cache\n"
    "                        file (SQLite's .recover; every entry checked again as\n"
    "                        on import); without FILE, a damaged cache is first moved\n"
    "                        aside (as neoflowd does) and recovered from there\n"
    "  verify [--full] [--fix]\n"
    "                        check the database (quick_check; integrity_check with\n"
    "                        --full) and every entry's digest; --fix moves bad\n"
    "                        entries to the quarantine\n"
    "  gc [--max-mb N] [--older-than DAYS] [--keep-codegen VERSION] [--drop-quarantine]\n"
    "                        drop least recently used entries until the binaries\n"
    "                        fit in N MiB, entries unused for DAYS days, entries of\n"
    "                        any other code generator version, the quarantine;\n"
    "                        then checkpoint and vacuum\n"
    "\n"
    "options:\n"
    "  --cache PATH          the cache database (default: $NEOFLOW_CACHE, else\n"
    "                        $XDG_CACHE_HOME/neoflow/cache.db, else\n"
    "                        ~/.cache/neoflow/cache.db; for root\n"
    "                        /var/lib/neoflowd/cache.db)\n"
    "  --json                machine-readable output (stats, list)\n"
    "  --allow-network-fs    accept a cache on NFS/SMB/FUSE (one host at a time)\n"
    "  -h, --help            this text\n"
    "\n"
    "Exit status: 0 success, 1 an error or (verify) a problem found, 2 a usage error.\n";

typedef struct cache_args {
  const char *sub;
  const char *cache;
  const char *file;
  const char *keep_codegen;
  int json, full, fix, drop_quarantine, allow_network_fs;
  int64_t max_bytes, older_than_s;
} cache_args;

static int cache_usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "neoflow cache: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(run 'neoflow cache --help' for usage)\n");
  return 2;
}

/* Prints each line of msg as "neoflow cache: <what>: <line>". */
static void print_lines(const char *what, const char *tag, const char *msg) {
  while (msg && *msg) {
    const char *nl = strchr(msg, '\n');
    int n = nl ? (int)(nl - msg) : (int)strlen(msg);
    fprintf(stderr, "neoflow cache: %s: %s%.*s\n", what, tag, n, msg);
    msg = nl ? nl + 1 : NULL;
  }
}

static int cache_fail(const char *what, const nf_buf *err, int rc) {
  const char *m = nf_buf_str(err);
  if (*m)
    print_lines(what, "", m);
  else
    fprintf(stderr, "neoflow cache: %s: %s\n", what, nf_strerror(rc));
  return 1;
}

/* The default cache path (see the usage text) into out; -1 when there is
 * no home directory to put it in. */
static int default_cache_path(nf_buf *out) {
  const char *e = nf_env(NF_ENV_CACHE);
  if (e && *e) {
    nf_buf_puts(out, e);
    return 0;
  }
  if (geteuid() == 0) {
    nf_buf_puts(out, "/var/lib/neoflowd/cache.db");
    return 0;
  }
  e = nf_env(NF_ENV_XDG_CACHE_HOME);
  if (e && e[0] == '/') { /* the spec ignores relative values */
    nf_buf_printf(out, "%s/neoflow/cache.db", e);
    return 0;
  }
  const char *home = nf_env(NF_ENV_HOME);
  if (!home || !*home) {
    struct passwd *pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : NULL;
  }
  if (!home || !*home) return -1;
  nf_buf_printf(out, "%s/.cache/neoflow/cache.db", home);
  return 0;
}

/* Creates the directories above path (0700), like mkdir -p. */
static int make_parents(const char *path) {
  char *p = strdup(path);
  if (!p) return -1;
  char *slash = strrchr(p, '/');
  int rc = 0;
  if (slash && slash != p) {
    *slash = '\0';
    for (char *q = p + 1; rc == 0; q++) {
      if (*q != '/' && *q != '\0') continue;
      char c = *q;
      *q = '\0';
      if (mkdir(p, 0700) != 0 && errno != EEXIST) rc = -1;
      *q = c;
      if (c == '\0') break;
    }
  }
  free(p);
  return rc;
}

static int parse_count(const char *s, double lo, double hi, double *v) {
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(x) || x < lo || x > hi) return 0;
  *v = x;
  return 1;
}

/* Parses argv[2..]; returns 0, or an exit status. */
static int parse_cache_args(int argc, char **argv, cache_args *a) {
  int n_pos = 0;
  for (int k = 2; k < argc; k++) {
    const char *arg = argv[k];
    const char *val = NULL;
    char name[32];
    if (strncmp(arg, "--", 2) == 0 && strchr(arg, '=')) {
      size_t n = (size_t)(strchr(arg, '=') - arg);
      if (n >= sizeof name) return cache_usage_error("unknown option '%s'", arg);
      memcpy(name, arg, n);
      name[n] = '\0';
      val = arg + n + 1;
      arg = name;
    }
    int takes = !strcmp(arg, "--cache") || !strcmp(arg, "--max-mb") ||
                !strcmp(arg, "--older-than") || !strcmp(arg, "--keep-codegen");
    if (takes && !val) {
      if (k + 1 >= argc) return cache_usage_error("option '%s' needs a value", arg);
      val = argv[++k];
    } else if (!takes && val) {
      return cache_usage_error("option '%s' takes no value", arg);
    }
    double x;
    if (!strcmp(arg, "--cache")) {
      if (!*val) return cache_usage_error("%s--cache wants a path", "");
      a->cache = val;
    } else if (!strcmp(arg, "--json")) {
      a->json = 1;
    } else if (!strcmp(arg, "--full")) {
      a->full = 1;
    } else if (!strcmp(arg, "--fix")) {
      a->fix = 1;
    } else if (!strcmp(arg, "--drop-quarantine")) {
      a->drop_quarantine = 1;
    } else if (!strcmp(arg, "--allow-network-fs")) {
      a->allow_network_fs = 1;
    } else if (!strcmp(arg, "--max-mb")) {
      if (!parse_count(val, 1e-6, 1e9, &x))
        return cache_usage_error("--max-mb wants a positive number of MiB, got '%s'", val);
      a->max_bytes = (int64_t)(x * 1048576.0);
      if (a->max_bytes < 1) a->max_bytes = 1;
    } else if (!strcmp(arg, "--older-than")) {
      if (!parse_count(val, 1e-6, 1e6, &x))
        return cache_usage_error("--older-than wants a positive number of days, got '%s'", val);
      a->older_than_s = (int64_t)(x * 86400.0);
      if (a->older_than_s < 1) a->older_than_s = 1;
    } else if (!strcmp(arg, "--keep-codegen")) {
      if (!*val) return cache_usage_error("%s--keep-codegen wants a version", "");
      a->keep_codegen = val;
    } else if (arg[0] == '-' && arg[1]) {
      return cache_usage_error("unknown option '%s'", arg);
    } else if (n_pos++ == 0 && (!strcmp(a->sub, "export") || !strcmp(a->sub, "import") ||
                                !strcmp(a->sub, "recover"))) {
      a->file = arg;
    } else {
      return cache_usage_error("unexpected argument '%s'", arg);
    }
  }
  const char *s = a->sub;
  int is_gc = !strcmp(s, "gc"), is_verify = !strcmp(s, "verify");
  if ((!strcmp(s, "export") || !strcmp(s, "import")) && !a->file)
    return cache_usage_error("cache %s needs a FILE", s);
  if (a->json && strcmp(s, "stats") && strcmp(s, "list"))
    return cache_usage_error("--json applies to stats and list, not %s", s);
  if ((a->full || a->fix) && !is_verify)
    return cache_usage_error("--full and --fix apply to verify, not %s", s);
  if ((a->max_bytes || a->older_than_s || a->keep_codegen || a->drop_quarantine) && !is_gc)
    return cache_usage_error(
        "--max-mb, --older-than, --keep-codegen and --drop-quarantine "
        "apply to gc, not %s",
        s);
  return 0;
}

/* ---- printing helpers ---- */

static void json_str(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

/* A size in bytes for people: "812 B", "12.3 KiB", "1.5 MiB". */
static void human_size(int64_t n, char *out, size_t cap) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = (double)n;
  int u = 0;
  while (x >= 1024 && u < 4) {
    x /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(out, cap, "%lld B", (long long)n);
  else
    snprintf(out, cap, "%.1f %s", x, unit[u]);
}

/* Copies s for a terminal: control bytes become '?', empty becomes "-". */
static void printable(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p && n + 1 < cap; p++)
    out[n++] = (*p < 0x20 || *p == 0x7f) ? '?' : (char)*p;
  if (n == 0 && cap > 1) out[n++] = '-';
  out[n] = '\0';
}

static int finish_output(const char *what) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "neoflow cache: %s: cannot write the output: %s\n", what, strerror(errno));
    return 1;
  }
  return 0;
}

/* ---- subcommands ---- */

static int do_stats(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  nf_cache_stats s;
  int rc = nf_cache_stats_get(c, &s, &err);
  if (rc != NF_OK) {
    int st = cache_fail("stats", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  nf_buf_free(&err);
  if (a->json) {
    printf("{\"cache\":");
    json_str(nf_cache_path(c));
    printf(",\"schema\":%d,\"entries\":%" PRId64 ",\"tier1\":%" PRId64 ",\"tier2\":%" PRId64
           ",\"records\":%" PRId64 ",\"quarantined\":%" PRId64 ",\"binary_bytes\":%" PRId64
           ",\"file_bytes\":%" PRId64 "}\n",
           s.schema, s.entries, s.tier1, s.tier2, s.records, s.quarantined, s.binary_bytes,
           s.file_bytes);
  } else {
    char b1[32], b2[32];
    human_size(s.binary_bytes, b1, sizeof b1);
    human_size(s.file_bytes, b2, sizeof b2);
    printf("cache:        %s\n", nf_cache_path(c));
    printf("schema:       %d\n", s.schema);
    printf("entries:      %" PRId64 " (tier 1: %" PRId64 ", tier 2: %" PRId64 ")\n", s.entries,
           s.tier1, s.tier2);
    printf("records:      %" PRId64 "\n", s.records);
    printf("quarantined:  %" PRId64 "\n", s.quarantined);
    printf("binaries:     %s (%" PRId64 " bytes)\n", b1, s.binary_bytes);
    printf("on disk:      %s (database and WAL)\n", b2);
  }
  return finish_output("stats");
}

typedef struct list_state {
  int json;
  int64_t n;
} list_state;

/* v (> 0) to three significant digits in plain decimals ("0.000123",
 * "1.50", "12.3", "1234"): fast kernels stay apart, columns stay plain. */
static void sig3(char *o, size_t n, double v) {
  if (v >= 1e9) { /* (a time no kernel takes: a damaged entry, shown whole) */
    snprintf(o, n, "%.3g", v);
    return;
  }
  int mag = (int)floor(log10(v));
  int dec = 2 - mag;
  if (dec < 0) dec = 0;
  if (dec > 12) dec = 12;
  snprintf(o, n, "%.*f", dec, v);
}

static int list_one(void *user, const nf_cache_entry *e) {
  list_state *l = user;
  char key[65];
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    key[2 * i] = digits[e->key[i] >> 4];
    key[2 * i + 1] = digits[e->key[i] & 15];
  }
  key[64] = '\0';
  int has_speedup = e->time_ms > 0 && e->default_ms > 0;
  double speedup = has_speedup ? e->default_ms / e->time_ms : 0;
  if (l->json) {
    printf("%s\n  {\"key\":\"%s\",\"tier\":%d,\"time_ms\":%.17g,\"default_ms\":%.17g,",
           l->n ? "," : "", key, e->tier, e->time_ms, e->default_ms);
    if (has_speedup)
      printf("\"speedup\":%.17g,", speedup);
    else
      printf("\"speedup\":null,");
    printf("\"binary_bytes\":%zu,\"hits\":%" PRId64 ",\"trials\":%d,\"created\":%" PRId64
           ",\"updated\":%" PRId64 ",\"last_used\":%" PRId64 ",\"graph\":",
           e->binary_len, e->hits, e->trials, e->created, e->updated, e->last_used);
    json_str(e->graph_name);
    printf(",\"codegen\":");
    json_str(e->codegen);
    printf(",\"target\":");
    json_str(e->target_desc);
    printf(",\"schedule\":");
    json_str(e->schedule);
    if (e->tune_error && *e->tune_error) {
      printf(",\"tune_error\":");
      json_str(e->tune_error);
      printf(",\"tune_check\":%d", e->tune_check);
    } else {
      printf(",\"tune_error\":null");
    }
    printf("}");
  } else {
    if (l->n == 0)
      printf("%-16s  %4s  %10s  %10s  %7s  %10s  %6s  %-16s  %s  %s\n", "KEY", "TIER", "TIME_MS",
             "DEFAULT_MS", "SPEEDUP", "BINARY", "HITS", "LAST_USED", "GRAPH", "CODEGEN");
    char t[32] = "-", d[32] = "-", sp[32] = "-", sz[32], when[32] = "-", graph[128], cg[128];
    if (e->time_ms > 0) sig3(t, sizeof t, e->time_ms);
    if (e->default_ms > 0) sig3(d, sizeof d, e->default_ms);
    if (has_speedup) snprintf(sp, sizeof sp, "%.2fx", speedup);
    human_size((int64_t)e->binary_len, sz, sizeof sz);
    time_t lu = (time_t)e->last_used;
    struct tm tm;
    if (e->last_used > 0 && localtime_r(&lu, &tm))
      strftime(when, sizeof when, "%Y-%m-%d %H:%M", &tm);
    printable(e->graph_name, graph, sizeof graph);
    printable(e->codegen, cg, sizeof cg);
    key[16] = '\0';
    printf("%-16s  %4d  %10s  %10s  %7s  %10s  %6" PRId64 "  %-16s  %s  %s\n", key, e->tier, t, d,
           sp, sz, e->hits, when, graph, cg);
    if (e->tune_error && *e->tune_error) {
      char why[512];
      printable(e->tune_error, why, sizeof why);
      printf("%-16s  not tuned (check r%d, %d trials): %s\n", "", e->tune_check, e->trials, why);
    }
  }
  l->n++;
  return 0;
}

static int do_list(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  list_state l = {a->json, 0};
  if (a->json) printf("[");
  int rc = nf_cache_list(c, list_one, &l, &err);
  if (rc != NF_OK) {
    if (a->json) printf("\n]\n");
    fflush(stdout);
    int st = cache_fail("list", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  nf_buf_free(&err);
  if (a->json)
    printf("%s]\n", l.n ? "\n" : "");
  else if (l.n == 0)
    printf("(no entries in %s)\n", nf_cache_path(c));
  return finish_output("list");
}

static int do_export(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  int64_t n = 0;
  int rc = nf_cache_export(c, a->file, &n, &err);
  if (rc != NF_OK) {
    int st = cache_fail("export", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  print_lines("export", "warning: ", nf_buf_str(&err));
  nf_buf_free(&err);
  printf("exported %" PRId64 " entries from %s to %s\n", n, nf_cache_path(c), a->file);
  return finish_output("export");
}

static int do_import(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  nf_cache_import_report r;
  int rc = nf_cache_import(c, a->file, &r, &err);
  if (rc != NF_OK) {
    int st = cache_fail("import", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  print_lines("import", "warning: ", nf_buf_str(&err));
  nf_buf_free(&err);
  printf("imported %s into %s: %" PRId64 " entries seen, %" PRId64 " added, %" PRId64
         " replaced, %" PRId64 " kept, %" PRId64 " rejected; %" PRId64 " records merged\n",
         a->file, nf_cache_path(c), r.seen, r.added, r.replaced, r.kept, r.rejected, r.records);
  if (r.unsigned_)
    printf("%" PRId64 " entries carry no signature: their schedules and times are kept, but the "
           "daemon never serves their binaries; it rebuilds and checks each on first use "
           "(docs/security.md)\n", r.unsigned_);
  return finish_output("import");
}

/* Imported signatures count only when the daemon of this cache made them:
 * its public key comes from signing.key beside the cache (readable by the
 * daemon's user, who maintains its cache).  Without it, everything
 * imported comes in unsigned (never served as it is). */
typedef struct judge_key {
  uint8_t pk[32];
} judge_key;

static int judge_daemon(void *user, const uint8_t key[32], const uint8_t sha[32],
                        const uint8_t target[32], const nf_cache_sig *sig) {
  const judge_key *j = user;
  return !memcmp(sig->signer, j->pk, 32) &&
         nf_sign_kernel_ok(j->pk, sig->sig, key, sha, target, NF_KERNEL_ABI_VERSION);
}

static void set_judge(nf_cache *c, judge_key *j, const char *what) {
  const char *path = nf_cache_path(c);
  const char *slash = strrchr(path, '/');
  char kp[4200];
  snprintf(kp, sizeof kp, "%.*s%ssigning.key", slash ? (int)(slash - path) : 0, path,
           slash ? "/" : "");
  uint8_t sk[64];
  nf_buf err = NF_BUF_INIT;
  if (nf_sign_load_key(kp, 0, sk, j->pk, NULL, &err) == NF_OK) {
    nf_cache_set_judge(c, judge_daemon, j);
  } else {
    fprintf(stderr, "neoflow cache: %s: warning: %s: every entry comes in unsigned (its "
                    "daemon rebuilds each on first use)\n", what, nf_buf_str(&err));
  }
  memset(sk, 0, sizeof sk);
  nf_buf_free(&err);
}

static int do_recover(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  nf_cache_import_report r;
  int rc = nf_cache_recover(c, a->file, &r, &err);
  if (rc != NF_OK) {
    int st = cache_fail("recover", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  print_lines("recover", "warning: ", nf_buf_str(&err));
  nf_buf_free(&err);
  printf("recovered from %s into %s: %" PRId64 " entries read back, %" PRId64 " added, %" PRId64
         " replaced, %" PRId64 " kept, %" PRId64 " rejected (failed their checks); %" PRId64
         " records\n",
         a->file, nf_cache_path(c), r.seen, r.added, r.replaced, r.kept, r.rejected, r.records);
  if (r.unsigned_)
    printf("%" PRId64 " of them carry no signature: the daemon rebuilds each on first use\n",
           r.unsigned_);
  return finish_output("recover");
}

static int do_verify(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  nf_cache_verify_report r;
  int rc = nf_cache_verify(c, a->full, a->fix, &r, &err);
  if (rc != NF_OK && rc != NF_EFORMAT) {
    int st = cache_fail("verify", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  print_lines("verify", "", nf_buf_str(&err));
  nf_buf_free(&err);
  printf("%s: %s %s; %" PRId64 " entries checked, %" PRId64 " bad%s\n", nf_cache_path(c),
         a->full ? "integrity_check" : "quick_check", r.integrity_ok ? "ok" : "FAILED", r.checked,
         r.bad, r.bad && a->fix ? " (quarantined)" : "");
  int st = finish_output("verify");
  return rc == NF_OK ? st : 1;
}

static int do_gc(nf_cache *c, const cache_args *a) {
  nf_buf err = NF_BUF_INIT;
  nf_cache_gc_opts o = {.max_bytes = a->max_bytes,
                        .older_than_s = a->older_than_s,
                        .keep_codegen = a->keep_codegen,
                        .drop_quarantine = a->drop_quarantine};
  nf_cache_gc_report r;
  int rc = nf_cache_gc(c, &o, &r, &err);
  if (rc != NF_OK) {
    int st = cache_fail("gc", &err, rc);
    nf_buf_free(&err);
    return st;
  }
  nf_buf_free(&err);
  char sz[32];
  human_size(r.freed_bytes, sz, sizeof sz);
  printf("removed %" PRId64 " entries (%s of binaries) from %s\n", r.removed, sz, nf_cache_path(c));
  return finish_output("gc");
}

/* Runs `neoflow cache ...`: argv[0] is "cache", argv[1] the subcommand.
 * Prints to stdout and stderr; returns the process exit status (0, 1 on
 * an error or a failed verify, 2 on a usage error). */
int nf__cli_cache(int argc, char **argv) {
  if (argc < 2) return cache_usage_error("%smissing COMMAND", "");
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(cache_usage, stdout);
    return finish_output("help");
  }
  for (int k = 2; k < argc; k++)
    if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
      fputs(cache_usage, stdout);
      return finish_output("help");
    }
  static const char *const subs[] = {"stats", "list", "export", "import", "verify", "gc",
                                     "recover"};
  int known = 0;
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) known |= !strcmp(sub, subs[i]);
  if (!known) return cache_usage_error("unknown command '%s'", sub);
  cache_args a = {.sub = sub};
  int st = parse_cache_args(argc, argv, &a);
  if (st) return st;

  nf_buf path = NF_BUF_INIT;
  if (a.cache)
    nf_buf_puts(&path, a.cache);
  else if (default_cache_path(&path) != 0) {
    fprintf(stderr, "neoflow cache: %s: no home directory for the default cache; use --cache\n",
            sub);
    return 1;
  }
  if (path.oom) {
    fprintf(stderr, "neoflow cache: out of memory\n");
    nf_buf_free(&path);
    return 1;
  }
  int recover = !strcmp(sub, "recover");
  int writes = !strcmp(sub, "import") || !strcmp(sub, "gc") || a.fix || recover;
  if ((!strcmp(sub, "import") || recover) && make_parents(path.data) != 0) {
    fprintf(stderr, "neoflow cache: import: cannot create the directory of %s: %s\n", path.data,
            strerror(errno));
    nf_buf_free(&path);
    return 1;
  }
  int damaged = 0;
  long holder = 0;
  nf_cache_opts o = {.read_only = !writes, .writer_lock = writes,
                     .allow_network_fs = a.allow_network_fs, .damaged = &damaged,
                     .lock_holder = &holder};
  nf_cache *c = NULL;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_open(path.data, &o, &c, &err);
  char moved[4300];
  if (rc != NF_OK && damaged && recover && !a.file) {
    /* the cache itself is damaged: aside, then recovered from there */
    nf_buf_reset(&err);
    rc = nf_cache_move_aside(path.data, moved, sizeof moved, &err);
    if (rc == NF_OK) {
      printf("moved the damaged cache %s to %s\n", path.data, moved);
      a.file = moved;
      rc = nf_cache_open(path.data, &o, &c, &err);
    }
  } else if (rc == NF_OK && recover && !a.file) {
    printf("%s is not damaged: nothing to recover (give the damaged FILE)\n", path.data);
    nf_cache_close(c);
    nf_buf_free(&err);
    nf_buf_free(&path);
    return finish_output("recover");
  }
  if (rc != NF_OK && holder)
    nf_buf_printf(&err, "; `%s` writes, and only one writer may hold the cache: stop that "
                        "neoflowd first (stats, list, export and verify read while it serves)",
                  sub);
  if (rc != NF_OK && damaged)
    nf_buf_printf(&err, "\nthe database is damaged: `neoflow cache recover` moves it aside and "
                        "brings back what can be verified (neoflowd does the first part itself "
                        "when it starts)");
  if (rc != NF_OK) {
    st = cache_fail(sub, &err, rc);
    nf_buf_free(&err);
    nf_buf_free(&path);
    return st;
  }
  nf_buf_free(&err);
  nf_buf_free(&path);
  judge_key jk;
  if (!strcmp(sub, "import") || recover) set_judge(c, &jk, sub);
  if (!strcmp(sub, "stats"))
    st = do_stats(c, &a);
  else if (!strcmp(sub, "list"))
    st = do_list(c, &a);
  else if (!strcmp(sub, "export"))
    st = do_export(c, &a);
  else if (!strcmp(sub, "import"))
    st = do_import(c, &a);
  else if (recover)
    st = do_recover(c, &a);
  else if (!strcmp(sub, "verify"))
    st = do_verify(c, &a);
  else
    st = do_gc(c, &a);
  nf_cache_close(c);
  return st;
}
