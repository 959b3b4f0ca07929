/* stage.c - nf_stage.h. */
#include <stdlib.h>
#include <string.h>

#include "nf_stage.h"

int nf_stage_init(nf_stage *S, const nf_graph *sub, const uint32_t *stmts, uint32_t n,
                  const uint8_t *is_out) {
  if (n == 0) return NF_OK;
  int rc = nf_graph_extract(sub, stmts, n, is_out, &S->sg);
  if (rc != NF_OK) return rc;
  S->present = 1;
  S->in = calloc(S->sg.n_in ? S->sg.n_in : 1, sizeof *S->in);
  S->out = calloc(S->sg.n_out ? S->sg.n_out : 1, sizeof *S->out);
  if (!S->in || !S->out) return NF_ENOMEM;
  for (uint32_t k = 0; k < S->sg.n_in; k++) {
    const nf_tensor *t = &sub->tensors[S->sg.in[k]];
    S->in[k].dtype = (nf_dtype)t->dtype;
    S->in[k].rank = t->rank;
    memcpy(S->in[k].shape, t->shape, sizeof t->shape);
    S->in[k].numel = nf_tensor_numel(t);
  }
  return NF_OK;
}

void nf_stage_clear(nf_stage *S) {
  nf_subgraph_clear(&S->sg);
  free(S->in);
  free(S->out);
  S->in = S->out = NULL;
  S->present = 0;
}

int nf_stage_run(nf_stage *S, const nf_graph *sub, void *const *ptr, const char *what,
                 nf_buf *err) {
  for (uint32_t k = 0; k < S->sg.n_in; k++) S->in[k].data = ptr[S->sg.in[k]];
  int rc = nf_interp_run(S->sg.g, S->in, NF_INTERP_F32, S->out, err);
  if (rc != NF_OK) {
    nf_buf_printf(err, " (in the %s)", what);
    return rc;
  }
  for (uint32_t k = 0; k < S->sg.n_out; k++) {
    const nf_tensor *t = &sub->tensors[S->sg.out[k]];
    if (rc == NF_OK &&
        (S->out[k].dtype != (nf_dtype)t->dtype || S->out[k].numel != nf_tensor_numel(t))) {
      nf_buf_printf(err, "the %s's output %s came back as %s", what, t->name,
                    nf_dtype_name(S->out[k].dtype));
      rc = NF_EINTERNAL;
    }
    if (rc == NF_OK && S->out[k].numel)
      memcpy(ptr[S->sg.out[k]], S->out[k].data,
             (size_t)(nf_tensor_numel(t) * (int64_t)nf_dtype_size((nf_dtype)t->dtype)));
    nf_array_free(&S->out[k]);
  }
  return rc;
}

int nf_stage_buffer(const nf_graph *sub, uint32_t t) {
  for (uint32_t i = 0; i < sub->n_inputs; i++)
    if (sub->inputs[i] == t) return (int)i;
  for (uint32_t i = 0; i < sub->n_outputs; i++)
    if (sub->outputs[i] == t) return (int)(sub->n_inputs + i);
  return -1;
}
