/* jobs.c - neoflowd's jobs: one per cache key however many clients ask
 * (single flight), run in job processes, scheduled fairly.
 *
 * A job's phases: QUEUED_COMPILE -> COMPILING (the default schedule's
 * kernel, tier 1) -> [QUEUED_TUNE -> TUNING] when a subscriber asked to
 * tune.  A job found with a tier-1 entry in the cache starts at
 * QUEUED_TUNE.  Every phase runs `neoflowd --job` (job_main.c): the
 * request goes down its stdin pipe, JobEvents come back on its stdout
 * pipe.  The event loop never compiles or runs generated code.
 *
 * Scheduling: compile jobs first (up to compile_jobs at once), then
 * tuning (up to tune_jobs).  Among compile jobs, fair share: the job whose
 * least-served subscriber has been served least goes first, then the
 * oldest.  Among tuning jobs: the largest step time reported by the
 * subscribers (StepTimes), then fair share, then age.  A tuning's budget
 * is the asked one scaled by its share of its clients' step time
 * (nfd_tune_budget), fixed when it starts; it brings what the whole
 * cache knows: a key never tuned the best schedules of similar keys
 * (their shape's signature), and every tuning other keys' recent records
 * for its cost model.  A budget larger than the asked one runs in two
 * passes: the asked budget first, the rest resumed from the first pass's
 * records once every queued subgraph has had its first pass (a first
 * pass is picked before any second): a heavy subgraph's extra trials
 * never keep the others on their fallbacks.  The first pass's kernel is
 * stored and streamed; the second's is final.
 *
 * Results: a final kernel is stored in the cache (failures there are
 * logged and the clients are served anyway), then sent to every
 * subscriber; improvements found during tuning are streamed (not cached:
 * the job's confirmed result replaces them).  Records are stored in
 * batches as they come, so a job killed half-way loses no measurement.
 * A tuning that found no correct candidate (or cannot check this graph)
 * is remembered: the key's tier-1 entry is stored again with the trials,
 * the reason and the search's check revision (nfd_entry_tuned), so that
 * no session tunes the key again until the key or the check changes; the
 * subscribers get the error and keep the tier-1 kernel they hold.
 *
 * A job whose last subscriber leaves is dropped (its process group is
 * killed), except a running tuning: it goes on detached, its records and
 * kernel stored for the next session that asks (a session ending
 * mid-search, or one that asked for a further search of a kernel slower
 * than its fallback, loses nothing), but only while no other job waits
 * for its slot; a subscriber asking for its key takes it back.  Timeouts: compile_timeout_s for a compile, max_seconds + 120 s
 * for tuning. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nf_kernel.h"
#include "nf_search.h"
#include "nf_wire_sign.h"
#include "nfd_int.h"

enum { PH_QUEUED_COMPILE = 0, PH_COMPILING, PH_QUEUED_TUNE, PH_TUNING };

#define REC_BATCH 32

struct nfd_job {
  nfd_job *prev, *next;
  nfd_server *S;
  uint8_t key[32], graph_hash[32];
  nfd_target target;
  char name[NF_WIRE_NAME_MAX + 1];
  char summary[NFD_SUMMARY_MAX]; /* what it computes (nf_graph_summary) */
  char label[NF_WIRE_NAME_MAX + NFD_SUMMARY_MAX + 16]; /* "name (summary)": the log's */
  uint8_t *graph_pb;
  size_t graph_len;
  int phase;
  int max_trials, max_seconds;
  int tune_seconds;  /* the running tuning's time budget (nfd_tune_budget) */
  nfd_shape shape;   /* how the cache finds subgraphs similar to this one */
  nfd_req *subs;
  int n_subs;
  uint64_t seq;
  double t_created, t_started;
  /* the process of the running phase */
  uv_process_t proc;
  uv_pipe_t in, out;
  int n_open;        /* handles still open */
  int running;       /* process not yet exited */
  int exit_seen;
  int64_t exit_status;
  int term_signal;
  int got_final;     /* a final kernel came for this phase */
  int from_upstream; /* its kernel came from the team's upstream daemon */
  char *published;   /* a schedule a node published (MODE_PUBLISH), measured
                        first when the job tunes; NULL: none */
  int not_kept;      /* a check of it ended with ERR_NOT_KEPT: done, not failed */
  int checking;      /* the running phase is a check (check_only): its overrun
                        stores nothing (finish_with_best is for tunings) */
  int rerun;         /* a request joined after that, while the process ended:
                        the job runs again for it */
  nfd_kernel *final_k; /* this phase's final kernel once delivered (a
                          reference): a request joining while the job
                          process exits is answered with it */
  nfd_kernel *best_k; /* the best kernel seen (a reference), final if tuning
                         overruns its budget */
  int got_error;
  int killed_why;    /* 0, or a Neoflow__ErrorCode for a kill by us */
  int orphaned;      /* subscribers gone: destroy when the process is gone */
  int detached;      /* a tuning going on with no subscriber (above) */
  int pass;          /* tuning passes started (0, 1, 2) */
  int more_trials, more_seconds; /* the budget of the second pass */
  int trials_before; /* trials of the earlier passes, counted in the kernel's */
  nfd_kernel *first_k; /* the first pass's kernel (a reference) during the
                          second: final if the second finds nothing faster
                          or fails */
  int counted_done;  /* jobs_done counts a job once, whatever its passes */
  char why[256];     /* why the phase failed, when we know better than
                        the exit status */
  nf_frame_reader rd;
  uint8_t *req_buf;  /* the JobRequest frame being written */
  uv_write_t wr;
  /* progress */
  uint32_t trial, trials_max, failures;
  uint32_t n_phase_records; /* records received in this phase */
  double best_ms, default_ms;
  /* records not yet stored */
  nf_cache_record recs[REC_BATCH];
  size_t n_recs;
  int have_tier1;
};

static void job_destroy(nfd_job *j);

/* How the log names a job: its graph's name (the client's: model, entry,
 * tensor) and what it computes. */
static const char *jname(const nfd_job *j) { return j->label; }

static double clamp_pos(double v) { return v > 0 && v < 1e12 ? v : 0; }

/* A copy of k (its binary and signature) carrying another trial count. */
static nfd_kernel *kernel_with_trials(const nfd_job *j, const nfd_kernel *k, int trials) {
  nfd_kernel *c = nfd_kernel_new(j->key, k->tier, k->schedule, k->time_ms, k->default_ms, trials,
                                 k->binary, k->len);
  if (c) memcpy(c->sig, k->sig, 64);
  return c;
}

/* During a second pass: the first pass's kernel when it is faster than k
 * (or k is NULL), as a new reference with the trials of both passes;
 * else NULL. */
static nfd_kernel *first_if_better(const nfd_job *j, const nfd_kernel *k, int trials) {
  const nfd_kernel *f = j->first_k;
  if (!f || (k && k->time_ms > 0 && !(f->time_ms > 0 && f->time_ms < k->time_ms))) return NULL;
  return kernel_with_trials(j, f, trials);
}

/* ---- subscribers ---- */

static void sub_remove(nfd_job *j, nfd_req *r) {
  for (nfd_req **p = &j->subs; *p; p = &(*p)->next_in_job)
    if (*p == r) {
      *p = r->next_in_job;
      j->n_subs--;
      break;
    }
  r->job = NULL;
  r->next_in_job = NULL;
}

static int wants_tune(const nfd_job *j) {
  for (nfd_req *r = j->subs; r; r = r->next_in_job)
    if (r->mode == NEOFLOW__MODE__MODE_TUNE || r->mode == NEOFLOW__MODE__MODE_PUBLISH) return 1;
  return 0;
}

/* Only a node's published schedule is to be checked (no client asked for
 * a tuning): the job measures it, the default and the kept kernel, and
 * nothing else. */
static int check_only(const nfd_job *j) {
  if (!j->published) return 0;
  for (nfd_req *r = j->subs; r; r = r->next_in_job)
    if (r->mode == NEOFLOW__MODE__MODE_TUNE) return 0;
  return 1;
}

static void send_progress(nfd_job *j, int state) {
  for (nfd_req *r = j->subs; r; r = r->next_in_job) {
    /* a client that does not read gets no progress: it is only news */
    if (nfd_conn_out_pending(r->conn) > (size_t)j->S->cfg.output_soft_limit / 2) continue;
    Neoflow__Progress p = NEOFLOW__PROGRESS__INIT;
    p.request_id = r->id;
    p.key.data = j->key;
    p.key.len = 32;
    p.state = state;
    p.trial = j->trial;
    p.max_trials = j->trials_max;
    p.failures = j->failures;
    p.best_ms = j->best_ms;
    p.default_ms = j->default_ms;
    Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
    m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS;
    m.progress = &p;
    nfd_conn_send(r->conn, &m);
  }
}

/* Sends an error to every subscriber and ends their requests. */
static void fail_all(nfd_job *j, int code, const char *msg) {
  while (j->subs) {
    nfd_req *r = j->subs;
    sub_remove(j, r);
    nfd_conn_error(r->conn, r->id, code, 0, "%s", msg);
    nfd_req_finish(r);
  }
}

/* ---- records ---- */

static void flush_records(nfd_job *j) {
  if (!j->n_recs) return;
  nf_cache_record *r = malloc(j->n_recs * sizeof *r);
  if (r) {
    memcpy(r, j->recs, j->n_recs * sizeof *r);
    nfd_writer_records(j->S, j->key, r, j->n_recs); /* takes them over */
  } else {
    for (size_t i = 0; i < j->n_recs; i++) {
      free(j->recs[i].schedule);
      free(j->recs[i].features);
      free(j->recs[i].reason);
    }
  }
  j->n_recs = 0;
}

static void add_record(nfd_job *j, const Neoflow__Record *r) {
  nf_cache_record *c = &j->recs[j->n_recs];
  memset(c, 0, sizeof *c);
  c->schedule = strdup(r->schedule ? r->schedule : "");
  c->reason = strdup(r->reason ? r->reason : "");
  c->features = malloc(r->features.len ? r->features.len : 1);
  if (!c->schedule || !c->reason || !c->features) {
    free(c->schedule);
    free(c->reason);
    free(c->features);
    return;
  }
  memcpy(c->features, r->features.data, r->features.len);
  c->n_features = r->features.len;
  c->status = r->status;
  c->time_ms = r->time_ms;
  if (++j->n_recs == REC_BATCH) flush_records(j);
}

int nfd_entry_tuned(const nf_cache_entry *e) {
  if (e->tier >= 2) return 1;
  if (e->trials <= 0) return 0;
  /* a failure to tune stands while the check that judged it does */
  return !(e->tune_error && *e->tune_error) || e->tune_check == NF_SEARCH_CHECK_REVISION;
}

/* The key's entry as the cache holds it, or as it waits in the writer's
 * queue.  NF_OK with *e (caller frees), else NF_ENOENT. */
static int job_entry(nfd_job *j, nf_cache_entry *e) {
  nfd_server *S = j->S;
  memset(e, 0, sizeof *e);
  nf_buf err = NF_BUF_INIT;
  int hit = S->cache ? nf_cache_get(S->cache, j->key, e, &err) : NF_ENOENT;
  if (hit != NF_OK) hit = nfd_writer_lookup(S, j->key, e);
  nf_buf_free(&err);
  return hit == NF_OK ? NF_OK : NF_ENOENT;
}

/* Tuning found no correct candidate (or cannot check the graph): the
 * key's tier-1 entry is stored again as tuned, with why, so that the key
 * is not tuned again by every session (nfd_entry_tuned). */
static void remember_failure(nfd_job *j, const char *why) {
  nfd_server *S = j->S;
  nf_cache_entry e;
  if (job_entry(j, &e) != NF_OK) return; /* nothing to keep: a later request compiles and tunes */
  if (e.tier == 1 && !(e.time_ms > 0)) {
    char *msg = strdup(why);
    if (msg) {
      free(e.tune_error);
      e.tune_error = msg;
      e.tune_check = NF_SEARCH_CHECK_REVISION;
      e.trials = j->n_phase_records > 1 ? (int)j->n_phase_records - 1 : 1;
      nfd_writer_put(S, &e);
      NFD_INFO("job %s: remembered as not tunable until the code generator or the check "
               "changes (%d trials)", jname(j), e.trials);
    }
  }
  nf_cache_entry_free(&e);
}

/* ---- events from the job process ---- */

static void deliver(nfd_job *j, nfd_kernel *k, int final);

static void on_kernel(nfd_job *j, const Neoflow__JobKernel *jk) {
  int tier = jk->tier == NEOFLOW__TIER__TIER_TUNED ? 2 : 1;
  if (jk->from_upstream) {
    j->S->upstream_kernels++;
    j->from_upstream = 1;
    NFD_INFO("job %s: kernel from the upstream %s (tier %d%s): not compiled here",
             jname(j), j->S->cfg.upstream_address, tier,
             jk->trials ? ", tuned there" : "");
  }
  int trials = (int)jk->trials + (j->phase == PH_TUNING ? j->trials_before : 0);
  nfd_kernel *k = nfd_kernel_new(j->key, tier, jk->schedule, clamp_pos(jk->time_ms),
                                 clamp_pos(jk->default_ms), trials, jk->binary.data,
                                 jk->binary.len);
  if (!k) return;
  nfd_kernel_sign(j->S, k, j->target.fingerprint);
  if (jk->final && j->phase == PH_TUNING) {
    nfd_kernel *f = first_if_better(j, k, trials);
    if (f) { /* the second pass found nothing faster than the first's */
      nfd_kernel_unref(k);
      k = f;
    }
    if (j->best_k) nfd_kernel_unref(j->best_k);
    j->best_k = NULL;
  } else if (!j->best_k || (k->time_ms > 0 && (j->best_k->time_ms <= 0 ||
                                               k->time_ms < j->best_k->time_ms))) {
    if (j->best_k) nfd_kernel_unref(j->best_k);
    nfd_kernel_ref(k);
    j->best_k = k;
  }
  deliver(j, k, jk->final != 0);
  nfd_kernel_unref(k);
}

/* Tuning overran its budget (killed): the best kernel seen, or the
 * cached default, becomes the final answer, stored as tuned so that the
 * key is not tuned again (a key is tuned once).  0 when there is none. */
static int finish_with_best(nfd_job *j) {
  nfd_server *S = j->S;
  nfd_kernel *k = j->best_k;
  j->best_k = NULL;
  nfd_kernel *f = first_if_better(j, k, j->trials_before + (int)j->trial);
  if (f) {
    if (k) nfd_kernel_unref(k);
    k = f;
  }
  if (!k) {
    nf_cache_entry e;
    if (job_entry(j, &e) != NF_OK) return 0;
    /* only what this daemon signed is ever served (docs/security.md) */
    if (!nfd_entry_signed(S, &e, j->key, j->target.fingerprint)) {
      nf_cache_entry_free(&e);
      return 0;
    }
    k = nfd_kernel_new(j->key, e.tier, e.schedule, e.time_ms, e.default_ms, e.trials, e.binary,
                       e.binary_len);
    if (k) memcpy(k->sig, e.sig.sig, 64);
    nf_cache_entry_free(&e);
    if (!k) return 0;
  }
  if (k->trials < 1) k->trials = j->trial > 0 ? (int)j->trial : 1;
  if (k->trials < j->trials_before + (int)j->trial) k->trials = j->trials_before + (int)j->trial;
  deliver(j, k, 1);
  nfd_kernel_unref(k);
  return 1;
}

/* Sends k to the subscribers (final: stores it and ends the requests
 * that it answers). */
static void deliver(nfd_job *j, nfd_kernel *k, int final) {
  nfd_server *S = j->S;
  int tier = k->tier;
  /* a first pass's kernel is stored, and streamed as not final: the
   * second pass follows */
  int more = j->phase == PH_TUNING && j->more_trials > 0;
  if (final) {
    j->got_final = 1;
    if (j->final_k) nfd_kernel_unref(j->final_k);
    nfd_kernel_ref(k);
    j->final_k = k;
    if (!j->counted_done) S->jobs_done++;
    j->counted_done = 1;
    flush_records(j);
    if (j->published && j->phase == PH_TUNING && !more) {
      int kept = k->schedule && !strcmp(k->schedule, j->published);
      if (kept) S->published_kept++;
      NFD_INFO("job %s: the schedule a node published %s (%.4g ms here, the default %.4g ms)",
               jname(j),
               kept ? "is kept: the fastest here" : "was not the fastest here: not kept",
               k->time_ms, k->default_ms);
    }
    {
      nf_cache_entry e;
      memset(&e, 0, sizeof e);
      memcpy(e.key, j->key, 32);
      memcpy(e.graph_hash, j->graph_hash, 32);
      memcpy(e.target, j->target.fingerprint, 32);
      e.codegen = j->target.codegen;
      e.graph_name = j->name;
      e.target_desc = j->target.description;
      e.tier = tier;
      e.schedule = k->schedule;
      e.time_ms = k->time_ms;
      e.default_ms = k->default_ms;
      e.trials = k->trials;
      e.binary = k->binary;
      e.binary_len = k->len;
      memcpy(e.sha256, k->sha256, 32);
      e.has_sig = 1;
      memcpy(e.sig.signer, S->sign_pk, 32);
      memcpy(e.sig.sig, k->sig, 64);
      nfd_writer_put(S, &e); /* stored by the writer thread */
    }
  }
  if (k->time_ms > 0 && (j->best_ms <= 0 || k->time_ms < j->best_ms)) j->best_ms = k->time_ms;
  nfd_req *next;
  for (nfd_req *r = j->subs; r; r = next) {
    next = r->next_in_job;
    /* (a kernel the upstream tuned answers a tuning request at once) */
    int last = final && ((j->phase == PH_TUNING && !more) || r->mode == NEOFLOW__MODE__MODE_COMPILE ||
                         (j->from_upstream && k->trials > 0));
    if (!final && r->got_tier == 2 && r->got_ms > 0 && r->got_ms <= k->time_ms) continue;
    r->got_tier = tier;
    r->got_ms = k->time_ms;
    nfd_conn *c = r->conn;
    if (last) {
      sub_remove(j, r);
      nfd_conn_send_kernel(c, r->id, k, 1);
      nfd_req_finish(r);
    } else {
      nfd_conn_send_kernel(c, r->id, k, 0);
    }
  }
}

static void on_event(nfd_job *j, const Neoflow__JobEvent *ev) {
  switch (ev->msg_case) {
    case NEOFLOW__JOB_EVENT__MSG_KERNEL: on_kernel(j, ev->kernel); break;
    case NEOFLOW__JOB_EVENT__MSG_PROGRESS:
      j->trial = ev->progress->trial;
      j->trials_max = ev->progress->max_trials;
      j->failures = ev->progress->failures;
      j->best_ms = clamp_pos(ev->progress->best_ms);
      j->default_ms = clamp_pos(ev->progress->default_ms);
      send_progress(j, j->phase == PH_TUNING ? NEOFLOW__JOB_STATE__JOB_TUNING
                                             : NEOFLOW__JOB_STATE__JOB_COMPILING);
      break;
    case NEOFLOW__JOB_EVENT__MSG_RECORD:
      j->n_phase_records++;
      add_record(j, ev->record);
      break;
    case NEOFLOW__JOB_EVENT__MSG_ERROR:
      if (j->phase == PH_TUNING && j->first_k) {
        /* the second pass failed: the first's kernel is the answer */
        nfd_kernel *f = first_if_better(j, NULL, j->trials_before + (int)j->trial);
        NFD_WARN("job %s: its second pass failed (%s): the first pass's kernel is final",
                 jname(j), ev->error->message);
        if (f) {
          deliver(j, f, 1);
          nfd_kernel_unref(f);
          break;
        }
      }
      j->got_error = 1;
      if (ev->error->code == NEOFLOW__ERROR_CODE__ERR_NOT_KEPT) {
        /* a check of a published schedule that lost: what is kept stays.
         * The publishers get the verdict; a client that asked for a
         * tuning meanwhile gets one (the job runs again for it) */
        j->not_kept = 1;
        NFD_INFO("job %s: %s", jname(j), ev->error->message);
        nfd_req *next;
        for (nfd_req *r = j->subs; r; r = next) {
          next = r->next_in_job;
          if (r->mode != NEOFLOW__MODE__MODE_PUBLISH) continue;
          sub_remove(j, r);
          nfd_conn_error(r->conn, r->id, NEOFLOW__ERROR_CODE__ERR_NOT_KEPT, 0, "%s",
                         ev->error->message);
          nfd_req_finish(r);
        }
        if (j->subs) {
          j->rerun = 1;
          free(j->published);
          j->published = NULL;
        }
        break;
      }
      NFD_WARN("job %s: %s", jname(j), ev->error->message);
      /* what does not change until the key or the check does */
      if (j->phase == PH_TUNING &&
          (ev->error->code == NEOFLOW__ERROR_CODE__ERR_NO_VALID_CANDIDATE ||
           ev->error->code == NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH))
        remember_failure(j, ev->error->message);
      fail_all(j, ev->error->code ? (int)ev->error->code : NEOFLOW__ERROR_CODE__ERR_INTERNAL,
               ev->error->message);
      break;
    case NEOFLOW__JOB_EVENT__MSG_PUBLISHED:
      j->S->upstream_published++;
      if (ev->published->kept)
        NFD_INFO("job %s: its tuned schedule, published to the upstream %s, is kept there "
                 "(%.4g ms on its machine)", jname(j),
                 j->S->cfg.upstream_address, ev->published->time_ms);
      else
        NFD_INFO("job %s: its tuned schedule, published to the upstream %s, is not kept there: "
                 "what it keeps is as fast or faster on its machine",
                 jname(j), j->S->cfg.upstream_address);
      break;
    case NEOFLOW__JOB_EVENT__MSG_DONE: break;
    default: break;
  }
}

/* ---- the process ---- */

static void kill_job(nfd_job *j, int why) {
  if (!j->running) return;
  if (!j->killed_why) j->killed_why = why ? why : -1;
  /* the job process leads its own process group (UV_PROCESS_DETACHED) */
  kill(-j->proc.pid, SIGKILL);
  kill(j->proc.pid, SIGKILL);
}

/* Called when every handle of the phase is closed: decide what next. */
static void phase_over(nfd_job *j) {
  nfd_server *S = j->S;
  nf_frame_reader_free(&j->rd);
  free(j->req_buf);
  j->req_buf = NULL;
  flush_records(j);
  if (j->phase == PH_COMPILING) S->n_running_compile--;
  else S->n_running_tune--;
  if (!j->got_final && !j->got_error && j->phase == PH_TUNING &&
      j->killed_why == NEOFLOW__ERROR_CODE__ERR_TIMEOUT && !j->checking && finish_with_best(j))
    NFD_WARN("job %s: tuning overran its time budget: the best kernel so far is final",
             jname(j));
  if (!j->got_final && !j->got_error && j->phase == PH_TUNING && j->first_k) {
    nfd_kernel *f = first_if_better(j, NULL, j->trials_before + (int)j->trial);
    if (f) {
      NFD_WARN("job %s: its second pass ended without a result: the first pass's kernel is final",
               jname(j));
      deliver(j, f, 1);
      nfd_kernel_unref(f);
    }
  }
  int ok = j->got_final;
  if (!ok && !j->got_error && j->subs) {
    char msg[256];
    if (j->why[0])
      snprintf(msg, sizeof msg, "%s", j->why);
    else if (j->killed_why == NEOFLOW__ERROR_CODE__ERR_COMPILE_TIMEOUT)
      snprintf(msg, sizeof msg, "compiling took longer than %d s (compile_timeout_s)",
               S->cfg.compile_timeout_s);
    else if (j->killed_why == NEOFLOW__ERROR_CODE__ERR_TIMEOUT)
      snprintf(msg, sizeof msg, "tuning overran its time budget");
    else if (j->killed_why == NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN)
      snprintf(msg, sizeof msg, "the daemon is shutting down");
    else if (j->term_signal)
      snprintf(msg, sizeof msg, "the job process was killed by signal %d", j->term_signal);
    else
      snprintf(msg, sizeof msg, "the job process exited with status %lld and no result",
               (long long)j->exit_status);
    int code = j->killed_why > 0 ? j->killed_why
               : j->phase == PH_COMPILING ? NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR
                                          : NEOFLOW__ERROR_CODE__ERR_INTERNAL;
    NFD_WARN("job %s: %s", jname(j), msg);
    fail_all(j, code, msg);
  }
  /* a job stopped because nobody waits for it (its subscribers left, or
   * a detached tuning gave its slot to another job) did not fail */
  if (!ok && (j->orphaned || (j->detached && j->killed_why == NEOFLOW__ERROR_CODE__ERR_BUSY)))
    S->jobs_cancelled++;
  else if (!ok && j->not_kept && !j->counted_done) S->jobs_done++;
  else if (!ok) S->jobs_failed++;
  if (ok && j->phase == PH_TUNING && j->more_trials > 0 && j->subs && !S->shutting_down) {
    /* the second pass, queued behind every first one (pick) */
    j->trials_before = j->final_k ? j->final_k->trials : j->trials_before;
    j->phase = PH_QUEUED_TUNE;
    if (j->first_k) nfd_kernel_unref(j->first_k);
    j->first_k = j->final_k; /* kept: the answer if the second pass does worse */
    j->final_k = NULL;
    j->why[0] = 0;
    j->got_final = j->got_error = j->killed_why = 0;
    j->running = j->exit_seen = 0;
    j->trial = j->failures = j->n_phase_records = 0;
    send_progress(j, NEOFLOW__JOB_STATE__JOB_QUEUED);
  } else if (j->rerun && j->subs && !S->shutting_down) {
    /* a first pass of its own (not the lost check's second) */
    j->phase = PH_QUEUED_TUNE;
    j->rerun = j->not_kept = 0;
    j->pass = j->more_trials = j->more_seconds = j->trials_before = 0;
    if (j->best_k) nfd_kernel_unref(j->best_k);
    if (j->first_k) nfd_kernel_unref(j->first_k);
    j->best_k = j->first_k = NULL;
    j->why[0] = 0;
    j->got_final = j->got_error = j->killed_why = 0;
    j->counted_done = 0;
    j->running = j->exit_seen = 0;
    j->trial = j->failures = j->n_phase_records = 0;
    send_progress(j, NEOFLOW__JOB_STATE__JOB_QUEUED);
  } else if (ok && j->phase == PH_COMPILING && j->subs && wants_tune(j) && !S->shutting_down &&
             !(j->from_upstream && j->final_k && j->final_k->trials > 0)) {
    j->phase = PH_QUEUED_TUNE;
    if (j->final_k) nfd_kernel_unref(j->final_k);
    j->final_k = NULL;
    j->why[0] = 0;
    j->got_final = j->got_error = j->killed_why = 0;
    j->counted_done = 0; /* the compile and the tuning count apart */
    j->running = j->exit_seen = 0;
    j->trial = j->failures = j->n_phase_records = 0;
    send_progress(j, NEOFLOW__JOB_STATE__JOB_QUEUED);
  } else {
    /* requests still subscribed got what the phase gave; end them */
    fail_all(j, S->shutting_down ? NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN : NEOFLOW__ERROR_CODE__ERR_INTERNAL,
             S->shutting_down ? "the daemon is shutting down" : "the job ended without a result");
    job_destroy(j);
  }
  nfd_jobs_schedule(S);
}

static void on_handle_closed(uv_handle_t *h) {
  nfd_job *j = h->data;
  if (--j->n_open == 0) phase_over(j);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig) {
  nfd_job *j = p->data;
  j->running = 0;
  j->exit_seen = 1;
  j->exit_status = status;
  j->term_signal = sig;
  uv_close((uv_handle_t *)p, on_handle_closed);
}

static void on_job_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  static char jbuf[256 * 1024];
  (void)suggested;
  *buf = uv_buf_init(jbuf, sizeof jbuf);
}

static void on_job_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  nfd_job *j = st->data;
  if (nread < 0) {
    uv_read_stop(st);
    if (!uv_is_closing((uv_handle_t *)st)) uv_close((uv_handle_t *)st, on_handle_closed);
    return;
  }
  const uint8_t *p = (const uint8_t *)buf->base;
  size_t n = (size_t)nread;
  while (n > 0) {
    size_t used = 0, flen = 0;
    const uint8_t *frame = NULL;
    int rc = nf_frame_reader_feed(&j->rd, p, n, &used, &frame, &flen);
    p += used;
    n -= used;
    if (rc == 1) {
      nf_wire_err e;
      Neoflow__JobEvent *ev = nf_wire_decode_job_event(frame, flen, &e);
      if (!ev) {
        NFD_ERROR("job process sent a bad event: %s", e.msg);
        snprintf(j->why, sizeof j->why, "the job process sent a malformed event (%.200s)", e.msg);
        kill_job(j, NEOFLOW__ERROR_CODE__ERR_INTERNAL);
        return;
      }
      on_event(j, ev);
      nf_wire_free_job_event(ev);
    } else if (rc < 0) {
      NFD_ERROR("job process sent an oversized frame");
      snprintf(j->why, sizeof j->why, "the job process sent an oversized frame");
      kill_job(j, NEOFLOW__ERROR_CODE__ERR_INTERNAL);
      return;
    }
  }
}

static void on_req_written(uv_write_t *w, int status) {
  nfd_job *j = w->data;
  (void)status;
  free(j->req_buf);
  j->req_buf = NULL;
  if (!uv_is_closing((uv_handle_t *)&j->in)) uv_close((uv_handle_t *)&j->in, on_handle_closed);
}

/* Records of earlier runs, for a tuning job (best first, at most 2000). */
static void add_prior(nfd_job *j, Neoflow__JobRequest *rq, nf_cache_record **recs, size_t *n) {
  *recs = NULL;
  *n = 0;
  if (!j->S->cache) return;
  nf_buf err = NF_BUF_INIT;
  if (nf_cache_get_records(j->S->cache, j->key, 2000, recs, n, &err) != NF_OK) {
    NFD_WARN("cache: no prior records: %s", nf_buf_str(&err));
    *n = 0;
  }
  nf_buf_free(&err);
  if (!*n) return;
  Neoflow__Record *r = calloc(*n, sizeof *r);
  Neoflow__Record **rp = calloc(*n, sizeof *rp);
  if (!r || !rp) {
    free(r);
    free(rp);
    return;
  }
  for (size_t i = 0; i < *n; i++) {
    neoflow__record__init(&r[i]);
    r[i].schedule = (*recs)[i].schedule;
    r[i].status = (*recs)[i].status;
    r[i].time_ms = (*recs)[i].time_ms;
    r[i].features.data = (*recs)[i].features;
    r[i].features.len = (*recs)[i].n_features;
    r[i].reason = (*recs)[i].reason ? (*recs)[i].reason : (char *)"";
    rp[i] = &r[i];
  }
  rq->prior = rp;
  rq->n_prior = *n;
}

/* Appends recs (schedules: transfer; features, time and group: corpus)
 * to a JobRequest list: *list and *n set, the array in *arr (freed by the
 * caller with free(*arr) and free(*list)). */
static int records_to_wire(const nf_cache_record *recs, size_t n, Neoflow__Record ***list,
                           size_t *count, Neoflow__Record **arr) {
  *list = NULL;
  *count = 0;
  *arr = NULL;
  if (!n) return NF_OK;
  Neoflow__Record *r = calloc(n, sizeof *r);
  Neoflow__Record **rp = calloc(n, sizeof *rp);
  if (!r || !rp) {
    free(r);
    free(rp);
    return NF_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    neoflow__record__init(&r[i]);
    r[i].schedule = recs[i].schedule ? recs[i].schedule : (char *)"";
    r[i].status = recs[i].status;
    r[i].time_ms = recs[i].time_ms;
    r[i].features.data = recs[i].features;
    r[i].features.len = recs[i].features ? recs[i].n_features : 0;
    r[i].reason = (char *)"";
    r[i].group = recs[i].group;
    rp[i] = &r[i];
  }
  *list = rp;
  *count = n;
  *arr = r;
  return NF_OK;
}

typedef struct near_key {
  const nf_cache_similar *s;
  double dist;
} near_key;

static int cmp_near(const void *a, const void *b) {
  const near_key *x = a, *y = b;
  if (x->dist != y->dist) return x->dist < y->dist ? -1 : 1;
  return memcmp(x->s->key, y->s->key, 32);
}

#define NEAR_KEYS 4 /* similar subgraphs a never-tuned one starts from */

/* A key never tuned: the best schedules of the NEAR_KEYS subgraphs of its
 * signature nearest to it (L1 distance of the log2 extents), taken in
 * turn (the nearest's best first), at most similar_records. */
static void find_transfer(nfd_job *j, nf_cache_record **out, size_t *n_out, int *n_keys) {
  nfd_server *S = j->S;
  *out = NULL;
  *n_out = 0;
  *n_keys = 0;
  size_t want = (size_t)S->cfg.similar_records;
  if (!S->cache || !j->shape.ok || !want) return;
  nf_buf err = NF_BUF_INIT;
  nf_cache_similar *sim = NULL;
  size_t n_sim = 0;
  if (nf_cache_find_similar(S->cache, j->shape.sig, j->target.fingerprint, j->target.codegen,
                            j->key, 256, &sim, &n_sim, &err) != NF_OK)
    NFD_WARN("cache: no similar subgraphs: %s", nf_buf_str(&err));
  near_key nk[256];
  size_t nn = 0;
  for (size_t i = 0; i < n_sim && nn < 256; i++) {
    if (sim[i].n_desc != j->shape.n_desc) continue;
    double d = 0;
    for (size_t q = 0; q < sim[i].n_desc; q++) d += fabs((double)sim[i].desc[q] - j->shape.desc[q]);
    nk[nn].s = &sim[i];
    nk[nn++].dist = d;
  }
  qsort(nk, nn, sizeof *nk, cmp_near);
  if (nn > NEAR_KEYS) nn = NEAR_KEYS;
  nf_cache_record *per[NEAR_KEYS] = {0};
  size_t n_per[NEAR_KEYS] = {0};
  for (size_t k = 0; k < nn; k++) {
    nf_buf_reset(&err);
    if (nf_cache_get_records(S->cache, nk[k].s->key, want, &per[k], &n_per[k], &err) != NF_OK)
      n_per[k] = 0;
    /* best first: the successful ones lead */
    size_t ok = 0;
    while (ok < n_per[k] && per[k][ok].status == 0 && per[k][ok].time_ms > 0) ok++;
    for (size_t q = ok; q < n_per[k]; q++) {
      free(per[k][q].schedule);
      free(per[k][q].features);
      free(per[k][q].reason);
    }
    n_per[k] = ok;
    *n_keys += ok > 0;
  }
  nf_cache_record *v = calloc(want, sizeof *v);
  size_t n = 0;
  for (size_t rank = 0; v && n < want; rank++) {
    int any = 0;
    for (size_t k = 0; k < nn && n < want; k++)
      if (rank < n_per[k]) {
        v[n++] = per[k][rank];
        memset(&per[k][rank], 0, sizeof per[k][rank]); /* taken over */
        any = 1;
      }
    if (!any) break;
  }
  for (size_t k = 0; k < nn; k++) nf_cache_records_free(per[k], n_per[k]);
  free(sim);
  nf_buf_free(&err);
  if (!n) {
    free(v);
    *n_keys = 0;
    return;
  }
  *out = v;
  *n_out = n;
}

/* What a tuning job brings from the whole cache: for a key never tuned,
 * similar subgraphs' best schedules (transfer); and every subgraph's
 * recent records for the cost model (corpus).  Logged with the time the
 * queries took. */
static void add_shared(nfd_job *j, Neoflow__JobRequest *rq, nf_cache_record **tr, size_t *n_tr,
                       nf_cache_record **co, size_t *n_co, Neoflow__Record **arr_tr,
                       Neoflow__Record **arr_co) {
  nfd_server *S = j->S;
  double t0 = nfd_now();
  int n_keys = 0;
  *tr = *co = NULL;
  *n_tr = *n_co = 0;
  if (rq->n_prior == 0) find_transfer(j, tr, n_tr, &n_keys);
  if (S->cache && S->cfg.model_records > 0) {
    nf_buf err = NF_BUF_INIT;
    if (nf_cache_get_corpus(S->cache, j->target.fingerprint, j->target.codegen, j->key,
                            (size_t)S->cfg.model_records, co, n_co, &err) != NF_OK) {
      NFD_WARN("cache: no records of other subgraphs for the model: %s", nf_buf_str(&err));
      *n_co = 0;
    }
    nf_buf_free(&err);
  }
  if (records_to_wire(*tr, *n_tr, &rq->transfer, &rq->n_transfer, arr_tr) != NF_OK ||
      records_to_wire(*co, *n_co, &rq->corpus, &rq->n_corpus, arr_co) != NF_OK) {
    free(*arr_tr);
    free(rq->transfer);
    rq->transfer = NULL;
    rq->n_transfer = 0;
    *arr_tr = NULL;
    *arr_co = NULL;
  }
  uint32_t groups = 0;
  for (size_t i = 0; i < *n_co; i++)
    if ((*co)[i].group + 1 > groups) groups = (*co)[i].group + 1;
  if (*n_tr || *n_co)
    NFD_INFO("job %s: starts from %zu schedules of %d similar subgraphs; the model learns from "
             "%zu records of %u other subgraphs (%.1f ms)",
             jname(j), *n_tr, n_keys, *n_co, groups,
             (nfd_now() - t0) * 1000);
}

/* The weight of a job's share of its clients' step time: the largest of
 * its subscribers' (0: none reported). */
static double share_weight(const nfd_job *j) {
  double w = 0;
  for (nfd_req *r = j->subs; r; r = r->next_in_job)
    if (r->step_weight > w) w = r->step_weight;
  return w;
}

static int start_job(nfd_job *j) {
  nfd_server *S = j->S;
  int tune = j->phase == PH_QUEUED_TUNE;
  Neoflow__Graph *g = neoflow__graph__unpack(NULL, j->graph_len, j->graph_pb);
  if (!g) return NF_ENOMEM;
  Neoflow__JobRequest rq = NEOFLOW__JOB_REQUEST__INIT;
  rq.graph = g;
  rq.mode = tune ? NEOFLOW__MODE__MODE_TUNE : NEOFLOW__MODE__MODE_COMPILE;
  int trials = j->max_trials, seconds = j->max_seconds;
  if (tune && j->pass > 0) {
    /* the second pass: the rest of the budget, from the records so far */
    trials = j->more_trials;
    seconds = j->more_seconds;
    j->more_trials = j->more_seconds = 0;
    NFD_INFO("job %s: tuning resumes for the rest of its budget, %d trials, %d s (%d trials "
             "so far; every queued subgraph has had its first pass)",
             jname(j), trials, seconds, j->trials_before);
  } else if (tune) {
    double w = share_weight(j);
    nfd_tune_budget(&S->cfg, w, j->max_trials, j->max_seconds, &trials, &seconds);
    if (w > 0 && S->cfg.share_budget)
      NFD_INFO("job %s: tuning budget %d trials, %d s (its step time is %.2f x its client's mean "
               "subgraph's; asked %d trials, %d s)%s", jname(j), trials,
               seconds, w, j->max_trials, j->max_seconds,
               trials > j->max_trials ? ": the asked budget first, the rest in a second pass" : "");
    if (trials > j->max_trials) {
      /* split in proportion: the asked trials now with their share of
       * the seconds, the rest after the other subgraphs' first passes */
      int first_s = (int)((double)seconds * j->max_trials / trials + 0.5);
      if (first_s < 1) first_s = 1;
      if (first_s > seconds) first_s = seconds;
      j->more_trials = trials - j->max_trials;
      j->more_seconds = seconds - first_s > 1 ? seconds - first_s : 1;
      trials = j->max_trials;
      seconds = first_s;
    }
    /* the shape, for the subgraphs tuned after this one */
    nfd_writer_shape(S, j->key, &j->shape);
  }
  if (tune) {
    j->pass++;
    j->tune_seconds = seconds;
    j->trials_max = (uint32_t)trials; /* status shows the budget from the start */
  }
  rq.max_trials = (uint32_t)trials;
  rq.max_seconds = (uint32_t)seconds;
  rq.seed = 1;
  rq.measure_timeout_ms = (uint32_t)S->cfg.measure_timeout_ms;
  rq.worker_memory_mb = (uint64_t)S->cfg.worker_memory_mb;
  /* kernels are tuned for the thread count clients run them with: all
   * of this machine's cores */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  rq.threads = ncpu > 0 ? (uint32_t)ncpu : 1;
  rq.cuda_sm = (uint32_t)j->target.cuda_sm;
  rq.cuda_name = j->target.cuda_name;
  /* a compile asks the team's upstream first (for this CPU or a GPU); a
   * CPU tuning publishes its result there (not a check of what a node published:
   * a schedule goes one level up, so that two daemons naming each other
   * never send one back and forth) */
  int check = tune && check_only(j);
  /* (the last pass publishes, none followed by a second: the upstream
   * keeps the faster of what it had and this) */
  int publish = tune && !check && S->cfg.upstream_publish && !j->target.cuda_sm &&
                j->more_trials == 0;
  j->checking = check;
  if ((!tune || publish) && S->cfg.upstream_address[0]) {
    rq.upstream_address = S->cfg.upstream_address;
    rq.upstream_key_file = S->cfg.upstream_key_file;
    rq.upstream_public_key = S->cfg.upstream_public_key;
    rq.upstream_timeout_ms = (uint32_t)S->cfg.upstream_timeout_ms;
    rq.upstream_publish = publish;
  }
  nf_cache_record *prior = NULL, *tr = NULL, *co = NULL;
  size_t n_prior = 0, n_tr = 0, n_co = 0;
  Neoflow__Record *arr_tr = NULL, *arr_co = NULL;
  if (tune && !check) add_prior(j, &rq, &prior, &n_prior);
  if (tune && !check) add_shared(j, &rq, &tr, &n_tr, &co, &n_co, &arr_tr, &arr_co);
  /* a published schedule is measured first: a check (rq.published)
   * against the default and the key's tuned schedule, which it must beat
   * to be kept; a tuning a client asked for starts from it */
  Neoflow__Record **own_transfer = rq.transfer, **xlist = NULL, xf;
  char *kept = NULL;
  if (check) {
    rq.published = j->published;
    nf_cache_entry e;
    if (job_entry(j, &e) == NF_OK) {
      if (nfd_entry_tuned(&e) && e.schedule) kept = strdup(e.schedule);
      nf_cache_entry_free(&e);
    }
  }
  if (kept || (tune && j->published && !check)) {
    size_t n = 1 + rq.n_transfer;
    if (n > NF_WIRE_MAX_TRANSFER) n = NF_WIRE_MAX_TRANSFER;
    xlist = calloc(n, sizeof *xlist);
    if (xlist) {
      neoflow__record__init(&xf);
      xf.schedule = kept ? kept : j->published;
      xlist[0] = &xf;
      for (size_t i = 0, k = 1; k < n; i++) xlist[k++] = rq.transfer[i];
      rq.transfer = xlist;
      rq.n_transfer = n;
    }
  }
  nf_buf b = NF_BUF_INIT;
  int rc = nf_wire_pack(&rq.base, NF_WIRE_JOB_FRAME_MAX, &b);
  free(xlist);
  free(kept);
  rq.transfer = own_transfer;
  if (rq.n_prior) {
    free(rq.prior[0]);
    free(rq.prior);
  }
  free(arr_tr);
  free(rq.transfer);
  free(arr_co);
  free(rq.corpus);
  nf_cache_records_free(prior, n_prior);
  nf_cache_records_free(tr, n_tr);
  nf_cache_records_free(co, n_co);
  neoflow__graph__free_unpacked(g, NULL);
  if (rc != NF_OK) {
    nf_buf_free(&b);
    return rc;
  }
  j->req_buf = (uint8_t *)b.data; /* taken over from the buffer */
  size_t req_len = b.len;

  uv_pipe_init(S->loop, &j->in, 0);
  uv_pipe_init(S->loop, &j->out, 0);
  j->in.data = j->out.data = j->proc.data = j;
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
  stdio[0].data.stream = (uv_stream_t *)&j->in;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&j->out;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  char *args[] = {S->exe_path, (char *)"--job", NULL};
  uv_process_options_t po;
  memset(&po, 0, sizeof po);
  po.file = S->exe_path;
  po.args = args;
  po.exit_cb = on_exit_cb;
  po.stdio_count = 3;
  po.stdio = stdio;
  po.flags = UV_PROCESS_DETACHED; /* its own process group, killed as one */
  rc = uv_spawn(S->loop, &j->proc, &po);
  j->phase = tune ? PH_TUNING : PH_COMPILING;
  if (tune) S->n_running_tune++;
  else S->n_running_compile++;
  if (rc != 0) {
    /* the handles were initialised: close them; phase_over reports */
    NFD_ERROR("cannot start a job process (%s): %s", S->exe_path, uv_strerror(rc));
    snprintf(j->why, sizeof j->why, "cannot start a job process: %s", uv_strerror(rc));
    j->killed_why = NEOFLOW__ERROR_CODE__ERR_INTERNAL;
    j->n_open = 3;
    uv_close((uv_handle_t *)&j->in, on_handle_closed);
    uv_close((uv_handle_t *)&j->out, on_handle_closed);
    uv_close((uv_handle_t *)&j->proc, on_handle_closed);
    return NF_OK;
  }
  j->n_open = 3;
  j->running = 1;
  j->t_started = nfd_now();
  nf_frame_reader_init(&j->rd, NF_WIRE_JOB_FRAME_MAX);
  uv_buf_t wb = uv_buf_init((char *)j->req_buf, (unsigned)req_len);
  j->wr.data = j;
  if (uv_write(&j->wr, (uv_stream_t *)&j->in, &wb, 1, on_req_written) != 0) {
    free(j->req_buf);
    j->req_buf = NULL;
    uv_close((uv_handle_t *)&j->in, on_handle_closed);
    kill_job(j, NEOFLOW__ERROR_CODE__ERR_INTERNAL);
  }
  uv_read_start((uv_stream_t *)&j->out, on_job_alloc, on_job_read);
  NFD_INFO("job %s: %s started (pid %d, %d waiting)", jname(j),
           tune ? "tuning" : "compile", j->proc.pid, j->n_subs);
  send_progress(j, tune ? NEOFLOW__JOB_STATE__JOB_TUNING : NEOFLOW__JOB_STATE__JOB_COMPILING);
  return NF_OK;
}

/* ---- the job table ---- */

static nfd_job *find_job(nfd_server *S, const uint8_t key[32]) {
  for (nfd_job *j = S->jobs; j; j = j->next)
    if (!j->orphaned && j->killed_why == 0 && memcmp(j->key, key, 32) == 0) return j;
  return NULL;
}

static void job_destroy(nfd_job *j) {
  nfd_server *S = j->S;
  free(j->published);
  if (j->final_k) nfd_kernel_unref(j->final_k);
  if (j->best_k) nfd_kernel_unref(j->best_k);
  if (j->first_k) nfd_kernel_unref(j->first_k);
  for (nfd_req *r = j->subs; r; r = r->next_in_job) r->job = NULL;
  if (j->prev) j->prev->next = j->next;
  else S->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  S->n_jobs--;
  for (size_t i = 0; i < j->n_recs; i++) {
    free(j->recs[i].schedule);
    free(j->recs[i].features);
    free(j->recs[i].reason);
  }
  free(j->graph_pb);
  free(j);
}

int nfd_job_subscribe(nfd_server *S, nfd_req *r, const uint8_t graph_hash[32],
                      const char *graph_name, const uint8_t *graph_pb, size_t graph_len,
                      const nfd_shape *shape, int have_tier1, int max_trials, int max_seconds,
                      const char *published) {
  nfd_job *j = find_job(S, r->key);
  int was_tuning = j && wants_tune(j);
  char *pub = published ? strdup(published) : NULL;
  if (published && !pub) return NF_ENOMEM;
  if (!j) {
    if (S->n_jobs >= S->cfg.max_queued_jobs) {
      free(pub);
      return NF_ELIMIT;
    }
    j = calloc(1, sizeof *j);
    if (!j) {
      free(pub);
      return NF_ENOMEM;
    }
    j->graph_pb = malloc(graph_len ? graph_len : 1);
    if (!j->graph_pb) {
      free(j);
      free(pub);
      return NF_ENOMEM;
    }
    memcpy(j->graph_pb, graph_pb, graph_len);
    j->graph_len = graph_len;
    j->S = S;
    memcpy(j->key, r->key, 32);
    j->target = r->target; /* the key covers it: every subscriber's is the same */
    memcpy(j->graph_hash, graph_hash, 32);
    snprintf(j->name, sizeof j->name, "%s", graph_name ? graph_name : "");
    snprintf(j->summary, sizeof j->summary, "%s", r->summary);
    snprintf(j->label, sizeof j->label, "%s%s%s%s", j->name[0] ? j->name : "(unnamed)",
             j->summary[0] ? " (" : "", j->summary, j->summary[0] ? ")" : "");
    j->phase = have_tier1 ? PH_QUEUED_TUNE : PH_QUEUED_COMPILE;
    j->have_tier1 = have_tier1;
    j->max_trials = max_trials;
    j->max_seconds = max_seconds;
    if (shape) j->shape = *shape;
    j->seq = ++S->job_seq;
    j->t_created = nfd_now();
    j->next = S->jobs;
    if (S->jobs) S->jobs->prev = j;
    S->jobs = j;
    S->n_jobs++;
  } else if (j->got_final && j->final_k &&
             (j->phase == PH_TUNING || r->mode == NEOFLOW__MODE__MODE_COMPILE)) {
    /* the job has given its answer and only its process is ending: that
     * answer is this request's too (joining would end "without a
     * result") */
    r->got_tier = j->final_k->tier;
    r->got_ms = j->final_k->time_ms;
    nfd_conn_send_kernel(r->conn, r->id, j->final_k, 1);
    nfd_req_finish(r);
    free(pub);
    return NF_OK;
  } else if (r->mode == NEOFLOW__MODE__MODE_TUNE || r->mode == NEOFLOW__MODE__MODE_PUBLISH) {
    if (!j->shape.ok && shape) j->shape = *shape;
    /* the largest budget asked for wins (a compile's budget is no ask) */
    if (max_trials > j->max_trials || !was_tuning) j->max_trials = max_trials;
    if (max_seconds > j->max_seconds || !was_tuning) j->max_seconds = max_seconds;
  }
  if (j->not_kept && !j->got_final) {
    /* a check that lost, its process ending: this request's is run anew */
    j->rerun = 1;
    free(j->published);
    j->published = pub;
    pub = NULL;
  }
  /* measured first when the job tunes (a running tuning answers for it) */
  if (pub && !j->published && j->phase != PH_TUNING) {
    j->published = pub;
    pub = NULL;
  }
  free(pub);
  if (j->detached) {
    j->detached = 0;
    NFD_INFO("job %s: taken back by a request for its key", jname(j));
  }
  r->job = j;
  r->next_in_job = j->subs;
  j->subs = r;
  j->n_subs++;
  Neoflow__Progress p = NEOFLOW__PROGRESS__INIT;
  p.request_id = r->id;
  p.key.data = j->key;
  p.key.len = 32;
  p.state = j->phase == PH_COMPILING ? NEOFLOW__JOB_STATE__JOB_COMPILING
            : j->phase == PH_TUNING  ? NEOFLOW__JOB_STATE__JOB_TUNING
                                     : NEOFLOW__JOB_STATE__JOB_QUEUED;
  Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
  m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS;
  m.progress = &p;
  nfd_conn_send(r->conn, &m);
  return NF_OK;
}

void nfd_job_unsubscribe(nfd_req *r) {
  nfd_job *j = r->job;
  if (!j) return;
  sub_remove(j, r);
  if (j->subs) return;
  if (j->phase == PH_QUEUED_COMPILE || j->phase == PH_QUEUED_TUNE) {
    job_destroy(j);
  } else if (j->phase == PH_TUNING && j->running && !j->killed_why && !j->S->shutting_down) {
    /* its records and kernel serve the next session: it goes on while no
     * other job waits for its slot (nfd_jobs_schedule) */
    j->detached = 1;
    j->more_trials = j->more_seconds = 0; /* no second pass for nobody */
    NFD_INFO("job %s: no one waits for it any more: its search goes on detached while no other "
             "job needs its slot", jname(j));
  } else {
    NFD_INFO("job %s: no one waits for it any more: stopped", jname(j));
    j->orphaned = 1;
    kill_job(j, NEOFLOW__ERROR_CODE__ERR_INTERNAL);
  }
}

static uint64_t min_served(const nfd_job *j, nfd_conn **who) {
  uint64_t best = UINT64_MAX;
  *who = NULL;
  for (nfd_req *r = j->subs; r; r = r->next_in_job) {
    uint64_t s = *nfd_conn_served(r->conn);
    if (s < best) {
      best = s;
      *who = r->conn;
    }
  }
  return best;
}

static double step_share(const nfd_job *j) {
  double s = 0;
  for (nfd_req *r = j->subs; r; r = r->next_in_job) s += r->step_ms;
  return s;
}

/* The next queued job of phase ph, or NULL. */
static nfd_job *pick(nfd_server *S, int ph) {
  nfd_job *best = NULL;
  uint64_t best_served = 0;
  double best_share = 0;
  for (nfd_job *j = S->jobs; j; j = j->next) {
    if (j->phase != ph || !j->subs || j->orphaned) continue;
    /* a second pass resumes from the first's records: once they are
     * stored (nfd_jobs_tick looks again) */
    if (j->pass > 0 && nfd_writer_pending(S, j->key)) continue;
    nfd_conn *who;
    uint64_t sv = min_served(j, &who);
    double sh = ph == PH_QUEUED_TUNE ? step_share(j) : 0;
    /* a first pass before any second (start_job) */
    int same = best && j->pass == best->pass;
    int better = !best || j->pass < best->pass ||
                 (same && (sh > best_share ||
                           (sh == best_share &&
                            (sv < best_served || (sv == best_served && j->seq < best->seq)))));
    if (better) {
      best = j;
      best_served = sv;
      best_share = sh;
    }
  }
  return best;
}

/* A detached tuning (nfd_job_unsubscribe) gives its slot to a job that
 * waits for one: it is stopped (its records are stored). */
static void stop_detached(nfd_server *S) {
  int waiting = 0, freeing = 0;
  for (nfd_job *j = S->jobs; j; j = j->next) {
    if (j->phase == PH_QUEUED_TUNE && j->subs && !j->orphaned) waiting++;
    /* stopped already: its slot frees when its process is gone */
    if (j->detached && j->running && j->killed_why) freeing++;
  }
  int free_slots = S->cfg.tune_jobs - S->n_running_tune + freeing;
  for (nfd_job *j = S->jobs; j && waiting > free_slots; j = j->next)
    if (j->detached && j->running && !j->killed_why) {
      NFD_INFO("job %s: detached search stopped after %u trials: another job needs its slot",
               jname(j), j->trial);
      kill_job(j, NEOFLOW__ERROR_CODE__ERR_BUSY);
      free_slots++;
    }
}

void nfd_jobs_schedule(nfd_server *S) {
  if (S->shutting_down) return;
  stop_detached(S);
  for (;;) {
    nfd_job *j = NULL;
    if (S->n_running_compile < S->cfg.compile_jobs) j = pick(S, PH_QUEUED_COMPILE);
    if (!j && S->n_running_tune < S->cfg.tune_jobs) j = pick(S, PH_QUEUED_TUNE);
    if (!j) return;
    nfd_conn *who;
    min_served(j, &who);
    if (who) (*nfd_conn_served(who))++;
    if (start_job(j) != NF_OK) {
      fail_all(j, NEOFLOW__ERROR_CODE__ERR_INTERNAL, "cannot start a job process");
      job_destroy(j);
    }
  }
}

void nfd_jobs_tick(nfd_server *S, double now) {
  int second = 0;
  for (nfd_job *j = S->jobs; j; j = j->next)
    second |= j->phase == PH_QUEUED_TUNE && j->pass > 0;
  if (second) nfd_jobs_schedule(S); /* a second pass whose records are stored now */
  for (nfd_job *j = S->jobs; j; j = j->next) {
    if (!j->running) continue;
    double age = now - j->t_started;
    if (j->phase == PH_COMPILING && age > S->cfg.compile_timeout_s)
      kill_job(j, NEOFLOW__ERROR_CODE__ERR_COMPILE_TIMEOUT);
    else if (j->phase == PH_TUNING && age > j->tune_seconds + 120)
      kill_job(j, NEOFLOW__ERROR_CODE__ERR_TIMEOUT);
  }
}

void nfd_jobs_shutdown(nfd_server *S) {
  nfd_job *next;
  for (nfd_job *j = S->jobs; j; j = next) {
    next = j->next;
    flush_records(j);
    if (j->running) {
      kill_job(j, NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN);
    } else if (j->phase == PH_QUEUED_COMPILE || j->phase == PH_QUEUED_TUNE) {
      fail_all(j, NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN, "the daemon is shutting down");
      job_destroy(j);
    }
  }
}

int nfd_jobs_busy(const nfd_server *S) { return S->jobs != NULL; }

void nfd_jobs_status(nfd_server *S, Neoflow__StatusReply *st) {
  size_t n = (size_t)S->n_jobs;
  st->n_jobs = 0;
  st->jobs = NULL;
  if (!n) return;
  Neoflow__JobInfo *ji = calloc(n, sizeof *ji);
  Neoflow__JobInfo **jp = calloc(n, sizeof *jp);
  if (!ji || !jp) {
    free(ji);
    free(jp);
    return;
  }
  double now = nfd_now();
  size_t i = 0;
  for (nfd_job *j = S->jobs; j && i < n; j = j->next, i++) {
    neoflow__job_info__init(&ji[i]);
    ji[i].key.data = j->key;
    ji[i].key.len = 32;
    ji[i].graph = j->name;
    ji[i].summary = j->summary;
    ji[i].state = j->phase == PH_COMPILING ? NEOFLOW__JOB_STATE__JOB_COMPILING
                  : j->phase == PH_TUNING  ? NEOFLOW__JOB_STATE__JOB_TUNING
                                           : NEOFLOW__JOB_STATE__JOB_QUEUED;
    ji[i].mode = (j->phase == PH_QUEUED_TUNE || j->phase == PH_TUNING || wants_tune(j))
                     ? NEOFLOW__MODE__MODE_TUNE
                     : NEOFLOW__MODE__MODE_COMPILE;
    ji[i].waiters = (uint32_t)j->n_subs;
    ji[i].trial = j->trial;
    ji[i].max_trials = j->trials_max ? j->trials_max : (uint32_t)j->max_trials;
    ji[i].best_ms = j->best_ms;
    ji[i].default_ms = j->default_ms;
    ji[i].step_ms = step_share(j);
    ji[i].age_s = now - j->t_created;
    jp[i] = &ji[i];
  }
  st->n_jobs = i;
  st->jobs = jp;
}

void nfd_jobs_status_free(Neoflow__StatusReply *st) {
  if (st->n_jobs) free(st->jobs[0]);
  free(st->jobs);
  st->jobs = NULL;
  st->n_jobs = 0;
}
