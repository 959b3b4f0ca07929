/* test_daemon.c - neoflowd for real: each test starts the daemon ($NF_NEOFLOWD)
 * on a socket and a cache in a fresh temporary directory and talks to it
 * through nf_dconn or a raw socket.
 *
 *  - a compile request is answered with a tier-1 kernel (an ELF shared
 *    object, digest checked by the client); a second request, on another
 *    connection, is a cache hit with the same bytes;
 *  - a restart (SIGTERM, exit 0) keeps everything: the same request is a hit;
 *  - 32 clients submitting the same subgraph to tune cause one compile job
 *    and one tuning job (the daemon's job counters), and all 32 receive the
 *    final kernel;
 *  - hostile peers, each answered with its typed error or a disconnect while
 *    another client is served: a lying length prefix, an oversized frame
 *    before the handshake, random bytes, a first message that is not a
 *    Hello, a truncated frame, a protocol version out of range, an invalid
 *    graph (request-level error; the session goes on), a stalled handshake,
 *    a frame that stops half-way, a client that never reads (dropped after
 *    the soft output limit holds), a client that disconnects in the middle
 *    of a tuning job (the job stops; the next request is served);
 *  - the validator (issue 31): a 300,000-deep chain and an access certainly
 *    out of bounds get ERR_INVALID_GRAPH naming the statement, a
 *    2^30 x 2^30 matrix product and one over max_gflops get
 *    ERR_UNSUPPORTED_GRAPH naming the cap and its key, the session goes on,
 *    and an access out of range only where its guard is false is compiled
 *    and computes what the interpreter does;
 *  - max_connections: the connections beyond it get ERR_BUSY;
 *  - TCP with a key: the right key passes, a wrong key or none is refused,
 *    a Hello answering another connection's challenge is refused;
 *  - kill -9 while the daemon stores kernels, restart, repeatedly: the
 *    cache verifies (integrity check and every entry's digest) and holds
 *    only complete entries;
 *  - a second daemon on the same cache refuses to start ("already");
 *  - SIGHUP reloads the configuration and the daemon goes on serving;
 *  - status lists the clients, the jobs and the hit rate;
 *  - as root: another uid cannot reach the socket (directory 0700). */
#include <check.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "nf_cache.h"
#include "nf_codegen.h"
#include "nf_cuda.h"
#include "nf_cuda_plan.h"
#include "nf_target.h"
#include "nf_dconn.h"
#include "nf_exec.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_wire.h"
#include "nf_wire_auth.h"

#include "nf_test_daemon.h"
#include "nf_test_graphs.h"

/* 1 when the daemon's log holds text. */
static int log_has(const dm *d, const char *text) {
  FILE *f = fopen(d->log, "r");
  char line[4096];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
  if (f) fclose(f);
  return found;
}

static int dm_alive(dm *d) { return d->pid > 0 && kill(d->pid, 0) == 0 && waitpid(d->pid, NULL, WNOHANG) == 0; }

/* ---- graphs ---- */

/* C[i,j] = sum_k A[i,k] * B[k,j], n x n (n picks the key). */
static nf_graph *mm_graph(nf_ir_ctx *ctx, int64_t n) {
  nf_graph *g = nf_graph_new(ctx, "mm");
  int64_t sh[2] = {n, n};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sh);
  int c = nf_graph_add_tensor(g, "C", NF_F32, NF_T_OUTPUT, 2, sh);
  const nf_expr *i = nf_e_var(ctx, 0), *j = nf_e_var(ctx, 1), *k = nf_e_var(ctx, 2);
  const nf_expr *ia[2] = {i, k}, *ib[2] = {k, j};
  const nf_expr *rhs = nf_e_binary(ctx, NF_OP_MUL, nf_e_access(ctx, (uint32_t)a, NF_F32, 2, ia),
                                   nf_e_access(ctx, (uint32_t)b, NF_F32, 2, ib));
  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)c;
  s.red = NF_RED_SUM;
  s.n_red = 1;
  s.red_ext[0] = n;
  s.rhs = rhs;
  ck_assert_int_eq(nf_graph_add_stmt(g, &s), NF_OK);
  return g;
}

static Neoflow__Graph *mm_wire(int64_t n) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  Neoflow__Graph *pg = NULL;
  ck_assert_int_eq(nf_wire_graph_from_ir(mm_graph(ctx, n), &pg), NF_OK);
  nf_ir_ctx_free(ctx);
  return pg;
}

/* ---- a client ---- */

static nf_dconn *open_client(dm *d, const char *name) {
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = d->sock, .client_name = name, .timeout_ms = 10000};
  int rc = nf_dconn_open(&o, &c, &err);
  ck_assert_msg(rc == NF_OK, "connect: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  return c;
}

static void submit(nf_dconn *c, uint64_t id, Neoflow__Graph *pg, int mode, int trials) {
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = id;
  s.graph = pg;
  s.mode = mode;
  s.max_trials = (uint32_t)trials;
  s.max_seconds = 60;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  m.submit = &s;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_dconn_send(c, &m, &err), NF_OK);
  nf_buf_free(&err);
}

/* Waits for request id's final kernel (skipping non-final ones). */
static void final_kernel(nf_dconn *c, uint64_t id, nf_dkernel *k, int *n_kernels) {
  nf_buf err = NF_BUF_INIT;
  int code = 0, n = 0;
  for (;;) {
    int rc = nf_dconn_next_kernel(c, id, 120000, NULL, NULL, k, &code, &err);
    ck_assert_msg(rc == NF_OK, "request %llu: %s (code %d)", (unsigned long long)id,
                  nf_buf_str(&err), code);
    n++;
    if (k->final) break;
    nf_dkernel_free(k);
  }
  if (n_kernels) *n_kernels = n;
  nf_buf_free(&err);
}

static Neoflow__StatusReply *status_of(nf_dconn *c, Neoflow__ServerMessage **hold) {
  Neoflow__StatusRequest sr = NEOFLOW__STATUS_REQUEST__INIT;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STATUS;
  m.status = &sr;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_dconn_send(c, &m, &err), NF_OK);
  for (;;) {
    Neoflow__ServerMessage *r = NULL;
    ck_assert_int_eq(nf_dconn_recv(c, 10000, &r, &err), NF_OK);
    if (r->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_STATUS) {
      *hold = r;
      nf_buf_free(&err);
      return r->status;
    }
    nf_wire_free_server(r);
  }
}

/* Waits (up to 20 s) until the daemon has no job left; returns the count. */
static int wait_no_jobs(nf_dconn *c) {
  int n = -1;
  for (int i = 0; i < 200 && n != 0; i++) {
    Neoflow__ServerMessage *hold;
    n = (int)status_of(c, &hold)->n_jobs;
    nf_wire_free_server(hold);
    if (n) sleep_ms(100);
  }
  return n;
}

/* The committed cache entries, once they reach n (writes are
 * asynchronous: up to 10 s). */
static uint64_t wait_entries(nf_dconn *c, uint64_t n) {
  uint64_t got = 0;
  for (int i = 0; i < 200; i++) {
    Neoflow__ServerMessage *hold;
    got = status_of(c, &hold)->cache_entries;
    nf_wire_free_server(hold);
    if (got >= n) break;
    sleep_ms(50);
  }
  return got;
}

/* Runs kernel k (for g: n x n inputs A, B and output C, as mm_graph(n))
 * on random inputs and compares it with the reference interpreter: what
 * the daemon sends must compute the graph.  Frees g's context. */
static void check_kernel_of(const nf_dkernel *k, nf_ir_ctx *ctx, nf_graph *g, int64_t n) {
  int64_t sh[2] = {n, n};
  nf_array in[2], out[1];
  srand(5);
  for (int t = 0; t < 2; t++) {
    ck_assert_int_eq(nf_array_alloc(&in[t], NF_F32, 2, sh), NF_OK);
    float *p = in[t].data;
    for (int64_t i = 0; i < in[t].numel; i++) p[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
  }
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_interp_run(g, in, NF_INTERP_F64, out, &err), NF_OK);
  float *got = calloc((size_t)(n * n), sizeof *got);
  nf_kernel *kern = NULL;
  ck_assert_msg(nf_kernel_load(k->binary, k->len, &kern, &err) == NF_OK, "load: %s", nf_buf_str(&err));
  nf_pool *pool = nf_pool_new(2);
  void *bufs[3] = {in[0].data, in[1].data, got};
  ck_assert_int_eq(nf_kernel_run(kern, bufs, 3, pool, &err), NF_OK);
  const double *want = out[0].data;
  for (int64_t i = 0; i < n * n; i++)
    ck_assert_msg(fabs(got[i] - want[i]) <= 1e-4 * (double)n, "C[%lld] = %g, want %g", (long long)i,
                  (double)got[i], want[i]);
  nf_pool_free(pool);
  nf_kernel_free(kern);
  free(got);
  nf_array_free(&in[0]);
  nf_array_free(&in[1]);
  nf_array_free(&out[0]);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}

static void check_kernel(const nf_dkernel *k, int64_t n) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  check_kernel_of(k, ctx, mm_graph(ctx, n), n);
}

static int is_elf(const nf_dkernel *k) { return k->len > 4 && memcmp(k->binary, "\x7f" "ELF", 4) == 0; }

/* ---- raw frames ---- */

static void raw_send(int fd, const void *p, size_t n) {
  ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void raw_frame(int fd, const ProtobufCMessage *m) {
  ck_assert_int_eq(nf_wire_write_frame(fd, m, NF_WIRE_JOB_FRAME_MAX, 5000), NF_OK);
}

/* Sends a Hello; 0, or -1 when the daemon had already closed the
 * connection (it may answer a connection with an error at once). */
static int raw_hello_try(int fd, uint32_t lo, uint32_t hi) {
  Neoflow__Target t;
  uint8_t fp[32];
  char desc[256];
  nf_dconn_host_target(&t, fp, desc);
  Neoflow__Hello h = NEOFLOW__HELLO__INIT;
  h.protocol_min = lo;
  h.protocol_max = hi;
  h.client_name = (char *)"raw";
  h.target = &t;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_HELLO;
  m.hello = &h;
  return nf_wire_write_frame(fd, &m.base, NF_WIRE_FRAME_MAX, 5000) == NF_OK ? 0 : -1;
}

static void raw_hello(int fd, uint32_t lo, uint32_t hi) {
  ck_assert_int_eq(raw_hello_try(fd, lo, hi), 0);
}

/* The next server message on a raw socket (NULL at EOF). */
static Neoflow__ServerMessage *raw_recv(int fd, int timeout_ms) {
  nf_buf b = NF_BUF_INIT;
  int rc = nf_wire_read_frame(fd, NF_WIRE_FRAME_MAX, timeout_ms, &b);
  if (rc != NF_OK) {
    nf_buf_free(&b);
    return NULL;
  }
  nf_wire_err e;
  Neoflow__ServerMessage *m = nf_wire_decode_server((const uint8_t *)b.data, b.len, &e);
  nf_buf_free(&b);
  ck_assert_msg(m != NULL, "the daemon sent an invalid message: %s", e.msg);
  return m;
}

/* Expects an Error with code, then (if fatal) the end of the stream. */
static void expect_error(int fd, int code, int then_eof) {
  for (;;) {
    Neoflow__ServerMessage *m = raw_recv(fd, 15000);
    ck_assert_msg(m != NULL, "expected error %d, got the end of the stream", code);
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR) {
      ck_assert_msg((int)m->error->code == code, "expected error %d, got %d: %s", code,
                    m->error->code, m->error->message);
      ck_assert_int_eq(m->error->fatal, then_eof);
      nf_wire_free_server(m);
      break;
    }
    nf_wire_free_server(m);
  }
  if (then_eof) {
    Neoflow__ServerMessage *m = raw_recv(fd, 15000);
    ck_assert_msg(m == NULL, "expected the end of the stream, got message %d", m ? (int)m->msg_case : 0);
  }
}

static void expect_welcome(int fd) {
  Neoflow__ServerMessage *m = raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(m->msg_case, NEOFLOW__SERVER_MESSAGE__MSG_WELCOME);
  nf_wire_free_server(m);
}

/* A well-behaved client is served: a compile of mm n. */
static void served(dm *d, int64_t n) {
  nf_dconn *c = open_client(d, "bystander");
  Neoflow__Graph *pg = mm_wire(n);
  submit(c, 7, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  final_kernel(c, 7, &k, NULL);
  ck_assert(is_elf(&k));
  nf_dkernel_free(&k);
  nf_wire_graph_free(pg);
  nf_dconn_close(c);
}

/* ---- tests ---- */

START_TEST(daemon_compile_then_hit_and_restart) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  Neoflow__Graph *pg = mm_wire(24);
  nf_dconn *c = open_client(&d, "first");
  ck_assert(nf_dconn_same_target(c));
  submit(c, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k1, k2, k3;
  final_kernel(c, 1, &k1, NULL);
  ck_assert_int_eq(k1.tier, 1);
  ck_assert(is_elf(&k1));
  check_kernel(&k1, 24);
  nf_dconn_close(c);
  c = open_client(&d, "second");
  submit(c, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  final_kernel(c, 1, &k2, NULL);
  ck_assert_uint_eq(k2.len, k1.len);
  ck_assert(memcmp(k1.binary, k2.binary, k1.len) == 0);
  Neoflow__ServerMessage *hold;
  Neoflow__StatusReply *st = status_of(c, &hold);
  ck_assert_uint_eq(st->cache_hits, 1);
  ck_assert_uint_eq(st->cache_misses, 1);
  ck_assert_uint_eq(st->jobs_done, 1);
  ck_assert_uint_eq(wait_entries(c, 1), 1);
  ck_assert_uint_ge(st->n_clients, 1);
  nf_wire_free_server(hold);
  nf_dconn_close(c);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  /* a restart keeps it */
  dm_start(&d);
  c = open_client(&d, "third");
  submit(c, 9, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  final_kernel(c, 9, &k3, NULL);
  ck_assert_uint_eq(k3.len, k1.len);
  ck_assert(memcmp(k1.binary, k3.binary, k1.len) == 0);
  st = status_of(c, &hold);
  ck_assert_uint_eq(st->cache_hits, 1);
  ck_assert_uint_eq(st->jobs_done, 0);
  nf_wire_free_server(hold);
  nf_dconn_close(c);
  nf_dkernel_free(&k1);
  nf_dkernel_free(&k2);
  nf_dkernel_free(&k3);
  nf_wire_graph_free(pg);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* A GPU session: the daemon compiles the client's subgraphs for its GPU
 * with NVRTC (no device needed) and sends CUDA bundles, keyed apart from
 * the CPU's kernels; an architecture NVRTC cannot build for, or a
 * fingerprint that does not match its sm and name, is not served. */
static nf_dconn *open_gpu_client(dm *d, int sm, const char *name) {
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = d->sock, .client_name = "gpu", .timeout_ms = 10000,
                     .cuda_sm = sm, .cuda_name = name};
  int rc = nf_dconn_open(&o, &c, &err);
  ck_assert_msg(rc == NF_OK, "connect: %s", nf_buf_str(&err));
  nf_buf_free(&err);
  return c;
}

static void check_bundle(const nf_dkernel *k, int sm) {
  nf_cuda_bundle b;
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nf_cuda_bundle_decode(k->binary, k->len, &b, &err) == NF_OK, "bundle: %s",
                nf_buf_str(&err));
  ck_assert_int_eq(b.sm, sm);
  ck_assert_int_eq(b.image_kind, NF_CUDA_IMAGE_CUBIN);
  ck_assert_uint_eq(b.plan.n_args, 3);
  ck_assert_int_ge(b.plan.n_launches, 1);
  ck_assert_str_eq(b.plan.launches[0].name, "nf_k0");
  /* a cubin: an ELF for the CUDA machine (EM_CUDA = 190) */
  ck_assert_uint_gt(b.image_len, 20);
  ck_assert(memcmp(b.image, "\x7f" "ELF", 4) == 0);
  ck_assert_int_eq(b.image[18] | b.image[19] << 8, 190);
  ck_assert_uint_gt(b.source_len, 0);
  ck_assert_ptr_nonnull(memmem(b.source, b.source_len, "nf_k0", 5));
  nf_cuda_bundle_free(&b);
  nf_buf_free(&err);
}

START_TEST(daemon_cuda_target) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  Neoflow__Graph *pg = mm_wire(40);
  nf_buf why = NF_BUF_INIT;
  if (!nf_cuda_available(&why)) {
    /* a build without NVRTC serves no GPU session */
    nf_dconn *c = open_gpu_client(&d, 90, "NVIDIA H200");
    ck_assert(!nf_dconn_same_target(c));
    nf_dconn_close(c);
  } else {
    nf_dconn *c = open_gpu_client(&d, 90, "NVIDIA H200");
    ck_assert(nf_dconn_same_target(c));
    submit(c, 1, pg, NEOFLOW__MODE__MODE_TUNE, 4);
    nf_dkernel k1, k2, k3;
    final_kernel(c, 1, &k1, NULL);
    /* tier 1 unmeasured where no GPU can measure; tuned where one can */
    ck_assert(k1.tier == 1 || k1.tier == 2);
    ck_assert(!is_elf(&k1));
    check_bundle(&k1, 90);
    /* the CPU's kernel of the same graph is another key */
    nf_dconn *cpu = open_client(&d, "cpu");
    submit(cpu, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
    final_kernel(cpu, 1, &k2, NULL);
    ck_assert(is_elf(&k2));
    ck_assert(memcmp(k1.key, k2.key, 32) != 0);
    nf_dconn_close(cpu);
    ck_assert_uint_eq(wait_entries(c, 2), 2);
    nf_dconn_close(c);
    /* another GPU model of the same architecture: another key; the same
     * one again: a cache hit, the same bytes */
    c = open_gpu_client(&d, 90, "NVIDIA H100 80GB HBM3");
    submit(c, 2, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
    final_kernel(c, 2, &k3, NULL);
    ck_assert(memcmp(k1.key, k3.key, 32) != 0);
    nf_dkernel_free(&k3);
    nf_dconn_close(c);
    c = open_gpu_client(&d, 90, "NVIDIA H200");
    submit(c, 3, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
    final_kernel(c, 3, &k3, NULL);
    ck_assert(memcmp(k1.key, k3.key, 32) == 0);
    ck_assert_uint_eq(k3.len, k1.len);
    ck_assert(memcmp(k1.binary, k3.binary, k1.len) == 0);
    Neoflow__ServerMessage *hold;
    Neoflow__StatusReply *st = status_of(c, &hold);
    ck_assert_uint_eq(st->cache_hits, 1);
    nf_wire_free_server(hold);
    nf_dkernel_free(&k3);
    nf_dconn_close(c);
    /* sm_80 gets its own cubin */
    c = open_gpu_client(&d, 80, "NVIDIA A100-SXM4-80GB");
    submit(c, 4, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
    final_kernel(c, 4, &k3, NULL);
    check_bundle(&k3, 80);
    nf_dkernel_free(&k3);
    nf_dconn_close(c);
    nf_dkernel_free(&k1);
    nf_dkernel_free(&k2);
  }
  /* an architecture older than NVRTC builds for: a session for status only */
  nf_dconn *c = open_gpu_client(&d, 30, "GeForce GTX 680");
  ck_assert(!nf_dconn_same_target(c));
  submit(c, 5, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  nf_buf err = NF_BUF_INIT;
  int code = 0;
  ck_assert_int_eq(nf_dconn_next_kernel(c, 5, 10000, NULL, NULL, &k, &code, &err), NF_EINVAL);
  ck_assert_int_eq(code, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_TARGET);
  nf_dconn_close(c);
  /* a CUDA target whose fingerprint is not that of its sm and name */
  int fd = try_connect(d.sock);
  ck_assert_int_ge(fd, 0);
  Neoflow__Target t;
  uint8_t fp[32];
  char desc[256];
  nf_dconn_cuda_target(&t, 90, "NVIDIA H200", fp, desc);
  fp[0] ^= 1;
  Neoflow__Hello h = NEOFLOW__HELLO__INIT;
  h.protocol_min = NF_WIRE_PROTOCOL_MIN;
  h.protocol_max = NF_WIRE_PROTOCOL_MAX;
  h.client_name = (char *)"forged";
  h.target = &t;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_HELLO;
  m.hello = &h;
  raw_frame(fd, &m.base);
  Neoflow__ServerMessage *w = raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->msg_case, NEOFLOW__SERVER_MESSAGE__MSG_WELCOME);
  ck_assert_int_eq(w->welcome->target->kind, NEOFLOW__TARGET_KIND__TARGET_CPU);
  nf_wire_free_server(w);
  Neoflow__Submit sb = NEOFLOW__SUBMIT__INIT;
  sb.request_id = 6;
  sb.graph = pg;
  Neoflow__ClientMessage ms = NEOFLOW__CLIENT_MESSAGE__INIT;
  ms.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  ms.submit = &sb;
  raw_frame(fd, &ms.base);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_TARGET, 0);
  close(fd);
  nf_buf_free(&err);
  nf_buf_free(&why);
  nf_wire_graph_free(pg);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* GPU tuning through the daemon, on the emulated driver: the job's
 * workers own the (emulated) CUDA context and measure NVRTC's bundles;
 * the final kernel is measured (time_ms > 0) and a bundle. */
START_TEST(daemon_cuda_tuned) {
  const char *drv = getenv("NF_TEST_CUDA_DRIVER");
  nf_buf why = NF_BUF_INIT;
  if (!drv || !*drv || !getenv("NF_TEST_CUDA_EMU") || !nf_cuda_available(&why)) {
    fprintf(stderr, "daemon_cuda_tuned: skipped: %s\n",
            why.len ? nf_buf_str(&why) : "NF_TEST_CUDA_DRIVER or NF_TEST_CUDA_EMU not set");
    nf_buf_free(&why);
    return;
  }
  setenv("NEOFLOW_LIBCUDA", drv, 1); /* inherited by the daemon, its jobs and workers */
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  Neoflow__Graph *pg = mm_wire(48);
  nf_dconn *c = open_gpu_client(&d, 90, "NeoFlow CPU emulation of sm_90");
  ck_assert(nf_dconn_same_target(c));
  submit(c, 1, pg, NEOFLOW__MODE__MODE_TUNE, 4);
  nf_dkernel k;
  int n = 0;
  final_kernel(c, 1, &k, &n);
  ck_assert_msg(k.time_ms > 0, "the final GPU kernel was not measured (tier %d; see %s)", k.tier,
                d.log);
  ck_assert(k.tier == 1 || k.tier == 2);
  check_bundle(&k, 90);
  nf_dkernel_free(&k);
  nf_dconn_close(c);
  nf_wire_graph_free(pg);
  unsetenv("NEOFLOW_LIBCUDA");
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

typedef struct many {
  dm *d;
  Neoflow__Graph *pg;
  int ok;
  size_t len;
  uint8_t sha_first[8];
  int tier;
} many;

static void *one_of_many(void *arg) {
  many *m = arg;
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = m->d->sock, .client_name = "many", .timeout_ms = 20000};
  if (nf_dconn_open(&o, &c, &err) != NF_OK) {
    nf_buf_free(&err);
    return NULL;
  }
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = 3;
  s.graph = m->pg;
  s.mode = NEOFLOW__MODE__MODE_TUNE;
  s.max_trials = 6;
  s.max_seconds = 60;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  cm.submit = &s;
  if (nf_dconn_send(c, &cm, &err) == NF_OK) {
    nf_dkernel k;
    int code;
    while (nf_dconn_next_kernel(c, 3, 240000, NULL, NULL, &k, &code, &err) == NF_OK) {
      if (k.final) {
        m->ok = is_elf(&k);
        m->len = k.len;
        m->tier = k.tier;
        memcpy(m->sha_first, k.binary + k.len / 2, 8);
        nf_dkernel_free(&k);
        break;
      }
      nf_dkernel_free(&k);
    }
  }
  nf_dconn_close(c);
  nf_buf_free(&err);
  return NULL;
}

START_TEST(daemon_single_flight_32) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[jobs]\ncompile_jobs = 2\ntune_jobs = 1\n");
  dm_start(&d);
  Neoflow__Graph *pg = mm_wire(32);
  enum { N = 32 };
  many ms[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&ms[i], 0, sizeof ms[i]);
    ms[i].d = &d;
    ms[i].pg = pg;
    ck_assert_int_eq(pthread_create(&th[i], NULL, one_of_many, &ms[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    ck_assert_msg(ms[i].ok, "client %d got no final kernel", i);
    ck_assert_uint_eq(ms[i].len, ms[0].len);
    ck_assert(memcmp(ms[i].sha_first, ms[0].sha_first, 8) == 0);
  }
  nf_dconn *c = open_client(&d, "status");
  ck_assert_int_eq(wait_no_jobs(c), 0);
  Neoflow__ServerMessage *hold;
  Neoflow__StatusReply *st = status_of(c, &hold);
  /* one compile job and one tuning job, whatever the arrival order */
  ck_assert_uint_eq(st->jobs_done, 2);
  ck_assert_uint_eq(st->jobs_failed, 0);
  ck_assert_uint_eq(st->n_jobs, 0);
  ck_assert_uint_eq(wait_entries(c, 1), 1);
  nf_wire_free_server(hold);
  /* tuned once: a later tune request is answered from the cache */
  submit(c, 4, pg, NEOFLOW__MODE__MODE_TUNE, 6);
  nf_dkernel k;
  int n = 0;
  final_kernel(c, 4, &k, &n);
  ck_assert_int_eq(n, 1);
  ck_assert_uint_eq(k.len, ms[0].len);
  check_kernel(&k, 32); /* the tuned kernel computes the matmul */
  nf_dkernel_free(&k);
  st = status_of(c, &hold);
  ck_assert_uint_eq(st->jobs_done, 2);
  nf_wire_free_server(hold);
  nf_dconn_close(c);
  nf_wire_graph_free(pg);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_hostile_frames) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  /* a lying length prefix after the handshake */
  int fd = try_connect(d.sock);
  raw_hello(fd, 1, 1);
  expect_welcome(fd);
  uint8_t lie[4] = {0xff, 0xff, 0xff, 0xf0};
  raw_send(fd, lie, 4);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_FRAME_TOO_LARGE, 1);
  close(fd);
  /* 5000 bytes before the handshake (its limit is 4 KiB) */
  fd = try_connect(d.sock);
  uint8_t big[4] = {0, 0, 0x13, 0x88};
  raw_send(fd, big, 4);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_FRAME_TOO_LARGE, 1);
  close(fd);
  /* random bytes as a message */
  fd = try_connect(d.sock);
  uint8_t junk[68];
  junk[0] = 0;
  junk[1] = 0;
  junk[2] = 0;
  junk[3] = 64;
  srand(7);
  for (int i = 4; i < 68; i++) junk[i] = (uint8_t)rand();
  raw_send(fd, junk, sizeof junk);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1);
  close(fd);
  /* a first message that is not a Hello */
  fd = try_connect(d.sock);
  Neoflow__Ping ping = NEOFLOW__PING__INIT;
  Neoflow__ClientMessage pm = NEOFLOW__CLIENT_MESSAGE__INIT;
  pm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_PING;
  pm.ping = &ping;
  raw_frame(fd, &pm.base);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, 1);
  close(fd);
  /* version skew */
  fd = try_connect(d.sock);
  raw_hello(fd, 2, 3);
  Neoflow__ServerMessage *m = raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(m->msg_case, NEOFLOW__SERVER_MESSAGE__MSG_ERROR);
  ck_assert_int_eq(m->error->code, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_VERSION);
  ck_assert_uint_eq(m->error->supported_min, 1);
  ck_assert_uint_eq(m->error->supported_max, 1);
  nf_wire_free_server(m);
  close(fd);
  /* a truncated frame: half a Hello, then EOF */
  fd = try_connect(d.sock);
  uint8_t part[10] = {0, 0, 0, 100, 1, 2, 3, 4, 5, 6};
  raw_send(fd, part, sizeof part);
  shutdown(fd, SHUT_WR);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_TRUNCATED, 1);
  close(fd);
  /* an invalid graph: a request-level error, and the session goes on */
  fd = try_connect(d.sock);
  raw_hello(fd, 1, 1);
  expect_welcome(fd);
  Neoflow__Graph *pg = mm_wire(8);
  pg->stmts[0]->rhs = (uint32_t)pg->n_exprs + 5; /* dangling */
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = 11;
  s.graph = pg;
  Neoflow__ClientMessage sm = NEOFLOW__CLIENT_MESSAGE__INIT;
  sm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  sm.submit = &s;
  raw_frame(fd, &sm.base);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH, 0);
  ping.token = 99;
  raw_frame(fd, &pm.base);
  m = raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(m->msg_case, NEOFLOW__SERVER_MESSAGE__MSG_PONG);
  ck_assert_uint_eq(m->pong->token, 99);
  nf_wire_free_server(m);
  nf_wire_graph_free(pg);
  close(fd);
  /* everything else is still served */
  served(&d, 9);
  ck_assert(dm_alive(&d));
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* Sends Submit{id, pg} (MODE_COMPILE) on a raw connection. */
static void raw_submit(int fd, uint64_t id, Neoflow__Graph *pg) {
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = id;
  s.graph = pg;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  m.submit = &s;
  raw_frame(fd, &m.base);
}

/* Expects request id's answer to be a request-level Error with code,
 * whose message holds every non-NULL want. */
static void expect_refusal(int fd, uint64_t id, int code, const char *want1, const char *want2) {
  Neoflow__ServerMessage *m = raw_recv(fd, 30000);
  ck_assert_msg(m != NULL, "request %llu: no answer", (unsigned long long)id);
  ck_assert_msg(m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR,
                "request %llu: message %d instead of an error", (unsigned long long)id,
                (int)m->msg_case);
  ck_assert_msg((int)m->error->code == code, "request %llu: error %d, not %d: %s",
                (unsigned long long)id, m->error->code, code, m->error->message);
  ck_assert_uint_eq(m->error->request_id, id);
  ck_assert_int_eq(m->error->fatal, 0);
  ck_assert_msg(!want1 || strstr(m->error->message, want1), "'%s' lacks '%s'", m->error->message,
                want1);
  ck_assert_msg(!want2 || strstr(m->error->message, want2), "'%s' lacks '%s'", m->error->message,
                want2);
  nf_wire_free_server(m);
}

START_TEST(daemon_validator) {
  /* Issue 31: what used to reach the compiler and kill it, or compile
   * against the semantics, is refused at the Submit with the element
   * named; what is valid is still served. */
  dm d;
  dm_init(&d);
  dm_config(&d, "[jobs]\nmax_gflops = 1\n");
  dm_start(&d);
  int fd = try_connect(d.sock);
  raw_hello(fd, 1, 1);
  expect_welcome(fd);
  /* a 300,000-deep chain (~2.7 MB): INVALID_GRAPH, not a compile job dead
   * of a stack overflow */
  deep_wire *w = malloc(sizeof(*w));
  deep_wire_init(w, 300000);
  raw_submit(fd, 21, &w->g);
  expect_refusal(fd, 21, NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH,
                 "stmts[0] (Y): right side nested 300002 levels deep, more than 2048", NULL);
  deep_wire_free(w);
  free(w);
  /* A(i + 1000, k) in a matrix product: INVALID_GRAPH naming the
   * statement and the access, not a failed compile */
  Neoflow__Graph *pg = bounds_wire(BG_SHIFT_1000, 8);
  raw_submit(fd, 22, pg);
  expect_refusal(fd, 22, NEOFLOW__ERROR_CODE__ERR_INVALID_GRAPH,
                 "statement 0 (C): A(v0 + 1000, v2) reads out of bounds: index 0 is 1007",
                 "A has size 8 in dimension 0");
  nf_wire_graph_free(pg);
  /* a 2^30 x 2^30 matrix product: over the default max_elements */
  pg = mm_wire((int64_t)1 << 30);
  raw_submit(fd, 23, pg);
  expect_refusal(fd, 23, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH,
                 "its tensors hold 3.459e+18 elements, more than this daemon's cap of 4294967296",
                 "raise [jobs] max_elements in neoflowd.conf");
  nf_wire_graph_free(pg);
  /* 2048^3 (17 GFLOP) over this daemon's max_gflops = 1 */
  pg = mm_wire(2048);
  raw_submit(fd, 24, pg);
  expect_refusal(fd, 24, NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_GRAPH,
                 "one evaluation may take 17.18 GFLOP (most in statement 0, C)",
                 "cap of 1 GFLOP (raise [jobs] max_gflops in neoflowd.conf");
  nf_wire_graph_free(pg);
  /* the session goes on */
  Neoflow__Ping ping = NEOFLOW__PING__INIT;
  ping.token = 5;
  Neoflow__ClientMessage pm = NEOFLOW__CLIENT_MESSAGE__INIT;
  pm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_PING;
  pm.ping = &ping;
  raw_frame(fd, &pm.base);
  Neoflow__ServerMessage *m = raw_recv(fd, 10000);
  ck_assert(m && m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_PONG && m->pong->token == 5);
  nf_wire_free_server(m);
  close(fd);
  /* an access out of range only where its guard is false (i >= 3 ?
   * A(i - 3, k) : 0) is compiled, and computes what the interpreter does */
  nf_dconn *c = open_client(&d, "guarded");
  pg = bounds_wire(BG_GUARD_OK, 9);
  submit(c, 31, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  final_kernel(c, 31, &k, NULL);
  ck_assert(is_elf(&k));
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  check_kernel_of(&k, ctx, bounds_graph(ctx, BG_GUARD_OK, 9), 9);
  nf_dkernel_free(&k);
  nf_wire_graph_free(pg);
  nf_dconn_close(c);
  served(&d, 9);
  ck_assert(dm_alive(&d));
  ck_assert(log_has(&d, "request 22 refused: statement 0 (C)"));
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_stalls_and_slow_readers) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[daemon]\nhandshake_timeout_ms = 400\nprogress_timeout_ms = 400\n"
                "output_soft_limit = 65536\noutput_hard_limit = 67108864\noutput_soft_seconds = 1\n");
  dm_start(&d);
  /* a stalled handshake: nothing at all */
  int fd = try_connect(d.sock);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_TIMEOUT, 1);
  close(fd);
  /* a frame that stops half-way */
  fd = try_connect(d.sock);
  raw_hello(fd, 1, 1);
  expect_welcome(fd);
  uint8_t part[6] = {0, 0, 0, 50, 1, 2};
  raw_send(fd, part, sizeof part);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_TIMEOUT, 1);
  close(fd);
  /* a client that never reads: many kernels asked for, none read */
  served(&d, 20); /* now in the cache */
  fd = try_connect(d.sock);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  raw_hello(fd, 1, 1);
  Neoflow__Graph *pg = mm_wire(20);
  for (uint64_t id = 1; id <= 400; id++) {
    Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
    s.request_id = id;
    s.graph = pg;
    Neoflow__ClientMessage sm = NEOFLOW__CLIENT_MESSAGE__INIT;
    sm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    sm.submit = &s;
    if (nf_wire_write_frame(fd, &sm.base, NF_WIRE_FRAME_MAX, 2000) != NF_OK) break;
  }
  nf_wire_graph_free(pg);
  /* while it does not read, others are served */
  served(&d, 21);
  /* after the soft limit held for a second it is dropped: draining what
   * was sent ends in EOF (not in 400 kernels) */
  sleep_ms(3000);
  int kernels = 0;
  for (;;) {
    Neoflow__ServerMessage *m = raw_recv(fd, 10000);
    if (!m) break;
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_KERNEL) kernels++;
    nf_wire_free_server(m);
  }
  ck_assert_int_lt(kernels, 400);
  ck_assert_msg(log_has(&d, "slow reader"), "the never-reading client was not dropped as one");
  close(fd);
  ck_assert(dm_alive(&d));
  served(&d, 20);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_disconnect_mid_job) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  Neoflow__Graph *pg = mm_wire(40);
  nf_dconn *c = open_client(&d, "leaver");
  submit(c, 1, pg, NEOFLOW__MODE__MODE_TUNE, 50);
  sleep_ms(300);
  nf_dconn_close(c); /* gone while compiling or tuning */
  sleep_ms(300);
  ck_assert(dm_alive(&d));
  c = open_client(&d, "stayer");
  submit(c, 2, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  final_kernel(c, 2, &k, NULL);
  ck_assert(is_elf(&k));
  nf_dkernel_free(&k);
  /* the abandoned job is gone (no tuning runs for nobody) */
  ck_assert_int_eq(wait_no_jobs(c), 0);
  ck_assert_msg(log_has(&d, "no one waits for it any more"), "the abandoned job was not stopped");
  nf_dconn_close(c);
  nf_wire_graph_free(pg);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_connection_limit) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[daemon]\nmax_connections = 8\n");
  dm_start(&d);
  int fds[20], busy = 0, ok = 0;
  for (int i = 0; i < 20; i++) {
    fds[i] = try_connect(d.sock);
    ck_assert_int_ge(fds[i], 0);
    raw_hello_try(fds[i], 1, 1);
    Neoflow__ServerMessage *m = raw_recv(fds[i], 10000);
    ck_assert_ptr_nonnull(m);
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_WELCOME) ok++;
    else if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR &&
             m->error->code == NEOFLOW__ERROR_CODE__ERR_BUSY)
      busy++;
    nf_wire_free_server(m);
  }
  ck_assert_int_eq(ok, 8);
  ck_assert_int_eq(busy, 12);
  for (int i = 0; i < 20; i++) close(fds[i]);
  sleep_ms(300);
  served(&d, 10); /* room again */
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* CPU seconds (user + system) pid has used, from /proc/PID/stat. */
static double cpu_seconds(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  ck_assert_ptr_nonnull(p);
  unsigned long ut = 0, st = 0;
  /* fields after the command: state ppid pgrp session tty tpgid flags
   * minflt cminflt majflt cmajflt utime stime */
  ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* S-7: descriptors run out (RLIMIT_NOFILE 64, 120 connections held): the
 * daemon neither crashes nor spins (libuv's reserve descriptor closes
 * what it cannot take), and it serves again once the clients leave. */
START_TEST(daemon_fd_exhaustion) {
  dm d;
  dm_init(&d);
  d.nofile = 64;
  dm_config(&d, NULL);
  dm_start(&d);
  enum { N = 120 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    fds[i] = try_connect(d.sock);
    if (fds[i] >= 0) raw_hello_try(fds[i], 1, 1);
  }
  sleep_ms(300);
  double c0 = cpu_seconds(d.pid);
  sleep_ms(2000);
  double used = cpu_seconds(d.pid) - c0;
  /* a daemon spinning on EMFILE would burn the whole 2 s */
  ck_assert_msg(used < 1.0, "the daemon used %.2f s of CPU in 2 s while out of descriptors", used);
  ck_assert(dm_alive(&d));
  for (int i = 0; i < N; i++)
    if (fds[i] >= 0) close(fds[i]);
  sleep_ms(500);
  served(&d, 16);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(0x7f000001);
  ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(s, (struct sockaddr *)&a, &len);
  close(s);
  return ntohs(a.sin_port);
}

START_TEST(daemon_tcp_key) {
  dm d;
  dm_init(&d);
  char key[400], wrong[400], addr[64], extra[1024];
  snprintf(key, sizeof key, "%s/key", d.dir);
  snprintf(wrong, sizeof wrong, "%s/wrong", d.dir);
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_auth_new_key(key, &err), NF_OK);
  ck_assert_int_eq(nf_auth_new_key(wrong, &err), NF_OK);
  int port = free_port();
  snprintf(addr, sizeof addr, "tcp:127.0.0.1:%d", port);
  snprintf(extra, sizeof extra, "[tcp]\nlisten = 127.0.0.1:%d\nkey_file = %s\n", port, key);
  dm_config(&d, extra);
  dm_start(&d);
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = addr, .key_file = key, .client_name = "tcp", .timeout_ms = 10000};
  ck_assert_msg(nf_dconn_open(&o, &c, &err) == NF_OK, "%s", nf_buf_str(&err));
  Neoflow__Graph *pg = mm_wire(12);
  submit(c, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_wire_graph_free(pg);
  nf_dkernel k;
  final_kernel(c, 1, &k, NULL);
  ck_assert(is_elf(&k));
  nf_dkernel_free(&k);
  nf_dconn_close(c);
  /* a wrong key, and no key */
  o.key_file = wrong;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_dconn_open(&o, &c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "authentication"));
  o.key_file = NULL;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_dconn_open(&o, &c, &err), NF_EINVAL);
  /* a Hello answering another connection's challenge (a replay) */
  uint8_t k32[32], sn_other[32], cn[32], mac[32];
  ck_assert_int_eq(nf_auth_load_key(key, k32, &err), NF_OK);
  nf_auth_nonce(sn_other);
  nf_auth_nonce(cn);
  nf_auth_client_mac(k32, sn_other, cn, mac);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(0x7f000001);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  Neoflow__ServerMessage *m = raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(m->msg_case, NEOFLOW__SERVER_MESSAGE__MSG_CHALLENGE);
  nf_wire_free_server(m);
  Neoflow__Target t;
  uint8_t fp[32];
  char desc[256];
  nf_dconn_host_target(&t, fp, desc);
  Neoflow__Hello h = NEOFLOW__HELLO__INIT;
  h.protocol_min = h.protocol_max = 1;
  h.client_name = (char *)"replay";
  h.target = &t;
  h.client_nonce.data = cn;
  h.client_nonce.len = 32;
  h.mac.data = mac;
  h.mac.len = 32;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_HELLO;
  cm.hello = &h;
  raw_frame(fd, &cm.base);
  expect_error(fd, NEOFLOW__ERROR_CODE__ERR_UNAUTHENTICATED, 1);
  close(fd);
  nf_buf_free(&err);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_kill9_during_writes) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[jobs]\ncompile_jobs = 2\n");
  srand(11);
  int64_t n = 5;
  for (int round = 0; round < 6; round++) {
    dm_start(&d);
    nf_dconn *c = open_client(&d, "writer");
    /* several compiles in flight; the daemon dies at some point */
    for (int i = 0; i < 6; i++) {
      Neoflow__Graph *pg = mm_wire(n++);
      submit(c, (uint64_t)i + 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
      nf_wire_graph_free(pg);
    }
    sleep_ms(100 + rand() % 600);
    ck_assert_int_eq(dm_stop(&d, SIGKILL), 128 + SIGKILL);
    nf_dconn_close(c);
    /* the cache verifies: integrity and every entry complete */
    nf_cache *cc = NULL;
    nf_buf err = NF_BUF_INIT;
    nf_cache_opts co = {.read_only = 1};
    ck_assert_msg(nf_cache_open(d.cache, &co, &cc, &err) == NF_OK, "%s", nf_buf_str(&err));
    nf_cache_verify_report vr;
    ck_assert_msg(nf_cache_verify(cc, 1, 0, &vr, &err) == NF_OK, "%s", nf_buf_str(&err));
    ck_assert(vr.integrity_ok);
    ck_assert_int_eq(vr.bad, 0);
    nf_cache_close(cc);
    nf_buf_free(&err);
  }
  /* and the daemon starts and serves over what the kills left */
  dm_start(&d);
  served(&d, 5);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_second_instance_refused) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  const char *exe = getenv("NF_NEOFLOWD");
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' --config '%s' 2>'%s/second.log'", exe, d.conf, d.dir);
  int st = system(cmd);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  snprintf(cmd, sizeof cmd, "grep -qi 'already\\|in use' '%s/second.log'", d.dir);
  ck_assert_int_eq(system(cmd), 0);
  served(&d, 6); /* the first one is unharmed */
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_sighup_reload) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  dm_config(&d, "[daemon]\nmax_connections = 3\n");
  kill(d.pid, SIGHUP);
  sleep_ms(300);
  int fds[4], busy = 0;
  for (int i = 0; i < 4; i++) {
    fds[i] = try_connect(d.sock);
    raw_hello_try(fds[i], 1, 1);
    Neoflow__ServerMessage *m = raw_recv(fds[i], 10000);
    ck_assert_ptr_nonnull(m);
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR) busy++;
    nf_wire_free_server(m);
  }
  ck_assert_int_eq(busy, 1);
  for (int i = 0; i < 4; i++) close(fds[i]);
  /* a broken file is refused and the old configuration stays */
  FILE *f = fopen(d.conf, "a");
  fputs("[nonsense\n", f);
  fclose(f);
  kill(d.pid, SIGHUP);
  sleep_ms(300);
  served(&d, 7);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_other_uid_refused) {
  if (geteuid() != 0) return; /* needs root to become another user */
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  pid_t p = fork();
  if (p == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    int s = try_connect(d.sock);
    _exit(s >= 0 ? 1 : (errno == EACCES ? 0 : 2));
  }
  int st;
  waitpid(p, &st, 0);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "another uid reached the socket (%d)",
                WEXITSTATUS(st));
  served(&d, 8);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* A request whose job process misbehaves gets code (see NF_JOB_FAULT in
 * job_main.c); the daemon stays up and serves the next request. */
static void job_fault(const char *fault, int code) {
  dm d;
  dm_init(&d);
  char env[64];
  snprintf(env, sizeof env, "NF_JOB_FAULT=%s", fault);
  d.env = env;
  dm_config(&d, "[jobs]\ncompile_timeout_s = 1\n");
  dm_start(&d);
  nf_dconn *c = open_client(&d, fault);
  Neoflow__Graph *pg = mm_wire(14);
  submit(c, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  int got = 0;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_dconn_next_kernel(c, 1, 30000, NULL, NULL, &k, &got, &err);
  ck_assert_msg(rc == NF_EINVAL && got == code, "%s: rc %d, code %d (want %d): %s", fault, rc, got,
                code, nf_buf_str(&err));
  /* the session and the daemon go on */
  Neoflow__ServerMessage *hold;
  Neoflow__StatusReply *st = status_of(c, &hold);
  ck_assert_uint_eq(st->jobs_failed, 1);
  nf_wire_free_server(hold);
  ck_assert_int_eq(wait_no_jobs(c), 0);
  nf_buf_free(&err);
  nf_wire_graph_free(pg);
  nf_dconn_close(c);
  ck_assert(dm_alive(&d));
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}

/* A client waits, with 1200 requests, on one job that fails, and stops
 * reading once its requests are accepted: the 1200 errors, written in one
 * go, overflow its hard output limit in the middle of the daemon's loop
 * over the job's subscribers.  The connection is dropped after the loop;
 * nothing else is disturbed (under ASan: no use after free). */
typedef struct drain {
  int fd, want;
} drain;

static void *drain_replies(void *arg) {
  drain *dr = arg;
  for (int seen = 0; seen < dr->want;) {
    Neoflow__ServerMessage *m = raw_recv(dr->fd, 20000);
    if (!m) break;
    seen++;
    nf_wire_free_server(m);
  }
  return NULL;
}

START_TEST(daemon_hard_limit_mid_broadcast) {
  enum { N = 1200 };
  dm d;
  dm_init(&d);
  d.env = "NF_JOB_FAULT=hang";
  dm_config(&d, "[daemon]\noutput_soft_limit = 65536\noutput_hard_limit = 65536\n"
                "max_requests = 4096\n[jobs]\ncompile_timeout_s = 3\n");
  dm_start(&d);
  int fd = try_connect(d.sock);
  raw_hello(fd, 1, 1);
  expect_welcome(fd);
  drain dr = {fd, 2 * N}; /* an Accepted and a Progress per request */
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, drain_replies, &dr), 0);
  Neoflow__Graph *pg = mm_wire(17);
  for (uint64_t id = 1; id <= N; id++) {
    Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
    s.request_id = id;
    s.graph = pg;
    Neoflow__ClientMessage sm = NEOFLOW__CLIENT_MESSAGE__INIT;
    sm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    sm.submit = &s;
    ck_assert_int_eq(nf_wire_write_frame(fd, &sm.base, NF_WIRE_FRAME_MAX, 5000), NF_OK);
  }
  nf_wire_graph_free(pg);
  pthread_join(th, NULL); /* from here on nobody reads */
  ck_assert(!log_has(&d, "above the hard limit"));
  int dropped = 0;
  for (int i = 0; i < 300 && !dropped; i++) {
    dropped = log_has(&d, "above the hard limit");
    if (!dropped) sleep_ms(50);
  }
  ck_assert_msg(dropped, "the client was not dropped at the hard limit");
  close(fd);
  ck_assert(dm_alive(&d));
  /* others are served (jobs all hang here: a status round trip) */
  nf_dconn *c = open_client(&d, "after");
  Neoflow__ServerMessage *hold;
  ck_assert_uint_ge(status_of(c, &hold)->n_clients, 1);
  nf_wire_free_server(hold);
  nf_dconn_close(c);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

START_TEST(daemon_job_faults) {
  job_fault("hang", NEOFLOW__ERROR_CODE__ERR_COMPILE_TIMEOUT);
  job_fault("crash", NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR);
  job_fault("exit", NEOFLOW__ERROR_CODE__ERR_COMPILE_ERROR);
  job_fault("garbage", NEOFLOW__ERROR_CODE__ERR_INTERNAL);
}
END_TEST

/* S-20: another process holds the cache's write lock.  The daemon still
 * answers (the kernel is served uncached: its write fails after the busy
 * timeout, in the writer thread, and says so in the log); once the lock
 * is gone, results are stored again. */
START_TEST(daemon_cache_locked_elsewhere) {
  dm d;
  dm_init(&d);
  dm_config(&d, NULL);
  dm_start(&d);
  sqlite3 *db = NULL;
  ck_assert_int_eq(sqlite3_open(d.cache, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  nf_dconn *c = open_client(&d, "locked");
  Neoflow__Graph *pg = mm_wire(15);
  submit(c, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  final_kernel(c, 1, &k, NULL);
  ck_assert(is_elf(&k));
  nf_dkernel_free(&k);
  int logged = 0;
  for (int i = 0; i < 300 && !logged; i++) {
    logged = log_has(&d, "not stored");
    if (!logged) sleep_ms(50);
  }
  ck_assert_msg(logged, "the failed cache write was not reported");
  ck_assert_int_eq(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  /* not stored: the next request compiles again, and that one is stored */
  submit(c, 2, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  final_kernel(c, 2, &k, NULL);
  nf_dkernel_free(&k);
  ck_assert_int_eq(wait_no_jobs(c), 0);
  Neoflow__ServerMessage *hold;
  Neoflow__StatusReply *st = status_of(c, &hold);
  ck_assert_uint_eq(st->jobs_done, 2);
  nf_wire_free_server(hold);
  nf_dconn_close(c);
  nf_wire_graph_free(pg);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  /* the second result was written before the daemon exited */
  nf_cache *cc = NULL;
  nf_buf err = NF_BUF_INIT;
  nf_cache_opts co = {.read_only = 1};
  ck_assert_int_eq(nf_cache_open(d.cache, &co, &cc, &err), NF_OK);
  nf_cache_stats cs;
  ck_assert_int_eq(nf_cache_stats_get(cc, &cs, &err), NF_OK);
  ck_assert_int_eq(cs.entries, 1);
  nf_cache_close(cc);
  nf_buf_free(&err);
  dm_done(&d);
}
END_TEST

/* The cache key the daemon gives mm_graph(n) on this machine. */
static void mm_key(int64_t n, uint8_t key[32]) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  uint8_t gh[32];
  ck_assert_int_eq(nf_graph_hash(mm_graph(ctx, n), gh), NF_OK);
  nf_ir_ctx_free(ctx);
  nf_host_target t;
  nf_host_target_get(&t);
  char cg[128];
  nf_cpu_codegen_version(cg, sizeof cg);
  nf_cache_make_key(gh, t.fingerprint, cg, key);
}

/* Tuning goes first where clients report the most step time: with the
 * one tuning slot busy, X (1 ms per step) and Y (50 ms) wait; when the
 * busy job is cancelled, Y starts and X still waits. */
START_TEST(daemon_step_time_order) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[jobs]\ntune_jobs = 1\n");
  dm_start(&d);
  nf_dconn *c = open_client(&d, "steps");
  Neoflow__Graph *w = mm_wire(48), *x = mm_wire(33), *y = mm_wire(34);
  nf_dkernel k;
  int code;
  nf_buf err = NF_BUF_INIT;
  /* W takes the tuning slot (waited for: its compile process may still
   * be exiting after its kernel came) */
  submit(c, 1, w, NEOFLOW__MODE__MODE_TUNE, 1000);
  ck_assert_int_eq(nf_dconn_next_kernel(c, 1, 60000, NULL, NULL, &k, &code, &err), NF_OK);
  nf_dkernel_free(&k);
  uint8_t kw[32];
  mm_key(48, kw);
  int w_tuning = 0;
  for (int i = 0; i < 400 && !w_tuning; i++) {
    Neoflow__ServerMessage *hold;
    Neoflow__StatusReply *st = status_of(c, &hold);
    for (size_t j = 0; j < st->n_jobs; j++)
      if (st->jobs[j]->key.len == 32 && !memcmp(st->jobs[j]->key.data, kw, 32) &&
          st->jobs[j]->state == NEOFLOW__JOB_STATE__JOB_TUNING)
        w_tuning = 1;
    nf_wire_free_server(hold);
    if (!w_tuning) sleep_ms(25);
  }
  ck_assert(w_tuning);
  /* X and Y compile, then queue for tuning */
  submit(c, 2, x, NEOFLOW__MODE__MODE_TUNE, 4);
  ck_assert_int_eq(nf_dconn_next_kernel(c, 2, 60000, NULL, NULL, &k, &code, &err), NF_OK);
  nf_dkernel_free(&k);
  submit(c, 3, y, NEOFLOW__MODE__MODE_TUNE, 4);
  ck_assert_int_eq(nf_dconn_next_kernel(c, 3, 60000, NULL, NULL, &k, &code, &err), NF_OK);
  nf_dkernel_free(&k);
  /* both queued for tuning (their compile processes have exited) */
  uint8_t kx[32], ky[32];
  mm_key(33, kx);
  mm_key(34, ky);
  int both = 0;
  for (int i = 0; i < 400 && both < 2; i++) {
    Neoflow__ServerMessage *hold;
    Neoflow__StatusReply *st = status_of(c, &hold);
    both = 0;
    for (size_t j = 0; j < st->n_jobs; j++)
      if (st->jobs[j]->key.len == 32 && st->jobs[j]->state == NEOFLOW__JOB_STATE__JOB_QUEUED &&
          (!memcmp(st->jobs[j]->key.data, kx, 32) || !memcmp(st->jobs[j]->key.data, ky, 32)))
        both++;
    nf_wire_free_server(hold);
    if (both < 2) sleep_ms(25);
  }
  ck_assert_int_eq(both, 2);
  uint64_t ids[2] = {2, 3};
  double ms[2] = {1.0, 50.0};
  Neoflow__StepTimes stt = NEOFLOW__STEP_TIMES__INIT;
  stt.n_request_id = stt.n_ms = 2;
  stt.request_id = ids;
  stt.ms = ms;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STEP_TIMES;
  m.step_times = &stt;
  ck_assert_int_eq(nf_dconn_send(c, &m, &err), NF_OK);
  Neoflow__Cancel cancel = NEOFLOW__CANCEL__INIT;
  cancel.request_id = 1;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_CANCEL;
  m.cancel = &cancel;
  ck_assert_int_eq(nf_dconn_send(c, &m, &err), NF_OK);
  int y_tuning = 0, x_queued = 0;
  for (int i = 0; i < 200 && !y_tuning; i++) {
    Neoflow__ServerMessage *hold;
    Neoflow__StatusReply *st = status_of(c, &hold);
    for (size_t j = 0; j < st->n_jobs; j++) {
      const Neoflow__JobInfo *ji = st->jobs[j];
      if (ji->key.len != 32) continue;
      if (!memcmp(ji->key.data, ky, 32) && ji->state == NEOFLOW__JOB_STATE__JOB_TUNING) {
        y_tuning = 1;
        x_queued = 0;
        for (size_t q = 0; q < st->n_jobs; q++)
          if (st->jobs[q]->key.len == 32 && !memcmp(st->jobs[q]->key.data, kx, 32))
            x_queued = st->jobs[q]->state == NEOFLOW__JOB_STATE__JOB_QUEUED;
      }
      ck_assert_msg(memcmp(ji->key.data, kx, 32) || ji->state != NEOFLOW__JOB_STATE__JOB_TUNING,
                    "X (1 ms per step) was tuned before Y (50 ms)");
    }
    nf_wire_free_server(hold);
    if (!y_tuning) sleep_ms(50);
  }
  ck_assert_msg(y_tuning && x_queued, "Y did not start first (tuning %d, X queued %d)", y_tuning,
                x_queued);
  nf_buf_free(&err);
  nf_wire_graph_free(w);
  nf_wire_graph_free(x);
  nf_wire_graph_free(y);
  nf_dconn_close(c);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* Fair share: client A queues 10 compiles (one compile slot), then B asks
 * for one; B's job goes next, not after A's ten. */
START_TEST(daemon_fair_share) {
  dm d;
  dm_init(&d);
  dm_config(&d, "[jobs]\ncompile_jobs = 1\n");
  dm_start(&d);
  nf_dconn *a = open_client(&d, "greedy");
  nf_dconn *b = open_client(&d, "modest");
  for (int i = 0; i < 10; i++) {
    Neoflow__Graph *pg = mm_wire(50 + i);
    submit(a, (uint64_t)i + 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
    nf_wire_graph_free(pg);
  }
  /* all ten are queued (or running) before B asks */
  int queued = 0;
  for (int i = 0; i < 200 && queued < 9; i++) {
    Neoflow__ServerMessage *hold;
    queued = (int)status_of(b, &hold)->n_jobs;
    nf_wire_free_server(hold);
    if (queued < 9) sleep_ms(20);
  }
  ck_assert_int_ge(queued, 9);
  Neoflow__Graph *pg = mm_wire(70);
  submit(b, 1, pg, NEOFLOW__MODE__MODE_COMPILE, 0);
  nf_dkernel k;
  final_kernel(b, 1, &k, NULL);
  nf_dkernel_free(&k);
  Neoflow__ServerMessage *hold;
  int left = (int)status_of(b, &hold)->n_jobs;
  nf_wire_free_server(hold);
  /* at most the job running when B asked (and one starting) went before */
  ck_assert_msg(left >= 7, "B waited for A's jobs: only %d of A's left", left);
  nf_wire_graph_free(pg);
  nf_dconn_close(a);
  nf_dconn_close(b);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  dm_done(&d);
}
END_TEST

/* The client refuses a "daemon" run by a stranger: a socket another uid
 * made in a directory it does not own (as root only: needs a second uid). */
START_TEST(daemon_client_checks_server_uid) {
  if (geteuid() != 0) return;
  char dir[] = "/tmp/nf_fake_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_eq(chmod(dir, 0777), 0);
  char path[96];
  snprintf(path, sizeof path, "%s/s.sock", dir);
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  pid_t p = fork();
  if (p == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) _exit(4);
    if (write(ready[1], "r", 1) != 1) _exit(5);
    int c = accept(s, NULL, NULL);
    sleep(5); /* say nothing */
    close(c);
    _exit(0);
  }
  char r;
  ck_assert_int_eq(read(ready[0], &r, 1), 1);
  nf_dconn *c = NULL;
  nf_buf err = NF_BUF_INIT;
  nf_dconn_opts o = {.address = path, .timeout_ms = 2000};
  ck_assert_int_eq(nf_dconn_open(&o, &c, &err), NF_EINVAL);
  ck_assert_msg(strstr(nf_buf_str(&err), "refusing the daemon") != NULL, "%s", nf_buf_str(&err));
  nf_buf_free(&err);
  kill(p, SIGKILL);
  waitpid(p, NULL, 0);
  close(ready[0]);
  close(ready[1]);
  unlink(path);
  rmdir(dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, daemon_compile_then_hit_and_restart);
  tcase_add_test(tc, daemon_hostile_frames);
  tcase_add_test(tc, daemon_stalls_and_slow_readers);
  tcase_add_test(tc, daemon_connection_limit);
  tcase_add_test(tc, daemon_tcp_key);
  tcase_add_test(tc, daemon_second_instance_refused);
  tcase_add_test(tc, daemon_sighup_reload);
  tcase_add_test(tc, daemon_other_uid_refused);
  tcase_add_test(tc, daemon_client_checks_server_uid);
  tcase_add_test(tc, daemon_disconnect_mid_job);
  tcase_add_test(tc, daemon_kill9_during_writes);
  tcase_add_test(tc, daemon_single_flight_32);
  tcase_add_test(tc, daemon_job_faults);
  tcase_add_test(tc, daemon_hard_limit_mid_broadcast);
  tcase_add_test(tc, daemon_fair_share);
  tcase_add_test(tc, daemon_step_time_order);
  tcase_add_test(tc, daemon_fd_exhaustion);
  tcase_add_test(tc, daemon_cache_locked_elsewhere);
  suite_add_tcase(s, tc);
  TCase *tv = tcase_create("validator"); /* CK_RUN_CASE=validator runs it alone */
  tcase_set_timeout(tv, 300);
  tcase_add_test(tv, daemon_validator);
  suite_add_tcase(s, tv);
  TCase *gpu = tcase_create("cuda"); /* CK_RUN_CASE=cuda runs it alone */
  tcase_set_timeout(gpu, 300);
  tcase_add_test(gpu, daemon_cuda_target);
  tcase_add_test(gpu, daemon_cuda_tuned);
  suite_add_tcase(s, gpu);
  return s;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
