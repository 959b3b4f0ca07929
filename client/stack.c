/* stack.c - per-step products summed, as one product over the steps
 * (nf_stack.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_narrow.h"
#include "nf_stack.h"

#define MAX_TERMS 64 /* terms of one sum */
#define MAX_ROLES 8  /* distinct tensors the terms' template reads */

/* One sum statement to rewrite. */
typedef struct match {
  uint32_t s;              /* the elementwise sum */
  int n;                   /* its terms */
  uint32_t d[MAX_TERMS];   /* the terms' tensors */
  uint32_t r[MAX_TERMS];   /* their producers (reductions of one form) */
  int n_roles;
  uint32_t role[MAX_ROLES];           /* the tensors r[0] reads */
  uint32_t ids[MAX_ROLES][MAX_TERMS]; /* ... and their counterparts in r[i] */
  int varies[MAX_ROLES];              /* stacked, not shared */
  uint32_t stk[MAX_ROLES];            /* the stacked tensor (new ids) */
} match;

/* The terms of an addition tree; 0 when a leaf is not an access of a
 * whole tensor at the statement's own indices (rank vars, in order). */
static int terms(const nf_expr *e, uint32_t rank, match *m) {
  if (e->op == NF_OP_ADD) return terms(e->args[0], rank, m) && terms(e->args[1], rank, m);
  if (e->op != NF_OP_ACCESS || e->n_args != rank || m->n >= MAX_TERMS) return 0;
  for (uint32_t d = 0; d < rank; d++)
    if (e->args[d]->op != NF_OP_VAR || e->args[d]->u.var != d) return 0;
  for (int i = 0; i < m->n; i++)
    if (m->d[i] == e->u.tensor) return 0; /* a term twice */
  m->d[m->n++] = e->u.tensor;
  return 1;
}

/* 1 when b has a's form, term's tensors in place of a's (recorded in m:
 * each of a's tensors stands for one tensor of b's). */
static int same_form(const nf_expr *a, const nf_expr *b, match *m, int term) {
  if (a->op != b->op || a->dtype != b->dtype || a->n_args != b->n_args) return 0;
  switch (a->op) {
  case NF_OP_CONST:
    if (memcmp(&a->u, &b->u, sizeof a->u)) return 0;
    break;
  case NF_OP_VAR:
    if (a->u.var != b->u.var) return 0;
    break;
  case NF_OP_ACCESS: {
    int k = 0;
    while (k < m->n_roles && m->role[k] != a->u.tensor) k++;
    if (k == m->n_roles) {
      if (term != 0 || k == MAX_ROLES) return 0;
      m->role[m->n_roles++] = a->u.tensor;
    }
    if (term == 0) m->ids[k][0] = a->u.tensor;
    else if (m->ids[k][term] == UINT32_MAX) m->ids[k][term] = b->u.tensor;
    else if (m->ids[k][term] != b->u.tensor) return 0;
    break;
  }
  default:
    break;
  }
  for (uint16_t i = 0; i < a->n_args; i++)
    if (!same_form(a->args[i], b->args[i], m, term)) return 0;
  return 1;
}

static int same_tensor_type(const nf_tensor *x, const nf_tensor *y) {
  return x->dtype == y->dtype && x->rank == y->rank &&
         !memcmp(x->shape, y->shape, sizeof(int64_t) * x->rank);
}

static int64_t bytes_of(const nf_tensor *t) {
  return nf_tensor_numel(t) * (int64_t)nf_dtype_size((nf_dtype)t->dtype);
}

/* Counts statement `stmt` once among the readers of each tensor e reads
 * (last[t]: the last statement counted for t, plus one). */
static void count_reads(const nf_expr *e, uint32_t stmt, uint32_t *last, uint32_t *n_readers) {
  if (e->op == NF_OP_ACCESS && last[e->u.tensor] != stmt + 1) {
    last[e->u.tensor] = stmt + 1;
    n_readers[e->u.tensor]++;
  }
  for (uint16_t i = 0; i < e->n_args; i++) count_reads(e->args[i], stmt, last, n_readers);
}

/* Statement s of g, checked as a sum to rewrite; 1 and m filled. */
static int match_sum(const nf_graph *g, uint32_t s, const int32_t *producer,
                     const uint32_t *n_readers, match *m) {
  const nf_stmt *st = &g->stmts[s];
  const nf_tensor *out = &g->tensors[st->out];
  memset(m, 0, sizeof *m);
  m->s = s;
  if (st->red != NF_RED_NONE || out->dtype != NF_F32 || st->rhs->op != NF_OP_ADD ||
      !terms(st->rhs, out->rank, m) || m->n < 2)
    return 0;
  int64_t term_bytes = 0;
  for (int i = 0; i < m->n; i++) {
    const nf_tensor *d = &g->tensors[m->d[i]];
    int32_t p = producer[m->d[i]];
    if (d->kind != NF_T_LOCAL || p < 0 || n_readers[m->d[i]] != 1 || !same_tensor_type(d, out))
      return 0;
    const nf_stmt *r = &g->stmts[p];
    if (r->red != NF_RED_SUM || r->flags || r->n_red < 1 || out->rank + r->n_red + 1 > NF_MAX_VARS)
      return 0;
    m->r[i] = (uint32_t)p;
    term_bytes += bytes_of(d);
  }
  const nf_stmt *r0 = &g->stmts[m->r[0]];
  for (int k = 0; k < MAX_ROLES; k++)
    for (int i = 0; i < MAX_TERMS; i++) m->ids[k][i] = UINT32_MAX;
  if (!same_form(r0->rhs, r0->rhs, m, 0)) return 0;
  for (int i = 1; i < m->n; i++) {
    const nf_stmt *ri = &g->stmts[m->r[i]];
    if (ri->n_red != r0->n_red ||
        memcmp(ri->red_lo, r0->red_lo, sizeof(int64_t) * r0->n_red) ||
        memcmp(ri->red_ext, r0->red_ext, sizeof(int64_t) * r0->n_red) ||
        !same_form(r0->rhs, ri->rhs, m, i))
      return 0;
  }
  /* stack the tensors that differ between terms, if the copies are no
   * larger than the per-step results they replace */
  int64_t stack_bytes = 0;
  int any = 0;
  for (int k = 0; k < m->n_roles; k++) {
    const nf_tensor *t0 = &g->tensors[m->role[k]];
    for (int i = 1; i < m->n; i++) {
      if (m->ids[k][i] == m->role[k]) continue;
      if (!same_tensor_type(&g->tensors[m->ids[k][i]], t0) || t0->rank + 1 > NF_MAX_RANK) return 0;
      m->varies[k] = 1;
    }
    if (m->varies[k]) {
      stack_bytes += bytes_of(t0) * m->n;
      any = 1;
    }
  }
  return any && stack_bytes <= term_bytes;
}

/* e with tensor ids mapped (map[t] for t, or the role's stacked tensor
 * indexed by var `step` first when m and t is a varying role of m) and,
 * when m, reduction variables >= rank shifted up by one (step takes
 * variable rank). */
static const nf_expr *rebuild(nf_ir_ctx *ctx, const nf_expr *e, const uint32_t *map,
                              const match *m, uint32_t rank) {
  if (e->op == NF_OP_VAR) return m && e->u.var >= rank ? nf_e_var(ctx, e->u.var + 1) : e;
  if (e->n_args == 0 && e->op != NF_OP_ACCESS) return e;
  const nf_expr *args[NF_MAX_RANK + 1], *a[NF_MAX_RANK + 1];
  if (e->n_args > NF_MAX_RANK + 1) return NULL; /* accesses <= rank, others <= 3 */
  int off = 0;
  uint32_t tensor = e->op == NF_OP_ACCESS ? map[e->u.tensor] : 0;
  if (e->op == NF_OP_ACCESS && m) {
    for (int k = 0; k < m->n_roles; k++)
      if (m->role[k] == e->u.tensor && m->varies[k]) {
        tensor = m->stk[k];
        args[0] = nf_e_var(ctx, rank);
        off = 1;
      }
  }
  for (uint16_t i = 0; i < e->n_args; i++) {
    a[i] = rebuild(ctx, e->args[i], map, m, rank);
    if (!a[i]) return NULL;
  }
  if (e->op == NF_OP_ACCESS) {
    if (e->n_args + off > NF_MAX_RANK + 1) return NULL;
    for (uint16_t i = 0; i < e->n_args; i++) args[off + i] = a[i];
    return nf_e_access(ctx, tensor, (nf_dtype)e->dtype, e->n_args + off, args);
  }
  return nf_e_rebuild(ctx, e, a);
}

/* X_stk(t, v..) = t == 0 ? X_0(v..) : t == 1 ? X_1(v..) : ... */
static int stack_stmt(nf_graph *ng, const nf_graph *g, const match *m, int k, const uint32_t *map) {
  nf_ir_ctx *ctx = g->ctx;
  const nf_tensor *t0 = &g->tensors[m->role[k]];
  const nf_expr *idx[NF_MAX_RANK];
  for (uint32_t d = 0; d < t0->rank; d++) idx[d] = nf_e_var(ctx, d + 1);
  const nf_expr *e = NULL;
  for (int i = m->n - 1; i >= 0; i--) {
    const nf_expr *x = nf_e_access(ctx, map[m->ids[k][i]], (nf_dtype)t0->dtype, t0->rank, idx);
    if (!x) return NF_ENOMEM;
    if (!e) {
      e = x;
      continue;
    }
    const nf_expr *c = nf_e_binary(ctx, NF_OP_EQ, nf_e_var(ctx, 0), nf_e_const_i(ctx, NF_I64, i));
    e = c ? nf_e_select(ctx, c, x, e) : NULL;
    if (!e) return NF_ENOMEM;
  }
  nf_stmt st;
  memset(&st, 0, sizeof st);
  st.out = m->stk[k];
  st.red = NF_RED_NONE;
  st.rhs = e;
  st.var_names[0] = "step";
  return nf_graph_add_stmt(ng, &st);
}

/* grad(o..) +=! the terms' template over (step, its reductions..) */
static int product_stmt(nf_graph *ng, const nf_graph *g, const match *m, const uint32_t *map) {
  const nf_stmt *r0 = &g->stmts[m->r[0]], *s = &g->stmts[m->s];
  uint32_t rank = g->tensors[s->out].rank;
  nf_stmt st;
  memset(&st, 0, sizeof st);
  st.out = map[s->out];
  st.red = NF_RED_SUM;
  st.n_red = (uint8_t)(r0->n_red + 1);
  st.red_lo[0] = 0;
  st.red_ext[0] = m->n;
  memcpy(st.red_lo + 1, r0->red_lo, sizeof(int64_t) * r0->n_red);
  memcpy(st.red_ext + 1, r0->red_ext, sizeof(int64_t) * r0->n_red);
  for (uint32_t v = 0; v < rank; v++) st.var_names[v] = r0->var_names[v];
  st.var_names[rank] = "step";
  for (uint32_t v = rank; v < rank + r0->n_red; v++) st.var_names[v + 1] = r0->var_names[v];
  st.rhs = rebuild(g->ctx, r0->rhs, map, m, rank);
  if (!st.rhs) return NF_ENOMEM;
  return nf_graph_add_stmt(ng, &st);
}

int nf_stack_sums(const nf_graph *g, nf_graph **out, int *n_done) {
  *out = NULL;
  *n_done = 0;
  uint32_t nt = g->n_tensors, ns = g->n_stmts;
  int32_t *producer = malloc(sizeof(int32_t) * (nt + 1));
  uint32_t *n_readers = calloc(nt + 1, sizeof(uint32_t));
  uint32_t *last = calloc(nt + 1, sizeof(uint32_t));
  int32_t *role_of = malloc(sizeof(int32_t) * (ns + 1)); /* stmt -> match (sum), -2 dropped */
  uint32_t *map = malloc(sizeof(uint32_t) * (nt + 1));
  uint8_t *drop = calloc(nt + 1, 1);
  match *ms = NULL;
  int n_m = 0, rc = NF_OK;
  nf_graph *ng = NULL;
  if (!producer || !n_readers || !last || !role_of || !map || !drop) {
    rc = NF_ENOMEM;
    goto done;
  }
  for (uint32_t t = 0; t < nt; t++) producer[t] = -1;
  for (uint32_t i = 0; i < ns; i++) {
    producer[g->stmts[i].out] = (int32_t)i;
    count_reads(g->stmts[i].rhs, i, last, n_readers);
    role_of[i] = -1;
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) n_readers[g->outputs[k]]++;
  for (uint32_t i = 0; i < ns; i++) {
    match m;
    if (!match_sum(g, i, producer, n_readers, &m)) continue;
    match *nm = realloc(ms, sizeof *ms * (size_t)(n_m + 1));
    if (!nm) {
      rc = NF_ENOMEM;
      goto done;
    }
    ms = nm;
    ms[n_m] = m;
    role_of[i] = n_m++;
    for (int j = 0; j < m.n; j++) {
      role_of[m.r[j]] = -2;
      drop[m.d[j]] = 1;
    }
  }
  if (n_m == 0) goto done;
  /* a term of one sum read by another's terms (sums of sums): left alone */
  for (int q = 0; q < n_m; q++)
    for (int k = 0; k < ms[q].n_roles; k++)
      for (int i = 0; i < ms[q].n; i++)
        if (drop[ms[q].ids[k][i]] || role_of[ms[q].r[i]] != -2) goto done;

  ng = nf_graph_new(g->ctx, g->name);
  if (!ng) {
    rc = NF_ENOMEM;
    goto done;
  }
  uint32_t next = 0;
  for (uint32_t t = 0; t < nt && rc >= 0; t++) {
    map[t] = UINT32_MAX;
    if (drop[t]) continue;
    const nf_tensor *x = &g->tensors[t];
    rc = nf_graph_add_tensor(ng, x->name, (nf_dtype)x->dtype, (nf_tkind)x->kind, x->rank, x->shape);
    map[t] = next++;
  }
  for (int q = 0; q < n_m && rc >= 0; q++)
    for (int k = 0; k < ms[q].n_roles && rc >= 0; k++) {
      if (!ms[q].varies[k]) continue;
      const nf_tensor *x = &g->tensors[ms[q].role[k]];
      int64_t shape[NF_MAX_RANK];
      shape[0] = ms[q].n;
      memcpy(shape + 1, x->shape, sizeof(int64_t) * x->rank);
      char name[128];
      snprintf(name, sizeof name, "%s_stk", x->name ? x->name : "t");
      rc = nf_graph_add_tensor(ng, name, (nf_dtype)x->dtype, NF_T_LOCAL, x->rank + 1, shape);
      ms[q].stk[k] = next++;
    }
  if (rc < 0) goto done;
  rc = NF_OK;
  for (uint32_t k = 0; k < g->n_inputs; k++) ng->inputs[k] = map[g->inputs[k]];
  for (uint32_t k = 0; k < g->n_outputs; k++) ng->outputs[k] = map[g->outputs[k]];
  for (uint32_t i = 0; i < ns && rc == NF_OK; i++) {
    if (role_of[i] == -2) continue;
    if (role_of[i] >= 0) {
      const match *m = &ms[role_of[i]];
      for (int k = 0; k < m->n_roles && rc == NF_OK; k++)
        if (m->varies[k]) rc = stack_stmt(ng, g, m, k, map);
      if (rc == NF_OK) rc = product_stmt(ng, g, m, map);
      continue;
    }
    nf_stmt st = g->stmts[i];
    st.out = map[st.out];
    st.rhs = rebuild(g->ctx, st.rhs, map, NULL, 0);
    rc = st.rhs ? nf_graph_add_stmt(ng, &st) : NF_ENOMEM;
  }
  if (rc == NF_OK && nf_ir_ctx_oom(g->ctx)) rc = NF_ENOMEM;
  if (rc == NF_OK && nf_graph_validate(ng, NULL) != NF_OK) {
    ng = NULL; /* a form this pass does not handle: the graph as it is */
  } else if (rc == NF_OK) {
    *out = ng;
    *n_done = n_m;
  }
done:
  free(producer);
  free(n_readers);
  free(last);
  free(role_of);
  free(map);
  free(drop);
  free(ms);
  return rc == NF_ENOMEM ? NF_ENOMEM : NF_OK;
}

int nf_rewrite_grad(nf_graph *g, nf_graph **out) {
  *out = g;
  nf_graph *r = NULL;
  int n = 0, rc = nf_stack_sums(g, &r, &n);
  if (rc != NF_OK) return rc;
  if (r) *out = r;
  rc = nf_narrow_reads(*out, &r, &n);
  if (rc != NF_OK) return rc;
  if (r) *out = r;
  rc = nf_narrow_zeros(*out, &r, &n);
  if (rc != NF_OK) return rc;
  if (r) *out = r;
  return NF_OK;
}
