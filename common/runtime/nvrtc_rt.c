/* nvrtc_rt.c - NVRTC through dlopen (nf_nvrtc_rt.h). */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_config.h"
#include "nf_env.h"
#include "nf_nvrtc_rt.h"
#include "nf_status.h"

struct nf_nvrtc_rt {
  void *lib;
  nf_nvrtc_api api;
  char describe[256];
};

void nf_nvrtc_rt_close(nf_nvrtc_rt *r) {
  if (!r) return;
  /* NVRTC is not unloaded: it keeps thread-local state that a dlclose
   * would leave dangling in threads that used it */
  free(r);
}

const nf_nvrtc_api *nf_nvrtc_rt_api(const nf_nvrtc_rt *r) { return &r->api; }

const char *nf_nvrtc_rt_describe(const nf_nvrtc_rt *r) { return r->describe; }

int nf_nvrtc_rt_open(nf_nvrtc_rt **out, nf_buf *why) {
  *out = NULL;
  const char *env = nf_env(NF_ENV_LIBNVRTC);
  if (env && !strcmp(env, "none")) {
    nf_buf_puts(why, "NVRTC disabled ($NEOFLOW_LIBNVRTC=none)");
    return NF_EUNSUPPORTED;
  }
  nf_nvrtc_rt *r = calloc(1, sizeof *r);
  if (!r) return NF_ENOMEM;
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                      "libnvrtc.so", NF_CUDA_LIBDIR "/libnvrtc.so"};
  const char *from = env;
  if (env && *env) r->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; !r->lib && !(env && *env) && i < sizeof names / sizeof *names; i++)
    if ((r->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) from = names[i];
  if (!r->lib) {
    nf_buf_printf(why, "no NVRTC: cannot load %s (%s)",
                  env && *env ? env : "libnvrtc.so.13/.12/.11.2", dlerror());
    free(r);
    return NF_EUNSUPPORTED;
  }
  static const struct {
    size_t off;
    const char *name;
  } syms[] = {
      {offsetof(nf_nvrtc_api, Version), "nvrtcVersion"},
      {offsetof(nf_nvrtc_api, GetNumSupportedArchs), "nvrtcGetNumSupportedArchs"},
      {offsetof(nf_nvrtc_api, GetSupportedArchs), "nvrtcGetSupportedArchs"},
      {offsetof(nf_nvrtc_api, CreateProgram), "nvrtcCreateProgram"},
      {offsetof(nf_nvrtc_api, CompileProgram), "nvrtcCompileProgram"},
      {offsetof(nf_nvrtc_api, GetProgramLogSize), "nvrtcGetProgramLogSize"},
      {offsetof(nf_nvrtc_api, GetProgramLog), "nvrtcGetProgramLog"},
      {offsetof(nf_nvrtc_api, GetCUBINSize), "nvrtcGetCUBINSize"},
      {offsetof(nf_nvrtc_api, GetCUBIN), "nvrtcGetCUBIN"},
      {offsetof(nf_nvrtc_api, GetPTXSize), "nvrtcGetPTXSize"},
      {offsetof(nf_nvrtc_api, GetPTX), "nvrtcGetPTX"},
      {offsetof(nf_nvrtc_api, DestroyProgram), "nvrtcDestroyProgram"},
      {offsetof(nf_nvrtc_api, GetErrorString), "nvrtcGetErrorString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    void *f = dlsym(r->lib, syms[i].name);
    if (!f) {
      nf_buf_printf(why, "the NVRTC library %s lacks %s", from, syms[i].name);
      dlclose(r->lib);
      free(r);
      return NF_EUNSUPPORTED;
    }
    memcpy((char *)&r->api + syms[i].off, &f, sizeof f);
  }
  int major = 0, minor = 0;
  if (r->api.Version(&major, &minor) != NF_NVRTC_SUCCESS) major = minor = 0;
  snprintf(r->describe, sizeof r->describe, "NVRTC %d.%d (%s)", major, minor, from);
  *out = r;
  return NF_OK;
}
