/* nf_cuda_plan.h - how a GPU kernel image is launched: what the CUDA code
 * generator (daemon/codegen/nf_cuda.h) produces beside the cubin and the
 * GPU runtime (client/executor/nf_cuda_rt.h) consumes. */
#ifndef NF_CUDA_PLAN_H
#define NF_CUDA_PLAN_H

#include <stdint.h>

typedef struct nf_cuda_launch {
  char name[24];         /* "nf_k<i>" (extern "C") */
  uint32_t grid;         /* blocks (x) */
  uint32_t block;        /* threads per block (x) */
  uint32_t shared_bytes; /* static shared memory */
} nf_cuda_launch;

/* Every kernel of an image takes the same parameters: the program's
 * n_args buffers (device pointers, in argument order), then the scratch
 * buffer (scratch_bytes; NULL when 0).  The launches run in order on one
 * stream. */
typedef struct nf_cuda_plan {
  int n_launches;
  nf_cuda_launch *launches; /* malloc'd; in order */
  uint64_t scratch_bytes;   /* global temporaries */
  uint32_t n_args;          /* buffer parameters before `scratch` */
} nf_cuda_plan;

/* Frees plan->launches and zeroes *plan (NULL is fine). */
void nf_cuda_plan_free(nf_cuda_plan *plan);

#endif
