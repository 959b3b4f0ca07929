/* conv_enum.c - the convolutions conv.c's affine reading does not see:
 * grouped convolutions (channel k // (K / G) * (C / G) + c) and the
 * strided data gradient the autodiff writes with floor divisions.
 *
 * Instead of reading roles off affine coefficients, the statement is
 * checked against what each of cuDNN's three operations sums, by
 * enumeration.  Its variables fall into four independent groups: the
 * batch, the channels, the rows and the columns (each index of each
 * factor, and each comparison of the guard, may use the variables of one
 * group only; the output's variables are placed by its role).  Then the
 * sum at each output is the product of the groups' sets of terms, and it
 * is the convolution's exactly when, in every group and for every value
 * of the group's output variables, the index tuples the statement reads
 * (over its reduction variables, where the guard holds) are the
 * convolution's, as multisets.  Each group is enumerated on its own, so
 * the work is about (channels x channels + rows x taps + ...), not the
 * convolution's.  Stride, padding and dilation are the candidates that
 * give the output's size (cuDNN's formula); groups come from the
 * channel counts.  Exact, for any way of writing the indices that the
 * integer evaluation below understands (+, -, *, //, %, min, max,
 * comparisons, and, or, not, select). */
#include <stdlib.h>
#include <string.h>

#include "nf_conv.h"

#define MAX_CON 32
#define ENUM_BUDGET ((int64_t)1 << 23) /* evaluations per group */

enum { GB = 0, GC, GH, GW, NG }; /* batch, channels, rows, columns */

typedef struct ex {
  const nf_graph *g;
  const nf_stmt *st;
  int n_vars;
  int64_t lo[NF_MAX_VARS], ext[NF_MAX_VARS];
  const nf_expr *f[2]; /* the factors (accesses) */
  int n_con;
  const nf_expr *con[MAX_CON]; /* the guard's conjuncts */
} ex;

/* ---- integer evaluation ---- */

static int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* *out = e at the variables' values; 0 for what this does not evaluate
 * (a float, a division by zero, an access). */
static int ev(const nf_expr *e, const int64_t *val, int n_vars, int64_t *out) {
  int64_t a = 0, b = 0;
  switch (e->op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float((nf_dtype)e->dtype)) return 0;
    *out = e->u.i;
    return 1;
  case NF_OP_VAR:
    if ((int)e->u.var >= n_vars) return 0;
    *out = val[e->u.var];
    return 1;
  case NF_OP_SELECT:
    if (!ev(e->args[0], val, n_vars, &a)) return 0;
    return ev(e->args[a ? 1 : 2], val, n_vars, out);
  case NF_OP_NOT:
  case NF_OP_NEG:
  case NF_OP_CAST:
    if (nf_dtype_is_float((nf_dtype)e->dtype) || !ev(e->args[0], val, n_vars, &a)) return 0;
    *out = e->op == NF_OP_NOT ? !a : e->op == NF_OP_NEG ? -a : a;
    return 1;
  default: break;
  }
  if (e->n_args != 2 || nf_dtype_is_float((nf_dtype)e->dtype) ||
      nf_dtype_is_float((nf_dtype)e->args[0]->dtype) || !ev(e->args[0], val, n_vars, &a) ||
      !ev(e->args[1], val, n_vars, &b))
    return 0;
  switch (e->op) {
  case NF_OP_ADD: *out = a + b; return 1;
  case NF_OP_SUB: *out = a - b; return 1;
  case NF_OP_MUL: *out = a * b; return 1;
  case NF_OP_FLOORDIV:
    if (!b) return 0;
    *out = fdiv(a, b);
    return 1;
  case NF_OP_MOD:
    if (!b) return 0;
    *out = a - fdiv(a, b) * b;
    return 1;
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

/* The variables e uses (a bit each); all bits set for too deep a tree. */
static uint32_t vars_of(const nf_expr *e, int depth) {
  if (depth > 64) return ~0u;
  uint32_t m = e->op == NF_OP_VAR && e->u.var < 32 ? 1u << e->u.var : 0;
  for (int k = 0; k < e->n_args; k++) m |= vars_of(e->args[k], depth + 1);
  return m;
}

static int add_conjuncts(ex *X, const nf_expr *c) {
  if (c->op == NF_OP_AND && c->n_args == 2)
    return add_conjuncts(X, c->args[0]) && add_conjuncts(X, c->args[1]);
  if (X->n_con == MAX_CON) return 0;
  X->con[X->n_con++] = c;
  return 1;
}

/* Peels "cond ? e : 0.0" layers off e, collecting their conditions. */
static const nf_expr *peel(ex *X, const nf_expr *e) {
  while (e && e->op == NF_OP_SELECT && nf__conv_is_zero(e->args[2]))
    e = add_conjuncts(X, e->args[0]) ? e->args[1] : NULL;
  return e;
}

/* ---- the groups ---- */

/* One index the statement reads: factor fi's index j, in group grp. */
typedef struct comp {
  int fi, j;
} comp;

/* A role layout: which factor is which tensor, and each group's
 * components in a fixed order (the spec functions fill tuples in it). */
typedef struct layout {
  nf_conv_kind kind;
  int fx, ff, fy; /* factor index of X, F, Y (-1: the output) */
  int n_comp[NG];
  comp c[NG][3];
  int out_group[4]; /* the output's variables */
} layout;

/* Enumerates group grp's variables: for each value of its output
 * variables, the sorted tuples of its components where its conjuncts
 * hold, compared with the convolution's (spec).  1 when equal
 * everywhere. */
typedef struct spec_ctx {
  const nf_conv_desc *d;
  int64_t kg, cg; /* output and input channels per group */
} spec_ctx;

/* The convolution's tuples for group grp at outer values o (the group's
 * output variables in index order); appends to t (n tuples of nc). */
static int spec_tuples(const spec_ctx *S, const layout *L, int grp, const int64_t *o,
                       int64_t *t, int64_t cap, int64_t *n) {
  const nf_conv_desc *d = S->d;
  *n = 0;
#define PUT3(a, b, c)                                                                        \
  do {                                                                                       \
    if (*n >= cap) return 0;                                                                 \
    int64_t *q_ = t + *n * L->n_comp[grp];                                                   \
    q_[0] = (a);                                                                             \
    if (L->n_comp[grp] > 1) q_[1] = (b);                                                     \
    if (L->n_comp[grp] > 2) q_[2] = (c);                                                     \
    ++*n;                                                                                    \
  } while (0)
  if (grp == GB) {
    if (L->kind == NF_CONV_BWD_FILTER)
      for (int64_t b = 0; b < d->n; b++) PUT3(b, b, 0);
    else
      PUT3(o[0], 0, 0);
    return 1;
  }
  if (grp == GC) {
    if (L->kind == NF_CONV_FWD) { /* (X1, F0, F1) over c; o: k */
      int64_t g = o[0] / S->kg;
      for (int64_t c = 0; c < S->cg; c++) PUT3(g * S->cg + c, o[0], c);
    } else if (L->kind == NF_CONV_BWD_DATA) { /* (Y1, F0, F1) over kq; o: image channel */
      int64_t g = o[0] / S->cg;
      for (int64_t q = 0; q < S->kg; q++) PUT3(g * S->kg + q, g * S->kg + q, o[0] % S->cg);
    } else { /* (Y1, X1); o: k, c */
      PUT3(o[0], o[0] / S->kg * S->cg + o[1], 0);
    }
    return 1;
  }
  int w = grp == GW;
  int64_t str = w ? d->str_w : d->str_h, dil = w ? d->dil_w : d->dil_h, pad = w ? d->pad_w : d->pad_h;
  int64_t in = w ? d->w : d->h, ker = w ? d->s : d->r, on = w ? d->ow : d->oh;
  if (L->kind == NF_CONV_FWD) { /* (X, F) over the tap; o: output position */
    for (int64_t r = 0; r < ker; r++) {
      int64_t i = o[0] * str + r * dil - pad;
      if (i >= 0 && i < in) PUT3(i, r, 0);
    }
  } else if (L->kind == NF_CONV_BWD_DATA) { /* (Y, F); o: image position */
    for (int64_t p = 0; p < on; p++)
      for (int64_t r = 0; r < ker; r++)
        if (p * str + r * dil - pad == o[0]) PUT3(p, r, 0);
  } else { /* (Y, X); o: tap */
    for (int64_t p = 0; p < on; p++) {
      int64_t i = p * str + o[0] * dil - pad;
      if (i >= 0 && i < in) PUT3(p, i, 0);
    }
  }
#undef PUT3
  return 1;
}

static int cmp_tuple(const void *a, const void *b, void *arg) {
  int n = *(const int *)arg;
  const int64_t *x = a, *y = b;
  for (int i = 0; i < n; i++)
    if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
  return 0;
}

/* Group grp of statement X under layout L: its variables (mask), their
 * outer ones (the output's, in index order) and conjuncts (cmask); 1 when
 * the statement's tuples are the convolution's everywhere. */
static int check_group(const ex *X, const layout *L, const spec_ctx *S, int grp,
                       const int *group_of) {
  int outer[4], n_outer = 0, inner[NF_MAX_VARS], n_inner = 0;
  for (int v = 0; v < 4; v++)
    if (L->out_group[v] == grp) outer[n_outer++] = v;
  for (int v = 4; v < X->n_vars; v++)
    if (group_of[v] == grp) inner[n_inner++] = v;
  const nf_expr *cons[MAX_CON];
  int n_cons = 0;
  for (int i = 0; i < X->n_con; i++) {
    uint32_t m = vars_of(X->con[i], 0);
    int mine = 0, other = 0;
    for (int v = 0; v < X->n_vars; v++)
      if (m & (1u << v)) *(group_of[v] == grp ? &mine : &other) = 1;
    if (mine && !other) cons[n_cons++] = X->con[i];
  }
  int nc = L->n_comp[grp];
  int64_t n_out = 1, n_in = 1;
  for (int i = 0; i < n_outer; i++) n_out *= X->ext[outer[i]];
  for (int i = 0; i < n_inner; i++) n_in *= X->ext[inner[i]];
  if (n_in > ((int64_t)1 << 16) || n_out * (n_in + 1) > ENUM_BUDGET) return 0;
  /* the convolution's tuples per outer value are at most max(taps x
   * positions, channels): bound them by the budget too */
  int64_t cap = n_in + S->d->n + S->kg + S->cg + (S->d->oh + S->d->ow) * (S->d->r + S->d->s) + 1;
  int64_t *got = malloc((size_t)(n_in + 1) * (size_t)nc * sizeof *got);
  int64_t *want = malloc((size_t)cap * (size_t)nc * sizeof *want);
  int ok = got && want;
  int64_t val[NF_MAX_VARS];
  memset(val, 0, sizeof val);
  for (int v = 0; v < X->n_vars; v++) val[v] = X->lo[v];
  for (int64_t oi = 0; ok && oi < n_out; oi++) {
    int64_t o[4], r = oi;
    for (int i = n_outer - 1; i >= 0; i--) {
      val[outer[i]] = X->lo[outer[i]] + r % X->ext[outer[i]];
      r /= X->ext[outer[i]];
    }
    for (int i = 0; i < n_outer; i++) o[i] = val[outer[i]];
    int64_t n_got = 0;
    for (int64_t ii = 0; ok && ii < n_in; ii++) {
      int64_t q = ii;
      for (int i = n_inner - 1; i >= 0; i--) {
        val[inner[i]] = X->lo[inner[i]] + q % X->ext[inner[i]];
        q /= X->ext[inner[i]];
      }
      int hold = 1;
      for (int i = 0; ok && hold && i < n_cons; i++) {
        int64_t b;
        ok = ev(cons[i], val, X->n_vars, &b);
        hold = b != 0;
      }
      if (!ok || !hold) continue;
      for (int k = 0; ok && k < nc; k++)
        ok = ev(X->f[L->c[grp][k].fi]->args[L->c[grp][k].j], val, X->n_vars,
                &got[n_got * nc + k]);
      n_got++;
    }
    int64_t n_want = 0;
    ok = ok && spec_tuples(S, L, grp, o, want, cap, &n_want) && n_want == n_got;
    if (!ok) break;
    qsort_r(got, (size_t)n_got, (size_t)nc * sizeof *got, cmp_tuple, &nc);
    qsort_r(want, (size_t)n_want, (size_t)nc * sizeof *want, cmp_tuple, &nc);
    ok = !memcmp(got, want, (size_t)(n_got * nc) * sizeof *got);
  }
  free(got);
  free(want);
  return ok;
}

/* The stride, dilation and padding of one spatial dimension that give
 * its output size and make the group check pass. */
static int spatial(const ex *X, const layout *L, nf_conv_desc *d, spec_ctx *S, int grp,
                   const int *group_of) {
  int w = grp == GW;
  int64_t in = w ? d->w : d->h, ker = w ? d->s : d->r, on = w ? d->ow : d->oh;
  for (int64_t str = 1; str <= 16; str++)
    for (int64_t dil = 1; dil <= 8; dil++)
      for (int64_t pad = 0; pad <= dil * (ker - 1); pad++) {
        if (nf__conv_out_size(in, pad, dil, ker, str) != on) continue;
        if (w) d->str_w = str, d->dil_w = dil, d->pad_w = pad;
        else d->str_h = str, d->dil_h = dil, d->pad_h = pad;
        if (check_group(X, L, S, grp, group_of)) return 1;
        if (ker == 1) break; /* a 1-tap kernel: the dilation is moot */
      }
  return 0;
}

/* Tries layout L: shapes, groups, variable groups, then each group. */
static int try_layout(const ex *X, layout *L, nf_conv_desc *d) {
  const nf_graph *g = X->g;
  const nf_tensor *tx = L->fx >= 0 ? &g->tensors[X->f[L->fx]->u.tensor] : &g->tensors[X->st->out];
  const nf_tensor *tf = L->ff >= 0 ? &g->tensors[X->f[L->ff]->u.tensor] : &g->tensors[X->st->out];
  const nf_tensor *ty = L->fy >= 0 ? &g->tensors[X->f[L->fy]->u.tensor] : &g->tensors[X->st->out];
  memset(d, 0, sizeof *d);
  d->kind = L->kind;
  d->n = tx->shape[0], d->c = tx->shape[1], d->h = tx->shape[2], d->w = tx->shape[3];
  d->k = tf->shape[0], d->r = tf->shape[2], d->s = tf->shape[3];
  d->oh = ty->shape[2], d->ow = ty->shape[3];
  if (ty->shape[0] != d->n || ty->shape[1] != d->k || tf->shape[1] < 1 ||
      d->c % tf->shape[1] != 0)
    return 0;
  d->groups = d->c / tf->shape[1];
  if (d->groups < 1 || d->k % d->groups != 0) return 0;
  spec_ctx S = {d, d->k / d->groups, tf->shape[1]};
  /* every variable in one group: the output's by its role, the
   * reduction's by the indices that use them */
  int group_of[NF_MAX_VARS];
  for (int v = 0; v < X->n_vars; v++) group_of[v] = v < 4 ? L->out_group[v] : -1;
  for (int grp = 0; grp < NG; grp++)
    for (int k = 0; k < L->n_comp[grp]; k++) {
      uint32_t m = vars_of(X->f[L->c[grp][k].fi]->args[L->c[grp][k].j], 0);
      for (int v = 0; v < 32; v++) {
        if (!(m & (1u << v))) continue;
        if (v >= X->n_vars) return 0;
        if (group_of[v] < 0) group_of[v] = grp;
        else if (group_of[v] != grp) return 0;
      }
    }
  for (int v = 4; v < X->n_vars; v++)
    if (group_of[v] < 0 && X->ext[v] != 1) return 0; /* an unused sum: a multiple */
  /* each conjunct within one group */
  for (int i = 0; i < X->n_con; i++) {
    uint32_t m = vars_of(X->con[i], 0);
    int seen = -1;
    for (int v = 0; v < 32; v++) {
      if (!(m & (1u << v))) continue;
      if (v >= X->n_vars || group_of[v] < 0) return 0;
      if (seen >= 0 && seen != group_of[v]) return 0;
      seen = group_of[v];
    }
    if (seen < 0) { /* no variable: it must hold */
      int64_t b = 0, val[1] = {0};
      if (!ev(X->con[i], val, 0, &b) || !b) return 0;
    }
  }
  if (!check_group(X, L, &S, GB, group_of) || !check_group(X, L, &S, GC, group_of)) return 0;
  if (!spatial(X, L, d, &S, GH, group_of) || !spatial(X, L, d, &S, GW, group_of)) return 0;
  d->t_x = L->fx >= 0 ? X->f[L->fx]->u.tensor : X->st->out;
  d->t_f = L->ff >= 0 ? X->f[L->ff]->u.tensor : X->st->out;
  d->t_y = L->fy >= 0 ? X->f[L->fy]->u.tensor : X->st->out;
  return 1;
}

/* The layouts of the three kinds with factor a first (then b = 1 - a). */
static void make_layout(layout *L, nf_conv_kind kind, int a) {
  int b = 1 - a;
  memset(L, 0, sizeof *L);
  L->kind = kind;
  if (kind != NF_CONV_BWD_FILTER) {
    /* forward Y(n, k, y, x) = X(a) * F(b); data gradient X(n, c, h, w) =
     * Y(a) * F(b): the same places, a the image or the result */
    L->fx = kind == NF_CONV_FWD ? a : -1;
    L->fy = kind == NF_CONV_FWD ? -1 : a;
    L->ff = b;
    L->n_comp[GB] = 1, L->c[GB][0] = (comp){a, 0};
    L->n_comp[GC] = 3, L->c[GC][0] = (comp){a, 1}, L->c[GC][1] = (comp){b, 0},
    L->c[GC][2] = (comp){b, 1};
    L->n_comp[GH] = 2, L->c[GH][0] = (comp){a, 2}, L->c[GH][1] = (comp){b, 2};
    L->n_comp[GW] = 2, L->c[GW][0] = (comp){a, 3}, L->c[GW][1] = (comp){b, 3};
    L->out_group[0] = GB, L->out_group[1] = GC, L->out_group[2] = GH, L->out_group[3] = GW;
  } else { /* F(k, c, r, s) = Y(a) * X(b) */
    L->fy = a, L->fx = b, L->ff = -1;
    L->n_comp[GB] = 2, L->c[GB][0] = (comp){a, 0}, L->c[GB][1] = (comp){b, 0};
    L->n_comp[GC] = 2, L->c[GC][0] = (comp){a, 1}, L->c[GC][1] = (comp){b, 1};
    L->n_comp[GH] = 2, L->c[GH][0] = (comp){a, 2}, L->c[GH][1] = (comp){b, 2};
    L->n_comp[GW] = 2, L->c[GW][0] = (comp){a, 3}, L->c[GW][1] = (comp){b, 3};
    L->out_group[0] = GC, L->out_group[1] = GC, L->out_group[2] = GH, L->out_group[3] = GW;
  }
}

int nf__conv_match_enum(const nf_graph *g, uint32_t si, nf_conv_desc *d) {
  if (si >= g->n_stmts) return 0;
  ex X;
  memset(&X, 0, sizeof X);
  X.g = g;
  X.st = &g->stmts[si];
  const nf_tensor *out = &g->tensors[X.st->out];
  if (X.st->red != NF_RED_SUM || out->rank != 4 || out->dtype != NF_F32 || X.st->n_red < 1 ||
      4 + X.st->n_red > 32 || 4 + X.st->n_red > NF_MAX_VARS)
    return 0;
  X.n_vars = 4 + X.st->n_red;
  for (int v = 0; v < 4; v++) X.ext[v] = out->shape[v];
  for (int r = 0; r < X.st->n_red; r++) {
    X.lo[4 + r] = X.st->red_lo[r];
    X.ext[4 + r] = X.st->red_ext[r];
  }
  for (int v = 0; v < X.n_vars; v++)
    if (X.ext[v] < 1) return 0;
  const nf_expr *e = peel(&X, X.st->rhs);
  if (!e || e->op != NF_OP_MUL || e->n_args != 2) return 0;
  for (int i = 0; i < 2; i++) {
    const nf_expr *f = peel(&X, e->args[i]);
    const nf_tensor *t = f && f->op == NF_OP_ACCESS ? &g->tensors[f->u.tensor] : NULL;
    if (!t || f->dtype != NF_F32 || t->dtype != NF_F32 || t->rank != 4 || f->n_args != 4 ||
        f->u.tensor == X.st->out)
      return 0;
    X.f[i] = f;
  }
  static const nf_conv_kind kinds[3] = {NF_CONV_FWD, NF_CONV_BWD_FILTER, NF_CONV_BWD_DATA};
  for (int k = 0; k < 3; k++)
    for (int a = 0; a < 2; a++) {
      layout L;
      make_layout(&L, kinds[k], a);
      if (try_layout(&X, &L, d)) return 1;
    }
  memset(d, 0, sizeof *d);
  return 0;
}
