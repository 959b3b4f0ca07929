/* nf_narrow.h - intermediates computed only where they are read.
 *
 * Reverse-mode differentiation of a slice or a concatenation produces the
 * gradient of the whole and then reads part of it: an LLTM step's gates
 * are W [x, h], and since x is data, only the h columns of the gradient of
 * [x, h] are ever read,
 *
 *     dXH(n, j) +=! dG(n, o) * W(o, j)            j in 0:768
 *     dH(n, j) = dXH(n, j + 256)                  j in 0:512
 *
 * a third of that product computed for nothing.  nf_narrow_reads shrinks
 * each local tensor to the box its readers read (interval bounds of their
 * index expressions over their loop ranges), shifting its producer's
 * output variables and its readers' indices,
 *
 *     dXH(n, j) +=! dG(n, o) * W(o, j + 256)      j in 0:512
 *     dH(n, j) = dXH(n, j)
 *
 * (the GEMM tier takes W(o, j + 256) as a slice: an offset pointer).  A
 * tensor is narrowed when at least a tenth of it is never read; inputs,
 * outputs and tensors read out of their bounds are left alone.  Values
 * are unchanged: every cell computed is computed as before. */
#ifndef NF_NARROW_H
#define NF_NARROW_H

#include "nf_ir.h"

/* NF_OK with *out the narrowed graph (built in g->ctx; same tensors,
 * inputs and outputs, in order) and *n_done the tensors narrowed, or *out
 * NULL when none is; NF_ENOMEM. */
int nf_narrow_reads(const nf_graph *g, nf_graph **out, int *n_done);

/* Tensors stored only where they can be nonzero.  The gradient of a read
 * at a constant index (an RNN step reading its slice t of a product
 * computed for all steps at once, Wx(t, n, g)) is a whole tensor that is
 * zero but for that slice,
 *
 *     dWx_7(t, n, g) = t == 0 ? dpre_0(n, g) * .. : 0.0
 *
 * nf_narrow_zeros stores each local elementwise tensor whose statement is
 * `c ? v : 0` with c a conjunction of bounds on its own output variables
 * only over that box (v with the variables shifted), and its readers read
 * `inside ? T(i - lo) : 0`; the lowering then cuts their loops where those
 * selects switch (docs/schedules.md, index-set splitting).  A tensor is
 * narrowed when at least a tenth of it is always zero.  Values are
 * unchanged.  Same contract as nf_narrow_reads. */
int nf_narrow_zeros(const nf_graph *g, nf_graph **out, int *n_done);

#endif
