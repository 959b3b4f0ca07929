/* nf_measure.h - sandboxed measurement of candidate kernels in worker
 * processes (daemon/search).
 *
 * A measurer owns one worker process (neoflow-worker, started with
 * posix_spawn + exec: never a fork of the threaded caller) for one
 * problem: the kernel's buffers (inputs then outputs, kernel ABI order),
 * one set of check inputs and the reference interpreter's results for
 * them.  For every candidate (a kernel shared object's bytes) the worker
 *   1. loads it (nf_kernel_load), poisons the outputs with NaN, runs it
 *      on the check inputs and compares every output with the reference
 *      (relative L2 error <= rtol, every element finite where the
 *      reference is): a wrong answer is recorded and never timed;
 *   2. times it: warm-up runs, then runs repeated until min_time_ms has
 *      passed (at least 3, at most max_repeat), each run on the next of
 *      several copies of the inputs (rotated, so caches do not flatter);
 *      the result is the median run time.
 * The worker limits its own address space (RLIMIT_AS), dies with its
 * parent (PR_SET_PDEATHSIG), and the measurer kills it (SIGKILL) when a
 * candidate takes longer than timeout_ms.  A worker that crashed, hung or
 * broke the protocol is reaped (no zombies) and a fresh one is started
 * for the next candidate, so one bad candidate never affects the next.
 *
 * Thread safety: one measurer per thread; different measurers are
 * independent. */
#ifndef NF_MEASURE_H
#define NF_MEASURE_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_ir.h"

typedef struct nf_measure_tensor {
  uint8_t dtype; /* nf_dtype: f32, f64, i32, i64, bool */
  uint8_t rank;
  int64_t shape[NF_MAX_RANK];
} nf_measure_tensor;

typedef struct nf_measure_problem {
  uint32_t n_inputs, n_outputs;
  const nf_measure_tensor *tensors; /* n_inputs + n_outputs, kernel order */
  const void *const *check_inputs;  /* n_inputs dense arrays, tensor dtype */
  const double *const *expected;    /* n_outputs arrays: the reference
                                       (f64 interpreter) for check_inputs */
  double rtol; /* relative L2 error allowed per output; 0: 1e-4 */
} nf_measure_problem;

typedef struct nf_measure_opts {
  const char *worker_path; /* NULL: $NEOFLOW_WORKER, else neoflow-worker in
                              the build tree, else the installed one */
  int n_threads;           /* threads of the worker's pool; < 1: 1 */
  unsigned timeout_ms;     /* wall time per candidate; 0: 10000 */
  uint64_t mem_limit;      /* worker address space in bytes; 0: automatic
                              (data size x 4 + 1 GiB) */
  double min_time_ms;      /* timing: repeat for at least this; 0: 40 */
  int warmup;              /* warm-up runs; 0: 1 */
  int max_repeat;          /* most timed runs; 0: 200 */
  uint64_t rotate_bytes;   /* input copies span at least this (at most 8
                              copies); 0: 32 MiB */
} nf_measure_opts;

typedef enum nf_measure_status {
  NF_MEAS_OK = 0,  /* correct and timed */
  NF_MEAS_WRONG,   /* wrong answer (or it wrote to its inputs) */
  NF_MEAS_CRASH,   /* the worker died while running it (signal, exit) */
  NF_MEAS_TIMEOUT, /* killed after timeout_ms */
  NF_MEAS_LOAD,    /* not loadable, or the kernel returned an error code */
  NF_MEAS_ERROR    /* the measurer failed (spawn, pipe): not the
                      candidate's fault; the candidate is unjudged */
} nf_measure_status;

typedef struct nf_measure_result {
  int status; /* nf_measure_status */
  double median_ms, min_ms; /* NF_MEAS_OK only */
  int n_runs;
  double max_rel_err; /* largest relative L2 error over the outputs */
  char reason[256];   /* failures: what happened ("killed by SIGSEGV",
                         "timed out after 2000 ms", "output 0 ...") */
} nf_measure_result;

typedef struct nf_measurer nf_measurer;

/* Copies the problem (the caller's arrays may be freed after) and starts
 * a worker.  NF_OK, NF_EINVAL (malformed problem), NF_EIO (the worker
 * could not be started: message in err) or NF_ENOMEM. */
int nf_measurer_new(const nf_measure_opts *o, const nf_measure_problem *pb,
                    nf_measurer **out, nf_buf *err);
/* Measures one candidate.  Returns NF_OK with *res filled (whatever the
 * candidate did), or NF_EIO when no worker could be started (res->status
 * is then NF_MEAS_ERROR). */
int nf_measure(nf_measurer *m, const void *so, size_t n, nf_measure_result *res);
/* The current worker's pid, or -1 when none runs (tests). */
int nf_measurer_worker_pid(const nf_measurer *m);
/* Stops the worker (asks it to exit, kills it after a moment) and reaps
 * it.  NULL is ignored. */
void nf_measurer_free(nf_measurer *m);
const char *nf_measure_status_name(int status);

#endif
