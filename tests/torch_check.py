#!/usr/bin/env python3
"""torch_check.py - gradients of lib/nn.nf through `neoflow grad`, against
PyTorch's autograd.

Usage: torch_check.py NEOFLOW_BINARY NN_NF

For a representative set of library defs, the built-in operators (the
defs of tests/data/builtins.nf, next to this script), and the six
workloads of
examples/workloads.nf (found at NN_NF/../../examples, as WORKLOADS.md
defines them), writes seeded random float32
inputs (int64 labels and indices) and a random float32 adjoint seed dout
to .npy files in a temporary directory, runs

    neoflow grad NN_NF DEF --wrt X[,Y...] --in NAME=FILE ... [--param N=V ...]
                 --dout [OUT=]FILE --out DIR

and compares each DIR/grad_<X>.npy (it must be float32, of X's shape) with
the gradient PyTorch's autograd computes in float64 from the same inputs
and seed, using the torch.nn.functional equivalents (squash and
margin_loss are written in torch ops from their definitions in
WORKLOADS.md): ||got - want|| / ||want|| must be at most 1e-5.  The shapes
differ from those of tests/test_autodiff.c.  Prints one line per def and
input and exits 1 if any fails, 77 (skipped) without PyTorch.
"""

import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as TF
except ImportError:
    # Meson may find a python3 (pyenv, venv) without PyTorch while the
    # system's has it (Debian's python3-torch): try that one once before
    # skipping.
    system_py = "/usr/bin/python3"
    if (os.environ.get("NF_TORCH_CHECK_REEXEC") is None
            and os.path.exists(system_py)
            and os.path.realpath(sys.executable) != os.path.realpath(system_py)):
        os.environ["NF_TORCH_CHECK_REEXEC"] = "1"
        os.execv(system_py, [system_py] + sys.argv)
    print("torch_check: PyTorch (or NumPy) is not available; skipping")
    sys.exit(77)

RTOL = 1e-5


def c32(x):
    """A float constant as the f32 value an f32 def computes with."""
    return float(np.float32(x))


# ---- references in torch ops (float64 tensors) ----

def t_squash(S):
    # squash(s) = (|s|^2 / (1 + |s|^2)) s / sqrt(|s|^2 + 1e-8), last axis
    n2 = (S * S).sum(dim=-1, keepdim=True)
    return n2 / (1.0 + n2) * S / torch.sqrt(n2 + c32(1e-8))


def t_margin_loss(lengths, targets):
    # T max(0, 0.9 - |v|)^2 + 0.5 (1 - T) max(0, |v| - 0.1)^2, summed over
    # the capsules, mean over the batch
    pos = torch.clamp(c32(0.9) - lengths, min=0.0) ** 2
    neg = torch.clamp(lengths - c32(0.1), min=0.0) ** 2
    return (targets * pos + 0.5 * (1.0 - targets) * neg).sum(dim=1).mean()


def t_channel_shuffle(X, groups):
    N, C, H, W = X.shape
    return X.reshape(N, groups, C // groups, H, W).transpose(1, 2).reshape(N, C, H, W)


# ---- cases ----

def nonzero(rng, shape, scale=1.0):
    """float32 values in scale * ([-1, -0.1] u [0.1, 1]): never zero."""
    v = rng.uniform(0.1, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return np.asarray(scale * v, dtype=np.float32)  # an array, also for shape ()


def cases(rng):
    """Yields (label, def, inputs {name: array}, params {name: int}, wrt
    [names], outputs [names], torch function of the inputs in order
    returning a tensor or a tuple in the order of outputs)."""
    A, B = nonzero(rng, (6, 9)), nonzero(rng, (9, 4))
    yield ("matmul", "matmul", {"A": A, "B": B}, {}, ["A", "B"], ["C"],
           lambda A, B: A @ B)

    A, B = nonzero(rng, (2, 2, 5, 6)), nonzero(rng, (2, 2, 6, 3))
    yield ("batch_matmul", "batch_matmul", {"A": A, "B": B}, {}, ["A", "B"], ["C"],
           torch.matmul)

    X, W, b = nonzero(rng, (2, 5, 6)), nonzero(rng, (4, 6)), nonzero(rng, (4,))
    yield ("linear", "linear", {"X": X, "W": W, "b": b}, {}, ["X", "W", "b"], ["Y"],
           TF.linear)
    yield ("linear_nobias", "linear_nobias", {"X": X, "W": W}, {}, ["X", "W"], ["Y"],
           TF.linear)
    X = nonzero(rng, (4, 7))
    yield ("silu", "silu", {"X": X}, {}, ["X"], ["Y"], TF.silu)
    yield ("expm1", "expm1", {"X": X}, {}, ["X"], ["Y"], torch.expm1)
    Xs = (X * 1e-3).astype(np.float32)  # near 0, where exp(x) - 1 cancels
    yield ("expm1 near 0", "expm1", {"X": Xs}, {}, ["X"], ["Y"], torch.expm1)
    Xp = np.abs(X).astype(np.float32) - 0.4  # > -1
    yield ("log1p", "log1p", {"X": Xp}, {}, ["X"], ["Y"], torch.log1p)
    yield ("log1p near 0", "log1p", {"X": Xs}, {}, ["X"], ["Y"], torch.log1p)

    def conv(label, ishape, wshape, stride=1, pad=0, dilation=1, groups=1):
        I, W = nonzero(rng, ishape), nonzero(rng, wshape)
        p = {k: v for k, v in (("stride", stride), ("pad", pad), ("dilation", dilation),
                               ("groups", groups)) if v != (0 if k == "pad" else 1)}
        return (label, "conv2d", {"I": I, "W": W}, p, ["I", "W"], ["O"],
                lambda I, W: TF.conv2d(I, W, stride=stride, padding=pad,
                                       dilation=dilation, groups=groups))

    yield conv("conv2d stride 2", (2, 3, 10, 9), (4, 3, 3, 3), stride=2)
    yield conv("conv2d dilation 2", (1, 2, 10, 8), (3, 2, 3, 2), dilation=2)
    yield conv("conv2d groups 3", (2, 6, 6, 8), (6, 2, 3, 3), groups=3)
    yield conv("conv2d pad 1", (2, 3, 6, 5), (4, 3, 3, 3), pad=1)
    yield conv("conv2d s2 p1 d2 g2", (1, 4, 12, 11), (6, 2, 3, 3), stride=2, pad=1,
               dilation=2, groups=2)
    yield conv("conv2d depthwise", (2, 4, 6, 7), (4, 1, 3, 3), pad=1, groups=4)

    for kernel, stride, pad, shape in ((3, 2, 1, (2, 2, 10, 9)), (2, 2, 0, (1, 3, 6, 9))):
        p = {"kernel": kernel, "stride": stride, "pad": pad}
        X = nonzero(rng, shape)
        yield ("max_pool2d k%d s%d p%d" % (kernel, stride, pad), "max_pool2d", {"X": X}, p,
               ["X"], ["Y"],
               lambda X, k=kernel, s=stride, q=pad: TF.max_pool2d(X, k, s, q))
        X = nonzero(rng, shape)
        yield ("avg_pool2d k%d s%d p%d" % (kernel, stride, pad), "avg_pool2d", {"X": X}, p,
               ["X"], ["Y"],
               lambda X, k=kernel, s=stride, q=pad: TF.avg_pool2d(
                   X, k, s, q, count_include_pad=True))

    X = nonzero(rng, (2, 3, 8), 3.0)
    yield ("softmax", "softmax", {"X": X}, {}, ["X"], ["Y"], lambda X: TF.softmax(X, -1))
    X = nonzero(rng, (2, 3, 8), 3.0)
    yield ("log_softmax", "log_softmax", {"X": X}, {}, ["X"], ["Y"],
           lambda X: TF.log_softmax(X, -1))

    logits = nonzero(rng, (9, 4), 3.0)
    labels = rng.integers(0, 4, size=(9,)).astype(np.int64)
    yield ("cross_entropy", "cross_entropy", {"logits": logits, "labels": labels}, {},
           ["logits"], ["L"], TF.cross_entropy)

    X = nonzero(rng, (2, 5, 9), 2.0)
    g, bt = nonzero(rng, (9,)), nonzero(rng, (9,))
    yield ("layer_norm", "layer_norm", {"X": X, "gamma": g, "beta": bt}, {},
           ["X", "gamma", "beta"], ["Y"],
           lambda X, g, b: TF.layer_norm(X, (X.shape[-1],), g, b, eps=c32(1e-5)))

    X = nonzero(rng, (2, 4, 5, 3), 2.0)
    g, bt = nonzero(rng, (4,)), nonzero(rng, (4,))
    yield ("batch_norm", "batch_norm", {"X": X, "gamma": g, "beta": bt}, {},
           ["X", "gamma", "beta"], ["Y"],
           lambda X, g, b: TF.batch_norm(X, None, None, g, b, training=True,
                                         eps=c32(1e-5)))

    for name, scale, fn in (("gelu", 3.0, TF.gelu), ("elu", 2.0, TF.elu),
                            ("softplus", 25.0, lambda X: TF.softplus(X, 1, 20)),
                            ("sigmoid", 3.0, torch.sigmoid), ("tanh", 2.0, torch.tanh),
                            ("relu6", 8.0, TF.relu6)):
        X = nonzero(rng, (4, 6), scale)
        yield (name, name, {"X": X}, {}, ["X"], ["Y"], fn)

    S = nonzero(rng, (2, 6, 8), 0.5)
    yield ("squash", "squash", {"S": S}, {}, ["S"], ["V"], t_squash)

    lengths = rng.uniform(0.01, 0.99, size=(6, 4)).astype(np.float32)
    targets = np.eye(4, dtype=np.float32)[rng.integers(0, 4, size=6)]
    yield ("margin_loss", "margin_loss", {"lengths": lengths, "targets": targets}, {},
           ["lengths", "targets"], ["L"], t_margin_loss)

    X, Y = nonzero(rng, (4, 3, 5)), nonzero(rng, (4, 3, 5))
    yield ("mse", "mse", {"X": X, "Y": Y}, {}, ["X", "Y"], ["L"], TF.mse_loss)

    table = nonzero(rng, (9, 5))
    idx = rng.integers(0, 9, size=(4, 3)).astype(np.int64)
    yield ("embedding", "embedding", {"table": table, "idx": idx}, {}, ["table"], ["Y"],
           lambda t, i: TF.embedding(i, t))

    X = nonzero(rng, (2, 6, 3, 4))
    yield ("channel_shuffle<2>", "channel_shuffle", {"X": X}, {"groups": 2}, ["X"], ["Y"],
           lambda X: t_channel_shuffle(X, 2))

    X = nonzero(rng, (3, 6))
    yield ("split<2>", "split", {"X": X}, {"at": 2}, ["X"], ["Y1", "Y2"],
           lambda X: tuple(torch.split(X, [2, 4], dim=-1)))


# ---- the built-in operators (tests/data/builtins.nf), in torch ----

def t_rnn(X, H0, W, U, b):
    h, hs = H0, []
    for t in range(X.shape[0]):
        h = torch.tanh(W @ X[t] + U @ h + b)
        hs.append(h)
    Hs = torch.stack(hs)
    return Hs, (Hs * Hs).mean()


def builtin_cases(rng):
    """Cases of the defs of tests/data/builtins.nf, as cases()."""
    X = nonzero(rng, (3, 2, 4, 5))
    perm = (1, 3, 0, 2)
    yield ("permute<1,3,0,2>", "permute4", {"X": X},
           {"p%d" % k: perm[k] for k in range(4)}, ["X"], ["Y"],
           lambda X: X.permute(*perm))
    X = nonzero(rng, (3, 4, 5))
    yield ("reshape, flatten", "bi_reshape", {"X": X}, {}, ["X"], ["Y", "F", "G"],
           lambda X: (X.reshape(4, -1), X.flatten(1), (X * 2).flatten(0)))
    X = nonzero(rng, (2, 3, 4, 5))
    yield ("flatten(X, 1, 2)", "bi_flatten", {"X": X}, {}, ["X"], ["Y"],
           lambda X: X.flatten(1, 2))
    X = nonzero(rng, (3, 4, 5))
    yield ("transpose", "bi_transpose", {"X": X}, {}, ["X"], ["Y", "Z"],
           lambda X: (X.transpose(0, -1), X.transpose(-2, -1)))
    X = nonzero(rng, (2, 3, 4, 2, 3))
    yield ("permute (rank 5)", "bi_permute", {"X": X}, {}, ["X"], ["Y"],
           lambda X: X.permute(2, 4, 0, 3, 1))
    X = nonzero(rng, (3, 4, 5))
    yield ("sum mean amax amin", "bi_reduce", {"X": X}, {}, ["X"],
           ["S", "M", "L", "Mx", "Mn", "Q"],
           lambda X: (X.sum((0, -1)), X.mean(1, keepdim=True), X.sum(), X.amax(1),
                      (X * X).amin(0), (X * X).mean()))
    A, B, C = nonzero(rng, (3, 2)), nonzero(rng, (3, 4)), nonzero(rng, (3, 2))
    yield ("cat, stack", "bi_cat", {"A": A, "B": B, "C": C}, {}, ["A", "B", "C"],
           ["Y", "Z", "W"],
           lambda A, B, C: (torch.cat([A, B, C], 1), torch.stack([A, C * 2, A + C]),
                            torch.stack([A, C], 1)))
    X = nonzero(rng, (3, 6))
    yield ("chunk", "bi_chunk", {"X": X}, {}, ["X"], ["A", "B", "C"],
           lambda X: tuple(X.chunk(3, -1)))
    X = nonzero(rng, (2, 5))
    yield ("unbind", "bi_unbind", {"X": X}, {}, ["X"], ["R0", "R1"],
           lambda X: tuple(X.unbind(0)))
    X, Y = nonzero(rng, (4, 5)), nonzero(rng, (5,))
    yield ("where, clamp", "bi_where", {"X": X, "Y": Y}, {}, ["X", "Y"], ["Z", "C"],
           lambda X, Y: (torch.where(X > Y, X * Y, 0.5 * X - Y), X.clamp(-0.5, 0.75)))
    X, H0 = nonzero(rng, (4, 3), 0.5), nonzero(rng, (3,), 0.5)
    W, U, b = nonzero(rng, (3, 3), 0.5), nonzero(rng, (3, 3), 0.5), nonzero(rng, (3,), 0.5)
    yield ("X[t], stack(H[1:T+1])", "bi_rnn",
           {"X": X, "H0": H0, "W": W, "U": U, "b": b}, {"T": 4},
           ["X", "H0", "W", "U", "b"], ["Hs", "L"], t_rnn)
    X, c, r = nonzero(rng, (2, 3, 4)), nonzero(rng, (3, 1)), nonzero(rng, (4,))
    yield ("broadcasting", "bi_broadcast", {"X": X, "c": c, "r": r}, {}, ["X", "c", "r"],
           ["Y"], lambda X, c, r: torch.sigmoid(X * c + r) - torch.exp(-X) / 2)
    X, W, b = nonzero(rng, (3, 5)), nonzero(rng, (4, 5)), nonzero(rng, (4,))
    yield ("nested calls", "bi_nested", {"X": X, "W": W, "b": b}, {}, ["X", "W", "b"], ["Y"],
           lambda X, W, b: torch.sigmoid(TF.linear(X, W, b)) * 2 - 1)


# ---- the workloads of examples/workloads.nf (WORKLOADS.md), in torch ----

def t_matmul_loss(A, B, G):
    return ((A @ B) * G).sum()


def t_conv2d_relu_loss(I, Wt):
    y = torch.relu(TF.conv2d(I, Wt, padding=1))
    return (y * y).mean()


def t_lltm_loss(X, H, C, W, b):
    S = H.shape[1]
    for t in range(X.shape[0]):
        gates = TF.linear(torch.cat([X[t], H], dim=1), W, b)
        ig, og, cand = torch.sigmoid(gates[:, :S]), torch.sigmoid(gates[:, S:2 * S]), \
            TF.elu(gates[:, 2 * S:])
        C = C + cand * ig
        H = torch.tanh(C) * og
    return H.sum() + C.sum()


def t_milstm_loss(X, H, C, W, U, alpha, beta1, beta2, b):
    D = H.shape[1]
    Wx = torch.einsum("tni,gi->tng", X, W)  # all steps in one GEMM
    total, n = 0.0, 0
    for t in range(X.shape[0]):
        Uh = H @ U.t()
        pre = alpha * Wx[t] * Uh + beta1 * Wx[t] + beta2 * Uh + b
        i, f, o = (torch.sigmoid(pre[:, k * D:(k + 1) * D]) for k in range(3))
        g = torch.tanh(pre[:, 3 * D:])
        C = f * C + i * g
        H = o * torch.tanh(C)
        total = total + (H * H).sum()
        n += H.numel()
    return total / n


def t_capsnet_loss(u, W, targets):
    us = t_squash(u)
    uhat = torch.einsum("ijde,bie->bjid", W, us)
    blog = torch.zeros(u.shape[0], u.shape[1], W.shape[1], dtype=u.dtype)
    for it in range(3):
        c = torch.softmax(blog, dim=-1)
        s = torch.einsum("bij,bjid->bjd", c, uhat)
        v = t_squash(s)
        if it < 2:
            blog = blog + torch.einsum("bjid,bjd->bij", uhat, v)
    return t_margin_loss(torch.sqrt((v * v).sum(dim=-1)), targets)


def t_mobilenet_dws_loss(X, Wdw, Wpw):
    y = TF.relu6(TF.conv2d(X, Wdw, padding=1, groups=X.shape[1]))
    y = TF.relu6(TF.conv2d(y, Wpw))
    return (y * y).mean()


def workload_cases(rng):
    """The six workloads at small shapes, every float input differentiated
    (as cases())."""
    def case(label, inputs, fn):
        names = list(inputs)
        return (label, label, inputs, {}, names, ["L"], fn)

    yield case("matmul_loss", {"A": nonzero(rng, (4, 6)), "B": nonzero(rng, (6, 5)),
                               "G": nonzero(rng, (4, 5))}, t_matmul_loss)
    yield case("conv2d_relu_loss", {"I": nonzero(rng, (2, 3, 6, 5)),
                                    "Wt": nonzero(rng, (5, 3, 3, 3))}, t_conv2d_relu_loss)
    yield case("lltm_loss", {"X": nonzero(rng, (8, 3, 4)), "H0": nonzero(rng, (3, 5), 0.5),
                             "C0": nonzero(rng, (3, 5), 0.5),
                             "W": nonzero(rng, (15, 9), 0.5), "b": nonzero(rng, (15,), 0.5)},
               t_lltm_loss)
    yield case("milstm_loss", {"X": nonzero(rng, (8, 3, 4)), "H0": nonzero(rng, (3, 4), 0.5),
                               "C0": nonzero(rng, (3, 4), 0.5),
                               "W": nonzero(rng, (16, 4), 0.5),
                               "U": nonzero(rng, (16, 4), 0.5), "alpha": nonzero(rng, (16,)),
                               "beta1": nonzero(rng, (16,)), "beta2": nonzero(rng, (16,)),
                               "b": nonzero(rng, (16,), 0.5)}, t_milstm_loss)
    yield case("capsnet_loss", {"u": nonzero(rng, (3, 6, 4)),
                                "W": nonzero(rng, (6, 4, 5, 4), 0.5),
                                "targets": np.eye(4, dtype=np.float32)[
                                    rng.integers(0, 4, size=3)]}, t_capsnet_loss)
    yield case("mobilenet_dws_loss", {"X": nonzero(rng, (2, 4, 6, 5), 3.0),
                                      "Wdw": nonzero(rng, (4, 1, 3, 3)),
                                      "Wpw": nonzero(rng, (3, 4, 1, 1))},
               t_mobilenet_dws_loss)


def run_case(neoflow, nn, tmp, rng, k, label, defn, inputs, params, wrt, outputs, fn):
    """Runs one case of cases() on the .nf file nn; returns a list of
    (input name, ok, message)."""
    # the reference: float64 copies of the same float32 values
    tensors = []
    for name, arr in inputs.items():
        if arr.dtype.kind == "f":
            t = torch.from_numpy(arr.astype(np.float64))
            t.requires_grad_(name in wrt)
        else:
            t = torch.from_numpy(arr.astype(np.int64))
        tensors.append(t)
    outs = fn(*tensors)
    if not isinstance(outs, tuple):
        outs = (outs,)
    if len(outs) != len(outputs):
        return [("-", False, "the reference has %d outputs, want %d" % (len(outs), len(outputs)))]
    douts = [nonzero(rng, tuple(o.shape)) for o in outs]
    wrt_tensors = [tensors[list(inputs).index(w)] for w in wrt]
    want = torch.autograd.grad(outs, wrt_tensors,
                               [torch.from_numpy(d.astype(np.float64)) for d in douts])

    args = [neoflow, "grad", nn, defn, "--wrt", ",".join(wrt)]
    for name, arr in inputs.items():
        path = os.path.join(tmp, "c%d_%s.npy" % (k, name))
        np.save(path, arr)
        args += ["--in", "%s=%s" % (name, path)]
    for name, v in params.items():
        args += ["--param", "%s=%d" % (name, v)]
    for name, d in zip(outputs, douts):
        path = os.path.join(tmp, "c%d_d%s.npy" % (k, name))
        np.save(path, d)
        # the plain form for one output, the named one for several
        args += ["--dout", path if len(outputs) == 1 else "%s=%s" % (name, path)]
    outdir = os.path.join(tmp, "out%d" % k)
    os.mkdir(outdir)
    args += ["--out", outdir]
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=120)
    except subprocess.TimeoutExpired:
        return [(",".join(wrt), False, "timed out: %s" % " ".join(args))]
    if proc.returncode != 0:
        return [(",".join(wrt), False, "exit %d: %s\n%s" % (
            proc.returncode, " ".join(args), proc.stderr.decode(errors="replace").strip()))]
    results = []
    for name, w in zip(wrt, want):
        path = os.path.join(outdir, "grad_%s.npy" % name)
        if not os.path.exists(path):
            results.append((name, False, "no %s (found %s)" % (path, sorted(os.listdir(outdir)))))
            continue
        got = np.load(path)
        w = w.detach().numpy()
        if got.dtype != np.float32:
            results.append((name, False, "dtype %s, want float32" % got.dtype))
        elif got.shape != w.shape:
            results.append((name, False, "shape %s, want %s" % (got.shape, w.shape)))
        else:
            den = np.linalg.norm(w.ravel())
            err = np.linalg.norm(got.astype(np.float64).ravel() - w.ravel()) / max(den, 1e-30)
            ok = bool(np.isfinite(err) and err <= RTOL)
            results.append((name, ok, "relative error %.3g" % err))
    return results


def main(argv):
    if len(argv) != 3:
        print("usage: torch_check.py NEOFLOW_BINARY NN_NF", file=sys.stderr)
        return 2
    neoflow, nn = argv[1], argv[2]
    torch.manual_seed(0)
    rng = np.random.default_rng(20261201)
    n_pass = n_fail = 0
    print("torch %s, numpy %s" % (torch.__version__, np.__version__))
    workloads = os.path.join(os.path.dirname(os.path.abspath(nn)), "..", "examples",
                             "workloads.nf")
    all_cases = [(nn, c) for c in cases(rng)]
    builtins = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "builtins.nf")
    all_cases += [(builtins, c) for c in builtin_cases(rng)]
    if os.path.exists(workloads):
        all_cases += [(workloads, c) for c in workload_cases(rng)]
    else:
        print("torch_check: %s not found: the workloads are not checked" % workloads)
    with tempfile.TemporaryDirectory(prefix="nf_torch_") as tmp:
        for k, (path, case) in enumerate(all_cases):
            try:
                results = run_case(neoflow, path, tmp, rng, k, *case)
            except Exception as e:  # a broken reference is a failure, not a crash
                results = [("-", False, "%s: %s" % (type(e).__name__, e))]
            for name, ok, msg in results:
                print("%-22s grad_%-8s %s  %s" % (case[0], name, "ok  " if ok else "FAIL", msg))
                if ok:
                    n_pass += 1
                else:
                    n_fail += 1
    print("%d passed, %d failed" % (n_pass, n_fail))
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
