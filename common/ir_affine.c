/* ir_affine.c - index arithmetic on expressions: affine normal forms,
 * interval bounds, simplification and DAG visiting.
 *
 * Invariants:
 *  - Every walk is iterative (explicit stack) and DAG-aware (a map from
 *    node to its result), so deep chains cannot overflow the C stack and
 *    shared subexpressions are computed once.
 *  - Integer arithmetic is overflow-checked everywhere: an affine
 *    coefficient that overflows is NF_EOVERFLOW, a bound that overflows is
 *    "unknown", a fold that overflows is left unfolded.  An i32 node is
 *    only given bounds that lie within i32 (its arithmetic may wrap).
 *  - `//` and `%` follow Python (floor division, remainder with the sign
 *    of the divisor).
 *  - nf_simplify preserves the value of every evaluation that succeeds.
 *    It may drop the evaluation of a subterm whose value cannot matter
 *    (x - x, a select with equal branches), which can only remove an
 *    evaluation error, never add one.  It never moves a subterm out of a
 *    select branch unless the condition is constant.  Floats are only
 *    rewritten exactly (folds whose result is exact in the node's dtype,
 *    x * 1, x / 1, x - 0, x + -0, double negation).
 *
 * This module does not know about graphs or statements: variable ranges
 * come in as an array indexed by variable number.
 */
#include "nf_ir.h"
#include "ir_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- generic iterative post-order walk ---- */

typedef struct frame {
  const nf_expr *e;
  uint32_t next;
} frame;

typedef struct wstack {
  frame *f;
  size_t sp, cap;
} wstack;

static int wpush(wstack *st, const nf_expr *e) {
  if (st->sp == st->cap) {
    size_t ncap = st->cap ? st->cap * 2 : 128;
    frame *nf = realloc(st->f, ncap * sizeof(*nf));
    if (!nf) return NF_ENOMEM;
    st->f = nf;
    st->cap = ncap;
  }
  st->f[st->sp].e = e;
  st->f[st->sp].next = 0;
  st->sp++;
  return NF_OK;
}

/* Visits root and its not-yet-done descendants in post-order.  A node's
 * arguments are visited only when descend(e) is true; compute(user, e)
 * must record e in done (so it is not visited again).  Returns the first
 * non-zero status of compute or NF_ENOMEM. */
static int walk(wstack *st, const nf_ptrmap *done, const nf_expr *root,
                int (*descend)(const nf_expr *e),
                int (*compute)(void *user, const nf_expr *e), void *user) {
  if (nf_ptrmap_get(done, root, NULL)) return NF_OK;
  size_t base = st->sp;
  int rc = wpush(st, root);
  while (!rc && st->sp > base) {
    frame *f = &st->f[st->sp - 1];
    const nf_expr *e = f->e;
    if (f->next < e->n_args && descend(e)) {
      const nf_expr *a = e->args[f->next++];
      if (!nf_ptrmap_get(done, a, NULL)) rc = wpush(st, a);
      continue;
    }
    st->sp--;
    if (!nf_ptrmap_get(done, e, NULL)) rc = compute(user, e);
  }
  st->sp = base;
  return rc;
}

/* ---- integer helpers (Python semantics) ---- */

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

static int fits(nf_dtype t, int64_t v) {
  if (t == NF_I32) return v >= INT32_MIN && v <= INT32_MAX;
  if (t == NF_BOOL) return v == 0 || v == 1;
  return t == NF_I64;
}

static int is_intlike(nf_dtype t) { return t == NF_BOOL || nf_dtype_is_int(t); }

static int const_i(const nf_expr *e, int64_t *v) {
  if (e->op != NF_OP_CONST || !is_intlike((nf_dtype)e->dtype)) return 0;
  if (v) *v = e->u.i;
  return 1;
}

static int const_f(const nf_expr *e, double *v) {
  if (e->op != NF_OP_CONST || !nf_dtype_is_float((nf_dtype)e->dtype))
    return 0;
  if (v) *v = e->u.f;
  return 1;
}

static int is_cmp(nf_op op) { return op >= NF_OP_LT && op <= NF_OP_NE; }

/* ---- affine forms ---- */

/* Forms computed during a walk live in a pool of int64: n, c, then
 * (var, coef) pairs.  The map value is 0 for "not affine", 1 for
 * "overflow", or 2 + the form's offset in the pool. */
typedef struct affm {
  nf_ptrmap *map;
  int64_t *pool;
  size_t len, cap;
  wstack st;
} affm;

enum { AFF_NOT = 0, AFF_OVF = 1, AFF_BASE = 2 };

static void aff_load(const affm *m, uint64_t code, nf_affine *a) {
  const int64_t *p = m->pool + (code - AFF_BASE);
  a->n = (int)p[0];
  a->c = p[1];
  for (int k = 0; k < a->n; k++) {
    a->var[k] = (uint32_t)p[2 + 2 * k];
    a->coef[k] = p[3 + 2 * k];
  }
}

static int aff_store(affm *m, const nf_expr *e, const nf_affine *a) {
  size_t need = 2 + 2 * (size_t)a->n;
  if (m->len + need > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 256;
    while (ncap < m->len + need) ncap *= 2;
    int64_t *np = realloc(m->pool, ncap * sizeof(*np));
    if (!np) return NF_ENOMEM;
    m->pool = np;
    m->cap = ncap;
  }
  int64_t *p = m->pool + m->len;
  p[0] = a->n;
  p[1] = a->c;
  for (int k = 0; k < a->n; k++) {
    p[2 + 2 * k] = a->var[k];
    p[3 + 2 * k] = a->coef[k];
  }
  uint64_t code = AFF_BASE + m->len;
  m->len += need;
  return nf_ptrmap_put(m->map, e, code);
}

/* out = x + s * y (s = 1 or -1); returns AFF_BASE, AFF_NOT (too many
 * variables) or AFF_OVF. */
static int aff_addsub(const nf_affine *x, const nf_affine *y, int s,
                      nf_affine *out) {
  nf_affine r = {0};
  int i = 0, j = 0;
  if (s > 0 ? __builtin_add_overflow(x->c, y->c, &r.c)
            : __builtin_sub_overflow(x->c, y->c, &r.c))
    return AFF_OVF;
  while (i < x->n || j < y->n) {
    uint32_t v;
    int64_t c;
    if (j >= y->n || (i < x->n && x->var[i] < y->var[j])) {
      v = x->var[i];
      c = x->coef[i++];
    } else if (i >= x->n || y->var[j] < x->var[i]) {
      v = y->var[j];
      if (s > 0)
        c = y->coef[j];
      else if (__builtin_sub_overflow((int64_t)0, y->coef[j], &c))
        return AFF_OVF;
      j++;
    } else {
      v = x->var[i];
      if (s > 0 ? __builtin_add_overflow(x->coef[i], y->coef[j], &c)
                : __builtin_sub_overflow(x->coef[i], y->coef[j], &c))
        return AFF_OVF;
      i++;
      j++;
    }
    if (c == 0) continue;
    if (r.n == NF_MAX_VARS) return AFF_NOT;
    r.var[r.n] = v;
    r.coef[r.n++] = c;
  }
  *out = r;
  return AFF_BASE;
}

static int aff_scale(const nf_affine *x, int64_t k, nf_affine *out) {
  nf_affine r = {0};
  if (__builtin_mul_overflow(x->c, k, &r.c)) return AFF_OVF;
  for (int i = 0; i < x->n; i++) {
    int64_t c;
    if (__builtin_mul_overflow(x->coef[i], k, &c)) return AFF_OVF;
    if (c == 0) continue;
    r.var[r.n] = x->var[i];
    r.coef[r.n++] = c;
  }
  *out = r;
  return AFF_BASE;
}

static int aff_descend(const nf_expr *e) {
  return e->dtype == NF_I64 &&
         (e->op == NF_OP_ADD || e->op == NF_OP_SUB || e->op == NF_OP_NEG ||
          e->op == NF_OP_MUL);
}

static int aff_compute(void *user, const nf_expr *e) {
  affm *m = user;
  nf_affine r = {0}, x, y;
  int res = AFF_NOT;
  if (e->dtype != NF_I64) {
    res = AFF_NOT;
  } else if (e->op == NF_OP_VAR) {
    r.n = 1;
    r.var[0] = e->u.var;
    r.coef[0] = 1;
    res = AFF_BASE;
  } else if (e->op == NF_OP_CONST) {
    r.c = e->u.i;
    res = AFF_BASE;
  } else if (aff_descend(e)) {
    uint64_t ca = 0, cb = 0;
    (void)nf_ptrmap_get(m->map, e->args[0], &ca);
    if (e->n_args > 1) (void)nf_ptrmap_get(m->map, e->args[1], &cb);
    else cb = AFF_BASE; /* unused */
    if (ca == AFF_OVF || cb == AFF_OVF) {
      res = AFF_OVF;
    } else if (ca == AFF_NOT || cb == AFF_NOT) {
      res = AFF_NOT;
    } else {
      aff_load(m, ca, &x);
      switch (e->op) {
      case NF_OP_NEG: res = aff_scale(&x, -1, &r); break;
      case NF_OP_ADD:
      case NF_OP_SUB:
        aff_load(m, cb, &y);
        res = aff_addsub(&x, &y, e->op == NF_OP_ADD ? 1 : -1, &r);
        break;
      default: /* MUL */
        aff_load(m, cb, &y);
        if (x.n == 0)
          res = aff_scale(&y, x.c, &r);
        else if (y.n == 0)
          res = aff_scale(&x, y.c, &r);
        else
          res = AFF_NOT;
        break;
      }
    }
  }
  if (res == AFF_BASE) return aff_store(m, e, &r);
  return nf_ptrmap_put(m->map, e, (uint64_t)res);
}

/* Affine form of e through the memo m: 1, 0, NF_EOVERFLOW or NF_ENOMEM. */
static int aff_get(affm *m, const nf_expr *e, nf_affine *out) {
  int rc = walk(&m->st, m->map, e, aff_descend, aff_compute, m);
  if (rc) return rc;
  uint64_t code = 0;
  (void)nf_ptrmap_get(m->map, e, &code);
  if (code == AFF_NOT) return 0;
  if (code == AFF_OVF) return NF_EOVERFLOW;
  aff_load(m, code, out);
  return 1;
}

static void affm_free(affm *m) {
  nf_ptrmap_delete(m->map);
  free(m->pool);
  free(m->st.f);
}

/* Returns 1 and fills *out when e is affine in the index variables (i64
 * VAR, CONST, +, -, unary - and * where one side is constant), 0 when it
 * is not (including forms over more than NF_MAX_VARS variables),
 * NF_EOVERFLOW when a coefficient or the constant overflows, NF_ENOMEM
 * when scratch memory runs out. */
int nf_expr_affine(const nf_expr *e, nf_affine *out) {
  if (!e) return 0;
  affm m = {.map = nf_ptrmap_new()};
  if (!m.map) return NF_ENOMEM;
  nf_affine tmp;
  int rc = aff_get(&m, e, &tmp);
  if (rc == 1 && out) *out = tmp;
  affm_free(&m);
  return rc;
}

static const nf_expr *aff_term(nf_ir_ctx *ctx, uint32_t v, int64_t c) {
  const nf_expr *x = nf_e_var(ctx, v);
  if (c == 1) return x;
  return nf_e_binary(ctx, NF_OP_MUL, x, nf_e_const_i(ctx, NF_I64, c));
}

/* Returns the canonical i64 expression of a: the first term as v, -v or
 * v * c; each later term added (positive coefficient) or subtracted (as
 * v or v * |c|); then the constant added or subtracted.  A form without
 * terms is its constant.  NULL when out of memory. */
const nf_expr *nf_affine_expr(nf_ir_ctx *ctx, const nf_affine *a) {
  NF_ASSERT(a->n >= 0 && a->n <= NF_MAX_VARS);
  const nf_expr *acc = NULL;
  for (int k = 0; k < a->n; k++) {
    int64_t c = a->coef[k];
    if (!acc) {
      acc = c == -1 ? nf_e_unary(ctx, NF_OP_NEG, nf_e_var(ctx, a->var[k]))
                    : aff_term(ctx, a->var[k], c);
    } else if (c < 0 && c != INT64_MIN) {
      acc = nf_e_binary(ctx, NF_OP_SUB, acc, aff_term(ctx, a->var[k], -c));
    } else {
      acc = nf_e_binary(ctx, NF_OP_ADD, acc, aff_term(ctx, a->var[k], c));
    }
    if (!acc) return NULL;
  }
  if (!acc) return nf_e_const_i(ctx, NF_I64, a->c);
  if (a->c == 0) return acc;
  if (a->c < 0 && a->c != INT64_MIN)
    return nf_e_binary(ctx, NF_OP_SUB, acc, nf_e_const_i(ctx, NF_I64, -a->c));
  return nf_e_binary(ctx, NF_OP_ADD, acc, nf_e_const_i(ctx, NF_I64, a->c));
}

/* ---- interval bounds ---- */

typedef struct rng {
  int ok;
  int64_t lo, hi;
} rng;

typedef struct bndm {
  nf_ptrmap *map; /* node -> index into r */
  rng *r;
  size_t n, cap;
  const nf_range *ranges;
  int n_vars;
  wstack st;
} bndm;

static rng mkr(int64_t lo, int64_t hi) {
  rng r = {1, lo, hi};
  return r;
}

static const rng unknown_rng = {0, 0, 0};

static rng r_union(rng a, rng b) {
  if (!a.ok || !b.ok) return unknown_rng;
  return mkr(a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi);
}

/* Interval of a / b (floor) over b's part [p, q] not containing 0. */
static rng r_fdiv_part(rng a, int64_t p, int64_t q) {
  int64_t c[4];
  if (!py_div(a.lo, p, &c[0]) || !py_div(a.lo, q, &c[1]) ||
      !py_div(a.hi, p, &c[2]) || !py_div(a.hi, q, &c[3]))
    return unknown_rng;
  rng r = mkr(c[0], c[0]);
  for (int k = 1; k < 4; k++) {
    if (c[k] < r.lo) r.lo = c[k];
    if (c[k] > r.hi) r.hi = c[k];
  }
  return r;
}

/* Interval of a % b over b's part [p, q] not containing 0 (a may be
 * unknown). */
static rng r_fmod_part(rng a, int64_t p, int64_t q) {
  if (p > 0) {
    rng r = mkr(0, q - 1);
    if (a.ok && p == q) {
      int64_t q0, q1, m0, m1;
      if (py_div(a.lo, p, &q0) && py_div(a.hi, p, &q1) && q0 == q1 &&
          py_mod(a.lo, p, &m0) && py_mod(a.hi, p, &m1))
        return mkr(m0, m1);
    }
    if (a.ok && a.lo >= 0 && a.hi < r.hi) r.hi = a.hi;
    return r;
  }
  rng r = mkr(p + 1, 0);
  if (a.ok && p == q) {
    int64_t q0, q1, m0, m1;
    if (py_div(a.lo, p, &q0) && py_div(a.hi, p, &q1) && q0 == q1 &&
        py_mod(a.lo, p, &m0) && py_mod(a.hi, p, &m1))
      return mkr(m0, m1);
  }
  if (a.ok && a.hi <= 0 && a.lo > r.lo) r.lo = a.lo;
  return r;
}

/* Applies part() to the negative and positive parts of divisor b. */
static rng r_by_parts(rng a, rng b, rng (*part)(rng, int64_t, int64_t)) {
  if (!b.ok) return unknown_rng;
  rng r = unknown_rng;
  int any = 0;
  if (b.lo < 0) {
    r = part(a, b.lo, b.hi < 0 ? b.hi : -1);
    if (!r.ok) return unknown_rng;
    any = 1;
  }
  if (b.hi > 0) {
    rng p = part(a, b.lo > 0 ? b.lo : 1, b.hi);
    if (!p.ok) return unknown_rng;
    r = any ? r_union(r, p) : p;
    any = 1;
  }
  return any ? r : unknown_rng;
}

static rng r_mul(rng a, rng b) {
  if (!a.ok || !b.ok) return unknown_rng;
  int64_t c[4];
  if (__builtin_mul_overflow(a.lo, b.lo, &c[0]) ||
      __builtin_mul_overflow(a.lo, b.hi, &c[1]) ||
      __builtin_mul_overflow(a.hi, b.lo, &c[2]) ||
      __builtin_mul_overflow(a.hi, b.hi, &c[3]))
    return unknown_rng;
  rng r = mkr(c[0], c[0]);
  for (int k = 1; k < 4; k++) {
    if (c[k] < r.lo) r.lo = c[k];
    if (c[k] > r.hi) r.hi = c[k];
  }
  return r;
}

/* Decides a comparison of intervals: [1,1], [0,0] or [0,1]. */
static rng r_cmp(nf_op op, rng a, rng b) {
  rng both = mkr(0, 1);
  if (!a.ok || !b.ok) return both;
  int t = -1; /* 1 always true, 0 always false, -1 undecided */
  switch (op) {
  case NF_OP_LT: t = a.hi < b.lo ? 1 : a.lo >= b.hi ? 0 : -1; break;
  case NF_OP_LE: t = a.hi <= b.lo ? 1 : a.lo > b.hi ? 0 : -1; break;
  case NF_OP_GT: t = a.lo > b.hi ? 1 : a.hi <= b.lo ? 0 : -1; break;
  case NF_OP_GE: t = a.lo >= b.hi ? 1 : a.hi < b.lo ? 0 : -1; break;
  case NF_OP_EQ:
  case NF_OP_NE: {
    int eq = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
    int ne = a.hi < b.lo || b.hi < a.lo;
    t = eq ? 1 : ne ? 0 : -1;
    if (op == NF_OP_NE && t >= 0) t = !t;
    break;
  }
  default: break;
  }
  return t < 0 ? both : mkr(t, t);
}

/* Bounds of node e from the bounds of its arguments (ar, n_args
 * entries); vars and ranges as for nf_expr_bounds. */
static rng bounds_node(const nf_expr *e, const rng *ar,
                       const nf_range *ranges, int n_vars) {
  nf_dtype t = (nf_dtype)e->dtype;
  rng r = unknown_rng;
  rng a = e->n_args > 0 ? ar[0] : unknown_rng;
  rng b = e->n_args > 1 ? ar[1] : unknown_rng;
  int64_t lo, hi;
  int int_args = e->n_args > 0 && is_intlike((nf_dtype)e->args[0]->dtype);
  switch (e->op) {
  case NF_OP_CONST:
    if (is_intlike(t)) r = mkr(e->u.i, e->u.i);
    break;
  case NF_OP_VAR:
    if (ranges && e->u.var < (uint32_t)(n_vars > 0 ? n_vars : 0) &&
        ranges[e->u.var].lo <= ranges[e->u.var].hi)
      r = mkr(ranges[e->u.var].lo, ranges[e->u.var].hi);
    break;
  case NF_OP_NEG:
    if (int_args && a.ok && !__builtin_sub_overflow((int64_t)0, a.hi, &lo) &&
        !__builtin_sub_overflow((int64_t)0, a.lo, &hi))
      r = mkr(lo, hi);
    break;
  case NF_OP_ABS:
    if (!int_args || !a.ok) break;
    if (a.lo >= 0) {
      r = a;
    } else if (a.hi <= 0) {
      if (!__builtin_sub_overflow((int64_t)0, a.hi, &lo) &&
          !__builtin_sub_overflow((int64_t)0, a.lo, &hi))
        r = mkr(lo, hi);
    } else if (!__builtin_sub_overflow((int64_t)0, a.lo, &hi)) {
      r = mkr(0, hi > a.hi ? hi : a.hi);
    }
    break;
  case NF_OP_NOT:
    r = a.ok && a.lo == a.hi ? mkr(!a.lo, !a.lo) : mkr(0, 1);
    break;
  case NF_OP_CAST:
    if (!int_args || !a.ok || !is_intlike(t)) break;
    if (t == NF_BOOL)
      r = a.lo > 0 || a.hi < 0 ? mkr(1, 1)
          : a.lo == 0 && a.hi == 0 ? mkr(0, 0) : mkr(0, 1);
    else
      r = a; /* out of i32 range is dropped below */
    break;
  case NF_OP_ADD:
    if (nf_dtype_is_int(t) && a.ok && b.ok &&
        !__builtin_add_overflow(a.lo, b.lo, &lo) &&
        !__builtin_add_overflow(a.hi, b.hi, &hi))
      r = mkr(lo, hi);
    break;
  case NF_OP_SUB:
    if (nf_dtype_is_int(t) && a.ok && b.ok &&
        !__builtin_sub_overflow(a.lo, b.hi, &lo) &&
        !__builtin_sub_overflow(a.hi, b.lo, &hi))
      r = mkr(lo, hi);
    break;
  case NF_OP_MUL:
    if (nf_dtype_is_int(t)) r = r_mul(a, b);
    break;
  case NF_OP_FLOORDIV:
    if (nf_dtype_is_int(t) && a.ok) r = r_by_parts(a, b, r_fdiv_part);
    break;
  case NF_OP_MOD:
    if (nf_dtype_is_int(t)) r = r_by_parts(a, b, r_fmod_part);
    break;
  case NF_OP_MIN:
    if (nf_dtype_is_int(t) && a.ok && b.ok)
      r = mkr(a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi);
    break;
  case NF_OP_MAX:
    if (nf_dtype_is_int(t) && a.ok && b.ok)
      r = mkr(a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi);
    break;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
    r = int_args ? r_cmp((nf_op)e->op, a, b) : mkr(0, 1);
    break;
  case NF_OP_AND:
  case NF_OP_OR: {
    rng x = a.ok ? a : mkr(0, 1), y = b.ok ? b : mkr(0, 1);
    if (e->op == NF_OP_AND)
      r = mkr(x.lo & y.lo, x.hi & y.hi);
    else
      r = mkr(x.lo | y.lo, x.hi | y.hi);
    break;
  }
  case NF_OP_SELECT:
    if (!is_intlike(t)) break;
    if (a.ok && a.lo == 1 && a.hi == 1)
      r = b;
    else if (a.ok && a.lo == 0 && a.hi == 0)
      r = ar[2];
    else
      r = r_union(b, ar[2]);
    break;
  default: break;
  }
  if (r.ok && !(fits(t, r.lo) && fits(t, r.hi))) r = unknown_rng;
  if (!r.ok && t == NF_BOOL) r = mkr(0, 1);
  return r;
}

/* Arguments whose bounds matter: none below an access or under a float
 * value (whose bounds are unknown anyway). */
static int bnd_descend(const nf_expr *e) {
  if (e->op == NF_OP_ACCESS || nf_dtype_is_float((nf_dtype)e->dtype))
    return 0;
  if (e->op != NF_OP_SELECT && e->n_args > 0 &&
      nf_dtype_is_float((nf_dtype)e->args[0]->dtype))
    return 0;
  return 1;
}

static rng bnd_lookup(const bndm *m, const nf_expr *e) {
  uint64_t i;
  if (!nf_ptrmap_get(m->map, e, &i)) return unknown_rng;
  return m->r[i];
}

static int bnd_compute(void *user, const nf_expr *e) {
  bndm *m = user;
  rng ar[3] = {unknown_rng, unknown_rng, unknown_rng};
  if (bnd_descend(e) && e->n_args <= 3)
    for (int k = 0; k < e->n_args; k++) ar[k] = bnd_lookup(m, e->args[k]);
  /* bounds_node reads ar[0..2] only for ops with that many arguments. */
  rng r = bounds_node(e, ar, m->ranges, m->n_vars);
  if (m->n == m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 128;
    rng *nr = realloc(m->r, ncap * sizeof(*nr));
    if (!nr) return NF_ENOMEM;
    m->r = nr;
    m->cap = ncap;
  }
  m->r[m->n] = r;
  return nf_ptrmap_put(m->map, e, m->n++);
}

/* Bounds of e through the memo; unknown on any failure. */
static rng bnd_get(bndm *m, const nf_expr *e) {
  if (walk(&m->st, m->map, e, bnd_descend, bnd_compute, m)) return unknown_rng;
  return bnd_lookup(m, e);
}

static void bndm_free(bndm *m) {
  nf_ptrmap_delete(m->map);
  free(m->r);
  free(m->st.f);
}

/* Sets *out to an interval holding every value of e (bool as 0/1) and
 * returns 1, or returns 0 when no bound is known (tensor values, floats,
 * overflow, a variable without a range, out of memory). */
int nf_expr_bounds(const nf_expr *e, const nf_range *ranges, int n_vars,
                   nf_range *out) {
  if (!e) return 0;
  bndm m = {.map = nf_ptrmap_new(), .ranges = ranges, .n_vars = n_vars};
  if (!m.map) return 0;
  rng r = bnd_get(&m, e);
  bndm_free(&m);
  if (!r.ok) return 0;
  if (out) {
    out->lo = r.lo;
    out->hi = r.hi;
  }
  return 1;
}

/* ---- simplification ---- */

typedef struct simp {
  nf_ir_ctx *ctx;
  nf_ptrmap *done; /* original node -> simplified node */
  wstack st;
  affm aff;
  bndm bnd;
  int failed; /* scratch memory ran out */
} simp;

#define RW_MAX_DEPTH 8

static const nf_expr *rw(simp *s, const nf_expr *n, int depth);

static const nf_expr *again(simp *s, const nf_expr *n, const nf_expr *m,
                            int depth) {
  if (!m || m == n || depth >= RW_MAX_DEPTH) return m;
  return rw(s, m, depth + 1);
}

static const nf_expr *ci(simp *s, nf_dtype t, int64_t v) {
  return nf_e_const_i(s->ctx, t, v);
}

/* A float constant of dtype t equal to v, or NULL when v is not exactly a
 * value of t (or is NaN); *oom is set when the constructor failed. */
static const nf_expr *cf_exact(simp *s, nf_dtype t, double v, int *oom) {
  if (isnan(v)) return NULL;
  const nf_expr *c = nf_e_const_f(s->ctx, t, v);
  if (!c) {
    *oom = 1;
    return NULL;
  }
  if (memcmp(&c->u.f, &v, sizeof(v)) != 0) return NULL;
  return c;
}

/* Folds n when all its arguments are constants.  Returns the constant,
 * or NULL when it does not fold (*oom set on allocation failure). */
static const nf_expr *fold(simp *s, const nf_expr *n, int *oom) {
  nf_op op = (nf_op)n->op;
  nf_dtype t = (nf_dtype)n->dtype;
  int64_t x = 0, y = 0, r = 0;
  double fx = 0, fy = 0, fr = 0;
  const nf_expr *a = n->args[0], *b = n->n_args > 1 ? n->args[1] : NULL;
  int ints = const_i(a, &x) && (!b || const_i(b, &y));
  int flts = const_f(a, &fx) && (!b || const_f(b, &fy));
  const nf_expr *res = NULL;
  if (ints) {
    int ok = 1;
    switch (op) {
    case NF_OP_NEG: ok = !__builtin_sub_overflow((int64_t)0, x, &r); break;
    case NF_OP_ABS:
      ok = x >= 0 ? (r = x, 1) : !__builtin_sub_overflow((int64_t)0, x, &r);
      break;
    case NF_OP_NOT: r = !x; break;
    case NF_OP_CAST:
      if (nf_dtype_is_float(t)) {
        if (x < -(INT64_C(1) << 53) || x > (INT64_C(1) << 53)) return NULL;
        return cf_exact(s, t, (double)x, oom);
      }
      r = t == NF_BOOL ? x != 0 : x;
      break;
    case NF_OP_ADD: ok = !__builtin_add_overflow(x, y, &r); break;
    case NF_OP_SUB: ok = !__builtin_sub_overflow(x, y, &r); break;
    case NF_OP_MUL: ok = !__builtin_mul_overflow(x, y, &r); break;
    case NF_OP_FLOORDIV: ok = py_div(x, y, &r); break;
    case NF_OP_MOD: ok = py_mod(x, y, &r); break;
    case NF_OP_MIN: r = x < y ? x : y; break;
    case NF_OP_MAX: r = x > y ? x : y; break;
    case NF_OP_LT: r = x < y; break;
    case NF_OP_LE: r = x <= y; break;
    case NF_OP_GT: r = x > y; break;
    case NF_OP_GE: r = x >= y; break;
    case NF_OP_EQ: r = x == y; break;
    case NF_OP_NE: r = x != y; break;
    case NF_OP_AND: r = x && y; break;
    case NF_OP_OR: r = x || y; break;
    default: ok = 0; break;
    }
    if (!ok || !is_intlike(t) || !fits(t, r)) return NULL;
    res = ci(s, t, r);
    if (!res) *oom = 1;
    return res;
  }
  if (flts) {
    switch (op) {
    case NF_OP_NEG: fr = -fx; break;
    case NF_OP_ABS: fr = fabs(fx); break;
    case NF_OP_FLOOR: fr = floor(fx); break;
    case NF_OP_CEIL: fr = ceil(fx); break;
    case NF_OP_CAST:
      if (!nf_dtype_is_float(t)) return NULL;
      fr = fx;
      break;
    case NF_OP_ADD: fr = fx + fy; break;
    case NF_OP_SUB: fr = fx - fy; break;
    case NF_OP_MUL: fr = fx * fy; break;
    case NF_OP_DIV: fr = fx / fy; break;
    case NF_OP_LT:
    case NF_OP_LE:
    case NF_OP_GT:
    case NF_OP_GE:
    case NF_OP_EQ:
    case NF_OP_NE: {
      int v = op == NF_OP_LT   ? fx < fy
              : op == NF_OP_LE ? fx <= fy
              : op == NF_OP_GT ? fx > fy
              : op == NF_OP_GE ? fx >= fy
              : op == NF_OP_EQ ? fx == fy
                               : fx != fy;
      res = ci(s, NF_BOOL, v);
      if (!res) *oom = 1;
      return res;
    }
    default: return NULL;
    }
    return cf_exact(s, t, fr, oom);
  }
  return NULL;
}

static nf_op cmp_negate(nf_op op) {
  switch (op) {
  case NF_OP_LT: return NF_OP_GE;
  case NF_OP_LE: return NF_OP_GT;
  case NF_OP_GT: return NF_OP_LE;
  case NF_OP_GE: return NF_OP_LT;
  case NF_OP_EQ: return NF_OP_NE;
  default: return NF_OP_EQ;
  }
}

static int is_fconst(const nf_expr *e, double v, int neg_zero) {
  double x;
  if (!const_f(e, &x)) return 0;
  return x == v && (v != 0 || signbit(x) == neg_zero);
}

static int is_iconst(const nf_expr *e, int64_t v) {
  int64_t x;
  return const_i(e, &x) && x == v;
}

/* x // c and x % c for constant c != 0 (integer dtype t): decided by the
 * bounds of x, or split into a multiple of c plus a rest when x is affine.
 * Returns the rewrite, NULL when none applies. */
static const nf_expr *divmod_rule(simp *s, const nf_expr *n, int64_t c) {
  nf_dtype t = (nf_dtype)n->dtype;
  const nf_expr *x = n->args[0];
  int is_div = n->op == NF_OP_FLOORDIV;
  rng bx = bnd_get(&s->bnd, x);
  if (!bx.ok) return NULL;
  int64_t q0, q1;
  if (py_div(bx.lo, c, &q0) && py_div(bx.hi, c, &q1) && q0 == q1) {
    if (is_div) return fits(t, q0) ? ci(s, t, q0) : NULL;
    if (q0 == 0) return x;
    int64_t qc;
    if (__builtin_mul_overflow(q0, c, &qc) || !fits(t, qc)) return NULL;
    return nf_e_binary(s->ctx, NF_OP_SUB, x, ci(s, t, qc));
  }
  if (t != NF_I64 || c == -1) return NULL;
  nf_affine f;
  if (aff_get(&s->aff, x, &f) != 1) return NULL;
  /* x = c * Q + R with Q's coefficients the multiples of c. */
  nf_affine Q = {0}, R = {0};
  if (!py_div(f.c, c, &Q.c) || !py_mod(f.c, c, &R.c)) return NULL;
  for (int k = 0; k < f.n; k++) {
    if (f.coef[k] % c == 0) {
      Q.var[Q.n] = f.var[k];
      Q.coef[Q.n++] = f.coef[k] / c;
    } else {
      R.var[R.n] = f.var[k];
      R.coef[R.n++] = f.coef[k];
    }
  }
  if (Q.n == 0 && Q.c == 0) return NULL;
  const nf_expr *qe = nf_affine_expr(s->ctx, &Q);
  const nf_expr *re = nf_affine_expr(s->ctx, &R);
  if (!qe || !re) return NULL;
  /* Only when no intermediate of the new form can overflow. */
  if (!bnd_get(&s->bnd, qe).ok || !bnd_get(&s->bnd, re).ok) return NULL;
  const nf_expr *ce = ci(s, t, c);
  const nf_expr *rest = nf_e_binary(s->ctx, (nf_op)n->op, re, ce);
  rest = rw(s, rest, RW_MAX_DEPTH - 1);
  if (!is_div) return rest;
  return nf_e_binary(s->ctx, NF_OP_ADD, qe, rest);
}

/* Applies the local rewrites to n, whose arguments are simplified. */
static const nf_expr *rw(simp *s, const nf_expr *n, int depth) {
  if (!n) return NULL;
  nf_op op = (nf_op)n->op;
  nf_dtype t = (nf_dtype)n->dtype;
  nf_ir_ctx *ctx = s->ctx;
  const nf_expr *a = n->n_args > 0 ? n->args[0] : NULL;
  const nf_expr *b = n->n_args > 1 ? n->args[1] : NULL;
  const nf_expr *m = NULL;
  int64_t c;

  if (op != NF_OP_CONST && op != NF_OP_VAR && op != NF_OP_ACCESS &&
      op != NF_OP_SELECT) {
    int oom = 0;
    m = fold(s, n, &oom);
    if (oom) return NULL;
    if (m) return m;
  }
  int ints = is_intlike(t) && t != NF_BOOL;
  int flt = nf_dtype_is_float(t);
  switch (op) {
  case NF_OP_CAST:
    if (a->dtype == t) return a;
    break;
  case NF_OP_NEG:
    if (a->op == NF_OP_NEG) return a->args[0];
    break;
  case NF_OP_NOT:
    if (a->op == NF_OP_NOT) return a->args[0];
    if (is_cmp((nf_op)a->op) && is_intlike((nf_dtype)a->args[0]->dtype))
      m = nf_e_binary(ctx, cmp_negate((nf_op)a->op), a->args[0], a->args[1]);
    break;
  case NF_OP_ADD:
    if (ints && is_iconst(b, 0)) return a;
    if (ints && is_iconst(a, 0)) return b;
    if (flt && is_fconst(b, 0.0, 1)) return a;
    if (flt && is_fconst(a, 0.0, 1)) return b;
    break;
  case NF_OP_SUB:
    if (ints && is_iconst(b, 0)) return a;
    if (ints && a == b) return ci(s, t, 0);
    if (flt && is_fconst(b, 0.0, 0)) return a;
    break;
  case NF_OP_MUL:
    if (ints && is_iconst(b, 1)) return a;
    if (ints && is_iconst(a, 1)) return b;
    if (flt && is_fconst(b, 1.0, 0)) return a;
    if (flt && is_fconst(a, 1.0, 0)) return b;
    break;
  case NF_OP_DIV:
    if (is_fconst(b, 1.0, 0)) return a;
    break;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
    if (!ints || !const_i(b, &c) || c == 0) break;
    if (c == 1) return op == NF_OP_FLOORDIV ? a : ci(s, t, 0);
    if (c == -1 && op == NF_OP_MOD) return ci(s, t, 0);
    m = divmod_rule(s, n, c);
    break;
  case NF_OP_MIN:
  case NF_OP_MAX:
    if (a == b) return a;
    if (ints) {
      rng ra = bnd_get(&s->bnd, a), rb = bnd_get(&s->bnd, b);
      if (ra.ok && rb.ok) {
        if (ra.hi <= rb.lo) return op == NF_OP_MIN ? a : b;
        if (rb.hi <= ra.lo) return op == NF_OP_MIN ? b : a;
      }
    }
    break;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
    if (a == b && is_intlike((nf_dtype)a->dtype))
      return ci(s, NF_BOOL, op == NF_OP_LE || op == NF_OP_GE ||
                                op == NF_OP_EQ);
    break;
  case NF_OP_AND:
    if (is_iconst(a, 0) || is_iconst(b, 0)) return ci(s, NF_BOOL, 0);
    if (is_iconst(a, 1)) return b;
    if (is_iconst(b, 1) || a == b) return a;
    break;
  case NF_OP_OR:
    if (is_iconst(a, 1) || is_iconst(b, 1)) return ci(s, NF_BOOL, 1);
    if (is_iconst(a, 0)) return b;
    if (is_iconst(b, 0) || a == b) return a;
    break;
  case NF_OP_SELECT: {
    const nf_expr *x = n->args[1], *y = n->args[2];
    if (is_iconst(a, 1)) return x;
    if (is_iconst(a, 0)) return y;
    if (x == y) return x;
    if (t == NF_BOOL && is_iconst(x, 1) && is_iconst(y, 0)) return a;
    if (t == NF_BOOL && is_iconst(x, 0) && is_iconst(y, 1))
      m = nf_e_unary(ctx, NF_OP_NOT, a);
    else if (a->op == NF_OP_NOT)
      m = nf_e_select(ctx, a->args[0], y, x);
    break;
  }
  default: break;
  }
  if (m) return again(s, n, m, depth);

  if (aff_descend(n)) {
    nf_affine f;
    int rc = aff_get(&s->aff, n, &f);
    if (rc < 0 && rc != NF_EOVERFLOW) s->failed = 1;
    if (rc == 1) {
      m = nf_affine_expr(ctx, &f);
      if (m != n) return again(s, n, m, depth);
    }
  }
  if (is_intlike(t) && op != NF_OP_CONST) {
    rng r = bnd_get(&s->bnd, n);
    if (r.ok && r.lo == r.hi) return ci(s, t, r.lo);
  }
  return n;
}

static int simp_descend(const nf_expr *e) {
  (void)e;
  return 1;
}

static int simp_compute(void *user, const nf_expr *e) {
  simp *s = user;
  const nf_expr *na[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  const nf_expr **args = na;
  const nf_expr **heap = NULL;
  int changed = 0;
  if (e->n_args > (int)(sizeof(na) / sizeof(na[0]))) {
    heap = malloc(e->n_args * sizeof(*heap));
    if (!heap) return NF_ENOMEM;
    args = heap;
  }
  for (int k = 0; k < e->n_args; k++) {
    uint64_t v = 0;
    (void)nf_ptrmap_get(s->done, e->args[k], &v);
    args[k] = (const nf_expr *)(uintptr_t)v;
    if (!args[k]) {
      free(heap);
      return NF_ENOMEM; /* an argument already failed */
    }
    changed |= args[k] != e->args[k];
  }
  const nf_expr *n = changed ? nf_e_rebuild(s->ctx, e, args) : e;
  free(heap);
  const nf_expr *r = rw(s, n, 0);
  if (!r || s->failed) return NF_ENOMEM;
  return nf_ptrmap_put(s->done, e, (uint64_t)(uintptr_t)r);
}

/* Returns a simplified expression equal in value to e wherever e
 * evaluates without error (see the module comment), or NULL when out of
 * memory (the context's oom flag is then set).  ranges (n_vars entries,
 * may be NULL) bound the index variables. */
const nf_expr *nf_simplify(nf_ir_ctx *ctx, const nf_expr *e,
                           const nf_range *ranges, int n_vars) {
  if (!e) return NULL;
  simp s = {.ctx = ctx};
  s.done = nf_ptrmap_new();
  s.aff.map = nf_ptrmap_new();
  s.bnd.map = nf_ptrmap_new();
  s.bnd.ranges = ranges;
  s.bnd.n_vars = ranges ? n_vars : 0;
  const nf_expr *res = NULL;
  if (s.done && s.aff.map && s.bnd.map &&
      walk(&s.st, s.done, e, simp_descend, simp_compute, &s) == NF_OK) {
    uint64_t v = 0;
    (void)nf_ptrmap_get(s.done, e, &v);
    res = (const nf_expr *)(uintptr_t)v;
  }
  if (!res) nf__ir_ctx_set_oom(ctx);
  nf_ptrmap_delete(s.done);
  free(s.st.f);
  affm_free(&s.aff);
  bndm_free(&s.bnd);
  return res;
}

/* ---- visiting ---- */

typedef struct visitor {
  nf_ptrmap *done;
  void (*fn)(const nf_expr *e, void *user);
  void *user;
} visitor;

static int visit_compute(void *user, const nf_expr *e) {
  visitor *v = user;
  int rc = nf_ptrmap_put(v->done, e, 1);
  if (!rc) v->fn(e, v->user);
  return rc;
}

/* Calls fn(e, user) on e and each distinct sub-expression once, arguments
 * before the node (left to right).  Returns NF_OK, or NF_ENOMEM when its
 * scratch memory ran out (the walk then stopped early). */
int nf_expr_visit(const nf_expr *e,
                  void (*fn)(const nf_expr *e, void *user), void *user) {
  if (!e || !fn) return NF_OK;
  visitor v = {.done = nf_ptrmap_new(), .fn = fn, .user = user};
  if (!v.done) return NF_ENOMEM;
  wstack st = {0};
  int rc = walk(&st, v.done, e, simp_descend, visit_compute, &v);
  free(st.f);
  nf_ptrmap_delete(v.done);
  return rc ? NF_ENOMEM : NF_OK;
}
