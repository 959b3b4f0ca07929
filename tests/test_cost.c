/* test_cost.c - the search's features (nf_features.h) and learned cost
 * model (nf_cost_model.h).
 *
 * Features: every def of lib/nn.nf, the larger tiling cases and the
 * workloads are lowered with the default schedule, 20 seeded random
 * schedules and the GPU default; every vector must be finite, the same when extracted twice
 * and when the same schedule is lowered again into another context (so
 * nothing depends on pointers).  Hand-computed values on matmul check the
 * iteration counts, flops, stride kinds and per-level footprints; the
 * default schedule must show its vectorization and parallelism, and a
 * tiled schedule a smaller footprint inside the tile than outside.  The
 * GPU features are zero for a CPU program and checked by hand on matmul's
 * GPU default (shared-memory tiles) and on two bindings of one thread per
 * output that differ only in which neighbouring threads read.
 *
 * Cost model: a hidden cost function of the loop structure (written here,
 * independent of the features: loop overhead, parallel speedup, vector
 * speedup, penalties for accesses strided along the innermost loop) times
 * seeded noise gives "times" of 400 random schedules of matmul and
 * conv2d; trained on 300, the model must rank the 100 held-out ones with a
 * Spearman correlation above 0.7, and two models with the same seed and
 * records must predict identically.  Also: the untrained model predicts
 * zeros, too few or only failed records are NF_EINVAL.  The speed of
 * nf_features and of training on 1000 records is printed to stderr. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_cost_model.h"
#include "nf_cuda.h"
#include "nf_features.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_loop.h"
#include "nf_lower.h"
#include "nf_test_inst.h"

#define N_RANDOM 20

static nf_module *g_nn, *g_wl;

static int fidx(const char *name) {
  for (int i = 0; i < NF_FEAT_N; i++)
    if (strcmp(nf_feature_name(i), name) == 0) return i;
  ck_abort_msg("no feature named '%s'", name);
  return -1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Lowers g with s (NULL: default) into a fresh context and extracts the
 * features into f (nf_features_gpu where gpu); returns the lowering
 * status (features must succeed). */
static int lower_feat_on(const nf_graph *g, const nf_schedule *s, int gpu, float *f) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  int rc = nf_lower(g, s, ctx, &p, &err);
  if (rc == NF_OK) {
    int frc = gpu ? nf_features_gpu(p, f) : nf_features(p, f);
    ck_assert_msg(frc == NF_OK, "nf_features: %s", nf_status_name(frc));
  }
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  return rc;
}

static int lower_feat(const nf_graph *g, const nf_schedule *s, float *f) {
  return lower_feat_on(g, s, 0, f);
}

static void dump(const float *f) {
  for (int i = 0; i < NF_FEAT_N; i++)
    if (f[i] != 0) fprintf(stderr, "  %s = %g\n", nf_feature_name(i), f[i]);
}

/* ---- features on every case ---- */

static void check_case(nf_module *m, const tcase *c) {
  inst I;
  inst_make(&I, m, c, 0x77 + (uint64_t)strlen(c->label));
  for (int k = -1; k < N_RANDOM; k++) {
    nf_schedule *s = NULL;
    if (k >= 0) ck_assert_int_eq(nf_schedule_random(I.g, 500 + (uint64_t)k, &s), NF_OK);
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_buf err = NF_BUF_INIT;
    nf_lprog *p = NULL;
    int rc = nf_lower(I.g, s, ctx, &p, &err);
    ck_assert_msg(rc == NF_OK, "%s schedule %d: %s", c->label, k, nf_buf_str(&err));
    float f1[NF_FEAT_N], f2[NF_FEAT_N], f3[NF_FEAT_N];
    ck_assert_int_eq(nf_features(p, f1), NF_OK);
    ck_assert_int_eq(nf_features(p, f2), NF_OK);
    ck_assert_int_eq(lower_feat(I.g, s, f3), NF_OK);
    for (int i = 0; i < NF_FEAT_N; i++) {
      ck_assert_msg(isfinite(f1[i]), "%s schedule %d: %s = %g", c->label, k, nf_feature_name(i),
                    f1[i]);
      ck_assert_msg(f1[i] == f2[i] && f1[i] == f3[i], "%s schedule %d: %s: %g %g %g", c->label,
                    k, nf_feature_name(i), f1[i], f2[i], f3[i]);
    }
    /* every program stores something: the heaviest store is described */
    ck_assert_msg(f1[fidx("n_stores")] > 0 && f1[fidx("s0.n_bufs")] >= 1, "%s", c->label);
    if (getenv("NF_COST_DUMP")) {
      nf_buf lst = NF_BUF_INIT;
      nf__loop_print(p, &lst);
      fprintf(stderr, "%s schedule %d\n%s\n", c->label, k, nf_buf_str(&lst));
      dump(f1);
      nf_buf_free(&lst);
    }
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
    nf_schedule_free(s);
  }
  /* the GPU default: finite, repeatable, marked as a GPU program */
  nf_schedule *s = NULL;
  ck_assert_int_eq(nf_schedule_default_gpu(I.g, NF_GPU_DEFAULT_THREADS, &s), NF_OK);
  float g1[NF_FEAT_N], g2[NF_FEAT_N];
  int rc = lower_feat_on(I.g, s, 1, g1);
  ck_assert_msg(rc == NF_OK, "%s: the GPU default does not lower", c->label);
  ck_assert_int_eq(lower_feat_on(I.g, s, 1, g2), NF_OK);
  nf_schedule_free(s);
  for (int i = 0; i < NF_FEAT_N; i++)
    ck_assert_msg(isfinite(g1[i]) && g1[i] == g2[i], "%s on a GPU: %s: %g %g", c->label,
                  nf_feature_name(i), g1[i], g2[i]);
  ck_assert_msg(g1[fidx("g.gpu")] == 1 && g1[fidx("g.block")] > 0 &&
                    g1[fidx("g.occupancy")] > 0 && g1[fidx("g.occupancy")] <= 1,
                "%s on a GPU: gpu %g, block %g, occupancy %g", c->label, g1[fidx("g.gpu")],
                g1[fidx("g.block")], g1[fidx("g.occupancy")]);
  inst_free(&I);
}

#define N_LIB ((int)(sizeof lib_cases / sizeof lib_cases[0]))
#define N_WL ((int)(sizeof workload_cases / sizeof workload_cases[0]))
#define N_BIG ((int)(sizeof big_cases / sizeof big_cases[0]))

START_TEST(cost_features_library) {
  if (!g_nn) g_nn = load("nn.nf");
  check_case(g_nn, &lib_cases[_i]);
}
END_TEST

START_TEST(cost_features_big) {
  if (!g_nn) g_nn = load("nn.nf");
  check_case(g_nn, &big_cases[_i]);
}
END_TEST

START_TEST(cost_features_workloads) {
  if (!g_wl) g_wl = load("../examples/workloads.nf");
  check_case(g_wl, &workload_cases[_i]);
}
END_TEST

START_TEST(cost_feature_names) {
  for (int i = 0; i < NF_FEAT_N; i++) {
    ck_assert_msg(nf_feature_name(i)[0] != 0, "feature %d has no name", i);
    for (int j = 0; j < i; j++)
      ck_assert_msg(strcmp(nf_feature_name(i), nf_feature_name(j)) != 0, "'%s' twice",
                    nf_feature_name(i));
  }
  ck_assert_str_eq(nf_feature_name(NF_FEAT_N), "");
  ck_assert_str_eq(nf_feature_name(-1), "");
  float f[NF_FEAT_N];
  ck_assert_int_eq(nf_features(NULL, f), NF_EINVAL);
}
END_TEST

/* ---- hand-checked values ---- */

static const tcase mm64 = {"matmul 64", "matmul", P0, 2, {NZ(1, 2, 64, 64), NZ(1, 2, 64, 64)},
                           NULL, 0, 0};

static nf_schedule *parse(const char *text) {
  nf_buf err = NF_BUF_INIT;
  nf_schedule *s = NULL;
  ck_assert_msg(nf_schedule_parse(text, "t", &s, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_buf_free(&err);
  return s;
}

#define FEQ(f, name, want)                                                                 \
  ck_assert_msg(fabs((double)(f)[fidx(name)] - (want)) < 1e-4, "%s = %g, want %g", name,   \
                (double)(f)[fidx(name)], (double)(want))

START_TEST(cost_features_matmul) {
  if (!g_nn) g_nn = load("nn.nf");
  inst I;
  inst_make(&I, g_nn, &mm64, 5);
  float plain[NF_FEAT_N], def[NF_FEAT_N], tiled[NF_FEAT_N];
  /* plain: for i, j { C = 0 }; for i, j, k { C[i][j] += A[i][k] * B[k][j] } */
  nf_schedule *s = nf_schedule_new();
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(lower_feat(I.g, s, plain), NF_OK);
  nf_schedule_free(s);
  FEQ(plain, "s0.iters", log2(1 + 64.0 * 64 * 64));
  FEQ(plain, "s0.flops", 2); /* * and the += combine */
  FEQ(plain, "s0.reduce", 1);
  FEQ(plain, "s0.depth", 3);
  FEQ(plain, "s0.vec", 0);
  FEQ(plain, "s0.par", 0);
  /* along k: A[i][k] contiguous, B[k][j] strided, C[i][j] invariant */
  FEQ(plain, "s0.n_contig", 1);
  FEQ(plain, "s0.n_strided", 1);
  FEQ(plain, "s0.n_bcast", 1);
  FEQ(plain, "s0.store_kind", 0);
  FEQ(plain, "s0.n_bufs", 3);
  /* k loop: a row of A, a column of B, one C; j k: A row, all B, C row */
  FEQ(plain, "s0.bytes_l0", log2(1 + 4.0 * (64 + 64 + 1)));
  FEQ(plain, "s0.bytes_l1", log2(1 + 4.0 * (64 + 64 * 64 + 64)));
  FEQ(plain, "s0.bytes_l2", log2(1 + 4.0 * 3 * 64 * 64));
  FEQ(plain, "s0.bytes_l3", 0);
  FEQ(plain, "s0.ai_l0", log2(1 + 2.0 * 64) - log2(1 + 4.0 * (64 + 64 + 1)));
  /* the second store is C's initialisation */
  FEQ(plain, "s1.iters", log2(1 + 64.0 * 64));
  FEQ(plain, "s1.flops", 0);
  FEQ(plain, "s1.store_kind", 1);
  FEQ(plain, "s2.iters", 0);
  FEQ(plain, "n_stores", log2(3));
  FEQ(plain, "n_loops", log2(6));
  FEQ(plain, "flops", log2(1 + 2.0 * 64 * 64 * 64));
  FEQ(plain, "vec_frac", 0);
  FEQ(plain, "par_frac", 0);

  /* a register tile (the default's plain one; products of other shapes
   * take the product tile): parallel i.o (8), vector j.i (16), C tile */
  s = parse("neoflow-schedule 1\nstmt 0 split i 8\nstmt 0 split j 16\n"
            "stmt 0 reorder i.o j.o k i.i j.i\nstmt 0 parallel i.o\n"
            "stmt 0 vectorize j.i\nstmt 0 cache_write j.o\n");
  ck_assert_int_eq(lower_feat(I.g, s, def), NF_OK);
  nf_schedule_free(s);
  FEQ(def, "s0.vec", 16);
  FEQ(def, "s0.par", log2(1 + 8.0));
  FEQ(def, "s0.par_eff8", 1);
  FEQ(def, "s0.par_eff32", 8.0 / 32);
  FEQ(def, "s0.tile_bytes", log2(1 + 4.0 * 8 * 16));
  FEQ(def, "s0.n_contig", 2); /* along j.i: B and the tile; A invariant */
  FEQ(def, "s0.n_bcast", 1);
  FEQ(def, "s0.store_kind", 1);
  FEQ(def, "s0.iters", plain[fidx("s0.iters")]);
  FEQ(def, "vec_frac", 1);
  FEQ(def, "par_frac", 1);
  ck_assert(def[fidx("temp_bytes")] > 0 && plain[fidx("temp_bytes")] == 0);

  /* a cache-friendly tiling: inside the tile far fewer bytes than outside */
  s = parse("neoflow-schedule 1\nstmt 0 split i 8\nstmt 0 split j 16\nstmt 0 split k 8\n"
            "stmt 0 reorder i.o j.o k.o i.i k.i j.i\n");
  ck_assert_int_eq(lower_feat(I.g, s, tiled), NF_OK);
  nf_schedule_free(s);
  FEQ(tiled, "s0.depth", 6);
  /* j.i: 16 B, 1 A, 16 C; k.i j.i: 8x16 B, 8 A, 16 C; ... */
  FEQ(tiled, "s0.bytes_l0", log2(1 + 4.0 * (16 + 1 + 16)));
  FEQ(tiled, "s0.bytes_l1", log2(1 + 4.0 * (8 * 16 + 8 + 16)));
  FEQ(tiled, "s0.bytes_l5", log2(1 + 4.0 * 3 * 64 * 64));
  for (int l = 0; l < NF_FEAT_LEVELS - 1; l++) {
    char a[32], b[32];
    snprintf(a, sizeof a, "s0.bytes_l%d", l);
    snprintf(b, sizeof b, "s0.bytes_l%d", l + 1);
    ck_assert_msg(tiled[fidx(a)] <= tiled[fidx(b)], "%s > %s", a, b);
  }
  /* the tile's intensity beats the untiled innermost loop's */
  ck_assert(tiled[fidx("s0.ai_l2")] > plain[fidx("s0.ai_l0")]);
  inst_free(&I);
}
END_TEST

/* The GPU features on matmul 64: zero for a CPU program; for the GPU
 * default's shared-memory tiles the launch's shape, memory and occupancy
 * by hand; with no loop bound, one thread; one thread per output bound
 * with j along the threads
 * (neighbouring threads read neighbouring B and C elements) against i
 * along the threads (a stride of 64): only coalescing tells them apart. */
START_TEST(cost_features_gpu) {
  if (!g_nn) g_nn = load("nn.nf");
  inst I;
  inst_make(&I, g_nn, &mm64, 5);
  static const char *const gname[] = {"g.gpu", "g.launches", "g.grid", "g.block",
                                      "g.warp_eff", "g.occupancy", "g.shared", "g.local",
                                      "g.thread_iters", "g.coalesced", "g.bcast", "g.strided",
                                      "g.unbound_frac", "g.syncs"};
  ck_assert_int_eq((int)(sizeof gname / sizeof gname[0]), NF_FEAT_GPU);
  float cpu[NF_FEAT_N], tiles[NF_FEAT_N], rows[NF_FEAT_N], cols[NF_FEAT_N];
  ck_assert_int_eq(lower_feat(I.g, NULL, cpu), NF_OK);
  for (int i = 0; i < NF_FEAT_GPU; i++) FEQ(cpu, gname[i], 0);
  ck_assert_int_eq(fidx(gname[0]), NF_FEAT_N_CPU);

  /* the default: blocks (i.o, j.o) 2 x 2, threads 16 x 16 with 2 x 2
   * outputs each, A and B staged in shared memory per k.o (32 x 16 and
   * 16 x 32 floats), a 2 x 2 accumulator per thread */
  nf_schedule *s = NULL;
  ck_assert_int_eq(nf_schedule_default_gpu(I.g, NF_GPU_DEFAULT_THREADS, &s), NF_OK);
  ck_assert_int_eq(lower_feat(I.g, s, tiles), NF_OK);
  nf_schedule_free(s);
  FEQ(tiles, "g.gpu", 1);
  FEQ(tiles, "g.launches", log2(1 + 2.0)); /* C's zero fill, then the product */
  FEQ(tiles, "g.grid", log2(1 + 4.0));
  FEQ(tiles, "g.block", log2(1 + 256.0));
  FEQ(tiles, "g.warp_eff", 1);
  FEQ(tiles, "g.shared", log2(1 + 4096.0));
  FEQ(tiles, "g.syncs", log2(1 + 2.0));
  FEQ(tiles, "g.local", log2(1 + 16.0));
  FEQ(tiles, "g.thread_iters", log2(1 + 64.0 * 64 * 64 / (4 * 256)));
  /* registers: 32 + 4 a thread -> 7 blocks of 256 threads */
  FEQ(tiles, "g.occupancy", 7 * 256 / 2048.0);
  /* along j.i.o: the tile's store and A_rd invariant, B_rd at stride 2 */
  FEQ(tiles, "g.coalesced", 0);
  FEQ(tiles, "g.bcast", 2 / 3.0);
  FEQ(tiles, "g.strided", 1 / 3.0);
  ck_assert(tiles[fidx("g.unbound_frac")] > 0 && tiles[fidx("g.unbound_frac")] < 0.05);

  /* one thread per output, 64 blocks of 64 threads */
  s = parse("neoflow-schedule 1\nstmt 0 bind_block i\nstmt 0 bind_thread j\n");
  ck_assert_int_eq(lower_feat(I.g, s, rows), NF_OK);
  nf_schedule_free(s);
  s = parse("neoflow-schedule 1\nstmt 0 reorder j i k\nstmt 0 bind_block j\n"
            "stmt 0 bind_thread i\n");
  ck_assert_int_eq(lower_feat(I.g, s, cols), NF_OK);
  nf_schedule_free(s);
  FEQ(rows, "g.grid", log2(1 + 64.0));
  FEQ(rows, "g.block", log2(1 + 64.0));
  FEQ(rows, "g.shared", 0);
  FEQ(rows, "g.local", 0);
  FEQ(rows, "g.syncs", 0);
  FEQ(rows, "g.thread_iters", log2(1 + 64.0));
  FEQ(rows, "g.occupancy", 1); /* 32 blocks of 64 threads */
  FEQ(rows, "g.coalesced", 2 / 3.0); /* C[i][j], B[k][j]; A[i][k] invariant */
  FEQ(rows, "g.bcast", 1 / 3.0);
  FEQ(cols, "g.coalesced", 0);
  FEQ(cols, "g.bcast", 1 / 3.0); /* B[k][j] */
  FEQ(cols, "g.strided", 2 / 3.0);
  /* no loop bound: the product is a launch of one thread (the backend's
   * serial kernel); every iteration outside block and thread loops */
  float serial[NF_FEAT_N];
  s = nf_schedule_new();
  ck_assert_int_eq(lower_feat_on(I.g, s, 1, serial), NF_OK);
  nf_schedule_free(s);
  FEQ(serial, "g.gpu", 1);
  FEQ(serial, "g.grid", 1);
  FEQ(serial, "g.block", 1);
  FEQ(serial, "g.warp_eff", 1 / 32.0);
  FEQ(serial, "g.thread_iters", log2(1 + 64.0 * 64 * 64));
  FEQ(serial, "g.unbound_frac", 1);
  /* the CPU features cannot tell them apart */
  for (int i = 0; i < NF_FEAT_N; i++) {
    const char *n = nf_feature_name(i);
    if (strcmp(n, "g.coalesced") && strcmp(n, "g.strided"))
      ck_assert_msg(rows[i] == cols[i], "%s: %g and %g", n, rows[i], cols[i]);
  }
  inst_free(&I);
}
END_TEST

/* ---- a hidden cost of the loop structure ---- */

static int uses_var(const nf_expr *e, uint32_t v, int depth) {
  if (e->op == NF_OP_VAR) return e->u.var == v;
  if (depth > 64) return 1;
  for (int k = 0; k < e->n_args; k++)
    if (uses_var(e->args[k], v, depth + 1)) return 1;
  return 0;
}

static int n_nodes(const nf_expr *e, int depth) {
  int n = 1;
  if (depth > 64) return n;
  for (int k = 0; k < e->n_args; k++) n += n_nodes(e->args[k], depth + 1);
  return n;
}

/* 1 when v appears in an index other than the last (a strided access). */
static int strided(int n_idx, const nf_expr *const *idx, uint32_t v) {
  for (int d = 0; d + 1 < n_idx; d++)
    if (uses_var(idx[d], v, 0)) return 1;
  return 0;
}

static int count_strided(const nf_expr *e, uint32_t v) {
  int n = 0;
  if (e->op == NF_OP_ACCESS) n += strided(e->n_args, e->args, v);
  for (int k = 0; k < e->n_args; k++) n += count_strided(e->args[k], v);
  return n;
}

/* Simulated time of s executed mult times: loops cost overhead per
 * iteration, a parallel loop divides by min(extent, 8), a vector loop by
 * 0.7 * width (by 2 only when some access is strided), each access that
 * strides along the innermost loop costs 3 more per iteration. */
static double sim(const nf_lstmt *s, double mult, double par, int has_inner, uint32_t inner,
                  int64_t vec) {
  double t = 0;
  switch (s->kind) {
  case NF_LS_LOOP: {
    double p = par;
    if (s->loop_kind == NF_LOOP_PARALLEL) p = (double)(s->extent < 8 ? s->extent : 8);
    if (p < 1) p = 1;
    if (s->loop_kind == NF_LOOP_SERIAL || s->loop_kind == NF_LOOP_PARALLEL)
      t += 0.4 * mult * (double)s->extent / p;
    for (int i = 0; i < s->n_body; i++)
      t += sim(s->body[i], mult * (double)s->extent, p, 1, s->var,
               s->loop_kind == NF_LOOP_VECTOR ? s->extent : vec);
    return t;
  }
  case NF_LS_STORE: {
    double c = 1 + 0.3 * n_nodes(s->value, 0) + (s->op != NF_RED_NONE);
    int ns = has_inner ? count_strided(s->value, inner) + strided(s->n_idx, s->idx, inner) : 0;
    c += 3.0 * ns;
    if (vec > 1) c /= ns ? 2.0 : 0.7 * (double)vec;
    return mult * c / (par > 1 ? par : 1);
  }
  default:
    for (int i = 0; i < s->n_body; i++) t += sim(s->body[i], mult, par, has_inner, inner, vec);
    return t;
  }
}

/* Average ranks (ties share the mean rank). */
static void ranks(const double *x, int n, double *r) {
  for (int i = 0; i < n; i++) {
    int less = 0, eq = 0;
    for (int j = 0; j < n; j++) {
      less += x[j] < x[i];
      eq += x[j] == x[i];
    }
    r[i] = less + (eq - 1) / 2.0;
  }
}

static double spearman(const double *x, const double *y, int n) {
  double *rx = malloc((size_t)n * sizeof *rx), *ry = malloc((size_t)n * sizeof *ry);
  ck_assert(rx && ry);
  ranks(x, n, rx);
  ranks(y, n, ry);
  double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
  for (int i = 0; i < n; i++) {
    mx += rx[i] / n;
    my += ry[i] / n;
  }
  for (int i = 0; i < n; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  free(rx);
  free(ry);
  return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
}

#define N_SCHED 400
#define N_TRAIN 300

/* Features and hidden times of N_SCHED random schedules (default first). */
static void make_records(const nf_graph *g, float *feat, double *time) {
  rng r = {42};
  for (int k = 0; k < N_SCHED; k++) {
    nf_schedule *s = NULL;
    if (k > 0) ck_assert_int_eq(nf_schedule_random(g, 9000 + (uint64_t)k, &s), NF_OK);
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_buf err = NF_BUF_INIT;
    nf_lprog *p = NULL;
    ck_assert_msg(nf_lower(g, s, ctx, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
    ck_assert_int_eq(nf_features(p, feat + (size_t)k * NF_FEAT_N), NF_OK);
    time[k] = sim(p->root, 1, 1, 0, 0, 0) * 1e-6 * (0.95 + 0.1 * rng_unit(&r));
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
    nf_schedule_free(s);
  }
}

/* ---- a hidden GPU cost ---- */

/* The value of index expression e with every loop variable at val[v]
 * (0 for the others); *ok = 0 for an operator this does not evaluate. */
static int64_t ival(const nf_expr *e, const int64_t *val, uint32_t n, int *ok) {
  int64_t a = 0, b = 0;
  if (e->n_args > 0) a = ival(e->args[0], val, n, ok);
  if (e->n_args > 1) b = ival(e->args[1], val, n, ok);
  switch (e->op) {
  case NF_OP_CONST: return e->u.i;
  case NF_OP_VAR: return e->u.var < n ? val[e->u.var] : 0;
  case NF_OP_CAST: return a;
  case NF_OP_NEG: return -a;
  case NF_OP_ADD: return a + b;
  case NF_OP_SUB: return a - b;
  case NF_OP_MUL: return a * b;
  case NF_OP_MIN: return a < b ? a : b;
  case NF_OP_MAX: return a > b ? a : b;
  case NF_OP_FLOORDIV: return b > 0 ? (a - ((a % b) + b) % b) / b : (*ok = 0);
  case NF_OP_MOD: return b > 0 ? ((a % b) + b) % b : (*ok = 0);
  default: *ok = 0; return 0;
  }
}

/* The change of an access's flat element offset when v goes 0 -> 1
 * (every other variable 0); INT64_MAX when unknown. */
static int64_t gstride(const nf_lprog *p, uint32_t b, int n_idx, const nf_expr *const *idx,
                       uint32_t v) {
  int64_t *val = calloc(p->n_vars + 1, sizeof *val), off[2] = {0, 0};
  int ok = val != NULL;
  for (int t = 0; t < 2 && ok; t++) {
    val[v] = t;
    int64_t row = 1;
    for (int d = n_idx - 1; d >= 0; d--) {
      off[t] += ival(idx[d], val, p->n_vars, &ok) * row;
      row *= p->bufs[b].shape[d];
    }
  }
  free(val);
  return ok ? off[1] - off[0] : INT64_MAX;
}

typedef struct gsim_t {
  const nf_lprog *p;
  double instr, sectors; /* thread instructions; 32-byte global sectors */
  double grid, block, local;
} gsim_t;

/* Global-memory sectors one warp moves for an access at this stride
 * between neighbouring threads. */
static double sectors_of(int64_t st) {
  if (st == 0) return 1;
  if (st == 1 || st == -1) return 4;
  return 32;
}

static void gsim_one(gsim_t *G, uint32_t b, int n_idx, const nf_expr *const *idx, double warps,
                     uint32_t fast, int has_fast) {
  if (G->p->bufs[b].kind == NF_BUF_TEMP)
    G->instr += warps * 32 * 0.5; /* shared memory or registers */
  else
    G->sectors += warps * (has_fast ? sectors_of(gstride(G->p, b, n_idx, idx, fast)) : 32);
}

static void gsim_acc(gsim_t *G, const nf_expr *e, double warps, uint32_t fast, int has_fast) {
  if (e->op == NF_OP_ACCESS) gsim_one(G, e->u.tensor, e->n_args, e->args, warps, fast, has_fast);
  for (int k = 0; k < e->n_args; k++) gsim_acc(G, e->args[k], warps, fast, has_fast);
}

/* One launch: iterations multiply, block loops make the grid, thread
 * loops the block.  Neighbouring threads differ in the innermost thread
 * loop's variable (in a nest without thread loops, spread over threads
 * by the backend, in its innermost loop's): fast, once have is set. */
static void gsim(gsim_t *G, const nf_lstmt *s, double mult, double blocks, double threads,
                 int in_thread, uint32_t fast, int have, double local) {
  if (s->kind == NF_LS_LOOP) {
    mult *= (double)s->extent;
    if (s->loop_kind == NF_LOOP_BLOCK) blocks *= (double)s->extent;
    if (s->loop_kind == NF_LOOP_THREAD) {
      threads *= (double)s->extent;
      in_thread = 1;
      fast = s->var;
      have = 1;
    } else if (!in_thread && !(s->loop_kind == NF_LOOP_BLOCK)) {
      fast = s->var;
      have = 1;
    }
  }
  if (s->kind == NF_LS_ALLOC && in_thread) {
    const nf_lbuf *b = &G->p->bufs[s->buf];
    double n = 4;
    for (int d = 0; d < b->rank; d++) n *= (double)b->shape[d];
    local += n;
  }
  if (blocks > G->grid) G->grid = blocks;
  if (threads > G->block) G->block = threads;
  if (local > G->local) G->local = local;
  if (s->kind == NF_LS_STORE) {
    double warps = mult / 32;
    G->instr += mult * (1 + n_nodes(s->value, 0));
    gsim_acc(G, s->value, warps, fast, have);
    gsim_one(G, s->buf, s->n_idx, s->idx, warps * (s->op != NF_RED_NONE ? 2 : 1), fast, have);
  }
  for (int i = 0; i < s->n_body; i++)
    gsim(G, s->body[i], mult, blocks, threads, in_thread, fast, have, local);
}

/* Simulated microseconds of a GPU program: per launch 3 us, plus its
 * instructions and sectors at a throughput scaled by how much of a
 * 132-multiprocessor device its threads fill (blocks of a multiple of 32
 * threads fill it best; a thread's own arrays beyond 64 bytes spill). */
static double gpu_sim(const nf_lprog *p, const nf_lstmt *s) {
  if (s->kind == NF_LS_SEQ || s->kind == NF_LS_ALLOC) {
    double t = 0;
    for (int i = 0; i < s->n_body; i++) t += gpu_sim(p, s->body[i]);
    return t;
  }
  gsim_t G = {.p = p, .grid = 1, .block = 1};
  gsim(&G, s, 1, 1, 1, 0, 0, 0, 0);
  if (G.block <= 1 && G.grid <= 1) { /* spread over blocks of 256 */
    G.block = 256;
    G.grid = 64;
  }
  double weff = G.block / (ceil(G.block / 32) * 32);
  double fill = G.grid * G.block / (132.0 * 1024);
  if (fill > 1) fill = 1;
  double spill = G.local > 64 ? 1 + (G.local - 64) / 128 : 1;
  return 3 + G.instr * spill / (2e4 * fill * weff) + G.sectors / (2e3 * sqrt(fill));
}

/* Random GPU knobs for statement si of g (the search's ranges). */
static void rand_knobs(const nf_graph *g, uint32_t si, nf_gpu_knobs *k, rng *r) {
  static const int blocks[] = {64, 128, 256, 512, 1024}, tiles[] = {16, 32, 64, 128},
                   thr[] = {1, 2, 4, 8}, kts[] = {4, 8, 16, 32}, vts[] = {1, 2, 4},
                   forms[] = {1, 1, -1, 2};
  memset(k, 0, sizeof *k);
  uint32_t x = (uint32_t)(rng_unit(r) * 1e9);
  k->block = blocks[x % 5];
  if (nf_schedule_gpu_tileable(g, si) != 1) {
    k->tiled = (x >> 3) % 2 ? 2 : 0;
    return;
  }
  k->tiled = forms[(x >> 3) % 4];
  k->tile_i = tiles[(x >> 5) % 4];
  k->tile_j = tiles[(x >> 7) % 4];
  k->thr_i = thr[(x >> 9) % 4];
  k->thr_j = thr[(x >> 11) % 4];
  k->kt = kts[(x >> 13) % 4];
  k->stage = (x >> 15) % 5 == 0 ? -1 : 0;
  k->vthread = vts[(x >> 18) % 3];
  k->vec = (x >> 20) % 3 == 0 ? -1 : 0;
  if (k->thr_i > k->tile_i) k->thr_i = k->tile_i;
  if (k->thr_j > k->tile_j) k->thr_j = k->tile_j;
  while (k->vthread > 1 && (k->thr_i % k->vthread || k->thr_j % k->vthread)) k->vthread /= 2;
}

static const tcase conv_case = {"conv2d 16x16", "conv2d", P1("pad", 1), 2,
                                {NZ(1, 4, 1, 8, 16, 16), NZ(1, 4, 16, 8, 3, 3)}, NULL, 0, 0};

START_TEST(cost_model_learns) {
  if (!g_nn) g_nn = load("nn.nf");
  const tcase *c = _i == 0 ? &mm64 : &conv_case;
  inst I;
  inst_make(&I, g_nn, c, 3);
  float *feat = malloc((size_t)N_SCHED * NF_FEAT_N * sizeof *feat);
  double time[N_SCHED], want[N_SCHED - N_TRAIN], got[N_SCHED - N_TRAIN];
  float score[N_SCHED - N_TRAIN], score2[N_SCHED - N_TRAIN];
  ck_assert_ptr_nonnull(feat);
  make_records(I.g, feat, time);
  nf_cost_model *m = nf_cost_model_new(7, 1), *m2 = nf_cost_model_new(7, 1);
  ck_assert(m && m2);
  for (int k = 0; k < N_TRAIN; k++) {
    /* every 15th record failed */
    double t = k % 15 == 14 ? -1 : time[k];
    ck_assert_int_eq(nf_cost_model_add(m, feat + (size_t)k * NF_FEAT_N, t), NF_OK);
    ck_assert_int_eq(nf_cost_model_add(m2, feat + (size_t)k * NF_FEAT_N, t), NF_OK);
  }
  ck_assert_uint_eq(nf_cost_model_n_records(m), N_TRAIN);
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cost_model_train(m, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_msg(nf_cost_model_train(m2, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert(nf_cost_model_trained(m));
  const float *held = feat + (size_t)N_TRAIN * NF_FEAT_N;
  ck_assert_int_eq(nf_cost_model_predict(m, held, N_SCHED - N_TRAIN, score), NF_OK);
  ck_assert_int_eq(nf_cost_model_predict(m2, held, N_SCHED - N_TRAIN, score2), NF_OK);
  ck_assert_msg(memcmp(score, score2, sizeof score) == 0, "same seed, same records: "
                "different predictions");
  for (int k = 0; k < N_SCHED - N_TRAIN; k++) {
    want[k] = 1 / time[N_TRAIN + k]; /* throughput: higher is faster */
    got[k] = score[k];
  }
  double rho = spearman(want, got, N_SCHED - N_TRAIN);
  fprintf(stderr, "cost model %s: Spearman %.3f on %d held-out schedules\n", c->label, rho,
          N_SCHED - N_TRAIN);
  ck_assert_msg(rho > 0.7, "%s: Spearman %.3f", c->label, rho);
  /* retraining on the same records gives the same model */
  ck_assert_int_eq(nf_cost_model_train(m2, &err), NF_OK);
  ck_assert_int_eq(nf_cost_model_predict(m2, held, N_SCHED - N_TRAIN, score2), NF_OK);
  ck_assert(memcmp(score, score2, sizeof score) == 0);
  nf_buf_free(&err);
  nf_cost_model_free(m);
  nf_cost_model_free(m2);
  free(feat);
  inst_free(&I);
}
END_TEST

START_TEST(cost_model_edges) {
  float f[3 * NF_FEAT_N], score[3] = {5, 5, 5};
  for (int i = 0; i < 3 * NF_FEAT_N; i++) f[i] = (float)((i * 7) % 11);
  nf_cost_model *m = nf_cost_model_new(1, 1);
  ck_assert_ptr_nonnull(m);
  nf_buf err = NF_BUF_INIT;
  /* untrained: zeros */
  ck_assert(!nf_cost_model_trained(m));
  ck_assert_int_eq(nf_cost_model_predict(m, f, 3, score), NF_OK);
  ck_assert(score[0] == 0 && score[1] == 0 && score[2] == 0);
  ck_assert_int_eq(nf_cost_model_predict(m, NULL, 0, NULL), NF_OK);
  /* too few records */
  ck_assert_int_eq(nf_cost_model_train(m, &err), NF_EINVAL);
  ck_assert_int_eq(nf_cost_model_add(m, f, 1.0), NF_OK);
  ck_assert_int_eq(nf_cost_model_train(m, &err), NF_EINVAL);
  ck_assert(!nf_cost_model_trained(m));
  nf_cost_model_free(m);
  /* only failed records (<= 0, NaN, inf) */
  m = nf_cost_model_new(1, 1);
  ck_assert_int_eq(nf_cost_model_add(m, f, 0), NF_OK);
  ck_assert_int_eq(nf_cost_model_add(m, f + NF_FEAT_N, -3), NF_OK);
  ck_assert_int_eq(nf_cost_model_add(m, f + 2 * NF_FEAT_N, NAN), NF_OK);
  ck_assert_int_eq(nf_cost_model_add(m, f, INFINITY), NF_OK);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cost_model_train(m, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "none successful") != NULL, "%s", nf_buf_str(&err));
  /* one success among failures: trains; the success scores highest */
  ck_assert_int_eq(nf_cost_model_add(m, f + NF_FEAT_N, 2.0), NF_OK);
  ck_assert_msg(nf_cost_model_train(m, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert(nf_cost_model_trained(m));
  ck_assert_int_eq(nf_cost_model_predict(m, f, 3, score), NF_OK);
  for (int k = 0; k < 3; k++) ck_assert(isfinite(score[k]));
  ck_assert_msg(score[1] > score[0] && score[1] > score[2], "%g %g %g", score[0], score[1],
                score[2]);
  nf_buf_free(&err);
  nf_cost_model_free(m);
  nf_cost_model_free(NULL);
}
END_TEST

/* Speeds (printed): features of the default matmul 64 program, training
 * on 1000 records. */
START_TEST(cost_speed) {
  if (!g_nn) g_nn = load("nn.nf");
  inst I;
  inst_make(&I, g_nn, &mm64, 5);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  ck_assert_int_eq(nf_lower(I.g, NULL, ctx, &p, &err), NF_OK);
  float f[NF_FEAT_N];
  int n = 2000;
  double t0 = now_s();
  for (int k = 0; k < n; k++) ck_assert_int_eq(nf_features(p, f), NF_OK);
  double per = (now_s() - t0) / n;
  fprintf(stderr, "nf_features(matmul 64 default): %.1f us\n", per * 1e6);
  nf_ir_ctx_free(ctx);
  /* the slowest workload program (default schedule) */
  if (!g_wl) g_wl = load("../examples/workloads.nf");
  double worst = 0;
  const char *worst_label = "";
  for (int w = 0; w < N_WL; w++) {
    inst W;
    inst_make(&W, g_wl, &workload_cases[w], 1);
    ctx = nf_ir_ctx_new();
    ck_assert_int_eq(nf_lower(W.g, NULL, ctx, &p, &err), NF_OK);
    t0 = now_s();
    for (int k = 0; k < 100; k++) ck_assert_int_eq(nf_features(p, f), NF_OK);
    per = (now_s() - t0) / 100;
    if (per > worst) {
      worst = per;
      worst_label = workload_cases[w].label;
    }
    nf_ir_ctx_free(ctx);
    inst_free(&W);
  }
  fprintf(stderr, "nf_features: slowest workload %s %.1f us\n", worst_label, worst * 1e6);
  /* 1000 records: 200 random schedules, five noisy copies each */
  float *feat = malloc((size_t)N_SCHED * NF_FEAT_N * sizeof *feat);
  double time[N_SCHED];
  ck_assert_ptr_nonnull(feat);
  make_records(I.g, feat, time);
  nf_cost_model *m = nf_cost_model_new(3, 1);
  rng r = {9};
  for (int c = 0; c < 5; c++)
    for (int k = 0; k < N_SCHED; k++)
      ck_assert_int_eq(nf_cost_model_add(m, feat + (size_t)k * NF_FEAT_N,
                                         time[k] * (0.9 + 0.2 * rng_unit(&r))),
                       NF_OK);
  t0 = now_s();
  ck_assert_msg(nf_cost_model_train(m, &err) == NF_OK, "%s", nf_buf_str(&err));
  double tt = now_s() - t0;
  float *score = malloc(N_SCHED * sizeof *score);
  ck_assert_ptr_nonnull(score);
  t0 = now_s();
  ck_assert_int_eq(nf_cost_model_predict(m, feat, N_SCHED, score), NF_OK);
  double tp = now_s() - t0;
  fprintf(stderr, "cost model: training on %zu records %.1f ms, predicting %d %.2f ms\n",
          nf_cost_model_n_records(m), tt * 1e3, N_SCHED, tp * 1e3);
  free(score);
  free(feat);
  nf_buf_free(&err);
  nf_cost_model_free(m);
  inst_free(&I);
}
END_TEST

/* On a GPU: 400 random GPU schedules of a matmul (the search's knobs),
 * each timed by the hidden GPU cost above (launches, instructions,
 * global-memory sectors by the stride between neighbouring threads,
 * how much of the device the threads fill) with noise; trained on 300,
 * the model must rank the 100 held out with a Spearman correlation
 * above 0.7.  The same model without the GPU features is printed too:
 * on this space (the search's forms bind threads in one order) the CPU
 * features rank about as well (0.968 both, measured), the differences
 * they miss being those of cost_features_gpu's two bindings. */
START_TEST(cost_model_learns_gpu) {
  if (!g_nn) g_nn = load("nn.nf");
  static const tcase mm = {"matmul 256x192x160", "matmul", P0, 2,
                           {NZ(1, 2, 256, 192), NZ(1, 2, 192, 160)}, NULL, 0, 0};
  inst I;
  inst_make(&I, g_nn, &mm, 3);
  float *feat = malloc((size_t)N_SCHED * NF_FEAT_N * sizeof *feat);
  double *time = malloc(N_SCHED * sizeof *time);
  nf_gpu_knobs *kn = calloc(I.g->n_stmts + 1, sizeof *kn);
  ck_assert(feat && time && kn);
  rng r = {77}, noise = {5};
  int n = 0;
  for (int tries = 0; n < N_SCHED && tries < 20 * N_SCHED; tries++) {
    for (uint32_t si = 0; si < I.g->n_stmts; si++) rand_knobs(I.g, si, &kn[si], &r);
    nf_schedule *s = NULL;
    if (nf_schedule_gpu(I.g, kn, &s) != NF_OK) continue;
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_buf err = NF_BUF_INIT, src = NF_BUF_INIT;
    nf_lprog *p = NULL;
    nf_cuda_plan plan;
    memset(&plan, 0, sizeof plan);
    if (nf_lower(I.g, s, ctx, &p, &err) == NF_OK && nf_cuda_emit(p, &src, &plan, &err) == NF_OK) {
      ck_assert_int_eq(nf_features_gpu(p, feat + (size_t)n * NF_FEAT_N), NF_OK);
      time[n++] = gpu_sim(p, p->root) * 1e-3 * (0.95 + 0.1 * rng_unit(&noise));
    }
    nf_cuda_plan_free(&plan);
    nf_buf_free(&src);
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
    nf_schedule_free(s);
  }
  ck_assert_int_eq(n, N_SCHED);
  double rho[2];
  for (int v = 0; v < 2; v++) { /* v 1: the GPU features zeroed */
    if (v == 1)
      for (int k = 0; k < N_SCHED; k++)
        memset(feat + (size_t)k * NF_FEAT_N + NF_FEAT_N_CPU, 0, NF_FEAT_GPU * sizeof *feat);
    nf_cost_model *m = nf_cost_model_new(7, 1);
    ck_assert_ptr_nonnull(m);
    for (int k = 0; k < N_TRAIN; k++)
      ck_assert_int_eq(nf_cost_model_add(m, feat + (size_t)k * NF_FEAT_N, time[k]), NF_OK);
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(nf_cost_model_train(m, &err) == NF_OK, "%s", nf_buf_str(&err));
    float score[N_SCHED - N_TRAIN];
    double want[N_SCHED - N_TRAIN], got[N_SCHED - N_TRAIN];
    ck_assert_int_eq(nf_cost_model_predict(m, feat + (size_t)N_TRAIN * NF_FEAT_N,
                                           N_SCHED - N_TRAIN, score), NF_OK);
    for (int k = 0; k < N_SCHED - N_TRAIN; k++) {
      want[k] = 1 / time[N_TRAIN + k];
      got[k] = score[k];
    }
    rho[v] = spearman(want, got, N_SCHED - N_TRAIN);
    nf_buf_free(&err);
    nf_cost_model_free(m);
  }
  fprintf(stderr, "cost model %s on a GPU: Spearman %.3f on %d held-out schedules, %.3f "
          "without the GPU features\n", mm.label, rho[0], N_SCHED - N_TRAIN, rho[1]);
  ck_assert_msg(rho[0] > 0.7, "Spearman %.3f", rho[0]);
  free(kn);
  free(time);
  free(feat);
  inst_free(&I);
}
END_TEST

static void free_modules(void) {
  nf_module_free(g_nn);
  nf_module_free(g_wl);
  g_nn = g_wl = NULL;
}

int main(void) {
  Suite *su = suite_create("cost");
  TCase *tc = tcase_create("cost");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, cost_feature_names);
  tcase_add_test(tc, cost_features_matmul);
  tcase_add_test(tc, cost_features_gpu);
  tcase_add_test(tc, cost_model_edges);
  tcase_add_loop_test(tc, cost_model_learns, 0, 2);
  tcase_add_test(tc, cost_model_learns_gpu);
  tcase_add_test(tc, cost_speed);
  tcase_add_loop_test(tc, cost_features_big, 0, N_BIG);
  tcase_add_loop_test(tc, cost_features_library, 0, N_LIB);
  tcase_add_loop_test(tc, cost_features_workloads, 0, N_WL);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  free_modules();
  return nf ? 1 : 0;
}
