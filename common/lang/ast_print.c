/* lang/ast_print.c - canonical `.nf` text of a syntax tree, and
 * structural equality of trees.
 *
 * The canonical form is what `neoflow fmt`-like tools and messages show:
 * imports first, one statement per line, two-space indents, single spaces
 * around binary operators, minimal parentheses, floats in the shortest
 * form that reads back to the same double.  Its defining property:
 * parsing printed text yields a structurally equal tree (see
 * nf__ast_file_equal), so printing is a fixed point after one round.
 *
 * Parenthesisation: a child is wrapped when its precedence is lower than
 * its parent's, or equal on the right of a (left-associative) binary
 * operator; a unary operand that is itself unary is wrapped (`-(-x)`); a
 * select's condition and its middle operand are wrapped when they are
 * selects (the latter only for readability); the select in a range bound
 * is wrapped too.  Inside `<...>` lists a `>` comparison is wrapped,
 * since the parser reads `>` there as the end of the list.
 *
 * The printer recurses on expressions; the parser bounds their height.
 * It never fails: an nf_buf remembers allocation failure itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ast.h"

/* Binding strength: select 1 (loosest) .. unary 8, leaves 9. */
static int prec(const nf_ast_expr *e) {
  switch (e->kind) {
  case NF_A_SELECT: return 1;
  case NF_A_UNARY: return 8;
  case NF_A_BINARY:
    switch (e->op) {
    case NF_OP_OR: return 2;
    case NF_OP_AND: return 3;
    case NF_OP_EQ: case NF_OP_NE: return 4;
    case NF_OP_LT: case NF_OP_LE: case NF_OP_GT: case NF_OP_GE: return 5;
    case NF_OP_ADD: case NF_OP_SUB: return 6;
    default: return 7;
    }
  default: return 9;
  }
}

static const char *op_text(int op) {
  switch (op) {
  case NF_OP_NEG: return "-";
  case NF_OP_NOT: return "!";
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
  default: return "?";
  }
}

static const char *dtype_text(int t) {
  static const char *const names[NF_N_DTYPES] = {
      [NF_BOOL] = "bool", [NF_I32] = "i32",   [NF_I64] = "i64",
      [NF_F16] = "f16",   [NF_BF16] = "bf16", [NF_F32] = "f32",
      [NF_F64] = "f64"};
  return t >= 0 && t < NF_N_DTYPES ? names[t] : "?";
}

static const char *redop_text(int red) {
  switch (red) {
  case NF_RED_NONE: return "=";
  case NF_RED_SUM: return "+=!";
  case NF_RED_PROD: return "*=!";
  case NF_RED_MAX: return "max=!";
  case NF_RED_MIN: return "min=!";
  default: return "?";
  }
}

/* The shortest %.Ng (N = 1..17) that reads back as v, written without an
 * exponent when its decimal exponent is 0..15 (100.0, not 1e+02), and
 * always with a '.', an exponent, "inf" or "nan" so it lexes as a float
 * (inf and nan never come from the parser). */
static void put_float(nf_buf *b, double v) {
  char s[48];
  if (isnan(v)) {
    nf_buf_puts(b, "nan");
    return;
  }
  int digits = 1;
  for (; digits <= 17; digits++) {
    snprintf(s, sizeof s, "%.*g", digits, v);
    if (strtod(s, NULL) == v) break;
  }
  const char *e = strchr(s, 'e');
  if (e && !isinf(v)) {
    int x = atoi(e + 1);
    if (x >= 0 && x < 16) {
      char plain[48];
      snprintf(plain, sizeof plain, "%.*g", x + 1, v);
      if (strtod(plain, NULL) == v && !strchr(plain, 'e'))
        memcpy(s, plain, sizeof s);
    }
  }
  nf_buf_puts(b, s);
  if (!strpbrk(s, ".eEni")) nf_buf_puts(b, ".0");
}

static void expr(const nf_ast_expr *e, nf_buf *b, int no_gt);
static void texpr(const nf_ast_expr *e, nf_buf *b);

static void wrapped(const nf_ast_expr *e, nf_buf *b, int wrap, int no_gt) {
  if (wrap) nf_buf_putc(b, '(');
  expr(e, b, wrap ? 0 : no_gt);
  if (wrap) nf_buf_putc(b, ')');
}

/* A call's `<name = value, ...>` (nothing without parameters). */
static void call_params(const nf_ast_param_arg *pa, int n, nf_buf *b) {
  if (!n) return;
  nf_buf_putc(b, '<');
  for (int i = 0; i < n; i++) {
    if (i) nf_buf_puts(b, ", ");
    nf_buf_printf(b, "%s = ", pa[i].name);
    expr(pa[i].value, b, 1);
  }
  nf_buf_putc(b, '>');
}

static void expr(const nf_ast_expr *e, nf_buf *b, int no_gt) {
  if (!e) {
    nf_buf_puts(b, "<null>");
    return;
  }
  switch (e->kind) {
  case NF_A_INT:
    nf_buf_printf(b, "%lld", (long long)e->ival);
    break;
  case NF_A_FLOAT:
    put_float(b, e->fval);
    break;
  case NF_A_BOOL:
    nf_buf_puts(b, e->ival ? "true" : "false");
    break;
  case NF_A_NAME:
    nf_buf_puts(b, e->name);
    break;
  case NF_A_PACK:
    nf_buf_putc(b, '*');
    nf_buf_puts(b, e->name);
    break;
  case NF_A_UNARY: {
    const nf_ast_expr *a = e->args[0];
    nf_buf_puts(b, op_text(e->op));
    wrapped(a, b, prec(a) < 8 || a->kind == NF_A_UNARY, no_gt);
    break;
  }
  case NF_A_BINARY: {
    int p = prec(e);
    if (no_gt && e->op == NF_OP_GT) {
      wrapped(e, b, 1, 0);
      break;
    }
    wrapped(e->args[0], b, prec(e->args[0]) < p, no_gt);
    nf_buf_putc(b, ' ');
    nf_buf_puts(b, op_text(e->op));
    nf_buf_putc(b, ' ');
    wrapped(e->args[1], b, prec(e->args[1]) <= p, no_gt);
    break;
  }
  case NF_A_SELECT:
    wrapped(e->args[0], b, prec(e->args[0]) <= 1, no_gt);
    nf_buf_puts(b, " ? ");
    wrapped(e->args[1], b, prec(e->args[1]) <= 1, no_gt);
    nf_buf_puts(b, " : ");
    wrapped(e->args[2], b, 0, no_gt);
    break;
  case NF_A_APPLY:
    nf_buf_puts(b, e->name);
    if (e->sub) {
      nf_buf_putc(b, '[');
      expr(e->sub, b, 0);
      nf_buf_putc(b, ']');
    }
    nf_buf_putc(b, '(');
    for (int i = 0; i < e->n_args; i++) {
      if (i) nf_buf_puts(b, ", ");
      expr(e->args[i], b, 0);
    }
    nf_buf_putc(b, ')');
    break;
  case NF_A_CALL:
    texpr(e, b);
    break;
  default:
    nf_buf_puts(b, "<?>");
  }
}

/* A tensor expression (the right side of `T = ...`): names with their
 * subscripts or family ranges, calls, + - * / and one comparison. */
static void texpr(const nf_ast_expr *e, nf_buf *b) {
  switch (e->kind) {
  case NF_A_NAME:
    nf_buf_puts(b, e->name);
    if (e->sub) {
      nf_buf_putc(b, '[');
      wrapped(e->sub, b, e->sub_hi && e->sub->kind == NF_A_SELECT, 0);
      if (e->sub_hi) {
        nf_buf_putc(b, ':');
        wrapped(e->sub_hi, b, e->sub_hi->kind == NF_A_SELECT, 0);
      }
      nf_buf_putc(b, ']');
    }
    return;
  case NF_A_CALL:
    nf_buf_puts(b, e->name);
    call_params(e->params, e->n_params, b);
    nf_buf_putc(b, '(');
    for (int i = 0; i < e->n_args; i++) {
      if (i) nf_buf_puts(b, ", ");
      texpr(e->args[i], b);
    }
    nf_buf_putc(b, ')');
    return;
  case NF_A_UNARY: {
    const nf_ast_expr *a = e->args[0];
    nf_buf_puts(b, op_text(e->op));
    int wrap = prec(a) < 8 || a->kind == NF_A_UNARY;
    if (wrap) nf_buf_putc(b, '(');
    texpr(a, b);
    if (wrap) nf_buf_putc(b, ')');
    return;
  }
  case NF_A_BINARY: {
    int p = prec(e);
    const nf_ast_expr *l = e->args[0], *r = e->args[1];
    /* a plain name before '<' would start its call's parameters */
    int wl = prec(l) < p || ((e->op == NF_OP_LT || e->op == NF_OP_LE) && l->kind == NF_A_NAME &&
                              !l->sub);
    int wr = prec(r) <= p;
    if (wl) nf_buf_putc(b, '(');
    texpr(l, b);
    if (wl) nf_buf_putc(b, ')');
    nf_buf_printf(b, " %s ", op_text(e->op));
    if (wr) nf_buf_putc(b, '(');
    texpr(r, b);
    if (wr) nf_buf_putc(b, ')');
    return;
  }
  default:
    expr(e, b, 0);
  }
}

void nf__ast_print_expr(const nf_ast_expr *e, nf_buf *out) { expr(e, out, 0); }

/* A range bound: selects are wrapped so `LO:HI` reads unambiguously. */
static void bound(const nf_ast_expr *e, nf_buf *b) {
  wrapped(e, b, e && e->kind == NF_A_SELECT, 0);
}

static void tref(const nf_ast_tref *r, nf_buf *b) {
  nf_buf_puts(b, r->name);
  if (r->sub) {
    nf_buf_putc(b, '[');
    expr(r->sub, b, 0);
    nf_buf_putc(b, ']');
  }
}

/* NAME: DTYPE[dims] */
static void tdecl(const nf_ast_tdecl *t, nf_buf *b) {
  nf_buf_printf(b, "%s: %s[", t->name, dtype_text(t->dtype));
  for (int j = 0; j < t->n_dims; j++) {
    if (j) nf_buf_puts(b, ", ");
    expr(t->dims[j], b, 0);
  }
  nf_buf_putc(b, ']');
}

static void tdecls(const nf_ast_tdecl *t, int n, nf_buf *b) {
  nf_buf_putc(b, '(');
  for (int i = 0; i < n; i++) {
    if (i) nf_buf_puts(b, ", ");
    tdecl(&t[i], b);
  }
  nf_buf_putc(b, ')');
}

void nf__ast_print_signature(const nf_ast_def *d, nf_buf *out) {
  nf_buf_puts(out, d->name);
  if (d->n_params) {
    nf_buf_putc(out, '<');
    for (int i = 0; i < d->n_params; i++) {
      if (i) nf_buf_puts(out, ", ");
      nf_buf_puts(out, d->params[i].name);
      if (d->params[i].dflt) {
        nf_buf_puts(out, " = ");
        expr(d->params[i].dflt, out, 1);
      }
    }
    nf_buf_putc(out, '>');
  }
  tdecls(d->inputs, d->n_inputs, out);
  nf_buf_puts(out, " -> ");
  tdecls(d->outputs, d->n_outputs, out);
}

static void indent(nf_buf *b, int level) {
  for (int i = 0; i < level; i++) nf_buf_puts(b, "  ");
}

static void stmt(const nf_ast_stmt *s, nf_buf *b, int level) {
  indent(b, level);
  switch (s->kind) {
  case NF_S_ELEM:
    tref(&s->lhs, b);
    nf_buf_putc(b, '(');
    for (int i = 0; i < s->n_idx; i++) {
      if (i) nf_buf_puts(b, ", ");
      expr(s->idx[i], b, 0);
    }
    nf_buf_printf(b, ") %s ", redop_text(s->red));
    expr(s->rhs, b, 0);
    for (int i = 0; i < s->n_ranges; i++) {
      nf_buf_puts(b, i ? ", " : " where ");
      nf_buf_printf(b, "%s in ", s->ranges[i].name);
      bound(s->ranges[i].lo, b);
      nf_buf_putc(b, ':');
      bound(s->ranges[i].hi, b);
    }
    break;
  case NF_S_CALL:
    for (int i = 0; i < s->n_results; i++) {
      if (i) nf_buf_puts(b, ", ");
      tref(&s->results[i], b);
    }
    nf_buf_puts(b, " = ");
    if (s->value) {
      texpr(s->value, b);
      break;
    }
    if (!s->callee) { /* a copy */
      if (s->n_args > 0) tref(&s->args[0], b);
      break;
    }
    nf_buf_puts(b, s->callee);
    call_params(s->params, s->n_params, b);
    nf_buf_putc(b, '(');
    for (int i = 0; i < s->n_args; i++) {
      if (i) nf_buf_puts(b, ", ");
      tref(&s->args[i], b);
    }
    nf_buf_putc(b, ')');
    break;
  case NF_S_FOR:
    nf_buf_printf(b, "for %s in ", s->var);
    bound(s->lo, b);
    nf_buf_putc(b, ':');
    bound(s->hi, b);
    nf_buf_puts(b, " {\n");
    for (int i = 0; i < s->n_body; i++) stmt(s->body[i], b, level + 1);
    indent(b, level);
    nf_buf_putc(b, '}');
    break;
  case NF_S_PARAM:
    /* Arguments as written (an omitted optional one stays omitted). */
    nf_buf_puts(b, "param ");
    tdecl(&s->decl, b);
    nf_buf_printf(b, " = %s", nf_init_name((nf_init_kind)s->init));
    if (s->n_init_args > 0) {
      nf_buf_putc(b, '(');
      for (int i = 0; i < s->n_init_args && i < 2; i++) {
        if (i) nf_buf_puts(b, ", ");
        put_float(b, s->init_args[i]);
      }
      nf_buf_putc(b, ')');
    }
    break;
  default:
    nf_buf_puts(b, "<?>");
  }
  nf_buf_putc(b, '\n');
}

void nf__ast_print_def(const nf_ast_def *d, nf_buf *out) {
  nf_buf_puts(out, "def ");
  nf__ast_print_signature(d, out);
  for (int i = 0; i < d->n_wheres; i++) {
    nf_buf_puts(out, i ? ", " : "\n    where ");
    nf_buf_printf(out, "%s = ", d->wheres[i].name);
    expr(d->wheres[i].value, out, 0);
  }
  for (int i = 0; i < d->n_requires; i++) {
    nf_buf_puts(out, i ? ", " : "\n    require ");
    expr(d->requires[i], out, 0);
  }
  nf_buf_puts(out, " {\n");
  for (int i = 0; i < d->n_body; i++) stmt(d->body[i], out, 1);
  nf_buf_puts(out, "}\n");
}

void nf__ast_print_file(const nf_ast_file *f, nf_buf *out) {
  for (int i = 0; i < f->n_imports; i++) {
    const nf_ast_import *im = &f->imports[i];
    if (im->lib)
      nf_buf_printf(out, "import %s\n", im->lib);
    else
      nf_buf_printf(out, "import \"%s\"\n", im->path ? im->path : "");
  }
  for (int i = 0; i < f->n_defs; i++) {
    if (i || f->n_imports) nf_buf_putc(out, '\n');
    nf__ast_print_def(f->defs[i], out);
  }
}

/* ---- structural equality ---- */

static int str_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

/* Declared where used (tests, fuzzers) until nf_ast.h carries it:
 * whether two expressions are equal ignoring locations and float texts
 * (floats compare by bit pattern). */
int nf__ast_expr_equal(const nf_ast_expr *a, const nf_ast_expr *b);
int nf__ast_expr_equal(const nf_ast_expr *a, const nf_ast_expr *b) {
  if (!a || !b) return a == b;
  if (a->kind != b->kind || a->n_args != b->n_args) return 0;
  switch (a->kind) {
  case NF_A_INT:
  case NF_A_BOOL:
    return a->ival == b->ival;
  case NF_A_FLOAT:
    return memcmp(&a->fval, &b->fval, sizeof a->fval) == 0;
  case NF_A_NAME:
    return str_eq(a->name, b->name) && nf__ast_expr_equal(a->sub, b->sub) &&
           nf__ast_expr_equal(a->sub_hi, b->sub_hi);
  case NF_A_PACK:
    return str_eq(a->name, b->name);
  case NF_A_UNARY:
  case NF_A_BINARY:
    if (a->op != b->op) return 0;
    break;
  case NF_A_APPLY:
    if (!str_eq(a->name, b->name) || !nf__ast_expr_equal(a->sub, b->sub))
      return 0;
    break;
  case NF_A_CALL:
    if (!str_eq(a->name, b->name) || a->n_params != b->n_params) return 0;
    for (int i = 0; i < a->n_params; i++)
      if (!str_eq(a->params[i].name, b->params[i].name) ||
          !nf__ast_expr_equal(a->params[i].value, b->params[i].value))
        return 0;
    break;
  default:
    break;
  }
  for (int i = 0; i < a->n_args; i++)
    if (!nf__ast_expr_equal(a->args[i], b->args[i])) return 0;
  return 1;
}

static int tref_eq(const nf_ast_tref *a, const nf_ast_tref *b) {
  return str_eq(a->name, b->name) && nf__ast_expr_equal(a->sub, b->sub);
}

static int exprs_eq(nf_ast_expr *const *a, nf_ast_expr *const *b, int n) {
  for (int i = 0; i < n; i++)
    if (!nf__ast_expr_equal(a[i], b[i])) return 0;
  return 1;
}

static int tdecls_eq(const nf_ast_tdecl *a, const nf_ast_tdecl *b, int n) {
  for (int i = 0; i < n; i++)
    if (!str_eq(a[i].name, b[i].name) || a[i].dtype != b[i].dtype ||
        a[i].n_dims != b[i].n_dims ||
        !exprs_eq(a[i].dims, b[i].dims, a[i].n_dims))
      return 0;
  return 1;
}

static int stmts_eq(nf_ast_stmt *const *a, nf_ast_stmt *const *b, int n);

static int stmt_eq(const nf_ast_stmt *a, const nf_ast_stmt *b) {
  if (a->kind != b->kind) return 0;
  switch (a->kind) {
  case NF_S_ELEM:
    if (!tref_eq(&a->lhs, &b->lhs) || a->n_idx != b->n_idx ||
        a->red != b->red || a->n_ranges != b->n_ranges ||
        !exprs_eq(a->idx, b->idx, a->n_idx) ||
        !nf__ast_expr_equal(a->rhs, b->rhs))
      return 0;
    for (int i = 0; i < a->n_ranges; i++)
      if (!str_eq(a->ranges[i].name, b->ranges[i].name) ||
          !nf__ast_expr_equal(a->ranges[i].lo, b->ranges[i].lo) ||
          !nf__ast_expr_equal(a->ranges[i].hi, b->ranges[i].hi))
        return 0;
    return 1;
  case NF_S_CALL:
    if (a->n_results != b->n_results || !str_eq(a->callee, b->callee) ||
        a->n_params != b->n_params || a->n_args != b->n_args ||
        !nf__ast_expr_equal(a->value, b->value))
      return 0;
    for (int i = 0; i < a->n_results; i++)
      if (!tref_eq(&a->results[i], &b->results[i])) return 0;
    for (int i = 0; i < a->n_params; i++)
      if (!str_eq(a->params[i].name, b->params[i].name) ||
          !nf__ast_expr_equal(a->params[i].value, b->params[i].value))
        return 0;
    for (int i = 0; i < a->n_args; i++)
      if (!tref_eq(&a->args[i], &b->args[i])) return 0;
    return 1;
  case NF_S_FOR:
    return str_eq(a->var, b->var) && nf__ast_expr_equal(a->lo, b->lo) &&
           nf__ast_expr_equal(a->hi, b->hi) && a->n_body == b->n_body &&
           stmts_eq(a->body, b->body, a->n_body);
  case NF_S_PARAM:
    if (!tdecls_eq(&a->decl, &b->decl, 1) || a->init != b->init ||
        a->n_init_args != b->n_init_args)
      return 0;
    for (int i = 0; i < a->n_init_args && i < 2; i++) /* by bits */
      if (memcmp(&a->init_args[i], &b->init_args[i], sizeof(double)) != 0)
        return 0;
    return 1;
  default:
    return 0;
  }
}

static int stmts_eq(nf_ast_stmt *const *a, nf_ast_stmt *const *b, int n) {
  for (int i = 0; i < n; i++)
    if (!stmt_eq(a[i], b[i])) return 0;
  return 1;
}

static int def_eq(const nf_ast_def *a, const nf_ast_def *b) {
  if (!str_eq(a->name, b->name) || a->n_params != b->n_params ||
      a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs ||
      a->n_wheres != b->n_wheres || a->n_requires != b->n_requires ||
      a->n_body != b->n_body)
    return 0;
  for (int i = 0; i < a->n_params; i++)
    if (!str_eq(a->params[i].name, b->params[i].name) ||
        !nf__ast_expr_equal(a->params[i].dflt, b->params[i].dflt))
      return 0;
  for (int i = 0; i < a->n_wheres; i++)
    if (!str_eq(a->wheres[i].name, b->wheres[i].name) ||
        !nf__ast_expr_equal(a->wheres[i].value, b->wheres[i].value))
      return 0;
  return tdecls_eq(a->inputs, b->inputs, a->n_inputs) &&
         tdecls_eq(a->outputs, b->outputs, a->n_outputs) &&
         exprs_eq(a->requires, b->requires, a->n_requires) &&
         stmts_eq(a->body, b->body, a->n_body);
}

/* Declared where used until nf_ast.h carries it: whether two files have
 * the same imports (in order) and structurally equal defs. */
int nf__ast_file_equal(const nf_ast_file *a, const nf_ast_file *b);
int nf__ast_file_equal(const nf_ast_file *a, const nf_ast_file *b) {
  if (a->n_imports != b->n_imports || a->n_defs != b->n_defs) return 0;
  for (int i = 0; i < a->n_imports; i++)
    if (!str_eq(a->imports[i].path, b->imports[i].path) ||
        !str_eq(a->imports[i].lib, b->imports[i].lib))
      return 0;
  for (int i = 0; i < a->n_defs; i++)
    if (!def_eq(a->defs[i], b->defs[i])) return 0;
  return 1;
}
