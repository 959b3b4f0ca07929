# nn.nf - the NeoFlow standard library of neural-network operators.
#
# Every def follows PyTorch's semantics for the same operator (the comment
# above each def says where it departs or what it fixes).  Layout is
# PyTorch's: NCHW images, weights [out, in], reductions over the last axis.
# Parameters are integers; floating-point constants (eps, thresholds,
# margins) are fixed and named in the comment above their def.  Float
# literals are weak, so in an f32 def they are f32 constants, as in an f32
# PyTorch kernel.  Pack arguments (`*B`) make defs rank-generic: any number
# of leading dimensions, including none.

# ---- products ----

# Matrix product: C(i, j) = sum over k of A(i, k) * B(k, j).
def matmul(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {
  C(i, j) +=! A(i, k) * B(k, j)
}

# Batched matrix product over any leading batch dims (torch.matmul with
# equal batch shapes, no broadcasting).
def batch_matmul(A: f32[*Bt, M, K], B: f32[*Bt, K, N]) -> (C: f32[*Bt, M, N]) {
  C(*b, i, j) +=! A(*b, i, k) * B(*b, k, j)
}

# Linear layer without bias, Y = X W^T over the last axis
# (torch.nn.functional.linear(X, W), nn.Linear(..., bias=False)).
def linear_nobias(X: f32[*B, I], W: f32[O, I]) -> (Y: f32[*B, O]) {
  Y(*n, o) +=! X(*n, i) * W(o, i)
}

# Affine layer Y = X W^T + b over the last axis (torch.nn.functional.linear:
# W is out x in).
def linear(X: f32[*B, I], W: f32[O, I], b: f32[O]) -> (Y: f32[*B, O]) {
  XW(*n, o) +=! X(*n, i) * W(o, i)
  Y(*n, o) = XW(*n, o) + b(o)
}

# ---- convolution and pooling ----

# 2-D cross-correlation (torch.nn.functional.conv2d without bias): NCHW
# input, weight [K, C / groups, R, S], zero padding, output
# OH = (H + 2 pad - dilation (R - 1) - 1) // stride + 1 (likewise OW).
# Output channel k is in group k // (K / groups) and reads that group's
# input channels group * CG + c.  (The input width is called Wd because W
# names the weight; `max(stride, 1)` keeps the sizes defined so that a zero
# stride is reported by its require.)
def conv2d<stride = 1, pad = 0, dilation = 1, groups = 1>(
    I: f32[N, C, H, Wd], W: f32[K, CG, R, S]) -> (O: f32[N, K, OH, OW])
    where OH = (H + 2 * pad - dilation * (R - 1) - 1) // max(stride, 1) + 1,
          OW = (Wd + 2 * pad - dilation * (S - 1) - 1) // max(stride, 1) + 1
    require groups > 0, C == CG * groups, K % groups == 0, stride > 0,
            dilation > 0, pad >= 0, OH > 0, OW > 0
{
  O(n, k, h, w) +=! (h * stride + r * dilation - pad >= 0 &&
                     h * stride + r * dilation - pad < H &&
                     w * stride + s * dilation - pad >= 0 &&
                     w * stride + s * dilation - pad < Wd) ?
    I(n, (k // (K // groups)) * CG + c, h * stride + r * dilation - pad,
      w * stride + s * dilation - pad) * W(k, c, r, s) : 0.0
}

# 2-D max pooling (torch.nn.functional.max_pool2d, floor mode, no
# dilation): padding acts as -inf.  Since pad <= kernel / 2 every window
# holds at least one real element, so padded cells yield the lowest finite
# f32 (-3.4028234663852886e38) and never win.
def max_pool2d<kernel, stride = kernel, pad = 0>(
    X: f32[N, C, H, W]) -> (Y: f32[N, C, OH, OW])
    where OH = (H + 2 * pad - kernel) // max(stride, 1) + 1,
          OW = (W + 2 * pad - kernel) // max(stride, 1) + 1
    require kernel > 0, stride > 0, pad >= 0, 2 * pad <= kernel, OH > 0, OW > 0
{
  Y(n, c, h, w) max=! (h * stride + kh - pad >= 0 && h * stride + kh - pad < H &&
                       w * stride + kw - pad >= 0 && w * stride + kw - pad < W) ?
    X(n, c, h * stride + kh - pad, w * stride + kw - pad) :
    -3.4028234663852886e38 where kh in 0:kernel, kw in 0:kernel
}

# 2-D average pooling (torch.nn.functional.avg_pool2d, floor mode,
# count_include_pad=True): the window sum over zero padding divided by
# kernel * kernel.
def avg_pool2d<kernel, stride = kernel, pad = 0>(
    X: f32[N, C, H, W]) -> (Y: f32[N, C, OH, OW])
    where OH = (H + 2 * pad - kernel) // max(stride, 1) + 1,
          OW = (W + 2 * pad - kernel) // max(stride, 1) + 1
    require kernel > 0, stride > 0, pad >= 0, 2 * pad <= kernel, OH > 0, OW > 0
{
  Sum(n, c, h, w) +=! (h * stride + kh - pad >= 0 && h * stride + kh - pad < H &&
                       w * stride + kw - pad >= 0 && w * stride + kw - pad < W) ?
    X(n, c, h * stride + kh - pad, w * stride + kw - pad) :
    0.0 where h in 0:OH, w in 0:OW, kh in 0:kernel, kw in 0:kernel
  Y(n, c, h, w) = Sum(n, c, h, w) / f32(kernel * kernel)
}

# ---- elementwise activations ----

# max(x, 0).
def relu(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = max(X(*i), 0.0)
}

# min(max(x, 0), 6).
def relu6(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = min(max(X(*i), 0.0), 6.0)
}

# ELU with alpha 1: x for x > 0, exp(x) - 1 otherwise.
def elu(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = X(*i) > 0.0 ? X(*i) : exp(X(*i)) - 1.0
}

# Exact GELU: 0.5 x (1 + erf(x / sqrt 2)); the constant is
# 1/sqrt 2 = 0.7071067811865476 (as f32, like PyTorch's f32 kernel).
def gelu(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = 0.5 * X(*i) * (1.0 + erf(X(*i) * 0.7071067811865476))
}

# Logistic function 1 / (1 + exp(-x)).
def sigmoid(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = sigmoid(X(*i))
}

# Hyperbolic tangent.
def tanh(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = tanh(X(*i))
}

# SiLU (swish), x sigmoid(x) (torch.nn.functional.silu).
def silu(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = X(*i) * sigmoid(X(*i))
}

# exp(x) - 1, accurate near 0 (torch.expm1): for |x| < 0.5 it is
# 2 t / (1 - t) with t = tanh(x / 2), free of the cancellation in
# exp(x) - 1; elsewhere exp(x) - 1.
def expm1(X: f32[*S]) -> (Y: f32[*S]) {
  T(*i) = tanh(X(*i) * 0.5)
  Y(*i) = abs(X(*i)) < 0.5 ? 2.0 * T(*i) / (1.0 - T(*i)) : exp(X(*i)) - 1.0
}

# log(1 + x), accurate near 0 (torch.log1p): for |x| < 0.5, with
# u = x / (2 + x) (|u| < 1/3), the series 2 (u + u^3/3 + ... + u^13/13),
# whose first omitted term is below 2e-8 of the sum; elsewhere log(1 + x).
def log1p(X: f32[*S]) -> (Y: f32[*S]) {
  U(*i) = abs(X(*i)) < 0.5 ? X(*i) / (2.0 + X(*i)) : 0.0
  Y(*i) = abs(X(*i)) < 0.5 ?
    2.0 * U(*i) * (1.0 + U(*i) * U(*i) * (1.0 / 3.0 + U(*i) * U(*i) * (0.2 +
      U(*i) * U(*i) * (1.0 / 7.0 + U(*i) * U(*i) * (1.0 / 9.0 + U(*i) * U(*i) *
      (1.0 / 11.0 + U(*i) * U(*i) / 13.0)))))) :
    log(1.0 + X(*i))
}

# Softplus with beta 1 and threshold 20: log(1 + exp(x)), or x where
# x > 20.
def softplus(X: f32[*S]) -> (Y: f32[*S]) {
  Y(*i) = X(*i) > 20.0 ? X(*i) : log(1.0 + exp(X(*i)))
}

# ---- normalised exponentials and losses ----

# Softmax over the last axis, exp(x - max) / sum exp(x - max).  The shift
# by the max cancels mathematically, so it is under stop_gradient: the
# gradient is the exact softmax Jacobian, with no argmax pass.
def softmax(X: f32[*B, N]) -> (Y: f32[*B, N]) {
  Mx(*b) max=! X(*b, j)
  E(*b, j) = exp(X(*b, j) - stop_gradient(Mx(*b)))
  Z(*b) +=! E(*b, j)
  Y(*b, j) = E(*b, j) / Z(*b)
}

# Log-softmax over the last axis, x - max - log sum exp(x - max) (the max
# shift under stop_gradient, as in softmax).
def log_softmax(X: f32[*B, N]) -> (Y: f32[*B, N]) {
  Mx(*b) max=! X(*b, j)
  Z(*b) +=! exp(X(*b, j) - stop_gradient(Mx(*b)))
  Y(*b, j) = X(*b, j) - stop_gradient(Mx(*b)) - log(Z(*b))
}

# Cross-entropy of logits [N, C] against class indices [N] in 0:C, mean
# over the batch (torch.nn.functional.cross_entropy, reduction 'mean', no
# weights), with a stable log-sum-exp (max shift under stop_gradient).
def cross_entropy(logits: f32[N, C], labels: i64[N]) -> (L: f32[]) {
  Mx(n) max=! logits(n, c)
  Z(n) +=! exp(logits(n, c) - stop_gradient(Mx(n)))
  Sum() +=! stop_gradient(Mx(n)) + log(Z(n)) - logits(n, labels(n))
  L() = Sum() / f32(N)
}

# Capsule margin loss (Sabour et al.) with m+ 0.9, m- 0.1, lambda 0.5:
# T max(0, 0.9 - |v|)^2 + 0.5 (1 - T) max(0, |v| - 0.1)^2, summed over the
# capsules J and averaged over the batch N.
def margin_loss(lengths: f32[N, J], targets: f32[N, J]) -> (L: f32[]) {
  Pos(n, j) = max(0.9 - lengths(n, j), 0.0)
  Neg(n, j) = max(lengths(n, j) - 0.1, 0.0)
  Sum() +=! targets(n, j) * Pos(n, j) * Pos(n, j) +
            0.5 * (1.0 - targets(n, j)) * Neg(n, j) * Neg(n, j)
  L() = Sum() / f32(N)
}

# Mean squared error over all elements (torch.nn.functional.mse_loss,
# reduction 'mean'); prod(*S) is the number of elements.
def mse(X: f32[*S], Y: f32[*S]) -> (L: f32[]) {
  D(*i) = X(*i) - Y(*i)
  Sum() +=! D(*i) * D(*i)
  L() = Sum() / f32(prod(*S))
}

# ---- normalisation ----

# Layer normalisation over the last axis with eps 1e-5 and the biased
# variance, then the elementwise affine gamma, beta.
def layer_norm(X: f32[*B, D], gamma: f32[D], beta: f32[D]) -> (Y: f32[*B, D]) {
  Sum(*b) +=! X(*b, d)
  Mu(*b) = Sum(*b) / f32(D)
  Xc(*b, d) = X(*b, d) - Mu(*b)
  Sq(*b) +=! Xc(*b, d) * Xc(*b, d)
  R(*b) = rsqrt(Sq(*b) / f32(D) + 1e-5)
  Y(*b, d) = Xc(*b, d) * R(*b) * gamma(d) + beta(d)
}

# Batch normalisation of NCHW in training mode: per-channel batch mean and
# biased variance over N, H, W, eps 1e-5, then gamma, beta (running
# statistics are not kept).
def batch_norm(X: f32[N, C, H, W], gamma: f32[C], beta: f32[C]) -> (Y: f32[N, C, H, W]) {
  Sum(c) +=! X(n, c, h, w)
  Mu(c) = Sum(c) / f32(N * H * W)
  Xc(n, c, h, w) = X(n, c, h, w) - Mu(c)
  Sq(c) +=! Xc(n, c, h, w) * Xc(n, c, h, w)
  R(c) = rsqrt(Sq(c) / f32(N * H * W) + 1e-5)
  Y(n, c, h, w) = Xc(n, c, h, w) * R(c) * gamma(c) + beta(c)
}

# ---- shape manipulation ----

# Concatenation along the last axis (torch.cat(dim=-1)).
def concat(A: f32[*B, M], C: f32[*B, N]) -> (Y: f32[*B, M + N]) {
  Y(*b, j) = j < M ? A(*b, j) : C(*b, j - M)
}

# Split of the last axis at `at` into [0, at) and [at, N)
# (torch.split(X, [at, N - at], dim=-1)).
def split<at>(X: f32[*B, N]) -> (Y1: f32[*B, at], Y2: f32[*B, N - at])
    require at > 0, at < N
{
  Y1(*b, j) = X(*b, j)
  Y2(*b, j) = X(*b, j + at)
}

# Reshaping, flattening, transposing and permuting any rank, reductions
# over chosen axes, cat, stack, chunk and unbind along any axis are
# built-in operators of the language (docs/language.md, "Built-in
# operators"): reshape(X, 2, -1), flatten(X), transpose(X, 0, 1),
# permute(X, 2, 0, 1), sum(X, -1), mean<keepdim = 1>(X, 1), cat<axis = 1>(A,
# B), stack(H[1:T + 1]), A, B = chunk<axis = -1>(X).

# ShuffleNet channel shuffle of NCHW: output channel c takes input channel
# (c % groups) * (C // groups) + c // groups.
def channel_shuffle<groups>(X: f32[N, C, H, W]) -> (Y: f32[N, C, H, W])
    require groups > 0, C % groups == 0
{
  Y(n, c, h, w) = X(n, (c % groups) * (C // groups) + c // groups, h, w)
}

# ---- elementwise arithmetic ----

# X + Y for equal shapes.
def add(X: f32[*S], Y: f32[*S]) -> (Z: f32[*S]) {
  Z(*i) = X(*i) + Y(*i)
}

# X - Y for equal shapes.
def sub(X: f32[*S], Y: f32[*S]) -> (Z: f32[*S]) {
  Z(*i) = X(*i) - Y(*i)
}

# X * Y for equal shapes.
def mul(X: f32[*S], Y: f32[*S]) -> (Z: f32[*S]) {
  Z(*i) = X(*i) * Y(*i)
}

# X / Y (true division) for equal shapes.
def div(X: f32[*S], Y: f32[*S]) -> (Z: f32[*S]) {
  Z(*i) = X(*i) / Y(*i)
}

# X + Y with Y broadcast over the leading dims *B of X.
def badd(X: f32[*B, *S], Y: f32[*S]) -> (Z: f32[*B, *S]) {
  Z(*b, *i) = X(*b, *i) + Y(*i)
}

# X - Y with Y broadcast over the leading dims *B of X.
def bsub(X: f32[*B, *S], Y: f32[*S]) -> (Z: f32[*B, *S]) {
  Z(*b, *i) = X(*b, *i) - Y(*i)
}

# X * Y with Y broadcast over the leading dims *B of X.
def bmul(X: f32[*B, *S], Y: f32[*S]) -> (Z: f32[*B, *S]) {
  Z(*b, *i) = X(*b, *i) * Y(*i)
}

# X / Y with Y broadcast over the leading dims *B of X.
def bdiv(X: f32[*B, *S], Y: f32[*S]) -> (Z: f32[*B, *S]) {
  Z(*b, *i) = X(*b, *i) / Y(*i)
}

# ---- capsules and lookups ----

# Capsule squash over the last axis with eps 1e-8:
# (|s|^2 / (1 + |s|^2)) s / sqrt(|s|^2 + 1e-8).
def squash(S: f32[*B, D]) -> (V: f32[*B, D]) {
  N2(*b) +=! S(*b, d) * S(*b, d)
  F(*b) = N2(*b) / (1.0 + N2(*b)) / sqrt(N2(*b) + 1e-8)
  V(*b, d) = F(*b) * S(*b, d)
}

# Row lookup (torch.nn.functional.embedding): Y(*b, :) = table(idx(*b), :);
# every index must lie in 0:V (checked when the op runs).
def embedding(table: f32[V, D], idx: i64[*B]) -> (Y: f32[*B, D]) {
  Y(*b, d) = table(idx(*b), d)
}
