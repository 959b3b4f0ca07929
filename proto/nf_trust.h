/* nf_trust.h - whom a client lets serve it code (docs/security.md).
 *
 * A client runs kernels only from a daemon it trusts:
 *  - on a Unix socket, a daemon whose uid (SO_PEERCRED) is the client's
 *    own effective uid, or one the user's configuration names
 *    (trust_uid); nobody else, root and the socket directory's owner
 *    included;
 *  - on TCP, a daemon that proves it holds a signing key the
 *    configuration names (trust_key); the shared key (key_file) then
 *    authenticates the client to the daemon.
 * Every kernel is also signed by the daemon (Ed25519, proto/nf_wire_sign.h)
 * and verified against the key the daemon presented at the handshake,
 * which must be a trusted key on TCP.  On a Unix socket the peer's uid is
 * the identity: a daemon of a trusted uid may present any key (anything
 * running as that uid is trusted by that choice).
 *
 * The configuration is the user's file $NEOFLOW_CONFIG, else
 * $XDG_CONFIG_HOME/neoflow/client.conf, else ~/.config/neoflow/client.conf
 * (INI, libinih):
 *
 *   [daemon]
 *   socket = /run/neoflowd/neoflowd.sock    ; or tcp:HOST:PORT
 *   key_file = /home/me/.config/neoflow/team.key
 *   trust_uid = neoflowd                    ; a user name or number; repeatable
 *   trust_key = ed25519:<64 hex digits>     ; a daemon's public key; repeatable
 *
 * A file that is not ours, is a symlink, or that group or other may write
 * is refused (it could make us trust a stranger).  A missing file is an
 * empty configuration.  Explicit settings (session options, command-line
 * flags) are added on top of it.
 *
 * Not thread-safe; the structure is plain data, copied freely. */
#ifndef NF_TRUST_H
#define NF_TRUST_H

#include <stdint.h>
#include <sys/types.h>

#include "nf_buf.h"

#define NF_TRUST_MAX 16

typedef struct nf_trust {
  uid_t uids[NF_TRUST_MAX]; /* besides our own */
  int n_uids;
  uint8_t keys[NF_TRUST_MAX][32]; /* Ed25519 public keys */
  int n_keys;
  char socket[4096];   /* from the file; "" none */
  char key_file[4096]; /* from the file; "" none */
  char path[4096];     /* the file read ("" when none was found) */
} nf_trust;

/* Reads the user's configuration into *t (zeroed first).  NF_OK (also
 * when there is no file); NF_EINVAL when the file is unsafe or malformed,
 * with err naming the file, the line and the fault. */
int nf_trust_load(nf_trust *t, nf_buf *err);
/* Reads one configuration file (the same rules); for tests and
 * nf_trust_load. */
int nf_trust_load_file(nf_trust *t, const char *path, nf_buf *err);
/* Adds a trusted uid: a number or a user name.  NF_EINVAL (unknown user,
 * malformed, too many). */
int nf_trust_add_uid(nf_trust *t, const char *spec, nf_buf *err);
/* Adds a trusted key: "ed25519:" and 64 hex digits, or the path of a file
 * holding that text (neoflowd --public-key writes it).  NF_EINVAL. */
int nf_trust_add_key(nf_trust *t, const char *spec, nf_buf *err);
/* 1 when uid is ours or trusted. */
int nf_trust_uid_ok(const nf_trust *t, uid_t uid);
/* 1 when pk is among the trusted keys. */
int nf_trust_key_ok(const nf_trust *t, const uint8_t pk[32]);

/* Checks the directory holding a Unix socket before we connect or start
 * a daemon there: it must be a real directory (not a symlink), owned by
 * us or a trusted uid, that neither group nor other may write.  When it
 * does not exist and create is set (our per-user default), it is made
 * 0700 (its parent must exist).  NF_OK; NF_ENOENT (missing, create not
 * set); NF_EINVAL with a message naming the directory, its owner or mode
 * and what to do. */
int nf_trust_check_socket_dir(const nf_trust *t, const char *socket_path, int create,
                              nf_buf *err);
/* "uid N (name)" for messages. */
void nf_trust_uid_name(uid_t uid, char *out, size_t n);

#endif
