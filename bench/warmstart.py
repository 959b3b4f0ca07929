#!/usr/bin/python3
"""bench/warmstart.py - how a session starts, cold and warm (bench/README.md).

    bench/warmstart.py [--workloads a,b,..] [--threads T] [--steps N]
                       [--compile-only | --tune-trials N --tune-seconds S]
                       [--until-tuned N] [--similar]
                       [--out DIR] [--build DIR] [--keep-cache]

For each workload (the public six of bench/run, examples/workloads.nf, with
synthetic data), `neoflow train --json --profile` runs twice against a
private neoflowd (socket, cache and log under OUT/warmstart/): first on an
empty cache and an empty record of verified kernels (cold), then again on
what the first left (warm).  It reports, per workload:

- cold: the first step's ms, how many steps ran over 1.5x the final median,
  and the time from the session's start to 90% of the final step speed
  (the first moment after which the median of every 5 consecutive steps
  stays within 1/0.9 of the median of the last 10 steps);
- warm: the median step, the slowest step and its ratio to the median (the
  goal: no step above 1.5x), and how many kernels were taken on their
  recorded verdict (`remembered`) or kept tier 0 (`tier0_kept`);
- the kernel entries whose daemon kernel ran slower than tier 0 in the
  profile's `k/tier0` column (the goal for default kernels: none above 2).

--until-tuned N makes every session run until all its kernels are final
(tuned, or kept on tier 0 by their verdict), then N steps more (--steps
caps it): the final speed is then the tuned speed, and the time to 90% is
the one the issue asks for (a cold `neoflow train` to 90% of the final step
speed).

--similar adds, per workload, a second model like the first with other
shapes (SIMILAR: another batch or image size, so every subgraph has other
extents but the same structure): trained cold on an empty cache of its own
(the baseline), and again after the first model's sessions, on their cache
(similar subgraphs' schedules to start from, the cost model's corpus).
Its time to 90% after the first model against its own cold one is the
"second, similar model faster than the first".

Writes OUT/warmstart/results.json.  Exit status 0 when everything ran.
Timings on shared machines are noisy: read the ratios, not the ms.
"""

import argparse
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
run = importlib.machinery.SourceFileLoader("bench_run", os.path.join(HERE, "run")).load_module()


def parse_args():
    ap = argparse.ArgumentParser(prog="bench/warmstart.py", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(run.ORDER))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--tune-trials", type=int, default=0)
    ap.add_argument("--tune-seconds", type=int, default=0)
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--build", default="build")
    ap.add_argument("--until-tuned", type=int, default=-1,
                    help="run each session until its kernels are final, then N steps more")
    ap.add_argument("--similar", action="store_true",
                    help="also a similar model, cold and after the first (SIMILAR)")
    ap.add_argument("--keep-cache", action="store_true",
                    help="start from the cache a previous run left (default: empty)")
    return ap.parse_args()


# The similar model of each public workload: other extents, the same
# structure (the batch, or the image size).
SIMILAR = {
    "matmul": {"A": (768, 768), "B": (768, 768), "G": (768, 768)},
    "conv2d": {"I": (8, 64, 48, 48)},
    "lltm": {"X": (8, 48, 256), "H0": (48, 512), "C0": (48, 512)},
    "milstm": {"X": (8, 48, 512), "H0": (48, 512), "C0": (48, 512)},
    "capsnet": {"u": (24, 1152, 8), "targets": (24, 10)},
    "mobilenet_dws": {"X": (16, 128, 24, 24)},
}


def train_cmd(a, name, sock, shapes=None):
    defn, inputs, lr = run.WORKLOADS[name]
    if shapes:
        inputs = [(n, shapes.get(n, shape), kind) for n, shape, kind in inputs]
    cmd = [os.path.join(a.build, "client", "neoflow"), "train",
           os.path.join(ROOT, "examples", "workloads.nf"), defn, "--steps", str(a.steps),
           "--data", "synthetic", "--json", "--profile", "--threads", str(a.threads),
           "--daemon", sock,
           "--no-spawn", "--optim", "sgd", "--lr", repr(lr)]
    params = [n for n, _, kind in inputs if kind != "data" and kind != "onehot"]
    for n, shape, _ in inputs:
        cmd += ["--shape", "%s=%s" % (n, ",".join(str(d) for d in shape))]
    if params:
        cmd += ["--params", ",".join(params)]
    if a.compile_only:
        cmd.append("--compile-only")
    if a.tune_trials:
        cmd += ["--tune-trials", str(a.tune_trials)]
    if a.tune_seconds:
        cmd += ["--tune-seconds", str(a.tune_seconds)]
    if a.until_tuned >= 0:
        cmd += ["--until-tuned", str(a.until_tuned)]
    return cmd


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else float("nan")


def time_to_90(steps):
    """Elapsed ms after which every 5-step median stays within 1/0.9 of the
    final median (the last 10 steps)."""
    ms = [s["ms"] for s in steps]
    if len(ms) < 15:
        return None
    final = median(ms[-10:])
    last_bad = -1
    for i in range(len(ms) - 4):
        if median(ms[i:i + 5]) > final / 0.9:
            last_bad = i + 4
    if last_bad + 1 >= len(steps):
        return None
    return steps[last_bad + 1]["elapsed_ms"] - steps[last_bad + 1]["ms"] if last_bad >= 0 else 0.0


def profile_rows(text):
    """(key, first output, runs on, k/tier0) of the --profile table."""
    rows, on = [], False
    for line in text.splitlines():
        if line.startswith("time per kernel entry"):
            rows, on = [], True
            continue
        f = line.split()
        if on and len(f) >= 9 and f[0] != "key" and len(f[0]) == 16:
            vs = f[-1]
            runs = " ".join(f[3:-6])
            rows.append({"key": f[0], "output": f[1], "runs_on": runs,
                         "k_over_t0": float(vs) if vs != "-" else None})
    return rows


def one(a, name, sock, env, log, shapes=None):
    cmd = train_cmd(a, name, sock, shapes)
    log.write("$ " + " ".join(cmd) + "\n")
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    log.write(p.stdout + p.stderr + "\n")
    steps = []
    for line in p.stdout.splitlines():
        if line.startswith("{\"step\""):
            steps.append(json.loads(line))
    if p.returncode != 0 or not steps:
        return {"error": "neoflow train exited %d: %s" % (p.returncode, p.stderr[-400:])}
    ms = [s["ms"] for s in steps]
    med = median(ms[1:]) if len(ms) > 1 else ms[0]
    final = median(ms[-10:])
    last = steps[-1]
    return {"wall_s": time.time() - t0, "steps": len(ms), "first_ms": ms[0], "median_ms": med,
            "final_ms": final, "max_ms": max(ms), "max_step": ms.index(max(ms)) + 1,
            "max_over_median": max(ms) / med, "over_1_5": sum(1 for x in ms if x > 1.5 * final),
            "time_to_90_s": (time_to_90(steps) or 0) / 1000 if time_to_90(steps) is not None
            else None, "remembered": last.get("remembered", 0),
            "tier0_kept": last.get("tier0_kept", 0), "tier1": last["tier1"], "tier2": last["tier2"],
            "kernels": last["kernels"], "profile": profile_rows(p.stderr + p.stdout),
            "ms": ms}


def main():
    a = parse_args()
    names = [w for w in a.workloads.split(",") if w]
    for w in names:
        if w not in run.WORKLOADS:
            run.die("unknown workload '%s' (one of %s)" % (w, ", ".join(run.ORDER)))
    out = os.path.join(os.path.abspath(a.out), "warmstart")
    os.makedirs(out, exist_ok=True)
    cache = os.path.join(out, "cache.db")
    verified = os.path.join(out, "verified-kernels")
    if not a.keep_cache:
        for f in (cache, cache + "-wal", cache + "-shm", verified, verified + ".speed"):
            if os.path.exists(f):
                os.remove(f)
    d = run.Daemon(os.path.join(a.build, "daemon", "neoflowd"), out, cache)
    d.start()
    neoflowd = os.path.join(a.build, "daemon", "neoflowd")
    env = dict(os.environ)
    env.update(run.thread_env(a.threads))
    env["NEOFLOW_VERIFIED"] = verified
    env["NEOFLOW_LIB"] = os.path.join(ROOT, "lib")
    results = {}
    with open(os.path.join(out, "run.log"), "w") as log:
        try:
            for w in names:
                sim_cold = None
                if a.similar:
                    # the similar model alone: an empty cache and record
                    sd = os.path.join(out, "similar-" + w)
                    shutil.rmtree(sd, ignore_errors=True)
                    os.makedirs(sd)
                    d2 = run.Daemon(neoflowd, sd, os.path.join(sd, "cache.db"))
                    d2.start()
                    try:
                        env2 = dict(env, NEOFLOW_VERIFIED=os.path.join(sd, "verified-kernels"))
                        sim_cold = one(a, w, d2.sock, env2, log, SIMILAR[w])
                    finally:
                        d2.stop()
                cold = one(a, w, d.sock, env, log)
                warm = one(a, w, d.sock, env, log)
                results[w] = {"cold": cold, "warm": warm}
                print_row(w, cold, warm)
                if a.similar:
                    sim = one(a, w, d.sock, env, log, SIMILAR[w])
                    results[w].update({"similar_cold": sim_cold, "similar_after": sim})
                    print_similar(w, sim_cold, sim)
        finally:
            d.stop()
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"threads": a.threads, "steps": a.steps, "compile_only": a.compile_only,
                   "tune_trials": a.tune_trials, "tune_seconds": a.tune_seconds,
                   "until_tuned": a.until_tuned, "similar": SIMILAR if a.similar else None,
                   "workloads": results}, f, indent=1)
    print("results: %s" % os.path.join(out, "results.json"))
    return 1 if any("error" in r.get(k) for r in results.values()
                    for k in ("cold", "warm", "similar_cold", "similar_after") if r.get(k)) else 0


def print_similar(w, before, after):
    if "error" in before or "error" in after:
        print("%14s similar: error: %s" % ("", before.get("error") or after.get("error")))
        return

    def t(r):
        return "%.1f s" % r["time_to_90_s"] if r["time_to_90_s"] is not None else "never"
    print("%14s similar model (%s): 90%% speed at %s alone, %s after %s (final %.1f / %.1f ms; "
          "sessions %.0f / %.0f s)" % ("", ", ".join("%s %s" % (k, "x".join(map(str, v)))
                                                    for k, v in SIMILAR[w].items()),
                                       t(before), t(after), w, before["final_ms"],
                                       after["final_ms"], before["wall_s"], after["wall_s"]))


def print_row(w, cold, warm):
    if "error" in cold or "error" in warm:
        print("%-14s error: %s" % (w, cold.get("error") or warm.get("error")))
        return
    t90 = cold["time_to_90_s"]
    print("%-14s cold: first %.0f ms, %d steps > 1.5x final %.1f ms, 90%% speed at %s | "
          "warm: median %.1f ms, max %.1f ms (step %d, %.2fx), remembered %d, tier0 kept %d"
          % (w, cold["first_ms"], cold["over_1_5"], cold["final_ms"],
             "%.1f s" % t90 if t90 is not None else "never", warm["median_ms"], warm["max_ms"],
             warm["max_step"], warm["max_over_median"], warm["remembered"], warm["tier0_kept"]))
    for r in warm["profile"]:
        if r["k_over_t0"] is not None and r["k_over_t0"] > 1:
            print("%14s kernel %s (%s) runs %.2fx tier 0's time: %s" %
                  ("", r["key"], r["output"], r["k_over_t0"], r["runs_on"]))


if __name__ == "__main__":
    sys.exit(main())
