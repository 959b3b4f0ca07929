#!/usr/bin/python3
"""bench/where_time_goes.py - where NeoFlow's step time goes, per kernel entry, on
the kernels a bench/run left (bench/README.md).

    bench/where_time_goes.py [--out DIR] [--workloads a,b,..] [--threads 1,2]
                     [--steps N] [--tune-trials N --tune-seconds S | --compile-only]
                     [--build DIR]

For each workload and thread count, `neoflow train --profile` runs the
workload (synthetic data, the benchmark's shapes and learning rate) on the
kernels of bench/run's cache in OUT (OUT/cache/tuned-tN-sS.db, or
compile-only.db) and its record of verified kernels, asking for no search
(--compile-only: what the cache holds is served, final), after waiting for
them; the profile table it prints at the end (the steps since the kernels
last changed) is kept in OUT/profile/WORKLOAD-tT.txt and its entries are
printed sorted by time: each entry's ms per step, its share of the step,
what it runs on, and its kernel's time over tier 0's where both were
measured (`k/tier0`).  The budget options name the cache: the same as the
bench/run whose kernels are profiled.
"""

import argparse
import importlib.machinery
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
run = importlib.machinery.SourceFileLoader("bench_run", os.path.join(HERE, "run")).load_module()


def main():
    ap = argparse.ArgumentParser(prog="bench/where_time_goes.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--workloads", default=",".join(run.PUBLIC))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tune-trials", type=int, default=64)
    ap.add_argument("--tune-seconds", type=int, default=60)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    cache = os.path.join(out, "cache", "compile-only.db" if a.compile_only else
                         "tuned-t%d-s%d.db" % (a.tune_trials, a.tune_seconds))
    if not os.path.exists(cache):
        run.die("no cache %s: run bench/run with the same --out and budget first" % cache)
    names = [w for w in a.workloads.split(",") if w]
    for w in names:
        if w not in run.WORKLOADS:
            run.die("unknown workload '%s' (one of %s)" % (w, ", ".join(run.ORDER)))
    threads = [int(t) for t in a.threads.split(",") if t]
    pd = os.path.join(out, "profile")
    os.makedirs(pd, exist_ok=True)
    d = run.Daemon(os.path.join(a.build, "daemon", "neoflowd"), os.path.join(out, "daemon"),
                   cache, "neoflowd-profile.log")
    d.start()
    status = 0
    try:
        for w in names:
            defn, inputs, lr = run.WORKLOADS[w]
            nf = os.path.join(HERE, "extended.nf") if w in run.extended.WORKLOADS else \
                os.path.join(ROOT, "examples", "workloads.nf")
            for t in threads:
                cmd = [os.path.join(a.build, "client", "neoflow"), "train", nf, defn,
                       "--data", "synthetic", "--steps", str(a.steps), "--profile",
                       "--compile-only", "--wait-kernels", "600", "--threads", str(t),
                       "--daemon", d.sock, "--no-spawn", "--optim", "sgd", "--lr", repr(lr)]
                params = [n for n, _, kind in inputs if kind not in ("data", "onehot")]
                for n, shape, _ in inputs:
                    cmd += ["--shape", "%s=%s" % (n, ",".join(str(x) for x in shape))]
                if params:
                    cmd += ["--params", ",".join(params)]
                env = dict(os.environ)
                env.update(run.thread_env(t))
                env["NEOFLOW_VERIFIED"] = os.path.join(out, "verified-kernels")
                env["NEOFLOW_LIB"] = os.path.join(ROOT, "lib")
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
                text = p.stdout + p.stderr
                with open(os.path.join(pd, "%s-t%d.txt" % (w, t)), "w") as f:
                    f.write("$ " + " ".join(cmd) + "\n" + text)
                if p.returncode != 0:
                    print("%s T=%d: neoflow train exited %d: %s" % (w, t, p.returncode,
                                                                   p.stderr[-400:]))
                    status = 1
                    continue
                # the last profile table
                i = text.rfind("time per kernel entry")
                print("\n%s, %d thread(s):" % (w, t))
                print(text[i:].split("\n\n")[0] if i >= 0 else "(no profile table)")
    finally:
        d.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
