# Example models written in .nf on top of the standard library.  Their
# input shapes are constants, so `neoflow eval examples/models.nf DEF`
# runs them without --shape options.
import nn

# The LLTM cell of PyTorch's C++-extension tutorial: one linear layer on
# [x, h], then an input gate, an output gate and an ELU candidate.
def lltm_cell(X: f32[B, I], H: f32[B, S], C: f32[B, S], W: f32[G, J], b: f32[G])
    -> (H2: f32[B, S], C2: f32[B, S])
    require G == 3 * S, J == I + S
{
  XH = concat(X, H)
  gates = linear(XH, W, b)
  ig(n, s) = sigmoid(gates(n, s)) where s in 0:S
  og(n, s) = sigmoid(gates(n, S + s)) where s in 0:S
  cand(n, s) = gates(n, 2 * S + s) > 0.0 ? gates(n, 2 * S + s) :
               exp(gates(n, 2 * S + s)) - 1.0 where s in 0:S
  C2(n, s) = C(n, s) + cand(n, s) * ig(n, s)
  H2(n, s) = tanh(C2(n, s)) * og(n, s)
}

# Eight LLTM steps unrolled at compile time; loss sum(h_T) + sum(c_T).
def lltm_8(X: f32[8, 4, 16], H0: f32[4, 32], C0: f32[4, 32], W: f32[96, 48],
           b: f32[96]) -> (L: f32[])
{
  H[0] = H0
  C[0] = C0
  for t in 0:8 {
    Xt[t](n, i) = X(t, n, i)
    H[t + 1], C[t + 1] = lltm_cell(Xt[t], H[t], C[t], W, b)
  }
  L() +=! H[8](n, s) + C[8](n, s)
}

# Dynamic routing between capsules (3 iterations), gradients flow through
# every iteration once autodiff lands.
def capsule_routing(u: f32[4, 32, 8], W: f32[32, 10, 16, 8]) -> (V: f32[4, 10, 16]) {
  us = squash(u)
  uhat(b, j, i, d) +=! W(i, j, d, e) * us(b, i, e)
  blog[0](b, i, j) = 0.0 where b in 0:4, i in 0:32, j in 0:10
  for it in 0:3 {
    c[it] = softmax(blog[it])
    s[it](b, j, d) +=! c[it](b, i, j) * uhat(b, j, i, d)
    v[it] = squash(s[it])
    agree[it](b, i, j) +=! uhat(b, j, i, d) * v[it](b, j, d)
    blog[it + 1](b, i, j) = blog[it](b, i, j) + agree[it](b, i, j)
  }
  V = v[2]
}

# A MobileNet depthwise-separable block: depthwise 3x3 (groups = channels),
# ReLU6, pointwise 1x1, ReLU6.
def mobilenet_block(X: f32[2, 16, 14, 14], Wd: f32[16, 1, 3, 3], Wp: f32[32, 16, 1, 1])
    -> (Y: f32[2, 32, 14, 14])
{
  D = conv2d<pad = 1, groups = 16>(X, Wd)
  R = relu6(D)
  P = conv2d(R, Wp)
  Y = relu6(P)
}
