/* graph_print.c - writes a concrete nf_graph as a `.nf` def.
 *
 * The text parses and instantiates back to a graph with the same
 * canonical encoding: shapes are constants, every reduction range and
 * every index range of a local tensor is explicit, and constants whose
 * type the language's weak-literal rule would not reproduce are written
 * as typed casts (`f64(0.5)`, `i32(3)`).  Names are made into unique
 * identifiers (`H[3]` becomes `H_3`); names are metadata, so this never
 * changes the hash. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_lang_int.h"

static const char *const reserved[] = {
    "def", "import", "for", "in", "where", "require", "true", "false",
    "f16", "bf16", "f32", "f64", "i32", "i64", "bool", "exp", "log",
    "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "floor", "ceil",
    "pow", "min", "max", "max=", "min="};

typedef struct pctx {
  const nf_graph *g;
  char **tname; /* per tensor */
  char *vname[NF_MAX_VARS];
  nf_buf *out;
} pctx;

static int is_reserved(const char *s) {
  for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++)
    if (strcmp(reserved[k], s) == 0) return 1;
  return 0;
}

/* Sanitised copy of name (malloc'ed), unique among used[0..n). */
static char *make_name(const char *name, const char *fallback, int idx,
                       char **used, int n_used) {
  nf_buf b = NF_BUF_INIT;
  if (name && *name) {
    for (const char *p = name; *p; p++) {
      char c = *p;
      int ok = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
               (c >= 'A' && c <= 'Z');
      if (c == ']') continue;
      nf_buf_putc(&b, ok ? c : '_');
    }
  }
  if (b.len == 0) nf_buf_printf(&b, "%s%d", fallback, idx);
  if (b.data[0] >= '0' && b.data[0] <= '9') {
    nf_buf t = NF_BUF_INIT;
    nf_buf_printf(&t, "_%s", b.data);
    nf_buf_free(&b);
    b = t;
  }
  if (is_reserved(b.data)) nf_buf_putc(&b, '_');
  if (b.oom) {
    nf_buf_free(&b);
    return NULL;
  }
  char *base = b.data;
  for (int suffix = 2;; suffix++) {
    int clash = 0;
    for (int k = 0; k < n_used && !clash; k++)
      if (used[k] && strcmp(used[k], b.data) == 0) clash = 1;
    if (!clash) break;
    nf_buf t = NF_BUF_INIT;
    nf_buf_printf(&t, "%s_%d", base, suffix);
    if (b.data != base) nf_buf_free(&b);
    b = t;
    if (b.oom) {
      free(base);
      nf_buf_free(&b);
      return NULL;
    }
  }
  if (b.data != base) free(base);
  return b.data;
}

static void put_float(nf_buf *b, double v) {
  if (isnan(v)) {
    nf_buf_puts(b, "(0.0 / 0.0)");
    return;
  }
  if (isinf(v)) {
    nf_buf_puts(b, v > 0 ? "(1.0 / 0.0)" : "(-1.0 / 0.0)");
    return;
  }
  char s[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(s, sizeof s, "%.*g", prec, v);
    if (strtod(s, NULL) == v) break;
  }
  if (signbit(v) && v == 0) snprintf(s, sizeof s, "-0.0");
  nf_buf_puts(b, s);
  if (!strpbrk(s, ".eE")) nf_buf_puts(b, ".0");
}

static void put_int(nf_buf *b, int64_t v) {
  if (v == INT64_MIN)
    nf_buf_puts(b, "(-9223372036854775807 - 1)");
  else
    nf_buf_printf(b, "%" PRId64, v);
}

/* Precedence levels of the language (higher binds tighter). */
static int prec(const nf_expr *e) {
  switch ((nf_op)e->op) {
    case NF_OP_SELECT: return 1;
    case NF_OP_OR: return 2;
    case NF_OP_AND: return 3;
    case NF_OP_EQ:
    case NF_OP_NE: return 4;
    case NF_OP_LT:
    case NF_OP_LE:
    case NF_OP_GT:
    case NF_OP_GE: return 5;
    case NF_OP_ADD:
    case NF_OP_SUB: return 6;
    case NF_OP_MUL:
    case NF_OP_DIV:
    case NF_OP_FLOORDIV:
    case NF_OP_MOD: return 7;
    case NF_OP_NEG:
    case NF_OP_NOT: return 8;
    case NF_OP_CONST:
      /* a negative literal prints with a leading '-' */
      if (nf_dtype_is_float((nf_dtype)e->dtype) ? signbit(e->u.f) : e->u.i < 0)
        return 8;
      return 9;
    default: return 9;
  }
}

static const char *infix(nf_op op) {
  switch (op) {
    case NF_OP_ADD: return "+";
    case NF_OP_SUB: return "-";
    case NF_OP_MUL: return "*";
    case NF_OP_DIV: return "/";
    case NF_OP_FLOORDIV: return "//";
    case NF_OP_MOD: return "%";
    case NF_OP_LT: return "<";
    case NF_OP_LE: return "<=";
    case NF_OP_GT: return ">";
    case NF_OP_GE: return ">=";
    case NF_OP_EQ: return "==";
    case NF_OP_NE: return "!=";
    case NF_OP_AND: return "&&";
    case NF_OP_OR: return "||";
    default: return NULL;
  }
}

/* How a constant may be written: bare when the weak-literal rule gives its
 * dtype back. */
enum { CONST_TYPED = 0, CONST_BARE = 1 };

static void pexpr(pctx *P, const nf_expr *e, int const_mode);

static void pconst(pctx *P, const nf_expr *e, int const_mode) {
  nf_buf *b = P->out;
  nf_dtype t = (nf_dtype)e->dtype;
  if (t == NF_BOOL) {
    nf_buf_puts(b, e->u.i ? "true" : "false");
    return;
  }
  int bare = const_mode == CONST_BARE;
  if (!bare) {
    nf_buf_printf(b, "%s(", nf_dtype_name(t));
  }
  if (nf_dtype_is_float(t))
    put_float(b, e->u.f);
  else
    put_int(b, e->u.i);
  if (!bare) nf_buf_putc(b, ')');
}

static int default_bare(const nf_expr *e) {
  return e->dtype == NF_F32 || e->dtype == NF_I64 || e->dtype == NF_BOOL;
}

static void child(pctx *P, const nf_expr *c, int need_parens, int const_mode) {
  if (need_parens) nf_buf_putc(P->out, '(');
  pexpr(P, c, const_mode);
  if (need_parens) nf_buf_putc(P->out, ')');
}

static void pexpr(pctx *P, const nf_expr *e, int const_mode) {
  nf_buf *b = P->out;
  nf_op op = (nf_op)e->op;
  switch (op) {
    case NF_OP_CONST:
      pconst(P, e, const_mode);
      return;
    case NF_OP_VAR:
      nf_buf_puts(b, e->u.var < NF_MAX_VARS && P->vname[e->u.var]
                         ? P->vname[e->u.var]
                         : "?");
      return;
    case NF_OP_ACCESS:
      nf_buf_puts(b, P->tname[e->u.tensor]);
      nf_buf_putc(b, '(');
      for (int k = 0; k < e->n_args; k++) {
        if (k) nf_buf_puts(b, ", ");
        pexpr(P, e->args[k], CONST_BARE);
      }
      nf_buf_putc(b, ')');
      return;
    case NF_OP_NEG:
    case NF_OP_NOT: {
      nf_buf_putc(b, op == NF_OP_NEG ? '-' : '!');
      const nf_expr *a = e->args[0];
      /* A constant under '-' is written typed so it stays a constant
       * under a negation rather than folding into a negative literal. */
      child(P, a, prec(a) < 9, CONST_TYPED);
      return;
    }
    case NF_OP_CAST:
      nf_buf_printf(b, "%s(", nf_dtype_name((nf_dtype)e->dtype));
      pexpr(P, e->args[0], CONST_TYPED);
      nf_buf_putc(b, ')');
      return;
    case NF_OP_SELECT: {
      const nf_expr *c = e->args[0], *x = e->args[1], *y = e->args[2];
      int bare_x = y->op != NF_OP_CONST || default_bare(x);
      int bare_y = x->op != NF_OP_CONST || default_bare(y);
      child(P, c, prec(c) <= 1, CONST_BARE);
      nf_buf_puts(b, " ? ");
      child(P, x, prec(x) <= 1, bare_x ? CONST_BARE : CONST_TYPED);
      nf_buf_puts(b, " : ");
      child(P, y, prec(y) < 1, bare_y ? CONST_BARE : CONST_TYPED);
      return;
    }
    default:
      break;
  }
  const char *in = infix(op);
  if (e->n_args == 2) {
    const nf_expr *x = e->args[0], *y = e->args[1];
    int bare_x = y->op != NF_OP_CONST || default_bare(x);
    int bare_y = x->op != NF_OP_CONST || default_bare(y);
    if (in) {
      int p = prec(e);
      child(P, x, prec(x) < p, bare_x ? CONST_BARE : CONST_TYPED);
      nf_buf_printf(b, " %s ", in);
      child(P, y, prec(y) <= p, bare_y ? CONST_BARE : CONST_TYPED);
    } else {
      nf_buf_printf(b, "%s(", nf_op_name(op));
      pexpr(P, x, bare_x ? CONST_BARE : CONST_TYPED);
      nf_buf_puts(b, ", ");
      pexpr(P, y, bare_y ? CONST_BARE : CONST_TYPED);
      nf_buf_putc(b, ')');
    }
    return;
  }
  /* unary math */
  nf_buf_printf(b, "%s(", nf_op_name(op));
  const nf_expr *a = e->args[0];
  pexpr(P, a, default_bare(a) ? CONST_BARE : CONST_TYPED);
  nf_buf_putc(b, ')');
}

static void pdecl(pctx *P, uint32_t id) {
  const nf_tensor *t = &P->g->tensors[id];
  nf_buf_printf(P->out, "%s: %s[", P->tname[id], nf_dtype_name((nf_dtype)t->dtype));
  for (int k = 0; k < t->rank; k++)
    nf_buf_printf(P->out, "%s%" PRId64, k ? ", " : "", t->shape[k]);
  nf_buf_putc(P->out, ']');
}

static const char *redop_text(int r) {
  switch (r) {
    case NF_RED_SUM: return "+=!";
    case NF_RED_PROD: return "*=!";
    case NF_RED_MAX: return "max=!";
    case NF_RED_MIN: return "min=!";
    default: return "=";
  }
}

int nf_graph_print(const nf_graph *g, nf_buf *out) {
  nf_buf err = NF_BUF_INIT;
  if (nf_graph_validate(g, &err)) {
    nf_buf_free(&err);
    return NF_EINVAL;
  }
  nf_buf_free(&err);
  int rc = NF_OK;
  pctx P = {.g = g, .out = out};
  P.tname = calloc(g->n_tensors + 1, sizeof(char *));
  if (!P.tname) return NF_ENOMEM;
  for (uint32_t k = 0; k < g->n_tensors; k++) {
    P.tname[k] = make_name(g->tensors[k].name, "t", (int)k, P.tname, (int)k);
    if (!P.tname[k]) {
      rc = NF_ENOMEM;
      goto done;
    }
  }
  char *def_name = make_name(g->name, "graph", 0, NULL, 0);
  if (!def_name) {
    rc = NF_ENOMEM;
    goto done;
  }
  nf_buf_printf(out, "def %s(", def_name);
  free(def_name);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    if (k) nf_buf_puts(out, ", ");
    pdecl(&P, g->inputs[k]);
  }
  nf_buf_puts(out, ") -> (");
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    if (k) nf_buf_puts(out, ", ");
    pdecl(&P, g->outputs[k]);
  }
  nf_buf_puts(out, ") {\n");
  for (uint32_t s = 0; s < g->n_stmts; s++) {
    const nf_stmt *st = &g->stmts[s];
    const nf_tensor *t = &g->tensors[st->out];
    int n_vars = t->rank + st->n_red;
    /* Variable names: unique, and distinct from every tensor name. */
    char *used[NF_MAX_VARS + 1];
    for (int v = 0; v < n_vars; v++) {
      char *cand = make_name(st->var_names[v], "v", v, used, v);
      if (!cand) {
        rc = NF_ENOMEM;
        for (int j = 0; j < v; j++) free(used[j]);
        goto done;
      }
      for (int clash = 1; clash;) {
        clash = 0;
        for (uint32_t k = 0; k < g->n_tensors && !clash; k++)
          if (strcmp(P.tname[k], cand) == 0) clash = 1;
        if (clash) {
          nf_buf nb = NF_BUF_INIT;
          nf_buf_printf(&nb, "%s_", cand);
          free(cand);
          cand = make_name(nb.data, "v", v, used, v);
          nf_buf_free(&nb);
          if (!cand) {
            rc = NF_ENOMEM;
            for (int j = 0; j < v; j++) free(used[j]);
            goto done;
          }
        }
      }
      used[v] = cand;
      P.vname[v] = cand;
    }
    nf_buf_printf(out, "  %s(", P.tname[st->out]);
    for (int v = 0; v < t->rank; v++)
      nf_buf_printf(out, "%s%s", v ? ", " : "", P.vname[v]);
    nf_buf_printf(out, ") %s ", redop_text(st->red));
    pexpr(&P, st->rhs, default_bare(st->rhs) ? CONST_BARE : CONST_TYPED);
    int n_where = 0;
    if (t->kind == NF_T_LOCAL)
      for (int v = 0; v < t->rank; v++)
        nf_buf_printf(out, "%s%s in 0:%" PRId64, n_where++ ? ", " : " where ",
                      P.vname[v], t->shape[v]);
    for (int r = 0; r < st->n_red; r++) {
      nf_buf_printf(out, "%s%s in ", n_where++ ? ", " : " where ",
                    P.vname[t->rank + r]);
      put_int(out, st->red_lo[r]);
      nf_buf_putc(out, ':');
      int64_t hi;
      if (__builtin_add_overflow(st->red_lo[r], st->red_ext[r], &hi)) hi = INT64_MAX;
      put_int(out, hi);
    }
    nf_buf_putc(out, '\n');
    for (int v = 0; v < n_vars; v++) {
      free(used[v]);
      P.vname[v] = NULL;
    }
  }
  nf_buf_puts(out, "}\n");
  if (out->oom) rc = NF_ENOMEM;
done:
  for (uint32_t k = 0; k < g->n_tensors; k++) free(P.tname[k]);
  free(P.tname);
  return rc;
}
