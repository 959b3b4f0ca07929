/* narrow.c - intermediates computed only where they are read
 * (nf_narrow.h). */
#include <stdlib.h>
#include <string.h>

#include "nf_narrow.h"

/* The boxes every tensor is read in (box[t]: lo, hi per dimension, over
 * the interval bounds of the index expressions across the reading
 * statement's variable ranges), for the accesses in e; bad[t] when a
 * bound of some access of t is unknown. */
typedef struct reads {
  int64_t (*box)[2 * NF_MAX_RANK];
  uint8_t *seen, *bad;
} reads;

static void read_boxes(const nf_expr *e, const nf_range *rg, int n_vars, reads *r) {
  if (e->op == NF_OP_ACCESS && !r->bad[e->u.tensor]) {
    uint32_t t = e->u.tensor;
    for (uint16_t d = 0; d < e->n_args; d++) {
      nf_range b;
      if (!nf_expr_bounds(e->args[d], rg, n_vars, &b)) {
        r->bad[t] = 1;
        break;
      }
      if (!r->seen[t] || b.lo < r->box[t][2 * d]) r->box[t][2 * d] = b.lo;
      if (!r->seen[t] || b.hi > r->box[t][2 * d + 1]) r->box[t][2 * d + 1] = b.hi;
    }
    r->seen[t] = 1;
  }
  for (uint16_t i = 0; i < e->n_args; i++) read_boxes(e->args[i], rg, n_vars, r);
}

/* e with the output variables v < n_out shifted (v -> v + vshift[v]) and
 * every access of a narrowed tensor t shifted back (index d minus
 * lo[t][d]); with zero, that access is also wrapped in `inside ? .. : 0`
 * (inside: the index within t's box). */
static const nf_expr *rebuild(nf_ir_ctx *ctx, const nf_expr *e, const int64_t *vshift,
                              uint32_t n_out, int64_t (*lo)[NF_MAX_RANK],
                              int64_t (*shape)[NF_MAX_RANK], const nf_graph *g,
                              const uint8_t *narrowed, int zero) {
  if (e->op == NF_OP_VAR) {
    if (!vshift || e->u.var >= n_out || vshift[e->u.var] == 0) return e;
    return nf_e_binary(ctx, NF_OP_ADD, e, nf_e_const_i(ctx, NF_I64, vshift[e->u.var]));
  }
  if (e->n_args == 0) return e;
  const nf_expr *a[NF_MAX_RANK];
  if (e->n_args > NF_MAX_RANK) return NULL; /* accesses <= rank, others <= 3 */
  for (uint16_t i = 0; i < e->n_args; i++) {
    a[i] = rebuild(ctx, e->args[i], vshift, n_out, lo, shape, g, narrowed, zero);
    if (!a[i]) return NULL;
  }
  if (e->op != NF_OP_ACCESS || !narrowed[e->u.tensor]) return nf_e_rebuild(ctx, e, a);
  uint32_t t = e->u.tensor;
  const nf_expr *in = NULL;
  for (uint16_t d = 0; d < e->n_args; d++) {
    int64_t l = lo[t][d], h = l + shape[t][d] - 1;
    if (zero) {
      const nf_expr *c[2] = {
          l > 0 ? nf_e_binary(ctx, NF_OP_GE, a[d], nf_e_const_i(ctx, NF_I64, l)) : NULL,
          h < g->tensors[t].shape[d] - 1
              ? nf_e_binary(ctx, NF_OP_LE, a[d], nf_e_const_i(ctx, NF_I64, h))
              : NULL};
      for (int j = 0; j < 2; j++)
        if (c[j]) in = in ? nf_e_binary(ctx, NF_OP_AND, in, c[j]) : c[j];
    }
    if (l) {
      a[d] = nf_e_binary(ctx, NF_OP_SUB, a[d], nf_e_const_i(ctx, NF_I64, l));
      a[d] = a[d] ? nf_simplify(ctx, a[d], NULL, 0) : NULL;
      if (!a[d]) return NULL;
    }
  }
  const nf_expr *x = nf_e_access(ctx, t, (nf_dtype)e->dtype, e->n_args, a);
  if (!in || !x) return x;
  return nf_e_select(ctx, in, x, nf_e_const_f(ctx, (nf_dtype)e->dtype, 0.0));
}

/* The variable ranges of statement s (inclusive), n_vars entries. */
static int stmt_ranges(const nf_graph *g, uint32_t s, nf_range *rg) {
  const nf_stmt *st = &g->stmts[s];
  const nf_tensor *o = &g->tensors[st->out];
  int n = 0;
  for (uint32_t d = 0; d < o->rank; d++, n++) {
    rg[n].lo = 0;
    rg[n].hi = o->shape[d] - 1;
  }
  for (uint32_t r = 0; r < st->n_red; r++, n++) {
    rg[n].lo = st->red_lo[r];
    rg[n].hi = st->red_lo[r] + st->red_ext[r] - 1;
  }
  return n;
}

/* g with the narrowed tensors of shape[t] (from lo[t]) and every
 * statement rebuilt (above; with zero, a narrowed producer keeps its
 * select's value, whose condition holds inside its box), in normal form
 * again: *out, or NULL when it does not validate.  NF_OK or NF_ENOMEM. */
static int narrowed_graph(const nf_graph *g, const uint8_t *narrowed,
                          int64_t (*lo)[NF_MAX_RANK], int64_t (*shape)[NF_MAX_RANK], int zero,
                          nf_graph **out) {
  *out = NULL;
  nf_graph *ng = nf_graph_new(g->ctx, g->name);
  if (!ng) return NF_ENOMEM;
  int rc = NF_OK;
  for (uint32_t t = 0; t < g->n_tensors && rc >= 0; t++) {
    const nf_tensor *x = &g->tensors[t];
    rc = nf_graph_add_tensor(ng, x->name, (nf_dtype)x->dtype, (nf_tkind)x->kind, x->rank,
                             narrowed[t] ? shape[t] : x->shape);
  }
  if (rc < 0) return rc;
  rc = NF_OK;
  memcpy(ng->inputs, g->inputs, sizeof(uint32_t) * g->n_inputs);
  memcpy(ng->outputs, g->outputs, sizeof(uint32_t) * g->n_outputs);
  for (uint32_t i = 0; i < g->n_stmts && rc == NF_OK; i++) {
    nf_stmt st = g->stmts[i];
    const nf_tensor *o = &g->tensors[st.out];
    const nf_expr *rhs = zero && narrowed[st.out] ? st.rhs->args[1] : st.rhs;
    st.rhs = rebuild(g->ctx, rhs, narrowed[st.out] ? lo[st.out] : NULL, o->rank, lo, shape, g,
                     narrowed, zero);
    if (st.rhs && st.rhs != g->stmts[i].rhs) { /* changed: normal form again */
      nf_range rg[NF_MAX_VARS];
      int nv = stmt_ranges(g, i, rg);
      for (uint32_t d = 0; narrowed[st.out] && d < o->rank; d++) rg[d].hi = shape[st.out][d] - 1;
      st.rhs = nf_simplify(g->ctx, st.rhs, rg, nv);
    }
    rc = st.rhs ? nf_graph_add_stmt(ng, &st) : NF_ENOMEM;
  }
  if (rc == NF_OK && nf_ir_ctx_oom(g->ctx)) rc = NF_ENOMEM;
  if (rc == NF_OK && nf_graph_validate(ng, NULL) == NF_OK) *out = ng;
  return rc;
}

int nf_narrow_reads(const nf_graph *g, nf_graph **out, int *n_done) {
  *out = NULL;
  *n_done = 0;
  uint32_t nt = g->n_tensors, ns = g->n_stmts;
  int64_t (*lo)[NF_MAX_RANK] = calloc(nt + 1, sizeof *lo);
  int64_t (*shape)[NF_MAX_RANK] = calloc(nt + 1, sizeof *shape);
  uint8_t *narrowed = calloc(nt + 1, 1);
  int32_t *producer = malloc(sizeof(int32_t) * (nt + 1));
  reads rd = {calloc(nt + 1, sizeof *rd.box), calloc(nt + 1, 1), calloc(nt + 1, 1)};
  int rc = NF_OK, n = 0;
  if (!lo || !shape || !narrowed || !producer || !rd.box || !rd.seen || !rd.bad) {
    rc = NF_ENOMEM;
    goto done;
  }
  for (uint32_t t = 0; t < nt; t++) producer[t] = -1;
  for (uint32_t i = 0; i < ns; i++) {
    producer[g->stmts[i].out] = (int32_t)i;
    nf_range rg[NF_MAX_VARS];
    int nv = stmt_ranges(g, i, rg);
    read_boxes(g->stmts[i].rhs, rg, nv, &rd);
  }
  for (uint32_t t = 0; t < nt; t++) {
    const nf_tensor *x = &g->tensors[t];
    if (x->kind != NF_T_LOCAL || x->rank == 0 || producer[t] < 0 ||
        g->stmts[producer[t]].flags || !rd.seen[t] || rd.bad[t])
      continue;
    const int64_t *box = rd.box[t];
    int ok = 1;
    int64_t before = nf_tensor_numel(x), after = 1;
    for (uint32_t d = 0; d < x->rank; d++) {
      if (box[2 * d] < 0 || box[2 * d + 1] > x->shape[d] - 1 || box[2 * d] > box[2 * d + 1]) {
        ok = 0; /* reads outside the tensor: left for the interpreter to report */
        break;
      }
      lo[t][d] = box[2 * d];
      shape[t][d] = box[2 * d + 1] - box[2 * d] + 1;
      after *= shape[t][d];
    }
    /* worth it: at least a tenth of the tensor is never read */
    if (!ok || after * 10 > before * 9) {
      memset(lo[t], 0, sizeof lo[t]);
      continue;
    }
    narrowed[t] = 1;
    n++;
  }
  if (n == 0) goto done;
  rc = narrowed_graph(g, narrowed, lo, shape, 0, out);
  if (*out) *n_done = n;
done:
  free(lo);
  free(shape);
  free(narrowed);
  free(producer);
  free(rd.box);
  free(rd.seen);
  free(rd.bad);
  return rc == NF_ENOMEM ? NF_ENOMEM : NF_OK;
}

/* ---- tensors stored only where they can be nonzero ---- */

/* Narrows box (lo, hi per dimension) of output variables by conjunct c
 * of a producer's select; 0 when c is not `v OP k` for an output
 * variable v < rank and a constant k (either side; any offset). */
static int zero_box_conj(nf_ir_ctx *ctx, const nf_expr *c, uint32_t rank, int64_t *lo,
                         int64_t *hi) {
  if (c->op == NF_OP_AND)
    return zero_box_conj(ctx, c->args[0], rank, lo, hi) &&
           zero_box_conj(ctx, c->args[1], rank, lo, hi);
  nf_op op = (nf_op)c->op;
  if (op != NF_OP_LT && op != NF_OP_LE && op != NF_OP_GT && op != NF_OP_GE && op != NF_OP_EQ)
    return 0;
  if (!nf_dtype_is_int((nf_dtype)c->args[0]->dtype)) return 0;
  /* g = lhs - rhs = v + k0: g OP 0 */
  const nf_expr *g = nf_e_binary(ctx, NF_OP_SUB, c->args[0], c->args[1]);
  g = g ? nf_simplify(ctx, g, NULL, 0) : NULL;
  if (!g) return 0;
  for (uint32_t v = 0; v < rank; v++) {
    const nf_expr *k = nf_e_binary(ctx, NF_OP_SUB, g, nf_e_var(ctx, v));
    k = k ? nf_simplify(ctx, k, NULL, 0) : NULL;
    if (!k || k->op != NF_OP_CONST || !nf_dtype_is_int((nf_dtype)k->dtype)) continue;
    int64_t m = -k->u.i; /* v OP m */
    switch (op) {
    case NF_OP_LT: if (m - 1 < hi[v]) hi[v] = m - 1; break;
    case NF_OP_LE: if (m < hi[v]) hi[v] = m; break;
    case NF_OP_GT: if (m + 1 > lo[v]) lo[v] = m + 1; break;
    case NF_OP_GE: if (m > lo[v]) lo[v] = m; break;
    default:
      if (m > lo[v]) lo[v] = m;
      if (m < hi[v]) hi[v] = m;
      break;
    }
    return 1;
  }
  return 0;
}

int nf_narrow_zeros(const nf_graph *g, nf_graph **out, int *n_done) {
  *out = NULL;
  *n_done = 0;
  uint32_t nt = g->n_tensors, ns = g->n_stmts;
  int64_t (*lo)[NF_MAX_RANK] = calloc(nt + 1, sizeof *lo);
  int64_t (*shape)[NF_MAX_RANK] = calloc(nt + 1, sizeof *shape);
  uint8_t *narrowed = calloc(nt + 1, 1);
  int32_t *producer = malloc(sizeof(int32_t) * (nt + 1));
  int rc = NF_OK, n = 0;
  if (!lo || !shape || !narrowed || !producer) {
    rc = NF_ENOMEM;
    goto done;
  }
  for (uint32_t t = 0; t < nt; t++) producer[t] = -1;
  for (uint32_t i = 0; i < ns; i++) producer[g->stmts[i].out] = (int32_t)i;
  for (uint32_t t = 0; t < nt; t++) {
    const nf_tensor *x = &g->tensors[t];
    if (x->kind != NF_T_LOCAL || x->rank == 0 || producer[t] < 0) continue;
    const nf_stmt *st = &g->stmts[producer[t]];
    const nf_expr *e = st->rhs;
    if (st->flags || st->red != NF_RED_NONE || st->n_red || e->op != NF_OP_SELECT ||
        e->args[2]->op != NF_OP_CONST || !nf_dtype_is_float((nf_dtype)e->args[2]->dtype) ||
        e->args[2]->u.f != 0.0)
      continue;
    int64_t blo[NF_MAX_RANK], bhi[NF_MAX_RANK], before = nf_tensor_numel(x), after = 1;
    for (uint32_t d = 0; d < x->rank; d++) {
      blo[d] = 0;
      bhi[d] = x->shape[d] - 1;
    }
    if (!zero_box_conj(g->ctx, e->args[0], x->rank, blo, bhi)) continue;
    for (uint32_t d = 0; d < x->rank; d++) after *= bhi[d] >= blo[d] ? bhi[d] - blo[d] + 1 : 0;
    /* worth it: at least a tenth of the tensor is always zero */
    if (after == 0 || after * 10 > before * 9) continue;
    for (uint32_t d = 0; d < x->rank; d++) {
      lo[t][d] = blo[d];
      shape[t][d] = bhi[d] - blo[d] + 1;
    }
    narrowed[t] = 1;
    n++;
  }
  if (n == 0) goto done;
  rc = narrowed_graph(g, narrowed, lo, shape, 1, out);
  if (*out) *n_done = n;
done:
  free(lo);
  free(shape);
  free(narrowed);
  free(producer);
  return rc == NF_ENOMEM ? NF_ENOMEM : NF_OK;
}
