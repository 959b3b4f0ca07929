/* test_plan.c - the static memory planner (client/executor/nf_plan.h).
 *
 *  - random buffer sets: offsets aligned; two buffers alive at the same
 *    step never share a byte; the arena is at least the largest live set
 *    and at most the sum of all sizes;
 *  - a chain of equal buffers each alive for two steps needs two slots;
 *  - invalid sizes, lifetimes and alignments are refused;
 *  - the intermediates of a partitioned model (lltm_8's gradient graph)
 *    fit in an arena well below the sum of their sizes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_autodiff.h"
#include "nf_diag.h"
#include "nf_lang.h"
#include "nf_partition.h"
#include "nf_plan.h"

static void check_plan(const nf_plan_buf *b, size_t n, int64_t align, int64_t total) {
  int64_t sum = 0, lo_bound = 0;
  int tmax = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t sz = (b[i].bytes + align - 1) & ~(align - 1);
    ck_assert_int_eq(b[i].offset % align, 0);
    ck_assert_int_ge(b[i].offset, 0);
    ck_assert_int_le(b[i].offset + b[i].bytes, total);
    sum += sz;
    if (b[i].last > tmax) tmax = b[i].last;
    for (size_t j = i + 1; j < n; j++) {
      if (b[i].last < b[j].first || b[j].last < b[i].first) continue;
      if (!b[i].bytes || !b[j].bytes) continue;
      int disjoint = b[i].offset + b[i].bytes <= b[j].offset || b[j].offset + b[j].bytes <= b[i].offset;
      ck_assert_msg(disjoint, "buffers %zu and %zu are alive together and overlap", i, j);
    }
  }
  for (int t = 0; t <= tmax; t++) {
    int64_t live = 0;
    for (size_t i = 0; i < n; i++)
      if (b[i].first <= t && t <= b[i].last) live += b[i].bytes;
    if (live > lo_bound) lo_bound = live;
  }
  ck_assert_int_ge(total, lo_bound);
  ck_assert_int_le(total, sum);
}

START_TEST(plan_random) {
  srand(9);
  for (int trial = 0; trial < 300; trial++) {
    size_t n = (size_t)(rand() % 60);
    nf_plan_buf b[60];
    for (size_t i = 0; i < n; i++) {
      b[i].bytes = rand() % 10 == 0 ? 0 : rand() % 10000;
      b[i].first = rand() % 20;
      b[i].last = b[i].first + rand() % 6;
    }
    int64_t total = -1;
    ck_assert_int_eq(nf_plan_offsets(b, n, 64, &total), NF_OK);
    check_plan(b, n, 64, total);
  }
}
END_TEST

START_TEST(plan_chain_reuses) {
  nf_plan_buf b[10];
  for (int i = 0; i < 10; i++) b[i] = (nf_plan_buf){.bytes = 4096, .first = i, .last = i + 1};
  int64_t total;
  ck_assert_int_eq(nf_plan_offsets(b, 10, 64, &total), NF_OK);
  ck_assert_int_eq(total, 2 * 4096);
  check_plan(b, 10, 64, total);
}
END_TEST

START_TEST(plan_invalid) {
  nf_plan_buf b = {.bytes = 10, .first = 0, .last = 0};
  int64_t total;
  ck_assert_int_eq(nf_plan_offsets(&b, 1, 3, &total), NF_EINVAL);
  ck_assert_int_eq(nf_plan_offsets(&b, 1, 0, &total), NF_EINVAL);
  b.bytes = -1;
  ck_assert_int_eq(nf_plan_offsets(&b, 1, 64, &total), NF_EINVAL);
  b = (nf_plan_buf){.bytes = 10, .first = 3, .last = 2};
  ck_assert_int_eq(nf_plan_offsets(&b, 1, 64, &total), NF_EINVAL);
  b = (nf_plan_buf){.bytes = INT64_MAX - 10, .first = 0, .last = 0};
  ck_assert_int_eq(nf_plan_offsets(&b, 1, 64, &total), NF_EOVERFLOW);
  ck_assert_int_eq(nf_plan_offsets(NULL, 0, 64, &total), NF_OK);
  ck_assert_int_eq(total, 0);
}
END_TEST

START_TEST(plan_partitioned_model) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_ptr_nonnull(lib);
  char path[4096];
  snprintf(path, sizeof path, "%s/../examples/models.nf", lib);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_file(m, path, d) == NF_OK, "%s", nf_diag_text(d));
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  nf_inst_opts io = {0};
  ck_assert_int_eq(nf_module_instantiate(m, "lltm_8", &io, ctx, &g, d), NF_OK);
  const char *wrt[] = {"W", "b"};
  nf_grad_opts go = {.n_wrt = 2, .wrt = wrt};
  nf_grad_report rep;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_grad_graph(g, &go, ctx, &gg, &rep, &err), NF_OK);
  nf_partition *p = NULL;
  ck_assert_int_eq(nf_partition_graph(gg, &p, &err), NF_OK);
  /* intermediates: produced by one subgraph, read by later ones */
  nf_plan_buf *b = calloc(gg->n_tensors, sizeof *b);
  size_t n = 0;
  for (uint32_t i = 0; i < p->n; i++)
    for (uint32_t k = 0; k < p->sub[i].n_out; k++) {
      uint32_t t = p->sub[i].out[k];
      if (gg->tensors[t].kind == NF_T_OUTPUT) continue;
      int last = (int)i;
      for (uint32_t j = i + 1; j < p->n; j++)
        for (uint32_t q = 0; q < p->sub[j].n_in; q++)
          if (p->sub[j].in[q] == t) last = (int)j;
      b[n++] = (nf_plan_buf){.bytes = nf_tensor_numel(&gg->tensors[t]) * 4, .first = (int)i, .last = last};
    }
  ck_assert_uint_gt(n, 10);
  int64_t total, sum = 0;
  ck_assert_int_eq(nf_plan_offsets(b, n, 64, &total), NF_OK);
  check_plan(b, n, 64, total);
  for (size_t i = 0; i < n; i++) sum += (b[i].bytes + 63) & ~63;
  ck_assert_msg(total < sum, "no reuse: %lld of %lld bytes", (long long)total, (long long)sum);
  free(b);
  nf_partition_free(p);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, plan_random);
  tcase_add_test(tc, plan_chain_reuses);
  tcase_add_test(tc, plan_invalid);
  tcase_add_test(tc, plan_partitioned_model);
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
