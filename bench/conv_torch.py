#!/usr/bin/env python3
"""conv_torch.py - PyTorch's (oneDNN's) times for the conv2d workload's
convolution: forward, gradient of the input, gradient of the weight
(N 8, C 64, H = W 56, K 64, 3x3, pad 1), at the given thread count.
Prints one JSON object {"threads", "forward_ms", "grad_I_ms", "grad_W_ms"}
with the median of at least 20 runs (and 1 s) after 3 warm-up runs.
Used by bench/tune_bench.sh; run by hand, never by the tests.

    OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=T python3 conv_torch.py T
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(fn):
    for _ in range(3):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < 20 or time.perf_counter() - start < 1.0:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(8, 64, 56, 56, generator=g) * 2 - 1
    w = torch.rand(64, 64, 3, 3, generator=g) * 2 - 1
    dy = torch.rand(8, 64, 56, 56, generator=g) * 2 - 1
    with torch.no_grad():
        fwd = median_ms(lambda: F.conv2d(x, w, padding=1))
        gi = median_ms(lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, padding=1))
        gw = median_ms(lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=1))
    print(json.dumps({"threads": threads, "forward_ms": fwd, "grad_I_ms": gi,
                      "grad_W_ms": gw, "mkldnn": torch.backends.mkldnn.is_available()}))


if __name__ == "__main__":
    main()
