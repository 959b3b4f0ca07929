/* dist.c - data-parallel sessions over MPI (nf_dist.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_config.h"
#include "nf_dist.h"
#include "nf_env.h"
#include "nf_nccl.h"
#include "session_int.h"

#if NF_HAVE_MPI
#include <mpi.h>

#define HB_TAG 7031          /* heartbeats: one per step from each rank to each */
#define BUCKET_BYTES (1 << 20) /* a bucket is sent once this many bytes are ready */
#define MAX_NAMED 64         /* heartbeats (and named ranks) up to this job size */

struct nf__dist {
  MPI_Comm comm;
  int rank, size;
  double timeout_s;
  /* the buckets: parameters by offset, the op after which each one's
   * gradient is complete (-1: never written: no gradient) */
  int n_params;
  int *last_op;
  uint8_t *ready, *sent;
  int n_req;
  MPI_Request *req;        /* one per bucket in flight (n_params at most) */
  int64_t step;            /* steps begun */
  double wait_ms;          /* spent waiting for exchanges, in all */
  int64_t hb_send[MAX_NAMED], hb_got[MAX_NAMED];
  MPI_Request hb_req[MAX_NAMED];
  /* a GPU session: the buckets are averaged on the device by NCCL, queued
   * after the ops that complete them (nf__device.after_ops) */
  nf_nccl *nccl;
  uint64_t dG;             /* the gradients' device address */
  int *bucket_ops;         /* scratch: a bucket's last ops */
};

static int finalize_registered;

static void wait_or_abort(nf_session *s, MPI_Request *reqs, int n, const char *what);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void finalize_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

/* Whether an MPI launcher started this process. */
static int launched(void) {
  return nf_env(NF_ENV_OMPI_SIZE) || nf_env(NF_ENV_PMIX_RANK) || nf_env(NF_ENV_PMI_SIZE);
}

int nf__dist_open(nf_session *s) {
  const char *off = nf_env(NF_ENV_DIST);
  if (off && (!strcmp(off, "off") || !strcmp(off, "0"))) return NF_OK;
  int init = 0;
  MPI_Initialized(&init);
  if (!init && !launched()) return NF_OK;
  if (!init) {
    int prov = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS) {
      nf_buf_printf(&s->err, "data-parallel training: MPI_Init_thread failed");
      return NF_EIO;
    }
    if (!finalize_registered) {
      finalize_registered = 1;
      atexit(finalize_at_exit);
    }
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) return NF_OK;
  nf__dist *d = calloc(1, sizeof *d);
  if (!d) {
    nf_buf_printf(&s->err, "data-parallel training: out of memory");
    MPI_Abort(MPI_COMM_WORLD, 3); /* (the other ranks would wait for this one) */
  }
  d->size = size;
  MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
  MPI_Comm_rank(d->comm, &d->rank);
  const char *t = nf_env(NF_ENV_DIST_TIMEOUT);
  d->timeout_s = t && atof(t) > 0 ? atof(t) : 300;
  for (int r = 0; r < MAX_NAMED; r++) d->hb_req[r] = MPI_REQUEST_NULL;
  s->dist = d;
  /* what every rank must have alike: the kind of device (every rank on
   * a GPU, with NCCL, or every rank on the CPU), and on the CPU a flat
   * vector MPI's counts take */
  nf_buf why = NF_BUF_INIT;
  int no_nccl = 0;
  if (s->gpu && nf_nccl_load(s->kt.dev->cuda_rt(s), &d->nccl, &why) != NF_OK) no_nccl = 1;
  int v[4] = {s->gpu ? 1 : 0, s->gpu ? 0 : 1, !s->gpu && s->n_flat > INT32_MAX, no_nccl};
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v, 4, MPI_INT, MPI_MAX, d->comm, &r);
  wait_or_abort(s, &r, 1, "opening the session on every rank");
  if ((v[0] && v[1]) || v[2] || v[3]) {
    if (v[0] && v[1])
      nf_buf_printf(&s->err, "data-parallel training: some ranks opened a GPU and others the "
                             "CPU (a rank whose GPU failed trains on the CPU: see its log); "
                             "every rank trains on the same kind of device");
    else if (v[2])
      nf_buf_printf(&s->err, "data-parallel training: more than 2^31 parameters");
    else
      nf_buf_printf(&s->err, "data-parallel training on GPUs needs NCCL on every rank: %s",
                    no_nccl ? nf_buf_str(&why) : "another rank could not load it (see its log)");
    nf_buf_free(&why);
    nf__dist_close(s);
    return NF_EUNSUPPORTED;
  }
  nf_buf_free(&why);
  if (d->nccl) {
    /* the communicator: rank 0's identifier to every rank by MPI */
    uint8_t id[NF_NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    int bad = d->rank == 0 && nf_nccl_unique_id(d->nccl, id, &s->err) != NF_OK;
    MPI_Request q[2];
    MPI_Ibcast(id, NF_NCCL_ID_BYTES, MPI_BYTE, 0, d->comm, &q[0]);
    MPI_Iallreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, d->comm, &q[1]);
    wait_or_abort(s, q, 2, "the NCCL identifier's broadcast");
    if (bad || nf_nccl_init(d->nccl, d->size, d->rank, id, &s->err) != NF_OK) {
      if (bad && !s->err.len) nf_buf_printf(&s->err, "rank 0 could not make an NCCL identifier");
      nf__dist_abort(s, "NCCL's communicator");
    }
    d->dG = s->kt.dev->addr(s, s->G, (size_t)s->n_flat * sizeof(float));
    if (!d->dG) nf__dist_abort(s, "the gradients have no device memory");
  }
  nf__slog_msg(&s->log, NEOFLOW_LOG_INFO, "data-parallel: rank %d of %d%s%s", d->rank, d->size,
               d->nccl ? ", gradients averaged on the GPU by NCCL " : "",
               d->nccl ? nf_nccl_version(d->nccl) : "");
  return NF_OK;
}

int nf__dist_rank(const nf_session *s) { return s->dist ? s->dist->rank : 0; }
double nf__dist_wait_ms(const nf_session *s) { return s->dist ? s->dist->wait_ms : 0; }
int nf__dist_size(const nf_session *s) { return s->dist ? s->dist->size : 1; }

void nf__dist_abort(nf_session *s, const char *why) {
  nf__dist *d = s->dist;
  if (!d) return;
  nf__slog_warn(&s->log, "rank %d: %s%s%s; aborting the job", d->rank, why,
                s->err.len ? ": " : "", s->err.len ? s->err.data : "");
  MPI_Abort(d->comm, 3);
}

void nf__dist_bcast_params(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return;
  /* (once per session or load: through the host, in MPI's int counts) */
  size_t bytes = (size_t)s->n_flat * sizeof(float);
  if (s->gpu && nf__dev_pull(s, s->P, bytes) != NF_OK) nf__dist_abort(s, "reading the parameters");
  for (int64_t at = 0; at < s->n_flat; at += INT32_MAX) {
    int64_t n = s->n_flat - at < INT32_MAX ? s->n_flat - at : INT32_MAX;
    MPI_Request r;
    MPI_Ibcast(s->P + at, (int)n, MPI_FLOAT, 0, d->comm, &r);
    wait_or_abort(s, &r, 1, "the parameters' broadcast");
  }
  if (s->gpu && nf__dev_push(s, s->P, bytes) != NF_OK) nf__dist_abort(s, "writing the parameters");
}

int nf__dist_start(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return NF_OK;
  d->n_params = s->n_params;
  d->last_op = malloc(sizeof(int) * ((size_t)s->n_params + 1));
  d->ready = calloc((size_t)s->n_params + 1, 1);
  d->sent = calloc((size_t)s->n_params + 1, 1);
  d->req = malloc(sizeof(MPI_Request) * ((size_t)s->n_params + 1));
  d->bucket_ops = malloc(sizeof(int) * ((size_t)s->n_params + 1));
  if (!d->last_op || !d->ready || !d->sent || !d->req || !d->bucket_ops)
    nf__dist_abort(s, "out of memory");
  for (int p = 0; p < s->n_params; p++) d->last_op[p] = -1;
  /* the last op writing into each parameter's gradient (through its slot
   * or a temporary sharing the gradient's memory) */
  const char *g0 = (const char *)s->G, *g1 = (const char *)(s->G + s->n_flat);
  for (int i = 0; i < s->n_ops; i++) {
    const nf__op *op = &s->ops[i];
    if (op->alias) continue;
    for (uint32_t j = op->n_in; j < op->n_in + op->n_out; j++) {
      const char *a = op->bufs[j], *b = a + s->slots[op->slots[j]].bytes;
      if (b <= g0 || a >= g1) continue;
      for (int p = 0; p < s->n_params; p++) {
        const char *pa = (const char *)(s->G + s->params[p].offset);
        const char *pb = pa + s->params[p].numel * 4;
        if (a < pb && b > pa) d->last_op[p] = i;
      }
    }
  }
  /* the same parameters on every rank: rank 0's */
  nf__dist_bcast_params(s);
  return NF_OK;
}

void nf__dist_close(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) { /* (after MPI_Finalize, at exit: no MPI call at all) */
    for (int r = 0; r < MAX_NAMED; r++)
      if (d->hb_req[r] != MPI_REQUEST_NULL) MPI_Request_free(&d->hb_req[r]);
    for (int q = 0; q < d->n_req; q++) MPI_Request_free(&d->req[q]);
    MPI_Comm_free(&d->comm);
  }
  nf_nccl_close(d->nccl);
  free(d->bucket_ops);
  free(d->last_op);
  free(d->ready);
  free(d->sent);
  free(d->req);
  free(d);
  s->dist = NULL;
}

/* A GPU bucket, parameters p..q (gradient floats lo..hi): NCCL's mean
 * queued after the ops that wrote them. */
typedef struct mean_args {
  nf_nccl *nccl;
  uint64_t dptr;
  size_t count;
} mean_args;

static int queue_mean(void *ctx, nf_buf *err) {
  const mean_args *a = ctx;
  return nf_nccl_mean(a->nccl, a->dptr, a->count, err);
}

static void gpu_bucket(nf_session *s, int p, int q, int64_t lo, int64_t hi) {
  nf__dist *d = s->dist;
  int n = 0, last = -1;
  for (int k = p; k <= q; k++) {
    int o = d->last_op[k];
    if (o < 0) continue;
    if (o > last) last = o;
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = d->bucket_ops[j] == o;
    if (!seen) d->bucket_ops[n++] = o;
  }
  mean_args a = {d->nccl, d->dG + (uint64_t)lo * sizeof(float), (size_t)(hi - lo)};
  int rc = last < 0 ? queue_mean(&a, &s->err)
                    : s->kt.dev->after_ops(s, last, d->bucket_ops, n, queue_mean, &a);
  if (rc != NF_OK) nf__dist_abort(s, "queueing a gradient bucket's mean (NCCL)");
}

/* Starts the allreduce of every run of consecutive parameters whose
 * gradients are ready and not sent, when the run holds BUCKET_BYTES or
 * all is ready (all). */
static void send_ready(nf_session *s, int all) {
  nf__dist *d = s->dist;
  int p = 0;
  while (p < d->n_params) {
    if (d->sent[p] || !d->ready[p]) {
      p++;
      continue;
    }
    int q = p;
    while (q + 1 < d->n_params && d->ready[q + 1] && !d->sent[q + 1]) q++;
    int64_t lo = s->params[p].offset;
    int64_t hi = q + 1 < d->n_params ? s->params[q + 1].offset : s->n_flat;
    if (all || (hi - lo) * 4 >= BUCKET_BYTES) {
      if (d->nccl) {
        gpu_bucket(s, p, q, lo, hi);
      } else {
        MPI_Iallreduce(MPI_IN_PLACE, s->G + lo, (int)(hi - lo), MPI_FLOAT, MPI_SUM, d->comm,
                       &d->req[d->n_req++]);
      }
      for (int k = p; k <= q; k++) d->sent[k] = 1;
    }
    p = q + 1;
  }
}

void nf__dist_step_begin(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return;
  /* heartbeats to every rank (up to MAX_NAMED): who was not heard from
   * in a step that hangs is named */
  d->step++;
  for (int r = 0; r < d->size && d->size <= MAX_NAMED; r++) {
    if (r == d->rank) continue;
    if (d->hb_req[r] != MPI_REQUEST_NULL) MPI_Wait(&d->hb_req[r], MPI_STATUS_IGNORE);
    d->hb_send[r] = d->step;
    MPI_Isend(&d->hb_send[r], 1, MPI_INT64_T, r, HB_TAG, d->comm, &d->hb_req[r]);
  }
}

int nf__dist_op_done(nf_session *s, int i) {
  nf__dist *d = s->dist;
  if (!d) return NF_OK;
  int any = 0;
  for (int p = 0; p < d->n_params; p++)
    if (d->last_op[p] == i) d->ready[p] = 1, any = 1;
  if (any) send_ready(s, 0);
  if (d->n_req) { /* (progress for the buckets in flight) */
    int done = 0;
    MPI_Testall(d->n_req, d->req, &done, MPI_STATUSES_IGNORE);
  }
  return NF_OK;
}

/* The ranks whose heartbeat of this step has not come (probed without
 * waiting), into buf. */
static void missing_ranks(nf__dist *d, char *buf, size_t n);

/* Waits for reqs[0..n) (an exchange named what), driving MPI's progress;
 * past the timeout, says which ranks did not answer this step and aborts
 * the job (mpirun then stops every rank). */
static void wait_or_abort(nf_session *s, MPI_Request *reqs, int n, const char *what) {
  nf__dist *d = s->dist;
  double t0 = now_s(), until = t0 + d->timeout_s;
  int done = 0, spins = 0;
  while (!done) {
    MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (now_s() > until) {
      char who[600];
      missing_ranks(d, who, sizeof who);
      nf__slog_warn(&s->log,
                    "rank %d: step %lld: %s did not finish within %.0f s: %s%s%s; aborting the job",
                    d->rank, (long long)d->step, what, d->timeout_s,
                    d->step == 0 ? "some rank did not open the session, or opened another"
                    : who[0] == '(' ? "the ranks not heard from are "
                    : who[0] ? "no answer from rank "
                             : "every rank sent this step's heartbeat (one is stuck within the step)",
                    d->step == 0 ? "" : who, who[0] && who[0] != '(' && d->step ? " (it hung or died)" : "");
      MPI_Abort(d->comm, 3);
    }
    /* (MPI progresses only in its calls, on both sides: an exchange
     * polls for 20 ms, as MPI's blocking calls do, then sleeps a little
     * between polls while it waits for a slower rank) */
    if ((++spins & 63) == 0 && now_s() - t0 > 0.02) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
  }
  d->wait_ms += (now_s() - t0) * 1e3;
}
static void missing_ranks(nf__dist *d, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  if (d->size > MAX_NAMED) {
    snprintf(buf, n, "(not tracked in a job of more than %d ranks)", MAX_NAMED);
    return;
  }
  for (int r = 0; r < d->size && r < MAX_NAMED; r++) {
    if (r == d->rank) continue;
    int flag = 1;
    while (d->hb_got[r] < d->step && flag) {
      MPI_Iprobe(r, HB_TAG, d->comm, &flag, MPI_STATUS_IGNORE);
      if (flag) MPI_Recv(&d->hb_got[r], 1, MPI_INT64_T, r, HB_TAG, d->comm, MPI_STATUS_IGNORE);
    }
    if (d->hb_got[r] < d->step && k < n)
      k += (size_t)snprintf(buf + k, n - k, "%s%d", k ? ", " : "", r);
  }
}

/* This step's heartbeats from every rank (sent before their exchange:
 * they are here). */
static void recv_heartbeats(nf__dist *d) {
  for (int r = 0; r < d->size && d->size <= MAX_NAMED; r++)
    while (r != d->rank && d->hb_got[r] < d->step)
      MPI_Recv(&d->hb_got[r], 1, MPI_INT64_T, r, HB_TAG, d->comm, MPI_STATUS_IGNORE);
}

int nf__dist_grads(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return NF_OK;
  for (int p = 0; p < d->n_params; p++)
    if (d->last_op[p] >= 0) d->ready[p] = 1;
  send_ready(s, 1);
  memset(d->ready, 0, (size_t)d->n_params);
  memset(d->sent, 0, (size_t)d->n_params);
  if (d->nccl) return NF_OK; /* queued: the means on the device (nf__dist_step_end) */
  wait_or_abort(s, d->req, d->n_req, "the gradient exchange");
  d->n_req = 0;
  /* the mean, not the sum */
  float inv = 1.0f / (float)d->size;
  for (int64_t k = 0; k < s->n_flat; k++) s->G[k] *= inv;
  recv_heartbeats(d);
  return NF_OK;
}

int nf__dist_step_end(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d || !d->nccl) return NF_OK;
  nf__dist_device_wait(s);
  recv_heartbeats(d);
  return NF_OK;
}

void nf__dist_run_begin(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d) return;
  /* (a run that failed before its exchange, a CUDA graph's capture that
   * failed and is run again live: its buckets are queued anew) */
  memset(d->ready, 0, (size_t)d->n_params);
  memset(d->sent, 0, (size_t)d->n_params);
}

int nf__dist_device_wait(nf_session *s) {
  nf__dist *d = s->dist;
  if (!d || !d->nccl) return nf_cuda_rt_sync(s->kt.dev->cuda_rt(s), &s->err);
  /* the device's queued work, NCCL's means with it, waited for without
   * blocking: a rank that hangs or died is named within the timeout */
  double until = now_s() + d->timeout_s;
  int idle = 0, rc = NF_OK;
  while (rc == NF_OK && !idle) {
    rc = nf_cuda_rt_idle(s->kt.dev->cuda_rt(s), &idle, &s->err);
    if (rc == NF_OK && !idle) rc = nf_nccl_check(d->nccl, &s->err);
    if (rc == NF_OK && !idle && now_s() > until) {
      nf_buf_printf(&s->err, "step %lld: the gradients' exchange on the GPUs did not finish "
                             "within %.0f s", (long long)d->step, d->timeout_s);
      rc = NF_EIO;
    }
    if (rc == NF_OK && !idle) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  if (rc == NF_OK) rc = nf_nccl_check(d->nccl, &s->err);
  /* (not counted in wait_ms: this waits for the step's device work too) */
  if (rc != NF_OK) {
    nf_nccl_abort(d->nccl); /* (its kernels return) */
    char who[600];
    missing_ranks(d, who, sizeof who);
    if (who[0] && who[0] != '(')
      nf_buf_printf(&s->err, "; no answer from rank %s (it hung or died)", who);
    nf__dist_abort(s, "the gradients' exchange failed");
  }
  return NF_OK;
}

void nf__dist_mean(nf_session *s, double *v, int n) {
  nf__dist *d = s->dist;
  if (!d || n <= 0) return;
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, d->comm, &r);
  wait_or_abort(s, &r, 1, "an exchange of timings");
  for (int i = 0; i < n; i++) v[i] /= d->size;
}

int nf__dist_all(nf_session *s, int ok) {
  nf__dist *d = s->dist;
  if (!d) return ok;
  int v = ok ? 1 : 0;
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, d->comm, &r);
  wait_or_abort(s, &r, 1, "an exchange of canary verdicts");
  return v;
}

void nf__dist_same(nf_session *s, uint64_t *v, int n) {
  nf__dist *d = s->dist;
  if (!d || n <= 0) return;
  uint64_t *mn = malloc(sizeof(uint64_t) * (size_t)n * 2);
  if (!mn) nf__dist_abort(s, "out of memory for an agreement");
  uint64_t *mx = mn + n;
  MPI_Request r[2];
  MPI_Iallreduce(v, mn, n, MPI_UINT64_T, MPI_MIN, d->comm, &r[0]);
  MPI_Iallreduce(v, mx, n, MPI_UINT64_T, MPI_MAX, d->comm, &r[1]);
  wait_or_abort(s, r, 2, "the agreement on kernels");
  for (int i = 0; i < n; i++) v[i] = mn[i] == mx[i] ? v[i] : 0;
  free(mn);
}

#else /* no MPI in this build: alone */

int nf__dist_open(nf_session *s) {
  (void)s;
  return NF_OK;
}
int nf__dist_start(nf_session *s) {
  (void)s;
  return NF_OK;
}
void nf__dist_close(nf_session *s) { (void)s; }
int nf__dist_rank(const nf_session *s) {
  (void)s;
  return 0;
}
double nf__dist_wait_ms(const nf_session *s) {
  (void)s;
  return 0;
}
int nf__dist_size(const nf_session *s) {
  (void)s;
  return 1;
}
void nf__dist_step_begin(nf_session *s) { (void)s; }
void nf__dist_abort(nf_session *s, const char *why) {
  (void)s;
  (void)why;
}
void nf__dist_bcast_params(nf_session *s) { (void)s; }
int nf__dist_op_done(nf_session *s, int i) {
  (void)s;
  (void)i;
  return NF_OK;
}
int nf__dist_grads(nf_session *s) {
  (void)s;
  return NF_OK;
}
int nf__dist_step_end(nf_session *s) {
  (void)s;
  return NF_OK;
}
void nf__dist_run_begin(nf_session *s) { (void)s; }
int nf__dist_device_wait(nf_session *s) {
  (void)s;
  return NF_OK;
}
void nf__dist_mean(nf_session *s, double *v, int n) {
  (void)s;
  (void)v;
  (void)n;
}
int nf__dist_all(nf_session *s, int ok) {
  (void)s;
  return ok;
}
void nf__dist_same(nf_session *s, uint64_t *v, int n) {
  (void)s;
  (void)v;
  (void)n;
}

#endif
