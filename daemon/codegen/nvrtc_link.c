/* nvrtc_link.c - the CUDA target of the daemon and the tool: NVRTC linked
 * at build time when meson found it under the toolkit directory
 * (NF_HAVE_CUDA), its entry points put in the table that nvrtc.c compiles
 * with; otherwise every call says that the CUDA target is missing from
 * this build. */
#include <stdlib.h>
#include <string.h>

#include "nf_config.h"
#include "nf_nvrtc_link.h"

#if NF_HAVE_CUDA
#include <nvrtc.h>

/* NVRTC's functions with the table's types (nvrtcResult as int,
 * nvrtcProgram as void *): one line each, no casts of function pointers. */
static int w_version(int *major, int *minor) { return nvrtcVersion(major, minor); }
static int w_n_archs(int *n) { return nvrtcGetNumSupportedArchs(n); }
static int w_archs(int *a) { return nvrtcGetSupportedArchs(a); }
static int w_create(void **prog, const char *src, const char *name, int n_headers,
                    const char *const *headers, const char *const *include_names) {
  nvrtcProgram p = NULL;
  int r = nvrtcCreateProgram(&p, src, name, n_headers, headers, include_names);
  *prog = p;
  return r;
}
static int w_compile(void *prog, int n, const char *const *opts) {
  return nvrtcCompileProgram(prog, n, opts);
}
static int w_log_size(void *prog, size_t *n) { return nvrtcGetProgramLogSize(prog, n); }
static int w_log(void *prog, char *log) { return nvrtcGetProgramLog(prog, log); }
static int w_cubin_size(void *prog, size_t *n) { return nvrtcGetCUBINSize(prog, n); }
static int w_cubin(void *prog, char *out) { return nvrtcGetCUBIN(prog, out); }
static int w_ptx_size(void *prog, size_t *n) { return nvrtcGetPTXSize(prog, n); }
static int w_ptx(void *prog, char *out) { return nvrtcGetPTX(prog, out); }
static int w_destroy(void **prog) {
  nvrtcProgram p = *prog;
  int r = nvrtcDestroyProgram(&p);
  *prog = p;
  return r;
}
static const char *w_error(int r) { return nvrtcGetErrorString((nvrtcResult)r); }

static const nf_nvrtc_api linked_api = {
    w_version, w_n_archs, w_archs,  w_create, w_compile, w_log_size, w_log,
    w_cubin_size, w_cubin, w_ptx_size, w_ptx, w_destroy, w_error,
};
static const nf_nvrtc_api *const linked = &linked_api;

#else /* no NVRTC in this build */

static const nf_nvrtc_api *const linked = NULL;

#endif

static void missing(nf_buf *why) {
  if (why)
    nf_buf_puts(why, "this build has no CUDA target: NVRTC was not found under the CUDA toolkit "
                     "directory when it was configured (meson option gpu_toolkit, default "
                     "/usr/local/cuda)");
}

int nf_cuda_available(nf_buf *why) {
  if (!linked) missing(why);
  return linked != NULL;
}

void nf_cuda_codegen_version(char *out, size_t n) { nf_cuda_codegen_version_with(linked, out, n); }

int nf_cuda_compile(const nf_lprog *p, int sm, nf_blob *image, nf_cuda_plan *plan,
                    nf_buf *source, nf_cuda_stats *stats, nf_buf *err) {
  if (linked) return nf_cuda_compile_with(linked, p, sm, image, plan, source, stats, err);
  free(image->data);
  image->data = NULL;
  image->len = 0;
  if (stats) memset(stats, 0, sizeof *stats);
  missing(err);
  return NF_EUNSUPPORTED;
}

int nf_cuda_sm_supported(int sm, nf_buf *why) {
  if (linked) return nf_cuda_sm_supported_with(linked, sm, why);
  missing(why);
  return 0;
}

int nf_cuda_compile_bundle(const nf_lprog *p, int sm, nf_buf *bundle, nf_cuda_stats *stats,
                           nf_buf *err) {
  if (linked) return nf_cuda_compile_bundle_with(linked, p, sm, bundle, stats, err);
  if (stats) memset(stats, 0, sizeof *stats);
  missing(err);
  return NF_EUNSUPPORTED;
}
