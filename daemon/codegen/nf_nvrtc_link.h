/* nf_nvrtc_link.h - the CUDA target with the NVRTC this build linked
 * (daemon/codegen/nvrtc_link.c): the daemon's and the tool's compiles.
 * The emitter and the compiles through a table of NVRTC entry points that
 * the client loads at run time are common/lower/nf_cuda.h.  Without NVRTC
 * at build time every compile reports NF_EUNSUPPORTED.
 *
 * Thread safety: as nf_cuda.h. */
#ifndef NF_NVRTC_LINK_H
#define NF_NVRTC_LINK_H

#include "nf_cuda.h"

/* Whether this build has the CUDA target (NVRTC found at build time);
 * when not, why (appended to why, may be NULL). */
int nf_cuda_available(nf_buf *why);

/* "neoflow-cuda r<revision> nvrtc-<major>.<minor>" (or "nvrtc-none"). */
void nf_cuda_codegen_version(char *out, size_t n);

/* Emits p and compiles it with NVRTC for sm (e.g. 80, 90): a cubin for
 * that architecture, or, when this NVRTC does not know sm, PTX for the
 * newest compute architecture it knows (the driver compiles PTX for newer
 * devices).  *image gets the bytes (freed first), *plan the launches;
 * source (may be NULL) gets the CUDA C.  NF_OK; NF_EUNSUPPORTED without
 * NVRTC or for an sm older than the oldest NVRTC supports; NF_EINTERNAL
 * with NVRTC's log in err when it rejects the source (a backend bug);
 * what nf_cuda_emit returns otherwise. */
int nf_cuda_compile(const nf_lprog *p, int sm, nf_blob *image, nf_cuda_plan *plan,
                    nf_buf *source, nf_cuda_stats *stats, nf_buf *err);

/* Whether this build's NVRTC can make an image that runs on sm (a cubin,
 * or PTX for an architecture newer than it knows); when not, why
 * (appended to why, may be NULL). */
int nf_cuda_sm_supported(int sm, nf_buf *why);

/* nf_cuda_compile, then the bundle of plan, image and source
 * (nf_cuda_plan.h) appended to bundle.  Same statuses. */
int nf_cuda_compile_bundle(const nf_lprog *p, int sm, nf_buf *bundle, nf_cuda_stats *stats,
                           nf_buf *err);

#endif
