#!/usr/bin/env python3
"""lltm_torch.py - a `.nf` operator inside a PyTorch model.

The LLTM cell of PyTorch's C++-extension tutorial is one def of
examples/workloads.nf (lltm_step).  Here it is the recurrent cell of a
small sequence classifier written in PyTorch: neoflow.torch.op makes it an
operator whose forward and backward run NeoFlow's kernels (the backward
from expression autodiff: no gradient written by hand, no C++).  The same
model with the cell written in PyTorch trains beside it from the same
initial weights on the same batches, and the script prints both losses and
their largest relative difference.

    PYTHONPATH=python python3 examples/python/lltm_torch.py --steps 20

The daemon compiles and tunes the cell's kernels as for any session
(per-user neoflowd, started when none answers; --daemon none: fallback
kernels only).
"""

import argparse
import os
import time

import torch

import neoflow.torch as nft

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "..", "workloads.nf")


def lltm_cell(x, h, c, W, b):
    """The same cell in PyTorch (the tutorial's formulas)."""
    gates = torch.nn.functional.linear(torch.cat([x, h], 1), W, b)
    ig, og, gc = gates.chunk(3, 1)
    c2 = c + torch.nn.functional.elu(gc) * torch.sigmoid(ig)
    return torch.tanh(c2) * torch.sigmoid(og), c2


class Classifier(torch.nn.Module):
    def __init__(self, cell, features, hidden, state, classes):
        super().__init__()
        self.cell = cell
        self.state = state
        self.inp = torch.nn.Linear(features, hidden)
        self.W = torch.nn.Parameter(torch.empty(3 * state, hidden + state))
        self.b = torch.nn.Parameter(torch.zeros(3 * state))
        torch.nn.init.xavier_uniform_(self.W)
        self.head = torch.nn.Linear(state, classes)

    def forward(self, X):  # X: [T, B, features]
        h = X.new_zeros(X.shape[1], self.state)
        c = X.new_zeros(X.shape[1], self.state)
        for t in range(X.shape[0]):
            h, c = self.cell(torch.tanh(self.inp(X[t])), h, c, self.W, self.b)
        return self.head(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=6)
    ap.add_argument("--daemon", default=None, help='a socket, or "none"')
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    op = nft.op(WORKLOADS, "lltm_step", daemon=a.daemon, threads=a.threads)
    print(op)
    ours = Classifier(op, 16, 32, 64, 4)
    theirs = Classifier(lltm_cell, 16, 32, 64, 4)
    theirs.load_state_dict(ours.state_dict())
    # a task to learn: the class of a sequence is where its mean points
    g = torch.Generator().manual_seed(1)
    X = torch.randn(a.steps, a.seq, a.batch, 16, generator=g)
    y = X.mean(1)[..., :4].argmax(-1)
    opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in (ours, theirs)]
    worst = 0.0
    t0 = time.perf_counter()
    for k in range(a.steps):
        losses = []
        for m, o in zip((ours, theirs), opts):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(X[k]), y[k])
            loss.backward()
            o.step()
            losses.append(loss.item())
        rel = abs(losses[0] - losses[1]) / abs(losses[1])
        worst = max(worst, rel)
        print("step %3d  loss %.6f (PyTorch cell %.6f)" % (k + 1, losses[0], losses[1]))
    st = op.stats()
    print("largest relative difference of the losses: %.2e" % worst)
    print("%.1f s; the cell's kernels: %d (%d from the daemon, %d tuned, %d swapped in)"
          % (time.perf_counter() - t0, st["kernels"], st["tier1"] + st["tier2"], st["tier2"],
             st["swaps"]))


if __name__ == "__main__":
    main()
