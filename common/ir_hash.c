/* ir_hash.c - canonical binary encoding of graphs and its SHA-256.
 *
 * The encoding is a function of structure only: names (graph, tensors,
 * variables) and context-specific data (pointers, node ids) never appear,
 * so the same graph built in two contexts, or with renamed tensors and
 * variables, encodes to the same bytes.  Conversely the encoding can be
 * decoded back to the structure, so different graphs encode differently.
 *
 * Tensors are numbered canonically, not by their ids: first the inputs in
 * input order, then each statement's output in statement order, then any
 * tensor left over (only in invalid graphs) in id order.  So a graph
 * whose tensors were created in another order encodes the same; every
 * tensor id below (inputs, outputs, statement outputs, accesses) is the
 * canonical number (an out-of-range id t is written as n_tensors + t).
 *
 * Layout (integers are LEB128, u8 single bytes, u64 little-endian):
 *   "NFG" u8(version = 1)
 *   uleb n_tensors, then per tensor in canonical order: u8 kind, u8 dtype,
 *       u8 rank, sleb shape[0 .. rank-1]
 *   uleb n_inputs, uleb id...; uleb n_outputs, uleb id...
 *   uleb n_stmts, then per statement: uleb out, u8 red, uleb flags,
 *       u8 n_red, (sleb red_lo, sleb red_ext) per reduction variable,
 *       the right side as a node list, u8 0xff.
 * A node list is the statement's expression DAG in first-visit post-order
 * (arguments left to right), each distinct node once: u8 op, u8 dtype, the
 * payload (CONST: sleb value for bool/ints, u64 bit pattern for floats;
 * VAR: uleb number; ACCESS: uleb tensor, uleb n_args), then one uleb per
 * argument giving the distance back to the argument's record (1 = the
 * previous node).  The root is the last node before the 0xff terminator.
 * Node indices are local to a statement.
 *
 * The DAG walk uses an explicit stack, so deep expressions do not recurse.
 */
#include "nf_ir.h"
#include "ir_int.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

/* Defined in ir.c (pointer map for DAG-aware walks). */

#define NF_ENC_VERSION 1
#define NF_ENC_END 0xffu

typedef struct frame {
  const nf_expr *e;
  uint32_t next; /* next argument to visit */
} frame;

typedef struct encoder {
  nf_buf *out;
  const uint32_t *canon; /* tensor id -> canonical number */
  uint32_t n_tensors;
  nf_ptrmap *idx; /* node -> local index */
  frame *stack;
  size_t sp, cap;
} encoder;

static int push(encoder *en, const nf_expr *e) {
  if (en->sp == en->cap) {
    size_t ncap = en->cap ? en->cap * 2 : 256;
    frame *ns = realloc(en->stack, ncap * sizeof(*ns));
    if (!ns) return NF_ENOMEM;
    en->stack = ns;
    en->cap = ncap;
  }
  en->stack[en->sp].e = e;
  en->stack[en->sp].next = 0;
  en->sp++;
  return NF_OK;
}

static uint64_t canon_id(const encoder *en, uint32_t t) {
  if (t >= en->n_tensors) return (uint64_t)en->n_tensors + t;
  return en->canon[t];
}

static void emit_node(encoder *en, const nf_expr *e, uint64_t self) {
  nf_buf *b = en->out;
  nf_buf_u8(b, e->op);
  nf_buf_u8(b, e->dtype);
  switch (e->op) {
  case NF_OP_CONST:
    if (nf_dtype_is_float((nf_dtype)e->dtype)) {
      uint64_t bits;
      memcpy(&bits, &e->u.f, sizeof(bits));
      nf_buf_u64(b, bits);
    } else {
      nf_buf_sleb(b, e->u.i);
    }
    break;
  case NF_OP_VAR: nf_buf_uleb(b, e->u.var); break;
  case NF_OP_ACCESS:
    nf_buf_uleb(b, canon_id(en, e->u.tensor));
    nf_buf_uleb(b, e->n_args);
    break;
  default: break;
  }
  for (int k = 0; k < e->n_args; k++) {
    uint64_t ai = 0;
    (void)nf_ptrmap_get(en->idx, e->args[k], &ai);
    nf_buf_uleb(b, self - ai);
  }
}

/* Emits the node list of root (see the layout above). */
static int encode_expr(encoder *en, const nf_expr *root) {
  uint64_t count = 0;
  nf_ptrmap_clear(en->idx);
  en->sp = 0;
  if (!root) return NF_EINVAL;
  int rc = nf_ptrmap_put(en->idx, root, UINT64_MAX);
  if (!rc) rc = push(en, root);
  while (!rc && en->sp) {
    frame *f = &en->stack[en->sp - 1];
    const nf_expr *e = f->e;
    if (f->next < e->n_args) {
      const nf_expr *a = e->args[f->next++];
      if (!a) return NF_EINVAL;
      if (!nf_ptrmap_get(en->idx, a, NULL)) {
        /* Mark the node as in progress, so a (malformed) cycle or a
         * second path to it cannot push it twice; its real index is
         * stored when it is emitted. */
        rc = nf_ptrmap_put(en->idx, a, UINT64_MAX);
        if (!rc) rc = push(en, a);
      } else {
        uint64_t v = 0;
        (void)nf_ptrmap_get(en->idx, a, &v);
        if (v == UINT64_MAX) return NF_EINVAL; /* cycle */
      }
      continue;
    }
    en->sp--;
    rc = nf_ptrmap_put(en->idx, e, count);
    if (!rc) emit_node(en, e, count);
    count++;
  }
  if (rc) return rc;
  nf_buf_u8(en->out, NF_ENC_END);
  return NF_OK;
}

/* Appends g's canonical encoding to out.  Returns NF_OK, NF_EINVAL for a
 * graph that cannot be encoded (NULL arrays or expressions, a rank or
 * reduction count above the limits, a cycle), or NF_ENOMEM; on an error
 * out may hold a partial encoding.  Meant for validated graphs; on others
 * it still returns without crashing as long as every node's args hold
 * n_args readable pointers. */
int nf_graph_encode(const nf_graph *g, nf_buf *out) {
  if (!g || !out) return NF_EINVAL;
  if ((g->n_tensors && !g->tensors) || (g->n_stmts && !g->stmts) ||
      (g->n_inputs && !g->inputs) || (g->n_outputs && !g->outputs))
    return NF_EINVAL;
  uint32_t nt = g->n_tensors;
  for (uint32_t i = 0; i < nt; i++)
    if (g->tensors[i].rank > NF_MAX_RANK) return NF_EINVAL;
  /* canon[id] = canonical number; order[number] = id. */
  uint32_t *canon = malloc((nt ? nt : 1) * sizeof(uint32_t));
  uint32_t *order = malloc((nt ? nt : 1) * sizeof(uint32_t));
  encoder en = {.out = out, .canon = canon, .n_tensors = nt,
                .idx = nf_ptrmap_new()};
  int rc = NF_OK;
  if (!canon || !order || !en.idx) {
    rc = NF_ENOMEM;
    goto done;
  }
  uint32_t next = 0;
  for (uint32_t i = 0; i < nt; i++) canon[i] = UINT32_MAX;
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    uint32_t id = g->inputs[k];
    if (id < nt && canon[id] == UINT32_MAX) order[canon[id] = next++] = id;
  }
  for (uint32_t si = 0; si < g->n_stmts; si++) {
    uint32_t id = g->stmts[si].out;
    if (id < nt && canon[id] == UINT32_MAX) order[canon[id] = next++] = id;
  }
  for (uint32_t i = 0; i < nt; i++)
    if (canon[i] == UINT32_MAX) order[canon[i] = next++] = i;

  nf_buf_add(out, "NFG", 3);
  nf_buf_u8(out, NF_ENC_VERSION);
  nf_buf_uleb(out, nt);
  for (uint32_t k = 0; k < nt; k++) {
    const nf_tensor *t = &g->tensors[order[k]];
    nf_buf_u8(out, t->kind);
    nf_buf_u8(out, t->dtype);
    nf_buf_u8(out, t->rank);
    for (int d = 0; d < t->rank; d++) nf_buf_sleb(out, t->shape[d]);
  }
  nf_buf_uleb(out, g->n_inputs);
  for (uint32_t k = 0; k < g->n_inputs; k++)
    nf_buf_uleb(out, canon_id(&en, g->inputs[k]));
  nf_buf_uleb(out, g->n_outputs);
  for (uint32_t k = 0; k < g->n_outputs; k++)
    nf_buf_uleb(out, canon_id(&en, g->outputs[k]));
  nf_buf_uleb(out, g->n_stmts);

  for (uint32_t si = 0; !rc && si < g->n_stmts; si++) {
    const nf_stmt *s = &g->stmts[si];
    if (s->n_red > NF_MAX_VARS) {
      rc = NF_EINVAL;
      break;
    }
    nf_buf_uleb(out, canon_id(&en, s->out));
    nf_buf_u8(out, s->red);
    nf_buf_uleb(out, s->flags);
    nf_buf_u8(out, s->n_red);
    for (int r = 0; r < s->n_red; r++) {
      nf_buf_sleb(out, s->red_lo[r]);
      nf_buf_sleb(out, s->red_ext[r]);
    }
    rc = encode_expr(&en, s->rhs);
  }
done:
  free(canon);
  free(order);
  free(en.stack);
  nf_ptrmap_delete(en.idx);
  if (!rc && out->oom) rc = NF_ENOMEM;
  return rc;
}

/* Writes the SHA-256 of g's canonical encoding to digest.  Returns NF_OK
 * or the status of nf_graph_encode (digest is untouched then). */
int nf_graph_hash(const nf_graph *g, uint8_t digest[32]) {
  if (sodium_init() < 0) return NF_EINTERNAL;
  nf_buf b = NF_BUF_INIT;
  int rc = nf_graph_encode(g, &b);
  if (!rc)
    crypto_hash_sha256(digest, (const unsigned char *)b.data,
                       (unsigned long long)b.len);
  nf_buf_free(&b);
  return rc;
}

/* Writes the lower-case hex of digest and a NUL into hex. */
void nf_hash_hex(const uint8_t digest[32], char hex[65]) {
  static const char xd[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = xd[digest[i] >> 4];
    hex[2 * i + 1] = xd[digest[i] & 15];
  }
  hex[64] = 0;
}
