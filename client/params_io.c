/* params_io.c - parameter files (docs/client.md "Parameter files").
 *
 * Layout, all integers little-endian:
 *   "NFPARAMS"  u32 version (1)  u32 count
 *   count times: u32 name length, the name (UTF-8, no NUL), u8 dtype
 *                (5: f32), u8 rank, u16 0, rank x i64 dims, the values
 *                (numel x f32, row-major)
 *   32 bytes: SHA-256 of everything before.
 * Saving writes a temporary file in the same directory, fsyncs it,
 * renames it over the path and fsyncs the directory, so a crash leaves
 * the old file or the new one.  Loading reads and checks the whole file
 * (digest, every name, dtype and shape, no parameter missing or extra)
 * before changing any parameter. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session_int.h"

#define MAGIC "NFPARAMS"

static void put32(nf_buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  nf_buf_add(b, x, 4);
}

static void put64(nf_buf *b, uint64_t v) {
  for (int i = 0; i < 8; i++) nf_buf_u8(b, (uint8_t)(v >> (8 * i)));
}

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int nf__params_save(nf_session *s, const char *path) {
  nf_buf b = NF_BUF_INIT;
  nf_buf_add(&b, MAGIC, 8);
  put32(&b, 1);
  put32(&b, (uint32_t)s->n_params);
  for (int i = 0; i < s->n_params; i++) {
    const nf__param *p = &s->params[i];
    put32(&b, (uint32_t)strlen(p->name));
    nf_buf_add(&b, p->name, strlen(p->name));
    nf_buf_u8(&b, p->dtype);
    nf_buf_u8(&b, p->rank);
    nf_buf_u8(&b, 0);
    nf_buf_u8(&b, 0);
    for (int r = 0; r < p->rank; r++) put64(&b, (uint64_t)p->shape[r]);
    nf_buf_add(&b, s->P + p->offset, (size_t)p->numel * sizeof(float));
  }
  uint8_t sha[32];
  crypto_hash_sha256(sha, (const uint8_t *)b.data, b.len);
  nf_buf_add(&b, sha, 32);
  if (b.oom) {
    nf_buf_free(&b);
    nf_buf_printf(&s->err, "%s: out of memory", path);
    return NF_ENOMEM;
  }
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 16), *dcopy = strdup(path);
  if (!tmp || !dcopy) {
    free(tmp);
    free(dcopy);
    nf_buf_free(&b);
    return NF_ENOMEM;
  }
  snprintf(tmp, pl + 16, "%s.tmp.XXXXXX", path);
  int rc = NF_OK;
  int fd = mkstemp(tmp);
  if (fd < 0) {
    nf_buf_printf(&s->err, "%s: cannot create a temporary file: %s", path, strerror(errno));
    rc = NF_EIO;
  } else {
    if (write_all(fd, b.data, b.len) != 0 || fsync(fd) != 0) {
      nf_buf_printf(&s->err, "%s: cannot write: %s", tmp, strerror(errno));
      rc = NF_EIO;
    }
    if (close(fd) != 0 && rc == NF_OK) {
      nf_buf_printf(&s->err, "%s: cannot write: %s", tmp, strerror(errno));
      rc = NF_EIO;
    }
    if (rc == NF_OK && rename(tmp, path) != 0) {
      nf_buf_printf(&s->err, "%s: cannot rename the temporary file: %s", path, strerror(errno));
      rc = NF_EIO;
    }
    if (rc != NF_OK) unlink(tmp);
    if (rc == NF_OK) {
      int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
      }
    }
  }
  free(tmp);
  free(dcopy);
  nf_buf_free(&b);
  return rc;
}

int nf__params_load(nf_session *s, const char *path) {
  int64_t expect = 16 + 32;
  for (int i = 0; i < s->n_params; i++)
    expect += 8 + (int64_t)strlen(s->params[i].name) + 8 * s->params[i].rank +
              s->params[i].numel * 4;
  FILE *f = fopen(path, "rb");
  if (!f) {
    nf_buf_printf(&s->err, "%s: cannot open: %s", path, strerror(errno));
    return NF_EIO;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    nf_buf_printf(&s->err, "%s: not a regular file", path);
    fclose(f);
    return NF_EIO;
  }
  if (st.st_size != expect) {
    nf_buf_printf(&s->err,
                  "%s: %lld bytes where this model's parameters take %lld: another model, or a "
                  "damaged file",
                  path, (long long)st.st_size, (long long)expect);
    fclose(f);
    return NF_EFORMAT;
  }
  uint8_t *d = malloc((size_t)expect);
  if (!d) {
    fclose(f);
    return NF_ENOMEM;
  }
  size_t got = fread(d, 1, (size_t)expect, f);
  fclose(f);
  int rc = NF_OK;
  uint8_t sha[32];
  if (got != (size_t)expect) {
    nf_buf_printf(&s->err, "%s: short read", path);
    rc = NF_EIO;
  } else if (memcmp(d, MAGIC, 8) != 0) {
    nf_buf_printf(&s->err, "%s: not a NeoFlow parameter file (bad magic)", path);
    rc = NF_EFORMAT;
  } else if (get32(d + 8) != 1) {
    nf_buf_printf(&s->err, "%s: version %u is not supported (this build reads 1)", path,
                  get32(d + 8));
    rc = NF_EFORMAT;
  } else {
    crypto_hash_sha256(sha, d, (size_t)expect - 32);
    if (memcmp(sha, d + expect - 32, 32) != 0) {
      nf_buf_printf(&s->err, "%s: SHA-256 mismatch: the file is damaged", path);
      rc = NF_EFORMAT;
    } else if (get32(d + 12) != (uint32_t)s->n_params) {
      nf_buf_printf(&s->err, "%s: %u parameters, this model has %d", path, get32(d + 12),
                    s->n_params);
      rc = NF_EFORMAT;
    }
  }
  /* check everything, remember where each parameter's values are */
  int64_t *at = calloc((size_t)s->n_params + 1, sizeof *at);
  if (!at && rc == NF_OK) rc = NF_ENOMEM;
  int64_t pos = 16;
  for (int i = 0; rc == NF_OK && i < s->n_params; i++) {
    uint32_t nl = get32(d + pos);
    if (nl > 4096 || pos + 4 + nl + 4 > expect - 32) {
      nf_buf_printf(&s->err, "%s: entry %d: bad name length", path, i);
      rc = NF_EFORMAT;
      break;
    }
    char name[4097];
    memcpy(name, d + pos + 4, nl);
    name[nl] = 0;
    pos += 4 + nl;
    int pi = -1;
    for (int k = 0; k < s->n_params; k++)
      if (strlen(s->params[k].name) == nl && !memcmp(s->params[k].name, name, nl)) pi = k;
    if (pi < 0 || at[pi]) {
      nf_buf_printf(&s->err, "%s: parameter '%s' %s", path, name,
                    pi < 0 ? "is not in this model" : "appears twice");
      rc = NF_EFORMAT;
      break;
    }
    const nf__param *p = &s->params[pi];
    uint8_t dt = d[pos], rank = d[pos + 1];
    pos += 4;
    if (dt != p->dtype || rank != p->rank || pos + 8 * rank + p->numel * 4 > expect - 32) {
      nf_buf_printf(&s->err, "%s: parameter '%s' has another type or rank than the model's", path,
                    name);
      rc = NF_EFORMAT;
      break;
    }
    for (int r = 0; r < rank; r++)
      if ((int64_t)get64(d + pos + 8 * r) != p->shape[r]) {
        nf_buf_printf(&s->err, "%s: parameter '%s': dimension %d is %lld, the model's is %lld",
                      path, name, r, (long long)get64(d + pos + 8 * r), (long long)p->shape[r]);
        rc = NF_EFORMAT;
      }
    pos += 8 * rank;
    at[pi] = pos;
    pos += p->numel * 4;
  }
  if (rc == NF_OK && pos != expect - 32) {
    nf_buf_printf(&s->err, "%s: trailing bytes after the parameters", path);
    rc = NF_EFORMAT;
  }
  for (int i = 0; rc == NF_OK && i < s->n_params; i++)
    memcpy(s->P + s->params[i].offset, d + at[i], (size_t)s->params[i].numel * 4);
  free(at);
  free(d);
  return rc;
}
