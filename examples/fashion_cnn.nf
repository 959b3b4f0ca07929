# A LeNet-style convolutional network for Fashion-MNIST (1 x 28 x 28
# images, 10 classes): two 5 x 5 convolutions with bias, ReLU and 2 x 2
# max pooling, then two linear layers.  The first output is the training
# loss; `logits` after it is computed by every step (and by evaluation)
# outside the gradient, which `neoflow train --data fashion-mnist` uses for
# the accuracy.
#
#   neoflow train examples/fashion_cnn.nf cnn --data fashion-mnist --epochs 3
import nn

def cnn<batch = 64>(X: f32[batch, 1, 28, 28], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param K1: f32[16, 1, 5, 5] = kaiming_uniform
  param k1: f32[16] = zeros
  param K2: f32[32, 16, 5, 5] = kaiming_uniform
  param k2: f32[32] = zeros
  param W1: f32[128, 512] = kaiming_uniform
  param b1: f32[128] = zeros
  param W2: f32[10, 128] = xavier_uniform
  param b2: f32[10] = zeros
  C1 = conv2d(X, K1)                            # [batch, 16, 24, 24]
  B1(n, c, h, w) = C1(n, c, h, w) + k1(c)
  R1 = relu(B1)
  P1 = max_pool2d<kernel = 2>(R1)               # [batch, 16, 12, 12]
  C2 = conv2d(P1, K2)                           # [batch, 32, 8, 8]
  B2(n, c, h, w) = C2(n, c, h, w) + k2(c)
  R2 = relu(B2)
  P2 = max_pool2d<kernel = 2>(R2)               # [batch, 32, 4, 4]
  F = flatten(P2)                               # [batch, 512]
  Z = linear(F, W1, b1)
  H = relu(Z)                                   # [batch, 128]
  logits = linear(H, W2, b2)
  L = cross_entropy(logits, labels)
}
