/* sched_gemm.c - the default schedule's tile for products (issue 32): a
 * sum of one product of two plain accesses,
 *
 *     out(o..) +=! X(..) * Y(..)
 *
 * every index a bare variable or a constant, every reduction variable
 * read by both operands (a matrix product in any transposition, batched,
 * a pointwise convolution and both its gradients, a weight gradient
 * summed over steps).  What it decides from the accesses alone:
 *
 *  - the lanes: an output variable v that one operand V reads and the
 *    other does not, split into tj = 1..4 vectors; among the candidates
 *    the one whose copy of V and stores of the output cost least;
 *  - the rows: an output variable u that the other operand (broadcast,
 *    one element per row and reduction step) reads and V does not, split
 *    into ti rows: ti x (tj / lanes) accumulators, as many as the
 *    register file holds beside the loads (a small cost model);
 *  - V's panel (every reduction step of the tj lanes) copied contiguous
 *    at v's outer loop (cache_read: transposed where V is not contiguous
 *    along v, the NT forms), so that each step of the tile reads tj
 *    consecutive floats; the reduction loops outermost in the operands'
 *    memory order moved outside the rows (a blocked reduction carried in
 *    the output) until the panel fits a budget of the L2 cache (of L1
 *    where several reduction variables are blocked), or, over a
 *    broadcast operand read across cache lines (TN), 256 steps;
 *  - the output variables the broadcast operand alone reads stay inside
 *    v's outer loop up to 64 rows (each panel copy serves that many rows
 *    at least; fewer where the parallel loop would have under 4
 *    iterations), the others go outside it with the batch variables, and
 *    the outermost output loops are fused until there are 16 parallel
 *    iterations or none is left;
 *  - an elementwise epilogue takes the same outer loops and tile, and the
 *    product is computed at its loop that holds v.o, panel by panel.
 *
 * Nothing here looks at names or particular sizes: only at which
 * operand reads which variable, in which dimension, and at extents.  It
 * does not apply (the caller keeps its other schedules) to sums of other
 * forms, to f64 or integers, to a lane variable whose extent the vector
 * width does not divide, or to short reductions (under 16 terms). */
#include <string.h>

#include "nf_lower.h"

#define PANEL_BYTES (512 * 1024) /* V's panel at one tile loop (L2) */
#define PANEL_L1 (32 * 1024)     /* ... where blocks of several reductions */
#define MIN_ROWS_IN 64           /* rows each panel copy serves */
#define MIN_TERMS 16             /* reduction terms of a product */
#define STRIDED_TERMS 256        /* steps of a tile over a strided operand */
#define MIN_PAR 4                /* parallel iterations wanted */
#define ROWS_BYTES (256 * 1024)  /* a block of the broadcast operand's rows */

/* The budgets below divided by this (tests: blocks at small sizes). */
static int g_budget_div;

void nf__sched_gemm_set_budget_div(int d) { g_budget_div = d; }

typedef struct gemm_plan {
  int v, u;              /* output variables: lanes, rows */
  int vside;             /* the operand that reads v (0 or 1) */
  const nf_expr *V, *B;  /* its access, the broadcast operand's */
  int pack;              /* copy V's panel at the tile's column loop */
  int64_t tj, ti;        /* lanes (a multiple of the vector), rows */
} gemm_plan;

/* The dimension of access a that variable x indexes, -1 when none, -2
 * when a is not plain (an index that is neither a bare variable nor a
 * constant, or a variable used twice). */
static int dim_of(const nf_expr *a, uint32_t x) {
  int d = -1;
  for (int k = 0; k < a->n_args; k++) {
    const nf_expr *e = a->args[k];
    if (e->op == NF_OP_CONST) continue;
    if (e->op != NF_OP_VAR) return -2;
    if (e->u.var != x) continue;
    if (d >= 0) return -2;
    d = k;
  }
  return d;
}

static int plain(const nf_expr *a) {
  if (a->op != NF_OP_ACCESS || a->dtype != NF_F32) return 0;
  for (int k = 0; k < a->n_args; k++)
    if (a->args[k]->op != NF_OP_CONST && a->args[k]->op != NF_OP_VAR) return 0;
  return dim_of(a, UINT32_MAX) != -2;
}

/* Whether dimension d is a's innermost that is not a constant or of
 * extent 1 (x's elements are contiguous there). */
static int innermost(const nf_graph *g, const nf_expr *a, int d) {
  const nf_tensor *t = &g->tensors[a->u.tensor];
  for (int k = d + 1; k < a->n_args; k++)
    if (t->shape[k] != 1) return 0;
  return d >= 0;
}

/* Time per useful lane of a ti x nv tile (lower is better): each step of
 * the reduction is ti x nv FMAs, nv vector loads and ti broadcasts (two
 * of each per cycle), at least 8 FMAs in flight to cover their latency;
 * rows past ext (a guarded last block) are wasted. */
static double tile_cost(int64_t ti, int64_t nv, int64_t ext) {
  double fma = (double)(ti * nv), loads = (double)(ti + nv);
  double busy = fma > loads ? fma : loads;
  if (busy < 8) busy = 8;
  double useful = (double)ext / (double)(((ext + ti - 1) / ti) * ti);
  return busy * (1.0 + 0.3 * loads / fma) / (fma * useful);
}

/* Fills p for statement si when it is such a product; 0 when not. */
static int gemm_plan_of(const nf_graph *g, uint32_t si, int lanes, int n_regs, gemm_plan *p) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red != NF_RED_SUM || st->n_red == 0 || t->dtype != NF_F32 || rank < 2 ||
      st->rhs->op != NF_OP_MUL)
    return 0;
  const nf_expr *a[2] = {st->rhs->args[0], st->rhs->args[1]};
  if (!plain(a[0]) || !plain(a[1])) return 0;
  int64_t terms = 1;
  for (int q = 0; q < st->n_red; q++) {
    uint32_t x = (uint32_t)(rank + q);
    if (st->red_lo[q] != 0 || dim_of(a[0], x) < 0 || dim_of(a[1], x) < 0) return 0;
    terms *= st->red_ext[q];
  }
  if (terms < MIN_TERMS) return 0;
  /* The lanes: read by one operand only, a multiple of the vector, two
   * at least.  Among those, the one whose copy of V and stores of the
   * output cost least beside the FMAs (which are the same for all):
   * V's copy is a vector copy where V is contiguous along v, else one
   * element at a time (a transpose); the output is stored whole vectors
   * where it is contiguous along v, else scattered (each element to
   * another cache line: about 3 cycles an element measured).  linear's
   * 64x768 by 1536x768 (lltm's gates): lanes along the batch copy 49 K
   * elements of X and scatter 98 K outputs, along the output's 1536
   * columns copy 1.2 M of W, as long as the product's FMAs at 16 lanes
   * (1.6 -> 1.2 ms at one thread); at 512x512 by 2048x512 (milstm's Wx)
   * the lanes along the batch scatter 1 M outputs (7.1 -> 8.4 ms). */
  int best = -1;
  double best_cost = 0;
  int64_t n_out = 1;
  for (int k = 0; k < rank; k++) n_out *= t->shape[k];
  for (int v = 0; v < rank; v++) {
    int d0 = dim_of(a[0], (uint32_t)v), d1 = dim_of(a[1], (uint32_t)v);
    if ((d0 >= 0) == (d1 >= 0) || t->shape[v] % lanes != 0 || t->shape[v] < 2 * lanes) continue;
    int side = d0 >= 0 ? 0 : 1;
    /* a row variable must exist on the other side */
    int has_u = 0;
    for (int u = 0; u < rank; u++)
      if (dim_of(a[1 - side], (uint32_t)u) >= 0 && dim_of(a[side], (uint32_t)u) < 0 &&
          t->shape[u] >= 2)
        has_u = 1;
    if (!has_u) continue;
    int out_in = 1;
    for (int k = v + 1; k < rank; k++)
      if (t->shape[k] != 1) out_in = 0;
    int v_in = innermost(g, a[side], side ? d1 : d0);
    if (!v_in && !g->tensors[a[side]->u.tensor].name) continue; /* no copy possible */
    double n_v = (double)nf_tensor_numel(&g->tensors[a[side]->u.tensor]);
    double cost = (v_in ? 2.0 * n_v / lanes : 1.5 * n_v) +
                  (out_in ? (double)n_out / lanes : 3.0 * (double)n_out);
    if (best < 0 || cost < best_cost) {
      best = v;
      best_cost = cost;
      p->vside = side;
    }
  }
  if (best < 0) return 0;
  p->v = best;
  p->V = a[p->vside];
  p->B = a[1 - p->vside];
  /* the rows: the broadcast operand's innermost variable that V does not
   * read (consecutive broadcasts from one cache line) */
  p->u = -1;
  int best_d = -1;
  for (int u = 0; u < rank; u++) {
    int d = dim_of(p->B, (uint32_t)u);
    if (d < 0 || dim_of(p->V, (uint32_t)u) >= 0 || t->shape[u] < 2) continue;
    if (d > best_d) {
      best_d = d;
      p->u = u;
    }
  }
  if (p->u < 0) return 0;
  /* the tile: nv vectors (dividing v's extent) by ti rows, the
   * accumulators and one register per vector load and a broadcast
   * within the register file */
  int64_t ev = t->shape[p->v], eu = t->shape[p->u];
  /* parallel iterations outside the panel: the batch loops, V's own and
   * v's blocks; fewer vectors where that makes under MIN_PAR of them */
  int64_t outer = 1;
  for (int x = 0; x < rank; x++)
    if (x != p->v && x != p->u && (dim_of(p->B, (uint32_t)x) < 0 || dim_of(p->V, (uint32_t)x) >= 0))
      outer *= t->shape[x];
  double best_tile = 1e30;
  p->ti = p->tj = 0;
  for (int64_t nv = 4; nv >= 1; nv--) {
    if (ev % (nv * lanes) != 0) continue;
    if (nv > 1 && outer * (ev / (nv * lanes)) < MIN_PAR && ev % lanes == 0 &&
        outer * (ev / lanes) >= MIN_PAR)
      continue;
    int64_t max_ti = (n_regs - nv - 2) / nv;
    if (max_ti > 16) max_ti = 16;
    for (int64_t ti = max_ti; ti >= 2; ti--) {
      int64_t r = ti < eu ? ti : eu;
      double c = tile_cost(r, nv, eu);
      if (c < best_tile - 1e-9) {
        best_tile = c;
        p->ti = r;
        p->tj = nv * lanes;
      }
    }
  }
  if (!p->tj) return 0;
  /* the panel is copied (a contiguous one with vector copies: a row
   * stride of kilobytes costs more than the copy) */
  p->pack = g->tensors[p->V->u.tensor].name != NULL;
  return 1;
}

static void cat_name(char *dst, const char *a, const char *b) {
  nf__sched_cat(dst, a, b);
}

/* The decisions of a product's nest (beside its plan). */
typedef struct gemm_nest {
  gemm_plan p;
  int inside[NF_MAX_VARS]; /* output variables inside v.o (the rows' own) */
  int ord[NF_MAX_VARS], no; /* reductions in the operands' memory order */
  int n_out_red;            /* ord[0..n_out_red) outside u.o */
  int ksplit;               /* ord[ksplit] split: .o outside u.o, .i inside */
  int64_t kc;               /* its inner extent */
  int n_outer, outer[NF_MAX_VARS]; /* output variables outside v.o */
  int n_fuse;               /* loops (outer..., v.o) fused into the parallel one */
  int64_t rb;               /* > 0: blocks of rb rows (u.o), the broadcast
                             * operand's block copied at u.o (its rows
                             * contiguous), v.o inside u.o */
} gemm_nest;

static int gemm_nest_of(const nf_schedule *s, const nf_graph *g, uint32_t si, int row_blocks,
                        gemm_nest *n) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  int lanes = nf__sched_acc_regs(s) >= 16 ? 16 : 8;
  memset(n, 0, sizeof *n);
  gemm_plan *p = &n->p;
  if (!gemm_plan_of(g, si, lanes, lanes == 16 ? 32 : 16, p)) return 0;
  /* output loops: the broadcast operand's own (other than u) inside v.o
   * from the innermost dimension out while the rows inside stay under
   * MIN_ROWS_IN; the rest (batch, V's own) outside, in output order */
  int64_t rows_in = t->shape[p->u];
  for (int d = p->B->n_args - 1; d >= 0; d--) {
    const nf_expr *e = p->B->args[d];
    if (e->op != NF_OP_VAR || e->u.var >= (uint32_t)rank) continue;
    int x = (int)e->u.var;
    if (x == p->u || dim_of(p->V, (uint32_t)x) >= 0 || rows_in >= MIN_ROWS_IN) continue;
    n->inside[x] = 1;
    rows_in *= t->shape[x];
  }
  /* ... but out again, outermost first, while the parallel loop would
   * have under MIN_PAR iterations and a whole tile of rows stays in */
  int64_t n_par = t->shape[p->v] / p->tj;
  for (int x = 0; x < rank; x++)
    if (x != p->v && x != p->u && !n->inside[x]) n_par *= t->shape[x];
  for (int x = 0; x < rank && n_par < MIN_PAR; x++)
    if (n->inside[x] && rows_in / t->shape[x] >= p->ti) {
      n->inside[x] = 0;
      rows_in /= t->shape[x];
      n_par *= t->shape[x];
    }
  for (int x = 0; x < rank; x++)
    if (x != p->v && x != p->u && !n->inside[x]) n->outer[n->n_outer++] = x;
  /* the parallel loop: the outermost output loops fused (v.o last)
   * while under 16 iterations */
  int64_t iters = 0;
  n->n_fuse = 0;
  for (int k = 0; k <= n->n_outer; k++) {
    int64_t e = k < n->n_outer ? t->shape[n->outer[k]] : t->shape[p->v] / p->tj;
    if (k > 0 && iters >= 16) break;
    iters = k == 0 ? e : iters * e;
    n->n_fuse++;
  }
  /* reduction loops in the operands' memory order; the outermost ones
   * leave the tile while V's panel is over the budget */
  n->no = nf__sched_red_order(st, rank, -1, n->ord);
  if (n->no < 0) return n->no;
  int no = n->no, *ord = n->ord;
  /* The budget: V's panel within PANEL_BYTES; where the broadcast
   * operand is not contiguous along the reduction (its rows are: a TN
   * product), each step of a tile reads a new cache line of it, and the
   * tiles of one row block share those lines: at most STRIDED_TERMS
   * steps, so that they stay in L1 from one tile to the next (milstm's
   * dU, 2048x512x512 TN at one thread: 11.0 ms unblocked, 8.2 in blocks
   * of 128 or 256 steps, OpenBLAS 6.5). */
  int64_t scale = g_budget_div > 1 ? g_budget_div : 1;
  int64_t budget = PANEL_BYTES / scale / (p->tj * 4);
  int b_last = -1;
  for (int d = p->B->n_args - 1; d >= 0 && b_last < 0; d--)
    if (g->tensors[p->B->u.tensor].shape[d] != 1 && p->B->args[d]->op == NF_OP_VAR)
      b_last = (int)p->B->args[d]->u.var;
  n->ksplit = -1;
  int64_t inner = 1;
  for (int q = 0; q < no; q++) inner *= st->red_ext[ord[q]];
  /* Such a broadcast operand, where every output variable it reads is u
   * (no rows' own loops inside v.o), V's panel is a vector copy (each
   * block of rows copies every panel again) and the product stands
   * alone, is copied instead, a block of rows at a time with the rows
   * contiguous (at most ROWS_BYTES, its reduction unblocked), and v's
   * panels are taken inside each block: no pass over the output per
   * block of the reduction and no serial zeroing of it first, which
   * cost the most where the second core is busy (milstm's dU at two
   * threads on a loaded machine: 8.0 ms in blocks of 256 steps, no faster
   * than at one thread, against OpenBLAS's 3.5). */
  int n_in = 0;
  for (int x = 0; x < rank; x++) n_in += n->inside[x];
  int v_in = innermost(g, p->V, dim_of(p->V, (uint32_t)p->v));
  if (row_blocks && b_last < rank && n_in == 0 && v_in && g->tensors[p->B->u.tensor].name &&
      inner * p->tj * 4 <= PANEL_BYTES / scale) {
    int64_t eu = t->shape[p->u], rb = ROWS_BYTES / scale / (inner * 4) / p->ti * p->ti;
    if (rb < p->ti) rb = p->ti;
    if (rb > (eu + p->ti - 1) / p->ti * p->ti) rb = (eu + p->ti - 1) / p->ti * p->ti;
    n->rb = rb;
    /* the parallel loop: the outer loops and u.o (never v.o: each of
     * its iterations would copy the block again) */
    n->n_fuse = 0;
    iters = 0;
    for (int k = 0; k <= n->n_outer; k++) {
      int64_t e = k < n->n_outer ? t->shape[n->outer[k]] : (eu + rb - 1) / rb;
      if (k > 0 && iters >= 16) break;
      iters = k == 0 ? e : iters * e;
      n->n_fuse++;
    }
    return 1;
  }
  if (b_last < rank && budget > STRIDED_TERMS / scale) budget = STRIDED_TERMS / scale;
  /* Blocks of several reduction variables keep the innermost whole and
   * the panel within L1: the tiles over one panel are few there (a
   * pointwise convolution's weight gradient, 128x128 by 16x28x28 at one
   * thread: 5.0 ms with the panel of a whole image in L2, 3.3 with 7
   * rows of it in L1; OpenBLAS 3.3).  A single reduction is cut only
   * where it must be, and no finer (matmul 1024^3: 12.0 ms whole, 15.1
   * in blocks of 256). */
  int64_t l1 = PANEL_L1 / scale / (p->tj * 4);
  if (inner > budget && no > 1 && budget > l1) budget = l1;
  if (budget < 1) budget = 1;
  while (n->n_out_red < no - 1 && inner > budget) {
    int q = ord[n->n_out_red];
    int64_t e = st->red_ext[q], rest = inner / e, kc = 1;
    if (rest < budget)
      for (int64_t c = budget / rest; c >= 2 && kc == 1; c--)
        if (e % c == 0) kc = c;
    if (kc > 1) {
      n->ksplit = n->n_out_red;
      n->kc = kc;
      return 1;
    }
    inner = rest;
    n->n_out_red++;
  }
  /* one long reduction left over the budget: blocks of it */
  if (inner > budget && n->n_out_red == no - 1) {
    int64_t e = st->red_ext[ord[no - 1]], kc = 0;
    for (int64_t c = budget; c >= (budget < 32 ? 2 : 32) && !kc; c--)
      if (e % c == 0) kc = c;
    if (kc && kc < e) {
      n->ksplit = no - 1;
      n->kc = kc;
    }
  }
  return 1;
}

/* The name of the loop that the fused outer loops make (the parallel
 * one), from statement loop names nm. */
static void par_name(const gemm_nest *n, char nm[][NF_SCHED_NAME], char *out) {
  char tmp[NF_SCHED_NAME], vo[NF_SCHED_NAME];
  cat_name(vo, nm[n->rb ? n->p.u : n->p.v], ".o");
  for (int k = 0; k < n->n_fuse; k++) {
    const char *name = k < n->n_outer ? nm[n->outer[k]] : vo;
    if (k == 0) {
      cat_name(out, name, "");
      continue;
    }
    cat_name(tmp, out, ".");
    cat_name(tmp, tmp, name);
    cat_name(out, tmp, ".fused");
  }
}

/* Emits statement st_i's nest (loop names nm) as decided in n:
 *   outer... v.o [red_out... k.o] inside... u.o red_in... u.i v.i
 * role 0: the product alone (cache_write u.o, cache_read V at the last
 * loop before u.o that is v.o or a reduction, the outer loops fused and
 * parallel, vectorize v.i); role 1: the product computed at its
 * epilogue's loop (the same without the fusion and the parallel loop:
 * v.o has one iteration there); role 2: the epilogue (its output loops
 * only, fused and parallel as the product's would be). */
static int emit_nest(nf_schedule *s, const nf_graph *g, int st_i, char nm[][NF_SCHED_NAME],
                     const gemm_nest *n, int role) {
  const gemm_plan *p = &n->p;
  int rank = g->tensors[g->stmts[st_i].out].rank, rc;
  char vo[NF_SCHED_NAME], vi[NF_SCHED_NAME], uo[NF_SCHED_NAME], ui[NF_SCHED_NAME];
  char ko[NF_SCHED_NAME] = "", ki[NF_SCHED_NAME] = "";
  cat_name(vo, nm[p->v], ".o");
  cat_name(vi, nm[p->v], ".i");
  cat_name(uo, nm[p->u], ".o");
  cat_name(ui, nm[p->u], ".i");
  /* row blocks: u.o the block, u.i.o the tile's loop, u.i.i its rows */
  char ub[NF_SCHED_NAME];
  cat_name(ub, uo, "");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, nm[p->v], p->tj)) < 0) return rc;
  if (n->rb) {
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, nm[p->u], n->rb)) < 0) return rc;
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, ui, p->ti)) < 0) return rc;
    cat_name(uo, ub, "");
    cat_name(uo, nm[p->u], ".i.o");
    cat_name(ui, nm[p->u], ".i.i");
  } else if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, nm[p->u], p->ti)) < 0) {
    return rc;
  }
  int red = role != 2;
  if (red && n->ksplit >= 0) {
    const char *k = nm[rank + n->ord[n->ksplit]];
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, k, n->kc)) < 0) return rc;
    cat_name(ko, k, ".o");
    cat_name(ki, k, ".i");
  }
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int k = 0; k < n->n_outer; k++) cat_name(it.names[it.n_names++], nm[n->outer[k]], "");
  if (n->rb) cat_name(it.names[it.n_names++], ub, "");
  cat_name(it.names[it.n_names++], vo, "");
  char pack_at[NF_SCHED_NAME];
  cat_name(pack_at, vo, "");
  for (int q = 0; red && q < n->n_out_red; q++) {
    cat_name(it.names[it.n_names++], nm[rank + n->ord[q]], "");
    cat_name(pack_at, nm[rank + n->ord[q]], "");
  }
  if (ko[0]) {
    cat_name(it.names[it.n_names++], ko, "");
    cat_name(pack_at, ko, "");
  }
  for (int x = 0; x < rank; x++)
    if (n->inside[x]) cat_name(it.names[it.n_names++], nm[x], "");
  cat_name(it.names[it.n_names++], uo, "");
  for (int q = n->n_out_red; red && q < n->no; q++)
    cat_name(it.names[it.n_names++], q == n->ksplit ? ki : nm[rank + n->ord[q]], "");
  cat_name(it.names[it.n_names++], ui, "");
  cat_name(it.names[it.n_names++], vi, "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  if (red && (rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, uo, 0)) < 0) return rc;
  if (role != 1) {
    char par[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
    const char *last = n->rb ? ub : vo; /* the loop fused after the outer ones */
    for (int k = 1; k < n->n_fuse; k++) {
      const char *name = k < n->n_outer ? nm[n->outer[k]] : last;
      if (k == 1) cat_name(par, n->n_outer > 0 ? nm[n->outer[0]] : last, "");
      if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, par, name)) < 0) return rc;
      cat_name(tmp, par, ".");
      cat_name(tmp, tmp, name);
      cat_name(par, tmp, ".fused");
    }
    par_name(n, nm, par);
    /* v.o fused: the panel's copy goes to the fused loop */
    if (!n->rb && n->n_fuse > n->n_outer && strcmp(pack_at, vo) == 0) cat_name(pack_at, par, "");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
    /* the broadcast operand's block of rows, at the loop that holds u.o */
    const char *bname = g->tensors[p->B->u.tensor].name;
    if (n->rb && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ,
                                      n->n_fuse > n->n_outer ? par : ub, bname)) < 0)
      return rc;
  }
  const char *vname = g->tensors[p->V->u.tensor].name;
  if (red && p->pack && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, pack_at, vname)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, vi, 0)) < 0) return rc;
  return 1;
}

int nf__sched_gemm(nf_schedule *s, const nf_graph *g, int st_i, char nm[][NF_SCHED_NAME]) {
  gemm_nest n;
  int rc = gemm_nest_of(s, g, (uint32_t)st_i, 1, &n);
  return rc <= 0 ? rc : emit_nest(s, g, st_i, nm, &n, 0);
}

/* The product prod computed at its elementwise epilogue cons (which reads
 * it once, at its own indices): the epilogue takes the product's outer
 * loops and tile (role 2), and the product is computed at the loop that
 * holds v.o (the parallel one where v.o is fused into it), one panel of
 * rows x tj at a time, into a local buffer the epilogue reads while it is
 * in L2 (role 1).  Called for each statement: part 0 the product's
 * items, part 1 the epilogue's.  1 when done, 0 when prod takes no
 * product tile, NF_ENOMEM. */
int nf__sched_gemm_fused(nf_schedule *s, const nf_graph *g, int prod, int cons, int part) {
  gemm_nest n;
  int rc = gemm_nest_of(s, g, (uint32_t)prod, 0, &n);
  if (rc <= 0) return rc;
  const nf_stmt *ps = &g->stmts[prod], *cs = &g->stmts[cons];
  int rank = g->tensors[ps->out].rank;
  char nm[NF_MAX_VARS][NF_SCHED_NAME], cn[NF_MAX_VARS][NF_SCHED_NAME];
  for (int k = 0; k < rank + ps->n_red; k++) nf__sched_var_name(ps, k, nm[k]);
  for (int k = 0; k < rank; k++) nf__sched_var_name(cs, k, cn[k]);
  if (part == 1) return emit_nest(s, g, cons, cn, &n, 2);
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_COMPUTE_AT;
  it.stmt = prod;
  it.stmt2 = cons;
  it.n_names = 1;
  if (n.n_fuse > n.n_outer)
    par_name(&n, cn, it.names[0]);
  else
    cat_name(it.names[0], cn[n.p.v], ".o");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  return emit_nest(s, g, prod, nm, &n, 1);
}
