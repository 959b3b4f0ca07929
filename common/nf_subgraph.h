/* nf_subgraph.h - a part of a graph cut out as a graph of its own
 * (subgraph.c): the client's partitions, the executor's GEMM and
 * convolution stages.  Which statements go together is the partitioner's
 * policy (client/nf_partition.h); cutting them out is IR work, here. */
#ifndef NF_SUBGRAPH_H
#define NF_SUBGRAPH_H

#include <stdint.h>

#include "nf_ir.h"

typedef struct nf_subgraph {
  nf_graph *g;          /* built in the parent's context */
  uint32_t n_stmts;
  uint32_t *stmts;      /* the parent's statement indices, in order */
  uint32_t n_in, n_out;
  uint32_t *in;         /* parent tensor ids of g's inputs, in order */
  uint32_t *out;        /* parent tensor ids of g's outputs, in order */
  int anchor;           /* parent statement index of its reduction; -1: light */
  uint8_t key[32];      /* nf_graph_hash(g) */
} nf_subgraph;

/* Builds in g->ctx the graph of the statements stmts[0..n) of g, in that
 * order (each a valid statement index; the statements a result depends on
 * come first or are outside the set).  Its inputs are the tensors the
 * statements read that none of them produces, in order of first use (by
 * tensor id within one statement); its outputs are the results t with
 * is_out[t] set (is_out has g->n_tensors bytes), the other results are
 * locals.  Fills *sg: g, n_stmts and stmts (a copy), n_in/in, n_out/out
 * (tensor ids of g), anchor = -1 and key (nf_graph_hash).  The graph lives
 * in g->ctx, which must not be used concurrently; the arrays are malloc'd
 * (free with nf_subgraph_clear).  NF_OK or NF_ENOMEM (*sg then cleared). */
int nf_graph_extract(const nf_graph *g, const uint32_t *stmts, uint32_t n,
                     const uint8_t *is_out, nf_subgraph *sg);
/* Frees sg's arrays (not its graph, which lives in the context) and zeroes
 * it (anchor -1).  NULL is a no-op. */
void nf_subgraph_clear(nf_subgraph *sg);

/* Sets row[t] = 1 for every tensor t statement s of g reads (row has
 * g->n_tensors bytes, not cleared here).  NF_OK or NF_ENOMEM. */
int nf_stmt_reads(const nf_graph *g, uint32_t s, uint8_t *row);

#endif
