/* nf_nvrtc.h - the NVRTC entry points the CUDA backend calls, as a table,
 * so that one compile path (common/lower/nvrtc.c) serves NVRTC linked
 * at build time (the daemon, the tool: nvrtc_link.c) and NVRTC loaded at
 * run time with dlopen (the client's tier-0 kernels on a GPU:
 * common/runtime/nvrtc_rt.c).
 *
 * The types are NVRTC's C ABI, declared here so that no NVRTC header is
 * needed: nvrtcResult is an int (0 is NVRTC_SUCCESS, 1
 * NVRTC_ERROR_OUT_OF_MEMORY), nvrtcProgram a pointer. */
#ifndef NF_NVRTC_H
#define NF_NVRTC_H

#include <stddef.h>

#define NF_NVRTC_SUCCESS 0
#define NF_NVRTC_ERROR_OUT_OF_MEMORY 1

typedef struct nf_nvrtc_api {
  int (*Version)(int *major, int *minor);
  int (*GetNumSupportedArchs)(int *n);
  int (*GetSupportedArchs)(int *archs);
  int (*CreateProgram)(void **prog, const char *src, const char *name, int n_headers,
                       const char *const *headers, const char *const *include_names);
  int (*CompileProgram)(void *prog, int n_options, const char *const *options);
  int (*GetProgramLogSize)(void *prog, size_t *n);
  int (*GetProgramLog)(void *prog, char *log);
  int (*GetCUBINSize)(void *prog, size_t *n);
  int (*GetCUBIN)(void *prog, char *cubin);
  int (*GetPTXSize)(void *prog, size_t *n);
  int (*GetPTX)(void *prog, char *ptx);
  int (*DestroyProgram)(void **prog);
  const char *(*GetErrorString)(int result);
} nf_nvrtc_api;

#endif
