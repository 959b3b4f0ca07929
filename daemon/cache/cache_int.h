/* cache_int.h - what the files of daemon/cache share and nobody else
 * sees: the handle's layout, the entry-row checks, the "better" rule, the
 * SQLite error mapping, transactions, migrations and quarantine.
 *
 * cache.c holds opening, migrations, lookups, puts and records;
 * cache_io.c holds statistics, listing, verify, export, import and gc on
 * top of these. */
#ifndef NF_CACHE_INT_H
#define NF_CACHE_INT_H

#include <sqlite3.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_cache.h"

/* A kernel binary larger than this is impossible (and refused). */
#define NF__CACHE_MAX_BINARY ((int64_t)256 << 20)

struct nf_cache {
  sqlite3 *db;
  char *path;
  int read_only;
  int busy_ms;
  int64_t soft_cap, hard_cap;
  int lock_fd; /* -1 when no writer lock is held */
  int64_t hits, misses, corrupt;
  nf_cache_sig_judge judge; /* which imported signatures are kept (none when NULL) */
  void *judge_user;
};

/* The entry columns in the order every SELECT of a full row uses, and
 * their number. */
#define NF__CACHE_ENTRY_COLS                                                    \
  "key, graph_hash, target, codegen, graph_name, target_desc, tier, schedule, " \
  "time_ms, default_ms, trials, binary, sha256, created, updated, last_used, hits, " \
  "tune_error, tune_check"
#define NF__CACHE_ENTRY_NCOLS 19
#define NF__CACHE_ENTRY_PARAMS \
  "?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19"

/* Calls nf__cache_test_hook when set. */
void nf__cache_hook(const char *step);
/* Unix seconds now. */
int64_t nf__cache_now(void);

/* Maps a SQLite result code to a status (NOMEM -> NF_ENOMEM, everything
 * else NF_EIO) and appends "cache PATH: WHAT: <sqlite's message>" to err
 * (may be NULL); SQLITE_BUSY/LOCKED say "busy".  Call it before anything
 * else touches db (a rollback would replace the message). */
int nf__cache_sqlerr(const char *path, sqlite3 *db, int rc, const char *what, nf_buf *err);
/* Appends "cache PATH: " and the formatted message to err; returns rc. */
int nf__cache_fail(nf_buf *err, int rc, const char *path, const char *fmt, ...) NF_PRINTF(4, 5);
/* Runs sql (no rows expected) with the mapping above. */
int nf__cache_exec(sqlite3 *db, const char *path, const char *sql, nf_buf *err);
/* BEGIN IMMEDIATE (waits up to the busy timeout for other writers). */
int nf__cache_begin(sqlite3 *db, const char *path, nf_buf *err);
int nf__cache_commit(sqlite3 *db, const char *path, nf_buf *err);
/* Rolls back when a transaction is open; keeps nothing of it. */
void nf__cache_rollback(sqlite3 *db);

/* Opens a SQLite connection with the hardening every cache connection
 * gets (extended codes, DEFENSIVE, trusted_schema=OFF, busy timeout);
 * `imported` adds cell_size_check=ON and mmap_size=0.  flags are
 * sqlite3_open_v2's. */
int nf__cache_open_db(const char *name, const char *path, int flags, int imported, int busy_ms,
                      sqlite3 **out, nf_buf *err);
/* Reads application_id, user_version and the number of schema objects:
 * *schema = user_version of a NeoFlow cache, 0 for a fresh empty file.
 * NF_EFORMAT for a foreign or newer database or a file that is not one. */
int nf__cache_check_header(sqlite3 *db, const char *path, int *schema, nf_buf *err);
/* PRAGMA quick_check (or integrity_check when full); *ok = 1 when "ok";
 * the first problems are appended to err when not. */
int nf__cache_check_integrity(sqlite3 *db, const char *path, int full, int *ok, nf_buf *err);
/* Brings db to NF_CACHE_SCHEMA: one BEGIN IMMEDIATE transaction running
 * the migrations from its user_version (0 = fresh) up, then setting
 * application_id and user_version. */
int nf__cache_migrate(sqlite3 *db, const char *path, nf_buf *err);

/* Checks the full entry row at column 0 of st (NF__CACHE_ENTRY_COLS):
 * types, sizes, tier, key = nf_cache_make_key(parts), key = want (when
 * non-NULL), and the binary's digest.  NULL when sound, else the reason
 * (a static string). */
const char *nf__cache_check_row(sqlite3_stmt *st, const uint8_t *want);
/* Copies a row nf__cache_check_row accepted into e (malloc'd strings
 * and binary).  NF_OK or NF_ENOMEM (e freed). */
int nf__cache_fill_entry(sqlite3_stmt *st, nf_cache_entry *e);
/* Checks an entry given by a caller (put): tier, sizes, times, strings,
 * key = its parts, digest.  NULL when acceptable, else the reason. */
const char *nf__cache_check_entry(const nf_cache_entry *e);

/* Whether an entry of (tier, time_ms, trials, tune_check) should replace
 * one of (old_tier, old_ms, old_trials, old_check): a higher tier wins,
 * then a lower measured time; an unmeasured entry replaces only an
 * unmeasured one that no tuning job ended with (trials > 0 against 0), or
 * as a failure to tune (check > 0) one whose failure was under another
 * check revision (or that was no failure). */
int nf__cache_better(int tier, double time_ms, int64_t trials, int64_t check, int old_tier,
                     double old_ms, int64_t old_trials, int64_t old_check);

/* Moves the entry at rowid (or, when rowid <= 0, the one of key) into
 * the quarantine table with reason, inside the open transaction. */
int nf__cache_quarantine_tx(nf_cache *c, const uint8_t *key, int64_t rowid, const char *reason,
                            nf_buf *err);

/* Evicts least recently used entries (and their records), never keep
 * (may be NULL), inside the open transaction, until the binaries total
 * at most limit or nothing else is left; *total (the current sum) is
 * updated and *n_removed (may be NULL) increased. */
int nf__cache_evict(nf_cache *c, const uint8_t *keep, int64_t limit, int64_t *total,
                    int64_t *n_removed, nf_buf *err);

/* What nf__cache_put_tx did. */
enum { NF__CACHE_KEPT = 0, NF__CACHE_ADDED = 1, NF__CACHE_REPLACED = 2 };
/* Stores a checked entry inside the open transaction when it is better
 * than the key's current one (a current entry that does not verify is
 * quarantined first), applying the soft and hard caps.  times: created,
 * updated, last_used, hits to store (a replacement keeps the older
 * created, the later last_used and adds the hits).  *what gets one of the
 * NF__CACHE_* values. */
int nf__cache_put_tx(nf_cache *c, const nf_cache_entry *e, const int64_t times[4], int *what,
                     nf_buf *err);

/* The signature stored for (key, sha): *found 1 with *out, else 0. */
int nf__cache_sig_get(sqlite3 *db, const char *path, const uint8_t key[32],
                      const uint8_t sha[32], nf_cache_sig *out, int *found, nf_buf *err);

/* Prepares the record upsert (duplicates of a schedule keep the faster
 * ok one) for nf__cache_put_record. */
int nf__cache_prepare_record(sqlite3 *db, const char *path, sqlite3_stmt **st, nf_buf *err);
/* Binds and runs the upsert for one record of key. */
int nf__cache_put_record(sqlite3 *db, const char *path, sqlite3_stmt *st, const uint8_t *key,
                         const char *schedule, int status, double time_ms, const void *features,
                         size_t n_features, const char *reason, int64_t at, nf_buf *err);
/* Deletes the records of key beyond the per-key limit
 * (nf__cache_max_records), failures and oldest first. */
int nf__cache_trim_records(sqlite3 *db, const char *path, const uint8_t *key, nf_buf *err);

/* Runs a statement returning one integer (pragmas, counts); 0 when it
 * returns no row. */
int nf__cache_query_i64(sqlite3 *db, const char *path, const char *sql, int64_t *v, nf_buf *err);
/* Prepares sql; the error message says what failed. */
int nf__cache_prepare(sqlite3 *db, const char *path, const char *sql, sqlite3_stmt **st,
                      nf_buf *err);
/* Column c of st is a blob of exactly n bytes (n < 0: any non-empty size
 * up to the binary limit), else NULL. */
const uint8_t *nf__cache_col_blob(sqlite3_stmt *st, int c, int n);
/* Column c of st is text without an embedded NUL (else NULL). */
const char *nf__cache_col_text(sqlite3_stmt *st, int c);

/* Copies src's shapes (schema 3) into dst, keeping the shapes dst has;
 * damaged rows are skipped (cache_shape.c). */
int nf__cache_copy_shapes(sqlite3 *src, const char *spath, sqlite3 *dst, const char *dpath,
                          nf_buf *err);

/* Lowercase hex of the first n bytes of p into out (2n+1 bytes). */
void nf__cache_hex(const uint8_t *p, size_t n, char *out);

#endif
