/* test_invert.c - tests of the index-map inversion (nf_invert.h).
 *
 * Every inversion is checked against brute force: all points v of the
 * statement's box are enumerated, their index e(v) computed with a small
 * evaluator written here (Python `//` and `%`, lazy select), and the
 * multiset of (y, v) pairs compared with the one the inversion produces
 * by enumerating y over X's shape and t over its box, evaluating the guard
 * and v(y, t).  Evaluating v(y, t) must succeed for every (y, t) of the box
 * (no division by zero, no overflow) even where the guard is false.
 *
 * The named cases (matmul, convolutions, reshapes, ...) also assert the
 * shape of the result (n_t, extents, guard NULL); a seeded random sweep
 * covers affine maps with // and % and records how many (y, t) points the
 * inversion iterates per forward point. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_invert.h"
#include "nf_ir.h"

/* Check records every passing ck_assert (a write per call in fork mode),
 * so the hot loops of the brute-force checker use this instead. */
#define REQUIRE(cond, ...)                                                \
  do {                                                                    \
    if (!(cond)) ck_abort_msg(__VA_ARGS__);                               \
  } while (0)

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  rng_state = x;
  return x;
}

static int rndi(int n) { return (int)(rnd() % (uint64_t)n); }
static int rndr(int lo, int hi) { return lo + rndi(hi - lo + 1); }

static nf_ir_ctx *ctx;

static void setup(void) {
  ctx = nf_ir_ctx_new();
  ck_assert_ptr_nonnull(ctx);
}

static void teardown(void) {
  nf_ir_ctx_free(ctx);
  ctx = NULL;
}

static const nf_expr *V(uint32_t v) { return nf_e_var(ctx, v); }
static const nf_expr *I(int64_t v) { return nf_e_const_i(ctx, NF_I64, v); }
static const nf_expr *B2(nf_op op, const nf_expr *a, const nf_expr *b) {
  return nf_e_binary(ctx, op, a, b);
}
static const nf_expr *ADD(const nf_expr *a, const nf_expr *b) {
  return B2(NF_OP_ADD, a, b);
}
static const nf_expr *SUB(const nf_expr *a, const nf_expr *b) {
  return B2(NF_OP_SUB, a, b);
}
static const nf_expr *MUL(const nf_expr *a, const nf_expr *b) {
  return B2(NF_OP_MUL, a, b);
}
static const nf_expr *FDIV(const nf_expr *a, int64_t c) {
  return B2(NF_OP_FLOORDIV, a, I(c));
}
static const nf_expr *MOD(const nf_expr *a, int64_t c) {
  return B2(NF_OP_MOD, a, I(c));
}

/* Python floor division and modulo; 0 on error. */
static int py_div(int64_t a, int64_t b, int64_t *q) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return 0;
  int64_t r = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) r--;
  *q = r;
  return 1;
}

static int py_mod(int64_t a, int64_t b, int64_t *r) {
  if (b == 0) return 0;
  if (b == -1) {
    *r = 0;
    return 1;
  }
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  *r = m;
  return 1;
}

/* Evaluates an integer or bool expression of the operators the inversion
 * emits; returns 0 on an evaluation error (division by zero, overflow,
 * an operator it does not know). */
static int eval(const nf_expr *e, const int64_t *vals, int n, int64_t *out) {
  int64_t a = 0, b = 0;
  switch ((nf_op)e->op) {
  case NF_OP_CONST: *out = e->u.i; return 1;
  case NF_OP_VAR:
    if ((int)e->u.var >= n) return 0;
    *out = vals[e->u.var];
    return 1;
  case NF_OP_SELECT:
    if (!eval(e->args[0], vals, n, &a)) return 0;
    return eval(e->args[a ? 1 : 2], vals, n, out);
  case NF_OP_NEG:
  case NF_OP_NOT:
    if (!eval(e->args[0], vals, n, &a)) return 0;
    if (e->op == NF_OP_NOT) {
      *out = !a;
      return 1;
    }
    return !__builtin_sub_overflow((int64_t)0, a, out);
  default: break;
  }
  if (e->n_args != 2 || !eval(e->args[0], vals, n, &a) ||
      !eval(e->args[1], vals, n, &b))
    return 0;
  switch ((nf_op)e->op) {
  case NF_OP_ADD: return !__builtin_add_overflow(a, b, out);
  case NF_OP_SUB: return !__builtin_sub_overflow(a, b, out);
  case NF_OP_MUL: return !__builtin_mul_overflow(a, b, out);
  case NF_OP_FLOORDIV: return py_div(a, b, out);
  case NF_OP_MOD: return py_mod(a, b, out);
  case NF_OP_MIN: *out = a < b ? a : b; return 1;
  case NF_OP_MAX: *out = a > b ? a : b; return 1;
  case NF_OP_LT: *out = a < b; return 1;
  case NF_OP_LE: *out = a <= b; return 1;
  case NF_OP_GT: *out = a > b; return 1;
  case NF_OP_GE: *out = a >= b; return 1;
  case NF_OP_EQ: *out = a == b; return 1;
  case NF_OP_NE: *out = a != b; return 1;
  case NF_OP_AND: *out = a && b; return 1;
  case NF_OP_OR: *out = a || b; return 1;
  default: return 0;
  }
}

/* The inversion's expressions compiled to a straight-line program over
 * their DAG (each node once), so the checker evaluates them fast. */
typedef struct pnode {
  const nf_expr *e;
  int a[2];
} pnode;

typedef struct prog {
  pnode *n;
  int len, cap;
} prog;

static int prog_add(prog *p, const nf_expr *e) {
  for (int i = p->len - 1; i >= 0; i--)
    if (p->n[i].e == e) return i;
  int a[2] = {-1, -1};
  REQUIRE(e->op != NF_OP_SELECT && e->op != NF_OP_ACCESS && e->n_args <= 2,
          "unexpected operator %s", nf_op_name((nf_op)e->op));
  for (int k = 0; k < e->n_args; k++) a[k] = prog_add(p, e->args[k]);
  if (p->len == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 64;
    p->n = realloc(p->n, sizeof(pnode) * (size_t)p->cap);
    REQUIRE(p->n != NULL, "out of memory");
  }
  p->n[p->len].e = e;
  p->n[p->len].a[0] = a[0];
  p->n[p->len].a[1] = a[1];
  return p->len++;
}

/* Evaluates every node; 0 when one fails. */
static int prog_run(const prog *p, const int64_t *vals, int n, int64_t *r) {
  for (int i = 0; i < p->len; i++) {
    const nf_expr *e = p->n[i].e;
    int64_t a = p->n[i].a[0] >= 0 ? r[p->n[i].a[0]] : 0;
    int64_t b = p->n[i].a[1] >= 0 ? r[p->n[i].a[1]] : 0;
    int ok = 1;
    switch ((nf_op)e->op) {
    case NF_OP_CONST: r[i] = e->u.i; break;
    case NF_OP_VAR:
      ok = (int)e->u.var < n;
      if (ok) r[i] = vals[e->u.var];
      break;
    case NF_OP_NEG: ok = !__builtin_sub_overflow((int64_t)0, a, &r[i]); break;
    case NF_OP_NOT: r[i] = !a; break;
    case NF_OP_ADD: ok = !__builtin_add_overflow(a, b, &r[i]); break;
    case NF_OP_SUB: ok = !__builtin_sub_overflow(a, b, &r[i]); break;
    case NF_OP_MUL: ok = !__builtin_mul_overflow(a, b, &r[i]); break;
    case NF_OP_FLOORDIV: ok = py_div(a, b, &r[i]); break;
    case NF_OP_MOD: ok = py_mod(a, b, &r[i]); break;
    case NF_OP_MIN: r[i] = a < b ? a : b; break;
    case NF_OP_MAX: r[i] = a > b ? a : b; break;
    case NF_OP_LT: r[i] = a < b; break;
    case NF_OP_LE: r[i] = a <= b; break;
    case NF_OP_GT: r[i] = a > b; break;
    case NF_OP_GE: r[i] = a >= b; break;
    case NF_OP_EQ: r[i] = a == b; break;
    case NF_OP_NE: r[i] = a != b; break;
    case NF_OP_AND: r[i] = a && b; break;
    case NF_OP_OR: r[i] = a || b; break;
    default: ok = 0; break;
    }
    if (!ok) return 0;
  }
  return 1;
}

/* Appends a readable form of e (for failure messages). */
static void pr(const nf_expr *e, nf_buf *b) {
  switch ((nf_op)e->op) {
  case NF_OP_CONST: nf_buf_printf(b, "%lld", (long long)e->u.i); return;
  case NF_OP_VAR: nf_buf_printf(b, "v%u", (unsigned)e->u.var); return;
  case NF_OP_ACCESS: nf_buf_puts(b, "X(..)"); return;
  default: break;
  }
  nf_buf_printf(b, "(%s", nf_op_name((nf_op)e->op));
  for (int i = 0; i < e->n_args; i++) {
    nf_buf_putc(b, ' ');
    pr(e->args[i], b);
  }
  nf_buf_putc(b, ')');
}

static const char *show(const nf_expr *e) {
  static char text[4][2048];
  static int slot;
  nf_buf b = NF_BUF_INIT;
  if (e)
    pr(e, &b);
  else
    nf_buf_puts(&b, "NULL");
  char *t = text[slot++ % 4];
  snprintf(t, 2048, "%s", nf_buf_str(&b));
  nf_buf_free(&b);
  return t;
}

/* A (y, v) pair packed for sorting. */
typedef struct yv {
  int64_t y, v;
} yv;

static int yv_cmp(const void *a, const void *b) {
  const yv *x = a, *y = b;
  if (x->y != y->y) return x->y < y->y ? -1 : 1;
  if (x->v != y->v) return x->v < y->v ? -1 : 1;
  return 0;
}

typedef struct stats {
  int64_t box_pts;  /* forward points */
  int64_t y_pts;    /* elements of X */
  int64_t yt_pts;   /* (y, t) points the inversion iterates */
  int64_t hit_pts;  /* (y, t) points over the y that have a preimage */
  int64_t t_pts;    /* t points per y */
  int64_t max_pre;  /* the largest preimage of one y */
} stats;

/* Checks inv against brute force; fails the test with a message. */
static void check_inv(int n_vars, const nf_range *box, int d,
                      const nf_expr *const *idx, const int64_t *shape,
                      const nf_inversion *inv, stats *st) {
  int64_t box_pts = 1, y_pts = 1, t_pts = 1;
  for (int j = 0; j < n_vars; j++) box_pts *= box[j].hi - box[j].lo + 1;
  for (int k = 0; k < d; k++) y_pts *= shape[k];
  for (int l = 0; l < inv->n_t; l++) {
    ck_assert_int_ge(inv->t_ext[l], 1);
    t_pts *= inv->t_ext[l];
  }
  ck_assert_int_le(y_pts * t_pts, 4000000);
  ck_assert_int_le(box_pts, 1000000);
  yv *want = malloc(sizeof(yv) * (size_t)(box_pts + 1));
  ck_assert_ptr_nonnull(want);
  char *hit = calloc((size_t)y_pts + 1, 1);
  ck_assert_ptr_nonnull(hit);
  int64_t vals[NF_MAX_VARS + NF_MAX_RANK];
  /* Forward: every v of the box. */
  for (int64_t p = 0; p < box_pts; p++) {
    int64_t r = p, vlin = 0;
    for (int j = n_vars - 1; j >= 0; j--) {
      int64_t ext = box[j].hi - box[j].lo + 1;
      vals[j] = box[j].lo + r % ext;
      r /= ext;
    }
    vlin = p;
    int64_t ylin = 0;
    for (int k = 0; k < d; k++) {
      int64_t y;
      REQUIRE(eval(idx[k], vals, n_vars, &y), "index %d fails", k);
      REQUIRE(y >= 0 && y < shape[k], "index %d out of X: %lld", k,
                    (long long)y);
      ylin = ylin * shape[k] + y;
    }
    want[p].y = ylin;
    want[p].v = vlin;
    hit[ylin] = 1;
  }
  qsort(want, (size_t)box_pts, sizeof(yv), yv_cmp);
  /* Inverse: every (y, t) of its box. */
  int64_t cap = box_pts + 16, n_got = 0;
  yv *got = malloc(sizeof(yv) * (size_t)cap);
  ck_assert_ptr_nonnull(got);
  prog pg = {NULL, 0, 0};
  int g_at = inv->guard ? prog_add(&pg, inv->guard) : -1, v_at[NF_MAX_VARS];
  for (int j = 0; j < n_vars; j++) v_at[j] = prog_add(&pg, inv->v[j]);
  int64_t *reg = malloc(sizeof(int64_t) * (size_t)(pg.len + 1));
  ck_assert_ptr_nonnull(reg);
  int64_t hit_y = 0;
  for (int64_t yl = 0; yl < y_pts; yl++) hit_y += hit[yl];
  for (int64_t p = 0; p < y_pts * t_pts; p++) {
    int64_t r = p;
    for (int l = inv->n_t - 1; l >= 0; l--) {
      vals[d + l] = r % inv->t_ext[l];
      r /= inv->t_ext[l];
    }
    int64_t ylin = r;
    for (int k = d - 1; k >= 0; k--) {
      vals[k] = r % shape[k];
      r /= shape[k];
    }
    int64_t g = 1, v[NF_MAX_VARS];
    REQUIRE(prog_run(&pg, vals, d + inv->n_t, reg),
            "guard or v fails to evaluate: guard %s, v0 %s", show(inv->guard),
            show(inv->v[0]));
    if (inv->guard) g = reg[g_at];
    for (int j = 0; j < n_vars; j++) v[j] = reg[v_at[j]];
    if (!g) continue;
    int64_t vlin = 0;
    for (int j = 0; j < n_vars; j++) {
      REQUIRE(v[j] >= box[j].lo && v[j] <= box[j].hi,
                    "v%d = %lld outside [%lld, %lld] (v = %s, guard %s)", j,
                    (long long)v[j], (long long)box[j].lo,
                    (long long)box[j].hi, show(inv->v[j]), show(inv->guard));
      vlin = vlin * (box[j].hi - box[j].lo + 1) + (v[j] - box[j].lo);
    }
    REQUIRE(n_got < cap, "too many preimage points (guard %s)",
                  show(inv->guard));
    got[n_got].y = ylin;
    got[n_got++].v = vlin;
  }
  qsort(got, (size_t)n_got, sizeof(yv), yv_cmp);
  REQUIRE(n_got == box_pts, "%lld preimage points, want %lld (guard %s)",
                (long long)n_got, (long long)box_pts, show(inv->guard));
  for (int64_t i = 0; i < box_pts; i++)
    REQUIRE(got[i].y == want[i].y && got[i].v == want[i].v,
                  "preimage differs at y %lld v %lld (guard %s, v0 %s)",
                  (long long)want[i].y, (long long)want[i].v,
                  show(inv->guard), show(inv->v[0]));
  if (st) {
    st->box_pts = box_pts;
    st->y_pts = y_pts;
    st->yt_pts = y_pts * t_pts;
    st->hit_pts = hit_y * t_pts;
    st->t_pts = t_pts;
    st->max_pre = 0;
    for (int64_t i = 0, run = 0; i < box_pts; i++) {
      run = i > 0 && want[i].y == want[i - 1].y ? run + 1 : 1;
      if (run > st->max_pre) st->max_pre = run;
    }
  }
  free(want);
  free(got);
  free(hit);
  free(reg);
  free(pg.n);
}

/* Inverts and checks; returns the status. */
static int inv_check(int n_vars, const nf_range *box, int d,
                     const nf_expr *const *idx, const int64_t *shape,
                     nf_inversion *out, stats *st) {
  nf_buf why = NF_BUF_INIT;
  int rc = nf__invert(ctx, n_vars, box, NULL, d, idx, shape, out, &why);
  ck_assert_msg(rc == NF_OK, "nf__invert: %s: %s", nf_status_name(rc),
                nf_buf_str(&why));
  nf_buf_free(&why);
  check_inv(n_vars, box, d, idx, shape, out, st);
  return rc;
}

static int invert_why(int n_vars, const nf_range *box, int d,
                      const nf_expr *const *idx, const int64_t *shape,
                      nf_inversion *out, nf_buf *why) {
  return nf__invert(ctx, n_vars, box, NULL, d, idx, shape, out, why);
}

/* ---- named cases ---- */

START_TEST(invert_matmul) {
  /* O(i, j) +=! A(i, k) * B(k, j): i in [0,7), j in [0,5), k in [0,13). */
  nf_range box[3] = {{0, 6}, {0, 4}, {0, 12}};
  const char *names[3] = {"i", "j", "k"};
  const nf_expr *ia[2] = {V(0), V(2)};
  int64_t sa[2] = {7, 13};
  nf_inversion r;
  ck_assert_int_eq(nf__invert(ctx, 3, box, names, 2, ia, sa, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 5);
  ck_assert_str_eq(r.t_names[0], "j");
  ck_assert_ptr_null(r.guard);
  ck_assert_ptr_eq(r.v[0], V(0));
  ck_assert_ptr_eq(r.v[1], V(2));
  ck_assert_ptr_eq(r.v[2], V(1));
  check_inv(3, box, 2, ia, sa, &r, NULL);

  const nf_expr *ib[2] = {V(2), V(1)};
  int64_t sb[2] = {13, 5};
  ck_assert_int_eq(nf__invert(ctx, 3, box, names, 2, ib, sb, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 7);
  ck_assert_str_eq(r.t_names[0], "i");
  ck_assert_ptr_null(r.guard);
  ck_assert_ptr_eq(r.v[0], V(2));
  ck_assert_ptr_eq(r.v[1], V(1));
  ck_assert_ptr_eq(r.v[2], V(0));
  check_inv(3, box, 2, ib, sb, &r, NULL);
}
END_TEST

START_TEST(invert_conv_stride2) {
  /* X(h*2 + r*1 - 1) with padding 1: X is the padded input, so the index
   * is h*2 + r.  h in [0, OH), r in [0, 3), X has 2*OH + 1 rows. */
  for (int oh = 1; oh <= 9; oh++) {
    nf_range box[2] = {{0, oh - 1}, {0, 2}};
    const nf_expr *ix[1] = {ADD(MUL(V(0), I(2)), V(1))};
    int64_t shape[1] = {2 * oh + 1};
    nf_inversion r;
    stats st;
    inv_check(2, box, 1, ix, shape, &r, &st);
    if (oh == 1) { /* X(r): a copy */
      ck_assert_int_eq(r.n_t, 0);
      ck_assert_ptr_null(r.guard);
      continue;
    }
    /* ceil(3 / 2) values of r per row. */
    ck_assert_int_eq(r.n_t, 1);
    ck_assert_int_eq(r.t_ext[0], 2);
    ck_assert_ptr_nonnull(r.guard);
    /* |X| * 2 points for OH * 3 forward points. */
    ck_assert_int_eq(st.yt_pts, (2 * oh + 1) * 2);
  }
  /* The unpadded form reads X(h*2 + r - 1) with rows -1 .. out of X: the
   * inversion only ever yields rows inside X's shape. */
  nf_range box[2] = {{0, 4}, {0, 2}};
  const nf_expr *ix[1] = {SUB(ADD(MUL(V(0), I(2)), V(1)), I(1))};
  int64_t shape[1] = {9};
  nf_inversion r;
  ck_assert_int_eq(invert_why(2, box, 1, ix, shape, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 2);
}
END_TEST

START_TEST(invert_conv2d_full) {
  /* O(n, k, oh, ow) +=! X(n, c, oh*2 + r - 1, ow*2 + s - 1) * W(k, c, r, s)
   * with padding 1 (X is the padded input, shifted by one). */
  enum { N = 2, K = 3, OH = 4, OW = 3, C = 2, R = 3, S = 3 };
  nf_range box[7] = {{0, N - 1}, {0, K - 1},  {0, OH - 1}, {0, OW - 1},
                     {0, C - 1}, {0, R - 1}, {0, S - 1}};
  const char *names[7] = {"n", "k", "oh", "ow", "c", "r", "s"};
  const nf_expr *ix[4] = {V(0), V(4), ADD(MUL(V(2), I(2)), V(5)),
                          ADD(MUL(V(3), I(2)), V(6))};
  int64_t shape[4] = {N, C, 2 * OH + 1, 2 * OW + 1};
  nf_inversion r;
  ck_assert_int_eq(nf__invert(ctx, 7, box, names, 4, ix, shape, &r, NULL),
                   NF_OK);
  ck_assert_int_eq(r.n_t, 3);
  ck_assert_str_eq(r.t_names[0], "k");
  ck_assert_str_eq(r.t_names[1], "r");
  ck_assert_str_eq(r.t_names[2], "s");
  ck_assert_int_eq(r.t_ext[0], K);
  ck_assert_int_eq(r.t_ext[1], 2);
  ck_assert_int_eq(r.t_ext[2], 2);
  stats st;
  check_inv(7, box, 4, ix, shape, &r, &st);
  /* |X| * K * 2 * 2 points against N*K*OH*OW*C*R*S forward points: about
   * (2*OH+1)(2*OW+1)*4 / (OH*OW*9), 16/9 for large outputs. */
  ck_assert_int_eq(st.yt_pts, N * C * (2 * OH + 1) * (2 * OW + 1) * K * 4);
  ck_assert_int_le(st.yt_pts, 3 * st.box_pts);

  /* The weight gradient: W(k, c, r, s) is a plain permutation. */
  const nf_expr *iw[4] = {V(1), V(4), V(5), V(6)};
  int64_t sw[4] = {K, C, R, S};
  ck_assert_int_eq(nf__invert(ctx, 7, box, names, 4, iw, sw, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 3);
  ck_assert_ptr_null(r.guard);
  check_inv(7, box, 4, iw, sw, &r, NULL);
}
END_TEST

START_TEST(invert_conv_dilated_strided) {
  /* X(h*2 + r*2 - 1 + 1): stride 2, dilation 2, padding 1 shifted. */
  nf_range box[2] = {{0, 5}, {0, 2}};
  const nf_expr *ix[1] = {ADD(MUL(V(0), I(2)), MUL(V(1), I(2)))};
  int64_t shape[1] = {15};
  nf_inversion r;
  inv_check(2, box, 1, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 3);
  ck_assert_ptr_nonnull(r.guard);
  /* With an odd padding the divisibility guard reads (y + 1) % 2. */
  const nf_expr *iz[1] = {SUB(ADD(MUL(V(0), I(2)), MUL(V(1), I(2))), I(1))};
  nf_range box2[2] = {{1, 5}, {0, 2}};
  int64_t shape2[1] = {14};
  inv_check(2, box2, 1, iz, shape2, &r, NULL);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 3);
  int64_t vals[2] = {4, 0};
  int64_t g;
  ck_assert(eval(r.guard, vals, 2, &g));
  ck_assert_int_eq(g, 0); /* y = 4 is odd - 1: never hit */
}
END_TEST

START_TEST(invert_grouped_channels) {
  /* X((k // KG) * CG + c): K = 8 output channels in G = 2 groups of
   * KG = 4, CG = 3 input channels per group. */
  enum { KG = 4, CG = 3, G = 2 };
  nf_range box[2] = {{0, KG * G - 1}, {0, CG - 1}};
  const char *names[2] = {"k", "c"};
  const nf_expr *ix[1] = {ADD(MUL(FDIV(V(0), KG), I(CG)), V(1))};
  int64_t shape[1] = {CG * G};
  nf_inversion r;
  ck_assert_int_eq(nf__invert(ctx, 2, box, names, 1, ix, shape, &r, NULL),
                   NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], KG);
  ck_assert_ptr_null(r.guard);
  stats st;
  check_inv(2, box, 1, ix, shape, &r, &st);
  ck_assert_int_eq(st.yt_pts, st.box_pts);
}
END_TEST

START_TEST(invert_diagonal) {
  nf_range box[1] = {{0, 5}};
  const nf_expr *ix[2] = {V(0), V(0)};
  int64_t shape[2] = {6, 6};
  nf_inversion r;
  inv_check(1, box, 2, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_eq(r.guard, B2(NF_OP_EQ, V(0), V(1)));
}
END_TEST

START_TEST(invert_constant_index) {
  /* X(0, j) with vars (i, j). */
  nf_range box[2] = {{0, 3}, {0, 4}};
  const nf_expr *ix[2] = {I(0), V(1)};
  int64_t shape[2] = {3, 5};
  nf_inversion r;
  inv_check(2, box, 2, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 4);
  ck_assert_ptr_eq(r.guard, B2(NF_OP_EQ, V(0), I(0)));
  ck_assert_ptr_eq(r.v[0], V(2));
  ck_assert_ptr_eq(r.v[1], V(1));
  /* A single row: the guard is proved. */
  int64_t shape1[2] = {1, 5};
  inv_check(2, box, 2, ix, shape1, &r, NULL);
  ck_assert_ptr_null(r.guard);
  /* A constant outside X: nothing, ever. */
  const nf_expr *iy[2] = {I(7), V(1)};
  int64_t shape2[2] = {3, 5};
  ck_assert_int_eq(invert_why(2, box, 2, iy, shape2, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_eq(r.guard, nf_e_const_i(ctx, NF_BOOL, 0));
}
END_TEST

START_TEST(invert_reshape) {
  /* X(f // 12, f // 4 % 3, f % 4), f in [0, 24), X shape [2, 3, 4]. */
  nf_range box[1] = {{0, 23}};
  const nf_expr *f = V(0);
  const nf_expr *ix[3] = {FDIV(f, 12), MOD(FDIV(f, 4), 3), MOD(f, 4)};
  int64_t shape[3] = {2, 3, 4};
  nf_inversion r;
  inv_check(1, box, 3, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
  ck_assert_ptr_eq(r.v[0], ADD(ADD(MUL(V(0), I(12)), MUL(V(1), I(4))), V(2)));
  /* And back: O(a, b, c) = F(12a + 4b + c). */
  nf_range box3[3] = {{0, 1}, {0, 2}, {0, 3}};
  const nf_expr *iflat[1] = {ADD(ADD(MUL(V(0), I(12)), MUL(V(1), I(4))), V(2))};
  int64_t sflat[1] = {24};
  inv_check(3, box3, 1, iflat, sflat, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
  /* Flatten of a 2-D transpose: F(b * 2 + a), a in [0, 2), b in [0, 3). */
  nf_range box2[2] = {{0, 1}, {0, 2}};
  const nf_expr *it[1] = {ADD(MUL(V(1), I(2)), V(0))};
  int64_t st[1] = {6};
  inv_check(2, box2, 1, it, st, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
}
END_TEST

START_TEST(invert_pure_stride) {
  nf_range box[1] = {{0, 4}};
  const nf_expr *ix[1] = {MUL(V(0), I(2))};
  int64_t shape[1] = {10};
  nf_inversion r;
  inv_check(1, box, 1, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_eq(r.v[0], FDIV(V(0), 2));
  ck_assert_ptr_eq(r.guard, B2(NF_OP_EQ, MOD(V(0), 2), I(0)));
}
END_TEST

START_TEST(invert_maxpool) {
  /* max=! over X(h*2 + kh - 1 + 1), kh in [0, 3), h in [0, 5). */
  nf_range box[2] = {{0, 4}, {0, 2}};
  const char *names[2] = {"h", "kh"};
  const nf_expr *ix[1] = {ADD(MUL(V(0), I(2)), V(1))};
  int64_t shape[1] = {11};
  nf_inversion r;
  ck_assert_int_eq(nf__invert(ctx, 2, box, names, 1, ix, shape, &r, NULL),
                   NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 2);
  ck_assert_str_eq(r.t_names[0], "kh");
  stats st;
  check_inv(2, box, 1, ix, shape, &r, &st);
  ck_assert_int_eq(st.yt_pts, 22);
  /* 2x2 pooling with stride 2: one point per element, no guard. */
  nf_range box2[2] = {{0, 4}, {0, 1}};
  int64_t shape2[1] = {10};
  inv_check(2, box2, 1, ix, shape2, &r, &st);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
}
END_TEST

START_TEST(invert_permutations) {
  /* O(a, b, c) = X(c, a, b) and a broadcast-free transpose. */
  nf_range box[3] = {{0, 2}, {0, 3}, {0, 4}};
  const nf_expr *ix[3] = {V(2), V(0), V(1)};
  int64_t shape[3] = {5, 3, 4};
  nf_inversion r;
  inv_check(3, box, 3, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
  ck_assert_ptr_eq(r.v[0], V(1));
  ck_assert_ptr_eq(r.v[1], V(2));
  ck_assert_ptr_eq(r.v[2], V(0));
  /* Shifted ranges: a slice X(i + 2) with i in [1, 4]. */
  nf_range box1[1] = {{1, 4}};
  const nf_expr *is[1] = {ADD(V(0), I(2))};
  int64_t s1[1] = {9};
  inv_check(1, box1, 1, is, s1, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_nonnull(r.guard);
  /* Flip: X(4 - i). */
  nf_range box2[1] = {{0, 4}};
  const nf_expr *iflip[1] = {SUB(I(4), V(0))};
  int64_t s2[1] = {5};
  inv_check(1, box2, 1, iflip, s2, &r, NULL);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_null(r.guard);
}
END_TEST

START_TEST(invert_unsupported) {
  nf_range box[2] = {{0, 3}, {0, 3}};
  int64_t shape[2] = {16, 16};
  nf_inversion r;
  nf_buf why = NF_BUF_INIT;
  /* A data-dependent index. */
  const nf_expr *acc_idx[1] = {V(0)};
  const nf_expr *a = nf_e_access(ctx, 0, NF_I64, 1, acc_idx);
  const nf_expr *ix[2] = {V(0), ADD(a, V(1))};
  ck_assert_int_eq(invert_why(2, box, 2, ix, shape, &r, &why),
                   NF_EUNSUPPORTED);
  ck_assert_str_eq(nf_buf_str(&why), "index 1 of the access reads a tensor");
  /* X(i * j). */
  nf_buf_reset(&why);
  const nf_expr *ip[1] = {MUL(V(0), V(1))};
  ck_assert_int_eq(invert_why(2, box, 1, ip, shape, &r, &why),
                   NF_EUNSUPPORTED);
  ck_assert_str_eq(nf_buf_str(&why),
                   "index 0 is not affine: product of variables");
  /* Division by a variable, and other operators. */
  nf_buf_reset(&why);
  const nf_expr *id[1] = {B2(NF_OP_FLOORDIV, V(0), ADD(V(1), I(1)))};
  ck_assert_int_eq(invert_why(2, box, 1, id, shape, &r, &why),
                   NF_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&why), "division by a variable"));
  nf_buf_reset(&why);
  const nf_expr *im[1] = {B2(NF_OP_MIN, V(0), V(1))};
  ck_assert_int_eq(invert_why(2, box, 1, im, shape, &r, &why),
                   NF_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&why), "index 0 is not affine"));
  nf_buf_free(&why);
}
END_TEST

START_TEST(invert_divmod_forms) {
  nf_inversion r;
  /* Negative divisors and sharing of one u // c between dimensions. */
  nf_range box[2] = {{-3, 5}, {0, 2}};
  const nf_expr *u = ADD(V(0), MUL(V(1), I(3)));
  const nf_expr *ix[3] = {ADD(FDIV(u, -4), I(3)), MOD(u, 4),
                          ADD(MOD(u, -4), I(3))};
  int64_t shape[3] = {6, 4, 4};
  inv_check(2, box, 3, ix, shape, &r, NULL);
  ck_assert_int_eq(r.n_t, 1); /* u = i + 3j: j free, i = u - 3j */
  ck_assert_int_eq(r.t_ext[0], 3);
  /* Nested: ((3i + j) // 2 + i) % 5 and // 5, with lo != 0. */
  nf_range box2[2] = {{2, 6}, {-2, 3}};
  const nf_expr *w = ADD(FDIV(ADD(MUL(V(0), I(3)), V(1)), 2), V(0));
  const nf_expr *iy[2] = {MOD(w, 5), FDIV(w, 5)};
  int64_t shape2[2] = {5, 4};
  inv_check(2, box2, 2, iy, shape2, &r, NULL);
  /* A variable only under a // (X(k // 4)). */
  nf_range box3[1] = {{0, 7}};
  const nf_expr *iz[1] = {FDIV(V(0), 4)};
  int64_t shape3[1] = {2};
  inv_check(1, box3, 1, iz, shape3, &r, NULL);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 4);
  ck_assert_ptr_null(r.guard);
  /* X(k % 4): k = y + 4t, the parameter named after k rather than its
   * quotient (both have two values). */
  const char *names[1] = {"k"};
  const nf_expr *im[1] = {MOD(V(0), 4)};
  int64_t shape4[1] = {4};
  ck_assert_int_eq(nf__invert(ctx, 1, box3, names, 1, im, shape4, &r, NULL),
                   NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 2);
  ck_assert_str_eq(r.t_names[0], "k");
  ck_assert_ptr_null(r.guard);
  check_inv(1, box3, 1, im, shape4, &r, NULL);
}
END_TEST

START_TEST(invert_empty_and_limits) {
  nf_inversion r;
  nf_range box[1] = {{0, 3}};
  const nf_expr *ix[1] = {V(0)};
  int64_t zero[1] = {0};
  ck_assert_int_eq(invert_why(1, box, 1, ix, zero, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_eq(r.guard, nf_e_const_i(ctx, NF_BOOL, 0));
  /* Bad arguments. */
  nf_range bad[1] = {{3, 0}};
  int64_t s[1] = {4};
  ck_assert_int_eq(invert_why(1, bad, 1, ix, s, &r, NULL), NF_EINVAL);
  const nf_expr *iv[1] = {V(5)};
  ck_assert_int_eq(invert_why(1, box, 1, iv, s, &r, NULL), NF_EINVAL);
  /* No index at all: every variable is a parameter. */
  ck_assert_int_eq(invert_why(1, box, 0, NULL, NULL, &r, NULL), NF_OK);
  ck_assert_int_eq(r.n_t, 1);
  ck_assert_int_eq(r.t_ext[0], 4);
}
END_TEST

START_TEST(invert_overflow) {
  nf_inversion r;
  nf_buf why = NF_BUF_INIT;
  int n_ovf = 0;
  /* Coefficients near INT64_MAX: every call returns a status, never UB
   * (the sanitizer build checks the latter). */
  int64_t big[] = {INT64_MAX, INT64_MAX - 1, INT64_MIN + 1, INT64_MAX / 2,
                   INT64_MAX / 3, (int64_t)1 << 62, ((int64_t)1 << 62) + 1,
                   3037000499LL, 3037000500LL};
  int n_big = (int)(sizeof(big) / sizeof(big[0]));
  for (int a = 0; a < n_big; a++) {
    for (int b = 0; b < n_big; b++) {
      nf_range box[2] = {{0, 3}, {-2, 5}};
      const nf_expr *ix[2] = {ADD(MUL(V(0), I(big[a])), MUL(V(1), I(big[b]))),
                              SUB(MUL(V(0), I(big[b])), V(1))};
      int64_t shape[2] = {INT64_MAX, 7};
      int rc = invert_why(2, box, 2, ix, shape, &r, &why);
      ck_assert_msg(rc == NF_OK || rc == NF_EOVERFLOW || rc == NF_EUNSUPPORTED,
                    "status %s", nf_status_name(rc));
      n_ovf += rc == NF_EOVERFLOW;
      const nf_expr *iy[1] = {
          ADD(MUL(V(0), I(big[a])), FDIV(MUL(V(1), I(big[b])), 3))};
      rc = invert_why(2, box, 1, iy, shape, &r, &why);
      ck_assert_msg(rc == NF_OK || rc == NF_EOVERFLOW || rc == NF_EUNSUPPORTED,
                    "status %s", nf_status_name(rc));
      n_ovf += rc == NF_EOVERFLOW;
    }
  }
  ck_assert_int_gt(n_ovf, 0);
  /* Huge boxes. */
  nf_range huge[1] = {{INT64_MIN, INT64_MAX}};
  const nf_expr *ix[1] = {V(0)};
  int64_t shape[1] = {10};
  ck_assert_int_eq(invert_why(1, huge, 1, ix, shape, &r, &why), NF_EOVERFLOW);
  /* X(i * INT64_MAX) within a small X is exact: only i = 0 reads X. */
  const nf_expr *iz[1] = {MUL(V(0), I(INT64_MAX))};
  nf_range box[1] = {{0, 3}};
  ck_assert_int_eq(invert_why(1, box, 1, iz, shape, &r, &why), NF_OK);
  ck_assert_int_eq(r.n_t, 0);
  ck_assert_ptr_eq(r.guard, B2(NF_OP_EQ, V(0), I(0)));
  /* A constant index overflowing when moved to the other side. */
  const nf_expr *im[1] = {ADD(V(0), I(INT64_MIN))};
  ck_assert_int_eq(invert_why(1, box, 1, im, shape, &r, &why), NF_EOVERFLOW);
  nf_buf_free(&why);
}
END_TEST

/* ---- random sweep ---- */

/* A random affine form over the variables (coefficients in [-3, 3]). */
static const nf_expr *rnd_affine(int n_vars) {
  const nf_expr *e = I(rndr(-3, 3));
  for (int j = 0; j < n_vars; j++) {
    int c = rndr(-3, 3);
    if (rndi(3) == 0) c = 0;
    if (c) e = ADD(e, MUL(V((uint32_t)j), I(c)));
  }
  return e;
}

/* A random index: affine, sometimes with a // c or % c term (possibly
 * nested), over a shared pool of such terms so dimensions share them. */
static const nf_expr *rnd_index(int n_vars, const nf_expr **pool, int *n_pool,
                                int *has_dm) {
  const nf_expr *e = rnd_affine(n_vars);
  int n_terms = rndi(4) == 0 ? rndr(1, 2) : 0;
  for (int i = 0; i < n_terms; i++) {
    const nf_expr *t;
    if (*n_pool && rndi(2)) {
      t = pool[rndi(*n_pool)];
    } else {
      const nf_expr *u = rnd_affine(n_vars);
      if (*n_pool && rndi(3) == 0) u = ADD(u, pool[rndi(*n_pool)]);
      int c = rndr(2, 4) * (rndi(8) ? 1 : -1);
      t = rndi(2) ? FDIV(u, c) : MOD(u, c);
      if (*n_pool < 8) pool[(*n_pool)++] = t;
    }
    e = ADD(e, MUL(t, I(rndr(-2, 2) | 1)));
    *has_dm = 1;
  }
  return e;
}

/* Rank of the index map's coefficient matrix (affine maps only). */
static int affine_rank(int n_vars, int d, const nf_expr *const *idx) {
  double m[NF_MAX_RANK][NF_MAX_VARS] = {{0}};
  for (int k = 0; k < d; k++) {
    nf_affine a;
    ck_assert_int_eq(nf_expr_affine(idx[k], &a), 1);
    for (int i = 0; i < a.n; i++) m[k][a.var[i]] = (double)a.coef[i];
  }
  int r = 0;
  for (int j = 0; j < n_vars && r < d; j++) {
    int p = -1;
    for (int k = r; k < d; k++)
      if (m[k][j] != 0) p = k;
    if (p < 0) continue;
    for (int c = 0; c < n_vars; c++) {
      double t = m[r][c];
      m[r][c] = m[p][c];
      m[p][c] = t;
    }
    for (int k = r + 1; k < d; k++) {
      double f = m[k][j] / m[r][j];
      for (int c = 0; c < n_vars; c++) m[k][c] -= f * m[r][c];
    }
    r++;
  }
  return r;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

START_TEST(invert_random) {
  enum { N_CASES = 4000 };
  rng_state = 0x9e3779b97f4a7c15ULL;
  int n_ok = 0, n_unsup = 0, n_1d = 0;
  static double ratio_all[N_CASES], ratio_1d[N_CASES], hit_1d[N_CASES],
      tight[N_CASES], tight_1d[N_CASES];
  int n_all = 0;
  double worst_all = 0;
  nf_buf worst_text = NF_BUF_INIT;
  for (int cs = 0; cs < N_CASES; cs++) {
    nf_ir_ctx_free(ctx);
    ctx = nf_ir_ctx_new();
    int n_vars = rndr(1, 4), d = rndr(1, 3);
    nf_range box[4];
    for (int j = 0; j < n_vars; j++) {
      box[j].lo = rndi(3) == 0 ? rndr(-3, 3) : 0;
      box[j].hi = box[j].lo + rndr(0, 6);
    }
    const nf_expr *pool[8];
    int n_pool = 0, has_dm = 0;
    const nf_expr *idx[3];
    int64_t shape[3];
    for (int k = 0; k < d; k++) {
      const nf_expr *e = rnd_index(n_vars, pool, &n_pool, &has_dm);
      /* Shift into X, whose shape is the bounding box plus a margin. */
      int64_t lo = INT64_MAX, hi = INT64_MIN, vals[4];
      int64_t n_pts = 1;
      for (int j = 0; j < n_vars; j++) n_pts *= box[j].hi - box[j].lo + 1;
      for (int64_t p = 0; p < n_pts; p++) {
        int64_t r = p, y;
        for (int j = 0; j < n_vars; j++) {
          vals[j] = box[j].lo + r % (box[j].hi - box[j].lo + 1);
          r /= box[j].hi - box[j].lo + 1;
        }
        REQUIRE(eval(e, vals, n_vars, &y), "index fails");
        if (y < lo) lo = y;
        if (y > hi) hi = y;
      }
      int shift = rndi(3) ? 0 : rndr(1, 2);
      idx[k] = ADD(e, I(shift - lo));
      shape[k] = hi - lo + 1 + shift + (rndi(3) ? 0 : rndr(1, 2));
    }
    nf_inversion r;
    nf_buf why = NF_BUF_INIT;
    int rc = nf__invert(ctx, n_vars, box, NULL, d, idx, shape, &r, &why);
    ck_assert_msg(rc == NF_OK || rc == NF_EUNSUPPORTED, "case %d: %s: %s", cs,
                  nf_status_name(rc), nf_buf_str(&why));
    if (rc == NF_EUNSUPPORTED) {
      /* Only the efficiency limit may refuse these (supported) forms. */
      ck_assert_msg(strstr(nf_buf_str(&why), "not efficiently invertible"),
                    "case %d: %s", cs, nf_buf_str(&why));
      n_unsup++;
      nf_buf_free(&why);
      continue;
    }
    nf_buf_free(&why);
    stats st;
    check_inv(n_vars, box, d, idx, shape, &r, &st);
    n_ok++;
    double unavoidable = (double)(st.box_pts > st.y_pts ? st.box_pts : st.y_pts);
    double ratio = (double)st.yt_pts / unavoidable;
    ratio_all[n_all++] = ratio;
    if (ratio > worst_all) {
      worst_all = ratio;
      nf_buf_reset(&worst_text);
      nf_buf_printf(&worst_text, "case %d: box", cs);
      for (int j = 0; j < n_vars; j++)
        nf_buf_printf(&worst_text, " [%lld,%lld]", (long long)box[j].lo,
                      (long long)box[j].hi);
      for (int k = 0; k < d; k++)
        nf_buf_printf(&worst_text, "; idx %s shape %lld", show(idx[k]),
                      (long long)shape[k]);
      nf_buf_printf(&worst_text, "; n_t %d ext", r.n_t);
      for (int l = 0; l < r.n_t; l++)
        nf_buf_printf(&worst_text, " %lld", (long long)r.t_ext[l]);
      nf_buf_printf(&worst_text, "; box %lld |X| %lld (y,t) %lld",
                    (long long)st.box_pts, (long long)st.y_pts,
                    (long long)st.yt_pts);
    }
    double tt = (double)st.t_pts / (double)st.max_pre;
    tight[n_all - 1] = tt;
    if (getenv("NF_INVERT_SHOW") && tt > 4) {
      fprintf(stderr, "loose case %d (%.2f): box", cs, tt);
      for (int j = 0; j < n_vars; j++)
        fprintf(stderr, " [%lld,%lld]", (long long)box[j].lo,
                (long long)box[j].hi);
      for (int k = 0; k < d; k++)
        fprintf(stderr, "; idx %s shape %lld", show(idx[k]),
                (long long)shape[k]);
      fprintf(stderr, "; ext");
      for (int l = 0; l < r.n_t; l++)
        fprintf(stderr, " %lld", (long long)r.t_ext[l]);
      fprintf(stderr, "; max preimage %lld\n", (long long)st.max_pre);
    }
    if (!has_dm && n_vars - affine_rank(n_vars, d, idx) == 1) {
      /* One free direction: t follows the tightest variable. */
      double hit = (double)st.hit_pts / (double)st.box_pts;
      ck_assert_msg(hit <= 4.0, "case %d: %.2f (y,t) points per forward "
                    "point over the elements read", cs, hit);
      ratio_1d[n_1d] = ratio;
      tight_1d[n_1d] = tt;
      hit_1d[n_1d++] = hit;
    }
  }
  qsort(ratio_all, (size_t)n_all, sizeof(double), dbl_cmp);
  qsort(tight, (size_t)n_all, sizeof(double), dbl_cmp);
  qsort(ratio_1d, (size_t)n_1d, sizeof(double), dbl_cmp);
  qsort(tight_1d, (size_t)n_1d, sizeof(double), dbl_cmp);
  qsort(hit_1d, (size_t)n_1d, sizeof(double), dbl_cmp);
  ck_assert_int_gt(n_1d, 100);
  fprintf(stderr,
          "invert_random: %d inverted, %d refused as inefficient\n"
          "  (y,t) / max(box, |X|): median %.2f p90 %.2f p99 %.2f worst %.2f\n"
          "  t box / largest preimage: median %.2f p90 %.2f worst %.2f\n"
          "  1-D null space, %d cases: (y,t) / max(box, |X|) median %.2f "
          "worst %.2f; over read elements (y,t)/box median %.2f worst %.2f; "
          "t box / largest preimage worst %.2f\n",
          n_ok, n_unsup, ratio_all[n_all / 2], ratio_all[n_all * 9 / 10],
          ratio_all[n_all * 99 / 100], ratio_all[n_all - 1], tight[n_all / 2],
          tight[n_all * 9 / 10], tight[n_all - 1], n_1d, ratio_1d[n_1d / 2],
          ratio_1d[n_1d - 1], hit_1d[n_1d / 2], hit_1d[n_1d - 1],
          tight_1d[n_1d - 1]);
  fprintf(stderr, "invert_random: worst %s\n", nf_buf_str(&worst_text));
  nf_buf_free(&worst_text);
  ck_assert_int_ge(n_ok, N_CASES * 9 / 10);
}
END_TEST

/* Strided and dilated windows y = s*h + dl*r (+ padding margin), the
 * convolution shape: with gcd(s, dl) == 1 the (y, t) points stay within 4x
 * max(forward points, |X|); otherwise within 4x per element of X that is
 * read (the others cannot be skipped by a box over t). */
START_TEST(invert_random_strided) {
  rng_state = 0x1234567887654321ULL;
  double worst = 0, worst_hit = 0;
  static double ratios[2000];
  int n = 0;
  for (int cs = 0; cs < 2000; cs++) {
    nf_ir_ctx_free(ctx);
    ctx = nf_ir_ctx_new();
    int s = rndr(1, 3), dl = rndr(1, 3), oh = rndr(1, 7), kr = rndr(1, 7);
    nf_range box[2] = {{0, oh - 1}, {0, kr - 1}};
    int pad = rndr(0, 2);
    const nf_expr *ix[1] = {ADD(ADD(MUL(V(0), I(s)), MUL(V(1), I(dl))), I(pad))};
    int64_t shape[1] = {(int64_t)s * (oh - 1) + (int64_t)dl * (kr - 1) + 1 +
                        2 * pad};
    nf_inversion r;
    stats st;
    inv_check(2, box, 1, ix, shape, &r, &st);
    double ratio = (double)st.yt_pts /
                   (double)(st.box_pts > st.y_pts ? st.box_pts : st.y_pts);
    double hit = (double)st.hit_pts / (double)st.box_pts;
    int g = s % dl == 0 || dl % s == 0 ? (s < dl ? s : dl) : 1;
    ck_assert_msg(g == 1 ? ratio <= 4.0 : hit <= 4.0,
                  "s %d dl %d oh %d kr %d: ratio %.2f, per read element %.2f",
                  s, dl, oh, kr, ratio, hit);
    ratios[n++] = ratio;
    if (ratio > worst) worst = ratio;
    if (hit > worst_hit) worst_hit = hit;
  }
  qsort(ratios, (size_t)n, sizeof(double), dbl_cmp);
  fprintf(stderr,
          "invert_random_strided: (y,t)/max(box,|X|) median %.2f worst %.2f; "
          "per read element worst %.2f\n",
          ratios[n / 2], worst, worst_hit);
}
END_TEST

static Suite *invert_suite(void) {
  Suite *s = suite_create("invert");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, invert_matmul);
  tcase_add_test(tc, invert_conv_stride2);
  tcase_add_test(tc, invert_conv2d_full);
  tcase_add_test(tc, invert_conv_dilated_strided);
  tcase_add_test(tc, invert_grouped_channels);
  tcase_add_test(tc, invert_diagonal);
  tcase_add_test(tc, invert_constant_index);
  tcase_add_test(tc, invert_reshape);
  tcase_add_test(tc, invert_pure_stride);
  tcase_add_test(tc, invert_maxpool);
  tcase_add_test(tc, invert_permutations);
  tcase_add_test(tc, invert_unsupported);
  tcase_add_test(tc, invert_divmod_forms);
  tcase_add_test(tc, invert_empty_and_limits);
  tcase_add_test(tc, invert_overflow);
  tcase_add_test(tc, invert_random);
  tcase_add_test(tc, invert_random_strided);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(invert_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
