/* ir_int.h - what ir.c, ir_hash.c and ir_affine.c share (internal to the
 * IR module): a pointer-keyed hash map used as a visited set and memo,
 * the 64-bit mixer behind structural hashes, and the context's
 * out-of-memory flag. */
#ifndef NF_IR_INT_H
#define NF_IR_INT_H

#include <stdint.h>

#include "nf_ir.h"

typedef struct nf__ptrmap nf__ptrmap;

/* A map from pointers to uint64 values; NULL on allocation failure.
 * Free with nf__ptrmap_free. */
nf__ptrmap *nf__ptrmap_new(void);
void nf__ptrmap_free(nf__ptrmap *m);
/* Forgets every entry, keeping the storage. */
void nf__ptrmap_clear(nf__ptrmap *m);
/* 1 and *val (may be NULL) when key is present, else 0. */
int nf__ptrmap_get(const nf__ptrmap *m, const void *key, uint64_t *val);
/* Inserts or replaces; NF_OK or NF_ENOMEM. */
int nf__ptrmap_put(nf__ptrmap *m, const void *key, uint64_t val);
/* splitmix64 finaliser. */
uint64_t nf__ir_mix64(uint64_t x);
/* Marks the context out of memory (constructors then return NULL). */
void nf__ir_ctx_set_oom(nf_ir_ctx *ctx);

#endif
