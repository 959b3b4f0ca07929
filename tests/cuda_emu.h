/* cuda_emu.h - runs the CUDA C of daemon/codegen/cuda_backend.c on the
 * CPU, for test_cuda (no GPU here).  C++ (the test compiles the generated
 * source with the host's c++ and loads it).
 *
 * The semantics kept are those the backend relies on: the blocks of a
 * launch run one after another; the threads of a block are coroutines
 * (ucontext) that run in turn, each until its next __syncthreads() or its
 * end, so a barrier is a real barrier; __shared__ is one static copy
 * (blocks do not overlap); threadIdx and blockIdx are set before a
 * coroutine resumes.  Not emulated: warps, memory ordering without a
 * barrier, the device's own rounding of library functions. */
#ifndef NF_CUDA_EMU_H
#define NF_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

struct nf_emu_dim3 {
  unsigned x, y, z;
};

static nf_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

/* CUDA's vector types, for the backend's vector loads and stores
 * (NF_VMOVE), which must be aligned to their size: a misaligned one is
 * reported and aborts (the backend checks alignment before each). */
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) longlong2 { long long x, y; };
static inline void nf_emu_vmove(void *dst, const void *src, size_t n) {
  if (((uintptr_t)dst | (uintptr_t)src) & (n - 1)) {
    fprintf(stderr, "cuda_emu: a misaligned %zu-byte vector access (%p <- %p)\n", n, dst, src);
    abort();
  }
  memcpy(dst, src, n);
}
#define NF_VMOVE(VT, dst, src) nf_emu_vmove((dst), (src), sizeof(VT))

static inline float __int_as_float(int32_t v) {
  float f;
  memcpy(&f, &v, sizeof f);
  return f;
}

static inline double __longlong_as_double(long long v) {
  double f;
  memcpy(&f, &v, sizeof f);
  return f;
}

namespace nf_emu {

enum { STACK = 128 << 10 };

struct thr {
  ucontext_t ctx;
  char *stack;
  int done;
};

struct launch_state {
  ucontext_t sched;
  thr *t;
  unsigned cur;
  void (*body)(void *);
  void *arg;
};

static launch_state *g_state;

static void entry() {
  launch_state *s = g_state;
  s->body(s->arg);
  s->t[s->cur].done = 1;
  /* returns to uc_link: the scheduler */
}

inline void sync() {
  launch_state *s = g_state;
  swapcontext(&s->t[s->cur].ctx, &s->sched);
}

/* Runs body(arg) as grid x block threads. */
inline int launch(unsigned grid, unsigned block, void (*body)(void *), void *arg) {
  launch_state s;
  memset(&s, 0, sizeof s);
  s.body = body;
  s.arg = arg;
  s.t = (thr *)calloc(block ? block : 1, sizeof *s.t);
  if (!s.t) return -1;
  for (unsigned i = 0; i < block; i++)
    if (!(s.t[i].stack = (char *)malloc(STACK))) return -1;
  launch_state *saved = g_state;
  g_state = &s;
  blockDim.x = block;
  blockDim.y = blockDim.z = gridDim.y = gridDim.z = 1;
  gridDim.x = grid;
  for (unsigned b = 0; b < grid; b++) {
    for (unsigned i = 0; i < block; i++) {
      getcontext(&s.t[i].ctx);
      s.t[i].ctx.uc_stack.ss_sp = s.t[i].stack;
      s.t[i].ctx.uc_stack.ss_size = STACK;
      s.t[i].ctx.uc_link = &s.sched;
      s.t[i].done = 0;
      makecontext(&s.t[i].ctx, entry, 0);
    }
    for (unsigned left = block; left > 0;) {
      left = 0;
      for (unsigned i = 0; i < block; i++) {
        if (s.t[i].done) continue;
        s.cur = i;
        blockIdx.x = b;
        threadIdx.x = i;
        swapcontext(&s.sched, &s.t[i].ctx);
        left += !s.t[i].done;
      }
    }
  }
  g_state = saved;
  for (unsigned i = 0; i < block; i++) free(s.t[i].stack);
  free(s.t);
  return 0;
}

} /* namespace nf_emu */

#define __syncthreads() nf_emu::sync()

#endif
