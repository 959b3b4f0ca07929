/* nf_test_cases.h - what the gradient (test_autodiff.c) and lowering
 * (test_lower.c) suites share: a seeded generator of non-zero values, the
 * description of a random input, and the table of cases covering every
 * def of lib/nn.nf (odd shapes, strides, dilations, groups) and every
 * built-in operator (the defs of tests/data/builtins.nf, which imports
 * nn: load it with nf_test_lib_path).  Header-only, for the test
 * executables. */
#ifndef NF_TEST_CASES_H
#define NF_TEST_CASES_H

#include <stdint.h>

#include "nf_ir.h"
#include "nf_test_lib.h"

#define MAX_IN 12 /* inputs of one case */

typedef struct rng {
  uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform in scale * ([-1, -0.1] u [0.1, 1]): never zero. */
static inline double rng_nz(rng *r, double scale) {
  double v = 0.1 + 0.9 * rng_unit(r);
  return (rng_next(r) & 1) ? scale * v : -scale * v;
}

/* How an input is filled. */
typedef enum { IN_NZ = 0, IN_UNIF, IN_IDX, IN_ONEHOT, IN_TIES } in_kind;

typedef struct ispec {
  in_kind kind;
  double a, b; /* IN_NZ: scale a; IN_UNIF: [a, b); IN_IDX: [0, a) */
  int rank;
  int64_t dims[NF_MAX_RANK];
} ispec;

typedef struct libcase {
  const char *label, *def;
  int n_par;
  const char *pn[4];
  int64_t pv[4];
  int n_in;
  ispec in[MAX_IN];
  const char *wrt; /* space-separated; NULL: every float input */
  int all;         /* check every element, whatever the size */
  int known;       /* a known failure: runs in "known_failures" */
} libcase;

#define NZ(scale, rank, ...) {IN_NZ, scale, 0, rank, {__VA_ARGS__}}
#define UNIF(lo, hi, rank, ...) {IN_UNIF, lo, hi, rank, {__VA_ARGS__}}
#define IDX(hi, rank, ...) {IN_IDX, hi, 0, rank, {__VA_ARGS__}}
#define ONEHOT(rank, ...) {IN_ONEHOT, 0, 0, rank, {__VA_ARGS__}}
#define SCALAR(scale) {IN_NZ, scale, 0, 0, {0}}
#define P1(a, va) 1, {a}, {va}
#define P2(a, va, b, vb) 2, {a, b}, {va, vb}
#define P3(a, va, b, vb, c, vc) 3, {a, b, c}, {va, vb, vc}
#define P4(a, va, b, vb, c, vc, d, vd) 4, {a, b, c, d}, {va, vb, vc, vd}
#define P0 0, {0}, {0}

/* Every def of lib/nn.nf, and the built-in operators. */
static const libcase lib_cases[] = {
    {"matmul", "matmul", P0, 2, {NZ(1, 2, 5, 7), NZ(1, 2, 7, 3)}, NULL, 0, 0},
    {"batch_matmul", "batch_matmul", P0, 2, {NZ(1, 4, 2, 3, 5, 7), NZ(1, 4, 2, 3, 7, 3)},
     NULL, 0, 0},
    {"batch_matmul no batch", "batch_matmul", P0, 2, {NZ(1, 2, 3, 5), NZ(1, 2, 5, 7)},
     NULL, 0, 0},
    {"linear", "linear", P0, 3, {NZ(1, 3, 3, 4, 7), NZ(1, 2, 5, 7), NZ(1, 1, 5)}, NULL, 0,
     0},
    {"linear rank 1", "linear", P0, 3, {NZ(1, 1, 7), NZ(1, 2, 5, 7), NZ(1, 1, 5)}, NULL, 0,
     0},
    {"conv2d defaults", "conv2d", P0, 2, {NZ(1, 4, 2, 3, 7, 9), NZ(1, 4, 5, 3, 3, 2)},
     NULL, 0, 0},
    {"conv2d stride 2", "conv2d", P1("stride", 2), 2,
     {NZ(1, 4, 2, 3, 9, 7), NZ(1, 4, 4, 3, 3, 3)}, NULL, 0, 0},
    {"conv2d stride 3 pad 1", "conv2d", P2("stride", 3, "pad", 1), 2,
     {NZ(1, 4, 1, 3, 11, 10), NZ(1, 4, 3, 3, 3, 3)}, NULL, 0, 0},
    {"conv2d stride 3 kernel 2 (gaps)", "conv2d", P1("stride", 3), 2,
     {NZ(1, 4, 1, 2, 8, 9), NZ(1, 4, 3, 2, 2, 2)}, NULL, 0, 0},
    {"conv2d dilation 2", "conv2d", P1("dilation", 2), 2,
     {NZ(1, 4, 1, 2, 9, 9), NZ(1, 4, 3, 2, 3, 3)}, NULL, 0, 0},
    {"conv2d groups 3", "conv2d", P1("groups", 3), 2,
     {NZ(1, 4, 2, 6, 7, 7), NZ(1, 4, 9, 2, 3, 3)}, NULL, 0, 0},
    {"conv2d pad 2", "conv2d", P1("pad", 2), 2, {NZ(1, 4, 2, 3, 5, 7), NZ(1, 4, 3, 3, 3, 3)},
     NULL, 0, 0},
    {"conv2d stride 2 pad 2 dil 2 groups 3", "conv2d",
     P4("stride", 2, "pad", 2, "dilation", 2, "groups", 3), 2,
     {NZ(1, 4, 2, 6, 11, 11), NZ(1, 4, 9, 2, 3, 3)}, NULL, 0, 0},
    {"conv2d depthwise", "conv2d", P2("pad", 1, "groups", 5), 2,
     {NZ(1, 4, 2, 5, 7, 7), NZ(1, 4, 5, 1, 3, 3)}, NULL, 0, 0},
    {"conv2d pointwise", "conv2d", P0, 2, {NZ(1, 4, 2, 5, 3, 7), NZ(1, 4, 3, 5, 1, 1)},
     NULL, 0, 0},
    {"max_pool2d 3/2/1", "max_pool2d", P3("kernel", 3, "stride", 2, "pad", 1), 1,
     {NZ(1, 4, 2, 3, 9, 7)}, NULL, 0, 0},
    {"max_pool2d 2", "max_pool2d", P1("kernel", 2), 1, {NZ(1, 4, 2, 3, 8, 7)}, NULL, 0, 0},
    {"max_pool2d 3/1", "max_pool2d", P2("kernel", 3, "stride", 1), 1,
     {NZ(1, 4, 1, 3, 7, 5)}, NULL, 0, 0},
    {"max_pool2d 2/3 (gaps)", "max_pool2d", P2("kernel", 2, "stride", 3), 1,
     {NZ(1, 4, 1, 2, 8, 9)}, NULL, 0, 0},
    {"avg_pool2d 3/1/1", "avg_pool2d", P3("kernel", 3, "stride", 1, "pad", 1), 1,
     {NZ(1, 4, 1, 2, 5, 6)}, NULL, 0, 0},
    {"avg_pool2d 3/2/1", "avg_pool2d", P3("kernel", 3, "stride", 2, "pad", 1), 1,
     {NZ(1, 4, 2, 3, 9, 7)}, NULL, 0, 0},
    {"avg_pool2d 2", "avg_pool2d", P1("kernel", 2), 1, {NZ(1, 4, 2, 3, 8, 7)}, NULL, 0, 0},
    {"relu", "relu", P0, 1, {NZ(1, 3, 3, 5, 7)}, NULL, 0, 0},
    {"relu6", "relu6", P0, 1, {NZ(9, 3, 3, 5, 7)}, NULL, 0, 0},
    {"elu", "elu", P0, 1, {NZ(2, 3, 3, 5, 7)}, NULL, 0, 0},
    {"gelu", "gelu", P0, 1, {NZ(3, 3, 3, 5, 7)}, NULL, 0, 0},
    {"sigmoid", "sigmoid", P0, 1, {NZ(3, 3, 3, 5, 7)}, NULL, 0, 0},
    {"tanh", "tanh", P0, 1, {NZ(2, 3, 3, 5, 7)}, NULL, 0, 0},
    {"softplus", "softplus", P0, 1, {NZ(25, 3, 3, 5, 7)}, NULL, 0, 0},
    {"silu", "silu", P0, 1, {NZ(3, 3, 3, 5, 7)}, NULL, 0, 0},
    {"expm1", "expm1", P0, 1, {NZ(1.5, 3, 3, 5, 7)}, NULL, 0, 0},
    {"log1p", "log1p", P0, 1, {UNIF(-0.9, 3, 3, 3, 5, 7)}, NULL, 0, 0},
    {"linear_nobias", "linear_nobias", P0, 2, {NZ(1, 3, 3, 4, 7), NZ(1, 2, 5, 7)}, NULL, 0,
     0},
    {"softmax", "softmax", P0, 1, {NZ(3, 3, 3, 4, 9)}, NULL, 0, 0},
    {"softmax rank 1", "softmax", P0, 1, {NZ(3, 1, 7)}, NULL, 0, 0},
    {"log_softmax", "log_softmax", P0, 1, {NZ(3, 3, 3, 4, 9)}, NULL, 0, 0},
    {"cross_entropy", "cross_entropy", P0, 2, {NZ(3, 2, 7, 5), IDX(5, 1, 7)}, NULL, 0, 0},
    {"margin_loss", "margin_loss", P0, 2, {UNIF(0.01, 0.99, 2, 7, 5), ONEHOT(2, 7, 5)},
     NULL, 0, 0},
    {"mse", "mse", P0, 2, {NZ(1, 3, 3, 5, 7), NZ(1, 3, 3, 5, 7)}, NULL, 0, 0},
    {"layer_norm", "layer_norm", P0, 3, {NZ(2, 3, 3, 4, 11), NZ(1, 1, 11), NZ(1, 1, 11)},
     NULL, 0, 0},
    {"batch_norm", "batch_norm", P0, 3, {NZ(2, 4, 3, 5, 4, 3), NZ(1, 1, 5), NZ(1, 1, 5)},
     NULL, 0, 0},
    {"concat", "concat", P0, 2, {NZ(1, 3, 3, 4, 5), NZ(1, 3, 3, 4, 7)}, NULL, 0, 0},
    {"split", "split", P1("at", 3), 1, {NZ(1, 3, 3, 4, 7)}, NULL, 0, 0},
    {"reshape", "reshape2", P2("r0", 3, "r1", 10), 1, {NZ(1, 2, 5, 6)}, NULL, 0, 0},
    {"flatten", "flatten_nchw", P0, 1, {NZ(1, 4, 2, 3, 5, 7)}, NULL, 0, 0},
    {"transpose", "transpose_last", P0, 1, {NZ(1, 4, 2, 3, 5, 7)}, NULL, 0, 0},
    {"permute 2031", "permute4", P4("p0", 2, "p1", 0, "p2", 3, "p3", 1), 1,
     {NZ(1, 4, 2, 3, 4, 5)}, NULL, 0, 0},
    {"permute 3210", "permute4", P4("p0", 3, "p1", 2, "p2", 1, "p3", 0), 1,
     {NZ(1, 4, 2, 3, 4, 5)}, NULL, 0, 0},
    {"reshape, flatten (built-in)", "bi_reshape", P0, 1, {NZ(1, 3, 3, 4, 5)}, NULL, 0, 0},
    {"flatten 1..2 (built-in)", "bi_flatten", P0, 1, {NZ(1, 4, 2, 3, 4, 5)}, NULL, 0, 0},
    {"transpose (built-in)", "bi_transpose", P0, 1, {NZ(1, 3, 3, 4, 5)}, NULL, 0, 0},
    {"permute rank 5 (built-in)", "bi_permute", P0, 1, {NZ(1, 5, 2, 3, 4, 2, 3)}, NULL, 0,
     0},
    {"sum mean amax amin (built-in)", "bi_reduce", P0, 1, {NZ(1, 3, 3, 4, 5)}, NULL, 0, 0},
    {"cat stack (built-in)", "bi_cat", P0, 3, {NZ(1, 2, 3, 2), NZ(1, 2, 3, 4), NZ(1, 2, 3, 2)},
     NULL, 0, 0},
    {"chunk (built-in)", "bi_chunk", P0, 1, {NZ(1, 2, 3, 6)}, NULL, 0, 0},
    {"unbind (built-in)", "bi_unbind", P0, 1, {NZ(1, 2, 2, 5)}, NULL, 0, 0},
    {"where clamp (built-in)", "bi_where", P0, 2, {NZ(1, 2, 4, 5), NZ(1, 1, 5)}, NULL, 0, 0},
    {"X[t], stack(H[1:T+1]) (built-in)", "bi_rnn", P1("T", 4), 5,
     {NZ(1, 2, 4, 3), NZ(0.5, 1, 3), NZ(0.5, 2, 3, 3), NZ(0.5, 2, 3, 3), NZ(0.5, 1, 3)}, NULL,
     0, 0},
    {"broadcasting", "bi_broadcast", P0, 3, {NZ(1, 3, 2, 3, 4), NZ(1, 2, 3, 1), NZ(1, 1, 4)},
     NULL, 0, 0},
    {"nested calls", "bi_nested", P0, 3, {NZ(1, 2, 3, 5), NZ(1, 2, 4, 5), NZ(1, 1, 4)}, NULL,
     0, 0},
    {"channel_shuffle", "channel_shuffle", P1("groups", 3), 1, {NZ(1, 4, 2, 9, 3, 5)}, NULL,
     0, 0},
    {"add", "add", P0, 2, {NZ(1, 2, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"sub", "sub", P0, 2, {NZ(1, 2, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"mul", "mul", P0, 2, {NZ(1, 2, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"div", "div", P0, 2, {NZ(1, 2, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"badd", "badd", P0, 2, {NZ(1, 3, 3, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"bsub", "bsub", P0, 2, {NZ(1, 3, 3, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"bmul", "bmul", P0, 2, {NZ(1, 3, 3, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"bdiv", "bdiv", P0, 2, {NZ(1, 3, 3, 5, 7), NZ(1, 2, 5, 7)}, NULL, 0, 0},
    {"squash", "squash", P0, 1, {NZ(0.5, 3, 3, 5, 7)}, NULL, 0, 0},
    {"embedding", "embedding", P0, 2, {NZ(1, 2, 11, 6), IDX(11, 2, 3, 5)}, NULL, 0, 0},
    {"embedding repeats", "embedding", P0, 2, {NZ(1, 2, 5, 3), IDX(5, 1, 13)}, NULL, 1, 0},
};

/* The six workloads of examples/workloads.nf at small shapes. */
static const libcase workload_cases[] = {
    {"matmul_loss", "matmul_loss", P0, 3, {NZ(1, 2, 3, 5), NZ(1, 2, 5, 4), NZ(1, 2, 3, 4)},
     NULL, 1, 0},
    {"conv2d_relu_loss", "conv2d_relu_loss", P0, 2,
     {NZ(1, 4, 2, 3, 5, 6), NZ(1, 4, 4, 3, 3, 3)}, NULL, 0, 0},
    {"lltm_loss", "lltm_loss", P0, 5,
     {NZ(1, 3, 8, 2, 3), NZ(0.5, 2, 2, 4), NZ(0.5, 2, 2, 4), NZ(0.5, 2, 12, 7),
      NZ(0.5, 1, 12)},
     NULL, 0, 0},
    {"milstm_loss", "milstm_loss", P0, 9,
     {NZ(1, 3, 8, 2, 3), NZ(0.5, 2, 2, 5), NZ(0.5, 2, 2, 5), NZ(0.5, 2, 20, 3),
      NZ(0.5, 2, 20, 5), NZ(1, 1, 20), NZ(1, 1, 20), NZ(1, 1, 20), NZ(0.5, 1, 20)},
     NULL, 0, 0},
    {"capsnet_loss", "capsnet_loss", P0, 3,
     {NZ(1, 3, 2, 5, 3), NZ(0.5, 4, 5, 3, 4, 3), ONEHOT(2, 2, 3)}, NULL, 0, 0},
    {"mobilenet_dws_loss", "mobilenet_dws_loss", P0, 3,
     {NZ(3, 4, 2, 3, 5, 6), NZ(1, 4, 3, 1, 3, 3), NZ(1, 4, 4, 3, 1, 1)}, NULL, 0, 0},
};

#endif
