/* nf_status.h - status codes shared by every NeoFlow module.
 *
 * Fallible functions return an int status: NF_OK (0) or a negative NF_E*
 * code from the one X-macro table below, which also generates
 * nf_status_name() and nf_strerror().  Messages for users live on the
 * object that failed (a diagnostic list, a context), never in a global. */
#ifndef NF_STATUS_H
#define NF_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#define NF_STATUS_MAP(X)                                                  \
  X(OK, 0, "success")                                                     \
  X(ENOMEM, -1, "out of memory")                                          \
  X(EINVAL, -2, "invalid argument")                                       \
  X(ESYNTAX, -3, "syntax error")                                          \
  X(ETYPE, -4, "type or shape error")                                     \
  X(ENOENT, -5, "no such file, definition or tensor")                     \
  X(EIO, -6, "input/output error")                                        \
  X(EFORMAT, -7, "malformed file")                                        \
  X(EBOUNDS, -8, "index out of bounds")                                   \
  X(EOVERFLOW, -9, "arithmetic overflow")                                 \
  X(ERANGE, -10, "value out of range")                                    \
  X(ELIMIT, -11, "implementation limit exceeded")                         \
  X(EUNSUPPORTED, -12, "not supported")                                   \
  X(EINTERNAL, -13, "internal error")                                     \
  X(EPERM, -14, "refused: not trusted")                                   \
  X(EREJECTED, -15, "artifact rejected")

enum nf_status {
#define NF__STATUS_ENUM(name, val, msg) NF_##name = (val),
  NF_STATUS_MAP(NF__STATUS_ENUM)
#undef NF__STATUS_ENUM
};

/* Returns the symbolic name ("NF_EINVAL") of a status; a static string. */
const char *nf_status_name(int status);
/* Returns a one-line description of a status; a static string.  Part of
 * libneoflow-client's public API (neoflow/neoflow.h), hence exported. */
__attribute__((visibility("default"))) const char *nf_strerror(int status);

/* NF_ASSERT guards the code's own invariants only (never user input).  It
 * is always on (NDEBUG or not) and aborts through the C library's own
 * assertion report (file, line, function, condition) where that is
 * glibc's __assert_fail, else silently, so that the libraries hold no
 * printing of their own. */
#if defined(__GLIBC__)
extern void __assert_fail(const char *assertion, const char *file, unsigned int line,
                          const char *function) __attribute__((__noreturn__));
#define NF_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) __assert_fail(#cond, __FILE__, __LINE__, __func__);      \
  } while (0)
#else
#define NF_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) abort();                                                 \
  } while (0)
#endif

#if defined(__GNUC__)
#define NF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NF_PRINTF(a, b)
#endif

#endif
