/* nf_wire_sign.h - a daemon's signing key and the signatures on kernels
 * (libsodium's Ed25519; no hand-written crypto; docs/security.md).
 *
 * Each neoflowd holds an Ed25519 key pair (its identity).  It signs every
 * kernel it produces, stores the signature with the kernel in its cache,
 * checks it again before serving the kernel from the cache, and sends it
 * with the kernel; a client verifies it against the daemon's public key
 * (which it trusts: nf_trust.h) before it loads a byte.  The signed
 * message binds the kernel to what it is for:
 *
 *   "neoflow-kernel-v1\0" || cache key (32) || SHA-256 of the binary (32)
 *     || target fingerprint (32) || kernel ABI (4, little-endian)
 *
 * so a signed kernel cannot be replayed for another subgraph, another
 * machine or another ABI.
 *
 * Public keys are written "ed25519:" and 64 lowercase hex digits; the
 * secret key file holds the 32-byte seed as 64 hex digits and a newline,
 * mode 0600, owned by the daemon's user. */
#ifndef NF_WIRE_SIGN_H
#define NF_WIRE_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"

#define NF_SIGN_PK 32
#define NF_SIGN_SK 64
#define NF_SIGN_SIG 64
#define NF_SIGN_PK_TEXT 73 /* "ed25519:" + 64 hex + NUL */

/* 1 when text (blanks around it allowed) is "ed25519:" and 64 hex digits;
 * pk then holds the key. */
int nf_sign_parse_public(const char *text, uint8_t pk[NF_SIGN_PK]);
/* "ed25519:<hex>" into out. */
void nf_sign_format_public(const uint8_t pk[NF_SIGN_PK], char out[NF_SIGN_PK_TEXT]);

/* Loads the key pair whose seed is in path, or, when path does not exist
 * and create is set, makes a fresh one there (O_CREAT | O_EXCL |
 * O_NOFOLLOW, mode 0600, fsynced; *created set).  The file must be a
 * regular file owned by us with no group or other bits.  NF_OK; NF_ENOENT
 * (missing, create not set); NF_EINVAL (unsafe or malformed, with the
 * reason); NF_EIO.  The seed is wiped from our buffers; sk holds it. */
int nf_sign_load_key(const char *path, int create, uint8_t sk[NF_SIGN_SK],
                     uint8_t pk[NF_SIGN_PK], int *created, nf_buf *err);

/* sig = Ed25519(sk, the kernel message above). */
void nf_sign_kernel(const uint8_t sk[NF_SIGN_SK], const uint8_t key[32], const uint8_t sha[32],
                    const uint8_t target[32], uint32_t abi, uint8_t sig[NF_SIGN_SIG]);
/* 1 when sig is pk's signature of the kernel message. */
int nf_sign_kernel_ok(const uint8_t pk[NF_SIGN_PK], const uint8_t sig[NF_SIGN_SIG],
                      const uint8_t key[32], const uint8_t sha[32], const uint8_t target[32],
                      uint32_t abi);

/* The TCP handshake's proof of the daemon's identity: sig =
 * Ed25519(sk, "neoflow-hello-v1\0" || transcript), transcript being the
 * hash both sides computed over the handshake's nonces and ephemeral keys
 * (nf_wire_auth.h). */
void nf_sign_transcript(const uint8_t sk[NF_SIGN_SK], const uint8_t transcript[32],
                        uint8_t sig[NF_SIGN_SIG]);
int nf_sign_transcript_ok(const uint8_t pk[NF_SIGN_PK], const uint8_t sig[NF_SIGN_SIG],
                          const uint8_t transcript[32]);

#endif
