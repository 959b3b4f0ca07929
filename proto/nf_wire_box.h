/* nf_wire_box.h - the protected stream of a TCP connection (libsodium:
 * X25519 key exchange, ChaCha20-Poly1305; docs/security.md).
 *
 * The handshake (nf_wire_auth.h has the MACs, nf_wire_sign.h the daemon's
 * proof of identity):
 *
 *   daemon -> client  Challenge{sn, SE}      32 random bytes; an ephemeral X25519 key
 *   client -> daemon  Hello{..., cn, CE, mac} mac = HMAC(psk, client label || T) with a psk
 *   daemon -> client  Welcome{..., server_mac, signing_key, key_proof}
 *                       server_mac = HMAC(psk, server label || T)
 *                       key_proof  = Ed25519(daemon key, "neoflow-hello-v1\0" || T)
 *
 *   T = SHA-256("neoflow-tcp-v2\0" || sn || SE || cn || CE || client target fingerprint)
 *
 * Both sides then derive one key per direction from the X25519 exchange
 * (crypto_kx), bound to T and, with a psk, to the psk:
 *   k = BLAKE2b-256(key = psk or none, kx key || T)
 * and every later frame in either direction is ChaCha20-Poly1305 of the
 * packed message, the nonce being that direction's frame counter (from
 * 0).  A frame changed, dropped, replayed, reordered or cut fails its tag
 * and the connection is closed.  The 4-byte length prefix stays plain; it
 * counts the sealed bytes (the message plus NF_BOX_TAG).
 *
 * Forward secrecy: the ephemeral keys are wiped after the exchange, so a
 * psk or signing key stolen later does not open recorded traffic. */
#ifndef NF_WIRE_BOX_H
#define NF_WIRE_BOX_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"

#define NF_BOX_TAG 16

typedef struct nf_wire_box {
  int on;
  uint8_t tx[32], rx[32];
  uint64_t n_tx, n_rx;
} nf_wire_box;

/* A fresh ephemeral key pair. */
void nf_box_ephemeral(uint8_t pk[32], uint8_t sk[32]);
/* T above. */
void nf_box_transcript(const uint8_t sn[32], const uint8_t se[32], const uint8_t cn[32],
                       const uint8_t ce[32], const uint8_t target[32], uint8_t t[32]);
/* Derives the keys and turns the box on; sk is wiped.  psk may be NULL.
 * NF_OK, or NF_EINVAL for a peer key that makes no shared secret. */
int nf_box_client_keys(nf_wire_box *b, const uint8_t ce_pk[32], uint8_t ce_sk[32],
                       const uint8_t se_pk[32], const uint8_t *psk, const uint8_t t[32]);
int nf_box_server_keys(nf_wire_box *b, const uint8_t se_pk[32], uint8_t se_sk[32],
                       const uint8_t ce_pk[32], const uint8_t *psk, const uint8_t t[32]);
/* Seals the frame in *f (the 4-byte header and payload nf_wire_pack made)
 * in place: a new header and the sealed payload.  NF_OK, NF_ENOMEM. */
int nf_box_seal_frame(nf_wire_box *b, nf_buf *f);
/* Opens a received payload c (n bytes) into out (n - NF_BOX_TAG bytes,
 * *out_n).  NF_OK, or NF_EFORMAT when it fails its tag (or is too
 * short): the stream must be dropped. */
int nf_box_open(nf_wire_box *b, const uint8_t *c, size_t n, uint8_t *out, size_t *out_n);
/* Wipes the keys. */
void nf_box_clear(nf_wire_box *b);

#endif
