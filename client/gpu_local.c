/* gpu_local.c - tier 0 on a GPU for the subgraphs no library takes: the
 * session generates a straightforward kernel for each itself, so that
 * they leave the host before any daemon answers (and with no daemon).
 *
 * A background thread takes the entries that neither cuBLAS nor cuDNN
 * runs, the most expensive first (flops per step), lowers each with the
 * default GPU schedule (nf_schedule_default_gpu: one output element per
 * thread, the daemon's tier 1 too), emits CUDA C and compiles it for the
 * device's sm with an NVRTC loaded at run time (nf_nvrtc_rt.h), and hands
 * the bundle over like one from the daemon (nf__kt_offer, tier 0):
 * it is loaded at a step boundary and checked by a canary against the
 * host's tier 0 before it runs.  A kernel from the daemon always wins:
 * an entry that has one is skipped, and a generated one that arrives
 * after it is dropped (nf__kt_boundary).  A subgraph the backend refuses
 * (a block over the limits, f16/bf16) stays on the host.
 *
 * Without NVRTC (not installed, $NEOFLOW_LIBNVRTC=none) the session
 * says so once and the rest runs on the host until the daemon's kernels
 * arrive. */
#include <pthread.h>
#include <stdio.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "nf_cuda.h"
#include "nf_lower.h"
#include "nf_nvrtc_rt.h"
#include "nf_clock.h"
#include "nf_gpugen.h"

struct nf__gen {
  nf__ktable *kt;   /* the table it feeds (never the session) */
  nf_nvrtc_rt *nv;
  int sm;
  int *order; /* the entries to generate, most expensive first */
  int n;
  pthread_t th;
  int started;
  /* under kt->mu */
  int stop, done;
  int made, refused, failed;
  double ms; /* compiling, in all */
};

/* Lowers g with the default GPU schedule and compiles it into a bundle. */
static int generate(const struct nf__gen *W, const nf_graph *g, nf_buf *bundle, nf_buf *err) {
  nf_schedule *sch = NULL;
  int rc = nf_schedule_default_gpu(g, NF_GPU_DEFAULT_THREADS, &sch);
  if (rc != NF_OK) {
    nf_buf_printf(err, "no default GPU schedule (%s)", nf_strerror(rc));
    return rc;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_lprog *p = NULL;
  rc = ctx ? nf_lower(g, sch, ctx, &p, err) : NF_ENOMEM;
  if (rc == NF_OK)
    rc = nf_cuda_compile_bundle_with(nf_nvrtc_rt_api(W->nv), p, W->sm, bundle, NULL, err);
  nf_ir_ctx_free(ctx);
  nf_schedule_free(sch);
  return rc;
}

static void *gen_main(void *arg) {
  struct nf__gen *W = arg;
  nf__ktable *kt = W->kt;
  for (int q = 0; q < W->n; q++) {
    int k = W->order[q];
    nf__kent *e = &kt->kents[k];
    pthread_mutex_lock(&kt->mu);
    int stop = W->stop, has = e->in_obj || e->dstate == DK_FINAL;
    pthread_mutex_unlock(&kt->mu);
    if (stop) break;
    if (has) continue; /* the daemon's kernel is here */
    nf_buf b = NF_BUF_INIT, err = NF_BUF_INIT;
    double t0 = nf_now_ms();
    int rc = generate(W, e->g, &b, &err);
    double ms = nf_now_ms() - t0;
    if (rc == NF_OK) {
      uint8_t sha[32];
      crypto_hash_sha256(sha, (const uint8_t *)b.data, b.len);
      rc = nf__kt_offer(kt, k, b.data, b.len, sha, NULL, 0, 0);
    } else if (rc != NF_ELIMIT && rc != NF_EUNSUPPORTED && rc != NF_ENOMEM) {
      char hex[65];
      nf_hash_hex(e->key, hex);
      hex[16] = 0;
      nf__slog_warn(kt->log, "generating the GPU kernel of %s failed: %s", hex, nf_buf_str(&err));
    }
    pthread_mutex_lock(&kt->mu);
    W->ms += ms;
    if (rc == NF_OK) W->made++;
    else if (rc == NF_ELIMIT || rc == NF_EUNSUPPORTED) W->refused++;
    else W->failed++;
    pthread_mutex_unlock(&kt->mu);
    nf_buf_free(&b);
    nf_buf_free(&err);
  }
  pthread_mutex_lock(&kt->mu);
  W->done = 1;
  pthread_cond_broadcast(&kt->cv);
  pthread_mutex_unlock(&kt->mu);
  return NULL;
}

static int cmp_cost(const void *a, const void *b, void *arg) {
  const nf__kent *kents = arg;
  const nf__kent *x = &kents[*(const int *)a], *y = &kents[*(const int *)b];
  double cx = (double)x->flops * x->n_ops, cy = (double)y->flops * y->n_ops;
  return cx > cy ? -1 : cx < cy ? 1 : *(const int *)a - *(const int *)b;
}

int nf__gpu_gen_start(nf__ktable *kt, const uint8_t *lib, int sm, char *note, size_t note_n,
                      struct nf__gen **out) {
  *out = NULL;
  snprintf(note, note_n, "the host");
  int n = 0;
  for (int k = 0; k < kt->n_kents; k++) n += !lib[k];
  if (!n) return NF_OK;
  nf_buf why = NF_BUF_INIT;
  nf_nvrtc_rt *nv = NULL;
  int rc = nf_nvrtc_rt_open(&nv, &why);
  if (rc != NF_OK) {
    snprintf(note, note_n, "the host until the daemon's kernels arrive: %s", nf_buf_str(&why));
    nf_buf_free(&why);
    return rc == NF_ENOMEM ? rc : NF_OK;
  }
  if (!nf_cuda_sm_supported_with(nf_nvrtc_rt_api(nv), sm, &why)) {
    snprintf(note, note_n, "the host until the daemon's kernels arrive: %s", nf_buf_str(&why));
    nf_buf_free(&why);
    nf_nvrtc_rt_close(nv);
    return NF_OK;
  }
  nf_buf_free(&why);
  struct nf__gen *W = calloc(1, sizeof *W);
  if (!W || !(W->order = malloc((size_t)n * sizeof *W->order))) {
    free(W);
    nf_nvrtc_rt_close(nv);
    return NF_ENOMEM;
  }
  W->kt = kt;
  W->nv = nv;
  W->sm = sm;
  for (int k = 0; k < kt->n_kents; k++)
    if (!lib[k]) W->order[W->n++] = k;
  qsort_r(W->order, (size_t)W->n, sizeof *W->order, cmp_cost, kt->kents);
  if (pthread_create(&W->th, NULL, gen_main, W) != 0) {
    nf__gpu_gen_stop(W);
    snprintf(note, note_n, "the host: no thread to generate kernels");
    return NF_OK;
  }
  W->started = 1;
  *out = W;
  snprintf(note, note_n, "kernels generated here (%s) until the daemon's arrive",
           nf_nvrtc_rt_describe(nv));
  return NF_OK;
}

void nf__gpu_gen_stop(struct nf__gen *W) {
  if (!W) return;
  if (W->started) {
    pthread_mutex_lock(&W->kt->mu);
    W->stop = 1;
    pthread_mutex_unlock(&W->kt->mu);
    pthread_join(W->th, NULL);
  }
  nf_nvrtc_rt_close(W->nv);
  free(W->order);
  free(W);
}

int nf__gpu_gen_wait(struct nf__gen *W, int *made, int *refused, int *failed, double *ms) {
  if (!W) return NF_EUNSUPPORTED;
  nf__ktable *kt = W->kt;
  pthread_mutex_lock(&kt->mu);
  while (W->started && !W->done) pthread_cond_wait(&kt->cv, &kt->mu);
  if (made) *made = W->made;
  if (refused) *refused = W->refused;
  if (failed) *failed = W->failed;
  if (ms) *ms = W->ms;
  pthread_mutex_unlock(&kt->mu);
  return NF_OK;
}
