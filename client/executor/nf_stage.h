/* nf_stage.h - statements of a subgraph run through the interpreter
 * around a library call: the prologue and epilogue of the GEMM tier
 * (nf_gemm.h) and the epilogue of cuDNN's convolutions (nf_conv.h).
 *
 * A stage is cut from the subgraph once (nf_graph_extract); a run binds
 * every subgraph tensor it reads to storage (ptr[tensor]), evaluates the
 * statements with f32 rounding and copies each result into ptr[tensor]
 * of its own tensor. */
#ifndef NF_STAGE_H
#define NF_STAGE_H

#include "nf_buf.h"
#include "nf_interp.h"
#include "nf_subgraph.h"

typedef struct nf_stage {
  int present;
  nf_subgraph sg;
  nf_array *in, *out;
} nf_stage;

/* Cuts statements stmts[0..n) of sub into S (n == 0: S stays absent);
 * is_out marks the tensors the stage must return.  NF_OK, NF_ENOMEM,
 * nf_graph_extract's error. */
int nf_stage_init(nf_stage *S, const nf_graph *sub, const uint32_t *stmts, uint32_t n,
                  const uint8_t *is_out);
/* Runs S with ptr[t] the storage of sub's tensor t (every tensor the
 * stage reads or returns); what names the stage in messages ("epilogue
 * of a GEMM subgraph").  NF_OK or the interpreter's error. */
int nf_stage_run(nf_stage *S, const nf_graph *sub, void *const *ptr, const char *what,
                 nf_buf *err);
void nf_stage_clear(nf_stage *S);

/* The index among sub's buffers (inputs then outputs) of sub's tensor t;
 * -1 for a local. */
int nf_stage_buffer(const nf_graph *sub, uint32_t t);

#endif
