/* gpu_session.c - training on a GPU: the step program of session.c with
 * its buffers in device memory (session_int.h, docs/gpu.md).
 *
 * Memory: every host buffer of the program (the planned arena, the flat
 * parameter, gradient and optimizer vectors, the hyper-parameters, each
 * fed input and output) gets one device allocation of the same size,
 * made once when the session opens; a buffer's device address is its
 * region's base plus its offset, so the CPU plan's sharing of bytes
 * between buffers with disjoint lifetimes carries over.  The device holds
 * the truth during steps; host copies are refreshed when the program
 * reads (nf_session_read, the loss, saving parameters) and uploaded when
 * it writes (feeding, setting parameters).
 *
 * Kernels: an entry runs its CUDA module (a bundle from the daemon,
 * loaded at a step boundary on the program thread), or tier 0: cuBLAS's
 * sgemm on the device for a product without a prologue (nf_gemm_device;
 * a fused epilogue runs on the host from the downloaded product); cuDNN
 * on the device for a convolution, its forward or either
 * gradient (nf_conv_prepare), with a fused epilogue (bias, ReLU, ...) run
 * on the host from the downloaded result; else on the host: its inputs
 * downloaded, the CPU's tier 0 (OpenBLAS, the interpreter) run, its
 * outputs uploaded (correct and slow).  After a module is swapped in for
 * an entry that cuBLAS or cuDNN runs, the next NF_RACE_RUNS runs
 * alternate between the two, synchronised and timed, and the faster by
 * median is kept, as OpenBLAS races compiled kernels on the CPU.  A new module runs a canary
 * against tier 0 (or the verified module it would replace) on the step's
 * real inputs before it is used, as on the CPU.
 *
 * A sticky CUDA error (an illegal address, a failed launch) ends the
 * session's steps with the error: the context and what it held are
 * gone. */
#include <stdlib.h>
#include <string.h>

#include "nf_conv.h"
#include "nf_cublas.h"
#include "nf_cuda_plan.h"
#include "nf_cuda_rt.h"
#include "nf_cudnn.h"
#include "nf_dist.h"
#include "session_int.h"
#include "nf_env.h"

typedef struct region {
  const char *host;
  size_t bytes;
  uint64_t dev;
} region;

/* A CUDA bundle waiting in an entry's mailbox (gpu_accept). */
typedef struct gpu_bun {
  size_t len;
  uint8_t bytes[];
} gpu_bun;

struct nf__gpu {
  nf_cuda_rt *rt;
  int n_regions;
  region *regions;
  uint64_t **dargs;   /* per op: the device address of each buffer */
  uint64_t scratch[NF_CUDA_MAX_STREAMS]; /* per stream: device scratch for the
                                           modules (scratch_bytes each) */
  uint64_t scratch_bytes;
  /* streams: an op runs on its stream (op_stream: its module, or its
   * library call through that stream's handle), after waiting for the
   * events of the ops it depends on (deps: earlier ops whose device bytes
   * overlap its own, one of them writing) that last ran on another
   * stream; every op records its event when it is queued */
  int n_streams;
  int *op_stream;
  int **deps, *n_deps; /* descending op indices */
  int *ran_stream;     /* per op: where it last ran (-1: never) */
  uint64_t *ran_seq, seq; /* per op: when (a count of op runs) */
  uint8_t used[NF_CUDA_MAX_STREAMS]; /* streams modules ran on, this step */
  int timed;          /* this step synchronises after each entry (its
                         per-entry times are real, not launch times) */
  nf_cublas *blas;    /* NULL: no cuBLAS (tier 0 on the host) */
  nf_gemm_desc *desc; /* per entry: its product for cuBLAS ... */
  uint8_t *plain;     /* ... when 1 (nf_gemm_device) */
  nf_cudnn *dnn;      /* NULL: no cuDNN (tier 0 on the host) */
  nf_conv_sub **conv; /* per entry: its convolution for cuDNN, or NULL */
  uint64_t *res_dev;  /* per entry: device storage of a library's result
                         that is a local of the subgraph (cuBLAS, cuDNN) */
  void **res_host;    /* per entry: its host copy, where an epilogue reads it */
  /* CUDA graphs: [0] a step's ops, [1] an evaluation's */
  int graphs;                 /* 0: off (no entry points, $NEOFLOW_GPU_GRAPHS=0, a
                                 capture failed) */
  nf_cuda_graph *graph[2];
  uint64_t graph_sig[2];      /* how each graph's ops ran (run_sig) */
  uint8_t graph_used[2][NF_CUDA_MAX_STREAMS]; /* the streams its modules use */
  uint64_t last_sig[2];
  int stable[2];              /* untimed runs in a row with last_sig */
  uint64_t epoch;             /* modules swapped in so far (a new module may
                                 reuse a freed one's address) */
  int64_t graph_runs;
  int captures;
};

/* Untimed runs the same way before the ops are captured into a graph. */
#define GRAPH_AFTER 2

/* Every this many steps (and the first), entries are timed for real: the
 * daemon's tuning order and --profile use those times. */
#define GPU_TIMED_EVERY 16

static int region_add(struct nf__gpu *G, const void *host, size_t bytes) {
  if (!host) return NF_OK;
  if (!bytes) bytes = 1; /* an empty tensor still needs an address */
  for (int i = 0; i < G->n_regions; i++)
    if (G->regions[i].host == host) return NF_OK;
  region *r = realloc(G->regions, sizeof *r * (size_t)(G->n_regions + 1));
  if (!r) return NF_ENOMEM;
  G->regions = r;
  r[G->n_regions].host = host;
  r[G->n_regions].bytes = bytes;
  r[G->n_regions].dev = 0;
  G->n_regions++;
  return NF_OK;
}

/* The region holding [host, host + n), or NULL. */
static const region *region_of(const struct nf__gpu *G, const void *host, size_t n) {
  const char *p = host;
  for (int i = 0; i < G->n_regions; i++) {
    const region *r = &G->regions[i];
    if (p >= r->host && p + n <= r->host + r->bytes) return r;
  }
  return NULL;
}

static uint64_t dev_of(const struct nf__gpu *G, const void *host, size_t n) {
  const region *r = region_of(G, host, n);
  return r ? r->dev + (uint64_t)((const char *)host - r->host) : 0;
}

/* The device address mirroring [host, host + n) into *d; NF_OK, or
 * NF_EINTERNAL (a buffer the session does not mirror). */
static int mirror_of(nf_session *s, const void *host, size_t n, uint64_t *d) {
  *d = dev_of(s->gpu, host, n);
  if (*d) return NF_OK;
  nf_buf_printf(&s->err, "internal error: a host buffer the GPU does not mirror");
  return NF_EINTERNAL;
}

static int gpu_pull(nf_session *s, const void *host, size_t n) {
  uint64_t d = 0;
  if (!s->gpu || !n) return NF_OK;
  int rc = mirror_of(s, host, n, &d);
  return rc ? rc : nf_cuda_rt_download(s->gpu->rt, (void *)host, d, n, &s->err);
}

static int gpu_push(nf_session *s, const void *host, size_t n) {
  uint64_t d = 0;
  if (!s->gpu || !n) return NF_OK;
  int rc = mirror_of(s, host, n, &d);
  return rc ? rc : nf_cuda_rt_upload(s->gpu->rt, d, host, n, &s->err);
}

static int gpu_target(const nf__ktable *kt, const char **name) {
  const struct nf__gpu *G = kt->dev_ctx;
  if (name) *name = G ? nf_cuda_rt_name(G->rt) : "";
  return G ? nf_cuda_rt_sm(G->rt) : 0;
}

int nf__gpu_blas_entries(const nf_session *s) {
  int n = 0;
  for (int k = 0; s->gpu && s->gpu->blas && k < s->kt.n_kents; k++) n += s->gpu->plain[k];
  return n;
}

int nf__gpu_dnn_entries(const nf_session *s) {
  int n = 0;
  for (int k = 0; s->gpu && s->gpu->dnn && k < s->kt.n_kents; k++) n += s->gpu->conv[k] != NULL;
  return n;
}

/* 1 when entry k's tier 0 runs on the device through a library. */
static int lib_tier0(const struct nf__gpu *G, int k) {
  return (G->blas && G->plain[k]) || (G->dnn && G->conv[k]);
}

static int gpu_lib_tier0(const nf_session *s, const nf__kent *k) {
  return lib_tier0(s->gpu, (int)(k - s->kt.kents));
}

static const char *gpu_tier0_name(const nf_session *s, const nf__kent *k) {
  const struct nf__gpu *G = s->gpu;
  int i = (int)(k - s->kt.kents);
  if (G->blas && G->plain[i]) return "cuBLAS";
  if (G->dnn && G->conv[i]) return "cuDNN";
  return "host";
}

/* Which device the options name: -1 for the CPU, else the GPU's index;
 * -2 for a string that names neither. */
/* "cuda" is the first device; under a launcher, the rank's on its node
 * (Open MPI's, MPICH's or Slurm's local rank): one GPU per rank, as NCCL
 * wants. */
static int device_index(const char *d) {
  if (!d || !*d || !strcmp(d, "cpu")) return -1;
  if (!strcmp(d, "cuda")) {
    const char *lr = nf_env(NF_ENV_OMPI_LOCAL_RANK);
    if (!lr) lr = nf_env(NF_ENV_MPI_LOCALRANKID);
    if (!lr) lr = nf_env(NF_ENV_SLURM_LOCALID);
    long v = lr ? strtol(lr, NULL, 10) : 0;
    return v > 0 && v < 1024 ? (int)v : 0;
  }
  if (!strncmp(d, "cuda:", 5)) {
    char *end = NULL;
    long v = strtol(d + 5, &end, 10);
    if (end != d + 5 && !*end && v >= 0 && v < 1024) return (int)v;
  }
  return -2;
}

static void gpu_close(nf_session *s) {
  struct nf__gpu *G = s->gpu;
  if (!G) return;
  nf__gpu_gen_stop(s->gen);
  s->gen = NULL;
  /* the graphs first: they launch the modules */
  for (int i = 0; i < 2; i++) nf_cuda_graph_free(G->rt, G->graph[i]);
  /* bundles still in the mailboxes and the modules: the CUDA device's;
   * the session goes back to the CPU's device (no producer runs now: the
   * generator has stopped, the link is started only after the device is
   * open and stopped before it is closed) */
  pthread_mutex_lock(&s->kt.mu);
  for (int i = 0; i < s->kt.n_kents; i++) {
    nf__kent *k = &s->kt.kents[i];
    nf__cuda_device.drop(k->in_obj);
    nf_cuda_module_free(k->cur);
    nf_cuda_module_free(k->cand);
    k->in_obj = k->cur = k->cand = NULL;
  }
  s->kt.dev = &nf__cpu_device;
  s->kt.dev_ctx = NULL;
  pthread_mutex_unlock(&s->kt.mu);
  nf_cublas_close(G->blas);
  for (int i = 0; G->res_dev && i < s->kt.n_kents; i++) {
    nf_cuda_rt_free(G->rt, G->res_dev[i]);
    free(G->res_host[i]);
  }
  free(G->res_dev);
  free(G->res_host);
  free(G->desc);
  free(G->plain);
  for (int i = 0; G->conv && i < s->kt.n_kents; i++) {
    nf_conv_free(G->conv[i]);
  }
  nf_cudnn_close(G->dnn);
  free(G->conv);
  for (int i = 0; i < G->n_regions; i++) nf_cuda_rt_free(G->rt, G->regions[i].dev);
  for (int i = 0; i < NF_CUDA_MAX_STREAMS; i++) nf_cuda_rt_free(G->rt, G->scratch[i]);
  for (int i = 0; G->deps && i < s->n_ops; i++) free(G->deps[i]);
  free(G->deps);
  free(G->n_deps);
  free(G->op_stream);
  free(G->ran_stream);
  free(G->ran_seq);
  if (G->dargs)
    for (int i = 0; i < s->n_ops; i++) free(G->dargs[i]);
  free(G->dargs);
  free(G->regions);
  nf_cuda_rt_close(G->rt);
  free(G);
  s->gpu = NULL;
}

/* The role (nf_conv_sub_buffer) of the tensor a convolution writes. */
static int conv_result_role(const nf_conv_sub *cs) {
  nf_conv_kind k = nf_conv_sub_desc(cs)->kind;
  return k == NF_CONV_FWD ? 2 : k == NF_CONV_BWD_DATA ? 0 : 1;
}

/* Whether ops i and j touch overlapping device bytes, one of them
 * writing (a local library result of one entry counts as written). */
static int ops_conflict(const nf_session *s, int i, int j) {
  const struct nf__gpu *G = s->gpu;
  const nf__op *a = &s->ops[i], *b = &s->ops[j];
  if (a->kent == b->kent && G->res_dev[a->kent]) return 1;
  for (uint32_t x = 0; x < a->n_in + a->n_out; x++) {
    uint64_t ax = G->dargs[i][x], an = (uint64_t)s->slots[a->slots[x]].bytes;
    for (uint32_t y = 0; y < b->n_in + b->n_out; y++) {
      if (x < a->n_in && y < b->n_in) continue; /* two reads */
      uint64_t by = G->dargs[j][y], bn = (uint64_t)s->slots[b->slots[y]].bytes;
      if (an && bn && ax < by + bn && by < ax + an) return 1;
    }
  }
  return 0;
}

/* The streams ($NEOFLOW_GPU_STREAMS, 1 to NF_CUDA_MAX_STREAMS, default
 * 4), each op's dependencies and the stream its module runs on: the
 * stream of a dependency that was the last op there (a chain stays on
 * one stream, without events), else the stream whose last op is oldest. */
static int plan_streams(nf_session *s) {
  struct nf__gpu *G = s->gpu;
  const char *e = nf_env(NF_ENV_GPU_STREAMS);
  int want = e && *e ? atoi(e) : 4;
  if (want < 1) want = 1;
  int rc = nf_cuda_rt_set_streams(G->rt, want, &s->err);
  G->n_streams = nf_cuda_rt_n_streams(G->rt);
  if (rc != NF_OK || G->n_streams == 1) return rc;
  if ((rc = nf_cuda_rt_events(G->rt, s->n_ops, &s->err)) != NF_OK) return rc;
  int n = s->n_ops;
  G->op_stream = calloc((size_t)n + 1, sizeof *G->op_stream);
  G->ran_stream = malloc(((size_t)n + 1) * sizeof *G->ran_stream);
  G->ran_seq = calloc((size_t)n + 1, sizeof *G->ran_seq);
  G->deps = calloc((size_t)n + 1, sizeof *G->deps);
  G->n_deps = calloc((size_t)n + 1, sizeof *G->n_deps);
  int *tmp = malloc(((size_t)n + 1) * sizeof *tmp);
  if (!G->op_stream || !G->ran_stream || !G->ran_seq || !G->deps || !G->n_deps || !tmp) {
    free(tmp);
    return NF_ENOMEM;
  }
  int last[NF_CUDA_MAX_STREAMS];
  for (int t = 0; t < NF_CUDA_MAX_STREAMS; t++) last[t] = -1;
  for (int j = 0; j < n; j++) {
    G->ran_stream[j] = -1;
    int nd = 0;
    for (int i = j - 1; i >= 0; i--)
      if (ops_conflict(s, i, j)) tmp[nd++] = i;
    if (nd && !(G->deps[j] = malloc((size_t)nd * sizeof *G->deps[j]))) {
      free(tmp);
      return NF_ENOMEM;
    }
    if (nd) memcpy(G->deps[j], tmp, (size_t)nd * sizeof *tmp);
    G->n_deps[j] = nd;
    int st = -1;
    for (int q = 0; q < nd && st < 0; q++)
      if (last[G->op_stream[tmp[q]]] == tmp[q]) st = G->op_stream[tmp[q]];
    if (st < 0) {
      st = 0;
      for (int t = 1; t < G->n_streams; t++)
        if (last[t] < last[st]) st = t;
    }
    G->op_stream[j] = st;
    last[st] = j;
  }
  free(tmp);
  return NF_OK;
}

int nf__gpu_open(nf_session *s) {
  const char *want = s->opts.device && *s->opts.device ? s->opts.device : nf_env(NF_ENV_DEVICE);
  int dev = device_index(want);
  if (dev == -1) return NF_OK;
  if (dev == -2) {
    nf_buf_printf(&s->err, "device '%s': use cpu, cuda or cuda:N", want);
    return NF_EINVAL;
  }
  nf_buf why = NF_BUF_INIT;
  nf_cuda_rt *rt = NULL;
  int rc = nf_cuda_rt_open(dev, &rt, &why);
  if (rc == NF_OK && (rc = nf_cuda_rt_probe(rt, &why)) != NF_OK) {
    nf_buf_puts(&why, " (the device failed its health probe)");
    nf_cuda_rt_close(rt);
    rc = rc == NF_ENOMEM ? NF_EIO : rc;
  }
  if (rc != NF_OK) {
    nf__slog_warn(&s->log, "device %s: %s; training on the CPU", want, nf_buf_str(&why));
    nf_buf_free(&why);
    return rc == NF_ENOMEM ? rc : NF_OK;
  }
  nf_buf_free(&why);
  struct nf__gpu *G = calloc(1, sizeof *G);
  if (!G) {
    nf_cuda_rt_close(rt);
    return NF_ENOMEM;
  }
  G->rt = rt;
  s->gpu = G;
  s->kt.dev = &nf__cuda_device;
  s->kt.dev_ctx = G;
  size_t fb = (size_t)s->n_flat * sizeof(float);
  rc = region_add(G, s->arena, (size_t)s->arena_bytes);
  if (rc == NF_OK) rc = region_add(G, s->P, fb);
  if (rc == NF_OK) rc = region_add(G, s->G, fb);
  if (rc == NF_OK) rc = region_add(G, s->M, fb);
  if (rc == NF_OK) rc = region_add(G, s->V, fb);
  if (rc == NF_OK) rc = region_add(G, s->hp, sizeof s->hp);
  for (int i = 0; rc == NF_OK && i < s->n_slots; i++)
    if (!region_of(G, s->slots[i].ptr, (size_t)s->slots[i].bytes))
      rc = region_add(G, s->slots[i].ptr, (size_t)s->slots[i].bytes);
  /* device memory, once; the host's contents (initial parameters, zeroed
   * state, the loss seed) copied up */
  for (int i = 0; rc == NF_OK && i < G->n_regions; i++) {
    region *r = &G->regions[i];
    rc = nf_cuda_rt_alloc(rt, r->bytes, &r->dev, &s->err);
    if (rc == NF_OK) rc = nf_cuda_rt_upload(rt, r->dev, r->host, r->bytes, &s->err);
  }
  if (rc == NF_OK && !(G->dargs = calloc((size_t)s->n_ops + 1, sizeof *G->dargs))) rc = NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < s->n_ops; i++) {
    nf__op *op = &s->ops[i];
    uint32_t n = op->n_in + op->n_out;
    if (!(G->dargs[i] = calloc(n + 1, sizeof(uint64_t)))) rc = NF_ENOMEM;
    for (uint32_t j = 0; rc == NF_OK && j < n; j++) {
      const nf__slot *sl = &s->slots[op->slots[j]];
      G->dargs[i][j] = dev_of(G, sl->ptr, (size_t)sl->bytes);
      if (!G->dargs[i][j]) rc = NF_EINTERNAL;
    }
  }
  /* products (without a prologue): cuBLAS when it can be loaded */
  if (rc == NF_OK && (!(G->desc = calloc((size_t)s->kt.n_kents + 1, sizeof *G->desc)) ||
                      !(G->plain = calloc((size_t)s->kt.n_kents + 1, 1))))
    rc = NF_ENOMEM;
  int n_plain = 0;
  for (int k = 0; rc == NF_OK && k < s->kt.n_kents; k++)
    n_plain += G->plain[k] = (uint8_t)nf_gemm_device(s->kt.kents[k].gemm, &G->desc[k]);
  const char *blas_note = "";
  nf_buf bwhy = NF_BUF_INIT;
  if (rc == NF_OK && n_plain && nf_cublas_open(rt, &G->blas, &bwhy) != NF_OK) {
    G->blas = NULL;
    blas_note = nf_buf_str(&bwhy);
  }
  /* convolutions: cuDNN when it can be loaded */
  int n_conv = 0;
  if (rc == NF_OK && !(G->conv = calloc((size_t)s->kt.n_kents + 1, sizeof *G->conv))) rc = NF_ENOMEM;
  for (int k = 0; rc == NF_OK && k < s->kt.n_kents; k++) {
    if (s->kt.kents[k].alias || G->plain[k]) continue;
    rc = nf_conv_prepare(s->kt.kents[k].g, &G->conv[k], &s->err);
    n_conv += G->conv[k] != NULL;
  }
  const char *dnn_note = "";
  nf_buf dwhy = NF_BUF_INIT;
  if (rc == NF_OK && n_conv && nf_cudnn_open(rt, &G->dnn, &dwhy) != NF_OK) {
    G->dnn = NULL;
    dnn_note = nf_buf_str(&dwhy);
  }
  /* a library result that is a local: its storage, once */
  if (rc == NF_OK && (!(G->res_dev = calloc((size_t)s->kt.n_kents + 1, sizeof *G->res_dev)) ||
                      !(G->res_host = calloc((size_t)s->kt.n_kents + 1, sizeof *G->res_host))))
    rc = NF_ENOMEM;
  for (int k = 0; rc == NF_OK && k < s->kt.n_kents; k++) {
    const nf__kent *e = &s->kt.kents[k];
    nf_conv_sub *cs = G->conv[k];
    int64_t b = -1;
    if (G->blas && G->plain[k] && G->desc[k].c == e->g->n_inputs + e->g->n_outputs)
      b = nf_gemm_c_bytes(e->gemm); /* (a local product always has an epilogue) */
    else if (G->dnn && cs && nf_conv_sub_buffer(cs, conv_result_role(cs)) < 0)
      b = nf_conv_sub_result_bytes(cs);
    if (b < 0) continue;
    rc = nf_cuda_rt_alloc(rt, (size_t)b, &G->res_dev[k], &s->err);
    if (rc == NF_OK && !(G->res_host[k] = malloc(b ? (size_t)b : 1))) rc = NF_ENOMEM;
  }
  if (rc == NF_OK) rc = plan_streams(s);
  const char *ge = nf_env(NF_ENV_GPU_GRAPHS);
  G->graphs = nf_cuda_rt_graphs(rt) && !(ge && !strcmp(ge, "0"));
  if (rc == NF_OK) rc = nf_cuda_rt_sync(rt, &s->err);
  if (rc != NF_OK) {
    nf_buf_free(&bwhy);
    nf_buf_free(&dwhy);
    nf_buf_printf(&s->err, "%sdevice %s (%s): setting up device memory failed",
                  s->err.len ? "; " : "", want, nf_cuda_rt_name(rt));
    gpu_close(s);
    return rc;
  }
  /* the rest: kernels generated here, from a background thread */
  uint8_t *lib = calloc((size_t)s->kt.n_kents + 1, 1);
  char gen_note[512];
  rc = lib ? NF_OK : NF_ENOMEM;
  for (int k = 0; rc == NF_OK && k < s->kt.n_kents; k++) lib[k] = (uint8_t)lib_tier0(G, k);
  if (rc == NF_OK) rc = nf__gpu_gen_start(&s->kt, lib, nf_cuda_rt_sm(rt), gen_note, sizeof gen_note,
                                           &s->gen);
  free(lib);
  if (rc != NF_OK) {
    nf_buf_free(&bwhy);
    nf_buf_free(&dwhy);
    gpu_close(s);
    return rc;
  }
  nf__slog_msg(&s->log, NEOFLOW_LOG_INFO,
            "training on %s (sm_%d%s), %d device buffers, %d streams%s; %d products on "
            "%s%s%s; %d convolutions on %s%s%s; the rest on %s",
            nf_cuda_rt_name(rt), nf_cuda_rt_sm(rt),
            nf_cuda_rt_emulated(rt) ? ", emulated on the CPU" : "", G->n_regions, G->n_streams,
            G->graphs ? ", CUDA graphs" : "", n_plain,
            G->blas ? "cuBLAS" : "the host", *blas_note ? ": " : "", blas_note, n_conv,
            G->dnn ? nf_cudnn_version(G->dnn) : "the host", *dnn_note ? ": " : "", dnn_note,
            gen_note);
  nf_buf_free(&bwhy);
  nf_buf_free(&dwhy);
  return NF_OK;
}

/* The buffers op's kernels take: the graph's inputs then outputs. */
static uint32_t kent_args(const nf__kent *k) { return k->g->n_inputs + k->g->n_outputs; }

/* The CUDA entry of the device interface: a bundle arrives checked
 * against its entry (plan, architecture) and copied; the program thread
 * loads it at the step boundary (gpu_load), where the context is
 * used. */
static int gpu_check_bundle(const nf__ktable *kt, int k, const void *bin, size_t len,
                            nf_buf *err) {
  nf_cuda_bundle b;
  int rc = nf_cuda_bundle_decode(bin, len, &b, err);
  if (rc != NF_OK) return rc == NF_ENOMEM ? rc : NF_EFORMAT;
  uint32_t want = kent_args(&kt->kents[k]);
  if (b.plan.n_args != want) {
    nf_buf_printf(err, "its launch plan takes %u buffers, the subgraph has %u", b.plan.n_args,
                  want);
    rc = NF_EFORMAT;
  } else if (b.sm > gpu_target(kt, NULL)) {
    nf_buf_printf(err, "it is built for sm_%d, newer than this device (sm_%d)", b.sm,
                  gpu_target(kt, NULL));
    rc = NF_EFORMAT;
  }
  nf_cuda_bundle_free(&b);
  return rc;
}

static int gpu_accept(const nf__ktable *kt, int k, const void *bin, size_t len, void **obj,
                      nf_buf *err) {
  *obj = NULL;
  int rc = gpu_check_bundle(kt, k, bin, len, err);
  if (rc != NF_OK) return rc;
  gpu_bun *b = malloc(sizeof *b + len);
  if (!b) {
    nf_buf_puts(err, "out of memory");
    return NF_ENOMEM;
  }
  b->len = len;
  memcpy(b->bytes, bin, len);
  *obj = b;
  return NF_OK;
}

static void gpu_drop(void *obj) { free(obj); }

static void gpu_unload(void *kern) { nf_cuda_module_free(kern); }

static void gpu_swapped(nf_session *s, nf__kent *k);

/* Loads a bundle handed over for entry k (and frees it): the module, or
 * NULL (said and counted). */
static void *gpu_load(nf_session *s, nf__kent *k, void *obj) {
  gpu_bun *bun = obj;
  const uint8_t *bin = bun->bytes;
  size_t len = bun->len;
  struct nf__gpu *G = s->gpu;
  char hex[65];
  nf_hash_hex(k->key, hex);
  hex[16] = 0;
  nf_cuda_bundle b;
  nf_buf err = NF_BUF_INIT;
  nf_cuda_module *m = NULL;
  int rc = nf_cuda_bundle_decode(bin, len, &b, &err);
  if (rc == NF_OK) {
    rc = nf_cuda_module_load_bundle(G->rt, &b, &m, &err);
    /* every module runs with its stream's scratch buffer: grow them
     * (nothing is running at a step boundary once the streams are idle) */
    if (rc == NF_OK && b.plan.scratch_bytes > G->scratch_bytes) {
      gpu_swapped(s, k); /* the graphs launch with the old scratch */
      rc = nf_cuda_rt_sync(G->rt, &err);
      for (int i = 0; rc == NF_OK && i < G->n_streams; i++) {
        uint64_t d = 0;
        rc = nf_cuda_rt_alloc(G->rt, (size_t)b.plan.scratch_bytes, &d, &err);
        if (rc == NF_OK) {
          nf_cuda_rt_free(G->rt, G->scratch[i]);
          G->scratch[i] = d;
        }
      }
      if (rc == NF_OK) G->scratch_bytes = b.plan.scratch_bytes;
    }
    nf_cuda_bundle_free(&b);
  }
  if (rc != NF_OK) {
    nf__slog_warn(&s->log, "kernel %s (tier %d) rejected: loading it on the GPU: %s", hex,
                     k->cand_tier, nf_buf_str(&err));
    nf_cuda_module_free(m);
    s->rejected++;
    m = NULL;
  }
  nf_buf_free(&err);
  free(bun);
  return m;
}

static int gpu_timed(const nf_session *s) { return s->gpu->timed; }

static int gpu_begin(nf_session *s) {
  struct nf__gpu *G = s->gpu;
  G->timed = s->step % GPU_TIMED_EVERY == 0;
  memset(G->used, 0, sizeof G->used);
  return gpu_push(s, s->hp, sizeof s->hp);
}

static size_t buf_bytes(const nf_session *s, const nf__op *op, uint32_t j) {
  return (size_t)s->slots[op->slots[j]].bytes;
}

/* The host half of a library's tier 0 for entry k: its result (buffer
 * rb, or -1: the entry's local storage; bytes long) and the inputs its
 * epilogue reads downloaded, the epilogue run (nf_conv_sub_epilogue or
 * nf_gemm_epilogue), what it writes uploaded. */
static int lib_epilogue(nf_session *s, nf__kent *k, nf__op *op, int rb, size_t bytes) {
  struct nf__gpu *G = s->gpu;
  int ki = (int)(k - s->kt.kents);
  nf_conv_sub *cs = G->conv[ki];
  void *res = rb >= 0 ? op->bufs[rb] : G->res_host[ki];
  int rc = rb >= 0 ? gpu_pull(s, res, bytes)
                   : nf_cuda_rt_download(G->rt, res, G->res_dev[ki], bytes, &s->err);
  for (uint32_t j = 0; rc == NF_OK && j < op->n_in; j++)
    if (cs ? nf_conv_sub_epilogue_reads(cs, j) : nf_gemm_epilogue_reads(k->gemm, j))
      rc = gpu_pull(s, op->bufs[j], buf_bytes(s, op, j));
  if (rc == NF_OK)
    rc = cs ? nf_conv_sub_epilogue(cs, op->bufs, res, &s->err)
            : nf_gemm_epilogue(k->gemm, op->bufs, res, &s->err);
  for (uint32_t j = op->n_in; rc == NF_OK && j < op->n_in + op->n_out; j++)
    if ((int)j != rb) rc = gpu_push(s, op->bufs[j], buf_bytes(s, op, j));
  return rc;
}

/* cuDNN for entry ki's convolution on the device; its epilogue on the
 * host (the result and the inputs it reads downloaded, what it writes
 * uploaded).  NF_EUNSUPPORTED (cuDNN refuses the shape: said once, the
 * entry goes to the host from then on) or another status. */
static int run_conv(nf_session *s, nf__kent *k, nf__op *op, int ki) {
  struct nf__gpu *G = s->gpu;
  nf_conv_sub *cs = G->conv[ki];
  const uint64_t *a = G->dargs[op - s->ops];
  uint64_t dev[3];
  for (int r = 0; r < 3; r++) {
    int b = nf_conv_sub_buffer(cs, r);
    dev[r] = b >= 0 ? a[b] : G->res_dev[ki];
  }
  nf_buf why = NF_BUF_INIT;
  int rc = nf_cudnn_run(G->dnn, nf_conv_sub_desc(cs), dev[0], dev[1], dev[2], &why);
  if (rc == NF_EUNSUPPORTED) {
    char hex[65];
    nf_hash_hex(k->key, hex);
    hex[16] = 0;
    nf__slog_warn(&s->log, "kernel %s: %s: %s; its tier 0 runs on the host", hex,
                     nf_conv_sub_describe(cs), nf_buf_str(&why));
    nf_conv_free(cs);
    G->conv[ki] = NULL;
  } else if (rc != NF_OK) {
    nf_buf_printf(&s->err, "%s", nf_buf_str(&why));
  }
  nf_buf_free(&why);
  if (rc != NF_OK || !nf_conv_sub_has_epilogue(cs)) return rc;
  return lib_epilogue(s, k, op, nf_conv_sub_buffer(cs, conv_result_role(cs)),
                      (size_t)nf_conv_sub_result_bytes(cs));
}

/* cuBLAS for entry ki's product on the device; its epilogue on the host
 * (the product and the inputs it reads downloaded, what it writes
 * uploaded).  NF_EUNSUPPORTED for a product cuBLAS does not take. */
static int run_blas(nf_session *s, nf__kent *k, nf__op *op, int ki) {
  struct nf__gpu *G = s->gpu;
  uint64_t *a = G->dargs[op - s->ops];
  uint32_t nb = op->n_in + op->n_out;
  a[nb] = G->res_dev[ki]; /* the spare slot: a local product */
  int rc = nf_cublas_run(G->blas, &G->desc[ki], a, &s->err);
  if (rc != NF_OK || !nf_gemm_has_epilogue(k->gemm)) return rc;
  uint32_t c = G->desc[ki].c;
  return lib_epilogue(s, k, op, c < nb ? (int)c : -1, (size_t)nf_gemm_c_bytes(k->gemm));
}

/* Tier 0 on the host: inputs down, the CPU's tier 0, outputs up. */
static int host_tier0(nf_session *s, nf__kent *k, nf__op *op) {
  int rc = NF_OK;
  for (uint32_t j = 0; rc == NF_OK && j < op->n_in; j++)
    rc = gpu_pull(s, op->bufs[j], buf_bytes(s, op, j));
  if (rc == NF_OK) rc = nf__tier0_run(s, k, op, op->bufs, &s->err);
  for (uint32_t j = op->n_in; rc == NF_OK && j < op->n_in + op->n_out; j++)
    rc = gpu_push(s, op->bufs[j], buf_bytes(s, op, j));
  return rc;
}

/* Tier 0: cuBLAS for a plain product, cuDNN for a convolution; else (and
 * as a canary's reference) on the host. */
static int gpu_tier0(nf_session *s, nf__kent *k, nf__op *op, int reference) {
  struct nf__gpu *G = s->gpu;
  int ki = (int)(k - s->kt.kents);
  if (!reference && G->blas && G->plain[ki] && !op->alias) {
    int brc = run_blas(s, k, op, ki);
    if (brc != NF_EUNSUPPORTED) return brc;
  }
  /* (an op whose output shares an input's memory stays on the host) */
  if (!reference && G->dnn && G->conv[ki] && !op->alias) {
    int crc = run_conv(s, k, op, ki);
    if (crc != NF_EUNSUPPORTED) return crc;
  }
  return host_tier0(s, k, op);
}

static int run_module(nf_session *s, nf_cuda_module *m, const uint64_t *args, uint32_t n,
                      nf_buf *err) {
  return nf_cuda_module_run(m, args, n, s->gpu->scratch[nf_cuda_rt_selected(s->gpu->rt)], err);
}

static int gpu_run(nf_session *s, nf__kent *k, nf__op *op, void *kern) {
  (void)k;
  return run_module(s, kern, s->gpu->dargs[op - s->ops], op->n_in + op->n_out, &s->err);
}

/* Waits for the queued work; in a data-parallel session through the
 * job's polled wait (NCCL's means may be among it: a hung peer is named
 * within the timeout rather than waited for forever). */
static int gpu_wait(nf_session *s, nf_buf *err) {
  if (s->dist) return nf__dist_device_wait(s);
  return nf_cuda_rt_sync(s->gpu->rt, err);
}

static int gpu_sync(nf_session *s) { return gpu_wait(s, &s->err); }

/* Entry k's module is about to be replaced: the graphs, which may launch
 * the old one, go first. */
static void gpu_swapped(nf_session *s, nf__kent *k) {
  struct nf__gpu *G = s->gpu;
  (void)k;
  for (int i = 0; i < 2; i++) {
    nf_cuda_graph_free(G->rt, G->graph[i]);
    G->graph[i] = NULL;
  }
  G->epoch++;
}

/* A canary's run of the candidate: on device copies of the buffers it
 * writes (and of an in-place op's inputs), synchronised, its outputs
 * downloaded.  A candidate that breaks the context ends the step. */
static int gpu_canary(nf_session *s, nf__kent *k, nf__op *op, void *kern, void **got, double *ms,
                      int *crc, nf_buf *e) {
  struct nf__gpu *G = s->gpu;
  (void)k;
  int op_index = (int)(op - s->ops);
  uint32_t n = op->n_in + op->n_out;
  uint64_t *ca = calloc(n + 1, sizeof *ca);
  uint64_t *own = calloc(n + 1, sizeof *own); /* device copies to free */
  int rc = ca && own ? NF_OK : NF_ENOMEM;
  /* the step's inputs, on the host too (an in-place op's copies come
   * from there, and the reference may run there) */
  for (uint32_t j = 0; rc == NF_OK && j < op->n_in; j++)
    rc = gpu_pull(s, op->bufs[j], buf_bytes(s, op, j));
  for (uint32_t j = 0; rc == NF_OK && j < n; j++) {
    if (j < op->n_in && !op->alias) {
      ca[j] = G->dargs[op_index][j];
      continue;
    }
    if (j >= op->n_in && op->alias) { /* an output over an input: over its copy */
      for (uint32_t i = 0; i < op->n_in; i++)
        if (s->slots[op->slots[i]].ptr == s->slots[op->slots[j]].ptr) ca[j] = ca[i];
      if (ca[j]) continue;
    }
    size_t b = buf_bytes(s, op, j);
    rc = nf_cuda_rt_alloc(G->rt, b, &own[j], &s->err);
    if (rc == NF_OK && j < op->n_in) rc = nf_cuda_rt_upload(G->rt, own[j], op->bufs[j], b, &s->err);
    ca[j] = own[j];
  }
  if (rc == NF_OK) {
    double c0 = nf_now_ms();
    *crc = run_module(s, kern, ca, n, e);
    if (*crc == NF_OK) *crc = gpu_wait(s, e);
    *ms = nf_now_ms() - c0;
    for (uint32_t o = 0; *crc == NF_OK && o < op->n_out; o++) {
      size_t b = buf_bytes(s, op, op->n_in + o);
      if (!(got[o] = malloc(b ? b : 1))) *crc = NF_ENOMEM;
      else *crc = nf_cuda_rt_download(G->rt, got[o], ca[op->n_in + o], b, e);
    }
    nf_buf probe = NF_BUF_INIT;
    int broken = *crc != NF_OK && nf_cuda_rt_sync(G->rt, &probe) != NF_OK;
    nf_buf_free(&probe);
    if (broken) {
      /* the candidate broke the context: nothing else can run */
      nf_buf_printf(&s->err, "a GPU kernel broke the CUDA context: %s", nf_buf_str(e));
      rc = NF_EIO;
    }
  }
  nf_buf probe = NF_BUF_INIT;
  if (nf_cuda_rt_sync(G->rt, &probe) == NF_OK)
    for (uint32_t j = 0; own && j < n; j++) nf_cuda_rt_free(G->rt, own[j]);
  nf_buf_free(&probe);
  free(own);
  free(ca);
  return rc;
}

/* Makes stream st wait for op j's dependencies that last ran on other
 * streams: on each such stream, the one that ran last. */
static int wait_deps(nf_session *s, int j, int st) {
  struct nf__gpu *G = s->gpu;
  uint64_t best[NF_CUDA_MAX_STREAMS] = {0};
  int who[NF_CUDA_MAX_STREAMS] = {0};
  for (int q = 0; q < G->n_deps[j]; q++) {
    int d = G->deps[j][q], t = G->ran_stream[d];
    if (t < 0 || t == st || G->ran_seq[d] <= best[t]) continue;
    best[t] = G->ran_seq[d];
    who[t] = d;
  }
  int rc = NF_OK;
  for (int t = 0; rc == NF_OK && t < G->n_streams; t++)
    if (best[t]) rc = nf_cuda_rt_wait(G->rt, who[t], &s->err);
  return rc;
}

/* Before op i of the loop: its stream selected, waiting for the ops it
 * depends on that ran on other streams. */
static int gpu_op_begin(nf_session *s, int i) {
  struct nf__gpu *G = s->gpu;
  if (G->n_streams <= 1) return NF_OK;
  nf_cuda_rt_select(G->rt, G->op_stream[i]);
  return wait_deps(s, i, G->op_stream[i]);
}

/* After op i: its event recorded (what later ops on other streams wait
 * for), and on a timed step the wait for it, so that its entry's time is
 * the device's rather than the launch's (on other steps only the step as
 * a whole is timed, and per-entry times keep the last timed step's). */
static int gpu_op_end(nf_session *s, int i, int kernel, int rc) {
  struct nf__gpu *G = s->gpu;
  if (G->n_streams > 1) {
    int st = G->op_stream[i];
    if (rc == NF_OK) rc = nf_cuda_rt_record(G->rt, i, &s->err);
    G->ran_stream[i] = st;
    G->ran_seq[i] = ++G->seq;
    G->used[st] |= kernel;
    nf_cuda_rt_select(G->rt, 0);
  }
  if (rc == NF_OK && G->timed) rc = gpu_wait(s, &s->err);
  return rc;
}

/* ---- for data-parallel sessions (dist.c) ---- */

static nf_cuda_rt *gpu_rt(const nf_session *s) { return s->gpu->rt; }

static uint64_t gpu_addr(const nf_session *s, const void *host, size_t n) {
  return dev_of(s->gpu, host, n);
}

/* Queues fn's device work after op (on its stream: in the loop, after
 * its op_end) and after ops[0..n) wherever they ran; then op's event is
 * recorded again, so that what waits for op (the update reading the
 * gradients) waits for fn's work too (nf__device.after_ops). */
static int gpu_after_ops(nf_session *s, int op, const int *ops, int n,
                         int (*fn)(void *ctx, nf_buf *err), void *ctx) {
  struct nf__gpu *G = s->gpu;
  if (G->n_streams <= 1) return fn(ctx, &s->err); /* one stream: in order */
  int st = G->ran_stream[op] >= 0 ? G->ran_stream[op] : G->op_stream[op];
  nf_cuda_rt_select(G->rt, st);
  int rc = NF_OK;
  uint64_t best[NF_CUDA_MAX_STREAMS] = {0};
  int who[NF_CUDA_MAX_STREAMS] = {0};
  for (int q = 0; q < n; q++) {
    int d = ops[q], t = G->ran_stream[d];
    if (t < 0 || t == st || G->ran_seq[d] <= best[t]) continue;
    best[t] = G->ran_seq[d];
    who[t] = d;
  }
  for (int t = 0; rc == NF_OK && t < G->n_streams; t++)
    if (best[t]) rc = nf_cuda_rt_wait(G->rt, who[t], &s->err);
  if (rc == NF_OK) rc = fn(ctx, &s->err);
  if (rc == NF_OK) rc = nf_cuda_rt_record(G->rt, op, &s->err);
  if (rc == NF_OK && G->ran_stream[op] >= 0) G->ran_seq[op] = ++G->seq;
  nf_cuda_rt_select(G->rt, 0);
  return rc;
}

int nf__gpu_streams_used(const nf_session *s) {
  int n = 0;
  for (int t = 0; s->gpu && t < NF_CUDA_MAX_STREAMS; t++) n += s->gpu->used[t];
  return n;
}

/* ---- CUDA graphs ---- */

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

/* How op would run now, mixed into *sig: its module, cuBLAS or cuDNN
 * (which module is the epoch's business: run_sig mixes in the swaps so
 * far); 0 when it would do what a graph cannot hold (a canary, a race
 * run, host work, a library's host epilogue). */
static int op_sig(const nf_session *s, const nf__op *op, uint64_t *sig) {
  const struct nf__gpu *G = s->gpu;
  const nf__kent *k = &s->kt.kents[op->kent];
  int ki = op->kent;
  if (k->cand || (k->cur && k->race_left > 0)) return 0;
  if (k->cur && !k->prefer_t0) {
    *sig = mix(*sig, 3);
    return 1;
  }
  if (op->alias) return 0;
  if (G->blas && G->plain[ki] && !nf_gemm_has_epilogue(k->gemm)) {
    *sig = mix(*sig, 1);
    return 1;
  }
  if (G->dnn && G->conv[ki] && !nf_conv_sub_has_epilogue(G->conv[ki])) {
    *sig = mix(*sig, 2);
    return 1;
  }
  return 0;
}

/* The signature of a run of the ops mask marks; 0 when one of them
 * cannot be in a graph. */
static int run_sig(const nf_session *s, const uint8_t *mask, uint64_t *sig) {
  *sig = mix(mask ? 0x5eedull : 0x57e9ull, s->gpu->epoch);
  for (int i = 0; i < s->n_ops; i++) {
    if (mask && !mask[i]) continue;
    *sig = mix(*sig, (uint64_t)i);
    if (!op_sig(s, &s->ops[i], sig)) return 0;
  }
  return 1;
}

/* The loop's runs: live, or captured into a graph and replayed
 * (session_int.h, nf__gpu_open). */
static int gpu_run_ops(nf_session *s, const uint8_t *mask) {
  struct nf__gpu *G = s->gpu;
  int w = mask != NULL;
  /* every run starts after the last one's work (gpu_begin's upload
   * waited for it): no op waits for an event of an earlier run */
  for (int i = 0; G->ran_stream && i < s->n_ops; i++) G->ran_stream[i] = -1;
  uint64_t sig = 0;
  if (!G->graphs || G->timed || !run_sig(s, mask, &sig)) {
    G->stable[w] = 0;
    return nf__kt_run_ops(s, mask);
  }
  if (G->graph[w] && G->graph_sig[w] == sig) {
    memcpy(G->used, G->graph_used[w], sizeof G->used);
    G->graph_runs++;
    return nf_cuda_rt_graph_launch(G->rt, G->graph[w], &s->err);
  }
  if (sig != G->last_sig[w]) {
    G->last_sig[w] = sig;
    G->stable[w] = 0;
  }
  if (++G->stable[w] <= GRAPH_AFTER) return nf__kt_run_ops(s, mask);
  /* capture: the ops are queued as in a live run, recorded instead of
   * run, then the graph is launched */
  nf_cuda_graph_free(G->rt, G->graph[w]);
  G->graph[w] = NULL;
  nf_buf why = NF_BUF_INIT;
  nf_cuda_graph *g = NULL;
  int rc = nf_cuda_rt_capture_begin(G->rt, &why);
  if (rc == NF_OK) rc = nf__kt_run_ops(s, mask);
  if (rc == NF_OK) rc = nf_cuda_rt_capture_end(G->rt, &g, &why);
  else nf_cuda_rt_capture_abort(G->rt);
  if (rc == NF_OK) {
    G->graph[w] = g;
    G->graph_sig[w] = sig;
    memcpy(G->graph_used[w], G->used, sizeof G->used);
    G->captures++;
    G->graph_runs++;
    nf_buf_free(&why);
    return nf_cuda_rt_graph_launch(G->rt, g, &s->err);
  }
  /* nothing captured ran: said once, the ops run live from now on */
  if (s->err.len) nf_buf_printf(&why, "%s%s", why.len ? "; " : "", nf_buf_str(&s->err));
  nf_buf_reset(&s->err);
  G->graphs = 0;
  if (nf_cuda_rt_broken(G->rt)) {
    nf_buf_printf(&s->err, "capturing a CUDA graph: %s", nf_buf_str(&why));
    nf_buf_free(&why);
    return NF_EIO;
  }
  nf__slog_warn(&s->log, "CUDA graphs off: capturing the %s failed: %s",
                   w ? "evaluation" : "step", nf_buf_str(&why));
  nf_buf_free(&why);
  return nf__kt_run_ops(s, mask);
}

int64_t nf__gpu_graph_runs(const nf_session *s, int *captures) {
  if (captures) *captures = s->gpu ? s->gpu->captures : 0;
  return s->gpu ? s->gpu->graph_runs : 0;
}


const nf__device nf__cuda_device = {
    .name = "cuda",
    .accept = gpu_accept,
    .drop = gpu_drop,
    .target = gpu_target,
    .load = gpu_load,
    .unload = gpu_unload,
    .begin = gpu_begin,
    .run_ops = gpu_run_ops,
    .op_begin = gpu_op_begin,
    .op_end = gpu_op_end,
    .run = gpu_run,
    .tier0 = gpu_tier0,
    .canary = gpu_canary,
    .sync = gpu_sync,
    .pull = gpu_pull,
    .push = gpu_push,
    .swapped = gpu_swapped,
    .lib_tier0 = gpu_lib_tier0,
    .tier0_name = gpu_tier0_name,
    .timed = gpu_timed,
    .close = gpu_close,
    .cuda_rt = gpu_rt,
    .addr = gpu_addr,
    .after_ops = gpu_after_ops,
    .host = 0,
    .race_host = 0,
};
