/* ktable.c - the kernel table's mailbox (nf_ktable.h): kernels offered
 * from any thread (the daemon link, the GPU generator, tests) are checked
 * (digest, key, then the device's own checks) and wait in their entry
 * until the program's thread takes them at a step boundary.  The
 * producers never touch an entry's kernels in use, and this file sees the
 * table alone, not the session. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ktable.h"

int nf__kt_offer(nf__ktable *kt, int k, const void *bin, size_t len, const uint8_t sha256[32],
                 const uint8_t key[32], int tier, double time_ms) {
  if (k < 0 || k >= kt->n_kents || !bin || !len) return NF_EINVAL;
  nf__kent *e = &kt->kents[k];
  char hex[65];
  nf_hash_hex(e->key, hex);
  hex[16] = 0;
  uint8_t got[32];
  crypto_hash_sha256(got, bin, len);
  const char *why = NULL;
  int rc = NF_OK;
  pthread_mutex_lock(&kt->mu);
  uint8_t dkey[32];
  memcpy(dkey, e->dkey, 32);
  int have_key = e->dstate >= DK_ACCEPTED;
  pthread_mutex_unlock(&kt->mu);
  if (memcmp(got, sha256, 32) != 0) {
    why = "its SHA-256 does not match the digest announced";
    rc = NF_EFORMAT;
  } else if (key && (!have_key || memcmp(key, dkey, 32) != 0)) {
    why = "it answers another key than the request's";
    rc = NF_EFORMAT;
  }
  void *obj = NULL;
  nf_buf err = NF_BUF_INIT;
  if (rc == NF_OK && (rc = kt->dev->accept(kt, k, bin, len, &obj, &err)) != NF_OK)
    why = nf_buf_str(&err);
  pthread_mutex_lock(&kt->mu);
  if (rc != NF_OK) {
    kt->link_rejected++;
  } else if (tier == 0 && e->in_obj && e->in_tier > 0) {
    kt->dev->drop(obj); /* generated here (gpu_local.c): the daemon's kernel came first */
  } else {
    kt->dev->drop(e->in_obj);
    e->in_obj = obj;
    e->in_tier = tier;
    e->in_ms = time_ms;
    memcpy(e->in_sha, got, 32);
    pthread_cond_broadcast(&kt->cv);
  }
  pthread_mutex_unlock(&kt->mu);
  if (rc != NF_OK) nf__slog_warn(kt->log, "kernel %s (tier %d) rejected: %s", hex, tier, why);
  nf_buf_free(&err);
  return rc;
}

const char *nf__kent_runs_on(const nf__ktable *kt, const struct nf_session *s, const nf__kent *k) {
  if (k->cand) return "canary";
  if (k->cur && !k->prefer_t0)
    return k->cur_tier == 2 ? "tier 2" : k->cur_tier == 1 ? "tier 1" : "generated";
  return kt->dev->tier0_name(s, k);
}

void *nf__kt_take_locked(nf__ktable *kt, nf__kent *k) {
  (void)kt;
  void *obj = k->in_obj;
  if (!obj) return NULL;
  k->cand_tier = k->in_tier;
  memcpy(k->cand_sha, k->in_sha, 32);
  k->cand_ms = k->in_ms;
  k->in_obj = NULL;
  return obj;
}
