/* nf_buf.h - growable byte/char buffer used by printers and encoders.
 *
 * A buffer that failed to grow remembers it (oom flag) and ignores later
 * appends, so printers can append freely and check once at the end. */
#ifndef NF_BUF_H
#define NF_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "nf_status.h"

typedef struct nf_buf {
  char *data; /* NUL-terminated when non-NULL; owned by the buffer */
  size_t len, cap;
  int oom;
} nf_buf;

#define NF_BUF_INIT {NULL, 0, 0, 0}

void nf_buf_free(nf_buf *b);
void nf_buf_reset(nf_buf *b);
void nf_buf_add(nf_buf *b, const void *p, size_t n);
void nf_buf_puts(nf_buf *b, const char *s);
void nf_buf_putc(nf_buf *b, char c);
void nf_buf_printf(nf_buf *b, const char *fmt, ...) NF_PRINTF(2, 3);
void nf_buf_vprintf(nf_buf *b, const char *fmt, va_list ap);
/* Little-endian fixed-width and LEB128 appends for binary encodings. */
void nf_buf_u8(nf_buf *b, uint8_t v);
void nf_buf_uleb(nf_buf *b, uint64_t v);
void nf_buf_sleb(nf_buf *b, int64_t v);
void nf_buf_u64(nf_buf *b, uint64_t v);
/* Returns the contents (empty string when nothing was added); the pointer
 * stays valid until the next append or free. */
const char *nf_buf_str(const nf_buf *b);

/* Bytes owned by the holder: free with nf_blob_free (which resets it). */
typedef struct nf_blob {
  uint8_t *data;
  size_t len;
} nf_blob;

#define NF_BLOB_INIT {NULL, 0}

void nf_blob_free(nf_blob *b);

#endif
