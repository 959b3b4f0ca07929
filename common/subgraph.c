/* subgraph.c - statements of a graph cut out as a graph of their own
 * (nf_subgraph.h): the expressions are rebuilt with the subgraph's tensor
 * numbering (nf_expr_visit walks the expression DAGs, each shared node
 * once; a map from old to new node keeps shared nodes shared). */
#include <stdlib.h>
#include <string.h>

#include "nf_subgraph.h"

#include "nf_ptrmap.h"

typedef struct reads_ctx {
  uint8_t *row;
  uint32_t n_tensors;
} reads_ctx;

static void mark_one(const nf_expr *e, void *user) {
  reads_ctx *r = user;
  if (e->op == NF_OP_ACCESS && e->u.tensor < r->n_tensors) r->row[e->u.tensor] = 1;
}

/* Marks the tensors e reads in row (each shared node visited once). */
static int mark_reads(const nf_expr *e, uint8_t *row, uint32_t n_tensors) {
  reads_ctx r = {row, n_tensors};
  return nf_expr_visit(e, mark_one, &r);
}

int nf_stmt_reads(const nf_graph *g, uint32_t s, uint8_t *row) {
  return mark_reads(g->stmts[s].rhs, row, g->n_tensors);
}

/* ---- building a subgraph (nf_graph_extract) ---- */

/* old node -> rebuilt node */
static const nf_expr *rget(const nf_ptrmap *m, const nf_expr *e) {
  const void *v = NULL;
  return nf_ptrmap_getp(m, e, &v) ? v : NULL;
}

static int rput(nf_ptrmap *m, const nf_expr *e, const nf_expr *v) {
  return nf_ptrmap_putp(m, e, v);
}

typedef struct renum {
  nf_ir_ctx *ctx;
  const int *tmap;
  nf_ptrmap *m;
  int failed;
} renum;

/* Called children first (nf_expr_visit): rebuilds e from its renumbered
 * arguments. */
static void renumber_one(const nf_expr *e, void *user) {
  renum *R = user;
  if (R->failed || rget(R->m, e)) return; /* done for an earlier statement */
  const nf_expr *args[64];
  const nf_expr **a = e->n_args <= 64 ? args : malloc(e->n_args * sizeof *a);
  if (!a) {
    R->failed = 1;
    return;
  }
  for (uint16_t k = 0; k < e->n_args; k++) a[k] = rget(R->m, e->args[k]);
  const nf_expr *v;
  /* a tensor read before the statement producing it: the caller's order */
  NF_ASSERT(e->op != NF_OP_ACCESS || R->tmap[e->u.tensor] >= 0);
  if (e->op == NF_OP_ACCESS)
    v = nf_e_access(R->ctx, (uint32_t)R->tmap[e->u.tensor], (nf_dtype)e->dtype, e->n_args, a);
  else
    v = e->n_args ? nf_e_rebuild(R->ctx, e, a) : e;
  if (a != args) free(a);
  if (!v || rput(R->m, e, v) != NF_OK) R->failed = 1;
}

/* e with every access to tensor t renumbered to tmap[t] (nodes already in
 * m, from earlier statements of the subgraph, are reused). */
static const nf_expr *renumber(nf_ir_ctx *ctx, const nf_expr *root, const int *tmap, nf_ptrmap *m) {
  const nf_expr *done = rget(m, root);
  if (done) return done;
  renum R = {ctx, tmap, m, 0};
  if (nf_expr_visit(root, renumber_one, &R) != NF_OK || R.failed) return NULL;
  return rget(m, root);
}

void nf_subgraph_clear(nf_subgraph *sg) {
  if (!sg) return;
  free(sg->stmts);
  free(sg->in);
  free(sg->out);
  memset(sg, 0, sizeof *sg);
  sg->anchor = -1;
}

int nf_graph_extract(const nf_graph *g, const uint32_t *stmts, uint32_t n, const uint8_t *is_out,
                     nf_subgraph *sg) {
  nf_ir_ctx *ctx = g->ctx;
  uint32_t nt = g->n_tensors;
  memset(sg, 0, sizeof *sg);
  sg->anchor = -1;
  uint8_t *inside = calloc(nt ? nt : 1, 1); /* produced by one of stmts */
  uint8_t *row = malloc(nt ? nt : 1);
  int *tmap = malloc((nt ? nt : 1) * sizeof *tmap);
  sg->stmts = malloc((n ? n : 1) * sizeof *sg->stmts);
  sg->in = malloc((nt ? nt : 1) * sizeof *sg->in);
  sg->out = malloc((nt ? nt : 1) * sizeof *sg->out);
  sg->g = nf_graph_new(ctx, g->name);
  nf_ptrmap m = NF_PTRMAP_INIT;
  int rc = NF_OK;
  if (!inside || !row || !tmap || !sg->stmts || !sg->in || !sg->out || !sg->g) {
    rc = NF_ENOMEM;
    goto done;
  }
  sg->n_stmts = n;
  if (n) memcpy(sg->stmts, stmts, n * sizeof *stmts);
  for (uint32_t k = 0; k < n; k++) inside[g->stmts[stmts[k]].out] = 1;
  for (uint32_t t = 0; t < nt; t++) tmap[t] = -1;
  /* inputs, in order of first use (by tensor id within a statement) */
  for (uint32_t k = 0; k < n && rc == NF_OK; k++) {
    memset(row, 0, nt);
    if ((rc = nf_stmt_reads(g, stmts[k], row)) != NF_OK) break;
    for (uint32_t t = 0; t < nt; t++) {
      if (!row[t] || inside[t] || tmap[t] >= 0) continue;
      const nf_tensor *tn = &g->tensors[t];
      int id = nf_graph_add_tensor(sg->g, tn->name, (nf_dtype)tn->dtype, NF_T_INPUT, tn->rank,
                                   tn->shape);
      if (id < 0) {
        rc = id;
        break;
      }
      tmap[t] = id;
      sg->in[sg->n_in++] = t;
    }
  }
  /* statements, their results outputs where is_out says so */
  for (uint32_t k = 0; k < n && rc == NF_OK; k++) {
    const nf_stmt *st = &g->stmts[stmts[k]];
    uint32_t t = st->out;
    const nf_tensor *tn = &g->tensors[t];
    int id = nf_graph_add_tensor(sg->g, tn->name, (nf_dtype)tn->dtype,
                                 is_out[t] ? NF_T_OUTPUT : NF_T_LOCAL, tn->rank, tn->shape);
    if (id < 0) {
      rc = id;
      break;
    }
    tmap[t] = id;
    if (is_out[t]) sg->out[sg->n_out++] = t;
    nf_stmt ns = *st;
    ns.out = (uint32_t)id;
    ns.rhs = renumber(ctx, st->rhs, tmap, &m);
    if (!ns.rhs) rc = NF_ENOMEM;
    else rc = nf_graph_add_stmt(sg->g, &ns);
  }
  if (rc == NF_OK) rc = nf_graph_hash(sg->g, sg->key);
done:
  nf_ptrmap_free(&m);
  free(inside);
  free(row);
  free(tmap);
  if (rc != NF_OK) nf_subgraph_clear(sg);
  return rc;
}
