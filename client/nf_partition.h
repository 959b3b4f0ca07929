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
#include "nf_subgraph.h"

/* nf_subgraph: common/nf_subgraph.h */

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

/* nf_graph_extract, nf_subgraph_clear, nf_stmt_reads: common/nf_subgraph.h */

#endif
