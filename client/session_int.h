/* session_int.h - the training session's internals, shared by the files
 * that run on the program's thread: session.c (opening, steps, the API),
 * model.c, build.c (the step program), kt_run.c (the step loop, the
 * canary and the races, for every device), the devices (device_cpu.c,
 * gpu_session.c), tier0.c, verify.c, init.c, params_io.c, net.c.  The producers of kernels (dlink.c, gpu_local.c)
 * and the mailbox (ktable.c) see only the kernel table (nf_ktable.h).
 *
 * Threads: the program's thread runs steps and is the only one that
 * touches slots, ops and the kernels in use (kent.cur, kent.cand).  The
 * producers write only the fields marked "under mu" (the table's) and
 * hand a kernel over through the entry's mailbox (kent.in_obj).  Kernels
 * are taken at the start of each step and evaluation (nf__kt_boundary;
 * the first step's waits take one too) and swapped in by their canary; a
 * replaced
 * CPU kernel's code stays loaded (nf_kernel_free never unloads), and a
 * replaced GPU module is freed only after the graphs that launch it, so no
 * call can run freed code. */
#ifndef NF_SESSION_INT_H
#define NF_SESSION_INT_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "neoflow/neoflow.h"
#include "nf_buf.h"
#include "nf_clock.h"
#include "nf_runtime.h"
#include "nf_gemm.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_partition.h"
#include "nf_dlink.h"
#include "nf_dist.h"
#include "nf_gpugen.h"
#include "nf_ktable.h"
#include "nf_slog.h"
#include "nf_trust.h"

struct nf__gpu;
struct nf__gen;

struct nf_model {
  nf_module *mod;
};

/* A buffer of the step program. */
typedef struct nf__slot {
  void *ptr;
  int64_t bytes;
  uint8_t dtype;
  uint8_t rank;
  int64_t shape[8];
} nf__slot;

/* One subgraph run. */
typedef struct nf__op {
  int kent;
  const nf_graph *g;
  uint32_t n_in, n_out;
  int *slots;           /* n_in + n_out slot indices */
  void **bufs;          /* their pointers (fixed once memory is planned) */
  int alias;            /* outputs overwrite inputs (the update op) */
} nf__op;

/* A named tensor the program can read or write. */
typedef struct nf__named {
  char *name;
  int slot;
} nf__named;

typedef struct nf__param {
  char *name;
  uint8_t dtype, rank;
  int64_t shape[8];
  int64_t numel;
  int64_t offset;       /* in elements, into the flat vectors */
  nf_init init;
  float *init_data;     /* NF_INIT_FN_BUFFER: a copy */
} nf__param;

struct nf_session {
  nf_buf err;
  nf_session_opts opts;
  char *daemon_addr;
  char *daemon_key;   /* TCP key file (opts.daemon_key), NULL: the config's */
  nf_trust trust;     /* whom the link takes kernels from (nf_trust.h) */
  int trust_bad;      /* the configuration is unsafe: no daemon at all */
  char *device;          /* opts.device, copied */
  nf_ir_ctx *ctx;
  /* parameters, flat */
  int n_params;
  nf__param *params;
  int64_t n_flat;       /* padded total elements */
  float *P, *G, *M, *V; /* flat vectors (M, V: optimizer state; V also SGD momentum) */
  float hp[8];
  /* program */
  int n_slots;
  nf__slot *slots;
  int n_ops;
  nf__op *ops;
  nf__ktable kt;         /* the kernel entries and their mailboxes (nf_ktable.h) */
  void *arena;
  int64_t arena_bytes;
  int n_inputs;          /* data inputs fed by the program */
  nf__named *inputs;
  int n_named;           /* readable: loss, outputs, grads, inputs */
  nf__named *named;
  int loss_slot;
  int n_fwd;             /* slots of the loss and the def's other outputs */
  int *fwd_slots;
  uint8_t *eval_op;      /* ops nf_session_eval runs (NULL: not computed yet) */
  nf_partition *part_step, *part_upd;
  /* A function program (nf_operator, op.c; nf__session_build_fn) instead
   * of a training step: its ops [0, fn_fwd_ops) compute the def's outputs
   * from its inputs, the rest its inputs' gradients from the outputs'
   * (part_upd then holds the gradient graph's partition).  Slots per
   * input, output, output seed, and input gradient (-1: not a float
   * input); fn_n_in 0 for a training session. */
  int fn_n_in, fn_n_out, fn_fwd_ops;
  int *fn_in, *fn_out, *fn_seed, *fn_grad;
  uint8_t *fn_saved_out; /* per output: the gradient reads it (saved) */
  int fn_n_saved;        /* forward values the gradient reads (0: it reads
                            only the inputs and the seeds) */
  char *fn_nograd;       /* why there is no gradient program, or NULL */
  struct nf__gpu *gpu;   /* NULL: the step runs on the CPU */
  struct nf__gen *gen;   /* GPU sessions: the thread generating tier-0 kernels
                            (gpu_local.c), or NULL */
  nf_pool *pool;
  int threads;
  /* steps */
  int64_t step;
  uint64_t run_seq;     /* steps and evaluations started (gather sharing) */
  int64_t prof_steps;    /* steps summed in kents[].prof_ms */
  double last_loss, last_ms, ms_hist[10];
  double t_start, first_step_ms;
  double interp_rate;    /* flops per ms of the interpreter, measured on the host */
  double first_wait_left; /* ms the first step may still wait beyond estimates */
  double cold_wait_left; /* ms a session may still wait for never-verified kernels */
  int64_t rejected, swaps, trusted;
  int64_t remembered;    /* trusted kernels whose speed verdict was on record */
  /* kernels (key, SHA-256) that passed a canary on this machine before
   * (verify.c): they are swapped in without one */
  char *verified_path;   /* NULL: not kept */
  int n_verified;
  uint8_t (*verified)[64];
  /* speed verdicts of kernels against tier 0 on this machine (verify.c) */
  int n_verdicts;
  struct nf__verdict *verdicts;
  /* the link */
  struct nf__dlink *link; /* the daemon link (nf_dlink.h), or NULL */
  struct nf__dist *dist;  /* the data-parallel job (nf_dist.h), or NULL: alone */
  struct nf__report *rep; /* the training report's history (report.c), or NULL */
  nf__slog log;          /* messages for the program's log callback */
};

/* model.c: "what: msg" (or msg) malloc'd for an API's *err; the same
 * stored in *err when err is not NULL. */
char *nf__session_err_dup(const char *what, const char *msg);
void nf__session_err_set(char **err, const char *what, const char *msg);

/* build.c: the step program of s (slots, ops, kernel entries, the memory
 * plan) for forward graph F: loss, gradients (and those of the inputs
 * gin), the optimizer's update, and the outputs extra.  Messages in err. */
int nf__session_build(nf_session *s, const nf_graph *F, int n_gin, const char *const *gin,
                      int n_extra, const char *const *extra, nf_buf *err);
/* build.c: the function program of s (see fn_n_in above) for graph F:
 * F partitioned, then the gradient graph of F with respect to its float
 * inputs (seeded by one input per output), partitioned; the forward
 * values the gradient reads are kept from the forward's run (outputs of
 * the forward part, in owned buffers) rather than recomputed; f32, f64,
 * i32, i64 and bool tensors.  Messages in err. */
int nf__session_build_fn(nf_session *s, const nf_graph *F, nf_buf *err);
/* build.c: names to slots and parameters (-1: none); whether F has an
 * input called name; appending a name (NF_OK or NF_ENOMEM). */
int nf__session_find_named(const nf__named *arr, int n, const char *name);
int nf__session_find_param(const nf_session *s, const char *name);
int nf__session_is_input(const nf_graph *F, const char *name);
int nf__session_named_add(nf__named **arr, int *n, const char *name, int slot);

/* kt_run.c, the one step loop for every device (through s->kt.dev): at a
 * step boundary, what waits in each entry's mailbox becomes its
 * candidate (loaded by the device; a kernel generated here that arrives
 * after the daemon's is dropped); then each op marked by mask (NULL:
 * all) runs through its entry: the candidate's canary, a race against
 * tier 0, the verified kernel, or tier 0.  A device may wrap the loop
 * (nf__device.run_ops).  step: the run is a training step (a
 * data-parallel session's ranks then agree on the candidates, nf_dist.h),
 * else an evaluation or a function program's run. */
void nf__kt_boundary(nf_session *s, int step);
int nf__kt_run_ops(nf_session *s, const uint8_t *mask);

/* The device's transfers (nf__device.pull, push): no-ops where the host's
 * memory is the device's. */
static inline int nf__dev_pull(nf_session *s, const void *host, size_t n) {
  return s->kt.dev->pull ? s->kt.dev->pull(s, host, n) : NF_OK;
}
static inline int nf__dev_push(nf_session *s, const void *host, size_t n) {
  return s->kt.dev->push ? s->kt.dev->push(s, host, n) : NF_OK;
}

/* session.c: a session training F (in ctx, which the session takes over)
 * with the `param` declarations of F->name in m, the gradients of the
 * inputs gin also formed, and the outputs extra also computed. */
nf_session *nf__session_new_graph(nf_model *m, nf_graph *F, nf_ir_ctx *ctx,
                                  const nf_session_opts *o, int n_gin, const char *const *gin,
                                  int n_extra, const char *const *extra, char **err);



/* session.c: a session running F (in ctx, which it takes over) as a
 * function program (nf__session_build_fn): no parameters, no optimizer;
 * the daemon link, trust and device as for training. */
nf_session *nf__session_new_fn(nf_graph *F, nf_ir_ctx *ctx, const nf_session_opts *o,
                               char **err);
/* session.c: marks in mask (n_ops entries, cleared first) the ops among
 * [lo, hi) that the slots want[0..n) need, walking the program back from
 * them. */
void nf__session_ops_for(const nf_session *s, const int *want, int n, int lo, int hi,
                         uint8_t *mask);
/* session.c: one run of a function program's ops marked by mask, counted
 * and timed as a step (nf_session_stats). */
int nf__session_run_fn(nf_session *s, const uint8_t *mask);

/* session.c: the time per kernel entry (neoflow train --profile): prints
 * one line per entry, slowest first, over the steps since the last call
 * (reset: from now on). */
void nf__session_profile(nf_session *s, FILE *f, int reset);

/* tier0.c, for both devices: tier 0 of entry k on host buffers (OpenBLAS
 * where k->gemm, sharing a peer's gathered operand within one run, else
 * the interpreter), and the canary's comparison of output out (a against
 * the reference ref; *worst gets the largest relative error seen). */
int nf__tier0_run(nf_session *s, nf__kent *k, const nf__op *op, void *const *bufs, nf_buf *err);
int nf__canary_output_ok(const nf_graph *g, uint32_t out, const void *a, const void *ref,
                         double *worst);
/* tier0.c, the canary's verdict for both devices: 1 when the candidate ran
 * (crc NF_OK) and each of its outputs got[0..n_out) (on the host) agrees
 * with op's buffers (the reference); else the rejection is logged
 * ("<what> <key> (tier T) rejected: ..." with err's text when it failed)
 * and counted in s->rejected, and 0. */
int nf__canary_verdict(nf_session *s, const nf__kent *k, const nf__op *op, void *const *got,
                       int crc, const nf_buf *err, const char *what);

/* gpu_session.c: training on a GPU (docs/gpu.md), the CUDA device of the
 * table (nf__cuda_device).  The step program is the same; its buffers
 * live in device memory (planned once, like the CPU's), host copies are
 * refreshed on demand (nf__dev_pull); an entry runs its CUDA module, or
 * tier 0 through cuBLAS, cuDNN or on the host.  The accessors below
 * answer 0 when s->gpu is NULL. */
/* Opens opts.device (or $NEOFLOW_DEVICE) when it names a GPU ("cuda",
 * "cuda:N") and makes s->kt.dev the CUDA device; without a usable one,
 * warns and leaves the session on the CPU.  NF_EINVAL for a device string
 * it does not know. */
int nf__gpu_open(nf_session *s);
/* Runs replayed from a CUDA graph, and graphs captured, so far. */
int64_t nf__gpu_graph_runs(const nf_session *s, int *captures);
/* The entries cuBLAS runs at tier 0 (0 without cuBLAS). */
int nf__gpu_blas_entries(const nf_session *s);
/* The entries cuDNN runs at tier 0 (0 without cuDNN). */
int nf__gpu_dnn_entries(const nf_session *s);
/* How many streams modules ran on during the last step (or evaluation). */
int nf__gpu_streams_used(const nf_session *s);

/* report.c: the training report (nf_session_report_to).  A step ended
 * (its point of the history; the page rewritten every period when a path
 * is set); a kernel was swapped in; the page written to path; freed. */
void nf__report_step(nf_session *s);
void nf__report_swap(nf_session *s, const nf__kent *k);
int nf__report_write(nf_session *s, const char *path, const nf_session_stats *st, nf_buf *err);
void nf__report_free(nf_session *s);
int nf__report_has_path(const nf_session *s);
/* The path when the period has passed since the last write (and the
 * clock restarted), else NULL; the path set (NULL: none); 1 the first
 * time a failure is to be said (once per session). */
const char *nf__report_due(nf_session *s);
const char *nf__report_path(const nf_session *s);
int nf__report_warn_once(nf_session *s);


/* gpu_local.c: nf_gpugen.h */

/* verify.c */
void nf__verified_load(nf_session *s);
int nf__verified_has(const nf_session *s, const uint8_t key[32], const uint8_t *sha);
void nf__verified_add(nf_session *s, const uint8_t key[32], const uint8_t sha[32]);

/* A kernel's speed against the tier 0 it would replace, measured on this
 * machine at a thread count (verify.c). */
typedef struct nf__verdict {
  uint8_t key[32], sha[32];
  int threads;
  unsigned flags;     /* NF__VERDICT_* */
  double kernel_ms;   /* per run */
  double tier0_ms;
} nf__verdict;
enum {
  NF__VERDICT_RACED = 1,    /* from alternating runs (else from one canary) */
  NF__VERDICT_ESTIMATE = 2, /* tier0_ms estimated from the interpreter's rate */
  NF__VERDICT_SLOWER = 4,   /* the kernel lost: tier 0 is kept */
  NF__VERDICT_BUSY = 8,     /* made while the daemon worked for the session
                               (on the same cores): a loss is raced again */
};
void nf__verdicts_load(nf_session *s);
/* The latest verdict for (key, sha) at the session's thread count, or NULL. */
const nf__verdict *nf__verdict_get(const nf_session *s, const uint8_t key[32],
                                   const uint8_t sha[32]);
void nf__verdict_put(nf_session *s, const uint8_t key[32], const uint8_t sha[32],
                     double kernel_ms, double tier0_ms, unsigned flags);

/* init.c: fills numel floats of a parameter of the given shape. */
int nf__init_fill(const nf_init *in, int rank, const int64_t *shape, uint64_t seed,
                  const char *name, float *out, nf_buf *err);

/* params_io.c */
int nf__params_save(nf_session *s, const char *path);
int nf__params_load(nf_session *s, const char *path);

#endif
