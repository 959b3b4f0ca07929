/* test_partition.c - partitioning graphs into subgraphs (client/nf_partition.h).
 *
 *  - for the example models and their gradient graphs: every statement is
 *    in exactly one subgraph, no subgraph holds two reductions, and running
 *    the subgraphs one after the other (the interpreter, f64) gives exactly
 *    the whole graph's outputs;
 *  - a matmul with a bias and a ReLU is one subgraph (anchor + epilogue);
 *    a light producer read only by the matmul is inlined into it;
 *  - two equal independent blocks become two subgraphs with one key;
 *  - `neoflow partition --dot` writes a Graphviz file. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nf_autodiff.h"
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_partition.h"

static nf_graph *instantiate(const char *rel, const char *def, nf_ir_ctx *ctx) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(lib);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", lib, rel);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_file(m, path, d) == NF_OK, "%s", nf_diag_text(d));
  nf_graph *g = NULL;
  nf_inst_opts o = {0};
  ck_assert_msg(nf_module_instantiate(m, def, &o, ctx, &g, d) == NF_OK, "%s", nf_diag_text(d));
  nf_diag_free(d);
  nf_module_free(m);
  return g;
}

/* The structural rules and the equivalence by evaluation. */
static void check_partition(const nf_graph *g) {
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_partition_graph(g, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
  int *count = calloc(g->n_stmts ? g->n_stmts : 1, sizeof *count);
  for (uint32_t i = 0; i < p->n; i++) {
    int reductions = 0;
    for (uint32_t k = 0; k < p->sub[i].n_stmts; k++) {
      uint32_t s = p->sub[i].stmts[k];
      count[s]++;
      ck_assert_uint_eq(p->group_of[s], i);
      reductions += g->stmts[s].red != NF_RED_NONE;
    }
    ck_assert_int_le(reductions, 1);
    ck_assert_int_eq(nf_graph_validate(p->sub[i].g, &err), NF_OK);
  }
  for (uint32_t s = 0; s < g->n_stmts; s++) ck_assert_int_eq(count[s], 1);
  free(count);

  /* evaluate: whole graph, and subgraph by subgraph */
  nf_array *val = calloc(g->n_tensors, sizeof *val);
  uint8_t *have = calloc(g->n_tensors, 1);
  nf_array *in = calloc(g->n_inputs ? g->n_inputs : 1, sizeof *in);
  srand(3);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    nf_dtype dt = nf_dtype_is_float((nf_dtype)t->dtype) ? NF_F64 : (nf_dtype)t->dtype;
    ck_assert_int_eq(nf_array_alloc(&in[k], dt, t->rank, t->shape), NF_OK);
    for (int64_t i = 0; i < in[k].numel; i++) {
      if (dt == NF_F64) ((double *)in[k].data)[i] = (rand() % 2001 - 1000) / 1000.0;
      else if (dt == NF_I64) ((int64_t *)in[k].data)[i] = 0;
      else if (dt == NF_I32) ((int32_t *)in[k].data)[i] = 0;
    }
    val[g->inputs[k]] = in[k];
    have[g->inputs[k]] = 1;
  }
  nf_array *whole = calloc(g->n_outputs ? g->n_outputs : 1, sizeof *whole);
  ck_assert_msg(nf_interp_run(g, in, NF_INTERP_F64, whole, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_array *owned = calloc(g->n_tensors, sizeof *owned);
  for (uint32_t i = 0; i < p->n; i++) {
    const nf_subgraph *sg = &p->sub[i];
    nf_array *sin = calloc(sg->n_in ? sg->n_in : 1, sizeof *sin);
    for (uint32_t k = 0; k < sg->n_in; k++) {
      ck_assert_msg(have[sg->in[k]], "subgraph %u runs before its input %s exists", i,
                    g->tensors[sg->in[k]].name);
      sin[k] = val[sg->in[k]];
    }
    nf_array *sout = calloc(sg->n_out ? sg->n_out : 1, sizeof *sout);
    ck_assert_msg(nf_interp_run(sg->g, sin, NF_INTERP_F64, sout, &err) == NF_OK, "%s",
                  nf_buf_str(&err));
    for (uint32_t k = 0; k < sg->n_out; k++) {
      val[sg->out[k]] = owned[sg->out[k]] = sout[k];
      have[sg->out[k]] = 1;
    }
    free(sin);
    free(sout);
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    uint32_t t = g->outputs[k];
    ck_assert_msg(have[t], "output %s never produced", g->tensors[t].name);
    ck_assert_int_eq(val[t].numel, whole[k].numel);
    ck_assert(memcmp(val[t].data, whole[k].data, (size_t)whole[k].numel * nf_dtype_size(whole[k].dtype)) == 0);
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) nf_array_free(&whole[k]);
  for (uint32_t t = 0; t < g->n_tensors; t++) nf_array_free(&owned[t]);
  for (uint32_t k = 0; k < g->n_inputs; k++) nf_array_free(&in[k]);
  free(whole);
  free(owned);
  free(in);
  free(val);
  free(have);
  nf_partition_free(p);
  nf_buf_free(&err);
}

START_TEST(partition_models_evaluate_the_same) {
  static const char *defs[] = {"lltm_8", "capsule_routing", "mobilenet_block"};
  for (size_t i = 0; i < sizeof defs / sizeof *defs; i++) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g = instantiate("../examples/models.nf", defs[i], ctx);
    check_partition(g);
    /* and the gradient graph with respect to every input */
    const char *wrt[8];
    int n = 0;
    for (uint32_t k = 0; k < g->n_inputs && n < 8; k++) wrt[n++] = g->tensors[g->inputs[k]].name;
    nf_grad_opts go = {.n_wrt = n, .wrt = wrt};
    nf_grad_report rep;
    nf_graph *gg = NULL;
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(nf_grad_graph(g, &go, ctx, &gg, &rep, &err) == NF_OK, "%s: %s", defs[i], nf_buf_str(&err));
    check_partition(gg);
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
  }
}
END_TEST

/* T = A + 1 (light, read only by the matmul); P = T @ B; Y = relu(P + b) */
static nf_graph *mm_block(nf_ir_ctx *ctx, nf_graph *g, int a, int b, int bias, int64_t n,
                          const char *sfx) {
  int64_t sh[2] = {n, n}, sb[1] = {n};
  (void)sb;
  char name[32];
  snprintf(name, sizeof name, "T%s", sfx);
  int t = nf_graph_add_tensor(g, name, NF_F32, NF_T_LOCAL, 2, sh);
  snprintf(name, sizeof name, "P%s", sfx);
  int pp = nf_graph_add_tensor(g, name, NF_F32, NF_T_LOCAL, 2, sh);
  snprintf(name, sizeof name, "Y%s", sfx);
  int y = nf_graph_add_tensor(g, name, NF_F32, NF_T_OUTPUT, 2, sh);
  const nf_expr *i = nf_e_var(ctx, 0), *j = nf_e_var(ctx, 1), *k = nf_e_var(ctx, 2);
  const nf_expr *ij[2] = {i, j}, *ik[2] = {i, k}, *kj[2] = {k, j}, *jj[1] = {j};
  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)t;
  s.rhs = nf_e_binary(ctx, NF_OP_ADD, nf_e_access(ctx, (uint32_t)a, NF_F32, 2, ij),
                      nf_e_const_f(ctx, NF_F32, 1.0));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)pp;
  s.red = NF_RED_SUM;
  s.n_red = 1;
  s.red_ext[0] = n;
  s.rhs = nf_e_binary(ctx, NF_OP_MUL, nf_e_access(ctx, (uint32_t)t, NF_F32, 2, ik),
                      nf_e_access(ctx, (uint32_t)b, NF_F32, 2, kj));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)y;
  s.rhs = nf_e_binary(ctx, NF_OP_MAX,
                      nf_e_binary(ctx, NF_OP_ADD, nf_e_access(ctx, (uint32_t)pp, NF_F32, 2, ij),
                                  nf_e_access(ctx, (uint32_t)bias, NF_F32, 1, jj)),
                      nf_e_const_f(ctx, NF_F32, 0.0));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  return g;
}

START_TEST(partition_anchor_epilogue_inline) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(ctx, "block");
  int64_t sh[2] = {8, 8}, sb[1] = {8};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sh);
  int bias = nf_graph_add_tensor(g, "bias", NF_F32, NF_T_INPUT, 1, sb);
  mm_block(ctx, g, a, b, bias, 8, "");
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_partition_graph(g, &p, &err), NF_OK);
  ck_assert_uint_eq(p->n, 1);
  ck_assert_uint_eq(p->sub[0].n_stmts, 3);
  ck_assert_int_eq(p->sub[0].anchor, 1);
  ck_assert_uint_eq(p->sub[0].n_in, 3);
  ck_assert_uint_eq(p->sub[0].n_out, 1);
  nf_partition_free(p);
  check_partition(g);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(partition_equal_blocks_share_a_key) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(ctx, "two");
  int64_t sh[2] = {8, 8}, sb[1] = {8};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sh);
  int c = nf_graph_add_tensor(g, "C", NF_F32, NF_T_INPUT, 2, sh);
  int bias = nf_graph_add_tensor(g, "bias", NF_F32, NF_T_INPUT, 1, sb);
  mm_block(ctx, g, a, b, bias, 8, "1");
  mm_block(ctx, g, c, b, bias, 8, "2");
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_partition_graph(g, &p, &err), NF_OK);
  ck_assert_uint_eq(p->n, 2);
  ck_assert(memcmp(p->sub[0].key, p->sub[1].key, 32) == 0);
  nf_partition_free(p);
  check_partition(g);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(partition_tool_dot) {
  const char *nf = getenv("NF_NEOFLOW"), *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(nf);
  char dot[] = "/tmp/nf_part_XXXXXX";
  int fd = mkstemp(dot);
  ck_assert_int_ge(fd, 0);
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "'%s' partition '%s/../examples/models.nf' capsule_routing --wrt W --dot '%s' "
           "| grep -q 'subgraphs'",
           nf, lib, dot);
  ck_assert_int_eq(system(cmd), 0);
  FILE *f = fdopen(fd, "r");
  char buf[64] = {0};
  ck_assert_ptr_nonnull(fgets(buf, sizeof buf, f));
  ck_assert_ptr_nonnull(strstr(buf, "digraph"));
  fclose(f);
  unlink(dot);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("partition");
  TCase *tc = tcase_create("partition");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, partition_models_evaluate_the_same);
  tcase_add_test(tc, partition_anchor_epilogue_inline);
  tcase_add_test(tc, partition_equal_blocks_share_a_key);
  tcase_add_test(tc, partition_tool_dot);
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
