/* flops.c - floating-point operation counts of statements, for the
 * gradient cost table (nf_autodiff.h) and later for the tuner's budget.
 *
 * A statement's count is the number of points of its iteration box (the
 * output's elements times every reduction range) times the float
 * operations of its right side, plus one per point for a reduction's
 * accumulation.  Leaves (constants, variables, loads) and integer or bool
 * arithmetic (indices, guards) are free; a comparison of floats costs one;
 * a select costs its condition plus its costlier branch.  Shared
 * subexpressions are counted once per use (an upper bound for code that
 * keeps them in registers). */
#include "nf_autodiff.h"

static int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Depth-bounded recursion: statements come from source text whose
 * nesting the parser bounds, or from autodiff, which builds shallow
 * trees; past the bound the remainder counts as free. */
static int64_t cost(const nf_expr *e, int depth) {
  if (depth > 4000) return 0;
  nf_op op = (nf_op)e->op;
  if (op == NF_OP_CONST || op == NF_OP_VAR || op == NF_OP_ACCESS) return 0;
  if (op == NF_OP_SELECT) {
    int64_t a = cost(e->args[1], depth + 1), b = cost(e->args[2], depth + 1);
    return sat_add(cost(e->args[0], depth + 1), a > b ? a : b);
  }
  int64_t c = 0;
  for (int k = 0; k < e->n_args; k++) c = sat_add(c, cost(e->args[k], depth + 1));
  int is_float = nf_dtype_is_float((nf_dtype)e->dtype);
  if (op >= NF_OP_LT && op <= NF_OP_NE)
    is_float = nf_dtype_is_float((nf_dtype)e->args[0]->dtype);
  if (op == NF_OP_CAST || op == NF_OP_STOPGRAD) is_float = 0;
  return is_float ? sat_add(c, 1) : c;
}

int64_t nf_stmt_flops(const nf_graph *g, uint32_t stmt) {
  if (stmt >= g->n_stmts) return 0;
  const nf_stmt *s = &g->stmts[stmt];
  int64_t box = nf_tensor_numel(&g->tensors[s->out]);
  if (box < 0) return INT64_MAX;
  for (int r = 0; r < s->n_red; r++) box = sat_mul(box, s->red_ext[r]);
  int64_t per = cost(s->rhs, 0);
  if (s->red != NF_RED_NONE) per = sat_add(per, 1);
  return sat_mul(box, per);
}
