/* cuda_rt.c - nf_cuda_rt.h: the driver API through dlopen.
 *
 * The few driver types are declared here (the CUDA headers need not be
 * installed to build this): handles are pointers, CUdeviceptr is 64-bit,
 * CUresult an int.  Versioned entry points are looked up under their
 * versioned names (cuMemAlloc_v2, ...), as cuda.h's macros do. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "nf_cuda_rt.h"
#include "nf_env.h"
#include "nf_status.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUgraph, *CUgraphExec;
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  ATTR_CC_MAJOR = 75,
  ATTR_CC_MINOR = 76,
  STREAM_NON_BLOCKING = 1,
  EVENT_DISABLE_TIMING = 2,
  CAPTURE_MODE_THREAD_LOCAL = 1
};

typedef struct drv {
  void *lib;
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*PrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamQuery)(CUstream); /* NULL: nf_cuda_rt_idle synchronises */
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  /* graphs (optional: CUDA 11.4 and later) */
  CUresult (*BeginCapture)(CUstream, int);
  CUresult (*EndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  /* only tests/cuda_emu_driver.cc has it: a module from its CUDA C */
  CUresult (*EmuLoadSource)(CUmodule *, const char *, size_t);
} drv;

struct nf_cuda_rt {
  drv d;
  CUdevice dev;
  CUcontext ctx;
  CUstream stream; /* streams[0]: the libraries' */
  CUstream streams[NF_CUDA_MAX_STREAMS];
  int n_streams, cur; /* cur: where launches go */
  CUevent *evs;       /* nf_cuda_rt_events' */
  int n_evs;
  int sm;
  char name[128];
  int broken; /* a sticky error happened: the context is unusable */
  char broken_msg[256];
  CUevent ev[2]; /* nf_cuda_module_time's, made on first use */
  CUevent fork[NF_CUDA_MAX_STREAMS]; /* a capture's fork and joins */
  int capturing;
};

struct nf_cuda_graph {
  CUgraphExec exec;
};

struct nf_cuda_module {
  nf_cuda_rt *rt;
  CUmodule mod;
  nf_cuda_plan plan;
  CUfunction *fn;
};

static const char *ename(const drv *d, CUresult r) {
  const char *s = NULL;
  if (d->GetErrorName && d->GetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

/* Errors after which the context cannot be used (cuda.h: "the process
 * must be terminated and relaunched"). */
static int sticky(CUresult r) {
  return r == 700 || r == 701 || r == 702 || r == 714 || r == 715 || r == 716 || r == 717 ||
         r == 718 || r == 719 || r == 999;
}

static int check(nf_cuda_rt *rt, CUresult r, const char *what, nf_buf *err) {
  if (r == CUDA_SUCCESS) return NF_OK;
  const char *n = ename(&rt->d, r);
  nf_buf_printf(err, "%s: %s (%d)", what, n, r);
  if (sticky(r)) {
    rt->broken = 1;
    snprintf(rt->broken_msg, sizeof rt->broken_msg, "%s: %s (%d)", what, n, r);
    nf_buf_puts(err, "; the CUDA context is now unusable");
  }
  return r == CUDA_ERROR_OUT_OF_MEMORY ? NF_ENOMEM : NF_EIO;
}

static int usable(nf_cuda_rt *rt, nf_buf *err) {
  if (!rt->broken) return rt->d.CtxSetCurrent(rt->ctx) == CUDA_SUCCESS ? NF_OK : NF_EIO;
  if (err) nf_buf_printf(err, "the CUDA context broke earlier (%s)", rt->broken_msg);
  return NF_EIO;
}

static int load_driver(drv *d, nf_buf *why) {
  const char *path = nf_env(NF_ENV_LIBCUDA);
  if (!path || !*path) path = "libcuda.so.1";
  d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!d->lib) {
    nf_buf_printf(why, "no CUDA driver: cannot load %s (%s)", path, dlerror());
    return NF_EUNSUPPORTED;
  }
#define SYM(field, name)                                                                      \
  do {                                                                                        \
    *(void **)&d->field = dlsym(d->lib, name);                                                \
    if (!d->field) {                                                                          \
      nf_buf_printf(why, "the CUDA driver %s lacks %s (too old?)", path, name);                \
      return NF_EUNSUPPORTED;                                                                 \
    }                                                                                         \
  } while (0)
  SYM(Init, "cuInit");
  SYM(DeviceGetCount, "cuDeviceGetCount");
  SYM(DeviceGet, "cuDeviceGet");
  SYM(DeviceGetAttribute, "cuDeviceGetAttribute");
  SYM(DeviceGetName, "cuDeviceGetName");
  SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  SYM(CtxSetCurrent, "cuCtxSetCurrent");
  SYM(StreamCreate, "cuStreamCreate");
  SYM(StreamDestroy, "cuStreamDestroy_v2");
  SYM(StreamSynchronize, "cuStreamSynchronize");
  SYM(StreamWaitEvent, "cuStreamWaitEvent");
  SYM(MemAlloc, "cuMemAlloc_v2");
  SYM(MemFree, "cuMemFree_v2");
  SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  SYM(ModuleLoadData, "cuModuleLoadData");
  SYM(ModuleUnload, "cuModuleUnload");
  SYM(ModuleGetFunction, "cuModuleGetFunction");
  SYM(LaunchKernel, "cuLaunchKernel");
  SYM(GetErrorName, "cuGetErrorName");
  SYM(EventCreate, "cuEventCreate");
  SYM(EventDestroy, "cuEventDestroy_v2");
  SYM(EventRecord, "cuEventRecord");
  SYM(EventSynchronize, "cuEventSynchronize");
  SYM(EventElapsedTime, "cuEventElapsedTime");
#undef SYM
  *(void **)&d->StreamQuery = dlsym(d->lib, "cuStreamQuery");
  *(void **)&d->BeginCapture = dlsym(d->lib, "cuStreamBeginCapture_v2");
  *(void **)&d->EndCapture = dlsym(d->lib, "cuStreamEndCapture");
  *(void **)&d->GraphInstantiate = dlsym(d->lib, "cuGraphInstantiateWithFlags");
  *(void **)&d->GraphLaunch = dlsym(d->lib, "cuGraphLaunch");
  *(void **)&d->GraphExecDestroy = dlsym(d->lib, "cuGraphExecDestroy");
  *(void **)&d->GraphDestroy = dlsym(d->lib, "cuGraphDestroy");
  *(void **)&d->EmuLoadSource = dlsym(d->lib, "nfemuModuleLoadSource");
  return NF_OK;
}

int nf_cuda_rt_open(int device, nf_cuda_rt **out, nf_buf *why) {
  *out = NULL;
  nf_cuda_rt *rt = calloc(1, sizeof *rt);
  if (!rt) return NF_ENOMEM;
  int rc = load_driver(&rt->d, why), n = 0;
  CUresult r = CUDA_SUCCESS;
  if (rc == NF_OK && (r = rt->d.Init(0)) != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_STUB_LIBRARY)
      nf_buf_puts(why, "no CUDA driver: the library loaded is the toolkit's stub (cuInit: "
                       "CUDA_ERROR_STUB_LIBRARY)");
    else if (r == CUDA_ERROR_NO_DEVICE)
      nf_buf_puts(why, "no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)");
    else
      nf_buf_printf(why, "cuInit: %s (%d)", ename(&rt->d, r), r);
    rc = NF_EUNSUPPORTED;
  }
  if (rc == NF_OK && (rt->d.DeviceGetCount(&n) != CUDA_SUCCESS || device < 0 || device >= n)) {
    nf_buf_printf(why, "no CUDA device %d (%d present)", device, n);
    rc = NF_EUNSUPPORTED;
  }
  int major = 0, minor = 0;
  if (rc == NF_OK &&
      ((rc = check(rt, rt->d.DeviceGet(&rt->dev, device), "cuDeviceGet", why)) ||
       (rc = check(rt, rt->d.DeviceGetAttribute(&major, ATTR_CC_MAJOR, rt->dev),
                   "cuDeviceGetAttribute", why)) ||
       (rc = check(rt, rt->d.DeviceGetAttribute(&minor, ATTR_CC_MINOR, rt->dev),
                   "cuDeviceGetAttribute", why)) ||
       (rc = check(rt, rt->d.DeviceGetName(rt->name, (int)sizeof rt->name - 1, rt->dev),
                   "cuDeviceGetName", why)) ||
       (rc = check(rt, rt->d.PrimaryCtxRetain(&rt->ctx, rt->dev), "cuDevicePrimaryCtxRetain",
                   why)))) {
    rt->ctx = NULL;
  }
  if (rc == NF_OK && ((rc = check(rt, rt->d.CtxSetCurrent(rt->ctx), "cuCtxSetCurrent", why)) ||
                      (rc = check(rt, rt->d.StreamCreate(&rt->stream, STREAM_NON_BLOCKING),
                                  "cuStreamCreate", why))))
    rt->stream = NULL;
  if (rc) {
    nf_cuda_rt_close(rt);
    return rc;
  }
  rt->sm = major * 10 + minor;
  rt->streams[0] = rt->stream;
  rt->n_streams = 1;
  *out = rt;
  return NF_OK;
}

void nf_cuda_rt_close(nf_cuda_rt *rt) {
  if (!rt) return;
  for (int i = 0; i < 2 && !rt->broken; i++)
    if (rt->ev[i]) rt->d.EventDestroy(rt->ev[i]);
  for (int i = 0; i < rt->n_evs && !rt->broken; i++)
    if (rt->evs[i]) rt->d.EventDestroy(rt->evs[i]);
  for (int i = 0; i < NF_CUDA_MAX_STREAMS && !rt->broken; i++)
    if (rt->fork[i]) rt->d.EventDestroy(rt->fork[i]);
  free(rt->evs);
  for (int i = 1; i < rt->n_streams && !rt->broken; i++) rt->d.StreamDestroy(rt->streams[i]);
  if (rt->stream && !rt->broken) rt->d.StreamDestroy(rt->stream);
  if (rt->ctx) rt->d.PrimaryCtxRelease(rt->dev);
  if (rt->d.lib) dlclose(rt->d.lib);
  free(rt);
}

int nf_cuda_rt_sm(const nf_cuda_rt *rt) { return rt->sm; }

const char *nf_cuda_rt_name(const nf_cuda_rt *rt) { return rt->name; }

void *nf_cuda_rt_stream(const nf_cuda_rt *rt) { return rt->stream; }

int nf_cuda_rt_current(nf_cuda_rt *rt, nf_buf *err) { return usable(rt, err); }

int nf_cuda_rt_alloc(nf_cuda_rt *rt, size_t n, uint64_t *dptr, nf_buf *err) {
  *dptr = 0;
  int rc = usable(rt, err);
  if (rc || n == 0) return rc;
  CUdeviceptr p = 0;
  if ((rc = check(rt, rt->d.MemAlloc(&p, n), "cuMemAlloc", err))) return rc;
  *dptr = p;
  return NF_OK;
}

void nf_cuda_rt_free(nf_cuda_rt *rt, uint64_t dptr) {
  if (dptr && !rt->broken && rt->d.CtxSetCurrent(rt->ctx) == CUDA_SUCCESS) rt->d.MemFree(dptr);
}

int nf_cuda_rt_set_streams(nf_cuda_rt *rt, int n, nf_buf *err) {
  int rc = usable(rt, err);
  if (n > NF_CUDA_MAX_STREAMS) n = NF_CUDA_MAX_STREAMS;
  while (rc == NF_OK && rt->n_streams < n) {
    rc = check(rt, rt->d.StreamCreate(&rt->streams[rt->n_streams], STREAM_NON_BLOCKING),
               "cuStreamCreate", err);
    if (rc == NF_OK) rt->n_streams++;
  }
  return rc;
}

int nf_cuda_rt_n_streams(const nf_cuda_rt *rt) { return rt->n_streams; }

void nf_cuda_rt_select(nf_cuda_rt *rt, int i) { rt->cur = i >= 0 && i < rt->n_streams ? i : 0; }

int nf_cuda_rt_selected(const nf_cuda_rt *rt) { return rt->cur; }

void *nf_cuda_rt_stream_at(const nf_cuda_rt *rt, int i) {
  return i >= 0 && i < rt->n_streams ? rt->streams[i] : rt->stream;
}

int nf_cuda_rt_events(nf_cuda_rt *rt, int n, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc || n <= rt->n_evs) return rc;
  CUevent *e = realloc(rt->evs, (size_t)n * sizeof *e);
  if (!e) return NF_ENOMEM;
  rt->evs = e;
  while (rc == NF_OK && rt->n_evs < n) {
    rc = check(rt, rt->d.EventCreate(&rt->evs[rt->n_evs], EVENT_DISABLE_TIMING), "cuEventCreate",
               err);
    if (rc == NF_OK) rt->n_evs++;
  }
  return rc;
}

int nf_cuda_rt_record(nf_cuda_rt *rt, int ev, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc) return rc;
  if (ev < 0 || ev >= rt->n_evs) return NF_EINVAL;
  return check(rt, rt->d.EventRecord(rt->evs[ev], rt->streams[rt->cur]), "cuEventRecord", err);
}

int nf_cuda_rt_wait(nf_cuda_rt *rt, int ev, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc) return rc;
  if (ev < 0 || ev >= rt->n_evs) return NF_EINVAL;
  return check(rt, rt->d.StreamWaitEvent(rt->streams[rt->cur], rt->evs[ev], 0),
               "cuStreamWaitEvent", err);
}

int nf_cuda_rt_broken(const nf_cuda_rt *rt) { return rt->broken; }

int nf_cuda_rt_graphs(const nf_cuda_rt *rt) {
  const drv *d = &rt->d;
  return d->BeginCapture && d->EndCapture && d->GraphInstantiate && d->GraphLaunch &&
         d->GraphExecDestroy && d->GraphDestroy;
}

int nf_cuda_rt_capture_begin(nf_cuda_rt *rt, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc) return rc;
  if (!nf_cuda_rt_graphs(rt) || rt->capturing) return NF_EUNSUPPORTED;
  for (int i = 0; rc == NF_OK && i < rt->n_streams; i++)
    if (!rt->fork[i])
      rc = check(rt, rt->d.EventCreate(&rt->fork[i], EVENT_DISABLE_TIMING), "cuEventCreate", err);
  if (rc == NF_OK)
    rc = check(rt, rt->d.BeginCapture(rt->stream, CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture", err);
  if (rc != NF_OK) return rc;
  rt->capturing = 1;
  /* the other streams join the capture by waiting for stream 0 */
  if (rt->n_streams > 1)
    rc = check(rt, rt->d.EventRecord(rt->fork[0], rt->stream), "cuEventRecord", err);
  for (int i = 1; rc == NF_OK && i < rt->n_streams; i++)
    rc = check(rt, rt->d.StreamWaitEvent(rt->streams[i], rt->fork[0], 0), "cuStreamWaitEvent",
               err);
  if (rc != NF_OK) nf_cuda_rt_capture_abort(rt);
  return rc;
}

/* Stream 0 waits for every other stream's work so far (a capture's
 * join). */
static int join_streams(nf_cuda_rt *rt, nf_buf *err) {
  int rc = NF_OK;
  for (int i = 1; rc == NF_OK && i < rt->n_streams; i++) {
    rc = check(rt, rt->d.EventRecord(rt->fork[i], rt->streams[i]), "cuEventRecord", err);
    if (rc == NF_OK)
      rc = check(rt, rt->d.StreamWaitEvent(rt->stream, rt->fork[i], 0), "cuStreamWaitEvent", err);
  }
  return rc;
}

void nf_cuda_rt_capture_abort(nf_cuda_rt *rt) {
  if (!rt->capturing) return;
  CUgraph g = NULL;
  /* joins what it can, so that the capture ends (an unjoined one fails
   * and is ended all the same) */
  nf_buf ignore = NF_BUF_INIT;
  if (!rt->broken) join_streams(rt, &ignore);
  nf_buf_free(&ignore);
  if (rt->d.EndCapture(rt->stream, &g) == CUDA_SUCCESS && g) rt->d.GraphDestroy(g);
  rt->capturing = 0;
}

int nf_cuda_rt_capture_end(nf_cuda_rt *rt, nf_cuda_graph **out, nf_buf *err) {
  *out = NULL;
  if (!rt->capturing) return NF_EINVAL;
  int rc = join_streams(rt, err);
  if (rc != NF_OK) {
    nf_cuda_rt_capture_abort(rt);
    return rc;
  }
  CUgraph g = NULL;
  rt->capturing = 0;
  rc = check(rt, rt->d.EndCapture(rt->stream, &g), "cuStreamEndCapture", err);
  nf_cuda_graph *ng = rc == NF_OK ? calloc(1, sizeof *ng) : NULL;
  if (rc == NF_OK && !ng) rc = NF_ENOMEM;
  if (rc == NF_OK)
    rc = check(rt, rt->d.GraphInstantiate(&ng->exec, g, 0), "cuGraphInstantiate", err);
  if (g) rt->d.GraphDestroy(g);
  if (rc != NF_OK) {
    free(ng);
    return rc;
  }
  *out = ng;
  return NF_OK;
}

int nf_cuda_rt_graph_launch(nf_cuda_rt *rt, nf_cuda_graph *g, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc) return rc;
  return check(rt, rt->d.GraphLaunch(g->exec, rt->stream), "cuGraphLaunch", err);
}

void nf_cuda_graph_free(nf_cuda_rt *rt, nf_cuda_graph *g) {
  if (!g) return;
  /* also after a sticky error (the driver frees it or refuses: either
   * way nothing of it is left to us) */
  rt->d.CtxSetCurrent(rt->ctx);
  rt->d.GraphExecDestroy(g->exec);
  free(g);
}

/* Waits for every stream but the libraries' (streams[0]). */
static int sync_others(nf_cuda_rt *rt, nf_buf *err) {
  int rc = NF_OK;
  for (int i = 1; rc == NF_OK && i < rt->n_streams; i++)
    rc = check(rt, rt->d.StreamSynchronize(rt->streams[i]), "cuStreamSynchronize", err);
  return rc;
}

int nf_cuda_rt_upload(nf_cuda_rt *rt, uint64_t dst, const void *src, size_t n, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc || n == 0) return rc;
  /* with several streams: after everything queued (which may still read
   * dst), and complete before anything queued later on any stream */
  if (rt->n_streams > 1 && (rc = sync_others(rt, err)) != NF_OK) return rc;
  rc = check(rt, rt->d.MemcpyHtoDAsync(dst, src, n, rt->stream), "cuMemcpyHtoDAsync", err);
  if (rc == NF_OK && rt->n_streams > 1)
    rc = check(rt, rt->d.StreamSynchronize(rt->stream), "cuStreamSynchronize", err);
  return rc;
}

int nf_cuda_rt_download(nf_cuda_rt *rt, void *dst, uint64_t src, size_t n, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc || n == 0) return rc;
  if (rt->n_streams > 1 && (rc = sync_others(rt, err)) != NF_OK) return rc;
  if ((rc = check(rt, rt->d.MemcpyDtoHAsync(dst, src, n, rt->stream), "cuMemcpyDtoHAsync", err)))
    return rc;
  return check(rt, rt->d.StreamSynchronize(rt->stream), "cuStreamSynchronize", err);
}

int nf_cuda_rt_idle(nf_cuda_rt *rt, int *idle, nf_buf *err) {
  *idle = 0;
  int rc = usable(rt, err);
  if (rc) return rc;
  if (!rt->d.StreamQuery) {
    rc = nf_cuda_rt_sync(rt, err);
    *idle = rc == NF_OK;
    return rc;
  }
  for (int i = 0; i < (rt->n_streams > 1 ? rt->n_streams : 1); i++) {
    CUresult r = rt->d.StreamQuery(rt->n_streams > 1 ? rt->streams[i] : rt->stream);
    if (r == 600) return NF_OK; /* CUDA_ERROR_NOT_READY: work queued still runs */
    if ((rc = check(rt, r, "cuStreamQuery", err)) != NF_OK) return rc;
  }
  *idle = 1;
  return NF_OK;
}

int nf_cuda_rt_sync(nf_cuda_rt *rt, nf_buf *err) {
  int rc = usable(rt, err);
  if (rc) return rc;
  rc = check(rt, rt->d.StreamSynchronize(rt->stream), "cuStreamSynchronize", err);
  return rc == NF_OK ? sync_others(rt, err) : rc;
}

/* Loads a module from image (n bytes), or, with the emulated driver,
 * from the CUDA C src (src_len bytes). */
static int load_module(nf_cuda_rt *rt, const void *image, size_t n, const char *src,
                       size_t src_len, const nf_cuda_plan *plan, nf_cuda_module **out,
                       nf_buf *err) {
  *out = NULL;
  int rc = usable(rt, err);
  if (rc) return rc;
  if ((!src && (!image || n == 0)) || !plan || plan->n_launches < 0) {
    nf_buf_puts(err, "empty kernel image or plan");
    return NF_EINVAL;
  }
  nf_cuda_module *m = calloc(1, sizeof *m);
  if (!m) return NF_ENOMEM;
  m->rt = rt;
  m->plan = *plan;
  m->plan.launches = malloc((size_t)(plan->n_launches ? plan->n_launches : 1) *
                            sizeof *plan->launches);
  m->fn = calloc((size_t)(plan->n_launches ? plan->n_launches : 1), sizeof *m->fn);
  if (!m->plan.launches || !m->fn) {
    nf_cuda_module_free(m);
    return NF_ENOMEM;
  }
  memcpy(m->plan.launches, plan->launches, (size_t)plan->n_launches * sizeof *plan->launches);
  CUresult r = rt->d.EmuLoadSource && src
                   ? rt->d.EmuLoadSource(&m->mod, src, src_len)
                   : rt->d.ModuleLoadData(&m->mod, image);
  if ((rc = check(rt, r, "cuModuleLoadData", err))) {
    m->mod = NULL;
    nf_cuda_module_free(m);
    return rc;
  }
  for (int i = 0; i < plan->n_launches; i++) {
    char name[sizeof plan->launches[i].name + 1];
    memcpy(name, plan->launches[i].name, sizeof plan->launches[i].name);
    name[sizeof plan->launches[i].name] = 0;
    if ((rc = check(rt, rt->d.ModuleGetFunction(&m->fn[i], m->mod, name), "cuModuleGetFunction",
                    err))) {
      nf_buf_printf(err, " ('%s')", name);
      nf_cuda_module_free(m);
      return rc;
    }
  }
  *out = m;
  return NF_OK;
}

/* The health probe: y[0] = x[0] + 1 on one thread.  PTX (ISA 6.0,
 * sm_50: any driver since CUDA 9 compiles it for its device), and the
 * same kernel in CUDA C for the tests' emulated driver. */
static const char probe_ptx[] =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry nf_probe(.param .u64 nf_probe_x, .param .u64 nf_probe_y,\n"
    "                         .param .u64 nf_probe_scratch)\n"
    "{\n"
    "  .reg .pred %p<2>;\n  .reg .f32 %f<3>;\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [nf_probe_x];\n"
    "  ld.param.u64 %rd2, [nf_probe_y];\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  or.b32 %r3, %r1, %r2;\n"
    "  setp.ne.s32 %p1, %r3, 0;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd3, %rd1;\n"
    "  ld.global.f32 %f1, [%rd3];\n"
    "  add.f32 %f2, %f1, 0f3F800000;\n"
    "  cvta.to.global.u64 %rd4, %rd2;\n"
    "  st.global.f32 [%rd4], %f2;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";
static const char probe_src[] =
    "extern \"C\" __global__ void nf_probe(float *x, float *y, unsigned char *scratch) {\n"
    "  if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = x[0] + 1.0f;\n"
    "}\n";

const char *nf_cuda_rt_probe_ptx(void) { return probe_ptx; }

int nf_cuda_rt_probe(nf_cuda_rt *rt, nf_buf *err) {
  nf_cuda_launch l = {"nf_probe", 1, 32, 0};
  nf_cuda_plan plan = {1, &l, 0, 2};
  nf_cuda_module *m = NULL;
  uint64_t d[2] = {0, 0};
  const float x = 2.5f;
  float y = 0;
  int rc = load_module(rt, probe_ptx, sizeof probe_ptx, probe_src, sizeof probe_src - 1, &plan,
                       &m, err);
  for (int i = 0; rc == NF_OK && i < 2; i++) rc = nf_cuda_rt_alloc(rt, sizeof(float), &d[i], err);
  if (rc == NF_OK) rc = nf_cuda_rt_upload(rt, d[0], &x, sizeof x, err);
  if (rc == NF_OK) rc = nf_cuda_module_run(m, d, 2, 0, err);
  if (rc == NF_OK) rc = nf_cuda_rt_download(rt, &y, d[1], sizeof y, err);
  if (rc == NF_OK && y != 3.5f) {
    nf_buf_printf(err, "the probe kernel computed %g, not 3.5", (double)y);
    rc = NF_EIO;
  }
  nf_buf probe = NF_BUF_INIT;
  if (nf_cuda_rt_sync(rt, &probe) == NF_OK)
    for (int i = 0; i < 2; i++) nf_cuda_rt_free(rt, d[i]);
  nf_buf_free(&probe);
  nf_cuda_module_free(m);
  return rc;
}

int nf_cuda_module_load(nf_cuda_rt *rt, const void *image, size_t n, const nf_cuda_plan *plan,
                        nf_cuda_module **out, nf_buf *err) {
  return load_module(rt, image, n, NULL, 0, plan, out, err);
}

int nf_cuda_module_load_bundle(nf_cuda_rt *rt, const nf_cuda_bundle *b, nf_cuda_module **out,
                               nf_buf *err) {
  *out = NULL;
  if (rt->d.EmuLoadSource && !b->source_len) {
    nf_buf_puts(err, "the emulated CUDA driver needs the bundle's source, and it has none");
    return NF_EINVAL;
  }
  if (b->image_kind == NF_CUDA_IMAGE_PTX && b->image_len &&
      memchr(b->image, 0, b->image_len) == NULL) {
    /* the driver reads PTX as a C string */
    char *z = malloc(b->image_len + 1);
    if (!z) return NF_ENOMEM;
    memcpy(z, b->image, b->image_len);
    z[b->image_len] = 0;
    int rc = load_module(rt, z, b->image_len + 1, b->source, b->source_len, &b->plan, out, err);
    free(z);
    return rc;
  }
  return load_module(rt, b->image, b->image_len, b->source, b->source_len, &b->plan, out, err);
}

int nf_cuda_rt_emulated(const nf_cuda_rt *rt) { return rt->d.EmuLoadSource != NULL; }

int nf_cuda_module_run(nf_cuda_module *m, const uint64_t *args, uint32_t n_args, uint64_t scratch,
                       nf_buf *err) {
  nf_cuda_rt *rt = m->rt;
  int rc = usable(rt, err);
  if (rc) return rc;
  if (n_args != m->plan.n_args) {
    nf_buf_printf(err, "kernel takes %u buffers, got %u", m->plan.n_args, n_args);
    return NF_EINVAL;
  }
  if (m->plan.scratch_bytes && !scratch) {
    nf_buf_printf(err, "kernel needs %llu bytes of scratch, got none",
                  (unsigned long long)m->plan.scratch_bytes);
    return NF_EINVAL;
  }
  void **params = malloc((size_t)(n_args + 1) * sizeof *params);
  CUdeviceptr *vals = malloc((size_t)(n_args + 1) * sizeof *vals);
  if (!params || !vals) {
    free(params);
    free(vals);
    return NF_ENOMEM;
  }
  for (uint32_t i = 0; i < n_args; i++) vals[i] = args[i];
  vals[n_args] = scratch;
  for (uint32_t i = 0; i <= n_args; i++) params[i] = &vals[i];
  for (int i = 0; i < m->plan.n_launches && rc == NF_OK; i++) {
    const nf_cuda_launch *l = &m->plan.launches[i];
    if (l->grid == 0) continue;
    rc = check(rt, rt->d.LaunchKernel(m->fn[i], l->grid, 1, 1, l->block ? l->block : 1, 1, 1, 0,
                                      rt->streams[rt->cur], params, NULL),
               "cuLaunchKernel", err);
  }
  free(params);
  free(vals);
  return rc;
}

void nf_cuda_module_free(nf_cuda_module *m) {
  if (!m) return;
  if (m->mod && !m->rt->broken && m->rt->d.CtxSetCurrent(m->rt->ctx) == CUDA_SUCCESS)
    m->rt->d.ModuleUnload(m->mod);
  free(m->plan.launches);
  free(m->fn);
  free(m);
}

int nf_cuda_module_time(nf_cuda_module *m, const uint64_t *args, uint32_t n_args, uint64_t scratch,
                        double *ms, nf_buf *err) {
  nf_cuda_rt *rt = m->rt;
  *ms = 0;
  int rc = usable(rt, err);
  for (int i = 0; rc == NF_OK && i < 2; i++)
    if (!rt->ev[i]) rc = check(rt, rt->d.EventCreate(&rt->ev[i], 0), "cuEventCreate", err);
  CUstream st = rt->streams[rt->cur];
  if (rc == NF_OK) rc = check(rt, rt->d.EventRecord(rt->ev[0], st), "cuEventRecord", err);
  if (rc == NF_OK) rc = nf_cuda_module_run(m, args, n_args, scratch, err);
  if (rc == NF_OK) rc = check(rt, rt->d.EventRecord(rt->ev[1], st), "cuEventRecord", err);
  if (rc == NF_OK) rc = check(rt, rt->d.EventSynchronize(rt->ev[1]), "cuEventSynchronize", err);
  float f = 0;
  if (rc == NF_OK)
    rc = check(rt, rt->d.EventElapsedTime(&f, rt->ev[0], rt->ev[1]), "cuEventElapsedTime", err);
  if (rc == NF_OK) *ms = f;
  return rc;
}
