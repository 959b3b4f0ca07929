/* nf_clock.h - the monotonic clock in milliseconds, for timings and
 * deadlines (never for dates). */
#ifndef NF_CLOCK_H
#define NF_CLOCK_H

#include <time.h>

static inline double nf_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
