/* nfd_config.h - neoflowd's configuration: defaults, the INI file
 * (parsed by libinih), the environment (NEOFLOW_SOCKET, NEOFLOW_CACHE) and
 * the checks that refuse an unsafe setup.  deploy/neoflowd.conf.example
 * lists every key with its default.
 *
 * Precedence: built-in defaults < the config file < the environment <
 * command-line options (applied by neoflowd.c after nfd_config_load).
 *
 * The file has four sections, [daemon], [cache], [tcp] and [jobs], with
 * the keys named in the comments below (lowercase, case-sensitive).
 * Integers are decimal and range-checked; booleans are true/false, yes/no,
 * on/off or 1/0; output limits take plain bytes or a K, M or G suffix
 * (binary: 8M = 8 MiB; "8MB" and "8MiB" mean the same), and so do the
 * counts max_elements and max_gflops (4G = 4 x 2^30); *_mb keys are in
 * MiB.  Comments are lines starting with ';' or '#', and " ;" ends a
 * value.  A key set twice, an indented continuation line, a key outside a
 * section, a line of more than 197 bytes (libinih's 200-byte line buffer;
 * long comment lines are fine) are errors too.  Every field holds the unit
 * its comment says. */
#ifndef NFD_CONFIG_H
#define NFD_CONFIG_H

#define NFD_CONFIG_KEYS 64 /* room for every key's line (config.c checks) */

#include <stdint.h>
#include <sys/types.h>

#include "nf_buf.h"

#define NFD_MAX_ALLOWED_UIDS 32
/* The caps on one submitted subgraph (docs/daemon.md "Checking a
 * subgraph"): the elements of its tensors, summed, and the float
 * operations of one evaluation (nf_graph_measure's upper bound), in
 * GFLOP.  The largest real workloads in examples/ and bench/ stay below
 * 1/100 of either. */
#define NFD_DEFAULT_MAX_ELEMENTS ((int64_t)4 << 30) /* 4G: 16 GiB of f32 */
#define NFD_DEFAULT_MAX_GFLOPS ((int64_t)100000)    /* 100 TFLOP */

typedef enum nfd_log_level { NFD_LOG_ERROR = 0, NFD_LOG_WARN, NFD_LOG_INFO, NFD_LOG_DEBUG } nfd_log_level;

typedef struct nfd_config {
  /* [daemon] */
  char socket_path[108];   /* socket = ; < 108 bytes (sun_path) */
  char socket_group[64];   /* socket_group = ; "" none: dir 0700, socket 0600 */
  uid_t allowed_uids[NFD_MAX_ALLOWED_UIDS]; /* allowed_uids = 1001, alice: numbers
                              or user names (getpwnam_r at load), besides
                              the daemon's own uid; nfd_uid_allowed */
  int n_allowed_uids;
  int max_connections;     /* 256 */
  int max_connections_per_uid; /* 64: one user (or one TCP peer address)
                              cannot hold every slot */
  int min_frame_rate;      /* bytes/s, 1024: a frame in progress must
                              arrive at least this fast (after a grace of
                              progress_timeout_ms), else it is dropped */
  int max_requests;        /* per client, open at once: 1024 */
  int handshake_timeout_ms;/* 5000 */
  int progress_timeout_ms; /* 10000: a started frame must complete, and
                              pending output must drain, within it */
  int idle_timeout_s;      /* 600: a connection with no open request and
                              nothing sent either way for so long is
                              closed (0: never) */
  int64_t output_soft_limit; /* bytes, 8 MiB: production pauses above it */
  int64_t output_hard_limit; /* bytes, 64 MiB: the connection is dropped */
  int output_soft_seconds; /* 60: dropped if above the soft limit so long */
  int log_level;           /* nfd_log_level; log_level = error|warn|info|debug
                              (default info) */
  /* [cache] */
  char cache_path[4096];   /* cache = */
  int allow_network_fs;    /* allow_network_fs = false */
  int cache_sync_full;     /* sync = normal|full (default normal: 0) */
  int64_t cache_soft_cap;  /* bytes; soft_cap_mb = 0 (none), in MiB */
  int64_t cache_hard_cap;  /* bytes; hard_cap_mb = 0 (none), in MiB */
  /* [tcp] */
  char tcp_listen[256];    /* listen = host:port, "" off */
  char tcp_key_file[4096]; /* key_file = */
  char signing_key[4096];  /* [daemon] signing_key = : the daemon's Ed25519
                              seed (docs/security.md); "": signing.key
                              beside the cache, made on first start */
  /* [upstream]: a team's cache tier (docs/daemon.md) */
  char upstream_address[4096];    /* address = tcp:HOST:PORT or a socket, "" none */
  char upstream_key_file[4096];   /* key_file = : the upstream's [tcp] key (TCP) */
  char upstream_public_key[4096]; /* public_key = ed25519:HEX or a file: the only
                                     signer whose kernels are taken */
  int upstream_timeout_ms;        /* timeout_ms = 1000: a lookup's bound */
  int upstream_publish;           /* publish = yes: a tuning's result is
                                     published upstream (MODE_PUBLISH) */
  int key_line[NFD_CONFIG_KEYS];  /* the line each key was set on (0: not in
                                     the file): checks name it */
  /* [jobs] */
  int compile_jobs;        /* min(online CPUs, 8) */
  int tune_jobs;           /* 1 */
  int max_queued_jobs;     /* 4096 */
  int default_trials;      /* 200 */
  int max_trials;          /* 2000 */
  int default_seconds;     /* 600 */
  int max_seconds;         /* 3600 */
  int compile_timeout_s;   /* 60: a compile job's whole process */
  int measure_timeout_ms;  /* 10000 per candidate */
  int worker_memory_mb;    /* MiB, 4096: RLIMIT_AS of job processes and workers */
  int64_t max_elements;    /* NFD_DEFAULT_MAX_ELEMENTS: a subgraph whose tensors
                              hold more elements in all is refused */
  int64_t max_gflops;      /* NFD_DEFAULT_MAX_GFLOPS: a subgraph whose one
                              evaluation may take more GFLOP is refused */
  int share_budget;        /* 1: a tuning job's budget follows its share of
                              its clients' step time (nfd_tune_budget) */
  int min_trials;          /* 16: the least a subgraph of negligible share gets */
  int min_seconds;         /* 15 */
  int similar_records;     /* 16: schedules of similar subgraphs a job never
                              tuned starts from (0: none) */
  int model_records;       /* 4096: records of other subgraphs the cost
                              model also learns from (0: none) */
  char config_path[4096];  /* the file loaded ("" none) */
} nfd_config;

/* The most a share of step time multiplies a tuning budget by. */
#define NFD_SHARE_BOOST 4

/* A tuning job's budget (docs/daemon.md "Tuning budget"): the budget
 * asked for (trials, seconds: the request's, within the caps) scaled by
 * weight, the subgraph's step time over the mean step time of its
 * client's subgraphs (1: an average subgraph), so that a client's
 * subgraphs share the sum of their budgets by their measured share of the
 * step.  The result stays within [min(min_*, asked), min(max_*,
 * NFD_SHARE_BOOST x asked)].  A weight <= 0 or not finite (no profile
 * reported yet), or share_budget off, leaves the budget as asked. */
void nfd_tune_budget(const nfd_config *c, double weight, int trials, int seconds,
                     int *out_trials, int *out_seconds);

/* Built-in defaults with the environment applied.  socket_path:
 * $NEOFLOW_SOCKET, else $XDG_RUNTIME_DIR/neoflowd/neoflowd.sock, else
 * /run/neoflowd/neoflowd.sock for root, else /tmp/neoflowd-UID/neoflowd.sock.
 * cache_path: $NEOFLOW_CACHE, else $XDG_CACHE_HOME/neoflow/cache.db, else
 * ~/.cache/neoflow/cache.db (root: /var/lib/neoflowd/cache.db).  Empty
 * variables and relative XDG_* paths are ignored (XDG spec).  A path that
 * does not fit its field is left empty, so nfd_config_check refuses it
 * rather than a different path being used silently.  Never fails. */
void nfd_config_defaults(nfd_config *c);
/* Reads the INI file at path over c, then re-applies the environment.
 * Unknown sections or keys, malformed or out-of-range values are errors
 * naming file:line and the key ("f.conf:12: [daemon] max_connections:
 * 'lots' is not an integer"); every error found is appended to err, one
 * per line.  c changes only on success (config_path = path).  NF_OK,
 * NF_ENOENT (no such file), NF_EFORMAT, NF_EINVAL (NEOFLOW_SOCKET or
 * NEOFLOW_CACHE too long), NF_ENOMEM, NF_EIO.  Cross-key rules are
 * nfd_config_check's. */
int nfd_config_load(nfd_config *c, const char *path, nf_buf *err);
/* Refuses what is unsafe or inconsistent: a TCP address other than
 * loopback without key_file ("refusing to listen on 0.0.0.0:7117 without
 * [tcp] key_file: anyone who can reach it could submit work"), a malformed
 * listen address, soft output limit above the hard one, default_trials
 * above max_trials, default_seconds above max_seconds, cache soft cap
 * above the hard cap, any value outside its key's range (options set on
 * the command line land here unchecked), an empty, relative or too long
 * (> 107 bytes, sun_path) socket path, an empty cache path.  It does not
 * read the key file (the daemon loads it with nf_auth_load_key).  NF_OK or
 * NF_EINVAL with every reason appended to err, one per line. */
int nfd_config_check(const nfd_config *c, nf_buf *err);
/* The directory part of socket_path (into dir, n bytes; truncated to fit,
 * always NUL-terminated): "/run/neoflowd" for "/run/neoflowd/x.sock", "/"
 * for "/x.sock", "." for "x.sock". */
void nfd_config_socket_dir(const nfd_config *c, char *dir, size_t n);
/* Lowercase name of a level ("info"); "unknown" out of range.  Static. */
const char *nfd_log_level_name(int level);
/* Parses a level name (case-insensitive).  NF_OK or NF_EINVAL. */
int nfd_log_level_parse(const char *name, int *level);

#endif
