/* session.c - models, sessions and the step program (session_int.h).
 *
 * Building a session: the forward graph (a def, or a net's generated def)
 * is cut down to what its loss needs, differentiated with respect to the
 * parameters (nf_grad, forward outputs kept), and followed by the
 * optimizer's update (lib/optim.nf) over the parameters laid out in one
 * flat vector.  Both graphs are partitioned; each subgraph becomes an op
 * that reads and writes slots: fed inputs, views into the flat parameter
 * and gradient vectors, the loss, and temporaries placed in one arena by
 * the static planner (nf_plan.h).  Ops with equal keys share one kernel
 * entry (nf__kent), so a repeated block is compiled and swapped once.
 *
 * Running a step: each op runs its entry's compiled kernel when one has
 * been verified, else tier 0 (OpenBLAS for matmul-shaped subgraphs, the
 * interpreter otherwise).  A kernel handed over by the link thread is a
 * candidate: its first run is checked against what it replaces (tier 0
 * for the entry's first compiled kernel, the verified kernel after that)
 * on the step's real data, and it is used only from then on. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nf_autodiff.h"
#include "nf_interp.h"
#include "nf_npy.h"
#include "nf_plan.h"
#include "nf_stack.h"
#include "session_int.h"
#include "nf_env.h"

#define ALIGN_ELEMS 16 /* each parameter starts on a 64-byte boundary */
#define NF_COLD_WAIT_MS 60000.0 /* maybe_wait */

static char *dup_err(const char *what, const char *msg) {
  size_t n = strlen(what) + strlen(msg) + 3;
  char *e = malloc(n);
  if (e) snprintf(e, n, "%s%s%s", what, *what && *msg ? ": " : "", msg);
  return e;
}

static void set_err(char **err, const char *what, const char *msg) {
  if (err) *err = dup_err(what, msg);
}

/* ---- models ---- */

static nf_model *model_load(const char *path, const char *name, const char *text, char **err) {
  if (err) *err = NULL;
  nf_model *m = calloc(1, sizeof *m);
  nf_diag *d = nf_diag_new();
  if (!m || !d || !(m->mod = nf_module_new())) {
    set_err(err, "", "out of memory");
    goto fail;
  }
  int rc = path ? nf_module_load_file(m->mod, path, d)
                : nf_module_load_source(m->mod, name, text, d);
  if (rc != NF_OK) {
    set_err(err, "", nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
    goto fail;
  }
  nf_diag_free(d);
  return m;
fail:
  nf_diag_free(d);
  nf_model_free(m);
  return NULL;
}

nf_model *nf_model_load(const char *path, char **err) {
  if (!path) {
    set_err(err, "", "no file given");
    return NULL;
  }
  return model_load(path, NULL, NULL, err);
}

nf_model *nf_model_load_source(const char *name, const char *text, char **err) {
  if (!text) {
    set_err(err, "", "no text given");
    return NULL;
  }
  return model_load(NULL, name ? name : "<source>", text, err);
}

void nf_model_free(nf_model *m) {
  if (!m) return;
  nf_module_free(m->mod);
  free(m);
}

/* ---- building ---- */

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

static int named_add(nf__named **arr, int *n, const char *name, int slot) {
  nf__named *na = realloc(*arr, (size_t)(*n + 1) * sizeof *na);
  if (!na) return NF_ENOMEM;
  *arr = na;
  na[*n].name = strdup(name);
  na[*n].slot = slot;
  if (!na[*n].name) return NF_ENOMEM;
  (*n)++;
  return NF_OK;
}

static int find_named(const nf__named *arr, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(arr[i].name, name)) return arr[i].slot;
  return -1;
}

static int find_param(const nf_session *s, const char *name) {
  for (int i = 0; i < s->n_params; i++)
    if (!strcmp(s->params[i].name, name)) return i;
  return -1;
}

static int kent_for(nf_session *s, const nf_subgraph *sg, int alias) {
  for (int i = 0; i < s->n_kents; i++)
    if (!memcmp(s->kents[i].key, sg->key, 32) && s->kents[i].alias == alias) {
      s->kents[i].n_ops++;
      return i;
    }
  nf__kent *nk = realloc(s->kents, (size_t)(s->n_kents + 1) * sizeof *nk);
  if (!nk) return NF_ENOMEM;
  s->kents = nk;
  nf__kent *k = &s->kents[s->n_kents];
  memset(k, 0, sizeof *k);
  memcpy(k->key, sg->key, 32);
  k->g = sg->g;
  k->n_ops = 1;
  k->alias = alias;
  for (uint32_t i = 0; i < sg->g->n_stmts; i++) k->flops += nf_stmt_flops(sg->g, i);
  nf_buf e = NF_BUF_INIT;
  int rc = alias ? NF_OK : nf_gemm_prepare(sg->g, &k->gemm, &e);
  nf_buf_free(&e);
  if (rc != NF_OK) return rc;
  k->gather_in = k->gemm ? nf_gemm_gather_input(k->gemm) : -1;
  k->gather_peer = -1;
  for (int i = 0; k->gather_in >= 0 && i < s->n_kents; i++) {
    nf__kent *o = &s->kents[i];
    if (o->gather_in < 0 || !nf_gemm_gather_same(o->gemm, k->gemm)) continue;
    if (k->gather_peer < 0) k->gather_peer = i;
    if (o->gather_peer < 0) o->gather_peer = s->n_kents;
  }
  return s->n_kents++;
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

static int is_f_input(const nf_graph *F, const char *name) {
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

static int build(nf_session *s, const nf_graph *F, int n_gin, const char *const *gin,
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
    int pi = find_param(s, tn->name), is_seed = 0;
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
      if (!is_f_input(F, tn->name)) is_seed = 1; /* d<output>: 1 for the loss, else 0 */
    }
    int sl = slot_new(s, tn, ptr);
    if (sl < 0) {
      if (pi < 0) free(ptr);
      rc = sl;
      break;
    }
    if (pi < 0) {
      s->slots[sl].shape[7] = -1; /* owned: freed with the session (rank < 8 here) */
      if (!is_seed) rc = named_add(&s->inputs, &s->n_inputs, tn->name, sl);
    }
    tslot[t] = sl;
  }
  for (uint32_t k = 0; rc == NF_OK && k < T->n_outputs; k++) {
    uint32_t t = T->outputs[k];
    const nf_tensor *tn = &T->tensors[t];
    void *ptr = NULL;
    int pi = strncmp(tn->name, "grad_", 5) ? -1 : find_param(s, tn->name + 5);
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
      if ((rc = named_add(&s->named, &s->n_named, "loss", sl))) break;
    }
    rc = named_add(&s->named, &s->n_named, tn->name, sl);
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
  /* plan the temporaries */
  if (rc == NF_OK) {
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
  }
  for (int i = 0; rc == NF_OK && i < s->n_ops; i++) {
    nf__op *op = &s->ops[i];
    for (uint32_t j = 0; j < op->n_in + op->n_out; j++) op->bufs[j] = s->slots[op->slots[j]].ptr;
  }
  free(tslot);
  free(uslot);
  free(first);
  free(last);
  return rc;
}

/* ---- sessions ---- */

static nf_session *session_alloc(const nf_session_opts *o) {
  nf_session *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (o) s->opts = *o;
  s->opts.inames = NULL;
  s->opts.ivalues = NULL;
  s->opts.shape_names = NULL;
  s->opts.shape_ranks = NULL;
  s->opts.shape_dims = NULL;
  s->opts.n_iparams = s->opts.n_shapes = 0;
  nf__slog_init(&s->log, s->opts.log, s->opts.log_user, s->opts.quiet);
  nf_optimizer *op = &s->opts.optim;
  if (op->lr <= 0) op->lr = op->kind == NF_OPTIM_SGD ? 0.01 : 0.001;
  if (op->beta1 <= 0) op->beta1 = 0.9;
  if (op->beta2 <= 0) op->beta2 = 0.999;
  if (op->eps <= 0) op->eps = 1e-8;
  if (op->kind == NF_OPTIM_ADAMW && op->weight_decay == 0) op->weight_decay = 0.01;
  s->daemon_addr = o && o->daemon ? strdup(o->daemon) : NULL;
  s->opts.daemon = s->daemon_addr;
  s->device = o && o->device ? strdup(o->device) : NULL;
  s->opts.device = s->device;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->ctx = nf_ir_ctx_new();
  s->t_start = nf_now_ms();
  s->interp_rate = 2e5; /* flops per ms before anything is measured */
  s->first_wait_left = 1000;
  s->cold_wait_left = NF_COLD_WAIT_MS;
  s->loss_slot = -1;
  s->daemon_key = o && o->daemon_key ? strdup(o->daemon_key) : NULL;
  s->opts.daemon_key = s->daemon_key;
  s->opts.trust = NULL;
  s->opts.n_trust = 0;
  if (!s->ctx || (o && o->daemon && !s->daemon_addr) || (o && o->device && !s->device) ||
      (o && o->daemon_key && !s->daemon_key)) {
    nf_session_free(s);
    return NULL;
  }
  return s;
}

/* Whom the daemon link trusts: the user's configuration, then the
 * session's own entries (opts.trust).  A bad entry of the program's is an
 * error; an unsafe configuration file only keeps the daemon away (the
 * link says why). */
static int load_trust(nf_session *s, const nf_session_opts *o, nf_buf *err) {
  nf_buf why = NF_BUF_INIT;
  if (nf_trust_load(&s->trust, &why) != NF_OK) {
    nf__slog_warn(&s->log, "%s; not using a daemon (training on fallback kernels)",
                     nf_buf_str(&why));
    memset(&s->trust, 0, sizeof s->trust);
    s->trust_bad = 1;
  }
  nf_buf_free(&why);
  for (int i = 0; o && i < o->n_trust; i++) {
    const char *e = o->trust ? o->trust[i] : NULL;
    int rc;
    if (e && !strncmp(e, "uid:", 4)) rc = nf_trust_add_uid(&s->trust, e + 4, err);
    else rc = nf_trust_add_key(&s->trust, e, err);
    if (rc != NF_OK) {
      nf_buf_printf(err, " (session option trust[%d])", i);
      return rc;
    }
  }
  return NF_OK;
}

/* OpenBLAS picked its generic kernels on a CPU it does not know: the
 * OpenBLAS tier (products, convolutions) then runs several times slower
 * than it could.  Said once per session that has such an entry. */
static void warn_blas_misfit(nf_session *s) {
  const char *suggest, *core = nf_gemm_blas_misfit(&suggest);
  int any = 0;
  for (int i = 0; i < s->n_kents && !any; i++) any = s->kents[i].gemm != NULL;
  if (core && any)
    nf__slog_warn(&s->log,
                     "OpenBLAS chose its generic %s kernels on this CPU (it has %s): products "
                     "at tier 0 run several times slower than they could; set "
                     "OPENBLAS_CORETYPE=%s in the environment to pick the right ones",
                     core, strcmp(suggest, "SkylakeX") ? "AVX2" : "AVX-512", suggest);
}

static int finish(nf_session *s, const nf_graph *F, int n_gin, const char *const *gin,
                  int n_extra, const char *const *extra, char **err) {
  int rc = NF_OK;
  const char *v = nf_env(NF_ENV_THREADS);
  int th = s->opts.threads > 0 ? s->opts.threads : v && atoi(v) > 0 ? atoi(v) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (th < 1) th = 1;
  if (th > 256) th = 256;
  s->threads = th;
  if ((rc = build(s, F, n_gin, gin, n_extra, extra, &s->err))) goto fail;
  for (int i = 0; i < s->n_params; i++) {
    nf__param *pr = &s->params[i];
    nf_init in = pr->init;
    if (in.fn == NF_INIT_FN_BUFFER) in.data = pr->init_data;
    if ((rc = nf__init_fill(&in, pr->rank, pr->shape, s->opts.seed, pr->name, s->P + pr->offset,
                            &s->err)))
      goto fail;
  }
  s->pool = nf_pool_new(th);
  if (!s->pool) {
    rc = NF_ENOMEM;
    goto fail;
  }
  /* OpenBLAS at one thread: nf_gemm_run splits the work over the pool */
  nf_gemm_set_threads(1);
  warn_blas_misfit(s);
  if ((rc = nf__gpu_open(s))) goto fail;
  nf__verified_load(s);
  nf__verdicts_load(s);
  if (!(s->daemon_addr && !strcmp(s->daemon_addr, "none")) && !s->trust_bad &&
      (rc = nf__dlink_start(s)))
    goto fail;
  return NF_OK;
fail:
  if (err) *err = dup_err("", s->err.len ? nf_buf_str(&s->err) : nf_strerror(rc));
  return rc;
}

static int init_from_decl(const nf_param_decl *d, nf_init *in) {
  static const nf_init_fn map[] = {
      [NF_INIT_ZEROS] = NF_INIT_FN_ZEROS, [NF_INIT_ONES] = NF_INIT_FN_ONES,
      [NF_INIT_CONSTANT] = NF_INIT_FN_CONSTANT, [NF_INIT_UNIFORM] = NF_INIT_FN_UNIFORM,
      [NF_INIT_NORMAL] = NF_INIT_FN_NORMAL, [NF_INIT_XAVIER_UNIFORM] = NF_INIT_FN_XAVIER_UNIFORM,
      [NF_INIT_XAVIER_NORMAL] = NF_INIT_FN_XAVIER_NORMAL,
      [NF_INIT_KAIMING_UNIFORM] = NF_INIT_FN_KAIMING_UNIFORM,
      [NF_INIT_KAIMING_NORMAL] = NF_INIT_FN_KAIMING_NORMAL};
  if ((unsigned)d->init >= sizeof map / sizeof map[0]) return NF_EINVAL;
  memset(in, 0, sizeof *in);
  in->fn = map[d->init];
  in->a = d->a;
  in->b = d->b;
  return NF_OK;
}

/* Parameters from def's `param` declarations in m. */
static int params_from_decls(nf_session *s, nf_model *m, const char *def, char **err) {
  int n = nf_module_def_param_decls(m->mod, def, NULL, 0);
  if (n < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "no def '%s' in the model", def);
    set_err(err, "", msg);
    return NF_ENOENT;
  }
  nf_param_decl *pd = calloc((size_t)n + 1, sizeof *pd);
  s->params = calloc((size_t)n + 1, sizeof *s->params);
  if (!pd || !s->params) {
    free(pd);
    set_err(err, "", "out of memory");
    return NF_ENOMEM;
  }
  nf_module_def_param_decls(m->mod, def, pd, n);
  for (int i = 0; i < n; i++) {
    s->params[i].name = strdup(pd[i].name);
    init_from_decl(&pd[i], &s->params[i].init);
    s->n_params++;
    if (!s->params[i].name) {
      free(pd);
      set_err(err, "", "out of memory");
      return NF_ENOMEM;
    }
  }
  free(pd);
  return NF_OK;
}

/* Inputs of F trained as parameters (opts.trainable). */
static int add_trainable(nf_session *s, const nf_graph *F, int n, const char *const *names,
                         char **err) {
  if (n <= 0) return NF_OK;
  nf__param *np = realloc(s->params, sizeof *np * (size_t)(s->n_params + n + 1));
  if (!np) return NF_ENOMEM;
  s->params = np;
  for (int i = 0; i < n; i++) {
    char msg[600];
    if (!names || !names[i] || !is_f_input(F, names[i]) || find_param(s, names[i]) >= 0) {
      snprintf(msg, sizeof msg, "cannot train '%s': %s", names && names[i] ? names[i] : "(null)",
               names && names[i] && find_param(s, names[i]) >= 0 ? "it is a parameter already"
                                                                : "not an input of the def");
      set_err(err, "", msg);
      return NF_EINVAL;
    }
    nf__param *p = &s->params[s->n_params];
    memset(p, 0, sizeof *p);
    p->name = strdup(names[i]);
    if (!p->name) return NF_ENOMEM;
    p->init.fn = NF_INIT_FN_KAIMING_UNIFORM;
    p->init.a = sqrt(5.0);
    s->n_params++;
  }
  return NF_OK;
}

nf_session *nf__session_new_graph(nf_model *m, nf_graph *F, nf_ir_ctx *ctx,
                                  const nf_session_opts *o, int n_gin, const char *const *gin,
                                  int n_extra, const char *const *extra, char **err) {
  if (err) *err = NULL;
  nf_session *s = session_alloc(o);
  if (!s) {
    nf_ir_ctx_free(ctx);
    set_err(err, "", "out of memory");
    return NULL;
  }
  nf_ir_ctx_free(s->ctx);
  s->ctx = ctx;
  if (load_trust(s, o, &s->err) != NF_OK) {
    set_err(err, "", nf_buf_str(&s->err));
    nf_session_free(s);
    return NULL;
  }
  if (params_from_decls(s, m, F->name, err) != NF_OK ||
      (o && add_trainable(s, F, o->n_trainable, o->trainable, err) != NF_OK) ||
      finish(s, F, n_gin, gin, n_extra, extra, err) != NF_OK) {
    nf_session_free(s);
    return NULL;
  }
  return s;
}

/* F with its outputs after the first (the loss) kept readable but out of
 * the gradient: each becomes a local, and a new output of the same name
 * reads it through stop_gradient, so training computes its value and no
 * adjoint for it.  The new outputs' names go to extra (n of them). */
static nf_graph *stop_extra_outputs(const nf_graph *F, nf_ir_ctx *ctx, const char ***extra,
                                    int *n) {
  *extra = NULL;
  *n = 0;
  if (F->n_outputs <= 1) return (nf_graph *)F;
  nf_graph *g = nf_graph_new(ctx, F->name);
  const char **names = calloc(F->n_outputs, sizeof *names);
  if (!g || !names) {
    free(names);
    return NULL;
  }
  for (uint32_t t = 0; t < F->n_tensors; t++) {
    const nf_tensor *tn = &F->tensors[t];
    int kind = tn->kind;
    if (kind == NF_T_OUTPUT && t != F->outputs[0]) kind = NF_T_LOCAL;
    if (nf_graph_add_tensor(g, tn->name, (nf_dtype)tn->dtype, (nf_tkind)kind, tn->rank,
                            tn->shape) != (int)t) {
      free(names);
      return NULL;
    }
  }
  for (uint32_t i = 0; i < F->n_stmts; i++)
    if (nf_graph_add_stmt(g, &F->stmts[i]) != NF_OK) {
      free(names);
      return NULL;
    }
  for (uint32_t k = 1; k < F->n_outputs; k++) {
    uint32_t o = F->outputs[k];
    const nf_tensor *tn = &F->tensors[o];
    int id = nf_graph_add_tensor(g, tn->name, (nf_dtype)tn->dtype, NF_T_OUTPUT, tn->rank, tn->shape);
    const nf_expr *idx[NF_MAX_RANK];
    for (int r = 0; r < tn->rank; r++) idx[r] = nf_e_var(ctx, (uint32_t)r);
    const nf_expr *rhs = nf_e_unary(ctx, NF_OP_STOPGRAD,
                                    nf_e_access(ctx, o, (nf_dtype)tn->dtype, tn->rank, idx));
    nf_stmt st;
    memset(&st, 0, sizeof st);
    st.out = (uint32_t)id;
    st.red = NF_RED_NONE;
    st.rhs = rhs;
    if (id < 0 || !rhs || nf_graph_add_stmt(g, &st) != NF_OK) {
      free(names);
      return NULL;
    }
    names[(*n)++] = tn->name;
  }
  *extra = names;
  return g;
}

nf_session *nf_session_new_def(nf_model *m, const char *def, const nf_session_opts *o,
                               char **err) {
  if (err) *err = NULL;
  if (!m || !def) {
    set_err(err, "", "no model or def given");
    return NULL;
  }
  if (nf_module_def_param_decls(m->mod, def, NULL, 0) < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "no def '%s' in the model", def);
    set_err(err, "", msg);
    return NULL;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) {
    set_err(err, "", "out of memory");
    return NULL;
  }
  nf_arg_shape *sh = o && o->n_shapes > 0 ? calloc((size_t)o->n_shapes, sizeof *sh) : NULL;
  for (int i = 0; sh && i < o->n_shapes; i++) {
    sh[i].name = o->shape_names[i];
    sh[i].rank = o->shape_ranks[i] > 8 ? 8 : o->shape_ranks[i] < 0 ? 0 : o->shape_ranks[i];
    for (int r = 0; r < sh[i].rank; r++) sh[i].dims[r] = o->shape_dims[i][r];
  }
  nf_inst_opts io = {.n_shapes = sh ? o->n_shapes : 0, .shapes = sh,
                     .n_params = o ? o->n_iparams : 0, .param_names = o ? o->inames : NULL,
                     .param_values = o ? o->ivalues : NULL};
  nf_diag *d = nf_diag_new();
  nf_graph *F = NULL;
  int rc = d ? nf_module_instantiate(m->mod, def, &io, ctx, &F, d) : NF_ENOMEM;
  free(sh);
  if (rc != NF_OK) {
    set_err(err, "", d && nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
    nf_diag_free(d);
    nf_ir_ctx_free(ctx);
    return NULL;
  }
  nf_diag_free(d);
  const char **extra = NULL;
  int n_extra = 0;
  nf_graph *G = stop_extra_outputs(F, ctx, &extra, &n_extra);
  if (!G) {
    set_err(err, "", "out of memory");
    nf_ir_ctx_free(ctx);
    return NULL;
  }
  nf_session *s = nf__session_new_graph(m, G, ctx, o, 0, NULL, n_extra, extra, err);
  free(extra);
  return s;
}

void nf_session_free(nf_session *s) {
  if (!s) return;
  nf__dlink_stop(s);
  nf__gpu_close(s);
  for (int i = 0; i < s->n_kents; i++) {
    nf__kent *k = &s->kents[i];
    free(k->in_bun);
    nf_gemm_free(k->gemm);
    nf_kernel_free(k->cur);
    nf_kernel_free(k->cand);
    nf_kernel_free(k->in_k);
  }
  free(s->kents);
  for (int i = 0; i < s->n_ops; i++) {
    free(s->ops[i].slots);
    free(s->ops[i].bufs);
  }
  free(s->ops);
  free(s->fwd_slots);
  free(s->eval_op);
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].shape[7] == -1) free(s->slots[i].ptr);
  free(s->slots);
  for (int i = 0; i < s->n_inputs; i++) free(s->inputs[i].name);
  free(s->inputs);
  for (int i = 0; i < s->n_named; i++) free(s->named[i].name);
  free(s->named);
  for (int i = 0; i < s->n_params; i++) {
    free(s->params[i].name);
    free(s->params[i].init_data);
  }
  free(s->params);
  free(s->P);
  free(s->G);
  free(s->M);
  free(s->V);
  free(s->arena);
  nf_partition_free(s->part_step);
  nf_partition_free(s->part_upd);
  if (s->pool) nf_pool_free(s->pool);
  nf_ir_ctx_free(s->ctx);
  nf_buf_free(&s->err);
  nf__slog_destroy(&s->log);
  free(s->daemon_addr);
  free(s->daemon_key);
  free(s->device);
  free(s->verified_path);
  free(s->verified);
  free(s->verdicts);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

const char *nf_session_error(const nf_session *s) {
  return s && s->err.len ? s->err.data : "";
}

/* ---- running ---- */

static int run_kernel(nf_session *s, nf_kernel *kn, const nf__op *op, void *const *bufs,
                      nf_buf *err) {
  return nf_kernel_run(kn, bufs, op->n_in + op->n_out, s->pool, err);
}

/* k's candidate becomes its kernel (it passed a canary, or these bytes
 * did before).  Whether it runs instead of tier 0 is decided apart. */
static void promote(nf_session *s, nf__kent *k) {
  nf_kernel_free(k->cur); /* the handle only: the code stays loaded */
  k->cur = k->cand;
  k->cand = NULL;
  k->cur_tier = k->cand_tier;
  k->cur_ms = k->cand_ms;
  memcpy(k->cur_sha, k->cand_sha, 32);
  k->verified = 1;
  k->race_left = 0;
  k->prefer_t0 = 0;
  k->probe = 0;
  s->swaps++;
}

static const char *tier0_name(const nf__kent *k) { return k->gemm ? "OpenBLAS" : "the interpreter"; }

/* k keeps tier 0: its kernel ran kn_ms per run against tier 0's t0_ms.
 * Where that costs a step NF_SLOW_NOTICE_MS or more, it is said (once per
 * kernel) and the link asks the daemon for a faster kernel; a tiny
 * subgraph whose kernel loses by microseconds (a pool's wake-up against
 * the interpreter) is neither worth a line nor a search. */
#define NF_SLOW_NOTICE_MS 0.25
static void hold_t0(nf_session *s, nf__kent *k, double kn_ms, double t0_ms, int remembered) {
  k->prefer_t0 = 1;
  k->race_left = 0;
  k->slow_ratio = t0_ms > 0 ? kn_ms / t0_ms : 0;
  if ((kn_ms - t0_ms) * (k->n_ops > 0 ? k->n_ops : 1) < NF_SLOW_NOTICE_MS) return;
  char hex[65];
  nf_hash_hex(k->key, hex);
  hex[16] = 0;
  nf__slog_warn(&s->log, "kernel %s (tier %d) %s %.2fx slower than %s here (%.3g against %.3g ms per "
                      "run at %d thread%s): keeping %s; the daemon is asked for a faster one",
                   hex, k->cur_tier, remembered ? "ran" : "runs", k->slow_ratio, tier0_name(k),
                   kn_ms, t0_ms, s->threads, s->threads == 1 ? "" : "s", tier0_name(k));
  pthread_mutex_lock(&s->mu);
  if (!k->ask_better) {
    k->ask_better = 1;
    memcpy(k->slow_sha, k->cur_sha, 32);
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Flags for a verdict made now: BUSY while the daemon still works for
 * this session (compiling or tuning on the cores the race ran on). */
static unsigned verdict_flags(nf_session *s) {
  unsigned f = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_kents; i++)
    if (s->kents[i].dstate == DK_SUBMITTED || s->kents[i].dstate == DK_ACCEPTED)
      f = NF__VERDICT_BUSY;
  pthread_mutex_unlock(&s->mu);
  return f;
}

/* The kernel just promoted ran kn_ms in its canary, tier 0 t0_ms on the
 * same data.  A canary is one run, the kernel's first (its code and
 * scratch pages are touched for the first time, the pool wakes), often
 * while the daemon compiles on the same cores: a kernel of a few
 * microseconds was seen taking 150 ms there, as its second thread waited
 * for a core.  So a canary decides only for the kernel (noise does not
 * make a kernel look faster): by a quarter against the interpreter.
 * Otherwise, and always against OpenBLAS (whose first run is cold too),
 * the two race. */
static void judge(nf_session *s, nf__kent *k, double kn_ms, double t0_ms) {
  k->kn_ms = kn_ms;
  k->t0_ms = t0_ms;
  if (!k->gemm && kn_ms * 1.25 < t0_ms)
    nf__verdict_put(s, k->key, k->cur_sha, kn_ms, t0_ms, verdict_flags(s));
  else
    k->race_left = NF_RACE_RUNS;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The race of k's kernel against tier 0 ends after `pairs` pairs of runs:
 * the faster by median is kept (tier 0 only when clearly faster), and
 * the verdict recorded. */
static void race_end(nf_session *s, nf__kent *k, int pairs) {
  double t0 = median(k->race_ms[1], pairs), kn = median(k->race_ms[0], pairs);
  int slower = t0 < 0.97 * kn;
  k->race_left = 0;
  k->t0_ms = t0;
  k->kn_ms = kn;
  nf__verdict_put(s, k->key, k->cur_sha, kn, t0,
                  NF__VERDICT_RACED | (slower ? NF__VERDICT_SLOWER : 0) | verdict_flags(s));
  if (slower) hold_t0(s, k, kn, t0, 0);
}

/* A candidate whose very bytes passed a canary here before: swapped in
 * without one.  Its recorded verdict says whether it runs instead of tier
 * 0; without one, OpenBLAS races it, and a kernel replacing the
 * interpreter is timed on its first run against the interpreter's
 * estimated time (a race when that is not clear). */
static void promote_trusted(nf_session *s, nf__kent *k) {
  const nf__verdict *v = nf__verdict_get(s, k->key, k->cand_sha);
  promote(s, k);
  s->trusted++;
  if (v && (v->flags & (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) ==
               (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) {
    /* lost while the daemon worked beside it: raced again */
    k->race_left = NF_RACE_RUNS;
  } else if (v) {
    s->remembered++;
    k->t0_ms = v->tier0_ms;
    k->kn_ms = v->kernel_ms;
    if (v->flags & NF__VERDICT_SLOWER) hold_t0(s, k, v->kernel_ms, v->tier0_ms, 1);
  } else if (k->gemm) {
    k->race_left = NF_RACE_RUNS;
  } else {
    k->probe = 1;
  }
}

/* Runs op with k's candidate and what it replaces, compares, and promotes
 * or rejects the candidate.  The real outputs come from the reference. */
static int run_canary(nf_session *s, nf__kent *k, nf__op *op) {
  uint32_t n = op->n_in + op->n_out;
  void **cb = calloc(n, sizeof(void *));
  void **scratch = calloc(n, sizeof(void *));
  int rc = cb && scratch ? NF_OK : NF_ENOMEM;
  const nf_graph *g = op->g;
  /* candidate buffers: outputs to scratch; for an in-place op, inputs
   * copied to scratch too and outputs aliasing those copies */
  for (uint32_t j = 0; rc == NF_OK && j < n; j++) {
    const nf__slot *sl = &s->slots[op->slots[j]];
    if (j < op->n_in && !op->alias) {
      cb[j] = op->bufs[j];
      continue;
    }
    if (j >= op->n_in && op->alias) {
      for (uint32_t i = 0; i < op->n_in; i++)
        if (s->slots[op->slots[i]].ptr == sl->ptr) cb[j] = cb[i];
      if (cb[j]) continue;
    }
    scratch[j] = aligned_alloc(64, ((size_t)sl->bytes + 63) / 64 * 64 + 64);
    if (!scratch[j]) {
      rc = NF_ENOMEM;
      break;
    }
    if (j < op->n_in) memcpy(scratch[j], op->bufs[j], (size_t)sl->bytes);
    cb[j] = scratch[j];
  }
  nf_buf e = NF_BUF_INIT;
  int crc = NF_OK;
  /* the scratch outputs touched first: their page faults are not the
   * candidate's time */
  for (uint32_t j = op->n_in; rc == NF_OK && j < n; j++)
    if (scratch[j]) memset(scratch[j], 0, (size_t)s->slots[op->slots[j]].bytes);
  double c0 = nf_now_ms();
  if (rc == NF_OK) crc = run_kernel(s, k->cand, op, cb, &e);
  double c_ms = nf_now_ms() - c0;
  /* the reference, for real: what runs now (tier 0 while the entry keeps
   * it, else the verified kernel) */
  int vs_t0 = !(k->cur && k->verified && !k->prefer_t0);
  double r0 = nf_now_ms();
  if (rc == NF_OK) {
    if (!vs_t0) rc = run_kernel(s, k->cur, op, op->bufs, &s->err);
    else rc = nf__tier0_run(s, k, op, op->bufs, &s->err);
  }
  double r_ms = nf_now_ms() - r0;
  if (rc == NF_OK) {
    char hex[65];
    nf_hash_hex(k->key, hex);
    hex[16] = 0;
    double worst = 0;
    int ok = crc == NF_OK;
    for (uint32_t o = 0; ok && o < op->n_out; o++)
      ok = nf__canary_output_ok(g, o, cb[op->n_in + o], op->bufs[op->n_in + o], &worst);
    if (ok) {
      promote(s, k);
      nf__verified_add(s, k->key, k->cur_sha);
      if (vs_t0) {
        k->t0_ms = r_ms;
        judge(s, k, c_ms, r_ms);
      } else {
        /* a better kernel replacing a verified one: OpenBLAS races it
         * again; one that beats a kernel faster than the interpreter
         * is faster than the interpreter too */
        k->race_left = k->gemm ? NF_RACE_RUNS : 0;
        if (!k->gemm && k->t0_ms > 0 && c_ms < k->t0_ms) {
          k->kn_ms = c_ms;
          nf__verdict_put(s, k->key, k->cur_sha, c_ms, k->t0_ms, verdict_flags(s));
        }
      }
    } else {
      nf__slog_warn(&s->log, "kernel %s (tier %d) rejected: %s%s", hex, k->cand_tier,
                       crc != NF_OK ? "it failed: " : "its results differ from the reference",
                       crc != NF_OK ? nf_buf_str(&e) : "");
      nf_kernel_free(k->cand);
      s->rejected++;
    }
    k->cand = NULL;
  }
  nf_buf_free(&e);
  for (uint32_t j = 0; scratch && j < n; j++) free(scratch[j]);
  free(scratch);
  free(cb);
  return rc;
}

/* Whether to wait for the daemon's first kernel of k rather than run
 * tier 0 (the interpreter): only while connected and the kernel is on its
 * way, and only as long as tier 0 would take.
 *
 * A kernel verified here before is a cache hit away: worth up to 250 ms
 * even for a cheap subgraph, within one second for the whole first step.
 * A kernel never verified here pays one tier-0 run in its canary anyway;
 * waiting for it while tier 0 would take seconds (a default kernel is
 * typically a second of compiling away) spares a second one, so a cold
 * session runs such a subgraph at tier 0 once rather than twice.  The
 * waits of a session are bounded by NF_COLD_WAIT_MS in all. */
static void maybe_wait(nf_session *s, nf__kent *k) {
  if (k->cur || k->gemm || k->cand) return;
  double est = (double)k->flops * k->n_ops / s->interp_rate;
  if (est > 120000) est = 120000;
  double allow;
  int cold = !nf__verified_has(s, k->key, NULL);
  if (!cold) {
    if (est < 50) est = 0;
    double extra = s->first_wait_left < 250 ? s->first_wait_left : 250;
    allow = est > extra ? est : extra;
  } else {
    if (est < 1000) return;
    allow = est < s->cold_wait_left ? est : s->cold_wait_left;
  }
  if (allow <= 0) return;
  double start = nf_now_ms(), until = start + allow;
  pthread_mutex_lock(&s->mu);
  while (!k->in_k && ((s->connected && (k->dstate == DK_SUBMITTED || k->dstate == DK_ACCEPTED)) ||
                      (s->link_first && k->dstate == DK_NONE))) {
    double now = nf_now_ms();
    if (now >= until) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double w = until - now;
    ts.tv_sec += (time_t)(w / 1000);
    ts.tv_nsec += (long)(fmod(w, 1000) * 1e6);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  double waited = nf_now_ms() - start;
  if (cold)
    s->cold_wait_left -= waited;
  else
    s->first_wait_left -= waited > est ? waited - est : 0;
  if (k->in_k) {
    k->cand = k->in_k;
    k->cand_tier = k->in_tier;
    memcpy(k->cand_sha, k->in_sha, 32);
    k->cand_ms = k->in_ms;
    k->in_k = NULL;
  }
  pthread_mutex_unlock(&s->mu);
}

static int run_op(nf_session *s, nf__op *op) {
  nf__kent *k = &s->kents[op->kent];
  if (!k->cur && !k->cand && s->step == 0) maybe_wait(s, k);
  if (k->cand && nf__verified_has(s, k->key, k->cand_sha)) promote_trusted(s, k);
  double t0 = nf_now_ms();
  int rc;
  if (k->cand) {
    rc = run_canary(s, k, op);
  } else if (k->cur && k->race_left > 0) {
    /* tier 0 against the compiled kernel, alternating, the kernel first;
     * both are verified, so either result is the step's */
    int t0run = k->race_left % 2, i = (NF_RACE_RUNS - k->race_left) / 2;
    rc = t0run ? nf__tier0_run(s, k, op, op->bufs, &s->err)
               : run_kernel(s, k->cur, op, op->bufs, &s->err);
    k->race_ms[t0run][i] = nf_now_ms() - t0;
    k->race_left--;
    if (rc == NF_OK && t0run) {
      /* a pair done: stop after two when one side took 3x the other's
       * time in both (a slow kernel is not run a third time) */
      int far = 0;
      for (int q = 0; i >= 1 && q < 2; q++) {
        double a = k->race_ms[1][i - q], b = k->race_ms[0][i - q];
        far += a > 3 * b ? 1 : b > 3 * a ? -1 : 0;
      }
      if (k->race_left == 0 || far == 2 || far == -2) race_end(s, k, i + 1);
    }
  } else if (k->cur && !k->prefer_t0) {
    rc = run_kernel(s, k->cur, op, op->bufs, &s->err);
    if (k->probe && rc == NF_OK) {
      /* the first run of a kernel trusted without a verdict: clearly
       * faster than the interpreter's estimate, or a race */
      double kn = nf_now_ms() - t0, est = (double)k->flops / s->interp_rate;
      k->probe = 0;
      k->kn_ms = kn;
      k->t0_ms = est;
      if (kn * 4 < est)
        nf__verdict_put(s, k->key, k->cur_sha, kn, est, NF__VERDICT_ESTIMATE | verdict_flags(s));
      else
        k->race_left = NF_RACE_RUNS;
    }
  } else {
    rc = nf__tier0_run(s, k, op, op->bufs, &s->err);
    double dt = nf_now_ms() - t0;
    k->t0_ms = dt;
    if (!k->gemm && dt > 1 && k->flops > 0) {
      double r = (double)k->flops / dt;
      s->interp_rate = 0.7 * s->interp_rate + 0.3 * r;
    }
  }
  k->run_ms += nf_now_ms() - t0;
  return rc;
}

static void update_hp(nf_session *s) {
  const nf_optimizer *o = &s->opts.optim;
  double t = (double)(s->step + 1);
  if (o->kind == NF_OPTIM_SGD) {
    s->hp[0] = (float)o->lr;
    s->hp[1] = (float)o->momentum;
    s->hp[2] = (float)o->weight_decay;
  } else {
    double c1 = 1 - pow(o->beta1, t), c2 = 1 - pow(o->beta2, t);
    s->hp[0] = (float)(o->lr / c1);
    s->hp[1] = (float)(1 / sqrt(c2));
    s->hp[2] = (float)o->beta1;
    s->hp[3] = (float)o->beta2;
    s->hp[4] = (float)o->eps;
    s->hp[5] = (float)(o->kind == NF_OPTIM_ADAMW ? o->lr * o->weight_decay : o->weight_decay);
  }
}

int nf_session_step(nf_session *s, double *loss) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  double t0 = nf_now_ms();
  /* step boundary: take kernels the link handed over */
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_kents; i++) {
    nf__kent *k = &s->kents[i];
    if (!k->in_k) continue;
    nf_kernel_free(k->cand); /* superseded before its canary */
    k->cand = k->in_k;
    k->cand_tier = k->in_tier;
    memcpy(k->cand_sha, k->in_sha, 32);
    k->cand_ms = k->in_ms;
    k->in_k = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  update_hp(s);
  for (int i = 0; i < s->n_kents; i++) s->kents[i].run_ms = 0;
  s->run_seq++;
  int rc = nf__gpu_begin(s);
  if (rc == NF_OK && s->gpu)
    rc = nf__gpu_run_ops(s, NULL);
  else
    for (int i = 0; i < s->n_ops && rc == NF_OK; i++) rc = run_op(s, &s->ops[i]);
  if (rc == NF_OK) rc = nf__gpu_pull(s, s->slots[s->loss_slot].ptr, sizeof(float));
  if (rc != NF_OK) {
    if (!s->err.len) nf_buf_printf(&s->err, "step %lld failed: %s", (long long)s->step + 1,
                                   nf_strerror(rc));
    return rc;
  }
  s->step++;
  s->last_loss = *(const float *)s->slots[s->loss_slot].ptr;
  if (loss) *loss = s->last_loss;
  double now = nf_now_ms();
  s->last_ms = now - t0;
  s->ms_hist[(s->step - 1) % 10] = s->last_ms;
  if (s->step == 1) s->first_step_ms = now - s->t_start;
  pthread_mutex_lock(&s->mu);
  if (nf__gpu_timed(s)) {
    for (int i = 0; i < s->n_kents; i++) s->kents[i].share_ms = s->kents[i].run_ms;
    for (int i = 0; i < s->n_kents; i++) s->kents[i].prof_ms += s->kents[i].run_ms;
    s->prof_steps++;
  }
  pthread_mutex_unlock(&s->mu);
  return NF_OK;
}

/* The ops the forward outputs (the loss and the def's other outputs) need:
 * a backward walk over the program from their slots.  The update never is
 * one of them.  Running a subset of the ops in program order is safe with
 * the planned arena: skipping an op only removes writes. */
static int eval_mask(nf_session *s) {
  uint8_t *need = calloc((size_t)s->n_slots + 1, 1);
  s->eval_op = calloc((size_t)s->n_ops + 1, 1);
  if (!need || !s->eval_op) {
    free(need);
    free(s->eval_op);
    s->eval_op = NULL;
    return NF_ENOMEM;
  }
  for (int i = 0; i < s->n_fwd; i++) need[s->fwd_slots[i]] = 1;
  for (int i = s->n_ops - 1; i >= 0; i--) {
    const nf__op *op = &s->ops[i];
    if (op->alias) continue;
    int used = 0;
    for (uint32_t j = 0; j < op->n_out; j++) used |= need[op->slots[op->n_in + j]];
    if (!used) continue;
    s->eval_op[i] = 1;
    for (uint32_t j = 0; j < op->n_in; j++) need[op->slots[j]] = 1;
  }
  free(need);
  return NF_OK;
}

int nf_session_eval(nf_session *s, double *loss) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!s->eval_op) {
    int rc = eval_mask(s);
    if (rc != NF_OK) return rc;
  }
  s->run_seq++;
  int rc = nf__gpu_begin(s);
  if (rc == NF_OK && s->gpu)
    rc = nf__gpu_run_ops(s, s->eval_op);
  else
    for (int i = 0; i < s->n_ops && rc == NF_OK; i++)
      if (s->eval_op[i]) rc = run_op(s, &s->ops[i]);
  if (rc == NF_OK) rc = nf__gpu_pull(s, s->slots[s->loss_slot].ptr, sizeof(float));
  if (rc != NF_OK) {
    if (!s->err.len) nf_buf_printf(&s->err, "evaluation failed: %s", nf_strerror(rc));
    return rc;
  }
  if (loss) *loss = *(const float *)s->slots[s->loss_slot].ptr;
  return NF_OK;
}

/* ---- data in and out ---- */

static int named_slot(const nf_session *s, const char *name) {
  int sl = find_named(s->named, s->n_named, name);
  if (sl < 0) sl = find_named(s->inputs, s->n_inputs, name);
  return sl;
}

/* The start of a call that names a tensor and passes a buffer: clears the
 * last error; NF_EINVAL with a message when either is missing. */
static int begin_io(nf_session *s, const char *call, const char *name, const void *data) {
  nf_buf_reset(&s->err);
  if (name && data) return NF_OK;
  nf_buf_printf(&s->err, "%s: no name or no buffer", call);
  return NF_EINVAL;
}

int nf_session_feed(nf_session *s, const char *input, const void *data, size_t bytes) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_feed", input, data);
  if (rc != NF_OK) return rc;
  int sl = find_named(s->inputs, s->n_inputs, input);
  if (sl < 0) {
    nf_buf_printf(&s->err, "no input '%s' (inputs the loss does not read are not fed)", input);
    return NF_ENOENT;
  }
  if ((int64_t)bytes != s->slots[sl].bytes) {
    nf_buf_printf(&s->err, "input '%s' takes %lld bytes, not %zu", input,
                  (long long)s->slots[sl].bytes, bytes);
    return NF_EINVAL;
  }
  memcpy(s->slots[sl].ptr, data, bytes);
  return nf__gpu_push(s, s->slots[sl].ptr, bytes);
}

int nf_session_read(nf_session *s, const char *name, void *data, size_t bytes) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_read", name, data);
  if (rc != NF_OK) return rc;
  int pi = find_param(s, name);
  const void *src;
  int64_t want;
  if (pi >= 0) {
    src = s->P + s->params[pi].offset;
    want = s->params[pi].numel * 4;
  } else if (!strncmp(name, "grad_", 5) && find_param(s, name + 5) >= 0) {
    pi = find_param(s, name + 5);
    src = s->G + s->params[pi].offset;
    want = s->params[pi].numel * 4;
  } else {
    int sl = named_slot(s, name);
    if (sl < 0) {
      nf_buf_printf(&s->err, "nothing named '%s' to read", name);
      return NF_ENOENT;
    }
    src = s->slots[sl].ptr;
    want = s->slots[sl].bytes;
  }
  if ((int64_t)bytes != want) {
    nf_buf_printf(&s->err, "'%s' has %lld bytes, not %zu", name, (long long)want, bytes);
    return NF_EINVAL;
  }
  if ((rc = nf__gpu_pull(s, src, bytes)) != NF_OK) return rc;
  memcpy(data, src, bytes);
  return NF_OK;
}

int nf_session_set_param(nf_session *s, const char *name, const float *data, size_t n) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_set_param", name, data);
  if (rc != NF_OK) return rc;
  int pi = find_param(s, name);
  if (pi < 0) {
    nf_buf_printf(&s->err, "no parameter '%s'", name);
    return NF_ENOENT;
  }
  if ((int64_t)n != s->params[pi].numel) {
    nf_buf_printf(&s->err, "parameter '%s' has %lld elements, not %zu", name,
                  (long long)s->params[pi].numel, n);
    return NF_EINVAL;
  }
  memcpy(s->P + s->params[pi].offset, data, n * sizeof(float));
  return nf__gpu_push(s, s->P + s->params[pi].offset, n * sizeof(float));
}

int nf_session_set_lr(nf_session *s, double lr) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!(lr > 0) || !isfinite(lr)) {
    nf_buf_printf(&s->err, "the learning rate must be positive and finite, got %g", lr);
    return NF_EINVAL;
  }
  s->opts.optim.lr = lr;
  return NF_OK;
}

int nf_session_n_inputs(const nf_session *s) { return s ? s->n_inputs : 0; }
int nf_session_n_params(const nf_session *s) { return s ? s->n_params : 0; }

static int info(const nf__slot *sl, nf_elem *t, int *rank, int64_t dims[8]) {
  if (t) *t = (nf_elem)sl->dtype;
  if (rank) *rank = sl->rank;
  if (dims) memcpy(dims, sl->shape, sizeof(int64_t) * sl->rank);
  return NF_OK;
}

int nf_session_input_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_inputs) return NF_EINVAL;
  if (name) *name = s->inputs[i].name;
  return info(&s->slots[s->inputs[i].slot], t, rank, dims);
}

int nf_session_param_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_params) return NF_EINVAL;
  const nf__param *p = &s->params[i];
  if (name) *name = p->name;
  if (t) *t = (nf_elem)p->dtype;
  if (rank) *rank = p->rank;
  if (dims) memcpy(dims, p->shape, sizeof(int64_t) * p->rank);
  return NF_OK;
}

static int cmp_prof(const void *a, const void *b, void *arg) {
  const nf__kent *k = arg;
  double x = k[*(const int *)a].prof_ms, y = k[*(const int *)b].prof_ms;
  return x > y ? -1 : x < y;
}

void nf__session_profile(nf_session *s, FILE *f, int reset) {
  if (!reset) {
    int *ord = malloc(sizeof(int) * (size_t)(s->n_kents + 1));
    double total = 0;
    if (!ord) return;
    for (int i = 0; i < s->n_kents; i++) {
      ord[i] = i;
      total += s->kents[i].prof_ms;
    }
    qsort_r(ord, (size_t)s->n_kents, sizeof *ord, cmp_prof, s->kents);
    int64_t n = s->prof_steps ? s->prof_steps : 1;
    fprintf(f, "time per kernel entry over %lld steps (%.2f ms/step in kernels):\n",
            (long long)s->prof_steps, total / (double)n);
    fprintf(f, "  %-16s %-24s %4s %-9s %10s %6s %9s %9s %7s\n", "key", "first output", "ops",
            "runs on", "ms/step", "share", "MFLOP", "GFLOP/s", "k/tier0");
    for (int q = 0; q < s->n_kents; q++) {
      const nf__kent *k = &s->kents[ord[q]];
      char hex[65];
      nf_hash_hex(k->key, hex);
      hex[16] = 0;
      const char *first = k->g && k->g->n_outputs ? k->g->tensors[k->g->outputs[0]].name : "?";
      const char *on = k->cand || k->gcand ? "canary"
                       : (k->cur || k->gcur) && !k->prefer_t0
                       ? (k->cur_tier == 2 ? "tier 2" : k->cur_tier == 1 ? "tier 1" : "generated")
                       : s->gpu ? nf__gpu_tier0_name(s, k) : k->gemm ? "OpenBLAS" : "interp";
      double ms = k->prof_ms / (double)n;
      double fl = (double)k->flops * k->n_ops;
      char vs[16] = "-";
      if (k->kn_ms > 0 && k->t0_ms > 0) snprintf(vs, sizeof vs, "%.3g", k->kn_ms / k->t0_ms);
      fprintf(f, "  %-16s %-24.24s %4d %-9s %10.3f %5.1f%% %9.1f %9.2f %7s\n", hex, first,
              k->n_ops, on, ms, total > 0 ? 100 * k->prof_ms / total : 0.0, fl / 1e6,
              ms > 0 ? fl / ms / 1e6 : 0.0, vs);
      if (k->gemm && !strcmp(on, "OpenBLAS")) fprintf(f, "  %16s %s\n", "", nf_gemm_describe(k->gemm));
    }
    free(ord);
  }
  for (int i = 0; i < s->n_kents; i++) s->kents[i].prof_ms = 0;
  s->prof_steps = 0;
}

int nf_session_n_outputs(const nf_session *s) { return s ? s->n_fwd : 0; }

int nf_session_output_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                           int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_fwd) return NF_EINVAL;
  int sl = s->fwd_slots[i];
  if (name) {
    *name = NULL;
    for (int k = 0; k < s->n_named; k++)
      if (s->named[k].slot == sl && strcmp(s->named[k].name, "loss")) *name = s->named[k].name;
    if (!*name) *name = "loss";
  }
  return info(&s->slots[sl], t, rank, dims);
}

int nf_session_stats_get(const nf_session *s, nf_session_stats *st) {
  if (!s || !st) return NF_EINVAL;
  memset(st, 0, sizeof *st);
  st->step = s->step;
  st->loss = s->last_loss;
  st->ms = s->last_ms;
  int n = s->step < 10 ? (int)s->step : 10;
  for (int i = 0; i < n; i++) st->ms_avg += s->ms_hist[i] / n;
  st->kernels = s->n_kents;
  nf_session *ms = (nf_session *)s;
  pthread_mutex_lock(&ms->mu);
  for (int i = 0; i < s->n_kents; i++) {
    const nf__kent *k = &s->kents[i];
    int cur = k->cur || k->gcur;
    if (cur && k->prefer_t0) {
      st->tier0_kept++;
      if (k->gemm || s->gpu) st->blas++, st->blas_kept++;
    } else {
      if (cur && k->cur_tier == 1) st->tier1++;
      if (cur && k->cur_tier == 2) st->tier2++;
      if (cur && k->cur_tier == 0) st->generated++;
      if (!cur && k->gemm) st->blas++;
    }
    if (k->dstate == DK_SUBMITTED || k->dstate == DK_ACCEPTED) {
      st->tuning++;
      st->trials += k->trial;
      st->trials_max += k->max_trials;
    }
  }
  st->connected = s->connected;
  st->reconnects = s->connects > 1 ? s->connects - 1 : 0;
  st->rejected = s->rejected + s->link_rejected;
  pthread_mutex_unlock(&ms->mu);
  st->swaps = s->swaps;
  st->trusted = s->trusted;
  st->remembered = s->remembered;
  st->first_step_ms = s->first_step_ms;
  st->graph_runs = nf__gpu_graph_runs(s, NULL);
  return NF_OK;
}

int nf_session_wait_kernels(nf_session *s, int timeout_ms, int want_tier) {
  if (!s) return NF_EINVAL;
  double until = nf_now_ms() + (timeout_ms > 0 ? timeout_ms : 1e12);
  pthread_mutex_lock(&s->mu);
  for (;;) {
    int done = 1;
    for (int i = 0; i < s->n_kents && done; i++) {
      const nf__kent *k = &s->kents[i];
      if (k->dstate == DK_FAILED) continue;
      if (want_tier <= 1) done = k->cur || k->cand || k->in_k || nf__gpu_has_kernel(s, k);
      else done = k->dstate == DK_FINAL;
    }
    if (!s->link_started) done = 1;
    if (done) break;
    double now = nf_now_ms();
    if (now >= until) {
      pthread_mutex_unlock(&s->mu);
      return NF_ERANGE;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double w = until - now > 200 ? 200 : until - now;
    ts.tv_nsec += (long)(w * 1e6);
    while (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  return NF_OK;
}

int nf_session_save(nf_session *s, const char *path) {
  if (!s || !path) return NF_EINVAL;
  nf_buf_reset(&s->err);
  int rc = nf__gpu_pull(s, s->P, (size_t)s->n_flat * sizeof(float));
  return rc == NF_OK ? nf__params_save(s, path) : rc;
}

int nf_session_load(nf_session *s, const char *path) {
  if (!s || !path) return NF_EINVAL;
  nf_buf_reset(&s->err);
  int rc = nf__params_load(s, path);
  return rc == NF_OK ? nf__gpu_push(s, s->P, (size_t)s->n_flat * sizeof(float)) : rc;
}
