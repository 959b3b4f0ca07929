/* sign.c - a daemon's Ed25519 key and the signatures on kernels and
 * handshakes (nf_wire_sign.h).  All cryptography is libsodium's
 * (crypto_sign_*); the seed file reuses the key-file rules of auth.c
 * (regular file, ours, mode 0600, 64 hex digits, created O_EXCL).
 *
 * Invariants: the seed is wiped from stack buffers before returning;
 * every signed message starts with its own NUL-terminated label, so a
 * signature made for one purpose never verifies for another. */
#include "nf_wire_sign.h"

#include <sodium.h>
#include <string.h>

#include "nf_wire_auth.h"

#define KERNEL_LABEL "neoflow-kernel-v1" /* sizeof includes the NUL */
#define HELLO_LABEL "neoflow-hello-v1"

_Static_assert(crypto_sign_PUBLICKEYBYTES == NF_SIGN_PK, "public key size");
_Static_assert(crypto_sign_SECRETKEYBYTES == NF_SIGN_SK, "secret key size");
_Static_assert(crypto_sign_BYTES == NF_SIGN_SIG, "signature size");
_Static_assert(crypto_sign_SEEDBYTES == NF_AUTH_KEY, "seed size");

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int nf_sign_parse_public(const char *text, uint8_t pk[NF_SIGN_PK]) {
  if (!text) return 0;
  while (blank(*text)) text++;
  if (strncmp(text, "ed25519:", 8) != 0) return 0;
  text += 8;
  for (int i = 0; i < NF_SIGN_PK; i++) {
    int hi = hexval(text[2 * i]), lo = hi < 0 ? -1 : hexval(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return 0;
    pk[i] = (uint8_t)(hi << 4 | lo);
  }
  for (text += 2 * NF_SIGN_PK; *text; text++)
    if (!blank(*text)) return 0;
  return 1;
}

void nf_sign_format_public(const uint8_t pk[NF_SIGN_PK], char out[NF_SIGN_PK_TEXT]) {
  static const char hx[] = "0123456789abcdef";
  memcpy(out, "ed25519:", 8);
  for (int i = 0; i < NF_SIGN_PK; i++) {
    out[8 + 2 * i] = hx[pk[i] >> 4];
    out[8 + 2 * i + 1] = hx[pk[i] & 15];
  }
  out[NF_SIGN_PK_TEXT - 1] = 0;
}

int nf_sign_load_key(const char *path, int create, uint8_t sk[NF_SIGN_SK],
                     uint8_t pk[NF_SIGN_PK], int *created, nf_buf *err) {
  uint8_t seed[NF_AUTH_KEY];
  if (created) *created = 0;
  if (sodium_init() < 0) {
    nf_buf_puts(err, "libsodium cannot start");
    return NF_EINTERNAL;
  }
  int rc = nf_auth_load_key(path, seed, err);
  if (rc == NF_ENOENT && create) {
    nf_buf_reset(err);
    rc = nf_auth_new_key(path, err);
    if (rc == NF_OK) {
      if (created) *created = 1;
      rc = nf_auth_load_key(path, seed, err);
    }
  }
  if (rc == NF_OK) crypto_sign_seed_keypair(pk, sk, seed);
  sodium_memzero(seed, sizeof seed);
  return rc;
}

#define KMSG_LEN (sizeof KERNEL_LABEL + 32 + 32 + 32 + 4)

static void kernel_msg(uint8_t m[KMSG_LEN], const uint8_t key[32], const uint8_t sha[32],
                       const uint8_t target[32], uint32_t abi) {
  size_t o = 0;
  memcpy(m, KERNEL_LABEL, sizeof KERNEL_LABEL);
  o += sizeof KERNEL_LABEL;
  memcpy(m + o, key, 32);
  memcpy(m + o + 32, sha, 32);
  memcpy(m + o + 64, target, 32);
  o += 96;
  for (int i = 0; i < 4; i++) m[o + (size_t)i] = (uint8_t)(abi >> (8 * i));
}

void nf_sign_kernel(const uint8_t sk[NF_SIGN_SK], const uint8_t key[32], const uint8_t sha[32],
                    const uint8_t target[32], uint32_t abi, uint8_t sig[NF_SIGN_SIG]) {
  uint8_t m[KMSG_LEN];
  kernel_msg(m, key, sha, target, abi);
  crypto_sign_detached(sig, NULL, m, sizeof m, sk);
}

int nf_sign_kernel_ok(const uint8_t pk[NF_SIGN_PK], const uint8_t sig[NF_SIGN_SIG],
                      const uint8_t key[32], const uint8_t sha[32], const uint8_t target[32],
                      uint32_t abi) {
  uint8_t m[KMSG_LEN];
  kernel_msg(m, key, sha, target, abi);
  if (sodium_init() < 0) return 0;
  return crypto_sign_verify_detached(sig, m, sizeof m, pk) == 0;
}

void nf_sign_transcript(const uint8_t sk[NF_SIGN_SK], const uint8_t transcript[32],
                        uint8_t sig[NF_SIGN_SIG]) {
  uint8_t m[sizeof HELLO_LABEL + 32];
  memcpy(m, HELLO_LABEL, sizeof HELLO_LABEL);
  memcpy(m + sizeof HELLO_LABEL, transcript, 32);
  crypto_sign_detached(sig, NULL, m, sizeof m, sk);
}

int nf_sign_transcript_ok(const uint8_t pk[NF_SIGN_PK], const uint8_t sig[NF_SIGN_SIG],
                          const uint8_t transcript[32]) {
  uint8_t m[sizeof HELLO_LABEL + 32];
  memcpy(m, HELLO_LABEL, sizeof HELLO_LABEL);
  memcpy(m + sizeof HELLO_LABEL, transcript, 32);
  if (sodium_init() < 0) return 0;
  return crypto_sign_verify_detached(sig, m, sizeof m, pk) == 0;
}
