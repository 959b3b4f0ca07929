/* partial.c - never writes the last element of output 0: only the
 * measurer's poisoning of outputs catches it when an earlier kernel left
 * the right value in the buffer. */
#define MM_KERNEL
#define MM_SKIP_LAST
#include "mm.h"

NF_EXPORT int nf_kernel_v1(const nf_kernel_args *args);
int nf_kernel_v1(const nf_kernel_args *args) { return mm_run(args); }
