/* test_nn.c - the standard library (lib/nn.nf) against independent C loops.
 *
 * Every def of lib/nn.nf is instantiated with odd sizes, fed seeded random
 * inputs (never zeros), evaluated by the reference interpreter in f64 and
 * in f32 and compared with a straightforward C implementation of the
 * PyTorch operator computed in double (f64: per element, relative 1e-9;
 * f32: relative L2 error 1e-5).  The C loops are written from the
 * operators' definitions, never from the .nf text.  Float constants of an
 * f32 def are f32 values (weak literals, docs/language.md), as in an f32
 * PyTorch kernel, so the references round them with C32().
 *
 * Invalid uses (failing requires, wrong ranks, indices out of range) must
 * give errors that name the problem. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_npy.h"

#define C32(x) ((double)(float)(x))
#define F64_RTOL 1e-9
#define F32_RTOL 1e-5

/* ---- random inputs ---- */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform in scale * ([-1, -0.1] u [0.1, 1]): never zero. */
static double rng_nz(rng *r, double scale) {
  double v = 0.1 + 0.9 * rng_unit(r);
  return (rng_next(r) & 1) ? scale * v : -scale * v;
}

/* ---- arrays ---- */

static nf_array arr_vnew(nf_dtype t, int rank, va_list ap) {
  nf_array a;
  int64_t shape[NF_MAX_RANK];
  for (int d = 0; d < rank; d++) shape[d] = va_arg(ap, int);
  ck_assert_int_eq(nf_array_alloc(&a, t, rank, shape), NF_OK);
  return a;
}

/* An f32 array of the given dims filled by rng_nz(scale). */
static nf_array rand_f32(rng *r, double scale, int rank, ...) {
  va_list ap;
  va_start(ap, rank);
  nf_array a = arr_vnew(NF_F32, rank, ap);
  va_end(ap);
  for (int64_t i = 0; i < a.numel; i++) ((float *)a.data)[i] = (float)rng_nz(r, scale);
  return a;
}

/* An f32 array uniform in [lo, hi). */
static nf_array unif_f32(rng *r, double lo, double hi, int rank, ...) {
  va_list ap;
  va_start(ap, rank);
  nf_array a = arr_vnew(NF_F32, rank, ap);
  va_end(ap);
  for (int64_t i = 0; i < a.numel; i++)
    ((float *)a.data)[i] = (float)(lo + (hi - lo) * rng_unit(r));
  return a;
}

/* An i64 array of random values in [0, hi). */
static nf_array rand_idx(rng *r, int64_t hi, int rank, ...) {
  va_list ap;
  va_start(ap, rank);
  nf_array a = arr_vnew(NF_I64, rank, ap);
  va_end(ap);
  for (int64_t i = 0; i < a.numel; i++)
    ((int64_t *)a.data)[i] = (int64_t)(rng_next(r) % (uint64_t)hi);
  return a;
}

static double get(const nf_array *a, int64_t i) {
  switch (a->dtype) {
  case NF_F32: return ((const float *)a->data)[i];
  case NF_F64: return ((const double *)a->data)[i];
  case NF_I64: return (double)((const int64_t *)a->data)[i];
  case NF_I32: return ((const int32_t *)a->data)[i];
  default: ck_abort_msg("unexpected dtype %d", (int)a->dtype);
  }
  return 0;
}

static int64_t geti(const nf_array *a, int64_t i) {
  ck_assert_int_eq(a->dtype, NF_I64);
  return ((const int64_t *)a->data)[i];
}

/* A reference result: shape plus doubles. */
typedef struct ref {
  int rank;
  int64_t shape[NF_MAX_RANK];
  int64_t numel;
  double *v;
} ref;

static ref ref_new(int rank, ...) {
  ref o;
  va_list ap;
  memset(&o, 0, sizeof o);
  o.rank = rank;
  o.numel = 1;
  va_start(ap, rank);
  for (int d = 0; d < rank; d++) {
    o.shape[d] = va_arg(ap, int);
    o.numel *= o.shape[d];
  }
  va_end(ap);
  o.v = calloc((size_t)(o.numel ? o.numel : 1), sizeof(double));
  ck_assert_ptr_nonnull(o.v);
  return o;
}

static ref ref_shape(int rank, const int64_t *shape) {
  ref o;
  memset(&o, 0, sizeof o);
  o.rank = rank;
  o.numel = 1;
  for (int d = 0; d < rank; d++) {
    o.shape[d] = shape[d];
    o.numel *= shape[d];
  }
  o.v = calloc((size_t)(o.numel ? o.numel : 1), sizeof(double));
  ck_assert_ptr_nonnull(o.v);
  return o;
}

/* ---- module and evaluation ---- */

/* lib/nn.nf, with tests/data/builtins.nf (the built-in shape operators
 * wrapped as the defs of fixed rank they replaced) when shape_ops. */
static nf_module *nn_load_file(nf_diag *d, int shape_ops) {
  const char *lib = getenv("NEOFLOW_LIB"), *data = getenv("NF_TEST_DATA");
  char path[4096];
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  ck_assert_msg(data != NULL || !shape_ops, "NF_TEST_DATA is not set");
  if (shape_ops)
    snprintf(path, sizeof path, "%s/builtins.nf", data);
  else
    snprintf(path, sizeof path, "%s/nn.nf", lib);
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s\n%s", path, nf_status_name(rc),
                nf_diag_text(d));
  return m;
}

static nf_module *nn_load(nf_diag *d) { return nn_load_file(d, 1); }

/* Instantiates def with the inputs' shapes (by position) and the given
 * parameters; returns the status, the graph in *g and messages in d. */
static int nn_inst(nf_module *m, const char *def, int n_in, const nf_array *in,
                   int n_par, const char *const *pn, const int64_t *pv,
                   nf_ir_ctx *ctx, nf_graph **g, nf_diag *d) {
  nf_arg_shape shapes[8];
  ck_assert_int_le(n_in, 8);
  for (int k = 0; k < n_in; k++) {
    memset(&shapes[k], 0, sizeof shapes[k]);
    shapes[k].name = NULL;
    shapes[k].rank = in[k].rank;
    for (int a = 0; a < in[k].rank; a++) shapes[k].dims[a] = in[k].shape[a];
  }
  nf_inst_opts o = {.n_shapes = n_in, .shapes = shapes, .n_params = n_par,
                    .param_names = pn, .param_values = pv};
  *g = NULL;
  return nf_module_instantiate(m, def, &o, ctx, g, d);
}

/* Compares got with want.  f64: |g - w| <= 1e-9 |w| + 1e-12 (1 + max|w|)
 * per element; f32: ||g - w|| <= 1e-5 ||w|| (plus a tiny floor for an
 * all-zero reference).  Returns 1 when close, else 0 with a message. */
static int compare(const nf_array *got, const ref *want, nf_precision p,
                   char *msg, size_t n_msg) {
  if (got->rank != want->rank) {
    snprintf(msg, n_msg, "rank %d, want %d", got->rank, want->rank);
    return 0;
  }
  for (int d = 0; d < got->rank; d++)
    if (got->shape[d] != want->shape[d]) {
      snprintf(msg, n_msg, "dim %d is %lld, want %lld", d, (long long)got->shape[d],
               (long long)want->shape[d]);
      return 0;
    }
  nf_dtype want_t = p == NF_INTERP_F64 ? NF_F64 : NF_F32;
  if (got->dtype != want_t) {
    snprintf(msg, n_msg, "dtype %d, want %d", (int)got->dtype, (int)want_t);
    return 0;
  }
  double maxabs = 0, num = 0, den = 0;
  for (int64_t i = 0; i < want->numel; i++) maxabs = fmax(maxabs, fabs(want->v[i]));
  for (int64_t i = 0; i < want->numel; i++) {
    double g = get(got, i), w = want->v[i];
    if (!isfinite(g) && !(g == w)) {
      snprintf(msg, n_msg, "element %lld is %.17g, want %.17g", (long long)i, g, w);
      return 0;
    }
    if (p == NF_INTERP_F64 && fabs(g - w) > F64_RTOL * fabs(w) + 1e-12 * (1 + maxabs)) {
      snprintf(msg, n_msg, "f64 element %lld is %.17g, want %.17g (diff %.3g)",
               (long long)i, g, w, g - w);
      return 0;
    }
    if (isfinite(w)) {
      num += (g - w) * (g - w);
      den += w * w;
    }
  }
  if (p == NF_INTERP_F32 && sqrt(num) > F32_RTOL * sqrt(den) + 1e-30) {
    snprintf(msg, n_msg, "f32 relative L2 error %.3g", sqrt(num) / sqrt(den));
    return 0;
  }
  return 1;
}

/* Runs def on in with params in both precisions and checks every output
 * against want.  Frees in and want. */
static void check_def(const char *def, int n_in, nf_array *in, int n_par,
                      const char *const *pn, const int64_t *pv, int n_out,
                      ref *want) {
  nf_diag *d = nf_diag_new();
  ck_assert_ptr_nonnull(d);
  nf_module *m = nn_load(d);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(ctx);
  nf_graph *g = NULL;
  int rc = nn_inst(m, def, n_in, in, n_par, pn, pv, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: instantiate: %s\n%s", def, nf_status_name(rc),
                nf_diag_text(d));
  ck_assert_int_eq((int)g->n_inputs, n_in);
  ck_assert_int_eq((int)g->n_outputs, n_out);
  for (int k = 0; k < n_out; k++) {
    const nf_tensor *t = &g->tensors[g->outputs[k]];
    ck_assert_msg(t->rank == want[k].rank, "%s: output %d has rank %d, want %d", def,
                  k, t->rank, want[k].rank);
    for (int a = 0; a < t->rank; a++)
      ck_assert_msg(t->shape[a] == want[k].shape[a],
                    "%s: output %d dim %d is %lld, want %lld", def, k, a,
                    (long long)t->shape[a], (long long)want[k].shape[a]);
  }
  for (int pi = 0; pi < 2; pi++) {
    nf_precision p = pi == 0 ? NF_INTERP_F64 : NF_INTERP_F32;
    nf_array out[8];
    nf_buf err = NF_BUF_INIT;
    memset(out, 0, sizeof out);
    rc = nf_interp_run(g, in, p, out, &err);
    ck_assert_msg(rc == NF_OK, "%s: run (%s): %s: %s", def, pi == 0 ? "f64" : "f32",
                  nf_status_name(rc), nf_buf_str(&err));
    for (int k = 0; k < n_out; k++) {
      char msg[256];
      ck_assert_msg(compare(&out[k], &want[k], p, msg, sizeof msg),
                    "%s: output %d (%s): %s", def, k, pi == 0 ? "f64" : "f32", msg);
      nf_array_free(&out[k]);
    }
    nf_buf_free(&err);
  }
  for (int k = 0; k < n_in; k++) nf_array_free(&in[k]);
  for (int k = 0; k < n_out; k++) free(want[k].v);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  nf_diag_free(d);
}

/* Expects instantiating def to fail with a message containing needle
 * (NULL: any message).  Frees in. */
static void check_inst_error(const char *def, int n_in, nf_array *in, int n_par,
                             const char *const *pn, const int64_t *pv,
                             const char *needle) {
  nf_diag *d = nf_diag_new();
  ck_assert_ptr_nonnull(d);
  nf_module *m = nn_load(d);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(ctx);
  nf_graph *g = NULL;
  int rc = nn_inst(m, def, n_in, in, n_par, pn, pv, ctx, &g, d);
  ck_assert_msg(rc != NF_OK, "%s: instantiation succeeded but should fail (%s)", def,
                needle ? needle : "any error");
  ck_assert_msg(nf_diag_count(d) > 0, "%s: failed with %s but no message", def,
                nf_status_name(rc));
  if (needle)
    ck_assert_msg(strstr(nf_diag_text(d), needle) != NULL,
                  "%s: the message does not mention '%s':\n%s", def, needle,
                  nf_diag_text(d));
  for (int k = 0; k < n_in; k++) nf_array_free(&in[k]);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  nf_diag_free(d);
}

/* Expects def to instantiate but fail at run time (both precisions). */
static void check_run_error(const char *def, int n_in, nf_array *in) {
  nf_diag *d = nf_diag_new();
  ck_assert_ptr_nonnull(d);
  nf_module *m = nn_load(d);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  int rc = nn_inst(m, def, n_in, in, 0, NULL, NULL, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: instantiate: %s\n%s", def, nf_status_name(rc),
                nf_diag_text(d));
  for (int pi = 0; pi < 2; pi++) {
    nf_array out[8];
    nf_buf err = NF_BUF_INIT;
    memset(out, 0, sizeof out);
    rc = nf_interp_run(g, in, pi == 0 ? NF_INTERP_F64 : NF_INTERP_F32, out, &err);
    ck_assert_msg(rc != NF_OK, "%s: ran although an index is out of range", def);
    ck_assert_msg(err.len > 0, "%s: run failed (%s) without a message", def,
                  nf_status_name(rc));
    nf_buf_free(&err);
  }
  for (int k = 0; k < n_in; k++) nf_array_free(&in[k]);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  nf_diag_free(d);
}

/* ---- the library's interface ---- */

START_TEST(nn_interface) {
  static const struct {
    const char *def, *inputs, *params, *outputs;
  } want[] = {
      {"matmul", "A B", "", "C"},
      {"batch_matmul", "A B", "", "C"},
      {"linear", "X W b", "", "Y"},
      {"conv2d", "I W", "stride pad dilation groups", "O"},
      {"max_pool2d", "X", "kernel stride pad", "Y"},
      {"avg_pool2d", "X", "kernel stride pad", "Y"},
      {"relu", "X", "", "Y"},
      {"relu6", "X", "", "Y"},
      {"elu", "X", "", "Y"},
      {"gelu", "X", "", "Y"},
      {"sigmoid", "X", "", "Y"},
      {"tanh", "X", "", "Y"},
      {"softplus", "X", "", "Y"},
      {"silu", "X", "", "Y"},
      {"expm1", "X", "", "Y"},
      {"log1p", "X", "", "Y"},
      {"linear_nobias", "X W", "", "Y"},
      {"softmax", "X", "", "Y"},
      {"log_softmax", "X", "", "Y"},
      {"cross_entropy", "logits labels", "", "L"},
      {"margin_loss", "lengths targets", "", "L"},
      {"mse", "X Y", "", "L"},
      {"layer_norm", "X gamma beta", "", "Y"},
      {"batch_norm", "X gamma beta", "", "Y"},
      {"concat", "A C", "", "Y"},
      {"split", "X", "at", "Y1 Y2"},
      {"channel_shuffle", "X", "groups", "Y"},
      {"add", "X Y", "", "Z"},
      {"sub", "X Y", "", "Z"},
      {"mul", "X Y", "", "Z"},
      {"div", "X Y", "", "Z"},
      {"badd", "X Y", "", "Z"},
      {"bsub", "X Y", "", "Z"},
      {"bmul", "X Y", "", "Z"},
      {"bdiv", "X Y", "", "Z"},
      {"squash", "S", "", "V"},
      {"embedding", "table idx", "", "Y"},
  };
  nf_diag *d = nf_diag_new();
  nf_module *m = nn_load_file(d, 0);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const char *names[16];
    char got[256];
    ck_assert_msg(nf_module_has_def(m, want[i].def), "nn.nf lacks %s", want[i].def);
    int n = nf_module_def_inputs(m, want[i].def, names, 16);
    got[0] = 0;
    for (int k = 0; k < n; k++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "",
               names[k]);
    ck_assert_msg(strcmp(got, want[i].inputs) == 0, "%s inputs are '%s', want '%s'",
                  want[i].def, got, want[i].inputs);
    n = nf_module_def_params(m, want[i].def, names, 16);
    got[0] = 0;
    for (int k = 0; k < n; k++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "",
               names[k]);
    ck_assert_msg(strcmp(got, want[i].params) == 0, "%s params are '%s', want '%s'",
                  want[i].def, got, want[i].params);
    /* outputs, in order, from the signature `...) -> (Y1: f32[..], Y2: ..)` */
    nf_buf sig = NF_BUF_INIT;
    ck_assert_int_eq(nf_module_def_signature(m, want[i].def, &sig), NF_OK);
    const char *at = strstr(nf_buf_str(&sig), "->");
    ck_assert_msg(at != NULL, "%s: signature '%s'", want[i].def, nf_buf_str(&sig));
    char outs[64];
    snprintf(outs, sizeof outs, "%s", want[i].outputs);
    for (char *tok = outs, *sp; tok && *tok; tok = sp ? sp + 1 : NULL) {
      char pat[80];
      if ((sp = strchr(tok, ' '))) *sp = 0;
      snprintf(pat, sizeof pat, "%s: ", tok);
      const char *hit = strstr(at, pat);
      ck_assert_msg(hit && (hit[-1] == '(' || hit[-1] == ' '),
                    "%s: output %s missing or out of order in '%s'", want[i].def, tok,
                    nf_buf_str(&sig));
      at = hit + strlen(pat);
    }
    nf_buf_free(&sig);
  }
  nf_module_free(m);
  nf_diag_free(d);
}
END_TEST

/* The comparison itself must catch small errors (a test that cannot fail
 * is a defect). */
START_TEST(nn_compare_detects_errors) {
  nf_array a;
  int64_t shape[1] = {5};
  char msg[256];
  ck_assert_int_eq(nf_array_alloc(&a, NF_F64, 1, shape), NF_OK);
  ref w = ref_new(1, 5);
  for (int i = 0; i < 5; i++) w.v[i] = ((double *)a.data)[i] = 1.0 + i;
  ck_assert(compare(&a, &w, NF_INTERP_F64, msg, sizeof msg));
  ((double *)a.data)[3] *= 1 + 1e-7;
  ck_assert(!compare(&a, &w, NF_INTERP_F64, msg, sizeof msg));
  nf_array_free(&a);
  ck_assert_int_eq(nf_array_alloc(&a, NF_F32, 1, shape), NF_OK);
  for (int i = 0; i < 5; i++) ((float *)a.data)[i] = (float)w.v[i];
  ck_assert(compare(&a, &w, NF_INTERP_F32, msg, sizeof msg));
  ((float *)a.data)[2] += 1e-3f;
  ck_assert(!compare(&a, &w, NF_INTERP_F32, msg, sizeof msg));
  ck_assert(!compare(&a, &w, NF_INTERP_F64, msg, sizeof msg)); /* wrong dtype */
  nf_array_free(&a);
  free(w.v);
}
END_TEST

/* ---- products ---- */

static ref ref_matmul(const nf_array *A, const nf_array *B, int64_t batch, int64_t M,
                      int64_t K, int64_t N, int out_rank, const int64_t *out_shape) {
  ref o = ref_shape(out_rank, out_shape);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += get(A, (b * M + i) * K + k) * get(B, (b * K + k) * N + j);
        o.v[(b * M + i) * N + j] = s;
      }
  return o;
}

START_TEST(nn_matmul) {
  rng r = {1};
  nf_array in[2] = {rand_f32(&r, 1, 2, 7, 13), rand_f32(&r, 1, 2, 13, 5)};
  int64_t os[2] = {7, 5};
  ref o = ref_matmul(&in[0], &in[1], 1, 7, 13, 5, 2, os);
  check_def("matmul", 2, in, 0, NULL, NULL, 1, &o);
}
END_TEST

START_TEST(nn_batch_matmul) {
  rng r = {2};
  nf_array in[2] = {rand_f32(&r, 1, 4, 2, 3, 7, 13), rand_f32(&r, 1, 4, 2, 3, 13, 5)};
  int64_t os[4] = {2, 3, 7, 5};
  ref o = ref_matmul(&in[0], &in[1], 6, 7, 13, 5, 4, os);
  check_def("batch_matmul", 2, in, 0, NULL, NULL, 1, &o);
  /* one batch dim, and none */
  nf_array in1[2] = {rand_f32(&r, 1, 3, 3, 4, 9), rand_f32(&r, 1, 3, 3, 9, 2)};
  int64_t os1[3] = {3, 4, 2};
  ref o1 = ref_matmul(&in1[0], &in1[1], 3, 4, 9, 2, 3, os1);
  check_def("batch_matmul", 2, in1, 0, NULL, NULL, 1, &o1);
  nf_array in0[2] = {rand_f32(&r, 1, 2, 5, 3), rand_f32(&r, 1, 2, 3, 7)};
  int64_t os0[2] = {5, 7};
  ref o0 = ref_matmul(&in0[0], &in0[1], 1, 5, 3, 7, 2, os0);
  check_def("batch_matmul", 2, in0, 0, NULL, NULL, 1, &o0);
}
END_TEST

static ref ref_linear(const nf_array *X, const nf_array *W, const nf_array *b) {
  int64_t I = W->shape[1], O = W->shape[0], rows = X->numel / I;
  int64_t os[NF_MAX_RANK];
  for (int d = 0; d < X->rank - 1; d++) os[d] = X->shape[d];
  os[X->rank - 1] = O;
  ref o = ref_shape(X->rank, os);
  for (int64_t n = 0; n < rows; n++)
    for (int64_t j = 0; j < O; j++) {
      double s = 0;
      for (int64_t i = 0; i < I; i++) s += get(X, n * I + i) * get(W, j * I + i);
      o.v[n * O + j] = s + get(b, j);
    }
  return o;
}

START_TEST(nn_linear) {
  rng r = {3};
  nf_array in[3] = {rand_f32(&r, 1, 3, 3, 4, 13), rand_f32(&r, 1, 2, 5, 13),
                    rand_f32(&r, 1, 1, 5)};
  ref o = ref_linear(&in[0], &in[1], &in[2]);
  check_def("linear", 3, in, 0, NULL, NULL, 1, &o);
  nf_array in1[3] = {rand_f32(&r, 1, 1, 11), rand_f32(&r, 1, 2, 7, 11),
                     rand_f32(&r, 1, 1, 7)};
  ref o1 = ref_linear(&in1[0], &in1[1], &in1[2]);
  check_def("linear", 3, in1, 0, NULL, NULL, 1, &o1);
}
END_TEST

/* ---- convolution and pooling ---- */

static ref ref_conv2d(const nf_array *I, const nf_array *W, int stride, int pad,
                      int dil, int groups) {
  int64_t N = I->shape[0], C = I->shape[1], H = I->shape[2], Wd = I->shape[3];
  int64_t K = W->shape[0], CG = W->shape[1], R = W->shape[2], S = W->shape[3];
  int64_t OH = (H + 2 * pad - dil * (R - 1) - 1) / stride + 1;
  int64_t OW = (Wd + 2 * pad - dil * (S - 1) - 1) / stride + 1;
  int64_t kpg = K / groups;
  ck_assert_int_eq(C, CG * groups);
  ref o = ref_new(4, (int)N, (int)K, (int)OH, (int)OW);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      int64_t g = k / kpg;
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double s = 0;
          for (int64_t c = 0; c < CG; c++)
            for (int64_t rr = 0; rr < R; rr++)
              for (int64_t ss = 0; ss < S; ss++) {
                int64_t ih = oh * stride - pad + rr * dil, iw = ow * stride - pad + ss * dil;
                if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                int64_t ic = g * CG + c;
                s += get(I, ((n * C + ic) * H + ih) * Wd + iw) *
                     get(W, ((k * CG + c) * R + rr) * S + ss);
              }
          o.v[((n * K + k) * OH + oh) * OW + ow] = s;
        }
    }
  return o;
}

START_TEST(nn_conv2d) {
  rng r = {4};
  static const char *const pn[4] = {"stride", "pad", "dilation", "groups"};
  /* stride 2, pad 2, dilation 2, groups 3 */
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 2, 6, 11, 11), rand_f32(&r, 1, 4, 9, 2, 3, 3)};
    int64_t pv[4] = {2, 2, 2, 3};
    ref o = ref_conv2d(&in[0], &in[1], 2, 2, 2, 3);
    ck_assert_int_eq(o.shape[2], 6);
    check_def("conv2d", 2, in, 4, pn, pv, 1, &o);
  }
  /* defaults, non-square input and kernel */
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 2, 3, 9, 7), rand_f32(&r, 1, 4, 4, 3, 3, 2)};
    ref o = ref_conv2d(&in[0], &in[1], 1, 0, 1, 1);
    check_def("conv2d", 2, in, 0, NULL, NULL, 1, &o);
  }
  /* MobileNet depthwise: groups = channels, pad 1 */
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 2, 5, 7, 7), rand_f32(&r, 1, 4, 5, 1, 3, 3)};
    const char *const pn2[2] = {"pad", "groups"};
    int64_t pv[2] = {1, 5};
    ref o = ref_conv2d(&in[0], &in[1], 1, 1, 1, 5);
    check_def("conv2d", 2, in, 2, pn2, pv, 1, &o);
  }
  /* depthwise with channel multiplier 2, stride 3 */
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 1, 3, 10, 13), rand_f32(&r, 1, 4, 6, 1, 2, 4)};
    int64_t pv[4] = {3, 1, 1, 3};
    ref o = ref_conv2d(&in[0], &in[1], 3, 1, 1, 3);
    check_def("conv2d", 2, in, 4, pn, pv, 1, &o);
  }
  /* pointwise 1x1 */
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 2, 4, 5, 3), rand_f32(&r, 1, 4, 7, 4, 1, 1)};
    ref o = ref_conv2d(&in[0], &in[1], 1, 0, 1, 1);
    check_def("conv2d", 2, in, 0, NULL, NULL, 1, &o);
  }
}
END_TEST

START_TEST(nn_conv2d_errors) {
  rng r = {5};
  static const char *const pn[1] = {"groups"};
  int64_t g3[1] = {3};
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 1, 7, 5, 5), rand_f32(&r, 1, 4, 3, 2, 3, 3)};
    check_inst_error("conv2d", 2, in, 1, pn, g3, "C == CG * groups");
  }
  {
    nf_array in[2] = {rand_f32(&r, 1, 4, 1, 6, 5, 5), rand_f32(&r, 1, 4, 4, 2, 3, 3)};
    check_inst_error("conv2d", 2, in, 1, pn, g3, "K % groups == 0");
  }
  {
    static const char *const ps[1] = {"stride"};
    int64_t zero[1] = {0};
    nf_array in[2] = {rand_f32(&r, 1, 4, 1, 2, 5, 5), rand_f32(&r, 1, 4, 3, 2, 3, 3)};
    check_inst_error("conv2d", 2, in, 1, ps, zero, "stride > 0");
  }
  { /* rank-3 input */
    nf_array in[2] = {rand_f32(&r, 1, 3, 6, 5, 5), rand_f32(&r, 1, 4, 3, 6, 3, 3)};
    check_inst_error("conv2d", 2, in, 0, NULL, NULL, "rank");
  }
  { /* kernel larger than the input */
    nf_array in[2] = {rand_f32(&r, 1, 4, 1, 2, 2, 2), rand_f32(&r, 1, 4, 3, 2, 3, 3)};
    check_inst_error("conv2d", 2, in, 0, NULL, NULL, "OH > 0");
  }
}
END_TEST

static ref ref_pool(const nf_array *X, int kernel, int stride, int pad, int is_max) {
  int64_t N = X->shape[0], C = X->shape[1], H = X->shape[2], W = X->shape[3];
  int64_t OH = (H + 2 * pad - kernel) / stride + 1, OW = (W + 2 * pad - kernel) / stride + 1;
  ref o = ref_new(4, (int)N, (int)C, (int)OH, (int)OW);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double s = is_max ? -INFINITY : 0;
          for (int64_t a = 0; a < kernel; a++)
            for (int64_t b = 0; b < kernel; b++) {
              int64_t ih = oh * stride - pad + a, iw = ow * stride - pad + b;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              double x = get(X, ((n * C + c) * H + ih) * W + iw);
              s = is_max ? fmax(s, x) : s + x;
            }
          o.v[((n * C + c) * OH + oh) * OW + ow] = is_max ? s : s / (kernel * kernel);
        }
  return o;
}

static void pool_cases(const char *def, int is_max, uint64_t seed) {
  rng r = {seed};
  static const char *const pn[3] = {"kernel", "stride", "pad"};
  { /* kernel 3, stride 2, pad 1 */
    nf_array in[1] = {rand_f32(&r, 1, 4, 2, 3, 11, 9)};
    int64_t pv[3] = {3, 2, 1};
    ref o = ref_pool(&in[0], 3, 2, 1, is_max);
    ck_assert_int_eq(o.shape[2], 6);
    ck_assert_int_eq(o.shape[3], 5);
    check_def(def, 1, in, 3, pn, pv, 1, &o);
  }
  { /* kernel 2, default stride = kernel, no pad */
    nf_array in[1] = {rand_f32(&r, 1, 4, 2, 3, 8, 7)};
    int64_t pv[1] = {2};
    ref o = ref_pool(&in[0], 2, 2, 0, is_max);
    check_def(def, 1, in, 1, pn, pv, 1, &o);
  }
  { /* kernel 3, stride 1, pad 1: every window overlaps the padding */
    nf_array in[1] = {rand_f32(&r, 1, 4, 1, 2, 5, 4)};
    int64_t pv[3] = {3, 1, 1};
    ref o = ref_pool(&in[0], 3, 1, 1, is_max);
    check_def(def, 1, in, 3, pn, pv, 1, &o);
  }
  { /* pad more than half the kernel is an error */
    nf_array in[1] = {rand_f32(&r, 1, 4, 1, 2, 5, 4)};
    int64_t pv[3] = {2, 1, 2};
    check_inst_error(def, 1, in, 3, pn, pv, "2 * pad <= kernel");
  }
}

START_TEST(nn_max_pool2d) { pool_cases("max_pool2d", 1, 6); }
END_TEST

START_TEST(nn_avg_pool2d) { pool_cases("avg_pool2d", 0, 7); }
END_TEST

/* ---- elementwise activations ---- */

static double f_relu(double x) { return x > 0 ? x : 0; }
static double f_relu6(double x) { return x < 0 ? 0 : x > 6 ? 6 : x; }
static double f_elu(double x) { return x > 0 ? x : expm1(x); }
static double f_gelu(double x) { return 0.5 * x * (1 + erf(x * C32(M_SQRT1_2))); }
static double f_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double f_tanh(double x) { return tanh(x); }
static double f_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

static void unary_case(const char *def, double (*f)(double), double scale, uint64_t seed) {
  rng r = {seed};
  nf_array in[1] = {rand_f32(&r, scale, 3, 3, 5, 7)};
  ref o = ref_shape(in[0].rank, in[0].shape);
  for (int64_t i = 0; i < o.numel; i++) o.v[i] = f(get(&in[0], i));
  check_def(def, 1, in, 0, NULL, NULL, 1, &o);
  /* rank 1 and rank 0 (a pack of no dims) */
  nf_array in1[1] = {rand_f32(&r, scale, 1, 11)};
  ref o1 = ref_shape(1, in1[0].shape);
  for (int64_t i = 0; i < o1.numel; i++) o1.v[i] = f(get(&in1[0], i));
  check_def(def, 1, in1, 0, NULL, NULL, 1, &o1);
  nf_array in0[1] = {rand_f32(&r, scale, 0)};
  ref o0 = ref_new(0);
  o0.v[0] = f(get(&in0[0], 0));
  check_def(def, 1, in0, 0, NULL, NULL, 1, &o0);
}

START_TEST(nn_relu) { unary_case("relu", f_relu, 1, 10); }
END_TEST
START_TEST(nn_relu6) { unary_case("relu6", f_relu6, 9, 11); }
END_TEST
START_TEST(nn_elu) { unary_case("elu", f_elu, 3, 12); }
END_TEST
START_TEST(nn_gelu) { unary_case("gelu", f_gelu, 3, 13); }
END_TEST
START_TEST(nn_sigmoid) { unary_case("sigmoid", f_sigmoid, 6, 14); }
END_TEST
START_TEST(nn_tanh) { unary_case("tanh", f_tanh, 3, 15); }
END_TEST
START_TEST(nn_softplus) {
  unary_case("softplus", f_softplus, 4, 16);
  unary_case("softplus", f_softplus, 25, 17); /* past the threshold */
}
END_TEST

/* ---- normalised exponentials and losses ---- */

static ref ref_softmax(const nf_array *X, int log_form) {
  int64_t N = X->shape[X->rank - 1], rows = X->numel / N;
  ref o = ref_shape(X->rank, X->shape);
  for (int64_t b = 0; b < rows; b++) {
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < N; j++) mx = fmax(mx, get(X, b * N + j));
    for (int64_t j = 0; j < N; j++) z += exp(get(X, b * N + j) - mx);
    for (int64_t j = 0; j < N; j++) {
      double x = get(X, b * N + j);
      o.v[b * N + j] = log_form ? x - mx - log(z) : exp(x - mx) / z;
    }
  }
  return o;
}

static void softmax_cases(const char *def, int log_form, uint64_t seed) {
  rng r = {seed};
  nf_array in[1] = {rand_f32(&r, 5, 3, 3, 4, 9)};
  ref o = ref_softmax(&in[0], log_form);
  check_def(def, 1, in, 0, NULL, NULL, 1, &o);
  nf_array in1[1] = {rand_f32(&r, 40, 1, 13)}; /* large logits: needs the max */
  ref o1 = ref_softmax(&in1[0], log_form);
  check_def(def, 1, in1, 0, NULL, NULL, 1, &o1);
}

START_TEST(nn_softmax) { softmax_cases("softmax", 0, 20); }
END_TEST
START_TEST(nn_log_softmax) { softmax_cases("log_softmax", 1, 21); }
END_TEST

START_TEST(nn_cross_entropy) {
  rng r = {22};
  int64_t N = 7, C = 5;
  nf_array in[2] = {rand_f32(&r, 3, 2, 7, 5), rand_idx(&r, 5, 1, 7)};
  ref o = ref_new(0);
  double s = 0;
  for (int64_t n = 0; n < N; n++) {
    double mx = -INFINITY, z = 0;
    for (int64_t c = 0; c < C; c++) mx = fmax(mx, get(&in[0], n * C + c));
    for (int64_t c = 0; c < C; c++) z += exp(get(&in[0], n * C + c) - mx);
    s += -(get(&in[0], n * C + geti(&in[1], n)) - mx - log(z));
  }
  o.v[0] = s / N;
  check_def("cross_entropy", 2, in, 0, NULL, NULL, 1, &o);
  /* a label out of range is a run-time error */
  nf_array bad[2] = {rand_f32(&r, 3, 2, 3, 4), rand_idx(&r, 4, 1, 3)};
  ((int64_t *)bad[1].data)[1] = 4;
  check_run_error("cross_entropy", 2, bad);
}
END_TEST

START_TEST(nn_margin_loss) {
  rng r = {23};
  int64_t N = 7, J = 10;
  nf_array in[2] = {unif_f32(&r, 0.01, 0.99, 2, 7, 10), unif_f32(&r, 0, 1, 2, 7, 10)};
  for (int64_t n = 0; n < N; n++) { /* one-hot targets */
    int64_t hot = (int64_t)(rng_next(&r) % (uint64_t)J);
    for (int64_t j = 0; j < J; j++) ((float *)in[1].data)[n * J + j] = j == hot;
  }
  ref o = ref_new(0);
  double s = 0;
  for (int64_t i = 0; i < N * J; i++) {
    double v = get(&in[0], i), t = get(&in[1], i);
    double pos = fmax(C32(0.9) - v, 0), neg = fmax(v - C32(0.1), 0);
    s += t * pos * pos + 0.5 * (1 - t) * neg * neg;
  }
  o.v[0] = s / N;
  check_def("margin_loss", 2, in, 0, NULL, NULL, 1, &o);
  /* soft targets too */
  nf_array in2[2] = {unif_f32(&r, 0.01, 0.99, 2, 3, 4), unif_f32(&r, 0.05, 0.95, 2, 3, 4)};
  ref o2 = ref_new(0);
  s = 0;
  for (int64_t i = 0; i < 12; i++) {
    double v = get(&in2[0], i), t = get(&in2[1], i);
    double pos = fmax(C32(0.9) - v, 0), neg = fmax(v - C32(0.1), 0);
    s += t * pos * pos + 0.5 * (1 - t) * neg * neg;
  }
  o2.v[0] = s / 3;
  check_def("margin_loss", 2, in2, 0, NULL, NULL, 1, &o2);
}
END_TEST

static void mse_case(rng *r, nf_array x, nf_array y) {
  nf_array in[2] = {x, y};
  (void)r;
  ref o = ref_new(0);
  double s = 0;
  for (int64_t i = 0; i < x.numel; i++) {
    double dlt = get(&x, i) - get(&y, i);
    s += dlt * dlt;
  }
  o.v[0] = s / (double)x.numel;
  check_def("mse", 2, in, 0, NULL, NULL, 1, &o);
}

START_TEST(nn_mse) {
  rng r = {24};
  mse_case(&r, rand_f32(&r, 1, 3, 3, 5, 7), rand_f32(&r, 1, 3, 3, 5, 7));
  mse_case(&r, rand_f32(&r, 1, 1, 13), rand_f32(&r, 1, 1, 13));
  mse_case(&r, rand_f32(&r, 1, 0), rand_f32(&r, 1, 0));
}
END_TEST

/* ---- normalisation ---- */

START_TEST(nn_layer_norm) {
  rng r = {25};
  int64_t D = 11;
  nf_array in[3] = {rand_f32(&r, 2, 3, 3, 4, 11), rand_f32(&r, 1, 1, 11),
                    rand_f32(&r, 1, 1, 11)};
  ref o = ref_shape(3, in[0].shape);
  for (int64_t b = 0; b < 12; b++) {
    double mu = 0, var = 0;
    for (int64_t d = 0; d < D; d++) mu += get(&in[0], b * D + d);
    mu /= D;
    for (int64_t d = 0; d < D; d++) {
      double c = get(&in[0], b * D + d) - mu;
      var += c * c;
    }
    var /= D;
    for (int64_t d = 0; d < D; d++)
      o.v[b * D + d] = (get(&in[0], b * D + d) - mu) / sqrt(var + C32(1e-5)) *
                           get(&in[1], d) + get(&in[2], d);
  }
  check_def("layer_norm", 3, in, 0, NULL, NULL, 1, &o);
}
END_TEST

START_TEST(nn_batch_norm) {
  rng r = {26};
  int64_t N = 3, C = 5, H = 6, W = 7;
  nf_array in[3] = {rand_f32(&r, 2, 4, 3, 5, 6, 7), rand_f32(&r, 1, 1, 5),
                    rand_f32(&r, 1, 1, 5)};
  ref o = ref_shape(4, in[0].shape);
  for (int64_t c = 0; c < C; c++) {
    double mu = 0, var = 0, cnt = (double)(N * H * W);
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < H * W; i++) mu += get(&in[0], (n * C + c) * H * W + i);
    mu /= cnt;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < H * W; i++) {
        double x = get(&in[0], (n * C + c) * H * W + i) - mu;
        var += x * x;
      }
    var /= cnt;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < H * W; i++) {
        int64_t at = (n * C + c) * H * W + i;
        o.v[at] = (get(&in[0], at) - mu) / sqrt(var + C32(1e-5)) * get(&in[1], c) +
                  get(&in[2], c);
      }
  }
  check_def("batch_norm", 3, in, 0, NULL, NULL, 1, &o);
}
END_TEST

/* ---- shape manipulation ---- */

START_TEST(nn_concat) {
  rng r = {27};
  nf_array in[2] = {rand_f32(&r, 1, 3, 3, 4, 5), rand_f32(&r, 1, 3, 3, 4, 7)};
  ref o = ref_new(3, 3, 4, 12);
  for (int64_t b = 0; b < 12; b++)
    for (int64_t j = 0; j < 12; j++)
      o.v[b * 12 + j] = j < 5 ? get(&in[0], b * 5 + j) : get(&in[1], b * 7 + j - 5);
  check_def("concat", 2, in, 0, NULL, NULL, 1, &o);
  nf_array in1[2] = {rand_f32(&r, 1, 1, 2), rand_f32(&r, 1, 1, 9)};
  ref o1 = ref_new(1, 11);
  for (int64_t j = 0; j < 11; j++) o1.v[j] = j < 2 ? get(&in1[0], j) : get(&in1[1], j - 2);
  check_def("concat", 2, in1, 0, NULL, NULL, 1, &o1);
}
END_TEST

START_TEST(nn_split) {
  rng r = {28};
  static const char *const pn[1] = {"at"};
  int64_t at[1] = {5};
  nf_array in[1] = {rand_f32(&r, 1, 3, 3, 4, 12)};
  ref o[2] = {ref_new(3, 3, 4, 5), ref_new(3, 3, 4, 7)};
  for (int64_t b = 0; b < 12; b++)
    for (int64_t j = 0; j < 12; j++) {
      if (j < 5)
        o[0].v[b * 5 + j] = get(&in[0], b * 12 + j);
      else
        o[1].v[b * 7 + j - 5] = get(&in[0], b * 12 + j);
    }
  check_def("split", 1, in, 1, pn, at, 2, o);
  int64_t bad[3] = {0, 12, 13};
  for (int k = 0; k < 3; k++) {
    nf_array x[1] = {rand_f32(&r, 1, 2, 3, 12)};
    check_inst_error("split", 1, x, 1, pn, &bad[k], k == 0 ? "at > 0" : "at < N");
  }
}
END_TEST

START_TEST(nn_reshape) {
  rng r = {29};
  static const char *const pn[2] = {"r0", "r1"};
  static const int64_t shapes[3][2] = {{10, 21}, {210, 1}, {15, 14}};
  for (int k = 0; k < 3; k++) {
    nf_array in[1] = {rand_f32(&r, 1, 2, 14, 15)};
    ref o = ref_new(2, (int)shapes[k][0], (int)shapes[k][1]);
    for (int64_t i = 0; i < 210; i++) o.v[i] = get(&in[0], i); /* row-major */
    check_def("reshape2", 1, in, 2, pn, shapes[k], 1, &o);
  }
  nf_array in[1] = {rand_f32(&r, 1, 2, 14, 15)};
  static const int64_t bad[2] = {10, 20};
  check_inst_error("reshape2", 1, in, 2, pn, bad,
                   "reshape of 'X' [14, 15] (210 elements) to [10, 20] (200 elements)");
}
END_TEST

START_TEST(nn_flatten) {
  rng r = {30};
  nf_array in[1] = {rand_f32(&r, 1, 4, 2, 3, 4, 5)};
  ref o = ref_new(2, 2, 60);
  for (int64_t i = 0; i < 120; i++) o.v[i] = get(&in[0], i);
  check_def("flatten_nchw", 1, in, 0, NULL, NULL, 1, &o);
}
END_TEST

START_TEST(nn_transpose) {
  rng r = {31};
  nf_array in[1] = {rand_f32(&r, 1, 3, 3, 5, 7)};
  ref o = ref_new(3, 3, 7, 5);
  for (int64_t b = 0; b < 3; b++)
    for (int64_t i = 0; i < 5; i++)
      for (int64_t j = 0; j < 7; j++) o.v[(b * 7 + j) * 5 + i] = get(&in[0], (b * 5 + i) * 7 + j);
  check_def("transpose_last", 1, in, 0, NULL, NULL, 1, &o);
  nf_array in1[1] = {rand_f32(&r, 1, 2, 4, 9)};
  ref o1 = ref_new(2, 9, 4);
  for (int64_t i = 0; i < 4; i++)
    for (int64_t j = 0; j < 9; j++) o1.v[j * 4 + i] = get(&in1[0], i * 9 + j);
  check_def("transpose_last", 1, in1, 0, NULL, NULL, 1, &o1);
}
END_TEST

START_TEST(nn_permute) {
  rng r = {32};
  static const char *const pn[4] = {"p0", "p1", "p2", "p3"};
  static const int D[4] = {2, 3, 4, 5};
  int n_perm = 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++)
        for (int e = 0; e < 4; e++) {
          if (a == b || a == c || a == e || b == c || b == e || c == e) continue;
          int64_t p[4] = {a, b, c, e};
          nf_array in[1] = {rand_f32(&r, 1, 4, D[0], D[1], D[2], D[3])};
          ref o = ref_new(4, D[a], D[b], D[c], D[e]);
          int64_t i[4]; /* input index */
          for (i[0] = 0; i[0] < D[0]; i[0]++)
            for (i[1] = 0; i[1] < D[1]; i[1]++)
              for (i[2] = 0; i[2] < D[2]; i[2]++)
                for (i[3] = 0; i[3] < D[3]; i[3]++) {
                  int64_t src = ((i[0] * D[1] + i[1]) * D[2] + i[2]) * D[3] + i[3];
                  int64_t dst = ((i[p[0]] * D[p[1]] + i[p[1]]) * D[p[2]] + i[p[2]]) *
                                    D[p[3]] + i[p[3]];
                  o.v[dst] = get(&in[0], src);
                }
          check_def("permute4", 1, in, 4, pn, p, 1, &o);
          n_perm++;
        }
  ck_assert_int_eq(n_perm, 24);
  static const int64_t bad[2][4] = {{0, 0, 1, 2}, {0, 1, 2, 4}};
  for (int k = 0; k < 2; k++) {
    nf_array in[1] = {rand_f32(&r, 1, 4, 2, 3, 4, 5)};
    check_inst_error("permute4", 1, in, 4, pn, bad[k],
                     k == 0 ? "permute: dimension 0 is given twice"
                            : "permute: axis 4 is out of range for rank 4");
  }
}
END_TEST

START_TEST(nn_channel_shuffle) {
  rng r = {33};
  static const char *const pn[1] = {"groups"};
  static const int64_t gs[3] = {3, 4, 1};
  int64_t N = 2, C = 12, HW = 15;
  for (int k = 0; k < 3; k++) {
    int64_t g = gs[k];
    nf_array in[1] = {rand_f32(&r, 1, 4, 2, 12, 3, 5)};
    ref o = ref_shape(4, in[0].shape);
    /* reshape to (N, g, C/g, HW), swap axes 1 and 2, flatten */
    for (int64_t n = 0; n < N; n++)
      for (int64_t gi = 0; gi < g; gi++)
        for (int64_t ci = 0; ci < C / g; ci++)
          for (int64_t i = 0; i < HW; i++)
            o.v[(n * C + ci * g + gi) * HW + i] = get(&in[0], (n * C + gi * (C / g) + ci) * HW + i);
    check_def("channel_shuffle", 1, in, 1, pn, &gs[k], 1, &o);
  }
  nf_array in[1] = {rand_f32(&r, 1, 4, 2, 12, 3, 5)};
  int64_t bad = 5;
  check_inst_error("channel_shuffle", 1, in, 1, pn, &bad, "C % groups == 0");
}
END_TEST

/* ---- elementwise arithmetic ---- */

static double op_apply(char op, double x, double y) {
  switch (op) {
  case '+': return x + y;
  case '-': return x - y;
  case '*': return x * y;
  default: return x / y;
  }
}

static void binary_case(const char *def, char op, uint64_t seed) {
  rng r = {seed};
  nf_array in[2] = {rand_f32(&r, 2, 3, 3, 5, 7), rand_f32(&r, 2, 3, 3, 5, 7)};
  ref o = ref_shape(3, in[0].shape);
  for (int64_t i = 0; i < o.numel; i++) o.v[i] = op_apply(op, get(&in[0], i), get(&in[1], i));
  check_def(def, 2, in, 0, NULL, NULL, 1, &o);
  nf_array in1[2] = {rand_f32(&r, 2, 1, 9), rand_f32(&r, 2, 1, 9)};
  ref o1 = ref_shape(1, in1[0].shape);
  for (int64_t i = 0; i < 9; i++) o1.v[i] = op_apply(op, get(&in1[0], i), get(&in1[1], i));
  check_def(def, 2, in1, 0, NULL, NULL, 1, &o1);
  /* shapes that differ are an error */
  nf_array bad[2] = {rand_f32(&r, 2, 2, 3, 5), rand_f32(&r, 2, 2, 3, 4)};
  check_inst_error(def, 2, bad, 0, NULL, NULL, "disagree");
}

START_TEST(nn_add) { binary_case("add", '+', 40); }
END_TEST
START_TEST(nn_sub) { binary_case("sub", '-', 41); }
END_TEST
START_TEST(nn_mul) { binary_case("mul", '*', 42); }
END_TEST
START_TEST(nn_div) { binary_case("div", '/', 43); }
END_TEST

static void bcast_case(const char *def, char op, uint64_t seed) {
  rng r = {seed};
  { /* B = [3, 4], S = [5, 7] */
    nf_array in[2] = {rand_f32(&r, 2, 4, 3, 4, 5, 7), rand_f32(&r, 2, 2, 5, 7)};
    ref o = ref_shape(4, in[0].shape);
    for (int64_t b = 0; b < 12; b++)
      for (int64_t i = 0; i < 35; i++)
        o.v[b * 35 + i] = op_apply(op, get(&in[0], b * 35 + i), get(&in[1], i));
    check_def(def, 2, in, 0, NULL, NULL, 1, &o);
  }
  { /* B = [6], S = [11] (a bias over rows) */
    nf_array in[2] = {rand_f32(&r, 2, 2, 6, 11), rand_f32(&r, 2, 1, 11)};
    ref o = ref_shape(2, in[0].shape);
    for (int64_t b = 0; b < 6; b++)
      for (int64_t i = 0; i < 11; i++)
        o.v[b * 11 + i] = op_apply(op, get(&in[0], b * 11 + i), get(&in[1], i));
    check_def(def, 2, in, 0, NULL, NULL, 1, &o);
  }
  { /* B empty */
    nf_array in[2] = {rand_f32(&r, 2, 2, 3, 4), rand_f32(&r, 2, 2, 3, 4)};
    ref o = ref_shape(2, in[0].shape);
    for (int64_t i = 0; i < 12; i++) o.v[i] = op_apply(op, get(&in[0], i), get(&in[1], i));
    check_def(def, 2, in, 0, NULL, NULL, 1, &o);
  }
  { /* trailing dims that disagree */
    nf_array bad[2] = {rand_f32(&r, 2, 3, 2, 3, 5), rand_f32(&r, 2, 2, 3, 4)};
    check_inst_error(def, 2, bad, 0, NULL, NULL, "disagree");
  }
}

START_TEST(nn_badd) { bcast_case("badd", '+', 50); }
END_TEST
START_TEST(nn_bsub) { bcast_case("bsub", '-', 51); }
END_TEST
START_TEST(nn_bmul) { bcast_case("bmul", '*', 52); }
END_TEST
START_TEST(nn_bdiv) { bcast_case("bdiv", '/', 53); }
END_TEST

/* ---- capsules and lookups ---- */

START_TEST(nn_squash) {
  rng r = {60};
  int64_t D = 16;
  nf_array in[1] = {rand_f32(&r, 0.5, 3, 3, 10, 16)};
  /* some capsules with tiny norms, where the eps matters */
  for (int64_t d = 0; d < D; d++) ((float *)in[0].data)[d] *= 1e-4f;
  ref o = ref_shape(3, in[0].shape);
  for (int64_t b = 0; b < 30; b++) {
    double n2 = 0;
    for (int64_t d = 0; d < D; d++) n2 += get(&in[0], b * D + d) * get(&in[0], b * D + d);
    double f = n2 / (1 + n2) / sqrt(n2 + C32(1e-8));
    for (int64_t d = 0; d < D; d++) o.v[b * D + d] = f * get(&in[0], b * D + d);
  }
  check_def("squash", 1, in, 0, NULL, NULL, 1, &o);
}
END_TEST

START_TEST(nn_embedding) {
  rng r = {61};
  int64_t V = 11, D = 6;
  nf_array in[2] = {rand_f32(&r, 1, 2, 11, 6), rand_idx(&r, 11, 2, 3, 4)};
  ((int64_t *)in[1].data)[0] = 0; /* both ends of the table */
  ((int64_t *)in[1].data)[1] = V - 1;
  ref o = ref_new(3, 3, 4, 6);
  for (int64_t b = 0; b < 12; b++)
    for (int64_t d = 0; d < D; d++) o.v[b * D + d] = get(&in[0], geti(&in[1], b) * D + d);
  check_def("embedding", 2, in, 0, NULL, NULL, 1, &o);
  nf_array in1[2] = {rand_f32(&r, 1, 2, 11, 6), rand_idx(&r, 11, 1, 9)};
  ref o1 = ref_new(2, 9, 6);
  for (int64_t b = 0; b < 9; b++)
    for (int64_t d = 0; d < D; d++) o1.v[b * D + d] = get(&in1[0], geti(&in1[1], b) * D + d);
  check_def("embedding", 2, in1, 0, NULL, NULL, 1, &o1);
  /* out-of-range indices are run-time errors */
  nf_array bad[2] = {rand_f32(&r, 1, 2, 11, 6), rand_idx(&r, 11, 1, 4)};
  ((int64_t *)bad[1].data)[2] = V;
  check_run_error("embedding", 2, bad);
  nf_array neg[2] = {rand_f32(&r, 1, 2, 11, 6), rand_idx(&r, 11, 1, 4)};
  ((int64_t *)neg[1].data)[3] = -1;
  check_run_error("embedding", 2, neg);
}
END_TEST

/* ---- invalid uses ---- */

START_TEST(nn_wrong_rank) {
  rng r = {70};
  {
    nf_array in[2] = {rand_f32(&r, 1, 3, 2, 7, 13), rand_f32(&r, 1, 2, 13, 5)};
    check_inst_error("matmul", 2, in, 0, NULL, NULL, "rank");
  }
  { /* inner sizes that disagree */
    nf_array in[2] = {rand_f32(&r, 1, 2, 7, 13), rand_f32(&r, 1, 2, 12, 5)};
    check_inst_error("matmul", 2, in, 0, NULL, NULL, "disagree");
  }
  {
    nf_array in[1] = {rand_f32(&r, 1, 3, 3, 4, 5)};
    check_inst_error("flatten_nchw", 1, in, 0, NULL, NULL, "rank");
  }
  { /* layer_norm gamma of the wrong length */
    nf_array in[3] = {rand_f32(&r, 1, 2, 3, 11), rand_f32(&r, 1, 1, 10),
                      rand_f32(&r, 1, 1, 11)};
    check_inst_error("layer_norm", 3, in, 0, NULL, NULL, "disagree");
  }
  { /* softmax of a scalar: the pack cannot leave N unbound */
    nf_array in[1] = {rand_f32(&r, 1, 0)};
    check_inst_error("softmax", 1, in, 0, NULL, NULL, "rank");
  }
}
END_TEST

static Suite *nn_suite(void) {
  Suite *s = suite_create("nn");
  TCase *tc = tcase_create("nn");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, nn_interface);
  tcase_add_test(tc, nn_compare_detects_errors);
  tcase_add_test(tc, nn_matmul);
  tcase_add_test(tc, nn_batch_matmul);
  tcase_add_test(tc, nn_linear);
  tcase_add_test(tc, nn_conv2d);
  tcase_add_test(tc, nn_conv2d_errors);
  tcase_add_test(tc, nn_max_pool2d);
  tcase_add_test(tc, nn_avg_pool2d);
  tcase_add_test(tc, nn_relu);
  tcase_add_test(tc, nn_relu6);
  tcase_add_test(tc, nn_elu);
  tcase_add_test(tc, nn_gelu);
  tcase_add_test(tc, nn_sigmoid);
  tcase_add_test(tc, nn_tanh);
  tcase_add_test(tc, nn_softplus);
  tcase_add_test(tc, nn_softmax);
  tcase_add_test(tc, nn_log_softmax);
  tcase_add_test(tc, nn_cross_entropy);
  tcase_add_test(tc, nn_margin_loss);
  tcase_add_test(tc, nn_mse);
  tcase_add_test(tc, nn_layer_norm);
  tcase_add_test(tc, nn_batch_norm);
  tcase_add_test(tc, nn_concat);
  tcase_add_test(tc, nn_split);
  tcase_add_test(tc, nn_reshape);
  tcase_add_test(tc, nn_flatten);
  tcase_add_test(tc, nn_transpose);
  tcase_add_test(tc, nn_permute);
  tcase_add_test(tc, nn_channel_shuffle);
  tcase_add_test(tc, nn_add);
  tcase_add_test(tc, nn_sub);
  tcase_add_test(tc, nn_mul);
  tcase_add_test(tc, nn_div);
  tcase_add_test(tc, nn_badd);
  tcase_add_test(tc, nn_bsub);
  tcase_add_test(tc, nn_bmul);
  tcase_add_test(tc, nn_bdiv);
  tcase_add_test(tc, nn_squash);
  tcase_add_test(tc, nn_embedding);
  tcase_add_test(tc, nn_wrong_rank);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(nn_suite());
  srunner_run_all(sr, CK_NORMAL);
  int n_failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return n_failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
