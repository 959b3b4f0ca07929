/* nf_cache.h - the tuning cache: one SQLite database that maps a cache
 * key to the best kernel known for it, and keeps every measured record.
 *
 * Key: SHA-256 over a versioned concatenation of the subgraph's canonical
 * hash (nf_graph_hash), the target fingerprint (32 bytes, common/target.c)
 * and the code generator's version string (nf_cache_make_key).  Equal keys
 * mean "the same computation, for the same machine, by the same compiler".
 *
 * Entry: the key's parts, the graph's name and the target's description
 * (for people), the tier (1 default schedule, 2 tuned), the schedule text,
 * the measured time and the default's, the kernel binary and its SHA-256,
 * and when tuning found no correct candidate, why (tune_error) and under
 * which revision of the search's correctness check (tune_check): the
 * key is not tuned again until the key (code generator, LLVM, CPU) or the
 * check changes.  A tier-1 entry counts as tuned when trials > 0.
 * Records: every measured candidate (schedule, status, time, features),
 * for warm-starting a later search.
 *
 * Durability and safety:
 *  - WAL mode, synchronous=NORMAL (FULL with opts.sync_full), busy_timeout,
 *    writes in BEGIN IMMEDIATE transactions: a process killed at any
 *    moment leaves each entry absent or complete;
 *  - application_id identifies a NeoFlow cache; user_version is the schema
 *    version: a newer one is refused, an older one migrated in one
 *    transaction; a foreign database is refused;
 *  - hardening: SQLITE_DBCONFIG_DEFENSIVE, trusted_schema=OFF,
 *    cell_size_check=ON and mmap off for imported files;
 *  - a database on a network filesystem (NFS, SMB/CIFS, FUSE, ...) is
 *    refused unless opts.allow_network_fs;
 *  - the writer (the daemon) holds an exclusive lock on "<db>.lock"
 *    (flock) holding its pid: a second writer fails with "cache PATH is in
 *    use by another neoflowd (pid N)";
 *  - a corrupt entry (digest mismatch, impossible sizes, missing fields,
 *    a key that is not nf_cache_make_key of its parts, SQLITE_CORRUPT on
 *    its row) is a miss: it is moved to the quarantine table (never
 *    served again) and counted.
 *
 * Messages are appended to the caller's err (which may be NULL) and
 * start with "cache PATH: " (a busy database says "busy").
 *
 * Not thread-safe: one nf_cache per thread. */
#ifndef NF_CACHE_H
#define NF_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"

#define NF_CACHE_APPLICATION_ID 0x4e46434b /* "NFCK" */
#define NF_CACHE_SCHEMA 3 /* 2: signatures; entries.tune_error, tune_check;
                             3: shapes (each key's structural signature) */

typedef struct nf_cache nf_cache;

typedef struct nf_cache_opts {
  int read_only;         /* open without writing (tools' stats/list/export/verify) */
  int writer_lock;       /* take "<db>.lock" (the daemon; the tool's writing
                            commands, so they never write beside a daemon) */
  int allow_network_fs;  /* accept NFS/SMB/FUSE (rollback journal then) */
  int sync_full;         /* synchronous=FULL instead of NORMAL */
  int busy_timeout_ms;   /* 0: 5000 */
  int64_t soft_cap_bytes; /* 0: none; above it nf_cache_put evicts least
                             recently used entries */
  int64_t hard_cap_bytes; /* 0: none; a put that would exceed it fails
                             with NF_ELIMIT */
  int *damaged;           /* may be NULL: set to 1 when the open failed
                             because the file is damaged (quick_check
                             failed, a corrupt header, not a database at
                             all), 0 otherwise (a foreign or newer cache
                             is not damaged: it is refused, never moved) */
  long *lock_holder;      /* may be NULL: set to the pid in the lock file
                             when writer_lock failed because another
                             process holds it (-1: pid unknown), else 0 */
} nf_cache_opts;

/* Moves a damaged cache aside: path (and its -wal, -shm, -journal files)
 * renamed to "<path>.damaged-YYYYMMDD-HHMMSS" (UTC; a suffix .N when that
 * exists), the directory fsynced (the .lock file stays: it guards the
 * path, not the file).  The new name goes to moved (n bytes).
 * Nothing is deleted.  NF_OK, NF_EIO. */
int nf_cache_move_aside(const char *path, char *moved, size_t n, nf_buf *err);
/* Recovers what can be read from the damaged cache file at src (SQLite's
 * own recovery: the sqlite3 program's .recover, run as a child process
 * over a copy) into c, through nf_cache_import: every entry is checked
 * again (digest, key, sizes), signatures come along as data (a daemon
 * serves only what its own key signed).  *r as for nf_cache_import.
 * NF_OK; NF_ENOENT (no src); NF_EUNSUPPORTED (no sqlite3 program: "apt
 * install sqlite3"); NF_EFORMAT (nothing recoverable); NF_EIO. */
typedef struct nf_cache_import_report nf_cache_import_report;
int nf_cache_recover(nf_cache *c, const char *src, nf_cache_import_report *r, nf_buf *err);

/* Opens (creating if absent and not read_only) the database at path.
 * Runs quick_check; migrates an older schema; sweeps nothing else; does
 * not create the directory.  NF_OK; NF_EFORMAT (not a NeoFlow cache:
 * "not a NeoFlow cache: application_id 0x...", a file that is no
 * database, newer schema "DB schema N > supported M", quick_check failed,
 * read_only on an empty or older database); NF_EUNSUPPORTED (network
 * filesystem); NF_ENOENT (read_only and no such file, or no such
 * directory); NF_EIO (cannot open, locked by another writer: "cache PATH
 * is in use by another neoflowd (pid N)"); NF_EINVAL; NF_ENOMEM.  The
 * message goes to err.  *out is NULL on failure. */
int nf_cache_open(const char *path, const nf_cache_opts *o, nf_cache **out, nf_buf *err);
void nf_cache_close(nf_cache *c);
/* Copies the write-ahead log into the database file and truncates it
 * (a clean stop: the .db alone then holds everything, for a backup that
 * copies it).  *complete 0 when a reader kept it from finishing (not an
 * error).  NF_OK, or NF_EIO / NF_EINVAL (read-only) with err. */
int nf_cache_checkpoint(nf_cache *c, int *complete, nf_buf *err);
/* The path given to nf_cache_open (owned by c). */
const char *nf_cache_path(const nf_cache *c);

/* key = SHA-256("neoflow-cache-key-v1" || graph_hash || target ||
 * codegen_version incl. its terminating NUL). */
void nf_cache_make_key(const uint8_t graph_hash[32], const uint8_t target[32],
                       const char *codegen_version, uint8_t key[32]);

/* A kernel's signature (proto/nf_wire_sign.h): the signer's Ed25519
 * public key and its signature of (key, sha256, target, kernel ABI).
 * The cache stores it beside its entry (table signatures) and never
 * judges it: the daemon verifies it against the keys it trusts before
 * serving the entry. */
typedef struct nf_cache_sig {
  uint8_t signer[32];
  uint8_t sig[64];
} nf_cache_sig;

/* Judges a signature an import brings: 1 to keep it (a daemon of ours
 * signed this binary for this key and target), 0 to drop it (the entry
 * then comes in unsigned: it never replaces one we have, and no daemon
 * serves it). */
typedef int (*nf_cache_sig_judge)(void *user, const uint8_t key[32], const uint8_t sha[32],
                                  const uint8_t target[32], const nf_cache_sig *sig);

typedef struct nf_cache_entry {
  uint8_t key[32];
  uint8_t graph_hash[32];
  uint8_t target[32];
  char *codegen;      /* code generator version */
  char *graph_name;   /* may be empty */
  char *target_desc;  /* may be empty */
  int tier;           /* 1 or 2 */
  char *schedule;     /* text */
  double time_ms;     /* 0: not measured (a tier-1 compile) */
  double default_ms;  /* 0: not measured */
  int trials;         /* measured candidates behind it */
  uint8_t *binary;
  size_t binary_len;
  uint8_t sha256[32]; /* of binary */
  int64_t created, updated, last_used; /* unix seconds */
  int64_t hits;
  int has_sig;        /* sig holds the kernel's signature (get: when one
                         is stored for this binary; put: store it) */
  nf_cache_sig sig;
  char *tune_error;   /* "" (or NULL when storing): tuning gave a kernel or
                         never ran; else why it found no correct candidate
                         (a tier-1 entry with trials > 0) */
  int tune_check;     /* with tune_error: the search's check revision
                         (NF_SEARCH_CHECK_REVISION) it failed under; else 0 */
} nf_cache_entry;

/* Deep copy of src into dst (strings and binary duplicated; NULL strings
 * become empty).  NF_OK or NF_ENOMEM (dst zeroed). */
int nf_cache_entry_copy(nf_cache_entry *dst, const nf_cache_entry *src);
/* Frees the strings and binary (not e itself) and zeroes e. */
void nf_cache_entry_free(nf_cache_entry *e);

/* Looks key up.  NF_OK: *out filled (caller frees), digest verified.
 * NF_ENOENT: a miss; also for a corrupt entry, which is quarantined
 * (unless read-only) and counted.  NF_EIO / NF_ENOMEM with a message.
 * Counts a hit or a miss in the statistics of this handle; writes nothing
 * else (see nf_cache_touch). */
int nf_cache_get(nf_cache *c, const uint8_t key[32], nf_cache_entry *out, nf_buf *err);
/* Sets the judge of imported signatures (nf_cache_import,
 * nf_cache_recover); without one, every imported entry comes in
 * unsigned. */
void nf_cache_set_judge(nf_cache *c, nf_cache_sig_judge judge, void *user);
/* Moves key's entry to the quarantine table with reason (never served
 * again; a later put stores afresh).  NF_OK also when there is none. */
int nf_cache_quarantine(nf_cache *c, const uint8_t key[32], const char *reason, nf_buf *err);
/* Signs the entries that were in the cache when it was migrated to
 * schema 2 (they predate signatures): calls sign for each and stores
 * what it returns, in one transaction; *n of them.  Entries that arrived
 * since are never adopted. */
int nf_cache_adopt(nf_cache *c, void (*sign)(void *user, const uint8_t key[32],
                                             const uint8_t sha[32], const uint8_t target[32],
                                             nf_cache_sig *out),
                   void *user, int64_t *n, nf_buf *err);
/* Records hits: adds n (>= 0) to hits and sets last_used = now, in a
 * transaction of its own.  NF_ENOENT when key has no entry; NF_EINVAL on
 * a read-only handle. */
int nf_cache_touch(nf_cache *c, const uint8_t key[32], int64_t n, nf_buf *err);
/* Stores e if it is better than what the key holds: a higher tier wins,
 * then a lower time_ms (an unmeasured time never replaces a measured
 * one; between unmeasured ones, one a tuning job ended with (trials > 0)
 * replaces one never tuned, and a failure to tune under another check
 * revision than the stored one's replaces it).  Computes nothing: e->sha256 must be the binary's digest and
 * e->key nf_cache_make_key(graph_hash, target, codegen) (both checked,
 * NF_EINVAL otherwise; so are tier, sizes and times).  NULL schedule,
 * graph_name, target_desc are stored as "".  e's created, updated,
 * last_used and hits are ignored: a new entry gets now, now, now, 0; a
 * replacement keeps its created and hits.  A current entry that does not
 * verify is quarantined and replaced.  Caps: above soft_cap_bytes the
 * least recently used other entries are evicted (with their records); a
 * binary larger than the soft cap, or a total above hard_cap_bytes, is
 * NF_ELIMIT.  NF_EINVAL on a read-only handle.  *stored (may be NULL) = 1 when written.  NF_OK;
 * NF_ELIMIT (hard cap); NF_EIO (SQLITE_FULL, I/O error: nothing written,
 * message in err); NF_EINVAL; NF_ENOMEM. */
int nf_cache_put(nf_cache *c, const nf_cache_entry *e, int *stored, nf_buf *err);

typedef struct nf_cache_record {
  char *schedule;
  int status;        /* nf_measure_status (0 = ok) */
  double time_ms;
  uint8_t *features; /* opaque bytes (the search's feature vector) */
  size_t n_features;
  char *reason;      /* may be empty */
  uint32_t group;    /* nf_cache_get_corpus: the records of one key share
                        it (0, 1, ... in the order keys first appear);
                        0 elsewhere */
} nf_cache_record;

/* Appends records for key (one transaction; duplicates of a schedule keep
 * the faster: an ok record replaces a failure or a slower ok one, a
 * failure never replaces anything).  At most 100000 records per key are
 * kept (nf__cache_max_records: failures go first, oldest first, then the
 * oldest ok ones).  NULL reason is stored as "". */
int nf_cache_add_records(nf_cache *c, const uint8_t key[32], const nf_cache_record *r,
                         size_t n, nf_buf *err);
/* The records of key, best first (ok ones by time, then failures oldest
 * first), at most max (0: all).  *out is malloc'd (NULL when none); free
 * with nf_cache_records_free.  Damaged rows are skipped. */
int nf_cache_get_records(nf_cache *c, const uint8_t key[32], size_t max,
                         nf_cache_record **out, size_t *n, nf_buf *err);
void nf_cache_records_free(nf_cache_record *r, size_t n);

/* ---- similar subgraphs (schema 3) ----
 *
 * A key's shape: a structural signature (NF_CACHE_SIG bytes: equal for
 * subgraphs of the same sketch class and loop structure, whatever their
 * extents and scalar operators; the search computes it) and a descriptor
 * (at most NF_CACHE_DESC floats: its extents, for the distance between
 * two subgraphs of one signature).  Entries stored before schema 3 have
 * none: they are never found as similar. */
#define NF_CACHE_SIG 16
#define NF_CACHE_DESC 64

/* Stores key's shape (replacing the one it had).  NF_OK; NF_EINVAL (read-
 * only handle, n_desc > NF_CACHE_DESC); NF_EIO. */
int nf_cache_put_shape(nf_cache *c, const uint8_t key[32], const uint8_t sig[NF_CACHE_SIG],
                       const float *desc, size_t n_desc, nf_buf *err);

typedef struct nf_cache_similar {
  uint8_t key[32];
  float desc[NF_CACHE_DESC];
  size_t n_desc;
} nf_cache_similar;

/* The keys with an entry of target and codegen whose shape has signature
 * sig, except `except` (may be NULL), at most max (0: 256), most recently
 * used first.  *out is malloc'd (NULL when none; free()).  Rows whose
 * descriptor is damaged are skipped. */
int nf_cache_find_similar(nf_cache *c, const uint8_t sig[NF_CACHE_SIG], const uint8_t target[32],
                          const char *codegen, const uint8_t *except, size_t max,
                          nf_cache_similar **out, size_t *n, nf_buf *err);

/* The most recent successful records (status 0, with features) of every
 * key with an entry of target and codegen, except `except` (may be
 * NULL): at most max (0: 4096), newest first, without their schedules
 * (schedule NULL) or reasons; r.group numbers their keys.  For training
 * the cost model on what the whole cache has measured.  *out as for
 * nf_cache_get_records. */
int nf_cache_get_corpus(nf_cache *c, const uint8_t target[32], const char *codegen,
                        const uint8_t *except, size_t max, nf_cache_record **out, size_t *n,
                        nf_buf *err);

typedef struct nf_cache_stats {
  int64_t entries, tier1, tier2, records, quarantined;
  int64_t binary_bytes;  /* sum of binary sizes */
  int64_t file_bytes;    /* database + WAL on disk */
  int64_t hits, misses, corrupt; /* this handle's lookups since open */
  int schema;
} nf_cache_stats;
int nf_cache_stats_get(nf_cache *c, nf_cache_stats *s, nf_buf *err);

/* Calls fn for every entry, most recently used first; the entry's binary
 * is not loaded (binary NULL, binary_len its size) and nothing is
 * verified.  The strings belong to the cache and stay valid during the
 * call only; fn must not write to c.  fn returns non-zero to stop. */
int nf_cache_list(nf_cache *c, int (*fn)(void *user, const nf_cache_entry *e), void *user,
                  nf_buf *err);

typedef struct nf_cache_verify_report {
  int64_t checked, bad;
  int integrity_ok; /* PRAGMA integrity_check (full) or quick_check */
} nf_cache_verify_report;
/* Checks the database (integrity_check when full, else quick_check) and
 * every entry as nf_cache_get does; bad entries are quarantined when fix
 * (and the handle is writable), and reported through err lines ("cache
 * PATH: entry <16 hex>: <why>") either way.  NF_OK when everything
 * verified, NF_EFORMAT when something did not (even if fixed), NF_EIO /
 * NF_ENOMEM when the check could not run. */
int nf_cache_verify(nf_cache *c, int full, int fix, nf_cache_verify_report *r, nf_buf *err);

/* Writes every verified entry and every record into a new cache database
 * at dest (written to dest.tmp-PID in rollback-journal mode, fsynced,
 * renamed without replacing, directory fsynced; an existing dest is
 * refused with NF_EINVAL).  *n_entries (may be NULL) gets the count;
 * entries that do not verify are skipped with a line in err. */
int nf_cache_export(nf_cache *c, const char *dest, int64_t *n_entries, nf_buf *err);

typedef struct nf_cache_import_report {
  int64_t seen, added, replaced, kept, rejected, records;
  int64_t unsigned_; /* entries without a signature: imported for their
                        schedule and times only, never served as they are
                        (the daemon quarantines and rebuilds them) */
} nf_cache_import_report;
/* Merges the cache database at src (opened read-only, hardened, checked
 * like any cache: application_id, schema, quick_check) into c: per key
 * the better entry stays (nf_cache_put's rule); entries whose digest does
 * not verify are rejected (counted, first ones named in err lines);
 * records are merged (nf_cache_add_records' rule).  One transaction;
 * entry times and hits come from src (a replacement keeps the older
 * created and adds the hits).  The caps of c apply (NF_ELIMIT undoes the
 * import).  NF_EFORMAT for a src that is not a valid cache of schema
 * NF_CACHE_SCHEMA; NF_EINVAL for c read-only or src = c's own file. */
int nf_cache_import(nf_cache *c, const char *src, nf_cache_import_report *r, nf_buf *err);

typedef struct nf_cache_gc_opts {
  int64_t max_bytes;        /* evict least recently used until binaries fit (0: no) */
  int64_t older_than_s;     /* drop entries unused for this long (0: no) */
  const char *keep_codegen; /* drop entries of any other codegen version (NULL: no) */
  int drop_quarantine;      /* empty the quarantine table */
} nf_cache_gc_opts;
typedef struct nf_cache_gc_report {
  int64_t removed, freed_bytes;
} nf_cache_gc_report;
/* Removes what o says (with the records of removed entries; older_than_s
 * also drops records older than that whose key has no entry) in one
 * transaction, then checkpoints (TRUNCATE), vacuums and checkpoints
 * again.  o may be NULL (only the checkpoint and vacuum).  NF_EINVAL on a
 * read-only handle. */
int nf_cache_gc(nf_cache *c, const nf_cache_gc_opts *o, nf_cache_gc_report *r, nf_buf *err);

/* ---- for tests only ---- */

/* Test hook: when non-NULL, called with the step name inside the write
 * transactions, before their COMMIT: "put:begin", "put:entry",
 * "put:commit" (nf_cache_put: once each per put that gets the write
 * lock, whether it stores or not), "records:begin", "records:insert",
 * "records:commit" (nf_cache_add_records), "migrate:begin",
 * "migrate:step" (before each migration k -> k+1), "migrate:commit",
 * "import:begin", "import:commit", "gc:commit".  The crash tests kill
 * the process there. */
extern void (*nf__cache_test_hook)(const char *step);
/* When non-NULL, replaces statfs(dir).f_type in the network filesystem
 * check: returns the filesystem magic for dir, or -1 with errno set. */
extern long (*nf__cache_statfs_hook)(const char *dir);
/* The most records kept per key (100000); tests lower it. */
extern int64_t nf__cache_max_records;

#endif
