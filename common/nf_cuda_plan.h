/* nf_cuda_plan.h - how a GPU kernel image is launched: what the CUDA code
 * generator (daemon/codegen/nf_cuda.h) produces beside the cubin and the
 * GPU runtime (client/executor/nf_cuda_rt.h) consumes; and the bundle
 * that carries plan, image and source as one binary (the daemon's
 * KernelUpdate and cache rows for CUDA targets). */
#ifndef NF_CUDA_PLAN_H
#define NF_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"

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

/* ---- the bundle ----
 *
 * Little-endian:
 *   "NFCUDA01"                     8 bytes
 *   u32 n_launches, u32 n_args
 *   u64 scratch_bytes
 *   u32 image_kind (NF_CUDA_IMAGE_*), u32 sm (the architecture compiled for)
 *   u64 image_len, u64 source_len
 *   n_launches x { name[24] (NUL-terminated, [A-Za-z0-9_]+), u32 grid,
 *                  u32 block, u32 shared_bytes }
 *   image_len bytes (the cubin, or PTX text)
 *   source_len bytes (the CUDA C the image was compiled from: for people,
 *                     and for the CPU emulation of the driver in tests)
 * and nothing after.  A bundle comes from a socket peer or a cache file:
 * nf_cuda_bundle_decode checks every field and length. */
#define NF_CUDA_BUNDLE_MAGIC "NFCUDA01"
#define NF_CUDA_BUNDLE_MAX_LAUNCHES 4096
#define NF_CUDA_BUNDLE_MAX_ARGS 4096
#define NF_CUDA_BUNDLE_MAX_SCRATCH (1ull << 40)
#define NF_CUDA_BUNDLE_MAX_BLOCK 1024u
#define NF_CUDA_BUNDLE_MAX_SHARED (228u << 10) /* the largest any sm has */
enum { NF_CUDA_IMAGE_CUBIN = 0, NF_CUDA_IMAGE_PTX = 1 };

typedef struct nf_cuda_bundle {
  nf_cuda_plan plan;    /* owned (nf_cuda_bundle_free) */
  int image_kind;       /* NF_CUDA_IMAGE_* */
  int sm;
  const uint8_t *image; /* into the decoded bytes (not owned) */
  size_t image_len;
  const char *source;   /* into the decoded bytes, NOT NUL-terminated */
  size_t source_len;
} nf_cuda_bundle;

/* Appends the bundle of plan, image and source (source may be NULL) to
 * out.  NF_OK, NF_EINVAL (a field over the limits above), NF_ENOMEM. */
int nf_cuda_bundle_encode(const nf_cuda_plan *plan, int image_kind, int sm, const void *image,
                          size_t image_len, const char *source, size_t source_len, nf_buf *out);
/* Parses n bytes at p into *b (its pointers point into p, which must
 * outlive it).  NF_OK; NF_EFORMAT with what is wrong, and where, appended
 * to err; NF_ENOMEM. */
int nf_cuda_bundle_decode(const void *p, size_t n, nf_cuda_bundle *b, nf_buf *err);
void nf_cuda_bundle_free(nf_cuda_bundle *b);

#endif
