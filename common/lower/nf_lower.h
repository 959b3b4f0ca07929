/* nf_lower.h - schedules and lowering of graphs to the loop IR.
 *
 * A schedule is a versioned list of primitives, each applied in order to
 * one statement's loop nest (docs/schedules.md has the text format).  A
 * statement's initial nest is one loop per index variable: the output's
 * variables outermost in order, then the reduction variables in order.
 * Loops are named after the statement's variable names (var_names, or
 * v<k> where a name is missing or repeated); split(x, f) yields x.o and
 * x.i, fuse(a, b) yields a.b.fused.
 *
 * Lowering applies the schedule and yields an nf_lprog (nf_loop.h) that
 * nf__loop_validate accepts.  An illegal schedule (unknown statement or
 * loop, factor <= 0, vectorize of a loop that is not innermost, parallel
 * of a loop that is not outermost, primitives that would race on a
 * reduction, ...) is rejected with a message: never miscompiled.
 *
 * Summation order: lowering keeps each output element's reduction order
 * (the IR's lexicographic order) unless a reorder swaps two loops derived
 * from reduction variables; nf_lower_info.reassociated says so.
 *
 * Ownership: schedules are malloc'd and freed with nf_schedule_free; a
 * lowered program and everything it points to live in the nf_ir_ctx
 * passed to nf_lower (freed with it). */
#ifndef NF_LOWER_H
#define NF_LOWER_H

#include <stdint.h>

#include "nf_buf.h"
#include "nf_ir.h"
#include "nf_loop.h"

#define NF_SCHEDULE_VERSION 1
#define NF_SCHED_MAX_NAMES 24 /* loop names of one primitive */
#define NF_SCHED_NAME 64      /* bytes of a name, NUL included */

typedef enum nf_sched_kind {
  NF_SCH_SPLIT = 0,    /* names[0], factor */
  NF_SCH_REORDER,      /* names[0..n_names) */
  NF_SCH_FUSE,         /* names[0], names[1] (adjacent, outer first) */
  NF_SCH_PARALLEL,     /* names[0] */
  NF_SCH_VECTORIZE,    /* names[0] */
  NF_SCH_UNROLL,       /* names[0] */
  NF_SCH_INLINE,       /* compute_inline: the statement itself */
  NF_SCH_COMPUTE_AT,   /* consumer stmt2, loop names[0] (of stmt2's nest) */
  NF_SCH_CACHE_WRITE,  /* loop names[0] */
  NF_SCH_CACHE_READ,   /* input names[1], loop names[0] */
  NF_SCH_RFACTOR,      /* reduction loop names[0] (with cache_write) */
  NF_SCH_BIND_BLOCK,   /* names[0]: iterations are GPU blocks */
  NF_SCH_BIND_THREAD,  /* names[0]: iterations are GPU threads of a block */
  NF_SCH_N_KINDS
} nf_sched_kind;

/* One primitive.  stmt is the statement's index, or -1 when stmt_name (an
 * output tensor name) names it, resolved against the graph when lowering. */
typedef struct nf_sched_item {
  uint8_t kind; /* nf_sched_kind */
  int32_t stmt, stmt2;
  char stmt_name[NF_SCHED_NAME], stmt2_name[NF_SCHED_NAME];
  int n_names;
  char names[NF_SCHED_MAX_NAMES][NF_SCHED_NAME];
  int64_t factor;
  int line, col; /* source position when parsed (0 otherwise) */
} nf_sched_item;

/* A schedule.  Read-only for callers; build it with the functions below. */
typedef struct nf_schedule {
  int version;
  int64_t n_stmts; /* the graph's statement count it was made for; -1: any */
  int acc_regs;    /* made by nf_schedule_default_for: the accumulator
                      registers of its target (8 or 16); 0: parsed */
  int n_items, cap_items;
  nf_sched_item *items;
} nf_schedule;

/* Parses the text format; name is used in messages ("name:line:col: ...").
 * Returns NF_OK and a new schedule in *out, or NF_ESYNTAX (or NF_ENOMEM)
 * with a message appended to err.  Loop names are checked when lowering. */
int nf_schedule_parse(const char *text, const char *name, nf_schedule **out,
                      nf_buf *err);
/* Appends the canonical text of s (parsing it gives an equal schedule). */
void nf_schedule_print(const nf_schedule *s, nf_buf *out);
/* A new, empty schedule for any graph; NULL when out of memory. */
nf_schedule *nf_schedule_new(void);
/* Appends a copy of *it; NF_OK or NF_ENOMEM. */
int nf_schedule_add(nf_schedule *s, const nf_sched_item *it);
void nf_schedule_free(nf_schedule *s);

/* What the default CPU schedule knows of the machine it is made for:
 * its vector registers (32 with AVX-512, whose tiles then keep 16
 * accumulators; 16 with AVX2, 8 accumulators). */
typedef struct nf_sched_target {
  int vector_regs; /* 16 or 32; anything but 32 counts as 16 */
} nf_sched_target;

/* The target of a feature list: LLVM's ("+avx2,+avx512f,...") or the
 * host description of common/nf_target.h ("... avx512f avx2 ..."); NULL
 * or empty: 16 registers. */
nf_sched_target nf_sched_target_of(const char *features);
/* The CPU this process runs on: for the tools and tests that compile for
 * the machine they run on.  The daemon takes its compile target's
 * (nf_cpu_sched_target, daemon/codegen/nf_codegen.h). */
nf_sched_target nf_sched_target_host(void);

/* The tier-1 default schedule of g for target t (lower.c; no search):
 * inline single-use elementwise producers, the product tile for a sum of
 * one product of two plain accesses (sched_gemm.c), register-tile other
 * matmul-shaped reductions (8 x 16, reduction outside the tile,
 * cache_write), fuse an elementwise epilogue into that tile (compute_at),
 * stencil and weight-gradient tiles, parallel outer loop, vectorized
 * inner loop (docs/schedules.md).  Where a stencil, weight-gradient or
 * padded-plane schedule was chosen, the whole program is lowered once to
 * check it, and the plain schedule is taken if that fails. */
int nf_schedule_default_for(const nf_graph *g, const nf_sched_target *t, nf_schedule **out);
/* The same for nf_sched_target_host(). */
int nf_schedule_default(const nf_graph *g, nf_schedule **out);
/* The tier-1 GPU schedule of g (bind_block / bind_thread; one thread per
 * output element, blocks of `block` threads, 256 when out of 32..1024):
 * docs/schedules.md.  For the CUDA backend (nf_cuda.h). */
int nf_schedule_default_gpu(const nf_graph *g, int block, nf_schedule **out);
#define NF_GPU_DEFAULT_THREADS 256 /* the block size of the tier-1 GPU kernels */

/* The knobs of one statement's GPU schedule (the search's GPU space,
 * nf_search.h); 0 everywhere is the tier-1 choice:
 *  - block: threads per block of a one-thread-per-output nest, and of a
 *    block reduction to a scalar (32..1024; else 256);
 *  - tiled: a reduction's form: 0 the default's, 1 shared-memory tiles
 *    (where the default takes them), 2 one block per output whose
 *    threads share the terms (a reduction across threads), -1 one thread
 *    per output;
 *  - tile_i, tile_j: outputs per block along the last two output
 *    dimensions (default 32, or 16 for an extent under 32);
 *  - thr_i, thr_j: outputs per thread along them (default 2, 2): the
 *    block has (tile_i / thr_i) x (tile_j / thr_j) threads;
 *  - kt: reduction terms per shared-memory stage (default 16);
 *  - stage: 0 stages the operands in shared memory, -1 reads them from
 *    global memory;
 *  - vthread: virtual threads (0 or 1: none): along each of the two
 *    dimensions the block's tile is dealt to its threads in vthread
 *    interleaved chunks, each thread taking thr / vthread consecutive
 *    outputs in each chunk of tile / vthread (neighbouring threads read
 *    neighbouring rows of the staged operands); still thr_i x thr_j
 *    outputs per thread in a compact register tile.  Along a dimension
 *    where vthread does not divide thr and tile (or thr does not divide
 *    tile) the largest of vthread / 2, vthread / 4, ... that does is
 *    taken, down to none. */
typedef struct nf_gpu_knobs {
  int block, tiled, tile_i, tile_j, thr_i, thr_j, kt, stage, vthread;
  int vec; /* -1: no vector loop over a thread's outputs along j */
} nf_gpu_knobs;

/* The GPU schedule of g with knobs kn (g->n_stmts entries; NULL: all 0).
 * A schedule is not checked here: lowering and nf_cuda_emit refuse one
 * over the limits of threads or shared memory. */
int nf_schedule_gpu(const nf_graph *g, const nf_gpu_knobs *kn, nf_schedule **out);
/* Which GPU form the default gives statement si: 1 shared-memory tiles (a
 * reduction over 2-d outputs of at least 16 x 16), 2 a block reduction
 * (to a scalar, at least 512 terms), 3 one block per output with its
 * threads sharing the terms (at least 512 terms, at most 65536 outputs
 * and 8 terms per output or more), 0 one thread per output (or
 * inlined). */
int nf_schedule_gpu_tileable(const nf_graph *g, uint32_t si);
/* A random legal schedule of g from seed (for tests and search): every
 * primitive is kept only if lowering accepts it. */
int nf_schedule_random(const nf_graph *g, uint64_t seed, nf_schedule **out);

typedef struct nf_lower_info {
  int reassociated; /* some reduction's order of accumulation changed */
} nf_lower_info;

/* Lowers g with schedule s (NULL: nf_schedule_default) into a program
 * built in ctx (which may be g->ctx or another context; the program lives
 * until ctx is freed).  Buffers: inputs (arg = input position), outputs
 * (arg = n_inputs + output position), then temporaries.  Returns NF_OK,
 * NF_EINVAL for an illegal schedule or one made for another graph,
 * NF_ELIMIT when a tile or region is too large, NF_EUNSUPPORTED for a
 * graph lowering cannot handle (an output that is also an input),
 * NF_ENOMEM; the message goes to err. */
int nf_lower(const nf_graph *g, const nf_schedule *s, nf_ir_ctx *ctx,
             nf_lprog **out, nf_buf *err);
/* Same, and fills *info (may be NULL). */
int nf_lower_ex(const nf_graph *g, const nf_schedule *s, nf_ir_ctx *ctx,
                nf_lprog **out, nf_lower_info *info, nf_buf *err);

/* Internal (schedule.c, lower.c): the loop name of variable k of s:
 * var_names[k] when set and unique within s, else "v<k>". */
void nf__sched_var_name(const nf_stmt *s, int k, char out[NF_SCHED_NAME]);
/* Internal (schedule.c, daemon/search): whether tensor t is read exactly
 * once in g (one access in one statement); whether the default schedule
 * inlines statement si (an elementwise local statement read once). */
int nf__sched_used_once(const nf_graph *g, uint32_t t);
/* dst = a followed by suffix, cut to a loop name (NF_SCHED_NAME bytes). */
void nf__sched_cat(char *dst, const char *a, const char *suffix);
int nf__sched_inlined_by_default(const nf_graph *g, uint32_t si);
/* Internal (the policies): whether expression e uses index variable v. */
int nf__sched_uses_var(const nf_expr *e, uint32_t v);
/* Internal (lower.c): the default schedule of g for t without the check
 * by lowering (schedule.c): use_stencil 0 takes the plain schedules
 * only; *n_stencil counts the statements given a stencil,
 * weight-gradient or padded-plane schedule. */
int nf__sched_default_plain(const nf_graph *g, const nf_sched_target *t, int use_stencil,
                            int *n_stencil, nf_schedule **out);
/* Internal (lower.c): the GPU default without the check by lowering:
 * tiled 0 takes the one-thread-per-output schedules only; *n_tiled
 * counts the statements given shared-memory tiles. */
int nf__sched_gpu_plain(const nf_graph *g, int block, int tiled, const nf_gpu_knobs *kn,
                        int *n_tiled, nf_schedule **out);
/* Internal (schedule.c, sched_gemm.c): the accumulator registers the
 * default's tiles may fill (s->acc_regs: 16 where the target has
 * AVX-512's 32 vector registers, else 8); appending one primitive of one
 * name and factor, or of two names (fuse a b; cache_read: loop a, tensor
 * b), NF_OK or NF_ENOMEM; the reduction variables of st but skip in the
 * order of the outermost dimension each indexes (ord[], their count). */
int nf__sched_acc_regs(const nf_schedule *s);
int nf__sched_add1(nf_schedule *s, int st, int kind, const char *a, int64_t f);
int nf__sched_add2(nf_schedule *s, int st, int kind, const char *a, const char *b);
int nf__sched_red_order(const nf_stmt *st, int rank, int skip, int *ord);
/* Internal (sched_gemm.c): the default's tile for a sum of one product of
 * two plain accesses (docs/schedules.md, "product tile"): appending it
 * for statement st_i whose loop names are nm (1), 0 where it does not
 * apply, or NF_ENOMEM. */
int nf__sched_gemm(nf_schedule *s, const nf_graph *g, int st_i, char nm[][NF_SCHED_NAME]);
/* ... and for such a product prod with an elementwise epilogue cons
 * (read once, at its own indices): part 0 appends the product's items
 * (computed panel by panel at the epilogue's loop), part 1 the
 * epilogue's (the product's outer loops and tile); 1, 0 where prod takes
 * no product tile, or NF_ENOMEM. */
int nf__sched_gemm_fused(nf_schedule *s, const nf_graph *g, int prod, int cons, int part);
/* Internal (tests): the product tile's cache budgets divided by d (0 or
 * 1: as they are), so that small products get blocked reductions. */
void nf__sched_gemm_set_budget_div(int d);

#endif
