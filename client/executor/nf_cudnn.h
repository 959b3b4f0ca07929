/* nf_cudnn.h - tier 0 of convolution-shaped subgraphs on GPUs: cuDNN's
 * convolution forward, backward-data and backward-filter on device
 * buffers, for the statements nf_conv_match recognises (nf_conv.h).
 * cuDNN is loaded at run time (dlopen of $NEOFLOW_LIBCUDNN, else
 * libcudnn.so.9, .so.8, .so; cuDNN 9 keeps these legacy entry points),
 * never linked: without it GPU sessions run those subgraphs' tier 0 on
 * the host.
 *
 * Numerics: f32 data, f32 compute, FMA math only (no TF32 tensor cores,
 * which would round the operands to 10-bit mantissas); of the algorithms
 * cuDNN's heuristics rank, the first that is deterministic and needs at
 * most NF_CUDNN_WORKSPACE_MAX bytes of workspace, else the first that
 * fits.  Descriptors and the choice are made once per shape and kept.
 *
 * Work is queued on the runtime's selected stream (nf_cuda_rt_select),
 * through a handle and workspace made for that stream on first use, in
 * its context.  Not
 * thread-safe: one handle per thread, like the runtime. */
#ifndef NF_CUDNN_H
#define NF_CUDNN_H

#include <stdint.h>

#include "nf_buf.h"
#include "nf_conv.h"
#include "nf_cuda_rt.h"

#define NF_CUDNN_WORKSPACE_MAX ((uint64_t)256 << 20)

typedef struct nf_cudnn nf_cudnn;

/* Loads cuDNN and makes a handle on rt's stream.  NF_OK; NF_EUNSUPPORTED
 * with why (no library, an entry point missing, no handle); NF_ENOMEM. */
int nf_cudnn_open(nf_cuda_rt *rt, nf_cudnn **out, nf_buf *why);
/* Queues d's operation on device buffers x (n c h w), f (k, c / groups,
 * r, s) and
 * y (n k oh ow): it writes y (forward), x (data gradient) or f (filter
 * gradient), overwriting it.  NF_OK; NF_EUNSUPPORTED for what this does
 * not run (an extent over 2^31 - 1, a shape cuDNN refuses, no algorithm
 * within the workspace limit) with the reason in err; NF_EIO with
 * cuDNN's error string; NF_ENOMEM. */
int nf_cudnn_run(nf_cudnn *c, const nf_conv_desc *d, uint64_t x, uint64_t f, uint64_t y,
                 nf_buf *err);
/* "cuDNN 9.x.y" (cudnnGetVersion), for logs. */
const char *nf_cudnn_version(const nf_cudnn *c);
void nf_cudnn_close(nf_cudnn *c);

#endif
