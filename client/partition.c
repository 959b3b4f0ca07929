/* partition.c - a graph cut into subgraphs (nf_partition.h).
 *
 * Groups of statements start as singletons and are merged by three
 * passes: epilogues (an elementwise statement joins the anchored group of
 * a reduction it reads), inlining (a light producer whose local result is
 * read only inside one anchored group joins it), then grouping of the
 * light statements left (each joins the previous light group).  A merge
 * is made only when it keeps at most one anchor per group and the group
 * graph acyclic (no path from one group to the other through a third).
 * Groups are then ordered topologically and each becomes a graph
 * (nf_graph_extract, also used by the executor to cut a subgraph into
 * prologue and epilogue) whose expressions are rebuilt with the
 * subgraph's tensor numbering (nf_expr_visit walks the expression DAGs,
 * each shared node once).
 *
 * The acyclicity check walks the group graph (member lists and reader
 * lists) per candidate merge: linear per merge, so a training graph of
 * thousands of statements partitions in milliseconds. */
#include <stdlib.h>
#include <string.h>

#include "nf_partition.h"

typedef struct part {
  const nf_graph *g;
  uint32_t n;          /* statements */
  int *producer;       /* tensor -> statement, -1 */
  uint8_t *reads;      /* n x n_tensors: statement s reads tensor t */
  uint32_t *grp;       /* statement -> group representative */
  int *anchor;         /* group rep -> anchor statement or -1 */
  uint32_t *succ_at;   /* n + 1 offsets into succ */
  uint32_t *succ;      /* statements that read statement s's result */
  uint32_t *first, *next, *last; /* group members: rep -> first, s -> next (UINT32_MAX ends) */
  uint32_t *stamp;     /* rep -> visit mark */
  uint32_t cur;
} part;

static uint32_t find(part *P, uint32_t s) {
  while (P->grp[s] != s) s = P->grp[s] = P->grp[P->grp[s]];
  return s;
}

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

/* 1 when group b is reachable from group a through some group other than
 * a and b (an edge: a statement of one reads a tensor produced by the
 * other).  Works on representatives; a breadth-first walk over the
 * groups' members and their readers, O(statements + edges). */
static int path_through_other(part *P, uint32_t a, uint32_t b, uint32_t *stack) {
  uint32_t sp = 0, mark = ++P->cur;
  for (uint32_t x = a, first = 1;;) {
    for (uint32_t p = P->first[x]; p != UINT32_MAX; p = P->next[p])
      for (uint32_t e = P->succ_at[p]; e < P->succ_at[p + 1]; e++) {
        uint32_t gs = find(P, P->succ[e]);
        if (gs == a || P->stamp[gs] == mark) continue;
        if (gs == b) {
          if (!first) return 1;
          continue;
        }
        P->stamp[gs] = mark;
        stack[sp++] = gs;
      }
    if (!sp) return 0;
    x = stack[--sp];
    first = 0;
  }
}

/* Merges the groups of statements s and t when allowed; 1 if merged. */
static int try_merge(part *P, uint32_t s, uint32_t t, uint8_t *seen, uint32_t *stack) {
  (void)seen;
  uint32_t a = find(P, s), b = find(P, t);
  if (a == b) return 0;
  if (P->anchor[a] >= 0 && P->anchor[b] >= 0) return 0;
  if (path_through_other(P, a, b, stack) || path_through_other(P, b, a, stack)) return 0;
  uint32_t lo = a < b ? a : b, hi = a < b ? b : a;
  P->grp[hi] = lo;
  P->anchor[lo] = P->anchor[a] >= 0 ? P->anchor[a] : P->anchor[b];
  P->next[P->last[lo]] = P->first[hi];
  P->last[lo] = P->last[hi];
  return 1;
}

/* ---- building a subgraph (nf_graph_extract) ---- */

typedef struct remap {
  const nf_expr **key;
  const nf_expr **val;
  size_t cap, n;
} remap;

static size_t rslot(const nf_expr *e, size_t cap) {
  uintptr_t h = (uintptr_t)e;
  h ^= h >> 17;
  h *= 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 7) & (cap - 1);
}

static const nf_expr *rget(const remap *m, const nf_expr *e) {
  if (!m->cap) return NULL;
  for (size_t i = rslot(e, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (!m->key[i]) return NULL;
    if (m->key[i] == e) return m->val[i];
  }
}

static int rput(remap *m, const nf_expr *e, const nf_expr *v) {
  if (2 * (m->n + 1) > m->cap) {
    size_t ncap = m->cap ? 2 * m->cap : 256;
    const nf_expr **nk = calloc(ncap, sizeof *nk), **nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return NF_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->key[i]) {
        size_t j = rslot(m->key[i], ncap);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = m->key[i];
        nv[j] = m->val[i];
      }
    free(m->key);
    free(m->val);
    m->key = nk;
    m->val = nv;
    m->cap = ncap;
  }
  size_t i = rslot(e, m->cap);
  while (m->key[i]) i = (i + 1) & (m->cap - 1);
  m->key[i] = e;
  m->val[i] = v;
  m->n++;
  return NF_OK;
}

typedef struct renum {
  nf_ir_ctx *ctx;
  const int *tmap;
  remap *m;
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
static const nf_expr *renumber(nf_ir_ctx *ctx, const nf_expr *root, const int *tmap, remap *m) {
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
  remap m = {0};
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
  free(m.key);
  free(m.val);
  free(inside);
  free(row);
  free(tmap);
  if (rc != NF_OK) nf_subgraph_clear(sg);
  return rc;
}

int nf_partition_graph(const nf_graph *g, nf_partition **out, nf_buf *err) {
  *out = NULL;
  int rc = nf_graph_validate(g, err);
  if (rc != NF_OK) return rc == NF_ENOMEM ? rc : NF_EINVAL;
  part P = {.g = g, .n = g->n_stmts};
  uint32_t n = g->n_stmts, nt = g->n_tensors;
  nf_partition *p = calloc(1, sizeof *p);
  P.producer = malloc((nt ? nt : 1) * sizeof *P.producer);
  P.reads = calloc((size_t)(n ? n : 1) * (nt ? nt : 1), 1);
  P.grp = malloc((n ? n : 1) * sizeof *P.grp);
  P.anchor = malloc((n ? n : 1) * sizeof *P.anchor);
  uint8_t *seen = malloc(n ? n : 1);
  uint32_t *stack = malloc((n ? n : 1) * sizeof *stack);
  uint8_t *is_out = malloc(nt ? nt : 1);
  uint32_t *members = malloc((n ? n : 1) * sizeof *members);
  P.succ_at = calloc((size_t)n + 2, sizeof *P.succ_at);
  P.first = malloc((n ? n : 1) * sizeof *P.first);
  P.next = malloc((n ? n : 1) * sizeof *P.next);
  P.last = malloc((n ? n : 1) * sizeof *P.last);
  P.stamp = calloc(n ? n : 1, sizeof *P.stamp);
  if (!p || !P.producer || !P.reads || !P.grp || !P.anchor || !seen || !stack || !is_out ||
      !members || !P.succ_at || !P.first || !P.next || !P.last || !P.stamp) {
    rc = NF_ENOMEM;
    goto done;
  }
  for (uint32_t t = 0; t < nt; t++) P.producer[t] = -1;
  for (uint32_t s = 0; s < n; s++) {
    P.producer[g->stmts[s].out] = (int)s;
    P.grp[s] = s;
    P.anchor[s] = g->stmts[s].red != NF_RED_NONE ? (int)s : -1;
    if ((rc = mark_reads(g->stmts[s].rhs, P.reads + (size_t)s * nt, nt)) != NF_OK) goto done;
    P.first[s] = P.last[s] = s;
    P.next[s] = UINT32_MAX;
  }
  /* readers of each statement's result (CSR) */
  for (uint32_t s = 0; s < n; s++)
    for (uint32_t t = 0; t < nt; t++)
      if (P.reads[(size_t)s * nt + t] && P.producer[t] >= 0) P.succ_at[P.producer[t] + 1]++;
  for (uint32_t s = 0; s < n; s++) P.succ_at[s + 1] += P.succ_at[s];
  P.succ = malloc(((size_t)P.succ_at[n] + 1) * sizeof *P.succ);
  if (!P.succ) {
    rc = NF_ENOMEM;
    goto done;
  }
  {
    uint32_t *fill = members; /* scratch: n entries */
    for (uint32_t s = 0; s < n; s++) fill[s] = P.succ_at[s];
    for (uint32_t s = 0; s < n; s++)
      for (uint32_t t = 0; t < nt; t++)
        if (P.reads[(size_t)s * nt + t] && P.producer[t] >= 0) P.succ[fill[P.producer[t]]++] = s;
  }
  /* 1. epilogues: a light statement joins the anchored group it reads */
  for (uint32_t s = 0; s < n; s++) {
    if (g->stmts[s].red != NF_RED_NONE) continue;
    for (uint32_t t = 0; t < nt; t++) {
      int q = P.producer[t];
      if (!P.reads[(size_t)s * nt + t] || q < 0) continue;
      if (P.anchor[find(&P, (uint32_t)q)] < 0 || P.anchor[find(&P, s)] >= 0) continue;
      if (try_merge(&P, (uint32_t)q, s, seen, stack)) break;
    }
  }
  /* 2. inlining: a light local read only inside one anchored group */
  for (uint32_t k = n; k-- > 0;) {
    const nf_stmt *st = &g->stmts[k];
    if (st->red != NF_RED_NONE || P.anchor[find(&P, k)] >= 0) continue;
    if (g->tensors[st->out].kind != NF_T_LOCAL) continue;
    int target = -1, ok = 1;
    for (uint32_t s = 0; s < n && ok; s++) {
      if (!P.reads[(size_t)s * nt + st->out]) continue;
      int gs = (int)find(&P, s);
      if (target < 0) target = gs;
      else if (target != gs) ok = 0;
    }
    if (ok && target >= 0 && P.anchor[target] >= 0) try_merge(&P, (uint32_t)target, k, seen, stack);
  }
  /* 3. the light statements left group together, in order */
  int last_light = -1;
  for (uint32_t s = 0; s < n; s++) {
    if (P.anchor[find(&P, s)] >= 0) continue;
    if (last_light >= 0) try_merge(&P, (uint32_t)last_light, s, seen, stack);
    last_light = (int)s;
  }
  /* groups in topological order (Kahn over representatives) */
  p->group_of = malloc((n ? n : 1) * sizeof *p->group_of);
  uint32_t *order = malloc((n ? n : 1) * sizeof *order);
  uint32_t *indeg = calloc(n ? n : 1, sizeof *indeg);
  uint8_t *edge = calloc((size_t)(n ? n : 1) * (n ? n : 1), 1);
  if (!p->group_of || !order || !indeg || !edge) {
    free(order);
    free(indeg);
    free(edge);
    rc = NF_ENOMEM;
    goto done;
  }
  uint32_t n_groups = 0;
  for (uint32_t s = 0; s < n; s++)
    if (find(&P, s) == s) n_groups++;
  for (uint32_t s = 0; s < n; s++)
    for (uint32_t t = 0; t < nt; t++) {
      int q = P.producer[t];
      if (!P.reads[(size_t)s * nt + t] || q < 0) continue;
      uint32_t a = find(&P, (uint32_t)q), b = find(&P, s);
      if (a != b && !edge[(size_t)a * n + b]) {
        edge[(size_t)a * n + b] = 1;
        indeg[b]++;
      }
    }
  uint32_t n_order = 0;
  uint8_t *done_g = seen;
  memset(done_g, 0, n);
  while (n_order < n_groups) {
    uint32_t pick = UINT32_MAX;
    for (uint32_t r = 0; r < n && pick == UINT32_MAX; r++)
      if (find(&P, r) == r && !done_g[r] && indeg[r] == 0) pick = r;
    NF_ASSERT(pick != UINT32_MAX); /* the merges keep the group graph acyclic */
    done_g[pick] = 1;
    order[n_order++] = pick;
    for (uint32_t b = 0; b < n; b++)
      if (edge[(size_t)pick * n + b]) indeg[b]--;
  }
  free(indeg);
  free(edge);
  p->sub = calloc(n_groups ? n_groups : 1, sizeof *p->sub);
  if (!p->sub) {
    free(order);
    rc = NF_ENOMEM;
    goto done;
  }
  p->n = n_groups;
  for (uint32_t i = 0; i < n_groups && rc == NF_OK; i++) {
    nf_subgraph *sg = &p->sub[i];
    uint32_t n_members = 0;
    for (uint32_t s = 0; s < n; s++)
      if (find(&P, s) == order[i]) {
        members[n_members++] = s;
        p->group_of[s] = i;
      }
    /* an output when the parent returns it or another group reads it */
    for (uint32_t k = 0; k < n_members; k++) {
      uint32_t t = g->stmts[members[k]].out;
      is_out[t] = g->tensors[t].kind == NF_T_OUTPUT;
      for (uint32_t s = 0; s < n && !is_out[t]; s++)
        is_out[t] = P.reads[(size_t)s * nt + t] && find(&P, s) != order[i];
    }
    rc = nf_graph_extract(g, members, n_members, is_out, sg);
    sg->anchor = P.anchor[order[i]];
  }
  free(order);
done:
  free(P.producer);
  free(P.reads);
  free(P.grp);
  free(P.anchor);
  free(seen);
  free(stack);
  free(is_out);
  free(members);
  free(P.succ_at);
  free(P.succ);
  free(P.first);
  free(P.next);
  free(P.last);
  free(P.stamp);
  if (rc != NF_OK) {
    nf_partition_free(p);
    if (rc == NF_ENOMEM) nf_buf_printf(err, "partition: out of memory");
    return rc;
  }
  *out = p;
  return NF_OK;
}

void nf_partition_free(nf_partition *p) {
  if (!p) return;
  for (uint32_t i = 0; i < p->n && p->sub; i++) nf_subgraph_clear(&p->sub[i]);
  free(p->sub);
  free(p->group_of);
  free(p);
}
