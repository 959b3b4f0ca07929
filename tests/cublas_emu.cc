/* cublas_emu.cc - the few cuBLAS entry points client/executor/cublas_rt.c
 * loads (NEOFLOW_LIBCUBLAS=<this library>), for tests with the emulated
 * CUDA driver (cuda_emu_driver.cc), whose device pointers are host
 * pointers: sgemm in column-major order as cuBLAS defines it, on the
 * CPU, accumulating in double, queued on the handle's stream.  Test
 * code, not shipped. */
#include <stdint.h>

#include "emu_stream.h"

typedef int cublasStatus_t;

/* a handle: the stream set on it (NULL: none yet) */
struct emu_blas {
  int magic;
  void *stream;
};
enum { BLAS_MAGIC = 0x424c4153 };

/* handles come from a fixed pool (a broken context's owner never
 * destroys its handle: nothing leaks) */
static emu_blas g_pool[64];

static emu_blas *pool_new() {
  for (emu_blas &x : g_pool)
    if (x.magic != BLAS_MAGIC) {
      x.magic = BLAS_MAGIC;
      x.stream = NULL;
      return &x;
    }
  return NULL;
}

static emu_blas *handle(void *h) {
  emu_blas *b = (emu_blas *)h;
  return b && b->magic == BLAS_MAGIC ? b : NULL;
}

extern "C" {

cublasStatus_t cublasCreate_v2(void **h) {
  *h = pool_new();
  return *h ? 0 : 3; /* CUBLAS_STATUS_ALLOC_FAILED */
}

cublasStatus_t cublasDestroy_v2(void *h) {
  emu_blas *b = handle(h);
  if (!b) return 1;
  b->magic = 0;
  return 0;
}

cublasStatus_t cublasSetStream_v2(void *h, void *stream) {
  if (!handle(h) || !stream) return 7; /* CUBLAS_STATUS_INVALID_VALUE */
  handle(h)->stream = stream;
  return 0;
}

/* C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major. */
cublasStatus_t cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
  if (!handle(h) || !handle(h)->stream || m < 0 || n < 0 || k < 0) return 7;
  float al = *alpha, be = *beta; /* (host scalars, read when called) */
  int r = emu_stream_enqueue(handle(h)->stream, [=] {
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        double acc = 0;
        for (int p = 0; p < k; p++) {
          float a = ta ? A[p + (int64_t)i * lda] : A[i + (int64_t)p * lda];
          float b = tb ? B[j + (int64_t)p * ldb] : B[p + (int64_t)j * ldb];
          acc += (double)a * b;
        }
        float *c = &C[i + (int64_t)j * ldc];
        *c = (float)(al * acc + (be != 0.0f ? be * *c : 0.0f));
      }
  });
  if (r != 0) return 13; /* CUBLAS_STATUS_EXECUTION_FAILED */
  return 0;
}

} /* extern "C" */
