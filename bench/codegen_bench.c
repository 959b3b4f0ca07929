/* codegen_bench.c - GFLOP/s of the default-schedule kernels (issue 4,
 * deliverable 7), side by side with OpenBLAS sgemm in one run, at 1 and 2
 * threads.  Run by hand (never by the tests):
 *
 *     build/bench/codegen_bench [reps]
 *
 * Cases:
 *  - matmul 1024^3 from lib/nn.nf against cblas_sgemm on the same shapes;
 *  - the conv2d workload's forward (N 8, C 64, H = W 56, K 64, 3x3, pad 1)
 *    from lib/nn.nf against cblas_sgemm on its im2col matrices
 *    ([N*H*W, C*9] x [C*9, K]; the im2col copy itself is not timed, so
 *    the peer figure is a ceiling).
 * NF_MATMUL_SCHEDULE=FILE and NF_CONV_SCHEDULE=FILE replace the default
 * schedule by a tuned one (`neoflow tune ... -o FILE`), for both thread
 * counts, or only for 1 thread when NF_MATMUL_SCHEDULE_T2 /
 * NF_CONV_SCHEDULE_T2 name the 2-thread one.
 * FLOPs: 2 per multiply-add.  Each figure is the median of reps runs after
 * a warm-up.  NF_OPT_LEVEL=1..3 selects the LLVM pipeline (default 2,
 * the tier-1 default of neoflow compile). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_codegen.h"
#include "nf_runtime.h"
#include "nf_lang.h"
#include "nf_lower.h"

void openblas_set_num_threads(int);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static float *rnd(int64_t n, unsigned seed) {
  float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
  srand(seed);
  for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  return p;
}

typedef struct kcase {
  nf_kernel *k;
  void *bufs[3];
  double flops;
  double compile_ms;
} kcase;

/* The schedule named by environment variable var (a file), or NULL for the
 * default; *bad set when the file cannot be read or parsed. */
static nf_schedule *env_schedule(const char *var, int *bad) {
  const char *path = getenv(var);
  *bad = 0;
  if (!path || !*path) return NULL;
  FILE *f = fopen(path, "r");
  static char text[1 << 16];
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  nf_schedule *s = NULL;
  nf_buf err = NF_BUF_INIT;
  if (!f || nf_schedule_parse(text, path, &s, &err) != NF_OK) {
    fprintf(stderr, "%s=%s: %s\n", var, path, f ? nf_buf_str(&err) : "cannot be read");
    *bad = 1;
  }
  nf_buf_free(&err);
  return s;
}

static int build(const char *lib, const char *def, const nf_arg_shape *sh, int n_sh,
                 const char *const *pn, const int64_t *pv, int np, const nf_schedule *sched,
                 kcase *kc) {
  char path[1024];
  snprintf(path, sizeof path, "%s/nn.nf", lib);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT;
  nf_blob so = NF_BLOB_INIT;
  nf_cpu_stats st;
  nf_inst_opts o = {n_sh, sh, np, pn, pv, 0};
  int rc = 1;
  if (nf_module_load_file(m, path, d) || nf_module_instantiate(m, def, &o, ctx, &g, d)) {
    fprintf(stderr, "%s", nf_diag_text(d));
    goto out;
  }
  nf_cpu_target t = {0};
  t.opt_level = getenv("NF_OPT_LEVEL") ? atoi(getenv("NF_OPT_LEVEL")) : 2;
  if (nf_lower(g, sched, ctx, &p, &err) || nf_cpu_compile(p, &t, &so, &st, &err) ||
      nf_kernel_load(so.data, so.len, &kc->k, &err)) {
    fprintf(stderr, "%s: %s\n", def, nf_buf_str(&err));
    goto out;
  }
  kc->compile_ms = st.total_ms;
  rc = 0;
out:
  nf_blob_free(&so);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(m);
  return rc;
}

static double time_kernel(kcase *kc, int threads, int reps) {
  nf_pool *pool = nf_pool_new(threads);
  double *t = malloc(sizeof(double) * (size_t)reps);
  nf_kernel_run(kc->k, kc->bufs, 3, pool, NULL); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    nf_kernel_run(kc->k, kc->bufs, 3, pool, NULL);
    t[r] = now() - t0;
  }
  double s = median(t, reps);
  free(t);
  nf_pool_free(pool);
  return kc->flops / s * 1e-9;
}

static double time_sgemm(int M, int N, int K, const float *A, const float *B, float *C,
                         int threads, int reps) {
  openblas_set_num_threads(threads);
  double *t = malloc(sizeof(double) * (size_t)reps);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C,
                N);
    t[r] = now() - t0;
  }
  double s = median(t, reps);
  free(t);
  return 2.0 * M * N * K / s * 1e-9;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  if (reps < 3) reps = 3;
  const char *lib = getenv("NEOFLOW_LIB");
  if (!lib) lib = "lib";
  printf("%-34s %8s %12s %12s %8s\n", "case", "threads", "neoflow", "OpenBLAS", "ratio");

  /* matmul 1024^3 */
  int n = 1024, bad1, bad2, bad3, bad4;
  nf_schedule *s_mm = env_schedule("NF_MATMUL_SCHEDULE", &bad1);
  nf_schedule *s_mm2 = env_schedule("NF_MATMUL_SCHEDULE_T2", &bad2);
  nf_schedule *s_cv = env_schedule("NF_CONV_SCHEDULE", &bad3);
  nf_schedule *s_cv2 = env_schedule("NF_CONV_SCHEDULE_T2", &bad4);
  if (bad1 || bad2 || bad3 || bad4) return 1;
  kcase mm = {0}, mm2 = {0};
  nf_arg_shape sh[2] = {{"A", 2, {n, n}}, {"B", 2, {n, n}}};
  if (build(lib, "matmul", sh, 2, NULL, NULL, 0, s_mm, &mm)) return 1;
  if (build(lib, "matmul", sh, 2, NULL, NULL, 0, s_mm2 ? s_mm2 : s_mm, &mm2)) return 1;
  float *A = rnd((int64_t)n * n, 1), *B = rnd((int64_t)n * n, 2);
  float *C = rnd((int64_t)n * n, 3), *Cb = rnd((int64_t)n * n, 4);
  mm.bufs[0] = A;
  mm.bufs[1] = B;
  mm.bufs[2] = C;
  mm.flops = 2.0 * n * n * n;
  memcpy(mm2.bufs, mm.bufs, sizeof mm.bufs);
  mm2.flops = mm.flops;
  for (int th = 1; th <= 2; th++) {
    kcase *k = th == 1 ? &mm : &mm2;
    const nf_schedule *used = th == 1 ? s_mm : (s_mm2 ? s_mm2 : s_mm);
    double a = time_kernel(k, th, reps), b = time_sgemm(n, n, n, A, B, Cb, th, reps);
    printf("%-34s %8d %9.1f GF %9.1f GF %8.2f\n",
           used ? "matmul 1024^3 (tuned schedule)" : "matmul 1024^3 (default schedule)", th, a, b,
           a / b);
  }
  double err = 0, ref = 0;
  for (int64_t i = 0; i < (int64_t)n * n; i++) {
    err += (C[i] - Cb[i]) * (double)(C[i] - Cb[i]);
    ref += Cb[i] * (double)Cb[i];
  }
  printf("  (compile %.1f ms; relative L2 difference to sgemm %.2e)\n", mm.compile_ms,
         sqrt(err / ref));

  /* conv2d workload forward */
  int N = 8, Cc = 64, H = 56, K = 64;
  kcase cv = {0}, cv2 = {0};
  nf_arg_shape cs[2] = {{"I", 4, {N, Cc, H, H}}, {"W", 4, {K, Cc, 3, 3}}};
  const char *pn[1] = {"pad"};
  int64_t pv[1] = {1};
  if (build(lib, "conv2d", cs, 2, pn, pv, 1, s_cv, &cv)) return 1;
  if (build(lib, "conv2d", cs, 2, pn, pv, 1, s_cv2 ? s_cv2 : s_cv, &cv2)) return 1;
  float *img = rnd((int64_t)N * Cc * H * H, 5), *Wt = rnd((int64_t)K * Cc * 9, 6);
  float *O = rnd((int64_t)N * K * H * H, 7);
  cv.bufs[0] = img;
  cv.bufs[1] = Wt;
  cv.bufs[2] = O;
  cv.flops = 2.0 * N * K * H * H * Cc * 9;
  memcpy(cv2.bufs, cv.bufs, sizeof cv.bufs);
  cv2.flops = cv.flops;
  /* im2col operands for the peer: [N*H*W, C*9] x [C*9, K] */
  int M2 = N * H * H, K2 = Cc * 9;
  float *col = rnd((int64_t)M2 * K2, 8), *Wc = rnd((int64_t)K2 * K, 9);
  float *O2 = rnd((int64_t)M2 * K, 10);
  for (int th = 1; th <= 2; th++) {
    const nf_schedule *used = th == 1 ? s_cv : (s_cv2 ? s_cv2 : s_cv);
    double a = time_kernel(th == 1 ? &cv : &cv2, th, reps),
           b = time_sgemm(M2, K, K2, col, Wc, O2, th, reps);
    printf("%-34s %8d %9.1f GF %9.1f GF %8.2f\n",
           used ? "conv2d workload (tuned schedule)" : "conv2d workload (default schedule)", th, a,
           b, a / b);
  }
  printf("  (compile %.1f ms; peer: sgemm on the im2col matrix, im2col not timed)\n",
         cv.compile_ms);
  nf_kernel_free(mm.k);
  nf_kernel_free(mm2.k);
  nf_kernel_free(cv.k);
  nf_kernel_free(cv2.k);
  nf_schedule_free(s_mm);
  nf_schedule_free(s_mm2);
  nf_schedule_free(s_cv);
  nf_schedule_free(s_cv2);
  free(A);
  free(B);
  free(C);
  free(Cb);
  free(img);
  free(Wt);
  free(O);
  free(col);
  free(Wc);
  free(O2);
  return 0;
}
