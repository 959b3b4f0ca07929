/* cache.c - the tuning cache's core: opening (filesystem check, writer
 * lock, hardening, header checks, quick_check, migrations), keys, lookups,
 * puts with the "better" rule and the size caps, and records.
 * Statistics, listing, verify, export, import and gc live in cache_io.c.
 *
 * Invariants:
 *  - every write is one BEGIN IMMEDIATE transaction, committed whole or
 *    rolled back: an entry is absent or complete, whatever kills us;
 *  - an entry is served only after its row passed nf__cache_check_row
 *    (sizes, types, tier, key = its parts = the asked key, SHA-256 of the
 *    binary); a row that fails, or that SQLite reports corrupt, is a miss
 *    and is moved to the quarantine table (when writable);
 *  - application_id and user_version are written in the transaction that
 *    creates or migrates the schema, so a killed migration leaves the old
 *    database (for a new file: an empty one) and runs again next time;
 *  - the handle never holds a transaction open between calls.
 *
 * It does not create directories, sweep files, or log: messages go to the
 * caller's nf_buf. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "cache_int.h"

void (*nf__cache_test_hook)(const char *step) = NULL;
long (*nf__cache_statfs_hook)(const char *dir) = NULL;
int64_t nf__cache_max_records = 100000;

static const char key_tag[] = "neoflow-cache-key-v1";

/* ---- small helpers ---- */

void nf__cache_hook(const char *step) {
  if (nf__cache_test_hook) nf__cache_test_hook(step);
}

int64_t nf__cache_now(void) { return (int64_t)time(NULL); }

void nf__cache_hex(const uint8_t *p, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  out[2 * n] = '\0';
}

int nf__cache_fail(nf_buf *err, int rc, const char *path, const char *fmt, ...) {
  if (err) {
    va_list ap;
    nf_buf_printf(err, "cache %s: ", path);
    va_start(ap, fmt);
    nf_buf_vprintf(err, fmt, ap);
    va_end(ap);
  }
  return rc;
}

int nf__cache_sqlerr(const char *path, sqlite3 *db, int rc, const char *what, nf_buf *err) {
  int prim = rc & 0xff;
  const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (prim == SQLITE_NOMEM) return nf__cache_fail(err, NF_ENOMEM, path, "%s: out of memory", what);
  if (prim == SQLITE_BUSY || prim == SQLITE_LOCKED)
    return nf__cache_fail(err, NF_EIO, path,
                          "%s: busy: %s (another connection holds the write lock)", what, msg);
  int sys = db ? sqlite3_system_errno(db) : 0;
  if (sys && (prim == SQLITE_CANTOPEN || prim == SQLITE_IOERR || prim == SQLITE_FULL))
    return nf__cache_fail(err, NF_EIO, path, "%s: %s (%s)", what, msg, strerror(sys));
  return nf__cache_fail(err, NF_EIO, path, "%s: %s", what, msg);
}

int nf__cache_exec(sqlite3 *db, const char *path, const char *sql, nf_buf *err) {
  int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  if (rc != SQLITE_OK) return nf__cache_sqlerr(path, db, rc, "sqlite", err);
  return NF_OK;
}

int nf__cache_begin(sqlite3 *db, const char *path, nf_buf *err) {
  int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK) return nf__cache_sqlerr(path, db, rc, "begin", err);
  return NF_OK;
}

int nf__cache_commit(sqlite3 *db, const char *path, nf_buf *err) {
  int rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    int st = nf__cache_sqlerr(path, db, rc, "commit", err);
    nf__cache_rollback(db);
    return st;
  }
  return NF_OK;
}

void nf__cache_rollback(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

int nf__cache_prepare(sqlite3 *db, const char *path, const char *sql, sqlite3_stmt **st,
                      nf_buf *err) {
  int rc = sqlite3_prepare_v2(db, sql, -1, st, NULL);
  if (rc != SQLITE_OK) {
    *st = NULL;
    return nf__cache_sqlerr(path, db, rc, "prepare", err);
  }
  return NF_OK;
}

int nf__cache_query_i64(sqlite3 *db, const char *path, const char *sql, int64_t *v, nf_buf *err) {
  sqlite3_stmt *st;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      *v = sqlite3_column_int64(st, 0);
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      *v = 0;
      rc = SQLITE_OK;
    }
  }
  int st_rc = rc == SQLITE_OK ? NF_OK : nf__cache_sqlerr(path, db, rc, "query", err);
  sqlite3_finalize(st);
  return st_rc;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* ---- keys, rows and the better rule ---- */

void nf_cache_make_key(const uint8_t graph_hash[32], const uint8_t target[32],
                       const char *codegen_version, uint8_t key[32]) {
  crypto_hash_sha256_state s;
  crypto_hash_sha256_init(&s);
  crypto_hash_sha256_update(&s, (const unsigned char *)key_tag, sizeof key_tag - 1);
  crypto_hash_sha256_update(&s, graph_hash, 32);
  crypto_hash_sha256_update(&s, target, 32);
  crypto_hash_sha256_update(&s, (const unsigned char *)codegen_version,
                            strlen(codegen_version) + 1);
  crypto_hash_sha256_final(&s, key);
}

int nf__cache_better(int tier, double time_ms, int64_t trials, int64_t check, int old_tier,
                     double old_ms, int64_t old_trials, int64_t old_check) {
  if (tier != old_tier) return tier > old_tier;
  /* unmeasured never replaces a measured entry; between two unmeasured
   * ones, the one a tuning job ended with (trials > 0: the job gave up,
   * say over its time budget, or found no correct candidate, and kept
   * this kernel) replaces one that no job has tuned, so that the key is
   * not tuned again by every session; a failure to tune found again under
   * a newer check replaces the stale one */
  if (!(time_ms > 0))
    return !(old_ms > 0) && trials > 0 && (old_trials <= 0 || (check > 0 && check != old_check));
  if (!(old_ms > 0)) return 1;
  return time_ms < old_ms;
}

const uint8_t *nf__cache_col_blob(sqlite3_stmt *st, int c, int n) {
  if (sqlite3_column_type(st, c) != SQLITE_BLOB) return NULL;
  const uint8_t *p = sqlite3_column_blob(st, c);
  int len = sqlite3_column_bytes(st, c);
  if (!p) return NULL;
  if (n >= 0 ? len != n : (len <= 0 || len > NF__CACHE_MAX_BINARY)) return NULL;
  return p;
}

const char *nf__cache_col_text(sqlite3_stmt *st, int c) {
  if (sqlite3_column_type(st, c) != SQLITE_TEXT) return NULL;
  const char *s = (const char *)sqlite3_column_text(st, c);
  if (!s) return NULL;
  if ((size_t)sqlite3_column_bytes(st, c) != strlen(s)) return NULL;
  return s;
}

static int col_time(sqlite3_stmt *st, int c, double *v) {
  int t = sqlite3_column_type(st, c);
  if (t != SQLITE_FLOAT && t != SQLITE_INTEGER) return 0;
  *v = sqlite3_column_double(st, c);
  return isfinite(*v) && *v >= 0;
}

const char *nf__cache_check_row(sqlite3_stmt *st, const uint8_t *want) {
  const uint8_t *key = nf__cache_col_blob(st, 0, 32);
  if (!key) return "key is not 32 bytes";
  if (want && memcmp(key, want, 32) != 0) return "row holds another key";
  const uint8_t *gh = nf__cache_col_blob(st, 1, 32), *tg = nf__cache_col_blob(st, 2, 32);
  if (!gh || !tg) return "graph hash or target is not 32 bytes";
  const char *codegen = nf__cache_col_text(st, 3);
  if (!codegen || !nf__cache_col_text(st, 4) || !nf__cache_col_text(st, 5) ||
      !nf__cache_col_text(st, 7))
    return "missing text field";
  if (sqlite3_column_type(st, 6) != SQLITE_INTEGER) return "tier is not an integer";
  int64_t tier = sqlite3_column_int64(st, 6);
  if (tier != 1 && tier != 2) return "tier is not 1 or 2";
  double t;
  if (!col_time(st, 8, &t) || !col_time(st, 9, &t)) return "impossible time";
  if (sqlite3_column_type(st, 10) != SQLITE_INTEGER || sqlite3_column_int64(st, 10) < 0 ||
      sqlite3_column_int64(st, 10) > INT_MAX)
    return "impossible trial count";
  for (int c = 13; c <= 16; c++)
    if (sqlite3_column_type(st, c) != SQLITE_INTEGER) return "timestamp or hits not an integer";
  if (sqlite3_column_int64(st, 16) < 0) return "negative hits";
  if (!nf__cache_col_text(st, 17)) return "missing text field";
  if (sqlite3_column_type(st, 18) != SQLITE_INTEGER || sqlite3_column_int64(st, 18) < 0 ||
      sqlite3_column_int64(st, 18) > INT_MAX)
    return "impossible check revision";
  uint8_t k[32];
  nf_cache_make_key(gh, tg, codegen, k);
  if (memcmp(k, key, 32) != 0) return "key does not match its graph hash, target and codegen";
  /* the binary last: the text conversions above cannot move it */
  const uint8_t *bin = nf__cache_col_blob(st, 11, -1);
  if (!bin) return "binary missing or of impossible size";
  size_t n = (size_t)sqlite3_column_bytes(st, 11);
  const uint8_t *sha = nf__cache_col_blob(st, 12, 32);
  if (!sha) return "digest is not 32 bytes";
  uint8_t d[32];
  crypto_hash_sha256(d, bin, n);
  if (sodium_memcmp(d, sha, 32) != 0) return "SHA-256 of the binary does not match";
  return NULL;
}

int nf__cache_fill_entry(sqlite3_stmt *st, nf_cache_entry *e) {
  memset(e, 0, sizeof *e);
  memcpy(e->key, sqlite3_column_blob(st, 0), 32);
  memcpy(e->graph_hash, sqlite3_column_blob(st, 1), 32);
  memcpy(e->target, sqlite3_column_blob(st, 2), 32);
  e->codegen = dup_str((const char *)sqlite3_column_text(st, 3));
  e->graph_name = dup_str((const char *)sqlite3_column_text(st, 4));
  e->target_desc = dup_str((const char *)sqlite3_column_text(st, 5));
  e->tier = (int)sqlite3_column_int64(st, 6);
  e->schedule = dup_str((const char *)sqlite3_column_text(st, 7));
  e->time_ms = sqlite3_column_double(st, 8);
  e->default_ms = sqlite3_column_double(st, 9);
  e->trials = (int)sqlite3_column_int64(st, 10);
  e->binary_len = (size_t)sqlite3_column_bytes(st, 11);
  e->binary = malloc(e->binary_len);
  if (e->binary) memcpy(e->binary, sqlite3_column_blob(st, 11), e->binary_len);
  memcpy(e->sha256, sqlite3_column_blob(st, 12), 32);
  e->created = sqlite3_column_int64(st, 13);
  e->updated = sqlite3_column_int64(st, 14);
  e->last_used = sqlite3_column_int64(st, 15);
  e->hits = sqlite3_column_int64(st, 16);
  e->tune_error = dup_str((const char *)sqlite3_column_text(st, 17));
  e->tune_check = (int)sqlite3_column_int64(st, 18);
  if (!e->codegen || !e->graph_name || !e->target_desc || !e->schedule || !e->binary ||
      !e->tune_error) {
    nf_cache_entry_free(e);
    return NF_ENOMEM;
  }
  return NF_OK;
}

const char *nf__cache_check_entry(const nf_cache_entry *e) {
  if (e->tier != 1 && e->tier != 2) return "tier must be 1 or 2";
  if (!e->codegen || !*e->codegen) return "codegen version missing";
  if (!e->binary || e->binary_len == 0 || e->binary_len > (size_t)NF__CACHE_MAX_BINARY)
    return "binary missing or of impossible size";
  if (!isfinite(e->time_ms) || e->time_ms < 0 || !isfinite(e->default_ms) || e->default_ms < 0)
    return "times must be finite and non-negative";
  if (e->trials < 0) return "negative trial count";
  if (e->hits < 0) return "negative hits";
  if (e->tune_check < 0) return "negative check revision";
  if (e->tune_error && *e->tune_error && e->tune_check <= 0)
    return "a failure to tune without its check revision";
  uint8_t k[32];
  nf_cache_make_key(e->graph_hash, e->target, e->codegen, k);
  if (memcmp(k, e->key, 32) != 0)
    return "key is not nf_cache_make_key(graph_hash, target, codegen)";
  uint8_t d[32];
  crypto_hash_sha256(d, e->binary, e->binary_len);
  if (sodium_memcmp(d, e->sha256, 32) != 0) return "sha256 is not the binary's digest";
  return NULL;
}

int nf_cache_entry_copy(nf_cache_entry *dst, const nf_cache_entry *src) {
  *dst = *src;
  dst->codegen = dup_str(src->codegen ? src->codegen : "");
  dst->graph_name = dup_str(src->graph_name ? src->graph_name : "");
  dst->target_desc = dup_str(src->target_desc ? src->target_desc : "");
  dst->schedule = dup_str(src->schedule ? src->schedule : "");
  dst->tune_error = dup_str(src->tune_error ? src->tune_error : "");
  dst->binary = malloc(src->binary_len ? src->binary_len : 1);
  if (dst->binary && src->binary_len) memcpy(dst->binary, src->binary, src->binary_len);
  if (!dst->codegen || !dst->graph_name || !dst->target_desc || !dst->schedule || !dst->binary ||
      !dst->tune_error) {
    nf_cache_entry_free(dst);
    return NF_ENOMEM;
  }
  return NF_OK;
}

void nf_cache_entry_free(nf_cache_entry *e) {
  if (!e) return;
  free(e->codegen);
  free(e->graph_name);
  free(e->target_desc);
  free(e->schedule);
  free(e->tune_error);
  free(e->binary);
  memset(e, 0, sizeof *e);
}

/* ---- opening ---- */

/* Filesystems where SQLite's locking (and WAL's shared memory) cannot be
 * trusted: https://sqlite.org/useovernet.html. */
static const struct {
  uint32_t magic;
  const char *name;
} network_fs[] = {
    {0x6969, "NFS"},      {0x517B, "SMB"},       {0xFE534D42, "SMB2"},  {0xFF534D42, "CIFS"},
    {0x65735546, "FUSE"}, {0x73757245, "CODA"},  {0x5346414F, "AFS"},   {0x6B414653, "kAFS"},
    {0x00C36400, "CEPH"}, {0x01021997, "9P"},    {0x47504653, "GPFS"},  {0x0BD00BD0, "Lustre"},
    {0x564C, "NCP"},      {0x7461636F, "OCFS2"}, {0x013111A8, "IBRIX"}, {0x19830326, "BeeGFS"},
};

static const char *network_fs_name(long type) {
  uint32_t m = (uint32_t)(unsigned long)type;
  for (size_t i = 0; i < sizeof network_fs / sizeof network_fs[0]; i++)
    if (network_fs[i].magic == m) return network_fs[i].name;
  return NULL;
}

/* The directory part of path ("." when none) in a malloc'd string. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return dup_str(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, path, n);
  d[n] = '\0';
  return d;
}

/* Refuses (or, allowed, flags in *network) a database on a network
 * filesystem. */
static int check_fs(const char *path, int allow, int *network, nf_buf *err) {
  char *dir = dir_of(path);
  if (!dir) return NF_ENOMEM;
  long type;
  errno = 0;
  if (nf__cache_statfs_hook) {
    type = nf__cache_statfs_hook(dir);
  } else {
    struct statfs sf;
    type = statfs(dir, &sf) == 0 ? (long)sf.f_type : -1;
  }
  int rc = NF_OK;
  if (type == -1) {
    int e = errno ? errno : EIO;
    rc = nf__cache_fail(err, e == ENOENT ? NF_ENOENT : NF_EIO, path,
                        "cannot inspect directory %s: %s", dir, strerror(e));
  } else {
    const char *name = network_fs_name(type);
    *network = name != NULL;
    if (name && !allow)
      rc = nf__cache_fail(err, NF_EUNSUPPORTED, path,
                          "on a network filesystem (%s, f_type 0x%lx): SQLite's locks and WAL "
                          "are unreliable there; use a local path, or allow network "
                          "filesystems (rollback journal, one host only)",
                          name, (unsigned long)(uint32_t)(unsigned long)type);
  }
  free(dir);
  return rc;
}

/* Takes the writer lock "<path>.lock" and writes our pid into it. */
static int take_lock(nf_cache *c, long *holder, nf_buf *err) {
  nf_buf lp = NF_BUF_INIT;
  nf_buf_printf(&lp, "%s.lock", c->path);
  if (lp.oom) {
    nf_buf_free(&lp);
    return NF_ENOMEM;
  }
  int fd = open(lp.data, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int rc = nf__cache_fail(err, NF_EIO, c->path, "cannot open lock file %s: %s", lp.data,
                            strerror(errno));
    nf_buf_free(&lp);
    return rc;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    long pid = 0;
    if (n > 0) {
      buf[n] = '\0';
      char *end;
      pid = strtol(buf, &end, 10);
      if (end == buf || pid <= 0) pid = 0;
    }
    close(fd);
    nf_buf_free(&lp);
    if (e != EWOULDBLOCK)
      return nf__cache_fail(err, NF_EIO, c->path, "cannot lock: %s", strerror(e));
    if (holder) *holder = pid ? pid : -1;
    if (err) {
      if (pid)
        nf_buf_printf(err, "cache %s is in use by another neoflowd (pid %ld)", c->path, pid);
      else
        nf_buf_printf(err, "cache %s is in use by another neoflowd (pid unknown)", c->path);
    }
    return NF_EIO;
  }
  nf_buf_free(&lp);
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
    int rc =
        nf__cache_fail(err, NF_EIO, c->path, "cannot write the lock file: %s", strerror(errno));
    close(fd);
    return rc;
  }
  c->lock_fd = fd;
  return NF_OK;
}

int nf__cache_open_db(const char *name, const char *path, int flags, int imported, int busy_ms,
                      sqlite3 **out, nf_buf *err) {
  sqlite3 *db = NULL;
  *out = NULL;
  int rc = sqlite3_open_v2(name, &db, flags, NULL);
  if (rc != SQLITE_OK) {
    int st = db ? nf__cache_sqlerr(path, db, rc, "cannot open", err)
                : nf__cache_fail(err, NF_ENOMEM, path, "cannot open: out of memory");
    sqlite3_close_v2(db);
    return st;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
  sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)NULL);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, (int *)NULL);
  sqlite3_busy_timeout(db, busy_ms);
  rc = nf__cache_exec(db, path, "PRAGMA trusted_schema=OFF; PRAGMA foreign_keys=ON", err);
  if (rc == NF_OK && imported)
    rc = nf__cache_exec(db, path, "PRAGMA cell_size_check=ON; PRAGMA mmap_size=0", err);
  if (rc != NF_OK) {
    sqlite3_close_v2(db);
    return rc;
  }
  *out = db;
  return NF_OK;
}

/* A failure while reading the header: a file that is not a database
 * reads as one. */
static int header_err(sqlite3 *db, const char *path, int rc, nf_buf *err) {
  int prim = rc & 0xff;
  if (prim == SQLITE_NOTADB)
    return nf__cache_fail(err, NF_EFORMAT, path, "not a NeoFlow cache: %s", sqlite3_errmsg(db));
  if (prim == SQLITE_CORRUPT)
    return nf__cache_fail(err, NF_EFORMAT, path, "damaged database: %s", sqlite3_errmsg(db));
  return nf__cache_sqlerr(path, db, rc, "reading the header", err);
}

static int header_i64(sqlite3 *db, const char *path, const char *sql, int64_t *v, nf_buf *err) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  int st_rc = rc == SQLITE_OK ? NF_OK : header_err(db, path, rc, err);
  sqlite3_finalize(st);
  return st_rc;
}

int nf__cache_check_header(sqlite3 *db, const char *path, int *schema, nf_buf *err) {
  int64_t app, uv, n;
  int rc = header_i64(db, path, "PRAGMA application_id", &app, err);
  if (rc == NF_OK) rc = header_i64(db, path, "PRAGMA user_version", &uv, err);
  if (rc == NF_OK) rc = header_i64(db, path, "SELECT count(*) FROM sqlite_schema", &n, err);
  if (rc != NF_OK) return rc;
  uint32_t id = (uint32_t)app;
  if (id == 0 && n == 0 && uv == 0) {
    *schema = 0;
    return NF_OK;
  }
  if (id != (uint32_t)NF_CACHE_APPLICATION_ID) {
    if (id == 0)
      return nf__cache_fail(err, NF_EFORMAT, path,
                            "not a NeoFlow cache: application_id 0x%08x (an SQLite database "
                            "of someone else, with %lld schema objects)",
                            id, (long long)n);
    return nf__cache_fail(err, NF_EFORMAT, path, "not a NeoFlow cache: application_id 0x%08x", id);
  }
  if (uv > NF_CACHE_SCHEMA)
    return nf__cache_fail(err, NF_EFORMAT, path,
                          "DB schema %lld > supported %d (written by a newer neoflowd)",
                          (long long)uv, NF_CACHE_SCHEMA);
  if (uv < 1)
    return nf__cache_fail(err, NF_EFORMAT, path,
                          "NeoFlow cache with an impossible schema version %lld", (long long)uv);
  *schema = (int)uv;
  return NF_OK;
}

int nf__cache_check_integrity(sqlite3 *db, const char *path, int full, int *ok, nf_buf *err) {
  sqlite3_stmt *st = NULL;
  *ok = 0;
  int rc = sqlite3_prepare_v2(db, full ? "PRAGMA integrity_check(20)" : "PRAGMA quick_check(20)",
                              -1, &st, NULL);
  int n = 0, good = 0;
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  for (; rc == SQLITE_ROW; rc = sqlite3_step(st)) {
    const char *s = (const char *)sqlite3_column_text(st, 0);
    if (n == 0 && s && strcmp(s, "ok") == 0) {
      good = 1;
    } else if (err) {
      nf_buf_printf(err, "%scache %s: %s: %s", err->len ? "\n" : "", path,
                    full ? "integrity_check" : "quick_check", s ? s : "(null)");
    }
    n++;
  }
  int st_rc = NF_OK;
  if (rc != SQLITE_DONE) {
    int prim = rc & 0xff;
    if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB) {
      st_rc = NF_OK; /* a verdict, not a failure to get one */
      good = 0;
      if (err)
        nf_buf_printf(err, "%scache %s: %s: %s", err->len ? "\n" : "", path,
                      full ? "integrity_check" : "quick_check", sqlite3_errmsg(db));
    } else {
      st_rc = nf__cache_sqlerr(path, db, rc, full ? "integrity_check" : "quick_check", err);
    }
  }
  sqlite3_finalize(st);
  *ok = good && n == 1;
  return st_rc;
}

/* ---- migrations ---- */

/* Schema 1: entries, records, quarantine.  CHECK constraints keep
 * impossible rows out of our own writes (nf__cache_check_row still checks
 * every row read, as files can be edited or damaged). */
static int migrate_0_to_1(sqlite3 *db, const char *path, nf_buf *err) {
  static const char sql[] =
      "CREATE TABLE entries("
      " key BLOB PRIMARY KEY NOT NULL CHECK(typeof(key)='blob' AND length(key)=32),"
      " graph_hash BLOB NOT NULL CHECK(typeof(graph_hash)='blob' AND length(graph_hash)=32),"
      " target BLOB NOT NULL CHECK(typeof(target)='blob' AND length(target)=32),"
      " codegen TEXT NOT NULL CHECK(typeof(codegen)='text' AND length(codegen)>0),"
      " graph_name TEXT NOT NULL CHECK(typeof(graph_name)='text'),"
      " target_desc TEXT NOT NULL CHECK(typeof(target_desc)='text'),"
      " tier INTEGER NOT NULL CHECK(tier IN (1,2)),"
      " schedule TEXT NOT NULL CHECK(typeof(schedule)='text'),"
      " time_ms REAL NOT NULL CHECK(time_ms>=0),"
      " default_ms REAL NOT NULL CHECK(default_ms>=0),"
      " trials INTEGER NOT NULL CHECK(trials>=0),"
      " binary BLOB NOT NULL CHECK(typeof(binary)='blob' AND length(binary)>0),"
      " sha256 BLOB NOT NULL CHECK(typeof(sha256)='blob' AND length(sha256)=32),"
      " created INTEGER NOT NULL,"
      " updated INTEGER NOT NULL,"
      " last_used INTEGER NOT NULL,"
      " hits INTEGER NOT NULL DEFAULT 0 CHECK(hits>=0));"
      "CREATE INDEX entries_last_used ON entries(last_used);"
      "CREATE TABLE records("
      " id INTEGER PRIMARY KEY,"
      " key BLOB NOT NULL CHECK(typeof(key)='blob' AND length(key)=32),"
      " schedule TEXT NOT NULL CHECK(typeof(schedule)='text'),"
      " status INTEGER NOT NULL,"
      " time_ms REAL NOT NULL CHECK(time_ms>=0),"
      " features BLOB,"
      " reason TEXT NOT NULL DEFAULT '',"
      " at INTEGER NOT NULL,"
      " UNIQUE(key, schedule));"
      "CREATE TABLE quarantine("
      " id INTEGER PRIMARY KEY,"
      " key BLOB,"
      " reason TEXT NOT NULL,"
      " at INTEGER NOT NULL,"
      " graph_hash BLOB, target BLOB, codegen, graph_name, target_desc, tier, schedule,"
      " time_ms, default_ms, trials, binary, sha256, created, updated, last_used, hits);"
      "CREATE INDEX quarantine_key ON quarantine(key);";
  return nf__cache_exec(db, path, sql, err);
}

/* Schema 2: each kernel's signature (docs/security.md), and a failure to
 * tune remembered on the entry.
 *  - signatures: the entries a daemon held before are listed in adopt
 *    with their binary's digest: the daemon signs them at its next start
 *    (nf_cache_adopt), as they are what it served before, and only while
 *    the binary is still that one (any later put or quarantine of the key
 *    drops it from the list); an entry that arrives later (an import, a
 *    hand edit) is never adopted.
 *  - tune_error, tune_check: why tuning found no correct candidate, and
 *    under which revision of the search's check, so that the key is not
 *    tuned again by every session.  Rows of schema 1 get "" and 0: no
 *    failure. */
static int migrate_1_to_2(sqlite3 *db, const char *path, nf_buf *err) {
  static const char sql[] =
      "CREATE TABLE signatures("
      " key BLOB PRIMARY KEY NOT NULL CHECK(typeof(key)='blob' AND length(key)=32),"
      " sha256 BLOB NOT NULL CHECK(typeof(sha256)='blob' AND length(sha256)=32),"
      " signer BLOB NOT NULL CHECK(typeof(signer)='blob' AND length(signer)=32),"
      " sig BLOB NOT NULL CHECK(typeof(sig)='blob' AND length(sig)=64));"
      "CREATE TABLE adopt(key BLOB PRIMARY KEY NOT NULL, sha256 BLOB NOT NULL);"
      "INSERT INTO adopt SELECT key, sha256 FROM entries;"
      "ALTER TABLE entries ADD COLUMN tune_error TEXT NOT NULL DEFAULT ''"
      " CHECK(typeof(tune_error)='text');"
      "ALTER TABLE entries ADD COLUMN tune_check INTEGER NOT NULL DEFAULT 0"
      " CHECK(tune_check>=0);"
      "ALTER TABLE quarantine ADD COLUMN tune_error;"
      "ALTER TABLE quarantine ADD COLUMN tune_check;";
  return nf__cache_exec(db, path, sql, err);
}

/* Schema 3: each key's shape (nf_cache_put_shape): a structural
 * signature, indexed, and a descriptor of its extents, so that a search
 * of a subgraph never tuned can start from the best schedules of similar
 * ones.  Entries of schema 2 get no shape (the graph itself was never
 * stored): they are found as similar once a job stores theirs. */
static int migrate_2_to_3(sqlite3 *db, const char *path, nf_buf *err) {
  static const char sql[] =
      "CREATE TABLE shapes("
      " key BLOB PRIMARY KEY NOT NULL CHECK(typeof(key)='blob' AND length(key)=32),"
      " sig BLOB NOT NULL CHECK(typeof(sig)='blob' AND length(sig)=16),"
      " descr BLOB NOT NULL CHECK(typeof(descr)='blob' AND length(descr)%4=0"
      " AND length(descr)<=256));"
      "CREATE INDEX shapes_sig ON shapes(sig);";
  return nf__cache_exec(db, path, sql, err);
}

/* migrations[k] takes a database from schema k to k + 1. */
typedef int (*migration_fn)(sqlite3 *db, const char *path, nf_buf *err);
static const migration_fn migrations[NF_CACHE_SCHEMA] = {migrate_0_to_1, migrate_1_to_2,
                                                         migrate_2_to_3};

int nf__cache_migrate(sqlite3 *db, const char *path, nf_buf *err) {
  int rc = nf__cache_begin(db, path, err);
  if (rc != NF_OK) return rc;
  nf__cache_hook("migrate:begin");
  /* read again under the write lock: another process may have migrated */
  int schema = 0;
  rc = nf__cache_check_header(db, path, &schema, err);
  for (int v = schema; rc == NF_OK && v < NF_CACHE_SCHEMA; v++) {
    nf__cache_hook("migrate:step");
    rc = migrations[v](db, path, err);
  }
  if (rc == NF_OK && schema < NF_CACHE_SCHEMA) {
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA application_id=%d; PRAGMA user_version=%d",
             (int)NF_CACHE_APPLICATION_ID, NF_CACHE_SCHEMA);
    rc = nf__cache_exec(db, path, sql, err);
  }
  if (rc == NF_OK) {
    nf__cache_hook("migrate:commit");
    return nf__cache_commit(db, path, err);
  }
  nf__cache_rollback(db);
  return rc;
}

/* Sets the journal mode and reads back what SQLite chose. */
static int set_journal(sqlite3 *db, const char *path, const char *mode, nf_buf *err) {
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA journal_mode=%s", mode);
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(db, path, sql, &st, err);
  if (rc != NF_OK) return rc;
  int s = sqlite3_step(st);
  if (s == SQLITE_ROW) {
    const char *got = (const char *)sqlite3_column_text(st, 0);
    if (!got || strcasecmp(got, mode) != 0)
      rc = nf__cache_fail(err, NF_EIO, path, "cannot set journal_mode=%s (still %s)", mode,
                          got ? got : "unknown");
  } else {
    rc = s == SQLITE_DONE ? NF_OK : header_err(db, path, s, err);
  }
  sqlite3_finalize(st);
  return rc;
}

int nf_cache_open(const char *path, const nf_cache_opts *o, nf_cache **out, nf_buf *err) {
  static const nf_cache_opts defaults = {0};
  if (!o) o = &defaults;
  *out = NULL;
  if (!path || !*path) {
    if (err) nf_buf_puts(err, "cache: empty path");
    return NF_EINVAL;
  }
  if (o->busy_timeout_ms < 0 || o->soft_cap_bytes < 0 || o->hard_cap_bytes < 0)
    return nf__cache_fail(err, NF_EINVAL, path, "negative busy timeout or cap");
  nf_cache *c = calloc(1, sizeof *c);
  if (!c || !(c->path = dup_str(path))) {
    free(c);
    return NF_ENOMEM;
  }
  if (o->damaged) *o->damaged = 0;
  if (o->lock_holder) *o->lock_holder = 0;
  c->read_only = o->read_only != 0;
  c->busy_ms = o->busy_timeout_ms ? o->busy_timeout_ms : 5000;
  c->soft_cap = o->soft_cap_bytes;
  c->hard_cap = o->hard_cap_bytes;
  c->lock_fd = -1;

  int rc = NF_OK, network = 0;
  struct stat sb;
  if (c->read_only && stat(path, &sb) != 0) {
    int e = errno;
    rc = nf__cache_fail(err, e == ENOENT ? NF_ENOENT : NF_EIO, path, "%s", strerror(e));
  }
  if (rc == NF_OK) rc = check_fs(path, o->allow_network_fs, &network, err);
  if (rc == NF_OK && o->writer_lock && !c->read_only) rc = take_lock(c, o->lock_holder, err);
  /* a new cache is private: made 0600 here (SQLite would make it 0644
   * less the umask), and its -wal and -shm files take its mode */
  if (rc == NF_OK && !c->read_only) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  int flags = (c->read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
              SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  if (rc == NF_OK) rc = nf__cache_open_db(path, path, flags, 0, c->busy_ms, &c->db, err);
  int schema = 0;
  if (rc == NF_OK) rc = nf__cache_check_header(c->db, path, &schema, err);
  if (rc == NF_OK && !c->read_only) {
    rc = set_journal(c->db, path, network ? "delete" : "wal", err);
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA synchronous=%s; PRAGMA journal_size_limit=67108864",
             o->sync_full || network ? "FULL" : "NORMAL");
    if (rc == NF_OK) rc = nf__cache_exec(c->db, path, sql, err);
  }
  if (rc == NF_OK && schema > 0) {
    int ok = 0;
    rc = nf__cache_check_integrity(c->db, path, 0, &ok, err);
    if (rc == NF_OK && !ok) rc = NF_EFORMAT;
  }
  if (rc == NF_OK && schema < NF_CACHE_SCHEMA) {
    if (c->read_only && schema == 0)
      rc = nf__cache_fail(err, NF_EFORMAT, path, "empty database (never initialised)");
    else if (c->read_only)
      rc = nf__cache_fail(err, NF_EFORMAT, path,
                          "schema %d is older than %d; open it writable once to migrate", schema,
                          NF_CACHE_SCHEMA);
    else
      rc = nf__cache_migrate(c->db, path, err);
  }
  if (rc != NF_OK) {
    /* damage, as this file's messages name it (header_err, the integrity
     * check): never a foreign or newer cache */
    const char *m = err ? nf_buf_str(err) : "";
    /* the verdict follows "cache PATH: " (a path may hold any words) */
    const char *at = strstr(m, path);
    if (at) m = at + strlen(path);
    if (o->damaged && rc == NF_EFORMAT &&
        (strstr(m, "damaged database") || strstr(m, "file is not a database") ||
         strstr(m, "quick_check") || strstr(m, "malformed")))
      *o->damaged = 1;
    nf_cache_close(c);
    return rc;
  }
  *out = c;
  return NF_OK;
}

void nf_cache_close(nf_cache *c) {
  if (!c) return;
  if (c->db) sqlite3_close_v2(c->db);
  if (c->lock_fd >= 0) close(c->lock_fd); /* releases the flock */
  free(c->path);
  free(c);
}

const char *nf_cache_path(const nf_cache *c) { return c->path; }

/* Read-only handles refuse writes before SQLite does, with a clear message. */
static int writable(nf_cache *c, const char *what, nf_buf *err) {
  if (c->read_only)
    return nf__cache_fail(err, NF_EINVAL, c->path, "%s: the cache is opened read-only", what);
  return NF_OK;
}

int nf_cache_checkpoint(nf_cache *c, int *complete, nf_buf *err) {
  *complete = 0;
  int rc = writable(c, "checkpoint", err);
  if (rc != NF_OK) return rc;
  int log = 0, done = 0;
  int r = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
  if (r == SQLITE_BUSY) return NF_OK; /* a reader in the middle of a read: not complete */
  if (r != SQLITE_OK)
    return nf__cache_fail(err, NF_EIO, c->path, "checkpoint: %s", sqlite3_errmsg(c->db));
  *complete = 1;
  return NF_OK;
}


/* ---- quarantine ---- */

int nf__cache_quarantine_tx(nf_cache *c, const uint8_t *key, int64_t rowid, const char *reason,
                            nf_buf *err) {
  static const char copy_rowid[] =
      "INSERT INTO quarantine(reason, at, " NF__CACHE_ENTRY_COLS
      ")"
      " SELECT ?1, ?2, " NF__CACHE_ENTRY_COLS " FROM entries WHERE rowid=?3";
  static const char copy_key[] =
      "INSERT INTO quarantine(reason, at, " NF__CACHE_ENTRY_COLS
      ")"
      " SELECT ?1, ?2, " NF__CACHE_ENTRY_COLS " FROM entries WHERE key=?3";
  int64_t now = nf__cache_now();
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(c->db, c->path, rowid > 0 ? copy_rowid : copy_key, &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_text(st, 1, reason, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, now);
  if (rowid > 0)
    sqlite3_bind_int64(st, 3, rowid);
  else
    sqlite3_bind_blob(st, 3, key, 32, SQLITE_STATIC);
  int s = sqlite3_step(st);
  sqlite3_finalize(st);
  if (s != SQLITE_DONE) {
    /* the row cannot even be copied: keep what we know */
    rc = nf__cache_prepare(c->db, c->path,
                           "INSERT INTO quarantine(key, reason, at) VALUES(?1, ?2, ?3)", &st, err);
    if (rc != NF_OK) return rc;
    if (key)
      sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
    else
      sqlite3_bind_null(st, 1);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    s = sqlite3_step(st);
    if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "quarantine", err);
    sqlite3_finalize(st);
    if (rc != NF_OK) return rc;
  }
  rc = nf__cache_prepare(
      c->db, c->path,
      rowid > 0 ? "DELETE FROM entries WHERE rowid=?1" : "DELETE FROM entries WHERE key=?1", &st,
      err);
  if (rc != NF_OK) return rc;
  if (rowid > 0)
    sqlite3_bind_int64(st, 1, rowid);
  else
    sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  s = sqlite3_step(st);
  if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "quarantine", err);
  sqlite3_finalize(st);
  return rc;
}

/* Quarantines in a transaction of its own; failures are dropped (the
 * entry stays a miss either way). */
static void quarantine(nf_cache *c, const uint8_t *key, int64_t rowid, const char *reason) {
  if (c->read_only) return;
  if (nf__cache_begin(c->db, c->path, NULL) != NF_OK) return;
  if (nf__cache_quarantine_tx(c, key, rowid, reason, NULL) != NF_OK ||
      nf__cache_commit(c->db, c->path, NULL) != NF_OK)
    nf__cache_rollback(c->db);
}

/* ---- lookups and puts ---- */

int nf_cache_get(nf_cache *c, const uint8_t key[32], nf_cache_entry *out, nf_buf *err) {
  memset(out, 0, sizeof *out);
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(
      c->db, c->path, "SELECT " NF__CACHE_ENTRY_COLS ", rowid FROM entries WHERE key=?1", &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  int s = sqlite3_step(st);
  const char *why = NULL;
  int64_t rowid = 0;
  char reason[160];
  if (s == SQLITE_ROW) {
    rowid = sqlite3_column_int64(st, NF__CACHE_ENTRY_NCOLS);
    why = nf__cache_check_row(st, key);
    if (!why) rc = nf__cache_fill_entry(st, out);
    if (!why && rc == NF_OK) {
      /* one row per key: a second one is corruption of the index */
      s = sqlite3_step(st);
      if (s == SQLITE_ROW)
        why = "two rows for one key";
      else if (s != SQLITE_DONE)
        why = sqlite3_errmsg(c->db);
      if (why) nf_cache_entry_free(out);
    }
  } else if (s == SQLITE_DONE) {
    rc = NF_ENOENT;
  } else if ((s & 0xff) == SQLITE_CORRUPT || (s & 0xff) == SQLITE_NOTADB) {
    why = sqlite3_errmsg(c->db);
  } else {
    rc = nf__cache_sqlerr(c->path, c->db, s, "lookup", err);
  }
  if (why) snprintf(reason, sizeof reason, "%s", why);
  sqlite3_finalize(st);
  if (why) {
    c->corrupt++;
    quarantine(c, key, rowid, reason);
    rc = NF_ENOENT;
  }
  if (rc == NF_OK) {
    rc = nf__cache_sig_get(c->db, c->path, key, out->sha256, &out->sig, &out->has_sig, err);
    if (rc != NF_OK) nf_cache_entry_free(out);
  }
  if (rc == NF_OK)
    c->hits++;
  else if (rc == NF_ENOENT)
    c->misses++;
  return rc;
}

int nf_cache_touch(nf_cache *c, const uint8_t key[32], int64_t n, nf_buf *err) {
  int rc = writable(c, "touch", err);
  if (rc != NF_OK) return rc;
  if (n < 0) return nf__cache_fail(err, NF_EINVAL, c->path, "touch: negative hit count");
  sqlite3_stmt *st = NULL;
  rc = nf__cache_begin(c->db, c->path, err);
  if (rc != NF_OK) return rc;
  rc = nf__cache_prepare(c->db, c->path,
                         "UPDATE entries SET hits=CASE WHEN hits>9223372036854775807-?1"
                         " THEN 9223372036854775807 ELSE hits+?1 END, last_used=max(last_used, ?2)"
                         " WHERE key=?3",
                         &st, err);
  if (rc == NF_OK) {
    sqlite3_bind_int64(st, 1, n);
    sqlite3_bind_int64(st, 2, nf__cache_now());
    sqlite3_bind_blob(st, 3, key, 32, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s != SQLITE_DONE)
      rc = nf__cache_sqlerr(c->path, c->db, s, "touch", err);
    else if (sqlite3_changes(c->db) == 0)
      rc = NF_ENOENT;
    sqlite3_finalize(st);
  }
  if (rc == NF_OK) return nf__cache_commit(c->db, c->path, err);
  nf__cache_rollback(c->db);
  return rc;
}

int nf__cache_evict(nf_cache *c, const uint8_t *keep, int64_t limit, int64_t *total,
                    int64_t *n_removed, nf_buf *err) {
  sqlite3_stmt *st = NULL, *del = NULL, *del_rec = NULL;
  int rc = nf__cache_prepare(c->db, c->path,
                             "SELECT rowid, key, length(binary) FROM entries WHERE key IS NOT ?1"
                             " ORDER BY last_used, created, rowid",
                             &st, err);
  if (rc != NF_OK) return rc;
  if (keep)
    sqlite3_bind_blob(st, 1, keep, 32, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 1);
  /* collect first: deleting under a running SELECT of the same table is
   * not defined */
  int64_t *ids = NULL;
  uint8_t(*keys)[32] = NULL;
  size_t n = 0, cap = 0;
  int64_t left = *total;
  int s = SQLITE_DONE;
  while (left > limit && (s = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      int64_t *ni = realloc(ids, nc * sizeof *ni);
      if (ni) ids = ni;
      uint8_t(*nk)[32] = realloc(keys, nc * sizeof *nk);
      if (nk) keys = nk;
      if (!ni || !nk) {
        rc = NF_ENOMEM;
        break;
      }
      cap = nc;
    }
    ids[n] = sqlite3_column_int64(st, 0);
    const void *k = sqlite3_column_blob(st, 1);
    if (k && sqlite3_column_bytes(st, 1) == 32)
      memcpy(keys[n], k, 32);
    else
      memset(keys[n], 0, 32);
    left -= sqlite3_column_int64(st, 2);
    n++;
  }
  if (rc == NF_OK && left > limit && s != SQLITE_DONE)
    rc = nf__cache_sqlerr(c->path, c->db, s, "evict", err);
  sqlite3_finalize(st);
  if (rc == NF_OK)
    rc = nf__cache_prepare(c->db, c->path, "DELETE FROM entries WHERE rowid=?1", &del, err);
  if (rc == NF_OK)
    rc = nf__cache_prepare(c->db, c->path, "DELETE FROM records WHERE key=?1", &del_rec, err);
  for (size_t i = 0; rc == NF_OK && i < n; i++) {
    sqlite3_reset(del);
    sqlite3_bind_int64(del, 1, ids[i]);
    s = sqlite3_step(del);
    if (s == SQLITE_DONE) {
      sqlite3_reset(del_rec);
      sqlite3_bind_blob(del_rec, 1, keys[i], 32, SQLITE_STATIC);
      s = sqlite3_step(del_rec);
    }
    if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "evict", err);
  }
  sqlite3_finalize(del);
  sqlite3_finalize(del_rec);
  free(ids);
  free(keys);
  if (rc == NF_OK) {
    *total = left;
    if (n_removed) *n_removed += (int64_t)n;
  }
  return rc;
}

int nf__cache_put_tx(nf_cache *c, const nf_cache_entry *e, const int64_t times[4], int *what,
                     nf_buf *err) {
  *what = NF__CACHE_KEPT;
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(
      c->db, c->path, "SELECT " NF__CACHE_ENTRY_COLS ", rowid FROM entries WHERE key=?1", &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, e->key, 32, SQLITE_STATIC);
  int s = sqlite3_step(st), exists = 0, old_tier = 0;
  double old_ms = 0;
  int64_t old_trials = 0, old_check = 0;
  int64_t old_len = 0, rowid = 0;
  const char *why = NULL;
  char reason[160];
  if (s == SQLITE_ROW) {
    rowid = sqlite3_column_int64(st, NF__CACHE_ENTRY_NCOLS);
    why = nf__cache_check_row(st, e->key);
    if (!why) {
      exists = 1;
      old_tier = (int)sqlite3_column_int64(st, 6);
      old_ms = sqlite3_column_double(st, 8);
      old_trials = sqlite3_column_int64(st, 10);
      old_len = sqlite3_column_bytes(st, 11);
      old_check = sqlite3_column_int64(st, 18);
    }
  } else if ((s & 0xff) == SQLITE_CORRUPT || (s & 0xff) == SQLITE_NOTADB) {
    why = sqlite3_errmsg(c->db);
  } else if (s != SQLITE_DONE) {
    rc = nf__cache_sqlerr(c->path, c->db, s, "lookup", err);
  }
  if (why) snprintf(reason, sizeof reason, "%s", why);
  sqlite3_finalize(st);
  if (rc != NF_OK) return rc;
  if (why) {
    c->corrupt++;
    rc = nf__cache_quarantine_tx(c, e->key, rowid, reason, err);
    if (rc != NF_OK) return rc;
  }
  int64_t check = e->tune_error && *e->tune_error ? e->tune_check : 0;
  if (exists && !nf__cache_better(e->tier, e->time_ms, e->trials, check, old_tier, old_ms,
                                  old_trials, old_check)) {
    /* a further search of the key (a second pass, a retune) that found
     * nothing faster keeps the binary; its trials count all the same */
    if (e->tier != old_tier || e->trials <= old_trials) return NF_OK;
    rc = nf__cache_prepare(c->db, c->path, "UPDATE entries SET trials=?1 WHERE key=?2", &st, err);
    if (rc != NF_OK) return rc;
    sqlite3_bind_int64(st, 1, e->trials);
    sqlite3_bind_blob(st, 2, e->key, 32, SQLITE_STATIC);
    s = sqlite3_step(st);
    sqlite3_finalize(st);
    return s == SQLITE_DONE ? NF_OK : nf__cache_sqlerr(c->path, c->db, s, "update", err);
  }

  if (c->soft_cap > 0 || c->hard_cap > 0) {
    int64_t total = 0;
    rc = nf__cache_query_i64(c->db, c->path, "SELECT coalesce(sum(length(binary)), 0) FROM entries",
                             &total, err);
    if (rc != NF_OK) return rc;
    int64_t len = (int64_t)e->binary_len;
    total -= old_len;
    if (c->soft_cap > 0) {
      if (len > c->soft_cap)
        return nf__cache_fail(err, NF_ELIMIT, c->path,
                              "a binary of %lld bytes is larger than the soft cap (%lld bytes)",
                              (long long)len, (long long)c->soft_cap);
      if (total + len > c->soft_cap) {
        rc = nf__cache_evict(c, e->key, c->soft_cap - len, &total, NULL, err);
        if (rc != NF_OK) return rc;
      }
    }
    if (c->hard_cap > 0 && total + len > c->hard_cap)
      return nf__cache_fail(err, NF_ELIMIT, c->path,
                            "full: %lld bytes of binaries with this one, over the hard cap of "
                            "%lld bytes",
                            (long long)(total + len), (long long)c->hard_cap);
  }

  rc =
      nf__cache_prepare(c->db, c->path,
                        "INSERT INTO entries(" NF__CACHE_ENTRY_COLS
                        ")"
                        " VALUES(" NF__CACHE_ENTRY_PARAMS ")"
                        " ON CONFLICT(key) DO UPDATE SET graph_hash=excluded.graph_hash,"
                        " target=excluded.target, codegen=excluded.codegen,"
                        " graph_name=excluded.graph_name, target_desc=excluded.target_desc,"
                        " tier=excluded.tier, schedule=excluded.schedule, time_ms=excluded.time_ms,"
                        " default_ms=excluded.default_ms, trials=excluded.trials,"
                        " binary=excluded.binary, sha256=excluded.sha256,"
                        " created=min(created, excluded.created), updated=excluded.updated,"
                        " last_used=max(last_used, excluded.last_used),"
                        " hits=CASE WHEN hits>9223372036854775807-excluded.hits"
                        " THEN 9223372036854775807 ELSE hits+excluded.hits END,"
                        " tune_error=excluded.tune_error, tune_check=excluded.tune_check",
                        &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, e->key, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, e->graph_hash, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 3, e->target, 32, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, e->codegen, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, e->graph_name ? e->graph_name : "", -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 6, e->target_desc ? e->target_desc : "", -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 7, e->tier);
  sqlite3_bind_text(st, 8, e->schedule ? e->schedule : "", -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 9, e->time_ms);
  sqlite3_bind_double(st, 10, e->default_ms);
  sqlite3_bind_int(st, 11, e->trials);
  sqlite3_bind_blob64(st, 12, e->binary, e->binary_len, SQLITE_STATIC);
  sqlite3_bind_blob(st, 13, e->sha256, 32, SQLITE_STATIC);
  for (int i = 0; i < 4; i++) sqlite3_bind_int64(st, 14 + i, times[i]);
  sqlite3_bind_text(st, 18, check ? e->tune_error : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 19, check);
  s = sqlite3_step(st);
  if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "store", err);
  sqlite3_finalize(st);
  if (rc == NF_OK) *what = exists ? NF__CACHE_REPLACED : NF__CACHE_ADDED;
  /* a replaced binary is not the one a migration listed for adoption */
  if (rc == NF_OK) {
    rc = nf__cache_prepare(c->db, c->path, "DELETE FROM adopt WHERE key=?1", &st, err);
    if (rc == NF_OK) {
      sqlite3_bind_blob(st, 1, e->key, 32, SQLITE_STATIC);
      s = sqlite3_step(st);
      if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "store", err);
      sqlite3_finalize(st);
    }
  }
  /* the kernel's signature goes with it (one per key: a replaced entry's
   * signature goes too, so no binary keeps another's) */
  if (rc == NF_OK) {
    rc = nf__cache_prepare(c->db, c->path,
                           e->has_sig ? "INSERT OR REPLACE INTO signatures(key, sha256, signer, sig)"
                                        " VALUES(?1,?2,?3,?4)"
                                      : "DELETE FROM signatures WHERE key=?1",
                           &st, err);
    if (rc == NF_OK) {
      sqlite3_bind_blob(st, 1, e->key, 32, SQLITE_STATIC);
      if (e->has_sig) {
        sqlite3_bind_blob(st, 2, e->sha256, 32, SQLITE_STATIC);
        sqlite3_bind_blob(st, 3, e->sig.signer, 32, SQLITE_STATIC);
        sqlite3_bind_blob(st, 4, e->sig.sig, 64, SQLITE_STATIC);
      }
      s = sqlite3_step(st);
      if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "store signature", err);
      sqlite3_finalize(st);
    }
  }
  return rc;
}

int nf__cache_sig_get(sqlite3 *db, const char *path, const uint8_t key[32],
                      const uint8_t sha[32], nf_cache_sig *out, int *found, nf_buf *err) {
  *found = 0;
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(db, path,
                             "SELECT signer, sig FROM signatures WHERE key=?1 AND sha256=?2", &st,
                             err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, sha, 32, SQLITE_STATIC);
  int s = sqlite3_step(st);
  if (s == SQLITE_ROW) {
    if (sqlite3_column_type(st, 0) == SQLITE_BLOB && sqlite3_column_bytes(st, 0) == 32 &&
        sqlite3_column_type(st, 1) == SQLITE_BLOB && sqlite3_column_bytes(st, 1) == 64) {
      memcpy(out->signer, sqlite3_column_blob(st, 0), 32);
      memcpy(out->sig, sqlite3_column_blob(st, 1), 64);
      *found = 1;
    }
  } else if (s != SQLITE_DONE) {
    rc = nf__cache_sqlerr(path, db, s, "signature lookup", err);
  }
  sqlite3_finalize(st);
  return rc;
}

void nf_cache_set_judge(nf_cache *c, nf_cache_sig_judge judge, void *user) {
  c->judge = judge;
  c->judge_user = user;
}

int nf_cache_quarantine(nf_cache *c, const uint8_t key[32], const char *reason, nf_buf *err) {
  int rc = writable(c, "quarantine", err);
  if (rc != NF_OK) return rc;
  if ((rc = nf__cache_begin(c->db, c->path, err)) != NF_OK) return rc;
  rc = nf__cache_quarantine_tx(c, key, 0, reason, err);
  if (rc == NF_OK) rc = nf__cache_commit(c->db, c->path, err);
  else nf__cache_rollback(c->db);
  return rc;
}

int nf_cache_adopt(nf_cache *c, void (*sign)(void *user, const uint8_t key[32],
                                             const uint8_t sha[32], const uint8_t target[32],
                                             nf_cache_sig *out),
                   void *user, int64_t *n, nf_buf *err) {
  *n = 0;
  int rc = writable(c, "adopt", err);
  if (rc != NF_OK) return rc;
  if ((rc = nf__cache_begin(c->db, c->path, err)) != NF_OK) return rc;
  sqlite3_stmt *st = NULL, *ins = NULL;
  rc = nf__cache_prepare(c->db, c->path,
                         "SELECT e.key, e.sha256, e.target FROM adopt a JOIN entries e"
                         " ON e.key = a.key AND e.sha256 = a.sha256",
                         &st, err);
  if (rc == NF_OK)
    rc = nf__cache_prepare(c->db, c->path,
                           "INSERT OR REPLACE INTO signatures(key, sha256, signer, sig)"
                           " VALUES(?1,?2,?3,?4)",
                           &ins, err);
  int s = SQLITE_DONE;
  while (rc == NF_OK && (s = sqlite3_step(st)) == SQLITE_ROW) {
    if (sqlite3_column_bytes(st, 0) != 32 || sqlite3_column_bytes(st, 1) != 32 ||
        sqlite3_column_bytes(st, 2) != 32)
      continue; /* a damaged row: its lookup quarantines it */
    nf_cache_sig sg;
    sign(user, sqlite3_column_blob(st, 0), sqlite3_column_blob(st, 1),
         sqlite3_column_blob(st, 2), &sg);
    sqlite3_reset(ins);
    sqlite3_bind_blob(ins, 1, sqlite3_column_blob(st, 0), 32, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 2, sqlite3_column_blob(st, 1), 32, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 3, sg.signer, 32, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 4, sg.sig, 64, SQLITE_TRANSIENT);
    int s2 = sqlite3_step(ins);
    if (s2 != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s2, "adopt", err);
    else (*n)++;
  }
  if (rc == NF_OK && s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "adopt", err);
  sqlite3_finalize(st);
  sqlite3_finalize(ins);
  if (rc == NF_OK) rc = nf__cache_exec(c->db, c->path, "DELETE FROM adopt", err);
  if (rc == NF_OK) rc = nf__cache_commit(c->db, c->path, err);
  else nf__cache_rollback(c->db);
  if (rc != NF_OK) *n = 0;
  return rc;
}

int nf_cache_put(nf_cache *c, const nf_cache_entry *e, int *stored, nf_buf *err) {
  if (stored) *stored = 0;
  int rc = writable(c, "put", err);
  if (rc != NF_OK) return rc;
  const char *why = nf__cache_check_entry(e);
  if (why) return nf__cache_fail(err, NF_EINVAL, c->path, "put: %s", why);
  rc = nf__cache_begin(c->db, c->path, err);
  if (rc != NF_OK) return rc;
  nf__cache_hook("put:begin");
  int64_t now = nf__cache_now();
  const int64_t times[4] = {now, now, now, 0};
  int what = NF__CACHE_KEPT;
  rc = nf__cache_put_tx(c, e, times, &what, err);
  if (rc == NF_OK) {
    nf__cache_hook("put:entry");
    nf__cache_hook("put:commit");
    rc = nf__cache_commit(c->db, c->path, err);
  } else {
    nf__cache_rollback(c->db);
  }
  if (rc == NF_OK && stored) *stored = what != NF__CACHE_KEPT;
  return rc;
}

/* ---- records ---- */

int nf__cache_prepare_record(sqlite3 *db, const char *path, sqlite3_stmt **st, nf_buf *err) {
  return nf__cache_prepare(
      db, path,
      "INSERT INTO records(key, schedule, status, time_ms, features, reason, at)"
      " VALUES(?1,?2,?3,?4,?5,?6,?7)"
      " ON CONFLICT(key, schedule) DO UPDATE SET status=excluded.status,"
      " time_ms=excluded.time_ms, features=excluded.features,"
      " reason=excluded.reason, at=excluded.at"
      " WHERE excluded.status=0 AND (records.status<>0"
      " OR excluded.time_ms<records.time_ms)",
      st, err);
}

int nf__cache_put_record(sqlite3 *db, const char *path, sqlite3_stmt *st, const uint8_t *key,
                         const char *schedule, int status, double time_ms, const void *features,
                         size_t n_features, const char *reason, int64_t at, nf_buf *err) {
  sqlite3_reset(st);
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, schedule, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, status);
  sqlite3_bind_double(st, 4, time_ms);
  if (n_features)
    sqlite3_bind_blob64(st, 5, features, n_features, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 5);
  sqlite3_bind_text(st, 6, reason ? reason : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 7, at);
  int s = sqlite3_step(st);
  if (s != SQLITE_DONE) return nf__cache_sqlerr(path, db, s, "record", err);
  return NF_OK;
}

int nf__cache_trim_records(sqlite3 *db, const char *path, const uint8_t *key, nf_buf *err) {
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(db, path, "SELECT count(*) FROM records WHERE key=?1", &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  int s = sqlite3_step(st);
  int64_t n = s == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  if (s != SQLITE_ROW) rc = nf__cache_sqlerr(path, db, s, "records", err);
  sqlite3_finalize(st);
  if (rc != NF_OK || n <= nf__cache_max_records) return rc;
  rc = nf__cache_prepare(db, path,
                         "DELETE FROM records WHERE id IN (SELECT id FROM records WHERE key=?1"
                         " ORDER BY status=0, id LIMIT ?2)",
                         &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, n - nf__cache_max_records);
  s = sqlite3_step(st);
  if (s != SQLITE_DONE) rc = nf__cache_sqlerr(path, db, s, "records", err);
  sqlite3_finalize(st);
  return rc;
}

int nf_cache_add_records(nf_cache *c, const uint8_t key[32], const nf_cache_record *r, size_t n,
                         nf_buf *err) {
  int rc = writable(c, "records", err);
  if (rc != NF_OK) return rc;
  for (size_t i = 0; i < n; i++) {
    if (!r[i].schedule)
      return nf__cache_fail(err, NF_EINVAL, c->path, "records: record %zu has no schedule", i);
    if (!isfinite(r[i].time_ms) || r[i].time_ms < 0)
      return nf__cache_fail(err, NF_EINVAL, c->path, "records: record %zu has time %g", i,
                            r[i].time_ms);
    if (r[i].n_features && !r[i].features)
      return nf__cache_fail(err, NF_EINVAL, c->path, "records: record %zu lacks its features", i);
  }
  if (n == 0) return NF_OK;
  rc = nf__cache_begin(c->db, c->path, err);
  if (rc != NF_OK) return rc;
  nf__cache_hook("records:begin");
  sqlite3_stmt *st = NULL;
  rc = nf__cache_prepare_record(c->db, c->path, &st, err);
  int64_t now = nf__cache_now();
  for (size_t i = 0; rc == NF_OK && i < n; i++)
    rc = nf__cache_put_record(c->db, c->path, st, key, r[i].schedule, r[i].status, r[i].time_ms,
                              r[i].features, r[i].n_features, r[i].reason, now, err);
  sqlite3_finalize(st);
  if (rc == NF_OK) {
    nf__cache_hook("records:insert");
    rc = nf__cache_trim_records(c->db, c->path, key, err);
  }
  if (rc == NF_OK) {
    nf__cache_hook("records:commit");
    return nf__cache_commit(c->db, c->path, err);
  }
  nf__cache_rollback(c->db);
  return rc;
}

void nf_cache_records_free(nf_cache_record *r, size_t n) {
  if (!r) return;
  for (size_t i = 0; i < n; i++) {
    free(r[i].schedule);
    free(r[i].features);
    free(r[i].reason);
  }
  free(r);
}

int nf_cache_get_records(nf_cache *c, const uint8_t key[32], size_t max, nf_cache_record **out,
                         size_t *n, nf_buf *err) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(
      c->db, c->path,
      "SELECT schedule, status, time_ms, features, reason FROM records WHERE key=?1"
      " ORDER BY status<>0, CASE WHEN status=0 THEN time_ms ELSE 0 END, id"
      " LIMIT ?2",
      &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, max && max < (size_t)INT64_MAX ? (int64_t)max : -1);
  nf_cache_record *v = NULL;
  size_t cnt = 0, cap = 0;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    const char *sched = nf__cache_col_text(st, 0), *reason = nf__cache_col_text(st, 4);
    double t;
    int ft = sqlite3_column_type(st, 3);
    if (!sched || sqlite3_column_type(st, 1) != SQLITE_INTEGER || !col_time(st, 2, &t) ||
        (ft != SQLITE_NULL && ft != SQLITE_BLOB))
      continue; /* a damaged record is not worth failing the search for */
    if (cnt == cap) {
      size_t nc = cap ? 2 * cap : 16;
      nf_cache_record *nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        rc = NF_ENOMEM;
        break;
      }
      v = nv;
      cap = nc;
    }
    nf_cache_record *r = &v[cnt];
    memset(r, 0, sizeof *r);
    cnt++;
    r->schedule = dup_str(sched);
    r->reason = dup_str(reason ? reason : "");
    r->status = (int)sqlite3_column_int64(st, 1);
    r->time_ms = t;
    if (ft == SQLITE_BLOB) {
      const void *p = sqlite3_column_blob(st, 3);
      r->n_features = (size_t)sqlite3_column_bytes(st, 3);
      r->features = malloc(r->n_features ? r->n_features : 1);
      if (r->features && p) memcpy(r->features, p, r->n_features);
      if (!r->features) rc = NF_ENOMEM;
    }
    if (!r->schedule || !r->reason) rc = NF_ENOMEM;
    if (rc != NF_OK) break;
  }
  if (rc == NF_OK && s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "records", err);
  sqlite3_finalize(st);
  if (rc != NF_OK) {
    nf_cache_records_free(v, cnt);
    if (rc == NF_ENOMEM && err) nf_buf_printf(err, "cache %s: records: out of memory", c->path);
    return rc;
  }
  *out = v;
  *n = cnt;
  return NF_OK;
}
