/* device.c - the CPU and CUDA devices behind nf_device.h: one table of
 * operations each. */
#include "nf_device.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_clock.h"
#include "nf_cuda_plan.h"

typedef struct dev_ops {
  int (*alloc)(nf_device *d, size_t n, uint64_t *addr, nf_buf *err);
  void (*free)(nf_device *d, uint64_t addr);
  int (*upload)(nf_device *d, uint64_t dst, const void *src, size_t n, nf_buf *err);
  int (*download)(nf_device *d, void *dst, uint64_t src, size_t n, nf_buf *err);
  int (*sync)(nf_device *d, nf_buf *err);
  int (*load)(nf_device *d, const void *bin, size_t n, uint32_t n_args, nf_dkernel **out,
              nf_buf *err);
  void (*unload)(nf_device *d, nf_dkernel *k);
  int (*run)(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, double *ms,
             nf_buf *err);
} dev_ops;

struct nf_device {
  const dev_ops *ops;
  int host;
  nf_pool *pool;      /* CPU */
  int unload_code;    /* CPU */
  nf_cuda_rt *rt;     /* CUDA */
};

struct nf_dkernel {
  nf_kernel *k;        /* CPU */
  nf_cuda_module *m;   /* CUDA */
  nf_cuda_bundle b;
  uint64_t scratch;
};

/* ---- the CPU ---- */

static int cpu_alloc(nf_device *d, size_t n, uint64_t *addr, nf_buf *err) {
  (void)d;
  void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  if (!p) {
    nf_buf_printf(err, "out of memory (%zu bytes)", n);
    return NF_ENOMEM;
  }
  *addr = (uint64_t)(uintptr_t)p;
  return NF_OK;
}

static void cpu_free(nf_device *d, uint64_t addr) {
  (void)d;
  free((void *)(uintptr_t)addr);
}

static int cpu_upload(nf_device *d, uint64_t dst, const void *src, size_t n, nf_buf *err) {
  (void)d;
  (void)err;
  if ((const void *)(uintptr_t)dst != src && n) memcpy((void *)(uintptr_t)dst, src, n);
  return NF_OK;
}

static int cpu_download(nf_device *d, void *dst, uint64_t src, size_t n, nf_buf *err) {
  (void)d;
  (void)err;
  if (dst != (const void *)(uintptr_t)src && n) memcpy(dst, (const void *)(uintptr_t)src, n);
  return NF_OK;
}

static int cpu_sync(nf_device *d, nf_buf *err) {
  (void)d;
  (void)err;
  return NF_OK;
}

static int cpu_load(nf_device *d, const void *bin, size_t n, uint32_t n_args, nf_dkernel **out,
                    nf_buf *err) {
  (void)d;
  (void)n_args; /* a kernel checks its buffer count itself when it runs */
  *out = NULL;
  nf_dkernel *k = calloc(1, sizeof *k);
  if (!k) return NF_ENOMEM;
  int rc = nf_kernel_load(bin, n, &k->k, err);
  if (rc != NF_OK) {
    free(k);
    return rc;
  }
  *out = k;
  return NF_OK;
}

static void cpu_unload(nf_device *d, nf_dkernel *k) {
  if (d->unload_code)
    nf_kernel_free_unload(k->k);
  else
    nf_kernel_free(k->k);
  free(k);
}

static int cpu_run(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, double *ms,
                   nf_buf *err) {
  void *small[64], **bufs = n <= 64 ? small : malloc(n * sizeof *bufs);
  if (!bufs) return NF_ENOMEM;
  for (uint32_t i = 0; i < n; i++) bufs[i] = (void *)(uintptr_t)args[i];
  double t0 = ms ? nf_now_ms() : 0;
  int rc = nf_kernel_run(k->k, bufs, n, d->pool, err);
  if (ms) *ms = nf_now_ms() - t0;
  if (bufs != small) free(bufs);
  return rc;
}

static const dev_ops cpu_ops = {cpu_alloc, cpu_free, cpu_upload, cpu_download,
                                cpu_sync,  cpu_load, cpu_unload, cpu_run};

/* ---- CUDA ---- */

static int gpu_alloc(nf_device *d, size_t n, uint64_t *addr, nf_buf *err) {
  return nf_cuda_rt_alloc(d->rt, n, addr, err);
}

static void gpu_free(nf_device *d, uint64_t addr) { nf_cuda_rt_free(d->rt, addr); }

static int gpu_upload(nf_device *d, uint64_t dst, const void *src, size_t n, nf_buf *err) {
  return nf_cuda_rt_upload(d->rt, dst, src, n, err);
}

static int gpu_download(nf_device *d, void *dst, uint64_t src, size_t n, nf_buf *err) {
  return nf_cuda_rt_download(d->rt, dst, src, n, err);
}

static int gpu_sync(nf_device *d, nf_buf *err) { return nf_cuda_rt_sync(d->rt, err); }

static void gpu_unload(nf_device *d, nf_dkernel *k) {
  nf_cuda_rt_free(d->rt, k->scratch);
  nf_cuda_module_free(k->m);
  nf_cuda_bundle_free(&k->b);
  free(k);
}

static int gpu_load(nf_device *d, const void *bin, size_t n, uint32_t n_args, nf_dkernel **out,
                    nf_buf *err) {
  *out = NULL;
  nf_dkernel *k = calloc(1, sizeof *k);
  if (!k) return NF_ENOMEM;
  int rc = nf_cuda_bundle_decode(bin, n, &k->b, err);
  if (rc != NF_OK) {
    free(k);
    return rc == NF_ENOMEM ? rc : NF_EFORMAT;
  }
  if (k->b.plan.n_args != n_args) {
    nf_buf_printf(err, "its plan takes %u buffers, the problem has %u", k->b.plan.n_args, n_args);
    nf_cuda_bundle_free(&k->b);
    free(k);
    return NF_EFORMAT;
  }
  rc = nf_cuda_module_load_bundle(d->rt, &k->b, &k->m, err);
  if (rc == NF_OK) {
    rc = nf_cuda_rt_alloc(d->rt, (size_t)k->b.plan.scratch_bytes, &k->scratch, err);
    if (rc != NF_OK) nf_buf_puts(err, " (its scratch memory)");
  }
  if (rc != NF_OK) {
    gpu_unload(d, k);
    return rc;
  }
  *out = k;
  return NF_OK;
}

static int gpu_run(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, double *ms,
                   nf_buf *err) {
  if (ms) return nf_cuda_module_time(k->m, args, n, k->scratch, ms, err);
  int rc = nf_cuda_module_run(k->m, args, n, k->scratch, err);
  return rc == NF_OK ? nf_cuda_rt_sync(d->rt, err) : rc;
}

static const dev_ops gpu_ops = {gpu_alloc, gpu_free, gpu_upload, gpu_download,
                                gpu_sync,  gpu_load, gpu_unload, gpu_run};

/* ---- the interface ---- */

int nf_device_open_cpu(nf_pool *pool, int unload_code, nf_device **out) {
  nf_device *d = calloc(1, sizeof *d);
  if (!d) return NF_ENOMEM;
  d->ops = &cpu_ops;
  d->host = 1;
  d->pool = pool;
  d->unload_code = unload_code;
  *out = d;
  return NF_OK;
}

int nf_device_open_cuda(nf_cuda_rt *rt, nf_device **out) {
  nf_device *d = calloc(1, sizeof *d);
  if (!d) return NF_ENOMEM;
  d->ops = &gpu_ops;
  d->rt = rt;
  *out = d;
  return NF_OK;
}

void nf_device_close(nf_device *d) { free(d); }

const char *nf_device_name(const nf_device *d) {
  return d->host ? "cpu" : nf_cuda_rt_name(d->rt);
}

int nf_device_is_host(const nf_device *d) { return d->host; }

int nf_device_alloc(nf_device *d, size_t n, uint64_t *addr, nf_buf *err) {
  return d->ops->alloc(d, n, addr, err);
}

void nf_device_free(nf_device *d, uint64_t addr) {
  if (addr) d->ops->free(d, addr);
}

int nf_device_upload(nf_device *d, uint64_t dst, const void *src, size_t n, nf_buf *err) {
  return d->ops->upload(d, dst, src, n, err);
}

int nf_device_download(nf_device *d, void *dst, uint64_t src, size_t n, nf_buf *err) {
  return d->ops->download(d, dst, src, n, err);
}

int nf_device_sync(nf_device *d, nf_buf *err) { return d->ops->sync(d, err); }

int nf_device_load(nf_device *d, const void *bin, size_t n, uint32_t n_args, nf_dkernel **out,
                   nf_buf *err) {
  return d->ops->load(d, bin, n, n_args, out, err);
}

void nf_device_unload(nf_device *d, nf_dkernel *k) {
  if (k) d->ops->unload(d, k);
}

int nf_device_run(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, nf_buf *err) {
  return d->ops->run(d, k, args, n, NULL, err);
}

int nf_device_time(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, double *ms,
                   nf_buf *err) {
  return d->ops->run(d, k, args, n, ms, err);
}
