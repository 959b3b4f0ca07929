/* hang.c - never returns. */
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) {
  (void)args;
  volatile unsigned long spin = 0;
  for (;;) spin++;
  return 0;
}
