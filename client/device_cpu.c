/* device_cpu.c - the CPU's entry in the device table (nf_ktable.h): a
 * kernel arrives as a shared object, loaded and checked by the runtime's
 * verified loader (nf_kernel_load: ELF image, kernel ABI) on the thread
 * that offers it, and runs on the session's thread pool over the host
 * buffers of the step program; tier 0 is the host's (tier0.c).  Runs are
 * synchronous and the host's memory is the device's, so sync, pull and
 * push are absent. */
#include <stdlib.h>
#include <string.h>

#include "session_int.h"

static int cpu_accept(const nf__ktable *kt, int k, const void *bin, size_t len, void **obj,
                      nf_buf *err) {
  (void)kt;
  (void)k;
  nf_kernel *kn = NULL;
  int rc = nf_kernel_load(bin, len, &kn, err);
  *obj = kn;
  return rc;
}

/* (the handle only: a loaded kernel's code stays mapped, so no call can
 * run freed code) */
static void cpu_drop(void *obj) { nf_kernel_free(obj); }

static int cpu_target(const nf__ktable *kt, const char **name) {
  (void)kt;
  if (name) *name = "";
  return 0;
}

/* accept loaded it already */
static void *cpu_load(nf_session *s, nf__kent *k, void *obj) {
  (void)s;
  (void)k;
  return obj;
}

static int cpu_run(nf_session *s, nf__kent *k, nf__op *op, void *kern) {
  (void)k;
  return nf_kernel_run(kern, op->bufs, op->n_in + op->n_out, s->pool, &s->err);
}

static int cpu_tier0(nf_session *s, nf__kent *k, nf__op *op, int reference) {
  (void)reference; /* tier 0 is the host's */
  return nf__tier0_run(s, k, op, op->bufs, &s->err);
}

/* The candidate's buffers: outputs to scratch; for an in-place op, inputs
 * copied to scratch too and outputs aliasing those copies.  The outputs'
 * scratch is handed to the caller as got. */
static int cpu_canary(nf_session *s, nf__kent *k, nf__op *op, void *kern, void **got, double *ms,
                      int *crc, nf_buf *err) {
  (void)k;
  uint32_t n = op->n_in + op->n_out;
  void **cb = calloc(n, sizeof(void *));
  void **scratch = calloc(n, sizeof(void *));
  int rc = cb && scratch ? NF_OK : NF_ENOMEM;
  for (uint32_t j = 0; rc == NF_OK && j < n; j++) {
    const nf__slot *sl = &s->slots[op->slots[j]];
    if (j < op->n_in && !op->alias) {
      cb[j] = op->bufs[j];
      continue;
    }
    if (j >= op->n_in && op->alias) {
      for (uint32_t i = 0; i < op->n_in; i++)
        if (s->slots[op->slots[i]].ptr == sl->ptr) cb[j] = cb[i];
      if (cb[j]) continue;
    }
    scratch[j] = aligned_alloc(64, ((size_t)sl->bytes + 63) / 64 * 64 + 64);
    if (!scratch[j]) {
      rc = NF_ENOMEM;
      break;
    }
    if (j < op->n_in) memcpy(scratch[j], op->bufs[j], (size_t)sl->bytes);
    cb[j] = scratch[j];
  }
  /* the scratch outputs touched first: their page faults are not the
   * candidate's time */
  for (uint32_t j = op->n_in; rc == NF_OK && j < n; j++)
    if (scratch[j]) memset(scratch[j], 0, (size_t)s->slots[op->slots[j]].bytes);
  double c0 = nf_now_ms();
  if (rc == NF_OK) *crc = nf_kernel_run(kern, cb, n, s->pool, err);
  *ms = nf_now_ms() - c0;
  /* each output's buffer to the caller (a copy for a second output over
   * the same input) */
  for (uint32_t o = 0; rc == NF_OK && o < op->n_out; o++) {
    for (uint32_t j = 0; j < n && !got[o]; j++)
      if (scratch[j] && scratch[j] == cb[op->n_in + o]) {
        got[o] = scratch[j];
        scratch[j] = NULL;
      }
    size_t b = (size_t)s->slots[op->slots[op->n_in + o]].bytes;
    if (!got[o] && !(got[o] = malloc(b ? b : 1))) rc = NF_ENOMEM;
    else if (got[o] != cb[op->n_in + o]) memcpy(got[o], cb[op->n_in + o], b);
  }
  for (uint32_t j = 0; scratch && j < n; j++) free(scratch[j]);
  free(scratch);
  free(cb);
  return rc;
}

static int cpu_lib_tier0(const nf_session *s, const nf__kent *k) {
  (void)s;
  return k->gemm != NULL;
}

static const char *cpu_tier0_name(const nf_session *s, const nf__kent *k) {
  (void)s;
  return k->gemm ? "OpenBLAS" : "the interpreter";
}

const nf__device nf__cpu_device = {
    .name = "cpu",
    .accept = cpu_accept,
    .drop = cpu_drop,
    .target = cpu_target,
    .load = cpu_load,
    .unload = cpu_drop,
    .run = cpu_run,
    .tier0 = cpu_tier0,
    .canary = cpu_canary,
    .lib_tier0 = cpu_lib_tier0,
    .tier0_name = cpu_tier0_name,
    .host = 1,
    .race_host = 1,
};
