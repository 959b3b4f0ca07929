/* validate.c - the field-level validation of every message kind
 * (ClientMessage, ServerMessage, JobRequest, JobEvent), run by the
 * decoders after unpacking and exported for messages built by hand.
 *
 * What is checked: a oneof holds a member; every enum value is one the
 * schema names; strings are valid UTF-8 within their length limit and hold
 * no control characters (names and single-line text none at all; schedule
 * text, error messages and reasons may hold \n and \t); byte fields have
 * their fixed length (32-byte keys, digests, nonces, MACs, fingerprints),
 * or are empty where the field is optional; counts stay within the
 * NF_WIRE_MAX_* limits; times are finite and >= 0; paired arrays have one
 * length; protocol_min <= protocol_max; submessages the receiver needs
 * (Hello.target, Welcome.target, Submit.graph, JobRequest.graph) are
 * present.
 *
 * What is not: the graph's semantics (references, shapes, typing,
 * acyclicity), which nf_wire_graph_to_ir checks (graph_wire.c); here a
 * graph only gets its counts, name lengths and enum values checked.
 *
 * Errors carry ERR_INVALID_ARGUMENT and name the field by its path from
 * the top message: "submit.graph.exprs[17].op: unknown value 99". */
#include "nf_wire.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define KEY_BYTES 32 /* keys, digests, nonces, MACs, fingerprints */

typedef struct vctx {
  nf_wire_err *e;
  char path[160];
} vctx;

static void vinit(vctx *v, nf_wire_err *e) {
  v->e = e;
  v->path[0] = 0;
  e->code = NEOFLOW__ERROR_CODE__ERR_NONE;
  e->msg[0] = 0;
}

/* Appends a path element ("name" or "name[i]", dot-separated); returns
 * the length to restore with leave(). */
static size_t enter(vctx *v, const char *name, long idx) {
  size_t old = strlen(v->path);
  const char *sep = old ? "." : "";
  if (idx >= 0)
    snprintf(v->path + old, sizeof(v->path) - old, "%s%s[%ld]", sep, name, idx);
  else
    snprintf(v->path + old, sizeof(v->path) - old, "%s%s", sep, name);
  return old;
}

static void leave(vctx *v, size_t old) { v->path[old] = 0; }

/* Appends s to the NUL-terminated dst of cap bytes, cutting it short. */
static void append(char *dst, size_t cap, const char *s) {
  size_t n = strlen(dst), k = strlen(s);
  if (n + 1 >= cap) return;
  if (k > cap - n - 1) k = cap - n - 1;
  memcpy(dst + n, s, k);
  dst[n + k] = 0;
}

/* Records "path.field: what" and returns NF_EINVAL. */
static int fail(vctx *v, const char *field, const char *fmt, ...) NF_PRINTF(3, 4);
static int fail(vctx *v, const char *field, const char *fmt, ...) {
  char what[192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  v->e->code = NEOFLOW__ERROR_CODE__ERR_INVALID_ARGUMENT;
  v->e->msg[0] = 0;
  append(v->e->msg, sizeof(v->e->msg), v->path);
  if (v->path[0] && field) append(v->e->msg, sizeof(v->e->msg), ".");
  if (field) append(v->e->msg, sizeof(v->e->msg), field);
  append(v->e->msg, sizeof(v->e->msg), ": ");
  append(v->e->msg, sizeof(v->e->msg), what);
  return NF_EINVAL;
}

/* ---- field checks ---- */

static int check_enum(vctx *v, const char *field, const ProtobufCEnumDescriptor *d,
                      int value) {
  if (!protobuf_c_enum_descriptor_get_value(d, value))
    return fail(v, field, "unknown value %d", value);
  return NF_OK;
}

/* The length of the acceptable character at s[0..n) (n > 0): UTF-8
 * without overlong forms, surrogates or values past U+10FFFF, and not a
 * control character (C0, DEL, C1) except \n and \t when multiline.  0
 * when it is not acceptable, with *why saying so. */
static size_t next_char(const uint8_t *s, size_t n, int multiline, const char **why) {
  uint32_t c = s[0];
  size_t k;
  if (c < 0x80) {
    if ((c < 0x20 && !(multiline && (c == '\n' || c == '\t'))) || c == 0x7f) {
      *why = "a control character";
      return 0;
    }
    return 1;
  }
  *why = "invalid UTF-8";
  uint32_t lo = 0x80, hi = 0xbf; /* range of the second byte */
  if (c >= 0xc2 && c <= 0xdf) {
    k = 1;
    c &= 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    k = 2;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f; /* no surrogates */
    c &= 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    k = 3;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
    c &= 0x07;
  } else {
    return 0;
  }
  if (n - 1 < k) return 0;
  for (size_t j = 1; j <= k; j++) {
    uint32_t b = s[j];
    if (j == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80) return 0;
    c = c << 6 | (b & 0x3f);
  }
  if (c >= 0x80 && c <= 0x9f) {
    *why = "a control character";
    return 0;
  }
  return k + 1;
}

/* Checks s[0..n) character by character (next_char).  Returns NULL or
 * what is wrong, with *at the offset. */
static const char *text_error(const uint8_t *s, size_t n, int multiline, size_t *at) {
  const char *why = NULL;
  for (size_t i = 0; i < n;) {
    size_t k = next_char(s + i, n - i, multiline, &why);
    if (!k) {
      *at = i;
      return why;
    }
    i += k;
  }
  return NULL;
}

/* See nf_wire.h: bad bytes become '?', then a cut at a character
 * boundary. */
char *nf_wire_text_sanitize(char *s, size_t max, int multiline) {
  uint8_t *u = (uint8_t *)s;
  size_t n = strlen(s), cut = 0;
  const char *why;
  for (size_t i = 0; i < n;) {
    size_t k = next_char(u + i, n - i, multiline, &why);
    if (!k) {
      u[i] = '?';
      k = 1;
    }
    if (i + k > max) break;
    i += k;
    cut = i;
  }
  s[cut] = 0;
  return s;
}

/* A string of at most max bytes of valid text (NULL counts as empty). */
static int check_text(vctx *v, const char *field, const char *s, size_t max, int multiline) {
  if (!s) return NF_OK;
  size_t n = strlen(s);
  if (n > max) return fail(v, field, "%zu bytes, at most %zu allowed", n, max);
  size_t at = 0;
  const char *why = text_error((const uint8_t *)s, n, multiline, &at);
  if (why) return fail(v, field, "%s at byte %zu", why, at);
  return NF_OK;
}

static int check_name(vctx *v, const char *field, const char *s) {
  return check_text(v, field, s, NF_WIRE_NAME_MAX, 0);
}

/* Exactly KEY_BYTES bytes, or (when optional) none. */
static int check_key(vctx *v, const char *field, ProtobufCBinaryData b, int optional) {
  if (b.len == KEY_BYTES && b.data) return NF_OK;
  if (optional && b.len == 0) return NF_OK;
  return fail(v, field, "%zu bytes, expected %d%s", b.len, KEY_BYTES,
              optional ? " or none" : "");
}

/* A signature (64 bytes) or, optional, none. */
static int check_sig(vctx *v, const char *field, ProtobufCBinaryData b, int optional) {
  if (b.len == 64 && b.data) return NF_OK;
  if (optional && b.len == 0) return NF_OK;
  return fail(v, field, "%zu bytes, expected 64%s", b.len, optional ? " or none" : "");
}

static int check_time(vctx *v, const char *field, double x) {
  if (!isfinite(x) || x < 0) return fail(v, field, "%g is not a finite time >= 0", x);
  return NF_OK;
}

static int check_count(vctx *v, const char *field, size_t n, size_t max) {
  if (n > max) return fail(v, field, "%zu entries, at most %zu allowed", n, max);
  return NF_OK;
}

static int check_bytes_max(vctx *v, const char *field, ProtobufCBinaryData b, size_t max) {
  if (b.len > max) return fail(v, field, "%zu bytes, at most %zu allowed", b.len, max);
  if (b.len && !b.data) return fail(v, field, "no data");
  return NF_OK;
}

static int missing(vctx *v, const char *field) { return fail(v, field, "missing"); }

/* ---- the graph: counts, names, enums (semantics: graph_wire.c) ---- */

static int v_tensor(vctx *v, const Neoflow__Tensor *t) {
  int rc;
  if ((rc = check_enum(v, "dtype", &neoflow__dtype__descriptor, (int)t->dtype)) ||
      (rc = check_enum(v, "kind", &neoflow__tensor_kind__descriptor, (int)t->kind)) ||
      (rc = check_count(v, "shape", t->n_shape, NF_MAX_RANK)) ||
      (rc = check_name(v, "name", t->name)))
    return rc;
  if (t->n_shape && !t->shape) return missing(v, "shape");
  return NF_OK;
}

static int v_expr(vctx *v, const Neoflow__Expr *x) {
  int rc;
  if ((rc = check_enum(v, "op", &neoflow__op__descriptor, (int)x->op)) ||
      (rc = check_enum(v, "dtype", &neoflow__dtype__descriptor, (int)x->dtype)) ||
      (rc = check_count(v, "args", x->n_args, NF_MAX_RANK)))
    return rc;
  if (x->n_args && !x->args) return missing(v, "args");
  return NF_OK;
}

static int v_stmt(vctx *v, const Neoflow__Stmt *s) {
  int rc;
  if ((rc = check_enum(v, "red", &neoflow__red_op__descriptor, (int)s->red)) ||
      (rc = check_count(v, "red_lo", s->n_red_lo, NF_MAX_VARS)) ||
      (rc = check_count(v, "red_ext", s->n_red_ext, NF_MAX_VARS)))
    return rc;
  if ((s->n_red_lo && !s->red_lo) || (s->n_red_ext && !s->red_ext))
    return missing(v, "red_lo");
  return NF_OK;
}

static int v_graph(vctx *v, const Neoflow__Graph *g) {
  int rc;
  if ((rc = check_name(v, "name", g->name)) ||
      (rc = check_count(v, "tensors", g->n_tensors, NF_WIRE_MAX_TENSORS)) ||
      (rc = check_count(v, "exprs", g->n_exprs, NF_WIRE_MAX_EXPRS)) ||
      (rc = check_count(v, "stmts", g->n_stmts, NF_WIRE_MAX_STMTS)) ||
      (rc = check_count(v, "inputs", g->n_inputs, NF_WIRE_MAX_TENSORS)) ||
      (rc = check_count(v, "outputs", g->n_outputs, NF_WIRE_MAX_TENSORS)))
    return rc;
  if ((g->n_tensors && !g->tensors) || (g->n_exprs && !g->exprs) ||
      (g->n_stmts && !g->stmts) || (g->n_inputs && !g->inputs) ||
      (g->n_outputs && !g->outputs))
    return fail(v, NULL, "a count without its array");
  for (size_t i = 0; i < g->n_tensors; i++) {
    size_t old = enter(v, "tensors", (long)i);
    rc = g->tensors[i] ? v_tensor(v, g->tensors[i]) : missing(v, NULL);
    leave(v, old);
    if (rc) return rc;
  }
  for (size_t i = 0; i < g->n_exprs; i++) {
    size_t old = enter(v, "exprs", (long)i);
    rc = g->exprs[i] ? v_expr(v, g->exprs[i]) : missing(v, NULL);
    leave(v, old);
    if (rc) return rc;
  }
  for (size_t i = 0; i < g->n_stmts; i++) {
    size_t old = enter(v, "stmts", (long)i);
    rc = g->stmts[i] ? v_stmt(v, g->stmts[i]) : missing(v, NULL);
    leave(v, old);
    if (rc) return rc;
  }
  return NF_OK;
}

/* Runs check on a required submessage under its field name. */
#define SUB(v, field, ptr, check)                       \
  do {                                                  \
    if (!(ptr)) return missing((v), (field));           \
    size_t old_ = enter((v), (field), -1);              \
    int rc_ = check((v), (ptr));                        \
    leave((v), old_);                                   \
    if (rc_) return rc_;                                \
  } while (0)

/* ---- shared messages ---- */

static int v_target(vctx *v, const Neoflow__Target *t) {
  int rc;
  if ((rc = check_enum(v, "kind", &neoflow__target_kind__descriptor, (int)t->kind)) ||
      (rc = check_key(v, "fingerprint", t->fingerprint, 0)) ||
      (rc = check_text(v, "description", t->description, NF_WIRE_DESCRIPTION_MAX, 0)))
    return rc;
  return NF_OK;
}

static int v_progress(vctx *v, const Neoflow__Progress *p) {
  int rc;
  if ((rc = check_key(v, "key", p->key, 1)) ||
      (rc = check_enum(v, "state", &neoflow__job_state__descriptor, (int)p->state)) ||
      (rc = check_time(v, "best_ms", p->best_ms)) ||
      (rc = check_time(v, "default_ms", p->default_ms)))
    return rc;
  return NF_OK;
}

static int v_error(vctx *v, const Neoflow__Error *x) {
  int rc;
  if ((rc = check_enum(v, "code", &neoflow__error_code__descriptor, (int)x->code)) ||
      (rc = check_text(v, "message", x->message, NF_WIRE_TEXT_MAX, 1)))
    return rc;
  return NF_OK;
}

static int v_goodbye(vctx *v, const Neoflow__Goodbye *g) {
  return check_text(v, "reason", g->reason, NF_WIRE_TEXT_MAX, 1);
}

/* ---- client messages ---- */

static int v_hello(vctx *v, const Neoflow__Hello *h) {
  int rc;
  if (h->protocol_min > h->protocol_max)
    return fail(v, "protocol_min", "%u exceeds protocol_max %u", h->protocol_min,
                h->protocol_max);
  if ((rc = check_name(v, "client_name", h->client_name)) ||
      (rc = check_key(v, "client_nonce", h->client_nonce, 1)) ||
      (rc = check_key(v, "mac", h->mac, 1)) ||
      (rc = check_key(v, "client_ephemeral", h->client_ephemeral, 1)))
    return rc;
  if (h->mac.len && !h->client_nonce.len)
    return fail(v, "mac", "a mac without a client_nonce");
  if ((h->client_nonce.len == 0) != (h->client_ephemeral.len == 0))
    return fail(v, "client_ephemeral", "client_nonce and client_ephemeral go together");
  SUB(v, "target", h->target, v_target);
  return NF_OK;
}

static int v_submit(vctx *v, const Neoflow__Submit *s) {
  int rc = check_enum(v, "mode", &neoflow__mode__descriptor, (int)s->mode);
  if (rc || (rc = check_key(v, "slower_sha256", s->slower_sha256, 1)) ||
      (rc = check_time(v, "slower_ratio", s->slower_ratio)))
    return rc;
  if (s->slower_ratio > 0 && !s->slower_sha256.len)
    return fail(v, "slower_ratio", "a ratio without the kernel's slower_sha256");
  if ((rc = check_text(v, "schedule", s->schedule, NF_WIRE_SCHEDULE_MAX, 1))) return rc;
  int publish = s->mode == NEOFLOW__MODE__MODE_PUBLISH;
  if (publish != (s->schedule && s->schedule[0]))
    return fail(v, "schedule", publish ? "MODE_PUBLISH without the schedule it publishes"
                                       : "a schedule is sent only with MODE_PUBLISH");
  SUB(v, "graph", s->graph, v_graph);
  return NF_OK;
}

static int v_step_times(vctx *v, const Neoflow__StepTimes *s) {
  int rc = check_count(v, "request_id", s->n_request_id, NF_WIRE_MAX_STEP_TIMES);
  if (rc) return rc;
  if (s->n_ms != s->n_request_id)
    return fail(v, "ms", "%zu entries for %zu request ids", s->n_ms, s->n_request_id);
  if (s->n_ms && (!s->ms || !s->request_id)) return missing(v, "ms");
  for (size_t i = 0; i < s->n_ms; i++) {
    size_t old = enter(v, "ms", (long)i);
    rc = check_time(v, NULL, s->ms[i]);
    leave(v, old);
    if (rc) return rc;
  }
  return NF_OK;
}

/* Checks a ClientMessage (see nf_wire.h). */
int nf_wire_validate_client(const Neoflow__ClientMessage *m, nf_wire_err *e) {
  vctx v;
  vinit(&v, e);
  switch (m->msg_case) {
  case NEOFLOW__CLIENT_MESSAGE__MSG_HELLO: SUB(&v, "hello", m->hello, v_hello); break;
  case NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT: SUB(&v, "submit", m->submit, v_submit); break;
  case NEOFLOW__CLIENT_MESSAGE__MSG_CANCEL:
    if (!m->cancel) return missing(&v, "cancel");
    break;
  case NEOFLOW__CLIENT_MESSAGE__MSG_STEP_TIMES:
    SUB(&v, "step_times", m->step_times, v_step_times);
    break;
  case NEOFLOW__CLIENT_MESSAGE__MSG_STATUS:
    if (!m->status) return missing(&v, "status");
    break;
  case NEOFLOW__CLIENT_MESSAGE__MSG_PING:
    if (!m->ping) return missing(&v, "ping");
    break;
  default: return fail(&v, "msg", "no message set (oneof case %d)", (int)m->msg_case);
  }
  return NF_OK;
}

/* ---- server messages ---- */

static int v_challenge(vctx *v, const Neoflow__Challenge *c) {
  int rc = check_key(v, "server_nonce", c->server_nonce, 0);
  return rc ? rc : check_key(v, "server_ephemeral", c->server_ephemeral, 1);
}

static int v_welcome(vctx *v, const Neoflow__Welcome *w) {
  int rc;
  if ((rc = check_name(v, "daemon_version", w->daemon_version)) ||
      (rc = check_key(v, "server_mac", w->server_mac, 1)) ||
      (rc = check_key(v, "signing_key", w->signing_key, 1)) ||
      (rc = check_sig(v, "key_proof", w->key_proof, 1)))
    return rc;
  SUB(v, "target", w->target, v_target);
  return NF_OK;
}

static int v_accepted(vctx *v, const Neoflow__Accepted *a) {
  int rc = check_key(v, "key", a->key, 0);
  return rc ? rc
            : check_enum(v, "cache_error", &neoflow__error_code__descriptor, (int)a->cache_error);
}

static int v_kernel_update(vctx *v, const Neoflow__KernelUpdate *k) {
  int rc;
  if ((rc = check_key(v, "key", k->key, 0)) ||
      (rc = check_enum(v, "tier", &neoflow__tier__descriptor, (int)k->tier)) ||
      (rc = check_text(v, "schedule", k->schedule, NF_WIRE_SCHEDULE_MAX, 1)) ||
      (rc = check_time(v, "time_ms", k->time_ms)) ||
      (rc = check_time(v, "default_ms", k->default_ms)) ||
      (rc = check_key(v, "sha256", k->sha256, k->size == 0)) ||
      (rc = check_sig(v, "signature", k->signature, 1)))
    return rc;
  if (k->size > NF_WIRE_BINARY_MAX)
    return fail(v, "size", "%llu bytes, at most %u allowed", (unsigned long long)k->size,
                NF_WIRE_BINARY_MAX);
  return NF_OK;
}

static int v_chunk(vctx *v, const Neoflow__Chunk *c) {
  int rc = check_bytes_max(v, "data", c->data, NF_WIRE_CHUNK_MAX);
  if (rc) return rc;
  if (c->offset > NF_WIRE_BINARY_MAX || NF_WIRE_BINARY_MAX - c->offset < c->data.len)
    return fail(v, "offset", "%llu + %zu bytes runs past %u", (unsigned long long)c->offset,
                c->data.len, NF_WIRE_BINARY_MAX);
  return NF_OK;
}

static int v_client_info(vctx *v, const Neoflow__ClientInfo *c) {
  int rc;
  if ((rc = check_name(v, "name", c->name)) ||
      (rc = check_name(v, "transport", c->transport)) ||
      (rc = check_time(v, "connected_s", c->connected_s)) ||
      (rc = check_time(v, "step_ms", c->step_ms)))
    return rc;
  return NF_OK;
}

static int v_job_info(vctx *v, const Neoflow__JobInfo *j) {
  int rc;
  if ((rc = check_key(v, "key", j->key, 1)) || (rc = check_name(v, "graph", j->graph)) ||
      (rc = check_text(v, "summary", j->summary, 256, 0)) ||
      (rc = check_enum(v, "state", &neoflow__job_state__descriptor, (int)j->state)) ||
      (rc = check_enum(v, "mode", &neoflow__mode__descriptor, (int)j->mode)) ||
      (rc = check_time(v, "best_ms", j->best_ms)) ||
      (rc = check_time(v, "default_ms", j->default_ms)) ||
      (rc = check_time(v, "step_ms", j->step_ms)) || (rc = check_time(v, "age_s", j->age_s)))
    return rc;
  return NF_OK;
}

static int v_status_reply(vctx *v, const Neoflow__StatusReply *s) {
  int rc;
  if ((rc = check_name(v, "daemon_version", s->daemon_version)) ||
      (rc = check_time(v, "uptime_s", s->uptime_s)) ||
      (rc = check_text(v, "cache_path", s->cache_path, NF_WIRE_TEXT_MAX, 0)) ||
      (rc = check_count(v, "clients", s->n_clients, NF_WIRE_MAX_STATUS_ITEMS)) ||
      (rc = check_count(v, "jobs", s->n_jobs, NF_WIRE_MAX_STATUS_ITEMS)))
    return rc;
  if ((s->n_clients && !s->clients) || (s->n_jobs && !s->jobs))
    return fail(v, NULL, "a count without its array");
  for (size_t i = 0; i < s->n_clients; i++) {
    size_t old = enter(v, "clients", (long)i);
    rc = s->clients[i] ? v_client_info(v, s->clients[i]) : missing(v, NULL);
    leave(v, old);
    if (rc) return rc;
  }
  for (size_t i = 0; i < s->n_jobs; i++) {
    size_t old = enter(v, "jobs", (long)i);
    rc = s->jobs[i] ? v_job_info(v, s->jobs[i]) : missing(v, NULL);
    leave(v, old);
    if (rc) return rc;
  }
  return NF_OK;
}

/* Checks a ServerMessage (see nf_wire.h). */
int nf_wire_validate_server(const Neoflow__ServerMessage *m, nf_wire_err *e) {
  vctx v;
  vinit(&v, e);
  switch (m->msg_case) {
  case NEOFLOW__SERVER_MESSAGE__MSG_CHALLENGE:
    SUB(&v, "challenge", m->challenge, v_challenge);
    break;
  case NEOFLOW__SERVER_MESSAGE__MSG_WELCOME: SUB(&v, "welcome", m->welcome, v_welcome); break;
  case NEOFLOW__SERVER_MESSAGE__MSG_ACCEPTED:
    SUB(&v, "accepted", m->accepted, v_accepted);
    break;
  case NEOFLOW__SERVER_MESSAGE__MSG_KERNEL: SUB(&v, "kernel", m->kernel, v_kernel_update); break;
  case NEOFLOW__SERVER_MESSAGE__MSG_CHUNK: SUB(&v, "chunk", m->chunk, v_chunk); break;
  case NEOFLOW__SERVER_MESSAGE__MSG_PROGRESS:
    SUB(&v, "progress", m->progress, v_progress);
    break;
  case NEOFLOW__SERVER_MESSAGE__MSG_STATUS: SUB(&v, "status", m->status, v_status_reply); break;
  case NEOFLOW__SERVER_MESSAGE__MSG_ERROR: SUB(&v, "error", m->error, v_error); break;
  case NEOFLOW__SERVER_MESSAGE__MSG_PONG:
    if (!m->pong) return missing(&v, "pong");
    break;
  case NEOFLOW__SERVER_MESSAGE__MSG_GOODBYE: SUB(&v, "goodbye", m->goodbye, v_goodbye); break;
  default: return fail(&v, "msg", "no message set (oneof case %d)", (int)m->msg_case);
  }
  return NF_OK;
}

/* ---- job pipe messages ---- */

static int v_record(vctx *v, const Neoflow__Record *r) {
  int rc;
  if ((rc = check_text(v, "schedule", r->schedule, NF_WIRE_SCHEDULE_MAX, 1)) ||
      (rc = check_time(v, "time_ms", r->time_ms)) ||
      (rc = check_bytes_max(v, "features", r->features, NF_WIRE_FEATURES_MAX)) ||
      (rc = check_text(v, "reason", r->reason, NF_WIRE_TEXT_MAX, 1)))
    return rc;
  if (r->features.len % 4)
    return fail(v, "features", "%zu bytes, not a whole number of f32", r->features.len);
  return NF_OK;
}

static int v_job_published(vctx *v, const Neoflow__JobPublished *p) {
  int rc;
  if ((rc = check_enum(v, "tier", &neoflow__tier__descriptor, (int)p->tier)) ||
      (rc = check_time(v, "time_ms", p->time_ms)))
    return rc;
  return NF_OK;
}

static int v_job_kernel(vctx *v, const Neoflow__JobKernel *k) {
  int rc;
  if ((rc = check_enum(v, "tier", &neoflow__tier__descriptor, (int)k->tier)) ||
      (rc = check_text(v, "schedule", k->schedule, NF_WIRE_SCHEDULE_MAX, 1)) ||
      (rc = check_time(v, "time_ms", k->time_ms)) ||
      (rc = check_time(v, "default_ms", k->default_ms)) ||
      (rc = check_bytes_max(v, "binary", k->binary, NF_WIRE_BINARY_MAX)))
    return rc;
  return NF_OK;
}

/* Checks a JobRequest (see nf_wire.h). */
int nf_wire_validate_job_request(const Neoflow__JobRequest *m, nf_wire_err *e) {
  vctx v;
  vinit(&v, e);
  int rc;
  if ((rc = check_enum(&v, "mode", &neoflow__mode__descriptor, (int)m->mode)) ||
      (rc = check_count(&v, "prior", m->n_prior, NF_WIRE_MAX_PRIOR)) ||
      (rc = check_count(&v, "transfer", m->n_transfer, NF_WIRE_MAX_TRANSFER)) ||
      (rc = check_count(&v, "corpus", m->n_corpus, NF_WIRE_MAX_CORPUS)) ||
      (rc = check_text(&v, "cuda_name", m->cuda_name, NF_WIRE_DESCRIPTION_MAX, 0)) ||
      (rc = check_text(&v, "upstream_address", m->upstream_address, 4096, 0)) ||
      (rc = check_text(&v, "upstream_key_file", m->upstream_key_file, 4096, 0)) ||
      (rc = check_text(&v, "upstream_public_key", m->upstream_public_key, 4096, 0)) ||
      (rc = check_text(&v, "published", m->published, NF_WIRE_SCHEDULE_MAX, 1)))
    return rc;
  if (m->n_prior && !m->prior) return missing(&v, "prior");
  if (m->n_transfer && !m->transfer) return missing(&v, "transfer");
  if (m->n_corpus && !m->corpus) return missing(&v, "corpus");
  SUB(&v, "graph", m->graph, v_graph);
  static const char *const names[] = {"prior", "transfer", "corpus"};
  Neoflow__Record *const *lists[] = {m->prior, m->transfer, m->corpus};
  const size_t counts[] = {m->n_prior, m->n_transfer, m->n_corpus};
  for (int l = 0; l < 3; l++)
    for (size_t i = 0; i < counts[l]; i++) {
      size_t old = enter(&v, names[l], (long)i);
      rc = lists[l][i] ? v_record(&v, lists[l][i]) : missing(&v, NULL);
      leave(&v, old);
      if (rc) return rc;
    }
  return NF_OK;
}

/* Checks a JobEvent (see nf_wire.h). */
int nf_wire_validate_job_event(const Neoflow__JobEvent *m, nf_wire_err *e) {
  vctx v;
  vinit(&v, e);
  switch (m->msg_case) {
  case NEOFLOW__JOB_EVENT__MSG_KERNEL: SUB(&v, "kernel", m->kernel, v_job_kernel); break;
  case NEOFLOW__JOB_EVENT__MSG_PROGRESS: SUB(&v, "progress", m->progress, v_progress); break;
  case NEOFLOW__JOB_EVENT__MSG_RECORD: SUB(&v, "record", m->record, v_record); break;
  case NEOFLOW__JOB_EVENT__MSG_ERROR: SUB(&v, "error", m->error, v_error); break;
  case NEOFLOW__JOB_EVENT__MSG_DONE: SUB(&v, "done", m->done, v_goodbye); break;
  case NEOFLOW__JOB_EVENT__MSG_PUBLISHED:
    SUB(&v, "published", m->published, v_job_published);
    break;
  default: return fail(&v, "msg", "no message set (oneof case %d)", (int)m->msg_case);
  }
  return NF_OK;
}
