# A multi-layer perceptron for Fashion-MNIST: 784 -> hidden -> hidden -> 10
# with ReLU.  The first output is the training loss; `logits` after it is
# computed outside the gradient for the accuracy.
#
#   neoflow train examples/fashion_mlp.nf mlp --data fashion-mnist --epochs 3
import nn

def mlp<batch = 64, hidden = 256>(X: f32[batch, 784], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param W1: f32[hidden, 784] = kaiming_uniform
  param b1: f32[hidden] = zeros
  param W2: f32[hidden, hidden] = kaiming_uniform
  param b2: f32[hidden] = zeros
  param W3: f32[10, hidden] = xavier_uniform
  param b3: f32[10] = zeros
  H1 = linear(X, W1, b1)
  A1 = relu(H1)
  H2 = linear(A1, W2, b2)
  A2 = relu(H2)
  logits = linear(A2, W3, b3)
  L = cross_entropy(logits, labels)
}
