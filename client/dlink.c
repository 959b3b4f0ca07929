/* dlink.c - the session's connection to neoflowd, on a background thread.
 *
 * The thread connects to the session's address ($NEOFLOW_SOCKET or the
 * per-user default when none was given).  When nothing answers on a Unix
 * socket it starts a per-user neoflowd (detached, in its own session) and
 * retries; two clients doing so at once end up with one daemon, because a
 * second daemon on the same socket and cache refuses to start.  After
 * every connection it submits each subgraph that has no final kernel yet;
 * it reassembles kernels from their chunks, checks the digest, the key
 * the daemon accepted the request under, the kernel ABI and the ELF
 * image (nf__kt_offer: the kernel table's mailbox), for the program's
 * thread, which runs the canary and swaps it in at a step boundary.  It
 * reports each subgraph's share of step time about once a second.  A lost
 * connection is retried with exponential backoff (0.1 s doubling to 5 s);
 * meanwhile training goes on with the kernels it has. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nf_clock.h"
#include "nf_config.h"
#include "nf_dconn.h"
#include "nf_kernel.h"
#include "nf_wire.h"
#include "nf_dlink.h"
#include "nf_env.h"

extern char **environ;

typedef struct asm_k { /* a kernel being reassembled */
  int kent;            /* -1: none */
  int tier, final;
  double time_ms;
  uint8_t sha[32];
  uint8_t *bin;
  size_t len, want;
} asm_k;

struct nf__dlink {
  nf__ktable *kt;     /* the table it feeds (never the session) */
  nf__link_cfg cfg;   /* a copy; the strings and trust are the caller's */
  pthread_t th;
  int stop;           /* under kt->mu */
  int cancel[2];      /* a pipe: written when the link must stop at once,
                         even inside a handshake */
  nf_dconn *c;
  uint64_t next_id;
  asm_k *as; /* per kent */
  int spawned;
  double last_spawn, last_report;
  int warned_target;
  int warned_refused; /* NF_EPERM said once (until a connection works) */
  int warned_spawn;   /* "started but nothing answers" said once */
  int warned_busy;    /* CACHE_BUSY said once */
  int idle_closed;    /* the daemon closed an idle connection: reconnect
                         only when something needs it */
};
typedef struct nf__dlink dlink;

/* ---- the daemon process ---- */

static const char *neoflowd_path(void) {
  static char self[4096];
  const char *v = nf_env(NF_ENV_NEOFLOWD);
  if (v && *v) return v;
  if (access(NF_NEOFLOWD_INSTALL_PATH, X_OK) == 0) return NF_NEOFLOWD_INSTALL_PATH;
  if (access(NF_NEOFLOWD_BUILD_PATH, X_OK) == 0) return NF_NEOFLOWD_BUILD_PATH;
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 16);
  if (n > 0) {
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
      strcpy(slash + 1, "neoflowd");
      if (access(self, X_OK) == 0) return self;
    }
  }
  return "neoflowd";
}

static int is_unix_address(const char *a) {
  return !a || !*a || strncmp(a, "tcp:", 4) != 0;
}

/* Starts neoflowd detached: a child that starts a new session, forks the
 * daemon and exits at once (reaped here), so the daemon is never a child
 * of the program and never left a zombie.  Between fork and exec only
 * async-signal-safe calls are made. */
static void spawn_daemon(dlink *L) {
  nf__ktable *kt = L->kt;
  const char *path = neoflowd_path();
  const char *addr = L->cfg.daemon_addr;
  if (addr && !strncmp(addr, "unix:", 5)) addr += 5;
  char *argv[5] = {(char *)"neoflowd", NULL, NULL, NULL, NULL};
  if (addr && *addr) {
    argv[1] = (char *)"--socket";
    argv[2] = (char *)addr;
  }
  /* neoflowd refuses a socket directory that other users may enter: say
   * so here rather than start a daemon that exits at once, unseen */
  char sock[4096];
  int origin;
  if (nf_dconn_address(addr, L->cfg.trust, sock, sizeof sock, &origin) != NF_OK) sock[0] = 0;
  if (!strncmp(sock, "unix:", 5)) memmove(sock, sock + 5, strlen(sock + 5) + 1);
  char *slash = strrchr(sock, '/');
  struct stat dst;
  if (slash && slash != sock) {
    *slash = 0;
    if (lstat(sock, &dst) == 0 && S_ISDIR(dst.st_mode) && (dst.st_mode & S_IRWXO)) {
      if (!L->warned_spawn)
        nf__slog_warn(kt->log, "not starting neoflowd: its socket directory %s has mode %04o, and "
                          "neoflowd refuses a directory other users may enter (chmod 700 %s); "
                          "training on fallback kernels", sock,
                       (unsigned)dst.st_mode & 07777, sock);
      L->warned_spawn = 1;
      L->last_spawn = nf_now_ms();
      L->spawned = 1;
      return;
    }
  }
  /* resolve a bare name on PATH before forking */
  char found[4096];
  if (!strchr(path, '/')) {
    const char *pp = nf_env(NF_ENV_PATH);
    found[0] = 0;
    while (pp && *pp && !found[0]) {
      const char *c = strchr(pp, ':');
      size_t n = c ? (size_t)(c - pp) : strlen(pp);
      if (n && n + strlen(path) + 2 < sizeof found) {
        memcpy(found, pp, n);
        found[n] = '/';
        strcpy(found + n + 1, path);
        if (access(found, X_OK) != 0) found[0] = 0;
      }
      pp = c ? c + 1 : NULL;
    }
    if (!found[0]) {
      nf__slog_warn(kt->log, "cannot start neoflowd: not found (set NF_NEOFLOWD); training on "
                          "fallback kernels");
      L->last_spawn = nf_now_ms();
      return;
    }
    path = found;
  }
  L->last_spawn = nf_now_ms();
  pid_t pid = fork();
  if (pid < 0) {
    nf__slog_warn(kt->log, "cannot start neoflowd: fork: %s", strerror(errno));
    return;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    setsid();
    if (fork() != 0) _exit(0);
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
      dup2(fd, 0);
      dup2(fd, 1);
      dup2(fd, 2);
      if (fd > 2) close(fd);
    }
    execve(path, argv, environ);
    _exit(127);
  }
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
  L->spawned = 1; /* a start is under way; retried only after 10 s */
}

/* The daemon is not our child (spawn_daemon): after 10 s without an
 * answer another start may be tried. */
static void reap(dlink *L) {
  if (L->spawned && nf_now_ms() - L->last_spawn > 10000) L->spawned = 0;
}

/* ---- the connection ---- */

static void drop(dlink *L, const char *why) {
  nf__ktable *kt = L->kt;
  if (L->c) {
    nf_dconn_close(L->c);
    L->c = NULL;
    /* (the session ending cancels a wait: nothing was lost) */
    pthread_mutex_lock(&kt->mu);
    int stopping = L->stop;
    pthread_mutex_unlock(&kt->mu);
    if (!L->idle_closed && !stopping)
      nf__slog_warn(kt->log, "lost the daemon connection (%s); training goes on, reconnecting", why);
  }
  pthread_mutex_lock(&kt->mu);
  kt->connected = 0;
  for (int i = 0; i < kt->n_kents; i++) {
    nf__kent *k = &kt->kents[i];
    if (k->dstate == DK_SUBMITTED || k->dstate == DK_ACCEPTED) k->dstate = DK_NONE;
  }
  pthread_cond_broadcast(&kt->cv);
  pthread_mutex_unlock(&kt->mu);
  for (int i = 0; i < kt->n_kents; i++) {
    free(L->as[i].bin);
    memset(&L->as[i], 0, sizeof L->as[i]);
    L->as[i].kent = -1;
  }
}

/* Under mu: whether k's final kernel ran slower here than tier 0 and the
 * daemon is still to be asked for a faster one (a tuning session on the
 * CPU only: compile_only asked for no search). */
static int asks_better(const dlink *L, const nf__kent *k) {
  return k->ask_better == 1 && k->dstate == DK_FINAL && !L->cfg.compile_only &&
         L->kt->dev == &nf__cpu_device;
}

static int submit_all(dlink *L) {
  nf__ktable *kt = L->kt;
  nf_buf err = NF_BUF_INIT;
  int rc = NF_OK;
  for (int i = 0; i < kt->n_kents && rc == NF_OK; i++) {
    nf__kent *k = &kt->kents[i];
    pthread_mutex_lock(&kt->mu);
    int better = asks_better(L, k);
    int need = k->dstate == DK_NONE || better;
    uint8_t slow_sha[32];
    double slow_ratio = k->slow_ratio;
    memcpy(slow_sha, k->slow_sha, 32);
    pthread_mutex_unlock(&kt->mu);
    if (!need) continue;
    Neoflow__Graph *pg = NULL;
    if (nf_wire_graph_from_ir(k->g, &pg) != NF_OK) {
      pthread_mutex_lock(&kt->mu);
      k->dstate = DK_FAILED;
      pthread_mutex_unlock(&kt->mu);
      continue;
    }
    Neoflow__Submit sm = NEOFLOW__SUBMIT__INIT;
    uint64_t id = ++L->next_id;
    sm.request_id = id;
    sm.graph = pg;
    sm.mode = L->cfg.compile_only ? NEOFLOW__MODE__MODE_COMPILE : NEOFLOW__MODE__MODE_TUNE;
    sm.max_trials = L->cfg.tune_trials > 0 ? (uint32_t)L->cfg.tune_trials : 0;
    sm.max_seconds = L->cfg.tune_seconds > 0 ? (uint32_t)L->cfg.tune_seconds : 0;
    if (better) {
      sm.slower_sha256.data = slow_sha;
      sm.slower_sha256.len = 32;
      sm.slower_ratio = slow_ratio;
    }
    Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
    cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    cm.submit = &sm;
    rc = nf_dconn_send(L->c, &cm, &err);
    nf_wire_graph_free(pg);
    if (rc == NF_OK) {
      pthread_mutex_lock(&kt->mu);
      if (better) k->ask_better = 2;
      k->req_id = id;
      k->dstate = DK_SUBMITTED;
      k->trial = k->max_trials = 0;
      pthread_mutex_unlock(&kt->mu);
    }
  }
  nf_buf_free(&err);
  return rc;
}

static int kent_of(const nf__ktable *kt, uint64_t id) {
  if (!id) return -1;
  for (int i = 0; i < kt->n_kents; i++)
    if (kt->kents[i].req_id == id) return i;
  return -1;
}

/* Handles one message; returns 0, or -1 when the connection must go. */
static int handle(dlink *L, const Neoflow__ServerMessage *m) {
  nf__ktable *kt = L->kt;
  int k;
  switch (m->msg_case) {
    case NEOFLOW__SERVER_MESSAGE__MSG_ACCEPTED:
      if (m->accepted->cache_error == NEOFLOW__ERROR_CODE__ERR_CACHE_BUSY && !L->warned_busy) {
        L->warned_busy = 1;
        nf__slog_warn(kt->log, "the daemon's cache is locked by another process (CACHE_BUSY): "
                            "kernels still arrive, but may not be kept for the next session");
      }
      pthread_mutex_lock(&kt->mu);
      if ((k = kent_of(kt, m->accepted->request_id)) >= 0 && m->accepted->key.len == 32) {
        memcpy(kt->kents[k].dkey, m->accepted->key.data, 32);
        if (kt->kents[k].dstate == DK_SUBMITTED) kt->kents[k].dstate = DK_ACCEPTED;
      }
      pthread_mutex_unlock(&kt->mu);
      return 0;
    case NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS:
      pthread_mutex_lock(&kt->mu);
      if ((k = kent_of(kt, m->progress->request_id)) >= 0) {
        nf__kent *e = &kt->kents[k];
        e->trial = m->progress->trial;
        e->max_trials = m->progress->max_trials;
        /* the tuning curve (the report): each new best */
        double best = m->progress->best_ms;
        if (m->progress->default_ms > 0) e->tune_default = m->progress->default_ms;
        /* a further search counts its trials from 0: its curve starts anew */
        if (e->n_tune && m->progress->trial < e->tune_x[e->n_tune - 1]) e->n_tune = 0;
        if (best > 0 && isfinite(best) &&
            (e->n_tune == 0 || best < e->tune_y[e->n_tune - 1] ||
             m->progress->trial > e->tune_x[e->n_tune - 1] + 16)) {
          if (e->n_tune == NF_TUNE_POINTS) {
            for (int i = 0; i < NF_TUNE_POINTS / 2; i++) {
              e->tune_x[i] = e->tune_x[2 * i + 1];
              e->tune_y[i] = e->tune_y[2 * i + 1];
            }
            e->n_tune = NF_TUNE_POINTS / 2;
          }
          e->tune_x[e->n_tune] = (float)m->progress->trial;
          e->tune_y[e->n_tune++] = (float)best;
        }
      }
      pthread_mutex_unlock(&kt->mu);
      return 0;
    case NEOFLOW__SERVER_MESSAGE__MSG_KERNEL: {
      const Neoflow__KernelUpdate *u = m->kernel;
      pthread_mutex_lock(&kt->mu);
      k = kent_of(kt, u->request_id);
      int key_ok = k >= 0 && kt->kents[k].dstate >= DK_ACCEPTED && u->key.len == 32 &&
                   !memcmp(kt->kents[k].dkey, u->key.data, 32);
      pthread_mutex_unlock(&kt->mu);
      if (k < 0) return 0; /* a request of an earlier connection */
      asm_k *a = &L->as[k];
      free(a->bin);
      memset(a, 0, sizeof *a);
      a->kent = -1;
      /* the signature first: nothing of an unsigned kernel is kept */
      const char *why = !key_ok ? "it answers another key than the request's"
                        : u->kernel_abi != NF_KERNEL_ABI_VERSION || u->size == 0 ||
                                u->sha256.len != 32
                            ? "unsupported kernel ABI or empty binary"
                        : !nf_dconn_kernel_signed(L->c, u->key.data, u->sha256.data, u->kernel_abi,
                                                  u->signature.data, u->signature.len)
                            ? "its signature does not verify against the daemon's key"
                            : NULL;
      if (why) {
        pthread_mutex_lock(&kt->mu);
        kt->link_rejected++;
        /* a refused final kernel is not asked for again on every reconnect */
        if (u->final && k >= 0) kt->kents[k].dstate = DK_FAILED;
        pthread_cond_broadcast(&kt->cv);
        pthread_mutex_unlock(&kt->mu);
        nf__slog_warn(kt->log, "kernel for request %llu rejected (ARTIFACT_REJECTED): %s",
                         (unsigned long long)u->request_id, why);
        return 0;
      }
      a->bin = malloc(u->size);
      if (!a->bin) return -1;
      a->kent = k;
      a->tier = (int)u->tier;
      a->final = u->final;
      a->time_ms = u->time_ms;
      a->want = u->size;
      memcpy(a->sha, u->sha256.data, 32);
      return 0;
    }
    case NEOFLOW__SERVER_MESSAGE__MSG_CHUNK: {
      const Neoflow__Chunk *ch = m->chunk;
      pthread_mutex_lock(&kt->mu);
      k = kent_of(kt, ch->request_id);
      pthread_mutex_unlock(&kt->mu);
      if (k < 0) return 0;
      asm_k *a = &L->as[k];
      if (a->kent != k) return 0; /* the announcement was refused */
      if (ch->offset != a->len || ch->data.len > a->want - a->len) return -1;
      memcpy(a->bin + a->len, ch->data.data, ch->data.len);
      a->len += ch->data.len;
      if (a->len < a->want) return 0;
      uint8_t key[32];
      pthread_mutex_lock(&kt->mu);
      memcpy(key, kt->kents[k].dkey, 32);
      pthread_mutex_unlock(&kt->mu);
      int rc = nf__kt_offer(kt, k, a->bin, a->len, a->sha, key, a->tier, a->time_ms);
      pthread_mutex_lock(&kt->mu);
      if (a->final) kt->kents[k].dstate = rc == NF_OK ? DK_FINAL : DK_FAILED;
      pthread_cond_broadcast(&kt->cv);
      pthread_mutex_unlock(&kt->mu);
      free(a->bin);
      memset(a, 0, sizeof *a);
      a->kent = -1;
      return 0;
    }
    case NEOFLOW__SERVER_MESSAGE__MSG_ERROR: {
      const Neoflow__Error *e = m->error;
      pthread_mutex_lock(&kt->mu);
      k = kent_of(kt, e->request_id);
      if (k >= 0) kt->kents[k].dstate = DK_FAILED;
      pthread_cond_broadcast(&kt->cv);
      pthread_mutex_unlock(&kt->mu);
      if (k >= 0) {
        char hex[65];
        nf_hash_hex(kt->kents[k].key, hex);
        hex[16] = 0;
        nf__slog_warn(kt->log, "the daemon gave up on subgraph %s: %s", hex, e->message);
      }
      return e->fatal || e->request_id == 0 ? -1 : 0;
    }
    case NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE:
      if (m->goodbye->reason && !strcmp(m->goodbye->reason, "idle timeout")) L->idle_closed = 1;
      return -1;
    default: return 0;
  }
}

static void report(dlink *L) {
  nf__ktable *kt = L->kt;
  uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)(kt->n_kents + 1));
  double *ms = malloc(sizeof(double) * (size_t)(kt->n_kents + 1));
  size_t n = 0, n_open = 0;
  if (ids && ms) {
    /* every subgraph's time, also those whose kernel is final: the daemon
     * divides its tuning budget by each open request's part of the whole
     * step (it ignores the ids it no longer has open) */
    pthread_mutex_lock(&kt->mu);
    for (int i = 0; i < kt->n_kents && n < NF_WIRE_MAX_STEP_TIMES; i++) {
      const nf__kent *k = &kt->kents[i];
      if (k->share_ms > 0) {
        ids[n] = k->dstate == DK_NONE ? 0 : k->req_id;
        ms[n++] = k->share_ms;
        n_open += k->dstate == DK_ACCEPTED || k->dstate == DK_SUBMITTED;
      }
    }
    pthread_mutex_unlock(&kt->mu);
  }
  if (n_open) {
    Neoflow__StepTimes st = NEOFLOW__STEP_TIMES__INIT;
    st.n_request_id = n;
    st.request_id = ids;
    st.n_ms = n;
    st.ms = ms;
    Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
    cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STEP_TIMES;
    cm.step_times = &st;
    nf_buf err = NF_BUF_INIT;
    if (nf_dconn_send(L->c, &cm, &err) != NF_OK) drop(L, nf_buf_str(&err));
    nf_buf_free(&err);
  }
  free(ids);
  free(ms);
}

static int stopping(dlink *L) {
  nf__ktable *kt = L->kt;
  pthread_mutex_lock(&kt->mu);
  int v = L->stop;
  pthread_mutex_unlock(&kt->mu);
  return v;
}

static void nap(dlink *L, double ms) {
  nf__ktable *kt = L->kt;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)(ms * 1e6);
  while (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&kt->mu);
  if (!L->stop) pthread_cond_timedwait(&kt->cv, &kt->mu, &ts);
  pthread_mutex_unlock(&kt->mu);
}

static void *link_main(void *arg) {
  dlink *L = arg;
  nf__ktable *kt = L->kt;
  double backoff = 100, next_try = 0;
  while (!stopping(L)) {
    reap(L);
    if (!L->c && L->idle_closed) {
      /* closed for idleness with every kernel final: nothing to ask */
      int need = 0;
      pthread_mutex_lock(&kt->mu);
      for (int i = 0; i < kt->n_kents; i++)
        need |= kt->kents[i].dstate == DK_NONE || asks_better(L, &kt->kents[i]);
      pthread_mutex_unlock(&kt->mu);
      if (!need) {
        nap(L, 1000);
        continue;
      }
      L->idle_closed = 0;
    }
    if (!L->c) {
      double now = nf_now_ms();
      if (now < next_try) {
        nap(L, next_try - now);
        continue;
      }
      nf_buf err = NF_BUF_INIT;
      nf_dconn_opts o = {.address = L->cfg.daemon_addr, .client_name = "libneoflow-client",
                         .timeout_ms = 2000, .trust = L->cfg.trust, .key_file = L->cfg.daemon_key,
                         .cancel_fd = L->cancel[0]};
      /* a GPU session asks for kernels for its device */
      o.cuda_sm = kt->dev->target(kt, &o.cuda_name);
      int rc = nf_dconn_open(&o, &L->c, &err);
      if (rc == NF_EPERM || rc == NF_EINVAL) {
        /* someone we do not trust answers or holds the socket's
         * directory, or the daemon refused us, or a key file is unusable:
         * never start a daemon into that; say why once (retried with
         * backoff), keep training on fallbacks */
        if (!L->warned_refused)
          nf__slog_warn(kt->log, "not using a daemon: %s; training on fallback kernels",
                           nf_buf_str(&err));
        L->warned_refused = 1;
      }
      if (rc == NF_OK && !nf_dconn_same_target(L->c)) {
        if (!L->warned_target)
          nf__slog_warn(kt->log, "the daemon compiles for another machine (%s): not using it",
                           nf_dconn_daemon_target(L->c));
        L->warned_target = 1;
        nf_dconn_close(L->c);
        L->c = NULL;
        rc = NF_EUNSUPPORTED;
      }
      if (rc == NF_OK) {
        pthread_mutex_lock(&kt->mu);
        kt->connected = 1;
        kt->connects++;
        pthread_cond_broadcast(&kt->cv);
        pthread_mutex_unlock(&kt->mu);
        backoff = 100;
        L->warned_refused = L->warned_spawn = 0;
        if (submit_all(L) != NF_OK) drop(L, "cannot submit");
        pthread_mutex_lock(&kt->mu);
        kt->link_first = 0;
        pthread_cond_broadcast(&kt->cv);
        pthread_mutex_unlock(&kt->mu);
      } else {
        /* nothing answers on the Unix socket: start a per-user daemon
         * (at most every 10 s), then poll quickly while it comes up */
        /* a socket named by the configuration is a shared daemon's,
         * which its operator runs: never one of ours */
        char where[4096];
        int origin = NF_DCONN_ADDR_PER_USER;
        nf_dconn_address(L->cfg.daemon_addr, L->cfg.trust, where, sizeof where, &origin);
        int shared = origin == NF_DCONN_ADDR_CONFIG;
        if (rc == NF_EIO && is_unix_address(L->cfg.daemon_addr) && !L->cfg.no_spawn && !shared &&
            L->spawned == 0 && (L->last_spawn == 0 || now - L->last_spawn > 10000))
          spawn_daemon(L);
        int starting = L->last_spawn > 0 && now - L->last_spawn < 3000;
        if (rc == NF_EIO && L->spawned && !starting && !L->warned_spawn) {
          nf__slog_warn(kt->log, "started neoflowd, but nothing answers after 3 s (%s); run "
                              "neoflowd by hand with the same socket to see why; training on "
                              "fallback kernels meanwhile", nf_buf_str(&err));
          L->warned_spawn = 1;
        }
        if (!starting) {
          pthread_mutex_lock(&kt->mu);
          kt->link_first = 0; /* no daemon for now: nobody waits for one */
          pthread_cond_broadcast(&kt->cv);
          pthread_mutex_unlock(&kt->mu);
        }
        next_try = now + (starting ? 50 : backoff);
        if (!starting) backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
      }
      nf_buf_free(&err);
      continue;
    }
    /* wait for a frame's first byte here: once one has started, the whole
     * frame is read (a stall of 10 s within it drops the connection) */
    struct pollfd pfd = {.fd = nf_dconn_fd(L->c), .events = POLLIN};
    int pr = poll(&pfd, 1, 100);
    nf_buf err = NF_BUF_INIT;
    if (pr > 0) {
      Neoflow__ServerMessage *m = NULL;
      int rc = nf_dconn_recv(L->c, 10000, &m, &err);
      if (rc == NF_OK) {
        if (handle(L, m) != 0) drop(L, "the daemon closed the session");
        nf_wire_free_server(m);
      } else {
        drop(L, rc == NF_ENOENT ? "the daemon closed the connection" : nf_buf_str(&err));
      }
    } else if (pr < 0 && errno != EINTR) {
      drop(L, strerror(errno));
    }
    nf_buf_free(&err);
    /* resubmit what a lost request left, report step times */
    if (L->c) {
      int again = 0;
      pthread_mutex_lock(&kt->mu);
      for (int i = 0; i < kt->n_kents; i++)
        again |= kt->kents[i].dstate == DK_NONE || asks_better(L, &kt->kents[i]);
      pthread_mutex_unlock(&kt->mu);
      if (again && submit_all(L) != NF_OK) drop(L, "cannot submit");
    }
    double now = nf_now_ms();
    if (L->c && now - L->last_report > 1000) {
      L->last_report = now;
      report(L);
    }
  }
  if (L->c) nf_dconn_close(L->c);
  L->c = NULL;
  reap(L);
  return NULL;
}

int nf__dlink_start(nf__ktable *kt, const nf__link_cfg *cfg, nf__dlink **out, nf_buf *err) {
  *out = NULL;
  dlink *L = calloc(1, sizeof *L);
  if (!L) return NF_ENOMEM;
  L->kt = kt;
  L->cfg = *cfg;
  L->as = calloc((size_t)kt->n_kents + 1, sizeof *L->as);
  if (!L->as) {
    free(L);
    return NF_ENOMEM;
  }
  for (int i = 0; i < kt->n_kents; i++) L->as[i].kent = -1;
  if (pipe2(L->cancel, O_CLOEXEC | O_NONBLOCK) != 0) L->cancel[0] = L->cancel[1] = -1;
  kt->link_first = 1;
  if (pthread_create(&L->th, NULL, link_main, L) != 0) {
    kt->link_first = 0;
    if (L->cancel[0] >= 0) close(L->cancel[0]);
    if (L->cancel[1] >= 0) close(L->cancel[1]);
    free(L->as);
    free(L);
    nf_buf_printf(err, "cannot start the daemon thread");
    return NF_ENOMEM;
  }
  *out = L;
  return NF_OK;
}

void nf__dlink_stop(nf__dlink *L) {
  if (!L) return;
  pthread_mutex_lock(&L->kt->mu);
  L->stop = 1;
  pthread_cond_broadcast(&L->kt->cv);
  pthread_mutex_unlock(&L->kt->mu);
  if (L->cancel[1] >= 0) {
    ssize_t w = write(L->cancel[1], "x", 1); /* ends a wait on a silent daemon */
    (void)w;
  }
  pthread_join(L->th, NULL);
  if (L->cancel[0] >= 0) close(L->cancel[0]);
  if (L->cancel[1] >= 0) close(L->cancel[1]);
  for (int i = 0; i < L->kt->n_kents; i++) free(L->as[i].bin);
  free(L->as);
  free(L);
}
