#!/usr/bin/env python3
"""cookbook_check.py - every idiom of docs/language.md's "## Cookbook",
run through NeoFlow and against its PyTorch snippet.

Usage: cookbook_check.py NEOFLOW_BINARY LANGUAGE_MD

The cookbook is a list of pairs: a fenced ```python block defining a
function, then a fenced ```nf block defining a def of the same name. The
.nf block's comment lines say how to test it:

    # shapes: NAME=d1,d2 ...   the inputs' shapes (NAME= for a scalar)
    # ints: NAME<K ...         integer inputs, uniform in [0, K)
    # train                    also `neoflow train --data synthetic`

For each pair this writes the .nf to a temporary file and checks that

  - `neoflow check FILE` accepts it;
  - `neoflow eval FILE DEF --in ...` (the interpreter, float32) and
    `--engine compiled` (a CPU kernel) give the PyTorch function's outputs
    computed in float64 from the same inputs (relative L2 error at most
    1e-5 for the interpreter, 1e-4 for the kernel);
  - `neoflow grad FILE DEF --wrt <every float input> --dout ...` gives
    PyTorch's autograd gradients for a random adjoint of every output
    (relative L2 at most 1e-5);
  - `neoflow train --data synthetic --steps 3 --daemon none` exits 0 and
    prints a finite loss: with `# train` the def itself (its first output
    the loss, its `param`s trained); otherwise a def added to the file
    whose loss is the mean square of the idiom's outputs, with the
    idiom's float inputs after the first trained as parameters
    (`--params`; the only one where there is one).

The PyTorch function takes the def's inputs in order (a `param` is an
input after the declared ones, in statement order) and returns its
outputs in order. Prints one line per check; exits 1 if any fails, 77
(skipped) without PyTorch.
"""

import math
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    system_py = "/usr/bin/python3"
    if (os.environ.get("NF_COOKBOOK_REEXEC") is None and os.path.exists(system_py)
            and os.path.realpath(sys.executable) != os.path.realpath(system_py)):
        os.environ["NF_COOKBOOK_REEXEC"] = "1"
        os.execv(system_py, [system_py] + sys.argv)
    print("cookbook_check: PyTorch (or NumPy) is not available; skipping")
    sys.exit(77)

RTOL = 1e-5
RTOL_COMPILED = 1e-4
MIN_PAIRS = 20


def pairs(md):
    """The (title, python, nf) triples of the Cookbook section."""
    start = md.find("\n## Cookbook")
    if start < 0:
        raise SystemExit("cookbook_check: no '## Cookbook' section")
    end = md.find("\n## ", start + 5)
    sec = md[start:end if end > 0 else len(md)]
    out, title, py = [], "?", None
    for m in re.finditer(r"^### ([^\n]*)$|^```(python|nf)\n(.*?)^```$", sec, re.M | re.S):
        if m.group(1):
            title, py = m.group(1).strip(), None
        elif m.group(2) == "python":
            py = m.group(3)
        else:
            if py is None:
                raise SystemExit("cookbook_check: '%s': an nf block without a python block" % title)
            out.append((title, py, m.group(3)))
            py = None
    return out


def signature(nf, name):
    """The input names/dtypes and output names of def `name` in nf: its
    declared inputs, then its params in order."""
    m = re.search(r"def\s+%s\s*(<[^>]*>)?\s*\((.*?)\)\s*->\s*\((.*?)\)" % re.escape(name), nf,
                  re.S)
    if not m:
        raise ValueError("no def %s" % name)

    def decls(text):
        res = []
        for part in re.finditer(r"(\w+)\s*:\s*(\w+)\s*\[", text):
            res.append((part.group(1), part.group(2)))
        return res
    ins = decls(m.group(2))
    ins += [(p.group(1), p.group(2)) for p in re.finditer(r"^\s*param\s+(\w+)\s*:\s*(\w+)", nf, re.M)]
    outs = [n for n, _ in decls(m.group(3))]
    return ins, outs


def directives(nf):
    shapes, ints, train = {}, {}, False
    for line in nf.splitlines():
        line = line.strip()
        if line.startswith("# shapes:"):
            for item in line[len("# shapes:"):].split():
                name, _, dims = item.partition("=")
                shapes[name] = tuple(int(d) for d in dims.split(",") if d)
        elif line.startswith("# ints:"):
            for item in line[len("# ints:"):].split():
                name, _, hi = item.partition("<")
                ints[name] = int(hi)
        elif line == "# train":
            train = True
    return shapes, ints, train


def run(args, timeout=300):
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out: " + " ".join(args)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def rel(got, want):
    den = np.linalg.norm(want.ravel())
    return np.linalg.norm(got.astype(np.float64).ravel() - want.ravel()) / max(den, 1e-30)


def check_pair(neoflow, tmp, k, title, py, nf, rng):
    """A list of (what, ok, message)."""
    name = re.search(r"^def\s+(\w+)\s*\(", py, re.M).group(1)
    path = os.path.join(tmp, "cook%d.nf" % k)
    with open(path, "w") as f:
        f.write(nf)
    res = []
    rc, out = run([neoflow, "check", path])
    res.append(("check", rc == 0, out.strip().splitlines()[-1] if rc == 0 else out.strip()))
    if rc != 0:
        return res
    ins, outs = signature(nf, name)
    shapes, ints, train = directives(nf)
    arrays = {}
    for n, dt in ins:
        if n not in shapes:
            return res + [("inputs", False, "no shape for input %s in '# shapes:'" % n)]
        if dt.startswith("i"):
            arrays[n] = rng.integers(0, ints.get(n, 2), size=shapes[n]).astype(np.int64)
        else:
            arrays[n] = (rng.standard_normal(shapes[n]) * 0.5).astype(np.float32)
    in_args = []
    for n, arr in arrays.items():
        p = os.path.join(tmp, "c%d_%s.npy" % (k, n))
        np.save(p, arr)
        in_args += ["--in", "%s=%s" % (n, p)]
    # the reference, in float64
    ns = {"torch": torch, "F": F, "math": math}
    exec(py, ns)
    tens = []
    for n, dt in ins:
        a = arrays[n]
        t = torch.from_numpy(a.astype(np.float64) if a.dtype.kind == "f" else a)
        if a.dtype.kind == "f":
            t.requires_grad_(True)
        tens.append(t)
    want = ns[name](*tens)
    if not isinstance(want, tuple):
        want = (want,)
    if len(want) != len(outs):
        return res + [("reference", False, "%d outputs, the def has %d" % (len(want), len(outs)))]
    # eval: the interpreter and a compiled kernel
    for engine, tol in (("interp", RTOL), ("compiled", RTOL_COMPILED)):
        d = os.path.join(tmp, "e%d_%s" % (k, engine))
        os.mkdir(d)
        rc, out = run([neoflow, "eval", path, name] + in_args + ["--engine", engine, "--out", d])
        if rc != 0:
            res.append(("eval " + engine, False, out.strip()))
            continue
        worst, msg = 0.0, ""
        for o, w in zip(outs, want):
            got = np.load(os.path.join(d, o + ".npy"))
            w = w.detach().numpy()
            if got.shape != w.shape:
                msg = "%s: shape %s, want %s" % (o, got.shape, w.shape)
                worst = float("inf")
                break
            worst = max(worst, rel(got, w))
        ok = bool(np.isfinite(worst) and worst <= tol)
        res.append(("eval " + engine, ok, msg or "relative error %.3g" % worst))
    # grad: every float input, a random adjoint per output
    wrt = [n for n, dt in ins if not dt.startswith("i")]
    douts = [rng.standard_normal(tuple(w.shape)).astype(np.float32) for w in want]
    wt = [t for t, (n, dt) in zip(tens, ins) if not dt.startswith("i")]
    gw = torch.autograd.grad(want, wt, [torch.from_numpy(x.astype(np.float64)) for x in douts],
                             allow_unused=True)
    args = [neoflow, "grad", path, name, "--wrt", ",".join(wrt)] + in_args
    for o, x in zip(outs, douts):
        p = os.path.join(tmp, "c%d_d%s.npy" % (k, o))
        np.save(p, x)
        args += ["--dout", p if len(outs) == 1 else "%s=%s" % (o, p)]
    d = os.path.join(tmp, "g%d" % k)
    os.mkdir(d)
    rc, out = run(args + ["--out", d])
    if rc != 0:
        res.append(("grad", False, out.strip()))
    else:
        worst, msg = 0.0, ""
        for n, g in zip(wrt, gw):
            got = np.load(os.path.join(d, "grad_%s.npy" % n))
            w = np.zeros(got.shape) if g is None else g.numpy()
            if got.shape != w.shape:
                msg = "grad_%s: shape %s, want %s" % (n, got.shape, w.shape)
                worst = float("inf")
                break
            worst = max(worst, rel(got, w))
        ok = bool(np.isfinite(worst) and worst <= RTOL)
        res.append(("grad " + ",".join(wrt), ok, msg or "relative error %.3g" % worst))
    targs = [neoflow, "train", path, name, "--data", "synthetic", "--steps", "3",
             "--daemon", "none", "--threads", "1", "--json"]
    if not train:
        # a loss around the idiom: the mean square of its outputs
        decl = ", ".join("%s: %s[%s]" % (n, dt, ", ".join(str(d) for d in shapes[n]))
                         for n, dt in ins)
        res_names = ["R%d" % j for j in range(len(outs))]
        body = "  %s = %s(%s)\n  L = %s\n" % (
            ", ".join(res_names), name, ", ".join(n for n, _ in ins),
            " + ".join("mean(%s * %s)" % (r, r) for r in res_names))
        with open(path, "a") as f:
            f.write("\ndef cookbook_loss(%s) -> (L: f32[]) {\n%s}\n" % (decl, body))
        floats = [n for n, dt in ins if not dt.startswith("i")]
        targs[3] = "cookbook_loss"
        # (with one float input, it is what is trained)
        targs += ["--params", ",".join(floats[1:] if len(floats) > 1 else floats)]
        if ints:
            targs += ["--classes", str(min(ints.values()))]
    rc, out = run(targs)
    loss = re.findall(r'"loss":\s*([-+0-9.eEinfa]+)', out)
    ok = rc == 0 and bool(loss) and math.isfinite(float(loss[-1]))
    res.append(("train", ok, "loss %s" % loss[-1] if ok else out.strip()[-600:]))
    return res


def main(argv):
    if len(argv) != 3:
        print("usage: cookbook_check.py NEOFLOW_BINARY LANGUAGE_MD", file=sys.stderr)
        return 2
    neoflow, md_path = argv[1], argv[2]
    with open(md_path) as f:
        md = f.read()
    ps = pairs(md)
    print("torch %s, numpy %s: %d idioms" % (torch.__version__, np.__version__, len(ps)))
    n_fail = 0
    if len(ps) < MIN_PAIRS:
        print("FAIL  the cookbook has %d idioms, fewer than %d" % (len(ps), MIN_PAIRS))
        n_fail += 1
    rng = np.random.default_rng(20261205)
    with tempfile.TemporaryDirectory(prefix="nf_cookbook_") as tmp:
        for k, (title, py, nf) in enumerate(ps):
            try:
                results = check_pair(neoflow, tmp, k, title, py, nf, rng)
            except Exception as e:  # a broken snippet is a failure, not a crash
                results = [("-", False, "%s: %s" % (type(e).__name__, e))]
            for what, ok, msg in results:
                print("%-4s %-52.52s %-22s %s" % ("ok" if ok else "FAIL", title, what, msg))
                n_fail += not ok
    print("%d failed" % n_fail)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
