/* test_parse.c - the `.nf` lexer, parser and canonical printer.
 *
 * Good inputs check the shape of the tree (kinds, names, ops, counts) for
 * every construct of docs/language.md; bad inputs check the exact first
 * diagnostic a user sees (file:line:col, message, source line, caret) and
 * that recovery reports no cascades; printer tests check precedence and
 * the canonical layout, and that print(parse(x)) is a fixed point whose
 * re-parse is structurally equal to parse(x). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ast.h"


/* ---- fixture: one arena, diag and source per test ---- */

static nf_arena *arena;
static nf_diag *diag;

static void setup(void) {
  arena = nf_arena_new();
  diag = nf_diag_new();
  ck_assert(arena && diag);
}

static void teardown(void) {
  nf_arena_free(arena);
  nf_diag_free(diag);
}

/* Parses text (len bytes; strlen when len is 0) as "t.nf". */
static int parse_n(const char *text, size_t len, nf_ast_file **out) {
  nf_src *s = nf_arena_alloc(arena, sizeof *s); /* outlives diagnostics */
  ck_assert_ptr_nonnull(s);
  s->name = "t.nf";
  s->text = text;
  s->len = len ? len : strlen(text);
  return nf__parse(arena, s, diag, out);
}

static nf_ast_file *parse_ok(const char *text) {
  nf_ast_file *f = NULL;
  int rc = parse_n(text, 0, &f);
  ck_assert_msg(rc == NF_OK, "parse failed (%d):\n%s\nsource:\n%s", rc,
                nf_diag_text(diag), text);
  ck_assert_ptr_nonnull(f);
  return f;
}

/* The one def of a source. */
static const nf_ast_def *def1(const char *text) {
  nf_ast_file *f = parse_ok(text);
  ck_assert_int_eq(f->n_defs, 1);
  return f->defs[0];
}

/* The right side of the single statement of `def t() -> (C: f32[]) {
 * C() = <e> }`. */
static const nf_ast_expr *rhs_of(const char *e) {
  static char text[4096];
  snprintf(text, sizeof text, "def t() -> (C: f32[]) {\n  C() = %s\n}\n", e);
  char *copy = nf_arena_strdup(arena, text);
  const nf_ast_def *d = def1(copy);
  ck_assert_int_eq(d->n_body, 1);
  ck_assert_int_eq(d->body[0]->kind, NF_S_ELEM);
  return d->body[0]->rhs;
}

static void check_name(const nf_ast_expr *e, const char *name) {
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->kind, NF_A_NAME);
  ck_assert_str_eq(e->name, name);
}

static void check_bin(const nf_ast_expr *e, int op) {
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->kind, NF_A_BINARY);
  ck_assert_int_eq(e->op, op);
  ck_assert_int_eq(e->n_args, 2);
}

static void check_apply(const nf_ast_expr *e, const char *name, int n_args) {
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->kind, NF_A_APPLY);
  ck_assert_str_eq(e->name, name);
  ck_assert_int_eq(e->n_args, n_args);
}

/* ---- good inputs ---- */

START_TEST(parse_matmul) {
  const nf_ast_def *d = def1(
      "# Matrix product: C(i, j) = sum over k of A(i, k) * B(k, j).\n"
      "def matmul(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
      "  C(i, j) +=! A(i, k) * B(k, j)\n"
      "}\n");
  ck_assert_str_eq(d->name, "matmul");
  ck_assert_int_eq(d->loc.line, 2);
  ck_assert_int_eq(d->loc.col, 1);
  ck_assert_int_eq(d->n_params, 0);
  ck_assert_int_eq(d->n_inputs, 2);
  ck_assert_str_eq(d->inputs[0].name, "A");
  ck_assert_int_eq(d->inputs[0].dtype, NF_F32);
  ck_assert_int_eq(d->inputs[0].n_dims, 2);
  check_name(d->inputs[0].dims[0], "M");
  check_name(d->inputs[0].dims[1], "K");
  ck_assert_str_eq(d->inputs[1].name, "B");
  ck_assert_int_eq(d->n_outputs, 1);
  ck_assert_str_eq(d->outputs[0].name, "C");
  check_name(d->outputs[0].dims[1], "N");
  ck_assert_int_eq(d->n_wheres, 0);
  ck_assert_int_eq(d->n_requires, 0);
  ck_assert_int_eq(d->n_body, 1);
  const nf_ast_stmt *s = d->body[0];
  ck_assert_int_eq(s->kind, NF_S_ELEM);
  ck_assert_int_eq(s->loc.line, 3);
  ck_assert_int_eq(s->loc.col, 3);
  ck_assert_str_eq(s->lhs.name, "C");
  ck_assert_ptr_null(s->lhs.sub);
  ck_assert_int_eq(s->n_idx, 2);
  check_name(s->idx[0], "i");
  check_name(s->idx[1], "j");
  ck_assert_int_eq(s->red, NF_RED_SUM);
  ck_assert_int_eq(s->n_ranges, 0);
  check_bin(s->rhs, NF_OP_MUL);
  ck_assert_int_eq(s->rhs->loc.line, 3);
  ck_assert_int_eq(s->rhs->loc.col, 15);
  check_apply(s->rhs->args[0], "A", 2);
  check_apply(s->rhs->args[1], "B", 2);
  check_name(s->rhs->args[1]->args[0], "k");
  ck_assert_int_eq(s->rhs->args[1]->args[0]->loc.col, 27);
}
END_TEST

static const char conv2d_src[] =
    "def conv2d<stride = 1, pad = 0, dilation = 1, groups = 1>(\n"
    "    I: f32[N, C, H, W], Wt: f32[K, CG, R, S]) -> (O: f32[N, K, OH, OW])\n"
    "    where OH = (H + 2 * pad - dilation * (R - 1) - 1) // stride + 1,\n"
    "          OW = (W + 2 * pad - dilation * (S - 1) - 1) // stride + 1\n"
    "    require C == CG * groups, stride > 0, K % groups == 0\n"
    "{\n"
    "  O(n, k, y, x) +=! (y * stride + r * dilation - pad >= 0 &&\n"
    "                     y * stride + r * dilation - pad < H &&\n"
    "                     x * stride + s * dilation - pad >= 0 &&\n"
    "                     x * stride + s * dilation - pad < W) ?\n"
    "      I(n, k // (K // groups) * CG + c, y * stride + r * dilation - pad,\n"
    "        x * stride + s * dilation - pad) * Wt(k, c, r, s) :\n"
    "      0.0\n"
    "    where c in 0:CG, r in 0:R, s in 0:S\n"
    "}\n";

START_TEST(parse_params_where_require) {
  const nf_ast_def *d = def1(conv2d_src);
  ck_assert_str_eq(d->name, "conv2d");
  ck_assert_int_eq(d->n_params, 4);
  ck_assert_str_eq(d->params[0].name, "stride");
  ck_assert_int_eq(d->params[0].dflt->kind, NF_A_INT);
  ck_assert_int_eq(d->params[0].dflt->ival, 1);
  ck_assert_str_eq(d->params[3].name, "groups");
  ck_assert_int_eq(d->params[3].loc.line, 1);
  ck_assert_int_eq(d->params[3].loc.col, 47);
  ck_assert_int_eq(d->n_inputs, 2);
  ck_assert_int_eq(d->inputs[1].n_dims, 4);
  ck_assert_int_eq(d->n_wheres, 2);
  ck_assert_str_eq(d->wheres[0].name, "OH");
  /* (H + ...) // stride + 1 */
  const nf_ast_expr *oh = d->wheres[0].value;
  check_bin(oh, NF_OP_ADD);
  check_bin(oh->args[0], NF_OP_FLOORDIV);
  check_name(oh->args[0]->args[1], "stride");
  check_bin(oh->args[0]->args[0], NF_OP_SUB);
  ck_assert_str_eq(d->wheres[1].name, "OW");
  ck_assert_int_eq(d->wheres[1].loc.line, 4);
  ck_assert_int_eq(d->n_requires, 3);
  check_bin(d->requires[0], NF_OP_EQ);
  check_bin(d->requires[1], NF_OP_GT);
  check_bin(d->requires[2], NF_OP_EQ);
  check_bin(d->requires[2]->args[0], NF_OP_MOD);
  ck_assert_int_eq(d->n_body, 1);
  const nf_ast_stmt *s = d->body[0];
  ck_assert_int_eq(s->red, NF_RED_SUM);
  ck_assert_int_eq(s->rhs->kind, NF_A_SELECT);
  check_bin(s->rhs->args[0], NF_OP_AND);
  check_bin(s->rhs->args[1], NF_OP_MUL);
  ck_assert_int_eq(s->rhs->args[2]->kind, NF_A_FLOAT);
  ck_assert_int_eq(s->n_ranges, 3);
  ck_assert_str_eq(s->ranges[0].name, "c");
  ck_assert_int_eq(s->ranges[0].lo->ival, 0);
  check_name(s->ranges[0].hi, "CG");
  ck_assert_str_eq(s->ranges[2].name, "s");
  check_name(s->ranges[2].hi, "S");
}
END_TEST

START_TEST(parse_packs_and_dtypes) {
  nf_ast_file *f = parse_ok(
      "def relu(X: f32[*S]) -> (Y: f32[*S]) {\n"
      "  Y(*i) = max(X(*i), 0.0)\n"
      "}\n"
      "def types(A: f64[], B: i32[2, N + 1], C: i64[*B, 3], D: bool[N],\n"
      "          E: f16[N], F: bf16[N]) -> (O: f32[]) {\n"
      "  O() = 1\n"
      "}\n");
  ck_assert_int_eq(f->n_defs, 2);
  const nf_ast_def *d = f->defs[0];
  ck_assert_int_eq(d->inputs[0].dims[0]->kind, NF_A_PACK);
  ck_assert_str_eq(d->inputs[0].dims[0]->name, "S");
  ck_assert_int_eq(d->outputs[0].dims[0]->kind, NF_A_PACK);
  const nf_ast_stmt *s = d->body[0];
  ck_assert_int_eq(s->idx[0]->kind, NF_A_PACK);
  ck_assert_str_eq(s->idx[0]->name, "i");
  ck_assert_int_eq(s->red, NF_RED_NONE);
  check_apply(s->rhs, "max", 2);
  check_apply(s->rhs->args[0], "X", 1);
  ck_assert_int_eq(s->rhs->args[0]->args[0]->kind, NF_A_PACK);
  d = f->defs[1];
  ck_assert_int_eq(d->n_inputs, 6);
  static const int want[] = {NF_F64, NF_I32, NF_I64, NF_BOOL, NF_F16, NF_BF16};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(d->inputs[i].dtype, want[i]);
  ck_assert_int_eq(d->inputs[0].n_dims, 0);
  ck_assert_int_eq(d->inputs[1].dims[0]->kind, NF_A_INT);
  check_bin(d->inputs[1].dims[1], NF_OP_ADD);
  ck_assert_int_eq(d->inputs[2].dims[0]->kind, NF_A_PACK);
  ck_assert_int_eq(d->outputs[0].n_dims, 0);
  ck_assert_int_eq(d->body[0]->n_idx, 0); /* scalar O() */
}
END_TEST

static const char lstm_src[] =
    "import nn\n"
    "\n"
    "def lltm_cell(X: f32[B, I], H: f32[B, D], C: f32[B, D],\n"
    "              W: f32[4 * D, I + D], b: f32[4 * D])\n"
    "    -> (H2: f32[B, D], C2: f32[B, D]) {\n"
    "  G(n, g) +=! (k < I ? X(n, k) : H(n, k - I)) * W(g, k) where k in 0:I + D\n"
    "  Gb(n, g) = G(n, g) + b(g)\n"
    "  In(n, d) = sigmoid(Gb(n, d)); Fg(n, d) = sigmoid(Gb(n, d + D))\n"
    "  Og(n, d) = sigmoid(Gb(n, d + 2 * D))\n"
    "  Cc(n, d) = tanh(Gb(n, d + 3 * D))\n"
    "  C2(n, d) = Fg(n, d) * C(n, d) + In(n, d) * Cc(n, d)\n"
    "  H2(n, d) = Og(n, d) * tanh(C2(n, d))\n"
    "}\n"
    "\n"
    "def lstm<steps = 8>(X: f32[T, B, I], H0: f32[B, D], C0: f32[B, D],\n"
    "                    W: f32[4 * D, I + D], b: f32[4 * D])\n"
    "    -> (H: f32[B, D], C: f32[B, D])\n"
    "    require T == steps\n"
    "{\n"
    "  Hs[0] = H0\n"
    "  Cs[0] = C0\n"
    "  for t in 0:steps {\n"
    "    Xt[t](n, i) = X(t, n, i)\n"
    "    Hs[t + 1], Cs[t + 1] = lltm_cell(Xt[t], Hs[t], Cs[t], W, b)\n"
    "  }\n"
    "  H = Hs[steps]\n"
    "  C = Cs[steps]\n"
    "}\n";

START_TEST(parse_families_for_calls_copies) {
  nf_ast_file *f = parse_ok(lstm_src);
  ck_assert_int_eq(f->n_imports, 1);
  ck_assert_str_eq(f->imports[0].lib, "nn");
  ck_assert_ptr_null(f->imports[0].path);
  ck_assert_int_eq(f->n_defs, 2);
  const nf_ast_def *cell = f->defs[0];
  ck_assert_int_eq(cell->n_outputs, 2);
  ck_assert_int_eq(cell->n_body, 8); /* ';' separates two statements */
  ck_assert_str_eq(cell->body[2]->lhs.name, "In");
  ck_assert_str_eq(cell->body[3]->lhs.name, "Fg");
  ck_assert_int_eq(cell->body[3]->loc.line, 8);
  ck_assert_int_eq(cell->body[0]->n_ranges, 1);
  check_bin(cell->body[0]->ranges[0].hi, NF_OP_ADD);
  /* (k < I ? ... : ...) * W(g, k) */
  check_bin(cell->body[0]->rhs, NF_OP_MUL);
  ck_assert_int_eq(cell->body[0]->rhs->args[0]->kind, NF_A_SELECT);
  check_bin(cell->body[0]->rhs->args[0]->args[0], NF_OP_LT);

  const nf_ast_def *d = f->defs[1];
  ck_assert_int_eq(d->n_params, 1);
  ck_assert_int_eq(d->n_requires, 1);
  ck_assert_int_eq(d->n_body, 5);
  const nf_ast_stmt *s = d->body[0]; /* Hs[0] = H0 */
  ck_assert_int_eq(s->kind, NF_S_CALL);
  ck_assert_ptr_null(s->callee);
  ck_assert_int_eq(s->n_results, 1);
  ck_assert_str_eq(s->results[0].name, "Hs");
  ck_assert_int_eq(s->results[0].sub->kind, NF_A_INT);
  ck_assert_int_eq(s->n_args, 1);
  ck_assert_int_eq(s->n_params, 0);
  ck_assert_str_eq(s->args[0].name, "H0");
  ck_assert_ptr_null(s->args[0].sub);
  s = d->body[2];
  ck_assert_int_eq(s->kind, NF_S_FOR);
  ck_assert_str_eq(s->var, "t");
  ck_assert_int_eq(s->lo->ival, 0);
  check_name(s->hi, "steps");
  ck_assert_int_eq(s->n_body, 2);
  const nf_ast_stmt *e = s->body[0]; /* Xt[t](n, i) = X(t, n, i) */
  ck_assert_int_eq(e->kind, NF_S_ELEM);
  ck_assert_str_eq(e->lhs.name, "Xt");
  check_name(e->lhs.sub, "t");
  const nf_ast_stmt *c = s->body[1];
  ck_assert_int_eq(c->kind, NF_S_CALL);
  ck_assert_str_eq(c->callee, "lltm_cell");
  ck_assert_int_eq(c->callee_loc.line, 24);
  ck_assert_int_eq(c->callee_loc.col, 28);
  ck_assert_int_eq(c->n_results, 2);
  check_bin(c->results[0].sub, NF_OP_ADD);
  ck_assert_str_eq(c->results[1].name, "Cs");
  ck_assert_int_eq(c->n_args, 5);
  ck_assert_str_eq(c->args[0].name, "Xt");
  check_name(c->args[0].sub, "t");
  ck_assert_ptr_null(c->args[4].sub);
  s = d->body[3]; /* H = Hs[steps]: a copy of a family member */
  ck_assert_int_eq(s->kind, NF_S_CALL);
  ck_assert_ptr_null(s->callee);
  ck_assert_str_eq(s->args[0].name, "Hs");
  check_name(s->args[0].sub, "steps");
}
END_TEST

START_TEST(parse_call_params) {
  const nf_ast_def *d = def1(
      "def net(I: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> (O: f32[N, K, OH, OW]) {\n"
      "  O = conv2d<stride = 2, pad = 1>(I, Wt)\n"
      "  Y = relu(O)\n"
      "  Z = f<p = (a > 1), q = a < 2>()\n"
      "  U = V\n"
      "}\n");
  const nf_ast_stmt *s = d->body[0];
  ck_assert_int_eq(s->kind, NF_S_CALL);
  ck_assert_str_eq(s->callee, "conv2d");
  ck_assert_int_eq(s->n_params, 2);
  ck_assert_str_eq(s->params[0].name, "stride");
  ck_assert_int_eq(s->params[0].value->ival, 2);
  ck_assert_str_eq(s->params[1].name, "pad");
  ck_assert_int_eq(s->n_args, 2);
  ck_assert_str_eq(s->args[1].name, "Wt");
  s = d->body[1];
  ck_assert_str_eq(s->callee, "relu");
  ck_assert_int_eq(s->n_params, 0);
  ck_assert_int_eq(s->n_args, 1);
  s = d->body[2];
  ck_assert_int_eq(s->n_params, 2);
  check_bin(s->params[0].value, NF_OP_GT);
  check_bin(s->params[1].value, NF_OP_LT);
  ck_assert_int_eq(s->n_args, 0);
  s = d->body[3];
  ck_assert_ptr_null(s->callee);
  ck_assert_str_eq(s->args[0].name, "V");
}
END_TEST

START_TEST(parse_reductions_and_ranges) {
  const nf_ast_def *d = def1(
      "def r(A: f32[N, M]) -> (S: f32[], P: f32[N], Mx: f32[N], Mn: f32[N]) {\n"
      "  S() +=! A(i, j)\n"
      "  P(i) *=! A(i, j) where j in 0:M\n"
      "  Mx(i) max=! A(i, j) where j in 1:M - 1, k in 0:2\n"
      "  Mn(i) min=! A(i, j)\n"
      "    where j in 0:M\n"
      "  T(i) = i < 2 ? A(i, 0) : -A(i, 1)\n"
      "}\n");
  ck_assert_int_eq(d->n_body, 5);
  ck_assert_int_eq(d->body[0]->red, NF_RED_SUM);
  ck_assert_int_eq(d->body[0]->n_idx, 0);
  ck_assert_int_eq(d->body[1]->red, NF_RED_PROD);
  ck_assert_int_eq(d->body[1]->n_ranges, 1);
  ck_assert_int_eq(d->body[2]->red, NF_RED_MAX);
  ck_assert_int_eq(d->body[2]->n_ranges, 2);
  check_bin(d->body[2]->ranges[0].hi, NF_OP_SUB);
  ck_assert_str_eq(d->body[2]->ranges[1].name, "k");
  ck_assert_int_eq(d->body[2]->ranges[1].loc.col, 43);
  ck_assert_int_eq(d->body[3]->red, NF_RED_MIN);
  ck_assert_int_eq(d->body[3]->n_ranges, 1); /* 'where' on the next line */
  ck_assert_int_eq(d->body[4]->red, NF_RED_NONE);
  ck_assert_int_eq(d->body[4]->rhs->kind, NF_A_SELECT);
  ck_assert_int_eq(d->body[4]->rhs->args[2]->kind, NF_A_UNARY);
  ck_assert_int_eq(d->body[4]->rhs->args[2]->op, NF_OP_NEG);
}
END_TEST

START_TEST(parse_layout_comments_continuations) {
  nf_ast_file *f = parse_ok(
      "# leading comment\n"
      "\n"
      "import \"other.nf\"   # trailing comment\n"
      "import nn\n"
      "def\n"
      "  f  # newlines anywhere in a header\n"
      "  <a\n"
      "   = 1\n"
      "   , b>\n"
      "  (A: f32[N\n"
      "  ])\n"
      "  ->\n"
      "  (B: f32[N])\n"
      "  where M =\n"
      "    N + 1\n"
      "  require a\n"
      "   > 0\n"
      "{\n"
      "\n"
      "  # a comment line\n"
      "  B(i) = A(i) +   # continues after an operator\n"
      "         1 *\n"
      "         (2\n"
      "          + 3)\n"
      "  ;;; C(i) = A(i);D(i)=A(i)\n"
      "  E(i) = i > 0 ?\n"
      "    A(i) :\n"
      "    0.0\n"
      "  F(i) =\n"
      "    max(A(i),\n"
      "        0.0)\n"
      "  G(i) = exp(\n"
      "    A(i)\n"
      "  )\n"
      "}\n"
      "def g() -> (O: f32[]) { O() = 1 }\n");
  ck_assert_int_eq(f->n_imports, 2);
  ck_assert_str_eq(f->imports[0].path, "other.nf");
  ck_assert_ptr_null(f->imports[0].lib);
  ck_assert_int_eq(f->imports[0].loc.line, 3);
  ck_assert_str_eq(f->imports[1].lib, "nn");
  ck_assert_int_eq(f->n_defs, 2);
  const nf_ast_def *d = f->defs[0];
  ck_assert_str_eq(d->name, "f");
  ck_assert_int_eq(d->n_params, 2);
  ck_assert_int_eq(d->params[0].dflt->ival, 1);
  ck_assert_ptr_null(d->params[1].dflt);
  ck_assert_int_eq(d->n_wheres, 1);
  ck_assert_int_eq(d->n_requires, 1);
  check_bin(d->requires[0], NF_OP_GT);
  ck_assert_int_eq(d->n_body, 6);
  check_bin(d->body[0]->rhs, NF_OP_ADD);
  check_bin(d->body[0]->rhs->args[1], NF_OP_MUL);
  check_bin(d->body[0]->rhs->args[1]->args[1], NF_OP_ADD);
  ck_assert_str_eq(d->body[1]->lhs.name, "C");
  ck_assert_str_eq(d->body[2]->lhs.name, "D");
  ck_assert_int_eq(d->body[3]->rhs->kind, NF_A_SELECT);
  check_apply(d->body[4]->rhs, "max", 2);
  check_apply(d->body[5]->rhs, "exp", 1);
  ck_assert_int_eq(f->defs[1]->n_body, 1);
}
END_TEST

START_TEST(parse_precedence) {
  const nf_ast_expr *e = rhs_of("a + b * c");
  check_bin(e, NF_OP_ADD);
  check_bin(e->args[1], NF_OP_MUL);
  e = rhs_of("a - b - c");
  check_bin(e, NF_OP_SUB);
  check_bin(e->args[0], NF_OP_SUB);
  check_name(e->args[1], "c");
  e = rhs_of("a // b % c / d");
  check_bin(e, NF_OP_DIV);
  check_bin(e->args[0], NF_OP_MOD);
  check_bin(e->args[0]->args[0], NF_OP_FLOORDIV);
  e = rhs_of("a || b && c == d < e + f");
  check_bin(e, NF_OP_OR);
  check_bin(e->args[1], NF_OP_AND);
  check_bin(e->args[1]->args[1], NF_OP_EQ);
  check_bin(e->args[1]->args[1]->args[1], NF_OP_LT);
  check_bin(e->args[1]->args[1]->args[1]->args[1], NF_OP_ADD);
  e = rhs_of("a <= b != c >= d");
  check_bin(e, NF_OP_NE);
  check_bin(e->args[0], NF_OP_LE);
  check_bin(e->args[1], NF_OP_GE);
  e = rhs_of("a ? b : c ? d : e");
  ck_assert_int_eq(e->kind, NF_A_SELECT);
  check_name(e->args[0], "a");
  ck_assert_int_eq(e->args[2]->kind, NF_A_SELECT);
  e = rhs_of("a ? b ? c : d : e");
  ck_assert_int_eq(e->args[1]->kind, NF_A_SELECT);
  check_name(e->args[2], "e");
  e = rhs_of("-x * y");
  check_bin(e, NF_OP_MUL);
  ck_assert_int_eq(e->args[0]->kind, NF_A_UNARY);
  ck_assert_int_eq(e->args[0]->op, NF_OP_NEG);
  e = rhs_of("!a && b");
  check_bin(e, NF_OP_AND);
  ck_assert_int_eq(e->args[0]->op, NF_OP_NOT);
  e = rhs_of("--x");
  ck_assert_int_eq(e->kind, NF_A_UNARY);
  ck_assert_int_eq(e->args[0]->kind, NF_A_UNARY);
  check_name(e->args[0]->args[0], "x");
  e = rhs_of("-1");
  ck_assert_int_eq(e->kind, NF_A_UNARY);
  ck_assert_int_eq(e->args[0]->kind, NF_A_INT);
  e = rhs_of("(a + b) * c");
  check_bin(e, NF_OP_MUL);
  check_bin(e->args[0], NF_OP_ADD);
  e = rhs_of("H[t + 1](i) + T()");
  check_bin(e, NF_OP_ADD);
  check_apply(e->args[0], "H", 1);
  check_bin(e->args[0]->sub, NF_OP_ADD);
  check_apply(e->args[1], "T", 0);
  ck_assert_ptr_null(e->args[1]->sub);
}
END_TEST

START_TEST(parse_literals) {
  const nf_ast_expr *e = rhs_of("9223372036854775807");
  ck_assert_int_eq(e->kind, NF_A_INT);
  ck_assert(e->ival == INT64_MAX);
  static const struct {
    const char *text;
    double v;
  } floats[] = {{"1.5", 1.5}, {"1e-8", 1e-8}, {"2.", 2.0},  {".5", 0.5},
                {"3e4", 3e4}, {"0.1", 0.1},   {"1E+2", 100.0}};
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
    e = rhs_of(floats[i].text);
    ck_assert_int_eq(e->kind, NF_A_FLOAT);
    ck_assert(e->fval == floats[i].v);
    ck_assert_str_eq(e->text, floats[i].text);
  }
  e = rhs_of("true || false");
  ck_assert_int_eq(e->args[0]->kind, NF_A_BOOL);
  ck_assert_int_eq(e->args[0]->ival, 1);
  ck_assert_int_eq(e->args[1]->ival, 0);
  e = rhs_of("007");
  ck_assert_int_eq(e->ival, 7);
}
END_TEST

START_TEST(parse_empty_and_blank) {
  nf_ast_file *f = parse_ok("");
  ck_assert_int_eq(f->n_defs, 0);
  ck_assert_int_eq(f->n_imports, 0);
  f = parse_ok("\n\n  # only a comment\n\n");
  ck_assert_int_eq(f->n_defs, 0);
  f = parse_ok("def f() -> (O: f32[]) {\n}");
  ck_assert_int_eq(f->defs[0]->n_body, 0);
  ck_assert_int_eq(f->defs[0]->n_inputs, 0);
  f = parse_ok("def f() -> (O: f32[]) {}\r\ndef g() -> (O: f32[]) {\r\n  O() = 1\r\n}\r\n");
  ck_assert_int_eq(f->n_defs, 2);
  ck_assert_int_eq(f->defs[1]->n_body, 1);
}
END_TEST

/* ---- param declarations ---- */

static const char params_src[] =
    "def mlp<batch = 4>(X: f32[batch, 8]) -> (Y: f32[batch, 3]) where H = 16 {\n"
    "  param W1: f32[H, 8] = kaiming_uniform\n"
    "  param b1: f32[H] = zeros\n"
    "  param W2: f64[3, H * 1] = xavier_normal(0.5)\n"
    "  param b2: bf16[3] = constant(-0.25)\n"
    "  param s: f16[] = ones; param u: f32[2] = uniform(-1, 2.5e-3)\n"
    "  param n: f32[2, 2] =\n"
    "      normal(1e-8, 0.1)\n"
    "  param xu: f32[2, 2] = xavier_uniform()\n"
    "  param ku: f32[2, 2] = kaiming_uniform(0.01)\n"
    "  param kn: f32[2, 2] = kaiming_normal\n"
    "  param c: f32[2] = constant(3)\n"
    "  param param: f32[] = zeros\n"
    "  Y(b, o) = X(b, o) * W1(o, o)\n"
    "}\n";

START_TEST(parse_param_decls) {
  const nf_ast_def *d = def1(params_src);
  static const struct {
    const char *name;
    int dtype, rank, init, n_args;
    double a, b;
  } want[] = {
      {"W1", NF_F32, 2, NF_INIT_KAIMING_UNIFORM, 0, 0, 0},
      {"b1", NF_F32, 1, NF_INIT_ZEROS, 0, 0, 0},
      {"W2", NF_F64, 2, NF_INIT_XAVIER_NORMAL, 1, 0.5, 0},
      {"b2", NF_BF16, 1, NF_INIT_CONSTANT, 1, -0.25, 0},
      {"s", NF_F16, 0, NF_INIT_ONES, 0, 0, 0},
      {"u", NF_F32, 1, NF_INIT_UNIFORM, 2, -1, 2.5e-3},
      {"n", NF_F32, 2, NF_INIT_NORMAL, 2, 1e-8, 0.1},
      {"xu", NF_F32, 2, NF_INIT_XAVIER_UNIFORM, 0, 0, 0},
      {"ku", NF_F32, 2, NF_INIT_KAIMING_UNIFORM, 1, 0.01, 0},
      {"kn", NF_F32, 2, NF_INIT_KAIMING_NORMAL, 0, 0, 0},
      {"c", NF_F32, 1, NF_INIT_CONSTANT, 1, 3, 0},
      {"param", NF_F32, 0, NF_INIT_ZEROS, 0, 0, 0},
  };
  int n = (int)(sizeof want / sizeof want[0]);
  ck_assert_int_eq(d->n_body, n + 1);
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = d->body[k];
    ck_assert_int_eq(st->kind, NF_S_PARAM);
    ck_assert_str_eq(st->decl.name, want[k].name);
    ck_assert_int_eq(st->decl.dtype, want[k].dtype);
    ck_assert_int_eq(st->decl.n_dims, want[k].rank);
    ck_assert_int_eq(st->init, want[k].init);
    ck_assert_int_eq(st->n_init_args, want[k].n_args);
    if (want[k].n_args > 0) ck_assert(st->init_args[0] == want[k].a);
    if (want[k].n_args > 1) ck_assert(st->init_args[1] == want[k].b);
  }
  /* locations: the statement at `param`, the declaration at its name, the
   * initializer at its name */
  ck_assert_uint_eq(d->body[0]->loc.line, 2);
  ck_assert_uint_eq(d->body[0]->loc.col, 3);
  ck_assert_uint_eq(d->body[0]->decl.loc.col, 9);
  ck_assert_uint_eq(d->body[0]->init_loc.col, 25);
  ck_assert_uint_eq(d->body[6]->init_loc.line, 8);
  check_bin(d->body[2]->decl.dims[1], NF_OP_MUL);
  ck_assert_int_eq(d->body[n]->kind, NF_S_ELEM);
  ck_assert_str_eq(nf_init_name(NF_INIT_ZEROS), "zeros");
  ck_assert_str_eq(nf_init_name(NF_INIT_XAVIER_NORMAL), "xavier_normal");
  ck_assert_str_eq(nf_init_name(NF_INIT_KAIMING_NORMAL), "kaiming_normal");
  ck_assert_str_eq(nf_init_name((nf_init_kind)99), "?");
}
END_TEST

/* `param` is a keyword only in `param NAME:` at the start of a statement;
 * elsewhere it is an ordinary name. */
START_TEST(parse_param_stays_a_name) {
  const nf_ast_def *d = def1(
      "def param(param: f32[N]) -> (Y: f32[N]) {\n"
      "  param2(i) = param(i) * param(i)\n"
      "  param3 = param\n"
      "  T, U = param(param, param3)\n"
      "  V = param<param = 1>(param)\n"
      "  P[0] = param\n"
      "  param[1] = P[0]\n"
      "  Y(i) = param[1](i) + param2(i) where param in 0:1\n"
      "}\n");
  ck_assert_str_eq(d->name, "param");
  ck_assert_str_eq(d->inputs[0].name, "param");
  ck_assert_int_eq(d->n_body, 7);
  ck_assert_int_eq(d->body[0]->kind, NF_S_ELEM);
  check_apply(d->body[0]->rhs->args[0], "param", 1);
  ck_assert_int_eq(d->body[1]->kind, NF_S_CALL);
  ck_assert_ptr_null(d->body[1]->callee);
  ck_assert_str_eq(d->body[1]->args[0].name, "param");
  ck_assert_str_eq(d->body[2]->callee, "param");
  ck_assert_str_eq(d->body[3]->params[0].name, "param");
  ck_assert_str_eq(d->body[5]->results[0].name, "param");
  ck_assert_ptr_nonnull(d->body[5]->results[0].sub);
  ck_assert_str_eq(d->body[6]->ranges[0].name, "param");
  for (int k = 0; k < d->n_body; k++) ck_assert_int_ne(d->body[k]->kind, NF_S_PARAM);
}
END_TEST

/* ---- bad inputs ---- */

typedef struct bad_case {
  const char *src;
  unsigned line, col;
  const char *msg;
  int n_errors; /* errors counted in all */
} bad_case;

#define HDR "def f(A: f32[N]) -> (B: f32[N]) {\n"
#define INITS                                                            \
  "zeros, ones, constant(V), uniform(LO, HI), normal(MEAN, STD), "        \
  "xavier_uniform, xavier_normal, kaiming_uniform or kaiming_normal"

static const bad_case bad_cases[] = {
    {HDR "  B(i) = A(i, j k)\n}\n", 2, 17,
     "expected ')' after the arguments of 'A', found 'k'", 1},
    {HDR "  B(i) = exp(A(i)\n}\n", 3, 1,
     "expected ')' after the arguments of 'exp', found '}'", 1},
    {HDR "  B(i) = (A(i) + 1\n}\n", 3, 1, "expected ')' to close '(', found '}'", 1},
    {"def f(A: f33[N]) -> (B: f32[N]) {\n}\n", 1, 10,
     "unknown dtype 'f33' (expected f32, f64, i32, i64, bool, f16 or bf16)", 1},
    {HDR "  B(i) += A(i, k)\n}\n", 2, 8,
     "tensors are defined once: use '+=!' (TC's '+=' without '!' is not "
     "supported)", 1},
    {HDR "  B(i) *= A(i, k)\n}\n", 2, 8,
     "tensors are defined once: use '*=!' (TC's '*=' without '!' is not "
     "supported)", 1},
    {HDR "  B(i) max= A(i, k)\n}\n", 2, 8,
     "tensors are defined once: use 'max=!' (TC's 'max=' without '!' is not "
     "supported)", 1},
    {HDR "  B(i) min =! A(i, k)\n}\n", 2, 8,
     "expected 'min=!' (written without spaces)", 1},
    {HDR "  B(i) -= A(i)\n}\n", 2, 8,
     "expected '=', '+=!', '*=!', 'max=!' or 'min=!' after 'B(...)', found "
     "'-'", 1},
    {"import \"nn.nf\n", 1, 8, "unterminated string literal", 1},
    {"import \"nn.nf", 1, 8, "unterminated string literal", 1},
    {"import \"\"\n", 1, 8, "empty import path", 1},
    {"import\n", 1, 7,
     "expected a library name or a \"path.nf\" after 'import', found end of "
     "line", 1},
    {"import nn nn\n", 1, 11,
     "expected the end of the line after the import, found 'nn'", 1},
    {HDR "  B(i) = A(i) * 9223372036854775808\n}\n", 2, 17,
     "integer literal '9223372036854775808' too large (the largest is "
     "9223372036854775807)", 1},
    {HDR "  B(i) = -9223372036854775808\n}\n", 2, 11,
     "integer literal '9223372036854775808' too large (the largest is "
     "9223372036854775807)", 1},
    {HDR "  B(i) = A(i) * 1e999\n}\n", 2, 17, "float literal '1e999' out of range", 1},
    {HDR "  B(i) = 1abc\n}\n", 2, 10, "invalid number '1abc'", 1},
    {HDR "  B(i) = 1.2.3\n}\n", 2, 10, "invalid number '1.2.3'", 1},
    {HDR "  B(i) = A(i) @ 2\n}\n", 2, 15, "stray character '@'", 1},
    {HDR "  B(i) = A(i) & A(i)\n}\n", 2, 15, "stray character '&'", 1},
    {HDR "  B(i) = A(i) \xc3\x97 2\n}\n", 2, 15,
     "invalid byte 0xc3 (outside strings and comments, .nf text is ASCII)", 1},
    {"def f(A: f32[*S]) -> (B: f32[*S]) {\n  B(*i) = A(*i + 1)\n}\n", 2, 13,
     "a pack '*i' can only be an index, a dim or a left-side variable, not "
     "part of arithmetic", 1},
    {"def f(A: f32[*S]) -> (B: f32[*S]) {\n  B(*i) = 2 * *i\n}\n", 2, 15,
     "a pack '*i' can only be an index, a dim or a left-side variable, not "
     "part of arithmetic", 1},
    {"def f(A: f32[*S + 1]) -> (B: f32[N]) {\n}\n", 1, 14,
     "a pack '*S' can only be an index, a dim or a left-side variable, not "
     "part of arithmetic", 1},
    {"def f(A: f32[N]) (B: f32[N]) {\n}\n", 1, 18,
     "expected '->' and the outputs of 'f', found '('", 1},
    {"def f(A: f32[N]) -> () {\n}\n", 1, 22,
     "def 'f' must have at least one output", 1},
    {"def f(A: f32[N]) -> B: f32[N] {\n}\n", 1, 21,
     "expected '(' and the outputs of 'f', found 'B'", 1},
    {"def for(A: f32[N]) -> (B: f32[N]) {\n}\n", 1, 5,
     "expected a def name after 'def', found 'for'", 1},
    {"def f(A f32[N]) -> (B: f32[N]) {\n}\n", 1, 9,
     "expected ':' and a dtype after 'A', found 'f32'", 1},
    {"def f(A: f32) -> (B: f32[N]) {\n}\n", 1, 13,
     "expected '[' and the dims of 'A' (f32[] for a scalar), found ')'", 1},
    {"def f(A: f32[N) -> (B: f32[N]) {\n}\n", 1, 15,
     "expected ']' after the dims of 'A', found ')'", 1},
    {"def f<>(A: f32[N]) -> (B: f32[N]) {\n}\n", 1, 7,
     "expected a parameter name in 'f<...>', found '>'", 1},
    {"def f<a = 1 > 0>(A: f32[N]) -> (B: f32[N]) {\n}\n", 1, 15,
     "expected '(' and the inputs of 'f', found '0'", 1},
    {"def f(A: f32[N]) -> (B: f32[N])\n  B(i) = A(i)\n}\n", 2, 3,
     "expected '{' and the statements of 'f', found 'B'", 1},
    {"def f(A: f32[N]) -> (B: f32[N]) where M 3 {\n}\n", 1, 41,
     "expected '=' after 'where M', found '3'", 1},
    {HDR "  B(i) = A(i)\n", 3, 1,
     "expected '}' to close def 'f', found end of file", 1},
    {HDR "  for t in 0:3 {\n    B(i) = A(i)\n}\n", 5, 1,
     "expected '}' to close def 'f', found end of file", 1},
    {HDR "  B(i) = A(i)\ndef g() -> (O: f32[]) {\n}\n", 3, 1,
     "expected '}' to close def 'f', found 'def'", 1},
    {HDR "  B, C = A\n}\n", 2, 3, "a copy 'T = U' has one result, not 2", 1},
    {HDR "  B(i + 1) = A(i)\n}\n", 2, 7,
     "expected ')' after the indices of 'B' (left-side indices are plain "
     "variable names), found '+'", 1},
    {HDR "  B(1) = A(1)\n}\n", 2, 5,
     "expected an index variable or a pack '*name' on the left of 'B', found "
     "'1'", 1},
    {HDR "  B = \n}\n", 3, 1, "expected a tensor, a call or a number, found '}'", 1},
    {HDR "  B = f<>(A)\n}\n", 2, 9,
     "expected a parameter name in 'f<...>', found '>'", 1},
    {HDR "  B = f<stride 2>(A)\n}\n", 2, 16,
     "expected '=' and a value after parameter 'stride', found '2'", 1},
    {HDR "  B = f<a = 1>\n}\n", 3, 1,
     "expected '(' and the arguments of 'f', found '}'", 1},
    {HDR "  B = f(A + 1 C)\n}\n", 2, 15,
     "expected ')' after the arguments of 'f', found 'C'", 1},
    {HDR "  B = f(A || 2)\n}\n", 2, 11,
     "'||' is not an operator of tensor expressions (whole tensors take + - * / // %, one "
     "comparison and calls); write an element statement, e.g. 'Y(*i) = ...', or call "
     "where(C, A, B)", 1},
    {HDR "  B, C = A * 2.0\n}\n", 2, 3, "an expression has one result, not 2", 1},
    {HDR "  B = H[0](A)\n}\n", 2, 11,
     "a call names a def, not a tensor family member 'H[...]'", 1},
    {HDR "  B(i) = H[0] + 1\n}\n", 2, 15,
     "expected '(' with the indices of 'H[...]', found '+'", 1},
    {HDR "  B(i) = A(i) C(i)\n}\n", 2, 15,
     "expected the end of the statement (a new line or ';'), found 'C'", 1},
    {HDR "  B(i) = ?\n}\n", 2, 10, "expected an expression, found '?'", 1},
    {HDR "  B(i) = A(i) > 0 ? 1\n}\n", 2, 22,
     "expected ':' in 'cond ? a : b', found end of line", 1},
    {HDR "  B(i) = \"s\"\n}\n", 2, 10, "expected an expression, found a string", 1},
    {HDR "  B += A\n}\n", 2, 5,
     "expected '(' with the indices of 'B', or ',' or '=' for a call, found "
     "'+='", 1},
    {HDR "  where k in 0:N\n}\n", 2, 3, "expected a statement, found 'where'", 1},
    {HDR "  B(i) = A(k) where k 0:N\n}\n", 2, 23,
     "expected 'in' after 'where k', found '0'", 1},
    {HDR "  for t in 0 {\n  }\n}\n", 2, 14,
     "expected ':' in the range 'LO:HI' of 't', found '{'", 1},
    {HDR "  for t in 0:3\n  B(i) = A(i)\n}\n", 2, 15,
     "expected '{' after 'for t in LO:HI', found end of line", 1},
    {"foo(x)\n", 1, 1, "expected 'def' or 'import', found 'foo'", 1},
    {"}\n", 1, 1, "expected 'def' or 'import', found '}'", 1},
    {"def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = A(i)\n}}\n", 3, 2,
     "expected 'def' or 'import', found '}'", 1},
    /* param declarations: the initializer, its arity and arguments */
    {HDR "  param W: f32[N] = glorot\n}\n", 2, 21,
     "unknown initializer 'glorot' (expected " INITS ")", 1},
    {HDR "  param W: f32[N] = 3\n}\n", 2, 21,
     "expected an initializer (" INITS "), found '3'", 1},
    {HDR "  param W: f32[N]\n}\n", 2, 18,
     "expected '=' and an initializer (" INITS ") after param 'W', found "
     "end of line", 1},
    {HDR "  param W: f32[N] = constant\n}\n", 2, 21,
     "'constant' takes 1 argument (V), got 0", 1},
    {HDR "  param W: f32[N] = uniform(1)\n}\n", 2, 21,
     "'uniform' takes 2 arguments (LO, HI), got 1", 1},
    {HDR "  param W: f32[N] = normal(0, 1, 2)\n}\n", 2, 21,
     "'normal' takes 2 arguments (MEAN, STD), got 3", 1},
    {HDR "  param W: f32[N] = zeros(1)\n}\n", 2, 21,
     "'zeros' takes no arguments, got 1", 1},
    {HDR "  param W: f32[N] = xavier_uniform(1, 2)\n}\n", 2, 21,
     "'xavier_uniform' takes at most 1 argument (the gain, optional), got 2",
     1},
    {HDR "  param W: f32[N] = kaiming_normal(0.1, 2)\n}\n", 2, 21,
     "'kaiming_normal' takes at most 1 argument (the negative slope a, "
     "optional), got 2", 1},
    {HDR "  param W: f32[N] = uniform(0.5, -0.5)\n}\n", 2, 21,
     "uniform(LO, HI) needs LO <= HI, got LO = 0.5 and HI = -0.5", 1},
    {HDR "  param W: f32[N] = normal(0, -1e-3)\n}\n", 2, 21,
     "normal(MEAN, STD) needs STD >= 0, got STD = -0.001", 1},
    {HDR "  param W: f32[N] = constant(N)\n}\n", 2, 30,
     "expected a number (initializer arguments are numeric literals), found "
     "'N'", 1},
    {HDR "  param W: f32[N] = constant(--1)\n}\n", 2, 31,
     "expected a number (initializer arguments are numeric literals), found "
     "'-'", 1},
    {HDR "  param W: f32[N] = constant(1 + 2)\n}\n", 2, 32,
     "expected ')' after the arguments of 'constant', found '+'", 1},
    {HDR "  param W: f32[N] = zeros B(i) = A(i)\n}\n", 2, 27,
     "expected the end of the statement (a new line or ';'), found 'B'", 1},
    {HDR "  param W f32[N] = zeros\n}\n", 2, 9,
     "expected '(' with the indices of 'param', or ',' or '=' for a call, "
     "found 'W'", 1},
    {HDR "  param W: f32 = zeros\n}\n", 2, 16,
     "expected '[' and the dims of 'W' (f32[] for a scalar), found '='", 1},
    {HDR "  for t in 0:2 {\n    param W: f32[N] = zeros\n  }\n  B(i) = A(i)\n}\n",
     3, 5,
     "param declarations are allowed only at the top level of a def's body, "
     "not inside 'for'", 1},
    /* several errors: one per statement, recovery at the next statement
     * or def */
    {HDR "  B(i) = A(i) +\n  C(i) = @ + @\n  D(i) += 1\n  E(i) = A(i\n"
         "}\ndef g(A: f32[N) -> (B: f32[N]) {\n  B(i) = A(i)\n}\n"
         "def h() -> (O: f32[]) {\n  O() = 1 2\n}\n",
     3, 8, "expected the end of the statement (a new line or ';'), found '='",
     5},
    {HDR "  for t in 0:3 {\n    B(i) = @\n    C(i) = 1\n  }\n  D(i) = @\n}\n",
     3, 12, "stray character '@'", 2},
    {HDR "  for t in 0:@ {\n    B(i) = @\n  }\n  D(i) = 1\n}\n", 2, 14,
     "stray character '@'", 1},
};

static void check_first_error(const char *src, size_t len, unsigned line,
                              unsigned col, const char *msg) {
  /* file:line:col: error: message, the source line, the caret */
  char want[2048];
  const char *p = src, *end = src + len;
  for (unsigned l = 1; l < line && p < end; p++)
    if (*p == '\n') l++;
  const char *e = p;
  while (e < end && *e != '\n') e++;
  char caret[256];
  unsigned n = col - 1 < (unsigned)(e - p) + 1 ? col - 1 : (unsigned)(e - p);
  ck_assert_uint_lt(n, sizeof caret - 2);
  memset(caret, ' ', n);
  caret[n] = '^';
  caret[n + 1] = 0;
  snprintf(want, sizeof want, "t.nf:%u:%u: error: %s\n  %.*s\n  %s\n", line,
           col, msg, (int)(e - p), p, caret);
  const char *got = nf_diag_text(diag);
  ck_assert_msg(strncmp(got, want, strlen(want)) == 0,
                "wrong first error for:\n%s\nwant:\n%sgot:\n%s", src, want,
                got);
}

START_TEST(parse_rejects_bad_input) {
  const bad_case *c = &bad_cases[_i];
  nf_ast_file *f = (nf_ast_file *)1;
  int rc = parse_n(c->src, 0, &f);
  ck_assert_msg(rc == NF_ESYNTAX, "case %d accepted:\n%s", _i, c->src);
  ck_assert_ptr_null(f);
  check_first_error(c->src, strlen(c->src), c->line, c->col, c->msg);
  int want = c->n_errors;
  ck_assert_msg(nf_diag_count(diag) == want,
                "case %d: %d errors, want %d:\n%s", _i, nf_diag_count(diag),
                want, nf_diag_text(diag));
}
END_TEST

START_TEST(parse_unclosed_brace_note) {
  nf_ast_file *f;
  ck_assert_int_eq(parse_n(HDR "  B(i) = A(i)\n", 0, &f), NF_ESYNTAX);
  const char *text = nf_diag_text(diag);
  ck_assert_msg(strstr(text, "t.nf:1:33: note: '{' opened here\n") != NULL,
                "%s", text);
}
END_TEST

START_TEST(parse_nul_byte) {
  static const char src[] = HDR "  B(i) = A(i)\0\n}\n";
  nf_ast_file *f;
  ck_assert_int_eq(parse_n(src, sizeof src - 1, &f), NF_ESYNTAX);
  const char *text = nf_diag_text(diag);
  ck_assert_msg(strncmp(text, "t.nf:2:14: error: invalid byte 0x00\n", 36) == 0,
                "%s", text);
  ck_assert_int_eq(nf_diag_count(diag), 1);
  static const char src2[] = "import \"a\0b\"\n";
  nf_diag_clear(diag);
  ck_assert_int_eq(parse_n(src2, sizeof src2 - 1, &f), NF_ESYNTAX);
  text = nf_diag_text(diag);
  ck_assert_msg(strncmp(text,
                        "t.nf:1:8: error: invalid byte 0x00 in string literal\n",
                        53) == 0,
                "%s", text);
}
END_TEST

/* Nesting past NF_PARSE_MAX_DEPTH is one located error, never a crash. */
static void check_too_deep(const char *open, const char *close, int n,
                           size_t at, const char *what) {
  nf_buf b = NF_BUF_INIT;
  nf_buf_puts(&b, "def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = ");
  size_t start = b.len;
  for (int i = 0; i < n; i++) nf_buf_puts(&b, open);
  nf_buf_puts(&b, "x");
  for (int i = 0; i < n; i++) nf_buf_puts(&b, close);
  nf_buf_puts(&b, "\n}\n");
  ck_assert(!b.oom);
  char *text = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_free(&b);
  nf_ast_file *f;
  nf_diag_clear(diag);
  ck_assert_int_eq(parse_n(text, 0, &f), NF_ESYNTAX);
  ck_assert_int_eq(nf_diag_count(diag), 1);
  const char *got = nf_diag_text(diag);
  char want[128];
  snprintf(want, sizeof want, "t.nf:2:%zu: error: %s nested too deeply",
           (size_t)(start - 34 + 1 + NF_PARSE_MAX_DEPTH * strlen(open) + at),
           what);
  ck_assert_msg(strncmp(got, want, strlen(want)) == 0, "want %s\ngot %.200s",
                want, got);
}

START_TEST(parse_nesting_too_deep) {
  /* 200 levels are fine; the 201st '(' (or '-', ...) is too deep. */
  check_too_deep("(", ")", 100000, 0, "expression");
  check_too_deep("-", "", 100000, 0, "expression");
  check_too_deep("f(", ")", 1000, 1, "expression");
  check_too_deep("H[", "](i)", 1000, 1, "expression");
  check_too_deep("x ? y : ", "", 1000, 2, "expression");
  check_too_deep("!", "", NF_PARSE_MAX_DEPTH + 1, 0, "expression");
  nf_buf b = NF_BUF_INIT;
  nf_buf_puts(&b, "def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = ");
  for (int i = 0; i < NF_PARSE_MAX_DEPTH; i++) nf_buf_puts(&b, "(");
  nf_buf_puts(&b, "x");
  for (int i = 0; i < NF_PARSE_MAX_DEPTH; i++) nf_buf_puts(&b, ")");
  nf_buf_puts(&b, "\n}\n");
  char *text = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_free(&b);
  nf_ast_file *f;
  nf_diag_clear(diag);
  ck_assert_int_eq(parse_n(text, 0, &f), NF_OK);
}
END_TEST

START_TEST(parse_long_chains_bounded) {
  /* A long left-associative chain builds a tall tree: bounded too. */
  nf_buf b = NF_BUF_INIT;
  nf_buf_puts(&b, "def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = x");
  for (int i = 0; i < 100000; i++) nf_buf_puts(&b, " + x");
  nf_buf_puts(&b, "\n}\n");
  char *text = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_reset(&b);
  nf_ast_file *f;
  ck_assert_int_eq(parse_n(text, 0, &f), NF_ESYNTAX);
  ck_assert_int_eq(nf_diag_count(diag), 1);
  ck_assert(strstr(nf_diag_text(diag), "expression nested too deeply"));
  /* Selects chain to the right and count as nesting. */
  nf_buf_puts(&b, "def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = x");
  for (int i = 0; i < 100000; i++) nf_buf_puts(&b, " ? x : x");
  nf_buf_puts(&b, "\n}\n");
  text = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_reset(&b);
  nf_diag_clear(diag);
  ck_assert_int_eq(parse_n(text, 0, &f), NF_ESYNTAX);
  ck_assert_int_eq(nf_diag_count(diag), 1);
  /* 'for' nesting. */
  nf_buf_puts(&b, "def f(A: f32[N]) -> (B: f32[N]) {\n");
  for (int i = 0; i < 10000; i++) nf_buf_puts(&b, "for t in 0:1 {\n");
  for (int i = 0; i < 10000; i++) nf_buf_puts(&b, "}\n");
  nf_buf_puts(&b, "}\n");
  text = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_free(&b);
  nf_diag_clear(diag);
  ck_assert_int_eq(parse_n(text, 0, &f), NF_ESYNTAX);
  ck_assert_msg(strstr(nf_diag_text(diag), "'for' loops nested too deeply"),
                "%.300s", nf_diag_text(diag));
}
END_TEST

/* ---- printer ---- */

static char *print_file(const nf_ast_file *f) {
  nf_buf b = NF_BUF_INIT;
  nf__ast_print_file(f, &b);
  ck_assert(!b.oom);
  char *s = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_free(&b);
  return s;
}

static void check_expr_prints(const char *in, const char *want) {
  const nf_ast_expr *e = rhs_of(in);
  nf_buf b = NF_BUF_INIT;
  nf__ast_print_expr(e, &b);
  ck_assert_msg(strcmp(nf_buf_str(&b), want) == 0, "%s printed as %s, want %s",
                in, nf_buf_str(&b), want);
  /* and the printed form parses back to the same tree */
  const nf_ast_expr *e2 = rhs_of(nf_buf_str(&b));
  ck_assert_msg(nf__ast_expr_equal(e, e2), "%s: reparse differs", in);
  nf_buf_free(&b);
}

START_TEST(parse_print_precedence) {
  check_expr_prints("a - (b - c)", "a - (b - c)");
  check_expr_prints("(a - b) - c", "a - b - c");
  check_expr_prints("(a + b) * c", "(a + b) * c");
  check_expr_prints("a + (b * c)", "a + b * c");
  check_expr_prints("a / (b * c)", "a / (b * c)");
  check_expr_prints("(a // b) % c", "a // b % c");
  check_expr_prints("a ? b : c ? d : e", "a ? b : c ? d : e");
  check_expr_prints("a ? b : (c ? d : e)", "a ? b : c ? d : e");
  check_expr_prints("(a ? b : c) ? d : e", "(a ? b : c) ? d : e");
  check_expr_prints("a ? b ? c : d : e", "a ? (b ? c : d) : e");
  check_expr_prints("(a ? b : c) + 1", "(a ? b : c) + 1");
  check_expr_prints("-(-x)", "-(-x)");
  check_expr_prints("--x", "-(-x)");
  check_expr_prints("- -1", "-(-1)");
  check_expr_prints("-!x", "-(!x)");
  check_expr_prints("!(a < b)", "!(a < b)");
  check_expr_prints("!a < b", "!a < b");
  check_expr_prints("-(a + b)", "-(a + b)");
  check_expr_prints("-x * y", "-x * y");
  check_expr_prints("-(x * y)", "-(x * y)");
  check_expr_prints("a * -b", "a * -b");
  check_expr_prints("a - -b", "a - -b");
  check_expr_prints("(a || b) && c", "(a || b) && c");
  check_expr_prints("a || b && c", "a || b && c");
  check_expr_prints("(a == b) == c", "a == b == c");
  check_expr_prints("a == (b == c)", "a == (b == c)");
  check_expr_prints("(a < b) == (c >= d)", "a < b == c >= d");
  check_expr_prints("((x))", "x");
  check_expr_prints("f(a, (b + c) * d, *i)", "f(a, (b + c) * d, *i)");
  check_expr_prints("H[(t + 1)](i)", "H[t + 1](i)");
  check_expr_prints("exp(-(x))", "exp(-x)");
  /* floats: shortest text that reads back, always float-looking */
  check_expr_prints("1.50", "1.5");
  check_expr_prints("2.", "2.0");
  check_expr_prints(".5", "0.5");
  check_expr_prints("3e4", "30000.0");
  check_expr_prints("100.0", "100.0");
  check_expr_prints("123456.5", "123456.5");
  check_expr_prints("1e15", "1000000000000000.0");
  check_expr_prints("1e16", "1e+16");
  check_expr_prints("1.25e15", "1250000000000000.0");
  check_expr_prints("0.0001", "0.0001");
  check_expr_prints("0.00001", "1e-05");
  check_expr_prints("0.", "0.0");
  check_expr_prints("1e20", "1e+20");
  check_expr_prints("1e-8", "1e-08");
  check_expr_prints("0.1", "0.1");
  check_expr_prints("0.30000000000000004", "0.30000000000000004");
  check_expr_prints("1e-320", "1e-320");
  check_expr_prints("3.4028234663852886e+38", "3.4028234663852886e+38");
  check_expr_prints("true && !false", "true && !false");
}
END_TEST

START_TEST(parse_print_canonical_layout) {
  nf_ast_file *f = parse_ok(
      "def b(X: f32[*S]) -> (Y: f32[*S]) { Y(*i) = X(*i) }\n"
      "import \"x.nf\"\n"
      "def a<k, s = k>(X: f32[N, C], W: f32[C]) -> (Y: f32[N], Z: f32[])\n"
      "  where M = N // s, Q = (M > 1 ? 2 : 1) require s > 0, k >= 1 {\n"
      "  T(n) +=! X(n, c) * W(c) where c in 0:C; Z() max=! T(n)\n"
      "  for t in 0:(s > 1 ? 2 : 3) { U[t] = T }\n"
      "  Y, V = g<p = (k > 1), q = k >= 2 ? 1 : 0, r = -1>(U[0], T)\n"
      "}\n"
      "import nn\n");
  const char *want =
      "import \"x.nf\"\n"
      "import nn\n"
      "\n"
      "def b(X: f32[*S]) -> (Y: f32[*S]) {\n"
      "  Y(*i) = X(*i)\n"
      "}\n"
      "\n"
      "def a<k, s = k>(X: f32[N, C], W: f32[C]) -> (Y: f32[N], Z: f32[])\n"
      "    where M = N // s, Q = M > 1 ? 2 : 1\n"
      "    require s > 0, k >= 1 {\n"
      "  T(n) +=! X(n, c) * W(c) where c in 0:C\n"
      "  Z() max=! T(n)\n"
      "  for t in 0:(s > 1 ? 2 : 3) {\n"
      "    U[t] = T\n"
      "  }\n"
      "  Y, V = g<p = (k > 1), q = k >= 2 ? 1 : 0, r = -1>(U[0], T)\n"
      "}\n";
  char *got = print_file(f);
  ck_assert_str_eq(got, want);
  nf_ast_file *g = parse_ok(got);
  ck_assert(nf__ast_file_equal(f, g));
  ck_assert_str_eq(print_file(g), want);

  nf_buf b = NF_BUF_INIT;
  nf__ast_print_signature(f->defs[1], &b);
  ck_assert_str_eq(nf_buf_str(&b),
                   "a<k, s = k>(X: f32[N, C], W: f32[C]) -> (Y: f32[N], Z: f32[])");
  nf_buf_reset(&b);
  nf__ast_print_def(f->defs[0], &b);
  ck_assert_str_eq(nf_buf_str(&b),
                   "def b(X: f32[*S]) -> (Y: f32[*S]) {\n  Y(*i) = X(*i)\n}\n");
  nf_buf_free(&b);
  ck_assert_str_eq(print_file(parse_ok("import nn\n")), "import nn\n");
  ck_assert_str_eq(print_file(parse_ok("\n")), "");
}
END_TEST

START_TEST(parse_print_param_decls) {
  nf_ast_file *f = parse_ok(
      "def m(X: f32[B, I]) -> (Y: f32[B, O]) where O = 2 * I {\n"
      "  param W: f32[O, (I)] = kaiming_uniform ; param b: f32[O] = constant(-0.)\n"
      "  param g: f64[] = normal(-1, 0.30000000000000004)\n"
      "  param h: f32[2] = uniform(-1e20, 1e-320)\n"
      "  param x: f32[2, 3] = xavier_uniform()\n"
      "  param k: f32[2, 3] = kaiming_normal(2.)\n"
      "  param n: f32[2] = constant(9223372036854775807)\n"
      "  Y(n, o) +=! X(n, i) * W(o, i) + b(o) + g()\n"
      "}\n");
  const char *want =
      "def m(X: f32[B, I]) -> (Y: f32[B, O])\n"
      "    where O = 2 * I {\n"
      "  param W: f32[O, I] = kaiming_uniform\n"
      "  param b: f32[O] = constant(-0.0)\n"
      "  param g: f64[] = normal(-1.0, 0.30000000000000004)\n"
      "  param h: f32[2] = uniform(-1e+20, 1e-320)\n"
      "  param x: f32[2, 3] = xavier_uniform\n"
      "  param k: f32[2, 3] = kaiming_normal(2.0)\n"
      "  param n: f32[2] = constant(9.223372036854776e+18)\n"
      "  Y(n, o) +=! X(n, i) * W(o, i) + b(o) + g()\n"
      "}\n";
  char *got = print_file(f);
  ck_assert_str_eq(got, want);
  nf_ast_file *g = parse_ok(got);
  ck_assert(nf__ast_file_equal(f, g));
  ck_assert_str_eq(print_file(g), want);
  /* -0.0 keeps its sign through the round trip */
  ck_assert(g->defs[0]->body[1]->init_args[0] == 0.0);
  ck_assert(signbit(g->defs[0]->body[1]->init_args[0]));
  /* equality sees every part of a declaration */
  static const char *const variants[] = {
      "  param W: f32[O, I] = kaiming_uniform(0.0)\n",
      "  param W: f32[O, I] = kaiming_normal\n",
      "  param W: f64[O, I] = kaiming_uniform\n",
      "  param W: f32[I, O] = kaiming_uniform\n",
      "  param V: f32[O, I] = kaiming_uniform\n",
      "  param W: f32[O] = kaiming_uniform\n",
  };
  for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
    char text[512];
    snprintf(text, sizeof text, "def m() -> (Y: f32[]) {\n%s  Y() = 1.0\n}\n",
             variants[k]);
    char *copy = nf_arena_strdup(arena, text);
    nf_ast_file *a = parse_ok(
        "def m() -> (Y: f32[]) {\n  param W: f32[O, I] = kaiming_uniform\n"
        "  Y() = 1.0\n}\n");
    ck_assert_msg(!nf__ast_file_equal(a, parse_ok(copy)), "equal: %s", variants[k]);
  }
  nf_ast_file *a = parse_ok("def m() -> (Y: f32[]) {\n  param c: f32[] = constant(0.1)\n}\n");
  nf_ast_file *b = parse_ok("def m() -> (Y: f32[]) {\n  param c: f32[] = constant(0.10000000000000002)\n}\n");
  ck_assert(!nf__ast_file_equal(a, b));
  b = parse_ok("def m() -> (Y: f32[]) {\n  param c: f32[] = constant(.1)\n}\n");
  ck_assert(nf__ast_file_equal(a, b));
}
END_TEST

/* print(parse(x)) is a fixed point and re-parses to an equal tree. */
static void check_round_trip(const char *src) {
  nf_ast_file *f1 = parse_ok(src);
  char *p1 = print_file(f1);
  nf_ast_file *f2 = parse_ok(p1);
  ck_assert_msg(nf__ast_file_equal(f1, f2), "re-parse differs:\n%s", p1);
  char *p2 = print_file(f2);
  ck_assert_str_eq(p1, p2);
}

static char *read_nn(void) {
  const char *dir = getenv("NEOFLOW_LIB");
  char path[1024];
  snprintf(path, sizeof path, "%s/nn.nf", dir ? dir : "lib");
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  nf_buf b = NF_BUF_INIT;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, fp)) > 0) nf_buf_add(&b, chunk, n);
  fclose(fp);
  char *s = nf_arena_strdup(arena, nf_buf_str(&b));
  nf_buf_free(&b);
  return s;
}

START_TEST(parse_print_round_trip) {
  check_round_trip(conv2d_src);
  check_round_trip(lstm_src);
  check_round_trip(
      "def softmax(X: f32[*B, N]) -> (Y: f32[*B, N]) {\n"
      "  Mx(*b) max=! X(*b, j)\n"
      "  E(*b, j) = exp(X(*b, j) - Mx(*b))\n"
      "  S(*b) +=! E(*b, j)\n"
      "  Y(*b, j) = E(*b, j) / S(*b)\n"
      "}\n"
      "def layernorm<eps_e6 = 10>(X: f32[*B, N], g: f32[N], b: f32[N])\n"
      "    -> (Y: f32[*B, N]) require N > 0 {\n"
      "  Mu(*r) +=! X(*r, j) / f32(N)\n"
      "  V(*r) +=! (X(*r, j) - Mu(*r)) * (X(*r, j) - Mu(*r)) / f32(N)\n"
      "  Y(*r, j) = (X(*r, j) - Mu(*r)) * rsqrt(V(*r) + 1e-5) * g(j) + b(j)\n"
      "}\n"
      "def misc(A: i64[N], B: bool[N]) -> (C: i64[N], D: bool[N], P: f32[]) {\n"
      "  C(i) = A(i) // 2 % 3 - -A(i) * (A(i) - (1 - 2))\n"
      "  D(i) = !B(i) || (A(i) < 0 && !(A(i) >= -(-3))) ? true : false\n"
      "  P() *=! pow(f32(A(i)), 0.5) where i in 0:(N > 2 ? 2 : N)\n"
      "}\n");
  check_round_trip(params_src);
  check_round_trip(
      "def param(param: f32[N]) -> (Y: f32[N]) {\n"
      "  param param: f32[N] = normal(0, 1)\n"
      "}\n");
  char *nn = read_nn();
  if (nn && *nn) check_round_trip(nn);
}
END_TEST

Suite *parse_suite(void) {
  Suite *s = suite_create("parse");
  TCase *tc = tcase_create("parse");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, parse_matmul);
  tcase_add_test(tc, parse_params_where_require);
  tcase_add_test(tc, parse_packs_and_dtypes);
  tcase_add_test(tc, parse_families_for_calls_copies);
  tcase_add_test(tc, parse_call_params);
  tcase_add_test(tc, parse_reductions_and_ranges);
  tcase_add_test(tc, parse_layout_comments_continuations);
  tcase_add_test(tc, parse_precedence);
  tcase_add_test(tc, parse_literals);
  tcase_add_test(tc, parse_empty_and_blank);
  tcase_add_test(tc, parse_param_decls);
  tcase_add_test(tc, parse_param_stays_a_name);
  tcase_add_loop_test(tc, parse_rejects_bad_input, 0,
                      (int)(sizeof bad_cases / sizeof bad_cases[0]));
  tcase_add_test(tc, parse_unclosed_brace_note);
  tcase_add_test(tc, parse_nul_byte);
  tcase_add_test(tc, parse_nesting_too_deep);
  tcase_add_test(tc, parse_long_chains_bounded);
  tcase_add_test(tc, parse_print_precedence);
  tcase_add_test(tc, parse_print_canonical_layout);
  tcase_add_test(tc, parse_print_param_decls);
  tcase_add_test(tc, parse_print_round_trip);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(parse_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
