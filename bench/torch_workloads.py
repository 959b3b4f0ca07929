#!/usr/bin/python3
"""torch_workloads.py - PyTorch's side of the peer benchmark (bench/run,
bench/README.md): the six workloads of WORKLOADS.md in PyTorch eager mode
(and the extended suite's, whose twins are in bench/extended.py),
with exactly the semantics of examples/workloads.nf (the functions are
tests/torch_check.py's t_*_loss, checked there against NeoFlow's
gradients, written the way an eager user would: one GEMM for all of
milstm's Wx, chunked gates).

Usage: torch_workloads.py WORKLOAD --dir D --threads T [--steps-min 20]
           [--seconds-min 2] [--warmup 5] [--dump DIR] [--ref64 DIR]

D holds meta.json (written by bench/run: the def's inputs in order, their
shapes, which are parameters, the learning rate) and NAME.f32 for every
input (raw little-endian f32).  Like bench/nf_bench: the warm-up steps,
then the parameters back to their initial values and one step whose loss
and parameter gradients go to DIR/loss.f32 and DIR/grad_NAME.f32, then
the parameters back again and the timed steps (forward, loss, backward,
SGD update with torch.optim.SGD, loss.item()); prints one JSON line with
the median ms per step.  --ref64 DIR writes the loss and gradients of the
same step computed in float64 from the same float32 values (a reference
for both sides) and exits.

OMP_NUM_THREADS, OPENBLAS_NUM_THREADS (= T) and OMP_WAIT_POLICY=PASSIVE
must be in the environment before torch loads: bench/run sets them; this
script sets them too when missing, before importing torch.
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps-min", type=int, default=20)
    ap.add_argument("--seconds-min", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dump")
    ap.add_argument("--ref64")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (PyTorch CUDA)")
    return ap.parse_args(argv)


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


# The workloads shared with the gradient check against NeoFlow
# (tests/torch_check.py); lltm and milstm are written here the way an
# eager user would (one linear on [x, h] with chunked gates; Wx as one
# linear), which is what the benchmark should time.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_check import (t_matmul_loss as matmul_loss,  # noqa: E402
                         t_conv2d_relu_loss as conv2d_relu_loss,
                         t_capsnet_loss as capsnet_loss,
                         t_mobilenet_dws_loss as mobilenet_dws_loss)


def lltm_loss(X, H, C, W, b):
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


FUNCTIONS = {
    "matmul": matmul_loss, "conv2d": conv2d_relu_loss, "lltm": lltm_loss,
    "milstm": milstm_loss, "capsnet": capsnet_loss, "mobilenet_dws": mobilenet_dws_loss,
}


def load(meta, d, dtype):
    """The def's inputs in order as tensors; parameters require grad."""
    tensors, params = [], []
    for inp in meta["inputs"]:
        path = os.path.join(d, inp["name"] + ".f32")
        arr = np.fromfile(path, dtype="<f4")
        want = int(np.prod(inp["shape"])) if inp["shape"] else 1
        if arr.size != want:
            raise SystemExit("torch_workloads: %s holds %d floats, want %d" % (path, arr.size, want))
        t = torch.from_numpy(arr.reshape(inp["shape"]).astype(dtype)).to(ARGS.device)
        if inp["param"]:
            t.requires_grad_(True)
            params.append((inp["name"], t))
        tensors.append(t)
    return tensors, params


def write(d, name, t):
    t.detach().cpu().numpy().astype("<f4").tofile(os.path.join(d, name + ".f32"))


def main():
    a = ARGS
    with open(os.path.join(a.dir, "meta.json")) as f:
        meta = json.load(f)
    fn = FUNCTIONS.get(a.workload)
    if fn is None:  # the extended suite's twins (bench/extended.py)
        import extended
        fn = extended.FUNCTIONS.get(a.workload)
    if fn is None:
        raise SystemExit("torch_workloads: unknown workload %r (known: %s, and the extended "
                         "suite's)" % (a.workload, ", ".join(FUNCTIONS)))
    torch.set_num_threads(a.threads)
    fp32 = strict_fp32() if a.device == "cuda" else "ieee"

    if a.ref64:
        tensors, params = load(meta, a.dir, np.float64)
        loss = fn(*tensors)
        loss.backward()
        write(a.ref64, "loss", loss)
        for name, p in params:
            write(a.ref64, "grad_" + name, p.grad)
        print(json.dumps({"loss": float(loss)}))
        return 0

    tensors, params = load(meta, a.dir, np.float32)
    init = [p.detach().clone() for _, p in params]
    ps = [p for _, p in params]
    opt = torch.optim.SGD(ps, lr=meta["lr"], momentum=0)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fn(*tensors)
        loss.backward()
        opt.step()
        return loss.item()

    def reset():
        with torch.no_grad():
            for p, v in zip(ps, init):
                p.copy_(v)

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    warm_ms = (time.perf_counter() - t0) * 1e3

    loss0 = float("nan")
    if a.dump:
        reset()
        opt.zero_grad(set_to_none=True)
        loss = fn(*tensors)
        loss.backward()
        loss0 = loss.item()
        write(a.dump, "loss", loss)
        for name, p in params:
            write(a.dump, "grad_" + name, p.grad)
        opt.step()

    reset()
    times = []
    t_run = time.perf_counter()
    while len(times) < a.steps_min or time.perf_counter() - t_run < a.seconds_min:
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    total_ms = (time.perf_counter() - t_run) * 1e3
    print(json.dumps({
        "median_ms": float(np.median(times)), "mean_ms": float(np.mean(times)),
        "min_ms": float(np.min(times)), "steps": len(times), "total_ms": total_ms,
        "loss0": loss0, "warmup_ms": warm_ms, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "device": a.device, "fp32": fp32,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
