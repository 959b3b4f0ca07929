/* test_fuzz_parse.c - robustness of the `.nf` parser and printer.
 *
 * Seeded random inputs (byte strings, token soups), mutations of realistic
 * sources (byte flips, span insert/delete/duplicate, truncation at every
 * offset) and pathological nesting.  Every input must parse to NF_OK or
 * NF_ESYNTAX without crashing, and when it parses, printing must be a
 * fixed point whose re-parse is structurally equal.  Each input gets a
 * fresh arena and diagnostic list, all freed (valgrind clean).
 *
 * NF_FUZZ_ITERS scales the random parts (default 20000; valgrind runs use
 * fewer).  The seed is fixed so failures reproduce; NF_FUZZ_SEED changes
 * it. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ast.h"

/* In ast_print.c; declared here until nf_ast.h carries it. */

static uint64_t rng_state;

static uint64_t rng(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

static size_t rnd(size_t n) { return n ? (size_t)(rng() % n) : 0; }

static int iters(void) {
  const char *s = getenv("NF_FUZZ_ITERS");
  int n = s ? atoi(s) : 20000;
  return n > 0 ? n : 1;
}

static void seed(uint64_t salt) {
  const char *s = getenv("NF_FUZZ_SEED");
  rng_state = (s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull) ^ salt;
  if (!rng_state) rng_state = 1;
}

static int n_ok, n_syntax;

/* Parses len bytes (copied so the text is NUL-terminated right after
 * them); checks the status and, on success, the print round trip. */
static void check_input(const char *bytes, size_t len) {
  char *text = malloc(len + 1);
  ck_assert_ptr_nonnull(text);
  if (len) memcpy(text, bytes, len);
  text[len] = 0;
  nf_src src = {"fuzz.nf", text, len};
  nf_arena *a = nf_arena_new();
  nf_diag *d = nf_diag_new();
  ck_assert(a && d);
  nf_ast_file *f = NULL;
  int rc = nf__parse(a, &src, d, &f);
  ck_assert_msg(rc == NF_OK || rc == NF_ESYNTAX, "status %d for %.*s", rc,
                (int)(len > 200 ? 200 : len), text);
  if (rc == NF_ESYNTAX) {
    ck_assert_ptr_null(f);
    ck_assert_int_gt(nf_diag_count(d), 0);
    (void)nf_diag_text(d);
    n_syntax++;
  } else {
    n_ok++;
    ck_assert_int_eq(nf_diag_count(d), 0);
    nf_buf p1 = NF_BUF_INIT, p2 = NF_BUF_INIT;
    nf__ast_print_file(f, &p1);
    ck_assert(!p1.oom);
    nf_src src2 = {"printed.nf", nf_buf_str(&p1), p1.len};
    nf_ast_file *g = NULL;
    int rc2 = nf__parse(a, &src2, d, &g);
    ck_assert_msg(rc2 == NF_OK, "printed text does not parse:\n%s\n%s\nfrom:\n%.*s",
                  nf_diag_text(d), nf_buf_str(&p1), (int)len, text);
    ck_assert_msg(nf__ast_file_equal(f, g),
                  "re-parse differs:\n%s\nfrom:\n%.*s", nf_buf_str(&p1),
                  (int)len, text);
    nf__ast_print_file(g, &p2);
    ck_assert_msg(strcmp(nf_buf_str(&p1), nf_buf_str(&p2)) == 0,
                  "not a fixed point:\n%s\n---\n%s", nf_buf_str(&p1),
                  nf_buf_str(&p2));
    nf_buf_free(&p1);
    nf_buf_free(&p2);
  }
  nf_diag_free(d);
  nf_arena_free(a);
  free(text);
}

static void check_str(const char *s) { check_input(s, strlen(s)); }

/* ---- corpus ---- */

static const char *const corpus[] = {
    "import nn\n"
    "import \"layers.nf\"\n"
    "# Matrix product.\n"
    "def matmul(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "}\n",

    "def conv2d<stride = 1, pad = 0, dilation = 1, groups = 1>(\n"
    "    I: f32[N, C, H, W], Wt: f32[K, CG, R, S]) -> (O: f32[N, K, OH, OW])\n"
    "    where OH = (H + 2 * pad - dilation * (R - 1) - 1) // stride + 1,\n"
    "          OW = (W + 2 * pad - dilation * (S - 1) - 1) // stride + 1\n"
    "    require C == CG * groups, stride > 0, K % groups == 0\n"
    "{\n"
    "  O(n, k, y, x) +=! (y * stride + r * dilation - pad >= 0 &&\n"
    "      y * stride + r * dilation - pad < H) ?\n"
    "    I(n, k // (K // groups) * CG + c, y * stride + r * dilation - pad,\n"
    "      x * stride + s * dilation - pad) * Wt(k, c, r, s) : 0.0\n"
    "    where c in 0:CG, r in 0:R, s in 0:S\n"
    "}\n",

    "def lltm_cell(X: f32[B, I], H: f32[B, D], C: f32[B, D],\n"
    "              W: f32[4 * D, I + D], b: f32[4 * D])\n"
    "    -> (H2: f32[B, D], C2: f32[B, D]) {\n"
    "  G(n, g) +=! (k < I ? X(n, k) : H(n, k - I)) * W(g, k) where k in 0:I + D\n"
    "  Gb(n, g) = G(n, g) + b(g)\n"
    "  In(n, d) = sigmoid(Gb(n, d)); Fg(n, d) = sigmoid(Gb(n, d + D))\n"
    "  C2(n, d) = Fg(n, d) * C(n, d) + In(n, d) * tanh(Gb(n, d + 3 * D))\n"
    "  H2(n, d) = sigmoid(Gb(n, d + 2 * D)) * tanh(C2(n, d))\n"
    "}\n"
    "def lstm<steps = 8>(X: f32[T, B, I], H0: f32[B, D], C0: f32[B, D],\n"
    "    W: f32[4 * D, I + D], b: f32[4 * D]) -> (H: f32[B, D]) require T == steps {\n"
    "  Hs[0] = H0\n"
    "  Cs[0] = C0\n"
    "  for t in 0:steps {\n"
    "    Xt[t](n, i) = X(t, n, i)\n"
    "    Hs[t + 1], Cs[t + 1] = lltm_cell(Xt[t], Hs[t], Cs[t], W, b)\n"
    "  }\n"
    "  H = Hs[steps]\n"
    "}\n",

    "def softmax(X: f32[*B, N]) -> (Y: f32[*B, N]) {\n"
    "  Mx(*b) max=! X(*b, j)\n"
    "  E(*b, j) = exp(X(*b, j) - Mx(*b))\n"
    "  S(*b) +=! E(*b, j)\n"
    "  Y(*b, j) = E(*b, j) / S(*b)\n"
    "}\n"
    "def misc(A: i64[N], B: bool[N]) -> (C: i64[N], D: bool[N], P: f32[]) {\n"
    "  C(i) = A(i) // 2 % 3 - -A(i) * (A(i) - (1 - 2))\n"
    "  D(i) = !B(i) || (A(i) < 0 && !(A(i) >= -(-3))) ? true : false\n"
    "  P() *=! pow(f32(A(i)), 0.5e-3) where i in 0:(N > 2 ? 2 : N)\n"
    "  Q() min=! f64(A(i)) * 1.5 / .25\n"
    "  R = net<a = 1, b = (N > 2)>(C, D)\n"
    "}\n",

    "import nn\n"
    "def mlp<batch = 4>(X: f32[batch, 8]) -> (L: f32[]) where H = 16 {\n"
    "  param W1: f32[H, 8] = kaiming_uniform; param b1: f32[H] = zeros\n"
    "  param W2: f64[3, H * 2] = xavier_normal(0.5)\n"
    "  param s: f32[] = uniform(-1, 2.5e-3); param c: bf16[2] = constant(-7)\n"
    "  param n: f16[2, 2] =\n"
    "    normal(1e-8, 3)\n"
    "  param(i) = X(0, i); param param: f32[2] = kaiming_normal()\n"
    "  L() +=! param(i) * W1(0, i)\n"
    "}\n",
};
#define N_CORPUS (sizeof corpus / sizeof corpus[0])

START_TEST(fuzz_parse_corpus_is_valid) {
  for (size_t i = 0; i < N_CORPUS; i++) {
    n_ok = 0;
    check_str(corpus[i]);
    ck_assert_msg(n_ok == 1, "corpus entry %zu does not parse", i);
  }
}
END_TEST

START_TEST(fuzz_parse_random_bytes) {
  seed(1);
  int n = iters();
  char buf[256];
  static const char syntax[] = "deffor in where require()[]{}<>=+-*/%!?:;,#\"\n\t AZaz09._*=!";
  for (int it = 0; it < n; it++) {
    size_t len = rnd(sizeof buf);
    int mode = (int)rnd(3);
    for (size_t i = 0; i < len; i++) {
      if (mode == 0)
        buf[i] = (char)rnd(256);
      else if (mode == 1)
        buf[i] = syntax[rnd(sizeof syntax - 1)];
      else /* mostly printable with a few control bytes and NULs */
        buf[i] = rnd(16) ? (char)(32 + rnd(95)) : (char)rnd(32);
    }
    check_input(buf, len);
  }
}
END_TEST

static const char *const soup[] = {
    "def", "f", "g", "A", "B", "C", "i", "j", "k", "N", "M", "max", "min",
    "import", "nn", "\"x.nf\"", "for", "in", "where", "require", "true",
    "false", "f32", "i64", "bool", "(", ")", "[", "]", "{", "}", "<", ">",
    "<=", ">=", "==", "!=", "=", "+=!", "*=!", "max=!", "min=!", "+=", "+",
    "-", "*", "/", "//", "%", "!", "&&", "||", "?", ":", ";", ",", "->",
    "\n", "\n", "\n", " ", "0", "1", "42", "1.5", "1e-8", ".5", "2.",
    "9223372036854775807", "99999999999999999999", "#c\n", "*i", "@",
    "param", "zeros", "uniform", "xavier_normal"};

/* A statement-shaped fragment, so soups reach deeper into the grammar. */
static const char *const frags[] = {
    "def f(A: f32[N]) -> (B: f32[N]) {\n", "}\n", "  B(i) = A(i)\n",
    "  C(i, j) +=! A(i, k) * B(k, j) where k in 0:K\n", "  for t in 0:3 {\n",
    "  H[t + 1], C[t] = cell<a = 1>(X[t], H[t])\n", "  T = U\n",
    "  L() max=! -x(*i)\n", "def g<p = 2, q>(X: f32[*S]) -> (Y: f32[*S])\n",
    "    where M = N // 2 require M > 0 {\n", "import nn\n", "  Y(*i) = ",
    "a ? b : c", "(x + y) * z", "-(-x)", "!(a < b)", " + ", " ? ", " : ",
    "exp(", ")", "f32(", "H[0](i)", ";", "\n",
    "  param W: f32[N, 2] = uniform(-1, 2.5)\n", "  param b: f32[] = ",
    "kaiming_normal(0.5)", "constant(-0.0)", "param"};

START_TEST(fuzz_parse_token_soup) {
  seed(2);
  n_ok = n_syntax = 0;
  int n = iters();
  nf_buf b = NF_BUF_INIT;
  for (int it = 0; it < n; it++) {
    nf_buf_reset(&b);
    size_t count = rnd(60);
    int grammar = rnd(2) == 0;
    for (size_t i = 0; i < count; i++) {
      if (grammar)
        nf_buf_puts(&b, frags[rnd(sizeof frags / sizeof frags[0])]);
      else
        nf_buf_puts(&b, soup[rnd(sizeof soup / sizeof soup[0])]);
      if (!grammar && rnd(2)) nf_buf_putc(&b, ' ');
    }
    ck_assert(!b.oom);
    check_input(b.data ? b.data : "", b.len);
  }
  nf_buf_free(&b);
  fprintf(stderr, "soup: %d ok, %d syntax errors\n", n_ok, n_syntax);
}
END_TEST

START_TEST(fuzz_parse_mutations) {
  seed(3);
  int n = iters();
  nf_buf b = NF_BUF_INIT;
  n_ok = n_syntax = 0;
  for (int it = 0; it < n; it++) {
    const char *src = corpus[rnd(N_CORPUS)];
    size_t len = strlen(src);
    nf_buf_reset(&b);
    nf_buf_add(&b, src, len);
    int n_mut = 1 + (int)rnd(3);
    for (int m = 0; m < n_mut && b.len > 0; m++) {
      size_t at = rnd(b.len), span = 1 + rnd(12);
      if (at + span > b.len) span = b.len - at;
      switch (rnd(6)) {
      case 0: /* flip a byte's bit */
        b.data[at] ^= (char)(1u << rnd(8));
        break;
      case 1: /* replace a byte with a syntax character */
        b.data[at] = "()[]{}<>=+-*/!?:;,#\n\"*0a"[rnd(25)];
        break;
      case 2: /* delete a span */
        memmove(b.data + at, b.data + at + span, b.len - at - span);
        b.len -= span;
        break;
      case 3: { /* duplicate a span */
        char tmp[16];
        memcpy(tmp, b.data + at, span);
        nf_buf_add(&b, tmp, span); /* grow, then shift into place */
        memmove(b.data + at + span, b.data + at, b.len - span - at);
        memcpy(b.data + at, tmp, span);
        break;
      }
      case 4: { /* insert a span copied from elsewhere in the corpus */
        const char *other = corpus[rnd(N_CORPUS)];
        size_t olen = strlen(other), from = rnd(olen);
        if (from + span > olen) span = olen - from;
        char tmp[16];
        memcpy(tmp, other + from, span);
        nf_buf_add(&b, tmp, span);
        memmove(b.data + at + span, b.data + at, b.len - span - at);
        memcpy(b.data + at, tmp, span);
        break;
      }
      default: /* insert a random byte */
        nf_buf_putc(&b, 0);
        memmove(b.data + at + 1, b.data + at, b.len - 1 - at);
        b.data[at] = (char)rnd(256);
        break;
      }
    }
    ck_assert(!b.oom);
    check_input(b.data, b.len);
  }
  nf_buf_free(&b);
  fprintf(stderr, "mutations: %d ok, %d syntax errors\n", n_ok, n_syntax);
  /* Mutations keep many inputs valid, so the round trip is exercised. */
  ck_assert_int_gt(n_ok, n / 20);
  ck_assert_int_gt(n_syntax, n / 20);
}
END_TEST

START_TEST(fuzz_parse_truncations) {
  n_ok = n_syntax = 0;
  for (size_t i = 0; i < N_CORPUS; i++) {
    size_t len = strlen(corpus[i]);
    for (size_t cut = 0; cut <= len; cut++) {
      check_input(corpus[i], cut);            /* prefix */
      check_input(corpus[i] + cut, len - cut); /* suffix */
    }
  }
  ck_assert_int_gt(n_ok, 0);
}
END_TEST


/* ---- random valid programs ---- */

static const char *const names[] = {"a", "b", "x", "N", "K", "t", "max",
                                    "f32", "in_", "_z9"};
#define PICK(arr) (arr)[rnd(sizeof(arr) / sizeof(arr)[0])]

static void gen_expr(nf_buf *b, int depth);

/* A sub-expression, usually parenthesised; bare ones test precedence. */
static void gen_sub(nf_buf *b, int depth) {
  int wrap = rnd(4) != 0;
  if (wrap) nf_buf_putc(b, '(');
  gen_expr(b, depth);
  if (wrap) nf_buf_putc(b, ')');
}

/* Space after an operator: sometimes a line break or a comment, which
 * continue the statement after an operator. */
static void gen_gap(nf_buf *b) {
  switch (rnd(12)) {
  case 0: nf_buf_puts(b, "\n    "); break;
  case 1: nf_buf_puts(b, " # note\n  "); break;
  default: nf_buf_putc(b, ' ');
  }
}

static void gen_float(nf_buf *b) {
  double v;
  switch (rnd(4)) {
  case 0: v = (double)rnd(1000) / 8; break;
  case 1: v = (double)(rng() >> 11) * 0x1p-53; break;
  case 2: v = ldexp((double)(rng() >> 11), (int)rnd(600) - 330); break;
  default: v = (double)rnd(100000) * 1e-3; break;
  }
  char s[64];
  snprintf(s, sizeof s, rnd(2) ? "%.*g" : "%.*e", 1 + (int)rnd(17), v);
  nf_buf_puts(b, s);
  if (!strpbrk(s, ".e")) nf_buf_puts(b, rnd(2) ? "." : ".0");
}

static void gen_apply(nf_buf *b, int depth) {
  nf_buf_puts(b, PICK(names));
  if (rnd(4) == 0) {
    nf_buf_putc(b, '[');
    gen_expr(b, depth - 1);
    nf_buf_putc(b, ']');
  }
  nf_buf_putc(b, '(');
  int n = (int)rnd(4);
  for (int i = 0; i < n; i++) {
    if (i) nf_buf_puts(b, rnd(6) ? ", " : ",\n      ");
    if (rnd(5) == 0) {
      nf_buf_putc(b, '*');
      nf_buf_puts(b, PICK(names));
    } else {
      gen_expr(b, depth - 1);
    }
  }
  nf_buf_putc(b, ')');
}

static void gen_expr(nf_buf *b, int depth) {
  static const char *const binops[] = {"+", "-", "*", "/", "//", "%", "<",
                                       "<=", ">", ">=", "==", "!=", "&&",
                                       "||"};
  switch (depth <= 0 ? rnd(4) : rnd(11)) {
  case 0: nf_buf_puts(b, PICK(names)); break;
  case 1:
    nf_buf_printf(b, "%llu", rnd(3) ? (unsigned long long)rnd(100)
                                     : (unsigned long long)(rng() >> 1));
    break;
  case 2: gen_float(b); break;
  case 3: nf_buf_puts(b, rnd(2) ? "true" : "false"); break;
  case 4:
  case 5:
  case 6:
    gen_sub(b, depth - 1);
    nf_buf_printf(b, " %s", PICK(binops));
    gen_gap(b);
    gen_sub(b, depth - 1);
    break;
  case 7:
    nf_buf_puts(b, rnd(2) ? "-" : "!");
    if (rnd(2)) gen_sub(b, depth - 1);
    else nf_buf_puts(b, PICK(names));
    break;
  case 8:
    gen_sub(b, depth - 1);
    nf_buf_puts(b, " ?");
    gen_gap(b);
    gen_sub(b, depth - 1);
    nf_buf_puts(b, " :");
    gen_gap(b);
    gen_sub(b, depth - 1);
    break;
  case 9: gen_apply(b, depth); break;
  default:
    nf_buf_putc(b, '(');
    gen_expr(b, depth - 1);
    nf_buf_putc(b, ')');
  }
}

static void gen_tref(nf_buf *b, int depth) {
  nf_buf_puts(b, PICK(names));
  if (rnd(3) == 0) {
    nf_buf_putc(b, '[');
    gen_expr(b, depth);
    nf_buf_putc(b, ']');
  }
}

static void gen_tdecls(nf_buf *b, int min) {
  static const char *const dtypes[] = {"f32", "f64", "i32", "i64",
                                       "bool", "f16", "bf16"};
  nf_buf_putc(b, '(');
  int n = min + (int)rnd(3);
  for (int i = 0; i < n; i++) {
    nf_buf_printf(b, "%s%s: %s[", i ? ", " : "", PICK(names), PICK(dtypes));
    int nd = (int)rnd(4);
    for (int j = 0; j < nd; j++) {
      if (j) nf_buf_puts(b, ", ");
      if (rnd(4) == 0) nf_buf_printf(b, "*%s", PICK(names));
      else gen_expr(b, 2);
    }
    nf_buf_putc(b, ']');
  }
  nf_buf_putc(b, ')');
}

static void gen_stmts(nf_buf *b, int level);

static void gen_stmt(nf_buf *b, int level) {
  static const char *const redops[] = {"=", "+=!", "*=!", "max=!", "min=!"};
  for (int i = 0; i < level; i++) nf_buf_puts(b, "  ");
  switch (level < 4 ? rnd(6) : rnd(5)) {
  case 0:
  case 1:
  case 2: {
    gen_tref(b, 1);
    nf_buf_putc(b, '(');
    int n = (int)rnd(4);
    for (int i = 0; i < n; i++)
      nf_buf_printf(b, "%s%s%s", i ? ", " : "", rnd(5) ? "" : "*",
                    PICK(names));
    nf_buf_printf(b, ") %s", PICK(redops));
    gen_gap(b);
    gen_expr(b, 4);
    int nr = rnd(3) ? 0 : 1 + (int)rnd(3);
    for (int i = 0; i < nr; i++) {
      nf_buf_printf(b, "%s%s in ", i ? ", " : (rnd(4) ? " where " : "\n where "),
                    PICK(names));
      gen_sub(b, 2);
      nf_buf_putc(b, ':');
      gen_sub(b, 2);
    }
    break;
  }
  case 3: {
    int n = 1 + (int)rnd(3);
    for (int i = 0; i < n; i++) {
      if (i) nf_buf_puts(b, ", ");
      gen_tref(b, 1);
    }
    nf_buf_puts(b, " = ");
    if (n == 1 && rnd(3) == 0) { /* a copy */
      gen_tref(b, 1);
      break;
    }
    nf_buf_puts(b, PICK(names));
    if (rnd(2)) {
      nf_buf_putc(b, '<');
      int np = 1 + (int)rnd(3);
      for (int i = 0; i < np; i++) {
        nf_buf_printf(b, "%s%s = (", i ? ", " : "", PICK(names));
        gen_expr(b, 3);
        nf_buf_putc(b, ')');
      }
      nf_buf_putc(b, '>');
    }
    nf_buf_putc(b, '(');
    int na = (int)rnd(4);
    for (int i = 0; i < na; i++) {
      if (i) nf_buf_puts(b, ", ");
      gen_tref(b, 1);
    }
    nf_buf_putc(b, ')');
    break;
  }
  default:
    nf_buf_printf(b, "for %s in ", PICK(names));
    gen_sub(b, 2);
    nf_buf_putc(b, ':');
    gen_sub(b, 2);
    nf_buf_puts(b, " {\n");
    gen_stmts(b, level + 1);
    for (int i = 0; i < level; i++) nf_buf_puts(b, "  ");
    nf_buf_putc(b, '}');
  }
  nf_buf_puts(b, rnd(8) ? "\n" : "; ");
}

static void gen_stmts(nf_buf *b, int level) {
  int n = (int)rnd(5);
  for (int i = 0; i < n; i++) gen_stmt(b, level);
}

static void gen_program(nf_buf *b) {
  int n_imports = (int)rnd(3);
  for (int i = 0; i < n_imports; i++)
    nf_buf_printf(b, rnd(2) ? "import %s\n" : "import \"%s.nf\"\n",
                  PICK(names));
  int n_defs = (int)rnd(4);
  for (int i = 0; i < n_defs; i++) {
    nf_buf_printf(b, "def %s", PICK(names));
    if (rnd(2)) {
      nf_buf_putc(b, '<');
      int np = 1 + (int)rnd(3);
      for (int j = 0; j < np; j++) {
        nf_buf_printf(b, "%s%s", j ? ",\n  " : "", PICK(names));
        if (rnd(2)) {
          nf_buf_puts(b, " = (");
          gen_expr(b, 2);
          nf_buf_putc(b, ')');
        }
      }
      nf_buf_putc(b, '>');
    }
    gen_tdecls(b, 0);
    nf_buf_puts(b, rnd(2) ? " -> " : "\n  -> ");
    gen_tdecls(b, 1);
    int nw = rnd(2) ? 0 : 1 + (int)rnd(2);
    for (int j = 0; j < nw; j++) {
      nf_buf_printf(b, "%s%s = ", j ? ", " : "\n  where ", PICK(names));
      gen_expr(b, 3);
    }
    int nr = rnd(2) ? 0 : 1 + (int)rnd(2);
    for (int j = 0; j < nr; j++) {
      nf_buf_puts(b, j ? ", " : "\n  require ");
      gen_expr(b, 3);
    }
    nf_buf_puts(b, rnd(2) ? " {\n" : "\n{\n");
    gen_stmts(b, 1);
    nf_buf_puts(b, "}\n");
  }
}

START_TEST(fuzz_parse_random_programs) {
  seed(4);
  int n = iters() / 4;
  nf_buf b = NF_BUF_INIT;
  n_ok = n_syntax = 0;
  for (int it = 0; it < n; it++) {
    nf_buf_reset(&b);
    gen_program(&b);
    ck_assert(!b.oom);
    int before = n_ok;
    check_input(b.data ? b.data : "", b.len);
    ck_assert_msg(n_ok == before + 1, "generated program rejected:\n%s",
                  nf_buf_str(&b));
  }
  nf_buf_free(&b);
}
END_TEST

static void check_repeat(const char *pre, const char *unit, int n,
                         const char *mid, const char *close, int n_close,
                         const char *post) {
  nf_buf b = NF_BUF_INIT;
  nf_buf_puts(&b, pre);
  for (int i = 0; i < n; i++) nf_buf_puts(&b, unit);
  nf_buf_puts(&b, mid);
  for (int i = 0; i < n_close; i++) nf_buf_puts(&b, close);
  nf_buf_puts(&b, post);
  ck_assert(!b.oom);
  check_input(b.data, b.len);
  nf_buf_free(&b);
}

START_TEST(fuzz_parse_deep_nesting) {
  static const char pre[] = "def f(A: f32[N]) -> (B: f32[N]) {\n  B(i) = ";
  static const char post[] = "\n}\n";
  n_ok = n_syntax = 0;
  check_repeat(pre, "(", 100000, "x", ")", 100000, post);
  check_repeat(pre, "-", 100000, "x", "", 0, post);
  check_repeat(pre, "!", 100000, "x", "", 0, post);
  check_repeat(pre, "(", 100000, "", "", 0, "");
  check_repeat("", "(", 100000, "", "", 0, "");
  check_repeat(pre, "f(", 100000, "x", ")", 100000, post);
  check_repeat(pre, "H[", 100000, "0", "](i)", 100000, post);
  check_repeat(pre, "x ? ", 100000, "x", " : x", 100000, post);
  check_repeat(pre, "x ? x : ", 100000, "x", "", 0, post);
  check_repeat(pre, "x + ", 100000, "x", "", 0, post);
  check_repeat(pre, "-(", 100000, "x", ")", 100000, post);
  check_repeat("def f(A: f32[N]) -> (B: f32[N]) {\n", "for t in 0:1 {\n", 100000,
               "", "}\n", 100000, "}\n");
  check_repeat("def f(A: f32[", "(", 100000, "N", ")", 100000,
               "]) -> (B: f32[N]) {\n}\n");
  check_repeat("", "{", 100000, "", "}", 100000, "");
  check_repeat("def f(A: f32[N]) -> (B: f32[N]) {\n", "{", 100000, "", "}",
               100000, "}\n");
  ck_assert_int_eq(n_ok, 0);
  /* A long identifier or number is one token, not a problem. */
  check_repeat(pre, "x", 1000000, "", "", 0, post);
  check_repeat(pre, "9", 100000, "", "", 0, post);
  check_repeat(pre, "1.", 1, "", "5", 100000, post);
  check_repeat("import \"", "a", 100000, "\"", "", 0, "\n");
}
END_TEST

Suite *fuzz_parse_suite(void) {
  Suite *s = suite_create("fuzz_parse");
  TCase *tc = tcase_create("fuzz_parse");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, fuzz_parse_corpus_is_valid);
  tcase_add_test(tc, fuzz_parse_random_bytes);
  tcase_add_test(tc, fuzz_parse_token_soup);
  tcase_add_test(tc, fuzz_parse_mutations);
  tcase_add_test(tc, fuzz_parse_truncations);
  tcase_add_test(tc, fuzz_parse_random_programs);
  tcase_add_test(tc, fuzz_parse_deep_nesting);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(fuzz_parse_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
