/* nf_autodiff.h - expression-based reverse-mode differentiation.
 *
 * nf_grad_graph turns a forward graph into a gradient graph made of ordinary IR
 * statements: for each statement, the adjoint of each access X(f(i, r)) is
 * written by inverting the index map (nf_invert.h), so the gradient of a
 * matmul is a matmul and the data gradient of a strided convolution is a
 * convolution-shaped reduction; where no inversion exists the adjoint is a
 * scatter-accumulate statement flagged NF_STMT_SCATTER.  Partial adjoints
 * from several consumers are summed; adjoints that no requested gradient
 * needs are never built; forward statements are kept only where an
 * adjoint reads them.  `stop_gradient(e)` blocks the flow.
 *
 * The gradient graph's inputs are the forward inputs (same order and
 * names) followed by one seed per forward output, named "d" + output name
 * (same shape and dtype).  Its outputs are the forward outputs (when
 * keep_outputs is set) followed by "grad_" + name for each requested
 * input, in the order asked.  Gradients are float tensors of the input's
 * shape and dtype. */
#ifndef NF_AUTODIFF_H
#define NF_AUTODIFF_H

#include "nf_buf.h"
#include "nf_flops.h"
#include "nf_ir.h"

typedef struct nf_grad_opts {
  int n_wrt;
  const char *const *wrt; /* names of float input tensors of g */
  int keep_outputs;       /* also return the forward outputs, first */
} nf_grad_opts;

/* One statement of the gradient graph, for the FLOP table. */
typedef struct nf_grad_item {
  uint32_t stmt;      /* statement index in the gradient graph */
  int32_t fwd_stmt;   /* the forward statement it differentiates, or -1
                         (seed sums, zero fills, argmax helpers) */
  const char *wrt;    /* tensor whose adjoint it contributes to */
  int64_t flops;      /* nf_stmt_flops of this statement */
  int64_t fwd_flops;  /* of the forward statement (0 when fwd_stmt < 0) */
  int scatter;        /* the flagged scatter form (no inversion exists) */
  const char *why;    /* for scatters: why no inversion exists */
} nf_grad_item;

typedef struct nf_grad_report {
  int n_items;
  nf_grad_item *items;  /* in the ctx's arena */
  int n_notes;
  const char **notes;   /* e.g. "gradient of X is zero: no path to an output" */
} nf_grad_report;

/* Builds the gradient graph of g in ctx (g may live in another context).
 * Errors (unknown or non-float wrt tensor, a gradient that cannot be
 * formed: through a float-to-integer cast or `%` of a differentiated value)
 * name the statement and the reason in err and return NF_EINVAL or
 * NF_EUNSUPPORTED.  rep may be NULL. */
int nf_grad_graph(const nf_graph *g, const nf_grad_opts *o, nf_ir_ctx *ctx,
            nf_graph **out, nf_grad_report *rep, nf_buf *err);

/* nf_stmt_flops: common/nf_flops.h */

#endif
