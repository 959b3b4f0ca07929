/* link.c - relocatable object bytes -> shared object bytes, in memory.
 *
 * Runs GNU ld (NF_LD_PATH) as a subprocess with posix_spawn: the object,
 * a version script and the output are memfds passed as /proc/self/fd/N
 * (the only descriptors the child inherits besides stdin on /dev/null and
 * stdout/stderr on a fourth memfd that collects ld's messages); every
 * descriptor is close-on-exec in this process, so concurrent spawns never
 * leak each other's files.  Nothing touches the file system.  ld gets a
 * timeout and is killed (SIGKILL) and reaped past it.
 *
 * The result exports NF_KERNEL_SYMBOL only (version script `local: *`),
 * links libm as needed (the f64 math and pow call it), and carries
 * -z now -z noexecstack.  The backend emits no constructors, destructors,
 * TLS or writable globals, so the shared object has none either. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nf_codegen.h"
#include "nf_config.h"
#include "nf_kernel.h"


static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads the whole of fd (from offset 0) into a malloc'ed buffer. */
static int read_fd(int fd, uint8_t **out, size_t *len) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 0) return -1;
  size_t n = (size_t)st.st_size;
  uint8_t *b = malloc(n + 1);
  if (!b) return -1;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, b + got, n - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  b[got] = 0;
  *out = b;
  *len = got;
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int nf_cpu_link(const void *object, size_t n, unsigned timeout_ms, nf_blob *shared_object,
                nf_buf *err) {
  static const char vscript[] = "{ global: " NF_KERNEL_SYMBOL "; local: *; };\n";
  int fd_in = -1, fd_vs = -1, fd_out = -1, fd_err = -1, rc = NF_EIO;
  int fa_ok = 0;
  posix_spawn_file_actions_t fa;
  nf_blob_free(shared_object);
  if (!timeout_ms) timeout_ms = 30000;

  fd_in = memfd_create("nf-link-obj", MFD_CLOEXEC);
  fd_vs = memfd_create("nf-link-vs", MFD_CLOEXEC);
  fd_out = memfd_create("nf-link-so", MFD_CLOEXEC);
  fd_err = memfd_create("nf-link-msg", MFD_CLOEXEC);
  if (fd_in < 0 || fd_vs < 0 || fd_out < 0 || fd_err < 0) {
    nf_buf_printf(err, "link: memfd_create failed: %s", strerror(errno));
    goto done;
  }
  if (write_all(fd_in, object, n) || write_all(fd_vs, vscript, sizeof vscript - 1)) {
    nf_buf_printf(err, "link: cannot write the object: %s", strerror(errno));
    goto done;
  }
  char p_in[40], p_vs[40], p_out[40];
  snprintf(p_in, sizeof p_in, "/proc/self/fd/%d", fd_in);
  snprintf(p_vs, sizeof p_vs, "/proc/self/fd/%d", fd_vs);
  snprintf(p_out, sizeof p_out, "/proc/self/fd/%d", fd_out);
  char *argv[] = {(char *)NF_LD_PATH, "-shared", "-o", p_out, p_in, "--version-script", p_vs,
                  "-z", "now", "-z", "noexecstack", "--hash-style=gnu", "--as-needed",
                  "-lm", "--no-as-needed", "-soname", "nf_kernel.so", NULL};
  char *envp[] = {"LC_ALL=C", "PATH=/usr/bin:/bin", NULL};
  if (posix_spawn_file_actions_init(&fa) != 0) {
    rc = NF_ENOMEM;
    goto done;
  }
  fa_ok = 1;
  /* dup2 onto itself clears FD_CLOEXEC in the child only (POSIX 2018,
   * glibc >= 2.29). */
  if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) ||
      posix_spawn_file_actions_adddup2(&fa, fd_err, 1) ||
      posix_spawn_file_actions_adddup2(&fa, fd_err, 2) ||
      posix_spawn_file_actions_adddup2(&fa, fd_in, fd_in) ||
      posix_spawn_file_actions_adddup2(&fa, fd_vs, fd_vs) ||
      posix_spawn_file_actions_adddup2(&fa, fd_out, fd_out)) {
    rc = NF_ENOMEM;
    goto done;
  }
  pid_t pid;
  int e = posix_spawn(&pid, NF_LD_PATH, &fa, NULL, argv, envp);
  if (e != 0) {
    nf_buf_printf(err, "link: cannot run %s: %s", NF_LD_PATH, strerror(e));
    goto done;
  }
  double deadline = now_ms() + timeout_ms;
  int status = 0, exited = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      exited = 1;
      break;
    }
    if (w < 0 && errno != EINTR) break;
    if (now_ms() > deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      nf_buf_printf(err, "link: %s timed out after %u ms", NF_LD_PATH, timeout_ms);
      goto done;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  if (!exited || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    uint8_t *msg = NULL;
    size_t ml = 0;
    if (!exited)
      nf_buf_printf(err, "link: waiting for %s failed: %s", NF_LD_PATH, strerror(errno));
    else if (WIFEXITED(status))
      nf_buf_printf(err, "link: %s exited with status %d", NF_LD_PATH, WEXITSTATUS(status));
    else
      nf_buf_printf(err, "link: %s killed by signal %d", NF_LD_PATH, WTERMSIG(status));
    if (read_fd(fd_err, &msg, &ml) == 0 && ml) {
      nf_buf_puts(err, ": ");
      nf_buf_add(err, msg, ml > 2000 ? 2000 : ml);
    }
    free(msg);
    goto done;
  }
  if (read_fd(fd_out, &shared_object->data, &shared_object->len) != 0) {
    nf_buf_printf(err, "link: cannot read the output: %s", strerror(errno));
    goto done;
  }
  if (shared_object->len < 64) {
    nf_buf_puts(err, "link: ld produced no output");
    nf_blob_free(shared_object);
    goto done;
  }
  rc = NF_OK;
done:
  if (fa_ok) posix_spawn_file_actions_destroy(&fa);
  if (fd_in >= 0) close(fd_in);
  if (fd_vs >= 0) close(fd_vs);
  if (fd_out >= 0) close(fd_out);
  if (fd_err >= 0) close(fd_err);
  return rc;
}
