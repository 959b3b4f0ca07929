/* slog.c - a session's messages (nf_slog.h). */
#include "nf_slog.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECENT_MAX (64 * 1024)

void nf__slog_init(nf__slog *l, void (*fn)(void *, int, const char *), void *user, int quiet) {
  memset(l, 0, sizeof *l);
  l->fn = fn;
  l->user = user;
  l->quiet = quiet;
  pthread_mutex_init(&l->mu, NULL);
}

void nf__slog_destroy(nf__slog *l) {
  pthread_mutex_destroy(&l->mu);
  nf_buf_free(&l->recent);
}

static void vlog(nf__slog *l, int level, const char *fmt, va_list ap) {
  char line[1024];
  vsnprintf(line, sizeof line, fmt, ap);
  pthread_mutex_lock(&l->mu);
  if (level == NEOFLOW_LOG_WARN) {
    if (l->recent.len > RECENT_MAX) nf_buf_reset(&l->recent); /* bounded */
    nf_buf_printf(&l->recent, "%s\n", line);
  }
  if (!l->quiet && l->fn) l->fn(l->user, level, line);
  pthread_mutex_unlock(&l->mu);
}

void nf__slog_msg(nf__slog *l, int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(l, level, fmt, ap);
  va_end(ap);
}

void nf__slog_warn(nf__slog *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(l, NEOFLOW_LOG_WARN, fmt, ap);
  va_end(ap);
}

char *nf__slog_recent(nf__slog *l) {
  pthread_mutex_lock(&l->mu);
  char *r = strdup(nf_buf_str(&l->recent));
  pthread_mutex_unlock(&l->mu);
  return r;
}
