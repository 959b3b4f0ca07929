/* measure.c - the measurer: the parent side of sandboxed candidate
 * measurement (nf_measure.h).  The worker is neoflow-worker (worker.c).
 *
 * Process handling:
 *  - the worker is started with posix_spawn (never fork: the caller is
 *    threaded) in its own process group, with default signal dispositions,
 *    an empty signal mask, stdin/stdout/stderr on three pipes and every
 *    other descriptor closed; the parent's ends are close-on-exec and
 *    non-blocking, and every read and write goes through poll() with a
 *    deadline, so a worker that stops reading or writing cannot block us;
 *  - stderr is drained whenever we wait, and its last bytes (per
 *    candidate) explain a crash;
 *  - a candidate gets timeout_ms of wall time from the moment we start
 *    sending it; past it the process group is SIGKILLed and reaped;
 *  - a worker that died (EOF), broke the protocol or timed out is always
 *    reaped before nf_measure returns (no zombies); the next call starts a
 *    fresh one and sends it the problem again.
 *
 * SIGPIPE: a write to a dead worker's pipe raises SIGPIPE in the writing
 * thread.  Around each write SIGPIPE is blocked in this thread only
 * (pthread_sigmask); a SIGPIPE our write raised is consumed with
 * sigtimedwait before the mask is restored, unless one was already
 * pending before (that one is not ours to take).  The process-wide
 * disposition is never changed.
 *
 * Limits: the caller must not reap arbitrary children (waitpid(-1) in a
 * SIGCHLD handler) nor set SIGCHLD to SIG_IGN: either steals the worker's
 * exit status, and a crash is then reported without its signal.  The
 * worker's PR_SET_PDEATHSIG fires when the *thread* that started it exits,
 * so a measurer must be used and freed on the thread that created it or
 * on one that outlives it (a worker killed that way reads as a crash). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nf_config.h"
#include "nf_env.h"
#include "nf_measure.h"

extern char **environ;

#define TAIL_BYTES 200
#define START_EXTRA_MS 30000 /* start-up (problem transfer) gets timeout + this */
#define EXIT_GRACE_MS 200    /* nf_measurer_free: time to exit before SIGKILL */
#define DEAD_GRACE_MS 1000   /* after EOF: time to finish dying before SIGKILL */

struct nf_measurer {
  /* the problem (copied) */
  uint32_t n_in, n_out, n_copies;
  nf_measure_tensor *tensors;
  int64_t *n_elem;  /* per tensor */
  size_t *bytes;    /* per tensor */
  void **inputs;    /* n_in */
  double **expected; /* n_out */
  double **bound;    /* n_out, or NULL: no bounds */
  double rtol;
  /* options, defaults applied */
  char *worker_path;
  int gpu, gpu_device; /* candidates are CUDA bundles (nf_measure_opts) */
  int gpu_sm;
  char *gpu_name;
  int n_threads;
  unsigned timeout_ms;
  uint64_t mem_limit;
  double min_time_ms;
  int warmup, max_repeat;
  double cutoff_ms; /* nf_measurer_set_cutoff */
  /* the worker */
  pid_t pid;           /* -1: none */
  int to_w, from_w, err_r; /* -1 when closed */
  char tail[TAIL_BYTES];
  size_t tail_len;
};

enum { IO_OK = 0, IO_TIMEOUT, IO_EOF, IO_ERR, IO_PROTO };

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *nf_measure_status_name(int status) {
  switch (status) {
  case NF_MEAS_OK: return "OK";
  case NF_MEAS_WRONG: return "WRONG";
  case NF_MEAS_CRASH: return "CRASH";
  case NF_MEAS_TIMEOUT: return "TIMEOUT";
  case NF_MEAS_LOAD: return "LOAD";
  case NF_MEAS_ERROR: return "ERROR";
  default: return "?";
  }
}

void nf_measurer_set_cutoff(nf_measurer *m, double ms) {
  if (m) m->cutoff_ms = ms > 0 && ms < 1e12 ? ms : 0;
}

int nf_measurer_worker_pid(const nf_measurer *m) { return m && m->pid > 0 ? (int)m->pid : -1; }

/* ---- stderr tail ---- */

static void tail_add(nf_measurer *m, const char *p, size_t n) {
  if (n >= TAIL_BYTES) {
    memcpy(m->tail, p + n - TAIL_BYTES, TAIL_BYTES);
    m->tail_len = TAIL_BYTES;
    return;
  }
  if (m->tail_len + n > TAIL_BYTES) {
    size_t drop = m->tail_len + n - TAIL_BYTES;
    memmove(m->tail, m->tail + drop, m->tail_len - drop);
    m->tail_len -= drop;
  }
  memcpy(m->tail + m->tail_len, p, n);
  m->tail_len += n;
}

/* Reads what stderr has now (non-blocking); closes it at EOF. */
static void drain_err(nf_measurer *m) {
  char b[4096];
  while (m->err_r >= 0) {
    ssize_t r = read(m->err_r, b, sizeof b);
    if (r > 0) {
      tail_add(m, b, (size_t)r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(m->err_r); /* EOF or error */
    m->err_r = -1;
  }
}

/* The tail as one printable line (control bytes become spaces). */
static void tail_text(const nf_measurer *m, char *out, size_t cap) {
  size_t k = 0, i = 0;
  while (i < m->tail_len && (m->tail[i] == '\n' || m->tail[i] == ' ')) i++;
  for (; i < m->tail_len && k + 1 < cap; i++) {
    unsigned char c = (unsigned char)m->tail[i];
    out[k++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
  }
  while (k && out[k - 1] == ' ') k--;
  out[k] = 0;
}

/* ---- waiting and I/O with a deadline ---- */

/* Waits until fd has one of events (or an error/hangup), draining stderr
 * meanwhile.  IO_OK, IO_TIMEOUT or IO_ERR (errno set). */
static int wait_fd(nf_measurer *m, int fd, short events, int64_t deadline) {
  for (;;) {
    struct pollfd p[2] = {{fd, events, 0}, {m->err_r, POLLIN, 0}};
    int64_t left = deadline - now_ms();
    if (left < 0) left = 0;
    int r = poll(p, m->err_r >= 0 ? 2 : 1, (int)(left > 60000 ? 60000 : left));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IO_ERR;
    }
    if (m->err_r >= 0 && p[1].revents) drain_err(m);
    if (p[0].revents) return IO_OK;
    if (r == 0 && now_ms() >= deadline) return IO_TIMEOUT;
  }
}

static int send_all(nf_measurer *m, const void *buf, size_t n, int64_t deadline) {
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  int was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const char *c = buf;
  int rc = IO_OK;
  while (n && rc == IO_OK) {
    ssize_t w = write(m->to_w, c, n);
    if (w > 0) {
      c += w;
      n -= (size_t)w;
    } else if (w < 0 && errno == EPIPE) {
      rc = IO_EOF;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      rc = wait_fd(m, m->to_w, POLLOUT, deadline);
    } else if (!(w < 0 && errno == EINTR)) {
      rc = IO_ERR;
    }
  }
  if (rc == IO_EOF && !was_pending) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  int saved = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  errno = saved;
  return rc;
}

static int recv_all(nf_measurer *m, void *buf, size_t n, int64_t deadline) {
  char *c = buf;
  while (n) {
    ssize_t r = read(m->from_w, c, n);
    if (r > 0) {
      c += r;
      n -= (size_t)r;
    } else if (r == 0) {
      return IO_EOF;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = wait_fd(m, m->from_w, POLLIN, deadline);
      if (rc != IO_OK) return rc;
    } else if (errno != EINTR) {
      return IO_ERR;
    }
  }
  return IO_OK;
}

static int send_frame(nf_measurer *m, uint32_t type, const void *p, size_t n, int64_t deadline) {
  unsigned char h[NF__MEAS_HEADER_BYTES];
  uint32_t zero = 0;
  uint64_t len = n;
  memcpy(h, &type, 4);
  memcpy(h + 4, &zero, 4);
  memcpy(h + 8, &len, 8);
  int rc = send_all(m, h, sizeof h, deadline);
  if (rc == IO_OK && n) rc = send_all(m, p, n, deadline);
  return rc;
}

/* Receives one worker frame into buf (cap NF__MEAS_MAX_MSG): the type and
 * length are checked before the payload is read (IO_PROTO when bad). */
static int recv_frame(nf_measurer *m, uint32_t *type, char *buf, size_t *len, int64_t deadline) {
  unsigned char h[NF__MEAS_HEADER_BYTES];
  int rc = recv_all(m, h, sizeof h, deadline);
  if (rc != IO_OK) return rc;
  uint32_t zero;
  uint64_t n;
  memcpy(type, h, 4);
  memcpy(&zero, h + 4, 4);
  memcpy(&n, h + 8, 8);
  uint64_t lo = 0, hi = 0;
  if (*type == NF__MEAS_F_READY)
    lo = hi = 0;
  else if (*type == NF__MEAS_F_RESULT)
    lo = NF__MEAS_RESULT_FIXED, hi = NF__MEAS_RESULT_FIXED + 255;
  else if (*type == NF__MEAS_F_FAIL)
    hi = NF__MEAS_MAX_MSG;
  else
    return IO_PROTO;
  if (zero || n < lo || n > hi) return IO_PROTO;
  *len = (size_t)n;
  return n ? recv_all(m, buf, (size_t)n, deadline) : IO_OK;
}

/* ---- the worker's life ---- */

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* Reaps the worker: waits up to grace_ms for it to exit by itself, then
 * SIGKILLs its process group and waits.  Returns 1 with *st filled when
 * the status is known, 0 when not (ECHILD: someone else reaped it);
 * *killed says whether we had to kill it. */
static int reap(nf_measurer *m, int grace_ms, int *st, int *killed) {
  *killed = 0;
  int known = 0;
  if (m->pid > 0) {
    int64_t until = now_ms() + grace_ms;
    for (;;) {
      pid_t r = waitpid(m->pid, st, WNOHANG);
      if (r == m->pid) {
        known = 1;
        break;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) break; /* ECHILD */
      if (now_ms() >= until) {
        kill(-m->pid, SIGKILL); /* its group: anything it started too */
        kill(m->pid, SIGKILL);
        *killed = 1;
        while ((r = waitpid(m->pid, st, 0)) < 0 && errno == EINTR) {
        }
        known = r == m->pid;
        break;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  m->pid = -1;
  close_fd(&m->to_w);
  close_fd(&m->from_w);
  close_fd(&m->err_r);
  return known;
}

static void kill_worker(nf_measurer *m) {
  int st, killed;
  reap(m, 0, &st, &killed);
}

static const char *signal_name(int sig) {
  switch (sig) {
  case SIGSEGV: return "SIGSEGV";
  case SIGBUS: return "SIGBUS";
  case SIGILL: return "SIGILL";
  case SIGFPE: return "SIGFPE";
  case SIGABRT: return "SIGABRT";
  case SIGKILL: return "SIGKILL";
  case SIGTERM: return "SIGTERM";
  case SIGTRAP: return "SIGTRAP";
  case SIGSYS: return "SIGSYS";
  case SIGXCPU: return "SIGXCPU";
  case SIGXFSZ: return "SIGXFSZ";
  case SIGPIPE: return "SIGPIPE";
  case SIGINT: return "SIGINT";
  case SIGHUP: return "SIGHUP";
  case SIGQUIT: return "SIGQUIT";
  default: return NULL;
  }
}

/* The worker went away (EOF on its pipes): let it finish dying, collect
 * the rest of its stderr, reap it and describe how it ended. */
static void describe_death(nf_measurer *m, const char *what, char *out, size_t cap) {
  int64_t until = now_ms() + DEAD_GRACE_MS;
  while (m->err_r >= 0 && now_ms() < until) {
    struct pollfd p = {m->err_r, POLLIN, 0};
    int64_t left = until - now_ms();
    if (poll(&p, 1, (int)(left < 0 ? 0 : left)) < 0 && errno != EINTR) break;
    drain_err(m);
  }
  char tail[TAIL_BYTES + 1];
  tail_text(m, tail, sizeof tail);
  int st = 0, killed;
  int known = reap(m, DEAD_GRACE_MS, &st, &killed);
  char how[96];
  if (!known)
    snprintf(how, sizeof how, "%s (exit status unavailable: was it reaped elsewhere?)", what);
  else if (killed)
    snprintf(how, sizeof how, "%s and did not exit: killed", what);
  else if (WIFSIGNALED(st)) {
    const char *name = signal_name(WTERMSIG(st));
    if (name)
      snprintf(how, sizeof how, "killed by %s (%s)", name, strsignal(WTERMSIG(st)));
    else
      snprintf(how, sizeof how, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  } else if (WIFEXITED(st))
    snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
  else
    snprintf(how, sizeof how, "%s", what);
  if (tail[0]) {
    /* keep the end of the tail, the most recent output, when it must be cut */
    size_t room = cap > strlen(how) + 12 ? cap - strlen(how) - 12 : 0;
    size_t tl = strlen(tail);
    snprintf(out, cap, "%s; stderr: %s", how, tl > room ? tail + (tl - room) : tail);
  } else {
    snprintf(out, cap, "%s", how);
  }
}

/* Starts the worker process (no conversation yet). */
static int spawn_worker(nf_measurer *m, nf_buf *err) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1};
  int rc = NF_EIO;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  int have_fa = 0, have_at = 0;
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(er, O_CLOEXEC)) {
    nf_buf_printf(err, "measure: pipe: %s", strerror(errno));
    goto fail;
  }
  /* the child's ends must not be 0..2 already (dup2 onto itself would
   * keep close-on-exec): move any such one up */
  int *child[3] = {&in[0], &out[1], &er[1]};
  for (int i = 0; i < 3; i++) {
    if (*child[i] > 2) continue;
    int fd = fcntl(*child[i], F_DUPFD_CLOEXEC, 3);
    if (fd < 0) {
      nf_buf_printf(err, "measure: fcntl: %s", strerror(errno));
      goto fail;
    }
    close(*child[i]);
    *child[i] = fd;
  }
  int e;
  if ((e = posix_spawn_file_actions_init(&fa))) goto spawn_err;
  have_fa = 1;
  if ((e = posix_spawn_file_actions_adddup2(&fa, in[0], 0)) ||
      (e = posix_spawn_file_actions_adddup2(&fa, out[1], 1)) ||
      (e = posix_spawn_file_actions_adddup2(&fa, er[1], 2)))
    goto spawn_err;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  /* descriptors the caller opened without close-on-exec stay ours */
  if ((e = posix_spawn_file_actions_addclosefrom_np(&fa, 3))) goto spawn_err;
#endif
  if ((e = posix_spawnattr_init(&at))) goto spawn_err;
  have_at = 1;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  if ((e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                             POSIX_SPAWN_SETPGROUP)) ||
      (e = posix_spawnattr_setsigmask(&at, &none)) ||
      (e = posix_spawnattr_setsigdefault(&at, &all)) || (e = posix_spawnattr_setpgroup(&at, 0)))
    goto spawn_err;
  char a_parent[40], a_mem[48], a_threads[32], a_cuda[32], a_sm[32], a_name[300];
  snprintf(a_parent, sizeof a_parent, "--parent=%ld", (long)getpid());
  snprintf(a_mem, sizeof a_mem, "--mem-limit=%" PRIu64, m->mem_limit);
  snprintf(a_threads, sizeof a_threads, "--threads=%d", m->n_threads);
  snprintf(a_cuda, sizeof a_cuda, "--cuda=%d", m->gpu_device);
  snprintf(a_sm, sizeof a_sm, "--cuda-sm=%d", m->gpu_sm);
  snprintf(a_name, sizeof a_name, "--cuda-name=%s", m->gpu_name ? m->gpu_name : "");
  char *argv[8] = {m->worker_path, a_parent, a_mem, a_threads};
  int na = 4;
  if (m->gpu) {
    argv[na++] = a_cuda;
    if (m->gpu_sm > 0) argv[na++] = a_sm;
    if (m->gpu_name) argv[na++] = a_name;
  }
  argv[na] = NULL;
  pid_t pid;
  if ((e = posix_spawn(&pid, m->worker_path, &fa, &at, argv, environ))) goto spawn_err;
  m->pid = pid;
  m->to_w = in[1];
  m->from_w = out[0];
  m->err_r = er[0];
  in[1] = out[0] = er[0] = -1;
  for (int i = 0; i < 3; i++) {
    int fd = i == 0 ? m->to_w : i == 1 ? m->from_w : m->err_r;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  m->tail_len = 0;
  rc = NF_OK;
  goto fail;
spawn_err:
  nf_buf_printf(err, "measure: cannot start the worker %s: %s", m->worker_path, strerror(e));
fail:
  if (have_fa) posix_spawn_file_actions_destroy(&fa);
  if (have_at) posix_spawnattr_destroy(&at);
  for (int i = 0; i < 2; i++) {
    close_fd(&in[i]);
    close_fd(&out[i]);
    close_fd(&er[i]);
  }
  return rc;
}

static void put(nf_buf *b, const void *p, size_t n) { nf_buf_add(b, p, n); }

/* Starts a worker and gives it the problem; NF_OK once it is READY, else
 * NF_EIO (or NF_ENOMEM) with a message and no process left behind. */
static int start_worker(nf_measurer *m, nf_buf *err) {
  if (access(m->worker_path, X_OK) != 0) {
    nf_buf_printf(err, "measure: the worker %s is not executable: %s", m->worker_path,
                  strerror(errno));
    return NF_EIO;
  }
  int rc = spawn_worker(m, err);
  if (rc != NF_OK) return rc;
  nf_buf pb = NF_BUF_INIT;
  uint32_t u = NF__MEAS_PROTO_VERSION;
  put(&pb, &u, 4);
  put(&pb, &m->n_in, 4);
  put(&pb, &m->n_out, 4);
  put(&pb, &m->n_copies, 4);
  int32_t i32 = m->warmup;
  put(&pb, &i32, 4);
  i32 = m->max_repeat;
  put(&pb, &i32, 4);
  put(&pb, &m->rtol, 8);
  put(&pb, &m->min_time_ms, 8);
  u = m->bound ? NF__MEAS_PB_BOUNDS : 0;
  put(&pb, &u, 4);
  u = 0;
  put(&pb, &u, 4);
  for (uint32_t i = 0; i < m->n_in + m->n_out; i++) {
    const nf_measure_tensor *t = &m->tensors[i];
    put(&pb, &t->dtype, 1);
    put(&pb, &t->rank, 1);
    put(&pb, t->shape, 8 * (size_t)t->rank);
  }
  if (pb.oom) {
    nf_buf_free(&pb);
    kill_worker(m);
    return NF_ENOMEM;
  }
  int64_t deadline = now_ms() + m->timeout_ms + START_EXTRA_MS;
  int io = send_frame(m, NF__MEAS_F_PROBLEM, pb.data, pb.len, deadline);
  nf_buf_free(&pb);
  for (uint32_t i = 0; io == IO_OK && i < m->n_in; i++)
    io = send_frame(m, NF__MEAS_F_DATA, m->inputs[i], m->bytes[i], deadline);
  for (uint32_t o = 0; io == IO_OK && o < m->n_out; o++)
    io = send_frame(m, NF__MEAS_F_DATA, m->expected[o], (size_t)m->n_elem[m->n_in + o] * 8,
                    deadline);
  for (uint32_t o = 0; io == IO_OK && m->bound && o < m->n_out; o++)
    io = send_frame(m, NF__MEAS_F_DATA, m->bound[o], (size_t)m->n_elem[m->n_in + o] * 8,
                    deadline);
  uint32_t type = 0;
  char msg[NF__MEAS_MAX_MSG + 1];
  size_t len = 0;
  if (io == IO_OK) io = recv_frame(m, &type, msg, &len, deadline);
  if (io == IO_OK && type == NF__MEAS_F_READY) return NF_OK;

  char why[320];
  if (io == IO_OK && type == NF__MEAS_F_FAIL) {
    msg[len] = 0;
    kill_worker(m);
    nf_buf_printf(err, "measure: the worker %s failed to start: %s", m->worker_path, msg);
    return NF_EIO;
  }
  if (io == IO_OK)
    io = IO_PROTO;
  if (io == IO_EOF) {
    describe_death(m, "closed its pipes", why, sizeof why);
  } else {
    int saved = errno;
    kill_worker(m);
    snprintf(why, sizeof why, "%s",
             io == IO_TIMEOUT ? "did not become ready in time"
             : io == IO_PROTO ? "broke the protocol"
                              : strerror(saved));
  }
  nf_buf_printf(err, "measure: the worker %s failed to start: %s", m->worker_path, why);
  return NF_EIO;
}

/* ---- public API ---- */

static void measurer_free_data(nf_measurer *m) {
  for (uint32_t i = 0; m->inputs && i < m->n_in; i++) free(m->inputs[i]);
  for (uint32_t i = 0; m->expected && i < m->n_out; i++) free(m->expected[i]);
  for (uint32_t i = 0; m->bound && i < m->n_out; i++) free(m->bound[i]);
  free(m->inputs);
  free(m->expected);
  free(m->bound);
  free(m->tensors);
  free(m->n_elem);
  free(m->bytes);
  free(m->worker_path);
  free(m->gpu_name);
  free(m);
}

static const char *default_worker(void) {
  const char *env = nf_env(NF_ENV_WORKER);
  if (env && *env) return env;
  if (access(NF_WORKER_BUILD_PATH, X_OK) == 0) return NF_WORKER_BUILD_PATH;
  return NF_WORKER_INSTALL_PATH;
}

static int sat_add(uint64_t *acc, uint64_t v) {
  if (*acc > UINT64_MAX - v) {
    *acc = UINT64_MAX;
    return 1;
  }
  *acc += v;
  return 0;
}

static uint64_t sat_mul(uint64_t a, uint64_t b) {
  return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

int nf_measurer_new(const nf_measure_opts *o, const nf_measure_problem *pb, nf_measurer **out,
                    nf_buf *err) {
  if (out) *out = NULL;
  nf_measure_opts d = {0};
  if (!o) o = &d;
  if (!pb || !out) {
    nf_buf_puts(err, "measure: no problem or no result pointer");
    return NF_EINVAL;
  }
  if (pb->n_outputs == 0 || pb->n_inputs > NF__MEAS_MAX_TENSORS ||
      pb->n_outputs > NF__MEAS_MAX_TENSORS - pb->n_inputs || !pb->tensors || !pb->expected ||
      (pb->n_inputs && !pb->check_inputs)) {
    nf_buf_printf(err, "measure: malformed problem (%u inputs, %u outputs; at least one output, "
                  "%u tensors at most, arrays given)", pb->n_inputs, pb->n_outputs,
                  NF__MEAS_MAX_TENSORS);
    return NF_EINVAL;
  }
  if (!(pb->rtol >= 0 && pb->rtol < INFINITY) || !(o->min_time_ms >= 0 && o->min_time_ms < 1e9) ||
      o->warmup < 0 || o->max_repeat < 0 || o->max_repeat > NF__MEAS_MAX_REPEAT) {
    nf_buf_printf(err, "measure: bad option (rtol %g, min_time_ms %g, warmup %d, max_repeat %d)",
                  pb->rtol, o->min_time_ms, o->warmup, o->max_repeat);
    return NF_EINVAL;
  }
  uint32_t n_t = pb->n_inputs + pb->n_outputs;
  nf_measurer *m = calloc(1, sizeof *m);
  if (!m) return NF_ENOMEM;
  m->pid = -1;
  m->to_w = m->from_w = m->err_r = -1;
  m->n_in = pb->n_inputs;
  m->n_out = pb->n_outputs;
  m->tensors = calloc(n_t, sizeof *m->tensors);
  m->n_elem = calloc(n_t, sizeof *m->n_elem);
  m->bytes = calloc(n_t, sizeof *m->bytes);
  m->inputs = calloc(m->n_in ? m->n_in : 1, sizeof *m->inputs);
  m->expected = calloc(m->n_out, sizeof *m->expected);
  if (pb->bound && !(m->bound = calloc(m->n_out, sizeof *m->bound))) goto oom;
  m->gpu = o->gpu != 0;
  m->gpu_device = o->gpu_device >= 0 && o->gpu_device < 1024 ? o->gpu_device : 0;
  m->gpu_sm = o->gpu_sm > 0 && o->gpu_sm < 10000 ? o->gpu_sm : 0;
  if (o->gpu_name && !(m->gpu_name = strndup(o->gpu_name, 255))) goto oom;
  const char *path = o->worker_path ? o->worker_path : default_worker();
  m->worker_path = strdup(path);
  if (!m->tensors || !m->n_elem || !m->bytes || !m->inputs || !m->expected || !m->worker_path)
    goto oom;
  memcpy(m->tensors, pb->tensors, n_t * sizeof *m->tensors);
  uint64_t in_bytes = 0, out_bytes = 0, ref_bytes = 0;
  for (uint32_t i = 0; i < n_t; i++) {
    const nf_measure_tensor *t = &m->tensors[i];
    if ((t->dtype != NF_F32 && t->dtype != NF_F64 && t->dtype != NF_I32 && t->dtype != NF_I64 &&
         t->dtype != NF_BOOL) ||
        t->rank > NF_MAX_RANK) {
      nf_buf_printf(err, "measure: tensor %u: dtype %u or rank %u not supported (f32, f64, i32, "
                    "i64, bool; rank <= %d)", i, t->dtype, t->rank, NF_MAX_RANK);
      measurer_free_data(m);
      return NF_EINVAL;
    }
    int64_t n = 1;
    for (unsigned k = 0; k < t->rank; k++) {
      int64_t dim = t->shape[k];
      if (dim < 0 || (dim && n > NF__MEAS_MAX_ELEMS / dim)) {
        nf_buf_printf(err, "measure: tensor %u: dimension %u is %" PRId64
                      " (negative, or more than 2^40 elements in all)", i, k, dim);
        measurer_free_data(m);
        return NF_EINVAL;
      }
      n *= dim;
    }
    m->n_elem[i] = n;
    m->bytes[i] = (size_t)n * nf_dtype_size((nf_dtype)t->dtype);
    const void *src = i < m->n_in ? pb->check_inputs[i] : pb->expected[i - m->n_in];
    size_t copy = i < m->n_in ? m->bytes[i] : (size_t)n * 8;
    if (copy && !src) {
      nf_buf_printf(err, "measure: %s %u has no data", i < m->n_in ? "input" : "expected output",
                    i < m->n_in ? i : i - m->n_in);
      measurer_free_data(m);
      return NF_EINVAL;
    }
    void *dst = malloc(copy ? copy : 1);
    if (!dst) goto oom;
    if (copy) memcpy(dst, src, copy);
    if (i < m->n_in) {
      m->inputs[i] = dst;
      in_bytes += m->bytes[i];
    } else {
      m->expected[i - m->n_in] = dst;
      out_bytes += m->bytes[i];
      ref_bytes += copy;
    }
    if (i >= m->n_in && m->bound) {
      /* the bounds travel in full (an absent array: zeros, exact) */
      const double *b = pb->bound[i - m->n_in];
      double *bd = calloc(copy ? copy / 8 : 1, 8);
      if (!bd) goto oom;
      if (b && copy) memcpy(bd, b, copy);
      m->bound[i - m->n_in] = bd;
      ref_bytes += copy;
    }
  }
  m->rtol = pb->rtol > 0 ? pb->rtol : 1e-4;
  m->n_threads = o->n_threads < 1 ? 1 : o->n_threads > 1024 ? 1024 : o->n_threads;
  m->timeout_ms = o->timeout_ms ? o->timeout_ms : 10000;
  m->min_time_ms = o->min_time_ms > 0 ? o->min_time_ms : 40;
  m->warmup = o->warmup ? o->warmup : 1;
  m->max_repeat = o->max_repeat ? (o->max_repeat < 3 ? 3 : o->max_repeat) : 200;
  uint64_t rotate = o->rotate_bytes ? o->rotate_bytes : (uint64_t)32 << 20;
  uint64_t per_copy = in_bytes + out_bytes;
  uint64_t n_copies = per_copy ? rotate / per_copy + (rotate % per_copy != 0) : 1;
  m->n_copies = n_copies < 1 ? 1 : n_copies > NF__MEAS_MAX_COPIES ? NF__MEAS_MAX_COPIES
                                                                  : (uint32_t)n_copies;
  if (o->mem_limit) {
    m->mem_limit = o->mem_limit;
  } else {
    /* pristine inputs + the copies + the expected values, x4, + 1 GiB,
     * + 64 MiB per pool thread (its stack and a malloc arena) */
    uint64_t data = in_bytes;
    sat_add(&data, sat_mul(per_copy, m->n_copies));
    sat_add(&data, ref_bytes);
    m->mem_limit = sat_mul(data, 4);
    sat_add(&m->mem_limit, (uint64_t)1 << 30);
    sat_add(&m->mem_limit, (uint64_t)m->n_threads << 26);
  }
  int rc = start_worker(m, err);
  if (rc != NF_OK) {
    measurer_free_data(m);
    return rc;
  }
  *out = m;
  return NF_OK;
oom:
  measurer_free_data(m);
  nf_buf_puts(err, "measure: out of memory copying the problem");
  return NF_ENOMEM;
}

static void set_res(nf_measure_result *res, int status, const char *fmt, ...) NF_PRINTF(3, 4);
static void set_res(nf_measure_result *res, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->reason, sizeof res->reason, fmt, ap);
  va_end(ap);
  res->status = status;
}

int nf_measure(nf_measurer *m, const void *so, size_t n, nf_measure_result *res) {
  memset(res, 0, sizeof *res);
  res->status = NF_MEAS_ERROR;
  if (!m) {
    set_res(res, NF_MEAS_ERROR, "measure: no measurer");
    return NF_EINVAL;
  }
  if (m->pid < 0) {
    nf_buf e = NF_BUF_INIT;
    int rc = start_worker(m, &e);
    if (rc != NF_OK) {
      set_res(res, NF_MEAS_ERROR, "%s", e.oom ? "measure: out of memory" : nf_buf_str(&e));
      nf_buf_free(&e);
      return rc == NF_ENOMEM ? NF_ENOMEM : NF_EIO;
    }
    nf_buf_free(&e);
  }
  if (!so || n == 0) {
    set_res(res, NF_MEAS_LOAD, "empty candidate");
    return NF_OK;
  }
  if ((uint64_t)n > NF__MEAS_MAX_SO) {
    set_res(res, NF_MEAS_LOAD, "candidate of %zu bytes (at most %" PRIu64 ")", n, NF__MEAS_MAX_SO);
    return NF_OK;
  }
  m->tail_len = 0;
  int64_t deadline = now_ms() + m->timeout_ms;
  int io = send_frame(m, NF__MEAS_F_CUTOFF, &m->cutoff_ms, sizeof m->cutoff_ms, deadline);
  if (io == IO_OK) io = send_frame(m, NF__MEAS_F_CANDIDATE, so, n, deadline);
  uint32_t type = 0;
  char buf[NF__MEAS_MAX_MSG + 1];
  size_t len = 0;
  if (io == IO_OK) io = recv_frame(m, &type, buf, &len, deadline);
  if (io == IO_OK && type == NF__MEAS_F_RESULT) {
    int32_t st, n_runs;
    double med, mn, err;
    memcpy(&st, buf, 4);
    memcpy(&n_runs, buf + 4, 4);
    memcpy(&med, buf + 8, 8);
    memcpy(&mn, buf + 16, 8);
    memcpy(&err, buf + 24, 8);
    int ok_status = st == NF_MEAS_OK || st == NF_MEAS_WRONG || st == NF_MEAS_LOAD;
    int min_runs = m->cutoff_ms > 0 ? 1 : 3;
    int ok_times = st != NF_MEAS_OK || (n_runs >= min_runs && n_runs <= m->max_repeat && mn >= 0 &&
                                        med >= mn && med < 1e12);
    if (ok_status && ok_times && !isnan(err) && err >= 0) {
      res->status = st;
      res->n_runs = st == NF_MEAS_OK ? n_runs : 0;
      res->median_ms = st == NF_MEAS_OK ? med : 0;
      res->min_ms = st == NF_MEAS_OK ? mn : 0;
      res->max_rel_err = err;
      size_t rl = len - NF__MEAS_RESULT_FIXED;
      for (size_t i = 0; i < rl; i++) {
        unsigned char c = (unsigned char)buf[NF__MEAS_RESULT_FIXED + i];
        res->reason[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
      }
      res->reason[rl] = 0;
      return NF_OK;
    }
    io = IO_PROTO;
  } else if (io == IO_OK && type == NF__MEAS_F_FAIL) {
    buf[len] = 0;
    kill_worker(m);
    set_res(res, NF_MEAS_ERROR, "measure: the worker failed: %s", buf);
    return NF_OK;
  } else if (io == IO_OK) {
    io = IO_PROTO;
  }

  char why[sizeof res->reason];
  switch (io) {
  case IO_TIMEOUT:
    kill_worker(m);
    set_res(res, NF_MEAS_TIMEOUT, "timed out after %u ms", m->timeout_ms);
    break;
  case IO_EOF:
    describe_death(m, "closed its pipes", why, sizeof why);
    set_res(res, NF_MEAS_CRASH, "%s", why);
    break;
  case IO_PROTO:
    /* a candidate that scribbled over the worker can make it send
     * anything: the candidate's fault */
    kill_worker(m);
    set_res(res, NF_MEAS_CRASH, "the worker broke the protocol (memory corrupted?)");
    break;
  default: {
    int saved = errno;
    kill_worker(m);
    set_res(res, NF_MEAS_ERROR, "measure: talking to the worker: %s", strerror(saved));
    break;
  }
  }
  return NF_OK;
}

void nf_measurer_free(nf_measurer *m) {
  if (!m) return;
  if (m->pid > 0) {
    /* ask it to leave, then close its stdin (EOF means the same) */
    send_frame(m, NF__MEAS_F_EXIT, NULL, 0, now_ms() + EXIT_GRACE_MS);
    close_fd(&m->to_w);
    int st, killed;
    reap(m, EXIT_GRACE_MS, &st, &killed);
  }
  measurer_free_data(m);
}
