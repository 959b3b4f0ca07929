/* retcode.c - returns the error code 7 without writing anything. */
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) {
  (void)args;
  return 7;
}
