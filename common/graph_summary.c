/* graph_summary.c - nf_graph_summary (nf_flops.h): what a subgraph
 * computes, in a few words, for people (the daemon's log and status, the
 * training report): its notable operations in order of first use. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nf_flops.h"

/* A product of two tensor reads (possibly cast): a matmul-like sum. */
static int is_product(const nf_expr *e) {
  if (e->op != NF_OP_MUL || e->n_args != 2) return 0;
  for (int i = 0; i < 2; i++) {
    const nf_expr *a = e->args[i];
    if (a->op == NF_OP_CAST && a->n_args == 1) a = a->args[0];
    if (a->op != NF_OP_ACCESS) return 0;
  }
  return 1;
}

static int is_zero(const nf_expr *e) {
  int fl = e->dtype == NF_F16 || e->dtype == NF_BF16 || e->dtype == NF_F32 || e->dtype == NF_F64;
  return e->op == NF_OP_CONST && (fl ? e->u.f == 0 : e->u.i == 0);
}

static const char *op_word(const nf_expr *e) {
  if (e->op == NF_OP_MAX && e->n_args == 2 && (is_zero(e->args[0]) || is_zero(e->args[1])))
    return "relu";
  switch (e->op) {
    case NF_OP_EXP: return "exp";
    case NF_OP_LOG: return "log";
    case NF_OP_SQRT: return "sqrt";
    case NF_OP_RSQRT: return "rsqrt";
    case NF_OP_TANH: return "tanh";
    case NF_OP_SIGMOID: return "sigmoid";
    case NF_OP_ERF: return "erf";
    case NF_OP_ABS: return "abs";
    case NF_OP_FLOOR: return "floor";
    case NF_OP_CEIL: return "ceil";
    case NF_OP_DIV: return "div";
    case NF_OP_POW: return "pow";
    case NF_OP_MAX: return "max";
    case NF_OP_MIN: return "min";
    case NF_OP_SELECT: return "select";
    default: return NULL;
  }
}

#define SEEN_SLOTS 2048 /* distinct nodes a summary looks at, at most half of it */

typedef struct words {
  const char *w[8];
  int n, more;
  const nf_expr *seen[SEEN_SLOTS]; /* open addressing: each node walked once
                                      (shared subexpressions: a chain of
                                      squarings is not 2^n visits) */
  int n_seen;
} words;

/* 1 when e was walked before (else it is marked, while there is room:
 * past SEEN_SLOTS / 2 nodes the summary stops looking). */
static int seen_before(words *W, const nf_expr *e) {
  size_t h = ((uintptr_t)e >> 4) & (SEEN_SLOTS - 1);
  while (W->seen[h]) {
    if (W->seen[h] == e) return 1;
    h = (h + 1) & (SEEN_SLOTS - 1);
  }
  if (W->n_seen >= SEEN_SLOTS / 2) return 1;
  W->seen[h] = e;
  W->n_seen++;
  return 0;
}

static void add(words *W, const char *w) {
  for (int i = 0; i < W->n; i++)
    if (!strcmp(W->w[i], w)) return;
  if (W->n < 8) W->w[W->n++] = w;
  else W->more = 1;
}

static void walk(words *W, const nf_expr *e, int depth) {
  if (depth > 64 || seen_before(W, e)) return;
  const char *w = op_word(e);
  if (w) add(W, w);
  for (int i = 0; i < e->n_args; i++) walk(W, e->args[i], depth + 1);
}

void nf_graph_summary(const nf_graph *g, char *out, size_t n) {
  static __thread words W; /* (16 KiB: not on a caller's small stack) */
  memset(&W, 0, sizeof W);
  int elementwise = 0;
  for (uint32_t s = 0; s < g->n_stmts; s++) {
    const nf_stmt *st = &g->stmts[s];
    switch (st->red) {
      case NF_RED_SUM: add(&W, is_product(st->rhs) ? "matmul" : "sum"); break;
      case NF_RED_PROD: add(&W, "prod"); break;
      case NF_RED_MAX: add(&W, "max-reduce"); break;
      case NF_RED_MIN: add(&W, "min-reduce"); break;
      default: elementwise = 1; break;
    }
    if (!(st->red == NF_RED_SUM && is_product(st->rhs))) walk(&W, st->rhs, 0);
  }
  if (!W.n && elementwise) add(&W, "elementwise");
  size_t k = 0;
  out[0] = 0;
  for (int i = 0; i < W.n && k < n; i++)
    k += (size_t)snprintf(out + k, n - k, "%s%s", i ? "+" : "", W.w[i]);
  if (W.more && k < n) k += (size_t)snprintf(out + k, n - k, "+...");
  if (k < n)
    snprintf(out + k, n - k, "%s%u stmt%s", W.n ? ", " : "", g->n_stmts, g->n_stmts == 1 ? "" : "s");
}
