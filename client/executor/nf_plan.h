/* nf_plan.h - memory planned once: every intermediate buffer of a step
 * gets an offset in one arena, and buffers whose lifetimes do not
 * overlap share bytes (greedy by size, lowest fitting offset; the
 * approach of ggml's and TFLite's static planners).
 *
 * A lifetime is a closed range [first, last] of step positions (e.g. the
 * indices of the subgraphs that produce and last read a tensor).  Two
 * buffers may overlap in memory only when their lifetimes are disjoint. */
#ifndef NF_PLAN_H
#define NF_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct nf_plan_buf {
  int64_t bytes;  /* >= 0 */
  int first, last; /* lifetime, first <= last */
  int64_t offset; /* out: aligned offset in the arena */
} nf_plan_buf;

/* Assigns offsets (multiples of align, a power of two) to n buffers and
 * sets *total to the arena size.  NF_OK, NF_EINVAL (a negative size, an
 * empty lifetime, align not a power of two), NF_EOVERFLOW, NF_ENOMEM. */
int nf_plan_offsets(nf_plan_buf *b, size_t n, int64_t align, int64_t *total);

#endif
