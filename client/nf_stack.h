/* nf_stack.h - one product over the steps of a recurrence instead of a
 * sum of per-step products (the weight gradient of an unrolled RNN).
 *
 * The gradient of a weight W that an unrolled recurrence applies at every
 * step is a sum of per-step products,
 *
 *     dW_t(i, j) +=! dG_t(n, i) * X_t(n, j)        (t = 0 .. T-1)
 *     grad_W(i, j) = dW_0(i, j) + ... + dW_T-1(i, j)
 *
 * T products with a short reduction (the batch) and T results of W's size
 * summed elementwise.  nf_stack_sums rewrites each such sum into copies of
 * the per-step operands into stacked tensors and one product whose
 * reduction also runs over the steps,
 *
 *     dG_stk(t, n, i) = t == 0 ? dG_0(n, i) : t == 1 ? dG_1(n, i) : ...
 *     X_stk(t, n, j)  = ...
 *     grad_W(i, j) +=! dG_stk(t, n, i) * X_stk(t, n, j)
 *
 * one GEMM with T times the reduction (cuDNN computes RNN weight
 * gradients the same way).  The terms' statements must be reductions of
 * one form (the same expression up to the tensors they read, of equal
 * shapes; the same ranges), each term read by the sum alone; tensors that
 * differ between terms are stacked, the others read as they are.  The
 * rewrite is skipped when the stacked copies would take more memory than
 * the per-step results they replace (a small result of large operands).
 * The order of summation changes (rounding only).  Matched anywhere in a
 * graph: nothing here knows about RNNs. */
#ifndef NF_STACK_H
#define NF_STACK_H

#include "nf_ir.h"

/* Rewrites every such sum of g.  NF_OK with *out the rewritten graph
 * (built in g->ctx; same inputs and outputs, in order) and *n_done the
 * number of sums rewritten, or *out NULL when there is none; NF_ENOMEM. */
int nf_stack_sums(const nf_graph *g, nf_graph **out, int *n_done);

/* The rewrites a session applies to its gradient graph before
 * partitioning, in order: nf_stack_sums, then nf_narrow_reads
 * (nf_narrow.h).  *out is the result, g itself when neither applies;
 * NF_OK or NF_ENOMEM. */
int nf_rewrite_grad(nf_graph *g, nf_graph **out);

#endif
