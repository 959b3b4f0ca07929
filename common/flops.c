/* flops.c - floating-point operation counts of statements, for the
 * gradient cost table (client/autodiff) and the search's budget.
 *
 * A statement's count is the number of floating-point operations its
 * evaluation executes: for every point of its iteration box (the output's
 * elements times every reduction range), the float operations of the right
 * side on the branches of selects that are taken, plus one accumulation
 * per point for a reduction (skipped where an enclosing select returns
 * its zero branch).  Leaves (constants, variables, loads) and integer or
 * bool arithmetic (indices, guards) are free; a comparison of floats costs
 * one.
 *
 * Branches: a select whose condition is integer arithmetic on the index
 * variables (a padding guard, the divisibility and range guards of an
 * inverted gradient) is counted exactly, by enumerating the variables the
 * conditions mention (up to MAX_ENUM points; beyond that, and for
 * conditions that read tensors or compare floats, the branch counts as
 * taken everywhere: an upper bound).  Code generation realises these
 * exact counts by splitting the loops at the guard boundaries.
 *
 * Operations are weighted by what they cost a vector unit, in multiply
 * equivalents: + - * neg abs min max and comparisons 1; division, sqrt and
 * rsqrt 4; exp, log, tanh and sigmoid 8 (a range reduction and a
 * polynomial of degree 6-8); erf 10; pow 16 (exp of a product with log).
 * Without weights a 1-operation forward like sigmoid would make any
 * gradient (which needs y * (1 - y) and the chain-rule product) "cost 3x",
 * while the gradient is in fact cheaper than the forward. */
#include "nf_flops.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ENUM 4000000 /* points enumerated to count a condition */
#define MAX_CONDS 32
#define MAX_DEPTH 4000

static int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

typedef struct fctx {
  int n_vars;
  nf_range r[NF_MAX_VARS];
  int64_t box;
  const nf_expr *cond[MAX_CONDS];
  int pol[MAX_CONDS];
  int n_cond;
  int64_t cached; /* count for the current conditions, -1: unknown */
  const nf_expr **seen; /* open-addressed set of nodes already counted */
  size_t cap_seen, n_seen;
  int seen_oom;
} fctx;

/* Marks e as counted; returns 1 when it already was.  A shared
 * subexpression is computed once per point, as compiled code keeps it in a
 * register. */
static int seen_before(fctx *F, const nf_expr *e) {
  if ((F->n_seen + 1) * 2 > F->cap_seen) {
    size_t nc = F->cap_seen ? F->cap_seen * 2 : 256;
    const nf_expr **n = calloc(nc, sizeof *n);
    if (!n) {
      F->seen_oom = 1;
      return 0; /* count it again: an upper bound */
    }
    for (size_t i = 0; i < F->cap_seen; i++)
      if (F->seen[i]) {
        size_t j = (size_t)(F->seen[i]->hash) & (nc - 1);
        while (n[j]) j = (j + 1) & (nc - 1);
        n[j] = F->seen[i];
      }
    free(F->seen);
    F->seen = n;
    F->cap_seen = nc;
  }
  size_t i = (size_t)e->hash & (F->cap_seen - 1);
  while (F->seen[i]) {
    if (F->seen[i] == e) return 1;
    i = (i + 1) & (F->cap_seen - 1);
  }
  F->seen[i] = e;
  F->n_seen++;
  return 0;
}

/* ---- a small evaluator for index arithmetic and guards ---- */

typedef struct ivars {
  int64_t v[NF_MAX_VARS];
} ivars;

static int64_t py_div(int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return 0;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

static int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return 0;
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

/* Evaluates an integer/bool expression (wrapping arithmetic). */
static int64_t ieval(const nf_expr *e, const ivars *x, int depth) {
  if (depth > MAX_DEPTH) return 0;
  uint64_t a = 0, b = 0;
  if (e->n_args > 0 && e->op != NF_OP_SELECT && e->op != NF_OP_AND && e->op != NF_OP_OR)
    a = (uint64_t)ieval(e->args[0], x, depth + 1);
  if (e->n_args > 1 && e->op != NF_OP_SELECT && e->op != NF_OP_AND && e->op != NF_OP_OR)
    b = (uint64_t)ieval(e->args[1], x, depth + 1);
  switch ((nf_op)e->op) {
    case NF_OP_CONST: return e->u.i;
    case NF_OP_VAR: return e->u.var < NF_MAX_VARS ? x->v[e->u.var] : 0;
    case NF_OP_NEG: return (int64_t)(0 - a);
    case NF_OP_NOT: return !a;
    case NF_OP_ABS: return (int64_t)a < 0 ? (int64_t)(0 - a) : (int64_t)a;
    case NF_OP_CAST:
      if (e->dtype == NF_BOOL) return a != 0;
      if (e->dtype == NF_I32) return (int32_t)(uint32_t)a;
      return (int64_t)a;
    case NF_OP_ADD: return (int64_t)(a + b);
    case NF_OP_SUB: return (int64_t)(a - b);
    case NF_OP_MUL: return (int64_t)(a * b);
    case NF_OP_FLOORDIV: return py_div((int64_t)a, (int64_t)b);
    case NF_OP_MOD: return py_mod((int64_t)a, (int64_t)b);
    case NF_OP_MIN: return (int64_t)a < (int64_t)b ? (int64_t)a : (int64_t)b;
    case NF_OP_MAX: return (int64_t)a > (int64_t)b ? (int64_t)a : (int64_t)b;
    case NF_OP_LT: return (int64_t)a < (int64_t)b;
    case NF_OP_LE: return (int64_t)a <= (int64_t)b;
    case NF_OP_GT: return (int64_t)a > (int64_t)b;
    case NF_OP_GE: return (int64_t)a >= (int64_t)b;
    case NF_OP_EQ: return a == b;
    case NF_OP_NE: return a != b;
    case NF_OP_AND:
      return ieval(e->args[0], x, depth + 1) && ieval(e->args[1], x, depth + 1);
    case NF_OP_OR:
      return ieval(e->args[0], x, depth + 1) || ieval(e->args[1], x, depth + 1);
    case NF_OP_SELECT:
      return ieval(e->args[0], x, depth + 1) ? ieval(e->args[1], x, depth + 1)
                                             : ieval(e->args[2], x, depth + 1);
    default: return 0;
  }
}

/* Whether e is pure index arithmetic (no loads, no floats); collects the
 * variables it uses. */
static int pure_int(const nf_expr *e, uint32_t *used, int depth) {
  if (depth > MAX_DEPTH) return 0;
  if (e->op == NF_OP_ACCESS || nf_dtype_is_float((nf_dtype)e->dtype)) return 0;
  if (e->op == NF_OP_VAR) {
    if (e->u.var >= NF_MAX_VARS) return 0;
    *used |= 1u << e->u.var;
    return 1;
  }
  for (int k = 0; k < e->n_args; k++)
    if (!pure_int(e->args[k], used, depth + 1)) return 0;
  return 1;
}

/* Number of box points where the current conditions hold (exactly when
 * they are index arithmetic and the enumeration is small enough). */
static int64_t count(fctx *F) {
  if (F->cached >= 0) return F->cached;
  const nf_expr *cs[MAX_CONDS];
  int pol[MAX_CONDS], n = 0;
  uint32_t used = 0;
  for (int k = 0; k < F->n_cond; k++) {
    uint32_t u = 0;
    if (!pure_int(F->cond[k], &u, 0)) continue; /* data-dependent: taken */
    cs[n] = F->cond[k];
    pol[n++] = F->pol[k];
    used |= u;
  }
  if (n == 0) return F->cached = F->box;
  int64_t sub = 1, rest = F->box;
  int vars[NF_MAX_VARS], nv = 0;
  for (int v = 0; v < F->n_vars; v++) {
    if (!(used & (1u << v))) continue;
    int64_t ext = F->r[v].hi - F->r[v].lo + 1;
    if (ext <= 0) return F->cached = 0;
    sub = sat_mul(sub, ext);
    rest /= ext;
    vars[nv++] = v;
  }
  if (sub > MAX_ENUM) return F->cached = F->box;
  ivars x;
  memset(&x, 0, sizeof x);
  for (int k = 0; k < nv; k++) x.v[vars[k]] = F->r[vars[k]].lo;
  int64_t hits = 0;
  for (;;) {
    int ok = 1;
    for (int k = 0; k < n && ok; k++) ok = (ieval(cs[k], &x, 0) != 0) == (pol[k] != 0);
    hits += ok;
    int k = nv - 1;
    while (k >= 0 && x.v[vars[k]] == F->r[vars[k]].hi) {
      x.v[vars[k]] = F->r[vars[k]].lo;
      k--;
    }
    if (k < 0) break;
    x.v[vars[k]]++;
  }
  return F->cached = sat_mul(hits, rest);
}

static void push(fctx *F, const nf_expr *c, int pol) {
  if (F->n_cond < MAX_CONDS) {
    F->cond[F->n_cond] = c;
    F->pol[F->n_cond++] = pol;
  }
  F->cached = -1;
}

static void pop(fctx *F, int was) {
  F->n_cond = was;
  F->cached = -1;
}

static int64_t weight(const nf_expr *e) {
  nf_op op = (nf_op)e->op;
  int is_float = nf_dtype_is_float((nf_dtype)e->dtype);
  if (op >= NF_OP_LT && op <= NF_OP_NE) is_float = nf_dtype_is_float((nf_dtype)e->args[0]->dtype);
  if (op == NF_OP_CAST || op == NF_OP_STOPGRAD || op == NF_OP_SELECT) return 0;
  if (op == NF_OP_CONST || op == NF_OP_VAR || op == NF_OP_ACCESS) return 0;
  if (!is_float) return 0;
  switch (op) {
    case NF_OP_DIV:
    case NF_OP_SQRT:
    case NF_OP_RSQRT: return 4;
    case NF_OP_EXP:
    case NF_OP_LOG:
    case NF_OP_TANH:
    case NF_OP_SIGMOID: return 8;
    case NF_OP_ERF: return 10;
    case NF_OP_POW: return 16;
    default: return 1;
  }
}

/* Operations executed over the box by e under the current conditions. */
static int64_t cost(fctx *F, const nf_expr *e, int depth) {
  if (depth > MAX_DEPTH) return 0;
  nf_op op = (nf_op)e->op;
  if (op == NF_OP_CONST || op == NF_OP_VAR || op == NF_OP_ACCESS) return 0;
  if (seen_before(F, e)) return 0;
  if (op == NF_OP_SELECT) {
    int was = F->n_cond;
    int64_t c = cost(F, e->args[0], depth + 1);
    push(F, e->args[0], 1);
    c = sat_add(c, cost(F, e->args[1], depth + 1));
    pop(F, was);
    push(F, e->args[0], 0);
    c = sat_add(c, cost(F, e->args[2], depth + 1));
    pop(F, was);
    return c;
  }
  int64_t c = 0;
  for (int k = 0; k < e->n_args; k++) c = sat_add(c, cost(F, e->args[k], depth + 1));
  int64_t w = weight(e);
  if (w) c = sat_add(c, sat_mul(w, count(F)));
  return c;
}

static int is_zero(const nf_expr *e) {
  return e->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->dtype) && e->u.f == 0.0;
}

int64_t nf_stmt_flops(const nf_graph *g, uint32_t stmt) {
  if (stmt >= g->n_stmts) return 0;
  const nf_stmt *s = &g->stmts[stmt];
  const nf_tensor *t = &g->tensors[s->out];
  fctx F;
  memset(&F, 0, sizeof F);
  F.cached = -1;
  F.box = nf_tensor_numel(t);
  if (F.box < 0) return INT64_MAX;
  F.n_vars = t->rank + s->n_red;
  if (F.n_vars > NF_MAX_VARS) return INT64_MAX;
  for (int v = 0; v < t->rank; v++) {
    F.r[v].lo = 0;
    F.r[v].hi = t->shape[v] - 1;
  }
  for (int r = 0; r < s->n_red; r++) {
    F.box = sat_mul(F.box, s->red_ext[r]);
    F.r[t->rank + r].lo = s->red_lo[r];
    F.r[t->rank + r].hi = s->red_lo[r] + s->red_ext[r] - 1;
  }
  if (F.box == 0) return 0;
  int64_t c = cost(&F, s->rhs, 0);
  if (s->red != NF_RED_NONE) {
    /* The accumulation runs where the chain of zero-else selects at the
     * top of the right side is taken. */
    const nf_expr *e = s->rhs;
    while (e->op == NF_OP_SELECT && is_zero(e->args[2])) {
      push(&F, e->args[0], 1);
      e = e->args[1];
    }
    c = sat_add(c, count(&F));
  }
  free(F.seen);
  return c;
}
