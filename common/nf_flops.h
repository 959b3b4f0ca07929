/* nf_flops.h - floating-point operation counts of statements (flops.c):
 * the client's gradient cost table and step-time shares, the search's
 * GFLOP/s and budget.  IR only. */
#ifndef NF_FLOPS_H
#define NF_FLOPS_H

#include <stdint.h>

#include "nf_ir.h"

/* Floating-point operations one statement executes: over the points of
 * its iteration box, the float operations of its right side on the select
 * branches taken (counted exactly where the conditions are index
 * arithmetic, as taken where they read tensors), each shared subexpression
 * once, plus one accumulation per point for a reduction.  Integer index
 * and guard arithmetic is free.  Operations are weighted in multiply
 * equivalents: division, sqrt, rsqrt 4; exp, log, tanh, sigmoid 8; erf 10;
 * pow 16; the others 1 (see flops.c). */
int64_t nf_stmt_flops(const nf_graph *g, uint32_t stmt);

/* What g computes, in a few words, for people: its notable operations in
 * order of first use ("matmul+max, 3 stmts"; "sum+exp+log, 7 stmts"),
 * into out[n] (truncated to fit). */
void nf_graph_summary(const nf_graph *g, char *out, size_t n);

#endif
