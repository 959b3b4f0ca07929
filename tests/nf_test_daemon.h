/* nf_test_daemon.h - a neoflowd of a test's own ($NF_NEOFLOWD) on a
 * temporary socket and cache: start, wait until it answers, stop with a
 * signal, remove its directory.  Shared by the Check suites that need a
 * real daemon (test_daemon.c, test_session.c); static functions, one
 * copy per suite. */
#ifndef NF_TEST_DAEMON_H
#define NF_TEST_DAEMON_H

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct dm {
  char dir[256], sock[320], cache[320], conf[320], log[320];
  const char *env; /* "NAME=VALUE" for the daemon, or NULL */
  int nofile;      /* RLIMIT_NOFILE for the daemon (0: inherited) */
  uid_t as_uid;    /* > 0: run the daemon as this uid (root only) */
  const char *exe; /* the daemon's executable (NULL: $NF_NEOFLOWD) */
  pid_t pid;
} dm;

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static inline void dm_init(dm *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/nf_daemon_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d->dir));
  snprintf(d->sock, sizeof d->sock, "%s/run/neoflowd.sock", d->dir);
  snprintf(d->cache, sizeof d->cache, "%s/cache.db", d->dir);
  snprintf(d->conf, sizeof d->conf, "%s/neoflowd.conf", d->dir);
  snprintf(d->log, sizeof d->log, "%s/neoflowd.log", d->dir);
}

/* Writes the configuration: the test's sections after a base. */
static inline void dm_config(dm *d, const char *extra) {
  FILE *f = fopen(d->conf, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "[daemon]\nsocket = %s\nlog_level = debug\n%s\n[cache]\ncache = %s\n", d->sock,
          extra && strstr(extra, "[daemon]") == extra ? extra + 8 : "", d->cache);
  if (extra && strstr(extra, "[daemon]") != extra) fputs(extra, f);
  fclose(f);
}

static inline int try_connect(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n >= sizeof a.sun_path) {
    close(s);
    return -1;
  }
  memcpy(a.sun_path, path, n + 1);
  if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

/* Starts the daemon; waits until its socket answers. */
static inline void dm_start(dm *d) {
  const char *exe = d->exe ? d->exe : getenv("NF_NEOFLOWD");
  ck_assert_msg(exe != NULL, "NF_NEOFLOWD is not set");
  d->pid = fork();
  ck_assert_int_ge(d->pid, 0);
  if (d->pid == 0) {
    if (d->as_uid && (setgid((gid_t)d->as_uid) != 0 || setuid(d->as_uid) != 0)) _exit(126);
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) dup2(fd, 2);
    if (d->env) putenv((char *)d->env);
    if (d->nofile) {
      struct rlimit rl = {(rlim_t)d->nofile, (rlim_t)d->nofile};
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    execl(exe, exe, "--config", d->conf, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    int s = try_connect(d->sock);
    if (s >= 0) {
      close(s);
      return;
    }
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      ck_abort_msg("neoflowd exited at start-up (see %s)", d->log);
    }
    sleep_ms(25);
  }
  ck_abort_msg("neoflowd did not answer on %s within 10 s", d->sock);
}

/* Sends sig and waits; returns the exit status (or 128 + signal). */
static inline int dm_stop(dm *d, int sig) {
  if (d->pid <= 0) return -1;
  kill(d->pid, sig);
  int st = 0;
  for (int i = 0; i < 600; i++) {
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) break;
    if (i == 599) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &st, 0);
    }
    sleep_ms(25);
  }
  d->pid = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline void dm_done(dm *d) {
  if (d->pid > 0) dm_stop(d, SIGKILL);
  if (getenv("NF_TEST_KEEP")) return; /* debugging: keep the directory and its log */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  ck_assert_int_eq(system(cmd), 0);
}

#endif
