/* inwrite.c - computes the right outputs, then writes into input A. */
#define MM_KERNEL
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) {
  int rc = mm_run(args);
  if (rc == 0) ((float *)args->buffers[0])[5] += 1.0f;
  return rc;
}
