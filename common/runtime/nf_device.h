/* nf_device.h - a device kernels run on, as one interface (device.c) in
 * the spirit of ggml's backend table: the CPU (host memory, kernels from
 * the verified loader, the thread pool) and a CUDA GPU (nf_cuda_rt:
 * device memory, modules loaded from bundles, CUDA events).  Code that
 * runs kernels writes one loop against it whichever the device: the
 * search's measurement worker does (daemon/search/worker.c).
 *
 * Buffers are named by uint64_t addresses: device pointers on a GPU, host
 * pointers on the CPU.  On the CPU, upload and download copy between host
 * buffers and are nothing when source and destination are the same, so a
 * caller that keeps its host buffers as the "device" ones pays no copy.
 *
 * Errors: NF_OK or a status with the reason appended to err.  On a GPU a
 * sticky error (an illegal address) breaks the device: every later call
 * fails, nf_device_sync included, which is how a caller tells a broken
 * device from a failing kernel.
 *
 * Thread safety: one device per thread at a time (as nf_cuda_rt). */
#ifndef NF_DEVICE_H
#define NF_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_cuda_rt.h"
#include "nf_runtime.h"

typedef struct nf_device nf_device;
typedef struct nf_dkernel nf_dkernel; /* a kernel loaded on a device */

/* The CPU with pool (not owned; NULL: serial).  unload_code: unloading a
 * kernel also unloads its code (for callers sure that no run of it is
 * left, like the worker; nf_runtime.h), else the code stays resident.
 * NF_OK or NF_ENOMEM. */
int nf_device_open_cpu(nf_pool *pool, int unload_code, nf_device **out);
/* A CUDA GPU through rt (opened by the caller, not owned). */
int nf_device_open_cuda(nf_cuda_rt *rt, nf_device **out);
void nf_device_close(nf_device *d);
/* "cpu", or the GPU's name. */
const char *nf_device_name(const nf_device *d);
/* Whether buffers are host memory (the CPU). */
int nf_device_is_host(const nf_device *d);

int nf_device_alloc(nf_device *d, size_t n, uint64_t *addr, nf_buf *err);
void nf_device_free(nf_device *d, uint64_t addr);
int nf_device_upload(nf_device *d, uint64_t dst, const void *src, size_t n, nf_buf *err);
int nf_device_download(nf_device *d, void *dst, uint64_t src, size_t n, nf_buf *err);
/* Waits for everything queued; fails once the device is broken. */
int nf_device_sync(nf_device *d, nf_buf *err);

/* Checks and loads a kernel binary taking n_args buffers: a kernel shared
 * object on the CPU (ELF checks, kernel ABI), a bundle on a GPU (its plan
 * must take n_args buffers; its scratch memory is allocated here).
 * NF_EFORMAT for a binary that is not such a kernel (the device is
 * untouched), else the load's status. */
int nf_device_load(nf_device *d, const void *bin, size_t n, uint32_t n_args, nf_dkernel **out,
                   nf_buf *err);
void nf_device_unload(nf_device *d, nf_dkernel *k);
/* Runs k on args (n addresses) to completion. */
int nf_device_run(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, nf_buf *err);
/* The same, timed into *ms: the device's own time (CUDA events around
 * the launches) or the wall clock around a CPU run. */
int nf_device_time(nf_device *d, nf_dkernel *k, const uint64_t *args, uint32_t n, double *ms,
                   nf_buf *err);

#endif
