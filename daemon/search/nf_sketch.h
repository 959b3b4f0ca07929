/* nf_sketch.h - the schedule search space of one graph (daemon/search).
 *
 * Sketches come from the graph's structure (Ansor-style rules):
 *  - a single-use elementwise local statement is inlined (always);
 *  - every other statement gets a multi-level tiled nest: each spatial
 *    variable split into three levels S0 (outer) S1 (middle) S2 (inner,
 *    the register tile) and each reduction variable into two, R0 and R1,
 *    ordered by one of two templates
 *        tmpl 0:  S0 S1 R S2       (reduction whole)
 *        tmpl 1:  S0 R0 S1 R1 S2   (reduction blocked)
 *    with the last output variable innermost and vectorized, the leading
 *    spatial loops fused and made parallel, and reduction results
 *    accumulated in the register tile S2 (cache_write at the loop just
 *    outside the innermost reduction group; with R0 outside, each tile
 *    continues the output's partial sums);
 *  - a reduction read once by an elementwise statement (linear's XW + b,
 *    conv + bias) may be computed at that consumer's S0 or S1 tile (a
 *    fused epilogue), its own nest then tiling the region;
 *  - a reduction may keep partial results in vector lanes (rfactor): one
 *    reduction variable split by 4, 8 or 16, its inner part innermost and
 *    vectorized, the tile holding a slot per lane (a depthwise
 *    convolution's weight gradient: few outputs, long sums);
 *  - every tensor a tiled statement reads may be packed (cache_read) at
 *    the end of S0, R0 or S1;
 *  - any statement may keep the default schedule's primitives instead
 *    (NF_SK_DEFAULT): in a graph of many statements a point then tunes a
 *    few of them at a time and keeps the tier-1 arrangement elsewhere.
 * A point of the space (nf_sk_point) fixes the annotations: the template,
 * tile sizes (from the extents' divisors and powers of two, so
 * non-dividing tiles with tails occur), how many loops are fused for
 * parallelism, vectorization, packing and epilogue fusion.  Sampling,
 * mutation and crossover produce points; nf_sk_schedule turns a point
 * into a schedule (nf_lower.h) that lowering then checks: a point whose
 * schedule does not lower is illegal and dropped by the search.
 *
 * Everything is deterministic for a given random state. */
#ifndef NF_SKETCH_H
#define NF_SKETCH_H

#include <stdint.h>

#include "nf_ir.h"
#include "nf_lower.h"

#define NF_SK_MAX_READS 4 /* tensors of one statement that may be packed */

typedef enum nf_sk_role {
  NF_SK_FIXED = 0, /* no primitives (rank-0 output, empty nest) */
  NF_SK_INLINE,    /* compute_inline */
  NF_SK_NEST,      /* a tiled nest of its own */
  NF_SK_AT,        /* computed at its consumer's tile (epilogue fusion) */
  NF_SK_DEFAULT    /* the default (tier-1) schedule's primitives for it */
} nf_sk_role;

/* The annotations of one statement. */
typedef struct nf_sk_gene {
  uint8_t role;     /* nf_sk_role */
  uint8_t tmpl;     /* 0 or 1 (above); reductions only */
  uint8_t n_par;    /* leading spatial loops fused and made parallel */
  uint8_t vec;      /* vectorize the innermost loop (when its extent fits) */
  uint8_t at_level; /* NF_SK_AT: the consumer's last S0 (0) or S1 (1) loop */
  uint8_t pack[NF_SK_MAX_READS]; /* 0 none, 1 end of S0, 2 R0, 3 S1 */
  uint8_t rf;       /* reductions: 0, or 1 + v: reduction variable v split
                       by f[rank + v][1] lanes, the inner part innermost,
                       rfactored and vectorized (partial results in the
                       tile, one slot per lane) */
  int64_t f[NF_MAX_VARS][2];     /* spatial: {S1, S2} factors; reduction:
                                    {R1, unused} */
} nf_sk_gene;

typedef struct nf_sk_point {
  uint32_t n; /* the graph's statement count */
  nf_sk_gene *g;
} nf_sk_point;

typedef struct nf_sk_space nf_sk_space;

/* Analyses g (which must outlive the space) for target t (the default
 * schedule the space keeps, NF_SK_DEFAULT).  NF_OK or NF_ENOMEM. */
int nf_sk_space_new(const nf_graph *g, const nf_sched_target *t, nf_sk_space **out);
void nf_sk_space_free(nf_sk_space *sp);
/* Number of statements whose genes vary (0: nothing to search). */
int nf_sk_space_n_tunable(const nf_sk_space *sp);

/* The space's shape, for finding similar subgraphs (the cache's shapes,
 * docs/search.md "Warm start"): sig (16 bytes) is a hash of the sketch
 * class and loop structure of every statement (its role: inlined, fixed,
 * tiled, and the epilogue it may fuse into; its output rank, reduction
 * variables and combiner; for each tensor access, which tensor it reads
 * by position and which variables each index uses), blind to extents,
 * constants, names and scalar operators: a matmul of other sizes, or with
 * another activation in its epilogue, has the same signature.  desc gets
 * the log2 extents of every tiled statement's loops (spatial, then
 * reduction), at most max of them; *n_desc their number.  Subgraphs of one
 * signature have descriptors of one length (unless cut at max). */
void nf_sk_shape(const nf_sk_space *sp, uint8_t sig[16], float *desc, size_t max,
                 size_t *n_desc);

/* Points: allocated by nf_sk_point_init, freed by nf_sk_point_free. */
int nf_sk_point_init(const nf_sk_space *sp, nf_sk_point *p);
void nf_sk_point_free(nf_sk_point *p);
void nf_sk_point_copy(nf_sk_point *dst, const nf_sk_point *src);

/* A random point.  *rng is a xorshift state (never 0). */
void nf_sk_sample(const nf_sk_space *sp, uint64_t *rng, nf_sk_point *out);
/* out = src with one to three random changes (tile factor moved between
 * levels or resampled, template, parallel depth, vectorization, packing,
 * epilogue fusion). */
void nf_sk_mutate(const nf_sk_space *sp, uint64_t *rng, const nf_sk_point *src,
                  nf_sk_point *out);
/* out takes each statement's genes from a or b at random. */
void nf_sk_crossover(const nf_sk_space *sp, uint64_t *rng, const nf_sk_point *a,
                     const nf_sk_point *b, nf_sk_point *out);
/* The schedule of point p (not yet checked by lowering).  NF_OK or
 * NF_ENOMEM. */
int nf_sk_schedule(const nf_sk_space *sp, const nf_sk_point *p, nf_schedule **out);

/* The xorshift64* generator the search uses. */
uint64_t nf_sk_rand(uint64_t *state);

#endif
