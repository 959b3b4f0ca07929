/* worker.c - neoflow-worker: loads, checks and times candidate kernels for
 * one measurer (daemon/search/measure.c), one candidate at a time.
 *
 * Started by posix_spawn with stdin and stdout as the protocol pipes
 * (nf_measure.h, "the worker protocol") and stderr as a pipe the
 * measurer keeps the tail of.  At start it moves the protocol to private
 * descriptors and points fds 0 and 1 at /dev/null and stderr, so a
 * candidate that reads stdin or prints cannot break the framing; asks to
 * be SIGKILLed when its parent dies (PR_SET_PDEATHSIG, then checks that
 * the parent did not die before: getppid); sets RLIMIT_CORE = 0 and
 * RLIMIT_AS = --mem-limit.
 *
 * Input is validated like a peer's: every frame's type and length are
 * checked against what may come next and against per-type caps before
 * anything is allocated; sizes are computed with overflow checks.  A
 * violation prints a line on stderr and exits with status 2.
 *
 * Buffers: the pristine check inputs (never given to a kernel), n_copies
 * copies of inputs + outputs (64-byte aligned) which timing runs rotate
 * through, the expected outputs (f64) and, when the problem has them,
 * their bounds.  Per candidate: load; poison
 * copy 0's outputs (NaN for floats, 0xA5 bytes for ints and bools); run
 * on copy 0; compare each output (relative L2 error of what lies beyond
 * each element's bound, non-finite values where the reference is finite
 * are wrong, elements of infinite bound are not judged); check copy 0's inputs are
 * untouched; then warm up and time; check every copy's inputs again
 * (restoring any that changed); unload (dlclose: nothing else runs
 * kernels here), so memory does not grow with the number of candidates.
 *
 * Limits: under AddressSanitizer RLIMIT_AS is not set (ASan reserves
 * terabytes of shadow address space, any sane limit breaks it) and ASan's
 * own SIGSEGV/SIGBUS/SIGFPE/SIGILL handlers are turned off so a crashing
 * candidate dies by its signal as in a normal build.  A kernel can still
 * corrupt this process's memory before it is caught; the measurer treats
 * anything odd on the pipe as a crash.  Timeouts are the measurer's job.
 *
 * GPU mode (--cuda=N, nf_measure_opts.gpu): the candidates are CUDA
 * kernel bundles (nf_cuda_plan.h) and this process owns the CUDA context
 * of device N (the daemon's processes never create one); before anything
 * else it runs the health probe (nf_cuda_rt_probe), and exits if the
 * device fails it.  Every copy's buffers get device twins, uploaded once;
 * a candidate is loaded as a module, its check run's outputs and inputs
 * are downloaded and checked as above, and each timed run is the
 * device's time between two CUDA events around its launches.  No
 * RLIMIT_AS then (the driver maps large address ranges).
 *
 * One measurement loop serves both: it runs against the device interface
 * (common/runtime/nf_device.h), whose CPU device takes the host buffers as
 * its own (no copies) and times a run by the wall clock.
 * A sticky CUDA error (an illegal address, a failed launch) leaves the
 * context unusable: the worker prints the error and exits with status 3,
 * which the measurer reports as a crash of that candidate and answers
 * with a fresh worker. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "nf_cuda_rt.h"
#include "nf_device.h"
#include "nf_runtime.h"
#include "nf_ir.h"
#include "nf_measure.h"

#if defined(__SANITIZE_ADDRESS__)
#define NF_WORKER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NF_WORKER_ASAN 1
#endif
#endif
#ifndef NF_WORKER_ASAN
#define NF_WORKER_ASAN 0
#endif

#if NF_WORKER_ASAN
/* Read by the ASan runtime at start-up (ASAN_OPTIONS still overrides):
 * let a candidate's fault kill the worker with its signal, which the
 * measurer reports, instead of ASan's report and exit status 1. */
__attribute__((visibility("default"), used)) const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0";
}
#endif

static int proto_in = -1, proto_out = -1;

static _Noreturn void die(int code, const char *fmt, ...) NF_PRINTF(2, 3);
static _Noreturn void die(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("neoflow-worker: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(code);
}

/* ---- frames ---- */

static int read_full(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static void write_full(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die(1, "writing to the measurer failed: %s", strerror(errno));
    c += w;
    n -= (size_t)w;
  }
}

static void send_frame(uint32_t type, const void *payload, size_t n) {
  unsigned char h[NF__MEAS_HEADER_BYTES];
  uint32_t zero = 0;
  uint64_t len = n;
  memcpy(h, &type, 4);
  memcpy(h + 4, &zero, 4);
  memcpy(h + 8, &len, 8);
  write_full(proto_out, h, sizeof h);
  if (n) write_full(proto_out, payload, n);
}

/* Reports a failure the worker cannot recover from and exits. */
static _Noreturn void fail(const char *fmt, ...) NF_PRINTF(1, 2);
static _Noreturn void fail(const char *fmt, ...) {
  char msg[NF__MEAS_MAX_MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  send_frame(NF__MEAS_F_FAIL, msg, strlen(msg));
  die(1, "%s", msg);
}

/* Reads a header; EOF before it returns 0 (the measurer went away). */
static int recv_header(uint32_t *type, uint64_t *len) {
  unsigned char h[NF__MEAS_HEADER_BYTES];
  uint32_t zero;
  if (read_full(proto_in, h, sizeof h)) return 0;
  memcpy(type, h, 4);
  memcpy(&zero, h + 4, 4);
  memcpy(len, h + 8, 8);
  if (zero) die(2, "protocol: malformed frame header");
  return 1;
}

static void recv_payload(void *p, uint64_t len) {
  if (read_full(proto_in, p, (size_t)len)) die(2, "protocol: truncated frame");
}

/* ---- the problem ---- */

typedef struct tensor {
  nf_dtype dtype;
  int64_t n_elem;
  size_t bytes;
} tensor;

static struct {
  uint32_t n_in, n_out, n_copies;
  int warmup, max_repeat;
  double rtol, min_time_ms;
  double cutoff_ms; /* CUTOFF frame: time a slower candidate once (0: none) */
  tensor *t;            /* n_in + n_out */
  void **pristine;      /* n_in: the check inputs, never run on */
  double **expected;    /* n_out */
  double **bound;       /* n_out, or NULL (the PROBLEM's flags) */
  void ***bufs;         /* n_copies arrays of n_in + n_out buffers */
  double *times;        /* max_repeat */
  nf_pool *pool;
} P;

/* GPU mode */
static int g_cuda = -1;  /* the device, or -1: CPU kernels */
static int g_want_sm;    /* --cuda-sm: the device must be this (0: any) */
static const char *g_want_name; /* --cuda-name: ... and have this name */
static nf_cuda_rt *g_rt;
static nf_device *g_dev;    /* where candidates run (dev_setup) */
static uint64_t **g_dbufs; /* n_copies arrays of n_in + n_out device buffers
                              (on the CPU: the host buffers, P.bufs) */

static void *alloc64(size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64;
  return aligned_alloc(64, n ? n : 64);
}

typedef struct cursor {
  const unsigned char *p;
  size_t left;
} cursor;

static void take(cursor *c, void *out, size_t n) {
  if (c->left < n) die(2, "protocol: PROBLEM frame too short");
  memcpy(out, c->p, n);
  c->p += n;
  c->left -= n;
}

/* Opens the device (the CPU, or --cuda's GPU after its health probe) and
 * gives every copy its device twins: on the CPU the host buffers
 * themselves, on a GPU device memory holding the check inputs. */
static void dev_setup(void) {
  nf_buf why = NF_BUF_INIT;
  uint32_t n_t = P.n_in + P.n_out;
  g_dbufs = calloc(P.n_copies, sizeof *g_dbufs);
  if (!g_dbufs) fail("out of memory");
  if (g_cuda < 0) {
    /* candidates are measured once and dropped: their code is unloaded */
    if (nf_device_open_cpu(P.pool, 1, &g_dev) != NF_OK) fail("out of memory");
    for (uint32_t k = 0; k < P.n_copies; k++) {
      if (!(g_dbufs[k] = calloc(n_t + 1, sizeof **g_dbufs))) fail("out of memory");
      for (uint32_t i = 0; i < n_t; i++) g_dbufs[k][i] = (uint64_t)(uintptr_t)P.bufs[k][i];
    }
    return;
  }
  if (nf_cuda_rt_open(g_cuda, &g_rt, &why) != NF_OK) fail("GPU %d: %s", g_cuda, nf_buf_str(&why));
  int sm = nf_cuda_rt_sm(g_rt);
  const char *name = nf_cuda_rt_name(g_rt);
  if ((g_want_sm && sm != g_want_sm) || (g_want_name && strcmp(name, g_want_name) != 0))
    fail("GPU %d is %s (sm_%d), not the %s (sm_%d) the kernels are tuned for", g_cuda, name, sm,
         g_want_name ? g_want_name : "device", g_want_sm ? g_want_sm : sm);
  /* a fresh context must compute a known kernel right before candidates
   * run on it (a device a sticky error left broken fails here) */
  if (nf_cuda_rt_probe(g_rt, &why) != NF_OK)
    fail("GPU %d failed its health probe: %s", g_cuda, nf_buf_str(&why));
  if (nf_device_open_cuda(g_rt, &g_dev) != NF_OK) fail("out of memory");
  for (uint32_t k = 0; k < P.n_copies; k++) {
    if (!(g_dbufs[k] = calloc(n_t + 1, sizeof **g_dbufs))) fail("out of memory");
    for (uint32_t i = 0; i < n_t; i++) {
      /* at least one byte: a zero-size tensor still needs an address */
      size_t b = P.t[i].bytes ? P.t[i].bytes : 1;
      if (nf_device_alloc(g_dev, b, &g_dbufs[k][i], &why) != NF_OK ||
          (i < P.n_in &&
           nf_device_upload(g_dev, g_dbufs[k][i], P.pristine[i], P.t[i].bytes, &why) != NF_OK))
        fail("GPU %d: device memory for copy %u of tensor %u: %s", g_cuda, k, i,
             nf_buf_str(&why));
    }
  }
  if (nf_device_sync(g_dev, &why) != NF_OK) fail("GPU %d: %s", g_cuda, nf_buf_str(&why));
  nf_buf_free(&why);
}

static void read_problem(void) {
  uint32_t type;
  uint64_t len;
  if (!recv_header(&type, &len)) exit(0);
  uint64_t cap = NF__MEAS_PROBLEM_FIXED + (uint64_t)NF__MEAS_MAX_TENSORS * (2 + 8 * NF_MAX_RANK);
  if (type != NF__MEAS_F_PROBLEM) die(2, "protocol: expected PROBLEM, got frame type %u", type);
  if (len < NF__MEAS_PROBLEM_FIXED || len > cap)
    die(2, "protocol: PROBLEM frame of %" PRIu64 " bytes", len);
  unsigned char *buf = malloc((size_t)len);
  if (!buf) fail("out of memory reading the problem");
  recv_payload(buf, len);
  cursor c = {buf, (size_t)len};
  uint32_t version;
  take(&c, &version, 4);
  if (version != NF__MEAS_PROTO_VERSION)
    fail("protocol version %u, this worker speaks %u", version, NF__MEAS_PROTO_VERSION);
  take(&c, &P.n_in, 4);
  take(&c, &P.n_out, 4);
  take(&c, &P.n_copies, 4);
  int32_t i32;
  take(&c, &i32, 4);
  P.warmup = i32;
  take(&c, &i32, 4);
  P.max_repeat = i32;
  take(&c, &P.rtol, 8);
  take(&c, &P.min_time_ms, 8);
  uint32_t flags, zero;
  take(&c, &flags, 4);
  take(&c, &zero, 4);
  if ((flags & ~NF__MEAS_PB_BOUNDS) || zero) die(2, "protocol: PROBLEM flags 0x%x, 0x%x", flags, zero);
  if (P.n_out == 0 || P.n_in > NF__MEAS_MAX_TENSORS || P.n_out > NF__MEAS_MAX_TENSORS - P.n_in)
    die(2, "protocol: %u inputs and %u outputs", P.n_in, P.n_out);
  if (P.n_copies < 1 || P.n_copies > NF__MEAS_MAX_COPIES) die(2, "protocol: %u copies", P.n_copies);
  if (P.warmup < 0 || P.warmup > NF__MEAS_MAX_REPEAT || P.max_repeat < 3 ||
      P.max_repeat > NF__MEAS_MAX_REPEAT)
    die(2, "protocol: warmup %d, max_repeat %d", P.warmup, P.max_repeat);
  if (!(P.rtol >= 0 && P.rtol < INFINITY) || !(P.min_time_ms >= 0 && P.min_time_ms < 1e9))
    die(2, "protocol: rtol %g, min_time_ms %g", P.rtol, P.min_time_ms);
  uint32_t n_t = P.n_in + P.n_out;
  P.t = calloc(n_t, sizeof *P.t);
  if (!P.t) fail("out of memory");
  for (uint32_t i = 0; i < n_t; i++) {
    uint8_t dt, rank;
    take(&c, &dt, 1);
    take(&c, &rank, 1);
    if ((dt != NF_F32 && dt != NF_F64 && dt != NF_I32 && dt != NF_I64 && dt != NF_BOOL) ||
        rank > NF_MAX_RANK)
      die(2, "protocol: tensor %u: dtype %u, rank %u", i, dt, rank);
    int64_t n_elem = 1;
    for (unsigned d = 0; d < rank; d++) {
      int64_t dim;
      take(&c, &dim, 8);
      if (dim < 0 || (dim && n_elem > NF__MEAS_MAX_ELEMS / dim))
        die(2, "protocol: tensor %u: bad or too large shape", i);
      n_elem *= dim;
    }
    P.t[i].dtype = (nf_dtype)dt;
    P.t[i].n_elem = n_elem;
    P.t[i].bytes = (size_t)n_elem * nf_dtype_size((nf_dtype)dt);
  }
  if (c.left) die(2, "protocol: %zu stray bytes after the PROBLEM frame", c.left);
  free(buf);

  /* the data: inputs, then the expected outputs as f64, then their bounds */
  P.pristine = calloc(P.n_in ? P.n_in : 1, sizeof *P.pristine);
  P.expected = calloc(P.n_out, sizeof *P.expected);
  if (flags & NF__MEAS_PB_BOUNDS) P.bound = calloc(P.n_out, sizeof *P.bound);
  P.bufs = calloc(P.n_copies, sizeof *P.bufs);
  P.times = malloc((size_t)P.max_repeat * sizeof *P.times);
  if (!P.pristine || !P.expected || !P.bufs || !P.times ||
      ((flags & NF__MEAS_PB_BOUNDS) && !P.bound))
    fail("out of memory");
  uint32_t n_data = n_t + (P.bound ? P.n_out : 0);
  for (uint32_t i = 0; i < n_data; i++) {
    int is_in = i < P.n_in;
    uint32_t o = i < n_t ? i - P.n_in : i - n_t; /* the output, for i >= n_in */
    uint64_t want = is_in ? P.t[i].bytes : (uint64_t)P.t[P.n_in + o].n_elem * 8;
    if (!recv_header(&type, &len)) exit(0);
    if (type != NF__MEAS_F_DATA || len != want)
      die(2, "protocol: expected DATA of %" PRIu64 " bytes for tensor %u, got type %u with %" PRIu64,
          want, i, type, len);
    void *dst = alloc64((size_t)want);
    if (!dst)
      fail("out of memory allocating %" PRIu64 " bytes for tensor %u (raise mem_limit?)", want, i);
    recv_payload(dst, len);
    if (is_in)
      P.pristine[i] = dst;
    else if (i < n_t)
      P.expected[o] = dst;
    else
      P.bound[o] = dst;
  }
  for (uint32_t k = 0; k < P.n_copies; k++) {
    P.bufs[k] = calloc(n_t, sizeof *P.bufs[k]);
    if (!P.bufs[k]) fail("out of memory");
    for (uint32_t i = 0; i < n_t; i++) {
      P.bufs[k][i] = alloc64(P.t[i].bytes);
      if (!P.bufs[k][i])
        fail("out of memory allocating copy %u of tensor %u (%zu bytes; raise mem_limit?)", k, i,
             P.t[i].bytes);
      if (i < P.n_in) memcpy(P.bufs[k][i], P.pristine[i], P.t[i].bytes);
    }
  }
  dev_setup();
  send_frame(NF__MEAS_F_READY, NULL, 0);
}

static void free_problem(void) {
  uint32_t n_t = P.n_in + P.n_out;
  for (uint32_t k = 0; P.bufs && k < P.n_copies; k++) {
    for (uint32_t i = 0; P.bufs[k] && i < n_t; i++) free(P.bufs[k][i]);
    free(P.bufs[k]);
  }
  for (uint32_t i = 0; P.pristine && i < P.n_in; i++) free(P.pristine[i]);
  for (uint32_t i = 0; P.expected && i < P.n_out; i++) free(P.expected[i]);
  for (uint32_t i = 0; P.bound && i < P.n_out; i++) free(P.bound[i]);
  free(P.bufs);
  free(P.pristine);
  free(P.expected);
  free(P.bound);
  free(P.times);
  free(P.t);
  if (P.pool) nf_pool_free(P.pool);
  for (uint32_t k = 0; g_dbufs && k < P.n_copies; k++) {
    /* (on the CPU they are P.bufs, freed above) */
    for (uint32_t i = 0; g_dev && !nf_device_is_host(g_dev) && g_dbufs[k] && i < P.n_in + P.n_out;
         i++)
      nf_device_free(g_dev, g_dbufs[k][i]);
    free(g_dbufs[k]);
  }
  free(g_dbufs);
  if (g_dev) nf_device_close(g_dev);
  nf_cuda_rt_close(g_rt);
}

/* ---- one candidate ---- */

typedef struct result {
  int32_t status, n_runs;
  double median_ms, min_ms, max_rel_err;
  char reason[256];
} result;

static void set_reason(result *r, int status, const char *fmt, ...) NF_PRINTF(3, 4);
static void set_reason(result *r, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
  r->status = status;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void poison(uint32_t copy) {
  for (uint32_t i = P.n_in; i < P.n_in + P.n_out; i++) {
    const tensor *t = &P.t[i];
    if (t->dtype == NF_F32) {
      float *f = P.bufs[copy][i];
      for (int64_t j = 0; j < t->n_elem; j++) f[j] = NAN;
    } else if (t->dtype == NF_F64) {
      double *f = P.bufs[copy][i];
      for (int64_t j = 0; j < t->n_elem; j++) f[j] = NAN;
    } else {
      memset(P.bufs[copy][i], 0xA5, t->bytes);
    }
  }
}

static double elem(const tensor *t, const void *b, int64_t j) {
  switch (t->dtype) {
  case NF_F32: return ((const float *)b)[j];
  case NF_F64: return ((const double *)b)[j];
  case NF_I32: return ((const int32_t *)b)[j];
  case NF_I64: return (double)((const int64_t *)b)[j];
  default: return ((const uint8_t *)b)[j];
  }
}

/* Compares output o of copy 0 with the reference; 0 when it matches.
 * With bounds, an element whose bound is infinite (or NaN) is not judged:
 * no evaluation in the kernel's precision can be told right or wrong
 * there (the reference is ill-conditioned at the check inputs: a divisor
 * that may vanish, a square root of what may turn negative).  Non-finite
 * reference elements must be matched exactly (same class).  The others
 * enter the relative L2 error with what lies beyond their bound: an error
 * within it is rounding that any correct evaluation may make, so only
 * the excess can be the kernel's fault, and it is held to rtol as before. */
static int compare(uint32_t o, result *r) {
  const tensor *t = &P.t[P.n_in + o];
  const void *out = P.bufs[0][P.n_in + o];
  const double *ref = P.expected[o];
  const double *bnd = P.bound ? P.bound[o] : NULL;
  double num = 0, den = 0, worst = -1;
  int64_t worst_j = -1;
  for (int64_t j = 0; j < t->n_elem; j++) {
    double v = elem(t, out, j), w = ref[j], b = bnd ? bnd[j] : 0;
    if (!(b < INFINITY)) continue; /* (the search makes sure some are judged) */
    if (!isfinite(w) || !isfinite(v)) {
      int same = (isnan(w) && isnan(v)) || (isinf(w) && v == w);
      if (!same) {
        set_reason(r, NF_MEAS_WRONG, "output %u: element %" PRId64 " is %g where the reference is %g",
                   o, j, v, w);
        r->max_rel_err = INFINITY;
        return 1;
      }
      continue;
    }
    double d = fmax(fabs(v - w) - fmax(b, 0), 0);
    num += d * d;
    den += w * w;
    if (d > worst) {
      worst = d;
      worst_j = j;
    }
  }
  double err = sqrt(num) / fmax(sqrt(den), 1e-30);
  if (err > r->max_rel_err) r->max_rel_err = err;
  if (!(err <= P.rtol)) {
    if (bnd)
      set_reason(r, NF_MEAS_WRONG,
                 "output %u: relative L2 error %.3g beyond the rounding bounds > rtol %.3g "
                 "(element %" PRId64 ": %g, reference %g +- %.3g)",
                 o, err, P.rtol, worst_j, worst_j >= 0 ? elem(t, out, worst_j) : 0.0,
                 worst_j >= 0 ? ref[worst_j] : 0.0, worst_j >= 0 ? bnd[worst_j] : 0.0);
    else
      set_reason(r, NF_MEAS_WRONG,
                 "output %u: relative L2 error %.3g > rtol %.3g (element %" PRId64 ": %g, reference %g)",
                 o, err, P.rtol, worst_j, worst_j >= 0 ? elem(t, out, worst_j) : 0.0,
                 worst_j >= 0 ? ref[worst_j] : 0.0);
    return 1;
  }
  return 0;
}

/* Checks copy's inputs against the pristine ones and restores any that
 * changed; 0 when untouched. */
static int inputs_intact(uint32_t copy, result *r) {
  int bad = 0;
  for (uint32_t i = 0; i < P.n_in; i++) {
    size_t n = P.t[i].bytes;
    if (!memcmp(P.bufs[copy][i], P.pristine[i], n)) continue;
    if (!bad && r->status != NF_MEAS_WRONG) {
      const unsigned char *a = P.bufs[copy][i], *b = P.pristine[i];
      size_t at = 0;
      while (at < n && a[at] == b[at]) at++;
      set_reason(r, NF_MEAS_WRONG, "the kernel wrote to input %u (element %zu)", i,
                 at / nf_dtype_size(P.t[i].dtype));
    }
    memcpy(P.bufs[copy][i], P.pristine[i], n);
    bad = 1;
  }
  return bad;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A device call failed: on the CPU, the candidate's fault; on a GPU the
 * candidate's (reason set) unless the device is broken (a sticky error),
 * after which this process cannot go on. */
static void dev_failed(result *r, const char *what, nf_buf *err) {
  if (nf_device_is_host(g_dev)) {
    set_reason(r, NF_MEAS_LOAD, "%s", nf_buf_str(err));
    return;
  }
  nf_buf probe = NF_BUF_INIT;
  if (nf_device_sync(g_dev, &probe) != NF_OK) die(3, "%s: %s", what, nf_buf_str(err));
  nf_buf_free(&probe);
  set_reason(r, NF_MEAS_LOAD, "%s: %s", what, nf_buf_str(err));
}

/* One run of k on copy; timed into *ms when ms is not NULL. */
static int run(nf_dkernel *k, uint32_t copy, double *ms, result *r) {
  nf_buf err = NF_BUF_INIT;
  uint32_t n = P.n_in + P.n_out;
  int rc = ms ? nf_device_time(g_dev, k, g_dbufs[copy], n, ms, &err)
              : nf_device_run(g_dev, k, g_dbufs[copy], n, &err);
  if (rc != NF_OK) dev_failed(r, "running it", &err);
  nf_buf_free(&err);
  return rc;
}

/* Brings copy's inputs back from the device and checks them (restoring
 * the device's when they changed); 0 when untouched. */
static int dev_inputs_intact(uint32_t copy, result *r) {
  nf_buf err = NF_BUF_INIT;
  for (uint32_t i = 0; i < P.n_in; i++)
    if (nf_device_download(g_dev, P.bufs[copy][i], g_dbufs[copy][i], P.t[i].bytes, &err) != NF_OK)
      die(3, "downloading input %u: %s", i, nf_buf_str(&err));
  int bad = inputs_intact(copy, r);
  for (uint32_t i = 0; bad && i < P.n_in; i++)
    if (nf_device_upload(g_dev, g_dbufs[copy][i], P.pristine[i], P.t[i].bytes, &err) != NF_OK)
      die(3, "restoring input %u: %s", i, nf_buf_str(&err));
  nf_buf_free(&err);
  return bad;
}

/* Measures one candidate, on the CPU or the GPU alike: the check run on
 * poisoned outputs against the reference, inputs untouched, warm-up runs,
 * then timed runs (the device's own time: the wall clock around a CPU
 * run, CUDA events around the launches) over the copies in turn until
 * min_time_ms and 3 runs, or max_repeat, or one run over the cutoff. */
static void measure(const void *bin, size_t n, result *r) {
  memset(r, 0, sizeof *r);
  nf_dkernel *k = NULL;
  nf_buf err = NF_BUF_INIT;
  int lrc = nf_device_load(g_dev, bin, n, P.n_in + P.n_out, &k, &err);
  if (lrc != NF_OK) {
    if (lrc == NF_EFORMAT || nf_device_is_host(g_dev))
      set_reason(r, NF_MEAS_LOAD, "%s", nf_buf_str(&err));
    else
      dev_failed(r, "loading it", &err);
    nf_buf_free(&err);
    return;
  }
  poison(0);
  for (uint32_t i = P.n_in; i < P.n_in + P.n_out; i++)
    if (nf_device_upload(g_dev, g_dbufs[0][i], P.bufs[0][i], P.t[i].bytes, &err) != NF_OK)
      die(3, "poisoning output %u: %s", i - P.n_in, nf_buf_str(&err));
  double check_t0 = now_ms();
  if (run(k, 0, NULL, r)) goto done;
  double check_ms = now_ms() - check_t0;
  for (uint32_t i = P.n_in; i < P.n_in + P.n_out; i++)
    if (nf_device_download(g_dev, P.bufs[0][i], g_dbufs[0][i], P.t[i].bytes, &err) != NF_OK)
      die(3, "downloading output %u: %s", i - P.n_in, nf_buf_str(&err));
  for (uint32_t o = 0; o < P.n_out; o++)
    if (compare(o, r)) goto done;
  if (dev_inputs_intact(0, r)) goto done;

  uint32_t next = 1 % P.n_copies;
  /* a candidate already slower than the cutoff: its check run warmed it */
  int slow = P.cutoff_ms > 0 && check_ms > P.cutoff_ms;
  for (int i = 0; i < P.warmup && !slow; i++, next = (next + 1) % P.n_copies)
    if (run(k, next, NULL, r)) goto done;
  /* the wall clock only bounds the measurement */
  double start = now_ms();
  int n_runs = 0;
  while (n_runs < P.max_repeat) {
    double ms = 0;
    if (run(k, next, &ms, r)) goto done;
    double t1 = now_ms();
    next = (next + 1) % P.n_copies;
    P.times[n_runs++] = ms;
    if (n_runs >= 3 && t1 - start >= P.min_time_ms) break;
    if (n_runs == 1 && P.cutoff_ms > 0 && ms > P.cutoff_ms) break; /* clearly slow */
  }
  int bad = 0; /* check (and restore) every copy, not just up to the first bad one */
  for (uint32_t c = 0; c < P.n_copies; c++) bad |= dev_inputs_intact(c, r);
  if (bad) goto done;
  qsort(P.times, (size_t)n_runs, sizeof *P.times, cmp_double);
  r->n_runs = n_runs;
  r->min_ms = P.times[0];
  r->median_ms = n_runs % 2 ? P.times[n_runs / 2]
                            : 0.5 * (P.times[n_runs / 2 - 1] + P.times[n_runs / 2]);
  r->status = NF_MEAS_OK;
done:
  if (r->status != NF_MEAS_OK) {
    r->n_runs = 0;
    r->median_ms = r->min_ms = 0;
    /* whatever stopped it, the next candidate gets pristine inputs */
    result scratch = {.status = NF_MEAS_WRONG};
    for (uint32_t c = 0; c < P.n_copies; c++) dev_inputs_intact(c, &scratch);
  }
  nf_device_unload(g_dev, k);
  nf_buf_free(&err);
}

static void send_result(const result *r) {
  unsigned char b[NF__MEAS_RESULT_FIXED + sizeof r->reason];
  size_t rl = strnlen(r->reason, sizeof r->reason - 1);
  memcpy(b, &r->status, 4);
  memcpy(b + 4, &r->n_runs, 4);
  memcpy(b + 8, &r->median_ms, 8);
  memcpy(b + 16, &r->min_ms, 8);
  memcpy(b + 24, &r->max_rel_err, 8);
  memcpy(b + NF__MEAS_RESULT_FIXED, r->reason, rl);
  send_frame(NF__MEAS_F_RESULT, b, NF__MEAS_RESULT_FIXED + rl);
}

/* ---- start-up ---- */

static uint64_t parse_u64(const char *s, const char *what) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-') die(2, "bad %s '%s'", what, s);
  return v;
}

/* Moves fd to a private close-on-exec descriptor >= 3. */
static int privatize(int fd) {
  int p = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (p < 0) die(1, "dup: %s", strerror(errno));
  return p;
}

int main(int argc, char **argv) {
  uint64_t parent = 0, mem_limit = 0, threads = 1;
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "--parent=", 9))
      parent = parse_u64(argv[i] + 9, "--parent");
    else if (!strncmp(argv[i], "--mem-limit=", 12))
      mem_limit = parse_u64(argv[i] + 12, "--mem-limit");
    else if (!strncmp(argv[i], "--threads=", 10))
      threads = parse_u64(argv[i] + 10, "--threads");
    else if (!strncmp(argv[i], "--cuda-sm=", 10))
      g_want_sm = (int)parse_u64(argv[i] + 10, "--cuda-sm");
    else if (!strncmp(argv[i], "--cuda-name=", 12))
      g_want_name = argv[i] + 12;
    else if (!strncmp(argv[i], "--cuda=", 7)) {
      uint64_t d = parse_u64(argv[i] + 7, "--cuda");
      if (d > 1023) die(2, "bad --cuda '%s'", argv[i] + 7);
      g_cuda = (int)d;
    }
    else
      die(2, "unknown argument '%s' (this program is started by the NeoFlow search's measurer)",
          argv[i]);
  }
  if (!parent || threads < 1 || threads > 1024)
    die(2, "usage: neoflow-worker --parent=PID [--mem-limit=BYTES] [--threads=N]");
  /* die with the measurer; if it died before the prctl, we were already
   * reparented and getppid() tells */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die(1, "prctl: %s", strerror(errno));
  if ((uint64_t)getppid() != parent) die(1, "the measurer (pid %" PRIu64 ") is gone", parent);
  signal(SIGPIPE, SIG_IGN); /* a vanished measurer shows as EPIPE */
  struct rlimit rl = {0, 0};
  setrlimit(RLIMIT_CORE, &rl);
  if (mem_limit && !NF_WORKER_ASAN && g_cuda < 0) {
    rl.rlim_cur = rl.rlim_max = mem_limit;
    if (setrlimit(RLIMIT_AS, &rl) != 0)
      die(1, "setrlimit(RLIMIT_AS, %" PRIu64 "): %s", mem_limit, strerror(errno));
  }

  proto_in = privatize(0);
  proto_out = privatize(1);
  int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0 || dup2(null, 0) < 0 || dup2(2, 1) < 0) die(1, "redirecting stdio: %s", strerror(errno));
  close(null);

  P.pool = nf_pool_new((int)threads);
  if (!P.pool) die(1, "cannot start a pool of %d threads", (int)threads);
  read_problem();
  for (;;) {
    uint32_t type;
    uint64_t len;
    if (!recv_header(&type, &len)) break; /* the measurer closed the pipe */
    if (type == NF__MEAS_F_EXIT) {
      if (len) die(2, "protocol: EXIT with a payload");
      break;
    }
    if (type == NF__MEAS_F_CUTOFF) {
      double c;
      if (len != sizeof c) die(2, "protocol: CUTOFF of %" PRIu64 " bytes", len);
      recv_payload(&c, sizeof c);
      if (!(c >= 0 && c < 1e12)) die(2, "protocol: cutoff %g", c);
      P.cutoff_ms = c;
      continue;
    }
    if (type != NF__MEAS_F_CANDIDATE) die(2, "protocol: unexpected frame type %u", type);
    if (len == 0 || len > NF__MEAS_MAX_SO)
      die(2, "protocol: CANDIDATE of %" PRIu64 " bytes (at most %" PRIu64 ")", len,
          NF__MEAS_MAX_SO);
    void *so = malloc((size_t)len);
    if (!so) fail("out of memory reading a candidate of %" PRIu64 " bytes", len);
    recv_payload(so, len);
    result r;
    measure(so, (size_t)len, &r);
    free(so);
    send_result(&r);
  }
  free_problem();
  return 0;
}
