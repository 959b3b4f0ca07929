#!/usr/bin/env python3
"""fashion_cnn.py - the CNN of examples/fashion_cnn.nf trained on
Fashion-MNIST from Python, as `neoflow train examples/fashion_cnn.nf cnn
--data fashion-mnist` trains it: the same model, optimizer (Adam, the
library's default rate), batch (64) and epochs; the training split
shuffled every epoch; the test accuracy printed after each epoch from the
`logits` output over the whole test split.

    PYTHONPATH=python python3 examples/python/fashion_cnn.py --epochs 1

The daemon compiles and tunes the step's kernels as for any session
(per-user neoflowd, started when none answers; --daemon none: fallback
kernels only, which is slow).  The data comes from Debian's
dataset-fashion-mnist (--data-dir for another copy).
"""

import argparse
import os
import sys
import time

import numpy as np

import neoflow

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: none)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--daemon", default=None, help="a socket, tcp:HOST:PORT or none")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--test-limit", type=int, default=0,
                    help="evaluate on the first N test images only (0: all)")
    a = ap.parse_args()

    train_x, train_y = neoflow.load_mnist(a.data_dir, "train")
    test_x, test_y = neoflow.load_mnist(a.data_dir, "test")
    if a.test_limit:
        test_x, test_y = test_x[:a.test_limit], test_y[:a.test_limit]
    model = neoflow.Model.load(os.path.join(HERE, "..", "fashion_cnn.nf"))
    B = a.batch
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    print("neoflow %s (%s)" % (neoflow.version, neoflow.library))
    with neoflow.Session(model, "cnn", params={"batch": B}, seed=a.seed, threads=a.threads,
                         daemon=a.daemon) as s:
        steps_per_epoch = len(train_x) // B
        step = 0
        for epoch in range(1, a.epochs + 1):
            order = rng.permutation(len(train_x))
            loss = float("nan")
            for k in range(steps_per_epoch):
                idx = order[k * B:(k + 1) * B]
                s.feed(X=train_x[idx].reshape(B, 1, 28, 28), labels=train_y[idx])
                loss = s.step()
                step += 1
                if a.steps and step >= a.steps:
                    break
            correct = 0
            for start in range(0, len(test_x), B):
                idx = np.arange(start, start + B) % len(test_x)  # the last batch padded
                valid = min(B, len(test_x) - start)
                s.feed(X=test_x[idx].reshape(B, 1, 28, 28), labels=test_y[idx])
                s.eval()
                pred = s.read("logits").argmax(axis=1)
                correct += int((pred[:valid] == test_y[idx][:valid]).sum())
            acc = 100.0 * correct / len(test_x)
            st = s.stats()
            print("epoch %d (step %d): loss %.4f, test accuracy %.2f%%  (%.1f s; kernels: %d of "
                  "%d from the daemon, %d tuned)" % (epoch, step, loss, acc, time.time() - t0,
                                                     st["tier1"] + st["tier2"], st["kernels"],
                                                     st["tier2"]))
            if a.steps and step >= a.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
