/* nf_test_lib.h - where the tests find the library's defs with the
 * built-in operators' (tests/data/builtins.nf, which imports lib/nn.nf).
 * Header-only, for the test executables. */
#ifndef NF_TEST_LIB_H
#define NF_TEST_LIB_H

#include <stdio.h>
#include <stdlib.h>

/* tests/data/builtins.nf: under $NF_TEST_DATA, else next to
 * $NEOFLOW_LIB in the source tree ($NEOFLOW_LIB/../tests/data). */
static inline void nf_test_lib_path(char *path, size_t n) {
  const char *data = getenv("NF_TEST_DATA"), *lib = getenv("NEOFLOW_LIB");
  if (data && *data)
    snprintf(path, n, "%s/builtins.nf", data);
  else
    snprintf(path, n, "%s/../tests/data/builtins.nf", lib ? lib : "lib");
}

#endif
