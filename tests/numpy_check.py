#!/usr/bin/env python3
"""numpy_check.py - lib/nn.nf through the `neoflow eval` tool, against NumPy.

Usage: numpy_check.py NEOFLOW_BINARY NN_NF

For a representative set of library defs, writes seeded random float32
inputs (int64 labels and indices) to .npy files in a temporary directory,
runs `neoflow eval NN_NF DEF --in NAME=FILE ... [--param NAME=V ...] --out
DIR`, reads DIR/<output>.npy and compares it with a NumPy implementation
of the PyTorch operator computed in float64: the relative error
||got - want|| / ||want|| must be at most 1e-5.  Prints one line per case
and exits 1 if any fails, 77 (skipped) without NumPy.
"""

import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    # Meson may find a python3 (pyenv, venv) without NumPy while the
    # system's has it: try that one once before skipping.
    system_py = "/usr/bin/python3"
    if (os.environ.get("NF_NUMPY_CHECK_REEXEC") is None
            and os.path.exists(system_py)
            and os.path.realpath(sys.executable) != os.path.realpath(system_py)):
        os.environ["NF_NUMPY_CHECK_REEXEC"] = "1"
        os.execv(system_py, [system_py] + sys.argv)
    print("numpy_check: NumPy is not available; skipping")
    sys.exit(77)

RTOL = 1e-5
F32_LOWEST = float(np.finfo(np.float32).min)


def c32(x):
    """A float constant as the f32 value an f32 def computes with."""
    return float(np.float32(x))


# ---- NumPy references (float64) ----

def ref_matmul(A, B):
    return A @ B


def ref_linear(X, W, b):
    return X @ W.T + b


def ref_conv2d(I, W, stride=1, pad=0, dilation=1, groups=1):
    N, C, H, Wd = I.shape
    K, CG, R, S = W.shape
    assert C == CG * groups
    OH = (H + 2 * pad - dilation * (R - 1) - 1) // stride + 1
    OW = (Wd + 2 * pad - dilation * (S - 1) - 1) // stride + 1
    Ip = np.pad(I, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((N, K, OH, OW))
    kpg = K // groups
    for g in range(groups):
        Ig = Ip[:, g * CG:(g + 1) * CG]            # N, CG, Hp, Wp
        Wg = W[g * kpg:(g + 1) * kpg]              # kpg, CG, R, S
        for r in range(R):
            for s in range(S):
                h0, w0 = r * dilation, s * dilation
                win = Ig[:, :, h0:h0 + stride * (OH - 1) + 1:stride,
                         w0:w0 + stride * (OW - 1) + 1:stride]  # N, CG, OH, OW
                out[:, g * kpg:(g + 1) * kpg] += np.einsum(
                    "nchw,kc->nkhw", win, Wg[:, :, r, s])
    return out


def ref_pool(X, kernel, stride, pad, mode):
    N, C, H, W = X.shape
    OH = (H + 2 * pad - kernel) // stride + 1
    OW = (W + 2 * pad - kernel) // stride + 1
    fill = -np.inf if mode == "max" else 0.0
    Xp = np.pad(X, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    acc = np.full((N, C, OH, OW), -np.inf if mode == "max" else 0.0)
    for a in range(kernel):
        for b in range(kernel):
            win = Xp[:, :, a:a + stride * (OH - 1) + 1:stride,
                     b:b + stride * (OW - 1) + 1:stride]
            acc = np.maximum(acc, win) if mode == "max" else acc + win
    return acc if mode == "max" else acc / (kernel * kernel)


def ref_softmax(X):
    e = np.exp(X - X.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ref_log_softmax(X):
    m = X.max(axis=-1, keepdims=True)
    return X - m - np.log(np.exp(X - m).sum(axis=-1, keepdims=True))


def ref_cross_entropy(logits, labels):
    lsm = ref_log_softmax(logits)
    return np.array(-lsm[np.arange(len(labels)), labels].mean())


def ref_layer_norm(X, gamma, beta):
    mu = X.mean(axis=-1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
    return (X - mu) / np.sqrt(var + c32(1e-5)) * gamma + beta


def ref_batch_norm(X, gamma, beta):
    mu = X.mean(axis=(0, 2, 3), keepdims=True)
    var = ((X - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return ((X - mu) / np.sqrt(var + c32(1e-5)) * gamma[None, :, None, None]
            + beta[None, :, None, None])


def ref_gelu(X):
    from math import erf, sqrt
    verf = np.vectorize(erf)
    return 0.5 * X * (1.0 + verf(X * c32(1 / sqrt(2.0))))


def ref_softplus(X):
    return np.where(X > 20, X, np.log1p(np.exp(np.minimum(X, 20))))


def ref_squash(S):
    n2 = (S * S).sum(axis=-1, keepdims=True)
    return n2 / (1 + n2) * S / np.sqrt(n2 + c32(1e-8))


def ref_margin_loss(lengths, targets):
    pos = np.maximum(c32(0.9) - lengths, 0) ** 2
    neg = np.maximum(lengths - c32(0.1), 0) ** 2
    return np.array((targets * pos + 0.5 * (1 - targets) * neg).sum(axis=1).mean())


def ref_channel_shuffle(X, groups):
    N, C, H, W = X.shape
    return X.reshape(N, groups, C // groups, H, W).transpose(0, 2, 1, 3, 4).reshape(N, C, H, W)


# ---- cases ----

def nonzero(rng, shape, scale=1.0):
    """float32 values in scale * ([-1, -0.1] u [0.1, 1]): never zero."""
    v = rng.uniform(0.1, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return (scale * v).astype(np.float32)


def cases(rng):
    """Yields (label, def, inputs {name: array}, params {name: int},
    output name, reference function of the float64 inputs)."""
    A, B = nonzero(rng, (7, 13)), nonzero(rng, (13, 5))
    yield ("matmul", "matmul", {"A": A, "B": B}, {}, "C",
           lambda A, B: ref_matmul(A, B))

    A, B = nonzero(rng, (2, 3, 7, 13)), nonzero(rng, (2, 3, 13, 5))
    yield ("batch_matmul", "batch_matmul", {"A": A, "B": B}, {}, "C",
           lambda A, B: np.matmul(A, B))

    X, W, b = nonzero(rng, (3, 4, 13)), nonzero(rng, (5, 13)), nonzero(rng, (5,))
    yield ("linear", "linear", {"X": X, "W": W, "b": b}, {}, "Y", ref_linear)

    I, W = nonzero(rng, (2, 6, 11, 11)), nonzero(rng, (9, 2, 3, 3))
    p = {"stride": 2, "pad": 2, "dilation": 2, "groups": 3}
    yield ("conv2d<2,2,2,3>", "conv2d", {"I": I, "W": W}, p, "O",
           lambda I, W: ref_conv2d(I, W, 2, 2, 2, 3))

    I, W = nonzero(rng, (2, 3, 9, 7)), nonzero(rng, (4, 3, 3, 2))
    yield ("conv2d defaults", "conv2d", {"I": I, "W": W}, {}, "O",
           lambda I, W: ref_conv2d(I, W))

    I, W = nonzero(rng, (2, 8, 9, 9)), nonzero(rng, (8, 1, 3, 3))
    yield ("conv2d depthwise", "conv2d", {"I": I, "W": W}, {"pad": 1, "groups": 8}, "O",
           lambda I, W: ref_conv2d(I, W, 1, 1, 1, 8))

    for mode in ("max", "avg"):
        X = nonzero(rng, (2, 3, 11, 9))
        yield ("%s_pool2d<3,2,1>" % mode, "%s_pool2d" % mode, {"X": X},
               {"kernel": 3, "stride": 2, "pad": 1}, "Y",
               lambda X, m=mode: ref_pool(X, 3, 2, 1, m))
        X = nonzero(rng, (2, 3, 8, 7))
        yield ("%s_pool2d<2>" % mode, "%s_pool2d" % mode, {"X": X}, {"kernel": 2}, "Y",
               lambda X, m=mode: ref_pool(X, 2, 2, 0, m))

    X = nonzero(rng, (3, 4, 9), 5.0)
    yield ("softmax", "softmax", {"X": X}, {}, "Y", ref_softmax)
    yield ("log_softmax", "log_softmax", {"X": X}, {}, "Y", ref_log_softmax)

    logits = nonzero(rng, (7, 5), 3.0)
    labels = rng.integers(0, 5, size=(7,)).astype(np.int64)
    yield ("cross_entropy", "cross_entropy", {"logits": logits, "labels": labels}, {}, "L",
           lambda lg, lb: ref_cross_entropy(lg, lb.astype(np.int64)))

    X = nonzero(rng, (3, 4, 11), 2.0)
    g, bt = nonzero(rng, (11,)), nonzero(rng, (11,))
    yield ("layer_norm", "layer_norm", {"X": X, "gamma": g, "beta": bt}, {}, "Y",
           ref_layer_norm)

    X = nonzero(rng, (3, 5, 6, 7), 2.0)
    g, bt = nonzero(rng, (5,)), nonzero(rng, (5,))
    yield ("batch_norm", "batch_norm", {"X": X, "gamma": g, "beta": bt}, {}, "Y",
           ref_batch_norm)

    X = nonzero(rng, (3, 5, 7), 3.0)
    yield ("gelu", "gelu", {"X": X}, {}, "Y", ref_gelu)

    X = nonzero(rng, (3, 5, 7), 25.0)
    yield ("softplus", "softplus", {"X": X}, {}, "Y", ref_softplus)
    yield ("silu", "silu", {"X": X}, {}, "Y", lambda X: X / (1 + np.exp(-X)))
    yield ("expm1", "expm1", {"X": X}, {}, "Y", np.expm1)
    Xs = (X * 1e-4).astype(np.float32)  # near 0: exp(x) - 1 would lose digits
    yield ("expm1 near 0", "expm1", {"X": Xs}, {}, "Y", np.expm1)
    Xp = (np.abs(X) - 0.4).astype(np.float32)
    yield ("log1p", "log1p", {"X": Xp}, {}, "Y", np.log1p)
    yield ("log1p near 0", "log1p", {"X": Xs}, {}, "Y", np.log1p)

    S = nonzero(rng, (3, 10, 16), 0.5)
    yield ("squash", "squash", {"S": S}, {}, "V", ref_squash)

    lengths = rng.uniform(0.01, 0.99, size=(7, 10)).astype(np.float32)
    targets = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size=7)]
    yield ("margin_loss", "margin_loss", {"lengths": lengths, "targets": targets}, {}, "L",
           ref_margin_loss)

    X = nonzero(rng, (2, 12, 3, 5))
    yield ("channel_shuffle<3>", "channel_shuffle", {"X": X}, {"groups": 3}, "Y",
           lambda X: ref_channel_shuffle(X, 3))


    A, C = nonzero(rng, (3, 4, 5)), nonzero(rng, (3, 4, 7))
    yield ("concat", "concat", {"A": A, "C": C}, {}, "Y",
           lambda A, C: np.concatenate([A, C], axis=-1))

    table = nonzero(rng, (11, 6))
    idx = rng.integers(0, 11, size=(3, 4)).astype(np.int64)
    yield ("embedding", "embedding", {"table": table, "idx": idx}, {}, "Y",
           lambda t, i: t[i.astype(np.int64)])


def run_case(neoflow, nn, tmp, k, label, defn, inputs, params, out_name, fn):
    args = [neoflow, "eval", nn, defn]
    for name, arr in inputs.items():
        path = os.path.join(tmp, "c%d_%s.npy" % (k, name))
        np.save(path, arr)
        args += ["--in", "%s=%s" % (name, path)]
    for name, v in params.items():
        args += ["--param", "%s=%d" % (name, v)]
    outdir = os.path.join(tmp, "out%d" % k)
    os.mkdir(outdir)
    args += ["--out", outdir]
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=120)
    except subprocess.TimeoutExpired:
        return False, "timed out: %s" % " ".join(args)
    if proc.returncode != 0:
        return False, "exit %d: %s\n%s" % (proc.returncode, " ".join(args),
                                           proc.stderr.decode(errors="replace").strip())
    path = os.path.join(outdir, out_name + ".npy")
    if not os.path.exists(path):
        return False, "no %s (found %s)" % (path, sorted(os.listdir(outdir)))
    got = np.load(path)
    want = np.asarray(fn(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                           for a in inputs.values()]), dtype=np.float64)
    if got.dtype != np.float32:
        return False, "output dtype %s, want float32" % got.dtype
    if got.shape != want.shape:
        return False, "output shape %s, want %s" % (got.shape, want.shape)
    den = np.linalg.norm(want.ravel())
    err = np.linalg.norm(got.astype(np.float64).ravel() - want.ravel()) / max(den, 1e-30)
    if not np.isfinite(err) or err > RTOL:
        return False, "relative error %.3g" % err
    return True, "relative error %.3g" % err


def builtin_cases(rng):
    """Cases of the defs of tests/data/builtins.nf, as cases() (one per
    output)."""
    X = nonzero(rng, (2, 3, 4, 5))
    for perm in ((2, 0, 3, 1), (3, 2, 1, 0), (0, 1, 3, 2)):
        yield ("permute<%d,%d,%d,%d>" % perm, "permute4", {"X": X},
               {"p%d" % k: perm[k] for k in range(4)}, "Y",
               lambda X, p=perm: np.transpose(X, p))
    X = nonzero(rng, (3, 4, 5))
    yield ("reshape(X, B, -1)", "bi_reshape", {"X": X}, {}, "Y", lambda X: X.reshape(4, -1))
    yield ("flatten(X)", "bi_reshape", {"X": X}, {}, "F", lambda X: X.reshape(3, -1))
    yield ("flatten(X * 2, 0)", "bi_reshape", {"X": X}, {}, "G", lambda X: (X * 2).ravel())
    X = nonzero(rng, (2, 3, 4, 5))
    yield ("flatten(X, 1, 2)", "bi_flatten", {"X": X}, {}, "Y", lambda X: X.reshape(2, 12, 5))
    X = nonzero(rng, (3, 4, 5))
    yield ("transpose(X, 0, -1)", "bi_transpose", {"X": X}, {}, "Y",
           lambda X: np.swapaxes(X, 0, -1))
    yield ("transpose(X)", "bi_transpose", {"X": X}, {}, "Z", lambda X: np.swapaxes(X, -2, -1))
    X = nonzero(rng, (2, 3, 4, 2, 3))
    yield ("permute (rank 5)", "bi_permute", {"X": X}, {}, "Y",
           lambda X: np.transpose(X, (2, 4, 0, 3, 1)))
    X = nonzero(rng, (3, 4, 5))
    for out, fn in (("S", lambda X: X.sum(axis=(0, 2))),
                    ("M", lambda X: X.mean(axis=1, keepdims=True)),
                    ("L", lambda X: np.array(X.sum())), ("Mx", lambda X: X.max(axis=1)),
                    ("Mn", lambda X: (X * X).min(axis=0)),
                    ("Q", lambda X: np.array((X * X).mean()))):
        yield ("reduce " + out, "bi_reduce", {"X": X}, {}, out, fn)
    A, B, C = nonzero(rng, (3, 2)), nonzero(rng, (3, 4)), nonzero(rng, (3, 2))
    abc = {"A": A, "B": B, "C": C}
    yield ("cat<axis = 1>", "bi_cat", abc, {}, "Y",
           lambda A, B, C: np.concatenate([A, B, C], axis=1))
    yield ("stack", "bi_cat", abc, {}, "Z", lambda A, B, C: np.stack([A, C * 2, A + C]))
    yield ("stack<axis = 1>", "bi_cat", abc, {}, "W", lambda A, B, C: np.stack([A, C], axis=1))
    X = nonzero(rng, (3, 6))
    for k, out in enumerate("ABC"):
        yield ("chunk " + out, "bi_chunk", {"X": X}, {}, out,
               lambda X, k=k: np.split(X, 3, axis=-1)[k])
    X = nonzero(rng, (2, 5))
    yield ("unbind", "bi_unbind", {"X": X}, {}, "R1", lambda X: X[1])
    X, Y = nonzero(rng, (4, 5)), nonzero(rng, (5,))
    yield ("where", "bi_where", {"X": X, "Y": Y}, {}, "Z",
           lambda X, Y: np.where(X > Y, X * Y, 0.5 * X - Y))
    yield ("clamp", "bi_where", {"X": X, "Y": Y}, {}, "C", lambda X, Y: np.clip(X, -0.5, 0.75))


def main(argv):
    if len(argv) != 3:
        print("usage: numpy_check.py NEOFLOW_BINARY NN_NF", file=sys.stderr)
        return 2
    neoflow, nn = argv[1], argv[2]
    rng = np.random.default_rng(20261130)
    n_pass = n_fail = 0
    builtins = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "builtins.nf")
    all_cases = [(nn, c) for c in cases(rng)] + [(builtins, c) for c in builtin_cases(rng)]
    with tempfile.TemporaryDirectory(prefix="nf_numpy_") as tmp:
        for k, (path, case) in enumerate(all_cases):
            ok, msg = run_case(neoflow, path, tmp, k, *case)
            print("%-22s %s  %s" % (case[0], "ok  " if ok else "FAIL", msg))
            if ok:
                n_pass += 1
            else:
                n_fail += 1
    print("%d passed, %d failed" % (n_pass, n_fail))
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
