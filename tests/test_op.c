/* test_op.c - operators (neoflow.h, client/op.c): one def run forward and
 * backward on the caller's buffers.
 *
 *  - the forward of examples/workloads.nf's lltm_step (two outputs, five
 *    inputs) agrees with the reference interpreter in f64;
 *  - its gradients, given the outputs' gradients, agree with central
 *    finite differences of the forward (run in f64: a def declared in f32
 *    given f64 tensors runs in f64 throughout), and the f32 run agrees
 *    with the f64 one;
 *  - asking for one input's gradient gives the same values as asking for
 *    all of them;
 *  - a backward takes the forward's kept values when its forward was the
 *    last of those shapes, and recomputes them when another came between
 *    (an operator used twice): the same gradients either way;
 *  - buffers at addresses the element type does not suit are copied;
 *  - a new shape specialises (more kernel entries), an old one is found
 *    again, and more shapes than NF_OPERATOR_SPECS drop the oldest;
 *  - integer inputs (a gather's indices) pass through, and have no
 *    gradient; a def whose gradient cannot be formed runs forward and its
 *    backward says why;
 *  - bad calls (a shape the def refuses, a wrong element type, a gradient
 *    of an integer input, a missing buffer, an unknown def, a GPU device)
 *    are errors with messages that name the input;
 *  - with a daemon: the kernels arrive, pass their canaries and are
 *    swapped in, and the results stay the same. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neoflow/neoflow.h"
#include "nf_interp.h"
#include "nf_lang.h"
#include "nf_test_daemon.h"

static uint64_t rng_state = 7;

static double unif(void) {
  rng_state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = rng_state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1.0p-53;
}

static nf_model *load_workloads(void) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  char path[4096];
  snprintf(path, sizeof path, "%s/../examples/workloads.nf", lib);
  char *err = NULL;
  nf_model *m = nf_model_load(path, &err);
  ck_assert_msg(m != NULL, "%s: %s", path, err ? err : "?");
  return m;
}

static nf_operator *open_op(nf_model *m, const char *def, const nf_session_opts *o) {
  char *err = NULL;
  nf_operator *op = nf_operator_new(m, def, o, &err);
  ck_assert_msg(op != NULL, "operator %s: %s", def, err ? err : "?");
  ck_assert_ptr_null(err);
  return op;
}

static nf_session_opts quiet_opts(void) {
  nf_session_opts o;
  memset(&o, 0, sizeof o);
  o.daemon = "none";
  o.threads = 1;
  return o;
}

/* lltm_step's inputs X[B, I], H[B, S], C[B, S], W[3S, I + S], b[3S] in
 * element type e, with random data (doubles in d, the same values). */
enum { NIN = 5, NOUT = 2 };

typedef struct case_t {
  nf_view in[NIN], out[NOUT], dout[NOUT], din[NIN];
  uint64_t saved; /* the token of its last forward */
} case_t;

static size_t numel(const nf_view *v) {
  size_t n = 1;
  for (int r = 0; r < v->rank; r++) n *= (size_t)v->dims[r];
  return n;
}

static void view_init(nf_view *v, nf_elem e, int rank, const int64_t *dims) {
  memset(v, 0, sizeof *v);
  v->elem = e;
  v->rank = rank;
  memcpy(v->dims, dims, sizeof(int64_t) * (size_t)rank);
  v->data = calloc(numel(v) + 1, e == NF_ELEM_F64 ? 8 : 4);
}

static double get(const nf_view *v, size_t i) {
  return v->elem == NF_ELEM_F64 ? ((double *)v->data)[i] : ((float *)v->data)[i];
}

static void set(nf_view *v, size_t i, double x) {
  if (v->elem == NF_ELEM_F64) ((double *)v->data)[i] = x;
  else ((float *)v->data)[i] = (float)x;
}

static void case_init(case_t *c, nf_elem e, int64_t B, int64_t I, int64_t S) {
  memset(c, 0, sizeof *c);
  int64_t dims[NIN][2] = {{B, I}, {B, S}, {B, S}, {3 * S, I + S}, {3 * S}};
  int ranks[NIN] = {2, 2, 2, 2, 1};
  for (int i = 0; i < NIN; i++) {
    view_init(&c->in[i], e, ranks[i], dims[i]);
    view_init(&c->din[i], e, ranks[i], dims[i]);
    for (size_t k = 0; k < numel(&c->in[i]); k++) set(&c->in[i], k, (unif() * 2 - 1) * 0.8);
  }
  int64_t od[2] = {B, S};
  for (int j = 0; j < NOUT; j++) {
    view_init(&c->out[j], e, 2, od);
    view_init(&c->dout[j], e, 2, od);
    for (size_t k = 0; k < numel(&c->dout[j]); k++) set(&c->dout[j], k, unif() * 2 - 1);
  }
}

/* The same values in element type e. */
static void case_copy(case_t *c, const case_t *from, nf_elem e) {
  int64_t B = from->in[0].dims[0], I = from->in[0].dims[1], S = from->in[1].dims[1];
  case_init(c, e, B, I, S);
  for (int i = 0; i < NIN; i++)
    for (size_t k = 0; k < numel(&c->in[i]); k++) set(&c->in[i], k, get(&from->in[i], k));
  for (int j = 0; j < NOUT; j++)
    for (size_t k = 0; k < numel(&c->dout[j]); k++) set(&c->dout[j], k, get(&from->dout[j], k));
}

static void case_free(case_t *c) {
  for (int i = 0; i < NIN; i++) free(c->in[i].data), free(c->din[i].data);
  for (int j = 0; j < NOUT; j++) free(c->out[j].data), free(c->dout[j].data);
}

static void forward(nf_operator *op, case_t *c) {
  int rc = nf_operator_forward(op, c->in, c->out, &c->saved);
  ck_assert_msg(rc == NF_OK, "forward: %s: %s", nf_strerror(rc), nf_operator_error(op));
}

static void backward(nf_operator *op, case_t *c) {
  int rc = nf_operator_backward(op, c->saved, c->in, c->dout, c->din);
  ck_assert_msg(rc == NF_OK, "backward: %s: %s", nf_strerror(rc), nf_operator_error(op));
}

/* sum over outputs of out * dout */
static double vjp_value(nf_operator *op, case_t *c) {
  forward(op, c);
  double v = 0;
  for (int j = 0; j < NOUT; j++)
    for (size_t k = 0; k < numel(&c->out[j]); k++) v += get(&c->out[j], k) * get(&c->dout[j], k);
  return v;
}

static double max_rel(const nf_view *a, const nf_view *b) {
  double worst = 0, scale = 1e-30;
  for (size_t k = 0; k < numel(a); k++) {
    double d = fabs(get(a, k) - get(b, k));
    if (d > worst) worst = d;
    if (fabs(get(b, k)) > scale) scale = fabs(get(b, k));
  }
  return worst / scale;
}

/* ---- forward against the interpreter ---- */

START_TEST(op_forward_matches_the_interpreter) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "lltm_step", &o);
  ck_assert_int_eq(nf_operator_n_inputs(op), NIN);
  ck_assert_int_eq(nf_operator_n_outputs(op), NOUT);
  ck_assert_str_eq(nf_operator_input_name(op, 3), "W");
  ck_assert_str_eq(nf_operator_output_name(op, 1), "C2");
  ck_assert_ptr_null(nf_operator_input_name(op, NIN));
  case_t c;
  case_init(&c, NF_ELEM_F32, 3, 5, 4);
  nf_view shapes[NOUT];
  ck_assert_int_eq(nf_operator_shapes(op, c.in, shapes), NF_OK);
  ck_assert_int_eq(shapes[0].rank, 2);
  ck_assert_int_eq(shapes[0].dims[0], 3);
  ck_assert_int_eq(shapes[0].dims[1], 4);
  ck_assert_int_eq(shapes[1].elem, NF_ELEM_F32);
  forward(op, &c);

  /* the reference: the interpreter in f64 on the same graph */
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  const char *lib = getenv("NEOFLOW_LIB");
  char path[4096];
  snprintf(path, sizeof path, "%s/../examples/workloads.nf", lib);
  ck_assert_int_eq(nf_module_load_file(mod, path, d), NF_OK);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  const char *names[NIN] = {"X", "H", "C", "W", "b"};
  nf_arg_shape sh[NIN];
  for (int i = 0; i < NIN; i++) {
    memset(&sh[i], 0, sizeof sh[i]);
    sh[i].name = names[i];
    sh[i].rank = c.in[i].rank;
    memcpy(sh[i].dims, c.in[i].dims, sizeof(int64_t) * 2);
  }
  nf_inst_opts io = {.n_shapes = NIN, .shapes = sh};
  nf_graph *g = NULL;
  ck_assert_int_eq(nf_module_instantiate(mod, "lltm_step", &io, ctx, &g, d), NF_OK);
  nf_array ain[NIN], aout[NOUT];
  memset(ain, 0, sizeof ain);
  memset(aout, 0, sizeof aout);
  for (int i = 0; i < NIN; i++) {
    ain[i].dtype = NF_F32;
    ain[i].rank = c.in[i].rank;
    memcpy(ain[i].shape, c.in[i].dims, sizeof(int64_t) * 2);
    ain[i].numel = (int64_t)numel(&c.in[i]);
    ain[i].data = c.in[i].data;
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_interp_run(g, ain, NF_INTERP_F64, aout, &err), NF_OK);
  for (int j = 0; j < NOUT; j++) {
    ck_assert_int_eq(aout[j].numel, (int64_t)numel(&c.out[j]));
    double worst = 0;
    for (int64_t k = 0; k < aout[j].numel; k++) {
      double ref = ((const double *)aout[j].data)[k]; /* (f64: NF_INTERP_F64) */
      double dd = fabs(get(&c.out[j], (size_t)k) - ref);
      if (dd > worst) worst = dd;
    }
    ck_assert_msg(worst < 1e-5, "output %d differs by %g", j, worst);
    nf_array_free(&aout[j]);
  }
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(mod);
  nf_session_stats st;
  ck_assert_int_eq(nf_operator_stats(op, &st), NF_OK);
  ck_assert_int_eq(st.step, 1);
  ck_assert_int_gt(st.kernels, 0);
  case_free(&c);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* ---- gradients against finite differences ---- */

START_TEST(op_gradients_match_finite_differences) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "lltm_step", &o);
  case_t c;
  case_init(&c, NF_ELEM_F64, 2, 3, 3);
  backward(op, &c);
  const double h = 1e-6;
  for (int i = 0; i < NIN; i++) {
    double worst = 0;
    for (size_t k = 0; k < numel(&c.in[i]); k++) {
      double x = get(&c.in[i], k);
      set(&c.in[i], k, x + h);
      double up = vjp_value(op, &c);
      set(&c.in[i], k, x - h);
      double dn = vjp_value(op, &c);
      set(&c.in[i], k, x);
      double fd = (up - dn) / (2 * h), an = get(&c.din[i], k);
      double e = fabs(fd - an) / (1e-3 + fabs(fd));
      if (e > worst) worst = e;
    }
    ck_assert_msg(worst < 1e-6, "input %d: gradient off finite differences by %g (relative)", i,
                  worst);
  }
  /* f32 agrees with f64 */
  case_t f;
  case_copy(&f, &c, NF_ELEM_F32);
  backward(op, &f);
  forward(op, &f);
  forward(op, &c);
  for (int i = 0; i < NIN; i++)
    ck_assert_msg(max_rel(&f.din[i], &c.din[i]) < 1e-5, "f32 gradient %d off f64 by %g", i,
                  max_rel(&f.din[i], &c.din[i]));
  for (int j = 0; j < NOUT; j++) ck_assert(max_rel(&f.out[j], &c.out[j]) < 1e-5);

  /* one gradient asked: the same values, the others untouched */
  case_t one;
  case_copy(&one, &f, NF_ELEM_F32);
  for (int i = 0; i < NIN; i++)
    if (i != 3) {
      free(one.din[i].data);
      one.din[i].data = NULL;
    }
  backward(op, &one);
  ck_assert(max_rel(&one.din[3], &f.din[3]) == 0);
  /* a zero output gradient: NULL data */
  free(one.dout[0].data);
  one.dout[0].data = NULL;
  backward(op, &one);
  ck_assert(max_rel(&one.din[3], &f.din[3]) > 0);
  case_free(&one);
  case_free(&f);
  case_free(&c);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* ---- the forward's values kept for the backward ---- */

START_TEST(op_backward_keeps_or_recomputes_the_forward) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "lltm_step", &o);
  case_t a, b, a2, b2;
  case_init(&a, NF_ELEM_F32, 3, 4, 5);
  case_init(&b, NF_ELEM_F32, 3, 4, 5);
  case_copy(&a2, &a, NF_ELEM_F32);
  case_copy(&b2, &b, NF_ELEM_F32);
  /* the references: each backward recomputing its forward (no token) */
  a2.saved = b2.saved = 0;
  backward(op, &a2);
  backward(op, &b2);
  /* used twice, as in a model: forward a, forward b, backward b (b's
   * values kept), backward a (a's recomputed: b's forward came between) */
  forward(op, &a);
  forward(op, &b);
  ck_assert(a.saved != 0 && b.saved != 0 && a.saved != b.saved);
  backward(op, &b);
  backward(op, &a);
  for (int i = 0; i < NIN; i++) {
    ck_assert_msg(max_rel(&a.din[i], &a2.din[i]) == 0, "a's gradient %d differs", i);
    ck_assert_msg(max_rel(&b.din[i], &b2.din[i]) == 0, "b's gradient %d differs", i);
  }
  /* a backward of the forward just run, twice (as retain_graph does) */
  forward(op, &a);
  backward(op, &a);
  backward(op, &a);
  for (int i = 0; i < NIN; i++) ck_assert(max_rel(&a.din[i], &a2.din[i]) == 0);
  case_free(&a);
  case_free(&b);
  case_free(&a2);
  case_free(&b2);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* the caller's buffers at odd addresses: copied, the same results */
START_TEST(op_unaligned_buffers_are_copied) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "lltm_step", &o);
  case_t a, u;
  case_init(&a, NF_ELEM_F32, 2, 3, 4);
  case_copy(&u, &a, NF_ELEM_F32);
  forward(op, &a);
  backward(op, &a);
  char *raw[NIN + NOUT];
  for (int i = 0; i < NIN; i++) { /* each input one byte off its alignment */
    size_t n = numel(&u.in[i]) * 4;
    raw[i] = malloc(n + 8);
    memcpy(raw[i] + 1, u.in[i].data, n);
    free(u.in[i].data);
    u.in[i].data = raw[i] + 1;
  }
  for (int j = 0; j < NOUT; j++) {
    raw[NIN + j] = malloc(numel(&u.out[j]) * 4 + 8);
    free(u.out[j].data);
    u.out[j].data = raw[NIN + j] + 2;
  }
  ck_assert_int_eq(nf_operator_forward(op, u.in, u.out, &u.saved), NF_OK);
  for (int j = 0; j < NOUT; j++) {
    float *got = malloc(numel(&u.out[j]) * 4);
    memcpy(got, u.out[j].data, numel(&u.out[j]) * 4);
    for (size_t k = 0; k < numel(&u.out[j]); k++)
      ck_assert_float_eq(got[k], ((float *)a.out[j].data)[k]);
    free(got);
  }
  for (int i = 0; i < NIN; i++) free(raw[i]);
  for (int j = 0; j < NOUT; j++) free(raw[NIN + j]);
  for (int i = 0; i < NIN; i++) u.in[i].data = NULL;
  for (int j = 0; j < NOUT; j++) u.out[j].data = NULL;
  case_free(&u);
  case_free(&a);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* ---- specialisations ---- */

START_TEST(op_shapes_specialise_and_are_kept) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "lltm_step", &o);
  nf_session_stats st;
  case_t a, b;
  case_init(&a, NF_ELEM_F32, 2, 3, 4);
  case_init(&b, NF_ELEM_F32, 5, 3, 4);
  forward(op, &a);
  nf_operator_stats(op, &st);
  int k1 = st.kernels;
  forward(op, &b);
  nf_operator_stats(op, &st);
  ck_assert_int_gt(st.kernels, k1);
  int k2 = st.kernels;
  forward(op, &a); /* found again */
  backward(op, &a);
  nf_operator_stats(op, &st);
  ck_assert_int_eq(st.kernels, k2);
  ck_assert_int_eq(st.step, 4);
  /* more shapes than kept: the least recently used go */
  for (int n = 6; n < 6 + NF_OPERATOR_SPECS; n++) {
    case_t c;
    case_init(&c, NF_ELEM_F32, n, 3, 4);
    forward(op, &c);
    case_free(&c);
  }
  nf_operator_stats(op, &st);
  ck_assert_int_eq(st.step, NF_OPERATOR_SPECS); /* one run each on the ones kept */
  forward(op, &a);
  case_free(&a);
  case_free(&b);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* an embedding: integer indices pass through and have no gradient */
static const char *EMBED =
    "def embed_scale(Idx: i64[N], E: f32[V, D], s: f32[D]) -> (Y: f32[N, D]) {\n"
    "  Y(n, d) = E(Idx(n), d) * s(d)\n"
    "}\n";

START_TEST(op_integer_inputs) {
  char *err = NULL;
  nf_model *m = nf_model_load_source("embed.nf", EMBED, &err);
  ck_assert_msg(m != NULL, "%s", err ? err : "?");
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "embed_scale", &o);
  int64_t idx[4] = {2, 0, 2, 1};
  float E[3 * 2] = {1, 2, 3, 4, 5, 6}, sc[2] = {10, 100}, Y[8], dY[8], dE[6], ds[2];
  for (int i = 0; i < 8; i++) dY[i] = 1;
  nf_view in[3] = {{idx, NF_ELEM_I64, 1, {4}}, {E, NF_ELEM_F32, 2, {3, 2}},
                   {sc, NF_ELEM_F32, 1, {2}}};
  nf_view out[1] = {{Y, NF_ELEM_F32, 2, {4, 2}}};
  nf_view dout[1] = {{dY, NF_ELEM_F32, 2, {4, 2}}};
  nf_view din[3] = {{NULL, NF_ELEM_I64, 1, {4}}, {dE, NF_ELEM_F32, 2, {3, 2}},
                    {ds, NF_ELEM_F32, 1, {2}}};
  ck_assert_int_eq(nf_operator_forward(op, in, out, NULL), NF_OK);
  float wantY[8] = {50, 600, 10, 200, 50, 600, 30, 400};
  for (int i = 0; i < 8; i++) ck_assert_float_eq(Y[i], wantY[i]);
  ck_assert_int_eq(nf_operator_backward(op, 0, in, dout, din), NF_OK);
  float wantdE[6] = {10, 100, 10, 100, 20, 200}, wantds[2] = {1 + 5 + 5 + 3, 2 + 6 + 6 + 4};
  for (int i = 0; i < 6; i++) ck_assert_float_eq(dE[i], wantdE[i]);
  for (int i = 0; i < 2; i++) ck_assert_float_eq(ds[i], wantds[i]);
  /* asking for the indices' gradient is an error naming them */
  int64_t junk[4];
  din[0].data = junk;
  ck_assert_int_eq(nf_operator_backward(op, 0, in, dout, din), NF_EINVAL);
  ck_assert_msg(strstr(nf_operator_error(op), "'Idx'") &&
                    strstr(nf_operator_error(op), "only float inputs"),
                "%s", nf_operator_error(op));
  /* an index out of range: an error, not a crash */
  idx[1] = 7;
  ck_assert_int_ne(nf_operator_forward(op, in, out, NULL), NF_OK);
  ck_assert_msg(strlen(nf_operator_error(op)) > 0, "no message");
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* a def whose gradient cannot be formed still runs forward */
START_TEST(op_forward_only_without_a_gradient) {
  char *err = NULL;
  nf_model *m = nf_model_load_source(
      "bucket.nf",
      "def bucket(X: f32[N]) -> (Z: f32[N]) {\n"
      "  K(n) = i64(floor(X(n)))\n"
      "  Z(n) = X(n) * f32(K(n))\n"
      "}\n",
      &err);
  ck_assert_msg(m != NULL, "%s", err ? err : "?");
  nf_session_opts o = quiet_opts();
  nf_operator *op = open_op(m, "bucket", &o);
  float X[3] = {1.5f, -0.5f, 2.25f}, Z[3], dZ[3] = {1, 1, 1}, dX[3];
  nf_view in[1] = {{X, NF_ELEM_F32, 1, {3}}}, out[1] = {{Z, NF_ELEM_F32, 1, {3}}};
  nf_view dout[1] = {{dZ, NF_ELEM_F32, 1, {3}}}, din[1] = {{dX, NF_ELEM_F32, 1, {3}}};
  uint64_t t = 0;
  ck_assert_int_eq(nf_operator_forward(op, in, out, &t), NF_OK);
  ck_assert_float_eq(Z[0], 1.5f);
  ck_assert_float_eq(Z[1], 0.5f);
  ck_assert_float_eq(Z[2], 4.5f);
  ck_assert_int_eq(nf_operator_backward(op, t, in, dout, din), NF_EUNSUPPORTED);
  ck_assert_msg(strstr(nf_operator_error(op), "bucket: no gradient: ") != NULL, "%s",
                nf_operator_error(op));
  /* a view of a rank past the structure's is an error, not a read past it */
  nf_view bad = {Z, NF_ELEM_F32, 40, {3}};
  ck_assert_int_eq(nf_operator_forward(op, in, &bad, NULL), NF_EINVAL);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* ---- bad calls ---- */

START_TEST(op_bad_calls_are_errors_with_messages) {
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  char *err = NULL;
  ck_assert_ptr_null(nf_operator_new(m, "lltm_stp", &o, &err));
  ck_assert_msg(err && strstr(err, "lltm_stp"), "%s", err ? err : "(none)");
  free(err);
  o.device = "cuda";
  ck_assert_ptr_null(nf_operator_new(m, "lltm_step", &o, &err));
  ck_assert_msg(err && strstr(err, "CPU only"), "%s", err ? err : "(none)");
  free(err);
  o.device = NULL;
  nf_operator *op = open_op(m, "lltm_step", &o);
  case_t c;
  case_init(&c, NF_ELEM_F32, 2, 3, 4);
  /* W's rows must be b's size: the def's signature says so */
  c.in[3].dims[0] = 11;
  ck_assert_int_ne(nf_operator_forward(op, c.in, c.out, NULL), NF_OK);
  ck_assert_msg(strstr(nf_operator_error(op), "'G' is 11 from input W") != NULL, "%s",
                nf_operator_error(op));
  /* ... and 3 * S: its require says so */
  c.in[3].dims[0] = 9;
  c.in[4].dims[0] = 9;
  ck_assert_int_ne(nf_operator_forward(op, c.in, c.out, NULL), NF_OK);
  ck_assert_msg(strstr(nf_operator_error(op), "G == 3 * S") != NULL, "%s", nf_operator_error(op));
  c.in[3].dims[0] = 12;
  c.in[4].dims[0] = 12;
  /* an output of the wrong shape */
  c.out[1].dims[1] = 5;
  ck_assert_int_eq(nf_operator_forward(op, c.in, c.out, NULL), NF_EINVAL);
  ck_assert_msg(strstr(nf_operator_error(op), "output 1 'C2' must be f32[2, 4], got f32[2, 5]"),
                "%s", nf_operator_error(op));
  c.out[1].dims[1] = 4;
  /* a rank the def does not take */
  c.in[4].rank = 2;
  c.in[4].dims[1] = 1;
  ck_assert_int_ne(nf_operator_forward(op, c.in, c.out, NULL), NF_OK);
  ck_assert_msg(strstr(nf_operator_error(op), "b") != NULL, "%s", nf_operator_error(op));
  c.in[4].rank = 1;
  /* an i32 where f32 is declared */
  c.in[0].elem = NF_ELEM_I32;
  ck_assert_int_eq(nf_operator_forward(op, c.in, c.out, NULL), NF_EINVAL);
  ck_assert_msg(strstr(nf_operator_error(op), "input 0 'X' must be f32[2, 3]"), "%s",
                nf_operator_error(op));
  c.in[0].elem = NF_ELEM_F32;
  /* no data */
  void *keep = c.in[2].data;
  c.in[2].data = NULL;
  ck_assert_int_eq(nf_operator_forward(op, c.in, c.out, NULL), NF_EINVAL);
  ck_assert_msg(strstr(nf_operator_error(op), "'C' has no data"), "%s", nf_operator_error(op));
  c.in[2].data = keep;
  ck_assert_int_eq(nf_operator_forward(op, NULL, c.out, NULL), NF_EINVAL);
  ck_assert_int_eq(nf_operator_backward(op, 0, c.in, NULL, c.din), NF_EINVAL);
  /* and the good call still works */
  forward(op, &c);
  backward(op, &c);
  case_free(&c);
  nf_operator_free(op);
  nf_model_free(m);
}
END_TEST

/* ---- with a daemon ---- */

START_TEST(op_kernels_from_the_daemon) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  nf_model *m = load_workloads();
  nf_session_opts o = quiet_opts();
  o.daemon = d.sock;
  o.no_spawn = 1;
  o.compile_only = 1;
  nf_operator *op = open_op(m, "lltm_step", &o);
  case_t c, ref;
  case_init(&c, NF_ELEM_F32, 4, 6, 5);
  case_copy(&ref, &c, NF_ELEM_F32);
  /* tier 0's answers */
  forward(op, &ref);
  backward(op, &ref);
  ck_assert_int_eq(nf_operator_wait_kernels(op, 120000, 1), NF_OK);
  /* the kernels are swapped in (each checked by its canary) */
  for (int r = 0; r < 3; r++) {
    forward(op, &c);
    backward(op, &c);
  }
  nf_session_stats st;
  nf_operator_stats(op, &st);
  ck_assert_msg(st.swaps > 0 && st.tier1 + st.tier0_kept == st.kernels,
                "%lld swaps, %d of %d at tier 1, %d kept at tier 0 (see %s)",
                (long long)st.swaps, st.tier1, st.kernels, st.tier0_kept, d.log);
  ck_assert_int_eq(st.rejected, 0);
  for (int j = 0; j < NOUT; j++) ck_assert(max_rel(&c.out[j], &ref.out[j]) < 1e-5);
  for (int i = 0; i < NIN; i++) ck_assert(max_rel(&c.din[i], &ref.din[i]) < 1e-5);
  case_free(&c);
  case_free(&ref);
  nf_operator_free(op);
  nf_model_free(m);
  dm_stop(&d, SIGTERM);
  dm_done(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("op");
  TCase *tc = tcase_create("op");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, op_forward_matches_the_interpreter);
  tcase_add_test(tc, op_gradients_match_finite_differences);
  tcase_add_test(tc, op_backward_keeps_or_recomputes_the_forward);
  tcase_add_test(tc, op_unaligned_buffers_are_copied);
  tcase_add_test(tc, op_shapes_specialise_and_are_kept);
  tcase_add_test(tc, op_integer_inputs);
  tcase_add_test(tc, op_forward_only_without_a_gradient);
  tcase_add_test(tc, op_bad_calls_are_errors_with_messages);
  if (getenv("NF_NEOFLOWD")) tcase_add_test(tc, op_kernels_from_the_daemon);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
