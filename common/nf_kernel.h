/* nf_kernel.h - the kernel ABI: the one C signature every generated CPU
 * kernel exports and every loader calls.  Both sides include this header;
 * nothing else is shared between generated code and the runtime.
 *
 * A kernel is a shared object exporting NF_KERNEL_SYMBOL with the type
 * nf_kernel_fn.  It receives the buffers of its graph's inputs then
 * outputs (graph order), each a dense row-major array of the tensor's
 * dtype (f32 for f32, ...), non-overlapping, aligned to at least the
 * element size (64 bytes recommended).  It writes every element of every
 * output and returns 0, or a non-zero code it documents (none today).
 *
 * Parallel loops call back into the runtime through args->parallel_for
 * (never a threading library of their own): the runtime runs body(ctx, b,
 * e) over a partition of [0, n) into ranges and returns when all are done;
 * bodies of one call may run concurrently on different threads and never
 * call parallel_for themselves.  A NULL parallel_for means: run serially
 * (the kernel then calls body(ctx, 0, n) itself).
 *
 * Generated code has no constructors, destructors, thread-local storage
 * or global state, so it can be loaded several times and is never
 * unloaded while a call may be running. */
#ifndef NF_KERNEL_H
#define NF_KERNEL_H

#include <stdint.h>

#define NF_KERNEL_ABI_VERSION 1
#define NF_KERNEL_SYMBOL "nf_kernel_v1"

typedef void (*nf_parallel_body)(void *ctx, int64_t begin, int64_t end);
typedef void (*nf_parallel_for_fn)(void *runtime, int64_t n, nf_parallel_body body,
                                   void *ctx);

typedef struct nf_kernel_args {
  uint32_t abi_version; /* NF_KERNEL_ABI_VERSION */
  uint32_t n_buffers;   /* inputs + outputs; the kernel checks it */
  void *const *buffers;
  nf_parallel_for_fn parallel_for; /* may be NULL */
  void *runtime;                   /* passed back to parallel_for */
} nf_kernel_args;

typedef int (*nf_kernel_fn)(const nf_kernel_args *args);

#endif
