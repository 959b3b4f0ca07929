/* server.c - neoflowd's connections: accept, authenticate, frame, decode,
 * answer, and bound what each peer can make the daemon hold.
 *
 * A connection goes HANDSHAKE -> READY -> CLOSING.  In HANDSHAKE frames
 * are limited to NF_WIRE_HANDSHAKE_MAX and the first must be a Hello
 * (on TCP it answers the Challenge sent at accept); a Unix peer's uid is
 * checked with SO_PEERCRED at accept.  READY accepts Submit, Cancel,
 * StepTimes, StatusRequest and Ping in frames of NF_WIRE_FRAME_MAX.
 *
 * Limits (nfd_config): max_connections (beyond: ERR_BUSY and close),
 * max_requests per connection, the handshake deadline, the progress
 * deadline for a started frame, the output limits: kernel chunks are
 * produced only while the connection's unsent output is under the soft
 * limit (so a client that never reads costs at most soft + one chunk);
 * above the soft limit for output_soft_seconds, or above the hard limit,
 * the connection is dropped with the reason logged.
 *
 * Invariants: nothing a peer sends is used before nf_wire_decode_* has
 * validated it; the graph is checked by nf_wire_graph_to_ir (structure,
 * expression depth, index bounds) and against the caps on its elements
 * and float operations before it is hashed or queued; an undecodable frame closes the connection with a
 * typed error; an invalid request gets a request-level error and the
 * session goes on.  The event loop never runs candidate code: compiling and
 * tuning happen in job processes (jobs.c). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nf_config.h"
#include "nf_flops.h"
#include "nf_ir.h"
#include "nf_kernel.h"
#include "nf_nvrtc_link.h"
#include "nf_search.h"
#include "nf_wire_auth.h"
#include "nf_wire_box.h"
#include "nf_wire_sign.h"
#include "nfd_int.h"
#include "nfd_net.h"

enum { ST_HANDSHAKE = 0, ST_READY, ST_CLOSING };

typedef struct outq {
  struct outq *next;
  uint64_t id;
  nfd_kernel *k;
  int final;
  int header_sent;
  size_t offset;
} outq;

struct nfd_conn {
  union {
    uv_pipe_t pipe;
    uv_tcp_t tcp;
    uv_stream_t stream;
    uv_handle_t handle;
  } h;
  nfd_server *S;
  nfd_conn *prev, *next;
  uint64_t session;
  int tcp;
  int state;
  int target_ok;
  nfd_target target; /* what the session compiles for (target_ok) */
  uid_t uid;
  pid_t pid;
  char name[NF_WIRE_NAME_MAX + 1];
  uint8_t server_nonce[NF_AUTH_NONCE];
  uint8_t eph_pk[32], eph_sk[32]; /* TCP: this connection's X25519 key */
  char peer[64];                  /* TCP: the peer's address */
  double t_frame;                 /* when the frame now arriving began (0: none) */
  nf_wire_box box;                /* TCP: frames after the handshake */
  nf_frame_reader rd;
  double t_connect, t_last_rx, t_last_tx, t_soft_since, t_close;
  double step_ms; /* the client's step: the sum of its last StepTimes */
  size_t out_pending;
  outq *q_head, *q_tail;
  nfd_req *reqs;
  int n_reqs;
  uint64_t served;
  uint64_t n_submitted;
  int shutdown_started;
  int doomed; /* to be closed at the next tick: output failed or overflowed */
};

typedef struct wreq {
  uv_write_t w;
  nfd_conn *c;
  size_t len;
  uint8_t data[];
} wreq;

static uint8_t rx_buf[64 * 1024];

static void conn_close(nfd_conn *c, const char *why);
static void pump(nfd_conn *c);

/* ---- kernels ---- */

nfd_kernel *nfd_kernel_new(const uint8_t key[32], int tier, const char *schedule,
                           double time_ms, double default_ms, int trials,
                           const uint8_t *binary, size_t len) {
  nfd_kernel *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->refs = 1;
  memcpy(k->key, key, 32);
  k->tier = tier;
  k->schedule = strdup(schedule ? schedule : "");
  k->binary = malloc(len ? len : 1);
  if (!k->schedule || !k->binary) {
    free(k->schedule);
    free(k->binary);
    free(k);
    return NULL;
  }
  if (len) memcpy(k->binary, binary, len);
  k->len = len;
  k->time_ms = time_ms;
  k->default_ms = default_ms;
  k->trials = trials;
  crypto_hash_sha256(k->sha256, k->binary, len);
  return k;
}

void nfd_kernel_sign(const nfd_server *S, nfd_kernel *k, const uint8_t target[32]) {
  nf_sign_kernel(S->sign_sk, k->key, k->sha256, target, NF_KERNEL_ABI_VERSION, k->sig);
}

int nfd_entry_signed(const nfd_server *S, const nf_cache_entry *e, const uint8_t key[32],
                     const uint8_t target[32]) {
  return e->has_sig && !memcmp(e->sig.signer, S->sign_pk, 32) &&
         nf_sign_kernel_ok(S->sign_pk, e->sig.sig, key, e->sha256, target, NF_KERNEL_ABI_VERSION);
}

void nfd_kernel_ref(nfd_kernel *k) { k->refs++; }

void nfd_kernel_unref(nfd_kernel *k) {
  if (!k || --k->refs > 0) return;
  free(k->schedule);
  free(k->binary);
  free(k);
}

/* ---- output ---- */

static void on_write(uv_write_t *w, int status) {
  wreq *r = (wreq *)w;
  nfd_conn *c = r->c;
  c->out_pending -= r->len;
  free(r);
  if (status == 0) {
    c->t_last_tx = nfd_now();
    if (c->state != ST_CLOSING && !c->doomed) pump(c);
  }
}

/* Marks c to be closed at the next tick.  Sending paths never close a
 * connection themselves: they run inside loops over a job's subscribers,
 * and closing would free requests those loops still hold. */
static void conn_doom(nfd_conn *c, const char *why) {
  if (c->doomed) return;
  c->doomed = 1;
  if (why) NFD_INFO("session %llu (%s): dropped: %s", (unsigned long long)c->session, c->name, why);
}

/* Writes len bytes (copied).  0, or -1 when the connection is going. */
static int conn_write(nfd_conn *c, const uint8_t *p, size_t len) {
  if (c->state == ST_CLOSING || c->doomed) return -1;
  wreq *r = malloc(sizeof *r + len);
  if (!r) {
    conn_doom(c, "out of memory");
    return -1;
  }
  r->c = c;
  r->len = len;
  memcpy(r->data, p, len);
  uv_buf_t b = uv_buf_init((char *)r->data, (unsigned)len);
  int rc = uv_write(&r->w, &c->h.stream, &b, 1, on_write);
  if (rc != 0) {
    free(r);
    conn_doom(c, uv_strerror(rc));
    return -1;
  }
  c->out_pending += len;
  if ((int64_t)c->out_pending > c->S->cfg.output_hard_limit) {
    NFD_WARN("session %llu (%s): output above the hard limit (%zu bytes unread): dropped",
             (unsigned long long)c->session, c->name, c->out_pending);
    conn_doom(c, NULL);
    return -1;
  }
  return 0;
}

void nfd_conn_send(nfd_conn *c, const Neoflow__ServerMessage *m) {
  if (c->state == ST_CLOSING || c->doomed) return;
  nf_buf b = NF_BUF_INIT;
  int rc = nf_wire_pack(&m->base, NF_WIRE_FRAME_MAX - (c->box.on ? NF_BOX_TAG : 0), &b);
  if (rc == NF_OK && c->box.on) rc = nf_box_seal_frame(&c->box, &b);
  if (rc == NF_OK) conn_write(c, (const uint8_t *)b.data, b.len);
  else NFD_ERROR("session %llu: cannot pack a reply: %s", (unsigned long long)c->session,
                 nf_strerror(rc));
  nf_buf_free(&b);
}

void nfd_conn_error(nfd_conn *c, uint64_t request_id, int code, int fatal, const char *fmt,
                    ...) {
  char msg[NF_WIRE_TEXT_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nf_wire_text_sanitize(msg, NF_WIRE_TEXT_MAX, 1);
  Neoflow__Error e = NEOFLOW__ERROR__INIT;
  e.code = code;
  e.message = msg;
  e.request_id = request_id;
  e.fatal = fatal;
  if (code == NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_VERSION) {
    e.supported_min = NF_WIRE_PROTOCOL_MIN;
    e.supported_max = NF_WIRE_PROTOCOL_MAX;
  }
  Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
  m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_ERROR;
  m.error = &e;
  NFD_DEBUG("session %llu (%s): error %d%s: %s", (unsigned long long)c->session, c->name, code,
            fatal ? " (fatal)" : "", msg);
  nfd_conn_send(c, &m);
  if (fatal) conn_close(c, NULL);
}

size_t nfd_conn_out_pending(const nfd_conn *c) { return c->out_pending; }

uint64_t *nfd_conn_served(nfd_conn *c) { return &c->served; }

void nfd_conn_send_kernel(nfd_conn *c, uint64_t id, nfd_kernel *k, int final) {
  if (c->state == ST_CLOSING || c->doomed) return;
  outq *q = calloc(1, sizeof *q);
  if (!q) {
    conn_doom(c, "out of memory");
    return;
  }
  q->id = id;
  q->k = k;
  q->final = final;
  nfd_kernel_ref(k);
  if (c->q_tail) c->q_tail->next = q;
  else c->q_head = q;
  c->q_tail = q;
  pump(c);
}

/* Produces queued kernel messages while the output is under the soft
 * limit. */
static void pump(nfd_conn *c) {
  size_t soft = (size_t)c->S->cfg.output_soft_limit;
  while (c->q_head && c->state != ST_CLOSING && !c->doomed && c->out_pending < soft) {
    outq *q = c->q_head;
    Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
    if (!q->header_sent) {
      Neoflow__KernelUpdate ku = NEOFLOW__KERNEL_UPDATE__INIT;
      ku.request_id = q->id;
      ku.key.data = q->k->key;
      ku.key.len = 32;
      ku.tier = q->k->tier;
      ku.schedule = q->k->schedule;
      ku.time_ms = q->k->time_ms;
      ku.default_ms = q->k->default_ms;
      ku.size = q->k->len;
      ku.sha256.data = q->k->sha256;
      ku.sha256.len = 32;
      ku.final = q->final;
      ku.kernel_abi = NF_KERNEL_ABI_VERSION;
      ku.signature.data = q->k->sig;
      ku.signature.len = 64;
      m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_KERNEL;
      m.kernel = &ku;
      q->header_sent = 1;
      nfd_conn_send(c, &m);
    } else {
      size_t n = q->k->len - q->offset;
      if (n > NF_WIRE_CHUNK_MAX) n = NF_WIRE_CHUNK_MAX;
      Neoflow__Chunk ch = NEOFLOW__CHUNK__INIT;
      ch.request_id = q->id;
      ch.offset = q->offset;
      ch.data.data = q->k->binary + q->offset;
      ch.data.len = n;
      m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_CHUNK;
      m.chunk = &ch;
      q->offset += n;
      nfd_conn_send(c, &m);
    }
    if (c->state == ST_CLOSING || c->doomed) return; /* q goes with the connection */
    if (q->header_sent && q->offset >= q->k->len) {
      c->q_head = q->next;
      if (!c->q_head) c->q_tail = NULL;
      nfd_kernel_unref(q->k);
      free(q);
    }
  }
}

/* ---- requests ---- */

void nfd_req_finish(nfd_req *r) {
  nfd_conn *c = r->conn;
  for (nfd_req **p = &c->reqs; *p; p = &(*p)->next_in_conn)
    if (*p == r) {
      *p = r->next_in_conn;
      c->n_reqs--;
      break;
    }
  free(r);
}

static nfd_req *find_req(nfd_conn *c, uint64_t id) {
  for (nfd_req *r = c->reqs; r; r = r->next_in_conn)
    if (r->id == id) return r;
  return NULL;
}

/* ---- closing ---- */

static void on_closed(uv_handle_t *h) {
  nfd_conn *c = h->data;
  nfd_server *S = c->S;
  nf_frame_reader_free(&c->rd);
  if (c->prev) c->prev->next = c->next;
  else S->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  S->n_conns--;
  free(c);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  nfd_conn *c = req->data;
  free(req);
  if (!uv_is_closing(&c->h.handle)) uv_close(&c->h.handle, on_closed);
}

/* Closes c: its requests leave their jobs, queued output is dropped,
 * already written frames are flushed (uv_shutdown) for at most 2 s. */
static void conn_close(nfd_conn *c, const char *why) {
  if (c->state == ST_CLOSING) return;
  if (why) NFD_INFO("session %llu (%s): closed: %s", (unsigned long long)c->session, c->name, why);
  c->state = ST_CLOSING;
  c->t_close = nfd_now();
  nf_box_clear(&c->box);
  sodium_memzero(c->eph_sk, sizeof c->eph_sk);
  uv_read_stop(&c->h.stream);
  while (c->reqs) {
    nfd_req *r = c->reqs;
    nfd_job_unsubscribe(r);
    nfd_req_finish(r);
  }
  /* only now that all its requests are gone: a search it leaves detached
   * is not stopped for a job of its own that is dropped too */
  nfd_jobs_schedule(c->S);
  while (c->q_head) {
    outq *q = c->q_head;
    c->q_head = q->next;
    nfd_kernel_unref(q->k);
    free(q);
  }
  c->q_tail = NULL;
  uv_shutdown_t *sr = malloc(sizeof *sr);
  c->shutdown_started = 1;
  if (sr) {
    sr->data = c;
    if (uv_shutdown(sr, &c->h.stream, on_shutdown) == 0) return;
    free(sr);
  }
  uv_close(&c->h.handle, on_closed);
}

/* ---- cache hit counts ----
 * A hit's count and last-used time are written in batches (one small
 * transaction per key and second, not one per hit). */

static void flush_touches(nfd_server *S) {
  for (int i = 0; i < S->n_touch; i++) nfd_writer_touch(S, S->touch_key[i], S->touch_n[i]);
  S->n_touch = 0;
  S->t_touch_flush = nfd_now();
}

static void count_hit(nfd_server *S, const uint8_t key[32]) {
  for (int i = 0; i < S->n_touch; i++)
    if (memcmp(S->touch_key[i], key, 32) == 0) {
      S->touch_n[i]++;
      return;
    }
  if (S->n_touch == 256) flush_touches(S);
  memcpy(S->touch_key[S->n_touch], key, 32);
  S->touch_n[S->n_touch++] = 1;
}

/* ---- requests from a client ---- */

static void send_accepted(nfd_conn *c, uint64_t id, const uint8_t key[32], int hit, int busy) {
  Neoflow__Accepted a = NEOFLOW__ACCEPTED__INIT;
  a.request_id = id;
  a.key.data = (uint8_t *)key;
  a.key.len = 32;
  a.cache_hit = hit;
  a.cache_error = busy ? NEOFLOW__ERROR_CODE__ERR_CACHE_BUSY : NEOFLOW__ERROR_CODE__ERR_NONE;
  Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
  m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_ACCEPTED;
  m.accepted = &a;
  nfd_conn_send(c, &m);
}

static int clampi(int v, int dflt, int max) {
  if (v <= 0) v = dflt;
  return v > max ? max : v;
}

/* The daemon's caps on one subgraph (docs/daemon.md "Checking a
 * subgraph"): the elements of its tensors and the float operations of one
 * evaluation, against [jobs] max_elements and max_gflops.  NF_OK,
 * NF_ELIMIT with the reason and how to raise the cap in err, NF_ENOMEM. */
static int check_caps(nfd_server *S, const nf_graph *g, nf_buf *err) {
  nf_graph_cost cost;
  int rc = nf_graph_measure(g, &cost);
  if (rc) return rc;
  double gflops = cost.flops / 1e9;
  NFD_DEBUG("graph %s: %u statements, depth %u (statement %u), %.4g elements, %.4g GFLOP "
            "(most in statement %u)",
            g->name ? g->name : "?", g->n_stmts, cost.depth, cost.depth_stmt, cost.elements,
            gflops, cost.flops_stmt);
  if (cost.elements > (double)S->cfg.max_elements) {
    nf_buf_printf(err,
                  "its tensors hold %.4g elements, more than this daemon's cap of %lld "
                  "(raise [jobs] max_elements in neoflowd.conf to accept it)",
                  cost.elements, (long long)S->cfg.max_elements);
    return NF_ELIMIT;
  }
  if (gflops > (double)S->cfg.max_gflops) {
    const nf_stmt *st = &g->stmts[cost.flops_stmt];
    const char *n = g->tensors[st->out].name;
    nf_buf_printf(err,
                  "one evaluation may take %.4g GFLOP (most in statement %u, %s), more than "
                  "this daemon's cap of %lld GFLOP (raise [jobs] max_gflops in neoflowd.conf "
                  "to accept it)",
                  gflops, cost.flops_stmt, n ? n : "?", (long long)S->cfg.max_gflops);
    return NF_ELIMIT;
  }
  return NF_OK;
}

/* A client says the kernel it got for this graph (s->slower_sha256) ran
 * slower than its own fallback.  When that kernel is the one the cache
 * holds, the request asks to tune, and the key's search has not yet had
 * NFD_RETUNE_BUDGETS budgets of `trials` measurements (its records count
 * them, every run's), the search resumes from those records with one more
 * budget: the answer is not final.  Otherwise the kernel is final: what a
 * longer search could not beat, the client keeps its fallback for. */
#define NFD_RETUNE_BUDGETS 4
static int retune_wanted(nfd_conn *c, const Neoflow__Submit *s, const uint8_t key[32],
                         const nf_cache_entry *e, int trials) {
  nfd_server *S = c->S;
  S->slower_reports++;
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  const char *g = s->graph->name ? s->graph->name : "";
  double ratio = isfinite(s->slower_ratio) && s->slower_ratio > 0 ? s->slower_ratio : 0;
  if (s->mode != NEOFLOW__MODE__MODE_TUNE || s->slower_sha256.len != 32 ||
      memcmp(s->slower_sha256.data, e->sha256, 32)) {
    NFD_INFO("session %llu (%s): kernel %s (%s) ran %.2fx slower than its fallback there; the "
             "cache holds another kernel now: serving that", (unsigned long long)c->session,
             c->name, hex, g, ratio);
    return 0;
  }
  if (e->tune_error && *e->tune_error) {
    NFD_INFO("session %llu (%s): kernel %s (%s) ran %.2fx slower than its fallback there; its "
             "search found no correct candidate (%s): not tuned again",
             (unsigned long long)c->session, c->name, hex, g, ratio, e->tune_error);
    return 0;
  }
  size_t limit = (size_t)trials * NFD_RETUNE_BUDGETS, n = 0;
  if (limit > 2000) limit = 2000; /* a tuning job's prior records (add_prior) */
  nf_cache_record *recs = NULL;
  nf_buf err = NF_BUF_INIT;
  if (S->cache && nf_cache_get_records(S->cache, key, limit, &recs, &n, &err) == NF_OK)
    nf_cache_records_free(recs, n);
  else
    n = limit; /* records unreadable: no search could resume from them */
  nf_buf_free(&err);
  if (n >= limit) {
    NFD_INFO("session %llu (%s): kernel %s (%s) ran %.2fx slower than its fallback there; "
             "%zu trials already went into it: final", (unsigned long long)c->session, c->name,
             hex, g, ratio, n);
    return 0;
  }
  S->retunes++;
  NFD_INFO("session %llu (%s): kernel %s (%s) ran %.2fx slower than its fallback there: the "
           "search resumes from its %zu records with %d more trials",
           (unsigned long long)c->session, c->name, hex, g, ratio, n, trials);
  return 1;
}

static void on_submit(nfd_conn *c, const Neoflow__Submit *s) {
  nfd_server *S = c->S;
  uint64_t id = s->request_id;
  if (S->shutting_down) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN, 0, "the daemon is shutting down");
    return;
  }
  if (id == 0) {
    nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 0,
                   "submit.request_id: must not be 0 (0 names the session in errors)");
    return;
  }
  if (find_req(c, id)) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 0,
                   "submit: request_id %llu is already open in this session",
                   (unsigned long long)id);
    return;
  }
  if (c->n_reqs >= S->cfg.max_requests) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_TOO_MANY_REQUESTS, 0,
                   "submit: %d requests are open in this session (max_requests)", c->n_reqs);
    return;
  }
  /* (a lookup only reads the cache: a node of another CPU is answered
   * ERR_NOT_FOUND, nothing being compiled here for its target, and
   * compiles itself) */
  if (!c->target_ok && s->mode != NEOFLOW__MODE__MODE_LOOKUP) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_TARGET, 0,
                   "submit: this daemon compiles for %s or a GPU it has NVRTC for, not for "
                   "the client's target (see the daemon's log for the handshake)",
                   S->target.description);
    return;
  }
  int publish = s->mode == NEOFLOW__MODE__MODE_PUBLISH;
  if (publish && c->target.cuda_sm) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_TARGET, 0,
                   "submit: schedules are published for this daemon's CPU only, not for a GPU");
    return;
  }
  if (!s->graph) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH, 0, "submit: no graph");
    return;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_buf err = NF_BUF_INIT;
  nf_graph *g = NULL;
  uint8_t ghash[32], key[32];
  int rc = ctx ? nf_wire_graph_to_ir(s->graph, ctx, &g, &err) : NF_ENOMEM;
  if (rc == NF_OK) rc = check_caps(S, g, &err);
  if (rc == NF_OK) rc = nf_graph_hash(g, ghash);
  char summary[NFD_SUMMARY_MAX] = "";
  if (rc == NF_OK) nf_graph_summary(g, summary, sizeof summary);
  /* the shape finds similar subgraphs in the cache when this one is tuned
   * (only then: a compile never looks) */
  nfd_shape shape;
  memset(&shape, 0, sizeof shape);
  if (rc == NF_OK && (s->mode == NEOFLOW__MODE__MODE_TUNE || publish) &&
      nf_search_shape(g, shape.sig, shape.desc, NF_CACHE_DESC, &shape.n_desc) == NF_OK)
    shape.ok = 1;
  if (rc != NF_OK) {
    if (rc == NF_ENOMEM)
      nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_INTERNAL, 0, "submit: out of memory");
    else
      nfd_conn_error(c, id,
                     rc == NF_ELIMIT ? NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH
                                     : NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH,
                     0, "submit.graph: %s", err.len ? nf_buf_str(&err) : nf_strerror(rc));
    NFD_INFO("session %llu (%s): request %llu refused: %s", (unsigned long long)c->session,
             c->name, (unsigned long long)id, err.len ? nf_buf_str(&err) : nf_strerror(rc));
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
    return;
  }
  /* a published schedule in its canonical text (so that it compares with
   * the kept one), or refused at once when it does not apply */
  char *canon = NULL;
  if (publish) {
    S->published_received++;
    nf_schedule *sc = NULL;
    nf_buf t = NF_BUF_INIT;
    int arc = nf_search_adapt(g, s->schedule, &sc, &err);
    if (arc == NF_OK) nf_schedule_print(sc, &t);
    nf_schedule_free(sc);
    if (arc == NF_OK && !(canon = strdup(nf_buf_str(&t)))) arc = NF_ENOMEM;
    nf_buf_free(&t);
    if (arc != NF_OK) {
      nfd_conn_error(c, id, arc == NF_ENOMEM ? NEOFLOW__ERROR_CODE__ERR_INTERNAL
                                             : NEOFLOW__ERROR_CODE__ERR_NOT_KEPT,
                     0, "the published schedule does not apply to this graph: %s",
                     err.len ? nf_buf_str(&err) : nf_strerror(arc));
      nf_buf_free(&err);
      nf_ir_ctx_free(ctx);
      return;
    }
  }
  nf_ir_ctx_free(ctx);
  nf_cache_make_key(ghash, c->target.fingerprint, c->target.codegen, key);

  nfd_req *r = calloc(1, sizeof *r);
  if (!r) {
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_INTERNAL, 0, "submit: out of memory");
    nf_buf_free(&err);
    free(canon);
    return;
  }
  r->conn = c;
  r->id = id;
  r->mode = s->mode;
  memcpy(r->summary, summary, sizeof summary);
  memcpy(r->key, key, 32);
  r->target = c->target;
  r->next_in_conn = c->reqs;
  c->reqs = r;
  c->n_reqs++;
  c->n_submitted++;

  nf_cache_entry e;
  memset(&e, 0, sizeof e);
  nf_buf_reset(&err);
  int hit = S->cache ? nf_cache_get(S->cache, key, &e, &err) : NF_ENOENT;
  int busy = hit != NF_OK && hit != NF_ENOENT && strstr(nf_buf_str(&err), ": busy: ");
  if (busy) S->cache_busy++;
  if (hit != NF_OK && hit != NF_ENOENT)
    nfd_burst_log(&S->burst_busy, "cache lookup failed (serving uncached): %s", nf_buf_str(&err));
  /* the writer found the cache locked lately: this result may not be kept */
  int64_t wb = __atomic_load_n(&S->writer_busy_ms, __ATOMIC_RELAXED);
  if (wb > 0 && nfd_now() * 1000 - (double)wb < 60000) busy = 1;
  /* a result stored a moment ago may still wait in the writer's queue:
   * it is newer than the cache's entry (a job's tuned kernel, or its
   * failure to tune, over the tier-1 kernel its compile stored), and the
   * job that made it may be ending: joining it would get nothing */
  nf_cache_entry pend;
  if (nfd_writer_lookup(S, key, &pend) == NF_OK) {
    if (hit != NF_OK || nfd_entry_tuned(&pend) || !nfd_entry_tuned(&e)) {
      if (hit == NF_OK) nf_cache_entry_free(&e);
      e = pend;
      hit = NF_OK;
    } else {
      nf_cache_entry_free(&pend);
    }
  }
  /* a binary is served only under this daemon's own signature, made when
   * it compiled it: an entry without one (imported, edited by hand,
   * written by another program) is moved aside and built afresh */
  if (hit == NF_OK && !nfd_entry_signed(S, &e, key, c->target.fingerprint)) {
    NFD_WARN("cache entry %02x%02x%02x%02x... (%s) is %s: not serving it; quarantined, built "
             "again", key[0], key[1], key[2], key[3], e.graph_name ? e.graph_name : "",
             e.has_sig ? "signed by a key this daemon does not hold" : "not signed");
    nfd_writer_quarantine(S, key, e.has_sig ? "signed by an unknown key" : "unsigned binary");
    nf_cache_entry_free(&e);
    hit = NF_ENOENT;
  }
  hit = hit == NF_OK;
  int tuned = hit && nfd_entry_tuned(&e);
  if (tuned && e.tune_error && *e.tune_error && s->mode == NEOFLOW__MODE__MODE_TUNE)
    NFD_DEBUG("submit %.16s: not tuned again: %s", s->graph->name ? s->graph->name : "",
              e.tune_error);
  int trials = clampi((int)s->max_trials, S->cfg.default_trials, S->cfg.max_trials);
  int retune = s->slower_sha256.len && tuned && retune_wanted(c, s, key, &e, trials);
  int lookup = s->mode == NEOFLOW__MODE__MODE_LOOKUP;
  int done = hit && (lookup || s->mode == NEOFLOW__MODE__MODE_COMPILE || (tuned && !retune));
  if (publish) {
    /* a node's tuned schedule is measured here against the default and
     * the key's tuned kernel: two trials at most (the published one, the
     * kept one), unless it joins a tuning asked for more */
    trials = 2;
    done = hit && tuned && e.schedule && !strcmp(e.schedule, canon);
    NFD_INFO("session %llu (%s): publishes a tuned schedule for %.*s: %s", (unsigned long long)c->session,
             c->name, NF_WIRE_NAME_MAX, s->graph->name ? s->graph->name : "(unnamed)",
             done ? "already the one kept here" : "measured here against what is kept");
  }
  if (hit && !publish) S->hits++; /* (a publication is not a client's look-up) */
  else if (!publish) S->misses++;
  if (lookup && !hit) { /* (a lookup starts no job) */
    S->lookups_missed++;
    nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_NOT_FOUND, 0,
                   "lookup: no kernel for this graph and target in the cache");
    nfd_req_finish(r);
    nf_buf_free(&err);
    return;
  }
  send_accepted(c, id, key, hit, busy);
  if (hit) {
    nfd_kernel *k = nfd_kernel_new(key, e.tier, e.schedule, e.time_ms, e.default_ms, e.trials,
                                   e.binary, e.binary_len);
    if (k) memcpy(k->sig, e.sig.sig, 64);
    if (!publish) count_hit(S, key);
    nf_cache_entry_free(&e);
    if (!k) {
      nfd_conn_error(c, id, NEOFLOW__ERROR_CODE__ERR_INTERNAL, 0, "out of memory");
      nfd_req_finish(r);
      nf_buf_free(&err);
      free(canon);
      return;
    }
    r->got_tier = k->tier;
    r->got_ms = k->time_ms;
    nfd_conn_send_kernel(c, id, k, done);
    nfd_kernel_unref(k);
    if (c->state == ST_CLOSING || c->doomed) {
      nf_buf_free(&err);
      free(canon);
      return;
    }
    if (done) {
      nfd_req_finish(r);
      nf_buf_free(&err);
      free(canon);
      return;
    }
  }
  /* a job: compile (miss), or tune (tier-1 hit, TUNE mode) */
  uint8_t *pb = malloc(protobuf_c_message_get_packed_size(&s->graph->base) + 1);
  size_t pb_len = pb ? protobuf_c_message_pack(&s->graph->base, pb) : 0;
  rc = pb ? nfd_job_subscribe(S, r, ghash, s->graph->name, pb, pb_len, &shape, hit, trials,
                              clampi((int)s->max_seconds, S->cfg.default_seconds, S->cfg.max_seconds),
                              canon)
          : NF_ENOMEM;
  free(pb);
  free(canon);
  if (rc != NF_OK) {
    nfd_conn_error(c, id,
                   rc == NF_ELIMIT ? NEOFLOW__ERROR_CODE__ERR_BUSY : NEOFLOW__ERROR_CODE__ERR_INTERNAL,
                   0, rc == NF_ELIMIT ? "the job queue is full (max_queued_jobs): try later"
                                      : "out of memory");
    nfd_req_finish(r);
  }
  nf_buf_free(&err);
  nfd_jobs_schedule(S);
}

static void on_cancel(nfd_conn *c, const Neoflow__Cancel *m) {
  nfd_req *r = find_req(c, m->request_id);
  if (!r) {
    nfd_conn_error(c, m->request_id, NEOFLOW__ERROR_CODE__ERR_NOT_FOUND, 0,
                   "cancel: no open request %llu", (unsigned long long)m->request_id);
    return;
  }
  nfd_job_unsubscribe(r);
  nfd_req_finish(r);
  nfd_jobs_schedule(c->S); /* a detached search may give its slot */
}

/* Each open request's step time, and its weight: its time over the mean
 * of every subgraph the report lists (a client lists its finished ones
 * too: the budget of its open ones is its share of the whole step). */
static void on_step_times(nfd_conn *c, const Neoflow__StepTimes *m) {
  double total = 0;
  size_t n = 0;
  for (size_t i = 0; i < m->n_ms; i++)
    if (m->ms[i] > 0) {
      total += m->ms[i];
      n++;
    }
  double mean = n ? total / (double)n : 0;
  c->step_ms = isfinite(total) && total < 1e12 ? total : 0; /* (status must stay valid) */
  for (size_t i = 0; i < m->n_request_id; i++) {
    nfd_req *r = find_req(c, m->request_id[i]);
    if (!r) continue;
    r->step_ms = m->ms[i];
    r->step_weight = mean > 0 ? m->ms[i] / mean : 0;
  }
}

static void on_status(nfd_conn *c) {
  nfd_server *S = c->S;
  Neoflow__StatusReply st = NEOFLOW__STATUS_REPLY__INIT;
  st.daemon_version = (char *)NF_VERSION;
  st.pid = (uint32_t)getpid();
  double now = nfd_now();
  st.uptime_s = now - S->t_start;
  st.cache_hits = S->hits;
  st.upstream = S->cfg.upstream_address;
  st.upstream_kernels = S->upstream_kernels;
  st.lookups_missed = S->lookups_missed;
  st.upstream_published = S->upstream_published;
  st.published_received = S->published_received;
  st.published_kept = S->published_kept;
  st.cache_misses = S->misses;
  st.jobs_done = S->jobs_done;
  st.jobs_failed = S->jobs_failed;
  st.jobs_cancelled = S->jobs_cancelled;
  st.connections_refused = S->refused;
  st.timeouts = S->timeouts;
  st.emfile_closes = S->emfile;
  st.cache_busy = __atomic_load_n(&S->cache_busy, __ATOMIC_RELAXED);
  st.slower_reports = S->slower_reports;
  st.retunes = S->retunes;
  char cache_path[NF_WIRE_TEXT_MAX + 1];
  snprintf(cache_path, sizeof cache_path, "%s", S->cache ? nf_cache_path(S->cache) : "");
  st.cache_path = nf_wire_text_sanitize(cache_path, NF_WIRE_TEXT_MAX, 0);
  nf_cache_stats cs;
  nf_buf err = NF_BUF_INIT;
  if (S->cache && nf_cache_stats_get(S->cache, &cs, &err) == NF_OK) {
    st.cache_entries = (uint64_t)cs.entries;
    st.quarantined = (uint64_t)cs.quarantined;
    st.cache_bytes = (uint64_t)cs.file_bytes;
  }
  nf_buf_free(&err);
  size_t n = 0;
  for (nfd_conn *k = S->conns; k; k = k->next)
    if (k->state == ST_READY) n++;
  Neoflow__ClientInfo *ci = calloc(n ? n : 1, sizeof *ci);
  Neoflow__ClientInfo **cp = calloc(n ? n : 1, sizeof *cp);
  if (ci && cp) {
    size_t i = 0;
    for (nfd_conn *k = S->conns; k && i < n; k = k->next) {
      if (k->state != ST_READY) continue;
      neoflow__client_info__init(&ci[i]);
      ci[i].session_id = k->session;
      ci[i].name = k->name;
      ci[i].pid = (uint32_t)k->pid;
      ci[i].uid = (uint32_t)k->uid;
      ci[i].transport = k->tcp ? (char *)"tcp" : (char *)"unix";
      ci[i].requests = (uint32_t)k->n_reqs;
      ci[i].connected_s = now - k->t_connect;
      ci[i].step_ms = k->step_ms;
      cp[i] = &ci[i];
      i++;
    }
    st.n_clients = i;
    st.clients = cp;
  }
  nfd_jobs_status(S, &st);
  Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
  m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_STATUS;
  m.status = &st;
  nfd_conn_send(c, &m);
  nfd_jobs_status_free(&st);
  free(ci);
  free(cp);
}

/* Whether the client's target t is one this daemon compiles for: this
 * machine's CPU (the same fingerprint), or a GPU architecture this
 * build's NVRTC knows, whose fingerprint is consistent with its sm and
 * device name (nf_cuda_target_make).  Fills *out; why says what is not. */
static int hello_target(nfd_server *S, const Neoflow__Target *t, nfd_target *out, char *why,
                        size_t cap) {
  memset(out, 0, sizeof *out);
  if (!t || t->fingerprint.len != 32) {
    snprintf(why, cap, "the client sent no target fingerprint");
    return 0;
  }
  if (t->kind == NEOFLOW__TARGET_KIND__TARGET_CPU) {
    if (memcmp(t->fingerprint.data, S->target.fingerprint, 32) != 0) {
      snprintf(why, cap, "another CPU (%s)", t->description ? t->description : "?");
      return 0;
    }
    memcpy(out->fingerprint, S->target.fingerprint, 32);
    snprintf(out->description, sizeof out->description, "%s", S->target.description);
    snprintf(out->codegen, sizeof out->codegen, "%s", S->codegen_version);
    return 1;
  }
  if (t->kind != NEOFLOW__TARGET_KIND__TARGET_CUDA) {
    snprintf(why, cap, "an unknown target kind %d", (int)t->kind);
    return 0;
  }
  if (t->cuda_sm < 10 || t->cuda_sm > 10000) {
    snprintf(why, cap, "a CUDA target without a valid architecture (sm %u)", t->cuda_sm);
    return 0;
  }
  nf_host_target ct;
  nf_cuda_target_make((int)t->cuda_sm, t->description, &ct);
  if (memcmp(ct.fingerprint, t->fingerprint.data, 32) != 0) {
    snprintf(why, cap, "a CUDA target whose fingerprint does not match its sm and device name");
    return 0;
  }
  nf_buf w = NF_BUF_INIT;
  if (!nf_cuda_sm_supported((int)t->cuda_sm, &w)) {
    snprintf(why, cap, "%s", nf_buf_str(&w));
    nf_buf_free(&w);
    return 0;
  }
  nf_buf_free(&w);
  out->cuda_sm = (int)t->cuda_sm;
  snprintf(out->cuda_name, sizeof out->cuda_name, "%s", t->description ? t->description : "");
  memcpy(out->fingerprint, ct.fingerprint, 32);
  snprintf(out->description, sizeof out->description, "%s", ct.description);
  snprintf(out->codegen, sizeof out->codegen, "%s", S->cuda_codegen);
  return 1;
}

static void on_hello(nfd_conn *c, const Neoflow__Hello *h) {
  nfd_server *S = c->S;
  uint32_t lo = h->protocol_min > NF_WIRE_PROTOCOL_MIN ? h->protocol_min : NF_WIRE_PROTOCOL_MIN;
  uint32_t hi = h->protocol_max < NF_WIRE_PROTOCOL_MAX ? h->protocol_max : NF_WIRE_PROTOCOL_MAX;
  if (lo > hi) {
    nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_VERSION, 1,
                   "hello: the client speaks protocol %u..%u, this daemon %u..%u",
                   h->protocol_min, h->protocol_max, NF_WIRE_PROTOCOL_MIN, NF_WIRE_PROTOCOL_MAX);
    return;
  }
  uint8_t smac[NF_AUTH_MAC], tr[32], proof[64];
  int auth = c->tcp && S->have_tcp_key;
  if (c->tcp) {
    /* the key exchange that protects the rest of the stream (nf_wire_box.h) */
    if (h->client_nonce.len != NF_AUTH_NONCE || h->client_ephemeral.len != 32) {
      S->refused++;
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_UNAUTHENTICATED, 1,
                     "hello: on TCP this daemon needs the key exchange (client_nonce, "
                     "client_ephemeral): a neoflow client older than this daemon?");
      return;
    }
    static const uint8_t none[32];
    nf_box_transcript(c->server_nonce, c->eph_pk, h->client_nonce.data, h->client_ephemeral.data,
                      h->target && h->target->fingerprint.len == 32 ? h->target->fingerprint.data
                                                                    : none,
                      tr);
    nf_sign_transcript(S->sign_sk, tr, proof);
  }
  if (auth) {
    uint8_t want[NF_AUTH_MAC];
    if (h->mac.len != NF_AUTH_MAC) {
      S->refused++;
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_UNAUTHENTICATED, 1,
                     "hello: this daemon requires the key's challenge-response on TCP");
      return;
    }
    nf_auth_client_mac(S->tcp_key, tr, want);
    if (!nf_auth_mac_equal(want, h->mac.data)) {
      S->refused++;
      NFD_WARN("session %llu: TCP client failed authentication", (unsigned long long)c->session);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_UNAUTHENTICATED, 1,
                     "hello: authentication failed (wrong key)");
      return;
    }
    nf_auth_server_mac(S->tcp_key, tr, smac);
  }
  snprintf(c->name, sizeof c->name, "%s", h->client_name ? h->client_name : "");
  if (c->tcp) c->pid = (pid_t)h->pid; /* a claim, for display only */
  char why[NF_WIRE_TEXT_MAX] = "";
  c->target_ok = hello_target(S, h->target, &c->target, why, sizeof why);
  c->state = ST_READY;
  nf_frame_reader_set_max(&c->rd, NF_WIRE_FRAME_MAX);

  /* the session's target when it is served, else this machine's CPU */
  Neoflow__Target t = NEOFLOW__TARGET__INIT;
  int gpu = c->target_ok && c->target.cuda_sm > 0;
  t.kind = gpu ? NEOFLOW__TARGET_KIND__TARGET_CUDA : NEOFLOW__TARGET_KIND__TARGET_CPU;
  t.fingerprint.data = gpu ? c->target.fingerprint : S->target.fingerprint;
  t.fingerprint.len = 32;
  t.description = gpu ? h->target->description : S->target.description;
  t.cuda_sm = gpu ? (uint32_t)c->target.cuda_sm : 0;
  Neoflow__Welcome w = NEOFLOW__WELCOME__INIT;
  w.protocol = hi;
  w.daemon_version = (char *)NF_VERSION;
  w.target = &t;
  w.session_id = c->session;
  w.signing_key.data = S->sign_pk;
  w.signing_key.len = 32;
  if (c->tcp) {
    w.key_proof.data = proof;
    w.key_proof.len = 64;
  }
  if (auth) {
    w.server_mac.data = smac;
    w.server_mac.len = NF_AUTH_MAC;
  }
  Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
  m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_WELCOME;
  m.welcome = &w;
  nfd_conn_send(c, &m);
  /* from here on every frame either way is sealed */
  if (c->tcp && nf_box_server_keys(&c->box, c->eph_pk, c->eph_sk, h->client_ephemeral.data,
                                   auth ? S->tcp_key : NULL, tr) != NF_OK) {
    S->refused++;
    conn_doom(c, "the client's ephemeral key makes no shared secret");
    return;
  }
  NFD_INFO("session %llu: %s (pid %d, uid %u) over %s%s", (unsigned long long)c->session, c->name,
           (int)c->pid, (unsigned)c->uid, c->tcp ? "tcp" : "unix",
           c->target_ok ? (c->target.cuda_sm ? ", a GPU" : "") : ", other target: status only");
  if (!c->target_ok)
    NFD_INFO("session %llu: target not served: %s", (unsigned long long)c->session, why);
  else if (c->target.cuda_sm)
    NFD_INFO("session %llu: compiles for %s", (unsigned long long)c->session,
             c->target.description);
}

/* One complete frame from c. */
static void on_frame(nfd_conn *c, const uint8_t *p, size_t n) {
  nf_wire_err e;
  uint8_t *pt = NULL;
  if (c->box.on) {
    /* a sealed frame: one that fails its tag (changed, replayed,
     * reordered, cut) ends the connection, unanswered */
    if (!(pt = malloc(n ? n : 1))) {
      conn_doom(c, "out of memory");
      return;
    }
    if (nf_box_open(&c->box, p, n, pt, &n) != NF_OK) {
      free(pt);
      c->S->refused++;
      NFD_WARN("session %llu (%s): a TCP frame failed its authentication: dropped",
               (unsigned long long)c->session, c->name);
      conn_doom(c, NULL);
      return;
    }
    p = pt;
  }
  Neoflow__ClientMessage *m = nf_wire_decode_client(p, n, &e);
  free(pt);
  if (!m) {
    nfd_conn_error(c, 0, e.code ? e.code : NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1, "%s",
                   e.msg);
    return;
  }
  if (c->state == ST_HANDSHAKE) {
    if (m->msg_case != NEOFLOW__CLIENT_MESSAGE__MSG_HELLO)
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1,
                     "the first message must be a Hello");
    else
      on_hello(c, m->hello);
    nf_wire_free_client(m);
    return;
  }
  switch (m->msg_case) {
    case NEOFLOW__CLIENT_MESSAGE__MSG_HELLO:
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1,
                     "hello: the session is already open");
      break;
    case NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT: on_submit(c, m->submit); break;
    case NEOFLOW__CLIENT_MESSAGE__MSG_CANCEL: on_cancel(c, m->cancel); break;
    case NEOFLOW__CLIENT_MESSAGE__MSG_STEP_TIMES:
      on_step_times(c, m->step_times);
      nfd_jobs_schedule(c->S);
      break;
    case NEOFLOW__CLIENT_MESSAGE__MSG_STATUS: on_status(c); break;
    case NEOFLOW__CLIENT_MESSAGE__MSG_PING: {
      Neoflow__Pong pong = NEOFLOW__PONG__INIT;
      pong.token = m->ping->token;
      Neoflow__ServerMessage r = NEOFLOW__SERVER_MESSAGE__INIT;
      r.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_PONG;
      r.pong = &pong;
      nfd_conn_send(c, &r);
      break;
    }
    default:
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1, "unknown message");
      break;
  }
  nf_wire_free_client(m);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  *buf = uv_buf_init((char *)rx_buf, sizeof rx_buf);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  nfd_conn *c = st->data;
  if (nread < 0) {
    if (nread == UV_EOF && nf_frame_reader_mid_frame(&c->rd)) {
      NFD_INFO("session %llu (%s): truncated frame (EOF after %u of %u bytes)",
               (unsigned long long)c->session, c->name, c->rd.got, c->rd.len);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_TRUNCATED, 1,
                     "end of stream in the middle of a frame");
    }
    conn_close(c, nread == UV_EOF ? NULL : uv_strerror((int)nread));
    return;
  }
  c->t_last_rx = nfd_now();
  const uint8_t *p = (const uint8_t *)buf->base;
  size_t n = (size_t)nread;
  while (n > 0 && c->state != ST_CLOSING) {
    size_t used = 0, flen = 0;
    const uint8_t *frame = NULL;
    int was_mid = nf_frame_reader_mid_frame(&c->rd);
    int rc = nf_frame_reader_feed(&c->rd, p, n, &used, &frame, &flen);
    p += used;
    n -= used;
    if (rc == 1) c->t_frame = 0;
    else if (!was_mid && nf_frame_reader_mid_frame(&c->rd)) c->t_frame = c->t_last_rx;
    if (rc == 1) {
      on_frame(c, frame, flen);
    } else if (rc == NF_ELIMIT) {
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_FRAME_TOO_LARGE, 1,
                     "frame of %u bytes exceeds the limit of %u bytes%s", c->rd.len, c->rd.max,
                     c->state == ST_HANDSHAKE ? " before the handshake" : "");
      return;
    } else if (rc < 0) {
      conn_close(c, "out of memory");
      return;
    }
  }
}

/* ---- accepting ---- */

static void on_connection(uv_stream_t *ls, int status) {
  nfd_listener *L = ls->data;
  nfd_server *S = L->S;
  if (status < 0) {
    /* EMFILE/ENFILE: libuv accepts on its reserved descriptor and closes
     * the connection at once (no busy loop); counted, said once a burst */
    if (status == UV_EMFILE || status == UV_ENFILE) {
      S->emfile++;
      nfd_burst_log(&S->burst_emfile, "out of file descriptors: a connection was closed unserved "
                                      "(%llu so far; raise LimitNOFILE or lower max_connections)",
                    (unsigned long long)S->emfile);
    } else {
      NFD_WARN("accept: %s", uv_strerror(status));
    }
    return;
  }
  nfd_conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->S = S;
  c->tcp = L->tcp;
  int rc = L->tcp ? uv_tcp_init(S->loop, &c->h.tcp) : uv_pipe_init(S->loop, &c->h.pipe, 0);
  if (rc != 0) {
    free(c);
    return;
  }
  c->h.handle.data = c;
  c->session = ++S->next_session;
  snprintf(c->name, sizeof c->name, "?");
  c->t_connect = c->t_last_rx = c->t_last_tx = nfd_now();
  nf_frame_reader_init(&c->rd, NF_WIRE_HANDSHAKE_MAX);
  c->next = S->conns;
  if (S->conns) S->conns->prev = c;
  S->conns = c;
  S->n_conns++;
  if (uv_accept(ls, &c->h.stream) != 0) {
    c->state = ST_CLOSING;
    uv_close(&c->h.handle, on_closed);
    return;
  }
  if (c->tcp) {
    uv_tcp_nodelay(&c->h.tcp, 1);
    uv_tcp_keepalive(&c->h.tcp, 1, 300);
  }
  uv_os_fd_t fd = -1;
  uv_fileno(&c->h.handle, &fd);
  /* descriptors run short: refuse with BUSY while a few remain for jobs,
   * the cache and the log (past the last one libuv's reserve closes
   * connections unseen) */
  struct rlimit nl;
  if (fd >= 0 && getrlimit(RLIMIT_NOFILE, &nl) == 0 && nl.rlim_cur != RLIM_INFINITY &&
      (rlim_t)fd + NFD_FD_HEADROOM >= nl.rlim_cur) {
    S->emfile++;
    nfd_burst_log(&S->burst_emfile, "out of file descriptors (%d of %llu in use): a connection "
                                    "refused (raise LimitNOFILE or lower max_connections)",
                  (int)fd, (unsigned long long)nl.rlim_cur);
    nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_BUSY, 1,
                   "the daemon is out of file descriptors: try later");
    return;
  }
  if (!c->tcp) {
    uid_t uid = (uid_t)-1;
    pid_t pid = 0;
    if (nfd_peer_cred(fd, &uid, &pid) != NF_OK || !nfd_uid_allowed(&S->cfg, uid)) {
      S->refused++;
      NFD_WARN("refused a connection from uid %d (pid %d): not allowed", (int)uid, (int)pid);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_UNAUTHENTICATED, 1,
                     "uid %d may not use this daemon", (int)uid);
      return;
    }
    c->uid = uid;
    c->pid = pid;
  }
  /* one user (or TCP peer address) may not hold every slot */
  if (!S->shutting_down && S->n_conns <= S->cfg.max_connections) {
    char peer[64] = "";
    if (c->tcp) {
      struct sockaddr_storage ss;
      int len = sizeof ss;
      if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0)
        uv_ip_name((struct sockaddr *)&ss, peer, sizeof peer);
      snprintf(c->peer, sizeof c->peer, "%s", peer);
    }
    int same = 0;
    for (nfd_conn *k = S->conns; k; k = k->next)
      if (k != c && k->state != ST_CLOSING &&
          (c->tcp ? k->tcp && !strcmp(k->peer, c->peer) : !k->tcp && k->uid == c->uid))
        same++;
    if (same >= S->cfg.max_connections_per_uid) {
      S->refused++;
      char who[96];
      if (c->tcp) snprintf(who, sizeof who, "address %s", c->peer);
      else snprintf(who, sizeof who, "uid %u", (unsigned)c->uid);
      nfd_burst_log(&S->burst_refused, "refused a connection from %s: it holds %d already "
                                       "(max_connections_per_uid)", who, same);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_BUSY, 1,
                     "too many connections from this %s (%d; max_connections_per_uid)",
                     c->tcp ? "address" : "user", same);
      return;
    }
  }
  if (S->n_conns > S->cfg.max_connections || S->shutting_down) {
    S->refused++;
    nfd_conn_error(c, 0,
                   S->shutting_down ? NEOFLOW__ERROR_CODE__ERR_SHUTTING_DOWN
                                    : NEOFLOW__ERROR_CODE__ERR_BUSY,
                   1, S->shutting_down ? "the daemon is shutting down"
                                       : "too many connections (max_connections)");
    return;
  }
  if (c->tcp) {
    /* always on TCP, so a client knows at once whether a key is wanted */
    nf_auth_nonce(c->server_nonce);
    nf_box_ephemeral(c->eph_pk, c->eph_sk);
    Neoflow__Challenge ch = NEOFLOW__CHALLENGE__INIT;
    ch.server_nonce.data = c->server_nonce;
    ch.server_nonce.len = NF_AUTH_NONCE;
    ch.server_ephemeral.data = c->eph_pk;
    ch.server_ephemeral.len = 32;
    Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
    m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_CHALLENGE;
    m.challenge = &ch;
    nfd_conn_send(c, &m);
  }
  if (c->state != ST_CLOSING) uv_read_start(&c->h.stream, on_alloc, on_read);
}

/* ---- the tick: deadlines and limits ---- */

static void on_tick(uv_timer_t *t) {
  nfd_server *S = t->data;
  double now = nfd_now();
  const nfd_config *cf = &S->cfg;
  nfd_conn *next;
  for (nfd_conn *c = S->conns; c; c = next) {
    next = c->next;
    if (c->state == ST_CLOSING) {
      if (now - c->t_close > 2.0 && !uv_is_closing(&c->h.handle)) uv_close(&c->h.handle, on_closed);
      continue;
    }
    if (c->doomed) {
      conn_close(c, NULL);
      continue;
    }
    if (c->state == ST_HANDSHAKE && (now - c->t_connect) * 1000 > cf->handshake_timeout_ms) {
      S->timeouts++;
      nfd_burst_log(&S->burst_timeout, "session %llu: no handshake within %d ms: closed",
                    (unsigned long long)c->session, cf->handshake_timeout_ms);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_TIMEOUT, 1,
                     "no complete Hello within %d ms", cf->handshake_timeout_ms);
      continue;
    }
    if (nf_frame_reader_mid_frame(&c->rd) && (now - c->t_last_rx) * 1000 > cf->progress_timeout_ms) {
      S->timeouts++;
      nfd_burst_log(&S->burst_timeout, "session %llu (%s): frame stalled: closed",
                    (unsigned long long)c->session, c->name);
      nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_TIMEOUT, 1,
                     "no data for %d ms in the middle of a frame", cf->progress_timeout_ms);
      continue;
    }
    /* a frame dripped in (a byte now and then resets the stall timer):
     * after the grace, it must arrive at min_frame_rate */
    if (nf_frame_reader_mid_frame(&c->rd) && c->t_frame > 0 && cf->min_frame_rate > 0) {
      double got = c->rd.n_hdr == 4 ? (double)c->rd.got + 4 : c->rd.n_hdr;
      double want = c->rd.n_hdr == 4 ? (double)c->rd.len + 4 : 4;
      double late = now - c->t_frame - cf->progress_timeout_ms / 1000.0;
      /* by now at least min_frame_rate bytes a second since the grace */
      if (late > 0 && got < want && got < late * cf->min_frame_rate) {
        S->timeouts++;
        nfd_burst_log(&S->burst_timeout, "session %llu (%s): a frame of %.0f bytes has %.0f "
                                         "after %.0f s (below min_frame_rate): closed",
                      (unsigned long long)c->session, c->name, want, got, now - c->t_frame);
        nfd_conn_error(c, 0, NEOFLOW__ERROR_CODE__ERR_TIMEOUT, 1,
                       "a frame arriving slower than %d bytes/s (min_frame_rate)",
                       cf->min_frame_rate);
        continue;
      }
    }
    if ((int64_t)c->out_pending >= cf->output_soft_limit) {
      if (c->t_soft_since == 0) c->t_soft_since = now;
      else if (now - c->t_soft_since > cf->output_soft_seconds) {
        S->timeouts++;
        NFD_WARN("session %llu (%s): slow reader: %zu bytes unread for over %d s: dropped",
                 (unsigned long long)c->session, c->name, c->out_pending, cf->output_soft_seconds);
        conn_close(c, NULL);
        continue;
      }
    } else {
      c->t_soft_since = 0;
    }
    double quiet = now - (c->t_last_rx > c->t_last_tx ? c->t_last_rx : c->t_last_tx);
    if (cf->idle_timeout_s > 0 && c->n_reqs == 0 && quiet > cf->idle_timeout_s) {
      Neoflow__Goodbye g = NEOFLOW__GOODBYE__INIT;
      g.reason = (char *)"idle timeout";
      Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
      m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE;
      m.goodbye = &g;
      nfd_conn_send(c, &m);
      S->timeouts++;
      conn_close(c, "idle");
    }
  }
  nfd_jobs_tick(S, now);
  if (S->n_touch && now - S->t_touch_flush > 1.0) flush_touches(S);
  if (S->shutting_down && !S->conns && !nfd_jobs_busy(S)) uv_stop(S->loop);
}

/* ---- signals and shutdown ---- */

static void begin_shutdown(nfd_server *S, const char *why) {
  if (S->shutting_down) return;
  S->shutting_down = 1;
  NFD_INFO("shutting down (%s)", why);
  for (int i = 0; i < S->n_listeners; i++)
    if (S->listeners[i].open) {
      S->listeners[i].open = 0;
      uv_close(&S->listeners[i].h.handle, NULL);
    }
  if (S->unix_path[0]) unlink(S->unix_path);
  flush_touches(S);
  nfd_jobs_shutdown(S);
  nfd_conn *next;
  for (nfd_conn *c = S->conns; c; c = next) {
    next = c->next;
    if (c->state == ST_CLOSING) continue;
    Neoflow__Goodbye g = NEOFLOW__GOODBYE__INIT;
    g.reason = (char *)"the daemon is shutting down";
    Neoflow__ServerMessage m = NEOFLOW__SERVER_MESSAGE__INIT;
    m.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE;
    m.goodbye = &g;
    nfd_conn_send(c, &m);
    conn_close(c, NULL);
  }
}

static void on_signal(uv_signal_t *h, int signum) {
  nfd_server *S = h->data;
  if (signum == SIGHUP) {
    nfd_config nc;
    nfd_config_defaults(&nc);
    nf_buf err = NF_BUF_INIT;
    int rc = S->cfg.config_path[0] ? nfd_config_load(&nc, S->cfg.config_path, &err) : NF_OK;
    if (rc == NF_OK) rc = nfd_config_check(&nc, &err);
    if (rc != NF_OK) {
      NFD_ERROR("SIGHUP: keeping the old configuration: %s", nf_buf_str(&err));
    } else {
      if (strcmp(nc.socket_path, S->cfg.socket_path) || strcmp(nc.cache_path, S->cfg.cache_path) ||
          strcmp(nc.tcp_listen, S->cfg.tcp_listen) || strcmp(nc.tcp_key_file, S->cfg.tcp_key_file))
        NFD_WARN("SIGHUP: socket, cache and tcp settings take effect at the next start");
      /* keep what cannot change while running */
      memcpy(nc.socket_path, S->cfg.socket_path, sizeof nc.socket_path);
      memcpy(nc.cache_path, S->cfg.cache_path, sizeof nc.cache_path);
      memcpy(nc.tcp_listen, S->cfg.tcp_listen, sizeof nc.tcp_listen);
      memcpy(nc.tcp_key_file, S->cfg.tcp_key_file, sizeof nc.tcp_key_file);
      memcpy(nc.socket_group, S->cfg.socket_group, sizeof nc.socket_group);
      nc.allow_network_fs = S->cfg.allow_network_fs;
      S->cfg = nc;
      nfd_verbosity = nc.log_level;
      NFD_INFO("SIGHUP: configuration reloaded from %s",
               S->cfg.config_path[0] ? S->cfg.config_path : "(defaults)");
      nfd_jobs_schedule(S);
    }
    nf_buf_free(&err);
    return;
  }
  begin_shutdown(S, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

int nfd_server_run(nfd_server *S) {
  S->t_start = nfd_now();
  uv_timer_init(S->loop, &S->tick);
  S->tick.data = S;
  uv_timer_start(&S->tick, on_tick, 100, 100);
  uv_signal_init(S->loop, &S->sig_term);
  uv_signal_init(S->loop, &S->sig_int);
  uv_signal_init(S->loop, &S->sig_hup);
  S->sig_term.data = S->sig_int.data = S->sig_hup.data = S;
  uv_signal_start(&S->sig_term, on_signal, SIGTERM);
  uv_signal_start(&S->sig_int, on_signal, SIGINT);
  uv_signal_start(&S->sig_hup, on_signal, SIGHUP);
  for (int i = 0; i < S->n_listeners; i++) {
    nfd_listener *L = &S->listeners[i];
    L->S = S;
    L->h.handle.data = L;
    int rc = uv_listen(&L->h.stream, 511, on_connection);
    if (rc != 0) {
      NFD_ERROR("listen: %s", uv_strerror(rc));
      return NF_EIO;
    }
  }
  uv_run(S->loop, UV_RUN_DEFAULT);
  /* stopped: close what is left and let the callbacks run */
  uv_walk(S->loop, close_walk, NULL);
  uv_run(S->loop, UV_RUN_DEFAULT);
  return NF_OK;
}
