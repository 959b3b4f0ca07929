/* env.c - the one place NeoFlow's libraries read the environment
 * (nf_env.h). */
#include "nf_env.h"

#include <stdlib.h>

static const char *const names[NF_ENV_COUNT] = {
#define NF__ENV_NAME(id, name, doc) [NF_ENV_##id] = name,
    NF_ENV_MAP(NF__ENV_NAME)
#undef NF__ENV_NAME
};

const char *nf_env(nf_env_var v) {
  return (unsigned)v < NF_ENV_COUNT ? getenv(names[v]) : NULL;
}

const char *nf_env_name(nf_env_var v) {
  return (unsigned)v < NF_ENV_COUNT ? names[v] : "?";
}
