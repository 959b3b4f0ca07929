/* lower.c - graph + schedule -> loop IR (nf_lprog), and random schedules.
 *
 * Each statement starts as a nest of one loop per index variable (outputs
 * then reductions).  Every loop has a program-wide variable; the
 * statement's original variables are kept as expressions of the current
 * loop variables (orig[k]) and every primitive rewrites them: split x by
 * f substitutes x -> x.o * f + x.i (plus the guard x.o * f + x.i < E when
 * f does not divide E), fuse a b substitutes a -> ab // Eb, b -> ab % Eb.
 * Guards are placed right inside the innermost loop they use.  The rhs is
 * translated once at the end: variables -> orig[k], tensors -> buffers,
 * inlined producers substituted at their use (selects stay lazy), then
 * simplified with the loop ranges.
 *
 * Reductions: the output is first set to the operator's identity by its
 * own nest, then the main nest accumulates with STORE op=.  With
 * cache_write at loop L the tile
 * of the output that the spatial loops inside L cover is ALLOC'd inside L,
 * set to the identity, accumulated and written back with plain stores;
 * when some reduction loops are outside L (a blocked reduction: k.o
 * outside the register tile) the output is set to the identity first and
 * each tile starts from the output's partial sums instead.  A tile
 * dimension is the bounding box of the output index's part over the
 * loops inside L, or compact (one cell per point, mixed-radix) where
 * that part is a sum of loops that leaves gaps in the box (GPU virtual
 * threads: tile_dim).
 * Each element's accumulation order is the IR's unless a reorder swaps
 * reduction loops (reported in nf_lower_info).
 *
 * Data-dependent indices (an index that loads from a tensor, e.g.
 * embedding) are clamped into the buffer: the compiled code cannot report
 * the interpreter's out-of-bounds error, and must not read out of bounds.
 *
 * compute_at and cache_read attach a prologue to a loop of the consumer's
 * nest: the region the consumer's (translated) rhs reads inside the loop
 * is inferred from its affine accesses (infer_region), a local buffer of
 * that shape is ALLOC'd around the loop's body, the producer's nest (a
 * recursive lower_stmt over the region, guarded to the tensor's bounds)
 * or a copy nest fills it first, and the consumer's accesses are rebased
 * onto it.  A producer computed at a loop has no whole buffer: any other
 * reader makes the schedule illegal.  A cache_read copy is zero-padded
 * when that lets padded reads `c ? T[i] : 0` drop their guard.
 *
 * Each lowered statement then has its loops cut where the selects in
 * their bodies switch at a constant iteration (split_index_sets). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nf_lower.h"

#include "nf_ptrmap.h"

#define MAX_LOOPS 64
#define MAX_GUARDS 64
#define TILE_MAX_ELEMS 65536

typedef struct lloop {
  uint32_t var;
  int64_t ext;
  uint8_t kind; /* nf_loop_kind */
  uint8_t red;  /* derived from reduction variables */
  uint8_t whole; /* a variable's initial loop (never split or fused) */
  char name[NF_SCHED_NAME];
} lloop;

typedef struct nest {
  int n;
  lloop l[MAX_LOOPS];
  int n_orig;
  const nf_expr *orig[NF_MAX_VARS];
  int ng;
  const nf_expr *guard[MAX_GUARDS];
  /* guard k bounds a variable's whole range (a split of its initial loop
   * that does not divide, or a region's edge): the points it excludes
   * have an index of their own outside the range */
  uint8_t gbound[MAX_GUARDS];
  int has_cw;
  uint32_t cw_var;
  char cw_name[NF_SCHED_NAME];
  int has_rf; /* rfactor: the tile gets a slot per iteration of rf_var */
  uint32_t rf_var;
  char rf_name[NF_SCHED_NAME];
  int reassoc;
  int in_region; /* computed at a consumer's loop (compute_at) */
} nest;

typedef struct lw {
  const nf_graph *g;
  nf_ir_ctx *ctx;
  nf_arena *arena;
  nf_buf *err;
  nf_range *vr;
  uint32_t nv, cap_v;
  nf_lbuf *bufs;
  uint32_t nb, cap_b;
  int32_t *buf_of;    /* by tensor: buffer or -1 (inlined) */
  int32_t *stmt_of;   /* by tensor: producing statement or -1 */
  uint8_t *inlined;   /* by statement */
  int32_t *at_of;     /* by statement: schedule item computing it at a consumer, or -1 */
  const nf_schedule *s;
  int oom;
} lw;

/* Where a statement computed at a consumer's loop (compute_at) writes:
 * the region of its output that the consumer reads inside that loop,
 * start[d] (an expression of the consumer's loop variables) + [0, ext[d]),
 * held in a local buffer ALLOC'd inside the loop. */
typedef struct region {
  int rank;
  const nf_expr *start[NF_MAX_RANK];
  int64_t ext[NF_MAX_RANK];
  uint32_t buf;
  /* how start was found (infer_region): start = outer[d] + lo[d], outer
   * the part of the first read's index over loops at or outside loop px
   * of nest n; rebase subtracts part by part */
  const struct nest *n;
  int px;
  const nf_expr *outer[NF_MAX_RANK];
  int64_t lo[NF_MAX_RANK];
  /* cache_read's layout: position k of the local buffer holds dimension
   * perm[k] of the region (permuted: not the identity) */
  int permuted;
  int perm[NF_MAX_RANK];
} region;

/* A prologue placed at the start of loop `var`'s body, with the local
 * buffer it fills ALLOC'd around the whole body (compute_at, cache_read). */
typedef struct attach {
  uint32_t var, buf;
  nf_lstmt *pro;
} attach;

#define MAX_ATTACH 16
#define REGION_MAX_ELEMS (1 << 22)
/* the characters of a name in the schedule text format */
#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.[]"

/* ---- small helpers ---- */

static int lerr(lw *L, int rc, int si, const char *fmt, ...) NF_PRINTF(4, 5);
static int lerr(lw *L, int rc, int si, const char *fmt, ...) {
  va_list ap;
  if (si >= 0) nf_buf_printf(L->err, "stmt %d: ", si);
  va_start(ap, fmt);
  nf_buf_vprintf(L->err, fmt, ap);
  va_end(ap);
  return rc;
}

static uint32_t new_var(lw *L, int64_t ext) {
  if (L->nv == L->cap_v) {
    uint32_t nc = L->cap_v ? 2 * L->cap_v : 64;
    nf_range *n = realloc(L->vr, nc * sizeof *n);
    if (!n) {
      L->oom = 1;
      return 0;
    }
    L->vr = n;
    L->cap_v = nc;
  }
  L->vr[L->nv].lo = 0;
  L->vr[L->nv].hi = ext > 0 ? ext - 1 : 0;
  return L->nv++;
}

static const nf_expr *ci(lw *L, int64_t v) { return nf_e_const_i(L->ctx, NF_I64, v); }
static const nf_expr *var(lw *L, uint32_t v) { return nf_e_var(L->ctx, v); }
static const nf_expr *bin(lw *L, nf_op op, const nf_expr *a, const nf_expr *b) {
  if (!a || !b) return NULL;
  return nf_e_binary(L->ctx, op, a, b);
}
static const nf_expr *simp(lw *L, const nf_expr *e) {
  if (!e) return NULL;
  return nf_simplify(L->ctx, e, L->vr, (int)L->nv);
}

/* e with VAR from replaced by to (expressions of the program context). */
static const nf_expr *subst(lw *L, const nf_expr *e, uint32_t from, const nf_expr *to) {
  if (!e) return NULL;
  if (e->op == NF_OP_VAR) return e->u.var == from ? to : e;
  if (e->n_args == 0) return e;
  const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  int changed = 0;
  for (int i = 0; i < e->n_args; i++) {
    args[i] = subst(L, e->args[i], from, to);
    if (!args[i]) return NULL;
    changed |= args[i] != e->args[i];
  }
  return changed ? nf_e_rebuild(L->ctx, e, args) : e;
}

static int uses_var(const nf_expr *e, uint32_t v) {
  if (e->op == NF_OP_VAR) return e->u.var == v;
  for (int i = 0; i < e->n_args; i++)
    if (uses_var(e->args[i], v)) return 1;
  return 0;
}

/* Whether e reads a tensor.  A walk over the DAG, each node once (by its
 * id, in a small open-addressing set): a tree walk costs time exponential
 * in the depth of shared nodes (an index of k nested min/max over the
 * level below took 2^k steps: a compile job spun until its timeout).  Out
 * of memory it answers 1, the cautious answer (the index is clamped). */
static int uses_access(const nf_expr *e) {
  size_t cap = 64, n = 0, hcap = 256, hn = 0;
  const nf_expr **st = malloc(cap * sizeof *st);
  uint32_t *seen = calloc(hcap, sizeof *seen); /* id + 1; 0 empty */
  int found = 0;
  if (!st || !seen) {
    free(st);
    free(seen);
    return 1;
  }
  st[n++] = e;
  while (n && !found) {
    const nf_expr *x = st[--n];
    if (x->op == NF_OP_ACCESS) {
      found = 1;
      break;
    }
    size_t h = (x->id * 2654435761u) & (hcap - 1);
    while (seen[h] && seen[h] != x->id + 1) h = (h + 1) & (hcap - 1);
    if (seen[h]) continue;
    seen[h] = x->id + 1;
    if (++hn * 2 > hcap) { /* grow the set */
      size_t ncap = hcap * 2;
      uint32_t *ns = calloc(ncap, sizeof *ns);
      if (!ns) {
        found = 1;
        break;
      }
      for (size_t i = 0; i < hcap; i++)
        if (seen[i]) {
          size_t k = ((seen[i] - 1) * 2654435761u) & (ncap - 1);
          while (ns[k]) k = (k + 1) & (ncap - 1);
          ns[k] = seen[i];
        }
      free(seen);
      seen = ns;
      hcap = ncap;
    }
    for (int i = 0; i < x->n_args; i++) {
      if (n == cap) {
        const nf_expr **ns = realloc(st, cap * 2 * sizeof *st);
        if (!ns) {
          found = 1;
          break;
        }
        st = ns;
        cap *= 2;
      }
      st[n++] = x->args[i];
    }
  }
  free(st);
  free(seen);
  return found;
}

static int find_loop(const nest *n, const char *name) {
  for (int i = 0; i < n->n; i++)
    if (strcmp(n->l[i].name, name) == 0) return i;
  return -1;
}

static int unknown_loop(lw *L, int si, const nest *n, const char *prim, const char *name) {
  nf_buf_printf(L->err, "stmt %d: %s: unknown loop '%s' (loops:", si, prim, name);
  for (int i = 0; i < n->n; i++) nf_buf_printf(L->err, " %s", n->l[i].name);
  nf_buf_puts(L->err, ")");
  return NF_EINVAL;
}

/* Substitutes loop variable v in orig and guards; drops guards that became
 * always true; NF_OK or NF_ENOMEM. */
static int nest_subst(lw *L, nest *n, uint32_t v, const nf_expr *to) {
  for (int k = 0; k < n->n_orig; k++)
    if (!(n->orig[k] = simp(L, subst(L, n->orig[k], v, to)))) return NF_ENOMEM;
  int w = 0;
  for (int k = 0; k < n->ng; k++) {
    const nf_expr *g = simp(L, subst(L, n->guard[k], v, to));
    if (!g) return NF_ENOMEM;
    if (g->op == NF_OP_CONST && g->u.i) continue;
    n->gbound[w] = n->gbound[k];
    n->guard[w++] = g;
  }
  n->ng = w;
  return NF_OK;
}

/* ---- the nest of one statement ---- */

/* The initial nest of si; with a region R (compute_at) the spatial loops
 * cover R only, at start[d] + loop, guarded to stay inside the tensor. */
static void nest_init(lw *L, int si, const region *R, nest *n) {
  const nf_stmt *st = &L->g->stmts[si];
  const nf_tensor *t = &L->g->tensors[st->out];
  memset(n, 0, sizeof *n);
  n->n_orig = t->rank + st->n_red;
  n->in_region = R != NULL;
  for (int k = 0; k < n->n_orig; k++) {
    lloop *lp = &n->l[n->n++];
    int red = k >= t->rank;
    int64_t lo = red ? st->red_lo[k - t->rank] : 0;
    lp->ext = red ? st->red_ext[k - t->rank] : R ? R->ext[k] : t->shape[k];
    lp->var = new_var(L, lp->ext);
    lp->red = (uint8_t)red;
    lp->whole = 1;
    nf__sched_var_name(st, k, lp->name);
    if (R && !red) {
      const nf_expr *o = simp(L, bin(L, NF_OP_ADD, R->start[k], var(L, lp->var)));
      n->orig[k] = o;
      const nf_expr *gd[2] = {simp(L, bin(L, NF_OP_GE, o, ci(L, 0))),
                              simp(L, bin(L, NF_OP_LT, o, ci(L, t->shape[k])))};
      for (int j = 0; j < 2; j++) {
        if (!gd[j]) {
          L->oom = 1;
          return;
        }
        if (!(gd[j]->op == NF_OP_CONST && gd[j]->u.i) && n->ng < MAX_GUARDS) {
          n->gbound[n->ng] = 1;
          n->guard[n->ng++] = gd[j];
        }
      }
      continue;
    }
    n->orig[k] = lo ? simp(L, bin(L, NF_OP_ADD, var(L, lp->var), ci(L, lo))) : var(L, lp->var);
  }
}

static int name_free(lw *L, int si, const nest *n, const char *name) {
  if (find_loop(n, name) >= 0) return lerr(L, NF_EINVAL, si, "loop name '%s' already used", name);
  if (strlen(name) >= NF_SCHED_NAME - 1)
    return lerr(L, NF_EINVAL, si, "loop name '%s' too long", name);
  return NF_OK;
}

static int apply_item(lw *L, int si, nest *n, const nf_sched_item *it) {
  int p, q, rc;
  switch (it->kind) {
  case NF_SCH_SPLIT: {
    if ((p = find_loop(n, it->names[0])) < 0) return unknown_loop(L, si, n, "split", it->names[0]);
    if (it->factor <= 0)
      return lerr(L, NF_EINVAL, si, "split: factor must be positive, got %lld",
                  (long long)it->factor);
    if (n->n == MAX_LOOPS) return lerr(L, NF_ELIMIT, si, "split: too many loops");
    lloop old = n->l[p];
    char on[NF_SCHED_NAME + 2], in[NF_SCHED_NAME + 2];
    snprintf(on, sizeof on, "%s.o", old.name);
    snprintf(in, sizeof in, "%s.i", old.name);
    if ((rc = name_free(L, si, n, on)) < 0 || (rc = name_free(L, si, n, in)) < 0) return rc;
    int64_t f = it->factor, E = old.ext;
    lloop lo = {0}, li = {0};
    lo.ext = E == 0 ? 0 : (E - 1) / f + 1;
    li.ext = f;
    lo.var = new_var(L, lo.ext);
    li.var = new_var(L, li.ext);
    lo.red = li.red = old.red;
    memcpy(lo.name, on, strlen(on) + 1);
    memcpy(li.name, in, strlen(in) + 1);
    const nf_expr *to = bin(L, NF_OP_ADD, bin(L, NF_OP_MUL, var(L, lo.var), ci(L, f)),
                            var(L, li.var));
    if (!to || L->oom) return NF_ENOMEM;
    if ((rc = nest_subst(L, n, old.var, to)) < 0) return rc;
    if (E % f != 0) {
      if (n->ng == MAX_GUARDS) return lerr(L, NF_ELIMIT, si, "split: too many guards");
      const nf_expr *gd = simp(L, bin(L, NF_OP_LT, to, ci(L, E)));
      if (!gd) return NF_ENOMEM;
      if (!(gd->op == NF_OP_CONST && gd->u.i)) {
        n->gbound[n->ng] = old.whole;
        n->guard[n->ng++] = gd;
      }
    }
    memmove(&n->l[p + 2], &n->l[p + 1], (size_t)(n->n - p - 1) * sizeof n->l[0]);
    n->l[p] = lo;
    n->l[p + 1] = li;
    n->n++;
    return NF_OK;
  }
  case NF_SCH_REORDER: {
    int pos[NF_SCHED_MAX_NAMES];
    for (int a = 0; a < it->n_names; a++) {
      if ((pos[a] = find_loop(n, it->names[a])) < 0)
        return unknown_loop(L, si, n, "reorder", it->names[a]);
      for (int b = 0; b < a; b++)
        if (pos[b] == pos[a])
          return lerr(L, NF_EINVAL, si, "reorder: loop '%s' listed twice (not a permutation)",
                      it->names[a]);
    }
    /* the listed loops take the positions they occupy, in listed order */
    int slots[NF_SCHED_MAX_NAMES];
    memcpy(slots, pos, sizeof slots);
    for (int a = 1; a < it->n_names; a++)
      for (int b = a; b > 0 && slots[b - 1] > slots[b]; b--) {
        int t = slots[b];
        slots[b] = slots[b - 1];
        slots[b - 1] = t;
      }
    lloop old[MAX_LOOPS];
    memcpy(old, n->l, sizeof old);
    for (int a = 0; a < it->n_names; a++) n->l[slots[a]] = old[pos[a]];
    /* did two reduction loops swap? */
    for (int a = 0; a < it->n_names; a++)
      for (int b = a + 1; b < it->n_names; b++)
        if (old[pos[a]].red && old[pos[b]].red && pos[a] > pos[b]) n->reassoc = 1;
    return NF_OK;
  }
  case NF_SCH_FUSE: {
    if ((p = find_loop(n, it->names[0])) < 0) return unknown_loop(L, si, n, "fuse", it->names[0]);
    if ((q = find_loop(n, it->names[1])) < 0) return unknown_loop(L, si, n, "fuse", it->names[1]);
    if (q != p + 1)
      return lerr(L, NF_EINVAL, si, "fuse: '%s' is not directly inside '%s'", it->names[1],
                  it->names[0]);
    if (n->l[p].red != n->l[q].red)
      return lerr(L, NF_EINVAL, si, "fuse: cannot fuse reduction loop with spatial loop ('%s', '%s')",
                  it->names[0], it->names[1]);
    char fn[3 * NF_SCHED_NAME];
    snprintf(fn, sizeof fn, "%s.%s.fused", n->l[p].name, n->l[q].name);
    if (strlen(fn) >= NF_SCHED_NAME) return lerr(L, NF_ELIMIT, si, "fuse: name too long");
    if ((rc = name_free(L, si, n, fn)) < 0) return rc;
    lloop a = n->l[p], b = n->l[q], f = {0};
    if (__builtin_mul_overflow(a.ext, b.ext, &f.ext))
      return lerr(L, NF_EOVERFLOW, si, "fuse: extent overflows");
    f.var = new_var(L, f.ext);
    f.red = a.red;
    memcpy(f.name, fn, strlen(fn) + 1);
    if (L->oom) return NF_ENOMEM;
    const nf_expr *ta, *tb;
    if (b.ext == 0) {
      ta = ci(L, 0);
      tb = ci(L, 0);
    } else {
      ta = bin(L, NF_OP_FLOORDIV, var(L, f.var), ci(L, b.ext));
      tb = bin(L, NF_OP_MOD, var(L, f.var), ci(L, b.ext));
    }
    if (!ta || !tb) return NF_ENOMEM;
    if ((rc = nest_subst(L, n, a.var, ta)) < 0 || (rc = nest_subst(L, n, b.var, tb)) < 0)
      return rc;
    n->l[p] = f;
    memmove(&n->l[q], &n->l[q + 1], (size_t)(n->n - q - 1) * sizeof n->l[0]);
    n->n--;
    return NF_OK;
  }
  case NF_SCH_PARALLEL:
  case NF_SCH_VECTORIZE:
  case NF_SCH_UNROLL: {
    static const char *pn[] = {"parallel", "vectorize", "unroll"};
    static const uint8_t kinds[] = {NF_LOOP_PARALLEL, NF_LOOP_VECTOR, NF_LOOP_UNROLL};
    int w = it->kind - NF_SCH_PARALLEL;
    if ((p = find_loop(n, it->names[0])) < 0) return unknown_loop(L, si, n, pn[w], it->names[0]);
    if (n->l[p].kind != NF_LOOP_SERIAL && n->l[p].kind != kinds[w])
      return lerr(L, NF_EINVAL, si, "%s: loop '%s' is already annotated", pn[w], it->names[0]);
    n->l[p].kind = kinds[w];
    return NF_OK;
  }
  case NF_SCH_BIND_BLOCK:
  case NF_SCH_BIND_THREAD: {
    const char *bn = it->kind == NF_SCH_BIND_BLOCK ? "bind_block" : "bind_thread";
    uint8_t k = it->kind == NF_SCH_BIND_BLOCK ? NF_LOOP_BLOCK : NF_LOOP_THREAD;
    if ((p = find_loop(n, it->names[0])) < 0) return unknown_loop(L, si, n, bn, it->names[0]);
    if (n->l[p].kind != NF_LOOP_SERIAL && n->l[p].kind != k)
      return lerr(L, NF_EINVAL, si, "%s: loop '%s' is already annotated", bn, it->names[0]);
    n->l[p].kind = k;
    return NF_OK;
  }
  case NF_SCH_CACHE_WRITE:
    if (L->g->stmts[si].red == NF_RED_NONE)
      return lerr(L, NF_EINVAL, si, "cache_write applies to reductions only");
    if (n->has_cw) return lerr(L, NF_EINVAL, si, "cache_write given twice");
    if ((p = find_loop(n, it->names[0])) < 0)
      return unknown_loop(L, si, n, "cache_write", it->names[0]);
    n->has_cw = 1;
    n->cw_var = n->l[p].var;
    memcpy(n->cw_name, n->l[p].name, NF_SCHED_NAME);
    return NF_OK;
  case NF_SCH_RFACTOR:
    if (L->g->stmts[si].red == NF_RED_NONE)
      return lerr(L, NF_EINVAL, si, "rfactor applies to reductions only");
    if (n->has_rf) return lerr(L, NF_EINVAL, si, "rfactor given twice");
    if ((p = find_loop(n, it->names[0])) < 0)
      return unknown_loop(L, si, n, "rfactor", it->names[0]);
    if (!n->l[p].red)
      return lerr(L, NF_EINVAL, si, "rfactor: loop '%s' is not a reduction loop", it->names[0]);
    n->has_rf = 1;
    n->rf_var = n->l[p].var;
    memcpy(n->rf_name, n->l[p].name, NF_SCHED_NAME);
    /* each slot folds a subsequence of the terms; the slots are folded
     * in order at the end: a different order of summation */
    n->reassoc = 1;
    return NF_OK;
  case NF_SCH_COMPUTE_AT:
  case NF_SCH_CACHE_READ:
    return NF_OK; /* placed when the consumer's nest is built (lower_stmt) */
  case NF_SCH_INLINE:
    return lerr(L, NF_EINVAL, si, "compute_inline: statement is scheduled by other primitives");
  default:
    return lerr(L, NF_EINVAL, si, "unknown primitive %d", it->kind);
  }
}

/* The position of the cache_write loop, or -1. */
static int cw_pos(const nest *n) {
  if (!n->has_cw) return -1;
  for (int i = 0; i < n->n; i++)
    if (n->l[i].var == n->cw_var) return i;
  return -2;
}

/* The position of the rfactor loop, -1 without one, -2 when it is gone. */
static int rf_pos(const nest *n) {
  if (!n->has_rf) return -1;
  for (int i = 0; i < n->n; i++)
    if (n->l[i].var == n->rf_var) return i;
  return -2;
}

/* Which loops (positions) an expression uses, as a bit mask. */
static uint64_t loop_mask(const nest *n, const nf_expr *e) {
  uint64_t m = 0;
  for (int i = 0; i < n->n; i++)
    if (uses_var(e, n->l[i].var)) m |= 1ull << i;
  return m;
}

/* Splits an index into the summands that use loops inside position px of
 * n (and constants): *inner, and the rest: *outer (loops at or outside px
 * and variables of enclosing nests).  0 when a summand mixes both. */
static int split_at(lw *L, const nest *n, int px, const nf_expr *e, const nf_expr **outer,
                    const nf_expr **inner) {
  const nf_expr *stack[64];
  int sign[64], sp = 0;
  uint64_t in_m = px + 1 >= 64 ? 0 : ~((1ull << (px + 1)) - 1);
  *inner = ci(L, 0);
  *outer = ci(L, 0);
  stack[sp] = e;
  sign[sp++] = 1;
  while (sp > 0) {
    const nf_expr *x = stack[--sp];
    int sg = sign[sp];
    if ((x->op == NF_OP_ADD || x->op == NF_OP_SUB) && sp < 62) {
      stack[sp] = x->args[0];
      sign[sp++] = sg;
      stack[sp] = x->args[1];
      sign[sp++] = x->op == NF_OP_SUB ? -sg : sg;
      continue;
    }
    uint64_t m = loop_mask(n, x);
    if ((m & in_m) && (m & ~in_m)) return 0;
    const nf_expr **side = (m & in_m) || x->op == NF_OP_CONST ? inner : outer;
    *side = bin(L, sg > 0 ? NF_OP_ADD : NF_OP_SUB, *side, x);
  }
  *inner = simp(L, *inner);
  *outer = simp(L, *outer);
  return *inner && *outer;
}

/* Adds mul * e to the linear form coef[] (by loop position, loops inside
 * px only) + *k; 0 when e is not such a form (another variable, a
 * division, a product of loops, an overflow). */
static int lin_form(const nest *n, int px, const nf_expr *e, int64_t mul, int64_t *coef,
                    int64_t *k) {
  switch (e->op) {
  case NF_OP_CONST: {
    if (!nf_dtype_is_int((nf_dtype)e->dtype)) return 0;
    int64_t v;
    return !__builtin_mul_overflow(mul, e->u.i, &v) && !__builtin_add_overflow(*k, v, k);
  }
  case NF_OP_VAR:
    for (int i = px + 1; i < n->n; i++)
      if (n->l[i].var == e->u.var) return !__builtin_add_overflow(coef[i], mul, &coef[i]);
    return 0;
  case NF_OP_ADD:
  case NF_OP_SUB:
    if (mul == INT64_MIN) return 0;
    return lin_form(n, px, e->args[0], mul, coef, k) &&
           lin_form(n, px, e->args[1], e->op == NF_OP_SUB ? -mul : mul, coef, k);
  case NF_OP_MUL:
    for (int s = 0; s < 2; s++) {
      const nf_expr *a = e->args[s];
      int64_t m;
      if (a->op == NF_OP_CONST && nf_dtype_is_int((nf_dtype)a->dtype) &&
          !__builtin_mul_overflow(mul, a->u.i, &m))
        return lin_form(n, px, e->args[1 - s], m, coef, k);
    }
    return 0;
  default: return 0;
  }
}

/* One dimension of a cache_write tile at loop px, from the part `in` of
 * the output index over loops inside px (split_at): its extent *ext and
 * (idx not NULL) the tile's index *idx.  Normally the bounding box of
 * `in`, indexed by in - lo.  When `in` is a sum of coef * loop (loops
 * inside px) plus a constant whose terms, sorted by coefficient, do not
 * overlap (each coefficient at least the previous one times its loop's
 * extent) and leave gaps (virtual threads: v * (bi / vt) + e, with the
 * thread's own loop outside px), the box is mostly cells no point maps
 * to; the tile is then compact: the mixed-radix index of those loops
 * (the first sorted loop fastest), of the product of their extents.
 * Every user of the tile goes through this index.  0 when `in` cannot
 * be bounded. */
static int tile_dim(lw *L, const nest *n, int px, const nf_expr *in, int64_t *ext,
                    const nf_expr **idx) {
  nf_range r;
  if (!nf_expr_bounds(in, L->vr, (int)L->nv, &r)) return 0;
  *ext = r.hi - r.lo + 1;
  if (idx && !(*idx = simp(L, bin(L, NF_OP_SUB, in, ci(L, r.lo))))) return 0;
  int64_t coef[MAX_LOOPS] = {0}, k = 0;
  if (!lin_form(n, px, in, 1, coef, &k)) return 1;
  int ord[MAX_LOOPS], nt = 0;
  for (int i = px + 1; i < n->n; i++) {
    if (coef[i] < 0) return 1;
    if (coef[i] == 0 || n->l[i].ext <= 1) continue; /* constant 0 */
    int at = nt++;
    while (at > 0 && coef[ord[at - 1]] > coef[i]) { /* insertion sort */
      ord[at] = ord[at - 1];
      at--;
    }
    ord[at] = i;
  }
  int64_t size = 1, reach = 1; /* the coefficient the next term must reach */
  for (int t = 0; t < nt; t++) {
    int i = ord[t];
    if (coef[i] < reach) return 1; /* overlapping terms: keep the box */
    if (__builtin_mul_overflow(coef[i], n->l[i].ext, &reach)) return 1;
    size *= n->l[i].ext; /* <= the box's extent: no overflow */
  }
  if (size >= *ext) return 1; /* no gap: the box */
  *ext = size;
  if (!idx) return 1;
  const nf_expr *x = ci(L, 0);
  int64_t stride = 1;
  for (int t = 0; t < nt; t++) {
    int i = ord[t];
    x = bin(L, NF_OP_ADD, x, bin(L, NF_OP_MUL, var(L, n->l[i].var), ci(L, stride)));
    stride *= n->l[i].ext;
  }
  return (*idx = simp(L, x)) != NULL;
}

/* Checks the annotations and cache_write of a finished nest. */
static int nest_finish(lw *L, int si, nest *n) {
  for (int i = 0; i < n->n; i++) {
    const lloop *lp = &n->l[i];
    switch (lp->kind) {
    case NF_LOOP_PARALLEL:
      if (n->in_region)
        return lerr(L, NF_EINVAL, si,
                    "parallel: loop '%s' belongs to a statement computed at another "
                    "statement's loop (only the outermost nest runs in parallel)", lp->name);
      if (i != 0)
        return lerr(L, NF_EINVAL, si, "parallel: loop '%s' is not the outermost loop", lp->name);
      if (lp->red)
        return lerr(L, NF_EINVAL, si,
                    "parallel: loop '%s' is a reduction loop (would break the reduction's "
                    "dependence)", lp->name);
      break;
    case NF_LOOP_BLOCK:
    case NF_LOOP_THREAD: {
      const char *bn = lp->kind == NF_LOOP_BLOCK ? "bind_block" : "bind_thread";
      if (n->in_region)
        return lerr(L, NF_EINVAL, si,
                    "%s: loop '%s' belongs to a statement computed at another statement's "
                    "loop (only the outermost nest is bound to the GPU)", bn, lp->name);
      if (lp->red && !(lp->kind == NF_LOOP_THREAD && n->has_rf && lp->var == n->rf_var))
        return lerr(L, NF_EINVAL, si,
                    "%s: loop '%s' is a reduction loop (its iterations would race on the "
                    "output; a thread loop may be the rfactor loop)", bn, lp->name);
      /* block loops are the outermost loops; the thread loops of a nest
       * are contiguous and may sit inside serial loops inside the block
       * loops (a blocked reduction whose operands a block stages) */
      int first_thread = -1;
      for (int j = 0; j < i && first_thread < 0; j++)
        if (n->l[j].kind == NF_LOOP_THREAD) first_thread = j;
      for (int j = 0; j < i; j++) {
        int ok = lp->kind == NF_LOOP_BLOCK ? n->l[j].kind == NF_LOOP_BLOCK
                 : first_thread >= 0 && j >= first_thread ? n->l[j].kind == NF_LOOP_THREAD
                                                         : 1;
        if (!ok)
          return lerr(L, NF_EINVAL, si,
                      "%s: loop '%s' is inside loop '%s' (block loops come first; a nest's "
                      "thread loops are contiguous)", bn, lp->name, n->l[j].name);
      }
      break;
    }
    case NF_LOOP_VECTOR:
      if (i != n->n - 1)
        return lerr(L, NF_EINVAL, si, "vectorize: loop '%s' is not the innermost loop", lp->name);
      if (lp->red && !(n->has_rf && lp->var == n->rf_var))
        return lerr(L, NF_EINVAL, si,
                    "vectorize: loop '%s' is a reduction loop (would break the reduction's "
                    "dependence; rfactor it first)", lp->name);
      if (lp->ext < 2 || lp->ext > 64)
        return lerr(L, NF_EINVAL, si, "vectorize: extent %lld of loop '%s' is not in 2..64",
                    (long long)lp->ext, lp->name);
      break;
    case NF_LOOP_UNROLL:
      if (lp->ext > 64)
        return lerr(L, NF_EINVAL, si, "unroll: extent %lld of loop '%s' is over 64",
                    (long long)lp->ext, lp->name);
      break;
    default: break;
    }
  }
  int c = cw_pos(n);
  if (c == -2)
    return lerr(L, NF_EINVAL, si, "cache_write: loop '%s' no longer exists (split or fused later)",
                n->cw_name);
  int rf = rf_pos(n);
  if (rf == -2)
    return lerr(L, NF_EINVAL, si, "rfactor: loop '%s' no longer exists (split or fused later)",
                n->rf_name);
  if (rf >= 0 && c < 0)
    return lerr(L, NF_EINVAL, si,
                "rfactor: loop '%s' needs a cache_write tile to hold its partial results",
                n->rf_name);
  if (rf >= 0 && rf <= c)
    return lerr(L, NF_EINVAL, si, "rfactor: loop '%s' is not inside the cache_write loop '%s'",
                n->rf_name, n->cw_name);
  if (rf >= 0 && L->g->tensors[L->g->stmts[si].out].rank >= NF_MAX_RANK)
    return lerr(L, NF_ELIMIT, si, "rfactor: the output has the largest rank (%d) already",
                NF_MAX_RANK);
  if (c >= 0) {
    if (c == n->n - 1)
      return lerr(L, NF_EINVAL, si, "cache_write: no loops inside '%s'", n->cw_name);
    if (n->l[n->n - 1].kind == NF_LOOP_VECTOR && c == n->n - 2)
      return lerr(L, NF_EINVAL, si, "cache_write: tile inside the vector loop");
    const nf_tensor *t = &L->g->tensors[L->g->stmts[si].out];
    int64_t elems = rf >= 0 ? n->l[rf].ext : 1;
    for (int d = 0; d < t->rank; d++) {
      const nf_expr *in, *out_part;
      int64_t ext;
      if (!split_at(L, n, c, n->orig[d], &out_part, &in))
        return lerr(L, NF_EINVAL, si,
                    "cache_write: output index %d mixes loops inside and outside '%s'", d,
                    n->cw_name);
      if (!tile_dim(L, n, c, in, &ext, NULL))
        return lerr(L, NF_EINVAL, si, "cache_write: cannot bound the tile");
      elems *= ext;
      if (elems > TILE_MAX_ELEMS)
        return lerr(L, NF_ELIMIT, si, "cache_write: tile over %d elements", TILE_MAX_ELEMS);
    }
  }
  return NF_OK;
}

static int resolve_stmt(lw *L, int32_t idx, const char *name, int *out) {
  if (idx >= 0) {
    if ((uint32_t)idx >= L->g->n_stmts)
      return lerr(L, NF_EINVAL, -1, "statement %d out of range (the graph has %u)", idx,
                  L->g->n_stmts);
    *out = idx;
    return NF_OK;
  }
  for (uint32_t s = 0; s < L->g->n_stmts; s++) {
    const char *tn = L->g->tensors[L->g->stmts[s].out].name;
    if (tn && strcmp(tn, name) == 0) {
      *out = (int)s;
      return NF_OK;
    }
  }
  return lerr(L, NF_EINVAL, -1, "unknown statement '%s'", name);
}

/* Builds and checks the nest of statement si under schedule s. */
static int stmt_nest(lw *L, const nf_schedule *s, int si, const region *R, nest *n) {
  int rc;
  nest_init(L, si, R, n);
  if (L->oom) return NF_ENOMEM;
  for (int k = 0; s && k < s->n_items; k++) {
    const nf_sched_item *it = &s->items[k];
    int t;
    if ((rc = resolve_stmt(L, it->stmt, it->stmt_name, &t)) < 0) return rc;
    if (t != si || it->kind == NF_SCH_INLINE) continue;
    if ((rc = apply_item(L, si, n, it)) < 0) {
      if (it->line > 0) nf_buf_printf(L->err, " (line %d)", it->line);
      return rc;
    }
  }
  return nest_finish(L, si, n);
}

/* ---- statement building ---- */

static nf_lstmt *mk(lw *L, int kind, int n_body) {
  nf_lstmt *s = nf_arena_alloc(L->arena, sizeof *s);
  if (!s) {
    L->oom = 1;
    return NULL;
  }
  s->kind = (uint8_t)kind;
  s->n_body = n_body;
  if (n_body > 0) {
    s->body = nf_arena_alloc(L->arena, (size_t)n_body * sizeof *s->body);
    if (!s->body) {
      L->oom = 1;
      return NULL;
    }
  }
  return s;
}

static nf_lstmt *seq(lw *L, nf_lstmt **items, int n) {
  nf_lstmt *s = mk(L, NF_LS_SEQ, n);
  if (!s) return NULL;
  for (int i = 0; i < n; i++) {
    if (!items[i]) return NULL;
    s->body[i] = items[i];
  }
  return s;
}

static nf_lstmt *wrap1(lw *L, int kind, nf_lstmt *body) {
  if (!body) return NULL;
  nf_lstmt *s = mk(L, kind, 1);
  if (s) s->body[0] = body;
  return s;
}

static const char *dup_name(lw *L, const char *s) {
  const char *d = nf_arena_strdup(L->arena, s);
  if (!d) L->oom = 1;
  return d;
}

/* Loops loops[0..n) around payload; guard g goes right inside the
 * innermost of these loops it uses (before the next loop). */
/* Wraps body in the prologues attached to loop var: ALLOC(buf) { pro; body }. */
static nf_lstmt *attach_wrap(lw *L, uint32_t v, const attach *at, int nat, nf_lstmt *body) {
  for (int k = nat; k-- > 0 && body;) {
    if (at[k].var != v) continue;
    nf_lstmt *items[2] = {at[k].pro, body};
    nf_lstmt *al = wrap1(L, NF_LS_ALLOC, seq(L, items, 2));
    if (!al) return NULL;
    al->buf = at[k].buf;
    body = al;
  }
  return body;
}

static nf_lstmt *build_at(lw *L, const lloop *loops, int n, const nf_expr *const *guards,
                          int ng, const attach *at, int nat, nf_lstmt *payload);

static nf_lstmt *build(lw *L, const lloop *loops, int n, const nf_expr *const *guards, int ng,
                       nf_lstmt *payload) {
  return build_at(L, loops, n, guards, ng, NULL, 0, payload);
}

/* Same, with the prologues `at` placed at the start of their loops' bodies
 * (inside the guards of that level). */
static nf_lstmt *build_at(lw *L, const lloop *loops, int n, const nf_expr *const *guards,
                          int ng, const attach *at, int nat, nf_lstmt *payload) {
  int lvl[MAX_GUARDS];
  for (int k = 0; k < ng; k++) {
    lvl[k] = 0;
    for (int i = 0; i < n; i++)
      if (uses_var(guards[k], loops[i].var)) lvl[k] = i + 1;
  }
  nf_lstmt *cur = payload;
  for (int level = n; level >= 0 && cur; level--) {
    if (level > 0 && nat > 0 && !(cur = attach_wrap(L, loops[level - 1].var, at, nat, cur)))
      return NULL;
    const nf_expr *cond = NULL;
    for (int k = 0; k < ng; k++)
      if (lvl[k] == level) cond = cond ? bin(L, NF_OP_AND, cond, guards[k]) : guards[k];
    if (cond) {
      cur = wrap1(L, NF_LS_IF, cur);
      if (!cur) return NULL;
      cur->cond = cond;
    }
    if (level > 0) {
      const lloop *lp = &loops[level - 1];
      cur = wrap1(L, NF_LS_LOOP, cur);
      if (!cur) return NULL;
      cur->var = lp->var;
      cur->extent = lp->ext;
      cur->loop_kind = lp->kind;
      cur->var_name = dup_name(L, lp->name);
    }
  }
  return cur;
}

static const nf_expr *identity(lw *L, int red, nf_dtype t) {
  if (nf_dtype_is_float(t)) {
    double v = red == NF_RED_PROD ? 1 : red == NF_RED_MAX ? -INFINITY
             : red == NF_RED_MIN ? INFINITY : 0;
    return nf_e_const_f(L->ctx, t, v);
  }
  int64_t lo = t == NF_I32 ? INT32_MIN : t == NF_BOOL ? 0 : INT64_MIN;
  int64_t hi = t == NF_I32 ? INT32_MAX : t == NF_BOOL ? 1 : INT64_MAX;
  int64_t v = red == NF_RED_PROD ? 1 : red == NF_RED_MAX ? lo : red == NF_RED_MIN ? hi : 0;
  return nf_e_const_i(L->ctx, t, v);
}

static nf_lstmt *store(lw *L, uint32_t buf, int n_idx, const nf_expr *const *idx,
                       const nf_expr *value, int op) {
  nf_lstmt *s = mk(L, NF_LS_STORE, 0);
  if (!s || !value) return NULL;
  s->buf = buf;
  s->n_idx = n_idx;
  for (int i = 0; i < n_idx; i++) {
    if (!idx[i]) return NULL;
    s->idx[i] = idx[i];
  }
  s->value = value;
  s->op = (uint8_t)op;
  return s;
}

static int add_buf(lw *L, const char *name, int dtype, int kind, int rank, const int64_t *shape,
                   int32_t arg) {
  if (L->nb == L->cap_b) {
    uint32_t nc = L->cap_b ? 2 * L->cap_b : 16;
    nf_lbuf *n = nf_arena_alloc(L->arena, nc * sizeof *n);
    if (!n) return -1;
    if (L->nb) memcpy(n, L->bufs, L->nb * sizeof *n);
    L->bufs = n;
    L->cap_b = nc;
  }
  nf_lbuf *b = &L->bufs[L->nb];
  memset(b, 0, sizeof *b);
  b->name = dup_name(L, name ? name : "t");
  b->dtype = (uint8_t)dtype;
  b->kind = (uint8_t)kind;
  b->rank = (uint8_t)rank;
  for (int d = 0; d < rank; d++) b->shape[d] = shape[d];
  b->arg = arg;
  return (int)L->nb++;
}

/* ---- rhs translation ---- */

/* node -> its translation: the common pointer map */
typedef nf_ptrmap tmap;

static const nf_expr *tmap_get(const tmap *m, const nf_expr *k) {
  const void *v = NULL;
  return nf_ptrmap_getp(m, k, &v) ? v : NULL;
}

static int tmap_put(tmap *m, const nf_expr *k, const nf_expr *v) { return nf_ptrmap_putp(m, k, v); }

static void tmap_free(tmap *m) { nf_ptrmap_free(m); }

static const nf_expr *translate(lw *L, const nf_expr *e, const nf_expr *const *vmap, int nvmap,
                                tmap *memo, int depth);

static const nf_expr *translate_access(lw *L, const nf_expr *e, const nf_expr *const *args,
                                       int depth) {
  uint32_t t = e->u.tensor;
  int32_t b = L->buf_of[t];
  if (b < 0) { /* inlined producer: substitute its rhs at these indices */
    const nf_stmt *ps = &L->g->stmts[L->stmt_of[t]];
    if (depth > 64) return NULL;
    tmap m = NF_PTRMAP_INIT;
    const nf_expr *r = translate(L, ps->rhs, args, e->n_args, &m, depth + 1);
    tmap_free(&m);
    return r;
  }
  const nf_expr *idx[NF_MAX_RANK];
  for (int d = 0; d < e->n_args; d++) {
    idx[d] = args[d];
    if (uses_access(args[d])) { /* data-dependent: clamp into the buffer */
      int64_t hi = L->bufs[b].shape[d] - 1;
      idx[d] = bin(L, NF_OP_MIN, bin(L, NF_OP_MAX, args[d], ci(L, 0)), ci(L, hi < 0 ? 0 : hi));
      if (!idx[d]) return NULL;
    }
  }
  return nf_e_access(L->ctx, (uint32_t)b, (nf_dtype)e->dtype, e->n_args, idx);
}

static const nf_expr *translate(lw *L, const nf_expr *e, const nf_expr *const *vmap, int nvmap,
                                tmap *memo, int depth) {
  const nf_expr *r = tmap_get(memo, e);
  if (r) return r;
  if (e->op == NF_OP_VAR) {
    if ((int)e->u.var >= nvmap) return NULL;
    r = vmap[e->u.var];
  } else if (e->n_args == 0 && e->op != NF_OP_ACCESS) {
    r = nf_e_rebuild(L->ctx, e, NULL);
  } else {
    const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
    for (int i = 0; i < e->n_args; i++)
      if (!(args[i] = translate(L, e->args[i], vmap, nvmap, memo, depth))) return NULL;
    r = e->op == NF_OP_ACCESS ? translate_access(L, e, args, depth)
                              : nf_e_rebuild(L->ctx, e, args);
  }
  if (r && tmap_put(memo, e, r) < 0) return NULL;
  return r;
}

/* ---- compute_at and cache_read: regions and prologues ---- */

/* The distinct accesses of buffer b in e (after translation). */
typedef struct acc_list {
  uint32_t b;
  int n, cap;
  const nf_expr **a;
  int oom;
} acc_list;

static void acc_fn(const nf_expr *e, void *user) {
  acc_list *l = user;
  if (e->op != NF_OP_ACCESS || e->u.tensor != l->b) return;
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 8;
    const nf_expr **na = realloc(l->a, (size_t)nc * sizeof *na);
    if (!na) {
      l->oom = 1;
      return;
    }
    l->a = na;
    l->cap = nc;
  }
  l->a[l->n++] = e;
}

/* The region of tensor shape (rank dims) that accesses a[0..na) read
 * inside loop px of n: R->start and R->ext.  NF_OK or NF_EINVAL/NF_ELIMIT
 * with a message. */
static int infer_region(lw *L, int si, const nest *n, int px, const char *what,
                        const nf_expr *const *a, int na, int rank, region *R) {
  const nf_expr *outer0[NF_MAX_RANK];
  int64_t lo[NF_MAX_RANK], hi[NF_MAX_RANK], elems = 1;
  R->rank = rank;
  R->n = n;
  R->px = px;
  for (int k = 0; k < na; k++)
    for (int d = 0; d < rank; d++) {
      const nf_expr *ix = a[k]->args[d], *o, *in;
      if (uses_access(ix))
        return lerr(L, NF_EINVAL, si, "%s: index %d of '%s' is data-dependent", what, d,
                    L->bufs[a[k]->u.tensor].name);
      if (!split_at(L, n, px, ix, &o, &in))
        return lerr(L, NF_EINVAL, si,
                    "%s: index %d of '%s' mixes loops inside and outside '%s' (no rectangular "
                    "region)", what, d, L->bufs[a[k]->u.tensor].name, n->l[px].name);
      if (k == 0) {
        outer0[d] = o;
      } else {
        const nf_expr *diff = simp(L, bin(L, NF_OP_SUB, o, outer0[d]));
        if (!diff) return NF_ENOMEM;
        if (diff->op != NF_OP_CONST)
          return lerr(L, NF_EINVAL, si,
                      "%s: the reads of '%s' are not at constant offsets of each other", what,
                      L->bufs[a[k]->u.tensor].name);
        in = simp(L, bin(L, NF_OP_ADD, in, diff));
        if (!in) return NF_ENOMEM;
      }
      nf_range r;
      if (!nf_expr_bounds(in, L->vr, (int)L->nv, &r))
        return lerr(L, NF_EINVAL, si, "%s: cannot bound index %d of '%s'", what, d,
                    L->bufs[a[k]->u.tensor].name);
      if (k == 0 || r.lo < lo[d]) lo[d] = r.lo;
      if (k == 0 || r.hi > hi[d]) hi[d] = r.hi;
    }
  for (int d = 0; d < rank; d++) {
    R->ext[d] = hi[d] - lo[d] + 1;
    if (R->ext[d] > REGION_MAX_ELEMS || (elems *= R->ext[d]) > REGION_MAX_ELEMS)
      return lerr(L, NF_ELIMIT, si, "%s: region of '%s' at '%s' is over %d elements", what,
                  L->bufs[a[0]->u.tensor].name, n->l[px].name, REGION_MAX_ELEMS);
    R->start[d] = simp(L, bin(L, NF_OP_ADD, outer0[d], ci(L, lo[d])));
    if (!R->start[d]) return NF_ENOMEM;
    R->outer[d] = outer0[d];
    R->lo[d] = lo[d];
  }
  return NF_OK;
}

/* e with every access of buffer from replaced by an access of buffer to
 * at index - R->start. */
static const nf_expr *rebase(lw *L, const nf_expr *e, uint32_t from, const region *R,
                             tmap *memo) {
  const nf_expr *r = tmap_get(memo, e);
  if (r) return r;
  if (e->n_args == 0) return e;
  const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  int changed = 0;
  for (int i = 0; i < e->n_args; i++) {
    if (!(args[i] = rebase(L, e->args[i], from, R, memo))) return NULL;
    changed |= args[i] != e->args[i];
  }
  if (e->op == NF_OP_ACCESS && e->u.tensor == from) {
    for (int d = 0; d < e->n_args; d++) {
      /* (o - outer) + (in - lo): the parts over outer loops cancel to a
       * constant even where the simplifier would not cancel them in
       * index - start (a fused loop's `f % 28 * 2` terms) */
      const nf_expr *o, *in;
      if (R->n && split_at(L, R->n, R->px, args[d], &o, &in)) {
        const nf_expr *dc = simp(L, bin(L, NF_OP_SUB, o, R->outer[d]));
        if (!dc) return NULL;
        if (dc->op == NF_OP_CONST) {
          args[d] = simp(L, bin(L, NF_OP_ADD, in, ci(L, dc->u.i - R->lo[d])));
          if (!args[d]) return NULL;
          continue;
        }
      }
      if (!(args[d] = simp(L, bin(L, NF_OP_SUB, args[d], R->start[d])))) return NULL;
    }
    if (R->permuted) {
      const nf_expr *la[NF_MAX_RANK];
      for (int k = 0; k < e->n_args; k++) la[k] = args[R->perm[k]];
      memcpy(args, la, (size_t)e->n_args * sizeof la[0]);
    }
    r = nf_e_access(L->ctx, R->buf, (nf_dtype)e->dtype, e->n_args, args);
  } else {
    r = changed ? nf_e_rebuild(L->ctx, e, args) : e;
  }
  if (r && tmap_put(memo, e, r) < 0) return NULL;
  return r;
}

static int lower_stmt(lw *L, const nf_schedule *s, int si, const region *R, nf_lstmt **out,
                      int *reassoc);

/* Whether comparison or conjunction c holds wherever access a of buffer
 * b is inside b: each conjunct compares one of a's indices (plus a
 * constant) with a constant that its bounds already satisfy, as a padded
 * convolution's guard `h + r - 1 >= 0 && h + r - 1 < H ...` does. */
static int implied_by_bounds(lw *L, const nf_expr *c, const nf_expr *a, const nf_lbuf *b) {
  if (c->op == NF_OP_CONST) return c->u.i != 0;
  if (c->op == NF_OP_AND)
    return implied_by_bounds(L, c->args[0], a, b) && implied_by_bounds(L, c->args[1], a, b);
  nf_op op = (nf_op)c->op;
  if (op != NF_OP_LT && op != NF_OP_LE && op != NF_OP_GT && op != NF_OP_GE) return 0;
  const nf_expr *lhs = c->args[0], *k = c->args[1];
  if (lhs->op == NF_OP_CONST) { /* k OP x: x (flipped OP) k */
    lhs = c->args[1];
    k = c->args[0];
    op = op == NF_OP_LT ? NF_OP_GT : op == NF_OP_LE ? NF_OP_GE : op == NF_OP_GT ? NF_OP_LT
                                                                               : NF_OP_LE;
  }
  if (k->op != NF_OP_CONST || !nf_dtype_is_int((nf_dtype)k->dtype)) return 0;
  for (int d = 0; d < a->n_args; d++) {
    const nf_expr *diff = simp(L, bin(L, NF_OP_SUB, lhs, a->args[d]));
    if (!diff || diff->op != NF_OP_CONST || !nf_dtype_is_int((nf_dtype)diff->dtype)) continue;
    /* lhs = index + diff: the test is index OP m */
    int64_t m = k->u.i - diff->u.i, D = b->shape[d];
    if ((op == NF_OP_GE && m <= 0) || (op == NF_OP_GT && m < 0) ||
        (op == NF_OP_LT && m >= D) || (op == NF_OP_LE && m >= D - 1))
      return 1;
  }
  return 0;
}

/* e with every `c ? a : 0` whose a is an access of buffer b and whose c
 * only tests that a is inside b replaced by a (cache_read's zero-padded
 * copy holds 0 wherever a is outside b); *n counts them. */
static const nf_expr *drop_pad_guards(lw *L, const nf_expr *e, uint32_t b, tmap *memo, int *n) {
  const nf_expr *r = tmap_get(memo, e);
  if (r) return r;
  if (e->n_args == 0) return e;
  if (e->op == NF_OP_SELECT && e->args[1]->op == NF_OP_ACCESS && e->args[1]->u.tensor == b &&
      e->args[2]->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->args[2]->dtype) &&
      e->args[2]->u.f == 0.0 && implied_by_bounds(L, e->args[0], e->args[1], &L->bufs[b])) {
    (*n)++;
    r = e->args[1];
  } else {
    const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
    int changed = 0;
    for (int i = 0; i < e->n_args; i++) {
      if (!(args[i] = drop_pad_guards(L, e->args[i], b, memo, n))) return NULL;
      changed |= args[i] != e->args[i];
    }
    r = changed ? nf_e_rebuild(L->ctx, e, args) : e;
  }
  if (r && tmap_put(memo, e, r) < 0) return NULL;
  return r;
}

/* The copy nest of cache_read: local[v] = src[start + v] over the region,
 * guarded to the source's bounds; with zero_fill the cells outside the
 * source are set to 0 instead of skipped. */
static nf_lstmt *copy_nest(lw *L, uint32_t src, const region *R, int zero_fill) {
  const nf_lbuf *sb = &L->bufs[src];
  lloop loops[NF_MAX_RANK];
  const nf_expr *guards[2 * NF_MAX_RANK], *sidx[NF_MAX_RANK], *lidx[NF_MAX_RANK];
  int ng = 0;
  for (int d = 0; d < R->rank; d++) {
    memset(&loops[d], 0, sizeof loops[d]);
    loops[d].ext = R->ext[d];
    loops[d].var = new_var(L, R->ext[d]);
    snprintf(loops[d].name, NF_SCHED_NAME, "%.40s.rd%d", sb->name, d);
    if (L->oom) return NULL;
    lidx[d] = var(L, loops[d].var);
    sidx[d] = simp(L, bin(L, NF_OP_ADD, R->start[d], lidx[d]));
    const nf_expr *gd[2] = {simp(L, bin(L, NF_OP_GE, sidx[d], ci(L, 0))),
                            simp(L, bin(L, NF_OP_LT, sidx[d], ci(L, sb->shape[d])))};
    for (int j = 0; j < 2; j++) {
      if (!gd[j]) return NULL;
      if (!(gd[j]->op == NF_OP_CONST && gd[j]->u.i)) guards[ng++] = gd[j];
    }
  }
  const nf_expr *v = nf_e_access(L->ctx, src, (nf_dtype)sb->dtype, R->rank, sidx);
  if (zero_fill && ng > 0) {
    const nf_expr *inb = guards[0];
    for (int j = 1; j < ng; j++) inb = bin(L, NF_OP_AND, inb, guards[j]);
    v = inb && v ? nf_e_select(L->ctx, inb, v, nf_e_const_f(L->ctx, (nf_dtype)sb->dtype, 0.0))
                 : NULL;
    if (!v) {
      L->oom = 1;
      return NULL;
    }
    ng = 0;
  }
  /* the innermost loop copies whole vectors where both sides are
   * contiguous along it (a row of the image: one wide load each, where a
   * scalar copy took as long as the convolution over that row) */
  int last = R->rank - 1;
  if (last >= 0 && R->ext[last] >= 4 && R->ext[last] <= 64 &&
      (!R->permuted || R->perm[last] == last))
    loops[last].kind = NF_LOOP_VECTOR;
  const nf_expr *pidx[NF_MAX_RANK];
  for (int k = 0; k < R->rank; k++) pidx[k] = lidx[R->permuted ? R->perm[k] : k];
  return build(L, loops, R->rank, guards, ng, store(L, R->buf, R->rank, pidx, v, NF_RED_NONE));
}

/* The layout of a cache_read copy: where the nest's vector loop indexes
 * exactly one dimension of the region in every read, and not the last,
 * that dimension goes last (the others keep their order), so that the
 * vector loads of the copy are contiguous where the tensor's are strided:
 * a convolution vectorized over output channels reads W[k][c][r][s] along
 * k, its copy W_rd[c][r][s][k].  The copy does the transposition once per
 * iteration of the cache_read loop. */
static void region_layout(const nest *n, const nf_expr *const *a, int na, region *R) {
  R->permuted = 0;
  int vl = -1;
  for (int i = 0; i < n->n; i++)
    if (n->l[i].kind == NF_LOOP_VECTOR) vl = i;
  if (vl < 0 || R->rank < 2) return;
  uint32_t vv = n->l[vl].var;
  int dim = -1;
  for (int j = 0; j < na; j++) {
    int found = -1;
    for (int d = 0; d < a[j]->n_args; d++)
      if (uses_var(a[j]->args[d], vv)) {
        if (found >= 0) return; /* two dimensions */
        found = d;
      }
    if (found < 0) continue; /* a uniform read */
    if (dim >= 0 && found != dim) return;
    dim = found;
  }
  if (dim < 0 || dim == R->rank - 1) return;
  int k = 0;
  for (int d = 0; d < R->rank; d++)
    if (d != dim) R->perm[k++] = d;
  R->perm[k] = dim;
  R->permuted = 1;
}

/* The prologue of schedule item k (compute_at into si, or cache_read of
 * si) at its loop of n; rewrites *rhs to read the local buffer. */
static int attach_item(lw *L, const nf_schedule *s, int si, const nest *n, int k,
                       const nf_expr **rhs, attach *at, int *reassoc) {
  const nf_sched_item *it = &s->items[k];
  int is_at = it->kind == NF_SCH_COMPUTE_AT, p = -1, rc;
  const char *what = is_at ? "compute_at" : "cache_read";
  int px = find_loop(n, it->names[0]);
  if (px < 0) return unknown_loop(L, si, n, what, it->names[0]);
  if (n->l[px].kind == NF_LOOP_VECTOR)
    return lerr(L, NF_EINVAL, si, "%s: loop '%s' is vectorized (its body holds no loops)", what,
                it->names[0]);
  uint32_t b;
  if (is_at) {
    if ((rc = resolve_stmt(L, it->stmt, it->stmt_name, &p)) < 0) return rc;
    b = (uint32_t)L->buf_of[L->g->stmts[p].out];
  } else {
    int32_t found = -1;
    for (uint32_t t = 0; t < L->g->n_tensors && found < 0; t++)
      if (L->g->tensors[t].name && strcmp(L->g->tensors[t].name, it->names[1]) == 0)
        found = (int32_t)t;
    if (found < 0) return lerr(L, NF_EINVAL, si, "cache_read: unknown tensor '%s'", it->names[1]);
    if (L->buf_of[found] < 0)
      return lerr(L, NF_EINVAL, si, "cache_read: '%s' is inlined (it has no buffer)",
                  it->names[1]);
    if (L->stmt_of[found] >= 0 && L->at_of[L->stmt_of[found]] >= 0)
      return lerr(L, NF_EINVAL, si, "cache_read: '%s' is computed at a statement's loop",
                  it->names[1]);
    b = (uint32_t)L->buf_of[found];
  }
  acc_list al = {.b = b};
  if (nf_expr_visit(*rhs, acc_fn, &al) < 0 || al.oom) {
    free(al.a);
    return NF_ENOMEM;
  }
  if (al.n == 0) {
    free(al.a);
    return lerr(L, NF_EINVAL, si, "%s: the statement does not read '%s'", what,
                L->bufs[b].name);
  }
  /* a padded read `c ? T[i] : 0` of the copied tensor reads the copy
   * unguarded: the copy is zero-padded (the reads that keep their guard
   * never look at the cells outside T, whatever they hold) */
  int n_pad = 0;
  if (!is_at) {
    tmap pm = NF_PTRMAP_INIT;
    const nf_expr *np = drop_pad_guards(L, *rhs, b, &pm, &n_pad);
    tmap_free(&pm);
    if (!np) {
      free(al.a);
      return NF_ENOMEM;
    }
    if (n_pad > 0) {
      *rhs = np;
      al.n = 0;
      if (nf_expr_visit(*rhs, acc_fn, &al) < 0 || al.oom) {
        free(al.a);
        return NF_ENOMEM;
      }
    }
  }
  region R;
  memset(&R, 0, sizeof R);
  rc = infer_region(L, si, n, px, what, al.a, al.n, L->bufs[b].rank, &R);
  if (rc == NF_OK && !is_at) region_layout(n, al.a, al.n, &R);
  free(al.a);
  if (rc < 0) return rc;
  char name[NF_SCHED_NAME + 8];
  snprintf(name, sizeof name, "%.48s_%s", L->bufs[b].name, is_at ? "at" : "rd");
  int64_t lext[NF_MAX_RANK];
  for (int k = 0; k < R.rank; k++) lext[k] = R.ext[R.permuted ? R.perm[k] : k];
  int lb = add_buf(L, name, L->bufs[b].dtype, NF_BUF_TEMP, R.rank, lext, -1);
  if (lb < 0 || L->oom) return NF_ENOMEM;
  R.buf = (uint32_t)lb;
  tmap memo = NF_PTRMAP_INIT;
  *rhs = rebase(L, *rhs, b, &R, &memo);
  tmap_free(&memo);
  if (!*rhs) return NF_ENOMEM;
  at->var = n->l[px].var;
  at->buf = R.buf;
  if (is_at) {
    if ((rc = lower_stmt(L, s, p, &R, &at->pro, reassoc)) < 0) return rc;
  } else if (!(at->pro = copy_nest(L, b, &R, n_pad > 0))) {
    return NF_ENOMEM;
  }
  return NF_OK;
}

/* Prologues of the items placed in statement si's nest, in schedule order. */
static int attach_all(lw *L, const nf_schedule *s, int si, const nest *n, const nf_expr **rhs,
                      attach *at, int *nat, int *reassoc) {
  *nat = 0;
  for (int k = 0; s && k < s->n_items; k++) {
    const nf_sched_item *it = &s->items[k];
    int t, rc;
    if (it->kind == NF_SCH_COMPUTE_AT) {
      if ((rc = resolve_stmt(L, it->stmt2, it->stmt2_name, &t)) < 0) return rc;
    } else if (it->kind == NF_SCH_CACHE_READ) {
      if ((rc = resolve_stmt(L, it->stmt, it->stmt_name, &t)) < 0) return rc;
    } else {
      continue;
    }
    if (t != si) continue;
    if (*nat == MAX_ATTACH) return lerr(L, NF_ELIMIT, si, "over %d compute_at/cache_read", MAX_ATTACH);
    if ((rc = attach_item(L, s, si, n, k, rhs, &at[*nat], reassoc)) < 0) {
      if (it->line > 0) nf_buf_printf(L->err, " (line %d)", it->line);
      return rc;
    }
    (*nat)++;
  }
  return NF_OK;
}

/* ---- lowering of one statement ---- */

static nf_lstmt *replica(lw *L, const nest *n, int c, nf_lstmt *(*payload)(lw *, void *,
                                                                         const nf_expr *const *),
                         void *ud, const nf_expr *const *tile_idx, int rank) {
  /* spatial loops inside c with fresh variables; guards on them */
  lloop loops[MAX_LOOPS];
  const nf_expr *guards[MAX_GUARDS], *tidx[2 * NF_MAX_RANK];
  int nl = 0, ng = 0;
  uint32_t from[MAX_LOOPS], to[MAX_LOOPS];
  int nmap = 0;
  for (int i = c + 1; i < n->n; i++) {
    if (n->l[i].red) continue;
    loops[nl] = n->l[i];
    loops[nl].var = new_var(L, n->l[i].ext);
    from[nmap] = n->l[i].var;
    to[nmap++] = loops[nl].var;
    nl++;
  }
  if (L->oom) return NULL;
  for (int k = 0; k < n->ng; k++) {
    int bad = 0;
    for (int i = c + 1; i < n->n; i++)
      if (n->l[i].red && uses_var(n->guard[k], n->l[i].var)) bad = 1;
    if (bad) continue;
    const nf_expr *g = n->guard[k];
    for (int m = 0; m < nmap && g; m++) g = subst(L, g, from[m], var(L, to[m]));
    uint64_t inner = 0;
    for (int m = 0; m < nmap && g; m++) inner |= uses_var(g, to[m]);
    if (!g) return NULL;
    if (inner) guards[ng++] = g; /* outer-only guards are already around */
  }
  for (int d = 0; d < rank; d++) {
    const nf_expr *x = tile_idx[d];
    for (int m = 0; m < nmap && x; m++) x = subst(L, x, from[m], var(L, to[m]));
    if (!x) return NULL;
    tidx[d] = x;
  }
  return build(L, loops, nl, guards, ng, payload(L, ud, tidx));
}

typedef struct wb_ctx {
  uint32_t tile, out;
  int rank;
  const nf_expr *const *orig; /* output index in main-nest variables */
  const nest *n;
  int c;
  const nf_expr *idv; /* identity */
  int64_t rf_ext;     /* rfactor: the tile's extra last dimension, else 0 */
  int red;            /* the reduction operator (folding rfactor slots) */
  int red_out;        /* rfactor with reduction loops outside the tile: the
                         write-back combines the slots' fold with the output */
  const int *perm;    /* layout: position k holds the output's dimension
                         perm[k]; NULL: the output's order */
} wb_ctx;

/* The tile's index: tidx[0..rank) (in the tile's layout), then (rfactor)
 * slot. */
static void tile_index(const wb_ctx *w, const nf_expr *const *tidx, const nf_expr *slot,
                       const nf_expr **out) {
  for (int d = 0; d < w->rank; d++) out[d] = tidx[w->perm ? w->perm[d] : d];
  if (w->rf_ext) out[w->rank] = slot;
}

/* A loop over a new variable of extent ext around body(var). */
static nf_lstmt *slot_loop(lw *L, int64_t ext, uint32_t v, nf_lstmt *body) {
  nf_lstmt *lp = wrap1(L, NF_LS_LOOP, body);
  if (!lp) return NULL;
  lp->var = v;
  lp->extent = ext;
  lp->loop_kind = NF_LOOP_SERIAL;
  lp->var_name = dup_name(L, "rf");
  return lp;
}

static nf_lstmt *init_payload(lw *L, void *ud, const nf_expr *const *tidx) {
  wb_ctx *w = ud;
  if (!w->rf_ext) {
    const nf_expr *ix[NF_MAX_RANK];
    tile_index(w, tidx, NULL, ix);
    return store(L, w->tile, w->rank, ix, w->idv, NF_RED_NONE);
  }
  /* every slot of the element starts at the identity */
  const nf_expr *ix[NF_MAX_RANK];
  uint32_t v = new_var(L, w->rf_ext);
  tile_index(w, tidx, var(L, v), ix);
  return slot_loop(L, w->rf_ext, v, store(L, w->tile, w->rank + 1, ix, w->idv, NF_RED_NONE));
}

/* rfactor: tile[tidx][0] op= tile[tidx][1 + r] for r in 0:E-1 (the slots
 * folded in order into slot 0). */
static nf_lstmt *fold_slots(lw *L, const wb_ctx *w, const nf_expr *const *tidx) {
  const nf_lbuf *tb = &L->bufs[w->tile];
  const nf_expr *ix[NF_MAX_RANK], *i0[NF_MAX_RANK];
  uint32_t v = new_var(L, w->rf_ext - 1);
  tile_index(w, tidx, simp(L, bin(L, NF_OP_ADD, var(L, v), ci(L, 1))), ix);
  tile_index(w, tidx, ci(L, 0), i0);
  const nf_expr *x = nf_e_access(L->ctx, w->tile, (nf_dtype)tb->dtype, w->rank + 1, ix);
  return slot_loop(L, w->rf_ext - 1, v, store(L, w->tile, w->rank + 1, i0, x, w->red));
}

static nf_lstmt *wb_payload(lw *L, void *ud, const nf_expr *const *both) {
  wb_ctx *w = ud;
  const nf_lbuf *tb = &L->bufs[w->tile];
  const nf_expr *ix[NF_MAX_RANK];
  tile_index(w, both, ci(L, 0), ix);
  const nf_expr *v = nf_e_access(L->ctx, w->tile, (nf_dtype)tb->dtype,
                                 w->rank + (w->rf_ext ? 1 : 0), ix);
  nf_lstmt *st = store(L, w->out, w->rank, both + w->rank, v, w->red_out ? w->red : NF_RED_NONE);
  if (!w->rf_ext || w->rf_ext == 1) return st;
  nf_lstmt *items[2] = {fold_slots(L, w, both), st};
  return seq(L, items, 2);
}

/* e with every access index that uses one of vars[0..n) clamped into
 * its buffer. */
static const nf_expr *clamp_reads(lw *L, const nf_expr *e, const uint32_t *vars, int n) {
  if (!e || e->n_args == 0) return e;
  const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  int changed = 0;
  for (int i = 0; i < e->n_args; i++) {
    args[i] = clamp_reads(L, e->args[i], vars, n);
    if (!args[i]) return NULL;
    if (e->op == NF_OP_ACCESS) {
      int uses = 0;
      for (int k = 0; k < n && !uses; k++) uses = uses_var(args[i], vars[k]);
      if (uses) {
        int64_t hi = L->bufs[e->u.tensor].shape[i] - 1;
        args[i] = simp(L, bin(L, NF_OP_MIN, bin(L, NF_OP_MAX, args[i], ci(L, 0)),
                              ci(L, hi < 0 ? 0 : hi)));
        if (!args[i]) return NULL;
      }
    }
    changed |= args[i] != e->args[i];
  }
  return changed ? nf_e_rebuild(L->ctx, e, args) : e;
}

/* tile[tidx] = out[oidx] (a tile that continues a partial reduction;
 * rfactor: the slots start at the identity, and the write-back combines
 * their fold with the output's partial result: each block of terms is
 * summed on its own, which keeps a long sum's rounding error small) */
static nf_lstmt *load_payload(lw *L, void *ud, const nf_expr *const *both) {
  wb_ctx *w = ud;
  if (w->rf_ext) return init_payload(L, ud, both); /* wb_payload adds the output */
  const nf_lbuf *ob = &L->bufs[w->out];
  const nf_expr *v = nf_e_access(L->ctx, w->out, (nf_dtype)ob->dtype, w->rank, both + w->rank);
  const nf_expr *ix[NF_MAX_RANK];
  tile_index(w, both, NULL, ix);
  return store(L, w->tile, w->rank, ix, v, NF_RED_NONE);
}

/* out = identity over the whole output of st (or region R). */
static nf_lstmt *identity_nest(lw *L, const nf_stmt *st, const region *R, uint32_t ob,
                               const nf_expr *idv) {
  const nf_tensor *t = &L->g->tensors[st->out];
  lloop il[NF_MAX_RANK];
  const nf_expr *ix[NF_MAX_RANK];
  for (int d = 0; d < t->rank; d++) {
    memset(&il[d], 0, sizeof il[d]);
    il[d].ext = R ? R->ext[d] : t->shape[d];
    il[d].var = new_var(L, il[d].ext);
    nf__sched_var_name(st, d, il[d].name);
    ix[d] = var(L, il[d].var);
  }
  if (L->oom) return NULL;
  return build(L, il, t->rank, NULL, 0, store(L, ob, t->rank, ix, idv, NF_RED_NONE));
}

/* Whether every access in e is inside its buffer for every value of the
 * loop variables (no select guards it: it may be evaluated anywhere). */
static int reads_in_bounds(lw *L, const nf_expr *e) {
  if (e->op == NF_OP_SELECT) return 0;
  if (e->op == NF_OP_ACCESS)
    for (int d = 0; d < e->n_args; d++) {
      nf_range r;
      if (!nf_expr_bounds(e->args[d], L->vr, (int)L->nv, &r) || r.lo < 0 ||
          r.hi >= L->bufs[e->u.tensor].shape[d])
        return 0;
    }
  for (int i = 0; i < e->n_args; i++)
    if (!reads_in_bounds(L, e->args[i])) return 0;
  return 1;
}

/* A sum's term c ? x * y : 0 (a padded convolution's) becomes
 * (c ? x : 0) * y when y reads only in bounds: the guard then covers the
 * one load that needs it (a masked load) and the product fuses with the
 * accumulation.  Equal for finite y; where y is inf or NaN at a cell the
 * guard excludes, the term is NaN instead of 0. */
static const nf_expr *hoist_select(lw *L, const nf_expr *e) {
  if (!e || e->op != NF_OP_SELECT || !nf_dtype_is_float((nf_dtype)e->dtype)) return e;
  const nf_expr *c = e->args[0], *t = e->args[1], *f = e->args[2];
  if (f->op != NF_OP_CONST || f->u.f != 0.0 || t->op != NF_OP_MUL) return e;
  for (int side = 0; side < 2; side++) {
    const nf_expr *x = t->args[side], *y = t->args[1 - side];
    if (!reads_in_bounds(L, y)) continue;
    const nf_expr *g = nf_e_select(L->ctx, c, x, f);
    return g ? bin(L, NF_OP_MUL, g, y) : NULL;
  }
  return e;
}

static int lower_stmt(lw *L, const nf_schedule *s, int si, const region *R, nf_lstmt **out,
                      int *reassoc) {
  const nf_stmt *st = &L->g->stmts[si];
  const nf_tensor *t = &L->g->tensors[st->out];
  nest n;
  int rc = stmt_nest(L, s, si, R, &n);
  if (rc < 0) return rc;
  *reassoc |= n.reassoc;
  uint32_t ob = R ? R->buf : (uint32_t)L->buf_of[st->out];
  tmap memo = NF_PTRMAP_INIT;
  const nf_expr *rhs = translate(L, st->rhs, n.orig, n.n_orig, &memo, 0);
  tmap_free(&memo);
  rhs = simp(L, rhs);
  if (rhs && st->red == NF_RED_SUM) rhs = hoist_select(L, rhs);
  if (!rhs) return lerr(L, L->oom || nf_ir_ctx_oom(L->ctx) ? NF_ENOMEM : NF_ELIMIT, si,
                        "cannot translate the right-hand side");
  attach at[MAX_ATTACH];
  int nat = 0;
  if ((rc = attach_all(L, s, si, &n, &rhs, at, &nat, reassoc)) < 0) return rc;
  int rank = t->rank;
  /* the store index: the output's own, or the region's local one */
  const nf_expr *oidx[NF_MAX_RANK];
  for (int d = 0; d < rank; d++)
    if (!(oidx[d] = R ? simp(L, bin(L, NF_OP_SUB, n.orig[d], R->start[d])) : n.orig[d]))
      return NF_ENOMEM;
  const nf_expr *idv = st->red != NF_RED_NONE ? identity(L, st->red, (nf_dtype)t->dtype) : NULL;
  int c = cw_pos(&n);
  if (c < 0) {
    nf_lstmt *main = build_at(L, n.l, n.n, n.guard, n.ng, at, nat,
                              store(L, ob, rank, oidx, rhs, st->red));
    if (!main) return NF_ENOMEM;
    if (st->red == NF_RED_NONE) {
      *out = main;
      return NF_OK;
    }
    /* identity first, over the whole output (or region) */
    nf_lstmt *items[2] = {identity_nest(L, st, R, ob, idv), main};
    *out = seq(L, items, 2);
    return *out ? NF_OK : NF_ENOMEM;
  }
  /* cache_write at loop c: the tile */
  const nf_expr *tin[NF_MAX_RANK], *tidx[NF_MAX_RANK];
  int64_t tshape[NF_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    nf_range r;
    const nf_expr *tout;
    if (!split_at(L, &n, c, oidx[d], &tout, &tin[d]) ||
        !nf_expr_bounds(tin[d], L->vr, (int)L->nv, &r))
      return lerr(L, NF_EINVAL, si, "cache_write: output index %d mixes loops inside and outside '%s'",
                  d, n.cw_name);
    /* the bounding box, or a compact tile where the box has gaps */
    if (!tile_dim(L, &n, c, tin[d], &tshape[d], &tidx[d])) return NF_ENOMEM;
  }
  /* rfactor: one more dimension, a slot per iteration of the rfactor
   * loop (checked by nest_finish: inside c, rank < NF_MAX_RANK) */
  int rf = rf_pos(&n);
  int64_t rf_ext = rf >= 0 ? n.l[rf].ext : 0;
  /* The tile's layout: the output's order, except that the dimension the
   * vector loop indexes goes last when it is the only one it indexes
   * (a tile vectorized over output channels, O_tile[w][k]: its rows are
   * whole vectors, which stay in registers) */
  int perm[NF_MAX_RANK], permuted = 0;
  if (rf < 0) {
    int vd = -1, nvd = 0;
    for (int i = c + 1; i < n.n; i++)
      if (n.l[i].kind == NF_LOOP_VECTOR)
        for (int d = 0; d < rank; d++)
          if (uses_var(tidx[d], n.l[i].var)) vd = d, nvd++;
    if (nvd == 1 && vd != rank - 1) {
      int k = 0;
      for (int d = 0; d < rank; d++)
        if (d != vd) perm[k++] = d;
      perm[k] = vd;
      permuted = 1;
      int64_t ps[NF_MAX_RANK];
      for (int d = 0; d < rank; d++) ps[d] = tshape[perm[d]];
      memcpy(tshape, ps, (size_t)rank * sizeof ps[0]);
    }
  }
  if (rf >= 0) tshape[rank] = rf_ext;
  char tname[NF_SCHED_NAME + 16];
  snprintf(tname, sizeof tname, "%s_tile", t->name ? t->name : "t");
  int tb = add_buf(L, tname, t->dtype, NF_BUF_TEMP, rank + (rf >= 0), tshape, -1);
  if (tb < 0) return NF_ENOMEM;
  wb_ctx w = {.tile = (uint32_t)tb, .out = ob, .rank = rank, .orig = oidx, .n = &n, .c = c,
              .idv = idv, .rf_ext = rf_ext, .red = st->red, .perm = permuted ? perm : NULL};
  /* init: the identity, or (reduction loops outside the tile: the tile
   * continues the output's partial sums) the output's current values */
  int red_out = 0;
  for (int i = 0; i <= c; i++) red_out |= n.l[i].red;
  w.red_out = red_out && rf >= 0;
  const nf_expr *both[2 * NF_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    both[d] = tidx[d];
    both[rank + d] = oidx[d];
  }
  nf_lstmt *init = red_out ? replica(L, &n, c, load_payload, &w, both, 2 * rank)
                           : replica(L, &n, c, init_payload, &w, tidx, rank);
  /* accumulate */
  const nf_expr *ig[MAX_GUARDS], *og[MAX_GUARDS];
  uint8_t igb[MAX_GUARDS];
  int nig = 0, nog = 0;
  for (int k = 0; k < n.ng; k++) {
    int inner = 0;
    for (int i = c + 1; i < n.n; i++) inner |= uses_var(n.guard[k], n.l[i].var);
    if (inner) {
      igb[nig] = n.gbound[k];
      ig[nig++] = n.guard[k];
    } else
      og[nog++] = n.guard[k];
  }
  /* Bound guards of spatial loops inside the tile (a split of a whole
   * variable that does not divide: the tile's last rows fall outside the
   * output) are dropped from the accumulation: the rows outside have tile
   * slots of their own, which are never written back (the write-back
   * keeps its guards), and the reads they make are clamped into their
   * buffers.  The register tile then has no branch between its rows.
   * Guards of intermediate splits (their points would alias valid tile
   * slots), guards on reduction or vector loops, and every guard inside
   * a compute_at region or of a tile with fewer slots than points stay. */
  uint32_t dropv[MAX_LOOPS];
  int ndrop = 0, nkeep = 0;
  /* only outside regions, and only when the tile has one slot per point
   * of the spatial loops inside c (then no two points share a slot) */
  int64_t slots = 1, points = 1;
  for (int d = 0; d < rank; d++) slots *= tshape[d];
  for (int i = c + 1; i < n.n; i++)
    if (!n.l[i].red) points *= n.l[i].ext;
  int may_drop = !R && slots == points;
  for (int k = 0; k < nig; k++) {
    int keep = !igb[k] || !may_drop;
    for (int i = 0; i < n.n; i++)
      if ((n.l[i].red || n.l[i].kind == NF_LOOP_VECTOR) && uses_var(ig[k], n.l[i].var)) keep = 1;
    if (keep) {
      ig[nkeep++] = ig[k];
      continue;
    }
    for (int i = c + 1; i < n.n; i++)
      if (uses_var(ig[k], n.l[i].var) && ndrop < MAX_LOOPS) dropv[ndrop++] = n.l[i].var;
  }
  nig = nkeep;
  const nf_expr *arhs = ndrop ? clamp_reads(L, rhs, dropv, ndrop) : rhs;
  if (!arhs) return NF_ENOMEM;
  const nf_expr *aidx[NF_MAX_RANK];
  tile_index(&w, tidx, rf >= 0 ? var(L, n.l[rf].var) : NULL, aidx);
  nf_lstmt *acc = build_at(L, &n.l[c + 1], n.n - c - 1, ig, nig, at, nat,
                           store(L, (uint32_t)tb, rank + (rf >= 0), aidx, arhs, st->red));
  /* write back: out[oidx] = tile[tidx] over the same replica loops; oidx
   * is rewritten like tidx, so both go through one replica */
  nf_lstmt *wb = replica(L, &n, c, wb_payload, &w, both, 2 * rank);
  if (!init || !acc || !wb) return L->oom ? NF_ENOMEM : NF_EINTERNAL;
  nf_lstmt *items[3] = {init, acc, wb};
  nf_lstmt *al = wrap1(L, NF_LS_ALLOC, seq(L, items, 3));
  if (!al) return NF_ENOMEM;
  al->buf = (uint32_t)tb;
  *out = build_at(L, n.l, c + 1, og, nog, at, nat, al);
  if (*out && red_out) {
    nf_lstmt *two[2] = {identity_nest(L, st, R, ob, idv), *out};
    *out = two[0] ? seq(L, two, 2) : NULL;
  }
  return *out ? NF_OK : NF_ENOMEM;
}

/* ---- whole graphs ---- */

typedef struct rb_ctx {
  uint32_t b;
  int hit;
} rb_ctx;

static void rb_fn(const nf_expr *e, void *user) {
  rb_ctx *r = user;
  if (e->op == NF_OP_ACCESS && e->u.tensor == r->b) r->hit = 1;
}

/* Whether any expression in s accesses buffer b (1 also when out of memory). */
static int reads_buf(const nf_lstmt *s, uint32_t b) {
  rb_ctx r = {.b = b, .hit = 0};
  if (!s) return 0;
  if (s->kind == NF_LS_STORE) {
    if (nf_expr_visit(s->value, rb_fn, &r) < 0) return 1;
    for (int d = 0; d < s->n_idx; d++)
      if (nf_expr_visit(s->idx[d], rb_fn, &r) < 0) return 1;
  }
  if (s->kind == NF_LS_IF && nf_expr_visit(s->cond, rb_fn, &r) < 0) return 1;
  if (r.hit) return 1;
  for (int i = 0; i < s->n_body; i++)
    if (reads_buf(s->body[i], b)) return 1;
  return 0;
}

static void lw_free(lw *L) {
  free(L->vr);
  free(L->buf_of);
  free(L->stmt_of);
  free(L->inlined);
  free(L->at_of);
}

/* Sets up buffers, inlining and checks that s fits g. */
static int lw_init(lw *L, const nf_graph *g, const nf_schedule *s, nf_ir_ctx *ctx, nf_buf *err) {
  memset(L, 0, sizeof *L);
  L->g = g;
  L->ctx = ctx;
  L->arena = nf_ir_ctx_arena(ctx);
  L->err = err;
  L->buf_of = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *L->buf_of);
  L->stmt_of = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *L->stmt_of);
  L->inlined = calloc(g->n_stmts ? g->n_stmts : 1, 1);
  L->at_of = malloc((g->n_stmts ? g->n_stmts : 1) * sizeof *L->at_of);
  L->s = s;
  if (!L->buf_of || !L->stmt_of || !L->inlined || !L->at_of) return NF_ENOMEM;
  for (uint32_t i = 0; i < g->n_stmts; i++) L->at_of[i] = -1;
  for (uint32_t t = 0; t < g->n_tensors; t++) L->buf_of[t] = L->stmt_of[t] = -1;
  for (uint32_t i = 0; i < g->n_stmts; i++) L->stmt_of[g->stmts[i].out] = (int32_t)i;
  if (s && s->version != NF_SCHEDULE_VERSION)
    return lerr(L, NF_EINVAL, -1, "schedule version %d, want %d", s->version,
                NF_SCHEDULE_VERSION);
  if (s && s->n_stmts >= 0 && s->n_stmts != (int64_t)g->n_stmts)
    return lerr(L, NF_EINVAL, -1, "schedule is for a graph of %lld statements, this one has %u",
                (long long)s->n_stmts, g->n_stmts);
  for (int k = 0; s && k < s->n_items; k++) {
    const nf_sched_item *it = &s->items[k];
    int si, rc;
    if ((rc = resolve_stmt(L, it->stmt, it->stmt_name, &si)) < 0) return rc;
    if (it->kind >= NF_SCH_N_KINDS) return lerr(L, NF_EINVAL, si, "unknown primitive");
    if (it->kind != NF_SCH_INLINE) continue;
    const nf_stmt *st = &g->stmts[si];
    if (st->red != NF_RED_NONE || st->n_red)
      return lerr(L, NF_EINVAL, si, "compute_inline: statement is a reduction");
    if (g->tensors[st->out].kind != NF_T_LOCAL)
      return lerr(L, NF_EINVAL, si, "compute_inline: '%s' is a graph output",
                  g->tensors[st->out].name ? g->tensors[st->out].name : "?");
    L->inlined[si] = 1;
  }
  for (int k = 0; s && k < s->n_items; k++) {
    const nf_sched_item *it = &s->items[k];
    int si, ci, rc;
    resolve_stmt(L, it->stmt, it->stmt_name, &si);
    if (L->inlined[si] && it->kind != NF_SCH_INLINE)
      return lerr(L, NF_EINVAL, si, "statement is inlined: it has no loops to schedule");
    if (it->kind != NF_SCH_COMPUTE_AT) continue;
    if ((rc = resolve_stmt(L, it->stmt2, it->stmt2_name, &ci)) < 0) return rc;
    const nf_tensor *pt = &g->tensors[g->stmts[si].out];
    if (pt->kind != NF_T_LOCAL)
      return lerr(L, NF_EINVAL, si, "compute_at: '%s' is a graph output (it must be stored whole)",
                  pt->name ? pt->name : "?");
    if (ci <= si)
      return lerr(L, NF_EINVAL, si,
                  "compute_at: statement %d does not come after this one (it cannot consume it)",
                  ci);
    if (L->inlined[ci])
      return lerr(L, NF_EINVAL, si, "compute_at: statement %d is inlined (it has no loops)", ci);
    if (L->at_of[si] >= 0) return lerr(L, NF_EINVAL, si, "compute_at given twice");
    L->at_of[si] = k;
  }
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    int b = add_buf(L, t->name, t->dtype, NF_BUF_INPUT, t->rank, t->shape, (int32_t)k);
    if (b < 0 || L->oom) return NF_ENOMEM;
    L->buf_of[g->inputs[k]] = b;
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const nf_tensor *t = &g->tensors[g->outputs[k]];
    if (L->buf_of[g->outputs[k]] >= 0 || L->stmt_of[g->outputs[k]] < 0)
      return lerr(L, NF_EUNSUPPORTED, -1, "output '%s' is an input or listed twice",
                  t->name ? t->name : "?");
    int b = add_buf(L, t->name, t->dtype, NF_BUF_OUTPUT, t->rank, t->shape,
                    (int32_t)(g->n_inputs + k));
    if (b < 0 || L->oom) return NF_ENOMEM;
    L->buf_of[g->outputs[k]] = b;
  }
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    uint32_t o = g->stmts[i].out;
    const nf_tensor *t = &g->tensors[o];
    if (L->buf_of[o] >= 0 || L->inlined[i]) continue;
    int b = add_buf(L, t->name, t->dtype, NF_BUF_TEMP, t->rank, t->shape, -1);
    if (b < 0 || L->oom) return NF_ENOMEM;
    L->buf_of[o] = b;
  }
  return NF_OK;
}

/* ---- index-set splitting ----
 *
 * A loop whose body selects by comparisons that, over the loop's range,
 * switch from always false to always true at a constant iteration (a
 * gradient that sums one select per chunk of a gate vector: `g - 1024 >=
 * 0 ? .. : 0`, or `t == 0 ? .. : 0`) is cut there into consecutive loops,
 * each over its part of the range, whose bodies are simplified with the
 * narrower range: the comparisons become constants and the selects'
 * untaken arms vanish (dpre of MI-LSTM evaluated all four chunks' sigmoid
 * and tanh per element).  Only loops whose body holds no ALLOC (a tile)
 * are cut, at most PART_MAX pieces; vector and unrolled loops are not. */
#define PART_MAX 8

typedef struct cuts {
  lw *L;
  uint32_t x;
  int64_t ext;
  int n, full;
  int64_t at[PART_MAX];
} cuts;

static void add_cut(cuts *c, int64_t b) {
  if (b <= 0 || b >= c->ext) return;
  for (int i = 0; i < c->n; i++)
    if (c->at[i] == b) return;
  if (c->n == PART_MAX - 1) {
    c->full = 1;
    return;
  }
  c->at[c->n++] = b;
}

/* ceil(a / b) for b > 0 */
static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

static void cut_fn(const nf_expr *e, void *user) {
  cuts *c = user;
  lw *L = c->L;
  nf_op op = (nf_op)e->op;
  if (op < NF_OP_LT || op > NF_OP_NE || e->n_args != 2 ||
      !nf_dtype_is_int((nf_dtype)e->args[0]->dtype) || !uses_var(e, c->x))
    return;
  /* e is g OP 0 with g = alpha x + beta, beta free of x */
  const nf_expr *gx = simp(L, bin(L, NF_OP_SUB, e->args[0], e->args[1]));
  const nf_expr *g1 = gx ? simp(L, subst(L, gx, c->x, bin(L, NF_OP_ADD, var(L, c->x), ci(L, 1))))
                         : NULL;
  const nf_expr *al = g1 ? simp(L, bin(L, NF_OP_SUB, g1, gx)) : NULL;
  const nf_expr *beta = gx ? simp(L, subst(L, gx, c->x, ci(L, 0))) : NULL;
  nf_range r;
  if (!al || !beta || al->op != NF_OP_CONST || al->u.i == 0 || uses_var(beta, c->x) ||
      !nf_expr_bounds(beta, L->vr, (int)L->nv, &r))
    return;
  int64_t a = al->u.i, lo = r.lo, hi = r.hi;
  if (lo < -(INT64_C(1) << 40) || hi > (INT64_C(1) << 40) || a < -(INT64_C(1) << 20) ||
      a > (INT64_C(1) << 20))
    return;
  if (op == NF_OP_EQ || op == NF_OP_NE) { /* true at one x at most */
    if (lo != hi || (-lo) % a != 0) return;
    add_cut(c, -lo / a);
    add_cut(c, -lo / a + 1);
    return;
  }
  if (a < 0) { /* g OP 0  <=>  -g OP' 0 */
    int64_t t = lo;
    a = -a;
    lo = -hi;
    hi = -t;
    op = op == NF_OP_LT ? NF_OP_GT : op == NF_OP_LE ? NF_OP_GE : op == NF_OP_GT ? NF_OP_LT
                                                                              : NF_OP_LE;
  }
  if (op == NF_OP_GT || op == NF_OP_LE) { /* g > 0  <=>  g - 1 >= 0 */
    lo -= 1;
    hi -= 1;
  }
  /* a x + beta >= 0 is false for every beta below F and true for every
   * beta from T on; one cut where they meet */
  int64_t F = ceil_div(-hi, a), T = ceil_div(-lo, a);
  if (F == T) add_cut(c, T);
}

static int collect_cuts(const nf_lstmt *s, cuts *c) {
  if (s->kind == NF_LS_ALLOC) return 0;
  if (s->kind == NF_LS_STORE && nf_expr_visit(s->value, cut_fn, c) < 0) c->L->oom = 1;
  for (int i = 0; i < s->n_body; i++)
    if (!collect_cuts(s->body[i], c)) return 0;
  return 1;
}

typedef struct vmap {
  int n;
  uint32_t from[MAX_LOOPS + 1];
  const nf_expr *to[MAX_LOOPS + 1];
} vmap;

static const nf_expr *map_expr(lw *L, const nf_expr *e, const vmap *m) {
  for (int i = 0; i < m->n && e; i++) e = subst(L, e, m->from[i], m->to[i]);
  return simp(L, e);
}

/* A copy of s with m's variables substituted, each loop over a fresh
 * variable, expressions simplified. */
static nf_lstmt *copy_mapped(lw *L, const nf_lstmt *s, vmap *m) {
  nf_lstmt *c = mk(L, s->kind, s->n_body);
  if (!c) return NULL;
  int pushed = 0;
  switch (s->kind) {
  case NF_LS_LOOP:
    if (m->n == MAX_LOOPS + 1) {
      L->oom = 1;
      return NULL;
    }
    c->var = new_var(L, s->extent);
    c->extent = s->extent;
    c->loop_kind = s->loop_kind;
    c->var_name = s->var_name;
    m->from[m->n] = s->var;
    m->to[m->n++] = var(L, c->var);
    pushed = 1;
    break;
  case NF_LS_STORE:
    c->buf = s->buf;
    c->n_idx = s->n_idx;
    c->op = s->op;
    for (int d = 0; d < s->n_idx; d++)
      if (!(c->idx[d] = map_expr(L, s->idx[d], m))) return NULL;
    if (!(c->value = map_expr(L, s->value, m))) return NULL;
    break;
  case NF_LS_IF:
    if (!(c->cond = map_expr(L, s->cond, m))) return NULL;
    break;
  case NF_LS_ALLOC:
    c->buf = s->buf;
    break;
  default:
    break;
  }
  for (int i = 0; i < s->n_body; i++)
    if (!(c->body[i] = copy_mapped(L, s->body[i], m))) return NULL;
  if (pushed) m->n--;
  return c;
}

/* s with its loops cut where their bodies' selects switch (above);
 * NULL when out of memory. */
static nf_lstmt *split_index_sets(lw *L, nf_lstmt *s) {
  if (s->kind == NF_LS_LOOP &&
      (s->loop_kind == NF_LOOP_SERIAL || s->loop_kind == NF_LOOP_PARALLEL) && s->extent > 1) {
    cuts c = {.L = L, .x = s->var, .ext = s->extent};
    int ok = 1;
    for (int i = 0; i < s->n_body && ok; i++) ok = collect_cuts(s->body[i], &c);
    if (L->oom) return NULL;
    if (ok && c.n > 0 && !c.full) {
      for (int i = 1; i < c.n; i++) /* sort the cuts */
        for (int j = i; j > 0 && c.at[j - 1] > c.at[j]; j--) {
          int64_t t = c.at[j];
          c.at[j] = c.at[j - 1];
          c.at[j - 1] = t;
        }
      nf_lstmt *pieces[PART_MAX];
      for (int p = 0; p <= c.n; p++) {
        int64_t a = p == 0 ? 0 : c.at[p - 1], b = p == c.n ? s->extent : c.at[p];
        nf_lstmt *lp = mk(L, NF_LS_LOOP, s->n_body);
        if (!lp) return NULL;
        lp->var = new_var(L, b - a);
        lp->extent = b - a;
        lp->loop_kind = s->loop_kind;
        lp->var_name = s->var_name;
        vmap m = {.n = 1};
        m.from[0] = s->var;
        m.to[0] = bin(L, NF_OP_ADD, var(L, lp->var), ci(L, a));
        for (int i = 0; i < s->n_body; i++)
          if (!m.to[0] || !(lp->body[i] = copy_mapped(L, s->body[i], &m))) return NULL;
        pieces[p] = lp;
      }
      for (int p = 0; p <= c.n; p++)
        for (int i = 0; i < pieces[p]->n_body; i++)
          if (!(pieces[p]->body[i] = split_index_sets(L, pieces[p]->body[i]))) return NULL;
      return seq(L, pieces, c.n + 1);
    }
  }
  if (s->kind == NF_LS_LOOP && s->loop_kind == NF_LOOP_VECTOR) return s;
  for (int i = 0; i < s->n_body; i++)
    if (!(s->body[i] = split_index_sets(L, s->body[i]))) return NULL;
  return s;
}

int nf_lower_ex(const nf_graph *g, const nf_schedule *s, nf_ir_ctx *ctx, nf_lprog **out,
                nf_lower_info *info, nf_buf *err) {
  lw L;
  nf_schedule *def = NULL;
  int rc, reassoc = 0;
  *out = NULL;
  if (info) memset(info, 0, sizeof *info);
  if (!s) {
    if ((rc = nf_schedule_default(g, &def)) < 0) return rc;
    s = def;
  }
  rc = lw_init(&L, g, s, ctx, err);
  uint32_t n_temps_graph = L.nb;
  nf_lstmt **items = NULL;
  int n_items = 0;
  if (rc == NF_OK) {
    items = calloc(g->n_stmts ? g->n_stmts : 1, sizeof *items);
    if (!items) rc = NF_ENOMEM;
  }
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    if (L.inlined[i] || L.at_of[i] >= 0) continue;
    rc = lower_stmt(&L, s, (int)i, NULL, &items[n_items], &reassoc);
    if (rc == NF_OK && !(items[n_items] = split_index_sets(&L, items[n_items]))) rc = NF_ENOMEM;
    if (rc == NF_OK) n_items++;
  }
  /* a statement computed at a consumer's loop must have no other reader */
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    if (L.at_of[i] < 0) continue;
    int32_t vb = L.buf_of[g->stmts[i].out];
    for (int k = 0; k < n_items && rc == NF_OK; k++)
      if (reads_buf(items[k], (uint32_t)vb))
        rc = lerr(&L, NF_EINVAL, (int)i,
                  "compute_at: '%s' is also read outside the loop '%s' it is computed at",
                  L.bufs[vb].name, s->items[L.at_of[i]].names[0]);
  }
  if (rc == NF_OK && (L.oom || nf_ir_ctx_oom(ctx))) rc = NF_ENOMEM;
  nf_lstmt *root = NULL;
  if (rc == NF_OK) {
    nf_lstmt *body = seq(&L, items, n_items);
    /* graph temporaries live for the whole program */
    for (uint32_t b = n_temps_graph; b-- > 0 && body;) {
      if (L.bufs[b].kind != NF_BUF_TEMP) continue;
      int virt = 0; /* the whole buffer of a statement computed at a loop */
      for (uint32_t i = 0; i < g->n_stmts; i++)
        if (L.at_of[i] >= 0 && L.buf_of[g->stmts[i].out] == (int32_t)b) virt = 1;
      if (virt) continue;
      body = wrap1(&L, NF_LS_ALLOC, body);
      if (body) body->buf = b;
    }
    root = body && body->kind == NF_LS_SEQ ? body : (body ? seq(&L, &body, 1) : NULL);
    if (!root) rc = NF_ENOMEM;
  }
  nf_lprog *p = NULL;
  if (rc == NF_OK) {
    p = nf_arena_alloc(L.arena, sizeof *p);
    if (!p) rc = NF_ENOMEM;
  }
  if (rc == NF_OK) {
    p->ctx = ctx;
    p->name = dup_name(&L, g->name ? g->name : "kernel");
    p->n_bufs = L.nb;
    p->n_args = g->n_inputs + g->n_outputs;
    p->n_vars = L.nv;
    p->bufs = L.bufs;
    p->root = root;
    if (L.oom) rc = NF_ENOMEM;
  }
  free(items);
  lw_free(&L);
  nf_schedule_free(def);
  if (rc < 0) return rc;
  /* a schedule whose bounds the checker cannot prove is rejected, never
   * handed to a backend */
  if ((rc = nf__loop_validate(p, err)) < 0) {
    nf_buf_puts(err, " (the schedule's index bounds cannot be proven)");
    return rc;
  }
  if (info) info->reassociated = reassoc;
  *out = p;
  return NF_OK;
}

int nf_lower(const nf_graph *g, const nf_schedule *s, nf_ir_ctx *ctx, nf_lprog **out,
             nf_buf *err) {
  return nf_lower_ex(g, s, ctx, out, NULL, err);
}

/* ---- random schedules ---- */

static uint64_t rnd(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int64_t rnd_in(uint64_t *s, int64_t lo, int64_t hi) { /* inclusive */
  return lo + (int64_t)(rnd(s) % (uint64_t)(hi - lo + 1));
}

/* Whether the nest of si under s is legal; fills *n. */
static int try_nest(lw *L, const nf_schedule *s, int si, nest *n) {
  nf_buf_reset(L->err);
  return stmt_nest(L, s, si, NULL, n) == NF_OK;
}

/* Up to 16 distinct tensors a statement reads directly. */
typedef struct use_list {
  int n;
  uint32_t t[16];
} use_list;

static void use_fn(const nf_expr *e, void *user) {
  use_list *u = user;
  if (e->op != NF_OP_ACCESS || u->n == 16) return;
  for (int k = 0; k < u->n; k++)
    if (u->t[k] == e->u.tensor) return;
  u->t[u->n++] = e->u.tensor;
}

int nf_schedule_random(const nf_graph *g, uint64_t seed, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  lw L;
  int rc = NF_OK;
  uint64_t rs = seed ^ 0x5eed5eed5eedull;
  *out = NULL;
  if (!s || !ctx) rc = NF_ENOMEM;
  if (rc == NF_OK) s->n_stmts = g->n_stmts;
  /* inlining first: elementwise local producers, at random */
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    const nf_stmt *st = &g->stmts[i];
    if (st->red != NF_RED_NONE || st->n_red || g->tensors[st->out].kind != NF_T_LOCAL) continue;
    if (rnd(&rs) % 2) continue;
    nf_sched_item it;
    memset(&it, 0, sizeof it);
    it.kind = NF_SCH_INLINE;
    it.stmt = (int32_t)i;
    rc = nf_schedule_add(s, &it);
  }
  if (rc == NF_OK) rc = lw_init(&L, g, s, ctx, &err);
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    if (L.inlined[i]) continue;
    nest n;
    if (!try_nest(&L, s, (int)i, &n)) {
      rc = NF_EINTERNAL;
      break;
    }
    int tries = (int)rnd_in(&rs, 0, 8);
    for (int k = 0; k < tries && rc == NF_OK; k++) {
      nf_sched_item it;
      memset(&it, 0, sizeof it);
      it.stmt = (int32_t)i;
      int r = (int)(rnd(&rs) % 10);
      const lloop *lp = &n.l[rnd(&rs) % (uint64_t)(n.n ? n.n : 1)];
      if (n.n == 0) break;
      it.n_names = 1;
      switch (r) {
      case 0: case 1: case 2:
        it.kind = NF_SCH_SPLIT;
        memcpy(it.names[0], lp->name, NF_SCHED_NAME);
        it.factor = rnd_in(&rs, 1, lp->ext > 1 ? (lp->ext < 17 ? lp->ext : 17) : 2);
        break;
      case 3: {
        it.kind = NF_SCH_REORDER;
        int perm[MAX_LOOPS];
        int m = n.n < NF_SCHED_MAX_NAMES ? n.n : NF_SCHED_MAX_NAMES;
        for (int a = 0; a < m; a++) perm[a] = a;
        for (int a = m - 1; a > 0; a--) {
          int b = (int)(rnd(&rs) % (uint64_t)(a + 1)), t = perm[a];
          perm[a] = perm[b];
          perm[b] = t;
        }
        it.n_names = m;
        for (int a = 0; a < m; a++) memcpy(it.names[a], n.l[perm[a]].name, NF_SCHED_NAME);
        break;
      }
      case 4: {
        int p = (int)(rnd(&rs) % (uint64_t)n.n);
        if (p + 1 >= n.n) continue;
        it.kind = NF_SCH_FUSE;
        it.n_names = 2;
        memcpy(it.names[0], n.l[p].name, NF_SCHED_NAME);
        memcpy(it.names[1], n.l[p + 1].name, NF_SCHED_NAME);
        break;
      }
      case 5:
        it.kind = NF_SCH_PARALLEL;
        memcpy(it.names[0], n.l[0].name, NF_SCHED_NAME);
        break;
      case 6:
        it.kind = NF_SCH_VECTORIZE;
        memcpy(it.names[0], n.l[n.n - 1].name, NF_SCHED_NAME);
        break;
      case 7:
        it.kind = NF_SCH_UNROLL;
        memcpy(it.names[0], lp->name, NF_SCHED_NAME);
        break;
      default:
        if (g->stmts[i].red == NF_RED_NONE) continue;
        it.kind = NF_SCH_CACHE_WRITE;
        memcpy(it.names[0], lp->name, NF_SCHED_NAME);
        break;
      }
      if ((rc = nf_schedule_add(s, &it)) < 0) break;
      nest m;
      if (try_nest(&L, s, (int)i, &m))
        n = m;
      else
        s->n_items--;
      if (L.oom || nf_ir_ctx_oom(ctx)) rc = NF_ENOMEM;
    }
  }
  /* whole-program check: drop primitives from the end until the program
   * lowers and validates (bounds the checker cannot prove) */
  while (rc == NF_OK) {
    nf_lprog *p;
    nf_buf_reset(&err);
    int lr = nf_lower(g, s, ctx, &p, &err);
    if (lr == NF_OK) break;
    if (lr == NF_ENOMEM || s->n_items == 0) {
      rc = lr == NF_ENOMEM ? NF_ENOMEM : NF_EINTERNAL;
      break;
    }
    s->n_items--;
  }
  /* rfactor (from a stream of its own: the primitives above do not
   * change with it): a reduction loop inside a statement's cache_write
   * keeps partial results per iteration, vectorized when innermost and
   * short enough, each kept only if the whole program still lowers */
  uint64_t rr = seed ^ 0x2fac7025eedull;
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    nest n;
    if (L.inlined[i] || g->stmts[i].red == NF_RED_NONE || rnd(&rr) % 3 != 0) continue;
    if (!try_nest(&L, s, (int)i, &n)) continue;
    int c = cw_pos(&n), cand[MAX_LOOPS], nc = 0;
    for (int q = c + 1; c >= 0 && q < n.n; q++)
      if (n.l[q].red) cand[nc++] = q;
    if (nc == 0) continue;
    int q = cand[rnd(&rr) % (uint64_t)nc];
    nf_sched_item it;
    memset(&it, 0, sizeof it);
    it.stmt = (int32_t)i;
    it.kind = NF_SCH_RFACTOR;
    it.n_names = 1;
    memcpy(it.names[0], n.l[q].name, NF_SCHED_NAME);
    int added = 1;
    if ((rc = nf_schedule_add(s, &it)) < 0) break;
    if (q == n.n - 1 && n.l[q].ext >= 2 && n.l[q].ext <= 64 && rnd(&rr) % 2) {
      it.kind = NF_SCH_VECTORIZE;
      if ((rc = nf_schedule_add(s, &it)) < 0) break;
      added = 2;
    }
    nf_lprog *p;
    nf_buf_reset(&err);
    int lr = nf_lower(g, s, ctx, &p, &err);
    if (lr == NF_ENOMEM) rc = NF_ENOMEM;
    if (lr != NF_OK) s->n_items -= added;
  }
  /* compute_at and cache_read at random loops, each kept only if the whole
   * program still lowers */
  for (uint32_t i = 0; rc == NF_OK && i < g->n_stmts; i++) {
    if (L.inlined[i]) continue;
    for (int kind = 0; kind < 2 && rc == NF_OK; kind++) {
      if (rnd(&rs) % 3 == 0) continue;
      nf_sched_item it;
      memset(&it, 0, sizeof it);
      int cons = (int)i;
      if (kind == 0) { /* compute statement i at a later statement's loop */
        if (g->tensors[g->stmts[i].out].kind != NF_T_LOCAL || i + 1 >= g->n_stmts) continue;
        /* prefer a statement that reads it directly */
        int readers[16], nr = 0;
        for (uint32_t j = i + 1; j < g->n_stmts && nr < 16; j++) {
          use_list u = {0};
          nf_expr_visit(g->stmts[j].rhs, use_fn, &u);
          for (int q = 0; q < u.n; q++)
            if (u.t[q] == g->stmts[i].out && !L.inlined[j]) readers[nr++] = (int)j;
        }
        cons = nr ? readers[rnd(&rs) % (uint64_t)nr] : (int)rnd_in(&rs, i + 1, g->n_stmts - 1);
        if (L.inlined[cons]) continue;
        it.kind = NF_SCH_COMPUTE_AT;
        it.stmt = (int32_t)i;
        it.stmt2 = cons;
      } else { /* cache_read of a tensor statement i reads */
        const nf_stmt *st = &g->stmts[i];
        use_list u = {0};
        nf_expr_visit(st->rhs, use_fn, &u);
        if (u.n == 0) continue;
        uint32_t t = u.t[rnd(&rs) % (uint64_t)u.n];
        const char *tn = g->tensors[t].name;
        if (!tn || strlen(tn) >= NF_SCHED_NAME || strspn(tn, NAME_CHARS) != strlen(tn)) continue;
        it.kind = NF_SCH_CACHE_READ;
        it.stmt = (int32_t)i;
        memcpy(it.names[1], g->tensors[t].name, strlen(g->tensors[t].name) + 1);
      }
      nest cn;
      if (!try_nest(&L, s, cons, &cn) || cn.n == 0) continue;
      memcpy(it.names[0], cn.l[rnd(&rs) % (uint64_t)cn.n].name, NF_SCHED_NAME);
      it.n_names = kind == 0 ? 1 : 2;
      if ((rc = nf_schedule_add(s, &it)) < 0) break;
      nf_lprog *p;
      nf_buf_reset(&err);
      int lr = nf_lower(g, s, ctx, &p, &err);
      if (lr == NF_ENOMEM) rc = NF_ENOMEM;
      if (lr != NF_OK) s->n_items--;
    }
  }
  if (ctx) lw_free(&L);
  nf_ir_ctx_free(ctx);
  nf_buf_free(&err);
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}

/* ---- the default schedules, checked by lowering ---- */

/* The CPU default; where a stencil, weight-gradient or padded-plane
 * schedule was chosen the whole program is lowered once (a lowering more
 * per default of such a graph), and the plain schedules are taken
 * instead if that fails (a shape the pattern tests let through but the
 * cache_read region cannot hold). */
int nf_schedule_default_for(const nf_graph *g, const nf_sched_target *t, nf_schedule **out) {
  int n_stencil = 0;
  int rc = nf__sched_default_plain(g, t, 1, &n_stencil, out);
  if (rc < 0 || n_stencil == 0) return rc;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  int lr = ctx ? nf_lower(g, *out, ctx, &p, &err) : NF_ENOMEM;
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  if (lr == NF_OK) return NF_OK;
  nf_schedule_free(*out);
  *out = NULL;
  if (lr == NF_ENOMEM) return lr;
  return nf__sched_default_plain(g, t, 0, &n_stencil, out);
}

int nf_schedule_default(const nf_graph *g, nf_schedule **out) {
  nf_sched_target t = nf_sched_target_host();
  return nf_schedule_default_for(g, &t, out);
}

/* The CUDA backend's static shared memory per block (nf_cuda.h). */
#define NF_GPU_SHARED_BUDGET (48 << 10)

/* The shared memory statement s's launch would declare: its temporaries
 * inside block loops and outside thread loops, summed (the backend's
 * placement: static per kernel, 256-byte slices). */
static uint64_t launch_shared(const nf_lprog *p, const nf_lstmt *s, int in_block, int in_thread) {
  uint64_t sum = 0;
  if (s->kind == NF_LS_LOOP) {
    in_block |= s->loop_kind == NF_LOOP_BLOCK;
    in_thread |= s->loop_kind == NF_LOOP_THREAD;
  }
  if (s->kind == NF_LS_ALLOC && in_block && !in_thread && s->buf < p->n_bufs) {
    const nf_lbuf *b = &p->bufs[s->buf];
    uint64_t n = nf_dtype_size((nf_dtype)b->dtype);
    for (int d = 0; d < b->rank; d++) n *= (uint64_t)(b->shape[d] > 0 ? b->shape[d] : 1);
    sum = (n + 255) & ~(uint64_t)255;
  }
  for (int i = 0; i < s->n_body; i++) sum += launch_shared(p, s->body[i], in_block, in_thread);
  return sum;
}

/* The most shared memory any launch of p would declare (top-level
 * statements are launches; top-level temporaries are global). */
static uint64_t block_shared(const nf_lprog *p, const nf_lstmt *s) {
  if (s->kind != NF_LS_SEQ && s->kind != NF_LS_ALLOC) return launch_shared(p, s, 0, 0);
  uint64_t m = 0;
  for (int i = 0; i < s->n_body; i++) {
    uint64_t k = block_shared(p, s->body[i]);
    m = k > m ? k : m;
  }
  return m;
}

/* The GPU default; where the shared-memory tiles were chosen the program
 * is lowered once more to check it, and the one-thread-per-output
 * schedules are taken when it does not lower (a staged region over the
 * limit, a read the region inference cannot bound). */
int nf_schedule_default_gpu(const nf_graph *g, int block, nf_schedule **out) {
  int n_tiled = 0;
  int rc = nf__sched_gpu_plain(g, block, 1, NULL, &n_tiled, out);
  if (rc < 0 || n_tiled == 0) return rc;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_lprog *p = NULL;
  int lr = ctx ? nf_lower(g, *out, ctx, &p, &err) : NF_ENOMEM;
  if (lr == NF_OK && block_shared(p, p->root) > NF_GPU_SHARED_BUDGET) lr = NF_ELIMIT;
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  if (lr == NF_OK) return NF_OK;
  nf_schedule_free(*out);
  *out = NULL;
  if (lr == NF_ENOMEM) return lr;
  return nf__sched_gpu_plain(g, block, 0, NULL, &n_tiled, out);
}
