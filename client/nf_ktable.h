/* nf_ktable.h - the kernel table of a session (ktable.c): one entry per
 * distinct subgraph with the kernels that run it, each entry's mailbox,
 * and the state the producers of kernels share with the program's
 * thread.  The producers (the daemon link, dlink.c; the GPU generator,
 * gpu_local.c) see this table and the device table, never the session.
 *
 * Threads: the program's thread runs steps and is the only one that
 * touches the kernels in use (cur, cand); the fields marked
 * "under mu" are shared with the producers under the table's mu. */
#ifndef NF_KTABLE_H
#define NF_KTABLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_gemm.h"
#include "nf_ir.h"
#include "nf_runtime.h"
#include "nf_slog.h"

struct nf_session;
struct nf__op;

/* Kernel state as the daemon reports it (kent.dstate). */
enum { DK_NONE = 0, DK_SUBMITTED, DK_ACCEPTED, DK_FINAL, DK_FAILED };

/* Runs of a race between tier 0 (OpenBLAS, cuBLAS, cuDNN, the
 * interpreter) and a compiled kernel (even: half each). */
#define NF_RACE_RUNS 6

/* Points of an entry's tuning curve kept for the training report. */
#define NF_TUNE_POINTS 64

/* One distinct subgraph (by canonical key): the kernels that run it. */
typedef struct nf__kent {
  uint8_t key[32];      /* nf_graph_hash of g */
  const nf_graph *g;    /* the first op's subgraph graph (immutable) */
  nf_gemm_sub *gemm;    /* tier 0 through OpenBLAS, or NULL */
  int64_t flops;        /* per run */
  int n_ops;            /* ops running it per step */
  int alias;            /* its ops run in place (the optimizer update) */
  /* program thread only; cur and cand are the device's kernels (made by
   * its load, freed by its unload: an nf_kernel on the CPU, a CUDA module
   * on a GPU) */
  void *cur;            /* compiled kernel in use, or NULL (tier 0) */
  int cur_tier;         /* 0 (generated here), 1 or 2 */
  double cur_ms;        /* daemon-measured time of cur (0: unknown) */
  void *cand;           /* loaded, waiting for its canary */
  int cand_tier;
  uint8_t cand_sha[32];
  double cand_ms;
  int verified;         /* a compiled kernel passed a canary against tier 0 */
  double run_ms;        /* time spent in it during the last step */
  double prof_ms;       /* ... summed over the steps since the profile was reset */
  uint8_t cur_sha[32];
  /* Never slower than tier 0: a kernel replaces tier 0 only when it is
   * faster here.  Its canary times both; unless the kernel is clearly
   * faster than the interpreter, the next RACE_RUNS runs alternate
   * between tier 0 and the kernel and the faster by median is kept
   * (prefer_t0).  The verdict is recorded (verify.c), so a later session
   * with the same kernel neither measures nor races again. */
  int race_left;
  double race_ms[2][NF_RACE_RUNS / 2]; /* [1]: tier 0, [0]: the kernel */
  int prefer_t0;
  int probe;            /* time the kernel's next run against tier 0's estimate */
  int hold;             /* data-parallel: the candidate waits (not every rank
                           has these bytes yet: nf_dist.h) */
  int all_trust;        /* data-parallel: every rank verified these bytes before */
  int hold_steps;       /* data-parallel: steps the candidate has waited */
  double t0_ms;         /* tier 0's last measured time per run (0: unknown) */
  double kn_ms;         /* the kernel's, as judged against t0_ms (0: unknown) */
  double slow_ratio;    /* prefer_t0: the kernel's time over tier 0's */
  /* under mu: 1 when the link is to ask the daemon for a faster kernel
   * than the one (slow_sha) that ran slow_ratio times tier 0's time; 2 once
   * asked (once per session) */
  int ask_better;
  uint8_t slow_sha[32];
  /* a convolution's gathered operand shared with another entry's (the
   * forward's and the weight gradient's im2col): the input it gathers
   * (-1: none), the entry gathering the same cells (-1: none), and the
   * run (run_seq) and source buffer of this entry's last gather */
  int gather_in, gather_peer;
  uint64_t gather_seq;
  const void *gather_src;
  /* under mu: the mailbox (ktable.c) */
  void *in_obj;         /* handed over (s->dev->accept made it), or NULL */
  int in_tier;
  uint8_t in_sha[32];
  double in_ms;
  int dstate;           /* DK_* */
  uint64_t req_id;
  uint8_t dkey[32];     /* the key the daemon accepted it under */
  uint32_t trial, max_trials;
  double share_ms;      /* step time share to report */
  /* under mu: the tuning curve as the daemon reported its search (the
   * training report): best ms at trial, at most NF_TUNE_POINTS points
   * (every other one dropped when full), and the default's time */
  uint16_t n_tune;
  float tune_x[NF_TUNE_POINTS], tune_y[NF_TUNE_POINTS];
  double tune_default;
} nf__kent;

/* ---- the device interface ----
 * What differs between the devices a session trains on, as a table of
 * functions: nf__cpu_device (device_cpu.c) and nf__cuda_device
 * (gpu_session.c).  Everything else (the step loop, the mailbox, the
 * canary, the races and their verdicts, kt_run.c) exists once and reaches
 * the device only through this table.
 *
 * The first three entries are called by the producers of kernels (any
 * thread, the table only); the rest on the program's thread with the
 * session (session_int.h), op being one of its ops.  An entry that may be
 * NULL says so: NULL means "nothing to do" (the CPU's host memory is the
 * device's). */
typedef struct nf__ktable nf__ktable;
typedef struct nf__device {
  const char *name; /* "cpu", "cuda" */
  /* Checks binary bin for entry k of kt and makes what the step boundary
   * takes into *obj: the loaded kernel (CPU), a checked copy of the CUDA
   * bundle (CUDA; kt->dev_ctx is the GPU's state).  Any thread.  NF_OK, or
   * an error with why in err. */
  int (*accept)(const nf__ktable *kt, int k, const void *bin, size_t len, void **obj,
                nf_buf *err);
  /* Frees what accept made that nobody took (NULL: no-op). */
  void (*drop)(void *obj);
  /* The architecture kernels are asked for (0: the CPU) and the device's
   * name ("" on the CPU). */
  int (*target)(const nf__ktable *kt, const char **name);

  /* At a step boundary: what accept made for entry k becomes a kernel the
   * device runs (obj consumed).  NULL when it cannot (the reason logged
   * and counted in s->rejected). */
  void *(*load)(struct nf_session *s, nf__kent *k, void *obj);
  /* Frees a kernel load made (NULL: no-op). */
  void (*unload)(void *kern);
  /* The start of a step or evaluation, after the kernels were taken
   * (the GPU: whether its entries are timed, the hyper-parameters up). */
  int (*begin)(struct nf_session *s);
  /* Runs the ops mask marks (NULL: all) through nf__kt_run_ops, the one
   * step loop, possibly wrapped (the GPU: captured into a CUDA graph and
   * replayed).  NULL: nf__kt_run_ops itself. */
  int (*run_ops)(struct nf_session *s, const uint8_t *mask);
  /* Around one op of the loop (NULL: nothing): the GPU selects the op's
   * stream and waits for its dependencies, then records its event and,
   * on a timed step, waits for it.  kernel: the op ran its entry's
   * verified kernel. */
  int (*op_begin)(struct nf_session *s, int op_index);
  int (*op_end)(struct nf_session *s, int op_index, int kernel, int rc);
  /* Runs kernel kern (cur or cand of op's entry) on op's buffers. */
  int (*run)(struct nf_session *s, nf__kent *k, struct nf__op *op, void *kern);
  /* Runs k's tier 0 on op's buffers (the GPU: cuBLAS or cuDNN where they
   * take the entry, else the host's with the data moved); reference: the
   * host's tier 0 (OpenBLAS or the interpreter), as a canary's reference. */
  int (*tier0)(struct nf_session *s, nf__kent *k, struct nf__op *op, int reference);
  /* A canary's run of candidate kern on copies of op's inputs: its
   * outputs, on the host, in got[0..n_out) (malloc'd; the caller frees
   * them), *ms the run's time.  Returns NF_OK or an error that ends the
   * step (out of memory, a broken context); the candidate's own failure
   * goes to *crc with why in err. */
  int (*canary)(struct nf_session *s, nf__kent *k, struct nf__op *op, void *kern, void **got,
                double *ms, int *crc, nf_buf *err);
  /* Waits for what was queued (NULL: runs are synchronous). */
  int (*sync)(struct nf_session *s);
  /* Copies n bytes at host (inside a buffer of the program) from the
   * device (pull) or to it (push); NULL: host memory is the device's. */
  int (*pull)(struct nf_session *s, const void *host, size_t n);
  int (*push)(struct nf_session *s, const void *host, size_t n);
  /* Entry k's kernel was replaced (NULL: nothing to do; the GPU drops the
   * graphs that launch the old one). */
  void (*swapped)(struct nf_session *s, nf__kent *k);
  /* Whether k's tier 0 is a tuned library (OpenBLAS; cuBLAS, cuDNN),
   * which a new kernel always races, and its name for messages. */
  int (*lib_tier0)(const struct nf_session *s, const nf__kent *k);
  const char *(*tier0_name)(const struct nf_session *s, const nf__kent *k);
  /* Whether this run's per-entry times are real (NULL: always). */
  int (*timed)(const struct nf_session *s);
  /* Frees the device's state and puts the CPU's table back (NULL: no
   * state); called when the session ends. */
  void (*close)(struct nf_session *s);
  /* For data-parallel sessions (dist.c; NULL on the CPU): the CUDA
   * runtime; the device address of a host buffer's mirror (0: none); fn's
   * device work queued after op and ops[0..n), wherever they ran, op's
   * event recorded again after it (so that what waits for op waits for
   * fn's work). */
  struct nf_cuda_rt *(*cuda_rt)(const struct nf_session *s);
  uint64_t (*addr)(const struct nf_session *s, const void *host, size_t n);
  int (*after_ops)(struct nf_session *s, int op, const int *ops, int n,
                   int (*fn)(void *ctx, nf_buf *err), void *ctx);
  /* 1: the host's CPU itself.  Its kernels and tier 0 share the cores, so
   * speed verdicts (per thread count, verify.c) are recorded and reused,
   * the daemon is asked for a faster kernel than one that lost to tier 0,
   * and the first step may wait for a kernel on its way rather than run
   * the interpreter.  0 (a GPU): none of these (a verdict would depend on
   * the GPU and on which library was there; the GPU's own generator makes
   * tier-0 kernels within seconds). */
  int host;
  /* 1: a kernel not clearly faster than a tier 0 that is not a library
   * races it too (the CPU's interpreter); 0: a kernel is kept over such
   * a tier 0 (the GPU's runs on the host, its data moved each time). */
  int race_host;
} nf__device;

extern const nf__device nf__cpu_device;
extern const nf__device nf__cuda_device;

struct nf__ktable {
  int n_kents;
  nf__kent *kents;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* a kernel arrived, or the link's state changed */
  const nf__device *dev;  /* nf__cpu_device unless a GPU was opened */
  void *dev_ctx;          /* the device's state (the GPU's struct nf__gpu) */
  nf__slog *log;          /* the session's messages */
  int connected;          /* under mu */
  int link_first;         /* under mu: the first connection is still being
                             tried (a daemon may be starting) */
  int64_t connects;       /* under mu */
  int64_t link_rejected;  /* under mu: refused by the link (digest, key, load) */
};

/* ktable.c: the kernel table's mailbox.  Producers on any thread (the
 * link, the GPU generator, tests) offer a kernel binary for entry k: the
 * digest and key checks, then the device's (kt->dev->accept: the ELF
 * image and the kernel ABI, or the CUDA bundle's plan and architecture);
 * what passes waits in the entry's mailbox (a later offer replaces it,
 * except that a tier-0 kernel generated here never replaces one of the
 * daemon's waiting there).  key NULL: no key check (tests).  time_ms: the daemon's
 * measurement (0: none).  NF_OK or the reason (logged, counted). */
int nf__kt_offer(nf__ktable *kt, int k, const void *bin, size_t len, const uint8_t sha256[32],
                 const uint8_t key[32], int tier, double time_ms);
/* At a step boundary, with kt->mu held: what waits in entry k's mailbox
 * (NULL: nothing), its tier, digest and time copied to k's candidate
 * fields, the mailbox emptied. */
void *nf__kt_take_locked(nf__ktable *kt, nf__kent *k);
/* Where entry k runs now, for people: "canary", "tier 2", "tier 1",
 * "generated", or its tier 0's name (the profile, the report). */
const char *nf__kent_runs_on(const nf__ktable *kt, const struct nf_session *s, const nf__kent *k);

#endif
