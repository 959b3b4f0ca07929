/* job_main.c - a neoflowd job process (`neoflowd --job`): compiles or
 * tunes one subgraph for the daemon, so that LLVM, the search and the
 * measurement workers never run inside the event-loop process.
 *
 * Protocol (proto/neoflow.proto): one JobRequest frame on stdin; JobEvent
 * frames on stdout: for MODE_COMPILE one final kernel (tier 1, the default
 * schedule, not measured); for MODE_TUNE progress (at most every 250 ms),
 * every measured record, each improvement over the default by 3% or more
 * (a non-final kernel), then the final kernel: the confirmed best (tier 2)
 * when it beats the default, else the default's kernel with its measured
 * time (tier 1, so the key counts as tuned).  Then Done.  Failures are an
 * Error event with a typed code; the exit status is 0 whenever the events
 * could be written.
 *
 * The process dies with the daemon (PR_SET_PDEATHSIG), dumps no core, and
 * lives under the daemon's memory limit for jobs (RLIMIT_AS, not under
 * AddressSanitizer, which reserves terabytes of address space). */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "nf_codegen.h"
#include "nf_dconn.h"
#include "nf_env.h"
#include "nf_features.h"
#include "nf_lower.h"
#include "nf_nvrtc_link.h"
#include "nf_search.h"
#include "nf_wire.h"

int nfd_job_main(void);

#define NFD_JOB_NICE 10 /* job processes' niceness (setpriority) */

typedef struct job {
  int fd;
  int failed_write;
  double t_progress;
  double default_ms;
  double sent_ms; /* best improvement streamed so far */
  const nf_graph *g;
  nf_cpu_target target;
  int cuda_sm; /* 0: the CPU; else a CUDA bundle for this architecture */
  int checking; /* a check of a published schedule: no improvement streamed */
} job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(job *J, Neoflow__JobEvent *ev) {
  if (J->failed_write) return;
  if (nf_wire_write_frame(J->fd, &ev->base, NF_WIRE_JOB_FRAME_MAX, 0) != NF_OK) {
    J->failed_write = 1;
  }
}

static void emit_error(job *J, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void emit_error(job *J, int code, const char *fmt, ...) {
  char msg[NF_WIRE_TEXT_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nf_wire_text_sanitize(msg, NF_WIRE_TEXT_MAX, 1);
  Neoflow__Error e = NEOFLOW__ERROR__INIT;
  e.code = code;
  e.message = msg;
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_ERROR;
  ev.error = &e;
  emit(J, &ev);
}

/* Compiles g with schedule s (NULL: the default): a CPU shared object,
 * or for a GPU target a CUDA bundle (nf_cuda_plan.h).  NF_OK with *so. */
static int compile(job *J, const nf_schedule *s, nf_blob *so, nf_buf *err) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) return NF_ENOMEM;
  nf_lprog *p = NULL;
  int rc = nf_lower(J->g, s, ctx, &p, err);
  if (rc == NF_OK && J->cuda_sm) {
    nf_buf b = NF_BUF_INIT;
    rc = nf_cuda_compile_bundle(p, J->cuda_sm, &b, NULL, err);
    nf_blob_free(so);
    if (rc == NF_OK) {
      so->data = (uint8_t *)b.data; /* taken over */
      so->len = b.len;
    } else {
      nf_buf_free(&b);
    }
  } else if (rc == NF_OK) {
    rc = nf_cpu_compile(p, &J->target, so, NULL, err);
  }
  nf_ir_ctx_free(ctx);
  return rc;
}

/* The default schedule of the job's target. */
static int default_schedule(job *J, nf_schedule **s) {
  if (J->cuda_sm) return nf_schedule_default_gpu(J->g, NF_GPU_DEFAULT_THREADS, s);
  nf_sched_target t = nf_cpu_sched_target(&J->target);
  return nf_schedule_default_for(J->g, &t, s);
}

static void emit_kernel(job *J, int tier, const char *schedule, double ms, double default_ms,
                        int trials, const nf_blob *so, int final) {
  Neoflow__JobKernel k = NEOFLOW__JOB_KERNEL__INIT;
  k.tier = tier;
  k.schedule = (char *)schedule;
  k.time_ms = ms;
  k.default_ms = default_ms;
  k.binary.data = so->data;
  k.binary.len = so->len;
  k.trials = (uint32_t)trials;
  k.final = final;
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_KERNEL;
  ev.kernel = &k;
  emit(J, &ev);
}

/* Compiles the schedule text and emits it as a kernel. */
static int emit_schedule(job *J, int tier, const char *text, double ms, double default_ms,
                         int trials, int final, nf_buf *err) {
  nf_schedule *s = NULL;
  int rc = nf_schedule_parse(text, "schedule", &s, err);
  nf_blob so = NF_BLOB_INIT;
  if (rc == NF_OK) rc = compile(J, s, &so, err);
  if (rc == NF_OK) emit_kernel(J, tier, text, ms, default_ms, trials, &so, final);
  nf_schedule_free(s);
  nf_blob_free(&so);
  return rc;
}

static void on_progress(void *user, const nf_search_progress *p) {
  job *J = user;
  double t = now_s();
  if (t - J->t_progress < 0.25 && p->trial < p->max_trials) return;
  J->t_progress = t;
  Neoflow__Progress pg = NEOFLOW__PROGRESS__INIT;
  pg.state = NEOFLOW__JOB_STATE__JOB_TUNING;
  pg.trial = (uint32_t)p->trial;
  pg.max_trials = (uint32_t)p->max_trials;
  pg.failures = (uint32_t)p->failures;
  pg.best_ms = p->best_ms > 0 ? p->best_ms : 0;
  pg.default_ms = p->default_ms > 0 ? p->default_ms : 0;
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_PROGRESS;
  ev.progress = &pg;
  emit(J, &ev);
}

static void on_record(void *user, const nf_search_record *rec) {
  job *J = user;
  Neoflow__Record r = NEOFLOW__RECORD__INIT;
  r.schedule = rec->schedule ? rec->schedule : (char *)"";
  r.status = rec->status;
  r.time_ms = rec->status == NF_MEAS_OK && isfinite(rec->time_ms) ? rec->time_ms : 0;
  r.features.data = (uint8_t *)rec->feat;
  r.features.len = sizeof rec->feat;
  char reason[sizeof rec->reason];
  snprintf(reason, sizeof reason, "%s", rec->reason);
  r.reason = nf_wire_text_sanitize(reason, NF_WIRE_TEXT_MAX, 1);
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_RECORD;
  ev.record = &r;
  if (rec->trial >= 0) emit(J, &ev); /* prior records are already stored */
  if (rec->status != NF_MEAS_OK || rec->time_ms <= 0) return;
  if (rec->trial == 0) {
    J->default_ms = rec->time_ms;
    return;
  }
  /* stream an improvement: 3% better than the default and than the last
   * (not in a check: only its verdict is an answer) */
  if (J->checking) return;
  double ref = J->sent_ms > 0 ? J->sent_ms : J->default_ms;
  if (ref > 0 && rec->time_ms < ref * 0.97 && rec->schedule) {
    nf_buf err = NF_BUF_INIT;
    if (emit_schedule(J, NEOFLOW__TIER__TIER_TUNED, rec->schedule, rec->time_ms, J->default_ms, 0,
                      0, &err) == NF_OK)
      J->sent_ms = rec->time_ms;
    nf_buf_free(&err);
  }
}

/* NF_JOB_FAKE_TIMES (the daemon's tests): every correct candidate takes
 * 0.5 ms, the default 1 ms, so that a tuned kernel wins whatever the
 * machine's noise; candidates are still compiled and checked for real. */
static void fake_time(void *user, int is_default, nf_search_record *rec) {
  (void)user;
  rec->time_ms = is_default ? 1.0 : 0.5;
}

/* NF_JOB_FAULT=candidates (the daemon's tests): every candidate of a
 * tuning, the default's included, is replaced by bytes that do not load,
 * so that tuning finds no correct candidate. */
static void bad_candidate(void *user, int trial, nf_blob *so) {
  (void)user;
  (void)trial;
  if (so->len > 64) memset(so->data, 0x5a, 64);
}

static int code_of(int rc) {
  switch (rc) {
    case NF_EINVAL: return NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH;
    case NF_EUNSUPPORTED: return NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH;
    case NF_ELIMIT: return NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH;
    default: return NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR;
  }
}

/* Connects to the request's upstream, trusting its configured key only,
 * and sends the graph in this mode (schedule: MODE_PUBLISH's). */
static int upstream_submit(const Neoflow__JobRequest *rq, int mode, const char *schedule,
                           const char *who, nf_dconn **c, nf_buf *err) {
  nf_trust tr;
  memset(&tr, 0, sizeof tr);
  *c = NULL;
  int rc = nf_trust_add_key(&tr, rq->upstream_public_key, err);
  nf_dconn_opts o = {.address = rq->upstream_address,
                     .key_file = rq->upstream_key_file && rq->upstream_key_file[0]
                                     ? rq->upstream_key_file : NULL,
                     .trust = &tr, .client_name = who,
                     .timeout_ms = rq->upstream_timeout_ms ? (int)rq->upstream_timeout_ms : 1000,
                     /* (a GPU's kernels: the upstream keys them by its sm and name) */
                     .cuda_sm = (int)rq->cuda_sm, .cuda_name = rq->cuda_name};
  if (rc == NF_OK) rc = nf_dconn_open(&o, c, err);
  /* (on TCP the handshake checked the key; on a socket, only the uid) */
  if (rc == NF_OK && !nf_trust_key_ok(&tr, nf_dconn_daemon_key(*c))) {
    nf_buf_printf(err, "the daemon there signs with another key than [upstream] public_key");
    rc = NF_EPERM;
  }
  if (rc == NF_OK) {
    Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
    s.request_id = 1;
    s.graph = rq->graph;
    s.mode = mode;
    s.schedule = (char *)(schedule ? schedule : "");
    Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
    m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    m.submit = &s;
    rc = nf_dconn_send(*c, &m, err);
  }
  return rc;
}

/* A team's cache tier (docs/daemon.md): the upstream asked for the key
 * (MODE_LOOKUP) within the request's timeout.  1 when it answered with a
 * kernel signed by the configured key (digest and signature checked by
 * nf_dconn), emitted as this job's final kernel; 0 on a miss or any
 * failure (the job compiles), with why on stderr (the daemon's log). */
static int from_upstream(job *J, const Neoflow__JobRequest *rq) {
  if (!rq->upstream_address || !rq->upstream_address[0]) return 0;
  nf_buf err = NF_BUF_INIT;
  int timeout = rq->upstream_timeout_ms ? (int)rq->upstream_timeout_ms : 1000;
  nf_dconn *c = NULL;
  int rc = upstream_submit(rq, NEOFLOW__MODE__MODE_LOOKUP, NULL, "neoflowd (a node's lookup)", &c,
                           &err);
  nf_dkernel k;
  memset(&k, 0, sizeof k);
  int code = 0;
  if (rc == NF_OK) rc = nf_dconn_next_kernel(c, 1, timeout, NULL, NULL, &k, &code, &err);
  nf_dconn_close(c);
  if (rc != NF_OK) {
    if (code != NEOFLOW__ERROR_CODE__ERR_NOT_FOUND)
      fprintf(stderr, "neoflowd --job: upstream %s: %s (compiling here)\n", rq->upstream_address,
              err.len ? nf_buf_str(&err) : nf_strerror(rc));
    nf_buf_free(&err);
    nf_dkernel_free(&k);
    return 0;
  }
  /* tuned there: tier 2, or the default measured best (time_ms > 0) */
  int tuned = k.tier >= 2 || k.time_ms > 0;
  Neoflow__JobKernel jk = NEOFLOW__JOB_KERNEL__INIT;
  jk.tier = k.tier >= 2 ? NEOFLOW__TIER__TIER_TUNED : NEOFLOW__TIER__TIER_DEFAULT;
  jk.schedule = k.schedule ? k.schedule : (char *)"";
  jk.time_ms = k.time_ms;
  jk.default_ms = k.default_ms;
  jk.binary.data = k.binary;
  jk.binary.len = k.len;
  jk.trials = tuned ? 1 : 0;
  jk.final = 1;
  jk.from_upstream = 1;
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_KERNEL;
  ev.kernel = &jk;
  emit(J, &ev);
  nf_dkernel_free(&k);
  nf_buf_free(&err);
  return 1;
}

/* How long a tuning job waits for its upstream to check what it
 * published (compile and measure two or three kernels there, behind that
 * daemon's queue): past it the job ends, not published (logged). */
#define NFD_PUBLISH_WAIT_MS 30000

/* A team's cache tier: the schedule this tuning keeps, published to the
 * upstream (MODE_PUBLISH).  The upstream compiles and measures it itself
 * and answers with the kernel it keeps for the key (signed by it: checked
 * like a lookup's); what it kept is emitted as a JobPublished event.  A
 * failure costs the wait at most and is only logged. */
static void publish(job *J, const Neoflow__JobRequest *rq, const char *schedule) {
  if (!rq->upstream_publish || !rq->upstream_address || !rq->upstream_address[0] || J->cuda_sm)
    return;
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  double deadline = now_s() + NFD_PUBLISH_WAIT_MS / 1000.0;
  int rc = upstream_submit(rq, NEOFLOW__MODE__MODE_PUBLISH, schedule,
                           "neoflowd (a node publishing)", &c, &err);
  nf_dkernel k;
  memset(&k, 0, sizeof k);
  int code = 0;
  while (rc == NF_OK) {
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0) {
      nf_buf_printf(&err, "no answer within %d s", NFD_PUBLISH_WAIT_MS / 1000);
      rc = NF_EIO;
      break;
    }
    nf_dkernel_free(&k);
    rc = nf_dconn_next_kernel(c, 1, left, NULL, NULL, &k, &code, &err);
    if (rc == NF_OK && k.final) break;
  }
  nf_dconn_close(c);
  int lost = rc != NF_OK && code == NEOFLOW__ERROR_CODE__ERR_NOT_KEPT;
  if (rc != NF_OK && !lost) {
    fprintf(stderr, "neoflowd --job: upstream %s: the tuned schedule is not published: %s\n",
            rq->upstream_address, err.len ? nf_buf_str(&err) : nf_strerror(rc));
  } else {
    if (lost) /* measured there and slower than what it keeps */
      fprintf(stderr, "neoflowd --job: upstream %s: %s\n", rq->upstream_address, nf_buf_str(&err));
    Neoflow__JobPublished p = NEOFLOW__JOB_PUBLISHED__INIT;
    p.kept = !lost && k.schedule && !strcmp(k.schedule, schedule);
    p.tier = k.tier >= 2 ? NEOFLOW__TIER__TIER_TUNED : NEOFLOW__TIER__TIER_DEFAULT;
    p.time_ms = k.time_ms > 0 && isfinite(k.time_ms) ? k.time_ms : 0;
    Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
    ev.msg_case = NEOFLOW__JOB_EVENT__MSG_PUBLISHED;
    ev.published = &p;
    emit(J, &ev);
  }
  nf_dkernel_free(&k);
  nf_buf_free(&err);
}

/* A schedule a node published (rq->published), checked here: measured
 * (checked against the reference like any candidate) after the default,
 * then the key's kept schedule (rq->transfer), and nothing else.  Kept
 * only when it is the fastest of them (by 1% over the default): then its
 * kernel is final (tier 2, stored as tuned); else ERR_NOT_KEPT, and the
 * daemon keeps what it had, so that a published schedule never makes a
 * key worse nor marks it tuned by itself. */
static void check_published(job *J, const Neoflow__JobRequest *rq) {
  nf_buf err = NF_BUF_INIT, canon = NF_BUF_INIT;
  nf_schedule *s = NULL;
  int rc = nf_search_adapt(J->g, rq->published, &s, &err);
  if (rc != NF_OK) {
    emit_error(J, rc == NF_ENOMEM ? NEOFLOW__ERROR_CODE__ERR_INTERNAL
                                  : NEOFLOW__ERROR_CODE__ERR_NOT_KEPT,
               "the published schedule does not apply to this graph: %s", nf_buf_str(&err));
    nf_buf_free(&err);
    return;
  }
  nf_schedule_print(s, &canon);
  nf_schedule_free(s);
  nf_buf dtext = NF_BUF_INIT;
  nf_schedule *ds = NULL;
  if (default_schedule(J, &ds) == NF_OK) nf_schedule_print(ds, &dtext);
  nf_schedule_free(ds);
  if (dtext.len && !strcmp(nf_buf_str(&dtext), nf_buf_str(&canon))) {
    emit_error(J, NEOFLOW__ERROR_CODE__ERR_NOT_KEPT,
               "the published schedule is not the fastest here (it is the default schedule): "
               "not kept");
    nf_buf_free(&dtext);
    nf_buf_free(&canon);
    nf_buf_free(&err);
    return;
  }
  nf_buf_free(&dtext);
  const char *list[2] = {nf_buf_str(&canon), NULL};
  size_t n = 1;
  if (rq->n_transfer && rq->transfer[0]->schedule && rq->transfer[0]->schedule[0] &&
      strcmp(rq->transfer[0]->schedule, list[0]))
    list[n++] = rq->transfer[0]->schedule;
  J->checking = 1;
  nf_search_opts o;
  memset(&o, 0, sizeof o);
  o.max_trials = (int)n;
  o.max_seconds = rq->max_seconds;
  o.seed = rq->seed;
  o.target = J->target;
  o.measure.timeout_ms = rq->measure_timeout_ms;
  o.measure.n_threads = (int)rq->threads;
  o.transfer = list;
  o.n_transfer = n;
  o.progress = on_progress;
  o.on_record = on_record;
  o.user = J;
  if (nf_env(NF_ENV_JOB_FAKE_TIMES)) o.time_hook = fake_time;
  nf_search_result res;
  memset(&res, 0, sizeof res);
  rc = nf_search_run(J->g, &o, &res, &err);
  const nf_search_record *mine = NULL, *kept = NULL;
  for (size_t i = 1; rc == NF_OK && i < res.n_records; i++) {
    if (res.records[i].schedule && !strcmp(res.records[i].schedule, list[0]))
      mine = &res.records[i];
    if (n > 1 && res.records[i].schedule && !strcmp(res.records[i].schedule, list[1]))
      kept = &res.records[i];
  }
  /* by 1% over the default and over the kept kernel: noise never swaps
   * two nodes' schedules back and forth */
  int won = rc == NF_OK && res.best_schedule && !strcmp(res.best_schedule, list[0]) &&
            res.default_ms > 0 && res.best_ms < res.default_ms * 0.99 &&
            !(kept && kept->status == NF_MEAS_OK && kept->time_ms > 0 &&
              !(res.best_ms < kept->time_ms * 0.99));
  if (rc != NF_OK) {
    emit_error(J, code_of(rc), "checking the published schedule: %s",
               err.len ? nf_buf_str(&err) : nf_strerror(rc));
  } else if (!won) {
    char what[320];
    if (!mine)
      snprintf(what, sizeof what, "it is the default schedule");
    else if (mine->status != NF_MEAS_OK)
      snprintf(what, sizeof what, "%s: %s", nf_measure_status_name(mine->status), mine->reason);
    else
      snprintf(what, sizeof what, "%.4g ms here; the default %.4g ms, the best %.4g ms",
               mine->time_ms, res.default_ms, res.best_ms);
    emit_error(J, NEOFLOW__ERROR_CODE__ERR_NOT_KEPT,
               "the published schedule is not the fastest here (%s): not kept", what);
  } else {
    rc = emit_schedule(J, NEOFLOW__TIER__TIER_TUNED, list[0], res.best_ms, res.default_ms,
                       res.trials > 0 ? res.trials : 1, 1, &err);
    if (rc != NF_OK)
      emit_error(J, NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR, "the published schedule: %s",
                 nf_buf_str(&err));
  }
  nf_search_result_free(&res);
  nf_buf_free(&canon);
  nf_buf_free(&err);
}

static void run(job *J, const Neoflow__JobRequest *rq) {
  nf_buf err = NF_BUF_INIT;
  if (rq->mode == NEOFLOW__MODE__MODE_TUNE && rq->published && rq->published[0] && !J->cuda_sm) {
    check_published(J, rq);
    nf_buf_free(&err);
    return;
  }
  if (rq->mode == NEOFLOW__MODE__MODE_COMPILE && from_upstream(J, rq)) {
    nf_buf_free(&err);
    return;
  }
  if (rq->mode == NEOFLOW__MODE__MODE_COMPILE) {
    nf_schedule *s = NULL;
    int rc = default_schedule(J, &s);
    nf_blob so = NF_BLOB_INIT;
    if (rc == NF_OK) rc = compile(J, s, &so, &err);
    if (rc == NF_OK) {
      nf_buf text = NF_BUF_INIT;
      nf_schedule_print(s, &text);
      emit_kernel(J, NEOFLOW__TIER__TIER_DEFAULT, nf_buf_str(&text), 0, 0, 0, &so, 1);
      nf_buf_free(&text);
    } else {
      emit_error(J, code_of(rc), "compile: %s", err.len ? nf_buf_str(&err) : nf_strerror(rc));
    }
    nf_schedule_free(s);
    nf_blob_free(&so);
    nf_buf_free(&err);
    return;
  }
  /* tuning, warm-started from the cache's records */
  nf_search_record *prior = calloc(rq->n_prior ? rq->n_prior : 1, sizeof *prior);
  size_t n_prior = 0;
  for (size_t i = 0; prior && i < rq->n_prior; i++) {
    const Neoflow__Record *r = rq->prior[i];
    nf_search_record *p = &prior[n_prior];
    if (!nf_search_record_feat(r->features.data, r->features.len, J->cuda_sm > 0, p->feat))
      continue; /* another feature version */
    p->schedule = r->schedule;
    p->status = r->status;
    p->time_ms = r->time_ms;
    p->trial = -1;
    n_prior++;
  }
  /* a key never tuned: similar subgraphs' best schedules, and every
   * subgraph's records for the model (groups renumbered below n_corpus:
   * the cost model sizes its table by them) */
  const char **transfer = calloc(rq->n_transfer ? rq->n_transfer : 1, sizeof *transfer);
  size_t n_transfer = 0;
  for (size_t i = 0; transfer && i < rq->n_transfer; i++)
    if (rq->transfer[i]->schedule && *rq->transfer[i]->schedule)
      transfer[n_transfer++] = rq->transfer[i]->schedule;
  nf_search_sample *corpus = calloc(rq->n_corpus ? rq->n_corpus : 1, sizeof *corpus);
  size_t n_corpus = 0;
  for (size_t i = 0; corpus && i < rq->n_corpus; i++) {
    const Neoflow__Record *r = rq->corpus[i];
    nf_search_sample *c = &corpus[n_corpus];
    if (r->group >= rq->n_corpus || !(r->time_ms > 0) ||
        !nf_search_record_feat(r->features.data, r->features.len, J->cuda_sm > 0, c->feat))
      continue;
    c->time_ms = r->time_ms;
    c->group = r->group;
    n_corpus++;
  }
  nf_search_opts o;
  memset(&o, 0, sizeof o);
  o.max_trials = (int)rq->max_trials;
  o.max_seconds = rq->max_seconds;
  o.seed = rq->seed;
  o.target = J->target;
  o.cuda_sm = J->cuda_sm; /* GPU mode: candidates measured on the GPU by workers */
  /* ... on a device of the client's model only (the key names it) */
  o.measure.gpu_sm = J->cuda_sm;
  o.measure.gpu_name = rq->cuda_name && *rq->cuda_name ? rq->cuda_name : NULL;
  o.measure.timeout_ms = rq->measure_timeout_ms;
  o.measure.n_threads = (int)rq->threads;
  o.prior = prior;
  o.n_prior = n_prior;
  o.transfer = transfer;
  o.n_transfer = transfer ? n_transfer : 0;
  o.corpus = corpus;
  o.n_corpus = corpus ? n_corpus : 0;
  o.progress = on_progress;
  o.on_record = on_record;
  o.user = J;
  if (nf_env(NF_ENV_JOB_FAKE_TIMES)) o.time_hook = fake_time;
  const char *fault = nf_env(NF_ENV_JOB_FAULT);
  if (fault && !strcmp(fault, "candidates")) o.candidate_hook = bad_candidate;
  nf_search_result res;
  memset(&res, 0, sizeof res);
  int rc = nf_search_run(J->g, &o, &res, &err);
  if (rc == NF_EIO && J->cuda_sm) {
    /* no GPU to measure on here (no driver, no device): the default
     * kernel is the final answer, unmeasured, so the key stays untuned
     * and a daemon that has a GPU later tunes it */
    fprintf(stderr, "neoflowd --job: GPU tuning unavailable, keeping the default kernel: %s\n",
            nf_buf_str(&err));
    nf_buf_reset(&err);
    nf_schedule *s = NULL;
    nf_buf text = NF_BUF_INIT;
    rc = default_schedule(J, &s);
    if (rc == NF_OK) nf_schedule_print(s, &text);
    if (rc == NF_OK)
      rc = emit_schedule(J, NEOFLOW__TIER__TIER_DEFAULT, nf_buf_str(&text), 0, 0, 0, 1, &err);
    if (rc != NF_OK)
      emit_error(J, code_of(rc), "compile: %s", err.len ? nf_buf_str(&err) : nf_strerror(rc));
    nf_schedule_free(s);
    nf_buf_free(&text);
  } else if (rc != NF_OK) {
    emit_error(J, code_of(rc), "tune: %s", err.len ? nf_buf_str(&err) : nf_strerror(rc));
  } else if (res.best_ms <= 0 || !res.best_schedule) {
    /* why, in the default's words (the first record): the daemon
     * remembers this message with the key */
    const nf_search_record *d = res.n_records ? &res.records[0] : NULL;
    emit_error(J, NEOFLOW__ERROR_CODE__ERR_NO_VALID_CANDIDATE,
               "tune: no candidate of %d ran correctly%s%s%s%s%s", res.trials,
               res.gave_up ? " (gave up after consecutive failures)" : "",
               d ? "; the default: " : "", d ? nf_measure_status_name(d->status) : "",
               d && d->reason[0] ? ": " : "", d ? d->reason : "");
  } else {
    int better = res.default_ms > 0 && res.best_ms < res.default_ms * 0.99;
    const char *text = res.best_schedule;
    nf_buf dtext = NF_BUF_INIT;
    if (!better) {
      nf_schedule *s = NULL;
      if (default_schedule(J, &s) == NF_OK) nf_schedule_print(s, &dtext);
      nf_schedule_free(s);
      text = nf_buf_str(&dtext);
    }
    double ms = better ? res.best_ms : (res.default_ms > 0 ? res.default_ms : res.best_ms);
    rc = emit_schedule(J, better ? NEOFLOW__TIER__TIER_TUNED : NEOFLOW__TIER__TIER_DEFAULT, text,
                       ms, res.default_ms, res.trials > 0 ? res.trials : 1, 1, &err);
    if (rc != NF_OK)
      emit_error(J, NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR, "tune: the best schedule: %s",
                 nf_buf_str(&err));
    else if (better)
      publish(J, rq, text); /* after the kernel: the clients do not wait for it */
    nf_buf_free(&dtext);
  }
  if (res.transferred || res.transfer_dropped || res.corpus)
    fprintf(stderr, "neoflowd --job: warm start: %d transferred schedules measured, %d did not "
            "apply; the model learnt from %zu records of other subgraphs\n", res.transferred,
            res.transfer_dropped, res.corpus);
  nf_search_result_free(&res);
  free(transfer);
  free(corpus);
  free(prior);
  nf_buf_free(&err);
}

/* Fault injection for the daemon's tests (S-14: a compiler that hangs or
 * crashes, a job that writes garbage or dies silently): NF_JOB_FAULT in
 * the daemon's environment, inherited by its job processes. */
static void inject_fault(void) {
  const char *f = nf_env(NF_ENV_JOB_FAULT);
  if (!f) return;
  if (!strcmp(f, "hang"))
    for (;;) pause();
  if (!strcmp(f, "crash")) abort();
  if (!strcmp(f, "exit")) _exit(3);
  if (!strcmp(f, "garbage")) {
    static const uint8_t junk[] = {0, 0, 0, 12, 0xff, 0xfe, 0xfd, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    if (write(1, junk, sizeof junk) < 0) _exit(4);
    pause();
  }
}

int nfd_job_main(void) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  signal(SIGPIPE, SIG_IGN);
  struct rlimit core = {0, 0};
  setrlimit(RLIMIT_CORE, &core);
  /* below training on the same machine (a per-user daemon shares the
   * cores with the client it serves): a first step at tier 0 must not
   * wait behind up to compile_jobs compiles.  Failure is harmless. */
  (void)setpriority(PRIO_PROCESS, 0, NFD_JOB_NICE);
  inject_fault();
  job J;
  memset(&J, 0, sizeof J);
  J.fd = 1;
  nf_buf in = NF_BUF_INIT;
  int rc = nf_wire_read_frame(0, NF_WIRE_JOB_FRAME_MAX, 30000, &in);
  if (rc != NF_OK) {
    fprintf(stderr, "neoflowd --job: no request on stdin: %s\n", nf_strerror(rc));
    nf_buf_free(&in);
    return 1;
  }
  nf_wire_err e;
  Neoflow__JobRequest *rq = nf_wire_decode_job_request((const uint8_t *)in.data, in.len, &e);
  nf_buf_free(&in);
  if (!rq) {
    emit_error(&J, e.code, "job request: %s", e.msg);
    return 0;
  }
#if !defined(__SANITIZE_ADDRESS__)
  if (rq->worker_memory_mb > 0) {
    struct rlimit as = {(rlim_t)rq->worker_memory_mb << 20, (rlim_t)rq->worker_memory_mb << 20};
    setrlimit(RLIMIT_AS, &as);
  }
#endif
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_buf err = NF_BUF_INIT;
  rc = ctx ? nf_wire_graph_to_ir(rq->graph, ctx, &g, &err) : NF_ENOMEM;
  if (rc != NF_OK) {
    emit_error(&J, NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH, "job graph: %s", nf_buf_str(&err));
  } else {
    J.g = g;
    J.cuda_sm = (int)rq->cuda_sm;
    run(&J, rq);
  }
  Neoflow__Goodbye done = NEOFLOW__GOODBYE__INIT;
  done.reason = (char *)"done";
  Neoflow__JobEvent ev = NEOFLOW__JOB_EVENT__INIT;
  ev.msg_case = NEOFLOW__JOB_EVENT__MSG_DONE;
  ev.done = &done;
  emit(&J, &ev);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_wire_free_job_request(rq);
  return J.failed_write ? 1 : 0;
}
