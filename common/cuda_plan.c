/* cuda_plan.c - nf_cuda_plan.h. */
#include <stdlib.h>
#include <string.h>

#include "nf_cuda_plan.h"

void nf_cuda_plan_free(nf_cuda_plan *plan) {
  if (!plan) return;
  free(plan->launches);
  memset(plan, 0, sizeof *plan);
}
