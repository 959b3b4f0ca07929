#!/usr/bin/env python3
"""bench/torch_op.py - a `.nf` def as a PyTorch operator against PyTorch.

The LLTM cell of PyTorch's C++-extension tutorial (examples/workloads.nf's
lltm_step, at the lltm workload's sizes: batch 64, input 256, state 512)
run forward and backward inside autograd, per call:

  neoflow   neoflow.torch.op("examples/workloads.nf", "lltm_step"), its
            kernels from the daemon (tuned: --tune-trials; the script
            waits until every kernel is final before timing)
  eager     the same cell written in PyTorch
  compile   that cell under torch.compile (PyTorch 2.x only)

All in one process, alternating rounds, at --threads; the report is the
median ms of each and the ratios peer / NeoFlow (above 1: NeoFlow faster).
Run it with the Python whose PyTorch is the peer:

  PYTHONPATH=python python3 bench/torch_op.py                 # Debian's 1.13
  PYTHONPATH=python bench-out/peers-venv/bin/python bench/torch_op.py   # 2.x

The daemon is the per-user one (started when none answers) unless
--daemon names a socket.  Run by hand, never by the tests.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import neoflow.torch as nft  # noqa: E402


def lltm(x, h, c, W, b):
    gates = torch.nn.functional.linear(torch.cat([x, h], 1), W, b)
    ig, og, gc = gates.chunk(3, 1)
    c2 = c + torch.nn.functional.elu(gc) * torch.sigmoid(ig)
    return torch.tanh(c2) * torch.sigmoid(og), c2


def one_call(f, xs):
    h, c = f(*xs)
    (h.sum() + c.sum()).backward()


def time_calls(f, xs, n):
    t = time.perf_counter()
    for _ in range(n):
        one_call(f, xs)
    return (time.perf_counter() - t) / n * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input", type=int, default=256)
    ap.add_argument("--state", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tune-trials", type=int, default=40)
    ap.add_argument("--daemon", default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    B, I, S = a.batch, a.input, a.state
    g = torch.Generator().manual_seed(0)
    xs = [(0.1 * torch.randn(*s, generator=g)).requires_grad_()
          for s in [(B, I), (B, S), (B, S), (3 * S, I + S), (3 * S,)]]
    op = nft.op(os.path.join(ROOT, "examples", "workloads.nf"), "lltm_step", threads=a.threads,
                tune_trials=a.tune_trials, daemon=a.daemon)
    peers = {"neoflow": op, "eager": lltm}
    if hasattr(torch, "compile"):
        peers["compile"] = torch.compile(lltm)
    # the same values first (the forward and the gradients)
    ref = lltm(*xs)
    got = op(*xs)
    err = max(float((p - q).abs().max() / q.abs().max()) for p, q in zip(got, ref))
    one_call(op, xs)
    t0 = time.perf_counter()
    if not op.wait_kernels(1800000, 2):
        print("torch_op: the daemon's kernels were not final within 30 min", file=sys.stderr)
    waited = time.perf_counter() - t0
    for f in peers.values():  # warm-up (compile's compilation, the swaps)
        for _ in range(3):
            one_call(f, xs)
    ms = {k: [] for k in peers}
    for _ in range(a.rounds):
        for k, f in peers.items():
            ms[k].append(time_calls(f, xs, a.calls))
    med = {k: statistics.median(v) for k, v in ms.items()}
    res = {"torch": torch.__version__, "threads": a.threads, "batch": B, "input": I, "state": S,
           "ms": med, "ratio": {k: med[k] / med["neoflow"] for k in med if k != "neoflow"},
           "max_rel_err_forward": err, "kernel_wait_s": waited, "stats": op.stats()}
    print("lltm_step forward+backward, batch %d, input %d, state %d, %d thread(s), torch %s"
          % (B, I, S, a.threads, torch.__version__))
    for k, v in med.items():
        print("  %-8s %8.3f ms%s" % (k, v, "" if k == "neoflow" else
                                      "   %s / neoflow = %.2f" % (k, v / med["neoflow"])))
    st = res["stats"]
    print("  neoflow kernels: %d (tier 1 %d, tier 2 %d, OpenBLAS %d, tier 0 kept %d); forward "
          "off PyTorch by %.1e" % (st["kernels"], st["tier1"], st["tier2"], st["blas"],
                                   st["tier0_kept"], err))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
