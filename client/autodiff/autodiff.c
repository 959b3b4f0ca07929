/* autodiff.c - graph-level reverse mode over the expression IR (see
 * nf_autodiff.h).
 *
 * Working form: every tensor of the result lives in one table indexed by
 * "unified" ids (the forward graph's ids first, then seeds, adjoints,
 * partial adjoints and helpers), and every statement in one list whose
 * expressions (built in the caller's context) use unified ids.  The steps:
 *
 *  1. Which tensors carry an adjoint: float tensors that depend on a
 *     requested input and from which some output is reachable.
 *  2. Forward statements are copied (re-interned in the caller's context).
 *  3. Statements are visited in reverse.  The adjoint of a statement's
 *     output is the sum of its partial adjoints (and its seed, for an
 *     output).  For each distinct access X(e(v)) in the right side whose
 *     tensor carries an adjoint, the symbolic partial derivative P of the
 *     right side with respect to that access node (all its occurrences:
 *     the node is hash-consed) gives the per-point contribution
 *     G(v) = dO(i) * P(v) (times the argmax mask of a max/min reduction, or
 *     O(i)/f(v) for a product).  The index map is inverted (nf__invert) to
 *     write the contribution as a statement over X's elements; where no
 *     inversion exists it is a reduction over every point of the forward
 *     box with an equality guard, flagged NF_STMT_SCATTER.
 *  4. Each requested input's gradient is the sum of its partials (zero,
 *     with a note, when it has none).
 *  5. Only statements that a result needs are emitted, with tensors
 *     renumbered, into the result graph.
 *
 * Everything temporary lives in a scratch arena; nothing here prints. */
#include "nf_autodiff.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nf_invert.h"
#include "nf_ptrmap.h"

#define MAX_PARTS_NOTE 256

/* ---- memos for expression rewriting: the common pointer map ---- */

typedef nf_ptrmap pmap;

static int pm_get(const pmap *m, const void *k, const void **v) { return nf_ptrmap_getp(m, k, v); }
static int pm_put(pmap *m, const void *k, const void *v) { return nf_ptrmap_putp(m, k, v); }
static void pm_free(pmap *m) { nf_ptrmap_free(m); }

/* ---- working state ---- */

typedef struct utensor {
  const char *name;
  uint8_t dtype, kind, rank;
  int64_t shape[NF_MAX_RANK];
} utensor;

typedef struct ustmt {
  nf_stmt s;         /* out and accesses in unified ids */
  int32_t fwd;       /* forward statement differentiated, or -1 */
  const char *wrt;   /* adjoint it contributes to */
  int scatter;
  const char *why;
  int is_forward;    /* a copy of a forward statement */
} ustmt;

typedef struct part {
  uint32_t id;
  struct part *next;
} part;

typedef struct ad {
  const nf_graph *g;
  nf_ir_ctx *ctx;
  nf_buf *err;
  nf_arena *tmp;
  utensor *t;
  uint32_t n_t, cap_t;
  ustmt *s;
  uint32_t n_s, cap_s;
  part **parts;     /* per forward tensor: partial adjoints */
  uint32_t *seed;   /* per forward tensor: seed id or UINT32_MAX */
  char *carries;    /* per forward tensor: carries an adjoint */
  const char **notes;
  int n_notes, cap_notes;
  int cur_stmt;     /* forward statement being differentiated */
} ad;

static int fail(ad *A, int rc, const char *fmt, ...) NF_PRINTF(3, 4);
static int fail(ad *A, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nf_buf_vprintf(A->err, fmt, ap);
  va_end(ap);
  return rc;
}

static int oom(ad *A) { return fail(A, NF_ENOMEM, "out of memory"); }

static char *tstr(ad *A, const char *fmt, ...) NF_PRINTF(2, 3);
static char *tstr(ad *A, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return nf_arena_strdup(nf_ir_ctx_arena(A->ctx), buf);
}

static int add_t(ad *A, const char *name, nf_dtype dt, nf_tkind kind, int rank,
                 const int64_t *shape, uint32_t *id) {
  if (A->n_t == A->cap_t) {
    uint32_t nc = A->cap_t ? A->cap_t * 2 : 64;
    utensor *n = nf_arena_alloc(A->tmp, sizeof(utensor) * nc);
    if (!n) return oom(A);
    if (A->n_t) memcpy(n, A->t, sizeof(utensor) * A->n_t);
    A->t = n;
    A->cap_t = nc;
  }
  utensor *u = &A->t[A->n_t];
  memset(u, 0, sizeof *u);
  u->name = name;
  u->dtype = (uint8_t)dt;
  u->kind = (uint8_t)kind;
  u->rank = (uint8_t)rank;
  memcpy(u->shape, shape, sizeof(int64_t) * (size_t)rank);
  *id = A->n_t++;
  return NF_OK;
}

static int add_s(ad *A, const ustmt *s) {
  if (A->n_s == A->cap_s) {
    uint32_t nc = A->cap_s ? A->cap_s * 2 : 64;
    ustmt *n = nf_arena_alloc(A->tmp, sizeof(ustmt) * nc);
    if (!n) return oom(A);
    if (A->n_s) memcpy(n, A->s, sizeof(ustmt) * A->n_s);
    A->s = n;
    A->cap_s = nc;
  }
  A->s[A->n_s++] = *s;
  return NF_OK;
}

static int add_note(ad *A, const char *note) {
  if (!note) return oom(A);
  if (A->n_notes == A->cap_notes) {
    int nc = A->cap_notes ? A->cap_notes * 2 : 8;
    const char **n = nf_arena_alloc(nf_ir_ctx_arena(A->ctx), sizeof(char *) * (size_t)nc);
    if (!n) return oom(A);
    if (A->n_notes) memcpy(n, A->notes, sizeof(char *) * (size_t)A->n_notes);
    A->notes = n;
    A->cap_notes = nc;
  }
  A->notes[A->n_notes++] = note;
  return NF_OK;
}

/* ---- expression rewriting ---- */

/* Rebuilds e in A->ctx with tensor ids mapped through tmap (NULL: keep)
 * and variables replaced by vmap[v] (NULL: keep).  Memoised per call
 * through m. */
static const nf_expr *rewrite(ad *A, pmap *m, const nf_expr *e,
                              const uint32_t *tmap, const nf_expr *const *vmap,
                              int n_vmap) {
  const void *hit;
  if (pm_get(m, e, &hit)) return hit;
  const nf_expr *r = NULL;
  nf_ir_ctx *ctx = A->ctx;
  switch ((nf_op)e->op) {
    case NF_OP_CONST:
      r = nf_dtype_is_float((nf_dtype)e->dtype)
              ? nf_e_const_f(ctx, (nf_dtype)e->dtype, e->u.f)
              : nf_e_const_i(ctx, (nf_dtype)e->dtype, e->u.i);
      break;
    case NF_OP_VAR:
      if (vmap && (int)e->u.var < n_vmap && vmap[e->u.var])
        r = vmap[e->u.var];
      else
        r = nf_e_var(ctx, e->u.var);
      break;
    default: {
      const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
      for (int k = 0; k < e->n_args; k++) {
        args[k] = rewrite(A, m, e->args[k], tmap, vmap, n_vmap);
        if (!args[k]) return NULL;
      }
      if (e->op == NF_OP_ACCESS)
        r = nf_e_access(ctx, tmap ? tmap[e->u.tensor] : e->u.tensor,
                        (nf_dtype)e->dtype, e->n_args, args);
      else if (e->op == NF_OP_CAST)
        r = nf_e_cast(ctx, (nf_dtype)e->dtype, args[0]);
      else
        r = nf_e_rebuild(ctx, e, args);
    }
  }
  if (!r || pm_put(m, e, r)) return NULL;
  return r;
}

/* ---- symbolic differentiation ---- */

typedef struct dctx {
  ad *A;
  const nf_expr *n; /* the access node */
  pmap memo;        /* expr -> derivative (ZERO marker for zero) */
  pmap has;         /* expr -> (void*)1 / (void*)2 : contains n or not */
  int rc;
} dctx;

static const nf_expr ZERO_MARK; /* address used as "derivative is zero" */

static int contains(dctx *D, const nf_expr *e) {
  if (e == D->n) return 1;
  const void *hit;
  if (pm_get(&D->has, e, &hit)) return hit == (const void *)&D->has;
  int r = 0;
  if (e->op != NF_OP_ACCESS)
    for (int k = 0; k < e->n_args && !r; k++) r = contains(D, e->args[k]);
  if (pm_put(&D->has, e, r ? (const void *)&D->has : (const void *)&D->memo))
    D->rc = NF_ENOMEM;
  return r;
}

static const nf_expr *cf(dctx *D, nf_dtype t, double v) {
  return nf_e_const_f(D->A->ctx, t, v);
}

static int is_one(const nf_expr *e) {
  return e->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->dtype) && e->u.f == 1.0;
}

/* a * b, folding a factor 1 and writing x * (1 / y) as x / y. */
static int is_zero(const nf_expr *e) {
  return e->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->dtype) && e->u.f == 0.0;
}

static const nf_expr *mul_fold(nf_ir_ctx *ctx, const nf_expr *a, const nf_expr *b) {
  if (!a || !b) return NULL;
  if (is_one(a)) return b;
  if (is_one(b)) return a;
  /* c1 * (c2 * x) -> (c1 c2) * x: chain-rule constants fold into one
   * (rounded once to the dtype; within an ulp of the product). */
  if (a->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)a->dtype) &&
      b->op == NF_OP_MUL) {
    for (int k = 0; k < 2; k++) {
      const nf_expr *c = b->args[k];
      if (c->op == NF_OP_CONST && c->dtype == a->dtype)
        return mul_fold(ctx, nf_e_const_f(ctx, (nf_dtype)a->dtype, a->u.f * c->u.f),
                        b->args[1 - k]);
    }
  }
  if (b->op == NF_OP_CONST && a->op != NF_OP_CONST) return mul_fold(ctx, b, a);
  /* a * (c ? x : 0) is written c ? a * x : 0: a gradient is zero where a
   * mask or guard is false, and the multiply by 1 of a mask disappears. */
  if (b->op == NF_OP_SELECT && is_zero(b->args[2]))
    return nf_e_select(ctx, b->args[0], mul_fold(ctx, a, b->args[1]), b->args[2]);
  if (a->op == NF_OP_SELECT && is_zero(a->args[2]))
    return nf_e_select(ctx, a->args[0], mul_fold(ctx, a->args[1], b), a->args[2]);
  if (b->op == NF_OP_DIV && is_one(b->args[0]))
    return nf_e_binary(ctx, NF_OP_DIV, a, b->args[1]);
  if (a->op == NF_OP_DIV && is_one(a->args[0]))
    return nf_e_binary(ctx, NF_OP_DIV, b, a->args[1]);
  return nf_e_binary(ctx, NF_OP_MUL, a, b);
}

static const nf_expr *mul(dctx *D, const nf_expr *a, const nf_expr *b) {
  return mul_fold(D->A->ctx, a, b);
}

static const nf_expr *add(dctx *D, const nf_expr *a, const nf_expr *b) {
  if (!a) return b;
  if (!b) return a;
  return nf_e_binary(D->A->ctx, NF_OP_ADD, a, b);
}

static const nf_expr *sub(dctx *D, const nf_expr *a, const nf_expr *b) {
  if (!b) return a;
  if (!a) return nf_e_unary(D->A->ctx, NF_OP_NEG, b);
  return nf_e_binary(D->A->ctx, NF_OP_SUB, a, b);
}

static const nf_expr *deriv(dctx *D, const nf_expr *e);

/* Returns the derivative or NULL for zero; on error sets D->rc. */
static const nf_expr *deriv_calc(dctx *D, const nf_expr *e) {
  ad *A = D->A;
  nf_ir_ctx *ctx = A->ctx;
  nf_op op = (nf_op)e->op;
  nf_dtype t = (nf_dtype)e->dtype;
  if (e == D->n) return cf(D, t, 1.0);
  if (!contains(D, e)) return NULL;
  const nf_expr *a = e->n_args > 0 ? e->args[0] : NULL;
  const nf_expr *b = e->n_args > 1 ? e->args[1] : NULL;
  if (!nf_dtype_is_float(t)) {
    /* An integer or bool value that depends on the differentiated value:
     * comparisons have a zero derivative; anything else went through a
     * conversion to an integer, reported where it happens (CAST). */
    if (op >= NF_OP_LT && op <= NF_OP_OR) return NULL;
    if (op == NF_OP_NOT) return NULL;
    if (op == NF_OP_CAST && nf_dtype_is_float((nf_dtype)a->dtype)) {
      D->rc = fail(A, NF_EUNSUPPORTED,
                   "statement %d (%s): cannot differentiate through the "
                   "conversion of a float value to %s",
                   A->cur_stmt, A->g->tensors[A->g->stmts[A->cur_stmt].out].name,
                   nf_dtype_name(t));
      return NULL;
    }
    for (int k = 0; k < e->n_args; k++) (void)deriv(D, e->args[k]);
    return NULL;
  }
  const nf_expr *da = a ? deriv(D, a) : NULL, *db = b ? deriv(D, b) : NULL;
  if (D->rc) return NULL;
  switch (op) {
    case NF_OP_ADD: return add(D, da, db);
    case NF_OP_SUB: return sub(D, da, db);
    case NF_OP_NEG: return da ? nf_e_unary(ctx, NF_OP_NEG, da) : NULL;
    case NF_OP_MUL: return add(D, mul(D, da, b), mul(D, a, db));
    case NF_OP_DIV: {
      /* (da - (a / b) * db) / b */
      const nf_expr *num = sub(D, da, mul(D, e, db));
      return num ? nf_e_binary(ctx, NF_OP_DIV, num, b) : NULL;
    }
    case NF_OP_EXP: return mul(D, da, e);
    case NF_OP_LOG: return da ? nf_e_binary(ctx, NF_OP_DIV, da, a) : NULL;
    case NF_OP_SQRT:
      return da ? nf_e_binary(ctx, NF_OP_DIV, mul(D, da, cf(D, t, 0.5)), e) : NULL;
    case NF_OP_RSQRT:
      /* d a^-1/2 = -1/2 a^-3/2 = -1/2 * e / a */
      return da ? mul(D, da, nf_e_binary(ctx, NF_OP_DIV,
                                         mul(D, cf(D, t, -0.5), e), a))
                : NULL;
    case NF_OP_TANH:
      return mul(D, da, sub(D, cf(D, t, 1.0), mul(D, e, e)));
    case NF_OP_SIGMOID:
      return mul(D, da, mul(D, e, sub(D, cf(D, t, 1.0), e)));
    case NF_OP_ERF:
      /* 2/sqrt(pi) exp(-a^2) */
      return mul(D, da,
                 mul(D, cf(D, t, 1.1283791670955126),
                     nf_e_unary(ctx, NF_OP_EXP,
                                nf_e_unary(ctx, NF_OP_NEG, mul(D, a, a)))));
    case NF_OP_ABS: {
      if (!da) return NULL;
      const nf_expr *z = cf(D, t, 0.0);
      const nf_expr *sgn = nf_e_select(
          ctx, nf_e_binary(ctx, NF_OP_GT, a, z), cf(D, t, 1.0),
          nf_e_select(ctx, nf_e_binary(ctx, NF_OP_LT, a, z), cf(D, t, -1.0), z));
      return mul(D, da, sgn);
    }
    case NF_OP_FLOOR:
    case NF_OP_CEIL:
    case NF_OP_FLOORDIV:
      /* Piecewise constant: the derivative is zero (documented). */
      return NULL;
    case NF_OP_STOPGRAD:
      return NULL;
    case NF_OP_MOD:
      D->rc = fail(A, NF_EUNSUPPORTED,
                   "statement %d (%s): cannot differentiate '%%' of a "
                   "differentiated value",
                   A->cur_stmt, A->g->tensors[A->g->stmts[A->cur_stmt].out].name);
      return NULL;
    case NF_OP_POW: {
      /* da * b * a^(b-1) + db * log(a) * a^b */
      const nf_expr *r = NULL;
      if (da)
        r = mul(D, da, mul(D, b, nf_e_binary(ctx, NF_OP_POW, a,
                                             sub(D, b, cf(D, t, 1.0)))));
      if (db)
        r = add(D, r, mul(D, db, mul(D, nf_e_unary(ctx, NF_OP_LOG, a), e)));
      return r;
    }
    case NF_OP_MIN:
    case NF_OP_MAX: {
      /* Ties go to the second operand, as PyTorch's relu, relu6 and clamp
       * do: max(x, 0) has derivative 0 at x = 0, min(y, 6) 0 at y = 6. */
      if (!da && !db) return NULL;
      const nf_expr *c =
          nf_e_binary(ctx, op == NF_OP_MIN ? NF_OP_LT : NF_OP_GT, a, b);
      const nf_expr *z = cf(D, t, 0.0);
      return nf_e_select(ctx, c, da ? da : z, db ? db : z);
    }
    case NF_OP_SELECT: {
      const nf_expr *x = e->args[1], *y = e->args[2];
      const nf_expr *dx = deriv(D, x), *dy = deriv(D, y);
      if (D->rc || (!dx && !dy)) return NULL;
      const nf_expr *z = cf(D, t, 0.0);
      return nf_e_select(ctx, a, dx ? dx : z, dy ? dy : z);
    }
    case NF_OP_CAST:
      /* float -> float; from an integer the derivative is zero. */
      if (!nf_dtype_is_float((nf_dtype)a->dtype)) return NULL;
      return da ? nf_e_cast(ctx, t, da) : NULL;
    case NF_OP_ACCESS:
      return NULL; /* another access: indices carry no derivative */
    default:
      return NULL;
  }
}

static const nf_expr *deriv(dctx *D, const nf_expr *e) {
  if (D->rc) return NULL;
  const void *hit;
  if (pm_get(&D->memo, e, &hit)) return hit == &ZERO_MARK ? NULL : hit;
  const nf_expr *r = deriv_calc(D, e);
  if (D->rc) return NULL;
  if (!r && nf_ir_ctx_oom(D->A->ctx)) {
    D->rc = oom(D->A);
    return NULL;
  }
  if (pm_put(&D->memo, e, r ? (const void *)r : (const void *)&ZERO_MARK))
    D->rc = oom(D->A);
  return r;
}

/* ---- helpers ---- */

static void collect_accesses(const nf_expr *e, const nf_expr **list, int *n,
                             int max, pmap *seen, int in_index) {
  const void *hit;
  if (pm_get(seen, e, &hit)) return;
  if (pm_put(seen, e, e)) return;
  if (e->op == NF_OP_ACCESS) {
    if (!in_index && *n < max) list[(*n)++] = e;
    for (int k = 0; k < e->n_args; k++)
      collect_accesses(e->args[k], list, n, max, seen, 1);
    return;
  }
  for (int k = 0; k < e->n_args; k++)
    collect_accesses(e->args[k], list, n, max, seen, in_index);
}

static const nf_expr *access_all(ad *A, uint32_t id, int first_var) {
  const utensor *u = &A->t[id];
  const nf_expr *idx[NF_MAX_RANK];
  for (int k = 0; k < u->rank; k++) idx[k] = nf_e_var(A->ctx, (uint32_t)(first_var + k));
  return nf_e_access(A->ctx, id, (nf_dtype)u->dtype, u->rank, idx);
}

/* Sum of partial adjoints into a new tensor (or the single part). */
static int sum_parts(ad *A, part *p, uint32_t like, const char *name,
                     nf_tkind kind, const char *wrt, uint32_t *out) {
  const utensor *u = &A->t[like];
  if (p && !p->next && kind == NF_T_LOCAL) {
    *out = p->id;
    return NF_OK;
  }
  uint32_t id;
  int rc = add_t(A, name, (nf_dtype)u->dtype, kind, u->rank, u->shape, &id);
  if (rc) return rc;
  u = &A->t[like];
  const nf_expr *sum = NULL;
  for (; p; p = p->next) {
    const nf_expr *x = access_all(A, p->id, 0);
    sum = sum ? nf_e_binary(A->ctx, NF_OP_ADD, sum, x) : x;
  }
  if (!sum) sum = nf_e_const_f(A->ctx, (nf_dtype)u->dtype, 0.0);
  if (!sum) return oom(A);
  ustmt s;
  memset(&s, 0, sizeof s);
  s.s.out = id;
  s.s.rhs = sum;
  s.fwd = -1;
  s.wrt = wrt;
  for (int k = 0; k < u->rank; k++) s.s.var_names[k] = tstr(A, "i%d", k);
  if ((rc = add_s(A, &s))) return rc;
  *out = id;
  return NF_OK;
}

static int push_part(ad *A, uint32_t fwd_tensor, uint32_t id) {
  part *p = nf_arena_alloc(A->tmp, sizeof *p);
  if (!p) return oom(A);
  p->id = id;
  p->next = A->parts[fwd_tensor];
  A->parts[fwd_tensor] = p;
  return NF_OK;
}

/* The first point (in the reduction's lexicographic order) where a
 * max/min reduction attains its value: FA(i) min=! (f(v) == O(i) ? lin(r) :
 * BIG).  Returns the helper tensor id. */
static int argmax_helper(ad *A, const nf_stmt *fs, uint32_t o_id,
                         const nf_expr *rhs, uint32_t *out, const nf_expr **lin_out) {
  const utensor *o = &A->t[o_id];
  int rank = o->rank;
  nf_ir_ctx *ctx = A->ctx;
  const nf_expr *lin = nf_e_const_i(ctx, NF_I64, 0);
  int64_t stride = 1;
  for (int r = fs->n_red - 1; r >= 0; r--) {
    const nf_expr *v = nf_e_var(ctx, (uint32_t)(rank + r));
    const nf_expr *rel = nf_e_binary(ctx, NF_OP_SUB, v, nf_e_const_i(ctx, NF_I64, fs->red_lo[r]));
    lin = nf_e_binary(ctx, NF_OP_ADD, lin,
                      nf_e_binary(ctx, NF_OP_MUL, rel, nf_e_const_i(ctx, NF_I64, stride)));
    if (__builtin_mul_overflow(stride, fs->red_ext[r] > 0 ? fs->red_ext[r] : 1, &stride))
      return fail(A, NF_EOVERFLOW, "statement %d: reduction box too large", A->cur_stmt);
  }
  const nf_expr *cond = nf_e_binary(ctx, NF_OP_EQ, rhs, access_all(A, o_id, 0));
  const nf_expr *body = nf_e_select(ctx, cond, lin, nf_e_const_i(ctx, NF_I64, stride));
  uint32_t id;
  int rc = add_t(A, tstr(A, "%s_argfirst", A->t[o_id].name), NF_I64, NF_T_LOCAL,
                 rank, A->t[o_id].shape, &id);
  if (rc) return rc;
  ustmt s;
  memset(&s, 0, sizeof s);
  s.s = *fs;
  s.s.out = id;
  s.s.red = NF_RED_MIN;
  s.s.flags = 0;
  s.s.rhs = body;
  s.fwd = A->cur_stmt;
  s.wrt = A->t[o_id].name;
  if (!s.s.rhs) return oom(A);
  if ((rc = add_s(A, &s))) return rc;
  *out = id;
  *lin_out = lin;
  return NF_OK;
}

/* ---- hoisting factors out of a reduction ----
 * A contribution sum_t G(y, t) whose G is a product of factors some of
 * which do not depend on t is computed as A(y) * sum_t B(y, t): the
 * t-independent factors are applied once per element after the
 * reduction instead of at every point. */

typedef struct factors {
  const nf_expr *num[32], *den[32];
  int n_num, n_den, neg, overflow;
} factors;

static void flatten(const nf_expr *e, int den, factors *f) {
  if (e->op == NF_OP_MUL) {
    flatten(e->args[0], den, f);
    flatten(e->args[1], den, f);
    return;
  }
  if (e->op == NF_OP_DIV) {
    flatten(e->args[0], den, f);
    flatten(e->args[1], !den, f);
    return;
  }
  if (e->op == NF_OP_NEG) {
    f->neg = !f->neg;
    flatten(e->args[0], den, f);
    return;
  }
  if (is_one(e)) return;
  if (den) {
    if (f->n_den < 32)
      f->den[f->n_den++] = e;
    else
      f->overflow = 1;
  } else {
    if (f->n_num < 32)
      f->num[f->n_num++] = e;
    else
      f->overflow = 1;
  }
}

typedef struct varscan {
  uint32_t first;
  int found;
} varscan;

static void scan_var(const nf_expr *e, void *user) {
  varscan *v = user;
  if (e->op == NF_OP_VAR && e->u.var >= v->first) v->found = 1;
}

static int uses_t(const nf_expr *e, int d) {
  varscan v = {(uint32_t)d, 0};
  if (nf_expr_visit(e, scan_var, &v)) return 1; /* out of memory: don't hoist */
  return v.found;
}

/* Whether every access in e is in bounds for every y in its box (e does
 * not depend on t): only such factors may be evaluated for all y after
 * the reduction, where the inversion's guard no longer protects them. */
typedef struct safescan {
  const ad *A;
  const nf_range *ry;
  int d, ok;
} safescan;

static void scan_safe(const nf_expr *e, void *user) {
  safescan *s = user;
  if (e->op != NF_OP_ACCESS || !s->ok) return;
  const utensor *u = &s->A->t[e->u.tensor];
  for (int k = 0; k < e->n_args; k++) {
    nf_range b;
    if (!nf_expr_bounds(e->args[k], s->ry, s->d, &b) || b.lo < 0 || b.hi >= u->shape[k]) {
      s->ok = 0;
      return;
    }
  }
}

static int safe_for_all_y(const ad *A, const nf_expr *e, const nf_range *ry, int d) {
  safescan s = {A, ry, d, 1};
  if (nf_expr_visit(e, scan_safe, &s)) return 0;
  return s.ok;
}

static const nf_expr *product(nf_ir_ctx *ctx, const nf_expr *const *num, int n_num,
                              const nf_expr *const *den, int n_den, nf_dtype t) {
  const nf_expr *r = NULL;
  for (int k = 0; k < n_num; k++) r = r ? nf_e_binary(ctx, NF_OP_MUL, r, num[k]) : num[k];
  if (!r) r = nf_e_const_f(ctx, t, 1.0);
  for (int k = 0; k < n_den; k++) r = nf_e_binary(ctx, NF_OP_DIV, r, den[k]);
  return r;
}

static int reads_tensor(const nf_expr *e) {
  if (e->op == NF_OP_ACCESS) return 1;
  for (int k = 0; k < e->n_args; k++)
    if (reads_tensor(e->args[k])) return 1;
  return 0;
}

/* Emits the contribution of one access node to its tensor's adjoint. */
static int contribute(ad *A, const nf_stmt *fs, uint32_t o_id, uint32_t do_id,
                      const nf_expr *rhs, const nf_expr *acc, const nf_expr *P,
                      const nf_expr *mask_cond) {
  nf_ir_ctx *ctx = A->ctx;
  const utensor *o = &A->t[o_id];
  int rank = o->rank, n_vars = rank + fs->n_red;
  uint32_t x_id = acc->u.tensor;
  const utensor *x = &A->t[x_id];
  nf_dtype dt = (nf_dtype)x->dtype;
  const nf_expr *G = P;
  /* dO(i) */
  const nf_expr *dO = access_all(A, do_id, 0);
  if (!dO) return oom(A);
  if (fs->red == NF_RED_PROD) {
    /* d prod / d f(v) = O(i) / f(v) (not defined where f(v) == 0). */
    G = nf_e_binary(ctx, NF_OP_MUL, G,
                    nf_e_binary(ctx, NF_OP_DIV, access_all(A, o_id, 0), rhs));
  }
  /* Where the statement has no reduction its output O(i) is the right
   * side's value: reuse it instead of recomputing (exp, tanh, sigmoid and
   * divisions refer to their own value). */
  if (fs->red == NF_RED_NONE) {
    pmap m = NF_PTRMAP_INIT;
    const nf_expr *self = access_all(A, o_id, 0);
    if (!self || pm_put(&m, rhs, self)) {
      pm_free(&m);
      return oom(A);
    }
    G = rewrite(A, &m, G, NULL, NULL, 0);
    pm_free(&m);
    if (!G) return oom(A);
  }
  G = is_one(G) ? dO : mul_fold(ctx, dO, G);
  if (G && G->dtype != dt) G = nf_e_cast(ctx, dt, G);
  if (!G) return oom(A);

  /* Invert the index map. */
  nf_range box[NF_MAX_VARS];
  const char *names[NF_MAX_VARS];
  for (int v = 0; v < n_vars; v++) {
    if (v < rank) {
      box[v].lo = 0;
      box[v].hi = o->shape[v] - 1;
    } else {
      box[v].lo = fs->red_lo[v - rank];
      box[v].hi = fs->red_lo[v - rank] + fs->red_ext[v - rank] - 1;
    }
    names[v] = fs->var_names[v];
  }
  nf_inversion inv;
  memset(&inv, 0, sizeof inv);
  nf_buf why = NF_BUF_INIT;
  int rc = nf__invert(ctx, n_vars, box, names, x->rank, acc->args, x->shape, &inv, &why);
  ustmt s;
  memset(&s, 0, sizeof s);
  s.fwd = A->cur_stmt;
  s.wrt = x->name;
  const nf_expr *body;
  const nf_expr *hoist = NULL; /* factor applied after the reduction */
  int d = x->rank;
  /* Equalities y_k == e_k(v) for dimensions whose index reads a tensor
   * (a gather): the other dimensions are inverted and these stay as data
   * dependent guards; the statement is then flagged as a scatter. */
  const nf_expr *data_eq = NULL;
  if (rc == NF_EUNSUPPORTED) {
    int sel[NF_MAX_RANK], nsel = 0;
    for (int k = 0; k < d; k++)
      if (!reads_tensor(acc->args[k])) sel[nsel++] = k;
    if (nsel < d) {
      const nf_expr *sidx[NF_MAX_RANK];
      int64_t sshape[NF_MAX_RANK];
      for (int j = 0; j < nsel; j++) {
        sidx[j] = acc->args[sel[j]];
        sshape[j] = x->shape[sel[j]];
      }
      nf_inversion sub;
      memset(&sub, 0, sizeof sub);
      nf_buf why2 = NF_BUF_INIT;
      int rc2 = nf__invert(ctx, n_vars, box, names, nsel, sidx, sshape, &sub, &why2);
      nf_buf_free(&why2);
      if (rc2 == NF_OK && d + sub.n_t <= NF_MAX_VARS) {
        /* renumber: y_j of the sub-access is y_{sel[j]}, t_l is VAR d + l */
        const nf_expr *vm[NF_MAX_VARS];
        for (int j = 0; j < nsel; j++) vm[j] = nf_e_var(ctx, (uint32_t)sel[j]);
        for (int l = 0; l < sub.n_t; l++) vm[nsel + l] = nf_e_var(ctx, (uint32_t)(d + l));
        pmap m = NF_PTRMAP_INIT;
        inv = sub;
        for (int v = 0; v < n_vars && !rc2; v++) {
          inv.v[v] = rewrite(A, &m, sub.v[v], NULL, vm, nsel + sub.n_t);
          if (!inv.v[v]) rc2 = NF_ENOMEM;
        }
        if (!rc2 && sub.guard) {
          inv.guard = rewrite(A, &m, sub.guard, NULL, vm, nsel + sub.n_t);
          if (!inv.guard) rc2 = NF_ENOMEM;
        }
        pm_free(&m);
        for (int k = 0; k < d && !rc2; k++) {
          if (!reads_tensor(acc->args[k])) continue;
          pmap m2 = NF_PTRMAP_INIT;
          const nf_expr *ek = rewrite(A, &m2, acc->args[k], NULL, inv.v, n_vars);
          pm_free(&m2);
          const nf_expr *eq = ek ? nf_e_binary(ctx, NF_OP_EQ, ek, nf_e_var(ctx, (uint32_t)k)) : NULL;
          if (!eq) rc2 = NF_ENOMEM;
          data_eq = data_eq ? nf_e_binary(ctx, NF_OP_AND, data_eq, eq) : eq;
        }
        if (rc2) {
          nf_buf_free(&why);
          return oom(A);
        }
        rc = NF_OK;
        s.s.flags = NF_STMT_SCATTER;
        s.scatter = 1;
        s.why = tstr(A, "%s", nf_buf_str(&why));
      }
    }
  }
  if (rc == NF_OK) {
    if (d + inv.n_t > NF_MAX_VARS) {
      nf_buf_free(&why);
      return fail(A, NF_ELIMIT, "statement %d: gradient needs too many variables", A->cur_stmt);
    }
    pmap m = NF_PTRMAP_INIT;
    const nf_expr *g2 = rewrite(A, &m, G, NULL, inv.v, n_vars);
    const nf_expr *mc = mask_cond ? rewrite(A, &m, mask_cond, NULL, inv.v, n_vars) : NULL;
    pm_free(&m);
    if (!g2 || (mask_cond && !mc)) {
      nf_buf_free(&why);
      return oom(A);
    }
    /* The mask reads a tensor at indices that are only in range where the
     * inversion's guard holds, and `&&` is not lazy: nest the selects. */
    const nf_expr *guard = inv.guard, *inner = mc;
    if (data_eq) inner = inner ? nf_e_binary(ctx, NF_OP_AND, data_eq, inner) : data_eq;
    if (inv.n_t > 0 && g2) {
      factors f;
      memset(&f, 0, sizeof f);
      flatten(g2, 0, &f);
      const nf_expr *vn[32], *vd[32], *in_[32], *id_[32];
      int nvn = 0, nvd = 0, nin = 0, nid = 0;
      nf_range ry[NF_MAX_RANK];
      for (int k = 0; k < d; k++) {
        ry[k].lo = 0;
        ry[k].hi = x->shape[k] - 1;
      }
      for (int k = 0; k < f.n_num; k++) {
        if (uses_t(f.num[k], d) || !safe_for_all_y(A, f.num[k], ry, d)) vn[nvn++] = f.num[k];
        else in_[nin++] = f.num[k];
      }
      for (int k = 0; k < f.n_den; k++) {
        if (uses_t(f.den[k], d) || !safe_for_all_y(A, f.den[k], ry, d)) vd[nvd++] = f.den[k];
        else id_[nid++] = f.den[k];
      }
      if (!f.overflow && (nin + nid > 0 || f.neg) && nvn + nvd > 0) {
        g2 = product(ctx, vn, nvn, vd, nvd, dt);
        hoist = product(ctx, in_, nin, id_, nid, dt);
        if (hoist && f.neg) hoist = nf_e_unary(ctx, NF_OP_NEG, hoist);
        if (!g2 || !hoist) {
          nf_buf_free(&why);
          return oom(A);
        }
      }
    }
    body = inner ? nf_e_select(ctx, inner, g2, nf_e_const_f(ctx, dt, 0.0)) : g2;
    if (body && guard) body = nf_e_select(ctx, guard, body, nf_e_const_f(ctx, dt, 0.0));
    s.s.n_red = (uint8_t)inv.n_t;
    s.s.red = inv.n_t ? NF_RED_SUM : NF_RED_NONE;
    for (int l = 0; l < inv.n_t; l++) {
      s.s.red_lo[l] = 0;
      s.s.red_ext[l] = inv.t_ext[l];
      s.s.var_names[d + l] = inv.t_names[l] ? inv.t_names[l] : tstr(A, "t%d", l);
    }
  } else if (rc == NF_EUNSUPPORTED) {
    /* Scatter form: every forward point, guarded by e(v) == y. */
    if (d + n_vars > NF_MAX_VARS) {
      rc = fail(A, NF_ELIMIT,
                "statement %d (%s): the scatter form of the gradient of %s needs "
                "%d variables (at most %d): %s",
                A->cur_stmt, o->name, x->name, d + n_vars, NF_MAX_VARS, nf_buf_str(&why));
      nf_buf_free(&why);
      return rc;
    }
    const nf_expr *vmap[NF_MAX_VARS];
    for (int v = 0; v < n_vars; v++) vmap[v] = nf_e_var(ctx, (uint32_t)(d + v));
    pmap m = NF_PTRMAP_INIT;
    const nf_expr *g2 = rewrite(A, &m, G, NULL, vmap, n_vars);
    const nf_expr *guard = mask_cond ? rewrite(A, &m, mask_cond, NULL, vmap, n_vars) : NULL;
    for (int k = 0; k < d && g2; k++) {
      const nf_expr *ek = rewrite(A, &m, acc->args[k], NULL, vmap, n_vars);
      const nf_expr *eq = ek ? nf_e_binary(ctx, NF_OP_EQ, ek, nf_e_var(ctx, (uint32_t)k)) : NULL;
      guard = guard ? nf_e_binary(ctx, NF_OP_AND, guard, eq) : eq;
    }
    pm_free(&m);
    if (!g2 || (d > 0 && !guard)) {
      nf_buf_free(&why);
      return oom(A);
    }
    body = guard ? nf_e_select(ctx, guard, g2, nf_e_const_f(ctx, dt, 0.0)) : g2;
    s.s.n_red = (uint8_t)n_vars;
    s.s.red = n_vars ? NF_RED_SUM : NF_RED_NONE;
    for (int v = 0; v < n_vars; v++) {
      s.s.red_lo[v] = box[v].lo;
      s.s.red_ext[v] = box[v].hi - box[v].lo + 1;
      s.s.var_names[d + v] = names[v];
    }
    s.s.flags = NF_STMT_SCATTER;
    s.scatter = 1;
    s.why = tstr(A, "%s", nf_buf_str(&why));
  } else {
    rc = fail(A, rc, "statement %d (%s): inverting the access to %s: %s", A->cur_stmt,
              o->name, x->name, nf_buf_str(&why));
    nf_buf_free(&why);
    return rc;
  }
  nf_buf_free(&why);
  if (!body) return oom(A);
  /* Simplify with the new variables' ranges. */
  nf_range rr[NF_MAX_VARS];
  int nv = d + s.s.n_red;
  for (int k = 0; k < d; k++) {
    rr[k].lo = 0;
    rr[k].hi = x->shape[k] - 1;
  }
  for (int l = 0; l < s.s.n_red; l++) {
    rr[d + l].lo = s.s.red_lo[l];
    rr[d + l].hi = s.s.red_lo[l] + s.s.red_ext[l] - 1;
  }
  int empty = 0;
  for (int k = 0; k < nv; k++)
    if (rr[k].hi < rr[k].lo) empty = 1;
  body = nf_simplify(ctx, body, empty ? NULL : rr, empty ? 0 : nv);
  if (!body) return oom(A);
  for (int k = 0; k < d; k++) s.s.var_names[k] = tstr(A, "y%d", k);
  uint32_t id;
  int n_parts = 0;
  for (part *p = A->parts[x_id]; p; p = p->next) n_parts++;
  rc = add_t(A, tstr(A, hoist ? "d%s_%d_sum" : "d%s_%d", x->name, n_parts), dt, NF_T_LOCAL,
             x->rank, x->shape, &id);
  if (rc) return rc;
  x = &A->t[x_id];
  s.s.out = id;
  s.s.rhs = body;
  if ((rc = add_s(A, &s))) return rc;
  if (hoist) {
    /* contribution(y) = hoist(y) * sum(y) */
    uint32_t id2;
    rc = add_t(A, tstr(A, "d%s_%d", x->name, n_parts), dt, NF_T_LOCAL, x->rank, x->shape, &id2);
    if (rc) return rc;
    x = &A->t[x_id];
    ustmt s2;
    memset(&s2, 0, sizeof s2);
    s2.fwd = A->cur_stmt;
    s2.wrt = x->name;
    s2.s.out = id2;
    s2.s.rhs = nf_simplify(ctx, mul_fold(ctx, hoist, access_all(A, id, 0)), rr, d);
    if (!s2.s.rhs) return oom(A);
    for (int k = 0; k < d; k++) s2.s.var_names[k] = s.s.var_names[k];
    if ((rc = add_s(A, &s2))) return rc;
    id = id2;
  }
  return push_part(A, x_id, id);
}

/* Differentiates forward statement k. */
static int diff_stmt(ad *A, uint32_t k) {
  const nf_graph *g = A->g;
  const nf_stmt *fs0 = &g->stmts[k];
  uint32_t o_id = fs0->out;
  if (!A->carries[o_id]) return NF_OK;
  A->cur_stmt = (int)k;
  /* The statement as copied (rhs in our context). */
  /* The forward statements were copied first, in order. */
  if (k >= A->n_s || !A->s[k].is_forward || A->s[k].fwd != (int32_t)k)
    return fail(A, NF_EINTERNAL, "internal: statement %u not copied", k);
  /* a copy: adding statements below may move A->s */
  const nf_stmt fs_copy = A->s[k].s;
  const nf_stmt *fs = &fs_copy;
  /* Adjoint of the output. */
  part *parts = A->parts[o_id];
  if (A->seed[o_id] != UINT32_MAX) {
    part *p = nf_arena_alloc(A->tmp, sizeof *p);
    if (!p) return oom(A);
    p->id = A->seed[o_id];
    p->next = parts;
    parts = p;
  }
  if (!parts) return NF_OK; /* nothing flows back */
  /* A statement with an empty iteration box contributes nothing. */
  if (nf_tensor_numel(&g->tensors[o_id]) == 0) return NF_OK;
  for (int r = 0; r < fs0->n_red; r++)
    if (fs0->red_ext[r] == 0) return NF_OK;
  uint32_t do_id;
  int rc = sum_parts(A, parts, o_id, tstr(A, "d%s", A->t[o_id].name), NF_T_LOCAL,
                     A->t[o_id].name, &do_id);
  if (rc) return rc;
  /* Accesses to tensors that carry adjoints. */
  const nf_expr *accs[256];
  int n_acc = 0;
  pmap seen = NF_PTRMAP_INIT;
  collect_accesses(fs->rhs, accs, &n_acc, 256, &seen, 0);
  pm_free(&seen);
  if (n_acc >= 256)
    return fail(A, NF_ELIMIT, "statement %u: more than 255 distinct accesses", k);
  const nf_expr *mask_cond = NULL;
  int have_mask = 0;
  for (int a = 0; a < n_acc; a++) {
    uint32_t x = accs[a]->u.tensor;
    if (x >= g->n_tensors || !A->carries[x]) continue;
    dctx D = {.A = A, .n = accs[a]};
    const nf_expr *P = deriv(&D, fs->rhs);
    pm_free(&D.memo);
    pm_free(&D.has);
    if (D.rc) return D.rc;
    if (!P) continue;
    if ((fs->red == NF_RED_MAX || fs->red == NF_RED_MIN) && !have_mask) {
      have_mask = 1;
      if (fs->n_red > 0) {
        uint32_t fa = 0;
        const nf_expr *lin = NULL;
        if ((rc = argmax_helper(A, fs, o_id, fs->rhs, &fa, &lin))) return rc;
        mask_cond = nf_e_binary(A->ctx, NF_OP_EQ, lin, access_all(A, fa, 0));
        if (!mask_cond) return oom(A);
      }
    }
    if ((rc = contribute(A, fs, o_id, do_id, fs->rhs, accs[a], P, mask_cond))) return rc;
  }
  return NF_OK;
}

/* Whether e converts a float value that depends on a requested input to
 * an integer, outside comparisons (whose derivative is zero) and indices. */
static int depends_on(const nf_expr *e, const char *dep, int depth) {
  if (depth > 4000) return 1;
  if (e->op == NF_OP_ACCESS) return dep[e->u.tensor] != 0;
  for (int k = 0; k < e->n_args; k++)
    if (depends_on(e->args[k], dep, depth + 1)) return 1;
  return 0;
}

static int int_conversion(const nf_expr *e, const char *dep, int depth) {
  if (depth > 4000) return 0;
  nf_op op = (nf_op)e->op;
  if (op == NF_OP_ACCESS || (op >= NF_OP_LT && op <= NF_OP_NE)) return 0;
  if (op == NF_OP_CAST && !nf_dtype_is_float((nf_dtype)e->dtype) &&
      nf_dtype_is_float((nf_dtype)e->args[0]->dtype))
    return depends_on(e->args[0], dep, depth + 1);
  if (op == NF_OP_SELECT) /* the condition has no derivative */
    return int_conversion(e->args[1], dep, depth + 1) ||
           int_conversion(e->args[2], dep, depth + 1);
  for (int k = 0; k < e->n_args; k++)
    if (int_conversion(e->args[k], dep, depth + 1)) return 1;
  return 0;
}

/* ---- public entry ---- */

int nf_grad_graph(const nf_graph *g, const nf_grad_opts *o, nf_ir_ctx *ctx,
            nf_graph **out, nf_grad_report *rep, nf_buf *err) {
  int rc = nf_graph_validate(g, err);
  if (rc) return rc;
  ad A;
  memset(&A, 0, sizeof A);
  A.g = g;
  A.ctx = ctx;
  A.err = err;
  A.tmp = nf_arena_new();
  if (!A.tmp) return NF_ENOMEM;
  uint32_t nt = g->n_tensors;
  A.parts = nf_arena_alloc(A.tmp, sizeof(part *) * (nt + 1));
  A.seed = nf_arena_alloc(A.tmp, sizeof(uint32_t) * (nt + 1));
  A.carries = nf_arena_alloc(A.tmp, nt + 1);
  char *dep = nf_arena_alloc(A.tmp, nt + 1), *reach = nf_arena_alloc(A.tmp, nt + 1);
  uint32_t *wrt_ids = nf_arena_alloc(A.tmp, sizeof(uint32_t) * ((size_t)o->n_wrt + 1));
  if (!A.parts || !A.seed || !A.carries || !dep || !reach || !wrt_ids) {
    rc = oom(&A);
    goto done;
  }
  for (uint32_t t = 0; t < nt; t++) A.seed[t] = UINT32_MAX;
  /* The requested inputs. */
  for (int w = 0; w < o->n_wrt; w++) {
    int found = -1;
    for (uint32_t k = 0; k < g->n_inputs; k++)
      if (g->tensors[g->inputs[k]].name && strcmp(g->tensors[g->inputs[k]].name, o->wrt[w]) == 0)
        found = (int)g->inputs[k];
    if (found < 0) {
      rc = fail(&A, NF_EINVAL, "'%s' is not an input of %s", o->wrt[w],
                g->name ? g->name : "the graph");
      goto done;
    }
    if (!nf_dtype_is_float((nf_dtype)g->tensors[found].dtype)) {
      rc = fail(&A, NF_EINVAL, "cannot differentiate with respect to '%s': it is %s, not a float tensor",
                o->wrt[w], nf_dtype_name((nf_dtype)g->tensors[found].dtype));
      goto done;
    }
    for (int j = 0; j < w; j++)
      if (wrt_ids[j] == (uint32_t)found) {
        rc = fail(&A, NF_EINVAL, "'%s' is asked for twice", o->wrt[w]);
        goto done;
      }
    wrt_ids[w] = (uint32_t)found;
    dep[found] = 1;
  }
  /* 1. Dependence and reachability. */
  for (uint32_t k = 0; k < g->n_stmts; k++) {
    const nf_expr *accs[256];
    int n_acc = 0;
    pmap seen = NF_PTRMAP_INIT;
    collect_accesses(g->stmts[k].rhs, accs, &n_acc, 256, &seen, 0);
    pm_free(&seen);
    for (int a = 0; a < n_acc; a++)
      if (dep[accs[a]->u.tensor]) dep[g->stmts[k].out] = 1;
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) reach[g->outputs[k]] = 1;
  for (uint32_t k = g->n_stmts; k-- > 0;) {
    if (!reach[g->stmts[k].out]) continue;
    const nf_expr *accs[256];
    int n_acc = 0;
    pmap seen = NF_PTRMAP_INIT;
    collect_accesses(g->stmts[k].rhs, accs, &n_acc, 256, &seen, 0);
    pm_free(&seen);
    for (int a = 0; a < n_acc; a++) reach[accs[a]->u.tensor] = 1;
  }
  for (uint32_t t = 0; t < nt; t++)
    A.carries[t] = dep[t] && reach[t] && nf_dtype_is_float((nf_dtype)g->tensors[t].dtype);
  /* An integer tensor computed from a differentiated float value (other
   * than through comparisons) that some output depends on: the gradient
   * would silently lose that path, so it is an error, as it is within one
   * statement. */
  for (uint32_t k = 0; k < g->n_stmts; k++) {
    uint32_t t = g->stmts[k].out;
    if (nf_dtype_is_float((nf_dtype)g->tensors[t].dtype) || !dep[t] || !reach[t]) continue;
    if (int_conversion(g->stmts[k].rhs, dep, 0)) {
      rc = fail(&A, NF_EUNSUPPORTED,
                "statement %u (%s): cannot differentiate through the conversion of "
                "a float value to %s",
                k, g->tensors[t].name ? g->tensors[t].name : "?",
                nf_dtype_name((nf_dtype)g->tensors[t].dtype));
      goto done;
    }
  }
  /* 2. The forward tensors and statements. */
  for (uint32_t t = 0; t < nt; t++) {
    const nf_tensor *ft = &g->tensors[t];
    nf_tkind kind = (nf_tkind)ft->kind;
    if (kind == NF_T_OUTPUT && !o->keep_outputs) kind = NF_T_LOCAL;
    uint32_t id;
    const char *name = nf_arena_strdup(nf_ir_ctx_arena(ctx), ft->name ? ft->name : "t");
    if (!name) {
      rc = oom(&A);
      goto done;
    }
    if ((rc = add_t(&A, name, (nf_dtype)ft->dtype, kind, ft->rank, ft->shape, &id))) goto done;
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const nf_tensor *ft = &g->tensors[g->outputs[k]];
    uint32_t id;
    if ((rc = add_t(&A, tstr(&A, "d%s", ft->name ? ft->name : "out"), (nf_dtype)ft->dtype,
                    NF_T_INPUT, ft->rank, ft->shape, &id)))
      goto done;
    if (nf_dtype_is_float((nf_dtype)ft->dtype)) A.seed[g->outputs[k]] = id;
  }
  for (uint32_t k = 0; k < g->n_stmts; k++) {
    pmap m = NF_PTRMAP_INIT;
    ustmt s;
    memset(&s, 0, sizeof s);
    s.s = g->stmts[k];
    s.s.rhs = rewrite(&A, &m, g->stmts[k].rhs, NULL, NULL, 0);
    pm_free(&m);
    if (!s.s.rhs) {
      rc = oom(&A);
      goto done;
    }
    for (int v = 0; v < NF_MAX_VARS; v++)
      if (s.s.var_names[v])
        s.s.var_names[v] = nf_arena_strdup(nf_ir_ctx_arena(ctx), s.s.var_names[v]);
    s.fwd = (int32_t)k;
    s.is_forward = 1;
    if ((rc = add_s(&A, &s))) goto done;
  }
  /* 3. Reverse sweep. */
  for (uint32_t k = g->n_stmts; k-- > 0;)
    if ((rc = diff_stmt(&A, k))) goto done;
  /* 4. The gradients. */
  uint32_t *grad_ids = nf_arena_alloc(A.tmp, sizeof(uint32_t) * ((size_t)o->n_wrt + 1));
  if (!grad_ids) {
    rc = oom(&A);
    goto done;
  }
  for (int w = 0; w < o->n_wrt; w++) {
    uint32_t x = wrt_ids[w];
    if (!A.parts[x]) {
      if ((rc = add_note(&A, tstr(&A, "the gradient of %s is zero: no output depends on it",
                                  o->wrt[w]))))
        goto done;
    }
    if ((rc = sum_parts(&A, A.parts[x], x, tstr(&A, "grad_%s", o->wrt[w]), NF_T_OUTPUT,
                        o->wrt[w], &grad_ids[w])))
      goto done;
  }
  /* 5. Liveness, then emission. */
  char *live_t = nf_arena_alloc(A.tmp, A.n_t + 1), *live_s = nf_arena_alloc(A.tmp, A.n_s + 1);
  uint32_t *tmap = nf_arena_alloc(A.tmp, sizeof(uint32_t) * (A.n_t + 1));
  if (!live_t || !live_s || !tmap) {
    rc = oom(&A);
    goto done;
  }
  for (uint32_t t = 0; t < A.n_t; t++)
    if (A.t[t].kind == NF_T_OUTPUT) live_t[t] = 1;
  for (uint32_t k = A.n_s; k-- > 0;) {
    if (!live_t[A.s[k].s.out]) continue;
    live_s[k] = 1;
    const nf_expr *accs[256];
    int n_acc = 0;
    pmap seen = NF_PTRMAP_INIT;
    collect_accesses(A.s[k].s.rhs, accs, &n_acc, 256, &seen, 0);
    /* accesses inside indices were skipped by collect_accesses; walk the
     * seen set for them */
    const void *key;
    for (size_t i = 0; nf_ptrmap_next(&seen, &i, &key, NULL);)
      if (((const nf_expr *)key)->op == NF_OP_ACCESS)
        live_t[((const nf_expr *)key)->u.tensor] = 1;
    pm_free(&seen);
  }
  nf_graph *ng = nf_graph_new(ctx, tstr(&A, "%s_grad", g->name ? g->name : "graph"));
  if (!ng) {
    rc = oom(&A);
    goto done;
  }
  for (uint32_t t = 0; t < A.n_t; t++) tmap[t] = UINT32_MAX;
  /* inputs (forward order, then seeds), outputs in the documented order,
   * then locals in statement order */
  for (uint32_t t = 0; t < A.n_t; t++) {
    if (A.t[t].kind != NF_T_INPUT) continue;
    int id = nf_graph_add_tensor(ng, A.t[t].name, (nf_dtype)A.t[t].dtype, NF_T_INPUT,
                                 A.t[t].rank, A.t[t].shape);
    if (id < 0) {
      rc = id;
      goto done;
    }
    tmap[t] = (uint32_t)id;
  }
  if (o->keep_outputs)
    for (uint32_t k = 0; k < g->n_outputs; k++) {
      uint32_t t = g->outputs[k];
      int id = nf_graph_add_tensor(ng, A.t[t].name, (nf_dtype)A.t[t].dtype, NF_T_OUTPUT,
                                   A.t[t].rank, A.t[t].shape);
      if (id < 0) {
        rc = id;
        goto done;
      }
      tmap[t] = (uint32_t)id;
    }
  for (int w = 0; w < o->n_wrt; w++) {
    uint32_t t = grad_ids[w];
    if (tmap[t] != UINT32_MAX) {
      rc = fail(&A, NF_EINTERNAL, "internal: gradient tensor shared");
      goto done;
    }
    int id = nf_graph_add_tensor(ng, A.t[t].name, (nf_dtype)A.t[t].dtype, NF_T_OUTPUT,
                                 A.t[t].rank, A.t[t].shape);
    if (id < 0) {
      rc = id;
      goto done;
    }
    tmap[t] = (uint32_t)id;
  }
  for (uint32_t k = 0; k < A.n_s; k++) {
    if (!live_s[k]) continue;
    uint32_t t = A.s[k].s.out;
    if (tmap[t] != UINT32_MAX) continue;
    int id = nf_graph_add_tensor(ng, A.t[t].name, (nf_dtype)A.t[t].dtype, NF_T_LOCAL,
                                 A.t[t].rank, A.t[t].shape);
    if (id < 0) {
      rc = id;
      goto done;
    }
    tmap[t] = (uint32_t)id;
  }
  int n_items = 0;
  nf_grad_item *items = nf_arena_alloc(nf_ir_ctx_arena(ctx), sizeof(nf_grad_item) * (A.n_s + 1));
  if (!items) {
    rc = oom(&A);
    goto done;
  }
  for (uint32_t k = 0; k < A.n_s; k++) {
    if (!live_s[k]) continue;
    nf_stmt s = A.s[k].s;
    pmap m = NF_PTRMAP_INIT;
    s.rhs = rewrite(&A, &m, s.rhs, tmap, NULL, 0);
    pm_free(&m);
    if (!s.rhs) {
      rc = oom(&A);
      goto done;
    }
    s.out = tmap[s.out];
    if ((rc = nf_graph_add_stmt(ng, &s))) goto done;
    if (!A.s[k].is_forward) {
      nf_grad_item *it = &items[n_items++];
      it->stmt = ng->n_stmts - 1;
      it->fwd_stmt = A.s[k].fwd;
      it->wrt = A.s[k].wrt;
      it->flops = nf_stmt_flops(ng, it->stmt);
      it->fwd_flops = A.s[k].fwd >= 0 ? nf_stmt_flops(g, (uint32_t)A.s[k].fwd) : 0;
      it->scatter = A.s[k].scatter;
      it->why = A.s[k].why;
    }
  }
  nf_buf verr = NF_BUF_INIT;
  if ((rc = nf_graph_validate(ng, &verr))) {
    fail(&A, NF_EINTERNAL, "internal error: the gradient graph is invalid: %s", nf_buf_str(&verr));
    nf_buf_free(&verr);
    rc = NF_EINTERNAL;
    goto done;
  }
  nf_buf_free(&verr);
  if (rep) {
    rep->n_items = n_items;
    rep->items = items;
    rep->n_notes = A.n_notes;
    rep->notes = A.notes;
  }
  *out = ng;
done:
  if (rc == NF_ENOMEM && err->len == 0) nf_buf_puts(err, "out of memory");
  nf_arena_free(A.tmp);
  return rc;
}
