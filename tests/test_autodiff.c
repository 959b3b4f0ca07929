/* test_autodiff.c - nf_grad (expression-level reverse mode) against finite
 * differences.
 *
 * For a def instantiated at small odd shapes, nf_grad builds the gradient
 * graph for the float inputs asked; the reference interpreter evaluates it
 * in f64 with seeded random inputs (never zero; labels and indices random
 * and valid) and a random seed dY per output, and every grad_X is compared
 * with central finite differences of the scalar L = sum_k sum(dY_k * Y_k)
 * evaluated through the forward graph:
 *
 *     fd(e) = (L(x + h e) - L(x - h e)) / 2h,   h = 1e-6 max(1, |x_e|)
 *
 * with ||grad - fd|| / max(||fd||, 1e-6) <= 1e-6 over the elements checked
 * (all of a small tensor, 40 random ones of a larger one), and, to cover
 * every element of a large one, the derivative along two random directions
 * v against grad . v (relative to sum |grad_e v_e|).  Covered: every
 * def of lib/nn.nf (several parameter sets for convolution and pooling),
 * the six workloads of examples/workloads.nf, index forms that broke the
 * original NeoFlow, exact gradients where finite differences are invalid
 * (max pooling with ties, stop_gradient, pure strides), the report (zero
 * gradients with a note, scatter items, FLOP counts) and the errors.
 *
 * The FLOP tests print a table of every gradient statement's cost against
 * its forward statement's to stderr (lines "flops ...": read it from the
 * test log) and assert that each non-scatter item costs at most twice its
 * forward statement: tcase "flops" for matmul and conv2d at strides 1 and
 * 2, "flops_library" for every case of lib_cases; "flops_workloads" only
 * prints the workloads' tables.  Lines "fd ..." give each gradient's error.
 *
 * Each case is its own Check test (loop tests), so one failure does not
 * hide the others; cases known to fail are listed in the table below with
 * `known = 1` and run in the tcase "known_failures". */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_test_cases.h"
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_npy.h"

#define FD_RTOL 1e-6     /* relative L2 error of a gradient against FD */
#define FD_STEP 1e-6     /* relative step (absolute below |x| = 1) */
#define FD_ALL 100       /* tensors up to this size: every element */
#define FD_SAMPLE 40     /* larger ones: this many random elements */
#define FD_FLOOR 1e-6    /* denominator floor for an all-zero gradient */
#define FLOP_RATIO 2.0   /* a gradient statement costs at most this much */

/* ---- random values ---- */


static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* ---- arrays: float inputs are f64, integer inputs i64 ---- */

static nf_array arr_new(nf_dtype t, int rank, const int64_t *shape) {
  nf_array a;
  ck_assert_int_eq(nf_array_alloc(&a, t, rank, shape), NF_OK);
  return a;
}

static double *F(const nf_array *a) {
  ck_assert_int_eq(a->dtype, NF_F64);
  return (double *)a->data;
}

static int64_t *I(const nf_array *a) {
  ck_assert_int_eq(a->dtype, NF_I64);
  return (int64_t *)a->data;
}


static nf_array make_input(rng *r, const ispec *s) {
  int64_t shape[NF_MAX_RANK];
  for (int d = 0; d < s->rank; d++) shape[d] = s->dims[d];
  nf_array a = arr_new(s->kind == IN_IDX ? NF_I64 : NF_F64, s->rank, shape);
  switch (s->kind) {
  case IN_NZ:
    for (int64_t i = 0; i < a.numel; i++) F(&a)[i] = rng_nz(r, s->a);
    break;
  case IN_UNIF:
    for (int64_t i = 0; i < a.numel; i++) F(&a)[i] = s->a + (s->b - s->a) * rng_unit(r);
    break;
  case IN_IDX:
    for (int64_t i = 0; i < a.numel; i++)
      I(&a)[i] = (int64_t)(rng_next(r) % (uint64_t)s->a);
    break;
  case IN_ONEHOT: { /* rows of the last axis: one 1, the rest 0 */
    int64_t n = s->dims[s->rank - 1];
    for (int64_t row = 0; row < a.numel / n; row++)
      F(&a)[row * n + (int64_t)(rng_next(r) % (uint64_t)n)] = 1.0;
    break;
  }
  case IN_TIES: /* few distinct values: many ties */
    for (int64_t i = 0; i < a.numel; i++) {
      static const double vals[] = {0.25, 0.5, 1.0, -0.75};
      F(&a)[i] = vals[rng_next(r) % (s->a > 0 ? (uint64_t)s->a : 4)];
    }
    break;
  }
  return a;
}

/* An f64 array of nonzero random values of the shape of tensor t. */
static nf_array rand_like(rng *r, const nf_tensor *t) {
  nf_array a = arr_new(NF_F64, t->rank, t->shape);
  for (int64_t i = 0; i < a.numel; i++) F(&a)[i] = rng_nz(r, 1.0);
  return a;
}

/* ---- modules ---- */

static nf_module *load_nn(nf_diag *d) {
  const char *lib = getenv("NEOFLOW_LIB");
  char path[4096];
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  nf_test_lib_path(path, sizeof path);
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s\n%s", path, nf_status_name(rc),
                nf_diag_text(d));
  return m;
}

/* examples/workloads.nf, found next to lib/ ($NEOFLOW_LIB/..). */
static nf_module *load_workloads(nf_diag *d) {
  const char *lib = getenv("NEOFLOW_LIB");
  char path[4096];
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  snprintf(path, sizeof path, "%s/../examples/workloads.nf", lib);
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s\n%s", path, nf_status_name(rc),
                nf_diag_text(d));
  return m;
}

/* The small defs of the index and error cases below. */
static const char cases_src[] =
    "import nn\n"
    "def bcast_const(X: f32[M, N], Z: f32[P, N]) -> (Y: f32[P, N]) {\n"
    "  Y(i, j) = X(0, j) * Z(i, j)\n"
    "}\n"
    "def concat_select(A: f32[R, M], B: f32[R, N]) -> (Y: f32[R, M + N]) {\n"
    "  Y(i, j) = j < M ? A(i, j) : B(i, j - M)\n"
    "}\n"
    "def reshape_two_mod(X: f32[D, 3, 4]) -> (Y: f32[D * 12]) {\n"
    "  Y(f) = X(f // 12, f // 4 % 3, f % 4)\n"
    "}\n"
    "def quad(A: f32[H, W]) -> (Y: f32[H, W]) {\n"
    "  Y(h, w) = A(h, w) * 4 - A(h, w) * A(h, w)\n"
    "}\n"
    "def stride2(I: f32[N]) -> (Y: f32[N // 2]) {\n"
    "  Y(h) = I(2 * h)\n"
    "}\n"
    "def diag(A: f32[N, N]) -> (Y: f32[N]) {\n"
    "  Y(i) = A(i, i)\n"
    "}\n"
    "def conv1d(X: f32[N], Wk: f32[K]) -> (Y: f32[N - K + 1]) {\n"
    "  Y(i) +=! X(i + k) * Wk(k)\n"
    "}\n"
    "def reversed(X: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = X(i) * X(N - 1 - i)\n"
    "}\n"
    "def prod_min(X: f32[M, N]) -> (P: f32[M], Q: f32[M]) {\n"
    "  P(i) *=! X(i, j)\n"
    "  Q(i) min=! X(i, j)\n"
    "}\n"
    "def math(X: f32[N], Z: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = pow(abs(X(i)) + 1.0, Z(i)) + log(abs(X(i))) * sqrt(abs(Z(i))) -\n"
    "         min(X(i), Z(i)) / (2.0 + exp(Z(i))) + rsqrt(X(i) * X(i) + 0.5) +\n"
    "         floor(X(i) * 3.0) * X(i) + ceil(Z(i)) + erf(X(i) - Z(i)) +\n"
    "         max(tanh(X(i)), sigmoid(Z(i))) - (-X(i))\n"
    "}\n"
    "def two_outputs(X: f32[N]) -> (Y: f32[N], Z: f32[N]) {\n"
    "  Y(i) = X(i) * X(i)\n"
    "  Z(i) = Y(i) * 3.0 + X(i)\n"
    "}\n"
    "def scalar_in(a: f32[], X: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = a() * X(i) + a() * a()\n"
    "}\n"
    "def in_f64(X: f64[N], Z: f32[N]) -> (Y: f64[N]) {\n"
    "  Y(i) = X(i) * f64(Z(i)) * X(i)\n"
    "}\n"
    "def cast_guard(X: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = i32(X(i) * 3.0) > 0 ? X(i) * X(i) : 2.0 * X(i)\n"
    "}\n"
    "def chain(X: f32[M, N], W: f32[N, N]) -> (L: f32[]) {\n"
    "  H = matmul(X, W)\n"
    "  T = tanh(H)\n"
    "  Z = matmul(T, W)\n"
    "  S = softmax(Z)\n"
    "  L() +=! S(i, j) * H(i, j)\n"
    "}\n"
    "def self_transpose(X: f32[N, N]) -> (Y: f32[N, N]) {\n"
    "  Y(i, j) = X(i, j) * X(j, i)\n"
    "}\n"
    "def upsample(X: f32[N]) -> (Y: f32[2 * N]) {\n"
    "  Y(h) = X(h // 2)\n"
    "}\n"
    "def tile<N>(X: f32[3]) -> (Y: f32[N]) {\n"
    "  Y(h) = X(h % 3)\n"
    "}\n"
    "def hankel(X: f32[N], Z: f32[M]) -> (Y: f32[N - M + 1, M]) {\n"
    "  Y(i, k) = X(i + k) * Z(k)\n"
    "}\n"
    "def flipped_conv(X: f32[N], Wk: f32[3]) -> (Y: f32[N - 2]) {\n"
    "  Y(i) +=! X(i + 2 - k) * Wk(k)\n"
    "}\n"
    "def zero_insert(X: f32[N]) -> (Y: f32[2 * N]) {\n"
    "  Y(i) = i % 2 == 0 ? X(i // 2) : 0.0\n"
    "}\n"
    "def cross_red(X: f32[N, N]) -> (Y: f32[N]) {\n"
    "  Y(i) +=! X(i, k) * X(k, i)\n"
    "}\n"
    "def copy(X: f32[M, N]) -> (Y: f32[M, N]) {\n"
    "  Y = X\n"
    "}\n"
    "def stopgrad(X: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = stop_gradient(X(i)) * X(i)\n"
    "}\n"
    "def stopgrad_path(X: f32[N], Z: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = X(i) * stop_gradient(Z(i) * Z(i))\n"
    "}\n"
    "def nopath(X: f32[N], Z: f32[N]) -> (Y: f32[N]) {\n"
    "  Y(i) = X(i) * 2.0\n"
    "}\n"
    "def cast_value(X: f32[N]) -> (Rounded: f32[N]) {\n"
    "  Rounded(i) = f32(i32(X(i)))\n"
    "}\n"
    "def cast_local(X: f32[N]) -> (Y: f32[N]) {\n"
    "  Trunc(i) = i64(X(i) * 4.0)\n"
    "  Y(i) = f32(Trunc(i)) * X(i)\n"
    "}\n"
    "def float_mod(X: f32[N]) -> (Wrapped: f32[N]) {\n"
    "  Wrapped(i) = X(i) % 0.75\n"
    "}\n"
    "def lookup(table: f32[V, D], idx: i64[B]) -> (Y: f32[B, D]) {\n"
    "  Y = embedding(table, idx)\n"
    "}\n";

static nf_module *load_cases(nf_diag *d) {
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_source(m, "autodiff_cases.nf", cases_src, d);
  ck_assert_msg(rc == NF_OK, "loading the cases: %s\n%s", nf_status_name(rc),
                nf_diag_text(d));
  return m;
}

/* ---- the case tables ---- */

typedef libcase gcase;


/* lib_cases: every def of lib/nn.nf (nf_test_cases.h). */
#define N_LIB ((int)(sizeof lib_cases / sizeof lib_cases[0]))

/* workload_cases: the six workloads at small shapes (nf_test_cases.h). */
#define N_WORKLOADS ((int)(sizeof workload_cases / sizeof workload_cases[0]))

/* Index forms that broke the original NeoFlow, and the derivative rules. */
static const gcase index_cases[] = {
    {"broadcast with a constant index", "bcast_const", P0, 2,
     {NZ(1, 2, 3, 5), NZ(1, 2, 4, 5)}, NULL, 1, 0},
    {"concat written with ?:", "concat_select", P0, 2, {NZ(1, 2, 3, 4), NZ(1, 2, 3, 5)},
     NULL, 1, 0},
    {"reshape with two %", "reshape_two_mod", P0, 1, {NZ(1, 3, 3, 3, 4)}, NULL, 1, 0},
    {"A*4 - A*A", "quad", P0, 1, {NZ(1, 2, 3, 5)}, NULL, 1, 0},
    {"pure stride I(2h)", "stride2", P0, 1, {NZ(1, 1, 9)}, NULL, 1, 0},
    {"diagonal A(i, i)", "diag", P0, 1, {NZ(1, 2, 5, 5)}, NULL, 1, 0},
    {"conv1d X(i + k)", "conv1d", P0, 2, {NZ(1, 1, 11), NZ(1, 1, 3)}, NULL, 1, 0},
    {"one tensor read twice X(i) X(N-1-i)", "reversed", P0, 1, {NZ(1, 1, 7)}, NULL, 1, 0},
    {"product and min reductions", "prod_min", P0, 1, {NZ(1, 2, 3, 5)}, NULL, 1, 0},
    {"math functions", "math", P0, 2, {NZ(1, 1, 9), NZ(1, 1, 9)}, NULL, 1, 0},
    {"an output read by another output", "two_outputs", P0, 1, {NZ(1, 1, 5)}, NULL, 1, 0},
    {"scalar input", "scalar_in", P0, 2, {SCALAR(1), NZ(1, 1, 5)}, NULL, 1, 0},
    {"f64 and f32 inputs", "in_f64", P0, 2, {NZ(1, 1, 5), NZ(1, 1, 5)}, NULL, 1, 0},
    {"float-to-int cast in a guard", "cast_guard", P0, 1, {NZ(1, 1, 9)}, NULL, 1, 0},
    {"X(i, j) * X(j, i)", "self_transpose", P0, 1, {NZ(1, 2, 5, 5)}, NULL, 1, 0},
    {"upsample X(h // 2)", "upsample", P0, 1, {NZ(1, 1, 5)}, NULL, 1, 0},
    {"tile X(h % 3)", "tile", P1("N", 11), 1, {NZ(1, 1, 3)}, NULL, 1, 0},
    {"hankel X(i + k) Z(k)", "hankel", P0, 2, {NZ(1, 1, 9), NZ(1, 1, 4)}, NULL, 1, 0},
    {"flipped conv X(i + 2 - k)", "flipped_conv", P0, 2, {NZ(1, 1, 9), NZ(1, 1, 3)}, NULL, 1,
     0},
    {"zero insertion i % 2 == 0 ? X(i // 2)", "zero_insert", P0, 1, {NZ(1, 1, 7)}, NULL, 1,
     0},
    {"X(i, k) X(k, i) reduced", "cross_red", P0, 1, {NZ(1, 2, 5, 5)}, NULL, 1, 0},
    {"copy Y = X", "copy", P0, 1, {NZ(1, 2, 3, 5)}, NULL, 1, 0},
    {"chain matmul tanh matmul softmax", "chain", P0, 2, {NZ(1, 2, 3, 5), NZ(1, 2, 5, 5)},
     NULL, 0, 0},
};
#define N_INDEX ((int)(sizeof index_cases / sizeof index_cases[0]))

/* ---- building and checking one gradient ---- */

typedef struct gstate {
  const char *label;
  nf_ir_ctx *ctx;
  nf_graph *g, *gg;
  nf_grad_report rep;
  int n_in;
  nf_array *in; /* not owned */
  int n_wrt;
  const char *wrt[MAX_IN];
  int wrt_in[MAX_IN]; /* position of each wrt among the inputs */
  nf_array seeds[8];
  nf_array grads[MAX_IN];
} gstate;

static int instantiate(nf_module *m, const char *def, int n_in, const nf_array *in,
                       int n_par, const char *const *pn, const int64_t *pv,
                       nf_ir_ctx *ctx, nf_graph **g, nf_diag *d) {
  nf_arg_shape shapes[MAX_IN];
  ck_assert_int_le(n_in, MAX_IN);
  for (int k = 0; k < n_in; k++) {
    memset(&shapes[k], 0, sizeof shapes[k]);
    shapes[k].rank = in[k].rank;
    for (int a = 0; a < in[k].rank; a++) shapes[k].dims[a] = in[k].shape[a];
  }
  nf_inst_opts o = {.n_shapes = n_in, .shapes = shapes, .n_params = n_par,
                    .param_names = pn, .param_values = pv};
  *g = NULL;
  return nf_module_instantiate(m, def, &o, ctx, g, d);
}

static const nf_tensor *input_tensor(const nf_graph *g, int k) {
  return &g->tensors[g->inputs[k]];
}

static int find_input(const nf_graph *g, const char *name) {
  for (uint32_t k = 0; k < g->n_inputs; k++)
    if (strcmp(input_tensor(g, (int)k)->name, name) == 0) return (int)k;
  return -1;
}

static void expect_same_shape(const char *label, const char *what, const nf_tensor *got,
                              const nf_tensor *want) {
  ck_assert_msg(got->rank == want->rank, "%s: %s has rank %d, want %d", label, what,
                got->rank, want->rank);
  for (int d = 0; d < got->rank; d++)
    ck_assert_msg(got->shape[d] == want->shape[d], "%s: %s dim %d is %lld, want %lld",
                  label, what, d, (long long)got->shape[d], (long long)want->shape[d]);
  ck_assert_msg(got->dtype == want->dtype, "%s: %s has dtype %s, want %s", label, what,
                nf_dtype_name((nf_dtype)got->dtype), nf_dtype_name((nf_dtype)want->dtype));
}

/* Checks the gradient graph's interface (header of nf_autodiff.h): inputs
 * are g's then one seed "d<out>" per output; outputs [g's outputs when
 * keep] then "grad_<X>" per wrt, of X's shape and dtype. */
static void check_interface(const gstate *s, int keep) {
  const nf_graph *g = s->g, *gg = s->gg;
  char what[160];
  ck_assert_msg(gg->n_inputs == g->n_inputs + g->n_outputs,
                "%s: gradient graph has %u inputs, want %u + %u seeds", s->label,
                gg->n_inputs, g->n_inputs, g->n_outputs);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &gg->tensors[gg->inputs[k]], *f = input_tensor(g, (int)k);
    ck_assert_msg(strcmp(t->name, f->name) == 0, "%s: gradient input %u is '%s', want '%s'",
                  s->label, k, t->name, f->name);
    snprintf(what, sizeof what, "input %s", f->name);
    expect_same_shape(s->label, what, t, f);
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const nf_tensor *t = &gg->tensors[gg->inputs[g->n_inputs + k]];
    const nf_tensor *y = &g->tensors[g->outputs[k]];
    snprintf(what, sizeof what, "d%s", y->name);
    ck_assert_msg(strcmp(t->name, what) == 0, "%s: seed %u is '%s', want '%s'", s->label,
                  k, t->name, what);
    expect_same_shape(s->label, what, t, y);
  }
  uint32_t n_keep = keep ? g->n_outputs : 0;
  ck_assert_msg(gg->n_outputs == n_keep + (uint32_t)s->n_wrt,
                "%s: gradient graph has %u outputs, want %u + %d", s->label, gg->n_outputs,
                n_keep, s->n_wrt);
  for (uint32_t k = 0; k < n_keep; k++) {
    const nf_tensor *t = &gg->tensors[gg->outputs[k]], *y = &g->tensors[g->outputs[k]];
    ck_assert_msg(strcmp(t->name, y->name) == 0, "%s: kept output %u is '%s', want '%s'",
                  s->label, k, t->name, y->name);
    expect_same_shape(s->label, y->name, t, y);
  }
  for (int w = 0; w < s->n_wrt; w++) {
    const nf_tensor *t = &gg->tensors[gg->outputs[n_keep + (uint32_t)w]];
    snprintf(what, sizeof what, "grad_%s", s->wrt[w]);
    ck_assert_msg(strcmp(t->name, what) == 0, "%s: gradient output %d is '%s', want '%s'",
                  s->label, w, t->name, what);
    expect_same_shape(s->label, what, t, input_tensor(s->g, s->wrt_in[w]));
  }
}

/* Instantiates def, builds the gradient for wrt (NULL: every float
 * input), checks its interface and evaluates it in f64 with random seeds. */
static void gs_build(gstate *s, nf_module *m, const char *label, const char *def,
                     int n_in, nf_array *in, int n_par, const char *const *pn,
                     const int64_t *pv, const char *wrt) {
  memset(s, 0, sizeof *s);
  s->label = label;
  s->n_in = n_in;
  s->in = in;
  nf_diag *d = nf_diag_new();
  ck_assert_ptr_nonnull(d);
  s->ctx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(s->ctx);
  int rc = instantiate(m, def, n_in, in, n_par, pn, pv, s->ctx, &s->g, d);
  ck_assert_msg(rc == NF_OK, "%s: instantiate %s: %s\n%s", label, def, nf_status_name(rc),
                nf_diag_text(d));
  nf_diag_free(d);
  ck_assert_int_eq((int)s->g->n_inputs, n_in);
  ck_assert_int_le((int)s->g->n_outputs, 8);
  if (wrt) { /* space-separated names */
    for (const char *p = wrt; *p;) {
      char tok[64];
      size_t n = strcspn(p, " ");
      ck_assert_int_lt(n, sizeof tok);
      memcpy(tok, p, n);
      tok[n] = 0;
      p += n + (p[n] == ' ');
      if (!n) continue;
      int k = find_input(s->g, tok);
      ck_assert_msg(k >= 0, "%s: no input %s", label, tok);
      ck_assert_int_lt(s->n_wrt, MAX_IN);
      s->wrt_in[s->n_wrt] = k;
      s->wrt[s->n_wrt++] = input_tensor(s->g, k)->name;
    }
  } else {
    for (int k = 0; k < n_in; k++)
      if (nf_dtype_is_float((nf_dtype)input_tensor(s->g, k)->dtype)) {
        s->wrt_in[s->n_wrt] = k;
        s->wrt[s->n_wrt++] = input_tensor(s->g, k)->name;
      }
  }
  nf_grad_opts o = {.n_wrt = s->n_wrt, .wrt = s->wrt, .keep_outputs = 0};
  nf_buf err = NF_BUF_INIT;
  rc = nf_grad_graph(s->g, &o, s->ctx, &s->gg, &s->rep, &err);
  ck_assert_msg(rc == NF_OK, "%s: nf_grad: %s: %s", label, nf_status_name(rc),
                nf_buf_str(&err));
  nf_buf_free(&err);
  ck_assert_ptr_nonnull(s->gg);
  nf_buf verr = NF_BUF_INIT;
  rc = nf_graph_validate(s->gg, &verr);
  ck_assert_msg(rc == NF_OK, "%s: the gradient graph is invalid: %s", label,
                nf_buf_str(&verr));
  nf_buf_free(&verr);
  check_interface(s, 0);

  /* inputs, then random seeds, through the gradient graph */
  rng r = {str_hash(label) ^ 0x5eed};
  nf_array all[MAX_IN + 8];
  for (int k = 0; k < n_in; k++) all[k] = in[k];
  for (uint32_t k = 0; k < s->g->n_outputs; k++) {
    s->seeds[k] = rand_like(&r, &s->g->tensors[s->g->outputs[k]]);
    all[n_in + (int)k] = s->seeds[k];
  }
  nf_buf rerr = NF_BUF_INIT;
  rc = nf_interp_run(s->gg, all, NF_INTERP_F64, s->grads, &rerr);
  ck_assert_msg(rc == NF_OK, "%s: evaluating the gradient graph: %s: %s", label,
                nf_status_name(rc), nf_buf_str(&rerr));
  nf_buf_free(&rerr);
  for (int w = 0; w < s->n_wrt; w++) {
    ck_assert_int_eq(s->grads[w].dtype, NF_F64);
    for (int64_t e = 0; e < s->grads[w].numel; e++)
      ck_assert_msg(isfinite(F(&s->grads[w])[e]), "%s: grad_%s[%lld] is %g", label,
                    s->wrt[w], (long long)e, F(&s->grads[w])[e]);
  }
}

static void gs_free(gstate *s) {
  for (int w = 0; w < s->n_wrt; w++) nf_array_free(&s->grads[w]);
  if (s->g)
    for (uint32_t k = 0; k < s->g->n_outputs; k++) nf_array_free(&s->seeds[k]);
  nf_ir_ctx_free(s->ctx);
  memset(s, 0, sizeof *s);
}

/* L = sum_k sum(dY_k * Y_k) of the forward graph at the current inputs. */
static double fwd_loss(const gstate *s) {
  nf_array out[8];
  nf_buf err = NF_BUF_INIT;
  memset(out, 0, sizeof out);
  int rc = nf_interp_run(s->g, s->in, NF_INTERP_F64, out, &err);
  ck_assert_msg(rc == NF_OK, "%s: forward: %s: %s", s->label, nf_status_name(rc),
                nf_buf_str(&err));
  nf_buf_free(&err);
  double l = 0;
  for (uint32_t k = 0; k < s->g->n_outputs; k++) {
    ck_assert_int_eq(out[k].dtype, NF_F64);
    for (int64_t e = 0; e < out[k].numel; e++) l += F(&s->seeds[k])[e] * F(&out[k])[e];
    nf_array_free(&out[k]);
  }
  return l;
}

/* Compares every grad_X with central differences (all elements when all or
 * small, else FD_SAMPLE random ones plus the first and the last). */
static void gs_check_fd(const gstate *s, int all) {
  rng r = {str_hash(s->label) ^ 0xfd};
  for (int w = 0; w < s->n_wrt; w++) {
    nf_array *x = &s->in[s->wrt_in[w]];
    const nf_array *gr = &s->grads[w];
    int64_t n = x->numel, n_pick = (all || n <= FD_ALL) ? n : FD_SAMPLE;
    int64_t *pick = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    ck_assert_ptr_nonnull(pick);
    for (int64_t e = 0; e < n; e++) pick[e] = e;
    if (n_pick < n) { /* partial Fisher-Yates, keeping 0 and n - 1 */
      pick[0] = 0;
      pick[1] = n - 1;
      pick[n - 1] = 1;
      for (int64_t e = 2; e < n_pick; e++) {
        int64_t j = e + (int64_t)(rng_next(&r) % (uint64_t)(n - e));
        int64_t t = pick[e];
        pick[e] = pick[j];
        pick[j] = t;
      }
    }
    double num = 0, den = 0, worst = -1, wg = 0, wf = 0;
    int64_t we = -1;
    for (int64_t p = 0; p < n_pick; p++) {
      int64_t e = pick[p];
      double x0 = F(x)[e], h = FD_STEP * fmax(1.0, fabs(x0));
      double xp = x0 + h, xm = x0 - h;
      F(x)[e] = xp;
      double lp = fwd_loss(s);
      F(x)[e] = xm;
      double lm = fwd_loss(s);
      F(x)[e] = x0;
      double fd = (lp - lm) / (xp - xm), gv = F(gr)[e];
      num += (gv - fd) * (gv - fd);
      den += fd * fd;
      if (fabs(gv - fd) > worst) {
        worst = fabs(gv - fd);
        we = e;
        wg = gv;
        wf = fd;
      }
    }
    free(pick);
    double rel = sqrt(num) / fmax(sqrt(den), FD_FLOOR);
    /* every element at once: the derivative along two random directions v
     * against grad . v, relative to sum |grad_e v_e| */
    double drel = 0;
    for (int dir = 0; dir < 2 && n > 0; dir++) {
      double *x0 = malloc(sizeof(double) * (size_t)n), *v = malloc(sizeof(double) * (size_t)n);
      ck_assert_ptr_nonnull(x0);
      ck_assert_ptr_nonnull(v);
      double gv = 0, mag = 0, xmax = 0;
      for (int64_t e = 0; e < n; e++) {
        x0[e] = F(x)[e];
        v[e] = rng_nz(&r, 1.0);
        gv += F(gr)[e] * v[e];
        mag += fabs(F(gr)[e] * v[e]);
        xmax = fmax(xmax, fabs(x0[e]));
      }
      double h = FD_STEP * fmax(1.0, xmax);
      for (int64_t e = 0; e < n; e++) F(x)[e] = x0[e] + h * v[e];
      double lp = fwd_loss(s);
      for (int64_t e = 0; e < n; e++) F(x)[e] = x0[e] - h * v[e];
      double lm = fwd_loss(s);
      for (int64_t e = 0; e < n; e++) F(x)[e] = x0[e];
      double fd = (lp - lm) / (2 * h);
      double dr = fabs(gv - fd) / fmax(fmax(mag, fabs(fd)), FD_FLOOR);
      drel = fmax(drel, dr);
      free(x0);
      free(v);
      ck_assert_msg(dr <= FD_RTOL,
                    "%s: grad_%s . v differs from the finite difference along v (all %lld "
                    "elements): %.17g vs %.17g, relative error %.3g",
                    s->label, s->wrt[w], (long long)n, gv, fd, dr);
    }
    fprintf(stderr, "fd  %-40s grad_%-8s %4lld of %5lld elements  rel err %.2e  "
            "directional %.2e\n", s->label, s->wrt[w], (long long)n_pick, (long long)n,
            rel, drel);
    ck_assert_msg(rel <= FD_RTOL,
                  "%s: grad_%s differs from finite differences: relative error %.3g over "
                  "%lld elements; worst element %lld: grad %.17g, fd %.17g",
                  s->label, s->wrt[w], rel, (long long)n_pick, (long long)we, wg, wf);
  }
}

static void run_case(nf_module *m, const gcase *c, uint64_t seed) {
  rng r = {seed ^ str_hash(c->label)};
  nf_array in[MAX_IN];
  for (int k = 0; k < c->n_in; k++) in[k] = make_input(&r, &c->in[k]);
  gstate s;
  gs_build(&s, m, c->label, c->def, c->n_in, in, c->n_par, c->pn, c->pv, c->wrt);
  gs_check_fd(&s, c->all);
  gs_free(&s);
  for (int k = 0; k < c->n_in; k++) nf_array_free(&in[k]);
}

/* ---- FLOP table ---- */

/* Points of a statement's iteration box: the output's elements times
 * every reduction range. */
static double box_points(const nf_graph *g, uint32_t stmt) {
  const nf_stmt *st = &g->stmts[stmt];
  double n = (double)nf_tensor_numel(&g->tensors[st->out]);
  for (int r = 0; r < st->n_red; r++) n *= (double)st->red_ext[r];
  return n;
}

/* Prints every item of the report and checks its counts against
 * nf_stmt_flops.  Returns the number of non-scatter items with a forward
 * statement whose cost exceeds FLOP_RATIO times the forward's, listing
 * them in bad. */
static int flop_table(const gstate *s, nf_buf *bad) {
  int n_bad = 0;
  const nf_grad_report *rep = &s->rep;
  ck_assert_msg(rep->n_items > 0, "%s: the report has no items", s->label);
  for (int k = 0; k < rep->n_items; k++) {
    const nf_grad_item *it = &rep->items[k];
    ck_assert_msg(it->stmt < s->gg->n_stmts, "%s: item %d names statement %u of %u",
                  s->label, k, it->stmt, s->gg->n_stmts);
    ck_assert_msg(it->fwd_stmt < (int32_t)s->g->n_stmts, "%s: item %d: fwd_stmt %d of %u",
                  s->label, k, it->fwd_stmt, s->g->n_stmts);
    ck_assert_msg(it->flops == nf_stmt_flops(s->gg, it->stmt),
                  "%s: item %d: flops %lld, nf_stmt_flops says %lld", s->label, k,
                  (long long)it->flops, (long long)nf_stmt_flops(s->gg, it->stmt));
    if (it->fwd_stmt >= 0)
      ck_assert_msg(it->fwd_flops == nf_stmt_flops(s->g, (uint32_t)it->fwd_stmt),
                    "%s: item %d: fwd_flops %lld, nf_stmt_flops says %lld", s->label, k,
                    (long long)it->fwd_flops,
                    (long long)nf_stmt_flops(s->g, (uint32_t)it->fwd_stmt));
    else
      ck_assert_msg(it->fwd_flops == 0, "%s: item %d: fwd_stmt -1 but fwd_flops %lld",
                    s->label, k, (long long)it->fwd_flops);
    ck_assert_msg(!!it->scatter == !!(s->gg->stmts[it->stmt].flags & NF_STMT_SCATTER),
                  "%s: item %d: scatter %d but the statement's flag says %d", s->label, k,
                  it->scatter, !!(s->gg->stmts[it->stmt].flags & NF_STMT_SCATTER));
    if (it->scatter)
      ck_assert_msg(it->why && *it->why, "%s: item %d is a scatter without a reason",
                    s->label, k);
    double ratio = it->fwd_flops > 0 ? (double)it->flops / (double)it->fwd_flops : 0;
    /* a forward statement that moves data without arithmetic (a copy, a
     * cat's or stack's selects) costs no FLOPs; its gradient may then add
     * up to FLOP_RATIO per point of its own box (the sums where copies
     * meet) */
    double allowed = it->fwd_flops > 0 ? (double)it->fwd_flops : box_points(s->gg, it->stmt);
    int over = it->fwd_stmt >= 0 && !it->scatter && (double)it->flops > FLOP_RATIO * allowed;
    const char *fwd_name =
        it->fwd_stmt >= 0 ? s->g->tensors[s->g->stmts[it->fwd_stmt].out].name : "-";
    /* the iteration boxes' ratio, for reading: guards that fail cost no
     * FLOPs (flops.c) but the loops still visit their points unless code
     * generation splits them */
    double box = it->fwd_stmt >= 0 ? box_points(s->gg, it->stmt) /
                                         box_points(s->g, (uint32_t)it->fwd_stmt)
                                   : 0;
    fprintf(stderr,
            "flops %-34s stmt %3u -> %-12s fwd %3d (%-10s) wrt %-8s %10lld / %10lld = "
            "%5.2f  box %5.2f%s%s%s\n",
            s->label, it->stmt, s->gg->tensors[s->gg->stmts[it->stmt].out].name,
            it->fwd_stmt, fwd_name, it->wrt ? it->wrt : "-", (long long)it->flops,
            (long long)it->fwd_flops, ratio, box, it->scatter ? "  scatter: " : "",
            it->scatter && it->why ? it->why : "", over ? "  OVER" : "");
    if (over) {
      n_bad++;
      nf_buf_printf(bad, "\n  %s: stmt %u (%s) for fwd %d (%s): %lld > %.0f x %lld",
                    s->label, it->stmt, s->gg->tensors[s->gg->stmts[it->stmt].out].name,
                    it->fwd_stmt, fwd_name, (long long)it->flops, FLOP_RATIO,
                    (long long)it->fwd_flops);
    }
  }
  return n_bad;
}

static void flop_case(nf_module *m, const gcase *c, int assert_ratio) {
  rng r = {str_hash(c->label)};
  nf_array in[MAX_IN];
  for (int k = 0; k < c->n_in; k++) in[k] = make_input(&r, &c->in[k]);
  gstate s;
  gs_build(&s, m, c->label, c->def, c->n_in, in, c->n_par, c->pn, c->pv, c->wrt);
  nf_buf bad = NF_BUF_INIT;
  int n_bad = flop_table(&s, &bad);
  if (!assert_ratio && n_bad)
    fprintf(stderr, "flops %s: %d statements over %.0fx (not asserted):%s\n", c->label,
            n_bad, FLOP_RATIO, nf_buf_str(&bad));
  ck_assert_msg(!assert_ratio || n_bad == 0,
                "%s: %d gradient statements cost more than %.0fx their forward "
                "statement:%s", c->label, n_bad, FLOP_RATIO, nf_buf_str(&bad));
  nf_buf_free(&bad);
  gs_free(&s);
  for (int k = 0; k < c->n_in; k++) nf_array_free(&in[k]);
}

/* ---- loop tests over the tables ---- */

static nf_module *g_nn, *g_workloads, *g_cases;

static nf_module *nn(void) {
  if (!g_nn) {
    nf_diag *d = nf_diag_new();
    g_nn = load_nn(d);
    nf_diag_free(d);
  }
  return g_nn;
}

static nf_module *workloads(void) {
  if (!g_workloads) {
    nf_diag *d = nf_diag_new();
    g_workloads = load_workloads(d);
    nf_diag_free(d);
  }
  return g_workloads;
}

static nf_module *cases(void) {
  if (!g_cases) {
    nf_diag *d = nf_diag_new();
    g_cases = load_cases(d);
    nf_diag_free(d);
  }
  return g_cases;
}

/* Every def of lib/nn.nf and of tests/data/builtins.nf (the built-in
 * operators; its helper mv aside) has a case in lib_cases (a new def must
 * get one). */
START_TEST(autodiff_library_coverage) {
  const char *lib = getenv("NEOFLOW_LIB");
  char path[4096];
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  snprintf(path, sizeof path, "%s/nn.nf", lib);
  nf_diag *d = nf_diag_new();
  nf_module *plain = nf_module_new();
  ck_assert_int_eq(nf_module_load_file(plain, path, d), NF_OK);
  ck_assert_int_gt(nf_module_n_defs(plain), 30);
  for (int f = 0; f < 2; f++) {
    nf_module *m = f ? nn() : plain;
    int n = nf_module_n_defs(m);
    for (int k = 0; k < n; k++) {
      const char *def = nf_module_def_name(m, k);
      int found = !strcmp(def, "mv");
      for (int c = 0; c < N_LIB; c++) found |= strcmp(lib_cases[c].def, def) == 0;
      ck_assert_msg(found, "%s's def %s has no gradient case in lib_cases",
                    f ? "tests/data/builtins.nf" : "lib/nn.nf", def);
    }
  }
  nf_module_free(plain);
  nf_diag_free(d);
}
END_TEST

START_TEST(autodiff_library) {
  if (lib_cases[_i].known) return;
  run_case(nn(), &lib_cases[_i], 101);
}
END_TEST

START_TEST(autodiff_workloads) {
  if (workload_cases[_i].known) return;
  run_case(workloads(), &workload_cases[_i], 202);
}
END_TEST

START_TEST(autodiff_index_forms) {
  if (index_cases[_i].known) return;
  run_case(cases(), &index_cases[_i], 303);
}
END_TEST

/* The known failures, kept so that the log tells the truth (the same
 * inputs as in their own tables).  known_ids[k] numbers the cases of the
 * three tables in order. */
static int known_ids[N_LIB + N_WORKLOADS + N_INDEX], n_known;

static void find_known(void) {
  n_known = 0;
  for (int k = 0; k < N_LIB + N_WORKLOADS + N_INDEX; k++) {
    int kk = k;
    const gcase *c = kk < N_LIB ? &lib_cases[kk]
                     : (kk -= N_LIB) < N_WORKLOADS ? &workload_cases[kk]
                                                  : &index_cases[kk - N_WORKLOADS];
    if (c->known) known_ids[n_known++] = k;
  }
}

START_TEST(autodiff_known_failures) {
  int k = known_ids[_i];
  if (k < N_LIB)
    run_case(nn(), &lib_cases[k], 101);
  else if ((k -= N_LIB) < N_WORKLOADS)
    run_case(workloads(), &workload_cases[k], 202);
  else
    run_case(cases(), &index_cases[k - N_WORKLOADS], 303);
}
END_TEST

/* FLOP ratios: matmul and conv2d at stride 1 and 2 must hold; the table
 * covers every library def and the workloads. */
static const gcase flop_core[] = {
    {"matmul 33x47x29", "matmul", P0, 2, {NZ(1, 2, 33, 47), NZ(1, 2, 47, 29)}, NULL, 0, 0},
    {"conv2d stride 1 pad 1", "conv2d", P1("pad", 1), 2,
     {NZ(1, 4, 2, 8, 15, 15), NZ(1, 4, 16, 8, 3, 3)}, NULL, 0, 0},
    {"conv2d stride 2 pad 1", "conv2d", P2("stride", 2, "pad", 1), 2,
     {NZ(1, 4, 2, 8, 15, 15), NZ(1, 4, 16, 8, 3, 3)}, NULL, 0, 0},
    {"conv2d stride 2 no pad", "conv2d", P1("stride", 2), 2,
     {NZ(1, 4, 2, 8, 16, 16), NZ(1, 4, 16, 8, 3, 3)}, NULL, 0, 0},
};
#define N_FLOP_CORE ((int)(sizeof flop_core / sizeof flop_core[0]))

START_TEST(autodiff_flops_core) { flop_case(nn(), &flop_core[_i], 1); }
END_TEST

START_TEST(autodiff_flops_library) { flop_case(nn(), &lib_cases[_i], 1); }
END_TEST

/* The workloads' tables, for reading (the ratio is not asserted). */
START_TEST(autodiff_flops_workloads) { flop_case(workloads(), &workload_cases[_i], 0); }
END_TEST

/* nf_stmt_flops itself on forward statements whose cost is plain. */
START_TEST(autodiff_stmt_flops) {
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  rng r = {7};
  {
    nf_array in[2] = {make_input(&r, &(ispec)NZ(1, 2, 5, 7)),
                      make_input(&r, &(ispec)NZ(1, 2, 7, 3))};
    nf_graph *g;
    ck_assert_int_eq(instantiate(nn(), "matmul", 2, in, 0, NULL, NULL, ctx, &g, d), NF_OK);
    ck_assert_int_eq(g->n_stmts, 1);
    /* one multiply and one accumulation per (i, j, k) */
    ck_assert_int_eq(nf_stmt_flops(g, 0), 2 * 5 * 7 * 3);
    for (int k = 0; k < 2; k++) nf_array_free(&in[k]);
  }
  {
    nf_array in[2] = {make_input(&r, &(ispec)NZ(1, 4, 2, 3, 9, 7)),
                      make_input(&r, &(ispec)NZ(1, 4, 4, 3, 3, 3))};
    nf_graph *g;
    const char *pn[] = {"stride", "pad"};
    int64_t pv[] = {2, 1};
    ck_assert_int_eq(instantiate(nn(), "conv2d", 2, in, 2, pn, pv, ctx, &g, d), NF_OK);
    ck_assert_int_eq(g->n_stmts, 1);
    /* the padding guard is integer arithmetic, counted exactly (flops.c):
     * one multiply and one accumulation per point where it holds */
    int64_t valid_h = 0, valid_w = 0;
    for (int o = 0; o < (9 + 2 - 3) / 2 + 1; o++)
      for (int k = 0; k < 3; k++) valid_h += o * 2 + k - 1 >= 0 && o * 2 + k - 1 < 9;
    for (int o = 0; o < (7 + 2 - 3) / 2 + 1; o++)
      for (int k = 0; k < 3; k++) valid_w += o * 2 + k - 1 >= 0 && o * 2 + k - 1 < 7;
    ck_assert_int_eq(nf_stmt_flops(g, 0), 2 * 2 * 4 * 3 * valid_h * valid_w);
    for (int k = 0; k < 2; k++) nf_array_free(&in[k]);
  }
  {
    nf_array in[1] = {make_input(&r, &(ispec)NZ(1, 2, 5, 7))};
    nf_graph *g;
    ck_assert_int_eq(instantiate(nn(), "relu", 1, in, 0, NULL, NULL, ctx, &g, d), NF_OK);
    ck_assert_int_eq(nf_stmt_flops(g, 0), 35); /* one max per element */
    nf_array_free(&in[0]);
  }
  {
    nf_array in[1] = {make_input(&r, &(ispec)NZ(1, 2, 5, 7))};
    nf_graph *g;
    ck_assert_int_eq(instantiate(nn(), "sigmoid", 1, in, 0, NULL, NULL, ctx, &g, d),
                     NF_OK);
    ck_assert_int_eq(nf_stmt_flops(g, 0), 8 * 35); /* sigmoid weighs 8 (flops.c) */
    nf_array_free(&in[0]);
  }
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
}
END_TEST

/* ---- exact gradients where finite differences do not apply ---- */

/* Max pooling with ties: each window's gradient goes to exactly one
 * element, the first maximum in the window's (kh, kw) order. */
static void pool_ties(int kernel, int stride, int pad, int n_vals, int H, int W) {
  char label[96];
  snprintf(label, sizeof label, "max_pool2d ties k%d s%d p%d", kernel, stride, pad);
  rng r = {str_hash(label)};
  int N = 2, C = 3;
  nf_array in[1] = {make_input(&r, &(ispec){IN_TIES, n_vals, 0, 4, {N, C, H, W}})};
  const char *pn[] = {"kernel", "stride", "pad"};
  int64_t pv[] = {kernel, stride, pad};
  gstate s;
  gs_build(&s, nn(), label, "max_pool2d", 1, in, 3, pn, pv, NULL);
  int OH = (H + 2 * pad - kernel) / stride + 1, OW = (W + 2 * pad - kernel) / stride + 1;
  double *want = calloc((size_t)(N * C * H * W), sizeof(double));
  ck_assert_ptr_nonnull(want);
  const double *x = F(&in[0]), *dy = F(&s.seeds[0]);
  int n_tied = 0;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          int best = -1, n_max = 0;
          double bv = -INFINITY;
          for (int kh = 0; kh < kernel; kh++)
            for (int kw = 0; kw < kernel; kw++) {
              int h = oh * stride + kh - pad, w = ow * stride + kw - pad;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              int at = ((n * C + c) * H + h) * W + w;
              if (x[at] > bv) {
                bv = x[at];
                best = at;
                n_max = 1;
              } else if (x[at] == bv) {
                n_max++;
              }
            }
          n_tied += n_max > 1;
          want[best] += dy[((n * C + c) * OH + oh) * OW + ow];
        }
  ck_assert_msg(n_tied > 0, "%s: the input has no tied window", label);
  const double *got = F(&s.grads[0]);
  for (int e = 0; e < N * C * H * W; e++)
    ck_assert_msg(fabs(got[e] - want[e]) <= 1e-12 * (1 + fabs(want[e])),
                  "%s: grad_X[%d] (n %d c %d h %d w %d) is %.17g, want %.17g (%d of the "
                  "windows have ties; the gradient must go to the first maximum in "
                  "(kh, kw) order)",
                  label, e, e / (C * H * W), e / (H * W) % C, e / W % H, e % W, got[e],
                  want[e], n_tied);
  fprintf(stderr, "ok  %s: exact gradient, %d tied windows\n", label, n_tied);
  free(want);
  gs_free(&s);
  nf_array_free(&in[0]);
}

START_TEST(autodiff_max_pool_ties) {
  pool_ties(2, 2, 0, 3, 6, 7);
  pool_ties(3, 2, 1, 3, 7, 9);
  pool_ties(3, 1, 0, 2, 5, 6);
  pool_ties(2, 2, 1, 1, 5, 5); /* all equal */
}
END_TEST

/* Y(h) = I(2h): the gradient is dY at even positions below 2 * len(Y) and
 * exactly zero elsewhere. */
START_TEST(autodiff_pure_stride_exact) {
  rng r = {11};
  nf_array in[1] = {make_input(&r, &(ispec)NZ(1, 1, 11))};
  gstate s;
  gs_build(&s, cases(), "pure stride exact", "stride2", 1, in, 0, NULL, NULL, NULL);
  const double *gx = F(&s.grads[0]), *dy = F(&s.seeds[0]);
  for (int e = 0; e < 11; e++) {
    double want = (e % 2 == 0 && e / 2 < 5) ? dy[e / 2] : 0.0;
    ck_assert_msg(gx[e] == want, "grad_I[%d] is %.17g, want %.17g%s", e, gx[e], want,
                  e % 2 ? " (odd positions are never read: exactly zero)" : "");
  }
  gs_free(&s);
  nf_array_free(&in[0]);
}
END_TEST

/* Y(i) = stop_gradient(X(i)) * X(i): grad_X = dY * X, not 2 dY X. */
START_TEST(autodiff_stop_gradient) {
  rng r = {12};
  nf_array in[1] = {make_input(&r, &(ispec)NZ(1, 1, 7))};
  gstate s;
  gs_build(&s, cases(), "stop_gradient", "stopgrad", 1, in, 0, NULL, NULL, NULL);
  for (int e = 0; e < 7; e++) {
    double want = F(&s.seeds[0])[e] * F(&in[0])[e], got = F(&s.grads[0])[e];
    ck_assert_msg(fabs(got - want) <= 1e-14 * fabs(want),
                  "stop_gradient: grad_X[%d] is %.17g, want dY X = %.17g (2 dY X = %.17g "
                  "means stop_gradient was ignored)",
                  e, got, want, 2 * want);
  }
  gs_free(&s);
  nf_array_free(&in[0]);
  /* Y(i) = X(i) * stop_gradient(Z(i) Z(i)): grad_Z is zero, grad_X is
   * dY Z^2 */
  nf_array in2[2] = {make_input(&r, &(ispec)NZ(1, 1, 5)),
                     make_input(&r, &(ispec)NZ(1, 1, 5))};
  gs_build(&s, cases(), "stop_gradient path", "stopgrad_path", 2, in2, 0, NULL, NULL, NULL);
  for (int e = 0; e < 5; e++) {
    double z = F(&in2[1])[e], want = F(&s.seeds[0])[e] * z * z;
    ck_assert_msg(fabs(F(&s.grads[0])[e] - want) <= 1e-14 * fabs(want),
                  "grad_X[%d] is %.17g, want %.17g", e, F(&s.grads[0])[e], want);
    ck_assert_msg(F(&s.grads[1])[e] == 0.0, "grad_Z[%d] is %.17g behind stop_gradient", e,
                  F(&s.grads[1])[e]);
  }
  gs_free(&s);
  for (int k = 0; k < 2; k++) nf_array_free(&in2[k]);
}
END_TEST

/* ---- the report, the interface options, the errors ---- */

static int report_mentions(const nf_grad_report *rep, const char *a, const char *b) {
  for (int k = 0; k < rep->n_notes; k++)
    if (rep->notes[k] && strstr(rep->notes[k], a) && (!b || strstr(rep->notes[k], b)))
      return 1;
  return 0;
}

static void print_notes(const char *label, const nf_grad_report *rep) {
  for (int k = 0; k < rep->n_notes; k++)
    fprintf(stderr, "note %s: %s\n", label, rep->notes[k] ? rep->notes[k] : "(null)");
}

/* An input with no path to an output gets an all-zero gradient and a note. */
START_TEST(autodiff_no_path) {
  rng r = {13};
  nf_array in[2] = {make_input(&r, &(ispec)NZ(1, 1, 5)),
                    make_input(&r, &(ispec)NZ(1, 1, 5))};
  gstate s;
  gs_build(&s, cases(), "no path", "nopath", 2, in, 0, NULL, NULL, "Z X");
  print_notes("no path", &s.rep);
  for (int e = 0; e < 5; e++) {
    ck_assert_msg(F(&s.grads[0])[e] == 0.0, "grad_Z[%d] is %g, want 0", e,
                  F(&s.grads[0])[e]);
    ck_assert_msg(F(&s.grads[1])[e] == 2.0 * F(&s.seeds[0])[e], "grad_X[%d] is %g, want %g",
                  e, F(&s.grads[1])[e], 2.0 * F(&s.seeds[0])[e]);
  }
  ck_assert_msg(report_mentions(&s.rep, "Z", "zero"),
                "no note says that the gradient of Z is zero (%d notes)", s.rep.n_notes);
  ck_assert_msg(!report_mentions(&s.rep, "X", "zero"), "a note says X's gradient is zero");
  gs_free(&s);
  for (int k = 0; k < 2; k++) nf_array_free(&in[k]);
}
END_TEST

/* Only the gradients asked are built, in the order asked. */
START_TEST(autodiff_only_wrt) {
  rng r = {14};
  nf_array in[3] = {make_input(&r, &(ispec)NZ(1, 2, 5, 7)),
                    make_input(&r, &(ispec)NZ(1, 2, 7, 3)),
                    make_input(&r, &(ispec)NZ(1, 2, 5, 3))};
  gstate s;
  gs_build(&s, workloads(), "matmul_loss wrt B", "matmul_loss", 3, in, 0, NULL, NULL, "B");
  ck_assert_int_eq(s.gg->n_outputs, 1);
  for (int k = 0; k < s.rep.n_items; k++)
    ck_assert_msg(!s.rep.items[k].wrt || strcmp(s.rep.items[k].wrt, "A") != 0,
                  "item %d contributes to A's adjoint, which was not asked", k);
  gs_check_fd(&s, 1);
  gs_free(&s);
  gs_build(&s, workloads(), "matmul_loss wrt G, A", "matmul_loss", 3, in, 0, NULL, NULL,
           "G A");
  ck_assert_int_eq(s.gg->n_outputs, 2);
  gs_check_fd(&s, 1);
  gs_free(&s);
  for (int k = 0; k < 3; k++) nf_array_free(&in[k]);
}
END_TEST

/* keep_outputs returns the forward outputs first, equal to the forward
 * graph's; g may live in another context than the gradient. */
START_TEST(autodiff_keep_outputs_other_ctx) {
  rng r = {15};
  nf_array in[1] = {make_input(&r, &(ispec)NZ(1, 3, 3, 4, 7))};
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *c1 = nf_ir_ctx_new(), *c2 = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  const char *pn[] = {"at"};
  int64_t pv[] = {3};
  ck_assert_int_eq(instantiate(nn(), "split", 1, in, 1, pn, pv, c1, &g, d), NF_OK);
  const char *wrt[] = {"X"};
  nf_grad_opts o = {.n_wrt = 1, .wrt = wrt, .keep_outputs = 1};
  nf_buf err = NF_BUF_INIT;
  int rc = nf_grad_graph(g, &o, c2, &gg, NULL, &err);
  ck_assert_msg(rc == NF_OK, "nf_grad: %s: %s", nf_status_name(rc), nf_buf_str(&err));
  nf_buf_free(&err);
  ck_assert_ptr_eq(gg->ctx, c2);
  gstate s = {.label = "split keep_outputs", .g = g, .gg = gg, .n_wrt = 1,
              .wrt = {"X"}, .wrt_in = {0}};
  check_interface(&s, 1);
  nf_array all[3] = {in[0], rand_like(&r, &g->tensors[g->outputs[0]]),
                     rand_like(&r, &g->tensors[g->outputs[1]])};
  nf_array fo[2], go[3];
  ck_assert_int_eq(nf_interp_run(g, in, NF_INTERP_F64, fo, &err), NF_OK);
  rc = nf_interp_run(gg, all, NF_INTERP_F64, go, &err);
  ck_assert_msg(rc == NF_OK, "run: %s", nf_buf_str(&err));
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(go[k].numel, fo[k].numel);
    for (int64_t e = 0; e < fo[k].numel; e++)
      ck_assert_msg(F(&go[k])[e] == F(&fo[k])[e], "kept output %d [%lld] is %g, want %g", k,
                    (long long)e, F(&go[k])[e], F(&fo[k])[e]);
  }
  /* grad_X is dY1 then dY2 along the last axis */
  for (int64_t row = 0; row < 12; row++)
    for (int j = 0; j < 7; j++) {
      double want = j < 3 ? F(&all[1])[row * 3 + j] : F(&all[2])[row * 4 + j - 3];
      ck_assert_msg(F(&go[2])[row * 7 + j] == want, "grad_X[%lld, %d] is %g, want %g",
                    (long long)row, j, F(&go[2])[row * 7 + j], want);
    }
  for (int k = 0; k < 2; k++) nf_array_free(&fo[k]);
  for (int k = 0; k < 3; k++) nf_array_free(&go[k]);
  nf_array_free(&all[1]);
  nf_array_free(&all[2]);
  nf_array_free(&in[0]);
  nf_buf_free(&err);
  nf_ir_ctx_free(c2);
  nf_ir_ctx_free(c1);
  nf_diag_free(d);
}
END_TEST

/* nf_grad on def with wrt must fail with one of the statuses and a
 * message containing each needle. */
static void expect_grad_error(nf_module *m, const char *def, int n_in, nf_array *in,
                              const char *wrt, int st1, int st2, const char *needle1,
                              const char *needle2) {
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  int rc = instantiate(m, def, n_in, in, 0, NULL, NULL, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: %s", def, nf_diag_text(d));
  const char *w[] = {wrt};
  nf_grad_opts o = {.n_wrt = 1, .wrt = w};
  nf_buf err = NF_BUF_INIT;
  nf_grad_report rep;
  memset(&rep, 0, sizeof rep);
  rc = nf_grad_graph(g, &o, ctx, &gg, &rep, &err);
  fprintf(stderr, "err %s wrt %s: %s: %s\n", def, wrt, nf_status_name(rc),
          nf_buf_str(&err));
  ck_assert_msg(rc == st1 || rc == st2, "%s: gradient wrt %s returned %s, want %s%s%s", def,
                wrt, nf_status_name(rc), nf_status_name(st1), st2 != st1 ? " or " : "",
                st2 != st1 ? nf_status_name(st2) : "");
  ck_assert_msg(err.len > 0, "%s: error without a message", def);
  ck_assert_msg(!needle1 || strstr(nf_buf_str(&err), needle1),
                "%s: the message does not mention '%s': %s", def, needle1, nf_buf_str(&err));
  ck_assert_msg(!needle2 || strstr(nf_buf_str(&err), needle2),
                "%s: the message does not mention '%s': %s", def, needle2, nf_buf_str(&err));
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
}

START_TEST(autodiff_errors) {
  rng r = {16};
  nf_array ce[2] = {make_input(&r, &(ispec)NZ(1, 2, 5, 3)),
                    make_input(&r, &(ispec)IDX(3, 1, 5))};
  /* an integer input */
  expect_grad_error(nn(), "cross_entropy", 2, ce, "labels", NF_EINVAL, NF_EINVAL, "labels",
                    NULL);
  /* an unknown name */
  expect_grad_error(nn(), "cross_entropy", 2, ce, "weights", NF_EINVAL, NF_EINVAL, "weights",
                    NULL);
  /* an output is not an input */
  expect_grad_error(nn(), "cross_entropy", 2, ce, "L", NF_EINVAL, NF_EINVAL, NULL, NULL);
  for (int k = 0; k < 2; k++) nf_array_free(&ce[k]);
  nf_array x[1] = {make_input(&r, &(ispec)NZ(3, 1, 5))};
  /* through a float-to-integer cast used in a value: names the statement */
  expect_grad_error(cases(), "cast_value", 1, x, "X", NF_EINVAL, NF_EUNSUPPORTED, "Rounded",
                    NULL);
  /* the same with the conversion and the arithmetic in two statements */
  expect_grad_error(cases(), "cast_local", 1, x, "X", NF_EINVAL, NF_EUNSUPPORTED, "Trunc",
                    NULL);
  /* through `%` of a differentiated value */
  expect_grad_error(cases(), "float_mod", 1, x, "X", NF_EINVAL, NF_EUNSUPPORTED, "Wrapped",
                    NULL);
  nf_array_free(&x[0]);
}
END_TEST

/* An argument list nf_grad must refuse without crashing. */
START_TEST(autodiff_bad_options) {
  rng r = {17};
  nf_array in[2] = {make_input(&r, &(ispec)NZ(1, 2, 5, 7)),
                    make_input(&r, &(ispec)NZ(1, 2, 7, 3))};
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  ck_assert_int_eq(instantiate(nn(), "matmul", 2, in, 0, NULL, NULL, ctx, &g, d), NF_OK);
  nf_buf err = NF_BUF_INIT;
  const char *twice[] = {"A", "A"};
  nf_grad_opts o = {.n_wrt = 2, .wrt = twice};
  int rc = nf_grad_graph(g, &o, ctx, &gg, NULL, &err);
  fprintf(stderr, "err matmul wrt A,A: %s: %s\n", nf_status_name(rc), nf_buf_str(&err));
  if (rc == NF_OK) { /* either refused or two equal gradients */
    ck_assert_int_eq(gg->n_outputs, 2);
  } else {
    ck_assert_int_eq(rc, NF_EINVAL);
    ck_assert_msg(err.len > 0, "refused without a message");
  }
  nf_buf_reset(&err);
  nf_grad_opts none = {.n_wrt = 0, .wrt = NULL};
  rc = nf_grad_graph(g, &none, ctx, &gg, NULL, &err);
  fprintf(stderr, "err matmul wrt nothing: %s: %s\n", nf_status_name(rc), nf_buf_str(&err));
  if (rc == NF_OK)
    ck_assert_int_eq(gg->n_outputs, 0);
  else
    ck_assert_msg(err.len > 0, "refused without a message");
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  for (int k = 0; k < 2; k++) nf_array_free(&in[k]);
}
END_TEST

/* The embedding gradient is a scatter (no inversion through idx), with a
 * reason, and still right with repeated and unused rows. */
START_TEST(autodiff_embedding_scatter) {
  rng r = {18};
  nf_array in[2] = {make_input(&r, &(ispec)NZ(1, 2, 7, 3)),
                    make_input(&r, &(ispec)IDX(7, 2, 3, 4))};
  I(&in[1])[0] = 2; /* row 2 three times, row 6 never */
  I(&in[1])[5] = 2;
  I(&in[1])[11] = 2;
  for (int e = 0; e < 12; e++)
    if (I(&in[1])[e] == 6) I(&in[1])[e] = 0;
  gstate s;
  gs_build(&s, nn(), "embedding scatter", "embedding", 2, in, 0, NULL, NULL, "table");
  int n_scatter = 0;
  for (int k = 0; k < s.rep.n_items; k++)
    if (s.rep.items[k].scatter && s.rep.items[k].wrt &&
        strcmp(s.rep.items[k].wrt, "table") == 0) {
      n_scatter++;
      fprintf(stderr, "ok  embedding scatter: %s\n", s.rep.items[k].why);
    }
  ck_assert_msg(n_scatter >= 1, "the embedding gradient is not reported as a scatter");
  nf_buf bad = NF_BUF_INIT;
  flop_table(&s, &bad);
  nf_buf_free(&bad);
  /* exact: grad_table[v, d] = sum of dY[b, d] over b with idx[b] == v */
  for (int v = 0; v < 7; v++)
    for (int dd = 0; dd < 3; dd++) {
      double want = 0;
      for (int b = 0; b < 12; b++)
        if (I(&in[1])[b] == v) want += F(&s.seeds[0])[b * 3 + dd];
      ck_assert_msg(fabs(F(&s.grads[0])[v * 3 + dd] - want) <= 1e-14 * (1 + fabs(want)),
                    "grad_table[%d, %d] is %.17g, want %.17g", v, dd,
                    F(&s.grads[0])[v * 3 + dd], want);
    }
  gs_free(&s);
  for (int k = 0; k < 2; k++) nf_array_free(&in[k]);
}
END_TEST

/* Gradients are deterministic: building twice gives the same graph hash. */
START_TEST(autodiff_deterministic) {
  rng r = {19};
  nf_array in[3] = {make_input(&r, &(ispec)NZ(1, 3, 2, 3, 4)),
                    make_input(&r, &(ispec)NZ(1, 1, 4)),
                    make_input(&r, &(ispec)NZ(1, 1, 4))};
  uint8_t h[2][32];
  for (int t = 0; t < 2; t++) {
    gstate s;
    gs_build(&s, nn(), "layer_norm determinism", "layer_norm", 3, in, 0, NULL, NULL, NULL);
    ck_assert_int_eq(nf_graph_hash(s.gg, h[t]), NF_OK);
    gs_free(&s);
  }
  ck_assert_msg(memcmp(h[0], h[1], 32) == 0, "two builds of one gradient differ");
  for (int k = 0; k < 3; k++) nf_array_free(&in[k]);
}
END_TEST

static Suite *autodiff_suite(void) {
  Suite *s = suite_create("autodiff");
  TCase *tc = tcase_create("autodiff");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, autodiff_library_coverage);
  tcase_add_loop_test(tc, autodiff_library, 0, N_LIB);
  tcase_add_loop_test(tc, autodiff_workloads, 0, N_WORKLOADS);
  tcase_add_loop_test(tc, autodiff_index_forms, 0, N_INDEX);
  tcase_add_test(tc, autodiff_max_pool_ties);
  tcase_add_test(tc, autodiff_pure_stride_exact);
  tcase_add_test(tc, autodiff_stop_gradient);
  tcase_add_test(tc, autodiff_no_path);
  tcase_add_test(tc, autodiff_only_wrt);
  tcase_add_test(tc, autodiff_keep_outputs_other_ctx);
  tcase_add_test(tc, autodiff_errors);
  tcase_add_test(tc, autodiff_bad_options);
  tcase_add_test(tc, autodiff_embedding_scatter);
  tcase_add_test(tc, autodiff_deterministic);
  suite_add_tcase(s, tc);

  /* FLOPs: nf_stmt_flops, and the 2x bound for matmul and conv2d */
  TCase *fl = tcase_create("flops");
  tcase_set_timeout(fl, 120);
  tcase_add_test(fl, autodiff_stmt_flops);
  tcase_add_loop_test(fl, autodiff_flops_core, 0, N_FLOP_CORE);
  suite_add_tcase(s, fl);

  /* the 2x bound for every library op, with the table in the log */
  TCase *fll = tcase_create("flops_library");
  tcase_set_timeout(fll, 120);
  tcase_add_loop_test(fll, autodiff_flops_library, 0, N_LIB);
  suite_add_tcase(s, fll);

  /* the workloads' tables (printed, not asserted) */
  TCase *flw = tcase_create("flops_workloads");
  tcase_set_timeout(flw, 120);
  tcase_add_loop_test(flw, autodiff_flops_workloads, 0, N_WORKLOADS);
  suite_add_tcase(s, flw);

  find_known();
  if (n_known > 0) {
    TCase *kf = tcase_create("known_failures");
    tcase_set_timeout(kf, 120);
    tcase_add_loop_test(kf, autodiff_known_failures, 0, n_known);
    suite_add_tcase(s, kf);
  }
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(autodiff_suite());
  srunner_run_all(sr, CK_NORMAL);
  int n_failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return n_failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
