#!/usr/bin/python3
"""torch_workloads.py - PyTorch's side of the peer benchmark (bench/run,
bench/README.md): the six workloads of WORKLOADS.md as the fastest natural
PyTorch a competent user would write for each, with exactly the semantics
of examples/workloads.nf, run eager or under torch.compile.

Usage: torch_workloads.py WORKLOAD --dir D --threads T [--peer eager|compile]
           [--twins MODULE] [--steps-min 20] [--seconds-min 2] [--warmup 5]
           [--dump DIR] [--ref64 DIR]

D holds meta.json (written by bench/run: the def's inputs in order, their
shapes, which are parameters, the learning rate) and NAME.f32 for every
input (raw little-endian f32).  Like bench/nf_bench: the warm-up steps,
then the parameters back to their initial values and one step whose loss
and parameter gradients go to DIR/loss.f32 and DIR/grad_NAME.f32, then
the parameters back again and the timed steps (forward, loss, backward,
SGD update with torch.optim.SGD, loss.item()); prints one JSON line with
the median ms per step.  --ref64 DIR writes the loss and gradients of the
same step computed eagerly in float64 from the same float32 values (a
reference for both sides) and exits.

--peer compile (PyTorch 2.x) compiles the twin (forward and loss; the
backward comes compiled with it) with torch.compile's default mode and
times two variants side by side, in blocks of steps taken in turn: the SGD
step eager, and the SGD step compiled too; the faster one is the figure
(median_ms, "variant"), both are in the JSON line, and compile_s is the
time the warm-up steps took beyond the steady step (Inductor's compiling,
or loading its cache), never part of the figure.

The twins are looked up by workload name: TWINS here, then the TWINS
dict of each --twins MODULE (a module beside this file: name -> function
of the def's inputs in order, or (function, prepare) where prepare(name,
tensor) returns the tensor in the layout the twin wants, e.g. channels
last, before it becomes a parameter).

OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS (= T) and
OMP_WAIT_POLICY=PASSIVE must be in the environment before torch loads:
bench/run sets them; this script sets them too when missing, before
importing torch.
"""

import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--peer", default="eager", choices=["eager", "compile"],
                    help="eager (default) or compile (torch.compile, PyTorch 2.x)")
    ap.add_argument("--twins", action="append", default=[],
                    help="a module beside this file with more twins (TWINS dict)")
    ap.add_argument("--steps-min", type=int, default=20)
    ap.add_argument("--seconds-min", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dump")
    ap.add_argument("--ref64")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (PyTorch CUDA)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    # the thread variables before torch loads (it reads them once)
    ARGS = parse_args(sys.argv[1:])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(ARGS.threads))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402


def strict_fp32():
    """IEEE f32 products and convolutions on a GPU, as NeoFlow computes
    them (cuBLAS's default math, cuDNN with FMA math only): PyTorch lets
    cuDNN use TF32 tensor cores by default on Ampere and later, which
    would compare 10-bit-mantissa convolutions with f32 ones.  Returns
    what was set, for the JSON line."""
    b = torch.backends
    conv = getattr(b.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9
        b.cuda.matmul.fp32_precision = "ieee"
        conv.fp32_precision = "ieee"
    else:
        b.cuda.matmul.allow_tf32 = False
        b.cudnn.allow_tf32 = False
    return "ieee"


# The twins.  matmul and conv2d are tests/torch_check.py's, which checks
# the semantics against NeoFlow's gradients at small shapes; the others
# are written here the way a user who knows PyTorch on a CPU would, each
# kept only where it measured faster than the plain transcription (side
# by side, PyTorch 1.13 and 2.x; bench/README.md).
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from torch_check import (t_matmul_loss as matmul_loss,  # noqa: E402
                         t_conv2d_relu_loss as conv2d_relu_loss,
                         t_squash as squash, t_margin_loss as margin_loss)


def lltm_loss(X, H, C, W, b):
    # one linear on [x, h] per step with chunked gates (the tutorial's cell)
    for t in range(X.shape[0]):
        gates = TF.linear(torch.cat([X[t], H], dim=1), W, b)
        ig, og, cand = gates.chunk(3, dim=1)
        C = C + TF.elu(cand) * torch.sigmoid(ig)
        H = torch.tanh(C) * torch.sigmoid(og)
    return H.sum() + C.sum()


def milstm_loss(X, H, C, W, U, alpha, beta1, beta2, b):
    Wx = TF.linear(X, W)  # all steps in one GEMM
    total, n = 0.0, 0
    for t in range(X.shape[0]):
        Uh = TF.linear(H, U)
        pre = alpha * Wx[t] * Uh + beta1 * Wx[t] + beta2 * Uh + b
        i, f, o, g = pre.chunk(4, dim=1)
        C = torch.sigmoid(f) * C + torch.sigmoid(i) * torch.tanh(g)
        H = torch.sigmoid(o) * torch.tanh(C)
        total = total + (H * H).sum()
        n += H.numel()
    return total / n


def capsnet_loss(u, W, targets):
    # The routing logits are kept as [b, j, i] (softmax over j = dim 1), so
    # that every einsum of the routing takes uhat [b, j, i, d] in its own
    # layout: a batched product per (b, j) with no transposed copy of uhat
    # forward or backward (about 1.3x faster than logits as [b, i, j]).
    us = squash(u)
    uhat = torch.einsum("ijde,bie->bjid", W, us)
    blog = torch.zeros(u.shape[0], W.shape[1], u.shape[1], dtype=u.dtype, device=u.device)
    for it in range(3):
        c = torch.softmax(blog, dim=1)
        v = squash(torch.einsum("bji,bjid->bjd", c, uhat))
        if it < 2:
            blog = blog + torch.einsum("bjid,bjd->bji", uhat, v)
    return margin_loss(torch.sqrt((v * v).sum(dim=-1)), targets)


def mobilenet_dws_loss(X, Wdw, Wpw):
    # Channels last (prepare below: the data and the weights are stored so
    # once): oneDNN's depthwise kernels want it, and the pointwise 1x1
    # convolution is then a linear over the channels of an [N, H, W, C]
    # view, one GEMM (as ConvNeXt writes its 1x1 convolutions).
    y = TF.relu6(TF.conv2d(X, Wdw, padding=1, groups=X.shape[1]))
    y = TF.relu6(TF.linear(y.permute(0, 2, 3, 1), Wpw.view(Wpw.shape[0], Wpw.shape[1])))
    return (y * y).mean()


def channels_last(name, t):
    """prepare: 4-D tensors stored channels last."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


TWINS = {
    "matmul": matmul_loss, "conv2d": conv2d_relu_loss, "lltm": lltm_loss,
    "milstm": milstm_loss, "capsnet": capsnet_loss,
    "mobilenet_dws": (mobilenet_dws_loss, channels_last),
}


def find_twin(name, modules):
    """(function, prepare or None) of the workload, or SystemExit."""
    tables = [TWINS]
    for m in modules:
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        tables.append(getattr(importlib.import_module(m), "TWINS", {}))
    for tab in tables:
        if name in tab:
            tw = tab[name]
            return tw if isinstance(tw, tuple) else (tw, None)
    known = sorted(set().union(*tables))
    raise SystemExit("torch_workloads: unknown workload %r (known: %s)" % (name, ", ".join(known)))


def load(meta, d, dtype, device, prepare=None):
    """The def's inputs in order as tensors; parameters require grad."""
    tensors, params = [], []
    for inp in meta["inputs"]:
        path = os.path.join(d, inp["name"] + ".f32")
        arr = np.fromfile(path, dtype="<f4")
        want = int(np.prod(inp["shape"])) if inp["shape"] else 1
        if arr.size != want:
            raise SystemExit("torch_workloads: %s holds %d floats, want %d" % (path, arr.size, want))
        t = torch.from_numpy(arr.reshape(inp["shape"]).astype(dtype)).to(device)
        if prepare is not None:
            t = prepare(inp["name"], t)
        if inp["param"]:
            t.requires_grad_(True)
            params.append((inp["name"], t))
        tensors.append(t)
    return tensors, params


def write(d, name, t):
    # numpy writes C order whatever the tensor's memory format
    t.detach().cpu().numpy().astype("<f4").tofile(os.path.join(d, name + ".f32"))


def main():
    a = ARGS
    with open(os.path.join(a.dir, "meta.json")) as f:
        meta = json.load(f)
    fn, prepare = find_twin(a.workload, a.twins)
    torch.set_num_threads(a.threads)
    fp32 = strict_fp32() if a.device == "cuda" else "ieee"

    if a.ref64:
        tensors, params = load(meta, a.dir, np.float64, a.device, prepare)
        loss = fn(*tensors)
        loss.backward()
        write(a.ref64, "loss", loss)
        for name, p in params:
            write(a.ref64, "grad_" + name, p.grad)
        print(json.dumps({"loss": float(loss)}))
        return 0

    tensors, params = load(meta, a.dir, np.float32, a.device, prepare)
    init = [p.detach().clone() for _, p in params]
    ps = [p for _, p in params]
    opt = torch.optim.SGD(ps, lr=meta["lr"], momentum=0)

    if a.peer == "compile":
        loss_fn = torch.compile(fn)  # mode default; the backward is compiled with it

        @torch.compile
        def opt_step():  # the optimizer step compiled too (PyTorch's recipe)
            opt.step()
        variants = {"opt-eager": opt.step, "opt-compiled": opt_step}
    else:
        loss_fn = fn
        variants = {"eager": opt.step}

    def step(update):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*tensors)
        loss.backward()
        update()
        return loss.item()

    def reset():
        with torch.no_grad():
            for p, v in zip(ps, init):
                p.copy_(v)

    # warm-up: each variant's steps, timed one by one (the first ones
    # compile under --peer compile)
    warm = {}
    t0 = time.perf_counter()
    for v, update in variants.items():
        warm[v] = []
        for _ in range(max(a.warmup, 1 if a.peer == "compile" else 0)):
            t = time.perf_counter()
            step(update)
            warm[v].append((time.perf_counter() - t) * 1e3)
    warm_ms = (time.perf_counter() - t0) * 1e3

    loss0 = float("nan")
    if a.dump:
        reset()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*tensors)
        loss.backward()
        loss0 = loss.item()
        write(a.dump, "loss", loss)
        for name, p in params:
            write(a.dump, "grad_" + name, p.grad)
        opt.step()

    # timed: the variants in turn, blocks of a few steps each, until every
    # variant has its steps and seconds
    reset()
    times = {v: [] for v in variants}
    spent = {v: 0.0 for v in variants}
    block = 5 if len(variants) > 1 else 1
    t_run = time.perf_counter()
    while any(len(times[v]) < a.steps_min or spent[v] < a.seconds_min for v in variants):
        for v, update in variants.items():
            for _ in range(block):
                t = time.perf_counter()
                step(update)
                dt = time.perf_counter() - t
                times[v].append(dt * 1e3)
                spent[v] += dt
    total_ms = (time.perf_counter() - t_run) * 1e3
    med = {v: float(np.median(x)) for v, x in times.items()}
    best = min(med, key=med.get)
    # compiling (or loading Inductor's cache) is what the warm-up steps
    # took beyond the steady step
    compile_s = sum(max(0.0, x - med[v]) for v in variants for x in warm[v]) / 1e3
    res = {
        "median_ms": med[best], "mean_ms": float(np.mean(times[best])),
        "min_ms": float(np.min(times[best])), "steps": len(times[best]),
        "variant": best, "variants_ms": med, "total_ms": total_ms,
        "loss0": loss0, "warmup_ms": warm_ms,
        "first_step_ms": {v: w[0] for v, w in warm.items() if w},
        "torch": torch.__version__, "peer": a.peer,
        "threads": torch.get_num_threads(), "device": a.device, "fp32": fp32,
    }
    if a.peer == "compile":
        res["compile_s"] = compile_s
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
