/* lang/parser.c - recursive-descent parser of `.nf` source (see nf_ast.h
 * and docs/language.md for the grammar).
 *
 * Invariants:
 *  - One token of lookahead (p->tok).  cur() drops NEWLINE tokens while
 *    p->nl_skip > 0, i.e. inside ( ) [ ] < > and a def header; the lexer
 *    drops newlines after tokens that cannot end a statement.
 *  - Every parse function returns NULL (or 0) after an error, which was
 *    reported once (p->failed stops further reports) or was an allocation
 *    failure (p->oom).  The statement loop (block()) and the file loop
 *    (parse_file()) are the only recovery points: they restore nl_skip,
 *    no_gt and depth, skip to the next statement or def, and clear failed,
 *    so each statement reports at most one error.
 *  - Recursion is bounded: expression nesting (parentheses, unary chains,
 *    selects, arguments) and `for` nesting count against
 *    NF_PARSE_MAX_DEPTH, and every expression tree is at most
 *    NF__AST_MAX_HEIGHT nodes tall (long left-associative chains too), so
 *    recursive walkers of the AST are safe.
 *  - All nodes and strings come from the caller's arena; nothing else is
 *    allocated, so there is nothing to free on any path.
 *
 * Grammar decisions beyond docs/language.md:
 *  - `<` is a parameter list only right after `def NAME` and after the
 *    callee of a call (`T = f<p = 1>(X)`); elsewhere it compares.  Inside
 *    a list `>` ends it, so a `>` comparison there needs parentheses
 *    (`<p = (a > 1)>`); `>=` needs none.
 *  - A statement is an element statement when its first tensor reference
 *    is followed by `(`, a call or copy when followed by `,` or `=`.
 *    `T = NAME` and `T = NAME[e]` are copies (callee NULL); a copy has
 *    one result.
 *  - `max=!` and `min=!` must be written without spaces; `+=`, `*=`,
 *    `max=`, `min=` without `!` are errors that say to add it.
 *  - The `where` ranges of an element statement may start on the next
 *    line (`where` cannot start a statement).
 *  - `param` is a contextual keyword: a statement is a param declaration
 *    only when it starts with the identifier `param` followed by another
 *    identifier and ':' (two tokens of lookahead, on a copy of the lexer),
 *    so `param` stays an ordinary tensor name elsewhere.  A declaration
 *    inside a `for` body is a syntax error.  The initializer's name, arity
 *    and argument ranges (uniform LO <= HI, normal STD >= 0) are checked
 *    here; the dtype and dims are checked by module.c.
 *  - On error *out is NULL: a partial tree is never returned.
 *
 * The parser does not resolve names or check types: `max(a, b)`, `f32(x)`
 * and `A(i)` are all NF_A_APPLY, and the elaborator decides. */
#include "nf_ast.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lexer.h"

/* The tallest expression tree the parser builds (see the invariants). */
#define NF__AST_MAX_HEIGHT (4 * NF_PARSE_MAX_DEPTH)

typedef struct parser {
  nf_arena *a;
  const nf_src *src;
  nf_diag *d;
  nf_lexer lx;
  nf_token tok;
  int nl_skip;  /* > 0: NEWLINE tokens are skipped */
  int no_gt;    /* '>' closes a <...> list instead of comparing */
  int depth;    /* current nesting, against NF_PARSE_MAX_DEPTH */
  int h;        /* height of the expression last returned */
  int failed;   /* an error was reported in the current statement */
  int unclosed; /* a missing '}' was reported; outer blocks end quietly */
  int in_for;   /* > 0: parsing a `for` body */
  int n_errors;
  int oom;
} parser;

/* ---- tokens ---- */

static void advance(parser *p) {
  nf__lex_next(&p->lx, &p->tok);
  if (p->lx.oom) p->oom = 1;
}

static const nf_token *cur(parser *p) {
  while (p->nl_skip > 0 && p->tok.kind == NF_T_NEWLINE) advance(p);
  return &p->tok;
}

static int at_kind(parser *p, int kind) { return cur(p)->kind == kind; }

static int accept(parser *p, int kind) {
  if (!at_kind(p, kind)) return 0;
  advance(p);
  return 1;
}

/* A token for a message: 'text' cut at 40 bytes, or a description. */
static void describe(const parser *p, const nf_token *t, char *out,
                     size_t cap) {
  switch (t->kind) {
  case NF_T_EOF:
  case NF_T_NEWLINE:
  case NF_T_STRING:
  case NF_T_ERROR:
    snprintf(out, cap, "%s", nf__tok_kind_name(t->kind));
    return;
  default: {
    size_t n = t->len > 40 ? 40 : t->len;
    snprintf(out, cap, "'%.*s%s'", (int)n, p->src->text + t->off,
             t->len > 40 ? "..." : "");
  }
  }
}

/* ---- errors ---- */

static void verror(parser *p, nf_loc loc, const char *fmt, va_list ap) {
  if (p->failed || p->oom) return;
  p->failed = 1;
  p->n_errors++;
  if (!p->d) return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  nf_diag_error(p->d, loc, "%s", msg);
}

static void error_at(parser *p, nf_loc loc, const char *fmt, ...)
    NF_PRINTF(3, 4);
static void error_at(parser *p, nf_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(p, loc, fmt, ap);
  va_end(ap);
}

/* "expected <what>, found <current token>" at the current token; a
 * lexical error token reports its own message instead. */
static void expected(parser *p, const char *fmt, ...) NF_PRINTF(2, 3);
static void expected(parser *p, const char *fmt, ...) {
  const nf_token *t = cur(p);
  if (t->kind == NF_T_ERROR) {
    error_at(p, t->loc, "%s", t->msg);
    return;
  }
  char what[320], found[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  describe(p, t, found, sizeof found);
  error_at(p, t->loc, "expected %s, found %s", what, found);
}

static void note_at(parser *p, nf_loc loc, const char *msg) {
  if (p->d && !p->oom) nf_diag_note(p->d, loc, "%s", msg);
}

/* Enters one level of nesting; reports and returns 0 past the limit. */
static int enter(parser *p, nf_loc loc, const char *what) {
  if (p->depth >= NF_PARSE_MAX_DEPTH) {
    error_at(p, loc, "%s nested too deeply (the limit is %d levels)", what,
             NF_PARSE_MAX_DEPTH);
    return 0;
  }
  p->depth++;
  return 1;
}

/* Records the height of a new node from its tallest child. */
static int set_height(parser *p, nf_loc loc, int child_h) {
  p->h = child_h + 1;
  if (p->h > NF__AST_MAX_HEIGHT) {
    error_at(p, loc, "expression nested too deeply (the limit is %d levels)",
             NF_PARSE_MAX_DEPTH);
    return 0;
  }
  return 1;
}

/* ---- allocation ---- */

static void *alloc(parser *p, size_t n) {
  void *m = nf_arena_alloc(p->a, n);
  if (!m) p->oom = 1;
  return m;
}

static const char *tok_str(parser *p, const nf_token *t) {
  char *s = nf_arena_strndup(p->a, p->src->text + t->off, t->len);
  if (!s) p->oom = 1;
  return s;
}

/* Makes room for element n of a growable arena array of el-byte elements
 * whose capacity is *cap; returns the (possibly moved) array, or NULL on
 * OOM.  Arena memory is zeroed, so the new element is zero. */
static void *grow(parser *p, void *data, int n, int *cap, size_t el) {
  if (n < *cap) return data;
  if (*cap > INT_MAX / 2) {
    p->oom = 1;
    return NULL;
  }
  int ncap = *cap ? *cap * 2 : 4;
  char *nd = alloc(p, (size_t)ncap * el);
  if (!nd) return NULL;
  if (n) memcpy(nd, data, (size_t)n * el);
  *cap = ncap;
  return nd;
}

/* Appends a zeroed element to arr (count n, capacity cap) and yields a
 * pointer to it, or NULL on OOM. */
#define PUSH(p, arr, n, cap)                                              \
  ((arr) = grow((p), (arr), (n), &(cap), sizeof *(arr)),                  \
   (arr) ? &(arr)[(n)++] : NULL)

static nf_ast_expr *new_expr(parser *p, int kind, nf_loc loc) {
  nf_ast_expr *e = alloc(p, sizeof *e);
  if (!e) return NULL;
  e->kind = (uint8_t)kind;
  e->loc = loc;
  return e;
}

/* An identifier that must be there, copied; NULL after an error. */
static const char *expect_name(parser *p, nf_loc *loc, const char *fmt, ...)
    NF_PRINTF(3, 4);
static const char *expect_name(parser *p, nf_loc *loc, const char *fmt, ...) {
  const nf_token *t = cur(p);
  if (t->kind != NF_T_IDENT) {
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    expected(p, "%s", what);
    return NULL;
  }
  if (loc) *loc = t->loc;
  const char *s = tok_str(p, t);
  advance(p);
  return s;
}

/* ---- expressions ---- */

static nf_ast_expr *parse_expr(parser *p);

static const char pack_msg[] =
    "a pack '*%s' can only be an index, a dim or a left-side variable, "
    "not part of arithmetic";

/* *NAME (the current token is '*'). */
static nf_ast_expr *parse_pack(parser *p) {
  nf_loc loc = cur(p)->loc;
  advance(p);
  const char *name = expect_name(p, NULL, "a name after '*' (a pack)");
  if (!name) return NULL;
  nf_ast_expr *e = new_expr(p, NF_A_PACK, loc);
  if (!e) return NULL;
  e->name = name;
  p->h = 1;
  return e;
}

/* A pack followed by something other than a separator is arithmetic on a
 * pack; returns 0 after reporting it. */
static int pack_alone(parser *p, const nf_ast_expr *pk) {
  switch (cur(p)->kind) {
  case NF_T_PLUS: case NF_T_MINUS: case NF_T_STAR: case NF_T_SLASH:
  case NF_T_SLASHSLASH: case NF_T_PERCENT: case NF_T_LT: case NF_T_LE:
  case NF_T_GT: case NF_T_GE: case NF_T_EQEQ: case NF_T_NE:
  case NF_T_ANDAND: case NF_T_OROR: case NF_T_QUESTION:
    error_at(p, pk->loc, pack_msg, pk->name);
    return 0;
  default:
    return 1;
  }
}

/* An apply argument or a dim: a pack or an expression. */
static nf_ast_expr *parse_arg(parser *p) {
  if (at_kind(p, NF_T_STAR)) {
    nf_ast_expr *e = parse_pack(p);
    if (!e || !pack_alone(p, e)) return NULL;
    return e;
  }
  return parse_expr(p);
}

/* '[' expr ']' (the current token is '['), or with hi '[' expr [':' expr]
 * ']' (a range of family members in a tensor expression, its end into
 * *hi); NULL after an error. */
static nf_ast_expr *parse_subscript_range(parser *p, const char *name, nf_ast_expr **hi) {
  int nl = p->nl_skip, ng = p->no_gt;
  if (!enter(p, cur(p)->loc, "expression")) return NULL;
  advance(p);
  p->nl_skip++;
  p->no_gt = 0;
  nf_ast_expr *e = parse_expr(p);
  if (!e) return NULL;
  if (hi && accept(p, NF_T_COLON) && !(*hi = parse_expr(p))) return NULL;
  if (!accept(p, NF_T_RBRACK)) {
    expected(p, "']' after the subscript of '%.64s'", name);
    return NULL;
  }
  p->nl_skip = nl;
  p->no_gt = ng;
  p->depth--;
  return e;
}

static nf_ast_expr *parse_subscript(parser *p, const char *name) {
  return parse_subscript_range(p, name, NULL);
}

/* NAME '(' args ')' with NAME (and its subscript) already read. */
static nf_ast_expr *parse_apply(parser *p, nf_ast_expr *e) {
  nf_loc open = cur(p)->loc;
  int nl = p->nl_skip, ng = p->no_gt, cap = 0;
  int h = e->sub ? p->h : 0;
  if (!enter(p, open, "expression")) return NULL;
  advance(p);
  p->nl_skip++;
  p->no_gt = 0;
  if (!at_kind(p, NF_T_RPAREN)) {
    for (;;) {
      nf_ast_expr *a = parse_arg(p);
      if (!a) return NULL;
      if (p->h > h) h = p->h;
      nf_ast_expr **slot = PUSH(p, e->args, e->n_args, cap);
      if (!slot) return NULL;
      *slot = a;
      if (!accept(p, NF_T_COMMA)) break;
    }
  }
  if (!accept(p, NF_T_RPAREN)) {
    expected(p, "')' after the arguments of '%.64s'", e->name);
    return NULL;
  }
  p->nl_skip = nl;
  p->no_gt = ng;
  p->depth--;
  if (!set_height(p, e->loc, h)) return NULL;
  return e;
}

static nf_ast_expr *parse_primary(parser *p) {
  const nf_token *t = cur(p);
  nf_ast_expr *e;
  switch (t->kind) {
  case NF_T_INT:
    if (!(e = new_expr(p, NF_A_INT, t->loc))) return NULL;
    e->ival = t->ival;
    advance(p);
    p->h = 1;
    return e;
  case NF_T_FLOAT:
    if (!(e = new_expr(p, NF_A_FLOAT, t->loc))) return NULL;
    e->fval = t->fval;
    e->text = t->text;
    advance(p);
    p->h = 1;
    return e;
  case NF_T_TRUE:
  case NF_T_FALSE:
    if (!(e = new_expr(p, NF_A_BOOL, t->loc))) return NULL;
    e->ival = t->kind == NF_T_TRUE;
    advance(p);
    p->h = 1;
    return e;
  case NF_T_IDENT: {
    nf_loc loc = t->loc;
    const char *name = tok_str(p, t);
    if (!name) return NULL;
    advance(p);
    if (at_kind(p, NF_T_LBRACK)) {
      if (!(e = new_expr(p, NF_A_APPLY, loc))) return NULL;
      e->name = name;
      if (!(e->sub = parse_subscript(p, name))) return NULL;
      if (!at_kind(p, NF_T_LPAREN)) {
        expected(p, "'(' with the indices of '%.64s[...]'", name);
        return NULL;
      }
      return parse_apply(p, e);
    }
    if (at_kind(p, NF_T_LPAREN)) {
      if (!(e = new_expr(p, NF_A_APPLY, loc))) return NULL;
      e->name = name;
      return parse_apply(p, e);
    }
    if (!(e = new_expr(p, NF_A_NAME, loc))) return NULL;
    e->name = name;
    p->h = 1;
    return e;
  }
  case NF_T_LPAREN: {
    nf_loc open = t->loc;
    int nl = p->nl_skip, ng = p->no_gt;
    if (!enter(p, open, "expression")) return NULL;
    advance(p);
    p->nl_skip++;
    p->no_gt = 0;
    e = parse_expr(p);
    if (!e) return NULL;
    if (!accept(p, NF_T_RPAREN)) {
      expected(p, "')' to close '('");
      note_at(p, open, "'(' opened here");
      return NULL;
    }
    p->nl_skip = nl;
    p->no_gt = ng;
    p->depth--;
    return e;
  }
  case NF_T_STAR: {
    nf_loc loc = t->loc;
    advance(p);
    const nf_token *n = cur(p);
    if (n->kind == NF_T_IDENT) {
      char name[48];
      snprintf(name, sizeof name, "%.*s%s", (int)(n->len > 40 ? 40 : n->len),
               p->src->text + n->off, n->len > 40 ? "..." : "");
      error_at(p, loc, pack_msg, name);
    } else {
      error_at(p, loc, "expected an expression, found '*'");
    }
    return NULL;
  }
  default:
    expected(p, "an expression");
    return NULL;
  }
}

static nf_ast_expr *parse_unary(parser *p) {
  const nf_token *t = cur(p);
  if (t->kind != NF_T_MINUS && t->kind != NF_T_BANG) return parse_primary(p);
  nf_loc loc = t->loc;
  int op = t->kind == NF_T_MINUS ? NF_OP_NEG : NF_OP_NOT;
  if (!enter(p, loc, "expression")) return NULL;
  advance(p);
  nf_ast_expr *a = parse_unary(p);
  if (!a) return NULL;
  p->depth--;
  nf_ast_expr *e = new_expr(p, NF_A_UNARY, loc);
  if (!e || !(e->args = alloc(p, sizeof *e->args))) return NULL;
  e->op = (uint8_t)op;
  e->n_args = 1;
  e->args[0] = a;
  if (!set_height(p, loc, p->h)) return NULL;
  return e;
}

/* l op r, its height from the operands' (hl, hr); NULL after an error. */
static nf_ast_expr *new_binary(parser *p, int op, nf_ast_expr *l, nf_ast_expr *r, int hl,
                               int hr) {
  nf_ast_expr *e = new_expr(p, NF_A_BINARY, l->loc);
  if (!e || !(e->args = alloc(p, 2 * sizeof *e->args))) return NULL;
  e->op = (uint8_t)op;
  e->n_args = 2;
  e->args[0] = l;
  e->args[1] = r;
  return set_height(p, l->loc, hl > hr ? hl : hr) ? e : NULL;
}

/* Binary levels from loosest (0: ||) to tightest (5: * / // %). */
#define N_BIN_LEVELS 6

/* The operator of the current token at a level, or -1. */
static int binop_at(parser *p, int level) {
  switch (cur(p)->kind) {
  case NF_T_OROR: return level == 0 ? NF_OP_OR : -1;
  case NF_T_ANDAND: return level == 1 ? NF_OP_AND : -1;
  case NF_T_EQEQ: return level == 2 ? NF_OP_EQ : -1;
  case NF_T_NE: return level == 2 ? NF_OP_NE : -1;
  case NF_T_LT: return level == 3 ? NF_OP_LT : -1;
  case NF_T_LE: return level == 3 ? NF_OP_LE : -1;
  case NF_T_GT: return level == 3 && !p->no_gt ? NF_OP_GT : -1;
  case NF_T_GE: return level == 3 ? NF_OP_GE : -1;
  case NF_T_PLUS: return level == 4 ? NF_OP_ADD : -1;
  case NF_T_MINUS: return level == 4 ? NF_OP_SUB : -1;
  case NF_T_STAR: return level == 5 ? NF_OP_MUL : -1;
  case NF_T_SLASH: return level == 5 ? NF_OP_DIV : -1;
  case NF_T_SLASHSLASH: return level == 5 ? NF_OP_FLOORDIV : -1;
  case NF_T_PERCENT: return level == 5 ? NF_OP_MOD : -1;
  default: return -1;
  }
}

static nf_ast_expr *parse_binary(parser *p, int level) {
  if (level == N_BIN_LEVELS) return parse_unary(p);
  nf_ast_expr *l = parse_binary(p, level + 1);
  if (!l) return NULL;
  int op;
  while ((op = binop_at(p, level)) >= 0) {
    int hl = p->h;
    advance(p);
    nf_ast_expr *r = parse_binary(p, level + 1);
    if (!r) return NULL;
    int hr = p->h;
    if (!(l = new_binary(p, op, l, r, hl, hr))) return NULL;
  }
  return l;
}

/* expr := or [ '?' expr ':' expr ] (right-associative). */
static nf_ast_expr *parse_expr(parser *p) {
  nf_ast_expr *c = parse_binary(p, 0);
  if (!c || !at_kind(p, NF_T_QUESTION)) return c;
  int hc = p->h;
  if (!enter(p, cur(p)->loc, "expression")) return NULL;
  advance(p);
  nf_ast_expr *a = parse_expr(p);
  if (!a) return NULL;
  int ha = p->h;
  if (!accept(p, NF_T_COLON)) {
    expected(p, "':' in 'cond ? a : b'");
    return NULL;
  }
  nf_ast_expr *b = parse_expr(p);
  if (!b) return NULL;
  int hb = p->h;
  p->depth--;
  nf_ast_expr *e = new_expr(p, NF_A_SELECT, c->loc);
  if (!e || !(e->args = alloc(p, 3 * sizeof *e->args))) return NULL;
  e->n_args = 3;
  e->args[0] = c;
  e->args[1] = a;
  e->args[2] = b;
  int h = hc > ha ? hc : ha;
  return set_height(p, c->loc, h > hb ? h : hb) ? e : NULL;
}

/* ---- shared pieces ---- */

/* NAME [ '[' expr ']' ] */
static int parse_tref(parser *p, nf_ast_tref *r, const char *what) {
  r->name = expect_name(p, &r->loc, "%s", what);
  if (!r->name) return 0;
  if (at_kind(p, NF_T_LBRACK) && !(r->sub = parse_subscript(p, r->name)))
    return 0;
  return 1;
}

/* LO ':' HI */
static int parse_range(parser *p, nf_ast_expr **lo, nf_ast_expr **hi,
                       const char *var) {
  if (!(*lo = parse_expr(p))) return 0;
  if (!accept(p, NF_T_COLON)) {
    expected(p, "':' in the range 'LO:HI' of '%.64s'", var);
    return 0;
  }
  return (*hi = parse_expr(p)) != NULL;
}

static const struct {
  const char *name;
  int dtype;
} dtypes[] = {
    {"f32", NF_F32}, {"f64", NF_F64},   {"i32", NF_I32}, {"i64", NF_I64},
    {"bool", NF_BOOL}, {"f16", NF_F16}, {"bf16", NF_BF16},
};

/* NAME ':' DTYPE '[' [dim {',' dim}] ']' */
static int parse_tdecl(parser *p, nf_ast_tdecl *t, const char *what) {
  t->name = expect_name(p, &t->loc, "%s", what);
  if (!t->name) return 0;
  if (!accept(p, NF_T_COLON)) {
    expected(p, "':' and a dtype after '%.64s'", t->name);
    return 0;
  }
  const nf_token *dt = cur(p);
  if (dt->kind != NF_T_IDENT) {
    expected(p, "a dtype (f32, f64, i32, i64, bool, f16 or bf16)");
    return 0;
  }
  int found = -1;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strlen(dtypes[i].name) == dt->len &&
        memcmp(dtypes[i].name, p->src->text + dt->off, dt->len) == 0)
      found = dtypes[i].dtype;
  if (found < 0) {
    char shown[64];
    describe(p, dt, shown, sizeof shown);
    error_at(p, dt->loc,
             "unknown dtype %s (expected f32, f64, i32, i64, bool, f16 or "
             "bf16)",
             shown);
    return 0;
  }
  t->dtype = (uint8_t)found;
  advance(p);
  if (!at_kind(p, NF_T_LBRACK)) {
    expected(p, "'[' and the dims of '%.64s' (f32[] for a scalar)", t->name);
    return 0;
  }
  int nl = p->nl_skip, ng = p->no_gt, cap = 0;
  advance(p);
  p->nl_skip++;
  p->no_gt = 0;
  if (!at_kind(p, NF_T_RBRACK)) {
    for (;;) {
      nf_ast_expr *e = parse_arg(p);
      if (!e) return 0;
      nf_ast_expr **slot = PUSH(p, t->dims, t->n_dims, cap);
      if (!slot) return 0;
      *slot = e;
      if (!accept(p, NF_T_COMMA)) break;
    }
  }
  if (!accept(p, NF_T_RBRACK)) {
    expected(p, "']' after the dims of '%.64s'", t->name);
    return 0;
  }
  p->nl_skip = nl;
  p->no_gt = ng;
  return 1;
}

/* ---- statements ---- */

static nf_ast_stmt *parse_stmt(parser *p);

/* Skips the rest of a failed statement: up to a NEWLINE or ';' outside
 * braces, a '}' that closes the current block, 'def' or the end. */
static void sync_stmt(parser *p) {
  int braces = 0;
  p->nl_skip = 0;
  for (;;) {
    switch (p->tok.kind) {
    case NF_T_EOF:
    case NF_T_DEF:
      return;
    case NF_T_NEWLINE:
    case NF_T_SEMI:
      if (braces == 0) return;
      break;
    case NF_T_LBRACE:
      braces++;
      break;
    case NF_T_RBRACE:
      if (braces == 0) return;
      braces--;
      break;
    default:
      break;
    }
    advance(p);
  }
}

/* Skips to just past the '}' matching a '{' already read (or to 'def' or
 * the end), without parsing: used where a body cannot be parsed. */
static void skip_block(parser *p) {
  int braces = 1;
  p->nl_skip = 0;
  while (braces > 0 && p->tok.kind != NF_T_EOF && p->tok.kind != NF_T_DEF) {
    if (p->tok.kind == NF_T_LBRACE) braces++;
    if (p->tok.kind == NF_T_RBRACE) braces--;
    advance(p);
  }
}

/* Statements up to the '}' that closes the block (the '{' was read at
 * open).  Returns 0 when the block is not closed (then the error was
 * reported). */
static int block(parser *p, nf_ast_stmt ***body, int *n_body, nf_loc open,
                 const char *what) {
  int cap = 0, base = p->depth;
  for (;;) {
    p->nl_skip = 0;
    p->no_gt = 0;
    p->depth = base;
    p->failed = 0;
    if (p->oom) return 0;
    const nf_token *t = cur(p);
    if (t->kind == NF_T_NEWLINE || t->kind == NF_T_SEMI) {
      advance(p);
      continue;
    }
    if (t->kind == NF_T_RBRACE) {
      advance(p);
      return 1;
    }
    if (t->kind == NF_T_EOF || t->kind == NF_T_DEF) {
      if (!p->unclosed) {
        expected(p, "'}' to close %s", what);
        note_at(p, open, "'{' opened here");
        p->unclosed = 1;
      }
      return 0;
    }
    nf_ast_stmt *s = parse_stmt(p);
    if (s) {
      nf_ast_stmt **slot = PUSH(p, *body, *n_body, cap);
      if (!slot) return 0;
      *slot = s;
      int k = cur(p)->kind;
      if (k != NF_T_NEWLINE && k != NF_T_SEMI && k != NF_T_RBRACE &&
          k != NF_T_EOF) {
        expected(p, "the end of the statement (a new line or ';')");
        sync_stmt(p);
      }
    } else {
      if (p->unclosed) return 0;
      sync_stmt(p);
    }
  }
}

static nf_ast_stmt *new_stmt(parser *p, int kind, nf_loc loc) {
  nf_ast_stmt *s = alloc(p, sizeof *s);
  if (!s) return NULL;
  s->kind = (uint8_t)kind;
  s->loc = loc;
  return s;
}

/* for NAME in LO:HI { stmts } */
static nf_ast_stmt *parse_for(parser *p) {
  nf_ast_stmt *s = new_stmt(p, NF_S_FOR, cur(p)->loc);
  if (!s) return NULL;
  advance(p);
  if (!(s->var = expect_name(p, NULL, "a loop variable after 'for'")))
    return NULL;
  if (!accept(p, NF_T_IN)) {
    expected(p, "'in' after 'for %.64s'", s->var);
    return NULL;
  }
  if (!parse_range(p, &s->lo, &s->hi, s->var)) return NULL;
  nf_loc open = cur(p)->loc;
  if (!accept(p, NF_T_LBRACE)) {
    expected(p, "'{' after 'for %.64s in LO:HI'", s->var);
    return NULL;
  }
  if (!enter(p, open, "'for' loops")) {
    skip_block(p);
    return NULL;
  }
  char what[96];
  snprintf(what, sizeof what, "'for %.64s'", s->var);
  p->in_for++;
  int closed = block(p, &s->body, &s->n_body, open, what);
  p->in_for--;
  return closed ? s : NULL;
}

/* Whether the token after the current NEWLINE is 'where' (an element
 * statement's ranges may start on the next line).  Lexes ahead on a copy
 * of the lexer; the copy may only add arena allocations. */
static int next_is_where(parser *p) {
  nf_lexer la = p->lx;
  nf_token t;
  nf__lex_next(&la, &t);
  if (la.oom) p->oom = 1;
  return t.kind == NF_T_WHERE;
}

/* The reduction operator of an element statement. */
static int parse_redop(parser *p, const char *lhs) {
  const nf_token *t = cur(p);
  switch (t->kind) {
  case NF_T_ASSIGN: advance(p); return NF_RED_NONE;
  case NF_T_PLUS_EQ_BANG: advance(p); return NF_RED_SUM;
  case NF_T_STAR_EQ_BANG: advance(p); return NF_RED_PROD;
  case NF_T_PLUS_EQ:
    error_at(p, t->loc,
             "tensors are defined once: use '+=!' (TC's '+=' without '!' is "
             "not supported)");
    return -1;
  case NF_T_STAR_EQ:
    error_at(p, t->loc,
             "tensors are defined once: use '*=!' (TC's '*=' without '!' is "
             "not supported)");
    return -1;
  case NF_T_IDENT: {
    const char *s = p->src->text + t->off;
    int is_max = t->len == 3 && memcmp(s, "max", 3) == 0;
    int is_min = t->len == 3 && memcmp(s, "min", 3) == 0;
    if (!is_max && !is_min) break;
    const char *op = is_max ? "max" : "min";
    nf_loc loc = t->loc;
    size_t end = t->off + 3;
    advance(p);
    const nf_token *eq = cur(p);
    if (eq->kind != NF_T_ASSIGN || eq->off != end) {
      error_at(p, loc, "expected '%s=!' (written without spaces)", op);
      return -1;
    }
    advance(p);
    const nf_token *bang = cur(p);
    if (bang->kind != NF_T_BANG || bang->off != end + 1) {
      error_at(p, loc,
               "tensors are defined once: use '%s=!' (TC's '%s=' without '!' "
               "is not supported)",
               op, op);
      return -1;
    }
    advance(p);
    return is_max ? NF_RED_MAX : NF_RED_MIN;
  }
  default:
    break;
  }
  expected(p, "'=', '+=!', '*=!', 'max=!' or 'min=!' after '%.64s(...)'", lhs);
  return -1;
}

/* tref '(' idx... ')' redop expr [where NAME in LO:HI, ...] */
static nf_ast_stmt *parse_elem(parser *p, nf_ast_stmt *s) {
  s->kind = NF_S_ELEM;
  int nl = p->nl_skip, cap = 0;
  advance(p); /* '(' */
  p->nl_skip++;
  if (!at_kind(p, NF_T_RPAREN)) {
    for (;;) {
      nf_ast_expr *e;
      const nf_token *t = cur(p);
      if (t->kind == NF_T_STAR) {
        if (!(e = parse_pack(p))) return NULL;
      } else if (t->kind == NF_T_IDENT) {
        if (!(e = new_expr(p, NF_A_NAME, t->loc))) return NULL;
        if (!(e->name = tok_str(p, t))) return NULL;
        advance(p);
      } else {
        expected(p, "an index variable or a pack '*name' on the left of "
                    "'%.64s'",
                 s->lhs.name);
        return NULL;
      }
      nf_ast_expr **slot = PUSH(p, s->idx, s->n_idx, cap);
      if (!slot) return NULL;
      *slot = e;
      if (!accept(p, NF_T_COMMA)) break;
    }
  }
  if (!accept(p, NF_T_RPAREN)) {
    expected(p,
             "')' after the indices of '%.64s' (left-side indices are plain "
             "variable names)",
             s->lhs.name);
    return NULL;
  }
  p->nl_skip = nl;
  int red = parse_redop(p, s->lhs.name);
  if (red < 0) return NULL;
  s->red = (uint8_t)red;
  if (!(s->rhs = parse_expr(p))) return NULL;
  if (p->tok.kind == NF_T_NEWLINE && next_is_where(p)) advance(p);
  if (accept(p, NF_T_WHERE)) {
    cap = 0;
    do {
      nf_ast_range *r = PUSH(p, s->ranges, s->n_ranges, cap);
      if (!r) return NULL;
      r->name = expect_name(p, &r->loc, "a variable name after 'where'");
      if (!r->name) return NULL;
      if (!accept(p, NF_T_IN)) {
        expected(p, "'in' after 'where %.64s'", r->name);
        return NULL;
      }
      if (!parse_range(p, &r->lo, &r->hi, r->name)) return NULL;
    } while (accept(p, NF_T_COMMA));
  }
  return s;
}

/* ---- tensor expressions: the right side of `results = ...` ----
 *
 * texpr   := tsum
 * tsum    := tprod (('+' | '-') tprod)*
 * tprod   := tunary (('*' | '/' | '//' | '%') tunary)*
 * tunary  := '-' tunary | tprimary
 * tprimary:= INT | FLOAT | '(' texpr ')'
 *          | NAME ['[' expr ']']                       (a tensor)
 *          | NAME ['<' params '>'] '(' [texpr (',' texpr)*] ')'   (a call)
 *
 * Whole tensors: a call applies a def (or an elementwise function or
 * cast) to tensor expressions; the arithmetic is elementwise with
 * broadcasting (elab.c). */

static nf_ast_expr *parse_texpr(parser *p);
static int texpr_end(parser *p);

/* '<' name '=' expr, ... '>' after a callee (the current token is '<'). */
static int parse_call_params(parser *p, const char *callee, int *n,
                             nf_ast_param_arg **params) {
  int nl = p->nl_skip, cap = 0;
  advance(p);
  p->nl_skip++;
  do {
    nf_ast_param_arg *a = PUSH(p, *params, *n, cap);
    if (!a) return 0;
    a->name = expect_name(p, &a->loc, "a parameter name in '%.64s<...>'",
                          callee);
    if (!a->name) return 0;
    if (!accept(p, NF_T_ASSIGN)) {
      expected(p, "'=' and a value after parameter '%.64s'", a->name);
      return 0;
    }
    p->no_gt = 1;
    if (!(a->value = parse_expr(p))) return 0;
    p->no_gt = 0;
  } while (accept(p, NF_T_COMMA));
  if (!accept(p, NF_T_GT)) {
    expected(p, "'>' after the parameters of '%.64s'", callee);
    return 0;
  }
  p->nl_skip = nl;
  if (!at_kind(p, NF_T_LPAREN)) {
    expected(p, "'(' and the arguments of '%.64s'", callee);
    return 0;
  }
  return 1;
}

static nf_ast_expr *parse_tprimary(parser *p) {
  const nf_token *t = cur(p);
  nf_ast_expr *e;
  if (t->kind == NF_T_INT || t->kind == NF_T_FLOAT) return parse_primary(p);
  if (t->kind == NF_T_LPAREN) {
    nf_loc open = t->loc;
    int nl = p->nl_skip;
    if (!enter(p, open, "expression")) return NULL;
    advance(p);
    p->nl_skip++;
    e = parse_texpr(p);
    if (!e || !texpr_end(p)) return NULL;
    if (!accept(p, NF_T_RPAREN)) {
      expected(p, "')' to close '('");
      note_at(p, open, "'(' opened here");
      return NULL;
    }
    p->nl_skip = nl;
    p->depth--;
    return e;
  }
  /* (`where` is a keyword; `where(C, A, B)` is the elementwise select) */
  int where = t->kind == NF_T_WHERE;
  if (t->kind != NF_T_IDENT && !where) {
    expected(p, "a tensor, a call or a number");
    return NULL;
  }
  nf_loc loc = t->loc;
  const char *name = where ? "where" : tok_str(p, t);
  if (!name) return NULL;
  advance(p);
  if (where && !at_kind(p, NF_T_LPAREN)) {
    expected(p, "'(' after 'where' (the elementwise select where(C, A, B))");
    return NULL;
  }
  if (at_kind(p, NF_T_LBRACK)) {
    if (!(e = new_expr(p, NF_A_NAME, loc))) return NULL;
    e->name = name;
    if (!(e->sub = parse_subscript_range(p, name, &e->sub_hi))) return NULL;
    if (at_kind(p, NF_T_LPAREN) || at_kind(p, NF_T_LT)) {
      error_at(p, cur(p)->loc,
               "a call names a def, not a tensor family member '%.64s[...]'",
               name);
      return NULL;
    }
    return set_height(p, loc, 1) ? e : NULL;
  }
  if (!at_kind(p, NF_T_LPAREN) && !at_kind(p, NF_T_LT)) {
    if (!(e = new_expr(p, NF_A_NAME, loc))) return NULL;
    e->name = name;
    p->h = 1;
    return e;
  }
  if (!(e = new_expr(p, NF_A_CALL, loc))) return NULL;
  e->name = name;
  if (at_kind(p, NF_T_LT) && !parse_call_params(p, name, &e->n_params, &e->params))
    return NULL;
  nf_loc open = cur(p)->loc;
  int nl = p->nl_skip, ng = p->no_gt, cap = 0, h = 0;
  if (!enter(p, open, "expression")) return NULL;
  advance(p); /* '(' */
  p->nl_skip++;
  p->no_gt = 0;
  if (!at_kind(p, NF_T_RPAREN)) {
    do {
      nf_ast_expr *a = parse_texpr(p);
      if (!a || !texpr_end(p)) return NULL;
      if (p->h > h) h = p->h;
      nf_ast_expr **slot = PUSH(p, e->args, e->n_args, cap);
      if (!slot) return NULL;
      *slot = a;
    } while (accept(p, NF_T_COMMA));
  }
  if (!accept(p, NF_T_RPAREN)) {
    expected(p, "')' after the arguments of '%.64s'", name);
    return NULL;
  }
  p->nl_skip = nl;
  p->no_gt = ng;
  p->depth--;
  return set_height(p, loc, h) ? e : NULL;
}

static nf_ast_expr *parse_tunary(parser *p) {
  if (!at_kind(p, NF_T_MINUS)) return parse_tprimary(p);
  nf_loc loc = cur(p)->loc;
  if (!enter(p, loc, "expression")) return NULL;
  advance(p);
  nf_ast_expr *a = parse_tunary(p);
  if (!a) return NULL;
  p->depth--;
  nf_ast_expr *e = new_expr(p, NF_A_UNARY, loc);
  if (!e || !(e->args = alloc(p, sizeof *e->args))) return NULL;
  e->op = NF_OP_NEG;
  e->n_args = 1;
  e->args[0] = a;
  return set_height(p, loc, p->h) ? e : NULL;
}

/* level 0: + -, level 1: * / // % */
static nf_ast_expr *parse_tbinary(parser *p, int level) {
  nf_ast_expr *l = level ? parse_tunary(p) : parse_tbinary(p, 1);
  if (!l) return NULL;
  for (;;) {
    int k = cur(p)->kind, op;
    if (level == 0 && (k == NF_T_PLUS || k == NF_T_MINUS))
      op = k == NF_T_PLUS ? NF_OP_ADD : NF_OP_SUB;
    else if (level == 1 && (k == NF_T_STAR || k == NF_T_SLASH || k == NF_T_SLASHSLASH ||
                            k == NF_T_PERCENT))
      op = k == NF_T_STAR ? NF_OP_MUL : k == NF_T_SLASH ? NF_OP_DIV
           : k == NF_T_SLASHSLASH ? NF_OP_FLOORDIV : NF_OP_MOD;
    else
      return l;
    int hl = p->h;
    advance(p);
    nf_ast_expr *r = level ? parse_tunary(p) : parse_tbinary(p, 1);
    if (!r) return NULL;
    int hr = p->h;
    if (!(l = new_binary(p, op, l, r, hl, hr))) return NULL;
  }
}

/* tcmp := tsum [('<' | '<=' | '>' | '>=' | '==' | '!=') tsum]: an
 * elementwise comparison, a bool tensor (where's condition).  After a
 * plain name '<' starts its call's parameters: write `B > A` or `(A) < B`. */
static nf_ast_expr *parse_texpr(parser *p) {
  nf_ast_expr *l = parse_tbinary(p, 0);
  if (!l) return NULL;
  int op;
  switch (cur(p)->kind) {
  case NF_T_LT: op = NF_OP_LT; break;
  case NF_T_LE: op = NF_OP_LE; break;
  case NF_T_GT: op = p->no_gt ? -1 : NF_OP_GT; break;
  case NF_T_GE: op = NF_OP_GE; break;
  case NF_T_EQEQ: op = NF_OP_EQ; break;
  case NF_T_NE: op = NF_OP_NE; break;
  default: op = -1;
  }
  if (op < 0) return l;
  int hl = p->h;
  advance(p);
  nf_ast_expr *r = parse_tbinary(p, 0);
  if (!r) return NULL;
  int hr = p->h;
  return new_binary(p, op, l, r, hl, hr);
}

/* An operator of element expressions that tensor expressions lack, after
 * one: reported (with what to write instead); 0 then. */
static int texpr_end(parser *p) {
  const char *op = NULL;
  switch (cur(p)->kind) {
  case NF_T_LT: op = "<"; break;
  case NF_T_LE: op = "<="; break;
  case NF_T_GT: op = ">"; break;
  case NF_T_GE: op = ">="; break;
  case NF_T_EQEQ: op = "=="; break;
  case NF_T_NE: op = "!="; break;
  case NF_T_BANG: op = "!"; break;
  case NF_T_ANDAND: op = "&&"; break;
  case NF_T_OROR: op = "||"; break;
  case NF_T_QUESTION: op = "?"; break;
  default: return 1;
  }
  error_at(p, cur(p)->loc,
           "'%s' is not an operator of tensor expressions (whole tensors take "
           "+ - * / // %%, one comparison and calls); write an element statement, "
           "e.g. 'Y(*i) = ...', or call where(C, A, B)",
           op);
  return 0;
}

/* The tensor of a tensor expression that is a plain tensor, into r. */
static void tref_of(const nf_ast_expr *e, nf_ast_tref *r) {
  r->name = e->name;
  r->sub = e->sub;
  r->loc = e->loc;
}

/* results '=' texpr: a copy `T = U`, a call whose arguments are tensors
 * (callee, params, args), or any other tensor expression (value). */
static nf_ast_stmt *parse_call(parser *p, nf_ast_stmt *s) {
  s->kind = NF_S_CALL;
  int cap = 1;
  s->n_results = 1;
  while (accept(p, NF_T_COMMA)) {
    nf_ast_tref *r = PUSH(p, s->results, s->n_results, cap);
    if (!r || !parse_tref(p, r, "a result tensor after ','")) return NULL;
  }
  if (!accept(p, NF_T_ASSIGN)) {
    expected(p, "',' or '=' after the results");
    return NULL;
  }
  nf_ast_expr *v = parse_texpr(p);
  if (!v || !texpr_end(p)) return NULL;
  if (v->kind == NF_A_NAME) { /* a copy */
    if (s->n_results != 1) {
      error_at(p, s->loc, "a copy 'T = U' has one result, not %d",
               s->n_results);
      return NULL;
    }
    if (!(s->args = alloc(p, sizeof *s->args))) return NULL;
    tref_of(v, &s->args[0]);
    s->n_args = 1;
    s->callee_loc = v->loc;
    return s;
  }
  /* (the parser does not resolve names: `Y = exp(X)` is a plain call here,
   * and the checks and the elaborator make a call of a math function, a
   * cast or a built-in operator a tensor expression) */
  int plain = v->kind == NF_A_CALL;
  for (int k = 0; plain && k < v->n_args; k++)
    plain = v->args[k]->kind == NF_A_NAME && !v->args[k]->sub_hi;
  if (!plain) {
    if (v->kind != NF_A_CALL && s->n_results != 1) {
      error_at(p, s->loc, "an expression has one result, not %d", s->n_results);
      return NULL;
    }
    s->value = v;
    s->callee_loc = v->loc;
    return s;
  }
  s->callee = v->name;
  s->callee_loc = v->loc;
  s->n_params = v->n_params;
  s->params = v->params;
  if (v->n_args && !(s->args = alloc(p, sizeof *s->args * (size_t)v->n_args))) return NULL;
  for (int k = 0; k < v->n_args; k++) tref_of(v->args[k], &s->args[k]);
  s->n_args = v->n_args;
  return s;
}

/* ---- param declarations ---- */

static const struct {
  const char *name;
  int kind;              /* nf_init_kind */
  int min_args, max_args;
  const char *args;      /* for messages */
} inits[] = {
    {"zeros", NF_INIT_ZEROS, 0, 0, ""},
    {"ones", NF_INIT_ONES, 0, 0, ""},
    {"constant", NF_INIT_CONSTANT, 1, 1, "V"},
    {"uniform", NF_INIT_UNIFORM, 2, 2, "LO, HI"},
    {"normal", NF_INIT_NORMAL, 2, 2, "MEAN, STD"},
    {"xavier_uniform", NF_INIT_XAVIER_UNIFORM, 0, 1, "the gain"},
    {"xavier_normal", NF_INIT_XAVIER_NORMAL, 0, 1, "the gain"},
    {"kaiming_uniform", NF_INIT_KAIMING_UNIFORM, 0, 1, "the negative slope a"},
    {"kaiming_normal", NF_INIT_KAIMING_NORMAL, 0, 1, "the negative slope a"},
};

#define N_INITS ((int)(sizeof inits / sizeof inits[0]))

static const char init_list[] =
    "zeros, ones, constant(V), uniform(LO, HI), normal(MEAN, STD), "
    "xavier_uniform, xavier_normal, kaiming_uniform or kaiming_normal";

/* Public (nf_lang.h); lives with the grammar so the parser, the printer
 * and the fuzz target share one table. */
const char *nf_init_name(nf_init_kind k) {
  for (int i = 0; i < N_INITS; i++)
    if (inits[i].kind == (int)k) return inits[i].name;
  return "?";
}

/* Whether the current token `param` starts a declaration: the next two
 * tokens are a name and ':'.  Lexes ahead on a copy of the lexer. */
static int next_is_param_decl(parser *p) {
  nf_lexer la = p->lx;
  nf_token t1, t2;
  nf__lex_next(&la, &t1);
  int yes = 0;
  if (t1.kind == NF_T_IDENT) {
    nf__lex_next(&la, &t2);
    yes = t2.kind == NF_T_COLON;
  }
  if (la.oom) p->oom = 1;
  return yes;
}

/* A numeric literal with an optional unary minus; 0 after an error. */
static int parse_init_number(parser *p, double *out) {
  int neg = accept(p, NF_T_MINUS);
  const nf_token *t = cur(p);
  if (t->kind == NF_T_INT)
    *out = (double)t->ival;
  else if (t->kind == NF_T_FLOAT)
    *out = t->fval;
  else {
    expected(p, "a number (initializer arguments are numeric literals)");
    return 0;
  }
  if (neg) *out = -*out;
  advance(p);
  return 1;
}

/* param NAME ':' DTYPE '[' dims ']' '=' INIT [ '(' [num {',' num}] ')' ]
 * (the current token is `param`). */
static nf_ast_stmt *parse_param(parser *p, nf_ast_stmt *s) {
  s->kind = NF_S_PARAM;
  if (p->in_for) {
    error_at(p, s->loc,
             "param declarations are allowed only at the top level of a "
             "def's body, not inside 'for'");
    return NULL;
  }
  advance(p); /* param */
  if (!parse_tdecl(p, &s->decl, "a parameter name after 'param'"))
    return NULL;
  if (!accept(p, NF_T_ASSIGN)) {
    expected(p, "'=' and an initializer (%s) after param '%.64s'", init_list,
             s->decl.name);
    return NULL;
  }
  const nf_token *t = cur(p);
  if (t->kind != NF_T_IDENT) {
    expected(p, "an initializer (%s)", init_list);
    return NULL;
  }
  int found = -1;
  for (int i = 0; i < N_INITS; i++)
    if (strlen(inits[i].name) == t->len &&
        memcmp(inits[i].name, p->src->text + t->off, t->len) == 0)
      found = i;
  if (found < 0) {
    char shown[64];
    describe(p, t, shown, sizeof shown);
    error_at(p, t->loc, "unknown initializer %s (expected %s)", shown,
             init_list);
    return NULL;
  }
  s->init = (uint8_t)inits[found].kind;
  s->init_loc = t->loc;
  advance(p);
  const char *iname = inits[found].name;
  int n = 0;
  if (at_kind(p, NF_T_LPAREN)) {
    int nl = p->nl_skip;
    advance(p);
    p->nl_skip++;
    if (!at_kind(p, NF_T_RPAREN)) {
      do {
        double v;
        if (!parse_init_number(p, &v)) return NULL;
        if (n < 2) s->init_args[n] = v;
        n++;
      } while (accept(p, NF_T_COMMA));
    }
    if (!accept(p, NF_T_RPAREN)) {
      expected(p, "')' after the arguments of '%s'", iname);
      return NULL;
    }
    p->nl_skip = nl;
  }
  int lo = inits[found].min_args, hi = inits[found].max_args;
  if (n < lo || n > hi) {
    if (hi == 0)
      error_at(p, s->init_loc, "'%s' takes no arguments, got %d", iname, n);
    else if (lo == hi)
      error_at(p, s->init_loc, "'%s' takes %d argument%s (%s), got %d", iname,
               lo, lo == 1 ? "" : "s", inits[found].args, n);
    else
      error_at(p, s->init_loc,
               "'%s' takes at most %d argument (%s, optional), got %d", iname,
               hi, inits[found].args, n);
    return NULL;
  }
  s->n_init_args = n;
  if (s->init == NF_INIT_UNIFORM && s->init_args[0] > s->init_args[1]) {
    error_at(p, s->init_loc,
             "uniform(LO, HI) needs LO <= HI, got LO = %g and HI = %g",
             s->init_args[0], s->init_args[1]);
    return NULL;
  }
  if (s->init == NF_INIT_NORMAL && s->init_args[1] < 0) {
    error_at(p, s->init_loc, "normal(MEAN, STD) needs STD >= 0, got STD = %g",
             s->init_args[1]);
    return NULL;
  }
  return s;
}

static nf_ast_stmt *parse_stmt(parser *p) {
  const nf_token *t = cur(p);
  if (t->kind == NF_T_FOR) return parse_for(p);
  if (t->kind == NF_T_IDENT && t->len == 5 &&
      memcmp(p->src->text + t->off, "param", 5) == 0 && next_is_param_decl(p)) {
    nf_ast_stmt *s = new_stmt(p, NF_S_PARAM, t->loc);
    return s ? parse_param(p, s) : NULL;
  }
  if (t->kind != NF_T_IDENT) {
    expected(p, "a statement");
    return NULL;
  }
  nf_ast_stmt *s = new_stmt(p, NF_S_ELEM, t->loc);
  if (!s) return NULL;
  nf_ast_tref lhs;
  memset(&lhs, 0, sizeof lhs);
  if (!parse_tref(p, &lhs, "a statement")) return NULL;
  switch (cur(p)->kind) {
  case NF_T_LPAREN:
    s->lhs = lhs;
    return parse_elem(p, s);
  case NF_T_COMMA:
  case NF_T_ASSIGN:
    if (!(s->results = alloc(p, sizeof *s->results))) return NULL;
    s->results[0] = lhs;
    return parse_call(p, s);
  default:
    expected(p, "'(' with the indices of '%.64s', or ',' or '=' for a call",
             lhs.name);
    return NULL;
  }
}

/* ---- defs and the file ---- */

static nf_ast_def *parse_def(parser *p) {
  nf_ast_def *d = alloc(p, sizeof *d);
  if (!d) return NULL;
  d->loc = cur(p)->loc;
  advance(p);
  p->nl_skip = 1; /* newlines may appear anywhere in the header */
  if (!(d->name = expect_name(p, NULL, "a def name after 'def'")))
    return NULL;
  int cap = 0;
  if (accept(p, NF_T_LT)) {
    do {
      nf_ast_param *pm = PUSH(p, d->params, d->n_params, cap);
      if (!pm) return NULL;
      pm->name = expect_name(p, &pm->loc, "a parameter name in '%.64s<...>'",
                             d->name);
      if (!pm->name) return NULL;
      if (accept(p, NF_T_ASSIGN)) {
        p->no_gt = 1;
        if (!(pm->dflt = parse_expr(p))) return NULL;
        p->no_gt = 0;
      }
    } while (accept(p, NF_T_COMMA));
    if (!accept(p, NF_T_GT)) {
      expected(p, "'>' after the parameters of '%.64s'", d->name);
      return NULL;
    }
  }
  if (!accept(p, NF_T_LPAREN)) {
    expected(p, "'(' and the inputs of '%.64s'", d->name);
    return NULL;
  }
  cap = 0;
  if (!at_kind(p, NF_T_RPAREN)) {
    do {
      nf_ast_tdecl *t = PUSH(p, d->inputs, d->n_inputs, cap);
      if (!t || !parse_tdecl(p, t, "an input 'NAME: DTYPE[DIMS]'"))
        return NULL;
    } while (accept(p, NF_T_COMMA));
  }
  if (!accept(p, NF_T_RPAREN)) {
    expected(p, "')' after the inputs of '%.64s'", d->name);
    return NULL;
  }
  if (!accept(p, NF_T_ARROW)) {
    expected(p, "'->' and the outputs of '%.64s'", d->name);
    return NULL;
  }
  if (!accept(p, NF_T_LPAREN)) {
    expected(p, "'(' and the outputs of '%.64s'", d->name);
    return NULL;
  }
  if (at_kind(p, NF_T_RPAREN)) {
    error_at(p, cur(p)->loc, "def '%.64s' must have at least one output",
             d->name);
    return NULL;
  }
  cap = 0;
  do {
    nf_ast_tdecl *t = PUSH(p, d->outputs, d->n_outputs, cap);
    if (!t || !parse_tdecl(p, t, "an output 'NAME: DTYPE[DIMS]'"))
      return NULL;
  } while (accept(p, NF_T_COMMA));
  if (!accept(p, NF_T_RPAREN)) {
    expected(p, "')' after the outputs of '%.64s'", d->name);
    return NULL;
  }
  if (accept(p, NF_T_WHERE)) {
    cap = 0;
    do {
      nf_ast_where *w = PUSH(p, d->wheres, d->n_wheres, cap);
      if (!w) return NULL;
      w->name = expect_name(p, &w->loc, "a size name after 'where'");
      if (!w->name) return NULL;
      if (!accept(p, NF_T_ASSIGN)) {
        expected(p, "'=' after 'where %.64s'", w->name);
        return NULL;
      }
      if (!(w->value = parse_expr(p))) return NULL;
    } while (accept(p, NF_T_COMMA));
  }
  if (accept(p, NF_T_REQUIRE)) {
    cap = 0;
    do {
      nf_ast_expr **slot = PUSH(p, d->requires, d->n_requires, cap);
      if (!slot || !(*slot = parse_expr(p))) return NULL;
    } while (accept(p, NF_T_COMMA));
  }
  nf_loc open = cur(p)->loc;
  if (!accept(p, NF_T_LBRACE)) {
    expected(p, "'{' and the statements of '%.64s'", d->name);
    return NULL;
  }
  p->nl_skip = 0;
  char what[96];
  snprintf(what, sizeof what, "def '%.64s'", d->name);
  block(p, &d->body, &d->n_body, open, what);
  return d;
}

/* import STRING | import NAME */
static int parse_import(parser *p, nf_ast_file *f, int *cap) {
  nf_ast_import *im = PUSH(p, f->imports, f->n_imports, *cap);
  if (!im) return 0;
  im->loc = cur(p)->loc;
  advance(p);
  const nf_token *t = cur(p);
  if (t->kind == NF_T_STRING) {
    if (t->len == 0) {
      error_at(p, t->loc, "empty import path");
      return 0;
    }
    if (!(im->path = tok_str(p, t))) return 0;
  } else if (t->kind == NF_T_IDENT) {
    if (!(im->lib = tok_str(p, t))) return 0;
  } else {
    expected(p, "a library name or a \"path.nf\" after 'import'");
    return 0;
  }
  advance(p);
  int k = cur(p)->kind;
  if (k != NF_T_NEWLINE && k != NF_T_EOF) {
    expected(p, "the end of the line after the import");
    return 0;
  }
  return 1;
}

static void parse_file(parser *p, nf_ast_file *f) {
  int cap_imports = 0, cap_defs = 0;
  for (;;) {
    p->nl_skip = 0;
    p->no_gt = 0;
    p->depth = 0;
    p->failed = 0;
    p->unclosed = 0;
    if (p->oom) return;
    const nf_token *t = cur(p);
    int ok = 1;
    if (t->kind == NF_T_EOF) return;
    if (t->kind == NF_T_NEWLINE) {
      advance(p);
      continue;
    }
    if (t->kind == NF_T_IMPORT) {
      ok = parse_import(p, f, &cap_imports);
    } else if (t->kind == NF_T_DEF) {
      nf_ast_def *d = parse_def(p);
      nf_ast_def **slot = d ? PUSH(p, f->defs, f->n_defs, cap_defs) : NULL;
      if (slot) *slot = d;
      ok = d != NULL;
    } else {
      expected(p, "'def' or 'import'");
      ok = 0;
    }
    if (!ok) {
      /* Skip to the next def.  The current token is never the 'def'
       * that started this attempt (parse_def consumed it), so this
       * always progresses. */
      p->nl_skip = 0;
      while (p->tok.kind != NF_T_DEF && p->tok.kind != NF_T_EOF && !p->oom)
        advance(p);
    }
  }
}

int nf__parse(nf_arena *arena, const nf_src *src, nf_diag *d,
              nf_ast_file **out) {
  *out = NULL;
  parser p;
  memset(&p, 0, sizeof p);
  p.a = arena;
  p.src = src;
  p.d = d;
  nf__lex_init(&p.lx, src, arena);
  advance(&p);
  nf_ast_file *f = alloc(&p, sizeof *f);
  if (!f) return NF_ENOMEM;
  f->src = src;
  parse_file(&p, f);
  if (p.oom) return NF_ENOMEM;
  if (p.n_errors) return NF_ESYNTAX;
  *out = f;
  return NF_OK;
}
