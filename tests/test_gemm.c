/* test_gemm.c - tier 0 of matmul-shaped subgraphs through cblas_sgemm
 * (client/executor/nf_gemm.h).
 *
 * Every graph is partitioned (nf_partition_graph) and every subgraph that
 * nf_gemm_prepare accepts is run both ways on random inputs (never
 * zeros; odd sizes): nf_gemm_run must write every output (they start as
 * NaN) and agree with nf_interp_run (f32) within 1e-5 of the output's
 * largest magnitude, twice with fresh inputs (the intermediates are
 * reused).  Covered: the four transposes, operands in either order, a
 * transposed result, batches (shared, fused, one operand batched, batch in
 * the middle), matrix-vector and dot products, linear + ReLU (epilogue),
 * lltm_cell (concat prologue), the gradient graphs of matmul_loss and
 * lltm_loss (the GEMM subgraphs counted), several reduction variables (one
 * block, an accumulating loop), a constant index, convolutions through a
 * gather (conv2d with stride 1 and 2, pad 0 and 1, depthwise, and the
 * gradient graphs of conv2d, conv2d_relu_loss and mobilenet_dws_loss),
 * and the shapes that must stay with the interpreter (a scaled product,
 * both operands shifted, a shifted range not from 0, a one-sided sum, a
 * max-reduction, f64).  An epilogue's run-time error comes back from
 * nf_gemm_run with the interpreter's message. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_conv.h"
#include "nf_cublas.h"
#include "nf_cuda_rt.h"
#include "nf_cudnn.h"
#include "nf_diag.h"
#include "nf_gemm.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_partition.h"

static const char *const kSrc =
    "def mm_nn(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n}\n"
    "def mm_nt(A: f32[M, K], B: f32[N, K]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(j, k)\n}\n"
    "def mm_tn(A: f32[K, M], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(k, i) * B(k, j)\n}\n"
    "def mm_tt(A: f32[K, M], B: f32[N, K]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(k, i) * B(j, k)\n}\n"
    "def mm_swapped(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! B(k, j) * A(i, k)\n}\n"
    "def mm_ct(A: f32[N, K], B: f32[K, M]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(j, k) * B(k, i)\n}\n"
    "def bmm(A: f32[Bt, M, K], B: f32[Bt, K, N]) -> (C: f32[Bt, M, N]) {\n"
    "  C(b, i, j) +=! A(b, i, k) * B(b, k, j)\n}\n"
    "def bmm_w(A: f32[Bt, M, K], W: f32[K, N]) -> (C: f32[Bt, M, N]) {\n"
    "  C(b, i, j) +=! A(b, i, k) * W(k, j)\n}\n"
    "def bmm_wl(W: f32[M, K], B: f32[Bt, K, N]) -> (C: f32[Bt, M, N]) {\n"
    "  C(b, i, j) +=! W(i, k) * B(b, k, j)\n}\n"
    "def bmm_mid(A: f32[M, Bt, K], B: f32[Bt, N, K]) -> (C: f32[Bt, M, N]) {\n"
    "  C(b, i, j) +=! A(i, b, k) * B(b, j, k)\n}\n"
    "def bmm_bcast(A: f32[M, K], B: f32[K, N]) -> (C: f32[3, M, N]) {\n"
    "  C(b, i, j) +=! A(i, k) * B(k, j)\n}\n"
    "def matvec(A: f32[M, K], x: f32[K]) -> (y: f32[M]) {\n"
    "  y(i) +=! A(i, k) * x(k)\n}\n"
    "def matvec_t(A: f32[K, M], x: f32[K]) -> (y: f32[M]) {\n"
    "  y(i) +=! A(k, i) * x(k)\n}\n"
    "def vecmat(x: f32[K], A: f32[K, N]) -> (y: f32[1, N]) {\n"
    "  y(o, j) +=! x(k) * A(k, j)\n}\n"
    "def vecmat_t(x: f32[K], A: f32[N, K]) -> (y: f32[1, N]) {\n"
    "  y(o, j) +=! x(k) * A(j, k)\n}\n"
    "def dot_strided(x: f32[K, 3], z: f32[2, K]) -> (s: f32[]) {\n"
    "  s() +=! x(k, 1) * z(1, k)\n}\n"
    "def dot(x: f32[K], z: f32[K]) -> (s: f32[]) {\n"
    "  s() +=! x(k) * z(k)\n}\n"
    "def xtx(A: f32[K, M]) -> (C: f32[M, M]) {\n"
    "  C(i, j) +=! A(k, i) * A(k, j)\n}\n"
    "def mm_lo(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j) where k in 2:K\n}\n"
    "def mm_k0(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j) where k in 3:3\n}\n"
    "def mm_gather(A: f32[M, K], B: f32[K, N], idx: i64[P]) -> (Y: f32[P, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "  Y(p, j) = C(idx(p), j)\n}\n"
    "def two_red(A: f32[M, K, L], B: f32[K, L]) -> (C: f32[M]) {\n"
    "  C(i) +=! A(i, k, l) * B(k, l)\n}\n"
    "def red_loop(A: f32[K, M, L], B: f32[K, L, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(k, i, l) * B(k, l, j)\n}\n"
    "def mm_const(A: f32[M, 2, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, 1, k) * B(k, j)\n}\n"
    "def mm_shifted(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k + 1) * B(k, j) where k in 0:K - 1\n}\n"
    "def mm_masked(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! (i + k) % 3 != 0 ? A(i, k) * B(k, j) : 0.0\n}\n"
    "def mm_shifted_lo(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k - 1) * B(k, j) where k in 1:K\n}\n"
    "def both_shifted(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k + 1) * B(k + 1, j) where k in 0:K - 1\n}\n"
    /* not matmul-shaped */
    "def mm_scaled(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! 2.0 * A(i, k) * B(k, j)\n}\n"
    "def one_sided(A: f32[M, K], B: f32[M, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(i, j)\n}\n"
    "def mm_max(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) max=! A(i, k) * B(k, j)\n}\n"
    "def mm_f64(A: f64[M, K], B: f64[K, N]) -> (C: f64[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n}\n"
    /* convolutions written by hand, for cuDNN (nf_conv.h) */
    "def cv_swapped(I: f32[N, C, H, W], F: f32[K, C, 3, 3]) -> (O: f32[N, K, H, W]) {\n"
    "  O(n, k, y, x) +=! F(k, c, r, s) * (y + r - 1 >= 0 && y + r - 1 < H && x + s - 1 >= 0 &&\n"
    "                    x + s - 1 < W && k >= 0 ? I(n, c, y + r - 1, x + s - 1) : 0.0)\n}\n"
    "def cv_bias_relu(I: f32[N, C, H, W], F: f32[K, C, 2, 3], b: f32[K])\n"
    "    -> (O: f32[N, K, H - 1, W - 2]) {\n"
    "  T(n, k, y, x) +=! I(n, c, y + r, x + s) * F(k, c, r, s) where y in 0:H - 1, x in 0:W - 2\n"
    "  O(n, k, y, x) = max(T(n, k, y, x) + b(k), 0.0)\n}\n"
    "def cv_crop(I: f32[N, C, H, W], F: f32[K, C, 3, 3]) -> (O: f32[N, K, H - 3, W - 3]) {\n"
    "  O(n, k, y, x) +=! I(n, c, y + r, x + s) * F(k, c, r, s)\n}\n"
    "def cv_narrow(I: f32[N, C, H, W], F: f32[K, C, 3, 3]) -> (O: f32[N, K, H, W]) {\n"
    "  O(n, k, y, x) +=! (y + r - 1 >= 0 && y + r - 1 < H - 1 && x + s - 1 >= 0 &&\n"
    "                    x + s - 1 < W) ? I(n, c, y + r - 1, x + s - 1) * F(k, c, r, s) : 0.0\n}\n"
    "def cv_scaled(I: f32[N, C, H, W], F: f32[K, C, 3, 3]) -> (O: f32[N, K, H - 2, W - 2]) {\n"
    "  O(n, k, y, x) +=! 2.0 * I(n, c, y + r, x + s) * F(k, c, r, s)\n}\n"
    "def cv_groups_shifted(I: f32[N, C, H, W], F: f32[K, CG, 3, 3]) -> (O: f32[N, K, H, W]) {\n"
    "  O(n, k, y, x) +=! (y + r - 1 >= 0 && y + r - 1 < H && x + s - 1 >= 0 && x + s - 1 < W) ?\n"
    "    I(n, (k // (K // (C // CG)) + 1) % (C // CG) * CG + c, y + r - 1, x + s - 1) *\n"
    "    F(k, c, r, s) : 0.0\n}\n";

/* ---- instantiation ---- */

/* def of a file under $NEOFLOW_LIB (rel) or of kSrc (rel NULL). */
static nf_graph *inst(const char *rel, const char *def, int n, const nf_arg_shape *sh,
                      nf_ir_ctx *ctx) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(lib);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc;
  if (rel) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", lib, rel);
    rc = nf_module_load_file(m, path, d);
  } else {
    rc = nf_module_load_source(m, "gemm_cases.nf", kSrc, d);
  }
  ck_assert_msg(rc == NF_OK, "%s", nf_diag_text(d));
  nf_graph *g = NULL;
  nf_inst_opts o = {.n_shapes = n, .shapes = sh};
  ck_assert_msg(nf_module_instantiate(m, def, &o, ctx, &g, d) == NF_OK, "%s: %s", def,
                nf_diag_text(d));
  nf_diag_free(d);
  nf_module_free(m);
  return g;
}

#define SH(...) {NULL, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}}

/* ---- running a subgraph both ways ---- */

/* The pool nf_gemm_run splits large products and gathers over, made in
 * the process that runs the test (a forked test has no parent's threads). */
static nf_pool *g_pool;

static nf_pool *test_pool(void) {
  if (!g_pool) g_pool = nf_pool_new(2);
  ck_assert_ptr_nonnull(g_pool);
  return g_pool;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double unit(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* Fills a with random non-zero floats in +-[0.1, 1], integers with 0 (or
 * int_fill). */
static void fill(nf_array *a, int64_t int_fill) {
  for (int64_t i = 0; i < a->numel; i++) {
    double v = 0.1 + 0.9 * unit();
    if (unit() < 0.5) v = -v;
    switch (a->dtype) {
    case NF_F32: ((float *)a->data)[i] = (float)v; break;
    case NF_I64: ((int64_t *)a->data)[i] = int_fill; break;
    case NF_I32: ((int32_t *)a->data)[i] = (int32_t)int_fill; break;
    case NF_BOOL: ((uint8_t *)a->data)[i] = 0; break;
    default: ck_abort_msg("dtype %d", (int)a->dtype);
    }
  }
}

/* Runs s and the interpreter on sub twice with fresh inputs; asserts
 * agreement.  With int_fill != 0 expects nf_gemm_run to fail instead and
 * returns its status. */
static int compare(const nf_graph *sub, nf_gemm_sub *s, int64_t int_fill) {
  uint32_t ni = sub->n_inputs, no = sub->n_outputs;
  nf_array *in = calloc(ni ? ni : 1, sizeof *in), *want = calloc(no ? no : 1, sizeof *want);
  void **bufs = calloc(ni + no ? ni + no : 1, sizeof *bufs);
  nf_buf err = NF_BUF_INIT;
  int status = NF_OK;
  for (uint32_t k = 0; k < ni; k++) {
    const nf_tensor *t = &sub->tensors[sub->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
    bufs[k] = in[k].data;
  }
  for (uint32_t k = 0; k < no; k++) {
    const nf_tensor *t = &sub->tensors[sub->outputs[k]];
    size_t bytes = (size_t)nf_tensor_numel(t) * nf_dtype_size((nf_dtype)t->dtype);
    bufs[ni + k] = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(bufs[ni + k]);
  }
  for (int rep = 0; rep < 2; rep++) {
    for (uint32_t k = 0; k < ni; k++) fill(&in[k], int_fill);
    for (uint32_t k = 0; k < no; k++) {
      const nf_tensor *t = &sub->tensors[sub->outputs[k]];
      memset(bufs[ni + k], 0xff, (size_t)nf_tensor_numel(t) * nf_dtype_size((nf_dtype)t->dtype));
    }
    /* the calling thread alone, then split over the test's pool */
    int rc = nf_gemm_run(s, bufs, rep ? test_pool() : NULL, &err);
    if (int_fill) {
      ck_assert_int_ne(rc, NF_OK);
      ck_assert_msg(strstr(nf_buf_str(&err), "epilogue") != NULL, "%s", nf_buf_str(&err));
      status = rc;
      break;
    }
    ck_assert_msg(rc == NF_OK, "%s: %s", nf_gemm_describe(s), nf_buf_str(&err));
    ck_assert_msg(nf_interp_run(sub, in, NF_INTERP_F32, want, &err) == NF_OK, "%s",
                  nf_buf_str(&err));
    for (uint32_t k = 0; k < no; k++) {
      const nf_tensor *t = &sub->tensors[sub->outputs[k]];
      ck_assert_int_eq(want[k].dtype, t->dtype);
      if (t->dtype != NF_F32) {
        ck_assert(memcmp(want[k].data, bufs[ni + k],
                         (size_t)want[k].numel * nf_dtype_size(want[k].dtype)) == 0);
      } else {
        const float *w = want[k].data, *got = bufs[ni + k];
        double max_abs = 0, max_diff = 0;
        for (int64_t i = 0; i < want[k].numel; i++) {
          ck_assert_msg(!isnan(got[i]), "%s: output %s[%lld] not written",
                        nf_gemm_describe(s), t->name, (long long)i);
          if (fabs(w[i]) > max_abs) max_abs = fabs(w[i]);
          if (fabs((double)w[i] - got[i]) > max_diff) max_diff = fabs((double)w[i] - got[i]);
        }
        ck_assert_msg(max_diff <= 1e-5 * max_abs, "%s: output %s differs by %g (max %g)",
                      nf_gemm_describe(s), t->name, max_diff, max_abs);
      }
      nf_array_free(&want[k]);
    }
  }
  for (uint32_t k = 0; k < ni; k++) nf_array_free(&in[k]);
  for (uint32_t k = 0; k < no; k++) free(bufs[ni + k]);
  free(in);
  free(want);
  free(bufs);
  nf_buf_free(&err);
  return status;
}

#define MAX_DESC 64

typedef struct result {
  int n_sub, n_gemm;
  char desc[MAX_DESC][160]; /* of the GEMM subgraphs, in order */
} result;

/* Partitions g and checks every matmul-shaped subgraph. */
static void check_graph(const nf_graph *g, result *r) {
  memset(r, 0, sizeof *r);
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_partition_graph(g, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
  r->n_sub = (int)p->n;
  for (uint32_t i = 0; i < p->n; i++) {
    nf_gemm_sub *s = NULL;
    ck_assert_msg(nf_gemm_prepare(p->sub[i].g, &s, &err) == NF_OK, "%s", nf_buf_str(&err));
    if (!s) continue;
    if (r->n_gemm < MAX_DESC)
      snprintf(r->desc[r->n_gemm], sizeof r->desc[0], "%s", nf_gemm_describe(s));
    r->n_gemm++;
    compare(p->sub[i].g, s, 0);
    nf_gemm_free(s);
  }
  nf_partition_free(p);
  nf_buf_free(&err);
}

/* One def of kSrc: one GEMM subgraph described as want (a prefix). */
static void one(const char *def, int n, const nf_arg_shape *sh, const char *want) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst(NULL, def, n, sh, ctx);
  result r;
  check_graph(g, &r);
  ck_assert_msg(r.n_gemm == 1, "%s: %d GEMM subgraphs", def, r.n_gemm);
  ck_assert_msg(strncmp(r.desc[0], want, strlen(want)) == 0, "%s: \"%s\", want \"%s\"", def,
                r.desc[0], want);
  nf_ir_ctx_free(ctx);
}

/* M 13, K 7, N 9, batch 3 */
START_TEST(gemm_transposes) {
  nf_arg_shape mk[2] = {SH(13, 7), SH(7, 9)};
  one("mm_nn", 2, mk, "sgemm NN 13x9x7 batch 1, prologue 0 stmts, epilogue 0 stmts");
  nf_arg_shape nt[2] = {SH(13, 7), SH(9, 7)};
  one("mm_nt", 2, nt, "sgemm NT 13x9x7 batch 1");
  nf_arg_shape tn[2] = {SH(7, 13), SH(7, 9)};
  one("mm_tn", 2, tn, "sgemm TN 13x9x7 batch 1");
  nf_arg_shape tt[2] = {SH(7, 13), SH(9, 7)};
  one("mm_tt", 2, tt, "sgemm TT 13x9x7 batch 1");
  one("mm_swapped", 2, mk, "sgemm NN 13x9x7 batch 1");
  /* C = B^T A^T: computed as C with rows from B */
  nf_arg_shape ct[2] = {SH(9, 7), SH(7, 13)};
  one("mm_ct", 2, ct, "sgemm TT 13x9x7 batch 1");
  nf_arg_shape xtx[1] = {SH(7, 13)};
  one("xtx", 1, xtx, "sgemm TN 13x13x7 batch 1");
  nf_arg_shape mv[2] = {SH(13, 7), SH(7)};
  one("matvec", 2, mv, "sgemm NN 13x1x7 batch 1");
  nf_arg_shape dt[2] = {SH(7), SH(7)};
  one("dot", 2, dt, "sgemm NN 1x1x7 batch 1");
  /* a reduction range that starts at 2, and an empty one (C = 0) */
  one("mm_lo", 2, mk, "sgemm NN 13x9x5 batch 1");
  one("mm_k0", 2, mk, "sgemm NN 13x9x0 batch 1");
}
END_TEST

/* Vector results: sdot and sgemv, each orientation and stride. */
START_TEST(gemm_vectors) {
  nf_arg_shape mv[2] = {SH(7, 13), SH(7)};
  one("matvec_t", 2, mv, "sgemm TN 13x1x7 batch 1");
  nf_arg_shape vm[2] = {SH(7), SH(7, 13)};
  one("vecmat", 2, vm, "sgemm NN 1x13x7 batch 1");
  nf_arg_shape vt[2] = {SH(7), SH(13, 7)};
  one("vecmat_t", 2, vt, "sgemm NT 1x13x7 batch 1");
  nf_arg_shape ds[2] = {SH(7, 3), SH(2, 7)};
  one("dot_strided", 2, ds, "sgemm TN 1x1x7 batch 1");
}
END_TEST

/* Products large enough to be split over the pool: by calls, by rows, by
 * columns (with a reduction loop accumulating), at 2 and 3 threads. */
START_TEST(gemm_parallel) {
  for (int th = 2; th <= 3; th++) {
    nf_pool *keep = test_pool();
    g_pool = th == 2 ? keep : nf_pool_new(th);
    ck_assert_ptr_nonnull(g_pool);
    nf_arg_shape nn[2] = {SH(96, 40), SH(40, 200)};
    one("mm_nn", 2, nn, "sgemm NN 96x200x40 batch 1");
    nf_arg_shape tn[2] = {SH(40, 200), SH(40, 40)};
    one("mm_tn", 2, tn, "sgemm TN 200x40x40 batch 1");
    nf_arg_shape b4[2] = {SH(4, 33, 29), SH(4, 29, 47)};
    one("bmm", 2, b4, "sgemm NN 33x47x29 batch 4");
    nf_arg_shape b3[2] = {SH(3, 40, 30), SH(3, 30, 70)};
    one("bmm", 2, b3, "sgemm NN 40x70x30 batch 3");
    nf_arg_shape rl[2] = {SH(9, 40, 30), SH(9, 30, 50)};
    one("red_loop", 2, rl, "sgemm NN 40x50x30 batch 9");
    nf_arg_shape mv[2] = {SH(600, 300), SH(300)};
    one("matvec", 2, mv, "sgemm NN 600x1x300 batch 1");
    nf_arg_shape vm[2] = {SH(300), SH(300, 600)};
    one("vecmat", 2, vm, "sgemm NN 1x600x300 batch 1");
    nf_arg_shape dt[2] = {SH(200000), SH(200000)};
    one("dot", 2, dt, "sgemm NN 1x1x200000 batch 1");
    if (th != 2) nf_pool_free(g_pool);
    g_pool = keep;
  }
}
END_TEST

START_TEST(gemm_batched) {
  nf_arg_shape bmm[2] = {SH(3, 13, 7), SH(3, 7, 9)};
  one("bmm", 2, bmm, "sgemm NN 13x9x7 batch 3");
  /* a weight shared across the batch: batch and rows are one block */
  nf_arg_shape w[2] = {SH(3, 13, 7), SH(7, 9)};
  one("bmm_w", 2, w, "sgemm NN 39x9x7 batch 1");
  nf_arg_shape wl[2] = {SH(13, 7), SH(3, 7, 9)};
  one("bmm_wl", 2, wl, "sgemm NN 13x9x7 batch 3");
  nf_arg_shape mid[2] = {SH(13, 3, 7), SH(3, 9, 7)};
  one("bmm_mid", 2, mid, "sgemm NT 13x9x7 batch 3");
  nf_arg_shape bc[2] = {SH(13, 7), SH(7, 9)};
  one("bmm_bcast", 2, bc, "sgemm NN 13x9x7 batch 3");
  /* the library's batch_matmul over two batch dims (one block of 6) */
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape b4[2] = {SH(2, 3, 5, 7), SH(2, 3, 7, 4)};
  nf_graph *g = inst("nn.nf", "batch_matmul", 2, b4, ctx);
  result r;
  check_graph(g, &r);
  ck_assert_int_eq(r.n_gemm, 1);
  ck_assert_str_eq(r.desc[0], "sgemm NN 5x4x7 batch 6, prologue 0 stmts, epilogue 0 stmts");
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(gemm_prologue_epilogue) {
  static const char *src =
      "import nn\n"
      "def lin_relu(X: f32[N, I], W: f32[O, I], b: f32[O]) -> (Y: f32[N, O]) {\n"
      "  Z = linear(X, W, b)\n  Y = relu(Z)\n}\n";
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(lib);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_int_eq(nf_module_set_lib_dir(m, lib), NF_OK);
  ck_assert_msg(nf_module_load_source(m, "lin_relu.nf", src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_arg_shape sh[3] = {SH(11, 17), SH(6, 17), SH(6)};
  nf_inst_opts o = {.n_shapes = 3, .shapes = sh};
  nf_graph *g = NULL;
  ck_assert_msg(nf_module_instantiate(m, "lin_relu", &o, ctx, &g, d) == NF_OK, "%s",
                nf_diag_text(d));
  nf_diag_free(d);
  nf_module_free(m);
  result r;
  check_graph(g, &r);
  ck_assert_int_eq(r.n_sub, 1);
  ck_assert_int_eq(r.n_gemm, 1);
  ck_assert_str_eq(r.desc[0], "sgemm NT 11x6x17 batch 1, prologue 0 stmts, epilogue 2 stmts");
  nf_ir_ctx_free(ctx);

  /* lltm_cell: the concat is inlined before the matmul, the gates after */
  ctx = nf_ir_ctx_new();
  nf_arg_shape cell[5] = {SH(3, 5), SH(3, 4), SH(3, 4), SH(12, 9), SH(12)};
  g = inst("../examples/models.nf", "lltm_cell", 5, cell, ctx);
  check_graph(g, &r);
  ck_assert_int_eq(r.n_gemm, 1);
  ck_assert_msg(strncmp(r.desc[0], "sgemm NT 3x12x9 batch 1, prologue 1 stmt, epilogue", 50) == 0,
                "%s", r.desc[0]);
  nf_ir_ctx_free(ctx);
}
END_TEST

static nf_graph *grad(const nf_graph *g, int n, const char **wrt, nf_ir_ctx *ctx) {
  nf_grad_opts go = {.n_wrt = n, .wrt = wrt};
  nf_graph *gg = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_grad_graph(g, &go, ctx, &gg, NULL, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_buf_free(&err);
  return gg;
}

static int count_prefix(const result *r, const char *prefix) {
  int n = 0;
  for (int i = 0; i < r->n_gemm && i < MAX_DESC; i++)
    n += strncmp(r->desc[i], prefix, strlen(prefix)) == 0;
  return n;
}

START_TEST(gemm_gradients) {
  /* matmul_loss: dA = dC B^T (NT) and dB = A^T dC (TN) */
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape mm[3] = {SH(13, 7), SH(7, 9), SH(13, 9)};
  nf_graph *g = inst("../examples/workloads.nf", "matmul_loss", 3, mm, ctx);
  const char *ab[2] = {"A", "B"};
  result r;
  check_graph(grad(g, 2, ab, ctx), &r);
  ck_assert_int_ge(r.n_gemm, 2);
  ck_assert_int_eq(count_prefix(&r, "sgemm NT 13x7x9 batch 1"), 1);
  ck_assert_int_eq(count_prefix(&r, "sgemm TN 7x9x13 batch 1"), 1);
  nf_ir_ctx_free(ctx);

  /* lltm_loss (8 steps): per step the forward X W^T, and backward dG W
   * (into [x, h]) and dG^T XH (into W); the step-1 dG W feeds only X and
   * H0, which are not differentiated */
  ctx = nf_ir_ctx_new();
  nf_arg_shape ll[5] = {SH(8, 3, 5), SH(3, 4), SH(3, 4), SH(12, 9), SH(12)};
  g = inst("../examples/workloads.nf", "lltm_loss", 5, ll, ctx);
  const char *wb[2] = {"W", "b"};
  check_graph(grad(g, 2, wb, ctx), &r);
  ck_assert_int_eq(count_prefix(&r, "sgemm NT 3x12x9"), 8);
  ck_assert_int_eq(count_prefix(&r, "sgemm NN 3x9x12"), 7);
  ck_assert_int_eq(count_prefix(&r, "sgemm TN 12x9x3"), 8);
  ck_assert_int_eq(r.n_gemm, 23);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(gemm_not_matmul_shaped) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  result r;
  static const char *defs[] = {"mm_scaled", "one_sided", "mm_max", "mm_f64"};
  nf_arg_shape mk[2] = {SH(13, 7), SH(7, 9)}, os[2] = {SH(13, 7), SH(13, 9)};
  for (size_t i = 0; i < sizeof defs / sizeof *defs; i++) {
    nf_graph *g = inst(NULL, defs[i], 2, strcmp(defs[i], "one_sided") == 0 ? os : mk, ctx);
    check_graph(g, &r);
    ck_assert_msg(r.n_gemm == 0, "%s matched: %s", defs[i], r.desc[0]);
  }
  nf_ir_ctx_free(ctx);
}
END_TEST

/* Several reduction variables: one block (K), a loop of accumulating
 * calls, a constant index, a shifted operand or a guard (gathered). */
START_TEST(gemm_reductions) {
  nf_arg_shape tr[2] = {SH(13, 7, 5), SH(7, 5)};
  one("two_red", 2, tr, "sgemm NN 13x1x35 batch 1, prologue 0 stmts, epilogue 0 stmts");
  nf_arg_shape rl[2] = {SH(7, 13, 5), SH(7, 5, 9)};
  one("red_loop", 2, rl, "sgemm NN 13x9x5 batch 7, prologue 0 stmts, epilogue 0 stmts");
  nf_arg_shape mc[2] = {SH(13, 2, 7), SH(7, 9)};
  one("mm_const", 2, mc, "sgemm NN 13x9x7 batch 1, prologue 0 stmts, epilogue 0 stmts");
  nf_arg_shape mk[2] = {SH(13, 7), SH(7, 9)};
  /* operands at a constant offset (slices): the offset in the pointer */
  one("mm_shifted", 2, mk, "sgemm NN 13x9x6 batch 1, prologue 0 stmts, epilogue 0 stmts");
  one("mm_shifted_lo", 2, mk, "sgemm NN 13x9x6 batch 1, prologue 0 stmts, epilogue 0 stmts");
  one("both_shifted", 2, mk, "sgemm NN 13x9x6 batch 1, prologue 0 stmts, epilogue 0 stmts");
  one("mm_masked", 2, mk,
      "sgemm TN 13x9x7 batch 1, prologue 1 stmt, epilogue 0 stmts, gather 1 stmt");
}
END_TEST

static int count_substr(const result *r, const char *sub) {
  int n = 0;
  for (int i = 0; i < r->n_gemm && i < MAX_DESC; i++) n += strstr(r->desc[i], sub) != NULL;
  return n;
}

/* lib/nn.nf's conv2d with template parameters. */
static nf_graph *conv_d(int stride, int pad, int dilation, int groups, const nf_arg_shape *sh,
                        nf_ir_ctx *ctx) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(lib);
  char path[4096];
  snprintf(path, sizeof path, "%s/nn.nf", lib);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_file(m, path, d) == NF_OK, "%s", nf_diag_text(d));
  const char *names[4] = {"stride", "pad", "dilation", "groups"};
  int64_t vals[4] = {stride, pad, dilation, groups};
  nf_inst_opts o = {.n_shapes = 2, .shapes = sh, .n_params = 4, .param_names = names,
                    .param_values = vals};
  nf_graph *g = NULL;
  ck_assert_msg(nf_module_instantiate(m, "conv2d", &o, ctx, &g, d) == NF_OK, "%s",
                nf_diag_text(d));
  nf_diag_free(d);
  nf_module_free(m);
  return g;
}

static nf_graph *conv(int stride, int pad, int groups, const nf_arg_shape *sh, nf_ir_ctx *ctx) {
  return conv_d(stride, pad, 1, groups, sh, ctx);
}

/* The forward convolution and its weight gradient gather the same cells
 * of I: the gradient can take the forward's gathered operand
 * (nf_gemm_run_shared); with a different buffer passed as I, its result
 * is still the one of the forward's I, bit for bit. */
START_TEST(gemm_gather_shared) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape cv[2] = {SH(2, 3, 9, 7), SH(4, 3, 3, 3)};
  nf_graph *g = inst("../examples/workloads.nf", "conv2d_relu_loss", 2, cv, ctx);
  const char *wt[1] = {"Wt"};
  nf_graph *gg = grad(g, 1, wt, ctx);
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_partition_graph(gg, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_gemm_sub *gs[2] = {NULL, NULL};
  uint32_t which[2] = {0, 0};
  int n = 0;
  for (uint32_t i = 0; i < p->n; i++) {
    nf_gemm_sub *s = NULL;
    ck_assert(nf_gemm_prepare(p->sub[i].g, &s, &err) == NF_OK);
    if (s && nf_gemm_gather_input(s) >= 0 && n < 2) {
      gs[n] = s;
      which[n++] = i;
    } else {
      nf_gemm_free(s);
    }
  }
  ck_assert_int_eq(n, 2);
  ck_assert(nf_gemm_gather_same(gs[0], gs[1]) && nf_gemm_gather_same(gs[1], gs[0]));
  /* one buffer per tensor of the gradient graph, random; I2 another I */
  void **buf = calloc(gg->n_tensors, sizeof *buf);
  ck_assert_ptr_nonnull(buf);
  for (uint32_t t = 0; t < gg->n_tensors; t++) {
    int64_t ne = nf_tensor_numel(&gg->tensors[t]);
    ck_assert_int_eq(gg->tensors[t].dtype, NF_F32);
    float *f = malloc(sizeof(float) * (size_t)(ne ? ne : 1));
    for (int64_t i = 0; i < ne; i++) f[i] = (float)(unit() - 0.5);
    buf[t] = f;
  }
  const nf_subgraph *sa = &p->sub[which[0]], *sb = &p->sub[which[1]];
  uint32_t t_i = sb->in[nf_gemm_gather_input(gs[1])];
  ck_assert_str_eq(gg->tensors[t_i].name, "I");
  ck_assert_uint_eq(sa->in[nf_gemm_gather_input(gs[0])], t_i);
  int64_t ni = nf_tensor_numel(&gg->tensors[t_i]);
  float *i2 = malloc(sizeof(float) * (size_t)ni);
  for (int64_t i = 0; i < ni; i++) i2[i] = (float)(unit() + 0.5);
  void *ba[16], *bb[16];
  ck_assert(sa->n_in + sa->n_out <= 16 && sb->n_in + sb->n_out <= 16);
  for (uint32_t k = 0; k < sa->n_in + sa->n_out; k++)
    ba[k] = buf[k < sa->n_in ? sa->in[k] : sa->out[k - sa->n_in]];
  uint32_t t_out = sb->out[0];
  int64_t no = nf_tensor_numel(&gg->tensors[t_out]);
  float *want = malloc(sizeof(float) * (size_t)no), *other = malloc(sizeof(float) * (size_t)no);
  for (int rep = 0; rep < 3; rep++) {
    for (uint32_t k = 0; k < sb->n_in + sb->n_out; k++)
      bb[k] = buf[k < sb->n_in ? sb->in[k] : sb->out[k - sb->n_in]];
    ck_assert(nf_gemm_run(gs[0], ba, test_pool(), &err) == NF_OK);
    if (rep == 0) { /* the weight gradient from I itself */
      ck_assert(nf_gemm_run(gs[1], bb, test_pool(), &err) == NF_OK);
      memcpy(want, buf[t_out], sizeof(float) * (size_t)no);
      continue;
    }
    bb[nf_gemm_gather_input(gs[1])] = i2;
    if (rep == 1) { /* from I2: another result */
      ck_assert(nf_gemm_run(gs[1], bb, test_pool(), &err) == NF_OK);
      memcpy(other, buf[t_out], sizeof(float) * (size_t)no);
      ck_assert(memcmp(want, other, sizeof(float) * (size_t)no) != 0);
    } else { /* shared: the forward's gather of I, whatever is passed */
      ck_assert(nf_gemm_run_shared(gs[1], bb, test_pool(), gs[0], &err) == NF_OK);
      ck_assert(memcmp(want, buf[t_out], sizeof(float) * (size_t)no) == 0);
    }
  }
  /* a convolution of another stride gathers other cells */
  nf_arg_shape big[2] = {SH(2, 3, 9, 7), SH(4, 3, 3, 3)};
  nf_partition *p2 = NULL;
  ck_assert(nf_partition_graph(conv(2, 1, 1, big, ctx), &p2, &err) == NF_OK);
  for (uint32_t i = 0; i < p2->n; i++) {
    nf_gemm_sub *s = NULL;
    ck_assert(nf_gemm_prepare(p2->sub[i].g, &s, &err) == NF_OK);
    if (s) ck_assert(!nf_gemm_gather_same(s, gs[0]));
    nf_gemm_free(s);
  }
  nf_partition_free(p2);
  for (uint32_t t = 0; t < gg->n_tensors; t++) free(buf[t]);
  free(buf);
  free(i2);
  free(want);
  free(other);
  nf_gemm_free(gs[0]);
  nf_gemm_free(gs[1]);
  nf_partition_free(p);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* Convolutions: the shifted, zero-padded input gathered (im2col), then
 * sgemm; the weight gradient likewise, and the data gradient. */
START_TEST(gemm_conv) {
  nf_arg_shape cv[2] = {SH(2, 3, 9, 7), SH(4, 3, 3, 3)};
  for (int stride = 1; stride <= 2; stride++)
    for (int pad = 0; pad <= 1; pad++) {
      nf_ir_ctx *ctx = nf_ir_ctx_new();
      nf_graph *g = conv(stride, pad, 1, cv, ctx);
      result r;
      check_graph(g, &r);
      ck_assert_int_eq(r.n_sub, 1);
      ck_assert_msg(r.n_gemm == 1 && strstr(r.desc[0], "gather 1 stmt"),
                    "stride %d pad %d: %d GEMM subgraphs (%s)", stride, pad, r.n_gemm, r.desc[0]);
      /* per image: channels x output positions x (c, r, s) */
      ck_assert_msg(strncmp(r.desc[0], "sgemm NN 4x", 11) == 0 &&
                        strstr(r.desc[0], "x27 batch 2,") != NULL,
                    "%s", r.desc[0]);
      const char *w[2] = {"W", "I"};
      check_graph(grad(g, 2, w, ctx), &r);
      /* dW, and dI where its window is plain in the weight (stride 1;
       * with stride 2 both of dI's factors are shifted: interpreter) */
      ck_assert_msg(count_substr(&r, "gather 1 stmt") == (stride == 1 ? 2 : 1),
                    "stride %d pad %d: %d gathers",
                    stride, pad, count_substr(&r, "gather 1 stmt"));
      /* every convolution gather has affine indices and guard: native */
      ck_assert_int_eq(count_substr(&r, "(native)"), count_substr(&r, "gather 1 stmt"));
      nf_ir_ctx_free(ctx);
    }
  /* a gather large enough to be split over threads (3: uneven shares) */
  {
    nf_pool *two = g_pool;
    g_pool = nf_pool_new(3);
    ck_assert_ptr_nonnull(g_pool);
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_arg_shape big[2] = {SH(4, 8, 35, 33), SH(8, 8, 3, 3)};
    result r;
    check_graph(conv(1, 1, 1, big, ctx), &r);
    ck_assert_msg(r.n_gemm == 1 && strstr(r.desc[0], "(native)"), "%s", r.desc[0]);
    const char *w[2] = {"W", "I"};
    check_graph(grad(conv(2, 1, 1, big, ctx), 2, w, ctx), &r);
    ck_assert_int_ge(count_substr(&r, "(native)"), 1);
    nf_ir_ctx_free(ctx);
    nf_pool_free(g_pool);
    g_pool = two;
  }
  /* a depthwise convolution: a batch of matrix-vector products */
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape dw[2] = {SH(2, 3, 9, 7), SH(3, 1, 3, 3)};
  result r;
  check_graph(conv(1, 1, 3, dw, ctx), &r);
  ck_assert_int_eq(r.n_gemm, 1);
  ck_assert_msg(strstr(r.desc[0], "gather 1 stmt") != NULL, "%s", r.desc[0]);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(gemm_conv_training) {
  /* conv2d_relu_loss: the forward conv, dWt and dI each one gather and
   * sgemm */
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape cv[2] = {SH(2, 3, 9, 7), SH(4, 3, 3, 3)};
  nf_graph *g = inst("../examples/workloads.nf", "conv2d_relu_loss", 2, cv, ctx);
  const char *wi[2] = {"Wt", "I"};
  result r;
  check_graph(grad(g, 2, wi, ctx), &r);
  ck_assert_int_eq(count_substr(&r, "gather 1 stmt"), 3);
  ck_assert_int_eq(count_substr(&r, "(native)"), 3);
  /* the forward: 4 channels x 63 positions x 27 (c, r, s) per image;
   * dWt: 4 x 27 x 63 (h, w) per image, accumulated over n, the gathered
   * input laid out (c, r, s) x (h, w) so that its rows are long; dI: 3 x 63
   * x 9 (r, s) per image and output channel, accumulated over k */
  ck_assert_int_eq(count_prefix(&r, "sgemm NN 4x63x27 batch 2"), 1);
  ck_assert_int_eq(count_prefix(&r, "sgemm NT 4x27x63 batch 2"), 1);
  ck_assert_int_eq(count_prefix(&r, "sgemm NN 3x63x9 batch 8"), 1);
  const char *wt[1] = {"Wt"};
  check_graph(grad(g, 1, wt, ctx), &r);
  ck_assert_int_eq(count_substr(&r, "gather 1 stmt"), 2);
  nf_ir_ctx_free(ctx);

  /* a MobileNet block: depthwise 3x3 and pointwise 1x1 with gradients */
  ctx = nf_ir_ctx_new();
  nf_arg_shape mb[3] = {SH(2, 3, 9, 7), SH(3, 1, 3, 3), SH(4, 3, 1, 1)};
  g = inst("../examples/workloads.nf", "mobilenet_dws_loss", 3, mb, ctx);
  const char *ww[3] = {"Wdw", "Wpw", "X"};
  check_graph(grad(g, 3, ww, ctx), &r);
  /* depthwise forward and its two gradients gathered (batches of small
   * products), the pointwise 1x1 conv and its gradients plain */
  ck_assert_int_eq(count_substr(&r, "gather 1 stmt"), 3);
  ck_assert_int_eq(count_substr(&r, "(native)"), 3);
  ck_assert_int_eq(r.n_gemm, 6);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* An i64 gather in the epilogue: right when the indices are, and the
 * interpreter's bounds error (with its message) when they are not. */
START_TEST(gemm_epilogue_error) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape sh[3] = {SH(13, 7), SH(7, 9), SH(5)};
  nf_graph *g = inst(NULL, "mm_gather", 3, sh, ctx);
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_partition_graph(g, &p, &err), NF_OK);
  ck_assert_uint_eq(p->n, 1);
  nf_gemm_sub *s = NULL;
  ck_assert_int_eq(nf_gemm_prepare(p->sub[0].g, &s, &err), NF_OK);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(nf_gemm_describe(s),
                   "sgemm NN 13x9x7 batch 1, prologue 0 stmts, epilogue 1 stmt");
  compare(p->sub[0].g, s, 0);
  ck_assert_int_eq(compare(p->sub[0].g, s, 13), NF_EBOUNDS);
  nf_gemm_free(s);
  nf_partition_free(p);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* ---- tier 0 on a GPU: cuDNN's convolutions (nf_conv.h, nf_cudnn.h) ---- */

typedef struct dnn_result {
  int n_conv, kinds[3];
  char desc[MAX_DESC][160];
} dnn_result;

/* A subgraph's tier 0 on a GPU: a convolution on cuDNN or a product on
 * cuBLAS, each with its epilogue on the host. */
typedef struct dev_sub {
  nf_conv_sub *cs;
  nf_cudnn *dnn;
  nf_gemm_sub *gs;
  nf_cublas *blas;
  nf_gemm_desc desc;
} dev_sub;

static const char *dev_describe(const dev_sub *x) {
  return x->cs ? nf_conv_sub_describe(x->cs) : nf_gemm_describe(x->gs);
}

/* Runs x as a GPU session does: operands uploaded, the library on device
 * buffers, the result downloaded for the epilogue on the host; the
 * outputs (NaN before) compared with the interpreter's. */
static void dev_compare(nf_cuda_rt *rt, const nf_graph *sub, dev_sub *x) {
  uint32_t ni = sub->n_inputs, no = sub->n_outputs, nb = ni + no;
  nf_array *in = calloc(ni + 1, sizeof *in), *want = calloc(no + 1, sizeof *want);
  void **host = calloc(nb + 1, sizeof *host);
  uint64_t *dev = calloc(nb + 1, sizeof *dev);
  nf_buf err = NF_BUF_INIT;
  for (uint32_t k = 0; k < nb; k++) {
    const nf_tensor *t = &sub->tensors[k < ni ? sub->inputs[k] : sub->outputs[k - ni]];
    size_t bytes = (size_t)nf_tensor_numel(t) * nf_dtype_size((nf_dtype)t->dtype);
    if (k < ni) {
      ck_assert_int_eq(nf_array_alloc(&in[k], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
      fill(&in[k], 0);
      host[k] = in[k].data;
    } else {
      host[k] = malloc(bytes ? bytes : 1);
      memset(host[k], 0xff, bytes);
    }
    ck_assert_int_eq(nf_cuda_rt_alloc(rt, bytes ? bytes : 1, &dev[k], &err), NF_OK);
    ck_assert_int_eq(nf_cuda_rt_upload(rt, dev[k], host[k], bytes, &err), NF_OK);
  }
  /* the library's result: an output's buffers or the caller's */
  int rbuf;
  size_t rb;
  if (x->cs) {
    nf_conv_kind kind = nf_conv_sub_desc(x->cs)->kind;
    rbuf = nf_conv_sub_buffer(x->cs, kind == NF_CONV_FWD ? 2 : kind == NF_CONV_BWD_DATA ? 0 : 1);
    rb = (size_t)nf_conv_sub_result_bytes(x->cs);
  } else {
    rbuf = x->desc.c < nb ? (int)x->desc.c : -1;
    rb = (size_t)nf_gemm_c_bytes(x->gs);
  }
  uint64_t rdev = 0;
  void *rhost = NULL;
  if (rbuf < 0) {
    ck_assert_int_eq(nf_cuda_rt_alloc(rt, rb, &rdev, &err), NF_OK);
    rhost = malloc(rb);
  } else {
    rdev = dev[rbuf];
    rhost = host[rbuf];
  }
  int rc;
  if (x->cs) {
    uint64_t role[3];
    for (int r = 0; r < 3; r++) {
      int b = nf_conv_sub_buffer(x->cs, r);
      role[r] = b >= 0 ? dev[b] : rdev;
    }
    rc = nf_cudnn_run(x->dnn, nf_conv_sub_desc(x->cs), role[0], role[1], role[2], &err);
  } else {
    dev[nb] = rdev; /* a local product: the slot after the buffers */
    rc = nf_cublas_run(x->blas, &x->desc, dev, &err);
  }
  ck_assert_msg(rc == NF_OK, "%s: %s", dev_describe(x), nf_buf_str(&err));
  ck_assert_int_eq(nf_cuda_rt_download(rt, rhost, rdev, rb, &err), NF_OK);
  rc = x->cs ? nf_conv_sub_epilogue(x->cs, host, rhost, &err)
             : nf_gemm_epilogue(x->gs, host, rhost, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_msg(nf_interp_run(sub, in, NF_INTERP_F32, want, &err) == NF_OK, "%s",
                nf_buf_str(&err));
  for (uint32_t k = 0; k < no; k++) {
    const float *w = want[k].data, *got = host[ni + k];
    double max_abs = 0, max_diff = 0;
    for (int64_t i = 0; i < want[k].numel; i++) {
      ck_assert_msg(!isnan(got[i]), "%s: output %u [%lld] not written", dev_describe(x), k,
                    (long long)i);
      if (fabs(w[i]) > max_abs) max_abs = fabs(w[i]);
      if (fabs((double)w[i] - got[i]) > max_diff) max_diff = fabs((double)w[i] - got[i]);
    }
    ck_assert_msg(max_diff <= 1e-5 * max_abs, "%s: output %u differs by %g (max %g)",
                  dev_describe(x), k, max_diff, max_abs);
    nf_array_free(&want[k]);
  }
  for (uint32_t k = 0; k < nb; k++) {
    nf_cuda_rt_free(rt, dev[k]);
    if (k < ni) nf_array_free(&in[k]);
    else free(host[k]);
  }
  if (rbuf < 0) {
    nf_cuda_rt_free(rt, rdev);
    free(rhost);
  }
  free(in);
  free(want);
  free(host);
  free(dev);
  nf_buf_free(&err);
}

/* The GPU runtime for a test of a library: the emulated driver, and the
 * emulated library named by $emu_var, set as $lib_env; with
 * NF_TEST_GPU_REAL=1 (deploy/gpu-check.sh, *real set) the machine's
 * driver and the library by its usual names.  NULL (said why) when the
 * emulations are not given. */
static nf_cuda_rt *gpu_open(const char *test, const char *emu_var, const char *lib_env,
                            int *real) {
  *real = getenv("NF_TEST_GPU_REAL") && !strcmp(getenv("NF_TEST_GPU_REAL"), "1");
  const char *drv = *real ? "libcuda.so.1" : getenv("NF_TEST_CUDA_DRIVER");
  const char *lib = getenv(emu_var);
  if (!*real && (!drv || !*drv || !lib || !*lib)) {
    fprintf(stderr, "%s: skipped: NF_TEST_CUDA_DRIVER or %s not set\n", test, emu_var);
    return NULL;
  }
  setenv("NEOFLOW_LIBCUDA", drv, 1);
  if (*real) unsetenv(lib_env);
  else setenv(lib_env, lib, 1);
  nf_buf why = NF_BUF_INIT;
  nf_cuda_rt *rt = NULL;
  ck_assert_msg(nf_cuda_rt_open(0, &rt, &why) == NF_OK, "%s", nf_buf_str(&why));
  nf_buf_free(&why);
  return rt;
}

/* 1 (closing rt) when the library's open (status orc) found no library
 * on a real GPU machine: the test is skipped; else asserts it opened. */
static int lib_missing(const char *test, int real, int orc, nf_buf *why, nf_cuda_rt *rt) {
  if (real && orc == NF_EUNSUPPORTED && strstr(nf_buf_str(why), "cannot load")) {
    fprintf(stderr, "%s: skipped: %s\n", test, nf_buf_str(why));
    nf_cuda_rt_close(rt);
    nf_buf_free(why);
    return 1;
  }
  ck_assert_msg(orc == NF_OK, "%s", nf_buf_str(why));
  return 0;
}

/* Partitions g and runs every convolution subgraph through cuDNN. */
static void dnn_graph(nf_cuda_rt *rt, nf_cudnn *dnn, const nf_graph *g, dnn_result *r) {
  memset(r, 0, sizeof *r);
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_partition_graph(g, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (uint32_t i = 0; i < p->n; i++) {
    nf_conv_sub *cs = NULL;
    ck_assert_msg(nf_conv_prepare(p->sub[i].g, &cs, &err) == NF_OK, "%s", nf_buf_str(&err));
    if (!cs) continue;
    if (r->n_conv < MAX_DESC)
      snprintf(r->desc[r->n_conv], sizeof r->desc[0], "%s", nf_conv_sub_describe(cs));
    r->n_conv++;
    r->kinds[nf_conv_sub_desc(cs)->kind]++;
    dev_sub x = {.cs = cs, .dnn = dnn};
    dev_compare(rt, p->sub[i].g, &x);
    nf_conv_free(cs);
  }
  nf_partition_free(p);
  nf_buf_free(&err);
}

/* The convolutions cuDNN takes, forward and both gradients, with every
 * stride, padding and dilation lib/nn.nf's conv2d allows (the data
 * gradient at a stride over 1 too, where the autodiff reads dO at floor
 * divisions), grouped ones, hand-written forms (factors swapped, the guard on one
 * factor with a comparison that always holds, no padding with a bias and
 * ReLU epilogue), conv2d_relu_loss's training graph (all three, with
 * epilogues), depthwise convolutions (groups = C = K) with their
 * gradients and a MobileNet block's training graph, and what cuDNN does
 * not compute (a cropped output, a guard narrower than the bounds, a
 * scaled product, groups reading the wrong channels): each run with the emulated
 * cuDNN on the emulated driver's buffers and compared with the
 * interpreter. */
START_TEST(gemm_cudnn) {
  int real;
  nf_buf why = NF_BUF_INIT;
  nf_cuda_rt *rt = gpu_open("gemm_cudnn", "NF_TEST_CUDNN", "NEOFLOW_LIBCUDNN", &real);
  if (!rt) return;
  nf_cudnn *dnn = NULL;
  if (lib_missing("gemm_cudnn", real, nf_cudnn_open(rt, &dnn, &why), &why, rt)) return;
  if (!real) ck_assert_str_eq(nf_cudnn_version(dnn), "cuDNN 9.0.0");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  dnn_result r;
  nf_arg_shape cv[2] = {SH(2, 3, 9, 7), SH(4, 3, 3, 3)};
  static const int v[][3] = {{1, 0, 1}, {1, 1, 1}, {2, 1, 1}, {1, 2, 2}, {3, 0, 1}, {2, 2, 2}};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    nf_graph *g = conv_d(v[i][0], v[i][1], v[i][2], 1, cv, ctx);
    dnn_graph(rt, dnn, g, &r);
    ck_assert_msg(r.n_conv == 1 && r.kinds[NF_CONV_FWD] == 1, "stride %d pad %d dilation %d: %d",
                  v[i][0], v[i][1], v[i][2], r.n_conv);
    char want[96];
    snprintf(want, sizeof want, "pad %d,%d stride %d,%d dilation %d,%d", v[i][1], v[i][1],
             v[i][0], v[i][0], v[i][2], v[i][2]);
    ck_assert_msg(strstr(r.desc[0], want), "%s: want %s", r.desc[0], want);
    const char *wrt[2] = {"I", "W"};
    dnn_graph(rt, dnn, grad(g, 2, wrt, ctx), &r);
    ck_assert_msg(r.kinds[NF_CONV_BWD_FILTER] == 1, "stride %d pad %d dilation %d: %d filter "
                  "gradients (%s)", v[i][0], v[i][1], v[i][2], r.kinds[2], r.desc[0]);
    /* at a stride over 1 the autodiff reads dO at floor divisions: the
     * enumerative reading (conv_enum.c) takes it */
    ck_assert_msg(r.kinds[NF_CONV_BWD_DATA] == 1, "stride %d pad %d dilation %d: %d data "
                  "gradients", v[i][0], v[i][1], v[i][2], r.kinds[1]);
  }
  nf_arg_shape sw[2] = {SH(2, 3, 6, 5), SH(4, 3, 3, 3)};
  dnn_graph(rt, dnn, inst(NULL, "cv_swapped", 2, sw, ctx), &r);
  ck_assert_int_eq(r.kinds[NF_CONV_FWD], 1);
  ck_assert_msg(strstr(r.desc[0], "pad 1,1 stride 1,1"), "%s", r.desc[0]);
  nf_arg_shape br[3] = {SH(2, 3, 6, 5), SH(4, 3, 2, 3), SH(4)};
  dnn_graph(rt, dnn, inst(NULL, "cv_bias_relu", 3, br, ctx), &r);
  ck_assert_int_eq(r.kinds[NF_CONV_FWD], 1);
  ck_assert_msg(strstr(r.desc[0], "epilogue 1 stmt"), "%s", r.desc[0]);
  static const char *no[] = {"cv_crop", "cv_narrow", "cv_scaled"};
  for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
    dnn_graph(rt, dnn, inst(NULL, no[i], 2, sw, ctx), &r);
    ck_assert_msg(r.n_conv == 0, "%s matched: %s", no[i], r.desc[0]);
  }
  /* grouped (3 groups of 2 image and 2 output channels), strided and
   * dilated: all three */
  nf_arg_shape gr[2] = {SH(2, 6, 9, 7), SH(6, 2, 3, 3)};
  static const int gv[][3] = {{1, 1, 1}, {2, 1, 1}, {2, 2, 2}};
  for (size_t i = 0; i < sizeof gv / sizeof *gv; i++) {
    nf_graph *g = conv_d(gv[i][0], gv[i][1], gv[i][2], 3, gr, ctx);
    dnn_graph(rt, dnn, g, &r);
    ck_assert_msg(r.n_conv == 1 && strstr(r.desc[0], "groups 3"), "groups: %s", r.desc[0]);
    const char *wrt[2] = {"I", "W"};
    dnn_graph(rt, dnn, grad(g, 2, wrt, ctx), &r);
    ck_assert_msg(r.kinds[NF_CONV_BWD_FILTER] == 1 && r.kinds[NF_CONV_BWD_DATA] == 1,
                  "groups, stride %d: %d filter, %d data gradients", gv[i][0], r.kinds[2],
                  r.kinds[1]);
  }
  /* 6 output channels over 3 groups of 2 image channels, but each output
   * reading the group after its own: not a convolution cuDNN computes */
  dnn_graph(rt, dnn, inst(NULL, "cv_groups_shifted", 2, gr, ctx), &r);
  ck_assert_msg(r.n_conv == 0, "shifted groups matched: %s", r.desc[0]);
  /* depthwise (groups = C = K): forward, filter gradient and, at stride
   * 1, data gradient */
  nf_arg_shape dw[2] = {SH(2, 6, 9, 7), SH(6, 1, 3, 3)};
  static const int w[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 2}, {2, 0, 1}};
  for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
    nf_graph *g = conv_d(w[i][0], w[i][1], w[i][2], 6, dw, ctx);
    dnn_graph(rt, dnn, g, &r);
    ck_assert_msg(r.n_conv == 1 && strstr(r.desc[0], "groups 6"), "depthwise %d %d %d: %s",
                  w[i][0], w[i][1], w[i][2], r.desc[0]);
    const char *wrt[2] = {"I", "W"};
    dnn_graph(rt, dnn, grad(g, 2, wrt, ctx), &r);
    ck_assert_msg(r.kinds[NF_CONV_BWD_FILTER] == 1 && r.kinds[NF_CONV_BWD_DATA] == 1,
                  "depthwise %d %d %d: %d filter, %d data gradients", w[i][0], w[i][1], w[i][2],
                  r.kinds[2], r.kinds[1]);
  }
  /* a MobileNet block: depthwise 3x3 (all three) and pointwise 1x1 (its
   * forward and both gradients too) */
  nf_arg_shape mb[3] = {SH(2, 3, 9, 7), SH(3, 1, 3, 3), SH(4, 3, 1, 1)};
  nf_graph *gm = inst("../examples/workloads.nf", "mobilenet_dws_loss", 3, mb, ctx);
  const char *ww[3] = {"Wdw", "Wpw", "X"};
  dnn_graph(rt, dnn, grad(gm, 3, ww, ctx), &r);
  int n_dw = 0;
  for (int i = 0; i < r.n_conv && i < MAX_DESC; i++) n_dw += strstr(r.desc[i], "groups 3") != NULL;
  ck_assert_msg(n_dw == 3 && r.n_conv == 6, "%d convolutions, %d depthwise", r.n_conv, n_dw);
  /* training: the forward with its ReLU (and the loss's square) as
   * epilogue, dI and dWt from the ReLU's gradient (an input of theirs:
   * the partition cuts it off), each with an epilogue */
  nf_graph *g = inst("../examples/workloads.nf", "conv2d_relu_loss", 2, cv, ctx);
  const char *wi[2] = {"Wt", "I"};
  dnn_graph(rt, dnn, grad(g, 2, wi, ctx), &r);
  ck_assert_msg(r.n_conv == 3 && r.kinds[0] == 1 && r.kinds[1] == 1 && r.kinds[2] == 1,
                "%d convolutions: %s; %s", r.n_conv, r.desc[0], r.desc[1]);
  nf_ir_ctx_free(ctx);
  nf_cudnn_close(dnn);
  nf_cuda_rt_close(rt);
  nf_buf_free(&why);
  unsetenv("NEOFLOW_LIBCUDNN");
  unsetenv("NEOFLOW_LIBCUDA");
}
END_TEST

/* cuBLAS at tier 0 with an epilogue on the host (nf_gemm_device): a
 * linear layer with ReLU (the product a local), the MLP's and
 * matmul_loss's gradient graphs (plain products, products whose result
 * is an output that the epilogue reads too), each on the emulated cuBLAS
 * and compared with the interpreter; a prologue keeps the host. */
START_TEST(gemm_cublas_epilogue) {
  int real;
  nf_buf why = NF_BUF_INIT;
  nf_cuda_rt *rt = gpu_open("gemm_cublas_epilogue", "NF_TEST_CUBLAS", "NEOFLOW_LIBCUBLAS", &real);
  if (!rt) return;
  nf_cublas *blas = NULL;
  if (lib_missing("gemm_cublas_epilogue", real, nf_cublas_open(rt, &blas, &why), &why, rt)) return;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  static const char *src =
      "import nn\n"
      "def lin_relu(X: f32[N, I], W: f32[O, I], b: f32[O]) -> (Y: f32[N, O]) {\n"
      "  Z = linear(X, W, b)\n  Y = relu(Z)\n}\n"
      "def both(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N], D: f32[M, N]) {\n"
      "  C(i, j) +=! A(i, k) * B(k, j)\n  D(i, j) = C(i, j) * C(i, j)\n}\n"
      "def pro(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
      "  E(i, k) = exp(A(i, k))\n  C(i, j) +=! E(i, k) * B(k, j)\n}\n";
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_int_eq(nf_module_set_lib_dir(m, getenv("NEOFLOW_LIB")), NF_OK);
  ck_assert_msg(nf_module_load_source(m, "dev.nf", src, d) == NF_OK, "%s", nf_diag_text(d));
  static const char *defs[] = {"lin_relu", "both", "pro"};
  nf_arg_shape sh[3][3] = {{SH(11, 17), SH(6, 17), SH(6)}, {SH(13, 7), SH(7, 9)},
                           {SH(13, 7), SH(7, 9)}};
  int n_args[3] = {3, 2, 2}, want_epi[3] = {1, 1, -1};
  for (int i = 0; i < 3; i++) {
    nf_graph *g = NULL;
    nf_inst_opts o = {.n_shapes = n_args[i], .shapes = sh[i]};
    ck_assert_msg(nf_module_instantiate(m, defs[i], &o, ctx, &g, d) == NF_OK, "%s",
                  nf_diag_text(d));
    dev_sub x = {.blas = blas};
    ck_assert_int_eq(nf_gemm_prepare(g, &x.gs, &why), NF_OK);
    ck_assert_ptr_nonnull(x.gs);
    int dev = nf_gemm_device(x.gs, &x.desc);
    ck_assert_int_eq(dev, want_epi[i] >= 0);
    if (dev) {
      ck_assert_int_eq(nf_gemm_has_epilogue(x.gs), want_epi[i]);
      ck_assert_int_eq(x.desc.c == g->n_inputs + g->n_outputs, i == 0); /* lin_relu: local */
      dev_compare(rt, g, &x);
    }
    nf_gemm_free(x.gs);
  }
  nf_diag_free(d);
  nf_module_free(m);
  nf_ir_ctx_free(ctx);
  nf_cublas_close(blas);
  nf_cuda_rt_close(rt);
  nf_buf_free(&why);
  unsetenv("NEOFLOW_LIBCUBLAS");
  unsetenv("NEOFLOW_LIBCUDA");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("gemm");
  TCase *tc = tcase_create("gemm");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, gemm_transposes);
  tcase_add_test(tc, gemm_batched);
  tcase_add_test(tc, gemm_vectors);
  tcase_add_test(tc, gemm_parallel);
  tcase_add_test(tc, gemm_prologue_epilogue);
  tcase_add_test(tc, gemm_gradients);
  tcase_add_test(tc, gemm_not_matmul_shaped);
  tcase_add_test(tc, gemm_reductions);
  tcase_add_test(tc, gemm_conv);
  tcase_add_test(tc, gemm_conv_training);
  tcase_add_test(tc, gemm_gather_shared);
  tcase_add_test(tc, gemm_epilogue_error);
  tcase_add_test(tc, gemm_cudnn);
  tcase_add_test(tc, gemm_cublas_epilogue);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  nf_gemm_set_threads(1);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  nf_pool_free(g_pool);
  return failed ? 1 : 0;
}
