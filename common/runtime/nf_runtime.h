/* nf_runtime.h - running compiled CPU kernels: the thread pool behind the
 * kernel ABI's parallel_for, and the loader of kernel shared objects
 * (common/nf_kernel.h).  No LLVM here: the client links only this.
 *
 * Loading (RELIABILITY.md "Client loading", S-25): the bytes go into a
 * memfd (MFD_CLOEXEC | MFD_ALLOW_SEALING, plus MFD_EXEC where the kernel
 * headers know it), sealed against writes, shrinking, growing and
 * further sealing; the ELF header is checked on the sealed descriptor;
 * then dlopen("/proc/self/fd/N", RTLD_NOW | RTLD_LOCAL) and dlsym of
 * NF_KERNEL_SYMBOL.  When the system refuses to execute a memfd
 * (vm.memfd_noexec, SELinux), the fallback is an O_TMPFILE file in a fresh
 * 0700 directory (under $XDG_RUNTIME_DIR, else /tmp) that is removed at
 * once, so no name ever exists on disk.
 *
 * Unloading: generated code has no constructors, destructors or TLS, and
 * a kernel may be running on other threads when the caller drops it, so
 * nf_kernel_free never dlcloses by default: the code stays resident (a
 * few KiB per kernel) and only the handle's memory is freed.
 * nf_kernel_free_unload dlcloses, for callers that guarantee no call of
 * the kernel is running or will start (tests, shutdown).
 *
 * Thread safety: nf_kernel_run may be called concurrently on one kernel
 * (with one pool per concurrent caller, or the same pool: its
 * parallel_for calls are serialised).  Load and free are thread-safe. */
#ifndef NF_RUNTIME_H
#define NF_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_kernel.h"

/* ---- thread pool ---- */

typedef struct nf_pool nf_pool;

/* A pool of n_threads threads in all: the caller of parallel_for is one
 * of them, so n_threads - 1 workers are started (n_threads < 1 counts as
 * 1).  Workers spin briefly after each job, then sleep on a condition
 * variable.  Returns NULL when out of memory or threads. */
nf_pool *nf_pool_new(int n_threads);
/* Stops and joins the workers; no parallel_for may be running. */
void nf_pool_free(nf_pool *pool);
int nf_pool_threads(const nf_pool *pool);
/* The kernel ABI's parallel_for (nf_parallel_for_fn) with runtime = the
 * pool: splits [0, n) statically into at most n_threads contiguous
 * ranges of near-equal size (the caller runs the first), returns when all
 * are done.  n <= 0 returns at once.  Calls from several threads on one
 * pool are serialised; a body must not call it (the ABI forbids). */
void nf_pool_parallel_for(void *pool, int64_t n, nf_parallel_body body, void *ctx);

/* ---- kernels ---- */

typedef struct nf_kernel nf_kernel;

/* Flags of nf_kernel_load_ex. */
#define NF_LOAD_FORCE_TMPFILE 1u /* skip memfd (tests the fallback) */

/* Verifies and loads a kernel shared object from memory (the bytes are
 * copied).  On error appends a message to err and returns NF_EFORMAT (not
 * a loadable x86-64/host ELF shared object, symbol missing) or NF_EIO
 * (the system refused: memfd, dlopen); *out is then NULL. */
int nf_kernel_load(const void *so, size_t n, nf_kernel **out, nf_buf *err);
int nf_kernel_load_ex(const void *so, size_t n, unsigned flags, nf_kernel **out,
                      nf_buf *err);
/* The exported entry point (valid while the kernel is loaded). */
nf_kernel_fn nf_kernel_entry(const nf_kernel *k);
/* 1 when the kernel was loaded through the O_TMPFILE fallback. */
int nf_kernel_used_fallback(const nf_kernel *k);
/* Runs the kernel on n buffers (inputs then outputs) with pool's
 * parallel_for (pool NULL: serial).  Returns NF_OK, or NF_EINVAL when the
 * kernel returned non-zero (its code appended to err when err is not
 * NULL: 1 ABI mismatch, 2 buffer count, 3 out of memory). */
int nf_kernel_run(const nf_kernel *k, void *const *buffers, uint32_t n, nf_pool *pool,
                  nf_buf *err);
/* Frees the handle and keeps the code resident (see above). */
void nf_kernel_free(nf_kernel *k);
/* Frees the handle and dlcloses: only when no call can be running. */
void nf_kernel_free_unload(nf_kernel *k);

#endif
