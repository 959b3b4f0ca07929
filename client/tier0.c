/* tier0.c - what the host runs for an entry without a kernel (tier 0:
 * OpenBLAS for matmul- and convolution-shaped subgraphs, else the
 * reference interpreter), and the canary's comparison of a kernel's
 * output against tier 0's, for CPU and GPU sessions alike
 * (session_int.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nf_interp.h"
#include "session_int.h"

/* A kernel's output agrees with tier 0's within this relative error
 * (max |a - ref| over max |ref|). */
#define CANARY_TOL 2e-4
/* ... and for f64 outputs (operators run in f64 for gradient checks) */
#define CANARY_TOL_F64 1e-8

static int run_interp(const nf__op *op, void *const *bufs, nf_buf *err) {
  const nf_graph *g = op->g;
  nf_array in[64], out[64];
  nf_array *pin = op->n_in > 64 ? calloc(op->n_in, sizeof *pin) : in;
  nf_array *pout = op->n_out > 64 ? calloc(op->n_out, sizeof *pout) : out;
  int rc = NF_OK;
  if (!pin || !pout) rc = NF_ENOMEM;
  for (uint32_t i = 0; rc == NF_OK && i < op->n_in; i++) {
    const nf_tensor *t = &g->tensors[g->inputs[i]];
    memset(&pin[i], 0, sizeof pin[i]);
    pin[i].dtype = (nf_dtype)t->dtype;
    pin[i].rank = t->rank;
    memcpy(pin[i].shape, t->shape, sizeof(int64_t) * t->rank);
    pin[i].numel = nf_tensor_numel(t);
    pin[i].data = bufs[i];
  }
  if (rc == NF_OK) rc = nf_interp_run(g, pin, NF_INTERP_F32, pout, err);
  if (rc == NF_OK) {
    for (uint32_t k = 0; k < op->n_out; k++) {
      const nf_tensor *t = &g->tensors[g->outputs[k]];
      size_t want = (size_t)nf_tensor_numel(t) * nf_dtype_size((nf_dtype)t->dtype);
      size_t got = (size_t)pout[k].numel * nf_dtype_size(pout[k].dtype);
      if (got != want && rc == NF_OK) {
        nf_buf_printf(err, "internal error: interpreter output '%s' has %zu bytes, not %zu",
                      t->name, got, want);
        rc = NF_EINTERNAL;
      }
      if (rc == NF_OK) memcpy(bufs[op->n_in + k], pout[k].data, want);
      nf_array_free(&pout[k]);
    }
  }
  if (pin != in) free(pin);
  if (pout != out) free(pout);
  return rc;
}

/* Tier 0: OpenBLAS or the interpreter. */
int nf__tier0_run(nf_session *s, nf__kent *k, const nf__op *op, void *const *bufs,
                  nf_buf *err) {
  if (!k->gemm || op->alias) return run_interp(op, bufs, err);
  if (k->gather_in < 0) return nf_gemm_run(k->gemm, bufs, s->pool, err);
  /* the peer gathered the same cells from this very buffer in this step
   * or evaluation: within one, a buffer is written once, before its
   * first reader, and stays live (so unchanged) until its last */
  const void *src = bufs[k->gather_in];
  const nf__kent *p = k->gather_peer >= 0 ? &s->kt.kents[k->gather_peer] : NULL;
  int share = p && p->gather_seq == s->run_seq && p->gather_src == src;
  int rc = nf_gemm_run_shared(k->gemm, bufs, s->pool, share ? p->gemm : NULL, err);
  k->gather_seq = rc == NF_OK ? s->run_seq : 0;
  k->gather_src = src;
  return rc;
}

int nf__canary_output_ok(const nf_graph *g, uint32_t out, const void *a, const void *ref,
                         double *worst) {
  const nf_tensor *t = &g->tensors[g->outputs[out]];
  int64_t n = nf_tensor_numel(t);
  if (t->dtype != NF_F32 && t->dtype != NF_F64)
    return memcmp(a, ref, (size_t)n * nf_dtype_size((nf_dtype)t->dtype)) == 0;
  int f64 = t->dtype == NF_F64;
  double mx = 0, md = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = f64 ? ((const double *)a)[i] : ((const float *)a)[i];
    double y = f64 ? ((const double *)ref)[i] : ((const float *)ref)[i];
    if (isnan(x) != isnan(y)) return 0;
    if (isnan(y)) continue;
    if (isinf(y) || isinf(x)) {
      if (x != y) return 0;
      continue;
    }
    double d = fabs(x - y);
    if (fabs(y) > mx) mx = fabs(y);
    if (d > md) md = d;
  }
  double rel = md / (mx > 1e-300 ? mx : 1e-300);
  if (md <= (f64 ? 1e-300 : 1e-30)) rel = 0;
  if (rel > *worst) *worst = rel;
  return rel <= (f64 ? CANARY_TOL_F64 : CANARY_TOL);
}

int nf__canary_verdict(nf_session *s, const nf__kent *k, const nf__op *op, void *const *got,
                       int crc, const nf_buf *err, const char *what) {
  double worst = 0;
  int ok = crc == NF_OK;
  for (uint32_t o = 0; ok && o < op->n_out; o++)
    ok = nf__canary_output_ok(op->g, o, got[o], op->bufs[op->n_in + o], &worst);
  if (ok) return 1;
  char hex[65];
  nf_hash_hex(k->key, hex);
  hex[16] = 0;
  nf__slog_warn(&s->log, "%s %s (tier %d) rejected: %s%s", what, hex, k->cand_tier,
                crc != NF_OK ? "it failed: " : "its results differ from the reference",
                crc != NF_OK ? nf_buf_str(err) : "");
  s->rejected++;
  return 0;
}
