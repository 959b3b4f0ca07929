/* test_cache.c - the SQLite tuning cache (daemon/cache/nf_cache.h) and the
 * `neoflow cache` command (client/tool/cache_cmd.c, compiled in here).
 *
 *  - put/get round trip with every field, keys, hits and misses, touch,
 *    list; invalid puts (digest, key, tier, times) refused;
 *  - the better rule: tier 2 beats tier 1, faster beats slower, an
 *    unmeasured time never replaces a measured one, tier 1 never replaces
 *    tier 2;
 *  - a failure to tune (tune_error, tune_check) is stored on a tier-1
 *    entry, replaces one never tuned and one found under another check
 *    revision, travels through export and import, shows in `cache list`,
 *    and is cleared by a measured kernel; a schema-1 database migrates
 *    (its entries kept, with no failure);
 *  - reopening keeps entries and records; records are ordered best first,
 *    duplicates keep the faster, the per-key limit drops failures first;
 *  - corruption: flipped binary bytes, a wrong digest, a changed codegen
 *    are misses, quarantined, counted, and the next put/get works; a
 *    read-only handle misses without moving anything;
 *  - refusals: a garbage file, a damaged page (quick_check), a foreign
 *    application_id, a newer user_version, a network filesystem (through
 *    the statfs hook; accepted with allow_network_fs, rollback journal), a
 *    second writer (the message names the pid), writes on a read-only
 *    handle, a missing file opened read-only;
 *  - export then import gives the same entries; import keeps the better
 *    per key and rejects tampered rows; export refuses an existing file;
 *  - gc by age, codegen and size; soft cap eviction and hard cap refusal;
 *    verify finds and fixes a tampered entry;
 *  - another connection holding BEGIN IMMEDIATE makes a put fail "busy"
 *    after a short busy timeout (no wall-clock assertion), and reads go on;
 *  - a file size limit (SQLITE_FULL / I/O error) fails a put with nothing
 *    partial;
 *  - SIGKILL at every write step of several iterations, and during the
 *    migrations: the database reopens, quick_check is ok, every
 *    entry verifies, exactly the committed entries and records exist;
 *  - the command: stats (text, JSON), list, verify's exit status, export,
 *    import, gc, usage errors (2) and open errors (1, "neoflow cache: ").
 * Run under valgrind with `meson test --setup valgrind cache`. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nf_cache.h"

/* the command under test, built into this executable */
#include "../client/tool/cache_cmd.c"

#define CG "nf-test-codegen-1"

/* ---- helpers ---- */

/* One temporary directory per test, in static storage: children forked
 * by the tests own no heap block of the parent's (valgrind checks them
 * too). */
static char test_dir[64];

static char *tmp_dir(void) {
  snprintf(test_dir, sizeof test_dir, "/tmp/nfcache-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_dir));
  return test_dir;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static void rm_dir(char *d) { nftw(d, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* dir/name in a static ring of buffers */
static const char *in(const char *dir, const char *name) {
  static char buf[8][512];
  static int k;
  char *b = buf[k++ & 7];
  snprintf(b, sizeof buf[0], "%s/%s", dir, name);
  return b;
}

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* An entry with deterministic contents: seed picks the graph (so the
 * key), tier and ms the version. */
static void mk_entry(nf_cache_entry *e, unsigned seed, int tier, double ms, const char *codegen,
                     size_t len) {
  memset(e, 0, sizeof *e);
  for (int i = 0; i < 32; i++) {
    e->graph_hash[i] = (uint8_t)(seed * 37u + (unsigned)i * 11u + (seed >> 8));
    e->target[i] = (uint8_t)(0xA0 ^ i);
  }
  e->codegen = strdup(codegen);
  char b[64];
  snprintf(b, sizeof b, "graph%u", seed);
  e->graph_name = strdup(b);
  e->target_desc = strdup("test cpu (avx2)");
  snprintf(b, sizeof b, "split(i, %u); vectorize(i.in)", seed % 64 + 1);
  e->schedule = strdup(b);
  e->tier = tier;
  e->time_ms = ms;
  e->default_ms = 10.0;
  e->trials = 7;
  e->binary_len = len;
  e->binary = malloc(len);
  uint32_t x = seed * 2654435761u + (uint32_t)tier * 7u + (uint32_t)(ms * 1000.0);
  for (size_t i = 0; i < len; i++) {
    x = x * 1664525u + 1013904223u;
    e->binary[i] = (uint8_t)(x >> 24);
  }
  crypto_hash_sha256(e->sha256, e->binary, len);
  nf_cache_make_key(e->graph_hash, e->target, e->codegen, e->key);
  /* a signature the cache stores as data (the daemon judges it) */
  e->has_sig = 1;
  for (int i = 0; i < 32; i++) e->sig.signer[i] = (uint8_t)(0x5a ^ i);
  for (int i = 0; i < 64; i++) e->sig.sig[i] = (uint8_t)(seed + (unsigned)i);
}

static nf_cache *open_ok(const char *path, const nf_cache_opts *o) {
  nf_cache *c = NULL;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_open(path, o, &c, &err);
  ck_assert_msg(rc == NF_OK, "open %s: %s: %s", path, nf_status_name(rc), nf_buf_str(&err));
  ck_assert_ptr_nonnull(c);
  nf_buf_free(&err);
  return c;
}

/* The test's "daemon": its signatures are mk_entry's (signer 0x5a...).
 * The daemon's real judge verifies Ed25519 (client/tool/cache_cmd.c). */
static int judge_5a(void *user, const uint8_t key[32], const uint8_t sha[32],
                    const uint8_t target[32], const nf_cache_sig *sig) {
  (void)user;
  (void)key;
  (void)sha;
  (void)target;
  return sig->signer[0] == 0x5a && sig->signer[1] == 0x5b;
}

static nf_cache *open_default(const char *path) {
  nf_cache_opts o = {0};
  nf_cache *c = open_ok(path, &o);
  nf_cache_set_judge(c, judge_5a, NULL);
  return c;
}

/* nf_cache_open's status, with the message in *msg (caller frees). */
static int open_fails(const char *path, const nf_cache_opts *o, char **msg) {
  nf_cache *c = NULL;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_open(path, o, &c, &err);
  if (rc == NF_OK) nf_cache_close(c);
  ck_assert_ptr_null(rc == NF_OK ? NULL : c);
  *msg = strdup(nf_buf_str(&err));
  nf_buf_free(&err);
  return rc;
}

static int put(nf_cache *c, const nf_cache_entry *e) {
  int stored = -1;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_put(c, e, &stored, &err);
  ck_assert_msg(rc == NF_OK, "put: %s: %s", nf_status_name(rc), nf_buf_str(&err));
  nf_buf_free(&err);
  return stored;
}

/* Puts a fresh entry and frees it; returns stored. */
static int put_new(nf_cache *c, unsigned seed, int tier, double ms, size_t len) {
  nf_cache_entry e;
  mk_entry(&e, seed, tier, ms, CG, len);
  int s = put(c, &e);
  nf_cache_entry_free(&e);
  return s;
}

static void key_of(unsigned seed, uint8_t key[32]) {
  nf_cache_entry e;
  mk_entry(&e, seed, 1, 1, CG, 1);
  memcpy(key, e.key, 32);
  nf_cache_entry_free(&e);
}

static int get_st(nf_cache *c, unsigned seed, nf_cache_entry *out) {
  uint8_t key[32];
  key_of(seed, key);
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_get(c, key, out, &err);
  nf_buf_free(&err);
  return rc;
}

static void assert_same(const nf_cache_entry *a, const nf_cache_entry *b) {
  ck_assert(memcmp(a->key, b->key, 32) == 0);
  ck_assert(memcmp(a->graph_hash, b->graph_hash, 32) == 0);
  ck_assert(memcmp(a->target, b->target, 32) == 0);
  ck_assert_str_eq(a->codegen, b->codegen);
  ck_assert_str_eq(a->graph_name, b->graph_name);
  ck_assert_str_eq(a->target_desc, b->target_desc);
  ck_assert_str_eq(a->schedule, b->schedule);
  ck_assert_int_eq(a->tier, b->tier);
  ck_assert(a->time_ms == b->time_ms);
  ck_assert(a->default_ms == b->default_ms);
  ck_assert_int_eq(a->trials, b->trials);
  ck_assert_uint_eq(a->binary_len, b->binary_len);
  ck_assert(memcmp(a->binary, b->binary, a->binary_len) == 0);
  ck_assert(memcmp(a->sha256, b->sha256, 32) == 0);
}

static nf_cache_stats stats(nf_cache *c) {
  nf_cache_stats s;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cache_stats_get(c, &s, &err);
  ck_assert_msg(rc == NF_OK, "stats: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  return s;
}

/* ---- raw SQLite on the file, as a damaged disk or another tool would ---- */

static void raw_exec(const char *path, const char *sql) {
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  char *msg = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
  sqlite3_close(db);
}

static int64_t raw_i64(const char *path, const char *sql) {
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

/* Runs sql with ?1 bound to the key of seed. */
static void raw_exec_key(const char *path, const char *sql, unsigned seed) {
  uint8_t key[32];
  key_of(seed, key);
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  /* each statement in turn; the last one must change one row */
  while (*sql) {
    ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, &sql), SQLITE_OK);
    if (!st) break;
    if (sqlite3_bind_parameter_count(st)) sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    ck_assert(rc == SQLITE_DONE || rc == SQLITE_ROW);
    sqlite3_finalize(st);
  }
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_close(db);
}

/* Overwrites 3 bytes at offset 20 of seed's binary (ccache's test). */
static void flip_binary(const char *path, unsigned seed) {
  uint8_t key[32];
  key_of(seed, key);
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT binary FROM entries WHERE key=?1", -1, &st, NULL),
                   SQLITE_OK);
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  size_t n = (size_t)sqlite3_column_bytes(st, 0);
  ck_assert_uint_gt(n, 23);
  uint8_t *b = malloc(n);
  memcpy(b, sqlite3_column_blob(st, 0), n);
  sqlite3_finalize(st);
  b[20] ^= 0xDE;
  b[21] ^= 0xAD;
  b[22] ^= 0xBE;
  ck_assert_int_eq(
      sqlite3_prepare_v2(db, "UPDATE entries SET binary=?2 WHERE key=?1", -1, &st, NULL),
      SQLITE_OK);
  sqlite3_bind_blob(st, 1, key, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, b, (int)n, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(st);
  sqlite3_close(db);
  free(b);
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(p, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static long fake_fs_type;
static long fake_statfs(const char *dir) {
  (void)dir;
  if (fake_fs_type == -1) errno = EACCES;
  return fake_fs_type;
}

/* ---- round trip and rules ---- */

START_TEST(cache_roundtrip) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  ck_assert_str_eq(nf_cache_path(c), p);
  nf_cache_entry e, g;
  mk_entry(&e, 1, 2, 1.25, CG, 5000);
  ck_assert_int_eq(put(c, &e), 1);
  ck_assert_int_eq(nf_cache_get(c, e.key, &g, NULL), NF_OK);
  assert_same(&e, &g);
  ck_assert_int_eq(g.hits, 0);
  ck_assert(g.created > 0 && g.last_used >= g.created && g.updated >= g.created);
  nf_cache_entry_free(&g);
  ck_assert_ptr_null(g.binary);
  /* a miss */
  ck_assert_int_eq(get_st(c, 2, &g), NF_ENOENT);
  /* touch */
  ck_assert_int_eq(nf_cache_touch(c, e.key, 3, NULL), NF_OK);
  uint8_t k2[32];
  key_of(2, k2);
  ck_assert_int_eq(nf_cache_touch(c, k2, 1, NULL), NF_ENOENT);
  ck_assert_int_eq(nf_cache_get(c, e.key, &g, NULL), NF_OK);
  ck_assert_int_eq(g.hits, 3);
  nf_cache_entry_free(&g);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.entries, 1);
  ck_assert_int_eq(s.tier2, 1);
  ck_assert_int_eq(s.tier1, 0);
  ck_assert_int_eq(s.binary_bytes, 5000);
  ck_assert_int_eq(s.hits, 2);
  ck_assert_int_eq(s.misses, 1);
  ck_assert_int_eq(s.corrupt, 0);
  ck_assert_int_eq(s.schema, NF_CACHE_SCHEMA);
  ck_assert(s.file_bytes > 0);
  /* keys: deterministic, and each part changes them */
  uint8_t k[32], k3[32];
  nf_cache_make_key(e.graph_hash, e.target, CG, k);
  ck_assert(memcmp(k, e.key, 32) == 0);
  nf_cache_make_key(e.graph_hash, e.target, CG "x", k3);
  ck_assert(memcmp(k, k3, 32) != 0);
  uint8_t t2[32];
  memcpy(t2, e.target, 32);
  t2[31] ^= 1;
  nf_cache_make_key(e.graph_hash, t2, CG, k3);
  ck_assert(memcmp(k, k3, 32) != 0);
  nf_cache_entry_free(&e);
  nf_cache_close(c);
  /* the header marks the file as ours */
  ck_assert_int_eq(raw_i64(p, "PRAGMA application_id"), NF_CACHE_APPLICATION_ID);
  ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), NF_CACHE_SCHEMA);
  rm_dir(d);
}
END_TEST

START_TEST(cache_put_invalid) {
  char *d = tmp_dir();
  nf_cache *c = open_default(in(d, "cache.db"));
  nf_cache_entry e;
  nf_buf err = NF_BUF_INIT;
  int stored = 7;
  mk_entry(&e, 1, 2, 1.0, CG, 100);
  e.sha256[0] ^= 1;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, &err), NF_EINVAL);
  ck_assert_int_eq(stored, 0);
  ck_assert(contains(nf_buf_str(&err), "digest"));
  e.sha256[0] ^= 1;
  e.key[5] ^= 1;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, &err), NF_EINVAL);
  ck_assert(contains(nf_buf_str(&err), "key"));
  e.key[5] ^= 1;
  e.tier = 3;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, NULL), NF_EINVAL);
  e.tier = 2;
  e.time_ms = NAN;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, NULL), NF_EINVAL);
  e.time_ms = -1;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, NULL), NF_EINVAL);
  e.time_ms = 1;
  size_t len = e.binary_len;
  e.binary_len = 0;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, NULL), NF_EINVAL);
  e.binary_len = len;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, NULL), NF_OK);
  ck_assert_int_eq(stored, 1);
  ck_assert_int_eq(stats(c).entries, 1);
  nf_cache_entry_free(&e);
  nf_buf_free(&err);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

START_TEST(cache_better_rule) {
  char *d = tmp_dir();
  nf_cache *c = open_default(in(d, "cache.db"));
  nf_cache_entry g;
  /* tier 1 unmeasured, then measured: the measured one wins */
  ck_assert_int_eq(put_new(c, 1, 1, 0, 100), 1);
  ck_assert_int_eq(put_new(c, 1, 1, 0, 100), 0);
  ck_assert_int_eq(put_new(c, 1, 1, 5.0, 100), 1);
  /* slower and unmeasured lose; faster wins */
  ck_assert_int_eq(put_new(c, 1, 1, 6.0, 100), 0);
  ck_assert_int_eq(put_new(c, 1, 1, 0, 100), 0);
  ck_assert_int_eq(put_new(c, 1, 1, 4.0, 100), 1);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  ck_assert(g.time_ms == 4.0 && g.tier == 1);
  nf_cache_entry_free(&g);
  /* tier 2 beats a faster tier 1; tier 1 never replaces tier 2 */
  ck_assert_int_eq(put_new(c, 1, 2, 10.0, 100), 1);
  ck_assert_int_eq(put_new(c, 1, 1, 1.0, 100), 0);
  ck_assert_int_eq(put_new(c, 1, 2, 11.0, 100), 0);
  ck_assert_int_eq(put_new(c, 1, 2, 9.0, 100), 1);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  ck_assert_int_eq(g.tier, 2);
  ck_assert(g.time_ms == 9.0);
  /* the stored binary is the 9.0 one */
  nf_cache_entry w;
  mk_entry(&w, 1, 2, 9.0, CG, 100);
  assert_same(&g, &w);
  nf_cache_entry_free(&w);
  nf_cache_entry_free(&g);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.entries, 1);
  ck_assert_int_eq(s.tier2, 1);
  /* an unmeasured tier-1 entry that no job tuned (trials 0), then the
   * same kernel as a tuning job's final word (it overran its budget before
   * measuring anything: trials 1): the second replaces the first, so that
   * the key counts as tuned; a third, untuned again, does not */
  nf_cache_entry u;
  uint8_t u_key[32];
  mk_entry(&u, 2, 1, 0, CG, 100);
  memcpy(u_key, u.key, 32);
  int stored = -1;
  u.trials = 0;
  ck_assert_int_eq(nf_cache_put(c, &u, &stored, NULL), NF_OK);
  ck_assert_int_eq(stored, 1);
  u.trials = 1;
  ck_assert_int_eq(nf_cache_put(c, &u, &stored, NULL), NF_OK);
  ck_assert_int_eq(stored, 1);
  u.trials = 0;
  ck_assert_int_eq(nf_cache_put(c, &u, &stored, NULL), NF_OK);
  ck_assert_int_eq(stored, 0);
  nf_cache_entry_free(&u);
  ck_assert_int_eq(get_st(c, 2, &g), NF_OK);
  ck_assert_int_eq(g.trials, 1);
  ck_assert(memcmp(g.key, u_key, 32) == 0);
  nf_cache_entry_free(&g);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* A failure to tune, remembered on the key's tier-1 entry: stored over
 * an entry never tuned, kept against the same failure again, replaced by
 * the failure under a newer check revision and by a measured kernel
 * (which clears it); refused without a revision; read back by get and
 * list; carried by export and import. */
START_TEST(cache_tune_failure) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db"), *x = in(d, "x.db"), *q = in(d, "b.db");
  nf_cache *c = open_default(p);
  nf_cache_entry u, g;
  mk_entry(&u, 3, 1, 0, CG, 100);
  u.trials = 0;
  ck_assert_int_eq(put(c, &u), 1);
  ck_assert_int_eq(get_st(c, 3, &g), NF_OK);
  ck_assert_str_eq(g.tune_error, "");
  ck_assert_int_eq(g.tune_check, 0);
  nf_cache_entry_free(&g);
  /* no revision: refused */
  u.trials = 6;
  u.tune_error = strdup("tune: no candidate of 6 ran correctly; the default: WRONG: output 2");
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_cache_put(c, &u, NULL, &err), NF_EINVAL);
  ck_assert_msg(contains(nf_buf_str(&err), "without its check revision"), "%s", nf_buf_str(&err));
  u.tune_check = 1;
  ck_assert_int_eq(put(c, &u), 1);
  ck_assert_int_eq(put(c, &u), 0); /* the same failure again: nothing new */
  ck_assert_int_eq(get_st(c, 3, &g), NF_OK);
  ck_assert_str_eq(g.tune_error, u.tune_error);
  ck_assert_int_eq(g.tune_check, 1);
  ck_assert_int_eq(g.trials, 6);
  ck_assert_int_eq(g.tier, 1);
  nf_cache_entry_free(&g);
  /* an entry no job tuned does not replace it */
  free(u.tune_error);
  u.tune_error = NULL;
  u.tune_check = 0;
  u.trials = 0;
  ck_assert_int_eq(put(c, &u), 0);
  /* found again under check revision 2: replaces */
  u.trials = 4;
  u.tune_error = strdup("tune: no candidate of 4 ran correctly");
  u.tune_check = 2;
  ck_assert_int_eq(put(c, &u), 1);
  ck_assert_int_eq(get_st(c, 3, &g), NF_OK);
  ck_assert_int_eq(g.tune_check, 2);
  ck_assert_int_eq(g.trials, 4);
  nf_cache_entry_free(&g);
  /* list shows it; export and import carry it */
  nf_cache_close(c);
  c = open_default(p);
  ck_assert_int_eq(nf_cache_export(c, x, NULL, NULL), NF_OK);
  nf_cache *b = open_default(q);
  nf_cache_import_report ir;
  ck_assert_int_eq(nf_cache_import(b, x, &ir, NULL), NF_OK);
  ck_assert_int_eq(ir.added, 1);
  ck_assert_int_eq(get_st(b, 3, &g), NF_OK);
  ck_assert_str_eq(g.tune_error, "tune: no candidate of 4 ran correctly");
  ck_assert_int_eq(g.tune_check, 2);
  nf_cache_entry_free(&g);
  nf_cache_close(b);
  /* a measured kernel replaces it and clears the failure */
  free(u.tune_error);
  u.tune_error = NULL;
  u.tune_check = 0;
  u.time_ms = 3.0;
  u.trials = 9;
  ck_assert_int_eq(put(c, &u), 1);
  ck_assert_int_eq(get_st(c, 3, &g), NF_OK);
  ck_assert_str_eq(g.tune_error, "");
  ck_assert_int_eq(g.tune_check, 0);
  ck_assert(g.time_ms == 3.0);
  nf_cache_entry_free(&g);
  nf_cache_entry_free(&u);
  nf_buf_free(&err);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* A database of schema 1 (no tune_error, tune_check) migrates in place:
 * its entries are kept and read as never failed. */
/* Takes a cache of this schema back to schema 1 (the previous release):
 * no signatures, no adoption list, no tuning failures. */
#define SCHEMA_1                                                                          \
  "DROP TABLE shapes; DROP TABLE signatures; DROP TABLE adopt; "                           \
  "ALTER TABLE entries DROP COLUMN tune_error; "                                            \
  "ALTER TABLE entries DROP COLUMN tune_check; ALTER TABLE quarantine DROP COLUMN "        \
  "tune_error; ALTER TABLE quarantine DROP COLUMN tune_check; PRAGMA user_version=1"

START_TEST(cache_migrate_schema_1) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 0; i < 3; i++) ck_assert_int_eq(put_new(c, i, 1 + i % 2, 2.0 + i, 300), 1);
  nf_cache_close(c);
  /* back to schema 1: the columns of schema 2 dropped */
  raw_exec(p, SCHEMA_1);
  ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM pragma_table_info('entries')"), 17);
  c = open_default(p);
  ck_assert_int_eq(stats(c).schema, NF_CACHE_SCHEMA);
  ck_assert_int_eq(stats(c).entries, 3);
  for (unsigned i = 0; i < 3; i++) {
    nf_cache_entry g, w;
    ck_assert_int_eq(get_st(c, i, &g), NF_OK);
    mk_entry(&w, i, 1 + i % 2, 2.0 + i, CG, 300);
    assert_same(&g, &w);
    ck_assert_str_eq(g.tune_error, "");
    ck_assert_int_eq(g.tune_check, 0);
    nf_cache_entry_free(&g);
    nf_cache_entry_free(&w);
  }
  nf_cache_close(c);
  ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), NF_CACHE_SCHEMA);
  ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM pragma_table_info('entries')"), 19);
  /* the entries it held are listed for the daemon to sign (adoption) */
  ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM adopt"), 3);
  rm_dir(d);
}
END_TEST

static nf_cache_record rec(const char *sched, int status, double ms) {
  nf_cache_record r = {(char *)sched, status, ms, NULL, 0, (char *)(status ? "crash" : ""), 0};
  return r;
}

START_TEST(cache_reopen) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 0; i < 5; i++)
    ck_assert_int_eq(put_new(c, i, 1 + i % 2, 1.0 + i, 1000 + 997 * i), 1);
  uint8_t key[32];
  key_of(3, key);
  uint8_t feat[5] = {1, 2, 3, 4, 5};
  nf_cache_record r[2] = {rec("a", 0, 2.0), rec("b", 0, 1.0)};
  r[0].features = feat;
  r[0].n_features = sizeof feat;
  ck_assert_int_eq(nf_cache_add_records(c, key, r, 2, NULL), NF_OK);
  nf_cache_close(c);
  c = open_default(p);
  for (unsigned i = 0; i < 5; i++) {
    nf_cache_entry e, g;
    mk_entry(&e, i, 1 + i % 2, 1.0 + i, CG, 1000 + 997 * i);
    ck_assert_int_eq(nf_cache_get(c, e.key, &g, NULL), NF_OK);
    assert_same(&e, &g);
    nf_cache_entry_free(&e);
    nf_cache_entry_free(&g);
  }
  nf_cache_record *out;
  size_t n;
  ck_assert_int_eq(nf_cache_get_records(c, key, 0, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(out[0].schedule, "b");
  ck_assert_str_eq(out[1].schedule, "a");
  ck_assert_uint_eq(out[1].n_features, 5);
  ck_assert(memcmp(out[1].features, feat, 5) == 0);
  nf_cache_records_free(out, n);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.entries, 5);
  ck_assert_int_eq(s.records, 2);
  ck_assert_int_eq(s.tier1, 3);
  ck_assert_int_eq(s.tier2, 2);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* Schema 3: shapes.  Similar keys are those of one signature with an
 * entry of the same target and code generator, the asking key excepted;
 * the corpus is every other key's successful records with features,
 * newest first, numbered by key; both survive export and import, and a
 * shape whose entry is gone is never returned (gc drops it). */
START_TEST(cache_shapes_similar_corpus) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 0; i < 5; i++) ck_assert_int_eq(put_new(c, i, 2, 1.0 + i, 100), 1);
  /* one of another code generator: never similar, never in the corpus */
  nf_cache_entry other;
  mk_entry(&other, 9, 2, 1.0, "nf-other-codegen", 100);
  ck_assert_int_eq(put(c, &other), 1);
  uint8_t key[6][32], sig_a[NF_CACHE_SIG], sig_b[NF_CACHE_SIG];
  for (unsigned i = 0; i < 5; i++) key_of(i, key[i]);
  memcpy(key[5], other.key, 32);
  memset(sig_a, 0xa1, sizeof sig_a);
  memset(sig_b, 0xb2, sizeof sig_b);
  float desc[3] = {6, 7, 8};
  nf_buf err = NF_BUF_INIT;
  for (unsigned i = 0; i < 6; i++) {
    desc[0] = (float)i;
    ck_assert_msg(nf_cache_put_shape(c, key[i], i == 4 ? sig_b : sig_a, desc, 3, &err) == NF_OK,
                  "%s", nf_buf_str(&err));
  }
  ck_assert_int_eq(nf_cache_put_shape(c, key[0], sig_a, desc, NF_CACHE_DESC + 1, NULL), NF_EINVAL);
  /* records: two per key, one failed */
  float feat[4] = {1, 2, 3, 4};
  for (unsigned i = 0; i < 6; i++) {
    nf_cache_record r[3] = {rec("a", 0, 2.0 + i), rec("b", 0, 1.0 + i), rec("c", 3, 0)};
    for (int q = 0; q < 3; q++) {
      r[q].features = (uint8_t *)feat;
      r[q].n_features = sizeof feat;
    }
    ck_assert_int_eq(nf_cache_add_records(c, key[i], r, 3, NULL), NF_OK);
  }
  nf_cache_similar *sim;
  size_t n;
  ck_assert_int_eq(nf_cache_find_similar(c, sig_a, other.target, CG, key[1], 0, &sim, &n, &err),
                   NF_OK);
  ck_assert_uint_eq(n, 3); /* 0, 2, 3: not 1 (asking), 4 (other signature), 5 (codegen) */
  int seen[6] = {0};
  for (size_t i = 0; i < n; i++) {
    ck_assert_uint_eq(sim[i].n_desc, 3);
    for (unsigned k = 0; k < 6; k++)
      if (!memcmp(sim[i].key, key[k], 32)) {
        seen[k] = 1;
        ck_assert(sim[i].desc[0] == (float)k && sim[i].desc[2] == 8);
      }
  }
  ck_assert(seen[0] && seen[2] && seen[3] && !seen[1] && !seen[4] && !seen[5]);
  free(sim);
  nf_cache_record *co;
  ck_assert_int_eq(nf_cache_get_corpus(c, other.target, CG, key[0], 0, &co, &n, &err), NF_OK);
  ck_assert_uint_eq(n, 8); /* keys 1..4, two successful records each */
  uint32_t max_group = 0;
  for (size_t i = 0; i < n; i++) {
    ck_assert_ptr_null(co[i].schedule);
    ck_assert_uint_eq(co[i].n_features, sizeof feat);
    ck_assert(co[i].time_ms > 0);
    if (co[i].group > max_group) max_group = co[i].group;
    /* a key's records share a group: the same key's two are neighbours */
    if (i % 2) ck_assert_uint_eq(co[i].group, co[i - 1].group);
  }
  ck_assert_uint_eq(max_group, 3);
  /* newest first: key 4's records came last */
  ck_assert(co[0].time_ms == 1.0 + 4 || co[0].time_ms == 2.0 + 4);
  nf_cache_records_free(co, n);
  ck_assert_int_eq(nf_cache_get_corpus(c, other.target, CG, NULL, 3, &co, &n, &err), NF_OK);
  ck_assert_uint_eq(n, 3);
  nf_cache_records_free(co, n);
  /* export and import carry the shapes */
  const char *x = in(d, "x.db"), *q = in(d, "q.db");
  ck_assert_int_eq(nf_cache_export(c, x, NULL, &err), NF_OK);
  nf_cache *b = open_default(q);
  nf_cache_import_report ir;
  ck_assert_msg(nf_cache_import(b, x, &ir, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(nf_cache_find_similar(b, sig_a, other.target, CG, NULL, 0, &sim, &n, &err),
                   NF_OK);
  ck_assert_uint_eq(n, 4);
  free(sim);
  nf_cache_close(b);
  /* an entry gone: its shape is not found, and gc drops it */
  ck_assert_int_eq(nf_cache_quarantine(c, key[0], "test", NULL), NF_OK);
  ck_assert_int_eq(nf_cache_find_similar(c, sig_a, other.target, CG, NULL, 0, &sim, &n, &err),
                   NF_OK);
  ck_assert_uint_eq(n, 3);
  free(sim);
  nf_cache_gc_report gr;
  ck_assert_int_eq(nf_cache_gc(c, NULL, &gr, &err), NF_OK);
  nf_cache_close(c);
  ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM shapes"), 5);
  /* a read-only handle stores no shape */
  nf_cache_opts ro = {.read_only = 1};
  c = open_ok(p, &ro);
  ck_assert_int_eq(nf_cache_put_shape(c, key[1], sig_a, desc, 3, NULL), NF_EINVAL);
  nf_cache_close(c);
  nf_cache_entry_free(&other);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* A cache of schema 2 (before shapes) migrates: its entries are kept and
 * have no shape until a job stores one. */
START_TEST(cache_migrate_schema_2) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  ck_assert_int_eq(put_new(c, 1, 2, 1.0, 100), 1);
  nf_cache_close(c);
  raw_exec(p, "DROP TABLE shapes; PRAGMA user_version=2");
  c = open_default(p);
  ck_assert_int_eq(stats(c).schema, 3);
  ck_assert_int_eq(stats(c).entries, 1);
  uint8_t key[32], sig[NF_CACHE_SIG] = {1};
  key_of(1, key);
  nf_cache_similar *sim;
  size_t n;
  nf_cache_entry e;
  mk_entry(&e, 1, 2, 1.0, CG, 100);
  ck_assert_int_eq(nf_cache_find_similar(c, sig, e.target, CG, NULL, 0, &sim, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(nf_cache_put_shape(c, key, sig, NULL, 0, NULL), NF_OK);
  ck_assert_int_eq(nf_cache_find_similar(c, sig, e.target, CG, NULL, 0, &sim, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(sim[0].n_desc, 0);
  free(sim);
  nf_cache_entry_free(&e);
  nf_cache_close(c);
  ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), 3);
  rm_dir(d);
}
END_TEST

START_TEST(cache_records) {
  char *d = tmp_dir();
  nf_cache *c = open_default(in(d, "cache.db"));
  uint8_t key[32], other[32];
  key_of(1, key);
  key_of(2, other);
  nf_cache_record r[5] = {rec("s1", 0, 3.0), rec("s2", 2, 0), rec("s3", 0, 1.5), rec("s4", 1, 0),
                          rec("s5", 0, 2.0)};
  ck_assert_int_eq(nf_cache_add_records(c, key, r, 5, NULL), NF_OK);
  ck_assert_int_eq(nf_cache_add_records(c, other, r, 1, NULL), NF_OK);
  /* duplicates: slower ok and failures never replace, faster ok does */
  nf_cache_record dup[4] = {rec("s1", 0, 4.0), rec("s3", 3, 0), rec("s5", 0, 0.5),
                            rec("s2", 0, 2.5)};
  ck_assert_int_eq(nf_cache_add_records(c, key, dup, 4, NULL), NF_OK);
  nf_cache_record *out;
  size_t n;
  ck_assert_int_eq(nf_cache_get_records(c, key, 0, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 5);
  const char *order[5] = {"s5", "s3", "s2", "s1", "s4"};
  const double ms[4] = {0.5, 1.5, 2.5, 3.0};
  for (size_t i = 0; i < n; i++) {
    ck_assert_str_eq(out[i].schedule, order[i]);
    if (i < 4) {
      ck_assert_int_eq(out[i].status, 0);
      ck_assert(out[i].time_ms == ms[i]);
      ck_assert_str_eq(out[i].reason, "");
    }
  }
  ck_assert_int_eq(out[4].status, 1);
  ck_assert_str_eq(out[4].reason, "crash");
  ck_assert_ptr_null(out[4].features);
  nf_cache_records_free(out, n);
  ck_assert_int_eq(nf_cache_get_records(c, key, 2, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(out[1].schedule, "s3");
  nf_cache_records_free(out, n);
  uint8_t none[32] = {0};
  ck_assert_int_eq(nf_cache_get_records(c, none, 0, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 0);
  nf_cache_records_free(out, n);
  /* invalid records are refused whole */
  nf_cache_record bad[2] = {rec("x1", 0, 1.0), rec(NULL, 0, 1.0)};
  ck_assert_int_eq(nf_cache_add_records(c, key, bad, 2, NULL), NF_EINVAL);
  bad[1] = rec("x2", 0, NAN);
  ck_assert_int_eq(nf_cache_add_records(c, key, bad, 2, NULL), NF_EINVAL);
  ck_assert_int_eq(stats(c).records, 6);
  /* the per-key limit: failures go first, then the oldest */
  int64_t saved = nf__cache_max_records;
  nf__cache_max_records = 4;
  nf_cache_record more[1] = {rec("s6", 0, 9.0)};
  ck_assert_int_eq(nf_cache_add_records(c, key, more, 1, NULL), NF_OK);
  nf__cache_max_records = saved;
  ck_assert_int_eq(nf_cache_get_records(c, key, 0, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 4);
  const char *left[4] = {"s5", "s3", "s2", "s6"}; /* s4 (failure) and s1 (oldest) went */
  for (size_t i = 0; i < n; i++) ck_assert_str_eq(out[i].schedule, left[i]);
  nf_cache_records_free(out, n);
  ck_assert_int_eq(nf_cache_get_records(c, other, 0, &out, &n, NULL), NF_OK);
  ck_assert_uint_eq(n, 1);
  nf_cache_records_free(out, n);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* ---- corruption ---- */

START_TEST(cache_corrupt_entry) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 1; i <= 4; i++) ck_assert_int_eq(put_new(c, i, 2, 1.0, 3000), 1);
  nf_cache_entry g;
  /* flipped binary bytes */
  flip_binary(p, 1);
  ck_assert_int_eq(get_st(c, 1, &g), NF_ENOENT);
  ck_assert_ptr_null(g.binary);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.corrupt, 1);
  ck_assert_int_eq(s.quarantined, 1);
  ck_assert_int_eq(s.entries, 3);
  /* quarantined: a plain miss now, and a new put is served */
  ck_assert_int_eq(get_st(c, 1, &g), NF_ENOENT);
  ck_assert_int_eq(stats(c).corrupt, 1);
  ck_assert_int_eq(put_new(c, 1, 2, 1.0, 3000), 1);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(raw_i64(p,
                           "SELECT count(*) FROM quarantine WHERE reason LIKE '%SHA-256%'"
                           " AND length(binary)=3000"),
                   1);
  /* a wrong digest */
  raw_exec_key(p, "UPDATE entries SET sha256 = zeroblob(32) WHERE key = ?1", 2);
  ck_assert_int_eq(get_st(c, 2, &g), NF_ENOENT);
  /* a changed codegen: the key no longer matches its parts */
  raw_exec_key(p, "UPDATE entries SET codegen = 'other' WHERE key = ?1", 3);
  ck_assert_int_eq(get_st(c, 3, &g), NF_ENOENT);
  /* an impossible tier, written around the CHECK constraint */
  raw_exec_key(p, "PRAGMA ignore_check_constraints=1; UPDATE entries SET tier = 7 WHERE key = ?1",
               4);
  s = stats(c);
  ck_assert_int_eq(s.corrupt, 3);
  ck_assert_int_eq(s.quarantined, 3);
  /* a put over a damaged entry quarantines it and stores */
  ck_assert_int_eq(put_new(c, 4, 1, 0, 3000), 1);
  ck_assert_int_eq(get_st(c, 4, &g), NF_OK);
  ck_assert_int_eq(g.tier, 1);
  nf_cache_entry_free(&g);
  s = stats(c);
  ck_assert_int_eq(s.quarantined, 4);
  ck_assert_int_eq(s.entries, 2);
  nf_cache_close(c);

  /* read-only: a miss, nothing moved */
  flip_binary(p, 4);
  nf_cache_opts ro = {.read_only = 1};
  c = open_ok(p, &ro);
  ck_assert_int_eq(get_st(c, 4, &g), NF_ENOENT);
  s = stats(c);
  ck_assert_int_eq(s.corrupt, 1);
  ck_assert_int_eq(s.entries, 2);
  ck_assert_int_eq(s.quarantined, 4);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

START_TEST(cache_garbage_file) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 7 + 3);
  write_file(p, junk, sizeof junk);
  char *msg;
  nf_cache_opts o = {0};
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  ck_assert_msg(
      contains(msg, "not a NeoFlow cache") && contains(msg, "not a database") && contains(msg, p),
      "%s", msg);
  free(msg);
  /* the file is left as it was */
  struct stat sb;
  ck_assert_int_eq(stat(p, &sb), 0);
  ck_assert_int_eq(sb.st_size, sizeof junk);
  write_file(p, "hello\n", 6);
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "not a NeoFlow cache"), "%s", msg);
  free(msg);
  o.read_only = 1;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  free(msg);

  /* a damaged page in a real cache: quick_check refuses it */
  const char *q = in(d, "paged.db");
  nf_cache *c = open_default(q);
  for (unsigned i = 0; i < 40; i++) put_new(c, i, 2, 1.0, 1500);
  nf_cache_close(c);
  int fd = open(q, O_RDWR);
  ck_assert_int_ge(fd, 0);
  char page[4096];
  memset(page, 0x5a, sizeof page);
  ck_assert_int_eq(pwrite(fd, page, sizeof page, 4096 * 2), (ssize_t)sizeof page);
  close(fd);
  o.read_only = 0;
  ck_assert_int_eq(open_fails(q, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "quick_check"), "%s", msg);
  free(msg);
  rm_dir(d);
}
END_TEST

START_TEST(cache_foreign_db) {
  char *d = tmp_dir();
  const char *p = in(d, "other.db");
  raw_exec(p, "PRAGMA application_id=0x12345678; CREATE TABLE t(x); INSERT INTO t VALUES(1)");
  char *msg;
  nf_cache_opts o = {0};
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "not a NeoFlow cache: application_id 0x12345678"), "%s", msg);
  free(msg);
  /* a plain SQLite database (application_id 0) with tables */
  const char *q = in(d, "plain.db");
  raw_exec(q, "CREATE TABLE entries(x)");
  ck_assert_int_eq(open_fails(q, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "not a NeoFlow cache: application_id 0x00000000"), "%s", msg);
  free(msg);
  /* untouched */
  ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM t"), 1);
  ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), 0);
  ck_assert_int_eq(raw_i64(q, "SELECT count(*) FROM sqlite_schema"), 1);
  rm_dir(d);
}
END_TEST

START_TEST(cache_newer_schema) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  put_new(c, 1, 2, 1.0, 100);
  nf_cache_close(c);
  raw_exec(p, "PRAGMA user_version=4");
  char *msg;
  nf_cache_opts o = {0};
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "DB schema 4 > supported 3"), "%s", msg);
  free(msg);
  o.read_only = 1;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EFORMAT);
  ck_assert_msg(contains(msg, "DB schema 4 > supported 3"), "%s", msg);
  free(msg);
  ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), 4);
  rm_dir(d);
}
END_TEST

START_TEST(cache_network_fs) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  char *msg;
  nf_cache_opts o = {0};
  nf__cache_statfs_hook = fake_statfs;
  fake_fs_type = 0x6969;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EUNSUPPORTED);
  ck_assert_msg(contains(msg, "network filesystem") && contains(msg, "NFS"), "%s", msg);
  free(msg);
  fake_fs_type = (long)0xFF534D42u;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EUNSUPPORTED);
  ck_assert_msg(contains(msg, "CIFS"), "%s", msg);
  free(msg);
  fake_fs_type = 0x65735546;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EUNSUPPORTED);
  ck_assert_msg(contains(msg, "FUSE"), "%s", msg);
  free(msg);
  struct stat sb;
  ck_assert_int_ne(stat(p, &sb), 0); /* nothing created */
  fake_fs_type = -1;
  ck_assert_int_eq(open_fails(p, &o, &msg), NF_EIO);
  ck_assert_msg(contains(msg, "Permission denied"), "%s", msg);
  free(msg);
  /* allowed: a rollback journal, not WAL */
  fake_fs_type = 0x6969;
  o.allow_network_fs = 1;
  nf_cache *c = open_ok(p, &o);
  ck_assert_int_eq(put_new(c, 1, 2, 1.0, 100), 1);
  nf_cache_close(c);
  nf__cache_statfs_hook = NULL;
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open(p, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), "delete");
  sqlite3_finalize(st);
  sqlite3_close(db);
  /* a local filesystem (ext4's magic): WAL */
  nf__cache_statfs_hook = fake_statfs;
  fake_fs_type = 0xEF53;
  o.allow_network_fs = 0;
  const char *q = in(d, "local.db");
  c = open_ok(q, &o);
  nf_cache_close(c);
  nf__cache_statfs_hook = NULL;
  ck_assert_int_eq(raw_i64(q, "SELECT count(*) FROM pragma_journal_mode WHERE journal_mode='wal'"),
                   1);
  rm_dir(d);
}
END_TEST

START_TEST(cache_writer_lock) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache_opts w = {.writer_lock = 1};
  char want[128];
  snprintf(want, sizeof want, "is in use by another neoflowd (pid %ld)", (long)getpid());
  /* another process sees the lock (forked first: it inherits no handle;
   * it tries once the pipe says the lock is taken) */
  int go[2];
  ck_assert_int_eq(pipe(go), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char ch;
    close(go[1]);
    if (read(go[0], &ch, 1) != 1) _exit(2);
    nf_cache *c = NULL;
    nf_buf err = NF_BUF_INIT;
    int rc = nf_cache_open(p, &w, &c, &err);
    int ok = rc == NF_EIO && contains(nf_buf_str(&err), want);
    nf_buf_free(&err);
    if (c) nf_cache_close(c);
    _exit(ok ? 0 : 1);
  }
  close(go[0]);
  nf_cache *a = open_ok(p, &w);
  ck_assert_int_eq(write(go[1], "x", 1), 1);
  close(go[1]);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
  char *msg;
  ck_assert_int_eq(open_fails(p, &w, &msg), NF_EIO);
  ck_assert_msg(contains(msg, want) && contains(msg, p), "%s", msg);
  free(msg);
  /* the lock file: 0600, our pid */
  struct stat sb;
  ck_assert_int_eq(stat(in(d, "cache.db.lock"), &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0600);
  /* readers and lock-less writers are fine */
  nf_cache_opts ro = {.read_only = 1}, plain = {0};
  nf_cache *r = open_ok(p, &ro);
  nf_cache *b = open_ok(p, &plain);
  ck_assert_int_eq(put_new(b, 1, 1, 1.0, 10), 1);
  nf_cache_close(b);
  nf_cache_close(r);
  nf_cache_close(a);
  /* released on close */
  a = open_ok(p, &w);
  nf_cache_close(a);
  rm_dir(d);
}
END_TEST

START_TEST(cache_read_only) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  char *msg;
  nf_cache_opts ro = {.read_only = 1};
  ck_assert_int_eq(open_fails(p, &ro, &msg), NF_ENOENT);
  free(msg);
  struct stat sb;
  ck_assert_int_ne(stat(p, &sb), 0);
  nf_cache *c = open_default(p);
  put_new(c, 1, 2, 1.0, 100);
  nf_cache_close(c);
  c = open_ok(p, &ro);
  nf_cache_entry e, g;
  mk_entry(&e, 2, 2, 1.0, CG, 100);
  nf_buf err = NF_BUF_INIT;
  int stored = 5;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, &err), NF_EINVAL);
  ck_assert_int_eq(stored, 0);
  ck_assert_msg(contains(nf_buf_str(&err), "read-only"), "%s", nf_buf_str(&err));
  nf_cache_record r = rec("s", 0, 1.0);
  ck_assert_int_ne(nf_cache_add_records(c, e.key, &r, 1, NULL), NF_OK);
  ck_assert_int_ne(nf_cache_touch(c, e.key, 1, NULL), NF_OK);
  nf_cache_gc_report gr;
  ck_assert_int_ne(nf_cache_gc(c, NULL, &gr, NULL), NF_OK);
  nf_cache_import_report ir;
  ck_assert_int_ne(nf_cache_import(c, p, &ir, NULL), NF_OK);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(stats(c).entries, 1);
  nf_cache_close(c);
  nf_cache_entry_free(&e);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* ---- export, import ---- */

/* Every entry of a equals b's (binaries, times, hits). */
typedef struct cmp_state {
  nf_cache *other;
  int64_t n;
} cmp_state;

static int cmp_one(void *user, const nf_cache_entry *e) {
  cmp_state *s = user;
  nf_cache_entry g;
  ck_assert_int_eq(nf_cache_get(s->other, e->key, &g, NULL), NF_OK);
  ck_assert_int_eq(g.tier, e->tier);
  ck_assert(g.time_ms == e->time_ms);
  ck_assert_uint_eq(g.binary_len, e->binary_len);
  ck_assert(memcmp(g.sha256, e->sha256, 32) == 0);
  ck_assert_int_eq(g.hits, e->hits);
  ck_assert_int_eq(g.created, e->created);
  ck_assert_int_eq(g.last_used, e->last_used);
  ck_assert_str_eq(g.graph_name, e->graph_name);
  nf_cache_entry_free(&g);
  s->n++;
  return 0;
}

START_TEST(cache_export_import) {
  char *d = tmp_dir();
  const char *pa = in(d, "a.db"), *x = in(d, "x.db"), *pb = in(d, "b.db");
  nf_cache *a = open_default(pa);
  for (unsigned i = 0; i < 6; i++)
    ck_assert_int_eq(put_new(a, i, 1 + i % 2, 2.0 + i, 700 + 5000 * i), 1);
  uint8_t key[32];
  key_of(2, key);
  nf_cache_record r[3] = {rec("p", 0, 1.0), rec("q", 4, 0), rec("r", 0, 0.5)};
  ck_assert_int_eq(nf_cache_add_records(a, key, r, 3, NULL), NF_OK);
  key_of(99, key); /* records without an entry travel too */
  ck_assert_int_eq(nf_cache_add_records(a, key, r, 1, NULL), NF_OK);
  ck_assert_int_eq(nf_cache_touch(a, key, 1, NULL), NF_ENOENT);
  key_of(4, key);
  ck_assert_int_eq(nf_cache_touch(a, key, 5, NULL), NF_OK);
  nf_cache_close(a);
  nf_cache_opts ro = {.read_only = 1};
  a = open_ok(pa, &ro);
  int64_t n = -1;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_export(a, x, &n, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(n, 6);
  /* a lone file in rollback-journal mode, ours; no temporary left */
  char tmpname[600];
  snprintf(tmpname, sizeof tmpname, "%s.tmp-%ld", x, (long)getpid());
  struct stat st;
  ck_assert_int_ne(stat(tmpname, &st), 0);
  ck_assert_int_ne(stat(in(d, "x.db-journal"), &st), 0);
  ck_assert_int_eq(raw_i64(x, "PRAGMA application_id"), NF_CACHE_APPLICATION_ID);
  ck_assert_int_eq(
      raw_i64(x, "SELECT count(*) FROM pragma_journal_mode WHERE journal_mode='delete'"), 1);
  /* never over an existing file */
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_export(a, x, &n, &err), NF_EINVAL);
  ck_assert_msg(contains(nf_buf_str(&err), "exists"), "%s", nf_buf_str(&err));
  /* into a fresh cache */
  nf_cache *b = open_default(pb);
  nf_cache_import_report ir;
  nf_buf_reset(&err);
  ck_assert_msg(nf_cache_import(b, x, &ir, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(ir.seen, 6);
  ck_assert_int_eq(ir.added, 6);
  ck_assert_int_eq(ir.replaced + ir.kept + ir.rejected, 0);
  ck_assert_int_eq(ir.records, 4);
  cmp_state cs = {b, 0};
  ck_assert_int_eq(nf_cache_list(a, cmp_one, &cs, NULL), NF_OK);
  ck_assert_int_eq(cs.n, 6);
  nf_cache_stats sa = stats(a), sb = stats(b);
  ck_assert_int_eq(sb.entries, sa.entries);
  ck_assert_int_eq(sb.records, sa.records);
  ck_assert_int_eq(sb.binary_bytes, sa.binary_bytes);
  key_of(2, key);
  nf_cache_record *out;
  size_t nr;
  ck_assert_int_eq(nf_cache_get_records(b, key, 0, &out, &nr, NULL), NF_OK);
  ck_assert_uint_eq(nr, 3);
  ck_assert_str_eq(out[0].schedule, "r");
  ck_assert_str_eq(out[2].reason, "crash");
  nf_cache_records_free(out, nr);
  /* importing again changes nothing */
  ck_assert_int_eq(nf_cache_import(b, x, &ir, NULL), NF_OK);
  ck_assert_int_eq(ir.kept, 6);
  ck_assert_int_eq(stats(b).entries, 6);
  ck_assert_int_eq(stats(b).records, 4);
  nf_cache_close(a);
  nf_cache_close(b);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* Signatures: stored with their entry, found again for the same binary
 * only, gone with an entry replaced unsigned; an unsigned entry from an
 * import never replaces one we have (only new keys come in unsigned, and
 * the daemon never serves those: docs/security.md); a cache from before
 * signatures lists its entries for adoption once. */
START_TEST(cache_signatures) {
  char *d = tmp_dir();
  const char *pa = in(d, "a.db"), *px = in(d, "x.db");
  nf_cache *a = open_default(pa), *x = open_default(px);
  nf_cache_entry e, g;
  mk_entry(&e, 1, 2, 5.0, CG, 100);
  ck_assert_int_eq(put(a, &e), 1);
  ck_assert_int_eq(get_st(a, 1, &g), NF_OK);
  ck_assert(g.has_sig && !memcmp(g.sig.sig, e.sig.sig, 64) && !memcmp(g.sig.signer, e.sig.signer, 32));
  nf_cache_entry_free(&g);
  /* the export's copy, made faster and unsigned (an attacker's edit) */
  nf_cache_entry bad;
  mk_entry(&bad, 1, 2, 0.001, CG, 64);
  bad.has_sig = 0;
  ck_assert_int_eq(put(x, &bad), 1);
  mk_entry(&g, 2, 2, 0.001, CG, 64); /* a key a has not: comes in, unsigned */
  g.has_sig = 0;
  ck_assert_int_eq(put(x, &g), 1);
  nf_cache_entry_free(&g);
  /* signed by someone the judge does not vouch for: as if unsigned */
  nf_cache_entry forged;
  mk_entry(&forged, 3, 2, 0.0001, CG, 64);
  forged.sig.signer[0] = 0x77;
  ck_assert_int_eq(put(x, &forged), 1);
  nf_cache_entry_free(&forged);
  mk_entry(&g, 3, 1, 9.0, CG, 100);
  ck_assert_int_eq(put(a, &g), 1);
  nf_cache_entry_free(&g);
  nf_cache_close(x);
  nf_cache_import_report ir;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_import(a, px, &ir, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(ir.unsigned_, 3);
  ck_assert_int_eq(ir.kept, 2);
  ck_assert_int_eq(ir.added, 1);
  ck_assert_int_eq(get_st(a, 3, &g), NF_OK);
  ck_assert(g.binary_len == 100 && g.tier == 1); /* the forged tier 2 did not replace it */
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 1, &g), NF_OK);
  ck_assert(g.binary_len == 100 && g.has_sig);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 2, &g), NF_OK);
  ck_assert(!g.has_sig);
  nf_cache_entry_free(&g);
  /* a replacement without a signature leaves none behind */
  bad.tier = 2;
  bad.time_ms = 0.0001;
  ck_assert_int_eq(put(a, &bad), 1);
  ck_assert_int_eq(get_st(a, 1, &g), NF_OK);
  ck_assert(!g.has_sig);
  nf_cache_entry_free(&g);
  /* quarantine: the entry is gone */
  ck_assert_int_eq(nf_cache_quarantine(a, e.key, "test", &err), NF_OK);
  ck_assert_int_eq(get_st(a, 1, &g), NF_ENOENT);
  nf_cache_entry_free(&e);
  nf_cache_entry_free(&bad);
  nf_cache_close(a);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

static void sign_ff(void *user, const uint8_t key[32], const uint8_t sha[32],
                    const uint8_t target[32], nf_cache_sig *out) {
  (*(int *)user)++;
  (void)key;
  (void)target;
  memset(out->signer, 0xff, 32);
  memcpy(out->sig, sha, 32);
  memcpy(out->sig + 32, sha, 32);
}

/* Issue 31 item 8: a new cache and its WAL are private (0600) whatever
 * the umask (it was 0644). */
START_TEST(cache_created_private) {
  char *d = tmp_dir();
  const char *p = in(d, "private.db");
  mode_t old = umask(022);
  nf_cache *c = open_default(p);
  put_new(c, 1, 1, 1.0, 10);
  umask(old);
  struct stat st;
  ck_assert_int_eq(stat(p, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  char wal[600];
  snprintf(wal, sizeof wal, "%s-wal", p);
  if (stat(wal, &st) == 0) ck_assert_int_eq(st.st_mode & 0777, 0600);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* Recovering replays SQL read from a damaged, so untrusted, file: only
 * tables, indexes and rows are replayed.  A file whose schema holds a
 * view, a trigger and a table of its own comes back with its entries
 * only; nothing reaches the live cache but checked rows. */
START_TEST(cache_recover_replays_rows_only) {
  if (system("command -v sqlite3 >/dev/null 2>&1") != 0) return; /* setup.sh installs it */
  char *d = tmp_dir();
  const char *src = in(d, "damaged.db"), *live = in(d, "live.db");
  nf_cache *c = open_default(src);
  put_new(c, 1, 2, 1.0, 40);
  put_new(c, 2, 1, 2.0, 40);
  nf_cache_close(c);
  raw_exec(src, "CREATE TABLE evil(x); CREATE VIEW v AS SELECT 1; CREATE TRIGGER t AFTER "
                "INSERT ON records BEGIN INSERT INTO evil VALUES(1); END");
  c = open_default(live);
  nf_cache_import_report ir;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_recover(c, src, &ir, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(ir.seen, 2);
  ck_assert_int_eq(ir.added, 2);
  ck_assert_msg(contains(nf_buf_str(&err), "not replayed"), "%s", nf_buf_str(&err));
  nf_cache_entry g;
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  ck_assert(g.has_sig); /* the judge vouched for its signature */
  nf_cache_entry_free(&g);
  nf_cache_close(c);
  ck_assert_int_eq(raw_i64(live, "SELECT count(*) FROM sqlite_schema WHERE name IN "
                                 "('evil', 'v', 't')"), 0);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* A schema-1 cache's entries are listed for adoption by the migration and
 * signed once; later entries are not. */
START_TEST(cache_adopt_old_entries) {
  char *d = tmp_dir();
  const char *p = in(d, "old.db");
  nf_cache *c = open_default(p);
  put_new(c, 1, 2, 1.0, 50);
  put_new(c, 2, 1, 2.0, 50);
  nf_cache_close(c);
  /* back to schema 1: what a cache of the previous release holds */
  raw_exec(p, SCHEMA_1);
  c = open_default(p); /* migrates */
  put_new(c, 3, 2, 1.0, 50);
  /* entry 1's binary replaced after the migration (an import, say): it is
   * no longer what the daemon served, and is not adopted */
  ck_assert_int_eq(put_new(c, 1, 2, 0.5, 60), 1);
  int calls = 0;
  int64_t n = 0;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_adopt(c, sign_ff, &calls, &n, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(calls, 1);
  nf_cache_entry g;
  ck_assert_int_eq(get_st(c, 2, &g), NF_OK);
  ck_assert(g.has_sig && g.sig.signer[0] == 0xff && !memcmp(g.sig.sig, g.sha256, 32));
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(c, 3, &g), NF_OK);
  ck_assert(g.sig.signer[0] == 0x5a); /* its own, not adopted */
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  ck_assert(g.sig.signer[0] == 0x5a && g.binary_len == 60);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(nf_cache_adopt(c, sign_ff, &calls, &n, &err), NF_OK);
  ck_assert_int_eq(n, 0);
  nf_cache_close(c);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

START_TEST(cache_import_merge) {
  char *d = tmp_dir();
  const char *pa = in(d, "a.db"), *pb = in(d, "b.db"), *x = in(d, "x.db");
  nf_cache *a = open_default(pa), *b = open_default(pb);
  put_new(a, 1, 1, 10.0, 100); /* b's tier 2 replaces it */
  put_new(a, 2, 2, 5.0, 100);  /* b's slower one is kept out */
  put_new(a, 3, 2, 7.0, 100);  /* only in a */
  put_new(b, 1, 2, 8.0, 200);
  put_new(b, 2, 2, 6.0, 200);
  put_new(b, 4, 1, 3.0, 200); /* new */
  put_new(b, 5, 2, 3.0, 200); /* tampered in the file below */
  int64_t n;
  ck_assert_int_eq(nf_cache_export(b, x, &n, NULL), NF_OK);
  ck_assert_int_eq(n, 4);
  flip_binary(x, 5);
  nf_cache_import_report ir;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_import(a, x, &ir, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(ir.seen, 4);
  ck_assert_int_eq(ir.added, 1);
  ck_assert_int_eq(ir.replaced, 1);
  ck_assert_int_eq(ir.kept, 1);
  ck_assert_int_eq(ir.rejected, 1);
  ck_assert_msg(contains(nf_buf_str(&err), "SHA-256"), "%s", nf_buf_str(&err));
  nf_cache_entry g;
  ck_assert_int_eq(get_st(a, 1, &g), NF_OK);
  ck_assert(g.tier == 2 && g.time_ms == 8.0 && g.binary_len == 200);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 2, &g), NF_OK);
  ck_assert(g.time_ms == 5.0 && g.binary_len == 100);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 3, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 4, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(get_st(a, 5, &g), NF_ENOENT);
  ck_assert_int_eq(stats(a).entries, 4);
  /* sources that are not caches, newer ones, itself */
  const char *junk = in(d, "junk.db");
  write_file(junk, "garbage garbage garbage", 23);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_import(a, junk, &ir, &err), NF_EFORMAT);
  ck_assert_msg(contains(nf_buf_str(&err), "not a NeoFlow cache"), "%s", nf_buf_str(&err));
  raw_exec(x, "PRAGMA user_version=9");
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_import(a, x, &ir, &err), NF_EFORMAT);
  ck_assert_msg(contains(nf_buf_str(&err), "DB schema 9 > supported 3"), "%s", nf_buf_str(&err));
  ck_assert_int_eq(nf_cache_import(a, pa, &ir, NULL), NF_EINVAL);
  ck_assert_int_eq(nf_cache_import(a, in(d, "missing.db"), &ir, NULL), NF_ENOENT);
  ck_assert_int_eq(stats(a).entries, 4);
  nf_cache_close(a);
  nf_cache_close(b);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* ---- gc, caps, verify ---- */

START_TEST(cache_gc) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 0; i < 8; i++) put_new(c, i, 2, 1.0, 1000);
  nf_cache_entry e;
  mk_entry(&e, 50, 2, 1.0, "old-codegen", 1000);
  put(c, &e);
  uint8_t key[32];
  key_of(0, key);
  nf_cache_record r[2] = {rec("a", 0, 1.0), rec("b", 0, 2.0)};
  ck_assert_int_eq(nf_cache_add_records(c, key, r, 2, NULL), NF_OK);
  ck_assert_int_eq(nf_cache_add_records(c, e.key, r, 2, NULL), NF_OK);
  /* entries 0 and 1 unused for 10 days, 2..7 used one after another */
  raw_exec(p,
           "UPDATE entries SET last_used = last_used - 864000 WHERE graph_name IN "
           "('graph0', 'graph1')");
  for (unsigned i = 2; i < 8; i++) {
    char sql[128];
    snprintf(sql, sizeof sql,
             "UPDATE entries SET last_used = last_used - %u WHERE graph_name="
             "'graph%u'",
             100 - i, i);
    raw_exec(p, sql);
  }
  nf_cache_gc_opts o = {.older_than_s = 5 * 86400};
  nf_cache_gc_report gr;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cache_gc(c, &o, &gr, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(gr.removed, 2);
  ck_assert_int_eq(gr.freed_bytes, 2000);
  nf_cache_entry g;
  ck_assert_int_eq(get_st(c, 0, &g), NF_ENOENT);
  ck_assert_int_eq(get_st(c, 2, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(stats(c).records, 2); /* entry 0's records went with it */
  /* codegen */
  nf_cache_gc_opts oc = {.keep_codegen = CG};
  ck_assert_int_eq(nf_cache_gc(c, &oc, &gr, NULL), NF_OK);
  ck_assert_int_eq(gr.removed, 1);
  ck_assert_int_eq(nf_cache_get(c, e.key, &g, NULL), NF_ENOENT);
  ck_assert_int_eq(stats(c).records, 0);
  ck_assert_int_eq(stats(c).entries, 6);
  /* size: the least recently used go first (2, 3, ...) */
  nf_cache_gc_opts os = {.max_bytes = 3500};
  ck_assert_int_eq(nf_cache_gc(c, &os, &gr, NULL), NF_OK);
  ck_assert_int_eq(gr.removed, 3);
  ck_assert_int_eq(gr.freed_bytes, 3000);
  ck_assert_int_eq(get_st(c, 4, &g), NF_ENOENT);
  ck_assert_int_eq(get_st(c, 5, &g), NF_OK);
  nf_cache_entry_free(&g);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.entries, 3);
  ck_assert_int_eq(s.binary_bytes, 3000);
  /* the quarantine */
  flip_binary(p, 5);
  ck_assert_int_eq(get_st(c, 5, &g), NF_ENOENT);
  ck_assert_int_eq(stats(c).quarantined, 1);
  nf_cache_gc_opts oq = {.drop_quarantine = 1};
  ck_assert_int_eq(nf_cache_gc(c, &oq, &gr, NULL), NF_OK);
  ck_assert_int_eq(stats(c).quarantined, 0);
  nf_cache_verify_report vr;
  ck_assert_int_eq(nf_cache_verify(c, 1, 0, &vr, NULL), NF_OK);
  ck_assert_int_eq(vr.checked, 2);
  nf_cache_close(c);
  /* checkpointed and vacuumed: no WAL left behind by the last close */
  nf_cache_entry_free(&e);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

START_TEST(cache_caps) {
  char *d = tmp_dir();
  nf_cache_opts o = {.soft_cap_bytes = 1000};
  nf_cache *c = open_ok(in(d, "soft.db"), &o);
  put_new(c, 1, 2, 1.0, 300);
  put_new(c, 2, 2, 1.0, 300);
  put_new(c, 3, 2, 1.0, 300);
  uint8_t k1[32];
  key_of(1, k1);
  raw_exec(in(d, "soft.db"),
           "UPDATE entries SET last_used = last_used - 100 WHERE graph_name='graph2'");
  raw_exec(in(d, "soft.db"),
           "UPDATE entries SET last_used = last_used - 50 WHERE graph_name='graph3'");
  /* 1 is the most recent, 2 the least: a fourth evicts 2 */
  ck_assert_int_eq(put_new(c, 4, 2, 1.0, 300), 1);
  nf_cache_entry g;
  ck_assert_int_eq(get_st(c, 2, &g), NF_ENOENT);
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  nf_cache_entry_free(&g);
  nf_cache_stats s = stats(c);
  ck_assert_int_eq(s.entries, 3);
  ck_assert_int_le(s.binary_bytes, 1000);
  /* a binary over the soft cap is refused, nothing evicted */
  nf_cache_entry big;
  mk_entry(&big, 9, 2, 1.0, CG, 1001);
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_cache_put(c, &big, NULL, &err), NF_ELIMIT);
  ck_assert_int_eq(stats(c).entries, 3);
  nf_cache_entry_free(&big);
  nf_cache_close(c);

  nf_cache_opts h = {.hard_cap_bytes = 1000};
  c = open_ok(in(d, "hard.db"), &h);
  put_new(c, 1, 2, 1.0, 400);
  put_new(c, 2, 2, 1.0, 400);
  nf_cache_entry e;
  mk_entry(&e, 3, 2, 1.0, CG, 400);
  int stored = 9;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, &err), NF_ELIMIT);
  ck_assert_int_eq(stored, 0);
  ck_assert_msg(contains(nf_buf_str(&err), "hard cap"), "%s", nf_buf_str(&err));
  nf_cache_entry_free(&e);
  /* a replacement of the same size fits */
  ck_assert_int_eq(put_new(c, 2, 2, 0.5, 400), 1);
  s = stats(c);
  ck_assert_int_eq(s.entries, 2);
  ck_assert_int_eq(s.binary_bytes, 800);
  nf_cache_close(c);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

START_TEST(cache_verify) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  for (unsigned i = 1; i <= 3; i++) put_new(c, i, 2, 1.0, 2000);
  nf_cache_verify_report vr;
  ck_assert_int_eq(nf_cache_verify(c, 0, 0, &vr, NULL), NF_OK);
  ck_assert_int_eq(vr.checked, 3);
  ck_assert_int_eq(vr.bad, 0);
  ck_assert_int_eq(vr.integrity_ok, 1);
  flip_binary(p, 2);
  uint8_t key[32];
  key_of(2, key);
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  nf_buf err = NF_BUF_INIT;
  /* read-only: reported, not fixed */
  nf_cache_opts ro = {.read_only = 1};
  nf_cache *r = open_ok(p, &ro);
  ck_assert_int_eq(nf_cache_verify(r, 1, 1, &vr, &err), NF_EFORMAT);
  ck_assert_int_eq(vr.bad, 1);
  ck_assert_msg(contains(nf_buf_str(&err), hex) && contains(nf_buf_str(&err), "read-only"), "%s",
                nf_buf_str(&err));
  nf_cache_close(r);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_verify(c, 1, 0, &vr, &err), NF_EFORMAT);
  ck_assert_int_eq(vr.checked, 3);
  ck_assert_int_eq(vr.bad, 1);
  ck_assert_int_eq(vr.integrity_ok, 1);
  ck_assert_msg(contains(nf_buf_str(&err), hex), "%s", nf_buf_str(&err));
  ck_assert_int_eq(stats(c).entries, 3);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cache_verify(c, 0, 1, &vr, &err), NF_EFORMAT);
  ck_assert_int_eq(stats(c).entries, 2);
  ck_assert_int_eq(stats(c).quarantined, 1);
  ck_assert_int_eq(nf_cache_verify(c, 0, 0, &vr, NULL), NF_OK);
  ck_assert_int_eq(vr.checked, 2);
  nf_cache_close(c);
  nf_buf_free(&err);
  rm_dir(d);
}
END_TEST

/* ---- contention and failing writes ---- */

START_TEST(cache_busy) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache_opts o = {.busy_timeout_ms = 100};
  nf_cache *c = open_ok(p, &o);
  put_new(c, 1, 2, 1.0, 100);
  sqlite3 *other;
  ck_assert_int_eq(sqlite3_open(p, &other), SQLITE_OK);
  ck_assert_int_eq(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  nf_cache_entry e, g;
  mk_entry(&e, 2, 2, 1.0, CG, 100);
  nf_buf err = NF_BUF_INIT;
  int stored = 3;
  ck_assert_int_eq(nf_cache_put(c, &e, &stored, &err), NF_EIO);
  ck_assert_int_eq(stored, 0);
  ck_assert_msg(contains(nf_buf_str(&err), "busy"), "%s", nf_buf_str(&err));
  nf_cache_record r = rec("s", 0, 1.0);
  ck_assert_int_eq(nf_cache_add_records(c, e.key, &r, 1, NULL), NF_EIO);
  /* readers go on (WAL) */
  ck_assert_int_eq(get_st(c, 1, &g), NF_OK);
  nf_cache_entry_free(&g);
  ck_assert_int_eq(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(other);
  ck_assert_int_eq(put(c, &e), 1);
  ck_assert_int_eq(stats(c).entries, 2);
  nf_cache_entry_free(&e);
  nf_buf_free(&err);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

START_TEST(cache_write_fails) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  put_new(c, 1, 2, 1.0, 1000);
  nf_cache_close(c);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* files may not grow past 64 KiB: a 1 MiB put fails inside SQLite */
    signal(SIGXFSZ, SIG_IGN);
    nf_cache_opts o = {0};
    nf_cache *cc = NULL;
    if (nf_cache_open(p, &o, &cc, NULL) != NF_OK) _exit(2);
    struct rlimit rl = {65536, 65536};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
    nf_cache_entry e;
    mk_entry(&e, 2, 2, 1.0, CG, 1 << 20);
    nf_buf err = NF_BUF_INIT;
    int stored = 0;
    int rc = nf_cache_put(cc, &e, &stored, &err);
    int ok = rc == NF_EIO && !stored && nf_buf_str(&err)[0];
    /* the handle still serves */
    nf_cache_entry g;
    if (ok && get_st(cc, 1, &g) != NF_OK) ok = 0;
    if (ok) nf_cache_entry_free(&g);
    if (ok && get_st(cc, 2, &g) != NF_ENOENT) ok = 0;
    if (!ok) fprintf(stderr, "write_fails child: rc %d: %s\n", rc, nf_buf_str(&err));
    nf_buf_free(&err);
    nf_cache_entry_free(&e);
    nf_cache_close(cc);
    _exit(ok ? 0 : 1);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  c = open_default(p);
  nf_cache_verify_report vr;
  ck_assert_int_eq(nf_cache_verify(c, 1, 0, &vr, NULL), NF_OK);
  ck_assert_int_eq(vr.checked, 1);
  ck_assert_int_eq(put_new(c, 2, 2, 1.0, 1 << 20), 1);
  nf_cache_close(c);
  rm_dir(d);
}
END_TEST

/* ---- SIGKILL crash loops ---- */

enum { CRASH_ITERS = 4, CRASH_HOT = 1000, CRASH_STEPS = 9 };
static int crash_at, crash_count;
static const char *crash_prefix;

static void crash_hook(const char *step) {
  if (strncmp(step, crash_prefix, strlen(crash_prefix)) != 0) return;
  if (crash_count++ == crash_at) raise(SIGKILL);
}

static size_t crash_len(unsigned i) { return 3000 + 7000 * i; }

/* Each iteration i: put key i, put the hot key (time 100 - i, always
 * better), add 3 records for key i: 9 hook calls ("put:" and "records:"). */
static void crash_child(const char *path, int at) {
  nf_cache_opts o = {.writer_lock = 1};
  nf_cache *c = NULL;
  if (nf_cache_open(path, &o, &c, NULL) != NF_OK) _exit(3);
  /* count the put and records steps only (the open is done) */
  crash_prefix = "";
  crash_at = at;
  crash_count = 0;
  nf__cache_test_hook = crash_hook;
  for (unsigned i = 0; i < CRASH_ITERS; i++) {
    nf_cache_entry e;
    int stored = 0;
    mk_entry(&e, i, 2, 10.0, CG, crash_len(i));
    if (nf_cache_put(c, &e, &stored, NULL) != NF_OK || !stored) _exit(4);
    nf_cache_entry_free(&e);
    mk_entry(&e, CRASH_HOT, 2, 100.0 - i, CG, 5000 + i);
    if (nf_cache_put(c, &e, &stored, NULL) != NF_OK || !stored) _exit(5);
    nf_cache_record r[3] = {rec("a", 0, 1.0 + i), rec("b", 1, 0), rec("c", 0, 0.5)};
    uint8_t key[32];
    key_of(i, key);
    if (nf_cache_add_records(c, key, r, 3, NULL) != NF_OK) _exit(7);
    nf_cache_entry_free(&e);
  }
  nf_cache_close(c);
  _exit(0);
}

/* The expected state after a kill at hook call j, then every check. */
static void crash_check(const char *path, int j) {
  int k = j / CRASH_STEPS, phase = j % CRASH_STEPS;
  nf_cache_opts o = {.writer_lock = 1};
  nf_cache *c = open_ok(path, &o);
  nf_buf err = NF_BUF_INIT;
  nf_cache_verify_report vr;
  ck_assert_msg(nf_cache_verify(c, 1, 0, &vr, &err) == NF_OK, "j=%d: %s", j, nf_buf_str(&err));
  int n_keys = k + (phase >= 3);
  int hot = phase >= 6 ? k : k - 1; /* the last committed hot put */
  nf_cache_stats s = stats(c);
  ck_assert_msg(s.entries == n_keys + (hot >= 0), "j=%d: %lld entries", j, (long long)s.entries);
  ck_assert_int_eq(s.records, 3 * k);
  ck_assert_int_eq(s.quarantined, 0);
  for (int i = 0; i < CRASH_ITERS; i++) {
    nf_cache_entry g;
    int rc = get_st(c, (unsigned)i, &g);
    if (i < n_keys) {
      ck_assert_msg(rc == NF_OK, "j=%d: key %d missing", j, i);
      ck_assert_uint_eq(g.binary_len, crash_len((unsigned)i));
      nf_cache_entry_free(&g);
    } else {
      ck_assert_msg(rc == NF_ENOENT, "j=%d: key %d present", j, i);
    }
    uint8_t key[32];
    key_of((unsigned)i, key);
    nf_cache_record *out;
    size_t n;
    ck_assert_int_eq(nf_cache_get_records(c, key, 0, &out, &n, NULL), NF_OK);
    ck_assert_uint_eq(n, i < k ? 3 : 0);
    nf_cache_records_free(out, n);
  }
  nf_cache_entry g;
  int rc = get_st(c, CRASH_HOT, &g);
  if (hot >= 0) {
    ck_assert_int_eq(rc, NF_OK);
    ck_assert_msg(g.time_ms == 100.0 - hot, "j=%d: hot %g", j, g.time_ms);
    ck_assert_uint_eq(g.binary_len, 5000 + (unsigned)hot);
    nf_cache_entry_free(&g);
  } else {
    ck_assert_int_eq(rc, NF_ENOENT);
  }
  ck_assert_int_eq(stats(c).corrupt, 0);
  /* and it takes writes again */
  ck_assert_int_eq(put_new(c, 77, 2, 1.0, 100), 1);
  nf_cache_close(c);
  nf_buf_free(&err);
}

static void run_killed(const char *path, int at, void (*child)(const char *, int)) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) child(path, at);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                "child for step %d was not killed (status 0x%x)", at, status);
}

START_TEST(cache_crash_loop) {
  char *d = tmp_dir();
  /* every step of iterations 0, 1 and 3 */
  static const int ks[] = {0, 1, 3};
  int runs = 0;
  for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++)
    for (int phase = 0; phase < CRASH_STEPS; phase++) {
      int j = ks[t] * CRASH_STEPS + phase;
      char name[32];
      snprintf(name, sizeof name, "crash%d.db", j);
      const char *p = in(d, name);
      run_killed(p, j, crash_child);
      crash_check(p, j);
      runs++;
    }
  ck_assert_int_eq(runs, 27);
  rm_dir(d);
}
END_TEST

static void migrate_child(const char *path, int at) {
  static const char *const steps[] = {"migrate:begin", "migrate:step", "migrate:commit"};
  crash_prefix = steps[at];
  crash_at = 0;
  crash_count = 0;
  nf__cache_test_hook = crash_hook;
  nf_cache_opts o = {.writer_lock = 1};
  nf_cache *c = NULL;
  nf_cache_open(path, &o, &c, NULL);
  _exit(0);
}

START_TEST(cache_crash_migration) {
  char *d = tmp_dir();
  for (int at = 0; at < 3; at++) {
    char name[32];
    snprintf(name, sizeof name, "m%d.db", at);
    const char *p = in(d, name);
    run_killed(p, at, migrate_child);
    /* the old (empty) schema is intact */
    ck_assert_int_eq(raw_i64(p, "PRAGMA user_version"), 0);
    ck_assert_int_eq(raw_i64(p, "PRAGMA application_id"), 0);
    ck_assert_int_eq(raw_i64(p, "SELECT count(*) FROM sqlite_schema"), 0);
    /* and migrates next time */
    nf_cache *c = open_default(p);
    ck_assert_int_eq(stats(c).schema, NF_CACHE_SCHEMA);
    ck_assert_int_eq(put_new(c, 1, 2, 1.0, 100), 1);
    nf_cache_close(c);
    c = open_default(p);
    ck_assert_int_eq(stats(c).entries, 1);
    nf_cache_close(c);
  }
  rm_dir(d);
}
END_TEST

/* ---- the command ---- */

/* Runs `neoflow cache ARGS...` in a child; returns the exit status and
 * the output in out/err (static buffers). */
static char cli_out[65536], cli_err[65536];

static int cli(const char *dir, ...) {
  char *argv[32];
  int argc = 0;
  va_list ap;
  va_start(ap, dir);
  argv[argc++] = (char *)"cache";
  const char *a;
  while ((a = va_arg(ap, const char *)) && argc < 31) argv[argc++] = (char *)a;
  va_end(ap);
  argv[argc] = NULL;
  char o[512], e[512];
  snprintf(o, sizeof o, "%s/cli.out", dir);
  snprintf(e, sizeof e, "%s/cli.err", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (!freopen(o, "w", stdout) || !freopen(e, "w", stderr)) _exit(99);
    int st = nf__cli_cache(argc, argv);
    fflush(stdout);
    fflush(stderr);
    _exit(st);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status));
  char *bufs[2] = {cli_out, cli_err};
  const char *names[2] = {o, e};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(names[i], "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(bufs[i], 1, sizeof cli_out - 1, f);
    bufs[i][n] = '\0';
    fclose(f);
    unlink(names[i]);
  }
  return WEXITSTATUS(status);
}

START_TEST(cache_cli) {
  char *d = tmp_dir();
  const char *p = in(d, "cache.db");
  nf_cache *c = open_default(p);
  put_new(c, 1, 2, 0.5, 2048);
  put_new(c, 2, 1, 0, 100);
  nf_cache_entry f;
  mk_entry(&f, 2, 1, 0, CG, 100);
  f.tune_error = strdup("tune: no candidate of 7 ran correctly");
  f.tune_check = 1;
  ck_assert_int_eq(put(c, &f), 1);
  nf_cache_entry_free(&f);
  nf_cache_close(c);

  ck_assert_int_eq(cli(d, "--help", NULL), 0);
  ck_assert(contains(cli_out, "usage: neoflow cache"));
  ck_assert_int_eq(cli(d, "frob", NULL), 2);
  ck_assert(contains(cli_err, "neoflow cache: unknown command 'frob'"));
  ck_assert_int_eq(cli(d, "stats", "--cache", p, "--bogus", NULL), 2);
  ck_assert_int_eq(cli(d, "export", "--cache", p, NULL), 2);
  ck_assert_int_eq(cli(d, "gc", "--cache", p, "--max-mb", "-3", NULL), 2);
  ck_assert_int_eq(cli(d, "stats", "--cache", p, "--fix", NULL), 2);

  ck_assert_int_eq(cli(d, "stats", "--cache", p, NULL), 0);
  ck_assert_msg(contains(cli_out, "entries:      2 (tier 1: 1, tier 2: 1)"), "%s", cli_out);
  ck_assert_int_eq(cli(d, "stats", "--json", "--cache=", NULL), 2);
  setenv("NEOFLOW_CACHE", p, 1);
  ck_assert_int_eq(cli(d, "stats", "--json", NULL), 0);
  unsetenv("NEOFLOW_CACHE");
  ck_assert_msg(contains(cli_out, "\"entries\":2,\"tier1\":1,\"tier2\":1") &&
                    contains(cli_out, "\"binary_bytes\":2148"),
                "%s", cli_out);

  ck_assert_int_eq(cli(d, "list", "--cache", p, NULL), 0);
  uint8_t key[32];
  key_of(1, key);
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  ck_assert_msg(contains(cli_out, "KEY") && contains(cli_out, hex) && contains(cli_out, "20.00x") &&
                    contains(cli_out, "2.0 KiB") && contains(cli_out, "graph1") &&
                    contains(cli_out, CG) &&
                    contains(cli_out,
                             "not tuned (check r1, 7 trials): tune: no candidate of 7 ran correctly"),
                "%s", cli_out);
  ck_assert_int_eq(cli(d, "list", "--json", "--cache", p, NULL), 0);
  ck_assert_msg(contains(cli_out, "\"speedup\":20,") && contains(cli_out, "\"speedup\":null") &&
                    contains(cli_out, "\"tune_error\":\"tune: no candidate of 7 ran correctly\","
                                      "\"tune_check\":1}") &&
                    contains(cli_out, "\"tune_error\":null}"),
                "%s", cli_out);

  ck_assert_int_eq(cli(d, "verify", "--cache", p, NULL), 0);
  ck_assert(contains(cli_out, "2 entries checked, 0 bad"));
  flip_binary(p, 2);
  ck_assert_int_eq(cli(d, "verify", "--cache", p, NULL), 1);
  ck_assert_msg(contains(cli_out, "1 bad") && contains(cli_err, "neoflow cache: verify: "), "%s",
                cli_err);
  ck_assert_int_eq(cli(d, "verify", "--fix", "--cache", p, NULL), 1);
  ck_assert_int_eq(cli(d, "verify", "--full", "--cache", p, NULL), 0);

  const char *x = in(d, "x.db");
  ck_assert_int_eq(cli(d, "export", x, "--cache", p, NULL), 0);
  ck_assert_msg(contains(cli_out, "exported 1 entries"), "%s", cli_out);
  ck_assert_int_eq(cli(d, "export", x, "--cache", p, NULL), 1);
  ck_assert_msg(contains(cli_err, "neoflow cache: export: ") && contains(cli_err, "exists"), "%s",
                cli_err);
  const char *q = in(d, "sub/dir/new.db");
  ck_assert_int_eq(cli(d, "import", x, "--cache", q, NULL), 0);
  ck_assert_msg(contains(cli_out, "1 added"), "%s", cli_out);
  /* the writing commands take the daemon's writer lock: refused, naming
   * the holder, while a writer (a neoflowd) holds it; reads go on */
  {
    nf_cache_opts wo = {.writer_lock = 1};
    nf_cache *held = NULL;
    ck_assert_int_eq(nf_cache_open(q, &wo, &held, NULL), NF_OK);
    char pid[64];
    snprintf(pid, sizeof pid, "in use by another neoflowd (pid %ld)", (long)getpid());
    ck_assert_int_eq(cli(d, "gc", "--cache", q, "--keep-codegen", "other", NULL), 1);
    ck_assert_msg(contains(cli_err, "neoflow cache: gc: ") && contains(cli_err, pid) &&
                      contains(cli_err, "stop that neoflowd first"),
                  "%s", cli_err);
    ck_assert_int_eq(cli(d, "import", x, "--cache", q, NULL), 1);
    ck_assert_msg(contains(cli_err, pid), "%s", cli_err);
    ck_assert_int_eq(cli(d, "stats", "--cache", q, NULL), 0);
    nf_cache_close(held);
  }
  ck_assert_int_eq(cli(d, "gc", "--cache", q, "--keep-codegen", "other", NULL), 0);
  ck_assert_msg(contains(cli_out, "removed 1 entries"), "%s", cli_out);

  ck_assert_int_eq(cli(d, "stats", "--cache", in(d, "missing.db"), NULL), 1);
  ck_assert_msg(
      contains(cli_err, "neoflow cache: stats: cache ") && contains(cli_err, "No such file"), "%s",
      cli_err);
  write_file(in(d, "junk.db"), "junk junk junk", 14);
  ck_assert_int_eq(cli(d, "list", "--cache", in(d, "junk.db"), NULL), 1);
  ck_assert_msg(contains(cli_err, "not a NeoFlow cache"), "%s", cli_err);
  rm_dir(d);
}
END_TEST

int main(void) {
  if (sodium_init() < 0) return 1;
  Suite *s = suite_create("cache");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, cache_roundtrip);
  tcase_add_test(tc, cache_put_invalid);
  tcase_add_test(tc, cache_better_rule);
  tcase_add_test(tc, cache_reopen);
  tcase_add_test(tc, cache_records);
  tcase_add_test(tc, cache_corrupt_entry);
  tcase_add_test(tc, cache_garbage_file);
  tcase_add_test(tc, cache_foreign_db);
  tcase_add_test(tc, cache_newer_schema);
  tcase_add_test(tc, cache_tune_failure);
  tcase_add_test(tc, cache_migrate_schema_1);
  tcase_add_test(tc, cache_migrate_schema_2);
  tcase_add_test(tc, cache_shapes_similar_corpus);
  tcase_add_test(tc, cache_network_fs);
  tcase_add_test(tc, cache_writer_lock);
  tcase_add_test(tc, cache_read_only);
  tcase_add_test(tc, cache_export_import);
  tcase_add_test(tc, cache_import_merge);
  tcase_add_test(tc, cache_signatures);
  tcase_add_test(tc, cache_created_private);
  tcase_add_test(tc, cache_recover_replays_rows_only);
  tcase_add_test(tc, cache_adopt_old_entries);
  tcase_add_test(tc, cache_gc);
  tcase_add_test(tc, cache_caps);
  tcase_add_test(tc, cache_verify);
  tcase_add_test(tc, cache_busy);
  tcase_add_test(tc, cache_write_fails);
  tcase_add_test(tc, cache_crash_loop);
  tcase_add_test(tc, cache_crash_migration);
  tcase_add_test(tc, cache_cli);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
