/* sched_gpu.c - the tier-1 GPU schedule (nf_lower.h): one thread per
 * output element, shared-memory tiles for products and block reductions
 * where they apply (docs/schedules.md); lower.c checks the tiles by
 * lowering once (nf_schedule_default_gpu).  The search's GPU knobs
 * (nf_schedule_gpu) vary the same policy. */
#include <stdlib.h>
#include <string.h>

#include "nf_lower.h"

/* ---- the GPU default ---- */

/* One thread per output element: a statement's output loops are fused
 * (as far as the fused name fits), split by the block size, the outer
 * part bound to blocks and the inner to threads; its reduction loops run
 * in order inside the thread (the summation order of the interpreter),
 * accumulating in a register (cache_write at the thread loop).
 * Elementwise producers read once are inlined as on CPUs.  A statement
 * with a scalar output runs on one thread (the executor's tier 0 has no
 * cross-thread reduction yet).  This is the tier-1 GPU kernel: simple,
 * coalesced along the innermost output dimension, and correct for every
 * graph lowering accepts; the search's GPU sketches go further. */
/* a * b for extents, saturating at 2^62 */
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) || r > (INT64_C(1) << 62) ? INT64_C(1) << 62 : r;
}

/* The tensors statement si reads that have buffers (graph inputs, outputs
 * of statements not inlined), each once, into ids (at most cap). */
static int stored_reads(const nf_graph *g, uint32_t si, uint32_t *ids, int cap) {
  const nf_expr *stack[512];
  int sp = 0, n = 0;
  stack[sp++] = g->stmts[si].rhs;
  while (sp > 0) {
    const nf_expr *e = stack[--sp];
    if (e->op == NF_OP_ACCESS) {
      uint32_t t = e->u.tensor;
      int seen = 0, inlined = 0;
      for (int k = 0; k < n; k++) seen |= ids[k] == t;
      for (uint32_t q = 0; q < g->n_stmts; q++)
        if (g->stmts[q].out == t) inlined = nf__sched_inlined_by_default(g, q);
      if (!seen && !inlined && n < cap) ids[n++] = t;
    }
    for (int i = e->n_args - 1; i >= 0; i--) { /* left operands first */
      if (sp == 512) return -1;
      stack[sp++] = e->args[i];
    }
  }
  return n;
}

/* The virtual threads along one axis of a shared-memory tile of b
 * outputs, t per thread: the largest of vt, vt / 2, vt / 4, ... (at least
 * 1) that divides t and b, where t divides b (the thread's outputs are
 * then vt chunks of t / vt, one in each b / vt part of the tile). */
static int64_t gpu_vthreads(int64_t vt, int64_t b, int64_t t) {
  if (vt < 1 || t < 1 || b % t != 0) return 1;
  while (vt > 1 && (t % vt != 0 || b % vt != 0)) vt /= 2;
  return vt;
}

/* A reduction over a 2-d (or batched) output of at least 16 x 16: blocks
 * of 32 x 32 outputs (or 16 where the extent is under 32), 16 x 16
 * threads of 2 x 2 outputs each, accumulated in registers; the first
 * reduction loop split by 16, its outer part at the block level, where
 * the block stages the operands it reads in shared memory (cache_read,
 * the copies shared by the block's threads).  Loops keep the IR's order
 * of summation.
 *
 * With virtual threads (kn->vthread = v > 1 along an axis, see
 * gpu_vthreads) the block's b outputs along the axis are dealt in v
 * interleaved chunks: split i.i by b / v (i.i.o, the v loop, and i.i.i),
 * i.i.i by t / v (i.i.i.o, the thread loop, and i.i.i.i), so that thread
 * u computes i = w * (b / v) + u * (t / v) + e for w < v, e < t / v:
 * neighbouring threads read neighbouring rows of the staged tile.  The v
 * loops go inside the reduction loops, just outside the thread's own
 * outputs; its register tile (cache_write at the thread loop) is compact,
 * thr_i x thr_j cells, not the bounding box of the chunks (lower.c,
 * tile_dim). */
static int gpu_tiled(nf_schedule *s, const nf_graph *g, uint32_t si, const nf_gpu_knobs *kn) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, st_i = (int)si, rc;
  int64_t ei = t->shape[rank - 2], ej = t->shape[rank - 1];
  char nm[NF_MAX_VARS][NF_SCHED_NAME];
  for (int k = 0; k < rank + st->n_red; k++) nf__sched_var_name(st, k, nm[k]);
  const char *r = nm[rank];
  int64_t bi = kn->tile_i > 0 ? kn->tile_i : ei >= 32 ? 32 : 16;
  int64_t bj = kn->tile_j > 0 ? kn->tile_j : ej >= 32 ? 32 : 16;
  int64_t ti = kn->thr_i > 0 ? kn->thr_i : 2, tj = kn->thr_j > 0 ? kn->thr_j : 2;
  int64_t kt0 = kn->kt > 0 ? kn->kt : 16;
  int64_t kt = st->red_ext[0] < kt0 ? st->red_ext[0] : kt0;
  int64_t b[2] = {bi, bj}, th[2] = {ti, tj}, v[2];
  for (int a = 0; a < 2; a++) v[a] = gpu_vthreads(kn->vthread, b[a], th[a]);
  /* the reorder names every loop: keep within a primitive's names */
  if (rank + st->n_red + 5 + (v[0] > 1) + (v[1] > 1) > NF_SCHED_MAX_NAMES) v[0] = v[1] = 1;
  /* per axis: the block loop, the thread loop, the v loop (or ""), the
   * thread's own outputs */
  char blk[2][NF_SCHED_NAME], thr[2][NF_SCHED_NAME], vl[2][NF_SCHED_NAME], own[2][NF_SCHED_NAME];
  for (int a = 0; a < 2; a++) {
    const char *x = nm[rank - 2 + a];
    char in[NF_SCHED_NAME], rest[NF_SCHED_NAME];
    nf__sched_cat(blk[a], x, ".o");
    nf__sched_cat(in, x, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, x, b[a])) < 0) return rc;
    vl[a][0] = '\0';
    if (v[a] > 1) {
      nf__sched_cat(vl[a], in, ".o");
      nf__sched_cat(rest, in, ".i");
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, in, b[a] / v[a])) < 0) return rc;
    } else {
      memcpy(rest, in, NF_SCHED_NAME);
    }
    nf__sched_cat(thr[a], rest, ".o");
    nf__sched_cat(own[a], rest, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rest, th[a] / v[a])) < 0) return rc;
  }
  char ro[NF_SCHED_NAME], ri[NF_SCHED_NAME];
  nf__sched_cat(ro, r, ".o");
  nf__sched_cat(ri, r, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, r, kt)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
  nf__sched_cat(it.names[it.n_names++], blk[0], "");
  nf__sched_cat(it.names[it.n_names++], blk[1], "");
  nf__sched_cat(it.names[it.n_names++], ro, "");
  nf__sched_cat(it.names[it.n_names++], thr[0], "");
  nf__sched_cat(it.names[it.n_names++], thr[1], "");
  nf__sched_cat(it.names[it.n_names++], ri, "");
  for (int q = 1; q < st->n_red; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + q], "");
  for (int a = 0; a < 2; a++)
    if (v[a] > 1) nf__sched_cat(it.names[it.n_names++], vl[a], "");
  nf__sched_cat(it.names[it.n_names++], own[0], "");
  nf__sched_cat(it.names[it.n_names++], own[1], "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  for (int k = 0; k < rank - 2; k++)
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, nm[k], 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, blk[0], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, blk[1], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, thr[0], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, thr[1], 0)) < 0)
    return rc;
  uint32_t ids[8];
  int n = kn->stage < 0 ? 0 : stored_reads(g, si, ids, 8);
  for (int k = 0; k < n; k++)
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, ro, g->tensors[ids[k]].name)) < 0) return rc;
  /* the thread's outputs along j, 2 or 4 of them: one vector access of
   * each operand row they read (the backend's vector loads) */
  int64_t oj = th[1] / v[1];
  if (kn->vec >= 0 && (oj == 2 || oj == 4) &&
      (rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, own[1], 0)) < 0)
    return rc;
  return nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, thr[1], 0);
}

/* nf__sched_gpu_plain: nf_lower.h */

/* A reduction to a scalar over at least 512 terms: its reduction loops
 * fused and dealt to one block of 256 threads (thread t takes terms t,
 * t + 256, ...), each thread's partial sum in a slot of a shared tile
 * (rfactor of the thread loop, the tile at an outer loop of one
 * iteration), the slots folded in order at the end. */
static int gpu_block_reduce(nf_schedule *s, const nf_graph *g, uint32_t si, int threads) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int st_i = (int)si, rc = NF_OK, rank = t->rank;
  char cur[NF_SCHED_NAME], nm[NF_SCHED_NAME], a[NF_SCHED_NAME], b[NF_SCHED_NAME];
  char out[NF_SCHED_NAME] = "";
  /* outputs (rank > 0: a reduction across threads per output): fused,
   * one block each */
  for (int k = 0; k < rank && rc >= 0; k++) {
    nf__sched_var_name(st, k, nm);
    if (k == 0) {
      memcpy(out, nm, sizeof nm);
      continue;
    }
    char fn[3 * NF_SCHED_NAME];
    snprintf(fn, sizeof fn, "%s.%s.fused", out, nm);
    if (strlen(fn) >= NF_SCHED_NAME) return NF_ELIMIT;
    rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, out, nm);
    memcpy(out, fn, strlen(fn) + 1);
  }
  nf__sched_var_name(st, rank, cur);
  int64_t ext = st->red_ext[0];
  for (int k = 1; k < st->n_red && rc >= 0; k++) {
    nf__sched_var_name(st, rank + k, nm);
    char fn[3 * NF_SCHED_NAME];
    snprintf(fn, sizeof fn, "%s.%s.fused", cur, nm);
    if (strlen(fn) >= NF_SCHED_NAME) return NF_ELIMIT;
    rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, cur, nm);
    memcpy(cur, fn, strlen(fn) + 1);
    ext = sat_mul(ext, st->red_ext[k]);
  }
  int64_t per = (ext + threads - 1) / threads; /* terms per thread */
  char o[NF_SCHED_NAME], i[NF_SCHED_NAME];
  nf__sched_cat(o, cur, ".o");
  nf__sched_cat(i, cur, ".i");
  nf__sched_cat(a, o, ".o"); /* one iteration: holds the tile */
  nf__sched_cat(b, o, ".i");
  if (rc < 0 || (rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cur, threads)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, o, per)) < 0)
    return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  if (rank > 0) nf__sched_cat(it.names[it.n_names++], out, "");
  nf__sched_cat(it.names[it.n_names++], a, "");
  nf__sched_cat(it.names[it.n_names++], i, "");
  nf__sched_cat(it.names[it.n_names++], b, "");
  if ((rc = nf_schedule_add(s, &it)) < 0 || (rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, a, 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, i, 0)) < 0)
    return rc;
  if (rank > 0 && (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, out, 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, i, 0);
}

int nf_schedule_gpu(const nf_graph *g, const nf_gpu_knobs *kn, nf_schedule **out) {
  int n_tiled = 0;
  return nf__sched_gpu_plain(g, NF_GPU_DEFAULT_THREADS, 1, kn, &n_tiled, out);
}

int nf_schedule_gpu_tileable(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  if (nf__sched_inlined_by_default(g, si)) return 0;
  if (st->red == NF_RED_NONE || st->n_red == 0) return 0;
  int64_t terms = 1, outs = 1;
  for (int k = 0; k < st->n_red; k++) terms = sat_mul(terms, st->red_ext[k]);
  for (int k = 0; k < t->rank; k++) outs = sat_mul(outs, t->shape[k]);
  if (t->rank >= 2 && t->shape[t->rank - 2] >= 16 && t->shape[t->rank - 1] >= 16) return 1;
  if (t->rank == 0 && terms >= 512) return 2;
  /* few outputs, each a long sum: one block per output, its threads
   * sharing the terms (else a handful of threads would do all the work) */
  if (t->rank >= 1 && terms >= 512 && outs <= 65536 && outs * 8 <= terms) return 3;
  return 0;
}

int nf__sched_gpu_plain(const nf_graph *g, int block0, int tiled, const nf_gpu_knobs *kns,
                        int *n_tiled, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  int rc = NF_OK;
  *out = NULL;
  *n_tiled = 0;
  if (!s) return NF_ENOMEM;
  if (block0 < 32 || block0 > 1024) block0 = 256;
  s->n_stmts = g->n_stmts;
  static const nf_gpu_knobs none;
  for (uint32_t si = 0; si < g->n_stmts && rc >= 0; si++) {
    const nf_stmt *st = &g->stmts[si];
    const nf_tensor *t = &g->tensors[st->out];
    int rank = t->rank, st_i = (int)si;
    const nf_gpu_knobs *kn = kns ? &kns[si] : &none;
    int block = kn->block >= 32 && kn->block <= 1024 ? kn->block : block0;
    if (nf__sched_inlined_by_default(g, si)) {
      rc = nf__sched_add1(s, st_i, NF_SCH_INLINE, NULL, 0);
      continue;
    }
    int form = tiled && kn->tiled >= 0 ? nf_schedule_gpu_tileable(g, si) : 0;
    /* the search may ask for a reduction across threads (tiled 2) for any
     * reduction with outputs */
    if (tiled && kn->tiled == 2 && st->red != NF_RED_NONE && st->n_red > 0 && rank >= 1) form = 3;
    if (form == 3) {
      rc = gpu_block_reduce(s, g, si, kn->block >= 32 && kn->block <= 1024 ? kn->block : 256);
      ++*n_tiled;
      continue;
    }
    if (form == 1) {
      rc = gpu_tiled(s, g, si, kn);
      ++*n_tiled;
      continue;
    }
    if (form == 2) {
      rc = gpu_block_reduce(s, g, si, kn->block >= 32 && kn->block <= 1024 ? kn->block : 256);
      ++*n_tiled;
      continue;
    }
    if (rank == 0) continue;
    char cur[NF_SCHED_NAME], nm[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
    /* an elementwise statement whose rows split into fours (or twos):
     * each thread takes 4 (2) neighbouring outputs, a vector loop (the
     * backend's vector loads and stores); the loops below are then the
     * outer ones and the last one's outer part (last.o, ext / w) */
    int64_t w = 0, last = t->shape[rank - 1];
    char lastn[NF_SCHED_NAME];
    nf__sched_var_name(st, rank - 1, lastn);
    if (kn->vec >= 0 && (st->red == NF_RED_NONE || st->n_red == 0) && strlen(lastn) + 2 < NF_SCHED_NAME)
      w = last % 4 == 0 ? 4 : last % 2 == 0 ? 2 : 0;
    if (w) {
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, lastn, w)) < 0) break;
      nf__sched_cat(tmp, lastn, ".i");
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) break;
      last /= w;
    }
    int64_t all = 1;
    for (int k = 0; k < rank - 1; k++) all = sat_mul(all, t->shape[k]);
    all = sat_mul(all, last);
    if (all <= 0) continue;
    /* blocks of tb threads that divide the outputs exactly (no guard),
     * the largest such size up to `block`, at least 32 */
    int64_t tb = all <= block ? all : 0;
    for (int64_t c = block; !tb && c >= 32; c--)
      if (all % c == 0) tb = c;
    int fuse_to = tb ? rank : rank - 1; /* without: the last loop split alone */
    if (rank == 1 && w) nf__sched_cat(cur, lastn, ".o");
    else nf__sched_var_name(st, 0, cur);
    int fused = 1;
    for (int k = 1; k < fuse_to && rc >= 0; k++) {
      if (k == rank - 1 && w) nf__sched_cat(nm, lastn, ".o");
      else nf__sched_var_name(st, k, nm);
      char fn[3 * NF_SCHED_NAME];
      snprintf(fn, sizeof fn, "%s.%s.fused", cur, nm);
      if (strlen(fn) >= NF_SCHED_NAME) break; /* the rest stay serial in the thread */
      rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, cur, nm);
      memcpy(cur, fn, strlen(fn) + 1);
      fused = k + 1;
    }
    if (rc < 0) break;
    if (!tb && fused == rank - 1 && rank > 1) {
      /* the outer loops' iterations are blocks; the last loop is split
       * into blocks of threads with one guard on it */
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, cur, 0)) < 0) break;
      if (w) nf__sched_cat(cur, lastn, ".o");
      else nf__sched_var_name(st, rank - 1, cur);
      tb = last < block ? last : block;
    } else {
      int64_t ext = 1;
      for (int k = 0; k < fused; k++) ext = sat_mul(ext, k == rank - 1 ? last : t->shape[k]);
      if (!tb || ext % tb != 0) tb = ext < block ? ext : block; /* one guard */
    }
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cur, tb)) < 0) break;
    nf__sched_cat(tmp, cur, ".o");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, tmp, 0)) < 0) break;
    nf__sched_cat(tmp, cur, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, tmp, 0)) < 0) break;
    /* a reduction accumulates in a register of its thread and stores once
     * (no separate pass that fills the output with the identity) */
    if (rc >= 0 && st->red != NF_RED_NONE) rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, tmp, 0);
  }
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}
