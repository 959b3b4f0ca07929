/* features.c - the cost model's feature vector of a lowered program
 * (nf_features.h), in the spirit of Ansor's per-store loop-nest features.
 *
 * Two walks over the statement tree.  The first counts loops, stores,
 * guards and allocations, the executed iterations and float operations
 * of every store, and keeps the NF_FEAT_STORES heaviest stores (most
 * executed iterations; ties go to the earlier store, so the choice is
 * deterministic).  The second walk stops at those stores and describes
 * each with the loop stack around it: arithmetic per iteration, the
 * annotations of the enclosing loops, the stride kind of every access
 * along the innermost loop, and per loop level (innermost outwards) the
 * bytes the store's accesses touch during one execution of that loop and
 * the arithmetic intensity there.
 *
 * Footprints come from intervals of the index expressions with the
 * variables of the loops at or inside the level ranging over their
 * extents and the outer ones fixed at 0; the boxes of one buffer's
 * accesses are joined, each side clamped to the buffer's shape (an index
 * without a bound counts the whole dimension).  Intervals and strides are
 * computed here by small allocation-free recursions rather than with
 * nf_expr_bounds / nf_expr_affine, which allocate a memo per call: the
 * search extracts features of thousands of candidates.  Both recursions
 * have a node budget, so a huge shared DAG degrades to "unknown" rather
 * than to exponential time.
 *
 * Limits: guards are not evaluated (a guarded store counts every
 * iteration of its loops); features look at one store at a time, so two
 * stores sharing a loop do not add up their footprints; loop nests deeper
 * than FEAT_MAX_DEPTH are rejected (NF_EINVAL). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nf_features.h"

#define FEAT_MAX_DEPTH 128 /* enclosing loops, IFs and ALLOCs of a store */
#define FEAT_SET_CAP 1024  /* distinct expression nodes visited per store */
#define FEAT_MAX_ACC 64    /* distinct accesses described per store */
#define FEAT_BUDGET 4096   /* nodes one interval/stride recursion may visit */

/* ---- names ----
 *
 * Per store s0..s3 (heaviest first; zeros when the program has fewer):
 *   iters        log2(1 + executed iterations: product of enclosing extents)
 *   flops        float operations per iteration (reduction combine included)
 *   flops_total  log2(1 + iters * flops)
 *   math         transcendental ops per iteration (exp, log, sqrt, tanh, ...)
 *   intops       integer ops per iteration (indices and value)
 *   divmod       integer // and % per iteration
 *   select       comparisons, logical ops and selects per iteration
 *   reduce       1 when the store combines (+=, max=, ...)
 *   depth        enclosing loops
 *   inner_ext    log2(1 + extent of the innermost enclosing loop)
 *   vec          width of the enclosing VECTOR loop (0: none)
 *   unroll       log2 of the product of enclosing UNROLL extents
 *   par          log2(1 + extent of the enclosing PARALLEL loop)
 *   par_eff8/32  extent / (rounds * threads) for 8 and 32 threads (0: none)
 *   guards       enclosing IFs
 *   n_contig, n_bcast, n_strided
 *                accesses (loads and the store) whose element stride along
 *                the innermost loop is 1, 0, or anything else/unknown
 *   store_kind   the store's own stride kind: 0 bcast, 1 contig, 2 other
 *   tile_bytes   log2(1 + bytes of the innermost enclosing ALLOC)
 *   alloc_bytes  log2(1 + bytes of all enclosing ALLOCs)
 *   n_bufs       distinct buffers the store touches
 *   bytes_l<k>   log2(1 + bytes touched by one execution of the k-th
 *                enclosing loop, innermost k = 0); 0 past the depth
 *   ai_l<k>      log2(1 + flops inside that loop) - bytes_l<k>
 * Program: log2(1 + count) of loops, stores, IFs, ALLOCs; parallel loops;
 * the deepest loop nest; log2(1 + temporary bytes), of total flops and of
 * total store iterations; the fractions of store iterations inside VECTOR
 * loops, PARALLEL loops and IFs.
 *
 * GPU (zero unless the program binds loops to blocks or threads; the
 * launch is the top-level nest that holds the heaviest store, realised
 * as one kernel by the CUDA backend):
 *   g.gpu          1 for a GPU program
 *   g.launches     log2(1 + top-level nests: kernel launches)
 *   g.grid, g.block
 *                  log2 of the launch's blocks and threads per block (a
 *                  nest without bound loops: spread over blocks of 256
 *                  threads, as the backend does with elementwise nests)
 *   g.warp_eff     threads / threads rounded up to a warp (32)
 *   g.occupancy    resident threads per multiprocessor / 2048, from the
 *                  limits of an sm_80-class device: 32 blocks, 2048
 *                  threads, 164 KiB of shared memory and 64 Ki registers
 *                  (32 a thread plus its local tiles in registers)
 *   g.shared       log2(1 + shared bytes per block: temporaries inside
 *                  block loops, outside thread loops)
 *   g.local        log2(1 + bytes of a thread's own temporaries)
 *   g.thread_iters log2(1 + the heaviest store's iterations per thread)
 *   g.coalesced, g.bcast, g.strided
 *                  fractions of that store's accesses (the store
 *                  included) whose element stride between neighbouring
 *                  threads (the innermost thread loop) is 1, 0, other
 *   g.unbound_frac store iterations outside block and thread loops
 *   g.syncs        log2(1 + shared temporaries of the launch: each is
 *                  filled, then read, behind a barrier) */

#define LEVEL_NAMES(S, L) S "bytes_l" #L, S "ai_l" #L
#define STORE_NAMES(S)                                                          \
  S "iters", S "flops", S "flops_total", S "math", S "intops", S "divmod",      \
      S "select", S "reduce", S "depth", S "inner_ext", S "vec", S "unroll",    \
      S "par", S "par_eff8", S "par_eff32", S "guards", S "n_contig",           \
      S "n_bcast", S "n_strided", S "store_kind", S "tile_bytes",               \
      S "alloc_bytes", S "n_bufs", LEVEL_NAMES(S, 0), LEVEL_NAMES(S, 1),        \
      LEVEL_NAMES(S, 2), LEVEL_NAMES(S, 3), LEVEL_NAMES(S, 4), LEVEL_NAMES(S, 5)

/* Per-store feature offsets (in STORE_NAMES order). */
enum {
  SF_ITERS = 0, SF_FLOPS, SF_FLOPS_TOTAL, SF_MATH, SF_INTOPS, SF_DIVMOD,
  SF_SELECT, SF_REDUCE, SF_DEPTH, SF_INNER_EXT, SF_VEC, SF_UNROLL, SF_PAR,
  SF_PAR_EFF8, SF_PAR_EFF32, SF_GUARDS, SF_N_CONTIG, SF_N_BCAST,
  SF_N_STRIDED, SF_STORE_KIND, SF_TILE_BYTES, SF_ALLOC_BYTES, SF_N_BUFS,
  SF_LEVELS, /* bytes_l0, ai_l0, bytes_l1, ... */
  SF_N = SF_LEVELS + 2 * NF_FEAT_LEVELS
};

enum {
  XF_GPU = 0, XF_LAUNCHES, XF_GRID, XF_BLOCK, XF_WARP_EFF, XF_OCCUPANCY, XF_SHARED, XF_LOCAL,
  XF_THREAD_ITERS, XF_COALESCED, XF_BCAST, XF_STRIDED, XF_UNBOUND_FRAC, XF_SYNCS, XF_N
};

enum {
  GF_N_LOOPS = 0, GF_N_STORES, GF_N_IFS, GF_N_ALLOCS, GF_N_PAR, GF_MAX_DEPTH,
  GF_TEMP_BYTES, GF_FLOPS, GF_ITERS, GF_VEC_FRAC, GF_PAR_FRAC, GF_GUARD_FRAC,
  GF_N
};

static const char *const feat_names[] = {
    STORE_NAMES("s0."), STORE_NAMES("s1."), STORE_NAMES("s2."), STORE_NAMES("s3."),
    "n_loops", "n_stores", "n_ifs", "n_allocs", "n_parallel", "max_depth",
    "temp_bytes", "flops", "iters", "vec_frac", "par_frac", "guard_frac",
    "g.gpu", "g.launches", "g.grid", "g.block", "g.warp_eff", "g.occupancy", "g.shared",
    "g.local", "g.thread_iters", "g.coalesced", "g.bcast", "g.strided", "g.unbound_frac",
    "g.syncs",
};

_Static_assert(NF_FEAT_STORES == 4, "feat_names lists four stores");
_Static_assert(NF_FEAT_LEVELS == 6, "STORE_NAMES lists six levels");
_Static_assert(sizeof feat_names / sizeof feat_names[0] == NF_FEAT_N,
               "one name per feature");
_Static_assert(NF_FEAT_STORES * SF_N + GF_N + XF_N == NF_FEAT_N, "feature layout");
_Static_assert(XF_N == NF_FEAT_GPU, "GPU feature count");

const char *nf_feature_name(int i) {
  return i >= 0 && i < NF_FEAT_N ? feat_names[i] : "";
}

/* ---- expression helpers ---- */

/* log2(1 + x), 0 for x <= 0 or NaN, capped for absurd (infinite) counts:
 * every feature stays finite. */
static double lg(double x) {
  if (!(x > 0)) return 0.0;
  double r = log2(1.0 + x);
  return isfinite(r) ? r : 1024.0;
}

static double frac(double a, double b) {
  double r = b > 0 ? a / b : 0.0;
  return isfinite(r) ? r : 0.0;
}

/* Interval of an integer index expression; ok = 0 when unknown. */
typedef struct iv {
  int ok;
  int64_t lo, hi;
} iv;

static const iv iv_unknown = {0, 0, 0};

static iv mkiv(int64_t lo, int64_t hi) {
  iv r = {1, lo, hi};
  return r;
}

static int64_t floordiv64(int64_t a, int64_t b) { /* floor division, b > 0 */
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Bounds of e given ranges (lo/hi per variable id; n_vars entries); the
 * subset of nf_expr_bounds that index expressions use.  *budget counts
 * visited nodes down. */
static iv ivx(const nf_expr *e, const nf_range *r, uint32_t n_vars, int *budget) {
  if (--*budget < 0 || !nf_dtype_is_int((nf_dtype)e->dtype)) return iv_unknown;
  iv a = iv_unknown, b = iv_unknown;
  int64_t x[4];
  switch (e->op) {
  case NF_OP_CONST: return mkiv(e->u.i, e->u.i);
  case NF_OP_VAR:
    return e->u.var < n_vars ? mkiv(r[e->u.var].lo, r[e->u.var].hi) : iv_unknown;
  case NF_OP_CAST:
    return nf_dtype_is_int((nf_dtype)e->args[0]->dtype) ? ivx(e->args[0], r, n_vars, budget)
                                                        : iv_unknown;
  case NF_OP_NEG:
    a = ivx(e->args[0], r, n_vars, budget);
    if (!a.ok || a.lo == INT64_MIN) return iv_unknown;
    return mkiv(-a.hi, -a.lo);
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL:
  case NF_OP_MIN:
  case NF_OP_MAX:
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
    a = ivx(e->args[0], r, n_vars, budget);
    b = ivx(e->args[1], r, n_vars, budget);
    if (!b.ok) return iv_unknown;
    break;
  case NF_OP_SELECT: {
    iv c = ivx(e->args[1], r, n_vars, budget), d = ivx(e->args[2], r, n_vars, budget);
    if (!c.ok || !d.ok) return iv_unknown;
    return mkiv(c.lo < d.lo ? c.lo : d.lo, c.hi > d.hi ? c.hi : d.hi);
  }
  default: return iv_unknown;
  }
  /* binary */
  if (e->op == NF_OP_MOD && b.lo == b.hi && b.lo > 0) {
    if (a.ok && a.lo >= 0 && floordiv64(a.lo, b.lo) == floordiv64(a.hi, b.lo))
      return mkiv(a.lo % b.lo, a.hi % b.lo);
    return mkiv(0, (a.ok && a.lo >= 0 && a.hi < b.lo - 1) ? a.hi : b.lo - 1);
  }
  if (!a.ok) return iv_unknown;
  switch (e->op) {
  case NF_OP_ADD:
    if (__builtin_add_overflow(a.lo, b.lo, &x[0]) || __builtin_add_overflow(a.hi, b.hi, &x[1]))
      return iv_unknown;
    return mkiv(x[0], x[1]);
  case NF_OP_SUB:
    if (__builtin_sub_overflow(a.lo, b.hi, &x[0]) || __builtin_sub_overflow(a.hi, b.lo, &x[1]))
      return iv_unknown;
    return mkiv(x[0], x[1]);
  case NF_OP_MUL: {
    if (__builtin_mul_overflow(a.lo, b.lo, &x[0]) || __builtin_mul_overflow(a.lo, b.hi, &x[1]) ||
        __builtin_mul_overflow(a.hi, b.lo, &x[2]) || __builtin_mul_overflow(a.hi, b.hi, &x[3]))
      return iv_unknown;
    iv m = mkiv(x[0], x[0]);
    for (int k = 1; k < 4; k++) {
      if (x[k] < m.lo) m.lo = x[k];
      if (x[k] > m.hi) m.hi = x[k];
    }
    return m;
  }
  case NF_OP_MIN:
    return mkiv(a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi);
  case NF_OP_MAX:
    return mkiv(a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi);
  case NF_OP_FLOORDIV:
    if (b.lo != b.hi || b.lo <= 0) return iv_unknown;
    return mkiv(floordiv64(a.lo, b.lo), floordiv64(a.hi, b.lo));
  default: return iv_unknown;
  }
}

/* d e / d var: the change of e when var grows by one, when it is the same
 * constant everywhere.  Returns 1 and sets *d, or 0 when unknown. */
static int dvar(const nf_expr *e, uint32_t var, int *budget, int64_t *d) {
  int64_t da = 0, db = 0;
  if (--*budget < 0) return 0;
  switch (e->op) {
  case NF_OP_CONST: *d = 0; return 1;
  case NF_OP_VAR: *d = e->u.var == var; return 1;
  case NF_OP_NEG:
    if (!dvar(e->args[0], var, budget, &da) || da == INT64_MIN) return 0;
    *d = -da;
    return 1;
  case NF_OP_CAST: return dvar(e->args[0], var, budget, d);
  case NF_OP_ADD:
  case NF_OP_SUB:
    if (!dvar(e->args[0], var, budget, &da) || !dvar(e->args[1], var, budget, &db)) return 0;
    return e->op == NF_OP_ADD ? !__builtin_add_overflow(da, db, d)
                              : !__builtin_sub_overflow(da, db, d);
  case NF_OP_MUL:
    if (!nf_dtype_is_int((nf_dtype)e->dtype)) break;
    if (!dvar(e->args[0], var, budget, &da) || !dvar(e->args[1], var, budget, &db)) return 0;
    if (da == 0 && db == 0) {
      *d = 0;
      return 1;
    }
    if (db == 0 && e->args[1]->op == NF_OP_CONST)
      return !__builtin_mul_overflow(da, e->args[1]->u.i, d);
    if (da == 0 && e->args[0]->op == NF_OP_CONST)
      return !__builtin_mul_overflow(db, e->args[0]->u.i, d);
    return 0;
  default: break;
  }
  /* anything else is constant along var only if its arguments are */
  for (int k = 0; k < e->n_args; k++)
    if (!dvar(e->args[k], var, budget, &da) || da != 0) return 0;
  *d = 0;
  return 1;
}

/* ---- per-store counting ---- */

/* The distinct nodes of one store's value and indices (open addressing on
 * the node pointer; a generation stamp avoids clearing between stores). */
typedef struct nodeset {
  const nf_expr *key[FEAT_SET_CAP];
  uint32_t gen[FEAT_SET_CAP];
  uint32_t cur;
  int n;
} nodeset;

/* 1 when e was new and is now recorded; 0 when seen or the set is full. */
static int set_add(nodeset *s, const nf_expr *e) {
  if (s->n >= FEAT_SET_CAP * 3 / 4) return 0;
  uint64_t h = ((uint64_t)(uintptr_t)e >> 4) * 0x9e3779b97f4a7c15ull >> 7;
  for (uint64_t i = 0;; i++) {
    size_t k = (size_t)((h + i) & (FEAT_SET_CAP - 1));
    if (s->gen[k] != s->cur) {
      s->gen[k] = s->cur;
      s->key[k] = e;
      s->n++;
      return 1;
    }
    if (s->key[k] == e) return 0;
  }
}

typedef struct counts {
  double flops, math, intops, divmod, select;
  int n_acc;
  const nf_expr *acc[FEAT_MAX_ACC]; /* distinct ACCESS nodes, visit order */
} counts;

static void count_node(nodeset *s, counts *c, const nf_expr *e, int depth) {
  if (!e || depth > 512 || !set_add(s, e)) return;
  for (int k = 0; k < e->n_args; k++) count_node(s, c, e->args[k], depth + 1);
  nf_dtype t = (nf_dtype)e->dtype;
  int fl = nf_dtype_is_float(t);
  int fl_args = e->n_args > 0 && nf_dtype_is_float((nf_dtype)e->args[0]->dtype);
  switch (e->op) {
  case NF_OP_CONST:
  case NF_OP_VAR:
  case NF_OP_STOPGRAD:
  case NF_OP_CAST: break;
  case NF_OP_ACCESS:
    if (c->n_acc < FEAT_MAX_ACC) c->acc[c->n_acc++] = e;
    break;
  case NF_OP_EXP:
  case NF_OP_LOG:
  case NF_OP_SQRT:
  case NF_OP_RSQRT:
  case NF_OP_TANH:
  case NF_OP_SIGMOID:
  case NF_OP_ERF:
  case NF_OP_POW:
    c->flops++;
    c->math++;
    break;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
    if (fl) {
      c->flops++;
      c->math++;
    } else {
      c->intops++;
      c->divmod++;
    }
    break;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
  case NF_OP_AND:
  case NF_OP_OR:
  case NF_OP_NOT:
  case NF_OP_SELECT: c->select++; break;
  default:
    if (fl || fl_args)
      c->flops++;
    else
      c->intops++;
    break;
  }
}

/* Counts a store's value and indices (the reduction combine included). */
static void count_store(nodeset *s, counts *c, const nf_lprog *p, const nf_lstmt *st) {
  memset(c, 0, sizeof *c);
  s->cur++;
  if (s->cur == 0) { /* wrapped: forget every stamp */
    memset(s->gen, 0, sizeof s->gen);
    s->cur = 1;
  }
  s->n = 0;
  count_node(s, c, st->value, 0);
  for (int d = 0; d < st->n_idx && d < NF_MAX_RANK; d++) count_node(s, c, st->idx[d], 0);
  if (st->op != NF_RED_NONE) {
    if (st->buf < p->n_bufs && nf_dtype_is_float((nf_dtype)p->bufs[st->buf].dtype))
      c->flops++;
    else
      c->intops++;
  }
}

/* ---- the walks ---- */

typedef struct loopf {
  uint32_t var;
  int64_t ext;
  uint8_t kind;
} loopf;

typedef struct top {
  double iters;
  int order; /* store number in program order; -1: empty slot */
} top;

/* A launch: a top-level nest (reached from the root through SEQ and
 * ALLOC only), one kernel of the CUDA backend. */
typedef struct launch {
  double grid, block;   /* blocks; threads per block (its largest thread nest) */
  double shared, local; /* shared bytes per block; a thread's own bytes */
  double n_shared;      /* shared temporaries */
  int bound;            /* holds BLOCK or THREAD loops */
  int reduces;          /* holds a reduction's store */
} launch;

typedef struct walker {
  const nf_lprog *p;
  nf_range *rng; /* per variable id */
  nodeset *set;
  counts c;
  loopf loops[FEAT_MAX_DEPTH];
  int depth, n_ifs_in, n_allocs_in;
  uint32_t allocs[FEAT_MAX_DEPTH];
  int order; /* stores seen so far */
  int pass;  /* 1: totals and the heaviest stores; 2: describe them */
  int in_launch;
  launch cur; /* the launch being walked (pass 2) */
  /* pass 1 */
  double n_loops, n_stores, n_ifs, n_allocs, n_par, max_depth;
  double flops, iters, vec_iters, par_iters, guard_iters;
  double n_launches, unbound_iters;
  int gpu;
  top top[NF_FEAT_STORES];
  /* pass 2 */
  float *out;
} walker;

static double buf_bytes(const nf_lbuf *b) {
  double n = (double)nf_dtype_size((nf_dtype)b->dtype);
  for (int d = 0; d < b->rank && d < NF_MAX_RANK; d++) n *= (double)b->shape[d];
  return n;
}

static void top_insert(walker *w, double iters, int order) {
  int k = NF_FEAT_STORES;
  /* strictly heavier stores move up: ties keep program order */
  while (k > 0 && (w->top[k - 1].order < 0 || w->top[k - 1].iters < iters)) k--;
  if (k == NF_FEAT_STORES) return;
  memmove(&w->top[k + 1], &w->top[k], (size_t)(NF_FEAT_STORES - 1 - k) * sizeof w->top[0]);
  w->top[k].iters = iters;
  w->top[k].order = order;
}

/* Linear element stride of an access (indices idx over buffer b) along
 * var: 0, 1 or other (2; also when unknown). */
static int stride_kind(const nf_lprog *p, uint32_t b, int n_idx, const nf_expr *const *idx,
                       int has_loop, uint32_t var) {
  if (!has_loop) return 0;
  if (b >= p->n_bufs) return 2;
  const nf_lbuf *lb = &p->bufs[b];
  int64_t stride = 0, row = 1;
  for (int d = (n_idx < lb->rank ? n_idx : lb->rank) - 1; d >= 0; d--) {
    int budget = FEAT_BUDGET;
    int64_t dd, t;
    if (!dvar(idx[d], var, &budget, &dd)) return 2;
    if (__builtin_mul_overflow(dd, row, &t) || __builtin_add_overflow(stride, t, &stride))
      return 2;
    if (__builtin_mul_overflow(row, lb->shape[d] > 0 ? lb->shape[d] : 1, &row)) row = 0;
  }
  return stride == 0 ? 0 : stride == 1 ? 1 : 2;
}

/* Box of one buffer's accesses at one level. */
typedef struct box {
  uint32_t buf;
  int64_t lo[NF_MAX_RANK], hi[NF_MAX_RANK];
} box;

/* Joins access (b, idx) into boxes under the current ranges. */
static void box_add(const walker *w, box *bx, int *n_bx, uint32_t b, int n_idx,
                    const nf_expr *const *idx) {
  if (b >= w->p->n_bufs) return;
  const nf_lbuf *lb = &w->p->bufs[b];
  int rank = lb->rank < NF_MAX_RANK ? lb->rank : NF_MAX_RANK;
  int64_t lo[NF_MAX_RANK], hi[NF_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    int budget = FEAT_BUDGET;
    iv r = d < n_idx ? ivx(idx[d], w->rng, w->p->n_vars, &budget) : iv_unknown;
    int64_t top_ = lb->shape[d] > 0 ? lb->shape[d] - 1 : 0;
    lo[d] = r.ok && r.lo > 0 ? (r.lo < top_ ? r.lo : top_) : 0;
    hi[d] = r.ok && r.hi < top_ ? (r.hi > lo[d] ? r.hi : lo[d]) : top_;
  }
  int k = 0;
  while (k < *n_bx && bx[k].buf != b) k++;
  if (k == *n_bx) {
    if (*n_bx == FEAT_MAX_ACC + 1) return;
    (*n_bx)++;
    bx[k].buf = b;
    memcpy(bx[k].lo, lo, sizeof lo);
    memcpy(bx[k].hi, hi, sizeof hi);
    return;
  }
  for (int d = 0; d < rank; d++) {
    if (lo[d] < bx[k].lo[d]) bx[k].lo[d] = lo[d];
    if (hi[d] > bx[k].hi[d]) bx[k].hi[d] = hi[d];
  }
}

static double boxes_bytes(const walker *w, const box *bx, int n_bx) {
  double total = 0;
  for (int k = 0; k < n_bx; k++) {
    const nf_lbuf *lb = &w->p->bufs[bx[k].buf];
    double n = (double)nf_dtype_size((nf_dtype)lb->dtype);
    for (int d = 0; d < lb->rank && d < NF_MAX_RANK; d++)
      n *= (double)(bx[k].hi[d] - bx[k].lo[d] + 1);
    total += n;
  }
  return total;
}

/* Fills L from the nest at s: blocks and threads along each path (their
 * largest products), shared temporaries (inside block loops, outside
 * thread loops; 256-byte slices, as the backend places them) and a
 * thread's own (the largest sum along a path). */
static void launch_walk(const nf_lprog *p, const nf_lstmt *s, int in_block, int in_thread,
                        double blocks, double threads, double local, launch *L, int depth) {
  if (!s || depth > FEAT_MAX_DEPTH) return;
  if (s->kind == NF_LS_STORE && s->op != NF_RED_NONE) L->reduces = 1;
  if (s->kind == NF_LS_LOOP) {
    if (s->loop_kind == NF_LOOP_BLOCK) {
      blocks *= (double)s->extent;
      in_block = L->bound = 1;
    } else if (s->loop_kind == NF_LOOP_THREAD) {
      threads *= (double)s->extent;
      in_thread = L->bound = 1;
    }
  } else if (s->kind == NF_LS_ALLOC && s->buf < p->n_bufs) {
    double b = buf_bytes(&p->bufs[s->buf]);
    if (in_thread) {
      local += b;
    } else if (in_block) {
      L->shared += ceil(b / 256) * 256;
      L->n_shared++;
    }
  }
  if (blocks > L->grid) L->grid = blocks;
  if (threads > L->block) L->block = threads;
  if (local > L->local) L->local = local;
  for (int i = 0; i < s->n_body; i++)
    launch_walk(p, s->body[i], in_block, in_thread, blocks, threads, local, L, depth + 1);
}

/* The GPU features of store st (the heaviest) in launch w->cur. */
static void describe_gpu(walker *w, const nf_lstmt *st, double iters) {
  float *x = w->out + NF_FEAT_STORES * SF_N + GF_N;
  const launch *L = &w->cur;
  double grid = L->grid, block = L->block;
  if (!L->bound && L->reduces) { /* one thread (the backend's serial launch) */
    block = grid = 1;
  } else if (!L->bound) { /* an elementwise nest: spread over blocks of 256 threads */
    block = iters < 256 ? (iters > 1 ? iters : 1) : 256;
    grid = ceil(iters / block);
    if (grid > 65535) grid = 65535;
  }
  double warps = ceil(block / 32);
  x[XF_GRID] = (float)lg(grid);
  x[XF_BLOCK] = (float)lg(block);
  x[XF_WARP_EFF] = (float)frac(block, warps * 32);
  /* resident blocks per multiprocessor */
  double regs = 32 + ceil(L->local / 4);
  double bps = 32, lim;
  if ((lim = floor(2048 / (warps * 32))) < bps) bps = lim;
  if (L->shared > 0 && (lim = floor(167936 / L->shared)) < bps) bps = lim;
  if ((lim = floor(65536 / (regs * warps * 32))) < bps) bps = lim;
  double occ = frac(bps * warps * 32, 2048);
  x[XF_OCCUPANCY] = (float)(occ < 1 ? occ : 1);
  x[XF_SHARED] = (float)lg(L->shared);
  x[XF_LOCAL] = (float)lg(L->local);
  x[XF_THREAD_ITERS] = (float)lg(frac(iters, grid * block));
  x[XF_SYNCS] = (float)lg(L->n_shared);
  /* strides between neighbouring threads: along the innermost thread
   * loop (the backend's fastest-varying thread index), else (a spread
   * nest) the innermost loop */
  int k = w->depth - 1;
  while (k >= 0 && w->loops[k].kind != NF_LOOP_THREAD) k--;
  if (k < 0) k = w->depth - 1;
  int has = k >= 0;
  uint32_t var = has ? w->loops[k].var : 0;
  const nf_lprog *p = w->p;
  const counts *c = &w->c;
  double kinds[3] = {0, 0, 0};
  kinds[stride_kind(p, st->buf, st->n_idx, st->idx, has, var)]++;
  for (int a = 0; a < c->n_acc; a++)
    kinds[stride_kind(p, c->acc[a]->u.tensor, c->acc[a]->n_args, c->acc[a]->args, has, var)]++;
  double n = kinds[0] + kinds[1] + kinds[2];
  x[XF_COALESCED] = (float)frac(kinds[1], n);
  x[XF_BCAST] = (float)frac(kinds[0], n);
  x[XF_STRIDED] = (float)frac(kinds[2], n);
}

/* Pass 2: the features of store st (slot) under the current stack. */
static void describe(walker *w, const nf_lstmt *st, int slot) {
  const nf_lprog *p = w->p;
  float *o = w->out + slot * SF_N;
  counts *c = &w->c;
  double iters = 1, unroll = 1;
  int64_t vec = 0, par = 0;
  for (int k = 0; k < w->depth; k++) {
    iters *= (double)w->loops[k].ext;
    if (w->loops[k].kind == NF_LOOP_UNROLL) unroll *= (double)w->loops[k].ext;
    if (w->loops[k].kind == NF_LOOP_VECTOR) vec = w->loops[k].ext;
    if (w->loops[k].kind == NF_LOOP_PARALLEL) par = w->loops[k].ext;
  }
  count_store(w->set, c, p, st);
  o[SF_ITERS] = (float)lg(iters);
  o[SF_FLOPS] = (float)c->flops;
  o[SF_FLOPS_TOTAL] = (float)lg(iters * c->flops);
  o[SF_MATH] = (float)c->math;
  o[SF_INTOPS] = (float)c->intops;
  o[SF_DIVMOD] = (float)c->divmod;
  o[SF_SELECT] = (float)c->select;
  o[SF_REDUCE] = st->op != NF_RED_NONE;
  o[SF_DEPTH] = (float)w->depth;
  o[SF_INNER_EXT] = w->depth ? (float)lg((double)w->loops[w->depth - 1].ext) : 0.0f;
  o[SF_VEC] = (float)vec;
  o[SF_UNROLL] = unroll > 1 ? (float)lg(unroll - 1) : 0.0f; /* log2(unroll) */
  o[SF_PAR] = (float)lg((double)par);
  if (par > 0) { /* busy fraction of 8 and 32 threads over the rounds */
    o[SF_PAR_EFF8] = (float)frac((double)par, ceil((double)par / 8) * 8);
    o[SF_PAR_EFF32] = (float)frac((double)par, ceil((double)par / 32) * 32);
  }
  o[SF_GUARDS] = (float)w->n_ifs_in;
  /* stride kinds along the innermost loop */
  int has_loop = w->depth > 0;
  uint32_t inner = has_loop ? w->loops[w->depth - 1].var : 0;
  int kinds[3] = {0, 0, 0};
  int sk = stride_kind(p, st->buf, st->n_idx, st->idx, has_loop, inner);
  kinds[sk]++;
  for (int a = 0; a < c->n_acc; a++) {
    const nf_expr *e = c->acc[a];
    kinds[stride_kind(p, e->u.tensor, e->n_args, e->args, has_loop, inner)]++;
  }
  o[SF_N_CONTIG] = (float)kinds[1];
  o[SF_N_BCAST] = (float)kinds[0];
  o[SF_N_STRIDED] = (float)kinds[2];
  o[SF_STORE_KIND] = (float)sk;
  double alloc = 0;
  for (int k = 0; k < w->n_allocs_in; k++) alloc += buf_bytes(&p->bufs[w->allocs[k]]);
  o[SF_TILE_BYTES] = w->n_allocs_in ? (float)lg(buf_bytes(&p->bufs[w->allocs[w->n_allocs_in - 1]]))
                                    : 0.0f;
  o[SF_ALLOC_BYTES] = (float)lg(alloc);
  /* footprints per level: loops [depth-1-l, depth) range, outer ones at 0 */
  box bx[FEAT_MAX_ACC + 1];
  int n_bx = 0;
  for (int k = 0; k < w->depth; k++) w->rng[w->loops[k].var].lo = w->rng[w->loops[k].var].hi = 0;
  double inside = 1;
  for (int l = 0; l < NF_FEAT_LEVELS && l < w->depth; l++) {
    const loopf *lf = &w->loops[w->depth - 1 - l];
    w->rng[lf->var].hi = lf->ext - 1;
    inside *= (double)lf->ext;
    n_bx = 0;
    box_add(w, bx, &n_bx, st->buf, st->n_idx, st->idx);
    for (int a = 0; a < c->n_acc; a++) {
      const nf_expr *e = c->acc[a];
      box_add(w, bx, &n_bx, e->u.tensor, e->n_args, e->args);
    }
    double bytes = boxes_bytes(w, bx, n_bx);
    o[SF_LEVELS + 2 * l] = (float)lg(bytes);
    o[SF_LEVELS + 2 * l + 1] = (float)(lg(inside * c->flops) - lg(bytes));
  }
  if (w->depth == 0) { /* no loop: the store's own accesses */
    box_add(w, bx, &n_bx, st->buf, st->n_idx, st->idx);
    for (int a = 0; a < c->n_acc; a++)
      box_add(w, bx, &n_bx, c->acc[a]->u.tensor, c->acc[a]->n_args, c->acc[a]->args);
  }
  o[SF_N_BUFS] = (float)n_bx;
  if (slot == 0 && w->gpu) describe_gpu(w, st, iters);
}

static int walk_in(walker *w, const nf_lstmt *s);

/* A statement reached from the root through SEQ and ALLOC only, other
 * than those, is a launch. */
static int walk(walker *w, const nf_lstmt *s) {
  if (!s || w->in_launch || s->kind == NF_LS_SEQ || s->kind == NF_LS_ALLOC) return walk_in(w, s);
  if (s->n_body < 0 || (s->n_body > 0 && !s->body)) return NF_EINVAL;
  memset(&w->cur, 0, sizeof w->cur);
  w->cur.grid = w->cur.block = 1;
  launch_walk(w->p, s, 0, 0, 1, 1, 0, &w->cur, 0);
  if (w->pass == 1) {
    w->n_launches++;
    w->gpu |= w->cur.bound;
  }
  w->in_launch = 1;
  int rc = walk_in(w, s);
  w->in_launch = 0;
  return rc;
}

static int walk_in(walker *w, const nf_lstmt *s) {
  if (!s) return NF_EINVAL;
  if (s->n_body < 0 || (s->n_body > 0 && !s->body)) return NF_EINVAL;
  int rc = NF_OK;
  switch (s->kind) {
  case NF_LS_LOOP:
    if (w->depth == FEAT_MAX_DEPTH || s->var >= w->p->n_vars || s->extent < 0)
      return NF_EINVAL;
    w->loops[w->depth].var = s->var;
    w->loops[w->depth].ext = s->extent;
    w->loops[w->depth].kind = s->loop_kind;
    w->depth++;
    if (w->pass == 1) {
      w->n_loops++;
      w->n_par += s->loop_kind == NF_LOOP_PARALLEL;
      if (w->depth > w->max_depth) w->max_depth = w->depth;
    }
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = walk(w, s->body[i]);
    w->depth--;
    return rc;
  case NF_LS_IF:
    if (w->n_ifs_in == FEAT_MAX_DEPTH) return NF_EINVAL;
    w->n_ifs_in++;
    if (w->pass == 1) w->n_ifs++;
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = walk(w, s->body[i]);
    w->n_ifs_in--;
    return rc;
  case NF_LS_ALLOC:
    if (w->n_allocs_in == FEAT_MAX_DEPTH || s->buf >= w->p->n_bufs) return NF_EINVAL;
    w->allocs[w->n_allocs_in++] = s->buf;
    if (w->pass == 1) w->n_allocs++;
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = walk(w, s->body[i]);
    w->n_allocs_in--;
    return rc;
  case NF_LS_SEQ:
    for (int i = 0; i < s->n_body && rc == NF_OK; i++) rc = walk(w, s->body[i]);
    return rc;
  case NF_LS_STORE: {
    if (s->buf >= w->p->n_bufs || !s->value || s->n_idx < 0 || s->n_idx > NF_MAX_RANK)
      return NF_EINVAL;
    for (int d = 0; d < s->n_idx; d++)
      if (!s->idx[d]) return NF_EINVAL;
    int order = w->order++;
    if (w->pass == 2) {
      for (int k = 0; k < NF_FEAT_STORES; k++)
        if (w->top[k].order == order) describe(w, s, k);
      return NF_OK;
    }
    double iters = 1;
    int vec = 0, par = 0, bound = 0;
    for (int k = 0; k < w->depth; k++) {
      iters *= (double)w->loops[k].ext;
      vec |= w->loops[k].kind == NF_LOOP_VECTOR;
      par |= w->loops[k].kind == NF_LOOP_PARALLEL;
      bound |= w->loops[k].kind == NF_LOOP_BLOCK || w->loops[k].kind == NF_LOOP_THREAD;
    }
    if (!bound) w->unbound_iters += iters;
    count_store(w->set, &w->c, w->p, s);
    w->n_stores++;
    w->iters += iters;
    w->flops += iters * w->c.flops;
    if (vec) w->vec_iters += iters;
    if (par) w->par_iters += iters;
    if (w->n_ifs_in) w->guard_iters += iters;
    top_insert(w, iters, order);
    return NF_OK;
  }
  default: return NF_EINVAL;
  }
}

static int features(const nf_lprog *p, int gpu, float *out) {
  if (!p || !out || !p->root || (p->n_bufs > 0 && !p->bufs)) return NF_EINVAL;
  walker *w = calloc(1, sizeof *w);
  nodeset *set = calloc(1, sizeof *set);
  nf_range *rng = calloc(p->n_vars ? p->n_vars : 1, sizeof *rng);
  int rc = NF_ENOMEM;
  if (!w || !set || !rng) goto done;
  w->p = p;
  w->rng = rng;
  w->set = set;
  w->out = out;
  for (int k = 0; k < NF_FEAT_STORES; k++) w->top[k].order = -1;
  w->gpu = gpu;
  w->pass = 1;
  if ((rc = walk(w, p->root)) != NF_OK) goto done;
  memset(out, 0, NF_FEAT_N * sizeof *out);
  w->pass = 2;
  w->order = 0;
  if ((rc = walk(w, p->root)) != NF_OK) goto done;
  float *g = out + NF_FEAT_STORES * SF_N;
  double temp = 0;
  for (uint32_t b = 0; b < p->n_bufs; b++)
    if (p->bufs[b].kind == NF_BUF_TEMP) temp += buf_bytes(&p->bufs[b]);
  g[GF_N_LOOPS] = (float)lg(w->n_loops);
  g[GF_N_STORES] = (float)lg(w->n_stores);
  g[GF_N_IFS] = (float)lg(w->n_ifs);
  g[GF_N_ALLOCS] = (float)lg(w->n_allocs);
  g[GF_N_PAR] = (float)w->n_par;
  g[GF_MAX_DEPTH] = (float)w->max_depth;
  g[GF_TEMP_BYTES] = (float)lg(temp);
  g[GF_FLOPS] = (float)lg(w->flops);
  g[GF_ITERS] = (float)lg(w->iters);
  g[GF_VEC_FRAC] = (float)frac(w->vec_iters, w->iters);
  g[GF_PAR_FRAC] = (float)frac(w->par_iters, w->iters);
  g[GF_GUARD_FRAC] = (float)frac(w->guard_iters, w->iters);
  if (w->gpu) {
    float *x = g + GF_N;
    x[XF_GPU] = 1;
    x[XF_LAUNCHES] = (float)lg(w->n_launches);
    x[XF_UNBOUND_FRAC] = (float)frac(w->unbound_iters, w->iters);
  }
done:
  if (rc != NF_OK && out) memset(out, 0, NF_FEAT_N * sizeof *out);
  free(rng);
  free(set);
  free(w);
  return rc;
}

int nf_features(const nf_lprog *p, float *out) { return features(p, 0, out); }

int nf_features_gpu(const nf_lprog *p, float *out) { return features(p, 1, out); }
