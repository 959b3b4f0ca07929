/* test_ir.c - tests of the expression IR (nf_ir.h): hash-consing and
 * typing of the constructors, the graph builder, validation, canonical
 * encoding and hashing, affine forms, bounds, simplification and visiting.
 *
 * Bounds and simplification are checked against a small brute-force
 * evaluator written here (Python `//` and `%`, lazy select) over random
 * expressions on small variable ranges; the random generator is seeded,
 * so failures reproduce. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nf_flops.h"
#include "nf_ir.h"
#include "nf_ptrmap.h"

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  rng_state = x;
  return x;
}

static int rndi(int n) { return (int)(rnd() % (uint64_t)n); }

static const nf_expr *V(nf_ir_ctx *c, uint32_t v) { return nf_e_var(c, v); }
static const nf_expr *I(nf_ir_ctx *c, int64_t v) {
  return nf_e_const_i(c, NF_I64, v);
}
static const nf_expr *B2(nf_ir_ctx *c, nf_op op, const nf_expr *a,
                         const nf_expr *b) {
  return nf_e_binary(c, op, a, b);
}

/* Forged nodes (built by hand, bypassing the constructors) for validation
 * tests; freed by free_forged. */
static void *forged[64];
static int n_forged;

static nf_expr *forge(uint8_t op, uint8_t dtype, int n_args) {
  nf_expr *e = calloc(1, sizeof(nf_expr) + 3 * sizeof(nf_expr *));
  ck_assert_ptr_nonnull(e);
  ck_assert_int_lt(n_forged, 64);
  forged[n_forged++] = e;
  e->op = op;
  e->dtype = dtype;
  e->n_args = (uint16_t)n_args;
  return e;
}

static void free_forged(void) {
  for (int i = 0; i < n_forged; i++) free(forged[i]);
  n_forged = 0;
}

/* ---- dtypes and operators ---- */

/* The common pointer map (nf_ptrmap.h): an all-zero map is empty and owns
 * nothing; put inserts and overwrites across growth; clear forgets in O(1)
 * (and for real when the generation stamp wraps); iteration sees each
 * entry once; free leaves an empty map that works again. */
START_TEST(ir_ptrmap) {
  nf_ptrmap m = NF_PTRMAP_INIT;
  static char keys[5000];
  uint64_t v = 99;
  ck_assert_int_eq(nf_ptrmap_get(&m, &keys[0], &v), 0);
  ck_assert_uint_eq(v, 99);
  size_t it = 0;
  ck_assert_int_eq(nf_ptrmap_next(&m, &it, NULL, NULL), 0);
  nf_ptrmap_clear(&m); /* on an unused map: still empty, still usable */
  for (int i = 0; i < 5000; i++) ck_assert_int_eq(nf_ptrmap_put(&m, &keys[i], (uint64_t)i * 3), NF_OK);
  ck_assert_uint_eq(nf_ptrmap_count(&m), 5000);
  for (int i = 0; i < 5000; i += 7) {
    ck_assert_int_eq(nf_ptrmap_get(&m, &keys[i], &v), 1);
    ck_assert_uint_eq(v, (uint64_t)i * 3);
  }
  ck_assert_int_eq(nf_ptrmap_put(&m, &keys[10], 1), NF_OK); /* overwrite */
  ck_assert_uint_eq(nf_ptrmap_count(&m), 5000);
  ck_assert_int_eq(nf_ptrmap_get(&m, &keys[10], &v), 1);
  ck_assert_uint_eq(v, 1);
  ck_assert_int_eq(nf_ptrmap_get(&m, &v, NULL), 0); /* never put */
  /* iteration: every key once */
  static unsigned char seen[5000];
  memset(seen, 0, sizeof seen);
  const void *k;
  size_t n = 0;
  for (it = 0; nf_ptrmap_next(&m, &it, &k, &v);) {
    ptrdiff_t i = (const char *)k - keys;
    ck_assert(i >= 0 && i < 5000 && !seen[i]);
    seen[i] = 1;
    n++;
  }
  ck_assert_uint_eq(n, 5000);
  /* clear, then the generation stamp wrapped: nothing left either way */
  nf_ptrmap_clear(&m);
  ck_assert_int_eq(nf_ptrmap_get(&m, &keys[3], NULL), 0);
  ck_assert_int_eq(nf_ptrmap_putp(&m, &keys[3], &keys[4]), NF_OK);
  const void *p = NULL;
  ck_assert_int_eq(nf_ptrmap_getp(&m, &keys[3], &p), 1);
  ck_assert_ptr_eq(p, &keys[4]);
  m.gen = UINT32_MAX;  /* as after 2^32 - 1 clears */
  for (size_t i = 0; i < m.cap; i++)
    if (m.slots[i].key) m.slots[i].gen = UINT32_MAX;
  nf_ptrmap_clear(&m);
  ck_assert_uint_eq(m.gen, 1);
  ck_assert_int_eq(nf_ptrmap_get(&m, &keys[3], NULL), 0);
  for (it = 0; nf_ptrmap_next(&m, &it, NULL, NULL);) ck_abort_msg("an entry after clear");
  nf_ptrmap_free(&m);
  ck_assert_ptr_null(m.slots);
  ck_assert_int_eq(nf_ptrmap_put(&m, &keys[1], 5), NF_OK);
  ck_assert_int_eq(nf_ptrmap_get(&m, &keys[1], &v), 1);
  ck_assert_uint_eq(v, 5);
  nf_ptrmap_free(&m);
  nf_ptrmap *h = nf_ptrmap_new();
  ck_assert_ptr_nonnull(h);
  ck_assert_int_eq(nf_ptrmap_put(h, &keys[2], 7), NF_OK);
  nf_ptrmap_delete(h);
  nf_ptrmap_delete(NULL);
}
END_TEST

START_TEST(ir_dtype_helpers) {
  ck_assert_str_eq(nf_dtype_name(NF_F32), "f32");
  ck_assert_str_eq(nf_dtype_name(NF_BF16), "bf16");
  ck_assert_str_eq(nf_dtype_name(NF_BOOL), "bool");
  ck_assert_ptr_null(nf_dtype_name(NF_N_DTYPES));
  ck_assert_ptr_null(nf_dtype_name((nf_dtype)-1));
  nf_dtype t = NF_BOOL;
  ck_assert_int_eq(nf_dtype_parse("i64", 3, &t), 1);
  ck_assert_int_eq(t, NF_I64);
  ck_assert_int_eq(nf_dtype_parse("f16x", 3, &t), 1);
  ck_assert_int_eq(t, NF_F16);
  ck_assert_int_eq(nf_dtype_parse("f1", 2, &t), 0);
  ck_assert_int_eq(nf_dtype_parse("f32x", 4, &t), 0);
  ck_assert_int_eq(nf_dtype_is_float(NF_BF16), 1);
  ck_assert_int_eq(nf_dtype_is_float(NF_I32), 0);
  ck_assert_int_eq(nf_dtype_is_int(NF_I32), 1);
  ck_assert_int_eq(nf_dtype_is_int(NF_BOOL), 0);
  ck_assert_uint_eq(nf_dtype_size(NF_F16), 2);
  ck_assert_uint_eq(nf_dtype_size(NF_F64), 8);
  ck_assert_uint_eq(nf_dtype_size(NF_BOOL), 1);
  ck_assert_str_eq(nf_op_name(NF_OP_FLOORDIV), "//");
  ck_assert_str_eq(nf_op_name(NF_OP_EXP), "exp");
  ck_assert_str_eq(nf_op_name(NF_OP_SELECT), "select");
  for (int op = 0; op < NF_N_OPS; op++) {
    ck_assert_ptr_nonnull(nf_op_name((nf_op)op));
    ck_assert_str_ne(nf_op_name((nf_op)op), "?");
  }
  ck_assert_int_eq(nf_op_arity(NF_OP_ACCESS), 0);
  ck_assert_int_eq(nf_op_arity(NF_OP_CAST), 1);
  ck_assert_int_eq(nf_op_arity(NF_OP_NOT), 1);
  ck_assert_int_eq(nf_op_arity(NF_OP_OR), 2);
  ck_assert_int_eq(nf_op_arity(NF_OP_POW), 2);
  ck_assert_int_eq(nf_op_arity(NF_OP_SELECT), 3);
}
END_TEST

/* ---- constructors ---- */

START_TEST(ir_hashcons_identity) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  const nf_expr *a1 = B2(c, NF_OP_ADD, i, I(c, 1));
  const nf_expr *a2 = B2(c, NF_OP_ADD, V(c, 0), I(c, 1));
  ck_assert_ptr_eq(a1, a2);
  ck_assert_ptr_ne(a1, B2(c, NF_OP_ADD, I(c, 1), i));
  ck_assert_ptr_ne(a1, B2(c, NF_OP_ADD, j, I(c, 1)));
  ck_assert_ptr_ne(a1, B2(c, NF_OP_SUB, i, I(c, 1)));
  ck_assert_ptr_ne(I(c, 1), nf_e_const_i(c, NF_I32, 1));
  /* floats by bit pattern */
  const nf_expr *z = nf_e_const_f(c, NF_F64, 0.0);
  const nf_expr *nz = nf_e_const_f(c, NF_F64, -0.0);
  ck_assert_ptr_ne(z, nz);
  ck_assert_ptr_eq(z, nf_e_const_f(c, NF_F64, 0.0));
  ck_assert_ptr_eq(nf_e_const_f(c, NF_F64, NAN), nf_e_const_f(c, NF_F64, NAN));
  ck_assert_ptr_ne(nf_e_const_f(c, NF_F64, 1.0), nf_e_const_f(c, NF_F32, 1.0));
  /* accesses by tensor and indices */
  const nf_expr *idx[2] = {i, j}, *idx2[2] = {j, i};
  const nf_expr *x = nf_e_access(c, 3, NF_F32, 2, idx);
  ck_assert_ptr_eq(x, nf_e_access(c, 3, NF_F32, 2, idx));
  ck_assert_ptr_ne(x, nf_e_access(c, 4, NF_F32, 2, idx));
  ck_assert_ptr_ne(x, nf_e_access(c, 3, NF_F32, 2, idx2));
  ck_assert_ptr_ne(x, nf_e_access(c, 3, NF_F64, 2, idx));
  ck_assert_uint_eq(x->u.tensor, 3);
  ck_assert_uint_eq(x->n_args, 2);
  ck_assert_ptr_eq(x->args[1], j);
  /* ids are unique, in creation order */
  ck_assert_uint_lt(i->id, j->id);
  ck_assert_uint_ne(a1->id, i->id);
  /* the table grows past its initial size and keeps identity */
  const nf_expr *keep[5000];
  for (int k = 0; k < 5000; k++) keep[k] = B2(c, NF_OP_MUL, i, I(c, k));
  for (int k = 0; k < 5000; k++)
    ck_assert_ptr_eq(keep[k], B2(c, NF_OP_MUL, i, I(c, k)));
  ck_assert_ptr_eq(a1, B2(c, NF_OP_ADD, i, I(c, 1)));
  ck_assert_int_eq(nf_ir_ctx_oom(c), 0);
  ck_assert_ptr_nonnull(nf_ir_ctx_arena(c));
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_hash_context_independent) {
  nf_ir_ctx *c1 = nf_ir_ctx_new(), *c2 = nf_ir_ctx_new();
  for (int k = 0; k < 100; k++) (void)I(c2, 1000 + k); /* shift ids */
  const nf_expr *e1 = nf_e_select(
      c1, B2(c1, NF_OP_LT, V(c1, 0), I(c1, 3)),
      nf_e_cast(c1, NF_F32, V(c1, 1)), nf_e_const_f(c1, NF_F32, -0.0));
  const nf_expr *e2 = nf_e_select(
      c2, B2(c2, NF_OP_LT, V(c2, 0), I(c2, 3)),
      nf_e_cast(c2, NF_F32, V(c2, 1)), nf_e_const_f(c2, NF_F32, -0.0));
  ck_assert_uint_eq(e1->hash, e2->hash);
  ck_assert_uint_ne(e1->id, e2->id);
  const nf_expr *e3 = nf_e_select(
      c2, B2(c2, NF_OP_LT, V(c2, 0), I(c2, 3)),
      nf_e_cast(c2, NF_F32, V(c2, 1)), nf_e_const_f(c2, NF_F32, 0.0));
  ck_assert_uint_ne(e1->hash, e3->hash);
  ck_assert_uint_ne(B2(c1, NF_OP_SUB, V(c1, 0), V(c1, 1))->hash,
                    B2(c1, NF_OP_SUB, V(c1, 1), V(c1, 0))->hash);
  nf_ir_ctx_free(c1);
  nf_ir_ctx_free(c2);
}
END_TEST

START_TEST(ir_constructor_dtypes) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0);
  const nf_expr *f = nf_e_const_f(c, NF_F32, 1.5);
  const nf_expr *h = nf_e_const_f(c, NF_F16, 1.5);
  const nf_expr *i32 = nf_e_const_i(c, NF_I32, 7);
  const nf_expr *t = nf_e_const_i(c, NF_BOOL, 1);
  ck_assert_int_eq(i->dtype, NF_I64);
  ck_assert_int_eq(i->op, NF_OP_VAR);
  ck_assert_int_eq(B2(c, NF_OP_ADD, i, i)->dtype, NF_I64);
  ck_assert_int_eq(B2(c, NF_OP_MOD, i32, i32)->dtype, NF_I32);
  ck_assert_int_eq(B2(c, NF_OP_DIV, f, f)->dtype, NF_F32);
  ck_assert_int_eq(B2(c, NF_OP_POW, h, h)->dtype, NF_F16);
  ck_assert_int_eq(B2(c, NF_OP_LT, f, f)->dtype, NF_BOOL);
  ck_assert_int_eq(B2(c, NF_OP_EQ, t, t)->dtype, NF_BOOL);
  ck_assert_int_eq(B2(c, NF_OP_AND, t, t)->dtype, NF_BOOL);
  ck_assert_int_eq(nf_e_unary(c, NF_OP_NOT, t)->dtype, NF_BOOL);
  ck_assert_int_eq(nf_e_unary(c, NF_OP_EXP, h)->dtype, NF_F16);
  ck_assert_int_eq(nf_e_unary(c, NF_OP_NEG, i32)->dtype, NF_I32);
  ck_assert_int_eq(nf_e_unary(c, NF_OP_ABS, f)->dtype, NF_F32);
  ck_assert_int_eq(nf_e_unary(c, NF_OP_FLOOR, f)->dtype, NF_F32);
  ck_assert_int_eq(nf_e_cast(c, NF_F64, i)->dtype, NF_F64);
  ck_assert_int_eq(nf_e_cast(c, NF_BOOL, f)->dtype, NF_BOOL);
  ck_assert_int_eq(nf_e_select(c, t, f, f)->dtype, NF_F32);
  ck_assert_int_eq(nf_e_select(c, t, i, i)->dtype, NF_I64);
  const nf_expr *idx[1] = {i};
  const nf_expr *x = nf_e_access(c, 0, NF_BF16, 1, idx);
  ck_assert_int_eq(x->dtype, NF_BF16);
  ck_assert_int_eq(nf_e_access(c, 0, NF_F32, 0, NULL)->n_args, 0);
  /* bool constants are normalised, payloads kept */
  ck_assert_int_eq(nf_e_const_i(c, NF_BOOL, 5)->u.i, 1);
  ck_assert_ptr_eq(nf_e_const_i(c, NF_BOOL, 5), t);
  ck_assert_uint_eq(V(c, 17)->u.var, 17);
  ck_assert_int_eq(I(c, -42)->u.i, -42);
  /* rebuild keeps op, dtype and payload */
  const nf_expr *sub = B2(c, NF_OP_SUB, i, V(c, 1));
  const nf_expr *sw[2] = {V(c, 1), i};
  ck_assert_ptr_eq(nf_e_rebuild(c, sub, sw), B2(c, NF_OP_SUB, V(c, 1), i));
  const nf_expr *ni[1] = {V(c, 2)};
  const nf_expr *x2 = nf_e_rebuild(c, x, ni);
  ck_assert_int_eq(x2->op, NF_OP_ACCESS);
  ck_assert_int_eq(x2->dtype, NF_BF16);
  ck_assert_ptr_eq(x2->args[0], V(c, 2));
  const nf_expr *cs = nf_e_cast(c, NF_I32, i);
  ck_assert_ptr_eq(nf_e_rebuild(c, cs, ni), nf_e_cast(c, NF_I32, V(c, 2)));
  ck_assert_ptr_eq(nf_e_rebuild(c, f, NULL), f);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_constructor_null_args) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0);
  ck_assert_ptr_null(nf_e_unary(c, NF_OP_NEG, NULL));
  ck_assert_ptr_null(nf_e_cast(c, NF_F32, NULL));
  ck_assert_ptr_null(nf_e_binary(c, NF_OP_ADD, i, NULL));
  ck_assert_ptr_null(nf_e_binary(c, NF_OP_ADD, NULL, i));
  ck_assert_ptr_null(nf_e_select(c, NULL, i, i));
  const nf_expr *idx[2] = {i, NULL};
  ck_assert_ptr_null(nf_e_access(c, 0, NF_F32, 2, idx));
  ck_assert_ptr_null(nf_e_rebuild(c, NULL, NULL));
  ck_assert_int_eq(nf_ir_ctx_oom(c), 0);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_const_float_rounding) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  ck_assert(nf_e_const_f(c, NF_F32, 0.1)->u.f == (double)0.1f);
  ck_assert(nf_e_const_f(c, NF_F64, 0.1)->u.f == 0.1);
  ck_assert(nf_e_const_f(c, NF_F16, 0.1)->u.f == 0.0999755859375);
  ck_assert(nf_e_const_f(c, NF_F16, 65519.0)->u.f == 65504.0);
  ck_assert(isinf(nf_e_const_f(c, NF_F16, 65520.0)->u.f));
  ck_assert(nf_e_const_f(c, NF_F16, ldexp(3.0, -26))->u.f == ldexp(1.0, -24));
  ck_assert(nf_e_const_f(c, NF_F16, ldexp(1.0, -25))->u.f == 0.0);
  ck_assert(nf_e_const_f(c, NF_BF16, 1.0 + ldexp(1.0, -8))->u.f == 1.0);
  ck_assert(nf_e_const_f(c, NF_BF16, 1.0 + ldexp(3.0, -8))->u.f ==
            1.0 + ldexp(1.0, -6));
  ck_assert(nf_e_const_f(c, NF_BF16, 3.0)->u.f == 3.0);
  ck_assert(signbit(nf_e_const_f(c, NF_F16, -0.0)->u.f));
  ck_assert(isnan(nf_e_const_f(c, NF_F32, NAN)->u.f));
  nf_ir_ctx_free(c);
}
END_TEST

/* ---- graph summary ---- */

/* nf_graph_summary names the operations, and walks a shared
 * subexpression once: a chain of 40 squarings (2^40 paths) is summarised
 * at once, as the daemon does for every submitted graph. */
START_TEST(ir_graph_summary) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "g");
  int64_t sh[1] = {4};
  int x = nf_graph_add_tensor(g, "x", NF_F32, NF_T_INPUT, 1, sh);
  int y = nf_graph_add_tensor(g, "y", NF_F32, NF_T_OUTPUT, 1, sh);
  const nf_expr *idx[1] = {nf_e_var(c, 0)};
  const nf_expr *e = nf_e_unary(c, NF_OP_EXP, nf_e_access(c, (uint32_t)x, NF_F32, 1, idx));
  for (int k = 0; k < 40; k++) e = nf_e_binary(c, NF_OP_MUL, e, e);
  e = nf_e_binary(c, NF_OP_MAX, e, nf_e_const_f(c, NF_F32, 0));
  nf_stmt st;
  memset(&st, 0, sizeof st);
  st.out = (uint32_t)y;
  st.rhs = e;
  ck_assert_int_eq(nf_graph_add_stmt(g, &st), NF_OK);
  char out[96];
  nf_graph_summary(g, out, sizeof out);
  ck_assert_str_eq(out, "relu+exp, 1 stmt");
  char small[8];
  nf_graph_summary(g, small, sizeof small); /* cut, terminated */
  ck_assert_uint_lt(strlen(small), sizeof small);
  nf_ir_ctx_free(c);
}
END_TEST

/* ---- graph builder ---- */

START_TEST(ir_graph_builder) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "g");
  ck_assert_ptr_nonnull(g);
  ck_assert_str_eq(g->name, "g");
  int64_t sh[2] = {2, 3};
  char name[16];
  for (int k = 0; k < 100; k++) {
    snprintf(name, sizeof(name), "t%d", k);
    int id = nf_graph_add_tensor(g, name, NF_F32,
                                 k % 3 == 0 ? NF_T_INPUT : NF_T_LOCAL, 2, sh);
    ck_assert_int_eq(id, k);
  }
  ck_assert_uint_eq(g->n_tensors, 100);
  ck_assert_uint_eq(g->n_inputs, 34);
  for (uint32_t k = 0; k < g->n_inputs; k++) ck_assert_uint_eq(g->inputs[k], 3 * k);
  ck_assert_str_eq(g->tensors[57].name, "t57");
  ck_assert_int_eq(g->tensors[57].shape[1], 3);
  int out = nf_graph_add_tensor(g, NULL, NF_I64, NF_T_OUTPUT, 0, NULL);
  ck_assert_int_eq(out, 100);
  ck_assert_uint_eq(g->n_outputs, 1);
  ck_assert_uint_eq(g->outputs[0], 100);
  ck_assert_ptr_null(g->tensors[100].name);
  int64_t neg[1] = {-1};
  ck_assert_int_eq(nf_graph_add_tensor(g, "x", NF_F32, NF_T_LOCAL, 1, neg),
                   NF_EINVAL);
  ck_assert_int_eq(nf_graph_add_tensor(g, "x", NF_N_DTYPES, NF_T_LOCAL, 0, NULL),
                   NF_EINVAL);
  ck_assert_int_eq(nf_graph_add_tensor(g, "x", NF_F32, NF_T_LOCAL, 9, sh),
                   NF_EINVAL);
  ck_assert_int_eq(nf_graph_add_tensor(g, "x", NF_F32, (nf_tkind)3, 0, NULL),
                   NF_EINVAL);
  ck_assert_int_eq(nf_graph_add_stmt(g, NULL), NF_EINVAL);
  for (int k = 0; k < 20; k++) {
    char vn[8];
    snprintf(vn, sizeof(vn), "v%d", k);
    nf_stmt s = {.out = (uint32_t)k, .rhs = I(c, k)};
    s.var_names[0] = vn;
    ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  }
  ck_assert_uint_eq(g->n_stmts, 20);
  ck_assert_ptr_eq(g->stmts[13].rhs, I(c, 13));
  ck_assert_str_eq(g->stmts[13].var_names[0], "v13"); /* copied */
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_tensor_numel) {
  nf_tensor t = {.rank = 3, .shape = {2, 3, 4}};
  ck_assert_int_eq(nf_tensor_numel(&t), 24);
  t.rank = 0;
  ck_assert_int_eq(nf_tensor_numel(&t), 1);
  nf_tensor z = {.rank = 2, .shape = {0, INT64_MAX}};
  ck_assert_int_eq(nf_tensor_numel(&z), 0);
  nf_tensor o = {.rank = 2, .shape = {INT64_C(1) << 32, INT64_C(1) << 31}};
  ck_assert_int_eq(nf_tensor_numel(&o), -1);
  o.shape[1] = (INT64_C(1) << 31) - 1;
  ck_assert_int_eq(nf_tensor_numel(&o), INT64_MAX - (INT64_C(1) << 32) + 1);
  nf_tensor n = {.rank = 1, .shape = {-2}};
  ck_assert_int_eq(nf_tensor_numel(&n), -1);
}
END_TEST

/* ---- a sample graph and its variants ---- */

typedef struct gopt {
  int64_t m;     /* rows of A, C, D */
  nf_dtype dt;   /* float dtype of every tensor */
  nf_redop red;  /* reduction of C */
  int64_t lo, ext; /* reduction range */
  double k;      /* constant in D */
  int swap_sub;  /* K - C instead of C - K */
  int rename;    /* other tensor and variable names */
  int junk;      /* create unrelated nodes first (ids differ) */
  int swap_inputs;
  uint32_t flags;
  int transpose; /* A(k, i) instead of A(i, k) (A is then [3, M]) */
  int permute;   /* create the tensors in the order D, C, A, B */
} gopt;

static gopt base_opt(void) {
  gopt o = {.m = 4, .dt = NF_F32, .red = NF_RED_SUM, .lo = 0, .ext = 3,
            .k = 2.0};
  return o;
}

/* A: in [M, 3], B: in [3, 5], C: local [M, 5] = red_k A(i, k) * B(k, j),
 * D: out [M, 5] = i < 2 ? C(i, j) - K : C(i, j). */
static nf_graph *build(nf_ir_ctx *c, const gopt *o) {
  if (o->junk)
    for (int k = 0; k < 50; k++) (void)B2(c, NF_OP_MUL, V(c, 7), I(c, k));
  nf_graph *g = nf_graph_new(c, o->rename ? "other" : "mm");
  int64_t sa[2] = {o->m, 3}, sat[2] = {3, o->m}, sb[2] = {3, 5},
          sc[2] = {o->m, 5};
  int A, B, C = -1, D = -1;
  if (o->permute) {
    D = nf_graph_add_tensor(g, "D", o->dt, NF_T_OUTPUT, 2, sc);
    C = nf_graph_add_tensor(g, "C", o->dt, NF_T_LOCAL, 2, sc);
  }
  A = nf_graph_add_tensor(g, o->rename ? "P" : "A", o->dt, NF_T_INPUT, 2,
                          o->transpose ? sat : sa);
  B = nf_graph_add_tensor(g, o->rename ? "Q" : "B", o->dt, NF_T_INPUT, 2, sb);
  if (!o->permute) {
    C = nf_graph_add_tensor(g, o->rename ? "R" : "C", o->dt, NF_T_LOCAL, 2,
                            sc);
    D = nf_graph_add_tensor(g, o->rename ? "S" : "D", o->dt, NF_T_OUTPUT, 2,
                            sc);
    ck_assert_int_eq(A, 0);
    ck_assert_int_eq(D, 3);
  } else {
    ck_assert_int_eq(A, 2);
    ck_assert_int_eq(B, 3);
    ck_assert_int_eq(D, 0);
  }
  const nf_expr *i = V(c, 0), *j = V(c, 1), *k = V(c, 2);
  const nf_expr *ia[2] = {o->transpose ? k : i, o->transpose ? i : k};
  const nf_expr *ib[2] = {k, j}, *ic[2] = {i, j};
  nf_stmt s1 = {.out = (uint32_t)C, .red = (uint8_t)o->red, .n_red = 1,
                .flags = o->flags};
  s1.red_lo[0] = o->lo;
  s1.red_ext[0] = o->ext;
  s1.rhs = B2(c, NF_OP_MUL, nf_e_access(c, (uint32_t)A, o->dt, 2, ia),
              nf_e_access(c, (uint32_t)B, o->dt, 2, ib));
  s1.var_names[0] = o->rename ? "x" : "i";
  s1.var_names[1] = o->rename ? "y" : "j";
  s1.var_names[2] = o->rename ? "z" : "k";
  ck_assert_int_eq(nf_graph_add_stmt(g, &s1), NF_OK);
  const nf_expr *cij = nf_e_access(c, (uint32_t)C, o->dt, 2, ic);
  const nf_expr *K = nf_e_const_f(c, o->dt, o->k);
  nf_stmt s2 = {.out = (uint32_t)D};
  s2.rhs = nf_e_select(c, B2(c, NF_OP_LT, i, I(c, 2)),
                       o->swap_sub ? B2(c, NF_OP_SUB, K, cij)
                                   : B2(c, NF_OP_SUB, cij, K),
                       cij);
  if (o->rename) s2.var_names[0] = "row";
  ck_assert_int_eq(nf_graph_add_stmt(g, &s2), NF_OK);
  if (o->swap_inputs) {
    uint32_t t = g->inputs[0];
    g->inputs[0] = g->inputs[1];
    g->inputs[1] = t;
  }
  return g;
}

static void hash_of(const gopt *o, uint8_t d[32]) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = build(c, o);
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_graph_validate(g, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_buf_free(&err);
  ck_assert_int_eq(nf_graph_hash(g, d), NF_OK);
  nf_ir_ctx_free(c);
}

START_TEST(ir_encode_invariance) {
  gopt o = base_opt();
  uint8_t h0[32], h1[32], h2[32];
  hash_of(&o, h0);
  o.rename = 1;
  hash_of(&o, h1);
  ck_assert_mem_eq(h0, h1, 32);
  o = base_opt();
  o.junk = 1;
  hash_of(&o, h2);
  ck_assert_mem_eq(h0, h2, 32);
  /* tensor ids are not structure: another creation order, same hash */
  o = base_opt();
  o.permute = 1;
  hash_of(&o, h2);
  ck_assert_mem_eq(h0, h2, 32);

  /* byte-identical encodings from two contexts */
  nf_ir_ctx *c1 = nf_ir_ctx_new(), *c2 = nf_ir_ctx_new();
  gopt a = base_opt(), b = base_opt();
  b.junk = 1;
  b.rename = 1;
  nf_buf e1 = NF_BUF_INIT, e2 = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_encode(build(c1, &a), &e1), NF_OK);
  ck_assert_int_eq(nf_graph_encode(build(c2, &b), &e2), NF_OK);
  ck_assert_uint_eq(e1.len, e2.len);
  ck_assert_mem_eq(e1.data, e2.data, e1.len);
  ck_assert_mem_eq(e1.data, "NFG\x01", 4);
  /* names never appear */
  ck_assert_ptr_null(memmem(e1.data, e1.len, "mm", 2));
  nf_buf_free(&e1);
  nf_buf_free(&e2);
  nf_ir_ctx_free(c1);
  nf_ir_ctx_free(c2);
}
END_TEST

START_TEST(ir_encode_sensitivity) {
  enum { NV = 11 };
  uint8_t h[NV][32];
  for (int v = 0; v < NV; v++) {
    gopt o = base_opt();
    switch (v) {
    case 0: break;
    case 1: o.m = 6; break;            /* a shape */
    case 2: o.dt = NF_F64; break;      /* a dtype */
    case 3: o.red = NF_RED_MAX; break; /* a reduction op */
    case 4: o.lo = 1; o.ext = 2; break; /* a range */
    case 5: o.k = 3.0; break;          /* a constant */
    case 6: o.swap_sub = 1; break;     /* operands of a non-commutative op */
    case 7: o.swap_inputs = 1; break;  /* input order */
    case 8: o.flags = NF_STMT_SCATTER; break;
    case 9: o.transpose = 1; o.m = 3; break; /* variables, not shape */
    case 10: o.k = -0.0; break;
    }
    hash_of(&o, h[v]);
  }
  for (int a = 0; a < NV; a++)
    for (int b = a + 1; b < NV; b++)
      ck_assert_msg(memcmp(h[a], h[b], 32) != 0, "variants %d and %d collide",
                    a, b);
  /* k = 0.0 and k = -0.0 differ */
  gopt o = base_opt();
  uint8_t hz[32];
  o.k = 0.0;
  hash_of(&o, hz);
  ck_assert(memcmp(hz, h[10], 32) != 0);
}
END_TEST

START_TEST(ir_hash_hex) {
  uint8_t d[32];
  for (int k = 0; k < 32; k++) d[k] = (uint8_t)(k * 8 + 7);
  char hex[65];
  nf_hash_hex(d, hex);
  ck_assert_str_eq(hex, "070f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff");
  /* the hash is the SHA-256 of the encoding: a graph with nothing in it */
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, NULL);
  nf_buf e = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_encode(g, &e), NF_OK);
  ck_assert_uint_eq(e.len, 8);
  ck_assert_mem_eq(e.data, "NFG\x01\x00\x00\x00\x00", 8);
  uint8_t h[32];
  ck_assert_int_eq(nf_graph_hash(g, h), NF_OK);
  nf_hash_hex(h, hex);
  /* sha256 of "NFG\1\0\0\0\0" */
  ck_assert_str_eq(hex, "603ca4c524c85ddeefeffafa05cfdb4c24d3346d3c49db5e5739988654519df2");
  nf_buf_free(&e);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_encode_dag_backrefs) {
  /* A shared subexpression is encoded once: x + x with a big x costs
   * about one x, not two. */
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *x = V(c, 0);
  for (int k = 0; k < 40; k++) x = B2(c, NF_OP_ADD, x, x); /* 2^40 paths */
  nf_graph *g = nf_graph_new(c, "dag");
  int t = nf_graph_add_tensor(g, "o", NF_I64, NF_T_OUTPUT, 1,
                              (int64_t[]){4});
  nf_stmt s = {.out = (uint32_t)t, .rhs = x};
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK);
  nf_buf e = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_encode(g, &e), NF_OK);
  ck_assert_uint_lt(e.len, 300);
  nf_buf_free(&e);
  nf_ir_ctx_free(c);
}
END_TEST

/* ---- validation ---- */

typedef void (*mutator)(nf_graph *g, nf_ir_ctx *c);

static const nf_expr *cij(nf_ir_ctx *c, nf_dtype t) {
  const nf_expr *ic[2] = {V(c, 0), V(c, 1)};
  return nf_e_access(c, 2, t, 2, ic);
}

static void m_dtype(nf_graph *g, nf_ir_ctx *c) { (void)c; g->tensors[0].dtype = 99; }
static void m_kind(nf_graph *g, nf_ir_ctx *c) { (void)c; g->tensors[1].kind = 7; }
static void m_rank(nf_graph *g, nf_ir_ctx *c) { (void)c; g->tensors[0].rank = 9; }
static void m_negdim(nf_graph *g, nf_ir_ctx *c) { (void)c; g->tensors[1].shape[0] = -1; }
static void m_numel(nf_graph *g, nf_ir_ctx *c) {
  (void)c;
  g->tensors[2].shape[0] = INT64_C(1) << 40;
  g->tensors[2].shape[1] = INT64_C(1) << 40;
}
static void m_in_range(nf_graph *g, nf_ir_ctx *c) { (void)c; g->inputs[1] = 17; }
static void m_in_twice(nf_graph *g, nf_ir_ctx *c) { (void)c; g->inputs[1] = 0; }
static void m_in_kind(nf_graph *g, nf_ir_ctx *c) { (void)c; g->inputs[1] = 2; }
static void m_out_missing(nf_graph *g, nf_ir_ctx *c) { (void)c; g->n_outputs = 0; }
static void m_out_kind(nf_graph *g, nf_ir_ctx *c) { (void)c; g->outputs[0] = 2; }
static void m_in_missing(nf_graph *g, nf_ir_ctx *c) { (void)c; g->n_inputs = 1; }
static void m_st_out(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].out = 42; }
static void m_st_input(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].out = 0; }
static void m_twice(nf_graph *g, nf_ir_ctx *c) {
  (void)c;
  g->stmts[1].out = 2;
  g->stmts[1].rhs = g->stmts[0].rhs;
  g->stmts[1].red = g->stmts[0].red;
  g->stmts[1].n_red = 1;
  g->stmts[1].red_ext[0] = 3;
}
static void m_never(nf_graph *g, nf_ir_ctx *c) { (void)c; g->n_stmts = 1; }
static void m_order(nf_graph *g, nf_ir_ctx *c) {
  (void)c;
  nf_stmt t = g->stmts[0];
  g->stmts[0] = g->stmts[1];
  g->stmts[1] = t;
}
static void m_self(nf_graph *g, nf_ir_ctx *c) {
  g->stmts[0].rhs = B2(c, NF_OP_ADD, g->stmts[0].rhs, cij(c, NF_F32));
}
static void m_arity(nf_graph *g, nf_ir_ctx *c) {
  const nf_expr *ix[1] = {V(c, 0)};
  g->stmts[0].rhs = nf_e_access(c, 0, NF_F32, 1, ix);
}
static void m_acc_dtype(nf_graph *g, nf_ir_ctx *c) {
  const nf_expr *ix[2] = {V(c, 0), V(c, 2)};
  g->stmts[0].rhs = nf_e_cast(c, NF_F32, nf_e_access(c, 0, NF_F64, 2, ix));
}
static void m_acc_unknown(nf_graph *g, nf_ir_ctx *c) {
  g->stmts[0].rhs = nf_e_access(c, 9, NF_F32, 0, NULL);
}
static void m_var(nf_graph *g, nf_ir_ctx *c) {
  const nf_expr *ix[2] = {V(c, 0), V(c, 5)};
  g->stmts[1].rhs = nf_e_access(c, 2, NF_F32, 2, ix);
}
static void m_var_red(nf_graph *g, nf_ir_ctx *c) {
  /* variable 2 exists in statement 0 (a reduction) but not in 1 */
  const nf_expr *ix[2] = {V(c, 0), V(c, 2)};
  g->stmts[1].rhs = nf_e_access(c, 2, NF_F32, 2, ix);
}
static void m_nred(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].n_red = 23; }
static void m_ext(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].red_ext[0] = -1; }
static void m_lo(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].red_lo[0] = INT64_MAX - 1; }
static void m_rhs_dtype(nf_graph *g, nf_ir_ctx *c) { g->stmts[1].rhs = I(c, 1); }
static void m_rhs_null(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[1].rhs = NULL; }
static void m_redop(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].red = 9; }
static void m_red_none(nf_graph *g, nf_ir_ctx *c) { (void)c; g->stmts[0].red = NF_RED_NONE; }
static void m_null_arr(nf_graph *g, nf_ir_ctx *c) { (void)c; g->tensors = NULL; }
static void m_f_op(nf_graph *g, nf_ir_ctx *c) {
  (void)c;
  nf_expr *e = forge(200, NF_F32, 0);
  g->stmts[1].rhs = e;
}
static void m_f_nargs(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *e = forge(NF_OP_NEG, NF_F32, 2);
  e->args[0] = e->args[1] = cij(c, NF_F32);
  g->stmts[1].rhs = e;
}
static void m_f_types(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *e = forge(NF_OP_ADD, NF_F32, 2);
  e->args[0] = V(c, 0);
  e->args[1] = cij(c, NF_F32);
  g->stmts[1].rhs = e;
}
static void m_f_result(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *e = forge(NF_OP_LT, NF_F32, 2);
  e->args[0] = e->args[1] = cij(c, NF_F32);
  g->stmts[1].rhs = e;
}
static void m_f_bool(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *b = forge(NF_OP_CONST, NF_BOOL, 0);
  b->u.i = 5;
  g->stmts[1].rhs = nf_e_select(c, b, cij(c, NF_F32), cij(c, NF_F32));
}
static void m_f_i32(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *b = forge(NF_OP_CONST, NF_I32, 0);
  b->u.i = INT64_C(1) << 40;
  g->stmts[1].rhs = nf_e_cast(c, NF_F32, b);
}
static void m_f_null(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *e = forge(NF_OP_EXP, NF_F32, 1);
  (void)c;
  g->stmts[1].rhs = e;
}
static void m_f_argdtype(nf_graph *g, nf_ir_ctx *c) {
  nf_expr *bad = forge(NF_OP_CONST, 77, 0);
  nf_expr *e = forge(NF_OP_ADD, NF_F32, 2);
  e->args[0] = cij(c, NF_F32);
  e->args[1] = bad;
  g->stmts[1].rhs = e;
}
static void m_f_rhsdtype(nf_graph *g, nf_ir_ctx *c) {
  (void)c;
  g->stmts[1].rhs = forge(NF_OP_CONST, 77, 0);
}

static const struct vcase {
  const char *name;
  mutator fn;
  const char *msg;
} vcases[] = {
    {"dtype", m_dtype, "tensor 0 (A): invalid dtype 99"},
    {"kind", m_kind, "tensor 1 (B): invalid kind 7"},
    {"rank", m_rank, "rank 9 exceeds 8"},
    {"negdim", m_negdim, "negative dimension -1"},
    {"numel", m_numel, "element count overflows"},
    {"input range", m_in_range, "input 1: tensor id 17 out of range"},
    {"input twice", m_in_twice, "listed twice"},
    {"input kind", m_in_kind, "tensor 2 (C) is not an input tensor"},
    {"input missing", m_in_missing, "tensor 1 (B): input tensor missing"},
    {"output missing", m_out_missing, "output tensor missing from the outputs"},
    {"output kind", m_out_kind, "is not an output tensor"},
    {"stmt out range", m_st_out, "statement 0: output tensor 42 out of range"},
    {"stmt writes input", m_st_input, "statement 0: writes input tensor 0 (A)"},
    {"produced twice", m_twice, "statement 1: tensor 2 (C) is produced twice"},
    {"never produced", m_never, "tensor 3 (D) is never produced"},
    {"order", m_order, "statement 0: reads tensor 2 (C) before it is produced"},
    {"self read", m_self, "statement 0: reads tensor 2 (C) before it is produced"},
    {"access arity", m_arity, "has 1 indices, rank is 2"},
    {"access dtype", m_acc_dtype, "has dtype f64, tensor is f32"},
    {"access unknown", m_acc_unknown, "access of unknown tensor 9"},
    {"var range", m_var, "statement 1: variable 5 out of range"},
    {"var red", m_var_red, "statement 1: variable 2 out of range"},
    {"n_red", m_nred, "23 reduction variables"},
    {"extent", m_ext, "negative extent -1"},
    {"range overflow", m_lo, "range overflows"},
    {"rhs dtype", m_rhs_dtype, "right side has dtype i64, tensor 3 (D) is f32"},
    {"rhs null", m_rhs_null, "no right-hand side"},
    {"red op", m_redop, "invalid reduction operator 9"},
    {"red none", m_red_none, "without a reduction operator"},
    {"null array", m_null_arr, "count without its array"},
    {"forged op", m_f_op, "invalid operator 200"},
    {"forged arity", m_f_nargs, "has 2 arguments, expected 1"},
    {"forged types", m_f_types, "operands have different dtypes"},
    {"forged result", m_f_result, "has dtype f32, expected bool"},
    {"forged bool", m_f_bool, "bool constant 5"},
    {"forged i32", m_f_i32, "i32 constant 1099511627776 out of range"},
    {"forged null", m_f_null, "NULL argument"},
    {"forged arg dtype", m_f_argdtype, "argument has an invalid dtype"},
    {"forged rhs dtype", m_f_rhsdtype, "right side has dtype invalid"},
};

START_TEST(ir_validate_rejects) {
  const struct vcase *vc = &vcases[_i];
  nf_ir_ctx *c = nf_ir_ctx_new();
  gopt o = base_opt();
  nf_graph *g = build(c, &o);
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_validate(g, &err), NF_OK);
  ck_assert_uint_eq(err.len, 0);
  vc->fn(g, c);
  int rc = nf_graph_validate(g, &err);
  ck_assert_msg(rc == NF_EINVAL, "%s: rc %d", vc->name, rc);
  ck_assert_msg(strstr(nf_buf_str(&err), vc->msg) != NULL,
                "%s: message '%s' lacks '%s'", vc->name, nf_buf_str(&err),
                vc->msg);
  /* NULL err is fine too, and encoding never crashes */
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_EINVAL);
  nf_buf e = NF_BUF_INIT;
  (void)nf_graph_encode(g, &e);
  nf_buf_free(&e);
  nf_buf_free(&err);
  free_forged();
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_validate_null_graph) {
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_validate(NULL, &err), NF_EINVAL);
  ck_assert_str_eq(nf_buf_str(&err), "no graph");
  nf_buf_free(&err);
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, NULL);
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK); /* empty is valid */
  nf_ir_ctx_free(c);
}
END_TEST

/* Random mutations of every field (pointers stay valid, counts only
 * shrink): validation and encoding must return, never crash. */
START_TEST(ir_validate_random_mutations) {
  rng_state = 0x1234567887654321ull;
  int n_ok = 0, n_bad = 0;
  for (int it = 0; it < 3000; it++) {
    nf_ir_ctx *c = nf_ir_ctx_new();
    gopt o = base_opt();
    nf_graph *g = build(c, &o);
    const nf_expr *pool[] = {
        g->stmts[0].rhs, g->stmts[1].rhs, cij(c, NF_F32), V(c, 30),
        nf_e_access(c, 3, NF_F32, 0, NULL), I(c, 3),
        nf_e_const_f(c, NF_F32, 1.0), nf_e_access(c, 1, NF_F32, 2,
                                                  (const nf_expr *[]){V(c, 0), V(c, 1)})};
    int n_mut = 1 + rndi(3);
    for (int m = 0; m < n_mut; m++) {
      uint32_t t = (uint32_t)rndi(4), s = (uint32_t)rndi(2);
      int64_t big[] = {0, 1, -1, 5, INT64_MAX, INT64_MIN, INT64_C(1) << 33};
      switch (rndi(16)) {
      case 0: g->tensors[t].dtype = (uint8_t)rnd(); break;
      case 1: g->tensors[t].kind = (uint8_t)rndi(5); break;
      case 2: g->tensors[t].rank = (uint8_t)rndi(12); break;
      case 3: g->tensors[t].shape[rndi(8)] = big[rndi(7)]; break;
      case 4: g->inputs[rndi(2)] = (uint32_t)rndi(6); break;
      case 5: g->outputs[0] = (uint32_t)rndi(6); break;
      case 6: g->n_inputs = (uint32_t)rndi(3); break;
      case 7: g->n_stmts = (uint32_t)rndi(3); break;
      case 8: g->stmts[s].out = (uint32_t)rndi(6); break;
      case 9: g->stmts[s].red = (uint8_t)rndi(7); break;
      case 10: g->stmts[s].n_red = (uint8_t)rndi(30); break;
      case 11: g->stmts[s].red_lo[rndi(3)] = big[rndi(7)]; break;
      case 12: g->stmts[s].red_ext[rndi(3)] = big[rndi(7)]; break;
      case 13: g->stmts[s].rhs = pool[rndi(8)]; break;
      case 14: g->n_outputs = (uint32_t)rndi(2); break;
      default: g->stmts[s].flags = (uint32_t)rnd(); break;
      }
    }
    nf_buf err = NF_BUF_INIT;
    int rc = nf_graph_validate(g, &err);
    ck_assert(rc == NF_OK || rc == NF_EINVAL);
    if (rc) {
      ck_assert_uint_gt(err.len, 0);
      n_bad++;
    } else {
      n_ok++;
    }
    nf_buf e = NF_BUF_INIT;
    rc = nf_graph_encode(g, &e);
    ck_assert(rc == NF_OK || rc == NF_EINVAL);
    nf_buf_free(&e);
    nf_buf_free(&err);
    nf_ir_ctx_free(c);
  }
  ck_assert_int_gt(n_bad, 1000);
  ck_assert_int_gt(n_ok, 10); /* harmless mutations (flags, ...) pass */
}
END_TEST

/* ---- affine forms ---- */

static void check_affine(const nf_expr *e, int n, const uint32_t *vars,
                         const int64_t *coefs, int64_t cst) {
  nf_affine a;
  ck_assert_int_eq(nf_expr_affine(e, &a), 1);
  ck_assert_int_eq(a.n, n);
  for (int k = 0; k < n; k++) {
    ck_assert_uint_eq(a.var[k], vars[k]);
    ck_assert_int_eq(a.coef[k], coefs[k]);
  }
  ck_assert_int_eq(a.c, cst);
}

START_TEST(ir_affine_forms) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1), *k = V(c, 5);
  check_affine(i, 1, (uint32_t[]){0}, (int64_t[]){1}, 0);
  check_affine(I(c, -7), 0, NULL, NULL, -7);
  check_affine(B2(c, NF_OP_SUB, B2(c, NF_OP_ADD, i, I(c, 1)), I(c, 1)), 1,
               (uint32_t[]){0}, (int64_t[]){1}, 0);
  check_affine(B2(c, NF_OP_ADD, B2(c, NF_OP_MUL, I(c, 2), i), i), 1,
               (uint32_t[]){0}, (int64_t[]){3}, 0);
  /* 3 * (k - 2 * j) + 7 - i: variables sorted */
  const nf_expr *e = B2(c, NF_OP_SUB,
                        B2(c, NF_OP_ADD,
                           B2(c, NF_OP_MUL, I(c, 3),
                              B2(c, NF_OP_SUB, k, B2(c, NF_OP_MUL, j, I(c, 2)))),
                           I(c, 7)),
                        i);
  check_affine(e, 3, (uint32_t[]){0, 1, 5}, (int64_t[]){-1, -6, 3}, 7);
  /* zero coefficients vanish; constant products are constants */
  check_affine(B2(c, NF_OP_ADD, nf_e_unary(c, NF_OP_NEG, j),
                  B2(c, NF_OP_MUL, i, I(c, 0))),
               1, (uint32_t[]){1}, (int64_t[]){-1}, 0);
  check_affine(B2(c, NF_OP_MUL, B2(c, NF_OP_ADD, I(c, 2), I(c, 3)), i), 1,
               (uint32_t[]){0}, (int64_t[]){5}, 0);
  check_affine(B2(c, NF_OP_SUB, i, i), 0, NULL, NULL, 0);
  /* not affine */
  nf_affine a;
  ck_assert_int_eq(nf_expr_affine(B2(c, NF_OP_MUL, i, j), &a), 0);
  ck_assert_int_eq(nf_expr_affine(B2(c, NF_OP_FLOORDIV, i, I(c, 2)), &a), 0);
  ck_assert_int_eq(nf_expr_affine(nf_e_const_i(c, NF_I32, 3), &a), 0);
  ck_assert_int_eq(nf_expr_affine(nf_e_access(c, 0, NF_I64, 1, &i), &a), 0);
  ck_assert_int_eq(
      nf_expr_affine(B2(c, NF_OP_ADD, i, nf_e_access(c, 0, NF_I64, 1, &i)), &a),
      0);
  ck_assert_int_eq(nf_expr_affine(nf_e_const_f(c, NF_F64, 1.0), &a), 0);
  /* more variables than a form holds */
  const nf_expr *sum = V(c, 0);
  for (uint32_t v = 1; v <= NF_MAX_VARS; v++) sum = B2(c, NF_OP_ADD, sum, V(c, v));
  ck_assert_int_eq(nf_expr_affine(sum, &a), 0);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_affine_overflow) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0);
  nf_affine a;
  ck_assert_int_eq(
      nf_expr_affine(B2(c, NF_OP_MUL, B2(c, NF_OP_MUL, i, I(c, INT64_MAX)),
                        I(c, 2)),
                     &a),
      NF_EOVERFLOW);
  ck_assert_int_eq(nf_expr_affine(B2(c, NF_OP_ADD, I(c, INT64_MAX), I(c, 1)), &a),
                   NF_EOVERFLOW);
  ck_assert_int_eq(nf_expr_affine(nf_e_unary(c, NF_OP_NEG, I(c, INT64_MIN)), &a),
                   NF_EOVERFLOW);
  ck_assert_int_eq(
      nf_expr_affine(B2(c, NF_OP_SUB, I(c, 0), B2(c, NF_OP_MUL, i, I(c, INT64_MIN))),
                     &a),
      NF_EOVERFLOW);
  /* a DAG doubling 62 times fits, 63 times overflows (memoised: fast) */
  const nf_expr *x = i;
  for (int k = 0; k < 62; k++) x = B2(c, NF_OP_ADD, x, x);
  check_affine(x, 1, (uint32_t[]){0}, (int64_t[]){INT64_C(1) << 62}, 0);
  ck_assert_int_eq(nf_expr_affine(B2(c, NF_OP_ADD, x, x), &a), NF_EOVERFLOW);
  /* INT64_MIN coefficient is fine when reached without overflow */
  check_affine(B2(c, NF_OP_MUL, i, I(c, INT64_MIN)), 1, (uint32_t[]){0},
               (int64_t[]){INT64_MIN}, 0);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_affine_expr_canonical) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  /* two spellings of 2i - j + 3 give one canonical node */
  const nf_expr *e1 = B2(c, NF_OP_ADD, B2(c, NF_OP_SUB, B2(c, NF_OP_ADD, i, i), j),
                         I(c, 3));
  const nf_expr *e2 = B2(c, NF_OP_SUB, B2(c, NF_OP_ADD, I(c, 3),
                                          B2(c, NF_OP_MUL, I(c, 2), i)), j);
  nf_affine a1, a2;
  ck_assert_int_eq(nf_expr_affine(e1, &a1), 1);
  ck_assert_int_eq(nf_expr_affine(e2, &a2), 1);
  const nf_expr *c1 = nf_affine_expr(c, &a1), *c2 = nf_affine_expr(c, &a2);
  ck_assert_ptr_eq(c1, c2);
  /* the documented shape: (i * 2 - j) + 3 */
  ck_assert_ptr_eq(c1, B2(c, NF_OP_ADD,
                          B2(c, NF_OP_SUB, B2(c, NF_OP_MUL, i, I(c, 2)), j),
                          I(c, 3)));
  /* round trip on assorted forms */
  rng_state = 99;
  for (int it = 0; it < 500; it++) {
    nf_affine f = {0};
    for (uint32_t v = 0; v < 6; v++)
      if (rndi(2)) {
        int64_t cf = rndi(2) ? (int64_t)rndi(9) - 4 : (int64_t)(rnd() >> 2);
        if (it % 50 == 0) cf = INT64_MIN;
        if (cf == 0) continue;
        f.var[f.n] = v * 3;
        f.coef[f.n++] = cf;
      }
    f.c = rndi(3) == 0 ? 0 : (int64_t)rnd();
    const nf_expr *e = nf_affine_expr(c, &f);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->dtype, NF_I64);
    nf_affine g;
    ck_assert_int_eq(nf_expr_affine(e, &g), 1);
    ck_assert_int_eq(g.n, f.n);
    ck_assert_int_eq(g.c, f.c);
    for (int k = 0; k < f.n; k++) {
      ck_assert_uint_eq(g.var[k], f.var[k]);
      ck_assert_int_eq(g.coef[k], f.coef[k]);
    }
    ck_assert_ptr_eq(nf_affine_expr(c, &g), e);
  }
  nf_affine z = {0};
  ck_assert_ptr_eq(nf_affine_expr(c, &z), I(c, 0));
  nf_ir_ctx_free(c);
}
END_TEST

/* ---- a reference evaluator and random integer expressions ---- */

typedef struct val {
  int ok;
  int64_t v;
} val;

static int64_t py_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) q--;
  return q;
}

static int64_t py_mod(int64_t a, int64_t b) { return a - b * py_div(a, b); }

static val fail_v(void) {
  val r = {0, 0};
  return r;
}

static val ok_v(nf_dtype t, int64_t v) {
  val r = {1, v};
  if (t == NF_I32 && (v < INT32_MIN || v > INT32_MAX)) r.ok = 0;
  return r;
}

/* Evaluates an integer/bool expression; ok = 0 on division by zero or
 * overflow (the cases the interpreter reports or wraps). */
static val ev(const nf_expr *e, const int64_t *vars) {
  nf_dtype t = (nf_dtype)e->dtype;
  int64_t r;
  if (e->op == NF_OP_CONST) return ok_v(t, e->u.i);
  if (e->op == NF_OP_VAR) return ok_v(t, vars[e->u.var]);
  if (e->op == NF_OP_SELECT) {
    val cnd = ev(e->args[0], vars);
    if (!cnd.ok) return cnd;
    return ev(e->args[cnd.v ? 1 : 2], vars);
  }
  val a = ev(e->args[0], vars);
  if (!a.ok) return a;
  val b = {1, 0};
  if (e->n_args > 1) {
    b = ev(e->args[1], vars);
    if (!b.ok) return b;
  }
  switch (e->op) {
  case NF_OP_NEG:
    return __builtin_sub_overflow((int64_t)0, a.v, &r) ? fail_v() : ok_v(t, r);
  case NF_OP_ABS:
    if (a.v >= 0) return ok_v(t, a.v);
    return __builtin_sub_overflow((int64_t)0, a.v, &r) ? fail_v() : ok_v(t, r);
  case NF_OP_NOT: return ok_v(t, !a.v);
  case NF_OP_CAST: return ok_v(t, t == NF_BOOL ? a.v != 0 : a.v);
  case NF_OP_ADD:
    return __builtin_add_overflow(a.v, b.v, &r) ? fail_v() : ok_v(t, r);
  case NF_OP_SUB:
    return __builtin_sub_overflow(a.v, b.v, &r) ? fail_v() : ok_v(t, r);
  case NF_OP_MUL:
    return __builtin_mul_overflow(a.v, b.v, &r) ? fail_v() : ok_v(t, r);
  case NF_OP_FLOORDIV:
    if (b.v == 0 || (a.v == INT64_MIN && b.v == -1)) return fail_v();
    return ok_v(t, py_div(a.v, b.v));
  case NF_OP_MOD:
    if (b.v == 0) return fail_v();
    return ok_v(t, b.v == -1 ? 0 : py_mod(a.v, b.v));
  case NF_OP_MIN: return ok_v(t, a.v < b.v ? a.v : b.v);
  case NF_OP_MAX: return ok_v(t, a.v > b.v ? a.v : b.v);
  case NF_OP_LT: return ok_v(t, a.v < b.v);
  case NF_OP_LE: return ok_v(t, a.v <= b.v);
  case NF_OP_GT: return ok_v(t, a.v > b.v);
  case NF_OP_GE: return ok_v(t, a.v >= b.v);
  case NF_OP_EQ: return ok_v(t, a.v == b.v);
  case NF_OP_NE: return ok_v(t, a.v != b.v);
  case NF_OP_AND: return ok_v(t, a.v && b.v);
  case NF_OP_OR: return ok_v(t, a.v || b.v);
  default: ck_abort_msg("evaluator: unexpected op %d", e->op); return fail_v();
  }
}

#define N_TVARS 3

/* A random expression of dtype t (i64, i32 or bool) over N_TVARS
 * variables, biased towards affine index arithmetic. */
static const nf_expr *gen(nf_ir_ctx *c, nf_dtype t, int depth) {
  if (t == NF_BOOL) {
    int k = depth <= 0 ? 0 : rndi(8);
    if (k == 0) return nf_e_const_i(c, NF_BOOL, rndi(2));
    if (k <= 4) {
      static const nf_op cmps[] = {NF_OP_LT, NF_OP_LE, NF_OP_GT,
                                   NF_OP_GE, NF_OP_EQ, NF_OP_NE};
      nf_dtype ot = rndi(4) ? NF_I64 : NF_I32;
      return B2(c, cmps[rndi(6)], gen(c, ot, depth - 1), gen(c, ot, depth - 1));
    }
    if (k == 5) return nf_e_unary(c, NF_OP_NOT, gen(c, NF_BOOL, depth - 1));
    if (k == 6) return nf_e_cast(c, NF_BOOL, gen(c, NF_I64, depth - 1));
    return B2(c, rndi(2) ? NF_OP_AND : NF_OP_OR, gen(c, NF_BOOL, depth - 1),
              gen(c, NF_BOOL, depth - 1));
  }
  int k = depth <= 0 ? rndi(2) : rndi(20);
  switch (k) {
  case 0: return nf_e_const_i(c, t, rndi(11) - 5);
  case 1: {
    const nf_expr *v = V(c, (uint32_t)rndi(N_TVARS));
    return t == NF_I64 ? v : nf_e_cast(c, t, v);
  }
  case 2: case 3: case 4:
    return B2(c, NF_OP_ADD, gen(c, t, depth - 1), gen(c, t, depth - 1));
  case 5: case 6:
    return B2(c, NF_OP_SUB, gen(c, t, depth - 1), gen(c, t, depth - 1));
  case 7:
    return B2(c, NF_OP_MUL, gen(c, t, depth - 1),
              nf_e_const_i(c, t, rndi(7) - 3));
  case 8: return B2(c, NF_OP_MUL, gen(c, t, depth - 1), gen(c, t, depth - 1));
  case 9: return nf_e_unary(c, rndi(2) ? NF_OP_NEG : NF_OP_ABS,
                            gen(c, t, depth - 1));
  case 10: case 11: case 12: {
    int64_t d = rndi(9) - 4;
    const nf_expr *den = rndi(4) ? nf_e_const_i(c, t, d == 0 ? 3 : d)
                                 : gen(c, t, depth - 1);
    return B2(c, k == 12 ? NF_OP_MOD : rndi(2) ? NF_OP_FLOORDIV : NF_OP_MOD,
              gen(c, t, depth - 1), den);
  }
  case 13: case 14:
    return B2(c, rndi(2) ? NF_OP_MIN : NF_OP_MAX, gen(c, t, depth - 1),
              gen(c, t, depth - 1));
  case 15: case 16:
    return nf_e_select(c, gen(c, NF_BOOL, depth - 1), gen(c, t, depth - 1),
                       gen(c, t, depth - 1));
  case 17:
    return nf_e_cast(c, t, gen(c, rndi(2) ? NF_BOOL : t == NF_I64 ? NF_I32
                                                                  : NF_I64,
                               depth - 1));
  default: {
    /* an affine combination, often a multiple of a divisor */
    const nf_expr *x = B2(c, NF_OP_MUL, gen(c, t, depth - 1),
                          nf_e_const_i(c, t, 4));
    return B2(c, NF_OP_ADD, x, gen(c, t, depth - 1));
  }
  }
}

static void random_ranges(nf_range *r) {
  for (int v = 0; v < N_TVARS; v++) {
    r[v].lo = rndi(10) - 6;
    r[v].hi = r[v].lo + rndi(7);
  }
}

/* Calls fn for every assignment of the variables within r. */
#define FOR_ALL(r, x)                                              \
  for (x[0] = r[0].lo; x[0] <= r[0].hi; x[0]++)                    \
    for (x[1] = r[1].lo; x[1] <= r[1].hi; x[1]++)                  \
      for (x[2] = r[2].lo; x[2] <= r[2].hi; x[2]++)

/* ---- bounds ---- */

static void check_bounds(const nf_expr *e, nf_range *r, int64_t lo,
                         int64_t hi) {
  nf_range b;
  ck_assert_int_eq(nf_expr_bounds(e, r, N_TVARS, &b), 1);
  ck_assert_int_eq(b.lo, lo);
  ck_assert_int_eq(b.hi, hi);
}

START_TEST(ir_bounds_examples) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  nf_range r[N_TVARS] = {{-5, -1}, {0, 9}, {-7, -7}};
  check_bounds(I(c, 4), r, 4, 4);
  check_bounds(i, r, -5, -1);
  check_bounds(B2(c, NF_OP_FLOORDIV, i, I(c, 2)), r, -3, -1);
  check_bounds(B2(c, NF_OP_MOD, i, I(c, 2)), r, 0, 1);
  check_bounds(B2(c, NF_OP_FLOORDIV, V(c, 2), I(c, 2)), r, -4, -4);
  check_bounds(B2(c, NF_OP_MOD, V(c, 2), I(c, 2)), r, 1, 1);
  check_bounds(B2(c, NF_OP_MOD, I(c, 7), I(c, -2)), r, -1, -1);
  check_bounds(B2(c, NF_OP_FLOORDIV, I(c, 7), I(c, -2)), r, -4, -4);
  check_bounds(B2(c, NF_OP_MOD, j, I(c, 4)), r, 0, 3);
  check_bounds(B2(c, NF_OP_MOD, j, I(c, -4)), r, -3, 0);
  check_bounds(B2(c, NF_OP_MOD, B2(c, NF_OP_ADD, j, I(c, 12)), I(c, 32)), r, 12, 21);
  check_bounds(B2(c, NF_OP_SUB, j, i), r, 1, 14);
  check_bounds(B2(c, NF_OP_MUL, i, j), r, -45, 0);
  check_bounds(nf_e_unary(c, NF_OP_ABS, B2(c, NF_OP_ADD, i, I(c, 3))), r, 0, 2);
  check_bounds(B2(c, NF_OP_MIN, i, j), r, -5, -1);
  check_bounds(B2(c, NF_OP_LT, i, j), r, 1, 1);
  check_bounds(B2(c, NF_OP_GT, j, I(c, 4)), r, 0, 1);
  check_bounds(nf_e_select(c, B2(c, NF_OP_GT, j, I(c, 4)), i, j), r, -5, 9);
  check_bounds(nf_e_cast(c, NF_BOOL, i), r, 1, 1);
  check_bounds(B2(c, NF_OP_FLOORDIV, I(c, 100), j), r, 11, 100); /* j != 0 */
  /* unknown: tensor values, variables without a range, overflow */
  nf_range b;
  const nf_expr *x = nf_e_access(c, 0, NF_I64, 1, &i);
  ck_assert_int_eq(nf_expr_bounds(x, r, N_TVARS, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(V(c, 3), r, N_TVARS, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(i, NULL, 0, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(B2(c, NF_OP_MUL, I(c, INT64_MAX), j), r, N_TVARS, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(B2(c, NF_OP_FLOORDIV, I(c, 1), V(c, 2)), r, 0, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(nf_e_const_f(c, NF_F32, 1.0), r, N_TVARS, &b), 0);
  ck_assert_int_eq(nf_expr_bounds(B2(c, NF_OP_FLOORDIV, j, I(c, 0)), r, N_TVARS, &b), 0);
  /* x % 4 is bounded whatever x is; a bool access is 0 or 1 */
  check_bounds(B2(c, NF_OP_MOD, x, I(c, 4)), r, 0, 3);
  check_bounds(nf_e_access(c, 0, NF_BOOL, 1, &i), r, 0, 1);
  /* an i32 value beyond i32 is not bounded (it may wrap) */
  const nf_expr *big = nf_e_const_i(c, NF_I32, INT32_MAX);
  ck_assert_int_eq(nf_expr_bounds(B2(c, NF_OP_ADD, big, nf_e_cast(c, NF_I32, j)),
                                  r, N_TVARS, &b), 0);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_bounds_brute_force) {
  rng_state = 0xb0b0b0b0cafef00dull;
  int n_known = 0, n_tight = 0;
  for (int it = 0; it < 3000; it++) {
    nf_ir_ctx *c = nf_ir_ctx_new();
    nf_range r[N_TVARS];
    random_ranges(r);
    nf_dtype t = rndi(5) == 0 ? NF_BOOL : rndi(4) == 0 ? NF_I32 : NF_I64;
    const nf_expr *e = gen(c, t, 1 + rndi(4));
    nf_range b;
    if (nf_expr_bounds(e, r, N_TVARS, &b)) {
      n_known++;
      ck_assert_int_le(b.lo, b.hi);
      int64_t x[N_TVARS], mn = INT64_MAX, mx = INT64_MIN;
      FOR_ALL(r, x) {
        val v = ev(e, x);
        if (!v.ok) continue;
        ck_assert_msg(v.v >= b.lo && v.v <= b.hi,
                      "it %d: value %lld outside [%lld, %lld] at (%lld, %lld, %lld)",
                      it, (long long)v.v, (long long)b.lo, (long long)b.hi,
                      (long long)x[0], (long long)x[1], (long long)x[2]);
        if (v.v < mn) mn = v.v;
        if (v.v > mx) mx = v.v;
      }
      if (mn == b.lo && mx == b.hi) n_tight++;
    }
    nf_ir_ctx_free(c);
  }
  /* the bounds are usually known and often exact */
  ck_assert_int_gt(n_known, 2500);
  ck_assert_int_gt(n_tight, 1200);
}
END_TEST

/* ---- simplification ---- */

START_TEST(ir_simplify_rewrites) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  nf_range r[2] = {{0, 7}, {0, 3}};
  /* affine normal form */
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_SUB, B2(c, NF_OP_ADD, i, I(c, 1)),
                                     I(c, 1)), NULL, 0), i);
  nf_affine three = {.n = 1, .var = {0}, .coef = {3}};
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_ADD, B2(c, NF_OP_MUL, I(c, 2), i), i),
                               NULL, 0),
                   nf_affine_expr(c, &three));
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_SUB, i, i), NULL, 0), I(c, 0));
  /* constant folding, Python division, unfoldable overflow */
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_FLOORDIV, I(c, -7), I(c, 2)), NULL, 0),
                   I(c, -4));
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MOD, I(c, -7), I(c, 2)), NULL, 0),
                   I(c, 1));
  const nf_expr *ovf = B2(c, NF_OP_MUL, I(c, INT64_MAX), I(c, 2));
  ck_assert_ptr_eq(nf_simplify(c, ovf, NULL, 0), ovf);
  const nf_expr *dz = B2(c, NF_OP_FLOORDIV, I(c, 1), I(c, 0));
  ck_assert_ptr_eq(nf_simplify(c, dz, NULL, 0), dz);
  const nf_expr *i32o = B2(c, NF_OP_ADD, nf_e_const_i(c, NF_I32, INT32_MAX),
                           nf_e_const_i(c, NF_I32, 1));
  ck_assert_ptr_eq(nf_simplify(c, i32o, NULL, 0), i32o);
  /* // and % by ranges */
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_FLOORDIV, j, I(c, 4)), r, 2), I(c, 0));
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MOD, j, I(c, 4)), r, 2), j);
  const nf_expr *jm = B2(c, NF_OP_MOD, j, I(c, 4));
  ck_assert_ptr_eq(nf_simplify(c, jm, NULL, 0), jm); /* no ranges: kept */
  const nf_expr *lin = B2(c, NF_OP_ADD, B2(c, NF_OP_MUL, i, I(c, 4)), j);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_FLOORDIV, lin, I(c, 4)), r, 2), i);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MOD, lin, I(c, 4)), r, 2), j);
  /* comparisons decided by ranges */
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_LT, i, I(c, 8)), r, 2),
                   nf_e_const_i(c, NF_BOOL, 1));
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_GT, j, i), r, 2),
                   nf_simplify(c, B2(c, NF_OP_GT, j, i), r, 2));
  ck_assert_int_eq(nf_simplify(c, B2(c, NF_OP_GT, j, i), r, 2)->op, NF_OP_GT);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MIN, j, I(c, 10)), r, 2), j);
  /* selects, double negation, casts */
  const nf_expr *x = nf_e_access(c, 0, NF_F32, 1, &i);
  const nf_expr *y = nf_e_access(c, 1, NF_F32, 1, &i);
  const nf_expr *tru = nf_e_const_i(c, NF_BOOL, 1);
  ck_assert_ptr_eq(nf_simplify(c, nf_e_select(c, tru, x, y), NULL, 0), x);
  ck_assert_ptr_eq(nf_simplify(c, nf_e_select(c, B2(c, NF_OP_GE, i, I(c, 0)), x, y),
                               r, 2), x);
  const nf_expr *cnd = nf_e_access(c, 2, NF_BOOL, 1, &i);
  ck_assert_ptr_eq(nf_simplify(c, nf_e_unary(c, NF_OP_NOT,
                                             nf_e_unary(c, NF_OP_NOT, cnd)),
                               NULL, 0), cnd);
  ck_assert_ptr_eq(nf_simplify(c, nf_e_unary(c, NF_OP_NEG,
                                             nf_e_unary(c, NF_OP_NEG, x)),
                               NULL, 0), x);
  ck_assert_ptr_eq(nf_simplify(c, nf_e_cast(c, NF_F32, x), NULL, 0), x);
  /* a guarded access stays inside its select */
  const nf_expr *g = nf_e_select(c, B2(c, NF_OP_LT, i, I(c, 5)), x,
                                 nf_e_const_f(c, NF_F32, 0.0));
  const nf_expr *gs = nf_simplify(c, g, r, 2);
  ck_assert_ptr_eq(gs, g);
  /* floats: exact rewrites only */
  const nf_expr *f0 = nf_e_const_f(c, NF_F32, 0.0);
  const nf_expr *f1 = nf_e_const_f(c, NF_F32, 1.0);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MUL, x, f1), NULL, 0), x);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_DIV, x, f1), NULL, 0), x);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_SUB, x, f0), NULL, 0), x);
  const nf_expr *xp0 = B2(c, NF_OP_ADD, x, f0); /* -0 + 0 = +0: kept */
  ck_assert_ptr_eq(nf_simplify(c, xp0, NULL, 0), xp0);
  const nf_expr *xmx = B2(c, NF_OP_SUB, x, x); /* NaN - NaN: kept */
  ck_assert_ptr_eq(nf_simplify(c, xmx, NULL, 0), xmx);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_MUL, nf_e_const_f(c, NF_F32, 2.0),
                                     nf_e_const_f(c, NF_F32, 3.0)), NULL, 0),
                   nf_e_const_f(c, NF_F32, 6.0));
  const nf_expr *inexact = B2(c, NF_OP_ADD, nf_e_const_f(c, NF_F32, 0.1),
                              nf_e_const_f(c, NF_F32, 0.2));
  ck_assert_ptr_eq(nf_simplify(c, inexact, NULL, 0), inexact);
  ck_assert_ptr_eq(nf_simplify(c, B2(c, NF_OP_ADD, nf_e_const_f(c, NF_F64, 0.1),
                                     nf_e_const_f(c, NF_F64, 0.2)), NULL, 0),
                   nf_e_const_f(c, NF_F64, 0.1 + 0.2));
  /* shared subterms stay shared */
  const nf_expr *s = B2(c, NF_OP_ADD, B2(c, NF_OP_SUB, B2(c, NF_OP_ADD, i, I(c, 1)),
                                         I(c, 1)), j);
  const nf_expr *acc = nf_e_access(c, 0, NF_I64, 1, &s);
  const nf_expr *two = nf_simplify(c, B2(c, NF_OP_MUL, acc, acc), NULL, 0);
  ck_assert_int_eq(two->op, NF_OP_MUL);
  ck_assert_ptr_eq(two->args[0], two->args[1]);
  ck_assert_ptr_eq(two->args[0]->args[0], B2(c, NF_OP_ADD, i, j));
  ck_assert_int_eq(nf_ir_ctx_oom(c), 0);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(ir_simplify_preserves_value) {
  rng_state = 0x5eed5eed12345678ull;
  int n_changed = 0, n_smaller = 0;
  for (int it = 0; it < 3000; it++) {
    nf_ir_ctx *c = nf_ir_ctx_new();
    nf_range r[N_TVARS];
    random_ranges(r);
    nf_dtype t = rndi(5) == 0 ? NF_BOOL : rndi(4) == 0 ? NF_I32 : NF_I64;
    const nf_expr *e = gen(c, t, 1 + rndi(4));
    int use_ranges = rndi(3) != 0;
    const nf_expr *s = nf_simplify(c, e, use_ranges ? r : NULL, N_TVARS);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(s->dtype, e->dtype);
    if (s != e) n_changed++;
    if (s->op == NF_OP_CONST || s->op == NF_OP_VAR) n_smaller++;
    int64_t x[N_TVARS];
    FOR_ALL(r, x) {
      val a = ev(e, x);
      if (!a.ok) continue;
      val b = ev(s, x);
      ck_assert_msg(b.ok && a.v == b.v,
                    "it %d: original %lld, simplified %s%lld at (%lld, %lld, %lld)",
                    it, (long long)a.v, b.ok ? "" : "error ", (long long)b.v,
                    (long long)x[0], (long long)x[1], (long long)x[2]);
    }
    /* simplifying again changes nothing more */
    const nf_expr *s2 = nf_simplify(c, s, use_ranges ? r : NULL, N_TVARS);
    FOR_ALL(r, x) {
      val a = ev(s, x);
      if (!a.ok) continue;
      val b = ev(s2, x);
      ck_assert(b.ok && a.v == b.v);
    }
    nf_ir_ctx_free(c);
  }
  ck_assert_int_gt(n_changed, 1500);
  ck_assert_int_gt(n_smaller, 300);
}
END_TEST

/* ---- nf_graph_measure ---- */

START_TEST(ir_measure_cost) {
  /* C(i, j) += A(i, k) * B(k, j), then D(i, j) = exp(C(i, j)) + 1 into a
   * local L and E(i, j) = L(i, j) * 2 (L inlinable, C not: a reduction) */
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "m");
  int64_t sh[2] = {6, 5}, sq[2] = {5, 5};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sq);
  int cc = nf_graph_add_tensor(g, "C", NF_F32, NF_T_LOCAL, 2, sh);
  int l = nf_graph_add_tensor(g, "L", NF_F32, NF_T_LOCAL, 2, sh);
  int e = nf_graph_add_tensor(g, "E", NF_F32, NF_T_OUTPUT, 2, sh);
  const nf_expr *ik[2] = {V(c, 0), V(c, 2)}, *kj[2] = {V(c, 2), V(c, 1)}, *ij[2] = {V(c, 0), V(c, 1)};
  nf_stmt s;
  memset(&s, 0, sizeof(s));
  s.out = (uint32_t)cc;
  s.red = NF_RED_SUM;
  s.n_red = 1;
  s.red_ext[0] = 5;
  s.rhs = nf_e_binary(c, NF_OP_MUL, nf_e_access(c, (uint32_t)a, NF_F32, 2, ik),
                      nf_e_access(c, (uint32_t)b, NF_F32, 2, kj));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  memset(&s, 0, sizeof(s));
  s.out = (uint32_t)l;
  s.rhs = nf_e_binary(c, NF_OP_ADD,
                      nf_e_unary(c, NF_OP_EXP, nf_e_access(c, (uint32_t)cc, NF_F32, 2, ij)),
                      nf_e_const_f(c, NF_F32, 1.0));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  s.out = (uint32_t)e;
  s.rhs = nf_e_binary(c, NF_OP_MUL, nf_e_access(c, (uint32_t)l, NF_F32, 2, ij),
                      nf_e_const_f(c, NF_F32, 2.0));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK);
  nf_graph_cost cost;
  ck_assert_int_eq(nf_graph_measure(g, &cost), NF_OK);
  ck_assert(cost.elements == 30 + 25 + 3 * 30);
  /* 150 points x (mul + add), 30 x (exp + add), 30 x mul */
  ck_assert(cost.flops == 300 + 60 + 30);
  ck_assert_uint_eq(cost.flops_stmt, 0);
  /* E's right side: mul(L(..), 2) with L's add(exp(C(i, j)), 1) inlined:
   * mul, add, exp, access, var */
  ck_assert_uint_eq(cost.depth, 5);
  ck_assert_uint_eq(cost.depth_stmt, 2);
  nf_ir_ctx_free(c);
}
END_TEST

/* ---- deep expressions and visiting ---- */

static void count_node(const nf_expr *e, void *user) {
  (void)e;
  (*(long *)user)++;
}

START_TEST(ir_deep_expression) {
  enum { DEPTH = 100000 };
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  /* an f32 statement 100k additions deep */
  const nf_expr *idx[2] = {i, j};
  const nf_expr *f = nf_e_access(c, 0, NF_F32, 2, idx);
  for (int k = 0; k < DEPTH; k++)
    f = B2(c, NF_OP_ADD, f, nf_e_const_f(c, NF_F32, (double)(k % 5)));
  nf_graph *g = nf_graph_new(c, "deep");
  int64_t sh[2] = {2, 2};
  ck_assert_int_eq(nf_graph_add_tensor(g, "X", NF_F32, NF_T_INPUT, 2, sh), 0);
  ck_assert_int_eq(nf_graph_add_tensor(g, "Y", NF_F32, NF_T_OUTPUT, 2, sh), 1);
  nf_stmt s = {.out = 1, .rhs = f};
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  /* validation walks it without recursion and refuses it: later stages
   * recurse over validated expressions */
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_validate(g, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "statement 0 (Y): right side nested more than 2048 "
                                          "levels deep"),
                "%s", nf_buf_str(&err));
  /* the other walkers of common/ stay iterative on any graph */
  nf_buf e = NF_BUF_INIT;
  ck_assert_int_eq(nf_graph_encode(g, &e), NF_OK);
  ck_assert_uint_gt(e.len, 4 * DEPTH);
  uint8_t h[32];
  ck_assert_int_eq(nf_graph_hash(g, h), NF_OK);
  long n = 0;
  nf_expr_visit(f, count_node, &n);
  ck_assert_int_eq(n, DEPTH + 1 + 2 + 5); /* adds, access, i, j, 5 consts */
  /* an i64 chain 100k deep: affine, bounded, simplified */
  const nf_expr *x = i;
  for (int k = 0; k < DEPTH; k++)
    x = B2(c, k % 3 ? NF_OP_ADD : NF_OP_SUB, x, I(c, k % 7));
  int64_t want = 0;
  for (int k = 0; k < DEPTH; k++) want += k % 3 ? k % 7 : -(k % 7);
  nf_affine a;
  ck_assert_int_eq(nf_expr_affine(x, &a), 1);
  ck_assert_int_eq(a.c, want);
  nf_range r[1] = {{0, 10}};
  nf_range b;
  ck_assert_int_eq(nf_expr_bounds(x, r, 1, &b), 1);
  ck_assert_int_eq(b.lo, want);
  ck_assert_int_eq(b.hi, want + 10);
  ck_assert_ptr_eq(nf_simplify(c, x, NULL, 0), B2(c, NF_OP_ADD, i, I(c, want)));
  const nf_expr *fs = nf_simplify(c, f, NULL, 0);
  ck_assert_ptr_nonnull(fs);
  nf_buf_free(&e);
  nf_buf_free(&err);
  nf_ir_ctx_free(c);
}
END_TEST

typedef struct vlog {
  const nf_expr *seen[32];
  int n;
} vlog;

static void log_node(const nf_expr *e, void *user) {
  vlog *l = user;
  ck_assert_int_lt(l->n, 32);
  for (int k = 0; k < l->n; k++) ck_assert_ptr_ne(l->seen[k], e); /* once */
  for (int a = 0; a < e->n_args; a++) {                          /* post-order */
    int found = 0;
    for (int k = 0; k < l->n; k++) found |= l->seen[k] == e->args[a];
    ck_assert(found);
  }
  l->seen[l->n++] = e;
}

START_TEST(ir_visit_postorder) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  const nf_expr *i = V(c, 0), *j = V(c, 1);
  const nf_expr *s = B2(c, NF_OP_ADD, i, j);
  const nf_expr *m = B2(c, NF_OP_MUL, s, s);
  const nf_expr *e = nf_e_select(c, B2(c, NF_OP_LT, s, i), m, B2(c, NF_OP_SUB, m, j));
  vlog l = {.n = 0};
  nf_expr_visit(e, log_node, &l);
  ck_assert_int_eq(l.n, 7); /* i j s lt m sub select */
  ck_assert_ptr_eq(l.seen[0], i);
  ck_assert_ptr_eq(l.seen[1], j);
  ck_assert_ptr_eq(l.seen[2], s);
  ck_assert_ptr_eq(l.seen[6], e);
  nf_ir_ctx_free(c);
}
END_TEST

static Suite *ir_suite(void) {
  Suite *s = suite_create("ir");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, ir_dtype_helpers);
  tcase_add_test(tc, ir_ptrmap);
  tcase_add_test(tc, ir_graph_summary);
  tcase_add_test(tc, ir_hashcons_identity);
  tcase_add_test(tc, ir_hash_context_independent);
  tcase_add_test(tc, ir_constructor_dtypes);
  tcase_add_test(tc, ir_constructor_null_args);
  tcase_add_test(tc, ir_const_float_rounding);
  tcase_add_test(tc, ir_graph_builder);
  tcase_add_test(tc, ir_tensor_numel);
  tcase_add_test(tc, ir_encode_invariance);
  tcase_add_test(tc, ir_encode_sensitivity);
  tcase_add_test(tc, ir_hash_hex);
  tcase_add_test(tc, ir_encode_dag_backrefs);
  tcase_add_loop_test(tc, ir_validate_rejects, 0,
                      (int)(sizeof(vcases) / sizeof(vcases[0])));
  tcase_add_test(tc, ir_validate_null_graph);
  tcase_add_test(tc, ir_validate_random_mutations);
  tcase_add_test(tc, ir_affine_forms);
  tcase_add_test(tc, ir_affine_overflow);
  tcase_add_test(tc, ir_affine_expr_canonical);
  tcase_add_test(tc, ir_bounds_examples);
  tcase_add_test(tc, ir_bounds_brute_force);
  tcase_add_test(tc, ir_simplify_rewrites);
  tcase_add_test(tc, ir_simplify_preserves_value);
  tcase_add_test(tc, ir_deep_expression);
  tcase_add_test(tc, ir_measure_cost);
  tcase_add_test(tc, ir_visit_postorder);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(ir_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
