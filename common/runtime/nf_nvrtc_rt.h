/* nf_nvrtc_rt.h - NVRTC loaded at run time (dlopen), for the kernels a
 * GPU session generates itself at tier 0 (client/gpu_local.c).  Nothing
 * is linked: a client built without the CUDA toolkit loads it where one
 * is installed.
 *
 * Where: $NEOFLOW_LIBNVRTC (a path; "none" disables it), else
 * libnvrtc.so.13, .so.12, .so.11.2, libnvrtc.so on the loader's path,
 * else libnvrtc.so under the toolkit directory this build was configured
 * with (NF_CUDA_LIBDIR). */
#ifndef NF_NVRTC_RT_H
#define NF_NVRTC_RT_H

#include "nf_buf.h"
#include "nf_nvrtc.h"

typedef struct nf_nvrtc_rt nf_nvrtc_rt;

/* NF_OK with *out; NF_EUNSUPPORTED (disabled, not found, or an entry
 * point missing: why says which); NF_ENOMEM. */
int nf_nvrtc_rt_open(nf_nvrtc_rt **out, nf_buf *why);
void nf_nvrtc_rt_close(nf_nvrtc_rt *r);
const nf_nvrtc_api *nf_nvrtc_rt_api(const nf_nvrtc_rt *r);
/* "NVRTC 13.0 (path)" */
const char *nf_nvrtc_rt_describe(const nf_nvrtc_rt *r);

#endif
