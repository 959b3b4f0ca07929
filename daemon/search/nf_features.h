/* nf_features.h - a fixed-length feature vector of a lowered program
 * (loop IR) for the learned cost model (daemon/search).
 *
 * The features describe what makes a schedule fast on a CPU: per store
 * statement (the heaviest NF_FEAT_STORES by executed iterations), its
 * arithmetic (float ops per iteration, total), vectorization (vector
 * width, vectorized fraction), unrolling, parallel extent (and its
 * balance over threads), loop depth, and per loop level from the
 * innermost outwards the bytes touched by the body (the footprint of each
 * buffer's accesses, from the affine index ranges) and the arithmetic
 * intensity (ops / touched bytes); plus program-wide totals (allocated
 * local buffer bytes, number of loops, guards).  A GPU program (loops
 * bound to blocks and threads) adds what makes a CUDA kernel fast, for
 * the launch that holds the heaviest store: its grid and block sizes,
 * warp and occupancy estimates, shared and per-thread memory, the work
 * of one thread, and how its accesses coalesce across neighbouring
 * threads; a CPU program leaves those zero.  Values are log-scaled where
 * they span orders of magnitude.  Extraction is deterministic. */
#ifndef NF_FEATURES_H
#define NF_FEATURES_H

#include "nf_loop.h"

#define NF_FEAT_STORES 4 /* stores described, heaviest first (zeros pad) */
#define NF_FEAT_LEVELS 6 /* loop levels per store, innermost outwards */
#define NF_FEAT_GPU 14   /* the GPU launch's features (zero on a CPU) */
/* floats per program: 35 per store (23 + 2 per level), 12 totals, then
 * the GPU ones */
#define NF_FEAT_N (NF_FEAT_STORES * (23 + 2 * NF_FEAT_LEVELS) + 12 + NF_FEAT_GPU)
/* The length before the GPU features (records of that length are the
 * same vectors for CPU programs, zero-padded). */
#define NF_FEAT_N_CPU (NF_FEAT_N - NF_FEAT_GPU)

/* Fills out[0..NF_FEAT_N) (every value finite; the same program always
 * gives the same vector).  NF_OK, NF_EINVAL for a malformed program (or a
 * store nested in more than 128 loops), NF_ENOMEM; out is zeroed on
 * failure.  Thread-safe (no shared state).  nf_feature_name documents
 * each position: "s<k>.<name>" for the k-th heaviest store, then the
 * program totals. */
int nf_features(const nf_lprog *p, float *out);
/* The same for a program that runs on a GPU: the GPU features are filled
 * even where no loop is bound (a launch of one thread, or an
 * elementwise nest the backend spreads over threads). */
int nf_features_gpu(const nf_lprog *p, float *out);
/* A short name of feature i (for dumps and docs), "" past the end. */
const char *nf_feature_name(int i);

#endif
