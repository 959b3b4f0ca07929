/* nf_gemm.h - tier 0 for matmul-shaped subgraphs: OpenBLAS cblas_sgemm
 * instead of the reference interpreter.
 *
 * A subgraph (a graph from nf_partition_graph) is matmul-shaped when its
 * one reduction statement (the anchor) is a plain, possibly batched, f32
 * matrix product once its operands exist:
 *
 *     T(b.., i, j) +=! X(..) * Y(..)
 *
 * with reduction variables that both operands read, every index a bare
 * variable or a constant (no offsets, strides or expressions), each
 * variable at most once per access, and X, Y tensors of the subgraph
 * (inputs or locals computed before the anchor).  Output variables that
 * only X reads are rows, those only Y reads columns, those both read (or
 * neither) are batch loops; reduction variables contiguous in both
 * operands are sgemm's K, the others loops of calls that accumulate; any
 * transpose of either operand and of the result maps to sgemm's
 * NN/NT/TN/TT forms, and what does not fit one call (a weight shared
 * across the batch, several row variables that are not adjacent in
 * memory) becomes a loop of sgemm calls with leading dimensions.
 *
 * A convolution-shaped anchor, T(o..) +=! [g ?] A(f(o.., r..)) * B(..)
 * [: 0.0] with B plain and A at computed indices (a shifted, strided
 * window) or guarded (zero padding), is rewritten first: a local
 * Acol(r.., o..) = g ? A(f(..)) : 0.0 over the variables A and g read
 * (im2col, by the interpreter, at most 256 MiB) joins the prologue, and
 * the anchor becomes the plain product of Acol and B.  This covers a
 * conv2d (any stride and padding), its weight gradient, its data
 * gradient at stride 1 and depthwise convolutions (a batch of small
 * products).  (Where B holds an infinity or NaN, a padded position gives
 * NaN instead of 0: the select moved from the product to A.)  Other
 * shapes (a sum over one operand only, both operands shifted, a shifted
 * reduction range not starting at 0, a constant factor, non-f32,
 * f16/bf16/f64 tensors anywhere in the subgraph) are not matmul-shaped:
 * the caller keeps the interpreter.
 *
 * The statements before the anchor (inlined producers: a concat, a
 * transpose) run as one prologue graph through the interpreter, the
 * statements after it (the fused epilogue: bias, ReLU) as one epilogue
 * graph; both are cut from the subgraph with nf_graph_extract.  sgemm
 * accumulates in f32 (the interpreter in f64), so results agree to f32
 * rounding of a K-term sum, not bit for bit. */
#ifndef NF_GEMM_H
#define NF_GEMM_H

#include "nf_buf.h"
#include "nf_runtime.h"
#include "nf_ir.h"

typedef struct nf_gemm_sub nf_gemm_sub;

/* Analyses sub (one subgraph's graph; it must stay alive, unchanged, as
 * long as the result).  NF_OK with *out set when sub is matmul-shaped,
 * NF_OK with *out NULL when it is not; NF_EINVAL when sub does not
 * validate (message in err), NF_ENOMEM.  The prologue and epilogue graphs
 * are built in sub->ctx (they live as long as it; the context must not be
 * used concurrently meanwhile); the intermediates a run needs (the
 * prologue's results, a local anchor result) are allocated here, once. */
int nf_gemm_prepare(const nf_graph *sub, nf_gemm_sub **out, nf_buf *err);

/* Runs s: buffers are sub's inputs then its outputs, in graph order, each
 * dense row-major in its tensor's dtype (the kernel ABI, nf_kernel.h);
 * every output is written.  Allocates nothing itself (the interpreter
 * allocates while running the prologue and epilogue).  NF_OK, or the
 * interpreter's error for the prologue or epilogue with its message in
 * err.  Not thread-safe on one s (its intermediates are shared).  A large
 * product or gather is split over pool's threads (NULL: the calling
 * thread only), each share a single-threaded BLAS call: OpenBLAS must
 * then run at one thread (nf_gemm_set_threads(1)), or its own spinning
 * workers take the cores the pool needs. */
int nf_gemm_run(nf_gemm_sub *s, void *const *buffers, nf_pool *pool, nf_buf *err);

/* Sharing a convolution's gathered operand (im2col) between products
 * that read it, like a convolution and its weight gradient: the input
 * (index among sub's inputs) s's native gather reads, or -1 (no native
 * gather, or it reads a prologue's result); 1 when a and b gather the
 * same cells in the same layout from inputs of the same shape.
 * nf_gemm_run_shared is nf_gemm_run taking the gathered operand from
 * from's last run instead of gathering it (when nf_gemm_gather_same(s,
 * from); else it gathers): the caller guarantees that run gathered from
 * the same buffer, unchanged since, and that from is not running. */
int nf_gemm_gather_input(const nf_gemm_sub *s);
int nf_gemm_gather_same(const nf_gemm_sub *a, const nf_gemm_sub *b);
int nf_gemm_run_shared(nf_gemm_sub *s, void *const *buffers, nf_pool *pool,
                       const nf_gemm_sub *from, nf_buf *err);

/* A plain product for other BLAS libraries (cuBLAS on a GPU): when s
 * needs no prologue, epilogue or gather and its product reads and writes
 * the subgraph's own buffers, fills *d and returns 1 (else 0).  A run is
 * then, for every combination q of the batch loops with a C stride (st
 * != 0) and every combination r of those without (st == 0: the calls
 * after the first accumulate, beta 1), one row-major product
 *   C[c + oc] (m x n, ldc) = op(A[a + off_a + oa]) (m x k, lda)
 *                            . op(B[b + off_b + ob]) (k x n, ldb)
 * where oc, oa, ob sum e-index times st, sp, sq over the loops; a, b, c
 * index the run's buffers (inputs then outputs).  A run with k == 0
 * zeroes C (c_numel elements). */
typedef struct nf_gemm_desc {
  uint32_t a, b, c;
  int trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, off_a, off_b, c_numel;
  int n_batch;
  struct {
    int64_t e, st, sp, sq;
  } batch[NF_MAX_VARS];
} nf_gemm_desc;
int nf_gemm_plain(const nf_gemm_sub *s, nf_gemm_desc *d);
/* The same for a product computed elsewhere (cuBLAS) and followed by s's
 * epilogue run here: s has no prologue or gather; *d is filled as above,
 * except that C is a local of the subgraph where d->c is the number of
 * its buffers (the caller gives that storage: nf_gemm_c_bytes).  Then
 * nf_gemm_epilogue runs the epilogue on host buffers (inputs then
 * outputs) with c the product's result on the host, reading the buffers
 * for which nf_gemm_epilogue_reads (i: a buffer index) says 1.  An
 * epilogue's error is the interpreter's, in err. */
int nf_gemm_device(const nf_gemm_sub *s, nf_gemm_desc *d);
int nf_gemm_has_epilogue(const nf_gemm_sub *s);
int64_t nf_gemm_c_bytes(const nf_gemm_sub *s);
int nf_gemm_epilogue_reads(const nf_gemm_sub *s, uint32_t i);
int nf_gemm_epilogue(nf_gemm_sub *s, void *const *buffers, void *c, nf_buf *err);

/* Frees s (not the graphs in sub->ctx).  NULL is a no-op. */
void nf_gemm_free(nf_gemm_sub *s);

/* A short description for logs, e.g. "sgemm NT 64x128x784 batch 1,
 * prologue 1 stmt, epilogue 2 stmts" (M x N x K, batch = sgemm calls per
 * run), with ", gather 1 stmt" appended when a convolution's operand is
 * gathered (that statement is counted in the prologue).  Owned by s,
 * valid while it lives. */
const char *nf_gemm_describe(const nf_gemm_sub *s);
/* The statements s runs through the interpreter around the product: its
 * prologue (a gather run natively not counted) and its epilogue. */
void nf_gemm_stages(const nf_gemm_sub *s, int *n_pro, int *n_epi);

/* The number of threads OpenBLAS may use inside one call
 * (openblas_set_num_threads; n < 1 means 1).  Process-wide.  Sessions set
 * 1 and split the work over their pool (nf_gemm_run). */
void nf_gemm_set_threads(int n);

/* OpenBLAS's kernel family (openblas_get_corename) when it is the generic
 * one ("Prescott", what OpenBLAS 0.3.21 falls back to on CPUs it does not
 * know, e.g. Sapphire Rapids under some hypervisors) on a CPU with AVX2 and
 * FMA; NULL otherwise.  *suggest is then the OPENBLAS_CORETYPE that fits
 * the CPU ("SkylakeX" with AVX-512F, else "Haswell").  The choice is made
 * when OpenBLAS is loaded, so it can only be reported, not changed. */
const char *nf_gemm_blas_misfit(const char **suggest);

#endif
