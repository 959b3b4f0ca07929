/* test_codegen.c - the LLVM CPU backend end to end: loop programs ->
 * shared object -> loaded -> run, against the reference interpreter.
 *
 * Programs come from a small lowering written here (one loop nest per
 * statement, reduction variables inside the output's loops, the last
 * output dimension split by the vector width with an IF guard for
 * non-dividing sizes, optionally the outermost loop PARALLEL and short
 * reduction loops UNROLLed, LOCAL tensors as ALLOC temporaries), so every
 * statement kind, loop kind and operator of the loop IR is exercised on
 * graphs built here and on the library defs of lib/nn.nf (NEOFLOW_LIB).
 * Inputs are seeded random values of odd sizes, never zero; outputs are
 * poisoned with NaN before each run; f32 results must agree with
 * nf_interp_run (NF_INTERP_F32) to a relative L2 error under 1e-5 and be
 * non-NaN wherever the reference is.  Vector math is checked against
 * libm over dense sweeps (1e6 points per function).  Compile times are
 * printed to stderr (median per kernel). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_codegen.h"
#include "nf_diag.h"
#include "nf_runtime.h"
#include "nf_test_lib.h"
#include "nf_interp.h"
#include "nf_lang.h"

/* ---- random ---- */

static uint64_t rng_state;
static void seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ULL + 1; }
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
static double rnd(void) {
  double m = 0.25 + (double)(rng() >> 11) / 9007199254740992.0;
  return (rng() & 1) ? -m : m;
}

/* ---- a small lowering (see the file comment) ---- */

typedef struct lopts {
  int vec_w;  /* 0/1: no vector loops */
  int par;    /* outermost loop of each nest PARALLEL */
  int unroll; /* reduction loops of extent <= 8 UNROLLed */
} lopts;

typedef struct lower_st {
  nf_ir_ctx *c;
  nf_arena *a;
  nf_lprog *p;
  lopts o;
} lower_st;

static nf_lstmt *mk(lower_st *L, int kind, int cap) {
  nf_lstmt *s = nf_arena_alloc(L->a, sizeof *s);
  ck_assert_ptr_nonnull(s);
  memset(s, 0, sizeof *s);
  s->kind = (uint8_t)kind;
  if (cap) {
    s->body = nf_arena_alloc(L->a, (size_t)cap * sizeof *s->body);
    ck_assert_ptr_nonnull(s->body);
  }
  return s;
}

static void add(nf_lstmt *p, nf_lstmt *c) { p->body[p->n_body++] = c; }

static nf_lstmt *mkloop(lower_st *L, int64_t ext, int kind, uint32_t *var) {
  nf_lstmt *l = mk(L, NF_LS_LOOP, 2);
  l->var = L->p->n_vars++;
  l->extent = ext;
  l->loop_kind = (uint8_t)kind;
  *var = l->var;
  return l;
}

typedef struct smap {
  const nf_expr *from[256], *to[256];
  int n;
  const nf_expr **var; /* statement var -> loop expression */
} smap;

static const nf_expr *subst(lower_st *L, smap *m, const nf_expr *e) {
  if (e->op == NF_OP_VAR) return m->var[e->u.var];
  if (!e->n_args) return e;
  for (int i = 0; i < m->n; i++)
    if (m->from[i] == e) return m->to[i];
  const nf_expr *a[NF_MAX_RANK + 3];
  for (int i = 0; i < e->n_args; i++) a[i] = subst(L, m, e->args[i]);
  const nf_expr *r = nf_e_rebuild(L->c, e, a);
  ck_assert_ptr_nonnull(r);
  if (m->n < 256) {
    m->from[m->n] = e;
    m->to[m->n++] = r;
  }
  return r;
}

/* Loops over statement variables ks[0..n) (outermost first); returns the
 * outermost node (NULL when n == 0), the innermost loop in *leaf and a
 * guard for a non-dividing vector split in *guard. */
static nf_lstmt *nest(lower_st *L, int n, const int *ks, const int64_t *ext,
                      const int64_t *lo, const int *is_red, const nf_expr **vmap,
                      nf_lstmt **leaf, const nf_expr **guard) {
  nf_lstmt *outer = NULL, *cur = NULL;
  nf_ir_ctx *c = L->c;
  *guard = NULL;
  for (int i = 0; i < n; i++) {
    int last = i == n - 1;
    /* only output dimensions may run in parallel (reductions would race) */
    int outer_kind = (i == 0 && L->o.par && !is_red[i]) ? NF_LOOP_PARALLEL : NF_LOOP_SERIAL;
    if (L->o.unroll && is_red[i] && ext[i] <= 8 && !(i == 0 && L->o.par))
      outer_kind = NF_LOOP_UNROLL;
    const nf_expr *ix;
    nf_lstmt *l;
    if (last && L->o.vec_w > 1 && ext[i] > 1) {
      int64_t W = L->o.vec_w, no = (ext[i] + W - 1) / W;
      uint32_t vo, vi;
      l = mkloop(L, no, outer_kind, &vo);
      nf_lstmt *li = mkloop(L, W, NF_LOOP_VECTOR, &vi);
      add(l, li);
      ix = nf_e_binary(c, NF_OP_ADD, nf_e_binary(c, NF_OP_MUL, nf_e_var(c, vo), nf_e_const_i(c, NF_I64, W)),
                       nf_e_var(c, vi));
      if (ext[i] % W)
        *guard = nf_e_binary(c, NF_OP_LT, ix, nf_e_const_i(c, NF_I64, ext[i]));
      if (cur) add(cur, l); else outer = l;
      cur = li;
    } else {
      uint32_t v;
      l = mkloop(L, ext[i], outer_kind, &v);
      ix = nf_e_var(c, v);
      if (cur) add(cur, l); else outer = l;
      cur = l;
    }
    if (lo[i]) ix = nf_e_binary(c, NF_OP_ADD, ix, nf_e_const_i(c, NF_I64, lo[i]));
    vmap[ks[i]] = ix;
  }
  *leaf = cur;
  return outer;
}

static const nf_expr *identity(nf_ir_ctx *c, int red, nf_dtype t) {
  if (nf_dtype_is_float(t)) {
    double v = red == NF_RED_SUM ? 0.0 : red == NF_RED_PROD ? 1.0 : red == NF_RED_MAX ? -INFINITY : INFINITY;
    return nf_e_const_f(c, t, v);
  }
  int64_t mn = t == NF_I32 ? INT32_MIN : INT64_MIN, mx = t == NF_I32 ? INT32_MAX : INT64_MAX;
  if (t == NF_BOOL) mn = 0, mx = 1;
  int64_t v = red == NF_RED_SUM ? 0 : red == NF_RED_PROD ? 1 : red == NF_RED_MAX ? mn : mx;
  return nf_e_const_i(c, t, v);
}

/* Adds the loops of statement s (and its initialisation) to parent. */
static void lower_stmt(lower_st *L, const nf_graph *g, const nf_stmt *s, nf_lstmt *parent) {
  const nf_tensor *t = &g->tensors[s->out];
  int r = t->rank;
  const nf_expr *vmap[NF_MAX_VARS];
  int ks[NF_MAX_VARS] = {0}, isr[NF_MAX_VARS] = {0};
  int64_t ext[NF_MAX_VARS] = {0}, lo[NF_MAX_VARS] = {0};
  nf_lstmt *leaf;
  const nf_expr *guard;
  if (s->red != NF_RED_NONE) {
    for (int d = 0; d < r; d++) {
      ks[d] = d;
      ext[d] = t->shape[d];
      lo[d] = 0;
      isr[d] = 0;
    }
    nf_lstmt *o = nest(L, r, ks, ext, lo, isr, vmap, &leaf, &guard);
    nf_lstmt *st = mk(L, NF_LS_STORE, 0);
    st->buf = s->out;
    st->n_idx = r;
    for (int d = 0; d < r; d++) st->idx[d] = vmap[d];
    st->value = identity(L->c, s->red, (nf_dtype)t->dtype);
    st->op = NF_RED_NONE;
    if (guard) {
      nf_lstmt *iff = mk(L, NF_LS_IF, 1);
      iff->cond = guard;
      add(iff, st);
      st = iff;
    }
    if (o) {
      add(leaf, st);
      add(parent, o);
    } else {
      add(parent, st);
    }
  }
  /* out dims but the last, reduction vars, the last out dim */
  int n = 0;
  for (int d = 0; d < r - 1; d++) {
    ks[n] = d, ext[n] = t->shape[d], lo[n] = 0, isr[n++] = 0;
  }
  for (int k = 0; k < s->n_red; k++) {
    ks[n] = r + k, ext[n] = s->red_ext[k], lo[n] = s->red_lo[k], isr[n++] = 1;
  }
  if (r) {
    ks[n] = r - 1, ext[n] = t->shape[r - 1], lo[n] = 0, isr[n++] = 0;
  }
  nf_lstmt *o = nest(L, n, ks, ext, lo, isr, vmap, &leaf, &guard);
  smap m;
  m.n = 0;
  m.var = vmap;
  nf_lstmt *st = mk(L, NF_LS_STORE, 0);
  st->buf = s->out;
  st->n_idx = r;
  for (int d = 0; d < r; d++) st->idx[d] = vmap[d];
  st->value = subst(L, &m, s->rhs);
  st->op = s->red;
  if (guard) {
    nf_lstmt *iff = mk(L, NF_LS_IF, 1);
    iff->cond = guard;
    add(iff, st);
    st = iff;
  }
  if (o) {
    add(leaf, st);
    add(parent, o);
  } else {
    add(parent, st);
  }
}

static nf_lprog *lower_graph(const nf_graph *g, lopts o) {
  nf_ir_ctx *c = g->ctx;
  lower_st L = {c, nf_ir_ctx_arena(c), NULL, o};
  nf_lprog *p = nf_arena_alloc(L.a, sizeof *p);
  ck_assert_ptr_nonnull(p);
  memset(p, 0, sizeof *p);
  L.p = p;
  p->ctx = c;
  p->name = g->name;
  p->n_bufs = g->n_tensors;
  p->bufs = nf_arena_alloc(L.a, g->n_tensors * sizeof *p->bufs);
  ck_assert_ptr_nonnull(p->bufs);
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    const nf_tensor *t = &g->tensors[i];
    nf_lbuf *b = &p->bufs[i];
    memset(b, 0, sizeof *b);
    b->name = t->name;
    b->dtype = t->dtype;
    b->rank = t->rank;
    memcpy(b->shape, t->shape, sizeof b->shape);
    b->kind = t->kind == NF_T_INPUT ? NF_BUF_INPUT : t->kind == NF_T_OUTPUT ? NF_BUF_OUTPUT : NF_BUF_TEMP;
    b->arg = -1;
  }
  for (uint32_t k = 0; k < g->n_inputs; k++) p->bufs[g->inputs[k]].arg = (int32_t)k;
  for (uint32_t k = 0; k < g->n_outputs; k++) p->bufs[g->outputs[k]].arg = (int32_t)(g->n_inputs + k);
  p->n_args = g->n_inputs + g->n_outputs;
  int cap = 2 * (int)g->n_stmts + 2;
  p->root = mk(&L, NF_LS_SEQ, cap);
  nf_lstmt *cur = p->root;
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    const nf_stmt *s = &g->stmts[i];
    if (g->tensors[s->out].kind == NF_T_LOCAL) {
      nf_lstmt *al = mk(&L, NF_LS_ALLOC, cap);
      al->buf = s->out;
      add(cur, al);
      cur = al;
    }
    lower_stmt(&L, g, s, cur);
  }
  return p;
}

/* ---- compile, load, run, compare ---- */

static double compile_ms[512];
static int n_compile;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static nf_kernel *build(const nf_lprog *p, const char *what) {
  nf_blob so = NF_BLOB_INIT;
  nf_buf err = NF_BUF_INIT;
  nf_cpu_stats st;
  memset(&st, 0, sizeof st);
  int rc = nf_cpu_compile(p, NULL, &so, &st, &err);
  ck_assert_msg(rc == NF_OK, "%s: compile: %s: %s", what, nf_status_name(rc), nf_buf_str(&err));
  if (n_compile < 512) compile_ms[n_compile++] = st.total_ms;
  const char *dump = getenv("NF_TEST_DUMP_SO"); /* debugging aid */
  if (dump) {
    FILE *f = fopen(dump, "wb");
    if (f) {
      fwrite(so.data, 1, so.len, f);
      fclose(f);
    }
  }
  nf_kernel *k = NULL;
  rc = nf_kernel_load(so.data, so.len, &k, &err);
  ck_assert_msg(rc == NF_OK, "%s: load: %s: %s", what, nf_status_name(rc), nf_buf_str(&err));
  nf_blob_free(&so);
  nf_buf_free(&err);
  return k;
}

static void fill_input(nf_array *a, const nf_tensor *t) {
  ck_assert_int_eq(nf_array_alloc(a, (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
  for (int64_t i = 0; i < a->numel; i++) {
    switch (a->dtype) {
    case NF_F32: ((float *)a->data)[i] = (float)rnd(); break;
    case NF_F64: ((double *)a->data)[i] = rnd(); break;
    case NF_I32: ((int32_t *)a->data)[i] = (int32_t)(rng() % 41) - 20; break;
    case NF_I64: ((int64_t *)a->data)[i] = (int64_t)(rng() % 3); break;
    default: ((uint8_t *)a->data)[i] = (uint8_t)(rng() & 1); break;
    }
  }
}

static double getv(const void *d, nf_dtype t, int64_t i) {
  switch (t) {
  case NF_F32: return ((const float *)d)[i];
  case NF_F64: return ((const double *)d)[i];
  case NF_I32: return ((const int32_t *)d)[i];
  case NF_I64: return (double)((const int64_t *)d)[i];
  default: return ((const uint8_t *)d)[i];
  }
}

static void compare_out(const char *what, int k, const nf_array *want, const void *got) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want->numel; i++) {
    double w = getv(want->data, want->dtype, i), g = getv(got, want->dtype, i);
    if (isnan(w)) {
      ck_assert_msg(isnan(g), "%s: output %d element %lld is %g, want NaN", what, k, (long long)i, g);
      continue;
    }
    ck_assert_msg(!isnan(g), "%s: output %d element %lld is NaN (unwritten?), want %.9g", what, k,
                  (long long)i, w);
    if (isinf(w)) {
      ck_assert_msg(g == w, "%s: output %d element %lld is %g, want %g", what, k, (long long)i, g, w);
      continue;
    }
    if (!nf_dtype_is_float(want->dtype))
      ck_assert_msg(g == w, "%s: output %d element %lld is %.17g, want %.17g", what, k, (long long)i, g, w);
    num += (g - w) * (g - w);
    den += w * w;
  }
  ck_assert_msg(sqrt(num) <= 1e-5 * sqrt(den) + 1e-30, "%s: output %d: relative L2 error %.3g", what,
                k, sqrt(num) / sqrt(den));
}

/* Runs g through the lowering with o, with a 2-thread pool and serially,
 * against the interpreter. */
static void check_graph(const nf_graph *g, lopts o, const char *what) {
  nf_lprog *p = lower_graph(g, o);
  if (getenv("NF_TEST_VERBOSE")) fprintf(stderr, "check %s\n", what);
  nf_kernel *k = build(p, what);
  nf_array in[16], want[48];
  void *bufs[64];
  memset(in, 0, sizeof in);
  memset(want, 0, sizeof want);
  ck_assert_int_le((int)g->n_inputs, 16);
  ck_assert_int_le((int)g->n_outputs, 48);
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    fill_input(&in[i], &g->tensors[g->inputs[i]]);
    bufs[i] = in[i].data;
  }
  nf_buf err = NF_BUF_INIT;
  int rc = nf_interp_run(g, in, NF_INTERP_F32, want, &err);
  ck_assert_msg(rc == NF_OK, "%s: interp: %s", what, nf_buf_str(&err));
  nf_pool *pool = nf_pool_new(2);
  ck_assert_ptr_nonnull(pool);
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < g->n_outputs; i++) {
      const nf_array *w = &want[i];
      size_t es = nf_dtype_size(w->dtype);
      void *d = malloc((size_t)(w->numel ? w->numel : 1) * es);
      ck_assert_ptr_nonnull(d);
      for (int64_t j = 0; j < w->numel; j++) {
        if (w->dtype == NF_F32) ((float *)d)[j] = NAN;
        else if (w->dtype == NF_F64) ((double *)d)[j] = NAN;
        else memset((char *)d + j * (int64_t)es, 0x5a, es);
      }
      bufs[g->n_inputs + i] = d;
    }
    rc = nf_kernel_run(k, bufs, g->n_inputs + g->n_outputs, pass ? NULL : pool, &err);
    ck_assert_msg(rc == NF_OK, "%s: run: %s", what, nf_buf_str(&err));
    for (uint32_t i = 0; i < g->n_outputs; i++) {
      char w2[160];
      snprintf(w2, sizeof w2, "%s (%s)", what, pass ? "serial" : "2 threads");
      compare_out(w2, (int)i, &want[i], bufs[g->n_inputs + i]);
      free(bufs[g->n_inputs + i]);
    }
  }
  nf_pool_free(pool);
  for (uint32_t i = 0; i < g->n_inputs; i++) nf_array_free(&in[i]);
  for (uint32_t i = 0; i < g->n_outputs; i++) nf_array_free(&want[i]);
  nf_buf_free(&err);
  nf_kernel_free_unload(k);
}

static const lopts variants[] = {
    {0, 0, 0}, {8, 0, 0}, {16, 1, 1}, {4, 1, 0}, {3, 0, 1},
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

static void check_all_variants(const nf_graph *g, const char *name) {
  for (int v = 0; v < N_VARIANTS; v++) {
    char what[128];
    snprintf(what, sizeof what, "%s [vec %d par %d unroll %d]", name, variants[v].vec_w,
             variants[v].par, variants[v].unroll);
    check_graph(g, variants[v], what);
  }
}

/* ---- graphs built here ---- */

static nf_ir_ctx *cx;
static nf_graph *G;

static void setup(void) {
  cx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(cx);
  G = nf_graph_new(cx, "test");
  ck_assert_ptr_nonnull(G);
}

static void teardown(void) {
  nf_ir_ctx_free(cx);
  cx = NULL;
  G = NULL;
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

static void stmt(int out, nf_redop red, int n_red, const int64_t *lo, const int64_t *ext,
                 const nf_expr *rhs) {
  nf_stmt s;
  memset(&s, 0, sizeof s);
  ck_assert_ptr_nonnull(rhs);
  s.out = (uint32_t)out;
  s.red = (uint8_t)red;
  s.n_red = (uint8_t)n_red;
  for (int k = 0; k < n_red; k++) {
    s.red_lo[k] = lo[k];
    s.red_ext[k] = ext[k];
  }
  s.rhs = rhs;
  ck_assert_int_eq(nf_graph_add_stmt(G, &s), NF_OK);
}

static const nf_expr *V(uint32_t v) { return nf_e_var(cx, v); }
static const nf_expr *A(int t, nf_dtype dt, int n, ...) {
  const nf_expr *ix[NF_MAX_RANK];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) ix[i] = va_arg(ap, const nf_expr *);
  va_end(ap);
  return nf_e_access(cx, (uint32_t)t, dt, n, ix);
}
static const nf_expr *B2(nf_op op, const nf_expr *a, const nf_expr *b) {
  return nf_e_binary(cx, op, a, b);
}
static const nf_expr *CI(int64_t v) { return nf_e_const_i(cx, NF_I64, v); }
static const nf_expr *CF(double v) { return nf_e_const_f(cx, NF_F32, v); }

START_TEST(codegen_matmul) {
  seed(1);
  int a = tensor("A", NF_F32, NF_T_INPUT, 2, (int64_t)13, (int64_t)37);
  int b = tensor("B", NF_F32, NF_T_INPUT, 2, (int64_t)37, (int64_t)29);
  int c = tensor("C", NF_F32, NF_T_OUTPUT, 2, (int64_t)13, (int64_t)29);
  int64_t lo = 0, ext = 37;
  stmt(c, NF_RED_SUM, 1, &lo, &ext,
       B2(NF_OP_MUL, A(a, NF_F32, 2, V(0), V(2)), A(b, NF_F32, 2, V(2), V(1))));
  check_all_variants(G, "matmul");
}
END_TEST

START_TEST(codegen_elementwise_ops) {
  seed(2);
  int x = tensor("X", NF_F32, NF_T_INPUT, 2, (int64_t)5, (int64_t)43);
  int y = tensor("Y", NF_F32, NF_T_INPUT, 2, (int64_t)5, (int64_t)43);
  static const nf_op un[] = {NF_OP_NEG, NF_OP_EXP, NF_OP_LOG, NF_OP_SQRT, NF_OP_RSQRT,
                             NF_OP_TANH, NF_OP_SIGMOID, NF_OP_ERF, NF_OP_ABS, NF_OP_FLOOR,
                             NF_OP_CEIL, NF_OP_STOPGRAD};
  static const nf_op bin[] = {NF_OP_ADD, NF_OP_SUB, NF_OP_MUL, NF_OP_DIV, NF_OP_FLOORDIV,
                              NF_OP_MOD, NF_OP_POW, NF_OP_MIN, NF_OP_MAX};
  const nf_expr *xv = A(x, NF_F32, 2, V(0), V(1)), *yv = A(y, NF_F32, 2, V(0), V(1));
  const nf_expr *ax = nf_e_unary(cx, NF_OP_ABS, xv);
  for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
    const nf_expr *arg = (un[i] == NF_OP_LOG || un[i] == NF_OP_SQRT || un[i] == NF_OP_RSQRT) ? ax
                         : un[i] == NF_OP_FLOOR || un[i] == NF_OP_CEIL ? B2(NF_OP_MUL, xv, CF(3.0))
                                                                        : xv;
    int o = tensor(nf_op_name(un[i]), NF_F32, NF_T_OUTPUT, 2, (int64_t)5, (int64_t)43);
    stmt(o, NF_RED_NONE, 0, NULL, NULL, nf_e_unary(cx, un[i], arg));
  }
  for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) {
    const nf_expr *l = bin[i] == NF_OP_POW ? ax : B2(NF_OP_MUL, xv, CF(4.0));
    int o = tensor(nf_op_name(bin[i]), NF_F32, NF_T_OUTPUT, 2, (int64_t)5, (int64_t)43);
    stmt(o, NF_RED_NONE, 0, NULL, NULL, B2(bin[i], l, yv));
  }
  /* comparisons and logic through a select */
  int o = tensor("cmp", NF_F32, NF_T_OUTPUT, 2, (int64_t)5, (int64_t)43);
  const nf_expr *c1 = B2(NF_OP_AND, B2(NF_OP_LT, xv, yv), B2(NF_OP_NE, xv, CF(0.5)));
  const nf_expr *c2 = B2(NF_OP_OR, B2(NF_OP_GE, xv, CF(0.7)), nf_e_unary(cx, NF_OP_NOT, B2(NF_OP_LE, yv, CF(0.0))));
  stmt(o, NF_RED_NONE, 0, NULL, NULL,
       nf_e_select(cx, c1, xv, nf_e_select(cx, c2, yv, B2(NF_OP_ADD, xv, yv))));
  ck_assert_int_eq(nf_graph_validate(G, NULL), NF_OK);
  check_all_variants(G, "elementwise");
}
END_TEST

START_TEST(codegen_integer_ops) {
  seed(3);
  int x = tensor("X", NF_I32, NF_T_INPUT, 1, (int64_t)61);
  int y = tensor("Y", NF_I64, NF_T_INPUT, 1, (int64_t)61);
  int f = tensor("F", NF_F32, NF_T_INPUT, 1, (int64_t)61);
  const nf_expr *xv = A(x, NF_I32, 1, V(0)), *yv = A(y, NF_I64, 1, V(0)), *fv = A(f, NF_F32, 1, V(0));
  const nf_expr *x64 = nf_e_cast(cx, NF_I64, xv);
  const nf_expr *d = B2(NF_OP_SUB, yv, CI(1)); /* -1, 0, 1: division guarded below */
  const nf_expr *dz = B2(NF_OP_EQ, d, CI(0));
  const nf_expr *safe = nf_e_select(cx, dz, CI(7), d);
  int o1 = tensor("fdiv", NF_I64, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o1, NF_RED_NONE, 0, NULL, NULL, B2(NF_OP_FLOORDIV, x64, B2(NF_OP_MUL, safe, CI(3))));
  int o2 = tensor("mod", NF_I64, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o2, NF_RED_NONE, 0, NULL, NULL, B2(NF_OP_MOD, x64, B2(NF_OP_SUB, CI(-5), safe)));
  int o3 = tensor("i32", NF_I32, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o3, NF_RED_NONE, 0, NULL, NULL,
       B2(NF_OP_ADD, B2(NF_OP_MUL, xv, nf_e_const_i(cx, NF_I32, 1000003)),
          nf_e_unary(cx, NF_OP_ABS, B2(NF_OP_MAX, xv, nf_e_const_i(cx, NF_I32, -3)))));
  int o4 = tensor("cast", NF_I32, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o4, NF_RED_NONE, 0, NULL, NULL, nf_e_cast(cx, NF_I32, B2(NF_OP_MUL, fv, CF(7.5))));
  int o5 = tensor("bool", NF_BOOL, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o5, NF_RED_NONE, 0, NULL, NULL,
       B2(NF_OP_OR, B2(NF_OP_LT, x64, yv), nf_e_cast(cx, NF_BOOL, fv)));
  int o6 = tensor("tofloat", NF_F32, NF_T_OUTPUT, 1, (int64_t)61);
  stmt(o6, NF_RED_NONE, 0, NULL, NULL,
       B2(NF_OP_ADD, nf_e_cast(cx, NF_F32, xv), nf_e_cast(cx, NF_F32, B2(NF_OP_GT, yv, CI(1)))));
  int o7 = tensor("imin", NF_I64, NF_T_OUTPUT, 0);
  int64_t lo = 0, ext = 61;
  stmt(o7, NF_RED_MIN, 1, &lo, &ext, B2(NF_OP_SUB, x64, B2(NF_OP_MUL, yv, CI(5))));
  int o8 = tensor("fmax", NF_F64, NF_T_OUTPUT, 0);
  stmt(o8, NF_RED_MAX, 1, &lo, &ext, nf_e_cast(cx, NF_F64, B2(NF_OP_MUL, fv, fv)));
  ck_assert_int_eq(nf_graph_validate(G, NULL), NF_OK);
  check_all_variants(G, "integer");
}
END_TEST

START_TEST(codegen_reductions_and_select_oob) {
  seed(4);
  int n = 47;
  int x = tensor("X", NF_F32, NF_T_INPUT, 2, (int64_t)9, (int64_t)n);
  int s = tensor("S", NF_F32, NF_T_OUTPUT, 1, (int64_t)9);
  int m = tensor("M", NF_F32, NF_T_OUTPUT, 1, (int64_t)9);
  int p = tensor("P", NF_F32, NF_T_OUTPUT, 1, (int64_t)9);
  int d = tensor("D", NF_F32, NF_T_OUTPUT, 2, (int64_t)9, (int64_t)n);
  int t = tensor("T", NF_F32, NF_T_LOCAL, 2, (int64_t)9, (int64_t)n);
  int e = tensor("E", NF_F32, NF_T_OUTPUT, 0);
  int64_t lo = 0, ext = n, lo3[2] = {0, 0}, ext3[2] = {9, 47};
  const nf_expr *xr = A(x, NF_F32, 2, V(0), V(1));
  stmt(s, NF_RED_SUM, 1, &lo, &ext, xr);
  stmt(m, NF_RED_MAX, 1, &lo, &ext, xr);
  stmt(p, NF_RED_PROD, 1, &lo, &ext, B2(NF_OP_ADD, CF(1.0), B2(NF_OP_MUL, xr, CF(0.01))));
  /* D(i, j) = j + 1 < n ? X(i, j + 1) - X(i, j) : X(i, j): the taken
   * branch alone is in bounds. */
  const nf_expr *j1 = B2(NF_OP_ADD, V(1), CI(1));
  stmt(t, NF_RED_NONE, 0, NULL, NULL,
       nf_e_select(cx, B2(NF_OP_LT, j1, CI(n)),
                   B2(NF_OP_SUB, A(x, NF_F32, 2, V(0), j1), A(x, NF_F32, 2, V(0), V(1))),
                   A(x, NF_F32, 2, V(0), V(1))));
  stmt(d, NF_RED_NONE, 0, NULL, NULL, B2(NF_OP_MUL, A(t, NF_F32, 2, V(0), V(1)), CF(2.0)));
  stmt(e, NF_RED_SUM, 2, lo3, ext3, A(t, NF_F32, 2, V(0), V(1)));
  ck_assert_int_eq(nf_graph_validate(G, NULL), NF_OK);
  check_all_variants(G, "reductions");
}
END_TEST

START_TEST(codegen_big_temp_and_gather) {
  seed(5);
  /* A LOCAL of 300x301 floats (> 64 KiB: heap) and a transposed read
   * (stride != 1 in the vector variable: gathers). */
  int x = tensor("X", NF_F32, NF_T_INPUT, 2, (int64_t)301, (int64_t)300);
  int t = tensor("T", NF_F32, NF_T_LOCAL, 2, (int64_t)300, (int64_t)301);
  int y = tensor("Y", NF_F32, NF_T_OUTPUT, 2, (int64_t)300, (int64_t)301);
  stmt(t, NF_RED_NONE, 0, NULL, NULL, A(x, NF_F32, 2, V(1), V(0)));
  stmt(y, NF_RED_NONE, 0, NULL, NULL, B2(NF_OP_ADD, A(t, NF_F32, 2, V(0), V(1)), CF(1.0)));
  check_all_variants(G, "transpose via heap temp");
}
END_TEST

START_TEST(codegen_abi_mismatch) {
  int x = tensor("X", NF_F32, NF_T_INPUT, 1, (int64_t)7);
  int y = tensor("Y", NF_F32, NF_T_OUTPUT, 1, (int64_t)7);
  stmt(y, NF_RED_NONE, 0, NULL, NULL, A(x, NF_F32, 1, V(0)));
  lopts o = {0, 0, 0};
  nf_kernel *k = build(lower_graph(G, o), "copy");
  nf_kernel_fn fn = nf_kernel_entry(k);
  float in[7] = {1, 2, 3, 4, 5, 6, 7}, out[7];
  void *bufs[2] = {in, out};
  nf_kernel_args a = {NF_KERNEL_ABI_VERSION + 1, 2, bufs, NULL, NULL};
  ck_assert_int_eq(fn(&a), NF_KERNEL_EABI);
  a.abi_version = NF_KERNEL_ABI_VERSION;
  a.n_buffers = 3;
  ck_assert_int_eq(fn(&a), NF_KERNEL_ENBUF);
  a.n_buffers = 2;
  ck_assert_int_eq(fn(&a), 0);
  ck_assert(out[6] == 7.0f);
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_kernel_run(k, bufs, 1, NULL, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "returned 2"));
  nf_buf_free(&err);
  nf_kernel_free_unload(k);
}
END_TEST

START_TEST(codegen_resident_then_reload) {
  /* A kernel kept resident (nf_kernel_free) must not shadow the next one
   * loaded through the same /proc/self/fd/N name. */
  for (int i = 0; i < 3; i++) {
    nf_ir_ctx *c = nf_ir_ctx_new();
    nf_graph *g = nf_graph_new(c, "k");
    int64_t sh = 5;
    int x = nf_graph_add_tensor(g, "X", NF_F32, NF_T_INPUT, 1, &sh);
    int y = nf_graph_add_tensor(g, "Y", NF_F32, NF_T_OUTPUT, 1, &sh);
    const nf_expr *v = nf_e_var(c, 0);
    nf_stmt s;
    memset(&s, 0, sizeof s);
    s.out = (uint32_t)y;
    s.rhs = nf_e_binary(c, NF_OP_ADD, nf_e_access(c, (uint32_t)x, NF_F32, 1, &v),
                        nf_e_const_f(c, NF_F32, (double)(i + 1)));
    ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
    lopts o = {0, 0, 0};
    nf_kernel *k = build(lower_graph(g, o), "add-const");
    float in[5] = {0, 0, 0, 0, 0}, out[5];
    void *bufs[2] = {in, out};
    ck_assert_int_eq(nf_kernel_run(k, bufs, 2, NULL, NULL), NF_OK);
    ck_assert_msg(out[0] == (float)(i + 1), "kernel %d computed %g", i, out[0]);
    nf_kernel_free(k); /* resident */
    nf_ir_ctx_free(c);
  }
}
END_TEST

/* ---- vector math against libm ---- */

typedef double (*ref_fn)(double);
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void sweep(nf_op op, ref_fn ref, int log_scale, double lo, double hi, double tol) {
  const int64_t N = 1000003;
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, nf_op_name(op));
  int64_t sh = N;
  int x = nf_graph_add_tensor(g, "X", NF_F32, NF_T_INPUT, 1, &sh);
  int y = nf_graph_add_tensor(g, "Y", NF_F32, NF_T_OUTPUT, 1, &sh);
  const nf_expr *v = nf_e_var(c, 0);
  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)y;
  s.rhs = nf_e_unary(c, op, nf_e_access(c, (uint32_t)x, NF_F32, 1, &v));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  lopts o = {16, 1, 0};
  nf_kernel *k = build(lower_graph(g, o), nf_op_name(op));
  float *in = malloc((size_t)N * sizeof *in), *out = malloc((size_t)N * sizeof *out);
  ck_assert_ptr_nonnull(in);
  ck_assert_ptr_nonnull(out);
  static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MIN, FLT_MAX,
                                   -FLT_MAX, 1e-45f, -1e-45f, 1.0f, -1.0f};
  int n_sp = (int)(sizeof specials / sizeof specials[0]);
  for (int64_t i = 0; i < N; i++) {
    double t = (double)i / (double)(N - 1 - n_sp);
    if (i >= N - n_sp)
      in[i] = specials[i - (N - n_sp)];
    else if (log_scale)
      in[i] = (float)exp(log(lo) + t * (log(hi) - log(lo)));
    else
      in[i] = (float)(lo + t * (hi - lo));
  }
  void *bufs[2] = {in, out};
  nf_pool *pool = nf_pool_new(2);
  ck_assert_int_eq(nf_kernel_run(k, bufs, 2, pool, NULL), NF_OK);
  double worst = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < N; i++) {
    double r = ref((double)in[i]), got = out[i];
    if (isnan(r)) {
      ck_assert_msg(isnan(got), "%s(%.9g) = %.9g, want NaN", nf_op_name(op), in[i], got);
      continue;
    }
    if (isinf(r) || fabs(r) > FLT_MAX) {
      ck_assert_msg(got == (float)r, "%s(%.9g) = %.9g, want %.9g", nf_op_name(op), in[i], got, r);
      continue;
    }
    double e = fabs(got - r) / fmax(fabs(r), FLT_MIN);
    if (e > worst) worst = e, worst_i = i;
  }
  fprintf(stderr, "vmath %-8s max relative error %.3g at x = %.9g\n", nf_op_name(op), worst,
          in[worst_i]);
  ck_assert_msg(worst <= tol, "%s: max relative error %.3g at x = %.9g (got %.9g, want %.9g)",
                nf_op_name(op), worst, in[worst_i], out[worst_i], ref(in[worst_i]));
  nf_pool_free(pool);
  free(in);
  free(out);
  nf_kernel_free_unload(k);
  nf_ir_ctx_free(c);
}

START_TEST(codegen_vmath_exp) {
  sweep(NF_OP_EXP, exp, 0, -104.0, 89.0, 1e-6);
  sweep(NF_OP_EXP, exp, 0, -2.0, 2.0, 1e-6);
}
END_TEST
START_TEST(codegen_vmath_log) {
  sweep(NF_OP_LOG, log, 1, 1e-45, 3e38, 1e-6);
  sweep(NF_OP_LOG, log, 0, 0.5, 2.0, 1e-6);
}
END_TEST
START_TEST(codegen_vmath_tanh) {
  sweep(NF_OP_TANH, tanh, 0, -12.0, 12.0, 1e-6);
  sweep(NF_OP_TANH, tanh, 1, 1e-30, 2.0, 1e-6);
}
END_TEST
START_TEST(codegen_vmath_sigmoid) {
  sweep(NF_OP_SIGMOID, ref_sigmoid, 0, -110.0, 110.0, 1e-6);
}
END_TEST
START_TEST(codegen_vmath_erf) {
  sweep(NF_OP_ERF, erf, 0, -6.0, 6.0, 1e-6);
  sweep(NF_OP_ERF, erf, 1, 1e-30, 1.5, 1e-6);
}
END_TEST

/* ---- library defs ---- */

typedef struct libcase {
  const char *def;
  int n_in;
  int rank[4];
  int64_t dims[4][4];
  int n_par;
  const char *pn[3];
  int64_t pv[3];
} libcase;

static const libcase cases[] = {
    {"matmul", 2, {2, 2}, {{13, 17}, {17, 19}}, 0, {0}, {0}},
    {"batch_matmul", 2, {3, 3}, {{3, 5, 7}, {3, 7, 9}}, 0, {0}, {0}},
    {"linear", 3, {2, 2, 1}, {{5, 11}, {7, 11}, {7}}, 0, {0}, {0}},
    {"conv2d", 2, {4, 4}, {{2, 3, 9, 11}, {5, 3, 3, 3}}, 2, {"stride", "pad"}, {2, 1}},
    {"conv2d", 2, {4, 4}, {{1, 4, 7, 8}, {4, 2, 3, 2}}, 2, {"groups", "dilation"}, {2, 2}},
    {"max_pool2d", 1, {4}, {{2, 3, 9, 11}}, 2, {"kernel", "pad"}, {3, 1}},
    {"avg_pool2d", 1, {4}, {{2, 3, 9, 11}}, 1, {"kernel"}, {2}},
    {"relu", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"relu6", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"elu", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"gelu", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"sigmoid", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"tanh", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"softplus", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"softmax", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"log_softmax", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"mse", 2, {2, 2}, {{7, 33}, {7, 33}}, 0, {0}, {0}},
    {"layer_norm", 3, {2, 1, 1}, {{7, 33}, {33}, {33}}, 0, {0}, {0}},
    {"batch_norm", 3, {4, 1, 1}, {{3, 5, 7, 9}, {5}, {5}}, 0, {0}, {0}},
    {"concat", 2, {2, 2}, {{5, 7}, {5, 9}}, 0, {0}, {0}},
    {"transpose_last", 1, {3}, {{3, 7, 9}}, 0, {0}, {0}},
    {"bi_cat", 3, {2, 2, 2}, {{5, 3}, {5, 4}, {5, 3}}, 0, {0}, {0}},
    {"bi_reshape", 1, {3}, {{3, 7, 5}}, 0, {0}, {0}},
    {"bi_reduce", 1, {3}, {{3, 7, 5}}, 0, {0}, {0}},
    {"silu", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"expm1", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"log1p", 1, {2}, {{7, 33}}, 0, {0}, {0}},
    {"add", 2, {2, 2}, {{7, 33}, {7, 33}}, 0, {0}, {0}},
    {"div", 2, {2, 2}, {{7, 33}, {7, 33}}, 0, {0}, {0}},
    {"bmul", 2, {3, 1}, {{3, 5, 7}, {7}}, 0, {0}, {0}},
    {"squash", 1, {2}, {{7, 17}}, 0, {0}, {0}},
};

START_TEST(codegen_library_defs) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  char path[4096];
  nf_test_lib_path(path, sizeof path); /* lib/nn.nf and the built-in operators */
  nf_diag *d = nf_diag_new();
  nf_module *m = nf_module_new();
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s", path, nf_diag_text(d));
  const libcase *c = &cases[_i];
  seed(100 + (uint64_t)_i);
  nf_arg_shape shapes[4];
  for (int k = 0; k < c->n_in; k++) {
    memset(&shapes[k], 0, sizeof shapes[k]);
    shapes[k].rank = c->rank[k];
    for (int a = 0; a < c->rank[k]; a++) shapes[k].dims[a] = c->dims[k][a];
  }
  nf_inst_opts o = {.n_shapes = c->n_in, .shapes = shapes, .n_params = c->n_par,
                    .param_names = c->pn, .param_values = c->pv};
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  rc = nf_module_instantiate(m, c->def, &o, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: %s", c->def, nf_diag_text(d));
  check_all_variants(g, c->def);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  nf_diag_free(d);
}
END_TEST

START_TEST(codegen_compile_time) {
  /* Printed, asserted only loosely (machines vary): the median of this
   * process's compilations so far plus a matmul-sized default. */
  int x = tensor("A", NF_F32, NF_T_INPUT, 2, (int64_t)64, (int64_t)64);
  int w = tensor("B", NF_F32, NF_T_INPUT, 2, (int64_t)64, (int64_t)64);
  int y = tensor("C", NF_F32, NF_T_OUTPUT, 2, (int64_t)64, (int64_t)64);
  int64_t lo = 0, ext = 64;
  stmt(y, NF_RED_SUM, 1, &lo, &ext,
       B2(NF_OP_MUL, A(x, NF_F32, 2, V(0), V(2)), A(w, NF_F32, 2, V(2), V(1))));
  lopts o = {16, 1, 0};
  nf_lprog *p = lower_graph(G, o);
  double t[9];
  for (int i = 0; i < 9; i++) {
    nf_blob so = NF_BLOB_INIT;
    nf_cpu_stats st;
    ck_assert_int_eq(nf_cpu_compile(p, NULL, &so, &st, NULL), NF_OK);
    t[i] = st.total_ms;
    if (i == 8)
      fprintf(stderr, "compile matmul: irgen %.2f opt %.2f emit %.2f link %.2f ms (%zu bytes)\n",
              st.irgen_ms, st.opt_ms, st.emit_ms, st.link_ms, st.so_bytes);
    nf_blob_free(&so);
  }
  qsort(t, 9, sizeof t[0], cmp_d);
  fprintf(stderr, "compile time per kernel: matmul median %.1f ms", t[4]);
  if (n_compile) {
    qsort(compile_ms, (size_t)n_compile, sizeof compile_ms[0], cmp_d);
    fprintf(stderr, "; this process: %d kernels, median %.1f ms, max %.1f ms", n_compile,
            compile_ms[n_compile / 2], compile_ms[n_compile - 1]);
  }
  fprintf(stderr, "\n");
  ck_assert_msg(t[4] < 1000.0, "median compile time %.1f ms", t[4]);
}
END_TEST

START_TEST(codegen_bad_programs) {
  nf_lprog p;
  memset(&p, 0, sizeof p);
  nf_blob so = NF_BLOB_INIT;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_cpu_compile(&p, NULL, &so, NULL, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "empty program"));
  nf_buf_free(&err);
  /* unknown triple */
  int x = tensor("X", NF_F32, NF_T_INPUT, 1, (int64_t)7);
  int y = tensor("Y", NF_F32, NF_T_OUTPUT, 1, (int64_t)7);
  stmt(y, NF_RED_NONE, 0, NULL, NULL, A(x, NF_F32, 1, V(0)));
  lopts o = {0, 0, 0};
  nf_cpu_target t = {"aarch64-linux-gnu", NULL, NULL, 0};
  ck_assert_int_eq(nf_cpu_compile(lower_graph(G, o), &t, &so, NULL, &err), NF_EUNSUPPORTED);
  nf_buf_free(&err);
  /* explicit generic CPU */
  nf_cpu_target t2 = {NULL, "x86-64", "", 2};
  ck_assert_int_eq(nf_cpu_compile(lower_graph(G, o), &t2, &so, NULL, &err), NF_OK);
  ck_assert_uint_gt(so.len, 64);
  nf_blob_free(&so);
  nf_buf_free(&err);
}
END_TEST

/* The default schedule's target from a compile target: its features; the
 * host's without any (no CPU named, or the host's name); AVX2's 16
 * registers for another CPU named without features. */
START_TEST(codegen_sched_target) {
  nf_cpu_target f = {NULL, "skylake-avx512", "+avx2,+avx512f", 0};
  ck_assert_int_eq(nf_cpu_sched_target(&f).vector_regs, 32);
  nf_cpu_target g = {NULL, NULL, "+avx2,-avx512f", 0};
  ck_assert_int_eq(nf_cpu_sched_target(&g).vector_regs, 16);
  nf_cpu_target other = {NULL, "x86-64-v3", NULL, 0};
  ck_assert_int_eq(nf_cpu_sched_target(&other).vector_regs, 16);
  nf_cpu_target none = {NULL, NULL, NULL, 0};
  int host = nf_cpu_sched_target(&none).vector_regs;
  ck_assert(host == 16 || host == 32);
  ck_assert_int_eq(nf_cpu_sched_target(NULL).vector_regs, host);
}
END_TEST

/* One case per test so that CK_RUN_CASE=<name> runs one alone. */
static void add_case(Suite *s, const char *name, const TTest *t, int loop_n) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  if (loop_n)
    tcase_add_loop_test(tc, t, 0, loop_n);
  else
    tcase_add_test(tc, t);
  suite_add_tcase(s, tc);
}

static Suite *suite(void) {
  Suite *s = suite_create("codegen");
  add_case(s, "abi_mismatch", codegen_abi_mismatch, 0);
  add_case(s, "sched_target", codegen_sched_target, 0);
  add_case(s, "bad_programs", codegen_bad_programs, 0);
  add_case(s, "matmul", codegen_matmul, 0);
  add_case(s, "elementwise_ops", codegen_elementwise_ops, 0);
  add_case(s, "integer_ops", codegen_integer_ops, 0);
  add_case(s, "reductions_and_select_oob", codegen_reductions_and_select_oob, 0);
  add_case(s, "big_temp_and_gather", codegen_big_temp_and_gather, 0);
  add_case(s, "resident_then_reload", codegen_resident_then_reload, 0);
  add_case(s, "vmath_exp", codegen_vmath_exp, 0);
  add_case(s, "vmath_log", codegen_vmath_log, 0);
  add_case(s, "vmath_tanh", codegen_vmath_tanh, 0);
  add_case(s, "vmath_sigmoid", codegen_vmath_sigmoid, 0);
  add_case(s, "vmath_erf", codegen_vmath_erf, 0);
  add_case(s, "library_defs", codegen_library_defs, (int)(sizeof cases / sizeof cases[0]));
  add_case(s, "compile_time", codegen_compile_time, 0);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
