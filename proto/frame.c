/* frame.c - the wire protocol's framing: a 4-byte big-endian payload
 * length, then the payload (one packed message).
 *
 * nf_frame_reader consumes a non-blocking stream incrementally; the
 * blocking helpers (nf_wire_write_frame, nf_wire_read_frame) serve the
 * tool, the tests and the job pipes.
 *
 * Invariants:
 *  - A length prefix is compared with the limit before anything is
 *    allocated, and a payload buffer is allocated once, at its exact size
 *    (never more than the limit that admitted it).
 *  - Reader states between calls: n_hdr < 4 (reading a header; nothing
 *    allocated); n_hdr == 4 and got < len (reading a payload into buf);
 *    n_hdr == 4 and got == len (a frame was returned by the last call: its
 *    buffer is freed at the start of the next call); n_hdr == READER_DEAD
 *    (a length was refused; every later call fails with NF_ELIMIT).
 *  - The blocking helpers loop on EINTR, EAGAIN and partial transfers, and
 *    measure a timeout against one deadline for the whole frame.
 *
 * This file neither decodes nor validates payloads (decode.c does). */
#include "nf_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* n_hdr of a reader that refused a length: the stream is unusable. */
#define READER_DEAD UINT32_MAX

/* What a zero-length frame points at (never NULL). */
static const uint8_t empty_payload[1];

/* ---- the incremental reader ---- */

/* Starts a reader whose frames may carry up to max payload bytes. */
void nf_frame_reader_init(nf_frame_reader *r, uint32_t max) {
  memset(r, 0, sizeof(*r));
  r->max = max;
}

/* Sets the limit for frames whose header has not started yet (a frame in
 * progress keeps the limit that admitted it). */
void nf_frame_reader_set_max(nf_frame_reader *r, uint32_t max) { r->max = max; }

/* Frees the payload buffer (if any); the reader may be initialised again. */
void nf_frame_reader_free(nf_frame_reader *r) {
  free(r->buf);
  r->buf = NULL;
  r->n_hdr = 0;
  r->len = r->got = 0;
}

static int frame_done(const nf_frame_reader *r) {
  return r->n_hdr == 4 && r->got == r->len;
}

/* 1 while a frame has been started (at least one header byte) and not yet
 * returned; also 1 for a reader that refused a length. */
int nf_frame_reader_mid_frame(const nf_frame_reader *r) {
  if (r->n_hdr == READER_DEAD) return 1;
  return r->n_hdr > 0 && !frame_done(r);
}

/* See nf_wire.h.  The returned payload lives in r->buf (or a static empty
 * buffer for a zero-length frame) until the next call or free. */
int nf_frame_reader_feed(nf_frame_reader *r, const uint8_t *data, size_t n, size_t *used,
                         const uint8_t **frame, size_t *len) {
  size_t pos = 0;
  *used = 0;
  if (r->n_hdr == READER_DEAD) return NF_ELIMIT;
  if (frame_done(r)) { /* the previous frame was handed out */
    free(r->buf);
    r->buf = NULL;
    r->n_hdr = 0;
    r->len = r->got = 0;
  }
  for (;;) {
    while (r->n_hdr < 4 && pos < n) r->hdr[r->n_hdr++] = data[pos++];
    if (r->n_hdr < 4) break; /* all input consumed inside a header */
    if (r->got == 0 && !r->buf) {
      /* The header just completed (or an allocation is being retried). */
      r->len = (uint32_t)r->hdr[0] << 24 | (uint32_t)r->hdr[1] << 16 |
               (uint32_t)r->hdr[2] << 8 | (uint32_t)r->hdr[3];
      if (r->len > r->max) {
        r->n_hdr = READER_DEAD;
        *used = pos;
        return NF_ELIMIT;
      }
      if (r->len > 0) {
        r->buf = malloc(r->len);
        if (!r->buf) {
          *used = pos;
          return NF_ENOMEM;
        }
      }
    }
    size_t take = r->len - r->got;
    if (take > n - pos) take = n - pos;
    if (take) memcpy(r->buf + r->got, data + pos, take);
    r->got += (uint32_t)take;
    pos += take;
    if (r->got == r->len) {
      *frame = r->buf ? r->buf : empty_payload;
      *len = r->len;
      *used = pos;
      return 1;
    }
    break; /* input exhausted mid-payload */
  }
  *used = pos;
  return 0;
}

/* ---- packing ---- */

typedef struct buf_appender {
  ProtobufCBuffer base;
  nf_buf *out;
} buf_appender;

static void append_to_buf(ProtobufCBuffer *b, size_t n, const uint8_t *data) {
  nf_buf_add(((buf_appender *)b)->out, data, n);
}

/* See nf_wire.h.  On failure out keeps its previous contents (unless it
 * ran out of memory, which nf_buf remembers). */
int nf_wire_pack(const ProtobufCMessage *m, uint32_t max, nf_buf *out) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (n > max) return NF_ELIMIT;
  if (out->oom) return NF_ENOMEM;
  size_t start = out->len;
  uint8_t hdr[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  nf_buf_add(out, hdr, sizeof(hdr));
  buf_appender app = {.base = {.append = append_to_buf}, .out = out};
  size_t packed = protobuf_c_message_pack_to_buffer(m, &app.base);
  if (out->oom) return NF_ENOMEM;
  if (packed != n || out->len != start + 4 + n) {
    out->len = start;
    if (out->data) out->data[start] = 0;
    return NF_EINTERNAL;
  }
  return NF_OK;
}

/* ---- blocking helpers ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or the deadline (-1: none) passes.
 * NF_OK, or NF_EIO with errno set (ETIMEDOUT on the deadline). */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int wait = -1;
    if (deadline >= 0) {
      int64_t left = deadline - now_ms();
      if (left <= 0) {
        errno = ETIMEDOUT;
        return NF_EIO;
      }
      wait = left > 1000000 ? 1000000 : (int)left;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, wait);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return NF_EIO;
    }
    if (rc > 0) return NF_OK; /* ready, or an error/hangup the IO call reports */
  }
}

static int64_t deadline_of(int timeout_ms) {
  return timeout_ms > 0 ? now_ms() + timeout_ms : -1;
}

/* Writes n bytes, looping on partial writes, EINTR and EAGAIN.  With a
 * deadline no call may block past it: sockets are written with
 * MSG_DONTWAIT, other blocking descriptors (pipes) PIPE_BUF bytes at a
 * time once poll says there is room (which a pipe guarantees for that
 * much). */
static int write_all(int fd, const uint8_t *p, size_t n, int64_t deadline) {
  struct stat st;
  int is_sock = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
  int fl = fcntl(fd, F_GETFL);
  int nonblock = fl >= 0 && (fl & O_NONBLOCK);
  int sflags = MSG_NOSIGNAL | (deadline >= 0 ? MSG_DONTWAIT : 0);
  while (n > 0) {
    size_t chunk = n;
    if (deadline >= 0) {
      int rc = wait_fd(fd, POLLOUT, deadline);
      if (rc) return rc;
      if (!is_sock && !nonblock && chunk > PIPE_BUF) chunk = PIPE_BUF;
    }
    ssize_t w = is_sock ? send(fd, p, chunk, sflags) : write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc) return rc;
        continue;
      }
      return NF_EIO;
    }
    p += w;
    n -= (size_t)w;
  }
  return NF_OK;
}

/* See nf_wire.h. */
int nf_wire_write_bytes(int fd, const uint8_t *p, size_t n, int timeout_ms) {
  return write_all(fd, p, n, deadline_of(timeout_ms));
}

/* See nf_wire.h. */
int nf_wire_write_frame(int fd, const ProtobufCMessage *m, uint32_t max, int timeout_ms) {
  int64_t deadline = deadline_of(timeout_ms);
  nf_buf b = NF_BUF_INIT;
  int rc = nf_wire_pack(m, max, &b);
  if (rc == NF_OK) rc = write_all(fd, (const uint8_t *)b.data, b.len, deadline);
  int saved = errno;
  nf_buf_free(&b);
  errno = saved;
  return rc;
}

/* Reads up to n bytes; returns the count read before EOF (< n only at
 * EOF), or a negative status with errno set. */
static ssize_t read_full(int fd, uint8_t *p, size_t n, int64_t deadline) {
  size_t got = 0;
  while (got < n) {
    if (deadline >= 0) {
      int rc = wait_fd(fd, POLLIN, deadline);
      if (rc) return rc;
    }
    ssize_t r = read(fd, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        int rc = wait_fd(fd, POLLIN, deadline);
        if (rc) return rc;
        continue;
      }
      return NF_EIO;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* Makes room for exactly n bytes plus the NUL in b, which holds nothing
 * (nf_buf has no reserve call; this keeps its invariants: data owned,
 * NUL-terminated, cap the allocated size). */
static int buf_reserve(nf_buf *b, size_t n) {
  if (b->oom) return NF_ENOMEM;
  if (b->cap >= n + 1) return NF_OK;
  char *nd = realloc(b->data, n + 1);
  if (!nd) return NF_ENOMEM;
  b->data = nd;
  b->cap = n + 1;
  b->data[b->len] = 0;
  return NF_OK;
}

/* See nf_wire.h. */
int nf_wire_read_frame(int fd, uint32_t max, int timeout_ms, nf_buf *out) {
  int64_t deadline = deadline_of(timeout_ms);
  uint8_t hdr[4];
  nf_buf_reset(out);
  ssize_t r = read_full(fd, hdr, 4, deadline);
  if (r < 0) return (int)r;
  if (r == 0) return NF_ENOENT;
  if (r < 4) return NF_EFORMAT;
  uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 |
                 (uint32_t)hdr[3];
  if (len > max) return NF_ELIMIT;
  int rc = buf_reserve(out, len);
  if (rc) return rc;
  r = read_full(fd, (uint8_t *)out->data, len, deadline);
  if (r < 0 || (size_t)r < len) {
    out->data[0] = 0; /* out stays empty */
    return r < 0 ? (int)r : NF_EFORMAT;
  }
  out->len = len;
  out->data[len] = 0;
  return NF_OK;
}
