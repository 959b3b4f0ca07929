/* fuzz_wire.c - libFuzzer target for the wire protocol's C side: the frame
 * reader, the four budgeted decoders (with validation) and the conversion
 * of decoded graphs to the IR.
 *
 * Input: byte 0 picks the mode (bit 0 set: the rest is one raw payload;
 * clear: the rest is a stream of frames), bytes 1..4 give the sizes of the
 * pieces the stream is fed to the reader in (piece k has 1 + byte[1 + k %
 * 4] bytes), the rest is the data.  tests/test_proto writes seed inputs of
 * this form (NF_WIRE_CORPUS_DIR).
 *
 * Checked (abort() on a violation, so libFuzzer keeps the input):
 *  - the reader consumes exactly what it is fed, never returns a frame
 *    over its limit (the handshake limit, then the normal one), and
 *    reports only 0, 1 or NF_ELIMIT (after which the stream is abandoned);
 *  - every decoder either returns a message with ERR_NONE or NULL with a
 *    code and a non-empty message; a decoded message packs and decodes
 *    again (unless the smaller canonical frame gets a smaller budget);
 *  - a decoded graph (Submit, JobRequest) converts to the IR or is
 *    refused with a message (never an assertion); a converted graph goes
 *    back to the wire, through the decoder again and to the IR with the
 *    same nf_graph_hash.
 * Built only with -Dfuzz=true (see meson.build here).  Run:
 *   build-fuzz/tests/fuzz/fuzz_wire -max_len=65536 tests/fuzz/wire_corpus/ */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                        \
  do {                                                                  \
    if (!(c)) {                                                         \
      fprintf(stderr, "fuzz_wire: check failed: %s (line %d)\n", #c,    \
              __LINE__);                                                \
      abort();                                                          \
    }                                                                   \
  } while (0)

enum { K_CLIENT, K_SERVER, K_JOB_REQUEST, K_JOB_EVENT, N_KINDS };

static ProtobufCMessage *dec(int kind, const uint8_t *p, size_t n, nf_wire_err *e) {
  switch (kind) {
  case K_CLIENT: return (ProtobufCMessage *)nf_wire_decode_client(p, n, e);
  case K_SERVER: return (ProtobufCMessage *)nf_wire_decode_server(p, n, e);
  case K_JOB_REQUEST: return (ProtobufCMessage *)nf_wire_decode_job_request(p, n, e);
  default: return (ProtobufCMessage *)nf_wire_decode_job_event(p, n, e);
  }
}

static void dfree(int kind, ProtobufCMessage *m) {
  switch (kind) {
  case K_CLIENT: nf_wire_free_client((Neoflow__ClientMessage *)m); break;
  case K_SERVER: nf_wire_free_server((Neoflow__ServerMessage *)m); break;
  case K_JOB_REQUEST: nf_wire_free_job_request((Neoflow__JobRequest *)m); break;
  default: nf_wire_free_job_event((Neoflow__JobEvent *)m); break;
  }
}

static void check_err(const ProtobufCMessage *m, const nf_wire_err *e) {
  if (m) {
    CHECK(e->code == NEOFLOW__ERROR_CODE__ERR_NONE);
  } else {
    CHECK(e->code != NEOFLOW__ERROR_CODE__ERR_NONE);
    CHECK(e->msg[0] != 0);
    CHECK(memchr(e->msg, 0, sizeof(e->msg)) != NULL);
  }
}

/* The payload of m without the frame header. */
static void pack_payload(const ProtobufCMessage *m, nf_buf *b) {
  nf_buf_reset(b);
  CHECK(nf_wire_pack(m, UINT32_MAX, b) == NF_OK);
  memmove(b->data, b->data + 4, b->len - 4);
  b->len -= 4;
}

/* A decoded graph to the IR and, when it converts, around again. */
static void check_graph(const Neoflow__Graph *pg) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  CHECK(ctx != NULL);
  nf_graph *g = NULL;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_wire_graph_to_ir(pg, ctx, &g, &err);
  CHECK(rc == NF_OK || rc == NF_EINVAL);
  CHECK((rc == NF_OK) == (g != NULL));
  if (rc) CHECK(err.len > 0);
  if (rc == NF_OK) {
    Neoflow__Graph *pg2 = NULL;
    CHECK(nf_wire_graph_from_ir(g, &pg2) == NF_OK);
    Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
    s.graph = pg2;
    Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
    cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
    cm.submit = &s;
    nf_buf b = NF_BUF_INIT;
    pack_payload(&cm.base, &b);
    nf_wire_err e;
    Neoflow__ClientMessage *m = nf_wire_decode_client((const uint8_t *)b.data, b.len, &e);
    if (!m) {
      fprintf(stderr, "fuzz_wire: a converted graph does not decode: %s\n", e.msg);
      abort();
    }
    nf_ir_ctx *ctx2 = nf_ir_ctx_new();
    nf_graph *g2 = NULL;
    nf_buf_reset(&err);
    if (nf_wire_graph_to_ir(m->submit->graph, ctx2, &g2, &err) != NF_OK) {
      fprintf(stderr, "fuzz_wire: a converted graph does not convert again: %s\n",
              nf_buf_str(&err));
      abort();
    }
    uint8_t h1[32], h2[32];
    CHECK(nf_graph_hash(g, h1) == NF_OK && nf_graph_hash(g2, h2) == NF_OK);
    CHECK(memcmp(h1, h2, 32) == 0);
    nf_wire_free_client(m);
    nf_wire_graph_free(pg2);
    nf_buf_free(&b);
    nf_ir_ctx_free(ctx2);
  }
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}

static void decode_all(const uint8_t *p, size_t n) {
  for (int kind = 0; kind < N_KINDS; kind++) {
    nf_wire_err e;
    ProtobufCMessage *m = dec(kind, p, n, &e);
    check_err(m, &e);
    if (!m) continue;
    nf_buf b = NF_BUF_INIT;
    pack_payload(m, &b);
    nf_wire_err e2;
    ProtobufCMessage *m2 = dec(kind, (const uint8_t *)b.data, b.len, &e2);
    check_err(m2, &e2);
    if (!m2 && !strstr(e2.msg, "budget")) {
      fprintf(stderr, "fuzz_wire: a decoded message does not decode again: %s\n", e2.msg);
      abort();
    }
    if (m2) dfree(kind, m2);
    nf_buf_free(&b);
    const Neoflow__Graph *pg = NULL;
    if (kind == K_CLIENT) {
      const Neoflow__ClientMessage *cm = (const Neoflow__ClientMessage *)m;
      if (cm->msg_case == NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT) pg = cm->submit->graph;
    } else if (kind == K_JOB_REQUEST) {
      pg = ((const Neoflow__JobRequest *)m)->graph;
    }
    if (pg) check_graph(pg);
    dfree(kind, m);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) return 0;
  const uint8_t *p = data + 5;
  size_t n = size - 5;
  if (data[0] & 1) {
    decode_all(p, n);
    return 0;
  }
  nf_frame_reader r;
  nf_frame_reader_init(&r, NF_WIRE_HANDSHAKE_MAX);
  uint32_t limit = NF_WIRE_HANDSHAKE_MAX;
  size_t off = 0;
  int frames = 0;
  for (unsigned k = 0; off < n; k++) {
    size_t piece = 1 + (size_t)data[1 + k % 4];
    if (piece > n - off) piece = n - off;
    size_t pos = 0;
    int dead = 0;
    while (pos < piece) {
      const uint8_t *fr = NULL;
      size_t len = 0, used = 0;
      int rc = nf_frame_reader_feed(&r, p + off + pos, piece - pos, &used, &fr, &len);
      CHECK(used <= piece - pos);
      pos += used;
      if (rc == NF_ELIMIT) {
        CHECK(r.buf == NULL);
        dead = 1;
        break;
      }
      CHECK(rc == 0 || rc == 1);
      if (rc == 0) {
        CHECK(pos == piece);
        break;
      }
      CHECK(fr != NULL && len <= limit);
      CHECK(nf_frame_reader_mid_frame(&r) == 0);
      decode_all(fr, len);
      if (++frames == 1) { /* the handshake is over */
        limit = NF_WIRE_FRAME_MAX;
        nf_frame_reader_set_max(&r, limit);
      }
    }
    if (dead) break;
    off += piece;
  }
  nf_frame_reader_free(&r);
  return 0;
}
