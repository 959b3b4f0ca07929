/* cudnn_rt.c - nf_cudnn.h: cuDNN's legacy convolution API through
 * dlopen.  The few types are declared here (cuDNN's headers need not be
 * installed to build this): handles and descriptors are pointers,
 * statuses and enumerations ints, the algorithm records as cuDNN 8 and 9
 * lay them out. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_cudnn.h"
#include "nf_env.h"
#include "nf_status.h"

typedef int cudnnStatus_t;
typedef void *cudnnHandle_t;
typedef void *cudnnDesc; /* tensor, filter and convolution descriptors */

enum {
  CUDNN_DATA_FLOAT = 0,
  CUDNN_TENSOR_NCHW = 0,
  CUDNN_CROSS_CORRELATION = 1,
  CUDNN_FMA_MATH = 3,
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
  CUDNN_DETERMINISTIC = 1,
};

/* A status that refuses the problem rather than failing: cuDNN 8's
 * BAD_PARAM (3) and NOT_SUPPORTED (9), cuDNN 9's families of them (2000
 * to 2999, 3000 to 3999). */
static int refused(cudnnStatus_t st) {
  return st == 3 || st == 9 || (st >= 2000 && st < 4000);
}

/* cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: the same layout */
typedef struct algo_perf {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
} algo_perf;

#define N_ALGOS 16
#define MAX_PLANS 64

/* One shape's descriptors and algorithm, made on first use. */
typedef struct plan {
  nf_conv_desc key; /* t_x, t_f, t_y zeroed */
  cudnnDesc x, f, y, conv;
  int algo;
  size_t ws;
} plan;

typedef cudnnStatus_t (*get_algo_fn)(cudnnHandle_t, cudnnDesc, cudnnDesc, cudnnDesc, cudnnDesc,
                                     int, int *, algo_perf *);
typedef cudnnStatus_t (*ws_fn)(cudnnHandle_t, cudnnDesc, cudnnDesc, cudnnDesc, cudnnDesc, int,
                               size_t *);
typedef cudnnStatus_t (*conv_fn)(cudnnHandle_t, const void *, cudnnDesc, const void *, cudnnDesc,
                                 const void *, cudnnDesc, int, void *, size_t, const void *,
                                 cudnnDesc, void *);

struct nf_cudnn {
  void *lib;
  nf_cuda_rt *rt;
  cudnnHandle_t h[NF_CUDA_MAX_STREAMS]; /* per stream (h[0] made at open) */
  char version[32];
  plan plans[MAX_PLANS];
  int n_plans;
  uint64_t ws[NF_CUDA_MAX_STREAMS];     /* per stream: device workspace ... */
  size_t ws_bytes[NF_CUDA_MAX_STREAMS]; /* ... of this size */
  cudnnStatus_t (*Create)(cudnnHandle_t *);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, void *);
  const char *(*ErrorString)(cudnnStatus_t);
  size_t (*GetVersion)(void);
  cudnnStatus_t (*CreateTensor)(cudnnDesc *);
  cudnnStatus_t (*SetTensor4d)(cudnnDesc, int, int, int, int, int, int);
  cudnnStatus_t (*DestroyTensor)(cudnnDesc);
  cudnnStatus_t (*CreateFilter)(cudnnDesc *);
  cudnnStatus_t (*SetFilter4d)(cudnnDesc, int, int, int, int, int, int);
  cudnnStatus_t (*DestroyFilter)(cudnnDesc);
  cudnnStatus_t (*CreateConv)(cudnnDesc *);
  cudnnStatus_t (*SetConv2d)(cudnnDesc, int, int, int, int, int, int, int, int);
  cudnnStatus_t (*SetMathType)(cudnnDesc, int);
  cudnnStatus_t (*SetGroupCount)(cudnnDesc, int);
  cudnnStatus_t (*DestroyConv)(cudnnDesc);
  get_algo_fn GetAlgo[3];
  ws_fn Workspace[3];
  conv_fn Run[3];
};

static void plan_clear(nf_cudnn *c, plan *p) {
  if (p->x) c->DestroyTensor(p->x);
  if (p->y) c->DestroyTensor(p->y);
  if (p->f) c->DestroyFilter(p->f);
  if (p->conv) c->DestroyConv(p->conv);
  memset(p, 0, sizeof *p);
}

void nf_cudnn_close(nf_cudnn *c) {
  if (!c) return;
  if (c->h[0] && nf_cuda_rt_current(c->rt, NULL) == NF_OK) {
    for (int i = 0; i < c->n_plans; i++) plan_clear(c, &c->plans[i]);
    for (int i = 0; i < NF_CUDA_MAX_STREAMS; i++)
      if (c->h[i]) c->Destroy(c->h[i]);
  }
  for (int i = 0; i < NF_CUDA_MAX_STREAMS; i++) nf_cuda_rt_free(c->rt, c->ws[i]);
  if (c->lib) dlclose(c->lib);
  free(c);
}

const char *nf_cudnn_version(const nf_cudnn *c) { return c->version; }

static const char *status_str(const nf_cudnn *c, cudnnStatus_t st) {
  const char *s = c->ErrorString ? c->ErrorString(st) : NULL;
  return s ? s : "unknown status";
}

/* The handle of stream i, made on first use, bound to that stream. */
static int handle(nf_cudnn *c, int i, nf_buf *err) {
  if (c->h[i]) return NF_OK;
  cudnnStatus_t st = c->Create(&c->h[i]);
  if (st != 0) {
    c->h[i] = NULL;
    nf_buf_printf(err, "cudnnCreate: %s", status_str(c, st));
    return NF_EIO;
  }
  if ((st = c->SetStream(c->h[i], nf_cuda_rt_stream_at(c->rt, i))) != 0) {
    nf_buf_printf(err, "cudnnSetStream: %s", status_str(c, st));
    c->Destroy(c->h[i]);
    c->h[i] = NULL;
    return NF_EIO;
  }
  return NF_OK;
}

int nf_cudnn_open(nf_cuda_rt *rt, nf_cudnn **out, nf_buf *why) {
  *out = NULL;
  nf_cudnn *c = calloc(1, sizeof *c);
  if (!c) return NF_ENOMEM;
  c->rt = rt;
  const char *env = nf_env(NF_ENV_LIBCUDNN);
  static const char *const names[] = {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"};
  if (env && *env) c->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; !c->lib && !(env && *env) && i < sizeof names / sizeof *names; i++)
    c->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!c->lib) {
    nf_buf_printf(why, "no cuDNN: cannot load %s (%s)", env && *env ? env : "libcudnn.so.9/.8",
                  dlerror());
    free(c);
    return NF_EUNSUPPORTED;
  }
  static const struct {
    size_t off;
    const char *name;
  } syms[] = {
      {offsetof(nf_cudnn, Create), "cudnnCreate"},
      {offsetof(nf_cudnn, Destroy), "cudnnDestroy"},
      {offsetof(nf_cudnn, SetStream), "cudnnSetStream"},
      {offsetof(nf_cudnn, ErrorString), "cudnnGetErrorString"},
      {offsetof(nf_cudnn, GetVersion), "cudnnGetVersion"},
      {offsetof(nf_cudnn, CreateTensor), "cudnnCreateTensorDescriptor"},
      {offsetof(nf_cudnn, SetTensor4d), "cudnnSetTensor4dDescriptor"},
      {offsetof(nf_cudnn, DestroyTensor), "cudnnDestroyTensorDescriptor"},
      {offsetof(nf_cudnn, CreateFilter), "cudnnCreateFilterDescriptor"},
      {offsetof(nf_cudnn, SetFilter4d), "cudnnSetFilter4dDescriptor"},
      {offsetof(nf_cudnn, DestroyFilter), "cudnnDestroyFilterDescriptor"},
      {offsetof(nf_cudnn, CreateConv), "cudnnCreateConvolutionDescriptor"},
      {offsetof(nf_cudnn, SetConv2d), "cudnnSetConvolution2dDescriptor"},
      {offsetof(nf_cudnn, SetMathType), "cudnnSetConvolutionMathType"},
      {offsetof(nf_cudnn, SetGroupCount), "cudnnSetConvolutionGroupCount"},
      {offsetof(nf_cudnn, DestroyConv), "cudnnDestroyConvolutionDescriptor"},
      {offsetof(nf_cudnn, GetAlgo[NF_CONV_FWD]), "cudnnGetConvolutionForwardAlgorithm_v7"},
      {offsetof(nf_cudnn, GetAlgo[NF_CONV_BWD_DATA]), "cudnnGetConvolutionBackwardDataAlgorithm_v7"},
      {offsetof(nf_cudnn, GetAlgo[NF_CONV_BWD_FILTER]),
       "cudnnGetConvolutionBackwardFilterAlgorithm_v7"},
      {offsetof(nf_cudnn, Workspace[NF_CONV_FWD]), "cudnnGetConvolutionForwardWorkspaceSize"},
      {offsetof(nf_cudnn, Workspace[NF_CONV_BWD_DATA]),
       "cudnnGetConvolutionBackwardDataWorkspaceSize"},
      {offsetof(nf_cudnn, Workspace[NF_CONV_BWD_FILTER]),
       "cudnnGetConvolutionBackwardFilterWorkspaceSize"},
      {offsetof(nf_cudnn, Run[NF_CONV_FWD]), "cudnnConvolutionForward"},
      {offsetof(nf_cudnn, Run[NF_CONV_BWD_DATA]), "cudnnConvolutionBackwardData"},
      {offsetof(nf_cudnn, Run[NF_CONV_BWD_FILTER]), "cudnnConvolutionBackwardFilter"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    void *f = dlsym(c->lib, syms[i].name);
    if (!f) {
      nf_buf_printf(why, "the cuDNN library lacks %s", syms[i].name);
      nf_cudnn_close(c);
      return NF_EUNSUPPORTED;
    }
    memcpy((char *)c + syms[i].off, &f, sizeof f);
  }
  size_t v = c->GetVersion();
  /* 8.x: major*1000 + minor*100 + patch; 9.x: major*10000 + minor*100 + patch */
  if (v >= 10000)
    snprintf(c->version, sizeof c->version, "cuDNN %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
  else
    snprintf(c->version, sizeof c->version, "cuDNN %zu.%zu.%zu", v / 1000, v / 100 % 10, v % 100);
  if (nf_cuda_rt_current(rt, why) != NF_OK || handle(c, 0, why) != NF_OK) {
    nf_cudnn_close(c);
    return NF_EUNSUPPORTED;
  }
  *out = c;
  return NF_OK;
}

static int fits(const nf_conv_desc *d) {
  const int64_t lim = 0x7fffffff,
                v[] = {d->n,     d->c,     d->h,     d->w,     d->k,     d->r,     d->s,     d->oh,
                       d->ow,    d->pad_h, d->pad_w, d->str_h, d->str_w, d->dil_h, d->dil_w, d->groups};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    if (v[i] < 0 || v[i] > lim) return 0;
  if (d->groups < 1 || d->c % d->groups || d->k % d->groups) return 0;
  /* cuDNN's 4-d descriptors take int strides: the largest is c h w */
  return d->c * d->h * d->w <= lim && d->k * d->oh * d->ow <= lim && d->c * d->r * d->s <= lim;
}

/* Makes p's descriptors and picks its algorithm.  NF_OK, NF_EUNSUPPORTED
 * (cuDNN refuses the shape), NF_EIO. */
static int plan_make(nf_cudnn *c, plan *p, const nf_conv_desc *d, nf_buf *err) {
  cudnnStatus_t st;
  const char *what = "";
#define TRY(call, name)                                                                          \
  do {                                                                                           \
    if ((st = (call)) != 0) {                                                                    \
      what = name;                                                                               \
      goto fail;                                                                                 \
    }                                                                                            \
  } while (0)
  TRY(c->CreateTensor(&p->x), "cudnnCreateTensorDescriptor");
  TRY(c->CreateTensor(&p->y), "cudnnCreateTensorDescriptor");
  TRY(c->CreateFilter(&p->f), "cudnnCreateFilterDescriptor");
  TRY(c->CreateConv(&p->conv), "cudnnCreateConvolutionDescriptor");
  TRY(c->SetTensor4d(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)d->n, (int)d->c, (int)d->h,
                     (int)d->w),
      "cudnnSetTensor4dDescriptor (the image)");
  TRY(c->SetTensor4d(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)d->n, (int)d->k, (int)d->oh,
                     (int)d->ow),
      "cudnnSetTensor4dDescriptor (the result)");
  TRY(c->SetFilter4d(p->f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)d->k,
                     (int)(d->c / d->groups), (int)d->r, (int)d->s),
      "cudnnSetFilter4dDescriptor");
  TRY(c->SetConv2d(p->conv, (int)d->pad_h, (int)d->pad_w, (int)d->str_h, (int)d->str_w,
                   (int)d->dil_h, (int)d->dil_w, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      "cudnnSetConvolution2dDescriptor");
  TRY(c->SetMathType(p->conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
  if (d->groups > 1) TRY(c->SetGroupCount(p->conv, (int)d->groups), "cudnnSetConvolutionGroupCount");
  algo_perf perf[N_ALGOS];
  int n = 0;
  memset(perf, 0, sizeof perf);
  /* the descriptors in each call's order */
  cudnnDesc a0 = d->kind == NF_CONV_BWD_DATA ? p->f : p->x;
  cudnnDesc a1 = d->kind == NF_CONV_FWD ? p->f : p->y;
  cudnnDesc a3 = d->kind == NF_CONV_FWD ? p->y : d->kind == NF_CONV_BWD_DATA ? p->x : p->f;
  TRY(c->GetAlgo[d->kind](c->h[0], a0, a1, p->conv, a3, N_ALGOS, &n, perf),
      "the algorithm heuristics");
  int pick = -1;
  for (int pass = 0; pass < 2 && pick < 0; pass++)
    for (int i = 0; i < n && i < N_ALGOS && pick < 0; i++) {
      size_t ws = 0;
      if (perf[i].status != 0 || perf[i].math_type == CUDNN_TENSOR_OP_MATH ||
          perf[i].math_type == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
          (pass == 0 && perf[i].determinism != CUDNN_DETERMINISTIC))
        continue;
      if (c->Workspace[d->kind](c->h[0], a0, a1, p->conv, a3, perf[i].algo, &ws) != 0 ||
          ws > NF_CUDNN_WORKSPACE_MAX)
        continue;
      pick = i;
      p->algo = perf[i].algo;
      p->ws = ws;
    }
  if (pick < 0) {
    nf_buf_printf(err, "cuDNN has no %s algorithm for this shape within %llu MiB of workspace",
                  nf_conv_kind_name(d->kind), (unsigned long long)(NF_CUDNN_WORKSPACE_MAX >> 20));
    return NF_EUNSUPPORTED;
  }
  return NF_OK;
fail:
  nf_buf_printf(err, "%s: %s", what, status_str(c, st));
  return refused(st) ? NF_EUNSUPPORTED : NF_EIO;
#undef TRY
}

/* The plan of d's shape, made on first use. */
static int plan_of(nf_cudnn *c, const nf_conv_desc *d, plan **out, nf_buf *err) {
  nf_conv_desc key = *d;
  key.t_x = key.t_f = key.t_y = 0;
  for (int i = 0; i < c->n_plans; i++)
    if (!memcmp(&c->plans[i].key, &key, sizeof key)) {
      *out = &c->plans[i];
      return NF_OK;
    }
  if (c->n_plans == MAX_PLANS) { /* a session has few shapes; start over */
    for (int i = 0; i < c->n_plans; i++) plan_clear(c, &c->plans[i]);
    c->n_plans = 0;
  }
  plan *p = &c->plans[c->n_plans];
  memset(p, 0, sizeof *p);
  int rc = plan_make(c, p, d, err);
  if (rc != NF_OK) {
    plan_clear(c, p);
    return rc;
  }
  p->key = key;
  c->n_plans++;
  *out = p;
  return NF_OK;
}

int nf_cudnn_run(nf_cudnn *c, const nf_conv_desc *d, uint64_t x, uint64_t f, uint64_t y,
                 nf_buf *err) {
  if (!fits(d)) {
    nf_buf_printf(err, "a convolution extent over cuDNN's int range");
    return NF_EUNSUPPORTED;
  }
  int rc = nf_cuda_rt_current(c->rt, err);
  if (rc != NF_OK) return rc;
  plan *p = NULL;
  if ((rc = plan_of(c, d, &p, err)) != NF_OK) return rc;
  /* the selected stream's handle and workspace */
  int hs = nf_cuda_rt_selected(c->rt);
  if ((rc = handle(c, hs, err)) != NF_OK) return rc;
  if (p->ws > c->ws_bytes[hs]) {
    /* the old workspace may still be in use by queued work */
    uint64_t nw = 0;
    if ((rc = nf_cuda_rt_sync(c->rt, err)) != NF_OK ||
        (rc = nf_cuda_rt_alloc(c->rt, p->ws, &nw, err)) != NF_OK)
      return rc;
    nf_cuda_rt_free(c->rt, c->ws[hs]);
    c->ws[hs] = nw;
    c->ws_bytes[hs] = p->ws;
  }
  static const float one = 1.0f, zero = 0.0f;
  void *X = (void *)(uintptr_t)x, *F = (void *)(uintptr_t)f, *Y = (void *)(uintptr_t)y;
  void *ws = (void *)(uintptr_t)c->ws[hs];
  size_t wb = c->ws_bytes[hs];
  cudnnHandle_t h = c->h[hs];
  cudnnStatus_t st;
  switch (d->kind) {
  case NF_CONV_FWD:
    st = c->Run[0](h, &one, p->x, X, p->f, F, p->conv, p->algo, ws, wb, &zero, p->y, Y);
    break;
  case NF_CONV_BWD_DATA:
    st = c->Run[1](h, &one, p->f, F, p->y, Y, p->conv, p->algo, ws, wb, &zero, p->x, X);
    break;
  default:
    st = c->Run[2](h, &one, p->x, X, p->y, Y, p->conv, p->algo, ws, wb, &zero, p->f, F);
    break;
  }
  if (st != 0) {
    nf_buf_printf(err, "cuDNN convolution %s: %s", nf_conv_kind_name(d->kind), status_str(c, st));
    return NF_EIO;
  }
  return NF_OK;
}
