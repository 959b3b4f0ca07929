/* test_compiled.c - schedules end to end: nf_lower + the LLVM backend +
 * the loader, against the reference interpreter.
 *
 * Every def of lib/nn.nf (the cases of nf_test_cases.h: odd shapes,
 * conv2d with stride, dilation and groups), the larger cases where the
 * default schedule tiles and fuses, and every workload of
 * examples/workloads.nf (small shapes, all statements in one program) are
 * compiled with the default schedule and with NF_COMPILED_ITERS (default
 * 50) seeded random legal schedules (the same seeds test_lower checks
 * with the loop IR's evaluator).  Each kernel runs on a 2-thread pool on
 * the case's random inputs with every output poisoned with NaN first; the
 * f32 results must match the interpreter (f64) to a relative L2 error
 * under 1e-5 per output, with no NaN where the reference has none (an
 * unwritten element shows), and integer outputs exactly.
 *
 * The gradient graph of every workload (the training step's backward,
 * every float input, forward outputs kept) is compiled with the default
 * schedule and NF_COMPILED_GRAD_ITERS (default 10) random schedules.
 *
 * The default's product tile (products): every form of product it takes,
 * at 16 and 8 accumulator registers and with its cache budgets cut so
 * that small products get blocked reductions.
 *
 * Library ops compile at the tier-1 level (opt_level 2); the workloads'
 * large programs at opt_level 1 to keep the suite's time reasonable (the
 * lowering and IR generation under test are the same at every level). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_codegen.h"
#include "nf_runtime.h"
#include "nf_lower.h"
#include "nf_test_inst.h"

static nf_module *g_nn, *g_wl;
static nf_pool *g_pool;

static int iters(void) {
  const char *e = getenv("NF_COMPILED_ITERS");
  return e ? atoi(e) : 50;
}

static int grad_iters(void) {
  const char *e = getenv("NF_COMPILED_GRAD_ITERS");
  return e ? atoi(e) : 10;
}

static void setup(void) {
  g_pool = nf_pool_new(2);
  ck_assert_ptr_nonnull(g_pool);
}

static void teardown(void) {
  nf_pool_free(g_pool);
  g_pool = NULL;
  nf_module_free(g_nn);
  nf_module_free(g_wl);
  g_nn = g_wl = NULL;
}

/* Compiles I's graph with s (NULL: default) and compares; 0 when fine,
 * else a message in msg. */
static int run_compiled(inst *I, const nf_schedule *s, int opt_level, char *msg, size_t n_msg) {
  nf_ir_ctx *pctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  nf_blob so = NF_BLOB_INIT;
  nf_kernel *k = NULL;
  nf_array got[MAX_OUT];
  void *bufs[MAX_IN + MAX_OUT];
  int bad = 0, n_out = I->n_out;
  memset(got, 0, sizeof got);
  nf_cpu_target tgt = {NULL, NULL, NULL, opt_level};
  int rc = nf_lower(I->g, s, pctx, &p, &err);
  if (rc != NF_OK) {
    snprintf(msg, n_msg, "lower: %s: %s", nf_status_name(rc), nf_buf_str(&err));
    bad = 1;
  }
  if (!bad && (rc = nf_cpu_compile(p, &tgt, &so, NULL, &err)) != NF_OK) {
    snprintf(msg, n_msg, "compile: %s: %s", nf_status_name(rc), nf_buf_str(&err));
    bad = 1;
  }
  if (!bad && (rc = nf_kernel_load(so.data, so.len, &k, &err)) != NF_OK) {
    snprintf(msg, n_msg, "load: %s: %s", nf_status_name(rc), nf_buf_str(&err));
    bad = 1;
  }
  for (int j = 0; !bad && j < n_out; j++) {
    const nf_tensor *t = &I->g->tensors[I->g->outputs[j]];
    ck_assert_int_eq(nf_array_alloc(&got[j], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
    if (t->dtype == NF_F32)
      for (int64_t i = 0; i < got[j].numel; i++) ((float *)got[j].data)[i] = NAN;
    else if (t->dtype == NF_F64)
      for (int64_t i = 0; i < got[j].numel; i++) ((double *)got[j].data)[i] = NAN;
    else
      memset(got[j].data, 0x5a, (size_t)got[j].numel * nf_dtype_size((nf_dtype)t->dtype));
  }
  for (int j = 0; j < I->n_in; j++) bufs[j] = I->in[j].data;
  for (int j = 0; j < n_out; j++) bufs[I->n_in + j] = got[j].data;
  if (!bad && (rc = nf_kernel_run(k, bufs, (uint32_t)(I->n_in + n_out), g_pool, &err)) != NF_OK) {
    snprintf(msg, n_msg, "run: %s: %s", nf_status_name(rc), nf_buf_str(&err));
    bad = 1;
  }
  for (int j = 0; !bad && j < n_out; j++) {
    const nf_array *w = &I->want[j];
    int fl = nf_dtype_is_float((nf_dtype)got[j].dtype);
    double num = 0, den = 0;
    for (int64_t i = 0; i < w->numel && !bad; i++) {
      double want = aget(w, i), have = aget(&got[j], i);
      if (!fl && have != want) {
        snprintf(msg, n_msg, "output %d element %lld: got %.17g, want %.17g", j, (long long)i,
                 have, want);
        bad = 1;
      }
      if (isnan(have) && !isnan(want)) {
        snprintf(msg, n_msg, "output %d element %lld: NaN (unwritten?), want %.9g", j,
                 (long long)i, want);
        bad = 1;
      }
      if (fl && !isnan(want) && isfinite(want)) {
        num += (have - want) * (have - want);
        den += want * want;
      }
    }
    if (!bad && fl && sqrt(num) > 1e-5 * sqrt(den) + 1e-30) {
      snprintf(msg, n_msg, "output %d: relative L2 error %.3g (over 1e-5)", j,
               sqrt(num) / (sqrt(den) > 0 ? sqrt(den) : 1));
      bad = 1;
    }
  }
  if (bad && p) {
    size_t l = strlen(msg);
    nf_buf lst = NF_BUF_INIT;
    nf__loop_print(p, &lst);
    snprintf(msg + l, n_msg - l, "\n%.1500s", nf_buf_str(&lst));
    nf_buf_free(&lst);
  }
  for (int j = 0; j < n_out; j++) nf_array_free(&got[j]);
  if (k) nf_kernel_free_unload(k);
  nf_blob_free(&so);
  nf_buf_free(&err);
  nf_ir_ctx_free(pctx);
  return bad;
}

static void check_case(nf_module *m, const libcase *c, int n_random, int opt_level) {
  inst I;
  char msg[3000] = "";
  inst_make(&I, m, c, 0x1234 + (uint64_t)strlen(c->label));
  ck_assert_msg(!run_compiled(&I, NULL, opt_level, msg, sizeof msg), "%s default: %s", c->label,
                msg);
  for (int k = 0; k < n_random; k++) {
    nf_schedule *s = NULL;
    ck_assert_int_eq(nf_schedule_random(I.g, 1000 + (uint64_t)k, &s), NF_OK);
    if (run_compiled(&I, s, opt_level, msg, sizeof msg)) {
      nf_buf t = NF_BUF_INIT;
      nf_schedule_print(s, &t);
      ck_abort_msg("%s random %d:\n%s%s", c->label, k, nf_buf_str(&t), msg);
    }
    nf_schedule_free(s);
  }
  inst_free(&I);
}

#define N_LIB ((int)(sizeof lib_cases / sizeof lib_cases[0]))
#define N_WL ((int)(sizeof workload_cases / sizeof workload_cases[0]))
#define N_BIG ((int)(sizeof big_cases / sizeof big_cases[0]))

START_TEST(compiled_library) {
  g_nn = load("nn.nf");
  check_case(g_nn, &lib_cases[_i], iters(), 2);
}
END_TEST

START_TEST(compiled_big) {
  g_nn = load("nn.nf");
  check_case(g_nn, &big_cases[_i], iters(), 2);
}
END_TEST

/* NF_COMPILED_GRAD_SHARD=K/N: only the workload gradients' random
 * schedules whose number is K modulo N, and the default schedules in
 * shard 0 (tests/meson.build runs the gradients, the longest part of the
 * suite and mostly MI-LSTM's, as two shards in parallel). */
static void grad_shard(int *k, int *n) {
  const char *e = getenv("NF_COMPILED_GRAD_SHARD");
  *k = 0;
  *n = 1;
  if (e && (sscanf(e, "%d/%d", k, n) != 2 || *n < 1 || *k < 0 || *k >= *n)) {
    *k = 0;
    *n = 1;
  }
}

START_TEST(compiled_workload_grads) {
  g_wl = load("../examples/workloads.nf");
  const libcase *c = &workload_cases[_i];
  inst I;
  char msg[3000] = "";
  int sk, sn;
  grad_shard(&sk, &sn);
  grad_inst(&I, g_wl, c, 0x77 + (uint64_t)_i);
  if (sk == 0)
    ck_assert_msg(!run_compiled(&I, NULL, 1, msg, sizeof msg), "%s gradient default: %s",
                  c->label, msg);
  int n = grad_iters();
  for (int k = 0; k < n; k++) {
    if (k % sn != sk) continue;
    nf_schedule *s = NULL;
    ck_assert_int_eq(nf_schedule_random(I.g, 5000 + (uint64_t)k, &s), NF_OK);
    if (run_compiled(&I, s, 1, msg, sizeof msg)) {
      nf_buf t = NF_BUF_INIT;
      nf_schedule_print(s, &t);
      ck_abort_msg("%s gradient random %d:\n%s%s", c->label, k, nf_buf_str(&t), msg);
    }
    nf_schedule_free(s);
  }
  inst_free(&I);
}
END_TEST

/* Every library def's gradient graph, default schedule (the floor
 * divisions of a strided convolution's data gradient must be proven in
 * bounds). */
START_TEST(compiled_library_grads) {
  inst I;
  char msg[3000] = "";
  g_nn = load("nn.nf");
  grad_inst(&I, g_nn, &lib_cases[_i], 0x55 + (uint64_t)_i);
  ck_assert_msg(!run_compiled(&I, NULL, 1, msg, sizeof msg), "%s gradient: %s",
                lib_cases[_i].label, msg);
  inst_free(&I);
}
END_TEST

START_TEST(compiled_workloads) {
  g_wl = load("../examples/workloads.nf");
  check_case(g_wl, &workload_cases[_i], iters(), 1);
}
END_TEST

/* The layouts of the channel defaults (forced with 16 accumulator
 * registers, whatever this machine has: the forward's tile and weight copy
 * and the weight gradient's tile and gradient copy with the output channel
 * last) and vector loops whose extent is not a power of two (emitted as
 * power-of-two pieces: 56 = 32 + 16 + 8, 7 = 4 + 2 + a scalar lane),
 * compiled and run against the interpreter. */
static const char layout_src[] =
    "import nn\n"
    "def cv(I: f32[N, C, H, Wd], W: f32[K, C, 3, 3]) -> (O: f32[N, K, H, Wd]) {\n"
    "  O = conv2d<pad = 1>(I, W)\n"
    "}\n"
    "def cdw(I: f32[N, C, H, Wd], dO: f32[N, K, H, Wd]) -> (dW: f32[K, C, 3, 3]) {\n"
    "  dW(k, c, r, s) +=! (h + r - 1 >= 0 && h + r - 1 < H && w + s - 1 >= 0 && w + s - 1 < Wd) ?\n"
    "    dO(n, k, h, w) * I(n, c, h + r - 1, w + s - 1) : 0.0\n"
    "}\n";

static const tcase layout_cases[] = {
    {"cv 32ch", "cv", P0, 2, {NZ(1, 4, 1, 3, 6, 12), NZ(1, 4, 32, 3, 3, 3)}, NULL, 0, 0},
    {"cv 48ch", "cv", P0, 2, {NZ(1, 4, 2, 5, 5, 14), NZ(1, 4, 48, 5, 3, 3)}, NULL, 0, 0},
    {"cdw 32ch", "cdw", P0, 2, {NZ(1, 4, 2, 4, 8, 16), NZ(1, 4, 2, 32, 8, 16)}, NULL, 0, 0},
    {"cv 56 wide", "cv", P0, 2, {NZ(1, 4, 1, 2, 3, 56), NZ(1, 4, 3, 2, 3, 3)}, NULL, 0, 0},
    {"cv 7 wide", "cv", P0, 2, {NZ(1, 4, 1, 2, 3, 7), NZ(1, 4, 3, 2, 3, 3)}, NULL, 0, 0},
};

START_TEST(compiled_layouts) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(m, "layouts.nf", layout_src, d) == NF_OK, "%s",
                nf_diag_text(d));
  nf_diag_free(d);
  const tcase *c = &layout_cases[_i];
  inst I;
  char msg[3000] = "";
  inst_make(&I, m, c, 0x99 + (uint64_t)_i);
  nf_schedule *s = NULL;
  nf_buf err = NF_BUF_INIT, txt = NF_BUF_INIT;
  if (_i < 3) { /* the channel defaults */
    ck_assert_int_eq(nf_schedule_default_for(I.g, &(nf_sched_target){32}, &s), NF_OK);
    nf_schedule_print(s, &txt);
    ck_assert_msg(strstr(nf_buf_str(&txt), "vectorize k.i"), "%s: %s", c->label,
                  nf_buf_str(&txt));
  } else { /* the row in the lanes, accumulated in the output */
    ck_assert_int_eq(nf_schedule_parse("neoflow-schedule 1\nstmt 0 reorder n k h c r s w\n"
                                       "stmt 0 vectorize w\n",
                                       "layouts", &s, &err),
                     NF_OK);
  }
  ck_assert_msg(!run_compiled(&I, s, 2, msg, sizeof msg), "%s: %s", c->label, msg);
  nf_schedule_free(s);
  nf_buf_free(&txt);
  nf_buf_free(&err);
  inst_free(&I);
  nf_module_free(m);
}
END_TEST

/* The default's product tile (sched_gemm.c) on every form it takes: the
 * four transposes, batched, a pointwise convolution's data and weight
 * gradients, a weight gradient summed over steps, fused epilogues (a
 * bias, linear + ReLU); rows that the tile does not divide (guarded),
 * with 16 and 8 accumulator registers (lanes of 16 and 8), and with the
 * cache budgets cut so that these small products get their reductions
 * blocked (several variables out, one split, a long one cut). */
static const char product_src[] =
    "import nn\n"
    "def mm_nn(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n}\n"
    "def mm_tn(A: f32[K, M], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(k, i) * B(k, j)\n}\n"
    "def mm_nt(A: f32[M, K], B: f32[N, K]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(j, k)\n}\n"
    "def mm_tt(A: f32[K, M], B: f32[N, K]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(k, i) * B(j, k)\n}\n"
    "def bmm_nt(A: f32[Bt, M, K], B: f32[Bt, N, K]) -> (C: f32[Bt, M, N]) {\n"
    "  C(b, i, j) +=! A(b, i, k) * B(b, j, k)\n}\n"
    "def pw_dx(dP: f32[N, K, H, W], Wt: f32[K, C, 1, 1]) -> (dR: f32[N, C, H, W]) {\n"
    "  dR(n, c, h, w) +=! dP(n, k, h, w) * Wt(k, c, 0, 0)\n}\n"
    "def pw_dw(dP: f32[N, K, H, W], R: f32[N, C, H, W]) -> (dW: f32[K, C, 1, 1]) {\n"
    "  dW(k, c, y, x) +=! dP(n, k, h, w) * R(n, c, h, w)\n}\n"
    "def wgrad_steps(G: f32[T, B, M], X: f32[T, B, N]) -> (dW: f32[M, N]) {\n"
    "  dW(i, j) +=! G(t, n, i) * X(t, n, j)\n}\n"
    "def mm_bias(A: f32[M, K], B: f32[K, N], b: f32[N]) -> (C: f32[M, N]) {\n"
    "  P(i, j) +=! A(i, k) * B(k, j)\n"
    "  C(i, j) = P(i, j) + b(j)\n}\n"
    "def lin_relu(X: f32[B, I], W: f32[O, I], b: f32[O]) -> (Y: f32[B, O]) {\n"
    "  Z = linear(X, W, b)\n"
    "  Y = relu(Z)\n}\n";

static const tcase product_cases[] = {
    {"mm_nn 13x37x48", "mm_nn", P0, 2, {NZ(1, 2, 13, 37), NZ(1, 2, 37, 48)}, NULL, 0, 0},
    {"mm_tn 13x128x32", "mm_tn", P0, 2, {NZ(1, 2, 128, 13), NZ(1, 2, 128, 32)}, NULL, 0, 0},
    {"mm_nt 13x40x32", "mm_nt", P0, 2, {NZ(1, 2, 13, 40), NZ(1, 2, 32, 40)}, NULL, 0, 0},
    {"mm_tt 13x40x32", "mm_tt", P0, 2, {NZ(1, 2, 40, 13), NZ(1, 2, 32, 40)}, NULL, 0, 0},
    {"bmm_nt 3x7x20x32", "bmm_nt", P0, 2, {NZ(1, 3, 3, 7, 20), NZ(1, 3, 3, 32, 20)}, NULL, 0, 0},
    {"pw_dx 2x32x3x5 -> 48", "pw_dx", P0, 2, {NZ(1, 4, 2, 32, 3, 5), NZ(1, 4, 32, 48, 1, 1)},
     NULL, 0, 0},
    {"pw_dw 2x13x32x8 by 32", "pw_dw", P0, 2, {NZ(1, 4, 2, 13, 32, 8), NZ(1, 4, 2, 32, 32, 8)},
     NULL, 0, 0},
    {"wgrad_steps 3x8 13x32", "wgrad_steps", P0, 2, {NZ(1, 3, 3, 8, 13), NZ(1, 3, 3, 8, 32)},
     NULL, 0, 0},
    {"mm_bias 13x37x48", "mm_bias", P0, 3, {NZ(1, 2, 13, 37), NZ(1, 2, 37, 48), NZ(1, 1, 48)},
     NULL, 0, 0},
    {"lin_relu 13x40 -> 32", "lin_relu", P0, 3, {NZ(1, 2, 13, 40), NZ(1, 2, 32, 40), NZ(1, 1, 32)},
     NULL, 0, 0},
};

START_TEST(compiled_products) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(m, "products.nf", product_src, d) == NF_OK, "%s",
                nf_diag_text(d));
  nf_diag_free(d);
  const tcase *c = &product_cases[_i];
  inst I;
  char msg[3000] = "";
  inst_make(&I, m, c, 0x5151 + (uint64_t)_i);
  static const int conf[][2] = {{16, 1}, {16, 16}, {8, 1}, {8, 16}}; /* registers, budget / */
  for (int k = 0; k < 4; k++) {
    nf_schedule *s = NULL;
    nf_buf txt = NF_BUF_INIT;
    nf__sched_gemm_set_budget_div(conf[k][1]);
    int rc = nf_schedule_default_for(I.g, &(nf_sched_target){conf[k][0] >= 16 ? 32 : 16}, &s);
    nf__sched_gemm_set_budget_div(0);
    ck_assert_int_eq(rc, NF_OK);
    nf_schedule_print(s, &txt);
    /* the product tile was taken: its panel copy */
    ck_assert_msg(strstr(nf_buf_str(&txt), "cache_read"), "%s (%d registers): no product tile:\n%s",
                  c->label, conf[k][0], nf_buf_str(&txt));
    ck_assert_msg(!run_compiled(&I, s, 2, msg, sizeof msg), "%s (%d registers, budget / %d):\n%s%s",
                  c->label, conf[k][0], conf[k][1], nf_buf_str(&txt), msg);
    nf_buf_free(&txt);
    nf_schedule_free(s);
  }
  inst_free(&I);
  nf_module_free(m);
}
END_TEST

static void add_loop(Suite *su, const char *name, const TTest *t, int n) {
  const char *parts = getenv("NF_COMPILED_PARTS");
  if (parts) { /* a comma-separated list of the parts to run */
    size_t l = strlen(name);
    const char *q = parts;
    int found = 0;
    while ((q = strstr(q, name)) != NULL) {
      if ((q == parts || q[-1] == ',') && (q[l] == 0 || q[l] == ',')) found = 1;
      q += l;
    }
    if (!found) return;
  }
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 900);
  tcase_add_loop_test(tc, t, 0, n);
  suite_add_tcase(su, tc);
}

/* NF_COMPILED_PARTS=library,big,workloads,workload_grads,library_grads,products,layouts (any
 * subset)
 * selects the parts; tests/meson.build runs the library in one test and
 * the rest in another, so that they run in parallel. */
int main(void) {
  Suite *su = suite_create("compiled");
  add_loop(su, "library", compiled_library, N_LIB);
  add_loop(su, "big", compiled_big, N_BIG);
  add_loop(su, "workloads", compiled_workloads, N_WL);
  add_loop(su, "workload_grads", compiled_workload_grads, N_WL);
  add_loop(su, "library_grads", compiled_library_grads, N_LIB);
  add_loop(su, "products", compiled_products,
           (int)(sizeof product_cases / sizeof product_cases[0]));
  add_loop(su, "layouts", compiled_layouts,
           (int)(sizeof layout_cases / sizeof layout_cases[0]));
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
