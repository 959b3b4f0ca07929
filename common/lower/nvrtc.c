/* nvrtc.c - CUDA C -> cubin (or PTX) with NVRTC, which runs on the CPU:
 * no GPU and no driver are needed to compile.  NVRTC is reached through a
 * table of its entry points (nf_nvrtc.h): the one linked into this build
 * (nvrtc_link.c, the daemon and the tool) or one loaded at run time (the
 * client, common/runtime/nvrtc_rt.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_cuda.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void nf_cuda_codegen_version_with(const nf_nvrtc_api *api, char *out, size_t n) {
  int major = 0, minor = 0;
  if (!api) {
    snprintf(out, n, "neoflow-cuda r%d nvrtc-none", NF_CUDA_REVISION);
    return;
  }
  if (api->Version(&major, &minor) != NF_NVRTC_SUCCESS) major = minor = 0;
  snprintf(out, n, "neoflow-cuda r%d nvrtc-%d.%d", NF_CUDA_REVISION, major, minor);
}

/* The architectures this NVRTC compiles for, ascending (n_out entries). */
static int archs(const nf_nvrtc_api *api, int *out, int cap, int *n_out) {
  int n = 0;
  if (api->GetNumSupportedArchs(&n) != NF_NVRTC_SUCCESS || n <= 0) return 0;
  int *a = malloc((size_t)n * sizeof *a);
  if (!a) return 0;
  if (api->GetSupportedArchs(a) != NF_NVRTC_SUCCESS) {
    free(a);
    return 0;
  }
  *n_out = n < cap ? n : cap;
  memcpy(out, a, (size_t)*n_out * sizeof *out);
  free(a);
  return 1;
}

int nf_cuda_compile_with(const nf_nvrtc_api *api, const nf_lprog *p, int sm, nf_blob *image, nf_cuda_plan *plan,
                    nf_buf *source, nf_cuda_stats *stats, nf_buf *err) {
  free(image->data);
  image->data = NULL;
  image->len = 0;
  nf_cuda_stats st;
  memset(&st, 0, sizeof st);
  int av[128], n_av = 0;
  if (!archs(api, av, 128, &n_av) || n_av == 0) {
    nf_buf_puts(err, "NVRTC does not list the architectures it supports");
    return NF_EINTERNAL;
  }
  if (sm < av[0]) {
    nf_buf_printf(err, "sm_%d is older than this NVRTC supports (sm_%d and newer)", sm, av[0]);
    return NF_EUNSUPPORTED;
  }
  int known = 0;
  for (int i = 0; i < n_av; i++) known |= av[i] == sm;
  /* an architecture newer than NVRTC knows: PTX for its newest, which the
   * driver compiles for the device when loading the module */
  int ptx = !known && sm > av[n_av - 1];
  int arch = known ? sm : ptx ? av[n_av - 1] : sm;
  if (!known && !ptx) {
    nf_buf_printf(err, "sm_%d is not an architecture this NVRTC supports", sm);
    return NF_EUNSUPPORTED;
  }
  double t0 = now_ms();
  nf_buf src = NF_BUF_INIT;
  int rc = nf_cuda_emit(p, &src, plan, err);
  st.emit_ms = now_ms() - t0;
  if (rc) {
    nf_buf_free(&src);
    return rc;
  }
  st.source_bytes = src.len;
  double t1 = now_ms();
  void *prog = NULL;
  int r = api->CreateProgram(&prog, nf_buf_str(&src), "neoflow.cu", 0, NULL, NULL);
  if (r != NF_NVRTC_SUCCESS) {
    nf_buf_printf(err, "nvrtcCreateProgram: %s", api->GetErrorString(r));
    nf_buf_free(&src);
    nf_cuda_plan_free(plan);
    return r == NF_NVRTC_ERROR_OUT_OF_MEMORY ? NF_ENOMEM : NF_EINTERNAL;
  }
  char opt_arch[48];
  snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s_%d", ptx ? "compute" : "sm", arch);
  const char *opts[] = {opt_arch, "--std=c++17", "-w"};
  r = api->CompileProgram(prog, (int)(sizeof opts / sizeof opts[0]), opts);
  if (r != NF_NVRTC_SUCCESS) {
    size_t n = 0;
    nf_buf_printf(err, "NVRTC rejected the generated CUDA C (%s)", api->GetErrorString(r));
    if (api->GetProgramLogSize(prog, &n) == NF_NVRTC_SUCCESS && n > 1) {
      char *log = malloc(n);
      if (log && api->GetProgramLog(prog, log) == NF_NVRTC_SUCCESS) {
        nf_buf_puts(err, ":\n");
        nf_buf_add(err, log, n > 4096 ? 4096 : n - 1);
      }
      free(log);
    }
    rc = NF_EINTERNAL;
  } else {
    size_t n = 0;
    r = ptx ? api->GetPTXSize(prog, &n) : api->GetCUBINSize(prog, &n);
    if (r == NF_NVRTC_SUCCESS && n == 0) {
      nf_buf_printf(err, "NVRTC produced an empty image for %s", opt_arch);
      rc = NF_EINTERNAL;
    } else if (r == NF_NVRTC_SUCCESS && !(image->data = malloc(n))) {
      rc = NF_ENOMEM;
    } else if (r != NF_NVRTC_SUCCESS ||
               (r = ptx ? api->GetPTX(prog, (char *)image->data)
                        : api->GetCUBIN(prog, (char *)image->data)) != NF_NVRTC_SUCCESS) {
      nf_buf_printf(err, "NVRTC: %s", api->GetErrorString(r));
      rc = NF_EINTERNAL;
    } else {
      image->len = n;
    }
  }
  api->DestroyProgram(&prog);
  st.nvrtc_ms = now_ms() - t1;
  st.image_bytes = image->len;
  st.ptx = ptx;
  if (rc) {
    free(image->data);
    image->data = NULL;
    image->len = 0;
    nf_cuda_plan_free(plan);
  } else if (source) {
    nf_buf_add(source, src.data, src.len);
  }
  nf_buf_free(&src);
  if (stats) *stats = st;
  return rc;
}

int nf_cuda_sm_supported_with(const nf_nvrtc_api *api, int sm, nf_buf *why) {
  int av[128], n_av = 0;
  if (!archs(api, av, 128, &n_av) || n_av == 0) {
    if (why) nf_buf_puts(why, "NVRTC does not list the architectures it supports");
    return 0;
  }
  if (sm >= av[0]) return 1; /* a known one, a newer one through PTX, or between */
  if (why)
    nf_buf_printf(why, "sm_%d is older than this NVRTC supports (sm_%d and newer)", sm, av[0]);
  return 0;
}

int nf_cuda_compile_bundle_with(const nf_nvrtc_api *api, const nf_lprog *p, int sm, nf_buf *bundle,
                                nf_cuda_stats *stats, nf_buf *err) {
  nf_blob img = NF_BLOB_INIT;
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  nf_buf src = NF_BUF_INIT;
  nf_cuda_stats st;
  memset(&st, 0, sizeof st);
  int rc = nf_cuda_compile_with(api, p, sm, &img, &plan, &src, &st, err);
  if (rc == NF_OK) {
    rc = nf_cuda_bundle_encode(&plan, st.ptx ? NF_CUDA_IMAGE_PTX : NF_CUDA_IMAGE_CUBIN, sm,
                               img.data, img.len, src.data, src.len, bundle);
    if (rc != NF_OK) nf_buf_printf(err, "CUDA kernel bundle: %s", nf_strerror(rc));
  }
  if (stats) *stats = st;
  free(img.data); /* (nf_blob_free is the LLVM backend's) */
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  return rc;
}
