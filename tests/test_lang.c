/* test_lang.c - the module loader and the elaborator: located errors for
 * every kind of bad use, typing of literals, packs, loops, families and
 * calls, canonical-hash invariance and sensitivity through the language,
 * and the graph printer's round trip on the standard library and the
 * examples. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"

/* Parses "A=7,13;B=13,5" into shapes (names point into a static copy). */
typedef struct spec {
  char buf[512];
  nf_arg_shape shapes[8];
  int n_shapes;
  const char *pnames[8];
  int64_t pvals[8];
  int n_params;
} spec;

static void parse_spec(spec *s, const char *shapes, const char *params) {
  memset(s, 0, sizeof *s);
  snprintf(s->buf, sizeof s->buf, "%s|%s", shapes ? shapes : "", params ? params : "");
  char *bar = strchr(s->buf, '|');
  *bar = 0;
  char *save = NULL;
  for (char *tok = strtok_r(s->buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(tok, '=');
    ck_assert_ptr_nonnull(eq);
    *eq = 0;
    nf_arg_shape *a = &s->shapes[s->n_shapes++];
    a->name = tok;
    char *p = eq + 1;
    while (*p) {
      a->dims[a->rank++] = strtoll(p, &p, 10);
      if (*p == ',') p++;
    }
  }
  for (char *tok = strtok_r(bar + 1, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(tok, '=');
    ck_assert_ptr_nonnull(eq);
    *eq = 0;
    s->pnames[s->n_params] = tok;
    s->pvals[s->n_params++] = strtoll(eq + 1, NULL, 10);
  }
}

/* Loads src as "t.nf" and instantiates def; returns the status and the
 * diagnostic text in *msg (malloc'ed). */
static int try_inst(const char *src, const char *def, const char *shapes,
                    const char *params, char **msg, uint8_t digest[32]) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  int rc = nf_module_load_source(m, "t.nf", src, d);
  if (!rc && def) {
    spec s;
    parse_spec(&s, shapes, params);
    nf_inst_opts o = {s.n_shapes, s.shapes, s.n_params, s.pnames, s.pvals, 0};
    nf_graph *g = NULL;
    rc = nf_module_instantiate(m, def, &o, ctx, &g, d);
    if (!rc && digest) ck_assert_int_eq(nf_graph_hash(g, digest), NF_OK);
  }
  *msg = strdup(nf_diag_text(d));
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(m);
  return rc;
}

typedef struct bad_case {
  const char *src, *def, *shapes, *params;
  int status;
  const char *where; /* "t.nf:L:C: error: " prefix expected */
  const char *msg;   /* substring expected */
} bad_case;

#define MATMUL "def matmul(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n  C(i, j) +=! A(i, k) * B(k, j)\n}\n"

/* A def f(X) -> (Y) around param statements (Y is defined last). */
#define PDEF "def f(X: f32[N]) -> (Y: f32[N]) {\n"
#define PEND "  Y(i) = X(i)\n}\n"

static const bad_case bad[] = {
    {MATMUL, "matmul", "A=7,13;B=12,5", NULL, NF_ETYPE, "t.nf:1:1: error: ",
     "sizes disagree: 'K' is 13 from input A, dimension 1 but 12 from input B, dimension 0"},
    {MATMUL, "matmul", "A=7;B=13,5", NULL, NF_ETYPE, "t.nf:1:1: error: ",
     "input 'A' of matmul has rank 1, but the def declares A: f32[M, K]"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i + 1)\n}\n", "f", "X=5", NULL,
     NF_EBOUNDS, "t.nf:2:10: error: ",
     "X(i + 1) may be out of bounds: index 0 takes values in [1, 5] but 'X' has size 5 in dimension 0"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i // 2 + 3)\n}\n", "f", "X=5", NULL,
     NF_EBOUNDS, "t.nf:2:10: error: ", "index 0 takes values in [3, 5] but 'X' has size 5"},
    {"def f(X: f32[N, M]) -> (Y: f32[N]) {\n  Y(i) +=! X(i, k + 1)\n}\n", "f", "X=3,4", NULL,
     NF_ETYPE, "t.nf:2:17: error: ",
     "cannot infer the range of 'k': it never appears alone as an index; give it with 'where k in LO:HI'"},
    {"def f(X: f32[N, M]) -> (Y: f32[N]) {\n  Y(i) +=! X(i, k) where j in 0:3\n}\n", "f", "X=3,4",
     NULL, NF_ETYPE, "t.nf:2:26: error: ",
     "unused reduction variable 'j': it does not appear in the statement"},
    {"def f(X: f32[N, M]) -> (Y: f32[N]) {\n  Y(i) = X(i, k)\n}\n", "f", "X=3,4", NULL, NF_ETYPE,
     "t.nf:2:15: error: ",
     "'k' is not an index of 'Y'; to reduce over it use a reduction operator such as '+=!'"},
    {"def f(X: f32[N]) -> (Y: f32[N * 4611686018427387904]) {\n  Y(i) = 1.0\n}\n", "f", "X=5",
     NULL, NF_EOVERFLOW, "t.nf:1:29: error: ",
     "overflow in size arithmetic: 5 * 4611686018427387904 does not fit in 64 bits"},
    {"def a(X: f32[N]) -> (Y: f32[N]) {\n  Y = b(X)\n}\ndef b(X: f32[N]) -> (Y: f32[N]) {\n  Y = a(X)\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:1:1: error: ", "recursion among defs: a -> b -> a"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = Z(i)\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:10: error: ", "unknown tensor or function 'Z'"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = foo(X)\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:7: error: ", "unknown def 'foo'"},
    {"def r(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\ndef f(X: f32[N]) -> (Y: f32[N]) {\n  Y = r(X, X)\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:5:7: error: ", "r takes 1 input, got 2"},
    {"def c<groups = 1>(I: f32[C], W: f32[CG]) -> (O: f32[C])\n    require C == CG * groups\n{\n  O(i) = I(i)\n}\n",
     "c", "I=6;W=4", NULL, NF_ETYPE, "t.nf:1:1: error: ",
     "c: requirement 'C == CG * groups' fails (C = 6, CG = 4, groups = 1)"},
    {"def f(X: f32[N]) -> (Y: i64[N]) {\n  Y(i) = X(i)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:10: error: ", "cannot store f32 in 'Y' of type i64 without a cast (write i64(...))"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i) * (i / 2)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:18: error: ", "'/' needs a float operand; use '//' for integer division"},
    {"def f(X: f32[N]) -> (Y: f32[N], Z: f32[N]) {\n  Y(i) = X(i)\n}\n", NULL, NULL, NULL,
     NF_ETYPE, "t.nf:1:33: error: ", "output 'Z' of f is never defined"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  T(i) = X(i)\n  T(i) = X(i)\n  Y = T\n}\n", "f", "X=3",
     NULL, NF_ETYPE, "t.nf:3:3: error: ", "tensor 'T' is already defined (each tensor is defined once)"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  T(i) = U(i)\n  U(i) = X(i)\n  Y = T\n}\n", "f", "X=3",
     NULL, NF_ETYPE, "t.nf:2:10: error: ", "tensor 'U' is used before it is defined"},
    {"def f<k>(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\n", "f", "X=3", NULL, NF_EINVAL,
     "t.nf:1:1: error: ", "f needs a value for its parameter 'k'"},
    {"def r<a = 1>(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\ndef f(X: f32[N]) -> (Y: f32[N]) {\n  Y = r<b = 2>(X)\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:5:9: error: ", "r has no parameter 'b'"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(0.5)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:12: error: ", "an index must be an integer, not a float"},
    {"def f(A: f32[M, K], B: f32[L]) -> (Y: f32[M]) {\n  Y(i) +=! A(i, k) * B(k)\n}\n", "f",
     "A=3,5;B=4", NULL, NF_ETYPE, "t.nf:2:22: error: ",
     "the range of 'k' is inferred as 0:5 from A (dimension 1) but B has size 4 in dimension 0"},
    {"def g(X: i64[N]) -> (Y: i64[N]) {\n  Y(i) = X(i)\n}\ndef f(X: f32[N]) -> (Y: i64[N]) {\n  Y = g(X)\n}\n",
     "f", "X=3", NULL, NF_ETYPE, "t.nf:5:9: error: ", "input 'X' of g is i64 but 'X' is f32"},
    {MATMUL, "matmul", "A=7,13", NULL, NF_EINVAL, "t.nf:1:26: error: ",
     "no shape given for input 'B' of matmul (declared B: f32[K, N])"},
    {"def r(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\ndef f(X: f32[N]) -> (Y: f32[3]) {\n  Y = r(X)\n}\n",
     "f", "X=4", NULL, NF_ETYPE, "t.nf:5:3: error: ", "'Y' is declared f32[3] but receives f32[4]"},
    {"def r(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i + 1)\n}\ndef f(X: f32[N]) -> (Y: f32[N]) {\n  Y = r(X)\n}\n",
     "f", "X=4", NULL, NF_EBOUNDS, "t.nf:2:10: error: ", "note: in the call to r here"},
    {"def r(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\ndef r(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:4:1: error: ", "def 'r' is defined twice"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i, j) = X(i)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:3: error: ", "'Y' has 1 dimension [3] but the left side has 2 indexes"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i, i)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:10: error: ", "'X' has 1 dimension [3] but is indexed with 2"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = !X(i)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:10: error: ", "'!' needs a condition (bool)"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i) && X(i)\n}\n", "f", "X=3", NULL, NF_ETYPE,
     "t.nf:2:10: error: ", "the operands of '&&' must be conditions (bool), not f32"},
    {"def f(X: f32[N]) -> (Y: f32[N // 0]) {\n  Y(i) = 1.0\n}\n", "f", "X=3", NULL, NF_ERANGE,
     "t.nf:1:29: error: ", "division by zero in a size expression"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  for t in 0:2 {\n    Y(i) = X(i)\n  }\n}\n", "f", "X=3",
     NULL, NF_ETYPE, "t.nf:3:5: error: ", "tensor 'Y' is already defined"},
    {"def f(X: f32[*S]) -> (Y: f32[prod(*S) * 4611686018427387904]) {\n  Y(i) = 1.0\n}\n", "f",
     "X=3,5", NULL, NF_EOVERFLOW, "t.nf:1:30: error: ", "overflow in size arithmetic: 15 * "},
    {"def f(X: f32[*S]) -> (Y: f32[prod(*T)]) {\n  Y(i) = 1.0\n}\n", "f", "X=3,5", NULL,
     NF_ENOENT, "t.nf:1:35: error: ", "unknown pack '*T'"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  X(i) = 1.0\n  Y = X\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:1:7: error: ", "input 'X' is assigned in the body (inputs are read-only)"},
    /* param declarations */
    {PDEF "  param W: i32[N] = zeros\n" PEND, NULL, NULL, NULL, NF_ETYPE, "t.nf:2:9: error: ",
     "param 'W' has dtype i32; a trainable parameter needs a float dtype (f32, f64, f16 or bf16)"},
    {PDEF "  param W: bool[] = ones\n" PEND, NULL, NULL, NULL, NF_ETYPE, "t.nf:2:9: error: ",
     "param 'W' has dtype bool; a trainable parameter needs a float dtype"},
    {"def f(X: f32[*S]) -> (Y: f32[*S]) {\n  param W: f32[2, *S] = zeros\n  Y(*i) = X(*i)\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:2:19: error: ",
     "the dims of param 'W' cannot be a pack ('*S'): give each dimension as a size expression"},
    {PDEF "  param X: f32[N] = zeros\n" PEND, NULL, NULL, NULL, NF_ETYPE, "t.nf:2:9: error: ",
     "param 'X' has the same name as an input of f"},
    {PDEF "  param Y: f32[N] = zeros\n" PEND, NULL, NULL, NULL, NF_ETYPE, "t.nf:2:9: error: ",
     "param 'Y' has the same name as an output of f"},
    {"def f<k = 1>(X: f32[N]) -> (Y: f32[N]) {\n  param k: f32[N] = zeros\n" PEND, NULL, NULL,
     NULL, NF_ETYPE, "t.nf:2:9: error: ", "param 'k' has the same name as an integer parameter of f"},
    {PDEF "  param W: f32[N] = zeros\n  param W: f32[N] = ones\n" PEND, NULL, NULL, NULL, NF_ETYPE,
     "t.nf:3:9: error: ", "param 'W' is declared twice"},
    {PDEF "  param W: f32[N] = zeros\n  W(i) = X(i)\n" PEND, NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:9: error: ",
     "param 'W' is also defined by a statement of f (a param is an input of the graph: it is read-only)"},
    {PDEF "  T = g(X)\n  param T: f32[N] = zeros\n" PEND "def g(X: f32[N]) -> (Y: f32[N]) {\n  Y = X\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:3:9: error: ", "param 'T' is also defined by a statement of f"},
    {"def layer(X: f32[N]) -> (Y: f32[N]) {\n  param W: f32[N] = ones\n  Y(i) = X(i) * W(i)\n}\n"
     "def model(X: f32[N]) -> (Y: f32[N]) {\n  Y = layer(X)\n}\n",
     "model", "X=3", NULL, NF_ETYPE, "t.nf:6:7: error: ",
     "model calls layer, which declares param 'W': param declarations are allowed only in the def "
     "being trained; pass 'W' to layer as an input instead"},
    {"def layer(X: f32[N]) -> (Y: f32[N]) {\n  param W: f32[N] = ones\n  Y(i) = X(i) * W(i)\n}\n"
     "def model(X: f32[N]) -> (Y: f32[N]) {\n  Y = layer(X)\n}\n",
     "model", "X=3", NULL, NF_ETYPE, "t.nf:6:7: error: ", "note: param 'W' is declared here"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i) * W(i)\n  param W: f32[N] = ones\n}\n", "f",
     "X=3", NULL, NF_ETYPE, "t.nf:2:17: error: ", "tensor 'W' is used before it is defined"},
    {PDEF "  param W: f32[N, Q] = ones\n" PEND, "f", "X=3", NULL, NF_ENOENT, "t.nf:2:19: error: ",
     "unknown size or parameter 'Q'"},
    {PDEF "  param W: f32[N - 4] = ones\n" PEND, "f", "X=3", NULL, NF_ETYPE, "t.nf:2:16: error: ",
     "dimension 0 of 'W' is negative (-1)"},
    {PDEF "  param W: f32[2.5] = ones\n" PEND, "f", "X=3", NULL, NF_ETYPE, "t.nf:2:16: error: ",
     "size expressions are integers, found the float 2.5"},
    {PDEF "  param W: f32[N] = uniform(1, 0)\n" PEND, NULL, NULL, NULL, NF_ESYNTAX, "t.nf:2:21: error: ",
     "uniform(LO, HI) needs LO <= HI, got LO = 1 and HI = 0"},
    {PDEF "  param W: f32[N] = normal(0, -2)\n" PEND, NULL, NULL, NULL, NF_ESYNTAX, "t.nf:2:21: error: ",
     "normal(MEAN, STD) needs STD >= 0"},
    {PDEF "  param W: f32[N] = he_normal\n" PEND, NULL, NULL, NULL, NF_ESYNTAX, "t.nf:2:21: error: ",
     "unknown initializer 'he_normal' (expected zeros, ones, constant(V), uniform(LO, HI), "
     "normal(MEAN, STD), xavier_uniform, xavier_normal, kaiming_uniform or kaiming_normal)"},
    {PDEF "  param W: f32[N] = constant(1, 2)\n" PEND, NULL, NULL, NULL, NF_ESYNTAX,
     "t.nf:2:21: error: ", "'constant' takes 1 argument (V), got 2"},
    /* tensor expressions */
    {"def two(X: f32[N]) -> (A: f32[N], B: f32[N]) {\n  A = X\n  B = X\n}\n"
     "def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = exp(two(X))\n}\n",
     NULL, NULL, NULL, NF_ETYPE, "t.nf:6:11: error: ",
     "two returns 2 outputs: only a def with one output is a value inside an expression"},
    {"def f(X: f32[N, M], b: f32[K]) -> (Y: f32[N, M]) {\n  Y = X * 2.0 + b\n}\n", "f",
     "X=3,4;b=5", NULL, NF_ETYPE, "t.nf:2:17: error: ",
     "'b' is [5], which does not broadcast with [3, 4] (dimension 1 from the end: 5 against 4)"},
    {"def f(X: f32[N], b: f32[N]) -> (Y: f32[N, N]) {\n  Y = X + b\n}\n", "f", "X=3;b=3",
     NULL, NF_ETYPE, "t.nf:2:3: error: ", "'Y' is declared f32[3, 3] but receives [3]"},
    {MATMUL "def f(X: f32[N, N]) -> (Y: f32[N, N]) {\n  Y = matmul(X, 2.0)\n}\n", "f", "X=3,3",
     NULL, NF_ETYPE, "t.nf:5:17: error: ", "argument 2 of matmul is a number; a def takes whole tensors"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = exp(X(i))\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:11: error: ", "'X' is a tensor, not a def: a tensor expression uses whole tensors"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = X > 0.0 && X < 1.0\n}\n", NULL, NULL, NULL,
     NF_ESYNTAX, "t.nf:2:15: error: ", "'&&' is not an operator of tensor expressions"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = where(X > 0.0, X)\n}\n", "f", "X=3", NULL,
     NF_ETYPE, "t.nf:2:7: error: ", "where takes 3 arguments (C, A, B), got 2"},
    {"def f(X: f32[N, M]) -> (Y: f32[N]) {\n  Y = sum(X, 2)\n}\n", "f", "X=3,4", NULL,
     NF_ERANGE, "t.nf:2:14: error: ", "sum: axis 2 is out of range for rank 2"},
    {"def f(X: f32[N, M]) -> (Y: f32[5, 5]) {\n  Y = reshape(X, 5, -1)\n}\n", "f", "X=3,4",
     NULL, NF_ETYPE, "t.nf:2:7: error: ",
     "reshape of 'X' [3, 4] (12 elements): 12 is not a multiple of 5"},
    {"def f(X: f32[N, M]) -> (Y: f32[N, 1], Z: f32[N, 1]) {\n  Y, Z = chunk<axis = 1>(X)\n}\n",
     "f", "X=3,5", NULL, NF_ETYPE, "t.nf:2:10: error: ",
     "chunk: 'X' has 5 entries along axis 1, not a multiple of the 2 results named"},
    {"def f(X: f32[N, M]) -> (Y: f32[M]) {\n  Y = exp(chunk(X))\n}\n", NULL, NULL, NULL,
     NF_ETYPE, "t.nf:2:11: error: ", "chunk has one result per part"},
    {"def f(A: f32[N], B: f32[M]) -> (Y: f32[N]) {\n  Y = stack(A, B)\n}\n", "f", "A=3;B=4",
     NULL, NF_ETYPE, "t.nf:2:16: error: ", "stack: 'B' is f32[4] but 'A' is f32[3]"},
    {"def f(X: f32[T, N]) -> (Y: f32[N]) {\n  Y = exp(X[7])\n}\n", "f", "X=3,4", NULL,
     NF_ERANGE, "t.nf:2:11: error: ", "X[7] is out of range: 'X' is [3, 4], 3 entries"},
    {"def sum(X: f32[N]) -> (Y: f32[N]) {\n  Y = X\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:1:1: error: ", "def 'sum' has the name of a built-in operator"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  H[0] = X\n  Y = exp(H[0:1])\n}\n", "f", "X=3",
     NULL, NF_ETYPE, "t.nf:3:11: error: ", "the family range H[...:...] is a list of tensors"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = exp(X, X)\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:7: error: ", "exp takes 1 argument, got 2"},
    {"def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = frob(X) + 1.0\n}\n", NULL, NULL, NULL, NF_ETYPE,
     "t.nf:2:7: error: ", "unknown def or function 'frob'"},
    {"def f(X: f32[N]) -> (Y: f32[N], Z: f32[N]) {\n  Y, Z = X + 1.0\n}\n", NULL, NULL, NULL,
     NF_ESYNTAX, "t.nf:2:3: error: ", "an expression has one result, not 2"},
    {PDEF "  for t in 0:2 {\n    param W: f32[N] = ones\n  }\n" PEND, NULL, NULL, NULL, NF_ESYNTAX,
     "t.nf:3:5: error: ", "param declarations are allowed only at the top level of a def's body, not inside 'for'"},
};

START_TEST(lang_bad_uses) {
  const bad_case *c = &bad[_i];
  char *msg = NULL;
  int rc = try_inst(c->src, c->def, c->shapes, c->params, &msg, NULL);
  if (rc != c->status || strncmp(msg, c->where, strlen(c->where)) != 0 ||
      !strstr(msg, c->msg))
    ck_abort_msg("case %d: status %s, message:\n%s\nexpected %s at '%s' with '%s'", _i,
                 nf_status_name(rc), msg, nf_status_name(c->status), c->where, c->msg);
  /* Every located error shows the source line and a caret. */
  ck_assert_ptr_nonnull(strstr(msg, "\n  ^") ? strstr(msg, "\n  ^") : strstr(msg, "^\n"));
  free(msg);
}
END_TEST

static nf_graph *inst_ok(nf_module *m, nf_ir_ctx *ctx, const char *def,
                         const char *shapes, const char *params) {
  spec s;
  parse_spec(&s, shapes, params);
  nf_inst_opts o = {s.n_shapes, s.shapes, s.n_params, s.pnames, s.pvals, 0};
  nf_diag *d = nf_diag_new();
  nf_graph *g = NULL;
  int rc = nf_module_instantiate(m, def, &o, ctx, &g, d);
  if (rc) ck_abort_msg("instantiating %s: %s", def, nf_diag_text(d));
  nf_diag_free(d);
  return g;
}

static nf_module *load_src(const char *src) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc = nf_module_load_source(m, "t.nf", src, d);
  if (rc) ck_abort_msg("load: %s", nf_diag_text(d));
  nf_diag_free(d);
  return m;
}

START_TEST(lang_weak_literals_take_context_type) {
  nf_module *m = load_src(
      "def f(X: f64[N]) -> (Y: f64[N]) {\n  Y(i) = X(i) * 0.1 + 1.0 / 3.0\n}\n"
      "def g(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = exp(X(i)) * 2\n}\n"
      "def h(X: i32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i) * 0.5\n}\n");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, "f", "X=3", NULL);
  const nf_expr *r = g->stmts[0].rhs;
  ck_assert_int_eq(r->op, NF_OP_ADD);
  ck_assert_int_eq(r->dtype, NF_F64);
  ck_assert_int_eq(r->args[0]->args[1]->op, NF_OP_CONST);
  ck_assert(r->args[0]->args[1]->u.f == 0.1);      /* exactly the double */
  ck_assert(r->args[1]->u.f == 1.0 / 3.0);         /* folded in double */
  g = inst_ok(m, ctx, "g", "X=3", NULL);
  ck_assert_int_eq(g->stmts[0].rhs->dtype, NF_F32);
  ck_assert_int_eq(g->stmts[0].rhs->args[1]->dtype, NF_F32);
  ck_assert(g->stmts[0].rhs->args[1]->u.f == 2.0);
  g = inst_ok(m, ctx, "h", "X=3", NULL);
  /* i32 * weak float -> f32 multiply of a cast */
  ck_assert_int_eq(g->stmts[0].rhs->op, NF_OP_MUL);
  ck_assert_int_eq(g->stmts[0].rhs->args[0]->op, NF_OP_CAST);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

START_TEST(lang_packs_bind_and_expand) {
  nf_module *m = load_src(
      "def sum_all(X: f32[*S]) -> (L: f32[]) {\n  L() +=! X(*i)\n}\n"
      "def badd(X: f32[*B, *S], Y: f32[*S]) -> (Z: f32[*B, *S]) {\n"
      "  Z(*b, *s) = X(*b, *s) + Y(*s)\n}\n");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, "sum_all", "X=2,3,4", NULL);
  ck_assert_int_eq(g->n_stmts, 1);
  ck_assert_int_eq(g->stmts[0].n_red, 3);
  ck_assert_int_eq(g->stmts[0].red_ext[2], 4);
  g = inst_ok(m, ctx, "badd", "X=2,3,4;Y=3,4", NULL);
  const nf_tensor *z = &g->tensors[g->outputs[0]];
  ck_assert_int_eq(z->rank, 3);
  ck_assert_int_eq(z->shape[0], 2);
  ck_assert_int_eq(z->shape[2], 4);
  g = inst_ok(m, ctx, "badd", "X=2,3,4;Y=4", NULL);
  ck_assert_int_eq(g->stmts[0].rhs->args[1]->n_args, 1);
  nf_module *m2 = load_src(
      "def flat(X: f32[N, *S]) -> (Y: f32[N, prod(*S)], C: i64[]) {\n"
      "  Y(n, f) = X(n, f // 4, f % 4)\n"
      "  C() = prod(*S)\n}\n");
  g = inst_ok(m2, ctx, "flat", "X=2,3,4", NULL);
  ck_assert_int_eq(g->tensors[g->outputs[0]].shape[1], 3 * 4);
  ck_assert_int_eq(g->stmts[1].rhs->op, NF_OP_CONST);
  ck_assert_int_eq(g->stmts[1].rhs->u.i, 12);
  nf_module_free(m2);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

START_TEST(lang_loops_families_and_calls_expand) {
  nf_module *m = load_src(
      "def step(H: f32[N], X: f32[N]) -> (H2: f32[N]) {\n"
      "  T(i) = H(i) * 0.5 + X(i)\n"
      "  H2(i) = tanh(T(i))\n}\n"
      "def run<steps = 3>(H0: f32[N], X: f32[N]) -> (H: f32[N]) {\n"
      "  S[0] = H0\n"
      "  for t in 0:steps {\n"
      "    S[t + 1] = step(S[t], X)\n"
      "  }\n"
      "  H = S[steps]\n}\n");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, "run", "H0=5;X=5", "steps=4");
  /* copy + 4 x (T, H2) + final copy */
  ck_assert_int_eq(g->n_stmts, 1 + 4 * 2 + 1);
  nf_array in[2], out[1];
  int64_t shape[1] = {5};
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(nf_array_alloc(&in[k], NF_F64, 1, shape), NF_OK);
    for (int j = 0; j < 5; j++) ((double *)in[k].data)[j] = 0.1 * (j + 1) * (k ? -1 : 1);
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_interp_run(g, in, NF_INTERP_F64, out, &err), NF_OK);
  for (int j = 0; j < 5; j++) {
    double h = 0.1 * (j + 1), x = -0.1 * (j + 1);
    for (int t = 0; t < 4; t++) h = tanh(h * 0.5 + x);
    ck_assert_double_eq_tol(((double *)out[0].data)[j], h, 1e-12);
  }
  nf_buf_free(&err);
  nf_array_free(&in[0]);
  nf_array_free(&in[1]);
  nf_array_free(&out[0]);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

START_TEST(lang_guards_allow_padded_access) {
  char *msg;
  int rc = try_inst(
      "def pad<p = 1>(X: f32[N]) -> (Y: f32[N + 2 * p]) {\n"
      "  Y(i) = i - p >= 0 && i - p < N ? X(i - p) : 0.0\n}\n"
      "def shift(X: f32[N]) -> (Y: f32[N]) {\n"
      "  Y(i) = i > 0 ? X(i - 1) : X(i)\n}\n",
      "pad", "X=4", "p=2", &msg, NULL);
  ck_assert_msg(rc == NF_OK, "%s", msg);
  free(msg);
  rc = try_inst(
      "def shift(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = i > 0 ? X(i - 1) : X(i)\n}\n",
      "shift", "X=4", NULL, &msg, NULL);
  ck_assert_msg(rc == NF_OK, "%s", msg);
  free(msg);
  /* The wrong branch is still checked. */
  rc = try_inst(
      "def shift(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = i > 0 ? X(i) : X(i - 1)\n}\n",
      "shift", "X=4", NULL, &msg, NULL);
  ck_assert_int_eq(rc, NF_EBOUNDS);
  free(msg);
}
END_TEST

START_TEST(lang_hash_ignores_names_and_sees_structure) {
  uint8_t h1[32], h2[32], h3[32], h4[32], h5[32];
  char *msg;
  ck_assert_int_eq(try_inst(MATMUL, "matmul", "A=7,13;B=13,5", NULL, &msg, h1), NF_OK);
  free(msg);
  ck_assert_int_eq(
      try_inst("def mm(P: f32[R, Q], Z: f32[Q, T]) -> (Out: f32[R, T]) {\n"
               "  Out(a, b) +=! P(a, r) * Z(r, b)\n}\n",
               "mm", "P=7,13;Z=13,5", NULL, &msg, h2),
      NF_OK);
  free(msg);
  ck_assert_mem_eq(h1, h2, 32);
  ck_assert_int_eq(try_inst(MATMUL, "matmul", "A=7,13;B=13,6", NULL, &msg, h3), NF_OK);
  free(msg);
  ck_assert(memcmp(h1, h3, 32) != 0);
  ck_assert_int_eq(
      try_inst("def matmul(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
               "  C(i, j) max=! A(i, k) * B(k, j)\n}\n",
               "matmul", "A=7,13;B=13,5", NULL, &msg, h4),
      NF_OK);
  free(msg);
  ck_assert(memcmp(h1, h4, 32) != 0);
  ck_assert_int_eq(
      try_inst("def matmul(A: f64[M, K], B: f64[K, N]) -> (C: f64[M, N]) {\n"
               "  C(i, j) +=! A(i, k) * B(k, j)\n}\n",
               "matmul", "A=7,13;B=13,5", NULL, &msg, h5),
      NF_OK);
  free(msg);
  ck_assert(memcmp(h1, h5, 32) != 0);
}
END_TEST

/* Instantiates def, prints the graph, parses and instantiates the print,
 * and compares hashes. */
static void round_trip(nf_module *m, const char *def, const char *shapes,
                       const char *params) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, def, shapes, params);
  nf_buf text = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_print(g, &text), NF_OK);
  uint8_t h1[32], h2[32];
  ck_assert_int_eq(nf_graph_hash(g, h1), NF_OK);
  nf_module *m2 = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc = nf_module_load_source(m2, "printed.nf", nf_buf_str(&text), d);
  if (rc) ck_abort_msg("%s: printed graph does not load:\n%.1500s\n%.1500s", def,
                       nf_diag_text(d), nf_buf_str(&text));
  nf_ir_ctx *ctx2 = nf_ir_ctx_new();
  nf_graph *g2 = NULL;
  rc = nf_module_instantiate(m2, nf_module_def_name(m2, 0), NULL, ctx2, &g2, d);
  if (rc) ck_abort_msg("%s: printed graph does not instantiate:\n%.1500s\n%.1500s", def,
                       nf_diag_text(d), nf_buf_str(&text));
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  if (memcmp(h1, h2, 32) != 0) {
    nf_buf t2 = NF_BUF_INIT;
    nf_graph_print(g2, &t2);
    ck_abort_msg("%s: hash changed through printing:\n%.1500s\n--- reprinted:\n%.1500s", def,
                 nf_buf_str(&text), nf_buf_str(&t2));
  }
  nf_buf_free(&text);
  nf_diag_free(d);
  nf_ir_ctx_free(ctx2);
  nf_module_free(m2);
  nf_ir_ctx_free(ctx);
}

static nf_module *load_path(const char *dir, const char *file) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  int rc = nf_module_load_file(m, path, d);
  if (rc) ck_abort_msg("load %s: %s", path, nf_diag_text(d));
  nf_diag_free(d);
  return m;
}

static const char *lib_dir(void) {
  const char *l = getenv("NEOFLOW_LIB");
  return l ? l : "lib";
}

START_TEST(lang_graph_print_round_trips_library) {
  nf_module *m = load_path(lib_dir(), "nn.nf");
  round_trip(m, "matmul", "A=7,13;B=13,5", NULL);
  round_trip(m, "conv2d", "I=2,6,11,11;W=6,2,3,3", "stride=2;pad=2;dilation=2;groups=3");
  round_trip(m, "max_pool2d", "X=2,3,9,9", "kernel=3;stride=2;pad=1");
  round_trip(m, "avg_pool2d", "X=2,3,9,9", "kernel=3;stride=2;pad=1");
  round_trip(m, "softmax", "X=3,7", NULL);
  round_trip(m, "log_softmax", "X=3,7", NULL);
  round_trip(m, "cross_entropy", "logits=4,7;labels=4", NULL);
  round_trip(m, "layer_norm", "X=3,5,7;gamma=7;beta=7", NULL);
  round_trip(m, "batch_norm", "X=2,3,4,5;gamma=3;beta=3", NULL);
  round_trip(m, "gelu", "X=3,5", NULL);
  round_trip(m, "squash", "S=3,5,7", NULL);
  round_trip(m, "channel_shuffle", "X=2,6,2,3", "groups=2");
  round_trip(m, "embedding", "table=9,4;idx=3,5", NULL);
  round_trip(m, "linear", "X=3,5;W=4,5;b=4", NULL);
  nf_module_free(m);
}
END_TEST

START_TEST(lang_graph_print_round_trips_examples) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/../examples", lib_dir());
  nf_module *m = load_path(dir, "models.nf");
  round_trip(m, "lltm_8", NULL, NULL);
  round_trip(m, "capsule_routing", NULL, NULL);
  round_trip(m, "mobilenet_block", NULL, NULL);
  nf_module_free(m);
}
END_TEST

START_TEST(lang_signatures_and_imports) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/../examples", lib_dir());
  nf_module *m = load_path(dir, "models.nf");
  ck_assert_int_eq(nf_module_n_defs(m), 4); /* imports are not listed */
  ck_assert(nf_module_has_def(m, "conv2d"));
  nf_buf b = NF_BUF_INIT;
  ck_assert_int_eq(nf_module_def_signature(m, "conv2d", &b), NF_OK);
  ck_assert_str_eq(nf_buf_str(&b),
                   "conv2d<stride = 1, pad = 0, dilation = 1, groups = 1>(I: f32[N, C, H, Wd], "
                   "W: f32[K, CG, R, S]) -> (O: f32[N, K, OH, OW])");
  nf_buf_free(&b);
  nf_module_free(m);
}
END_TEST

/* The module printer's text loads back and instantiates to the same hash. */
START_TEST(lang_module_print_round_trips) {
  nf_module *m = load_path(lib_dir(), "nn.nf");
  nf_buf text = NF_BUF_INIT;
  ck_assert_int_eq(nf_module_print(m, &text), NF_OK);
  nf_module *m2 = nf_module_new();
  nf_diag *d = nf_diag_new();
  if (nf_module_load_source(m2, "printed.nf", nf_buf_str(&text), d))
    ck_abort_msg("printed library does not load: %.2000s", nf_diag_text(d));
  static const char *const cases[][3] = {
      {"conv2d", "I=2,6,11,11;W=6,2,3,3", "stride=2;pad=2;dilation=2;groups=3"},
      {"softmax", "X=3,7", NULL},
      {"cross_entropy", "logits=4,7;labels=4", NULL},
      {"batch_matmul", "A=2,3,4,5;B=2,3,5,6", NULL},
      {"layer_norm", "X=3,5,7;gamma=7;beta=7", NULL},
      {"badd", "X=2,3,4;Y=3,4", NULL},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nf_ir_ctx *c1 = nf_ir_ctx_new(), *c2 = nf_ir_ctx_new();
    nf_graph *g1 = inst_ok(m, c1, cases[k][0], cases[k][1], cases[k][2]);
    nf_graph *g2 = inst_ok(m2, c2, cases[k][0], cases[k][1], cases[k][2]);
    uint8_t h1[32], h2[32];
    ck_assert_int_eq(nf_graph_hash(g1, h1), NF_OK);
    ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
    ck_assert_msg(memcmp(h1, h2, 32) == 0, "%s changed through printing", cases[k][0]);
    nf_ir_ctx_free(c1);
    nf_ir_ctx_free(c2);
  }
  nf_buf_free(&text);
  nf_diag_free(d);
  nf_module_free(m2);
  nf_module_free(m);
}
END_TEST

/* ---- tensor expressions ---- */

/* Runs g in f64 on inputs filled with a fixed pattern; the first
 * output's values into out (n of them). */
static void run_f64(const nf_graph *g, double *out, int64_t n) {
  nf_array in[8], res[4];
  ck_assert_int_le(g->n_inputs, 8);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], NF_F64, t->rank, t->shape), NF_OK);
    for (int64_t j = 0; j < in[k].numel; j++)
      ((double *)in[k].data)[j] = 0.37 * (double)((j * 7 + k * 3) % 11) - 1.6;
  }
  nf_buf err = NF_BUF_INIT;
  int rc = nf_interp_run(g, in, NF_INTERP_F64, res, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(res[0].numel, n);
  memcpy(out, res[0].data, sizeof(double) * (size_t)n);
  for (uint32_t k = 0; k < g->n_outputs; k++) nf_array_free(&res[k]);
  for (uint32_t k = 0; k < g->n_inputs; k++) nf_array_free(&in[k]);
  nf_buf_free(&err);
}

/* Nested calls and elementwise arithmetic on whole tensors give the
 * graph of the statements one would write by hand (the same hash and
 * values), broadcast NumPy's way, in loops over families too; the
 * module prints them back as written. */
START_TEST(lang_tensor_expressions) {
  static const char src[] =
      "import nn\n"
      "def nested(X: f32[N, I], W: f32[O, I], b: f32[O]) -> (Y: f32[N, O]) {\n"
      "  Y = sigmoid(linear(X, W, b))\n}\n"
      "def by_hand(X: f32[N, I], W: f32[O, I], b: f32[O]) -> (Y: f32[N, O]) {\n"
      "  H = linear(X, W, b)\n  Y = sigmoid(H)\n}\n"
      "def arith(X: f32[N, M], b: f32[M], s: f32[]) -> (Y: f32[N, M]) {\n"
      "  Y = elu(X) * 2.0 - b / s + exp(-X)\n}\n"
      "def arith_hand(X: f32[N, M], b: f32[M], s: f32[]) -> (Y: f32[N, M]) {\n"
      "  E = elu(X)\n  Y(i, j) = E(i, j) * 2.0 - b(j) / s() + exp(-X(i, j))\n}\n"
      "def col(X: f32[N, M], c: f32[N, 1]) -> (Y: f32[N, M]) {\n  Y = X * c + 1\n}\n"
      "def rnn<T = 3>(X: f32[N], H0: f32[N], W: f32[N, N], b: f32[N]) -> (H: f32[N]) {\n"
      "  S[0] = H0\n"
      "  for t in 0:T {\n"
      "    S[t + 1] = tanh(matmul_vec(W, S[t]) + b + X * f32(t))\n"
      "  }\n"
      "  H = S[T]\n}\n"
      "def matmul_vec(A: f32[M, K], x: f32[K]) -> (y: f32[M]) {\n"
      "  y(i) +=! A(i, k) * x(k)\n}\n"
      "def extremes(X: f32[N, M]) -> (A: f32[], B: f32[], C: f32[N, M]) {\n"
      "  A = max(X * 2.0)\n  B = min(X) - amin(X)\n  C = max(X, 0.5)\n}\n";
  nf_module *m = nf_module_new();
  nf_module_set_lib_dir(m, lib_dir());
  nf_diag *d = nf_diag_new();
  if (nf_module_load_source(m, "t.nf", src, d)) ck_abort_msg("load: %s", nf_diag_text(d));
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  uint8_t h1[32], h2[32];
  double a[64], b[64];
  nf_graph *g1 = inst_ok(m, ctx, "nested", "X=4,3;W=5,3;b=5", NULL);
  nf_graph *g2 = inst_ok(m, ctx, "by_hand", "X=4,3;W=5,3;b=5", NULL);
  ck_assert_int_eq(nf_graph_hash(g1, h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  ck_assert_msg(memcmp(h1, h2, 32) == 0, "a nested call differs from its two statements");
  /* the call's local is named after the result and the callee */
  int named = 0;
  for (uint32_t t = 0; t < g1->n_tensors; t++)
    named |= g1->tensors[t].name && !strcmp(g1->tensors[t].name, "Y.linear");
  ck_assert(named);
  g1 = inst_ok(m, ctx, "arith", "X=4,3;b=3;s=", NULL);
  g2 = inst_ok(m, ctx, "arith_hand", "X=4,3;b=3;s=", NULL);
  ck_assert_int_eq(nf_graph_hash(g1, h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  ck_assert_msg(memcmp(h1, h2, 32) == 0, "the elementwise rest is not one statement");
  run_f64(g1, a, 12);
  run_f64(g2, b, 12);
  for (int j = 0; j < 12; j++) ck_assert_double_eq_tol(a[j], b[j], 1e-12);
  /* a [N, 1] column broadcast along M; an integer literal is weak */
  g1 = inst_ok(m, ctx, "col", "X=3,4;c=3,1", NULL);
  run_f64(g1, a, 12);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) {
      double x = 0.37 * (double)(((i * 4 + j) * 7) % 11) - 1.6;
      double c = 0.37 * (double)((i * 7 + 3) % 11) - 1.6;
      ck_assert_double_eq_tol(a[i * 4 + j], x * c + 1, 1e-12);
    }
  /* a recurrence over a family with nested calls and broadcasting */
  g1 = inst_ok(m, ctx, "rnn", "X=4;H0=4;W=4,4;b=4", "T=3");
  run_f64(g1, a, 4);
  double x[4], h[4], w[4][4], bb[4];
  for (int j = 0; j < 4; j++) x[j] = 0.37 * (double)((j * 7) % 11) - 1.6;
  for (int j = 0; j < 4; j++) h[j] = 0.37 * (double)((j * 7 + 3) % 11) - 1.6;
  for (int j = 0; j < 16; j++) w[j / 4][j % 4] = 0.37 * (double)((j * 7 + 6) % 11) - 1.6;
  for (int j = 0; j < 4; j++) bb[j] = 0.37 * (double)((j * 7 + 9) % 11) - 1.6;
  for (int t = 0; t < 3; t++) {
    double nh[4];
    for (int i = 0; i < 4; i++) {
      double acc = 0;
      for (int k = 0; k < 4; k++) acc += w[i][k] * h[k];
      nh[i] = tanh(acc + bb[i] + x[i] * t);
    }
    memcpy(h, nh, sizeof h);
  }
  for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(a[i], h[i], 1e-12);
  /* max and min of one tensor reduce over all of it, of two are
   * elementwise */
  g1 = inst_ok(m, ctx, "extremes", "X=3,4", NULL);
  {
    nf_array in[1], res[3];
    int64_t sh[2] = {3, 4};
    ck_assert_int_eq(nf_array_alloc(&in[0], NF_F64, 2, sh), NF_OK);
    double mx = -1e9;
    for (int j = 0; j < 12; j++) {
      ((double *)in[0].data)[j] = 0.37 * (double)((j * 7) % 11) - 1.6;
      if (((double *)in[0].data)[j] > mx) mx = ((double *)in[0].data)[j];
    }
    nf_buf err = NF_BUF_INIT;
    ck_assert_int_eq(nf_interp_run(g1, in, NF_INTERP_F64, res, &err), NF_OK);
    ck_assert_double_eq_tol(((double *)res[0].data)[0], 2 * mx, 1e-12);
    ck_assert_double_eq_tol(((double *)res[1].data)[0], 0.0, 1e-12);
    for (int j = 0; j < 12; j++)
      ck_assert_double_eq_tol(((double *)res[2].data)[j],
                              fmax(((double *)in[0].data)[j], 0.5), 1e-12);
    for (int k = 0; k < 3; k++) nf_array_free(&res[k]);
    nf_array_free(&in[0]);
    nf_buf_free(&err);
  }
  /* printed as written, and read back to the same graphs */
  nf_buf text = NF_BUF_INIT;
  ck_assert_int_eq(nf_module_print(m, &text), NF_OK);
  ck_assert_msg(strstr(nf_buf_str(&text), "Y = elu(X) * 2.0 - b / s + exp(-X)") &&
                    strstr(nf_buf_str(&text), "S[t + 1] = tanh(matmul_vec(W, S[t]) + b + X * f32(t))"),
                "%s", nf_buf_str(&text));
  nf_module *m2 = nf_module_new();
  nf_module_set_lib_dir(m2, lib_dir());
  if (nf_module_load_source(m2, "printed.nf", nf_buf_str(&text), d))
    ck_abort_msg("the printed module does not load: %s", nf_diag_text(d));
  g1 = inst_ok(m, ctx, "rnn", "X=4;H0=4;W=4,4;b=4", "T=3");
  g2 = inst_ok(m2, ctx, "rnn", "X=4;H0=4;W=4,4;b=4", "T=3");
  ck_assert_int_eq(nf_graph_hash(g1, h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  ck_assert(memcmp(h1, h2, 32) == 0);
  nf_buf_free(&text);
  nf_module_free(m2);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(m);
}
END_TEST

/* ---- param declarations ---- */

static const char mlp_src[] =
    "import nn\n"
    "# A two-layer perceptron with its weights: the whole model in one def.\n"
    "def mlp<batch = 4>(X: f32[batch, 8], Y: f32[batch, 3]) -> (L: f32[])\n"
    "    where H = 16 {\n"
    "  param W1: f32[H, 8] = kaiming_uniform\n"
    "  param b1: f32[H] = zeros\n"
    "  Z1 = linear(X, W1, b1)\n"
    "  A1 = relu(Z1)\n"
    "  param W2: f32[3, H] = xavier_normal(0.5)\n"
    "  param b2: f32[3] = constant(-0.25)\n"
    "  Z2 = linear(A1, W2, b2)\n"
    "  L0 = mse(Z2, Y)\n"
    "  param scale: f32[] = ones\n"
    "  L() = L0() * scale()\n"
    "}\n"
    "def plain(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i)\n}\n";

static void check_inputs(const nf_graph *g, int n, const char *const *names,
                         const int *ranks, const int64_t (*shapes)[2]) {
  ck_assert_int_eq(g->n_inputs, n);
  for (int k = 0; k < n; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    ck_assert_str_eq(t->name, names[k]);
    ck_assert_int_eq(t->kind, NF_T_INPUT);
    ck_assert_int_eq(t->dtype, NF_F32);
    ck_assert_int_eq(t->rank, ranks[k]);
    for (int j = 0; j < ranks[k]; j++) ck_assert_int_eq(t->shape[j], shapes[k][j]);
  }
}

/* The model's params are inputs after X and Y, shaped by their
 * declarations, and compute what the same model with explicit inputs
 * computes. */
START_TEST(lang_params_become_inputs) {
  nf_module *m = load_src(mlp_src);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  static const char *const names[] = {"X", "Y", "W1", "b1", "W2", "b2", "scale"};
  static const int ranks[] = {2, 2, 2, 1, 2, 1, 0};
  const int64_t shapes4[][2] = {{4, 8}, {4, 3}, {16, 8}, {16, 0}, {3, 16}, {3, 0}, {0, 0}};
  nf_graph *g = inst_ok(m, ctx, "mlp", NULL, NULL);
  check_inputs(g, 7, names, ranks, shapes4);
  ck_assert_int_eq(g->n_outputs, 1);
  const int64_t shapes2[][2] = {{2, 8}, {2, 3}, {16, 8}, {16, 0}, {3, 16}, {3, 0}, {0, 0}};
  g = inst_ok(m, ctx, "mlp", "X=2,8;Y=2,3", "batch=2");
  check_inputs(g, 7, names, ranks, shapes2);

  /* Evaluate it against the arithmetic written out. */
  nf_array in[7], out[1];
  uint64_t st = 7;
  for (int k = 0; k < 7; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], NF_F64, t->rank, t->shape), NF_OK);
    int64_t n = nf_tensor_numel(t);
    for (int64_t j = 0; j < n; j++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      ((double *)in[k].data)[j] = (double)(st >> 11) / 9007199254740992.0 - 0.5;
    }
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_interp_run(g, in, NF_INTERP_F64, out, &err), NF_OK);
  const double *X = in[0].data, *Y = in[1].data, *W1 = in[2].data, *b1 = in[3].data,
               *W2 = in[4].data, *b2 = in[5].data, *scale = in[6].data;
  double sum = 0;
  for (int b = 0; b < 2; b++) {
    double a1[16];
    for (int h = 0; h < 16; h++) {
      double z = b1[h];
      for (int i = 0; i < 8; i++) z += X[b * 8 + i] * W1[h * 8 + i];
      a1[h] = z > 0 ? z : 0;
    }
    for (int o = 0; o < 3; o++) {
      double z = b2[o];
      for (int h = 0; h < 16; h++) z += a1[h] * W2[o * 16 + h];
      sum += (z - Y[b * 3 + o]) * (z - Y[b * 3 + o]);
    }
  }
  ck_assert_double_eq_tol(((double *)out[0].data)[0], sum / 6 * scale[0], 1e-12);
  for (int k = 0; k < 7; k++) nf_array_free(&in[k]);
  nf_array_free(&out[0]);
  nf_buf_free(&err);

  /* The listing: declared inputs stay the def's inputs; the decls come in
   * statement order with the defaults filled in. */
  const char *inames[4];
  ck_assert_int_eq(nf_module_def_inputs(m, "mlp", inames, 4), 2);
  nf_buf sig = NF_BUF_INIT;
  ck_assert_int_eq(nf_module_def_signature(m, "mlp", &sig), NF_OK);
  ck_assert_str_eq(nf_buf_str(&sig), "mlp<batch = 4>(X: f32[batch, 8], Y: f32[batch, 3]) -> (L: f32[])");
  nf_buf_free(&sig);
  ck_assert_int_eq(nf_module_def_param_decls(m, "mlp", NULL, 0), 5);
  ck_assert_int_eq(nf_module_def_param_decls(m, "plain", NULL, 0), 0);
  ck_assert_int_eq(nf_module_def_param_decls(m, "linear", NULL, 0), 0); /* imported */
  ck_assert_int_eq(nf_module_def_param_decls(m, "nope", NULL, 0), -1);
  nf_param_decl pd[8];
  memset(pd, 0x55, sizeof pd);
  ck_assert_int_eq(nf_module_def_param_decls(m, "mlp", pd, 2), 5);
  ck_assert_str_eq(pd[0].name, "W1");
  ck_assert_str_eq(pd[1].name, "b1");
  unsigned char sentinel[sizeof pd[2]];
  memset(sentinel, 0x55, sizeof sentinel);
  ck_assert(memcmp(&pd[2], sentinel, sizeof sentinel) == 0); /* max respected */
  ck_assert_int_eq(nf_module_def_param_decls(m, "mlp", pd, 8), 5);
  static const struct {
    const char *name;
    nf_init_kind init;
    double a, b;
  } want[] = {
      {"W1", NF_INIT_KAIMING_UNIFORM, 0, 0}, {"b1", NF_INIT_ZEROS, 0, 0},
      {"W2", NF_INIT_XAVIER_NORMAL, 0.5, 0}, {"b2", NF_INIT_CONSTANT, -0.25, 0},
      {"scale", NF_INIT_ONES, 0, 0},
  };
  for (int k = 0; k < 5; k++) {
    ck_assert_str_eq(pd[k].name, want[k].name);
    ck_assert_int_eq(pd[k].init, want[k].init);
    ck_assert(pd[k].a == want[k].a && pd[k].b == want[k].b);
  }

  /* The printed module loads back to the same graph and declarations. */
  nf_buf text = NF_BUF_INIT;
  ck_assert_int_eq(nf_module_print(m, &text), NF_OK);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&text), "  param W2: f32[3, H] = xavier_normal(0.5)\n"));
  nf_module *m2 = load_src(nf_buf_str(&text));
  nf_ir_ctx *c2 = nf_ir_ctx_new();
  uint8_t h1[32], h2[32];
  ck_assert_int_eq(nf_graph_hash(inst_ok(m, ctx, "mlp", NULL, NULL), h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(inst_ok(m2, c2, "mlp", NULL, NULL), h2), NF_OK);
  ck_assert(memcmp(h1, h2, 32) == 0);
  nf_param_decl pd2[8];
  ck_assert_int_eq(nf_module_def_param_decls(m2, "mlp", pd2, 8), 5);
  for (int k = 0; k < 5; k++) {
    ck_assert_str_eq(pd2[k].name, pd[k].name);
    ck_assert(pd2[k].init == pd[k].init && pd2[k].a == pd[k].a && pd2[k].b == pd[k].b);
  }
  nf_buf_free(&text);
  nf_ir_ctx_free(c2);
  nf_module_free(m2);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

/* Every initializer, its arguments and defaults; dims from sizes bound by
 * an input's shape, from where names and parameters; unused params. */
START_TEST(lang_param_initializers_and_dims) {
  nf_module *m = load_src(
      "def kinds<k = 3>(X: f32[B, I]) -> (Y: f32[B, O]) where O = 2 * I {\n"
      "  param z: f32[O, I] = zeros\n"
      "  param o: f64[k] = ones\n"
      "  param c: f16[] = constant(7)\n"
      "  param u: bf16[2] = uniform(-2, 3.5)\n"
      "  param n: f32[2] = normal(1, 0.5)\n"
      "  param xu: f32[2, 3] = xavier_uniform\n"
      "  param xn: f32[2, 3] = xavier_normal(2)\n"
      "  param ku: f32[2, 3, k] = kaiming_uniform\n"
      "  param kn: f32[2, 3] = kaiming_normal(-0.2)\n"
      "  param xu1: f32[I + k] = xavier_uniform()\n"
      "  Y(b, p) +=! X(b, i) * z(p, i)\n"
      "}\n");
  static const struct {
    const char *name;
    nf_init_kind init;
    double a, b;
    nf_dtype dt;
    int rank;
    int64_t shape[3];
  } want[] = {
      {"z", NF_INIT_ZEROS, 0, 0, NF_F32, 2, {10, 5}},
      {"o", NF_INIT_ONES, 0, 0, NF_F64, 1, {4}},
      {"c", NF_INIT_CONSTANT, 7, 0, NF_F16, 0, {0}},
      {"u", NF_INIT_UNIFORM, -2, 3.5, NF_BF16, 1, {2}},
      {"n", NF_INIT_NORMAL, 1, 0.5, NF_F32, 1, {2}},
      {"xu", NF_INIT_XAVIER_UNIFORM, 1, 0, NF_F32, 2, {2, 3}},
      {"xn", NF_INIT_XAVIER_NORMAL, 2, 0, NF_F32, 2, {2, 3}},
      {"ku", NF_INIT_KAIMING_UNIFORM, 0, 0, NF_F32, 3, {2, 3, 4}},
      {"kn", NF_INIT_KAIMING_NORMAL, -0.2, 0, NF_F32, 2, {2, 3}},
      {"xu1", NF_INIT_XAVIER_UNIFORM, 1, 0, NF_F32, 1, {9}},
  };
  const int n = (int)(sizeof want / sizeof want[0]);
  nf_param_decl pd[16];
  ck_assert_int_eq(nf_module_def_param_decls(m, "kinds", pd, 16), n);
  for (int k = 0; k < n; k++) {
    ck_assert_str_eq(pd[k].name, want[k].name);
    ck_assert_int_eq(pd[k].init, want[k].init);
    ck_assert_msg(pd[k].a == want[k].a && pd[k].b == want[k].b, "%s: a %g b %g", pd[k].name,
                  pd[k].a, pd[k].b);
  }
  ck_assert_str_eq(nf_init_name(NF_INIT_UNIFORM), "uniform");
  ck_assert_str_eq(nf_init_name(NF_INIT_KAIMING_UNIFORM), "kaiming_uniform");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, "kinds", "X=3,5", "k=4");
  ck_assert_int_eq(g->n_inputs, 1 + n);
  ck_assert_str_eq(g->tensors[g->inputs[0]].name, "X");
  for (int k = 0; k < n; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k + 1]];
    ck_assert_str_eq(t->name, want[k].name);
    ck_assert_int_eq(t->kind, NF_T_INPUT);
    ck_assert_int_eq(t->dtype, want[k].dt);
    ck_assert_int_eq(t->rank, want[k].rank);
    for (int j = 0; j < t->rank; j++) ck_assert_int_eq(t->shape[j], want[k].shape[j]);
  }
  ck_assert_int_eq(g->tensors[g->outputs[0]].shape[1], 10);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

/* `param` is a keyword only in a declaration: as a tensor name it works. */
START_TEST(lang_param_stays_a_name) {
  nf_module *m = load_src(
      "def f(param: f32[N]) -> (Y: f32[N]) {\n"
      "  param2(i) = param(i) * 2.0\n"
      "  Y = param2\n"
      "}\n"
      "def g(X: f32[N]) -> (Y: f32[N]) {\n"
      "  param(i) = X(i) + 1.0\n"
      "  P[0] = f(param)\n"
      "  Y = P[0]\n"
      "}\n"
      "def h(X: f32[N]) -> (Y: f32[N]) {\n"
      "  param param: f32[N] = ones\n"
      "  Y(i) = X(i) * param(i)\n"
      "}\n");
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = inst_ok(m, ctx, "f", "param=3", NULL);
  ck_assert_int_eq(g->n_inputs, 1);
  ck_assert_str_eq(g->tensors[g->inputs[0]].name, "param");
  g = inst_ok(m, ctx, "g", "X=3", NULL);
  ck_assert_int_eq(g->n_inputs, 1);
  ck_assert_int_eq(nf_module_def_param_decls(m, "g", NULL, 0), 0);
  g = inst_ok(m, ctx, "h", "X=3", NULL);
  ck_assert_int_eq(g->n_inputs, 2);
  ck_assert_str_eq(g->tensors[g->inputs[1]].name, "param");
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
}
END_TEST

static uint64_t fz_state = 12345;
static uint64_t fz_next(void) {
  uint64_t z = (fz_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Mutated programs with constant shapes go through the loader, the
 * elaborator and (when small) the interpreter: every outcome must be a
 * status, never a crash or an assertion. */
START_TEST(lang_mutated_programs_never_crash) {
  nf_module *lib = load_path(lib_dir(), "nn.nf");
  static const char *const defs[][3] = {
      {"conv2d", "I=1,4,7,7;W=4,2,3,3", "stride=2;pad=1;dilation=1;groups=2"},
      {"max_pool2d", "X=1,2,7,7", "kernel=3;stride=2;pad=1"},
      {"softmax", "X=3,5", NULL},
      {"cross_entropy", "logits=3,5;labels=3", NULL},
      {"layer_norm", "X=3,5;gamma=5;beta=5", NULL},
      {"embedding", "table=6,3;idx=4", NULL},
      {"channel_shuffle", "X=2,6,2,3", "groups=3"},
      {"squash", "S=3,4", NULL},
      {"gelu", "X=6", NULL},
  };
  enum { N_CORPUS = sizeof defs / sizeof defs[0] };
  char *corpus[N_CORPUS];
  for (int k = 0; k < N_CORPUS; k++) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g = inst_ok(lib, ctx, defs[k][0], defs[k][1], defs[k][2]);
    nf_buf b = NF_BUF_INIT;
    ck_assert_int_eq(nf_graph_print(g, &b), NF_OK);
    corpus[k] = strdup(nf_buf_str(&b));
    nf_buf_free(&b);
    nf_ir_ctx_free(ctx);
  }
  static const char *const pieces[] = {
      "(", ")", "[", "]", ",", "+", "-", "*", "//", "%", "?", ":", "<", ">=", "==",
      "&&", "!", "0", "1", "7", "-1", "1000000", "9223372036854775807", "0.5", "i",
      "j", "k", "X", "+=!", "max=!", "=", " where q in 0:3", "f64(", "i32(", "exp(",
      "\n", " ", "#", "*S", "Y(i)", "for t in 0:2 {", "}"};
  int iters = 20000;
  const char *env = getenv("NF_FUZZ_ITERS");
  if (env) iters = atoi(env);
  int n_ok = 0, n_err = 0;
  for (int it = 0; it < iters; it++) {
    const char *base = corpus[fz_next() % N_CORPUS];
    nf_buf b = NF_BUF_INIT;
    nf_buf_puts(&b, base);
    int n_mut = 1 + (int)(fz_next() % 3);
    for (int mu = 0; mu < n_mut && b.len > 0; mu++) {
      size_t pos = fz_next() % b.len;
      size_t len = 1 + fz_next() % 6;
      if (pos + len > b.len) len = b.len - pos;
      nf_buf t = NF_BUF_INIT;
      nf_buf_add(&t, b.data, pos);
      switch (fz_next() % 4) {
        case 0: /* replace a span by a piece */
          nf_buf_puts(&t, pieces[fz_next() % (sizeof pieces / sizeof pieces[0])]);
          nf_buf_puts(&t, b.data + pos + len);
          break;
        case 1: /* insert a piece */
          nf_buf_puts(&t, pieces[fz_next() % (sizeof pieces / sizeof pieces[0])]);
          nf_buf_puts(&t, b.data + pos);
          break;
        case 2: /* delete a span */
          nf_buf_puts(&t, b.data + pos + len);
          break;
        default: /* duplicate a span */
          nf_buf_add(&t, b.data + pos, len);
          nf_buf_puts(&t, b.data + pos);
          break;
      }
      nf_buf_free(&b);
      b = t;
    }
    nf_module *m = nf_module_new();
    nf_diag *d = nf_diag_new();
    int rc = nf_module_load_source(m, "mut.nf", nf_buf_str(&b), d);
    if (!rc) {
      for (int k = 0; k < nf_module_n_defs(m); k++) {
        nf_ir_ctx *ctx = nf_ir_ctx_new();
        nf_graph *g = NULL;
        nf_diag_clear(d);
        int irc = nf_module_instantiate(m, nf_module_def_name(m, k), NULL, ctx, &g, d);
        ck_assert_int_le(irc, 0);
        if (!irc) {
          n_ok++;
          /* Evaluate when small. */
          int64_t total = 0;
          for (uint32_t t = 0; t < g->n_tensors; t++) {
            int64_t n = nf_tensor_numel(&g->tensors[t]);
            total = n < 0 || total > (1 << 20) ? (1 << 21) : total + n;
          }
          if (total < (1 << 20)) {
            nf_array *in = calloc(g->n_inputs + 1, sizeof(nf_array));
            nf_array *out = calloc(g->n_outputs + 1, sizeof(nf_array));
            int alloc_ok = 1;
            for (uint32_t t = 0; t < g->n_inputs; t++) {
              const nf_tensor *ti = &g->tensors[g->inputs[t]];
              nf_dtype at = nf_dtype_is_float((nf_dtype)ti->dtype) ? NF_F64 : NF_I64;
              if (ti->dtype == NF_BOOL) at = NF_BOOL;
              if (nf_array_alloc(&in[t], at, ti->rank, ti->shape)) alloc_ok = 0;
              for (int64_t e = 0; alloc_ok && e < in[t].numel; e++) {
                if (at == NF_F64) ((double *)in[t].data)[e] = (double)(fz_next() % 200) / 100 - 1;
                if (at == NF_I64) ((int64_t *)in[t].data)[e] = (int64_t)(fz_next() % 4);
              }
            }
            if (alloc_ok) {
              nf_buf err = NF_BUF_INIT;
              int erc = nf_interp_run(g, in, NF_INTERP_F64, out, &err);
              ck_assert_int_le(erc, 0);
              if (!erc)
                for (uint32_t t = 0; t < g->n_outputs; t++) nf_array_free(&out[t]);
              nf_buf_free(&err);
            }
            for (uint32_t t = 0; t < g->n_inputs; t++) nf_array_free(&in[t]);
            free(in);
            free(out);
          }
        } else {
          n_err++;
          ck_assert_int_gt(nf_diag_count(d), 0); /* an error always says why */
        }
        nf_ir_ctx_free(ctx);
      }
    } else {
      ck_assert_int_gt(nf_diag_count(d), 0);
    }
    nf_diag_free(d);
    nf_module_free(m);
    nf_buf_free(&b);
  }
  fprintf(stderr, "mutated programs: %d instantiated, %d rejected with a message\n", n_ok, n_err);
  ck_assert_int_gt(n_ok, 0);
  ck_assert_int_gt(n_err, 0);
  for (int k = 0; k < N_CORPUS; k++) free(corpus[k]);
  nf_module_free(lib);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("lang");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, lang_bad_uses, 0, (int)(sizeof bad / sizeof bad[0]));
  tcase_add_test(tc, lang_weak_literals_take_context_type);
  tcase_add_test(tc, lang_packs_bind_and_expand);
  tcase_add_test(tc, lang_loops_families_and_calls_expand);
  tcase_add_test(tc, lang_guards_allow_padded_access);
  tcase_add_test(tc, lang_hash_ignores_names_and_sees_structure);
  tcase_add_test(tc, lang_graph_print_round_trips_library);
  tcase_add_test(tc, lang_graph_print_round_trips_examples);
  tcase_add_test(tc, lang_signatures_and_imports);
  tcase_add_test(tc, lang_module_print_round_trips);
  tcase_add_test(tc, lang_tensor_expressions);
  tcase_add_test(tc, lang_params_become_inputs);
  tcase_add_test(tc, lang_param_initializers_and_dims);
  tcase_add_test(tc, lang_param_stays_a_name);
  tcase_add_test(tc, lang_mutated_programs_never_crash);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
