/* nf_buf.c - growable buffer (see nf_buf.h). */
#include "nf_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nf_buf_free(nf_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->oom = 0;
}

void nf_buf_reset(nf_buf *b) {
  b->len = 0;
  if (b->data) b->data[0] = 0;
}

static int grow(nf_buf *b, size_t extra) {
  if (b->oom) return 0;
  if (b->len + extra + 1 <= b->cap) return 1;
  size_t ncap = b->cap ? b->cap : 64;
  while (ncap < b->len + extra + 1) {
    if (ncap > SIZE_MAX / 2) {
      b->oom = 1;
      return 0;
    }
    ncap *= 2;
  }
  char *nd = realloc(b->data, ncap);
  if (!nd) {
    b->oom = 1;
    return 0;
  }
  b->data = nd;
  b->cap = ncap;
  return 1;
}

void nf_buf_add(nf_buf *b, const void *p, size_t n) {
  if (!grow(b, n)) return;
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
}

void nf_buf_puts(nf_buf *b, const char *s) { nf_buf_add(b, s, strlen(s)); }

void nf_buf_putc(nf_buf *b, char c) { nf_buf_add(b, &c, 1); }

void nf_buf_vprintf(nf_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0 || !grow(b, (size_t)n)) return;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void nf_buf_printf(nf_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nf_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void nf_buf_u8(nf_buf *b, uint8_t v) { nf_buf_add(b, &v, 1); }

void nf_buf_uleb(nf_buf *b, uint64_t v) {
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    if (v) byte |= 0x80;
    nf_buf_u8(b, byte);
  } while (v);
}

void nf_buf_sleb(nf_buf *b, int64_t v) {
  /* Zig-zag then unsigned LEB128. */
  uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
  nf_buf_uleb(b, z);
}

void nf_buf_u64(nf_buf *b, uint64_t v) {
  uint8_t tmp[8];
  for (int i = 0; i < 8; i++) tmp[i] = (uint8_t)(v >> (8 * i));
  nf_buf_add(b, tmp, 8);
}

const char *nf_buf_str(const nf_buf *b) { return b->data ? b->data : ""; }

void nf_blob_free(nf_blob *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = 0;
}
