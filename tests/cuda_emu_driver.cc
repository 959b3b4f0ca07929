/* cuda_emu_driver.cc - a CUDA driver library for tests on machines
 * without a GPU: the driver API entry points that client/executor/
 * cuda_rt.c loads (NEOFLOW_LIBCUDA=<this library>), with device memory in
 * host memory, synchronous streams, and kernels run on the CPU.
 *
 * A cubin cannot run on the CPU, so cuModuleLoadData refuses every image
 * (CUDA_ERROR_INVALID_IMAGE); the runtime loads through the extra entry
 * point nfemuModuleLoadSource instead when the driver has it (only this
 * one does), with the CUDA C that the kernel bundle carries.  The source
 * is compiled with the host's C++ compiler ($CXX, else c++) after
 * tests/cuda_emu.h ($NF_TEST_CUDA_EMU), which runs a block's threads as
 * coroutines with real barriers (see there for what is emulated and what
 * is not).  Compiled modules are kept by the source's hash under
 * $TMPDIR/nf-cuda-emu-<uid>/ for the next load.
 *
 * Streams are queues run lazily and adversarially: work is only queued
 * until something waits (a stream or event synchronisation, a free, an
 * unload), and then the queued work runs newest stream first, each
 * stream's items in order, a stream stopping only at a wait for an event
 * not yet recorded.  So work on another stream that the caller did not
 * order with an event runs in the wrong order here and shows as wrong
 * results, where a real GPU would show it only now and then.  A host to
 * device copy takes its bytes when queued (as the driver does with
 * pageable memory).  cuBLAS's and cuDNN's emulations queue their
 * computation on the stream (the extra entry point nfemuEnqueue: a host
 * function run in stream order, as the real libraries' kernels are).
 *
 * CUDA graphs by stream capture, with the driver's rules: between
 * cuStreamBeginCapture_v2 and cuStreamEndCapture work queued on a stream
 * of the capture is recorded, not run; a stream joins by waiting for an
 * event recorded in the capture; synchronising, copying or allocating
 * meanwhile fails (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), as does
 * waiting for an event recorded outside it (..._ISOLATION); ending with
 * a stream that did not join back fails (..._UNJOINED).  cuGraphLaunch
 * queues the recorded work on its streams again, after the launching
 * stream's work and before what that stream does next.
 * $NF_EMU_CAPTURE_FAIL=1 makes every capture end invalidated.
 *
 * cuStreamQuery runs the stream's queued work, so it answers "done".
 * $NF_EMU_DEVICES devices (default 1), all alike.
 *
 * The device: compute capability $NF_EMU_SM (default 90), named
 * "NeoFlow CPU emulation of sm_<sm>".  $NF_EMU_FAIL_LAUNCH=N makes the
 * N-th launch (and every later one: the error is sticky) fail with
 * CUDA_ERROR_ILLEGAL_ADDRESS (a sticky error), a graph's launches counted
 * when it is launched, for tests of the runtime's handling of a broken
 * context.
 *
 * Test code, not shipped: built only with the tests. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  E_INVALID_VALUE = 1,
  E_OUT_OF_MEMORY = 2,
  E_NOT_INITIALIZED = 3,
  E_INVALID_DEVICE = 101,
  E_INVALID_IMAGE = 200,
  E_INVALID_HANDLE = 400,
  E_ILLEGAL_STATE = 401,
  E_NOT_FOUND = 500,
  E_ILLEGAL_ADDRESS = 700,
  E_LAUNCH_FAILED = 719,
  E_CAPTURE_UNSUPPORTED = 900,
  E_CAPTURE_INVALIDATED = 901,
  E_CAPTURE_UNJOINED = 904,
  E_CAPTURE_ISOLATION = 905,
  E_UNKNOWN = 999
};

enum { MAX_PARAMS = 96 }; /* a kernel's buffers and its scratch */

struct emu_fn {
  void *fn;
  int n_params;
  struct emu_module *mod;
};

struct emu_module {
  void *h;
  int (*launch)(void *fn, unsigned grid, unsigned block, void **args);
  std::vector<emu_fn *> fns;
  std::vector<std::pair<std::string, int>> sigs; /* kernel name, parameter count */
};

static std::mutex g_mu;
/* what the "device" holds: freed when the library is unloaded, also what
 * a broken context's owner could not free (the real driver drops it with
 * the context); plain pointers, so nothing depends on the order of static
 * destructors */
static std::set<uintptr_t> *g_allocs;
static std::set<emu_module *> *g_mods;
static int g_init, g_ctx_refs, g_broken, g_launches;
static int g_ctx_token;

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

static int sm() { return env_int("NF_EMU_SM", 90); }

extern "C" {

CUresult cuInit(unsigned flags) {
  if (flags != 0) return E_INVALID_VALUE;
  g_init = 1;
  return OK;
}

/* $NF_EMU_DEVICES devices (default 1), all the same one (data-parallel
 * tests: each rank opens its own, "cuda" being its local rank) */
static int n_devices(void) {
  const char *v = getenv("NF_EMU_DEVICES");
  int n = v ? atoi(v) : 1;
  return n >= 1 && n <= 64 ? n : 1;
}

CUresult cuDeviceGetCount(int *n) {
  if (!g_init) return E_NOT_INITIALIZED;
  *n = n_devices();
  return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!g_init) return E_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= n_devices()) return E_INVALID_DEVICE;
  *d = 0;
  return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  if (d != 0) return E_INVALID_DEVICE;
  switch (attr) {
    case 75: *v = sm() / 10; return OK;        /* compute capability major */
    case 76: *v = sm() % 10; return OK;        /* minor */
    case 16: *v = 4; return OK;                /* multiprocessors */
    case 1: *v = 1024; return OK;              /* max threads per block */
    case 8: *v = 48 << 10; return OK;          /* shared memory per block */
    default: *v = 0; return OK;
  }
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (d != 0) return E_INVALID_DEVICE;
  if (len <= 0) return E_INVALID_VALUE;
  snprintf(name, (size_t)len, "NeoFlow CPU emulation of sm_%d", sm());
  return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
  if (d != 0) return E_INVALID_DEVICE;
  g_ctx_refs++;
  *ctx = &g_ctx_token;
  return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (d != 0 || g_ctx_refs <= 0) return E_INVALID_DEVICE;
  g_ctx_refs--;
  return OK;
}

CUresult cuCtxSetCurrent(void *ctx) { return ctx == &g_ctx_token ? OK : E_INVALID_HANDLE; }

/* ---- streams and events ---- */

struct emu_event {
  int magic;
  long queued, done; /* records queued and run */
  int captured;      /* its last record is in the capture under way */
  double ms;         /* the host's clock when the last record ran */
};
enum { EVENT_MAGIC = 0x45564e54, STREAM_MAGIC = 0x5354524d };

enum item_kind { IT_LAUNCH, IT_H2D, IT_D2H, IT_RECORD, IT_WAIT, IT_HOST };

/* a library's queued computation (nfemuEnqueue) */
struct emu_host {
  void (*run)(void *);
  void *arg;
  void (*del)(void *);
  ~emu_host() {
    if (del) del(arg);
  }
};

struct emu_item {
  item_kind kind;
  emu_fn *f;
  unsigned grid, block;
  void *args[MAX_PARAMS];
  void *dst;
  const void *src;
  std::vector<char> bytes; /* a host to device copy's bytes */
  size_t n;
  emu_event *ev;
  long seq; /* a wait: for the event's record number seq */
  std::shared_ptr<emu_host> host;
};

struct emu_stream {
  int magic;
  std::deque<emu_item> q;
};

static std::vector<emu_stream *> *g_streams; /* in creation order */

/* a stream capture under way, or a graph: the work in the order it was
 * queued, each item with its stream */
struct emu_graph {
  int magic;
  std::vector<std::pair<emu_stream *, emu_item>> items;
  std::set<emu_stream *> streams; /* those that joined */
  /* an instantiated graph's own events: the launch's fork and joins */
  emu_event *fork = NULL;
  std::vector<emu_event *> joins;
};
enum { GRAPH_MAGIC = 0x47525048 };
static emu_graph *g_capture;    /* NULL: none */
static emu_stream *g_cap_origin;
static int g_cap_failed;        /* a call during it failed: the capture is invalidated */

static int capturing(emu_stream *x) { return g_capture && g_capture->streams.count(x); }

/* Queues it on x, or records it in the capture x belongs to. */
static void push(emu_stream *x, emu_item &&it) {
  if (capturing(x)) g_capture->items.emplace_back(x, std::move(it));
  else x->q.push_back(std::move(it));
}

/* An operation a capture does not allow: invalidates it. */
static CUresult refuse_in_capture() {
  g_cap_failed = 1;
  return E_CAPTURE_UNSUPPORTED;
}
/* events alive: freed on unloading with what a broken context's owner
 * could not destroy */
static std::set<emu_event *> *g_events;

static double clock_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int is_stream(void *s) {
  if (!s || !g_streams) return 0;
  for (emu_stream *x : *g_streams)
    if (x == s) return x->magic == STREAM_MAGIC;
  return 0;
}

/* Runs stream x's head item when it can run; 0 when blocked or empty. */
static int step(emu_stream *x) {
  if (x->q.empty()) return 0;
  emu_item &it = x->q.front();
  switch (it.kind) {
    case IT_WAIT:
      if (it.ev->done < it.seq) return 0;
      break;
    case IT_LAUNCH:
      if (!g_broken && it.f->mod->launch(it.f->fn, it.grid, it.block, it.args) != 0)
        g_broken = E_LAUNCH_FAILED;
      break;
    case IT_H2D: memcpy(it.dst, it.bytes.data(), it.n); break;
    case IT_D2H: memcpy(it.dst, it.src, it.n); break;
    case IT_RECORD:
      it.ev->done++;
      it.ev->ms = clock_ms();
      break;
    case IT_HOST:
      if (!g_broken) it.host->run(it.host->arg);
      break;
  }
  x->q.pop_front();
  return 1;
}

extern "C++" {
/* Runs queued work, newest stream first, until done() holds or nothing
 * can run (a wait for an event never recorded: CUDA_ERROR_UNKNOWN). */
template <class F> static CUresult drain(F done) {
  while (!done()) {
    int ran = 0;
    for (size_t i = g_streams ? g_streams->size() : 0; i-- > 0 && !ran;)
      while (step((*g_streams)[i])) ran = 1;
    if (!ran) return done() ? OK : E_UNKNOWN;
  }
  return g_broken ? g_broken : OK;
}

static CUresult drain_all() {
  return drain([] {
    for (size_t i = 0; g_streams && i < g_streams->size(); i++)
      if (!(*g_streams)[i]->q.empty()) return false;
    return true;
  });
}
} /* extern "C++" */

CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  if (g_broken) return g_broken;
  emu_stream *x = new emu_stream();
  x->magic = STREAM_MAGIC;
  if (!g_streams) g_streams = new std::vector<emu_stream *>();
  g_streams->push_back(x);
  *s = x;
  return OK;
}

CUresult cuStreamDestroy_v2(void *s) {
  if (!is_stream(s)) return E_INVALID_HANDLE;
  emu_stream *x = (emu_stream *)s;
  drain([x] { return x->q.empty(); });
  for (size_t i = 0; i < g_streams->size(); i++)
    if ((*g_streams)[i] == x) g_streams->erase(g_streams->begin() + (long)i);
  x->magic = 0;
  delete x;
  return OK;
}

CUresult cuStreamSynchronize(void *s) {
  if (!is_stream(s)) return E_INVALID_HANDLE;
  if (g_capture) return refuse_in_capture();
  emu_stream *x = (emu_stream *)s;
  CUresult r = drain([x] { return x->q.empty(); });
  return g_broken ? g_broken : r;
}

/* (work runs when something waits: a query runs the stream's, so the
 * answer is always "done", or the stream's error) */
CUresult cuStreamQuery(void *s) {
  if (!is_stream(s)) return E_INVALID_HANDLE;
  if (g_capture) return refuse_in_capture();
  emu_stream *x = (emu_stream *)s;
  CUresult r = drain([x] { return x->q.empty(); });
  return g_broken ? g_broken : r;
}

CUresult cuCtxSynchronize(void) {
  if (g_capture) return refuse_in_capture();
  CUresult r = drain_all();
  return g_broken ? g_broken : r;
}

CUresult cuEventCreate(void **e, unsigned flags) {
  (void)flags;
  if (g_broken) return g_broken;
  emu_event *v = (emu_event *)calloc(1, sizeof *v);
  if (!v) return E_OUT_OF_MEMORY;
  v->magic = EVENT_MAGIC;
  v->ms = -1;
  if (!g_events) g_events = new std::set<emu_event *>();
  g_events->insert(v);
  *e = v;
  return OK;
}

CUresult cuEventDestroy_v2(void *e) {
  emu_event *v = (emu_event *)e;
  if (!v || v->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  /* (queued items naming it run first) */
  drain_all();
  if (g_events) g_events->erase(v);
  v->magic = 0;
  free(v);
  return OK;
}

/* Queues on x (not capturing) a record of v, or a wait for v's latest
 * record: their numbers are taken now. */
static void queue_record(emu_stream *x, emu_event *v) {
  emu_item it;
  it.kind = IT_RECORD;
  it.ev = v;
  it.seq = ++v->queued;
  x->q.push_back(std::move(it));
}

static void queue_wait(emu_stream *x, emu_event *v) {
  emu_item it;
  it.kind = IT_WAIT;
  it.ev = v;
  it.seq = v->queued;
  x->q.push_back(std::move(it));
}

CUresult cuEventRecord(void *e, void *s) {
  emu_event *v = (emu_event *)e;
  if (!v || v->magic != EVENT_MAGIC || !is_stream(s)) return E_INVALID_HANDLE;
  if (g_broken) return g_broken;
  v->captured = capturing((emu_stream *)s);
  if (v->captured) { /* its number is taken when the graph is launched */
    emu_item it;
    it.kind = IT_RECORD;
    it.ev = v;
    push((emu_stream *)s, std::move(it));
    return OK;
  }
  queue_record((emu_stream *)s, v);
  return OK;
}

CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
  emu_event *v = (emu_event *)e;
  if (!v || v->magic != EVENT_MAGIC || !is_stream(s) || flags != 0) return E_INVALID_HANDLE;
  if (g_broken) return g_broken;
  emu_stream *x = (emu_stream *)s;
  if (g_capture && v->captured) { /* x joins the capture */
    g_capture->streams.insert(x);
  } else if (capturing(x)) {
    g_cap_failed = 1; /* an event from outside the capture */
    return E_CAPTURE_ISOLATION;
  }
  if (capturing(x)) {
    emu_item it;
    it.kind = IT_WAIT;
    it.ev = v;
    push(x, std::move(it));
    return OK;
  }
  if (v->queued == 0) return OK; /* never recorded: no wait */
  queue_wait(x, v);
  return OK;
}

CUresult cuEventSynchronize(void *e) {
  emu_event *v = (emu_event *)e;
  if (!v || v->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  if (g_capture) return refuse_in_capture();
  CUresult r = drain([v] { return v->done >= v->queued; });
  return g_broken ? g_broken : r;
}

CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
  emu_event *x = (emu_event *)a, *y = (emu_event *)b;
  if (!x || !y || x->magic != EVENT_MAGIC || y->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  if (x->ms < 0 || y->ms < 0 || x->done < x->queued || y->done < y->queued)
    return E_INVALID_VALUE; /* CUDA_ERROR_NOT_READY in the driver */
  *ms = (float)(y->ms - x->ms);
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (g_broken) return g_broken;
  if (g_capture) return refuse_in_capture();
  if (n == 0) return E_INVALID_VALUE;
  void *m = NULL;
  if (posix_memalign(&m, 256, n) != 0) return E_OUT_OF_MEMORY;
  memset(m, 0xa5, n); /* device memory starts as garbage */
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_allocs) g_allocs = new std::set<uintptr_t>();
  g_allocs->insert((uintptr_t)m);
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  if (g_capture) return refuse_in_capture();
  drain_all(); /* (queued work may use it) */
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_allocs || !g_allocs->erase((uintptr_t)p)) return E_INVALID_VALUE;
  free((void *)(uintptr_t)p);
  return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
  if (g_broken) return g_broken;
  if (g_capture) return refuse_in_capture(); /* (pageable host memory) */
  if (!is_stream(s) || !dst) return E_INVALID_VALUE;
  emu_item it;
  it.kind = IT_H2D;
  it.dst = (void *)(uintptr_t)dst;
  it.bytes.assign((const char *)src, (const char *)src + n);
  it.n = n;
  ((emu_stream *)s)->q.push_back(std::move(it));
  return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
  if (g_broken) return g_broken;
  if (g_capture) return refuse_in_capture();
  if (!is_stream(s) || !src) return E_INVALID_VALUE;
  emu_item it;
  it.kind = IT_D2H;
  it.dst = dst;
  it.src = (const void *)(uintptr_t)src;
  it.n = n;
  ((emu_stream *)s)->q.push_back(std::move(it));
  return OK;
}

CUresult cuModuleLoadData(void **mod, const void *image) {
  (void)mod, (void)image;
  return E_INVALID_IMAGE; /* no cubin runs here: nfemuModuleLoadSource */
}

/* The kernels' names and parameter counts: every "__global__ void NAME("
 * (after an optional __launch_bounds__(N)). */
static void signatures(const std::string &src, emu_module *m) {
  const std::string pat = "__global__ void ";
  for (size_t at = src.find(pat); at != std::string::npos; at = src.find(pat, at + 1)) {
    size_t b = at + pat.size();
    const std::string lb = "__launch_bounds__(";
    if (src.compare(b, lb.size(), lb) == 0) {
      size_t c = src.find(')', b);
      if (c == std::string::npos) break;
      b = c + 1;
      while (b < src.size() && src[b] == ' ') b++;
    }
    size_t p = src.find('(', b);
    if (p == std::string::npos) break;
    std::string name = src.substr(b, p - b);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    size_t e = src.find(')', p);
    if (e == std::string::npos) break;
    int n = 0, any = 0;
    for (size_t i = p + 1; i < e; i++) {
      n += src[i] == ',';
      any |= src[i] != ' ';
    }
    m->sigs.push_back({name, any ? n + 1 : 0});
  }
}

static int run_cxx(const char *out, const char *in) {
  const char *cxx = getenv("CXX");
  if (!cxx || !*cxx) cxx = "c++";
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execlp(cxx, cxx, "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-o", out, in, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Loads CUDA C (n bytes, not NUL-terminated) as a module. */
CUresult nfemuModuleLoadSource(void **mod, const char *src, size_t n) {
  if (g_broken) return g_broken;
  const char *hdr = getenv("NF_TEST_CUDA_EMU");
  if (!hdr || !*hdr) {
    fprintf(stderr, "cuda_emu_driver: NF_TEST_CUDA_EMU (tests/cuda_emu.h) is not set\n");
    return E_INVALID_IMAGE;
  }
  std::string text(src, n);
  /* the trampoline: every kernel is called through a pointer taking
   * MAX_PARAMS pointers (the extra ones are ignored by the callee) */
  std::string params, call;
  for (int i = 0; i < MAX_PARAMS; i++) {
    params += i ? ",void*" : "void*";
    call += (i ? ",a[" : "a[") + std::to_string(i) + "]";
  }
  std::string tu = "#include \"" + std::string(hdr) + "\"\n" + text +
                   "\nstatic void *nfemu_fn_;\nstatic void **nfemu_args_;\n"
                   "typedef void (*nfemu_k)(" + params + ");\n"
                   "static void nfemu_body_(void *) {\n  void **a = nfemu_args_;\n"
                   "  ((nfemu_k)nfemu_fn_)(" + call + ");\n}\n"
                   "extern \"C\" int nfemu_launch(void *fn, unsigned grid, unsigned block, "
                   "void **args) {\n  nfemu_fn_ = fn;\n  nfemu_args_ = args;\n"
                   "  return nf_emu::launch(grid, block, nfemu_body_, 0);\n}\n";
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the unit */
  for (unsigned char c : tu) h = (h ^ c) * 1099511628211ull;
  const char *tmp = getenv("TMPDIR");
  char dir[512], so[600], cc[600];
  snprintf(dir, sizeof dir, "%s/nf-cuda-emu-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)getuid());
  mkdir(dir, 0700);
  snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)h);
  if (access(so, R_OK) != 0) {
    snprintf(cc, sizeof cc, "%s/%016llx.%d.cc", dir, (unsigned long long)h, (int)getpid());
    char part[640];
    snprintf(part, sizeof part, "%s.%d.part", so, (int)getpid());
    FILE *f = fopen(cc, "wb");
    if (!f) return E_UNKNOWN;
    fwrite(tu.data(), 1, tu.size(), f);
    fclose(f);
    int rc = run_cxx(part, cc);
    unlink(cc);
    if (rc != 0 || rename(part, so) != 0) {
      unlink(part);
      fprintf(stderr, "cuda_emu_driver: the host compiler rejected a module's CUDA C\n");
      return E_INVALID_IMAGE;
    }
  }
  emu_module *m = new emu_module();
  m->h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (m->h) *(void **)&m->launch = dlsym(m->h, "nfemu_launch");
  if (!m->h || !m->launch) {
    if (m->h) dlclose(m->h);
    delete m;
    return E_INVALID_IMAGE;
  }
  signatures(text, m);
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (!g_mods) g_mods = new std::set<emu_module *>();
    g_mods->insert(m);
  }
  *mod = m;
  return OK;
}

static void module_free(emu_module *m) {
  for (emu_fn *f : m->fns) delete f;
  dlclose(m->h);
  delete m;
}

__attribute__((destructor)) static void unload_all(void) {
  if (g_streams)
    for (emu_stream *x : *g_streams) delete x;
  delete g_streams;
  g_streams = NULL;
  if (g_events)
    for (emu_event *v : *g_events) free(v);
  delete g_events;
  g_events = NULL;
  if (g_mods)
    for (emu_module *m : *g_mods) module_free(m);
  if (g_allocs)
    for (uintptr_t p : *g_allocs) free((void *)p);
  delete g_mods;
  delete g_allocs;
  g_mods = NULL;
  g_allocs = NULL;
}

CUresult cuModuleUnload(void *mod) {
  drain_all(); /* (queued launches may use it) */
  emu_module *m = (emu_module *)mod;
  std::lock_guard<std::mutex> l(g_mu);
  if (!m || !g_mods || !g_mods->erase(m)) return E_INVALID_HANDLE;
  module_free(m);
  return OK;
}

CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
  emu_module *m = (emu_module *)mod;
  if (!m || !name) return E_INVALID_HANDLE;
  int n = -1;
  for (auto &s : m->sigs)
    if (s.first == name) n = s.second;
  void *p = dlsym(m->h, name);
  if (!p || n < 0) return E_NOT_FOUND;
  if (n > MAX_PARAMS) return E_INVALID_VALUE;
  emu_fn *f = new emu_fn{p, n, m};
  m->fns.push_back(f);
  *fn = f;
  return OK;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  (void)shared;
  if (g_broken) return g_broken;
  emu_fn *f = (emu_fn *)fn;
  if (!f || !is_stream(stream) || extra) return E_INVALID_VALUE;
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || gx == 0 || bx == 0 || bx > 1024)
    return E_INVALID_VALUE;
  int fail_at = env_int("NF_EMU_FAIL_LAUNCH", 0);
  if (++g_launches >= fail_at && fail_at > 0) {
    g_broken = E_ILLEGAL_ADDRESS;
    return g_broken;
  }
  emu_item it;
  it.kind = IT_LAUNCH;
  it.f = f;
  it.grid = gx;
  it.block = bx;
  for (int i = 0; i < MAX_PARAMS; i++) it.args[i] = i < f->n_params ? *(void **)params[i] : NULL;
  push((emu_stream *)stream, std::move(it));
  return OK;
}

/* Queues run(arg) on stream s (recorded, when s is capturing); del(arg)
 * when nothing refers to it any more.  The library emulations' way to
 * compute in stream order. */
CUresult nfemuEnqueue(void *s, void (*run)(void *), void *arg, void (*del)(void *)) {
  if (!is_stream(s) || !run) {
    if (del) del(arg);
    return E_INVALID_VALUE;
  }
  emu_item it;
  it.kind = IT_HOST;
  it.host = std::make_shared<emu_host>();
  it.host->run = run;
  it.host->arg = arg;
  it.host->del = del;
  if (g_broken) return g_broken;
  push((emu_stream *)s, std::move(it));
  return OK;
}

CUresult cuStreamBeginCapture_v2(void *s, int mode) {
  if (!is_stream(s) || mode < 0 || mode > 2) return E_INVALID_VALUE;
  if (g_broken) return g_broken;
  if (g_capture) return E_ILLEGAL_STATE;
  g_capture = new emu_graph();
  g_capture->magic = GRAPH_MAGIC;
  g_capture->streams.insert((emu_stream *)s);
  g_cap_origin = (emu_stream *)s;
  g_cap_failed = 0;
  return OK;
}

/* Every stream of the capture but its origin ends with an event record
 * that the origin waits for afterwards. */
static int joined(const emu_graph *g) {
  for (emu_stream *x : g->streams) {
    if (x == g_cap_origin) continue;
    long last = -1;
    for (size_t i = 0; i < g->items.size(); i++)
      if (g->items[i].first == x) last = (long)i;
    if (last < 0) continue; /* joined and did nothing */
    const emu_item &r = g->items[(size_t)last].second;
    if (r.kind != IT_RECORD) return 0;
    int ok = 0;
    for (size_t i = (size_t)last + 1; i < g->items.size() && !ok; i++)
      ok = g->items[i].first == g_cap_origin && g->items[i].second.kind == IT_WAIT &&
           g->items[i].second.ev == r.ev;
    if (!ok) return 0;
  }
  return 1;
}

CUresult cuStreamEndCapture(void *s, void **graph) {
  if (!g_capture || s != g_cap_origin) return E_ILLEGAL_STATE;
  emu_graph *g = g_capture;
  g_capture = NULL;
  *graph = NULL;
  if (env_int("NF_EMU_CAPTURE_FAIL", 0)) g_cap_failed = 1; /* (tests of the fallback) */
  CUresult r = g_cap_failed ? E_CAPTURE_INVALIDATED : !joined(g) ? E_CAPTURE_UNJOINED : OK;
  if (r != OK) {
    delete g;
    return r;
  }
  *graph = g;
  return OK;
}

static emu_event *event_new() {
  emu_event *e = (emu_event *)calloc(1, sizeof *e);
  if (e) e->magic = EVENT_MAGIC, e->ms = -1;
  return e;
}

CUresult cuGraphDestroy(void *graph) {
  emu_graph *g = (emu_graph *)graph;
  if (!g || g->magic != GRAPH_MAGIC) return E_INVALID_HANDLE;
  if (g->fork) drain_all(); /* (queued work waits for its events) */
  free(g->fork);
  for (emu_event *e : g->joins) free(e);
  g->magic = 0;
  delete g;
  return OK;
}

CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  emu_graph *g = (emu_graph *)graph;
  if (!g || g->magic != GRAPH_MAGIC || flags) return E_INVALID_VALUE;
  emu_graph *x = new emu_graph(*g); /* (the library work is shared) */
  x->fork = event_new();
  for (size_t i = 0; i < x->streams.size(); i++) x->joins.push_back(event_new());
  *exec = x;
  return OK;
}

CUresult cuGraphExecDestroy(void *exec) { return cuGraphDestroy(exec); }

/* The recorded work queued again on its streams, after s's queued work
 * (each of the graph's streams waits for it) and before s's next (s
 * waits for each of them). */
CUresult cuGraphLaunch(void *exec, void *s) {
  emu_graph *g = (emu_graph *)exec;
  if (!g || g->magic != GRAPH_MAGIC || !g->fork || !is_stream(s)) return E_INVALID_HANDLE;
  if (g_broken) return g_broken;
  if (g_capture) return refuse_in_capture();
  emu_stream *ls = (emu_stream *)s;
  for (emu_stream *x : g->streams)
    if (!is_stream(x)) return E_INVALID_HANDLE;
  int fail_at = env_int("NF_EMU_FAIL_LAUNCH", 0);
  for (const auto &p : g->items)
    if (p.second.kind == IT_LAUNCH && ++g_launches >= fail_at && fail_at > 0) {
      g_broken = E_ILLEGAL_ADDRESS; /* a kernel of the graph faults */
      return g_broken;
    }
  queue_record(ls, g->fork);
  for (emu_stream *x : g->streams) queue_wait(x, g->fork);
  for (const auto &p : g->items) {
    emu_item it = p.second; /* (copies share the library's work) */
    if (it.kind == IT_RECORD) it.seq = ++it.ev->queued;
    if (it.kind == IT_WAIT) it.seq = it.ev->queued;
    p.first->q.push_back(std::move(it));
  }
  size_t i = 0;
  for (emu_stream *x : g->streams) {
    queue_record(x, g->joins[i]);
    queue_wait(ls, g->joins[i++]);
  }
  return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case E_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case E_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case E_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case E_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
    case E_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
    case E_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    case E_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return OK;
    case E_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
    case E_ILLEGAL_STATE: *s = "CUDA_ERROR_ILLEGAL_STATE"; return OK;
    case E_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return OK;
    case E_CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return OK;
    case E_CAPTURE_UNJOINED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"; return OK;
    case E_CAPTURE_ISOLATION: *s = "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"; return OK;
    default: *s = "CUDA_ERROR_UNKNOWN"; return E_INVALID_VALUE;
  }
}

} /* extern "C" */
