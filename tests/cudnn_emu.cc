/* cudnn_emu.cc - the cuDNN entry points client/executor/cudnn_rt.c loads
 * (NEOFLOW_LIBCUDNN=<this library>), for tests with the emulated CUDA
 * driver (cuda_emu_driver.cc), whose device pointers are host pointers:
 * the three convolution operations as cuDNN defines them (NCHW, KCRS,
 * cross-correlation, zero padding, strides, dilations and groups, y = alpha op +
 * beta y) computed directly on the CPU, accumulating in double.  The
 * descriptors check what they are given as cuDNN does; the heuristics
 * offer a nondeterministic algorithm (2) first and a deterministic one
 * (1) that wants workspace after, so the caller's choice and its
 * workspace are exercised: algorithm 1 fails without a large enough
 * workspace.  NF_EMU_CUDNN_REFUSE=1: the heuristics refuse every shape
 * (CUDNN_STATUS_NOT_SUPPORTED).  cudnn_emu_calls() counts the convolutions run.  Test code,
 * not shipped. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "emu_stream.h"

typedef int st_t;
enum { OK = 0, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 }; /* cuDNN 9's codes */

struct tdesc {
  int set, n, c, h, w;
};
struct cdesc {
  int set, ph, pw, u, v, dh, dw, math, groups;
};
struct perf {
  int algo;
  int status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
};

/* a handle: the stream set on it (NULL: none yet) */
struct emu_dnn {
  int magic;
  void *stream;
};
enum { DNN_MAGIC = 0x444e4e48 };

/* handles come from a fixed pool (a broken context's owner never
 * destroys its handle: nothing leaks) */
static emu_dnn g_pool[64];

static emu_dnn *pool_new() {
  for (emu_dnn &x : g_pool)
    if (x.magic != DNN_MAGIC) {
      x.magic = DNN_MAGIC;
      x.stream = NULL;
      return &x;
    }
  return NULL;
}

static emu_dnn *handle(void *h) {
  emu_dnn *d = (emu_dnn *)h;
  return d && d->magic == DNN_MAGIC ? d : NULL;
}
static long g_calls;
static const size_t kWorkspace = 4096; /* what algorithm 1 wants */

static st_t bad(void *h) { return !handle(h) || !handle(h)->stream ? BAD_PARAM : OK; }

/* algorithm 2 (nondeterministic) first, then 1 (wants workspace) */
static st_t heuristics(void *h, int req, int *ret, perf *p) {
  if (bad(h) || req < 2) return BAD_PARAM;
  if (getenv("NF_EMU_CUDNN_REFUSE")) return NOT_SUPPORTED; /* a shape it does not take */
  memset(p, 0, 2 * sizeof *p);
  p[0].algo = 2, p[0].memory = 0, p[0].determinism = 0, p[0].math_type = 3;
  p[1].algo = 1, p[1].memory = kWorkspace, p[1].determinism = 1, p[1].math_type = 3;
  *ret = 2;
  return OK;
}

static int out_size(int in, int pad, int dil, int k, int str) {
  return (in + 2 * pad - dil * (k - 1) - 1) / str + 1;
}

/* The shapes agree with cuDNN's output formula. */
static int consistent(const tdesc *x, const tdesc *f, const cdesc *c, const tdesc *y) {
  return x->set && f->set && c->set && y->set && x->c == f->c * c->groups && y->n == x->n &&
         y->c == f->n && f->n % c->groups == 0 &&
         y->h == out_size(x->h, c->ph, c->dh, f->h, c->u) &&
         y->w == out_size(x->w, c->pw, c->dw, f->w, c->v);
}

/* Each (image, filter, result) triple of the convolution, in order. */
template <typename F> static void each(const tdesc *x, const tdesc *f, const cdesc *c,
                                       const tdesc *y, F fn) {
  for (int n = 0; n < x->n; n++)
    for (int k = 0; k < f->n; k++)
      for (int oy = 0; oy < y->h; oy++)
        for (int ox = 0; ox < y->w; ox++)
          for (int ch = 0; ch < f->c; ch++)
            for (int r = 0; r < f->h; r++)
              for (int s = 0; s < f->w; s++) {
                int iy = oy * c->u + r * c->dh - c->ph, ix = ox * c->v + s * c->dw - c->pw;
                if (iy < 0 || iy >= x->h || ix < 0 || ix >= x->w) continue;
                /* the image channel: channel ch of output channel k's group */
                int xc = k / (f->n / c->groups) * f->c + ch;
                int64_t xi = (((int64_t)n * x->c + xc) * x->h + iy) * x->w + ix;
                int64_t fi = (((int64_t)k * f->c + ch) * f->h + r) * f->w + s;
                int64_t yi = (((int64_t)n * y->c + k) * y->h + oy) * y->w + ox;
                fn(xi, fi, yi);
              }
}

static void finish(float *dst, const double *acc, int64_t n, float alpha, float beta) {
  for (int64_t i = 0; i < n; i++)
    dst[i] = (float)(alpha * acc[i] + (beta != 0.0f ? beta * dst[i] : 0.0));
}

static int64_t numel(const tdesc *t) { return (int64_t)t->n * t->c * t->h * t->w; }

static st_t check_ws(int algo, void *ws, size_t bytes) {
  g_calls++;
  return algo < 0 || algo > 2 || (algo == 1 && (!ws || bytes < kWorkspace)) ? BAD_PARAM : OK;
}

/* The convolution queued on the handle's stream (descriptors and scalars
 * copied: the caller may change them before it runs). */
template <typename F>
static st_t queue(void *h, const tdesc *xd, const tdesc *fd, const cdesc *c, const tdesc *yd,
                  int64_t n_out, float *dst, float alpha, float beta, F term) {
  tdesc x = *xd, f = *fd, y = *yd;
  cdesc cc = *c;
  int r = emu_stream_enqueue(handle(h)->stream, [=] {
    double *acc = (double *)calloc((size_t)n_out + 1, sizeof *acc);
    if (!acc) abort();
    each(&x, &f, &cc, &y, [&](int64_t xi, int64_t fi, int64_t yi) { term(acc, xi, fi, yi); });
    finish(dst, acc, n_out, alpha, beta);
    free(acc);
  });
  return r ? BAD_PARAM : OK;
}

extern "C" {

long cudnn_emu_calls(void) { return g_calls; }

st_t cudnnCreate(void **h) {
  *h = pool_new();
  return *h ? OK : BAD_PARAM;
}
st_t cudnnDestroy(void *h) {
  emu_dnn *d = handle(h);
  if (!d) return BAD_PARAM;
  d->magic = 0;
  return OK;
}
st_t cudnnSetStream(void *h, void *stream) {
  if (!handle(h) || !stream) return BAD_PARAM;
  handle(h)->stream = stream;
  return OK;
}
const char *cudnnGetErrorString(st_t s) {
  return s == OK ? "CUDNN_STATUS_SUCCESS" : s == BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM"
                                                           : "CUDNN_STATUS_NOT_SUPPORTED";
}
size_t cudnnGetVersion(void) { return 90000; }

st_t cudnnCreateTensorDescriptor(tdesc **d) { return (*d = (tdesc *)calloc(1, sizeof **d)) ? OK : BAD_PARAM; }
st_t cudnnDestroyTensorDescriptor(tdesc *d) { free(d); return OK; }
st_t cudnnSetTensor4dDescriptor(tdesc *d, int fmt, int dt, int n, int c, int h, int w) {
  if (fmt != 0 || dt != 0 || n < 1 || c < 1 || h < 1 || w < 1) return BAD_PARAM;
  *d = tdesc{1, n, c, h, w};
  return OK;
}
st_t cudnnCreateFilterDescriptor(tdesc **d) { return cudnnCreateTensorDescriptor(d); }
st_t cudnnDestroyFilterDescriptor(tdesc *d) { return cudnnDestroyTensorDescriptor(d); }
st_t cudnnSetFilter4dDescriptor(tdesc *d, int dt, int fmt, int k, int c, int h, int w) {
  return cudnnSetTensor4dDescriptor(d, fmt, dt, k, c, h, w);
}
st_t cudnnCreateConvolutionDescriptor(cdesc **d) { return (*d = (cdesc *)calloc(1, sizeof **d)) ? OK : BAD_PARAM; }
st_t cudnnDestroyConvolutionDescriptor(cdesc *d) { free(d); return OK; }
st_t cudnnSetConvolution2dDescriptor(cdesc *d, int ph, int pw, int u, int v, int dh, int dw,
                                     int mode, int dt) {
  if (ph < 0 || pw < 0 || u < 1 || v < 1 || dh < 1 || dw < 1 || mode != 1 || dt != 0)
    return BAD_PARAM;
  *d = cdesc{1, ph, pw, u, v, dh, dw, 0, 1};
  return OK;
}
st_t cudnnSetConvolutionGroupCount(cdesc *d, int g) {
  if (!d->set || g < 1) return BAD_PARAM;
  d->groups = g;
  return OK;
}
st_t cudnnSetConvolutionMathType(cdesc *d, int m) {
  d->math = m;
  return m == 3 ? OK : NOT_SUPPORTED; /* this emulation has FMA math only */
}

st_t cudnnGetConvolutionForwardAlgorithm_v7(void *h, tdesc *x, tdesc *f, cdesc *c, tdesc *y,
                                            int req, int *ret, perf *p) {
  return consistent(x, f, c, y) ? heuristics(h, req, ret, p) : BAD_PARAM;
}
st_t cudnnGetConvolutionBackwardDataAlgorithm_v7(void *h, tdesc *f, tdesc *dy, cdesc *c,
                                                 tdesc *dx, int req, int *ret, perf *p) {
  return consistent(dx, f, c, dy) ? heuristics(h, req, ret, p) : BAD_PARAM;
}
st_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(void *h, tdesc *x, tdesc *dy, cdesc *c,
                                                   tdesc *df, int req, int *ret, perf *p) {
  return consistent(x, df, c, dy) ? heuristics(h, req, ret, p) : BAD_PARAM;
}
static st_t ws(void *h, int algo, size_t *b) {
  if (bad(h) || algo < 0 || algo > 2) return BAD_PARAM;
  *b = algo == 1 ? kWorkspace : 0;
  return OK;
}
st_t cudnnGetConvolutionForwardWorkspaceSize(void *h, tdesc *, tdesc *, cdesc *, tdesc *, int a,
                                             size_t *b) { return ws(h, a, b); }
st_t cudnnGetConvolutionBackwardDataWorkspaceSize(void *h, tdesc *, tdesc *, cdesc *, tdesc *,
                                                  int a, size_t *b) { return ws(h, a, b); }
st_t cudnnGetConvolutionBackwardFilterWorkspaceSize(void *h, tdesc *, tdesc *, cdesc *, tdesc *,
                                                    int a, size_t *b) { return ws(h, a, b); }

st_t cudnnConvolutionForward(void *h, const float *alpha, tdesc *xd, const float *x, tdesc *fd,
                             const float *f, cdesc *c, int algo, void *w, size_t wb,
                             const float *beta, tdesc *yd, float *y) {
  if (bad(h) || !consistent(xd, fd, c, yd) || check_ws(algo, w, wb)) return BAD_PARAM;
  return queue(h, xd, fd, c, yd, numel(yd), y, *alpha, *beta,
               [=](double *acc, int64_t xi, int64_t fi, int64_t yi) {
                 acc[yi] += (double)x[xi] * f[fi];
               });
}
st_t cudnnConvolutionBackwardData(void *h, const float *alpha, tdesc *fd, const float *f,
                                  tdesc *yd, const float *dy, cdesc *c, int algo, void *w,
                                  size_t wb, const float *beta, tdesc *xd, float *dx) {
  if (bad(h) || !consistent(xd, fd, c, yd) || check_ws(algo, w, wb)) return BAD_PARAM;
  return queue(h, xd, fd, c, yd, numel(xd), dx, *alpha, *beta,
               [=](double *acc, int64_t xi, int64_t fi, int64_t yi) {
                 acc[xi] += (double)dy[yi] * f[fi];
               });
}
st_t cudnnConvolutionBackwardFilter(void *h, const float *alpha, tdesc *xd, const float *x,
                                    tdesc *yd, const float *dy, cdesc *c, int algo, void *w,
                                    size_t wb, const float *beta, tdesc *fd, float *df) {
  if (bad(h) || !consistent(xd, fd, c, yd) || check_ws(algo, w, wb)) return BAD_PARAM;
  return queue(h, xd, fd, c, yd, numel(fd), df, *alpha, *beta,
               [=](double *acc, int64_t xi, int64_t fi, int64_t yi) {
                 acc[fi] += (double)dy[yi] * x[xi];
               });
}

} /* extern "C" */
