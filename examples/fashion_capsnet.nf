# A capsule network with dynamic routing (Sabour et al., 2017) for
# Fashion-MNIST, scaled for a CPU: a 9 x 9 convolution (16 channels, ReLU),
# primary capsules from a 9 x 9 convolution of stride 2 (4 types of 8-D
# capsules on a 6 x 6 grid: 144 capsules), routed by agreement (3
# iterations, the gradient flowing through all of them) to 10 class
# capsules of 16 dimensions.  The class capsules' lengths are the
# `logits` (the predicted class is the longest); the loss is the margin
# loss against the one-hot labels.
#
#   neoflow train examples/fashion_capsnet.nf capsnet --data fashion-mnist --epochs 1
import nn

# One routing pass: c = softmax_j(blog), s_j = sum_i c_ij uhat_j|i,
# v_j = squash(s_j).
def route(blog: f32[B, NI, J], uhat: f32[B, J, NI, D]) -> (V: f32[B, J, D]) {
  c = softmax(blog)
  s(b, j, d) +=! c(b, i, j) * uhat(b, j, i, d)
  V = squash(s)
}

def capsnet<batch = 32>(X: f32[batch, 1, 28, 28], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param K1: f32[16, 1, 9, 9] = kaiming_uniform
  param k1: f32[16] = zeros
  param K2: f32[32, 16, 9, 9] = kaiming_uniform
  param k2: f32[32] = zeros
  param W: f32[144, 10, 16, 8] = normal(0.0, 0.05)
  C1 = conv2d(X, K1)                                  # [batch, 16, 20, 20]
  B1(n, c, h, w) = C1(n, c, h, w) + k1(c)
  R1 = relu(B1)
  C2 = conv2d<stride = 2>(R1, K2)                     # [batch, 32, 6, 6]
  # capsule i = (type t, row p, column q) = (i // 36, (i % 36) // 6, i % 6);
  # its 8 components are the channels t * 8 + e
  u(n, i, e) = C2(n, (i // 36) * 8 + e, (i % 36) // 6, i % 6) + k2((i // 36) * 8 + e)
      where i in 0:144, e in 0:8
  us = squash(u)
  uhat(n, j, i, d) +=! W(i, j, d, e) * us(n, i, e)
  blog[0](n, i, j) = 0.0 where n in 0:batch, i in 0:144, j in 0:10
  for it in 0:2 {
    v[it] = route(blog[it], uhat)
    agree[it](n, i, j) +=! uhat(n, j, i, d) * v[it](n, j, d)
    blog[it + 1](n, i, j) = blog[it](n, i, j) + agree[it](n, i, j)
  }
  V = route(blog[2], uhat)
  N2(n, j) +=! V(n, j, d) * V(n, j, d)
  logits(n, j) = sqrt(N2(n, j) + 1e-12)
  T(n, j) = labels(n) == j ? 1.0 : 0.0 where j in 0:10
  L = margin_loss(logits, T)
}
