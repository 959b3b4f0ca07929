/* test_stack.c - the client's graph rewrites before partitioning:
 * nf_stack_sums (per-step products summed become one product over the
 * steps, nf_stack.h) and nf_narrow_reads (intermediates computed only
 * where read, nf_narrow.h).  Each rewritten graph is run by the
 * interpreter against the original on random inputs; the forms a pass
 * must leave alone are left alone; the LLTM workload's gradient graph is
 * rewritten by both and its gradients are unchanged. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_narrow.h"
#include "nf_npy.h"
#include "nf_stack.h"

static const char *const kSrc =
    /* three steps' products of one form, summed: rewritten (A and B
     * stacked, W shared in `shared`) */
    "def steps(A0: f32[2, 5], A1: f32[2, 5], A2: f32[2, 5], B0: f32[2, 6], B1: f32[2, 6],\n"
    "          B2: f32[2, 6]) -> (G: f32[5, 6]) {\n"
    "  D0(i, j) +=! A0(n, i) * B0(n, j)\n"
    "  D1(i, j) +=! A1(n, i) * B1(n, j)\n"
    "  D2(i, j) +=! A2(n, i) * B2(n, j)\n"
    "  G(i, j) = D0(i, j) + D1(i, j) + D2(i, j)\n}\n"
    "def shared(A0: f32[2, 5], A1: f32[2, 5], W: f32[2, 6]) -> (G: f32[5, 6]) {\n"
    "  D0(i, j) +=! A0(n, i) * W(n, j) * 2.0\n"
    "  D1(i, j) +=! A1(n, i) * W(n, j) * 2.0\n"
    "  G(i, j) = D0(i, j) + D1(i, j)\n}\n"
    /* left alone: a term read elsewhere; terms of two forms; a small
     * result of large operands (the copies would outweigh it) */
    "def read_twice(A0: f32[2, 5], A1: f32[2, 5], B0: f32[2, 6], B1: f32[2, 6])\n"
    "    -> (G: f32[5, 6], H: f32[5, 6]) {\n"
    "  D0(i, j) +=! A0(n, i) * B0(n, j)\n"
    "  D1(i, j) +=! A1(n, i) * B1(n, j)\n"
    "  G(i, j) = D0(i, j) + D1(i, j)\n"
    "  H(i, j) = D1(i, j) * 2.0\n}\n"
    "def two_forms(A0: f32[2, 5], A1: f32[2, 5], B0: f32[2, 6], B1: f32[2, 6])\n"
    "    -> (G: f32[5, 6]) {\n"
    "  D0(i, j) +=! A0(n, i) * B0(n, j)\n"
    "  D1(i, j) +=! A1(n, i) * B1(n, j) * 3.0\n"
    "  G(i, j) = D0(i, j) + D1(i, j)\n}\n"
    /* nf_narrow_reads: columns 2.. of P read, rows 1..2 of Q */
    "def sliced(A: f32[4, 6], B: f32[6, 8]) -> (S: f32[4, 6], R: f32[2, 8]) {\n"
    "  P(i, j) +=! A(i, k) * B(k, j)\n"
    "  S(i, j) = P(i, j + 2) * 2.0\n"
    "  Q(i, j) = exp(B(i, j))\n"
    "  R(i, j) = Q(i + 1, j) + Q(i + 2, j)\n}\n"
    /* read whole (by two readers together), or outside its bounds */
    "def whole(A: f32[4, 6], B: f32[6, 8]) -> (S: f32[4, 4], T: f32[4, 4]) {\n"
    "  P(i, j) +=! A(i, k) * B(k, j)\n"
    "  S(i, j) = P(i, j)\n"
    "  T(i, j) = P(i, j + 4)\n}\n"
    "def small(A0: f32[64, 2], A1: f32[64, 2], B0: f32[64, 2], B1: f32[64, 2]) -> (G: f32[2]) {\n"
    "  D0(i) +=! A0(n, i) * B0(n, i)\n"
    "  D1(i) +=! A1(n, i) * B1(n, i)\n"
    "  G(i) = D0(i) + D1(i)\n}\n";

static nf_graph *inst(const char *file, const char *def, nf_ir_ctx *ctx, int n,
                      const nf_arg_shape *sh) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc;
  if (file) {
    const char *lib = getenv("NEOFLOW_LIB");
    ck_assert_ptr_nonnull(lib);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", lib, file);
    rc = nf_module_load_file(m, path, d);
  } else {
    rc = nf_module_load_source(m, "stack_cases.nf", kSrc, d);
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

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 - 0.5);
}

/* Runs a and b (same inputs and outputs) on the same random inputs and
 * checks every output agrees to f32 rounding. */
static void same_results(const nf_graph *a, const nf_graph *b) {
  ck_assert_uint_eq(a->n_inputs, b->n_inputs);
  ck_assert_uint_eq(a->n_outputs, b->n_outputs);
  nf_array in[16], oa[8], ob[8];
  ck_assert(a->n_inputs <= 16 && a->n_outputs <= 8);
  for (uint32_t k = 0; k < a->n_inputs; k++) {
    const nf_tensor *t = &a->tensors[a->inputs[k]];
    ck_assert_str_eq(t->name, b->tensors[b->inputs[k]].name);
    ck_assert(nf_array_alloc(&in[k], (nf_dtype)t->dtype, t->rank, t->shape) == NF_OK);
    for (int64_t i = 0; i < in[k].numel; i++) ((float *)in[k].data)[i] = rnd();
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_interp_run(a, in, NF_INTERP_F32, oa, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_msg(nf_interp_run(b, in, NF_INTERP_F32, ob, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (uint32_t k = 0; k < a->n_outputs; k++) {
    ck_assert_int_eq(oa[k].numel, ob[k].numel);
    const float *x = oa[k].data, *y = ob[k].data;
    double num = 0, den = 0;
    for (int64_t i = 0; i < oa[k].numel; i++) {
      num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
      den += (double)x[i] * x[i];
    }
    ck_assert_msg(num <= 1e-12 * (den > 0 ? den : 1), "output %u: relative L2 %g", k,
                  sqrt(num / (den > 0 ? den : 1)));
    nf_array_free(&oa[k]);
    nf_array_free(&ob[k]);
  }
  for (uint32_t k = 0; k < a->n_inputs; k++) nf_array_free(&in[k]);
  nf_buf_free(&err);
}

/* The rewrite of def (kSrc): n_done sums, the statement count after. */
static nf_graph *rewrite(const nf_graph *g, int want_done, int want_stmts) {
  nf_graph *out = NULL;
  int n = -1;
  ck_assert(nf_stack_sums(g, &out, &n) == NF_OK);
  ck_assert_int_eq(n, want_done);
  if (!want_done) {
    ck_assert_ptr_null(out);
    return NULL;
  }
  ck_assert_ptr_nonnull(out);
  ck_assert(nf_graph_validate(out, NULL) == NF_OK);
  ck_assert_uint_eq(out->n_stmts, (uint32_t)want_stmts);
  same_results(g, out);
  return out;
}

START_TEST(stack_rewritten) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst(NULL, "steps", ctx, 0, NULL);
  /* A_stk, B_stk, one product over (step, n) */
  nf_graph *r = rewrite(g, 1, 3);
  const nf_stmt *p = &r->stmts[2];
  ck_assert_int_eq(p->red, NF_RED_SUM);
  ck_assert_int_eq(p->n_red, 2);
  ck_assert_int_eq(p->red_ext[0], 3);
  ck_assert_str_eq(r->tensors[p->out].name, "G");
  ck_assert_int_eq(r->tensors[r->stmts[0].out].rank, 3);
  /* W is read as it is: one stack */
  g = inst(NULL, "shared", ctx, 0, NULL);
  r = rewrite(g, 1, 2);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(stack_left_alone) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  const char *defs[3] = {"read_twice", "two_forms", "small"};
  for (int i = 0; i < 3; i++) rewrite(inst(NULL, defs[i], ctx, 0, NULL), 0, 0);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(narrow_rewritten) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst(NULL, "sliced", ctx, 0, NULL), *out = NULL;
  int n = 0;
  ck_assert(nf_narrow_reads(g, &out, &n) == NF_OK);
  ck_assert_int_eq(n, 2);
  ck_assert_ptr_nonnull(out);
  ck_assert(nf_graph_validate(out, NULL) == NF_OK);
  for (uint32_t t = 0; t < out->n_tensors; t++) {
    const nf_tensor *x = &out->tensors[t];
    if (!strcmp(x->name, "P")) ck_assert(x->shape[0] == 4 && x->shape[1] == 6);
    if (!strcmp(x->name, "Q")) ck_assert(x->shape[0] == 3 && x->shape[1] == 8);
  }
  same_results(g, out);
  g = inst(NULL, "whole", ctx, 0, NULL);
  ck_assert(nf_narrow_reads(g, &out, &n) == NF_OK);
  ck_assert_int_eq(n, 0);
  ck_assert_ptr_null(out);
  nf_ir_ctx_free(ctx);
}
END_TEST

#define SH(nm, ...) {nm, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}}

/* The MI-LSTM workload's gradient: the gradient of each step's read of
 * Wx(t, n, g) is zero but for slice t; nf_narrow_zeros stores that slice
 * only, and the gradients are unchanged. */
START_TEST(narrow_zeros_milstm) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape sh[9] = {SH("X", 8, 3, 4),  SH("H0", 3, 5),    SH("C0", 3, 5),
                        SH("W", 20, 4),    SH("U", 20, 5),    SH("alpha", 20),
                        SH("beta1", 20),   SH("beta2", 20),   SH("b", 20)};
  nf_graph *g = inst("../examples/workloads.nf", "milstm_loss", ctx, 9, sh);
  const char *wrt[6] = {"W", "U", "alpha", "beta1", "beta2", "b"};
  nf_grad_opts go = {.n_wrt = 6, .wrt = wrt, .keep_outputs = 1};
  nf_graph *gg = NULL, *out = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_grad_graph(g, &go, ctx, &gg, NULL, &err) == NF_OK, "%s", nf_buf_str(&err));
  int n = 0;
  ck_assert(nf_narrow_zeros(gg, &out, &n) == NF_OK);
  ck_assert_ptr_nonnull(out);
  ck_assert_int_ge(n, 7);
  int found = 0;
  for (uint32_t t = 0; t < out->n_tensors; t++)
    if (!strcmp(out->tensors[t].name, "dWx_7")) {
      found = 1;
      ck_assert_int_eq(out->tensors[t].shape[0], 1);
      ck_assert_int_eq(out->tensors[t].shape[2], 20);
    }
  ck_assert(found);
  same_results(gg, out);
  /* nothing left to narrow */
  nf_graph *again = NULL;
  ck_assert(nf_narrow_zeros(out, &again, &n) == NF_OK);
  ck_assert_ptr_null(again);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* The LLTM workload's gradient: grad_W, the sum over the 8 steps, becomes
 * one product; the gradients are those of the graph before. */
START_TEST(stack_lltm) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape sh[5] = {SH("X", 8, 3, 4), SH("H0", 3, 5), SH("C0", 3, 5), SH("W", 15, 9),
                        SH("b", 15)};
  nf_graph *g = inst("../examples/workloads.nf", "lltm_loss", ctx, 5, sh);
  const char *wrt[2] = {"W", "b"};
  nf_grad_opts go = {.n_wrt = 2, .wrt = wrt, .keep_outputs = 1};
  nf_graph *gg = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_grad_graph(g, &go, ctx, &gg, NULL, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_graph *out = NULL;
  int n = 0;
  ck_assert(nf_stack_sums(gg, &out, &n) == NF_OK);
  ck_assert_int_ge(n, 1);
  ck_assert_ptr_nonnull(out);
  int found = 0;
  for (uint32_t i = 0; i < out->n_stmts; i++) {
    const nf_stmt *st = &out->stmts[i];
    if (!strcmp(out->tensors[st->out].name, "grad_W")) {
      found = 1;
      ck_assert_int_eq(st->red, NF_RED_SUM);
      ck_assert_int_eq(st->red_ext[0], 8);
    }
  }
  ck_assert(found);
  same_results(gg, out);
  /* X has no gradient: of dXH = d[x, h], only the h columns are read */
  nf_graph *nw = NULL;
  ck_assert(nf_narrow_reads(out, &nw, &n) == NF_OK);
  ck_assert_int_eq(n, 7); /* steps 8..2: h_0 is data */
  ck_assert_ptr_nonnull(nw);
  found = 0;
  for (uint32_t t = 0; t < nw->n_tensors; t++)
    if (!strcmp(nw->tensors[t].name, "dH[8].XH_0")) {
      found = 1;
      ck_assert_int_eq(nw->tensors[t].shape[1], 5);
    }
  ck_assert(found);
  same_results(gg, nw);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("stack");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, stack_rewritten);
  tcase_add_test(tc, stack_left_alone);
  tcase_add_test(tc, stack_lltm);
  tcase_add_test(tc, narrow_rewritten);
  tcase_add_test(tc, narrow_zeros_milstm);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
