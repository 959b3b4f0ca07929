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
 * final entry (a crash mid-write) is ignored.
 *
 * Beside it, the speed verdicts (same path + ".speed"): for a kernel
 * (key, SHA-256) at a thread count, its measured time per run and that
 * of the tier 0 it would replace, on this machine and the step's real
 * data.  A kernel slower than its tier 0 is never swapped in again at
 * that thread count (the session keeps tier 0 and asks the daemon for a
 * better one); one found faster is swapped in without racing tier 0
 * again.  96-byte entries (key, SHA-256, threads u32, flags u32, kernel
 * ms f64, tier-0 ms f64, 8 zero bytes), appended like the record; the
 * last entry for a (key, SHA-256, threads) wins, so a later measurement
 * overrules an earlier one. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session_int.h"
#include "nf_env.h"

#define MAX_ENTRIES 65536
#define VERDICT_BYTES 96
#define VERDICT_MAGIC 0x5646u /* flags' low half: "FV", a written entry */

static char *record_path(void) {
  const char *v = nf_env(NF_ENV_VERIFIED);
  if (v && *v) return strcmp(v, "none") ? strdup(v) : NULL;
  const char *xdg = nf_env(NF_ENV_XDG_CACHE_HOME), *home = nf_env(NF_ENV_HOME);
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
    if (write(fd, e, 64) != 64) nf__slog_warn(&s->log, "%s: cannot record a verified kernel", s->verified_path);
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

/* ---- speed verdicts ---- */

static char *verdict_path(const nf_session *s) {
  if (!s->verified_path) return NULL;
  size_t n = strlen(s->verified_path) + 8;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s.speed", s->verified_path);
  return p;
}

/* Opens the verdict file for reading or appending; -1 when it is missing,
 * not a regular file of ours, or a symlink. */
static int verdict_open(const nf_session *s, int append) {
  char *p = verdict_path(s);
  if (!p) return -1;
  int fd = append ? open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)
                  : open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  free(p);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return -1;
  }
  return fd;
}

static void verdict_decode(const uint8_t *e, nf__verdict *v) {
  memcpy(v->key, e, 32);
  memcpy(v->sha, e + 32, 32);
  uint32_t th, fl;
  memcpy(&th, e + 64, 4);
  memcpy(&fl, e + 68, 4);
  memcpy(&v->kernel_ms, e + 72, 8);
  memcpy(&v->tier0_ms, e + 80, 8);
  v->threads = (int)th;
  v->flags = fl >> 16;
}

void nf__verdicts_load(nf_session *s) {
  int fd = verdict_open(s, 0);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return;
  }
  off_t n = st.st_size / VERDICT_BYTES;
  off_t from = n > MAX_ENTRIES ? n - MAX_ENTRIES : 0;
  n -= from;
  uint8_t *raw = n > 0 ? malloc((size_t)n * VERDICT_BYTES) : NULL;
  ssize_t got = raw ? pread(fd, raw, (size_t)n * VERDICT_BYTES, from * VERDICT_BYTES) : 0;
  close(fd);
  int m = got > 0 ? (int)(got / VERDICT_BYTES) : 0;
  s->verdicts = m ? calloc((size_t)m, sizeof *s->verdicts) : NULL;
  for (int i = 0; s->verdicts && i < m; i++) {
    const uint8_t *e = raw + (size_t)i * VERDICT_BYTES;
    uint32_t fl;
    memcpy(&fl, e + 68, 4);
    nf__verdict v;
    verdict_decode(e, &v);
    /* a torn or foreign entry, or nonsense times: skipped */
    if ((fl & 0xffffu) != VERDICT_MAGIC || !(v.kernel_ms >= 0 && v.kernel_ms < 1e9) ||
        !(v.tier0_ms >= 0 && v.tier0_ms < 1e9) || v.threads < 1)
      continue;
    s->verdicts[s->n_verdicts++] = v;
  }
  free(raw);
}

const nf__verdict *nf__verdict_get(const nf_session *s, const uint8_t key[32],
                                   const uint8_t sha[32]) {
  for (int i = s->n_verdicts; i-- > 0;) {
    const nf__verdict *v = &s->verdicts[i];
    if (v->threads == s->threads && !memcmp(v->key, key, 32) && !memcmp(v->sha, sha, 32))
      return v;
  }
  return NULL;
}

void nf__verdict_put(nf_session *s, const uint8_t key[32], const uint8_t sha[32],
                     double kernel_ms, double tier0_ms, unsigned flags) {
  uint8_t e[VERDICT_BYTES] = {0};
  memcpy(e, key, 32);
  memcpy(e + 32, sha, 32);
  uint32_t th = (uint32_t)s->threads, fl = VERDICT_MAGIC | (uint32_t)(flags & 0xffffu) << 16;
  memcpy(e + 64, &th, 4);
  memcpy(e + 68, &fl, 4);
  memcpy(e + 72, &kernel_ms, 8);
  memcpy(e + 80, &tier0_ms, 8);
  int fd = verdict_open(s, 1);
  if (fd >= 0) {
    struct stat st;
    int ok = 1;
    /* keep entries aligned after a torn write */
    if (fstat(fd, &st) == 0 && st.st_size % VERDICT_BYTES) {
      uint8_t pad[VERDICT_BYTES] = {0};
      ok = write(fd, pad, (size_t)(VERDICT_BYTES - st.st_size % VERDICT_BYTES)) > 0;
    }
    if (ok && write(fd, e, sizeof e) != (ssize_t)sizeof e)
      nf__slog_warn(&s->log, "%s.speed: cannot record a kernel's speed", s->verified_path);
    close(fd);
  }
  /* this session's view, whether or not the file took it */
  if (s->n_verdicts < MAX_ENTRIES) {
    nf__verdict *nv = realloc(s->verdicts, (size_t)(s->n_verdicts + 1) * sizeof *nv);
    if (nv) {
      s->verdicts = nv;
      verdict_decode(e, &s->verdicts[s->n_verdicts++]);
    }
  }
}
