/* nf_loop.h - the loop IR: what lowering produces and the backends
 * consume (internal to daemon/codegen).
 *
 * A loop program is a tree of statements over buffers:
 *  - LOOP  for (var = 0; var < extent; var++) body, where extent is a
 *          constant >= 0 and kind says how the backend realises it:
 *          SERIAL, PARALLEL (outlined, run through the kernel ABI's
 *          parallel_for; only loops not nested in another PARALLEL loop),
 *          VECTOR (the body is evaluated on `extent` lanes at once as
 *          explicit vectors; extent is the vector width, 2..64; only
 *          innermost loops whose body holds no other loop), UNROLL (fully
 *          unrolled; extent <= 64), BLOCK and THREAD (GPU programs only:
 *          the loop's iterations are CUDA blocks or threads of one
 *          launch; the BLOCK loops of a nest are its outermost loops, its
 *          THREAD loops follow them directly; neither is nested in a
 *          PARALLEL loop; the CPU backend rejects both, the interpreter
 *          nf__loop_eval runs them in order).
 *  - STORE buffer[idx...] op= value, where op is NF_RED_NONE (plain
 *          store) or a reduction operator applied to the current content
 *          (load, combine, store).  Index and value are expressions.
 *  - IF    if (cond) body: a guard produced by splits of non-dividing
 *          extents and by bound inference.
 *  - SEQ   the children in order.
 *  - ALLOC a temporary buffer (e.g. a cache_write tile, an intermediate
 *          tensor) live for the body: the backend puts small ones on the
 *          stack (or in registers) and large ones on the heap.
 *
 * Expressions are nf_expr (nf_ir.h) built in the program's context:
 * NF_OP_VAR u.var is a loop variable (ids are program-wide and unique per
 * LOOP), NF_OP_ACCESS u.tensor is a buffer id with one i64 index
 * expression per dimension of the buffer (row-major).  Every other
 * operator keeps the IR's semantics (lazy selects included: a backend
 * must not load a select's untaken branch out of bounds; it may compute
 * both branches only where both are safe to evaluate).
 *
 * Invariant established by lowering and checked by nf__loop_validate:
 * every access and store index is within its buffer's shape for every
 * value of the enclosing loop variables that passes the enclosing IFs. */
#ifndef NF_LOOP_H
#define NF_LOOP_H

#include "nf_buf.h"
#include "nf_ir.h"

typedef enum nf_loop_kind {
  NF_LOOP_SERIAL = 0,
  NF_LOOP_PARALLEL,
  NF_LOOP_VECTOR,
  NF_LOOP_UNROLL,
  NF_LOOP_BLOCK,
  NF_LOOP_THREAD
} nf_loop_kind;

typedef enum nf_lstmt_kind {
  NF_LS_LOOP = 0,
  NF_LS_STORE,
  NF_LS_IF,
  NF_LS_SEQ,
  NF_LS_ALLOC
} nf_lstmt_kind;

typedef enum nf_buf_kind {
  NF_BUF_INPUT = 0, /* kernel argument (read only) */
  NF_BUF_OUTPUT,    /* kernel argument (written) */
  NF_BUF_TEMP       /* allocated by an ALLOC statement */
} nf_buf_kind;

typedef struct nf_lbuf {
  const char *name;
  uint8_t dtype, kind, rank;
  int64_t shape[NF_MAX_RANK];
  int32_t arg; /* INPUT/OUTPUT: position in nf_kernel_args.buffers */
} nf_lbuf;

typedef struct nf_lstmt nf_lstmt;
struct nf_lstmt {
  uint8_t kind; /* nf_lstmt_kind */
  /* LOOP */
  uint32_t var;
  int64_t extent;
  uint8_t loop_kind; /* nf_loop_kind */
  const char *var_name;
  /* STORE */
  uint32_t buf;
  int n_idx;
  const nf_expr *idx[NF_MAX_RANK];
  const nf_expr *value;
  uint8_t op; /* nf_redop */
  /* IF */
  const nf_expr *cond;
  /* LOOP, IF, ALLOC: body; SEQ: children */
  int n_body;
  nf_lstmt **body;
};

typedef struct nf_lprog {
  nf_ir_ctx *ctx; /* owns the expressions and every node (arena) */
  const char *name;
  uint32_t n_bufs, n_args, n_vars;
  nf_lbuf *bufs;
  nf_lstmt *root; /* a SEQ */
} nf_lprog;

/* Checks the structural rules above and proves every index in bounds
 * (nf_expr_bounds with the loop ranges, refined by enclosing IF
 * conditions of the form affine <cmp> constant); appends the first
 * problem to err.  Returns NF_OK or NF_EINVAL. */
int nf__loop_validate(const nf_lprog *p, nf_buf *err);
/* Appends a readable C-like listing. */
void nf__loop_print(const nf_lprog *p, nf_buf *out);
/* Evaluates a program on host buffers (double for float buffers, int64
 * for integer/bool ones, like the reference interpreter's f64 mode):
 * the semantic oracle for lowering, independent of any backend. */
int nf__loop_eval(const nf_lprog *p, void *const *args, nf_buf *err);

#endif
