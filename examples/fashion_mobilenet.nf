# A small MobileNet for Fashion-MNIST: a 3 x 3 stem convolution of stride
# 2, then three depthwise-separable blocks (depthwise 3 x 3 -> ReLU6 ->
# pointwise 1 x 1 with bias -> ReLU6; the second block's depthwise
# convolution has stride 2), global average pooling and a linear
# classifier.  No batch normalisation.
#
#   neoflow train examples/fashion_mobilenet.nf mobilenet --data fashion-mnist --epochs 1
import nn

# A depthwise-separable block: depthwise 3 x 3 (pad 1, groups = channels)
# -> ReLU6 -> pointwise 1 x 1 (+ bias) -> ReLU6.
def dws<stride = 1>(X: f32[N, C, H, Wd], Wdw: f32[C, 1, 3, 3], Wpw: f32[K, C, 1, 1],
                    bpw: f32[K]) -> (Y: f32[N, K, (H - 1) // stride + 1, (Wd - 1) // stride + 1]) {
  D = conv2d<stride = stride, pad = 1, groups = C>(X, Wdw)
  R = relu6(D)
  P = conv2d(R, Wpw)
  Q(n, k, h, w) = P(n, k, h, w) + bpw(k)
  Y = relu6(Q)
}

def mobilenet<batch = 64>(X: f32[batch, 1, 28, 28], labels: i64[batch])
    -> (L: f32[], logits: f32[batch, 10]) {
  param K0: f32[32, 1, 3, 3] = kaiming_uniform
  param k0: f32[32] = zeros
  param D1: f32[32, 1, 3, 3] = kaiming_uniform
  param P1: f32[64, 32, 1, 1] = kaiming_uniform
  param p1: f32[64] = zeros
  param D2: f32[64, 1, 3, 3] = kaiming_uniform
  param P2: f32[128, 64, 1, 1] = kaiming_uniform
  param p2: f32[128] = zeros
  param D3: f32[128, 1, 3, 3] = kaiming_uniform
  param P3: f32[128, 128, 1, 1] = kaiming_uniform
  param p3: f32[128] = zeros
  param Wf: f32[10, 128] = xavier_uniform
  param bf: f32[10] = zeros
  S = conv2d<stride = 2, pad = 1>(X, K0)              # [batch, 32, 14, 14]
  S1(n, c, h, w) = S(n, c, h, w) + k0(c)
  A0 = relu6(S1)
  A1 = dws(A0, D1, P1, p1)                            # [batch, 64, 14, 14]
  A2 = dws<stride = 2>(A1, D2, P2, p2)                # [batch, 128, 7, 7]
  A3 = dws(A2, D3, P3, p3)                            # [batch, 128, 7, 7]
  G(n, c) +=! A3(n, c, h, w)
  F(n, c) = G(n, c) / 49.0
  logits = linear(F, Wf, bf)
  L = cross_entropy(logits, labels)
}
