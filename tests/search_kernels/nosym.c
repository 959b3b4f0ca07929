/* nosym.c - a valid shared object without the kernel symbol. */
#include "mm.h"

NF_EXPORT int not_a_kernel(int x);
int not_a_kernel(int x) { return x + 1; }
