/* neoflowd.c - the daemon's entry point: options, configuration, the
 * listening sockets (systemd's or our own), the cache, then the event
 * loop (server.c); and `neoflowd --job`, the job process (job_main.c).
 *
 * Exit status: 0 after a clean shutdown (SIGTERM, SIGINT), 1 when the
 * daemon cannot start (the reason on stderr: configuration, an unsafe
 * socket directory, another daemon running, a cache that is not ours or
 * is damaged), 2 for a usage error. */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nf_codegen.h"
#include "nf_config.h"
#include "nf_nvrtc_link.h"
#include "nf_nvrtc_link.h"
#include "nf_wire_auth.h"
#include "nf_wire_sign.h"
#include "nfd_int.h"
#include "nfd_net.h"
#include "nf_env.h"

int nfd_job_main(void);

int nfd_verbosity = NFD_LOG_INFO;

void nfd_log(int level, const char *fmt, ...) {
  if (level > nfd_verbosity) return;
  static const char *names[] = {"error", "warning", "info", "debug"};
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ neoflowd[%d] %s: %s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
          (int)getpid(), names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

void nfd_burst_log(nfd_burst *b, const char *fmt, ...) {
  double now = nfd_now();
  if (b->last > 0 && now - b->last < 10.0) {
    b->held++;
    return;
  }
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (b->held)
    nfd_log(NFD_LOG_WARN, "%s (and %llu more like it in the last %.0f s)", msg,
            (unsigned long long)b->held, now - b->last);
  else
    nfd_log(NFD_LOG_WARN, "%s", msg);
  b->held = 0;
  b->last = now;
}

double nfd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
  fputs("usage: neoflowd [--config FILE] [--socket PATH] [--cache PATH] [--tcp HOST:PORT]\n"
        "                [--log-level error|warn|info|debug] [--allow-network-fs]\n"
        "                [--print-config] [--public-key] [--version]\n"
        "The NeoFlow compile daemon: serves kernels from its tuning cache, compiles\n"
        "and tunes the rest.  See docs/daemon.md.\n"
        "  --config FILE     INI configuration (default: $XDG_CONFIG_HOME/neoflow/neoflowd.conf\n"
        "                    or /etc/neoflow/neoflowd.conf when it exists)\n"
        "  --socket PATH     Unix socket (default: $NEOFLOW_SOCKET, see docs/daemon.md)\n"
        "  --cache PATH      tuning cache database (default: $NEOFLOW_CACHE, ...)\n"
        "  --tcp HOST:PORT   also listen on TCP (non-loopback needs [tcp] key_file)\n"
        "  --print-config    print the effective configuration and exit\n"
        "  --public-key      print this daemon's public signing key (made on first use)\n"
        "                    and exit: what users put in trust_key (docs/security.md)\n",
        f);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("neoflowd: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

static int copy_opt(char *dst, size_t n, const char *v, const char *what) {
  if (strlen(v) >= n) {
    fprintf(stderr, "neoflowd: %s: too long (at most %zu bytes)\n", what, n - 1);
    return -1;
  }
  memcpy(dst, v, strlen(v) + 1);
  return 0;
}

static void print_config(const nfd_config *c) {
  printf("config        %s\n", c->config_path[0] ? c->config_path : "(none)");
  printf("socket        %s\n", c->socket_path);
  printf("socket_group  %s\n", c->socket_group[0] ? c->socket_group : "(none)");
  printf("cache         %s\n", c->cache_path);
  printf("tcp listen    %s\n", c->tcp_listen[0] ? c->tcp_listen : "(off)");
  printf("max_connections %d, max_requests %d, max_queued_jobs %d\n", c->max_connections,
         c->max_requests, c->max_queued_jobs);
  printf("timeouts      handshake %d ms, progress %d ms, idle %d s\n", c->handshake_timeout_ms,
         c->progress_timeout_ms, c->idle_timeout_s);
  printf("output limits soft %lld, hard %lld bytes, %d s\n", (long long)c->output_soft_limit,
         (long long)c->output_hard_limit, c->output_soft_seconds);
  printf("jobs          compile %d, tune %d; trials %d (max %d); seconds %d (max %d)\n",
         c->compile_jobs, c->tune_jobs, c->default_trials, c->max_trials, c->default_seconds,
         c->max_seconds);
  printf("subgraph caps max_elements %lld, max_gflops %lld\n", (long long)c->max_elements,
         (long long)c->max_gflops);
  printf("log_level     %s\n", nfd_log_level_name(c->log_level));
}

/* The configuration file named by --config, else the first that exists of
 * $XDG_CONFIG_HOME/neoflow/neoflowd.conf (~/.config/...) and
 * /etc/neoflow/neoflowd.conf. */
static const char *default_config(char *buf, size_t n) {
  const char *x = nf_env(NF_ENV_XDG_CONFIG_HOME), *h = nf_env(NF_ENV_HOME);
  if (x && *x) snprintf(buf, n, "%s/neoflow/neoflowd.conf", x);
  else if (h && *h) snprintf(buf, n, "%s/.config/neoflow/neoflowd.conf", h);
  else buf[0] = 0;
  if (buf[0] && access(buf, R_OK) == 0) return buf;
  if (access("/etc/neoflow/neoflowd.conf", R_OK) == 0) return "/etc/neoflow/neoflowd.conf";
  return NULL;
}

/* Creates the missing directories above the cache file (0700: the cache
 * holds the user's kernels), so that a first start - an auto-started
 * per-user daemon, root's /var/lib/neoflowd - finds its place.  Existing
 * directories are left as they are; the cache checks them. */
static int make_cache_dirs(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return 0;
  char *slash = strrchr(buf, '/');
  if (!slash || slash == buf) return 0;
  *slash = 0;
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p) continue;
    char c = *p;
    *p = 0;
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
      return fail("cache %s: cannot create directory %s: %s", path, buf, strerror(errno));
    if (!c) break;
    *p = c;
  }
  return 0;
}

/* signing.key beside the cache database. */
static const char *signing_key_path(const nfd_config *c, char *buf, size_t n) {
  const char *slash = strrchr(c->cache_path, '/');
  int len = slash ? snprintf(buf, n, "%.*s/signing.key", (int)(slash - c->cache_path),
                             c->cache_path)
                  : snprintf(buf, n, "signing.key");
  return len > 0 && (size_t)len < n ? buf : NULL;
}

static int add_listener(nfd_server *S, int fd, int tcp) {
  if (S->n_listeners == NFD_MAX_LISTENERS) return fail("too many listening sockets");
  nfd_listener *L = &S->listeners[S->n_listeners];
  int rc = tcp ? uv_tcp_init(S->loop, &L->h.tcp) : uv_pipe_init(S->loop, &L->h.pipe, 0);
  if (rc == 0) rc = tcp ? uv_tcp_open(&L->h.tcp, fd) : uv_pipe_open(&L->h.pipe, fd);
  if (rc != 0) return fail("cannot use a listening socket: %s", uv_strerror(rc));
  L->tcp = tcp;
  L->open = 1;
  S->n_listeners++;
  return 0;
}

static int setup_sockets(nfd_server *S) {
  nf_buf err = NF_BUF_INIT;
  int fds[NFD_MAX_LISTENERS], n = 0;
  if (nfd_systemd_fds(fds, NFD_MAX_LISTENERS, &n, &err) != NF_OK) {
    int r = fail("socket activation: %s", nf_buf_str(&err));
    nf_buf_free(&err);
    return r;
  }
  if (n > 0) {
    for (int i = 0; i < n; i++) {
      int kind = nfd_socket_is_unix(fds[i]);
      if (kind < 0 || add_listener(S, fds[i], kind == 0)) {
        nf_buf_free(&err);
        return fail("socket activation: fd %d is not a stream socket", fds[i]);
      }
    }
    NFD_INFO("listening on %d socket(s) from systemd", n);
    nf_buf_free(&err);
    return 0;
  }
  gid_t gid = (gid_t)-1;
  if (S->cfg.socket_group[0] && nfd_group_gid(S->cfg.socket_group, &gid, &err) != NF_OK) {
    int r = fail("socket_group: %s", nf_buf_str(&err));
    nf_buf_free(&err);
    return r;
  }
  char dir[4096];
  nfd_config_socket_dir(&S->cfg, dir, sizeof dir);
  int fd = -1;
  if (nfd_prepare_socket_dir(dir, gid, &err) != NF_OK ||
      nfd_listen_unix(S->cfg.socket_path, gid, 511, &fd, &err) != NF_OK) {
    int r = fail("%s: %s", S->cfg.socket_path, nf_buf_str(&err));
    nf_buf_free(&err);
    return r;
  }
  memcpy(S->unix_path, S->cfg.socket_path, sizeof S->unix_path);
  if (add_listener(S, fd, 0)) return 1;
  NFD_INFO("listening on %s", S->cfg.socket_path);
  if (S->cfg.tcp_listen[0]) {
    if (S->cfg.tcp_key_file[0]) {
      if (nf_auth_load_key(S->cfg.tcp_key_file, S->tcp_key, &err) != NF_OK) {
        int r = fail("[tcp] key_file %s: %s", S->cfg.tcp_key_file, nf_buf_str(&err));
        nf_buf_free(&err);
        return r;
      }
      S->have_tcp_key = 1;
    }
    if (nfd_listen_tcp(S->cfg.tcp_listen, S->have_tcp_key, 511, &fd, &err) != NF_OK) {
      int r = fail("tcp %s: %s", S->cfg.tcp_listen, nf_buf_str(&err));
      nf_buf_free(&err);
      return r;
    }
    if (add_listener(S, fd, 1)) return 1;
    if (!S->have_tcp_key)
      NFD_WARN("tcp %s without a key: every local user can submit work", S->cfg.tcp_listen);
    NFD_INFO("listening on tcp %s%s", S->cfg.tcp_listen,
             S->have_tcp_key ? " (challenge-response with the key)" : "");
  }
  nf_buf_free(&err);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--job") == 0) return nfd_job_main();
  static nfd_server S;
  nfd_config_defaults(&S.cfg);
  const char *config = NULL, *sock = NULL, *cache = NULL, *tcp = NULL, *level = NULL;
  int print = 0, print_pk = 0, allow_nfs = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **dst = NULL;
    if (!strcmp(a, "--config")) dst = &config;
    else if (!strcmp(a, "--socket")) dst = &sock;
    else if (!strcmp(a, "--cache")) dst = &cache;
    else if (!strcmp(a, "--tcp")) dst = &tcp;
    else if (!strcmp(a, "--log-level")) dst = &level;
    else if (!strcmp(a, "--print-config")) print = 1;
    else if (!strcmp(a, "--public-key")) print_pk = 1;
    else if (!strcmp(a, "--allow-network-fs")) allow_nfs = 1;
    else if (!strcmp(a, "--version")) {
      printf("neoflowd %s\n", NF_VERSION);
      return 0;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "neoflowd: unknown option '%s'\n", a);
      usage(stderr);
      return 2;
    }
    if (dst) {
      if (i + 1 >= argc) {
        fprintf(stderr, "neoflowd: %s needs a value\n", a);
        return 2;
      }
      *dst = argv[++i];
    }
  }
  nf_buf err = NF_BUF_INIT;
  char cbuf[4096];
  if (!config) config = default_config(cbuf, sizeof cbuf);
  if (config && nfd_config_load(&S.cfg, config, &err) != NF_OK) {
    fail("%s", nf_buf_str(&err));
    nf_buf_free(&err);
    return NFD_EXIT_CONFIG; /* restarting would not help: systemd stops */
  }
  if ((sock && copy_opt(S.cfg.socket_path, sizeof S.cfg.socket_path, sock, "--socket")) ||
      (cache && copy_opt(S.cfg.cache_path, sizeof S.cfg.cache_path, cache, "--cache")) ||
      (tcp && copy_opt(S.cfg.tcp_listen, sizeof S.cfg.tcp_listen, tcp, "--tcp")))
    return 2;
  if (allow_nfs) S.cfg.allow_network_fs = 1;
  if (level) {
    int l = -1;
    for (int k = 0; k <= NFD_LOG_DEBUG; k++)
      if (!strcmp(level, nfd_log_level_name(k))) l = k;
    if (l < 0) {
      fprintf(stderr, "neoflowd: --log-level: expected error, warn, info or debug\n");
      return 2;
    }
    S.cfg.log_level = l;
  }
  if (nfd_config_check(&S.cfg, &err) != NF_OK) {
    fail("%s", nf_buf_str(&err));
    nf_buf_free(&err);
    return NFD_EXIT_CONFIG;
  }
  if (print) {
    print_config(&S.cfg);
    return 0;
  }
  /* the daemon's identity: every kernel it serves is signed with it */
  char kbuf[4096];
  const char *kpath = S.cfg.signing_key[0] ? S.cfg.signing_key : signing_key_path(&S.cfg, kbuf,
                                                                                   sizeof kbuf);
  if (!kpath) return fail("signing key: the path beside the cache %s is too long",
                          S.cfg.cache_path);
  if (!S.cfg.signing_key[0] && make_cache_dirs(S.cfg.cache_path)) return 1;
  int created = 0;
  if (nf_sign_load_key(kpath, 1, S.sign_sk, S.sign_pk, &created, &err) != NF_OK) {
    int r = fail("signing key: %s (a damaged key file must be removed by hand: clients that "
                 "pinned its public key will then refuse this daemon until told the new one)",
                 nf_buf_str(&err));
    nf_buf_free(&err);
    return r;
  }
  char pktext[NF_SIGN_PK_TEXT];
  nf_sign_format_public(S.sign_pk, pktext);
  if (print_pk) {
    printf("%s\n", pktext);
    return 0;
  }
  nfd_verbosity = S.cfg.log_level;
  signal(SIGPIPE, SIG_IGN);
  ssize_t n = readlink("/proc/self/exe", S.exe_path, sizeof S.exe_path - 1);
  if (n <= 0) return fail("cannot find my own executable (/proc/self/exe)");
  S.exe_path[n] = 0;
  nf_host_target_get(&S.target);
  nf_cpu_codegen_version(S.codegen_version, sizeof S.codegen_version);
  nf_cuda_codegen_version(S.cuda_codegen, sizeof S.cuda_codegen);

  /* the cache first: the writer's lock names a daemon already running;
   * then the event loop's own read-only handle */
  if (make_cache_dirs(S.cfg.cache_path)) return 1;
  if (nfd_writer_start(&S, &err) != NF_OK) {
    int r = fail("cache %s: %s", S.cfg.cache_path, nf_buf_str(&err));
    nf_buf_free(&err);
    return r;
  }
  nf_cache_opts co = {.read_only = 1, .allow_network_fs = S.cfg.allow_network_fs};
  if (nf_cache_open(S.cfg.cache_path, &co, &S.cache, &err) != NF_OK) {
    int r = fail("cache %s: %s", S.cfg.cache_path, nf_buf_str(&err));
    nf_buf_free(&err);
    nfd_writer_stop(&S);
    return r;
  }
  nf_buf_free(&err);
  S.loop = uv_default_loop();
  if (setup_sockets(&S)) {
    nfd_writer_stop(&S);
    nf_cache_close(S.cache);
    return 1;
  }
  NFD_INFO("neoflowd %s (pid %d): cache %s; target %s; %s", NF_VERSION, (int)getpid(),
           S.cfg.cache_path, S.target.description, S.codegen_version);
  NFD_INFO("signing key %s%s (%s)", pktext, created ? ", new" : "", kpath);
  int rc = nfd_server_run(&S);
  nfd_writer_stop(&S); /* everything queued is written first */
  nf_cache_close(S.cache);
  uv_loop_close(S.loop);
  NFD_INFO("stopped");
  return rc == NF_OK ? 0 : 1;
}
