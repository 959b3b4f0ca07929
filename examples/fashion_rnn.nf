# Recurrent cells reading each Fashion-MNIST image row by row: 28 steps of
# 28 pixels, from zero states; a linear classifier on the last hidden
# state gives the `logits`; the loss is the cross entropy.
#
#   neoflow train examples/fashion_rnn.nf lltm --data fashion-mnist --epochs 1
#   neoflow train examples/fashion_rnn.nf milstm --data fashion-mnist --epochs 1
import nn

# The LLTM cell (PyTorch's C++-extension tutorial): one linear layer on
# [x, h] split in three chunks of S: input gate (sigmoid), output gate
# (sigmoid), candidate (ELU); c' = c + candidate * input gate,
# h' = tanh(c') * output gate.
def lltm_cell(X: f32[B, I], H: f32[B, S], C: f32[B, S], W: f32[G, J], b: f32[G])
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

def lltm<batch = 64, state = 128>(X: f32[batch, 28, 28], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param W: f32[3 * state, 28 + state] = kaiming_uniform(2.236068)
  param b: f32[3 * state] = zeros
  param Wo: f32[10, state] = xavier_uniform
  param bo: f32[10] = zeros
  H[0](n, s) = 0.0 where n in 0:batch, s in 0:state
  C[0](n, s) = 0.0 where n in 0:batch, s in 0:state
  for t in 0:28 {
    Xt[t](n, i) = X(n, t, i)
    H[t + 1], C[t + 1] = lltm_cell(Xt[t], H[t], C[t], W, b)
  }
  logits = linear(H[28], Wo, bo)
  L = cross_entropy(logits, labels)
}

# The multiplicative-integration LSTM (Wu et al., 2016):
#   pre = alpha * (W x) * (U h) + beta1 * (W x) + beta2 * (U h) + b
# with W x for all 28 rows as one product; the chunks of D of pre are the
# gates i, f, o (sigmoid) and g (tanh); c' = f c + i g, h' = o tanh(c').
def milstm<batch = 64, hidden = 128>(X: f32[batch, 28, 28], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param W: f32[4 * hidden, 28] = kaiming_uniform(2.236068)
  param U: f32[4 * hidden, hidden] = kaiming_uniform(2.236068)
  param alpha: f32[4 * hidden] = ones
  param beta1: f32[4 * hidden] = ones
  param beta2: f32[4 * hidden] = ones
  param b: f32[4 * hidden] = zeros
  param Wo: f32[10, hidden] = xavier_uniform
  param bo: f32[10] = zeros
  Wx(t, n, g) +=! X(n, t, i) * W(g, i)
  H[0](n, d) = 0.0 where n in 0:batch, d in 0:hidden
  C[0](n, d) = 0.0 where n in 0:batch, d in 0:hidden
  for t in 0:28 {
    Uh[t](n, g) +=! H[t](n, d) * U(g, d)
    pre[t](n, g) = alpha(g) * Wx(t, n, g) * Uh[t](n, g) + beta1(g) * Wx(t, n, g) +
                   beta2(g) * Uh[t](n, g) + b(g)
    C[t + 1](n, d) = sigmoid(pre[t](n, hidden + d)) * C[t](n, d) +
                     sigmoid(pre[t](n, d)) * tanh(pre[t](n, 3 * hidden + d)) where d in 0:hidden
    H[t + 1](n, d) = sigmoid(pre[t](n, 2 * hidden + d)) * tanh(C[t + 1](n, d))
  }
  logits = linear(H[28], Wo, bo)
  L = cross_entropy(logits, labels)
}
