/* nf_invert.h - solving an access's index map for the statement's
 * variables (internal to client/autodiff).
 *
 * A statement iterates its variables v_0 .. v_{n-1} over a box (v_j in
 * [box[j].lo, box[j].hi], inclusive) and reads X(e_0(v), ..., e_{d-1}(v)).
 * The adjoint of X needs, for every element y of X (0 <= y_k < shape[k]),
 * the preimage P(y) = { v in box : e(v) = y }.  nf__invert describes it as
 *
 *     P(y) = { v(y, t) : 0 <= t_l < t_ext[l] for each l, guard(y, t) }
 *
 * where v_j(y, t) and guard are IR expressions over new variables: y_k is
 * VAR k (k < d) and t_l is VAR d + l.  The map t -> v(y, t) is injective on
 * the guarded set, so every v of P(y) is produced exactly once.
 *
 * Efficiency: the number of (y, t) points, prod(shape) * prod(t_ext), is
 * close to the number of points of the box that the access reads (so the
 * gradient of a strided or dilated convolution iterates a convolution-
 * shaped set, not the whole output space): the free parameters are chosen
 * among the variables with small ranges, and each one's range is
 * tightened by shifting it by a lower bound that depends on y (floor
 * divisions of affine forms of y), with guards only where the tight range
 * is not a box.
 *
 * Index expressions may be affine in the variables, or contain `u // c`
 * and `u % c` with u affine and c a positive constant (each replaced by a
 * fresh quotient and remainder with their range constraint).  Anything
 * else (an index that reads a tensor, a product of variables, ...) is not
 * invertible here: the caller then uses the flagged scatter form. */
#ifndef NF_INVERT_H
#define NF_INVERT_H

#include "nf_ir.h"

typedef struct nf_inversion {
  int n_t;                         /* free parameters */
  int64_t t_ext[NF_MAX_VARS];      /* each >= 1 */
  const nf_expr *v[NF_MAX_VARS];   /* n_vars entries: i64 expressions of (y, t) */
  const nf_expr *guard;            /* bool expression of (y, t); NULL: always true */
  const char *t_names[NF_MAX_VARS];/* name hints (the variable each t stands for);
                                      static or arena strings, may be NULL */
} nf_inversion;

/* Solves the index map.  n_vars <= NF_MAX_VARS, d <= NF_MAX_RANK, every
 * box non-empty (lo <= hi).  The result's expressions are built in ctx.
 * Returns NF_OK; NF_EUNSUPPORTED with a one-line reason appended to why
 * when the map is not of the supported form or the result would need more
 * than NF_MAX_VARS - d free parameters; NF_EOVERFLOW when the integer
 * arithmetic would overflow 64 bits; NF_ENOMEM. */
int nf__invert(nf_ir_ctx *ctx, int n_vars, const nf_range *box,
               const char *const *var_names, int d, const nf_expr *const *idx,
               const int64_t *shape, nf_inversion *out, nf_buf *why);

#endif
