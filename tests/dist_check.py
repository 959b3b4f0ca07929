#!/usr/bin/env python3
"""dist_check.py NEOFLOW NEOFLOWD - data-parallel training over MPI
(client/dist.c, docs/distributed.md), through `mpirun --oversubscribe -np 2
neoflow train`, one thread per rank:

  - 2 ranks on batches of 16 end with the same parameters as 1 rank on the
    combined batch of 32 after 50 steps (SGD, and Adam), relative error
    below 1e-5, and their two replicas identical;
  - the same (SGD) with the daemon's kernels swapped in (a private daemon,
    compile only, shared by the ranks: one job per subgraph): every rank
    swaps the same kernels at the same steps (the replicas stay identical);
  - a rank that hangs makes the job abort within the timeout with a
    message naming it; a rank that dies ends the job, named by mpirun; an
    error on one rank ends the job at once with its message;
  - on GPUs (the emulated driver, tests/cuda_emu_driver.cc, and emulated
    NCCL, tests/nccl_emu.cc, when the build has them): the same
    equivalence with the gradients averaged by NCCL, a hung rank named,
    and the ranks' devices and NCCL checked alike on every rank.

Exit 77 (skipped) without mpirun or without MPI in this build."""

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

NEOFLOW, NEOFLOWD = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nf")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", NEOFLOW_LIB=os.path.join(ROOT, "lib"))
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def read_params(path):
    """A parameter file (docs/client.md, "Parameter files") as {name: [floats]}."""
    b = open(path, "rb").read()
    assert b[:8] == b"NFPARAMS", path
    n = struct.unpack_from("<I", b, 12)[0]
    o, out = 16, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", b, o)
        o += 4
        name = b[o:o + ln].decode()
        o += ln
        _dt, rank, _ = struct.unpack_from("<BBH", b, o)
        o += 4
        dims = struct.unpack_from("<%dq" % rank, b, o)
        o += 8 * rank
        cnt = 1
        for d in dims:
            cnt *= d
        out[name] = struct.unpack_from("<%df" % cnt, b, o)
        o += 4 * cnt
    return out


def max_rel(a, b):
    worst = 0.0
    for k in b:
        scale = max(abs(x) for x in b[k]) or 1.0
        worst = max(worst, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
    return worst


def train(ranks, batch, extra, save, env=None, timeout=300):
    cmd = [NEOFLOW, "train", MLP, "mlp", "--data", "synthetic", "--batch", str(batch),
           "--threads", "1", "--save", save] + extra
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    t = time.time()
    r = subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=timeout)
    return r, time.time() - t


def equivalence(tmp, name, extra, env=None):
    one, two = os.path.join(tmp, name + "-1.params"), os.path.join(tmp, name + "-2.params")
    r1, _ = train(1, 32, extra + ["--daemon", "none"], one, env=env)
    r2, _ = train(2, 16, extra, two, env=env)
    check(r1.returncode == 0 and r2.returncode == 0,
          "%s: both runs train (%s%s)" % (name, r1.stderr[-300:], r2.stderr[-600:]))
    if r1.returncode or r2.returncode:
        return r2
    check("their parameters are identical" in r2.stdout,
          "%s: the two replicas hold identical parameters: %s" % (name, r2.stdout[-300:]))
    e = max_rel(read_params(two), read_params(one))
    check(e < 1e-5, "%s: 2 ranks x 16 against 1 rank x 32 after 50 steps: relative error %.2e"
          % (name, e))
    return r2


def gpu_checks(tmp):
    drv, nccl = os.environ.get("NF_TEST_CUDA_DRIVER"), os.environ.get("NF_TEST_NCCL")
    if not drv or not nccl or not os.path.exists(drv) or not os.path.exists(nccl):
        print("skip  GPU ranks: no emulated driver or NCCL (NF_TEST_CUDA_DRIVER, NF_TEST_NCCL)")
        return
    genv = dict(ENV, NEOFLOW_LIBCUDA=drv, NEOFLOW_LIBNCCL=nccl, NF_EMU_DEVICES="2",
                NEOFLOW_DEVICE="cuda")
    if os.environ.get("NF_TEST_CUBLAS"):
        genv["NEOFLOW_LIBCUBLAS"] = os.environ["NF_TEST_CUBLAS"]
    r = equivalence(tmp, "GPUs, NCCL", ["--steps", "50", "--optim", "sgd", "--lr", "0.05",
                                        "--daemon", "none"], env=genv)
    out = r.stdout + r.stderr
    check("gradients averaged on the GPU by NCCL" in out and "emulated on the CPU" in out,
          "GPUs: each rank on its GPU, the gradients averaged by NCCL (%s)" % out[-300:])
    env = dict(genv, NEOFLOW_DIST_TIMEOUT="5", NEOFLOW_FAULT="1:20:hang")
    r, took = train(2, 16, ["--steps", "50", "--daemon", "none"],
                    os.path.join(tmp, "gh.params"), env=env, timeout=120)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "no answer from rank 1" in out and took < 60,
          "GPUs: a hung rank: the job aborts in %.1f s naming rank 1 (%s)" % (took, out[-400:]))
    # every rank on the same kind of device, with NCCL: else every rank ends
    # with the reason
    cmd = [NEOFLOW, "train", MLP, "mlp", "--data", "synthetic", "--batch", "16", "--steps", "5",
           "--threads", "1", "--daemon", "none"]
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "1"] + cmd + ["--device", "cuda", ":",
                        "-np", "1"] + cmd + ["--device", "cpu"], env=genv, capture_output=True,
                       text=True, timeout=120)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "some ranks opened a GPU and others the CPU" in out,
          "GPUs: a GPU on one rank and the CPU on the other is refused (%s)" % out[-400:])
    r, _ = train(2, 16, ["--steps", "5", "--daemon", "none"], os.path.join(tmp, "gn.params"),
                 env=dict(genv, NEOFLOW_LIBNCCL="/nonexistent/libnccl.so.2"), timeout=120)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "needs NCCL on every rank" in out and "/nonexistent" in out,
          "GPUs: without NCCL the job is refused with why (%s)" % out[-400:])


def main():
    if not shutil.which("mpirun"):
        print("dist: skipped: no mpirun (Debian's openmpi-bin)")
        return 77
    probe = subprocess.run(["mpirun", "-np", "2", NEOFLOW, "train", MLP, "mlp", "--data",
                            "synthetic", "--batch", "4", "--steps", "1", "--threads", "1",
                            "--daemon", "none"], env=ENV, capture_output=True, text=True,
                           timeout=120)
    if "data-parallel: 2 ranks" not in probe.stdout:
        print("dist: skipped: this build has no MPI (%s)" % (probe.stdout + probe.stderr)[-300:])
        return 77
    tmp = tempfile.mkdtemp(prefix="nf_dist_")
    try:
        equivalence(tmp, "sgd", ["--steps", "50", "--optim", "sgd", "--lr", "0.05",
                                 "--daemon", "none"])
        equivalence(tmp, "adam", ["--steps", "50", "--daemon", "none"])
        if NEOFLOWD:
            run = os.path.join(tmp, "run")
            sock = os.path.join(run, "neoflowd.sock")
            conf = os.path.join(tmp, "neoflowd.conf")
            with open(conf, "w") as f:
                f.write("[daemon]\nsocket = %s\n[cache]\ncache = %s\n"
                        % (sock, os.path.join(tmp, "cache.db")))
            log = open(os.path.join(tmp, "neoflowd.log"), "w")
            d = subprocess.Popen([NEOFLOWD, "--config", conf], stdout=log,
                                 stderr=subprocess.STDOUT)
            try:
                for _ in range(400):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.025)
                # (SGD: the kernels' rounding differs from the interpreter's,
                # which Adam's normalisation magnifies in the smallest
                # gradients: 1e-5 was seen there)
                r = equivalence(tmp, "sgd, the daemon's kernels",
                                ["--steps", "50", "--optim", "sgd", "--lr", "0.05",
                                 "--daemon", sock, "--no-spawn", "--compile-only",
                                 "--wait-kernels", "60"])
                swaps = r.stdout.split("swaps ")[-1].split(",")[0] if "swaps " in r.stdout else "0"
                check(swaps.isdigit() and int(swaps) > 0,
                      "the daemon's kernels were swapped in on both ranks (swaps %s)" % swaps)
                # one daemon for both ranks: one job per subgraph (single flight)
                trained = [ln for ln in r.stdout.splitlines() if ln.startswith("trained ")]
                kernels = trained[0].split("kernels ")[1].split(":")[0] if trained else "?"
                st = subprocess.run([NEOFLOW, "status", "--socket", sock], env=ENV,
                                    capture_output=True, text=True, timeout=60).stdout
                jobs = st.split("jobs: ")[-1].split(" done")[0] if "jobs: " in st else "?"
                check(kernels.isdigit() and jobs == kernels,
                      "the ranks' %s subgraphs took %s compile jobs of the shared daemon (%s)"
                      % (kernels, jobs, st[:200]))
            finally:
                d.send_signal(signal.SIGTERM)
                d.wait(timeout=30)
                log.close()
        env = dict(ENV, NEOFLOW_DIST_TIMEOUT="5", NEOFLOW_FAULT="1:20:hang")
        r, took = train(2, 16, ["--steps", "50", "--daemon", "none"],
                        os.path.join(tmp, "h.params"), env=env, timeout=120)
        out = r.stdout + r.stderr
        check(r.returncode != 0 and "no answer from rank 1" in out and took < 60,
              "a hung rank: the job aborts in %.1f s naming rank 1 (%s)" % (took, out[-400:]))
        env = dict(ENV, NEOFLOW_FAULT="1:20:kill")
        r, took = train(2, 16, ["--steps", "50", "--daemon", "none"],
                        os.path.join(tmp, "k.params"), env=env, timeout=120)
        out = r.stdout + r.stderr
        # (mpirun's own words: "rank 1" alone is in every run's log line)
        check(r.returncode != 0 and "process rank 1" in out and took < 60,
              "a dead rank: the job ends in %.1f s naming rank 1 (%s)" % (took, out[-400:]))
        # an error on one rank (rank 0 cannot load the parameters) ends the
        # job at once with its message, rather than leave the others waiting
        r, took = train(2, 16, ["--steps", "50", "--daemon", "none", "--load",
                                os.path.join(tmp, "none.params")],
                        os.path.join(tmp, "e.params"), env=dict(ENV, NEOFLOW_DIST_TIMEOUT="60"),
                        timeout=120)
        out = r.stdout + r.stderr
        check(r.returncode != 0 and "rank 0: neoflow train failed on this rank" in out
              and took < 30, "an error on rank 0: the job ends in %.1f s with its message (%s)"
              % (took, out[-400:]))
        gpu_checks(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("dist: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
