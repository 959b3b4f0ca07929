/* nf_slog.h - a session's messages (slog.c): what the library has to say
 * goes to the program's log callback (nf_session_opts.log), never to
 * stdout or stderr, and the recent warnings are kept for the tests and
 * the tool.  The session owns one; the producers that run beside it (the
 * daemon link, the GPU kernel generator, the verdict records) write to it
 * without seeing the session.
 *
 * Thread safety: nf__slog_* may be called from any thread. */
#ifndef NF_SLOG_H
#define NF_SLOG_H

#include <pthread.h>

#include "neoflow/neoflow.h"
#include "nf_buf.h"
#include "nf_status.h"

typedef struct nf__slog {
  void (*fn)(void *user, int level, const char *message); /* NULL: dropped */
  void *user;
  int quiet;            /* nothing to fn */
  pthread_mutex_t mu;   /* recent and one call of fn at a time */
  nf_buf recent;        /* the recent warnings, one per line (bounded) */
} nf__slog;

void nf__slog_init(nf__slog *l, void (*fn)(void *, int, const char *), void *user, int quiet);
void nf__slog_destroy(nf__slog *l);
/* A message at level (NEOFLOW_LOG_*): formatted (cut at 1 KiB), kept in
 * recent when a warning, passed to fn unless quiet. */
void nf__slog_msg(nf__slog *l, int level, const char *fmt, ...) NF_PRINTF(3, 4);
void nf__slog_warn(nf__slog *l, const char *fmt, ...) NF_PRINTF(2, 3);
/* A copy of the recent warnings (malloc'd; "" when none), NULL when out
 * of memory. */
char *nf__slog_recent(nf__slog *l);

#endif
