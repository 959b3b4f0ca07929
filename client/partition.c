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
 * (nf_graph_extract, common/nf_subgraph.h).
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
    if ((rc = nf_stmt_reads(g, s, P.reads + (size_t)s * nt)) != NF_OK) goto done;
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
