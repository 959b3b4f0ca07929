/* dconn.c - a blocking connection to neoflowd (nf_dconn.h).
 *
 * Everything received is decoded and validated by proto/ before use; a
 * kernel is accepted only when its chunks arrive in order, add up to the
 * announced size and hash to the announced SHA-256, and the key it
 * answers is the one the daemon accepted the request under. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "nf_dconn.h"
#include "nf_env.h"
#include "nf_kernel.h"
#include "nf_target.h"
#include "nf_trust.h"
#include "nf_wire.h"
#include "nf_wire_auth.h"
#include "nf_wire_box.h"
#include "nf_wire_sign.h"

struct nf_dconn {
  int fd;
  int tcp;
  uint64_t session;
  int same_target;
  char daemon_target[NF_WIRE_TEXT_MAX + 1];
  nf_buf rx;
  uint8_t target_fp[32];  /* the target of our Hello: kernels are signed for it */
  uint8_t daemon_pk[32];  /* the daemon's signing key, trusted (handshake) */
  nf_wire_box box;        /* TCP: every frame after the handshake (nf_wire_box.h) */
  nf_buf tx;              /* a frame being sealed */
  int cache_busy;         /* an Accepted said CACHE_BUSY */
  int cancel_fd;          /* opts.cancel_fd, or -1 */
  int cancelled;
  /* accepted keys by request (the last few) */
  uint64_t acc_id[64];
  uint8_t acc_key[64][32];
  int n_acc;
};

void nf_dconn_host_target(Neoflow__Target *t, uint8_t fp[32], char desc[256]) {
  nf_host_target h;
  nf_host_target_get(&h);
  memcpy(fp, h.fingerprint, 32);
  snprintf(desc, 256, "%s", h.description);
  neoflow__target__init(t);
  t->kind = NEOFLOW__TARGET_KIND__TARGET_CPU;
  t->fingerprint.data = fp;
  t->fingerprint.len = 32;
  t->description = desc;
}

void nf_dconn_cuda_target(Neoflow__Target *t, int sm, const char *name, uint8_t fp[32],
                          char desc[256]) {
  nf_host_target h;
  nf_cuda_target_make(sm, name, &h);
  memcpy(fp, h.fingerprint, 32);
  snprintf(desc, 256, "%s", name ? name : "");
  neoflow__target__init(t);
  t->kind = NEOFLOW__TARGET_KIND__TARGET_CUDA;
  t->fingerprint.data = fp;
  t->fingerprint.len = 32;
  t->description = desc;
  t->cuda_sm = sm > 0 ? (uint32_t)sm : 0;
}

static int wait_fd(int fd, short ev, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = ev};
  int r;
  do r = poll(&p, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  return r;
}

/* Connects to the Unix socket at path and checks who answers: the
 * daemon's uid (SO_PEERCRED) must be ours or one the user trusts
 * (nf_trust.h).  NF_EIO when nothing answers (the caller may start a
 * daemon), NF_EPERM when someone untrusted does. */
static int connect_unix(const char *path, const nf_trust *t, int *fd, nf_buf *err) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a.sun_path) {
    nf_buf_printf(err, "socket path too long: %s", path);
    return NF_EINVAL;
  }
  memcpy(a.sun_path, path, strlen(path) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
    int e = errno;
    nf_buf_printf(err, "cannot connect to %s: %s", path, strerror(e));
    /* "127.0.0.1:17117" is a TCP address written without its prefix */
    if (e == ENOENT && !strchr(path, '/') && strchr(path, ':'))
      nf_buf_printf(err, " (for a daemon on TCP write tcp:%s)", path);
    if (s >= 0) close(s);
    return NF_EIO;
  }
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
    nf_buf_printf(err, "%s: cannot tell who answers (SO_PEERCRED: %s): refusing it", path,
                  strerror(errno));
    close(s);
    return NF_EPERM;
  }
  if (!nf_trust_uid_ok(t, cr.uid)) {
    char who[160], me[160];
    nf_trust_uid_name(cr.uid, who, sizeof who);
    nf_trust_uid_name(geteuid(), me, sizeof me);
    nf_buf_printf(err, "refusing the daemon at %s: it runs as %s, not as you (%s) or a user you "
                  "trust, so its kernels could be anyone's code (a shared daemon needs "
                  "'trust_uid = ...' in your client configuration; docs/security.md)",
                  path, who, me);
    close(s);
    return NF_EPERM;
  }
  *fd = s;
  return NF_OK;
}

static int connect_tcp(const char *spec, int timeout_ms, int *fd, nf_buf *err) {
  char host[256];
  const char *colon = strrchr(spec, ':');
  if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host) {
    nf_buf_printf(err, "expected tcp:HOST:PORT, got 'tcp:%s'", spec);
    return NF_EINVAL;
  }
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = 0;
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int g = getaddrinfo(host, colon + 1, &hints, &res);
  if (g != 0) {
    nf_buf_printf(err, "tcp:%s: %s", spec, gai_strerror(g));
    return NF_EIO;
  }
  int s = -1, e = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) continue;
    int r = connect(s, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS && wait_fd(s, POLLOUT, timeout_ms) > 0) {
      socklen_t len = sizeof e;
      getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len);
      r = e ? -1 : 0;
      errno = e;
    }
    if (r == 0) break;
    e = errno;
    close(s);
    s = -1;
  }
  freeaddrinfo(res);
  if (s < 0) {
    nf_buf_printf(err, "cannot connect to tcp:%s: %s", spec, strerror(e ? e : ETIMEDOUT));
    return NF_EIO;
  }
  int fl = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &fl, sizeof fl);
  /* back to blocking: the wire helpers poll with timeouts */
  int flags = fcntl(s, F_GETFL);
  if (flags >= 0) fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
  *fd = s;
  return NF_OK;
}

int nf_dconn_send(nf_dconn *c, const Neoflow__ClientMessage *m, nf_buf *err) {
  int rc;
  if (c->box.on) {
    nf_buf_reset(&c->tx);
    rc = nf_wire_pack(&m->base, NF_WIRE_FRAME_MAX - NF_BOX_TAG, &c->tx);
    if (rc == NF_OK) rc = nf_box_seal_frame(&c->box, &c->tx);
    if (rc == NF_OK) rc = nf_wire_write_bytes(c->fd, (const uint8_t *)c->tx.data, c->tx.len, 30000);
  } else {
    rc = nf_wire_write_frame(c->fd, &m->base, NF_WIRE_FRAME_MAX, 30000);
  }
  if (rc != NF_OK)
    nf_buf_printf(err, "sending to the daemon: %s", rc == NF_EIO ? strerror(errno) : nf_strerror(rc));
  return rc;
}

/* After a failed send: the daemon may have said why it closed (an Error
 * before the close: a refused uid, a full house); that beats "Broken
 * pipe". */
static void why_closed(nf_dconn *c, nf_buf *err) {
  Neoflow__ServerMessage *m = NULL;
  nf_buf e2 = NF_BUF_INIT;
  if (nf_dconn_recv(c, 200, &m, &e2) == NF_OK) {
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR) {
      nf_buf_reset(err);
      nf_buf_printf(err, "the daemon refused the session: %s", m->error->message);
    }
    nf_wire_free_server(m);
  }
  nf_buf_free(&e2);
}

int nf_dconn_recv(nf_dconn *c, int timeout_ms, Neoflow__ServerMessage **m, nf_buf *err) {
  *m = NULL;
  if (c->cancel_fd >= 0) {
    /* wait for the first byte, or for the owner to give up on us (a
     * session closing while a daemon does not answer) */
    struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->cancel_fd, .events = POLLIN}};
    int r;
    do r = poll(p, 2, timeout_ms > 0 ? timeout_ms : -1);
    while (r < 0 && errno == EINTR);
    if (r > 0 && p[1].revents) {
      c->cancelled = 1;
      nf_buf_printf(err, "cancelled");
      return NF_EIO;
    }
    if (r == 0) {
      nf_buf_printf(err, "receiving from the daemon: timed out");
      return NF_EIO;
    }
  }
  int rc = nf_wire_read_frame(c->fd, NF_WIRE_FRAME_MAX, timeout_ms, &c->rx);
  if (rc == NF_ENOENT) {
    nf_buf_printf(err, "the daemon closed the connection");
    return rc;
  }
  if (rc != NF_OK) {
    nf_buf_printf(err, "receiving from the daemon: %s",
                  rc == NF_EFORMAT ? "truncated frame"
                  : rc == NF_ELIMIT ? "oversized frame"
                                    : "timed out or failed");
    return rc == NF_ELIMIT ? NF_EFORMAT : rc;
  }
  const uint8_t *p = (const uint8_t *)c->rx.data;
  size_t n = c->rx.len;
  uint8_t *pt = NULL;
  if (c->box.on) {
    if (!(pt = malloc(n ? n : 1))) return NF_ENOMEM;
    if (nf_box_open(&c->box, p, n, pt, &n) != NF_OK) {
      free(pt);
      nf_buf_printf(err, "a frame from the daemon failed its authentication (changed, replayed, "
                         "reordered or cut on the way): dropping the connection");
      return NF_EFORMAT;
    }
    p = pt;
  }
  nf_wire_err e;
  *m = nf_wire_decode_server(p, n, &e); /* copies what it keeps */
  free(pt);
  if (!*m) {
    nf_buf_printf(err, "the daemon sent an invalid message: %s", e.msg);
    return NF_EFORMAT;
  }
  return NF_OK;
}

static int handshake(nf_dconn *c, const nf_dconn_opts *o, const nf_trust *trust, int timeout_ms,
                     const uint8_t *key, uint8_t ce_sk[32], nf_buf *err) {
  Neoflow__ServerMessage *m = NULL;
  uint8_t sn[NF_AUTH_NONCE], cn[NF_AUTH_NONCE], mac[NF_AUTH_MAC];
  uint8_t se[32], ce[32], tr[32];
  int rc;
  if (c->tcp) {
    if ((rc = nf_dconn_recv(c, timeout_ms, &m, err)) != NF_OK) return rc;
    if (m->msg_case != NEOFLOW__SERVER_MESSAGE__MSG_CHALLENGE) {
      nf_buf_printf(err, "the daemon did not start the TCP handshake");
      nf_wire_free_server(m);
      return NF_EINVAL;
    }
    if (m->challenge->server_ephemeral.len != 32) {
      nf_buf_printf(err, "the daemon offers no key exchange (a neoflowd older than this client): "
                         "refusing an unprotected TCP stream");
      nf_wire_free_server(m);
      return NF_EPERM;
    }
    memcpy(sn, m->challenge->server_nonce.data, NF_AUTH_NONCE);
    memcpy(se, m->challenge->server_ephemeral.data, 32);
    nf_wire_free_server(m);
  }
  Neoflow__Target t;
  uint8_t fp[32];
  char desc[256];
  if (o->cuda_sm > 0)
    nf_dconn_cuda_target(&t, o->cuda_sm, o->cuda_name, fp, desc);
  else
    nf_dconn_host_target(&t, fp, desc);
  Neoflow__Hello h = NEOFLOW__HELLO__INIT;
  h.protocol_min = o->protocol_min ? (uint32_t)o->protocol_min : NF_WIRE_PROTOCOL_MIN;
  h.protocol_max = o->protocol_max ? (uint32_t)o->protocol_max : NF_WIRE_PROTOCOL_MAX;
  h.client_name = (char *)(o->client_name ? o->client_name : "neoflow");
  h.pid = (uint32_t)getpid();
  h.target = &t;
  if (c->tcp) {
    nf_auth_nonce(cn);
    nf_box_ephemeral(ce, ce_sk);
    nf_box_transcript(sn, se, cn, ce, fp, tr);
    h.client_nonce.data = cn;
    h.client_nonce.len = NF_AUTH_NONCE;
    h.client_ephemeral.data = ce;
    h.client_ephemeral.len = 32;
    if (key) {
      nf_auth_client_mac(key, tr, mac);
      h.mac.data = mac;
      h.mac.len = NF_AUTH_MAC;
    }
  }
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_HELLO;
  cm.hello = &h;
  memcpy(c->target_fp, fp, 32);
  if ((rc = nf_dconn_send(c, &cm, err)) != NF_OK) {
    why_closed(c, err);
    return rc;
  }
  if ((rc = nf_dconn_recv(c, timeout_ms, &m, err)) != NF_OK) {
    if (rc == NF_EIO && !c->cancelled) {
      nf_buf_reset(err);
      nf_buf_printf(err, "the daemon accepted the connection but did not answer within %d ms "
                         "(is it stopped, e.g. by SIGSTOP, or overloaded?)", timeout_ms);
    }
    return rc;
  }
  if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_ERROR) {
    nf_buf_printf(err, "the daemon refused the session: %s", m->error->message);
    rc = m->error->code == NEOFLOW__ERROR_CODE__ERR_UNSUPPORTED_VERSION ? NF_EUNSUPPORTED
                                                                         : NF_EINVAL;
    nf_wire_free_server(m);
    return rc;
  }
  if (m->msg_case != NEOFLOW__SERVER_MESSAGE__MSG_WELCOME) {
    nf_buf_printf(err, "the daemon did not answer the Hello with a Welcome");
    nf_wire_free_server(m);
    return NF_EINVAL;
  }
  const Neoflow__Welcome *w = m->welcome;
  if (c->tcp && key) {
    uint8_t want[NF_AUTH_MAC];
    nf_auth_server_mac(key, tr, want);
    if (w->server_mac.len != NF_AUTH_MAC || !nf_auth_mac_equal(want, w->server_mac.data)) {
      nf_buf_printf(err, "the daemon did not prove it knows the key: refusing it");
      nf_wire_free_server(m);
      return NF_EINVAL;
    }
  }
  /* the daemon's identity: every kernel is signed with it */
  if (w->signing_key.len != 32) {
    nf_buf_printf(err, "the daemon presented no signing key (a neoflowd older than this client?): "
                       "refusing its kernels");
    nf_wire_free_server(m);
    return NF_EPERM;
  }
  if (c->tcp && !nf_trust_key_ok(trust, w->signing_key.data)) {
    char pk[NF_SIGN_PK_TEXT];
    nf_sign_format_public(w->signing_key.data, pk);
    nf_buf_printf(err, "the daemon's signing key %s is not one you trust: refusing it (check it "
                       "with the daemon's operator, who sees it with `neoflowd --public-key`, "
                       "then add 'trust_key = %s' to your client configuration or pass "
                       "--trust-key)", pk, pk);
    nf_wire_free_server(m);
    return NF_EPERM;
  }
  if (c->tcp && (w->key_proof.len != 64 ||
                 !nf_sign_transcript_ok(w->signing_key.data, w->key_proof.data, tr))) {
    nf_buf_printf(err, "the daemon did not prove it holds its signing key for this connection "
                       "(someone in between?): refusing it");
    nf_wire_free_server(m);
    return NF_EPERM;
  }
  memcpy(c->daemon_pk, w->signing_key.data, 32);
  /* from here on every frame either way is sealed */
  if (c->tcp && nf_box_client_keys(&c->box, ce, ce_sk, se, key, tr) != NF_OK) {
    nf_buf_printf(err, "the daemon's ephemeral key makes no shared secret: refusing it");
    nf_wire_free_server(m);
    return NF_EPERM;
  }
  c->session = w->session_id;
  c->same_target = w->target && w->target->fingerprint.len == 32 &&
                   memcmp(w->target->fingerprint.data, fp, 32) == 0;
  snprintf(c->daemon_target, sizeof c->daemon_target, "%s",
           w->target && w->target->description ? w->target->description : "");
  nf_wire_free_server(m);
  return NF_OK;
}

int nf_dconn_address(const char *explicit_addr, const nf_trust *t, char *out, size_t n,
                     int *origin) {
  const char *env = nf_env(NF_ENV_SOCKET);
  int len;
  if (explicit_addr && *explicit_addr) {
    *origin = NF_DCONN_ADDR_EXPLICIT;
    len = snprintf(out, n, "%s", explicit_addr);
  } else if (env && *env) {
    *origin = NF_DCONN_ADDR_ENV;
    len = snprintf(out, n, "%s", env);
  } else if (t && t->socket[0]) {
    *origin = NF_DCONN_ADDR_CONFIG;
    len = snprintf(out, n, "%s", t->socket);
  } else {
    *origin = NF_DCONN_ADDR_PER_USER;
    return nf_wire_default_socket(out, n, 0);
  }
  return len >= 0 && (size_t)len < n ? NF_OK : NF_ELIMIT;
}

int nf_dconn_open(const nf_dconn_opts *o, nf_dconn **out, nf_buf *err) {
  *out = NULL;
  int timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
  nf_trust own;
  const nf_trust *trust = o->trust;
  if (!trust) {
    int rc = nf_trust_load(&own, err);
    if (rc != NF_OK) return rc;
    trust = &own;
  }
  char addr_buf[4096];
  int origin = 0;
  if (nf_dconn_address(o->address, trust, addr_buf, sizeof addr_buf, &origin) != NF_OK) {
    nf_buf_printf(err, "the daemon's address is too long (NEOFLOW_SOCKET, XDG_RUNTIME_DIR or the "
                       "configuration's socket)");
    return NF_EINVAL;
  }
  const char *addr = addr_buf;
  int per_user = origin == NF_DCONN_ADDR_PER_USER;
  const char *key_file = o->key_file && *o->key_file ? o->key_file : trust->key_file;
  uint8_t key[NF_AUTH_KEY];
  int have_key = 0;
  if (key_file && *key_file && strncmp(addr, "tcp:", 4) == 0) {
    int rc = nf_auth_load_key(key_file, key, err);
    if (rc != NF_OK) return rc;
    have_key = 1;
  }
  nf_dconn *c = calloc(1, sizeof *c);
  if (!c) return NF_ENOMEM;
  c->fd = -1;
  c->cancel_fd = o->cancel_fd > 0 ? o->cancel_fd : -1;
  int rc;
  if (strncmp(addr, "tcp:", 4) == 0) {
    c->tcp = 1;
    rc = connect_tcp(addr + 4, timeout_ms, &c->fd, err);
  } else {
    const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr;
    /* the directory first: one made by a stranger is refused by name
     * before anything is said to whoever listens there */
    rc = nf_trust_check_socket_dir(trust, path, per_user, err);
    if (rc == NF_ENOENT) {
      nf_buf_reset(err);
      nf_buf_printf(err, "cannot connect to %s: %s", path, strerror(ENOENT));
      rc = NF_EIO;
    } else if (rc != NF_OK) {
      rc = NF_EPERM;
    } else {
      rc = connect_unix(path, trust, &c->fd, err);
    }
  }
  uint8_t ce_sk[32]; /* the ephemeral secret: wiped whatever happens */
  if (rc == NF_OK) rc = handshake(c, o, trust, timeout_ms, have_key ? key : NULL, ce_sk, err);
  sodium_memzero(ce_sk, sizeof ce_sk);
  sodium_memzero(key, sizeof key);
  if (rc != NF_OK) {
    if (c->fd >= 0) close(c->fd);
    nf_buf_free(&c->rx);
    nf_buf_free(&c->tx);
    nf_box_clear(&c->box);
    free(c);
    return rc;
  }
  *out = c;
  return NF_OK;
}

void nf_dconn_close(nf_dconn *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  nf_buf_free(&c->rx);
  nf_buf_free(&c->tx);
  nf_box_clear(&c->box);
  free(c);
}

uint64_t nf_dconn_session(const nf_dconn *c) { return c->session; }
int nf_dconn_same_target(const nf_dconn *c) { return c->same_target; }
const char *nf_dconn_daemon_target(const nf_dconn *c) { return c->daemon_target; }
int nf_dconn_fd(const nf_dconn *c) { return c->fd; }
const uint8_t *nf_dconn_daemon_key(const nf_dconn *c) { return c->daemon_pk; }
int nf_dconn_cache_busy(const nf_dconn *c) { return c->cache_busy; }

int nf_dconn_kernel_signed(const nf_dconn *c, const uint8_t key[32], const uint8_t sha[32],
                           uint32_t abi, const uint8_t *sig, size_t sig_len) {
  return sig && sig_len == NF_SIGN_SIG &&
         nf_sign_kernel_ok(c->daemon_pk, sig, key, sha, c->target_fp, abi);
}

void nf_dkernel_free(nf_dkernel *k) {
  free(k->schedule);
  free(k->binary);
  memset(k, 0, sizeof *k);
}

static const uint8_t *accepted_key(const nf_dconn *c, uint64_t id) {
  for (int i = 0; i < c->n_acc; i++)
    if (c->acc_id[i] == id) return c->acc_key[i];
  return NULL;
}

int nf_dconn_next_kernel(nf_dconn *c, uint64_t request_id, int timeout_ms,
                         void (*on_progress)(void *user, const Neoflow__Progress *p), void *user,
                         nf_dkernel *k, int *code, nf_buf *err) {
  memset(k, 0, sizeof *k);
  *code = 0;
  uint8_t want_sha[32];
  uint64_t want = 0;
  int in_kernel = 0;
  for (;;) {
    Neoflow__ServerMessage *m = NULL;
    int rc = nf_dconn_recv(c, timeout_ms, &m, err);
    if (rc != NF_OK) {
      nf_dkernel_free(k);
      return rc;
    }
    rc = 1; /* 1: go on */
    switch (m->msg_case) {
      case NEOFLOW__SERVER_MESSAGE__MSG_ACCEPTED:
        if (m->accepted->cache_error == NEOFLOW__ERROR_CODE__ERR_CACHE_BUSY) c->cache_busy = 1;
        if (m->accepted->request_id == request_id) {
          int i = c->n_acc < 64 ? c->n_acc++ : 63;
          c->acc_id[i] = request_id;
          memcpy(c->acc_key[i], m->accepted->key.data, 32);
        }
        break;
      case NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS:
        if (m->progress->request_id == request_id && on_progress) on_progress(user, m->progress);
        break;
      case NEOFLOW__SERVER_MESSAGE__MSG_ERROR:
        if (m->error->request_id == request_id || m->error->request_id == 0) {
          *code = (int)m->error->code;
          nf_buf_printf(err, "%s", m->error->message);
          rc = NF_EINVAL;
        }
        break;
      case NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE:
        nf_buf_printf(err, "the daemon said goodbye: %s", m->goodbye->reason);
        rc = NF_ENOENT;
        break;
      case NEOFLOW__SERVER_MESSAGE__MSG_KERNEL: {
        const Neoflow__KernelUpdate *u = m->kernel;
        if (u->request_id != request_id) break;
        const uint8_t *ak = accepted_key(c, request_id);
        if (!ak || memcmp(ak, u->key.data, 32) != 0) {
          nf_buf_printf(err, "kernel rejected: it answers another key");
          rc = NF_EFORMAT;
          break;
        }
        nf_dkernel_free(k);
        k->request_id = request_id;
        k->tier = (int)u->tier;
        k->final = u->final;
        k->time_ms = u->time_ms;
        k->default_ms = u->default_ms;
        k->schedule = strdup(u->schedule ? u->schedule : "");
        memcpy(k->key, u->key.data, 32);
        k->binary = malloc(u->size ? u->size : 1);
        if (!k->schedule || !k->binary) {
          rc = NF_ENOMEM;
          break;
        }
        want = u->size;
        if (want == 0 || u->sha256.len != 32) { /* (validation lets an empty one have none) */
          nf_buf_printf(err, "kernel rejected (ARTIFACT_REJECTED): an empty binary");
          rc = NF_EREJECTED;
          break;
        }
        memcpy(want_sha, u->sha256.data, 32);
        in_kernel = 1;
        if (u->kernel_abi != NF_KERNEL_ABI_VERSION ||
            !nf_dconn_kernel_signed(c, u->key.data, want_sha, u->kernel_abi,
                                    u->signature.data, u->signature.len)) {
          nf_buf_printf(err, "kernel rejected (ARTIFACT_REJECTED): %s",
                        u->kernel_abi != NF_KERNEL_ABI_VERSION
                            ? "unsupported kernel ABI"
                            : "its signature does not verify against the daemon's key");
          rc = NF_EREJECTED;
        }
        break;
      }
      case NEOFLOW__SERVER_MESSAGE__MSG_CHUNK: {
        const Neoflow__Chunk *ch = m->chunk;
        if (ch->request_id != request_id) break;
        if (!in_kernel || ch->offset != k->len || ch->data.len > want - k->len) {
          nf_buf_printf(err, "kernel rejected: chunk at %llu out of order or past the size",
                        (unsigned long long)ch->offset);
          rc = NF_EFORMAT;
          break;
        }
        memcpy(k->binary + k->len, ch->data.data, ch->data.len);
        k->len += ch->data.len;
        if (k->len == want) {
          uint8_t got[32];
          crypto_hash_sha256(got, k->binary, k->len);
          if (memcmp(got, want_sha, 32) != 0) {
            nf_buf_printf(err, "kernel rejected (ARTIFACT_REJECTED): SHA-256 mismatch");
            rc = NF_EREJECTED;
          } else {
            rc = NF_OK;
          }
        }
        break;
      }
      default: break;
    }
    nf_wire_free_server(m);
    if (rc != 1) {
      if (rc != NF_OK) nf_dkernel_free(k);
      return rc;
    }
  }
}
