/* loop.c - the loop IR's checker, printer and reference evaluator.
 *
 * nf__loop_validate checks the structural rules of nf_loop.h and proves
 * every access and store index in bounds.  The proof works on linear
 * forms over "atoms" (loop variables and any non-linear subterm such as
 * `x // 8` or a loaded index), bounded by intervals, and uses facts taken
 * from enclosing IF conditions and from SELECT conditions (the taken
 * branch's): to bound T from above it also tries T + m*F for every fact
 * F >= 0 and multiplier m that cancels a common atom, which proves the
 * guards that non-dividing splits and padded convolutions produce.
 *
 * nf__loop_eval is deliberately simple and slow: loops are C loops,
 * expressions are evaluated recursively per element with a per-store memo
 * (DAG-shared subterms computed once), selects are lazy, and every index
 * is checked, so an out-of-bounds access is an error, not a crash.  Float
 * buffers are double, integer/bool buffers int64 (i32 wraps), like the
 * reference interpreter in f64 mode.  TEMP buffers start as NaN (floats)
 * so reads of unwritten elements show.
 *
 * Neither function modifies the program. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nf_loop.h"
#include "nf_lower.h"

/* ---- linear forms over atoms ---- */

#define LIN_MAX 16

typedef struct lin {
  int n;
  const nf_expr *atom[LIN_MAX];
  int64_t coef[LIN_MAX];
  int64_t c;
} lin;

static int lin_term(lin *l, const nf_expr *a, int64_t k) {
  if (k == 0) return 1;
  for (int i = 0; i < l->n; i++)
    if (l->atom[i] == a) {
      if (__builtin_add_overflow(l->coef[i], k, &l->coef[i])) return 0;
      if (l->coef[i] == 0) {
        l->n--;
        l->atom[i] = l->atom[l->n];
        l->coef[i] = l->coef[l->n];
      }
      return 1;
    }
  if (l->n == LIN_MAX) return 0;
  l->atom[l->n] = a;
  l->coef[l->n] = k;
  l->n++;
  return 1;
}

/* l += scale * e; integer (i64) expressions only; non-linear subterms
 * become atoms.  Returns 0 on overflow or too many atoms. */
static int lin_add_expr(lin *l, const nf_expr *e, int64_t scale) {
  int64_t t;
  switch (e->op) {
  case NF_OP_CONST:
    if (e->dtype != NF_I64) break;
    if (__builtin_mul_overflow(e->u.i, scale, &t)) return 0;
    return !__builtin_add_overflow(l->c, t, &l->c);
  case NF_OP_ADD:
    if (e->dtype != NF_I64) break;
    return lin_add_expr(l, e->args[0], scale) && lin_add_expr(l, e->args[1], scale);
  case NF_OP_SUB:
    if (e->dtype != NF_I64) break;
    if (scale == INT64_MIN) return 0;
    return lin_add_expr(l, e->args[0], scale) && lin_add_expr(l, e->args[1], -scale);
  case NF_OP_NEG:
    if (e->dtype != NF_I64 || scale == INT64_MIN) break;
    return lin_add_expr(l, e->args[0], -scale);
  case NF_OP_MUL:
    if (e->dtype != NF_I64) break;
    for (int s = 0; s < 2; s++)
      if (e->args[s]->op == NF_OP_CONST) {
        if (__builtin_mul_overflow(e->args[s]->u.i, scale, &t)) return 0;
        return lin_add_expr(l, e->args[1 - s], t);
      }
    break;
  default: break;
  }
  return lin_term(l, e, scale);
}

/* l += m * f */
static int lin_add_lin(lin *l, const lin *f, int64_t m) {
  int64_t t;
  for (int i = 0; i < f->n; i++) {
    if (__builtin_mul_overflow(f->coef[i], m, &t)) return 0;
    if (!lin_term(l, f->atom[i], t)) return 0;
  }
  if (__builtin_mul_overflow(f->c, m, &t)) return 0;
  return !__builtin_add_overflow(l->c, t, &l->c);
}

/* ---- the bound prover ---- */

typedef struct prover {
  const nf_range *ranges; /* by loop variable */
  const uint8_t *bound;   /* variable is bound by an enclosing loop */
  uint32_t n_vars;
  lin *facts; /* each fact: form >= 0 */
  int n_facts, cap_facts;
  int oom;
  /* steps left for the index being proven: the prover does not memoise,
   * so an index built of shared min/max/select nodes costs time
   * exponential in its depth; out of steps it says "cannot bound" (a
   * compile error in milliseconds, not a job spinning until its timeout) */
  int64_t budget;
} prover;

#define PROVER_BUDGET 2000000

static int range_of(prover *p, const nf_expr *e, nf_range *out, int depth);

static int64_t floordiv64(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

static int atom_range(prover *p, const nf_expr *e, nf_range *out, int depth) {
  nf_range a, b;
  switch (e->op) {
  case NF_OP_CONST:
    if (e->dtype == NF_F32 || nf_dtype_is_float((nf_dtype)e->dtype)) return 0;
    out->lo = out->hi = e->u.i;
    return 1;
  case NF_OP_VAR:
    if (e->u.var >= p->n_vars || !p->bound[e->u.var]) return 0;
    *out = p->ranges[e->u.var];
    return 1;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD: {
    const nf_expr *d = e->args[1];
    if (d->op != NF_OP_CONST || d->u.i <= 0) break;
    if (!range_of(p, e->args[0], &a, depth + 1)) break;
    int64_t c = d->u.i;
    if (e->op == NF_OP_FLOORDIV) {
      out->lo = floordiv64(a.lo, c);
      out->hi = floordiv64(a.hi, c);
    } else if (floordiv64(a.lo, c) == floordiv64(a.hi, c)) {
      out->lo = a.lo - floordiv64(a.lo, c) * c;
      out->hi = a.hi - floordiv64(a.hi, c) * c;
    } else {
      out->lo = 0;
      out->hi = c - 1;
    }
    return 1;
  }
  case NF_OP_MIN:
  case NF_OP_MAX: {
    if (!nf_dtype_is_int((nf_dtype)e->dtype)) break;
    /* half-bounded operands still bound a clamp: min(max(x, 0), n) */
    static const nf_range inf = {INT64_MIN, INT64_MAX};
    if (!range_of(p, e->args[0], &a, depth + 1)) a = inf;
    if (!range_of(p, e->args[1], &b, depth + 1)) b = inf;
    nf_range r;
    if (e->op == NF_OP_MIN) {
      r.lo = a.lo < b.lo ? a.lo : b.lo;
      r.hi = a.hi < b.hi ? a.hi : b.hi;
    } else {
      r.lo = a.lo > b.lo ? a.lo : b.lo;
      r.hi = a.hi > b.hi ? a.hi : b.hi;
    }
    if (r.lo == INT64_MIN || r.hi == INT64_MAX) {
      /* report the half-bound through the caller's MIN/MAX, if any */
      if (depth > 0 && (r.lo != INT64_MIN || r.hi != INT64_MAX)) {
        *out = r;
        return 1;
      }
      return 0;
    }
    *out = r;
    return 1;
  }
  case NF_OP_SELECT:
    if (!nf_dtype_is_int((nf_dtype)e->dtype)) break;
    if (!range_of(p, e->args[1], &a, depth + 1) || !range_of(p, e->args[2], &b, depth + 1))
      break;
    out->lo = a.lo < b.lo ? a.lo : b.lo;
    out->hi = a.hi > b.hi ? a.hi : b.hi;
    return 1;
  default: break;
  }
  return nf_expr_bounds(e, p->ranges, (int)p->n_vars, out);
}

/* Interval of a linear form from its atoms' intervals. */
static int lin_plain(prover *p, const lin *l, nf_range *out, int depth) {
  __int128 lo = l->c, hi = l->c;
  for (int i = 0; i < l->n; i++) {
    nf_range r;
    if (!atom_range(p, l->atom[i], &r, depth + 1)) return 0;
    __int128 a = (__int128)l->coef[i] * r.lo, b = (__int128)l->coef[i] * r.hi;
    lo += a < b ? a : b;
    hi += a < b ? b : a;
  }
  if (lo < INT64_MIN || hi > INT64_MAX) return 0;
  out->lo = (int64_t)lo;
  out->hi = (int64_t)hi;
  return 1;
}

/* One step: applies fact f to t through an atom they share (T + |m| F
 * for an upper bound, T - m F for a lower one); 0 when none applies. */
static int lin_step(const lin *t, const lin *F, int upper, lin *u) {
  for (int i = 0; i < t->n; i++)
    for (int j = 0; j < F->n; j++) {
      if (F->atom[j] != t->atom[i]) continue;
      int64_t tc = t->coef[i], fc = F->coef[j];
      if (tc % fc != 0) continue;
      int64_t m = tc / fc;
      if ((upper && m >= 0) || (!upper && m <= 0)) continue;
      *u = *t;
      if (lin_add_lin(u, F, -m)) return 1;
    }
  return 0;
}

/* Greedy from t: applies facts while they tighten the bound. */
static int lin_greedy(prover *p, lin t, int upper, int have, int64_t *best, int depth) {
  nf_range r;
  for (int pass = 0; pass < 4; pass++) {
    int improved = 0;
    for (int f = 0; f < p->n_facts; f++) {
      lin u;
      if (!lin_step(&t, &p->facts[f], upper, &u) || !lin_plain(p, &u, &r, depth)) continue;
      int64_t v = upper ? r.hi : r.lo;
      if (!have || (upper ? v < *best : v > *best)) {
        *best = v;
        have = 1;
        t = u;
        improved = 1;
      }
    }
    if (!improved) break;
  }
  return have;
}

/* One side of the bounds of a linear form using the facts: the best of
 * the greedy searches started from T and from each single fact applied to
 * T (several guards of a split nest need a chain of facts). */
static int lin_side(prover *p, const lin *t, int upper, int64_t *out, int depth) {
  nf_range r;
  int have = lin_plain(p, t, &r, depth);
  int64_t best = have ? (upper ? r.hi : r.lo) : 0;
  if (depth >= 6 || p->n_facts == 0) {
    *out = best;
    return have;
  }
  have = lin_greedy(p, *t, upper, have, &best, depth);
  for (int f = 0; f < p->n_facts; f++) {
    lin u;
    if (!lin_step(t, &p->facts[f], upper, &u) || !lin_plain(p, &u, &r, depth)) continue;
    int64_t v = upper ? r.hi : r.lo;
    if (!have || (upper ? v < best : v > best)) {
      best = v;
      have = 1;
    }
    have = lin_greedy(p, u, upper, have, &best, depth);
  }
  *out = best;
  return have;
}

static int lin_range(prover *p, const lin *t, nf_range *out, int depth) {
  return lin_side(p, t, 0, &out->lo, depth) && lin_side(p, t, 1, &out->hi, depth);
}

static void push_fact(prover *p, const lin *f);

/* The facts that define each floor division by a constant among l's
 * atoms, F = a // c (c > 0): a - c F >= 0 and c - 1 - a + c F >= 0.  With
 * them, x + 2 r - 2 ((x + 1) // 2) + 1 (a strided convolution's data
 * gradient indexes its filter so) is bounded as 2 r + (x + 1) mod 2. */
static void div_facts(prover *p, const lin *l) {
  for (int i = 0; i < l->n; i++) {
    const nf_expr *F = l->atom[i];
    if (F->op != NF_OP_FLOORDIV || F->dtype != NF_I64 || F->args[1]->op != NF_OP_CONST ||
        F->args[1]->u.i <= 0 || F->args[1]->u.i > ((int64_t)1 << 40))
      continue;
    int64_t c = F->args[1]->u.i;
    lin a, f;
    memset(&a, 0, sizeof a);
    if (!lin_add_expr(&a, F->args[0], 1)) continue;
    f = a;
    if (lin_term(&f, F, -c)) push_fact(p, &f);
    memset(&f, 0, sizeof f);
    if (lin_add_lin(&f, &a, -1) && lin_term(&f, F, c) && !__builtin_add_overflow(f.c, c - 1, &f.c))
      push_fact(p, &f);
  }
}

static int range_of(prover *p, const nf_expr *e, nf_range *out, int depth) {
  if (depth > 40 || --p->budget < 0) return 0;
  if (e->dtype != NF_I64) return atom_range(p, e, out, depth);
  lin l;
  memset(&l, 0, sizeof l);
  if (!lin_add_expr(&l, e, 1)) return 0;
  if (l.n == 1 && l.coef[0] == 1 && l.c == 0 && l.atom[0] == e)
    return p->n_facts ? lin_range(p, &l, out, depth) : atom_range(p, e, out, depth);
  int n_facts = p->n_facts;
  div_facts(p, &l);
  int ok = lin_range(p, &l, out, depth);
  p->n_facts = n_facts; /* (true everywhere; only this form needs them) */
  return ok;
}

static void push_fact(prover *p, const lin *f) {
  if (p->n_facts == p->cap_facts) {
    int nc = p->cap_facts ? 2 * p->cap_facts : 16;
    lin *nf = realloc(p->facts, (size_t)nc * sizeof *nf);
    if (!nf) {
      p->oom = 1;
      return;
    }
    p->facts = nf;
    p->cap_facts = nc;
  }
  p->facts[p->n_facts++] = *f;
}

/* Adds a >= b + k as a fact (integer operands only). */
static void fact_ge(prover *p, const nf_expr *a, const nf_expr *b, int64_t k) {
  lin f;
  memset(&f, 0, sizeof f);
  if (a->dtype != NF_I64 || b->dtype != NF_I64) return;
  if (!lin_add_expr(&f, a, 1) || !lin_add_expr(&f, b, -1)) return;
  if (__builtin_sub_overflow(f.c, k, &f.c)) return;
  push_fact(p, &f);
}

/* Pushes the facts that hold when cond is `truth` (1 or 0). */
static void add_facts(prover *p, const nf_expr *c, int truth) {
  const nf_expr *a = c->n_args > 0 ? c->args[0] : NULL;
  const nf_expr *b = c->n_args > 1 ? c->args[1] : NULL;
  int op = c->op;
  if (op == NF_OP_NOT) {
    add_facts(p, a, !truth);
    return;
  }
  if ((op == NF_OP_AND && truth) || (op == NF_OP_OR && !truth)) {
    add_facts(p, a, truth);
    add_facts(p, b, truth);
    return;
  }
  if (!truth) {
    switch (op) {
    case NF_OP_LT: op = NF_OP_GE; break;
    case NF_OP_LE: op = NF_OP_GT; break;
    case NF_OP_GT: op = NF_OP_LE; break;
    case NF_OP_GE: op = NF_OP_LT; break;
    case NF_OP_NE: op = NF_OP_EQ; break;
    default: return;
    }
  }
  switch (op) {
  case NF_OP_LT: fact_ge(p, b, a, 1); break;
  case NF_OP_LE: fact_ge(p, b, a, 0); break;
  case NF_OP_GT: fact_ge(p, a, b, 1); break;
  case NF_OP_GE: fact_ge(p, a, b, 0); break;
  case NF_OP_EQ:
    fact_ge(p, a, b, 0);
    fact_ge(p, b, a, 0);
    break;
  default: break;
  }
}

/* ---- validation ---- */

typedef struct vstate {
  const nf_lprog *p;
  nf_buf *err;
  prover pr;
  nf_range *ranges;
  uint8_t *bound, *used_var, *live;
  int in_parallel;
  /* memo of proven expressions: by expression id, the scope they were
   * proven in; valid while that scope is active */
  uint32_t max_id;
  uint32_t *memo_scope;
  uint8_t *scope_active;
  uint32_t n_scopes, cap_scopes, cur_scope;
} vstate;

static const char *buf_name(const nf_lprog *p, uint32_t b) {
  return b < p->n_bufs && p->bufs[b].name ? p->bufs[b].name : "?";
}

static int check_index(vstate *v, uint32_t b, int i, const nf_expr *idx,
                       const char *what) {
  const nf_lbuf *lb = &v->p->bufs[b];
  nf_range r;
  if (idx->dtype != NF_I64) {
    nf_buf_printf(v->err, "%s of %s: index %d is not i64", what, buf_name(v->p, b), i);
    return NF_EINVAL;
  }
  v->pr.budget = PROVER_BUDGET;
  if (!range_of(&v->pr, idx, &r, 0)) {
    nf_buf_printf(v->err, "%s of %s: cannot bound index %d%s", what, buf_name(v->p, b), i,
                  v->pr.budget < 0 ? " (too costly to prove)" : "");
    return NF_EINVAL;
  }
  if (r.lo < 0 || r.hi >= lb->shape[i]) {
    nf_buf_printf(v->err,
                  "%s of %s: index %d may be out of bounds ([%lld, %lld], size %lld)",
                  what, buf_name(v->p, b), i, (long long)r.lo, (long long)r.hi,
                  (long long)lb->shape[i]);
    return NF_EINVAL;
  }
  return NF_OK;
}

static int new_scope(vstate *v) {
  if (v->n_scopes == v->cap_scopes) {
    uint32_t nc = v->cap_scopes ? 2 * v->cap_scopes : 64;
    uint8_t *na = realloc(v->scope_active, nc);
    if (!na) return -1;
    v->scope_active = na;
    v->cap_scopes = nc;
  }
  v->scope_active[v->n_scopes] = 1;
  return (int)v->n_scopes++;
}

static int check_expr(vstate *v, const nf_expr *e) {
  int rc;
  if (e->id <= v->max_id && v->memo_scope[e->id] &&
      v->scope_active[v->memo_scope[e->id] - 1])
    return NF_OK;
  if (e->op == NF_OP_VAR) {
    if (e->u.var >= v->p->n_vars || !v->bound[e->u.var]) {
      nf_buf_printf(v->err, "variable %u used outside its loop", e->u.var);
      return NF_EINVAL;
    }
  } else if (e->op == NF_OP_ACCESS) {
    uint32_t b = e->u.tensor;
    if (b >= v->p->n_bufs) {
      nf_buf_printf(v->err, "access of unknown buffer %u", b);
      return NF_EINVAL;
    }
    const nf_lbuf *lb = &v->p->bufs[b];
    if (lb->kind == NF_BUF_TEMP && !v->live[b]) {
      nf_buf_printf(v->err, "access of %s outside its ALLOC", buf_name(v->p, b));
      return NF_EINVAL;
    }
    if (e->n_args != lb->rank || e->dtype != lb->dtype) {
      nf_buf_printf(v->err, "access of %s: rank or dtype disagrees", buf_name(v->p, b));
      return NF_EINVAL;
    }
    for (int i = 0; i < e->n_args; i++) {
      if ((rc = check_expr(v, e->args[i])) < 0) return rc;
      if ((rc = check_index(v, b, i, e->args[i], "access")) < 0) return rc;
    }
  } else if (e->op == NF_OP_SELECT) {
    if ((rc = check_expr(v, e->args[0])) < 0) return rc;
    for (int br = 0; br < 2; br++) {
      int nf = v->pr.n_facts;
      uint32_t outer = v->cur_scope;
      int s = new_scope(v);
      if (s < 0) return NF_ENOMEM;
      v->cur_scope = (uint32_t)s;
      add_facts(&v->pr, e->args[0], br == 0);
      rc = check_expr(v, e->args[1 + br]);
      v->pr.n_facts = nf;
      v->scope_active[s] = 0;
      v->cur_scope = outer;
      if (rc < 0) return rc;
    }
  } else {
    for (int i = 0; i < e->n_args; i++)
      if ((rc = check_expr(v, e->args[i])) < 0) return rc;
  }
  if (v->pr.oom) return NF_ENOMEM;
  if (e->id <= v->max_id) v->memo_scope[e->id] = v->cur_scope + 1;
  return NF_OK;
}

static int has_loop(const nf_lstmt *s) {
  if (s->kind == NF_LS_LOOP) return 1;
  for (int i = 0; i < s->n_body; i++)
    if (has_loop(s->body[i])) return 1;
  return 0;
}

static int check_stmt(vstate *v, const nf_lstmt *s) {
  const nf_lprog *p = v->p;
  int rc = NF_OK;
  if (!s) {
    nf_buf_puts(v->err, "NULL statement");
    return NF_EINVAL;
  }
  if ((s->n_body > 0 && !s->body) || s->n_body < 0) {
    nf_buf_puts(v->err, "statement with a missing body");
    return NF_EINVAL;
  }
  switch (s->kind) {
  case NF_LS_LOOP: {
    if (s->var >= p->n_vars || v->used_var[s->var]) {
      nf_buf_printf(v->err, "loop variable %u out of range or bound twice", s->var);
      return NF_EINVAL;
    }
    if (s->extent < 0) {
      nf_buf_printf(v->err, "loop %u: negative extent", s->var);
      return NF_EINVAL;
    }
    v->used_var[s->var] = 1;
    int par = 0;
    switch (s->loop_kind) {
    case NF_LOOP_SERIAL: break;
    case NF_LOOP_PARALLEL:
      if (v->in_parallel) {
        nf_buf_printf(v->err, "parallel loop %s inside another parallel loop",
                      s->var_name ? s->var_name : "?");
        return NF_EINVAL;
      }
      par = 1;
      break;
    case NF_LOOP_VECTOR:
      if (s->extent < 2 || s->extent > 64) {
        nf_buf_printf(v->err, "vector loop %s: width %lld not in 2..64",
                      s->var_name ? s->var_name : "?", (long long)s->extent);
        return NF_EINVAL;
      }
      for (int i = 0; i < s->n_body; i++)
        if (has_loop(s->body[i])) {
          nf_buf_printf(v->err, "vector loop %s is not innermost",
                        s->var_name ? s->var_name : "?");
          return NF_EINVAL;
        }
      break;
    case NF_LOOP_UNROLL:
      if (s->extent > 64) {
        nf_buf_printf(v->err, "unrolled loop %s: extent %lld over 64",
                      s->var_name ? s->var_name : "?", (long long)s->extent);
        return NF_EINVAL;
      }
      break;
    case NF_LOOP_BLOCK:
    case NF_LOOP_THREAD:
      if (v->in_parallel) {
        nf_buf_printf(v->err, "GPU-bound loop %s inside a parallel loop",
                      s->var_name ? s->var_name : "?");
        return NF_EINVAL;
      }
      break;
    default:
      nf_buf_printf(v->err, "loop %u: bad kind %d", s->var, s->loop_kind);
      return NF_EINVAL;
    }
    if (s->extent == 0) return NF_OK; /* the body never runs */
    v->bound[s->var] = 1;
    v->ranges[s->var].lo = 0;
    v->ranges[s->var].hi = s->extent - 1;
    v->in_parallel += par;
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = check_stmt(v, s->body[i]);
    v->in_parallel -= par;
    v->bound[s->var] = 0;
    /* memo entries proven with this variable's range are now stale */
    memset(v->memo_scope, 0, ((size_t)v->max_id + 1) * sizeof *v->memo_scope);
    return rc;
  }
  case NF_LS_STORE: {
    if (s->buf >= p->n_bufs) {
      nf_buf_printf(v->err, "store to unknown buffer %u", s->buf);
      return NF_EINVAL;
    }
    const nf_lbuf *lb = &p->bufs[s->buf];
    if (lb->kind == NF_BUF_INPUT) {
      nf_buf_printf(v->err, "store to input buffer %s", buf_name(p, s->buf));
      return NF_EINVAL;
    }
    if (lb->kind == NF_BUF_TEMP && !v->live[s->buf]) {
      nf_buf_printf(v->err, "store to %s outside its ALLOC", buf_name(p, s->buf));
      return NF_EINVAL;
    }
    if (s->n_idx != lb->rank || !s->value || s->value->dtype != lb->dtype ||
        s->op > NF_RED_MIN) {
      nf_buf_printf(v->err, "store to %s: rank, dtype or operator disagrees",
                    buf_name(p, s->buf));
      return NF_EINVAL;
    }
    memset(v->memo_scope, 0, ((size_t)v->max_id + 1) * sizeof *v->memo_scope);
    for (int i = 0; i < s->n_idx; i++) {
      if (!s->idx[i]) {
        nf_buf_printf(v->err, "store to %s: missing index", buf_name(p, s->buf));
        return NF_EINVAL;
      }
      if ((rc = check_expr(v, s->idx[i])) < 0) return rc;
      if ((rc = check_index(v, s->buf, i, s->idx[i], "store")) < 0) return rc;
    }
    return check_expr(v, s->value);
  }
  case NF_LS_IF: {
    if (!s->cond || s->cond->dtype != NF_BOOL) {
      nf_buf_puts(v->err, "IF without a bool condition");
      return NF_EINVAL;
    }
    memset(v->memo_scope, 0, ((size_t)v->max_id + 1) * sizeof *v->memo_scope);
    if ((rc = check_expr(v, s->cond)) < 0) return rc;
    int nf = v->pr.n_facts;
    add_facts(&v->pr, s->cond, 1);
    if (v->pr.oom) return NF_ENOMEM;
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = check_stmt(v, s->body[i]);
    v->pr.n_facts = nf;
    memset(v->memo_scope, 0, ((size_t)v->max_id + 1) * sizeof *v->memo_scope);
    return rc;
  }
  case NF_LS_SEQ:
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = check_stmt(v, s->body[i]);
    return rc;
  case NF_LS_ALLOC:
    if (s->buf >= p->n_bufs || p->bufs[s->buf].kind != NF_BUF_TEMP || v->live[s->buf]) {
      nf_buf_printf(v->err, "ALLOC of a non-temporary or already live buffer %u", s->buf);
      return NF_EINVAL;
    }
    v->live[s->buf] = 1;
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = check_stmt(v, s->body[i]);
    v->live[s->buf] = 0;
    return rc;
  default:
    nf_buf_printf(v->err, "bad statement kind %d", s->kind);
    return NF_EINVAL;
  }
}

static void max_id_fn(const nf_expr *e, void *user) {
  uint32_t *m = user;
  if (e->id > *m) *m = e->id;
}

static int stmt_max_id(const nf_lstmt *s, uint32_t *m) {
  int rc = NF_OK;
  if (!s) return NF_OK;
  if (s->kind == NF_LS_STORE) {
    for (int i = 0; i < s->n_idx && i < NF_MAX_RANK && rc == NF_OK; i++)
      if (s->idx[i]) rc = nf_expr_visit(s->idx[i], max_id_fn, m);
    if (s->value && rc == NF_OK) rc = nf_expr_visit(s->value, max_id_fn, m);
  }
  if (s->kind == NF_LS_IF && s->cond) rc = nf_expr_visit(s->cond, max_id_fn, m);
  for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = stmt_max_id(s->body[i], m);
  return rc;
}

int nf__loop_validate(const nf_lprog *p, nf_buf *err) {
  if (!p || !p->root || p->root->kind != NF_LS_SEQ) {
    nf_buf_puts(err, "program without a SEQ root");
    return NF_EINVAL;
  }
  uint32_t n_args = 0;
  for (uint32_t b = 0; b < p->n_bufs; b++) {
    const nf_lbuf *lb = &p->bufs[b];
    if (lb->kind > NF_BUF_TEMP || lb->rank > NF_MAX_RANK || lb->dtype >= NF_N_DTYPES) {
      nf_buf_printf(err, "buffer %u: bad kind, rank or dtype", b);
      return NF_EINVAL;
    }
    for (int d = 0; d < lb->rank; d++)
      if (lb->shape[d] < 0) {
        nf_buf_printf(err, "buffer %s: negative dimension", buf_name(p, b));
        return NF_EINVAL;
      }
    if (lb->kind != NF_BUF_TEMP) {
      if (lb->arg < 0 || (uint32_t)lb->arg >= p->n_args) {
        nf_buf_printf(err, "buffer %s: argument position %d out of range",
                      buf_name(p, b), lb->arg);
        return NF_EINVAL;
      }
      for (uint32_t c = 0; c < b; c++)
        if (p->bufs[c].kind != NF_BUF_TEMP && p->bufs[c].arg == lb->arg) {
          nf_buf_printf(err, "buffers %s and %s share argument %d", buf_name(p, c),
                        buf_name(p, b), lb->arg);
          return NF_EINVAL;
        }
      n_args++;
    }
  }
  if (n_args != p->n_args) {
    nf_buf_printf(err, "%u argument buffers, n_args says %u", n_args, p->n_args);
    return NF_EINVAL;
  }
  vstate v;
  memset(&v, 0, sizeof v);
  v.p = p;
  v.err = err;
  int rc = stmt_max_id(p->root, &v.max_id);
  size_t nv = p->n_vars ? p->n_vars : 1;
  v.ranges = calloc(nv, sizeof *v.ranges);
  v.bound = calloc(nv, 1);
  v.used_var = calloc(nv, 1);
  v.live = calloc(p->n_bufs ? p->n_bufs : 1, 1);
  v.memo_scope = calloc((size_t)v.max_id + 1, sizeof *v.memo_scope);
  if (rc < 0 || !v.ranges || !v.bound || !v.used_var || !v.live || !v.memo_scope ||
      new_scope(&v) != 0) {
    rc = NF_ENOMEM;
  } else {
    v.pr.ranges = v.ranges;
    v.pr.bound = v.bound;
    v.pr.n_vars = p->n_vars;
    rc = check_stmt(&v, p->root);
  }
  free(v.ranges);
  free(v.bound);
  free(v.used_var);
  free(v.live);
  free(v.memo_scope);
  free(v.scope_active);
  free(v.pr.facts);
  return rc;
}

/* ---- printing ---- */

typedef struct pstate {
  const nf_lprog *p;
  nf_buf *out;
  const char **vname; /* by variable id */
} pstate;

static void print_var(pstate *ps, uint32_t v) {
  if (v < ps->p->n_vars && ps->vname[v])
    nf_buf_puts(ps->out, ps->vname[v]);
  else
    nf_buf_printf(ps->out, "v%u", v);
}

static int prec(int op) {
  switch (op) {
  case NF_OP_SELECT: return 1;
  case NF_OP_OR: return 2;
  case NF_OP_AND: return 3;
  case NF_OP_EQ: case NF_OP_NE: return 4;
  case NF_OP_LT: case NF_OP_LE: case NF_OP_GT: case NF_OP_GE: return 5;
  case NF_OP_ADD: case NF_OP_SUB: return 6;
  case NF_OP_MUL: case NF_OP_DIV: case NF_OP_FLOORDIV: case NF_OP_MOD: return 7;
  case NF_OP_NEG: case NF_OP_NOT: return 8;
  default: return 9;
  }
}

static void print_expr(pstate *ps, const nf_expr *e, int ctx_prec) {
  nf_buf *o = ps->out;
  int pr = prec(e->op);
  int paren = pr < ctx_prec;
  if (paren) nf_buf_putc(o, '(');
  switch (e->op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float((nf_dtype)e->dtype))
      nf_buf_printf(o, "%.17g", e->u.f);
    else if (e->dtype == NF_BOOL)
      nf_buf_puts(o, e->u.i ? "true" : "false");
    else
      nf_buf_printf(o, "%lld", (long long)e->u.i);
    break;
  case NF_OP_VAR: print_var(ps, e->u.var); break;
  case NF_OP_ACCESS:
    nf_buf_puts(o, buf_name(ps->p, e->u.tensor));
    for (int i = 0; i < e->n_args; i++) {
      nf_buf_putc(o, '[');
      print_expr(ps, e->args[i], 0);
      nf_buf_putc(o, ']');
    }
    break;
  case NF_OP_NEG:
  case NF_OP_NOT:
    nf_buf_puts(o, e->op == NF_OP_NEG ? "-" : "!");
    print_expr(ps, e->args[0], pr);
    break;
  case NF_OP_CAST:
    nf_buf_printf(o, "(%s)", nf_dtype_name((nf_dtype)e->dtype));
    print_expr(ps, e->args[0], 9);
    break;
  case NF_OP_SELECT:
    print_expr(ps, e->args[0], 2);
    nf_buf_puts(o, " ? ");
    print_expr(ps, e->args[1], 2);
    nf_buf_puts(o, " : ");
    print_expr(ps, e->args[2], 1);
    break;
  case NF_OP_POW:
  case NF_OP_MIN:
  case NF_OP_MAX:
    nf_buf_printf(o, "%s(", nf_op_name((nf_op)e->op));
    print_expr(ps, e->args[0], 0);
    nf_buf_puts(o, ", ");
    print_expr(ps, e->args[1], 0);
    nf_buf_putc(o, ')');
    break;
  default:
    if (e->n_args == 1) {
      nf_buf_printf(o, "%s(", nf_op_name((nf_op)e->op));
      print_expr(ps, e->args[0], 0);
      nf_buf_putc(o, ')');
    } else if (e->n_args == 2) {
      print_expr(ps, e->args[0], pr);
      nf_buf_printf(o, " %s ", nf_op_name((nf_op)e->op));
      print_expr(ps, e->args[1], pr + 1);
    } else {
      nf_buf_printf(o, "%s(?)", nf_op_name((nf_op)e->op));
    }
    break;
  }
  if (paren) nf_buf_putc(o, ')');
}

static const char *redop_str(int op) {
  switch (op) {
  case NF_RED_SUM: return "+=";
  case NF_RED_PROD: return "*=";
  case NF_RED_MAX: return "max=";
  case NF_RED_MIN: return "min=";
  default: return "=";
  }
}

static void indent(nf_buf *o, int d) {
  for (int i = 0; i < d; i++) nf_buf_puts(o, "  ");
}

static void print_stmt(pstate *ps, const nf_lstmt *s, int d) {
  static const char *kinds[] = {"for",        "parallel for", "vector for",
                                "unroll for", "block for",    "thread for"};
  nf_buf *o = ps->out;
  switch (s->kind) {
  case NF_LS_LOOP:
    indent(o, d);
    nf_buf_printf(o, "%s (", s->loop_kind <= NF_LOOP_THREAD ? kinds[s->loop_kind] : "?for");
    print_var(ps, s->var);
    nf_buf_printf(o, " = 0; < %lld) {\n", (long long)s->extent);
    for (int i = 0; i < s->n_body; i++) print_stmt(ps, s->body[i], d + 1);
    indent(o, d);
    nf_buf_puts(o, "}\n");
    break;
  case NF_LS_STORE:
    indent(o, d);
    nf_buf_puts(o, buf_name(ps->p, s->buf));
    for (int i = 0; i < s->n_idx; i++) {
      nf_buf_putc(o, '[');
      print_expr(ps, s->idx[i], 0);
      nf_buf_putc(o, ']');
    }
    nf_buf_printf(o, " %s ", redop_str(s->op));
    print_expr(ps, s->value, 0);
    nf_buf_puts(o, ";\n");
    break;
  case NF_LS_IF:
    indent(o, d);
    nf_buf_puts(o, "if (");
    print_expr(ps, s->cond, 0);
    nf_buf_puts(o, ") {\n");
    for (int i = 0; i < s->n_body; i++) print_stmt(ps, s->body[i], d + 1);
    indent(o, d);
    nf_buf_puts(o, "}\n");
    break;
  case NF_LS_SEQ:
    for (int i = 0; i < s->n_body; i++) print_stmt(ps, s->body[i], d);
    break;
  case NF_LS_ALLOC: {
    const nf_lbuf *b = &ps->p->bufs[s->buf];
    indent(o, d);
    nf_buf_printf(o, "alloc %s %s", nf_dtype_name((nf_dtype)b->dtype), buf_name(ps->p, s->buf));
    for (int i = 0; i < b->rank; i++) nf_buf_printf(o, "[%lld]", (long long)b->shape[i]);
    nf_buf_puts(o, " {\n");
    for (int i = 0; i < s->n_body; i++) print_stmt(ps, s->body[i], d + 1);
    indent(o, d);
    nf_buf_puts(o, "}\n");
    break;
  }
  default:
    indent(o, d);
    nf_buf_puts(o, "?\n");
  }
}

static void collect_names(const nf_lstmt *s, const char **names, uint32_t n) {
  if (!s) return;
  if (s->kind == NF_LS_LOOP && s->var < n) names[s->var] = s->var_name;
  for (int i = 0; i < s->n_body; i++) collect_names(s->body[i], names, n);
}

void nf__loop_print(const nf_lprog *p, nf_buf *out) {
  pstate ps = {.p = p, .out = out};
  ps.vname = calloc(p->n_vars ? p->n_vars : 1, sizeof *ps.vname);
  if (!ps.vname) {
    out->oom = 1;
    return;
  }
  collect_names(p->root, ps.vname, p->n_vars);
  nf_buf_printf(out, "kernel %s(", p->name ? p->name : "?");
  int first = 1;
  for (uint32_t a = 0; a < p->n_args; a++)
    for (uint32_t b = 0; b < p->n_bufs; b++) {
      const nf_lbuf *lb = &p->bufs[b];
      if (lb->kind == NF_BUF_TEMP || lb->arg != (int32_t)a) continue;
      nf_buf_printf(out, "%s%s %s %s", first ? "" : ", ",
                    lb->kind == NF_BUF_INPUT ? "in" : "out",
                    nf_dtype_name((nf_dtype)lb->dtype), buf_name(p, b));
      for (int i = 0; i < lb->rank; i++) nf_buf_printf(out, "[%lld]", (long long)lb->shape[i]);
      first = 0;
    }
  nf_buf_puts(out, ") {\n");
  if (p->root) print_stmt(&ps, p->root, 1);
  nf_buf_puts(out, "}\n");
  free(ps.vname);
}

/* ---- evaluation ---- */

typedef union val {
  double f;
  int64_t i;
} val;

typedef struct estate {
  const nf_lprog *p;
  nf_buf *err;
  void **data;   /* by buffer */
  int64_t *vars; /* by variable */
  uint32_t max_id;
  uint64_t gen;
  uint64_t *memo_gen;
  val *memo;
} estate;

static int64_t wrap32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
static double fmax_nan(double a, double b) { return (a > b || a != a) ? a : b; }
static double fmin_nan(double a, double b) { return (a < b || a != a) ? a : b; }

static double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

static int offset_of(estate *st, uint32_t b, int n, const int64_t *ix, int64_t *off) {
  const nf_lbuf *lb = &st->p->bufs[b];
  int64_t o = 0;
  for (int d = 0; d < n; d++) {
    if (ix[d] < 0 || ix[d] >= lb->shape[d]) {
      nf_buf_printf(st->err, "index %lld out of bounds for dimension %d of %s (size %lld)",
                    (long long)ix[d], d, buf_name(st->p, b), (long long)lb->shape[d]);
      return NF_EBOUNDS;
    }
    o = o * lb->shape[d] + ix[d];
  }
  *off = o;
  return NF_OK;
}

static int eval(estate *st, const nf_expr *e, val *out);

static int eval_int_bin(estate *st, const nf_expr *e, int64_t a, int64_t b, int64_t *d) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  switch (e->op) {
  case NF_OP_ADD: *d = (int64_t)(ua + ub); break;
  case NF_OP_SUB: *d = (int64_t)(ua - ub); break;
  case NF_OP_MUL: *d = (int64_t)(ua * ub); break;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD: {
    int64_t q, m;
    if (b == 0) {
      nf_buf_printf(st->err, "integer %s by zero", e->op == NF_OP_MOD ? "modulo" : "division");
      return NF_ERANGE;
    }
    if (b == -1) {
      q = (int64_t)(0 - ua);
      m = 0;
    } else {
      q = a / b;
      m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        q--;
        m += b;
      }
    }
    *d = e->op == NF_OP_MOD ? m : q;
    break;
  }
  case NF_OP_MIN: *d = a < b ? a : b; break;
  case NF_OP_MAX: *d = a > b ? a : b; break;
  case NF_OP_AND: *d = a && b; break;
  case NF_OP_OR: *d = a || b; break;
  default:
    nf_buf_printf(st->err, "operator '%s' is not defined on integers", nf_op_name((nf_op)e->op));
    return NF_EINVAL;
  }
  if (e->dtype == NF_I32) *d = wrap32(*d);
  return NF_OK;
}

static int eval_node(estate *st, const nf_expr *e, val *out) {
  val a = {0}, b = {0};
  int rc;
  int fl = nf_dtype_is_float((nf_dtype)e->dtype);
  switch (e->op) {
  case NF_OP_CONST:
    if (fl) out->f = e->u.f; else out->i = e->u.i;
    return NF_OK;
  case NF_OP_VAR:
    if (e->u.var >= st->p->n_vars) return NF_EINVAL;
    out->i = st->vars[e->u.var];
    return NF_OK;
  case NF_OP_ACCESS: {
    int64_t ix[NF_MAX_RANK], off;
    uint32_t bi = e->u.tensor;
    if (bi >= st->p->n_bufs || e->n_args != st->p->bufs[bi].rank || !st->data[bi]) {
      nf_buf_printf(st->err, "access of unavailable buffer %u", bi);
      return NF_EINVAL;
    }
    for (int d = 0; d < e->n_args; d++) {
      if ((rc = eval(st, e->args[d], &a)) < 0) return rc;
      ix[d] = a.i;
    }
    if ((rc = offset_of(st, bi, e->n_args, ix, &off)) < 0) return rc;
    if (nf_dtype_is_float((nf_dtype)st->p->bufs[bi].dtype))
      out->f = ((double *)st->data[bi])[off];
    else
      out->i = ((int64_t *)st->data[bi])[off];
    return NF_OK;
  }
  case NF_OP_SELECT:
    if ((rc = eval(st, e->args[0], &a)) < 0) return rc;
    return eval(st, e->args[a.i ? 1 : 2], out);
  default: break;
  }
  if (e->n_args >= 1 && (rc = eval(st, e->args[0], &a)) < 0) return rc;
  if (e->n_args >= 2 && (rc = eval(st, e->args[1], &b)) < 0) return rc;
  int afl = e->n_args >= 1 && nf_dtype_is_float((nf_dtype)e->args[0]->dtype);
  switch (e->op) {
  case NF_OP_CAST:
    if (afl && fl) out->f = a.f;
    else if (afl && e->dtype == NF_BOOL) out->i = a.f != 0;
    else if (afl) {
      double x = trunc(a.f);
      double lo = e->dtype == NF_I32 ? -2147483648.0 : -9223372036854775808.0;
      double hi = e->dtype == NF_I32 ? 2147483648.0 : 9223372036854775808.0;
      if (!(x >= lo && x < hi)) {
        nf_buf_printf(st->err, "cannot convert %g to %s", a.f,
                      nf_dtype_name((nf_dtype)e->dtype));
        return NF_ERANGE;
      }
      out->i = (int64_t)x;
    } else if (fl) out->f = (double)a.i;
    else if (e->dtype == NF_BOOL) out->i = a.i != 0;
    else if (e->dtype == NF_I32) out->i = wrap32(a.i);
    else out->i = a.i;
    return NF_OK;
  case NF_OP_LT: case NF_OP_LE: case NF_OP_GT: case NF_OP_GE: case NF_OP_EQ: case NF_OP_NE: {
    int r;
    if (afl) {
      switch (e->op) {
      case NF_OP_LT: r = a.f < b.f; break;
      case NF_OP_LE: r = a.f <= b.f; break;
      case NF_OP_GT: r = a.f > b.f; break;
      case NF_OP_GE: r = a.f >= b.f; break;
      case NF_OP_EQ: r = a.f == b.f; break;
      default: r = a.f != b.f; break;
      }
    } else {
      switch (e->op) {
      case NF_OP_LT: r = a.i < b.i; break;
      case NF_OP_LE: r = a.i <= b.i; break;
      case NF_OP_GT: r = a.i > b.i; break;
      case NF_OP_GE: r = a.i >= b.i; break;
      case NF_OP_EQ: r = a.i == b.i; break;
      default: r = a.i != b.i; break;
      }
    }
    out->i = r;
    return NF_OK;
  }
  default: break;
  }
  if (fl) {
    double x = a.f, y = b.f, d;
    switch (e->op) {
    case NF_OP_NEG: d = -x; break;
    case NF_OP_EXP: d = exp(x); break;
    case NF_OP_LOG: d = log(x); break;
    case NF_OP_SQRT: d = sqrt(x); break;
    case NF_OP_RSQRT: d = 1.0 / sqrt(x); break;
    case NF_OP_TANH: d = tanh(x); break;
    case NF_OP_SIGMOID: d = sigmoid(x); break;
    case NF_OP_ERF: d = erf(x); break;
    case NF_OP_ABS: d = fabs(x); break;
    case NF_OP_FLOOR: d = floor(x); break;
    case NF_OP_CEIL: d = ceil(x); break;
    case NF_OP_STOPGRAD: d = x; break;
    case NF_OP_ADD: d = x + y; break;
    case NF_OP_SUB: d = x - y; break;
    case NF_OP_MUL: d = x * y; break;
    case NF_OP_DIV: d = x / y; break;
    case NF_OP_FLOORDIV: d = floor(x / y); break;
    case NF_OP_MOD: d = x - y * floor(x / y); break;
    case NF_OP_POW: d = pow(x, y); break;
    case NF_OP_MIN: d = fmin_nan(x, y); break;
    case NF_OP_MAX: d = fmax_nan(x, y); break;
    default:
      nf_buf_printf(st->err, "operator '%s' is not defined on floats", nf_op_name((nf_op)e->op));
      return NF_EINVAL;
    }
    out->f = d;
    return NF_OK;
  }
  switch (e->op) {
  case NF_OP_NEG: out->i = (int64_t)(0 - (uint64_t)a.i); break;
  case NF_OP_NOT: out->i = !a.i; break;
  case NF_OP_ABS: out->i = a.i < 0 ? (int64_t)(0 - (uint64_t)a.i) : a.i; break;
  case NF_OP_FLOOR: case NF_OP_CEIL: case NF_OP_STOPGRAD: out->i = a.i; break;
  default: return eval_int_bin(st, e, a.i, b.i, &out->i);
  }
  if (e->dtype == NF_I32) out->i = wrap32(out->i);
  return NF_OK;
}

static int eval(estate *st, const nf_expr *e, val *out) {
  if (e->id <= st->max_id && st->memo_gen[e->id] == st->gen) {
    *out = st->memo[e->id];
    return NF_OK;
  }
  int rc = eval_node(st, e, out);
  if (rc == NF_OK && e->id <= st->max_id) {
    st->memo_gen[e->id] = st->gen;
    st->memo[e->id] = *out;
  }
  return rc;
}

static int64_t numel(const nf_lbuf *b) {
  int64_t n = 1;
  for (int d = 0; d < b->rank; d++) n *= b->shape[d];
  return n;
}

static int exec_stmt(estate *st, const nf_lstmt *s) {
  int rc = NF_OK;
  switch (s->kind) {
  case NF_LS_LOOP:
    for (int64_t i = 0; i < s->extent; i++) {
      st->vars[s->var] = i;
      for (int k = 0; k < s->n_body; k++)
        if ((rc = exec_stmt(st, s->body[k])) < 0) return rc;
    }
    return NF_OK;
  case NF_LS_SEQ:
    for (int k = 0; k < s->n_body; k++)
      if ((rc = exec_stmt(st, s->body[k])) < 0) return rc;
    return NF_OK;
  case NF_LS_IF: {
    val c;
    st->gen++;
    if ((rc = eval(st, s->cond, &c)) < 0) return rc;
    if (!c.i) return NF_OK;
    for (int k = 0; k < s->n_body; k++)
      if ((rc = exec_stmt(st, s->body[k])) < 0) return rc;
    return NF_OK;
  }
  case NF_LS_STORE: {
    int64_t ix[NF_MAX_RANK], off;
    val v, x;
    st->gen++;
    if (s->buf >= st->p->n_bufs || !st->data[s->buf]) {
      nf_buf_printf(st->err, "store to unavailable buffer %u", s->buf);
      return NF_EINVAL;
    }
    for (int d = 0; d < s->n_idx; d++) {
      if ((rc = eval(st, s->idx[d], &x)) < 0) return rc;
      ix[d] = x.i;
    }
    if ((rc = offset_of(st, s->buf, s->n_idx, ix, &off)) < 0) return rc;
    if ((rc = eval(st, s->value, &v)) < 0) return rc;
    const nf_lbuf *lb = &st->p->bufs[s->buf];
    if (nf_dtype_is_float((nf_dtype)lb->dtype)) {
      double *p = (double *)st->data[s->buf] + off;
      switch (s->op) {
      case NF_RED_SUM: *p += v.f; break;
      case NF_RED_PROD: *p *= v.f; break;
      case NF_RED_MAX: *p = fmax_nan(*p, v.f); break;
      case NF_RED_MIN: *p = fmin_nan(*p, v.f); break;
      default: *p = v.f; break;
      }
    } else {
      int64_t *p = (int64_t *)st->data[s->buf] + off, r = *p;
      switch (s->op) {
      case NF_RED_SUM: r = (int64_t)((uint64_t)r + (uint64_t)v.i); break;
      case NF_RED_PROD: r = (int64_t)((uint64_t)r * (uint64_t)v.i); break;
      case NF_RED_MAX: r = r > v.i ? r : v.i; break;
      case NF_RED_MIN: r = r < v.i ? r : v.i; break;
      default: r = v.i; break;
      }
      *p = lb->dtype == NF_I32 ? wrap32(r) : lb->dtype == NF_BOOL ? r != 0 : r;
    }
    return NF_OK;
  }
  case NF_LS_ALLOC: {
    const nf_lbuf *lb = &st->p->bufs[s->buf];
    int64_t n = numel(lb);
    void *mem;
    if (nf_dtype_is_float((nf_dtype)lb->dtype)) {
      double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
      if (d)
        for (int64_t i = 0; i < n; i++) d[i] = NAN;
      mem = d;
    } else {
      mem = calloc((size_t)(n ? n : 1), sizeof(int64_t));
    }
    if (!mem) return NF_ENOMEM;
    st->data[s->buf] = mem;
    for (int k = 0; k < s->n_body && rc == NF_OK; k++) rc = exec_stmt(st, s->body[k]);
    st->data[s->buf] = NULL;
    free(mem);
    return rc;
  }
  default:
    return NF_EINVAL;
  }
}

int nf__loop_eval(const nf_lprog *p, void *const *args, nf_buf *err) {
  estate st;
  memset(&st, 0, sizeof st);
  st.p = p;
  st.err = err;
  int rc = stmt_max_id(p->root, &st.max_id);
  st.data = calloc(p->n_bufs ? p->n_bufs : 1, sizeof *st.data);
  st.vars = calloc(p->n_vars ? p->n_vars : 1, sizeof *st.vars);
  st.memo_gen = calloc((size_t)st.max_id + 1, sizeof *st.memo_gen);
  st.memo = calloc((size_t)st.max_id + 1, sizeof *st.memo);
  if (rc < 0 || !st.data || !st.vars || !st.memo_gen || !st.memo) {
    rc = NF_ENOMEM;
  } else {
    for (uint32_t b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].kind != NF_BUF_TEMP) st.data[b] = args[p->bufs[b].arg];
    rc = exec_stmt(&st, p->root);
  }
  free(st.data);
  free(st.vars);
  free(st.memo_gen);
  free(st.memo);
  return rc;
}
