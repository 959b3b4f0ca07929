/* llvm_backend.c - loop IR (nf_loop.h) -> LLVM IR -> optimised x86-64
 * object in memory, through the LLVM C API (LLVM 14).
 *
 * Module layout:
 *   i32 nf_kernel_v1(const nf_kernel_args *)   the only global symbol:
 *       checks abi_version and n_buffers, loads the buffer pointers and
 *       calls nf_main;
 *   i32 nf_main(T0* noalias, ..., pfor, runtime) internal: the program;
 *   void nf_body_K(i8 *ctx, i64 b, i64 e)       internal: PARALLEL loop K
 *       outlined; unpacks ctx (an i64 array holding the captured buffer
 *       pointers and loop variables) and calls nf_inner_K(noalias ...,
 *       vars..., b, e) (alwaysinline) so the body keeps noalias.
 * A PARALLEL loop nested in another PARALLEL loop runs serially.
 *
 * Expressions are emitted in "lane form": each value is uniform (one
 * scalar), linear (an i64 scalar base plus a constant stride per lane) or
 * a general vector.  Outside VECTOR loops everything is uniform; inside a
 * VECTOR loop of width W the loop variable is linear(0, 1), and a load is
 * a plain vector load when its flattened offset is linear with stride 1, a
 * scalar load when it is uniform, and an llvm.masked.gather otherwise.
 * Stores: contiguous vector (masked) stores; scatter for plain stores
 * (LLVM orders overlapping scatter lanes from lane 0 up, the sequential
 * order); reductions into one address fold the lanes in order (no
 * reassociation); reductions through unknown indices run lane by lane.
 *
 * Lazy selects: a select whose condition is uniform branches unless both
 * sides are small and load-free (then a `select`); a lane-varying
 * condition evaluates both sides under masks (loads in a masked side are
 * masked loads/gathers, so an untaken out-of-bounds lane is never read).
 * IF with a lane-varying condition narrows the mask of its body.
 *
 * Fast-math policy: no fast-math flags at all (no nnan/ninf: NaN and inf
 * propagate exactly as in the interpreter; no reassociation: reductions
 * fold in the loop order the schedule produced).  The one licence taken is
 * contraction: a float a*b feeding an addition (x + a*b, or a SUM
 * reduction of a product) is emitted as llvm.fmuladd, which the target
 * turns into an FMA (one rounding instead of two: at least as accurate).
 * min/max follow the interpreter: max(a,b) = (a > b || a != a) ? a : b.
 *
 * Integer semantics: i32/i64 wrap; // and % are Python's (floor, sign of
 * the divisor); division by -1 is negation (no trap on INT_MIN); division
 * by zero, an evaluation error in the interpreter, yields 0 here (no
 * trap).  float -> int casts truncate and saturate (NaN -> 0), where the
 * interpreter reports an error.  Bool is i1 in registers and one byte
 * (0/1) in memory.  f16/bf16 buffers are not supported (NF_EUNSUPPORTED).
 *
 * Temporaries (ALLOC): up to 64 KiB each (128 KiB per function) on the
 * stack of the function (kernel or outlined body) that runs the ALLOC;
 * larger ones come from aligned_alloc(64, ...) once at that function's
 * entry and are freed at its exit: nf_main returns NF_KERNEL_ENOMEM when
 * one fails, an outlined body traps (it cannot report).  Reusing one area
 * for every execution of the ALLOC is valid because a function's
 * executions of one ALLOC never overlap.
 *
 * Addresses: an access's indices of two adjacent dimensions that are
 * x // e and x % e of one x, e the inner extent (a loop fused over both),
 * address x * the inner stride, so a vector loop over x stays a
 * contiguous access.
 *
 * Masks are avoided where they are not needed: a load whose indices lie
 * in bounds for the whole loop ranges (nf_expr_bounds) is unmasked; a
 * uniform load under a mask reads its address when any lane is active
 * (else the buffer's first element); loads of stride 2..4 are one wide
 * load and a shuffle (masked element by element: only elements between
 * two accessed ones), not gathers; a masked store into a temporary this
 * function ALLOCs is load-blend-store (no other thread sees it); lane
 * comparisons of the vector variable with a uniform bound are i32
 * compares; an outermost lane-varying IF runs its body unmasked when all
 * lanes pass (every vector but the last of a non-dividing split).
 *
 * Unrolling is done here, not by LLVM (whose unroller, with SCEV, cost
 * more than the rest of its O2 pipeline): register tiles (a serial loop
 * accumulating into a temporary allocated outside it, at an address that
 * depends only on the small loops inside: their loops are unrolled, the
 * reduction loop twice, its second copy running the tile rows backwards
 * where the rows are independent, which halves the spills of a tile
 * larger than the register file), nests of at most 16 stores, and 4
 * copies of small innermost loops.  A large program (weight of its
 * expressions, vector math counting 40, over 400) gets register tiles
 * only.
 *
 * Pass pipelines (nf_cpu_target.opt_level; 0 means 3): levels 2 (tier 1)
 * and 3 run the same function passes (SROA, EarlyCSE, InstCombine,
 * SimplifyCFG, LICM, loop-idiom, GVN, DSE, ADCE) on each function before
 * the outlined bodies' inner functions are inlined (their noalias
 * arguments let LICM hoist), then InstCombine and SimplifyCFG once more;
 * no LLVM vectorizer or unroller runs (the IR is already vectorized and
 * unrolled).  Level 1 runs SROA, EarlyCSE, InstCombine and SimplifyCFG
 * only and the default code generator; 2 and 3 the aggressive one.
 * The pipelines, target machines and emission are in llvm_target.c. */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_codegen.h"
#include "nf_kernel.h"

#define MAX_W 64
#define TILE_MAX_UNROLL 64 /* iterations of a register tile's inner loops */
#define TILE_MAX_WEIGHT 800 /* weight (stmt_weight) of its unrolled body */
#define SMALL_UNROLL 16 /* stores of a loop nest unrolled in the backend */
#define INNER_UNROLL 4 /* copies of a small innermost loop's body */
#define UNROLL_MAX_WEIGHT 600 /* weight of a nest or body unrolled outside tiles */
#define LEAN_WEIGHT 400 /* program weight (stmt_weight) above which g->lean */
#define MAX_STRIDE 4 /* strided vector loads up to this stride; gathers beyond */
#define STACK_TEMP_MAX (64 * 1024)
#define STACK_FN_MAX (128 * 1024)
#define MAX_CAP_B 256 /* live buffers captured by a parallel loop */
#define MAX_CAP_V 128 /* bound loop variables captured */

/* ---- lane values ---- */

enum { K_UNI = 0, K_LIN, K_VEC };

typedef struct vv {
  int k;
  LLVMValueRef s;  /* UNI: the value; LIN: base (i64) */
  int64_t st;      /* LIN: stride */
  LLVMValueRef v;  /* VEC: the vector */
} vv;

typedef struct memo_ent {
  const nf_expr *e;
  vv val;
} memo_ent;

typedef struct heap_tmp {
  LLVMValueRef ptr; /* i8* from aligned_alloc */
} heap_tmp;

/* Per generated function. */
typedef struct fstate {
  LLVMValueRef fn;
  LLVMBasicBlockRef entry; /* allocas, heap temps; terminator added last */
  LLVMBasicBlockRef start; /* first block of the code */
  LLVMValueRef *bufp;      /* n_bufs typed pointers (NULL: not live) */
  uint8_t *own;            /* n_bufs: 1 for temporaries this function
                              ALLOCs (private to one invocation) */
  LLVMValueRef *var;       /* n_vars i64 values (NULL: not bound) */
  LLVMValueRef pfor, rt;   /* main only */
  int is_main, in_parallel;
  heap_tmp *heap;
  int n_heap, cap_heap;
  int64_t stack_bytes;
} fstate;

typedef struct cg {
  const nf_lprog *p;
  LLVMContextRef C;
  LLVMModuleRef M;
  LLVMBuilderRef B, AB;
  LLVMTypeRef i1, i8, i32, i64, f32, f64, vp, vd, body_ty, pfor_ty;
  fstate *f;
  /* vector mode */
  unsigned W;
  uint32_t vvar;
  LLVMValueRef mask; /* <W x i1> or NULL: all lanes */
  memo_ent *memo;
  int n_memo, cap_memo;
  nf_range *range; /* n_vars: each loop variable's [0, extent - 1] */
  int in_tile;      /* inside a register tile's reduction loop */
  int lean;         /* a large program: no unrolling or versioning beyond
                       register tiles (code size, compile time) */
  int tile_odd;     /* emitting its second copy (unrolled by 2) */
  int n_bodies;
  int rc;
  nf_buf *err;
  unsigned kind_noalias, kind_alwaysinline, kind_nounwind;
} cg;

static void fail(cg *g, int rc, const char *fmt, const char *what) {
  if (g->rc) return;
  g->rc = rc;
  if (g->err) nf_buf_printf(g->err, fmt, what);
}

/* ---- types and constants ---- */

static LLVMTypeRef reg_type(cg *g, int dt) {
  switch (dt) {
  case NF_BOOL: return g->i1;
  case NF_I32: return g->i32;
  case NF_I64: return g->i64;
  case NF_F32: return g->f32;
  case NF_F64: return g->f64;
  default: return NULL;
  }
}

static LLVMTypeRef mem_type(cg *g, int dt) {
  return dt == NF_BOOL ? g->i8 : reg_type(g, dt);
}

static int is_float(int dt) { return dt == NF_F32 || dt == NF_F64; }

static LLVMValueRef c64(cg *g, int64_t v) {
  return LLVMConstInt(g->i64, (unsigned long long)v, 1);
}
static LLVMValueRef c32(cg *g, int64_t v) {
  return LLVMConstInt(g->i32, (unsigned long long)v, 1);
}

static LLVMTypeRef vec_of(LLVMTypeRef t, unsigned w) { return LLVMVectorType(t, w); }

static LLVMValueRef splat(cg *g, LLVMValueRef s) {
  LLVMTypeRef t = LLVMTypeOf(s);
  LLVMTypeRef vt = vec_of(t, g->W);
  if (LLVMIsConstant(s)) {
    LLVMValueRef el[MAX_W];
    for (unsigned i = 0; i < g->W; i++) el[i] = s;
    return LLVMConstVector(el, g->W);
  }
  /* A narrow splat is the low part of a 512-bit one: the pieces of a
   * vector loop (56 lanes: 32 + 16 + 8) then share one broadcast from
   * memory, where LLVM would otherwise broadcast into the narrow register
   * and widen it with a shuffle (a uop on the port that also does
   * 512-bit FMAs).  On a CPU without 512-bit registers the wide splat is
   * two halves, the low one used. */
  unsigned bits = LLVMGetTypeKind(t) == LLVMIntegerTypeKind ? LLVMGetIntTypeWidth(t)
                  : LLVMGetTypeKind(t) == LLVMDoubleTypeKind ? 64
                  : LLVMGetTypeKind(t) == LLVMFloatTypeKind  ? 32
                                                             : 0;
  unsigned wide = bits >= 32 ? 512 / bits : 0;
  if (wide > g->W) {
    LLVMTypeRef wt = vec_of(t, wide);
    LLVMValueRef u = LLVMBuildInsertElement(g->B, LLVMGetUndef(wt), s, c32(g, 0), "");
    LLVMValueRef w = LLVMBuildFreeze(
        g->B, LLVMBuildShuffleVector(g->B, u, LLVMGetUndef(wt), LLVMConstNull(vec_of(g->i32, wide)), ""),
        "");
    LLVMValueRef el[MAX_W];
    for (unsigned i = 0; i < g->W; i++) el[i] = c32(g, i);
    return LLVMBuildShuffleVector(g->B, w, LLVMGetUndef(wt), LLVMConstVector(el, g->W), "");
  }
  LLVMValueRef u = LLVMBuildInsertElement(g->B, LLVMGetUndef(vt), s, c32(g, 0), "");
  return LLVMBuildShuffleVector(g->B, u, LLVMGetUndef(vt),
                                LLVMConstNull(vec_of(g->i32, g->W)), "");
}

static LLVMValueRef mat(cg *g, vv a) {
  if (a.k == K_VEC) return a.v;
  if (a.k == K_UNI) return splat(g, a.s);
  LLVMValueRef el[MAX_W];
  for (unsigned i = 0; i < g->W; i++) el[i] = c64(g, a.st * (int64_t)i);
  return LLVMBuildAdd(g->B, splat(g, a.s), LLVMConstVector(el, g->W), "");
}

static vv uni(LLVMValueRef s) {
  vv r = {K_UNI, s, 0, NULL};
  return r;
}
static vv vec(LLVMValueRef v) {
  vv r = {K_VEC, NULL, 0, v};
  return r;
}
static vv lin(LLVMValueRef base, int64_t st) {
  vv r = {K_LIN, base, st, NULL};
  return r;
}

static LLVMValueRef intr(cg *g, const char *name, LLVMTypeRef *ovl, unsigned n_ovl,
                         LLVMValueRef *args, unsigned n) {
  return nf__vm_intrinsic(g->M, g->B, name, ovl, n_ovl, args, n);
}

/* ---- memo (scoped to one statement; select branches push scopes) ---- */

static int memo_get(cg *g, const nf_expr *e, vv *out) {
  for (int i = g->n_memo - 1; i >= 0; i--)
    if (g->memo[i].e == e) {
      *out = g->memo[i].val;
      return 1;
    }
  return 0;
}

static void memo_put(cg *g, const nf_expr *e, vv val) {
  if (g->n_memo == g->cap_memo) {
    int nc = g->cap_memo ? 2 * g->cap_memo : 64;
    memo_ent *m = realloc(g->memo, (size_t)nc * sizeof *m);
    if (!m) {
      fail(g, NF_ENOMEM, "%s", "out of memory");
      return;
    }
    g->memo = m;
    g->cap_memo = nc;
  }
  g->memo[g->n_memo].e = e;
  g->memo[g->n_memo].val = val;
  g->n_memo++;
}

/* ---- expressions ---- */

static vv emit(cg *g, const nf_expr *e);

static LLVMBasicBlockRef new_block(cg *g, const char *name) {
  return LLVMAppendBasicBlockInContext(g->C, g->f->fn, name);
}

/* Small and load-free: safe and cheap to evaluate speculatively. */
static int cheap(const nf_expr *e, int *budget) {
  if (--*budget < 0) return 0;
  switch (e->op) {
  case NF_OP_ACCESS:
  case NF_OP_EXP:
  case NF_OP_LOG:
  case NF_OP_TANH:
  case NF_OP_SIGMOID:
  case NF_OP_ERF:
  case NF_OP_POW:
  case NF_OP_SELECT:
    return 0;
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
    if (!is_float(e->dtype)) return 0;
    break;
  default:
    break;
  }
  for (int i = 0; i < e->n_args; i++)
    if (!cheap(e->args[i], budget)) return 0;
  return 1;
}

static LLVMValueRef all_true(cg *g) {
  return LLVMConstAllOnes(vec_of(g->i1, g->W));
}

/* Flattened element offset of an access/store (lane form, i64). */
static vv lane_add(cg *g, vv a, vv b);
static vv lane_mulc(cg *g, vv a, int64_t c);

/* Whether indices a, b of two adjacent dimensions, the inner of extent
 * e, are x // e and x % e of one x (a loop fused over both dimensions):
 * together they address x * the inner stride, since (x // e) * e + x % e
 * == x for every x (floor division), which keeps a vector loop over x a
 * contiguous access instead of a gather. */
static const nf_expr *fused_pair(const nf_expr *a, const nf_expr *b, int64_t e) {
  if (a->op != NF_OP_FLOORDIV || b->op != NF_OP_MOD || a->args[0] != b->args[0] ||
      a->args[1] != b->args[1] || a->args[1]->op != NF_OP_CONST || a->args[1]->u.i != e ||
      e <= 0)
    return NULL;
  return a->args[0];
}

static vv offset_of(cg *g, uint32_t buf, int n_idx, const nf_expr *const *idx) {
  const nf_lbuf *lb = &g->p->bufs[buf];
  vv off = uni(c64(g, 0));
  int64_t stride = 1;
  for (int d = n_idx - 1; d >= 0; d--) {
    const nf_expr *x = d > 0 ? fused_pair(idx[d - 1], idx[d], lb->shape[d]) : NULL;
    vv t = lane_mulc(g, emit(g, x ? x : idx[d]), stride);
    off = lane_add(g, off, t);
    stride *= lb->shape[d];
    if (x) stride *= lb->shape[--d];
  }
  return off;
}

static LLVMValueRef bool_from_mem(cg *g, LLVMValueRef x) {
  return LLVMBuildICmp(g->B, LLVMIntNE, x, LLVMConstNull(LLVMTypeOf(x)), "");
}

static int64_t n_elems(const nf_lbuf *lb) {
  int64_t n = 1;
  for (int d = 0; d < lb->rank; d++) {
    if (lb->shape[d] <= 0) return 0;
    if (n > INT64_MAX / lb->shape[d]) return INT64_MAX;
    n *= lb->shape[d];
  }
  return n;
}

/* 1 when every index of an access to lb lies within its shape for all
 * values of the loop variables (their loop ranges, ignoring enclosing
 * conditions): such a load is safe whatever the lane mask. */
static int in_bounds(cg *g, const nf_lbuf *lb, int n_idx, const nf_expr *const *idx) {
  if (!g->range || n_idx != lb->rank) return 0;
  for (int d = 0; d < n_idx; d++) {
    nf_range r;
    if (!nf_expr_bounds(idx[d], g->range, (int)g->p->n_vars, &r) || r.lo < 0 ||
        r.hi >= lb->shape[d])
      return 0;
  }
  return 1;
}

/* Lanes l = 0..W-1 at base[off.s + l * off.st] for a small stride st:
 * one masked load of the W*st elements from the first lane's, then a
 * shuffle, instead of a gather.  Element j (lane l = j / st, r = j % st)
 * is read only when lane l is active and, for r > 0, lane l+1 too: it
 * then lies between two addresses the program accesses, inside the same
 * buffer (elements past the last lane's are never read).  The element
 * mask is built on i32 lanes, which x86 shuffles well (i1 vectors it
 * does not). */
static LLVMValueRef strided_load(cg *g, LLVMTypeRef et, LLVMValueRef base, vv off,
                                 LLVMValueRef mask, unsigned align) {
  unsigned W = g->W, st = (unsigned)off.st, n = (W - 1) * st + 1, n2 = W * st;
  if (!mask && st == 2) {
    /* Elements 0..W-1 and W-1..2W-2: two plain loads inside the span. */
    LLVMTypeRef vt = vec_of(et, W);
    LLVMValueRef half[2], pick[MAX_W];
    for (int h = 0; h < 2; h++) {
      LLVMValueRef o = h ? LLVMBuildAdd(g->B, off.s, c64(g, W - 1), "") : off.s;
      LLVMValueRef p = LLVMBuildGEP2(g->B, et, base, &o, 1, "");
      p = LLVMBuildBitCast(g->B, p, LLVMPointerType(vt, 0), "");
      half[h] = LLVMBuildLoad2(g->B, vt, p, "");
      LLVMSetAlignment(half[h], align);
    }
    for (unsigned l = 0; l < W; l++) pick[l] = c32(g, 2 * l < W ? 2 * l : W + 2 * l - (W - 1));
    return LLVMBuildShuffleVector(g->B, half[0], half[1], LLVMConstVector(pick, W), "");
  }
  LLVMTypeRef wt = vec_of(et, n2), mt = vec_of(g->i32, W);
  LLVMValueRef p = LLVMBuildGEP2(g->B, et, base, &off.s, 1, "");
  p = LLVMBuildBitCast(g->B, p, LLVMPointerType(wt, 0), "");
  LLVMValueRef ia[MAX_W * MAX_STRIDE], ib[MAX_W * MAX_STRIDE];
  for (unsigned j = 0; j < n2; j++) {
    ia[j] = c32(g, j < n ? j / st : W); /* lane W: the zero vector */
    ib[j] = c32(g, j < n ? j / st + (j % st != 0) : W);
  }
  LLVMValueRef mx = mask ? LLVMBuildSExt(g->B, mask, mt, "") : LLVMConstAllOnes(mt);
  LLVMValueRef zero = LLVMConstNull(mt);
  LLVMValueRef m = LLVMBuildAnd(
      g->B, LLVMBuildShuffleVector(g->B, mx, zero, LLVMConstVector(ia, n2), ""),
      LLVMBuildShuffleVector(g->B, mx, zero, LLVMConstVector(ib, n2), ""), "");
  m = LLVMBuildICmp(g->B, LLVMIntNE, m, LLVMConstNull(LLVMTypeOf(m)), "");
  LLVMTypeRef ovl[2] = {wt, LLVMTypeOf(p)};
  LLVMValueRef a[4] = {p, c32(g, align), m, LLVMGetUndef(wt)};
  LLVMValueRef wide = intr(g, "llvm.masked.load", ovl, 2, a, 4);
  LLVMValueRef pick[MAX_W];
  for (unsigned l = 0; l < W; l++) pick[l] = c32(g, l * st);
  return LLVMBuildShuffleVector(g->B, wide, LLVMGetUndef(wt), LLVMConstVector(pick, W), "");
}

static vv emit_load(cg *g, const nf_expr *e) {
  uint32_t buf = e->u.tensor;
  const nf_lbuf *lb = &g->p->bufs[buf];
  LLVMValueRef base = g->f->bufp[buf];
  LLVMTypeRef et = mem_type(g, lb->dtype);
  unsigned align = (unsigned)nf_dtype_size((nf_dtype)lb->dtype);
  if (!base) {
    fail(g, NF_EINVAL, "access to buffer '%s' outside its ALLOC", lb->name ? lb->name : "?");
    return uni(LLVMGetUndef(reg_type(g, e->dtype)));
  }
  vv off = offset_of(g, buf, e->n_args, e->args);
  LLVMValueRef r;
  /* An access in bounds for every lane needs no mask. */
  LLVMValueRef mask = g->mask && !in_bounds(g, lb, e->n_args, e->args) ? g->mask : NULL;
  if (off.k == K_UNI && (!mask || n_elems(lb) > 0)) {
    LLVMValueRef p = LLVMBuildGEP2(g->B, et, base, &off.s, 1, "");
    /* One address for all lanes: valid when any lane is active; else
     * read the buffer's first element (the buffer is not empty). */
    if (mask)
      p = LLVMBuildSelect(g->B, intr(g, "llvm.vector.reduce.or", NULL, 1, &mask, 1), p, base, "");
    r = LLVMBuildLoad2(g->B, et, p, "");
    LLVMSetAlignment(r, align);
    if (lb->dtype == NF_BOOL) r = bool_from_mem(g, r);
    return uni(r);
  }
  LLVMTypeRef vt = vec_of(et, g->W);
  if (off.k == K_LIN && off.st == 1) {
    LLVMValueRef p = LLVMBuildGEP2(g->B, et, base, &off.s, 1, "");
    p = LLVMBuildBitCast(g->B, p, LLVMPointerType(vt, 0), "");
    if (!mask) {
      r = LLVMBuildLoad2(g->B, vt, p, "");
      LLVMSetAlignment(r, align);
    } else {
      LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(p)};
      LLVMValueRef a[4] = {p, c32(g, align), mask, LLVMGetUndef(vt)};
      r = intr(g, "llvm.masked.load", ovl, 2, a, 4);
    }
  } else if (off.k == K_LIN && off.st >= 2 && off.st <= MAX_STRIDE) {
    r = strided_load(g, et, base, off, mask, align);
  } else {
    LLVMValueRef ix = mat(g, off);
    LLVMValueRef ps = LLVMBuildGEP2(g->B, et, base, &ix, 1, "");
    LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(ps)};
    LLVMValueRef a[4] = {ps, c32(g, align), mask ? mask : all_true(g), LLVMGetUndef(vt)};
    r = intr(g, "llvm.masked.gather", ovl, 2, a, 4);
  }
  if (lb->dtype == NF_BOOL) r = bool_from_mem(g, r);
  return vec(r);
}

static vv lane_add(cg *g, vv a, vv b) {
  if (a.k == K_UNI && b.k == K_UNI) return uni(LLVMBuildAdd(g->B, a.s, b.s, ""));
  if (a.k != K_VEC && b.k != K_VEC) {
    LLVMValueRef s = LLVMBuildAdd(g->B, a.s, b.s, "");
    return lin(s, (a.k == K_LIN ? a.st : 0) + (b.k == K_LIN ? b.st : 0));
  }
  return vec(LLVMBuildAdd(g->B, mat(g, a), mat(g, b), ""));
}

static vv lane_mulc(cg *g, vv a, int64_t c) {
  if (c == 1) return a;
  LLVMValueRef cc = c64(g, c);
  if (a.k == K_UNI) return uni(LLVMBuildMul(g->B, a.s, cc, ""));
  if (a.k == K_LIN) return lin(LLVMBuildMul(g->B, a.s, cc, ""), a.st * c);
  return vec(LLVMBuildMul(g->B, a.v, splat(g, cc), ""));
}

static LLVMValueRef int_divmod(cg *g, int is_mod, LLVMValueRef x, LLVMValueRef y) {
  LLVMBuilderRef b = g->B;
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef zero = LLVMConstNull(t), one, m1;
  if (LLVMGetTypeKind(t) == LLVMVectorTypeKind) {
    one = splat(g, LLVMConstInt(LLVMGetElementType(t), 1, 0));
    m1 = LLVMConstAllOnes(t);
  } else {
    one = LLVMConstInt(t, 1, 0);
    m1 = LLVMConstAllOnes(t);
  }
  LLVMValueRef y0 = LLVMBuildICmp(b, LLVMIntEQ, y, zero, "");
  LLVMValueRef ym1 = LLVMBuildICmp(b, LLVMIntEQ, y, m1, "");
  LLVMValueRef ys = LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), one, y, "");
  LLVMValueRef q = LLVMBuildSDiv(b, x, ys, "");
  LLVMValueRef r = LLVMBuildSRem(b, x, ys, "");
  LLVMValueRef fix = LLVMBuildAnd(
      b, LLVMBuildICmp(b, LLVMIntNE, r, zero, ""),
      LLVMBuildICmp(b, LLVMIntSLT, LLVMBuildXor(b, r, ys, ""), zero, ""), "");
  LLVMValueRef res;
  if (is_mod) {
    res = LLVMBuildSelect(b, fix, LLVMBuildAdd(b, r, ys, ""), r, "");
    res = LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), zero, res, "");
  } else {
    res = LLVMBuildSelect(b, fix, LLVMBuildSub(b, q, one, ""), q, "");
    res = LLVMBuildSelect(b, ym1, LLVMBuildSub(b, zero, x, ""), res, "");
    res = LLVMBuildSelect(b, y0, zero, res, "");
  }
  return res;
}

static LLVMValueRef fmuladd(cg *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  LLVMValueRef args[3] = {a, b, c};
  return intr(g, "llvm.fmuladd", NULL, 1, args, 3);
}

/* Arithmetic on register values (scalars or vectors of equal shape). */
static LLVMValueRef op_unary(cg *g, const nf_expr *e, LLVMValueRef a) {
  LLVMBuilderRef b = g->B;
  int adt = e->args[0]->dtype;
  if (e->op == NF_OP_CAST) {
    int to = e->dtype;
    int vecd = LLVMGetTypeKind(LLVMTypeOf(a)) == LLVMVectorTypeKind;
    LLVMTypeRef rt = reg_type(g, to);
    if (vecd) rt = vec_of(rt, g->W);
    if (to == adt) return a;
    if (is_float(adt)) {
      if (is_float(to))
        return to == NF_F64 ? LLVMBuildFPExt(b, a, rt, "") : LLVMBuildFPTrunc(b, a, rt, "");
      if (to == NF_BOOL)
        return LLVMBuildFCmp(b, LLVMRealUNE, a, LLVMConstNull(LLVMTypeOf(a)), "");
      LLVMTypeRef ovl[2] = {rt, LLVMTypeOf(a)};
      return intr(g, "llvm.fptosi.sat", ovl, 2, &a, 1);
    }
    if (is_float(to))
      return adt == NF_BOOL ? LLVMBuildUIToFP(b, a, rt, "") : LLVMBuildSIToFP(b, a, rt, "");
    if (to == NF_BOOL) return LLVMBuildICmp(b, LLVMIntNE, a, LLVMConstNull(LLVMTypeOf(a)), "");
    if (adt == NF_BOOL) return LLVMBuildZExt(b, a, rt, "");
    return to == NF_I64 ? LLVMBuildSExt(b, a, rt, "") : LLVMBuildTrunc(b, a, rt, "");
  }
  if (is_float(adt)) {
    switch (e->op) {
    case NF_OP_NEG: return LLVMBuildFNeg(b, a, "");
    case NF_OP_STOPGRAD: return a;
    default: {
      LLVMValueRef r = nf__vm_unary(g->M, b, e->op, a);
      if (!r) {
        fail(g, NF_EINVAL, "operator '%s' not supported on floats", nf_op_name((nf_op)e->op));
        return a;
      }
      return r;
    }
    }
  }
  LLVMValueRef zero = LLVMConstNull(LLVMTypeOf(a));
  switch (e->op) {
  case NF_OP_NEG: return LLVMBuildSub(b, zero, a, "");
  case NF_OP_NOT: return LLVMBuildNot(b, a, "");
  case NF_OP_ABS:
    if (adt == NF_BOOL) return a;
    return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, a, zero, ""),
                           LLVMBuildSub(b, zero, a, ""), a, "");
  case NF_OP_FLOOR:
  case NF_OP_CEIL:
  case NF_OP_STOPGRAD: return a;
  default:
    fail(g, NF_EINVAL, "operator '%s' not supported on integers", nf_op_name((nf_op)e->op));
    return a;
  }
}

static LLVMValueRef op_binary(cg *g, int op, int adt, LLVMValueRef x, LLVMValueRef y) {
  LLVMBuilderRef b = g->B;
  if (is_float(adt)) {
    switch (op) {
    case NF_OP_ADD: return LLVMBuildFAdd(b, x, y, "");
    case NF_OP_SUB: return LLVMBuildFSub(b, x, y, "");
    case NF_OP_MUL: return LLVMBuildFMul(b, x, y, "");
    case NF_OP_DIV: return LLVMBuildFDiv(b, x, y, "");
    case NF_OP_FLOORDIV:
      return nf__vm_unary(g->M, b, NF_OP_FLOOR, LLVMBuildFDiv(b, x, y, ""));
    case NF_OP_MOD: {
      LLVMValueRef fl = nf__vm_unary(g->M, b, NF_OP_FLOOR, LLVMBuildFDiv(b, x, y, ""));
      return LLVMBuildFSub(b, x, LLVMBuildFMul(b, y, fl, ""), "");
    }
    case NF_OP_POW: return nf__vm_pow(g->M, b, x, y);
    case NF_OP_MIN: return nf__vm_fminmax(b, 0, x, y);
    case NF_OP_MAX: return nf__vm_fminmax(b, 1, x, y);
    case NF_OP_LT: return LLVMBuildFCmp(b, LLVMRealOLT, x, y, "");
    case NF_OP_LE: return LLVMBuildFCmp(b, LLVMRealOLE, x, y, "");
    case NF_OP_GT: return LLVMBuildFCmp(b, LLVMRealOGT, x, y, "");
    case NF_OP_GE: return LLVMBuildFCmp(b, LLVMRealOGE, x, y, "");
    case NF_OP_EQ: return LLVMBuildFCmp(b, LLVMRealOEQ, x, y, "");
    case NF_OP_NE: return LLVMBuildFCmp(b, LLVMRealUNE, x, y, "");
    default: break;
    }
  } else {
    int u = adt == NF_BOOL;
    switch (op) {
    case NF_OP_ADD: return u ? LLVMBuildOr(b, x, y, "") : LLVMBuildAdd(b, x, y, "");
    case NF_OP_SUB: return u ? LLVMBuildXor(b, x, y, "") : LLVMBuildSub(b, x, y, "");
    case NF_OP_MUL: return u ? LLVMBuildAnd(b, x, y, "") : LLVMBuildMul(b, x, y, "");
    case NF_OP_FLOORDIV:
    case NF_OP_MOD:
      if (u) break;
      return int_divmod(g, op == NF_OP_MOD, x, y);
    case NF_OP_MIN:
      return LLVMBuildSelect(b, LLVMBuildICmp(b, u ? LLVMIntULT : LLVMIntSLT, x, y, ""), x, y, "");
    case NF_OP_MAX:
      return LLVMBuildSelect(b, LLVMBuildICmp(b, u ? LLVMIntUGT : LLVMIntSGT, x, y, ""), x, y, "");
    case NF_OP_LT: return LLVMBuildICmp(b, u ? LLVMIntULT : LLVMIntSLT, x, y, "");
    case NF_OP_LE: return LLVMBuildICmp(b, u ? LLVMIntULE : LLVMIntSLE, x, y, "");
    case NF_OP_GT: return LLVMBuildICmp(b, u ? LLVMIntUGT : LLVMIntSGT, x, y, "");
    case NF_OP_GE: return LLVMBuildICmp(b, u ? LLVMIntUGE : LLVMIntSGE, x, y, "");
    case NF_OP_EQ: return LLVMBuildICmp(b, LLVMIntEQ, x, y, "");
    case NF_OP_NE: return LLVMBuildICmp(b, LLVMIntNE, x, y, "");
    case NF_OP_AND: return LLVMBuildAnd(b, x, y, "");
    case NF_OP_OR: return LLVMBuildOr(b, x, y, "");
    default: break;
    }
  }
  fail(g, NF_EINVAL, "operator '%s' not supported on this type", nf_op_name((nf_op)op));
  return x;
}

/* Phi-joinable representation of a branch result at the end of block bb. */
static LLVMValueRef finish_branch(cg *g, LLVMBasicBlockRef bb, vv a, int as_vec) {
  LLVMPositionBuilderAtEnd(g->B, bb);
  return as_vec ? mat(g, a) : a.s;
}

static vv emit_select(cg *g, const nf_expr *e) {
  vv c = emit(g, e->args[0]);
  int budget = 12;
  int safe = cheap(e->args[1], &budget) && cheap(e->args[2], &budget);
  if (c.k == K_UNI) {
    if (safe) {
      vv a = emit(g, e->args[1]), b2 = emit(g, e->args[2]);
      if (a.k == K_UNI && b2.k == K_UNI) return uni(LLVMBuildSelect(g->B, c.s, a.s, b2.s, ""));
      return vec(LLVMBuildSelect(g->B, c.s, mat(g, a), mat(g, b2), ""));
    }
    LLVMBasicBlockRef bt = new_block(g, "sel.t"), bf = new_block(g, "sel.f"),
                      bm = new_block(g, "sel.m");
    LLVMBuildCondBr(g->B, c.s, bt, bf);
    int mark = g->n_memo;
    LLVMPositionBuilderAtEnd(g->B, bt);
    vv a = emit(g, e->args[1]);
    LLVMBasicBlockRef et = LLVMGetInsertBlock(g->B);
    g->n_memo = mark;
    LLVMPositionBuilderAtEnd(g->B, bf);
    vv b2 = emit(g, e->args[2]);
    LLVMBasicBlockRef ef = LLVMGetInsertBlock(g->B);
    g->n_memo = mark;
    int as_vec = !(a.k == K_UNI && b2.k == K_UNI);
    LLVMValueRef va = finish_branch(g, et, a, as_vec);
    LLVMBuildBr(g->B, bm);
    LLVMValueRef vb = finish_branch(g, ef, b2, as_vec);
    LLVMBuildBr(g->B, bm);
    LLVMPositionBuilderAtEnd(g->B, bm);
    LLVMValueRef phi = LLVMBuildPhi(g->B, LLVMTypeOf(va), "");
    LLVMValueRef vals[2] = {va, vb};
    LLVMBasicBlockRef bbs[2] = {et, ef};
    LLVMAddIncoming(phi, vals, bbs, 2);
    return as_vec ? vec(phi) : uni(phi);
  }
  /* Lane-varying condition: both sides under their masks. */
  LLVMValueRef cv = mat(g, c);
  LLVMValueRef saved = g->mask;
  LLVMValueRef notc = LLVMBuildNot(g->B, cv, "");
  int mark = g->n_memo;
  vv a, b2;
  if (safe) {
    a = emit(g, e->args[1]);
    b2 = emit(g, e->args[2]);
  } else {
    g->mask = saved ? LLVMBuildAnd(g->B, saved, cv, "") : cv;
    a = emit(g, e->args[1]);
    g->n_memo = mark;
    g->mask = saved ? LLVMBuildAnd(g->B, saved, notc, "") : notc;
    b2 = emit(g, e->args[2]);
    g->n_memo = mark;
    g->mask = saved;
  }
  return vec(LLVMBuildSelect(g->B, cv, mat(g, a), mat(g, b2), ""));
}

static int is_fmul(const nf_expr *e) { return e->op == NF_OP_MUL && is_float(e->dtype); }

/* x OP y for an i64 comparison of a linear value with stride 1 (the
 * vector loop variable plus a uniform offset, as in the guards of
 * non-dividing splits and of padding) and a uniform one: lane l compares
 * l with d = y - base, so the mask is <0, 1, ..., W-1> < d' on i32 lanes
 * with d' clamped to [0, W] (instead of i64 vectors, which x86 compares
 * two registers at a time and then packs).  NULL for other shapes. */
static LLVMValueRef lane_compare(cg *g, int op, vv x, vv y) {
  if (op != NF_OP_LT && op != NF_OP_LE && op != NF_OP_GT && op != NF_OP_GE) return NULL;
  if (x.k == K_UNI && y.k == K_LIN) { /* y OP' x */
    vv t = x;
    x = y;
    y = t;
    op = op == NF_OP_LT   ? NF_OP_GT
         : op == NF_OP_LE ? NF_OP_GE
         : op == NF_OP_GT ? NF_OP_LT
                          : NF_OP_LE;
  }
  if (x.k != K_LIN || x.st != 1 || y.k != K_UNI) return NULL;
  LLVMBuilderRef b = g->B;
  /* l < t (LT: t = d, LE: t = d + 1); GE is not LT, GT is not LE. */
  LLVMValueRef d = LLVMBuildSub(b, y.s, x.s, "");
  if (op == NF_OP_LE || op == NF_OP_GT) d = LLVMBuildAdd(b, d, c64(g, 1), "");
  LLVMValueRef lo = c64(g, 0), hi = c64(g, g->W);
  d = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, d, lo, ""), lo, d, "");
  d = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSGT, d, hi, ""), hi, d, "");
  LLVMValueRef d32 = LLVMBuildTrunc(b, d, g->i32, "");
  LLVMValueRef iota[MAX_W];
  for (unsigned l = 0; l < g->W; l++) iota[l] = c32(g, l);
  LLVMValueRef sp = LLVMBuildShuffleVector(
      b, LLVMBuildInsertElement(b, LLVMGetUndef(vec_of(g->i32, g->W)), d32, c32(g, 0), ""),
      LLVMGetUndef(vec_of(g->i32, g->W)), LLVMConstNull(vec_of(g->i32, g->W)), "");
  LLVMValueRef m = LLVMBuildICmp(b, LLVMIntSLT, LLVMConstVector(iota, g->W), sp, "");
  if (op == NF_OP_GE || op == NF_OP_GT) m = LLVMBuildNot(b, m, "");
  return m;
}

static vv emit_raw(cg *g, const nf_expr *e) {
  switch (e->op) {
  case NF_OP_CONST: {
    LLVMTypeRef t = reg_type(g, e->dtype);
    if (!t) {
      fail(g, NF_EUNSUPPORTED, "%s constants are not supported", nf_dtype_name((nf_dtype)e->dtype));
      return uni(LLVMGetUndef(g->f32));
    }
    if (is_float(e->dtype)) return uni(LLVMConstReal(t, e->u.f));
    return uni(LLVMConstInt(t, (unsigned long long)e->u.i, 1));
  }
  case NF_OP_VAR: {
    uint32_t v = e->u.var;
    if (v >= g->p->n_vars || !g->f->var[v]) {
      fail(g, NF_EINVAL, "%s", "use of an unbound loop variable");
      return uni(c64(g, 0));
    }
    if (g->W && v == g->vvar) return lin(g->f->var[v], 1);
    return uni(g->f->var[v]);
  }
  case NF_OP_ACCESS:
    if (e->u.tensor >= g->p->n_bufs || e->n_args != g->p->bufs[e->u.tensor].rank) {
      fail(g, NF_EINVAL, "%s", "access to an unknown buffer or with a wrong rank");
      return uni(LLVMGetUndef(g->f32));
    }
    return emit_load(g, e);
  case NF_OP_SELECT:
    return emit_select(g, e);
  default:
    break;
  }
  int ar = e->n_args;
  if (ar == 1) {
    vv a = emit(g, e->args[0]);
    if (e->dtype == NF_I64 && e->op == NF_OP_NEG && a.k != K_VEC) return lane_mulc(g, a, -1);
    if (a.k == K_UNI) return uni(op_unary(g, e, a.s));
    return vec(op_unary(g, e, mat(g, a)));
  }
  if (ar != 2) {
    fail(g, NF_EINVAL, "%s", "malformed expression");
    return uni(LLVMGetUndef(g->i64));
  }
  int adt = e->args[0]->dtype;
  /* Contraction: x + a*b -> fmuladd(a, b, x). */
  if (e->op == NF_OP_ADD && is_float(adt) && (is_fmul(e->args[0]) || is_fmul(e->args[1]))) {
    const nf_expr *m = is_fmul(e->args[0]) ? e->args[0] : e->args[1];
    const nf_expr *o = m == e->args[0] ? e->args[1] : e->args[0];
    vv x = emit(g, m->args[0]), y = emit(g, m->args[1]), z = emit(g, o);
    if (x.k == K_UNI && y.k == K_UNI && z.k == K_UNI) return uni(fmuladd(g, x.s, y.s, z.s));
    return vec(fmuladd(g, mat(g, x), mat(g, y), mat(g, z)));
  }
  vv a = emit(g, e->args[0]), b2 = emit(g, e->args[1]);
  if (a.k == K_UNI && b2.k == K_UNI) return uni(op_binary(g, e->op, adt, a.s, b2.s));
  if (adt == NF_I64 && !g->rc) {
    LLVMValueRef m = lane_compare(g, e->op, a, b2);
    if (m) return vec(m);
  }
  if (e->dtype == NF_I64 && a.k != K_VEC && b2.k != K_VEC) {
    if (e->op == NF_OP_ADD) return lane_add(g, a, b2);
    if (e->op == NF_OP_SUB) return lane_add(g, a, lane_mulc(g, b2, -1));
    if (e->op == NF_OP_MUL) {
      if (b2.k == K_UNI && e->args[1]->op == NF_OP_CONST) return lane_mulc(g, a, e->args[1]->u.i);
      if (a.k == K_UNI && e->args[0]->op == NF_OP_CONST) return lane_mulc(g, b2, e->args[0]->u.i);
    }
  }
  return vec(op_binary(g, e->op, adt, mat(g, a), mat(g, b2)));
}

static vv emit(cg *g, const nf_expr *e) {
  vv r;
  if (memo_get(g, e, &r)) return r;
  if (g->rc) return uni(LLVMGetUndef(reg_type(g, e->dtype) ? reg_type(g, e->dtype) : g->i64));
  r = emit_raw(g, e);
  memo_put(g, e, r);
  return r;
}

/* ---- statements ---- */

static void emit_stmt(cg *g, const nf_lstmt *s);

static LLVMValueRef combine(cg *g, int op, int dt, LLVMValueRef acc, LLVMValueRef v) {
  switch (op) {
  case NF_RED_SUM: return op_binary(g, NF_OP_ADD, dt, acc, v);
  case NF_RED_PROD: return op_binary(g, NF_OP_MUL, dt, acc, v);
  case NF_RED_MAX: return op_binary(g, NF_OP_MAX, dt, acc, v);
  case NF_RED_MIN: return op_binary(g, NF_OP_MIN, dt, acc, v);
  default: return v;
  }
}

static LLVMValueRef to_mem(cg *g, int dt, LLVMValueRef v) {
  if (dt != NF_BOOL) return v;
  LLVMTypeRef t = LLVMTypeOf(v);
  LLVMTypeRef to = LLVMGetTypeKind(t) == LLVMVectorTypeKind ? vec_of(g->i8, LLVMGetVectorSize(t)) : g->i8;
  return LLVMBuildZExt(g->B, v, to, "");
}

static LLVMValueRef from_mem(cg *g, int dt, LLVMValueRef v) {
  return dt == NF_BOOL ? bool_from_mem(g, v) : v;
}

static LLVMValueRef lane(cg *g, LLVMValueRef v, unsigned l) {
  return LLVMBuildExtractElement(g->B, v, c32(g, l), "");
}

static void emit_store(cg *g, const nf_lstmt *s) {
  const nf_lprog *p = g->p;
  if (s->buf >= p->n_bufs || s->n_idx != p->bufs[s->buf].rank || !s->value) {
    fail(g, NF_EINVAL, "%s", "store to an unknown buffer or with a wrong rank");
    return;
  }
  const nf_lbuf *lb = &p->bufs[s->buf];
  if (lb->kind == NF_BUF_INPUT) {
    fail(g, NF_EINVAL, "store into input buffer '%s'", lb->name ? lb->name : "?");
    return;
  }
  if (s->value->dtype != lb->dtype) {
    fail(g, NF_EINVAL, "store of a value of another dtype into '%s'", lb->name ? lb->name : "?");
    return;
  }
  int dt = lb->dtype;
  LLVMTypeRef et = mem_type(g, dt);
  unsigned align = (unsigned)nf_dtype_size((nf_dtype)dt);
  LLVMValueRef base = g->f->bufp[s->buf];
  if (!base) {
    fail(g, NF_EINVAL, "store to buffer '%s' outside its ALLOC", lb->name ? lb->name : "?");
    return;
  }
  g->n_memo = 0;
  int op = s->op;
  /* Contraction of SUM reductions of a product. */
  int fma = op == NF_RED_SUM && is_fmul(s->value);
  vv val, fa = {0}, fb = {0};
  if (fma) {
    fa = emit(g, s->value->args[0]);
    fb = emit(g, s->value->args[1]);
  } else {
    val = emit(g, s->value);
  }
  vv off = offset_of(g, s->buf, s->n_idx, s->idx);
  if (g->rc) return;
  LLVMBuilderRef b = g->B;
  if (!g->W) {
    LLVMValueRef ptr = LLVMBuildGEP2(b, et, base, &off.s, 1, "");
    LLVMValueRef nv;
    if (op == NF_RED_NONE) {
      nv = val.s;
    } else {
      LLVMValueRef cur = LLVMBuildLoad2(b, et, ptr, "");
      LLVMSetAlignment(cur, align);
      cur = from_mem(g, dt, cur);
      nv = fma ? fmuladd(g, fa.s, fb.s, cur) : combine(g, op, dt, cur, val.s);
    }
    LLVMValueRef st = LLVMBuildStore(b, to_mem(g, dt, nv), ptr);
    LLVMSetAlignment(st, align);
    return;
  }
  /* Vector mode. */
  if (fma) val = vec(LLVMBuildFMul(b, mat(g, fa), mat(g, fb), ""));
  LLVMTypeRef vt = vec_of(et, g->W);
  if (off.k == K_LIN && off.st == 1) {
    LLVMValueRef ptr = LLVMBuildGEP2(b, et, base, &off.s, 1, "");
    ptr = LLVMBuildBitCast(b, ptr, LLVMPointerType(vt, 0), "");
    /* A masked store into a private temporary whose lanes are all in
     * bounds: load, blend, store (no other thread sees the inactive lanes
     * rewritten with their own values), which keeps a register tile
     * promotable to registers. */
    LLVMValueRef blend = NULL;
    if (g->mask && g->f->own[s->buf] && in_bounds(g, lb, s->n_idx, s->idx)) {
      blend = LLVMBuildLoad2(b, vt, ptr, "");
      LLVMSetAlignment(blend, align);
    }
    LLVMValueRef nv;
    if (op == NF_RED_NONE) {
      nv = mat(g, val);
    } else {
      LLVMValueRef cur;
      if (blend) {
        cur = blend;
      } else if (!g->mask) {
        cur = LLVMBuildLoad2(b, vt, ptr, "");
        LLVMSetAlignment(cur, align);
      } else {
        LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(ptr)};
        LLVMValueRef a[4] = {ptr, c32(g, align), g->mask, LLVMGetUndef(vt)};
        cur = intr(g, "llvm.masked.load", ovl, 2, a, 4);
      }
      cur = from_mem(g, dt, cur);
      nv = fma ? fmuladd(g, mat(g, fa), mat(g, fb), cur) : combine(g, op, dt, cur, mat(g, val));
    }
    nv = to_mem(g, dt, nv);
    if (blend) nv = LLVMBuildSelect(b, g->mask, nv, blend, "");
    if (!g->mask || blend) {
      LLVMValueRef st = LLVMBuildStore(b, nv, ptr);
      LLVMSetAlignment(st, align);
    } else {
      LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(ptr)};
      LLVMValueRef a[4] = {nv, ptr, c32(g, align), g->mask};
      intr(g, "llvm.masked.store", ovl, 2, a, 4);
    }
    return;
  }
  if (op == NF_RED_NONE || (off.k == K_LIN && off.st != 0)) {
    /* Scatter (lanes in order for overlapping plain stores), or
     * gather-combine-scatter over distinct addresses. */
    LLVMValueRef ix = mat(g, off);
    LLVMValueRef ps = LLVMBuildGEP2(b, et, base, &ix, 1, "");
    LLVMValueRef m = g->mask ? g->mask : all_true(g);
    LLVMValueRef nv = mat(g, val);
    if (op != NF_RED_NONE) {
      LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(ps)};
      LLVMValueRef a[4] = {ps, c32(g, align), m, LLVMGetUndef(vt)};
      LLVMValueRef cur = from_mem(g, dt, intr(g, "llvm.masked.gather", ovl, 2, a, 4));
      nv = combine(g, op, dt, cur, nv);
    }
    nv = to_mem(g, dt, nv);
    LLVMTypeRef ovl[2] = {vt, LLVMTypeOf(ps)};
    LLVMValueRef a[4] = {nv, ps, c32(g, align), m};
    intr(g, "llvm.masked.scatter", ovl, 2, a, 4);
    return;
  }
  LLVMValueRef vals = mat(g, val);
  if (off.k == K_UNI) {
    /* One address: fold the active lanes in order. */
    LLVMBasicBlockRef done = NULL;
    if (g->mask) {
      LLVMValueRef any = intr(g, "llvm.vector.reduce.or", NULL, 1, &g->mask, 1);
      LLVMBasicBlockRef go = new_block(g, "red.go");
      done = new_block(g, "red.done");
      LLVMBuildCondBr(b, any, go, done);
      LLVMPositionBuilderAtEnd(b, go);
    }
    LLVMValueRef ptr = LLVMBuildGEP2(b, et, base, &off.s, 1, "");
    LLVMValueRef acc = LLVMBuildLoad2(b, et, ptr, "");
    LLVMSetAlignment(acc, align);
    acc = from_mem(g, dt, acc);
    for (unsigned l = 0; l < g->W; l++) {
      LLVMValueRef n = combine(g, op, dt, acc, lane(g, vals, l));
      acc = g->mask ? LLVMBuildSelect(b, lane(g, g->mask, l), n, acc, "") : n;
    }
    LLVMValueRef st = LLVMBuildStore(b, to_mem(g, dt, acc), ptr);
    LLVMSetAlignment(st, align);
    if (done) {
      LLVMBuildBr(b, done);
      LLVMPositionBuilderAtEnd(b, done);
    }
    return;
  }
  /* Unknown (possibly repeated) addresses: lane by lane, in order. */
  LLVMValueRef ix = mat(g, off);
  for (unsigned l = 0; l < g->W; l++) {
    LLVMBasicBlockRef done = NULL;
    if (g->mask) {
      LLVMBasicBlockRef go = new_block(g, "lane.go");
      done = new_block(g, "lane.done");
      LLVMBuildCondBr(b, lane(g, g->mask, l), go, done);
      LLVMPositionBuilderAtEnd(b, go);
    }
    LLVMValueRef o = lane(g, ix, l);
    LLVMValueRef ptr = LLVMBuildGEP2(b, et, base, &o, 1, "");
    LLVMValueRef cur = LLVMBuildLoad2(b, et, ptr, "");
    LLVMSetAlignment(cur, align);
    LLVMValueRef nv = combine(g, op, dt, from_mem(g, dt, cur), lane(g, vals, l));
    LLVMValueRef st = LLVMBuildStore(b, to_mem(g, dt, nv), ptr);
    LLVMSetAlignment(st, align);
    if (done) {
      LLVMBuildBr(b, done);
      LLVMPositionBuilderAtEnd(b, done);
    }
  }
}

static void emit_body(cg *g, const nf_lstmt *s) {
  for (int i = 0; i < s->n_body; i++) {
    if (g->rc) return;
    emit_stmt(g, s->body[i]);
  }
}

/* ---- static analyses of statements (code size, tiles, dependences) ----
 * Expressions are DAGs: the walks go through nf_expr_visit (each node
 * once) and answer conservatively when it runs out of memory. */

static void weight_fn(const nf_expr *e, void *user) {
  int64_t *w = user;
  switch (e->op) {
  case NF_OP_EXP:
  case NF_OP_LOG:
  case NF_OP_TANH:
  case NF_OP_SIGMOID:
  case NF_OP_ERF:
  case NF_OP_POW: *w += 40; break; /* an inline polynomial or a call */
  default: *w += 1;
  }
}

/* Weight of the code an expression emits: its distinct nodes, the vector
 * math functions counting for their size; at least cap when unknown. */
static int64_t expr_weight(const nf_expr *e, int64_t cap) {
  int64_t w = 0;
  return nf_expr_visit(e, weight_fn, &w) == NF_OK ? w : cap;
}

/* Weight of the code a statement emits before the backend's own
 * unrolling (UNROLL loops multiply their body). */
static int64_t stmt_weight(const nf_lstmt *s, int64_t cap) {
  int64_t w = 0;
  if (s->kind == NF_LS_STORE) {
    w = 1 + expr_weight(s->value, cap);
    for (int i = 0; i < s->n_idx && w < cap; i++) w += expr_weight(s->idx[i], cap - w);
    return w;
  }
  if (s->kind == NF_LS_IF) w += expr_weight(s->cond, cap);
  for (int i = 0; i < s->n_body && w < cap; i++) w += stmt_weight(s->body[i], cap - w);
  if (s->kind == NF_LS_LOOP && s->loop_kind == NF_LOOP_UNROLL && s->extent > 1)
    w = w > cap / s->extent ? cap : w * s->extent;
  return w < cap ? w : cap;
}

typedef struct var_use {
  const uint32_t *vars;
  int n_vars;
  unsigned used; /* bit k: vars[k] occurs */
} var_use;

static void var_use_fn(const nf_expr *e, void *user) {
  var_use *u = user;
  if (e->op != NF_OP_VAR) return;
  for (int k = 0; k < u->n_vars; k++)
    if (e->u.var == u->vars[k]) u->used |= 1u << k;
}

/* Bit k set when vars[k] (n_vars <= 32) occurs in e; -1 when unknown. */
static long vars_used(const nf_expr *e, const uint32_t *vars, int n_vars) {
  var_use u = {vars, n_vars, 0};
  return nf_expr_visit(e, var_use_fn, &u) == NF_OK ? (long)u.used : -1;
}

/* Scans the body of a loop over `var` for a register tile: returns -1
 * when a loop inside is not small (the loops other than vector loops
 * nested at any depth must multiply to at most TILE_MAX_UNROLL
 * iterations: they get fully unrolled) or an ALLOC is inside; 1 when a
 * reduction store accumulates into a temporary allocated outside the
 * loop at an address that depends on the loops inside (the tile's
 * elements) but not on var; 0 otherwise.  inner[0..n_inner) are the
 * variables of the enclosing loops inside. */
static int scan_tile(cg *g, const nf_lstmt *s, uint32_t var, int64_t trips,
                     uint32_t *inner, int n_inner) {
  int found = 0;
  if (s->kind == NF_LS_ALLOC) return -1;
  if (s->kind == NF_LS_LOOP) {
    if (s->loop_kind != NF_LOOP_VECTOR) trips *= s->extent;
    if (trips > TILE_MAX_UNROLL || n_inner == 8) return -1;
    inner[n_inner++] = s->var;
  }
  if (s->kind == NF_LS_STORE) {
    if (s->op == NF_RED_NONE || s->buf >= g->p->n_bufs ||
        g->p->bufs[s->buf].kind != NF_BUF_TEMP || !g->f->bufp[s->buf])
      return 0;
    /* vars[0] = var, then the inner loops' variables */
    uint32_t vars[9];
    vars[0] = var;
    memcpy(vars + 1, inner, sizeof *inner * (size_t)n_inner);
    long per_element = 0;
    for (int i = 0; i < s->n_idx; i++) {
      long u = vars_used(s->idx[i], vars, n_inner + 1);
      if (u < 0 || (u & 1)) return 0;
      per_element |= u;
    }
    return per_element != 0;
  }
  for (int i = 0; i < s->n_body; i++) {
    int r = scan_tile(g, s->body[i], var, trips, inner, n_inner);
    if (r < 0) return -1;
    found |= r;
  }
  return found;
}

typedef struct buf_read {
  const uint8_t *bufs;
  uint32_t n_bufs;
  int hit;
} buf_read;

static void buf_read_fn(const nf_expr *e, void *user) {
  buf_read *r = user;
  if (e->op == NF_OP_ACCESS && (e->u.tensor >= r->n_bufs || r->bufs[e->u.tensor])) r->hit = 1;
}

/* 1 when e may read one of the marked buffers (bufs[0..n_bufs)). */
static int expr_reads(const nf_expr *e, const uint8_t *bufs, uint32_t n_bufs) {
  buf_read r = {bufs, n_bufs, 0};
  return nf_expr_visit(e, buf_read_fn, &r) != NF_OK || r.hit;
}

static void mark_stored(const nf_lstmt *s, uint8_t *bufs, uint32_t n_bufs) {
  if (s->kind == NF_LS_STORE && s->buf < n_bufs) bufs[s->buf] = 1;
  for (int i = 0; i < s->n_body; i++) mark_stored(s->body[i], bufs, n_bufs);
}

/* 1 when some index of a store is affine in var with a nonzero
 * coefficient: distinct values of var store to distinct elements. */
static int injective_in(const nf_lstmt *st, uint32_t var) {
  for (int i = 0; i < st->n_idx; i++) {
    nf_affine a;
    if (nf_expr_affine(st->idx[i], &a) != 1) continue;
    for (int k = 0; k < a.n; k++)
      if (a.var[k] == var && a.coef[k] != 0) return 1;
  }
  return 0;
}

/* No statement under s reads a buffer stored under s, and every store
 * under s is injective in var: then the iterations of the loop s over
 * var touch disjoint elements and may run in any order. */
static int reorder_ok(const nf_lstmt *s, uint32_t var, const uint8_t *stored, uint32_t n) {
  if (s->kind == NF_LS_STORE) {
    if (!injective_in(s, var) || expr_reads(s->value, stored, n)) return 0;
    for (int i = 0; i < s->n_idx; i++)
      if (expr_reads(s->idx[i], stored, n)) return 0;
  }
  if (s->kind == NF_LS_IF && expr_reads(s->cond, stored, n)) return 0;
  for (int i = 0; i < s->n_body; i++)
    if (!reorder_ok(s->body[i], var, stored, n)) return 0;
  return 1;
}

static int iterations_independent(cg *g, const nf_lstmt *loop) {
  uint8_t *stored = calloc(g->p->n_bufs + 1, 1);
  if (!stored) return 0;
  for (int i = 0; i < loop->n_body; i++) mark_stored(loop->body[i], stored, g->p->n_bufs);
  int ok = 1;
  for (int i = 0; i < loop->n_body && ok; i++)
    ok = reorder_ok(loop->body[i], loop->var, stored, g->p->n_bufs);
  free(stored);
  return ok;
}

/* Weight of the code a loop body emits with its serial loops unrolled. */
static int64_t unrolled_weight(const nf_lstmt *s, int64_t trips, int64_t cap) {
  if (s->kind == NF_LS_STORE) {
    int64_t w = stmt_weight(s, cap);
    return w > cap / trips ? cap : w * trips;
  }
  if (s->kind == NF_LS_LOOP && s->loop_kind != NF_LOOP_VECTOR) {
    if (s->extent > cap / trips) return cap;
    trips *= s->extent;
  }
  int64_t w = s->kind == NF_LS_IF ? expr_weight(s->cond, cap) * trips : 0;
  for (int i = 0; i < s->n_body && w < cap; i++) w += unrolled_weight(s->body[i], trips, cap - w);
  return w < cap ? w : cap;
}

/* A serial loop that accumulates into a register tile: the reduction
 * loop of a cache_write tile (small loops only inside, a reduction into
 * a temporary at an address independent of the loop variable).  Its
 * inner loops are fully unrolled so that the tile can live in registers,
 * and the loop itself is unrolled twice, which lets the register
 * allocator keep the accumulators in place instead of copying them
 * around the back edge. */
static int tile_reduction_loop(cg *g, const nf_lstmt *s) {
  if (s->extent < 8) return 0;
  int found = 0;
  for (int i = 0; i < s->n_body; i++) {
    uint32_t inner[8];
    int r = scan_tile(g, s->body[i], s->var, 1, inner, 0);
    if (r < 0) return 0;
    found |= r;
  }
  /* Two copies of the unrolled body must stay small (an expensive
   * operand, say a tanh per row, would be replicated for every row). */
  int64_t w = 0;
  for (int i = 0; i < s->n_body && found && w <= TILE_MAX_WEIGHT; i++)
    w += unrolled_weight(s->body[i], 1, TILE_MAX_WEIGHT + 1);
  return found && w <= TILE_MAX_WEIGHT;
}

/* Stores a loop nest executes when its serial loops are unrolled (vector
 * loops count once); SMALL_UNROLL + 1 as soon as it is larger, or holds
 * an ALLOC or a PARALLEL loop. */
static int64_t unrolled_stores(const nf_lstmt *s) {
  if (s->kind == NF_LS_STORE) return 1;
  if (s->kind == NF_LS_ALLOC || (s->kind == NF_LS_LOOP && s->loop_kind == NF_LOOP_PARALLEL))
    return SMALL_UNROLL + 1;
  int64_t n = 0;
  for (int i = 0; i < s->n_body && n <= SMALL_UNROLL; i++) n += unrolled_stores(s->body[i]);
  if (s->kind == NF_LS_LOOP && s->loop_kind != NF_LOOP_VECTOR) {
    if (s->extent > SMALL_UNROLL) return SMALL_UNROLL + 1;
    n *= s->extent;
  }
  return n;
}

static int has_serial_loop(const nf_lstmt *s) {
  if (s->kind == NF_LS_LOOP && s->loop_kind != NF_LOOP_VECTOR) return 1;
  for (int i = 0; i < s->n_body; i++)
    if (has_serial_loop(s->body[i])) return 1;
  return 0;
}

/* Unroll factor of a constant-extent serial loop emitted as a loop:
 * 2 for the reduction loop of a register tile (*tile set), INNER_UNROLL
 * for an innermost loop (nothing but vector loops inside) with a small
 * body, which halves the loop overhead of reductions and elementwise
 * loops (their chains and streams need no more), else 1. */
static int64_t unroll_factor(cg *g, const nf_lstmt *s, int *tile) {
  *tile = 0;
  if (g->in_tile || s->extent < 4) return 1;
  if (tile_reduction_loop(g, s)) {
    *tile = 1;
    return 2;
  }
  if (g->lean) return 1;
  int64_t n = 0, w = 0;
  for (int i = 0; i < s->n_body; i++) {
    if (has_serial_loop(s->body[i])) return 1;
    n += unrolled_stores(s->body[i]);
    w += unrolled_weight(s->body[i], 1, UNROLL_MAX_WEIGHT + 1);
  }
  return n >= 1 && n <= 2 && w * INNER_UNROLL <= UNROLL_MAX_WEIGHT ? INNER_UNROLL : 1;
}

/* for (v = lo; v < hi; v++) body.  checked == 0: lo = 0, hi = the
 * constant extent >= 1, and the body may be unrolled (unroll_factor):
 * u copies per iteration up to extent - extent % u, then the remaining
 * iterations straight. */
static void emit_counted(cg *g, const nf_lstmt *s, LLVMValueRef lo, LLVMValueRef hi,
                         int checked) {
  LLVMBuilderRef b = g->B;
  int tile = 0;
  int64_t u = checked ? 1 : unroll_factor(g, s, &tile);
  int64_t main_end = checked ? 0 : s->extent / u * u;
  if (!checked) hi = c64(g, main_end);
  LLVMValueRef saved = g->f->var[s->var];
  g->in_tile += tile;
  if (checked || main_end > 0) {
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
    LLVMBasicBlockRef head = new_block(g, "loop"), exit = new_block(g, "loop.end");
    if (checked)
      LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, lo, hi, ""), head, exit);
    else
      LLVMBuildBr(b, head);
    LLVMPositionBuilderAtEnd(b, head);
    LLVMValueRef phi = LLVMBuildPhi(b, g->i64, s->var_name ? s->var_name : "i");
    for (int64_t k = 0; k < u && !g->rc; k++) {
      g->f->var[s->var] = k ? LLVMBuildAdd(b, phi, c64(g, k), "") : phi;
      g->tile_odd = tile && (k & 1);
      emit_body(g, s);
    }
    g->tile_odd = 0;
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(b);
    LLVMValueRef next = LLVMBuildAdd(b, phi, c64(g, u), "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, next, hi, ""), head, exit);
    LLVMValueRef vals[2] = {lo, next};
    LLVMBasicBlockRef bbs[2] = {pre, latch};
    LLVMAddIncoming(phi, vals, bbs, 2);
    LLVMPositionBuilderAtEnd(b, exit);
  }
  for (int64_t i = main_end; !checked && i < s->extent && !g->rc; i++) {
    g->f->var[s->var] = c64(g, i);
    emit_body(g, s);
  }
  g->in_tile -= tile;
  g->f->var[s->var] = saved;
}

static int vectorizable(const nf_lstmt *s) {
  if (s->kind == NF_LS_LOOP || s->kind == NF_LS_ALLOC) return 0;
  if (s->kind == NF_LS_STORE) return 1;
  for (int i = 0; i < s->n_body; i++)
    if (!vectorizable(s->body[i])) return 0;
  return 1;
}

/* A VECTOR loop is emitted with explicit vectors when nothing in its
 * body is a loop or an ALLOC. */
static int vectorizable_body(const nf_lstmt *loop) {
  for (int i = 0; i < loop->n_body; i++)
    if (!vectorizable(loop->body[i])) return 0;
  return 1;
}

static void add_attr(cg *g, LLVMValueRef fn, LLVMAttributeIndex idx, unsigned kind) {
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(g->C, kind, 0));
}

/* Functions that hold loops realign their stack: spilled vector registers
 * (a register tile larger than the register file) then get aligned slots
 * instead of unaligned ones that may straddle cache lines. */
static void add_stackrealign(cg *g, LLVMValueRef fn) {
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                          LLVMCreateStringAttribute(g->C, "stackrealign", 12, "", 0));
}

static void fstate_init(cg *g, fstate *f, LLVMValueRef fn) {
  memset(f, 0, sizeof *f);
  f->fn = fn;
  f->bufp = calloc(g->p->n_bufs + 1, sizeof *f->bufp);
  f->var = calloc(g->p->n_vars + 1, sizeof *f->var);
  f->own = calloc(g->p->n_bufs + 1, 1);
  if (!f->bufp || !f->var || !f->own) fail(g, NF_ENOMEM, "%s", "out of memory");
  f->entry = LLVMAppendBasicBlockInContext(g->C, fn, "entry");
  f->start = LLVMAppendBasicBlockInContext(g->C, fn, "start");
  LLVMPositionBuilderAtEnd(g->AB, f->entry);
  LLVMPositionBuilderAtEnd(g->B, f->start);
}

static void fstate_free(fstate *f) {
  free(f->bufp);
  free(f->own);
  free(f->var);
  free(f->heap);
}

static LLVMValueRef libc_fn(cg *g, const char *name, LLVMTypeRef fty) {
  LLVMValueRef fn = LLVMGetNamedFunction(g->M, name);
  if (!fn) fn = LLVMAddFunction(g->M, name, fty);
  return fn;
}

/* Closes the function: entry -> (heap temps ok ? start : fail); the code's
 * last block frees the heap temps and returns ret (NULL: void). */
static void fstate_finish(cg *g, fstate *f, LLVMValueRef ret) {
  LLVMBuilderRef b = g->B;
  LLVMTypeRef free_ty = LLVMFunctionType(LLVMVoidTypeInContext(g->C), &g->vp, 1, 0);
  LLVMValueRef free_fn = libc_fn(g, "free", free_ty);
  for (int i = 0; i < f->n_heap; i++)
    LLVMBuildCall2(b, free_ty, free_fn, &f->heap[i].ptr, 1, "");
  if (ret)
    LLVMBuildRet(b, ret);
  else
    LLVMBuildRetVoid(b);
  if (!f->n_heap) {
    LLVMBuildBr(g->AB, f->start);
    return;
  }
  LLVMValueRef bad = LLVMConstInt(g->i1, 0, 0);
  for (int i = 0; i < f->n_heap; i++)
    bad = LLVMBuildOr(g->AB, bad, LLVMBuildIsNull(g->AB, f->heap[i].ptr, ""), "");
  LLVMBasicBlockRef oom = LLVMAppendBasicBlockInContext(g->C, f->fn, "oom");
  LLVMBuildCondBr(g->AB, bad, oom, f->start);
  LLVMPositionBuilderAtEnd(b, oom);
  for (int i = 0; i < f->n_heap; i++)
    LLVMBuildCall2(b, free_ty, free_fn, &f->heap[i].ptr, 1, "");
  if (ret) {
    LLVMBuildRet(b, c32(g, NF_KERNEL_ENOMEM));
  } else {
    nf__vm_intrinsic(g->M, b, "llvm.trap", NULL, 0, NULL, 0);
    LLVMBuildUnreachable(b);
  }
}

static void emit_alloc(cg *g, const nf_lstmt *s) {
  const nf_lprog *p = g->p;
  if (s->buf >= p->n_bufs || p->bufs[s->buf].kind != NF_BUF_TEMP) {
    fail(g, NF_EINVAL, "%s", "ALLOC of a buffer that is not a temporary");
    return;
  }
  const nf_lbuf *lb = &p->bufs[s->buf];
  LLVMTypeRef et = mem_type(g, lb->dtype);
  if (!et) {
    fail(g, NF_EUNSUPPORTED, "temporary '%s' has an unsupported dtype", lb->name ? lb->name : "?");
    return;
  }
  int64_t n = 1;
  for (int d = 0; d < lb->rank; d++) {
    if (lb->shape[d] < 0 || (lb->shape[d] && n > INT64_MAX / 64 / lb->shape[d])) {
      fail(g, NF_EINVAL, "temporary '%s' is too large", lb->name ? lb->name : "?");
      return;
    }
    n *= lb->shape[d];
  }
  if (n == 0) n = 1;
  int64_t bytes = n * (int64_t)nf_dtype_size((nf_dtype)lb->dtype);
  LLVMValueRef ptr;
  fstate *f = g->f;
  if (bytes <= STACK_TEMP_MAX && f->stack_bytes + bytes <= STACK_FN_MAX) {
    f->stack_bytes += bytes;
    LLVMValueRef a = LLVMBuildAlloca(g->AB, LLVMArrayType(et, (unsigned)n), lb->name ? lb->name : "tmp");
    LLVMSetAlignment(a, 64);
    ptr = LLVMBuildBitCast(g->AB, a, LLVMPointerType(et, 0), "");
  } else {
    if (f->n_heap == f->cap_heap) {
      int nc = f->cap_heap ? 2 * f->cap_heap : 4;
      heap_tmp *h = realloc(f->heap, (size_t)nc * sizeof *h);
      if (!h) {
        fail(g, NF_ENOMEM, "%s", "out of memory");
        return;
      }
      f->heap = h;
      f->cap_heap = nc;
    }
    LLVMTypeRef at[2] = {g->i64, g->i64};
    LLVMTypeRef aty = LLVMFunctionType(g->vp, at, 2, 0);
    LLVMValueRef fn = libc_fn(g, "aligned_alloc", aty);
    LLVMValueRef args[2] = {c64(g, 64), c64(g, (bytes + 63) / 64 * 64)};
    LLVMValueRef raw = LLVMBuildCall2(g->AB, aty, fn, args, 2, "");
    f->heap[f->n_heap++].ptr = raw;
    ptr = LLVMBuildBitCast(g->AB, raw, LLVMPointerType(et, 0), "");
  }
  LLVMValueRef saved = f->bufp[s->buf];
  uint8_t saved_own = f->own[s->buf];
  f->bufp[s->buf] = ptr;
  f->own[s->buf] = 1;
  emit_body(g, s);
  f->bufp[s->buf] = saved;
  f->own[s->buf] = saved_own;
}

static void emit_parallel(cg *g, const nf_lstmt *s) {
  const nf_lprog *p = g->p;
  fstate *outer = g->f;
  uint32_t nb = p->n_bufs, nv = p->n_vars;
  int id = g->n_bodies++;
  char name[48];
  /* Captures: live buffers, then bound variables. */
  LLVMTypeRef ptys[MAX_CAP_B + MAX_CAP_V + 2];
  uint32_t cap_buf[MAX_CAP_B], cap_var[MAX_CAP_V];
  int n_cb = 0, n_cv = 0;
  for (uint32_t i = 0; i < nb; i++)
    if (outer->bufp[i]) {
      if (n_cb == MAX_CAP_B) {
        fail(g, NF_ELIMIT, "%s", "more than 256 live buffers in a parallel loop");
        return;
      }
      cap_buf[n_cb++] = i;
    }
  for (uint32_t i = 0; i < nv; i++)
    if (outer->var[i]) {
      if (n_cv == MAX_CAP_V) {
        fail(g, NF_ELIMIT, "%s", "too many loop variables around a parallel loop");
        return;
      }
      cap_var[n_cv++] = i;
    }
  int n_cap = n_cb + n_cv;
  /* Caller side: ctx array of i64. */
  LLVMTypeRef ctx_ty = LLVMArrayType(g->i64, (unsigned)(n_cap ? n_cap : 1));
  LLVMValueRef ctx = LLVMBuildAlloca(g->AB, ctx_ty, "ctx");
  LLVMValueRef ctx64 = LLVMBuildBitCast(g->B, ctx, LLVMPointerType(g->i64, 0), "");
  for (int i = 0; i < n_cap; i++) {
    LLVMValueRef ix = c64(g, i);
    LLVMValueRef slot = LLVMBuildGEP2(g->B, g->i64, ctx64, &ix, 1, "");
    LLVMValueRef v = i < n_cb ? LLVMBuildPtrToInt(g->B, outer->bufp[cap_buf[i]], g->i64, "")
                              : outer->var[cap_var[i - n_cb]];
    LLVMBuildStore(g->B, v, slot);
  }
  /* inner(noalias bufs..., vars..., b, e) */
  for (int i = 0; i < n_cb; i++) ptys[i] = LLVMTypeOf(outer->bufp[cap_buf[i]]);
  for (int i = 0; i < n_cv + 2; i++) ptys[n_cb + i] = g->i64;
  LLVMTypeRef inner_ty = LLVMFunctionType(LLVMVoidTypeInContext(g->C), ptys, (unsigned)(n_cap + 2), 0);
  snprintf(name, sizeof name, "nf_inner_%d", id);
  LLVMValueRef inner = LLVMAddFunction(g->M, name, inner_ty);
  LLVMSetLinkage(inner, LLVMInternalLinkage);
  add_attr(g, inner, LLVMAttributeFunctionIndex, g->kind_alwaysinline);
  add_attr(g, inner, LLVMAttributeFunctionIndex, g->kind_nounwind);
  for (int i = 0; i < n_cb; i++) add_attr(g, inner, (LLVMAttributeIndex)(i + 1), g->kind_noalias);
  snprintf(name, sizeof name, "nf_body_%d", id);
  LLVMValueRef body = LLVMAddFunction(g->M, name, g->body_ty);
  LLVMSetLinkage(body, LLVMInternalLinkage);
  add_attr(g, body, LLVMAttributeFunctionIndex, g->kind_nounwind);
  add_stackrealign(g, body);

  LLVMBasicBlockRef resume = LLVMGetInsertBlock(g->B);
  /* The body: unpack and call inner. */
  {
    LLVMBasicBlockRef bb = LLVMAppendBasicBlockInContext(g->C, body, "entry");
    LLVMPositionBuilderAtEnd(g->B, bb);
    LLVMValueRef c = LLVMBuildBitCast(g->B, LLVMGetParam(body, 0), LLVMPointerType(g->i64, 0), "");
    LLVMValueRef args[MAX_CAP_B + MAX_CAP_V + 2];
    for (int i = 0; i < n_cap; i++) {
      LLVMValueRef ix = c64(g, i);
      LLVMValueRef v = LLVMBuildLoad2(g->B, g->i64, LLVMBuildGEP2(g->B, g->i64, c, &ix, 1, ""), "");
      args[i] = i < n_cb ? LLVMBuildIntToPtr(g->B, v, ptys[i], "") : v;
    }
    args[n_cap] = LLVMGetParam(body, 1);
    args[n_cap + 1] = LLVMGetParam(body, 2);
    LLVMBuildCall2(g->B, inner_ty, inner, args, (unsigned)(n_cap + 2), "");
    LLVMBuildRetVoid(g->B);
  }
  /* inner: for (v = b; v < e; v++) body */
  fstate fi;
  fstate_init(g, &fi, inner);
  fi.in_parallel = 1;
  g->f = &fi;
  for (int i = 0; i < n_cb; i++) fi.bufp[cap_buf[i]] = LLVMGetParam(inner, (unsigned)i);
  for (int i = 0; i < n_cv; i++) fi.var[cap_var[i]] = LLVMGetParam(inner, (unsigned)(n_cb + i));
  emit_counted(g, s, LLVMGetParam(inner, (unsigned)n_cap), LLVMGetParam(inner, (unsigned)n_cap + 1), 1);
  fstate_finish(g, &fi, NULL);
  fstate_free(&fi);
  g->f = outer;
  LLVMPositionBuilderAtEnd(g->AB, outer->entry);
  LLVMPositionBuilderAtEnd(g->B, resume);
  /* Call through parallel_for, or directly when it is NULL. */
  LLVMBasicBlockRef bpf = new_block(g, "pfor"), bdir = new_block(g, "pfor.serial"),
                    bj = new_block(g, "pfor.end");
  LLVMValueRef ctxp = LLVMBuildBitCast(g->B, ctx, g->vp, "");
  LLVMBuildCondBr(g->B, LLVMBuildIsNull(g->B, outer->pfor, ""), bdir, bpf);
  LLVMPositionBuilderAtEnd(g->B, bpf);
  LLVMValueRef pa[4] = {outer->rt, c64(g, s->extent), body, ctxp};
  LLVMBuildCall2(g->B, g->pfor_ty, outer->pfor, pa, 4, "");
  LLVMBuildBr(g->B, bj);
  LLVMPositionBuilderAtEnd(g->B, bdir);
  LLVMValueRef da[3] = {ctxp, c64(g, 0), c64(g, s->extent)};
  LLVMBuildCall2(g->B, g->body_ty, body, da, 3, "");
  LLVMBuildBr(g->B, bj);
  LLVMPositionBuilderAtEnd(g->B, bj);
}

static void emit_loop(cg *g, const nf_lstmt *s) {
  if (s->var >= g->p->n_vars || s->extent < 0) {
    fail(g, NF_EINVAL, "%s", "loop with a bad variable or extent");
    return;
  }
  if (s->extent == 0) return;
  fstate *f = g->f;
  int kind = s->loop_kind;
  if (kind == NF_LOOP_VECTOR && !g->W && s->extent >= 2 && s->extent <= MAX_W && vectorizable_body(s)) {
    /* An extent that is not a power of two is emitted as power-of-two
     * pieces, largest first (56: 32 + 16 + 8), each its own vectors: LLVM
     * widens a <56 x float> to 64 lanes and then moves its parts through
     * the stack, where the pieces stay whole registers.  The lanes keep
     * their order (the pieces run from lane 0 up). */
    LLVMValueRef saved = f->var[s->var];
    g->vvar = s->var;
    for (int64_t off = 0; off < s->extent && !g->rc;) {
      int64_t w = 1;
      while (w * 2 <= s->extent - off) w *= 2;
      g->W = (unsigned)w;
      g->mask = NULL;
      g->n_memo = 0;
      f->var[s->var] = c64(g, off);
      if (w < 2) g->W = 0; /* one lane left: scalar */
      emit_body(g, s);
      off += w;
    }
    f->var[s->var] = saved;
    g->W = 0;
    g->mask = NULL;
    return;
  }
  if (g->W) {
    fail(g, NF_EINVAL, "%s", "a loop inside a VECTOR loop");
    return;
  }
  if (kind == NF_LOOP_PARALLEL && !f->in_parallel && f->is_main && s->extent > 1) {
    emit_parallel(g, s);
    return;
  }
  /* Small nests are unrolled here rather than by LLVM (whose unroller
   * costs more compile time than the rest of the pipeline): tile loops,
   * and any nest that amounts to a few stores, which also lets SROA put
   * small temporaries in registers. */
  if ((kind == NF_LOOP_UNROLL && s->extent <= 64) || s->extent == 1 || g->in_tile ||
      (!g->lean && unrolled_stores(s) <= SMALL_UNROLL &&
       unrolled_weight(s, 1, UNROLL_MAX_WEIGHT + 1) <= UNROLL_MAX_WEIGHT)) {
    LLVMValueRef saved = f->var[s->var];
    /* In the second copy of an unrolled tile reduction loop, the tile
     * loops run backwards where their iterations are independent: the
     * accumulators the first copy updated last are updated first, which
     * keeps them in registers when the tile needs more registers than the
     * machine has (the allocator then spills the ones used in the middle,
     * once per pair of iterations). */
    int rev = g->in_tile && g->tile_odd && iterations_independent(g, s);
    for (int64_t i = 0; i < s->extent && !g->rc; i++) {
      f->var[s->var] = c64(g, rev ? s->extent - 1 - i : i);
      emit_body(g, s);
    }
    f->var[s->var] = saved;
    return;
  }
  emit_counted(g, s, c64(g, 0), c64(g, s->extent), 0);
}

static void emit_if(cg *g, const nf_lstmt *s) {
  if (!s->cond || s->cond->dtype != NF_BOOL) {
    fail(g, NF_EINVAL, "%s", "IF without a bool condition");
    return;
  }
  g->n_memo = 0;
  vv c = emit(g, s->cond);
  if (g->rc) return;
  if (c.k == K_UNI) {
    if (LLVMIsConstant(c.s)) {
      if (LLVMConstIntGetZExtValue(c.s)) emit_body(g, s);
      return;
    }
    LLVMBasicBlockRef bt = new_block(g, "if"), bj = new_block(g, "if.end");
    LLVMBuildCondBr(g->B, c.s, bt, bj);
    LLVMPositionBuilderAtEnd(g->B, bt);
    emit_body(g, s);
    LLVMBuildBr(g->B, bj);
    LLVMPositionBuilderAtEnd(g->B, bj);
    return;
  }
  LLVMValueRef saved = g->mask;
  LLVMValueRef cv = mat(g, c);
  if (!saved && !g->in_tile && !g->lean) {
    /* A guard of a non-dividing split is true on every lane of all but
     * the last vector: that case runs the body without a mask (plain
     * loads and stores; masked ones are slow on some x86 cores), the
     * others under the mask.  Only outermost guards are versioned, so
     * the body is emitted at most twice, and not inside a register tile
     * (whose unrolled body would grow by a factor of two per row). */
    LLVMValueRef all = intr(g, "llvm.vector.reduce.and", NULL, 1, &cv, 1);
    LLVMBasicBlockRef ba = new_block(g, "if.all"), bm = new_block(g, "if.some"),
                      bj = new_block(g, "if.end");
    LLVMBuildCondBr(g->B, all, ba, bm);
    LLVMPositionBuilderAtEnd(g->B, ba);
    emit_body(g, s);
    LLVMBuildBr(g->B, bj);
    LLVMPositionBuilderAtEnd(g->B, bm);
    g->mask = cv;
    emit_body(g, s);
    g->mask = saved;
    LLVMBuildBr(g->B, bj);
    LLVMPositionBuilderAtEnd(g->B, bj);
    return;
  }
  g->mask = saved ? LLVMBuildAnd(g->B, saved, cv, "") : cv;
  emit_body(g, s);
  g->mask = saved;
}

static void emit_stmt(cg *g, const nf_lstmt *s) {
  if (g->rc) return;
  switch (s->kind) {
  case NF_LS_LOOP: emit_loop(g, s); break;
  case NF_LS_STORE: emit_store(g, s); break;
  case NF_LS_IF: emit_if(g, s); break;
  case NF_LS_SEQ: emit_body(g, s); break;
  case NF_LS_ALLOC:
    if (g->W) {
      fail(g, NF_EINVAL, "%s", "ALLOC inside a VECTOR loop");
      return;
    }
    emit_alloc(g, s);
    break;
  default: fail(g, NF_EINVAL, "%s", "unknown statement kind");
  }
}

/* ---- module ---- */



static void collect_ranges(const nf_lstmt *s, nf_range *range, uint32_t n_vars) {
  if (s->kind == NF_LS_LOOP && s->var < n_vars && s->extent > 0) {
    range[s->var].lo = 0;
    range[s->var].hi = s->extent - 1;
  }
  for (int i = 0; i < s->n_body; i++) collect_ranges(s->body[i], range, n_vars);
}

/* A loop bound to GPU blocks or threads, or NULL. */
static const nf_lstmt *gpu_loop(const nf_lstmt *s) {
  if (!s) return NULL;
  if (s->kind == NF_LS_LOOP && (s->loop_kind == NF_LOOP_BLOCK || s->loop_kind == NF_LOOP_THREAD))
    return s;
  for (int i = 0; i < s->n_body; i++) {
    const nf_lstmt *b = gpu_loop(s->body[i]);
    if (b) return b;
  }
  return NULL;
}

static int check_prog(cg *g) {
  const nf_lprog *p = g->p;
  if (!p || !p->root || !p->bufs) {
    fail(g, NF_EINVAL, "%s", "empty program");
    return g->rc;
  }
  uint32_t n_args = 0;
  for (uint32_t i = 0; i < p->n_bufs; i++) {
    const nf_lbuf *b = &p->bufs[i];
    if (b->dtype != NF_BOOL && b->dtype != NF_I32 && b->dtype != NF_I64 && !is_float(b->dtype)) {
      fail(g, NF_EUNSUPPORTED, "buffer '%s': dtype not supported by the CPU backend",
           b->name ? b->name : "?");
      return g->rc;
    }
    if (b->rank > NF_MAX_RANK) {
      fail(g, NF_EINVAL, "buffer '%s': bad rank", b->name ? b->name : "?");
      return g->rc;
    }
    if (b->kind != NF_BUF_TEMP) {
      if (b->arg < 0 || (uint32_t)b->arg >= p->n_args) {
        fail(g, NF_EINVAL, "buffer '%s': argument position out of range", b->name ? b->name : "?");
        return g->rc;
      }
      n_args++;
    }
  }
  if (n_args != p->n_args) fail(g, NF_EINVAL, "%s", "n_args differs from the argument buffers");
  const nf_lstmt *gl = g->rc ? NULL : gpu_loop(p->root);
  if (gl)
    fail(g, NF_EUNSUPPORTED,
         "loop '%s' is bound to GPU blocks or threads: a GPU program, not for the CPU backend",
         gl->var_name ? gl->var_name : "?");
  return g->rc;
}

static void build_module(cg *g) {
  const nf_lprog *p = g->p;
  LLVMTypeRef void_t = LLVMVoidTypeInContext(g->C);
  LLVMTypeRef bparams[3] = {g->vp, g->i64, g->i64};
  g->body_ty = LLVMFunctionType(void_t, bparams, 3, 0);
  LLVMTypeRef pf_params[4] = {g->vp, g->i64, LLVMPointerType(g->body_ty, 0), g->vp};
  g->pfor_ty = LLVMFunctionType(void_t, pf_params, 4, 0);
  LLVMTypeRef pfor_ptr = LLVMPointerType(g->pfor_ty, 0);

  /* nf_main(bufs in argument order..., pfor, runtime) */
  uint32_t na = p->n_args;
  LLVMTypeRef *mp = calloc(na + 2, sizeof *mp);
  uint32_t *argbuf = calloc(na + 1, sizeof *argbuf);
  if (!mp || !argbuf) {
    free(mp);
    free(argbuf);
    fail(g, NF_ENOMEM, "%s", "out of memory");
    return;
  }
  for (uint32_t i = 0; i < p->n_bufs; i++)
    if (p->bufs[i].kind != NF_BUF_TEMP) {
      argbuf[p->bufs[i].arg] = i;
      mp[p->bufs[i].arg] = LLVMPointerType(mem_type(g, p->bufs[i].dtype), 0);
    }
  mp[na] = pfor_ptr;
  mp[na + 1] = g->vp;
  LLVMTypeRef main_ty = LLVMFunctionType(g->i32, mp, na + 2, 0);
  LLVMValueRef mainf = LLVMAddFunction(g->M, "nf_main", main_ty);
  LLVMSetLinkage(mainf, LLVMInternalLinkage);
  add_attr(g, mainf, LLVMAttributeFunctionIndex, g->kind_nounwind);
  add_stackrealign(g, mainf);
  for (uint32_t i = 0; i < na; i++) add_attr(g, mainf, i + 1, g->kind_noalias);
  fstate fm;
  fstate_init(g, &fm, mainf);
  fm.is_main = 1;
  fm.pfor = LLVMGetParam(mainf, na);
  fm.rt = LLVMGetParam(mainf, na + 1);
  for (uint32_t i = 0; i < na; i++) fm.bufp[argbuf[i]] = LLVMGetParam(mainf, i);
  g->f = &fm;
  emit_stmt(g, p->root);
  g->f = &fm;
  if (!g->rc) fstate_finish(g, &fm, c32(g, 0));
  fstate_free(&fm);

  /* The exported entry. */
  LLVMTypeRef fields[5] = {g->i32, g->i32, LLVMPointerType(g->vp, 0), pfor_ptr, g->vp};
  LLVMTypeRef args_ty = LLVMStructCreateNamed(g->C, "nf_kernel_args");
  LLVMStructSetBody(args_ty, fields, 5, 0);
  LLVMTypeRef aptr = LLVMPointerType(args_ty, 0);
  LLVMTypeRef kty = LLVMFunctionType(g->i32, &aptr, 1, 0);
  LLVMValueRef k = LLVMAddFunction(g->M, NF_KERNEL_SYMBOL, kty);
  add_attr(g, k, LLVMAttributeFunctionIndex, g->kind_nounwind);
  LLVMBasicBlockRef e0 = LLVMAppendBasicBlockInContext(g->C, k, "entry");
  LLVMBasicBlockRef e1 = LLVMAppendBasicBlockInContext(g->C, k, "abi_ok");
  LLVMBasicBlockRef e2 = LLVMAppendBasicBlockInContext(g->C, k, "n_ok");
  LLVMBasicBlockRef ebad1 = LLVMAppendBasicBlockInContext(g->C, k, "bad_abi");
  LLVMBasicBlockRef ebad2 = LLVMAppendBasicBlockInContext(g->C, k, "bad_n");
  LLVMBuilderRef b = g->B;
  LLVMPositionBuilderAtEnd(b, e0);
  LLVMValueRef a = LLVMGetParam(k, 0);
  LLVMValueRef abi = LLVMBuildLoad2(b, g->i32, LLVMBuildStructGEP2(b, args_ty, a, 0, ""), "");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntEQ, abi, c32(g, NF_KERNEL_ABI_VERSION), ""), e1, ebad1);
  LLVMPositionBuilderAtEnd(b, ebad1);
  LLVMBuildRet(b, c32(g, NF_KERNEL_EABI));
  LLVMPositionBuilderAtEnd(b, e1);
  LLVMValueRef nb = LLVMBuildLoad2(b, g->i32, LLVMBuildStructGEP2(b, args_ty, a, 1, ""), "");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntEQ, nb, c32(g, (int64_t)na), ""), e2, ebad2);
  LLVMPositionBuilderAtEnd(b, ebad2);
  LLVMBuildRet(b, c32(g, NF_KERNEL_ENBUF));
  LLVMPositionBuilderAtEnd(b, e2);
  LLVMValueRef bufs = LLVMBuildLoad2(b, LLVMPointerType(g->vp, 0),
                                     LLVMBuildStructGEP2(b, args_ty, a, 2, ""), "");
  LLVMValueRef *margs = calloc(na + 2, sizeof *margs);
  if (!margs) {
    free(mp);
    free(argbuf);
    fail(g, NF_ENOMEM, "%s", "out of memory");
    return;
  }
  for (uint32_t i = 0; i < na; i++) {
    LLVMValueRef ix = c64(g, i);
    LLVMValueRef v = LLVMBuildLoad2(b, g->vp, LLVMBuildGEP2(b, g->vp, bufs, &ix, 1, ""), "");
    margs[i] = LLVMBuildBitCast(b, v, mp[i], "");
  }
  margs[na] = LLVMBuildLoad2(b, pfor_ptr, LLVMBuildStructGEP2(b, args_ty, a, 3, ""), "");
  margs[na + 1] = LLVMBuildLoad2(b, g->vp, LLVMBuildStructGEP2(b, args_ty, a, 4, ""), "");
  LLVMBuildRet(b, LLVMBuildCall2(b, main_ty, mainf, margs, na + 2, ""));
  free(margs);
  free(mp);
  free(argbuf);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int nf_cpu_compile_object(const nf_lprog *p, const nf_cpu_target *t, nf_blob *object,
                          nf_cpu_stats *stats, nf_buf *err) {
  nf_blob_free(object);
  double t0 = now_ms();
  cg g;
  memset(&g, 0, sizeof g);
  g.p = p;
  g.err = err;
  if (check_prog(&g)) return g.rc;
  g.range = malloc(sizeof *g.range * (p->n_vars + 1));
  if (!g.range) {
    fail(&g, NF_ENOMEM, "%s", "out of memory");
    return g.rc;
  }
  for (uint32_t v = 0; v < p->n_vars; v++) g.range[v].lo = 1, g.range[v].hi = 0;
  collect_ranges(p->root, g.range, p->n_vars);
  g.lean = stmt_weight(p->root, LEAN_WEIGHT + 1) > LEAN_WEIGHT;
  g.C = LLVMContextCreate();
  g.M = LLVMModuleCreateWithNameInContext(p->name ? p->name : "kernel", g.C);
  g.B = LLVMCreateBuilderInContext(g.C);
  g.AB = LLVMCreateBuilderInContext(g.C);
  g.i1 = LLVMInt1TypeInContext(g.C);
  g.i8 = LLVMInt8TypeInContext(g.C);
  g.i32 = LLVMInt32TypeInContext(g.C);
  g.i64 = LLVMInt64TypeInContext(g.C);
  g.f32 = LLVMFloatTypeInContext(g.C);
  g.f64 = LLVMDoubleTypeInContext(g.C);
  g.vp = LLVMPointerType(g.i8, 0);
  g.kind_noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
  g.kind_alwaysinline = LLVMGetEnumAttributeKindForName("alwaysinline", 12);
  g.kind_nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);

  char *msg = NULL;
  double opt_ms = 0, emit_ms = 0, t1 = 0;
  build_module(&g);
  if (g.rc) goto done;
  if (LLVMVerifyModule(g.M, LLVMReturnStatusAction, &msg)) {
    fail(&g, NF_EINTERNAL, "LLVM verifier: %s", msg ? msg : "?");
    goto done;
  }
  t1 = now_ms();
  g.rc = nf__llvm_optimize_emit(g.M, t, object, &opt_ms, &emit_ms, err);
  if (g.rc == NF_OK && stats) {
    stats->irgen_ms = t1 - t0;
    stats->opt_ms = opt_ms;
    stats->emit_ms = emit_ms;
    stats->object_bytes = object->len;
    stats->n_functions = 2 + (uint32_t)g.n_bodies * 2;
  }
done:
  if (msg) LLVMDisposeMessage(msg);
  free(g.memo);
  free(g.range);
  LLVMDisposeBuilder(g.B);
  LLVMDisposeBuilder(g.AB);
  LLVMDisposeModule(g.M);
  LLVMContextDispose(g.C);
  return g.rc;
}

int nf_cpu_compile(const nf_lprog *p, const nf_cpu_target *t, nf_blob *shared_object,
                   nf_cpu_stats *stats, nf_buf *err) {
  double t0 = now_ms();
  nf_blob obj = NF_BLOB_INIT;
  nf_blob_free(shared_object);
  int rc = nf_cpu_compile_object(p, t, &obj, stats, err);
  if (rc) return rc;
  double t1 = now_ms();
  rc = nf_cpu_link(obj.data, obj.len, 0, shared_object, err);
  nf_blob_free(&obj);
  if (stats) {
    stats->link_ms = now_ms() - t1;
    stats->total_ms = now_ms() - t0;
    stats->so_bytes = shared_object->len;
  }
  return rc;
}
