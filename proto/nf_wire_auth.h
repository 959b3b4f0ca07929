/* nf_wire_auth.h - the TCP handshake's shared-key challenge-response
 * (libsodium's HMAC-SHA256; no hand-written crypto).  The whole handshake,
 * with its ephemeral keys, is in nf_wire_box.h; T is its transcript hash
 * (nf_box_transcript: the nonces sn and cn, the ephemeral keys and the
 * client's target).
 *
 *   client -> daemon   Hello{..., mac: HMAC(key, "neoflow-auth-v2 client " || T)}
 *   daemon -> client   Welcome{..., server_mac: HMAC(key, "neoflow-auth-v2 server " || T)}
 *
 * The labels are the 23 bytes shown, ending with one space and without a
 * NUL (NF_AUTH_CLIENT_LABEL, NF_AUTH_SERVER_LABEL).  The MAC input is thus
 * 23 + 32 bytes, and the key is the raw 32-byte key.
 *
 * A fresh server nonce and ephemeral key per connection make a replayed
 * Hello fail; the server's MAC lets the client check the daemon knows the
 * key too; the distinct labels keep a client MAC from being reflected as a
 * server MAC.  MACs are compared in constant time. */
#ifndef NF_WIRE_AUTH_H
#define NF_WIRE_AUTH_H

#include <stdint.h>

#include "nf_buf.h"

#define NF_AUTH_KEY 32
#define NF_AUTH_NONCE 32
#define NF_AUTH_MAC 32
#define NF_AUTH_CLIENT_LABEL "neoflow-auth-v2 client "
#define NF_AUTH_SERVER_LABEL "neoflow-auth-v2 server "

/* Loads a key file: 64 hex digits (whitespace around them ignored; at
 * most 4 KiB in all).  The file must be a regular file (not a symlink,
 * opened with O_NOFOLLOW) owned by the caller's effective uid with no
 * group or other permission bits.  NF_OK, NF_ENOENT, NF_EINVAL (the
 * reason: symlink, mode, owner, format), NF_EIO.  The key bytes are never
 * put in err. */
int nf_auth_load_key(const char *path, uint8_t key[NF_AUTH_KEY], nf_buf *err);
/* Writes a fresh random key to path: 64 lowercase hex digits and a
 * newline, mode 0600, created with O_CREAT | O_EXCL | O_NOFOLLOW (never
 * overwrites, never follows a link) and fsynced.  NF_OK, NF_EINVAL (the
 * path exists), NF_EIO (nothing is left behind). */
int nf_auth_new_key(const char *path, nf_buf *err);
/* 32 bytes from libsodium's CSPRNG. */
void nf_auth_nonce(uint8_t nonce[NF_AUTH_NONCE]);
/* mac = HMAC-SHA256(key, NF_AUTH_CLIENT_LABEL || t). */
void nf_auth_client_mac(const uint8_t key[NF_AUTH_KEY], const uint8_t t[32],
                        uint8_t mac[NF_AUTH_MAC]);
/* mac = HMAC-SHA256(key, NF_AUTH_SERVER_LABEL || t). */
void nf_auth_server_mac(const uint8_t key[NF_AUTH_KEY], const uint8_t t[32],
                        uint8_t mac[NF_AUTH_MAC]);
/* 1 when equal (constant time), 0 otherwise. */
int nf_auth_mac_equal(const uint8_t a[NF_AUTH_MAC], const uint8_t b[NF_AUTH_MAC]);

#endif
