/* nf_dconn.h - a blocking connection to neoflowd for the neoflow tool and
 * the tests: connect (Unix socket or TCP), handshake (version, target,
 * the key's challenge-response on TCP), send requests, receive messages,
 * and reassemble kernels from their chunks with the digest checked.
 *
 * Whom it trusts (nf_trust.h, docs/security.md): on a Unix socket a
 * daemon whose uid (SO_PEERCRED) is ours or one the configuration names,
 * in a directory that no stranger owns or may write; on TCP a daemon that
 * presents a signing key the configuration names.  Every kernel must
 * carry the daemon's signature, checked before it is handed out.
 *
 * Addresses: a path ("/run/neoflowd/neoflowd.sock", "unix:PATH") or
 * "tcp:HOST:PORT".  NULL or "" means the default socket ($NEOFLOW_SOCKET,
 * else the daemon's default, docs/daemon.md).
 *
 * Not thread-safe; one connection per thread. */
#ifndef NF_DCONN_H
#define NF_DCONN_H

#include <stddef.h>
#include <stdint.h>

#include "neoflow.pb-c.h"
#include "nf_buf.h"
#include "nf_trust.h"

typedef struct nf_dconn nf_dconn;

typedef struct nf_dconn_opts {
  const char *address;     /* see above; NULL: $NEOFLOW_SOCKET, the
                              configuration's socket, the default */
  const char *key_file;    /* TCP: the shared key (nf_auth_load_key); NULL:
                              the configuration's key_file */
  const nf_trust *trust;   /* NULL: the user's configuration (nf_trust_load) */
  const char *client_name; /* shown by `neoflow status` */
  int timeout_ms;          /* connect and handshake; 0: 5000 */
  int protocol_min, protocol_max; /* 0: this build's range (tests vary it) */
  int cuda_sm;             /* > 0: kernels for this GPU architecture (a CUDA
                              target), not for this machine's CPU */
  const char *cuda_name;   /* the GPU's name as the driver reports it */
  int cancel_fd;           /* > 0: a descriptor that becomes readable when
                              the caller gives up; waits for the daemon end
                              at once then (NF_EIO, "cancelled") */
} nf_dconn_opts;

/* Where a client connects (out, n bytes): the explicit address, else
 * $NEOFLOW_SOCKET, else the configuration's socket (t may be NULL), else
 * the per-user default; *origin says which (a daemon is started only for
 * an address that is not the configuration's shared one).  NF_OK or
 * NF_ELIMIT (too long). */
enum { NF_DCONN_ADDR_EXPLICIT, NF_DCONN_ADDR_ENV, NF_DCONN_ADDR_CONFIG, NF_DCONN_ADDR_PER_USER };
int nf_dconn_address(const char *explicit_addr, const nf_trust *t, char *out, size_t n,
                     int *origin);

/* Connects and completes the handshake.  NF_OK with *out; NF_EIO (cannot
 * connect: the message names the address and errno; nothing answers, so
 * a per-user daemon may be started); NF_EPERM (whoever answers, or the
 * socket's directory, is not trusted: never start a daemon then);
 * NF_EUNSUPPORTED (version); NF_EINVAL (refused: authentication,
 * busy...; the daemon's message is in err, or a bad configuration). */
int nf_dconn_open(const nf_dconn_opts *o, nf_dconn **out, nf_buf *err);
void nf_dconn_close(nf_dconn *c);
/* The Welcome's fields. */
uint64_t nf_dconn_session(const nf_dconn *c);
/* the daemon compiles for the target asked for (this machine's CPU, or
 * opts.cuda_sm) */
int nf_dconn_same_target(const nf_dconn *c);
const char *nf_dconn_daemon_target(const nf_dconn *c);
int nf_dconn_fd(const nf_dconn *c);
/* 1 once an Accepted said CACHE_BUSY (the daemon's cache was locked by
 * another process: results may not be kept). */
int nf_dconn_cache_busy(const nf_dconn *c);
/* The daemon's signing key (32 bytes, valid while c is open). */
const uint8_t *nf_dconn_daemon_key(const nf_dconn *c);
/* 1 when sig (sig_len bytes) is the daemon's signature of a kernel with
 * this key, digest and ABI for the target of our Hello (nf_wire_sign.h). */
int nf_dconn_kernel_signed(const nf_dconn *c, const uint8_t key[32], const uint8_t sha[32],
                           uint32_t abi, const uint8_t *sig, size_t sig_len);

int nf_dconn_send(nf_dconn *c, const Neoflow__ClientMessage *m, nf_buf *err);
/* The next message (free with nf_wire_free_server).  NF_OK; NF_ENOENT at
 * EOF; NF_EIO (timeout_ms <= 0: wait forever); NF_EFORMAT (truncated or
 * invalid). */
int nf_dconn_recv(nf_dconn *c, int timeout_ms, Neoflow__ServerMessage **m, nf_buf *err);

/* A kernel as received. */
typedef struct nf_dkernel {
  uint64_t request_id;
  int tier;
  int final;
  double time_ms, default_ms;
  char *schedule;
  uint8_t key[32];
  uint8_t *binary;
  size_t len;
} nf_dkernel;
void nf_dkernel_free(nf_dkernel *k);

/* Events of one request, read until its answer.  Calls on_progress (may
 * be NULL) for Progress messages.  Returns NF_OK with *k set (a kernel,
 * its signature and digest verified; k->final tells whether more may
 * follow), NF_EREJECTED (a kernel that failed them: unsigned, signed by
 * another key or for something else, a wrong digest), or
 * NF_EINVAL with the daemon's Error (code in *code, message in err), or
 * the errors of nf_dconn_recv.  Messages for other requests are skipped. */
int nf_dconn_next_kernel(nf_dconn *c, uint64_t request_id, int timeout_ms,
                         void (*on_progress)(void *user, const Neoflow__Progress *p), void *user,
                         nf_dkernel *k, int *code, nf_buf *err);

/* The wire form of this machine's target (CPU fingerprint). */
void nf_dconn_host_target(Neoflow__Target *t, uint8_t fp[32], char desc[256]);
/* The wire form of a GPU target (nf_cuda_target_make); name NULL is "". */
void nf_dconn_cuda_target(Neoflow__Target *t, int sm, const char *name, uint8_t fp[32],
                          char desc[256]);

#endif
