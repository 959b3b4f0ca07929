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

/* Evaluates g like nf_interp_run with NF_INTERP_F64 and also bounds, for
 * every element of every float output, how far from that value a correct
 * evaluation in the graph's own precision (f32 arithmetic in any order of
 * the reductions, with or without FMA contraction, the code generators'
 * math functions) may land: a running error bound (Wilkinson; Higham,
 * "Accuracy and Stability of Numerical Algorithms", section 3.3) carried
 * through every operation next to its value, first order in the unit
 * roundoff u of the operation's dtype:
 *  - inputs are exact; a constant is off by its own rounding to its dtype;
 *  - each arithmetic operation propagates its operands' bounds through
 *    its derivative (over the interval the operands may span where that
 *    matters: a divisor, a square root or a logarithm near zero) and adds
 *    its own rounding, u |result| (+ the smallest normal number, for flush
 *    to zero); exp, log, pow, tanh, sigmoid and erf add 16 u |result|
 *    (the CPU code generator's polynomials are within 5e-7 relative, the
 *    CUDA library's within 2 ulp);
 *  - a sum of n terms adds u min((n - 1) sum |t_i|, 16 sqrt(sum S_k^2))
 *    over its sequential partial sums S_2..S_n: the worst case of any
 *    order, or the rounding error's statistical size (standard deviation
 *    about u sqrt(sum S_k^2) / sqrt(3)) with a wide margin, whichever is
 *    smaller;
 *  - a value where the evaluation may leave the domain (a divisor, or
 *    the argument of sqrt, rsqrt or log, that may reach zero; a result that
 *    may overflow the dtype; a non-finite value computed from inexact
 *    operands) has the bound +inf: undetermined, no f32 evaluation can be
 *    told right or wrong there; a non-finite value that is certain (from
 *    exact operands, from a certainly NaN operand or reduction term, from
 *    an argument certainly below zero, a certain nonzero over an exact
 *    zero) has the bound 0 and must be matched;
 *  - integers and bools are exact: a comparison or a float-to-integer cast
 *    is taken to go the way the reference goes (an evaluation that flips a
 *    near tie of computed values is not covered).
 * bounds[k] (for g->outputs[k]) is a malloc'd array of its element count
 * that the caller frees, NULL for an integer or bool output.  On error
 * nothing is allocated (as nf_interp_run). */
int nf_interp_run_bounded(const nf_graph *g, const nf_array *inputs, nf_array *outputs,
                          double **bounds, nf_buf *err);

#endif
