/* test_measure.c - sandboxed measurement (daemon/search/nf_measure.h):
 * real worker processes running the small kernels of tests/search_kernels
 * (their directory in $NF_SEARCH_KERNELS) on the problem of mm.h.
 *
 *  - a correct kernel is measured OK with plausible times; the run-count
 *    rules (at least 3, at most max_repeat; 1 over the cutoff) hold;
 *  - a crashing kernel is a CRASH "killed by SIGSEGV", a hanging one a
 *    TIMEOUT within the deadline; in both cases the worker is reaped (no
 *    child, no zombie, its pid gone) and the next candidate is measured
 *    correctly by a fresh worker;
 *  - wrong values, an output left unwritten (caught by the NaN poisoning
 *    even after a correct kernel filled the buffer), and a kernel writing
 *    to its inputs are WRONG and never timed; the inputs are restored;
 *  - with bounds only the error beyond each element's bound counts, and
 *    an element of infinite bound is not judged;
 *  - garbage bytes, an object without the symbol and a non-zero return
 *    code are LOAD; a kernel reserving 64 GiB fails under RLIMIT_AS;
 *  - a worker killed from outside is reported as a crash without SIGPIPE
 *    killing the caller; a missing worker binary and malformed problems are
 *    errors with messages; the worker itself rejects malformed frames
 *    (lying lengths, oversized shapes, a foreign version) without
 *    allocating;
 *  - descriptors do not leak.
 * Run under valgrind with `meson test --setup valgrind measure` (the
 * worker itself is not traced). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nf_config.h"
#include "nf_cuda.h"
#include "nf_interp.h"
#include "nf_lang.h"
#include "nf_lower.h"
#include "nf_measure.h"
#include "search_kernels/mm.h"

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifndef TEST_ASAN
#define TEST_ASAN 0
#endif

extern char **environ;

/* ---- helpers ---- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Zombie children of this process, from /proc/<pid>/stat. */
static int count_zombies(void) {
  DIR *d = opendir("/proc");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[r] = 0;
    const char *close_paren = strrchr(buf, ')');
    char state;
    long ppid;
    if (close_paren && sscanf(close_paren + 1, " %c %ld", &state, &ppid) == 2 &&
        ppid == (long)getpid() && state == 'Z')
      n++;
  }
  closedir(d);
  return n;
}

/* No child at all is left (the measurer holds no worker now). */
static void assert_no_children(void) {
  ck_assert_int_eq(count_zombies(), 0);
  int st;
  errno = 0;
  pid_t r = waitpid(-1, &st, WNOHANG);
  ck_assert_msg(r == -1 && errno == ECHILD, "a child is left behind (waitpid -> %d, errno %d)",
                (int)r, errno);
}

static void assert_gone(int pid) {
  ck_assert_int_gt(pid, 0);
  errno = 0;
  ck_assert_msg(kill(pid, 0) == -1 && errno == ESRCH, "worker %d still exists", pid);
}

typedef struct blob {
  char *data;
  size_t len;
} blob;

static blob kernel(const char *name) {
  const char *dir = getenv("NF_SEARCH_KERNELS");
  ck_assert_msg(dir != NULL, "NF_SEARCH_KERNELS is not set (run through meson test)");
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.so", dir, name);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  blob b = {NULL, 0};
  size_t cap = 0;
  for (;;) {
    if (b.len == cap) {
      cap = cap ? 2 * cap : 65536;
      b.data = realloc(b.data, cap);
      ck_assert_ptr_nonnull(b.data);
    }
    size_t r = fread(b.data + b.len, 1, cap - b.len, f);
    if (!r) break;
    b.len += r;
  }
  fclose(f);
  ck_assert_uint_gt(b.len, 64);
  return b;
}

/* The problem of mm.h on random inputs, with its f64 reference. */
typedef struct fixture {
  float a[MM_M * MM_K], b[MM_K * MM_N];
  int32_t s[MM_M];
  double c_ref[MM_M * MM_N], r_ref[MM_M];
  nf_measure_tensor t[5];
  const void *inputs[3];
  const double *expected[2];
  nf_measure_problem pb;
} fixture;

static fixture *fixture_new(void) {
  fixture *f = calloc(1, sizeof *f);
  ck_assert_ptr_nonnull(f);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < MM_M * MM_K; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f->a[i] = (float)((double)(x >> 11) / (double)(1ull << 53) * 2 - 1);
  }
  for (int i = 0; i < MM_K * MM_N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f->b[i] = (float)((double)(x >> 11) / (double)(1ull << 53) * 2 - 1);
  }
  for (int i = 0; i < MM_M; i++) f->s[i] = i * 7 % 101 - 50;
  for (int m = 0; m < MM_M; m++) {
    for (int n = 0; n < MM_N; n++) {
      double acc = 0;
      for (int k = 0; k < MM_K; k++) acc += (double)f->a[m * MM_K + k] * f->b[k * MM_N + n];
      f->c_ref[m * MM_N + n] = acc;
    }
    double r = f->s[m];
    for (int k = 0; k < MM_K; k++) r += f->a[m * MM_K + k];
    f->r_ref[m] = r;
  }
  nf_measure_tensor t[5] = {
      {NF_F32, 2, {MM_M, MM_K}}, {NF_F32, 2, {MM_K, MM_N}}, {NF_I32, 1, {MM_M}},
      {NF_F32, 2, {MM_M, MM_N}}, {NF_F64, 1, {MM_M}},
  };
  memcpy(f->t, t, sizeof t);
  f->inputs[0] = f->a;
  f->inputs[1] = f->b;
  f->inputs[2] = f->s;
  f->expected[0] = f->c_ref;
  f->expected[1] = f->r_ref;
  f->pb.n_inputs = 3;
  f->pb.n_outputs = 2;
  f->pb.tensors = f->t;
  f->pb.check_inputs = f->inputs;
  f->pb.expected = f->expected;
  return f;
}

static nf_measurer *new_measurer(const fixture *f, const nf_measure_opts *o) {
  nf_measurer *m = NULL;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_measurer_new(o, &f->pb, &m, &err);
  ck_assert_msg(rc == NF_OK, "nf_measurer_new: %s: %s", nf_status_name(rc), nf_buf_str(&err));
  ck_assert_ptr_nonnull(m);
  ck_assert_int_gt(nf_measurer_worker_pid(m), 0);
  nf_buf_free(&err);
  return m;
}

static nf_measure_result measure_blob(nf_measurer *m, const blob *b) {
  nf_measure_result r;
  int rc = nf_measure(m, b->data, b->len, &r);
  ck_assert_msg(rc == NF_OK, "nf_measure: %s (%s)", nf_status_name(rc), r.reason);
  return r;
}

static nf_measure_result measure_kernel(nf_measurer *m, const char *name) {
  blob b = kernel(name);
  nf_measure_result r = measure_blob(m, &b);
  free(b.data);
  return r;
}

static void expect_status(const nf_measure_result *r, int status, const char *what) {
  ck_assert_msg(r->status == status, "%s: %s, expected %s (%s)", what,
                nf_measure_status_name(r->status), nf_measure_status_name(status), r->reason);
}

static void expect_good(nf_measurer *m) {
  nf_measure_result r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_OK, "good");
  ck_assert_int_ge(r.n_runs, 3);
  ck_assert(r.min_ms > 0 && r.min_ms <= r.median_ms && r.median_ms < 1000);
  ck_assert_msg(r.max_rel_err < 1e-5, "max_rel_err %g", r.max_rel_err);
}

static const nf_measure_opts quick = {.n_threads = 2, .min_time_ms = 5, .timeout_ms = 5000};

/* ---- tests ---- */

START_TEST(measure_good) {
  fixture *f = fixture_new();
  int fds = count_fds();
  nf_measurer *m = new_measurer(f, &quick);
  int pid = nf_measurer_worker_pid(m);
  for (int i = 0; i < 3; i++) {
    nf_measure_result r = measure_kernel(m, "good");
    expect_status(&r, NF_MEAS_OK, "good");
    ck_assert_int_ge(r.n_runs, 3);
    ck_assert_int_le(r.n_runs, 200);
    ck_assert(r.min_ms > 0 && r.min_ms <= r.median_ms && r.median_ms < 1000);
    ck_assert_msg(r.max_rel_err < 1e-5, "max_rel_err %g", r.max_rel_err);
    ck_assert_str_eq(r.reason, "");
  }
  ck_assert_int_eq(nf_measurer_worker_pid(m), pid); /* one worker throughout */
  ck_assert_int_eq(count_zombies(), 0);
  nf_measurer_free(m);
  assert_gone(pid);
  assert_no_children();
  ck_assert_int_eq(count_fds(), fds);
  free(f);
}
END_TEST

START_TEST(measure_repeat_rules) {
  fixture *f = fixture_new();
  /* a negligible min_time: the minimum of 3 runs */
  nf_measure_opts o = {.min_time_ms = 1e-9, .warmup = 2};
  nf_measurer *m = new_measurer(f, &o);
  nf_measure_result r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_OK, "good");
  ck_assert_int_eq(r.n_runs, 3);
  nf_measurer_free(m);
  /* a long min_time: max_repeat stops it */
  nf_measure_opts o2 = {.min_time_ms = 1e6, .max_repeat = 7, .rotate_bytes = 1 << 20};
  m = new_measurer(f, &o2);
  r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_OK, "good");
  ck_assert_int_eq(r.n_runs, 7);
  /* a cutoff below any run: timed once; none again: the full rules */
  nf_measurer_set_cutoff(m, 1e-9);
  r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_OK, "good");
  ck_assert_int_eq(r.n_runs, 1);
  ck_assert(r.median_ms > 0 && r.median_ms == r.min_ms);
  /* a wrong kernel is still judged wrong, never timed */
  r = measure_kernel(m, "wrong");
  expect_status(&r, NF_MEAS_WRONG, "wrong");
  nf_measurer_set_cutoff(m, 0);
  r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_OK, "good");
  ck_assert_int_eq(r.n_runs, 7);
  nf_measurer_free(m);
  assert_no_children();
  free(f);
}
END_TEST

START_TEST(measure_crash) {
  fixture *f = fixture_new();
  int fds = count_fds();
  nf_measurer *m = new_measurer(f, &quick);
  for (int round = 0; round < 2; round++) {
    int pid = nf_measurer_worker_pid(m);
    if (round == 1) ck_assert_int_eq(pid, -1); /* started lazily by nf_measure */
    nf_measure_result r = measure_kernel(m, "crash");
    expect_status(&r, NF_MEAS_CRASH, "crash");
    ck_assert_msg(strstr(r.reason, "SIGSEGV"), "reason: %s", r.reason);
    ck_assert_int_eq(r.n_runs, 0);
    ck_assert_int_eq(nf_measurer_worker_pid(m), -1);
    if (pid > 0) assert_gone(pid);
    assert_no_children();
  }
  /* a fresh worker measures the next candidate correctly */
  expect_good(m);
  int pid = nf_measurer_worker_pid(m);
  ck_assert_int_gt(pid, 0);
  nf_measurer_free(m);
  assert_gone(pid);
  assert_no_children();
  ck_assert_int_eq(count_fds(), fds);
  free(f);
}
END_TEST

START_TEST(measure_hang) {
  fixture *f = fixture_new();
  int fds = count_fds();
  nf_measure_opts o = quick;
  o.timeout_ms = 500;
  nf_measurer *m = new_measurer(f, &o);
  int pid = nf_measurer_worker_pid(m);
  double t0 = now_ms();
  nf_measure_result r = measure_kernel(m, "hang");
  double took = now_ms() - t0;
  expect_status(&r, NF_MEAS_TIMEOUT, "hang");
  ck_assert_str_eq(r.reason, "timed out after 500 ms");
  ck_assert_msg(took >= 450 && took < 2500, "took %.0f ms", took);
  ck_assert_int_eq(nf_measurer_worker_pid(m), -1);
  assert_gone(pid);
  assert_no_children();
  expect_good(m);
  /* a hang right before free: free still reaps promptly */
  nf_measure_result r2 = measure_kernel(m, "hang");
  expect_status(&r2, NF_MEAS_TIMEOUT, "hang");
  nf_measurer_free(m);
  assert_no_children();
  ck_assert_int_eq(count_fds(), fds);
  free(f);
}
END_TEST

START_TEST(measure_wrong) {
  fixture *f = fixture_new();
  nf_measurer *m = new_measurer(f, &quick);
  int pid = nf_measurer_worker_pid(m);
  nf_measure_result r = measure_kernel(m, "wrong");
  expect_status(&r, NF_MEAS_WRONG, "wrong");
  ck_assert_msg(strstr(r.reason, "output 1") && strstr(r.reason, "relative L2 error"), "reason: %s",
                r.reason);
  ck_assert_int_eq(r.n_runs, 0); /* never timed */
  ck_assert(r.median_ms == 0 && r.min_ms == 0);
  ck_assert_msg(r.max_rel_err > 1e-4, "max_rel_err %g", r.max_rel_err);
  /* a wrong answer is the candidate's, not the worker's: no restart */
  ck_assert_int_eq(nf_measurer_worker_pid(m), pid);
  /* a tighter rtol makes float rounding a failure, a looser one accepts */
  nf_measurer_free(m);
  fixture *g = fixture_new();
  g->pb.rtol = 1e-12;
  m = new_measurer(g, &quick);
  r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_WRONG, "good at rtol 1e-12");
  ck_assert_msg(strstr(r.reason, "output 0"), "reason: %s", r.reason);
  nf_measurer_free(m);
  g->pb.rtol = 0.5;
  m = new_measurer(g, &quick);
  r = measure_kernel(m, "wrong");
  expect_status(&r, NF_MEAS_OK, "wrong at rtol 0.5");
  nf_measurer_free(m);
  assert_no_children();
  free(g);
  free(f);
}
END_TEST

/* Bounds: an error within them is accepted, the excess is held to rtol,
 * an undetermined element (bound +inf) is not judged, and an absent array
 * means exact. */
START_TEST(measure_bounds) {
  fixture *f = fixture_new();
  static double bc[MM_M * MM_N], br[MM_M];
  const double *bounds[2] = {NULL, br};
  f->pb.bound = bounds;
  /* "wrong" is off by 0.5 on every element of R */
  for (int i = 0; i < MM_M; i++) br[i] = 0.5 + 1e-9;
  nf_measurer *m = new_measurer(f, &quick);
  nf_measure_result r = measure_kernel(m, "wrong");
  expect_status(&r, NF_MEAS_OK, "wrong within bounds of 0.5");
  expect_good(m);
  nf_measurer_free(m);
  for (int i = 0; i < MM_M; i++) br[i] = 0.25;
  m = new_measurer(f, &quick);
  r = measure_kernel(m, "wrong");
  expect_status(&r, NF_MEAS_WRONG, "wrong beyond bounds of 0.25");
  ck_assert_msg(strstr(r.reason, "output 1: relative L2 error") &&
                    strstr(r.reason, "beyond the rounding bounds") && strstr(r.reason, "+- 0.25"),
                "reason: %s", r.reason);
  nf_measurer_free(m);
  /* "partial" leaves C's last element NaN: judged where the bound is
   * finite (C's array absent: exact), not where it is infinite */
  m = new_measurer(f, &quick);
  r = measure_kernel(m, "partial");
  expect_status(&r, NF_MEAS_WRONG, "partial, C exact");
  nf_measurer_free(m);
  bounds[0] = bc;
  bc[MM_M * MM_N - 1] = INFINITY;
  m = new_measurer(f, &quick);
  r = measure_kernel(m, "partial");
  expect_status(&r, NF_MEAS_OK, "partial, its unwritten element undetermined");
  nf_measurer_free(m);
  assert_no_children();
  free(f);
}
END_TEST

START_TEST(measure_poison) {
  fixture *f = fixture_new();
  nf_measurer *m = new_measurer(f, &quick);
  expect_good(m); /* leaves the right values in the output buffers */
  nf_measure_result r = measure_kernel(m, "partial");
  expect_status(&r, NF_MEAS_WRONG, "partial");
  char want[64];
  snprintf(want, sizeof want, "output 0: element %d is nan", MM_M * MM_N - 1);
  ck_assert_msg(strstr(r.reason, want), "reason: %s", r.reason);
  ck_assert(isinf(r.max_rel_err));
  ck_assert_int_eq(r.n_runs, 0);
  expect_good(m);
  nf_measurer_free(m);
  free(f);
}
END_TEST

START_TEST(measure_inwrite) {
  fixture *f = fixture_new();
  nf_measurer *m = new_measurer(f, &quick);
  int pid = nf_measurer_worker_pid(m);
  nf_measure_result r = measure_kernel(m, "inwrite");
  expect_status(&r, NF_MEAS_WRONG, "inwrite");
  ck_assert_msg(strstr(r.reason, "wrote to input 0 (element 5)"), "reason: %s", r.reason);
  ck_assert_int_eq(r.n_runs, 0);
  /* same worker, inputs restored: the good kernel is right again */
  ck_assert_int_eq(nf_measurer_worker_pid(m), pid);
  expect_good(m);
  nf_measurer_free(m);
  free(f);
}
END_TEST

START_TEST(measure_load) {
  fixture *f = fixture_new();
  nf_measurer *m = new_measurer(f, &quick);
  int pid = nf_measurer_worker_pid(m);
  unsigned char garbage[4096];
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (unsigned char)(i * 131 + 7);
  nf_measure_result r;
  ck_assert_int_eq(nf_measure(m, garbage, sizeof garbage, &r), NF_OK);
  expect_status(&r, NF_MEAS_LOAD, "garbage");
  ck_assert_msg(strstr(r.reason, "not an ELF file"), "reason: %s", r.reason);
  /* a real ELF object cut short */
  blob good = kernel("good");
  ck_assert_int_eq(nf_measure(m, good.data, 300, &r), NF_OK);
  expect_status(&r, NF_MEAS_LOAD, "truncated");
  free(good.data);
  r = measure_kernel(m, "nosym");
  expect_status(&r, NF_MEAS_LOAD, "nosym");
  ck_assert_msg(strstr(r.reason, "nf_kernel_v1"), "reason: %s", r.reason);
  r = measure_kernel(m, "retcode");
  expect_status(&r, NF_MEAS_LOAD, "retcode");
  ck_assert_msg(strstr(r.reason, "returned 7"), "reason: %s", r.reason);
  ck_assert_int_eq(r.n_runs, 0);
  ck_assert_int_eq(nf_measure(m, NULL, 0, &r), NF_OK);
  expect_status(&r, NF_MEAS_LOAD, "empty");
  /* none of these costs the worker */
  ck_assert_int_eq(nf_measurer_worker_pid(m), pid);
  expect_good(m);
  nf_measurer_free(m);
  assert_gone(pid);
  free(f);
}
END_TEST

START_TEST(measure_hog) {
  if (TEST_ASAN) return; /* the ASan worker sets no RLIMIT_AS (see worker.c) */
  fixture *f = fixture_new();
  nf_measurer *m = new_measurer(f, &quick); /* automatic mem_limit: about 1 GiB */
  nf_measure_result r = measure_kernel(m, "hog");
  ck_assert_msg(r.status == NF_MEAS_LOAD || r.status == NF_MEAS_CRASH, "hog: %s (%s)",
                nf_measure_status_name(r.status), r.reason);
  if (r.status == NF_MEAS_LOAD) ck_assert_msg(strstr(r.reason, "returned 3"), "%s", r.reason);
  expect_good(m);
  nf_measurer_free(m);
  assert_no_children();
  free(f);
}
END_TEST

START_TEST(measure_killed_worker) {
  /* SIGPIPE keeps its default action (terminate) here: the measurer must
   * not let a write to a dead worker raise it */
  signal(SIGPIPE, SIG_DFL);
  fixture *f = fixture_new();
  int fds = count_fds();
  nf_measurer *m = new_measurer(f, &quick);
  int pid = nf_measurer_worker_pid(m);
  ck_assert_int_eq(kill(pid, SIGKILL), 0);
  /* the zombie exists until the measurer reaps it */
  for (int i = 0; i < 200 && count_zombies() == 0; i++) usleep(5000);
  ck_assert_int_eq(count_zombies(), 1);
  nf_measure_result r = measure_kernel(m, "good");
  expect_status(&r, NF_MEAS_CRASH, "good on a killed worker");
  ck_assert_msg(strstr(r.reason, "SIGKILL"), "reason: %s", r.reason);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  ck_assert(!sigismember(&pending, SIGPIPE));
  assert_no_children();
  expect_good(m);
  nf_measurer_free(m);
  assert_no_children();
  ck_assert_int_eq(count_fds(), fds);
  free(f);
}
END_TEST

START_TEST(measure_missing_worker) {
  fixture *f = fixture_new();
  int fds = count_fds();
  nf_measure_opts o = {.worker_path = "/nonexistent/dir/neoflow-worker"};
  nf_measurer *m = (nf_measurer *)f; /* must be reset to NULL */
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_measurer_new(&o, &f->pb, &m, &err), NF_EIO);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(nf_buf_str(&err), "/nonexistent/dir/neoflow-worker") &&
                    strstr(nf_buf_str(&err), "No such file"),
                "message: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  /* a file that is not a program */
  o.worker_path = "/dev/null";
  ck_assert_int_eq(nf_measurer_new(&o, &f->pb, &m, &err), NF_EIO);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(nf_buf_str(&err), "/dev/null"), "message: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  /* a program that exits at once: reported with its status */
  o.worker_path = "/bin/false";
  ck_assert_int_eq(nf_measurer_new(&o, &f->pb, &m, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "failed to start"), "message: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  assert_no_children();
  ck_assert_int_eq(count_fds(), fds);
  nf_measurer_free(NULL);
  free(f);
}
END_TEST

START_TEST(measure_bad_problem) {
  fixture *f = fixture_new();
  nf_measurer *m = NULL;
  nf_buf err = NF_BUF_INIT;
  nf_measure_problem pb = f->pb;
  pb.n_outputs = 0;
  ck_assert_int_eq(nf_measurer_new(NULL, &pb, &m, &err), NF_EINVAL);
  ck_assert_ptr_null(m);
  ck_assert_uint_gt(err.len, 0);
  nf_buf_reset(&err);
  f->t[1].dtype = NF_F16;
  ck_assert_int_eq(nf_measurer_new(NULL, &f->pb, &m, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "tensor 1"), "message: %s", nf_buf_str(&err));
  nf_buf_reset(&err);
  f->t[1].dtype = NF_F32;
  f->t[0].shape[0] = -3;
  ck_assert_int_eq(nf_measurer_new(NULL, &f->pb, &m, &err), NF_EINVAL);
  nf_buf_reset(&err);
  f->t[0].shape[0] = (int64_t)1 << 40; /* x 29: over 2^40 elements */
  ck_assert_int_eq(nf_measurer_new(NULL, &f->pb, &m, &err), NF_EINVAL);
  nf_buf_reset(&err);
  f->t[0].shape[0] = MM_M;
  f->inputs[1] = NULL;
  ck_assert_int_eq(nf_measurer_new(NULL, &f->pb, &m, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "input 1"), "message: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  assert_no_children();
  free(f);
}
END_TEST

/* ---- the worker's own validation, talking to it directly ---- */

static const char *worker_path(void) {
  const char *env = getenv("NEOFLOW_WORKER");
  return env && *env ? env : NF_WORKER_BUILD_PATH;
}

typedef struct raw_worker {
  pid_t pid;
  int to, from;
} raw_worker;

static raw_worker raw_start(void) {
  int in[2], out[2];
  ck_assert_int_eq(pipe2(in, O_CLOEXEC), 0);
  ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char parent[32];
  snprintf(parent, sizeof parent, "--parent=%ld", (long)getpid());
  char *argv[] = {(char *)worker_path(), parent, NULL};
  raw_worker w;
  ck_assert_int_eq(posix_spawn(&w.pid, argv[0], &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  w.to = in[1];
  w.from = out[0];
  return w;
}

static void raw_send(raw_worker *w, uint32_t type, uint64_t len, const void *p, size_t n) {
  unsigned char h[16] = {0};
  memcpy(h, &type, 4);
  memcpy(h + 8, &len, 8);
  ck_assert_int_eq(write(w->to, h, 16), 16);
  if (n) ck_assert_int_eq(write(w->to, p, n), (ssize_t)n);
}

/* Waits (at most 5 s) for the worker to exit; returns its exit status. */
static int raw_finish(raw_worker *w) {
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 500 && (r = waitpid(w->pid, &st, WNOHANG)) == 0; i++) usleep(10000);
  if (r == 0) {
    kill(w->pid, SIGKILL);
    waitpid(w->pid, &st, 0);
    ck_abort_msg("the worker did not exit on a malformed frame");
  }
  close(w->to);
  close(w->from);
  ck_assert_msg(WIFEXITED(st), "worker status 0x%x", st);
  return WEXITSTATUS(st);
}

static size_t problem_bytes(unsigned char *p, uint32_t version, int64_t dim) {
  uint32_t u[4] = {version, 1, 1, 1};
  int32_t i[2] = {1, 10};
  double d[2] = {1e-4, 1};
  size_t o = 0;
  memcpy(p + o, u, 16), o += 16;
  memcpy(p + o, i, 8), o += 8;
  memcpy(p + o, d, 16), o += 16;
  for (int t = 0; t < 2; t++) {
    p[o++] = NF_F32;
    p[o++] = 2;
    memcpy(p + o, &dim, 8), o += 8;
    memcpy(p + o, &dim, 8), o += 8;
  }
  return o;
}

START_TEST(measure_worker_validates) {
  signal(SIGPIPE, SIG_IGN); /* the worker may be gone before we finish writing */
  unsigned char p[256];
  /* a lying length on the first frame: rejected before any allocation */
  raw_worker w = raw_start();
  raw_send(&w, NF__MEAS_F_PROBLEM, 0xFFFFFFFFFFF0ull, NULL, 0);
  ck_assert_int_eq(raw_finish(&w), 2);
  /* a frame of the wrong type first */
  w = raw_start();
  raw_send(&w, NF__MEAS_F_CANDIDATE, 10, "0123456789", 10);
  ck_assert_int_eq(raw_finish(&w), 2);
  /* a shape over the element cap (2^21 x 2^21 = 2^42 elements) */
  w = raw_start();
  size_t n = problem_bytes(p, NF__MEAS_PROTO_VERSION, (int64_t)1 << 21);
  raw_send(&w, NF__MEAS_F_PROBLEM, n, p, n);
  ck_assert_int_eq(raw_finish(&w), 2);
  /* a truncated frame: EOF in the middle of the payload */
  w = raw_start();
  n = problem_bytes(p, NF__MEAS_PROTO_VERSION, 4);
  raw_send(&w, NF__MEAS_F_PROBLEM, n, p, n - 5);
  close(w.to);
  w.to = open("/dev/null", O_WRONLY | O_CLOEXEC);
  ck_assert_int_eq(raw_finish(&w), 2);
  /* a DATA frame whose length is not the tensor's */
  w = raw_start();
  raw_send(&w, NF__MEAS_F_PROBLEM, n, p, n);
  raw_send(&w, NF__MEAS_F_DATA, 1ull << 40, NULL, 0);
  ck_assert_int_eq(raw_finish(&w), 2);
  /* another protocol version: a FAIL frame that says so */
  w = raw_start();
  n = problem_bytes(p, NF__MEAS_PROTO_VERSION + 1, 4);
  raw_send(&w, NF__MEAS_F_PROBLEM, n, p, n);
  unsigned char h[16];
  ck_assert_int_eq(read(w.from, h, 16), 16);
  uint32_t type;
  memcpy(&type, h, 4);
  ck_assert_uint_eq(type, NF__MEAS_F_FAIL);
  ck_assert_int_eq(raw_finish(&w), 1);
  assert_no_children();
}
END_TEST

/* ---- GPU mode, on the emulated CUDA driver (tests/cuda_emu_driver.cc) ---- */

static const char *gpu_src =
    "def mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "}\n"
    "def mm2(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j) * 2.0\n"
    "}\n";

/* def's GPU default kernel as a bundle with its source and no cubin (the
 * emulated driver runs the source). */
static void gpu_bundle(nf_module *mod, const char *def, nf_ir_ctx *ctx, nf_buf *out) {
  nf_arg_shape sh[2] = {{.rank = 2, .dims = {48, 40}}, {.rank = 2, .dims = {40, 36}}};
  nf_inst_opts io = {.n_shapes = 2, .shapes = sh};
  nf_graph *g = NULL;
  nf_diag *d = nf_diag_new();
  ck_assert_int_eq(nf_module_instantiate(mod, def, &io, ctx, &g, d), NF_OK);
  nf_diag_free(d);
  nf_schedule *sch = NULL;
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT, src = NF_BUF_INIT;
  ck_assert_int_eq(nf_schedule_default_gpu(g, NF_GPU_DEFAULT_THREADS, &sch), NF_OK);
  ck_assert_int_eq(nf_lower(g, sch, ctx, &p, &err), NF_OK);
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_bundle_encode(&plan, NF_CUDA_IMAGE_CUBIN, 90, NULL, 0, src.data, src.len,
                                         out),
                   NF_OK);
  nf_cuda_plan_free(&plan);
  nf_schedule_free(sch);
  nf_buf_free(&src);
  nf_buf_free(&err);
}

/* The measurer in GPU mode: a worker that owns the (emulated) CUDA
 * context checks and times bundles; a wrong one is WRONG, a corrupt one
 * LOAD, one whose launch breaks the context a CRASH (the worker exits;
 * the next candidate gets a fresh worker); without a driver the measurer
 * does not start and says why. */
START_TEST(measure_gpu_emulated) {
  const char *drv = getenv("NF_TEST_CUDA_DRIVER");
  if (!drv || !*drv || !getenv("NF_TEST_CUDA_EMU")) {
    fprintf(stderr, "measure_gpu_emulated: skipped: NF_TEST_CUDA_DRIVER or NF_TEST_CUDA_EMU not set\n");
    return;
  }
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(mod, "gpu.nf", gpu_src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_diag_free(d);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf good = NF_BUF_INIT, wrong = NF_BUF_INIT;
  gpu_bundle(mod, "mm", ctx, &good);
  gpu_bundle(mod, "mm2", ctx, &wrong);
  /* the problem: mm on random inputs, the interpreter's f64 result */
  static float a[48 * 40], b[40 * 36];
  for (int i = 0; i < 48 * 40; i++) a[i] = (float)((i * 37 % 101) - 50) / 50.0f;
  for (int i = 0; i < 40 * 36; i++) b[i] = (float)((i * 53 % 89) - 44) / 44.0f;
  static double c[48 * 36];
  for (int i = 0; i < 48; i++)
    for (int j = 0; j < 36; j++) {
      double acc = 0;
      for (int k = 0; k < 40; k++) acc += (double)a[i * 40 + k] * b[k * 36 + j];
      c[i * 36 + j] = acc;
    }
  nf_measure_tensor t[3] = {{NF_F32, 2, {48, 40}}, {NF_F32, 2, {40, 36}}, {NF_F32, 2, {48, 36}}};
  const void *in[2] = {a, b};
  const double *ex[1] = {c};
  nf_measure_problem pb = {.n_inputs = 2, .n_outputs = 1, .tensors = t, .check_inputs = in,
                           .expected = ex};
  nf_measure_opts o = quick;
  o.gpu = 1;
  /* no driver: the worker says so, the measurer does not start */
  setenv("NEOFLOW_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  nf_measurer *m = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_measurer_new(&o, &pb, &m, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "no CUDA driver"), "%s", nf_buf_str(&err));
  ck_assert_ptr_null(m);
  setenv("NEOFLOW_LIBCUDA", drv, 1);
  /* another GPU model than the kernels are keyed for: refused */
  nf_buf_reset(&err);
  o.gpu_name = "NVIDIA H200";
  ck_assert_int_eq(nf_measurer_new(&o, &pb, &m, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "not the NVIDIA H200"), "%s", nf_buf_str(&err));
  o.gpu_name = "NeoFlow CPU emulation of sm_90";
  o.gpu_sm = 80;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_measurer_new(&o, &pb, &m, &err), NF_EIO);
  o.gpu_sm = 90;
  nf_buf_reset(&err);
  ck_assert_msg(nf_measurer_new(&o, &pb, &m, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_measure_result r;
  ck_assert_int_eq(nf_measure(m, good.data, good.len, &r), NF_OK);
  expect_status(&r, NF_MEAS_OK, "the GPU default of mm");
  ck_assert_int_ge(r.n_runs, 3);
  ck_assert_msg(r.max_rel_err < 1e-5, "max_rel_err %g", r.max_rel_err);
  ck_assert_int_eq(nf_measure(m, wrong.data, wrong.len, &r), NF_OK);
  expect_status(&r, NF_MEAS_WRONG, "mm2 for mm");
  /* a truncated bundle */
  ck_assert_int_eq(nf_measure(m, good.data, good.len - 3, &r), NF_OK);
  expect_status(&r, NF_MEAS_LOAD, "a truncated bundle");
  ck_assert_int_eq(nf_measure(m, good.data, good.len, &r), NF_OK);
  expect_status(&r, NF_MEAS_OK, "mm after the bad ones");
  nf_measurer_free(m);
  /* a device that breaks at once fails the worker's health probe: the
   * measurer says so and starts nothing */
  setenv("NF_EMU_FAIL_LAUNCH", "1", 1);
  m = NULL;
  ck_assert_int_ne(nf_measurer_new(&o, &pb, &m, &err), NF_OK);
  ck_assert_msg(strstr(nf_buf_str(&err), "failed its health probe") &&
                    strstr(nf_buf_str(&err), "CUDA_ERROR_ILLEGAL_ADDRESS"),
                "%s", nf_buf_str(&err));
  ck_assert_ptr_null(m);
  assert_no_children();
  nf_buf_reset(&err);
  /* every launch after the probe breaks the context: a crash, then a
   * fresh worker (whose probe passes again) */
  setenv("NF_EMU_FAIL_LAUNCH", "2", 1);
  ck_assert_msg(nf_measurer_new(&o, &pb, &m, &err) == NF_OK, "%s", nf_buf_str(&err));
  int pid0 = nf_measurer_worker_pid(m);
  ck_assert_int_eq(nf_measure(m, good.data, good.len, &r), NF_OK);
  expect_status(&r, NF_MEAS_CRASH, "a launch that breaks the context");
  ck_assert_msg(strstr(r.reason, "CUDA_ERROR_ILLEGAL_ADDRESS"), "%s", r.reason);
  ck_assert_int_eq(nf_measure(m, good.data, good.len, &r), NF_OK);
  expect_status(&r, NF_MEAS_CRASH, "again, in a fresh worker");
  ck_assert_int_ne(nf_measurer_worker_pid(m), pid0);
  unsetenv("NF_EMU_FAIL_LAUNCH");
  nf_measurer_free(m);
  assert_no_children();
  unsetenv("NEOFLOW_LIBCUDA");
  nf_buf_free(&err);
  nf_buf_free(&good);
  nf_buf_free(&wrong);
  nf_ir_ctx_free(ctx);
  nf_module_free(mod);
}
END_TEST

int main(void) {
  Suite *s = suite_create("measure");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, measure_good);
  tcase_add_test(tc, measure_repeat_rules);
  tcase_add_test(tc, measure_crash);
  tcase_add_test(tc, measure_hang);
  tcase_add_test(tc, measure_wrong);
  tcase_add_test(tc, measure_poison);
  tcase_add_test(tc, measure_bounds);
  tcase_add_test(tc, measure_inwrite);
  tcase_add_test(tc, measure_load);
  tcase_add_test(tc, measure_hog);
  tcase_add_test(tc, measure_killed_worker);
  tcase_add_test(tc, measure_missing_worker);
  tcase_add_test(tc, measure_bad_problem);
  tcase_add_test(tc, measure_worker_validates);
  suite_add_tcase(s, tc);
  TCase *gpu = tcase_create("gpu"); /* CK_RUN_CASE=gpu runs it alone */
  tcase_set_timeout(gpu, 300);
  tcase_add_test(gpu, measure_gpu_emulated);
  suite_add_tcase(s, gpu);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
