/* net.c - neoflowd's listening sockets and peer checks (see nfd_net.h).
 *
 * The Unix socket's safety rests on its directory: it is created by us
 * (0700, or 0750 with a group) or, when it exists, accepted only after
 * lstat shows a real directory owned by our effective uid with no group
 * or other write bit and no access for other.  The socket file itself is
 * bound under umask 077 and then set to exactly 0600 (0660 and the group
 * when one is configured).  Before a socket file is replaced, a connect()
 * probe tells a stale file (ECONNREFUSED: unlinked, bound again) from a
 * live daemon ("already running", its pid from SO_PEERCRED).
 *
 * TCP addresses are numeric only (getaddrinfo with AI_NUMERICHOST |
 * AI_NUMERICSERV) and a non-loopback address needs a key.
 *
 * Invariants: every fd handed out is non-blocking and close-on-exec; on
 * failure no fd is leaked and a socket file we bound is removed; a path
 * that is not a socket is never unlinked.  Not thread-safe where it
 * touches the umask: start-up code only. */
#include "nfd_net.h"
#include "nf_env.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SD_LISTEN_FDS_START 3
#define SD_LISTEN_FDS_MAX 1024 /* far above any sane unit */

/* ---- the socket directory ---- */

/* The lstat checks on an existing path. */
static int check_dir(const char *dir, nf_buf *err) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    nf_buf_printf(err, "socket directory %s: %s", dir, strerror(errno));
    return NF_EIO;
  }
  if (S_ISLNK(st.st_mode)) {
    nf_buf_printf(err, "socket directory %s is a symlink: refusing it (another user could "
                       "point it elsewhere)", dir);
    return NF_EINVAL;
  }
  if (!S_ISDIR(st.st_mode)) {
    nf_buf_printf(err, "socket directory %s exists and is not a directory", dir);
    return NF_EINVAL;
  }
  if (st.st_uid != geteuid()) {
    nf_buf_printf(err, "socket directory %s is owned by uid %lu, not by us (uid %lu): "
                       "refusing it", dir, (unsigned long)st.st_uid, (unsigned long)geteuid());
    return NF_EINVAL;
  }
  unsigned mode = (unsigned)st.st_mode & 07777;
  if (mode & (S_IWGRP | S_IWOTH)) {
    nf_buf_printf(err, "socket directory %s has mode %04o: writable by group or other, "
                       "refusing it (use 0700, or 0750 with a group)", dir, mode);
    return NF_EINVAL;
  }
  if (mode & S_IRWXO) {
    nf_buf_printf(err, "socket directory %s has mode %04o: other users have access, "
                       "refusing it (use 0700, or 0750 with a group)", dir, mode);
    return NF_EINVAL;
  }
  return NF_OK;
}

int nfd_prepare_socket_dir(const char *dir, gid_t gid, nf_buf *err) {
  if (!dir || !dir[0]) {
    nf_buf_puts(err, "socket directory: empty path");
    return NF_EINVAL;
  }
  mode_t old = umask(077);
  int made = mkdir(dir, 0700) == 0;
  int e = errno;
  umask(old);
  if (!made && e != EEXIST) {
    nf_buf_printf(err, "cannot create socket directory %s: %s", dir, strerror(e));
    return NF_EIO;
  }
  if (made && gid != (gid_t)-1) {
    /* Through an fd opened without following links, so the directory we
     * change is the one we just made. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fchown(dfd, (uid_t)-1, gid) != 0 || fchmod(dfd, 0750) != 0) {
      e = errno;
      if (dfd >= 0) close(dfd);
      nf_buf_printf(err, "socket directory %s: cannot give it group %lu: %s", dir,
                    (unsigned long)gid, strerror(e));
      return NF_EIO;
    }
    close(dfd);
  }
  return check_dir(dir, err);
}

/* ---- the Unix socket ---- */

static int fill_sun(const char *path, struct sockaddr_un *sa, nf_buf *err) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  size_t len = path ? strlen(path) : 0;
  if (len == 0) {
    nf_buf_puts(err, "socket path is empty");
    return NF_EINVAL;
  }
  if (len >= sizeof sa->sun_path) {
    nf_buf_printf(err, "socket path %s is too long (%zu bytes, at most %zu)", path, len,
                  sizeof sa->sun_path - 1);
    return NF_EINVAL;
  }
  memcpy(sa->sun_path, path, len + 1);
  return NF_OK;
}

/* Binds fd to sa under umask 077; errno on failure. */
static int bind_private(int fd, const struct sockaddr_un *sa) {
  mode_t old = umask(077);
  int r = bind(fd, (const struct sockaddr *)sa, sizeof *sa);
  int e = errno;
  umask(old);
  errno = e;
  return r;
}

/* Probes an existing socket file: 1 stale (refused), 0 live (*pid set when
 * known, else 0), -1 other error (errno), -2 the file is gone. */
static int probe_socket(const struct sockaddr_un *sa, pid_t *pid) {
  *pid = 0;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int r = connect(fd, (const struct sockaddr *)sa, sizeof *sa);
  int e = errno;
  int res;
  if (r == 0) {
    struct ucred cr;
    socklen_t n = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) == 0) *pid = cr.pid;
    res = 0;
  } else if (e == EAGAIN || e == EINPROGRESS) {
    res = 0; /* a listener with a full backlog: alive */
  } else if (e == ECONNREFUSED) {
    res = 1;
  } else if (e == ENOENT) {
    res = -2;
  } else {
    res = -1;
  }
  close(fd);
  errno = e;
  return res;
}

/* After bind: reports what failed (errno), closes s, removes the file. */
static int unix_fail(int s, const char *path, const char *what, nf_buf *err) {
  nf_buf_printf(err, "%s %s: %s", what, path, strerror(errno));
  close(s);
  unlink(path);
  return NF_EIO;
}

int nfd_listen_unix(const char *path, gid_t gid, int backlog, int *fd, nf_buf *err) {
  struct sockaddr_un sa;
  int rc = fill_sun(path, &sa, err);
  if (rc != NF_OK) return rc;
  NF_ASSERT(path); /* fill_sun refuses NULL; tells GCC's UBSan build too */
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    nf_buf_printf(err, "socket(AF_UNIX): %s", strerror(errno));
    return NF_EIO;
  }
  int bound = bind_private(s, &sa) == 0;
  for (int attempt = 0; !bound && errno == EADDRINUSE && attempt < 2; attempt++) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
      nf_buf_printf(err, "%s exists and is not a socket: refusing to replace it", path);
      close(s);
      return NF_EINVAL;
    }
    pid_t pid;
    int p = probe_socket(&sa, &pid);
    if (p == 0) {
      if (pid > 0)
        nf_buf_printf(err, "already running (pid %ld) on %s", (long)pid, path);
      else
        nf_buf_printf(err, "already running on %s", path);
      close(s);
      return NF_EIO;
    }
    if (p == -1) {
      nf_buf_printf(err, "%s exists and cannot be probed: %s", path, strerror(errno));
      close(s);
      return NF_EIO;
    }
    if (p == 1 && unlink(path) != 0 && errno != ENOENT) {
      nf_buf_printf(err, "cannot remove the stale socket %s: %s", path, strerror(errno));
      close(s);
      return NF_EIO;
    }
    bound = bind_private(s, &sa) == 0;
  }
  if (!bound) {
    nf_buf_printf(err, "bind %s: %s", path, strerror(errno));
    close(s);
    return NF_EIO;
  }
  /* The mode of a socket file can only be set through its path; it lies
   * in our private directory, so the path is ours. */
  if (gid != (gid_t)-1 && lchown(path, (uid_t)-1, gid) != 0)
    return unix_fail(s, path, "chown", err);
  if (chmod(path, gid != (gid_t)-1 ? 0660 : 0600) != 0) return unix_fail(s, path, "chmod", err);
  if (listen(s, backlog) != 0) return unix_fail(s, path, "listen", err);
  *fd = s;
  return NF_OK;
}

/* ---- TCP ---- */

static int is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
  }
  return 0;
}

int nfd_parse_tcp_spec(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                       int *loopback, nf_buf *err) {
  char host[256];
  const char *port;
  size_t n = strlen(spec);
  if (n == 0 || n >= sizeof host) {
    nf_buf_printf(err, "'%s' is not host:port", spec);
    return NF_EINVAL;
  }
  if (spec[0] == '[') {
    const char *close = strchr(spec, ']');
    if (!close || close[1] != ':') {
      nf_buf_printf(err, "'%s' is not [ipv6]:port", spec);
      return NF_EINVAL;
    }
    memcpy(host, spec + 1, (size_t)(close - spec - 1));
    host[close - spec - 1] = 0;
    port = close + 2;
  } else {
    const char *colon = strrchr(spec, ':');
    if (!colon || memchr(spec, ':', (size_t)(colon - spec))) {
      nf_buf_printf(err, "'%s' is not host:port (write IPv6 addresses as [::1]:7117)", spec);
      return NF_EINVAL;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    port = colon + 1;
  }
  if (!host[0]) {
    nf_buf_printf(err, "'%s' has no host (use 127.0.0.1, or 0.0.0.0 for every address)", spec);
    return NF_EINVAL;
  }
  size_t np = strlen(port);
  int port_ok = np > 0 && np <= 5;
  long pv = 0;
  for (size_t i = 0; port_ok && i < np; i++) {
    if (port[i] < '0' || port[i] > '9')
      port_ok = 0;
    else
      pv = pv * 10 + (port[i] - '0');
  }
  if (!port_ok || pv > 65535) {
    nf_buf_printf(err, "'%s': the port must be a number in 0..65535", spec);
    return NF_EINVAL;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  int g = getaddrinfo(host, port, &hints, &res);
  if (g != 0 || !res) {
    nf_buf_printf(err, "'%s': '%s' is not a numeric IP address (%s)", spec, host,
                  g ? gai_strerror(g) : "no result");
    if (res) freeaddrinfo(res);
    return NF_EINVAL;
  }
  if (res->ai_addrlen > sizeof(struct sockaddr_storage)) {
    freeaddrinfo(res);
    nf_buf_printf(err, "'%s': unexpected address size", spec);
    return NF_EINVAL;
  }
  *loopback = is_loopback(res->ai_addr);
  if (ss) memcpy(ss, res->ai_addr, res->ai_addrlen);
  if (len) *len = res->ai_addrlen;
  freeaddrinfo(res);
  return NF_OK;
}

int nfd_listen_tcp(const char *spec, int have_key, int backlog, int *fd, nf_buf *err) {
  struct sockaddr_storage ss;
  socklen_t len = 0;
  int loopback = 0;
  int rc = nfd_parse_tcp_spec(spec, &ss, &len, &loopback, err);
  if (rc != NF_OK) return rc;
  if (!loopback && !have_key) {
    nf_buf_printf(err, "refusing to listen on %s without [tcp] key_file: anyone who can reach "
                       "it could submit work", spec);
    return NF_EINVAL;
  }
  int s = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    nf_buf_printf(err, "socket for %s: %s", spec, strerror(errno));
    return NF_EIO;
  }
  int one = 1;
  const char *what = NULL;
  if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    what = "SO_REUSEADDR";
  else if (ss.ss_family == AF_INET6 &&
           setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0)
    what = "IPV6_V6ONLY";
  else if (bind(s, (struct sockaddr *)&ss, len) != 0)
    what = "bind";
  else if (listen(s, backlog) != 0)
    what = "listen";
  if (what) {
    nf_buf_printf(err, "%s %s: %s", what, spec, strerror(errno));
    close(s);
    return NF_EIO;
  }
  *fd = s;
  return NF_OK;
}

/* ---- systemd socket activation ---- */

/* A decimal number: digits only, no sign or blanks, at most max. */
static int parse_count(const char *s, long max, long *out) {
  long v = 0;
  if (!s[0]) return 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return 0;
    if (v > (max - (*p - '0')) / 10) return 0;
    v = v * 10 + (*p - '0');
  }
  *out = v;
  return 1;
}

static void unset_listen_env(void) {
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
}

int nfd_systemd_fds(int *fds, int max, int *n, nf_buf *err) {
  *n = 0;
  const char *e_pid = nf_env(NF_ENV_LISTEN_PID);
  if (!e_pid) return NF_OK;
  const char *e_fds = nf_env(NF_ENV_LISTEN_FDS);
  long pid = 0, count = 0;
  int rc = NF_OK;
  if (!parse_count(e_pid, INT_MAX, &pid) || pid == 0) {
    nf_buf_printf(err, "LISTEN_PID='%s' is not a process id", e_pid);
    rc = NF_EINVAL;
  } else if (pid != (long)getpid()) {
    rc = NF_OK; /* meant for another process (inherited): ignore */
  } else if (!e_fds) {
    rc = NF_OK; /* as sd_listen_fds: no fds passed */
  } else if (!parse_count(e_fds, SD_LISTEN_FDS_MAX, &count)) {
    nf_buf_printf(err, "LISTEN_FDS='%s' is not a number of sockets (0..%d)", e_fds,
                  SD_LISTEN_FDS_MAX);
    rc = NF_EINVAL;
  } else if (count > max) {
    nf_buf_printf(err, "systemd passed %ld sockets; at most %d are supported", count, max);
    rc = NF_EINVAL;
  } else {
    /* Every fd is checked before any is changed, so a bad count leaves
     * the process's other descriptors as they were. */
    for (long i = 0; i < count && rc == NF_OK; i++) {
      int fd = SD_LISTEN_FDS_START + (int)i;
      if (fcntl(fd, F_GETFD) < 0) {
        nf_buf_printf(err, "LISTEN_FDS=%ld but fd %d is unusable: %s", count, fd,
                      strerror(errno));
        rc = NF_EINVAL;
      }
    }
    for (long i = 0; i < count && rc == NF_OK; i++) {
      int fd = SD_LISTEN_FDS_START + (int)i;
      int fdfl = fcntl(fd, F_GETFD);
      int fl = fcntl(fd, F_GETFL);
      if (fdfl < 0 || fl < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) != 0 ||
          fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        nf_buf_printf(err, "LISTEN_FDS=%ld: fd %d: %s", count, fd, strerror(errno));
        rc = NF_EINVAL;
      } else {
        fds[i] = fd;
      }
    }
    if (rc == NF_OK) *n = (int)count;
  }
  unset_listen_env();
  return rc;
}

/* ---- peers ---- */

int nfd_socket_is_unix(int fd) {
  int domain = 0, type = 0;
  socklen_t n = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &n) != 0) return -1;
  n = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) != 0 || type != SOCK_STREAM) return -1;
  if (domain == AF_UNIX) return 1;
  if (domain == AF_INET || domain == AF_INET6) return 0;
  return -1;
}

int nfd_peer_cred(int fd, uid_t *uid, pid_t *pid) {
  struct ucred cr;
  socklen_t n = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) != 0 || n != sizeof cr) return NF_EIO;
  /* Sockets without a Unix peer report pid 0 and uid -1: not a peer. */
  if (cr.pid <= 0 || cr.uid == (uid_t)-1) return NF_EIO;
  if (uid) *uid = cr.uid;
  if (pid) *pid = cr.pid;
  return NF_OK;
}

int nfd_uid_allowed(const nfd_config *c, uid_t uid) {
  if (uid == geteuid()) return 1;
  int n = c->n_allowed_uids;
  if (n > NFD_MAX_ALLOWED_UIDS) n = NFD_MAX_ALLOWED_UIDS;
  for (int i = 0; i < n; i++)
    if (c->allowed_uids[i] == uid) return 1;
  return 0;
}

int nfd_group_gid(const char *name, gid_t *gid, nf_buf *err) {
  long v;
  if (parse_count(name, (long)INT_MAX, &v)) {
    *gid = (gid_t)v;
    return NF_OK;
  }
  long sz = sysconf(_SC_GETGR_R_SIZE_MAX);
  size_t cap = sz > 0 ? (size_t)sz : 4096;
  for (;;) {
    char *buf = malloc(cap);
    if (!buf) {
      nf_buf_printf(err, "group %s: out of memory", name);
      return NF_EIO;
    }
    struct group gr, *res = NULL;
    int e = getgrnam_r(name, &gr, buf, cap, &res);
    if (e == ERANGE && cap < ((size_t)1 << 20)) {
      free(buf);
      cap *= 2;
      continue;
    }
    if (e == 0 && res) *gid = res->gr_gid;
    free(buf);
    if (e == 0 && res) return NF_OK;
    if (e == 0 || e == ENOENT || e == ESRCH) {
      nf_buf_printf(err, "no group named '%s'", name);
      return NF_ENOENT;
    }
    nf_buf_printf(err, "group %s: %s", name, strerror(e));
    return NF_EIO;
  }
}
