/* hog.c - reserves up to 64 GiB with malloc in 256 MiB steps (touching
 * nothing), returns 3 (out of memory) as soon as malloc fails, else frees
 * everything and computes the right answer.  Under the worker's
 * RLIMIT_AS the mallocs fail; without it they all succeed. */
#include <stdlib.h>

#define MM_KERNEL
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) {
  void *blocks[256];
  int n = 0, oom = 0;
  for (; n < 256; n++) {
    blocks[n] = malloc((size_t)256 << 20);
    if (!blocks[n]) {
      oom = 1;
      break;
    }
  }
  while (n > 0) free(blocks[--n]);
  return oom ? 3 : mm_run(args);
}
