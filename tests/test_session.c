/* test_session.c - libneoflow-client's training sessions end to end
 * (neoflow/neoflow.h, client/session.c, client/dlink.c):
 *
 *  - examples/mlp.nf and examples/cnn.nf learn a fixed pool of batches at
 *    tier 0 (OpenBLAS for the matmuls, the interpreter for the rest);
 *  - SGD (momentum, weight decay), Adam and AdamW move a parameter exactly
 *    as PyTorch's formulas say, computed here in double from the
 *    session's own gradients;
 *  - the session's gradients agree with central finite differences of its
 *    own loss;
 *  - kernels compiled in this process with the default schedule and
 *    offered as the daemon would are verified by their canaries, swapped
 *    in, and train exactly like tier 0;
 *  - a kernel with a wrong digest, a damaged ELF header, or the wrong
 *    arithmetic is refused, and the entry keeps the kernel it had;
 *  - a daemon killed with SIGKILL: training goes on, and the session
 *    reconnects when it is back;
 *  - two clients starting at once with no daemon end up with one daemon;
 *  - parameter files round-trip bit for bit and a damaged or foreign file
 *    changes nothing;
 *  - bad input is an error with a message, never a crash. */
#include <check.h>
#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "neoflow/neoflow.h"
#include "nf_codegen.h"
#include "nf_ir.h"
#include "nf_lower.h"
#include "nf_nvrtc_link.h"
#include "nf_runtime.h"
#include "nf_status.h"
#include "nf_test_daemon.h"
#include "session_int.h"

/* ---- helpers ---- */

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s; }

static double unif(void) {
  rng_state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = rng_state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1.0p-53;
}

static double gauss(void) {
  double u = unif(), v = unif();
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static void fill_gauss(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = (float)gauss();
}


static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The path of an example model: $NEOFLOW_LIB/../examples/NAME. */
static void example_path(char *out, size_t n, const char *name) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  snprintf(out, n, "%s/../examples/%s", lib, name);
}

static nf_model *load_example(const char *name) {
  char path[4096];
  example_path(path, sizeof path, name);
  char *err = NULL;
  nf_model *m = nf_model_load(path, &err);
  ck_assert_msg(m != NULL, "%s: %s", path, err ? err : "?");
  free(err);
  return m;
}

static nf_model *load_text(const char *name, const char *text) {
  char *err = NULL;
  nf_model *m = nf_model_load_source(name, text, &err);
  ck_assert_msg(m != NULL, "%s: %s", name, err ? err : "?");
  free(err);
  return m;
}

static nf_session *open_def(nf_model *m, const char *def, const nf_session_opts *o) {
  char *err = NULL;
  nf_session *s = nf_session_new_def(m, def, o, &err);
  ck_assert_msg(s != NULL, "session on %s: %s", def, err ? err : "?");
  ck_assert_ptr_null(err);
  return s;
}

static void feed(nf_session *s, const char *name, const void *data, size_t bytes) {
  int rc = nf_session_feed(s, name, data, bytes);
  ck_assert_msg(rc == NF_OK, "feed %s: %s: %s", name, nf_strerror(rc), nf_session_error(s));
}

static double step(nf_session *s) {
  double loss = NAN;
  int rc = nf_session_step(s, &loss);
  ck_assert_msg(rc == NF_OK, "step: %s: %s", nf_strerror(rc), nf_session_error(s));
  ck_assert_msg(isfinite(loss), "step: loss %g", loss);
  return loss;
}

static void read_t(nf_session *s, const char *name, void *data, size_t bytes) {
  int rc = nf_session_read(s, name, data, bytes);
  ck_assert_msg(rc == NF_OK, "read %s: %s: %s", name, nf_strerror(rc), nf_session_error(s));
}

static int64_t param_numel(const nf_session *s, int i, const char **name) {
  int rank = 0;
  int64_t dims[8];
  ck_assert_int_eq(nf_session_param_info(s, i, name, NULL, &rank, dims), NF_OK);
  int64_t n = 1;
  for (int r = 0; r < rank; r++) n *= dims[r];
  return n;
}

/* Every parameter, concatenated (malloc'd; *n gets the count). */
static float *all_params(nf_session *s, int64_t *n) {
  int64_t total = 0;
  for (int i = 0; i < nf_session_n_params(s); i++) total += param_numel(s, i, NULL);
  float *v = malloc(sizeof(float) * (size_t)(total + 1));
  ck_assert_ptr_nonnull(v);
  int64_t at = 0;
  for (int i = 0; i < nf_session_n_params(s); i++) {
    const char *name = NULL;
    int64_t k = param_numel(s, i, &name);
    read_t(s, name, v + at, sizeof(float) * (size_t)k);
    at += k;
  }
  *n = total;
  return v;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double md = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
    if (fabs((double)b[i]) > mx) mx = fabs((double)b[i]);
  }
  return md / (mx > 0 ? mx : 1);
}

/* The parameters of sessions b and a (the reference) agree within tol
 * (relative, over all of them). */
static void params_agree(nf_session *a, nf_session *b, double tol) {
  int64_t na = 0, nb = 0;
  float *pa = all_params(a, &na), *pb = all_params(b, &nb);
  ck_assert_int_eq(na, nb);
  double r = rel_diff(pb, pa, na);
  ck_assert_msg(r < tol, "parameters after the steps differ by %g (relative)", r);
  free(pa);
  free(pb);
}

static nf_session_stats stats(const nf_session *s) {
  nf_session_stats st;
  ck_assert_int_eq(nf_session_stats(s, &st), NF_OK);
  return st;
}

/* The session's recent warnings (for failure messages). */
static const char *session_log(nf_session *s) {
  return s->log.recent.len ? s->log.recent.data : "(no warnings)";
}

/* ---- the MLP of examples/mlp.nf with a fixed pool of batches ---- */

enum { MLP_BATCH = 16, MLP_HIDDEN = 32, MLP_POOL = 4, MLP_IN = 784 };

typedef struct mlp_data {
  float X[MLP_POOL][MLP_BATCH * MLP_IN];
  int64_t labels[MLP_POOL][MLP_BATCH];
} mlp_data;

static mlp_data *mlp_data_new(uint64_t seed) {
  mlp_data *d = malloc(sizeof *d);
  ck_assert_ptr_nonnull(d);
  rng_seed(seed);
  for (int b = 0; b < MLP_POOL; b++) {
    fill_gauss(d->X[b], MLP_BATCH * MLP_IN);
    for (int i = 0; i < MLP_BATCH; i++) d->labels[b][i] = (int64_t)(unif() * 10) % 10;
  }
  return d;
}

static const char *const mlp_inames[] = {"batch", "hidden"};
static const int64_t mlp_ivalues[] = {MLP_BATCH, MLP_HIDDEN};

static nf_session_opts mlp_opts(void) {
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_ADAM, .lr = 0.01}, .seed = 7,
                       .daemon = "none", .n_iparams = 2, .inames = mlp_inames,
                       .ivalues = mlp_ivalues};
  return o;
}

static void mlp_feed(nf_session *s, const mlp_data *d, int64_t stepno) {
  int b = (int)(stepno % MLP_POOL);
  feed(s, "X", d->X[b], sizeof d->X[b]);
  feed(s, "labels", d->labels[b], sizeof d->labels[b]);
}

/* ---- compiling kernels in this process (the daemon's default kernels) ---- */

static void compile_graph(const nf_graph *g, nf_blob *so) {
  nf_ir_ctx *pctx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(pctx);
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  nf_cpu_target tgt = {NULL, NULL, NULL, 0};
  int rc = nf_lower(g, NULL, pctx, &p, &err);
  ck_assert_msg(rc == NF_OK, "lower %s: %s: %s", g->name ? g->name : "?", nf_strerror(rc),
                nf_buf_str(&err));
  rc = nf_cpu_compile(p, &tgt, so, NULL, &err);
  ck_assert_msg(rc == NF_OK, "compile %s: %s: %s", g->name ? g->name : "?", nf_strerror(rc),
                nf_buf_str(&err));
  nf_buf_free(&err);
  nf_ir_ctx_free(pctx);
}

/* Compiles entry k's graph and offers it (tier 1, key unchecked). */
static int offer_compiled(nf_session *s, int k) {
  nf_blob so = NF_BLOB_INIT;
  compile_graph(s->kt.kents[k].g, &so);
  uint8_t sha[32];
  crypto_hash_sha256(sha, so.data, so.len);
  int rc = nf__kt_offer(&s->kt, k, so.data, so.len, sha, NULL, 1, 0);
  nf_blob_free(&so);
  return rc;
}

/* A graph with the signature of g (the same tensors, inputs and outputs)
 * whose f32 outputs are 2 x + 1 of g's: a kernel for it loads and runs
 * on g's buffers, with other results.  Built in ctx. */
static nf_graph *wrong_twin(nf_ir_ctx *ctx, const nf_graph *g) {
  nf_graph *w = nf_graph_new(ctx, "wrong_twin");
  ck_assert_ptr_nonnull(w);
  for (uint32_t t = 0; t < g->n_tensors; t++) {
    const nf_tensor *tn = &g->tensors[t];
    int id = nf_graph_add_tensor(w, tn->name, (nf_dtype)tn->dtype, (nf_tkind)tn->kind, tn->rank,
                                 tn->shape);
    ck_assert_int_eq(id, (int)t);
  }
  ck_assert_int_eq(w->n_inputs, g->n_inputs);
  ck_assert_int_eq(w->n_outputs, g->n_outputs);
  for (uint32_t i = 0; i < g->n_inputs; i++) ck_assert_uint_eq(w->inputs[i], g->inputs[i]);
  for (uint32_t i = 0; i < g->n_outputs; i++) ck_assert_uint_eq(w->outputs[i], g->outputs[i]);
  int changed = 0;
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    nf_stmt st = g->stmts[i];
    const nf_tensor *out = &g->tensors[st.out];
    if (out->kind == NF_T_OUTPUT && out->dtype == NF_F32) {
      st.rhs = nf_e_binary(ctx, NF_OP_ADD,
                           nf_e_binary(ctx, NF_OP_MUL, st.rhs, nf_e_const_f(ctx, NF_F32, 2.0)),
                           nf_e_const_f(ctx, NF_F32, 1.0));
      ck_assert_ptr_nonnull(st.rhs);
      changed++;
    }
    ck_assert_int_eq(nf_graph_add_stmt(w, &st), NF_OK);
  }
  ck_assert_int_gt(changed, 0);
  nf_buf err = NF_BUF_INIT;
  int rc = nf_graph_validate(w, &err);
  ck_assert_msg(rc == NF_OK, "wrong twin: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  return w;
}

/* ---- 1. the MLP learns ---- */

START_TEST(session_mlp_trains) {
  nf_model *m = load_example("mlp.nf");
  mlp_data *d = mlp_data_new(11);
  nf_session_opts o = mlp_opts();
  nf_session *s = open_def(m, "mlp", &o);
  ck_assert_int_eq(nf_session_n_params(s), 6);
  ck_assert_int_eq(nf_session_n_inputs(s), 2);
  double first = 0, last[4] = {0};
  const int n_steps = 150;
  for (int i = 0; i < n_steps; i++) {
    mlp_feed(s, d, i);
    double l = step(s);
    if (i == 0) first = l;
    last[i % 4] = l;
  }
  double mean_last = (last[0] + last[1] + last[2] + last[3]) / 4;
  /* ten classes, small initial logits: about ln 10 at first */
  ck_assert_msg(first > 1.5 && first < 4, "first loss %g", first);
  ck_assert_msg(mean_last < 0.3 * first, "loss %g after %d steps, %g at first", mean_last, n_steps,
                first);
  float lf = 0, lL = 0;
  read_t(s, "loss", &lf, sizeof lf);
  read_t(s, "L", &lL, sizeof lL);
  ck_assert_msg(lf == (float)last[(n_steps - 1) % 4] && lL == lf, "read loss %g, L %g", lf, lL);
  nf_session_stats st = stats(s);
  ck_assert_int_eq(st.step, n_steps);
  ck_assert_msg(fabs(st.loss - last[(n_steps - 1) % 4]) < 1e-12, "stats.loss %g", st.loss);
  ck_assert_int_gt(st.kernels, 0);
  ck_assert_int_gt(st.blas, 0);
  ck_assert_int_eq(st.tier1, 0);
  ck_assert_int_eq(st.tier2, 0);
  ck_assert_int_eq(st.connected, 0);
  ck_assert_int_eq(st.swaps, 0);
  ck_assert_int_eq(st.rejected, 0);
  ck_assert(st.ms > 0 && st.ms_avg > 0);
  nf_session_free(s);
  nf_model_free(m);
  free(d);
}
END_TEST

/* ---- 2. the CNN learns ---- */

START_TEST(session_cnn_trains) {
  enum { B = 4, POOL = 2, PIX = 28 * 28 };
  nf_model *m = load_example("cnn.nf");
  static float X[POOL][B * PIX];
  int64_t labels[POOL][B];
  rng_seed(23);
  for (int b = 0; b < POOL; b++) {
    fill_gauss(X[b], B * PIX);
    for (int i = 0; i < B; i++) labels[b][i] = (int64_t)(unif() * 10) % 10;
  }
  const char *inames[] = {"batch"};
  const int64_t ivalues[] = {B};
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_ADAM, .lr = 0.01}, .seed = 3, .daemon = "none",
                       .n_iparams = 1, .inames = inames, .ivalues = ivalues};
  nf_session *s = open_def(m, "cnn", &o);
  ck_assert_int_eq(nf_session_n_params(s), 6);
  const int n_steps = 40;
  double first = 0, last2[2] = {0};
  for (int i = 0; i < n_steps; i++) {
    feed(s, "X", X[i % POOL], sizeof X[0]);
    feed(s, "labels", labels[i % POOL], sizeof labels[0]);
    double l = step(s);
    if (i == 0) first = l;
    last2[i % 2] = l;
  }
  double mean_last = (last2[0] + last2[1]) / 2;
  /* kaiming-initialised convolutions on N(0, 1) pixels: large logits */
  ck_assert_msg(first > 1, "first loss %g", first);
  ck_assert_msg(mean_last < 1.0, "loss %g after %d steps: not below chance (ln 10)", mean_last,
                n_steps);
  ck_assert_msg(mean_last < 0.5 * first, "loss %g after %d steps, %g at first", mean_last, n_steps,
                first);
  nf_session_stats st = stats(s);
  ck_assert_int_eq(st.step, n_steps);
  ck_assert_int_gt(st.kernels, 0);
  ck_assert_int_eq(st.tier1 + st.tier2, 0);
  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* ---- 3. optimizers against PyTorch's formulas ---- */

static const char opt_model[] =
    "def m(X: f32[2, 3], y: f32[2]) -> (L: f32[]) {\n"
    "  param W: f32[3] = constant(0.5)\n"
    "  P(i) +=! X(i, j) * W(j)\n"
    "  D(i) = P(i) - y(i)\n"
    "  S() +=! D(i) * D(i)\n"
    "  L() = S() / 2.0\n"
    "}\n";

/* Runs 3 steps of optimizer o on opt_model; checks W after each against
 * the reference in double (torch.optim.SGD / Adam / AdamW). */
static void check_optimizer(nf_optimizer opt, const char *what) {
  nf_model *m = load_text("opt.nf", opt_model);
  nf_session_opts o = {.optim = opt, .seed = 1, .daemon = "none"};
  nf_session *s = open_def(m, "m", &o);
  float X[6], y[2];
  rng_seed(5);
  fill_gauss(X, 6);
  fill_gauss(y, 2);
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);
  float w0[3];
  read_t(s, "W", w0, sizeof w0);
  for (int i = 0; i < 3; i++) ck_assert_float_eq(w0[i], 0.5f);
  /* PyTorch's defaults where the options leave zeros */
  double lr = opt.lr, b1 = opt.beta1 > 0 ? opt.beta1 : 0.9, b2 = opt.beta2 > 0 ? opt.beta2 : 0.999;
  double eps = opt.eps > 0 ? opt.eps : 1e-8, wd = opt.weight_decay, mom = opt.momentum;
  double p[3] = {0.5, 0.5, 0.5}, mm[3] = {0}, vv[3] = {0}, buf[3] = {0};
  for (int t = 1; t <= 3; t++) {
    float wb[3];
    read_t(s, "W", wb, sizeof wb);
    double loss = step(s);
    /* the loss the session reports is at the weights before the step */
    double ref_loss = 0;
    for (int i = 0; i < 2; i++) {
      double pi = 0;
      for (int j = 0; j < 3; j++) pi += (double)X[i * 3 + j] * wb[j];
      ref_loss += (pi - y[i]) * (pi - y[i]) / 2;
    }
    ck_assert_msg(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss) + 1e-7,
                  "%s step %d: loss %.9g, want %.9g",
                  what, t, loss, ref_loss);
    float g[3], w[3];
    read_t(s, "grad_W", g, sizeof g);
    read_t(s, "W", w, sizeof w);
    /* the gradient itself: X^T (X w - y) at the weights before */
    for (int j = 0; j < 3; j++) {
      double gj = 0;
      for (int i = 0; i < 2; i++) {
        double pi = 0;
        for (int k = 0; k < 3; k++) pi += (double)X[i * 3 + k] * wb[k];
        gj += (pi - y[i]) * X[i * 3 + j];
      }
      ck_assert_msg(fabs(g[j] - gj) <= 1e-5 * fabs(gj) + 1e-6,
                    "%s step %d: grad_W[%d] %.9g, want %.9g",
                    what, t, j, g[j], gj);
    }
    for (int j = 0; j < 3; j++) {
      double gj = g[j];
      if (opt.kind == NF_OPTIM_SGD) {
        double gg = gj + wd * p[j];
        buf[j] = t == 1 ? gg : mom * buf[j] + gg;
        p[j] -= lr * buf[j];
      } else {
        if (opt.kind == NF_OPTIM_ADAMW) p[j] *= 1 - lr * wd;
        else gj += wd * p[j];
        mm[j] = b1 * mm[j] + (1 - b1) * gj;
        vv[j] = b2 * vv[j] + (1 - b2) * gj * gj;
        double mh = mm[j] / (1 - pow(b1, t)), vh = vv[j] / (1 - pow(b2, t));
        p[j] -= lr * mh / (sqrt(vh) + eps);
      }
      ck_assert_msg(fabs(w[j] - p[j]) <= 1e-5 * fabs(p[j]),
                    "%s step %d: W[%d] = %.9g, PyTorch's formula gives %.9g (before %.9g)", what,
                    t, j, w[j], p[j], wb[j]);
      ck_assert_msg(w[j] != wb[j], "%s step %d: W[%d] did not move", what, t, j);
    }
  }
  nf_session_free(s);
  nf_model_free(m);
}

START_TEST(session_optimizers) {
  check_optimizer((nf_optimizer){.kind = NF_OPTIM_SGD, .lr = 0.05, .momentum = 0.9,
                                 .weight_decay = 0.01}, "sgd");
  check_optimizer((nf_optimizer){.kind = NF_OPTIM_ADAM, .lr = 0.01}, "adam");
  check_optimizer((nf_optimizer){.kind = NF_OPTIM_ADAM, .lr = 0.01, .weight_decay = 0.1,
                                 .beta1 = 0.8, .beta2 = 0.99}, "adam+l2");
  check_optimizer((nf_optimizer){.kind = NF_OPTIM_ADAMW, .lr = 0.01, .weight_decay = 0.1}, "adamw");
}
END_TEST

/* ---- 4. gradients against finite differences ---- */

static const char fd_model[] =
    "import nn\n"
    "def fdm(X: f32[4, 3], T: f32[4, 2]) -> (L: f32[]) {\n"
    "  param W1: f32[5, 3] = xavier_uniform\n"
    "  param b1: f32[5] = uniform(-0.5, 0.5)\n"
    "  param W2: f32[2, 5] = xavier_uniform\n"
    "  H = linear(X, W1, b1)\n"
    "  A(n, j) = tanh(H(n, j))\n"
    "  Y(n, o) +=! A(n, j) * W2(o, j)\n"
    "  L = mse(Y, T)\n"
    "}\n";

START_TEST(session_gradients_match_finite_differences) {
  nf_model *m = load_text("fd.nf", fd_model);
  /* lr 1e-30: a step leaves the parameters as they are */
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_SGD, .lr = 1e-30}, .seed = 9, .daemon = "none"};
  nf_session *s = open_def(m, "fdm", &o);
  float X[12], T[8];
  rng_seed(77);
  fill_gauss(X, 12);
  fill_gauss(T, 8);
  feed(s, "X", X, sizeof X);
  feed(s, "T", T, sizeof T);
  ck_assert_int_eq(nf_session_n_params(s), 3);
  const float eps = 1e-3f;
  int checked = 0;
  for (int p = 0; p < nf_session_n_params(s); p++) {
    const char *name = NULL;
    int64_t n = param_numel(s, p, &name);
    char gname[64];
    snprintf(gname, sizeof gname, "grad_%s", name);
    float *base = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
    float *w = malloc(sizeof(float) * (size_t)n);
    double *fd = malloc(sizeof(double) * (size_t)n);
    ck_assert(base && g && w && fd);
    read_t(s, name, base, sizeof(float) * (size_t)n);
    step(s);
    read_t(s, gname, g, sizeof(float) * (size_t)n);
    read_t(s, name, w, sizeof(float) * (size_t)n);
    ck_assert_msg(!memcmp(w, base, sizeof(float) * (size_t)n), "%s moved at lr 1e-30", name);
    double md = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
      memcpy(w, base, sizeof(float) * (size_t)n);
      w[i] = base[i] + eps;
      ck_assert_int_eq(nf_session_set_param(s, name, w, (size_t)n), NF_OK);
      double lp = step(s);
      w[i] = base[i] - eps;
      ck_assert_int_eq(nf_session_set_param(s, name, w, (size_t)n), NF_OK);
      double lm = step(s);
      /* the true step of the perturbed float values */
      fd[i] = (lp - lm) / ((double)(base[i] + eps) - (double)(base[i] - eps));
      ck_assert_int_eq(nf_session_set_param(s, name, base, (size_t)n), NF_OK);
      if (fabs(fd[i] - g[i]) > md) md = fabs(fd[i] - g[i]);
      if (fabs(fd[i]) > mx) mx = fabs(fd[i]);
      checked++;
    }
    ck_assert_msg(mx > 1e-3, "%s: finite differences all near zero (max %g)", name, mx);
    ck_assert_msg(md <= 2e-2 * mx, "%s: gradient differs from finite differences by %g (max %g)",
                  name, md, mx);
    free(base);
    free(g);
    free(w);
    free(fd);
  }
  ck_assert_int_eq(checked, 15 + 5 + 10);
  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* ---- 5. compiled kernels train exactly like tier 0 ---- */

START_TEST(session_tiers_agree) {
  nf_model *m = load_example("mlp.nf");
  mlp_data *d = mlp_data_new(12);
  nf_session_opts o = mlp_opts();
  /* SGD with momentum: Adam's sign-like first steps would turn a rounding
   * difference in a near-zero gradient into a full step */
  o.optim = (nf_optimizer){.kind = NF_OPTIM_SGD, .lr = 0.01, .momentum = 0.5};
  nf_session *a = open_def(m, "mlp", &o);
  nf_session *b = open_def(m, "mlp", &o);
  ck_assert_int_eq(a->kt.n_kents, b->kt.n_kents);
  int n_k = b->kt.n_kents, n_gemm = 0;
  for (int k = 0; k < n_k; k++) {
    int rc = offer_compiled(b, k);
    ck_assert_msg(rc == NF_OK, "offer %d: %s: %s", k, nf_strerror(rc), session_log(b));
    n_gemm += b->kt.kents[k].gemm != NULL;
  }
  ck_assert_int_gt(n_gemm, 0);
  nf_session_stats st = stats(b);
  ck_assert_int_eq(st.tier1, 0);
  ck_assert_int_eq(st.swaps, 0);
  double la[3], lb[3];
  for (int i = 0; i < 3; i++) {
    mlp_feed(a, d, 0); /* one batch: the loss must fall */
    mlp_feed(b, d, 0);
    la[i] = step(a);
    lb[i] = step(b);
    if (i == 0) {
      /* the first step ran every canary and promoted every kernel */
      st = stats(b);
      ck_assert_msg(st.swaps == n_k && st.rejected == 0, "swaps %lld of %d, rejected %lld: %s",
                    (long long)st.swaps, n_k, (long long)st.rejected, session_log(b));
      /* each runs its kernel, or tier 0 where that was faster here */
      ck_assert_int_eq(st.tier1 + st.tier0_kept, n_k);
      ck_assert_int_eq(st.trusted, 0);
      ck_assert_int_eq(st.blas, st.blas_kept);
      for (int k = 0; k < n_k; k++) {
        ck_assert_ptr_nonnull(b->kt.kents[k].cur);
        ck_assert_ptr_null(b->kt.kents[k].cand);
        ck_assert_int_eq(b->kt.kents[k].cur_tier, 1);
      }
      /* the reference produced step 1's results */
      ck_assert_msg(la[0] == lb[0], "step 1: loss %.9g at tier 0, %.9g with canaries", la[0],
                    lb[0]);
    }
    ck_assert_msg(fabs(la[i] - lb[i]) <= 1e-5 * fabs(la[i]), "step %d: loss %.9g vs %.9g", i + 1,
                  la[i], lb[i]);
  }
  ck_assert_msg(la[2] < la[0], "loss did not fall: %g -> %g", la[0], la[2]);
  int64_t na = 0, nb = 0;
  float *pa = all_params(a, &na), *pb = all_params(b, &nb);
  ck_assert_int_eq(na, nb);
  double r = rel_diff(pb, pa, na);
  ck_assert_msg(r < 1e-5, "parameters after 3 steps differ by %g (relative)", r);
  for (int p = 0; p < nf_session_n_params(a); p++) {
    const char *name = NULL;
    int64_t n = param_numel(a, p, &name);
    char gname[64];
    snprintf(gname, sizeof gname, "grad_%s", name);
    float *ga = malloc(sizeof(float) * (size_t)n), *gb = malloc(sizeof(float) * (size_t)n);
    read_t(a, gname, ga, sizeof(float) * (size_t)n);
    read_t(b, gname, gb, sizeof(float) * (size_t)n);
    double rg = rel_diff(gb, ga, n);
    ck_assert_msg(rg < 1e-4, "%s differs by %g (relative)", gname, rg);
    free(ga);
    free(gb);
  }
  st = stats(b);
  ck_assert_int_eq(st.tier1 + st.tier0_kept, n_k);
  ck_assert_int_eq(st.swaps, n_k);
  free(pa);
  free(pb);
  nf_session_free(a);
  nf_session_free(b);
  nf_model_free(m);
  free(d);
}
END_TEST

/* ---- never slower than tier 0 ---- */

/* A product big enough that OpenBLAS (tier 0) beats a kernel lowered
 * without any schedule (scalar loops, the reduction innermost and B read
 * down its columns) by far more than the 3x and 20 ms a canary needs to
 * decide alone. */
static const char slow_model[] =
    "def slowm(X: f32[256, 512]) -> (L: f32[]) {\n"
    "  param W: f32[512, 512] = uniform(-0.05, 0.05)\n"
    "  Y(i, j) +=! X(i, k) * W(k, j)\n"
    "  L() +=! Y(i, j) * Y(i, j)\n"
    "}\n";

/* Offers entry k a kernel lowered with schedule sch (NULL: the default);
 * its SHA-256 in sha. */
static void offer_scheduled(nf_session *s, int k, const nf_schedule *sch, uint8_t sha[32]) {
  nf_ir_ctx *pctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  nf_cpu_target tgt = {NULL, NULL, NULL, 0};
  nf_blob so = NF_BLOB_INIT;
  int rc = nf_lower(s->kt.kents[k].g, sch, pctx, &p, &err);
  ck_assert_msg(rc == NF_OK, "lower: %s", nf_buf_str(&err));
  rc = nf_cpu_compile(p, &tgt, &so, NULL, &err);
  ck_assert_msg(rc == NF_OK, "compile: %s", nf_buf_str(&err));
  crypto_hash_sha256(sha, so.data, so.len);
  rc = nf__kt_offer(&s->kt, k, so.data, so.len, sha, NULL, 1, 0);
  ck_assert_msg(rc == NF_OK, "offer: %s: %s", nf_strerror(rc), session_log(s));
  nf_blob_free(&so);
  nf_buf_free(&err);
  nf_ir_ctx_free(pctx);
}

/* Entry of s whose tier 0 is OpenBLAS and whose graph computes Y (the
 * forward product). */
static int forward_gemm_entry(const nf_session *s) {
  for (int k = 0; k < s->kt.n_kents; k++) {
    const nf_graph *g = s->kt.kents[k].g;
    if (!s->kt.kents[k].gemm) continue;
    for (uint32_t o = 0; o < g->n_outputs; o++)
      if (!strcmp(g->tensors[g->outputs[o]].name, "Y")) return k;
  }
  return -1;
}

/* A record of verified kernels (and its .speed verdicts) in a new
 * directory, for this test process; X filled from seed. */
static float slow_X[256 * 512];
static nf_session_opts verdict_setup(char dir[], char rec[256], char speed[300], uint64_t seed) {
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(rec, 256, "%s/verified-kernels", dir);
  snprintf(speed, 300, "%s.speed", rec);
  setenv("NEOFLOW_VERIFIED", rec, 1);
  rng_seed(seed);
  fill_gauss(slow_X, 256 * 512);
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_SGD, .lr = 1e-3}, .seed = 3, .daemon = "none",
                       .threads = 1};
  return o;
}

static void verdict_cleanup(const char *dir, const char *rec, const char *speed) {
  unlink(speed);
  unlink(rec);
  rmdir(dir);
}

START_TEST(session_slow_kernel_keeps_tier0) {
  char dir[] = "/tmp/nf_verdict_XXXXXX", rec[256], speed[300];
  nf_session_opts o = verdict_setup(dir, rec, speed, 8);
  nf_model *m = load_text("slow.nf", slow_model);
  float *X = slow_X;
  const size_t xbytes = sizeof slow_X;
  nf_schedule *naive = nf_schedule_new();
  ck_assert_ptr_nonnull(naive);

  /* session 1: the canary measures the kernel against OpenBLAS */
  nf_session *a = open_def(m, "slowm", &o);
  int k = forward_gemm_entry(a);
  ck_assert_int_ge(k, 0);
  uint8_t sha[32], sha2[32];
  offer_scheduled(a, k, naive, sha);
  feed(a, "X", X, xbytes);
  step(a);
  nf_session_stats st = stats(a);
  ck_assert_msg(st.swaps == 1 && st.rejected == 0, "swaps %lld, rejected %lld: %s",
                (long long)st.swaps, (long long)st.rejected, session_log(a));
  /* the canary alone never condemns a kernel: a race follows, and stops
   * after two pairs of runs that far apart */
  ck_assert_int_eq(a->kt.kents[k].race_left, NF_RACE_RUNS);
  int steps = 1;
  while (a->kt.kents[k].race_left > 0 && steps < 10) {
    step(a);
    steps++;
  }
  ck_assert_msg(steps == 5, "the race took %d steps", steps);
  st = stats(a);
  ck_assert_msg(st.tier0_kept == 1 && st.blas_kept == 1 && st.tier1 == 0,
                "kept %d/%d, tier1 %d: the slow kernel replaced OpenBLAS: %s", st.tier0_kept,
                st.blas_kept, st.tier1, session_log(a));
  ck_assert_int_eq(a->kt.kents[k].prefer_t0, 1);
  ck_assert_msg(a->kt.kents[k].slow_ratio > 3, "ratio %g", a->kt.kents[k].slow_ratio);
  ck_assert_int_eq(a->kt.kents[k].ask_better, 1);
  ck_assert_ptr_nonnull(strstr(session_log(a), "slower than OpenBLAS"));
  /* later steps stay on OpenBLAS */
  for (int i = 0; i < 3; i++) step(a);
  ck_assert_int_eq(stats(a).tier0_kept, 1);
  /* the verdict is on record: the kernel's key and bytes at 1 thread */
  struct stat sb;
  ck_assert_int_eq(stat(speed, &sb), 0);
  ck_assert_int_eq(sb.st_size, 96);
  ck_assert_int_eq(sb.st_mode & 0777, 0600);
  const nf__verdict *v = nf__verdict_get(a, a->kt.kents[k].key, sha);
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->flags, NF__VERDICT_SLOWER | NF__VERDICT_RACED);
  ck_assert(v->kernel_ms > 3 * v->tier0_ms);
  nf_session_free(a);

  /* session 2: the same bytes are trusted and left unused at once */
  nf_session *b = open_def(m, "slowm", &o);
  ck_assert_int_eq(forward_gemm_entry(b), k);
  offer_scheduled(b, k, naive, sha2);
  ck_assert(!memcmp(sha, sha2, 32));
  feed(b, "X", X, xbytes);
  step(b);
  st = stats(b);
  ck_assert_msg(st.trusted == 1 && st.remembered == 1, "trusted %lld, remembered %lld: %s",
                (long long)st.trusted, (long long)st.remembered, session_log(b));
  ck_assert_int_eq(st.tier0_kept, 1);
  ck_assert_int_eq(b->kt.kents[k].race_left, 0);
  ck_assert_int_eq(b->kt.kents[k].probe, 0);
  ck_assert_int_eq(b->kt.kents[k].ask_better, 1);
  ck_assert_ptr_nonnull(strstr(session_log(b), "ran"));
  nf_session_free(b);

  /* at another thread count the verdict does not apply: measured again */
  o.threads = 2;
  nf_session *c = open_def(m, "slowm", &o);
  offer_scheduled(c, k, naive, sha2);
  feed(c, "X", X, xbytes);
  step(c);
  st = stats(c);
  ck_assert_int_eq(st.remembered, 0);
  ck_assert_int_eq(st.trusted, 1);
  nf_session_free(c);

  /* a torn final entry (a crash mid-write) is ignored, later ones align */
  int fd = open(speed, O_WRONLY | O_APPEND);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, "torn", 4), 4);
  close(fd);
  o.threads = 1;
  nf_session *d = open_def(m, "slowm", &o);
  ck_assert_ptr_nonnull(nf__verdict_get(d, d->kt.kents[k].key, sha));
  nf__verdict_put(d, d->kt.kents[k].key, sha, 1.0, 2.0, 0); /* overrules: faster */
  nf_session_free(d);
  /* a loss found while the daemon worked beside the race is raced again */
  {
    nf_session *f = open_def(m, "slowm", &o);
    nf__verdict_put(f, f->kt.kents[k].key, sha, 9.0, 1.0,
                    NF__VERDICT_SLOWER | NF__VERDICT_RACED | NF__VERDICT_BUSY);
    nf_session_free(f);
    nf_session *g = open_def(m, "slowm", &o);
    offer_scheduled(g, k, naive, sha2);
    feed(g, "X", X, xbytes);
    step(g);
    ck_assert_int_eq(stats(g).remembered, 0);
    ck_assert_int_gt(g->kt.kents[k].race_left, 0);
    nf_session_free(g);
    nf_session *h = open_def(m, "slowm", &o);
    nf__verdict_put(h, h->kt.kents[k].key, sha, 1.0, 2.0, 0);
    nf_session_free(h);
  }
  ck_assert_int_eq(stat(speed, &sb), 0);
  ck_assert_int_eq(sb.st_size % 96, 0);
  nf_session *e = open_def(m, "slowm", &o);
  v = nf__verdict_get(e, e->kt.kents[k].key, sha);
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->flags & NF__VERDICT_SLOWER, 0);
  nf_session_free(e);

  nf_schedule_free(naive);
  nf_model_free(m);
  verdict_cleanup(dir, rec, speed);
}
END_TEST

/* A kernel far faster than the interpreter replaces it at once, with a
 * verdict on record; the next session trusts it without a race. */
START_TEST(session_fast_kernel_verdict) {
  char dir[] = "/tmp/nf_verdict_XXXXXX", rec[256], speed[300];
  nf_session_opts o = verdict_setup(dir, rec, speed, 9);
  nf_model *m = load_text("slow.nf", slow_model);
  float *X = slow_X;
  const size_t xbytes = sizeof slow_X;
  int kept_total = 0, judged = 0;
  uint8_t shas[64][32];
  nf_session *a = open_def(m, "slowm", &o);
  ck_assert_int_le(a->kt.n_kents, 64);
  for (int k = 0; k < a->kt.n_kents; k++)
    if (!a->kt.kents[k].gemm) offer_scheduled(a, k, NULL, shas[k]);
  feed(a, "X", X, xbytes);
  for (int i = 0; i < 8; i++) step(a); /* canaries, then any race to its end */
  for (int k = 0; k < a->kt.n_kents; k++) {
    if (a->kt.kents[k].gemm) continue;
    ck_assert_int_eq(a->kt.kents[k].race_left, 0);
    kept_total += a->kt.kents[k].prefer_t0;
    judged += nf__verdict_get(a, a->kt.kents[k].key, shas[k]) != NULL;
  }
  ck_assert_int_gt(judged, 0);
  ck_assert_msg(kept_total == 0, "%d default kernels lost to the interpreter: %s", kept_total,
                session_log(a));
  nf_session_free(a);
  nf_session *b = open_def(m, "slowm", &o);
  for (int k = 0; k < b->kt.n_kents; k++)
    if (!b->kt.kents[k].gemm) offer_scheduled(b, k, NULL, shas[k]);
  feed(b, "X", X, xbytes);
  step(b);
  nf_session_stats st = stats(b);
  ck_assert_int_eq(st.remembered, judged);
  ck_assert_int_eq(st.tier0_kept, 0);
  for (int k = 0; k < b->kt.n_kents; k++) ck_assert_int_eq(b->kt.kents[k].race_left, 0);
  nf_session_free(b);
  nf_model_free(m);
  verdict_cleanup(dir, rec, speed);
}
END_TEST

/* ---- 6. damaged and wrong kernels are refused ---- */

START_TEST(session_corrupted_kernel_rejected) {
  nf_model *m = load_example("mlp.nf");
  mlp_data *d = mlp_data_new(13);
  nf_session_opts o = mlp_opts();
  o.quiet = 1; /* rejections are warned about */
  nf_session *s = open_def(m, "mlp", &o);
  nf_session *ref = open_def(m, "mlp", &o);
  /* an entry of one op that runs in the interpreter at tier 0 gets a
   * verified compiled kernel, then the attacks */
  int k = -1;
  for (int i = 0; i < s->kt.n_kents && k < 0; i++)
    if (!s->kt.kents[i].alias && !s->kt.kents[i].gemm && s->kt.kents[i].n_ops == 1) k = i;
  ck_assert_int_ge(k, 0);
  int rc = offer_compiled(s, k);
  ck_assert_msg(rc == NF_OK, "offer: %s: %s", nf_strerror(rc), session_log(s));
  mlp_feed(s, d, 0);
  mlp_feed(ref, d, 0);
  double l0 = step(s), r0 = step(ref);
  ck_assert_msg(l0 == r0, "step 1: %.9g vs %.9g", l0, r0);
  nf_session_stats st = stats(s);
  ck_assert_int_eq(st.swaps, 1);
  ck_assert_int_eq(st.rejected, 0);
  /* its kernel, or the interpreter where that ran faster (a tiny op) */
  ck_assert_int_eq(st.tier1 + st.tier0_kept, 1);
  nf_kernel *cur = s->kt.kents[k].cur;
  ck_assert_ptr_nonnull(cur);
  ck_assert_int_eq(s->kt.kents[k].cur_tier, 1);

  nf_blob so = NF_BLOB_INIT;
  compile_graph(s->kt.kents[k].g, &so);
  uint8_t sha[32];
  /* (a) the digest announced is not the bytes' */
  crypto_hash_sha256(sha, so.data, so.len);
  sha[7] ^= 0x20;
  rc = nf__kt_offer(&s->kt, k, so.data, so.len, sha, NULL, 2, 0);
  ck_assert_int_eq(rc, NF_EFORMAT);
  ck_assert_int_eq(stats(s).rejected, 1);
  ck_assert_ptr_null(s->kt.kents[k].in_obj);
  ck_assert_msg(strstr(session_log(s), "SHA-256") != NULL, "log: %s", session_log(s));
  /* (b) a damaged ELF header, with the digest of the damaged bytes */
  uint8_t *bad = malloc(so.len);
  ck_assert_ptr_nonnull(bad);
  memcpy(bad, so.data, so.len);
  ck_assert(bad[0] == 0x7f && bad[1] == 'E' && bad[2] == 'L' && bad[3] == 'F');
  bad[1] = 'X';
  crypto_hash_sha256(sha, bad, so.len);
  rc = nf__kt_offer(&s->kt, k, bad, so.len, sha, NULL, 2, 0);
  ck_assert_msg(rc == NF_EFORMAT, "damaged ELF: %s", nf_strerror(rc));
  ck_assert_int_eq(stats(s).rejected, 2);
  ck_assert_ptr_null(s->kt.kents[k].in_obj);
  /* ... and a valid header on a truncated image */
  memcpy(bad, so.data, so.len);
  crypto_hash_sha256(sha, bad, so.len / 3);
  rc = nf__kt_offer(&s->kt, k, bad, so.len / 3, sha, NULL, 2, 0);
  ck_assert_msg(rc != NF_OK, "truncated ELF accepted");
  ck_assert_int_eq(stats(s).rejected, 3);
  ck_assert_ptr_null(s->kt.kents[k].in_obj);
  free(bad);
  nf_blob_free(&so);
  /* (c) a valid kernel of another graph with the same buffers: it loads,
   * and its canary at the next step refuses it */
  nf_ir_ctx *wctx = nf_ir_ctx_new();
  nf_graph *w = wrong_twin(wctx, s->kt.kents[k].g);
  compile_graph(w, &so);
  crypto_hash_sha256(sha, so.data, so.len);
  rc = nf__kt_offer(&s->kt, k, so.data, so.len, sha, NULL, 2, 0);
  ck_assert_msg(rc == NF_OK, "the wrong kernel should load: %s: %s", nf_strerror(rc),
                session_log(s));
  ck_assert_ptr_nonnull(s->kt.kents[k].in_obj);
  nf_blob_free(&so);
  st = stats(s);
  ck_assert_int_eq(st.rejected, 3);
  mlp_feed(s, d, 1);
  mlp_feed(ref, d, 1);
  double l1 = step(s), r1 = step(ref);
  st = stats(s);
  ck_assert_msg(st.rejected == 4, "rejected %lld: %s", (long long)st.rejected, session_log(s));
  ck_assert_int_eq(st.swaps, 1);
  ck_assert_ptr_eq(s->kt.kents[k].cur, cur);
  ck_assert_int_eq(s->kt.kents[k].cur_tier, 1);
  ck_assert_ptr_null(s->kt.kents[k].cand);
  ck_assert_ptr_null(s->kt.kents[k].in_obj);
  ck_assert_int_eq(st.tier1 + st.tier0_kept, 1);
  ck_assert_int_eq(st.tier2, 0);
  ck_assert_msg(strstr(session_log(s), "differ from the reference") != NULL, "log: %s",
                session_log(s));
  ck_assert_msg(fabs(l1 - r1) <= 1e-5 * fabs(r1), "step 2: %.9g vs tier 0 %.9g", l1, r1);
  /* and it keeps running the verified kernel */
  mlp_feed(s, d, 2);
  mlp_feed(ref, d, 2);
  double l2 = step(s), r2 = step(ref);
  ck_assert_msg(fabs(l2 - r2) <= 1e-5 * fabs(r2), "step 3: %.9g vs tier 0 %.9g", l2, r2);
  ck_assert_ptr_eq(s->kt.kents[k].cur, cur);
  ck_assert_int_eq(stats(s).rejected, 4);
  nf_ir_ctx_free(wctx);
  nf_session_free(s);
  nf_session_free(ref);
  nf_model_free(m);
  free(d);
}
END_TEST

/* ---- a neoflowd of our own (nf_test_daemon.h) ---- */

/* 1 when something answers on the socket. */
static int connects(const char *path) {
  int fd = try_connect(path);
  if (fd < 0) return 0;
  close(fd);
  return 1;
}

static void rm_rf(const char *dir) {
  if (getenv("NF_TEST_KEEP")) return;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* ---- 7. the daemon dies and comes back ---- */

START_TEST(session_daemon_killed_and_back) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  nf_model *m = load_example("mlp.nf");
  mlp_data *data = mlp_data_new(14);
  nf_session_opts o = mlp_opts();
  o.daemon = d.sock;
  o.no_spawn = 1;
  o.compile_only = 1;
  o.quiet = 1; /* the lost connection is warned about */
  nf_session *s = open_def(m, "mlp", &o);
  int64_t n = 0;
  nf_session_stats st = stats(s);
  double t0 = now_ms();
  /* every entry has its daemon kernel: in use, or kept out by OpenBLAS
   * winning the race after the swap */
  while (st.tier1 + st.tier0_kept < st.kernels && now_ms() - t0 < 120000) {
    nf_session_wait_kernels(s, 200, 1);
    mlp_feed(s, data, n++);
    step(s);
    st = stats(s);
  }
  ck_assert_msg(st.tier1 + st.tier0_kept == st.kernels, "%d of %d kernels at tier 1 after %.0f ms (see %s): %s",
                st.tier1, st.kernels, now_ms() - t0, d.log, session_log(s));
  ck_assert_int_eq(st.rejected, 0);
  ck_assert_int_eq(st.swaps, st.kernels);
  ck_assert_int_eq(st.connected, 1);
  ck_assert_int_eq(st.reconnects, 0);
  ck_assert_int_eq(st.blas, st.blas_kept);

  /* SIGKILL: every step still works, on the kernels it has */
  ck_assert_int_eq(dm_stop(&d, SIGKILL), 128 + SIGKILL);
  t0 = now_ms();
  int steps_after = 0;
  while (now_ms() - t0 < 2000) {
    mlp_feed(s, data, n++);
    step(s);
    steps_after++;
    sleep_ms(5);
  }
  st = stats(s);
  ck_assert_int_gt(steps_after, 10);
  ck_assert_int_eq(st.connected, 0);
  ck_assert_int_eq(st.tier1 + st.tier0_kept, st.kernels);
  ck_assert_int_eq(st.step, n);
  ck_assert_msg(strstr(session_log(s), "lost the daemon connection") != NULL, "log: %s",
                session_log(s));

  /* back on the same socket and cache: the session reconnects */
  dm_start(&d);
  t0 = now_ms();
  while (!(st.connected == 1 && st.reconnects >= 1) && now_ms() - t0 < 20000) {
    mlp_feed(s, data, n++);
    step(s);
    sleep_ms(20);
    st = stats(s);
  }
  ck_assert_msg(st.connected == 1 && st.reconnects >= 1,
                "not reconnected after 20 s: connected %d, reconnects %lld", st.connected,
                (long long)st.reconnects);
  ck_assert_int_eq(st.tier1 + st.tier0_kept, st.kernels);
  ck_assert_int_eq(st.rejected, 0);
  nf_session_free(s);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  rm_rf(d.dir);
  nf_model_free(m);
  free(data);
}
END_TEST

/* ---- 8. two clients, no daemon: one daemon ---- */

static const char tiny_model[] =
    "def tiny(X: f32[4, 3], y: f32[4]) -> (L: f32[]) {\n"
    "  param W: f32[3] = constant(0.25)\n"
    "  P(i) +=! X(i, j) * W(j)\n"
    "  D(i) = tanh(P(i)) - y(i)\n"
    "  S() +=! D(i) * D(i)\n"
    "  L() = S() / 4.0\n"
    "}\n";

/* A client process: waits on the pipe, opens a session (the default
 * daemon: $NEOFLOW_SOCKET, spawned when nothing answers) and steps until
 * connected.  The exit status says what failed. */
static int client_main(int go_fd) {
  char *err = NULL;
  nf_model *m = nf_model_load_source("tiny.nf", tiny_model, &err);
  if (!m) return 2;
  char c;
  if (read(go_fd, &c, 1) != 1) return 3;
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_SGD, .lr = 0.01}, .compile_only = 1,
                       .quiet = 1, .threads = 1};
  nf_session *s = nf_session_new_def(m, "tiny", &o, &err);
  if (!s) return 4;
  float X[12], y[4];
  for (int i = 0; i < 12; i++) X[i] = (float)(i % 5) / 5.0f - 0.4f;
  for (int i = 0; i < 4; i++) y[i] = 0.1f * (float)i;
  if (nf_session_feed(s, "X", X, sizeof X) || nf_session_feed(s, "y", y, sizeof y)) return 5;
  double t0 = now_ms();
  nf_session_stats st;
  memset(&st, 0, sizeof st);
  while (now_ms() - t0 < 20000) {
    if (nf_session_step(s, NULL) != NF_OK) return 6;
    nf_session_stats_get(s, &st);
    if (st.connected) break;
    sleep_ms(10);
  }
  nf_session_free(s);
  nf_model_free(m);
  return st.connected ? 0 : 7;
}

/* Live neoflowd processes (not job workers, not zombies) whose
 * environment holds env (e.g. "NEOFLOW_SOCKET=/tmp/..."); the last one's
 * pid in *pid. */
static int count_daemons(const char *env, pid_t *pid) {
  DIR *dir = opendir("/proc");
  ck_assert_ptr_nonnull(dir);
  struct dirent *e;
  int n = 0;
  size_t el = strlen(env);
  while ((e = readdir(dir))) {
    char *end;
    long p = strtol(e->d_name, &end, 10);
    if (*end || p <= 0) continue;
    char path[300], buf[65536];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", p);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (len == 0) continue; /* a zombie or a kernel thread */
    buf[len] = 0;
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (strcmp(base, "neoflowd") != 0) continue;
    size_t a0 = strlen(buf) + 1;
    if (a0 < len && !strcmp(buf + a0, "--job")) continue;
    snprintf(path, sizeof path, "/proc/%ld/stat", p);
    f = fopen(path, "r");
    char state = 0;
    if (f) {
      if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = 0;
      fclose(f);
    }
    if (state == 'Z' || state == 'X') continue;
    snprintf(path, sizeof path, "/proc/%ld/environ", p);
    f = fopen(path, "r");
    if (!f) continue;
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    int found = 0;
    for (size_t i = 0; i < len && !found; i += strlen(buf + i) + 1) {
      found = strlen(buf + i) == el && !memcmp(buf + i, env, el);
    }
    if (found) {
      n++;
      *pid = (pid_t)p;
    }
  }
  closedir(dir);
  return n;
}

static int alive(pid_t pid) {
  char path[64], state = 0;
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = 0;
  fclose(f);
  return state != 0 && state != 'Z' && state != 'X';
}

START_TEST(session_two_clients_one_daemon) {
  const char *exe = getenv("NF_NEOFLOWD");
  ck_assert_msg(exe != NULL, "NF_NEOFLOWD is not set");
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  setenv("NEOFLOW_SOCKET", d.sock, 1);
  setenv("NEOFLOW_CACHE", d.cache, 1);
  setenv("XDG_CONFIG_HOME", d.dir, 1); /* no user configuration */
  char env[400];
  snprintf(env, sizeof env, "NEOFLOW_SOCKET=%s", d.sock);
  pid_t none = 0;
  ck_assert_int_eq(count_daemons(env, &none), 0);
  ck_assert(!connects(d.sock));
  int go[2];
  ck_assert_int_eq(pipe(go), 0);
  pid_t kids[2];
  for (int i = 0; i < 2; i++) {
    kids[i] = fork();
    ck_assert_int_ge(kids[i], 0);
    if (kids[i] == 0) {
      close(go[1]);
      _exit(client_main(go[0]));
    }
  }
  close(go[0]);
  sleep_ms(100); /* both start when the pipe has its two bytes */
  ck_assert_int_eq(write(go[1], "gg", 2), 2);
  close(go[1]);
  for (int i = 0; i < 2; i++) {
    int st = 0;
    ck_assert_int_eq(waitpid(kids[i], &st, 0), kids[i]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d: %s %d", i,
                  WIFEXITED(st) ? "exit" : "signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  }
  /* one daemon serves the socket (a second start, if a client made one,
   * has refused and is gone within a moment) */
  pid_t pid = 0;
  int n = 0;
  for (int i = 0; i < 200; i++) {
    n = count_daemons(env, &pid);
    if (n == 1) break;
    sleep_ms(25);
  }
  ck_assert_msg(n == 1, "%d neoflowd processes serve %s", n, d.sock);
  ck_assert(connects(d.sock));
  /* another start on the same socket and cache is refused and names it */
  char cmd[1400], line[1024];
  snprintf(cmd, sizeof cmd, "'%s' 2>'%s/second.log'", exe, d.dir);
  int st = system(cmd);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a second daemon started (%d)", st);
  snprintf(cmd, sizeof cmd, "%s/second.log", d.dir);
  FILE *f = fopen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  long named = 0;
  while (fgets(line, sizeof line, f) && !named) {
    const char *p = strstr(line, "(pid ");
    if (p && (strstr(line, "in use by another neoflowd") || strstr(line, "already running")))
      named = strtol(p + 5, NULL, 10);
  }
  fclose(f);
  ck_assert_msg(named == (long)pid, "the second start names pid %ld, the daemon is %ld", named,
                (long)pid);
  ck_assert_int_eq(count_daemons(env, &pid), 1);
  /* and it stops on SIGTERM */
  ck_assert_int_eq(kill(pid, SIGTERM), 0);
  double t0 = now_ms();
  while (alive(pid) && now_ms() - t0 < 15000) sleep_ms(25);
  ck_assert_msg(!alive(pid), "neoflowd %ld did not stop on SIGTERM", (long)pid);
  ck_assert(!connects(d.sock));
  unsetenv("NEOFLOW_SOCKET");
  unsetenv("NEOFLOW_CACHE");
  unsetenv("XDG_CONFIG_HOME");
  rm_rf(d.dir);
}
END_TEST

/* ---- 9. parameter files ---- */

static const char save_model_a[] =
    "def m(X: f32[4, 3], y: f32[4]) -> (L: f32[]) {\n"
    "  param W: f32[2, 3] = uniform(-1, 1)\n"
    "  param c: f32[2] = normal(0, 1)\n"
    "  P(i, o) +=! X(i, j) * W(o, j)\n"
    "  D(i, o) = P(i, o) + c(o) - y(i)\n"
    "  S() +=! D(i, o) * D(i, o)\n"
    "  L() = S() / 8.0\n"
    "}\n"
    /* the same bytes, W transposed */
    "def t(X: f32[4, 3], y: f32[4]) -> (L: f32[]) {\n"
    "  param W: f32[3, 2] = uniform(-1, 1)\n"
    "  param c: f32[2] = normal(0, 1)\n"
    "  P(i, o) +=! X(i, j) * W(j, o)\n"
    "  D(i, o) = P(i, o) + c(o) - y(i)\n"
    "  S() +=! D(i, o) * D(i, o)\n"
    "  L() = S() / 8.0\n"
    "}\n"
    /* another size */
    "def big(X: f32[4, 3], y: f32[4]) -> (L: f32[]) {\n"
    "  param W: f32[5, 3] = uniform(-1, 1)\n"
    "  param c: f32[5] = normal(0, 1)\n"
    "  P(i, o) +=! X(i, j) * W(o, j)\n"
    "  D(i, o) = P(i, o) + c(o) - y(i)\n"
    "  S() +=! D(i, o) * D(i, o)\n"
    "  L() = S() / 20.0\n"
    "}\n";

static void read_file(const char *path, uint8_t **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  ck_assert_int_gt(n, 0);
  *data = malloc((size_t)n);
  ck_assert_ptr_nonnull(*data);
  ck_assert_uint_eq(fread(*data, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
}

static void write_file(const char *path, const uint8_t *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* The training report (client/report.c): written every period while the
 * session steps, atomically; its history bounded (a point stands for
 * several steps once there are more than its points); metrics noted; a
 * path that cannot be written said, the session unharmed; the last state
 * written when the session is freed. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *t = malloc((size_t)n + 1);
  if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (t) t[n] = 0;
  fclose(f);
  return t;
}

START_TEST(session_report) {
  char dir[] = "/tmp/nf_report_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[256], tmp[300], bad[300];
  snprintf(path, sizeof path, "%s/r.html", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  snprintf(bad, sizeof bad, "%s/no/such/dir/r.html", dir);
  nf_model *m = load_text("save.nf", save_model_a);
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_SGD, .lr = 0.01}, .seed = 3, .daemon = "none"};
  nf_session *s = open_def(m, "m", &o);
  float X[12], y[4];
  rng_seed(5);
  fill_gauss(X, 12);
  fill_gauss(y, 4);
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);
  ck_assert_int_eq(nf_session_report_to(s, path, 0.05), NF_OK);
  for (int i = 0; i < 40; i++) {
    step(s);
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  char *t = slurp(path); /* written during the run, by the period */
  ck_assert_msg(t && strstr(t, "id=\"step-time\""), "no report during the run");
  ck_assert(access(tmp, F_OK) != 0); /* (renamed over the path: no temporary left) */
  free(t);
  ck_assert_int_eq(nf_session_note(s, "test accuracy", 0.5), NF_OK);
  ck_assert_int_eq(nf_session_note(s, "", 1), NF_EINVAL);
  ck_assert_int_eq(nf_session_note(s, "x", NAN), NF_EINVAL);
  /* more steps than the history holds points: a point stands for 2+ */
  for (int i = 0; i < 4200; i++) step(s);
  ck_assert_int_eq(nf_session_note(s, "test accuracy", 0.75), NF_OK);
  ck_assert_int_eq(nf_session_report(s, NULL), NF_OK);
  t = slurp(path);
  ck_assert_ptr_nonnull(t);
  ck_assert_msg(strstr(t, "a point stands for 4 steps"), "the history is not bounded");
  ck_assert(strstr(t, ">test accuracy<") && strstr(t, "Last: 0.75 at step 4240"));
  ck_assert(strstr(t, "id=\"graph\"") && strstr(t, "id=\"profile\"") && strstr(t, "</html>"));
  free(t);
  /* a path that cannot be written: said, the session goes on */
  ck_assert_int_eq(nf_session_report(s, bad), NF_EIO);
  ck_assert_msg(strstr(nf_session_error(s), "cannot write"), "%s", nf_session_error(s));
  step(s);
  /* the last state when the session is freed */
  ck_assert_int_eq(unlink(path), 0);
  nf_session_free(s);
  t = slurp(path);
  ck_assert_msg(t && strstr(t, "step 4241"), "the report is not written at the end");
  free(t);
  unlink(path);
  rmdir(dir);
  nf_model_free(m);
}
END_TEST

START_TEST(session_save_load) {
  char dir[] = "/tmp/nf_params_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[256], bad[256], other[256];
  snprintf(path, sizeof path, "%s/m.nfp", dir);
  snprintf(bad, sizeof bad, "%s/bad.nfp", dir);
  nf_model *m = load_text("save.nf", save_model_a);
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_ADAM, .lr = 0.05}, .seed = 21, .daemon = "none"};
  nf_session *s = open_def(m, "m", &o);
  float X[12], y[4];
  rng_seed(31);
  fill_gauss(X, 12);
  fill_gauss(y, 4);
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);
  for (int i = 0; i < 3; i++) step(s); /* trained values, not the initialisers' */
  int64_t n = 0;
  float *saved = all_params(s, &n);
  ck_assert_int_eq(n, 8);
  ck_assert_int_eq(nf_session_save(s, path), NF_OK);
  /* no temporary file is left behind */
  DIR *dd = opendir(dir);
  int n_files = 0;
  for (struct dirent *e; (e = readdir(dd));) n_files += e->d_name[0] != '.';
  closedir(dd);
  ck_assert_int_eq(n_files, 1);

  /* perturb, load: bit for bit what was saved */
  float pw[6], pc[2];
  for (int i = 0; i < 6; i++) pw[i] = 100.0f + (float)i;
  for (int i = 0; i < 2; i++) pc[i] = -7.0f - (float)i;
  ck_assert_int_eq(nf_session_set_param(s, "W", pw, 6), NF_OK);
  ck_assert_int_eq(nf_session_set_param(s, "c", pc, 2), NF_OK);
  float *cur = all_params(s, &n);
  ck_assert(memcmp(cur, saved, sizeof(float) * 8) != 0);
  free(cur);
  int rc = nf_session_load(s, path);
  ck_assert_msg(rc == NF_OK, "load: %s: %s", nf_strerror(rc), nf_session_error(s));
  cur = all_params(s, &n);
  ck_assert(memcmp(cur, saved, sizeof(float) * 8) == 0);
  free(cur);
  /* and training goes on from them */
  step(s);

  /* one flipped byte: refused, nothing changes */
  ck_assert_int_eq(nf_session_set_param(s, "W", pw, 6), NF_OK);
  ck_assert_int_eq(nf_session_set_param(s, "c", pc, 2), NF_OK);
  float *before = all_params(s, &n);
  uint8_t *file = NULL;
  size_t len = 0;
  read_file(path, &file, &len);
  for (size_t at = 0; at < len; at += len / 7 + 1) {
    file[at] ^= 0x01;
    write_file(bad, file, len);
    file[at] ^= 0x01;
    rc = nf_session_load(s, bad);
    ck_assert_msg(rc == NF_EFORMAT, "byte %zu flipped: %s", at, nf_strerror(rc));
    float *after = all_params(s, &n);
    ck_assert_msg(memcmp(after, before, sizeof(float) * 8) == 0, "byte %zu: parameters changed",
                  at);
    free(after);
  }
  /* in the values: the digest catches it */
  file[len - 40] ^= 0x80;
  write_file(bad, file, len);
  rc = nf_session_load(s, bad);
  ck_assert_int_eq(rc, NF_EFORMAT);
  ck_assert_msg(strstr(nf_session_error(s), "SHA-256") != NULL, "message: %s",
                nf_session_error(s));
  ck_assert_msg(strstr(nf_session_error(s), bad) != NULL, "message: %s", nf_session_error(s));
  float *after = all_params(s, &n);
  ck_assert(memcmp(after, before, sizeof(float) * 8) == 0);
  free(after);
  free(file);
  /* a truncated file */
  read_file(path, &file, &len);
  write_file(bad, file, len - 1);
  ck_assert_int_eq(nf_session_load(s, bad), NF_EFORMAT);
  free(file);
  ck_assert_int_eq(nf_session_load(s, "/nonexistent/dir/p.nfp"), NF_EIO);
  ck_assert_msg(strstr(nf_session_error(s), "/nonexistent/dir/p.nfp") != NULL, "message: %s",
                nf_session_error(s));

  /* files of other models */
  nf_session *t = open_def(m, "t", &o);
  snprintf(other, sizeof other, "%s/t.nfp", dir);
  ck_assert_int_eq(nf_session_save(t, other), NF_OK);
  rc = nf_session_load(s, other);
  ck_assert_int_eq(rc, NF_EFORMAT);
  ck_assert_msg(strstr(nf_session_error(s), "'W'") && strstr(nf_session_error(s), "dimension"),
                "message: %s", nf_session_error(s));
  nf_session *b = open_def(m, "big", &o);
  snprintf(other, sizeof other, "%s/big.nfp", dir);
  ck_assert_int_eq(nf_session_save(b, other), NF_OK);
  rc = nf_session_load(s, other);
  ck_assert_int_eq(rc, NF_EFORMAT);
  ck_assert_msg(strstr(nf_session_error(s), "another model") != NULL, "message: %s",
                nf_session_error(s));
  after = all_params(s, &n);
  ck_assert(memcmp(after, before, sizeof(float) * 8) == 0);
  free(after);
  /* the other way: s's file does not fit big */
  ck_assert_int_eq(nf_session_load(b, path), NF_EFORMAT);
  free(before);
  free(saved);
  nf_session_free(b);
  nf_session_free(t);
  nf_session_free(s);
  nf_model_free(m);
  rm_rf(dir);
}
END_TEST

/* ---- 10. bad input ---- */

static const char bad_model[] =
    "def vec(X: f32[3]) -> (Y: f32[3]) {\n"
    "  param W: f32[3] = ones\n"
    "  Y(i) = X(i) * W(i)\n"
    "}\n"
    "def ok(X: f32[4, 3], y: f32[4]) -> (L: f32[]) {\n"
    "  param W: f32[3] = constant(0.5)\n"
    "  P(i) +=! X(i, j) * W(j)\n"
    "  D(i) = P(i) - y(i)\n"
    "  S() +=! D(i) * D(i)\n"
    "  L() = S() / 4.0\n"
    "}\n";

START_TEST(session_bad_input) {
  nf_model *m = load_text("bad.nf", bad_model);
  nf_session_opts o = {.daemon = "none", .quiet = 1};
  char *err = NULL;
  nf_session *s = nf_session_new_def(m, "nosuchdef", &o, &err);
  ck_assert_ptr_null(s);
  ck_assert_msg(err && strstr(err, "nosuchdef"), "message: %s", err ? err : "(none)");
  free(err);
  err = NULL;
  s = nf_session_new_def(m, "vec", &o, &err);
  ck_assert_ptr_null(s);
  ck_assert_msg(err && strstr(err, "scalar loss"), "message: %s", err ? err : "(none)");
  free(err);
  err = NULL;
  s = nf_session_new_def(NULL, "ok", &o, &err);
  ck_assert_ptr_null(s);
  ck_assert_ptr_nonnull(err);
  free(err);
  /* a model that does not parse */
  err = NULL;
  ck_assert_ptr_null(nf_model_load_source(
      "broken.nf", "def f(X: f32[3]) -> (Y: f32[]) {\n  Y() +=! \n}\n", &err));
  ck_assert_msg(err && strstr(err, "broken.nf"), "message: %s", err ? err : "(none)");
  free(err);

  err = NULL;
  s = nf_session_new_def(m, "ok", &o, &err);
  ck_assert_msg(s != NULL, "%s", err ? err : "?");
  float X[12] = {0}, y[4] = {0};
  /* wrong sizes */
  ck_assert_int_eq(nf_session_feed(s, "X", X, sizeof X - 4), NF_EINVAL);
  ck_assert_msg(strstr(nf_session_error(s), "'X'") && strstr(nf_session_error(s), "48"),
                "message: %s", nf_session_error(s));
  ck_assert_int_eq(nf_session_feed(s, "X", X, sizeof X + 4), NF_EINVAL);
  ck_assert_int_eq(nf_session_feed(s, "nope", X, sizeof X), NF_ENOENT);
  ck_assert_msg(strstr(nf_session_error(s), "nope") != NULL, "message: %s", nf_session_error(s));
  ck_assert_int_eq(nf_session_feed(s, "X", NULL, sizeof X), NF_EINVAL);
  /* reading */
  ck_assert_int_eq(nf_session_read(s, "nothing", X, 4), NF_ENOENT);
  ck_assert_msg(strstr(nf_session_error(s), "nothing") != NULL, "message: %s", nf_session_error(s));
  ck_assert_int_eq(nf_session_read(s, "grad_nothing", X, 4), NF_ENOENT);
  ck_assert_int_eq(nf_session_read(s, "W", X, 8), NF_EINVAL);
  ck_assert_msg(strstr(nf_session_error(s), "'W'") && strstr(nf_session_error(s), "12"),
                "message: %s", nf_session_error(s));
  /* parameters and the learning rate */
  ck_assert_int_eq(nf_session_set_param(s, "W", X, 2), NF_EINVAL);
  ck_assert_int_eq(nf_session_set_param(s, "V", X, 3), NF_ENOENT);
  ck_assert_int_eq(nf_session_set_lr(s, 0), NF_EINVAL);
  ck_assert_int_eq(nf_session_set_lr(s, -1), NF_EINVAL);
  ck_assert_int_eq(nf_session_set_lr(s, NAN), NF_EINVAL);
  ck_assert_int_eq(nf_session_set_lr(s, INFINITY), NF_EINVAL);
  ck_assert_int_eq(nf_session_set_lr(s, 0.1), NF_OK);
  ck_assert_int_eq(nf_session_param_info(s, 1, NULL, NULL, NULL, NULL), NF_EINVAL);
  ck_assert_int_eq(nf_session_input_info(s, -1, NULL, NULL, NULL, NULL), NF_EINVAL);
  /* none of that touched the session: it steps */
  ck_assert_int_eq(nf_session_feed(s, "X", X, sizeof X), NF_OK);
  ck_assert_int_eq(nf_session_feed(s, "y", y, sizeof y), NF_OK);
  double loss = -1;
  ck_assert_int_eq(nf_session_step(s, &loss), NF_OK);
  ck_assert(loss == 0.0); /* zeros in, zeros out */
  ck_assert_str_eq(nf_session_error(s), "");
  ck_assert_int_eq(nf_session_step(NULL, &loss), NF_EINVAL);
  nf_session_free(NULL);
  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* Every initializer of the language fills its parameter as documented
 * (docs/language.md "Parameters"): constants exactly, random ones within
 * their bounds with about the right moments, the same seed the same
 * values. */
static const char init_model[] =
    "def m(X: f32[4, 100]) -> (L: f32[]) {\n"
    "  param Z: f32[100] = zeros\n"
    "  param O: f32[100] = ones\n"
    "  param C: f32[100] = constant(2.5)\n"
    "  param U: f32[2000] = uniform(-0.5, 1.5)\n"
    "  param N: f32[4000] = normal(1.0, 2.0)\n"
    "  param XU: f32[50, 100] = xavier_uniform\n"
    "  param KU: f32[50, 100] = kaiming_uniform\n"
    "  param KN: f32[50, 100] = kaiming_normal\n"
    "  A() +=! X(b, i) * (Z(i) + O(i) + C(i) + XU(0, i) + KU(0, i) + KN(0, i))\n"
    "  Bu() +=! U(j)\n"
    "  Bn() +=! N(k)\n"
    "  L() = A() + Bu() + Bn()\n"
    "}\n";

static void moments(const float *x, int n, double *mean, double *sd, double *lo, double *hi) {
  double a = 0, b = 0;
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int i = 0; i < n; i++) {
    a += x[i];
    b += (double)x[i] * x[i];
    if (x[i] < *lo) *lo = x[i];
    if (x[i] > *hi) *hi = x[i];
  }
  *mean = a / n;
  *sd = sqrt(b / n - *mean * *mean);
}

START_TEST(session_initializers) {
  nf_model *m = load_text("init.nf", init_model);
  nf_session_opts o = {.daemon = "none", .quiet = 1, .seed = 3};
  nf_session *s = open_def(m, "m", &o);
  static float v[5000], w[5000];
  double mean, sd, lo, hi;
  read_t(s, "Z", v, 100 * sizeof(float));
  for (int i = 0; i < 100; i++) ck_assert_float_eq(v[i], 0.0f);
  read_t(s, "O", v, 100 * sizeof(float));
  for (int i = 0; i < 100; i++) ck_assert_float_eq(v[i], 1.0f);
  read_t(s, "C", v, 100 * sizeof(float));
  for (int i = 0; i < 100; i++) ck_assert_float_eq(v[i], 2.5f);
  read_t(s, "U", v, 2000 * sizeof(float));
  moments(v, 2000, &mean, &sd, &lo, &hi);
  ck_assert(lo >= -0.5 && hi < 1.5 && fabs(mean - 0.5) < 0.05 && fabs(sd - 2 / sqrt(12)) < 0.03);
  read_t(s, "N", v, 4000 * sizeof(float));
  moments(v, 4000, &mean, &sd, &lo, &hi);
  ck_assert_msg(fabs(mean - 1.0) < 0.1 && fabs(sd - 2.0) < 0.1, "normal: %g %g", mean, sd);
  /* fan_in 100, fan_out 50 */
  read_t(s, "XU", v, 5000 * sizeof(float));
  moments(v, 5000, &mean, &sd, &lo, &hi);
  double b = sqrt(6.0 / 150);
  ck_assert(lo >= -b && hi <= b && hi > 0.9 * b && lo < -0.9 * b);
  read_t(s, "KU", v, 5000 * sizeof(float));
  moments(v, 5000, &mean, &sd, &lo, &hi);
  b = sqrt(2.0) * sqrt(3.0 / 100);
  ck_assert(lo >= -b && hi <= b && hi > 0.9 * b && lo < -0.9 * b);
  read_t(s, "KN", v, 5000 * sizeof(float));
  moments(v, 5000, &mean, &sd, &lo, &hi);
  ck_assert_msg(fabs(sd - sqrt(2.0 / 100)) < 0.01 && fabs(mean) < 0.01, "kaiming_normal sd %g", sd);
  /* the same seed, the same values; another seed, others */
  nf_session *s2 = open_def(m, "m", &o);
  read_t(s2, "KN", w, 5000 * sizeof(float));
  ck_assert(memcmp(v, w, 5000 * sizeof(float)) == 0);
  nf_session_free(s2);
  o.seed = 4;
  s2 = open_def(m, "m", &o);
  read_t(s2, "KN", w, 5000 * sizeof(float));
  ck_assert(memcmp(v, w, 5000 * sizeof(float)) != 0);
  nf_session_free(s2);
  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* A def's outputs after the loss are computed by each step and readable,
 * and they take no part in the gradient. */
static const char outs_model[] =
    "def m(X: f32[4, 3], y: f32[4]) -> (L: f32[], P: f32[4]) {\n"
    "  param W: f32[3] = constant(0.5)\n"
    "  P(i) +=! X(i, j) * W(j)\n"
    "  D(i) = P(i) - y(i)\n"
    "  S() +=! D(i) * D(i)\n"
    "  L() = S() / 4.0\n"
    "}\n";

START_TEST(session_def_outputs) {
  nf_model *m = load_text("outs.nf", outs_model);
  nf_session_opts o = {.daemon = "none", .quiet = 1, .optim = {.kind = NF_OPTIM_SGD, .lr = 0.1}};
  nf_session *s = open_def(m, "m", &o);
  float X[12], y[4] = {1, -1, 2, 0}, P[4], g[3];
  for (int i = 0; i < 12; i++) X[i] = (float)(i % 5) - 1.5f;
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);
  double l = step(s);
  read_t(s, "P", P, sizeof P);
  read_t(s, "grad_W", g, sizeof g);
  double L = 0, G[3] = {0, 0, 0};
  for (int i = 0; i < 4; i++) {
    double p = 0.5 * (X[3 * i] + X[3 * i + 1] + X[3 * i + 2]);
    ck_assert_msg(fabs(P[i] - p) < 1e-6, "P[%d] %g, expected %g", i, P[i], p);
    L += (p - y[i]) * (p - y[i]) / 4;
    for (int j = 0; j < 3; j++) G[j] += 2 * (p - y[i]) * X[3 * i + j] / 4;
  }
  ck_assert(fabs(l - L) < 1e-5 * fabs(L) + 1e-7);
  for (int j = 0; j < 3; j++) ck_assert_msg(fabs(g[j] - G[j]) < 1e-5, "grad_W[%d] %g vs %g", j, g[j], G[j]);
  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* ---- 10. on a GPU: the CUDA driver emulated on the CPU ---- */

/* A GPU session (tests/cuda_emu_driver.cc as the driver): the daemon
 * compiles every entry for the device with NVRTC, the session loads the
 * bundles (from their source, on the emulated driver), runs each one's
 * canary against tier 0 on the host, and trains with the same losses,
 * gradients and parameters as a CPU session; then a sticky launch error
 * ends its steps with a clear error, never a crash.  Skipped (a message)
 * where the build has no NVRTC or no emulated driver. */
/* The driver and cuBLAS a GPU session test uses: the emulations
 * (NF_TEST_CUDA_DRIVER, NF_TEST_CUBLAS), or with NF_TEST_GPU_REAL=1
 * (deploy/gpu-check.sh) the machine's own (*real = 1).  0 (and a
 * message) when the test must be skipped: no driver, or no NVRTC in this
 * build. */
static int gpu_test_env(const char *test, int *real) {
  *real = getenv("NF_TEST_GPU_REAL") && !strcmp(getenv("NF_TEST_GPU_REAL"), "1");
  const char *drv = *real ? "libcuda.so.1" : getenv("NF_TEST_CUDA_DRIVER");
  nf_buf why = NF_BUF_INIT;
  if (!drv || !*drv || (!*real && !getenv("NF_TEST_CUDA_EMU")) || !nf_cuda_available(&why)) {
    fprintf(stderr, "%s: skipped: %s\n", test,
            why.len ? nf_buf_str(&why) : "NF_TEST_CUDA_DRIVER or NF_TEST_CUDA_EMU not set");
    nf_buf_free(&why);
    return 0;
  }
  setenv("NEOFLOW_LIBCUDA", drv, 1);
  const char *blas = getenv("NF_TEST_CUBLAS");
  if (!*real && blas && *blas) setenv("NEOFLOW_LIBCUBLAS", blas, 1);
  return 1;
}

START_TEST(session_gpu_emulated) {
  /* (on a real GPU: without the fault injection) */
  int real = 0;
  if (!gpu_test_env("session_gpu_emulated", &real)) return;
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  nf_model *m = load_example("mlp.nf");
  mlp_data *data = mlp_data_new(21);
  nf_session_opts o = mlp_opts();
  o.optim = (nf_optimizer){.kind = NF_OPTIM_SGD, .lr = 0.01, .momentum = 0.5};
  nf_session *a = open_def(m, "mlp", &o);
  o.daemon = d.sock;
  o.no_spawn = 1;
  o.compile_only = 1;
  o.device = "cuda";
  nf_session *b = open_def(m, "mlp", &o);
  ck_assert_ptr_nonnull(b->gpu);
  int n_k = b->kt.n_kents;
  /* the same on the GPU without a daemon: tier 0 throughout, plain
   * products on cuBLAS (the emulated one here), the rest on the host */
  nf_session_opts oc = o;
  oc.daemon = "none";
  nf_session *c0 = open_def(m, "mlp", &oc);
  ck_assert_ptr_nonnull(c0->gpu);
  if (!real && getenv("NEOFLOW_LIBCUBLAS")) ck_assert_int_gt(nf__gpu_blas_entries(c0), 0);
  ck_assert_int_eq(nf_session_wait_kernels(b, 120000, 1), NF_OK);
  double la[3], lb[3];
  for (int i = 0; i < 3; i++) {
    mlp_feed(a, data, 0);
    mlp_feed(b, data, 0);
    mlp_feed(c0, data, 0);
    la[i] = step(a);
    lb[i] = step(b);
    double lc = step(c0);
    ck_assert_msg(fabs(la[i] - lc) <= 1e-5 * fabs(la[i]), "step %d: loss %.9g on the CPU, %.9g "
                  "at tier 0 on the GPU", i + 1, la[i], lc);
    if (i == 0) {
      nf_session_stats st = stats(b);
      ck_assert_msg(st.swaps == n_k && st.rejected == 0 && st.tier1 == n_k,
                    "swaps %lld of %d, rejected %lld, tier1 %d (see %s): %s",
                    (long long)st.swaps, n_k, (long long)st.rejected, st.tier1, d.log,
                    session_log(b));
      for (int k = 0; k < n_k; k++) ck_assert_ptr_nonnull(b->kt.kents[k].cur);
      /* step 1's results came from the reference */
      ck_assert_msg(la[0] == lb[0], "step 1: loss %.9g on the CPU, %.9g on the GPU", la[0],
                    lb[0]);
    }
    ck_assert_msg(fabs(la[i] - lb[i]) <= 1e-5 * fabs(la[i]), "step %d: loss %.9g vs %.9g", i + 1,
                  la[i], lb[i]);
  }
  ck_assert_msg(la[2] < la[0], "loss did not fall: %g -> %g", la[0], la[2]);
  params_agree(a, b, 1e-5);
  float ga[10], gb[10];
  read_t(a, "grad_b3", ga, sizeof ga);
  read_t(b, "grad_b3", gb, sizeof gb);
  ck_assert_msg(rel_diff(gb, ga, 10) < 1e-4, "grad_b3 differs by %g", rel_diff(gb, ga, 10));
  /* a launch fails as an illegal address would: the step fails, says
   * why, and so does the next (the context is gone) */
  if (real) goto done;
  setenv("NF_EMU_FAIL_LAUNCH", "1", 1);
  double loss = 0;
  ck_assert_int_eq(nf_session_step(b, &loss), NF_EIO);
  ck_assert_msg(strstr(nf_session_error(b), "CUDA_ERROR_ILLEGAL_ADDRESS"), "%s",
                nf_session_error(b));
  ck_assert_int_eq(nf_session_step(b, &loss), NF_EIO);
  ck_assert_msg(strstr(nf_session_error(b), "broke earlier"), "%s", nf_session_error(b));
  unsetenv("NF_EMU_FAIL_LAUNCH");
done:
  nf_session_free(a);
  nf_session_free(b);
  nf_session_free(c0);
  unsetenv("NEOFLOW_LIBCUBLAS");
  nf_model_free(m);
  free(data);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* The convolutions of the CNN example on cuDNN (tests/cudnn_emu.cc on
 * the emulated driver) at tier 0: its forward convolutions (their bias
 * and ReLU are entries of their own), the filter gradients and the
 * second convolution's data gradient; its products on the emulated
 * cuBLAS; the losses and parameters after
 * three SGD steps those of the CPU.  Without cuDNN (a library that does
 * not load) the same session runs those entries on the host and says
 * why at the start. */
START_TEST(session_gpu_cudnn) {
  /* NF_TEST_GPU_REAL=1 (deploy/gpu-check.sh): the machine's driver and
   * cuDNN, without the count of the emulation's calls */
  int real = getenv("NF_TEST_GPU_REAL") && !strcmp(getenv("NF_TEST_GPU_REAL"), "1");
  const char *drv = real ? "libcuda.so.1" : getenv("NF_TEST_CUDA_DRIVER");
  const char *lib = real ? "libcudnn.so.9" : getenv("NF_TEST_CUDNN");
  if (!drv || !*drv || !lib || !*lib) {
    fprintf(stderr, "session_gpu_cudnn: skipped: NF_TEST_CUDA_DRIVER or NF_TEST_CUDNN not set\n");
    return;
  }
  setenv("NEOFLOW_LIBCUDA", drv, 1);
  setenv("NEOFLOW_LIBCUDNN", lib, 1);
  const char *blas = getenv("NF_TEST_CUBLAS");
  if (!real && blas && *blas) setenv("NEOFLOW_LIBCUBLAS", blas, 1);
  enum { B = 4, PIX = 28 * 28 };
  nf_model *m = load_example("cnn.nf");
  static float X[B * PIX];
  int64_t labels[B];
  rng_seed(29);
  fill_gauss(X, B * PIX);
  for (int i = 0; i < B; i++) labels[i] = i % 10;
  const char *inames[] = {"batch"};
  const int64_t ivalues[] = {B};
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_SGD, .lr = 0.01}, .seed = 3, .daemon = "none",
                       .n_iparams = 1, .inames = inames, .ivalues = ivalues};
  nf_session *a = open_def(m, "cnn", &o);
  o.device = "cuda";
  nf_session *c = open_def(m, "cnn", &o);
  ck_assert_ptr_nonnull(c->gpu);
  int n_dnn = nf__gpu_dnn_entries(c);
  if (real && n_dnn == 0) { /* the first line said why */
    fprintf(stderr, "session_gpu_cudnn: skipped: no cuDNN on this machine\n");
    nf_session_free(c);
    nf_session_free(a);
    nf_model_free(m);
    return;
  }
  ck_assert_msg(n_dnn >= 5, "%d entries on cuDNN", n_dnn);
  void *h = real ? NULL : dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  long (*calls)(void) = NULL;
  if (!real) {
    ck_assert_ptr_nonnull(h);
    *(void **)&calls = dlsym(h, "cudnn_emu_calls");
    ck_assert_ptr_nonnull(calls);
  }
  long before = calls ? calls() : 0;
  double l_first = 0;
  for (int i = 0; i < 3; i++) {
    feed(a, "X", X, sizeof X);
    feed(a, "labels", labels, sizeof labels);
    feed(c, "X", X, sizeof X);
    feed(c, "labels", labels, sizeof labels);
    double la = step(a), lc = step(c);
    if (i == 0) l_first = la;
    ck_assert_msg(fabs(la - lc) <= 1e-5 * fabs(la), "step %d: loss %.9g on the CPU, %.9g with "
                  "cuDNN", i + 1, la, lc);
  }
  if (calls) ck_assert_int_eq(calls() - before, 3 * n_dnn);
  if (h) dlclose(h);
  params_agree(a, c, 1e-4);
  nf_session_free(c);
  /* cuDNN refuses every shape: each entry says so once and goes to the
   * host; the step's loss is the CPU's first */
  if (!real) {
    setenv("NF_EMU_CUDNN_REFUSE", "1", 1);
    nf_session *b = open_def(m, "cnn", &o);
    ck_assert_int_eq(nf__gpu_dnn_entries(b), n_dnn);
    feed(b, "X", X, sizeof X);
    feed(b, "labels", labels, sizeof labels);
    double lb = step(b);
    ck_assert_int_eq(nf__gpu_dnn_entries(b), 0);
    ck_assert_msg(fabs(lb - l_first) <= 1e-5 * fabs(l_first), "loss %.9g, the CPU's %.9g", lb,
                  l_first);
    nf_session_free(b);
    unsetenv("NF_EMU_CUDNN_REFUSE");
  }
  /* no cuDNN: the host */
  setenv("NEOFLOW_LIBCUDNN", "/nonexistent/libcudnn.so", 1);
  c = open_def(m, "cnn", &o);
  ck_assert_ptr_nonnull(c->gpu);
  ck_assert_int_eq(nf__gpu_dnn_entries(c), 0);
  feed(c, "X", X, sizeof X);
  feed(c, "labels", labels, sizeof labels);
  double l0 = step(c);
  ck_assert(isfinite(l0) && l0 > 0);
  nf_session_free(c);
  nf_session_free(a);
  nf_model_free(m);
  unsetenv("NEOFLOW_LIBCUDNN");
  unsetenv("NEOFLOW_LIBCUBLAS");
  unsetenv("NEOFLOW_LIBCUDA");
}
END_TEST

/* The first entry of GPU session g running a kernel it generated itself. */
static int generated_entry(const nf_session *g) {
  int k = 0;
  while (k < g->kt.n_kents && !(g->kt.kents[k].cur && g->kt.kents[k].cur_tier == 0)) k++;
  ck_assert_int_lt(k, g->kt.n_kents);
  return k;
}

/* Graph gr's kernel as the daemon's tier 1 would build it (the default GPU
 * schedule, compiled for g's device) into *bun, with its digest. */
static void gpu_bundle_of(const nf_session *g, const nf_graph *gr, nf_buf *bun, uint8_t sha[32]) {
  nf_schedule *sch = NULL;
  ck_assert_int_eq(nf_schedule_default_gpu(gr, NF_GPU_DEFAULT_THREADS, &sch), NF_OK);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_lower(gr, sch, ctx, &p, &err), NF_OK);
  ck_assert_msg(nf_cuda_compile_bundle(p, g->kt.dev->target(&g->kt, NULL), bun, NULL, &err) == NF_OK, "%s",
                nf_buf_str(&err));
  crypto_hash_sha256(sha, (const uint8_t *)bun->data, bun->len);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_schedule_free(sch);
}

/* Entry k's kernel as the daemon's tier 1 would build it. */
static void default_gpu_bundle(const nf_session *g, int k, nf_buf *bun, uint8_t sha[32]) {
  gpu_bundle_of(g, g->kt.kents[k].g, bun, sha);
}

/* CUDA graphs: an MLP trained on the (emulated) GPU without a daemon,
 * with graphs and with $NEOFLOW_GPU_GRAPHS=0, step for step: once the
 * generated kernels are in and two untimed steps ran the same way, the
 * steps (and evaluations) are captured and replayed as one graph each,
 * on several streams; every loss and the parameters are bit-identical
 * to the live runs' (a replay that skipped or reordered work would
 * differ).  A daemon's kernel arriving then is swapped in and the step
 * captured anew; a kernel of the graph that faults fails the step with
 * the driver's error, and the next with the broken context.  A capture
 * that fails (the emulated driver invalidates it on request) is said
 * once and the steps run live, still identical. */
START_TEST(session_gpu_graphs) {
  int real = 0;
  if (!gpu_test_env("session_gpu_graphs", &real)) return;
  unsetenv("NEOFLOW_LIBNVRTC");
  nf_model *m = load_example("mlp.nf");
  mlp_data *data = mlp_data_new(29);
  nf_session_opts o = mlp_opts();
  o.optim = (nf_optimizer){.kind = NF_OPTIM_SGD, .lr = 0.01, .momentum = 0.5};
  o.daemon = "none";
  o.device = "cuda";
  for (int fail = 0; fail < (real ? 1 : 2); fail++) {
    if (fail) setenv("NF_EMU_CAPTURE_FAIL", "1", 1);
    nf_session *g = open_def(m, "mlp", &o);
    setenv("NEOFLOW_GPU_GRAPHS", "0", 1);
    nf_session *l = open_def(m, "mlp", &o);
    unsetenv("NEOFLOW_GPU_GRAPHS");
    ck_assert(g->gpu && l->gpu);
    if (nf__gpu_gen_wait(g->gen, NULL, NULL, NULL, NULL) != NF_OK ||
        nf__gpu_gen_wait(l->gen, NULL, NULL, NULL, NULL) != NF_OK) {
      fprintf(stderr, "session_gpu_graphs: skipped: no NVRTC to load\n");
      nf_session_free(g);
      nf_session_free(l);
      break;
    }
    int used = 0;
    for (int i = 0; i < 12; i++) {
      mlp_feed(g, data, i % MLP_POOL);
      mlp_feed(l, data, i % MLP_POOL);
      double lg = step(g), ll = step(l);
      ck_assert_msg(lg == ll, "step %d: loss %.9g with graphs, %.9g without", i + 1, lg, ll);
      if (stats(g).graph_runs > 0 && nf__gpu_streams_used(g) > used)
        used = nf__gpu_streams_used(g);
      double eg = 0, el = 0;
      ck_assert_int_eq(nf_session_eval(g, &eg), NF_OK);
      ck_assert_int_eq(nf_session_eval(l, &el), NF_OK);
      ck_assert_msg(eg == el, "evaluation %d: %.9g with graphs, %.9g without", i + 1, eg, el);
    }
    params_agree(l, g, 1e-30);
    int captures = 0;
    int64_t runs = nf__gpu_graph_runs(g, &captures);
    ck_assert_int_eq(nf__gpu_graph_runs(l, NULL), 0);
    if (!fail) {
      /* steps 1 and 16 are timed (live), steps run live until the kernels
       * are in and twice more: most of the 12 steps and evaluations */
      ck_assert_msg(runs >= 8 && captures >= 2, "%lld runs as graphs, %d captures: %s",
                    (long long)runs, captures, session_log(g));
      ck_assert_msg(real || used >= 2, "the graphs' modules ran on %d streams", used);
      ck_assert_int_eq(stats(g).graph_runs, runs);
      /* a daemon's kernel for a generated entry (offered to both as the
       * link would): swapped in by its canary on a live step, the graph
       * dropped, then captured anew; still identical */
      int k = generated_entry(g);
      nf_buf bun = NF_BUF_INIT;
      uint8_t sha[32];
      default_gpu_bundle(g, k, &bun, sha);
      ck_assert_int_eq(nf__kt_offer(&g->kt, k, bun.data, bun.len, sha, NULL, 1, 0), NF_OK);
      ck_assert_int_eq(nf__kt_offer(&l->kt, k, bun.data, bun.len, sha, NULL, 1, 0), NF_OK);
      for (int i = 12; i < 18; i++) {
        mlp_feed(g, data, i % MLP_POOL);
        mlp_feed(l, data, i % MLP_POOL);
        double lg = step(g), ll = step(l);
        ck_assert_msg(lg == ll, "step %d: loss %.9g with graphs, %.9g without", i + 1, lg, ll);
      }
      params_agree(l, g, 1e-30);
      int again = 0;
      int64_t runs2 = nf__gpu_graph_runs(g, &again);
      ck_assert_msg(stats(g).tier1 == 1 && runs2 > runs && again > captures,
                    "tier1 %d, %d captures before the swap, %d after: %s", stats(g).tier1,
                    captures, again, session_log(g));
      /* a kernel of the graph faults as an illegal address would: the
       * step fails and says why, and so does the next (the context is
       * gone) */
      if (!real) {
        setenv("NF_EMU_FAIL_LAUNCH", "1", 1);
        mlp_feed(g, data, 0);
        double loss = 0;
        ck_assert_int_eq(nf_session_step(g, &loss), NF_EIO);
        ck_assert_msg(strstr(nf_session_error(g), "CUDA_ERROR_ILLEGAL_ADDRESS") &&
                          nf__gpu_graph_runs(g, NULL) == runs2 + 1,
                      "%s (graph runs %lld, before %lld)", nf_session_error(g),
                      (long long)nf__gpu_graph_runs(g, NULL), (long long)runs2);
        ck_assert_int_eq(nf_session_step(g, &loss), NF_EIO);
        ck_assert_msg(strstr(nf_session_error(g), "broke earlier"), "%s", nf_session_error(g));
        unsetenv("NF_EMU_FAIL_LAUNCH");
      }
      nf_buf_free(&bun);
    } else {
      ck_assert_msg(runs == 0 && strstr(session_log(g), "CUDA graphs off"), "%lld runs: %s",
                    (long long)runs, session_log(g));
      unsetenv("NF_EMU_CAPTURE_FAIL");
    }
    nf_session_free(g);
    nf_session_free(l);
  }
  nf_model_free(m);
  free(data);
  unsetenv("NEOFLOW_LIBCUBLAS");
  unsetenv("NEOFLOW_LIBCUDA");
}
END_TEST

/* Tier 0 for the rest on a GPU, without a daemon: the session generates
 * a kernel for every entry that neither cuBLAS nor cuDNN takes, with the
 * NVRTC it loads at run time (this machine's), each verified by its
 * canary against the host; the losses and parameters are the CPU's.  A
 * daemon's kernel then replaces a generated one, and a generated one
 * arriving after it is dropped.  Without NVRTC the rest runs on the
 * host.  Skipped where the emulated driver or NVRTC is missing. */
START_TEST(session_gpu_generated) {
  int real = 0;
  if (!gpu_test_env("session_gpu_generated", &real)) return;
  unsetenv("NEOFLOW_LIBNVRTC");
  nf_model *m = load_example("mlp.nf");
  mlp_data *data = mlp_data_new(23);
  nf_session_opts o = mlp_opts();
  o.optim = (nf_optimizer){.kind = NF_OPTIM_SGD, .lr = 0.01, .momentum = 0.5};
  o.daemon = "none";
  nf_session *a = open_def(m, "mlp", &o);
  o.device = "cuda";
  nf_session *g = open_def(m, "mlp", &o);
  ck_assert_ptr_nonnull(g->gpu);
  int made = 0, refused = 0, failed = 0;
  double ms = 0;
  if (nf__gpu_gen_wait(g->gen, &made, &refused, &failed, &ms) != NF_OK) {
    fprintf(stderr, "session_gpu_generated: skipped: no NVRTC to load (%s)\n", session_log(g));
    nf_session_free(g);
    nf_session_free(a);
    nf_model_free(m);
    free(data);
    return;
  }
  int n_lib = nf__gpu_blas_entries(g) + nf__gpu_dnn_entries(g);
  ck_assert_msg(failed == 0 && refused == 0 && made == g->kt.n_kents - n_lib,
                "generated %d, refused %d, failed %d of %d entries (%d on libraries): %s", made,
                refused, failed, g->kt.n_kents, n_lib, session_log(g));
  ck_assert_int_gt(made, 0);
  fprintf(stderr, "session_gpu_generated: %d kernels generated in %.0f ms\n", made, ms);
  double la[3];
  for (int i = 0; i < 3; i++) {
    mlp_feed(a, data, 0);
    mlp_feed(g, data, 0);
    la[i] = step(a);
    double lg = step(g);
    if (i == 0) { /* each canary ran the reference for real */
      ck_assert_msg(la[0] == lg, "step 1: loss %.9g on the CPU, %.9g on the GPU", la[0], lg);
      nf_session_stats st = stats(g);
      ck_assert_msg(st.generated == made && st.swaps == made && st.rejected == 0 &&
                        st.tier1 == 0,
                    "generated %d (of %d), swaps %lld, rejected %lld, tier1 %d: %s",
                    st.generated, made, (long long)st.swaps, (long long)st.rejected, st.tier1,
                    session_log(g));
    }
    ck_assert_msg(fabs(la[i] - lg) <= 1e-5 * fabs(la[i]), "step %d: loss %.9g on the CPU, %.9g "
                  "on generated kernels", i + 1, la[i], lg);
  }
  /* the modules ran on several streams, ordered by events (the emulated
   * driver runs unordered work in the wrong order: without the events
   * these losses differ) */
  ck_assert_msg(real || nf__gpu_streams_used(g) >= 2, "modules ran on %d streams",
                nf__gpu_streams_used(g));
  ck_assert_msg(la[2] < la[0], "loss did not fall: %g -> %g", la[0], la[2]);
  params_agree(a, g, 1e-5);
  /* the daemon's kernel for one of them (offered as the link would):
   * it replaces the generated one; a generated one after it is dropped */
  int k = generated_entry(g);
  nf_buf bun = NF_BUF_INIT;
  uint8_t sha[32];
  default_gpu_bundle(g, k, &bun, sha);
  ck_assert_int_eq(nf__kt_offer(&g->kt, k, bun.data, bun.len, sha, NULL, 1, 0), NF_OK);
  mlp_feed(g, data, 0);
  step(g);
  nf_session_stats st = stats(g);
  ck_assert_msg(st.tier1 == 1 && st.generated == made - 1 && g->kt.kents[k].cur_tier == 1,
                "tier1 %d, generated %d: %s", st.tier1, st.generated, session_log(g));
  ck_assert_int_eq(nf__kt_offer(&g->kt, k, bun.data, bun.len, sha, NULL, 0, 0), NF_OK);
  mlp_feed(g, data, 0);
  step(g);
  st = stats(g);
  ck_assert_msg(st.tier1 == 1 && st.generated == made - 1 && g->kt.kents[k].cur_tier == 1,
                "after a late generated kernel: tier1 %d, generated %d", st.tier1, st.generated);
  /* a kernel that loads and runs but computes something else (a wrong
   * twin of the entry's graph): its canary against the verified kernel
   * rejects it, says why, and the step's results are the verified
   * kernel's */
  nf_ir_ctx *wctx = nf_ir_ctx_new();
  nf_graph *w = wrong_twin(wctx, g->kt.kents[k].g);
  nf_buf wbun = NF_BUF_INIT;
  uint8_t wsha[32];
  gpu_bundle_of(g, w, &wbun, wsha);
  ck_assert_int_eq(nf__kt_offer(&g->kt, k, wbun.data, wbun.len, wsha, NULL, 2, 0), NF_OK);
  mlp_feed(g, data, 1);
  double lg = step(g);
  st = stats(g);
  ck_assert_msg(st.rejected == 1 && st.tier1 == 1 && st.tier2 == 0 &&
                    g->kt.kents[k].cur_tier == 1 && !g->kt.kents[k].cand &&
                    strstr(session_log(g), "GPU kernel") &&
                    strstr(session_log(g), "(tier 2) rejected: its results differ"),
                "rejected %lld, tier1 %d, tier2 %d: %s", (long long)st.rejected, st.tier1,
                st.tier2, session_log(g));
  ck_assert(isfinite(lg));
  nf_buf_free(&wbun);
  nf_ir_ctx_free(wctx);
  nf_buf_free(&bun);
  nf_session_free(g);
  /* no NVRTC: the rest on the host, the same loss */
  setenv("NEOFLOW_LIBNVRTC", "/nonexistent/libnvrtc.so", 1);
  g = open_def(m, "mlp", &o);
  ck_assert_ptr_nonnull(g->gpu);
  ck_assert_int_eq(nf__gpu_gen_wait(g->gen, NULL, NULL, NULL, NULL), NF_EUNSUPPORTED);
  mlp_feed(g, data, 0);
  nf_session_free(a);
  nf_session_opts oc = o;
  oc.device = NULL;
  a = open_def(m, "mlp", &oc);
  mlp_feed(a, data, 0);
  double l0 = step(a), l1 = step(g);
  ck_assert_msg(fabs(l0 - l1) <= 1e-5 * fabs(l0), "loss %.9g on the host, %.9g on the CPU", l1,
                l0);
  ck_assert_int_eq(stats(g).generated, 0);
  nf_session_free(g);
  /* a device that fails the health probe (its first launch breaks the
   * context): the session says so and trains on the CPU */
  if (!real) {
    setenv("NF_EMU_FAIL_LAUNCH", "1", 1);
    g = open_def(m, "mlp", &o);
    ck_assert_ptr_null(g->gpu);
    ck_assert_msg(strstr(session_log(g), "health probe"), "%s", session_log(g));
    mlp_feed(g, data, 0);
    double l2 = step(g);
    ck_assert_msg(fabs(l0 - l2) <= 1e-6 * fabs(l0), "loss %.9g on the fallback CPU, %.9g", l2, l0);
    nf_session_free(g);
    unsetenv("NF_EMU_FAIL_LAUNCH");
  }
  nf_session_free(a);
  unsetenv("NEOFLOW_LIBNVRTC");
  unsetenv("NEOFLOW_LIBCUBLAS");
  unsetenv("NEOFLOW_LIBCUDA");
  nf_model_free(m);
  free(data);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("session");
  TCase *tc = tcase_create("session");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, session_mlp_trains);
  tcase_add_test(tc, session_cnn_trains);
  tcase_add_test(tc, session_optimizers);
  tcase_add_test(tc, session_initializers);
  tcase_add_test(tc, session_def_outputs);
  tcase_add_test(tc, session_gradients_match_finite_differences);
  tcase_add_test(tc, session_tiers_agree);
  tcase_add_test(tc, session_slow_kernel_keeps_tier0);
  tcase_add_test(tc, session_fast_kernel_verdict);
  tcase_add_test(tc, session_corrupted_kernel_rejected);
  tcase_add_test(tc, session_save_load);
  tcase_add_test(tc, session_report);
  tcase_add_test(tc, session_bad_input);
  if (getenv("NF_NEOFLOWD")) {
    tcase_add_test(tc, session_daemon_killed_and_back);
    tcase_add_test(tc, session_two_clients_one_daemon);
  }
  suite_add_tcase(s, tc);
  if (getenv("NF_NEOFLOWD")) {
    TCase *gpu = tcase_create("gpu"); /* CK_RUN_CASE=gpu runs it alone */
    tcase_set_timeout(gpu, 900);
    tcase_add_test(gpu, session_gpu_emulated);
    suite_add_tcase(s, gpu);
  }
  TCase *dnn = tcase_create("cudnn"); /* CK_RUN_CASE=cudnn */
  tcase_set_timeout(dnn, 300);
  tcase_add_test(dnn, session_gpu_cudnn);
  suite_add_tcase(s, dnn);
  TCase *gen = tcase_create("generated"); /* CK_RUN_CASE=generated */
  tcase_set_timeout(gen, 300);
  tcase_add_test(gen, session_gpu_generated);
  suite_add_tcase(s, gen);
  TCase *gr = tcase_create("graphs"); /* CK_RUN_CASE=graphs */
  tcase_set_timeout(gr, 300);
  tcase_add_test(gr, session_gpu_graphs);
  suite_add_tcase(s, gr);
  return s;
}

int main(void) {
  /* every kernel's first use runs its canary: no record of kernels
   * verified by earlier runs (client/verify.c) */
  setenv("NEOFLOW_VERIFIED", "none", 1);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
