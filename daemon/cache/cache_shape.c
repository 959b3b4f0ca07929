/* cache_shape.c - what the cache knows across keys (schema 3): each key's
 * shape (a structural signature and a descriptor of its extents), the
 * keys similar to a new subgraph, and the recent records of every key
 * for training the cost model.
 *
 * Invariants: a shape row names a key; it is only ever read joined with
 * the entries table (target and code generator must match), so a shape
 * whose entry is gone (evicted, quarantined) is never returned, and gc
 * drops it.  Nothing here judges a row's plausibility beyond its sizes:
 * what it feeds is a search, which measures everything it tries.
 *
 * Not here: how a signature is computed (daemon/search: the sketch
 * class and loop structure), or how near two descriptors are (the
 * daemon's choice). */
#include <stdlib.h>
#include <string.h>

#include "cache_int.h"

int nf_cache_put_shape(nf_cache *c, const uint8_t key[32], const uint8_t sig[NF_CACHE_SIG],
                       const float *desc, size_t n_desc, nf_buf *err) {
  if (c->read_only)
    return nf__cache_fail(err, NF_EINVAL, c->path, "shape: the cache is opened read-only");
  if (n_desc > NF_CACHE_DESC || (n_desc && !desc))
    return nf__cache_fail(err, NF_EINVAL, c->path, "shape: descriptor of %zu floats", n_desc);
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(c->db, c->path,
                             "INSERT OR REPLACE INTO shapes(key, sig, descr) VALUES(?1,?2,?3)",
                             &st, err);
  if (rc != NF_OK) return rc;
  static const float none = 0;
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, sig, NF_CACHE_SIG, SQLITE_STATIC);
  /* an empty descriptor is a zero-length blob, not NULL */
  sqlite3_bind_blob(st, 3, n_desc ? (const void *)desc : (const void *)&none,
                    (int)(n_desc * sizeof *desc), SQLITE_STATIC);
  int s = sqlite3_step(st);
  if (s != SQLITE_DONE) rc = nf__cache_sqlerr(c->path, c->db, s, "shape", err);
  sqlite3_finalize(st);
  return rc;
}

int nf_cache_find_similar(nf_cache *c, const uint8_t sig[NF_CACHE_SIG], const uint8_t target[32],
                          const char *codegen, const uint8_t *except, size_t max,
                          nf_cache_similar **out, size_t *n, nf_buf *err) {
  static const uint8_t no_key[32];
  *out = NULL;
  *n = 0;
  if (!max) max = 256;
  sqlite3_stmt *st = NULL;
  int rc = nf__cache_prepare(c->db, c->path,
                             "SELECT s.key, s.descr FROM shapes s JOIN entries e ON e.key=s.key"
                             " WHERE s.sig=?1 AND e.target=?2 AND e.codegen=?3 AND s.key<>?4"
                             " ORDER BY e.last_used DESC LIMIT ?5",
                             &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, sig, NF_CACHE_SIG, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, target, 32, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, codegen, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 4, except ? except : no_key, 32, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, (int64_t)max);
  nf_cache_similar *v = calloc(max, sizeof *v);
  if (!v) {
    sqlite3_finalize(st);
    return nf__cache_fail(err, NF_ENOMEM, c->path, "similar: out of memory");
  }
  size_t cnt = 0;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW && cnt < max) {
    const uint8_t *k = nf__cache_col_blob(st, 0, 32);
    int dl = sqlite3_column_bytes(st, 1);
    const void *d = sqlite3_column_blob(st, 1);
    if (!k || sqlite3_column_type(st, 1) != SQLITE_BLOB || dl < 0 || dl % 4 ||
        (size_t)dl > NF_CACHE_DESC * sizeof(float))
      continue; /* damaged: not worth failing a search for */
    memcpy(v[cnt].key, k, 32);
    if (dl) memcpy(v[cnt].desc, d, (size_t)dl);
    v[cnt].n_desc = (size_t)dl / sizeof(float);
    cnt++;
  }
  if (s != SQLITE_DONE && s != SQLITE_ROW) rc = nf__cache_sqlerr(c->path, c->db, s, "similar", err);
  sqlite3_finalize(st);
  if (rc != NF_OK || !cnt) {
    free(v);
    return rc;
  }
  *out = v;
  *n = cnt;
  return NF_OK;
}

int nf_cache_get_corpus(nf_cache *c, const uint8_t target[32], const char *codegen,
                        const uint8_t *except, size_t max, nf_cache_record **out, size_t *n,
                        nf_buf *err) {
  static const uint8_t no_key[32];
  *out = NULL;
  *n = 0;
  if (!max) max = 4096;
  sqlite3_stmt *st = NULL;
  /* newest first: the records table's rowid order, each joined to its
   * entry by the entries' primary key */
  int rc = nf__cache_prepare(c->db, c->path,
                             "SELECT r.key, r.time_ms, r.features FROM records r"
                             " JOIN entries e ON e.key=r.key"
                             " WHERE e.target=?1 AND e.codegen=?2 AND r.key<>?3 AND r.status=0"
                             " AND r.time_ms>0 AND typeof(r.features)='blob'"
                             " ORDER BY r.id DESC LIMIT ?4",
                             &st, err);
  if (rc != NF_OK) return rc;
  sqlite3_bind_blob(st, 1, target, 32, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, codegen, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 3, except ? except : no_key, 32, SQLITE_STATIC);
  sqlite3_bind_int64(st, 4, (int64_t)max);
  nf_cache_record *v = calloc(max, sizeof *v);
  uint8_t(*keys)[32] = calloc(max, 32);
  size_t cnt = 0, n_keys = 0;
  if (!v || !keys) rc = NF_ENOMEM;
  int s = SQLITE_DONE;
  while (rc == NF_OK && cnt < max && (s = sqlite3_step(st)) == SQLITE_ROW) {
    const uint8_t *k = nf__cache_col_blob(st, 0, 32);
    double t = sqlite3_column_double(st, 1);
    int fl = sqlite3_column_bytes(st, 2);
    const void *f = sqlite3_column_blob(st, 2);
    if (!k || !f || fl <= 0 || !(t > 0)) continue;
    /* the group of this key: keys are few next to records; a linear
     * search from the latest key, which the next record usually shares */
    size_t g = n_keys;
    for (size_t q = n_keys; q-- > 0;)
      if (memcmp(keys[q], k, 32) == 0) {
        g = q;
        break;
      }
    if (g == n_keys) memcpy(keys[n_keys++], k, 32);
    nf_cache_record *r = &v[cnt];
    r->features = malloc((size_t)fl);
    if (!r->features) {
      rc = NF_ENOMEM;
      break;
    }
    memcpy(r->features, f, (size_t)fl);
    r->n_features = (size_t)fl;
    r->time_ms = t;
    r->group = (uint32_t)g;
    cnt++;
  }
  if (rc == NF_OK && s != SQLITE_DONE && s != SQLITE_ROW)
    rc = nf__cache_sqlerr(c->path, c->db, s, "corpus", err);
  sqlite3_finalize(st);
  free(keys);
  if (rc != NF_OK || !cnt) {
    nf_cache_records_free(v, cnt);
    if (!v && rc == NF_OK) rc = NF_ENOMEM;
    if (rc == NF_ENOMEM) nf__cache_fail(err, NF_ENOMEM, c->path, "corpus: out of memory");
    return rc;
  }
  *out = v;
  *n = cnt;
  return NF_OK;
}

int nf__cache_copy_shapes(sqlite3 *src, const char *spath, sqlite3 *dst, const char *dpath,
                          nf_buf *err) {
  sqlite3_stmt *sel = NULL, *ins = NULL;
  int rc = nf__cache_prepare(src, spath, "SELECT key, sig, descr FROM shapes", &sel, err);
  if (rc == NF_OK)
    rc = nf__cache_prepare(dst, dpath,
                           "INSERT OR IGNORE INTO shapes(key, sig, descr) VALUES(?1,?2,?3)", &ins,
                           err);
  int s = SQLITE_DONE;
  while (rc == NF_OK && (s = sqlite3_step(sel)) == SQLITE_ROW) {
    const uint8_t *k = nf__cache_col_blob(sel, 0, 32), *g = nf__cache_col_blob(sel, 1, NF_CACHE_SIG);
    int dl = sqlite3_column_bytes(sel, 2);
    if (!k || !g || sqlite3_column_type(sel, 2) != SQLITE_BLOB || dl % 4 ||
        (size_t)dl > NF_CACHE_DESC * sizeof(float))
      continue; /* a damaged shape is only a hint lost */
    sqlite3_reset(ins);
    sqlite3_bind_blob(ins, 1, k, 32, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 2, g, NF_CACHE_SIG, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 3, sqlite3_column_blob(sel, 2), dl, SQLITE_TRANSIENT);
    int w = sqlite3_step(ins);
    if (w != SQLITE_DONE) rc = nf__cache_sqlerr(dpath, dst, w, "shapes", err);
  }
  if (rc == NF_OK && s != SQLITE_DONE) rc = nf__cache_sqlerr(spath, src, s, "shapes", err);
  sqlite3_finalize(sel);
  sqlite3_finalize(ins);
  return rc;
}
