/* ir.c - the expression IR: dtypes, operators, the hash-consing context,
 * expression constructors, the graph builder and graph validation.
 *
 * Invariants:
 *  - Every nf_expr is allocated from its context's arena and interned in
 *    the context's hash table, so structurally equal expressions of one
 *    context are one pointer.  Nodes are never mutated after interning.
 *  - nf_expr.hash depends only on op, dtype, payload and the arguments'
 *    .hash (never on pointers or ids), so equal structures built in two
 *    contexts hash equally.  Interning compares op, dtype, n_args, payload
 *    (float constants by bit pattern) and argument pointers.
 *  - Constructors check the typing rules of nf_ir.h with NF_ASSERT; a NULL
 *    argument (an earlier allocation failure) or an allocation failure
 *    yields NULL and, for the latter, sets the context's oom flag.
 *  - Graph arrays are grown by the builder only: an array holding n
 *    entries has capacity 0 (n = 0) or max(8, next power of two >= n), so
 *    no capacity field is needed.
 *  - nf_graph_validate never asserts or recurses: expressions are walked
 *    with an explicit stack and a visited set, so deep or shared DAGs cost
 *    time linear in their node count.  It refuses a right side taller
 *    than NF_MAX_EXPR_DEPTH, so every later stage may walk a validated
 *    graph's expressions recursively.
 *
 * DAG-aware walks use the common pointer map (nf_ptrmap.h).  Encoding
 * lives in ir_hash.c, index arithmetic and simplification in
 * ir_affine.c.
 */
#include "nf_ir.h"
#include "ir_int.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- dtypes ---- */

static const char *const dtype_names[NF_N_DTYPES] = {
    "bool", "i32", "i64", "f16", "bf16", "f32", "f64"};

/* Returns the dtype's name, a static string, or NULL when invalid. */
const char *nf_dtype_name(nf_dtype t) {
  if ((unsigned)t >= NF_N_DTYPES) return NULL;
  return dtype_names[t];
}

/* Parses the n bytes at s as a dtype name; 1 and *out on success. */
int nf_dtype_parse(const char *s, size_t n, nf_dtype *out) {
  if (!s) return 0;
  for (int t = 0; t < NF_N_DTYPES; t++) {
    if (strlen(dtype_names[t]) == n && memcmp(dtype_names[t], s, n) == 0) {
      if (out) *out = (nf_dtype)t;
      return 1;
    }
  }
  return 0;
}

/* 1 for f16, bf16, f32, f64. */
int nf_dtype_is_float(nf_dtype t) {
  return t == NF_F16 || t == NF_BF16 || t == NF_F32 || t == NF_F64;
}

/* 1 for i32 and i64 (bool is not an integer type here). */
int nf_dtype_is_int(nf_dtype t) { return t == NF_I32 || t == NF_I64; }

/* Bytes of one element of the dtype (bool is one byte); 0 when invalid. */
size_t nf_dtype_size(nf_dtype t) {
  switch (t) {
  case NF_BOOL: return 1;
  case NF_I32: return 4;
  case NF_I64: return 8;
  case NF_F16: return 2;
  case NF_BF16: return 2;
  case NF_F32: return 4;
  case NF_F64: return 8;
  default: return 0;
  }
}

/* ---- operators ---- */

static const char *const op_names[NF_N_OPS] = {
    [NF_OP_CONST] = "const",     [NF_OP_VAR] = "var",
    [NF_OP_ACCESS] = "access",   [NF_OP_NEG] = "neg",
    [NF_OP_NOT] = "!",           [NF_OP_EXP] = "exp",
    [NF_OP_LOG] = "log",         [NF_OP_SQRT] = "sqrt",
    [NF_OP_RSQRT] = "rsqrt",     [NF_OP_TANH] = "tanh",
    [NF_OP_SIGMOID] = "sigmoid", [NF_OP_ERF] = "erf",
    [NF_OP_ABS] = "abs",         [NF_OP_FLOOR] = "floor",
    [NF_OP_CEIL] = "ceil",       [NF_OP_STOPGRAD] = "stop_gradient",
    [NF_OP_CAST] = "cast",
    [NF_OP_ADD] = "+",           [NF_OP_SUB] = "-",
    [NF_OP_MUL] = "*",           [NF_OP_DIV] = "/",
    [NF_OP_FLOORDIV] = "//",     [NF_OP_MOD] = "%",
    [NF_OP_POW] = "pow",         [NF_OP_MIN] = "min",
    [NF_OP_MAX] = "max",         [NF_OP_LT] = "<",
    [NF_OP_LE] = "<=",           [NF_OP_GT] = ">",
    [NF_OP_GE] = ">=",           [NF_OP_EQ] = "==",
    [NF_OP_NE] = "!=",           [NF_OP_AND] = "&&",
    [NF_OP_OR] = "||",           [NF_OP_SELECT] = "select"};

/* Returns the operator's spelling, a static string ("?" when invalid). */
const char *nf_op_name(nf_op op) {
  if ((unsigned)op >= NF_N_OPS) return "?";
  return op_names[op];
}

/* Number of arguments: 0 for CONST, VAR and ACCESS (whose count is its
 * tensor's rank), 1, 2 or 3 otherwise; -1 for an invalid op. */
int nf_op_arity(nf_op op) {
  if ((unsigned)op >= NF_N_OPS) return -1;
  if (op <= NF_OP_ACCESS) return 0;
  if (op <= NF_OP_CAST) return 1;
  if (op <= NF_OP_OR) return 2;
  return 3;
}

/* Checks the typing rules for a node of op with the given argument
 * dtypes; returns NULL when well typed or a message.  *res receives the
 * result dtype for ops that determine it (all but CONST, ACCESS, CAST,
 * whose dtype is the node's own). */
static const char *type_error(nf_op op, int n, const nf_expr *const *args,
                              nf_dtype *res) {
  nf_dtype a = n > 0 ? (nf_dtype)args[0]->dtype : NF_BOOL;
  nf_dtype b = n > 1 ? (nf_dtype)args[1]->dtype : NF_BOOL;
  for (int i = 0; i < n; i++)
    if (args[i]->dtype >= NF_N_DTYPES) return "argument has an invalid dtype";
  switch (op) {
  case NF_OP_CONST:
  case NF_OP_CAST:
    return NULL;
  case NF_OP_VAR:
    *res = NF_I64;
    return NULL;
  case NF_OP_ACCESS:
    for (int i = 0; i < n; i++)
      if (args[i]->dtype != NF_I64) return "access index is not i64";
    return NULL;
  case NF_OP_NEG:
  case NF_OP_ABS:
  case NF_OP_STOPGRAD:
    if (!nf_dtype_is_int(a) && !nf_dtype_is_float(a))
      return "operand must be numeric";
    *res = a;
    return NULL;
  case NF_OP_NOT:
    if (a != NF_BOOL) return "operand of ! must be bool";
    *res = NF_BOOL;
    return NULL;
  case NF_OP_EXP:
  case NF_OP_LOG:
  case NF_OP_SQRT:
  case NF_OP_RSQRT:
  case NF_OP_TANH:
  case NF_OP_SIGMOID:
  case NF_OP_ERF:
  case NF_OP_FLOOR:
  case NF_OP_CEIL:
    if (!nf_dtype_is_float(a)) return "operand must be a float";
    *res = a;
    return NULL;
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL:
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
  case NF_OP_MIN:
  case NF_OP_MAX:
    if (a != b) return "operands have different dtypes";
    if (!nf_dtype_is_int(a) && !nf_dtype_is_float(a))
      return "operands must be numeric";
    *res = a;
    return NULL;
  case NF_OP_DIV:
  case NF_OP_POW:
    if (a != b) return "operands have different dtypes";
    if (!nf_dtype_is_float(a)) return "operands must be floats";
    *res = a;
    return NULL;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
    if (a != b) return "operands have different dtypes";
    *res = NF_BOOL;
    return NULL;
  case NF_OP_AND:
  case NF_OP_OR:
    if (a != NF_BOOL || b != NF_BOOL) return "operands must be bool";
    *res = NF_BOOL;
    return NULL;
  case NF_OP_SELECT:
    if (a != NF_BOOL) return "select condition must be bool";
    if (b != args[2]->dtype) return "select branches have different dtypes";
    *res = b;
    return NULL;
  default:
    return "invalid operator";
  }
}

/* ---- context and interning ---- */

struct nf_ir_ctx {
  nf_arena *arena;
  const nf_expr **tab; /* open addressing, linear probing; NULL = empty */
  size_t cap, count;   /* cap is a power of two */
  uint32_t next_id;
  int oom;
};

/* Creates an empty context; NULL when out of memory.  Free with
 * nf_ir_ctx_free, which frees every node and graph built in it. */
nf_ir_ctx *nf_ir_ctx_new(void) {
  nf_ir_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return NULL;
  ctx->arena = nf_arena_new();
  ctx->cap = 1024;
  ctx->tab = calloc(ctx->cap, sizeof(*ctx->tab));
  if (!ctx->arena || !ctx->tab) {
    nf_arena_free(ctx->arena);
    free(ctx->tab);
    free(ctx);
    return NULL;
  }
  return ctx;
}

/* Frees the context and everything allocated in it; NULL is a no-op. */
void nf_ir_ctx_free(nf_ir_ctx *ctx) {
  if (!ctx) return;
  nf_arena_free(ctx->arena);
  free(ctx->tab);
  free(ctx);
}

/* The context's arena (owned by the context, valid until it is freed). */
nf_arena *nf_ir_ctx_arena(nf_ir_ctx *ctx) { return ctx->arena; }

/* 1 once an allocation in the context has failed. */
int nf_ir_ctx_oom(const nf_ir_ctx *ctx) { return ctx->oom; }

/* Records an allocation failure outside the constructors (ir_affine.c's
 * scratch maps), so callers see it through nf_ir_ctx_oom. */
void nf__ir_ctx_set_oom(nf_ir_ctx *ctx) { ctx->oom = 1; }

/* The payload of a node as 64 bits: constants by value (floats by bit
 * pattern), the variable or tensor number, 0 for other ops. */
static uint64_t payload_bits(nf_op op, nf_dtype t, const nf_expr *e) {
  switch (op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float(t)) {
      uint64_t bits;
      memcpy(&bits, &e->u.f, sizeof(bits));
      return bits;
    }
    return (uint64_t)e->u.i;
  case NF_OP_VAR: return e->u.var;
  case NF_OP_ACCESS: return e->u.tensor;
  default: return 0;
  }
}

static uint64_t hash_combine(uint64_t h, uint64_t v) {
  return nf_mix64(h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}

static uint64_t node_hash(nf_op op, nf_dtype t, uint64_t payload, int n,
                          const nf_expr *const *args) {
  uint64_t h = 0x6e66697200000000ull; /* "nfir" */
  h = hash_combine(h, (uint64_t)op | (uint64_t)t << 8 | (uint64_t)n << 16);
  h = hash_combine(h, payload);
  for (int i = 0; i < n; i++) h = hash_combine(h, args[i]->hash);
  return h;
}

static int tab_grow(nf_ir_ctx *ctx) {
  size_t ncap = ctx->cap * 2;
  if (ncap > SIZE_MAX / sizeof(*ctx->tab)) return 0;
  const nf_expr **nt = calloc(ncap, sizeof(*nt));
  if (!nt) return 0;
  for (size_t i = 0; i < ctx->cap; i++) {
    const nf_expr *e = ctx->tab[i];
    if (!e) continue;
    size_t j = (size_t)e->hash & (ncap - 1);
    while (nt[j]) j = (j + 1) & (ncap - 1);
    nt[j] = e;
  }
  free(ctx->tab);
  ctx->tab = nt;
  ctx->cap = ncap;
  return 1;
}

/* Returns the unique node (op, t, payload of proto, args), creating it when
 * absent.  proto supplies the payload union only. */
static const nf_expr *intern(nf_ir_ctx *ctx, nf_op op, nf_dtype t,
                             const nf_expr *proto, int n,
                             const nf_expr *const *args) {
  if (ctx->oom) return NULL;
  uint64_t payload = payload_bits(op, t, proto);
  uint64_t h = node_hash(op, t, payload, n, args);
  size_t mask = ctx->cap - 1, i = (size_t)h & mask;
  for (const nf_expr *e; (e = ctx->tab[i]) != NULL; i = (i + 1) & mask) {
    if (e->hash != h || e->op != op || e->dtype != t || e->n_args != n)
      continue;
    if (payload_bits(op, t, e) != payload) continue;
    int same = 1;
    for (int k = 0; k < n && same; k++) same = e->args[k] == args[k];
    if (same) return e;
  }
  if (ctx->next_id == UINT32_MAX) {
    ctx->oom = 1;
    return NULL;
  }
  nf_expr *e = nf_arena_alloc(ctx->arena,
                              sizeof(nf_expr) + (size_t)n * sizeof(e->args[0]));
  if (!e) {
    ctx->oom = 1;
    return NULL;
  }
  e->op = (uint8_t)op;
  e->dtype = (uint8_t)t;
  e->n_args = (uint16_t)n;
  e->id = ctx->next_id++;
  e->hash = h;
  switch (op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float(t))
      e->u.f = proto->u.f;
    else
      e->u.i = proto->u.i;
    break;
  case NF_OP_VAR: e->u.var = proto->u.var; break;
  case NF_OP_ACCESS: e->u.tensor = proto->u.tensor; break;
  default: break;
  }
  for (int k = 0; k < n; k++) e->args[k] = args[k];
  ctx->tab[i] = e;
  ctx->count++;
  if (ctx->count * 2 > ctx->cap && !tab_grow(ctx)) {
    /* The node is interned; a full table only slows lookups down, but a
     * table that cannot grow must not fill up entirely. */
    if (ctx->count * 4 > ctx->cap * 3) ctx->oom = 1;
  }
  return e;
}

/* Rounds x to the nearest value with p significant bits whose exponent is
 * at least emin (the minimum normal exponent), ties to even; values above
 * maxv become infinite. */
static double round_float_format(double x, int p, int emin, double maxv) {
  if (x == 0 || !isfinite(x)) return x;
  int e;
  (void)frexp(x, &e); /* x = m * 2^e, 0.5 <= |m| < 1 */
  int ue = e - p;
  if (ue < emin - p + 1) ue = emin - p + 1;
  double r = ldexp(nearbyint(ldexp(x, -ue)), ue);
  if (fabs(r) > maxv) return copysign(INFINITY, x);
  return r;
}

/* Rounds a double to the nearest value of float dtype t. */
static double round_to_dtype(nf_dtype t, double v) {
  switch (t) {
  case NF_F16: return round_float_format(v, 11, -14, 65504.0);
  case NF_BF16: return round_float_format(v, 8, -126, ldexp(255.0, 120));
  case NF_F32: return isnan(v) ? v : (double)(float)v;
  default: return v;
  }
}

/* Returns the constant v of dtype t (bool: 0/1, nonzero means 1; i32: must
 * fit in 32 bits). */
const nf_expr *nf_e_const_i(nf_ir_ctx *ctx, nf_dtype t, int64_t v) {
  NF_ASSERT(t == NF_BOOL || nf_dtype_is_int(t));
  if (t == NF_BOOL) v = v != 0;
  if (t == NF_I32) NF_ASSERT(v >= INT32_MIN && v <= INT32_MAX);
  nf_expr proto = {.op = NF_OP_CONST};
  proto.u.i = v;
  return intern(ctx, NF_OP_CONST, t, &proto, 0, NULL);
}

/* Returns the float constant v rounded to dtype t (ties to even), so the
 * stored double is exactly a value of t.  NaNs keep their bits. */
const nf_expr *nf_e_const_f(nf_ir_ctx *ctx, nf_dtype t, double v) {
  NF_ASSERT(nf_dtype_is_float(t));
  nf_expr proto = {.op = NF_OP_CONST};
  proto.u.f = round_to_dtype(t, v);
  return intern(ctx, NF_OP_CONST, t, &proto, 0, NULL);
}

/* Returns index variable number var (i64).  Its range is checked by
 * nf_graph_validate, not here. */
const nf_expr *nf_e_var(nf_ir_ctx *ctx, uint32_t var) {
  nf_expr proto = {.op = NF_OP_VAR};
  proto.u.var = var;
  return intern(ctx, NF_OP_VAR, NF_I64, &proto, 0, NULL);
}

/* Returns an access of tensor (of dtype t) at n_idx i64 indices
 * (0 <= n_idx <= NF_MAX_RANK). */
const nf_expr *nf_e_access(nf_ir_ctx *ctx, uint32_t tensor, nf_dtype t,
                           int n_idx, const nf_expr *const *idx) {
  NF_ASSERT((unsigned)t < NF_N_DTYPES);
  NF_ASSERT(n_idx >= 0 && n_idx <= NF_MAX_RANK);
  for (int i = 0; i < n_idx; i++)
    if (!idx[i]) return NULL;
  nf_dtype res = t;
  NF_ASSERT(type_error(NF_OP_ACCESS, n_idx, idx, &res) == NULL);
  nf_expr proto = {.op = NF_OP_ACCESS};
  proto.u.tensor = tensor;
  return intern(ctx, NF_OP_ACCESS, t, &proto, n_idx, idx);
}

/* Returns op(a) for a unary op other than CAST (use nf_e_cast). */
const nf_expr *nf_e_unary(nf_ir_ctx *ctx, nf_op op, const nf_expr *a) {
  NF_ASSERT(nf_op_arity(op) == 1 && op != NF_OP_CAST);
  if (!a) return NULL;
  nf_dtype res = NF_BOOL;
  NF_ASSERT(type_error(op, 1, &a, &res) == NULL);
  nf_expr proto = {.op = (uint8_t)op};
  return intern(ctx, op, res, &proto, 1, &a);
}

/* Returns a converted to dtype t (any dtype to any dtype). */
const nf_expr *nf_e_cast(nf_ir_ctx *ctx, nf_dtype t, const nf_expr *a) {
  NF_ASSERT((unsigned)t < NF_N_DTYPES);
  if (!a) return NULL;
  NF_ASSERT(a->dtype < NF_N_DTYPES);
  nf_expr proto = {.op = NF_OP_CAST};
  return intern(ctx, NF_OP_CAST, t, &proto, 1, &a);
}

/* Returns a op b for a binary op (ADD .. OR). */
const nf_expr *nf_e_binary(nf_ir_ctx *ctx, nf_op op, const nf_expr *a,
                           const nf_expr *b) {
  NF_ASSERT(nf_op_arity(op) == 2);
  if (!a || !b) return NULL;
  const nf_expr *args[2] = {a, b};
  nf_dtype res = NF_BOOL;
  NF_ASSERT(type_error(op, 2, args, &res) == NULL);
  nf_expr proto = {.op = (uint8_t)op};
  return intern(ctx, op, res, &proto, 2, args);
}

/* Returns c ? a : b (c bool, a and b of one dtype). */
const nf_expr *nf_e_select(nf_ir_ctx *ctx, const nf_expr *c, const nf_expr *a,
                           const nf_expr *b) {
  if (!c || !a || !b) return NULL;
  const nf_expr *args[3] = {c, a, b};
  nf_dtype res = NF_BOOL;
  NF_ASSERT(type_error(NF_OP_SELECT, 3, args, &res) == NULL);
  nf_expr proto = {.op = NF_OP_SELECT};
  return intern(ctx, NF_OP_SELECT, res, &proto, 3, args);
}

/* Returns e's op, dtype and payload applied to args (e->n_args entries);
 * leaves are interned again in ctx. */
const nf_expr *nf_e_rebuild(nf_ir_ctx *ctx, const nf_expr *e,
                            const nf_expr *const *args) {
  if (!e) return NULL;
  nf_op op = (nf_op)e->op;
  switch (op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float((nf_dtype)e->dtype))
      return nf_e_const_f(ctx, (nf_dtype)e->dtype, e->u.f);
    return nf_e_const_i(ctx, (nf_dtype)e->dtype, e->u.i);
  case NF_OP_VAR: return nf_e_var(ctx, e->u.var);
  case NF_OP_ACCESS:
    return nf_e_access(ctx, e->u.tensor, (nf_dtype)e->dtype, e->n_args, args);
  case NF_OP_CAST: return nf_e_cast(ctx, (nf_dtype)e->dtype, args[0]);
  case NF_OP_SELECT: return nf_e_select(ctx, args[0], args[1], args[2]);
  default:
    if (nf_op_arity(op) == 1) return nf_e_unary(ctx, op, args[0]);
    return nf_e_binary(ctx, op, args[0], args[1]);
  }
}

/* ---- graphs ---- */

/* Creates an empty graph in ctx (its storage lives in ctx's arena); NULL
 * when out of memory.  The name is copied. */
nf_graph *nf_graph_new(nf_ir_ctx *ctx, const char *name) {
  nf_graph *g = nf_arena_alloc(ctx->arena, sizeof(*g));
  if (!g) {
    ctx->oom = 1;
    return NULL;
  }
  g->ctx = ctx;
  if (name) {
    g->name = nf_arena_strdup(ctx->arena, name);
    if (!g->name) {
      ctx->oom = 1;
      return NULL;
    }
  }
  return g;
}

/* Makes room for entry n of an array grown by this builder (see the
 * capacity invariant at the top). */
static int reserve(nf_graph *g, void **arr, uint32_t n, size_t elem) {
  if (n != 0 && (n < 8 || (n & (n - 1)) != 0)) return NF_OK;
  if (n >= (uint32_t)INT_MAX / 2) return NF_ELIMIT;
  size_t ncap = n == 0 ? 8 : (size_t)n * 2;
  void *na = nf_arena_alloc(g->ctx->arena, ncap * elem);
  if (!na) {
    g->ctx->oom = 1;
    return NF_ENOMEM;
  }
  if (n) memcpy(na, *arr, (size_t)n * elem);
  *arr = na;
  return NF_OK;
}

static char *dup_name(nf_graph *g, const char *s, int *rc) {
  if (!s) return NULL;
  char *d = nf_arena_strdup(g->ctx->arena, s);
  if (!d) {
    g->ctx->oom = 1;
    *rc = NF_ENOMEM;
  }
  return d;
}

/* Adds a tensor to g and returns its id, or NF_EINVAL (bad dtype, kind,
 * rank or a negative dim), NF_ENOMEM or NF_ELIMIT.  shape has rank entries
 * (may be NULL when rank is 0); the name (may be NULL) is copied.  g's
 * arrays must have been grown by this builder only (callers may edit
 * entries in place, but not replace the arrays or raise the counts). */
int nf_graph_add_tensor(nf_graph *g, const char *name, nf_dtype t,
                        nf_tkind kind, int rank, const int64_t *shape) {
  if (!g || (unsigned)t >= NF_N_DTYPES || (unsigned)kind > NF_T_OUTPUT ||
      rank < 0 || rank > NF_MAX_RANK || (rank > 0 && !shape))
    return NF_EINVAL;
  for (int d = 0; d < rank; d++)
    if (shape[d] < 0) return NF_EINVAL;
  int rc = reserve(g, (void **)&g->tensors, g->n_tensors, sizeof(nf_tensor));
  if (rc) return rc;
  if (kind == NF_T_INPUT)
    rc = reserve(g, (void **)&g->inputs, g->n_inputs, sizeof(uint32_t));
  else if (kind == NF_T_OUTPUT)
    rc = reserve(g, (void **)&g->outputs, g->n_outputs, sizeof(uint32_t));
  if (rc) return rc;
  nf_tensor tn = {0};
  tn.name = dup_name(g, name, &rc);
  if (rc) return rc;
  tn.dtype = (uint8_t)t;
  tn.kind = (uint8_t)kind;
  tn.rank = (uint8_t)rank;
  for (int d = 0; d < rank; d++) tn.shape[d] = shape[d];
  uint32_t id = g->n_tensors;
  g->tensors[g->n_tensors++] = tn;
  if (kind == NF_T_INPUT) g->inputs[g->n_inputs++] = id;
  if (kind == NF_T_OUTPUT) g->outputs[g->n_outputs++] = id;
  return (int)id;
}

/* Appends a copy of *s to g (variable names are copied too); NF_OK,
 * NF_EINVAL for a NULL statement, NF_ENOMEM or NF_ELIMIT.  The statement
 * is checked only by nf_graph_validate.  Same rule on g's arrays as
 * nf_graph_add_tensor. */
int nf_graph_add_stmt(nf_graph *g, const nf_stmt *s) {
  if (!g || !s) return NF_EINVAL;
  int rc = reserve(g, (void **)&g->stmts, g->n_stmts, sizeof(nf_stmt));
  if (rc) return rc;
  nf_stmt c = *s;
  for (int v = 0; v < NF_MAX_VARS; v++) {
    c.var_names[v] = dup_name(g, s->var_names[v], &rc);
    if (rc) return rc;
  }
  g->stmts[g->n_stmts++] = c;
  return NF_OK;
}

/* Returns the product of t's dims, or -1 on overflow, a negative dim or a
 * rank above NF_MAX_RANK. */
int64_t nf_tensor_numel(const nf_tensor *t) {
  if (!t || t->rank > NF_MAX_RANK) return -1;
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) {
    if (t->shape[d] < 0) return -1;
    if (__builtin_mul_overflow(n, t->shape[d], &n)) return -1;
  }
  return n;
}

/* ---- validation ---- */

/* A node being walked: its next argument to visit. */
typedef struct vframe {
  const nf_expr *e;
  uint32_t next;
} vframe;

typedef struct vstate {
  const nf_graph *g;
  nf_buf *err;
  uint8_t *produced; /* per tensor: 1 once its statement was seen */
  nf_ptrmap *seen;  /* node -> its height once finished, 0 while open */
  vframe *stack;
  size_t sp, scap;
} vstate;

static int verr(vstate *st, const char *fmt, ...) NF_PRINTF(2, 3);
static int verr(vstate *st, const char *fmt, ...) {
  if (st->err) {
    va_list ap;
    va_start(ap, fmt);
    nf_buf_vprintf(st->err, fmt, ap);
    va_end(ap);
  }
  return NF_EINVAL;
}

static const char *tname(const nf_graph *g, uint32_t id) {
  const char *n = g->tensors[id].name;
  return n ? n : "?";
}

/* Opens e (not seen before): marks it seen and pushes its frame. */
static int vpush(vstate *st, const nf_expr *e) {
  if (nf_ptrmap_put(st->seen, e, 0)) return NF_ENOMEM;
  if (st->sp == st->scap) {
    size_t ncap = st->scap ? st->scap * 2 : 256;
    vframe *ns = realloc(st->stack, ncap * sizeof(*ns));
    if (!ns) return NF_ENOMEM;
    st->stack = ns;
    st->scap = ncap;
  }
  st->stack[st->sp].e = e;
  st->stack[st->sp].next = 0;
  st->sp++;
  return NF_OK;
}

/* Checks one node of statement si (with nvars variables); args are
 * non-NULL when this returns NF_OK. */
static int check_node(vstate *st, uint32_t si, const nf_expr *e,
                      uint32_t nvars) {
  const nf_graph *g = st->g;
  if (e->op >= NF_N_OPS)
    return verr(st, "statement %u: invalid operator %u", si, e->op);
  nf_op op = (nf_op)e->op;
  if (e->dtype >= NF_N_DTYPES)
    return verr(st, "statement %u: '%s' node has invalid dtype %u", si,
                nf_op_name(op), e->dtype);
  if (op == NF_OP_ACCESS) {
    uint32_t t = e->u.tensor;
    if (t >= g->n_tensors)
      return verr(st, "statement %u: access of unknown tensor %u", si, t);
    const nf_tensor *tt = &g->tensors[t];
    if (tt->kind != NF_T_INPUT && !st->produced[t])
      return verr(st,
                  "statement %u: reads tensor %u (%s) before it is produced",
                  si, t, tname(g, t));
    if (e->n_args != tt->rank)
      return verr(st,
                  "statement %u: access of tensor %u (%s) has %u indices, "
                  "rank is %u",
                  si, t, tname(g, t), e->n_args, tt->rank);
    if (e->dtype != tt->dtype)
      return verr(st, "statement %u: access of tensor %u (%s) has dtype %s, "
                  "tensor is %s", si, t, tname(g, t),
                  nf_dtype_name((nf_dtype)e->dtype),
                  nf_dtype_name((nf_dtype)tt->dtype));
  } else if (e->n_args != nf_op_arity(op)) {
    return verr(st, "statement %u: '%s' node has %u arguments, expected %d",
                si, nf_op_name(op), e->n_args, nf_op_arity(op));
  }
  for (int k = 0; k < e->n_args; k++)
    if (!e->args[k])
      return verr(st, "statement %u: '%s' node has a NULL argument", si,
                  nf_op_name(op));
  nf_dtype res = (nf_dtype)e->dtype;
  const char *msg = type_error(op, e->n_args, e->args, &res);
  if (msg)
    return verr(st, "statement %u: '%s': %s", si, nf_op_name(op), msg);
  if (res != e->dtype)
    return verr(st, "statement %u: '%s' node has dtype %s, expected %s", si,
                nf_op_name(op), nf_dtype_name((nf_dtype)e->dtype),
                nf_dtype_name(res));
  if (op == NF_OP_VAR && e->u.var >= nvars)
    return verr(st,
                "statement %u: variable %u out of range (statement has %u)",
                si, e->u.var, nvars);
  if (op == NF_OP_CONST && e->dtype == NF_BOOL && e->u.i != 0 && e->u.i != 1)
    return verr(st, "statement %u: bool constant %lld is not 0 or 1", si,
                (long long)e->u.i);
  if (op == NF_OP_CONST && e->dtype == NF_I32 &&
      (e->u.i < INT32_MIN || e->u.i > INT32_MAX))
    return verr(st, "statement %u: i32 constant %lld out of range", si,
                (long long)e->u.i);
  return NF_OK;
}

/* Checks every node of statement si's right side, each when first
 * reached (so its arguments are known to be non-NULL before they are
 * visited), and its height (nodes on the longest path down to a leaf)
 * when its arguments are done: a right side taller than
 * NF_MAX_EXPR_DEPTH is refused here, before any later stage walks it
 * recursively. */
static int check_expr(vstate *st, uint32_t si, const nf_expr *root,
                      uint32_t nvars) {
  nf_ptrmap_clear(st->seen);
  st->sp = 0;
  int rc = check_node(st, si, root, nvars);
  if (rc) return rc;
  if (vpush(st, root)) return NF_ENOMEM;
  while (st->sp) {
    vframe *f = &st->stack[st->sp - 1];
    const nf_expr *e = f->e;
    if (f->next < e->n_args) {
      const nf_expr *a = e->args[f->next++];
      /* seen: finished, or open on the stack (only a cycle, which
       * hash-consed expressions cannot form, would reach that) */
      if (nf_ptrmap_get(st->seen, a, NULL)) continue;
      if ((rc = check_node(st, si, a, nvars))) return rc;
      if (vpush(st, a)) return NF_ENOMEM;
      continue;
    }
    uint64_t h = 1, ha;
    for (int k = 0; k < e->n_args; k++)
      if (nf_ptrmap_get(st->seen, e->args[k], &ha) && ha + 1 > h) h = ha + 1;
    if (h > NF_MAX_EXPR_DEPTH)
      return verr(st,
                  "statement %u (%s): right side nested more than %d levels "
                  "deep (NF_MAX_EXPR_DEPTH)",
                  si, tname(st->g, st->g->stmts[si].out), NF_MAX_EXPR_DEPTH);
    if (nf_ptrmap_put(st->seen, e, h)) return NF_ENOMEM;
    st->sp--;
  }
  return NF_OK;
}

static int check_stmt(vstate *st, uint32_t si) {
  const nf_graph *g = st->g;
  const nf_stmt *s = &g->stmts[si];
  if (s->out >= g->n_tensors)
    return verr(st, "statement %u: output tensor %u out of range", si,
                s->out);
  const nf_tensor *t = &g->tensors[s->out];
  if (t->kind == NF_T_INPUT)
    return verr(st, "statement %u: writes input tensor %u (%s)", si, s->out,
                tname(g, s->out));
  if (st->produced[s->out])
    return verr(st, "statement %u: tensor %u (%s) is produced twice", si,
                s->out, tname(g, s->out));
  if (s->red > NF_RED_MIN)
    return verr(st, "statement %u: invalid reduction operator %u", si,
                s->red);
  if (s->n_red > NF_MAX_VARS - t->rank)
    return verr(st,
                "statement %u: %u reduction variables with rank %u exceed "
                "%d variables",
                si, s->n_red, t->rank, NF_MAX_VARS);
  if (s->red == NF_RED_NONE && s->n_red > 0)
    return verr(st,
                "statement %u: reduction variables without a reduction "
                "operator",
                si);
  for (int r = 0; r < s->n_red; r++) {
    int64_t end;
    if (s->red_ext[r] < 0)
      return verr(st, "statement %u: reduction variable %d has negative "
                  "extent %lld", si, r, (long long)s->red_ext[r]);
    if (__builtin_add_overflow(s->red_lo[r], s->red_ext[r], &end))
      return verr(st, "statement %u: reduction variable %d range overflows",
                  si, r);
  }
  if (!s->rhs) return verr(st, "statement %u: no right-hand side", si);
  if (s->rhs->dtype != t->dtype)
    return verr(st,
                "statement %u: right side has dtype %s, tensor %u (%s) is %s",
                si,
                nf_dtype_name((nf_dtype)s->rhs->dtype)
                    ? nf_dtype_name((nf_dtype)s->rhs->dtype)
                    : "invalid",
                s->out, tname(g, s->out), nf_dtype_name((nf_dtype)t->dtype));
  int rc = check_expr(st, si, s->rhs, (uint32_t)t->rank + s->n_red);
  if (rc == NF_ENOMEM && st->err) nf_buf_puts(st->err, "out of memory");
  if (rc) return rc;
  st->produced[s->out] = 1;
  return NF_OK;
}

static int check_tensors(vstate *st) {
  const nf_graph *g = st->g;
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    const nf_tensor *t = &g->tensors[i];
    if (t->dtype >= NF_N_DTYPES)
      return verr(st, "tensor %u (%s): invalid dtype %u", i, tname(g, i),
                  t->dtype);
    if (t->kind > NF_T_OUTPUT)
      return verr(st, "tensor %u (%s): invalid kind %u", i, tname(g, i),
                  t->kind);
    if (t->rank > NF_MAX_RANK)
      return verr(st, "tensor %u (%s): rank %u exceeds %d", i, tname(g, i),
                  t->rank, NF_MAX_RANK);
    for (int d = 0; d < t->rank; d++)
      if (t->shape[d] < 0)
        return verr(st, "tensor %u (%s): negative dimension %lld", i,
                    tname(g, i), (long long)t->shape[d]);
    if (nf_tensor_numel(t) < 0)
      return verr(st, "tensor %u (%s): element count overflows", i,
                  tname(g, i));
  }
  /* inputs: each INPUT tensor exactly once; outputs likewise. */
  uint8_t *listed = st->produced; /* reused as scratch, cleared below */
  for (int pass = 0; pass < 2; pass++) {
    uint32_t n = pass ? g->n_outputs : g->n_inputs;
    const uint32_t *ids = pass ? g->outputs : g->inputs;
    const char *what = pass ? "output" : "input";
    nf_tkind want = pass ? NF_T_OUTPUT : NF_T_INPUT;
    memset(listed, 0, g->n_tensors);
    for (uint32_t k = 0; k < n; k++) {
      uint32_t id = ids[k];
      if (id >= g->n_tensors)
        return verr(st, "%s %u: tensor id %u out of range", what, k, id);
      if (g->tensors[id].kind != want)
        return verr(st, "%s %u: tensor %u (%s) is not an %s tensor", what, k,
                    id, tname(g, id), what);
      if (listed[id])
        return verr(st, "%s %u: tensor %u (%s) listed twice", what, k, id,
                    tname(g, id));
      listed[id] = 1;
    }
    for (uint32_t i = 0; i < g->n_tensors; i++)
      if (g->tensors[i].kind == want && !listed[i])
        return verr(st, "tensor %u (%s): %s tensor missing from the %ss", i,
                    tname(g, i), what, what);
  }
  memset(listed, 0, g->n_tensors);
  return NF_OK;
}

/* Validates g (see nf_ir.h); never asserts.  Returns NF_OK, NF_EINVAL with
 * a message appended to err (may be NULL), or NF_ENOMEM. */
int nf_graph_validate(const nf_graph *g, nf_buf *err) {
  vstate st = {.g = g, .err = err};
  if (!g) return verr(&st, "no graph");
  if ((g->n_tensors && !g->tensors) || (g->n_stmts && !g->stmts) ||
      (g->n_inputs && !g->inputs) || (g->n_outputs && !g->outputs))
    return verr(&st, "graph has a count without its array");
  st.produced = calloc(g->n_tensors ? g->n_tensors : 1, 1);
  st.seen = nf_ptrmap_new();
  int rc;
  if (!st.produced || !st.seen) {
    rc = NF_ENOMEM;
    if (err) nf_buf_puts(err, "out of memory");
    goto done;
  }
  rc = check_tensors(&st);
  for (uint32_t si = 0; !rc && si < g->n_stmts; si++) rc = check_stmt(&st, si);
  for (uint32_t i = 0; !rc && i < g->n_tensors; i++)
    if (g->tensors[i].kind != NF_T_INPUT && !st.produced[i])
      rc = verr(&st, "tensor %u (%s) is never produced", i, tname(g, i));
done:
  free(st.produced);
  free(st.stack);
  nf_ptrmap_delete(st.seen);
  return rc;
}
