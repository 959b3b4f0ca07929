"""extended.py - the extended benchmark suite (bench/README.md, `bench/run
--suite extended`): training workloads of the kinds that papers introduce
(recurrent cells, attention variants, grouped, dilated and shifted
convolutions, normalisation variants, gating, routing), beyond the six
public ones.  NeoFlow's side is the def of bench/extended.nf; PyTorch's is
the twin below of the same name, eager, with exactly the def's semantics
and written the way a user would write it fast (the library's fused ops
where they exist: torch.gru, group_norm, layer_norm, conv1d/conv2d, one
GEMM for several projections).

WORKLOADS has bench/run's format: name -> (def, [(input, shape, kind)],
lr), kinds as there ("param": PyTorch's default U(-1/sqrt(fan_in), ..)
with fan_in the product of the dims after the first; ("param", F) or
("bias", F): the same with fan_in F, for stacked weights and biases;
"vec": U(0.5, 1.5), for gains; "data": +-U(0.1, 1)).  SMALL gives each
workload small shapes of the same inputs, for bench/extended_check.py
(the def against its twin and against finite differences, through the
interpreter).  FUNCTIONS maps a name to its twin, a function of the def's
inputs in order returning the scalar loss.

This module imports torch only when a twin runs (bench/run reads the
table without it).
"""


# name: (def, [(input, shape, kind)], lr)
WORKLOADS = {
    "gru": ("gru_loss", [("X", (8, 64, 256), "data"), ("H0", (64, 512), "data"),
                         ("Wi", (1536, 256), ("param", 512)),
                         ("Wh", (1536, 512), ("param", 512)),
                         ("bi", (1536,), ("bias", 512)), ("bh", (1536,), ("bias", 512))], 1e-4),
    "sru": ("sru_loss", [("X", (16, 32, 512), "data"), ("C0", (32, 512), "data"),
                         ("W", (1536, 512), "param"), ("vf", (512,), ("bias", 512)),
                         ("vr", (512,), ("bias", 512)), ("bf", (512,), ("bias", 512)),
                         ("br", (512,), ("bias", 512))], 1e-4),
    "mha": ("mha_loss", [("X", (8, 128, 256), "data"), ("gamma", (256,), "vec"),
                         ("beta", (256,), ("bias", 256)), ("Wqkv", (768, 256), "param"),
                         ("bqkv", (768,), ("bias", 256)), ("Wo", (256, 256), "param"),
                         ("bo", (256,), ("bias", 256))], 1e-4),
    "linear_attention": ("linear_attention_loss", [
        ("X", (8, 256, 256), "data"), ("Wqkv", (768, 256), "param"),
        ("bqkv", (768,), ("bias", 256)), ("Wo", (256, 256), "param"),
        ("bo", (256,), ("bias", 256))], 1e-4),
    "gau": ("gau_loss", [("X", (4, 256, 256), "data"), ("Wp", (1152, 256), "param"),
                         ("bp", (1152,), ("bias", 256)), ("gq", (128,), "vec"),
                         ("bq", (128,), ("bias", 128)), ("gk", (128,), "vec"),
                         ("bk", (128,), ("bias", 128)), ("Wo", (256, 512), "param"),
                         ("bo", (256,), ("bias", 512))], 1e-4),
    "resnext": ("resnext_loss", [("X", (8, 128, 28, 28), "data"),
                                 ("W1", (128, 128, 1, 1), "param"),
                                 ("W2", (128, 16, 3, 3), "param"),
                                 ("W3", (128, 128, 1, 1), "param")], 1e-4),
    "wavenet": ("wavenet_loss", [("X", (4, 64, 1024), "data"),
                                 ("Wfg", (4, 128, 64, 2), ("param", 128)),
                                 ("Wr", (4, 64, 64), ("param", 64)),
                                 ("Ws", (4, 64, 64), ("param", 64))], 1e-4),
    "shiftnet": ("shiftnet_loss", [("X", (8, 64, 32, 32), "data"),
                                   ("W1", (144, 64, 1, 1), "param"),
                                   ("W2", (64, 144, 1, 1), "param")], 1e-4),
    "swiglu": ("swiglu_loss", [("X", (8, 128, 256), "data"), ("g", (256,), "vec"),
                               ("W13", (1024, 256), "param"), ("W2", (256, 512), "param")],
               1e-4),
    "groupnorm": ("groupnorm_loss", [("X", (8, 64, 32, 32), "data"),
                                     ("Wt", (64, 64, 3, 3), "param"), ("gamma", (64,), "vec"),
                                     ("beta", (64,), ("bias", 64))], 1e-4),
    "se": ("se_loss", [("X", (8, 64, 32, 32), "data"), ("Wt", (64, 64, 3, 3), "param"),
                       ("W1", (16, 64), "param"), ("b1", (16,), ("bias", 64)),
                       ("W2", (64, 16), "param"), ("b2", (64,), ("bias", 16))], 1e-4),
    "convnext": ("convnext_loss", [("X", (8, 64, 28, 28), "data"),
                                   ("Wdw", (64, 1, 7, 7), "param"), ("bdw", (64,), ("bias", 49)),
                                   ("gamma", (64,), "vec"), ("beta", (64,), ("bias", 64)),
                                   ("W1", (256, 64), "param"), ("b1", (256,), ("bias", 64)),
                                   ("W2", (64, 256), "param"), ("b2", (64,), ("bias", 256)),
                                   ("ls", (64,), "vec")], 1e-4),
    "moe": ("moe_loss", [("X", (512, 256), "data"), ("Wg", (4, 256), "param"),
                         ("W1", (4, 512, 256), ("param", 256)), ("b1", (4, 512), ("bias", 256)),
                         ("W2", (4, 256, 512), ("param", 512)), ("b2", (4, 256), ("bias", 512))],
            1e-4),
}
ORDER = list(WORKLOADS)

# Small shapes of the same inputs (in order), for the checks through the
# interpreter: odd sizes where the def allows them.
SMALL = {
    "gru": [(8, 3, 5), (3, 4), (12, 5), (12, 4), (12,), (12,)],
    "sru": [(16, 2, 5), (2, 5), (15, 5), (5,), (5,), (5,), (5,)],
    "mha": [(2, 5, 16), (16,), (16,), (48, 16), (48,), (16, 16), (16,)],
    "linear_attention": [(2, 5, 16), (48, 16), (48,), (16, 16), (16,)],
    "gau": [(2, 5, 6), (17, 6), (17,), (3,), (3,), (3,), (3,), (6, 7), (6,)],
    "resnext": [(2, 5, 6, 5), (16, 5, 1, 1), (16, 2, 3, 3), (5, 16, 1, 1)],
    "wavenet": [(2, 3, 20), (4, 6, 3, 2), (4, 3, 3), (4, 3, 3)],
    "shiftnet": [(2, 3, 5, 4), (18, 3, 1, 1), (3, 18, 1, 1)],
    "swiglu": [(2, 3, 6), (6,), (14, 6), (6, 7)],
    "groupnorm": [(2, 3, 5, 4), (16, 3, 3, 3), (16,), (16,)],
    "se": [(2, 4, 5, 3), (4, 4, 3, 3), (6, 4), (6,), (4, 6), (4,)],
    "convnext": [(2, 3, 8, 7), (3, 1, 7, 7), (3,), (3,), (3,), (12, 3), (12,), (3, 12), (3,),
                 (3,)],
    "moe": [(5, 6), (3, 6), (3, 7, 6), (3, 7), (3, 6, 7), (3, 6)],
}

_torch = None


def _t():
    """torch and torch.nn.functional, imported at the first twin's use."""
    global _torch
    if _torch is None:
        import torch
        import torch.nn.functional as F
        _torch = (torch, F)
    return _torch


# ---- the twins ----

def gru_loss(X, H0, Wi, Wh, bi, bh):
    torch, F = _t()
    # torch.gru is what nn.GRU calls: one layer, with biases, gates r, z, n
    out, _ = torch.gru(X, H0.unsqueeze(0), (Wi, Wh, bi, bh), True, 1, 0.0, True, False,
                       False)
    return (out * out).mean()


def sru_loss(X, C0, W, vf, vr, bf, br):
    torch, F = _t()
    ux, uf, ur = F.linear(X, W).chunk(3, dim=-1)  # every step's products at once
    uf, ur = uf + bf, ur + br
    c, hs = C0, []
    for t in range(X.shape[0]):
        f = torch.sigmoid(uf[t] + vf * c)
        r = torch.sigmoid(ur[t] + vr * c)
        c = f * c + (1 - f) * ux[t]
        hs.append(r * c + (1 - r) * X[t])
    h = torch.stack(hs)
    return (h * h).mean()


def _heads(x, n, h):
    """[B, S, n * D] -> n tensors [B, h, S, D / h]."""
    B, S, G = x.shape
    return x.view(B, S, n, h, G // (n * h)).permute(2, 0, 3, 1, 4).unbind(0)


def mha_loss(X, gamma, beta, Wqkv, bqkv, Wo, bo):
    torch, F = _t()
    B, S, D = X.shape
    q, k, v = _heads(F.linear(F.layer_norm(X, (D,), gamma, beta, 1e-5), Wqkv, bqkv), 3, 8)
    sdpa = getattr(F, "scaled_dot_product_attention", None)  # PyTorch >= 2.0
    if sdpa is not None:
        o = sdpa(q, k, v, is_causal=True)
    else:
        s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        mask = torch.ones(S, S, dtype=torch.bool, device=X.device).triu(1)
        o = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
    y = X + F.linear(o.transpose(1, 2).reshape(B, S, D), Wo, bo)
    return (y * y).mean()


def linear_attention_loss(X, Wqkv, bqkv, Wo, bo):
    torch, F = _t()
    B, S, D = X.shape
    q, k, v = F.linear(X, Wqkv, bqkv).view(B, S, 3, 8, D // 8).unbind(2)
    q, k = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("bshe,bshf->bhef", k, v)
    z = 1 / (torch.einsum("bshe,bhe->bsh", q, k.sum(dim=1)) + 1e-6)
    o = torch.einsum("bshe,bhef,bsh->bshf", q, kv, z).reshape(B, S, D)
    y = X + F.linear(o, Wo, bo)
    return (y * y).mean()


def gau_loss(X, Wp, bp, gq, bq, gk, bk, Wo, bo):
    torch, F = _t()
    S, E = X.shape[1], Wo.shape[1]
    u, v, z = F.silu(F.linear(X, Wp, bp)).split([E, E, gq.shape[0]], dim=-1)
    q, k = z * gq + bq, z * gk + bk
    a = torch.relu(q @ k.transpose(1, 2) / S).square()
    y = X + F.linear(u * (a @ v), Wo, bo)
    return (y * y).mean()


def resnext_loss(X, W1, W2, W3):
    torch, F = _t()
    a = torch.relu(F.conv2d(X, W1))
    a = torch.relu(F.conv2d(a, W2, padding=1, groups=8))
    y = torch.relu(F.conv2d(a, W3) + X)
    return (y * y).mean()


def wavenet_loss(X, Wfg, Wr, Ws):
    torch, F = _t()
    x, skip = X, 0
    for layer in range(4):
        d = 2 ** layer
        f, g = F.conv1d(F.pad(x, (d, 0)), Wfg[layer], dilation=d).chunk(2, dim=1)
        z = torch.tanh(f) * torch.sigmoid(g)
        x = x + F.conv1d(z, Wr[layer].unsqueeze(-1))
        skip = skip + F.conv1d(z, Ws[layer].unsqueeze(-1))
    y = torch.relu(skip)
    return (y * y).mean()


_SHIFT = {}


def _shift_kernel(a):
    """The shift as a fixed depthwise 3x3 convolution: channel group g
    (of 9) has a one at (g // 3, g % 3) and zeros elsewhere, so the
    convolution copies exactly.  (The slicing form, cat of nine padded
    windows, is several times slower in eager, mostly in its backward.)"""
    key = (a.shape[1], a.dtype, a.device)
    if key not in _SHIFT:
        torch, _ = _t()
        c = a.shape[1]
        k = torch.zeros(c, 1, 3, 3, dtype=a.dtype, device=a.device)
        for ch in range(c):
            g = ch // (c // 9)
            k[ch, 0, g // 3, g % 3] = 1
        _SHIFT[key] = k
    return _SHIFT[key]


def shiftnet_loss(X, W1, W2):
    torch, F = _t()
    a = torch.relu(F.conv2d(X, W1))
    sh = F.conv2d(a, _shift_kernel(a), padding=1, groups=a.shape[1])
    y = X + F.conv2d(sh, W2)
    return (y * y).mean()


def swiglu_loss(X, g, W13, W2):
    torch, F = _t()
    xn = X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    h1, h3 = F.linear(xn, W13).chunk(2, dim=-1)
    y = X + F.linear(F.silu(h1) * h3, W2)
    return (y * y).mean()


def groupnorm_loss(X, Wt, gamma, beta):
    torch, F = _t()
    y = F.silu(F.group_norm(F.conv2d(X, Wt, padding=1), 8, gamma, beta, 1e-5))
    return (y * y).mean()


def se_loss(X, Wt, W1, b1, W2, b2):
    torch, F = _t()
    a = torch.relu(F.conv2d(X, Wt, padding=1))
    e = torch.sigmoid(F.linear(torch.relu(F.linear(a.mean((2, 3)), W1, b1)), W2, b2))
    y = torch.relu(X + a * e[:, :, None, None])
    return (y * y).mean()


def convnext_loss(X, Wdw, bdw, gamma, beta, W1, b1, W2, b2, ls):
    torch, F = _t()
    C = X.shape[1]
    d = F.conv2d(X, Wdw, bdw, padding=3, groups=C).permute(0, 2, 3, 1)
    d = F.layer_norm(d, (C,), gamma, beta, 1e-5)
    d = F.linear(F.gelu(F.linear(d, W1, b1)), W2, b2)
    y = X + (ls * d).permute(0, 3, 1, 2)
    return (y * y).mean()


def moe_loss(X, Wg, W1, b1, W2, b2):
    torch, F = _t()
    p = torch.softmax(F.linear(X, Wg), dim=-1)  # [T, E]
    h = F.gelu(torch.baddbmm(b1.unsqueeze(1), X.expand(W1.shape[0], -1, -1),
                             W1.transpose(1, 2)))  # [E, T, F]
    o = torch.baddbmm(b2.unsqueeze(1), h, W2.transpose(1, 2))  # [E, T, D]
    y = X + torch.einsum("te,etd->td", p, o)
    return (y * y).mean()


FUNCTIONS = {name: globals()[defn] for name, (defn, _, _) in WORKLOADS.items()}
# what bench/torch_workloads.py looks twins up in (--twins extended)
TWINS = FUNCTIONS
