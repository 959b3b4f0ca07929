/* test_adfuzz.c - robustness of automatic differentiation: mutated
 * programs that instantiate go through nf_grad (every float input) and,
 * when small, the gradient graph through the interpreter.  Every outcome
 * must be a status with a message, never a crash, an assertion or a leak;
 * a gradient graph that is built must validate and print. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_interp.h"
#include "nf_lang.h"

static uint64_t st = 777;
static uint64_t next(void) {
  uint64_t z = (st += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static const char *const defs[][3] = {
    {"conv2d", "I=1,4,7,7;W=4,2,3,3", "stride=2;pad=1;dilation=1;groups=2"},
    {"max_pool2d", "X=1,2,7,7", "kernel=3;stride=2;pad=1"},
    {"softmax", "X=3,5", NULL},
    {"cross_entropy", "logits=3,5;labels=3", NULL},
    {"layer_norm", "X=3,5;gamma=5;beta=5", NULL},
    {"embedding", "table=6,3;idx=4", NULL},
    {"channel_shuffle", "X=2,6,2,3", "groups=3"},
    {"squash", "S=3,4", NULL},
    {"gelu", "X=6", NULL},
    {"batch_norm", "X=2,3,2,2;gamma=3;beta=3", NULL},
    {"split", "X=4,6", "at=2"},
};
enum { N_DEFS = sizeof defs / sizeof defs[0] };

static nf_graph *inst(nf_module *m, nf_ir_ctx *ctx, const char *def, const char *shapes,
                      const char *params) {
  char buf[256];
  nf_arg_shape sh[8];
  const char *pn[8];
  int64_t pv[8];
  int ns = 0, np = 0;
  snprintf(buf, sizeof buf, "%s", shapes);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(tok, '=');
    *eq = 0;
    memset(&sh[ns], 0, sizeof sh[ns]);
    sh[ns].name = tok;
    for (char *p = eq + 1; *p;) {
      sh[ns].dims[sh[ns].rank++] = strtoll(p, &p, 10);
      if (*p == ',') p++;
    }
    ns++;
  }
  char pbuf[256];
  snprintf(pbuf, sizeof pbuf, "%s", params ? params : "");
  for (char *tok = strtok_r(pbuf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(tok, '=');
    *eq = 0;
    pn[np] = tok;
    pv[np++] = strtoll(eq + 1, NULL, 10);
  }
  nf_inst_opts o = {ns, sh, np, pn, pv, 0};
  nf_diag *d = nf_diag_new();
  nf_graph *g = NULL;
  int rc = nf_module_instantiate(m, def, &o, ctx, &g, d);
  if (rc) ck_abort_msg("%s: %s", def, nf_diag_text(d));
  nf_diag_free(d);
  return g;
}

static void try_grad(const nf_graph *g, int *n_ok, int *n_err) {
  const char *wrt[32];
  int n = 0;
  for (uint32_t k = 0; k < g->n_inputs && n < 32; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    if (nf_dtype_is_float((nf_dtype)t->dtype) && t->name) wrt[n++] = t->name;
  }
  if (n == 0) return;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *gg = NULL;
  nf_grad_opts o = {.n_wrt = n, .wrt = wrt, .keep_outputs = (int)(next() & 1)};
  nf_grad_report rep;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_grad_graph(g, &o, ctx, &gg, &rep, &err);
  ck_assert_int_le(rc, 0);
  if (rc) {
    ck_assert_msg(err.len > 0, "nf_grad failed without a message");
    (*n_err)++;
  } else {
    (*n_ok)++;
    nf_buf verr = NF_BUF_INIT;
    ck_assert_msg(nf_graph_validate(gg, &verr) == NF_OK, "%s", nf_buf_str(&verr));
    nf_buf_free(&verr);
    nf_buf text = NF_BUF_INIT;
    ck_assert_int_eq(nf_graph_print(gg, &text), NF_OK);
    nf_buf_free(&text);
    int64_t total = 0;
    for (uint32_t t = 0; t < gg->n_tensors; t++) {
      int64_t e = nf_tensor_numel(&gg->tensors[t]);
      total = e < 0 || total > (1 << 18) ? (1 << 19) : total + e;
    }
    for (uint32_t s = 0; s < gg->n_stmts && total < (1 << 18); s++)
      if (nf_stmt_flops(gg, s) > (1 << 22)) total = 1 << 19;
    if (total < (1 << 18)) {
      nf_array *in = calloc(gg->n_inputs + 1, sizeof(nf_array));
      nf_array *out = calloc(gg->n_outputs + 1, sizeof(nf_array));
      int ok = 1;
      for (uint32_t k = 0; k < gg->n_inputs; k++) {
        const nf_tensor *t = &gg->tensors[gg->inputs[k]];
        nf_dtype at = nf_dtype_is_float((nf_dtype)t->dtype) ? NF_F64
                      : t->dtype == NF_BOOL                  ? NF_BOOL
                                                             : NF_I64;
        if (nf_array_alloc(&in[k], at, t->rank, t->shape)) ok = 0;
        for (int64_t e = 0; ok && e < in[k].numel; e++) {
          if (at == NF_F64) ((double *)in[k].data)[e] = (double)(next() % 200) / 100 - 1;
          if (at == NF_I64) ((int64_t *)in[k].data)[e] = (int64_t)(next() % 3);
        }
      }
      if (ok) {
        nf_buf e2 = NF_BUF_INIT;
        int erc = nf_interp_run(gg, in, NF_INTERP_F64, out, &e2);
        ck_assert_int_le(erc, 0);
        if (!erc)
          for (uint32_t k = 0; k < gg->n_outputs; k++) nf_array_free(&out[k]);
        nf_buf_free(&e2);
      }
      for (uint32_t k = 0; k < gg->n_inputs; k++) nf_array_free(&in[k]);
      free(in);
      free(out);
    }
  }
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}

START_TEST(adfuzz_mutated_programs) {
  const char *lib = getenv("NEOFLOW_LIB");
  char path[1024];
  snprintf(path, sizeof path, "%s/nn.nf", lib ? lib : "lib");
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  if (nf_module_load_file(m, path, d)) ck_abort_msg("%s", nf_diag_text(d));
  char *corpus[N_DEFS];
  for (int k = 0; k < N_DEFS; k++) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g = inst(m, ctx, defs[k][0], defs[k][1], defs[k][2]);
    nf_buf b = NF_BUF_INIT;
    ck_assert_int_eq(nf_graph_print(g, &b), NF_OK);
    corpus[k] = strdup(nf_buf_str(&b));
    nf_buf_free(&b);
    nf_ir_ctx_free(ctx);
  }
  static const char *const pieces[] = {
      "(", ")", ",", "+", "-", "*", "/", "//", "%", "?", ":", "<", ">=", "==", "&&", "!",
      "0", "1", "2", "-1", "0.5", "exp(", "log(", "sqrt(", "tanh(", "sigmoid(", "erf(",
      "abs(", "floor(", "pow(", "min(", "max(", "i32(", "f64(", "stop_gradient(",
      "+=!", "max=!", "min=!", "*=!", "="};
  int iters = 20000;
  const char *env = getenv("NF_FUZZ_ITERS");
  if (env) iters = atoi(env);
  int n_ok = 0, n_err = 0, n_inst = 0;
  for (int it = 0; it < iters; it++) {
    nf_buf b = NF_BUF_INIT;
    nf_buf_puts(&b, corpus[next() % N_DEFS]);
    int n_mut = 1 + (int)(next() % 2);
    for (int mu = 0; mu < n_mut && b.len > 0; mu++) {
      size_t pos = next() % b.len, len = 1 + next() % 4;
      if (pos + len > b.len) len = b.len - pos;
      nf_buf t = NF_BUF_INIT;
      nf_buf_add(&t, b.data, pos);
      const char *piece = pieces[next() % (sizeof pieces / sizeof pieces[0])];
      if (next() & 1) {
        nf_buf_puts(&t, piece);
        nf_buf_puts(&t, b.data + pos + len);
      } else {
        nf_buf_puts(&t, piece);
        nf_buf_puts(&t, b.data + pos);
      }
      nf_buf_free(&b);
      b = t;
    }
    nf_module *mm = nf_module_new();
    nf_diag *dd = nf_diag_new();
    if (nf_module_load_source(mm, "mut.nf", nf_buf_str(&b), dd) == NF_OK) {
      for (int k = 0; k < nf_module_n_defs(mm); k++) {
        nf_ir_ctx *ctx = nf_ir_ctx_new();
        nf_graph *g = NULL;
        if (nf_module_instantiate(mm, nf_module_def_name(mm, k), NULL, ctx, &g, dd) == NF_OK) {
          n_inst++;
          try_grad(g, &n_ok, &n_err);
        }
        nf_ir_ctx_free(ctx);
      }
    }
    nf_diag_free(dd);
    nf_module_free(mm);
    nf_buf_free(&b);
  }
  fprintf(stderr, "adfuzz: %d graphs instantiated, %d differentiated, %d refused with a message\n",
          n_inst, n_ok, n_err);
  ck_assert_int_gt(n_ok, 0);
  for (int k = 0; k < N_DEFS; k++) free(corpus[k]);
  nf_diag_free(d);
  nf_module_free(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("adfuzz");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, adfuzz_mutated_programs);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
