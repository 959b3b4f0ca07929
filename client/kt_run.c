/* kt_run.c - the one step loop, for every device (session_int.h): each
 * op runs through its kernel table entry, on the device the session
 * trains on (the table s->kt.dev, nf_ktable.h).  An entry runs its
 * compiled kernel when one has been verified, else tier 0 (OpenBLAS,
 * cuBLAS or cuDNN where they take the subgraph, the interpreter
 * otherwise).  A kernel taken from the mailbox at a step boundary is a
 * candidate: its first run is checked against what it replaces (the host's
 * tier 0 for the entry's first compiled kernel, the verified kernel after
 * that) on the step's real data (the canary), and it is used only from
 * then on.  A kernel that passed replaces tier 0 only where it is faster
 * here: a race of alternating runs decides when the canary's times do
 * not, and the verdict is recorded (verify.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "session_int.h"

static const nf__device *dev(const nf_session *s) { return s->kt.dev; }

static int lib(const nf_session *s, const nf__kent *k) { return dev(s)->lib_tier0(s, k); }

/* k's candidate, unless it waits for the other ranks (nf_dist.h). */
static void *cand(const nf__kent *k) { return k->hold ? NULL : k->cand; }

/* A run, then a wait for it where the device queues work: its time. */
static int timed_run(nf_session *s, int rc) {
  return rc == NF_OK && dev(s)->sync ? dev(s)->sync(s) : rc;
}

static void unload(nf_session *s, void *kern) {
  if (kern && dev(s)->unload) dev(s)->unload(kern);
}

/* k's candidate becomes its kernel (it passed a canary, or these bytes
 * did before).  Whether it runs instead of tier 0 is decided apart. */
static void promote(nf_session *s, nf__kent *k) {
  if (dev(s)->swapped) dev(s)->swapped(s, k);
  unload(s, k->cur); /* the CPU: the handle only, the code stays loaded */
  k->cur = k->cand;
  k->cand = NULL;
  k->cur_tier = k->cand_tier;
  k->cur_ms = k->cand_ms;
  memcpy(k->cur_sha, k->cand_sha, 32);
  k->verified = 1;
  k->race_left = 0;
  k->prefer_t0 = 0;
  k->probe = 0;
  s->swaps++;
  nf__report_swap(s, k);
}


/* k keeps tier 0: its kernel ran kn_ms per run against tier 0's t0_ms.
 * Where that costs a step NF_SLOW_NOTICE_MS or more, it is said (once per
 * kernel) and the link asks the daemon for a faster kernel; a tiny
 * subgraph whose kernel loses by microseconds (a pool's wake-up against
 * the interpreter) is neither worth a line nor a search. */
#define NF_SLOW_NOTICE_MS 0.25
static void hold_t0(nf_session *s, nf__kent *k, double kn_ms, double t0_ms, int remembered) {
  k->prefer_t0 = 1;
  k->race_left = 0;
  pthread_mutex_lock(&s->kt.mu); /* (the link reads slow_ratio) */
  k->slow_ratio = t0_ms > 0 ? kn_ms / t0_ms : 0;
  pthread_mutex_unlock(&s->kt.mu);
  if ((kn_ms - t0_ms) * (k->n_ops > 0 ? k->n_ops : 1) < NF_SLOW_NOTICE_MS) return;
  char hex[65], at[48] = "";
  nf_hash_hex(k->key, hex);
  hex[16] = 0;
  if (dev(s)->host) snprintf(at, sizeof at, " at %d thread%s", s->threads, s->threads == 1 ? "" : "s");
  nf__slog_warn(&s->log, "kernel %s (tier %d) %s %.2fx slower than %s here (%.3g against %.3g ms "
                "per run%s): keeping %s%s",
                hex, k->cur_tier, remembered ? "ran" : "runs", k->slow_ratio,
                dev(s)->tier0_name(s, k), kn_ms, t0_ms, at, dev(s)->tier0_name(s, k),
                dev(s)->host ? "; the daemon is asked for a faster one" : "");
  if (!dev(s)->host) return;
  pthread_mutex_lock(&s->kt.mu);
  if (!k->ask_better) {
    k->ask_better = 1;
    memcpy(k->slow_sha, k->cur_sha, 32);
  }
  pthread_cond_broadcast(&s->kt.cv);
  pthread_mutex_unlock(&s->kt.mu);
}

/* A speed verdict recorded (verify.c), on the host's CPU only
 * (nf__device.host). */
static void verdict(nf_session *s, const nf__kent *k, double kn_ms, double t0_ms,
                    unsigned flags) {
  /* (not from a data-parallel job: its ranks share the cores, and its
   * times are the ranks' means) */
  if (dev(s)->host && !s->dist) nf__verdict_put(s, k->key, k->cur_sha, kn_ms, t0_ms, flags);
}

/* Flags for a verdict made now: BUSY while the daemon still works for
 * this session (compiling or tuning on the cores the race ran on). */
static unsigned verdict_flags(nf_session *s) {
  unsigned f = 0;
  pthread_mutex_lock(&s->kt.mu);
  for (int i = 0; i < s->kt.n_kents; i++)
    if (s->kt.kents[i].dstate == DK_SUBMITTED || s->kt.kents[i].dstate == DK_ACCEPTED)
      f = NF__VERDICT_BUSY;
  pthread_mutex_unlock(&s->kt.mu);
  return f;
}

/* The kernel just promoted ran kn_ms in its canary, tier 0 t0_ms on the
 * same data.  A canary is one run, the kernel's first (its code and
 * scratch pages are touched for the first time, the pool wakes), often
 * while the daemon compiles on the same cores: a kernel of a few
 * microseconds was seen taking 150 ms there, as its second thread waited
 * for a core.  So a canary decides only for the kernel (noise does not
 * make a kernel look faster): by a quarter against the interpreter.
 * Otherwise, and always against a library (OpenBLAS, cuBLAS, cuDNN, whose
 * first run is cold too), the two race; on a device whose tier 0 without
 * a library runs on the host (race_host 0), the kernel is kept. */
static void judge(nf_session *s, nf__kent *k, double kn_ms, double t0_ms) {
  k->kn_ms = kn_ms;
  k->t0_ms = t0_ms;
  if (!lib(s, k) && (kn_ms * 1.25 < t0_ms || !dev(s)->race_host))
    verdict(s, k, kn_ms, t0_ms, verdict_flags(s));
  else
    k->race_left = NF_RACE_RUNS;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The race of k's kernel against tier 0 ends after `pairs` pairs of runs:
 * the faster by median is kept (tier 0 only when clearly faster), and
 * the verdict recorded. */
static void race_end(nf_session *s, nf__kent *k, int pairs) {
  double t0 = median(k->race_ms[1], pairs), kn = median(k->race_ms[0], pairs);
  int slower = t0 < 0.97 * kn;
  k->race_left = 0;
  k->t0_ms = t0;
  k->kn_ms = kn;
  verdict(s, k, kn, t0, NF__VERDICT_RACED | (slower ? NF__VERDICT_SLOWER : 0) | verdict_flags(s));
  if (slower) hold_t0(s, k, kn, t0, 0);
}

/* A candidate whose very bytes passed a canary here before: swapped in
 * without one.  Its recorded verdict says whether it runs instead of tier
 * 0; without one, a library races it, and a kernel replacing the
 * interpreter is timed on its first run against the interpreter's
 * estimated time (a race when that is not clear). */
static void promote_trusted(nf_session *s, nf__kent *k) {
  /* (a data-parallel session ignores this machine's records: the ranks'
   * may differ, their decisions must not) */
  const nf__verdict *v = dev(s)->host && !s->dist ? nf__verdict_get(s, k->key, k->cand_sha)
                                                  : NULL;
  promote(s, k);
  s->trusted++;
  if (v && (v->flags & (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) ==
               (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) {
    /* lost while the daemon worked beside it: raced again */
    k->race_left = lib(s, k) || dev(s)->race_host ? NF_RACE_RUNS : 0;
  } else if (v) {
    s->remembered++;
    k->t0_ms = v->tier0_ms;
    k->kn_ms = v->kernel_ms;
    if (v->flags & NF__VERDICT_SLOWER) hold_t0(s, k, v->kernel_ms, v->tier0_ms, 1);
  } else if (lib(s, k)) {
    k->race_left = NF_RACE_RUNS;
  } else {
    k->probe = dev(s)->race_host;
  }
}

/* Runs op with k's candidate (on copies, by the device) and what it
 * replaces (for real), compares on the host, and promotes or rejects the
 * candidate.  The real outputs come from the reference: the host's tier 0
 * while the entry keeps tier 0, else the verified kernel. */
static int run_canary(nf_session *s, nf__kent *k, nf__op *op) {
  void **got = calloc(op->n_out + 1, sizeof *got);
  if (!got) return NF_ENOMEM;
  nf_buf e = NF_BUF_INIT;
  int crc = NF_OK;
  double c_ms = 0;
  int rc = dev(s)->canary(s, k, op, k->cand, got, &c_ms, &crc, &e);
  int vs_t0 = !(k->cur && k->verified && !k->prefer_t0);
  double r0 = nf_now_ms();
  if (rc == NF_OK)
    rc = timed_run(s, vs_t0 ? dev(s)->tier0(s, k, op, 1) : dev(s)->run(s, k, op, k->cur));
  double r_ms = nf_now_ms() - r0;
  /* (tier 0 as the reference leaves its outputs on the host) */
  for (uint32_t j = op->n_in; rc == NF_OK && !vs_t0 && dev(s)->pull && j < op->n_in + op->n_out; j++)
    rc = dev(s)->pull(s, op->bufs[j], (size_t)s->slots[op->slots[j]].bytes);
  if (rc == NF_OK) {
    int ok = nf__canary_verdict(s, k, op, got, crc, &e, dev(s)->sync ? "GPU kernel" : "kernel");
    if (s->dist) {
      /* promoted on every rank or on none; timed as the ranks' mean */
      int all = nf__dist_all(s, ok);
      if (ok && !all) {
        char hex[65];
        nf_hash_hex(k->key, hex);
        hex[16] = 0;
        nf__slog_warn(&s->log, "kernel %s (tier %d) rejected: it failed its canary on another rank",
                      hex, k->cand_tier);
        s->rejected++;
      }
      ok = all;
      double v[2] = {c_ms, r_ms};
      if (ok) nf__dist_mean(s, v, 2);
      c_ms = v[0];
      r_ms = v[1];
    }
    if (ok) {
      promote(s, k);
      nf__verified_add(s, k->key, k->cur_sha);
      if (vs_t0) {
        judge(s, k, c_ms, r_ms);
      } else {
        /* a better kernel replacing a verified one: a library races it
         * again; one that beats a kernel faster than the interpreter
         * is faster than the interpreter too */
        k->race_left = lib(s, k) ? NF_RACE_RUNS : 0;
        if (!lib(s, k) && k->t0_ms > 0 && c_ms < k->t0_ms) {
          k->kn_ms = c_ms;
          verdict(s, k, c_ms, k->t0_ms, verdict_flags(s));
        }
      }
    } else {
      unload(s, k->cand);
    }
    k->cand = NULL;
  }
  nf_buf_free(&e);
  for (uint32_t o = 0; o < op->n_out; o++) free(got[o]);
  free(got);
  return rc;
}

/* A candidate's tier, digest and time (kent.cand_*). */
typedef struct cand_meta {
  int tier;
  uint8_t sha[32];
  double ms;
} cand_meta;

/* Under mu: what waits in k's mailbox (NULL: nothing), its tier, digest
 * and time made k's candidate's, the previous candidate's kept in *old. */
static void *take_locked(nf_session *s, nf__kent *k, cand_meta *old) {
  old->tier = k->cand_tier;
  memcpy(old->sha, k->cand_sha, 32);
  old->ms = k->cand_ms;
  return nf__kt_take_locked(&s->kt, k);
}

/* What arrived for k (the device's accept made it) becomes its candidate,
 * loaded by the device; one still waiting for its canary is superseded.
 * When the load fails, the waiting candidate keeps its own tier, digest
 * and time (old). */
static void set_cand(nf_session *s, nf__kent *k, void *arrived, const cand_meta *old) {
  void *kern = dev(s)->load ? dev(s)->load(s, k, arrived) : arrived;
  if (!kern) {
    k->cand_tier = old->tier;
    memcpy(k->cand_sha, old->sha, 32);
    k->cand_ms = old->ms;
    return;
  }
  unload(s, k->cand);
  k->cand = kern;
}

#define NF_HOLD_NOTICE 50 /* steps a candidate waits for the ranks before it is said */

/* Data-parallel steps: a candidate is tried only when every rank holds
 * the same bytes (the same digest), and trusted without a canary only when
 * every rank verified them before; else it waits (kent.hold). */
static void agree(nf_session *s) {
  int n = s->kt.n_kents;
  uint64_t *v = calloc((size_t)n * 2 + 1, sizeof *v);
  if (!v) nf__dist_abort(s, "out of memory for the agreement on kernels");
  for (int i = 0; i < n; i++) {
    const nf__kent *k = &s->kt.kents[i];
    if (!k->cand) continue;
    uint64_t h;
    memcpy(&h, k->cand_sha, sizeof h);
    v[i] = h | 1; /* (never 0) */
    v[n + i] = nf__verified_has(s, k->key, k->cand_sha) ? 1 : 0;
  }
  nf__dist_same(s, v, 2 * n);
  for (int i = 0; i < n; i++) {
    nf__kent *k = &s->kt.kents[i];
    k->hold = k->cand && !v[i];
    k->all_trust = k->cand && v[i] && v[n + i];
    k->hold_steps = k->hold ? k->hold_steps + 1 : 0;
    if (k->hold_steps == NF_HOLD_NOTICE) {
      char hex[65];
      nf_hash_hex(k->key, hex);
      hex[16] = 0;
      nf__slog_warn(&s->log, "kernel %s (tier %d) has waited %d steps for the other ranks: their "
                    "daemons gave other bytes for it (ranks on different CPUs, each node's "
                    "daemon compiling for its own); the entry keeps what it runs",
                    hex, k->cand_tier, NF_HOLD_NOTICE);
    }
  }
  free(v);
}

void nf__kt_boundary(nf_session *s, int step) {
  for (int i = 0; i < s->kt.n_kents; i++) {
    nf__kent *k = &s->kt.kents[i];
    pthread_mutex_lock(&s->kt.mu);
    void *arrived = NULL;
    cand_meta old;
    if (k->in_obj && k->in_tier == 0 && (k->cur || k->cand)) {
      /* a kernel generated here, late: the daemon's is in use already */
      s->kt.dev->drop(k->in_obj);
      k->in_obj = NULL;
    } else {
      arrived = take_locked(s, k, &old);
    }
    pthread_mutex_unlock(&s->kt.mu);
    if (arrived) set_cand(s, k, arrived, &old);
  }
  if (s->dist && step) agree(s);
}

/* Whether to wait for the daemon's first kernel of k rather than run
 * tier 0 (the interpreter): only while connected and the kernel is on its
 * way, and only as long as tier 0 would take.
 *
 * A kernel verified here before is a cache hit away: worth up to 250 ms
 * even for a cheap subgraph, within one second for the whole first step.
 * A kernel never verified here pays one tier-0 run in its canary anyway;
 * waiting for it while tier 0 would take seconds (a default kernel is
 * typically a second of compiling away) spares a second one, so a cold
 * session runs such a subgraph at tier 0 once rather than twice.  The
 * waits of a session are bounded by NF_COLD_WAIT_MS in all. */
static void maybe_wait(nf_session *s, nf__kent *k) {
  if (k->cur || lib(s, k) || k->cand || !dev(s)->host) return;
  double est = (double)k->flops * k->n_ops / s->interp_rate;
  if (est > 120000) est = 120000;
  double allow;
  int cold = !nf__verified_has(s, k->key, NULL);
  if (!cold) {
    if (est < 50) est = 0;
    double extra = s->first_wait_left < 250 ? s->first_wait_left : 250;
    allow = est > extra ? est : extra;
  } else {
    if (est < 1000) return;
    allow = est < s->cold_wait_left ? est : s->cold_wait_left;
  }
  if (allow <= 0) return;
  double start = nf_now_ms(), until = start + allow;
  pthread_mutex_lock(&s->kt.mu);
  while (!k->in_obj && ((s->kt.connected && (k->dstate == DK_SUBMITTED || k->dstate == DK_ACCEPTED)) ||
                      (s->kt.link_first && k->dstate == DK_NONE))) {
    double now = nf_now_ms();
    if (now >= until) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double w = until - now;
    ts.tv_sec += (time_t)(w / 1000);
    ts.tv_nsec += (long)(fmod(w, 1000) * 1e6);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->kt.cv, &s->kt.mu, &ts);
  }
  double waited = nf_now_ms() - start;
  if (cold)
    s->cold_wait_left -= waited;
  else
    s->first_wait_left -= waited > est ? waited - est : 0;
  cand_meta old;
  void *arrived = take_locked(s, k, &old);
  pthread_mutex_unlock(&s->kt.mu);
  if (arrived) set_cand(s, k, arrived, &old);
}

/* Runs op once: the candidate's canary, a run of the race between tier 0
 * and the kernel, the kernel, or tier 0. */
static int dispatch(nf_session *s, nf__kent *k, nf__op *op) {
  /* (a race run's time must not include earlier ops' queued work) */
  int rc = k->cur && !cand(k) && k->race_left > 0 ? timed_run(s, NF_OK) : NF_OK;
  if (rc != NF_OK) return rc;
  double t0 = nf_now_ms();
  if (cand(k)) {
    rc = run_canary(s, k, op);
  } else if (k->cur && k->race_left > 0) {
    /* tier 0 against the compiled kernel, alternating, the kernel first,
     * each waited for; both are verified, so either result is the step's */
    int t0run = k->race_left % 2, i = (NF_RACE_RUNS - k->race_left) / 2;
    rc = timed_run(s, t0run ? dev(s)->tier0(s, k, op, 0) : dev(s)->run(s, k, op, k->cur));
    double ran = nf_now_ms() - t0;
    nf__dist_mean(s, &ran, 1); /* (data-parallel: the ranks' mean decides) */
    k->race_ms[t0run][i] = ran;
    k->race_left--;
    if (rc == NF_OK && t0run) {
      /* a pair done: stop after two when one side took 3x the other's
       * time in both (a slow kernel is not run a third time) */
      int far = 0;
      for (int q = 0; i >= 1 && q < 2; q++) {
        double a = k->race_ms[1][i - q], b = k->race_ms[0][i - q];
        far += a > 3 * b ? 1 : b > 3 * a ? -1 : 0;
      }
      if (k->race_left == 0 || far == 2 || far == -2) race_end(s, k, i + 1);
    }
  } else if (k->cur && !k->prefer_t0) {
    rc = dev(s)->run(s, k, op, k->cur);
    if (k->probe && rc == NF_OK) {
      /* the first run of a kernel trusted without a verdict: clearly
       * faster than the interpreter's estimate, or a race */
      rc = timed_run(s, rc);
      double kn = nf_now_ms() - t0, est = (double)k->flops / s->interp_rate;
      if (s->dist) {
        double v[2] = {kn, est};
        nf__dist_mean(s, v, 2);
        kn = v[0];
        est = v[1];
      }
      k->probe = 0;
      k->kn_ms = kn;
      k->t0_ms = est;
      if (kn * 4 < est)
        verdict(s, k, kn, est, NF__VERDICT_ESTIMATE | verdict_flags(s));
      else
        k->race_left = NF_RACE_RUNS;
    }
  } else {
    rc = dev(s)->tier0(s, k, op, 0);
    double dt = nf_now_ms() - t0;
    if (!dev(s)->sync || !lib(s, k)) k->t0_ms = dt; /* (a queued library call: not its time) */
    /* the interpreter's rate, on the host's CPU alone (a GPU's host tier 0
     * includes its transfers) */
    if (dev(s)->host && !k->gemm && dt > 1 && k->flops > 0) {
      double r = (double)k->flops / dt;
      s->interp_rate = 0.7 * s->interp_rate + 0.3 * r;
    }
  }
  return rc;
}

int nf__kt_run_ops(nf_session *s, const uint8_t *mask) {
  const nf__device *d = dev(s);
  int rc = NF_OK;
  if (s->dist && !mask) nf__dist_run_begin(s);
  for (int i = 0; i < s->n_ops && rc == NF_OK; i++) {
    if (mask && !mask[i]) continue;
    nf__op *op = &s->ops[i];
    nf__kent *k = &s->kt.kents[op->kent];
    if (s->dist && mask) {
      /* a data-parallel evaluation: the kernels the steps agreed on,
       * nothing exchanged (a rank may evaluate alone) */
      rc = k->cur && !k->prefer_t0 ? d->run(s, k, op, k->cur) : d->tier0(s, k, op, 0);
      continue;
    }
    if (s->dist && op->alias && (rc = nf__dist_grads(s)) != NF_OK) break;
    if (!k->cur && !k->cand && s->step == 0 && !s->dist) maybe_wait(s, k);
    if (cand(k) && (s->dist ? k->all_trust : nf__verified_has(s, k->key, k->cand_sha)))
      promote_trusted(s, k);
    double t0 = nf_now_ms();
    int kernel = !cand(k) && k->cur && k->race_left <= 0 && !k->prefer_t0;
    if (d->op_begin) rc = d->op_begin(s, i);
    if (rc == NF_OK) rc = dispatch(s, k, op);
    if (d->op_end) rc = d->op_end(s, i, kernel, rc);
    k->run_ms += nf_now_ms() - t0;
    if (s->dist && !mask && rc == NF_OK) rc = nf__dist_op_done(s, i);
  }
  return rc;
}
