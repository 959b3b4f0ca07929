/* invert.c - placeholder while the index-map inversion is written: every
 * access is reported as not invertible, so nf_grad emits the (correct but
 * slow) flagged scatter form for every gradient.  Replaced by the real
 * inversion in the next commits of issue 3. */
#include "nf_invert.h"

int nf__invert(nf_ir_ctx *ctx, int n_vars, const nf_range *box,
               const char *const *var_names, int d, const nf_expr *const *idx,
               const int64_t *shape, nf_inversion *out, nf_buf *why) {
  (void)ctx;
  (void)n_vars;
  (void)box;
  (void)var_names;
  (void)d;
  (void)idx;
  (void)shape;
  (void)out;
  nf_buf_puts(why, "index-map inversion not implemented yet");
  return NF_EUNSUPPORTED;
}
