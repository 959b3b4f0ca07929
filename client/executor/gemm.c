/* gemm.c - matmul-shaped subgraphs through cblas_sgemm (nf_gemm.h).
 *
 * The analysis works on the anchor's index variables.  Each has an extent
 * and a stride (in elements, 0 where it does not index the tensor) in the
 * result T and the two factors P and Q of the product.  Output variables
 * fall in three classes: P-only (rows of P's side), Q-only (columns),
 * and batch (both factors, or neither: a broadcast).  Variables of extent
 * 1 are dropped; two variables of one class merge into one when the outer
 * one's strides are the inner one's times its extent in all three tensors
 * (a batch or row block that is contiguous in memory is one dimension).
 * Then every choice of one row variable, one column variable (either may
 * be a virtual one of extent 1) and orientation (T = P Q, or T^T = Q^T
 * P^T when T's unit-stride variable is on P's side) is tried against
 * row-major sgemm's layout rules: C's columns have unit stride, each
 * factor has unit stride along its rows or its columns (N or T) and a
 * leading dimension at least its other extent.  The valid choice with the
 * most result elements per call wins; every other variable is a batch
 * loop around the calls, with the factors' offsets from their strides.
 *
 * Reduction variables of extent > 1 fuse the same way (their stride in T
 * is 0); one block is K, every other is a batch loop with C stride 0,
 * whose calls after the first accumulate (beta 1).  An anchor that does
 * not match as it is may match after gather_rewrite materialises its
 * shifted operand (im2col) as a new local at the end of the prologue; the
 * rewritten graph, built in sub->ctx, then replaces sub.
 *
 * Storage during a run: the subgraph's inputs and outputs are the
 * caller's buffers; the prologue's results and a local anchor result live
 * in one block allocated by nf_gemm_prepare.  The prologue and epilogue
 * go through nf_interp_run (f32), whose output arrays are copied into
 * place and freed.  The gather runs natively (ng_run: rows of strided
 * copies between zeros) when its indices and guard are affine, which is
 * the case for convolutions of any stride, padding and dilation; else it
 * stays the prologue's last statement. */
#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nf_gemm.h"
#include "nf_interp.h"
#include "nf_npy.h"
#include "nf_subgraph.h"
#include "nf_stage.h"

#define ALIGN 64

/* An index variable: extent and strides in T (or C), P (or A), Q (or B). */
typedef struct dimv {
  int64_t e, st, sp, sq;
} dimv;

enum { CL_BATCH = 0, CL_P, CL_Q, N_CL };

/* An affine form of the index variables: k + sum of c[v] * v. */
typedef struct aff {
  int64_t c[NF_MAX_VARS];
  int64_t k;
} aff;

#define NG_MAX_CON 32

/* The gather of a convolution run natively (ng_init): Acol(v..) = [g ?]
 * A(f(v..)) [: 0.0] where the indices f and the guard's comparisons are
 * affine in Acol's variables (the guard a conjunction of them).  Each
 * innermost row is a strided copy between zeros, its bounds solved from
 * the constraints. */
typedef struct ngather {
  int present;
  uint32_t t_src, t_dst;
  int n;                       /* Acol's rank = its variables */
  int64_t ext[NF_MAX_RANK];
  int rank;                    /* A's */
  int64_t shape[NF_MAX_RANK];
  aff idx[NF_MAX_RANK];        /* A's index per dimension */
  aff off;                     /* A's flat offset */
  int n_con;
  aff con[NG_MAX_CON];         /* the guard: every con >= 0 */
} ngather;

/* A prologue or epilogue: its graph (tensor ids of the subgraph in
 * sg.in/sg.out) and the interpreter's argument arrays. */
struct nf_gemm_sub {
  const nf_graph *sub;
  nf_stage pro, epi;
  void **ptr;   /* subgraph tensor -> its storage during a run */
  void *locals; /* the intermediates' block */
  uint32_t t_c, t_a, t_b;
  int trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  int64_t off_a, off_b; /* elements: the reduction's lower bound */
  int64_t c_numel, n_calls;
  int n_batch;
  dimv batch[NF_MAX_VARS]; /* st, sp, sq: strides in C, A, B; st 0: a sum */
  int n_gather;            /* gather statements at the prologue's end */
  ngather ng;              /* that gather, run natively (else in the prologue) */
  char desc[160];
};

/* Strides of one factor: 1 when acc is an f32 access of a subgraph
 * tensor whose indices are distinct variables < n_vars, bare or plus a
 * constant (a slice: the constant times the stride added to *off), each
 * within the tensor's extent along its dimension over the variable's
 * range, or constants within the extent (added to *off, in elements). */
static int factor_strides(const nf_graph *g, const nf_expr *acc, uint32_t n_vars,
                          const int64_t *ext, const int64_t *lo, int64_t *str, uint8_t *used,
                          int64_t *off) {
  if (acc->op != NF_OP_ACCESS || acc->dtype != NF_F32 || acc->u.tensor >= g->n_tensors) return 0;
  const nf_tensor *t = &g->tensors[acc->u.tensor];
  if (t->dtype != NF_F32 || t->rank != acc->n_args) return 0;
  int64_t stride = 1;
  *off = 0;
  for (int d = t->rank - 1; d >= 0; d--) {
    const nf_expr *ix = acc->args[d];
    if (ix->op == NF_OP_CONST && nf_dtype_is_int((nf_dtype)ix->dtype)) {
      if (ix->u.i < 0 || ix->u.i >= t->shape[d]) return 0;
      *off += ix->u.i * stride;
      stride *= t->shape[d];
      continue;
    }
    int64_t c = 0; /* v + c: a window at a constant offset (a slice) */
    if ((ix->op == NF_OP_ADD || ix->op == NF_OP_SUB) && ix->n_args == 2) {
      const nf_expr *x = ix->args[0], *y = ix->args[1];
      if (ix->op == NF_OP_ADD && x->op == NF_OP_CONST) {
        x = ix->args[1];
        y = ix->args[0];
      }
      if (x->op != NF_OP_VAR || y->op != NF_OP_CONST || !nf_dtype_is_int((nf_dtype)y->dtype) ||
          y->u.i < -((int64_t)1 << 40) || y->u.i > ((int64_t)1 << 40))
        return 0;
      c = ix->op == NF_OP_ADD ? y->u.i : -y->u.i;
      ix = x;
    }
    if (ix->op != NF_OP_VAR || ix->u.var >= n_vars || used[ix->u.var]) return 0;
    uint32_t v = ix->u.var;
    if (ext[v] > 0 &&
        (lo[v] + c < 0 || ext[v] > t->shape[d] || lo[v] + c > t->shape[d] - ext[v]))
      return 0; /* out of bounds: the interpreter reports it */
    *off += c * stride;
    used[v] = 1;
    str[v] = stride;
    stride *= t->shape[d];
  }
  return 1;
}

/* Row-major layout of a factor with rows (er, sr) and columns (ec, sc):
 * 1 and *trans, *ld when one of them has unit stride (or extent 1). */
static int factor_layout(int64_t er, int64_t sr, int64_t ec, int64_t sc, int *trans,
                         int64_t *ld) {
  int64_t ec1 = ec > 1 ? ec : 1, er1 = er > 1 ? er : 1;
  if (ec <= 1 || sc == 1) {
    *trans = 0;
    *ld = er > 1 ? sr : ec1;
    return *ld >= ec1;
  }
  if (er <= 1 || sr == 1) {
    *trans = 1;
    *ld = sc;
    return *ld >= er1;
  }
  return 0;
}

static int fusible(const dimv *outer, const dimv *inner) {
  return outer->st == inner->e * inner->st && outer->sp == inner->e * inner->sp &&
         outer->sq == inner->e * inner->sq;
}

/* Merges the variables of one class that are one block in memory. */
static void fuse(dimv *d, int *n) {
  for (int changed = 1; changed;) {
    changed = 0;
    for (int u = 0; u < *n && !changed; u++)
      for (int w = 0; w < *n && !changed; w++) {
        if (u == w || !fusible(&d[u], &d[w])) continue;
        d[u].e *= d[w].e;
        d[u].st = d[w].st;
        d[u].sp = d[w].sp;
        d[u].sq = d[w].sq;
        d[w] = d[--*n];
        changed = 1;
      }
  }
}

static int fits_int(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

/* Fills s's GEMM when statement a of sub is a plain (batched) f32
 * product; 1 if so, 0 when it is not.  The reduction variables (each
 * read by both factors) fuse into blocks like the output's; one block is
 * sgemm's K, the others are loops of calls that accumulate (beta 1 after
 * the first). */
static int match_anchor(const nf_graph *sub, uint32_t a, nf_gemm_sub *s) {
  const nf_stmt *st = &sub->stmts[a];
  const nf_tensor *tt = &sub->tensors[st->out];
  if (st->red != NF_RED_SUM || st->n_red < 1 || tt->dtype != NF_F32) return 0;
  const nf_expr *e = st->rhs;
  if (e->op != NF_OP_MUL || e->n_args != 2) return 0;
  const nf_expr *p = e->args[0], *q = e->args[1];
  uint32_t rank = tt->rank, n_vars = rank + st->n_red;
  if (n_vars > NF_MAX_VARS) return 0;
  int64_t ext[NF_MAX_VARS], lo[NF_MAX_VARS], s_t[NF_MAX_VARS], s_p[NF_MAX_VARS], s_q[NF_MAX_VARS];
  uint8_t in_p[NF_MAX_VARS] = {0}, in_q[NF_MAX_VARS] = {0};
  int64_t stride = 1, off_p, off_q;
  for (uint32_t v = rank; v-- > 0;) {
    ext[v] = tt->shape[v];
    lo[v] = 0;
    s_t[v] = stride;
    stride *= tt->shape[v];
  }
  int empty = 0;
  for (uint32_t r = 0; r < st->n_red; r++) {
    ext[rank + r] = st->red_ext[r];
    lo[rank + r] = st->red_lo[r];
    s_t[rank + r] = 0;
    empty |= st->red_ext[r] == 0;
  }
  memset(s_p, 0, sizeof s_p);
  memset(s_q, 0, sizeof s_q);
  if (!factor_strides(sub, p, n_vars, ext, lo, s_p, in_p, &off_p) ||
      !factor_strides(sub, q, n_vars, ext, lo, s_q, in_q, &off_q))
    return 0;
  for (uint32_t v = rank; v < n_vars; v++)
    if (!in_p[v] || !in_q[v]) return 0; /* a sum over one factor only */
  if (p->u.tensor == st->out || q->u.tensor == st->out) return 0;
  s->c_numel = nf_tensor_numel(tt);
  s->t_c = st->out;
  s->off_a = off_p;
  s->off_b = off_q;
  for (uint32_t v = rank; v < n_vars; v++) {
    s->off_a += lo[v] * s_p[v];
    s->off_b += lo[v] * s_q[v];
  }
  s->t_a = p->u.tensor;
  s->t_b = q->u.tensor;
  if (s->c_numel == 0) return 1; /* nothing to compute: no calls */

  dimv cls[N_CL][NF_MAX_VARS], red[NF_MAX_VARS];
  int n_cls[N_CL] = {0}, n_red = 0;
  for (uint32_t v = 0; v < n_vars; v++) {
    if (ext[v] == 1) continue;
    dimv d = {ext[v], s_t[v], s_p[v], s_q[v]};
    if (v >= rank) {
      red[n_red++] = d;
      continue;
    }
    int c = in_p[v] == in_q[v] ? CL_BATCH : in_p[v] ? CL_P : CL_Q;
    cls[c][n_cls[c]++] = d;
  }
  for (int c = 0; c < N_CL; c++) fuse(cls[c], &n_cls[c]);
  fuse(red, &n_red);
  const dimv virt = {1, 0, 0, 0};

  int64_t best = -1;
  int best_o = 0, best_r = -1, best_c = -1, best_k = -1;
  for (int o = 0; o < 2; o++) {
    int rc_ = o ? CL_Q : CL_P, cc = o ? CL_P : CL_Q;
    for (int ki = n_red ? 0 : -1; ki < n_red; ki++)
      for (int ri = -1; ri < n_cls[rc_]; ri++)
        for (int ci = -1; ci < n_cls[cc]; ci++) {
          const dimv *r = ri < 0 ? &virt : &cls[rc_][ri], *c = ci < 0 ? &virt : &cls[cc][ci];
          const dimv *kd = ki < 0 ? &virt : &red[ki];
          int64_t sa_r = o ? r->sq : r->sp, sa_k = o ? kd->sq : kd->sp;
          int64_t sb_k = o ? kd->sp : kd->sq, sb_c = o ? c->sp : c->sq;
          if (c->e > 1 && c->st != 1) continue;
          int64_t ldc = r->e > 1 ? r->st : (c->e > 1 ? c->e : 1);
          int ta, tb;
          int64_t lda, ldb;
          if (ldc < c->e || !factor_layout(r->e, sa_r, kd->e, sa_k, &ta, &lda) ||
              !factor_layout(kd->e, sb_k, c->e, sb_c, &tb, &ldb))
            continue;
          if (!fits_int(r->e) || !fits_int(c->e) || !fits_int(kd->e) || !fits_int(lda) ||
              !fits_int(ldb) || !fits_int(ldc))
            continue;
          int64_t score = r->e * c->e * (kd->e > 0 ? kd->e : 1);
          if (score <= best) continue;
          best = score;
          best_o = o;
          best_r = ri;
          best_c = ci;
          best_k = ki;
          s->m = r->e;
          s->n = c->e;
          s->k = kd->e;
          s->lda = lda;
          s->ldb = ldb;
          s->ldc = ldc;
          s->trans_a = ta;
          s->trans_b = tb;
        }
  }
  if (best < 0) return 0;
  if (empty) s->k = 0; /* an empty reduction: C = 0 */
  /* the batch loops: C, A, B strides; reduction loops have C stride 0 */
  int rc_ = best_o ? CL_Q : CL_P, cc = best_o ? CL_P : CL_Q;
  s->n_batch = 0;
  s->n_calls = 1;
  for (int c = 0; c <= N_CL; c++) {
    int n_c = c < N_CL ? n_cls[c] : n_red;
    for (int i = 0; i < n_c; i++) {
      if ((c == rc_ && i == best_r) || (c == cc && i == best_c) || (c == N_CL && i == best_k))
        continue;
      const dimv *d = c < N_CL ? &cls[c][i] : &red[i];
      s->batch[s->n_batch++] = (dimv){d->e, d->st, best_o ? d->sq : d->sp, best_o ? d->sp : d->sq};
      s->n_calls *= d->e;
    }
  }
  if (best_o) {
    uint32_t t = s->t_a;
    s->t_a = s->t_b;
    s->t_b = t;
    int64_t off = s->off_a;
    s->off_a = s->off_b;
    s->off_b = off;
  }
  return 1;
}

/* ---- im2col: materialising a convolution's shifted operand ---- */

#define GATHER_MAX_BYTES ((int64_t)256 << 20)

static int is_zero(const nf_expr *e) {
  return e->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->dtype) && e->u.f == 0.0;
}

/* 1 when acc is an access whose indices are distinct bare variables or
 * constants (what match_anchor reads in place). */
static int plain_access(const nf_expr *acc) {
  uint8_t used[NF_MAX_VARS] = {0};
  for (uint32_t d = 0; d < acc->n_args; d++) {
    const nf_expr *ix = acc->args[d];
    if (ix->op == NF_OP_CONST) continue;
    if (ix->op != NF_OP_VAR || ix->u.var >= NF_MAX_VARS || used[ix->u.var]) return 0;
    used[ix->u.var] = 1;
  }
  return 1;
}

typedef struct var_set {
  uint8_t has[NF_MAX_VARS];
  int bad; /* a variable out of range */
} var_set;

static void collect_var(const nf_expr *e, void *user) {
  var_set *vs = user;
  if (e->op != NF_OP_VAR) return;
  if (e->u.var >= NF_MAX_VARS)
    vs->bad = 1;
  else
    vs->has[e->u.var] = 1;
}

/* e with variable v renamed to map[v] (every variable e uses is mapped). */
static const nf_expr *remap(nf_ir_ctx *ctx, const nf_expr *e, const uint32_t *map) {
  if (!e) return NULL;
  if (e->op == NF_OP_VAR) return nf_e_var(ctx, map[e->u.var]);
  if (e->n_args == 0) return e;
  const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  if (e->n_args > sizeof args / sizeof *args) return NULL;
  for (uint32_t i = 0; i < e->n_args; i++)
    if (!(args[i] = remap(ctx, e->args[i], map))) return NULL;
  return nf_e_rebuild(ctx, e, args);
}

/* Rewrites anchor a of sub, O(o..) +=! [g ?] A(f(o.., r..)) * B(..) [: 0],
 * with B a plain access and A not (or guarded), into a graph (built in
 * sub->ctx) of the same tensors, inputs and outputs plus a local Acol:
 *
 *     Acol(v..) = g ? A(f(..)) : 0.0     (statement a: the gather)
 *     O(o..) +=! Acol(v..) * B(..)       (statement a + 1: the anchor)
 *
 * v.. are the variables A and g read: the reduction variables in the
 * order of their strides in B (so that they fuse into one block, the
 * GEMM's K, where B allows) and the output variables in O's order (the
 * rows), the reductions first (outs_first 0), last (1), or after the
 * outermost output variable alone (2: an image's columns contiguous, the
 * batch outermost, so that each per-image product reads one block), or
 * as 1 after B's outermost variable where A reads it (3: a weight
 * gradient's batch outermost, which is also the layout 2 gives the
 * forward convolution: the two products can share one gather,
 * nf_gemm_run_shared).  nf_gemm_prepare tries all four and keeps the one
 * whose innermost variable is longest, for the gather's rows (a forward
 * convolution's output width, a weight gradient's reduction over the
 * width), the later of 2 and 3 on a tie.  1 and *out when rewritten, 0 when the anchor does not have
 * that form (or Acol would exceed GATHER_MAX_BYTES or NF_MAX_RANK
 * dimensions), NF_ENOMEM. */
static int gather_rewrite(const nf_graph *sub, uint32_t a, int outs_first, nf_graph **out) {
  *out = NULL;
  const nf_stmt *st = &sub->stmts[a];
  const nf_tensor *tt = &sub->tensors[st->out];
  uint32_t rank = tt->rank, n_vars = rank + st->n_red;
  if (st->red != NF_RED_SUM || st->n_red < 1 || tt->dtype != NF_F32 || n_vars > NF_MAX_VARS)
    return 0;
  for (uint32_t r = 0; r < st->n_red; r++)
    if (st->red_lo[r] != 0) return 0;
  const nf_expr *e = st->rhs, *guard = NULL;
  if (e->op == NF_OP_SELECT && is_zero(e->args[2])) {
    guard = e->args[0];
    e = e->args[1];
  }
  if (e->op != NF_OP_MUL || e->n_args != 2) return 0;
  const nf_expr *f[2] = {e->args[0], e->args[1]};
  for (int i = 0; i < 2; i++)
    if (f[i]->op == NF_OP_SELECT && is_zero(f[i]->args[2])) {
      if (guard) return 0;
      guard = f[i]->args[0];
      f[i] = f[i]->args[1];
    }
  for (int i = 0; i < 2; i++)
    if (f[i]->op != NF_OP_ACCESS || f[i]->dtype != NF_F32 || f[i]->u.tensor == st->out)
      return 0;
  int pa = plain_access(f[0]), pb = plain_access(f[1]);
  if ((pa && pb && !guard) || (!pa && !pb)) return 0;
  int ia = pa && !pb ? 1 : 0; /* the operand gathered */
  const nf_expr *A = f[ia], *B = f[1 - ia];

  var_set vs = {{0}, 0};
  if (nf_expr_visit(A, collect_var, &vs) != NF_OK ||
      (guard && nf_expr_visit(guard, collect_var, &vs) != NF_OK))
    return NF_ENOMEM;
  if (vs.bad) return 0;
  /* Acol's variables: reductions by B's dimension, then the rest; then
   * the output variables */
  uint32_t order[NF_MAX_VARS], n = 0;
  uint8_t placed[NF_MAX_VARS] = {0};
  for (uint32_t v = n_vars; v < NF_MAX_VARS; v++)
    if (vs.has[v]) return 0;
  uint32_t v0 = rank; /* outs_first 2: the outermost output variable */
  if (outs_first == 3) { /* B's outermost variable, then as outs_first 1 */
    const nf_expr *ix = B->n_args ? B->args[0] : NULL;
    if (!ix || ix->op != NF_OP_VAR || ix->u.var >= n_vars || !vs.has[ix->u.var])
      return 0; /* the layout of 1 */
    order[n++] = ix->u.var;
    placed[ix->u.var] = 1;
  }
  if (outs_first == 1 || outs_first == 3)
    for (uint32_t v = 0; v < rank; v++)
      if (vs.has[v] && !placed[v]) order[n++] = v;
  if (outs_first == 2) {
    for (v0 = 0; v0 < rank && !vs.has[v0]; v0++) {
    }
    if (v0 < rank) order[n++] = v0;
  }
  for (uint32_t d = 0; d < B->n_args; d++) {
    const nf_expr *ix = B->args[d];
    if (ix->op != NF_OP_VAR) continue;
    uint32_t v = ix->u.var;
    if (v >= rank && v < n_vars && vs.has[v] && !placed[v]) {
      placed[v] = 1;
      order[n++] = v;
    }
  }
  for (uint32_t v = rank; v < n_vars; v++)
    if (vs.has[v] && !placed[v]) {
      placed[v] = 1;
      order[n++] = v;
    }
  if (outs_first == 0 || outs_first == 2)
    for (uint32_t v = 0; v < rank; v++)
      if (vs.has[v] && v != v0) order[n++] = v;
  if (n == 0 || n > NF_MAX_RANK) return 0;
  int64_t shape[NF_MAX_RANK], bytes = (int64_t)sizeof(float);
  uint32_t map[NF_MAX_VARS] = {0};
  for (uint32_t j = 0; j < n; j++) {
    uint32_t v = order[j];
    shape[j] = v < rank ? tt->shape[v] : st->red_ext[v - rank];
    map[v] = j;
    if (shape[j] > 0 && bytes > GATHER_MAX_BYTES / shape[j]) return 0;
    bytes *= shape[j];
  }
  if (bytes > GATHER_MAX_BYTES) return 0;

  nf_ir_ctx *ctx = sub->ctx;
  nf_graph *g = nf_graph_new(ctx, sub->name);
  if (!g) return NF_ENOMEM;
  int rc = NF_OK;
  for (uint32_t t = 0; t < sub->n_tensors && rc >= 0; t++) {
    const nf_tensor *x = &sub->tensors[t];
    rc = nf_graph_add_tensor(g, x->name, (nf_dtype)x->dtype, (nf_tkind)x->kind, x->rank, x->shape);
  }
  char name[96];
  const char *a_name = sub->tensors[A->u.tensor].name;
  snprintf(name, sizeof name, "%s_col", a_name ? a_name : "gather");
  int t_col = rc >= 0 ? nf_graph_add_tensor(g, name, NF_F32, NF_T_LOCAL, (int)n, shape) : rc;
  if (t_col < 0) return t_col == NF_ENOMEM ? NF_ENOMEM : 0;
  if (g->n_inputs != sub->n_inputs || g->n_outputs != sub->n_outputs) return 0;
  /* the same order of inputs and outputs, whatever their ids */
  memcpy(g->inputs, sub->inputs, sub->n_inputs * sizeof *g->inputs);
  memcpy(g->outputs, sub->outputs, sub->n_outputs * sizeof *g->outputs);

  /* the gather, and the anchor reading Acol at bare variables */
  nf_stmt gs = {0};
  gs.out = (uint32_t)t_col;
  gs.red = NF_RED_NONE;
  const nf_expr *body = remap(ctx, A, map);
  if (body && guard) {
    const nf_expr *gg = remap(ctx, guard, map);
    const nf_expr *zero = nf_e_const_f(ctx, NF_F32, 0.0);
    body = gg && zero ? nf_e_select(ctx, gg, body, zero) : NULL;
  }
  const nf_expr *idx[NF_MAX_RANK];
  for (uint32_t j = 0; j < n; j++) {
    idx[j] = nf_e_var(ctx, order[j]);
    gs.var_names[j] = st->var_names[order[j]];
  }
  const nf_expr *col = nf_e_access(ctx, (uint32_t)t_col, NF_F32, (int)n, idx);
  const nf_expr *prod = col ? nf_e_binary(ctx, NF_OP_MUL, ia ? B : col, ia ? col : B) : NULL;
  if (!body || !prod) return NF_ENOMEM;
  gs.rhs = body;
  nf_stmt as = *st;
  as.rhs = prod;
  for (uint32_t i = 0; i < sub->n_stmts && rc >= 0; i++) {
    if (i == a) {
      rc = nf_graph_add_stmt(g, &gs);
      if (rc >= 0) rc = nf_graph_add_stmt(g, &as);
    } else {
      rc = nf_graph_add_stmt(g, &sub->stmts[i]);
    }
  }
  if (rc < 0) return rc == NF_ENOMEM ? NF_ENOMEM : 0;
  if (nf_graph_validate(g, NULL) != NF_OK) return 0;
  *out = g;
  return 1;
}

/* e as an affine form of variables < n; 0 when it is not one. */
static int to_aff(const nf_expr *e, int n, aff *a) {
  memset(a, 0, sizeof *a);
  switch (e->op) {
  case NF_OP_CONST:
    if (!nf_dtype_is_int((nf_dtype)e->dtype)) return 0;
    a->k = e->u.i;
    return 1;
  case NF_OP_VAR:
    if ((int)e->u.var >= n) return 0;
    a->c[e->u.var] = 1;
    return 1;
  case NF_OP_CAST:
    return nf_dtype_is_int((nf_dtype)e->dtype) && e->n_args == 1 &&
           nf_dtype_is_int((nf_dtype)e->args[0]->dtype) && to_aff(e->args[0], n, a);
  case NF_OP_NEG:
    if (!to_aff(e->args[0], n, a)) return 0;
    for (int v = 0; v < n; v++) a->c[v] = -a->c[v];
    a->k = -a->k;
    return 1;
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL: {
    aff x, y;
    if (!to_aff(e->args[0], n, &x) || !to_aff(e->args[1], n, &y)) return 0;
    if (e->op == NF_OP_MUL) {
      int xc = 1, yc = 1;
      for (int v = 0; v < n; v++) xc &= x.c[v] == 0, yc &= y.c[v] == 0;
      if (!xc && !yc) return 0;
      const aff *c = xc ? &x : &y, *o = xc ? &y : &x;
      for (int v = 0; v < n; v++) a->c[v] = o->c[v] * c->k;
      a->k = o->k * c->k;
      return 1;
    }
    int64_t sg = e->op == NF_OP_SUB ? -1 : 1;
    for (int v = 0; v < n; v++) a->c[v] = x.c[v] + sg * y.c[v];
    a->k = x.k + sg * y.k;
    return 1;
  }
  default:
    return 0;
  }
}

/* Adds the guard g (a conjunction of affine comparisons) as constraints
 * con >= 0; 0 when it has another form. */
static int guard_cons(const nf_expr *g, ngather *G) {
  if (g->op == NF_OP_CONST && g->dtype == NF_BOOL) return g->u.i != 0; /* true: nothing */
  if (g->op == NF_OP_AND) return guard_cons(g->args[0], G) && guard_cons(g->args[1], G);
  if (g->op != NF_OP_LT && g->op != NF_OP_LE && g->op != NF_OP_GT && g->op != NF_OP_GE &&
      g->op != NF_OP_EQ)
    return 0;
  aff x, y;
  if (!to_aff(g->args[0], G->n, &x) || !to_aff(g->args[1], G->n, &y)) return 0;
  aff d; /* x - y */
  for (int v = 0; v < NF_MAX_VARS; v++) d.c[v] = x.c[v] - y.c[v];
  d.k = x.k - y.k;
  aff m = d; /* y - x */
  for (int v = 0; v < NF_MAX_VARS; v++) m.c[v] = -d.c[v];
  m.k = -d.k;
  if (G->n_con + 2 > NG_MAX_CON) return 0;
  switch (g->op) {
  case NF_OP_LT: m.k -= 1; G->con[G->n_con++] = m; break;  /* y - x - 1 >= 0 */
  case NF_OP_LE: G->con[G->n_con++] = m; break;
  case NF_OP_GT: d.k -= 1; G->con[G->n_con++] = d; break;
  case NF_OP_GE: G->con[G->n_con++] = d; break;
  default: G->con[G->n_con++] = d; G->con[G->n_con++] = m; break; /* EQ */
  }
  return 1;
}

/* Analyses statement i of sub (the gather gather_rewrite made); 1 when it
 * can run natively. */
static int ng_init(const nf_graph *sub, uint32_t i, ngather *G) {
  memset(G, 0, sizeof *G);
  const nf_stmt *st = &sub->stmts[i];
  const nf_tensor *dst = &sub->tensors[st->out];
  if (st->red != NF_RED_NONE || dst->dtype != NF_F32 || dst->rank < 1) return 0;
  G->n = dst->rank;
  for (int d = 0; d < G->n; d++) G->ext[d] = dst->shape[d];
  const nf_expr *e = st->rhs;
  if (e->op == NF_OP_SELECT && is_zero(e->args[2])) {
    if (!guard_cons(e->args[0], G)) return 0;
    e = e->args[1];
  }
  if (e->op != NF_OP_ACCESS || e->dtype != NF_F32) return 0;
  const nf_tensor *src = &sub->tensors[e->u.tensor];
  if (src->dtype != NF_F32 || src->rank != e->n_args || src->rank > NF_MAX_RANK) return 0;
  G->rank = src->rank;
  int64_t stride = 1;
  for (int d = G->rank - 1; d >= 0; d--) {
    G->shape[d] = src->shape[d];
    if (!to_aff(e->args[d], G->n, &G->idx[d])) return 0;
    for (int v = 0; v < G->n; v++) G->off.c[v] += G->idx[d].c[v] * stride;
    G->off.k += G->idx[d].k * stride;
    stride *= src->shape[d];
  }
  G->t_src = e->u.tensor;
  G->t_dst = st->out;
  G->present = 1;
  return 1;
}

static int64_t floor_div(int64_t a, int64_t b) { /* b > 0 */
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Narrows [*lo, *hi) to the i with base + a * i >= 0 (no division for
 * the unit coefficients of a convolution's window). */
static inline void narrow(int64_t base, int64_t a, int64_t *lo, int64_t *hi) {
  if (a == 1) {
    if (-base > *lo) *lo = -base;
  } else if (a == -1) {
    if (base + 1 < *hi) *hi = base + 1;
  } else if (a == 0) {
    if (base < 0) *hi = *lo;
  } else if (a > 0) {
    int64_t m = -floor_div(base, a); /* ceil(-base / a) */
    if (m > *lo) *lo = m;
  } else {
    int64_t m = floor_div(base, -a) + 1;
    if (m < *hi) *hi = m;
  }
}

/* Rows r0..r1 of the gather; 0, or 1 when a read would leave A.  The
 * affine forms' values at the row's outer indices (the constraints', A's
 * indices', the flat offset's) are kept up to date as the indices step,
 * so a row costs a few comparisons and its copy. */
static int ng_rows(const ngather *G, const float *src, float *dst0, int64_t r0, int64_t r1) {
  int n = G->n, in = n - 1;
  int64_t E = G->ext[in];
  int64_t ix[NF_MAX_RANK] = {0};
  for (int64_t q = r0, d = in - 1; d >= 0; d--) { /* r0's indices */
    ix[d] = q % G->ext[d];
    q /= G->ext[d];
  }
  /* bases: the constraints, then A's indices, then the offset */
  enum { NB = NG_MAX_CON + NF_MAX_RANK + 1 };
  const aff *form[NB];
  int nb = 0;
  for (int c = 0; c < G->n_con; c++) form[nb++] = &G->con[c];
  for (int d = 0; d < G->rank; d++) form[nb++] = &G->idx[d];
  form[nb++] = &G->off;
  int64_t base[NB];
  for (int f = 0; f < nb; f++) {
    base[f] = form[f]->k;
    for (int d = 0; d < in; d++) base[f] += form[f]->c[d] * ix[d];
  }
  const int64_t *cb = base, *ib = base + G->n_con;
  float *dst = dst0 + r0 * E;
  for (int64_t r = r0; r < r1; r++, dst += E) {
    int64_t lo = 0, hi = E;
    for (int c = 0; c < G->n_con && lo < hi; c++) narrow(cb[c], G->con[c].c[in], &lo, &hi);
    if (lo < hi) {
      /* every read must be in A's bounds */
      int64_t blo = lo, bhi = hi;
      for (int d = 0; d < G->rank; d++) {
        narrow(ib[d], G->idx[d].c[in], &blo, &bhi);
        narrow(G->shape[d] - 1 - ib[d], -G->idx[d].c[in], &blo, &bhi);
      }
      if (blo != lo || bhi != hi) return 1;
      int64_t o = base[nb - 1], st = G->off.c[in];
      if (lo > 0) memset(dst, 0, sizeof(float) * (size_t)lo);
      const float *p = src + o + lo * st;
      if (st == 1) {
        memcpy(dst + lo, p, sizeof(float) * (size_t)(hi - lo));
      } else {
        for (int64_t i = lo; i < hi; i++, p += st) dst[i] = *p;
      }
      if (hi < E) memset(dst + hi, 0, sizeof(float) * (size_t)(E - hi));
    } else {
      memset(dst, 0, sizeof(float) * (size_t)E);
    }
    for (int d = in - 1; d >= 0; d--) {
      if (++ix[d] < G->ext[d]) {
        for (int f = 0; f < nb; f++) base[f] += form[f]->c[d];
        break;
      }
      ix[d] = 0;
      for (int f = 0; f < nb; f++) base[f] -= form[f]->c[d] * (G->ext[d] - 1);
    }
  }
  return 0;
}

typedef struct ng_job {
  const ngather *G;
  const float *src;
  float *dst;
  int64_t rows;
  int parts;
  atomic_int bad;
} ng_job;

static void ng_body(void *ctx, int64_t lo, int64_t hi) {
  ng_job *j = ctx;
  for (int64_t t = lo; t < hi; t++)
    if (ng_rows(j->G, j->src, j->dst, j->rows * t / j->parts, j->rows * (t + 1) / j->parts))
      atomic_store(&j->bad, 1);
}

/* The gather, its rows split over pool's threads when it is large (a
 * memory-bound copy: a second core adds bandwidth). */
static int ng_run(const nf_gemm_sub *s, nf_pool *pool, nf_buf *err) {
  const ngather *G = &s->ng;
  int64_t E = G->ext[G->n - 1], rows = 1;
  for (int d = 0; d < G->n - 1; d++) rows *= G->ext[d];
  if (E == 0 || rows == 0) return NF_OK;
  int T = pool ? nf_pool_threads(pool) : 1;
  if (rows * E < ((int64_t)1 << 18) || rows < T) T = 1;
  ng_job j = {G, s->ptr[G->t_src], s->ptr[G->t_dst], rows, T, 0};
  if (T > 1)
    nf_pool_parallel_for(pool, T, ng_body, &j);
  else
    ng_body(&j, 0, 1);
  if (atomic_load(&j.bad)) {
    nf_buf_printf(err, "gemm: the gather of %s reads outside %s", s->sub->tensors[G->t_dst].name,
                  s->sub->tensors[G->t_src].name);
    return NF_EBOUNDS;
  }
  return NF_OK;
}

static int64_t tensor_bytes(const nf_tensor *t) {
  return nf_tensor_numel(t) * (int64_t)nf_dtype_size((nf_dtype)t->dtype);
}

/* Places the prologue's results and a local anchor result in one block. */
static int alloc_locals(nf_gemm_sub *s) {
  const nf_graph *sub = s->sub;
  uint8_t *need = calloc(sub->n_tensors ? sub->n_tensors : 1, 1);
  if (!need) return NF_ENOMEM;
  if (s->pro.present)
    for (uint32_t k = 0; k < s->pro.sg.n_out; k++) need[s->pro.sg.out[k]] = 1;
  need[s->t_c] = 1;
  if (s->ng.present) need[s->ng.t_dst] = 1;
  int64_t total = 0;
  for (uint32_t t = 0; t < sub->n_tensors; t++) {
    if (!need[t] || sub->tensors[t].kind != NF_T_LOCAL) continue;
    int64_t b = tensor_bytes(&sub->tensors[t]);
    if (b < 0 || total > INT64_MAX - b - ALIGN) {
      free(need);
      return NF_ENOMEM;
    }
    total += (b + ALIGN - 1) / ALIGN * ALIGN;
  }
  if (total > 0 && !(s->locals = aligned_alloc(ALIGN, (size_t)total))) {
    free(need);
    return NF_ENOMEM;
  }
  int64_t off = 0;
  for (uint32_t t = 0; t < sub->n_tensors; t++) {
    if (!need[t] || sub->tensors[t].kind != NF_T_LOCAL) continue;
    s->ptr[t] = (char *)s->locals + off;
    off += (tensor_bytes(&sub->tensors[t]) + ALIGN - 1) / ALIGN * ALIGN;
  }
  free(need);
  return NF_OK;
}

static void describe(nf_gemm_sub *s) {
  uint32_t np = s->pro.present ? s->pro.sg.n_stmts : 0, ne = s->epi.present ? s->epi.sg.n_stmts : 0;
  snprintf(s->desc, sizeof s->desc,
           "sgemm %c%c %lldx%lldx%lld batch %lld, prologue %u stmt%s, epilogue %u stmt%s",
           s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', (long long)s->m, (long long)s->n,
           (long long)s->k, (long long)(s->c_numel ? s->n_calls : 0), np, np == 1 ? "" : "s", ne,
           ne == 1 ? "" : "s");
  if (s->n_gather) {
    size_t len = strlen(s->desc);
    snprintf(s->desc + len, sizeof s->desc - len, ", gather %d stmt%s%s", s->n_gather,
             s->n_gather == 1 ? "" : "s", s->ng.present ? " (native)" : "");
  }
}

int nf_gemm_prepare(const nf_graph *sub, nf_gemm_sub **out, nf_buf *err) {
  *out = NULL;
  int rc = nf_graph_validate(sub, err);
  if (rc != NF_OK) return rc == NF_ENOMEM ? rc : NF_EINVAL;
  /* one anchor; only dtypes whose buffers the interpreter reads as they are */
  int anchor = -1;
  for (uint32_t i = 0; i < sub->n_stmts; i++)
    if (sub->stmts[i].red != NF_RED_NONE) {
      if (anchor >= 0) return NF_OK;
      anchor = (int)i;
    }
  if (anchor < 0) return NF_OK;
  for (uint32_t t = 0; t < sub->n_tensors; t++) {
    nf_dtype d = (nf_dtype)sub->tensors[t].dtype;
    if (d != NF_F32 && d != NF_I32 && d != NF_I64 && d != NF_BOOL) return NF_OK;
  }
  nf_gemm_sub *s = calloc(1, sizeof *s);
  if (!s) {
    nf_buf_printf(err, "gemm: out of memory");
    return NF_ENOMEM;
  }
  s->sub = sub;
  if (!match_anchor(sub, (uint32_t)anchor, s)) {
    /* a convolution: gather the shifted operand, then the plain product;
     * of the layouts of the gathered operand, the one with the longest
     * innermost rows */
    nf_graph *g = NULL;
    int64_t best_row = -1;
    for (int of = 0; of < 4; of++) {
      nf_graph *c = NULL;
      int r = gather_rewrite(sub, (uint32_t)anchor, of, &c);
      if (r == NF_ENOMEM) {
        rc = r;
        break;
      }
      memset(s, 0, sizeof *s);
      if (r != 1 || !match_anchor(c, (uint32_t)anchor + 1, s)) continue;
      const nf_tensor *col = &c->tensors[c->stmts[anchor].out];
      int64_t row = col->shape[col->rank - 1];
      if (row > best_row || (row == best_row && of >= 2)) {
        best_row = row;
        g = c;
      }
      rc = 1;
    }
    memset(s, 0, sizeof *s);
    if (g && match_anchor(g, (uint32_t)anchor + 1, s)) {
      s->sub = sub = g;
      s->n_gather = 1;
      anchor++;
      rc = NF_OK;
    } else {
      free(s);
      if (rc == NF_ENOMEM || nf_ir_ctx_oom(sub->ctx)) {
        nf_buf_printf(err, "gemm: out of memory");
        return NF_ENOMEM;
      }
      return NF_OK;
    }
  }
  uint32_t a = (uint32_t)anchor, n = sub->n_stmts;
  uint32_t *order = malloc((n ? n : 1) * sizeof *order);
  uint8_t *is_out = calloc(sub->n_tensors ? sub->n_tensors : 1, 1);
  s->ptr = calloc(sub->n_tensors ? sub->n_tensors : 1, sizeof *s->ptr);
  if (!order || !is_out || !s->ptr) {
    rc = NF_ENOMEM;
    goto done;
  }
  for (uint32_t i = 0; i < n; i++) order[i] = i;
  /* the prologue returns what the anchor, the epilogue or the caller reads */
  for (uint32_t k = 0; k < sub->n_outputs; k++) is_out[sub->outputs[k]] = 1;
  /* the gather (statement a - 1) natively where its form allows */
  uint32_t n_pro = a;
  if (s->n_gather && ng_init(sub, a - 1, &s->ng)) n_pro = a - 1;
  for (uint32_t i = n_pro; i < n && rc == NF_OK; i++) rc = nf_stmt_reads(sub, i, is_out);
  if (rc == NF_OK) rc = nf_stage_init(&s->pro, sub, order, n_pro, is_out);
  if (rc == NF_OK) {
    memset(is_out, 0, sub->n_tensors);
    for (uint32_t k = 0; k < sub->n_outputs; k++) is_out[sub->outputs[k]] = 1;
    rc = nf_stage_init(&s->epi, sub, order + a + 1, n - a - 1, is_out);
  }
  if (rc == NF_OK) rc = alloc_locals(s);
done:
  free(order);
  free(is_out);
  if (rc != NF_OK) {
    nf_gemm_free(s);
    if (rc == NF_ENOMEM) nf_buf_printf(err, "gemm: out of memory");
    return rc;
  }
  describe(s);
  *out = s;
  return NF_OK;
}

/* The product's description with C at buffer c (see nf_gemm_plain). */
static int fill_desc(const nf_gemm_sub *s, nf_gemm_desc *d, uint32_t c) {
  memset(d, 0, sizeof *d);
  int a = nf_stage_buffer(s->sub, s->t_a), b = nf_stage_buffer(s->sub, s->t_b);
  if (a < 0 || b < 0) return 0;
  d->a = (uint32_t)a;
  d->b = (uint32_t)b;
  d->c = c;
  d->trans_a = s->trans_a;
  d->trans_b = s->trans_b;
  d->m = s->m;
  d->n = s->n;
  d->k = s->k;
  d->lda = s->lda;
  d->ldb = s->ldb;
  d->ldc = s->ldc;
  d->off_a = s->off_a;
  d->off_b = s->off_b;
  d->c_numel = s->c_numel;
  d->n_batch = s->n_batch;
  for (int i = 0; i < s->n_batch; i++) {
    d->batch[i].e = s->batch[i].e;
    d->batch[i].st = s->batch[i].st;
    d->batch[i].sp = s->batch[i].sp;
    d->batch[i].sq = s->batch[i].sq;
  }
  return 1;
}

int nf_gemm_plain(const nf_gemm_sub *s, nf_gemm_desc *d) {
  memset(d, 0, sizeof *d);
  if (!s || s->pro.present || s->epi.present || s->n_gather) return 0;
  int c = nf_stage_buffer(s->sub, s->t_c);
  if (c < (int)s->sub->n_inputs) return 0;
  return fill_desc(s, d, (uint32_t)c);
}

int nf_gemm_device(const nf_gemm_sub *s, nf_gemm_desc *d) {
  memset(d, 0, sizeof *d);
  if (!s || s->pro.present || s->n_gather) return 0;
  int c = nf_stage_buffer(s->sub, s->t_c);
  uint32_t nb = s->sub->n_inputs + s->sub->n_outputs;
  if (c >= 0 && c < (int)s->sub->n_inputs) return 0;
  if (c < 0 && s->sub->tensors[s->t_c].kind != NF_T_LOCAL) return 0;
  return fill_desc(s, d, c < 0 ? nb : (uint32_t)c);
}

int nf_gemm_has_epilogue(const nf_gemm_sub *s) { return s->epi.present; }

int64_t nf_gemm_c_bytes(const nf_gemm_sub *s) { return tensor_bytes(&s->sub->tensors[s->t_c]); }

int nf_gemm_epilogue_reads(const nf_gemm_sub *s, uint32_t i) {
  for (uint32_t k = 0; s->epi.present && k < s->epi.sg.n_in; k++)
    if (nf_stage_buffer(s->sub, s->epi.sg.in[k]) == (int)i) return 1;
  return 0;
}

int nf_gemm_epilogue(nf_gemm_sub *s, void *const *buffers, void *c, nf_buf *err) {
  if (!s->epi.present) return NF_OK;
  const nf_graph *sub = s->sub;
  void *own = s->ptr[s->t_c];
  for (uint32_t k = 0; k < sub->n_inputs; k++) s->ptr[sub->inputs[k]] = buffers[k];
  for (uint32_t k = 0; k < sub->n_outputs; k++)
    s->ptr[sub->outputs[k]] = buffers[sub->n_inputs + k];
  s->ptr[s->t_c] = c;
  int rc = nf_stage_run(&s->epi, sub, s->ptr, "epilogue of a GEMM subgraph", err);
  if (sub->tensors[s->t_c].kind == NF_T_LOCAL) s->ptr[s->t_c] = own;
  return rc;
}

/* ---- the product: calls of sgemm (sdot, sgemv where a side is 1) ---- */

/* Below this many multiply-adds a run stays on the calling thread. */
#define PAR_MIN_MACS ((int64_t)1 << 17)

/* One call's product on a block of C: rows [i0, i1) and columns [j0, j1)
 * of an m x n result, at a, b, c (the call's offsets applied).  A row or
 * column vector goes through sdot or sgemv: sgemm on a 1 x 1 result is
 * several times slower than sdot in OpenBLAS 0.3.21 (bench: the mean of
 * 1.6 M squares, 4 ms against 0.7 ms). */
static void block_product(const nf_gemm_sub *s, const float *a, const float *b, float *c,
                          float beta, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  int64_t m = i1 - i0, n = j1 - j0, k = s->k;
  if (m <= 0 || n <= 0) return;
  /* the block's corner in each operand */
  a += s->trans_a ? i0 : i0 * s->lda;
  b += s->trans_b ? j0 * s->ldb : j0;
  c += i0 * s->ldc + j0;
  /* element strides: along A's row (over k), down B's column (over k),
   * down C's column (over i) */
  int64_t inc_a = s->trans_a ? s->lda : 1, inc_b = s->trans_b ? 1 : s->ldb;
  if (m == 1 && n == 1) {
    float d = cblas_sdot((blasint)k, a, (blasint)inc_a, b, (blasint)inc_b);
    *c = beta == 0.0f ? d : d + beta * *c;
  } else if (n == 1) { /* c(m) = A(m x k) b(k) */
    cblas_sgemv(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
                (blasint)(s->trans_a ? k : m), (blasint)(s->trans_a ? m : k), 1.0f, a,
                (blasint)s->lda, b, (blasint)inc_b, beta, c, (blasint)s->ldc);
  } else if (m == 1) { /* c(n) = B(k x n)^T a(k) */
    cblas_sgemv(CblasRowMajor, s->trans_b ? CblasNoTrans : CblasTrans,
                (blasint)(s->trans_b ? n : k), (blasint)(s->trans_b ? k : n), 1.0f, b,
                (blasint)s->ldb, a, (blasint)inc_a, beta, c, 1);
  } else {
    cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
                s->trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                a, (blasint)s->lda, b, (blasint)s->ldb, beta, c, (blasint)s->ldc);
  }
}

/* A share of a run: the calls whose independent index (the batch loops
 * with a C stride, in order) is in [q0, q1), each over all the reduction
 * loops (C stride 0: the calls after the first accumulate), on the block
 * rows [i0, i1) x columns [j0, j1). */
typedef struct gshare {
  const nf_gemm_sub *s;
  int64_t q0, q1, i0, i1, j0, j1;
} gshare;

static void run_share(const gshare *g) {
  const nf_gemm_sub *s = g->s;
  const float *a0 = (const float *)s->ptr[s->t_a] + s->off_a;
  const float *b0 = (const float *)s->ptr[s->t_b] + s->off_b;
  float *c0 = s->ptr[s->t_c];
  int64_t n_red = 1;
  for (int d = 0; d < s->n_batch; d++)
    if (s->batch[d].st == 0) n_red *= s->batch[d].e;
  for (int64_t q = g->q0; q < g->q1; q++) {
    /* q's indices in the independent loops, innermost last */
    int64_t oc = 0, oa = 0, ob = 0, rest = q;
    for (int d = s->n_batch - 1; d >= 0; d--) {
      if (s->batch[d].st == 0) continue;
      int64_t i = rest % s->batch[d].e;
      rest /= s->batch[d].e;
      oc += i * s->batch[d].st;
      oa += i * s->batch[d].sp;
      ob += i * s->batch[d].sq;
    }
    for (int64_t r = 0; r < n_red; r++) {
      int64_t ra = oa, rb = ob, rr = r;
      for (int d = s->n_batch - 1; d >= 0; d--) {
        if (s->batch[d].st != 0) continue;
        int64_t i = rr % s->batch[d].e;
        rr /= s->batch[d].e;
        ra += i * s->batch[d].sp;
        rb += i * s->batch[d].sq;
      }
      block_product(s, a0 + ra, b0 + rb, c0 + oc, r ? 1.0f : 0.0f, g->i0, g->i1, g->j0, g->j1);
    }
  }
}

typedef struct gplan {
  const nf_gemm_sub *s;
  int by; /* 0: shares of the independent calls, 1: of the rows, 2: of the columns */
  int64_t n_ind, parts;
} gplan;

static void share_body(void *ctx, int64_t lo, int64_t hi) {
  const gplan *p = ctx;
  const nf_gemm_sub *s = p->s;
  for (int64_t t = lo; t < hi; t++) {
    gshare g = {s, 0, p->n_ind, 0, s->m, 0, s->n};
    /* share t of parts, rounded to 16 rows or columns (whole vectors) */
    int64_t ext = p->by == 0 ? p->n_ind : p->by == 1 ? s->m : s->n;
    int64_t unit = p->by == 0 ? 1 : 16;
    int64_t units = (ext + unit - 1) / unit;
    int64_t b = units * t / p->parts * unit, e = units * (t + 1) / p->parts * unit;
    if (e > ext) e = ext;
    if (p->by == 0) {
      g.q0 = b;
      g.q1 = e;
    } else if (p->by == 1) {
      g.i0 = b;
      g.i1 = e;
    } else {
      g.j0 = b;
      g.j1 = e;
    }
    run_share(&g);
  }
}

/* The product, split over pool's threads when it is large: whole calls
 * when there are at least as many independent calls as threads, else
 * each call's rows or columns (whichever are more). */
static void gemm_exec(const nf_gemm_sub *s, nf_pool *pool) {
  if (s->c_numel == 0) return;
  float *c = s->ptr[s->t_c];
  if (s->k == 0) {
    memset(c, 0, (size_t)s->c_numel * sizeof *c);
    return;
  }
  gplan p = {s, 0, 1, 1};
  for (int d = 0; d < s->n_batch; d++)
    if (s->batch[d].st != 0) p.n_ind *= s->batch[d].e;
  int T = pool ? nf_pool_threads(pool) : 1;
  double macs = (double)s->m * (double)s->n * (double)s->k * (double)s->n_calls;
  if (T > 1 && macs >= (double)PAR_MIN_MACS) {
    if (p.n_ind >= T && (p.n_ind % T == 0 || p.n_ind >= 4 * T)) {
      p.by = 0;
      p.parts = T;
    } else {
      p.by = s->n >= s->m ? 2 : 1;
      int64_t units = ((p.by == 2 ? s->n : s->m) + 15) / 16;
      p.parts = units < T ? units : T;
    }
  }
  if (p.parts <= 1) {
    gshare g = {s, 0, p.n_ind, 0, s->m, 0, s->n};
    run_share(&g);
    return;
  }
  nf_pool_parallel_for(pool, p.parts, share_body, &p);
}

int nf_gemm_run_shared(nf_gemm_sub *s, void *const *buffers, nf_pool *pool,
                       const nf_gemm_sub *from, nf_buf *err) {
  const nf_graph *sub = s->sub;
  for (uint32_t k = 0; k < sub->n_inputs; k++) s->ptr[sub->inputs[k]] = buffers[k];
  for (uint32_t k = 0; k < sub->n_outputs; k++)
    s->ptr[sub->outputs[k]] = buffers[sub->n_inputs + k];
  int rc = NF_OK;
  if (s->pro.present && (rc = nf_stage_run(&s->pro, s->sub, s->ptr, "prologue of a GEMM subgraph", err)) != NF_OK) return rc;
  void *own = s->ng.present ? s->ptr[s->ng.t_dst] : NULL;
  if (from && nf_gemm_gather_same(s, from))
    s->ptr[s->ng.t_dst] = from->ptr[from->ng.t_dst];
  else if (s->ng.present)
    rc = ng_run(s, pool, err);
  if (rc == NF_OK) gemm_exec(s, pool);
  if (own) s->ptr[s->ng.t_dst] = own;
  if (rc == NF_OK && s->epi.present) rc = nf_stage_run(&s->epi, s->sub, s->ptr, "epilogue of a GEMM subgraph", err);
  return rc;
}

int nf_gemm_run(nf_gemm_sub *s, void *const *buffers, nf_pool *pool, nf_buf *err) {
  return nf_gemm_run_shared(s, buffers, pool, NULL, err);
}

int nf_gemm_gather_input(const nf_gemm_sub *s) {
  if (!s->ng.present) return -1;
  for (uint32_t k = 0; k < s->sub->n_inputs; k++)
    if (s->sub->inputs[k] == s->ng.t_src) return (int)k;
  return -1;
}

int nf_gemm_gather_same(const nf_gemm_sub *a, const nf_gemm_sub *b) {
  const ngather *x = &a->ng, *y = &b->ng;
  if (!x->present || !y->present || x->n != y->n || x->rank != y->rank || x->n_con != y->n_con)
    return 0;
  return !memcmp(x->ext, y->ext, sizeof x->ext) && !memcmp(x->shape, y->shape, sizeof x->shape) &&
         !memcmp(x->idx, y->idx, sizeof x->idx) && !memcmp(&x->off, &y->off, sizeof x->off) &&
         !memcmp(x->con, y->con, sizeof x->con);
}

void nf_gemm_free(nf_gemm_sub *s) {
  if (!s) return;
  nf_stage_clear(&s->pro);
  nf_stage_clear(&s->epi);
  free(s->ptr);
  free(s->locals);
  free(s);
}

void nf_gemm_stages(const nf_gemm_sub *s, int *n_pro, int *n_epi) {
  *n_pro = s->pro.present ? (int)s->pro.sg.n_stmts : 0;
  *n_epi = s->epi.present ? (int)s->epi.sg.n_stmts : 0;
}

const char *nf_gemm_describe(const nf_gemm_sub *s) {
  return s->desc;
}

void nf_gemm_set_threads(int n) {
  openblas_set_num_threads(n < 1 ? 1 : n);
}

const char *nf_gemm_blas_misfit(const char **suggest) {
  const char *core = openblas_get_corename();
  *suggest = NULL;
  if (!core || strcasecmp(core, "prescott") != 0) return NULL;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
  *suggest = __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
  return core;
}
