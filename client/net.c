/* net.c - nets: graphs built in C by applying defs (neoflow.h).
 *
 * A net is written down as a `.nf` def, so everything a `.nf` file gets
 * (checking, sizes, error messages with locations) applies unchanged:
 * inputs become the def's inputs, parameters `param` statements, each
 * nf_net_apply one call statement whose results are named _t0, _t1, ...,
 * the loss the first output.  Outputs made readable with nf_net_output
 * need declared shapes: the def is instantiated once to learn them, then
 * written again with each such output defined as stop_gradient of the
 * tensor (so it costs no gradient work).  The text is loaded in a module
 * of its own together with the model's canonical text (nf_module_print),
 * so a mistake in a net never affects the model.  Imports of the model's
 * files by relative path resolve from the current directory there. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session_int.h"

enum { T_INPUT, T_PARAM, T_RESULT };

typedef struct ntensor {
  char *name;
  int kind;
  nf_elem t;
  int rank;
  int64_t dims[8];
  nf_init init;
  float *data;
} ntensor;

struct nf_net {
  nf_model *m;
  nf_buf err, body, src;
  int n, cap;
  ntensor *t;
  int loss;
  int n_out;
  char **out_name;
  int *out_t;
  int n_grad;
  int *grad_t;
  int bad; /* an earlier call failed */
};

static const char *elem_name(nf_elem t) {
  switch (t) {
    case NF_ELEM_BOOL: return "bool";
    case NF_ELEM_I32: return "i32";
    case NF_ELEM_I64: return "i64";
    case NF_ELEM_F16: return "f16";
    case NF_ELEM_BF16: return "bf16";
    case NF_ELEM_F32: return "f32";
    case NF_ELEM_F64: return "f64";
  }
  return NULL;
}

static int ident_ok(const char *s) {
  if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_') || strlen(s) > 200) return 0;
  for (const char *p = s; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') return 0;
  return !(s[0] == '_' && s[1] == 't' && isdigit((unsigned char)s[2]));
}

static int fail(nf_net *n, int rc, const char *fmt, const char *a) {
  nf_buf_reset(&n->err);
  nf_buf_printf(&n->err, fmt, a);
  return rc;
}

nf_net *nf_net_new(nf_model *m) {
  if (!m) return NULL;
  nf_net *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->m = m;
  n->loss = -1;
  return n;
}

void nf_net_free(nf_net *n) {
  if (!n) return;
  for (int i = 0; i < n->n; i++) {
    free(n->t[i].name);
    free(n->t[i].data);
  }
  free(n->t);
  for (int i = 0; i < n->n_out; i++) free(n->out_name[i]);
  free(n->out_name);
  free(n->out_t);
  free(n->grad_t);
  nf_buf_free(&n->err);
  nf_buf_free(&n->body);
  nf_buf_free(&n->src);
  free(n);
}

const char *nf_net_error(const nf_net *n) { return n && n->err.len ? n->err.data : ""; }

static int add(nf_net *n, const char *name, int kind, nf_elem t, int rank, const int64_t *dims) {
  if (n->n == n->cap) {
    int nc = n->cap ? 2 * n->cap : 16;
    ntensor *nt = realloc(n->t, sizeof *nt * (size_t)nc);
    if (!nt) return NF_ENOMEM;
    n->t = nt;
    n->cap = nc;
  }
  ntensor *x = &n->t[n->n];
  memset(x, 0, sizeof *x);
  char tmp[32];
  if (!name) {
    snprintf(tmp, sizeof tmp, "_t%d", n->n);
    name = tmp;
  }
  x->name = strdup(name);
  if (!x->name) return NF_ENOMEM;
  x->kind = kind;
  x->t = t;
  x->rank = rank;
  for (int i = 0; i < rank; i++) x->dims[i] = dims[i];
  return n->n++;
}

static int declare(nf_net *n, const char *name, int kind, nf_elem t, int rank,
                   const int64_t *dims) {
  if (!ident_ok(name)) return fail(n, NF_EINVAL, "'%s' is not a valid tensor name", name ? name : "(null)");
  for (int i = 0; i < n->n; i++)
    if (!strcmp(n->t[i].name, name)) return fail(n, NF_EINVAL, "a tensor named '%s' exists", name);
  if (!elem_name(t)) return fail(n, NF_EINVAL, "tensor '%s': unknown element type", name);
  if (rank < 0 || rank > 8 || (rank && !dims))
    return fail(n, NF_EINVAL, "tensor '%s': rank must be 0..8 with its dims", name);
  for (int i = 0; i < rank; i++)
    if (dims[i] <= 0) return fail(n, NF_EINVAL, "tensor '%s': dims must be positive", name);
  return add(n, name, kind, t, rank, dims);
}

int nf_net_input(nf_net *n, const char *name, nf_elem t, int rank, const int64_t *dims) {
  if (!n) return NF_EINVAL;
  return declare(n, name, T_INPUT, t, rank, dims);
}

int nf_net_param(nf_net *n, const char *name, nf_elem t, int rank, const int64_t *dims,
                 nf_init init) {
  if (!n) return NF_EINVAL;
  if (t != NF_ELEM_F32) return fail(n, NF_EUNSUPPORTED, "parameter '%s': parameters are f32", name ? name : "");
  if ((unsigned)init.fn > NF_INIT_FN_BUFFER)
    return fail(n, NF_EINVAL, "parameter '%s': unknown initializer", name ? name : "");
  int id = declare(n, name, T_PARAM, t, rank, dims);
  if (id < 0) return id;
  n->t[id].init = init;
  if (init.fn == NF_INIT_FN_BUFFER) {
    if (!init.data) return fail(n, NF_EINVAL, "parameter '%s': buffer initializer without data", name);
    int64_t cnt = 1;
    for (int i = 0; i < rank; i++) cnt *= dims[i];
    n->t[id].data = malloc(sizeof(float) * (size_t)cnt);
    if (!n->t[id].data) return NF_ENOMEM;
    memcpy(n->t[id].data, init.data, sizeof(float) * (size_t)cnt);
    n->t[id].init.data = NULL;
  }
  return id;
}

int nf_net_apply(nf_net *n, const char *def, int n_iparams, const char *const *inames,
                 const int64_t *ivalues, int n_in, const int *in, int n_out, int *out) {
  if (!n || !def || n_out < 1 || !out || n_in < 0 || (n_in && !in)) return NF_EINVAL;
  if (!nf_module_has_def(n->m->mod, def)) return fail(n, NF_ENOENT, "no def '%s' in the model", def);
  for (int i = 0; i < n_in; i++)
    if (in[i] < 0 || in[i] >= n->n) return fail(n, NF_EINVAL, "%s: an argument is not a tensor of this net", def);
  for (int i = 0; i < n_iparams; i++)
    if (!inames || !ident_ok(inames[i])) return fail(n, NF_EINVAL, "%s: bad parameter name", def);
  nf_buf line = NF_BUF_INIT;
  nf_buf_puts(&line, "  ");
  for (int k = 0; k < n_out; k++) {
    int id = add(n, NULL, T_RESULT, NF_ELEM_F32, 0, NULL);
    if (id < 0) {
      nf_buf_free(&line);
      return id;
    }
    out[k] = id;
    nf_buf_printf(&line, "%s%s", k ? ", " : "", n->t[id].name);
  }
  nf_buf_printf(&line, " = %s", def);
  if (n_iparams > 0) {
    nf_buf_putc(&line, '<');
    for (int i = 0; i < n_iparams; i++)
      nf_buf_printf(&line, "%s%s = %lld", i ? ", " : "", inames[i], (long long)ivalues[i]);
    nf_buf_putc(&line, '>');
  }
  nf_buf_putc(&line, '(');
  for (int i = 0; i < n_in; i++) nf_buf_printf(&line, "%s%s", i ? ", " : "", n->t[in[i]].name);
  nf_buf_puts(&line, ")\n");
  nf_buf_add(&n->body, line.data, line.len);
  nf_buf_free(&line);
  return NF_OK;
}

int nf_net_loss(nf_net *n, int tensor) {
  if (!n || tensor < 0 || tensor >= n->n) return NF_EINVAL;
  if (n->loss >= 0) return fail(n, NF_EINVAL, "%s", "the loss is declared already");
  n->loss = tensor;
  return NF_OK;
}

int nf_net_output(nf_net *n, const char *name, int tensor) {
  if (!n || tensor < 0 || tensor >= n->n) return NF_EINVAL;
  if (!ident_ok(name)) return fail(n, NF_EINVAL, "'%s' is not a valid output name", name ? name : "(null)");
  for (int i = 0; i < n->n; i++)
    if (!strcmp(n->t[i].name, name)) return fail(n, NF_EINVAL, "a tensor named '%s' exists", name);
  for (int i = 0; i < n->n_out; i++)
    if (!strcmp(n->out_name[i], name)) return fail(n, NF_EINVAL, "an output named '%s' exists", name);
  char **nn = realloc(n->out_name, sizeof(char *) * (size_t)(n->n_out + 1));
  if (nn) n->out_name = nn;
  int *nt = realloc(n->out_t, sizeof(int) * (size_t)(n->n_out + 1));
  if (nt) n->out_t = nt;
  if (!nn || !nt || !(n->out_name[n->n_out] = strdup(name))) return NF_ENOMEM;
  n->out_t[n->n_out++] = tensor;
  return NF_OK;
}

int nf_grad(nf_net *n, int wrt) {
  if (!n || wrt < 0 || wrt >= n->n) return NF_EINVAL;
  if (n->t[wrt].kind == T_RESULT)
    return fail(n, NF_EUNSUPPORTED, "gradient of '%s': only inputs and parameters have gradients",
                n->t[wrt].name);
  if (n->t[wrt].t != NF_ELEM_F32)
    return fail(n, NF_EINVAL, "gradient of '%s': not a float tensor", n->t[wrt].name);
  int *ng = realloc(n->grad_t, sizeof(int) * (size_t)(n->n_grad + 1));
  if (!ng) return NF_ENOMEM;
  n->grad_t = ng;
  n->grad_t[n->n_grad++] = wrt;
  return NF_OK;
}

static void put_decl(nf_buf *b, const ntensor *x) {
  nf_buf_printf(b, "%s: %s[", x->name, elem_name(x->t));
  for (int i = 0; i < x->rank; i++) nf_buf_printf(b, "%s%lld", i ? ", " : "", (long long)x->dims[i]);
  nf_buf_putc(b, ']');
}

static const char *init_text(const nf_init *in, char *buf, size_t cap) {
  switch (in->fn) {
    case NF_INIT_FN_ZEROS: return "zeros";
    case NF_INIT_FN_ONES: return "ones";
    case NF_INIT_FN_CONSTANT: snprintf(buf, cap, "constant(%.17g)", in->a); return buf;
    case NF_INIT_FN_UNIFORM: snprintf(buf, cap, "uniform(%.17g, %.17g)", in->a, in->b); return buf;
    case NF_INIT_FN_NORMAL: snprintf(buf, cap, "normal(%.17g, %.17g)", in->a, in->b); return buf;
    case NF_INIT_FN_XAVIER_UNIFORM: snprintf(buf, cap, "xavier_uniform(%.17g)", in->a > 0 ? in->a : 1); return buf;
    case NF_INIT_FN_XAVIER_NORMAL: snprintf(buf, cap, "xavier_normal(%.17g)", in->a > 0 ? in->a : 1); return buf;
    case NF_INIT_FN_KAIMING_UNIFORM: snprintf(buf, cap, "kaiming_uniform(%.17g)", in->a); return buf;
    case NF_INIT_FN_KAIMING_NORMAL: snprintf(buf, cap, "kaiming_normal(%.17g)", in->a); return buf;
    case NF_INIT_FN_BUFFER: return "zeros"; /* filled from the buffer by the session */
  }
  return "zeros";
}

/* The def's text; shapes (n->n_out entries, rank -1: unknown) declare the
 * readable outputs when known. */
static void write_def(nf_net *n, const char *defname, const int *oranks,
                      int64_t (*odims)[8], nf_buf *b) {
  nf_buf_printf(b, "\ndef %s(", defname);
  int k = 0;
  for (int i = 0; i < n->n; i++)
    if (n->t[i].kind == T_INPUT) {
      if (k++) nf_buf_puts(b, ", ");
      put_decl(b, &n->t[i]);
    }
  nf_buf_puts(b, ") -> (_loss: f32[]");
  for (int i = 0; oranks && i < n->n_out; i++) {
    ntensor o = {.name = n->out_name[i], .t = NF_ELEM_F32, .rank = oranks[i]};
    memcpy(o.dims, odims[i], sizeof o.dims);
    nf_buf_puts(b, ", ");
    put_decl(b, &o);
  }
  nf_buf_puts(b, ") {\n");
  for (int i = 0; i < n->n; i++)
    if (n->t[i].kind == T_PARAM) {
      char ib[128];
      nf_buf_puts(b, "  param ");
      put_decl(b, &n->t[i]);
      nf_buf_printf(b, " = %s\n", init_text(&n->t[i].init, ib, sizeof ib));
    }
  nf_buf_add(b, n->body.data, n->body.len);
  nf_buf_printf(b, "  _loss = %s\n", n->t[n->loss].name);
  for (int i = 0; oranks && i < n->n_out; i++) {
    nf_buf_printf(b, "  %s(", n->out_name[i]);
    for (int r = 0; r < oranks[i]; r++) nf_buf_printf(b, "%si%d", r ? ", " : "", r);
    nf_buf_printf(b, ") = stop_gradient(%s(", n->t[n->out_t[i]].name);
    for (int r = 0; r < oranks[i]; r++) nf_buf_printf(b, "%si%d", r ? ", " : "", r);
    nf_buf_puts(b, "))\n");
  }
  nf_buf_puts(b, "}\n");
}

const char *nf_net_source(nf_net *n) {
  if (!n || n->loss < 0) return "";
  nf_buf_reset(&n->src);
  write_def(n, "net", NULL, NULL, &n->src);
  return nf_buf_str(&n->src);
}

/* Loads the model's text plus the def into a fresh module and
 * instantiates it. */
static int instantiate(nf_net *n, const char *def_text, nf_ir_ctx *ctx, nf_graph **g,
                       nf_module **mod_out) {
  nf_buf text = NF_BUF_INIT;
  nf_module_print(n->m->mod, &text);
  nf_buf_add(&text, def_text, strlen(def_text));
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc = mod && d && !text.oom ? NF_OK : NF_ENOMEM;
  if (rc == NF_OK) rc = nf_module_load_source(mod, "<net>", nf_buf_str(&text), d);
  if (rc == NF_OK) rc = nf_module_instantiate(mod, "__net", NULL, ctx, g, d);
  if (rc != NF_OK) {
    nf_buf_reset(&n->err);
    nf_buf_printf(&n->err, "the net (as .nf: nf_net_source):\n%s",
                  d && nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
  }
  nf_diag_free(d);
  nf_buf_free(&text);
  if (rc == NF_OK && mod_out) *mod_out = mod;
  else nf_module_free(mod);
  return rc;
}

nf_session *nf_session_new_net(nf_net *n, const nf_session_opts *opts, char **err) {
  if (err) *err = NULL;
  if (!n) return NULL;
  if (n->loss < 0) {
    if (err) *err = strdup("the net has no loss (nf_net_loss)");
    return NULL;
  }
  int rc = NF_OK;
  int *oranks = calloc((size_t)n->n_out + 1, sizeof(int));
  int64_t (*odims)[8] = calloc((size_t)n->n_out + 1, sizeof *odims);
  nf_buf def = NF_BUF_INIT;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!oranks || !odims || !ctx) rc = NF_ENOMEM;
  /* pass 1: the readable outputs' shapes */
  if (rc == NF_OK && n->n_out > 0) {
    nf_graph *g = NULL;
    write_def(n, "__net", NULL, NULL, &def);
    rc = instantiate(n, nf_buf_str(&def), ctx, &g, NULL);
    for (int i = 0; rc == NF_OK && i < n->n_out; i++) {
      const char *want = n->t[n->out_t[i]].name;
      int found = 0;
      for (uint32_t t = 0; t < g->n_tensors && !found; t++) {
        if (!g->tensors[t].name || strcmp(g->tensors[t].name, want)) continue;
        found = 1;
        oranks[i] = g->tensors[t].rank;
        memcpy(odims[i], g->tensors[t].shape, sizeof(int64_t) * g->tensors[t].rank);
        if (g->tensors[t].dtype != NF_F32) {
          nf_buf_reset(&n->err);
          nf_buf_printf(&n->err, "output '%s' is not f32", n->out_name[i]);
          rc = NF_EUNSUPPORTED;
        }
      }
      if (!found && rc == NF_OK) {
        nf_buf_reset(&n->err);
        nf_buf_printf(&n->err, "output '%s': its tensor is not part of the net's graph",
                      n->out_name[i]);
        rc = NF_ENOENT;
      }
    }
  }
  nf_module *mod = NULL;
  nf_graph *F = NULL;
  nf_session *s = NULL;
  if (rc == NF_OK) {
    nf_buf_reset(&def);
    write_def(n, "__net", n->n_out ? oranks : NULL, odims, &def);
    rc = instantiate(n, nf_buf_str(&def), ctx, &F, &mod);
  }
  if (rc == NF_OK) {
    nf_model tmp = {.mod = mod};
    const char **wrt = calloc((size_t)n->n_grad + 1, sizeof(char *));
    if (!wrt) rc = NF_ENOMEM;
    int nw = 0;
    for (int i = 0; wrt && i < n->n_grad; i++)
      if (n->t[n->grad_t[i]].kind == T_INPUT) wrt[nw++] = n->t[n->grad_t[i]].name;
    if (rc == NF_OK)
      s = nf__session_new_graph(&tmp, F, ctx, opts, nw, wrt, n->n_out, (const char *const *)n->out_name, err);
    free(wrt);
    ctx = NULL; /* owned by the session now, or freed by it */
    if (s) {
      for (int i = 0; i < n->n; i++)
        if (n->t[i].kind == T_PARAM && n->t[i].init.fn == NF_INIT_FN_BUFFER) {
          int64_t cnt = 1;
          for (int r = 0; r < n->t[i].rank; r++) cnt *= n->t[i].dims[r];
          nf_session_set_param(s, n->t[i].name, n->t[i].data, (size_t)cnt);
        }
    }
  } else if (err) {
    *err = strdup(n->err.len ? n->err.data : nf_strerror(rc));
  }
  nf_module_free(mod);
  nf_ir_ctx_free(ctx);
  nf_buf_free(&def);
  free(oranks);
  free(odims);
  return s;
}
