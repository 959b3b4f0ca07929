/* cuda_emu.h - runs the CUDA C of common/lower/cuda_backend.c on the
 * CPU, for test_cuda (no GPU here).  C++ (the test compiles the generated
 * source with the host's c++ and loads it).
 *
 * The semantics kept are those the backend relies on: the blocks of a
 * launch run one after another; the threads of a block are coroutines
 * (ucontext) that run in turn, each until its next __syncthreads() or its
 * end, so a barrier is a real barrier; __shared__ is one static copy
 * (blocks do not overlap); threadIdx and blockIdx are set before a
 * coroutine resumes.
 *
 * Adversarially, so that what passes here does not pass by luck:
 *  - between two barriers the threads run in an order that alternates
 *    (forward, then backward, and the other way round in odd blocks), so
 *    a thread reading what another writes without a barrier between
 *    them sees a stale value in one of the two orders;
 *  - every barrier must be reached by every thread still running, at the
 *    same __syncthreads() (its line) the same number of times: a barrier
 *    in code that only some threads reach, or one that some threads skip
 *    by ending first, is reported and aborts (on a GPU it hangs or is
 *    undefined).
 * Not emulated: warps, memory ordering without a barrier beyond that,
 * the device's own rounding of library functions. */
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
  int line;         /* the __syncthreads() it waits at (0: none) */
  unsigned long n;  /* barriers it has passed */
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

inline void sync(int line) {
  launch_state *s = g_state;
  s->t[s->cur].line = line;
  s->t[s->cur].n++;
  swapcontext(&s->t[s->cur].ctx, &s->sched);
  s->t[s->cur].line = 0;
}

/* After a round: every thread still running waits at the same barrier,
 * and none ended while others wait at one. */
inline void check_round(const launch_state *s, unsigned block, unsigned b) {
  int first = -1, ended = -1;
  for (unsigned i = 0; i < block; i++) {
    const thr *t = &s->t[i];
    if (t->done) {
      ended = (int)i;
      continue;
    }
    if (first < 0) {
      first = (int)i;
    } else if (t->line != s->t[first].line || t->n != s->t[first].n) {
      fprintf(stderr, "cuda_emu: block %u: divergent __syncthreads(): thread %d waits at line %d "
              "(barrier %lu), thread %u at line %d (barrier %lu)\n", b, first,
              s->t[first].line, s->t[first].n, i, t->line, t->n);
      abort();
    }
  }
  if (first >= 0 && ended >= 0) { /* every round ends at one barrier: it skipped this one */
    fprintf(stderr, "cuda_emu: block %u: thread %d ended after %lu barriers while thread %d waits "
            "at barrier %lu (line %d)\n", b, ended, s->t[ended].n, first, s->t[first].n,
            s->t[first].line);
    abort();
  }
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
      s.t[i].line = 0;
      s.t[i].n = 0;
      makecontext(&s.t[i].ctx, entry, 0);
    }
    for (unsigned left = block, round = 0; left > 0; round++) {
      left = 0;
      for (unsigned q = 0; q < block; q++) {
        unsigned i = (round + b) % 2 ? block - 1 - q : q;
        if (s.t[i].done) continue;
        s.cur = i;
        blockIdx.x = b;
        threadIdx.x = i;
        swapcontext(&s.sched, &s.t[i].ctx);
        left += !s.t[i].done;
      }
      check_round(&s, block, b);
    }
  }
  g_state = saved;
  for (unsigned i = 0; i < block; i++) free(s.t[i].stack);
  free(s.t);
  return 0;
}

} /* namespace nf_emu */

#define __syncthreads() nf_emu::sync(__LINE__)

#endif
