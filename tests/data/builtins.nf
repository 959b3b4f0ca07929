# builtins.nf - the built-in operators of tensor expressions
# (docs/language.md, "Built-in operators") in defs, for the tests that
# instantiate defs by name: tests/test_nn.c and the PyTorch and NumPy
# checks (torch_check.py, numpy_check.py: values and gradients against
# PyTorch's).  First the library defs these operators replaced, with the
# same signatures; then one def per operator and its forms.
import nn

# Row-major reshape of a matrix to [r0, r1].
def reshape2<r0, r1>(X: f32[M, N]) -> (Y: f32[r0, r1]) {
  Y = reshape(X, r0, r1)
}

# NCHW to [N, C * H * W] (torch.flatten(X, 1)).
def flatten_nchw(X: f32[N, C, H, W]) -> (Y: f32[N, C * H * W]) {
  Y = flatten(X)
}

# The last two axes swapped.
def transpose_last(X: f32[*B, M, N]) -> (Y: f32[*B, N, M]) {
  Y = transpose(X)
}

# torch.permute(X, (p0, p1, p2, p3)) of a rank-4 tensor.
def permute4<p0, p1, p2, p3>(X: f32[D0, D1, D2, D3]) -> (Y: f32[E0, E1, E2, E3])
    where E0 = p0 == 0 ? D0 : p0 == 1 ? D1 : p0 == 2 ? D2 : D3,
          E1 = p1 == 0 ? D0 : p1 == 1 ? D1 : p1 == 2 ? D2 : D3,
          E2 = p2 == 0 ? D0 : p2 == 1 ? D1 : p2 == 2 ? D2 : D3,
          E3 = p3 == 0 ? D0 : p3 == 1 ? D1 : p3 == 2 ? D2 : D3
{
  Y = permute(X, p0, p1, p2, p3)
}

# ---- the operators and their forms ----

def mv(A: f32[M, K], x: f32[K]) -> (y: f32[M]) {
  y(i) +=! A(i, k) * x(k)
}

# reshape with an inferred size, flatten of a middle range and of all
def bi_reshape(X: f32[A, B, C]) -> (Y: f32[B, A * C], F: f32[A, B * C], G: f32[A * B * C]) {
  Y = reshape(X, B, -1)
  F = flatten(X)
  G = flatten(X * 2.0, 0)
}

def bi_flatten(X: f32[A, B, C, D]) -> (Y: f32[A, B * C, D]) {
  Y = flatten(X, 1, 2)
}

def bi_transpose(X: f32[A, B, C]) -> (Y: f32[C, B, A], Z: f32[A, C, B]) {
  Y = transpose(X, 0, -1)
  Z = transpose(X)
}

def bi_permute(X: f32[A, B, C, D, E]) -> (Y: f32[C, E, A, D, B]) {
  Y = permute(X, 2, 4, 0, 3, 1)
}

def bi_reduce(X: f32[A, B, C]) -> (S: f32[B], M: f32[A, 1, C], L: f32[], Mx: f32[A, C],
                                   Mn: f32[B, C], Q: f32[]) {
  S = sum(X, 0, -1)
  M = mean<keepdim = 1>(X, 1)
  L = sum(X)
  Mx = amax(X, 1)
  Mn = amin(X * X, 0)
  Q = mean(X * X)
}

def bi_cat(A: f32[N, P], B: f32[N, Q], C: f32[N, P]) -> (Y: f32[N, 2 * P + Q],
                                                        Z: f32[3, N, P], W: f32[N, 2, P]) {
  Y = cat<axis = 1>(A, B, C)
  Z = stack(A, C * 2.0, A + C)
  W = stack<axis = 1>(A, C)
}

def bi_chunk(X: f32[N, M]) -> (A: f32[N, M // 3], B: f32[N, M // 3], C: f32[N, M // 3]) {
  A, B, C = chunk<axis = -1>(X)
}

def bi_unbind(X: f32[2, M]) -> (R0: f32[M], R1: f32[M]) {
  R0, R1 = unbind(X)
}

def bi_where(X: f32[N, M], Y: f32[M]) -> (Z: f32[N, M], C: f32[N, M]) {
  Z = where(X > Y, X * Y, 0.5 * X - Y)
  C = clamp(X, -0.5, 0.75)
}

# A recurrence over the rows of X (unstacked as X[t]), its states stacked.
def bi_rnn<T = 4>(X: f32[T, N], H0: f32[N], W: f32[N, N], U: f32[N, N], b: f32[N])
    -> (Hs: f32[T, N], L: f32[]) {
  H[0] = H0
  for t in 0:T {
    H[t + 1] = tanh(mv(W, X[t]) + mv(U, H[t]) + b)
  }
  Hs = stack(H[1:T + 1])
  L = mean(Hs * Hs)
}

# NumPy broadcasting: a column and a row against a batch of matrices.
def bi_broadcast(X: f32[B, N, M], c: f32[N, 1], r: f32[M]) -> (Y: f32[B, N, M]) {
  Y = sigmoid(X * c + r) - exp(-X) / 2.0
}

def bi_nested(X: f32[N, I], W: f32[O, I], b: f32[O]) -> (Y: f32[N, O]) {
  Y = sigmoid(linear(X, W, b)) * 2.0 - 1.0
}
