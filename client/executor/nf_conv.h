/* nf_conv.h - recognising a 2-d convolution, or one of its two
 * gradients, in a statement: what cuDNN's three convolution operations
 * compute (tier 0 of convolution-shaped subgraphs on GPUs, nf_cudnn.h).
 *
 * With X an image batch (N x C x H x W), F a filter bank (K x C x R x S)
 * and Y the result (N x K x OH x OW), all f32, dense, in those layouts
 * (NCHW, KCRS), a statement matches when it is one of
 *
 *   forward      Y(n, k, y, x) +=! [g ?] X(n, c, sh y + dh r - ph,
 *                                            sw x + dw s - pw) * F(k, c, r, s)
 *   filter grad  F(k, c, r, s) +=! [g ?] Y(n, k, y, x) * X(n, c, sh y + dh r - ph,
 *                                                         sw x + dw s - pw)
 *   data grad    X(n, c, h, w) +=! [g ?] Y(n, k, h + ph - dh r,
 *                                            w + pw - dw s) * F(k, c, r, s)
 *                (stride 1 in this form; a strided one, as the autodiff
 *                writes it with floor divisions, is found by enumeration,
 *                below)
 *
 * in either order of the factors, the guard [g ?] ... : 0.0 at the top or
 * on one factor, where the guard is exactly the shifted operand's bounds
 * (0 <= index < extent on its two spatial dimensions; comparisons that
 * hold everywhere in the variables' ranges may be added or left out), and
 * the sizes are cuDNN's: OH = (H + 2 ph - dh (R - 1) - 1) / sh + 1 (and
 * OW).  A dimension of extent 1 may be indexed by the constant 0 instead
 * of a variable.  Every reduction variable starts at 0 and plays one of
 * the roles.
 *
 * A depthwise convolution (groups = C = K, F of K x 1 x R x S: output
 * channel k reads image channel k only, as lib/nn.nf's conv2d<groups = C>
 * with as many outputs as inputs) matches the same three forms with the
 * image's channel index the output channel's variable instead of c.
 * (Where the plain operand holds an infinity or NaN, cuDNN's zero
 * padding gives NaN where the guard gives 0.)
 *
 * Where those affine forms do not match, the statement is checked by
 * enumeration against each operation's sums (conv_enum.c): any grouping
 * (channel k // (K / G) * (C / G) + c), any stride of the data gradient,
 * any way of writing the indices with + - * // % min max and a guard of
 * comparisons, as long as each index and each comparison uses the
 * variables of one of batch, channels, rows or columns. */
#ifndef NF_CONV_H
#define NF_CONV_H

#include <stdint.h>

#include "nf_buf.h"
#include "nf_ir.h"

typedef enum nf_conv_kind {
  NF_CONV_FWD = 0,        /* Y from X and F */
  NF_CONV_BWD_DATA = 1,   /* X from Y and F */
  NF_CONV_BWD_FILTER = 2, /* F from X and Y */
} nf_conv_kind;

typedef struct nf_conv_desc {
  nf_conv_kind kind;
  int64_t n, c, h, w;  /* X */
  int64_t k, r, s;     /* F: k x c x r x s */
  int64_t oh, ow;      /* Y: n x k x oh x ow */
  int64_t pad_h, pad_w, str_h, str_w, dil_h, dil_w;
  int64_t groups; /* 1, or c (= k) for a depthwise convolution */
  uint32_t t_x, t_f, t_y; /* the graph's tensors in those roles (the
                             statement's output is one of them) */
} nf_conv_desc;

/* 1 and *d filled when statement si of g has one of the forms above, else
 * 0 (*d then undefined). */
int nf_conv_match(const nf_graph *g, uint32_t si, nf_conv_desc *d);

/* The enumerative reading (conv_enum.c): the same three operations,
 * grouped convolutions and the strided data gradient included, checked
 * by enumerating each group of variables; nf_conv_match tries it where
 * the affine reading finds nothing. */
int nf__conv_match_enum(const nf_graph *g, uint32_t si, nf_conv_desc *d);
/* For both readings (inline, so that conv.c and conv_enum.c do not use
 * each other): cuDNN's output size (-1 when none), and whether e is the
 * float constant 0 (a guard's else branch). */
static inline int64_t nf__conv_out_size(int64_t in, int64_t pad, int64_t dil, int64_t ker,
                                        int64_t str) {
  int64_t num = in + 2 * pad - dil * (ker - 1) - 1;
  return num < 0 ? -1 : num / str + 1;
}
static inline int nf__conv_is_zero(const nf_expr *e) {
  return e->op == NF_OP_CONST && nf_dtype_is_float((nf_dtype)e->dtype) && e->u.f == 0.0;
}

/* "forward", "data gradient", "filter gradient". */
const char *nf_conv_kind_name(nf_conv_kind k);

/* A subgraph (nf_partition_graph) whose tier 0 on a GPU is one of cuDNN's
 * operations: its first statement is its one reduction and matches
 * (nf_conv_match) with both operands inputs of the subgraph; the
 * statements after it (a fused epilogue: bias, ReLU, a ReLU's gradient,
 * a copy) run on the host through the interpreter, from the
 * convolution's result and the subgraph's inputs they read.  The
 * convolution's result is an output of the subgraph or a local, which
 * the caller gives storage (nf_conv_sub_result_bytes) on the device and,
 * where the epilogue reads it, on the host. */
typedef struct nf_conv_sub nf_conv_sub;

/* NF_OK with *out set when sub has that form, NF_OK with *out NULL when
 * not; NF_ENOMEM.  sub must outlive the result; the epilogue's graph is
 * built in sub->ctx. */
int nf_conv_prepare(const nf_graph *sub, nf_conv_sub **out, nf_buf *err);
void nf_conv_free(nf_conv_sub *s);
const nf_conv_desc *nf_conv_sub_desc(const nf_conv_sub *s);
/* The index among sub's buffers (inputs then outputs) of the tensor in
 * role 0 (the image), 1 (the filter) or 2 (the result of the forward
 * operation); -1 for the convolution's result when it is a local. */
int nf_conv_sub_buffer(const nf_conv_sub *s, int role);
/* The convolution's result in bytes. */
int64_t nf_conv_sub_result_bytes(const nf_conv_sub *s);
/* 1 when statements follow the convolution (an epilogue on the host). */
int nf_conv_sub_has_epilogue(const nf_conv_sub *s);
/* 1 when the epilogue reads buffer i (an input of sub, or the output that
 * is the convolution's result). */
int nf_conv_sub_epilogue_reads(const nf_conv_sub *s, uint32_t i);
/* Runs the epilogue: buffers are host storage of sub's inputs then
 * outputs, result the convolution's result on the host (an output's
 * buffer or the caller's storage of the local).  NF_OK or the
 * interpreter's error in err. */
int nf_conv_sub_epilogue(nf_conv_sub *s, void *const *buffers, void *result, nf_buf *err);
/* "cuDNN forward 8x1x28x28 * 6x1x5x5 pad 2 stride 1, epilogue 2 stmts". */
const char *nf_conv_sub_describe(const nf_conv_sub *s);

#endif
