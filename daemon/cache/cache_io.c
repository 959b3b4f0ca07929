/* cache_io.c - whole-cache operations: statistics, listing, verify,
 * export, import and gc.
 *
 * Invariants:
 *  - entries are read one row at a time by rowid, so a damaged row costs
 *    that row only; every entry copied anywhere passed
 *    nf__cache_check_row (the check nf_cache_get makes);
 *  - export writes a fresh file beside dest and renames it into place
 *    only when complete and synced, never over an existing file;
 *  - import reads its source through a read-only, hardened connection
 *    (cell_size_check, no mmap, trusted_schema off, DEFENSIVE) after the
 *    same header and quick_check checks as any cache, and merges in one
 *    transaction of c: all of it or none;
 *  - gc deletes in one transaction, then checkpoints and vacuums. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_int.h"

/* At most this many problem lines go to err per operation. */
#define MAX_LINES 20
/* Limits on an imported record's fields (ours are far smaller). */
#define MAX_RECORD_TEXT (1 << 20)
#define MAX_FEATURES (16 << 20)

/* Appends one line (newline-separated from what err holds). */
static void line(nf_buf *err, const char *path, const char *fmt, ...) NF_PRINTF(3, 4);
static void line(nf_buf *err, const char *path, const char *fmt, ...) {
  if (!err) return;
  va_list ap;
  nf_buf_printf(err, "%scache %s: ", err->len ? "\n" : "", path);
  va_start(ap, fmt);
  nf_buf_vprintf(err, fmt, ap);
  va_end(ap);
}

/* ---- scanning entries row by row ---- */

/* Called per entry row: st is positioned on the row (NF__CACHE_ENTRY_COLS)
 * or NULL when SQLite could not read it; why is NULL for a sound row,
 * else the reason.  Returns a status; non-OK stops the scan. */
typedef int (*row_fn)(void *user, sqlite3_stmt *st, int64_t rowid, const char *why, nf_buf *err);

/* Visits every entry of db by rowid.  *incomplete = 1 when the list of
 * rowids itself could not be read to the end (a damaged table). */
static int each_entry(sqlite3 *db, const char *path, row_fn fn, void *user, int *incomplete,
                      nf_buf *err) {
  *incomplete = 0;
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(db, path, "SELECT rowid FROM entries ORDER BY rowid", &st, err);
  if (rc != NF_OK) return rc;
  int64_t *ids = NULL;
  size_t n = 0, cap = 0;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 64;
      int64_t *ni = realloc(ids, nc * sizeof *ni);
      if (!ni) {
        rc = nf__cache_fail(err, NF_ENOMEM, path, "out of memory");
        break;
      }
      ids = ni;
      cap = nc;
    }
    ids[n++] = sqlite3_column_int64(st, 0);
  }
  if (rc == NF_OK && s != SQLITE_DONE) {
    int prim = s & 0xff;
    if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB) {
      *incomplete = 1;
      line(err, path, "entries table damaged (%s): scan stopped after %zu rows", sqlite3_errmsg(db),
           n);
    } else {
      rc = nf__cache_sqlerr(path, db, s, "scan", err);
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  if (rc == NF_OK)
    rc = nf__cache_prepare(db, path, "SELECT " NF__CACHE_ENTRY_COLS " FROM entries WHERE rowid=?1",
                           &st, err);
  for (size_t i = 0; rc == NF_OK && i < n; i++) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, ids[i]);
    s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
      rc = fn(user, st, ids[i], nf__cache_check_row(st, NULL), err);
    } else if (s == SQLITE_DONE) {
      continue; /* gone meanwhile */
    } else if ((s & 0xff) == SQLITE_CORRUPT || (s & 0xff) == SQLITE_NOTADB) {
      char why[160];
      snprintf(why, sizeof why, "%s", sqlite3_errmsg(db));
      sqlite3_reset(st);
      rc = fn(user, NULL, ids[i], why, err);
    } else {
      rc = nf__cache_sqlerr(path, db, s, "scan", err);
    }
  }
  sqlite3_finalize(st);
  free(ids);
  return rc;
}

/* "entry <16 hex>" or "row <rowid>" for messages. */
static void entry_name(sqlite3_stmt *st, int64_t rowid, char *out, size_t n) {
  const void *k =
      st && sqlite3_column_type(st, 0) == SQLITE_BLOB ? sqlite3_column_blob(st, 0) : NULL;
  if (k && sqlite3_column_bytes(st, 0) >= 8) {
    char hex[17];
    nf__cache_hex(k, 8, hex);
    snprintf(out, n, "entry %s", hex);
  } else {
    snprintf(out, n, "entry at row %lld", (long long)rowid);
  }
}

/* ---- verify ---- */

typedef struct verify_state {
  const char *path;
  nf_cache_verify_report *r;
  int64_t *bad;
  char (*why)[160];
  size_t n_bad, cap;
} verify_state;

static int verify_row(void *user, sqlite3_stmt *st, int64_t rowid, const char *why, nf_buf *err) {
  verify_state *v = user;
  v->r->checked++;
  if (!why) return NF_OK;
  v->r->bad++;
  char name[64];
  entry_name(st, rowid, name, sizeof name);
  if (v->r->bad <= MAX_LINES) line(err, v->path, "%s: %s", name, why);
  if (v->n_bad == v->cap) {
    size_t nc = v->cap ? 2 * v->cap : 16;
    int64_t *nb = realloc(v->bad, nc * sizeof *nb);
    if (nb) v->bad = nb;
    char(*nw)[160] = realloc(v->why, nc * sizeof *nw);
    if (nw) v->why = nw;
    if (!nb || !nw) return nf__cache_fail(err, NF_ENOMEM, v->path, "out of memory");
    v->cap = nc;
  }
  v->bad[v->n_bad] = rowid;
  snprintf(v->why[v->n_bad], sizeof v->why[0], "%s", why);
  v->n_bad++;
  return NF_OK;
}

int nf_cache_verify(nf_cache *c, int full, int fix, nf_cache_verify_report *r, nf_buf *err) {
  memset(r, 0, sizeof *r);
  int ok = 0, incomplete = 0;
  int rc = nf__cache_check_integrity(c->db, c->path, full, &ok, err);
  if (rc != NF_OK) return rc;
  r->integrity_ok = ok;
  verify_state v = {c->path, r, NULL, NULL, 0, 0};
  rc = each_entry(c->db, c->path, verify_row, &v, &incomplete, err);
  if (rc == NF_OK && r->bad > MAX_LINES)
    line(err, c->path, "... %lld bad entries in all", (long long)r->bad);
  if (rc == NF_OK && fix && v.n_bad) {
    if (c->read_only) {
      line(err, c->path, "not fixed: the cache is opened read-only");
    } else {
      rc = nf__cache_begin(c->db, c->path, err);
      for (size_t i = 0; rc == NF_OK && i < v.n_bad; i++)
        rc = nf__cache_quarantine_tx(c, NULL, v.bad[i], v.why[i], err);
      if (rc == NF_OK)
        rc = nf__cache_commit(c->db, c->path, err);
      else
        nf__cache_rollback(c->db);
      if (rc == NF_OK) line(err, c->path, "quarantined %zu entries", v.n_bad);
    }
  }
  free(v.bad);
  free(v.why);
  if (rc != NF_OK) return rc;
  if (incomplete) r->integrity_ok = 0;
  return r->integrity_ok && r->bad == 0 ? NF_OK : NF_EFORMAT;
}

/* ---- export ---- */

typedef struct export_state {
  sqlite3 *src;
  sqlite3 *dst;
  const char *path; /* the source, for messages */
  const char *dest;
  sqlite3_stmt *ins;
  int64_t copied, skipped;
} export_state;

static int export_row(void *user, sqlite3_stmt *st, int64_t rowid, const char *why, nf_buf *err) {
  export_state *x = user;
  if (why) {
    char name[64];
    entry_name(st, rowid, name, sizeof name);
    if (++x->skipped <= MAX_LINES) line(err, x->path, "export skips %s: %s", name, why);
    return NF_OK;
  }
  sqlite3_reset(x->ins);
  for (int i = 0; i < NF__CACHE_ENTRY_NCOLS; i++)
    sqlite3_bind_value(x->ins, i + 1, sqlite3_column_value(st, i));
  int s = sqlite3_step(x->ins);
  if (s != SQLITE_DONE) return nf__cache_sqlerr(x->dest, x->dst, s, "export", err);
  x->copied++;
  /* the binary's signature travels with it (the importer's daemon judges
   * whether it trusts the signer) */
  nf_cache_sig sg;
  int found = 0;
  int rc = nf__cache_sig_get(x->src, x->path, sqlite3_column_blob(st, 0),
                             sqlite3_column_blob(st, 12), &sg, &found, err);
  if (rc != NF_OK || !found) return rc;
  sqlite3_stmt *si = NULL;
  rc = nf__cache_prepare(x->dst, x->dest,
                         "INSERT INTO signatures(key, sha256, signer, sig) VALUES(?1,?2,?3,?4)",
                         &si, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(si, 1, sqlite3_column_blob(st, 0), 32, SQLITE_TRANSIENT);
  sqlite3_bind_blob(si, 2, sqlite3_column_blob(st, 12), 32, SQLITE_TRANSIENT);
  sqlite3_bind_blob(si, 3, sg.signer, 32, SQLITE_TRANSIENT);
  sqlite3_bind_blob(si, 4, sg.sig, 64, SQLITE_TRANSIENT);
  s = sqlite3_step(si);
  sqlite3_finalize(si);
  if (s != SQLITE_DONE) return nf__cache_sqlerr(x->dest, x->dst, s, "export", err);
  return NF_OK;
}

/* Checks a record row (key, schedule, status, time_ms, features, reason,
 * at) read from any cache. */
static int record_ok(sqlite3_stmt *st) {
  double t;
  int ft = sqlite3_column_type(st, 4);
  if (sqlite3_column_type(st, 0) != SQLITE_BLOB || sqlite3_column_bytes(st, 0) != 32) return 0;
  const char *sched = nf__cache_col_text(st, 1), *reason = nf__cache_col_text(st, 5);
  if (!sched || !reason) return 0;
  if (sqlite3_column_bytes(st, 1) > MAX_RECORD_TEXT ||
      sqlite3_column_bytes(st, 5) > MAX_RECORD_TEXT)
    return 0;
  if (sqlite3_column_type(st, 2) != SQLITE_INTEGER) return 0;
  int64_t status = sqlite3_column_int64(st, 2);
  if (status < -1000000 || status > 1000000) return 0;
  int tt = sqlite3_column_type(st, 3);
  if (tt != SQLITE_FLOAT && tt != SQLITE_INTEGER) return 0;
  t = sqlite3_column_double(st, 3);
  if (!isfinite(t) || t < 0) return 0;
  if (ft != SQLITE_NULL && ft != SQLITE_BLOB) return 0;
  if (ft == SQLITE_BLOB && sqlite3_column_bytes(st, 4) > MAX_FEATURES) return 0;
  return sqlite3_column_type(st, 6) == SQLITE_INTEGER;
}

static const char records_cols[] = "key, schedule, status, time_ms, features, reason, at";

/* Copies src's records into dst (through ins, 7 parameters); a damaged
 * records table stops the copy with a line in err. */
static int copy_records(sqlite3 *src, const char *path, sqlite3 *dst, const char *dpath,
                        sqlite3_stmt *ins, int64_t *n, int64_t *bad, nf_buf *err) {
  sqlite3_stmt *st = NULL;
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT %s FROM records ORDER BY id", records_cols);
  int rc = nf__cache_prepare(src, path, sql, &st, err);
  if (rc != NF_OK) return rc;
  int s;
  while (rc == NF_OK && (s = sqlite3_step(st)) == SQLITE_ROW) {
    if (!record_ok(st)) {
      (*bad)++;
      continue;
    }
    sqlite3_reset(ins);
    for (int i = 0; i < 7; i++) sqlite3_bind_value(ins, i + 1, sqlite3_column_value(st, i));
    int w = sqlite3_step(ins);
    if (w != SQLITE_DONE)
      rc = nf__cache_sqlerr(dpath, dst, w, "records", err);
    else
      (*n)++;
  }
  if (rc == NF_OK && s != SQLITE_DONE) {
    if ((s & 0xff) == SQLITE_CORRUPT || (s & 0xff) == SQLITE_NOTADB)
      line(err, path, "records table damaged (%s): copy stopped after %lld records",
           sqlite3_errmsg(src), (long long)*n);
    else
      rc = nf__cache_sqlerr(path, src, s, "records", err);
  }
  sqlite3_finalize(st);
  return rc;
}

/* fsyncs a file or directory by name. */
static int sync_path(const char *p, int dir) {
  int fd = open(p, (dir ? O_RDONLY | O_DIRECTORY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) return -1;
  int r = fsync(fd);
  int e = errno;
  close(fd);
  errno = e;
  return r;
}

/* Removes name and its journal files. */
static void unlink_db(const char *name) {
  static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
  nf_buf b = NF_BUF_INIT;
  for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
    nf_buf_reset(&b);
    nf_buf_printf(&b, "%s%s", name, sfx[i]);
    if (!b.oom) unlink(b.data);
  }
  nf_buf_free(&b);
}

/* Renames tmp to dest unless dest exists (atomically where the
 * filesystem can). */
static int rename_noreplace(const char *tmp, const char *dest) {
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dest, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  struct stat sb;
  if (lstat(dest, &sb) == 0) {
    errno = EEXIST;
    return -1;
  }
  return rename(tmp, dest);
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *d = ".";
  size_t n = 1;
  if (slash) {
    d = path;
    n = slash == path ? 1 : (size_t)(slash - path);
  }
  char *out = malloc(n + 1);
  if (!out) return NULL;
  memcpy(out, d, n);
  out[n] = '\0';
  return out;
}

int nf_cache_export(nf_cache *c, const char *dest, int64_t *n_entries, nf_buf *err) {
  if (n_entries) *n_entries = 0;
  struct stat sb;
  if (lstat(dest, &sb) == 0)
    return nf__cache_fail(err, NF_EINVAL, c->path, "export: %s exists (refusing to replace it)",
                          dest);
  if (errno != ENOENT)
    return nf__cache_fail(err, NF_EIO, c->path, "export: %s: %s", dest, strerror(errno));
  nf_buf tmp = NF_BUF_INIT;
  nf_buf_printf(&tmp, "%s.tmp-%ld", dest, (long)getpid());
  char *dir = dir_of(dest);
  if (tmp.oom || !dir) {
    nf_buf_free(&tmp);
    free(dir);
    return nf__cache_fail(err, NF_ENOMEM, c->path, "export: out of memory");
  }
  unlink_db(tmp.data); /* a leftover of an earlier run of this pid */
  sqlite3 *dst = NULL;
  int rc = nf__cache_open_db(
      tmp.data, dest,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, 0,
      c->busy_ms, &dst, err);
  if (rc == NF_OK)
    rc = nf__cache_exec(dst, dest, "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL", err);
  if (rc == NF_OK) rc = nf__cache_migrate(dst, dest, err);
  int src_tx = 0;
  export_state x = {c->db, dst, c->path, dest, NULL, 0, 0};
  sqlite3_stmt *rins = NULL;
  if (rc == NF_OK) rc = nf__cache_exec(dst, dest, "BEGIN", err);
  /* one snapshot of the source */
  if (rc == NF_OK && (rc = nf__cache_exec(c->db, c->path, "BEGIN", err)) == NF_OK) src_tx = 1;
  if (rc == NF_OK)
    rc = nf__cache_prepare(dst, dest,
                           "INSERT INTO entries(" NF__CACHE_ENTRY_COLS
                           ") VALUES(" NF__CACHE_ENTRY_PARAMS ")",
                           &x.ins, err);
  int incomplete = 0;
  if (rc == NF_OK) rc = each_entry(c->db, c->path, export_row, &x, &incomplete, err);
  if (rc == NF_OK)
    rc = nf__cache_prepare(dst, dest,
                           "INSERT OR IGNORE INTO records(key, schedule, status, time_ms, "
                           "features, reason, at) VALUES(?1,?2,?3,?4,?5,?6,?7)",
                           &rins, err);
  int64_t n_rec = 0, bad_rec = 0;
  if (rc == NF_OK) rc = copy_records(c->db, c->path, dst, dest, rins, &n_rec, &bad_rec, err);
  if (rc == NF_OK) rc = nf__cache_copy_shapes(c->db, c->path, dst, dest, err);
  sqlite3_finalize(x.ins);
  sqlite3_finalize(rins);
  if (src_tx) nf__cache_rollback(c->db);
  if (rc == NF_OK) rc = nf__cache_commit(dst, dest, err);
  if (dst && sqlite3_close(dst) != SQLITE_OK && rc == NF_OK) {
    rc = nf__cache_fail(err, NF_EIO, c->path, "export: cannot close %s", tmp.data);
    sqlite3_close_v2(dst);
  }
  if (rc == NF_OK && sync_path(tmp.data, 0) != 0)
    rc = nf__cache_fail(err, NF_EIO, c->path, "export: fsync %s: %s", tmp.data, strerror(errno));
  if (rc == NF_OK && rename_noreplace(tmp.data, dest) != 0)
    rc = nf__cache_fail(err, errno == EEXIST ? NF_EINVAL : NF_EIO, c->path,
                        "export: cannot rename %s to %s: %s", tmp.data, dest, strerror(errno));
  if (rc == NF_OK && sync_path(dir, 1) != 0)
    rc = nf__cache_fail(err, NF_EIO, c->path, "export: fsync %s: %s", dir, strerror(errno));
  if (rc != NF_OK) unlink_db(tmp.data);
  if (rc == NF_OK) {
    if (x.skipped > MAX_LINES)
      line(err, c->path, "export skipped %lld entries that do not verify", (long long)x.skipped);
    if (bad_rec) line(err, c->path, "export skipped %lld damaged records", (long long)bad_rec);
    if (n_entries) *n_entries = x.copied;
  }
  nf_buf_free(&tmp);
  free(dir);
  return rc;
}

/* ---- import ---- */

/* "file:" URI naming path, read-only. */
static void file_uri(nf_buf *b, const char *path) {
  static const char hex[] = "0123456789ABCDEF";
  nf_buf_puts(b, "file:");
  for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
    int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                *p == '/' || *p == '.' || *p == '_' || *p == '-' || *p == '~';
    if (plain) {
      nf_buf_putc(b, (char)*p);
    } else {
      nf_buf_putc(b, '%');
      nf_buf_putc(b, hex[*p >> 4]);
      nf_buf_putc(b, hex[*p & 15]);
    }
  }
  nf_buf_puts(b, "?mode=ro");
}

typedef struct import_state {
  nf_cache *c;
  const char *src;
  sqlite3 *sdb;
  nf_cache_import_report *r;
} import_state;

static int import_row(void *user, sqlite3_stmt *st, int64_t rowid, const char *why, nf_buf *err) {
  import_state *m = user;
  m->r->seen++;
  if (why) {
    char name[64];
    entry_name(st, rowid, name, sizeof name);
    if (++m->r->rejected <= MAX_LINES) line(err, m->src, "import rejects %s: %s", name, why);
    return NF_OK;
  }
  /* the row's memory stays valid until st moves: no copies */
  nf_cache_entry e;
  memset(&e, 0, sizeof e);
  memcpy(e.key, sqlite3_column_blob(st, 0), 32);
  memcpy(e.graph_hash, sqlite3_column_blob(st, 1), 32);
  memcpy(e.target, sqlite3_column_blob(st, 2), 32);
  e.codegen = (char *)sqlite3_column_text(st, 3);
  e.graph_name = (char *)sqlite3_column_text(st, 4);
  e.target_desc = (char *)sqlite3_column_text(st, 5);
  e.tier = (int)sqlite3_column_int64(st, 6);
  e.schedule = (char *)sqlite3_column_text(st, 7);
  e.time_ms = sqlite3_column_double(st, 8);
  e.default_ms = sqlite3_column_double(st, 9);
  e.trials = (int)sqlite3_column_int64(st, 10);
  e.binary = (uint8_t *)sqlite3_column_blob(st, 11);
  e.binary_len = (size_t)sqlite3_column_bytes(st, 11);
  memcpy(e.sha256, sqlite3_column_blob(st, 12), 32);
  e.tune_error = (char *)sqlite3_column_text(st, 17);
  e.tune_check = (int)sqlite3_column_int64(st, 18);
  int64_t times[4];
  for (int i = 0; i < 4; i++) times[i] = sqlite3_column_int64(st, 13 + i);
  /* the binary's signature comes along when src has one; whether its
   * signer is trusted is the daemon's judgement when it serves the entry
   * (an unsigned or untrusted binary is never served: docs/security.md).
   * An unsigned entry never replaces one we have. */
  int rc = nf__cache_sig_get(m->sdb, m->src, e.key, e.sha256, &e.sig, &e.has_sig, err);
  if (rc != NF_OK) return rc;
  /* a signature is kept only when the judge (a daemon's own key) vouches
   * for it: anyone can write 64 bytes into an export */
  if (e.has_sig && !(m->c->judge && m->c->judge(m->c->judge_user, e.key, e.sha256, e.target,
                                                 &e.sig)))
    e.has_sig = 0;
  if (!e.has_sig) {
    int64_t have = 0;
    sqlite3_stmt *q = NULL;
    rc = nf__cache_prepare(m->c->db, m->c->path, "SELECT count(*) FROM entries WHERE key=?1", &q,
                           err);
    if (rc != NF_OK) return rc;
    sqlite3_bind_blob(q, 1, e.key, 32, SQLITE_STATIC);
    if (sqlite3_step(q) == SQLITE_ROW) have = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    m->r->unsigned_++;
    if (have) {
      m->r->kept++;
      return NF_OK;
    }
  }
  int what = NF__CACHE_KEPT;
  rc = nf__cache_put_tx(m->c, &e, times, &what, err);
  if (rc != NF_OK) return rc;
  if (what == NF__CACHE_ADDED)
    m->r->added++;
  else if (what == NF__CACHE_REPLACED)
    m->r->replaced++;
  else
    m->r->kept++;
  return NF_OK;
}

/* Merges src's records into c with the add_records rule, then trims the
 * keys over the per-key limit. */
static int import_records(nf_cache *c, sqlite3 *src, const char *path, int64_t *n, nf_buf *err) {
  sqlite3_stmt *st = NULL, *ins = NULL;
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT %s FROM records ORDER BY id", records_cols);
  int rc = nf__cache_prepare(src, path, sql, &st, err);
  if (rc == NF_OK) rc = nf__cache_prepare_record(c->db, c->path, &ins, err);
  int s = SQLITE_DONE;
  int64_t bad = 0;
  while (rc == NF_OK && (s = sqlite3_step(st)) == SQLITE_ROW) {
    if (!record_ok(st)) {
      bad++;
      continue;
    }
    const void *f = sqlite3_column_blob(st, 4);
    size_t nf = (size_t)sqlite3_column_bytes(st, 4);
    rc = nf__cache_put_record(
        c->db, c->path, ins, sqlite3_column_blob(st, 0), (const char *)sqlite3_column_text(st, 1),
        (int)sqlite3_column_int64(st, 2), sqlite3_column_double(st, 3), f, f ? nf : 0,
        (const char *)sqlite3_column_text(st, 5), sqlite3_column_int64(st, 6), err);
    if (rc == NF_OK) (*n)++;
  }
  if (rc == NF_OK && s != SQLITE_DONE) {
    if ((s & 0xff) == SQLITE_CORRUPT || (s & 0xff) == SQLITE_NOTADB)
      rc = nf__cache_fail(err, NF_EFORMAT, path, "records table damaged: %s", sqlite3_errmsg(src));
    else
      rc = nf__cache_sqlerr(path, src, s, "records", err);
  }
  sqlite3_finalize(st);
  sqlite3_finalize(ins);
  if (rc == NF_OK && bad) line(err, path, "import skipped %lld damaged records", (long long)bad);
  if (rc != NF_OK) return rc;
  /* keys over the limit */
  rc = nf__cache_prepare(c->db, c->path, "SELECT key FROM records GROUP BY key HAVING count(*)>?1",
                         &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_int64(st, 1, nf__cache_max_records);
  uint8_t(*keys)[32] = NULL;
  size_t nk = 0, cap = 0;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    if (sqlite3_column_bytes(st, 0) != 32) continue;
    if (nk == cap) {
      size_t nc = cap ? 2 * cap : 8;
      uint8_t(*nv)[32] = realloc(keys, nc * sizeof *nv);
      if (!nv) {
        rc = nf__cache_fail(err, NF_ENOMEM, c->path, "out of memory");
        break;
      }
      keys = nv;
      cap = nc;
    }
    memcpy(keys[nk++], sqlite3_column_blob(st, 0), 32);
  }
  if (rc == NF_OK && s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "records", err);
  sqlite3_finalize(st);
  for (size_t i = 0; rc == NF_OK && i < nk; i++)
    rc = nf__cache_trim_records(c->db, c->path, keys[i], err);
  free(keys);
  return rc;
}

int nf_cache_import(nf_cache *c, const char *src, nf_cache_import_report *r, nf_buf *err) {
  memset(r, 0, sizeof *r);
  if (c->read_only)
    return nf__cache_fail(err, NF_EINVAL, c->path, "import: the cache is opened read-only");
  struct stat ss, cs;
  if (stat(src, &ss) != 0)
    return nf__cache_fail(err, errno == ENOENT ? NF_ENOENT : NF_EIO, src, "%s", strerror(errno));
  if (stat(c->path, &cs) == 0 && cs.st_dev == ss.st_dev && cs.st_ino == ss.st_ino)
    return nf__cache_fail(err, NF_EINVAL, c->path, "import: %s is this cache itself", src);
  nf_buf uri = NF_BUF_INIT;
  file_uri(&uri, src);
  if (uri.oom) {
    nf_buf_free(&uri);
    return nf__cache_fail(err, NF_ENOMEM, src, "out of memory");
  }
  sqlite3 *sdb = NULL;
  int rc = nf__cache_open_db(
      uri.data, src,
      SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, 1,
      c->busy_ms, &sdb, err);
  nf_buf_free(&uri);
  int schema = 0, ok = 0;
  if (rc == NF_OK) rc = nf__cache_check_header(sdb, src, &schema, err);
  if (rc == NF_OK && schema != NF_CACHE_SCHEMA)
    rc = nf__cache_fail(err, NF_EFORMAT, src,
                        schema ? "schema %d is older than %d: open it writable with this "
                                 "neoflow once, then import"
                               : "empty database (schema %d, expected %d)",
                        schema, NF_CACHE_SCHEMA);
  if (rc == NF_OK) rc = nf__cache_check_integrity(sdb, src, 0, &ok, err);
  if (rc == NF_OK && !ok) rc = NF_EFORMAT;
  int64_t n_tables = 0;
  if (rc == NF_OK)
    rc = nf__cache_query_i64(sdb, src,
                             "SELECT count(*) FROM sqlite_schema WHERE type='table'"
                             " AND name IN ('entries','records')",
                             &n_tables, err);
  if (rc == NF_OK && n_tables != 2)
    rc = nf__cache_fail(err, NF_EFORMAT, src, "entries or records is not a table");
  int src_tx = 0;
  if (rc == NF_OK && (rc = nf__cache_exec(sdb, src, "BEGIN", err)) == NF_OK) src_tx = 1;
  if (rc == NF_OK) rc = nf__cache_begin(c->db, c->path, err);
  if (rc == NF_OK) {
    nf__cache_hook("import:begin");
    import_state m = {c, src, sdb, r};
    int incomplete = 0;
    rc = each_entry(sdb, src, import_row, &m, &incomplete, err);
    if (rc == NF_OK && incomplete)
      rc = nf__cache_fail(err, NF_EFORMAT, src, "entries table damaged: nothing imported");
    if (rc == NF_OK && r->rejected > MAX_LINES)
      line(err, src, "import rejected %lld entries in all", (long long)r->rejected);
    if (rc == NF_OK) rc = import_records(c, sdb, src, &r->records, err);
    if (rc == NF_OK) rc = nf__cache_copy_shapes(sdb, src, c->db, c->path, err);
    if (rc == NF_OK) {
      nf__cache_hook("import:commit");
      rc = nf__cache_commit(c->db, c->path, err);
    } else {
      nf__cache_rollback(c->db);
    }
  }
  if (src_tx) nf__cache_rollback(sdb);
  sqlite3_close_v2(sdb);
  if (rc != NF_OK) {
    int64_t rejected = r->rejected;
    memset(r, 0, sizeof *r);
    r->rejected = rejected;
  }
  return rc;
}

/* ---- gc ---- */

/* Deletes the entries matching cond (one parameter ?1 bound by bind) and
 * their records; adds to the report. */
static int gc_delete(nf_cache *c, const char *cond, const char *text, int64_t num,
                     nf_cache_gc_report *r, nf_buf *err) {
  static const char *const fmt[] = {
      "SELECT count(*), coalesce(sum(length(binary)), 0) FROM entries WHERE %s",
      "DELETE FROM records WHERE key IN (SELECT key FROM entries WHERE %s)",
      "DELETE FROM entries WHERE %s",
  };
  int rc = NF_OK;
  for (int i = 0; rc == NF_OK && i < 3; i++) {
    char sql[256];
    snprintf(sql, sizeof sql, fmt[i], cond);
    sqlite3_stmt *st = NULL;
    rc = nf__cache_prepare(c->db, c->path, sql, &st, err);
    if (rc != NF_OK) break;
    if (text)
      sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    else
      sqlite3_bind_int64(st, 1, num);
    int s = sqlite3_step(st);
    if (i == 0 && s == SQLITE_ROW) {
      r->removed += sqlite3_column_int64(st, 0);
      r->freed_bytes += sqlite3_column_int64(st, 1);
      s = SQLITE_DONE;
    }
    if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "gc", err);
    sqlite3_finalize(st);
  }
  return rc;
}

int nf_cache_gc(nf_cache *c, const nf_cache_gc_opts *o, nf_cache_gc_report *r, nf_buf *err) {
  static const nf_cache_gc_opts none = {0};
  if (!o) o = &none;
  memset(r, 0, sizeof *r);
  if (c->read_only)
    return nf__cache_fail(err, NF_EINVAL, c->path, "gc: the cache is opened read-only");
  if (o->max_bytes < 0 || o->older_than_s < 0)
    return nf__cache_fail(err, NF_EINVAL, c->path, "gc: negative size or age");
  int rc = nf__cache_begin(c->db, c->path, err);
  if (rc != NF_OK) return rc;
  if (o->keep_codegen) rc = gc_delete(c, "codegen IS NOT ?1", o->keep_codegen, 0, r, err);
  if (rc == NF_OK && o->older_than_s > 0) {
    int64_t cutoff = nf__cache_now() - o->older_than_s;
    rc = gc_delete(c, "last_used < ?1", NULL, cutoff, r, err);
    sqlite3_stmt *st = NULL;
    if (rc == NF_OK)
      rc = nf__cache_prepare(c->db, c->path,
                             "DELETE FROM records WHERE at < ?1"
                             " AND key NOT IN (SELECT key FROM entries)",
                             &st, err);
    if (rc == NF_OK) {
      sqlite3_bind_int64(st, 1, cutoff);
      int s = sqlite3_step(st);
      if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "gc", err);
      sqlite3_finalize(st);
    }
  }
  if (rc == NF_OK && o->max_bytes > 0) {
    int64_t total = 0;
    rc = nf__cache_query_i64(c->db, c->path, "SELECT coalesce(sum(length(binary)), 0) FROM entries",
                             &total, err);
    int64_t before = total;
    if (rc == NF_OK && total > o->max_bytes)
      rc = nf__cache_evict(c, NULL, o->max_bytes, &total, &r->removed, err);
    if (rc == NF_OK) r->freed_bytes += before - total;
  }
  /* shapes of keys without an entry are never read (they are joined
   * with entries): dropped with them */
  if (rc == NF_OK)
    rc = nf__cache_exec(c->db, c->path,
                        "DELETE FROM shapes WHERE key NOT IN (SELECT key FROM entries)", err);
  if (rc == NF_OK && o->drop_quarantine)
    rc = nf__cache_exec(c->db, c->path, "DELETE FROM quarantine", err);
  if (rc == NF_OK) {
    nf__cache_hook("gc:commit");
    rc = nf__cache_commit(c->db, c->path, err);
  } else {
    nf__cache_rollback(c->db);
    memset(r, 0, sizeof *r);
  }
  if (rc != NF_OK) return rc;
  /* readers may keep the checkpoint from finishing: that is not an error */
  rc = nf__cache_exec(c->db, c->path,
                      "PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE)",
                      err);
  return rc;
}

/* ---- statistics and listing ---- */

int nf_cache_stats_get(nf_cache *c, nf_cache_stats *s, nf_buf *err) {
  memset(s, 0, sizeof *s);
  sqlite3_stmt *st = NULL;
  /* one read transaction: the numbers describe one state */
  int rc = nf__cache_exec(c->db, c->path, "BEGIN", err);
  if (rc != NF_OK) return rc;
  rc = nf__cache_prepare(c->db, c->path,
                         "SELECT count(*), coalesce(sum(tier=1), 0), coalesce(sum(tier=2), 0),"
                         " coalesce(sum(length(binary)), 0) FROM entries",
                         &st, err);
  if (rc == NF_OK) {
    int q = sqlite3_step(st);
    if (q == SQLITE_ROW) {
      s->entries = sqlite3_column_int64(st, 0);
      s->tier1 = sqlite3_column_int64(st, 1);
      s->tier2 = sqlite3_column_int64(st, 2);
      s->binary_bytes = sqlite3_column_int64(st, 3);
    } else {
      rc = nf__cache_sqlerr(c->path, c->db, q, "stats", err);
    }
    sqlite3_finalize(st);
  }
  if (rc == NF_OK)
    rc = nf__cache_query_i64(c->db, c->path, "SELECT count(*) FROM records", &s->records, err);
  if (rc == NF_OK)
    rc = nf__cache_query_i64(c->db, c->path, "SELECT count(*) FROM quarantine", &s->quarantined,
                             err);
  int64_t uv = 0;
  if (rc == NF_OK) rc = nf__cache_query_i64(c->db, c->path, "PRAGMA user_version", &uv, err);
  nf__cache_rollback(c->db);
  if (rc != NF_OK) return rc;
  s->schema = (int)uv;
  s->hits = c->hits;
  s->misses = c->misses;
  s->corrupt = c->corrupt;
  struct stat sb;
  if (stat(c->path, &sb) == 0) s->file_bytes += sb.st_size;
  nf_buf wal = NF_BUF_INIT;
  nf_buf_printf(&wal, "%s-wal", c->path);
  if (!wal.oom && stat(wal.data, &sb) == 0) s->file_bytes += sb.st_size;
  nf_buf_free(&wal);
  return NF_OK;
}

int nf_cache_list(nf_cache *c, int (*fn)(void *user, const nf_cache_entry *e), void *user,
                  nf_buf *err) {
  sqlite3_stmt *st = NULL;
  int rc =
      nf__cache_prepare(c->db, c->path,
                        "SELECT key, graph_hash, target, codegen, graph_name, target_desc, tier,"
                        " schedule, time_ms, default_ms, trials, length(binary), sha256, created,"
                        " updated, last_used, hits, tune_error, tune_check FROM entries"
                        " ORDER BY last_used DESC, key",
                        &st, err);
  if (rc != NF_OK) return rc;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    nf_cache_entry e;
    memset(&e, 0, sizeof e);
    const uint8_t *b;
    if ((b = nf__cache_col_blob(st, 0, 32))) memcpy(e.key, b, 32);
    if ((b = nf__cache_col_blob(st, 1, 32))) memcpy(e.graph_hash, b, 32);
    if ((b = nf__cache_col_blob(st, 2, 32))) memcpy(e.target, b, 32);
    if ((b = nf__cache_col_blob(st, 12, 32))) memcpy(e.sha256, b, 32);
    const char *t;
    /* the strings stay SQLite's: valid during the call only */
    e.codegen = (char *)((t = nf__cache_col_text(st, 3)) ? t : "");
    e.graph_name = (char *)((t = nf__cache_col_text(st, 4)) ? t : "");
    e.target_desc = (char *)((t = nf__cache_col_text(st, 5)) ? t : "");
    e.schedule = (char *)((t = nf__cache_col_text(st, 7)) ? t : "");
    e.tier = (int)sqlite3_column_int64(st, 6);
    e.time_ms = sqlite3_column_double(st, 8);
    e.default_ms = sqlite3_column_double(st, 9);
    e.trials = (int)sqlite3_column_int64(st, 10);
    e.binary_len = (size_t)sqlite3_column_int64(st, 11);
    e.created = sqlite3_column_int64(st, 13);
    e.updated = sqlite3_column_int64(st, 14);
    e.last_used = sqlite3_column_int64(st, 15);
    e.hits = sqlite3_column_int64(st, 16);
    e.tune_error = (char *)((t = nf__cache_col_text(st, 17)) ? t : "");
    e.tune_check = (int)sqlite3_column_int64(st, 18);
    if (fn(user, &e)) {
      s = SQLITE_DONE;
      break;
    }
  }
  if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "list", err);
  sqlite3_finalize(st);
  return rc;
}

/* ---- damaged caches: moving aside, recovering ---- */

int nf_cache_move_aside(const char *path, char *moved, size_t n, nf_buf *err) {
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  char base[4200];
  struct stat sb;
  for (int k = 0;; k++) {
    if (k == 0) snprintf(base, sizeof base, "%s.damaged-%s", path, stamp);
    else snprintf(base, sizeof base, "%s.damaged-%s.%d", path, stamp, k);
    if (lstat(base, &sb) != 0 && errno == ENOENT) break;
    if (k > 100) return nf__cache_fail(err, NF_EIO, path, "cannot find a free name to move it to");
  }
  if (strlen(base) >= n) return nf__cache_fail(err, NF_EIO, path, "the new name is too long");
  if (rename_noreplace(path, base) != 0)
    return nf__cache_fail(err, NF_EIO, path, "cannot move it to %s: %s", base, strerror(errno));
  static const char *const sfx[] = {"-wal", "-shm", "-journal"};
  for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
    char a[4300], b[4300];
    snprintf(a, sizeof a, "%s%s", path, sfx[i]);
    snprintf(b, sizeof b, "%s%s", base, sfx[i]);
    if (lstat(a, &sb) == 0 && rename_noreplace(a, b) != 0)
      return nf__cache_fail(err, NF_EIO, path, "cannot move %s to %s: %s", a, b, strerror(errno));
  }
  char *dir = dir_of(path);
  if (dir) sync_path(dir, 1);
  free(dir);
  memcpy(moved, base, strlen(base) + 1);
  return NF_OK;
}

/* Copies a file (the damaged one is never opened for writing). */
static int copy_file(const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (in < 0) return -1;
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) {
    close(in);
    return -1;
  }
  char buf[1 << 16];
  ssize_t r;
  int rc = 0;
  while ((r = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)r) != r) {
      rc = -1;
      break;
    }
  if (r < 0) rc = -1;
  close(in);
  if (close(out) != 0) rc = -1;
  return rc;
}

/* Runs `sqlite3 db CMD` (.recover, or .dump) with its output in sql_path;
 * 0 on success, 127 when there is no sqlite3 program, else its status. */
static int run_sqlite3(const char *db, const char *cmd, const char *sql_path) {
  pid_t p = fork();
  if (p < 0) return -1;
  if (p == 0) {
    int fd = open(sql_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int nul = open("/dev/null", O_RDWR);
    if (fd < 0 || nul < 0) _exit(126);
    dup2(nul, 0);
    dup2(fd, 1);
    dup2(nul, 2);
    execlp("sqlite3", "sqlite3", db, cmd, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Reads a whole file (the recovered SQL) into a NUL-terminated buffer. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  nf_buf b = NF_BUF_INIT;
  char chunk[1 << 16];
  size_t r;
  while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) nf_buf_add(&b, chunk, r);
  fclose(f);
  if (b.oom) {
    nf_buf_free(&b);
    return NULL;
  }
  nf_buf_putc(&b, 0);
  return b.data;
}

/* What replayed SQL from a damaged (so: untrusted) file may do: create
 * tables and indexes (which writes the schema) and insert rows into them,
 * in the database it is replayed into, reading values and calling the few
 * functions .dump and the schema's CHECKs use.  No ATTACH, PRAGMA,
 * transaction control, trigger, view, virtual table, update or delete, and
 * no schema write but a CREATE's own.  The authorizer runs while a
 * statement is prepared (nothing runs then) and only records; a statement
 * that did anything else is finalized unrun. */
typedef struct replay_check {
  int bad, created, schema_write;
} replay_check;

static int replay_auth(void *user, int action, const char *a1, const char *a2, const char *db,
                       const char *trigger) {
  replay_check *r = user;
  int main_db = !db || !strcmp(db, "main");
  int schema = a1 && !strncmp(a1, "sqlite_", 7);
  if (trigger || !main_db) r->bad = 1;
  switch (action) {
    case SQLITE_CREATE_TABLE:
    case SQLITE_CREATE_INDEX: r->created = 1; break;
    case SQLITE_INSERT: r->schema_write |= schema; break;
    case SQLITE_UPDATE:
      if (schema) r->schema_write = 1;
      else r->bad = 1;
      break;
    case SQLITE_READ:
    case SQLITE_SELECT:
    case SQLITE_REINDEX: break;
    case SQLITE_FUNCTION:
      if (!a2 || (strcmp(a2, "replace") && strcmp(a2, "char") && strcmp(a2, "unistr") &&
                  strcmp(a2, "typeof") && strcmp(a2, "length")))
        r->bad = 1;
      break;
    default: r->bad = 1;
  }
  return SQLITE_OK;
}

int nf_cache_recover(nf_cache *c, const char *src, nf_cache_import_report *r, nf_buf *err) {
  memset(r, 0, sizeof *r);
  struct stat sb;
  if (stat(src, &sb) != 0)
    return nf__cache_fail(err, errno == ENOENT ? NF_ENOENT : NF_EIO, src, "%s", strerror(errno));
  char *dir = dir_of(c->path);
  if (!dir) return nf__cache_fail(err, NF_ENOMEM, c->path, "out of memory");
  char tmp[4200], copy[4300], sql[4300], out[4300];
  snprintf(tmp, sizeof tmp, "%s/.recover-XXXXXX", dir);
  free(dir);
  if (!mkdtemp(tmp))
    return nf__cache_fail(err, NF_EIO, c->path, "recover: cannot make a work directory: %s",
                          strerror(errno));
  snprintf(copy, sizeof copy, "%s/damaged.db", tmp);
  snprintf(sql, sizeof sql, "%s/recovered.sql", tmp);
  snprintf(out, sizeof out, "%s/recovered.db", tmp);
  int rc = NF_OK;
  char wal_from[4400], wal_to[4400];
  snprintf(wal_from, sizeof wal_from, "%s-wal", src);
  snprintf(wal_to, sizeof wal_to, "%s-wal", copy);
  if (copy_file(src, copy) != 0 || (stat(wal_from, &sb) == 0 && copy_file(wal_from, wal_to) != 0))
    rc = nf__cache_fail(err, NF_EIO, src, "recover: cannot copy it: %s", strerror(errno));
  /* .recover reads the pages themselves, but needs the sqlite_dbpage table
   * that Debian's SQLite is built without; .dump reads what each table's
   * scan still reaches (a damaged index does not matter to it) */
  int st = rc == NF_OK ? run_sqlite3(copy, ".recover", sql) : 0;
  if (rc == NF_OK && st != 0 && st != 127) st = run_sqlite3(copy, ".dump", sql);
  if (rc == NF_OK && st == 127)
    rc = nf__cache_fail(err, NF_EUNSUPPORTED, src,
                        "recover needs SQLite's sqlite3 program (apt install sqlite3)");
  char *text = rc == NF_OK ? slurp(sql) : NULL;
  if (rc == NF_OK && !text) rc = nf__cache_fail(err, NF_EIO, src, "recover: cannot read its output");
  sqlite3 *db = NULL;
  if (rc == NF_OK)
    rc = nf__cache_open_db(out, out,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX |
                               SQLITE_OPEN_EXRESCODE,
                           1, c->busy_ms, &db, err);
  if (db) sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  /* statement by statement in one transaction of ours: a statement that
   * fails (a row cut short) is skipped, and the tool's own BEGIN, COMMIT
   * or "ROLLBACK; -- due to errors" do not decide for us */
  int64_t n_ok = 0, n_bad = 0;
  if (rc == NF_OK) rc = nf__cache_exec(db, out, "BEGIN", err);
  replay_check chk;
  if (rc == NF_OK) sqlite3_set_authorizer(db, replay_auth, &chk);
  for (const char *p = text; rc == NF_OK && p && *p;) {
    sqlite3_stmt *q = NULL;
    const char *tail = NULL;
    memset(&chk, 0, sizeof chk);
    int prc = sqlite3_prepare_v2(db, p, -1, &q, &tail);
    if (prc == SQLITE_OK && (chk.bad || (chk.schema_write && !chk.created))) {
      sqlite3_finalize(q); /* refused, never run */
      n_bad++;
      p = tail;
      continue;
    }
    if (prc != SQLITE_OK) {
      /* refused or unreadable: on to the end of this statement (the first
       * ';' at which the text so far is complete SQL, so that a ';' in a
       * string does not count) */
      n_bad++;
      const char *semi = p;
      for (;;) {
        semi = strchr(semi, ';');
        if (!semi) break;
        semi++;
        char *stmt = strndup(p, (size_t)(semi - p));
        int done = !stmt || sqlite3_complete(stmt);
        free(stmt);
        if (done) break;
      }
      p = semi;
      continue;
    }
    p = tail;
    if (!q) continue;
    int s2;
    while ((s2 = sqlite3_step(q)) == SQLITE_ROW) {
    }
    if (s2 == SQLITE_DONE) n_ok++;
    else n_bad++;
    sqlite3_finalize(q);
  }
  if (db) sqlite3_set_authorizer(db, NULL, NULL);
  if (rc == NF_OK) rc = nf__cache_exec(db, out, "COMMIT", err);
  if (rc == NF_OK && n_bad)
    line(err, src, "recover: %lld of %lld statements read back were not replayed (refused: "
                   "only tables, indexes and rows are; or cut short by the damage)",
         (long long)n_bad, (long long)(n_ok + n_bad));
  free(text);
  /* the header's application_id and schema are not part of what .recover
   * writes: the tables say which schema it was */
  int64_t has_entries = 0, has_sigs = 0, has_shapes = 0;
  if (rc == NF_OK)
    rc = nf__cache_query_i64(db, out,
                             "SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='entries'",
                             &has_entries, err);
  if (rc == NF_OK)
    rc = nf__cache_query_i64(
        db, out, "SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='signatures'",
        &has_sigs, err);
  if (rc == NF_OK)
    rc = nf__cache_query_i64(
        db, out, "SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='shapes'",
        &has_shapes, err);
  if (rc == NF_OK && !has_entries)
    rc = nf__cache_fail(err, NF_EFORMAT, src, "recover: no entries table could be read back");
  if (rc == NF_OK) {
    char pragma[128];
    snprintf(pragma, sizeof pragma, "PRAGMA application_id=%d; PRAGMA user_version=%d",
             (int)NF_CACHE_APPLICATION_ID, has_sigs && has_shapes ? 3 : has_sigs ? 2 : 1);
    rc = nf__cache_exec(db, out, pragma, err);
  }
  if (db) sqlite3_close(db);
  /* migrated to this schema, then merged like an import: every row is
   * checked again */
  if (rc == NF_OK) {
    nf_cache *rcv = NULL;
    nf_cache_opts o = {0};
    rc = nf_cache_open(out, &o, &rcv, err);
    nf_cache_close(rcv);
  }
  if (rc == NF_OK) rc = nf_cache_import(c, out, r, err);
  unlink_db(copy);
  unlink_db(out);
  unlink(sql);
  rmdir(tmp);
  return rc;
}
