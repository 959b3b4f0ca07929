/* test_interp.c - the reference interpreter against plain C loops.
 *
 * Every test builds a graph with the IR constructors, evaluates it on
 * random non-zero inputs of odd sizes (seeded xorshift) and compares with
 * loops written out here.  Tolerances: 1e-5 relative for f32 storage,
 * 1e-12 for f64 (several checks are exact where the evaluation order is
 * the sequential one).  Errors are asserted by status and exact text.  The
 * 256^3 matmul prints its time to stderr and asserts nothing about it.
 *
 * Bounds (nf_interp_run_bounded): on the optimizers of lib/optim.nf and a
 * def of every float operator, at the search's check inputs (uniform in
 * [-1, 1), which leave the optimizers' domain), every f32 evaluation of
 * the interpreter lies within the bound of each element that has a finite
 * one; on inputs in Adam's domain every bound is finite and within 64 u
 * of the value's size; exact operations have bound 0. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_lang.h"

/* ---- helpers ---- */

static nf_ir_ctx *cx;
static nf_graph *G;
static nf_module *mod; /* the bounds tests' module (names live in it) */

static void setup(void) {
  cx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(cx);
  G = nf_graph_new(cx, "test");
  ck_assert_ptr_nonnull(G);
}

static void teardown(void) {
  nf_module_free(mod);
  mod = NULL;
  nf_ir_ctx_free(cx);
  cx = NULL;
  G = NULL;
}

static uint64_t rng_state;
static void seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ULL + 1; }
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
/* Uniform magnitude in [0.25, 1.25), random sign: never zero. */
static double rnd(void) {
  double m = 0.25 + (double)(rng() >> 11) / 9007199254740992.0;
  return (rng() & 1) ? -m : m;
}
/* Non-zero integer in [-lim, lim]. */
static int64_t rnd_int(int64_t lim) {
  int64_t v = (int64_t)(rng() % (uint64_t)lim) + 1;
  return (rng() & 1) ? -v : v;
}

static int tensor(const char *name, nf_dtype t, nf_tkind k, int rank, ...) {
  int64_t shape[NF_MAX_RANK];
  va_list ap;
  va_start(ap, rank);
  for (int d = 0; d < rank; d++) shape[d] = va_arg(ap, int64_t);
  va_end(ap);
  int id = nf_graph_add_tensor(G, name, t, k, rank, shape);
  ck_assert_int_ge(id, 0);
  return id;
}

static const char *const letters[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i",
                                      "j", "k", "l", "m", "n", "o", "p", "q", "r",
                                      "s", "t", "u", "v", "w", "x", "y", "z"};

/* Adds out(...) red= rhs; names is one letter per variable ("ijk");
 * lo/ext give the reduction ranges (n_red entries). */
static void stmt(int out, nf_redop red, const char *names, int n_red,
                 const int64_t *lo, const int64_t *ext, const nf_expr *rhs) {
  nf_stmt s;
  memset(&s, 0, sizeof s);
  ck_assert_ptr_nonnull(rhs);
  s.out = (uint32_t)out;
  s.red = (uint8_t)red;
  s.n_red = (uint8_t)n_red;
  for (int r = 0; r < n_red; r++) {
    s.red_lo[r] = lo ? lo[r] : 0;
    s.red_ext[r] = ext[r];
  }
  s.rhs = rhs;
  for (size_t v = 0; names && names[v]; v++) s.var_names[v] = letters[names[v] - 'a'];
  ck_assert_int_eq(nf_graph_add_stmt(G, &s), NF_OK);
}

#define V(n) nf_e_var(cx, (n))
#define CI(v) nf_e_const_i(cx, NF_I64, (v))
#define CF(t, v) nf_e_const_f(cx, (t), (v))
#define BIN(op, a, b) nf_e_binary(cx, NF_OP_##op, (a), (b))
#define UN(op, a) nf_e_unary(cx, NF_OP_##op, (a))

static const nf_expr *acc(int t, int n, ...) {
  const nf_expr *idx[NF_MAX_RANK];
  va_list ap;
  va_start(ap, n);
  for (int d = 0; d < n; d++) idx[d] = va_arg(ap, const nf_expr *);
  va_end(ap);
  return nf_e_access(cx, (uint32_t)t, (nf_dtype)G->tensors[t].dtype, n, idx);
}

/* An input array shaped like tensor t, filled with random non-zero values
 * (floats as dt, which may differ from the tensor's dtype). */
static nf_array input(int t, nf_dtype dt) {
  nf_array a;
  const nf_tensor *ts = &G->tensors[t];
  ck_assert_int_eq(nf_array_alloc(&a, dt, ts->rank, ts->shape), NF_OK);
  for (int64_t e = 0; e < a.numel; e++) {
    switch (dt) {
    case NF_F32: ((float *)a.data)[e] = (float)rnd(); break;
    case NF_F64: ((double *)a.data)[e] = rnd(); break;
    case NF_I32: ((int32_t *)a.data)[e] = (int32_t)rnd_int(50); break;
    case NF_I64: ((int64_t *)a.data)[e] = rnd_int(50); break;
    default: ((uint8_t *)a.data)[e] = rng() & 1; break;
    }
  }
  return a;
}

static double fget(const nf_array *a, int64_t e) {
  return a->dtype == NF_F32 ? ((float *)a->data)[e] : ((double *)a->data)[e];
}
static int64_t iget(const nf_array *a, int64_t e) {
  switch (a->dtype) {
  case NF_I32: return ((int32_t *)a->data)[e];
  case NF_I64: return ((int64_t *)a->data)[e];
  default: return ((uint8_t *)a->data)[e];
  }
}

static int close_to(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

#define CHECK_CLOSE(got, want, tol)                                          \
  ck_assert_msg(close_to((got), (want), (tol)), "%s: got %.17g want %.17g", \
                #got, (double)(got), (double)(want))

static int run(const nf_array *in, nf_precision p, nf_array *out, nf_buf *err) {
  for (uint32_t k = 0; k < G->n_outputs; k++) memset(&out[k], 0, sizeof out[k]);
  return nf_interp_run(G, in, p, out, err);
}

static void free_arrays(nf_array *a, int n) {
  for (int k = 0; k < n; k++) nf_array_free(&a[k]);
}

/* ---- tests ---- */

START_TEST(interp_matmul) {
  const int64_t M = 7, K = 13, N = 5;
  seed(1);
  int A = tensor("A", NF_F32, NF_T_INPUT, 2, M, K);
  int B = tensor("B", NF_F32, NF_T_INPUT, 2, K, N);
  int C = tensor("C", NF_F32, NF_T_OUTPUT, 2, M, N);
  int64_t ext[1] = {K};
  stmt(C, NF_RED_SUM, "ijk", 1, NULL, ext,
       BIN(MUL, acc(A, 2, V(0), V(2)), acc(B, 2, V(2), V(1))));
  nf_array in[2] = {input(A, NF_F32), input(B, NF_F32)}, out[1];
  nf_buf err = NF_BUF_INIT;
  for (int p = 0; p < 2; p++) {
    ck_assert_msg(run(in, (nf_precision)p, out, &err) == NF_OK, "%s", nf_buf_str(&err));
    ck_assert_int_eq(out[0].dtype, p ? NF_F64 : NF_F32);
    ck_assert_int_eq(out[0].rank, 2);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += fget(&in[0], i * K + k) * fget(&in[1], k * N + j);
        if (p == NF_INTERP_F64)
          ck_assert(fget(&out[0], i * N + j) == s); /* same order: exact */
        else
          CHECK_CLOSE(fget(&out[0], i * N + j), s, 1e-5);
      }
    free_arrays(out, 1);
  }
  free_arrays(in, 2);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_reductions) {
  const int64_t R = 9, Kx = 11, lo = 3, ext = 6;
  static const nf_redop reds[] = {NF_RED_SUM, NF_RED_PROD, NF_RED_MAX, NF_RED_MIN};
  for (int ri = 0; ri < 4; ri++) {
    for (int empty = 0; empty < 2; empty++) {
      setup();
      seed(2 + (uint64_t)ri);
      int X = tensor("X", NF_F64, NF_T_INPUT, 2, R, Kx);
      int O = tensor("O", NF_F64, NF_T_OUTPUT, 1, R);
      int64_t l[1] = {lo}, e[1] = {empty ? 0 : ext};
      stmt(O, reds[ri], "ik", 1, l, e, acc(X, 2, V(0), V(1)));
      nf_array in[1] = {input(X, NF_F64)}, out[1];
      nf_buf err = NF_BUF_INIT;
      ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
      for (int64_t i = 0; i < R; i++) {
        double s = reds[ri] == NF_RED_SUM    ? 0.0
                   : reds[ri] == NF_RED_PROD ? 1.0
                   : reds[ri] == NF_RED_MAX  ? -INFINITY
                                             : INFINITY;
        for (int64_t k = lo; k < lo + e[0]; k++) {
          double x = fget(&in[0], i * Kx + k);
          switch (reds[ri]) {
          case NF_RED_SUM: s += x; break;
          case NF_RED_PROD: s *= x; break;
          case NF_RED_MAX: s = x > s ? x : s; break;
          default: s = x < s ? x : s; break;
          }
        }
        ck_assert_msg(fget(&out[0], i) == s, "red %d empty %d row %lld: %g vs %g",
                      ri, empty, (long long)i, fget(&out[0], i), s);
      }
      free_arrays(in, 1);
      free_arrays(out, 1);
      nf_buf_free(&err);
      teardown();
    }
  }
}
END_TEST

START_TEST(interp_int_reduction_identities) {
  static const struct {
    nf_dtype dt;
    nf_redop red;
    int64_t want;
  } cases[] = {
      {NF_I32, NF_RED_MAX, INT32_MIN}, {NF_I32, NF_RED_MIN, INT32_MAX},
      {NF_I64, NF_RED_MAX, INT64_MIN}, {NF_I64, NF_RED_MIN, INT64_MAX},
      {NF_I32, NF_RED_SUM, 0},         {NF_I64, NF_RED_PROD, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    setup();
    int X = tensor("X", cases[c].dt, NF_T_INPUT, 1, (int64_t)3);
    int O = tensor("O", cases[c].dt, NF_T_OUTPUT, 1, (int64_t)2);
    int64_t lo[1] = {5}, ext[1] = {0};
    stmt(O, cases[c].red, "ik", 1, lo, ext, acc(X, 1, V(1)));
    nf_array in[1] = {input(X, cases[c].dt)}, out[1];
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(run(in, NF_INTERP_F32, out, &err) == NF_OK, "%s", nf_buf_str(&err));
    ck_assert_int_eq(out[0].dtype, cases[c].dt);
    ck_assert(iget(&out[0], 0) == cases[c].want && iget(&out[0], 1) == cases[c].want);
    free_arrays(in, 1);
    free_arrays(out, 1);
    nf_buf_free(&err);
    teardown();
  }
}
END_TEST

/* A scalar output folds in sequential order: bit-identical to a C loop,
 * across several blocks of the vector variable and two reduction
 * variables. */
START_TEST(interp_scalar_reduction) {
  const int64_t P = 7, Q = 601;
  seed(3);
  int X = tensor("X", NF_F64, NF_T_INPUT, 2, P, Q);
  int Y = tensor("Y", NF_F64, NF_T_INPUT, 1, Q);
  int S = tensor("S", NF_F64, NF_T_OUTPUT, 0);
  int64_t lo[2] = {1, 2}, ext[2] = {P - 1, Q - 3};
  stmt(S, NF_RED_SUM, "ab", 2, lo, ext,
       BIN(MUL, acc(X, 2, V(0), V(1)), acc(Y, 1, V(1))));
  nf_array in[2] = {input(X, NF_F64), input(Y, NF_F64)}, out[1];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  double s = 0;
  for (int64_t a = 1; a < P; a++)
    for (int64_t b = 2; b < Q - 1; b++) s += fget(&in[0], a * Q + b) * fget(&in[1], b);
  ck_assert_int_eq(out[0].rank, 0);
  ck_assert_int_eq(out[0].numel, 1);
  ck_assert(fget(&out[0], 0) == s);
  free_arrays(in, 2);
  free_arrays(out, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_transpose_broadcast) {
  const int64_t M = 5, N = 301;
  seed(4);
  int X = tensor("X", NF_F32, NF_T_INPUT, 2, N, M);
  int B = tensor("B", NF_F32, NF_T_INPUT, 1, N);
  int T = tensor("T", NF_F32, NF_T_OUTPUT, 2, M, N);
  int S = tensor("S", NF_F32, NF_T_OUTPUT, 0);
  stmt(T, NF_RED_NONE, "ij", 0, NULL, NULL,
       BIN(ADD, acc(X, 2, V(1), V(0)), acc(B, 1, V(1))));
  stmt(S, NF_RED_NONE, "", 0, NULL, NULL, BIN(MUL, acc(X, 2, CI(3), CI(2)), CF(NF_F32, 2.0)));
  nf_array in[2] = {input(X, NF_F32), input(B, NF_F64)}, out[2];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F32, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      /* B came as f64 and is rounded to f32 on input. */
      float want = (float)(fget(&in[0], j * M + i) + (double)(float)fget(&in[1], j));
      ck_assert(fget(&out[0], i * N + j) == want);
    }
  ck_assert(fget(&out[1], 0) == 2.0 * fget(&in[0], 3 * M + 2));
  free_arrays(in, 2);
  free_arrays(out, 2);
  nf_buf_free(&err);
}
END_TEST

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

START_TEST(interp_unary_math) {
  static const nf_op ops[] = {NF_OP_NEG, NF_OP_EXP, NF_OP_LOG, NF_OP_SQRT,
                              NF_OP_RSQRT, NF_OP_TANH, NF_OP_SIGMOID, NF_OP_ERF,
                              NF_OP_ABS, NF_OP_FLOOR, NF_OP_CEIL};
  const int n_ops = (int)(sizeof ops / sizeof ops[0]);
  const int64_t N = 37;
  seed(5);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int outs[16];
  for (int o = 0; o < n_ops; o++) {
    char name[8];
    snprintf(name, sizeof name, "O%d", o);
    outs[o] = tensor(name, NF_F64, NF_T_OUTPUT, 1, N);
    const nf_expr *x = acc(X, 1, V(0));
    /* log, sqrt, rsqrt on |x|; the others on x scaled to [-5, 5]. */
    if (ops[o] == NF_OP_LOG || ops[o] == NF_OP_SQRT || ops[o] == NF_OP_RSQRT)
      x = UN(ABS, x);
    else
      x = BIN(MUL, x, CF(NF_F64, 4.0));
    stmt(outs[o], NF_RED_NONE, "i", 0, NULL, NULL, UN(NEG, UN(NEG, nf_e_unary(cx, ops[o], x))));
  }
  nf_array in[1] = {input(X, NF_F64)}, out[16];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int o = 0; o < n_ops; o++)
    for (int64_t i = 0; i < N; i++) {
      double x = fget(&in[0], i), ax = fabs(x), sx = x * 4.0, want = 0;
      switch (ops[o]) {
      case NF_OP_NEG: want = -sx; break;
      case NF_OP_EXP: want = exp(sx); break;
      case NF_OP_LOG: want = log(ax); break;
      case NF_OP_SQRT: want = sqrt(ax); break;
      case NF_OP_RSQRT: want = 1.0 / sqrt(ax); break;
      case NF_OP_TANH: want = tanh(sx); break;
      case NF_OP_SIGMOID: want = ref_sigmoid(sx); break;
      case NF_OP_ERF: want = erf(sx); break;
      case NF_OP_ABS: want = fabs(sx); break;
      case NF_OP_FLOOR: want = floor(sx); break;
      default: want = ceil(sx); break;
      }
      CHECK_CLOSE(fget(&out[o], i), want, 1e-12);
    }
  free_arrays(in, 1);
  free_arrays(out, n_ops);
  nf_buf_free(&err);
}
END_TEST

/* sigmoid is stable at the extremes; integer neg/abs wrap. */
START_TEST(interp_unary_edges) {
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, (int64_t)4);
  int I = tensor("I", NF_I64, NF_T_INPUT, 1, (int64_t)3);
  int S = tensor("S", NF_F64, NF_T_OUTPUT, 1, (int64_t)4);
  int N = tensor("N", NF_I64, NF_T_OUTPUT, 1, (int64_t)3);
  int A = tensor("A", NF_I64, NF_T_OUTPUT, 1, (int64_t)3);
  stmt(S, NF_RED_NONE, "i", 0, NULL, NULL, UN(SIGMOID, acc(X, 1, V(0))));
  stmt(N, NF_RED_NONE, "i", 0, NULL, NULL, UN(NEG, acc(I, 1, V(0))));
  stmt(A, NF_RED_NONE, "i", 0, NULL, NULL, UN(ABS, acc(I, 1, V(0))));
  nf_array in[2], out[3];
  nf_buf err = NF_BUF_INIT;
  in[0] = input(X, NF_F64);
  in[1] = input(I, NF_I64);
  double xs[4] = {-800.0, 800.0, -40.0, 0.0};
  int64_t is[3] = {INT64_MIN, -5, INT64_MAX};
  memcpy(in[0].data, xs, sizeof xs);
  memcpy(in[1].data, is, sizeof is);
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert(fget(&out[0], 0) == 0.0 && fget(&out[0], 1) == 1.0);
  CHECK_CLOSE(fget(&out[0], 2), exp(-40.0) / (1 + exp(-40.0)), 1e-12);
  ck_assert(fget(&out[0], 2) > 0);
  ck_assert(fget(&out[0], 3) == 0.5);
  ck_assert(iget(&out[1], 0) == INT64_MIN && iget(&out[1], 1) == 5 &&
            iget(&out[1], 2) == -INT64_MAX);
  ck_assert(iget(&out[2], 0) == INT64_MIN && iget(&out[2], 1) == 5 &&
            iget(&out[2], 2) == INT64_MAX);
  free_arrays(in, 2);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

/* Python semantics computed independently of the interpreter's method:
 * through floor() of the exact quotient (operands are small). */
static int64_t py_floordiv(int64_t a, int64_t b) {
  return (int64_t)floor((double)a / (double)b);
}
static int64_t py_mod(int64_t a, int64_t b) { return a - b * py_floordiv(a, b); }

START_TEST(interp_python_division_helper) {
  /* The helper itself against Python's answers. */
  ck_assert(py_floordiv(-7, 2) == -4 && py_mod(-7, 2) == 1);
  ck_assert(py_floordiv(7, -2) == -4 && py_mod(7, -2) == -1);
  ck_assert(py_floordiv(-7, -2) == 3 && py_mod(-7, -2) == -1);
  ck_assert(py_floordiv(6, -3) == -2 && py_mod(6, -3) == 0);
}
END_TEST

START_TEST(interp_binary_ops) {
  static const nf_op fops[] = {NF_OP_ADD, NF_OP_SUB, NF_OP_MUL, NF_OP_DIV,
                               NF_OP_FLOORDIV, NF_OP_MOD, NF_OP_POW, NF_OP_MIN,
                               NF_OP_MAX};
  static const nf_op iops[] = {NF_OP_ADD, NF_OP_SUB, NF_OP_MUL, NF_OP_FLOORDIV,
                               NF_OP_MOD, NF_OP_MIN, NF_OP_MAX};
  const int nf_ = 9, ni = 7;
  const int64_t N = 41;
  seed(6);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int Y = tensor("Y", NF_F64, NF_T_INPUT, 1, N);
  int I = tensor("I", NF_I64, NF_T_INPUT, 1, N);
  int J = tensor("J", NF_I32, NF_T_INPUT, 1, N);
  int fo[9], io[7], jo[7];
  for (int o = 0; o < nf_; o++) {
    fo[o] = tensor("F", NF_F64, NF_T_OUTPUT, 1, N);
    const nf_expr *x = BIN(MUL, acc(X, 1, V(0)), CF(NF_F64, 3.0));
    const nf_expr *y = acc(Y, 1, V(0));
    if (fops[o] == NF_OP_POW) x = UN(ABS, x);
    stmt(fo[o], NF_RED_NONE, "i", 0, NULL, NULL, nf_e_binary(cx, fops[o], x, y));
  }
  for (int o = 0; o < ni; o++) {
    io[o] = tensor("I", NF_I64, NF_T_OUTPUT, 1, N);
    stmt(io[o], NF_RED_NONE, "i", 0, NULL, NULL,
         nf_e_binary(cx, iops[o], acc(I, 1, V(0)), acc(I, 1, BIN(SUB, CI(N - 1), V(0)))));
    jo[o] = tensor("J", NF_I32, NF_T_OUTPUT, 1, N);
    stmt(jo[o], NF_RED_NONE, "i", 0, NULL, NULL,
         nf_e_binary(cx, iops[o], acc(J, 1, V(0)), nf_e_const_i(cx, NF_I32, -7)));
  }
  nf_array in[4] = {input(X, NF_F64), input(Y, NF_F64), input(I, NF_I64), input(J, NF_I32)};
  nf_array out[23];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < N; i++) {
    double x = fget(&in[0], i) * 3.0, y = fget(&in[1], i);
    double want[9] = {x + y, x - y, x * y, x / y, floor(x / y),
                      x - y * floor(x / y), pow(fabs(x), y), fmin(x, y), fmax(x, y)};
    for (int o = 0; o < nf_; o++) CHECK_CLOSE(fget(&out[o], i), want[o], 1e-12);
    /* Python float %: same sign as the divisor. */
    double m = fget(&out[5], i);
    ck_assert(m == 0 || (m < 0) == (y < 0));
  }
  int outi = nf_;
  for (int o = 0; o < ni; o++, outi += 2) {
    for (int64_t i = 0; i < N; i++) {
      int64_t a = iget(&in[2], i), b = iget(&in[2], N - 1 - i);
      int64_t c = iget(&in[3], i), d = -7;
      int64_t w1, w2;
      switch (iops[o]) {
      case NF_OP_ADD: w1 = a + b; w2 = c + d; break;
      case NF_OP_SUB: w1 = a - b; w2 = c - d; break;
      case NF_OP_MUL: w1 = a * b; w2 = c * d; break;
      case NF_OP_FLOORDIV: w1 = py_floordiv(a, b); w2 = py_floordiv(c, d); break;
      case NF_OP_MOD: w1 = py_mod(a, b); w2 = py_mod(c, d); break;
      case NF_OP_MIN: w1 = a < b ? a : b; w2 = c < d ? c : d; break;
      default: w1 = a > b ? a : b; w2 = c > d ? c : d; break;
      }
      ck_assert_msg(iget(&out[outi], i) == w1, "op %d: %lld, %lld -> %lld, want %lld",
                    iops[o], (long long)a, (long long)b,
                    (long long)iget(&out[outi], i), (long long)w1);
      ck_assert_int_eq(out[outi + 1].dtype, NF_I32);
      ck_assert(iget(&out[outi + 1], i) == w2);
    }
  }
  free_arrays(in, 4);
  free_arrays(out, 23);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_casts) {
  const int64_t N = 23;
  seed(7);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int I = tensor("I", NF_I64, NF_T_INPUT, 1, N);
  int Bi = tensor("B", NF_BOOL, NF_T_INPUT, 1, N);
  int O1 = tensor("O1", NF_I32, NF_T_OUTPUT, 1, N);   /* f64 -> i32 */
  int O2 = tensor("O2", NF_F32, NF_T_OUTPUT, 1, N);   /* i64 -> f32 */
  int O3 = tensor("O3", NF_BOOL, NF_T_OUTPUT, 1, N);  /* i64 -> bool */
  int O4 = tensor("O4", NF_F64, NF_T_OUTPUT, 1, N);   /* bool -> f64 */
  int O5 = tensor("O5", NF_BOOL, NF_T_OUTPUT, 1, N);  /* f64 -> bool */
  int O6 = tensor("O6", NF_F64, NF_T_OUTPUT, 1, N);   /* f64 -> f32 -> f64 */
  int O7 = tensor("O7", NF_I32, NF_T_OUTPUT, 1, N);   /* i64 -> i32 wraps */
  const nf_expr *x = BIN(MUL, acc(X, 1, V(0)), CF(NF_F64, 100.0));
  const nf_expr *ii = acc(I, 1, V(0));
  stmt(O1, NF_RED_NONE, "i", 0, NULL, NULL, nf_e_cast(cx, NF_I32, x));
  stmt(O2, NF_RED_NONE, "i", 0, NULL, NULL, nf_e_cast(cx, NF_F32, ii));
  stmt(O3, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_cast(cx, NF_BOOL, BIN(MOD, ii, CI(3))));
  stmt(O4, NF_RED_NONE, "i", 0, NULL, NULL, nf_e_cast(cx, NF_F64, acc(Bi, 1, V(0))));
  stmt(O5, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_cast(cx, NF_BOOL, UN(FLOOR, acc(X, 1, V(0)))));
  stmt(O6, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_cast(cx, NF_F64, nf_e_cast(cx, NF_F32, BIN(DIV, CF(NF_F64, 1.0), x))));
  stmt(O7, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_cast(cx, NF_I32, BIN(MUL, ii, CI(100000000))));
  nf_array in[3] = {input(X, NF_F64), input(I, NF_I64), input(Bi, NF_BOOL)}, out[7];
  nf_buf err = NF_BUF_INIT;
  for (int p = 0; p < 2; p++) {
    ck_assert_msg(run(in, (nf_precision)p, out, &err) == NF_OK, "%s", nf_buf_str(&err));
    for (int64_t i = 0; i < N; i++) {
      double xv = fget(&in[0], i) * 100.0;
      int64_t iv = iget(&in[1], i);
      ck_assert(iget(&out[0], i) == (int32_t)xv); /* toward zero */
      ck_assert(fget(&out[1], i) == (double)iv);
      ck_assert(iget(&out[2], i) == (py_mod(iv, 3) != 0));
      ck_assert(fget(&out[3], i) == (double)iget(&in[2], i));
      ck_assert(iget(&out[4], i) == (floor(fget(&in[0], i)) != 0));
      double r = 1.0 / xv;
      ck_assert(fget(&out[5], i) == (p == NF_INTERP_F32 ? (double)(float)r : r));
      ck_assert(iget(&out[6], i) == (int32_t)(uint32_t)(uint64_t)(iv * 100000000));
    }
    free_arrays(out, 7);
  }
  free_arrays(in, 3);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_cast_error) {
  int X = tensor("X", NF_F32, NF_T_INPUT, 1, (int64_t)3);
  int O = tensor("O", NF_I32, NF_T_OUTPUT, 1, (int64_t)3);
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL, nf_e_cast(cx, NF_I32, acc(X, 1, V(0))));
  nf_array in[1] = {input(X, NF_F32)}, out[1];
  nf_buf err = NF_BUF_INIT;
  ((float *)in[0].data)[1] = 3e9f;
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err), "statement 0 (O): cannot convert 3e+09 to i32 at i=1");
  ck_assert_ptr_null(out[0].data);
  nf_buf_reset(&err);
  ((float *)in[0].data)[1] = NAN;
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err), "statement 0 (O): cannot convert nan to i32 at i=1");
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_bool_logic) {
  const int64_t N = 29;
  seed(8);
  int A = tensor("A", NF_BOOL, NF_T_INPUT, 1, N);
  int B = tensor("B", NF_BOOL, NF_T_INPUT, 1, N);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int I = tensor("I", NF_I32, NF_T_INPUT, 1, N);
  int O = tensor("O", NF_BOOL, NF_T_OUTPUT, 2, (int64_t)10, N);
  int Any = tensor("Any", NF_BOOL, NF_T_OUTPUT, 0);
  int All = tensor("All", NF_BOOL, NF_T_OUTPUT, 0);
  const nf_expr *a = acc(A, 1, V(1)), *b = acc(B, 1, V(1));
  const nf_expr *x = acc(X, 1, V(1)), *x2 = acc(X, 1, BIN(SUB, CI(N - 1), V(1)));
  const nf_expr *iv = acc(I, 1, V(1));
  const nf_expr *z = nf_e_const_i(cx, NF_I32, 0);
  const nf_expr *rows[10] = {
      BIN(AND, a, b), BIN(OR, a, b), UN(NOT, a), BIN(LT, x, x2), BIN(LE, x, x2),
      BIN(GT, iv, z), BIN(GE, iv, z), BIN(EQ, a, b), BIN(NE, x, x2),
      BIN(AND, BIN(OR, a, UN(NOT, b)), BIN(LT, iv, z))};
  /* Row r of O is rows[r], selected by nested selects on the row index. */
  const nf_expr *e = rows[9];
  for (int r = 8; r >= 0; r--) e = nf_e_select(cx, BIN(EQ, V(0), CI(r)), rows[r], e);
  stmt(O, NF_RED_NONE, "ij", 0, NULL, NULL, e);
  int64_t ext[1] = {N};
  stmt(Any, NF_RED_MAX, "k", 1, NULL, ext, acc(A, 1, V(0)));
  stmt(All, NF_RED_MIN, "k", 1, NULL, ext, acc(A, 1, V(0)));
  nf_array in[4] = {input(A, NF_BOOL), input(B, NF_BOOL), input(X, NF_F64), input(I, NF_I32)};
  nf_array out[3];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  int any = 0, all = 1;
  for (int64_t j = 0; j < N; j++) {
    int av = (int)iget(&in[0], j), bv = (int)iget(&in[1], j);
    double xv = fget(&in[2], j), x2v = fget(&in[2], N - 1 - j);
    int64_t ivv = iget(&in[3], j);
    int want[10] = {av && bv, av || bv, !av, xv < x2v, xv <= x2v, ivv > 0, ivv >= 0,
                    av == bv, xv != x2v, (av || !bv) && ivv < 0};
    for (int r = 0; r < 10; r++) ck_assert_int_eq(iget(&out[0], r * N + j), want[r]);
    any |= av;
    all &= av;
  }
  ck_assert_int_eq(out[1].dtype, NF_BOOL);
  ck_assert_int_eq(iget(&out[1], 0), any);
  ck_assert_int_eq(iget(&out[2], 0), all);
  free_arrays(in, 4);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

/* Padding: the guarded access would be out of bounds when the guard is
 * false; a guarded division would divide by zero. */
START_TEST(interp_select_lazy) {
  const int64_t N = 300, Kw = 3;
  seed(9);
  int X = tensor("X", NF_F32, NF_T_INPUT, 1, N);
  int W = tensor("W", NF_F32, NF_T_INPUT, 1, Kw);
  int D = tensor("D", NF_I64, NF_T_INPUT, 1, N);
  int P = tensor("P", NF_F32, NF_T_OUTPUT, 1, N);
  int Cv = tensor("Cv", NF_F32, NF_T_OUTPUT, 1, N);
  int Q = tensor("Q", NF_I64, NF_T_OUTPUT, 1, N);
  const nf_expr *im1 = BIN(SUB, V(0), CI(1));
  const nf_expr *guard = BIN(AND, BIN(GE, im1, CI(0)), BIN(LT, im1, CI(N)));
  stmt(P, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_select(cx, guard, acc(X, 1, im1), CF(NF_F32, 0.0)));
  /* Cv(i) +=! (0 <= i+k-1 < N) ? X(i+k-1) * W(k) : 0 */
  const nf_expr *pos = BIN(SUB, BIN(ADD, V(0), V(1)), CI(1));
  const nf_expr *g2 = BIN(AND, BIN(GE, pos, CI(0)), BIN(LT, pos, CI(N)));
  int64_t ext[1] = {Kw};
  stmt(Cv, NF_RED_SUM, "ik", 1, NULL, ext,
       nf_e_select(cx, g2, BIN(MUL, acc(X, 1, pos), acc(W, 1, V(1))), CF(NF_F32, 0.0)));
  /* Q(i) = D(i) != 0 ? 1000 // D(i) + 1000 % D(i) : -1, D with zeros. */
  const nf_expr *d = acc(D, 1, V(0));
  stmt(Q, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_select(cx, BIN(NE, d, CI(0)),
                   BIN(ADD, BIN(FLOORDIV, CI(1000), d), BIN(MOD, CI(1000), d)), CI(-1)));
  nf_array in[3] = {input(X, NF_F32), input(W, NF_F32), input(D, NF_I64)}, out[3];
  for (int64_t i = 0; i < N; i += 3) ((int64_t *)in[2].data)[i] = 0;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F32, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < N; i++) {
    ck_assert(fget(&out[0], i) == (i >= 1 ? fget(&in[0], i - 1) : 0.0));
    double s = 0;
    for (int64_t k = 0; k < Kw; k++) {
      int64_t p = i + k - 1;
      /* f32 mode: each f32 product is rounded, the sum is in double */
      s += (p >= 0 && p < N) ? (double)(float)(fget(&in[0], p) * fget(&in[1], k)) : 0.0;
    }
    ck_assert(fget(&out[1], i) == (float)s);
    int64_t dv = iget(&in[2], i);
    ck_assert(iget(&out[2], i) == (dv ? py_floordiv(1000, dv) + py_mod(1000, dv) : -1));
  }
  free_arrays(in, 3);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

/* Subterms shared between the condition, both branches and nested selects
 * are evaluated once per lane and only where needed. */
START_TEST(interp_select_shared_subterms) {
  const int64_t N = 263;
  seed(10);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int Y = tensor("Y", NF_F64, NF_T_INPUT, 1, N);
  int O = tensor("O", NF_F64, NF_T_OUTPUT, 1, N);
  const nf_expr *x = acc(X, 1, V(0)), *y = acc(Y, 1, V(0));
  const nf_expr *s = UN(EXP, BIN(MUL, x, y)); /* conditional only */
  const nf_expr *t = BIN(ADD, s, x);
  /* X(i*2) is out of bounds for i >= N/2; guarded by i < N/2. */
  const nf_expr *far = acc(X, 1, BIN(MUL, V(0), CI(2)));
  const nf_expr *half = BIN(LT, V(0), CI(N / 2));
  const nf_expr *inner = nf_e_select(cx, half, BIN(ADD, far, s), BIN(SUB, t, s));
  const nf_expr *e = nf_e_select(cx, BIN(GT, y, CF(NF_F64, 0.0)), BIN(MUL, t, s), inner);
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL, e);
  /* The guard of X(2i) is the outer condition: the inner select must only
   * see the outer select's lanes. */
  int O2 = tensor("O2", NF_F64, NF_T_OUTPUT, 1, N);
  stmt(O2, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_select(cx, half, nf_e_select(cx, BIN(GE, V(0), CI(1)), far, s), t));
  nf_array in[2] = {input(X, NF_F64), input(Y, NF_F64)}, out[2];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < N; i++) {
    double xv = fget(&in[0], i), yv = fget(&in[1], i);
    double sv = exp(xv * yv), tv = sv + xv, want;
    if (yv > 0)
      want = tv * sv;
    else if (i < N / 2)
      want = fget(&in[0], i * 2) + sv;
    else
      want = tv - sv;
    ck_assert(fget(&out[0], i) == want);
    want = i < N / 2 ? (i >= 1 ? fget(&in[0], 2 * i) : sv) : tv;
    ck_assert(fget(&out[1], i) == want);
  }
  free_arrays(in, 2);
  free_arrays(out, 2);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_nonaffine_index) {
  const int64_t N = 31;
  seed(11);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, (int64_t)16);
  int I = tensor("I", NF_I64, NF_T_INPUT, 1, N);
  int O = tensor("O", NF_F64, NF_T_OUTPUT, 1, N);
  int G2 = tensor("G", NF_F64, NF_T_OUTPUT, 1, N);
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL,
       BIN(ADD, acc(X, 1, BIN(FLOORDIV, V(0), CI(2))), acc(X, 1, BIN(MOD, V(0), CI(3)))));
  /* Gather through data: X(I(i) mod 16). */
  stmt(G2, NF_RED_NONE, "i", 0, NULL, NULL, acc(X, 1, BIN(MOD, acc(I, 1, V(0)), CI(16))));
  nf_array in[2] = {input(X, NF_F64), input(I, NF_I64)}, out[2];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < N; i++) {
    ck_assert(fget(&out[0], i) == fget(&in[0], i / 2) + fget(&in[0], i % 3));
    ck_assert(fget(&out[1], i) == fget(&in[0], py_mod(iget(&in[1], i), 16)));
  }
  free_arrays(in, 2);
  free_arrays(out, 2);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_multi_statement) {
  const int64_t N = 9, M = 4;
  seed(12);
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, N);
  int T = tensor("T", NF_F64, NF_T_LOCAL, 1, N);
  int U = tensor("U", NF_F64, NF_T_LOCAL, 2, N, N);
  int O = tensor("O", NF_F64, NF_T_OUTPUT, 1, N);
  int P = tensor("P", NF_F64, NF_T_OUTPUT, 2, M, N);
  stmt(T, NF_RED_NONE, "i", 0, NULL, NULL, BIN(MUL, acc(X, 1, V(0)), CF(NF_F64, 2.0)));
  stmt(U, NF_RED_NONE, "ij", 0, NULL, NULL,
       BIN(SUB, acc(T, 1, V(0)), UN(TANH, acc(T, 1, V(1)))));
  int64_t ext[1] = {N};
  stmt(O, NF_RED_SUM, "ij", 1, NULL, ext, acc(U, 2, V(0), V(1)));
  stmt(P, NF_RED_MAX, "abc", 1, NULL, ext,
       BIN(MUL, acc(U, 2, V(2), V(1)), nf_e_cast(cx, NF_F64, BIN(ADD, V(0), CI(1)))));
  nf_array in[1] = {input(X, NF_F64)}, out[2];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  double t[9], u[9][9];
  for (int i = 0; i < N; i++) t[i] = fget(&in[0], i) * 2.0;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) u[i][j] = t[i] - tanh(t[j]);
  for (int i = 0; i < N; i++) {
    double s = 0;
    for (int j = 0; j < N; j++) s += u[i][j];
    ck_assert(fget(&out[0], i) == s);
  }
  for (int a = 0; a < M; a++)
    for (int b = 0; b < N; b++) {
      double m = -INFINITY;
      for (int c = 0; c < N; c++) m = fmax(m, u[c][b] * (a + 1));
      ck_assert(fget(&out[1], a * N + b) == m);
    }
  ck_assert_int_eq(G->n_outputs, 2);
  free_arrays(in, 1);
  free_arrays(out, 2);
  nf_buf_free(&err);
}
END_TEST

/* A local f32 tensor is rounded when stored in F32 mode only. */
START_TEST(interp_f32_vs_f64_storage) {
  int X = tensor("X", NF_F32, NF_T_INPUT, 1, (int64_t)3);
  int T = tensor("T", NF_F32, NF_T_LOCAL, 1, (int64_t)3);
  int O = tensor("O", NF_F32, NF_T_OUTPUT, 0);
  const nf_expr *eps = CF(NF_F32, 1e-8);
  stmt(T, NF_RED_NONE, "i", 0, NULL, NULL, BIN(ADD, acc(X, 1, V(0)), eps));
  int64_t ext[1] = {3};
  stmt(O, NF_RED_SUM, "i", 1, NULL, ext, BIN(SUB, acc(T, 1, V(0)), acc(X, 1, V(0))));
  nf_array in[1] = {input(X, NF_F32)}, out[1];
  float xs[3] = {1.0f, -1.0f, 0.5f};
  memcpy(in[0].data, xs, sizeof xs);
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_OK);
  ck_assert_int_eq(out[0].dtype, NF_F32);
  ck_assert(fget(&out[0], 0) == 0.0);
  free_arrays(out, 1);
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_OK);
  ck_assert_int_eq(out[0].dtype, NF_F64);
  CHECK_CLOSE(fget(&out[0], 0), 3 * (double)1e-8f, 1e-12);
  ck_assert(fget(&out[0], 0) != 0.0);
  free_arrays(out, 1);
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_oob_error) {
  int X = tensor("X", NF_F64, NF_T_INPUT, 2, (int64_t)6, (int64_t)4);
  int T = tensor("T", NF_F64, NF_T_LOCAL, 1, (int64_t)4);
  int O = tensor("O", NF_F64, NF_T_OUTPUT, 2, (int64_t)4, (int64_t)4);
  stmt(T, NF_RED_NONE, "i", 0, NULL, NULL, acc(X, 2, V(0), V(0)));
  stmt(O, NF_RED_NONE, "ij", 0, NULL, NULL,
       BIN(ADD, acc(X, 2, BIN(ADD, V(0), CI(2)), BIN(SUB, V(1), CI(1))), acc(T, 1, V(0))));
  nf_array in[1] = {input(X, NF_F64)}, out[1];
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_EBOUNDS);
  ck_assert_str_eq(nf_buf_str(&err),
                   "statement 1 (O): index (2, -1) out of bounds for tensor X of shape [6, 4]");
  ck_assert_ptr_null(out[0].data);
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

/* Out of bounds through a non-affine index, and under a select whose
 * guard is wrong for one lane only. */
START_TEST(interp_oob_error_nonaffine) {
  int X = tensor("X", NF_F64, NF_T_INPUT, 1, (int64_t)5);
  int O = tensor("O", NF_F64, NF_T_OUTPUT, 1, (int64_t)12);
  const nf_expr *guard = BIN(LE, V(0), CI(10)); /* should be < 10 */
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL,
       nf_e_select(cx, guard, acc(X, 1, BIN(FLOORDIV, V(0), CI(2))), CF(NF_F64, 0.0)));
  nf_array in[1] = {input(X, NF_F64)}, out[1];
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_EBOUNDS);
  ck_assert_str_eq(nf_buf_str(&err),
                   "statement 0 (O): index (5) out of bounds for tensor X of shape [5]");
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_division_by_zero) {
  int X = tensor("X", NF_I64, NF_T_INPUT, 1, (int64_t)5);
  int Y = tensor("Y", NF_I64, NF_T_INPUT, 1, (int64_t)5);
  int O = tensor("O", NF_I64, NF_T_OUTPUT, 1, (int64_t)5);
  int P = tensor("P", NF_I64, NF_T_OUTPUT, 0);
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL, BIN(FLOORDIV, acc(X, 1, V(0)), acc(Y, 1, V(0))));
  int64_t ext[1] = {5};
  stmt(P, NF_RED_SUM, "k", 1, NULL, ext, BIN(MOD, acc(X, 1, V(0)), acc(Y, 1, V(0))));
  nf_array in[2] = {input(X, NF_I64), input(Y, NF_I64)}, out[2];
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_OK);
  free_arrays(out, 2);
  ((int64_t *)in[1].data)[3] = 0;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err), "statement 0 (O): integer division by zero at i=3");
  ck_assert_ptr_null(out[0].data);
  ck_assert_ptr_null(out[1].data);
  free_arrays(in, 2);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_modulo_by_zero_scalar) {
  int X = tensor("X", NF_I32, NF_T_INPUT, 1, (int64_t)5);
  int P = tensor("P", NF_I32, NF_T_OUTPUT, 0);
  int64_t lo[2] = {0, 1}, ext[2] = {2, 4};
  stmt(P, NF_RED_SUM, "ab", 2, lo, ext,
       BIN(MOD, acc(X, 1, V(0)), acc(X, 1, BIN(SUB, V(1), V(0)))));
  nf_array in[1] = {input(X, NF_I32)}, out[1];
  ((int32_t *)in[0].data)[2] = 0;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err), "statement 0 (P): integer modulo by zero at a=0, b=2");
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_input_errors) {
  int X = tensor("X", NF_F32, NF_T_INPUT, 2, (int64_t)4, (int64_t)3);
  int I = tensor("I", NF_I32, NF_T_INPUT, 1, (int64_t)2);
  int O = tensor("O", NF_F32, NF_T_OUTPUT, 2, (int64_t)4, (int64_t)3);
  stmt(O, NF_RED_NONE, "ij", 0, NULL, NULL,
       BIN(ADD, acc(X, 2, V(0), V(1)), nf_e_cast(cx, NF_F32, acc(I, 1, CI(0)))));
  nf_array in[2], out[1];
  nf_buf err = NF_BUF_INIT;
  int64_t bad_shape[2] = {3, 4}, ishape[1] = {2};

  ck_assert_int_eq(nf_array_alloc(&in[0], NF_F32, 2, bad_shape), NF_OK);
  ck_assert_int_eq(nf_array_alloc(&in[1], NF_I32, 1, ishape), NF_OK);
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_ETYPE);
  ck_assert_str_eq(nf_buf_str(&err), "input X: shape [3, 4] does not match the declared [4, 3]");
  nf_array_free(&in[0]);
  nf_buf_reset(&err);

  in[0] = input(X, NF_I64); /* ints for a float tensor: allowed, exact */
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_OK);
  ck_assert(fget(&out[0], 5) == (double)iget(&in[0], 5));
  free_arrays(out, 1);
  ((int64_t *)in[0].data)[2] = (1 << 24) + 1; /* not exact in f32 */
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err),
                   "input X: element 2 (16777217) is not exactly representable in f32");
  nf_buf_reset(&err);
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_OK); /* f64 storage */
  free_arrays(out, 1);
  nf_array_free(&in[1]);

  int64_t big[1] = {2};
  ck_assert_int_eq(nf_array_alloc(&in[1], NF_I64, 1, big), NF_OK);
  ((int64_t *)in[1].data)[1] = (int64_t)1 << 40;
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_ERANGE);
  ck_assert_str_eq(nf_buf_str(&err), "input I: element 1 (1099511627776) does not fit in i32");
  nf_buf_reset(&err);
  nf_array_free(&in[1]);

  ck_assert_int_eq(nf_array_alloc(&in[1], NF_F32, 1, big), NF_OK);
  ck_assert_int_eq(run(in, NF_INTERP_F64, out, &err), NF_ETYPE);
  ck_assert_str_eq(nf_buf_str(&err), "input I: cannot use a f32 array for a i32 tensor");
  ck_assert_ptr_null(out[0].data);
  free_arrays(in, 2);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_invalid_graph) {
  int X = tensor("X", NF_F32, NF_T_INPUT, 1, (int64_t)4);
  int O = tensor("O", NF_F32, NF_T_OUTPUT, 1, (int64_t)4);
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL, acc(X, 1, V(3))); /* var 3 of 1 */
  nf_array in[1] = {input(X, NF_F32)}, out[1];
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(run(in, NF_INTERP_F32, out, &err), NF_EINVAL);
  ck_assert_str_eq(nf_buf_str(&err), "statement 0: variable 3 out of range (statement has 1)");
  free_arrays(in, 1);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_i32_wrap) {
  const int64_t N = 17;
  seed(13);
  int X = tensor("X", NF_I32, NF_T_INPUT, 1, N);
  int O = tensor("O", NF_I32, NF_T_OUTPUT, 1, N);
  int S = tensor("S", NF_I32, NF_T_OUTPUT, 0);
  int D = tensor("D", NF_I32, NF_T_OUTPUT, 1, N);
  const nf_expr *x = acc(X, 1, V(0));
  /* (x * 2^30) // 3: the product wraps in i32 before the division. */
  stmt(O, NF_RED_NONE, "i", 0, NULL, NULL,
       BIN(FLOORDIV, BIN(MUL, x, nf_e_const_i(cx, NF_I32, 1 << 30)), nf_e_const_i(cx, NF_I32, 3)));
  int64_t ext[1] = {N};
  stmt(S, NF_RED_SUM, "k", 1, NULL, ext, BIN(MUL, x, nf_e_const_i(cx, NF_I32, 1 << 28)));
  stmt(D, NF_RED_NONE, "i", 0, NULL, NULL,
       BIN(FLOORDIV, nf_e_const_i(cx, NF_I32, INT32_MIN), nf_e_const_i(cx, NF_I32, -1)));
  nf_array in[1] = {input(X, NF_I32)}, out[3];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  uint32_t s = 0;
  for (int64_t i = 0; i < N; i++) {
    int64_t xv = iget(&in[0], i);
    int32_t p = (int32_t)((uint32_t)xv * (1u << 30));
    ck_assert(iget(&out[0], i) == py_floordiv(p, 3));
    s += (uint32_t)xv * (1u << 28);
    ck_assert(iget(&out[2], i) == INT32_MIN);
  }
  ck_assert(iget(&out[1], 0) == (int32_t)s);
  free_arrays(in, 1);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_nan_propagation) {
  const int64_t R = 4, K = 7;
  seed(14);
  int X = tensor("X", NF_F64, NF_T_INPUT, 2, R, K);
  int Mx = tensor("Mx", NF_F64, NF_T_OUTPUT, 1, R);
  int Mn = tensor("Mn", NF_F64, NF_T_OUTPUT, 1, R);
  int Bm = tensor("Bm", NF_F64, NF_T_OUTPUT, 2, R, K);
  int64_t ext[1] = {K};
  stmt(Mx, NF_RED_MAX, "ik", 1, NULL, ext, acc(X, 2, V(0), V(1)));
  stmt(Mn, NF_RED_MIN, "ik", 1, NULL, ext, acc(X, 2, V(0), V(1)));
  stmt(Bm, NF_RED_NONE, "ik", 0, NULL, NULL,
       BIN(MAX, acc(X, 2, V(0), V(1)), CF(NF_F64, 0.0)));
  nf_array in[1] = {input(X, NF_F64)}, out[3];
  ((double *)in[0].data)[1 * K + 0] = NAN; /* first element of row 1 */
  ((double *)in[0].data)[2 * K + 4] = NAN; /* middle of row 2 */
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  for (int64_t i = 0; i < R; i++) {
    int has_nan = i == 1 || i == 2;
    double mx = -INFINITY, mn = INFINITY;
    for (int64_t k = 0; k < K; k++) {
      mx = fmax(mx, fget(&in[0], i * K + k));
      mn = fmin(mn, fget(&in[0], i * K + k));
    }
    ck_assert(has_nan ? isnan(fget(&out[0], i)) : fget(&out[0], i) == mx);
    ck_assert(has_nan ? isnan(fget(&out[1], i)) : fget(&out[1], i) == mn);
  }
  ck_assert(isnan(fget(&out[2], 1 * K + 0)) && isnan(fget(&out[2], 2 * K + 4)));
  ck_assert(fget(&out[2], 0) == fmax(fget(&in[0], 0), 0.0));
  free_arrays(in, 1);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

/* Shapes with zero elements, scalars without variables, a rank-3 output
 * with a 1-wide last dimension (blocks of one lane). */
START_TEST(interp_degenerate_shapes) {
  seed(15);
  int X = tensor("X", NF_F64, NF_T_INPUT, 3, (int64_t)3, (int64_t)5, (int64_t)1);
  int E = tensor("E", NF_F64, NF_T_OUTPUT, 2, (int64_t)0, (int64_t)3);
  int Y = tensor("Y", NF_F64, NF_T_OUTPUT, 3, (int64_t)5, (int64_t)3, (int64_t)1);
  int S = tensor("S", NF_F64, NF_T_OUTPUT, 0);
  stmt(E, NF_RED_NONE, "ij", 0, NULL, NULL, acc(X, 3, V(0), V(1), CI(7)));
  stmt(Y, NF_RED_NONE, "abc", 0, NULL, NULL, acc(X, 3, V(1), V(0), V(2)));
  stmt(S, NF_RED_NONE, "", 0, NULL, NULL, UN(EXP, acc(X, 3, CI(2), CI(4), CI(0))));
  nf_array in[1] = {input(X, NF_F64)}, out[3];
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(out[0].numel, 0);
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 3; b++) ck_assert(fget(&out[1], a * 3 + b) == fget(&in[0], b * 5 + a));
  ck_assert(fget(&out[2], 0) == exp(fget(&in[0], 14)));
  free_arrays(in, 1);
  free_arrays(out, 3);
  nf_buf_free(&err);
}
END_TEST

START_TEST(interp_perf_matmul_256) {
  const int64_t n = 256;
  seed(16);
  int A = tensor("A", NF_F32, NF_T_INPUT, 2, n, n);
  int B = tensor("B", NF_F32, NF_T_INPUT, 2, n, n);
  int C = tensor("C", NF_F32, NF_T_OUTPUT, 2, n, n);
  int64_t ext[1] = {n};
  stmt(C, NF_RED_SUM, "ijk", 1, NULL, ext,
       BIN(MUL, acc(A, 2, V(0), V(2)), acc(B, 2, V(2), V(1))));
  nf_array in[2] = {input(A, NF_F32), input(B, NF_F32)}, out[1];
  nf_buf err = NF_BUF_INIT;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = run(in, NF_INTERP_F32, out, &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  fprintf(stderr, "interp: 256x256x256 f32 matmul evaluated in %.3f s\n", secs);
  for (int64_t probe = 0; probe < 8; probe++) {
    int64_t i = (probe * 37) % n, j = (probe * 101 + 5) % n;
    double s = 0;
    for (int64_t k = 0; k < n; k++)
      s += (double)(float)(fget(&in[0], i * n + k) * fget(&in[1], k * n + j));
    ck_assert(fget(&out[0], i * n + j) == (float)s);
  }
  free_arrays(in, 2);
  free_arrays(out, 1);
  nf_buf_free(&err);
}
END_TEST


/* ---- random graphs against a naive scalar evaluator ---- */

/* Evaluates e for one assignment of the variables, recursively and
 * lazily; inputs are f64 / i64 arrays indexed by tensor id.  Returns 0 on
 * an out-of-bounds access (the generator guards every access, so that is
 * a test failure). */
static int ref_eval(const nf_expr *e, const int64_t *vars, const nf_array *ins,
                    double *f, int64_t *i) {
  double fa = 0, fb = 0;
  int64_t ia = 0, ib = 0;
  int fl = e->dtype == NF_F64;
  if (e->op == NF_OP_CONST) {
    if (fl) *f = e->u.f; else *i = e->u.i;
    return 1;
  }
  if (e->op == NF_OP_VAR) {
    *i = vars[e->u.var];
    return 1;
  }
  if (e->op == NF_OP_ACCESS) {
    const nf_array *a = &ins[e->u.tensor];
    int64_t off = 0;
    for (int d = 0; d < e->n_args; d++) {
      int64_t x;
      if (!ref_eval(e->args[d], vars, ins, &fa, &x)) return 0;
      if (x < 0 || x >= a->shape[d]) return 0;
      off = off * a->shape[d] + x;
    }
    if (fl) *f = ((double *)a->data)[off]; else *i = ((int64_t *)a->data)[off];
    return 1;
  }
  if (e->op == NF_OP_SELECT) {
    if (!ref_eval(e->args[0], vars, ins, &fa, &ia)) return 0;
    return ref_eval(e->args[ia ? 1 : 2], vars, ins, f, i);
  }
  int afl = e->args[0]->dtype == NF_F64;
  if (!ref_eval(e->args[0], vars, ins, &fa, &ia)) return 0;
  if (e->n_args > 1 && !ref_eval(e->args[1], vars, ins, &fb, &ib)) return 0;
  switch (e->op) {
  case NF_OP_NEG: if (fl) *f = -fa; else *i = -ia; break;
  case NF_OP_ABS: *f = fabs(fa); break;
  case NF_OP_TANH: *f = tanh(fa); break;
  case NF_OP_EXP: *f = exp(fa); break;
  case NF_OP_CAST: *f = (double)ia; break;
  case NF_OP_ADD: if (fl) *f = fa + fb; else *i = ia + ib; break;
  case NF_OP_SUB: if (fl) *f = fa - fb; else *i = ia - ib; break;
  case NF_OP_MUL: if (fl) *f = fa * fb; else *i = ia * ib; break;
  case NF_OP_DIV: *f = fa / fb; break;
  case NF_OP_FLOORDIV: if (fl) *f = floor(fa / fb); else *i = py_floordiv(ia, ib); break;
  case NF_OP_MOD: if (fl) *f = fa - fb * floor(fa / fb); else *i = py_mod(ia, ib); break;
  case NF_OP_MIN: *f = (isnan(fa) || isnan(fb)) ? NAN : fmin(fa, fb); break;
  case NF_OP_MAX: *f = (isnan(fa) || isnan(fb)) ? NAN : fmax(fa, fb); break;
  case NF_OP_LT: *i = afl ? fa < fb : ia < ib; break;
  case NF_OP_GE: *i = afl ? fa >= fb : ia >= ib; break;
  case NF_OP_AND: *i = ia && ib; break;
  default: ck_abort_msg("ref_eval: unexpected op %d", e->op);
  }
  return 1;
}

/* A random i64 index expression over variables 0..nv-1 (may be non-affine). */
static const nf_expr *rand_index(int nv) {
  const nf_expr *v = V((uint32_t)(rng() % (uint64_t)nv));
  const nf_expr *w = V((uint32_t)(rng() % (uint64_t)nv));
  switch (rng() % 7) {
  case 0: return v;
  case 1: return BIN(ADD, v, CI((int64_t)(rng() % 5) - 2));
  case 2: return BIN(SUB, BIN(MUL, v, CI(2)), w);
  case 3: return BIN(FLOORDIV, v, CI(2));
  case 4: return BIN(MOD, BIN(ADD, v, w), CI(3));
  case 5: return CI((int64_t)(rng() % 4));
  default: return BIN(SUB, CI(3), v);
  }
}

/* guard(idx) ? T(idx) : c for input tensor t. */
static const nf_expr *rand_access(int t, int nv) {
  const nf_tensor *ts = &G->tensors[t];
  const nf_expr *idx[NF_MAX_RANK] = {0}, *guard = NULL;
  for (int d = 0; d < ts->rank; d++) {
    idx[d] = rand_index(nv);
    const nf_expr *ok = BIN(AND, BIN(GE, idx[d], CI(0)), BIN(LT, idx[d], CI(ts->shape[d])));
    guard = guard ? BIN(AND, guard, ok) : ok;
  }
  const nf_expr *a = nf_e_access(cx, (uint32_t)t, NF_F64, ts->rank, idx);
  return guard ? nf_e_select(cx, guard, a, CF(NF_F64, 0.5)) : a;
}

static const nf_expr *rand_expr(int depth, int nv, int n_in, const nf_expr **pool,
                                int *n_pool) {
  const nf_expr *e;
  if (*n_pool > 0 && rng() % 4 == 0) return pool[rng() % (uint64_t)*n_pool];
  if (depth == 0 || rng() % 5 == 0) {
    switch (rng() % 4) {
    case 0: e = CF(NF_F64, rnd()); break;
    case 1: e = nf_e_cast(cx, NF_F64, rand_index(nv)); break;
    default: e = rand_access((int)(rng() % (uint64_t)n_in), nv); break;
    }
  } else {
    const nf_expr *a = rand_expr(depth - 1, nv, n_in, pool, n_pool);
    const nf_expr *b = rand_expr(depth - 1, nv, n_in, pool, n_pool);
    static const nf_op un[] = {NF_OP_NEG, NF_OP_ABS, NF_OP_TANH, NF_OP_EXP};
    static const nf_op bin[] = {NF_OP_ADD, NF_OP_SUB, NF_OP_MUL, NF_OP_DIV, NF_OP_FLOORDIV,
                                NF_OP_MOD, NF_OP_MIN, NF_OP_MAX};
    switch (rng() % 4) {
    case 0: e = nf_e_unary(cx, un[rng() % 4], UN(TANH, a)); break;
    case 1: e = nf_e_select(cx, BIN(LT, a, b), b, rand_expr(depth - 1, nv, n_in, pool, n_pool)); break;
    default: e = nf_e_binary(cx, bin[rng() % 8], a, b); break;
    }
  }
  if (*n_pool < 64) pool[(*n_pool)++] = e;
  return e;
}

static int same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

START_TEST(interp_random_graphs_vs_naive) {
  for (int round = 0; round < 150; round++) {
    setup();
    seed(1000 + (uint64_t)round);
    int X = tensor("X", NF_F64, NF_T_INPUT, 2, (int64_t)5, (int64_t)7);
    int Y = tensor("Y", NF_F64, NF_T_INPUT, 1, (int64_t)(rng() % 300 + 1));
    (void)X;
    (void)Y;
    int rank = (int)(rng() % 3), n_red = (int)(rng() % 3);
    int64_t shape[2] = {(int64_t)(rng() % 4 + 1), (int64_t)(rng() % 2 ? rng() % 300 + 1 : rng() % 9 + 1)};
    if (rank == 1) shape[0] = shape[1];
    int O = rank == 0 ? tensor("O", NF_F64, NF_T_OUTPUT, 0)
            : rank == 1 ? tensor("O", NF_F64, NF_T_OUTPUT, 1, shape[0])
                        : tensor("O", NF_F64, NF_T_OUTPUT, 2, shape[0], shape[1]);
    int64_t lo[2], ext[2];
    for (int r = 0; r < n_red; r++) {
      lo[r] = (int64_t)(rng() % 3) - 1;
      ext[r] = (int64_t)(rng() % 5);
      if (rank == 0 && r == n_red - 1) ext[r] = (int64_t)(rng() % 400);
    }
    nf_redop red = n_red == 0 ? NF_RED_NONE : (rng() % 2 ? NF_RED_SUM : NF_RED_MAX);
    int nv = rank + n_red;
    const nf_expr *pool[64];
    int n_pool = 0;
    const nf_expr *rhs = nv ? rand_expr(4, nv, 2, pool, &n_pool) : CF(NF_F64, 1.0);
    stmt(O, red, NULL, n_red, lo, ext, rhs);
    nf_array in[2] = {input(0, NF_F64), input(1, NF_F64)}, out[1];
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(run(in, NF_INTERP_F64, out, &err) == NF_OK, "round %d: %s", round,
                  nf_buf_str(&err));
    int64_t n_out = out[0].numel;
    int64_t oshape[2] = {rank == 2 ? shape[0] : 1, rank >= 1 ? (rank == 1 ? shape[0] : shape[1]) : 1};
    for (int64_t o = 0; o < n_out; o++) {
      int64_t vars[4];
      if (rank == 2) {
        vars[0] = o / oshape[1];
        vars[1] = o % oshape[1];
      } else if (rank == 1) {
        vars[0] = o;
      }
      double s = red == NF_RED_MAX ? -INFINITY : 0.0;
      int64_t n_iter = 1;
      for (int r = 0; r < n_red; r++) n_iter *= ext[r];
      for (int64_t it = 0; it < n_iter; it++) {
        int64_t rem = it;
        for (int r = n_red - 1; r >= 0; r--) {
          vars[rank + r] = lo[r] + rem % ext[r];
          rem /= ext[r];
        }
        double f = 0;
        int64_t iv = 0;
        ck_assert_msg(ref_eval(rhs, vars, in, &f, &iv), "round %d: naive evaluation out of bounds",
                      round);
        if (red == NF_RED_NONE) s = f;
        else if (red == NF_RED_SUM) s += f;
        else s = (isnan(s) || isnan(f)) ? NAN : fmax(s, f);
      }
      ck_assert_msg(same_value(fget(&out[0], o), s), "round %d element %lld: %.17g vs %.17g",
                    round, (long long)o, fget(&out[0], o), s);
    }
    free_arrays(in, 2);
    free_arrays(out, 1);
    nf_buf_free(&err);
    teardown();
  }
}
END_TEST

/* ---- bounds ---- */

/* A def of a .nf source (lib/<file> when file, else text) instantiated
 * in cx with every input of rank 1 and n elements but the last, hp, of
 * n_hp; sets G. */
static void inst_def(const char *file, const char *text, const char *def, int64_t n,
                     int64_t n_hp) {
  nf_module_free(mod);
  nf_module *m = mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc;
  if (file) {
    char path[4096];
    const char *lib = getenv("NEOFLOW_LIB");
    ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
    snprintf(path, sizeof path, "%s/%s", lib, file);
    rc = nf_module_load_file(m, path, d);
  } else {
    rc = nf_module_load_source(m, "bounds.nf", text, d);
  }
  ck_assert_msg(rc == NF_OK, "%s", nf_diag_text(d));
  const char *names[16];
  int n_in = nf_module_def_inputs(m, def, names, 16);
  ck_assert_int_gt(n_in, 0);
  nf_arg_shape sh[16];
  memset(sh, 0, sizeof sh);
  for (int k = 0; k < n_in; k++) {
    sh[k].rank = 1;
    sh[k].dims[0] = !strcmp(names[k], "hp") ? n_hp : n;
  }
  nf_inst_opts o = {.n_shapes = n_in, .shapes = sh};
  rc = nf_module_instantiate(m, def, &o, cx, &G, d);
  ck_assert_msg(rc == NF_OK, "%s: %s", def, nf_diag_text(d));
  nf_diag_free(d);
}

/* Fills every f32 input uniformly in [-1, 1), as the search's check does. */
static void check_inputs(nf_array *in) {
  for (uint32_t k = 0; k < G->n_inputs; k++) {
    const nf_tensor *t = &G->tensors[G->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], NF_F32, t->rank, t->shape), NF_OK);
    for (int64_t i = 0; i < in[k].numel; i++)
      ((float *)in[k].data)[i] = (float)(2 * ((double)(rng() >> 11) / 9007199254740992.0) - 1);
  }
}

static int same_class(double a, double b) {
  return (isnan(a) && isnan(b)) || (isinf(a) && a == b);
}

/* Evaluates G in f64 with bounds and in f32; asserts that every f32 value
 * lies within the finite bound of its element; returns the number of
 * undetermined (infinite bound) elements and in *worst_rel the largest
 * bound relative to the largest value of its output. */
static int64_t bounds_cover(const nf_array *in, double *worst_rel) {
  nf_array ref[8], f32[8];
  double *b[8];
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_le(G->n_outputs, 8);
  ck_assert_msg(nf_interp_run_bounded(G, in, ref, b, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_msg(run(in, NF_INTERP_F32, f32, &err) == NF_OK, "%s", nf_buf_str(&err));
  int64_t undetermined = 0;
  *worst_rel = 0;
  for (uint32_t k = 0; k < G->n_outputs; k++) {
    const char *nm = G->tensors[G->outputs[k]].name;
    ck_assert_ptr_nonnull(b[k]);
    double mx = 1e-30;
    for (int64_t i = 0; i < ref[k].numel; i++)
      if (isfinite(fget(&ref[k], i))) mx = fmax(mx, fabs(fget(&ref[k], i)));
    for (int64_t i = 0; i < ref[k].numel; i++) {
      double w = fget(&ref[k], i), v = fget(&f32[k], i), e = b[k][i];
      ck_assert_msg(e >= 0, "%s[%lld]: bound %g", nm, (long long)i, e);
      if (e == INFINITY) {
        undetermined++;
        continue;
      }
      if (!isfinite(w)) {
        ck_assert_msg(same_class(v, w), "%s[%lld]: f32 %g, reference %g (bound %g)", nm,
                      (long long)i, v, w, e);
        continue;
      }
      ck_assert_msg(fabs(v - w) <= e, "%s[%lld]: f32 %.9g, reference %.17g, bound %.3g", nm,
                    (long long)i, v, w, e);
      if (e / mx > *worst_rel) *worst_rel = e / mx;
    }
    free(b[k]);
  }
  free_arrays(ref, (int)G->n_outputs);
  free_arrays(f32, (int)G->n_outputs);
  nf_buf_free(&err);
  return undetermined;
}

/* Every float operator, conditioned well and badly (cancellations feeding
 * divisions, square roots and logarithms of what may turn negative). */
static const char bound_defs[] =
    "def ops(A: f32[N], B: f32[N], C: f32[N]) -> (Y0: f32[N], Y1: f32[N], Y2: f32[N],\n"
    "    Y3: f32[N], Y4: f32[N], Y5: f32[N], Y6: f32[N], Y7: f32[N]) {\n"
    "  Y0(i) = exp(3.0 * A(i)) / (B(i) - A(i) * C(i))\n"
    "  Y1(i) = log(A(i) * B(i) + 0.1) + sqrt(A(i) + B(i) * C(i))\n"
    "  Y2(i) = tanh(4.0 * A(i) - B(i)) * sigmoid(A(i) / C(i)) + erf(B(i) + C(i))\n"
    "  Y3(i) = pow(abs(A(i)) + 0.1, B(i) * 3.0) - rsqrt(abs(C(i) - B(i)))\n"
    "  Y4(i) = floor(7.0 * A(i) + B(i)) + ceil(C(i) * 5.0) + (A(i) * 3.0) % (B(i) + 2.0)\n"
    "  Y5(i) = A(i) > B(i) ? min(A(i) * C(i), B(i)) : max(C(i) / 0.7, 1.0 - A(i))\n"
    "  Y6(i) +=! A(k) * B((i + k) % N) - 0.01 * C(k)\n"
    "  Y7(i) = 1.0 / Y6(i) + A(i) * B(i) - A(i) * B(i)\n"
    "}\n"
    "def red(A: f32[N], B: f32[N], C: f32[N]) -> (P: f32[N], M: f32[N], S: f32[]) {\n"
    "  P(i) *=! 1.0 + 0.3 * A((i + k) % N) * B((i + 2 * k) % N) where k in 0:7\n"
    "  M(i) max=! A((i + k) % N) * C((k + 1) % N) where k in 0:9\n"
    "  S() +=! A(k) * A(k) - B(k) * B(k)\n"
    "}\n"
    "def exact(A: f32[N], B: f32[N], C: f32[N]) -> (Y: f32[N], Z: f32[N]) {\n"
    "  Y(i) = A(N - 1 - i)\n"
    "  Z(i) = max(-A(i), abs(B(i))) < C(i) ? C(i) : -B(i)\n"
    "}\n"
    "def certain(A: f32[N], B: f32[N], C: f32[N]) -> (Y: f32[N], S: f32[]) {\n"
    "  Y(i) = sqrt(A(i) * B(i) - 2.0) * C(i) + 1.0\n"
    "  S() +=! (log(C(k)) + A(k) * B(k)) / 3.0\n"
    "}\n";

START_TEST(interp_bounds_cover_f32) {
  static const struct {
    const char *file, *def;
  } cases[] = {{"optim.nf", "adam"}, {"optim.nf", "adamw"}, {"optim.nf", "sgd"},
               {"optim.nf", "sgd_plain"}, {NULL, "ops"}, {NULL, "red"}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int adam = cases[c].file && !strncmp(cases[c].def, "adam", 4);
    inst_def(cases[c].file, bound_defs, cases[c].def, 4099, adam ? 6 : 3);
    for (uint64_t sd = 1; sd <= 4; sd++) {
      seed(sd);
      nf_array in[8];
      check_inputs(in);
      double worst;
      int64_t und = bounds_cover(in, &worst);
      /* a check can always judge some elements */
      int64_t n_el = 0;
      for (uint32_t k = 0; k < G->n_outputs; k++)
        n_el += nf_tensor_numel(&G->tensors[G->outputs[k]]);
      ck_assert_msg(und < n_el, "%s: every element undetermined", cases[c].def);
      if (sd == 1)
        fprintf(stderr, "bounds %s: %lld of %lld elements undetermined\n", cases[c].def,
                (long long)und, (long long)n_el);
      free_arrays(in, (int)G->n_inputs);
    }
  }
}
END_TEST

/* Issue 31, item 4, at the interpreter: the search's check inputs for
 * adam over 100000 elements, seed 1 (drawn as daemon/search/search.c's
 * problem_make does: nf_sk_rand, uniform in [-1, 1), inputs in order).
 * The denominator sqrt(V2) hp(1) + hp(4) is 4e-7 at element 94521, where
 * P2 is 795098 in f64, 791628 in the kernels (FMA) and 774111 in the
 * interpreter's f32: every f32 evaluation is several 1e-3 off in relative
 * L2, the old check's failure.  The bound there is large
 * enough to hold the f32 value, and what lies beyond the bounds is 0. */
static uint64_t sk_rand(uint64_t *s) { /* nf_sk_rand (sketch.c) */
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

START_TEST(interp_bounds_adam_check_inputs) {
  inst_def("optim.nf", NULL, "adam", 100000, 6);
  nf_array in[5], ref[3], f32[3];
  double *b[3];
  uint64_t r = 1 * 0x9e3779b97f4a7c15ull + 7;
  for (uint32_t k = 0; k < 5; k++) {
    const nf_tensor *t = &G->tensors[G->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], NF_F32, t->rank, t->shape), NF_OK);
    for (int64_t i = 0; i < in[k].numel; i++)
      ((float *)in[k].data)[i] = (float)(2 * ((double)(sk_rand(&r) >> 11) / 9007199254740992.0) - 1);
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_interp_run_bounded(G, in, ref, b, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_msg(run(in, NF_INTERP_F32, f32, &err) == NF_OK, "%s", nf_buf_str(&err));
  const int64_t j = 94521;
  double w = fget(&ref[0], j), v = fget(&f32[0], j);
  ck_assert_msg(fabs(w - 795098.1) < 1 && fabs(v - w) > 1e-3 * w, "P2[%lld]: %.9g, f32 %.9g",
                (long long)j, w, v);
  ck_assert_msg(fabs(v - w) <= b[0][j] && b[0][j] < INFINITY, "bound %g", b[0][j]);
  double num = 0, num_beyond = 0, den = 0;
  for (int64_t i = 0; i < ref[0].numel; i++) {
    double wi = fget(&ref[0], i), vi = fget(&f32[0], i);
    if (!isfinite(wi) || !(b[0][i] < INFINITY)) continue;
    double dd = fabs(vi - wi), ex = fmax(dd - b[0][i], 0);
    num += dd * dd;
    num_beyond += ex * ex;
    den += wi * wi;
  }
  ck_assert_msg(sqrt(num / den) > 4e-3, "relative L2 %g", sqrt(num / den));
  ck_assert(num_beyond == 0);
  for (int k = 0; k < 3; k++) free(b[k]);
  free_arrays(ref, 3);
  free_arrays(f32, 3);
  free_arrays(in, 5);
  nf_buf_free(&err);
}
END_TEST

/* On inputs in Adam's domain the bounds are finite and tight: a few u of
 * the output's size. */
START_TEST(interp_bounds_tight) {
  inst_def("optim.nf", NULL, "adam", 1001, 6);
  seed(3);
  nf_array in[5];
  check_inputs(in);
  /* P, G as drawn; M small, V >= 0 (second moments); hp at step 10 of
   * lr 1e-3, betas 0.9, 0.999, eps 1e-8, weight decay 1e-2 */
  for (int64_t i = 0; i < in[2].numel; i++) ((float *)in[2].data)[i] *= 0.1f;
  for (int64_t i = 0; i < in[3].numel; i++)
    ((float *)in[3].data)[i] *= ((float *)in[3].data)[i] * 0.01f;
  double c1 = 1 - pow(0.9, 10), c2 = 1 - pow(0.999, 10);
  const float hp[6] = {(float)(1e-3 / c1), (float)(1 / sqrt(c2)), 0.9f, 0.999f, 1e-8f, 1e-2f};
  memcpy(in[4].data, hp, sizeof hp);
  double worst;
  ck_assert_int_eq(bounds_cover(in, &worst), 0);
  fprintf(stderr, "bounds adam in its domain: at most %.3g u of the output\n", worst / 0x1p-24);
  ck_assert_msg(worst <= 64 * 0x1p-24, "a bound of %.3g of its output", worst);
  free_arrays(in, 5);

  /* exact operations have bound 0 */
  teardown();
  setup();
  inst_def(NULL, bound_defs, "exact", 37, 3);
  check_inputs(in);
  nf_array ref[2];
  double *b[2];
  ck_assert_int_eq(nf_interp_run_bounded(G, in, ref, b, NULL), NF_OK);
  for (int k = 0; k < 2; k++) {
    for (int64_t i = 0; i < ref[k].numel; i++) ck_assert(b[k][i] == 0);
    free(b[k]);
  }
  free_arrays(ref, 2);
  free_arrays(in, 3);

  /* certain NaN: the square root of what is certainly negative, and a sum
   * with a certainly NaN term (a log of an input below zero) among
   * inexact ones (a loss over check inputs out of its domain): bound 0,
   * to be matched, never undetermined */
  teardown();
  setup();
  inst_def(NULL, bound_defs, "certain", 37, 3);
  check_inputs(in);
  ((float *)in[2].data)[5] = -0.5f;
  ck_assert_int_eq(nf_interp_run_bounded(G, in, ref, b, NULL), NF_OK);
  for (int64_t i = 0; i < ref[0].numel; i++) ck_assert(isnan(fget(&ref[0], i)) && b[0][i] == 0);
  ck_assert(isnan(fget(&ref[1], 0)) && b[1][0] == 0);
  free(b[0]);
  free(b[1]);
  free_arrays(ref, 2);
  free_arrays(in, 3);
}
END_TEST

static Suite *interp_suite(void) {
  Suite *s = suite_create("interp");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, interp_matmul);
  tcase_add_test(tc, interp_scalar_reduction);
  tcase_add_test(tc, interp_transpose_broadcast);
  tcase_add_test(tc, interp_unary_math);
  tcase_add_test(tc, interp_unary_edges);
  tcase_add_test(tc, interp_python_division_helper);
  tcase_add_test(tc, interp_binary_ops);
  tcase_add_test(tc, interp_casts);
  tcase_add_test(tc, interp_cast_error);
  tcase_add_test(tc, interp_bool_logic);
  tcase_add_test(tc, interp_select_lazy);
  tcase_add_test(tc, interp_select_shared_subterms);
  tcase_add_test(tc, interp_nonaffine_index);
  tcase_add_test(tc, interp_multi_statement);
  tcase_add_test(tc, interp_f32_vs_f64_storage);
  tcase_add_test(tc, interp_oob_error);
  tcase_add_test(tc, interp_oob_error_nonaffine);
  tcase_add_test(tc, interp_division_by_zero);
  tcase_add_test(tc, interp_modulo_by_zero_scalar);
  tcase_add_test(tc, interp_input_errors);
  tcase_add_test(tc, interp_invalid_graph);
  tcase_add_test(tc, interp_i32_wrap);
  tcase_add_test(tc, interp_nan_propagation);
  tcase_add_test(tc, interp_degenerate_shapes);
  tcase_add_test(tc, interp_perf_matmul_256);
  tcase_add_test(tc, interp_bounds_cover_f32);
  tcase_add_test(tc, interp_bounds_tight);
  tcase_add_test(tc, interp_bounds_adam_check_inputs);
  suite_add_tcase(s, tc);
  /* These build one graph per case themselves. */
  TCase *tm = tcase_create("multi");
  tcase_add_test(tm, interp_reductions);
  tcase_add_test(tm, interp_int_reduction_identities);
  tcase_add_test(tm, interp_random_graphs_vs_naive);
  suite_add_tcase(s, tm);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(interp_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
