/* nf_ir.h - the expression IR: concrete tensors, expressions, statements,
 * graphs.
 *
 * This is the form every later stage consumes (interpreter, autodiff,
 * partitioning, lowering, hashing).  A graph is produced from `.nf` source
 * by the elaborator (nf_lang.h), which binds every size and parameter, so
 * all shapes here are static.
 *
 * Invariants:
 *  - Expressions are immutable, arena-allocated and hash-consed in an
 *    nf_ir_ctx: two structurally equal expressions built in the same context
 *    are the same pointer, so pointer equality is structural equality.
 *  - Index variables are numbered by position within their statement:
 *    0 .. rank(out)-1 are the output's indices (variable d ranges over
 *    [0, shape[d])), rank(out) .. rank(out)+n_red-1 the reduction variables
 *    (variable rank+r ranges over [red_lo[r], red_lo[r] + red_ext[r])).
 *    Names live only in side tables, so renaming never changes an
 *    expression.
 *  - Tensors are numbered within a graph; an access names a tensor id.
 *  - Every expression node carries its dtype.  Index variables are i64.
 *    Binary arithmetic takes operands of equal dtype (the elaborator inserts
 *    casts); comparisons yield bool; logical operators take bools.
 *  - The constructors check these typing rules with NF_ASSERT: callers
 *    (the elaborator, autodiff) must validate user input before building.
 *
 * Semantics (the interpreter is their definition):
 *  - `//` is floor division and `%` takes the sign of the divisor (Python);
 *    integer division by zero is an evaluation error.  On floats `//` is
 *    floor(a / b) and `%` is a - b * floor(a / b).
 *  - SELECT is lazy: only the taken branch is evaluated, so a guarded access
 *    may be out of bounds when its guard is false.
 *  - A reduction starts from the identity of its operator (0, 1, -inf, +inf
 *    or the integer extremes) and folds the reduction variables in
 *    lexicographic order, the first reduction variable outermost.
 */
#ifndef NF_IR_H
#define NF_IR_H

#include <stddef.h>
#include <stdint.h>

#include "nf_arena.h"
#include "nf_buf.h"
#include "nf_status.h"

#define NF_MAX_RANK 8  /* dimensions of a tensor */
#define NF_MAX_VARS 24 /* index variables of one statement (out + red) */
/* The tallest right side a valid graph may have: nodes on the longest
 * path from a statement's root down to a leaf.  Later stages (lowering,
 * the code generators, the schedule search) walk expressions
 * recursively; the code generator's stack overflows somewhere between
 * 12,000 and 20,000 levels (8 MiB stack, a release build), so this leaves
 * a wide margin (and room for sanitizer builds' larger frames), while the
 * deepest subgraph of the real workloads (examples/, bench/, training
 * steps included) is 35 levels deep.  The .nf parser's own limit keeps
 * every source expression far below it.  nf_graph_measure's depth, which counts
 * the producers a schedule may inline at their use, is held to the same
 * limit by the wire (nf_wire_graph_to_ir). */
#define NF_MAX_EXPR_DEPTH 2048

typedef enum nf_dtype {
  NF_BOOL = 0,
  NF_I32,
  NF_I64,
  NF_F16, /* declared for GPUs; the interpreter computes them as f32 */
  NF_BF16,
  NF_F32,
  NF_F64,
  NF_N_DTYPES
} nf_dtype;

/* "f32", "i64", "bool", ...; NULL for an invalid value. */
const char *nf_dtype_name(nf_dtype t);
/* Parses a dtype name; returns 1 and sets *out, or 0. */
int nf_dtype_parse(const char *s, size_t n, nf_dtype *out);
int nf_dtype_is_float(nf_dtype t);
int nf_dtype_is_int(nf_dtype t); /* i32, i64 (not bool) */
size_t nf_dtype_size(nf_dtype t);

typedef enum nf_op {
  /* leaves */
  NF_OP_CONST = 0, /* u.i (bool, ints) or u.f (floats) */
  NF_OP_VAR,       /* u.var: statement-local index variable number */
  NF_OP_ACCESS,    /* u.tensor; args = one index expression (i64) per dim */
  /* unary: arg[0] */
  NF_OP_NEG,
  NF_OP_NOT, /* bool */
  NF_OP_EXP,
  NF_OP_LOG,
  NF_OP_SQRT,
  NF_OP_RSQRT,
  NF_OP_TANH,
  NF_OP_SIGMOID,
  NF_OP_ERF,
  NF_OP_ABS,
  NF_OP_FLOOR,
  NF_OP_CEIL,
  NF_OP_STOPGRAD, /* identity whose derivative is zero: stop_gradient(x) */
  NF_OP_CAST, /* to the node's dtype */
  /* binary: arg[0], arg[1] */
  NF_OP_ADD,
  NF_OP_SUB,
  NF_OP_MUL,
  NF_OP_DIV, /* true division (floats only) */
  NF_OP_FLOORDIV,
  NF_OP_MOD,
  NF_OP_POW, /* floats only */
  NF_OP_MIN,
  NF_OP_MAX,
  NF_OP_LT,
  NF_OP_LE,
  NF_OP_GT,
  NF_OP_GE,
  NF_OP_EQ,
  NF_OP_NE,
  NF_OP_AND,
  NF_OP_OR,
  /* ternary: arg[0] ? arg[1] : arg[2] (lazy) */
  NF_OP_SELECT,
  NF_N_OPS
} nf_op;

/* "exp", "+", "select", ...; for printing and messages. */
const char *nf_op_name(nf_op op);
int nf_op_arity(nf_op op); /* 0 for leaves except ACCESS (variable) */

typedef struct nf_expr nf_expr;
struct nf_expr {
  uint8_t op;    /* nf_op */
  uint8_t dtype; /* nf_dtype of the value */
  uint16_t n_args;
  uint32_t id;   /* creation order within its context (stable, unique) */
  uint64_t hash; /* structural hash (context-independent) */
  union {
    int64_t i;       /* CONST of bool/int dtype */
    double f;        /* CONST of float dtype (f16/bf16/f32 values exact) */
    uint32_t var;    /* VAR */
    uint32_t tensor; /* ACCESS */
  } u;
  const nf_expr *args[]; /* n_args entries */
};

/* A context owns an arena and the hash-cons table.  Graphs built in a
 * context live until the context is freed. */
typedef struct nf_ir_ctx nf_ir_ctx;

nf_ir_ctx *nf_ir_ctx_new(void);
void nf_ir_ctx_free(nf_ir_ctx *ctx);
nf_arena *nf_ir_ctx_arena(nf_ir_ctx *ctx);
/* Set once an allocation failed; every constructor then returns NULL and
 * callers report NF_ENOMEM. */
int nf_ir_ctx_oom(const nf_ir_ctx *ctx);

/* Constructors.  All return the unique (hash-consed) node, or NULL only on
 * allocation failure.  Typing rules are NF_ASSERTed (see above). */
/* Integer or bool constant: bools normalise to 0/1; an i32 value must fit
 * in 32 bits (asserted). */
const nf_expr *nf_e_const_i(nf_ir_ctx *ctx, nf_dtype t, int64_t v);
/* Float constant, rounded to its dtype (f16/bf16 round to nearest even). */
const nf_expr *nf_e_const_f(nf_ir_ctx *ctx, nf_dtype t, double v);
const nf_expr *nf_e_var(nf_ir_ctx *ctx, uint32_t var);              /* i64 */
const nf_expr *nf_e_access(nf_ir_ctx *ctx, uint32_t tensor, nf_dtype t,
                           int n_idx, const nf_expr *const *idx);
const nf_expr *nf_e_unary(nf_ir_ctx *ctx, nf_op op, const nf_expr *a);
const nf_expr *nf_e_cast(nf_ir_ctx *ctx, nf_dtype t, const nf_expr *a);
const nf_expr *nf_e_binary(nf_ir_ctx *ctx, nf_op op, const nf_expr *a,
                           const nf_expr *b);
const nf_expr *nf_e_select(nf_ir_ctx *ctx, const nf_expr *c, const nf_expr *a,
                           const nf_expr *b);
/* Rebuilds e with new arguments (same op, dtype and payload). */
const nf_expr *nf_e_rebuild(nf_ir_ctx *ctx, const nf_expr *e,
                            const nf_expr *const *args);

/* ---- graphs ---- */

typedef enum nf_tkind {
  NF_T_INPUT = 0, /* supplied by the caller */
  NF_T_LOCAL,     /* produced by a statement, internal */
  NF_T_OUTPUT     /* produced by a statement, returned */
} nf_tkind;

typedef struct nf_tensor {
  const char *name; /* metadata only (never hashed) */
  uint8_t dtype;
  uint8_t kind; /* nf_tkind */
  uint8_t rank;
  int64_t shape[NF_MAX_RANK];
} nf_tensor;

typedef enum nf_redop {
  NF_RED_NONE = 0, /* O(i) = e */
  NF_RED_SUM,      /* O(i) +=! e */
  NF_RED_PROD,     /* O(i) *=! e */
  NF_RED_MAX,      /* O(i) max=! e */
  NF_RED_MIN       /* O(i) min=! e */
} nf_redop;

/* Statement flags (for later stages; the interpreter ignores them). */
#define NF_STMT_SCATTER 1u /* autodiff: scatter-accumulate form */

typedef struct nf_stmt {
  uint32_t out; /* tensor id produced (LOCAL or OUTPUT) */
  uint8_t red;  /* nf_redop */
  uint8_t n_red;
  uint32_t flags;
  int64_t red_lo[NF_MAX_VARS];
  int64_t red_ext[NF_MAX_VARS]; /* >= 0; an empty range yields the identity */
  const nf_expr *rhs; /* dtype == out's dtype */
  const char *var_names[NF_MAX_VARS]; /* metadata; may be NULL */
} nf_stmt;

/* A graph: tensors, inputs and outputs in order, statements in order (each
 * tensor produced by exactly one statement that precedes its uses). */
typedef struct nf_graph {
  nf_ir_ctx *ctx;   /* not owned */
  const char *name; /* metadata */
  uint32_t n_tensors, n_stmts, n_inputs, n_outputs;
  nf_tensor *tensors;
  nf_stmt *stmts;
  uint32_t *inputs;  /* tensor ids */
  uint32_t *outputs; /* tensor ids */
} nf_graph;

/* Builder: a graph whose arrays grow from the context's arena. */
nf_graph *nf_graph_new(nf_ir_ctx *ctx, const char *name);
/* Adds a tensor (INPUT ones are also appended to inputs, OUTPUT ones to
 * outputs); returns its id or a negative status. */
int nf_graph_add_tensor(nf_graph *g, const char *name, nf_dtype t,
                        nf_tkind kind, int rank, const int64_t *shape);
/* Appends a copy of *s; returns NF_OK or a negative status. */
int nf_graph_add_stmt(nf_graph *g, const nf_stmt *s);
/* Structural validation of a graph from any source (tests, the wire): ids
 * in range, each non-input produced once before use, ranks and dtypes
 * agree, variables in range, sizes non-negative with products that fit in
 * int64, every right side at most NF_MAX_EXPR_DEPTH nodes tall.  Never
 * recurses.  Writes a message to err (may be NULL) and returns NF_EINVAL
 * on the first problem. */
int nf_graph_validate(const nf_graph *g, nf_buf *err);
/* Number of elements of tensor t, or -1 on overflow. */
int64_t nf_tensor_numel(const nf_tensor *t);

/* ---- checks against absurd or hostile graphs (ir_check.c) ---- */

/* What one evaluation of a graph costs, for the daemon's caps. */
typedef struct nf_graph_cost {
  double elements;     /* every tensor's element count, summed */
  double flops;        /* float operations of one evaluation: an upper
                          bound (every point of every statement's box, both
                          branches of every select, one per float operator
                          and per reduction step, at least one per point) */
  uint32_t flops_stmt; /* the statement that costs the most */
  uint32_t depth;      /* the tallest right side once every producer a
                          schedule may inline (a LOCAL tensor defined
                          without a reduction) is substituted at its
                          accesses: an upper bound of the expression depth
                          the code generator sees */
  uint32_t depth_stmt; /* the statement with that depth */
} nf_graph_cost;

/* Fills *out for g, which nf_graph_validate accepted.  Iterative; time
 * linear in the nodes each statement reaches.  NF_OK or NF_ENOMEM. */
int nf_graph_measure(const nf_graph *g, nf_graph_cost *out);

/* Checks every access of g (validated) against its tensor's shape, under
 * the guards of the selects it sits in (a select is lazy, so an access
 * needs to be in bounds only where its guards hold):
 *  - an index proven in bounds by interval arithmetic (nf_expr_bounds)
 *    refined by the guards' linear facts is fine;
 *  - an index that reads a tensor (a gather) is left to the run time, as
 *    the interpreter checks it per element and compiled code clamps it;
 *  - otherwise the statement is evaluated at a few points of its box
 *    (the corners that push the index out, or every point of a small
 *    box), with the interpreter's rules: a point where the access is
 *    certainly evaluated (its guards hold whatever the data) with an index
 *    outside the tensor means every evaluation of g fails, and g is
 *    refused with NF_EINVAL and a message naming the statement, the
 *    access, the index and the point ("statement 0 (C): A(v0 + 1000, v2)
 *    reads out of bounds: index 0 is 1000 at v0=0, v1=0, v2=0; A has
 *    size 8 in dimension 0");
 *  - an index neither proven nor caught so is accepted: such a graph may
 *    well be valid, and the code generator, which proves bounds on the
 *    loop program with more facts, refuses what it cannot prove.
 * Never recurses beyond a small fixed depth.  NF_OK, NF_EINVAL (message
 * appended to err, may be NULL), NF_ENOMEM. */
int nf_graph_check_bounds(const nf_graph *g, nf_buf *err);

/* ---- canonical encoding and hashing ---- */

/* Appends the canonical binary encoding of g to out: versioned, names
 * excluded, variables by position, tensors numbered canonically (inputs in
 * input order, then each statement's output in statement order, whatever
 * their ids), expressions as a DAG in first-visit order.  Equal encodings
 * <=> structurally equal graphs. */
int nf_graph_encode(const nf_graph *g, nf_buf *out);
/* SHA-256 of the canonical encoding (32 bytes). */
int nf_graph_hash(const nf_graph *g, uint8_t digest[32]);
/* Lower-case hex of a 32-byte digest into hex[65]. */
void nf_hash_hex(const uint8_t digest[32], char hex[65]);

/* ---- index arithmetic ---- */

/* Affine normal form: c + sum(coef[k] * var[k]), var[] strictly increasing,
 * no zero coefficients. */
typedef struct nf_affine {
  int n;
  uint32_t var[NF_MAX_VARS];
  int64_t coef[NF_MAX_VARS];
  int64_t c;
} nf_affine;

/* Returns 1 and fills *out when e (an integer expression) is affine in the
 * index variables (built from VAR, integer CONST, +, -, unary -, and * by a
 * constant), 0 when it is not (or has more than NF_MAX_VARS variables),
 * NF_EOVERFLOW when a coefficient overflows, NF_ENOMEM. */
int nf_expr_affine(const nf_expr *e, nf_affine *out);
/* Builds the canonical i64 expression of an affine form: terms in variable
 * order, then the constant. */
const nf_expr *nf_affine_expr(nf_ir_ctx *ctx, const nf_affine *a);

/* Inclusive interval of an index variable. */
typedef struct nf_range {
  int64_t lo, hi;
} nf_range;

/* Interval bounds of an integer (or bool: 0/1) expression given intervals
 * for its variables (ranges[v] for VAR v, n_vars entries).  Returns 1 and
 * sets *out when bounded; 0 when unknown (tensor values, overflow, a
 * variable without range).  Sound: every value e takes lies in *out. */
int nf_expr_bounds(const nf_expr *e, const nf_range *ranges, int n_vars,
                   nf_range *out);

/* Simplifies e: folds constants (integer arithmetic with overflow checks:
 * an overflowing fold is left unfolded), puts integer affine subterms in
 * normal form, removes identities (x+0, x*1, x-x for integers, select of a
 * constant condition, double negation, casts to the same type), and uses
 * ranges (may be NULL) to drop `//` and `%` that cannot change their
 * operand and to decide comparisons.  Floating-point expressions are only
 * rewritten in ways exact in IEEE arithmetic. */
const nf_expr *nf_simplify(nf_ir_ctx *ctx, const nf_expr *e,
                           const nf_range *ranges, int n_vars);

/* Calls fn on e and every sub-expression once (post-order, DAG-aware).
 * Returns NF_OK, or NF_ENOMEM when its scratch memory ran out (the walk
 * then stopped early). */
int nf_expr_visit(const nf_expr *e,
                   void (*fn)(const nf_expr *e, void *user), void *user);

#endif
