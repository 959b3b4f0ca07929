/* invert.c - solving an access's index map for the statement's variables
 * (nf__invert, contract in nf_invert.h).
 *
 * Method.  Every index is normalised to an affine form over "unknowns":
 * the statement's variables plus, for each distinct `u // c` or `u % c`
 * (u affine in the unknowns, c a non-zero constant), a quotient q and a
 * remainder m tied by u - c*q - m = 0 with 0 <= m < c; a `//` and a `%`
 * of the same u and c share them, so nested forms work recursively.  The
 * equations index_k(x) = y_k and the q/m equations split into connected
 * components (unknowns linked through shared equations).  Each component
 * A x = b(y) is diagonalised, U A V = D with U and V unimodular; this
 * yields divisibility guards (U b)_i % d_i == 0, consistency guards
 * (U b)_i == 0 for the rows beyond the rank, a particular solution and a
 * basis of the null-space lattice (the last columns of V).
 *
 * The lattice basis is then brought to echelon form greedily: parameter l
 * follows the unknown x_j that allows the fewest values along it (E =
 * width_j / beta + 1 where beta is the gcd of that unknown's row in the
 * remaining basis columns), which picks kernel offsets rather than output
 * positions.  Column operations leave x_j = rest(y, t_<l) + beta * t_l, so
 * t_l = ceil((lo_j - rest) / beta) + t'_l with t'_l in [0, E): the lower
 * bound of x_j holds by construction and its upper bound needs a guard
 * only when (width_j + 1) is not a multiple of beta.  A parameter with
 * E == 1 is not a loop at all.  Every other range constraint (variables'
 * boxes, remainders' [0, c-1]) becomes a guard unless interval bounds
 * over the (y, t) box prove it.  Quotients' ranges are implied by the
 * others, so they may serve as a parameter's base but are never guarded.
 *
 * Expressions are assembled from "syms": exact affine combinations of the
 * result's variables and of opaque floor-division atoms.  A floor
 * division of a sym moves the multiples of the divisor out of the atom
 * and folds the atom when the bounds of the rest fix its value, so the
 * output stays close to what one would write by hand (and bounds prove
 * more guards); nf_simplify then puts everything in normal form.
 *
 * Invariants: every integer operation on coefficients is overflow-checked
 * (NF_EOVERFLOW, never UB); every divisor in an emitted expression is a
 * positive constant; every integer node of an emitted expression has
 * finite interval bounds over the (y, t) box, so evaluating it for any y
 * and t of the box neither divides by zero nor overflows.
 *
 * Not done here: non-affine maps (products of variables, data-dependent
 * indices, casts), which the caller turns into a flagged scatter.
 */
#include "nf_invert.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum {
  MAX_DM = 20,                         /* distinct (u, c) pairs */
  MAX_UNK = NF_MAX_VARS + 2 * MAX_DM,  /* unknowns */
  MAX_EQ = NF_MAX_RANK + MAX_DM,       /* equations */
  MAX_SEEN = 4 * MAX_DM,               /* memo of // and % nodes */
  MAX_ATOMS = MAX_UNK,                 /* atoms of one sym */
  MAX_CONDS = 4 * MAX_UNK + 2 * MAX_EQ,
  MAX_DEPTH = 48,                      /* nesting of non-affine nodes */
  MAX_WORK = 20000,                    /* nodes normalised per call */
  EFFICIENCY_LIMIT = 64                /* see check_efficiency */
};

/* Affine form over the unknowns. */
typedef struct lin {
  int64_t a[MAX_UNK];
  int64_t c;
} lin;

/* Affine form over y (the element of X). */
typedef struct yaff {
  int64_t a[NF_MAX_RANK];
  int64_t c;
} yaff;

/* Exact affine combination of result variables (y then t) and atoms. */
typedef struct sym {
  int64_t v[NF_MAX_VARS];
  int64_t c;
  int na;
  const nf_expr *at[MAX_ATOMS];
  int64_t ac[MAX_ATOMS];
} sym;

typedef struct unknown {
  int64_t lo, hi, w; /* w = hi - lo */
  int real;          /* a constraint to enforce (not a quotient's) */
  int used;          /* appears in some equation */
} unknown;

typedef struct dmpair {
  lin u;
  int64_t c; /* > 0 */
  int q, m;  /* unknown numbers */
} dmpair;

typedef struct dmseen {
  const nf_expr *e;
  int pair;
  int kind; /* 0: q, 1: m, 2: -m */
} dmseen;

/* One connected component of the equations. */
typedef struct comp {
  int n_u, n_r;
  int u[MAX_UNK];   /* global unknown numbers, increasing */
  int row[MAX_EQ];  /* equation numbers */
  int rank, p;      /* p = n_u - rank parameters */
  int64_t d[MAX_EQ];
  yaff b[MAX_EQ];   /* U b */
  int64_t V[MAX_UNK][MAX_UNK]; /* local unknown x column; columns from rank
                                  on hold the echelon lattice basis */
  int piv[MAX_UNK];            /* local unknown each parameter follows */
  int64_t E[MAX_UNK];          /* extent of each parameter */
  int tvar[MAX_UNK];           /* result variable of t', -1 when E == 1 */
} comp;

typedef struct inv {
  nf_ir_ctx *ctx;
  nf_buf *why;
  int n_vars, d;
  const int64_t *shape;
  int work;
  int n_unk;
  unknown uk[MAX_UNK];
  int n_dm;
  dmpair dm[MAX_DM];
  int n_seen;
  dmseen seen[MAX_SEEN];
  lin idx[NF_MAX_RANK];
  int n_eq;
  int64_t A[MAX_EQ][MAX_UNK];
  yaff b[MAX_EQ];
  int64_t M[MAX_EQ][MAX_UNK]; /* scratch of diagonalise */
  int n_comp;
  comp *comp;
  nf_range rng[NF_MAX_VARS]; /* ranges of the result's variables */
  int n_rv;                  /* d + n_t */
  int n_cond;
  const nf_expr *cond[MAX_CONDS];
  int never; /* a guard is always false */
} inv;

/* ---- small helpers ---- */

static int unsup(inv *w, const char *fmt, ...) NF_PRINTF(2, 3);
static int unsup(inv *w, const char *fmt, ...) {
  if (w->why) {
    va_list ap;
    va_start(ap, fmt);
    nf_buf_vprintf(w->why, fmt, ap);
    va_end(ap);
  }
  return NF_EUNSUPPORTED;
}

static uint64_t uabs(int64_t x) {
  return x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
}

static uint64_t ugcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Python floor division and modulo for b > 0. */
static int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && a < 0) q--;
  return q;
}

static int64_t fmod_(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r < 0 ? r + b : r;
}

/* *acc += k * x, overflow-checked. */
static int axpy(int64_t *acc, int64_t k, int64_t x) {
  int64_t p;
  if (__builtin_mul_overflow(k, x, &p) || __builtin_add_overflow(*acc, p, acc))
    return NF_EOVERFLOW;
  return NF_OK;
}

/* a * b with saturation at INT64_MAX (both >= 0). */
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int lin_axpy(lin *dst, int64_t k, const lin *src) {
  for (int j = 0; j < MAX_UNK; j++)
    if (src->a[j] && axpy(&dst->a[j], k, src->a[j])) return NF_EOVERFLOW;
  return axpy(&dst->c, k, src->c);
}

static int lin_scale(lin *x, int64_t k) {
  for (int j = 0; j < MAX_UNK; j++)
    if (__builtin_mul_overflow(x->a[j], k, &x->a[j])) return NF_EOVERFLOW;
  return __builtin_mul_overflow(x->c, k, &x->c) ? NF_EOVERFLOW : NF_OK;
}

static int lin_is_const(const lin *x) {
  for (int j = 0; j < MAX_UNK; j++)
    if (x->a[j]) return 0;
  return 1;
}

static int yaff_axpy(yaff *dst, int64_t k, const yaff *src) {
  for (int i = 0; i < NF_MAX_RANK; i++)
    if (src->a[i] && axpy(&dst->a[i], k, src->a[i])) return NF_EOVERFLOW;
  return axpy(&dst->c, k, src->c);
}

/* ---- normalisation of the indices ---- */

/* Interval of u over the unknowns' ranges. */
static int lin_interval(const inv *w, const lin *u, int64_t *lo, int64_t *hi) {
  int64_t l = u->c, h = u->c;
  for (int j = 0; j < w->n_unk; j++) {
    int64_t a = u->a[j];
    if (!a) continue;
    int64_t x, y;
    if (__builtin_mul_overflow(a, w->uk[j].lo, &x) ||
        __builtin_mul_overflow(a, w->uk[j].hi, &y))
      return NF_EOVERFLOW;
    if (x > y) {
      int64_t t = x;
      x = y;
      y = t;
    }
    if (__builtin_add_overflow(l, x, &l) || __builtin_add_overflow(h, y, &h))
      return NF_EOVERFLOW;
  }
  *lo = l;
  *hi = h;
  return NF_OK;
}

/* The pair of unknowns for u // c and u % c (c > 0), shared by equal
 * (u, c); *pair receives its number. */
static int get_pair(inv *w, int k, const lin *u, int64_t c, int *pair) {
  for (int i = 0; i < w->n_dm; i++)
    if (w->dm[i].c == c && memcmp(&w->dm[i].u, u, sizeof(*u)) == 0) {
      *pair = i;
      return NF_OK;
    }
  if (w->n_dm == MAX_DM)
    return unsup(w, "index %d uses more than %d distinct // and %% terms", k,
                  MAX_DM);
  int64_t lo, hi;
  int rc = lin_interval(w, u, &lo, &hi);
  if (rc) return rc;
  dmpair *p = &w->dm[w->n_dm];
  p->u = *u;
  p->c = c;
  p->q = w->n_unk++;
  p->m = w->n_unk++;
  unknown *q = &w->uk[p->q], *m = &w->uk[p->m];
  q->lo = fdiv(lo, c);
  q->hi = fdiv(hi, c);
  q->real = 0;
  if (__builtin_sub_overflow(q->hi, q->lo, &q->w)) return NF_EOVERFLOW;
  m->lo = 0;
  m->hi = c - 1;
  m->w = c - 1;
  m->real = 1;
  *pair = w->n_dm++;
  return NF_OK;
}

/* Normalises e (part of index k) to an affine form over the unknowns. */
static int norm(inv *w, int k, const nf_expr *e, int depth, lin *out) {
  memset(out, 0, sizeof(*out));
  if (++w->work > MAX_WORK)
    return unsup(w, "index %d is too large to invert", k);
  if (e->dtype != NF_I64)
    return unsup(w, "index %d is not affine: %s subterm", k,
                 nf_dtype_name((nf_dtype)e->dtype)
                     ? nf_dtype_name((nf_dtype)e->dtype)
                     : "non-integer");
  nf_affine af;
  int rc = nf_expr_affine(e, &af);
  if (rc < 0) return rc;
  if (rc == 1) {
    for (int i = 0; i < af.n; i++) {
      if (af.var[i] >= (uint32_t)w->n_vars) {
        if (w->why)
          nf_buf_printf(w->why, "index %d uses variable %u of %d", k,
                        (unsigned)af.var[i], w->n_vars);
        return NF_EINVAL;
      }
      out->a[af.var[i]] = af.coef[i];
    }
    out->c = af.c;
    return NF_OK;
  }
  if (depth >= MAX_DEPTH)
    return unsup(w, "index %d nests // and %% too deeply", k);
  nf_op op = (nf_op)e->op;
  switch (op) {
  case NF_OP_ACCESS:
    return unsup(w, "index %d of the access reads a tensor", k);
  case NF_OP_NEG:
    rc = norm(w, k, e->args[0], depth + 1, out);
    return rc ? rc : lin_scale(out, -1);
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL:
  case NF_OP_FLOORDIV:
  case NF_OP_MOD: {
    lin *r = malloc(sizeof(*r));
    if (!r) return NF_ENOMEM;
    int is_dm = op == NF_OP_FLOORDIV || op == NF_OP_MOD;
    if (is_dm) {
      for (int i = 0; i < w->n_seen; i++)
        if (w->seen[i].e == e) {
          const dmpair *p = &w->dm[w->seen[i].pair];
          int kind = w->seen[i].kind;
          out->a[kind == 0 ? p->q : p->m] = kind == 2 ? -1 : 1;
          free(r);
          return NF_OK;
        }
    }
    rc = norm(w, k, e->args[1], depth + 1, r);
    if (!rc && is_dm && !lin_is_const(r))
      rc = unsup(w, "index %d is not affine: division by a variable", k);
    if (!rc && is_dm && r->c == 0)
      rc = unsup(w, "index %d divides by zero", k);
    if (!rc) rc = norm(w, k, e->args[0], depth + 1, out);
    if (!rc && op == NF_OP_MUL) {
      if (lin_is_const(out)) {
        int64_t c = out->c;
        *out = *r;
        rc = lin_scale(out, c);
      } else if (lin_is_const(r)) {
        rc = lin_scale(out, r->c);
      } else {
        rc = unsup(w, "index %d is not affine: product of variables", k);
      }
    } else if (!rc && !is_dm) {
      rc = lin_axpy(out, op == NF_OP_ADD ? 1 : -1, r);
    } else if (!rc) {
      /* u // c == (-u) // (-c); u % c == -((-u) % (-c)). */
      int64_t c = r->c;
      int neg = c < 0;
      if (neg && c == INT64_MIN) rc = NF_EOVERFLOW;
      if (!rc && neg) {
        c = -c;
        rc = lin_scale(out, -1);
      }
      int pair = 0;
      if (!rc) rc = get_pair(w, k, out, c, &pair);
      if (!rc) {
        const dmpair *p = &w->dm[pair];
        int kind = op == NF_OP_FLOORDIV ? 0 : neg ? 2 : 1;
        memset(out, 0, sizeof(*out));
        out->a[kind == 0 ? p->q : p->m] = kind == 2 ? -1 : 1;
        if (w->n_seen < MAX_SEEN) {
          w->seen[w->n_seen].e = e;
          w->seen[w->n_seen].pair = pair;
          w->seen[w->n_seen++].kind = kind;
        }
      }
    }
    free(r);
    return rc;
  }
  default:
    return unsup(w, "index %d is not affine: uses %s", k, nf_op_name(op));
  }
}

/* ---- equations and components ---- */

static int uf_find(int *parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

/* Builds the equations: one per index dimension, one per pair. */
static int build_equations(inv *w) {
  for (int k = 0; k < w->d; k++) {
    int e = w->n_eq++;
    memcpy(w->A[e], w->idx[k].a, sizeof(w->A[e]));
    memset(&w->b[e], 0, sizeof(w->b[e]));
    w->b[e].a[k] = 1;
    if (__builtin_sub_overflow((int64_t)0, w->idx[k].c, &w->b[e].c))
      return NF_EOVERFLOW;
  }
  for (int i = 0; i < w->n_dm; i++) {
    const dmpair *p = &w->dm[i];
    int e = w->n_eq++;
    memcpy(w->A[e], p->u.a, sizeof(w->A[e]));
    w->A[e][p->q] = -p->c;
    w->A[e][p->m] = -1;
    memset(&w->b[e], 0, sizeof(w->b[e]));
    if (__builtin_sub_overflow((int64_t)0, p->u.c, &w->b[e].c))
      return NF_EOVERFLOW;
  }
  for (int e = 0; e < w->n_eq; e++)
    for (int j = 0; j < w->n_unk; j++)
      if (w->A[e][j]) w->uk[j].used = 1;
  return NF_OK;
}

/* Splits the equations with unknowns into components (the others are
 * pure consistency conditions on y, handled by the caller). */
static int split_components(inv *w) {
  int parent[MAX_UNK], cid[MAX_UNK];
  for (int j = 0; j < w->n_unk; j++) {
    parent[j] = j;
    cid[j] = -1;
  }
  for (int e = 0; e < w->n_eq; e++) {
    int first = -1;
    for (int j = 0; j < w->n_unk; j++) {
      if (!w->A[e][j]) continue;
      if (first < 0) {
        first = j;
      } else {
        int a = uf_find(parent, first), b = uf_find(parent, j);
        if (a != b) parent[b] = a;
      }
    }
  }
  int n = 0;
  for (int j = 0; j < w->n_unk; j++)
    if (w->uk[j].used && cid[uf_find(parent, j)] < 0) cid[uf_find(parent, j)] = n++;
  w->n_comp = n;
  if (!n) return NF_OK;
  w->comp = calloc((size_t)n, sizeof(comp));
  if (!w->comp) return NF_ENOMEM;
  for (int j = 0; j < w->n_unk; j++) {
    if (!w->uk[j].used) continue;
    comp *c = &w->comp[cid[uf_find(parent, j)]];
    c->u[c->n_u++] = j;
  }
  for (int e = 0; e < w->n_eq; e++) {
    for (int j = 0; j < w->n_unk; j++) {
      if (!w->A[e][j]) continue;
      comp *c = &w->comp[cid[uf_find(parent, j)]];
      c->row[c->n_r++] = e;
      break;
    }
  }
  return NF_OK;
}

/* ---- diagonalisation: U A V = D ---- */

static int row_sub(inv *w, comp *c, int i, int r, int64_t q) {
  for (int j = 0; j < c->n_u; j++)
    if (w->M[r][j] && axpy(&w->M[i][j], -q, w->M[r][j])) return NF_EOVERFLOW;
  return yaff_axpy(&c->b[i], -q, &c->b[r]);
}

static int col_sub(inv *w, comp *c, int j, int r, int64_t q) {
  for (int i = 0; i < c->n_r; i++)
    if (w->M[i][r] && axpy(&w->M[i][j], -q, w->M[i][r])) return NF_EOVERFLOW;
  for (int i = 0; i < c->n_u; i++)
    if (c->V[i][r] && axpy(&c->V[i][j], -q, c->V[i][r])) return NF_EOVERFLOW;
  return NF_OK;
}

static void swap_rows(inv *w, comp *c, int a, int b) {
  if (a == b) return;
  for (int j = 0; j < c->n_u; j++) {
    int64_t t = w->M[a][j];
    w->M[a][j] = w->M[b][j];
    w->M[b][j] = t;
  }
  yaff t = c->b[a];
  c->b[a] = c->b[b];
  c->b[b] = t;
}

static void swap_cols(inv *w, comp *c, int a, int b) {
  if (a == b) return;
  for (int i = 0; i < c->n_r; i++) {
    int64_t t = w->M[i][a];
    w->M[i][a] = w->M[i][b];
    w->M[i][b] = t;
  }
  for (int i = 0; i < c->n_u; i++) {
    int64_t t = c->V[i][a];
    c->V[i][a] = c->V[i][b];
    c->V[i][b] = t;
  }
}

/* q = a / p (truncating), refusing INT64_MIN / -1. */
static int tdiv(int64_t a, int64_t p, int64_t *q) {
  if (a == INT64_MIN && p == -1) return NF_EOVERFLOW;
  *q = a / p;
  return NF_OK;
}

static int diagonalise(inv *w, comp *c) {
  int m = c->n_r, n = c->n_u, rc;
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) w->M[i][j] = w->A[c->row[i]][c->u[j]];
    c->b[i] = w->b[c->row[i]];
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) c->V[i][j] = i == j;
  int r = 0;
  while (r < m && r < n) {
    int pi = -1, pj = -1;
    uint64_t best = 0;
    for (int i = r; i < m; i++)
      for (int j = r; j < n; j++)
        if (w->M[i][j] && (pi < 0 || uabs(w->M[i][j]) < best)) {
          pi = i;
          pj = j;
          best = uabs(w->M[i][j]);
        }
    if (pi < 0) break;
    swap_rows(w, c, r, pi);
    swap_cols(w, c, r, pj);
    for (;;) {
      int64_t p = w->M[r][r], q;
      for (int i = r + 1; i < m; i++) {
        if (!w->M[i][r]) continue;
        if ((rc = tdiv(w->M[i][r], p, &q)) || (rc = row_sub(w, c, i, r, q)))
          return rc;
      }
      for (int j = r + 1; j < n; j++) {
        if (!w->M[r][j]) continue;
        if ((rc = tdiv(w->M[r][j], p, &q)) || (rc = col_sub(w, c, j, r, q)))
          return rc;
      }
      /* Remainders are smaller than the pivot: the smallest one becomes
       * the pivot, so this terminates. */
      int bi = -1, bj = -1;
      best = 0;
      for (int i = r + 1; i < m; i++)
        if (w->M[i][r] && (bi < 0 || uabs(w->M[i][r]) < best)) {
          bi = i;
          best = uabs(w->M[i][r]);
        }
      for (int j = r + 1; j < n; j++)
        if (w->M[r][j] && ((bi < 0 && bj < 0) || uabs(w->M[r][j]) < best)) {
          bi = -1;
          bj = j;
          best = uabs(w->M[r][j]);
        }
      if (bi >= 0)
        swap_rows(w, c, r, bi);
      else if (bj >= 0)
        swap_cols(w, c, r, bj);
      else
        break;
    }
    if (w->M[r][r] < 0) {
      if (w->M[r][r] == INT64_MIN) return NF_EOVERFLOW;
      w->M[r][r] = -w->M[r][r];
      yaff z = {{0}, 0};
      if (yaff_axpy(&z, -1, &c->b[r])) return NF_EOVERFLOW;
      c->b[r] = z;
    }
    c->d[r] = w->M[r][r];
    r++;
  }
  c->rank = r;
  c->p = n - r;
  return NF_OK;
}

/* ---- choice of parameters ---- */

/* col a -= q * col b of the lattice basis (columns of V). */
static int vcol_sub(comp *c, int a, int b, int64_t q) {
  for (int i = 0; i < c->n_u; i++)
    if (c->V[i][b] && axpy(&c->V[i][a], -q, c->V[i][b])) return NF_EOVERFLOW;
  return NF_OK;
}

static void vcol_swap(comp *c, int a, int b) {
  if (a == b) return;
  for (int i = 0; i < c->n_u; i++) {
    int64_t t = c->V[i][a];
    c->V[i][a] = c->V[i][b];
    c->V[i][b] = t;
  }
}

/* Brings the lattice basis (columns rank .. n_u-1 of V) to echelon form,
 * parameter l following unknown piv[l] with coefficient beta > 0 in
 * column rank + l and 0 in the later columns.  Greedy: each step picks
 * the unknown with the fewest values along the remaining lattice. */
static int choose_parameters(inv *w, comp *c) {
  int is_piv[MAX_UNK] = {0};
  for (int l = 0; l < c->p; l++) {
    int col = c->rank + l, best = -1;
    int64_t bE = 0, bW = 0;
    int bguard = 0, bvar = 0;
    for (int j = 0; j < c->n_u; j++) {
      if (is_piv[j]) continue;
      uint64_t g = 0;
      for (int k = col; k < c->n_u; k++) g = ugcd(g, uabs(c->V[j][k]));
      if (!g) continue;
      const unknown *u = &w->uk[c->u[j]];
      uint64_t e = (uint64_t)u->w / g;
      if (e >= (uint64_t)INT64_MAX) return NF_EOVERFLOW;
      int64_t E = (int64_t)e + 1;
      int guard = u->real && (uint64_t)u->w % g != g - 1;
      int var = c->u[j] < w->n_vars;
      /* Fewest values, then no guard, then a variable (its name is the
       * hint), then the narrowest range. */
      if (best < 0 || E < bE || (E == bE && guard < bguard) ||
          (E == bE && guard == bguard && var > bvar) ||
          (E == bE && guard == bguard && var == bvar && u->w < bW)) {
        best = j;
        bE = E;
        bW = u->w;
        bguard = guard;
        bvar = var;
      }
    }
    NF_ASSERT(best >= 0); /* the remaining columns are independent */
    /* Euclid on the columns until row best has one non-zero entry. */
    for (;;) {
      int k0 = -1;
      for (int k = col; k < c->n_u; k++)
        if (c->V[best][k] &&
            (k0 < 0 || uabs(c->V[best][k]) < uabs(c->V[best][k0])))
          k0 = k;
      int clean = 1;
      for (int k = col; k < c->n_u; k++) {
        if (k == k0 || !c->V[best][k]) continue;
        int64_t q;
        int rc = tdiv(c->V[best][k], c->V[best][k0], &q);
        if (!rc) rc = vcol_sub(c, k, k0, q);
        if (rc) return rc;
        if (c->V[best][k]) clean = 0;
      }
      if (clean) {
        vcol_swap(c, col, k0);
        break;
      }
    }
    if (c->V[best][col] < 0) {
      for (int i = 0; i < c->n_u; i++) {
        if (c->V[i][col] == INT64_MIN) return NF_EOVERFLOW;
        c->V[i][col] = -c->V[i][col];
      }
    }
    is_piv[best] = 1;
    c->piv[l] = best;
    c->E[l] = bE;
  }
  return NF_OK;
}

/* Refuses a component whose (y, t) points exceed EFFICIENCY_LIMIT times
 * what cannot be avoided: its forward points or its y points. */
static int check_efficiency(inv *w, const comp *c) {
  int64_t fwd = 1, ys = 1, pts;
  for (int j = 0; j < c->n_u; j++)
    if (c->u[j] < w->n_vars)
      fwd = sat_mul(fwd, w->uk[c->u[j]].w == INT64_MAX ? INT64_MAX
                                                        : w->uk[c->u[j]].w + 1);
  for (int i = 0; i < c->n_r; i++)
    if (c->row[i] < w->d) ys = sat_mul(ys, w->shape[c->row[i]]);
  pts = ys;
  for (int l = 0; l < c->p; l++) pts = sat_mul(pts, c->E[l]);
  int64_t floor_ = fwd > ys ? fwd : ys;
  if (pts > sat_mul(floor_, EFFICIENCY_LIMIT) || pts == INT64_MAX)
    return unsup(w,
                 "index map is not efficiently invertible: %lld points for "
                 "%lld forward points",
                 (long long)pts, (long long)fwd);
  return NF_OK;
}

/* ---- syms ---- */

static int sym_add_atom(sym *s, const nf_expr *a, int64_t k) {
  if (!k) return NF_OK;
  for (int i = 0; i < s->na; i++)
    if (s->at[i] == a) {
      if (axpy(&s->ac[i], k, 1)) return NF_EOVERFLOW;
      if (!s->ac[i]) {
        s->na--;
        s->at[i] = s->at[s->na];
        s->ac[i] = s->ac[s->na];
      }
      return NF_OK;
    }
  NF_ASSERT(s->na < MAX_ATOMS);
  s->at[s->na] = a;
  s->ac[s->na++] = k;
  return NF_OK;
}

/* dst += k * src. */
static int sym_axpy(sym *dst, int64_t k, const sym *src) {
  if (!k) return NF_OK;
  for (int i = 0; i < NF_MAX_VARS; i++)
    if (src->v[i] && axpy(&dst->v[i], k, src->v[i])) return NF_EOVERFLOW;
  if (axpy(&dst->c, k, src->c)) return NF_EOVERFLOW;
  for (int i = 0; i < src->na; i++) {
    int64_t p;
    if (__builtin_mul_overflow(k, src->ac[i], &p)) return NF_EOVERFLOW;
    int rc = sym_add_atom(dst, src->at[i], p);
    if (rc) return rc;
  }
  return NF_OK;
}

static void sym_from_yaff(sym *s, const yaff *y, int d) {
  memset(s, 0, sizeof(*s));
  for (int k = 0; k < d; k++) s->v[k] = y->a[k];
  s->c = y->c;
}

static int sym_is_const(const sym *s) {
  if (s->na) return 0;
  for (int i = 0; i < NF_MAX_VARS; i++)
    if (s->v[i]) return 0;
  return 1;
}

static const nf_expr *bin(nf_ir_ctx *ctx, nf_op op, const nf_expr *a,
                          const nf_expr *b) {
  return a && b ? nf_e_binary(ctx, op, a, b) : NULL;
}

static const nf_expr *ci64(nf_ir_ctx *ctx, int64_t v) {
  return nf_e_const_i(ctx, NF_I64, v);
}

/* The expression of s: variables in order, then atoms by creation order,
 * then the constant.  NULL when out of memory. */
static const nf_expr *sym_expr(inv *w, const sym *s) {
  nf_ir_ctx *ctx = w->ctx;
  nf_affine a = {0};
  for (int i = 0; i < NF_MAX_VARS; i++)
    if (s->v[i]) {
      a.var[a.n] = (uint32_t)i;
      a.coef[a.n++] = s->v[i];
    }
  const nf_expr *acc = a.n ? nf_affine_expr(ctx, &a) : NULL;
  if (a.n && !acc) return NULL;
  int order[MAX_ATOMS];
  for (int i = 0; i < s->na; i++) {
    int k = i;
    while (k > 0 && s->at[order[k - 1]]->id > s->at[i]->id) {
      order[k] = order[k - 1];
      k--;
    }
    order[k] = i;
  }
  for (int i = 0; i < s->na; i++) {
    const nf_expr *at = s->at[order[i]];
    int64_t k = s->ac[order[i]];
    if (!acc) {
      acc = k == 1    ? at
            : k == -1 ? nf_e_unary(ctx, NF_OP_NEG, at)
                      : bin(ctx, NF_OP_MUL, at, ci64(ctx, k));
    } else if (k < 0 && k != INT64_MIN) {
      acc = bin(ctx, NF_OP_SUB, acc,
                k == -1 ? at : bin(ctx, NF_OP_MUL, at, ci64(ctx, -k)));
    } else {
      acc = bin(ctx, NF_OP_ADD, acc,
                k == 1 ? at : bin(ctx, NF_OP_MUL, at, ci64(ctx, k)));
    }
    if (!acc) return NULL;
  }
  if (!acc) return ci64(ctx, s->c);
  if (s->c == 0) return acc;
  if (s->c < 0 && s->c != INT64_MIN)
    return bin(ctx, NF_OP_SUB, acc, ci64(ctx, -s->c));
  return bin(ctx, NF_OP_ADD, acc, ci64(ctx, s->c));
}

/* Interval of an integer expression over the result's box; NF_EOVERFLOW
 * when it has none (an intermediate could overflow). */
static int expr_bounds(inv *w, const nf_expr *e, nf_range *r) {
  return nf_expr_bounds(e, w->rng, w->n_rv, r) ? NF_OK : NF_EOVERFLOW;
}

/* Splits s = c * Q + R with every coefficient of R not a multiple of c
 * and R's constant in [0, c). */
static void sym_split(const sym *s, int64_t c, sym *Q, sym *R) {
  memset(Q, 0, sizeof(*Q));
  memset(R, 0, sizeof(*R));
  Q->c = fdiv(s->c, c);
  R->c = fmod_(s->c, c);
  for (int i = 0; i < NF_MAX_VARS; i++) {
    if (s->v[i] % c == 0)
      Q->v[i] = s->v[i] / c;
    else
      R->v[i] = s->v[i];
  }
  for (int i = 0; i < s->na; i++) {
    if (s->ac[i] % c == 0) {
      Q->at[Q->na] = s->at[i];
      Q->ac[Q->na++] = s->ac[i] / c;
    } else {
      R->at[R->na] = s->at[i];
      R->ac[R->na++] = s->ac[i];
    }
  }
}

/* *out = floor(s / c) for c > 0: multiples of c move out, and the rest
 * is folded when its bounds fix the quotient. */
static int sym_floordiv(inv *w, const sym *s, int64_t c, sym *out) {
  if (c == 1) {
    *out = *s;
    return NF_OK;
  }
  sym R;
  sym_split(s, c, out, &R);
  if (sym_is_const(&R)) return NF_OK; /* R.c in [0, c) */
  const nf_expr *re = sym_expr(w, &R);
  if (!re) return NF_ENOMEM;
  nf_range b;
  int rc = expr_bounds(w, re, &b);
  if (rc) return rc;
  int64_t q0 = fdiv(b.lo, c), q1 = fdiv(b.hi, c);
  if (q0 == q1) return axpy(&out->c, 1, q0);
  /* Canonical sign: the first term positive, using floor((k - A) / c) ==
   * -floor((A + c - 1 - k) / c) for 0 <= k < c, so y // 4 is written so
   * rather than -((3 - y) // 4), and equal atoms share one node. */
  int64_t sign = 1, first = 0;
  for (int i = 0; i < NF_MAX_VARS && !first; i++) first = R.v[i];
  for (int i = 0; i < R.na && !first; i++) first = R.ac[i];
  if (first < 0) {
    sym N;
    memset(&N, 0, sizeof(N));
    int rc2 = sym_axpy(&N, -1, &R);
    if (rc2) return rc2;
    N.c = c - 1 - R.c;
    R = N;
    sign = -1;
    if (!(re = sym_expr(w, &R))) return NF_ENOMEM;
    if ((rc = expr_bounds(w, re, &b))) return rc;
  }
  const nf_expr *at = bin(w->ctx, NF_OP_FLOORDIV, re, ci64(w->ctx, c));
  if (!at) return NF_ENOMEM;
  return sym_add_atom(out, at, sign);
}

/* ---- guards ---- */

static int is_const(const nf_expr *e, int64_t v) {
  return e->op == NF_OP_CONST && e->u.i == v;
}

/* Adds a condition (simplified; dropped when provably true). */
static int add_cond(inv *w, const nf_expr *e) {
  if (!e) return NF_ENOMEM;
  const nf_expr *s = nf_simplify(w->ctx, e, w->rng, w->n_rv);
  if (!s) return NF_ENOMEM;
  nf_range r;
  if (is_const(s, 1) || (nf_expr_bounds(s, w->rng, w->n_rv, &r) && r.lo == 1))
    return NF_OK;
  if (is_const(s, 0) || (nf_expr_bounds(s, w->rng, w->n_rv, &r) && r.hi == 0)) {
    w->never = 1;
    return NF_OK;
  }
  if (w->n_cond == MAX_CONDS)
    return unsup(w, "index map needs more than %d guard conditions",
                 MAX_CONDS);
  w->cond[w->n_cond++] = s;
  return NF_OK;
}

/* Guard a == 0 for an affine form of y, written as positive terms ==
 * negative terms (the first variable on the left). */
static int add_zero_cond(inv *w, const yaff *a) {
  yaff x = *a;
  int k0 = 0;
  while (k0 < w->d && !x.a[k0]) k0++;
  if (k0 == w->d) {
    if (x.c) w->never = 1;
    return NF_OK;
  }
  if (x.a[k0] < 0) {
    yaff z = {{0}, 0};
    if (yaff_axpy(&z, -1, &x)) return NF_EOVERFLOW;
    x = z;
  }
  sym lhs, rhs;
  memset(&lhs, 0, sizeof(lhs));
  memset(&rhs, 0, sizeof(rhs));
  for (int k = 0; k < w->d; k++) {
    if (x.a[k] > 0) lhs.v[k] = x.a[k];
    if (x.a[k] < 0) {
      if (x.a[k] == INT64_MIN) return NF_EOVERFLOW;
      rhs.v[k] = -x.a[k];
    }
  }
  if (x.c == INT64_MIN) return NF_EOVERFLOW;
  rhs.c = -x.c;
  const nf_expr *l = sym_expr(w, &lhs), *r = sym_expr(w, &rhs);
  if (!l || !r) return NF_ENOMEM;
  nf_range bl, br;
  int rc = expr_bounds(w, l, &bl);
  if (!rc) rc = expr_bounds(w, r, &br);
  if (rc) return rc;
  return add_cond(w, bin(w->ctx, NF_OP_EQ, l, r));
}

/* Guard s % c == 0 (c > 1). */
static int add_div_cond(inv *w, const sym *s, int64_t c) {
  sym Q, R;
  sym_split(s, c, &Q, &R);
  if (sym_is_const(&R)) {
    if (R.c) w->never = 1;
    return NF_OK;
  }
  const nf_expr *re = sym_expr(w, &R);
  if (!re) return NF_ENOMEM;
  nf_range b;
  int rc = expr_bounds(w, re, &b);
  if (rc) return rc;
  return add_cond(w, bin(w->ctx, NF_OP_EQ,
                         bin(w->ctx, NF_OP_MOD, re, ci64(w->ctx, c)),
                         ci64(w->ctx, 0)));
}

/* Guards lo <= x and x <= hi (each only when asked and not proved). */
static int add_range_cond(inv *w, const nf_expr *x, const nf_range *b,
                          const unknown *u, int need_lo, int need_hi) {
  if (need_lo && b->lo < u->lo) {
    int rc = add_cond(w, bin(w->ctx, NF_OP_GE, x, ci64(w->ctx, u->lo)));
    if (rc) return rc;
  }
  if (need_hi && b->hi > u->hi)
    return add_cond(w, bin(w->ctx, NF_OP_LE, x, ci64(w->ctx, u->hi)));
  return NF_OK;
}

/* ---- expressions of a component ---- */

/* Builds v_j for the component's variables and its guards. */
static int emit_component(inv *w, const comp *c, nf_inversion *out) {
  int rc = NF_OK;
  /* z (rank), T (p), then one scratch. */
  sym *z = malloc(sizeof(sym) * (size_t)(c->n_u + 2));
  if (!z) return NF_ENOMEM;
  sym *T = z + c->rank, *x = z + c->n_u, *tmp = x + 1;
  for (int i = c->rank; !rc && i < c->n_r; i++) rc = add_zero_cond(w, &c->b[i]);
  for (int i = 0; !rc && i < c->rank; i++) {
    sym_from_yaff(tmp, &c->b[i], w->d);
    if (c->d[i] > 1) rc = add_div_cond(w, tmp, c->d[i]);
    if (!rc) rc = sym_floordiv(w, tmp, c->d[i], &z[i]);
  }
  /* x_j = sum_i V[j][i] z_i + sum_l V[j][rank + l] T_l. */
  for (int l = 0; !rc && l < c->p; l++) {
    int j = c->piv[l];
    int64_t beta = c->V[j][c->rank + l];
    memset(x, 0, sizeof(*x));
    for (int i = 0; !rc && i < c->rank; i++) rc = sym_axpy(x, c->V[j][i], &z[i]);
    for (int m = 0; !rc && m < l; m++)
      rc = sym_axpy(x, c->V[j][c->rank + m], &T[m]);
    /* T_l = ceil((lo_j - x) / beta) + t'_l */
    memset(tmp, 0, sizeof(*tmp));
    if (!rc) rc = sym_axpy(tmp, -1, x);
    if (!rc) rc = axpy(&tmp->c, 1, w->uk[c->u[j]].lo);
    if (!rc) rc = axpy(&tmp->c, 1, beta - 1);
    if (!rc) rc = sym_floordiv(w, tmp, beta, &T[l]);
    if (!rc && c->tvar[l] >= 0) rc = axpy(&T[l].v[c->tvar[l]], 1, 1);
  }
  for (int j = 0; !rc && j < c->n_u; j++) {
    const unknown *u = &w->uk[c->u[j]];
    int need_lo = u->real, need_hi = u->real;
    for (int l = 0; l < c->p; l++)
      if (c->piv[l] == j) {
        need_lo = 0;
        need_hi = u->real && (uint64_t)u->w % (uint64_t)c->V[j][c->rank + l] !=
                                 (uint64_t)c->V[j][c->rank + l] - 1;
      }
    if (c->u[j] >= w->n_vars && !need_lo && !need_hi) continue;
    memset(x, 0, sizeof(*x));
    for (int i = 0; !rc && i < c->rank; i++) rc = sym_axpy(x, c->V[j][i], &z[i]);
    for (int l = 0; !rc && l < c->p; l++)
      rc = sym_axpy(x, c->V[j][c->rank + l], &T[l]);
    if (rc) break;
    const nf_expr *e = sym_expr(w, x);
    if (!e) {
      rc = NF_ENOMEM;
      break;
    }
    nf_range b;
    rc = expr_bounds(w, e, &b);
    if (!rc) rc = add_range_cond(w, e, &b, u, need_lo, need_hi);
    if (!rc && c->u[j] < w->n_vars) {
      out->v[c->u[j]] = nf_simplify(w->ctx, e, w->rng, w->n_rv);
      if (!out->v[c->u[j]]) rc = NF_ENOMEM;
    }
  }
  free(z);
  return rc;
}

/* ---- checks of the result ---- */

typedef struct fin_check {
  inv *w;
  int bad;
} fin_check;

static void fin_visit(const nf_expr *e, void *user) {
  fin_check *f = user;
  nf_range r;
  if (e->dtype == NF_I64 && !nf_expr_bounds(e, f->w->rng, f->w->n_rv, &r))
    f->bad = 1;
}

/* NF_EOVERFLOW when some integer node of e lacks finite bounds. */
static int check_finite(inv *w, const nf_expr *e) {
  fin_check f = {w, 0};
  int rc = nf_expr_visit(e, fin_visit, &f);
  if (rc) return rc;
  return f.bad ? NF_EOVERFLOW : NF_OK;
}

/* ---- entry point ---- */

typedef struct param {
  int key;  /* unknown number: orders the parameters */
  int comp; /* -1 for a variable in no index */
  int l;    /* parameter of the component, or the variable */
  int64_t ext;
} param;

static int run(inv *w, int n_vars, const nf_range *box,
               const char *const *var_names, int d, const nf_expr *const *idx,
               int empty, nf_inversion *out) {
  int rc;
  for (int j = 0; j < n_vars; j++) {
    unknown *u = &w->uk[j];
    u->lo = box[j].lo;
    u->hi = box[j].hi;
    u->real = 1;
    if (__builtin_sub_overflow(u->hi, u->lo, &u->w)) return NF_EOVERFLOW;
  }
  w->n_unk = n_vars;
  for (int k = 0; k < d; k++) {
    const nf_expr *e = nf_simplify(w->ctx, idx[k], box, n_vars);
    if (!e) return NF_ENOMEM;
    if ((rc = norm(w, k, e, 0, &w->idx[k]))) return rc;
  }
  if (empty) return NF_OK; /* the caller fills the empty result */
  if ((rc = build_equations(w)) || (rc = split_components(w))) return rc;

  /* Solve each component and choose its parameters. */
  param prm[MAX_UNK];
  int n_prm = 0;
  for (int j = 0; j < n_vars; j++) {
    if (w->uk[j].used) continue;
    if (w->uk[j].w == INT64_MAX) return NF_EOVERFLOW;
    if (w->uk[j].w == 0) {
      out->v[j] = ci64(w->ctx, w->uk[j].lo); /* a single value */
      if (!out->v[j]) return NF_ENOMEM;
      continue;
    }
    prm[n_prm++] = (param){j, -1, j, w->uk[j].w + 1};
  }
  for (int i = 0; i < w->n_comp; i++) {
    comp *c = &w->comp[i];
    if ((rc = diagonalise(w, c)) || (rc = choose_parameters(w, c)) ||
        (rc = check_efficiency(w, c)))
      return rc;
    for (int l = 0; l < c->p; l++) {
      c->tvar[l] = -1;
      if (c->E[l] > 1) prm[n_prm++] = (param){c->u[c->piv[l]], i, l, c->E[l]};
    }
  }
  if (n_prm > NF_MAX_VARS - d)
    return unsup(w, "index map needs %d free parameters, more than %d",
                 n_prm, NF_MAX_VARS - d);
  for (int a = 1; a < n_prm; a++)
    for (int b = a; b > 0 && prm[b - 1].key > prm[b].key; b--) {
      param t = prm[b];
      prm[b] = prm[b - 1];
      prm[b - 1] = t;
    }
  for (int k = 0; k < d; k++) {
    w->rng[k].lo = 0;
    w->rng[k].hi = w->shape[k] - 1;
  }
  out->n_t = n_prm;
  for (int l = 0; l < n_prm; l++) {
    out->t_ext[l] = prm[l].ext;
    w->rng[d + l].lo = 0;
    w->rng[d + l].hi = prm[l].ext - 1;
    int var = prm[l].comp < 0 ? prm[l].l : prm[l].key;
    out->t_names[l] = var < n_vars && var_names ? var_names[var] : NULL;
    if (prm[l].comp >= 0) {
      w->comp[prm[l].comp].tvar[prm[l].l] = d + l;
    } else {
      sym s;
      memset(&s, 0, sizeof(s));
      s.v[d + l] = 1;
      s.c = w->uk[var].lo;
      out->v[var] = sym_expr(w, &s);
      if (!out->v[var]) return NF_ENOMEM;
    }
  }
  w->n_rv = d + n_prm;

  /* Index dimensions without unknowns: y_k == constant. */
  for (int e = 0; e < d; e++) {
    int any = 0;
    for (int j = 0; j < w->n_unk; j++) any |= w->A[e][j] != 0;
    if (!any && (rc = add_zero_cond(w, &w->b[e]))) return rc;
  }
  for (int i = 0; i < w->n_comp && !w->never; i++)
    if ((rc = emit_component(w, &w->comp[i], out))) return rc;

  if (w->never) {
    out->n_t = 0;
    for (int j = 0; j < n_vars; j++) {
      out->v[j] = ci64(w->ctx, box[j].lo);
      if (!out->v[j]) return NF_ENOMEM;
    }
    out->guard = nf_e_const_i(w->ctx, NF_BOOL, 0);
    return out->guard ? NF_OK : NF_ENOMEM;
  }
  const nf_expr *g = NULL;
  for (int i = 0; i < w->n_cond; i++)
    g = g ? bin(w->ctx, NF_OP_AND, g, w->cond[i]) : w->cond[i];
  if (w->n_cond && !g) return NF_ENOMEM;
  out->guard = g;
  for (int j = 0; j < n_vars; j++) {
    NF_ASSERT(out->v[j]);
    if ((rc = check_finite(w, out->v[j]))) return rc;
  }
  return g ? check_finite(w, g) : NF_OK;
}

/* Solves the index map (see nf_invert.h).  Scratch memory is freed before
 * returning; the result's expressions live in ctx. */
int nf__invert(nf_ir_ctx *ctx, int n_vars, const nf_range *box,
               const char *const *var_names, int d, const nf_expr *const *idx,
               const int64_t *shape, nf_inversion *out, nf_buf *why) {
  if (!ctx || !out || n_vars < 0 || n_vars > NF_MAX_VARS || d < 0 ||
      d > NF_MAX_RANK || (n_vars && !box) || (d && (!idx || !shape)))
    return NF_EINVAL;
  for (int j = 0; j < n_vars; j++)
    if (box[j].lo > box[j].hi) return NF_EINVAL;
  for (int k = 0; k < d; k++)
    if (!idx[k]) return NF_EINVAL;
  memset(out, 0, sizeof(*out));
  inv *w = calloc(1, sizeof(*w));
  if (!w) return NF_ENOMEM;
  w->ctx = ctx;
  w->why = why;
  w->n_vars = n_vars;
  w->d = d;
  w->shape = shape;
  int empty = 0;
  for (int k = 0; k < d; k++) empty |= shape[k] <= 0;
  int rc = run(w, n_vars, box, var_names, d, idx, empty, out);
  if (!rc && empty) {
    /* No element of X: nothing to iterate. */
    memset(out, 0, sizeof(*out));
    for (int j = 0; j < n_vars && !rc; j++) {
      out->v[j] = ci64(ctx, box[j].lo);
      if (!out->v[j]) rc = NF_ENOMEM;
    }
    out->guard = nf_e_const_i(ctx, NF_BOOL, 0);
    if (!out->guard) rc = NF_ENOMEM;
  }
  free(w->comp);
  free(w);
  if (!rc && nf_ir_ctx_oom(ctx)) rc = NF_ENOMEM;
  if (rc) memset(out, 0, sizeof(*out));
  return rc;
}
