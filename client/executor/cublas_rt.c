/* cublas_rt.c - nf_cublas.h: cuBLAS through dlopen.  The few types are
 * declared here (the CUDA headers need not be installed to build this):
 * the handle is a pointer, statuses and operations ints. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "nf_cublas.h"
#include "nf_env.h"
#include "nf_status.h"

typedef int cublasStatus_t;
typedef void *cublasHandle_t;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };

struct nf_cublas {
  void *lib;
  nf_cuda_rt *rt;
  cublasHandle_t h[NF_CUDA_MAX_STREAMS]; /* per stream (h[0] made at open) */
  cublasStatus_t (*Create)(cublasHandle_t *);
  cublasStatus_t (*Destroy)(cublasHandle_t);
  cublasStatus_t (*SetStream)(cublasHandle_t, void *);
  cublasStatus_t (*Sgemm)(cublasHandle_t, int, int, int, int, int, const float *, const float *,
                          int, const float *, int, const float *, float *, int);
};

void nf_cublas_close(nf_cublas *b) {
  if (!b) return;
  if (nf_cuda_rt_current(b->rt, NULL) == NF_OK)
    for (int i = 0; i < NF_CUDA_MAX_STREAMS; i++)
      if (b->h[i]) b->Destroy(b->h[i]);
  if (b->lib) dlclose(b->lib);
  free(b);
}

/* The handle of stream i, made on first use, bound to that stream. */
static int handle(nf_cublas *b, int i, nf_buf *err) {
  if (b->h[i]) return NF_OK;
  cublasStatus_t st = b->Create(&b->h[i]);
  if (st != 0) {
    b->h[i] = NULL;
    nf_buf_printf(err, "cublasCreate: status %d", st);
    return NF_EIO;
  }
  if ((st = b->SetStream(b->h[i], nf_cuda_rt_stream_at(b->rt, i))) != 0) {
    nf_buf_printf(err, "cublasSetStream: status %d", st);
    b->Destroy(b->h[i]);
    b->h[i] = NULL;
    return NF_EIO;
  }
  return NF_OK;
}

int nf_cublas_open(nf_cuda_rt *rt, nf_cublas **out, nf_buf *why) {
  *out = NULL;
  nf_cublas *b = calloc(1, sizeof *b);
  if (!b) return NF_ENOMEM;
  b->rt = rt;
  const char *env = nf_env(NF_ENV_LIBCUBLAS);
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  if (env && *env) b->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; !b->lib && !(env && *env) && i < sizeof names / sizeof *names; i++)
    b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!b->lib) {
    nf_buf_printf(why, "no cuBLAS: cannot load %s (%s)", env && *env ? env : "libcublas.so.13/.12",
                  dlerror());
    free(b);
    return NF_EUNSUPPORTED;
  }
  *(void **)&b->Create = dlsym(b->lib, "cublasCreate_v2");
  *(void **)&b->Destroy = dlsym(b->lib, "cublasDestroy_v2");
  *(void **)&b->SetStream = dlsym(b->lib, "cublasSetStream_v2");
  *(void **)&b->Sgemm = dlsym(b->lib, "cublasSgemm_v2");
  if (!b->Create || !b->Destroy || !b->SetStream || !b->Sgemm) {
    nf_buf_puts(why, "the cuBLAS library lacks cublasCreate_v2, cublasSetStream_v2 or cublasSgemm_v2");
    nf_cublas_close(b);
    return NF_EUNSUPPORTED;
  }
  int rc = nf_cuda_rt_current(rt, why);
  if (rc == NF_OK) rc = handle(b, 0, why);
  if (rc != NF_OK) {
    nf_cublas_close(b);
    return NF_EUNSUPPORTED;
  }
  *out = b;
  return NF_OK;
}

int nf_cublas_run(nf_cublas *b, const nf_gemm_desc *d, const uint64_t *args, nf_buf *err) {
  const int64_t lim = 0x7fffffff;
  if (d->k == 0 || d->m > lim || d->n > lim || d->k > lim || d->lda > lim || d->ldb > lim ||
      d->ldc > lim)
    return NF_EUNSUPPORTED;
  int rc = nf_cuda_rt_current(b->rt, err);
  int hs = nf_cuda_rt_selected(b->rt); /* the selected stream's handle */
  if (rc == NF_OK) rc = handle(b, hs, err);
  if (rc != NF_OK) return rc;
  const float *a0 = (const float *)(uintptr_t)args[d->a] + d->off_a;
  const float *b0 = (const float *)(uintptr_t)args[d->b] + d->off_b;
  float *c0 = (float *)(uintptr_t)args[d->c];
  int64_t n_ind = 1, n_red = 1;
  for (int i = 0; i < d->n_batch; i++) {
    if (d->batch[i].st) n_ind *= d->batch[i].e;
    else n_red *= d->batch[i].e;
  }
  static const float one = 1.0f, zero = 0.0f;
  for (int64_t q = 0; q < n_ind; q++) {
    int64_t oc = 0, oa = 0, ob = 0, rest = q;
    for (int i = d->n_batch - 1; i >= 0; i--) {
      if (!d->batch[i].st) continue;
      int64_t x = rest % d->batch[i].e;
      rest /= d->batch[i].e;
      oc += x * d->batch[i].st;
      oa += x * d->batch[i].sp;
      ob += x * d->batch[i].sq;
    }
    for (int64_t r = 0; r < n_red; r++) {
      int64_t ra = oa, rb = ob, rr = r;
      for (int i = d->n_batch - 1; i >= 0; i--) {
        if (d->batch[i].st) continue;
        int64_t x = rr % d->batch[i].e;
        rr /= d->batch[i].e;
        ra += x * d->batch[i].sp;
        rb += x * d->batch[i].sq;
      }
      /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
      cublasStatus_t st =
          b->Sgemm(b->h[hs], d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   (int)d->n, (int)d->m, (int)d->k, &one, b0 + rb, (int)d->ldb, a0 + ra, (int)d->lda,
                   r ? &one : &zero, c0 + oc, (int)d->ldc);
      if (st != 0) {
        nf_buf_printf(err, "cublasSgemm: status %d", st);
        return NF_EIO;
      }
    }
  }
  return NF_OK;
}
