/* emu_stream.h - for the library emulations (cublas_emu.cc,
 * cudnn_emu.cc): a call queued on a stream of the emulated driver
 * (cuda_emu_driver.cc, which runs streams lazily) first runs what is
 * queued before it on that stream, through the driver's
 * cuStreamSynchronize, then computes at once.  The driver is the one
 * $NEOFLOW_LIBCUDA names, already loaded (RTLD_NOLOAD); without it (or
 * with another driver) nothing is drained.  Test code, not shipped. */
#ifndef NF_EMU_STREAM_H
#define NF_EMU_STREAM_H

#include <dlfcn.h>
#include <stdlib.h>

static inline int emu_stream_drain(void *stream) {
  const char *p = getenv("NEOFLOW_LIBCUDA");
  void *h = p && *p ? dlopen(p, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (!h) return 0;
  int (*sync)(void *) = NULL;
  *(void **)&sync = dlsym(h, "cuStreamSynchronize");
  int r = sync && stream ? sync(stream) : 0;
  dlclose(h);
  return r;
}

#endif
