/* crash.c - stores through a bad pointer: SIGSEGV. */
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) {
  (void)args;
  volatile uintptr_t addr = 16; /* volatile: the compiler cannot turn it into a trap */
  *(volatile int *)addr = 1;
  return 0;
}
