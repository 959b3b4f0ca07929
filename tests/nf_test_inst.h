/* nf_test_inst.h - what the lowering (test_lower.c) and compiled-kernel
 * (test_compiled.c) suites share: the workload cases (small shapes), the
 * larger cases where the default schedule tiles, loading a module, and an
 * instantiated case with seeded inputs and the interpreter's f64 outputs.
 * Header-only, for Check test executables (uses ck_assert). */
#ifndef NF_TEST_INST_H
#define NF_TEST_INST_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_test_cases.h"

#define MAX_OUT 16 /* outputs of one case */

typedef libcase tcase;

/* lib_cases: every def of lib/nn.nf (nf_test_cases.h). */


/* workload_cases: the workloads at small shapes (nf_test_cases.h). */

/* Larger shapes where the default schedule tiles, vectorizes and fuses. */
static const tcase big_cases[] = {
    {"matmul 13x19x21", "matmul", P0, 2, {NZ(1, 2, 13, 19), NZ(1, 2, 19, 21)}, NULL, 0, 0},
    {"matmul 8x5x16", "matmul", P0, 2, {NZ(1, 2, 8, 5), NZ(1, 2, 5, 16)}, NULL, 0, 0},
    {"batch_matmul 2x9x3x17", "batch_matmul", P0, 2,
     {NZ(1, 3, 2, 9, 3), NZ(1, 3, 2, 3, 17)}, NULL, 0, 0},
    {"conv2d pad 1 13x11", "conv2d", P1("pad", 1), 2,
     {NZ(1, 4, 1, 3, 13, 11), NZ(1, 4, 9, 3, 3, 3)}, NULL, 0, 0},
    {"relu 3x37", "relu", P0, 1, {NZ(1, 2, 3, 37)}, NULL, 0, 0},
    {"softmax 5x19", "softmax", P0, 1, {NZ(3, 2, 5, 19)}, NULL, 0, 0},
    /* row max and sum in vector lanes (rfactor) by default, no guard */
    {"softmax 3x32", "softmax", P0, 1, {NZ(3, 2, 3, 32)}, NULL, 0, 0},
    /* stencil tiles by default (4 output channels x rows x a row): the
     * padded image copied zero-padded (cache_read), read unguarded */
    {"conv2d pad 1 8ch 6x12", "conv2d", P1("pad", 1), 2,
     {NZ(1, 4, 2, 3, 6, 12), NZ(1, 4, 8, 3, 3, 3)}, NULL, 0, 0},
    {"conv2d stride 2 pad 2 dil 2 8ch", "conv2d", P3("stride", 2, "pad", 2, "dilation", 2), 2,
     {NZ(1, 4, 1, 2, 9, 17), NZ(1, 4, 8, 2, 3, 3)}, NULL, 0, 0},
    /* the product tile (sched_gemm.c): lanes along the output's last
     * variable (a multiple of the vector, two at least), the lane
     * operand's panel copied (transposed for linear's W and the
     * pointwise convolution's weights), guarded rows */
    {"matmul 20x24x48", "matmul", P0, 2, {NZ(1, 2, 20, 24), NZ(1, 2, 24, 48)}, NULL, 0, 0},
    {"linear 13x40 -> 32", "linear", P0, 3, {NZ(1, 2, 13, 40), NZ(1, 2, 32, 40), NZ(1, 1, 32)},
     NULL, 0, 0},
    {"batch_matmul 3x10x20x32", "batch_matmul", P0, 2,
     {NZ(1, 3, 3, 10, 20), NZ(1, 3, 3, 20, 32)}, NULL, 0, 0},
    {"conv2d pointwise 2x16x4x7 -> 32", "conv2d", P0, 2,
     {NZ(1, 4, 2, 16, 4, 7), NZ(1, 4, 32, 16, 1, 1)}, NULL, 0, 0},
    /* depthwise: the plain tile, each channel's plane copied zero-padded */
    {"conv2d depthwise pad 1 8ch 6x12", "conv2d", P2("pad", 1, "groups", 8), 2,
     {NZ(1, 4, 2, 8, 6, 12), NZ(1, 4, 8, 1, 3, 3)}, NULL, 0, 0},
};

/* lib/REL; "nn.nf" stands for tests/data/builtins.nf, which imports it
 * and adds the built-in operators' defs (nf_test_lib_path). */
static nf_module *load(const char *rel) {
  const char *lib = getenv("NEOFLOW_LIB");
  char path[4096];
  nf_diag *d = nf_diag_new();
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  if (!strcmp(rel, "nn.nf"))
    nf_test_lib_path(path, sizeof path);
  else
    snprintf(path, sizeof path, "%s/%s", lib, rel);
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s\n%s", path, nf_status_name(rc), nf_diag_text(d));
  nf_diag_free(d);
  return m;
}

static nf_array make_input(rng *r, const ispec *s) {
  nf_array a;
  int idx = s->kind == IN_IDX;
  ck_assert_int_eq(nf_array_alloc(&a, idx ? NF_I64 : NF_F32, s->rank, s->dims), NF_OK);
  for (int64_t i = 0; i < a.numel; i++) {
    if (idx) {
      ((int64_t *)a.data)[i] = (int64_t)(rng_next(r) % (uint64_t)s->a);
      continue;
    }
    double v;
    if (s->kind == IN_NZ) {
      v = s->a * (0.1 + 0.9 * rng_unit(r));
      if (rng_next(r) & 1) v = -v;
    } else if (s->kind == IN_UNIF) {
      v = s->a + (s->b - s->a) * rng_unit(r);
    } else {
      v = 0;
    }
    ((float *)a.data)[i] = (float)v;
  }
  if (s->kind == IN_ONEHOT) {
    int64_t n = s->dims[s->rank - 1];
    for (int64_t row = 0; row < a.numel / n; row++)
      ((float *)a.data)[row * n + (int64_t)(rng_next(r) % (uint64_t)n)] = 1.0f;
  }
  return a;
}

static double aget(const nf_array *a, int64_t i) {
  switch (a->dtype) {
  case NF_F32: return ((const float *)a->data)[i];
  case NF_F64: return ((const double *)a->data)[i];
  case NF_I64: return (double)((const int64_t *)a->data)[i];
  case NF_I32: return ((const int32_t *)a->data)[i];
  case NF_BOOL: return ((const uint8_t *)a->data)[i];
  default: ck_abort_msg("dtype %d", (int)a->dtype);
  }
  return 0;
}

/* One instantiated case: graph, inputs, interpreter outputs. */
typedef struct inst {
  nf_ir_ctx *ctx;
  nf_graph *g;
  int n_in, n_out;
  nf_array in[MAX_IN], want[MAX_OUT];
  void *bufs[MAX_IN + MAX_OUT];
} inst;

/* Case c's graph, instantiated in ctx (no inputs drawn). */
static nf_graph *inst_graph(nf_module *m, const tcase *c, nf_ir_ctx *ctx) {
  nf_diag *d = nf_diag_new();
  nf_arg_shape shapes[MAX_IN];
  for (int k = 0; k < c->n_in; k++) {
    memset(&shapes[k], 0, sizeof shapes[k]);
    shapes[k].rank = c->in[k].rank;
    for (int a = 0; a < c->in[k].rank; a++) shapes[k].dims[a] = c->in[k].dims[a];
  }
  nf_inst_opts o = {.n_shapes = c->n_in, .shapes = shapes, .n_params = c->n_par,
                    .param_names = c->pn, .param_values = c->pv};
  nf_graph *g = NULL;
  int rc = nf_module_instantiate(m, c->def, &o, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: %s\n%s", c->label, nf_status_name(rc), nf_diag_text(d));
  nf_diag_free(d);
  return g;
}

static void inst_make(inst *I, nf_module *m, const tcase *c, uint64_t seed) {
  rng r = {seed};
  memset(I, 0, sizeof *I);
  I->ctx = nf_ir_ctx_new();
  I->n_in = c->n_in;
  for (int k = 0; k < c->n_in; k++) I->in[k] = make_input(&r, &c->in[k]);
  I->g = inst_graph(m, c, I->ctx);
  I->n_out = (int)I->g->n_outputs;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_interp_run(I->g, I->in, NF_INTERP_F64, I->want, &err);
  ck_assert_msg(rc == NF_OK, "%s: interp: %s", c->label, nf_buf_str(&err));
  nf_buf_free(&err);
  /* eval buffers: doubles for floats, int64 otherwise */
  for (int k = 0; k < I->n_in; k++) {
    const nf_array *a = &I->in[k];
    int fl = nf_dtype_is_float((nf_dtype)I->g->tensors[I->g->inputs[k]].dtype);
    void *b = malloc((size_t)(a->numel ? a->numel : 1) * 8);
    ck_assert_ptr_nonnull(b);
    for (int64_t i = 0; i < a->numel; i++) {
      if (fl)
        ((double *)b)[i] = aget(a, i);
      else
        ((int64_t *)b)[i] = (int64_t)aget(a, i);
    }
    I->bufs[k] = b;
  }
  for (int k = 0; k < I->n_out; k++) {
    int64_t n = nf_tensor_numel(&I->g->tensors[I->g->outputs[k]]);
    I->bufs[I->n_in + k] = malloc((size_t)(n ? n : 1) * 8);
    ck_assert_ptr_nonnull(I->bufs[I->n_in + k]);
  }
}

static void inst_free(inst *I) {
  for (int k = 0; k < I->n_in; k++) nf_array_free(&I->in[k]);
  for (int k = 0; k < I->n_out; k++) nf_array_free(&I->want[k]);
  for (int k = 0; k < I->n_in + I->n_out; k++) free(I->bufs[k]);
  nf_ir_ctx_free(I->ctx);
}

/* The training step's gradient graph of workload case c (every float
 * input, forward outputs kept) as an instance: the forward inputs of the
 * case, random seeds for the output adjoints, the interpreter's f64
 * outputs. */
static inline void grad_inst(inst *I, nf_module *m, const libcase *c, uint64_t seed) {
  inst F;
  inst_make(&F, m, c, seed);
  memset(I, 0, sizeof *I);
  I->ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_grad_opts o = {.n_wrt = 0, .wrt = NULL, .keep_outputs = 1};
  const char *wrt[MAX_IN];
  for (uint32_t k = 0; k < F.g->n_inputs; k++) {
    const nf_tensor *t = &F.g->tensors[F.g->inputs[k]];
    if (nf_dtype_is_float((nf_dtype)t->dtype)) wrt[o.n_wrt++] = t->name;
  }
  o.wrt = wrt;
  int rc = nf_grad_graph(F.g, &o, I->ctx, &I->g, NULL, &err);
  ck_assert_msg(rc == NF_OK, "%s: grad: %s", c->label, nf_buf_str(&err));
  I->n_in = (int)I->g->n_inputs;
  I->n_out = (int)I->g->n_outputs;
  ck_assert_int_le(I->n_in, MAX_IN);
  ck_assert_int_le(I->n_out, MAX_OUT);
  rng r = {seed ^ 0xd5eedull};
  for (int k = 0; k < I->n_in; k++) {
    const nf_tensor *t = &I->g->tensors[I->g->inputs[k]];
    if (k < F.n_in) { /* the forward inputs, copied */
      ck_assert_int_eq(nf_array_alloc(&I->in[k], F.in[k].dtype, t->rank, t->shape), NF_OK);
      memcpy(I->in[k].data, F.in[k].data,
             (size_t)F.in[k].numel * nf_dtype_size((nf_dtype)F.in[k].dtype));
      continue;
    }
    ispec sp = NZ(1, 0, 0);
    sp.rank = t->rank;
    for (int d = 0; d < t->rank; d++) sp.dims[d] = t->shape[d];
    I->in[k] = make_input(&r, &sp);
  }
  rc = nf_interp_run(I->g, I->in, NF_INTERP_F64, I->want, &err);
  ck_assert_msg(rc == NF_OK, "%s: interp of the gradient: %s", c->label, nf_buf_str(&err));
  nf_buf_free(&err);
  inst_free(&F);
}

#endif
