/* nf_dconn.h - a blocking connection to neoflowd for the neoflow tool and
 * the tests: connect (Unix socket or TCP), handshake (version, target,
 * the key's challenge-response on TCP), send requests, receive messages,
 * and reassemble kernels from their chunks with the digest checked.
 *
 * On a Unix socket the daemon's uid (SO_PEERCRED) must be ours, root's,
 * or the owner of the socket's directory; anything else is refused.
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

typedef struct nf_dconn nf_dconn;

typedef struct nf_dconn_opts {
  const char *address;     /* see above */
  const char *key_file;    /* TCP: the shared key (nf_auth_load_key) */
  const char *client_name; /* shown by `neoflow status` */
  int timeout_ms;          /* connect and handshake; 0: 5000 */
  int protocol_min, protocol_max; /* 0: this build's range (tests vary it) */
  int cuda_sm;             /* > 0: kernels for this GPU architecture (a CUDA
                              target), not for this machine's CPU */
  const char *cuda_name;   /* the GPU's name as the driver reports it */
} nf_dconn_opts;

/* Connects and completes the handshake.  NF_OK with *out; NF_EIO (cannot
 * connect: the message names the address and errno); NF_EUNSUPPORTED
 * (version); NF_EINVAL (refused: authentication, busy...; the daemon's
 * message is in err). */
int nf_dconn_open(const nf_dconn_opts *o, nf_dconn **out, nf_buf *err);
void nf_dconn_close(nf_dconn *c);
/* The Welcome's fields. */
uint64_t nf_dconn_session(const nf_dconn *c);
/* the daemon compiles for the target asked for (this machine's CPU, or
 * opts.cuda_sm) */
int nf_dconn_same_target(const nf_dconn *c);
const char *nf_dconn_daemon_target(const nf_dconn *c);
int nf_dconn_fd(const nf_dconn *c);

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
 * its digest verified; k->final tells whether more may follow), or
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
