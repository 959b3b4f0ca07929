/* emu_stream.h - for the library emulations (cublas_emu.cc,
 * cudnn_emu.cc): a call's computation is queued on its stream of the
 * emulated driver (cuda_emu_driver.cc, which runs streams lazily), as a
 * host function run in stream order (nfemuEnqueue; recorded when the
 * stream is being captured into a graph), as the real libraries queue
 * kernels.  The driver is the one $NEOFLOW_LIBCUDA names, already loaded
 * (RTLD_NOLOAD); without it (or with another driver) the computation
 * runs at once.  Test code, not shipped. */
#ifndef NF_EMU_STREAM_H
#define NF_EMU_STREAM_H

#include <dlfcn.h>
#include <stdlib.h>

#include <functional>
#include <utility>

/* Queues f() on stream (a copy of f: it must capture by value); 0, or
 * the driver's error. */
template <class F> static int emu_stream_enqueue(void *stream, F f) {
  const char *p = getenv("NEOFLOW_LIBCUDA");
  void *h = p && *p ? dlopen(p, RTLD_NOW | RTLD_NOLOAD) : NULL;
  int (*enq)(void *, void (*)(void *), void *, void (*)(void *)) = NULL;
  if (h) *(void **)&enq = dlsym(h, "nfemuEnqueue");
  if (h) dlclose(h);
  if (!enq || !stream) {
    f();
    return 0;
  }
  auto *fn = new std::function<void()>(std::move(f));
  return enq(
      stream, [](void *a) { (*(std::function<void()> *)a)(); }, fn,
      [](void *a) { delete (std::function<void()> *)a; });
}

#endif
