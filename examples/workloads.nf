# The six public benchmark workloads (docs: WORKLOADS.md), each written as
# one def from the data and the parameters to the scalar training loss, so
# that `neoflow grad` (or nf_grad) yields every parameter gradient.  Sizes
# are symbolic: the benchmark shapes are one use, the tests use small ones,
# e.g.
#
#   neoflow eval examples/workloads.nf lltm_loss --shape X=8,2,3 \
#       --shape H0=2,4 --shape C0=2,4 --shape W=12,7 --shape b=12
#
# Where a workload fixes a number of steps (lltm, milstm: 8; capsnet: 3
# routing iterations) the def fixes it too, with a require on the input.
import nn

# matmul: C = A B; loss sum(C * G) with a fixed random G.  A and B are the
# parameters (1024 x 1024 each in the benchmark).
def matmul_loss(A: f32[M, K], B: f32[K, N], G: f32[M, N]) -> (L: f32[]) {
  C = matmul(A, B)
  L() +=! C(i, j) * G(i, j)
}

# conv2d: 3x3 convolution, pad 1, stride 1, no bias, then ReLU; loss
# mean(y^2).  Wt is the parameter (benchmark: N 8, C 64, H = W 56, K 64).
def conv2d_relu_loss(I: f32[N, C, H, Wd], Wt: f32[K, C, 3, 3]) -> (L: f32[]) {
  O = conv2d<pad = 1>(I, Wt)
  Y = relu(O)
  Sum() +=! Y(n, k, h, w) * Y(n, k, h, w)
  L() = Sum() / f32(N * K * H * Wd)
}

# One LLTM step (PyTorch's C++-extension tutorial): one linear layer on the
# concatenation [x, h]; its output splits in three chunks of S: the input
# gate (sigmoid), the output gate (sigmoid) and the candidate cell (ELU);
# c' = c + candidate * input gate, h' = tanh(c') * output gate.
def lltm_step(X: f32[B, I], H: f32[B, S], C: f32[B, S], W: f32[G, J], b: f32[G])
    -> (H2: f32[B, S], C2: f32[B, S])
    require G == 3 * S, J == I + S
{
  XH = concat(X, H)
  gates = linear(XH, W, b)
  ig(n, s) = sigmoid(gates(n, s)) where s in 0:S
  og(n, s) = sigmoid(gates(n, S + s)) where s in 0:S
  gc(n, s) = gates(n, 2 * S + s) where s in 0:S
  cand = elu(gc)
  C2(n, s) = C(n, s) + cand(n, s) * ig(n, s)
  H2(n, s) = tanh(C2(n, s)) * og(n, s)
}

# lltm: 8 LLTM steps over X[t] (T must be 8), from the states H0, C0;
# loss sum(h_T) + sum(c_T).  W [3S, I + S] and b [3S] are the parameters
# (benchmark: batch 64, input 256, state 512, W 1536 x 768).
def lltm_loss(X: f32[T, B, I], H0: f32[B, S], C0: f32[B, S], W: f32[G, J],
              b: f32[G]) -> (L: f32[])
    require T == 8
{
  H[0] = H0
  C[0] = C0
  for t in 0:8 {
    Xt[t](n, i) = X(t, n, i)
    H[t + 1], C[t + 1] = lltm_step(Xt[t], H[t], C[t], W, b)
  }
  L() +=! H[8](n, s) + C[8](n, s)
}

# milstm: the multiplicative-integration LSTM over 8 steps (T must be 8):
#   pre = alpha * (W x) * (U h) + beta1 * (W x) + beta2 * (U h) + b
# with Wx computed for all steps as one GEMM; the chunks of D of pre are
# the gates i, f, o (sigmoid) and g (tanh); c' = f c + i g, h' = o tanh(c').
# Loss: mean(h_t^2) over all steps t = 1..8, the batch and the hidden units.
# W [4D, I], U [4D, D] (no bias), alpha, beta1, beta2, b [4D] are the
# parameters (benchmark: batch 64, input 512, hidden 512).
def milstm_loss(X: f32[T, B, I], H0: f32[B, D], C0: f32[B, D], W: f32[G, I],
                U: f32[G, D], alpha: f32[G], beta1: f32[G], beta2: f32[G],
                b: f32[G]) -> (L: f32[])
    require T == 8, G == 4 * D
{
  Wx(t, n, g) +=! X(t, n, i) * W(g, i)
  H[0] = H0
  C[0] = C0
  Acc[0]() = 0.0
  for t in 0:8 {
    Uh[t](n, g) +=! H[t](n, d) * U(g, d)
    pre[t](n, g) = alpha(g) * Wx(t, n, g) * Uh[t](n, g) + beta1(g) * Wx(t, n, g) +
                   beta2(g) * Uh[t](n, g) + b(g)
    C[t + 1](n, d) = sigmoid(pre[t](n, D + d)) * C[t](n, d) +
                     sigmoid(pre[t](n, d)) * tanh(pre[t](n, 3 * D + d)) where d in 0:D
    H[t + 1](n, d) = sigmoid(pre[t](n, 2 * D + d)) * tanh(C[t + 1](n, d))
    Sq[t]() +=! H[t + 1](n, d) * H[t + 1](n, d)
    Acc[t + 1]() = Acc[t]() + Sq[t]()
  }
  L() = Acc[8]() / f32(8 * B * D)
}

# One routing pass of dynamic routing between capsules: coupling
# coefficients c = softmax over the output capsules j of the logits blog,
# s_j = sum over i of c_ij uhat_j|i, v_j = squash(s_j).
def capsule_route(blog: f32[B, NI, J], uhat: f32[B, J, NI, D]) -> (V: f32[B, J, D]) {
  c = softmax(blog)
  s(b, j, d) +=! c(b, i, j) * uhat(b, j, i, d)
  V = squash(s)
}

# capsnet: uhat(b, j, i, :) = W(i, j, :, :) . squash(u)(b, i, :); three
# routing iterations from blog = 0, with blog += uhat . v between them (the
# gradient flows through every iteration); margin loss (m+ 0.9, m- 0.1,
# lambda 0.5) of the lengths |v| against one-hot targets, mean over the
# batch.  W is the parameter (benchmark: batch 32, 1152 input capsules of
# 8, 10 output capsules of 16; W 1152 x 10 x 16 x 8).
def capsnet_loss(u: f32[B, NI, E], W: f32[NI, J, D, E], targets: f32[B, J])
    -> (L: f32[])
{
  us = squash(u)
  uhat(b, j, i, d) +=! W(i, j, d, e) * us(b, i, e)
  blog[0](b, i, j) = 0.0 where b in 0:B, i in 0:NI, j in 0:J
  for it in 0:2 {
    v[it] = capsule_route(blog[it], uhat)
    agree[it](b, i, j) +=! uhat(b, j, i, d) * v[it](b, j, d)
    blog[it + 1](b, i, j) = blog[it](b, i, j) + agree[it](b, i, j)
  }
  V = capsule_route(blog[2], uhat)
  N2(b, j) +=! V(b, j, d) * V(b, j, d)
  lengths(b, j) = sqrt(N2(b, j))
  L = margin_loss(lengths, targets)
}

# mobilenet_dws: a depthwise-separable block, depthwise 3x3 (pad 1,
# groups = channels) -> ReLU6 -> pointwise 1x1 -> ReLU6, no bias; loss
# mean(y^2).  Wdw [C, 1, 3, 3] and Wpw [K, C, 1, 1] are the parameters
# (benchmark: N 16, C 128, H = W 28, 128 out).
def mobilenet_dws_loss(X: f32[N, C, H, Wd], Wdw: f32[C, 1, 3, 3],
                       Wpw: f32[K, C, 1, 1]) -> (L: f32[])
{
  D = conv2d<pad = 1, groups = C>(X, Wdw)
  R = relu6(D)
  P = conv2d(R, Wpw)
  Y = relu6(P)
  Sum() +=! Y(n, k, h, w) * Y(n, k, h, w)
  L() = Sum() / f32(N * K * H * Wd)
}
