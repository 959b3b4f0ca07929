/* transfer.c - what a search takes from other subgraphs: the shape that
 * finds similar ones (nf_search_shape), and their schedules adapted to
 * this graph (nf_search_adapt).
 *
 * A schedule of a similar subgraph (same signature: the same statements,
 * roles and loop structure, other extents) names the same statements and
 * loops (the daemon's graphs carry no variable names: loops are v0, v1,
 * ... by position).  What may differ: tensor names (metadata the client
 * chose) and the extents its split factors were drawn for.  Adapting
 * drops the packing of a tensor this graph's statement does not read by
 * that name, and cuts every split factor to the extent of the loop it
 * splits (a tile larger than its loop only adds a guarded tail).  Then
 * lowering judges it like any candidate: one that does not lower is
 * dropped.  Nothing here compiles or runs code. */
#include <stdlib.h>
#include <string.h>

#include "nf_search.h"
#include "nf_sketch.h"
#include "nf_status.h"

int nf_search_shape(const nf_graph *g, uint8_t sig[16], float *desc, size_t max, size_t *n_desc) {
  nf_sk_space *sp = NULL;
  /* the shape does not depend on the target (only the space's default
   * schedule does): any target */
  nf_sched_target any = nf_sched_target_of(NULL);
  int rc = nf_sk_space_new(g, &any, &sp);
  if (rc != NF_OK) return rc;
  nf_sk_shape(sp, sig, desc, max, n_desc);
  nf_sk_space_free(sp);
  return NF_OK;
}

/* The loops of one statement's nest as its primitives make them: names
 * and extents (at most 64; later ones are not tracked). */
typedef struct loops {
  int n;
  char name[64][NF_SCHED_NAME];
  int64_t ext[64];
} loops;

static int64_t loop_ext(const loops *l, const char *name) {
  for (int q = 0; q < l->n; q++)
    if (strcmp(l->name[q], name) == 0) return l->ext[q];
  return 0;
}

static void loop_add(loops *l, const char *name, int64_t ext) {
  if (l->n == 64 || loop_ext(l, name)) return;
  snprintf(l->name[l->n], NF_SCHED_NAME, "%s", name);
  l->ext[l->n++] = ext;
}

typedef struct reads {
  const nf_graph *g;
  const char *name;
  int found;
} reads;

static void reads_name_fn(const nf_expr *e, void *user) {
  reads *r = user;
  if (e->op != NF_OP_ACCESS || r->found) return;
  const char *n = r->g->tensors[e->u.tensor].name;
  if (n && strcmp(n, r->name) == 0) r->found = 1;
}

int nf_search_adapt(const nf_graph *g, const char *text, nf_schedule **out, nf_buf *err) {
  *out = NULL;
  nf_schedule *src = NULL;
  int rc = nf_schedule_parse(text, "transfer", &src, err);
  if (rc != NF_OK) return rc;
  if (src->n_stmts >= 0 && src->n_stmts != (int64_t)g->n_stmts) {
    nf_buf_printf(err, "transfer: a schedule of %lld statements, the graph has %u",
                  (long long)src->n_stmts, g->n_stmts);
    nf_schedule_free(src);
    return NF_EINVAL;
  }
  nf_schedule *s = nf_schedule_new();
  loops *lp = calloc(g->n_stmts ? g->n_stmts : 1, sizeof *lp);
  rc = s && lp ? NF_OK : NF_ENOMEM;
  if (s) s->n_stmts = src->n_stmts;
  for (uint32_t i = 0; lp && i < g->n_stmts; i++) {
    const nf_stmt *st = &g->stmts[i];
    const nf_tensor *t = &g->tensors[st->out];
    for (int v = 0; v < t->rank + st->n_red; v++) {
      char nm[NF_SCHED_NAME];
      nf__sched_var_name(st, v, nm);
      loop_add(&lp[i], nm, v < t->rank ? t->shape[v] : st->red_ext[v - t->rank]);
    }
  }
  for (int q = 0; rc == NF_OK && q < src->n_items; q++) {
    nf_sched_item it = src->items[q];
    if (it.stmt < 0 || it.stmt >= (int32_t)g->n_stmts) {
      rc = nf_schedule_add(s, &it); /* by name: lowering resolves (or refuses) it */
      continue;
    }
    loops *l = &lp[it.stmt];
    if (it.kind == NF_SCH_CACHE_READ && it.n_names == 2) {
      reads r = {g, it.names[1], 0};
      nf_expr_visit(g->stmts[it.stmt].rhs, reads_name_fn, &r);
      if (!r.found) continue; /* another tensor name: no packing */
    }
    if (it.kind == NF_SCH_SPLIT && it.n_names == 1) {
      int64_t e = loop_ext(l, it.names[0]);
      if (e > 0 && it.factor > e) it.factor = e;
      if (e > 0 && it.factor > 0) {
        char o[NF_SCHED_NAME], in[NF_SCHED_NAME];
        nf__sched_cat(o, it.names[0], ".o");
        nf__sched_cat(in, it.names[0], ".i");
        loop_add(l, o, (e + it.factor - 1) / it.factor);
        loop_add(l, in, it.factor);
      }
    }
    if (it.kind == NF_SCH_FUSE && it.n_names == 2) {
      int64_t a = loop_ext(l, it.names[0]), b = loop_ext(l, it.names[1]);
      char f[2 * NF_SCHED_NAME + 16], cut[NF_SCHED_NAME];
      snprintf(f, sizeof f, "%s.%s.fused", it.names[0], it.names[1]);
      nf__sched_cat(cut, f, "");
      if (a > 0 && b > 0) loop_add(l, cut, a * b);
    }
    rc = nf_schedule_add(s, &it);
  }
  free(lp);
  nf_schedule_free(src);
  if (rc == NF_OK) {
    /* lowering is the judge, as for any candidate */
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_lprog *p;
    rc = ctx ? nf_lower(g, s, ctx, &p, err) : NF_ENOMEM;
    nf_ir_ctx_free(ctx);
  }
  if (rc != NF_OK) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}
