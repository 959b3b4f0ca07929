/* api_status.c - the public header's status codes (NEOFLOW_E*,
 * neoflow/neoflow.h) are the library's own (NF_E*, common/nf_status.h):
 * a build check, one assertion per entry of the status table, so that a
 * code added to the table without its public twin fails to compile. */
#include "neoflow/neoflow.h"
#include "nf_status.h"

#define NF__PUBLIC_TWIN(name, val, msg) \
  _Static_assert(NEOFLOW_##name == NF_##name && NF_##name == (val), "NEOFLOW_" #name);
NF_STATUS_MAP(NF__PUBLIC_TWIN)
#undef NF__PUBLIC_TWIN
