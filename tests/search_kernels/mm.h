/* mm.h - the problem of the measurement tests (tests/test_measure.c) and
 * the body shared by its kernels: inputs A f32 [M,K], B f32 [K,N], S i32
 * [M]; outputs C f32 [M,N] = A @ B and R f64 [M] = sum_k A[m,k] + S[m].
 * Rows go through the runtime's parallel_for when there is one.
 *
 * A kernel defines MM_KERNEL (and optionally MM_SKIP_LAST: C's last
 * element is never written; MM_R_OFFSET: added to every R) before
 * including this file, then exports nf_kernel_v1 with NF_EXPORT.  The
 * test includes it without MM_KERNEL for the sizes only.  The kernels
 * have no global state, constructors or TLS (the loader refuses those). */
#ifndef MM_H
#define MM_H

#include <stddef.h>
#include <stdint.h>

#include "nf_kernel.h"

#define MM_M 37
#define MM_K 29
#define MM_N 41

#define NF_EXPORT __attribute__((visibility("default")))

#ifdef MM_KERNEL
#ifndef MM_R_OFFSET
#define MM_R_OFFSET 0.0
#endif

typedef struct mm_ctx {
  const float *a, *b;
  const int32_t *s;
  float *c;
  double *r;
} mm_ctx;

static void mm_rows(void *ctx, int64_t begin, int64_t end) {
  const mm_ctx *x = ctx;
  for (int64_t m = begin; m < end; m++) {
    for (int64_t n = 0; n < MM_N; n++) {
#ifdef MM_SKIP_LAST
      if (m == MM_M - 1 && n == MM_N - 1) continue;
#endif
      float acc = 0;
      for (int64_t k = 0; k < MM_K; k++) acc += x->a[m * MM_K + k] * x->b[k * MM_N + n];
      x->c[m * MM_N + n] = acc;
    }
    double r = x->s[m];
    for (int64_t k = 0; k < MM_K; k++) r += x->a[m * MM_K + k];
    x->r[m] = r + MM_R_OFFSET;
  }
}

static inline int mm_run(const nf_kernel_args *args) {
  if (args->abi_version != NF_KERNEL_ABI_VERSION) return 1;
  if (args->n_buffers != 5) return 2;
  mm_ctx x = {args->buffers[0], args->buffers[1], args->buffers[2], args->buffers[3],
              args->buffers[4]};
  if (args->parallel_for)
    args->parallel_for(args->runtime, MM_M, mm_rows, &x);
  else
    mm_rows(&x, 0, MM_M);
  return 0;
}
#endif

#endif
