/* nf_interp.h - the reference interpreter.
 *
 * Evaluates any nf_graph, slowly and surely; it is the oracle for every
 * test, the daemon's correctness check and the tier-0 fallback.  With
 * NF_INTERP_F32 each f32 (f16, bf16) operation rounds its result to float,
 * as f32 arithmetic does, while reductions accumulate in double and round
 * when stored; with NF_INTERP_F64 every float value is a double.  Integer
 * tensors are int64 internally and wrap like their declared type.
 *
 * Evaluation is vectorised over the innermost variable and loads through
 * affine strides where it can (a 256^3 matmul takes well under a second).
 * Errors at run time (an access out of bounds that the checker could not
 * exclude, integer division by zero) stop evaluation with NF_EBOUNDS or
 * NF_ERANGE and a message naming the statement, the tensor and the index. */
#ifndef NF_INTERP_H
#define NF_INTERP_H

#include "nf_buf.h"
#include "nf_ir.h"
#include "nf_npy.h"

typedef enum nf_precision {
  NF_INTERP_F32 = 0, /* store float tensors as their dtype (f16/bf16/f32 -> f32) */
  NF_INTERP_F64 = 1  /* store every float tensor as f64 */
} nf_precision;

/* Evaluates g.  inputs[k] is the value of g->inputs[k]: its shape must
 * equal the tensor's; float data converts to the tensor's dtype, integer
 * data to integer tensors (values must fit), bool to bool; anything else
 * is an error.  On success outputs[k] (for g->outputs[k]) are allocated
 * arrays the caller frees with nf_array_free: f32 or f64 for float
 * tensors (by precision), i32/i64/bool otherwise.  On error nothing is
 * allocated, a message is appended to err and a negative status returned. */
int nf_interp_run(const nf_graph *g, const nf_array *inputs, nf_precision p,
                  nf_array *outputs, nf_buf *err);

#endif
