#!/usr/bin/python3
"""extended_check.py - the extended suite's defs (bench/extended.nf) checked
at small shapes through NeoFlow's interpreter, in float64:

  1. twin: the loss and every parameter gradient of `neoflow grad` against
     the PyTorch twin of bench/extended.py (autograd in float64 on the
     same values): relative L2 at most 1e-5 (the benchmark checks the same
     in float32 at the benchmark shapes, with the compiled kernels);
  2. finite differences: for each parameter P and a direction V (random
     plus the gradient's own),
     (L(P + hV) - L(P - hV)) / 2h from `neoflow eval` against <grad P, V>:
     relative difference at most 1e-5 (the step: 1e-6 of P's norm, longer
     where the loss changes too little for float64).

Usage: extended_check.py [--neoflow build/client/neoflow] [--workloads a,b]
                         [--seed S] [--keep DIR]

Prints one line per workload and parameter; exit status 1 when a check
fails, 77 when PyTorch or NumPy is missing.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import extended  # noqa: E402

try:
    import numpy as np
    import torch
except ImportError:
    # run by a python3 without PyTorch (meson may find one): try the
    # system's (Debian's python3-torch) once before skipping
    system_py = "/usr/bin/python3"
    if (os.environ.get("NF_EXT_CHECK_REEXEC") is None and os.path.exists(system_py)
            and os.path.realpath(sys.executable) != os.path.realpath(system_py)):
        os.environ["NF_EXT_CHECK_REEXEC"] = "1"
        os.execv(system_py, [system_py] + sys.argv)
    print("extended_check: PyTorch or NumPy is missing; skipping")
    sys.exit(77)

RTOL_TWIN = 1e-5
RTOL_FD = 1e-5


def init(rng, shape, kind):
    """Values as bench/run draws them (rounded to float32)."""
    n = int(np.prod(shape))
    if kind == "param":
        k = 1.0 / math.sqrt(int(np.prod(shape[1:])) if len(shape) > 1 else shape[0])
        v = rng.uniform(-k, k, n)
    elif kind == "vec":
        v = rng.uniform(0.5, 1.5, n)
    elif isinstance(kind, tuple):
        k = 1.0 / math.sqrt(kind[1])
        v = rng.uniform(-k, k, n)
    else:
        v = rng.uniform(0.1, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return v.astype(np.float32).astype(np.float64).reshape(shape)


def is_param(kind):
    return kind in ("param", "vec") or isinstance(kind, tuple)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s" % (p.returncode, " ".join(cmd),
                                                p.stderr.decode(errors="replace").strip()))
    return p.stdout.decode()


def rel(got, want):
    den = float(np.linalg.norm(want))
    num = float(np.linalg.norm(np.asarray(got, dtype=np.float64) - want))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def check(neoflow, name, rng, tmp):
    """Yields (what, ok, message) for one workload."""
    defn, inputs, _ = extended.WORKLOADS[name]
    nf = os.path.join(HERE, "extended.nf")
    vals = {}
    for (inp, _, kind), shape in zip(inputs, extended.SMALL[name]):
        vals[inp] = init(rng, shape, kind)
    params = [inp for inp, _, kind in inputs if is_param(kind)]

    # PyTorch's twin in float64
    ts = []
    for inp, _, _ in inputs:
        t = torch.from_numpy(vals[inp].copy())
        t.requires_grad_(inp in params)
        ts.append(t)
    loss = extended.FUNCTIONS[name](*ts)
    loss.backward()
    want = {inp: t.grad.numpy() for (inp, _, _), t in zip(inputs, ts) if inp in params}

    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    args = []
    for inp, _, _ in inputs:
        path = os.path.join(d, inp + ".npy")
        np.save(path, vals[inp])
        args += ["--in", "%s=%s" % (inp, path)]
    out = os.path.join(d, "grad")
    run([neoflow, "grad", nf, defn, "--wrt", ",".join(params), "--precision", "f64",
         "--out", out] + args)

    def loss_of(over):
        o = os.path.join(d, "eval")
        a = list(args)
        for inp, v in over.items():
            path = os.path.join(d, "p_" + inp + ".npy")
            np.save(path, v)
            a[a.index("%s=%s" % (inp, os.path.join(d, inp + ".npy")))] = "%s=%s" % (inp, path)
        run([neoflow, "eval", nf, defn, "--precision", "f64", "--out", o] + a)
        return float(np.load(os.path.join(o, "L.npy")))

    L = loss_of({})
    e = abs(L - float(loss)) / abs(float(loss))
    yield "loss", e <= RTOL_TWIN, "twin %.2g (L = %.6g)" % (e, L)
    for p in params:
        g = np.load(os.path.join(out, "grad_%s.npy" % p)).astype(np.float64)
        et = rel(g, want[p])
        # a random direction plus the gradient's own (so that <grad P, V> is
        # not a near-cancelling sum)
        v = rng.standard_normal(vals[p].shape)
        v = v / np.linalg.norm(v) + g / max(np.linalg.norm(g), 1e-300)
        an = float((g * v).sum())
        # a step of 1e-6 of P's norm, longer where the loss would change by
        # less than 1e-10 of itself (cancellation), at most 1e-3 of P's norm
        scale = max(np.linalg.norm(vals[p]), 1e-3) / np.linalg.norm(v)
        h = min(max(1e-6 * scale, 1e-10 * abs(L) / max(abs(an), 1e-300)), 1e-3 * scale)
        fd = (loss_of({p: vals[p] + h * v}) - loss_of({p: vals[p] - h * v})) / (2 * h)
        ef = abs(fd - an) / max(abs(an), 1e-300)
        yield ("grad_" + p, et <= RTOL_TWIN and ef <= RTOL_FD,
               "twin %.2g, finite differences %.2g" % (et, ef))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--neoflow", default=os.path.join(ROOT, "build", "client", "neoflow"))
    ap.add_argument("--workloads", default=",".join(extended.ORDER))
    ap.add_argument("--seed", type=int, default=20261210)
    ap.add_argument("--keep", help="keep the files in this directory")
    a = ap.parse_args()
    os.environ.setdefault("NEOFLOW_LIB", os.path.join(ROOT, "lib"))
    torch.set_num_threads(1)
    names = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for w in names:
        if w not in extended.WORKLOADS:
            ap.error("unknown workload %r (known: %s)" % (w, ", ".join(extended.ORDER)))
    n_ok = n_bad = 0
    with tempfile.TemporaryDirectory(prefix="nf_ext_") as tmp:
        base = a.keep or tmp
        os.makedirs(base, exist_ok=True)
        for name in names:
            rng = np.random.default_rng([a.seed, extended.ORDER.index(name)])
            try:
                results = list(check(a.neoflow, name, rng, base))
            except Exception as e:  # a failing tool or twin is a failure, not a crash
                results = [("-", False, "%s: %s" % (type(e).__name__, e))]
            for what, ok, msg in results:
                print("%-18s %-10s %s  %s" % (name, what, "ok  " if ok else "FAIL", msg))
                sys.stdout.flush()
                n_ok += ok
                n_bad += not ok
    print("%d passed, %d failed" % (n_ok, n_bad))
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
