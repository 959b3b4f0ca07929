/* kt_cpu.c - running a kernel table's entries on the CPU (session_int.h):
 * an entry runs its compiled kernel when one has been verified, else
 * tier 0 (OpenBLAS for matmul-shaped subgraphs, the interpreter
 * otherwise).  A kernel taken from the mailbox is a candidate: its first
 * run is checked against what it replaces (tier 0 for the entry's first
 * compiled kernel, the verified kernel after that) on the step's real
 * data (the canary), and it is used only from then on.  A kernel that
 * passed replaces tier 0 only where it is faster here: a race of
 * alternating runs decides when the canary's times do not, and the
 * verdict is recorded (verify.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "session_int.h"

static int run_kernel(nf_session *s, nf_kernel *kn, const nf__op *op, void *const *bufs,
                      nf_buf *err) {
  return nf_kernel_run(kn, bufs, op->n_in + op->n_out, s->pool, err);
}

/* k's candidate becomes its kernel (it passed a canary, or these bytes
 * did before).  Whether it runs instead of tier 0 is decided apart. */
static void promote(nf_session *s, nf__kent *k) {
  nf_kernel_free(k->cur); /* the handle only: the code stays loaded */
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
}

static const char *tier0_name(const nf__kent *k) { return k->gemm ? "OpenBLAS" : "the interpreter"; }

/* k keeps tier 0: its kernel ran kn_ms per run against tier 0's t0_ms.
 * Where that costs a step NF_SLOW_NOTICE_MS or more, it is said (once per
 * kernel) and the link asks the daemon for a faster kernel; a tiny
 * subgraph whose kernel loses by microseconds (a pool's wake-up against
 * the interpreter) is neither worth a line nor a search. */
#define NF_SLOW_NOTICE_MS 0.25
static void hold_t0(nf_session *s, nf__kent *k, double kn_ms, double t0_ms, int remembered) {
  k->prefer_t0 = 1;
  k->race_left = 0;
  k->slow_ratio = t0_ms > 0 ? kn_ms / t0_ms : 0;
  if ((kn_ms - t0_ms) * (k->n_ops > 0 ? k->n_ops : 1) < NF_SLOW_NOTICE_MS) return;
  char hex[65];
  nf_hash_hex(k->key, hex);
  hex[16] = 0;
  nf__slog_warn(&s->log, "kernel %s (tier %d) %s %.2fx slower than %s here (%.3g against %.3g ms per "
                      "run at %d thread%s): keeping %s; the daemon is asked for a faster one",
                   hex, k->cur_tier, remembered ? "ran" : "runs", k->slow_ratio, tier0_name(k),
                   kn_ms, t0_ms, s->threads, s->threads == 1 ? "" : "s", tier0_name(k));
  pthread_mutex_lock(&s->kt.mu);
  if (!k->ask_better) {
    k->ask_better = 1;
    memcpy(k->slow_sha, k->cur_sha, 32);
  }
  pthread_cond_broadcast(&s->kt.cv);
  pthread_mutex_unlock(&s->kt.mu);
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
 * Otherwise, and always against OpenBLAS (whose first run is cold too),
 * the two race. */
static void judge(nf_session *s, nf__kent *k, double kn_ms, double t0_ms) {
  k->kn_ms = kn_ms;
  k->t0_ms = t0_ms;
  if (!k->gemm && kn_ms * 1.25 < t0_ms)
    nf__verdict_put(s, k->key, k->cur_sha, kn_ms, t0_ms, verdict_flags(s));
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
  nf__verdict_put(s, k->key, k->cur_sha, kn, t0,
                  NF__VERDICT_RACED | (slower ? NF__VERDICT_SLOWER : 0) | verdict_flags(s));
  if (slower) hold_t0(s, k, kn, t0, 0);
}

/* A candidate whose very bytes passed a canary here before: swapped in
 * without one.  Its recorded verdict says whether it runs instead of tier
 * 0; without one, OpenBLAS races it, and a kernel replacing the
 * interpreter is timed on its first run against the interpreter's
 * estimated time (a race when that is not clear). */
static void promote_trusted(nf_session *s, nf__kent *k) {
  const nf__verdict *v = nf__verdict_get(s, k->key, k->cand_sha);
  promote(s, k);
  s->trusted++;
  if (v && (v->flags & (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) ==
               (NF__VERDICT_SLOWER | NF__VERDICT_BUSY)) {
    /* lost while the daemon worked beside it: raced again */
    k->race_left = NF_RACE_RUNS;
  } else if (v) {
    s->remembered++;
    k->t0_ms = v->tier0_ms;
    k->kn_ms = v->kernel_ms;
    if (v->flags & NF__VERDICT_SLOWER) hold_t0(s, k, v->kernel_ms, v->tier0_ms, 1);
  } else if (k->gemm) {
    k->race_left = NF_RACE_RUNS;
  } else {
    k->probe = 1;
  }
}

/* Runs op with k's candidate and what it replaces, compares, and promotes
 * or rejects the candidate.  The real outputs come from the reference. */
static int run_canary(nf_session *s, nf__kent *k, nf__op *op) {
  uint32_t n = op->n_in + op->n_out;
  void **cb = calloc(n, sizeof(void *));
  void **scratch = calloc(n, sizeof(void *));
  int rc = cb && scratch ? NF_OK : NF_ENOMEM;
  /* candidate buffers: outputs to scratch; for an in-place op, inputs
   * copied to scratch too and outputs aliasing those copies */
  for (uint32_t j = 0; rc == NF_OK && j < n; j++) {
    const nf__slot *sl = &s->slots[op->slots[j]];
    if (j < op->n_in && !op->alias) {
      cb[j] = op->bufs[j];
      continue;
    }
    if (j >= op->n_in && op->alias) {
      for (uint32_t i = 0; i < op->n_in; i++)
        if (s->slots[op->slots[i]].ptr == sl->ptr) cb[j] = cb[i];
      if (cb[j]) continue;
    }
    scratch[j] = aligned_alloc(64, ((size_t)sl->bytes + 63) / 64 * 64 + 64);
    if (!scratch[j]) {
      rc = NF_ENOMEM;
      break;
    }
    if (j < op->n_in) memcpy(scratch[j], op->bufs[j], (size_t)sl->bytes);
    cb[j] = scratch[j];
  }
  nf_buf e = NF_BUF_INIT;
  int crc = NF_OK;
  /* the scratch outputs touched first: their page faults are not the
   * candidate's time */
  for (uint32_t j = op->n_in; rc == NF_OK && j < n; j++)
    if (scratch[j]) memset(scratch[j], 0, (size_t)s->slots[op->slots[j]].bytes);
  double c0 = nf_now_ms();
  if (rc == NF_OK) crc = run_kernel(s, k->cand, op, cb, &e);
  double c_ms = nf_now_ms() - c0;
  /* the reference, for real: what runs now (tier 0 while the entry keeps
   * it, else the verified kernel) */
  int vs_t0 = !(k->cur && k->verified && !k->prefer_t0);
  double r0 = nf_now_ms();
  if (rc == NF_OK) {
    if (!vs_t0) rc = run_kernel(s, k->cur, op, op->bufs, &s->err);
    else rc = nf__tier0_run(s, k, op, op->bufs, &s->err);
  }
  double r_ms = nf_now_ms() - r0;
  if (rc == NF_OK) {
    if (nf__canary_verdict(s, k, op, cb + op->n_in, crc, &e, "kernel")) {
      promote(s, k);
      nf__verified_add(s, k->key, k->cur_sha);
      if (vs_t0) {
        k->t0_ms = r_ms;
        judge(s, k, c_ms, r_ms);
      } else {
        /* a better kernel replacing a verified one: OpenBLAS races it
         * again; one that beats a kernel faster than the interpreter
         * is faster than the interpreter too */
        k->race_left = k->gemm ? NF_RACE_RUNS : 0;
        if (!k->gemm && k->t0_ms > 0 && c_ms < k->t0_ms) {
          k->kn_ms = c_ms;
          nf__verdict_put(s, k->key, k->cur_sha, c_ms, k->t0_ms, verdict_flags(s));
        }
      }
    } else {
      nf_kernel_free(k->cand);
    }
    k->cand = NULL;
  }
  nf_buf_free(&e);
  for (uint32_t j = 0; scratch && j < n; j++) free(scratch[j]);
  free(scratch);
  free(cb);
  return rc;
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
  if (k->cur || k->gemm || k->cand) return;
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
  void *arrived = nf__kt_take_locked(&s->kt, k);
  if (arrived) k->cand = arrived;
  pthread_mutex_unlock(&s->kt.mu);
}

int nf__kt_run_cpu(nf_session *s, nf__op *op) {
  nf__kent *k = &s->kt.kents[op->kent];
  if (!k->cur && !k->cand && s->step == 0) maybe_wait(s, k);
  if (k->cand && nf__verified_has(s, k->key, k->cand_sha)) promote_trusted(s, k);
  double t0 = nf_now_ms();
  int rc;
  if (k->cand) {
    rc = run_canary(s, k, op);
  } else if (k->cur && k->race_left > 0) {
    /* tier 0 against the compiled kernel, alternating, the kernel first;
     * both are verified, so either result is the step's */
    int t0run = k->race_left % 2, i = (NF_RACE_RUNS - k->race_left) / 2;
    rc = t0run ? nf__tier0_run(s, k, op, op->bufs, &s->err)
               : run_kernel(s, k->cur, op, op->bufs, &s->err);
    k->race_ms[t0run][i] = nf_now_ms() - t0;
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
    rc = run_kernel(s, k->cur, op, op->bufs, &s->err);
    if (k->probe && rc == NF_OK) {
      /* the first run of a kernel trusted without a verdict: clearly
       * faster than the interpreter's estimate, or a race */
      double kn = nf_now_ms() - t0, est = (double)k->flops / s->interp_rate;
      k->probe = 0;
      k->kn_ms = kn;
      k->t0_ms = est;
      if (kn * 4 < est)
        nf__verdict_put(s, k->key, k->cur_sha, kn, est, NF__VERDICT_ESTIMATE | verdict_flags(s));
      else
        k->race_left = NF_RACE_RUNS;
    }
  } else {
    rc = nf__tier0_run(s, k, op, op->bufs, &s->err);
    double dt = nf_now_ms() - t0;
    k->t0_ms = dt;
    if (!k->gemm && dt > 1 && k->flops > 0) {
      double r = (double)k->flops / dt;
      s->interp_rate = 0.7 * s->interp_rate + 0.3 * r;
    }
  }
  k->run_ms += nf_now_ms() - t0;
  return rc;
}
