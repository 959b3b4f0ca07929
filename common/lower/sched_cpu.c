/* sched_cpu.c - the tier-1 default CPU schedule (nf_lower.h): from shapes
 * alone (no lowering, microseconds), legal by construction; lower.c
 * checks the stencil, weight-gradient and padded-plane choices by
 * lowering once (nf_schedule_default_for).  What it does for which
 * statement: docs/schedules.md.  The target decides the register tiles
 * (nf_sched_target). */
#include <stdlib.h>
#include <string.h>

#include "nf_lower.h"

/* The access of tensor t in e when e reads t exactly once, else NULL. */
typedef struct find_acc {
  uint32_t t;
  int n;
  const nf_expr *a;
} find_acc;

static void find_fn(const nf_expr *e, void *user) {
  find_acc *f = user;
  if (e->op == NF_OP_ACCESS && e->u.tensor == f->t) {
    f->n++;
    f->a = e;
  }
}

static int tiled_by_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  return st->red != NF_RED_NONE && st->n_red > 0 && rank >= 2 && t->shape[rank - 2] >= 4 &&
         t->shape[rank - 1] >= 8;
}

/* Accesses whose last index uses variable v (rf_score). */
typedef struct last_use {
  uint32_t r, j;
  int check_j;
  int score;
} last_use;

static void last_fn(const nf_expr *e, void *user) {
  last_use *u = user;
  if (e->op != NF_OP_ACCESS || e->n_args == 0) return;
  const nf_expr *x = e->args[e->n_args - 1];
  if (nf__sched_uses_var(x, u->r))
    u->score++;
  else if (u->check_j && nf__sched_uses_var(x, u->j))
    u->score--;
}

/* The reduction variable (index rank + k) whose partial results a
 * default schedule keeps in vector lanes (rfactor), or -1.  For a
 * reduction that is not register-tiled, over a variable of at least 8
 * iterations that the innermost index of its operands runs along (a
 * row sum, a depthwise convolution's weight gradient: 1152 outputs of
 * 12544 terms each) where the output's own last variable gives no
 * better vector (rank 0, under 8 wide, or no operand runs along it).
 * Folding those terms one by one is a chain of dependent additions. */
static int rf_var_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red == NF_RED_NONE || st->n_red == 0 || rank >= NF_MAX_RANK ||
      tiled_by_default(g, si))
    return -1;
  int best = -1, best_score = 0;
  for (int k = 0; k < st->n_red; k++) {
    if (st->red_ext[k] < 8) continue;
    last_use u = {.r = (uint32_t)(rank + k), .j = (uint32_t)(rank - 1),
                  .check_j = rank > 0 && t->shape[rank - 1] >= 8, .score = 0};
    if (nf_expr_visit(st->rhs, last_fn, &u) < 0) return -1;
    if (u.score > best_score) {
      best = k;
      best_score = u.score;
    }
  }
  return best;
}

/* The rfactor schedule of statement si over reduction variable rank + k:
 *   outer... red... r.o tile... r.i
 * r split by the vector width (8 where it divides, else 4 where that
 * divides, else 8 with a guard), the output's trailing variables of at
 * most 16 elements in all the tile (held in registers: tile x width),
 * the leading ones outside, the first of them parallel; the tile (with
 * a slot per lane) is the cache_write at the last outer loop, or, when
 * every output variable is in the tile, at the first reduction loop. */
/* Occurrences of two variables in an expression: all of them, and those
 * that are the last two indices of an access (x at the next-to-last, y
 * at the last, whose extent is ey) with neither elsewhere in it. */
typedef struct pair_use {
  uint32_t x, y;
  int64_t ey;
  const nf_graph *g;
  int all, paired, bad;
} pair_use;

static void pair_fn(const nf_expr *e, void *user) {
  pair_use *u = user;
  if (e->op == NF_OP_VAR && (e->u.var == u->x || e->u.var == u->y)) u->all++;
  if (e->op != NF_OP_ACCESS) return;
  int n = e->n_args, hits = 0;
  for (int d = 0; d < n; d++)
    if (nf__sched_uses_var(e->args[d], u->x) || nf__sched_uses_var(e->args[d], u->y)) hits++;
  if (hits == 0) return;
  const nf_expr *a = n >= 2 ? e->args[n - 2] : NULL, *b = n >= 1 ? e->args[n - 1] : NULL;
  if (hits == 2 && a->op == NF_OP_VAR && a->u.var == u->x && b->op == NF_OP_VAR &&
      b->u.var == u->y && u->g->tensors[e->u.tensor].shape[n - 1] == u->ey)
    u->paired += 2;
  else
    u->bad = 1;
}

/* The reduction variable (numbered from 0) to fuse with reduction k, the
 * next one out, where k's extent is no multiple of 8 but theirs together
 * is, and every access reads them as its last two indices, whole (an
 * image's rows and columns, 28 x 28 = 49 vectors of 16): the fused loop
 * then runs over contiguous memory (the backend folds x // 28 and x % 28
 * back into x), full vectors instead of 4 lanes; else -1.  A full
 * reduction of 16x128x28x28 at one thread: 0.39 -> 0.21 ms. */
static int rf_fuse_prev(const nf_graph *g, const nf_stmt *st, int rank, int k) {
  if (k == 0) return -1;
  int64_t e = st->red_ext[k], eq = st->red_ext[k - 1];
  if (e % 8 == 0 || (e * eq) % 8 != 0 || st->red_lo[k] || st->red_lo[k - 1]) return -1;
  pair_use u = {.x = (uint32_t)(rank + k - 1), .y = (uint32_t)(rank + k), .ey = e, .g = g};
  if (nf_expr_visit(st->rhs, pair_fn, &u) < 0 || u.bad || u.paired == 0 || u.paired != u.all)
    return -1;
  return k - 1;
}

static int rf_nest(nf_schedule *s, const nf_graph *g, int st_i, int k,
                   char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, r = rank + k, rc;
  int64_t e = st->red_ext[k], w = e % 8 == 0 ? 8 : e % 4 == 0 ? 4 : 8;
  int fq = rf_fuse_prev(g, st, rank, k);
  char rname[NF_SCHED_NAME];
  nf__sched_cat(rname, nm[r], "");
  if (fq >= 0) {
    char tmp[NF_SCHED_NAME];
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, nm[rank + fq], nm[r])) < 0) return rc;
    nf__sched_cat(tmp, nm[rank + fq], ".");
    nf__sched_cat(tmp, tmp, nm[r]);
    nf__sched_cat(rname, tmp, ".fused");
    e *= st->red_ext[fq];
    w = nf__sched_acc_regs(s) >= 16 && e % 16 == 0 ? 16 : 8;
  }
  int first_tile = rank;
  int64_t tile = 1;
  while (first_tile > 0 && tile * t->shape[first_tile - 1] <= 16) tile *= t->shape[--first_tile];
  /* the tile needs a loop outside it that is not r's: the first output
   * loop, else (a scalar result of one reduction variable) blocks of
   * 256 vectors of r */
  if (first_tile == 0 && rank > 0 && st->n_red == 1) first_tile = 1;
  int blocks = rank == 0 && st->n_red == 1;
  char ro[NF_SCHED_NAME], ri[NF_SCHED_NAME], roo[NF_SCHED_NAME];
  nf__sched_cat(ro, rname, ".o");
  nf__sched_cat(ri, rname, ".i");
  nf__sched_cat(roo, ro, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rname, w)) < 0) return rc;
  if (blocks) {
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, ro, 256)) < 0) return rc;
    nf__sched_cat(ro, ro, ".i");
  }
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int v = 0; v < first_tile; v++) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  /* the other reduction loops in the order of the dimensions they
   * index (an image's batch before its rows): the data is walked in
   * memory order */
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, k, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != fq) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  if (blocks) nf__sched_cat(it.names[it.n_names++], roo, "");
  nf__sched_cat(it.names[it.n_names++], ro, "");
  for (int v = first_tile; v < rank; v++) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  nf__sched_cat(it.names[it.n_names++], ri, "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  /* the tile's loop: the last outer output loop, else the first
   * reduction loop (each of its iterations continues the output's
   * partial result) */
  char cw[NF_SCHED_NAME];
  nf__sched_cat(cw, first_tile > 0 ? nm[first_tile - 1] : it.names[0], "");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cw, 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, ri, 0)) < 0) return rc;
  if (first_tile > 0 && (rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, nm[0], 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, ri, 0);
}

/* The statement whose loops take register-tiled reduction si as its fused
 * epilogue, or -1: a local si read once, by an elementwise statement of
 * the same shape that is not inlined and reads si at its own indices. */
static int epilogue_of(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  if (!tiled_by_default(g, si) || t->kind != NF_T_LOCAL || !nf__sched_used_once(g, st->out)) return -1;
  for (uint32_t c = si + 1; c < g->n_stmts; c++) {
    const nf_stmt *cs = &g->stmts[c];
    find_acc f = {.t = st->out, .n = 0, .a = NULL};
    if (nf_expr_visit(cs->rhs, find_fn, &f) < 0 || f.n == 0) continue;
    const nf_tensor *ct = &g->tensors[cs->out];
    if (cs->red != NF_RED_NONE || cs->n_red || nf__sched_inlined_by_default(g, c) || ct->rank != t->rank)
      return -1;
    for (int d = 0; d < t->rank; d++)
      if (ct->shape[d] != t->shape[d] || f.a->args[d]->op != NF_OP_VAR ||
          f.a->args[d]->u.var != (uint32_t)d)
        return -1;
    return (int)c;
  }
  return -1;
}

/* Accumulator registers the stencil and weight-gradient tiles may fill:
 * 16 where the target has 32 vector registers (AVX-512), else 8 (of
 * AVX2's 16); 8 for a parsed schedule. */
int nf__sched_acc_regs(const nf_schedule *s) { return s && s->acc_regs >= 16 ? 16 : 8; }

nf_sched_target nf_sched_target_of(const char *features) {
  nf_sched_target t = {16};
  if (!features) return t;
  /* a whole word: "avx512f" in a description, "+avx512f" in LLVM's list
   * ("-avx512f" there says the feature is off) */
  for (const char *p = strstr(features, "avx512f"); p; p = strstr(p + 1, "avx512f")) {
    char before = p == features ? ' ' : p[-1], after = p[7];
    int word_end = after == '\0' || after == ',' || after == ' ';
    if (word_end && (before == ' ' || before == '+' || before == ',')) {
      t.vector_regs = 32;
      break;
    }
  }
  return t;
}

nf_sched_target nf_sched_target_host(void) {
  nf_sched_target t = {16};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) t.vector_regs = 32;
#endif
  return t;
}

/* The register tile of an output of extents ei x ej: 8 x 16 where the
 * extents allow it (on this Zen 4 machine matmul 1024^3 ran at 39
 * GFLOP/s with 8 x 16 against 22 with 4 x 16 and 11 with 4 x 8), without
 * guards inside the tile when a smaller dividing size exists. */
static void reg_tile(int64_t ei, int64_t ej, int64_t *ti, int64_t *tj) {
  *ti = (ei % 8 == 0 || ei >= 64) ? 8 : 4;
  *tj = (ej % 16 == 0 || ej >= 64) ? 16 : 8;
  /* a short row that 8 does not divide (a 28-wide image) is one vector
   * of its whole width over 2 rows: no guarded lanes (the depthwise
   * convolution's forward, 16x128x28x28: 4.1 ms against 7.3 with 4 x 8
   * and a guard) */
  if (ej % 8 != 0 && ej % 4 == 0 && ej > 8 && ej <= 32) {
    *ti = 2;
    *tj = ej;
  }
}

/* Splits the last two loops of a rank-`rank` nest named nm by ti x tj and
 * orders them: batch... i.o j.o mid... i.i j.i; parallel on the outermost
 * loop, vectorize j.i. */
static int tile_nest(nf_schedule *s, int st_i, char nm[][NF_SCHED_NAME], int rank,
                     char mid[][NF_SCHED_NAME], int n_mid, int64_t ti, int64_t tj) {
  const char *i = nm[rank - 2], *j = nm[rank - 1];
  char a[NF_SCHED_NAME], b[NF_SCHED_NAME];
  nf_sched_item it;
  int rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, i, ti);
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tj);
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
  nf__sched_cat(it.names[it.n_names++], i, ".o");
  nf__sched_cat(it.names[it.n_names++], j, ".o");
  for (int k = 0; k < n_mid; k++) nf__sched_cat(it.names[it.n_names++], mid[k], "");
  nf__sched_cat(it.names[it.n_names++], i, ".i");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  if (rc == NF_OK) rc = nf_schedule_add(s, &it);
  nf__sched_cat(b, rank > 2 ? nm[0] : i, rank > 2 ? "" : ".o");
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, b, 0);
  nf__sched_cat(a, j, ".i");
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, a, 0);
  return rc;
}

/* The product of a term `[c ?] x * y [: 0.0]` (a padded convolution's,
 * *guarded set when the select is there), or NULL. */
static const nf_expr *padded_product(const nf_expr *e, int *guarded) {
  *guarded = 0;
  if (e->op == NF_OP_SELECT && e->args[2]->op == NF_OP_CONST &&
      nf_dtype_is_float((nf_dtype)e->args[2]->dtype) && e->args[2]->u.f == 0.0) {
    *guarded = 1;
    e = e->args[1];
  }
  return e->op == NF_OP_MUL ? e : NULL;
}

/* A convolution-shaped register-tiled reduction: out(..., kv, ..., i, j)
 * += [c ?] A(...) * B(...) : 0, where A (the image) reads along j and
 * some reduction variable (a stencil, w + s) and does not use the output
 * variable kv (an output channel), which B (the weights) uses, and B does
 * not use i or j.  Fills the stencil tile's choice: kv, the image's
 * access and whether its read is guarded (padding). */
typedef struct stencil {
  int kv;
  const nf_expr *img, *wt;
  int guarded;
} stencil;

static int uses_red(const nf_expr *e, int rank, int n_red) {
  for (int k = 0; k < n_red; k++)
    if (nf__sched_uses_var(e, (uint32_t)(rank + k))) return 1;
  return 0;
}

static int stencil_of(const nf_graph *g, uint32_t si, stencil *sc) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red != NF_RED_SUM || !tiled_by_default(g, si) || rank < 3) return 0;
  const nf_expr *e = padded_product(st->rhs, &sc->guarded);
  if (!e) return 0;
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side], *b = e->args[1 - side];
    if (a->op != NF_OP_ACCESS || b->op != NF_OP_ACCESS || a->n_args == 0) continue;
    const nf_expr *last = a->args[a->n_args - 1];
    if (!nf__sched_uses_var(last, (uint32_t)(rank - 1)) || !uses_red(last, rank, st->n_red)) continue;
    if (nf__sched_uses_var(b, (uint32_t)(rank - 1)) || nf__sched_uses_var(b, (uint32_t)(rank - 2))) continue;
    for (int kv = 0; kv < rank - 2; kv++)
      if (t->shape[kv] % 4 == 0 && !nf__sched_uses_var(a, (uint32_t)kv) && nf__sched_uses_var(b, (uint32_t)kv)) {
        sc->kv = kv;
        sc->img = a;
        sc->wt = b;
        return g->tensors[a->u.tensor].name != NULL;
      }
  }
  return 0;
}

/* The stencil tile of statement si (on this Zen 4 machine a 3x3
 * convolution 8x64x56x56 -> 64 channels at one thread: 22.9 ms against
 * 35.5 through im2col and OpenBLAS and 120 with the plain 8 x 8 tile):
 *   outer... i.o kv.o j.o red... kv.i i.i j.i
 * kv.i 4 (output channels: one broadcast weight each), i.i 2 rows, j.i
 * 8 lanes (the whole row where it is short and 8 does not divide it:
 * then 1 row, and 2 channels when the row is over 2 vectors),
 * the tile accumulated in registers (cache_write j.o), the reduction
 * loops in the order of the dimensions they index; a guarded image
 * read (padding) is copied zero-padded at i.o (cache_read: the rows
 * that tile reads, every channel), so that the loads need no mask; the
 * first outer loop is fused with i.o when it has under 16 iterations,
 * and is parallel. */
static int stencil_nest(nf_schedule *s, const nf_graph *g, int st_i, const stencil *sc,
                        char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ei = t->shape[rank - 2], ej = t->shape[rank - 1];
  /* at most nf__sched_acc_regs(s) vector registers hold the tile: k.i x i.i x
   * vectors per row (a 28-wide row is 4 vectors: 2 x 1 x 28; 4 x 2 x 28
   * spilled, 16x32x28x28 to 64 channels 106 ms against 10.9) */
  int64_t tj = ej % 8 == 0 ? 8 : (ej % 4 == 0 && ej <= 32) ? ej : 8;
  int64_t nvec = (tj + 7) / 8, tk = nvec <= 2 ? 4 : 2, ti = 1;
  /* more rows while the accumulators fit (AVX-512: 4 x 4 x 8 ran the
   * 8x64x56x56 forward in 24 ms against 28 with 4 x 2 x 8 on a Xeon) */
  while (ti < 4 && ei % (2 * ti) == 0 && tk * 2 * ti * nvec <= nf__sched_acc_regs(s)) ti *= 2;
  const char *kv = nm[sc->kv], *i = nm[rank - 2], *j = nm[rank - 1];
  char io[NF_SCHED_NAME], jo[NF_SCHED_NAME], par[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(io, i, ".o");
  nf__sched_cat(jo, j, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, tk)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, i, ti)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tj)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  int n_outer = 0, first_outer = -1;
  for (int v = 0; v < rank - 2; v++)
    if (v != sc->kv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      if (n_outer++ == 0) first_outer = v;
    }
  nf__sched_cat(it.names[it.n_names++], io, "");
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  nf__sched_cat(it.names[it.n_names++], jo, "");
  /* reduction loops in the order of the dimensions they index (c r s:
   * one channel plane at a time; r s c took twice as long) */
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  nf__sched_cat(it.names[it.n_names++], i, ".i");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, n_outer > 0 ? it.names[0] : io, "");
  if (n_outer == 1 && t->shape[first_outer] < 16) {
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, par, io)) < 0) return rc;
    nf__sched_cat(tmp, par, ".");
    nf__sched_cat(tmp, tmp, io);
    nf__sched_cat(par, tmp, ".fused");
    nf__sched_cat(io, par, "");
  }
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, jo, 0)) < 0) return rc;
  if (sc->guarded && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, io, g->tensors[sc->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, j, ".i");
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0);
}

/* The largest divisor of e in [lo, hi], or 0. */
static int64_t divisor_in(int64_t e, int64_t lo, int64_t hi) {
  for (int64_t d = hi < e ? hi : e; d >= lo; d--)
    if (e % d == 0) return d;
  return 0;
}

/* Output channels in the lanes where 512-bit vectors and 32 registers
 * are there (AVX-512) and the channel count divides by 16 (the 3x3
 * convolution 8x64x56x56 -> 64 at one thread on a Sapphire Rapids Xeon:
 * 14.3 ms against 18.7-22 with the image row in the lanes, whose loads
 * straddle the row's pad and need 3 shifted copies per weight):
 *   kv.o outer... i j.o red... j.i kv.i
 * kv.i 32 channels (2 vectors; 16 where 32 does not divide) x j.i tw
 * output columns (tw * kv.i / 16 <= 28 accumulators), each FMA a
 * broadcast image element times a vector of weights; the weights of
 * the kv.o block copied at the parallel loop (kv.o fused with the first
 * outer loop) with the channel dimension last (cache_read's layout
 * rule), a guarded image's rows copied zero-padded at i.  0 where the
 * shape does not suit it (the row-lane stencil then). */
static int chan_stencil_nest(nf_schedule *s, const nf_graph *g, int st_i, const stencil *sc,
                             char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ek = t->shape[sc->kv], ej = t->shape[rank - 1];
  if (nf__sched_acc_regs(s) < 16 || ek % 16 != 0 || !g->tensors[sc->wt->u.tensor].name) return 0;
  int64_t kvi = ek % 32 == 0 ? 32 : 16, tw = divisor_in(ej, 4, 28 * 16 / kvi);
  if (!tw && kvi == 32) tw = divisor_in(ej, 4, 28), kvi = 16;
  if (!tw) return 0;
  /* the weights' block (kv.i x the reduction's extent) stays in L2 */
  int64_t wb = kvi;
  for (int q = 0; q < st->n_red; q++) wb *= st->red_ext[q];
  if (wb * 4 > (1 << 20)) return 0;
  const char *kv = nm[sc->kv], *i = nm[rank - 2], *j = nm[rank - 1];
  char par[NF_SCHED_NAME], jo[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(jo, j, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, kvi)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tw)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  int first_outer = -1;
  for (int v = 0; v < rank - 2; v++)
    if (v != sc->kv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      if (first_outer < 0) first_outer = v;
    }
  nf__sched_cat(it.names[it.n_names++], i, "");
  nf__sched_cat(it.names[it.n_names++], jo, "");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, kv, ".o");
  if (first_outer >= 0) {
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, par, nm[first_outer])) < 0) return rc;
    nf__sched_cat(tmp, par, ".");
    nf__sched_cat(tmp, tmp, nm[first_outer]);
    nf__sched_cat(par, tmp, ".fused");
  }
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, jo, 0)) < 0) return rc;
  if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, par, g->tensors[sc->wt->u.tensor].name)) < 0)
    return rc;
  if (sc->guarded && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, i, g->tensors[sc->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, kv, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) return rc;
  return 1;
}

/* A convolution's weight gradient: dW(.., k, c, .., r, s) += [c ?]
 * D(.., k, .., h, w) * A(.., c, .., h + r, w + s) [: 0], where w is the
 * variable rf_var_default keeps in vector lanes (both operands' last
 * index), the image A's last index adds an output variable (s) to it,
 * the gradient D uses an output variable kv (k) that A does not and A one
 * (cv: c) that D does not, and A's next-to-last index adds another
 * reduction variable rh (h) to an output variable. */
typedef struct wgrad {
  int kv, cv, rh, rw;
  int64_t hb;
  const nf_expr *img, *grad;
  int guarded;
} wgrad;

static int wgrad_of(const nf_graph *g, uint32_t si, wgrad *wg) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red != NF_RED_SUM || st->n_red < 2 || rank < 3 || tiled_by_default(g, si)) return 0;
  int rw = rf_var_default(g, si);
  if (rw < 0) return 0;
  const nf_expr *e = padded_product(st->rhs, &wg->guarded);
  if (!e) return 0;
  uint32_t w = (uint32_t)(rank + rw);
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side], *d = e->args[1 - side];
    if (a->op != NF_OP_ACCESS || d->op != NF_OP_ACCESS || a->n_args < 2 || d->n_args < 2 ||
        !g->tensors[a->u.tensor].name)
      continue;
    const nf_expr *al = a->args[a->n_args - 1], *an = a->args[a->n_args - 2];
    int out_in_last = 0;
    for (int v = 0; v < rank; v++) out_in_last |= nf__sched_uses_var(al, (uint32_t)v);
    if (!nf__sched_uses_var(al, w) || !out_in_last || !nf__sched_uses_var(d->args[d->n_args - 1], w)) continue;
    int kv = -1, cv = -1, rh = -1;
    for (int v = 0; v < rank; v++) {
      int ua = nf__sched_uses_var(a, (uint32_t)v), ud = nf__sched_uses_var(d, (uint32_t)v);
      if (kv < 0 && !ua && ud && t->shape[v] % 4 == 0) kv = v;
      if (cv < 0 && ua && !ud && t->shape[v] % 2 == 0 && !nf__sched_uses_var(al, (uint32_t)v) &&
          !nf__sched_uses_var(an, (uint32_t)v))
        cv = v;
    }
    for (int q = 0; q < st->n_red && rh < 0; q++)
      if (q != rw && nf__sched_uses_var(an, (uint32_t)(rank + q)) && nf__sched_uses_var(d, (uint32_t)(rank + q)))
        rh = q;
    if (kv < 0 || cv < 0 || rh < 0) continue;
    int64_t hb = 0;
    for (int64_t b = 16; b >= 4 && !hb; b--)
      if (st->red_ext[rh] % b == 0) hb = b;
    if (!hb) continue;
    *wg = (wgrad){.kv = kv, .cv = cv, .rh = rh, .rw = rw, .hb = hb, .img = a, .grad = d,
                  .guarded = wg->guarded};
    return 1;
  }
  return 0;
}

/* The weight-gradient tile (3x3, 8x64x56x56 images at one thread: 31 ms,
 * against 37.5 through im2col and OpenBLAS and 92 with lanes alone):
 *   cv.o red... rh.o kv.o out... rh.i rw.o kv.i cv.i rw.i
 * 4 x 2 outputs (kv x cv) with w's partial sums in 8 lanes each (rfactor
 * rw.i), accumulated over blocks of hb rows (rh.i) and the row (rw.o),
 * continued across the outer reduction loops; the image's rows of the
 * block copied (zero-padded where guarded) at rh.o; cv.o parallel. */
static int wgrad_nest(nf_schedule *s, const nf_graph *g, int st_i, const wgrad *wg,
                      char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  int rank = g->tensors[st->out].rank, rc;
  int64_t e = st->red_ext[wg->rw], lanes = e % 8 == 0 ? 8 : e % 4 == 0 ? 4 : 8;
  const char *kv = nm[wg->kv], *cv = nm[wg->cv], *rh = nm[rank + wg->rh],
             *rw = nm[rank + wg->rw];
  char rho[NF_SCHED_NAME], rwi[NF_SCHED_NAME], cvo[NF_SCHED_NAME], cw[NF_SCHED_NAME];
  nf__sched_cat(rho, rh, ".o");
  nf__sched_cat(rwi, rw, ".i");
  nf__sched_cat(cvo, cv, ".o");
  /* 4 x 2 (k, c) outputs of one vector each; 4 x 4 where 16 accumulators
   * fit (AVX-512: 8x64x56x56 with a 3x3 kernel, 26-28.6 ms against 33.4
   * with 4 x 2 on a Xeon; 8 x 4 spilled: 49.7) */
  int64_t tc = nf__sched_acc_regs(s) >= 16 && g->tensors[st->out].shape[wg->cv] % 4 == 0 ? 4 : 2;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, 4)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cv, tc)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rh, wg->hb)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rw, lanes)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], cvo, "");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != wg->rh && ord[q] != wg->rw)
      nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], rho, "");
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  nf__sched_cat(cw, kv, ".o");
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      nf__sched_cat(cw, nm[v], ""); /* the tile's loop: the last of them */
    }
  nf__sched_cat(it.names[it.n_names++], rh, ".i");
  nf__sched_cat(it.names[it.n_names++], rw, ".o");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  nf__sched_cat(it.names[it.n_names++], cv, ".i");
  nf__sched_cat(it.names[it.n_names++], rwi, "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cw, 0)) < 0) return rc;
  if (wg->guarded &&
      (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[wg->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, rwi, 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, cvo, 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, rwi, 0);
}

/* The weight gradient with output channels in the lanes (AVX-512, the
 * kv extent a multiple of 16; 3x3, 8x64x56x56 at one thread on a
 * Sapphire Rapids Xeon: 15.0 ms against 26.3 with w's partial sums in
 * the lanes):
 *   kv.o red... rh.o cv rh.i rw out... kv.i
 * the tile is every other output (the kernel's r x s) times kv.i 32
 * channels (2 vectors, or 16), at most 24 accumulators, each FMA a
 * broadcast image element times a vector of the gradient D; D's block
 * (kv.i x hb rows x the row) copied at rh.o with the channel last, a
 * guarded image's rows copied zero-padded there too; kv.o parallel.
 * (Splitting cv and fusing cv.o with kv.o, for more parallel iterations,
 * was slower at 1 and 2 threads: 38.6 and 21.9 ms against 26.9 and
 * 19.3 on a Skylake Xeon.) */
static int chan_wgrad_nest(nf_schedule *s, const nf_graph *g, int st_i, const wgrad *wg,
                           const nf_expr *d, char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ek = t->shape[wg->kv], other = 1;
  if (nf__sched_acc_regs(s) < 16 || ek % 16 != 0 || !g->tensors[d->u.tensor].name) return 0;
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) other *= t->shape[v];
  int64_t kvi = ek % 32 == 0 && other * 2 <= 24 ? 32 : 16;
  if (other * (kvi / 16) > 24) return 0;
  int64_t hb = divisor_in(st->red_ext[wg->rh], 4, 28);
  if (!hb) return 0;
  const char *kv = nm[wg->kv], *cv = nm[wg->cv], *rh = nm[rank + wg->rh],
             *rw = nm[rank + wg->rw];
  char par[NF_SCHED_NAME], rho[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(rho, rh, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, kvi)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rh, hb)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != wg->rh && ord[q] != wg->rw)
      nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], rho, "");
  nf__sched_cat(it.names[it.n_names++], cv, "");
  nf__sched_cat(it.names[it.n_names++], rh, ".i");
  nf__sched_cat(it.names[it.n_names++], rw, "");
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, kv, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cv, 0)) < 0) return rc;
  if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[d->u.tensor].name)) < 0) return rc;
  if (wg->guarded &&
      (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[wg->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, kv, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) return rc;
  return 1;
}

/* For a register-tiled sum of rank >= 3 whose term is a padded product
 * `c ? A(..) * B(..) : 0` where the image A reads along the last output
 * variable and a reduction variable (w + s) and no reduction variable
 * indexes A before its last two dimensions (one plane of A per iteration
 * of the loop outside the tile's rows: a depthwise convolution), A's
 * access: the default copies that plane zero-padded at that loop
 * (cache_read), so that the tile's loads need no mask (the depthwise
 * forward 16x128x28x28 at one thread: 5.3 -> 2.9 ms).  Else NULL. */
static const nf_expr *padded_plane(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  int rank = g->tensors[st->out].rank;
  int guarded;
  const nf_expr *e = padded_product(st->rhs, &guarded);
  if (st->red != NF_RED_SUM || rank < 3 || !e || !guarded) return NULL;
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side];
    if (a->op != NF_OP_ACCESS || a->n_args < 2 || !g->tensors[a->u.tensor].name) continue;
    const nf_expr *last = a->args[a->n_args - 1];
    if (!nf__sched_uses_var(last, (uint32_t)(rank - 1)) || !uses_red(last, rank, st->n_red)) continue;
    int ok = 1;
    for (int d = 0; d + 2 < a->n_args && ok; d++) ok = !uses_red(a->args[d], rank, st->n_red);
    if (ok) return a;
  }
  return NULL;
}

int nf__sched_default_plain(const nf_graph *g, const nf_sched_target *t, int use_stencil,
                            int *n_stencil, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  int rc = NF_OK;
  *out = NULL;
  if (!s) return NF_ENOMEM;
  s->n_stmts = g->n_stmts;
  s->acc_regs = t && t->vector_regs == 32 ? 16 : 8;
  int32_t *epi_prod = malloc((g->n_stmts ? g->n_stmts : 1) * sizeof *epi_prod);
  if (!epi_prod) {
    nf_schedule_free(s);
    return NF_ENOMEM;
  }
  for (uint32_t si = 0; si < g->n_stmts; si++) epi_prod[si] = -1;
  for (uint32_t si = 0; si < g->n_stmts; si++) {
    int c = epilogue_of(g, si);
    if (c >= 0) epi_prod[c] = (int32_t)si;
  }
  for (uint32_t si = 0; si < g->n_stmts && rc == NF_OK; si++) {
    const nf_stmt *st = &g->stmts[si];
    const nf_tensor *t = &g->tensors[st->out];
    int rank = t->rank, st_i = (int)si;
    if (nf__sched_inlined_by_default(g, si)) {
      rc = nf__sched_add1(s, st_i, NF_SCH_INLINE, NULL, 0);
      continue;
    }
    char nm[NF_MAX_VARS][NF_SCHED_NAME], a[NF_SCHED_NAME], b[NF_SCHED_NAME];
    for (int k = 0; k < rank + st->n_red; k++) nf__sched_var_name(st, k, nm[k]);
    int64_t ei = rank >= 2 ? t->shape[rank - 2] : 0, ej = rank >= 1 ? t->shape[rank - 1] : 0;
    int ec = epilogue_of(g, si);
    if (ec >= 0 && use_stencil) {
      /* a product tile computed panel by panel at its epilogue's loop */
      rc = nf__sched_gemm_fused(s, g, (int)si, ec, 0);
      if (rc != 0) {
        if (rc > 0) (*n_stencil)++;
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    if (ec >= 0) {
      /* the reduction is computed tile by tile inside its epilogue's
       * register tile (the epilogue's j.o loop), reduction loops outside
       * the tile's: batch... red... i j, j vectorized */
      const nf_stmt *cs = &g->stmts[ec];
      char cj[NF_SCHED_NAME], jo[NF_SCHED_NAME];
      nf__sched_var_name(cs, rank - 1, cj);
      nf__sched_cat(jo, cj, ".o");
      nf_sched_item it;
      memset(&it, 0, sizeof it);
      it.kind = NF_SCH_COMPUTE_AT;
      it.stmt = st_i;
      it.stmt2 = ec;
      it.n_names = 1;
      nf__sched_cat(it.names[0], jo, "");
      rc = nf_schedule_add(s, &it);
      memset(&it, 0, sizeof it);
      it.kind = NF_SCH_REORDER;
      it.stmt = st_i;
      for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
      for (int k = 0; k < st->n_red; k++) nf__sched_cat(it.names[it.n_names++], nm[rank + k], "");
      nf__sched_cat(it.names[it.n_names++], nm[rank - 2], "");
      nf__sched_cat(it.names[it.n_names++], nm[rank - 1], "");
      if (rc == NF_OK) rc = nf_schedule_add(s, &it);
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, nm[rank - 1], 0);
      continue;
    }
    if (epi_prod[si] >= 0 && use_stencil) {
      rc = nf__sched_gemm_fused(s, g, epi_prod[si], (int)si, 1);
      if (rc != 0) {
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    if (epi_prod[si] >= 0) {
      /* the fused epilogue: the producer's register tile */
      int64_t ti, tj;
      reg_tile(ei, ej, &ti, &tj);
      rc = tile_nest(s, st_i, nm, rank, NULL, 0, ti, tj);
      continue;
    }
    if (use_stencil) {
      /* a product of two plain accesses: the product tile */
      rc = nf__sched_gemm(s, g, st_i, nm);
      if (rc != 0) {
        if (rc > 0) (*n_stencil)++;
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    stencil sc;
    if (use_stencil && stencil_of(g, si, &sc)) {
      rc = chan_stencil_nest(s, g, st_i, &sc, nm);
      if (rc == 0) rc = stencil_nest(s, g, st_i, &sc, nm);
      else if (rc > 0) rc = NF_OK;
      (*n_stencil)++;
      continue;
    }
    if (tiled_by_default(g, si)) {
      /* register tile: ... i.o j.o red... i.i j.i, accumulate in a tile */
      int64_t ti, tj;
      reg_tile(ei, ej, &ti, &tj);
      rc = tile_nest(s, st_i, nm, rank, &nm[rank], st->n_red, ti, tj);
      nf__sched_cat(a, nm[rank - 1], ".o");
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, a, 0);
      const nf_expr *pl;
      if (rc == NF_OK && use_stencil && (pl = padded_plane(g, si)) != NULL) {
        rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, nm[rank - 3], g->tensors[pl->u.tensor].name);
        (*n_stencil)++;
      }
      continue;
    }
    wgrad wg;
    if (use_stencil && wgrad_of(g, si, &wg)) {
      rc = chan_wgrad_nest(s, g, st_i, &wg, wg.grad, nm);
      if (rc == 0) rc = wgrad_nest(s, g, st_i, &wg, nm);
      else if (rc > 0) rc = NF_OK;
      (*n_stencil)++;
      continue;
    }
    int rfk = rf_var_default(g, si);
    if (rfk >= 0) {
      rc = rf_nest(s, g, st_i, rfk, nm);
      continue;
    }
    if (rank == 0) continue;
    int vec = st->n_red == 0 && ej >= 8;
    const char *j = nm[rank - 1];
    if (vec) {
      rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, 8);
      nf__sched_cat(b, j, ".i");
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, b, 0);
    }
    /* parallel outer loop: the first output variable, fused with the
     * second when it is small */
    char outer[NF_SCHED_NAME];
    nf__sched_cat(outer, nm[0], rank == 1 && vec ? ".o" : "");
    if (rank >= 2 && t->shape[0] < 16) {
      char second[NF_SCHED_NAME];
      nf__sched_cat(second, nm[1], rank == 2 && vec ? ".o" : "");
      if (rc == NF_OK) rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, outer, second);
      nf__sched_cat(a, outer, ".");
      nf__sched_cat(b, a, second);
      nf__sched_cat(outer, b, ".fused");
    }
    if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, outer, 0);
  }
  free(epi_prod);
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}
