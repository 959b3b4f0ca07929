/* wrong.c - right C, but every element of output 1 (R) is off by 0.5. */
#define MM_KERNEL
#define MM_R_OFFSET 0.5
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) { return mm_run(args); }
