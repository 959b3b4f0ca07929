/* nfd_int.h - what neoflowd's files share (server.c: connections and
 * sessions; jobs.c: single-flight jobs, scheduling and job processes;
 * neoflowd.c: start-up, signals, logging; job_main.c: the job process).
 *
 * Everything here runs on the one event-loop thread, except job_main.c,
 * which runs in a separate process (`neoflowd --job`) and shares nothing
 * but the wire protocol with the rest.
 *
 * Ownership:
 *  - a connection owns its requests (nfd_req); a request is subscribed to
 *    at most one job, which holds it in its subscriber list;
 *  - a job owns its process handles and the packed graph; it is destroyed
 *    when its last phase ends or its last subscriber goes;
 *  - kernels (nfd_kernel) are reference-counted: the job's latest and every
 *    connection's queued sends hold references. */
#ifndef NFD_INT_H
#define NFD_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "neoflow.pb-c.h"
#include "nf_buf.h"
#include "nf_cache.h"
#include "nf_status.h"
#include "nf_target.h"
#include "nf_wire.h"
#include "nfd_config.h"

typedef struct nfd_server nfd_server;
typedef struct nfd_conn nfd_conn;
typedef struct nfd_job nfd_job;
typedef struct nfd_req nfd_req;
typedef struct nfd_writer nfd_writer;

/* ---- logging (neoflowd.c) ---- */
extern int nfd_verbosity; /* an nfd_log_level */
void nfd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define NFD_ERROR(...) nfd_log(NFD_LOG_ERROR, __VA_ARGS__)
#define NFD_WARN(...) nfd_log(NFD_LOG_WARN, __VA_ARGS__)
#define NFD_INFO(...)                                                   \
  do {                                                                  \
    if (nfd_verbosity >= NFD_LOG_INFO) nfd_log(NFD_LOG_INFO, __VA_ARGS__); \
  } while (0)
#define NFD_DEBUG(...)                                                    \
  do {                                                                    \
    if (nfd_verbosity >= NFD_LOG_DEBUG) nfd_log(NFD_LOG_DEBUG, __VA_ARGS__); \
  } while (0)

/* Seconds on a monotonic clock. */
double nfd_now(void);

/* ---- kernels ---- */
typedef struct nfd_kernel {
  int refs;
  uint8_t key[32];
  int tier;
  char *schedule;
  double time_ms, default_ms;
  int trials;
  uint8_t *binary;
  size_t len;
  uint8_t sha256[32];
  uint8_t sig[64];     /* the daemon's signature (nfd_kernel_sign) */
} nfd_kernel;

/* Signs k for target (the session's fingerprint) with the daemon's key. */
void nfd_kernel_sign(const nfd_server *S, nfd_kernel *k, const uint8_t target[32]);
/* 1 when cache entry e carries this daemon's own valid signature for key
 * and target: the only binaries it serves (docs/security.md). */
int nfd_entry_signed(const nfd_server *S, const nf_cache_entry *e, const uint8_t key[32],
                     const uint8_t target[32]);

/* A kernel with one reference, copying its parts (the digest computed
 * here); NULL when out of memory. */
nfd_kernel *nfd_kernel_new(const uint8_t key[32], int tier, const char *schedule,
                           double time_ms, double default_ms, int trials,
                           const uint8_t *binary, size_t len);
void nfd_kernel_ref(nfd_kernel *k);
void nfd_kernel_unref(nfd_kernel *k);

/* ---- targets ----
 * What a session's kernels are for: this machine's CPU (cuda_sm 0), or
 * the client's GPU (compiled here with NVRTC, which needs no device). */
/* Descriptors kept free for job pipes, cache files and the log: a
 * connection that would take one of them is refused with BUSY. */
#define NFD_FD_HEADROOM 16

/* The exit status of a configuration that cannot work (sysexits'
 * EX_CONFIG): the systemd unit does not restart on it. */
#define NFD_EXIT_CONFIG 78

/* Logging once per burst: the first event is logged, then at most one
 * line per 10 s saying how many came meanwhile (nfd_burst_log). */
typedef struct nfd_burst {
  double last;       /* when a line was last written */
  uint64_t held;     /* events since */
} nfd_burst;

/* Logs fmt (warning level) for an event of kind b, once per burst. */
void nfd_burst_log(nfd_burst *b, const char *fmt, ...) NF_PRINTF(2, 3);

typedef struct nfd_target {
  int cuda_sm;              /* 0: the host CPU */
  uint8_t fingerprint[32];  /* in the cache key */
  char description[256];
  char codegen[128];        /* the code generator's version, in the key */
  char cuda_name[256];      /* the GPU's name as the client's driver says */
} nfd_target;

/* A subgraph's shape (nf_search_shape): how the cache finds similar
 * ones.  ok 0: unknown (not computed, or the graph had none). */
typedef struct nfd_shape {
  int ok;
  uint8_t sig[NF_CACHE_SIG];
  float desc[NF_CACHE_DESC];
  size_t n_desc;
} nfd_shape;

/* ---- requests ---- */
#define NFD_SUMMARY_MAX 96 /* a graph's summary (nf_graph_summary) */

struct nfd_req {
  nfd_req *next_in_conn, *next_in_job;
  nfd_conn *conn;
  nfd_job *job;       /* NULL once finished */
  uint64_t id;
  int mode;           /* Neoflow__Mode */
  char summary[NFD_SUMMARY_MAX]; /* what its graph computes (a new job's) */
  double step_ms;     /* reported by the client (StepTimes) */
  double step_weight; /* step_ms over the mean of the client's subgraphs in
                         the same report (0: none yet): scales the tuning
                         budget (nfd_tune_budget) */
  uint8_t key[32];
  nfd_target target;  /* the session's */
  int got_tier;       /* best kernel delivered so far */
  double got_ms;
};

/* ---- connections (server.c) ---- */

/* Queues a kernel for request id (a KernelUpdate, then its chunks, sent
 * as the client reads).  final marks the request's last answer. */
void nfd_conn_send_kernel(nfd_conn *c, uint64_t id, nfd_kernel *k, int final);
/* Sends a message now (dropped when the connection is closing; the
 * connection is dropped when its output passes the hard limit). */
void nfd_conn_send(nfd_conn *c, const Neoflow__ServerMessage *m);
/* Sends an Error; fatal closes the connection after it. */
void nfd_conn_error(nfd_conn *c, uint64_t request_id, int code, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Output bytes queued and not yet taken by the kernel. */
size_t nfd_conn_out_pending(const nfd_conn *c);
/* Jobs started on behalf of c (fair share). */
uint64_t *nfd_conn_served(nfd_conn *c);
/* Ends request r: unlinks it from its connection and frees it (it must
 * already be unsubscribed from its job). */
void nfd_req_finish(nfd_req *r);

/* ---- jobs (jobs.c) ---- */

/* Subscribes r to the job of its key, creating it when there is none
 * (single flight).  tuned_in_cache: the cache holds a tier-1 entry, so a
 * new job starts at the tuning phase.  graph_pb: the packed wire graph
 * (copied when a job is created); shape (may be NULL): the graph's, stored
 * with the key when tuning starts and used to find similar subgraphs;
 * published (MODE_PUBLISH, else NULL): the schedule a node published,
 * measured first when the job tunes.  NF_OK, NF_ELIMIT (queue full),
 * NF_ENOMEM. */
int nfd_job_subscribe(nfd_server *S, nfd_req *r, const uint8_t graph_hash[32],
                      const char *graph_name, const uint8_t *graph_pb, size_t graph_len,
                      const nfd_shape *shape, int have_tier1, int max_trials, int max_seconds,
                      const char *published);
/* Removes r from its job (if any); a job left without subscribers is
 * dropped (a running job process is killed; its records so far are kept). */
void nfd_job_unsubscribe(nfd_req *r);
/* Starts queued jobs while there is capacity. */
void nfd_jobs_schedule(nfd_server *S);
/* Called every tick: job timeouts. */
void nfd_jobs_tick(nfd_server *S, double now);
/* Kills every job process and flushes records (shutdown). */
void nfd_jobs_shutdown(nfd_server *S);
/* Number of live jobs (status); fills reply->jobs (allocated with malloc;
 * freed by nfd_jobs_status_free). */
void nfd_jobs_status(nfd_server *S, Neoflow__StatusReply *reply);
void nfd_jobs_status_free(Neoflow__StatusReply *reply);
/* 1 while any job process or its handles are still open. */
int nfd_jobs_busy(const nfd_server *S);

/* ---- the cache writer (writer.c) ----
 * Every cache write goes through one thread with its own handle; the
 * event loop only reads.  Operations are copied (or, for records, taken
 * over) and run in order. */

/* Whether cache entry e answers a request to tune (no tuning job): a
 * tuned kernel (tier 2), or a tier-1 kernel a tuning job ended with
 * (trials > 0), unless that job found no correct candidate under another
 * revision of the search's check (NF_SEARCH_CHECK_REVISION) than ours. */
int nfd_entry_tuned(const nf_cache_entry *e);

/* Opens the writer's handle on cfg.cache_path and starts its thread. */
int nfd_writer_start(nfd_server *S, nf_buf *err);
/* Queues a copy of e for nf_cache_put. */
void nfd_writer_put(nfd_server *S, const nf_cache_entry *e);
/* Queues records for key, taking over recs (an array of n, malloc'd,
 * freed with nf_cache_records_free). */
void nfd_writer_records(nfd_server *S, const uint8_t key[32], nf_cache_record *recs, size_t n);
/* Queues n hits for key. */
void nfd_writer_touch(nfd_server *S, const uint8_t key[32], int64_t n);
/* Queues moving key's entry to the quarantine (a binary it will not
 * serve: unsigned or signed by another key). */
void nfd_writer_quarantine(nfd_server *S, const uint8_t key[32], const char *reason);
/* Queues storing key's shape (nf_cache_put_shape). */
void nfd_writer_shape(nfd_server *S, const uint8_t key[32], const nfd_shape *shape);
/* A copy of the latest queued, not yet committed entry for key: NF_OK,
 * NF_ENOENT, NF_ENOMEM. */
int nfd_writer_lookup(nfd_server *S, const uint8_t key[32], nf_cache_entry *out);
/* 1 while an operation of key (kernel, records, ...) waits or runs. */
int nfd_writer_pending(nfd_server *S, const uint8_t key[32]);
/* Runs everything queued, then stops the thread and closes its handle. */
void nfd_writer_stop(nfd_server *S);

/* ---- the server ---- */
typedef struct nfd_listener {
  union {
    uv_pipe_t pipe;
    uv_tcp_t tcp;
    uv_stream_t stream;
    uv_handle_t handle;
  } h;
  nfd_server *S;
  int tcp;
  int open;
} nfd_listener;

#define NFD_MAX_LISTENERS 8

struct nfd_server {
  uv_loop_t *loop;
  nfd_config cfg;
  nf_cache *cache;           /* reads (the event loop) */
  nfd_writer *writer;        /* writes (its own thread and handle) */
  nf_host_target target;
  char codegen_version[128]; /* the CPU code generator's */
  char cuda_codegen[128];    /* the CUDA one's */
  char exe_path[4096];       /* this binary, for `--job` processes */
  uint8_t tcp_key[32];
  int have_tcp_key;
  uint8_t sign_sk[64]; /* the daemon's identity (nf_wire_sign.h) */
  uint8_t sign_pk[32];
  nfd_listener listeners[NFD_MAX_LISTENERS];
  int n_listeners;
  char unix_path[108];       /* the socket file we created ("" none) */
  uv_timer_t tick;
  uv_signal_t sig_term, sig_int, sig_hup;
  int shutting_down;
  double t_start;
  uint64_t next_session;
  nfd_conn *conns;           /* doubly linked */
  int n_conns;
  nfd_job *jobs;             /* doubly linked */
  int n_jobs, n_running_compile, n_running_tune;
  uint64_t job_seq;
  /* cache hits not yet recorded in the cache (flushed every second) */
  uint8_t touch_key[256][32];
  int64_t touch_n[256];
  int n_touch;
  double t_touch_flush;
  /* statistics */
  uint64_t hits, misses, jobs_done, jobs_failed, jobs_cancelled, refused;
  uint64_t lookups_missed; /* MODE_LOOKUP requests the cache could not answer */
  uint64_t upstream_kernels; /* kernels taken from the team's upstream daemon */
  uint64_t upstream_published; /* tuned schedules published to the upstream */
  uint64_t published_received, published_kept; /* MODE_PUBLISH requests; of
                                                  them, schedules kept here */
  uint64_t timeouts;      /* connections closed by a deadline (handshake, a
                             stalled or too slow frame, idle, slow reader) */
  uint64_t emfile;        /* accepts that failed for lack of descriptors
                             (libuv closes the connection) */
  uint64_t cache_busy;    /* cache reads or writes that found it locked */
  uint64_t slower_reports; /* submits saying a kernel lost to the client's fallback */
  uint64_t retunes;       /* of them, searches resumed with one more budget */
  int64_t writer_busy_ms; /* when the writer thread last found the cache
                             locked (nfd_now() in ms; atomic): requests
                             within a minute are told CACHE_BUSY */
  nfd_burst burst_timeout, burst_emfile, burst_busy, burst_refused;
};

/* Job state for the status reply / tests. */
int nfd_server_run(nfd_server *S);

#endif
