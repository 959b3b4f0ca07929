/* nf_partition.h - partitioning a (training) graph into the subgraphs
 * that are compiled, tuned and cached one by one (DESIGN.md):
 *
 *  - every reduction statement is an anchor: a subgraph holds at most one;
 *  - an elementwise statement that reads an anchor's result joins the
 *    anchor's subgraph as an epilogue;
 *  - a non-reduction producer whose result (a local tensor) is read only
 *    inside one anchored subgraph is inlined into it;
 *  - the remaining light statements group together, in statement order;
 *  - no merge ever makes the subgraphs depend on each other in a cycle,
 *    so they run in the order given (a topological order).
 *
 * Each subgraph is a graph of its own (its inputs: what it reads from the
 * parent's inputs or from other subgraphs; its outputs: what the parent
 * returns or other subgraphs read), with its canonical key
 * (nf_graph_hash), so repeated blocks and equal shapes share one key and
 * are compiled once. */
#ifndef NF_PARTITION_H
#define NF_PARTITION_H

#include <stdint.h>

#include "nf_buf.h"
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

typedef struct nf_partition {
  uint32_t n;
  nf_subgraph *sub;     /* in an order that respects every dependency */
  uint32_t *group_of;   /* parent statement -> subgraph index */
} nf_partition;

/* Partitions g (validated first).  The subgraphs' graphs live in g->ctx;
 * the arrays are malloc'd: free with nf_partition_free.  NF_OK, NF_EINVAL
 * (g does not validate: message in err), NF_ENOMEM. */
int nf_partition_graph(const nf_graph *g, nf_partition **out, nf_buf *err);
void nf_partition_free(nf_partition *p);

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
