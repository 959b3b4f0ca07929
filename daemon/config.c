/* config.c - neoflowd's configuration (see nfd_config.h): built-in
 * defaults, the INI file through libinih, the environment, and the checks
 * that refuse an unsafe or inconsistent setup.
 *
 * Every key is one row of the keys[] table (section, name, kind, field,
 * range); the loader, the range re-check of nfd_config_check and the
 * example file (deploy/neoflowd.conf.example) follow that table.
 *
 * Line numbers: Debian's libinih is built without INI_HANDLER_LINENO, so
 * the file is fed through ini_parse_stream with our own reader, which
 * counts lines (and so knows the line of every handler call), refuses
 * over-long lines instead of letting libinih split them, validates section
 * headers and spots lines that are neither a section, a comment nor a
 * "key = value" (each such line is handed to libinih as a comment, so
 * every error is reported exactly once, by us).
 *
 * Invariants:
 *  - nfd_config_load parses into a copy and commits only when the whole
 *    file was valid: a half-read file never takes effect.
 *  - A string too long for its field is an error, never truncated.
 *  - No process globals are written (libinih's runtime knobs are left as
 *    they are); this module only reads the environment. */
#include "nf_wire.h"
#include "nfd_config.h"
#include "nf_env.h"
#include "nf_trust.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "nfd_net.h"

#define MIB ((int64_t)1 << 20)
#define MAX_REPORTED 20 /* error messages appended before "and N more" */

typedef enum key_kind {
  K_INT,   /* int field, decimal, [lo, hi] */
  K_BYTES, /* int64_t field, bytes with an optional K/M/G suffix, [lo, hi] */
  K_MIB,   /* int64_t field in bytes, the value in MiB, [lo, hi] MiB */
  K_COUNT, /* int64_t field, a count with an optional K/M/G/T suffix, [lo, hi] */
  K_BOOL,  /* int field, 0/1 */
  K_STR,   /* char array */
  K_LOG,   /* int field, nfd_log_level */
  K_SYNC,  /* int field, normal = 0, full = 1 */
  K_UIDS,  /* allowed_uids / n_allowed_uids */
} key_kind;

typedef struct key_def {
  const char *section, *name;
  key_kind kind;
  size_t off, size;
  int64_t lo, hi;
} key_def;

#define FIELD(f) offsetof(nfd_config, f), sizeof(((nfd_config *)0)->f)

static const char *const sections[] = {"daemon", "cache", "tcp", "upstream", "jobs"};

static const key_def keys[] = {
    {"daemon", "socket", K_STR, FIELD(socket_path), 0, 0},
    {"daemon", "socket_group", K_STR, FIELD(socket_group), 0, 0},
    {"daemon", "allowed_uids", K_UIDS, FIELD(allowed_uids), 0, 0},
    {"daemon", "max_connections", K_INT, FIELD(max_connections), 1, 65536},
    {"daemon", "max_connections_per_uid", K_INT, FIELD(max_connections_per_uid), 1, 65536},
    {"daemon", "min_frame_rate", K_INT, FIELD(min_frame_rate), 0, 1 << 30},
    {"daemon", "max_requests", K_INT, FIELD(max_requests), 1, 65536},
    {"daemon", "handshake_timeout_ms", K_INT, FIELD(handshake_timeout_ms), 100, 600000},
    {"daemon", "progress_timeout_ms", K_INT, FIELD(progress_timeout_ms), 100, 3600000},
    {"daemon", "idle_timeout_s", K_INT, FIELD(idle_timeout_s), 0, 2592000},
    {"daemon", "output_soft_limit", K_BYTES, FIELD(output_soft_limit), 64 * 1024,
     (int64_t)16 << 30},
    {"daemon", "output_hard_limit", K_BYTES, FIELD(output_hard_limit), 64 * 1024,
     (int64_t)16 << 30},
    {"daemon", "output_soft_seconds", K_INT, FIELD(output_soft_seconds), 1, 86400},
    {"daemon", "log_level", K_LOG, FIELD(log_level), NFD_LOG_ERROR, NFD_LOG_DEBUG},
    {"daemon", "signing_key", K_STR, FIELD(signing_key), 0, 0},
    {"cache", "cache", K_STR, FIELD(cache_path), 0, 0},
    {"cache", "allow_network_fs", K_BOOL, FIELD(allow_network_fs), 0, 1},
    {"cache", "sync", K_SYNC, FIELD(cache_sync_full), 0, 1},
    {"cache", "soft_cap_mb", K_MIB, FIELD(cache_soft_cap), 0, (int64_t)1 << 30},
    {"cache", "hard_cap_mb", K_MIB, FIELD(cache_hard_cap), 0, (int64_t)1 << 30},
    {"tcp", "listen", K_STR, FIELD(tcp_listen), 0, 0},
    {"tcp", "key_file", K_STR, FIELD(tcp_key_file), 0, 0},
    {"upstream", "address", K_STR, FIELD(upstream_address), 0, 0},
    {"upstream", "key_file", K_STR, FIELD(upstream_key_file), 0, 0},
    {"upstream", "public_key", K_STR, FIELD(upstream_public_key), 0, 0},
    {"upstream", "timeout_ms", K_INT, FIELD(upstream_timeout_ms), 10, 600000},
    {"upstream", "publish", K_BOOL, FIELD(upstream_publish), 0, 1},
    {"jobs", "compile_jobs", K_INT, FIELD(compile_jobs), 1, 256},
    {"jobs", "tune_jobs", K_INT, FIELD(tune_jobs), 1, 64},
    {"jobs", "max_queued_jobs", K_INT, FIELD(max_queued_jobs), 1, 1000000},
    {"jobs", "default_trials", K_INT, FIELD(default_trials), 1, 1000000},
    {"jobs", "max_trials", K_INT, FIELD(max_trials), 1, 1000000},
    {"jobs", "default_seconds", K_INT, FIELD(default_seconds), 1, 604800},
    {"jobs", "max_seconds", K_INT, FIELD(max_seconds), 1, 604800},
    {"jobs", "compile_timeout_s", K_INT, FIELD(compile_timeout_s), 1, 86400},
    {"jobs", "measure_timeout_ms", K_INT, FIELD(measure_timeout_ms), 10, 3600000},
    {"jobs", "worker_memory_mb", K_INT, FIELD(worker_memory_mb), 64, 16777216},
    {"jobs", "max_elements", K_COUNT, FIELD(max_elements), 1, (int64_t)1 << 62},
    {"jobs", "max_gflops", K_COUNT, FIELD(max_gflops), 1, (int64_t)1 << 50},
    {"jobs", "share_budget", K_BOOL, FIELD(share_budget), 0, 1},
    {"jobs", "min_trials", K_INT, FIELD(min_trials), 1, 1000000},
    {"jobs", "min_seconds", K_INT, FIELD(min_seconds), 1, 604800},
    {"jobs", "similar_records", K_INT, FIELD(similar_records), 0, 1024},
    {"jobs", "model_records", K_INT, FIELD(model_records), 0, 65536},
};

#define N_KEYS (sizeof keys / sizeof keys[0])

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* ---- small string helpers ---- */

/* Copies s into dst[n] when it fits; 0 (dst untouched) when it does not. */
static int copy_fit(char *dst, size_t n, const char *s) {
  size_t len = strlen(s);
  if (len >= n) return 0;
  memcpy(dst, s, len + 1);
  return 1;
}

/* dst[n] = a + b + c when it fits, else "" (so the checks refuse it). */
static void join3(char *dst, size_t n, const char *a, const char *b, const char *c) {
  int len = snprintf(dst, n, "%s%s%s", a, b, c);
  if (len < 0 || (size_t)len >= n) dst[0] = 0;
}

/* A non-empty environment variable, or NULL. */
static const char *env_nonempty(nf_env_var name) {
  const char *v = nf_env(name);
  return v && v[0] ? v : NULL;
}

/* An XDG base directory variable: absolute, else ignored (XDG spec). */
static const char *env_xdg(nf_env_var name) {
  const char *v = env_nonempty(name);
  return v && v[0] == '/' ? v : NULL;
}

/* ---- defaults and environment ---- */

static void default_cache_path(nfd_config *c) {
  const char *xdg = env_xdg(NF_ENV_XDG_CACHE_HOME);
  c->cache_path[0] = 0;
  if (xdg) {
    join3(c->cache_path, sizeof c->cache_path, xdg, "/neoflow/cache.db", "");
    return;
  }
  if (geteuid() == 0) {
    join3(c->cache_path, sizeof c->cache_path, "/var/lib/neoflowd/cache.db", "", "");
    return;
  }
  const char *home = env_nonempty(NF_ENV_HOME);
  if (home) {
    join3(c->cache_path, sizeof c->cache_path, home, "/.cache/neoflow/cache.db", "");
    return;
  }
  /* No $HOME: the password database's home directory. */
  struct passwd pw, *res = NULL;
  char buf[4096];
  if (getpwuid_r(geteuid(), &pw, buf, sizeof buf, &res) == 0 && res && res->pw_dir &&
      res->pw_dir[0] == '/')
    join3(c->cache_path, sizeof c->cache_path, res->pw_dir, "/.cache/neoflow/cache.db", "");
}

static void default_socket_path(nfd_config *c) {
  (void)nf_wire_default_socket(c->socket_path, sizeof c->socket_path, 0);
}

/* Applies NEOFLOW_SOCKET and NEOFLOW_CACHE.  A value too long for its
 * field empties the field (refused later by nfd_config_check) and, when
 * err is given, is reported.  NF_OK or NF_EINVAL. */
static size_t key_index(const char *sec, const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (!strcmp(keys[i].section, sec) && !strcmp(keys[i].name, name)) return i;
  return 0; /* (not reached: both are keys) */
}

static int apply_env(nfd_config *c, nf_buf *err) {
  int rc = NF_OK;
  const char *v = env_nonempty(NF_ENV_SOCKET);
  /* (a value from the environment was not set on a line of the file) */
  if (v) c->key_line[key_index("daemon", "socket")] = 0;
  if (v && !copy_fit(c->socket_path, sizeof c->socket_path, v)) {
    c->socket_path[0] = 0;
    if (err)
      nf_buf_printf(err, "NEOFLOW_SOCKET: a path of %zu bytes is too long (at most %zu)\n",
                    strlen(v), sizeof c->socket_path - 1);
    rc = NF_EINVAL;
  }
  v = env_nonempty(NF_ENV_CACHE);
  if (v) c->key_line[key_index("cache", "cache")] = 0;
  if (v && !copy_fit(c->cache_path, sizeof c->cache_path, v)) {
    c->cache_path[0] = 0;
    if (err)
      nf_buf_printf(err, "NEOFLOW_CACHE: a path of %zu bytes is too long (at most %zu)\n",
                    strlen(v), sizeof c->cache_path - 1);
    rc = NF_EINVAL;
  }
  return rc;
}

void nfd_config_defaults(nfd_config *c) {
  memset(c, 0, sizeof *c);
  default_socket_path(c);
  c->n_allowed_uids = 0;
  c->max_connections = 256;
  c->max_connections_per_uid = 64;
  c->min_frame_rate = 1024;
  c->max_requests = 1024;
  c->handshake_timeout_ms = 5000;
  c->progress_timeout_ms = 10000;
  c->idle_timeout_s = 600;
  c->output_soft_limit = 8 * MIB;
  c->output_hard_limit = 64 * MIB;
  c->output_soft_seconds = 60;
  c->log_level = NFD_LOG_INFO;
  default_cache_path(c);
  c->allow_network_fs = 0;
  c->cache_sync_full = 0;
  c->cache_soft_cap = 0;
  c->cache_hard_cap = 0;
  long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c->compile_jobs = n_cpus < 1 ? 1 : n_cpus > 8 ? 8 : (int)n_cpus;
  c->tune_jobs = 1;
  c->upstream_timeout_ms = 1000;
  c->upstream_publish = 1;
  c->max_queued_jobs = 4096;
  c->default_trials = 200;
  c->max_trials = 2000;
  c->default_seconds = 600;
  c->max_seconds = 3600;
  c->compile_timeout_s = 60;
  c->measure_timeout_ms = 10000;
  c->worker_memory_mb = 4096;
  c->max_elements = NFD_DEFAULT_MAX_ELEMENTS;
  c->max_gflops = NFD_DEFAULT_MAX_GFLOPS;
  c->share_budget = 1;
  c->min_trials = 16;
  c->min_seconds = 15;
  c->similar_records = 16;
  c->model_records = 4096;
  (void)apply_env(c, NULL);
}

const char *nfd_log_level_name(int level) {
  if (level < NFD_LOG_ERROR || level > NFD_LOG_DEBUG) return "unknown";
  return level_names[level];
}

int nfd_log_level_parse(const char *name, int *level) {
  for (int i = NFD_LOG_ERROR; i <= NFD_LOG_DEBUG; i++)
    if (strcasecmp(name, level_names[i]) == 0) {
      *level = i;
      return NF_OK;
    }
  return NF_EINVAL;
}

void nfd_config_socket_dir(const nfd_config *c, char *dir, size_t n) {
  if (n == 0) return;
  const char *slash = strrchr(c->socket_path, '/');
  if (!slash) {
    snprintf(dir, n, ".");
    return;
  }
  size_t len = slash == c->socket_path ? 1 : (size_t)(slash - c->socket_path);
  if (len >= n) len = n - 1;
  memcpy(dir, c->socket_path, len);
  dir[len] = 0;
}

/* ---- value parsers: NULL on success, else the reason (static text) ---- */

static const char OUT_OF_RANGE[] = "is out of range"; /* compared by address */

static const char *parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = v;
  if (*p == '+' || *p == '-') p++;
  if (!isdigit((unsigned char)*p)) return "is not an integer";
  errno = 0;
  char *end;
  long long x = strtoll(v, &end, 10);
  if (*end) return "is not an integer";
  if (errno == ERANGE || x < lo || x > hi) return OUT_OF_RANGE;
  *out = x;
  return NULL;
}

/* Bytes: digits and an optional K, M, G or T suffix (binary), optionally
 * followed by "B" or "iB". */
static const char *parse_bytes(const char *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!isdigit((unsigned char)*v)) return "is not a size (bytes, or a number with K, M or G)";
  errno = 0;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno == ERANGE) return OUT_OF_RANGE;
  int shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: break;
  }
  if (shift && (strcasecmp(end, "b") == 0 || strcasecmp(end, "ib") == 0)) end += strlen(end);
  if (*end) return "is not a size (bytes, or a number with K, M or G)";
  if (x > (unsigned long long)INT64_MAX >> shift) return OUT_OF_RANGE;
  int64_t bytes = (int64_t)(x << shift);
  if (bytes < lo || bytes > hi) return OUT_OF_RANGE;
  *out = bytes;
  return NULL;
}

static const char *parse_bool(const char *v, int *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(v, yes[i]) == 0) {
      *out = 1;
      return NULL;
    }
    if (strcasecmp(v, no[i]) == 0) {
      *out = 0;
      return NULL;
    }
  }
  return "is not a boolean (true/false, yes/no, on/off, 1/0)";
}

/* ---- the INI reader and handler ---- */

typedef struct parse_state {
  nfd_config *c;
  const char *path;
  nf_buf *err;
  FILE *f;
  int line;          /* the line libinih is processing */
  int indented;      /* that line starts with blanks */
  int in_bad_section;/* the current section is unknown (reported) */
  int n_err;
  int io_error;
  int prev_key;      /* index of the last key set, -1 */
  int seen[N_KEYS];  /* line where each key was set, 0 */
} parse_state;

static void report(parse_state *ps, int line, const key_def *k, const char *fmt, ...)
    NF_PRINTF(4, 5);

static void report(parse_state *ps, int line, const key_def *k, const char *fmt, ...) {
  ps->n_err++;
  if (ps->n_err > MAX_REPORTED) return;
  nf_buf_printf(ps->err, "%s:%d: ", ps->path, line);
  if (k) nf_buf_printf(ps->err, "[%s] %s: ", k->section, k->name);
  va_list ap;
  va_start(ap, fmt);
  nf_buf_vprintf(ps->err, fmt, ap);
  va_end(ap);
  nf_buf_putc(ps->err, '\n');
}

static int known_section(const char *s, size_t n) {
  for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
    if (strlen(sections[i]) == n && memcmp(sections[i], s, n) == 0) return 1;
  return 0;
}

/* Looks at one line before libinih does; returns 0 to have it replaced
 * by a comment (the problem is reported). */
static int precheck_line(parse_state *ps, char *s) {
  if (ps->line == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
      (unsigned char)s[2] == 0xBF)
    s += 3; /* a UTF-8 byte order mark; libinih skips it too */
  ps->indented = s[0] == ' ' || s[0] == '\t';
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  if (*s == 0 || *s == '\n' || *s == ';' || *s == '#') return 1;
  if (*s == '[') {
    char *close = strchr(s, ']');
    if (!close) {
      report(ps, ps->line, NULL, "section header without ']'");
      ps->in_bad_section = 1;
      return 0;
    }
    char *name = s + 1, *e = close; /* as libinih: not trimmed */
    ps->in_bad_section = !known_section(name, (size_t)(e - name));
    if (ps->in_bad_section)
      report(ps, ps->line, NULL, "unknown section [%.*s] (known: [daemon], [cache], [tcp], [jobs])",
             (int)(e - name), name);
    ps->prev_key = -1;
    return 1;
  }
  if (!strchr(s, '=') && !strchr(s, ':')) {
    if (ps->indented)
      report(ps, ps->line, NULL, "indented continuation lines are not supported");
    else
      report(ps, ps->line, NULL, "expected 'key = value' or '[section]'");
    return 0;
  }
  return 1;
}

/* libinih's fgets-like reader: one line per call, counted. */
static char *read_line(char *str, int num, void *stream) {
  parse_state *ps = stream;
  if (num < 4) return NULL;
  size_t len = 0, cap = (size_t)num - 3; /* room for "\r\n\0", as libinih counts */
  int ch, too_long = 0, nul = 0;
  while ((ch = getc(ps->f)) != EOF && ch != '\n') {
    if (ch == 0) nul = 1;
    if (len < cap)
      str[len++] = (char)ch;
    else
      too_long = 1;
  }
  if (ch == EOF) {
    if (ferror(ps->f)) ps->io_error = errno ? errno : EIO;
    if (len == 0 && !too_long) return NULL;
  }
  ps->line++;
  str[len] = '\n';
  str[len + 1] = 0;
  if (too_long || nul) {
    size_t i = 0;
    while (i < len && (str[i] == ' ' || str[i] == '\t')) i++;
    int comment = i < len && (str[i] == ';' || str[i] == '#');
    if (nul)
      report(ps, ps->line, NULL, "line contains a NUL byte");
    else if (!comment) /* a long comment is harmless: its tail is dropped */
      report(ps, ps->line, NULL, "line longer than %d bytes (libinih's limit)", num - 3);
    memcpy(str, ";\n", 3);
    return str;
  }
  if (!precheck_line(ps, str)) memcpy(str, ";\n", 3);
  return str;
}

static void set_string(parse_state *ps, const key_def *k, const char *value) {
  char *dst = (char *)ps->c + k->off;
  if (!copy_fit(dst, k->size, value))
    report(ps, ps->line, k, "value of %zu bytes is too long (at most %zu)", strlen(value),
           k->size - 1);
}

/* allowed_uids: "1001, alice, 1002"; replaces the list. */
static void set_uids(parse_state *ps, const key_def *k, const char *value) {
  nfd_config *c = ps->c;
  int n = 0;
  const char *p = value;
  if (!*p) {
    c->n_allowed_uids = 0;
    return;
  }
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    char item[256];
    if (len == 0) {
      report(ps, ps->line, k, "empty entry in the list");
      return;
    }
    if (len >= sizeof item) {
      report(ps, ps->line, k, "entry of %zu bytes is too long", len);
      return;
    }
    memcpy(item, p, len);
    item[len] = 0;
    uid_t uid;
    if (isdigit((unsigned char)item[0])) {
      int64_t x;
      if (parse_int(item, 0, (int64_t)(uid_t)-2, &x)) {
        report(ps, ps->line, k, "'%s' is not a uid or user name", item);
        return;
      }
      uid = (uid_t)x;
    } else {
      struct passwd pw, *res = NULL;
      char buf[4096];
      int e = getpwnam_r(item, &pw, buf, sizeof buf, &res);
      if (e || !res) {
        report(ps, ps->line, k, "no user named '%s'%s%s", item, e ? ": " : "",
               e ? strerror(e) : "");
        return;
      }
      uid = res->pw_uid;
    }
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= c->allowed_uids[i] == uid;
    if (!dup) {
      if (n == NFD_MAX_ALLOWED_UIDS) {
        report(ps, ps->line, k, "more than %d uids", NFD_MAX_ALLOWED_UIDS);
        return;
      }
      c->allowed_uids[n++] = uid;
    }
    if (!comma) break;
    p = comma + 1;
  }
  c->n_allowed_uids = n;
}

static void set_value(parse_state *ps, const key_def *k, const char *value) {
  char *field = (char *)ps->c + k->off;
  const char *why = NULL;
  int64_t x = 0;
  int b = 0;
  switch (k->kind) {
  case K_INT:
    why = parse_int(value, k->lo, k->hi, &x);
    if (!why) *(int *)field = (int)x;
    break;
  case K_BYTES:
    why = parse_bytes(value, k->lo, k->hi, &x);
    if (!why) *(int64_t *)field = x;
    break;
  case K_MIB:
    why = parse_int(value, k->lo, k->hi, &x);
    if (!why) *(int64_t *)field = x * MIB;
    break;
  case K_COUNT:
    why = parse_bytes(value, k->lo, k->hi, &x);
    if (why && why != OUT_OF_RANGE) why = "is not a count (a number, or one with K, M, G or T)";
    if (!why) *(int64_t *)field = x;
    break;
  case K_BOOL:
    why = parse_bool(value, &b);
    if (!why) *(int *)field = b;
    break;
  case K_LOG:
    if (nfd_log_level_parse(value, &b) == NF_OK)
      *(int *)field = b;
    else
      why = "is not a log level (error, warn, info, debug)";
    break;
  case K_SYNC:
    if (strcasecmp(value, "normal") == 0)
      *(int *)field = 0;
    else if (strcasecmp(value, "full") == 0)
      *(int *)field = 1;
    else
      why = "is not a sync mode (normal, full)";
    break;
  case K_STR:
    set_string(ps, k, value);
    return;
  case K_UIDS:
    set_uids(ps, k, value);
    return;
  }
  if (!why) return;
  if (why == OUT_OF_RANGE) {
    if (k->kind == K_BYTES)
      report(ps, ps->line, k, "'%s' is out of range (%lld..%lld bytes)", value,
             (long long)k->lo, (long long)k->hi);
    else
      report(ps, ps->line, k, "'%s' is out of range (%lld..%lld)", value, (long long)k->lo,
             (long long)k->hi);
  } else {
    report(ps, ps->line, k, "'%s' %s", value, why);
  }
}

static int on_key(void *user, const char *section, const char *name, const char *value) {
  parse_state *ps = user;
  if (!section[0]) {
    report(ps, ps->line, NULL, "'%s' outside any section", name);
    return 0;
  }
  if (ps->in_bad_section) return 0; /* the section was reported */
  int idx = -1;
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0) idx = (int)i;
  if (idx < 0) {
    report(ps, ps->line, NULL, "unknown key '%s' in [%s]", name, section);
    ps->prev_key = -1;
    return 0;
  }
  const key_def *k = &keys[idx];
  if (ps->seen[idx]) {
    if (ps->indented && idx == ps->prev_key && ps->seen[idx] != ps->line)
      report(ps, ps->line, k, "indented continuation lines are not supported");
    else
      report(ps, ps->line, k, "set twice (first on line %d)", ps->seen[idx]);
    return 0;
  }
  ps->seen[idx] = ps->line;
  ps->prev_key = idx;
  int before = ps->n_err;
  set_value(ps, k, value);
  return ps->n_err == before;
}

int nfd_config_load(nfd_config *c, const char *path, nf_buf *err) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    nf_buf_printf(err, "%s: %s\n", path, strerror(e));
    return e == ENOENT ? NF_ENOENT : NF_EIO;
  }
  nfd_config *tmp = malloc(sizeof *tmp);
  if (!tmp) {
    fclose(f);
    nf_buf_printf(err, "%s: out of memory\n", path);
    return NF_ENOMEM;
  }
  *tmp = *c;
  parse_state ps = {.c = tmp, .path = path, .err = err, .f = f, .prev_key = -1};
  int irc = ini_parse_stream(read_line, &ps, on_key, &ps);
  fclose(f);
  int rc = NF_OK;
  if (ps.io_error) {
    nf_buf_printf(err, "%s: %s\n", path, strerror(ps.io_error));
    rc = NF_EIO;
  } else if (irc == -2) {
    nf_buf_printf(err, "%s: out of memory\n", path);
    rc = NF_ENOMEM;
  } else if (irc != 0 && ps.n_err == 0) {
    /* libinih found something our pre-check let through. */
    report(&ps, irc, NULL, "syntax error");
  }
  if (rc == NF_OK && ps.n_err) {
    if (ps.n_err > MAX_REPORTED)
      nf_buf_printf(err, "%s: and %d more errors\n", path, ps.n_err - MAX_REPORTED);
    rc = NF_EFORMAT;
  }
  if (rc == NF_OK && !copy_fit(tmp->config_path, sizeof tmp->config_path, path)) {
    nf_buf_printf(err, "%s: path too long\n", path);
    rc = NF_EINVAL;
  }
  _Static_assert(N_KEYS <= NFD_CONFIG_KEYS, "nfd_config.key_line holds every key");
  for (size_t i = 0; i < N_KEYS; i++) tmp->key_line[i] = ps.seen[i];
  if (rc == NF_OK) rc = apply_env(tmp, err);
  if (rc == NF_OK) *c = *tmp;
  free(tmp);
  return rc;
}

/* ---- checks ---- */

static int64_t field_value(const nfd_config *c, const key_def *k) {
  const char *field = (const char *)c + k->off;
  switch (k->kind) {
  case K_BYTES:
  case K_MIB:
  case K_COUNT: return *(const int64_t *)field;
  default: return *(const int *)field;
  }
}

/* "PATH:LINE: " where [sec] name was set, "PATH: " where it was not (a
 * default, the environment), nothing without a file. */
static void where(const nfd_config *c, const char *sec, const char *name, nf_buf *err) {
  if (!c->config_path[0]) return;
  for (size_t i = 0; i < N_KEYS; i++)
    if (!strcmp(keys[i].section, sec) && !strcmp(keys[i].name, name) && c->key_line[i] > 0) {
      nf_buf_printf(err, "%s:%d: ", c->config_path, c->key_line[i]);
      return;
    }
  nf_buf_printf(err, "%s: ", c->config_path);
}

int nfd_config_check(const nfd_config *c, nf_buf *err) {
  int bad = 0;
/* each refusal names where the key was set (file and line) */
#define REFUSE_K(sec, name, ...)                                                            \
  do {                                                                                      \
    where(c, sec, name, err);                                                               \
    nf_buf_printf(err, __VA_ARGS__);                                                        \
    nf_buf_putc(err, '\n');                                                                 \
    bad++;                                                                                  \
  } while (0)
  for (size_t i = 0; i < N_KEYS; i++) {
    const key_def *k = &keys[i];
    if (k->kind == K_STR || k->kind == K_UIDS) continue;
    int64_t v = field_value(c, k);
    if (k->kind == K_MIB) {
      if (v < k->lo * MIB || v > k->hi * MIB)
        REFUSE_K(k->section, k->name,
                 "[%s] %s: %lld bytes is out of range (%lld..%lld MiB)", k->section, k->name,
               (long long)v, (long long)k->lo, (long long)k->hi);
    } else if (v < k->lo || v > k->hi) {
      REFUSE_K(k->section, k->name,
               "[%s] %s = %lld is out of range (%lld..%lld)", k->section, k->name, (long long)v,
             (long long)k->lo, (long long)k->hi);
    }
  }
  if (c->n_allowed_uids < 0 || c->n_allowed_uids > NFD_MAX_ALLOWED_UIDS)
    REFUSE_K("daemon", "allowed_uids",
             "[daemon] allowed_uids: %d entries (at most %d)", c->n_allowed_uids,
           NFD_MAX_ALLOWED_UIDS);

  size_t slen = strnlen(c->socket_path, sizeof c->socket_path);
  if (slen == 0)
    REFUSE_K("daemon", "socket",
             "[daemon] socket: no socket path (NEOFLOW_SOCKET or XDG_RUNTIME_DIR too long?)");
  else if (slen >= sizeof c->socket_path)
    REFUSE_K("daemon", "socket",
             "[daemon] socket: path too long (at most %zu bytes)", sizeof c->socket_path - 1);
  else if (c->socket_path[0] != '/')
    REFUSE_K("daemon", "socket", "[daemon] socket: '%s' is not an absolute path", c->socket_path);
  else if (c->socket_path[slen - 1] == '/')
    REFUSE_K("daemon", "socket", "[daemon] socket: '%s' names a directory", c->socket_path);
  if (strnlen(c->cache_path, sizeof c->cache_path) == 0)
    REFUSE_K("cache", "cache", "[cache] cache: no cache path (set it, or NEOFLOW_CACHE)");

  if (c->output_soft_limit > c->output_hard_limit)
    REFUSE_K("daemon", "output_soft_limit",
             "[daemon] output_soft_limit (%lld bytes) is above output_hard_limit (%lld bytes)",
           (long long)c->output_soft_limit, (long long)c->output_hard_limit);
  if (c->default_trials > c->max_trials)
    REFUSE_K("jobs", "default_trials",
             "[jobs] default_trials (%d) is above max_trials (%d)", c->default_trials,
           c->max_trials);
  if (c->default_seconds > c->max_seconds)
    REFUSE_K("jobs", "default_seconds",
             "[jobs] default_seconds (%d) is above max_seconds (%d)", c->default_seconds,
           c->max_seconds);
  if (c->cache_soft_cap && c->cache_hard_cap && c->cache_soft_cap > c->cache_hard_cap)
    REFUSE_K("cache", "soft_cap_mb", "[cache] soft_cap_mb (%lld) is above hard_cap_mb (%lld)",
           (long long)(c->cache_soft_cap / MIB), (long long)(c->cache_hard_cap / MIB));

  if (c->upstream_address[0]) {
    /* an upstream's kernels are served under this daemon's signature:
     * taken only when signed by the key named here */
    nf_trust tr;
    memset(&tr, 0, sizeof tr);
    nf_buf why = NF_BUF_INIT;
    if (!c->upstream_public_key[0])
      REFUSE_K("upstream", "address",
               "[upstream] address = %s without public_key: the upstream's kernels are taken only "
             "under its signing key (`neoflowd --public-key` on the upstream)",
             c->upstream_address);
    else if (nf_trust_add_key(&tr, c->upstream_public_key, &why) != NF_OK)
      REFUSE_K("upstream", "public_key", "[upstream] public_key: %s", nf_buf_str(&why));
    if (!strncmp(c->upstream_address, "tcp:", 4) && !c->upstream_key_file[0])
      REFUSE_K("upstream", "address",
               "[upstream] address = %s without key_file: a daemon on TCP answers only with its "
             "[tcp] key_file", c->upstream_address);
    nf_buf_free(&why);
  }
  if (strnlen(c->tcp_listen, sizeof c->tcp_listen) >= sizeof c->tcp_listen) {
    REFUSE_K("tcp", "listen", "[tcp] listen: too long");
  } else if (c->tcp_listen[0]) {
    nf_buf why = NF_BUF_INIT;
    int loopback = 0;
    if (nfd_parse_tcp_spec(c->tcp_listen, NULL, NULL, &loopback, &why) != NF_OK)
      REFUSE_K("tcp", "listen", "[tcp] listen: %s", nf_buf_str(&why));
    else if (!loopback && !c->tcp_key_file[0])
      REFUSE_K("tcp", "listen",
               "refusing to listen on %s without [tcp] key_file: anyone who can reach it could "
             "submit work",
             c->tcp_listen);
    nf_buf_free(&why);
  }
#undef REFUSE_K
  return bad ? NF_EINVAL : NF_OK;
}
