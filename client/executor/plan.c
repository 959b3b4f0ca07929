/* plan.c - the static memory planner (nf_plan.h).
 *
 * Buffers are placed largest first (ties: longest lifetime, then index,
 * so the result is deterministic); each goes at the lowest aligned offset
 * where it overlaps, in memory, no placed buffer whose lifetime meets its
 * own.  The candidate offsets are 0 and the end of every conflicting
 * placed buffer, so one placement costs O(placed log placed). */
#include <stdlib.h>

#include "nf_plan.h"
#include "nf_status.h"

typedef struct span {
  int64_t lo, hi; /* [lo, hi) in the arena */
} span;

static int by_size(const void *pa, const void *pb, void *arg) {
  const nf_plan_buf *bufs = arg;
  size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
  const nf_plan_buf *x = &bufs[a], *y = &bufs[b];
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  int lx = x->last - x->first, ly = y->last - y->first;
  if (lx != ly) return lx > ly ? -1 : 1;
  return a < b ? -1 : a > b;
}

static int by_lo(const void *pa, const void *pb) {
  const span *a = pa, *b = pb;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

int nf_plan_offsets(nf_plan_buf *b, size_t n, int64_t align, int64_t *total) {
  *total = 0;
  if (align <= 0 || (align & (align - 1))) return NF_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (b[i].bytes < 0 || b[i].first > b[i].last || b[i].bytes > INT64_MAX - align)
      return b[i].bytes > INT64_MAX - align ? NF_EOVERFLOW : NF_EINVAL;
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  size_t *placed = malloc((n ? n : 1) * sizeof *placed);
  span *conf = malloc((n ? n : 1) * sizeof *conf);
  if (!order || !placed || !conf) {
    free(order);
    free(placed);
    free(conf);
    return NF_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) order[i] = i;
  qsort_r(order, n, sizeof *order, by_size, b);
  size_t n_placed = 0;
  int64_t end = 0;
  int rc = NF_OK;
  for (size_t k = 0; k < n && rc == NF_OK; k++) {
    nf_plan_buf *x = &b[order[k]];
    int64_t size = (x->bytes + align - 1) & ~(align - 1);
    size_t n_conf = 0;
    for (size_t j = 0; j < n_placed; j++) {
      const nf_plan_buf *y = &b[placed[j]];
      if (y->last < x->first || x->last < y->first) continue; /* never alive together */
      int64_t ys = (y->bytes + align - 1) & ~(align - 1);
      conf[n_conf++] = (span){y->offset, y->offset + ys};
    }
    qsort(conf, n_conf, sizeof *conf, by_lo);
    int64_t at = 0;
    for (size_t j = 0; j < n_conf; j++) {
      if (conf[j].lo >= at + size) break; /* fits in the gap before it */
      if (conf[j].hi > at) at = conf[j].hi;
    }
    if (at > INT64_MAX - size) rc = NF_EOVERFLOW;
    x->offset = at;
    if (at + size > end) end = at + size;
    placed[n_placed++] = order[k];
  }
  free(order);
  free(placed);
  free(conf);
  if (rc == NF_OK) *total = end;
  return rc;
}
