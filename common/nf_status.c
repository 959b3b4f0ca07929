/* nf_status.c - names and messages for the status table in nf_status.h. */
#include "nf_status.h"

const char *nf_status_name(int status) {
  switch (status) {
#define NF__STATUS_NAME(name, val, msg) \
  case (val):                           \
    return "NF_" #name;
    NF_STATUS_MAP(NF__STATUS_NAME)
#undef NF__STATUS_NAME
  }
  return "NF_UNKNOWN";
}

const char *nf_strerror(int status) {
  switch (status) {
#define NF__STATUS_MSG(name, val, msg) \
  case (val):                          \
    return msg;
    NF_STATUS_MAP(NF__STATUS_MSG)
#undef NF__STATUS_MSG
  }
  return "unknown status";
}
