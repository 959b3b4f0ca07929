/* box.c - the protected stream of a TCP connection (nf_wire_box.h).  All
 * cryptography is libsodium's: crypto_kx (X25519 + BLAKE2b),
 * crypto_generichash (BLAKE2b), crypto_aead_chacha20poly1305_ietf and
 * crypto_hash_sha256.
 *
 * Invariants: a direction's counter never repeats under one key (a
 * connection has its own keys; the counter only grows, and a stream that
 * reached 2^64 frames would be refused long before); ephemeral secrets
 * and derived keys are wiped when done. */
#include "nf_wire_box.h"

#include <sodium.h>
#include <string.h>

#define T_LABEL "neoflow-tcp-v2"

void nf_box_ephemeral(uint8_t pk[32], uint8_t sk[32]) {
  if (sodium_init() < 0) NF_ASSERT(!"libsodium cannot start");
  crypto_kx_keypair(pk, sk);
}

void nf_box_transcript(const uint8_t sn[32], const uint8_t se[32], const uint8_t cn[32],
                       const uint8_t ce[32], const uint8_t target[32], uint8_t t[32]) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  crypto_hash_sha256_update(&st, (const uint8_t *)T_LABEL, sizeof T_LABEL);
  crypto_hash_sha256_update(&st, sn, 32);
  crypto_hash_sha256_update(&st, se, 32);
  crypto_hash_sha256_update(&st, cn, 32);
  crypto_hash_sha256_update(&st, ce, 32);
  crypto_hash_sha256_update(&st, target, 32);
  crypto_hash_sha256_final(&st, t);
}

/* k = BLAKE2b-256(key = psk or none, kx || t) */
static void bind_key(uint8_t k[32], const uint8_t kx[32], const uint8_t *psk, const uint8_t t[32]) {
  uint8_t m[64];
  memcpy(m, kx, 32);
  memcpy(m + 32, t, 32);
  crypto_generichash(k, 32, m, sizeof m, psk, psk ? 32 : 0);
  sodium_memzero(m, sizeof m);
}

static int finish(nf_wire_box *b, int ok, uint8_t rx[32], uint8_t tx[32], uint8_t *sk,
                  const uint8_t *psk, const uint8_t t[32]) {
  sodium_memzero(sk, 32);
  if (ok) {
    bind_key(b->rx, rx, psk, t);
    bind_key(b->tx, tx, psk, t);
    b->n_rx = b->n_tx = 0;
    b->on = 1;
  }
  sodium_memzero(rx, 32);
  sodium_memzero(tx, 32);
  return ok ? NF_OK : NF_EINVAL;
}

int nf_box_client_keys(nf_wire_box *b, const uint8_t ce_pk[32], uint8_t ce_sk[32],
                       const uint8_t se_pk[32], const uint8_t *psk, const uint8_t t[32]) {
  uint8_t rx[32], tx[32];
  int ok = crypto_kx_client_session_keys(rx, tx, ce_pk, ce_sk, se_pk) == 0;
  return finish(b, ok, rx, tx, ce_sk, psk, t);
}

int nf_box_server_keys(nf_wire_box *b, const uint8_t se_pk[32], uint8_t se_sk[32],
                       const uint8_t ce_pk[32], const uint8_t *psk, const uint8_t t[32]) {
  uint8_t rx[32], tx[32];
  int ok = crypto_kx_server_session_keys(rx, tx, se_pk, se_sk, ce_pk) == 0;
  return finish(b, ok, rx, tx, se_sk, psk, t);
}

static void nonce_of(uint64_t n, uint8_t npub[12]) {
  memset(npub, 0, 12);
  for (int i = 0; i < 8; i++) npub[4 + i] = (uint8_t)(n >> (8 * i));
}

int nf_box_seal_frame(nf_wire_box *b, nf_buf *f) {
  NF_ASSERT(b->on && f->len >= 4);
  size_t m_len = f->len - 4;
  size_t c_len = m_len + NF_BOX_TAG;
  if (c_len > UINT32_MAX) return NF_ELIMIT;
  uint8_t *c = malloc(c_len + 4);
  if (!c) return NF_ENOMEM;
  uint8_t npub[12];
  nonce_of(b->n_tx++, npub);
  unsigned long long got = 0;
  crypto_aead_chacha20poly1305_ietf_encrypt(c + 4, &got, (const uint8_t *)f->data + 4, m_len,
                                            NULL, 0, NULL, npub, b->tx);
  NF_ASSERT(got == c_len);
  c[0] = (uint8_t)(c_len >> 24);
  c[1] = (uint8_t)(c_len >> 16);
  c[2] = (uint8_t)(c_len >> 8);
  c[3] = (uint8_t)c_len;
  nf_buf_reset(f);
  nf_buf_add(f, c, c_len + 4);
  free(c);
  return f->oom ? NF_ENOMEM : NF_OK;
}

int nf_box_open(nf_wire_box *b, const uint8_t *c, size_t n, uint8_t *out, size_t *out_n) {
  *out_n = 0;
  if (!b->on || n < NF_BOX_TAG) return NF_EFORMAT;
  uint8_t npub[12];
  nonce_of(b->n_rx, npub);
  unsigned long long got = 0;
  if (crypto_aead_chacha20poly1305_ietf_decrypt(out, &got, NULL, c, n, NULL, 0, npub, b->rx) != 0)
    return NF_EFORMAT;
  b->n_rx++;
  *out_n = (size_t)got;
  return NF_OK;
}

void nf_box_clear(nf_wire_box *b) { sodium_memzero(b, sizeof *b); }
