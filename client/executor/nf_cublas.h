/* nf_cublas.h - tier 0 of matmul-shaped subgraphs on GPUs: cuBLAS's
 * sgemm on device buffers, for the plain products of nf_gemm_plain
 * (nf_gemm.h).  cuBLAS is loaded at run time (dlopen of
 * $NEOFLOW_LIBCUBLAS, else libcublas.so.13, .so.12, .so), never linked:
 * without it GPU sessions run those subgraphs' tier 0 on the host.
 *
 * Work is queued on the runtime's selected stream (nf_cuda_rt_select),
 * through a handle made for that stream on first use, in the runtime's
 * context (the device's primary context, which cuBLAS shares).  Not thread-safe: one handle per
 * thread, like the runtime. */
#ifndef NF_CUBLAS_H
#define NF_CUBLAS_H

#include <stdint.h>

#include "nf_buf.h"
#include "nf_cuda_rt.h"
#include "nf_gemm.h"

typedef struct nf_cublas nf_cublas;

/* Loads cuBLAS and makes a handle on rt's stream.  NF_OK; NF_EUNSUPPORTED
 * with why (no library, no handle); NF_ENOMEM. */
int nf_cublas_open(nf_cuda_rt *rt, nf_cublas **out, nf_buf *why);
/* Queues d's products on device buffers args (the subgraph's inputs then
 * outputs).  NF_OK; NF_EUNSUPPORTED for what this does not run (k == 0,
 * an extent over 2^31 - 1); NF_EIO with cuBLAS's status in err. */
int nf_cublas_run(nf_cublas *b, const nf_gemm_desc *d, const uint64_t *args, nf_buf *err);
void nf_cublas_close(nf_cublas *b);

#endif
