/* trust.c - the client's trust configuration and socket-directory checks
 * (nf_trust.h, docs/security.md).
 *
 * Invariants: a configuration file is read only through an fd opened
 * without following links and checked with fstat (ours, a regular file,
 * not writable by group or other) before a byte of it is used; a socket
 * directory is judged by lstat, so a symlink is seen as one; nothing here
 * grants trust by default beyond our own uid.
 *
 * Not here: the peer-credential check itself and the signatures (dconn.c,
 * proto/sign.c). */
#include "nf_env.h"
#include "nf_trust.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nf_wire_sign.h"

void nf_trust_uid_name(uid_t uid, char *out, size_t n) {
  struct passwd pw, *res = NULL;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
    snprintf(out, n, "uid %lu (%s)", (unsigned long)uid, res->pw_name);
  else
    snprintf(out, n, "uid %lu", (unsigned long)uid);
}

int nf_trust_uid_ok(const nf_trust *t, uid_t uid) {
  if (uid == geteuid()) return 1;
  for (int i = 0; t && i < t->n_uids; i++)
    if (t->uids[i] == uid) return 1;
  return 0;
}

int nf_trust_key_ok(const nf_trust *t, const uint8_t pk[32]) {
  for (int i = 0; t && i < t->n_keys; i++)
    if (!memcmp(t->keys[i], pk, 32)) return 1;
  return 0;
}

int nf_trust_add_uid(nf_trust *t, const char *spec, nf_buf *err) {
  if (!spec || !*spec) {
    nf_buf_puts(err, "trust_uid: empty");
    return NF_EINVAL;
  }
  uid_t uid;
  char *end = NULL;
  errno = 0;
  unsigned long v = strtoul(spec, &end, 10);
  if (*spec >= '0' && *spec <= '9' && end && !*end && !errno && v < (unsigned long)(uid_t)-1) {
    uid = (uid_t)v;
  } else {
    struct passwd pw, *res = NULL;
    char buf[1024];
    if (getpwnam_r(spec, &pw, buf, sizeof buf, &res) != 0 || !res) {
      nf_buf_printf(err, "trust_uid: no user named '%s' on this machine", spec);
      return NF_EINVAL;
    }
    uid = res->pw_uid;
  }
  if (nf_trust_uid_ok(t, uid)) return NF_OK;
  if (t->n_uids >= NF_TRUST_MAX) {
    nf_buf_printf(err, "trust_uid: more than %d users", NF_TRUST_MAX);
    return NF_EINVAL;
  }
  t->uids[t->n_uids++] = uid;
  return NF_OK;
}

/* Reads a small file's text (a public key file) without following links. */
static int read_small(const char *path, char *out, size_t n, nf_buf *err) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    nf_buf_printf(err, "%s: %s", path, errno == ELOOP ? "a symlink: refusing it" : strerror(errno));
    return NF_EINVAL;
  }
  struct stat st;
  ssize_t got = -1;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    nf_buf_printf(err, "%s: not a readable regular file", path);
    return NF_EINVAL;
  }
  /* it says whom to trust: as guarded as the configuration that names it */
  if ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    char owner[160];
    nf_trust_uid_name(st.st_uid, owner, sizeof owner);
    close(fd);
    nf_buf_printf(err, "%s (owned by %s, mode %04o): a key file must be yours or root's and "
                       "writable by nobody else: refusing it", path, owner,
                  (unsigned)st.st_mode & 07777);
    return NF_EINVAL;
  }
  got = read(fd, out, n - 1);
  close(fd);
  if (got < 0) {
    nf_buf_printf(err, "%s: not a readable regular file", path);
    return NF_EINVAL;
  }
  out[got] = 0;
  return NF_OK;
}

int nf_trust_add_key(nf_trust *t, const char *spec, nf_buf *err) {
  uint8_t pk[32];
  char text[256];
  const char *s = spec ? spec : "";
  if (!nf_sign_parse_public(s, pk)) {
    if (!strchr(s, '/') || read_small(s, text, sizeof text, err) != NF_OK ||
        !nf_sign_parse_public(text, pk)) {
      if (!err->len)
        nf_buf_printf(err, "trust_key: expected ed25519:<64 hex digits> or a file holding it, "
                           "got '%.80s'", s);
      return NF_EINVAL;
    }
  }
  if (nf_trust_key_ok(t, pk)) return NF_OK;
  if (t->n_keys >= NF_TRUST_MAX) {
    nf_buf_printf(err, "trust_key: more than %d keys", NF_TRUST_MAX);
    return NF_EINVAL;
  }
  memcpy(t->keys[t->n_keys++], pk, 32);
  return NF_OK;
}

/* ---- the configuration file ---- */

typedef struct cfg_ctx {
  nf_trust *t;
  nf_buf *err;
  int bad; /* 1 once a message is in err */
} cfg_ctx;

static int on_entry(void *user, const char *section, const char *name, const char *value) {
  cfg_ctx *x = user;
  if (x->bad) return 0;
  if (strcmp(section, "daemon") != 0) {
    nf_buf_printf(x->err, "unknown section [%s] (the client's keys are under [daemon])", section);
    x->bad = 1;
    return 0;
  }
  int rc = NF_OK;
  if (!strcmp(name, "trust_uid")) {
    rc = nf_trust_add_uid(x->t, value, x->err);
  } else if (!strcmp(name, "trust_key")) {
    rc = nf_trust_add_key(x->t, value, x->err);
  } else if (!strcmp(name, "socket") || !strcmp(name, "key_file")) {
    char *dst = name[0] == 's' ? x->t->socket : x->t->key_file;
    if (!*value || strlen(value) >= sizeof x->t->socket) {
      nf_buf_printf(x->err, "%s: empty or too long", name);
      rc = NF_EINVAL;
    } else {
      memcpy(dst, value, strlen(value) + 1);
    }
  } else {
    nf_buf_printf(x->err, "unknown key '%s' in [daemon] (known: socket, key_file, trust_uid, "
                          "trust_key)", name);
    rc = NF_EINVAL;
  }
  if (rc != NF_OK) x->bad = 1;
  return rc == NF_OK;
}

int nf_trust_load_file(nf_trust *t, const char *path, nf_buf *err) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return NF_OK;
    nf_buf_printf(err, "configuration %s: %s", path,
                  errno == ELOOP ? "a symlink: refusing it (it could make us trust a stranger)"
                                 : strerror(errno));
    return NF_EINVAL;
  }
  struct stat st;
  char owner[160];
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    nf_buf_printf(err, "configuration %s is not a regular file", path);
    close(fd);
    return NF_EINVAL;
  }
  if (st.st_uid != geteuid()) {
    nf_trust_uid_name(st.st_uid, owner, sizeof owner);
    nf_buf_printf(err, "configuration %s belongs to %s, not to you: refusing it (it says whom "
                       "to trust)", path, owner);
    close(fd);
    return NF_EINVAL;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    nf_buf_printf(err, "configuration %s has mode %04o: group or other may write it, refusing "
                       "it (chmod go-w %s)", path, (unsigned)st.st_mode & 07777, path);
    close(fd);
    return NF_EINVAL;
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    nf_buf_printf(err, "configuration %s: %s", path, strerror(errno));
    return NF_EIO;
  }
  snprintf(t->path, sizeof t->path, "%s", path);
  nf_buf why = NF_BUF_INIT;
  cfg_ctx x = {.t = t, .err = &why};
  int line = ini_parse_file(f, on_entry, &x);
  fclose(f);
  int rc = NF_OK;
  if (line != 0) {
    if (line < 0)
      nf_buf_printf(err, "configuration %s: cannot read it", path);
    else
      nf_buf_printf(err, "%s:%d: %s", path, line,
                    x.bad ? nf_buf_str(&why) : "expected 'key = value' or '[section]'");
    rc = NF_EINVAL;
  }
  nf_buf_free(&why);
  return rc;
}

int nf_trust_load(nf_trust *t, nf_buf *err) {
  memset(t, 0, sizeof *t);
  char path[4096];
  const char *v = nf_env(NF_ENV_CONFIG);
  const char *xdg = nf_env(NF_ENV_XDG_CONFIG_HOME), *home = nf_env(NF_ENV_HOME);
  if (v && *v) {
    if (!strcmp(v, "none")) return NF_OK;
    snprintf(path, sizeof path, "%s", v);
  } else if (xdg && xdg[0] == '/') {
    snprintf(path, sizeof path, "%s/neoflow/client.conf", xdg);
  } else if (home && home[0] == '/') {
    snprintf(path, sizeof path, "%s/.config/neoflow/client.conf", home);
  } else {
    return NF_OK;
  }
  return nf_trust_load_file(t, path, err);
}

/* ---- socket directories ---- */

int nf_trust_check_socket_dir(const nf_trust *t, const char *socket_path, int create,
                              nf_buf *err) {
  char dir[4096];
  if (!socket_path || strlen(socket_path) >= sizeof dir) {
    nf_buf_puts(err, "socket path missing or too long");
    return NF_EINVAL;
  }
  memcpy(dir, socket_path, strlen(socket_path) + 1);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (errno != ENOENT || !create) {
      nf_buf_printf(err, "socket directory %s: %s", dir, strerror(errno));
      return errno == ENOENT ? NF_ENOENT : NF_EINVAL;
    }
    mode_t old = umask(077);
    int made = mkdir(dir, 0700) == 0;
    int e = errno;
    umask(old);
    if (!made && e != EEXIST) {
      nf_buf_printf(err, "cannot create socket directory %s: %s", dir, strerror(e));
      return NF_EINVAL;
    }
    if (lstat(dir, &st) != 0) {
      nf_buf_printf(err, "socket directory %s: %s", dir, strerror(errno));
      return NF_EINVAL;
    }
  }
  char owner[160];
  nf_trust_uid_name(st.st_uid, owner, sizeof owner);
  if (S_ISLNK(st.st_mode)) {
    nf_buf_printf(err, "socket directory %s is a symlink (owned by %s): refusing it, since whoever "
                       "made it could point it at their own daemon; remove it", dir, owner);
    return NF_EINVAL;
  }
  if (!S_ISDIR(st.st_mode)) {
    nf_buf_printf(err, "socket directory %s is not a directory (owned by %s): refusing it", dir,
                  owner);
    return NF_EINVAL;
  }
  /* "/" and "/tmp" style parents (root's, sticky) hold explicit sockets
   * only when the path names one directly; a daemon's own directory is
   * what we judge */
  if (!nf_trust_uid_ok(t, st.st_uid) && st.st_uid != 0) {
    nf_buf_printf(err, "socket directory %s belongs to %s, not to you or a user you trust: "
                       "another user may have made it to impersonate your daemon; refusing it "
                       "(remove it, or trust that user with trust_uid in the client "
                       "configuration)", dir, owner);
    return NF_EINVAL;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX && st.st_uid == 0)) {
    nf_buf_printf(err, "socket directory %s has mode %04o: group or other may write it, so "
                       "anyone could replace the socket; refusing it (chmod 700 %s)", dir,
                  (unsigned)st.st_mode & 07777, dir);
    return NF_EINVAL;
  }
  return NF_OK;
}
