/* nf_cuda.h - the GPU code generator: loop IR (nf_loop.h) -> CUDA C ->
 * NVRTC -> cubin (or PTX) for one `sm_XX`, with the launch plan the GPU
 * executor needs to run it.
 *
 * A GPU program is lowered with a schedule that binds loops to blocks and
 * threads (bind_block, bind_thread; nf_schedule_default_gpu gives one).
 * The backend turns every top-level statement of the program into one
 * `__global__` function, launched in program order on one stream:
 *  - a nest whose outermost loops are BLOCK loops (or that holds THREAD
 *    loops) is a launch of one block per iteration of those loops
 *    (flattened into blockIdx.x); inside a block, each nest of THREAD
 *    loops runs on threadIdx.x (flattened, guarded by its own extent); a
 *    loop or guard that holds thread loops runs in every thread alike
 *    (its bounds and condition use block-level variables only), with a
 *    __syncthreads() at the end of each iteration; a statement whose
 *    outer loops each index one dimension of every store it makes (a
 *    copy into shared memory, a fill) is shared by the block's threads,
 *    strided by blockDim.x; any other statement runs on thread 0 alone;
 *    consecutive statements of a block are separated by __syncthreads();
 *  - any other top-level statement is a grid-strided launch when its
 *    iterations write distinct elements (as above), else a launch of one
 *    block of one thread (correct, slow);
 *  - BLOCK or THREAD loops anywhere else run as ordinary serial loops;
 *  - a VECTOR loop of 2 or 4 iterations whose body is stores (a guard
 *    the same for every lane is moved out first) reads each operand of
 *    consecutive elements not written in the loop with one vector load
 *    (float2/float4, int2/int4, double2, longlong2) into a lane array,
 *    and writes a single such store with one vector store, each
 *    checking its address's alignment when it runs (scalar otherwise);
 *    the loop itself is unrolled over the lanes; a statement a block's
 *    threads share (a staging copy, a fill) whose innermost loop
 *    divides by 4 (or 2) is dealt in such groups of lanes.
 * Temporaries: an ALLOC at the top level lives in the global scratch
 * buffer (one allocation, plan.scratch_bytes, 256-byte aligned slices);
 * one inside a block but outside its thread nests is `__shared__`
 * (48 KiB per block at most); one inside a thread's code is a local
 * array.  Select stays lazy (an untaken branch is never evaluated) and
 * integer arithmetic wraps as in the interpreter.  f16/bf16 buffers are
 * not supported yet (NF_EUNSUPPORTED).
 *
 * Every kernel takes the same parameters: the program's argument buffers
 * in argument order (as `T *`), then `unsigned char *scratch` (NULL when
 * plan.scratch_bytes is 0).
 *
 * Thread safety: every function may be called from several threads at
 * once (NVRTC programs are per call). */
#ifndef NF_CUDA_H
#define NF_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_cuda_plan.h"
#include "nf_loop.h"
#include "nf_nvrtc.h"

/* Bump when the CUDA C made for the same program changes. */
#define NF_CUDA_REVISION 1

#define NF_CUDA_MAX_THREADS 1024     /* threads of one block */
#define NF_CUDA_MAX_SHARED (48 << 10) /* static shared memory of one block */
#define NF_CUDA_MAX_LOCAL (16 << 10)  /* a thread's local arrays */

/* nf_cuda_plan, nf_cuda_launch, nf_cuda_plan_free: nf_cuda_plan.h */

/* Prints p as CUDA C into src (appended) and fills *plan (freed first).
 * NF_OK, NF_EINVAL (malformed program), NF_EUNSUPPORTED (f16/bf16), or
 * NF_ELIMIT (a block over NF_CUDA_MAX_THREADS threads, shared or local
 * memory over its limit, a grid over 2^31 - 1 blocks); message in err. */
int nf_cuda_emit(const nf_lprog *p, nf_buf *src, nf_cuda_plan *plan, nf_buf *err);

typedef struct nf_cuda_stats {
  double emit_ms, nvrtc_ms;
  size_t source_bytes, image_bytes;
  int ptx; /* the image is PTX (sm newer than this NVRTC knows), not cubin */
} nf_cuda_stats;

/* The same with the NVRTC of the table api (nf_nvrtc.h; not NULL) rather
 * than this build's (daemon/codegen/nf_nvrtc_link.h): the client compiles its tier-0 kernels
 * with an NVRTC it loads at run time.  nf_cuda_codegen_version_with
 * accepts NULL (no NVRTC). */
int nf_cuda_compile_with(const nf_nvrtc_api *api, const nf_lprog *p, int sm, nf_blob *image,
                         nf_cuda_plan *plan, nf_buf *source, nf_cuda_stats *stats, nf_buf *err);
int nf_cuda_sm_supported_with(const nf_nvrtc_api *api, int sm, nf_buf *why);
int nf_cuda_compile_bundle_with(const nf_nvrtc_api *api, const nf_lprog *p, int sm,
                                nf_buf *bundle, nf_cuda_stats *stats, nf_buf *err);
void nf_cuda_codegen_version_with(const nf_nvrtc_api *api, char *out, size_t n);

#endif
