# The extended benchmark suite (bench/README.md, `bench/run --suite
# extended`): training workloads of the kinds that published papers
# introduce, beyond the six public ones of examples/workloads.nf.  Each
# workload is one def from the data and the parameters to the scalar loss;
# its PyTorch twin, its benchmark shapes and its learning rate are in
# bench/extended.py.  Sizes are symbolic, so small shapes check the same
# defs (bench/extended_check.py), e.g.
#
#   neoflow eval bench/extended.nf gru_loss --shape X=8,2,3 --shape H0=2,4 \
#       --shape Wi=12,3 --shape Wh=12,4 --shape bi=12 --shape bh=12
#
# Where a workload fixes a number of steps or layers the def fixes it too,
# with a require on the input.  Nothing here is known to the compiler: the
# defs use the language and lib/nn.nf only.
import nn

# ---- helpers ----

# The mean of the squares of all elements: the loss of most workloads
# below (a stand-in for a regression head).
def mean_square(Y: f32[*S]) -> (L: f32[]) {
  Sum() +=! Y(*i) * Y(*i)
  L() = Sum() / f32(prod(*S))
}

# (SiLU is lib/nn.nf's silu.)

# RMSNorm (Zhang and Sennrich 2019) over the last axis with eps 1e-6:
# x / sqrt(mean(x^2) + eps) * g, no centring and no bias.
def rms_norm(X: f32[*B, D], g: f32[D]) -> (Y: f32[*B, D]) {
  Sq(*b) +=! X(*b, d) * X(*b, d)
  R(*b) = rsqrt(Sq(*b) / f32(D) + 1e-6)
  Y(*b, d) = X(*b, d) * R(*b) * g(d)
}

# Group normalisation (Wu and He 2018) of NCHW: the channels in `groups`
# groups of CG, each normalised over its channels and all pixels (biased
# variance, eps 1e-5), then the per-channel affine gamma, beta
# (torch.nn.functional.group_norm).
def group_norm<groups>(X: f32[N, C, H, W], gamma: f32[C], beta: f32[C])
    -> (Y: f32[N, C, H, W])
    where CG = C // groups
    require groups > 0, C % groups == 0
{
  Sum(n, g) +=! X(n, g * CG + c, h, w) where g in 0:groups, c in 0:CG
  Mu(n, g) = Sum(n, g) / f32(CG * H * W)
  Xc(n, k, h, w) = X(n, k, h, w) - Mu(n, k // CG)
  Sq(n, g) +=! Xc(n, g * CG + c, h, w) * Xc(n, g * CG + c, h, w)
      where g in 0:groups, c in 0:CG
  R(n, g) = rsqrt(Sq(n, g) / f32(CG * H * W) + 1e-5)
  Y(n, k, h, w) = Xc(n, k, h, w) * R(n, k // CG) * gamma(k) + beta(k)
}

# ---- recurrent cells ----

# gru: a GRU layer (Cho et al. 2014) in PyTorch's nn.GRU formulation over
# 8 steps (T must be 8): with the input projection Xi = Wi x + bi of all
# steps as one GEMM and Hh = Wh h + bh per step, chunks r, z, n of D:
#   r = sigmoid(Xi_r + Hh_r), z = sigmoid(Xi_z + Hh_z),
#   n = tanh(Xi_n + r * Hh_n), h' = (1 - z) n + z h.
# Loss: mean(h_t^2) over all steps, the batch and the hidden units.
# Wi [3D, I], Wh [3D, D], bi, bh [3D] are the parameters.
def gru_loss(X: f32[T, B, I], H0: f32[B, D], Wi: f32[G, I], Wh: f32[G, D],
             bi: f32[G], bh: f32[G]) -> (L: f32[])
    require T == 8, G == 3 * D
{
  Xi = linear(X, Wi, bi)
  H[0] = H0
  Acc[0]() = 0.0
  for t in 0:8 {
    Hh[t] = linear(H[t], Wh, bh)
    R[t](n, d) = sigmoid(Xi(t, n, d) + Hh[t](n, d)) where d in 0:D
    Z[t](n, d) = sigmoid(Xi(t, n, D + d) + Hh[t](n, D + d)) where d in 0:D
    Nc[t](n, d) = tanh(Xi(t, n, 2 * D + d) + R[t](n, d) * Hh[t](n, 2 * D + d))
    H[t + 1](n, d) = (1.0 - Z[t](n, d)) * Nc[t](n, d) + Z[t](n, d) * H[t](n, d)
    Sq[t]() +=! H[t + 1](n, d) * H[t + 1](n, d)
    Acc[t + 1]() = Acc[t]() + Sq[t]()
  }
  L() = Acc[8]() / f32(8 * B * D)
}

# sru: a Simple Recurrent Unit layer (Lei et al. 2018) over 16 steps (T
# must be 16).  All matrix products are done for every step at once,
# U = W x with W [3D, D]; the recurrence is elementwise:
#   f = sigmoid(U_f + vf * c + bf), r = sigmoid(U_r + vr * c + br),
#   c' = f c + (1 - f) U_x,         h = r c' + (1 - r) x  (highway).
# Loss: mean(h_t^2) over all steps.  W, vf, vr, bf, br are the parameters.
def sru_loss(X: f32[T, B, D], C0: f32[B, D], W: f32[G, D], vf: f32[D], vr: f32[D],
             bf: f32[D], br: f32[D]) -> (L: f32[])
    require T == 16, G == 3 * D
{
  U(t, n, g) +=! X(t, n, i) * W(g, i)
  C[0] = C0
  Acc[0]() = 0.0
  for t in 0:16 {
    F[t](n, d) = sigmoid(U(t, n, D + d) + vf(d) * C[t](n, d) + bf(d))
    R[t](n, d) = sigmoid(U(t, n, 2 * D + d) + vr(d) * C[t](n, d) + br(d))
    C[t + 1](n, d) = F[t](n, d) * C[t](n, d) + (1.0 - F[t](n, d)) * U(t, n, d)
        where d in 0:D
    H[t](n, d) = R[t](n, d) * C[t + 1](n, d) + (1.0 - R[t](n, d)) * X(t, n, d)
    Sq[t]() +=! H[t](n, d) * H[t](n, d)
    Acc[t + 1]() = Acc[t]() + Sq[t]()
  }
  L() = Acc[16]() / f32(16 * B * D)
}

# ---- attention ----

# Causal multi-head self-attention (Vaswani et al. 2017): one projection
# to q, k, v ([3D, D]: q, then k, then v, each `heads` heads of E) split
# into heads [B, heads, S, E], the scaled dot-product softmax(q k^T /
# sqrt(E)) over the keys j <= i (the others masked to the lowest f32, as
# -inf), the heads concatenated and projected by Wo.  (Reading the scores
# straight from the packed projection, QKV(b, i, h * E + e), is the same
# def, but its gradient does not compile: bench/repro/grad_packed_heads.nf.)
def causal_mha<heads>(X: f32[B, S, D], Wqkv: f32[G, D], bqkv: f32[G], Wo: f32[D, D],
                      bo: f32[D]) -> (Y: f32[B, S, D])
    where E = D // heads
    require heads > 0, D % heads == 0, G == 3 * D
{
  QKV = linear(X, Wqkv, bqkv)
  Q(b, h, s, e) = QKV(b, s, h * E + e) where h in 0:heads, e in 0:E
  K(b, h, s, e) = QKV(b, s, D + h * E + e) where h in 0:heads, e in 0:E
  V(b, h, s, e) = QKV(b, s, 2 * D + h * E + e) where h in 0:heads, e in 0:E
  Sc(b, h, i, j) +=! Q(b, h, i, e) * K(b, h, j, e)
  Sm(b, h, i, j) = j <= i ? Sc(b, h, i, j) * rsqrt(f32(E)) : -3.4028234663852886e38
  P = softmax(Sm)
  O(b, i, h, e) +=! P(b, h, i, j) * V(b, h, j, e)
  Oc(b, i, c) = O(b, i, c // E, c % E) where c in 0:D
  Y = linear(Oc, Wo, bo)
}

# mha: a pre-norm Transformer attention sublayer, y = x + MHA(LN(x)),
# 8 heads, causal; loss mean(y^2).  The layer norm's gamma, beta, Wqkv,
# bqkv, Wo, bo are the parameters.
def mha_loss(X: f32[B, S, D], gamma: f32[D], beta: f32[D], Wqkv: f32[G, D],
             bqkv: f32[G], Wo: f32[D, D], bo: f32[D]) -> (L: f32[])
{
  Xn = layer_norm(X, gamma, beta)
  A = causal_mha<heads = 8>(Xn, Wqkv, bqkv, Wo, bo)
  Y = add(X, A)
  L = mean_square(Y)
}

# linear_attention: non-causal linear attention (Katharopoulos et al. 2020,
# "Transformers are RNNs") with the feature map phi(x) = elu(x) + 1,
# 8 heads of E: out_i = phi(q_i) (sum_j phi(k_j) v_j^T) /
# (phi(q_i) . sum_j phi(k_j) + 1e-6); y = x + Wo out + bo; loss mean(y^2).
# Wqkv [3D, D], bqkv, Wo, bo are the parameters.
def linear_attention_loss<heads = 8>(X: f32[B, S, D], Wqkv: f32[G, D], bqkv: f32[G],
                                     Wo: f32[D, D], bo: f32[D]) -> (L: f32[])
    where E = D // heads
    require heads > 0, D % heads == 0, G == 3 * D
{
  QKV = linear(X, Wqkv, bqkv)
  Phi = elu(QKV)
  Q(b, s, h, e) = Phi(b, s, h * E + e) + 1.0 where h in 0:heads, e in 0:E
  K(b, s, h, e) = Phi(b, s, D + h * E + e) + 1.0 where h in 0:heads, e in 0:E
  V(b, s, h, e) = QKV(b, s, 2 * D + h * E + e) where h in 0:heads, e in 0:E
  KV(b, h, e, f) +=! K(b, s, h, e) * V(b, s, h, f)
  Ks(b, h, e) +=! K(b, s, h, e)
  Num(b, s, h, f) +=! Q(b, s, h, e) * KV(b, h, e, f)
  Den(b, s, h) +=! Q(b, s, h, e) * Ks(b, h, e)
  O(b, s, c) = Num(b, s, c // E, c % E) / (Den(b, s, c // E) + 1e-6) where c in 0:D
  Z = linear(O, Wo, bo)
  Y = add(X, Z)
  L = mean_square(Y)
}

# gau: a Gated Attention Unit (Hua et al. 2022, "Transformer Quality in
# Linear Time"): one projection with SiLU gives u, v (E each) and a shared
# z (Zd); q = z gq + bq, k = z gk + bk; the attention is
# relu(q k^T / S)^2 (no softmax; one head); out = u * (A v); y = x + Wo out
# + bo; loss mean(y^2).  Wp [2E + Zd, D], bp, gq, bq, gk, bk, Wo [D, E],
# bo are the parameters.
def gau_loss(X: f32[B, S, D], Wp: f32[P, D], bp: f32[P], gq: f32[Zd], bq: f32[Zd],
             gk: f32[Zd], bk: f32[Zd], Wo: f32[D, E], bo: f32[D]) -> (L: f32[])
    require P == 2 * E + Zd
{
  Pr = linear(X, Wp, bp)
  UVZ = silu(Pr)
  Q(b, s, z) = UVZ(b, s, 2 * E + z) * gq(z) + bq(z)
  K(b, s, z) = UVZ(b, s, 2 * E + z) * gk(z) + bk(z)
  QK(b, i, j) +=! Q(b, i, z) * K(b, j, z)
  Rl(b, i, j) = max(QK(b, i, j) / f32(S), 0.0)
  AV(b, i, e) +=! Rl(b, i, j) * Rl(b, i, j) * UVZ(b, j, E + e) where e in 0:E
  O(b, s, e) = UVZ(b, s, e) * AV(b, s, e) where e in 0:E
  Z = linear(O, Wo, bo)
  Y = add(X, Z)
  L = mean_square(Y)
}

# ---- convolutions ----

# resnext: a ResNeXt bottleneck (Xie et al. 2017, aggregated residual
# transformations) without normalisation: 1x1 conv (C -> M), ReLU, grouped
# 3x3 conv (pad 1, cardinality 8: M -> M in 8 groups), ReLU, 1x1 conv
# (M -> C), plus the input, ReLU; loss mean(y^2).  W1 [M, C, 1, 1],
# W2 [M, M / 8, 3, 3], W3 [C, M, 1, 1] are the parameters.
def resnext_loss(X: f32[N, C, H, W], W1: f32[M, C, 1, 1], W2: f32[M, MG, 3, 3],
                 W3: f32[C, M, 1, 1]) -> (L: f32[])
    require M == 8 * MG
{
  A1 = conv2d(X, W1)
  A = relu(A1)
  B1 = conv2d<pad = 1, groups = 8>(A, W2)
  Bg = relu(B1)
  Cc = conv2d(Bg, W3)
  Y(n, c, h, w) = max(Cc(n, c, h, w) + X(n, c, h, w), 0.0)
  L = mean_square(Y)
}

# A causal dilated 1-D convolution (WaveNet's): out(t) reads the inputs at
# t - (R - 1 - r) dilation, zero before the start; no bias.  The same as
# torch.nn.functional.conv1d of the input padded on the left by
# (R - 1) dilation.
def causal_conv1d<dilation>(X: f32[N, C, T], W: f32[K, C, R]) -> (O: f32[N, K, T])
    require dilation > 0
{
  O(n, k, t) +=! t - (R - 1 - r) * dilation >= 0 ?
      X(n, c, t - (R - 1 - r) * dilation) * W(k, c, r) : 0.0
}

# One WaveNet layer (van den Oord et al. 2016): a causal dilated
# convolution of kernel 2 to 2C channels, the gated activation
# tanh(filter) * sigmoid(gate), then 1x1 convolutions to the residual
# (added to the input) and to the skip output.
def wavenet_layer<dilation>(X: f32[N, C, T], Wfg: f32[G, C, 2], Wr: f32[C, C],
                            Ws: f32[C, C]) -> (Y: f32[N, C, T], Sk: f32[N, C, T])
    require G == 2 * C
{
  FG = causal_conv1d<dilation = dilation>(X, Wfg)
  Z(n, c, t) = tanh(FG(n, c, t)) * sigmoid(FG(n, C + c, t)) where c in 0:C
  Rs(n, c, t) +=! Wr(c, k) * Z(n, k, t)
  Y(n, c, t) = X(n, c, t) + Rs(n, c, t)
  Sk(n, c, t) +=! Ws(c, k) * Z(n, k, t)
}

# wavenet: four WaveNet layers with dilations 1, 2, 4, 8 (their weights
# stacked: Wfg [4, 2C, C, 2], Wr and Ws [4, C, C]); loss mean(relu(sum of
# the skips)^2).  Wfg, Wr, Ws are the parameters.
def wavenet_loss(X: f32[N, C, T], Wfg: f32[4, G, C, 2], Wr: f32[4, C, C],
                 Ws: f32[4, C, C]) -> (L: f32[])
    require G == 2 * C
{
  Xl[0] = X
  Skip[0](n, c, t) = 0.0 where n in 0:N, c in 0:C, t in 0:T
  for l in 0:4 {
    Wfl[l](k, c, r) = Wfg(l, k, c, r)
    Wrl[l](c, k) = Wr(l, c, k)
    Wsl[l](c, k) = Ws(l, c, k)
    Xl[l + 1], Sk[l] = wavenet_layer<dilation = l < 2 ? l + 1 : 4 * (l - 1)>(
        Xl[l], Wfl[l], Wrl[l], Wsl[l])
    Skip[l + 1](n, c, t) = Skip[l](n, c, t) + Sk[l](n, c, t)
  }
  Out = relu(Skip[4])
  L = mean_square(Out)
}

# The shift operation (Wu et al. 2018, "Shift: A Zero FLOP, Zero Parameter
# Alternative to Spatial Convolutions"): the channels in 9 equal groups,
# group g moved by (g // 3 - 1, g % 3 - 1) pixels (the 3x3 neighbourhood),
# zeros shifted in: a window of the input padded by one pixel.
def shift9(X: f32[N, C, H, W]) -> (Y: f32[N, C, H, W])
    where CG = C // 9
    require C % 9 == 0
{
  Xp(n, c, h, w) = (h >= 1 && h <= H && w >= 1 && w <= W) ? X(n, c, h - 1, w - 1) : 0.0
      where h in 0:H + 2, w in 0:W + 2
  Y(n, c, h, w) = Xp(n, c, h + (c // CG) // 3, w + (c // CG) % 3)
}

# shiftnet: a ShiftNet block: 1x1 conv (C -> M), ReLU, shift, 1x1 conv
# (M -> C), plus the input; loss mean(y^2).  W1 [M, C, 1, 1] and
# W2 [C, M, 1, 1] are the parameters (M a multiple of 9).
def shiftnet_loss(X: f32[N, C, H, W], W1: f32[M, C, 1, 1], W2: f32[C, M, 1, 1])
    -> (L: f32[])
{
  A1 = conv2d(X, W1)
  A = relu(A1)
  Sh = shift9(A)
  Z = conv2d(Sh, W2)
  Y = add(X, Z)
  L = mean_square(Y)
}

# ---- normalisation and gating ----

# swiglu: a pre-norm Transformer feed-forward sublayer as in LLaMA: RMSNorm,
# then the SwiGLU MLP (Shazeer 2020, "GLU Variants Improve Transformer"):
# silu(x W1^T) * (x W3^T), W1 and W3 stacked as one W13 [2F, D] (W1
# first), projected back by W2 [D, F]; y = x + that, no biases; loss
# mean(y^2).  g, W13, W2 are the parameters.
def swiglu_loss(X: f32[B, S, D], g: f32[D], W13: f32[F2, D], W2: f32[D, F])
    -> (L: f32[])
    require F2 == 2 * F
{
  Xn = rms_norm(X, g)
  H13(b, s, f) +=! Xn(b, s, d) * W13(f, d)
  Gt(b, s, f) = H13(b, s, f) * sigmoid(H13(b, s, f)) * H13(b, s, F + f) where f in 0:F
  Z(b, s, d) +=! Gt(b, s, f) * W2(d, f)
  Y = add(X, Z)
  L = mean_square(Y)
}

# groupnorm: conv 3x3 (pad 1, no bias) -> GroupNorm (8 groups) -> SiLU,
# the block of many diffusion U-Nets; loss mean(y^2).  Wt, gamma, beta are
# the parameters.
def groupnorm_loss(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], gamma: f32[K],
                   beta: f32[K]) -> (L: f32[])
{
  O = conv2d<pad = 1>(X, Wt)
  G = group_norm<groups = 8>(O, gamma, beta)
  Y = silu(G)
  L = mean_square(Y)
}

# se: a residual block with squeeze-and-excitation (Hu et al. 2018):
# conv 3x3 (pad 1, no bias), ReLU; the channel gate
# e = sigmoid(W2 relu(W1 mean_hw + b1) + b2) (reduction C / R); y =
# relu(x + conv * e); loss mean(y^2).  Wt, W1 [R, C], b1, W2 [C, R], b2
# are the parameters.
def se_loss(X: f32[N, C, H, W], Wt: f32[C, C, 3, 3], W1: f32[R, C], b1: f32[R],
            W2: f32[C, R], b2: f32[C]) -> (L: f32[])
{
  O = conv2d<pad = 1>(X, Wt)
  A = relu(O)
  Sq(n, c) +=! A(n, c, h, w)
  Mn(n, c) = Sq(n, c) / f32(H * W)
  Z0 = linear(Mn, W1, b1)
  Z1 = relu(Z0)
  Z2 = linear(Z1, W2, b2)
  Y(n, c, h, w) = max(X(n, c, h, w) + A(n, c, h, w) * sigmoid(Z2(n, c)), 0.0)
  L = mean_square(Y)
}

# convnext: a ConvNeXt block (Liu et al. 2022): depthwise 7x7 (pad 3,
# with bias), LayerNorm over the channels (channels last), pointwise
# expansion to 4C with GELU, pointwise back to C, the layer scale ls, plus
# the input; loss mean(y^2).  Wdw [C, 1, 7, 7], bdw, gamma, beta,
# W1 [F, C], b1, W2 [C, F], b2, ls are the parameters.
def convnext_loss(X: f32[N, C, H, W], Wdw: f32[C, 1, 7, 7], bdw: f32[C], gamma: f32[C],
                  beta: f32[C], W1: f32[F, C], b1: f32[F], W2: f32[C, F], b2: f32[C],
                  ls: f32[C]) -> (L: f32[])
{
  D = conv2d<pad = 3, groups = C>(X, Wdw)
  Dl(n, h, w, c) = D(n, c, h, w) + bdw(c)
  Nl = layer_norm(Dl, gamma, beta)
  Ul = linear(Nl, W1, b1)
  Hl = gelu(Ul)
  Pl = linear(Hl, W2, b2)
  Y(n, c, h, w) = X(n, c, h, w) + ls(c) * Pl(n, h, w, c)
  L = mean_square(Y)
}

# ---- routing ----

# moe: a soft mixture of experts (the dense softmax gating of Shazeer et
# al. 2017, all experts evaluated): gate p = softmax(x Wg^T) over E
# experts; expert e is a GELU MLP W2_e gelu(W1_e x + b1_e) + b2_e; y = x +
# sum_e p_e expert_e(x); loss mean(y^2).  Wg [E, D], W1 [E, F, D], b1
# [E, F], W2 [E, D, F], b2 [E, D] are the parameters.
def moe_loss(X: f32[T, D], Wg: f32[E, D], W1: f32[E, F, D], b1: f32[E, F],
             W2: f32[E, D, F], b2: f32[E, D]) -> (L: f32[])
{
  Lg(t, e) +=! X(t, d) * Wg(e, d)
  Pg = softmax(Lg)
  H1(e, t, f) +=! X(t, d) * W1(e, f, d)
  A(e, t, f) = H1(e, t, f) + b1(e, f)
  Ga = gelu(A)
  O(e, t, d) +=! Ga(e, t, f) * W2(e, d, f)
  Mix(t, d) +=! Pg(t, e) * (O(e, t, d) + b2(e, d))
  Y = add(X, Mix)
  L = mean_square(Y)
}
