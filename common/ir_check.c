/* ir_check.c - the checks that keep an absurd or hostile graph away from
 * code generation (nf_ir.h): what a graph costs (elements, float
 * operations, and the expression depth once the producers a schedule may
 * inline are substituted), and index bounds per access under the guards
 * of the selects around it.
 *
 * Invariants:
 *  - Each statement's right side is collected once, iteratively, into a
 *    post-order list (every node after its arguments, the root last), and
 *    every pass runs over that list by position, so the cost is linear in
 *    the nodes a statement reaches and nothing recurses over an
 *    expression.  The one recursion left is the message printer, cut at
 *    PRINT_DEPTH levels.
 *  - The bounds check is sound both ways.  "Proven" comes only from sound
 *    interval bounds (nf_expr_bounds) and linear facts of guards that hold
 *    wherever the access is evaluated.  "Refused" comes only from a
 *    concrete point of the statement's box where an evaluation with the
 *    interpreter's rules (lazy selects, wrapping integers, Python `//` and
 *    `%`) certainly reaches the access, whatever the data, with an index
 *    outside the tensor: then every evaluation of the graph fails.  All
 *    that is neither is accepted, for the code generator to prove on the
 *    loop program or refuse.
 *  - Guards: a node's context is what holds on every path from the root
 *    to it (the deepest common ancestor of the contexts its users give
 *    it, in a tree of select conditions; a branch adds its condition,
 *    true or false).  Dropping a condition only weakens the facts, so
 *    context chains are cut at MAX_CTX_DEPTH.
 *  - Linear forms over i64 `+ - * neg` are exact modulo 2^64, like the
 *    interpreter's wrapping arithmetic; they are used only where their
 *    interval fits in int64, where the wrapped value is the exact one.
 *
 * It does not know the wire or the daemon: the caps on the cost are the
 * daemon's (daemon/server.c). */
#include "nf_ir.h"
#include "ir_int.h"

#include <stdlib.h>
#include <string.h>

#define MAX_CTX_DEPTH 16  /* guard conditions kept per node */
#define MAX_FACTS 64      /* linear facts taken from one context */
#define MAX_OVERRIDES 32  /* atoms bounded by single-atom facts */
#define LIN_MAX 16        /* atoms of one linear form */
#define LIN_STACK 64      /* pending subterms while building one */
#define LIN_STEPS 256     /* subterms expanded while building one */
#define ENUM_MAX 4096     /* a box this small is searched point by point */
#define PRINT_DEPTH 6     /* levels of an expression printed in a message */
/* Steps (node visits of every pass, proof and point evaluation, each
 * bounded walk charged at the size of what it may visit) per graph; past
 * it the remaining indices are accepted unproven, which is always sound
 * here, so a hostile graph costs the event loop a bounded time. */
#define WORK_BUDGET ((uint64_t)1 << 26)

typedef struct bwork bwork;

/* ---- a statement's right side in post-order ---- */

typedef struct pframe {
  const nf_expr *e;
  uint32_t next;
} pframe;

typedef struct slist {
  const nf_expr **n; /* nodes, arguments first, root last */
  uint32_t *aoff;    /* node p's argument positions: apos[aoff[p] ..] */
  uint32_t *apos;
  uint32_t count, cap_n, cap_aoff, n_apos, cap_apos;
  nf_ptrmap *pos; /* node -> position (UINT64_MAX while open) */
  pframe *st;
  size_t sp, cap_st;
} slist;

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return NF_OK;
  uint32_t nc = *cap ? *cap : 64;
  while (nc < need) {
    if (nc > UINT32_MAX / 2) return NF_ENOMEM;
    nc *= 2;
  }
  void *np = realloc(*p, (size_t)nc * elem);
  if (!np) return NF_ENOMEM;
  *p = np;
  *cap = nc;
  return NF_OK;
}

static int spush(slist *L, const nf_expr *e) {
  if (nf_ptrmap_put(L->pos, e, UINT64_MAX)) return NF_ENOMEM;
  if (L->sp == L->cap_st) {
    size_t nc = L->cap_st ? L->cap_st * 2 : 256;
    pframe *ns = realloc(L->st, nc * sizeof(*ns));
    if (!ns) return NF_ENOMEM;
    L->st = ns;
    L->cap_st = nc;
  }
  L->st[L->sp].e = e;
  L->st[L->sp].next = 0;
  L->sp++;
  return NF_OK;
}

/* Collects root's DAG (nodes of a validated graph: no NULL arguments). */
static int collect(slist *L, const nf_expr *root) {
  nf_ptrmap_clear(L->pos);
  L->count = L->n_apos = 0;
  L->sp = 0;
  int rc = spush(L, root);
  while (!rc && L->sp) {
    pframe *f = &L->st[L->sp - 1];
    const nf_expr *e = f->e;
    if (f->next < e->n_args) {
      const nf_expr *a = e->args[f->next++];
      if (!nf_ptrmap_get(L->pos, a, NULL)) rc = spush(L, a);
      continue;
    }
    L->sp--;
    uint32_t p = L->count;
    if ((rc = grow((void **)&L->n, &L->cap_n, p + 1, sizeof(*L->n))) ||
        (rc = grow((void **)&L->aoff, &L->cap_aoff, p + 1, sizeof(*L->aoff))) ||
        (rc = grow((void **)&L->apos, &L->cap_apos, L->n_apos + e->n_args,
                   sizeof(*L->apos))))
      return rc;
    L->n[p] = e;
    L->aoff[p] = L->n_apos;
    for (int k = 0; k < e->n_args; k++) {
      uint64_t q = 0;
      (void)nf_ptrmap_get(L->pos, e->args[k], &q);
      L->apos[L->n_apos++] = (uint32_t)q; /* finished: q < p */
    }
    L->count++;
    rc = nf_ptrmap_put(L->pos, e, p);
  }
  return rc;
}

static void slist_free(slist *L) {
  free(L->n);
  free(L->aoff);
  free(L->apos);
  free(L->st);
  nf_ptrmap_delete(L->pos);
}

static uint32_t argpos(const slist *L, uint32_t p, int k) {
  return L->apos[L->aoff[p] + (uint32_t)k];
}

/* The statement's variable ranges; 0 when its box is empty (nothing in
 * its right side is ever evaluated). */
static int stmt_ranges(const nf_graph *g, const nf_stmt *s, nf_range *r, int *nv) {
  const nf_tensor *t = &g->tensors[s->out];
  int n = 0, empty = 0;
  for (int d = 0; d < t->rank; d++, n++) {
    r[n].lo = 0;
    r[n].hi = t->shape[d] - 1;
    if (t->shape[d] == 0) empty = 1;
  }
  for (int k = 0; k < s->n_red; k++, n++) {
    r[n].lo = r[n].hi = s->red_lo[k];
    if (s->red_ext[k] == 0)
      empty = 1;
    else
      r[n].hi += s->red_ext[k] - 1; /* validated: lo + ext does not overflow */
  }
  *nv = n;
  return !empty;
}

static const char *tname(const nf_graph *g, uint32_t t) {
  return g->tensors[t].name ? g->tensors[t].name : "?";
}

/* ---- cost ---- */

static int is_leaf(const nf_expr *e) {
  return e->op == NF_OP_CONST || e->op == NF_OP_VAR || e->op == NF_OP_ACCESS;
}

static int is_float_op(const nf_expr *e) {
  if (is_leaf(e)) return 0;
  if (nf_dtype_is_float((nf_dtype)e->dtype)) return 1;
  /* a comparison of floats */
  return e->op >= NF_OP_LT && e->op <= NF_OP_NE &&
         nf_dtype_is_float((nf_dtype)e->args[0]->dtype);
}

/* See nf_ir.h. */
int nf_graph_measure(const nf_graph *g, nf_graph_cost *out) {
  memset(out, 0, sizeof(*out));
  slist L = {0};
  L.pos = nf_ptrmap_new();
  uint32_t *tdepth = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*tdepth));
  uint32_t *h = NULL, cap_h = 0;
  int rc = L.pos && tdepth ? NF_OK : NF_ENOMEM;
  double best_flops = -1;
  for (uint32_t i = 0; !rc && i < g->n_tensors; i++) {
    int64_t n = nf_tensor_numel(&g->tensors[i]);
    out->elements += n < 0 ? 9.3e18 : (double)n;
  }
  for (uint32_t si = 0; !rc && si < g->n_stmts; si++) {
    const nf_stmt *s = &g->stmts[si];
    if ((rc = collect(&L, s->rhs))) break;
    if ((rc = grow((void **)&h, &cap_h, L.count, sizeof(*h)))) break;
    uint32_t ops = 0;
    for (uint32_t p = 0; p < L.count; p++) {
      const nf_expr *e = L.n[p];
      uint32_t hp = 0;
      for (int k = 0; k < e->n_args; k++) {
        uint32_t ha = h[argpos(&L, p, k)];
        if (ha > hp) hp = ha;
      }
      /* an inlinable producer substituted here: its right side, with
       * these indices (at most hp tall) in place of its variables (1) */
      uint64_t hn = (uint64_t)hp + 1;
      if (e->op == NF_OP_ACCESS && tdepth[e->u.tensor])
        hn = (uint64_t)tdepth[e->u.tensor] + (hp ? hp - 1 : 0);
      h[p] = hn >= UINT32_MAX / 4 ? UINT32_MAX / 4 : (uint32_t)hn;
      ops += (uint32_t)is_float_op(e);
    }
    uint32_t d = h[L.count - 1];
    const nf_tensor *t = &g->tensors[s->out];
    if (t->kind == NF_T_LOCAL && s->red == NF_RED_NONE && s->n_red == 0) tdepth[s->out] = d;
    if (d > out->depth) {
      out->depth = d;
      out->depth_stmt = si;
    }
    double points = 1;
    for (int k = 0; k < t->rank; k++) points *= (double)t->shape[k];
    for (int k = 0; k < s->n_red; k++) points *= (double)s->red_ext[k];
    if (s->red != NF_RED_NONE) ops++;
    double f = points * (double)(ops ? ops : 1);
    out->flops += f;
    if (f > best_flops) {
      best_flops = f;
      out->flops_stmt = si;
    }
  }
  free(h);
  free(tdepth);
  slist_free(&L);
  return rc;
}

/* ---- linear forms over atoms ---- */

/* c + sum coef[i] * atom[i]; an atom is a VAR or any subterm that is not
 * i64 +, -, neg, or * by a constant. */
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

/* l += scale * e, with an explicit bounded stack; 0 when it gives up
 * (overflow, too many atoms or subterms). */
static int lin_add_expr(lin *l, const nf_expr *e, int64_t scale) {
  struct {
    const nf_expr *e;
    int64_t s;
  } st[LIN_STACK];
  int sp = 0, steps = 0;
  st[sp].e = e;
  st[sp++].s = scale;
  while (sp) {
    sp--;
    const nf_expr *x = st[sp].e;
    int64_t s = st[sp].s, t;
    if (++steps > LIN_STEPS) return 0;
    int expand = x->dtype == NF_I64;
    if (expand && x->op == NF_OP_CONST) {
      if (__builtin_mul_overflow(x->u.i, s, &t) || __builtin_add_overflow(l->c, t, &l->c))
        return 0;
      continue;
    }
    if (expand && (x->op == NF_OP_ADD || x->op == NF_OP_SUB)) {
      if (sp + 2 > LIN_STACK || (x->op == NF_OP_SUB && s == INT64_MIN)) return 0;
      st[sp].e = x->args[0];
      st[sp++].s = s;
      st[sp].e = x->args[1];
      st[sp++].s = x->op == NF_OP_SUB ? -s : s;
      continue;
    }
    if (expand && x->op == NF_OP_NEG) {
      if (s == INT64_MIN) return 0;
      st[sp].e = x->args[0];
      st[sp++].s = -s;
      continue;
    }
    if (expand && x->op == NF_OP_MUL) {
      int c = x->args[0]->op == NF_OP_CONST ? 0 : x->args[1]->op == NF_OP_CONST ? 1 : -1;
      if (c >= 0) {
        if (__builtin_mul_overflow(x->args[c]->u.i, s, &t)) return 0;
        st[sp].e = x->args[1 - c];
        st[sp++].s = t;
        continue;
      }
    }
    if (!lin_term(l, x, s)) return 0;
  }
  return 1;
}

/* l += m * f */
static int lin_add_lin(lin *l, const lin *f, int64_t m) {
  int64_t t;
  for (int i = 0; i < f->n; i++)
    if (__builtin_mul_overflow(f->coef[i], m, &t) || !lin_term(l, f->atom[i], t)) return 0;
  return !__builtin_mul_overflow(f->c, m, &t) && !__builtin_add_overflow(l->c, t, &l->c);
}

/* ---- the prover ---- */

/* A fact that holds wherever the access is evaluated: lo <= d <= hi, an
 * end at INT64_MIN / INT64_MAX being open. */
typedef struct fact {
  lin d;
  int64_t lo, hi;
} fact;

typedef struct prover {
  nf_range r[NF_MAX_VARS]; /* variable ranges, refined by the facts */
  int nv;
  fact f[MAX_FACTS];
  int n_facts;
  const nf_expr *ov_atom[MAX_OVERRIDES]; /* atoms bounded by facts */
  nf_range ov[MAX_OVERRIDES];
  int n_ov;
  int refined; /* some variable range is narrower than the statement's */
  int empty;   /* the facts contradict the ranges: never evaluated */
  bwork *W;    /* the statement's bounds cache and the work count */
} prover;

static int base_bounds(bwork *W, const nf_expr *a, nf_range *out);
static int refined_bounds(bwork *W, const nf_expr *a, const nf_range *r, int nv, nf_range *out);

static int atom_range(const prover *P, const nf_expr *a, nf_range *out) {
  if (a->op == NF_OP_VAR) {
    if (a->u.var >= (uint32_t)P->nv) return 0;
    *out = P->r[a->u.var];
    return 1;
  }
  nf_range b;
  int have = P->refined ? refined_bounds(P->W, a, P->r, P->nv, &b) : base_bounds(P->W, a, &b);
  for (int i = 0; i < P->n_ov; i++) {
    if (P->ov_atom[i] != a) continue;
    if (!have) {
      b = P->ov[i];
      have = 1;
    } else {
      if (P->ov[i].lo > b.lo) b.lo = P->ov[i].lo;
      if (P->ov[i].hi < b.hi) b.hi = P->ov[i].hi;
    }
  }
  if (have) *out = b;
  return have;
}

/* Interval of l from its atoms' ranges: has_lo/has_hi say which ends are
 * known (both or neither: every atom has a finite range or l is unknown);
 * 0 when unknown or outside int64. */
static int lin_interval(const prover *P, const lin *l, int64_t *lo, int64_t *hi) {
  __int128 a = l->c, b = l->c;
  for (int i = 0; i < l->n; i++) {
    nf_range r;
    if (!atom_range(P, l->atom[i], &r)) return 0;
    __int128 x = (__int128)l->coef[i] * r.lo, y = (__int128)l->coef[i] * r.hi;
    a += x < y ? x : y;
    b += x < y ? y : x;
  }
  if (a < INT64_MIN || b > INT64_MAX) return 0;
  *lo = (int64_t)a;
  *hi = (int64_t)b;
  return 1;
}

static int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) q--;
  return q;
}

static int64_t cdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) == (b < 0))) q++;
  return q;
}

/* Narrows range *v by k * v + c in [lo, hi] (open ends skipped; k != 0). */
static void narrow(nf_range *v, int64_t k, int64_t c, int64_t lo, int64_t hi) {
  int64_t t;
  if (lo != INT64_MIN && !__builtin_sub_overflow(lo, c, &t) && !(k == -1 && t == INT64_MIN)) {
    if (k > 0) {
      int64_t m = cdiv(t, k);
      if (m > v->lo) v->lo = m;
    } else {
      int64_t m = fdiv(t, k);
      if (m < v->hi) v->hi = m;
    }
  }
  if (hi != INT64_MAX && !__builtin_sub_overflow(hi, c, &t) && !(k == -1 && t == INT64_MIN)) {
    if (k > 0) {
      int64_t m = fdiv(t, k);
      if (m < v->hi) v->hi = m;
    } else {
      int64_t m = cdiv(t, k);
      if (m > v->lo) v->lo = m;
    }
  }
}

/* Adds a - b in [lo, hi] as a fact when both sides are linear forms whose
 * values are exact (their intervals fit in int64 over the statement's
 * box, so no wrapping happened). */
static void add_cmp_fact(prover *P, const nf_expr *a, const nf_expr *b, int64_t lo,
                         int64_t hi) {
  if (P->n_facts == MAX_FACTS || !nf_dtype_is_int((nf_dtype)a->dtype)) return;
  lin la, lb;
  int64_t x, y;
  memset(&la, 0, sizeof(la));
  memset(&lb, 0, sizeof(lb));
  if (!lin_add_expr(&la, a, 1) || !lin_add_expr(&lb, b, 1) || !lin_interval(P, &la, &x, &y) ||
      !lin_interval(P, &lb, &x, &y) || !lin_add_lin(&la, &lb, -1))
    return;
  fact *f = &P->f[P->n_facts++];
  f->d = la;
  f->lo = lo;
  f->hi = hi;
}

/* The facts of condition c being `pol` (1 true, 0 false). */
static void add_cond(prover *P, const nf_expr *c, int pol) {
  struct {
    const nf_expr *e;
    int pol;
  } st[MAX_FACTS];
  int sp = 0;
  st[sp].e = c;
  st[sp++].pol = pol;
  while (sp && P->n_facts < MAX_FACTS) {
    sp--;
    const nf_expr *e = st[sp].e;
    int p = st[sp].pol;
    if (e->op == NF_OP_NOT) {
      st[sp].e = e->args[0];
      st[sp++].pol = !p;
      continue;
    }
    if ((e->op == NF_OP_AND && p) || (e->op == NF_OP_OR && !p)) {
      if (sp + 2 > MAX_FACTS) continue;
      st[sp].e = e->args[0];
      st[sp++].pol = p;
      st[sp].e = e->args[1];
      st[sp++].pol = p;
      continue;
    }
    int op = e->op;
    if (!p) {
      switch (op) {
      case NF_OP_LT: op = NF_OP_GE; break;
      case NF_OP_LE: op = NF_OP_GT; break;
      case NF_OP_GT: op = NF_OP_LE; break;
      case NF_OP_GE: op = NF_OP_LT; break;
      case NF_OP_NE: op = NF_OP_EQ; break;
      default: continue;
      }
    }
    switch (op) {
    case NF_OP_LT: add_cmp_fact(P, e->args[0], e->args[1], INT64_MIN, -1); break;
    case NF_OP_LE: add_cmp_fact(P, e->args[0], e->args[1], INT64_MIN, 0); break;
    case NF_OP_GT: add_cmp_fact(P, e->args[0], e->args[1], 1, INT64_MAX); break;
    case NF_OP_GE: add_cmp_fact(P, e->args[0], e->args[1], 0, INT64_MAX); break;
    case NF_OP_EQ: add_cmp_fact(P, e->args[0], e->args[1], 0, 0); break;
    default: break;
    }
  }
}

/* Narrows variable ranges and atom bounds by the single-atom facts
 * (twice: a narrowed variable can narrow an atom's bounds). */
static void refine(prover *P) {
  for (int pass = 0; pass < 2 && !P->empty; pass++)
    for (int i = 0; i < P->n_facts; i++) {
      const fact *f = &P->f[i];
      if (f->d.n != 1) continue;
      const nf_expr *a = f->d.atom[0];
      nf_range v;
      if (a->op == NF_OP_VAR) {
        narrow(&P->r[a->u.var], f->d.coef[0], f->d.c, f->lo, f->hi);
        v = P->r[a->u.var];
      } else {
        int k = 0;
        while (k < P->n_ov && P->ov_atom[k] != a) k++;
        if (k == P->n_ov) {
          if (k == MAX_OVERRIDES) continue;
          P->ov_atom[k] = a;
          P->ov[k].lo = INT64_MIN;
          P->ov[k].hi = INT64_MAX;
          P->n_ov++;
        }
        narrow(&P->ov[k], f->d.coef[0], f->d.c, f->lo, f->hi);
        v = P->ov[k];
      }
      if (v.lo > v.hi) P->empty = 1;
    }
  for (int v = 0; v < P->nv; v++)
    if (P->r[v].lo > P->r[v].hi) P->empty = 1;
}

/* Marks P refined when a variable range changed (atoms are then bounded
 * again with the narrower ranges, not from the statement's cache). */
static void note_refined(prover *P, const nf_range *base) {
  for (int v = 0; v < P->nv; v++)
    if (P->r[v].lo != base[v].lo || P->r[v].hi != base[v].hi) P->refined = 1;
}

/* The facts that define the floor divisions by a constant among l's
 * atoms, F = a // c (0 < c <= 2^40): 0 <= a - c F <= c - 1, where a is
 * exact (its interval fits in int64).  With them `x - (x // 8) * 8` and
 * the index `x + 2 r - 2 ((x + 1) // 2) + 1` of a strided convolution's
 * data gradient are bounded.  Appends to f[*n] (room for LIN_MAX). */
static void div_facts(const prover *P, const lin *l, fact *f, int *n) {
  for (int i = 0; i < l->n; i++) {
    const nf_expr *F = l->atom[i];
    if (F->op != NF_OP_FLOORDIV || F->dtype != NF_I64 || F->args[1]->op != NF_OP_CONST ||
        F->args[1]->u.i <= 0 || F->args[1]->u.i > ((int64_t)1 << 40))
      continue;
    int64_t c = F->args[1]->u.i, lo, hi;
    lin d;
    memset(&d, 0, sizeof(d));
    if (!lin_add_expr(&d, F->args[0], 1) || !lin_interval(P, &d, &lo, &hi) ||
        !lin_term(&d, F, -c))
      continue;
    f[*n].d = d;
    f[*n].lo = 0;
    f[*n].hi = c - 1;
    (*n)++;
  }
}

/* 1 when index e lies in [0, size) wherever P's facts hold. */
static int prove_index(const prover *P, const nf_expr *e, int64_t size) {
  if (P->empty) return 1;
  lin L;
  memset(&L, 0, sizeof(L));
  int64_t lo = 0, hi = 0;
  int have_lo = 0, have_hi = 0;
  if (!lin_add_expr(&L, e, 1)) {
    nf_range b;
    return atom_range(P, e, &b) && b.lo >= 0 && b.hi < size;
  }
  if (lin_interval(P, &L, &lo, &hi)) have_lo = have_hi = 1;
  fact dfacts[LIN_MAX];
  int n_div = 0;
  div_facts(P, &L, dfacts, &n_div);
  /* L = m * d + (L - m * d) for each fact d and multiplier m that cancels
   * an atom they share: one step of Fourier-Motzkin, which proves the
   * guards of padding, of shifted windows and of loop splits. */
  for (int i = 0; i < P->n_facts + n_div; i++) {
    const fact *f = i < P->n_facts ? &P->f[i] : &dfacts[i - P->n_facts];
    for (int a = 0; a < L.n; a++)
      for (int b = 0; b < f->d.n; b++) {
        if (f->d.atom[b] != L.atom[a] || (f->d.coef[b] == -1 && L.coef[a] == INT64_MIN) ||
            L.coef[a] % f->d.coef[b] != 0)
          continue;
        int64_t m = L.coef[a] / f->d.coef[b], rlo, rhi, t;
        lin R = L;
        if (m == INT64_MIN || !lin_add_lin(&R, &f->d, -m) || !lin_interval(P, &R, &rlo, &rhi))
          continue;
        int64_t flo = m > 0 ? f->lo : f->hi, fhi = m > 0 ? f->hi : f->lo;
        int lo_open = m > 0 ? f->lo == INT64_MIN : f->hi == INT64_MAX;
        int hi_open = m > 0 ? f->hi == INT64_MAX : f->lo == INT64_MIN;
        if (!lo_open && !__builtin_mul_overflow(m, flo, &t) && !__builtin_add_overflow(t, rlo, &t) &&
            (!have_lo || t > lo)) {
          lo = t;
          have_lo = 1;
        }
        if (!hi_open && !__builtin_mul_overflow(m, fhi, &t) && !__builtin_add_overflow(t, rhi, &t) &&
            (!have_hi || t < hi)) {
          hi = t;
          have_hi = 1;
        }
      }
  }
  return have_lo && have_hi && lo >= 0 && hi < size;
}

/* ---- contexts: the select conditions that hold at a node ---- */

typedef struct gctx {
  const nf_expr *cond;
  int32_t parent; /* -1 for the root context */
  uint8_t pol;
  uint8_t depth;
} gctx;

typedef struct ctxpool {
  gctx *c;
  uint32_t n, cap;
  uint32_t *tab;  /* open addressing on (cond, pol, parent): index */
  uint32_t *tgen; /* a slot is used when its tgen is gen */
  uint32_t cap_tab, gen;
} ctxpool;

/* Forgets every context but the root (a new statement). */
static void ctx_reset(ctxpool *C) {
  C->n = 1;
  C->gen++;
}

static uint32_t ctx_slot(const nf_expr *cond, int pol, int32_t parent, uint32_t cap) {
  uint64_t h = nf_mix64((uint64_t)(uintptr_t)cond ^ ((uint64_t)(uint32_t)parent << 1) ^
                            (uint64_t)pol);
  return (uint32_t)h & (cap - 1);
}

/* The context `parent, then cond is pol`; -2 when out of memory. */
static int32_t ctx_child(ctxpool *C, int32_t parent, const nf_expr *cond, int pol) {
  if (C->c[parent].depth >= MAX_CTX_DEPTH) return parent;
  if ((C->n + 1) * 2 > C->cap_tab) {
    uint32_t nc = C->cap_tab ? C->cap_tab * 2 : 256;
    uint32_t *nt = malloc(nc * sizeof(*nt)), *ng = calloc(nc, sizeof(*ng));
    if (!nt || !ng) {
      free(nt);
      free(ng);
      return -2;
    }
    for (uint32_t i = 1; i < C->n; i++) {
      uint32_t j = ctx_slot(C->c[i].cond, C->c[i].pol, C->c[i].parent, nc);
      while (ng[j] == C->gen) j = (j + 1) & (nc - 1);
      nt[j] = i;
      ng[j] = C->gen;
    }
    free(C->tab);
    free(C->tgen);
    C->tab = nt;
    C->tgen = ng;
    C->cap_tab = nc;
  }
  uint32_t j = ctx_slot(cond, pol, parent, C->cap_tab);
  for (; C->tgen[j] == C->gen; j = (j + 1) & (C->cap_tab - 1)) {
    const gctx *x = &C->c[C->tab[j]];
    if (x->cond == cond && x->pol == pol && x->parent == parent) return (int32_t)C->tab[j];
  }
  if (grow((void **)&C->c, &C->cap, C->n + 1, sizeof(*C->c))) return -2;
  gctx *x = &C->c[C->n];
  x->cond = cond;
  x->pol = (uint8_t)pol;
  x->parent = parent;
  x->depth = (uint8_t)(C->c[parent].depth + 1);
  C->tab[j] = C->n;
  C->tgen[j] = C->gen;
  return (int32_t)C->n++;
}

/* The deepest context both a and b extend. */
static int32_t ctx_meet(const ctxpool *C, int32_t a, int32_t b, uint64_t *work) {
  while (a != b) {
    (*work)++;
    if (C->c[a].depth >= C->c[b].depth)
      a = C->c[a].parent;
    else
      b = C->c[b].parent;
  }
  return a;
}

static void prover_init(prover *P, bwork *W, const ctxpool *C, int32_t cx, const nf_range *r,
                        int nv) {
  memset(P, 0, sizeof(*P));
  memcpy(P->r, r, (size_t)nv * sizeof(*r));
  P->nv = nv;
  P->W = W;
  for (int32_t c = cx; c > 0 && P->n_facts < MAX_FACTS; c = C->c[c].parent)
    add_cond(P, C->c[c].cond, C->c[c].pol);
  refine(P);
  note_refined(P, r);
}

/* ---- evaluation at a point, by the interpreter's rules ---- */

static int64_t wrap32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

/* Value of node e given its arguments' (known: 1, else 0). */
static int eval_node(const nf_expr *e, const int64_t *a, const uint8_t *ak, const int64_t *pt,
                     int64_t *out) {
  nf_dtype t = (nf_dtype)e->dtype;
  if (nf_dtype_is_float(t)) return 0;
  for (int k = 0; k < e->n_args && k < 3; k++)
    if (e->op != NF_OP_SELECT && !ak[k]) return 0;
  uint64_t x = e->n_args > 0 ? (uint64_t)a[0] : 0, y = e->n_args > 1 ? (uint64_t)a[1] : 0;
  int64_t v;
  switch (e->op) {
  case NF_OP_CONST: v = e->u.i; break;
  case NF_OP_VAR: v = pt[e->u.var]; break;
  case NF_OP_NEG: v = (int64_t)(0 - x); break;
  case NF_OP_NOT: v = !x; break;
  case NF_OP_ABS: v = (int64_t)x < 0 ? (int64_t)(0 - x) : (int64_t)x; break;
  case NF_OP_FLOOR:
  case NF_OP_CEIL:
  case NF_OP_STOPGRAD: v = (int64_t)x; break;
  case NF_OP_CAST:
    if (nf_dtype_is_float((nf_dtype)e->args[0]->dtype)) return 0;
    v = t == NF_BOOL ? x != 0 : (int64_t)x;
    break;
  case NF_OP_ADD: v = (int64_t)(x + y); break;
  case NF_OP_SUB: v = (int64_t)(x - y); break;
  case NF_OP_MUL: v = (int64_t)(x * y); break;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD: {
    int64_t p = (int64_t)x, q = (int64_t)y, d, m;
    if (q == 0) return 0; /* an evaluation error, not the one sought */
    if (q == -1) {
      d = (int64_t)(0 - x);
      m = 0;
    } else {
      d = p / q;
      m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) {
        d--;
        m += q;
      }
    }
    v = e->op == NF_OP_MOD ? m : d;
    break;
  }
  case NF_OP_MIN: v = (int64_t)x < (int64_t)y ? (int64_t)x : (int64_t)y; break;
  case NF_OP_MAX: v = (int64_t)x > (int64_t)y ? (int64_t)x : (int64_t)y; break;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE: {
    if (nf_dtype_is_float((nf_dtype)e->args[0]->dtype)) return 0;
    int64_t p = (int64_t)x, q = (int64_t)y;
    v = e->op == NF_OP_LT ? p < q : e->op == NF_OP_LE ? p <= q : e->op == NF_OP_GT ? p > q
      : e->op == NF_OP_GE ? p >= q : e->op == NF_OP_EQ ? p == q : p != q;
    break;
  }
  case NF_OP_AND: v = x && y; break;
  case NF_OP_OR: v = x || y; break;
  case NF_OP_SELECT:
    if (!ak[0] || !ak[x ? 1 : 2]) return 0;
    v = a[x ? 1 : 2];
    break;
  default: return 0; /* ACCESS: data */
  }
  if (t == NF_I32) v = wrap32(v);
  if (t == NF_BOOL) v = v != 0;
  *out = v;
  return 1;
}

/* The bounds check's scratch, per statement (arrays by position). */
struct bwork {
  const nf_graph *g;
  nf_buf *err;
  slist L;
  ctxpool C;
  int32_t *cx;    /* context */
  uint8_t *rd;    /* reads a tensor */
  uint32_t *sz;   /* tree size, saturated at the node count: what a walk
                     below it may visit */
  uint8_t *bst;   /* base bounds: 0 not computed, 1 known, 2 unknown */
  nf_range *bval; /* base bounds (over the statement's box) */
  int64_t *val;   /* value at the point */
  uint8_t *kn;    /* value known */
  uint8_t *sure;  /* certainly evaluated at the point */
  uint32_t cap_cx, cap_rd, cap_sz, cap_bst, cap_bval, cap_val, cap_kn, cap_sure;
  const nf_range *r; /* the statement's variable ranges */
  int nv;
  uint64_t work;
};

/* What a walk below a (a node of the statement) may cost. */
static uint32_t walk_cost(bwork *W, const nf_expr *a) {
  uint64_t q;
  return nf_ptrmap_get(W->L.pos, a, &q) ? W->sz[q] : W->L.count;
}

/* nf_expr_bounds of a over ranges r, charged. */
static int refined_bounds(bwork *W, const nf_expr *a, const nf_range *r, int nv, nf_range *out) {
  W->work += walk_cost(W, a);
  return nf_expr_bounds(a, r, nv, out);
}

/* a's bounds over the statement's box, computed once per statement. */
static int base_bounds(bwork *W, const nf_expr *a, nf_range *out) {
  uint64_t q;
  if (!nf_ptrmap_get(W->L.pos, a, &q)) return refined_bounds(W, a, W->r, W->nv, out);
  if (!W->bst[q]) W->bst[q] = refined_bounds(W, a, W->r, W->nv, &W->bval[q]) ? 1 : 2;
  if (W->bst[q] != 1) return 0;
  *out = W->bval[q];
  return 1;
}

/* Evaluates the statement at point pt; returns the position of an access
 * certainly evaluated out of bounds (its index dimension in *dim), or -1. */
static int64_t eval_point(bwork *W, const int64_t *pt, int *dim) {
  slist *L = &W->L;
  W->work += 2 * (uint64_t)L->count;
  for (uint32_t p = 0; p < L->count; p++) {
    const nf_expr *e = L->n[p];
    int64_t a[3] = {0, 0, 0};
    uint8_t ak[3] = {0, 0, 0};
    for (int k = 0; k < e->n_args && k < 3; k++) {
      uint32_t q = argpos(L, p, k);
      a[k] = W->val[q];
      ak[k] = W->kn[q];
    }
    W->kn[p] = (uint8_t)(e->op != NF_OP_ACCESS && eval_node(e, a, ak, pt, &W->val[p]));
  }
  memset(W->sure, 0, L->count);
  W->sure[L->count - 1] = 1;
  for (uint32_t p = L->count; p-- > 0;) {
    const nf_expr *e = L->n[p];
    if (!W->sure[p]) continue;
    if (e->op == NF_OP_ACCESS) {
      const nf_tensor *t = &W->g->tensors[e->u.tensor];
      for (int k = 0; k < e->n_args; k++) {
        uint32_t q = argpos(L, p, k);
        if (W->kn[q] && (W->val[q] < 0 || W->val[q] >= t->shape[k])) {
          *dim = k;
          return p;
        }
      }
    }
    if (e->op == NF_OP_SELECT) {
      uint32_t c = argpos(L, p, 0);
      W->sure[c] = 1;
      if (W->kn[c]) W->sure[argpos(L, p, W->val[c] ? 1 : 2)] = 1;
      continue;
    }
    for (int k = 0; k < e->n_args; k++) W->sure[argpos(L, p, k)] = 1;
  }
  return -1;
}

/* ---- messages ---- */

static void var_name(const nf_stmt *s, uint32_t v, nf_buf *b) {
  if (v < NF_MAX_VARS && s->var_names[v])
    nf_buf_puts(b, s->var_names[v]);
  else
    nf_buf_printf(b, "v%u", v);
}

/* Prints e, PRINT_DEPTH levels at most ("..." below); an operator in
 * parentheses when paren (it is an operand of another). */
static void print_expr(const nf_graph *g, const nf_stmt *s, const nf_expr *e, int depth,
                       int paren, nf_buf *b) {
  if (depth >= PRINT_DEPTH) {
    nf_buf_puts(b, "...");
    return;
  }
  nf_op op = (nf_op)e->op;
  int infix = e->n_args == 2 && op != NF_OP_MIN && op != NF_OP_MAX && op != NF_OP_POW;
  switch (op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float((nf_dtype)e->dtype))
      nf_buf_printf(b, "%g", e->u.f);
    else
      nf_buf_printf(b, "%lld", (long long)e->u.i);
    return;
  case NF_OP_VAR: var_name(s, e->u.var, b); return;
  case NF_OP_ACCESS:
  case NF_OP_CAST:
  case NF_OP_MIN:
  case NF_OP_MAX:
  case NF_OP_POW:
    nf_buf_puts(b, op == NF_OP_ACCESS ? tname(g, e->u.tensor)
                   : op == NF_OP_CAST ? nf_dtype_name((nf_dtype)e->dtype)
                                      : nf_op_name(op));
    nf_buf_putc(b, '(');
    for (int k = 0; k < e->n_args; k++) {
      if (k) nf_buf_puts(b, ", ");
      print_expr(g, s, e->args[k], depth + 1, 0, b);
    }
    nf_buf_putc(b, ')');
    return;
  default: break;
  }
  if (paren) nf_buf_putc(b, '(');
  if (infix) {
    print_expr(g, s, e->args[0], depth + 1, 1, b);
    nf_buf_printf(b, " %s ", nf_op_name(op));
    print_expr(g, s, e->args[1], depth + 1, 1, b);
  } else if (op == NF_OP_SELECT) {
    print_expr(g, s, e->args[0], depth + 1, 1, b);
    nf_buf_puts(b, " ? ");
    print_expr(g, s, e->args[1], depth + 1, 1, b);
    nf_buf_puts(b, " : ");
    print_expr(g, s, e->args[2], depth + 1, 1, b);
  } else { /* unary: -x, !x, exp(x), ... */
    const char *name = op == NF_OP_NEG ? "-" : nf_op_name(op);
    int fn = op != NF_OP_NEG && op != NF_OP_NOT;
    nf_buf_puts(b, name);
    if (fn) nf_buf_putc(b, '(');
    print_expr(g, s, e->args[0], depth + 1, !fn, b);
    if (fn) nf_buf_putc(b, ')');
  }
  if (paren) nf_buf_putc(b, ')');
}

/* The refusal: the statement, the access, the index, the point. */
static int report(bwork *W, uint32_t si, uint32_t p, int k, const int64_t *pt, int nv) {
  if (!W->err) return NF_EINVAL;
  const nf_graph *g = W->g;
  const nf_stmt *s = &g->stmts[si];
  const nf_expr *e = W->L.n[p];
  const nf_tensor *t = &g->tensors[e->u.tensor];
  nf_buf *b = W->err;
  nf_buf_printf(b, "statement %u (%s): ", si, tname(g, s->out));
  print_expr(g, s, e, 0, 0, b);
  nf_buf_printf(b, " reads out of bounds: index %d is %lld at ", k,
                (long long)W->val[argpos(&W->L, p, k)]);
  for (int v = 0; v < nv; v++) {
    if (v) nf_buf_puts(b, ", ");
    var_name(s, (uint32_t)v, b);
    nf_buf_printf(b, "=%lld", (long long)pt[v]);
  }
  nf_buf_printf(b, "; %s has size %lld in dimension %d", tname(g, e->u.tensor),
                (long long)t->shape[k], k);
  return NF_EINVAL;
}

/* ---- the bounds check ---- */

/* Candidate point n (0..3) for index idx: the corner of the box P leaves
 * that pushes idx up (n even) or down, the other variables at their low
 * (n < 2) or high end; for an index that is not affine, all low (0) and
 * all high (2).  0 when there is no such point. */
static int corner(const prover *P, const nf_expr *idx, int n, int64_t *pt) {
  nf_affine a;
  int affine = nf_expr_affine(idx, &a) == 1;
  int upper = (n & 1) == 0, rest_hi = (n & 2) != 0;
  for (int v = 0; v < P->nv; v++) pt[v] = rest_hi ? P->r[v].hi : P->r[v].lo;
  if (!affine) return n == 0 || n == 2;
  for (int i = 0; i < a.n; i++) {
    if (a.var[i] >= (uint32_t)P->nv) return 0;
    int up = (a.coef[i] > 0) == upper;
    pt[a.var[i]] = up ? P->r[a.var[i]].hi : P->r[a.var[i]].lo;
  }
  return 1;
}

static int check_stmt_bounds(bwork *W, uint32_t si) {
  const nf_graph *g = W->g;
  const nf_stmt *s = &g->stmts[si];
  nf_range r[NF_MAX_VARS];
  int nv, rc;
  if (!stmt_ranges(g, s, r, &nv)) return NF_OK; /* nothing is evaluated */
  W->r = r;
  W->nv = nv;
  slist *L = &W->L;
  if ((rc = collect(L, s->rhs))) return rc;
  uint32_t n = L->count;
  W->work += 4 * (uint64_t)n;
  if (grow((void **)&W->cx, &W->cap_cx, n, sizeof(*W->cx)) ||
      grow((void **)&W->rd, &W->cap_rd, n, 1) ||
      grow((void **)&W->sz, &W->cap_sz, n, sizeof(*W->sz)) ||
      grow((void **)&W->bst, &W->cap_bst, n, 1) ||
      grow((void **)&W->bval, &W->cap_bval, n, sizeof(*W->bval)) ||
      grow((void **)&W->val, &W->cap_val, n, sizeof(*W->val)) ||
      grow((void **)&W->kn, &W->cap_kn, n, 1) || grow((void **)&W->sure, &W->cap_sure, n, 1))
    return NF_ENOMEM;
  /* contexts, users before arguments (reverse post-order) */
  ctxpool *C = &W->C;
  ctx_reset(C);
  for (uint32_t p = 0; p < n; p++) W->cx[p] = -1;
  W->cx[n - 1] = 0;
  for (uint32_t p = n; p-- > 0;) {
    const nf_expr *e = L->n[p];
    for (int k = 0; k < e->n_args; k++) {
      int32_t in = W->cx[p];
      if (e->op == NF_OP_SELECT && k > 0) in = ctx_child(C, in, e->args[0], k == 1);
      if (in == -2) return NF_ENOMEM;
      uint32_t q = argpos(L, p, k);
      W->cx[q] = W->cx[q] < 0 ? in : ctx_meet(C, W->cx[q], in, &W->work);
    }
    if (W->work >= WORK_BUDGET) return NF_OK;
  }
  /* which subterms read tensors (their values are data), and sizes */
  memset(W->bst, 0, n);
  for (uint32_t p = 0; p < n; p++) {
    const nf_expr *e = L->n[p];
    uint8_t x = e->op == NF_OP_ACCESS;
    uint64_t z = 1;
    for (int k = 0; k < e->n_args; k++) {
      uint32_t q = argpos(L, p, k);
      x |= W->rd[q];
      z += W->sz[q];
    }
    W->rd[p] = x;
    W->sz[p] = z > n ? n : (uint32_t)z;
  }
  /* prove each index, or look for a point that refutes it */
  int64_t pt[NF_MAX_VARS];
  int dim = 0, unproven = 0;
  int64_t hit = -1;
  prover P;
  for (uint32_t p = 0; p < n && hit < 0 && W->work < WORK_BUDGET; p++) {
    const nf_expr *e = L->n[p];
    if (e->op != NF_OP_ACCESS || !e->n_args) continue;
    const nf_tensor *t = &g->tensors[e->u.tensor];
    int have_p = 0;
    for (int k = 0; k < e->n_args && hit < 0 && W->work < WORK_BUDGET; k++) {
      uint32_t q = argpos(L, p, k);
      if (W->rd[q]) continue; /* a gather: checked when it runs */
      if (!have_p) {
        prover_init(&P, W, C, W->cx[p], r, nv);
        W->work += 64 + (uint64_t)P.n_facts * 2 * LIN_STEPS;
        have_p = 1;
      }
      W->work += 64 + (uint64_t)P.n_facts * LIN_MAX * LIN_MAX;
      if (prove_index(&P, e->args[k], t->shape[k])) continue;
      unproven = 1;
      W->work += W->sz[q];
      for (int c = 0; c < 4 && hit < 0 && W->work < WORK_BUDGET; c++)
        if (corner(&P, e->args[k], c, pt)) hit = eval_point(W, pt, &dim);
    }
  }
  /* a small box: every point */
  double box = 1;
  for (int v = 0; v < nv; v++) box *= (double)(r[v].hi - r[v].lo + 1);
  if (hit < 0 && unproven && box <= ENUM_MAX && W->work + (uint64_t)box * 2 * n <= WORK_BUDGET) {
    for (int v = 0; v < nv; v++) pt[v] = r[v].lo;
    for (;;) {
      if ((hit = eval_point(W, pt, &dim)) >= 0) break;
      int v = nv - 1;
      while (v >= 0 && pt[v] == r[v].hi) pt[v] = r[v].lo, v--;
      if (v < 0) break;
      pt[v]++;
    }
  }
  if (hit < 0) return NF_OK;
  return report(W, si, (uint32_t)hit, dim, pt, nv);
}

/* See nf_ir.h. */
int nf_graph_check_bounds(const nf_graph *g, nf_buf *err) {
  bwork W;
  memset(&W, 0, sizeof(W));
  W.g = g;
  W.err = err;
  W.L.pos = nf_ptrmap_new();
  int rc = W.L.pos ? NF_OK : NF_ENOMEM;
  if (!rc && grow((void **)&W.C.c, &W.C.cap, 1, sizeof(*W.C.c))) rc = NF_ENOMEM;
  if (!rc) {
    W.C.c[0].cond = NULL;
    W.C.c[0].parent = -1;
    W.C.c[0].pol = 0;
    W.C.c[0].depth = 0;
    W.C.n = 1;
    W.C.gen = 1; /* calloc'd stamps (0) mark empty slots */
  }
  for (uint32_t si = 0; !rc && si < g->n_stmts && W.work < WORK_BUDGET; si++)
    rc = check_stmt_bounds(&W, si);
  if (rc == NF_ENOMEM && err) nf_buf_puts(err, "out of memory");
  slist_free(&W.L);
  free(W.C.c);
  free(W.C.tab);
  free(W.C.tgen);
  free(W.cx);
  free(W.rd);
  free(W.sz);
  free(W.bst);
  free(W.bval);
  free(W.val);
  free(W.kn);
  free(W.sure);
  return rc;
}
