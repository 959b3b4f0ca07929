/* test_proto.c - tests of the wire protocol's C side (proto/nf_wire.h):
 *
 *  - the frame reader fed byte by byte, in one chunk, several frames per
 *    feed; zero-length frames; a lying length (0xFFFFFFF0) refused before
 *    anything is allocated, and the stream staying refused; the limit
 *    switched from the handshake's to the normal one;
 *  - the blocking helpers on socketpairs and pipes: a round trip, a big
 *    frame through a pipe, a truncated frame (NF_EFORMAT), a clean EOF
 *    (NF_ENOENT), an over-limit length (NF_ELIMIT), read and write
 *    timeouts, a write to a closed peer (NF_EIO, no SIGPIPE);
 *  - pack/decode round trips of every message kind (the repacked bytes
 *    equal the original ones);
 *  - rejection, with the field's path in the message: unknown fields (at
 *    the top, nested, and in a submessage protobuf-c merged away), unknown
 *    enum values, an unset oneof, over-long strings, invalid UTF-8,
 *    control characters, NULs inside strings, wrong-length keys, NaN and
 *    negative times, oversized chunks and binaries, mismatched arrays,
 *    missing required submessages, counts over the limits; text made
 *    acceptable by nf_wire_text_sanitize;
 *  - random bytes and mutated valid messages: never a crash, every failure
 *    has a code and a message, every success repacks and decodes again;
 *  - amplification: a 4 MiB frame of tiny repeated submessages, a
 *    submessage repeated a million times (protobuf-c's quadratic merge)
 *    and deep nesting all fail cleanly on the budget; a large legitimate
 *    graph fits in it;
 *  - graphs: every def of lib/nn.nf and the workloads of
 *    examples/workloads.nf, their gradient graphs, and a hand-made graph
 *    with every operator go IR -> wire -> bytes -> wire -> IR with the
 *    same nf_graph_hash, names and input/output order (a -0.0 constant
 *    included); a table of invalid wire graphs is rejected by
 *    nf_wire_graph_to_ir with the expected message (never an assertion);
 *    statements sharing one huge expression are refused past the bound
 *    on per-statement work;
 *  - the validator (issue 31): a 300,000-deep chain is refused on the
 *    wire list (and a chain at NF_MAX_EXPR_DEPTH accepted), and so is a
 *    chain of inlinable producers deeper than that; accesses certainly
 *    evaluated out of bounds are refused naming the statement, the
 *    access, the index and a point, while the same accesses under guards
 *    that exclude the out-of-bounds range, gathers and accesses never
 *    evaluated are accepted, in agreement with the reference interpreter.
 *
 * With NF_WIRE_CORPUS_DIR set, main() also writes a seed corpus for the
 * fuzz_wire target there (see tests/fuzz/fuzz_wire.c for the format). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nf_autodiff.h"
#include "nf_config.h"
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_test_cases.h"
#include "nf_test_graphs.h"
#include "nf_wire.h"

/* ---- helpers ---- */

enum { K_CLIENT, K_SERVER, K_JOB_REQUEST, K_JOB_EVENT, N_KINDS };

static ProtobufCMessage *dec(int kind, const uint8_t *p, size_t n, nf_wire_err *e) {
  switch (kind) {
  case K_CLIENT: return (ProtobufCMessage *)nf_wire_decode_client(p, n, e);
  case K_SERVER: return (ProtobufCMessage *)nf_wire_decode_server(p, n, e);
  case K_JOB_REQUEST: return (ProtobufCMessage *)nf_wire_decode_job_request(p, n, e);
  default: return (ProtobufCMessage *)nf_wire_decode_job_event(p, n, e);
  }
}

static void dfree(int kind, ProtobufCMessage *m) {
  switch (kind) {
  case K_CLIENT: nf_wire_free_client((Neoflow__ClientMessage *)m); break;
  case K_SERVER: nf_wire_free_server((Neoflow__ServerMessage *)m); break;
  case K_JOB_REQUEST: nf_wire_free_job_request((Neoflow__JobRequest *)m); break;
  default: nf_wire_free_job_event((Neoflow__JobEvent *)m); break;
  }
}

/* The packed payload of m (no frame header) in b. */
static void pack_into(const ProtobufCMessage *m, nf_buf *b) {
  nf_buf_reset(b);
  ck_assert_int_eq(nf_wire_pack(m, UINT32_MAX, b), NF_OK);
  ck_assert_uint_ge(b->len, 4);
  memmove(b->data, b->data + 4, b->len - 4);
  b->len -= 4;
}

/* Decodes b as kind, asserting success; the caller frees. */
static ProtobufCMessage *dec_ok(int kind, const nf_buf *b) {
  nf_wire_err e;
  ProtobufCMessage *m = dec(kind, (const uint8_t *)b->data, b->len, &e);
  ck_assert_msg(m != NULL, "decode failed: %s (code %d)", e.msg, e.code);
  ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_NONE);
  return m;
}

/* Packs m, decodes it, checks that the decoded message packs to the same
 * bytes; returns the decoded message (free with dfree). */
static ProtobufCMessage *roundtrip(int kind, const ProtobufCMessage *m) {
  nf_buf a = NF_BUF_INIT, b = NF_BUF_INIT;
  pack_into(m, &a);
  ProtobufCMessage *d = dec_ok(kind, &a);
  pack_into(d, &b);
  ck_assert_uint_eq(a.len, b.len);
  ck_assert(memcmp(a.data, b.data, a.len) == 0);
  nf_buf_free(&a);
  nf_buf_free(&b);
  return d;
}

static void expect_reject_bytes(int kind, const uint8_t *p, size_t n, const char *frag) {
  nf_wire_err e;
  ProtobufCMessage *m = dec(kind, p, n, &e);
  if (m) dfree(kind, m);
  ck_assert_msg(m == NULL, "accepted; expected an error with '%s'", frag);
  ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(e.msg, frag) != NULL, "message '%s' lacks '%s'", e.msg, frag);
}

static void expect_reject(int kind, const ProtobufCMessage *m, const char *frag) {
  nf_buf b = NF_BUF_INIT;
  pack_into(m, &b);
  expect_reject_bytes(kind, (const uint8_t *)b.data, b.len, frag);
  nf_buf_free(&b);
}

/* Hand-made protobuf encodings. */
static void pb_tag(nf_buf *b, uint32_t field, int wt) { nf_buf_uleb(b, (uint64_t)field << 3 | (uint64_t)wt); }
static void pb_varint(nf_buf *b, uint32_t field, uint64_t v) {
  pb_tag(b, field, 0);
  nf_buf_uleb(b, v);
}
static void pb_bytes(nf_buf *b, uint32_t field, const void *p, size_t n) {
  pb_tag(b, field, 2);
  nf_buf_uleb(b, n);
  nf_buf_add(b, p, n);
}

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

/* ---- message fixtures ---- */

static uint8_t key_a[32], key_b[32], nonce_c[32];

static void init_keys(void) {
  for (int i = 0; i < 32; i++) {
    key_a[i] = (uint8_t)(i * 7 + 1);
    key_b[i] = (uint8_t)(255 - i);
    nonce_c[i] = (uint8_t)(i * 13 + 5);
  }
}

static ProtobufCBinaryData bin(uint8_t *p, size_t n) {
  ProtobufCBinaryData d = {n, p};
  return d;
}

/* A small wire graph, mutable for the invalid-graph table:
 *   C[i,j] = A[i,j] + B[i,j]              (C local, 2x3)
 *   D[i] += C[i,k]  for k in [0, 3)       (D output)
 * inputs listed as [B, A] (not tensor order). */
typedef struct wg {
  Neoflow__Graph g;
  Neoflow__Tensor t[4];
  Neoflow__Tensor *tp[4];
  int64_t shape[4][NF_MAX_RANK + 1];
  Neoflow__Expr x[6];
  Neoflow__Expr *xp[6];
  uint32_t args[6][3];
  Neoflow__Stmt s[2];
  Neoflow__Stmt *sp[2];
  int64_t red_lo[2][NF_MAX_VARS], red_ext[2][NF_MAX_VARS];
  uint32_t inputs[4], outputs[4];
  char long_name[80];
} wg;

static void wg_init(wg *w) {
  memset(w, 0, sizeof(*w));
  static const char *names[4] = {"A", "B", "C", "D"};
  static const int kinds[4] = {NEOFLOW__TENSOR_KIND__TK_INPUT, NEOFLOW__TENSOR_KIND__TK_INPUT,
                               NEOFLOW__TENSOR_KIND__TK_LOCAL, NEOFLOW__TENSOR_KIND__TK_OUTPUT};
  neoflow__graph__init(&w->g);
  w->g.name = "small";
  for (int i = 0; i < 4; i++) {
    neoflow__tensor__init(&w->t[i]);
    w->tp[i] = &w->t[i];
    w->t[i].dtype = NEOFLOW__DTYPE__DT_F32;
    w->t[i].kind = (Neoflow__TensorKind)kinds[i];
    w->t[i].name = (char *)names[i];
    w->t[i].shape = w->shape[i];
    w->shape[i][0] = 2;
    w->shape[i][1] = 3;
    w->t[i].n_shape = i == 3 ? 1 : 2;
  }
  for (int i = 0; i < 6; i++) {
    neoflow__expr__init(&w->x[i]);
    w->xp[i] = &w->x[i];
    w->x[i].args = w->args[i];
  }
  w->x[0].op = NEOFLOW__OP__OP_VAR;
  w->x[0].dtype = NEOFLOW__DTYPE__DT_I64;
  w->x[1].op = NEOFLOW__OP__OP_VAR;
  w->x[1].dtype = NEOFLOW__DTYPE__DT_I64;
  w->x[1].var = 1;
  for (int k = 2; k <= 5; k++) w->x[k].dtype = NEOFLOW__DTYPE__DT_F32;
  w->x[2].op = NEOFLOW__OP__OP_ACCESS;
  w->x[2].tensor = 0;
  w->x[3].op = NEOFLOW__OP__OP_ACCESS;
  w->x[3].tensor = 1;
  w->x[5].op = NEOFLOW__OP__OP_ACCESS;
  w->x[5].tensor = 2;
  for (int k = 2; k <= 5; k++) {
    w->x[k].n_args = 2;
    w->args[k][0] = 0;
    w->args[k][1] = 1;
  }
  w->x[4].op = NEOFLOW__OP__OP_ADD;
  w->args[4][0] = 2;
  w->args[4][1] = 3;
  for (int i = 0; i < 2; i++) {
    neoflow__stmt__init(&w->s[i]);
    w->sp[i] = &w->s[i];
    w->s[i].red_lo = w->red_lo[i];
    w->s[i].red_ext = w->red_ext[i];
  }
  w->s[0].out = 2;
  w->s[0].rhs = 4;
  w->s[1].out = 3;
  w->s[1].rhs = 5;
  w->s[1].red = NEOFLOW__RED_OP__RED_SUM;
  w->s[1].n_red_lo = w->s[1].n_red_ext = 1;
  w->red_ext[1][0] = 3;
  w->inputs[0] = 1;
  w->inputs[1] = 0;
  w->outputs[0] = 3;
  w->g.tensors = w->tp;
  w->g.n_tensors = 4;
  w->g.exprs = w->xp;
  w->g.n_exprs = 6;
  w->g.stmts = w->sp;
  w->g.n_stmts = 2;
  w->g.inputs = w->inputs;
  w->g.n_inputs = 2;
  w->g.outputs = w->outputs;
  w->g.n_outputs = 1;
}

static void target_init(Neoflow__Target *t) {
  neoflow__target__init(t);
  t->kind = NEOFLOW__TARGET_KIND__TARGET_CPU;
  t->fingerprint = bin(key_a, 32);
  t->description = "x86_64 Test CPU, 2 CPUs, avx2 fma";
}

/* Every message kind, filled with non-default values.  fixture(kind, i)
 * fills the i-th example of a kind into storage that lives in fx. */
typedef struct fixtures {
  wg w;
  Neoflow__Target target;
  Neoflow__Hello hello;
  Neoflow__Submit submit;
  Neoflow__Cancel cancel;
  uint64_t st_ids[3];
  double st_ms[3];
  Neoflow__StepTimes step_times;
  Neoflow__StatusRequest status_req;
  Neoflow__Ping ping;
  Neoflow__ClientMessage cm;
  Neoflow__Challenge challenge;
  Neoflow__Welcome welcome;
  Neoflow__Accepted accepted;
  Neoflow__KernelUpdate kernel;
  uint8_t chunk_data[1000];
  Neoflow__Chunk chunk;
  Neoflow__Progress progress;
  Neoflow__ClientInfo ci[2], *cip[2];
  Neoflow__JobInfo ji[1], *jip[1];
  Neoflow__StatusReply status;
  Neoflow__Error error;
  Neoflow__Pong pong;
  Neoflow__Goodbye goodbye;
  Neoflow__ServerMessage sm;
  float feats[8];
  Neoflow__Record rec[2], *recp[2];
  Neoflow__JobRequest jr;
  uint8_t binary[3000];
  Neoflow__JobKernel jk;
  Neoflow__JobPublished jp;
  Neoflow__JobEvent je;
} fixtures;

#define N_CLIENT_EX 7
#define N_SERVER_EX 10
#define N_JOB_EVENT_EX 5

static void fx_client(fixtures *f, int i) {
  neoflow__client_message__init(&f->cm);
  switch (i) {
  case 0:
  case 1:
    neoflow__hello__init(&f->hello);
    target_init(&f->target);
    f->hello.protocol_min = 1;
    f->hello.protocol_max = 3;
    f->hello.client_name = "train.py";
    f->hello.pid = 4242;
    f->hello.target = &f->target;
    if (i == 1) { /* TCP: nonce and MAC */
      f->hello.client_nonce = bin(nonce_c, 32);
      f->hello.client_ephemeral = bin(key_b, 32);
      f->hello.mac = bin(key_b, 32);
    }
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_HELLO;
    f->cm.hello = &f->hello;
    break;
  case 2:
    neoflow__submit__init(&f->submit);
    wg_init(&f->w);
    f->submit.request_id = 77;
    f->submit.graph = &f->w.g;
    f->submit.mode = NEOFLOW__MODE__MODE_TUNE;
    f->submit.max_trials = 100;
    f->submit.max_seconds = 30;
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    f->cm.submit = &f->submit;
    break;
  case 3:
    neoflow__cancel__init(&f->cancel);
    f->cancel.request_id = 77;
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_CANCEL;
    f->cm.cancel = &f->cancel;
    break;
  case 4:
    neoflow__step_times__init(&f->step_times);
    for (int k = 0; k < 3; k++) {
      f->st_ids[k] = (uint64_t)k + 1;
      f->st_ms[k] = 0.5 * k;
    }
    f->step_times.n_request_id = f->step_times.n_ms = 3;
    f->step_times.request_id = f->st_ids;
    f->step_times.ms = f->st_ms;
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STEP_TIMES;
    f->cm.step_times = &f->step_times;
    break;
  case 5:
    neoflow__status_request__init(&f->status_req);
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STATUS;
    f->cm.status = &f->status_req;
    break;
  default:
    neoflow__ping__init(&f->ping);
    f->ping.token = 0xdeadbeef;
    f->cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_PING;
    f->cm.ping = &f->ping;
    break;
  }
}

static void fx_server(fixtures *f, int i) {
  neoflow__server_message__init(&f->sm);
  switch (i) {
  case 0:
    neoflow__challenge__init(&f->challenge);
    f->challenge.server_nonce = bin(nonce_c, 32);
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_CHALLENGE;
    f->sm.challenge = &f->challenge;
    break;
  case 1:
    neoflow__welcome__init(&f->welcome);
    target_init(&f->target);
    f->welcome.protocol = 1;
    f->welcome.daemon_version = "0.1.0";
    f->welcome.target = &f->target;
    f->welcome.session_id = 99;
    f->welcome.server_mac = bin(key_b, 32);
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_WELCOME;
    f->sm.welcome = &f->welcome;
    break;
  case 2:
    neoflow__accepted__init(&f->accepted);
    f->accepted.request_id = 5;
    f->accepted.key = bin(key_a, 32);
    f->accepted.cache_hit = 1;
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_ACCEPTED;
    f->sm.accepted = &f->accepted;
    break;
  case 3:
    neoflow__kernel_update__init(&f->kernel);
    f->kernel.request_id = 5;
    f->kernel.key = bin(key_a, 32);
    f->kernel.tier = NEOFLOW__TIER__TIER_TUNED;
    f->kernel.schedule = "tile i 4\n\tvectorize j 8\n";
    f->kernel.time_ms = 1.25;
    f->kernel.default_ms = 3.5;
    f->kernel.size = 123456;
    f->kernel.sha256 = bin(key_b, 32);
    f->kernel.final = 1;
    f->kernel.kernel_abi = 2;
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_KERNEL;
    f->sm.kernel = &f->kernel;
    break;
  case 4:
    neoflow__chunk__init(&f->chunk);
    for (size_t k = 0; k < sizeof(f->chunk_data); k++) f->chunk_data[k] = (uint8_t)(k * 31);
    f->chunk.request_id = 5;
    f->chunk.offset = 1 << 20;
    f->chunk.data = bin(f->chunk_data, sizeof(f->chunk_data));
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_CHUNK;
    f->sm.chunk = &f->chunk;
    break;
  case 5:
    neoflow__progress__init(&f->progress);
    f->progress.request_id = 5;
    f->progress.key = bin(key_a, 32);
    f->progress.state = NEOFLOW__JOB_STATE__JOB_TUNING;
    f->progress.trial = 10;
    f->progress.max_trials = 100;
    f->progress.failures = 1;
    f->progress.best_ms = 0.75;
    f->progress.default_ms = 2;
    f->progress.queue_position = 3;
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS;
    f->sm.progress = &f->progress;
    break;
  case 6:
    neoflow__status_reply__init(&f->status);
    for (int k = 0; k < 2; k++) {
      neoflow__client_info__init(&f->ci[k]);
      f->cip[k] = &f->ci[k];
      f->ci[k].session_id = (uint64_t)k + 10;
      f->ci[k].name = k ? "bench" : "train.py";
      f->ci[k].pid = 100 + (uint32_t)k;
      f->ci[k].uid = 1000;
      f->ci[k].transport = k ? "tcp" : "unix";
      f->ci[k].requests = 3;
      f->ci[k].connected_s = 12.5;
    }
    neoflow__job_info__init(&f->ji[0]);
    f->jip[0] = &f->ji[0];
    f->ji[0].key = bin(key_a, 32);
    f->ji[0].graph = "conv2d";
    f->ji[0].state = NEOFLOW__JOB_STATE__JOB_COMPILING;
    f->ji[0].mode = NEOFLOW__MODE__MODE_TUNE;
    f->ji[0].waiters = 2;
    f->ji[0].best_ms = 1;
    f->ji[0].age_s = 3;
    f->status.daemon_version = "0.1.0";
    f->status.pid = 1;
    f->status.uptime_s = 1000.5;
    f->status.n_clients = 2;
    f->status.clients = f->cip;
    f->status.n_jobs = 1;
    f->status.jobs = f->jip;
    f->status.cache_hits = 7;
    f->status.cache_path = "/var/cache/neoflow/cache.db";
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_STATUS;
    f->sm.status = &f->status;
    break;
  case 7:
    neoflow__error__init(&f->error);
    f->error.code = NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_VERSION;
    f->error.message = "protocol 3..4 unsupported\n(daemon speaks 1..1)";
    f->error.request_id = 0;
    f->error.supported_min = 1;
    f->error.supported_max = 1;
    f->error.fatal = 1;
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_ERROR;
    f->sm.error = &f->error;
    break;
  case 8:
    neoflow__pong__init(&f->pong);
    f->pong.token = 0xdeadbeef;
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_PONG;
    f->sm.pong = &f->pong;
    break;
  default:
    neoflow__goodbye__init(&f->goodbye);
    f->goodbye.reason = "shutting down";
    f->sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE;
    f->sm.goodbye = &f->goodbye;
    break;
  }
}

static void fx_record(fixtures *f, int k) {
  neoflow__record__init(&f->rec[k]);
  f->recp[k] = &f->rec[k];
  for (int j = 0; j < 8; j++) f->feats[j] = (float)j * 0.5f;
  f->rec[k].schedule = "split i 4\nparallel i\n";
  f->rec[k].status = k;
  f->rec[k].time_ms = k ? 0 : 2.5;
  f->rec[k].features = bin((uint8_t *)f->feats, sizeof(f->feats));
  f->rec[k].reason = k ? "killed by SIGSEGV" : "";
}

static void fx_job_request(fixtures *f) {
  neoflow__job_request__init(&f->jr);
  wg_init(&f->w);
  fx_record(f, 0);
  fx_record(f, 1);
  f->jr.graph = &f->w.g;
  f->jr.mode = NEOFLOW__MODE__MODE_TUNE;
  f->jr.max_trials = 64;
  f->jr.max_seconds = 20;
  f->jr.seed = 12345;
  f->jr.n_prior = 2;
  f->jr.prior = f->recp;
  f->jr.measure_timeout_ms = 5000;
  f->jr.worker_memory_mb = 2048;
  f->jr.threads = 2;
}

static void fx_job_event(fixtures *f, int i) {
  neoflow__job_event__init(&f->je);
  switch (i) {
  case 0:
    neoflow__job_kernel__init(&f->jk);
    for (size_t k = 0; k < sizeof(f->binary); k++) f->binary[k] = (uint8_t)(k ^ 0x5a);
    f->jk.tier = NEOFLOW__TIER__TIER_DEFAULT;
    f->jk.schedule = "default\n";
    f->jk.time_ms = 1;
    f->jk.default_ms = 1;
    f->jk.binary = bin(f->binary, sizeof(f->binary));
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_KERNEL;
    f->je.kernel = &f->jk;
    break;
  case 1:
    fx_server(f, 5);
    f->progress.key.len = 0; /* the job process may not know the key */
    f->progress.key.data = NULL;
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_PROGRESS;
    f->je.progress = &f->progress;
    break;
  case 2:
    fx_record(f, 0);
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_RECORD;
    f->je.record = &f->rec[0];
    break;
  case 3:
    fx_server(f, 7);
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_ERROR;
    f->je.error = &f->error;
    break;
  default:
    fx_server(f, 9);
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_DONE;
    f->je.done = &f->goodbye;
    break;
  }
}

/* ---- the frame reader ---- */

/* Three frames: a Ping, a zero-length frame, a Submit. */
static void three_frames(nf_buf *stream, nf_buf payloads[3]) {
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 6);
  ck_assert_int_eq(nf_wire_pack(&f->cm.base, NF_WIRE_FRAME_MAX, stream), NF_OK);
  pack_into(&f->cm.base, &payloads[0]);
  static const uint8_t zero_hdr[4] = {0, 0, 0, 0};
  nf_buf_add(stream, zero_hdr, 4);
  nf_buf_reset(&payloads[1]);
  fx_client(f, 2);
  ck_assert_int_eq(nf_wire_pack(&f->cm.base, NF_WIRE_FRAME_MAX, stream), NF_OK);
  pack_into(&f->cm.base, &payloads[2]);
  free(f);
}

START_TEST(proto_reader_bytewise) {
  nf_buf stream = NF_BUF_INIT, pl[3] = {NF_BUF_INIT, NF_BUF_INIT, NF_BUF_INIT};
  three_frames(&stream, pl);
  nf_frame_reader r;
  nf_frame_reader_init(&r, NF_WIRE_FRAME_MAX);
  int got = 0;
  for (size_t i = 0; i < stream.len; i++) {
    const uint8_t *fr = NULL;
    size_t len = 0, used = 0;
    int rc = nf_frame_reader_feed(&r, (const uint8_t *)stream.data + i, 1, &used, &fr, &len);
    ck_assert_int_ge(rc, 0);
    ck_assert_uint_eq(used, 1);
    if (rc == 1) {
      ck_assert_int_lt(got, 3);
      ck_assert_ptr_nonnull(fr);
      ck_assert_uint_eq(len, pl[got].len);
      ck_assert(len == 0 || memcmp(fr, pl[got].data, len) == 0);
      ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 0);
      got++;
    } else {
      ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 1);
    }
  }
  ck_assert_int_eq(got, 3);
  nf_frame_reader_free(&r);
  nf_buf_free(&stream);
  for (int k = 0; k < 3; k++) nf_buf_free(&pl[k]);
}
END_TEST

START_TEST(proto_reader_one_chunk) {
  nf_buf stream = NF_BUF_INIT, pl[3] = {NF_BUF_INIT, NF_BUF_INIT, NF_BUF_INIT};
  three_frames(&stream, pl);
  /* Twice the stream in one feed: six frames, then nothing left. */
  char *copy = malloc(stream.len);
  memcpy(copy, stream.data, stream.len);
  nf_buf_add(&stream, copy, stream.len);
  free(copy);
  nf_frame_reader r;
  nf_frame_reader_init(&r, NF_WIRE_FRAME_MAX);
  ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 0);
  const uint8_t *p = (const uint8_t *)stream.data;
  size_t left = stream.len;
  int got = 0;
  for (;;) {
    const uint8_t *fr;
    size_t len, used;
    int rc = nf_frame_reader_feed(&r, p, left, &used, &fr, &len);
    ck_assert_int_ge(rc, 0);
    p += used;
    left -= used;
    if (rc == 0) break;
    ck_assert_uint_eq(len, pl[got % 3].len);
    ck_assert(len == 0 || memcmp(fr, pl[got % 3].data, len) == 0);
    got++;
  }
  ck_assert_int_eq(got, 6);
  ck_assert_uint_eq(left, 0);
  ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 0);
  nf_frame_reader_free(&r);
  nf_buf_free(&stream);
  for (int k = 0; k < 3; k++) nf_buf_free(&pl[k]);
}
END_TEST

START_TEST(proto_reader_zero_length) {
  static const uint8_t z[8] = {0};
  nf_frame_reader r;
  nf_frame_reader_init(&r, 16);
  const uint8_t *fr = NULL;
  size_t len = 99, used = 0;
  ck_assert_int_eq(nf_frame_reader_feed(&r, z, 8, &used, &fr, &len), 1);
  ck_assert_uint_eq(used, 4);
  ck_assert_uint_eq(len, 0);
  ck_assert_ptr_nonnull(fr);
  ck_assert_ptr_null(r.buf);
  ck_assert_int_eq(nf_frame_reader_feed(&r, z + 4, 4, &used, &fr, &len), 1);
  ck_assert_uint_eq(used, 4);
  ck_assert_uint_eq(len, 0);
  /* An empty feed between frames completes nothing. */
  ck_assert_int_eq(nf_frame_reader_feed(&r, z, 0, &used, &fr, &len), 0);
  ck_assert_uint_eq(used, 0);
  ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 0);
  nf_frame_reader_free(&r);
}
END_TEST

START_TEST(proto_reader_lying_length) {
  static const uint8_t lie[6] = {0xff, 0xff, 0xff, 0xf0, 1, 2};
  nf_frame_reader r;
  nf_frame_reader_init(&r, NF_WIRE_FRAME_MAX);
  const uint8_t *fr = NULL;
  size_t len = 0, used = 0;
  /* Byte by byte: the first three bytes are a header in progress. */
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(nf_frame_reader_feed(&r, lie + i, 1, &used, &fr, &len), 0);
    ck_assert_ptr_null(r.buf);
  }
  ck_assert_int_eq(nf_frame_reader_feed(&r, lie + 3, 3, &used, &fr, &len), NF_ELIMIT);
  ck_assert_uint_eq(used, 1);
  ck_assert_ptr_null(r.buf); /* refused before allocation */
  /* The stream stays refused, even with a valid frame after it. */
  static const uint8_t ok[5] = {0, 0, 0, 1, 7};
  ck_assert_int_eq(nf_frame_reader_feed(&r, ok, 5, &used, &fr, &len), NF_ELIMIT);
  ck_assert_ptr_null(r.buf);
  nf_frame_reader_free(&r);

  /* The limit itself is allowed, one more byte is not. */
  uint8_t hdr[4] = {0, 0, 0x10, 0x00}; /* 4096 */
  nf_frame_reader_init(&r, 4096);
  ck_assert_int_eq(nf_frame_reader_feed(&r, hdr, 4, &used, &fr, &len), 0);
  ck_assert_ptr_nonnull(r.buf);
  ck_assert_int_eq(nf_frame_reader_mid_frame(&r), 1);
  nf_frame_reader_free(&r);
  hdr[3] = 1; /* 4097 */
  nf_frame_reader_init(&r, 4096);
  ck_assert_int_eq(nf_frame_reader_feed(&r, hdr, 4, &used, &fr, &len), NF_ELIMIT);
  ck_assert_ptr_null(r.buf);
  nf_frame_reader_free(&r);
}
END_TEST

START_TEST(proto_reader_set_max) {
  size_t big = 5000;
  uint8_t *s = calloc(1, 2 * (big + 4) + 8);
  uint8_t *p = s;
  /* a small frame (the Hello), then two of 5000 bytes */
  p[3] = 3;
  p[4] = 'a', p[5] = 'b', p[6] = 'c';
  p += 7;
  for (int k = 0; k < 2; k++) {
    p[2] = (uint8_t)(big >> 8);
    p[3] = (uint8_t)big;
    p[4] = (uint8_t)k;
    p += 4 + big;
  }
  size_t total = (size_t)(p - s);
  nf_frame_reader r;
  const uint8_t *fr;
  size_t len, used;
  /* Without switching, the big frame is refused. */
  nf_frame_reader_init(&r, NF_WIRE_HANDSHAKE_MAX);
  ck_assert_int_eq(nf_frame_reader_feed(&r, s, total, &used, &fr, &len), 1);
  ck_assert_uint_eq(len, 3);
  ck_assert_int_eq(nf_frame_reader_feed(&r, s + used, total - used, &used, &fr, &len),
                   NF_ELIMIT);
  nf_frame_reader_free(&r);
  /* Switching after the handshake frame admits it. */
  nf_frame_reader_init(&r, NF_WIRE_HANDSHAKE_MAX);
  size_t off = 0;
  ck_assert_int_eq(nf_frame_reader_feed(&r, s, total, &used, &fr, &len), 1);
  off += used;
  nf_frame_reader_set_max(&r, NF_WIRE_FRAME_MAX);
  ck_assert_int_eq(nf_frame_reader_feed(&r, s + off, total - off, &used, &fr, &len), 1);
  off += used;
  ck_assert_uint_eq(len, big);
  ck_assert_int_eq(fr[0], 0);
  /* Lowering the limit mid-frame keeps the started frame's. */
  ck_assert_int_eq(nf_frame_reader_feed(&r, s + off, 10, &used, &fr, &len), 0);
  off += used;
  nf_frame_reader_set_max(&r, 16);
  ck_assert_int_eq(nf_frame_reader_feed(&r, s + off, total - off, &used, &fr, &len), 1);
  ck_assert_uint_eq(len, big);
  ck_assert_int_eq(fr[0], 1);
  nf_frame_reader_free(&r);
  free(s);
}
END_TEST

/* ---- the blocking helpers ---- */

static void sockpair(int sv[2]) { ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0); }

START_TEST(proto_read_write_frame) {
  int sv[2];
  sockpair(sv);
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 2);
  ck_assert_int_eq(nf_wire_write_frame(sv[0], &f->cm.base, NF_WIRE_FRAME_MAX, 1000), NF_OK);
  ck_assert_int_eq(nf_wire_write_frame(sv[0], &f->cm.base, 10, 1000), NF_ELIMIT);
  nf_buf b = NF_BUF_INIT, want = NF_BUF_INIT;
  pack_into(&f->cm.base, &want);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], NF_WIRE_FRAME_MAX, 1000, &b), NF_OK);
  ck_assert_uint_eq(b.len, want.len);
  ck_assert(memcmp(b.data, want.data, b.len) == 0);
  /* nothing more was written: a clean EOF once the writer closes */
  close(sv[0]);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], NF_WIRE_FRAME_MAX, 1000, &b), NF_ENOENT);
  ck_assert_uint_eq(b.len, 0);
  close(sv[1]);
  nf_buf_free(&b);
  nf_buf_free(&want);
  free(f);
}
END_TEST

START_TEST(proto_read_frame_errors) {
  int sv[2];
  nf_buf b = NF_BUF_INIT;
  /* a truncated payload */
  sockpair(sv);
  static const uint8_t trunc[9] = {0, 0, 0, 10, 1, 2, 3, 4, 5};
  ck_assert_int_eq(write(sv[0], trunc, 9), 9);
  close(sv[0]);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], 100, 1000, &b), NF_EFORMAT);
  ck_assert_uint_eq(b.len, 0);
  ck_assert_str_eq(nf_buf_str(&b), "");
  close(sv[1]);
  /* a truncated header */
  sockpair(sv);
  ck_assert_int_eq(write(sv[0], trunc, 2), 2);
  close(sv[0]);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], 100, 0, &b), NF_EFORMAT);
  close(sv[1]);
  /* a lying length */
  sockpair(sv);
  static const uint8_t lie[4] = {0xff, 0xff, 0xff, 0xf0};
  ck_assert_int_eq(write(sv[0], lie, 4), 4);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], NF_WIRE_JOB_FRAME_MAX, 1000, &b), NF_ELIMIT);
  close(sv[0]);
  close(sv[1]);
  /* nothing arrives: the timeout */
  sockpair(sv);
  errno = 0;
  ck_assert_int_eq(nf_wire_read_frame(sv[1], 100, 30, &b), NF_EIO);
  ck_assert_int_eq(errno, ETIMEDOUT);
  /* half a frame, then silence: the timeout covers the whole frame */
  ck_assert_int_eq(write(sv[0], trunc, 6), 6);
  ck_assert_int_eq(nf_wire_read_frame(sv[1], 100, 30, &b), NF_EIO);
  ck_assert_int_eq(errno, ETIMEDOUT);
  close(sv[0]);
  close(sv[1]);
  nf_buf_free(&b);
}
END_TEST

START_TEST(proto_write_frame_errors) {
  int sv[2];
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 6);
  /* the peer is gone: EPIPE, and no SIGPIPE kills the test */
  sockpair(sv);
  close(sv[1]);
  errno = 0;
  ck_assert_int_eq(nf_wire_write_frame(sv[0], &f->cm.base, NF_WIRE_FRAME_MAX, 1000), NF_EIO);
  ck_assert_int_eq(errno, EPIPE);
  close(sv[0]);
  /* the peer never reads a 4 MiB frame: the timeout */
  fx_job_event(f, 0);
  uint8_t *big = calloc(1, 4u << 20);
  f->jk.binary = bin(big, 4u << 20);
  sockpair(sv);
  ck_assert_int_eq(nf_wire_write_frame(sv[0], &f->je.base, NF_WIRE_JOB_FRAME_MAX, 50), NF_EIO);
  ck_assert_int_eq(errno, ETIMEDOUT);
  close(sv[0]);
  close(sv[1]);
  /* the same through a pipe */
  int pf[2];
  ck_assert_int_eq(pipe(pf), 0);
  ck_assert_int_eq(nf_wire_write_frame(pf[1], &f->je.base, NF_WIRE_JOB_FRAME_MAX, 50), NF_EIO);
  ck_assert_int_eq(errno, ETIMEDOUT);
  close(pf[0]);
  close(pf[1]);
  free(big);
  free(f);
}
END_TEST

typedef struct pipe_reader {
  int fd, rc;
  nf_buf b;
} pipe_reader;

static void *read_thread(void *arg) {
  pipe_reader *pr = arg;
  pr->rc = nf_wire_read_frame(pr->fd, NF_WIRE_JOB_FRAME_MAX, 0, &pr->b);
  return NULL;
}

START_TEST(proto_big_frame_pipe) {
  fixtures *f = calloc(1, sizeof(*f));
  fx_job_event(f, 0);
  size_t n = (6u << 20) + 17;
  uint8_t *big = malloc(n);
  for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  f->jk.binary = bin(big, n);
  int pf[2];
  ck_assert_int_eq(pipe(pf), 0);
  pipe_reader pr = {pf[0], -100, NF_BUF_INIT};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, read_thread, &pr), 0);
  ck_assert_int_eq(nf_wire_write_frame(pf[1], &f->je.base, NF_WIRE_JOB_FRAME_MAX, 0), NF_OK);
  pthread_join(th, NULL);
  ck_assert_int_eq(pr.rc, NF_OK);
  nf_wire_err e;
  Neoflow__JobEvent *ev = nf_wire_decode_job_event((const uint8_t *)pr.b.data, pr.b.len, &e);
  ck_assert_msg(ev != NULL, "%s", e.msg);
  ck_assert_int_eq(ev->msg_case, NEOFLOW__JOB_EVENT__MSG_KERNEL);
  ck_assert_uint_eq(ev->kernel->binary.len, n);
  ck_assert(memcmp(ev->kernel->binary.data, big, n) == 0);
  nf_wire_free_job_event(ev);
  close(pf[0]);
  close(pf[1]);
  nf_buf_free(&pr.b);
  free(big);
  free(f);
}
END_TEST

START_TEST(proto_pack_limit) {
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 2);
  nf_buf b = NF_BUF_INIT;
  nf_buf_puts(&b, "keep");
  size_t n = protobuf_c_message_get_packed_size(&f->cm.base);
  ck_assert_int_eq(nf_wire_pack(&f->cm.base, (uint32_t)n - 1, &b), NF_ELIMIT);
  ck_assert_str_eq(nf_buf_str(&b), "keep");
  ck_assert_int_eq(nf_wire_pack(&f->cm.base, (uint32_t)n, &b), NF_OK);
  ck_assert_uint_eq(b.len, 4 + 4 + n);
  const uint8_t *h = (const uint8_t *)b.data + 4;
  ck_assert_uint_eq((size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3], n);
  nf_buf_free(&b);
  free(f);
}
END_TEST

/* ---- round trips ---- */

START_TEST(proto_roundtrip_client) {
  fixtures *f = calloc(1, sizeof(*f));
  for (int i = 0; i < N_CLIENT_EX; i++) {
    fx_client(f, i);
    Neoflow__ClientMessage *m = (Neoflow__ClientMessage *)roundtrip(K_CLIENT, &f->cm.base);
    ck_assert_int_eq(m->msg_case, f->cm.msg_case);
    if (i == 1) {
      ck_assert_str_eq(m->hello->client_name, "train.py");
      ck_assert_uint_eq(m->hello->protocol_max, 3);
      ck_assert_uint_eq(m->hello->mac.len, 32);
      ck_assert(memcmp(m->hello->target->fingerprint.data, key_a, 32) == 0);
    }
    if (i == 2) {
      ck_assert_uint_eq(m->submit->graph->n_exprs, 6);
      ck_assert_str_eq(m->submit->graph->tensors[3]->name, "D");
      ck_assert_uint_eq(m->submit->graph->inputs[0], 1);
    }
    if (i == 4) ck_assert(m->step_times->ms[2] == 1.0);
    nf_wire_free_client(m);
  }
  free(f);
}
END_TEST

START_TEST(proto_roundtrip_server) {
  fixtures *f = calloc(1, sizeof(*f));
  for (int i = 0; i < N_SERVER_EX; i++) {
    fx_server(f, i);
    Neoflow__ServerMessage *m = (Neoflow__ServerMessage *)roundtrip(K_SERVER, &f->sm.base);
    ck_assert_int_eq(m->msg_case, f->sm.msg_case);
    if (i == 3) ck_assert_str_eq(m->kernel->schedule, "tile i 4\n\tvectorize j 8\n");
    if (i == 6) {
      ck_assert_uint_eq(m->status->n_clients, 2);
      ck_assert_str_eq(m->status->clients[1]->transport, "tcp");
      ck_assert_str_eq(m->status->jobs[0]->graph, "conv2d");
    }
    nf_wire_free_server(m);
  }
  free(f);
}
END_TEST

START_TEST(proto_roundtrip_job) {
  fixtures *f = calloc(1, sizeof(*f));
  fx_job_request(f);
  Neoflow__JobRequest *r = (Neoflow__JobRequest *)roundtrip(K_JOB_REQUEST, &f->jr.base);
  ck_assert_uint_eq(r->n_prior, 2);
  ck_assert_str_eq(r->prior[1]->reason, "killed by SIGSEGV");
  ck_assert_uint_eq(r->prior[0]->features.len, 32);
  nf_wire_free_job_request(r);
  for (int i = 0; i < N_JOB_EVENT_EX; i++) {
    fx_job_event(f, i);
    Neoflow__JobEvent *m = (Neoflow__JobEvent *)roundtrip(K_JOB_EVENT, &f->je.base);
    ck_assert_int_eq(m->msg_case, f->je.msg_case);
    if (i == 0) ck_assert(memcmp(m->kernel->binary.data, f->binary, sizeof(f->binary)) == 0);
    nf_wire_free_job_event(m);
  }
  free(f);
}
END_TEST

/* ---- rejection ---- */

START_TEST(proto_unknown_field_rejected) {
  fixtures *f = calloc(1, sizeof(*f));
  nf_buf b = NF_BUF_INIT;
  /* at the top: a Ping with field 99 appended */
  fx_client(f, 6);
  pack_into(&f->cm.base, &b);
  pb_varint(&b, 99, 1);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "unknown field 99");
  /* nested: inside the Ping */
  nf_buf inner = NF_BUF_INIT;
  pb_varint(&inner, 1, 5);
  pb_bytes(&inner, 7, "x", 1);
  nf_buf_reset(&b);
  pb_bytes(&b, 6, inner.data, inner.len);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "ping: unknown field 7");
  /* deep: submit.graph.exprs[0] */
  nf_buf expr = NF_BUF_INIT, graph = NF_BUF_INIT, submit = NF_BUF_INIT;
  pb_varint(&expr, 1, NEOFLOW__OP__OP_VAR);
  pb_varint(&expr, 2, NEOFLOW__DTYPE__DT_I64);
  pb_varint(&expr, 15, 3);
  pb_bytes(&graph, 3, expr.data, expr.len);
  pb_bytes(&submit, 2, graph.data, graph.len);
  nf_buf_reset(&b);
  pb_bytes(&b, 2, submit.data, submit.len);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len,
                      "submit.graph.exprs[0]: unknown field 15");
  /* an unknown field in a Hello that a later Ping replaced (protobuf-c
   * drops the Hello; the raw scan still sees it) */
  nf_buf_reset(&inner);
  pb_varint(&inner, 20, 1);
  nf_buf_reset(&b);
  pb_bytes(&b, 1, inner.data, inner.len);
  pb_bytes(&b, 6, "", 0);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "hello: unknown field 20");
  /* and in a JobEvent, ServerMessage, JobRequest */
  fx_job_event(f, 4);
  pack_into(&f->je.base, &b);
  pb_bytes(&b, 40, "zz", 2);
  expect_reject_bytes(K_JOB_EVENT, (const uint8_t *)b.data, b.len, "unknown field 40");
  fx_server(f, 8);
  pack_into(&f->sm.base, &b);
  pb_tag(&b, 1000, 5);
  nf_buf_add(&b, "abcd", 4);
  expect_reject_bytes(K_SERVER, (const uint8_t *)b.data, b.len, "unknown field 1000");
  fx_job_request(f);
  pack_into(&f->jr.base, &b);
  pb_varint(&b, 24, 0);
  expect_reject_bytes(K_JOB_REQUEST, (const uint8_t *)b.data, b.len, "unknown field 24");
  nf_buf_free(&b);
  nf_buf_free(&inner);
  nf_buf_free(&expr);
  nf_buf_free(&graph);
  nf_buf_free(&submit);
  free(f);
}
END_TEST

START_TEST(proto_unknown_enum_rejected) {
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 2);
  f->submit.mode = (Neoflow__Mode)7;
  expect_reject(K_CLIENT, &f->cm.base, "submit.mode: unknown value 7");
  fx_client(f, 2);
  f->w.x[1].op = (Neoflow__Op)99;
  expect_reject(K_CLIENT, &f->cm.base, "submit.graph.exprs[1].op: unknown value 99");
  fx_client(f, 2);
  f->w.t[2].dtype = (Neoflow__DType)-3;
  expect_reject(K_CLIENT, &f->cm.base, "submit.graph.tensors[2].dtype: unknown value -3");
  fx_client(f, 2);
  f->w.s[1].red = (Neoflow__RedOp)5;
  expect_reject(K_CLIENT, &f->cm.base, "submit.graph.stmts[1].red: unknown value 5");
  fx_server(f, 7);
  f->error.code = (Neoflow__ErrorCode)21;
  expect_reject(K_SERVER, &f->sm.base, "error.code: unknown value 21");
  fx_server(f, 1);
  f->target.kind = (Neoflow__TargetKind)2;
  expect_reject(K_SERVER, &f->sm.base, "welcome.target.kind: unknown value 2");
  fx_job_event(f, 0);
  f->jk.tier = (Neoflow__Tier)3;
  expect_reject(K_JOB_EVENT, &f->je.base, "kernel.tier: unknown value 3");
  fx_server(f, 6);
  f->ji[0].state = (Neoflow__JobState)9;
  expect_reject(K_SERVER, &f->sm.base, "status.jobs[0].state: unknown value 9");
  free(f);
}
END_TEST

/* Issue 31 item 8: two members of a oneof (protobuf-c keeps the last), or
 * one sent twice (merged), are refused, not silently narrowed. */
START_TEST(proto_oneof_twice) {
  /* ClientMessage{status = 5, ping = 6}, both empty */
  static const uint8_t two[] = {0x2a, 0x00, 0x32, 0x00};
  expect_reject_bytes(K_CLIENT, two, sizeof two, "status and ping: a message carries one member");
  static const uint8_t again[] = {0x32, 0x02, 0x08, 0x01, 0x32, 0x02, 0x08, 0x02};
  expect_reject_bytes(K_CLIENT, again, sizeof again, "ping and ping");
  /* a ServerMessage's member sent twice */
  Neoflow__ServerMessage sm = NEOFLOW__SERVER_MESSAGE__INIT;
  Neoflow__Goodbye g = NEOFLOW__GOODBYE__INIT;
  g.reason = (char *)"bye";
  sm.msg_case = NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE;
  sm.goodbye = &g;
  nf_buf b = NF_BUF_INIT;
  pack_into(&sm.base, &b);
  uint8_t once[64];
  ck_assert_uint_le(b.len, sizeof once);
  size_t n1 = b.len;
  memcpy(once, b.data, n1);
  nf_buf_add(&b, once, n1); /* the same member twice */
  expect_reject_bytes(K_SERVER, (const uint8_t *)b.data, b.len, "goodbye and goodbye");
  nf_buf_free(&b);
  /* one member once is fine */
  nf_wire_err e;
  ProtobufCMessage *m = dec(K_CLIENT, two, 2, &e);
  ck_assert_msg(m != NULL, "%s", e.msg);
  dfree(K_CLIENT, m);
}
END_TEST

START_TEST(proto_oneof_not_set) {
  expect_reject_bytes(K_CLIENT, (const uint8_t *)"", 0, "msg: no message set");
  expect_reject_bytes(K_SERVER, (const uint8_t *)"", 0, "msg: no message set");
  expect_reject_bytes(K_JOB_EVENT, (const uint8_t *)"", 0, "msg: no message set");
  /* a JobRequest without its graph */
  expect_reject_bytes(K_JOB_REQUEST, (const uint8_t *)"", 0, "graph: missing");
  /* the validators themselves, on a message built by hand */
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  nf_wire_err e;
  ck_assert_int_eq(nf_wire_validate_client(&cm, &e), NF_EINVAL);
  ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT);
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  cm.submit = &s;
  ck_assert_int_eq(nf_wire_validate_client(&cm, &e), NF_EINVAL);
  ck_assert_str_eq(e.msg, "submit.graph: missing");
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 2);
  ck_assert_int_eq(nf_wire_validate_client(&f->cm, &e), NF_OK);
  ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_NONE);
  free(f);
}
END_TEST

/* Invalid field values, one per loop iteration: the mutation and the
 * expected message. */
static const char *const field_cases[] = {
    "hello.client_name: 65 bytes, at most 64",
    "hello.client_name: invalid UTF-8 at byte 2",
    "hello.client_name: a control character at byte 1",
    "hello.target.fingerprint: 31 bytes, expected 32",
    "hello.mac: 31 bytes, expected 32 or none",
    "hello.mac: a mac without a client_nonce",
    "hello.protocol_min: 4 exceeds protocol_max 3",
    "hello.target: missing",
    "hello.target.description: 257 bytes",
    "submit.graph: missing",
    "submit.graph.name: 65 bytes",
    "submit.graph.tensors[1].name: invalid UTF-8 at byte 0",
    "submit.graph.tensors[0].shape: 9 entries, at most 8",
    "submit.graph.exprs[2].args: 9 entries, at most 8",
    "submit.graph.stmts[1].red_lo: 25 entries, at most 24",
    "step_times.ms[1]: nan is not a finite time",
    "step_times.ms[0]: -1 is not a finite time",
    "step_times.ms: 2 entries for 3 request ids",
    "kernel.time_ms: inf is not a finite time",
    "kernel.size: 268435457 bytes",
    "kernel.key: 0 bytes, expected 32",
    "kernel.sha256: 16 bytes, expected 32",
    "kernel.schedule: a control character at byte 4",
    "chunk.data: 1048577 bytes, at most 1048576",
    "chunk.offset: 268435000 + 1000 bytes runs past",
    "challenge.server_nonce: 0 bytes, expected 32",
    "accepted.key: 33 bytes",
    "progress.best_ms: nan",
    "status.clients[1].name: a control character",
    "status.jobs[0].age_s: -inf",
    "error.message: 1025 bytes, at most 1024",
    "goodbye.reason: invalid UTF-8 at byte 3",
    "record.features: 7 bytes, not a whole number of f32",
    "kernel.binary: 268435457 bytes",
    "prior[1].time_ms: nan",
    "submit.graph.tensors: 4097 entries, at most 4096",
    "welcome.daemon_version: invalid UTF-8 at byte 1",
    "hello.client_name: invalid UTF-8 at byte 0",
    "hello.client_name: a control character at byte 0",
    "submit.schedule: MODE_PUBLISH without the schedule it publishes",
    "submit.schedule: a schedule is sent only with MODE_PUBLISH",
    "submit.schedule: a control character at byte 1",
    "published.time_ms: nan is not a finite time",
    "published.tier: unknown value 7",
    "published: 65537 bytes, at most 65536",
};

START_TEST(proto_invalid_fields) {
  fixtures *f = calloc(1, sizeof(*f));
  int kind = K_CLIENT;
  char long_name[1100];
  static int64_t many_red[32];
  memset(long_name, 'n', sizeof(long_name));
  long_name[65] = 0;
  uint8_t *big = NULL;
  Neoflow__Tensor **many = NULL;
  switch (_i) {
  case 0: fx_client(f, 0); f->hello.client_name = long_name; break;
  case 1: fx_client(f, 0); f->hello.client_name = "ab\xc3\x28"; break;
  case 2: fx_client(f, 0); f->hello.client_name = "a\x01"; break;
  case 3: fx_client(f, 0); f->target.fingerprint.len = 31; break;
  case 4: fx_client(f, 1); f->hello.mac.len = 31; break;
  case 5: fx_client(f, 1); f->hello.client_nonce = bin(NULL, 0); break;
  case 6: fx_client(f, 0); f->hello.protocol_min = 4; break;
  case 7: fx_client(f, 0); f->hello.target = NULL; break;
  case 8:
    fx_client(f, 0);
    long_name[65] = 'n';
    long_name[257] = 0;
    f->target.description = long_name;
    break;
  case 9: fx_client(f, 2); f->submit.graph = NULL; break;
  case 10: fx_client(f, 2); f->w.g.name = long_name; break;
  case 11: fx_client(f, 2); f->w.t[1].name = "\xff"; break;
  case 12: fx_client(f, 2); f->w.t[0].n_shape = 9; break;
  case 13: fx_client(f, 2); f->w.x[2].n_args = 9; f->w.x[2].args = (uint32_t *)f->w.red_lo; break;
  case 14:
    fx_client(f, 2);
    f->w.s[1].n_red_lo = 25;
    f->w.s[1].red_lo = many_red;
    break;
  case 15: fx_client(f, 4); f->st_ms[1] = NAN; break;
  case 16: fx_client(f, 4); f->st_ms[0] = -1; break;
  case 17: fx_client(f, 4); f->step_times.n_ms = 2; break;
  case 18: kind = K_SERVER; fx_server(f, 3); f->kernel.time_ms = INFINITY; break;
  case 19: kind = K_SERVER; fx_server(f, 3); f->kernel.size = NF_WIRE_BINARY_MAX + 1ull; break;
  case 20: kind = K_SERVER; fx_server(f, 3); f->kernel.key = bin(NULL, 0); break;
  case 21: kind = K_SERVER; fx_server(f, 3); f->kernel.sha256.len = 16; break;
  case 22: kind = K_SERVER; fx_server(f, 3); f->kernel.schedule = "tile\x1bi"; break;
  case 23:
    kind = K_SERVER;
    fx_server(f, 4);
    big = calloc(1, NF_WIRE_CHUNK_MAX + 1);
    f->chunk.data = bin(big, NF_WIRE_CHUNK_MAX + 1);
    break;
  case 24: kind = K_SERVER; fx_server(f, 4); f->chunk.offset = 268435000; break;
  case 25: kind = K_SERVER; fx_server(f, 0); f->challenge.server_nonce = bin(NULL, 0); break;
  case 26:
    kind = K_SERVER;
    fx_server(f, 2);
    f->accepted.key = bin(f->chunk_data, 33);
    break;
  case 27: kind = K_SERVER; fx_server(f, 5); f->progress.best_ms = NAN; break;
  case 28: kind = K_SERVER; fx_server(f, 6); f->ci[1].name = "be\tnch"; break;
  case 29: kind = K_SERVER; fx_server(f, 6); f->ji[0].age_s = -INFINITY; break;
  case 30:
    kind = K_SERVER;
    fx_server(f, 7);
    long_name[65] = 'n';
    long_name[1025] = 0;
    f->error.message = long_name;
    break;
  case 31: kind = K_SERVER; fx_server(f, 9); f->goodbye.reason = "bye\xed\xa0\x80"; break;
  case 32: kind = K_JOB_EVENT; fx_job_event(f, 2); f->rec[0].features.len = 7; break;
  case 33: {
    /* The validator alone: a 256 MiB message is not worth packing. */
    fx_job_event(f, 0);
    f->jk.binary.len = NF_WIRE_BINARY_MAX + 1;
    nf_wire_err e;
    ck_assert_int_eq(nf_wire_validate_job_event(&f->je, &e), NF_EINVAL);
    ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(e.msg, field_cases[_i]) != NULL, "'%s'", e.msg);
    free(f);
    return;
  }
  case 34: kind = K_JOB_REQUEST; fx_job_request(f); f->rec[1].time_ms = NAN; break;
  case 35:
    fx_client(f, 2);
    many = malloc(4097 * sizeof(*many));
    for (int k = 0; k < 4097; k++) many[k] = &f->w.t[2];
    f->w.g.tensors = many;
    f->w.g.n_tensors = 4097;
    break;
  case 36: kind = K_SERVER; fx_server(f, 1); f->welcome.daemon_version = "v\xc0\xaf"; break;
  case 37: fx_client(f, 0); f->hello.client_name = "\xf4\x90\x80\x80"; break;
  case 38: fx_client(f, 0); f->hello.client_name = "\xc2\x85"; break; /* C1 NEL */
  case 39: fx_client(f, 2); f->submit.mode = NEOFLOW__MODE__MODE_PUBLISH; break;
  case 40: fx_client(f, 2); f->submit.schedule = "tile i 8\n"; break;
  case 41:
    fx_client(f, 2);
    f->submit.mode = NEOFLOW__MODE__MODE_PUBLISH;
    f->submit.schedule = "t\x01";
    break;
  case 42:
  case 43:
    kind = K_JOB_EVENT;
    fx_job_event(f, 0);
    neoflow__job_published__init(&f->jp);
    f->jp.time_ms = _i == 42 ? NAN : 1;
    f->jp.tier = _i == 43 ? (Neoflow__Tier)7 : NEOFLOW__TIER__TIER_TUNED;
    f->je.msg_case = NEOFLOW__JOB_EVENT__MSG_PUBLISHED;
    f->je.published = &f->jp;
    break;
  case 44:
    kind = K_JOB_REQUEST;
    fx_job_request(f);
    big = malloc(NF_WIRE_SCHEDULE_MAX + 2);
    memset(big, 'n', NF_WIRE_SCHEDULE_MAX + 1);
    big[NF_WIRE_SCHEDULE_MAX + 1] = 0;
    f->jr.published = (char *)big;
    break;
  }
  const ProtobufCMessage *m = kind == K_CLIENT   ? &f->cm.base
                              : kind == K_SERVER ? &f->sm.base
                              : kind == K_JOB_EVENT ? &f->je.base
                                                    : &f->jr.base;
  expect_reject(kind, m, field_cases[_i]);
  free(big);
  free(many);
  free(f);
}
END_TEST

START_TEST(proto_text_accepted) {
  /* What is allowed: multi-byte UTF-8 in names, \n and \t in schedules
   * and messages, empty optional bytes, zero and huge finite times. */
  fixtures *f = calloc(1, sizeof(*f));
  fx_client(f, 0);
  f->hello.client_name = "tr\xc3\xa4in-\xe2\x82\xac-\xf0\x9f\x98\x80";
  ProtobufCMessage *m = roundtrip(K_CLIENT, &f->cm.base);
  nf_wire_free_client((Neoflow__ClientMessage *)m);
  fx_server(f, 3);
  f->kernel.time_ms = 0;
  f->kernel.default_ms = 1e300;
  f->kernel.size = 0;
  f->kernel.sha256 = bin(NULL, 0);
  m = roundtrip(K_SERVER, &f->sm.base);
  nf_wire_free_server((Neoflow__ServerMessage *)m);
  free(f);
}
END_TEST

START_TEST(proto_text_sanitize) {
  char s1[] = "ab\x01" "c\xff" "d\n\te";
  ck_assert_str_eq(nf_wire_text_sanitize(s1, 100, 0), "ab?c?d??e");
  char s2[] = "ab\x01" "c\xff" "d\n\te";
  ck_assert_str_eq(nf_wire_text_sanitize(s2, 100, 1), "ab?c?d\n\te");
  /* a cut never splits a character: "x€" is 4 bytes, max 3 keeps "x" */
  char s3[] = "x\xe2\x82\xac";
  ck_assert_str_eq(nf_wire_text_sanitize(s3, 3, 0), "x");
  char s4[] = "x\xe2\x82\xac";
  ck_assert_str_eq(nf_wire_text_sanitize(s4, 4, 0), "x\xe2\x82\xac");
  /* a truncated sequence at the end, a surrogate, C1 */
  char s5[] = "ok\xe2\x82";
  ck_assert_str_eq(nf_wire_text_sanitize(s5, 100, 0), "ok??");
  char s6[] = "\xed\xa0\x80\xc2\x85.";
  ck_assert_str_eq(nf_wire_text_sanitize(s6, 100, 0), "?????.");
  /* what comes out passes validation, whatever went in */
  rng_state = 77;
  fixtures *f = calloc(1, sizeof(*f));
  for (int it = 0; it < 2000; it++) {
    char buf[100];
    size_t n = rnd() % (sizeof(buf) - 1);
    for (size_t i = 0; i < n; i++) buf[i] = (char)(1 + rnd() % 255);
    buf[n] = 0;
    fx_server(f, 7);
    f->error.message = nf_wire_text_sanitize(buf, 1 + rnd() % 90, 1);
    ProtobufCMessage *m = roundtrip(K_SERVER, &f->sm.base);
    nf_wire_free_server((Neoflow__ServerMessage *)m);
  }
  free(f);
}
END_TEST

START_TEST(proto_nul_in_string_rejected) {
  nf_buf hello = NF_BUF_INIT, target = NF_BUF_INIT, b = NF_BUF_INIT;
  pb_bytes(&target, 2, key_a, 32);
  pb_varint(&hello, 2, 1);
  pb_bytes(&hello, 3, "ab\0cd", 5);
  pb_bytes(&hello, 5, target.data, target.len);
  pb_bytes(&b, 1, hello.data, hello.len);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len,
                      "hello.client_name: string holds a NUL byte");
  /* the same Hello without the NUL is fine */
  nf_buf_reset(&hello);
  nf_buf_reset(&b);
  pb_varint(&hello, 2, 1);
  pb_bytes(&hello, 3, "abcd", 4);
  pb_bytes(&hello, 5, target.data, target.len);
  pb_bytes(&b, 1, hello.data, hello.len);
  nf_wire_err e;
  Neoflow__ClientMessage *m = nf_wire_decode_client((const uint8_t *)b.data, b.len, &e);
  ck_assert_msg(m != NULL, "%s", e.msg);
  nf_wire_free_client(m);
  /* a NUL in a repeated submessage's string names its index */
  nf_buf t0 = NF_BUF_INIT, graph = NF_BUF_INIT, submit = NF_BUF_INIT;
  pb_bytes(&t0, 4, "x", 1);
  pb_bytes(&graph, 2, t0.data, t0.len);
  nf_buf_reset(&t0);
  pb_bytes(&t0, 4, "y\0", 2);
  pb_bytes(&graph, 2, t0.data, t0.len);
  pb_bytes(&submit, 2, graph.data, graph.len);
  nf_buf_reset(&b);
  pb_bytes(&b, 2, submit.data, submit.len);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len,
                      "submit.graph.tensors[1].name: string holds a NUL byte");
  nf_buf_free(&hello);
  nf_buf_free(&target);
  nf_buf_free(&b);
  nf_buf_free(&t0);
  nf_buf_free(&graph);
  nf_buf_free(&submit);
}
END_TEST

/* ---- hostile inputs ---- */

/* Decodes p with every decoder: a failure has a code and a message, a
 * success packs and decodes again; a decoded Submit goes to the IR. */
static int decode_all(const uint8_t *p, size_t n) {
  int ok = 0;
  for (int kind = 0; kind < N_KINDS; kind++) {
    nf_wire_err e;
    memset(&e, 0x55, sizeof(e));
    ProtobufCMessage *m = dec(kind, p, n, &e);
    if (!m) {
      ck_assert_int_ne(e.code, NEOFLOW__ERROR_CODE__ERR_NONE);
      ck_assert_int_ne(e.code, 0x55555555);
      ck_assert_uint_gt(strnlen(e.msg, sizeof(e.msg)), 0);
      ck_assert_uint_lt(strnlen(e.msg, sizeof(e.msg)), sizeof(e.msg));
      continue;
    }
    ok++;
    ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_NONE);
    nf_buf b = NF_BUF_INIT;
    pack_into(m, &b);
    nf_wire_err e2;
    ProtobufCMessage *m2 = dec(kind, (const uint8_t *)b.data, b.len, &e2);
    ck_assert_msg(m2 != NULL || strstr(e2.msg, "budget"), "re-decode: %s", e2.msg);
    dfree(kind, m2);
    const Neoflow__Graph *pg = NULL;
    if (kind == K_CLIENT && ((Neoflow__ClientMessage *)m)->msg_case ==
                                NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT)
      pg = ((Neoflow__ClientMessage *)m)->submit->graph;
    if (kind == K_JOB_REQUEST) pg = ((Neoflow__JobRequest *)m)->graph;
    if (pg) {
      nf_ir_ctx *ctx = nf_ir_ctx_new();
      nf_graph *g = NULL;
      nf_buf err = NF_BUF_INIT;
      int rc = nf_wire_graph_to_ir(pg, ctx, &g, &err);
      ck_assert(rc == NF_OK || rc == NF_EINVAL);
      ck_assert((rc == NF_OK) == (g != NULL));
      if (rc) ck_assert_uint_gt(err.len, 0);
      nf_buf_free(&err);
      nf_ir_ctx_free(ctx);
    }
    nf_buf_free(&b);
    dfree(kind, m);
  }
  return ok;
}

START_TEST(proto_random_bytes) {
  uint8_t buf[512];
  rng_state = 0x9e3779b97f4a7c15ull;
  for (int it = 0; it < 20000; it++) {
    size_t n = rnd() % (it < 10000 ? 16 : sizeof(buf));
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
    decode_all(buf, n);
  }
}
END_TEST

START_TEST(proto_mutated_messages) {
  /* Every valid example, with a few random byte edits. */
  fixtures *f = calloc(1, sizeof(*f));
  nf_buf seeds[32];
  int n_seeds = 0;
  for (int i = 0; i < N_CLIENT_EX; i++) {
    fx_client(f, i);
    seeds[n_seeds] = (nf_buf)NF_BUF_INIT;
    pack_into(&f->cm.base, &seeds[n_seeds++]);
  }
  for (int i = 0; i < N_SERVER_EX; i++) {
    fx_server(f, i);
    seeds[n_seeds] = (nf_buf)NF_BUF_INIT;
    pack_into(&f->sm.base, &seeds[n_seeds++]);
  }
  fx_job_request(f);
  seeds[n_seeds] = (nf_buf)NF_BUF_INIT;
  pack_into(&f->jr.base, &seeds[n_seeds++]);
  for (int i = 0; i < N_JOB_EVENT_EX; i++) {
    fx_job_event(f, i);
    seeds[n_seeds] = (nf_buf)NF_BUF_INIT;
    pack_into(&f->je.base, &seeds[n_seeds++]);
  }
  rng_state = 0x0123456789abcdefull;
  uint8_t buf[4096];
  int ok = 0;
  for (int it = 0; it < 20000; it++) {
    const nf_buf *s = &seeds[rnd() % (uint64_t)n_seeds];
    size_t n = s->len < sizeof(buf) ? s->len : sizeof(buf);
    memcpy(buf, s->data, n);
    int edits = 1 + (int)(rnd() % 4);
    for (int k = 0; k < edits && n; k++) {
      size_t at = rnd() % n;
      switch (rnd() % 4) {
      case 0: buf[at] = (uint8_t)rnd(); break;
      case 1: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
      case 2: n = at; break; /* truncate */
      default: buf[at] = (uint8_t)(rnd() % 3 ? 0x00 : 0xff); break;
      }
    }
    ok += decode_all(buf, n) > 0;
  }
  ck_assert_int_gt(ok, 100); /* the edits leave some messages valid */
  for (int i = 0; i < n_seeds; i++) nf_buf_free(&seeds[i]);
  free(f);
}
END_TEST

static size_t uleb_len(uint64_t v) {
  size_t n = 1;
  while (v >>= 7) n++;
  return n;
}

/* Wraps b's contents as field `field` (length-delimited). */
static void wrap(nf_buf *b, uint32_t field) {
  nf_buf t = NF_BUF_INIT;
  pb_bytes(&t, field, b->data, b->len);
  nf_buf_free(b);
  *b = t;
}

START_TEST(proto_budget_amplification) {
  /* 4 MiB of empty Expr messages (2 bytes each, ~150 bytes decoded). */
  size_t frame = NF_WIRE_FRAME_MAX - 16;
  nf_buf b = NF_BUF_INIT;
  while (b.len + 2 <= frame) nf_buf_add(&b, "\x1a\x00", 2);
  ck_assert(!b.oom);
  wrap(&b, 2); /* Submit.graph */
  wrap(&b, 2); /* ClientMessage.submit */
  ck_assert_uint_le(b.len, NF_WIRE_FRAME_MAX);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "budget");

  /* A Graph sent a million times inside one Submit: protobuf-c merges each
   * into the previous ones (copying the repeated fields merged so far); the
   * cumulative budget stops it long before that work becomes quadratic. */
  nf_buf_reset(&b);
  while (b.len + 4 <= NF_WIRE_FRAME_MAX - 16) nf_buf_add(&b, "\x12\x02\x28\x00", 4);
  wrap(&b, 2);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "budget");

  /* Packed repeated varints: 4 MiB of one-byte shape entries (8 bytes
   * each decoded): within the budget, then refused by the count. */
  nf_buf_reset(&b);
  uint8_t *zeros = calloc(1, NF_WIRE_FRAME_MAX - 64);
  pb_bytes(&b, 3, zeros, NF_WIRE_FRAME_MAX - 64);
  wrap(&b, 2); /* Graph.tensors */
  wrap(&b, 2); /* Submit.graph */
  wrap(&b, 2);
  expect_reject_bytes(K_CLIENT, (const uint8_t *)b.data, b.len, "shape: ");
  free(zeros);

  /* 100000-deep nesting of field 1: the schema is four deep, so protobuf-c
   * never goes past that and the rest is a type mismatch. */
  size_t depth = 100000, total = 0;
  size_t *lens = malloc(depth * sizeof(*lens));
  for (size_t d = 0; d < depth; d++) {
    lens[d] = total;
    total += 1 + uleb_len(total);
  }
  uint8_t *deep = malloc(total);
  size_t pos = 0;
  for (size_t d = depth; d-- > 0;) {
    deep[pos++] = 0x0a;
    uint64_t v = lens[d];
    do {
      uint8_t byte = v & 0x7f;
      v >>= 7;
      deep[pos++] = (uint8_t)(byte | (v ? 0x80 : 0));
    } while (v);
  }
  ck_assert_uint_eq(pos, total);
  for (int kind = 0; kind < N_KINDS; kind++) {
    nf_wire_err e;
    ProtobufCMessage *m = dec(kind, deep, total, &e);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(e.code, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT);
  }
  free(lens);
  free(deep);
  nf_buf_free(&b);
}
END_TEST

/* A graph of n_stmts statements over 64x64 tensors, each a chain of
 * `depth` distinct float operations: a large legitimate graph.  Every
 * statement's tensor is an output, so none is inlined into the next (a
 * chain of local tensors would be 100 x 1500 levels deep to the code
 * generator, which nf_wire_graph_to_ir refuses). */
static nf_graph *chain_graph(nf_ir_ctx *ctx, int n_stmts, int depth) {
  nf_graph *g = nf_graph_new(ctx, "chain");
  int64_t shape[2] = {64, 64};
  int prev = nf_graph_add_tensor(g, "x", NF_F32, NF_T_INPUT, 2, shape);
  ck_assert_int_ge(prev, 0);
  for (int s = 0; s < n_stmts; s++) {
    char name[32];
    snprintf(name, sizeof(name), "t%d", s);
    int t = nf_graph_add_tensor(g, name, NF_F32, NF_T_OUTPUT, 2, shape);
    const nf_expr *idx[2] = {nf_e_var(ctx, 0), nf_e_var(ctx, 1)};
    const nf_expr *e = nf_e_access(ctx, (uint32_t)prev, NF_F32, 2, idx);
    for (int k = 0; k < depth; k++) {
      const nf_expr *c = nf_e_const_f(ctx, NF_F32, (double)(s * depth + k) + 0.5);
      e = nf_e_binary(ctx, k % 3 ? NF_OP_ADD : NF_OP_MUL, e, c);
    }
    nf_stmt st;
    memset(&st, 0, sizeof(st));
    st.out = (uint32_t)t;
    st.rhs = e;
    ck_assert_int_eq(nf_graph_add_stmt(g, &st), NF_OK);
    prev = t;
  }
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK);
  return g;
}

START_TEST(proto_budget_fits_large_graph) {
  /* About 3 MiB of expressions (the frame limit is 4 MiB) decode within
   * the budget: a legitimate graph is never refused for its size. */
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = chain_graph(ctx, 100, 1500);
  Neoflow__Graph *pg = NULL;
  ck_assert_int_eq(nf_wire_graph_from_ir(g, &pg), NF_OK);
  ck_assert_uint_gt(pg->n_exprs, 300000);
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.graph = pg;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  cm.submit = &s;
  nf_buf b = NF_BUF_INIT;
  pack_into(&cm.base, &b);
  ck_assert_uint_ge(b.len, 3u << 20);
  ck_assert_uint_le(b.len, NF_WIRE_FRAME_MAX);
  Neoflow__ClientMessage *m = (Neoflow__ClientMessage *)dec_ok(K_CLIENT, &b);
  nf_ir_ctx *ctx2 = nf_ir_ctx_new();
  nf_graph *g2 = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_wire_graph_to_ir(m->submit->graph, ctx2, &g2, &err) == NF_OK, "%s",
                nf_buf_str(&err));
  uint8_t h1[32], h2[32];
  ck_assert_int_eq(nf_graph_hash(g, h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  ck_assert(memcmp(h1, h2, 32) == 0);
  nf_wire_free_client(m);
  nf_wire_graph_free(pg);
  nf_buf_free(&b);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_ir_ctx_free(ctx2);
}
END_TEST

/* ---- graphs ---- */

/* g -> wire -> bytes (inside a Submit) -> decode -> IR; checks the hash,
 * the names and the input/output order.  Returns the wire statement flags
 * seen (or'ed). */
static uint32_t graph_roundtrip(const nf_graph *g, const char *label) {
  Neoflow__Graph *pg = NULL;
  int rc = nf_wire_graph_from_ir(g, &pg);
  ck_assert_msg(rc == NF_OK, "%s: from_ir %s", label, nf_status_name(rc));
  uint32_t flags = 0;
  for (size_t i = 0; i < pg->n_stmts; i++) flags |= pg->stmts[i]->flags;
  /* arguments always point back */
  for (size_t i = 0; i < pg->n_exprs; i++)
    for (size_t k = 0; k < pg->exprs[i]->n_args; k++) ck_assert_uint_lt(pg->exprs[i]->args[k], i);
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.graph = pg;
  s.request_id = 1;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  cm.submit = &s;
  nf_buf b = NF_BUF_INIT, err = NF_BUF_INIT;
  pack_into(&cm.base, &b);
  Neoflow__ClientMessage *m = (Neoflow__ClientMessage *)dec_ok(K_CLIENT, &b);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g2 = NULL;
  rc = nf_wire_graph_to_ir(m->submit->graph, ctx, &g2, &err);
  ck_assert_msg(rc == NF_OK, "%s: to_ir: %s", label, nf_buf_str(&err));
  uint8_t h1[32], h2[32];
  ck_assert_int_eq(nf_graph_hash(g, h1), NF_OK);
  ck_assert_int_eq(nf_graph_hash(g2, h2), NF_OK);
  ck_assert_msg(memcmp(h1, h2, 32) == 0, "%s: hash differs after the round trip", label);
  ck_assert_uint_eq(g2->n_tensors, g->n_tensors);
  ck_assert_uint_eq(g2->n_stmts, g->n_stmts);
  for (uint32_t i = 0; i < g->n_tensors; i++)
    ck_assert_str_eq(g2->tensors[i].name ? g2->tensors[i].name : "",
                     g->tensors[i].name ? g->tensors[i].name : "");
  ck_assert_str_eq(g2->name ? g2->name : "", g->name ? g->name : "");
  ck_assert_uint_eq(g2->n_inputs, g->n_inputs);
  for (uint32_t k = 0; k < g->n_inputs; k++) ck_assert_uint_eq(g2->inputs[k], g->inputs[k]);
  ck_assert_uint_eq(g2->n_outputs, g->n_outputs);
  for (uint32_t k = 0; k < g->n_outputs; k++) ck_assert_uint_eq(g2->outputs[k], g->outputs[k]);
  /* and back again: the same wire bytes */
  Neoflow__Graph *pg2 = NULL;
  ck_assert_int_eq(nf_wire_graph_from_ir(g2, &pg2), NF_OK);
  s.graph = pg2;
  nf_buf b2 = NF_BUF_INIT;
  pack_into(&cm.base, &b2);
  ck_assert_uint_eq(b2.len, b.len);
  ck_assert(memcmp(b.data, b2.data, b.len) == 0);
  nf_wire_graph_free(pg2);
  nf_wire_free_client(m);
  nf_wire_graph_free(pg);
  nf_ir_ctx_free(ctx);
  nf_buf_free(&b);
  nf_buf_free(&b2);
  nf_buf_free(&err);
  return flags;
}

static const char *lib_dir(void) {
  const char *lib = getenv("NEOFLOW_LIB");
  return lib ? lib : NF_SOURCE_LIBDIR;
}

static nf_module *load_nf(const char *rel) {
  char path[4096];
  if (!strcmp(rel, "nn.nf")) /* with the built-in operators' defs */
    nf_test_lib_path(path, sizeof path);
  else
    snprintf(path, sizeof(path), "%s/%s", lib_dir(), rel);
  nf_diag *d = nf_diag_new();
  nf_module *m = nf_module_new();
  ck_assert_ptr_nonnull(m);
  int rc = nf_module_load_file(m, path, d);
  ck_assert_msg(rc == NF_OK, "loading %s: %s\n%s", path, nf_status_name(rc), nf_diag_text(d));
  nf_diag_free(d);
  return m;
}

static nf_graph *inst(nf_module *m, const libcase *c, nf_ir_ctx *ctx) {
  nf_diag *d = nf_diag_new();
  nf_arg_shape shapes[MAX_IN];
  memset(shapes, 0, sizeof(shapes));
  for (int k = 0; k < c->n_in; k++) {
    shapes[k].rank = c->in[k].rank;
    for (int a = 0; a < c->in[k].rank; a++) shapes[k].dims[a] = c->in[k].dims[a];
  }
  nf_inst_opts o = {.n_shapes = c->n_in, .shapes = shapes, .n_params = c->n_par,
                    .param_names = c->pn, .param_values = c->pv};
  nf_graph *g = NULL;
  int rc = nf_module_instantiate(m, c->def, &o, ctx, &g, d);
  ck_assert_msg(rc == NF_OK, "%s: %s\n%s", c->label, nf_status_name(rc), nf_diag_text(d));
  nf_diag_free(d);
  return g;
}

static void roundtrip_cases(const char *file, const libcase *cases, size_t n, int *n_grads,
                            uint32_t *flags) {
  nf_module *m = load_nf(file);
  for (size_t i = 0; i < n; i++) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g = inst(m, &cases[i], ctx);
    graph_roundtrip(g, cases[i].label);
    /* its gradient graph, with respect to every float input */
    const char *wrt[MAX_IN];
    int n_wrt = 0;
    for (uint32_t k = 0; k < g->n_inputs && n_wrt < MAX_IN; k++) {
      const nf_tensor *t = &g->tensors[g->inputs[k]];
      if (nf_dtype_is_float((nf_dtype)t->dtype) && t->name) wrt[n_wrt++] = t->name;
    }
    nf_grad_opts o = {.n_wrt = n_wrt, .wrt = wrt, .keep_outputs = 1};
    nf_graph *gg = NULL;
    nf_buf err = NF_BUF_INIT;
    if (n_wrt && nf_grad_graph(g, &o, ctx, &gg, NULL, &err) == NF_OK) {
      *flags |= graph_roundtrip(gg, cases[i].label);
      (*n_grads)++;
    }
    nf_buf_free(&err);
    nf_ir_ctx_free(ctx);
  }
  nf_module_free(m);
}

START_TEST(proto_graph_roundtrip_lib) {
  int n_grads = 0;
  uint32_t flags = 0;
  roundtrip_cases("nn.nf", lib_cases, sizeof(lib_cases) / sizeof(lib_cases[0]), &n_grads,
                  &flags);
  roundtrip_cases("../examples/workloads.nf", workload_cases,
                  sizeof(workload_cases) / sizeof(workload_cases[0]), &n_grads, &flags);
  ck_assert_int_gt(n_grads, 20);
  ck_assert_uint_eq(flags, NF_STMT_SCATTER); /* some gradient scatters */
}
END_TEST

START_TEST(proto_graph_roundtrip_every_op) {
  /* One statement using every operator and dtype, inputs listed in an
   * order unlike the tensor ids, and a deep chain (no recursion). */
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "every_op");
  int64_t sh[2] = {3, 4}, sh1[1] = {4};
  int out = nf_graph_add_tensor(g, "out", NF_F32, NF_T_OUTPUT, 2, sh);
  int a = nf_graph_add_tensor(g, "a", NF_F32, NF_T_INPUT, 2, sh);
  int ix = nf_graph_add_tensor(g, "ix", NF_I64, NF_T_INPUT, 1, sh1);
  int h = nf_graph_add_tensor(g, "h", NF_F16, NF_T_INPUT, 0, NULL);
  int red = nf_graph_add_tensor(g, "red", NF_F64, NF_T_OUTPUT, 1, sh1);
  g->inputs[0] = (uint32_t)h; /* reorder: h, ix, a */
  g->inputs[2] = (uint32_t)a;
  g->outputs[0] = (uint32_t)red; /* red, out */
  g->outputs[1] = (uint32_t)out;
  const nf_expr *i = nf_e_var(c, 0), *j = nf_e_var(c, 1);
  const nf_expr *ij[2] = {i, j};
  const nf_expr *x = nf_e_access(c, (uint32_t)a, NF_F32, 2, ij);
  const nf_expr *k = nf_e_access(c, (uint32_t)ix, NF_I64, 1, &j);
  const nf_expr *hv = nf_e_cast(c, NF_F32, nf_e_access(c, (uint32_t)h, NF_F16, 0, NULL));
  const nf_expr *e = x;
  static const nf_op un[] = {NF_OP_NEG, NF_OP_EXP, NF_OP_LOG, NF_OP_SQRT, NF_OP_RSQRT,
                             NF_OP_TANH, NF_OP_SIGMOID, NF_OP_ERF, NF_OP_ABS, NF_OP_FLOOR,
                             NF_OP_CEIL, NF_OP_STOPGRAD};
  for (size_t u = 0; u < sizeof(un) / sizeof(un[0]); u++) e = nf_e_unary(c, un[u], e);
  static const nf_op bin_ops[] = {NF_OP_ADD, NF_OP_SUB, NF_OP_MUL, NF_OP_DIV, NF_OP_FLOORDIV,
                                  NF_OP_MOD, NF_OP_POW, NF_OP_MIN, NF_OP_MAX};
  for (size_t u = 0; u < sizeof(bin_ops) / sizeof(bin_ops[0]); u++)
    e = nf_e_binary(c, bin_ops[u], e, hv);
  /* integer arithmetic and comparisons on indices, i32 and bool */
  const nf_expr *ki = nf_e_binary(c, NF_OP_MOD, nf_e_binary(c, NF_OP_ADD, k, i),
                                  nf_e_const_i(c, NF_I64, 5));
  const nf_expr *k32 = nf_e_cast(c, NF_I32, ki);
  const nf_expr *cmp[6];
  static const nf_op cops[] = {NF_OP_LT, NF_OP_LE, NF_OP_GT, NF_OP_GE, NF_OP_EQ, NF_OP_NE};
  for (int u = 0; u < 6; u++) cmp[u] = nf_e_binary(c, cops[u], k32, nf_e_const_i(c, NF_I32, u - 2));
  const nf_expr *cond = nf_e_binary(c, NF_OP_AND, cmp[0], nf_e_unary(c, NF_OP_NOT, cmp[1]));
  for (int u = 2; u < 6; u++) cond = nf_e_binary(c, u % 2 ? NF_OP_OR : NF_OP_AND, cond, cmp[u]);
  cond = nf_e_binary(c, NF_OP_OR, cond, nf_e_const_i(c, NF_BOOL, 1));
  cond = nf_e_binary(c, NF_OP_EQ, cond, nf_e_cast(c, NF_BOOL, nf_e_const_f(c, NF_BF16, 0.5)));
  e = nf_e_select(c, cond, e, nf_e_const_f(c, NF_F32, -0.0));
  e = nf_e_binary(c, NF_OP_ADD, e, nf_e_cast(c, NF_F32, nf_e_const_f(c, NF_F64, NAN)));
  e = nf_e_binary(c, NF_OP_ADD, e, nf_e_const_f(c, NF_F32, INFINITY));
  for (int d = 0; d < 1900; d++) /* a deep chain, under NF_MAX_EXPR_DEPTH */
    e = nf_e_binary(c, NF_OP_MUL, e, nf_e_const_f(c, NF_F32, 1.0 + (d % 7)));
  nf_stmt s;
  memset(&s, 0, sizeof(s));
  s.out = (uint32_t)out;
  s.rhs = e;
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  /* a reduction with a negative lower bound and flags */
  memset(&s, 0, sizeof(s));
  s.out = (uint32_t)red;
  s.red = NF_RED_MAX;
  s.n_red = 2;
  s.red_lo[0] = -2;
  s.red_ext[0] = 3;
  s.red_lo[1] = 0;
  s.red_ext[1] = 0; /* empty: the identity */
  s.flags = NF_STMT_SCATTER;
  s.rhs = nf_e_cast(c, NF_F64,
                    nf_e_binary(c, NF_OP_MUL, nf_e_cast(c, NF_I64, nf_e_const_i(c, NF_I32, -7)),
                                nf_e_binary(c, NF_OP_SUB, nf_e_var(c, 1), nf_e_var(c, 2))));
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  ck_assert_int_eq(nf_graph_validate(g, NULL), NF_OK);
  ck_assert_uint_eq(graph_roundtrip(g, "every_op"), NF_STMT_SCATTER);
  nf_ir_ctx_free(c);
}
END_TEST

START_TEST(proto_graph_from_ir_invalid) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "bad");
  int64_t sh[1] = {2};
  nf_graph_add_tensor(g, "o", NF_F32, NF_T_OUTPUT, 1, sh); /* never produced */
  Neoflow__Graph *pg = (Neoflow__Graph *)1;
  ck_assert_int_eq(nf_wire_graph_from_ir(g, &pg), NF_EINVAL);
  ck_assert_ptr_null(pg);
  nf_wire_graph_free(NULL);
  nf_ir_ctx_free(c);
}
END_TEST

/* Invalid wire graphs: label, expected message fragment. */
static const struct {
  const char *label, *want;
} gcases[] = {
    {"forward argument", "exprs[4].args[1]: refers to exprs[5], not an earlier expression"},
    {"cycle through itself", "exprs[4].args[0]: refers to exprs[4]"},
    {"dangling tensor", "exprs[2]: ACCESS of tensor 7, out of range (4 tensors)"},
    {"ADD of f32 and i64", "exprs[4]: ADD of f32 and i64"},
    {"access index count", "exprs[2]: ACCESS with 1 arguments, expected 2"},
    {"access index dtype", "exprs[3]: ACCESS index 1 is f32, not i64"},
    {"access dtype", "exprs[2]: ACCESS has dtype f64, its operands give f32"},
    {"negative shape", "tensors[0] (A): negative size -3 in dimension 1"},
    {"shape overflow", "tensors[0] (A): element count overflows int64"},
    {"rank 9", "tensors[3] (D): rank 9 exceeds 8"},
    {"unknown op", "exprs[4]: unknown op 99"},
    {"unknown dtype", "tensors[1]: unknown dtype 12"},
    {"statement writes an input", "stmts[0]: writes INPUT tensor 0 (A)"},
    {"output never produced", "tensor 3 (D) is never produced"},
    {"variable over the limit", "exprs[1]: variable 24 out of range"},
    {"variable over the statement's", "variable 5 out of range"},
    {"expression count", "exprs: 1048577 entries, at most 1048576 allowed"},
    {"rhs out of range", "stmts[0]: rhs 8 out of range (6 exprs)"},
    {"rhs dtype", "stmts[0]: right side is i64, tensor 2 (C) is f32"},
    {"reduction arrays differ", "stmts[1]: 1 red_lo but 0 red_ext"},
    {"negative extent", "stmts[1]: red_ext[0] is negative (-1)"},
    {"reduction range overflow", "stmts[1]: reduction range 0 overflows"},
    {"reduction variables without reduction", "reduction variables without a reduction"},
    {"unknown reduction", "stmts[1]: unknown reduction 9"},
    {"unknown flags", "stmts[0]: unknown flags 0x4"},
    {"input not listed", "tensors[0] (A): INPUT tensor missing from inputs"},
    {"local listed as input", "inputs[1]: tensor 2 (C) is not an INPUT tensor"},
    {"input listed twice", "inputs[1]: tensor 1 (B) listed twice"},
    {"output not an output", "outputs[0]: tensor 2 (C) is not an OUTPUT tensor"},
    {"read before produced", "reads tensor 2 (C) before it is produced"},
    {"produced twice", "tensor 2 (C) is produced twice"},
    {"bool constant 2", "exprs[0]: bool constant 2 is not 0 or 1"},
    {"i32 constant overflow", "exprs[0]: i32 constant 1099511627776 out of range"},
    {"constant with another payload", "exprs[0]: CONST of f32 carries another payload"},
    {"ADD with a payload", "exprs[4]: ADD carries a payload"},
    {"select condition", "exprs[4]: SELECT condition is f32, not bool"},
    {"comparison dtypes", "exprs[4]: LT of i64 and f32"},
    {"declared dtype", "exprs[4]: LT has dtype f32, its operands give bool"},
    {"DIV of ints", "exprs[4]: DIV of i64"},
    {"EXP of an int", "exprs[4]: EXP of i64 needs a float operand"},
    {"NOT of a float", "exprs[4]: NOT of f32 needs a bool operand"},
    {"AND of ints", "exprs[4]: AND of i64 and i64 (needs bool)"},
    {"unary arity", "exprs[4]: NEG with 2 arguments, expected 1"},
    {"tensor count", "tensors: 4097 entries, at most 4096 allowed"},
    {"statement output out of range", "stmts[0]: output tensor 9 out of range"},
    {"too many reduction variables", "stmts[1]: 24 reduction variables with rank 1 exceed 24"},
    {"unknown kind", "tensors[2]: unknown kind 5"},
    {"long tensor name", "tensors[0]: name longer than 64 bytes"},
    {"no graph", "no graph"},
    {"select branches", "exprs[4]: SELECT branches are f32 and i64"},
    {"NEG of bool", "exprs[4]: NEG of bool needs a numeric operand"},
    {"neg_zero with a value", "exprs[0]: CONST with neg_zero and f = 1.5"},
    {"neg_zero on an integer", "exprs[0]: CONST of i64 carries another payload"},
    {"neg_zero on ADD", "exprs[4]: ADD carries a payload"},
};

START_TEST(proto_graph_invalid) {
  wg *w = calloc(1, sizeof(*w));
  wg_init(w);
  const Neoflow__Graph *pg = &w->g;
  Neoflow__Expr **many_x = NULL;
  Neoflow__Tensor **many_t = NULL;
  Neoflow__Expr *x4 = &w->x[4];
  switch (_i) {
  case 0: w->args[4][1] = 5; break;
  case 1: w->args[4][0] = 4; break;
  case 2: w->x[2].tensor = 7; break;
  case 3: w->args[4][1] = 0; break;
  case 4: w->x[2].n_args = 1; break;
  case 5: w->args[3][1] = 2; break;
  case 6: w->x[2].dtype = NEOFLOW__DTYPE__DT_F64; break;
  case 7: w->shape[0][1] = -3; break;
  case 8: w->shape[0][0] = INT64_C(1) << 62; w->shape[0][1] = 4; break;
  case 9: w->t[3].n_shape = 9; break;
  case 10: x4->op = (Neoflow__Op)99; break;
  case 11: w->t[1].dtype = (Neoflow__DType)12; break;
  case 12: w->s[0].out = 0; break;
  case 13: w->g.n_stmts = 1; break;
  case 14: w->x[1].var = 24; break;
  case 15: w->x[1].var = 5; break;
  case 16:
    many_x = malloc((NF_WIRE_MAX_EXPRS + 1) * sizeof(*many_x));
    for (size_t k = 0; k <= NF_WIRE_MAX_EXPRS; k++) many_x[k] = &w->x[0];
    w->g.exprs = many_x;
    w->g.n_exprs = NF_WIRE_MAX_EXPRS + 1;
    break;
  case 17: w->s[0].rhs = 8; break;
  case 18: w->s[0].rhs = 0; break;
  case 19: w->s[1].n_red_ext = 0; break;
  case 20: w->red_ext[1][0] = -1; break;
  case 21: w->red_lo[1][0] = INT64_MAX; break;
  case 22: w->s[1].red = NEOFLOW__RED_OP__RED_NONE; break;
  case 23: w->s[1].red = (Neoflow__RedOp)9; break;
  case 24: w->s[0].flags = 4; break;
  case 25: w->inputs[0] = 1; w->g.n_inputs = 1; break;
  case 26: w->inputs[1] = 2; break;
  case 27: w->inputs[1] = 1; break;
  case 28: w->outputs[0] = 2; break;
  case 29: w->sp[0] = &w->s[1]; w->sp[1] = &w->s[0]; break;
  case 30: w->s[1].out = 2; break;
  case 31: w->x[0].op = NEOFLOW__OP__OP_CONST; w->x[0].dtype = NEOFLOW__DTYPE__DT_BOOL; w->x[0].i = 2; break;
  case 32: w->x[0].op = NEOFLOW__OP__OP_CONST; w->x[0].dtype = NEOFLOW__DTYPE__DT_I32; w->x[0].i = INT64_C(1) << 40; break;
  case 33: w->x[0].op = NEOFLOW__OP__OP_CONST; w->x[0].dtype = NEOFLOW__DTYPE__DT_F32; w->x[0].i = 5; break;
  case 34: x4->var = 3; break;
  case 35: x4->op = NEOFLOW__OP__OP_SELECT; x4->n_args = 3; w->args[4][0] = 2; w->args[4][1] = 2; w->args[4][2] = 3; break;
  case 36: x4->op = NEOFLOW__OP__OP_LT; x4->dtype = NEOFLOW__DTYPE__DT_BOOL; w->args[4][0] = 0; w->args[4][1] = 2; break;
  case 37: x4->op = NEOFLOW__OP__OP_LT; break;
  case 38: x4->op = NEOFLOW__OP__OP_DIV; x4->dtype = NEOFLOW__DTYPE__DT_I64; w->args[4][0] = 0; w->args[4][1] = 1; break;
  case 39: x4->op = NEOFLOW__OP__OP_EXP; x4->dtype = NEOFLOW__DTYPE__DT_I64; x4->n_args = 1; w->args[4][0] = 0; break;
  case 40: x4->op = NEOFLOW__OP__OP_NOT; x4->n_args = 1; break;
  case 41: x4->op = NEOFLOW__OP__OP_AND; x4->dtype = NEOFLOW__DTYPE__DT_BOOL; w->args[4][0] = 0; w->args[4][1] = 1; break;
  case 42: x4->op = NEOFLOW__OP__OP_NEG; break;
  case 43:
    many_t = malloc(4097 * sizeof(*many_t));
    for (int k = 0; k < 4097; k++) many_t[k] = &w->t[2];
    w->g.tensors = many_t;
    w->g.n_tensors = 4097;
    break;
  case 44: w->s[0].out = 9; break;
  case 45: w->s[1].n_red_lo = w->s[1].n_red_ext = 24; break;
  case 46: w->t[2].kind = (Neoflow__TensorKind)5; break;
  case 47:
    memset(w->long_name, 'q', 65);
    w->t[0].name = w->long_name;
    break;
  case 48: pg = NULL; break;
  case 49: x4->op = NEOFLOW__OP__OP_SELECT; x4->n_args = 3; w->args[4][2] = 0; w->x[3].op = NEOFLOW__OP__OP_LT; w->x[3].tensor = 0; w->x[3].dtype = NEOFLOW__DTYPE__DT_BOOL; w->args[4][0] = 3; w->args[4][1] = 2; w->args[3][0] = 0; w->args[3][1] = 1; break;
  case 51: w->x[0].op = NEOFLOW__OP__OP_CONST; w->x[0].dtype = NEOFLOW__DTYPE__DT_F32; w->x[0].f = 1.5; w->x[0].neg_zero = 1; break;
  case 52: w->x[0].op = NEOFLOW__OP__OP_CONST; w->x[0].neg_zero = 1; break;
  case 53: x4->neg_zero = 1; break;
  case 50: x4->op = NEOFLOW__OP__OP_NEG; x4->n_args = 1; x4->dtype = NEOFLOW__DTYPE__DT_BOOL; w->x[3].op = NEOFLOW__OP__OP_LT; w->x[3].tensor = 0; w->x[3].dtype = NEOFLOW__DTYPE__DT_BOOL; w->args[3][0] = 0; w->args[3][1] = 1; w->args[4][0] = 3; break;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = (nf_graph *)1;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_wire_graph_to_ir(pg, ctx, &g, &err);
  ck_assert_msg(rc == NF_EINVAL, "%s: accepted (%s)", gcases[_i].label, nf_status_name(rc));
  ck_assert_ptr_null(g);
  ck_assert_msg(strstr(nf_buf_str(&err), gcases[_i].want) != NULL, "%s: '%s' lacks '%s'",
                gcases[_i].label, nf_buf_str(&err), gcases[_i].want);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  free(many_x);
  free(many_t);
  free(w);
}
END_TEST

/* n_stmts rank-0 outputs, each the same chain of `depth` NEGs of X. */
static int shared_chain(size_t n_stmts, size_t depth, nf_buf *err) {
  size_t nt = n_stmts + 1;
  Neoflow__Tensor *t = calloc(nt, sizeof(*t));
  Neoflow__Tensor **tp = calloc(nt, sizeof(*tp));
  Neoflow__Expr *x = calloc(depth, sizeof(*x));
  Neoflow__Expr **xp = calloc(depth, sizeof(*xp));
  uint32_t *args = calloc(depth, sizeof(*args));
  Neoflow__Stmt *st = calloc(n_stmts, sizeof(*st));
  Neoflow__Stmt **sp = calloc(n_stmts, sizeof(*sp));
  uint32_t *outs = calloc(n_stmts, sizeof(*outs)), in0 = 0;
  for (size_t i = 0; i < nt; i++) {
    neoflow__tensor__init(&t[i]);
    t[i].dtype = NEOFLOW__DTYPE__DT_F32;
    t[i].kind = i ? NEOFLOW__TENSOR_KIND__TK_OUTPUT : NEOFLOW__TENSOR_KIND__TK_INPUT;
    tp[i] = &t[i];
  }
  for (size_t i = 0; i < depth; i++) {
    neoflow__expr__init(&x[i]);
    x[i].dtype = NEOFLOW__DTYPE__DT_F32;
    xp[i] = &x[i];
    if (i == 0) {
      x[i].op = NEOFLOW__OP__OP_ACCESS;
    } else {
      x[i].op = NEOFLOW__OP__OP_NEG;
      args[i] = (uint32_t)i - 1;
      x[i].args = &args[i];
      x[i].n_args = 1;
    }
  }
  for (size_t i = 0; i < n_stmts; i++) {
    neoflow__stmt__init(&st[i]);
    st[i].out = (uint32_t)i + 1;
    st[i].rhs = (uint32_t)depth - 1;
    sp[i] = &st[i];
    outs[i] = (uint32_t)i + 1;
  }
  Neoflow__Graph g = NEOFLOW__GRAPH__INIT;
  g.n_tensors = nt;
  g.tensors = tp;
  g.n_exprs = depth;
  g.exprs = xp;
  g.n_stmts = n_stmts;
  g.stmts = sp;
  g.n_inputs = 1;
  g.inputs = &in0;
  g.n_outputs = n_stmts;
  g.outputs = outs;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *out = NULL;
  int rc = nf_wire_graph_to_ir(&g, ctx, &out, err);
  nf_ir_ctx_free(ctx);
  free(t);
  free(tp);
  free(x);
  free(xp);
  free(args);
  free(st);
  free(sp);
  free(outs);
  return rc;
}

START_TEST(proto_graph_shared_work_bounded) {
  /* 2000 statements x 1500 nodes is fine; 3000 x 1500 passes the limit of
   * nodes reached per statement summed over statements. */
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(shared_chain(2000, 1500, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(shared_chain(3000, 1500, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "reach more than 4194304 expression nodes"), "%s",
                nf_buf_str(&err));
  nf_buf_free(&err);
}
END_TEST

START_TEST(proto_graph_template_valid) {
  /* The template the invalid cases mutate converts, keeping the input
   * order [B, A]. */
  wg *w = calloc(1, sizeof(*w));
  wg_init(w);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_wire_graph_to_ir(&w->g, ctx, &g, &err) == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_uint_eq(g->n_inputs, 2);
  ck_assert_uint_eq(g->inputs[0], 1);
  ck_assert_uint_eq(g->inputs[1], 0);
  ck_assert_str_eq(g->name, "small");
  ck_assert_str_eq(g->tensors[3].name, "D");
  ck_assert_int_eq(g->stmts[1].red, NF_RED_SUM);
  ck_assert_int_eq(g->stmts[1].red_ext[0], 3);
  graph_roundtrip(g, "template");
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  free(w);
}
END_TEST

/* ---- the validator (issue 31): depth and index bounds ---- */

/* nf_wire_graph_to_ir of pg: its status, the message in err. */
static int to_ir(const Neoflow__Graph *pg, nf_buf *err) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = (nf_graph *)1;
  nf_buf_reset(err);
  int rc = nf_wire_graph_to_ir(pg, ctx, &g, err);
  if (rc != NF_OK) ck_assert_ptr_null(g);
  nf_ir_ctx_free(ctx);
  return rc;
}

#define ASSERT_HAS(err, text)                                                        \
  ck_assert_msg(strstr(nf_buf_str(err), text) != NULL, "'%s' lacks '%s'", nf_buf_str(err), \
                text)

START_TEST(proto_graph_deep_chain_refused) {
  /* 300,000 levels (the compile job died of a stack overflow on it):
   * refused from the wire list, before anything walks it */
  deep_wire *w = malloc(sizeof(*w));
  nf_buf err = NF_BUF_INIT;
  deep_wire_init(w, 300000);
  ck_assert_int_eq(to_ir(&w->g, &err), NF_EINVAL);
  ASSERT_HAS(&err, "stmts[0] (Y): right side nested 300002 levels deep, more than 2048");
  deep_wire_free(w);
  /* at the limit it is a graph like any other; one more level is not */
  deep_wire_init(w, NF_MAX_EXPR_DEPTH - 2);
  ck_assert_msg(to_ir(&w->g, &err) == NF_OK, "%s", nf_buf_str(&err));
  deep_wire_free(w);
  deep_wire_init(w, NF_MAX_EXPR_DEPTH - 1);
  ck_assert_int_eq(to_ir(&w->g, &err), NF_EINVAL);
  ASSERT_HAS(&err, "nested 2049 levels deep");
  deep_wire_free(w);
  free(w);
  nf_buf_free(&err);
}
END_TEST

/* T = NOT^a X (kind tk), Y = NOT^b T: each statement under the limit. */
static Neoflow__Graph *two_chains(int a, int b, nf_tkind tk) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(c, "chains");
  int64_t sh[1] = {8};
  int x = nf_graph_add_tensor(g, "X", NF_BOOL, NF_T_INPUT, 1, sh);
  int t = nf_graph_add_tensor(g, "T", NF_BOOL, tk, 1, sh);
  int y = nf_graph_add_tensor(g, "Y", NF_BOOL, NF_T_OUTPUT, 1, sh);
  const nf_expr *i = nf_e_var(c, 0);
  for (int s = 0; s < 2; s++) {
    const nf_expr *e = nf_e_access(c, (uint32_t)(s ? t : x), NF_BOOL, 1, &i);
    for (int k = 0; k < (s ? b : a); k++) e = nf_e_unary(c, NF_OP_NOT, e);
    nf_stmt st;
    memset(&st, 0, sizeof(st));
    st.out = (uint32_t)(s ? y : t);
    st.rhs = e;
    ck_assert_int_eq(nf_graph_add_stmt(g, &st), NF_OK);
  }
  Neoflow__Graph *pg = NULL;
  ck_assert_int_eq(nf_wire_graph_from_ir(g, &pg), NF_OK);
  nf_ir_ctx_free(c);
  return pg;
}

START_TEST(proto_graph_inlined_depth_refused) {
  /* A local tensor defined without a reduction may be inlined at its
   * use: 1500 + 1000 levels reach the code generator as one expression. */
  nf_buf err = NF_BUF_INIT;
  Neoflow__Graph *pg = two_chains(1500, 1000, NF_T_LOCAL);
  ck_assert_int_eq(to_ir(pg, &err), NF_EINVAL);
  ASSERT_HAS(&err, "statement 1 (Y): right side nested 2502 levels deep once the producers a "
                   "schedule may inline");
  nf_wire_graph_free(pg);
  /* as an output T is never inlined */
  pg = two_chains(1500, 1000, NF_T_OUTPUT);
  ck_assert_msg(to_ir(pg, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_wire_graph_free(pg);
  pg = two_chains(1000, 1000, NF_T_LOCAL);
  ck_assert_msg(to_ir(pg, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_wire_graph_free(pg);
  nf_buf_free(&err);
}
END_TEST

/* Runs bounds_graph(variant, n) in the interpreter on non-zero data
 * (ix: in bounds); its status. */
static int interp_bounds(int variant, int64_t n) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_graph *g = bounds_graph(c, variant, n);
  nf_array in[3], out[1];
  rng r = {7};
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    ck_assert_int_eq(nf_array_alloc(&in[k], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
    for (int64_t e = 0; e < in[k].numel; e++)
      if (t->dtype == NF_I64)
        ((int64_t *)in[k].data)[e] = e % n;
      else
        ((float *)in[k].data)[e] = (float)rng_nz(&r, 1.0);
  }
  nf_buf err = NF_BUF_INIT;
  int rc = nf_interp_run(g, in, NF_INTERP_F32, out, &err);
  if (rc == NF_OK) nf_array_free(&out[0]);
  for (uint32_t k = 0; k < g->n_inputs; k++) nf_array_free(&in[k]);
  nf_buf_free(&err);
  nf_ir_ctx_free(c);
  return rc;
}

/* Accesses certainly read out of bounds: variant, message fragments. */
static const struct {
  int variant;
  const char *want[2];
} oob_cases[] = {
    {BG_SHIFT_1000,
     {"statement 0 (C): A(v0 + 1000, v2) reads out of bounds: index 0 is 1007 at v0=7, v1=0, "
      "v2=0; A has size 8 in dimension 0",
      ""}},
    {BG_SHIFT_1, {"statement 0 (C): A(v0 + 1, v2) reads out of bounds: index 0 is 8 at v0=7", ""}},
    {BG_GUARD_SHORT,
     {"statement 0 (C): A(v0 - 3, v2) reads out of bounds: index 0 is -1 at v0=2",
      "A has size 8 in dimension 0"}},
    {BG_MOD, {"A((v0 * 5) % 11, v2) reads out of bounds: index 0 is 10 at v0=2", ""}},
};

START_TEST(proto_graph_bounds_refused) {
  /* refused before codegen, as INVALID_GRAPH material, naming the
   * statement, the access and a point; the interpreter fails on them too */
  nf_buf err = NF_BUF_INIT;
  Neoflow__Graph *pg = bounds_wire(oob_cases[_i].variant, 8);
  ck_assert_int_eq(to_ir(pg, &err), NF_EINVAL);
  ASSERT_HAS(&err, oob_cases[_i].want[0]);
  ASSERT_HAS(&err, oob_cases[_i].want[1]);
  ck_assert_int_eq(interp_bounds(oob_cases[_i].variant, 8), NF_EBOUNDS);
  nf_wire_graph_free(pg);
  nf_buf_free(&err);
}
END_TEST

START_TEST(proto_graph_bounds_guarded) {
  /* Accepted: out of range only where the guard is false (i >= 3 before
   * A(i - 3, k); padding; a guard on i + k; a guard never true), a
   * non-affine index in bounds, a gather (checked when it runs), a
   * guard on data (the graph may well be valid), a reduction over
   * nothing.  Each runs in the interpreter too, but the data guard. */
  static const int ok[] = {BG_GUARD_OK, BG_GUARD_NEVER, BG_GUARD_SUM, BG_PAD, BG_PAD_NOT,
                           BG_MOD_OK, BG_GATHER, BG_DATA_GUARD, BG_EMPTY};
  nf_buf err = NF_BUF_INIT;
  for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
    Neoflow__Graph *pg = bounds_wire(ok[k], 8);
    ck_assert_msg(to_ir(pg, &err) == NF_OK, "variant %d: %s", ok[k], nf_buf_str(&err));
    if (ok[k] != BG_DATA_GUARD) ck_assert_int_eq(interp_bounds(ok[k], 8), NF_OK);
    nf_wire_graph_free(pg);
  }
  /* ... while a guard that lets one row through does not pass */
  Neoflow__Graph *pg = bounds_wire(BG_GUARD_SHORT, 8);
  ck_assert_int_eq(to_ir(pg, &err), NF_EINVAL);
  nf_wire_graph_free(pg);
  /* big boxes are not enumerated: the corners find it */
  pg = bounds_wire(BG_SHIFT_1, 1000);
  ck_assert_int_eq(to_ir(pg, &err), NF_EINVAL);
  ASSERT_HAS(&err, "index 0 is 1000 at v0=999, v1=0, v2=0");
  nf_wire_graph_free(pg);
  pg = bounds_wire(BG_GUARD_OK, 1000);
  ck_assert_msg(to_ir(pg, &err) == NF_OK, "%s", nf_buf_str(&err));
  nf_wire_graph_free(pg);
  nf_buf_free(&err);
}
END_TEST

/* ---- the seed corpus for tests/fuzz/fuzz_wire.c ---- */

/* Writes one corpus file: a control byte (0: a stream of frames, 1: one
 * raw payload), four split-size bytes, then the data. */
static void corpus_file(const char *dir, const char *name, int raw, const nf_buf *data) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s%s", dir, raw ? "raw_" : "stream_", name);
  FILE *fp = fopen(path, "wb");
  if (!fp) {
    fprintf(stderr, "cannot write %s\n", path);
    return;
  }
  uint8_t ctl[5] = {(uint8_t)raw, 7, 1, 200, 33};
  fwrite(ctl, 1, sizeof(ctl), fp);
  fwrite(data->data, 1, data->len, fp);
  fclose(fp);
}

/* (Runs outside the tests, so no ck_assert here.) */
static void corpus_msg(const char *dir, const char *name, const ProtobufCMessage *m) {
  nf_buf raw = NF_BUF_INIT, framed = NF_BUF_INIT;
  if (nf_wire_pack(m, UINT32_MAX, &framed) != NF_OK) {
    fprintf(stderr, "cannot pack %s\n", name);
    return;
  }
  nf_buf_add(&raw, framed.data + 4, framed.len - 4);
  corpus_file(dir, name, 1, &raw);
  corpus_file(dir, name, 0, &framed);
  nf_buf_free(&raw);
  nf_buf_free(&framed);
}

static void write_corpus(const char *dir) {
  fixtures *f = calloc(1, sizeof(*f));
  char name[64];
  for (int i = 0; i < N_CLIENT_EX; i++) {
    fx_client(f, i);
    snprintf(name, sizeof(name), "client%d", i);
    corpus_msg(dir, name, &f->cm.base);
  }
  for (int i = 0; i < N_SERVER_EX; i++) {
    fx_server(f, i);
    snprintf(name, sizeof(name), "server%d", i);
    corpus_msg(dir, name, &f->sm.base);
  }
  fx_job_request(f);
  corpus_msg(dir, "job_request", &f->jr.base);
  for (int i = 0; i < N_JOB_EVENT_EX; i++) {
    fx_job_event(f, i);
    snprintf(name, sizeof(name), "job_event%d", i);
    corpus_msg(dir, name, &f->je.base);
  }
  free(f);
}

/* ---- suite ---- */

static Suite *proto_suite(void) {
  Suite *s = suite_create("proto");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, proto_reader_bytewise);
  tcase_add_test(tc, proto_reader_one_chunk);
  tcase_add_test(tc, proto_reader_zero_length);
  tcase_add_test(tc, proto_reader_lying_length);
  tcase_add_test(tc, proto_reader_set_max);
  tcase_add_test(tc, proto_read_write_frame);
  tcase_add_test(tc, proto_read_frame_errors);
  tcase_add_test(tc, proto_write_frame_errors);
  tcase_add_test(tc, proto_big_frame_pipe);
  tcase_add_test(tc, proto_pack_limit);
  tcase_add_test(tc, proto_roundtrip_client);
  tcase_add_test(tc, proto_roundtrip_server);
  tcase_add_test(tc, proto_roundtrip_job);
  tcase_add_test(tc, proto_unknown_field_rejected);
  tcase_add_test(tc, proto_unknown_enum_rejected);
  tcase_add_test(tc, proto_oneof_not_set);
  tcase_add_test(tc, proto_oneof_twice);
  tcase_add_loop_test(tc, proto_invalid_fields, 0,
                      (int)(sizeof(field_cases) / sizeof(field_cases[0])));
  tcase_add_test(tc, proto_text_accepted);
  tcase_add_test(tc, proto_text_sanitize);
  tcase_add_test(tc, proto_nul_in_string_rejected);
  tcase_add_test(tc, proto_random_bytes);
  tcase_add_test(tc, proto_mutated_messages);
  tcase_add_test(tc, proto_budget_amplification);
  tcase_add_test(tc, proto_budget_fits_large_graph);
  tcase_add_test(tc, proto_graph_roundtrip_lib);
  tcase_add_test(tc, proto_graph_roundtrip_every_op);
  tcase_add_test(tc, proto_graph_from_ir_invalid);
  tcase_add_test(tc, proto_graph_template_valid);
  tcase_add_test(tc, proto_graph_shared_work_bounded);
  tcase_add_loop_test(tc, proto_graph_invalid, 0, (int)(sizeof(gcases) / sizeof(gcases[0])));
  TCase *tv = tcase_create("validator"); /* CK_RUN_CASE=validator runs it alone */
  tcase_set_timeout(tv, 120);
  tcase_add_test(tv, proto_graph_deep_chain_refused);
  tcase_add_test(tv, proto_graph_inlined_depth_refused);
  tcase_add_loop_test(tv, proto_graph_bounds_refused, 0,
                      (int)(sizeof(oob_cases) / sizeof(oob_cases[0])));
  tcase_add_test(tv, proto_graph_bounds_guarded);
  suite_add_tcase(s, tc);
  suite_add_tcase(s, tv);
  return s;
}

int main(void) {
  init_keys();
  const char *corpus = getenv("NF_WIRE_CORPUS_DIR");
  if (corpus && corpus[0]) write_corpus(corpus);
  SRunner *sr = srunner_create(proto_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
