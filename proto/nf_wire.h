/* nf_wire.h - the wire protocol's C side: framing, the budgeted decoder,
 * message validation and graph conversion (proto/neoflow.proto).
 *
 * Shared by the client library, the neoflow tool, neoflowd and its job
 * processes; nothing here does I/O on sockets except the blocking helpers
 * at the end (used by the tool, the tests and the job pipes).
 *
 * Frame: 4-byte big-endian payload length, then the payload (one packed
 * message).  A length over the reader's current limit is refused before
 * anything is allocated.
 *
 * Decoding: protobuf-c's unpack with an allocator that refuses to go past
 * a budget (the frame's size plus NF_WIRE_DECODE_FACTOR x the frame, at
 * least 64 KiB, at most 64 MiB), then a check that no message anywhere
 * holds unknown fields or NULs inside strings, then the validation of
 * every field that
 * the receiver will use (enum values known, oneof set, string lengths and
 * UTF-8, byte lengths, counts, finite numbers).  A message that fails is
 * freed and reported with a typed error: the Neoflow__ErrorCode to send
 * and a message naming the field ("submit.graph.exprs[17].args[1]: ...").
 * Graph semantics (shapes, references, typing, acyclicity) are checked by
 * nf_wire_graph_to_ir, which never asserts. */
#ifndef NF_WIRE_H
#define NF_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "neoflow.pb-c.h"
#include "nf_buf.h"
#include "nf_ir.h"

#define NF_WIRE_PROTOCOL_MIN 1
#define NF_WIRE_PROTOCOL_MAX 1

#define NF_WIRE_HANDSHAKE_MAX 4096u          /* frames before the Welcome */
#define NF_WIRE_FRAME_MAX (4u << 20)         /* control frames after it */
#define NF_WIRE_CHUNK_MAX (1u << 20)         /* Chunk.data */
#define NF_WIRE_BINARY_MAX (256u << 20)      /* one kernel binary */
#define NF_WIRE_JOB_FRAME_MAX (NF_WIRE_BINARY_MAX + (4u << 20)) /* job pipes */
#define NF_WIRE_DECODE_BUDGET_MAX (64u << 20)
#define NF_WIRE_NAME_MAX 64                  /* tensor, graph, client names */
#define NF_WIRE_TEXT_MAX 1024                /* error messages, descriptions */
#define NF_WIRE_SCHEDULE_MAX (64u << 10)     /* schedule text */
#define NF_WIRE_MAX_TENSORS 4096
#define NF_WIRE_MAX_STMTS 4096
#define NF_WIRE_MAX_EXPRS (1u << 20)
#define NF_WIRE_MAX_STEP_TIMES 4096
/* Expression nodes summed over statements, each statement counting every
 * node its right side reaches (statements may share expressions; this
 * bounds the per-statement walks of validation, hashing and lowering). */
#define NF_WIRE_MAX_STMT_NODES (1u << 22)
#define NF_WIRE_DESCRIPTION_MAX 256          /* Target.description */
#define NF_WIRE_MAX_STATUS_ITEMS 16384       /* StatusReply.clients, .jobs */
#define NF_WIRE_MAX_PRIOR 65536              /* JobRequest.prior */
#define NF_WIRE_MAX_TRANSFER 1024            /* JobRequest.transfer */
#define NF_WIRE_MAX_CORPUS 65536             /* JobRequest.corpus */
#define NF_WIRE_FEATURES_MAX (16u << 10)     /* Record.features bytes */
/* The decode budget of a frame of n bytes: n + clamp(FACTOR * n,
 * BUDGET_MIN, BUDGET_MAX) bytes allocated in all (decode.c). */
#define NF_WIRE_DECODE_FACTOR 32u
#define NF_WIRE_DECODE_BUDGET_MIN (64u << 10)

/* ---- frames ---- */

/* An incremental frame reader for a non-blocking stream. */
typedef struct nf_frame_reader {
  uint32_t max;     /* current payload limit */
  uint8_t hdr[4];
  uint32_t n_hdr;   /* header bytes received */
  uint32_t len;     /* payload length (valid once n_hdr == 4) */
  uint32_t got;     /* payload bytes received */
  uint8_t *buf;     /* payload (malloc'd once the header is complete) */
} nf_frame_reader;

void nf_frame_reader_init(nf_frame_reader *r, uint32_t max);
/* Changes the limit for frames not yet started. */
void nf_frame_reader_set_max(nf_frame_reader *r, uint32_t max);
void nf_frame_reader_free(nf_frame_reader *r);
/* 1 while a frame has been started but not completed (slowloris timer). */
int nf_frame_reader_mid_frame(const nf_frame_reader *r);
/* Consumes bytes from data[0..n).  *used gets the bytes consumed.  Returns
 * 1 when a frame completed: *frame / *len point at its payload, valid until
 * the next call (call again with the rest: data + *used); 0 when all n
 * bytes were consumed without completing one; NF_ELIMIT when a length
 * prefix exceeds the limit (nothing allocated; the stream is unusable);
 * NF_ENOMEM.  A zero-length frame is a frame. */
int nf_frame_reader_feed(nf_frame_reader *r, const uint8_t *data, size_t n, size_t *used,
                         const uint8_t **frame, size_t *len);

/* Appends the 4-byte header and the packed message to out.  NF_ELIMIT if
 * the packed size exceeds max, NF_ENOMEM. */
int nf_wire_pack(const ProtobufCMessage *m, uint32_t max, nf_buf *out);

/* ---- decoding (budgeted, checked, validated) ---- */

typedef struct nf_wire_err {
  int code;        /* Neoflow__ErrorCode; ERR_NONE when fine */
  char msg[256];   /* what, where, why */
} nf_wire_err;

/* Each decoder returns the message, or NULL with *e filled (code
 * ERR_INVALID_ARGUMENT for a malformed or invalid message, ERR_INTERNAL
 * for memory).  Free with the matching nf_wire_free_*. */
Neoflow__ClientMessage *nf_wire_decode_client(const uint8_t *p, size_t n, nf_wire_err *e);
Neoflow__ServerMessage *nf_wire_decode_server(const uint8_t *p, size_t n, nf_wire_err *e);
Neoflow__JobRequest *nf_wire_decode_job_request(const uint8_t *p, size_t n, nf_wire_err *e);
Neoflow__JobEvent *nf_wire_decode_job_event(const uint8_t *p, size_t n, nf_wire_err *e);
void nf_wire_free_client(Neoflow__ClientMessage *m);
void nf_wire_free_server(Neoflow__ServerMessage *m);
void nf_wire_free_job_request(Neoflow__JobRequest *m);
void nf_wire_free_job_event(Neoflow__JobEvent *m);

/* The field validation the decoders run after unpacking (validate.c),
 * also usable on messages built by hand before sending them.  NF_OK with
 * e->code ERR_NONE, or NF_EINVAL with e filled (ERR_INVALID_ARGUMENT and
 * the field's path).  Graph semantics are left to nf_wire_graph_to_ir. */
int nf_wire_validate_client(const Neoflow__ClientMessage *m, nf_wire_err *e);
int nf_wire_validate_server(const Neoflow__ServerMessage *m, nf_wire_err *e);
int nf_wire_validate_job_request(const Neoflow__JobRequest *m, nf_wire_err *e);
int nf_wire_validate_job_event(const Neoflow__JobEvent *m, nf_wire_err *e);
/* Makes the NUL-terminated s (edited in place) pass as wire text of at
 * most max bytes: invalid UTF-8 and control characters (except \n and \t
 * when multiline) become '?', then s is cut at the last character
 * boundary within max bytes (a plain truncation could split a UTF-8
 * sequence, and a receiver refuses the whole message).  Returns s.  For
 * messages (NF_WIRE_TEXT_MAX, multiline) built from system or compiler
 * text, and names (NF_WIRE_NAME_MAX, single-line). */
char *nf_wire_text_sanitize(char *s, size_t max, int multiline);

/* ---- graphs ---- */

/* Builds the wire form of g (every allocation malloc'd; free with
 * nf_wire_graph_free, never with an nf_wire_free_*): each distinct
 * expression once, arguments before their users, names copied (statement
 * variable names are not carried).  NF_OK, NF_EINVAL (g does not
 * validate), NF_ELIMIT (more tensors, statements or expressions than the
 * NF_WIRE_MAX_* limits), NF_ENOMEM. */
int nf_wire_graph_from_ir(const nf_graph *g, Neoflow__Graph **out);
void nf_wire_graph_free(Neoflow__Graph *pg);
/* Builds an nf_graph in ctx from a decoded wire graph, checking
 * everything first (counts against the NF_WIRE_MAX_* limits, ranks, sizes
 * >= 0 with products that fit, tensor kinds and the inputs/outputs lists,
 * every expression's arity, dtype rules, variable and tensor references,
 * args pointing only at earlier expressions, statement order, the nodes
 * reached per statement summed over statements, every right side at most
 * NF_MAX_EXPR_DEPTH nodes tall), so that no constructor assertion can
 * fire and nothing recurses; then nf_graph_validate, the depth with
 * inlinable producers substituted (nf_graph_measure, NF_MAX_EXPR_DEPTH too)
 * and the index bounds (nf_graph_check_bounds).  NF_OK, or NF_EINVAL with
 * a message naming the first offending element ("exprs[17]: ADD of f32
 * and i64", "statement 0 (C): A(v0 + 1000, v2) reads out of bounds:
 * ..."), NF_ENOMEM. */
int nf_wire_graph_to_ir(const Neoflow__Graph *pg, nf_ir_ctx *ctx, nf_graph **out,
                        nf_buf *err);

/* ---- blocking helpers (tool, tests, job pipes) ---- */

/* Writes one frame (header + packed m) to fd, looping on partial writes
 * and EINTR.  timeout_ms <= 0: no limit.  NF_OK, NF_ELIMIT, NF_EIO (errno
 * kept), NF_ENOMEM. */
int nf_wire_write_frame(int fd, const ProtobufCMessage *m, uint32_t max, int timeout_ms);
/* Writes n bytes (a frame already made, e.g. sealed: nf_wire_box.h) the
 * same way.  NF_OK, NF_EIO (errno kept). */
int nf_wire_write_bytes(int fd, const uint8_t *p, size_t n, int timeout_ms);
/* Reads one frame's payload into out (reset first).  NF_OK; NF_ENOENT at
 * a clean EOF before any byte; NF_EFORMAT for EOF mid-frame (truncated);
 * NF_ELIMIT when the length exceeds max; NF_EIO on a read error or the
 * timeout (timeout_ms <= 0: none). */
int nf_wire_read_frame(int fd, uint32_t max, int timeout_ms, nf_buf *out);

/* The per-user default socket of neoflowd (docs/daemon.md): with_env,
 * $NEOFLOW_SOCKET when set; else $XDG_RUNTIME_DIR/neoflowd/neoflowd.sock,
 * /run/neoflowd/neoflowd.sock for root, /tmp/neoflowd-UID/neoflowd.sock.
 * NF_OK, or NF_ELIMIT (out emptied) when it does not fit in n bytes. */
int nf_wire_default_socket(char *out, size_t n, int with_env);

#endif
