/* daemon_bench.c - neoflowd's cache-hit round trip and its memory with
 * many clients (run by hand, through bench/daemon_bench.sh).
 *
 *   daemon_bench --socket PATH [--clients N] [--requests R] [--size N]
 *
 * Warms the cache with one compile of an N x N matmul, then N clients
 * (threads, one connection each) each send R identical compile requests
 * one after the other; a round trip is Submit sent -> final kernel
 * received and its digest checked.  Prints p50/p99/max over all round
 * trips and the daemon's resident memory (VmRSS of the pid its status
 * reports) before the clients connect, with all of them connected and
 * idle, and after they finished. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_dconn.h"
#include "nf_ir.h"
#include "nf_wire.h"

static const char *sock;
static Neoflow__Graph *graph;
static int n_req = 200;
static pthread_barrier_t connected, measured;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static nf_dconn *open_or_die(void) {
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = sock, .client_name = "daemon_bench", .timeout_ms = 30000};
  if (nf_dconn_open(&o, &c, &err) != NF_OK) {
    fprintf(stderr, "daemon_bench: %s\n", nf_buf_str(&err));
    exit(1);
  }
  nf_buf_free(&err);
  return c;
}

static double round_trip(nf_dconn *c, uint64_t id) {
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = id;
  s.graph = graph;
  s.mode = NEOFLOW__MODE__MODE_COMPILE;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  m.submit = &s;
  nf_buf err = NF_BUF_INIT;
  double t0 = now_s();
  nf_dkernel k;
  int code;
  if (nf_dconn_send(c, &m, &err) != NF_OK ||
      nf_dconn_next_kernel(c, id, 60000, NULL, NULL, &k, &code, &err) != NF_OK) {
    fprintf(stderr, "daemon_bench: %s\n", nf_buf_str(&err));
    exit(1);
  }
  double t = now_s() - t0;
  nf_dkernel_free(&k);
  nf_buf_free(&err);
  return t;
}

typedef struct th {
  double *lat;
} th;

static void *client(void *arg) {
  th *t = arg;
  nf_dconn *c = open_or_die();
  pthread_barrier_wait(&connected);
  pthread_barrier_wait(&measured); /* RSS with everyone connected */
  for (int i = 0; i < n_req; i++) t->lat[i] = round_trip(c, (uint64_t)i + 1);
  nf_dconn_close(c);
  return NULL;
}

static unsigned daemon_pid(void) {
  nf_dconn *c = open_or_die();
  Neoflow__StatusRequest sr = NEOFLOW__STATUS_REQUEST__INIT;
  Neoflow__ClientMessage m = NEOFLOW__CLIENT_MESSAGE__INIT;
  m.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STATUS;
  m.status = &sr;
  nf_buf err = NF_BUF_INIT;
  unsigned pid = 0;
  nf_dconn_send(c, &m, &err);
  Neoflow__ServerMessage *r = NULL;
  while (nf_dconn_recv(c, 10000, &r, &err) == NF_OK) {
    if (r->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_STATUS) pid = r->status->pid;
    nf_wire_free_server(r);
    if (pid) break;
  }
  nf_buf_free(&err);
  nf_dconn_close(c);
  return pid;
}

static long rss_kib(unsigned pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%u/status", pid);
  FILE *f = fopen(path, "r");
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n_clients = 1;
  int64_t n = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--socket")) sock = argv[i + 1];
    else if (!strcmp(argv[i], "--clients")) n_clients = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--requests")) n_req = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--size")) n = atoll(argv[i + 1]);
  }
  if (n_clients < 1 || n_req < 1 || n < 1) {
    fprintf(stderr, "usage: daemon_bench --socket PATH [--clients N] [--requests R] [--size N]\n");
    return 2;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = nf_graph_new(ctx, "bench_mm");
  int64_t sh[2] = {n, n};
  int a = nf_graph_add_tensor(g, "A", NF_F32, NF_T_INPUT, 2, sh);
  int b = nf_graph_add_tensor(g, "B", NF_F32, NF_T_INPUT, 2, sh);
  int c = nf_graph_add_tensor(g, "C", NF_F32, NF_T_OUTPUT, 2, sh);
  const nf_expr *ia[2] = {nf_e_var(ctx, 0), nf_e_var(ctx, 2)};
  const nf_expr *ib[2] = {nf_e_var(ctx, 2), nf_e_var(ctx, 1)};
  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = (uint32_t)c;
  s.red = NF_RED_SUM;
  s.n_red = 1;
  s.red_ext[0] = n;
  s.rhs = nf_e_binary(ctx, NF_OP_MUL, nf_e_access(ctx, (uint32_t)a, NF_F32, 2, ia),
                      nf_e_access(ctx, (uint32_t)b, NF_F32, 2, ib));
  nf_graph_add_stmt(g, &s);
  if (nf_wire_graph_from_ir(g, &graph) != NF_OK) return 1;
  nf_ir_ctx_free(ctx);

  nf_dconn *w = open_or_die();
  round_trip(w, 1); /* warm: the kernel is now in the cache */
  nf_dconn_close(w);
  unsigned pid = daemon_pid();
  long rss0 = rss_kib(pid);
  pthread_barrier_init(&connected, NULL, (unsigned)n_clients + 1);
  pthread_barrier_init(&measured, NULL, (unsigned)n_clients + 1);
  pthread_t *t = calloc((size_t)n_clients, sizeof *t);
  th *ts = calloc((size_t)n_clients, sizeof *ts);
  double *lat = calloc((size_t)n_clients * (size_t)n_req, sizeof *lat);
  for (int i = 0; i < n_clients; i++) {
    ts[i].lat = lat + (size_t)i * (size_t)n_req;
    pthread_create(&t[i], NULL, client, &ts[i]);
  }
  pthread_barrier_wait(&connected);
  long rss1 = rss_kib(pid);
  double t0 = now_s();
  pthread_barrier_wait(&measured);
  for (int i = 0; i < n_clients; i++) pthread_join(t[i], NULL);
  double wall = now_s() - t0;
  long rss2 = rss_kib(pid);
  size_t total = (size_t)n_clients * (size_t)n_req;
  qsort(lat, total, sizeof *lat, cmp);
  printf("clients %d, requests %zu, kernel of a %lldx%lld matmul\n", n_clients, total,
         (long long)n, (long long)n);
  printf("cache-hit round trip: p50 %.3f ms, p99 %.3f ms, max %.3f ms; %.0f requests/s\n",
         lat[total / 2] * 1e3, lat[(size_t)((double)total * 0.99)] * 1e3, lat[total - 1] * 1e3,
         (double)total / wall);
  printf("daemon RSS: %ld KiB before, %ld KiB with %d clients connected, %ld KiB after\n", rss0,
         rss1, n_clients, rss2);
  nf_wire_graph_free(graph);
  free(t);
  free(ts);
  free(lat);
  return 0;
}
