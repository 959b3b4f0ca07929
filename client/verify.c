/* verify.c - the record of kernels that passed a canary on this machine.
 *
 * A kernel's first use in a session is checked against tier 0 (a canary
 * run on the step's real data), which costs one interpreter run: for a
 * large convolution, as long as a step at tier 0.  Once a kernel's bytes
 * (SHA-256) have passed for a key, later sessions swap the same bytes in
 * without a canary (the digest, key and ELF checks still apply).
 *
 * The record is a file of 64-byte entries (key, SHA-256), appended with
 * O_APPEND (one write per entry, so concurrent sessions do not interleave
 * within an entry) at $NEOFLOW_VERIFIED, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/neoflow/verified-kernels, created 0600;
 * "none" keeps no record.  Only the last 65536 entries are read; a torn
 * final entry (a crash mid-write) is ignored. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session_int.h"

#define MAX_ENTRIES 65536

static char *record_path(void) {
  const char *v = getenv("NEOFLOW_VERIFIED");
  if (v && *v) return strcmp(v, "none") ? strdup(v) : NULL;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char buf[4096];
  if (xdg && *xdg == '/')
    snprintf(buf, sizeof buf, "%s/neoflow", xdg);
  else if (home && *home == '/')
    snprintf(buf, sizeof buf, "%s/.cache/neoflow", home);
  else
    return NULL;
  /* the directory, private, created when missing */
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", buf);
  char *sl = strrchr(parent, '/');
  if (sl && sl != parent) {
    *sl = 0;
    mkdir(parent, 0700);
  }
  if (mkdir(buf, 0700) != 0 && errno != EEXIST) return NULL;
  size_t n = strlen(buf);
  if (n + 32 >= sizeof buf) return NULL;
  strcat(buf, "/verified-kernels");
  return strdup(buf);
}

void nf__verified_load(nf_session *s) {
  s->verified_path = record_path();
  if (!s->verified_path) return;
  int fd = open(s->verified_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return; /* not ours: never trusted */
  }
  off_t n = st.st_size / 64;
  off_t from = n > MAX_ENTRIES ? n - MAX_ENTRIES : 0;
  n -= from;
  if (n > 0) {
    s->verified = malloc((size_t)n * 64);
    if (s->verified) {
      ssize_t got = pread(fd, s->verified, (size_t)n * 64, from * 64);
      s->n_verified = got > 0 ? (int)(got / 64) : 0;
    }
  }
  close(fd);
}

int nf__verified_has(const nf_session *s, const uint8_t key[32], const uint8_t *sha) {
  for (int i = s->n_verified; i-- > 0;)
    if (!memcmp(s->verified[i], key, 32) && (!sha || !memcmp(s->verified[i] + 32, sha, 32)))
      return 1;
  return 0;
}

void nf__verified_add(nf_session *s, const uint8_t key[32], const uint8_t sha[32]) {
  if (!s->verified_path || nf__verified_has(s, key, sha)) return;
  uint8_t e[64];
  memcpy(e, key, 32);
  memcpy(e + 32, sha, 32);
  int fd = open(s->verified_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0) {
    struct stat st;
    /* keep entries aligned: after a torn write, pad to the next entry */
    if (fstat(fd, &st) == 0 && st.st_size % 64) {
      uint8_t pad[64] = {0};
      if (write(fd, pad, (size_t)(64 - st.st_size % 64)) < 0) {
        close(fd);
        return;
      }
    }
    if (write(fd, e, 64) != 64) nf__session_warn(s, "%s: cannot record a verified kernel", s->verified_path);
    close(fd);
  }
  if (s->n_verified < MAX_ENTRIES) {
    uint8_t (*nv)[64] = realloc(s->verified, (size_t)(s->n_verified + 1) * 64);
    if (nv) {
      s->verified = nv;
      memcpy(s->verified[s->n_verified++], e, 64);
    }
  }
}
