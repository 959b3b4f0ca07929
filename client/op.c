/* op.c - operators (neoflow.h, nf_operator): one def of a model run
 * forward and backward on the caller's buffers.
 *
 * Each combination of input shapes and element types is a specialisation:
 * the def instantiated for those shapes (in f64 when f64 tensors are given
 * to a def declared in f32), held by a session whose program is a function
 * program (build.c, nf__session_build_fn): the def's partitioned graph,
 * then its gradient graph with respect to its float inputs, which reads
 * the forward values it needs from the forward's run.  The session
 * brings everything a training session has: fallback kernels at once, the
 * daemon link, canaries, races and swaps.  A forward call runs the first
 * part's ops; a backward call the ops the asked gradients need (a mask per
 * set of gradients, computed once), after the forward's again unless the
 * program still holds the values of the forward it names (its token).  The caller's buffers stand in for
 * the program's own inputs, outputs, seeds and gradients for the length of
 * a call (lend, give_back: the slots' and the ops' pointers changed and
 * restored), where the host runs the kernels; else data is copied. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ptrmap.h"
#include "session_int.h"

#define MAX_MASKS 8 /* gradient sets remembered per specialisation */

/* forward runs of every operator (nf_operator_forward's tokens: unique in
 * the process, so another operator's token never matches) */
static _Atomic uint64_t tokens;

typedef struct gmask {
  uint64_t want; /* bit i: input i's gradient */
  uint8_t *mask;
} gmask;

typedef struct spec {
  nf_session *s;
  int promote;            /* f32 computed as f64 */
  nf_view *in;            /* n_in: elem, rank, dims (data unused) */
  nf_view *out;           /* n_out */
  uint8_t *fwd_mask;
  int n_masks;
  gmask masks[MAX_MASKS];
  uint64_t used;          /* the operator's clock when last used */
  uint64_t fwd_token;     /* the forward whose values the program holds (0: none) */
  /* the caller's buffers lent to the program for one call: the slots
   * changed and the pointers they had (lend, give_back) */
  int n_undo;
  int *undo_slot;
  void **undo_ptr;
} spec;

struct nf_operator {
  pthread_mutex_t mu;
  nf_model *m;
  char *def;
  nf_session_opts opts;   /* with the copies below */
  char **strs;            /* owned copies: daemon, device, daemon_key, trust[], inames[] */
  int n_strs;
  const char **trust, **inames;
  int64_t *ivalues;
  int n_in, n_out, n_declared;
  char **in_names, **out_names;
  spec specs[NF_OPERATOR_SPECS];
  int n_specs;
  uint64_t clock;
  nf_buf err;
};

/* ---- opening ---- */

static char *keep(nf_operator *op, const char *s) {
  if (!s) return NULL;
  char **ns = realloc(op->strs, sizeof *ns * (size_t)(op->n_strs + 1));
  if (!ns) return NULL;
  op->strs = ns;
  char *c = strdup(s);
  if (c) op->strs[op->n_strs++] = c;
  return c;
}

/* Deep copies of the options a later specialisation needs. */
static int copy_opts(nf_operator *op, const nf_session_opts *o) {
  if (o) op->opts = *o;
  nf_session_opts *c = &op->opts;
  if ((o && o->daemon && !(c->daemon = keep(op, o->daemon))) ||
      (o && o->device && !(c->device = keep(op, o->device))) ||
      (o && o->daemon_key && !(c->daemon_key = keep(op, o->daemon_key))))
    return NF_ENOMEM;
  c->n_shapes = 0;
  c->shape_names = NULL;
  c->shape_ranks = NULL;
  c->shape_dims = NULL;
  c->n_trainable = 0;
  c->trainable = NULL;
  c->trust = NULL;
  c->n_trust = 0;
  c->inames = NULL;
  c->ivalues = NULL;
  c->n_iparams = 0;
  if (o && o->n_trust > 0 && o->trust) {
    op->trust = calloc((size_t)o->n_trust, sizeof *op->trust);
    if (!op->trust) return NF_ENOMEM;
    for (int i = 0; i < o->n_trust; i++)
      if (o->trust[i] && !(op->trust[i] = keep(op, o->trust[i]))) return NF_ENOMEM;
    c->trust = op->trust;
    c->n_trust = o->n_trust;
  }
  if (o && o->n_iparams > 0 && o->inames && o->ivalues) {
    op->inames = calloc((size_t)o->n_iparams, sizeof *op->inames);
    op->ivalues = calloc((size_t)o->n_iparams, sizeof *op->ivalues);
    if (!op->inames || !op->ivalues) return NF_ENOMEM;
    for (int i = 0; i < o->n_iparams; i++) {
      if (o->inames[i] && !(op->inames[i] = keep(op, o->inames[i]))) return NF_ENOMEM;
      op->ivalues[i] = o->ivalues[i];
    }
    c->inames = op->inames;
    c->ivalues = op->ivalues;
    c->n_iparams = o->n_iparams;
  }
  return NF_OK;
}

nf_operator *nf_operator_new(nf_model *m, const char *def, const nf_session_opts *o,
                             char **err) {
  if (err) *err = NULL;
  char msg[600];
  if (!m || !def) {
    nf__session_err_set(err, "", "no model or def given");
    return NULL;
  }
  int n_decl = nf_module_def_inputs(m->mod, def, NULL, 0);
  if (n_decl < 0) {
    snprintf(msg, sizeof msg, "no def '%s' in the model", def);
    nf__session_err_set(err, "", msg);
    return NULL;
  }
  if (o && o->device && strncmp(o->device, "cpu", 3)) {
    snprintf(msg, sizeof msg,
             "device '%s': operators run on the CPU only in this version (a GPU "
             "session's operators are not done yet)", o->device);
    nf__session_err_set(err, "", msg);
    return NULL;
  }
  nf_operator *op = calloc(1, sizeof *op);
  if (!op) {
    nf__session_err_set(err, "", "out of memory");
    return NULL;
  }
  pthread_mutex_init(&op->mu, NULL);
  op->m = m;
  int n_par = nf_module_def_param_decls(m->mod, def, NULL, 0);
  int n_out = nf_module_def_outputs(m->mod, def, NULL, 0);
  op->n_declared = n_decl;
  op->n_in = n_decl + (n_par > 0 ? n_par : 0);
  op->n_out = n_out > 0 ? n_out : 0;
  const char **dn = calloc((size_t)op->n_in + 1, sizeof *dn);
  const char **on = calloc((size_t)op->n_out + 1, sizeof *on);
  nf_param_decl *pd = calloc((size_t)(n_par > 0 ? n_par : 0) + 1, sizeof *pd);
  op->in_names = calloc((size_t)op->n_in + 1, sizeof *op->in_names);
  op->out_names = calloc((size_t)op->n_out + 1, sizeof *op->out_names);
  op->def = strdup(def);
  int rc = dn && on && pd && op->in_names && op->out_names && op->def ? copy_opts(op, o)
                                                                       : NF_ENOMEM;
  if (rc == NF_OK) {
    nf_module_def_inputs(m->mod, def, dn, n_decl);
    if (n_par > 0) nf_module_def_param_decls(m->mod, def, pd, n_par);
    for (int i = 0; i < n_par; i++) dn[n_decl + i] = pd[i].name;
    nf_module_def_outputs(m->mod, def, on, op->n_out);
    for (int i = 0; i < op->n_in && rc == NF_OK; i++)
      if (!(op->in_names[i] = strdup(dn[i]))) rc = NF_ENOMEM;
    for (int i = 0; i < op->n_out && rc == NF_OK; i++)
      if (!(op->out_names[i] = strdup(on[i]))) rc = NF_ENOMEM;
  }
  free(dn);
  free(on);
  free(pd);
  if (rc != NF_OK) {
    nf__session_err_set(err, "", "out of memory");
    nf_operator_free(op);
    return NULL;
  }
  if (op->n_out == 0) {
    snprintf(msg, sizeof msg, "def '%s' has no outputs", def);
    nf__session_err_set(err, "", msg);
    nf_operator_free(op);
    return NULL;
  }
  return op;
}

static void spec_clear(spec *sp) {
  nf_session_free(sp->s);
  free(sp->in);
  free(sp->out);
  free(sp->fwd_mask);
  free(sp->undo_slot);
  free(sp->undo_ptr);
  for (int i = 0; i < sp->n_masks; i++) free(sp->masks[i].mask);
  memset(sp, 0, sizeof *sp);
}

void nf_operator_free(nf_operator *op) {
  if (!op) return;
  for (int i = 0; i < op->n_specs; i++) spec_clear(&op->specs[i]);
  for (int i = 0; i < op->n_in && op->in_names; i++) free(op->in_names[i]);
  for (int i = 0; i < op->n_out && op->out_names; i++) free(op->out_names[i]);
  free(op->in_names);
  free(op->out_names);
  for (int i = 0; i < op->n_strs; i++) free(op->strs[i]);
  free(op->strs);
  free(op->trust);
  free(op->inames);
  free(op->ivalues);
  free(op->def);
  nf_buf_free(&op->err);
  pthread_mutex_destroy(&op->mu);
  free(op);
}

const char *nf_operator_error(const nf_operator *op) {
  return op && op->err.len ? op->err.data : "";
}

int nf_operator_n_inputs(const nf_operator *op) { return op ? op->n_in : 0; }
int nf_operator_n_outputs(const nf_operator *op) { return op ? op->n_out : 0; }

const char *nf_operator_input_name(const nf_operator *op, int i) {
  return op && i >= 0 && i < op->n_in ? op->in_names[i] : NULL;
}

const char *nf_operator_output_name(const nf_operator *op, int i) {
  return op && i >= 0 && i < op->n_out ? op->out_names[i] : NULL;
}

/* ---- specialisations ---- */

/* e with every f32 made f64 (memo: e -> its promotion). */
static const nf_expr *promote_expr(nf_ir_ctx *ctx, const nf_expr *e, nf_ptrmap *memo) {
  uint64_t v;
  if (nf_ptrmap_get(memo, e, &v)) return (const nf_expr *)(uintptr_t)v;
  const nf_expr *a[NF_MAX_RANK + 3];
  if (e->n_args > NF_MAX_RANK + 3) return NULL;
  for (int i = 0; i < e->n_args; i++)
    if (!(a[i] = promote_expr(ctx, e->args[i], memo))) return NULL;
  nf_dtype t = e->dtype == NF_F32 ? NF_F64 : (nf_dtype)e->dtype;
  const nf_expr *r;
  switch ((nf_op)e->op) {
  case NF_OP_CONST: r = e->dtype == NF_F32 ? nf_e_const_f(ctx, NF_F64, e->u.f) : e; break;
  case NF_OP_VAR: r = e; break;
  case NF_OP_ACCESS: r = nf_e_access(ctx, e->u.tensor, t, e->n_args, a); break;
  case NF_OP_CAST: r = a[0]->dtype == t ? a[0] : nf_e_cast(ctx, t, a[0]); break;
  case NF_OP_SELECT: r = nf_e_select(ctx, a[0], a[1], a[2]); break;
  default:
    r = e->n_args == 1 ? nf_e_unary(ctx, (nf_op)e->op, a[0])
      : e->n_args == 2 ? nf_e_binary(ctx, (nf_op)e->op, a[0], a[1]) : NULL;
  }
  if (r && nf_ptrmap_put(memo, e, (uint64_t)(uintptr_t)r) != NF_OK) return NULL;
  return r;
}

/* F with every f32 tensor and value made f64, in F's context. */
static nf_graph *promote_graph(const nf_graph *F) {
  nf_ir_ctx *ctx = F->ctx;
  nf_graph *g = nf_graph_new(ctx, F->name);
  if (!g) return NULL;
  for (uint32_t t = 0; t < F->n_tensors; t++) {
    const nf_tensor *tn = &F->tensors[t];
    nf_dtype dt = tn->dtype == NF_F32 ? NF_F64 : (nf_dtype)tn->dtype;
    if (nf_graph_add_tensor(g, tn->name, dt, (nf_tkind)tn->kind, tn->rank, tn->shape) != (int)t)
      return NULL;
  }
  nf_ptrmap memo = NF_PTRMAP_INIT;
  for (uint32_t i = 0; i < F->n_stmts; i++) {
    nf_stmt st = F->stmts[i];
    st.rhs = promote_expr(ctx, st.rhs, &memo);
    if (!st.rhs || nf_graph_add_stmt(g, &st) != NF_OK) {
      nf_ptrmap_free(&memo);
      return NULL;
    }
  }
  nf_ptrmap_free(&memo);
  return g;
}

static void shape_str(const nf_view *v, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s[", nf_dtype_name((nf_dtype)v->elem));
  int rank = v->rank < 0 ? 0 : v->rank > 8 ? 8 : v->rank;
  for (int r = 0; r < rank && k < n; r++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", r ? ", " : "", (long long)v->dims[r]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

static int same_shapes(const spec *sp, const nf_view *in, int n) {
  for (int i = 0; i < n; i++) {
    if (sp->in[i].elem != in[i].elem || sp->in[i].rank != in[i].rank) return 0;
    for (int r = 0; r < in[i].rank; r++)
      if (sp->in[i].dims[r] != in[i].dims[r]) return 0;
  }
  return 1;
}

/* A new specialisation for the inputs' shapes in *sp. */
static int spec_make(nf_operator *op, const nf_view *in, spec *sp) {
  nf_buf *err = &op->err;
  for (int i = 0; i < op->n_in; i++) {
    if (in[i].rank < 0 || in[i].rank > 7) {
      nf_buf_printf(err, "%s: input %d '%s' has rank %d (operators take 0 to 7)", op->def, i,
                    op->in_names[i], in[i].rank);
      return NF_EINVAL;
    }
    if ((unsigned)in[i].elem > NF_ELEM_F64) {
      nf_buf_printf(err, "%s: input %d '%s' has an unknown element type %d", op->def, i,
                    op->in_names[i], (int)in[i].elem);
      return NF_EINVAL;
    }
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_arg_shape *sh = calloc((size_t)op->n_declared + 1, sizeof *sh);
  nf_diag *d = nf_diag_new();
  int rc = ctx && sh && d ? NF_OK : NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < op->n_declared; i++) {
    sh[i].name = op->in_names[i];
    sh[i].rank = in[i].rank;
    memcpy(sh[i].dims, in[i].dims, sizeof(int64_t) * (size_t)in[i].rank);
  }
  nf_inst_opts io = {.n_shapes = op->n_declared, .shapes = sh,
                     .n_params = op->opts.n_iparams, .param_names = op->opts.inames,
                     .param_values = op->opts.ivalues};
  nf_graph *F = NULL;
  if (rc == NF_OK) {
    rc = nf_module_instantiate(op->m->mod, op->def, &io, ctx, &F, d);
    if (rc != NF_OK)
      nf_buf_printf(err, "%s", nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
  }
  nf_diag_free(d);
  free(sh);
  if (rc == NF_OK && ((int)F->n_inputs != op->n_in || (int)F->n_outputs != op->n_out)) {
    nf_buf_printf(err, "internal error: %s instantiated with %u inputs and %u outputs, not %d and %d",
                  op->def, F->n_inputs, F->n_outputs, op->n_in, op->n_out);
    rc = NF_EINTERNAL;
  }
  /* the element types: f32 given f64 promotes the whole def */
  int promote = 0;
  for (int i = 0; rc == NF_OK && i < op->n_in; i++)
    if (F->tensors[F->inputs[i]].dtype == NF_F32 && in[i].elem == NF_ELEM_F64) promote = 1;
  if (rc == NF_OK && promote && !(F = promote_graph(F))) rc = NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < op->n_in; i++) {
    const nf_tensor *t = &F->tensors[F->inputs[i]];
    int ok = t->dtype == (uint8_t)in[i].elem && t->rank == in[i].rank;
    for (int r = 0; ok && r < t->rank; r++) ok = t->shape[r] == in[i].dims[r];
    if (!ok) {
      char want[200], got[200];
      nf_view w = {.elem = (nf_elem)t->dtype, .rank = t->rank};
      memcpy(w.dims, t->shape, sizeof(int64_t) * t->rank);
      shape_str(&w, want, sizeof want);
      shape_str(&in[i], got, sizeof got);
      nf_buf_printf(err, "%s: input %d '%s' must be %s here%s, got %s", op->def, i,
                    op->in_names[i], want,
                    promote ? " (f32 computed as f64: an f64 input was given)" : "", got);
      rc = NF_EINVAL;
    }
  }
  memset(sp, 0, sizeof *sp);
  sp->promote = promote;
  sp->in = calloc((size_t)op->n_in + 1, sizeof *sp->in);
  sp->out = calloc((size_t)op->n_out + 1, sizeof *sp->out);
  if (rc == NF_OK && (!sp->in || !sp->out)) rc = NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < op->n_in; i++) {
    sp->in[i] = in[i];
    sp->in[i].data = NULL;
  }
  for (int j = 0; rc == NF_OK && j < op->n_out; j++) {
    const nf_tensor *t = &F->tensors[F->outputs[j]];
    sp->out[j].elem = (nf_elem)t->dtype;
    sp->out[j].rank = t->rank;
    memcpy(sp->out[j].dims, t->shape, sizeof(int64_t) * t->rank);
  }
  if (rc != NF_OK) {
    if (rc == NF_ENOMEM && !err->len) nf_buf_printf(err, "out of memory");
    nf_ir_ctx_free(ctx);
    spec_clear(sp);
    return rc;
  }
  nf_session_opts so = op->opts;
  so.device = "cpu";
  char *e = NULL;
  sp->s = nf__session_new_fn(F, ctx, &so, &e);
  if (!sp->s) {
    nf_buf_printf(err, "%s: %s", op->def, e ? e : "out of memory");
    free(e);
    spec_clear(sp);
    return NF_EINVAL;
  }
  nf_session *s = sp->s;
  sp->fwd_mask = calloc((size_t)s->n_ops + 1, 1);
  sp->undo_slot = calloc((size_t)s->n_slots + 1, sizeof *sp->undo_slot);
  sp->undo_ptr = calloc((size_t)s->n_slots + 1, sizeof *sp->undo_ptr);
  if (!sp->fwd_mask || !sp->undo_slot || !sp->undo_ptr) {
    spec_clear(sp);
    return NF_ENOMEM;
  }
  /* (all of the forward: its outputs and the values kept for the gradient) */
  memset(sp->fwd_mask, 1, (size_t)s->fn_fwd_ops);
  return NF_OK;
}

/* The specialisation for in (made when new; the least recently used
 * dropped when all are taken), or NULL with the error in op->err. */
static spec *spec_for(nf_operator *op, const nf_view *in, int *rc) {
  nf_buf_reset(&op->err);
  *rc = NF_OK;
  if (!in && op->n_in > 0) {
    nf_buf_printf(&op->err, "%s: no inputs given", op->def);
    *rc = NF_EINVAL;
    return NULL;
  }
  for (int i = 0; i < op->n_specs; i++)
    if (same_shapes(&op->specs[i], in, op->n_in)) {
      op->specs[i].used = ++op->clock;
      return &op->specs[i];
    }
  spec ns;
  if ((*rc = spec_make(op, in, &ns)) != NF_OK) return NULL;
  int at = op->n_specs;
  if (at == NF_OPERATOR_SPECS) {
    at = 0;
    for (int i = 1; i < op->n_specs; i++)
      if (op->specs[i].used < op->specs[at].used) at = i;
    spec_clear(&op->specs[at]);
  } else {
    op->n_specs++;
  }
  op->specs[at] = ns;
  op->specs[at].used = ++op->clock;
  return &op->specs[at];
}

/* ---- running ---- */

static size_t view_bytes(const nf_view *v) {
  size_t n = nf_dtype_size((nf_dtype)v->elem);
  for (int r = 0; r < v->rank; r++) n *= (size_t)v->dims[r];
  return n;
}

/* Whether the caller's view v has the element type and shape want has. */
static int check_view(nf_operator *op, const char *what, int i, const char *name,
                      const nf_view *v, const nf_view *want) {
  int ok = v->elem == want->elem && v->rank == want->rank;
  for (int r = 0; ok && r < v->rank; r++) ok = v->dims[r] == want->dims[r];
  if (ok) return NF_OK;
  char a[200], b[200];
  shape_str(want, a, sizeof a);
  shape_str(v, b, sizeof b);
  nf_buf_printf(&op->err, "%s: %s %d '%s' must be %s, got %s", op->def, what, i, name, a, b);
  return NF_EINVAL;
}

/* The caller's buffers stand in for the program's own during a call
 * (no copy) where the host runs the kernels and the address suits the
 * element type; else the data is copied in and out. */
static int lendable(const nf_session *s, const void *p, const nf_view *v) {
  return p && view_bytes(v) > 0 && s->kt.dev->host && !s->gpu &&
         (uintptr_t)p % nf_dtype_size((nf_dtype)v->elem) == 0;
}

/* Lends p to the program in place of slot's buffer: the slot and the
 * temporaries that share its buffer (build.c's copies into bound
 * buffers) point at p until give_back. */
static void lend(spec *sp, int slot, void *p) {
  nf_session *s = sp->s;
  void *own = s->slots[slot].ptr;
  for (int j = 0; j < s->n_slots; j++)
    if (s->slots[j].ptr == own) {
      sp->undo_slot[sp->n_undo] = j;
      sp->undo_ptr[sp->n_undo++] = own;
      s->slots[j].ptr = p;
    }
}

/* The ops' pointers from their slots'. */
static void rebuf(nf_session *s) {
  for (int i = 0; i < s->n_ops; i++) {
    nf__op *o = &s->ops[i];
    for (uint32_t j = 0; j < o->n_in + o->n_out; j++) o->bufs[j] = s->slots[o->slots[j]].ptr;
  }
}

/* The program's own buffers back, after a call. */
static void give_back(spec *sp) {
  if (!sp->n_undo) return;
  while (sp->n_undo > 0) {
    sp->n_undo--;
    sp->s->slots[sp->undo_slot[sp->n_undo]].ptr = sp->undo_ptr[sp->n_undo];
  }
  rebuf(sp->s);
}

/* Data for an input (or a seed: NULL data is zeros) of the program. */
static int put(spec *sp, int slot, const nf_view *v) {
  nf_session *s = sp->s;
  size_t bytes = view_bytes(v);
  if (lendable(s, v->data, v)) {
    lend(sp, slot, v->data);
    return NF_OK;
  }
  void *p = s->slots[slot].ptr;
  if (v->data) memcpy(p, v->data, bytes);
  else memset(p, 0, bytes);
  return nf__dev_push(s, p, bytes);
}

/* Where an output of the program goes: lent (1) or copied after (0). */
static int take(spec *sp, int slot, const nf_view *v) {
  if (!lendable(sp->s, v->data, v)) return 0;
  lend(sp, slot, v->data);
  return 1;
}

static int copy_out(nf_session *s, int slot, void *data, size_t bytes) {
  const void *p = s->slots[slot].ptr;
  int rc = nf__dev_pull(s, p, bytes);
  if (rc == NF_OK) memcpy(data, p, bytes);
  return rc;
}

static int feed_inputs(nf_operator *op, spec *sp, const nf_view *in) {
  for (int i = 0; i < op->n_in; i++) {
    if (!in[i].data && view_bytes(&in[i]) > 0) {
      nf_buf_printf(&op->err, "%s: input %d '%s' has no data", op->def, i, op->in_names[i]);
      return NF_EINVAL;
    }
    int rc = put(sp, sp->s->fn_in[i], &in[i]);
    if (rc != NF_OK) return rc;
  }
  return NF_OK;
}

/* A failed run's message from the session. */
static int run(nf_operator *op, spec *sp, const uint8_t *mask) {
  int rc = nf__session_run_fn(sp->s, mask);
  if (rc != NF_OK) nf_buf_printf(&op->err, "%s: %s", op->def, nf_session_error(sp->s));
  return rc;
}

int nf_operator_shapes(nf_operator *op, const nf_view *in, nf_view *out) {
  if (!op) return NF_EINVAL;
  pthread_mutex_lock(&op->mu);
  int rc;
  spec *sp = spec_for(op, in, &rc);
  for (int j = 0; sp && out && j < op->n_out; j++) {
    out[j].elem = sp->out[j].elem;
    out[j].rank = sp->out[j].rank;
    memcpy(out[j].dims, sp->out[j].dims, sizeof out[j].dims);
  }
  pthread_mutex_unlock(&op->mu);
  return rc;
}

int nf_operator_forward(nf_operator *op, const nf_view *in, nf_view *out, uint64_t *saved) {
  if (saved) *saved = 0;
  if (!op) return NF_EINVAL;
  pthread_mutex_lock(&op->mu);
  int rc;
  spec *sp = spec_for(op, in, &rc);
  if (sp && !out) {
    nf_buf_printf(&op->err, "%s: no outputs given", op->def);
    rc = NF_EINVAL;
  }
  for (int j = 0; sp && rc == NF_OK && j < op->n_out; j++) {
    rc = check_view(op, "output", j, op->out_names[j], &out[j], &sp->out[j]);
    if (rc == NF_OK && !out[j].data && view_bytes(&out[j]) > 0) {
      nf_buf_printf(&op->err, "%s: output %d '%s' has no buffer", op->def, j, op->out_names[j]);
      rc = NF_EINVAL;
    }
  }
  uint64_t lent = 0; /* bit j: output j written in place */
  if (sp && rc == NF_OK) rc = feed_inputs(op, sp, in);
  /* (an output the gradient reads stays in the program's memory) */
  for (int j = 0; sp && rc == NF_OK && j < op->n_out; j++)
    if (j < 64 && !sp->s->fn_saved_out[j] && take(sp, sp->s->fn_out[j], &out[j]))
      lent |= (uint64_t)1 << j;
  if (sp && sp->n_undo) rebuf(sp->s);
  if (sp && rc == NF_OK) rc = run(op, sp, sp->fwd_mask);
  for (int j = 0; sp && rc == NF_OK && j < op->n_out; j++)
    if (view_bytes(&out[j]) > 0 && !(j < 64 && (lent >> j & 1)))
      rc = copy_out(sp->s, sp->s->fn_out[j], out[j].data, view_bytes(&out[j]));
  if (sp) give_back(sp);
  if (sp && rc == NF_OK) {
    sp->fwd_token = ++tokens;
    if (saved) *saved = sp->fwd_token;
  } else if (sp) {
    sp->fwd_token = 0;
  }
  pthread_mutex_unlock(&op->mu);
  return rc;
}

/* The ops computing the gradients in want (bits by input), kept. */
static const uint8_t *grad_mask(spec *sp, uint64_t want) {
  for (int i = 0; i < sp->n_masks; i++)
    if (sp->masks[i].want == want) return sp->masks[i].mask;
  nf_session *s = sp->s;
  int slots[64], n = 0;
  for (int i = 0; i < s->fn_n_in && i < 64; i++)
    if (want >> i & 1) slots[n++] = s->fn_grad[i];
  uint8_t *m = calloc((size_t)s->n_ops + 1, 1);
  if (!m) return NULL;
  nf__session_ops_for(s, slots, n, s->fn_fwd_ops, s->n_ops, m);
  if (sp->n_masks == MAX_MASKS) { /* (the oldest set makes room) */
    free(sp->masks[0].mask);
    memmove(sp->masks, sp->masks + 1, sizeof sp->masks[0] * (MAX_MASKS - 1));
    sp->n_masks--;
  }
  sp->masks[sp->n_masks].want = want;
  sp->masks[sp->n_masks++].mask = m;
  return m;
}

int nf_operator_backward(nf_operator *op, uint64_t saved, const nf_view *in,
                         const nf_view *dout, nf_view *din) {
  if (!op) return NF_EINVAL;
  pthread_mutex_lock(&op->mu);
  int rc;
  spec *sp = spec_for(op, in, &rc);
  uint64_t want = 0;
  if (sp && (!dout || !din)) {
    nf_buf_printf(&op->err, "%s: no output gradients or no input gradients given", op->def);
    rc = NF_EINVAL;
  }
  for (int i = 0; sp && rc == NF_OK && i < op->n_in; i++) {
    if (!din[i].data) continue;
    if (sp->s->fn_nograd) {
      nf_buf_printf(&op->err, "%s: no gradient: %s", op->def, sp->s->fn_nograd);
      rc = NF_EUNSUPPORTED;
    } else if (sp->s->fn_grad[i] < 0) {
      nf_buf_printf(&op->err, "%s: input %d '%s' is %s: only float inputs have gradients",
                    op->def, i, op->in_names[i], nf_dtype_name((nf_dtype)sp->in[i].elem));
      rc = NF_EINVAL;
    } else if (i >= 64) {
      nf_buf_printf(&op->err, "%s: gradients of input %d: operators give gradients of their "
                    "first 64 inputs only", op->def, i);
      rc = NF_ELIMIT;
    } else {
      rc = check_view(op, "input gradient", i, op->in_names[i], &din[i], &sp->in[i]);
      want |= (uint64_t)1 << i;
    }
  }
  for (int j = 0; sp && rc == NF_OK && j < op->n_out; j++)
    rc = check_view(op, "output gradient", j, op->out_names[j], &dout[j], &sp->out[j]);
  const uint8_t *mask = NULL;
  if (sp && rc == NF_OK && want) {
    mask = grad_mask(sp, want);
    if (!mask) rc = NF_ENOMEM;
  }
  if (sp && rc == NF_OK && want) {
    rc = feed_inputs(op, sp, in);
    for (int j = 0; rc == NF_OK && j < op->n_out; j++)
      if (sp->s->fn_seed[j] >= 0) rc = put(sp, sp->s->fn_seed[j], &dout[j]);
    uint64_t lent = 0; /* bit i: input i's gradient written in place */
    for (int i = 0; rc == NF_OK && i < op->n_in && i < 64; i++)
      if ((want >> i & 1) && take(sp, sp->s->fn_grad[i], &din[i])) lent |= (uint64_t)1 << i;
    if (sp->n_undo) rebuf(sp->s);
    /* the forward's values: kept from the forward named, else computed */
    if (rc == NF_OK && sp->s->fn_n_saved > 0 && (!saved || saved != sp->fwd_token)) {
      sp->fwd_token = 0;
      rc = run(op, sp, sp->fwd_mask);
    }
    if (rc == NF_OK) rc = run(op, sp, mask);
    for (int i = 0; rc == NF_OK && i < op->n_in && i < 64; i++)
      if ((want >> i & 1) && view_bytes(&din[i]) > 0 && !(lent >> i & 1))
        rc = copy_out(sp->s, sp->s->fn_grad[i], din[i].data, view_bytes(&din[i]));
    give_back(sp);
  }
  pthread_mutex_unlock(&op->mu);
  return rc;
}

int nf_operator_stats(const nf_operator *op, nf_session_stats *st) {
  if (!op || !st) return NF_EINVAL;
  nf_operator *mop = (nf_operator *)op;
  pthread_mutex_lock(&mop->mu);
  memset(st, 0, sizeof *st);
  int n_ms = 0;
  for (int i = 0; i < op->n_specs; i++) {
    nf_session_stats a;
    if (nf_session_stats_get(op->specs[i].s, &a) != NF_OK) continue;
    st->step += a.step;
    st->ms += a.ms;
    if (a.step) st->ms_avg += a.ms_avg, n_ms++;
    st->kernels += a.kernels;
    st->tier1 += a.tier1;
    st->tier2 += a.tier2;
    st->blas += a.blas;
    st->tuning += a.tuning;
    st->trials += a.trials;
    st->trials_max += a.trials_max;
    if (a.connected) st->connected = 1;
    st->reconnects += a.reconnects;
    st->rejected += a.rejected;
    st->swaps += a.swaps;
    st->trusted += a.trusted;
    st->blas_kept += a.blas_kept;
    st->generated += a.generated;
    st->graph_runs += a.graph_runs;
    st->tier0_kept += a.tier0_kept;
    st->remembered += a.remembered;
  }
  if (n_ms) st->ms_avg /= n_ms;
  pthread_mutex_unlock(&mop->mu);
  return NF_OK;
}

int nf_operator_wait_kernels(nf_operator *op, int timeout_ms, int want_tier) {
  if (!op) return NF_EINVAL;
  double until = nf_now_ms() + (timeout_ms > 0 ? timeout_ms : 1e12);
  pthread_mutex_lock(&op->mu);
  int rc = NF_OK;
  for (int i = 0; i < op->n_specs && rc == NF_OK; i++) {
    double left = until - nf_now_ms();
    if (left < 1) left = 1;
    rc = nf_session_wait_kernels(op->specs[i].s, timeout_ms > 0 ? (int)left : 0, want_tier);
  }
  pthread_mutex_unlock(&op->mu);
  return rc;
}
