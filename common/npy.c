/* npy.c - NumPy .npy reader and writer, and nf_array allocation.
 *
 * Reading: the 10- or 12-byte prefix (magic, version, header length), then
 * the header dict (a restricted Python literal with the keys 'descr',
 * 'fortran_order' and 'shape' in any order), then exactly numel * itemsize
 * bytes of C-order data.  Both readers (file and memory) share the prefix
 * parser, the dict parser and the element converter, so they accept and
 * refuse the same inputs.
 *
 * Invariants:
 *  - Nothing is allocated from a header's promise before that promise has
 *    been checked against the bytes actually present: the data size must
 *    equal what the file holds after the header, exactly (a shorter file is
 *    "truncated", a longer one has "trailing bytes").
 *  - Arrays are always native-endian, C order; i1/i2/u1/u2/u4 widen to i64,
 *    bools normalise to 0/1 bytes.
 *  - Every error appends "name: why" to err and returns a negative status;
 *    on error *a is left empty (data NULL).
 *
 * Writing produces format 1.0 exactly like numpy.save: the dict text
 * "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", padded
 * with spaces and a final newline so the data starts at a multiple of 64.
 * The file is written to "path.tmp.XXXXXX" and renamed into place.
 *
 * Not handled: structured, object, string, complex or f2 dtypes, Fortran
 * order, u8 (values may not fit in i64). */
#include "nf_npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64

/* ---- arrays ---- */

static size_t array_elem_size(nf_dtype t) {
  switch (t) {
  case NF_BOOL:
    return 1;
  case NF_I32:
  case NF_F32:
    return 4;
  case NF_I64:
  case NF_F64:
    return 8;
  default:
    return 0; /* not an array dtype */
  }
}

int nf_array_alloc(nf_array *a, nf_dtype t, int rank, const int64_t *shape) {
  memset(a, 0, sizeof *a);
  size_t es = array_elem_size(t);
  if (es == 0 || rank < 0 || rank > NF_MAX_RANK || (rank > 0 && !shape))
    return NF_EINVAL;
  int64_t numel = 1;
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0) return NF_EINVAL;
    if (shape[d] != 0 && numel > INT64_MAX / shape[d]) return NF_EOVERFLOW;
    numel *= shape[d];
  }
  if ((uint64_t)numel > SIZE_MAX / es) return NF_EOVERFLOW;
  size_t bytes = (size_t)numel * es;
  void *data = calloc(bytes ? bytes : 1, 1);
  if (!data) return NF_ENOMEM;
  a->dtype = t;
  a->rank = rank;
  for (int d = 0; d < rank; d++) a->shape[d] = shape[d];
  a->numel = numel;
  a->data = data;
  return NF_OK;
}

void nf_array_free(nf_array *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* ---- header parsing ---- */

typedef enum src_kind { SRC_FLOAT, SRC_INT, SRC_UINT, SRC_BOOL } src_kind;

typedef struct npy_header {
  size_t data_start; /* offset of the first data byte */
  src_kind kind;
  int itemsize;  /* bytes per element in the file */
  int swap;      /* file byte order differs from the host's */
  nf_dtype dtype; /* the nf_array dtype it reads as */
  int rank;
  int64_t shape[NF_MAX_RANK];
  int64_t numel;
  uint64_t data_bytes;
} npy_header;

static int host_is_little(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

static int fail(nf_buf *err, int rc, const char *name, const char *fmt, ...)
    NF_PRINTF(4, 5);

static int fail(nf_buf *err, int rc, const char *name, const char *fmt, ...) {
  if (err) {
    va_list ap;
    nf_buf_printf(err, "%s: ", name);
    va_start(ap, fmt);
    nf_buf_vprintf(err, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* Parses the fixed prefix from the first n bytes (n may be short).  Sets
 * *hstart (offset of the dict text) and *hlen. */
static int parse_prefix(const unsigned char *p, size_t n, const char *name,
                        size_t *hstart, size_t *hlen, nf_buf *err) {
  if (n < NPY_MAGIC_LEN || memcmp(p, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
    return fail(err, NF_EFORMAT, name, "not a .npy file (bad magic)");
  if (n < 8) return fail(err, NF_EFORMAT, name, "truncated: no format version");
  unsigned major = p[6], minor = p[7];
  if (major < 1 || major > 3 || minor != 0)
    return fail(err, NF_EUNSUPPORTED, name,
                "unsupported .npy format version %u.%u", major, minor);
  if (major == 1) {
    if (n < 10) return fail(err, NF_EFORMAT, name, "truncated: no header length");
    *hlen = (size_t)p[8] | (size_t)p[9] << 8;
    *hstart = 10;
  } else {
    if (n < 12) return fail(err, NF_EFORMAT, name, "truncated: no header length");
    *hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 |
            (size_t)p[11] << 24;
    *hstart = 12;
  }
  return NF_OK;
}

typedef struct lexer {
  const char *s, *end;
} lexer;

static void skip_ws(lexer *lx) {
  while (lx->s < lx->end &&
         (*lx->s == ' ' || *lx->s == '\t' || *lx->s == '\n' || *lx->s == '\r'))
    lx->s++;
}

static int eat(lexer *lx, char c) {
  skip_ws(lx);
  if (lx->s < lx->end && *lx->s == c) {
    lx->s++;
    return 1;
  }
  return 0;
}

/* A quoted string without escapes; sets *str / *len (not NUL-terminated). */
static int lex_string(lexer *lx, const char **str, size_t *len) {
  skip_ws(lx);
  if (lx->s >= lx->end || (*lx->s != '\'' && *lx->s != '"')) return 0;
  char q = *lx->s++;
  const char *start = lx->s;
  while (lx->s < lx->end && *lx->s != q) {
    if (*lx->s == '\\' || *lx->s == '\n') return 0;
    lx->s++;
  }
  if (lx->s >= lx->end) return 0;
  *str = start;
  *len = (size_t)(lx->s - start);
  lx->s++;
  return 1;
}

static int lex_word(lexer *lx, const char *w) {
  skip_ws(lx);
  size_t n = strlen(w);
  if ((size_t)(lx->end - lx->s) < n || memcmp(lx->s, w, n) != 0) return 0;
  const char *after = lx->s + n;
  if (after < lx->end && (*after == '_' || (*after >= 'a' && *after <= 'z') ||
                          (*after >= 'A' && *after <= 'Z') ||
                          (*after >= '0' && *after <= '9')))
    return 0;
  lx->s = after;
  return 1;
}

static int str_is(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* Fills the dtype fields of h from a descr string. */
static int parse_descr(const char *s, size_t n, const char *name,
                       npy_header *h, nf_buf *err) {
  char order = '=';
  size_t i = 0;
  if (n > 0 && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    order = s[0];
    i = 1;
  }
  if (i >= n) return fail(err, NF_EFORMAT, name, "empty dtype descr");
  char kind = s[i++];
  int size = 0;
  if (i >= n) size = -1;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9' || size > 1000) {
      size = -1;
      break;
    }
    size = size * 10 + (s[i] - '0');
  }
  int ok = 0;
  if (size > 0) {
    switch (kind) {
    case 'f':
      ok = size == 4 || size == 8;
      h->kind = SRC_FLOAT;
      h->dtype = size == 4 ? NF_F32 : NF_F64;
      break;
    case 'i':
      ok = size == 1 || size == 2 || size == 4 || size == 8;
      h->kind = SRC_INT;
      h->dtype = size == 4 ? NF_I32 : NF_I64;
      break;
    case 'u':
      ok = size == 1 || size == 2 || size == 4;
      h->kind = SRC_UINT;
      h->dtype = NF_I64;
      break;
    case 'b':
      ok = size == 1;
      h->kind = SRC_BOOL;
      h->dtype = NF_BOOL;
      break;
    default:
      break;
    }
  }
  if (!ok) {
    if (kind == 'O')
      return fail(err, NF_EUNSUPPORTED, name, "object arrays are not supported");
    if (kind == 'u' && size == 8)
      return fail(err, NF_EUNSUPPORTED, name,
                  "dtype '%.*s' not supported (u8 values may not fit in i64)",
                  (int)n, s);
    return fail(err, NF_EUNSUPPORTED, name, "dtype '%.*s' not supported",
                (int)n, s);
  }
  h->itemsize = size;
  int little = host_is_little();
  h->swap = size > 1 && ((order == '<' && !little) || (order == '>' && little));
  return NF_OK;
}

/* Parses "(d0, d1, ...)" into h's shape. */
static int parse_shape(lexer *lx, const char *name, npy_header *h,
                       nf_buf *err) {
  if (!eat(lx, '(')) return fail(err, NF_EFORMAT, name, "shape is not a tuple");
  int rank = 0, trailing_comma = 0;
  skip_ws(lx);
  while (!eat(lx, ')')) {
    skip_ws(lx);
    if (lx->s < lx->end && *lx->s == '-')
      return fail(err, NF_EFORMAT, name, "negative dimension in shape");
    if (lx->s >= lx->end || *lx->s < '0' || *lx->s > '9')
      return fail(err, NF_EFORMAT, name, "malformed shape");
    int64_t v = 0;
    while (lx->s < lx->end && *lx->s >= '0' && *lx->s <= '9') {
      int digit = *lx->s++ - '0';
      if (v > (INT64_MAX - digit) / 10)
        return fail(err, NF_EFORMAT, name, "dimension too large in shape");
      v = v * 10 + digit;
    }
    if (lx->s < lx->end && (*lx->s == 'L' || *lx->s == 'l')) lx->s++;
    if (rank >= NF_MAX_RANK)
      return fail(err, NF_EUNSUPPORTED, name,
                  "rank above the maximum %d is not supported", NF_MAX_RANK);
    h->shape[rank++] = v;
    trailing_comma = eat(lx, ',');
    if (!trailing_comma) {
      if (!eat(lx, ')')) return fail(err, NF_EFORMAT, name, "malformed shape");
      break;
    }
  }
  if (rank == 1 && !trailing_comma)
    return fail(err, NF_EFORMAT, name, "shape is not a tuple");
  h->rank = rank;
  return NF_OK;
}

/* Parses the header dict text [s, s+n) into h (everything but data_start). */
static int parse_dict(const char *s, size_t n, const char *name, npy_header *h,
                      nf_buf *err) {
  lexer lx = {s, s + n};
  int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0;
  int rc;
  if (!eat(&lx, '{'))
    return fail(err, NF_EFORMAT, name, "header is not a dict");
  while (!eat(&lx, '}')) {
    const char *key, *val;
    size_t klen, vlen;
    if (!lex_string(&lx, &key, &klen) || !eat(&lx, ':'))
      return fail(err, NF_EFORMAT, name, "malformed header dict");
    if (str_is(key, klen, "descr")) {
      if (have_descr++) return fail(err, NF_EFORMAT, name, "duplicate key 'descr'");
      skip_ws(&lx);
      if (lx.s < lx.end && *lx.s == '[')
        return fail(err, NF_EUNSUPPORTED, name,
                    "structured dtypes are not supported");
      if (!lex_string(&lx, &val, &vlen))
        return fail(err, NF_EFORMAT, name, "'descr' is not a string");
      if ((rc = parse_descr(val, vlen, name, h, err)) < 0) return rc;
    } else if (str_is(key, klen, "fortran_order")) {
      if (have_fortran++)
        return fail(err, NF_EFORMAT, name, "duplicate key 'fortran_order'");
      if (lex_word(&lx, "True"))
        fortran = 1;
      else if (lex_word(&lx, "False"))
        fortran = 0;
      else
        return fail(err, NF_EFORMAT, name, "'fortran_order' is not True or False");
    } else if (str_is(key, klen, "shape")) {
      if (have_shape++) return fail(err, NF_EFORMAT, name, "duplicate key 'shape'");
      if ((rc = parse_shape(&lx, name, h, err)) < 0) return rc;
    } else {
      return fail(err, NF_EFORMAT, name, "unexpected key '%.*s' in header",
                  (int)klen, key);
    }
    if (!eat(&lx, ',')) {
      if (!eat(&lx, '}')) return fail(err, NF_EFORMAT, name, "malformed header dict");
      break;
    }
  }
  skip_ws(&lx);
  if (lx.s != lx.end)
    return fail(err, NF_EFORMAT, name, "unexpected text after the header dict");
  if (!have_descr || !have_fortran || !have_shape)
    return fail(err, NF_EFORMAT, name, "header lacks '%s'",
                !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
  if (fortran)
    return fail(err, NF_EUNSUPPORTED, name,
                "Fortran-order arrays are not supported");
  int64_t numel = 1;
  for (int d = 0; d < h->rank; d++) {
    if (h->shape[d] != 0 && numel > INT64_MAX / h->shape[d])
      return fail(err, NF_EFORMAT, name, "shape has too many elements");
    numel *= h->shape[d];
  }
  if ((uint64_t)numel > UINT64_MAX / (uint64_t)h->itemsize ||
      (uint64_t)numel * (uint64_t)h->itemsize > SIZE_MAX)
    return fail(err, NF_EFORMAT, name, "shape has too many elements");
  h->numel = numel;
  h->data_bytes = (uint64_t)numel * (uint64_t)h->itemsize;
  return NF_OK;
}

/* Checks that the data present (avail bytes after the header) is exactly
 * what the header promises. */
static int check_data_size(const npy_header *h, uint64_t avail,
                           const char *name, nf_buf *err) {
  if (avail < h->data_bytes)
    return fail(err, NF_EFORMAT, name,
                "truncated: header promises %llu bytes of data, file has %llu",
                (unsigned long long)h->data_bytes, (unsigned long long)avail);
  if (avail > h->data_bytes)
    return fail(err, NF_EFORMAT, name,
                "trailing bytes: header promises %llu bytes of data, file has "
                "%llu",
                (unsigned long long)h->data_bytes, (unsigned long long)avail);
  return NF_OK;
}

/* Converts count file elements at src into a's data starting at element
 * first. */
static void convert(const npy_header *h, const unsigned char *src,
                    size_t count, nf_array *a, size_t first) {
  int sz = h->itemsize;
  for (size_t k = 0; k < count; k++, src += sz) {
    unsigned char b[8];
    if (h->swap)
      for (int j = 0; j < sz; j++) b[j] = src[sz - 1 - j];
    else
      memcpy(b, src, (size_t)sz);
    size_t at = first + k;
    switch (h->kind) {
    case SRC_FLOAT:
      if (sz == 4)
        memcpy((float *)a->data + at, b, 4);
      else
        memcpy((double *)a->data + at, b, 8);
      break;
    case SRC_BOOL:
      ((uint8_t *)a->data)[at] = b[0] != 0;
      break;
    case SRC_INT: {
      int64_t v;
      if (sz == 1) {
        int8_t x;
        memcpy(&x, b, 1);
        v = x;
      } else if (sz == 2) {
        int16_t x;
        memcpy(&x, b, 2);
        v = x;
      } else if (sz == 4) {
        int32_t x;
        memcpy(&x, b, 4);
        ((int32_t *)a->data)[at] = x;
        break;
      } else {
        memcpy(&v, b, 8);
      }
      ((int64_t *)a->data)[at] = v;
      break;
    }
    case SRC_UINT: {
      uint64_t v;
      if (sz == 1) {
        v = b[0];
      } else if (sz == 2) {
        uint16_t x;
        memcpy(&x, b, 2);
        v = x;
      } else {
        uint32_t x;
        memcpy(&x, b, 4);
        v = x;
      }
      ((int64_t *)a->data)[at] = (int64_t)v;
      break;
    }
    }
  }
}

static int alloc_for(const npy_header *h, nf_array *a, const char *name,
                     nf_buf *err) {
  int rc = nf_array_alloc(a, h->dtype, h->rank, h->shape);
  if (rc < 0) return fail(err, rc, name, "cannot allocate the array: %s", nf_strerror(rc));
  return NF_OK;
}

int nf_npy_parse(const void *bytes, size_t n, const char *name, nf_array *a,
                 nf_buf *err) {
  const unsigned char *p = bytes;
  npy_header h;
  size_t hstart, hlen;
  int rc;
  memset(a, 0, sizeof *a);
  memset(&h, 0, sizeof h);
  if (!name) name = "<memory>";
  if ((rc = parse_prefix(p, n, name, &hstart, &hlen, err)) < 0) return rc;
  if (hlen > n - hstart)
    return fail(err, NF_EFORMAT, name,
                "truncated: header promises %zu bytes of header, file has %zu",
                hlen, n - hstart);
  if ((rc = parse_dict((const char *)p + hstart, hlen, name, &h, err)) < 0)
    return rc;
  h.data_start = hstart + hlen;
  if ((rc = check_data_size(&h, n - h.data_start, name, err)) < 0) return rc;
  if ((rc = alloc_for(&h, a, name, err)) < 0) return rc;
  convert(&h, p + h.data_start, (size_t)h.numel, a, 0);
  return NF_OK;
}

/* ---- file reading ---- */

/* Reads exactly n bytes; returns 1, or 0 on EOF or error (errno set). */
static int read_full(FILE *f, void *buf, size_t n) {
  if (n == 0) return 1;
  if (fread(buf, 1, n, f) == n) return 1;
  if (!ferror(f)) errno = 0;
  return 0;
}

static int io_fail(nf_buf *err, const char *path, const char *what) {
  if (errno)
    return fail(err, NF_EIO, path, "%s: %s", what, strerror(errno));
  return fail(err, NF_EFORMAT, path, "%s: file changed or ended early", what);
}

int nf_npy_read(const char *path, nf_array *a, nf_buf *err) {
  npy_header h;
  unsigned char prefix[12];
  size_t hstart, hlen;
  char *htext = NULL;
  int rc;
  memset(a, 0, sizeof *a);
  memset(&h, 0, sizeof h);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(err, NF_EIO, path, "cannot open: %s", strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    rc = fail(err, NF_EIO, path, "cannot stat: %s", strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = fail(err, NF_EIO, path, "not a regular file");
    goto out;
  }
  uint64_t fsize = (uint64_t)st.st_size;
  size_t np = fsize < sizeof prefix ? (size_t)fsize : sizeof prefix;
  if (!read_full(f, prefix, np)) {
    rc = io_fail(err, path, "cannot read the header");
    goto out;
  }
  if ((rc = parse_prefix(prefix, np, path, &hstart, &hlen, err)) < 0) goto out;
  if (hlen > fsize - hstart) {
    rc = fail(err, NF_EFORMAT, path,
              "truncated: header promises %zu bytes of header, file has %llu",
              hlen, (unsigned long long)(fsize - hstart));
    goto out;
  }
  htext = malloc(hlen ? hlen : 1);
  if (!htext) {
    rc = fail(err, NF_ENOMEM, path, "out of memory");
    goto out;
  }
  if (fseek(f, (long)hstart, SEEK_SET) != 0 || !read_full(f, htext, hlen)) {
    rc = io_fail(err, path, "cannot read the header");
    goto out;
  }
  if ((rc = parse_dict(htext, hlen, path, &h, err)) < 0) goto out;
  h.data_start = hstart + hlen;
  if ((rc = check_data_size(&h, fsize - h.data_start, path, err)) < 0) goto out;
  if ((rc = alloc_for(&h, a, path, err)) < 0) goto out;
  {
    /* Stream the data through a bounded buffer, converting as it comes. */
    unsigned char chunk[1 << 16];
    size_t per = sizeof chunk / (size_t)h.itemsize, done = 0;
    while (done < (size_t)h.numel) {
      size_t cnt = (size_t)h.numel - done < per ? (size_t)h.numel - done : per;
      if (!read_full(f, chunk, cnt * (size_t)h.itemsize)) {
        rc = io_fail(err, path, "cannot read the data");
        nf_array_free(a);
        goto out;
      }
      convert(&h, chunk, cnt, a, done);
      done += cnt;
    }
  }
  rc = NF_OK;
out:
  free(htext);
  fclose(f);
  return rc;
}

/* ---- writing ---- */

static const char *descr_of(nf_dtype t) {
  switch (t) {
  case NF_BOOL:
    return "|b1";
  case NF_I32:
    return "<i4";
  case NF_I64:
    return "<i8";
  case NF_F32:
    return "<f4";
  case NF_F64:
    return "<f8";
  default:
    return NULL;
  }
}

static int write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    p += w;
    n -= (size_t)w;
  }
  return 1;
}

/* Writes the data little-endian, swapping through a bounded buffer on a
 * big-endian host. */
static int write_data(int fd, const nf_array *a, size_t es) {
  size_t bytes = (size_t)a->numel * es;
  if (host_is_little() || es == 1) return write_full(fd, a->data, bytes);
  unsigned char chunk[1 << 16];
  const unsigned char *src = a->data;
  while (bytes > 0) {
    size_t n = bytes < sizeof chunk ? bytes : sizeof chunk;
    for (size_t k = 0; k < n; k += es)
      for (size_t j = 0; j < es; j++) chunk[k + j] = src[k + es - 1 - j];
    if (!write_full(fd, chunk, n)) return 0;
    src += n;
    bytes -= n;
  }
  return 1;
}

int nf_npy_write(const char *path, const nf_array *a, nf_buf *err) {
  const char *descr = descr_of(a->dtype);
  size_t es = array_elem_size(a->dtype);
  if (!descr) return fail(err, NF_EINVAL, path, "cannot write dtype %d", (int)a->dtype);
  if (a->rank < 0 || a->rank > NF_MAX_RANK)
    return fail(err, NF_EINVAL, path, "invalid rank %d", a->rank);
  int64_t numel = 1;
  for (int d = 0; d < a->rank; d++) {
    if (a->shape[d] < 0 || (a->shape[d] != 0 && numel > INT64_MAX / a->shape[d]))
      return fail(err, NF_EINVAL, path, "invalid shape");
    numel *= a->shape[d];
  }
  if (numel != a->numel || (numel > 0 && !a->data))
    return fail(err, NF_EINVAL, path, "array data does not match its shape");

  nf_buf hdr = NF_BUF_INIT, tmp = NF_BUF_INIT;
  nf_buf_add(&hdr, NPY_MAGIC, NPY_MAGIC_LEN);
  nf_buf_add(&hdr, "\x01\x00\x00\x00", 4); /* version 1.0, length later */
  nf_buf_printf(&hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int d = 0; d < a->rank; d++)
    nf_buf_printf(&hdr, d ? ", %lld" : "%lld", (long long)a->shape[d]);
  nf_buf_puts(&hdr, a->rank == 1 ? ",), }" : "), }");
  /* Like numpy >= 1.23: room for the first dimension to grow to 21 digits,
   * then spaces and '\n' up to a multiple of 64 (a full 64 when already
   * aligned, as numpy does). */
  if (a->rank > 0) {
    char digits[24];
    int nd = snprintf(digits, sizeof digits, "%lld", (long long)a->shape[0]);
    for (int k = nd; k < 21; k++) nf_buf_putc(&hdr, ' ');
  }
  size_t pad = NPY_ALIGN - (hdr.len + 1) % NPY_ALIGN;
  for (size_t k = 0; k < pad; k++) nf_buf_putc(&hdr, ' ');
  nf_buf_putc(&hdr, '\n');
  nf_buf_printf(&tmp, "%s.tmp.XXXXXX", path);
  int rc = NF_OK, fd = -1, created = 0;
  if (hdr.oom || tmp.oom) {
    rc = fail(err, NF_ENOMEM, path, "out of memory");
    goto out;
  }
  size_t hlen = hdr.len - 10;
  if (hlen > 65535) {
    rc = fail(err, NF_EINTERNAL, path, "header too long");
    goto out;
  }
  hdr.data[8] = (char)(hlen & 0xff);
  hdr.data[9] = (char)(hlen >> 8);

  fd = mkstemp(tmp.data);
  if (fd < 0) {
    rc = fail(err, NF_EIO, path, "cannot create a temporary file: %s",
              strerror(errno));
    goto out;
  }
  created = 1;
  /* mkstemp creates 0600; give the file the usual 0644 like numpy's open(). */
  if (fchmod(fd, 0644) != 0 || !write_full(fd, hdr.data, hdr.len) ||
      !write_data(fd, a, es) || fsync(fd) != 0) {
    rc = fail(err, NF_EIO, path, "cannot write %s: %s", tmp.data, strerror(errno));
    goto out;
  }
  if (close(fd) != 0) {
    fd = -1;
    rc = fail(err, NF_EIO, path, "cannot write %s: %s", tmp.data, strerror(errno));
    goto out;
  }
  fd = -1;
  if (rename(tmp.data, path) != 0) {
    rc = fail(err, NF_EIO, path, "cannot rename %s into place: %s", tmp.data,
              strerror(errno));
    goto out;
  }
out:
  if (fd >= 0) close(fd);
  if (rc < 0 && created) unlink(tmp.data);
  nf_buf_free(&hdr);
  nf_buf_free(&tmp);
  return rc;
}
