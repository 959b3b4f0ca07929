/* nf_nccl.h - NCCL, loaded at run time, for data-parallel GPU sessions
 * (client/dist.c, docs/distributed.md): one communicator per session over
 * the job's ranks, its gradient buckets averaged and its parameters
 * broadcast on the device, queued on the runtime's streams.  NCCL is
 * loaded with dlopen ($NEOFLOW_LIBNCCL, else libnccl.so.2, as the CUDA
 * toolkit and Debian's libnccl2 install it), never linked; NCCL 2.10 or
 * later (ncclAvg).  The few types are declared in nccl_rt.c, so the NCCL
 * headers need not be installed to build.
 *
 * The communicator is made in the runtime's context (the device's primary
 * context).  Not thread-safe: the session's program thread only. */
#ifndef NF_NCCL_H
#define NF_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_cuda_rt.h"

#define NF_NCCL_ID_BYTES 128 /* ncclUniqueId */

typedef struct nf_nccl nf_nccl;

/* Loads NCCL (no communicator yet).  NF_OK; NF_EUNSUPPORTED with why (no
 * library, missing entry points, a version before 2.10); NF_ENOMEM. */
int nf_nccl_load(nf_cuda_rt *rt, nf_nccl **out, nf_buf *why);
/* The job's identifier, made by one rank (rank 0) and sent to the others
 * (by MPI) before nf_nccl_init.  NF_OK or NF_EIO. */
int nf_nccl_unique_id(nf_nccl *n, uint8_t id[NF_NCCL_ID_BYTES], nf_buf *err);
/* The communicator of rank of size ranks.  Blocks until every rank
 * called it.  NF_OK or NF_EIO. */
int nf_nccl_init(nf_nccl *n, int size, int rank, const uint8_t id[NF_NCCL_ID_BYTES],
                 nf_buf *err);
/* Queued on the runtime's selected stream: the mean over the ranks of
 * count floats at dptr, in place; rank root's count floats at dptr to
 * every rank.  NF_OK or NF_EIO. */
int nf_nccl_mean(nf_nccl *n, uint64_t dptr, size_t count, nf_buf *err);
int nf_nccl_bcast(nf_nccl *n, uint64_t dptr, size_t count, int root, nf_buf *err);
/* An error NCCL found while the queued work ran (a peer gone, a network
 * failure): NF_OK when none, else NF_EIO with NCCL's words. */
int nf_nccl_check(nf_nccl *n, nf_buf *err);
/* NCCL's version as "2.18.3". */
const char *nf_nccl_version(const nf_nccl *n);
/* Aborts the communicator's work in flight (its kernels return), after
 * which it is only freed: a peer is gone. */
void nf_nccl_abort(nf_nccl *n);
void nf_nccl_close(nf_nccl *n);

#endif
