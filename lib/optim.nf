# Optimizer updates.  The client lays every parameter of a model out in
# one vector P of N elements (its gradient G, its state M and V likewise),
# so one update statement list covers the whole model and partitioning
# fuses it into one kernel.  The client runs it in place: P2 is written
# over P, M2 over M, V2 over V (each statement reads its inputs at the
# index it writes, and the first use of every compiled update kernel is
# checked against the interpreter in that in-place form).
#
# hp holds the step's hyper-parameters, computed by the client each step
# (so the kernel never changes when the learning rate does).

# SGD with momentum and L2 weight decay (PyTorch's torch.optim.SGD,
# dampening 0): hp = [lr, momentum, weight_decay].
def sgd(P: f32[N], G: f32[N], V: f32[N], hp: f32[3]) -> (P2: f32[N], V2: f32[N]) {
  V2(i) = hp(1) * V(i) + G(i) + hp(2) * P(i)
  P2(i) = P(i) - hp(0) * V2(i)
}

# SGD without momentum or weight decay, the client's choice when both are
# 0 (hp as for sgd): no momentum buffer is read or written, a third less
# memory traffic than sgd with momentum 0.
def sgd_plain(P: f32[N], G: f32[N], hp: f32[3]) -> (P2: f32[N]) {
  P2(i) = P(i) - hp(0) * G(i)
}

# Adam with L2 weight decay (torch.optim.Adam): with bias corrections
# c1 = 1 - beta1^t, c2 = 1 - beta2^t,
# hp = [lr / c1, 1 / sqrt(c2), beta1, beta2, eps, weight_decay].
def adam(P: f32[N], G: f32[N], M: f32[N], V: f32[N], hp: f32[6])
    -> (P2: f32[N], M2: f32[N], V2: f32[N])
{
  M2(i) = hp(2) * M(i) + (1.0 - hp(2)) * (G(i) + hp(5) * P(i))
  V2(i) = hp(3) * V(i) + (1.0 - hp(3)) * (G(i) + hp(5) * P(i)) * (G(i) + hp(5) * P(i))
  P2(i) = P(i) - hp(0) * M2(i) / (sqrt(V2(i)) * hp(1) + hp(4))
}

# AdamW, decoupled weight decay (torch.optim.AdamW):
# hp = [lr / c1, 1 / sqrt(c2), beta1, beta2, eps, lr * weight_decay].
def adamw(P: f32[N], G: f32[N], M: f32[N], V: f32[N], hp: f32[6])
    -> (P2: f32[N], M2: f32[N], V2: f32[N])
{
  M2(i) = hp(2) * M(i) + (1.0 - hp(2)) * G(i)
  V2(i) = hp(3) * V(i) + (1.0 - hp(3)) * G(i) * G(i)
  P2(i) = P(i) - hp(5) * P(i) - hp(0) * M2(i) / (sqrt(V2(i)) * hp(1) + hp(4))
}
