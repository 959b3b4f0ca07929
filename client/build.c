/* build.c - a session's step program (session_int.h).
 *
 * The forward graph (a def, or a net's generated def) is cut down to what
 * its loss needs, differentiated with respect to the parameters (nf_grad,
 * forward outputs kept), and followed by the optimizer's update
 * (lib/optim.nf) over the parameters laid out in one flat vector.  Both
 * graphs are partitioned; each subgraph becomes an op that reads and
 * writes slots: fed inputs, views into the flat parameter and gradient
 * vectors, the loss, and temporaries placed in one arena by the static
 * planner (nf_plan.h).  Ops with equal keys share one kernel entry
 * (nf__kent), so a repeated block is compiled and swapped once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nf_arena.h"
#include "nf_autodiff.h"
#include "nf_interp.h"
#include "nf_plan.h"
#include "nf_ptrmap.h"
#include "nf_stack.h"
#include "nf_wire.h"
#include "session_int.h"

#define ALIGN_ELEMS 16 /* each parameter starts on a 64-byte boundary */

static int slot_new(nf_session *s, const nf_tensor *t, void *ptr) {
  nf__slot *ns = realloc(s->slots, (size_t)(s->n_slots + 1) * sizeof *ns);
  if (!ns) return NF_ENOMEM;
  s->slots = ns;
  nf__slot *sl = &s->slots[s->n_slots];
  memset(sl, 0, sizeof *sl);
  sl->dtype = t->dtype;
  sl->rank = t->rank;
  memcpy(sl->shape, t->shape, sizeof(int64_t) * t->rank);
  sl->bytes = nf_tensor_numel(t) * (int64_t)nf_dtype_size((nf_dtype)t->dtype);
  sl->ptr = ptr;
  return s->n_slots++;
}

int nf__session_named_add(nf__named **arr, int *n, const char *name, int slot) {
  nf__named *na = realloc(*arr, (size_t)(*n + 1) * sizeof *na);
  if (!na) return NF_ENOMEM;
  *arr = na;
  na[*n].name = strdup(name);
  na[*n].slot = slot;
  if (!na[*n].name) return NF_ENOMEM;
  (*n)++;
  return NF_OK;
}

int nf__session_find_named(const nf__named *arr, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(arr[i].name, name)) return arr[i].slot;
  return -1;
}

int nf__session_find_param(const nf_session *s, const char *name) {
  for (int i = 0; i < s->n_params; i++)
    if (!strcmp(s->params[i].name, name)) return i;
  return -1;
}

/* The name an entry's graph goes by with the daemon (its log, status)
 * and in the report: the model's graph, the entry's number and the
 * tensor its first reduction writes, else its last statement
 * ("mlp_grad#4 L.Z"), at most
 * NF_WIRE_NAME_MAX bytes, cut on a character boundary.  Names are not
 * hashed: the key is unchanged. */
static void name_entry(nf_graph *g, int index) {
  const char *base = g->name && *g->name ? g->name : "graph";
  int at = g->n_stmts ? (int)g->n_stmts - 1 : -1;
  for (uint32_t i = 0; i < g->n_stmts; i++)
    if (g->stmts[i].red != NF_RED_NONE) {
      at = (int)i;
      break;
    }
  const char *out = at >= 0 ? g->tensors[g->stmts[at].out].name : NULL;
  char label[NF_WIRE_NAME_MAX + 128];
  int n = snprintf(label, sizeof label, "%s#%d%s%s", base, index, out ? " " : "", out ? out : "");
  if (n > NF_WIRE_NAME_MAX) { /* cut before the character the limit splits */
    size_t k = NF_WIRE_NAME_MAX;
    while (k > 0 && ((unsigned char)label[k] & 0xc0) == 0x80) k--;
    label[k] = 0;
  }
  char *name = nf_arena_strdup(nf_ir_ctx_arena(g->ctx), label);
  if (name) g->name = name;
}

static int kent_for(nf_session *s, const nf_subgraph *sg, int alias) {
  for (int i = 0; i < s->kt.n_kents; i++)
    if (!memcmp(s->kt.kents[i].key, sg->key, 32) && s->kt.kents[i].alias == alias) {
      s->kt.kents[i].n_ops++;
      return i;
    }
  nf__kent *nk = realloc(s->kt.kents, (size_t)(s->kt.n_kents + 1) * sizeof *nk);
  if (!nk) return NF_ENOMEM;
  s->kt.kents = nk;
  nf__kent *k = &s->kt.kents[s->kt.n_kents];
  memset(k, 0, sizeof *k);
  memcpy(k->key, sg->key, 32);
  k->g = sg->g;
  name_entry(sg->g, s->kt.n_kents);
  k->n_ops = 1;
  k->alias = alias;
  for (uint32_t i = 0; i < sg->g->n_stmts; i++) k->flops += nf_stmt_flops(sg->g, i);
  nf_buf e = NF_BUF_INIT;
  int rc = alias ? NF_OK : nf_gemm_prepare(sg->g, &k->gemm, &e);
  nf_buf_free(&e);
  if (rc != NF_OK) return rc;
  k->gather_in = k->gemm ? nf_gemm_gather_input(k->gemm) : -1;
  k->gather_peer = -1;
  for (int i = 0; k->gather_in >= 0 && i < s->kt.n_kents; i++) {
    nf__kent *o = &s->kt.kents[i];
    if (o->gather_in < 0 || !nf_gemm_gather_same(o->gemm, k->gemm)) continue;
    if (k->gather_peer < 0) k->gather_peer = i;
    if (o->gather_peer < 0) o->gather_peer = s->kt.n_kents;
  }
  return s->kt.n_kents++;
}

/* Grows the lifetime arrays (first and last op positions per slot) to n
 * slots. */
static int grow_lives(int **first, int **last, int n) {
  int *nf = realloc(*first, sizeof(int) * (size_t)(n + 1));
  if (nf) *first = nf;
  int *nl = realloc(*last, sizeof(int) * (size_t)(n + 1));
  if (nl) *last = nl;
  return nf && nl ? NF_OK : NF_ENOMEM;
}

/* 1 when subgraph sg only copies its one input to its one output
 * (out(v..) = in(v..), same dtype and shape): a gradient handed on as it
 * is, a local returned. */
static int plain_copy(const nf_subgraph *sg) {
  const nf_graph *g = sg->g;
  if (sg->n_in != 1 || sg->n_out != 1 || g->n_stmts != 1 || g->n_inputs != 1 ||
      g->n_outputs != 1)
    return 0;
  const nf_stmt *st = &g->stmts[0];
  const nf_expr *e = st->rhs;
  const nf_tensor *to = &g->tensors[st->out], *ti = &g->tensors[g->inputs[0]];
  if (st->red != NF_RED_NONE || st->out != g->outputs[0] || e->op != NF_OP_ACCESS ||
      e->u.tensor != g->inputs[0] || to->dtype != ti->dtype || to->rank != ti->rank ||
      e->n_args != to->rank)
    return 0;
  for (uint32_t d = 0; d < to->rank; d++)
    if (to->shape[d] != ti->shape[d] || e->args[d]->op != NF_OP_VAR || e->args[d]->u.var != d)
      return 0;
  return 1;
}

/* Adds the ops of one partitioned graph.  tslot maps the parent's tensor
 * ids to slots (-1: a temporary, created here); first/last record the
 * temporaries' lifetimes in op positions. */
static int add_ops(nf_session *s, const nf_graph *parent, const nf_partition *p, int *tslot,
                   int alias, int **first, int **last) {
  for (uint32_t i = 0; i < p->n; i++) {
    const nf_subgraph *sg = &p->sub[i];
    if (!alias && plain_copy(sg)) {
      /* a temporary copied into a bound buffer (a parameter's gradient in
       * G, an output): its producer writes the buffer itself, which
       * nothing else writes, and the copy is not run */
      int a = tslot[sg->in[0]], b = tslot[sg->out[0]];
      if (a >= 0 && b >= 0 && !s->slots[a].ptr && s->slots[b].ptr &&
          s->slots[a].bytes == s->slots[b].bytes) {
        s->slots[a].ptr = s->slots[b].ptr;
        continue;
      }
    }
    nf__op *no = realloc(s->ops, (size_t)(s->n_ops + 1) * sizeof *no);
    if (!no) return NF_ENOMEM;
    s->ops = no;
    nf__op *op = &s->ops[s->n_ops];
    memset(op, 0, sizeof *op);
    int pos = s->n_ops++;
    op->g = sg->g;
    op->alias = alias;
    op->n_in = sg->n_in;
    op->n_out = sg->n_out;
    op->slots = malloc(sizeof(int) * (sg->n_in + sg->n_out + 1));
    op->bufs = malloc(sizeof(void *) * (sg->n_in + sg->n_out + 1));
    if (!op->slots || !op->bufs) return NF_ENOMEM;
    int k = kent_for(s, sg, alias);
    if (k < 0) return k;
    op->kent = k;
    for (uint32_t j = 0; j < sg->n_out; j++) {
      uint32_t t = sg->out[j];
      if (tslot[t] < 0) {
        int sl = slot_new(s, &parent->tensors[t], NULL);
        if (sl < 0) return sl;
        tslot[t] = sl;
        int grc = grow_lives(first, last, s->n_slots);
        if (grc != NF_OK) return grc;
        (*first)[sl] = pos;
        (*last)[sl] = pos;
      }
      op->slots[sg->n_in + j] = tslot[t];
    }
    for (uint32_t j = 0; j < sg->n_in; j++) {
      uint32_t t = sg->in[j];
      if (tslot[t] < 0) return NF_EINTERNAL; /* read before produced */
      op->slots[j] = tslot[t];
      if (s->slots[tslot[t]].ptr == NULL && (*last)[tslot[t]] < pos) (*last)[tslot[t]] = pos;
    }
  }
  return NF_OK;
}

/* Places the temporaries (slots without a pointer) in one arena by their
 * lifetimes first/last (op positions), then fixes every op's pointers. */
static int plan_memory(nf_session *s, const int *first, const int *last) {
  int rc = NF_OK;
  int n_tmp = 0;
  for (int i = 0; i < s->n_slots; i++) n_tmp += s->slots[i].ptr == NULL;
  nf_plan_buf *pb = calloc((size_t)n_tmp + 1, sizeof *pb);
  int *which = calloc((size_t)n_tmp + 1, sizeof(int));
  if (!pb || !which) rc = NF_ENOMEM;
  int j = 0;
  for (int i = 0; rc == NF_OK && i < s->n_slots; i++) {
    if (s->slots[i].ptr) continue;
    pb[j].bytes = s->slots[i].bytes;
    pb[j].first = first[i];
    pb[j].last = last[i];
    which[j++] = i;
  }
  int64_t total = 0;
  if (rc == NF_OK) rc = nf_plan_offsets(pb, (size_t)n_tmp, 64, &total);
  if (rc == NF_OK) {
    s->arena_bytes = total;
    s->arena = aligned_alloc(64, (size_t)(total + 64));
    if (!s->arena) rc = NF_ENOMEM;
    else memset(s->arena, 0, (size_t)(total + 64));
  }
  for (int q = 0; rc == NF_OK && q < n_tmp; q++)
    s->slots[which[q]].ptr = (char *)s->arena + pb[q].offset;
  free(pb);
  free(which);
  for (int i = 0; rc == NF_OK && i < s->n_ops; i++) {
    nf__op *op = &s->ops[i];
    for (uint32_t k = 0; k < op->n_in + op->n_out; k++) op->bufs[k] = s->slots[op->slots[k]].ptr;
  }
  return rc;
}

/* The graph of the statements of g that out (a tensor of g) and the
 * outputs named in extra need; those are its outputs. */
static int loss_only(const nf_graph *g, uint32_t out, int n_extra, const char *const *extra,
                     nf_subgraph *sg, nf_buf *err) {
  uint32_t nt = g->n_tensors;
  uint8_t *need = calloc(nt ? nt : 1, 1), *row = calloc(nt ? nt : 1, 1);
  uint8_t *is_out = calloc(nt ? nt : 1, 1);
  uint32_t *stmts = malloc(sizeof(uint32_t) * (g->n_stmts + 1));
  int rc = NF_OK;
  if (!need || !row || !is_out || !stmts) rc = NF_ENOMEM;
  uint32_t n = 0;
  if (rc == NF_OK) {
    need[out] = 1;
    is_out[out] = 1;
    for (uint32_t k = 0; k < g->n_outputs; k++)
      for (int e = 0; e < n_extra; e++)
        if (!strcmp(g->tensors[g->outputs[k]].name, extra[e])) need[g->outputs[k]] = is_out[g->outputs[k]] = 1;
    for (uint32_t i = g->n_stmts; i-- > 0;) {
      if (!need[g->stmts[i].out]) continue;
      memset(row, 0, nt);
      if ((rc = nf_stmt_reads(g, i, row))) break;
      for (uint32_t t = 0; t < nt; t++)
        if (row[t]) need[t] = 1;
      stmts[n++] = i;
    }
  }
  if (rc == NF_OK) {
    for (uint32_t a = 0, b = n ? n - 1 : 0; a < b; a++, b--) {
      uint32_t x = stmts[a];
      stmts[a] = stmts[b];
      stmts[b] = x;
    }
    rc = nf_graph_extract(g, stmts, n, is_out, sg);
    if (rc != NF_OK) nf_buf_printf(err, "cannot extract the loss's statements: %s", nf_strerror(rc));
  }
  free(need);
  free(row);
  free(is_out);
  free(stmts);
  return rc;
}

int nf__session_is_input(const nf_graph *F, const char *name) {
  for (uint32_t k = 0; k < F->n_inputs; k++)
    if (!strcmp(F->tensors[F->inputs[k]].name, name)) return 1;
  return 0;
}

static const char *optim_def(const nf_optimizer *o) {
  if (o->kind == NF_OPTIM_SGD && o->momentum == 0 && o->weight_decay == 0) return "sgd_plain";
  return o->kind == NF_OPTIM_ADAM ? "adam" : o->kind == NF_OPTIM_ADAMW ? "adamw" : "sgd";
}

/* Builds the step program for forward graph F whose params are named in
 * s->params (already filled, offsets assigned here). */
/* Cuts the subgraphs that run their product through OpenBLAS at tier 0
 * and have statements around it (an interpreted prologue or epilogue)
 * into up to three: the statements before the anchor, the anchor alone,
 * the statements after it.  The anchor then runs through OpenBLAS (or the
 * daemon's kernel, whichever the race finds faster) and the elementwise
 * pieces get compiled kernels of their own instead of the interpreter;
 * the price is a round trip through memory of the product. */
static int split_blas(const nf_graph *T, nf_partition *p) {
  uint8_t *is_out = malloc(T->n_tensors + 1), *rd = malloc(T->n_tensors + 1);
  /* the decision per key (repeated blocks share one): 1 cut, 0 not */
  uint32_t n_seen = 0;
  struct seen { uint8_t key[32]; int cut; } *seen = malloc(sizeof *seen * (p->n + 1));
  int rc = is_out && rd && seen ? NF_OK : NF_ENOMEM;
  for (uint32_t i = 0; rc == NF_OK && i < p->n; i++) {
    nf_subgraph *sg = &p->sub[i];
    if (sg->anchor < 0) continue;
    int cut = -1;
    for (uint32_t q = 0; q < n_seen && cut < 0; q++)
      if (!memcmp(seen[q].key, sg->key, 32)) cut = seen[q].cut;
    if (cut < 0) {
      nf_gemm_sub *gs = NULL;
      nf_buf e = NF_BUF_INIT;
      rc = nf_gemm_prepare(sg->g, &gs, &e);
      nf_buf_free(&e);
      if (rc == NF_ENOMEM) break;
      rc = NF_OK;
      int np = 0, ne = 0;
      if (gs) nf_gemm_stages(gs, &np, &ne);
      nf_gemm_free(gs);
      cut = np > 0 || ne > 0;
      memcpy(seen[n_seen].key, sg->key, 32);
      seen[n_seen++].cut = cut;
    }
    if (!cut) continue;
    uint32_t ap = 0;
    while (ap < sg->n_stmts && sg->stmts[ap] != (uint32_t)sg->anchor) ap++;
    if (ap == sg->n_stmts) continue;
    uint32_t lo[3] = {0, ap, ap + 1}, hi[3] = {ap, ap + 1, sg->n_stmts};
    nf_subgraph piece[3];
    int n_piece = 0;
    memset(piece, 0, sizeof piece);
    for (int q = 0; q < 3 && rc == NF_OK; q++) {
      if (lo[q] == hi[q]) continue;
      /* its outputs: what the subgraph returned, or the other pieces read */
      memset(rd, 0, T->n_tensors);
      for (uint32_t j = 0; j < sg->n_stmts && rc == NF_OK; j++)
        if (j < lo[q] || j >= hi[q]) rc = nf_stmt_reads(T, sg->stmts[j], rd);
      memset(is_out, 0, T->n_tensors);
      for (uint32_t j = lo[q]; j < hi[q]; j++) {
        uint32_t t = T->stmts[sg->stmts[j]].out;
        is_out[t] = rd[t];
      }
      for (uint32_t k = 0; k < sg->n_out; k++) is_out[sg->out[k]] = 1;
      if (rc == NF_OK) rc = nf_graph_extract(T, sg->stmts + lo[q], hi[q] - lo[q], is_out, &piece[n_piece]);
      if (rc == NF_OK) piece[n_piece++].anchor = q == 1 ? sg->anchor : -1;
    }
    if (rc != NF_OK) {
      for (int q = 0; q < n_piece; q++) nf_subgraph_clear(&piece[q]);
      break;
    }
    nf_subgraph *ns = realloc(p->sub, sizeof *ns * (p->n + (uint32_t)n_piece - 1));
    if (!ns) {
      for (int q = 0; q < n_piece; q++) nf_subgraph_clear(&piece[q]);
      rc = NF_ENOMEM;
      break;
    }
    p->sub = ns;
    nf_subgraph_clear(&p->sub[i]);
    memmove(&p->sub[i + (uint32_t)n_piece], &p->sub[i + 1], sizeof *ns * (p->n - i - 1));
    memcpy(&p->sub[i], piece, sizeof *ns * (size_t)n_piece);
    p->n += (uint32_t)n_piece - 1;
    i += (uint32_t)n_piece - 1;
  }
  /* the statements' groups, renumbered */
  for (uint32_t i = 0; rc == NF_OK && p->group_of && i < p->n; i++)
    for (uint32_t j = 0; j < p->sub[i].n_stmts; j++) p->group_of[p->sub[i].stmts[j]] = i;
  free(is_out);
  free(rd);
  free(seen);
  return rc;
}

int nf__session_build(nf_session *s, const nf_graph *F, int n_gin, const char *const *gin,
                 int n_extra, const char *const *extra, nf_buf *err) {
  int rc;
  if (F->n_outputs < 1) {
    nf_buf_printf(err, "%s has no outputs: the first output must be the scalar loss", F->name);
    return NF_EINVAL;
  }
  const nf_tensor *L = &F->tensors[F->outputs[0]];
  if (L->rank != 0 || L->dtype != NF_F32) {
    nf_buf_printf(err, "the first output of %s, '%s', must be the scalar loss (f32[]), not %s[%d dims]",
                  F->name, L->name, nf_dtype_name((nf_dtype)L->dtype), L->rank);
    return NF_EINVAL;
  }
  for (uint32_t i = 0; i < F->n_tensors; i++) {
    uint8_t t = F->tensors[i].dtype;
    if (t == NF_F16 || t == NF_BF16 || t == NF_F64) {
      nf_buf_printf(err, "tensor '%s' is %s: CPU training supports f32, i32, i64 and bool",
                    F->tensors[i].name, nf_dtype_name((nf_dtype)t));
      return NF_EUNSUPPORTED;
    }
  }
  /* parameters: flat layout */
  int64_t off = 0;
  for (int i = 0; i < s->n_params; i++) {
    nf__param *pr = &s->params[i];
    int found = 0;
    for (uint32_t k = 0; k < F->n_inputs; k++) {
      const nf_tensor *t = &F->tensors[F->inputs[k]];
      if (strcmp(t->name, pr->name)) continue;
      found = 1;
      if (t->dtype != NF_F32) {
        nf_buf_printf(err, "parameter '%s' is %s: parameters must be f32", pr->name,
                      nf_dtype_name((nf_dtype)t->dtype));
        return NF_EUNSUPPORTED;
      }
      pr->dtype = t->dtype;
      pr->rank = t->rank;
      memcpy(pr->shape, t->shape, sizeof(int64_t) * t->rank);
      pr->numel = nf_tensor_numel(t);
    }
    if (!found) {
      nf_buf_printf(err, "parameter '%s' is not an input of %s", pr->name, F->name);
      return NF_ENOENT;
    }
    pr->offset = off;
    off += (pr->numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
  }
  if (s->n_params == 0) {
    nf_buf_printf(err, "%s has no parameters to train (declare them with `param`)", F->name);
    return NF_EINVAL;
  }
  s->n_flat = off;
  size_t fb = (size_t)off * sizeof(float);
  s->P = aligned_alloc(64, fb);
  s->G = aligned_alloc(64, fb);
  s->M = aligned_alloc(64, fb);
  s->V = aligned_alloc(64, fb);
  if (!s->P || !s->G || !s->M || !s->V) return NF_ENOMEM;
  memset(s->P, 0, fb);
  memset(s->G, 0, fb);
  memset(s->M, 0, fb);
  memset(s->V, 0, fb);

  /* the loss's part, its gradient */
  nf_subgraph lo;
  memset(&lo, 0, sizeof lo);
  if ((rc = loss_only(F, F->outputs[0], n_extra, extra, &lo, err))) return rc;
  const char **wrt = malloc(sizeof(char *) * (size_t)(s->n_params + n_gin + 1));
  int n_wrt = 0;
  if (!wrt) {
    nf_subgraph_clear(&lo);
    return NF_ENOMEM;
  }
  for (int i = 0; i < s->n_params; i++) {
    int used = 0;
    for (uint32_t k = 0; k < lo.g->n_inputs; k++)
      if (!strcmp(lo.g->tensors[lo.g->inputs[k]].name, s->params[i].name)) used = 1;
    if (used) wrt[n_wrt++] = s->params[i].name;
    else nf__slog_warn(&s->log, "parameter '%s' does not affect the loss: its gradient is zero",
                          s->params[i].name);
  }
  for (int i = 0; n_wrt && i < n_gin; i++) {
    int used = 0;
    for (uint32_t k = 0; k < lo.g->n_inputs; k++)
      if (!strcmp(lo.g->tensors[lo.g->inputs[k]].name, gin[i])) used = 1;
    if (used) wrt[n_wrt++] = gin[i];
    else nf__slog_warn(&s->log, "input '%s' does not affect the loss: no gradient", gin[i]);
  }
  nf_grad_opts go = {.n_wrt = n_wrt, .wrt = wrt, .keep_outputs = 1};
  nf_graph *T = NULL;
  rc = n_wrt ? nf_grad_graph(lo.g, &go, s->ctx, &T, NULL, err) : NF_EINVAL;
  if (!n_wrt) nf_buf_printf(err, "no parameter affects the loss");
  free(wrt);
  nf_subgraph_clear(&lo);
  if (rc) return rc;
  /* per-step products summed (an unrolled recurrence's weight gradients):
   * one product over the steps; locals read in part (the gradient of a
   * concatenation with data): computed only where read */
  if ((rc = nf_rewrite_grad(T, &T))) return rc;

  /* the optimizer's update */
  nf_module *om = nf_module_new();
  nf_diag *d = nf_diag_new();
  nf_graph *U = NULL;
  if (!om || !d) rc = NF_ENOMEM;
  if (rc == NF_OK) rc = nf_module_load_source(om, "<optimizer>", "import optim\n", d);
  if (rc == NF_OK) {
    nf_arg_shape sh[4];
    const char *nm[4] = {"P", "G", "M", "V"};
    for (int i = 0; i < 4; i++) {
      memset(&sh[i], 0, sizeof sh[i]);
      sh[i].name = nm[i];
      sh[i].rank = 1;
      sh[i].dims[0] = s->n_flat;
    }
    nf_inst_opts io = {.n_shapes = s->opts.optim.kind == NF_OPTIM_SGD ? 0 : 4, .shapes = sh};
    const char *def = optim_def(&s->opts.optim);
    if (!strcmp(def, "sgd")) {
      sh[2].name = "V";
      io.n_shapes = 3;
    } else if (!strcmp(def, "sgd_plain")) {
      io.n_shapes = 2;
    }
    rc = nf_module_instantiate(om, def, &io, s->ctx, &U, d);
  }
  if (rc != NF_OK)
    nf_buf_printf(err, "the optimizer (lib/optim.nf): %s",
                  d && nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
  nf_diag_free(d);
  nf_module_free(om);
  if (rc) return rc;

  /* partition */
  if ((rc = nf_partition_graph(T, &s->part_step, err))) return rc;
  if ((rc = split_blas(T, s->part_step)) != NF_OK) return rc;
  if ((rc = nf_partition_graph(U, &s->part_upd, err))) return rc;
  if (s->part_upd->n != 1) {
    nf_buf_printf(err, "internal error: the optimizer's update is %u subgraphs, not one",
                  s->part_upd->n);
    return NF_EINTERNAL;
  }

  /* slots of the step graph's inputs and outputs */
  int *tslot = malloc(sizeof(int) * (T->n_tensors + 1));
  int *uslot = malloc(sizeof(int) * (U->n_tensors + 1));
  int *first = calloc(1, sizeof(int)), *last = calloc(1, sizeof(int));
  if (!tslot || !uslot || !first || !last) rc = NF_ENOMEM;
  for (uint32_t t = 0; rc == NF_OK && t < T->n_tensors; t++) tslot[t] = -1;
  for (uint32_t t = 0; rc == NF_OK && t < U->n_tensors; t++) uslot[t] = -1;
  char seed_name[300];
  snprintf(seed_name, sizeof seed_name, "d%s", L->name);
  for (uint32_t k = 0; rc == NF_OK && k < T->n_inputs; k++) {
    uint32_t t = T->inputs[k];
    const nf_tensor *tn = &T->tensors[t];
    int pi = nf__session_find_param(s, tn->name), is_seed = 0;
    void *ptr;
    if (pi >= 0) {
      ptr = s->P + s->params[pi].offset;
    } else {
      ptr = aligned_alloc(64, ((size_t)nf_tensor_numel(tn) * nf_dtype_size((nf_dtype)tn->dtype) + 63) / 64 * 64 + 64);
      if (!ptr) {
        rc = NF_ENOMEM;
        break;
      }
      memset(ptr, 0, (size_t)nf_tensor_numel(tn) * nf_dtype_size((nf_dtype)tn->dtype));
      if (!strcmp(tn->name, seed_name)) *(float *)ptr = 1.0f;
      if (!nf__session_is_input(F, tn->name)) is_seed = 1; /* d<output>: 1 for the loss, else 0 */
    }
    int sl = slot_new(s, tn, ptr);
    if (sl < 0) {
      if (pi < 0) free(ptr);
      rc = sl;
      break;
    }
    if (pi < 0) {
      s->slots[sl].shape[7] = -1; /* owned: freed with the session (rank < 8 here) */
      if (!is_seed) rc = nf__session_named_add(&s->inputs, &s->n_inputs, tn->name, sl);
    }
    tslot[t] = sl;
  }
  for (uint32_t k = 0; rc == NF_OK && k < T->n_outputs; k++) {
    uint32_t t = T->outputs[k];
    const nf_tensor *tn = &T->tensors[t];
    void *ptr = NULL;
    int pi = strncmp(tn->name, "grad_", 5) ? -1 : nf__session_find_param(s, tn->name + 5);
    if (pi >= 0) {
      ptr = s->G + s->params[pi].offset;
    } else {
      size_t bytes = (size_t)nf_tensor_numel(tn) * nf_dtype_size((nf_dtype)tn->dtype);
      ptr = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
      if (!ptr) {
        rc = NF_ENOMEM;
        break;
      }
      memset(ptr, 0, bytes);
    }
    int sl = slot_new(s, tn, ptr);
    if (sl < 0) {
      if (pi < 0) free(ptr);
      rc = sl;
      break;
    }
    if (pi < 0) s->slots[sl].shape[7] = -1;
    if (strncmp(tn->name, "grad_", 5)) {
      int *nf = realloc(s->fwd_slots, sizeof(int) * (size_t)(s->n_fwd + 1));
      if (!nf) {
        rc = NF_ENOMEM;
        break;
      }
      s->fwd_slots = nf;
      s->fwd_slots[s->n_fwd++] = sl;
    }
    if (k == 0) {
      s->loss_slot = sl;
      if ((rc = nf__session_named_add(&s->named, &s->n_named, "loss", sl))) break;
    }
    rc = nf__session_named_add(&s->named, &s->n_named, tn->name, sl);
    tslot[t] = sl;
  }
  /* temporaries get first/last when produced */
  if (rc == NF_OK) rc = grow_lives(&first, &last, s->n_slots);
  if (rc == NF_OK) rc = add_ops(s, T, s->part_step, tslot, 0, &first, &last);
  /* the update: in place over the flat vectors */
  for (uint32_t k = 0; rc == NF_OK && k < U->n_inputs; k++) {
    uint32_t t = U->inputs[k];
    const nf_tensor *tn = &U->tensors[t];
    void *ptr = !strcmp(tn->name, "P") ? (void *)s->P
              : !strcmp(tn->name, "G") ? (void *)s->G
              : !strcmp(tn->name, "M") ? (void *)s->M
              : !strcmp(tn->name, "V") ? (void *)s->V
              : !strcmp(tn->name, "hp") ? (void *)s->hp : NULL;
    if (!ptr) {
      rc = NF_EINTERNAL;
      break;
    }
    int sl = slot_new(s, tn, ptr);
    if (sl < 0) rc = sl;
    else uslot[t] = sl;
  }
  for (uint32_t k = 0; rc == NF_OK && k < U->n_outputs; k++) {
    uint32_t t = U->outputs[k];
    const char *nm = U->tensors[t].name; /* P2 over P, M2 over M, V2 over V */
    void *ptr = !strcmp(nm, "P2") ? (void *)s->P : !strcmp(nm, "M2") ? (void *)s->M
              : !strcmp(nm, "V2") ? (void *)s->V : NULL;
    if (!ptr) {
      rc = NF_EINTERNAL;
      break;
    }
    int sl = slot_new(s, &U->tensors[t], ptr);
    if (sl < 0) rc = sl;
    else uslot[t] = sl;
  }
  if (rc == NF_OK) rc = grow_lives(&first, &last, s->n_slots);
  if (rc == NF_OK) rc = add_ops(s, U, s->part_upd, uslot, 1, &first, &last);
  if (rc == NF_OK) rc = plan_memory(s, first, last);
  free(tslot);
  free(uslot);
  free(first);
  free(last);
  return rc;
}

/* An owned buffer of tensor t (zeroed, freed with the session) as a new
 * slot; the slot or a negative status. */
static int owned_slot(nf_session *s, const nf_tensor *t) {
  size_t bytes = (size_t)nf_tensor_numel(t) * nf_dtype_size((nf_dtype)t->dtype);
  void *ptr = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!ptr) return NF_ENOMEM;
  memset(ptr, 0, bytes);
  int sl = slot_new(s, t, ptr);
  if (sl < 0) {
    free(ptr);
    return sl;
  }
  s->slots[sl].shape[7] = -1; /* owned (rank < 8 here) */
  return sl;
}

/* ---- a function program's saved values ----
 *
 * The gradient graph of F recomputes the forward values its adjoints read
 * (copies of F's statements, first and in F's order).  A function program
 * keeps those values from the forward run instead, as PyTorch's autograd
 * saves them: the copies' results become inputs of the gradient graph
 * (each F's tensor of the same statement), and outputs of F so that its
 * partition writes them to memory that lives until the backward. */

/* e with tensor ids mapped through map (memo: node -> its image). */
static const nf_expr *remap_expr(nf_ir_ctx *ctx, const nf_expr *e, const int *map,
                                 nf_ptrmap *memo) {
  uint64_t v;
  if (nf_ptrmap_get(memo, e, &v)) return (const nf_expr *)(uintptr_t)v;
  const nf_expr *a[NF_MAX_RANK + 3];
  if (e->n_args > NF_MAX_RANK + 3) return NULL;
  int same = 1;
  for (int i = 0; i < e->n_args; i++) {
    if (!(a[i] = remap_expr(ctx, e->args[i], map, memo))) return NULL;
    same &= a[i] == e->args[i];
  }
  const nf_expr *r = e;
  if (e->op == NF_OP_ACCESS) {
    if (map[e->u.tensor] < 0) return NULL;
    r = nf_e_access(ctx, (uint32_t)map[e->u.tensor], (nf_dtype)e->dtype, e->n_args, a);
  } else if (!same) {
    r = nf_e_rebuild(ctx, e, a);
  }
  if (r && nf_ptrmap_put(memo, e, (uint64_t)(uintptr_t)r) != NF_OK) return NULL;
  return r;
}

typedef struct saved_plan {
  nf_graph *F2;   /* F with the saved locals made outputs (same tensor ids) */
  nf_graph *G2;   /* the gradient graph reading them as inputs */
  int *g2_from;   /* per G2 tensor: the F tensor it is (saved), or -1 */
  int *g2_orig;   /* per G2 tensor: its id in the gradient graph */
} saved_plan;

/* Plans the saved values of gradient graph G of F (rep: its report).
 * NF_OK with plan->G2 NULL when nothing is saved (nothing recomputed, or
 * F's names do not tell its statements apart). */
static int plan_saved(const nf_graph *F, const nf_graph *G, const nf_grad_report *rep,
                      nf_ir_ctx *ctx, saved_plan *plan) {
  memset(plan, 0, sizeof *plan);
  uint32_t nt = G->n_tensors;
  uint8_t *adj = calloc(G->n_stmts + 1, 1), *read = calloc(nt + 1, 1), *row = calloc(nt + 1, 1);
  int *from = malloc(sizeof(int) * (nt + 1)), *map = malloc(sizeof(int) * (nt + 1));
  int rc = adj && read && row && from && map ? NF_OK : NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < rep->n_items; i++) adj[rep->items[i].stmt] = 1;
  for (uint32_t t = 0; rc == NF_OK && t < nt; t++) from[t] = -1;
  /* the forward copies, matched in order to F's statements by their
   * results' names (unique among F's results, else nothing is saved) */
  int ok = rc == NF_OK, n_saved = 0;
  for (uint32_t i = 0; ok && i < F->n_stmts; i++)
    for (uint32_t j = i + 1; ok && j < F->n_stmts; j++)
      ok = strcmp(F->tensors[F->stmts[i].out].name, F->tensors[F->stmts[j].out].name) != 0;
  uint32_t fk = 0;
  for (uint32_t i = 0; ok && i < G->n_stmts; i++) {
    if (adj[i]) continue;
    const nf_tensor *gt = &G->tensors[G->stmts[i].out];
    while (fk < F->n_stmts && strcmp(F->tensors[F->stmts[fk].out].name, gt->name)) fk++;
    if (fk == F->n_stmts) {
      ok = 0;
      break;
    }
    const nf_tensor *ft = &F->tensors[F->stmts[fk].out];
    ok = ft->dtype == gt->dtype && ft->rank == gt->rank &&
         !memcmp(ft->shape, gt->shape, sizeof(int64_t) * gt->rank);
    from[G->stmts[i].out] = (int)F->stmts[fk].out;
    fk++;
  }
  /* what the adjoints read of them */
  for (uint32_t i = 0; ok && rc == NF_OK && i < G->n_stmts; i++) {
    if (!adj[i]) continue;
    memset(row, 0, nt);
    rc = nf_stmt_reads(G, i, row);
    for (uint32_t t = 0; rc == NF_OK && t < nt; t++)
      if (row[t] && from[t] >= 0) read[t] = 1;
  }
  for (uint32_t t = 0; ok && t < nt; t++) n_saved += read[t];
  if (rc != NF_OK || !ok || n_saved == 0) goto out;
  /* F2: the saved values are outputs */
  plan->F2 = nf_graph_new(ctx, F->name);
  uint8_t *save_f = calloc(F->n_tensors + 1, 1);
  if (!plan->F2 || !save_f) {
    free(save_f);
    rc = NF_ENOMEM;
    goto out;
  }
  for (uint32_t t = 0; t < nt; t++)
    if (read[t]) save_f[from[t]] = 1;
  for (uint32_t t = 0; rc == NF_OK && t < F->n_tensors; t++) {
    const nf_tensor *tn = &F->tensors[t];
    int kind = save_f[t] && tn->kind == NF_T_LOCAL ? NF_T_OUTPUT : tn->kind;
    if (nf_graph_add_tensor(plan->F2, tn->name, (nf_dtype)tn->dtype, (nf_tkind)kind, tn->rank,
                            tn->shape) != (int)t)
      rc = NF_ENOMEM;
  }
  free(save_f);
  for (uint32_t i = 0; rc == NF_OK && i < F->n_stmts; i++)
    rc = nf_graph_add_stmt(plan->F2, &F->stmts[i]);
  /* G2: G's inputs, the saved values as inputs, the adjoints' tensors */
  plan->G2 = nf_graph_new(ctx, G->name);
  plan->g2_from = malloc(sizeof(int) * (nt + 1));
  plan->g2_orig = malloc(sizeof(int) * (nt + 1));
  if (rc == NF_OK && (!plan->G2 || !plan->g2_from || !plan->g2_orig)) rc = NF_ENOMEM;
  for (uint32_t t = 0; rc == NF_OK && t < nt; t++) map[t] = -1;
  for (uint32_t t = 0; rc == NF_OK && t < nt; t++) {
    const nf_tensor *tn = &G->tensors[t];
    int kind;
    if (tn->kind == NF_T_INPUT) kind = NF_T_INPUT;
    else if (read[t]) kind = NF_T_INPUT;
    else if (from[t] >= 0) continue; /* a forward copy no adjoint reads: gone */
    else kind = tn->kind;
    int id = nf_graph_add_tensor(plan->G2, tn->name, (nf_dtype)tn->dtype, (nf_tkind)kind,
                                 tn->rank, tn->shape);
    if (id < 0) {
      rc = id;
      break;
    }
    map[t] = id;
    plan->g2_from[id] = read[t] ? from[t] : -1;
    plan->g2_orig[id] = (int)t;
  }
  nf_ptrmap memo = NF_PTRMAP_INIT;
  for (uint32_t i = 0; rc == NF_OK && i < G->n_stmts; i++) {
    if (!adj[i]) continue;
    nf_stmt st = G->stmts[i];
    st.rhs = remap_expr(ctx, st.rhs, map, &memo);
    if (!st.rhs || map[st.out] < 0) {
      rc = st.rhs || map[st.out] < 0 ? NF_EINTERNAL : NF_ENOMEM;
      break;
    }
    st.out = (uint32_t)map[st.out];
    rc = nf_graph_add_stmt(plan->G2, &st);
  }
  nf_ptrmap_free(&memo);
  if (rc == NF_OK) rc = nf_graph_validate(plan->G2, NULL);
out:
  if (rc != NF_OK || !plan->G2) {
    free(plan->g2_from);
    free(plan->g2_orig);
    memset(plan, 0, sizeof *plan);
  }
  free(adj);
  free(read);
  free(row);
  free(from);
  free(map);
  return rc == NF_ENOMEM ? rc : NF_OK;
}

int nf__session_build_fn(nf_session *s, const nf_graph *F, nf_buf *err) {
  int rc = NF_OK;
  for (uint32_t i = 0; i < F->n_tensors; i++) {
    uint8_t t = F->tensors[i].dtype;
    if (t == NF_F16 || t == NF_BF16) {
      nf_buf_printf(err, "tensor '%s' is %s: operators support f32, f64, i32, i64 and bool",
                    F->tensors[i].name, nf_dtype_name((nf_dtype)t));
      return NF_EUNSUPPORTED;
    }
    if (F->tensors[i].rank >= 8) {
      nf_buf_printf(err, "tensor '%s' has rank %d: operators take up to 7", F->tensors[i].name,
                    F->tensors[i].rank);
      return NF_ELIMIT;
    }
  }
  if (F->n_outputs < 1) {
    nf_buf_printf(err, "%s has no outputs", F->name);
    return NF_EINVAL;
  }
  const char **wrt = malloc(sizeof(char *) * (F->n_inputs + 1));
  if (!wrt) return NF_ENOMEM;
  int n_wrt = 0;
  for (uint32_t k = 0; k < F->n_inputs; k++) {
    const nf_tensor *t = &F->tensors[F->inputs[k]];
    if (nf_dtype_is_float((nf_dtype)t->dtype)) wrt[n_wrt++] = t->name;
  }
  /* the gradient graph, reading the forward's saved values where it can */
  nf_graph *Gg = NULL;
  const nf_graph *Fp = F;
  saved_plan plan;
  memset(&plan, 0, sizeof plan);
  if (n_wrt) {
    nf_grad_opts go = {.n_wrt = n_wrt, .wrt = wrt, .keep_outputs = 0};
    nf_grad_report rep;
    memset(&rep, 0, sizeof rep);
    rc = nf_grad_graph(F, &go, s->ctx, &Gg, &rep, err);
    if (rc == NF_EINVAL || rc == NF_EUNSUPPORTED) {
      /* no gradient (a float-to-integer cast on the way): the forward
       * still runs; a backward says why */
      s->fn_nograd = strdup(nf_buf_str(err));
      nf_buf_reset(err);
      Gg = NULL;
      rc = s->fn_nograd ? NF_OK : NF_ENOMEM;
    }
    if (rc == NF_OK && Gg && Gg->n_inputs != F->n_inputs + F->n_outputs) {
      nf_buf_printf(err, "internal error: the gradient graph of %s has %u inputs, not %u",
                    F->name, Gg->n_inputs, F->n_inputs + F->n_outputs);
      rc = NF_EINTERNAL;
    }
    if (rc == NF_OK && Gg) rc = plan_saved(F, Gg, &rep, s->ctx, &plan);
  }
  free(wrt);
  /* each gradient input's role, by position (the rewrites keep them):
   * >= 0 the F tensor saved, else -1 - its position among Gg's inputs */
  int *role = NULL;
  if (rc == NF_OK && Gg) {
    const nf_graph *G = plan.G2 ? plan.G2 : Gg;
    role = malloc(sizeof(int) * (G->n_inputs + 1));
    if (!role) rc = NF_ENOMEM;
    for (uint32_t k = 0; rc == NF_OK && k < G->n_inputs; k++) {
      if (!plan.G2) {
        role[k] = -1 - (int)k;
        continue;
      }
      uint32_t t = G->inputs[k];
      if (plan.g2_from[t] >= 0) {
        role[k] = plan.g2_from[t];
        continue;
      }
      int orig = plan.g2_orig[t], pos = -1;
      for (uint32_t q = 0; q < Gg->n_inputs && pos < 0; q++)
        if ((int)Gg->inputs[q] == orig) pos = (int)q;
      if (pos < 0) rc = NF_EINTERNAL;
      role[k] = -1 - pos;
    }
    if (rc == NF_OK && plan.G2) {
      Gg = plan.G2;
      Fp = plan.F2;
    }
  }
  free(plan.g2_from);
  free(plan.g2_orig);
  if (rc == NF_OK && Gg) rc = nf_rewrite_grad(Gg, &Gg);
  if (rc != NF_OK) {
    free(role);
    return rc;
  }
  if ((rc = nf_partition_graph(Fp, &s->part_step, err)) ||
      (rc = split_blas(Fp, s->part_step)) != NF_OK ||
      (Gg && (rc = nf_partition_graph(Gg, &s->part_upd, err))) ||
      (Gg && (rc = split_blas(Gg, s->part_upd)) != NF_OK)) {
    free(role);
    return rc;
  }
  s->fn_n_in = (int)F->n_inputs;
  s->fn_n_out = (int)F->n_outputs;
  s->fn_in = malloc(sizeof(int) * (F->n_inputs + 1));
  s->fn_grad = malloc(sizeof(int) * (F->n_inputs + 1));
  s->fn_out = malloc(sizeof(int) * (F->n_outputs + 1));
  s->fn_seed = malloc(sizeof(int) * (F->n_outputs + 1));
  s->fn_saved_out = calloc(F->n_outputs + 1, 1);
  int *fslot = malloc(sizeof(int) * (F->n_tensors + 1));
  int *gslot = malloc(sizeof(int) * ((Gg ? Gg->n_tensors : 0) + 1));
  int *first = calloc(1, sizeof(int)), *last = calloc(1, sizeof(int));
  if (!s->fn_in || !s->fn_grad || !s->fn_out || !s->fn_seed || !s->fn_saved_out || !fslot ||
      !gslot || !first || !last)
    rc = NF_ENOMEM;
  for (uint32_t t = 0; rc == NF_OK && t < F->n_tensors; t++) fslot[t] = -1;
  for (uint32_t t = 0; rc == NF_OK && Gg && t < Gg->n_tensors; t++) gslot[t] = -1;
  /* the forward program: inputs, outputs and saved values in owned
   * buffers (Fp has F's tensor ids) */
  for (uint32_t k = 0; rc == NF_OK && k < F->n_inputs; k++) {
    const nf_tensor *tn = &F->tensors[F->inputs[k]];
    int sl = owned_slot(s, tn);
    if (sl < 0) rc = sl;
    else rc = nf__session_named_add(&s->inputs, &s->n_inputs, tn->name, sl);
    if (rc == NF_OK) fslot[F->inputs[k]] = s->fn_in[k] = sl;
    if (rc == NF_OK) s->fn_grad[k] = -1;
  }
  for (uint32_t k = 0; rc == NF_OK && k < Fp->n_outputs; k++) {
    uint32_t t = Fp->outputs[k];
    int sl = owned_slot(s, &Fp->tensors[t]);
    if (sl < 0) rc = sl;
    else fslot[t] = sl;
  }
  for (uint32_t k = 0; rc == NF_OK && k < F->n_outputs; k++) {
    int sl = fslot[F->outputs[k]];
    rc = nf__session_named_add(&s->named, &s->n_named, F->tensors[F->outputs[k]].name, sl);
    s->fn_out[k] = sl;
    s->fn_seed[k] = -1;
  }
  if (rc == NF_OK) rc = grow_lives(&first, &last, s->n_slots);
  if (rc == NF_OK) rc = add_ops(s, Fp, s->part_step, fslot, 0, &first, &last);
  s->fn_fwd_ops = s->n_ops;
  /* the gradient program: the inputs, a seed per output, the saved
   * values; a gradient per float input */
  for (uint32_t k = 0; rc == NF_OK && Gg && k < Gg->n_inputs; k++) {
    uint32_t t = Gg->inputs[k];
    if (role[k] >= 0) {
      s->fn_n_saved++;
      gslot[t] = fslot[role[k]];
      for (uint32_t q = 0; q < F->n_outputs; q++)
        if ((int)F->outputs[q] == role[k]) s->fn_saved_out[q] = 1;
      if (gslot[t] < 0) rc = NF_EINTERNAL;
      continue;
    }
    uint32_t pos = (uint32_t)(-1 - role[k]);
    if (pos < F->n_inputs) {
      gslot[t] = s->fn_in[pos];
      continue;
    }
    int sl = owned_slot(s, &Gg->tensors[t]);
    if (sl < 0) rc = sl;
    else gslot[t] = s->fn_seed[pos - F->n_inputs] = sl;
  }
  for (uint32_t k = 0; rc == NF_OK && Gg && k < Gg->n_outputs; k++) {
    uint32_t t = Gg->outputs[k];
    const nf_tensor *tn = &Gg->tensors[t];
    int which = -1;
    for (uint32_t q = 0; q < F->n_inputs && which < 0; q++)
      if (!strncmp(tn->name, "grad_", 5) && !strcmp(F->tensors[F->inputs[q]].name, tn->name + 5))
        which = (int)q;
    if (which < 0) {
      nf_buf_printf(err, "internal error: gradient output '%s' names no input", tn->name);
      rc = NF_EINTERNAL;
      break;
    }
    int sl = owned_slot(s, tn);
    if (sl < 0) rc = sl;
    else rc = nf__session_named_add(&s->named, &s->n_named, tn->name, sl);
    if (rc == NF_OK) gslot[t] = s->fn_grad[which] = sl;
  }
  if (rc == NF_OK && Gg) rc = grow_lives(&first, &last, s->n_slots);
  if (rc == NF_OK && Gg) rc = add_ops(s, Gg, s->part_upd, gslot, 0, &first, &last);
  if (rc == NF_OK) rc = plan_memory(s, first, last);
  if (rc == NF_EINTERNAL && !err->len)
    nf_buf_printf(err, "internal error: the gradient program of %s", F->name);
  free(role);
  free(fslot);
  free(gslot);
  free(first);
  free(last);
  return rc;
}
