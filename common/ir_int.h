/* ir_int.h - what ir.c, ir_hash.c and ir_affine.c share (internal to the
 * IR module): the context's out-of-memory flag.  Their visited sets and
 * memos are the common pointer map (nf_ptrmap.h). */
#ifndef NF_IR_INT_H
#define NF_IR_INT_H

#include <stdint.h>

#include "nf_ir.h"
#include "nf_ptrmap.h"

/* nf_mix64 and the pointer map: common/nf_ptrmap.h */
/* Marks the context out of memory (constructors then return NULL). */
void nf__ir_ctx_set_oom(nf_ir_ctx *ctx);

#endif
