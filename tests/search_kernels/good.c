/* good.c - computes the test problem correctly (see mm.h). */
#define MM_KERNEL
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) { return mm_run(args); }
