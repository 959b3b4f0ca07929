/* nvrtc.c - CUDA C -> cubin (or PTX) with NVRTC, which runs on the CPU:
 * no GPU and no driver are needed to compile.  Built against NVRTC when
 * meson found it under the toolkit directory (NF_HAVE_CUDA); otherwise
 * every call says that the CUDA target is missing from this build. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_config.h"
#include "nf_cuda.h"

/* Bump when the CUDA C made for the same program changes. */
#define NF_CUDA_REVISION 1

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#if NF_HAVE_CUDA
#include <nvrtc.h>

int nf_cuda_available(nf_buf *why) {
  (void)why;
  return 1;
}

void nf_cuda_codegen_version(char *out, size_t n) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = 0;
  snprintf(out, n, "neoflow-cuda r%d nvrtc-%d.%d", NF_CUDA_REVISION, major, minor);
}

/* The architectures this NVRTC compiles for, ascending (n_out entries). */
static int archs(int *out, int cap, int *n_out) {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return 0;
  int *a = malloc((size_t)n * sizeof *a);
  if (!a) return 0;
  if (nvrtcGetSupportedArchs(a) != NVRTC_SUCCESS) {
    free(a);
    return 0;
  }
  *n_out = n < cap ? n : cap;
  memcpy(out, a, (size_t)*n_out * sizeof *out);
  free(a);
  return 1;
}

int nf_cuda_compile(const nf_lprog *p, int sm, nf_blob *image, nf_cuda_plan *plan,
                    nf_buf *source, nf_cuda_stats *stats, nf_buf *err) {
  free(image->data);
  image->data = NULL;
  image->len = 0;
  nf_cuda_stats st;
  memset(&st, 0, sizeof st);
  int av[128], n_av = 0;
  if (!archs(av, 128, &n_av) || n_av == 0) {
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
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, nf_buf_str(&src), "neoflow.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    nf_buf_printf(err, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    nf_buf_free(&src);
    nf_cuda_plan_free(plan);
    return r == NVRTC_ERROR_OUT_OF_MEMORY ? NF_ENOMEM : NF_EINTERNAL;
  }
  char opt_arch[48];
  snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s_%d", ptx ? "compute" : "sm", arch);
  const char *opts[] = {opt_arch, "--std=c++17", "-w"};
  r = nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof opts[0]), opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nf_buf_printf(err, "NVRTC rejected the generated CUDA C (%s)", nvrtcGetErrorString(r));
    if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
      char *log = malloc(n);
      if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
        nf_buf_puts(err, ":\n");
        nf_buf_add(err, log, n > 4096 ? 4096 : n - 1);
      }
      free(log);
    }
    rc = NF_EINTERNAL;
  } else {
    size_t n = 0;
    r = ptx ? nvrtcGetPTXSize(prog, &n) : nvrtcGetCUBINSize(prog, &n);
    if (r == NVRTC_SUCCESS && n == 0) {
      nf_buf_printf(err, "NVRTC produced an empty image for %s", opt_arch);
      rc = NF_EINTERNAL;
    } else if (r == NVRTC_SUCCESS && !(image->data = malloc(n))) {
      rc = NF_ENOMEM;
    } else if (r != NVRTC_SUCCESS ||
               (r = ptx ? nvrtcGetPTX(prog, (char *)image->data)
                        : nvrtcGetCUBIN(prog, (char *)image->data)) != NVRTC_SUCCESS) {
      nf_buf_printf(err, "NVRTC: %s", nvrtcGetErrorString(r));
      rc = NF_EINTERNAL;
    } else {
      image->len = n;
    }
  }
  nvrtcDestroyProgram(&prog);
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

int nf_cuda_sm_supported(int sm, nf_buf *why) {
  int av[128], n_av = 0;
  if (!archs(av, 128, &n_av) || n_av == 0) {
    if (why) nf_buf_puts(why, "NVRTC does not list the architectures it supports");
    return 0;
  }
  if (sm >= av[0]) return 1; /* a known one, a newer one through PTX, or between */
  if (why)
    nf_buf_printf(why, "sm_%d is older than this NVRTC supports (sm_%d and newer)", sm, av[0]);
  return 0;
}

#else /* no NVRTC in this build */

static void missing(nf_buf *why) {
  if (why)
    nf_buf_puts(why, "this build has no CUDA target: NVRTC was not found under the CUDA toolkit "
                     "directory when it was configured (meson option gpu_toolkit, default "
                     "/usr/local/cuda)");
}

int nf_cuda_available(nf_buf *why) {
  missing(why);
  return 0;
}

void nf_cuda_codegen_version(char *out, size_t n) {
  snprintf(out, n, "neoflow-cuda r%d nvrtc-none", NF_CUDA_REVISION);
}

int nf_cuda_compile(const nf_lprog *p, int sm, nf_blob *image, nf_cuda_plan *plan,
                    nf_buf *source, nf_cuda_stats *stats, nf_buf *err) {
  (void)p, (void)sm, (void)plan, (void)source, (void)now_ms;
  free(image->data);
  image->data = NULL;
  image->len = 0;
  if (stats) memset(stats, 0, sizeof *stats);
  missing(err);
  return NF_EUNSUPPORTED;
}

int nf_cuda_sm_supported(int sm, nf_buf *why) {
  (void)sm;
  missing(why);
  return 0;
}

#endif

int nf_cuda_compile_bundle(const nf_lprog *p, int sm, nf_buf *bundle, nf_cuda_stats *stats,
                           nf_buf *err) {
  nf_blob img = NF_BLOB_INIT;
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  nf_buf src = NF_BUF_INIT;
  nf_cuda_stats st;
  memset(&st, 0, sizeof st);
  int rc = nf_cuda_compile(p, sm, &img, &plan, &src, &st, err);
  if (rc == NF_OK) {
    rc = nf_cuda_bundle_encode(&plan, st.ptx ? NF_CUDA_IMAGE_PTX : NF_CUDA_IMAGE_CUBIN, sm,
                               img.data, img.len, src.data, src.len, bundle);
    if (rc != NF_OK) nf_buf_printf(err, "CUDA kernel bundle: %s", nf_strerror(rc));
  }
  if (stats) *stats = st;
  nf_blob_free(&img);
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  return rc;
}
