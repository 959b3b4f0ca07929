/* interp.c - the reference interpreter (see nf_interp.h).
 *
 * Each statement's right-hand side is compiled once into a small register
 * program: one instruction per distinct expression node (expressions are
 * hash-consed, so pointer identity finds shared subterms), in post-order.
 * A program runs over a block of up to BLK consecutive values of one index
 * variable, the "vector variable": the last output variable when the
 * output has rank >= 1, else the last reduction variable.
 *
 * Order of evaluation, which fixes the rounding of every reduction:
 *  - rank >= 1: the other output variables outermost, then one block of
 *    the vector variable, then the reduction variables in lexicographic
 *    order (first outermost); each lane folds its own output element, so
 *    every element sees exactly the sequential order.
 *  - rank 0: the reduction variables but the last in lexicographic order,
 *    then blocks of the last one; the lanes of a block are folded into the
 *    scalar in lane order, which again is the sequential order.
 *
 * Laziness of SELECT: instructions reachable from the root without passing
 * through a SELECT branch are "unconditional" and run on every lane, in
 * program order.  Everything else runs on demand under a lane mask
 * (eval_masked), remembering per instruction which lanes it already holds,
 * so a node shared by both branches is computed once per lane.  Pure
 * arithmetic may compute inactive lanes (harmless: integers wrap through
 * uint64, floats are IEEE), but loads, integer // and %, and float-to-int
 * casts touch active lanes only: an inactive lane never loads, never
 * raises a bounds, division or conversion error.
 *
 * Values: float tensors and registers are double.  In NF_INTERP_F32 mode
 * the result of every f16/bf16/f32 operation and cast is rounded to float,
 * so elementwise arithmetic is exactly f32 arithmetic; reductions
 * accumulate in double and round when the tensor is stored (an oracle more
 * accurate than a sequential f32 sum).  int and bool are int64 (i32 values
 * wrap to 32 bits after every i32 operation, bools are 0/1).
 *
 * Accesses whose indices are all affine (nf_expr_affine) compute a base
 * offset and a lane stride per block and check the bounds at the first and
 * last lane only; other accesses check every active lane.
 *
 * Bounds (nf_interp_run_bounded): every float register and tensor has a
 * twin holding a bound on how far a correct evaluation in the dtype's
 * own precision may be from its value (the rules are in nf_interp.h).
 * They are computed next to the values, lane by lane, from the f64
 * values and the operands' bounds (bound_float, fold_bound); the
 * reductions keep per accumulator the bound of its terms, sum |t| and
 * the sum of its squared partial sums.  Integer registers carry none.
 *
 * Not done here: graph checking beyond nf_graph_validate, any speed beyond
 * "fast enough to be the oracle", threads. */
#include "nf_interp.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ptrmap.h"

#define BLK 256

enum { ST_NONE = 0, ST_PARTIAL, ST_ALL };

typedef struct tstore {
  double *f;  /* float tensors */
  int64_t *i; /* int and bool tensors */
  double *eb; /* bounded runs: the bound of each element of a float tensor */
  int64_t numel;
  int64_t stride[NF_MAX_RANK]; /* elements, row-major */
  const nf_tensor *t;
} tstore;

typedef struct inst {
  const nf_expr *e;
  uint8_t op, dtype;
  uint8_t fl;     /* value is float (double register) */
  uint8_t argfl;  /* first argument is float (casts, comparisons) */
  uint8_t uncond; /* needed on every lane */
  uint8_t n_args;
  int32_t arg[NF_MAX_RANK]; /* instruction numbers */
  nf_affine *aff;           /* ACCESS with all-affine indices: one per dim */
} inst;

typedef struct prog {
  inst *in;
  int32_t n, cap;
  int32_t *uncond; /* unconditional instructions in program order */
  int32_t n_uncond;
  unsigned char *regs; /* n * BLK slots of 8 bytes */
  uint8_t *state;      /* ST_* per instruction, reset every block */
  uint8_t *have;       /* n * BLK lane masks for ST_PARTIAL */
  unsigned char *eregs; /* bounded runs: n * BLK bounds of the float registers */
} prog;

typedef struct rt {
  const nf_graph *g;
  nf_precision prec;
  int bnd; /* compute bounds (nf_interp_run_bounded) */
  tstore *ts;
  nf_buf *err;
  /* the statement being run */
  uint32_t si;
  const nf_stmt *st;
  prog *p;
  int nv;   /* variables of the statement */
  int vvar; /* vector variable, or -1 */
  int n;    /* lanes in the current block */
  int64_t vals[NF_MAX_VARS]; /* variable values; vals[vvar] is lane 0's */
} rt;

#define REG_F(r, k) ((double *)((r)->p->regs + (size_t)(k) * BLK * 8))
#define REG_I(r, k) ((int64_t *)((r)->p->regs + (size_t)(k) * BLK * 8))
#define REG_E(r, k) ((double *)((r)->p->eregs + (size_t)(k) * BLK * 8))

static int is_fl(unsigned t) {
  return t == NF_F16 || t == NF_BF16 || t == NF_F32 || t == NF_F64;
}

static int64_t wrap32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

static const char *dtype_str(unsigned t) {
  static const char *const names[] = {"bool", "i32", "i64", "f16",
                                      "bf16", "f32", "f64"};
  return t < NF_N_DTYPES ? names[t] : "?";
}

/* ---- messages ---- */

static const char *tname(const rt *r, uint32_t tid) {
  const char *s = r->g->tensors[tid].name;
  return s ? s : "?";
}

static void stmt_prefix(rt *r) {
  nf_buf_printf(r->err, "statement %u (%s): ", r->si, tname(r, r->st->out));
}

/* Appends " at i=.., k=.." for lane l. */
static void lane_loc(rt *r, int l) {
  if (r->nv == 0) return;
  nf_buf_puts(r->err, " at ");
  for (int v = 0; v < r->nv; v++) {
    const char *nm = r->st->var_names[v];
    int64_t x = r->vals[v] + (v == r->vvar ? l : 0);
    if (nm)
      nf_buf_printf(r->err, "%s%s=%lld", v ? ", " : "", nm, (long long)x);
    else
      nf_buf_printf(r->err, "%sv%d=%lld", v ? ", " : "", v, (long long)x);
  }
}

static int oob_error(rt *r, const inst *in, const int64_t *idx) {
  const tstore *t = &r->ts[in->e->u.tensor];
  stmt_prefix(r);
  nf_buf_puts(r->err, "index (");
  for (int d = 0; d < t->t->rank; d++)
    nf_buf_printf(r->err, d ? ", %lld" : "%lld", (long long)idx[d]);
  nf_buf_printf(r->err, ") out of bounds for tensor %s of shape [",
                tname(r, in->e->u.tensor));
  for (int d = 0; d < t->t->rank; d++)
    nf_buf_printf(r->err, d ? ", %lld" : "%lld", (long long)t->t->shape[d]);
  nf_buf_puts(r->err, "]");
  return NF_EBOUNDS;
}

static int lane_error(rt *r, int rc, int l, const char *fmt, ...)
    NF_PRINTF(4, 5);

static int lane_error(rt *r, int rc, int l, const char *fmt, ...) {
  va_list ap;
  stmt_prefix(r);
  va_start(ap, fmt);
  nf_buf_vprintf(r->err, fmt, ap);
  va_end(ap);
  lane_loc(r, l);
  return rc;
}

/* ---- compiling a statement ---- */

/* node -> its instruction (common pointer map); -1 when absent */
static int32_t map_get(const nf_ptrmap *m, const nf_expr *e) {
  uint64_t v;
  return nf_ptrmap_get(m, e, &v) ? (int32_t)v : -1;
}

static int map_put(nf_ptrmap *m, const nf_expr *e, int32_t v) {
  return nf_ptrmap_put(m, e, (uint64_t)(uint32_t)v);
}

static void prog_free(prog *p) {
  for (int32_t k = 0; k < p->n; k++) free(p->in[k].aff);
  free(p->in);
  free(p->uncond);
  free(p->regs);
  free(p->state);
  free(p->have);
  free(p->eregs);
  memset(p, 0, sizeof *p);
}

/* Fills aff[0..rank) when every index of the access is affine. */
static int access_affine(const nf_expr *e, nf_affine *aff) {
  for (int d = 0; d < e->n_args; d++)
    if (nf_expr_affine(e->args[d], &aff[d]) != 1) return 0;
  return 1;
}

/* Number of instruction arguments of e: none for an affine access. */
static int n_children(const nf_expr *e, int affine) {
  if (e->op == NF_OP_ACCESS && affine) return 0;
  if (e->op == NF_OP_CONST || e->op == NF_OP_VAR) return 0;
  return e->n_args;
}

/* Appends the instruction of e; takes ownership of aff (the affine forms
 * of an all-affine access, else NULL) even on failure. */
static int emit(prog *p, nf_ptrmap *m, const nf_expr *e, nf_affine *aff) {
  if (p->n == p->cap) {
    int32_t ncap = p->cap ? p->cap * 2 : 32;
    inst *ni = realloc(p->in, (size_t)ncap * sizeof *ni);
    if (!ni) {
      free(aff);
      return NF_ENOMEM;
    }
    p->in = ni;
    p->cap = ncap;
  }
  inst *in = &p->in[p->n];
  memset(in, 0, sizeof *in);
  in->e = e;
  in->op = e->op;
  in->dtype = e->dtype;
  in->fl = (uint8_t)is_fl(e->dtype);
  in->argfl = (uint8_t)(e->n_args > 0 && is_fl(e->args[0]->dtype));
  int nc = n_children(e, aff != NULL);
  NF_ASSERT(nc <= NF_MAX_RANK); /* validated: arity <= 3, rank <= 8 */
  in->n_args = (uint8_t)nc;
  for (int k = 0; k < nc; k++) {
    in->arg[k] = map_get(m, e->args[k]);
    NF_ASSERT(in->arg[k] >= 0);
  }
  in->aff = aff;
  int rc = map_put(m, e, p->n);
  if (rc < 0) {
    free(aff);
    return rc;
  }
  p->n++;
  return NF_OK;
}

typedef struct frame {
  const nf_expr *e;
  nf_affine *aff; /* owned until emitted */
  int next, nc;
} frame;

/* The affine forms of an access whose indices are all affine (malloc'ed),
 * else NULL (also when out of memory: the generic path is always right). */
static nf_affine *access_affine_new(const nf_expr *e) {
  if (e->op != NF_OP_ACCESS || e->n_args > NF_MAX_RANK) return NULL;
  nf_affine *aff = malloc((e->n_args ? e->n_args : 1) * sizeof *aff);
  if (aff && !access_affine(e, aff)) {
    free(aff);
    aff = NULL;
  }
  return aff;
}

typedef struct fstack {
  frame *f;
  size_t n, cap;
} fstack;

static int push(fstack *st, const nf_expr *e) {
  if (st->n == st->cap) {
    size_t ncap = st->cap ? st->cap * 2 : 64;
    frame *nf = realloc(st->f, ncap * sizeof *nf);
    if (!nf) return NF_ENOMEM;
    st->f = nf;
    st->cap = ncap;
  }
  frame *f = &st->f[st->n++];
  f->e = e;
  f->next = 0;
  f->aff = access_affine_new(e);
  f->nc = n_children(e, f->aff != NULL);
  return NF_OK;
}

/* Builds the program of rhs: post-order, each distinct node once, with an
 * explicit stack (expressions may be deep). */
static int compile(prog *p, const nf_expr *rhs, int bnd) {
  nf_ptrmap m = NF_PTRMAP_INIT;
  fstack st = {0};
  int rc;
  memset(p, 0, sizeof *p);

  if ((rc = push(&st, rhs)) < 0) goto out;
  while (st.n > 0) {
    frame *f = &st.f[st.n - 1];
    if (f->next < f->nc) {
      const nf_expr *c = f->e->args[f->next++];
      if (map_get(&m, c) < 0 && (rc = push(&st, c)) < 0) goto out;
      continue;
    }
    st.n--;
    if ((rc = emit(p, &m, f->e, f->aff)) < 0) goto out;
  }

  /* Unconditional instructions: reverse program order visits every user
   * before its arguments; SELECT branches do not propagate. */
  p->in[p->n - 1].uncond = 1;
  for (int32_t k = p->n - 1; k >= 0; k--) {
    inst *in = &p->in[k];
    if (!in->uncond) continue;
    int na = in->op == NF_OP_SELECT ? 1 : in->n_args;
    for (int a = 0; a < na; a++) p->in[in->arg[a]].uncond = 1;
  }
  p->uncond = malloc((size_t)p->n * sizeof *p->uncond);
  p->regs = calloc((size_t)p->n * BLK, 8);
  p->state = calloc((size_t)p->n, 1);
  p->have = calloc((size_t)p->n * BLK, 1);
  if (bnd) p->eregs = calloc((size_t)p->n * BLK, 8);
  if (!p->uncond || !p->regs || !p->state || !p->have || (bnd && !p->eregs)) {
    rc = NF_ENOMEM;
    goto out;
  }
  for (int32_t k = 0; k < p->n; k++)
    if (p->in[k].uncond) p->uncond[p->n_uncond++] = k;
out:
  while (st.n > 0) free(st.f[--st.n].aff);
  free(st.f);
  nf_ptrmap_free(&m);
  if (rc < 0) prog_free(p);
  return rc;
}

/* ---- executing one instruction ---- */

static int eval_masked(rt *r, int32_t k, const uint8_t *mask);

#define ACTIVE(l) (!need || need[l])

static void load_lanes(rt *r, const inst *in, int64_t off0, int64_t ds,
                       const uint8_t *need, int32_t k) {
  const tstore *t = &r->ts[in->e->u.tensor];
  int n = r->n;
  if (in->fl) {
    double *restrict d = REG_F(r, k);
    const double *restrict s = t->f + off0;
    if (!need) {
      if (ds == 1)
        memcpy(d, s, (size_t)n * sizeof *d);
      else if (ds == 0)
        for (int l = 0; l < n; l++) d[l] = s[0];
      else
        for (int l = 0; l < n; l++) d[l] = s[(int64_t)l * ds];
    } else {
      for (int l = 0; l < n; l++)
        if (need[l]) d[l] = s[(int64_t)l * ds];
    }
    if (r->bnd) {
      double *restrict e = REG_E(r, k);
      const double *restrict se = t->eb + off0;
      for (int l = 0; l < n; l++)
        if (!need || need[l]) e[l] = se[(int64_t)l * ds];
    }
  } else {
    int64_t *restrict d = REG_I(r, k);
    const int64_t *restrict s = t->i + off0;
    if (!need) {
      if (ds == 1)
        memcpy(d, s, (size_t)n * sizeof *d);
      else
        for (int l = 0; l < n; l++) d[l] = s[(int64_t)l * ds];
    } else {
      for (int l = 0; l < n; l++)
        if (need[l]) d[l] = s[(int64_t)l * ds];
    }
  }
}

/* Loads lane l from the element with the given index (already checked). */
static void load_one(rt *r, const inst *in, const int64_t *idx, int l,
                     int32_t k) {
  const tstore *t = &r->ts[in->e->u.tensor];
  int64_t off = 0;
  for (int d = 0; d < t->t->rank; d++) off += idx[d] * t->stride[d];
  if (in->fl) {
    REG_F(r, k)[l] = t->f[off];
    if (r->bnd) REG_E(r, k)[l] = t->eb[off];
  } else {
    REG_I(r, k)[l] = t->i[off];
  }
}

static int in_range(int64_t v, int64_t n) { return v >= 0 && v < n; }

static int exec_access(rt *r, int32_t k, const uint8_t *need) {
  const inst *in = &r->p->in[k];
  const tstore *t = &r->ts[in->e->u.tensor];
  int rank = t->t->rank, n = r->n;
  const int64_t *shape = t->t->shape;
  int64_t idx[NF_MAX_RANK];

  if (!in->aff) {
    for (int l = 0; l < n; l++) {
      if (!ACTIVE(l)) continue;
      int ok = 1;
      for (int d = 0; d < rank; d++) {
        idx[d] = REG_I(r, in->arg[d])[l];
        ok &= in_range(idx[d], shape[d]);
      }
      if (!ok) return oob_error(r, in, idx);
      load_one(r, in, idx, l, k);
    }
    return NF_OK;
  }

  /* Affine: index d of lane l is v0[d] + l * dl[d] (wrapping like i64). */
  uint64_t v0[NF_MAX_RANK], dl[NF_MAX_RANK];
  int all_in = 1;
  for (int d = 0; d < rank; d++) {
    const nf_affine *a = &in->aff[d];
    uint64_t s = (uint64_t)a->c, delta = 0;
    for (int j = 0; j < a->n; j++) {
      s += (uint64_t)a->coef[j] * (uint64_t)r->vals[a->var[j]];
      if ((int)a->var[j] == r->vvar) delta = (uint64_t)a->coef[j];
    }
    v0[d] = s;
    dl[d] = delta;
    int64_t first = (int64_t)s, last, step;
    if (!in_range(first, shape[d]) ||
        __builtin_mul_overflow((int64_t)delta, (int64_t)(n - 1), &step) ||
        __builtin_add_overflow(first, step, &last) || !in_range(last, shape[d]))
      all_in = 0;
  }
  if (all_in) {
    int64_t off0 = 0, ds = 0;
    for (int d = 0; d < rank; d++) {
      off0 += (int64_t)v0[d] * t->stride[d];
      if (n > 1) ds += (int64_t)dl[d] * t->stride[d];
    }
    load_lanes(r, in, off0, ds, need, k);
    return NF_OK;
  }
  for (int l = 0; l < n; l++) {
    if (!ACTIVE(l)) continue;
    int ok = 1;
    for (int d = 0; d < rank; d++) {
      idx[d] = (int64_t)(v0[d] + (uint64_t)l * dl[d]);
      ok &= in_range(idx[d], shape[d]);
    }
    if (!ok) return oob_error(r, in, idx);
    load_one(r, in, idx, l, k);
  }
  return NF_OK;
}

static int round_to_f32(const rt *r, unsigned t) {
  return r->prec == NF_INTERP_F32 && (t == NF_F16 || t == NF_BF16 || t == NF_F32);
}

static int exec_cast(rt *r, int32_t k, const uint8_t *need) {
  const inst *in = &r->p->in[k];
  int n = r->n;
  unsigned to = in->dtype;
  if (in->argfl) {
    const double *restrict a = REG_F(r, in->arg[0]);
    if (in->fl) {
      double *restrict d = REG_F(r, k);
      if (round_to_f32(r, to))
        for (int l = 0; l < n; l++) d[l] = (float)a[l];
      else
        for (int l = 0; l < n; l++) d[l] = a[l];
    } else if (to == NF_BOOL) {
      int64_t *restrict d = REG_I(r, k);
      for (int l = 0; l < n; l++) d[l] = a[l] != 0;
    } else {
      int64_t *restrict d = REG_I(r, k);
      double lo = to == NF_I32 ? -2147483648.0 : -9223372036854775808.0;
      double hi = to == NF_I32 ? 2147483648.0 : 9223372036854775808.0;
      for (int l = 0; l < n; l++) {
        if (!ACTIVE(l)) continue;
        double x = trunc(a[l]);
        if (!(x >= lo && x < hi))
          return lane_error(r, NF_ERANGE, l, "cannot convert %g to %s", a[l],
                            dtype_str(to));
        d[l] = (int64_t)x;
      }
    }
    return NF_OK;
  }
  const int64_t *restrict a = REG_I(r, in->arg[0]);
  if (in->fl) {
    double *restrict d = REG_F(r, k);
    if (round_to_f32(r, to))
      for (int l = 0; l < n; l++) d[l] = (float)a[l];
    else
      for (int l = 0; l < n; l++) d[l] = (double)a[l];
  } else {
    int64_t *restrict d = REG_I(r, k);
    if (to == NF_BOOL)
      for (int l = 0; l < n; l++) d[l] = a[l] != 0;
    else if (to == NF_I32)
      for (int l = 0; l < n; l++) d[l] = wrap32(a[l]);
    else
      for (int l = 0; l < n; l++) d[l] = a[l];
  }
  return NF_OK;
}

static double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

/* NaN-propagating min and max. */
static double fmax_nan(double a, double b) { return (a > b || a != a) ? a : b; }
static double fmin_nan(double a, double b) { return (a < b || a != a) ? a : b; }

static int unsupported(rt *r, const inst *in) {
  stmt_prefix(r);
  nf_buf_printf(r->err, "operator '%s' is not defined on %s",
                nf_op_name((nf_op)in->op),
                dtype_str(in->n_args ? in->e->args[0]->dtype : in->dtype));
  return NF_EINVAL;
}

/* ---- error bounds (nf_interp_run_bounded; the rules: nf_interp.h) ---- */

/* Unit roundoff, largest finite and smallest normal value of float dtype t. */
static double unit_ro(unsigned t) {
  return t == NF_F64 ? 0x1p-53 : t == NF_F16 ? 0x1p-11 : t == NF_BF16 ? 0x1p-8 : 0x1p-24;
}

static double max_fin(unsigned t) {
  return t == NF_F64 ? DBL_MAX : t == NF_F16 ? 65504.0 : FLT_MAX;
}

static double min_norm(unsigned t) {
  return t == NF_F64 ? DBL_MIN : t == NF_F16 ? 0x1p-14 : FLT_MIN;
}

/* The rounding of one operation's result v to dtype t (the smallest
 * normal number covers a result flushed to zero). */
static double own(unsigned t, double v) {
  return isfinite(v) ? unit_ro(t) * fabs(v) + min_norm(t) : 0;
}

/* |x| e, where an exact operand (e = 0) contributes nothing even next to
 * an infinite x. */
static double sm(double x, double e) { return e == 0 ? 0 : fabs(x) * e; }

/* The final bound of a value v of dtype t whose propagated and own
 * error is e: undetermined (+inf) where v may overflow t, or where v is
 * not finite unless certainly so (`certain`: from exact operands, the same
 * operation overflows or has no value in any precision; a NaN operand
 * that is certainly NaN propagates; an argument certainly outside the
 * domain). */
static double settle(unsigned t, double v, double e, int certain) {
  if (!isfinite(v)) return certain ? 0 : INFINITY;
  if (!(e >= 0)) return INFINITY;
  if (fabs(v) + e > max_fin(t)) return INFINITY;
  return e;
}

/* Max of |f'| over [x - ex, x + ex] for an f' that is even and falls
 * away from 0 (tanh, sigmoid, erf): f' at the point nearest 0. */
static double nearest0(double x, double ex) { return fmax(fabs(x) - ex, 0); }

/* The bound of float instruction k (an operator) on every lane, from its
 * operands' values and bounds. */
static void bound_float(rt *r, int32_t k) {
  const inst *in = &r->p->in[k];
  unsigned t = in->dtype;
  int n = r->n;
  double *restrict E = REG_E(r, k);
  const double *d = REG_F(r, k);
  const double *a = in->n_args > 0 ? REG_F(r, in->arg[0]) : NULL;
  const double *b = in->n_args > 1 ? REG_F(r, in->arg[1]) : NULL;
  const double *ea = in->n_args > 0 ? REG_E(r, in->arg[0]) : NULL;
  const double *eb = in->n_args > 1 ? REG_E(r, in->arg[1]) : NULL;
  double u = unit_ro(t), fu = 16 * u, mn = min_norm(t);
  for (int l = 0; l < n; l++) {
    double x = a ? a[l] : 0, y = b ? b[l] : 0, ex = ea ? ea[l] : 0, ey = eb ? eb[l] : 0;
    double v = d[l], e, m, lo, q, eq;
    /* a NaN result is certain when an operand is certainly NaN (every
     * operator here propagates NaN) or the argument is certainly outside
     * the domain (below) */
    int certain = (ex == 0 && ey == 0) ||
                  (isnan(v) && ((a && isnan(x) && ex == 0) || (b && isnan(y) && ey == 0)));
    switch (in->op) {
    case NF_OP_NEG:
    case NF_OP_ABS:
    case NF_OP_STOPGRAD: e = ex; break;
    case NF_OP_ADD:
    case NF_OP_SUB: e = ex + ey + own(t, v); break;
    case NF_OP_MUL: e = sm(y, ex) + sm(x, ey) + sm(ex, ey) + own(t, v); break;
    case NF_OP_DIV:
      /* |a'/b' - a/b| = |da - (a/b) db| / |b'| */
      e = ey < fabs(y) ? (ex + sm(v, ey)) / (fabs(y) - ey) + own(t, v) : INFINITY;
      certain |= y == 0 && ey == 0 && fabs(x) > ex; /* +-inf, the sign of a */
      break;
    case NF_OP_SQRT:
      /* |sqrt(a') - sqrt(a)| = |da| / (sqrt(a') + sqrt(a)) <= min(|da| / sqrt(a), sqrt(|da|)) */
      if (x - ex < 0) e = INFINITY;
      else e = (x > 0 ? fmin(ex / sqrt(x), sqrt(ex)) : sqrt(ex)) + own(t, v);
      certain |= x + ex < 0;
      break;
    case NF_OP_RSQRT:
      lo = x - ex;
      e = lo > 0 ? ex * 0.5 / (lo * sqrt(lo)) + fu * fabs(v) + mn : INFINITY;
      certain |= x + ex < 0;
      break;
    case NF_OP_EXP: e = sm(v, expm1(ex)) + fu * fabs(v) + mn; break;
    case NF_OP_LOG:
      lo = x - ex;
      e = lo > 0 ? ex / lo + fu * fabs(v) + mn : INFINITY;
      certain |= x + ex < 0;
      break;
    case NF_OP_TANH:
      m = tanh(nearest0(x, ex));
      e = sm(1 - m * m, ex) + fu * fabs(v) + mn;
      break;
    case NF_OP_SIGMOID:
      m = sigmoid(nearest0(x, ex));
      e = sm(m * (1 - m), ex) + fu * fabs(v) + mn;
      break;
    case NF_OP_ERF:
      m = nearest0(x, ex);
      e = sm(M_2_SQRTPI * exp(-m * m), ex) + fu * fabs(v) + mn;
      break;
    case NF_OP_FLOOR: e = floor(x - ex) == floor(x + ex) ? 0 : ex + 1; break;
    case NF_OP_CEIL: e = ceil(x - ex) == ceil(x + ex) ? 0 : ex + 1; break;
    case NF_OP_FLOORDIV:
    case NF_OP_MOD:
      /* floor(a / b): exact unless a' / b' may cross an integer, then off
       * by up to the quotient's bound + 1; a mod b = a - b floor(a / b) */
      q = x / y;
      eq = ey < fabs(y) ? (ex + sm(q, ey)) / (fabs(y) - ey) + own(t, q) : INFINITY;
      m = floor(q - eq) == floor(q + eq) ? 0 : eq + 1;
      if (in->op == NF_OP_FLOORDIV) {
        e = m;
      } else {
        double fq = floor(q);
        e = ex + sm(fq, ey) + sm(y, m) + sm(ey, m) + own(t, y * fq) + own(t, v);
      }
      break;
    case NF_OP_POW:
      if (x > 0) {
        lo = x - ex;
        e = lo > 0 ? sm(v, fabs(y) * ex / lo + sm(log(x), ey)) + fu * fabs(v) + mn : INFINITY;
      } else {
        e = ex == 0 && ey == 0 ? fu * fabs(v) + mn : INFINITY;
      }
      break;
    case NF_OP_MIN:
    case NF_OP_MAX: e = fmax(ex, ey); break;
    default: e = INFINITY; break;
    }
    E[l] = settle(t, v, e, certain);
  }
}

/* The bound of float cast k on every lane: a float narrowed to t rounds,
 * an integer converts exactly or rounds; integers themselves are exact. */
static void bound_cast(rt *r, int32_t k) {
  const inst *in = &r->p->in[k];
  unsigned to = in->dtype, from = in->e->args[0]->dtype;
  const double *d = REG_F(r, k);
  double *E = REG_E(r, k);
  if (in->argfl) {
    const double *ea = REG_E(r, in->arg[0]);
    int narrows = unit_ro(to) > unit_ro(from);
    for (int l = 0; l < r->n; l++)
      E[l] = settle(to, d[l], ea[l] + (narrows ? own(to, d[l]) : 0), ea[l] == 0);
  } else {
    for (int l = 0; l < r->n; l++)
      E[l] = to == NF_F64 ? 0 : fabs(d[l] - (double)(float)d[l]);
  }
}

/* Folds the bounds of one term per lane (values v, bounds ev) into
 * accumulators that hold acc before this term; first: the first term;
 * cnan[l] set once a term is certainly NaN (every reduction propagates it). */
static void fold_bound(unsigned red, unsigned dt, const double *acc, const double *v,
                       const double *ev, double *eacc, double *eabs, double *eq, uint8_t *cnan,
                       int first, int n) {
  for (int l = 0; l < n; l++) {
    if (isnan(v[l]) && ev[l] == 0) cnan[l] = 1;
    switch (red) {
    case NF_RED_SUM: {
      double s = acc[l] + v[l];
      eacc[l] += ev[l];
      eabs[l] += fabs(v[l]);
      if (!first) eq[l] += s * s;
      break;
    }
    case NF_RED_PROD:
      eacc[l] = first ? ev[l]
                      : sm(v[l], eacc[l]) + sm(acc[l], ev[l]) + sm(eacc[l], ev[l]) +
                            own(dt, acc[l] * v[l]);
      break;
    case NF_RED_MAX:
    case NF_RED_MIN: eacc[l] = first ? ev[l] : fmax(eacc[l], ev[l]); break;
    default: eacc[l] = ev[l]; break;
    }
  }
}

/* The bound of an accumulated value v of dtype dt: its terms' bounds,
 * plus for a sum of n_terms its own rounding (nf_interp.h); cnan: a term
 * was certainly NaN. */
static double acc_bound(unsigned red, unsigned dt, double v, double n_terms, double eacc,
                        double eabs, double eq, int cnan) {
  double e = eacc;
  if (red == NF_RED_SUM && n_terms > 1) {
    double w = unit_ro(dt) * fmin((n_terms - 1) * eabs, 16 * sqrt(eq));
    e += w == w ? w : INFINITY;
  }
  return settle(dt, v, e, eacc == 0 || (cnan && isnan(v)));
}

static int exec_float(rt *r, int32_t k) {
  const inst *in = &r->p->in[k];
  int n = r->n;
  double *restrict d = REG_F(r, k);
  const double *restrict a = in->n_args > 0 ? REG_F(r, in->arg[0]) : NULL;
  const double *restrict b = in->n_args > 1 ? REG_F(r, in->arg[1]) : NULL;
  int l;
  switch (in->op) {
  case NF_OP_NEG: for (l = 0; l < n; l++) d[l] = -a[l]; break;
  case NF_OP_EXP: for (l = 0; l < n; l++) d[l] = exp(a[l]); break;
  case NF_OP_LOG: for (l = 0; l < n; l++) d[l] = log(a[l]); break;
  case NF_OP_SQRT: for (l = 0; l < n; l++) d[l] = sqrt(a[l]); break;
  case NF_OP_RSQRT: for (l = 0; l < n; l++) d[l] = 1.0 / sqrt(a[l]); break;
  case NF_OP_TANH: for (l = 0; l < n; l++) d[l] = tanh(a[l]); break;
  case NF_OP_SIGMOID: for (l = 0; l < n; l++) d[l] = sigmoid(a[l]); break;
  case NF_OP_ERF: for (l = 0; l < n; l++) d[l] = erf(a[l]); break;
  case NF_OP_ABS: for (l = 0; l < n; l++) d[l] = fabs(a[l]); break;
  case NF_OP_FLOOR: for (l = 0; l < n; l++) d[l] = floor(a[l]); break;
  case NF_OP_CEIL: for (l = 0; l < n; l++) d[l] = ceil(a[l]); break;
  case NF_OP_STOPGRAD: for (l = 0; l < n; l++) d[l] = a[l]; break;
  case NF_OP_ADD: for (l = 0; l < n; l++) d[l] = a[l] + b[l]; break;
  case NF_OP_SUB: for (l = 0; l < n; l++) d[l] = a[l] - b[l]; break;
  case NF_OP_MUL: for (l = 0; l < n; l++) d[l] = a[l] * b[l]; break;
  case NF_OP_DIV: for (l = 0; l < n; l++) d[l] = a[l] / b[l]; break;
  case NF_OP_FLOORDIV: for (l = 0; l < n; l++) d[l] = floor(a[l] / b[l]); break;
  case NF_OP_MOD:
    for (l = 0; l < n; l++) d[l] = a[l] - b[l] * floor(a[l] / b[l]);
    break;
  case NF_OP_POW: for (l = 0; l < n; l++) d[l] = pow(a[l], b[l]); break;
  case NF_OP_MIN: for (l = 0; l < n; l++) d[l] = fmin_nan(a[l], b[l]); break;
  case NF_OP_MAX: for (l = 0; l < n; l++) d[l] = fmax_nan(a[l], b[l]); break;
  default:
    return unsupported(r, in);
  }
  /* In f32 mode every f16/bf16/f32 operation rounds its result to float,
   * as f32 arithmetic does (double rounding is exact for + - * / and sqrt
   * of f32 operands), so an f32 value recomputed in two statements is
   * bit-identical in both (max-reduction masks rely on this). */
  if (round_to_f32(r, in->dtype))
    for (l = 0; l < n; l++) d[l] = (float)d[l];
  return NF_OK;
}

static int exec_compare(rt *r, int32_t k) {
  const inst *in = &r->p->in[k];
  int n = r->n, l;
  int64_t *restrict d = REG_I(r, k);
  if (in->argfl) {
    const double *restrict a = REG_F(r, in->arg[0]), *restrict b = REG_F(r, in->arg[1]);
    switch (in->op) {
    case NF_OP_LT: for (l = 0; l < n; l++) d[l] = a[l] < b[l]; break;
    case NF_OP_LE: for (l = 0; l < n; l++) d[l] = a[l] <= b[l]; break;
    case NF_OP_GT: for (l = 0; l < n; l++) d[l] = a[l] > b[l]; break;
    case NF_OP_GE: for (l = 0; l < n; l++) d[l] = a[l] >= b[l]; break;
    case NF_OP_EQ: for (l = 0; l < n; l++) d[l] = a[l] == b[l]; break;
    case NF_OP_NE: for (l = 0; l < n; l++) d[l] = a[l] != b[l]; break;
    default: return unsupported(r, in);
    }
  } else {
    const int64_t *restrict a = REG_I(r, in->arg[0]), *restrict b = REG_I(r, in->arg[1]);
    switch (in->op) {
    case NF_OP_LT: for (l = 0; l < n; l++) d[l] = a[l] < b[l]; break;
    case NF_OP_LE: for (l = 0; l < n; l++) d[l] = a[l] <= b[l]; break;
    case NF_OP_GT: for (l = 0; l < n; l++) d[l] = a[l] > b[l]; break;
    case NF_OP_GE: for (l = 0; l < n; l++) d[l] = a[l] >= b[l]; break;
    case NF_OP_EQ: for (l = 0; l < n; l++) d[l] = a[l] == b[l]; break;
    case NF_OP_NE: for (l = 0; l < n; l++) d[l] = a[l] != b[l]; break;
    default: return unsupported(r, in);
    }
  }
  return NF_OK;
}

/* Integer and bool operators; i32 results wrap to 32 bits. */
static int exec_int(rt *r, int32_t k, const uint8_t *need) {
  const inst *in = &r->p->in[k];
  int n = r->n, l;
  int64_t *restrict d = REG_I(r, k);
  const int64_t *restrict a = in->n_args > 0 ? REG_I(r, in->arg[0]) : NULL;
  const int64_t *restrict b = in->n_args > 1 ? REG_I(r, in->arg[1]) : NULL;
#define U(x) ((uint64_t)(x))
  switch (in->op) {
  case NF_OP_NEG: for (l = 0; l < n; l++) d[l] = (int64_t)(0 - U(a[l])); break;
  case NF_OP_NOT: for (l = 0; l < n; l++) d[l] = !a[l]; break;
  case NF_OP_ABS:
    for (l = 0; l < n; l++) d[l] = a[l] < 0 ? (int64_t)(0 - U(a[l])) : a[l];
    break;
  case NF_OP_FLOOR:
  case NF_OP_CEIL:
  case NF_OP_STOPGRAD: for (l = 0; l < n; l++) d[l] = a[l]; break;
  case NF_OP_ADD: for (l = 0; l < n; l++) d[l] = (int64_t)(U(a[l]) + U(b[l])); break;
  case NF_OP_SUB: for (l = 0; l < n; l++) d[l] = (int64_t)(U(a[l]) - U(b[l])); break;
  case NF_OP_MUL: for (l = 0; l < n; l++) d[l] = (int64_t)(U(a[l]) * U(b[l])); break;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
    for (l = 0; l < n; l++) {
      if (!ACTIVE(l)) continue;
      int64_t x = a[l], y = b[l], q, m;
      if (y == 0)
        return lane_error(r, NF_ERANGE, l, "integer %s by zero",
                          in->op == NF_OP_MOD ? "modulo" : "division");
      if (y == -1) {
        q = (int64_t)(0 - U(x));
        m = 0;
      } else {
        q = x / y;
        m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q--;
          m += y;
        }
      }
      d[l] = in->op == NF_OP_MOD ? m : q;
      if (in->dtype == NF_I32) d[l] = wrap32(d[l]);
    }
    return NF_OK;
  case NF_OP_MIN: for (l = 0; l < n; l++) d[l] = a[l] < b[l] ? a[l] : b[l]; break;
  case NF_OP_MAX: for (l = 0; l < n; l++) d[l] = a[l] > b[l] ? a[l] : b[l]; break;
  case NF_OP_AND: for (l = 0; l < n; l++) d[l] = a[l] && b[l]; break;
  case NF_OP_OR: for (l = 0; l < n; l++) d[l] = a[l] || b[l]; break;
  default:
    return unsupported(r, in);
  }
#undef U
  if (in->dtype == NF_I32)
    for (l = 0; l < n; l++) d[l] = wrap32(d[l]);
  return NF_OK;
}

static int exec_select(rt *r, int32_t k, const uint8_t *need) {
  const inst *in = &r->p->in[k];
  int n = r->n, nt = 0, nf = 0, rc;
  uint8_t tm[BLK], fm[BLK];
  if (need && (rc = eval_masked(r, in->arg[0], need)) < 0) return rc;
  const int64_t *c = REG_I(r, in->arg[0]);
  for (int l = 0; l < n; l++) {
    int act = ACTIVE(l);
    tm[l] = (uint8_t)(act && c[l]);
    fm[l] = (uint8_t)(act && !c[l]);
    nt += tm[l];
    nf += fm[l];
  }
  if (nt && (rc = eval_masked(r, in->arg[1], tm)) < 0) return rc;
  if (nf && (rc = eval_masked(r, in->arg[2], fm)) < 0) return rc;
  if (in->fl) {
    double *d = REG_F(r, k);
    const double *a = REG_F(r, in->arg[1]), *b = REG_F(r, in->arg[2]);
    for (int l = 0; l < n; l++)
      if (ACTIVE(l)) d[l] = c[l] ? a[l] : b[l];
    if (r->bnd) {
      double *e = REG_E(r, k);
      const double *ea = REG_E(r, in->arg[1]), *eb = REG_E(r, in->arg[2]);
      for (int l = 0; l < n; l++)
        if (ACTIVE(l)) e[l] = c[l] ? ea[l] : eb[l];
    }
  } else {
    int64_t *d = REG_I(r, k);
    const int64_t *a = REG_I(r, in->arg[1]), *b = REG_I(r, in->arg[2]);
    for (int l = 0; l < n; l++)
      if (ACTIVE(l)) d[l] = c[l] ? a[l] : b[l];
  }
  return NF_OK;
}

/* Computes instruction k on the lanes in need (NULL: all lanes), assuming
 * its arguments hold those lanes (SELECT fetches its own). */
static int exec(rt *r, int32_t k, const uint8_t *need) {
  const inst *in = &r->p->in[k];
  int n = r->n;
  switch (in->op) {
  case NF_OP_CONST:
    if (in->fl) {
      double *d = REG_F(r, k);
      for (int l = 0; l < n; l++) d[l] = in->e->u.f;
      if (r->bnd) {
        /* a constant is off by its rounding to its dtype */
        double c = in->e->u.f, e = in->dtype == NF_F64 ? 0 : fabs(c - (double)(float)c);
        for (int l = 0; l < n; l++) REG_E(r, k)[l] = e;
      }
    } else {
      int64_t *d = REG_I(r, k);
      for (int l = 0; l < n; l++) d[l] = in->e->u.i;
    }
    return NF_OK;
  case NF_OP_VAR: {
    int64_t *d = REG_I(r, k);
    int v = (int)in->e->u.var;
    int64_t base = r->vals[v];
    if (v == r->vvar)
      for (int l = 0; l < n; l++) d[l] = base + l;
    else
      for (int l = 0; l < n; l++) d[l] = base;
    return NF_OK;
  }
  case NF_OP_ACCESS:
    return exec_access(r, k, need);
  case NF_OP_CAST: {
    int rc = exec_cast(r, k, need);
    if (rc == NF_OK && r->bnd && in->fl) bound_cast(r, k);
    return rc;
  }
  case NF_OP_SELECT:
    return exec_select(r, k, need);
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
    return exec_compare(r, k);
  default:
    if (in->fl) {
      int rc = exec_float(r, k);
      if (rc == NF_OK && r->bnd) bound_float(r, k);
      return rc;
    }
    return exec_int(r, k, need);
  }
}

/* Makes instruction k hold every lane of mask (and its arguments first). */
static int eval_masked(rt *r, int32_t k, const uint8_t *mask) {
  prog *p = r->p;
  if (p->state[k] == ST_ALL) return NF_OK;
  uint8_t need[BLK];
  uint8_t *have = p->have + (size_t)k * BLK;
  int any = 0, n = r->n, rc;
  if (p->state[k] == ST_NONE) {
    memset(have, 0, (size_t)n);
    for (int l = 0; l < n; l++) any |= need[l] = mask[l];
  } else {
    for (int l = 0; l < n; l++) any |= need[l] = (uint8_t)(mask[l] && !have[l]);
  }
  if (!any) return NF_OK;
  const inst *in = &p->in[k];
  if (in->op != NF_OP_SELECT)
    for (int a = 0; a < in->n_args; a++)
      if ((rc = eval_masked(r, in->arg[a], need)) < 0) return rc;
  if ((rc = exec(r, k, need)) < 0) return rc;
  for (int l = 0; l < n; l++) have[l] |= need[l];
  p->state[k] = ST_PARTIAL;
  return NF_OK;
}

/* Runs the program on the current block; the root's register holds the
 * rhs for every lane afterwards. */
static int run_block(rt *r) {
  prog *p = r->p;
  memset(p->state, ST_NONE, (size_t)p->n);
  for (int32_t j = 0; j < p->n_uncond; j++) {
    int32_t k = p->uncond[j];
    int rc = exec(r, k, NULL);
    if (rc < 0) return rc;
    p->state[k] = ST_ALL;
  }
  return NF_OK;
}

/* ---- statements ---- */

typedef union acc_val {
  double f;
  int64_t i;
} acc_val;

static acc_val identity(unsigned red, unsigned dt) {
  acc_val v;
  int fl = is_fl(dt);
  int64_t imax = dt == NF_I32 ? INT32_MAX : dt == NF_BOOL ? 1 : INT64_MAX;
  int64_t imin = dt == NF_I32 ? INT32_MIN : dt == NF_BOOL ? 0 : INT64_MIN;
  switch (red) {
  case NF_RED_PROD:
    if (fl) v.f = 1.0; else v.i = 1;
    break;
  case NF_RED_MAX:
    if (fl) v.f = -INFINITY; else v.i = imin;
    break;
  case NF_RED_MIN:
    if (fl) v.f = INFINITY; else v.i = imax;
    break;
  default:
    if (fl) v.f = 0.0; else v.i = 0;
    break;
  }
  return v;
}

/* acc[l] = acc[l] (op) v[l] for l < n. */
static void fold_f(unsigned red, double *restrict acc, const double *restrict v,
                   int n) {
  int l;
  switch (red) {
  case NF_RED_SUM: for (l = 0; l < n; l++) acc[l] += v[l]; break;
  case NF_RED_PROD: for (l = 0; l < n; l++) acc[l] *= v[l]; break;
  case NF_RED_MAX: for (l = 0; l < n; l++) acc[l] = fmax_nan(acc[l], v[l]); break;
  case NF_RED_MIN: for (l = 0; l < n; l++) acc[l] = fmin_nan(acc[l], v[l]); break;
  default: memcpy(acc, v, (size_t)n * sizeof *acc); break;
  }
}

static void fold_i(unsigned red, int64_t *restrict acc, const int64_t *restrict v,
                   int n) {
  int l;
  switch (red) {
  case NF_RED_SUM:
    for (l = 0; l < n; l++) acc[l] = (int64_t)((uint64_t)acc[l] + (uint64_t)v[l]);
    break;
  case NF_RED_PROD:
    for (l = 0; l < n; l++) acc[l] = (int64_t)((uint64_t)acc[l] * (uint64_t)v[l]);
    break;
  case NF_RED_MAX: for (l = 0; l < n; l++) acc[l] = acc[l] > v[l] ? acc[l] : v[l]; break;
  case NF_RED_MIN: for (l = 0; l < n; l++) acc[l] = acc[l] < v[l] ? acc[l] : v[l]; break;
  default: memcpy(acc, v, (size_t)n * sizeof *acc); break;
  }
}

/* Stores n accumulated values at element offset off of the output. */
static void store(rt *r, const tstore *t, int64_t off, const acc_val *acc,
                  int n) {
  unsigned dt = t->t->dtype;
  if (is_fl(dt)) {
    const double *a = (const double *)acc;
    if (round_to_f32(r, dt))
      for (int l = 0; l < n; l++) t->f[off + l] = (float)a[l];
    else
      memcpy(t->f + off, a, (size_t)n * sizeof *a);
  } else {
    const int64_t *a = (const int64_t *)acc;
    for (int l = 0; l < n; l++)
      t->i[off + l] = dt == NF_I32 ? wrap32(a[l]) : dt == NF_BOOL ? a[l] != 0 : a[l];
  }
}

/* Advances vars[first..last) (skipping skip) like an odometer over their
 * ranges; returns 0 when it wraps around. */
static int odometer(rt *r, const int64_t *lo, const int64_t *ext, int first,
                    int last, int skip) {
  for (int v = last - 1; v >= first; v--) {
    if (v == skip) continue;
    if (++r->vals[v] < lo[v] + ext[v]) return 1;
    r->vals[v] = lo[v];
  }
  return 0;
}

static int run_stmt(rt *r) {
  const nf_stmt *st = r->st;
  const tstore *out = &r->ts[st->out];
  int rank = out->t->rank, nv = rank + st->n_red, rc = NF_OK;
  int64_t lo[NF_MAX_VARS], ext[NF_MAX_VARS];
  unsigned dt = out->t->dtype;
  int fl = is_fl(dt);
  int32_t root = r->p->n - 1;
  acc_val acc[BLK];

  r->nv = nv;
  for (int v = 0; v < nv; v++) {
    lo[v] = v < rank ? 0 : st->red_lo[v - rank];
    ext[v] = v < rank ? out->t->shape[v] : st->red_ext[v - rank];
    r->vals[v] = lo[v];
  }
  int any_empty_red = 0;
  for (int v = rank; v < nv; v++) any_empty_red |= ext[v] == 0;
  for (int v = 0; v < rank; v++)
    if (ext[v] == 0) return NF_OK; /* no elements */
  acc_val id = identity(st->red, dt);

  /* bounded runs: per accumulator, its terms' bound, sum |t| and the sum
   * of its squared partial sums (fold_bound) */
  int bnd = r->bnd && fl;
  double n_terms = 1;
  for (int v = rank; v < nv; v++) n_terms *= (double)ext[v];

  if (rank == 0) {
    acc_val s = id;
    double se = 0, sabs = 0, sq = 0;
    uint8_t scn = 0;
    int first = 1;
    r->vvar = nv > 0 ? nv - 1 : -1;
    if (nv == 0) {
      r->n = 1;
      if ((rc = run_block(r)) < 0) return rc;
      if (fl) s.f = REG_F(r, root)[0]; else s.i = REG_I(r, root)[0];
      if (bnd) se = REG_E(r, root)[0];
    } else if (!any_empty_red) {
      int vv = r->vvar;
      do {
        for (int64_t b0 = 0; b0 < ext[vv]; b0 += BLK) {
          r->vals[vv] = lo[vv] + b0;
          r->n = (int)(ext[vv] - b0 < BLK ? ext[vv] - b0 : BLK);
          if ((rc = run_block(r)) < 0) return rc;
          /* Lane order is sequential order: fold one lane at a time. */
          for (int l = 0; l < r->n; l++) {
            if (bnd) {
              fold_bound(st->red, dt, &s.f, REG_F(r, root) + l, REG_E(r, root) + l, &se, &sabs,
                         &sq, &scn, first, 1);
              first = 0;
            }
            if (fl)
              fold_f(st->red, &s.f, REG_F(r, root) + l, 1);
            else
              fold_i(st->red, &s.i, REG_I(r, root) + l, 1);
          }
        }
      } while (odometer(r, lo, ext, rank, nv, vv));
    }
    store(r, out, 0, &s, 1);
    if (bnd) out->eb[0] = acc_bound(st->red, dt, out->f[0], n_terms, se, sabs, sq, scn);
    return NF_OK;
  }

  double eacc[BLK], eabs[BLK], eq[BLK];
  uint8_t cnan[BLK];

  int vv = rank - 1;
  r->vvar = vv;
  do { /* outer output variables */
    int64_t base = 0;
    for (int d = 0; d < vv; d++) base += r->vals[d] * out->stride[d];
    for (int64_t b0 = 0; b0 < ext[vv]; b0 += BLK) {
      int n = (int)(ext[vv] - b0 < BLK ? ext[vv] - b0 : BLK);
      r->vals[vv] = b0;
      r->n = n;
      for (int l = 0; l < n; l++) acc[l] = id;
      if (bnd) {
        memset(eacc, 0, (size_t)n * sizeof *eacc);
        memset(eabs, 0, (size_t)n * sizeof *eabs);
        memset(eq, 0, (size_t)n * sizeof *eq);
        memset(cnan, 0, (size_t)n);
      }
      if (!any_empty_red) {
        int first = 1;
        for (int v = rank; v < nv; v++) r->vals[v] = lo[v];
        do { /* reduction variables, lexicographic */
          if ((rc = run_block(r)) < 0) return rc;
          if (bnd) {
            fold_bound(st->red, dt, (const double *)acc, REG_F(r, root), REG_E(r, root), eacc,
                       eabs, eq, cnan, first, n);
            first = 0;
          }
          if (fl)
            fold_f(st->red, (double *)acc, REG_F(r, root), n);
          else
            fold_i(st->red, (int64_t *)acc, REG_I(r, root), n);
        } while (odometer(r, lo, ext, rank, nv, -1));
      }
      store(r, out, base + b0, acc, n);
      for (int l = 0; bnd && l < n; l++)
        out->eb[base + b0 + l] = acc_bound(st->red, dt, out->f[base + b0 + l], n_terms, eacc[l],
                                           eabs[l], eq[l], cnan[l]);
    }
    r->vals[vv] = 0;
  } while (odometer(r, lo, ext, 0, vv, -1));
  return NF_OK;
}

/* ---- inputs, outputs, driver ---- */

static int shapes_equal(const nf_tensor *t, const nf_array *a) {
  if (a->rank != t->rank) return 0;
  for (int d = 0; d < t->rank; d++)
    if (a->shape[d] != t->shape[d]) return 0;
  return 1;
}

static void put_shape(nf_buf *b, int rank, const int64_t *shape) {
  nf_buf_putc(b, '[');
  for (int d = 0; d < rank; d++)
    nf_buf_printf(b, d ? ", %lld" : "%lld", (long long)shape[d]);
  nf_buf_putc(b, ']');
}

static int load_input(rt *r, uint32_t k, const nf_array *a) {
  uint32_t tid = r->g->inputs[k];
  const tstore *ts = &r->ts[tid];
  const nf_tensor *t = ts->t;
  const char *nm = tname(r, tid);
  nf_buf *err = r->err;
  if (!shapes_equal(t, a)) {
    nf_buf_printf(err, "input %s: shape ", nm);
    put_shape(err, a->rank, a->shape);
    nf_buf_puts(err, " does not match the declared ");
    put_shape(err, t->rank, t->shape);
    return NF_ETYPE;
  }
  if (a->numel != ts->numel || (a->numel > 0 && !a->data)) {
    nf_buf_printf(err, "input %s: array data does not match its shape", nm);
    return NF_EINVAL;
  }
  unsigned tt = t->dtype;
  int afl = a->dtype == NF_F32 || a->dtype == NF_F64;
  int aint = a->dtype == NF_I32 || a->dtype == NF_I64;
  int64_t n = a->numel;
  if (is_fl(tt) && (afl || aint)) {
    int r32 = round_to_f32(r, tt);
    for (int64_t e = 0; e < n; e++) {
      double x;
      if (afl) {
        x = a->dtype == NF_F32 ? ((const float *)a->data)[e]
                               : ((const double *)a->data)[e];
        if (r32) x = (float)x;
      } else {
        int64_t v = a->dtype == NF_I32 ? ((const int32_t *)a->data)[e]
                                       : ((const int64_t *)a->data)[e];
        x = r32 ? (double)(float)v : (double)v;
        /* Exact only: 2^63 compares unequal to every int64 below it. */
        if (x >= 9223372036854775808.0 || (int64_t)x != v) {
          nf_buf_printf(err, "input %s: element %lld (%lld) is not exactly "
                        "representable in %s", nm, (long long)e, (long long)v,
                        dtype_str(tt));
          return NF_ERANGE;
        }
      }
      ts->f[e] = x;
    }
    return NF_OK;
  }
  if ((tt == NF_I32 || tt == NF_I64) && aint) {
    for (int64_t e = 0; e < n; e++) {
      int64_t v = a->dtype == NF_I32 ? ((const int32_t *)a->data)[e]
                                     : ((const int64_t *)a->data)[e];
      if (tt == NF_I32 && (v < INT32_MIN || v > INT32_MAX)) {
        nf_buf_printf(err, "input %s: element %lld (%lld) does not fit in i32",
                      nm, (long long)e, (long long)v);
        return NF_ERANGE;
      }
      ts->i[e] = v;
    }
    return NF_OK;
  }
  if (tt == NF_BOOL && a->dtype == NF_BOOL) {
    for (int64_t e = 0; e < n; e++) ts->i[e] = ((const uint8_t *)a->data)[e] != 0;
    return NF_OK;
  }
  nf_buf_printf(err, "input %s: cannot use a %s array for a %s tensor", nm,
                dtype_str(a->dtype), dtype_str(tt));
  return NF_ETYPE;
}

static int make_output(rt *r, uint32_t tid, nf_array *o) {
  const tstore *ts = &r->ts[tid];
  const nf_tensor *t = ts->t;
  unsigned tt = t->dtype;
  nf_dtype at;
  if (is_fl(tt))
    at = (r->prec == NF_INTERP_F64 || tt == NF_F64) ? NF_F64 : NF_F32;
  else
    at = (nf_dtype)tt;
  int rc = nf_array_alloc(o, at, t->rank, t->shape);
  if (rc < 0) return rc;
  int64_t n = ts->numel;
  switch (at) {
  case NF_F32:
    for (int64_t e = 0; e < n; e++) ((float *)o->data)[e] = (float)ts->f[e];
    break;
  case NF_F64:
    if (n) memcpy(o->data, ts->f, (size_t)n * sizeof(double));
    break;
  case NF_I32:
    for (int64_t e = 0; e < n; e++) ((int32_t *)o->data)[e] = (int32_t)ts->i[e];
    break;
  case NF_I64:
    if (n) memcpy(o->data, ts->i, (size_t)n * sizeof(int64_t));
    break;
  default:
    for (int64_t e = 0; e < n; e++) ((uint8_t *)o->data)[e] = (uint8_t)(ts->i[e] != 0);
    break;
  }
  return NF_OK;
}

static int alloc_tensors(rt *r) {
  const nf_graph *g = r->g;
  for (uint32_t k = 0; k < g->n_tensors; k++) {
    tstore *ts = &r->ts[k];
    const nf_tensor *t = &g->tensors[k];
    ts->t = t;
    int64_t numel = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
      ts->stride[d] = numel;
      if (t->shape[d] < 0 || (t->shape[d] && numel > INT64_MAX / t->shape[d])) {
        nf_buf_printf(r->err, "tensor %s: invalid shape", tname(r, k));
        return NF_EOVERFLOW;
      }
      numel *= t->shape[d];
    }
    if ((uint64_t)numel > SIZE_MAX / 8) {
      nf_buf_printf(r->err, "tensor %s: too large", tname(r, k));
      return NF_EOVERFLOW;
    }
    ts->numel = numel;
    void *mem = calloc(numel ? (size_t)numel : 1, 8);
    if (!mem) {
      nf_buf_printf(r->err, "tensor %s: out of memory (%lld elements)",
                    tname(r, k), (long long)numel);
      return NF_ENOMEM;
    }
    if (is_fl(t->dtype))
      ts->f = mem;
    else
      ts->i = mem;
    if (r->bnd && is_fl(t->dtype) && !(ts->eb = calloc(numel ? (size_t)numel : 1, 8))) {
      nf_buf_printf(r->err, "tensor %s: out of memory (%lld bounds)", tname(r, k),
                    (long long)numel);
      return NF_ENOMEM;
    }
  }
  return NF_OK;
}

static int interp(const nf_graph *g, const nf_array *inputs, nf_precision p, nf_array *outputs,
                  double **bounds, nf_buf *err) {
  nf_buf scratch = NF_BUF_INIT;
  rt r;
  int rc;
  uint32_t k, n_out_done = 0;
  memset(&r, 0, sizeof r);
  if (!err) err = &scratch;
  r.g = g;
  r.prec = p;
  r.bnd = bounds != NULL;
  r.err = err;
  if (!g || (p != NF_INTERP_F32 && p != NF_INTERP_F64)) {
    nf_buf_puts(err, "interp: invalid arguments");
    return NF_EINVAL;
  }
  if ((rc = nf_graph_validate(g, err)) < 0) return rc == NF_ENOMEM ? rc : NF_EINVAL;
  if ((g->n_inputs && !inputs) || (g->n_outputs && !outputs)) {
    nf_buf_puts(err, "interp: missing input or output arrays");
    return NF_EINVAL;
  }
  r.ts = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *r.ts);
  if (!r.ts) {
    nf_buf_puts(err, "interp: out of memory");
    return NF_ENOMEM;
  }
  if ((rc = alloc_tensors(&r)) < 0) goto out;
  for (k = 0; k < g->n_inputs; k++)
    if ((rc = load_input(&r, k, &inputs[k])) < 0) goto out;

  for (k = 0; k < g->n_stmts; k++) {
    prog pr;
    r.si = k;
    r.st = &g->stmts[k];
    if ((rc = compile(&pr, r.st->rhs, r.bnd)) < 0) {
      nf_buf_printf(err, "statement %u: cannot compile: %s", k, nf_strerror(rc));
      goto out;
    }
    r.p = &pr;
    rc = run_stmt(&r);
    prog_free(&pr);
    r.p = NULL;
    if (rc < 0) goto out;
  }

  for (n_out_done = 0; n_out_done < g->n_outputs; n_out_done++) {
    if ((rc = make_output(&r, g->outputs[n_out_done], &outputs[n_out_done])) < 0) {
      nf_buf_printf(err, "output %s: %s", tname(&r, g->outputs[n_out_done]),
                    nf_strerror(rc));
      while (n_out_done > 0) nf_array_free(&outputs[--n_out_done]);
      goto out;
    }
  }
  for (k = 0; bounds && k < g->n_outputs; k++) {
    const tstore *ts = &r.ts[g->outputs[k]];
    bounds[k] = NULL;
    if (!ts->eb) continue;
    if (!(bounds[k] = malloc(ts->numel ? (size_t)ts->numel * sizeof(double) : 1))) {
      nf_buf_puts(err, "interp: out of memory for the bounds");
      while (k > 0) free(bounds[--k]);
      for (k = 0; k < g->n_outputs; k++) nf_array_free(&outputs[k]);
      rc = NF_ENOMEM;
      goto out;
    }
    if (ts->numel) memcpy(bounds[k], ts->eb, (size_t)ts->numel * sizeof(double));
  }
  rc = NF_OK;
out:
  for (k = 0; k < g->n_tensors; k++) {
    free(r.ts[k].f);
    free(r.ts[k].i);
    free(r.ts[k].eb);
  }
  free(r.ts);
  nf_buf_free(&scratch);
  return rc;
}

int nf_interp_run(const nf_graph *g, const nf_array *inputs, nf_precision p,
                  nf_array *outputs, nf_buf *err) {
  return interp(g, inputs, p, outputs, NULL, err);
}

int nf_interp_run_bounded(const nf_graph *g, const nf_array *inputs, nf_array *outputs,
                          double **bounds, nf_buf *err) {
  if (!bounds && g && g->n_outputs) {
    if (err) nf_buf_puts(err, "interp: no bounds array");
    return NF_EINVAL;
  }
  double *none = NULL; /* no outputs: nothing is written to it */
  return interp(g, inputs, NF_INTERP_F64, outputs, bounds ? bounds : &none, err);
}
