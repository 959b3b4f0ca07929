/* budget.c - a tuning job's budget from its share of the step time
 * (nfd_config.h, nfd_tune_budget; docs/daemon.md "Tuning budget").
 *
 * A client's subgraphs together get the sum of the budgets they asked
 * for, divided by their measured share of its step: a subgraph's weight
 * is its step time over the mean of the client's subgraphs, so the
 * weights of one client sum to its number of subgraphs.  The bounds keep
 * every subgraph tuned a little (min_*) and none beyond the caps, nor
 * beyond NFD_SHARE_BOOST times what it asked: one subgraph's profile
 * never takes a whole day.  Pure: no clock, no state. */
#include <math.h>

#include "nfd_config.h"

static int scale(int asked, double w, int lo, int cap) {
  double hi = (double)asked * NFD_SHARE_BOOST;
  if (hi > cap) hi = cap;
  if (lo > asked) lo = asked;
  double v = floor((double)asked * w + 0.5);
  if (v > hi) v = hi;
  if (v < lo) v = lo;
  return (int)v;
}

void nfd_tune_budget(const nfd_config *c, double weight, int trials, int seconds,
                     int *out_trials, int *out_seconds) {
  *out_trials = trials;
  *out_seconds = seconds;
  if (!c->share_budget || !isfinite(weight) || weight <= 0) return;
  *out_trials = scale(trials, weight, c->min_trials, c->max_trials);
  *out_seconds = scale(seconds, weight, c->min_seconds, c->max_seconds);
}
