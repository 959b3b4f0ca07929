/* nf_test_graphs.h - graphs that the validator must refuse or accept
 * (issue 31), shared by test_proto.c (nf_wire_graph_to_ir) and
 * test_daemon.c (the real daemon):
 *  - a wire graph Y(i) = !!..!X(i) whose chain of NOTs is deeper than
 *    NF_MAX_EXPR_DEPTH, built by hand on the wire (nf_wire_graph_from_ir
 *    validates first and would refuse it);
 *  - n x n matrix products C(i, j) += a(i, k) * B(k, j) whose left operand
 *    `a` is an access of A with shifted, guarded, non-affine or gathered
 *    indices (bounds_graph).
 * Header-only (static functions), for the test executables. */
#ifndef NF_TEST_GRAPHS_H
#define NF_TEST_GRAPHS_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ir.h"
#include "nf_wire.h"

/* ---- a deep chain on the wire ---- */

typedef struct deep_wire {
  Neoflow__Graph g;
  Neoflow__Tensor t[2];
  Neoflow__Tensor *tp[2];
  int64_t shape[1];
  Neoflow__Expr *x;
  Neoflow__Expr **xp;
  uint32_t *args;
  Neoflow__Stmt s;
  Neoflow__Stmt *sp[1];
  uint32_t in0, out0;
} deep_wire;

/* Y(v0) = NOT^n_not X(v0) over bool tensors of 8 elements: exprs[0] is
 * the variable, exprs[1] the access, then the NOTs; the right side is
 * n_not + 2 nodes tall.  About 9 bytes per NOT once packed. */
static inline void deep_wire_init(deep_wire *w, size_t n_not) {
  memset(w, 0, sizeof(*w));
  size_t n = n_not + 2;
  w->x = calloc(n, sizeof(*w->x));
  w->xp = calloc(n, sizeof(*w->xp));
  w->args = calloc(n, sizeof(*w->args));
  ck_assert(w->x && w->xp && w->args);
  neoflow__graph__init(&w->g);
  w->g.name = (char *)"deep";
  w->shape[0] = 8;
  for (int i = 0; i < 2; i++) {
    neoflow__tensor__init(&w->t[i]);
    w->tp[i] = &w->t[i];
    w->t[i].dtype = NEOFLOW__DTYPE__DT_BOOL;
    w->t[i].kind = i ? NEOFLOW__TENSOR_KIND__TK_OUTPUT : NEOFLOW__TENSOR_KIND__TK_INPUT;
    w->t[i].name = (char *)(i ? "Y" : "X");
    w->t[i].shape = w->shape;
    w->t[i].n_shape = 1;
  }
  for (size_t i = 0; i < n; i++) {
    neoflow__expr__init(&w->x[i]);
    w->xp[i] = &w->x[i];
  }
  w->x[0].op = NEOFLOW__OP__OP_VAR;
  w->x[0].dtype = NEOFLOW__DTYPE__DT_I64;
  w->x[1].op = NEOFLOW__OP__OP_ACCESS;
  w->x[1].dtype = NEOFLOW__DTYPE__DT_BOOL;
  w->x[1].tensor = 0;
  w->x[1].n_args = 1;
  w->x[1].args = &w->args[1]; /* args[1] = 0: the variable */
  for (size_t i = 2; i < n; i++) {
    w->x[i].op = NEOFLOW__OP__OP_NOT;
    w->x[i].dtype = NEOFLOW__DTYPE__DT_BOOL;
    w->args[i] = (uint32_t)(i - 1);
    w->x[i].args = &w->args[i];
    w->x[i].n_args = 1;
  }
  neoflow__stmt__init(&w->s);
  w->s.out = 1;
  w->s.rhs = (uint32_t)(n - 1);
  w->sp[0] = &w->s;
  w->out0 = 1;
  w->g.n_tensors = 2;
  w->g.tensors = w->tp;
  w->g.n_exprs = n;
  w->g.exprs = w->xp;
  w->g.n_stmts = 1;
  w->g.stmts = w->sp;
  w->g.n_inputs = 1;
  w->g.inputs = &w->in0;
  w->g.n_outputs = 1;
  w->g.outputs = &w->out0;
}

static inline void deep_wire_free(deep_wire *w) {
  free(w->x);
  free(w->xp);
  free(w->args);
}

/* ---- matrix products with checked left operands ---- */

enum {
  BG_SHIFT_1000,   /* A(i + 1000, k): out of bounds everywhere */
  BG_SHIFT_1,      /* A(i + 1, k): out of bounds on the last row */
  BG_GUARD_OK,     /* i >= 3 ? A(i - 3, k) : 0: out only where the guard is false */
  BG_GUARD_SHORT,  /* i >= 2 ? A(i - 3, k) : 0: the guard lets i = 2 through */
  BG_GUARD_NEVER,  /* i + 1000 < n ? A(i + 1000, k) : 0: never evaluated */
  BG_GUARD_SUM,    /* i + k < n ? A(i + k, k) : 0: a guard on two variables */
  BG_PAD,          /* i >= 1 && i - 1 < n ? A(i - 1, k) : 0: a padding guard */
  BG_PAD_NOT,      /* !(i < 1 || i >= n + 1) ? A(i - 1, k) : 0: the same, negated */
  BG_MOD,          /* A(i * 5 % 11, k): not affine; out at i = 2 for n = 8 */
  BG_MOD_OK,       /* A(i * 5 % n, k): not affine, in bounds */
  BG_GATHER,       /* A(ix(i), k): data-dependent, left to the run time */
  BG_DATA_GUARD,   /* A(0, k) > 0 ? A(i + 1000, k) : 0: out where data says so */
  BG_EMPTY,        /* A(i + 1000, k) under a reduction over no k: never read */
  BG_N
};

static inline const nf_expr *bg_i(nf_ir_ctx *c, int64_t v) { return nf_e_const_i(c, NF_I64, v); }

static inline const nf_expr *bg_bin(nf_ir_ctx *c, nf_op op, const nf_expr *a, const nf_expr *b) {
  return nf_e_binary(c, op, a, b);
}

/* C(i, j) += a(i, k) * B(k, j), n x n (A, B, C), with a per variant;
 * BG_GATHER has a fourth tensor, the i64 input ix[n] (values 0..n-1 are
 * in bounds). */
static inline nf_graph *bounds_graph(nf_ir_ctx *c, int variant, int64_t n) {
  nf_graph *g = nf_graph_new(c, "bounds");
  int64_t sh[2] = {n, n};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sh);
  int o = nf_graph_add_tensor(g, "C", NF_F32, NF_T_OUTPUT, 2, sh);
  const nf_expr *i = nf_e_var(c, 0), *j = nf_e_var(c, 1), *k = nf_e_var(c, 2);
  const nf_expr *zero = nf_e_const_f(c, NF_F32, 0.0);
  const nf_expr *row = i, *cond = NULL, *rk[2];
#define BG_A(r) (rk[0] = (r), rk[1] = k, nf_e_access(c, (uint32_t)a, NF_F32, 2, rk))
  switch (variant) {
  case BG_SHIFT_1000: row = bg_bin(c, NF_OP_ADD, i, bg_i(c, 1000)); break;
  case BG_SHIFT_1: row = bg_bin(c, NF_OP_ADD, i, bg_i(c, 1)); break;
  case BG_GUARD_OK:
  case BG_GUARD_SHORT:
    row = bg_bin(c, NF_OP_SUB, i, bg_i(c, 3));
    cond = bg_bin(c, NF_OP_GE, i, bg_i(c, variant == BG_GUARD_OK ? 3 : 2));
    break;
  case BG_GUARD_NEVER:
    row = bg_bin(c, NF_OP_ADD, i, bg_i(c, 1000));
    cond = bg_bin(c, NF_OP_LT, row, bg_i(c, n));
    break;
  case BG_GUARD_SUM:
    row = bg_bin(c, NF_OP_ADD, i, k);
    cond = bg_bin(c, NF_OP_LT, row, bg_i(c, n));
    break;
  case BG_PAD:
    row = bg_bin(c, NF_OP_SUB, i, bg_i(c, 1));
    cond = bg_bin(c, NF_OP_AND, bg_bin(c, NF_OP_GE, i, bg_i(c, 1)),
                  bg_bin(c, NF_OP_LT, row, bg_i(c, n)));
    break;
  case BG_PAD_NOT:
    row = bg_bin(c, NF_OP_SUB, i, bg_i(c, 1));
    cond = nf_e_unary(c, NF_OP_NOT,
                      bg_bin(c, NF_OP_OR, bg_bin(c, NF_OP_LT, i, bg_i(c, 1)),
                             bg_bin(c, NF_OP_GE, i, bg_i(c, n + 1))));
    break;
  case BG_MOD:
  case BG_MOD_OK:
    row = bg_bin(c, NF_OP_MOD, bg_bin(c, NF_OP_MUL, i, bg_i(c, 5)),
                 bg_i(c, variant == BG_MOD ? 11 : n));
    break;
  case BG_GATHER: {
    int64_t sh1[1] = {n};
    int ix = nf_graph_add_tensor(g, "ix", NF_I64, NF_T_INPUT, 1, sh1);
    row = nf_e_access(c, (uint32_t)ix, NF_I64, 1, &i);
    break;
  }
  case BG_DATA_GUARD:
    row = bg_bin(c, NF_OP_ADD, i, bg_i(c, 1000));
    cond = bg_bin(c, NF_OP_GT, BG_A(bg_i(c, 0)), zero);
    break;
  case BG_EMPTY: row = bg_bin(c, NF_OP_ADD, i, bg_i(c, 1000)); break;
  default: ck_abort_msg("variant %d", variant);
  }
  const nf_expr *lhs = BG_A(row);
#undef BG_A
  if (cond) lhs = nf_e_select(c, cond, lhs, zero);
  const nf_expr *ib[2] = {k, j};
  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)o;
  s.red = NF_RED_SUM;
  s.n_red = 1;
  s.red_ext[0] = variant == BG_EMPTY ? 0 : n;
  s.rhs = nf_e_binary(c, NF_OP_MUL, lhs, nf_e_access(c, (uint32_t)b, NF_F32, 2, ib));
  ck_assert_ptr_nonnull(s.rhs);
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK);
  return g;
}

/* The wire form of bounds_graph (free with nf_wire_graph_free). */
static inline Neoflow__Graph *bounds_wire(int variant, int64_t n) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  Neoflow__Graph *pg = NULL;
  ck_assert_int_eq(nf_wire_graph_from_ir(bounds_graph(c, variant, n), &pg), NF_OK);
  nf_ir_ctx_free(c);
  return pg;
}

#endif
