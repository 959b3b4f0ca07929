/* decode.c - the budgeted decoders: protobuf-c's unpack under an allocator
 * that refuses to go past a budget, then the checks protobuf-c does not
 * make (unknown fields, NUL bytes inside strings), then the validation of
 * validate.c.
 *
 * The budget: every allocation protobuf-c makes while unpacking one frame
 * of n bytes is charged (size plus a 16-byte header), cumulatively (frees
 * do not refund), against n + clamp(NF_WIRE_DECODE_FACTOR * n,
 * NF_WIRE_DECODE_BUDGET_MIN, NF_WIRE_DECODE_BUDGET_MAX).  The n term lets a
 * bytes field hold its payload (a job pipe's kernel binary); the rest
 * bounds the amplification of tiny repeated submessages.  Charging
 * cumulatively also bounds the work of protobuf-c's merging of a singular
 * submessage sent many times (each merge reallocates the repeated fields
 * merged so far, which would be quadratic).
 *
 * The header holds the size and a magic number, so the free functions can
 * use one static allocator and check that what they free came from here.
 *
 * Nesting needs no limit of its own: protobuf-c parses only the messages
 * of the schema (at most four deep: ClientMessage > Submit > Graph > Expr)
 * and keeps anything else as unknown-field bytes, which are refused.
 *
 * Unknown fields: protobuf-c keeps them (n_unknown_fields), except in a
 * submessage it discards (a oneof member replaced by a later one, a
 * singular submessage merged into a later copy).  So both the unpacked
 * message and the raw bytes are checked.
 *
 * Strings: protobuf-c copies a string's bytes and appends a NUL, so a NUL
 * inside one would silently cut it short.  The raw bytes are scanned for
 * that and for the unknown fields above; the scan follows the schema, as
 * deep as the unpack went. */
#include "nf_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_SIZE 16u
#define HDR_MAGIC 0x6e66776972656465ull /* "nfwirede" */
#define MAX_DEPTH 8                      /* schema depth is 4; some slack */

typedef struct budget {
  size_t left;
  int exceeded; /* an allocation was refused for the budget */
  int oom;      /* malloc failed */
} budget;

static void *budget_alloc(void *data, size_t size) {
  budget *b = data;
  if (size > b->left || b->left - size < HDR_SIZE) {
    b->exceeded = 1;
    return NULL;
  }
  b->left -= size + HDR_SIZE;
  uint8_t *p = calloc(1, size + HDR_SIZE);
  if (!p) {
    b->oom = 1;
    return NULL;
  }
  uint64_t hdr[2] = {(uint64_t)size, HDR_MAGIC};
  memcpy(p, hdr, sizeof(hdr));
  return p + HDR_SIZE;
}

static void budget_free(void *data, void *ptr) {
  (void)data;
  if (!ptr) return;
  uint8_t *p = (uint8_t *)ptr - HDR_SIZE;
  uint64_t hdr[2];
  memcpy(hdr, p, sizeof(hdr));
  NF_ASSERT(hdr[1] == HDR_MAGIC); /* freed by the wrong nf_wire_free_* */
  hdr[1] = 0;
  memcpy(p, hdr, sizeof(hdr));
  free(p);
}

static void *no_alloc(void *data, size_t size) {
  (void)data;
  (void)size;
  return NULL;
}

/* Frees only (allocating needs a budget, which lives during an unpack). */
static ProtobufCAllocator free_allocator = {no_alloc, budget_free, NULL};

static size_t budget_for(size_t n) {
  size_t extra = NF_WIRE_DECODE_BUDGET_MAX;
  if (n < NF_WIRE_DECODE_BUDGET_MAX / NF_WIRE_DECODE_FACTOR) extra = n * NF_WIRE_DECODE_FACTOR;
  if (extra < NF_WIRE_DECODE_BUDGET_MIN) extra = NF_WIRE_DECODE_BUDGET_MIN;
  return n > SIZE_MAX - extra ? SIZE_MAX : n + extra;
}

static void set_err(nf_wire_err *e, int code, const char *fmt, ...) NF_PRINTF(3, 4);
static void set_err(nf_wire_err *e, int code, const char *fmt, ...) {
  e->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
  va_end(ap);
}

/* ---- the walk over the unpacked message: unknown fields ---- */

/* Appends ".name" or "[i]" to a path of cap bytes; returns the old length. */
static size_t path_push(char *path, size_t cap, const char *fmt, ...) NF_PRINTF(3, 4);
static size_t path_push(char *path, size_t cap, const char *fmt, ...) {
  size_t old = strlen(path);
  if (old + 1 < cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path + old, cap - old, fmt, ap);
    va_end(ap);
  }
  return old;
}

static const char *dot(const char *path) { return path[0] ? "." : ""; }

/* Returns 0, or -1 with *e set, when m or a message inside it holds
 * unknown fields.  Recursion follows the schema's (finite) nesting. */
static int check_unknown(const ProtobufCMessage *m, char *path, size_t cap, int depth,
                         nf_wire_err *e) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  if (depth > MAX_DEPTH) {
    set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s: nested too deeply", path);
    return -1;
  }
  if (m->n_unknown_fields) {
    set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s%sunknown field %u (%s)",
            path, path[0] ? ": " : "", m->unknown_fields[0].tag, d->name);
    return -1;
  }
  for (unsigned f = 0; f < d->n_fields; f++) {
    const ProtobufCFieldDescriptor *fd = &d->fields[f];
    if (fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    const uint8_t *base = (const uint8_t *)m;
    if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
      continue;
    if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + fd->quantifier_offset);
      ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + fd->offset);
      for (size_t i = 0; i < n; i++) {
        size_t old = path_push(path, cap, "%s%s[%zu]", dot(path), fd->name, i);
        int rc = check_unknown(arr[i], path, cap, depth + 1, e);
        path[old] = 0;
        if (rc) return rc;
      }
    } else {
      const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)(base + fd->offset);
      if (!sub) continue;
      size_t old = path_push(path, cap, "%s%s", dot(path), fd->name);
      int rc = check_unknown(sub, path, cap, depth + 1, e);
      path[old] = 0;
      if (rc) return rc;
    }
  }
  return 0;
}

/* ---- the scan of the raw bytes: NULs inside strings, dropped fields ---- */

/* Reads a varint; returns its length, 0 when malformed. */
static size_t get_varint(const uint8_t *p, size_t n, uint64_t *v) {
  uint64_t x = 0;
  for (size_t i = 0; i < n && i < 10; i++) {
    x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80)) {
      *v = x;
      return i + 1;
    }
  }
  return 0;
}

/* Returns 0, or -1 with *e set for a string field holding a NUL byte, a
 * field the schema does not know (in a submessage protobuf-c dropped), or
 * bytes protobuf-c should not have accepted. */
static int scan_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                        char *path, size_t cap, int depth, nf_wire_err *e) {
  if (depth > MAX_DEPTH) {
    set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s: nested too deeply", path);
    return -1;
  }
  uint32_t seen[32] = {0}; /* occurrences per field index, for the path */
  const ProtobufCFieldDescriptor *member = NULL; /* the oneof member met */
  size_t pos = 0;
  while (pos < n) {
    uint64_t tag, len = 0;
    size_t k = get_varint(p + pos, n - pos, &tag);
    if (!k) goto malformed;
    pos += k;
    const ProtobufCFieldDescriptor *fd =
        tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
                               : NULL;
    if (!fd) {
      /* Unknown fields left in the unpacked message were refused already;
       * these were dropped by protobuf-c (a oneof member or a merged
       * submessage that a later one replaced). */
      set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s%sunknown field %llu (%s)", path,
              path[0] ? ": " : "", (unsigned long long)(tag >> 3), d->name);
      return -1;
    }
    /* protobuf-c keeps the last member of a oneof sent twice (or merges a
     * member sent twice): a message carries one, once (each message of the
     * schema has at most one oneof) */
    if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      if (member) {
        set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT,
                "%s%s%s and %s: a message carries one member of its oneof, once", path,
                path[0] ? ": " : "", member->name, fd->name);
        return -1;
      }
      member = fd;
    }
    switch (tag & 7) {
    case 0:
      k = get_varint(p + pos, n - pos, &len);
      if (!k) goto malformed;
      pos += k;
      continue;
    case 1:
      if (n - pos < 8) goto malformed;
      pos += 8;
      continue;
    case 5:
      if (n - pos < 4) goto malformed;
      pos += 4;
      continue;
    case 2:
      break;
    default:
      goto malformed;
    }
    k = get_varint(p + pos, n - pos, &len);
    if (!k || len > n - pos - k) goto malformed;
    pos += k;
    const uint8_t *body = p + pos;
    pos += (size_t)len;
    if (fd->type != PROTOBUF_C_TYPE_STRING && fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    size_t fi = (size_t)(fd - d->fields);
    uint32_t occ = fi < 32 ? seen[fi]++ : 0;
    size_t old = fd->label == PROTOBUF_C_LABEL_REPEATED
                     ? path_push(path, cap, "%s%s[%u]", dot(path), fd->name, occ)
                     : path_push(path, cap, "%s%s", dot(path), fd->name);
    int rc = 0;
    if (fd->type == PROTOBUF_C_TYPE_STRING) {
      if (memchr(body, 0, (size_t)len)) {
        set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s: string holds a NUL byte",
                path);
        rc = -1;
      }
    } else {
      rc = scan_strings(fd->descriptor, body, (size_t)len, path, cap, depth + 1, e);
    }
    path[old] = 0;
    if (rc) return rc;
  }
  return 0;
malformed:
  set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s%smalformed message", path,
          path[0] ? ": " : "");
  return -1;
}

/* ---- the decoders ---- */

typedef int (*validate_fn)(const ProtobufCMessage *m, nf_wire_err *e);

static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, validate_fn validate,
                                const uint8_t *p, size_t n, nf_wire_err *e) {
  e->code = NEOFLOW__ERROR_CODE__ERR_NONE;
  e->msg[0] = 0;
  budget b = {.left = budget_for(n)};
  size_t total = b.left;
  ProtobufCAllocator a = {budget_alloc, budget_free, &b};
  ProtobufCMessage *m = protobuf_c_message_unpack(d, &a, n, p);
  if (!m) {
    if (b.oom)
      set_err(e, NEOFLOW__ERROR_CODE__ERR_INTERNAL, "%s: out of memory while decoding",
              d->short_name);
    else if (b.exceeded)
      set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT,
              "%s: decoding needs more than its budget of %zu bytes (frame of %zu)",
              d->short_name, total, n);
    else
      set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "%s: malformed message",
              d->short_name);
    return NULL;
  }
  char path[160] = "";
  if (check_unknown(m, path, sizeof(path), 0, e) ||
      scan_strings(d, p, n, path, sizeof(path), 0, e) || validate(m, e)) {
    if (!e->code) set_err(e, NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT, "invalid message");
    protobuf_c_message_free_unpacked(m, &free_allocator);
    return NULL;
  }
  return m;
}

static int v_client(const ProtobufCMessage *m, nf_wire_err *e) {
  return nf_wire_validate_client((const Neoflow__ClientMessage *)m, e);
}
static int v_server(const ProtobufCMessage *m, nf_wire_err *e) {
  return nf_wire_validate_server((const Neoflow__ServerMessage *)m, e);
}
static int v_job_request(const ProtobufCMessage *m, nf_wire_err *e) {
  return nf_wire_validate_job_request((const Neoflow__JobRequest *)m, e);
}
static int v_job_event(const ProtobufCMessage *m, nf_wire_err *e) {
  return nf_wire_validate_job_event((const Neoflow__JobEvent *)m, e);
}

/* See nf_wire.h: unpack under the budget, no unknown fields, validate. */
Neoflow__ClientMessage *nf_wire_decode_client(const uint8_t *p, size_t n, nf_wire_err *e) {
  return (Neoflow__ClientMessage *)decode(&neoflow__client_message__descriptor, v_client, p, n,
                                          e);
}

/* See nf_wire.h. */
Neoflow__ServerMessage *nf_wire_decode_server(const uint8_t *p, size_t n, nf_wire_err *e) {
  return (Neoflow__ServerMessage *)decode(&neoflow__server_message__descriptor, v_server, p, n,
                                          e);
}

/* See nf_wire.h. */
Neoflow__JobRequest *nf_wire_decode_job_request(const uint8_t *p, size_t n, nf_wire_err *e) {
  return (Neoflow__JobRequest *)decode(&neoflow__job_request__descriptor, v_job_request, p, n,
                                       e);
}

/* See nf_wire.h. */
Neoflow__JobEvent *nf_wire_decode_job_event(const uint8_t *p, size_t n, nf_wire_err *e) {
  return (Neoflow__JobEvent *)decode(&neoflow__job_event__descriptor, v_job_event, p, n, e);
}

/* Frees a message from nf_wire_decode_client; NULL is a no-op. */
void nf_wire_free_client(Neoflow__ClientMessage *m) {
  if (m) protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}

/* Frees a message from nf_wire_decode_server; NULL is a no-op. */
void nf_wire_free_server(Neoflow__ServerMessage *m) {
  if (m) protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}

/* Frees a message from nf_wire_decode_job_request; NULL is a no-op. */
void nf_wire_free_job_request(Neoflow__JobRequest *m) {
  if (m) protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}

/* Frees a message from nf_wire_decode_job_event; NULL is a no-op. */
void nf_wire_free_job_event(Neoflow__JobEvent *m) {
  if (m) protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}
