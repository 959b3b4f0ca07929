# A small LeNet-style convolutional network for 1 x 28 x 28 images in 10
# classes: two 5 x 5 convolutions with bias, ReLU and 2 x 2 max pooling,
# then a linear classifier.
#
#   neoflow train examples/cnn.nf cnn --data synthetic --steps 100 --batch 16
import nn

def cnn<batch = 16>(X: f32[batch, 1, 28, 28], labels: i64[batch]) -> (L: f32[]) {
  param K1: f32[6, 1, 5, 5] = kaiming_uniform
  param k1: f32[6] = zeros
  param K2: f32[12, 6, 5, 5] = kaiming_uniform
  param k2: f32[12] = zeros
  param W: f32[10, 192] = xavier_uniform
  param b: f32[10] = zeros
  C1 = conv2d(X, K1)                            # [batch, 6, 24, 24]
  B1(n, c, h, w) = C1(n, c, h, w) + k1(c)
  R1 = relu(B1)
  P1 = max_pool2d<kernel = 2>(R1)               # [batch, 6, 12, 12]
  C2 = conv2d(P1, K2)                           # [batch, 12, 8, 8]
  B2(n, c, h, w) = C2(n, c, h, w) + k2(c)
  R2 = relu(B2)
  P2 = max_pool2d<kernel = 2>(R2)               # [batch, 12, 4, 4]
  F = flatten(P2)                               # [batch, 192]
  logits = linear(F, W, b)
  L = cross_entropy(logits, labels)
}
