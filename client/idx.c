/* idx.c - the IDX file format (MNIST, Fashion-MNIST) and the MNIST-style
 * datasets read through it (neoflow/neoflow.h: nf_idx_load,
 * nf_dataset_mnist_load).
 *
 * An IDX file is a 4-byte magic (two zero bytes, a type code, the rank),
 * the rank's dimensions as big-endian u32, then the elements in row-major
 * order, big-endian.  Files are read through zlib's gz* calls, which read
 * gzip-compressed and plain files alike (Debian ships the .gz files).
 * Every check names the file and what is wrong: a missing file, a bad
 * magic, an unknown type, too many dimensions, a size that does not fit,
 * data shorter or longer than the header declares, a corrupt gzip stream. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "neoflow/neoflow.h"
#include "nf_status.h"

/* The largest decompressed payload accepted (a guard against a header
 * that declares absurd sizes). */
#define IDX_MAX_BYTES (16LL << 30)

static void idx_err(char **err, const char *path, const char *fmt, ...) {
  if (!err) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t n = strlen(path) + strlen(msg) + 8;
  free(*err);
  *err = malloc(n);
  if (*err) snprintf(*err, n, "%s: %s", path, msg);
}

static int type_size(int type) {
  switch (type) {
  case NF_IDX_U8: case NF_IDX_I8: return 1;
  case NF_IDX_I16: return 2;
  case NF_IDX_I32: case NF_IDX_F32: return 4;
  case NF_IDX_F64: return 8;
  default: return 0;
  }
}

/* Reads exactly n bytes; 1 on success, 0 at a short read (*got set), -1
 * on a gzip error (message in *why). */
/* zlib's messages start with the path given to gzopen: drop it (the
 * message names the file once). */
static const char *strip_path(const char *msg, const char *path) {
  size_t n = strlen(path);
  if (msg && !strncmp(msg, path, n) && msg[n] == ':' && msg[n + 1] == ' ') return msg + n + 2;
  return msg ? msg : "?";
}

static int read_all(gzFile f, void *buf, size_t n, size_t *got, const char **why,
                    const char *path) {
  size_t done = 0;
  while (done < n) {
    size_t want = n - done > (1u << 30) ? (1u << 30) : n - done;
    int r = gzread(f, (char *)buf + done, (unsigned)want);
    if (r < 0) {
      int e;
      *why = gzerror(f, &e);
      if (e == Z_ERRNO) *why = strerror(errno);
      else *why = strip_path(*why, path);
      *got = done;
      return -1;
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  *got = done;
  return done == n ? 1 : 0;
}

void nf_idx_free(nf_idx *x) {
  if (!x) return;
  free(x->data);
  memset(x, 0, sizeof *x);
}

int nf_idx_load(const char *path, nf_idx *out, char **err) {
  if (!path || !out) return NF_EINVAL;
  memset(out, 0, sizeof *out);
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    idx_err(err, path, "cannot open: %s", errno ? strerror(errno) : "out of memory");
    return errno == ENOENT ? NF_ENOENT : NF_EIO;
  }
  int rc = NF_EFORMAT;
  const char *why = NULL;
  size_t got = 0;
  unsigned char hdr[4];
  int r = read_all(f, hdr, 4, &got, &why, path);
  if (r < 0) {
    idx_err(err, path, "corrupt compressed data: %s", why);
    goto out;
  }
  if (r == 0) {
    idx_err(err, path, "truncated: %zu bytes, shorter than the 4-byte IDX magic", got);
    goto out;
  }
  if (hdr[0] || hdr[1] || !type_size(hdr[2])) {
    idx_err(err, path, "not an IDX file: magic %02x %02x %02x %02x (expected 00 00, a type "
                       "code 08/09/0b/0c/0d/0e, the rank)", hdr[0], hdr[1], hdr[2], hdr[3]);
    goto out;
  }
  if (hdr[3] < 1 || hdr[3] > 8) {
    idx_err(err, path, "IDX rank %d is not supported (1 to 8)", hdr[3]);
    goto out;
  }
  out->type = hdr[2];
  out->rank = hdr[3];
  unsigned char dims[32];
  r = read_all(f, dims, 4u * (unsigned)out->rank, &got, &why, path);
  if (r <= 0) {
    if (r < 0) idx_err(err, path, "corrupt compressed data: %s", why);
    else idx_err(err, path, "truncated in the header: %d dimensions declared, %zu bytes of them "
                            "present", out->rank, got);
    goto out;
  }
  int64_t numel = 1;
  int es = type_size(out->type);
  for (int i = 0; i < out->rank; i++) {
    const unsigned char *d = dims + 4 * i;
    out->dims[i] = (int64_t)d[0] << 24 | (int64_t)d[1] << 16 | (int64_t)d[2] << 8 | d[3];
    if (out->dims[i] != 0 && numel > IDX_MAX_BYTES / es / out->dims[i]) {
      idx_err(err, path, "the header declares more than %lld bytes of data (dimension %d is %lld)",
              (long long)IDX_MAX_BYTES, i, (long long)out->dims[i]);
      goto out;
    }
    numel *= out->dims[i];
  }
  out->bytes = (size_t)numel * (size_t)es;
  {
    /* a plain file shorter than its header declares fails before the
     * allocation (compressed files are checked as they are read) */
    struct stat sb;
    size_t hdr_bytes = 4 + 4 * (size_t)out->rank;
    if (gzdirect(f) && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
        (uint64_t)sb.st_size < hdr_bytes + out->bytes) {
      idx_err(err, path, "truncated: the header declares %zu bytes of elements, the file holds %lld",
              out->bytes, (long long)sb.st_size - (long long)hdr_bytes);
      goto out;
    }
  }
  out->data = malloc(out->bytes ? out->bytes : 1);
  if (!out->data) {
    rc = NF_ENOMEM;
    idx_err(err, path, "out of memory for %zu bytes", out->bytes);
    goto out;
  }
  r = read_all(f, out->data, out->bytes, &got, &why, path);
  if (r < 0) {
    idx_err(err, path, "corrupt compressed data after %zu bytes of elements: %s", got, why);
    goto out;
  }
  if (r == 0) {
    idx_err(err, path, "truncated: the header declares %zu bytes of elements, the file holds %zu",
            out->bytes, got);
    goto out;
  }
  unsigned char extra;
  r = read_all(f, &extra, 1, &got, &why, path);
  if (r < 0) {
    idx_err(err, path, "corrupt compressed data after the elements: %s", why);
    goto out;
  }
  if (r == 1) {
    idx_err(err, path, "trailing data after the %zu bytes of elements the header declares",
            out->bytes);
    goto out;
  }
  {
    /* a stream cut in its trailer (CRC, length) decompresses every element
     * and then ends early: zlib reports it as Z_BUF_ERROR, not as -1 */
    int ze;
    const char *zm = gzerror(f, &ze);
    if (ze == Z_BUF_ERROR) {
      idx_err(err, path, "truncated compressed data (%s)", strip_path(zm, path));
      goto out;
    }
  }
  /* big-endian to the host's order */
  if (es > 1) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe == 1) {
      unsigned char *p = out->data;
      for (size_t i = 0; i < out->bytes; i += (size_t)es)
        for (int a = 0, b = es - 1; a < b; a++, b--) {
          unsigned char t = p[i + a];
          p[i + a] = p[i + b];
          p[i + b] = t;
        }
    }
  }
  rc = NF_OK;
out:
  gzclose(f);
  if (rc != NF_OK) nf_idx_free(out);
  return rc;
}

/* Finds DIR/BASE or DIR/BASE.gz. */
static char *find_file(const char *dir, const char *base) {
  size_t n = strlen(dir) + strlen(base) + 8;
  char *p = malloc(n);
  if (!p) return NULL;
  snprintf(p, n, "%s/%s", dir, base);
  FILE *f = fopen(p, "rb");
  if (f) {
    fclose(f);
    return p;
  }
  snprintf(p, n, "%s/%s.gz", dir, base);
  return p;
}

int nf_dataset_mnist_load(const char *dir, const char *split, nf_dataset *out, char **err) {
  if (!out) return NF_EINVAL;
  memset(out, 0, sizeof *out);
  if (!dir) dir = NF_FASHION_MNIST_DIR;
  if (!split || (strcmp(split, "train") && strcmp(split, "t10k") && strcmp(split, "test"))) {
    idx_err(err, dir, "unknown split '%s' (train or test)", split ? split : "(null)");
    return NF_EINVAL;
  }
  const char *pre = strcmp(split, "train") ? "t10k" : "train";
  char ib[64], lb[64];
  snprintf(ib, sizeof ib, "%s-images-idx3-ubyte", pre);
  snprintf(lb, sizeof lb, "%s-labels-idx1-ubyte", pre);
  char *ip = find_file(dir, ib), *lp = find_file(dir, lb);
  nf_idx im = {0}, lab = {0};
  int rc = ip && lp ? NF_OK : NF_ENOMEM;
  if (rc == NF_OK) rc = nf_idx_load(ip, &im, err);
  if (rc == NF_OK) rc = nf_idx_load(lp, &lab, err);
  if (rc == NF_OK && (im.type != NF_IDX_U8 || im.rank != 3)) {
    idx_err(err, ip, "expected u8 images [n, rows, cols], found type 0x%02x with %d dimensions",
            im.type, im.rank);
    rc = NF_EFORMAT;
  }
  if (rc == NF_OK && (lab.type != NF_IDX_U8 || lab.rank != 1)) {
    idx_err(err, lp, "expected u8 labels [n], found type 0x%02x with %d dimensions", lab.type,
            lab.rank);
    rc = NF_EFORMAT;
  }
  if (rc == NF_OK && lab.dims[0] != im.dims[0]) {
    idx_err(err, lp, "%lld labels for %lld images in %s", (long long)lab.dims[0],
            (long long)im.dims[0], ip);
    rc = NF_EFORMAT;
  }
  if (rc == NF_OK) {
    out->n = im.dims[0];
    out->rows = im.dims[1];
    out->cols = im.dims[2];
    int64_t per = out->rows * out->cols;
    out->images = malloc(sizeof(float) * (size_t)(out->n * per + 1));
    out->labels = malloc(sizeof(int64_t) * (size_t)(out->n + 1));
    if (!out->images || !out->labels) rc = NF_ENOMEM;
    const unsigned char *px = im.data, *lv = lab.data;
    for (int64_t i = 0; rc == NF_OK && i < out->n * per; i++)
      out->images[i] = (float)((px[i] / 255.0 - NF_FASHION_MNIST_MEAN) / NF_FASHION_MNIST_STD);
    for (int64_t i = 0; rc == NF_OK && i < out->n; i++) {
      out->labels[i] = lv[i];
      if (lv[i] >= out->classes) out->classes = lv[i] + 1;
    }
  }
  nf_idx_free(&im);
  nf_idx_free(&lab);
  free(ip);
  free(lp);
  if (rc != NF_OK) nf_dataset_free(out);
  return rc;
}

void nf_dataset_free(nf_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  memset(d, 0, sizeof *d);
}
