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
 *      reference is; with bounds, each element's error beyond its bound
 *      counts, and an element whose bound is infinite is not judged): a
 *      wrong answer is recorded and never timed;
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
 * independent.  The worker dies with the *thread* that started it
 * (PR_SET_PDEATHSIG), so create a measurer on a thread that outlives its
 * use.  The process must not reap children it did not start
 * (waitpid(-1), SIGCHLD set to SIG_IGN): the worker's exit status is how
 * a crash is explained.  SIGPIPE needs no special setup (measure.c). */
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
  const double *const *bound;       /* NULL, or n_outputs arrays (an array
                                       may be NULL: zeros): how far from
                                       each expected value a correct kernel
                                       may be (nf_interp_run_bounded).
                                       Only the error beyond it counts;
                                       +inf: undetermined, not judged */
  double rtol; /* relative L2 error allowed per output; 0: 1e-4 */
} nf_measure_problem;

typedef struct nf_measure_opts {
  const char *worker_path; /* NULL: $NEOFLOW_WORKER, else neoflow-worker in
                              the build tree, else the installed one */
  int n_threads;           /* threads of the worker's pool; < 1: 1 */
  unsigned timeout_ms;     /* wall time per candidate; 0: 10000 */
  uint64_t mem_limit;      /* worker address space in bytes; 0: automatic
                              (data size x 4 + 1 GiB + 64 MiB per thread;
                              data: inputs, their rotated copies with
                              outputs, expected values) */
  double min_time_ms;      /* timing: repeat for at least this; 0: 40 */
  int warmup;              /* warm-up runs; 0: 1 */
  int max_repeat;          /* most timed runs; 0: 200 */
  uint64_t rotate_bytes;   /* input copies span at least this (at most 8
                              copies); 0: 32 MiB */
  int gpu;                 /* 1: candidates are CUDA kernel bundles, run on
                              GPU gpu_device by a worker that owns its CUDA
                              context (worker.c, "GPU mode"); mem_limit is
                              then not applied */
  int gpu_device;
  int gpu_sm;              /* > 0: the device must be of this architecture */
  const char *gpu_name;    /* non-NULL: the device must have this name (the
                              worker refuses to start on another: kernels
                              tuned there would be keyed for this one) */
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
/* Candidates measured after this call whose check run or first timed run
 * takes longer than ms (> 0) are timed once: n_runs 1, that run's time.
 * The search sets a multiple of its best time, so a clearly slow
 * candidate costs one run instead of a full timing.  0 (the default):
 * no cutoff. */
void nf_measurer_set_cutoff(nf_measurer *m, double ms);
/* The current worker's pid, or -1 when none runs (tests). */
int nf_measurer_worker_pid(const nf_measurer *m);
/* Stops the worker (asks it to exit, kills it after a moment) and reaps
 * it.  NULL is ignored. */
void nf_measurer_free(nf_measurer *m);
const char *nf_measure_status_name(int status);

/* ---- the worker protocol (internal: shared by measure.c and worker.c
 * only; nothing else speaks it) ----
 * Frames both ways over the worker's stdin and stdout: a 16-byte header
 * {u32 type, u32 zero, u64 length} in host byte order (both ends run on
 * one machine), then length payload bytes.  Each end checks the type
 * against what it expects next and the length against the type's cap
 * before allocating or reading the payload; anything else ends the
 * conversation (the worker exits with status 2, the measurer kills it).
 *   parent -> worker: PROBLEM (version, counts, options, tensors), then
 *     one DATA per input (its dense bytes) and one per output (the
 *     expected values as f64), then with flag BOUNDS one DATA per output
 *     (the bounds as f64); then any number of CANDIDATE (the shared
 *     object's bytes) and finally EXIT.
 *   worker -> parent: READY after the problem, one RESULT per candidate
 *     (i32 status, i32 n_runs, f64 median_ms, min_ms, max_rel_err, then
 *     the reason's bytes), or FAIL (a message) when it cannot go on.
 * The worker's argv carries what it needs before reading anything:
 * --parent=PID --mem-limit=BYTES --threads=N [--cuda=DEVICE
 * [--cuda-sm=SM] [--cuda-name=NAME]]. */
#define NF__MEAS_PROTO_VERSION 2u
enum {
  NF__MEAS_F_PROBLEM = 1,
  NF__MEAS_F_DATA = 2,
  NF__MEAS_F_CANDIDATE = 3,
  NF__MEAS_F_EXIT = 4,
  NF__MEAS_F_CUTOFF = 5, /* 8 bytes: a double, the cutoff in ms (0: none) */
  NF__MEAS_F_READY = 16,
  NF__MEAS_F_RESULT = 17,
  NF__MEAS_F_FAIL = 18
};
#define NF__MEAS_HEADER_BYTES 16u
#define NF__MEAS_MAX_TENSORS 1024u            /* inputs + outputs */
#define NF__MEAS_MAX_ELEMS ((int64_t)1 << 40) /* per tensor */
#define NF__MEAS_MAX_SO ((uint64_t)256 << 20) /* candidate bytes */
#define NF__MEAS_MAX_MSG 1024u                /* FAIL message bytes */
#define NF__MEAS_MAX_REPEAT 100000            /* timed runs */
#define NF__MEAS_MAX_COPIES 8u                /* rotated input copies */
/* PROBLEM: u32 version, n_inputs, n_outputs, n_copies; i32 warmup,
 * max_repeat; f64 rtol, min_time_ms; u32 flags, u32 zero; per tensor u8
 * dtype, u8 rank and rank i64 dims. */
#define NF__MEAS_PROBLEM_FIXED 48u
#define NF__MEAS_PB_BOUNDS 1u /* flags: bounds follow the expected values */
/* RESULT: the fixed part, then up to 255 bytes of reason. */
#define NF__MEAS_RESULT_FIXED 32u

#endif
