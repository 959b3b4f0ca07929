#!/usr/bin/env bash
# deploy/gpu-check.sh - the checks that need an NVIDIA GPU, in one run
# (docs/gpu.md).  On a Debian 12 machine with the GPU's driver and the
# CUDA toolkit (NVRTC) installed:
#   1. sets up and builds (deploy/setup.sh; NF_GPU_SKIP_SETUP=1 skips the
#      package installs where they are already there);
#   2. the GPU tests: test_cuda's `gpu` part (every library op, workload
#      statement and gradient compiled by NVRTC for the device and run on
#      it against the interpreter) and test_session's `gpu` case on the
#      real driver (a GPU session with the daemon's kernels trains with the
#      CPU's losses, gradients and parameters), and its `cudnn`,
#      `generated` and `graphs` cases;
#   3. `neoflow train --device cuda` (with the daemon's kernels, and
#      without a daemon: cuBLAS and kernels the session generates) against
#      `--device cpu` on the MLP: the losses after 30 steps agree;
#   4. the benchmark against PyTorch CUDA in one run (bench/run --device
#      cuda), written to ${NF_GPU_OUT:-gpu-check-out}/gpu_bench.json: the
#      default GPU kernels, or with NF_GPU_TUNE_TRIALS=N (and
#      NF_GPU_TUNE_SECONDS=S, default 20) kernels tuned on the GPU first.
# On a GPU machine that cannot build (no package registry, as the
# development device tool's): run deploy/gpu-pack.sh on a machine that
# built, bring .gpu along, and run NF_GPU_PACKED=1 deploy/gpu-check.sh:
# step 1 then unpacks the prebuilt programs and their libraries instead.
# Exit status: 77 when there is no usable GPU; else 0 when every check
# passed, the first failing check's status otherwise.  From step 2 on, a
# failing check does not stop the rest, and a summary with each check's
# time ends the run.  Every step's output goes to the terminal and to
# ${NF_GPU_OUT:-gpu-check-out}/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${NF_GPU_OUT:-gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

echo "== 0. the machine"
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "(no nvidia-smi)"

export NEOFLOW_LIB="$PWD/lib"
if [ "${NF_GPU_PACKED:-0}" = 1 ]; then
  echo "== 1. the packed build (.gpu/pack.tar.xz)"
  tar -xJf .gpu/pack.tar.xz
  cuda_lib=""
  if command -v nvcc >/dev/null; then cuda_lib="$(dirname "$(command -v nvcc)")/../lib64:"; fi
  export LD_LIBRARY_PATH="$PWD/.gpu/lib:$cuda_lib/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export NF_NEOFLOWD="$PWD/build/daemon/neoflowd" NEOFLOW_WORKER="$PWD/build/daemon/search/neoflow-worker"
else
  echo "== 1. set-up and build"
  if [ "${NF_GPU_SKIP_SETUP:-0}" != 1 ]; then ./deploy/setup.sh python3-torch; fi
  [ -f build/build.ninja ] || meson setup build >/dev/null
  ninja -C build
  # the toolkit's libraries, as the programs' run path names them
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${CUDA_HOME:-/usr/local/cuda}/lib64"
fi
# cuBLAS and cuDNN, which the session loads by name at run time: the
# system's, else those of the NVIDIA Python packages PyTorch brings
# (site-packages/nvidia/*/lib), added to LD_LIBRARY_PATH.  A check
# without them would skip its library parts, so a missing one fails here
# (NF_GPU_ALLOW_NO_LIBS=1 goes on without it).
gpu_libs() {
  python3 - "$1" <<'PY'
import ctypes, glob, os, site, sys
want = {"cuBLAS": ["libcublas.so.13", "libcublas.so.12"],
        "cuDNN": ["libcudnn.so.9", "libcudnn.so.8"]}
def loads(name):
    try:
        ctypes.CDLL(name)
    except OSError:
        return None
    with open("/proc/self/maps") as f:
        for line in f:
            if "/" + name in line:
                return line.split()[-1]
    return name
if sys.argv[1] == "dirs":
    roots = dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
    dirs = []
    for lib, names in want.items():
        if any(loads(n) for n in names):
            continue
        for n in names:
            hits = [h for r in roots
                    for h in glob.glob(os.path.join(r, "nvidia", "**", n), recursive=True)]
            if hits:
                dirs.append(os.path.dirname(hits[0]))
                break
    print(":".join(dict.fromkeys(dirs)))
else:
    missing = 0
    for lib, names in want.items():
        where = next((w for w in map(loads, names) if w), None)
        print("%s: %s" % (lib, where or "NOT FOUND (tried %s)" % ", ".join(names)))
        missing += where is None
    sys.exit(1 if missing else 0)
PY
}
extra=$(gpu_libs dirs || true)
if [ -n "$extra" ]; then export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$extra"; fi
if ! gpu_libs show; then
  if [ "${NF_GPU_ALLOW_NO_LIBS:-0}" = 1 ]; then
    echo "gpu-check: going on without them (NF_GPU_ALLOW_NO_LIBS=1): their checks skip"
  else
    echo "gpu-check: cuBLAS or cuDNN cannot be loaded (install them, or NF_GPU_ALLOW_NO_LIBS=1)"
    exit 1
  fi
fi
build/client/neoflow compile --target cuda:sm_90 lib/nn.nf relu --shape X=64,64 -o "$out/relu.cubin" \
  || { echo "gpu-check: NVRTC is missing from this build (meson option gpu_toolkit)"; exit 1; }

# From here on a failing check does not stop the others (a GPU's time is
# scarce: one run should say everything it can); the exit status is the
# first failure's.  Each check's time is printed with its result.
first_fail=0
summary=()
# check NAME LIMIT CMD...: runs CMD for at most LIMIT seconds (a kernel
# that hangs on the device must not eat the machine's whole lease; then
# 124, "timed out").
check() {
  local name=$1 limit=$2 t0=$SECONDS st=0
  shift 2
  echo "-- $name"
  timeout -k 10 "$limit" "$@" || st=$?
  local res="ok"
  if [ "$st" -eq 124 ] || [ "$st" -eq 137 ]; then res="TIMED OUT (${limit} s)"
  elif [ "$st" -ne 0 ]; then res="FAILED (status $st)"; fi
  summary+=("$(printf '%-44s %-20s %4d s' "$name" "$res" $((SECONDS - t0)))")
  echo "-- $name: $res, $((SECONDS - t0)) s"
  if [ "$st" -ne 0 ] && [ "$first_fail" -eq 0 ]; then first_fail=$st; fi
  return 0
}

echo "== 2. GPU tests"
# (no GPU: test_cuda exits 77, and so does this script)
st=0 t0=$SECONDS
NF_TEST_CUDA_EMU="$PWD/tests/cuda_emu.h" timeout -k 10 300 build/tests/test_cuda gpu || st=$?
[ "$st" -eq 77 ] && { echo "gpu-check: no usable GPU (test_cuda gpu skipped)"; exit 77; }
summary+=("$(printf '%-44s %-20s %4d s' "test_cuda gpu" \
  "$([ "$st" -eq 0 ] && echo ok || echo "FAILED (status $st)")" $((SECONDS - t0)))")
[ "$st" -eq 0 ] || first_fail=$st
export NF_TEST_GPU_REAL=1 NEOFLOW_VERIFIED=none NF_NEOFLOWD="${NF_NEOFLOWD:-$PWD/build/daemon/neoflowd}"
check "test_session gpu (daemon kernels)" 240 env CK_RUN_CASE=gpu build/tests/test_session
# cuDNN at tier 0: every convolution form against the interpreter, and
# the CNN example's session against the CPU's
check "test_gemm gemm (cuBLAS, cuDNN)" 180 env CK_RUN_CASE=gemm build/tests/test_gemm
check "test_session cudnn" 180 env CK_RUN_CASE=cudnn build/tests/test_session
# the kernels a session generates itself for the rest (NVRTC loaded at run
# time), without a daemon
check "test_session generated" 180 env CK_RUN_CASE=generated build/tests/test_session
# steps replayed as CUDA graphs, bit-identical to op-by-op steps
check "test_session graphs" 180 env CK_RUN_CASE=graphs build/tests/test_session
unset NF_TEST_GPU_REAL NEOFLOW_VERIFIED

echo "== 3. training on the GPU against the CPU"
run_train() {
  build/client/neoflow train examples/mlp.nf mlp --data synthetic --steps 30 --batch 64 \
    --optim sgd --lr 0.05 --daemon "$1" --device "$2" --compile-only --wait-kernels 120 \
    --log-every 30 | tail -n 1
}
# (run by check in a shell of its own without set -e: each failure is
# returned by hand)
train_vs_cpu() {
  local sock_dir cpu gpu gen dpid st=0 r
  sock_dir=$(mktemp -d) || return 1
  build/daemon/neoflowd --socket "$sock_dir/s.sock" --cache "$sock_dir/c.db" &
  dpid=$!
  sleep 1
  cpu=$(run_train none cpu) || st=$?
  gpu=$(run_train "$sock_dir/s.sock" cuda) || { r=$?; [ "$st" -ne 0 ] || st=$r; }
  kill "$dpid"; wait "$dpid" || true; rm -rf "$sock_dir"
  # without a daemon: cuBLAS and the kernels generated in the session
  gen=$(run_train none cuda) || { r=$?; [ "$st" -ne 0 ] || st=$r; }
  echo "cpu: ${cpu:-}"; echo "gpu: ${gpu:-}"; echo "gpu, no daemon: ${gen:-}"
  [ "$st" -eq 0 ] || return "$st"
  python3 - "$cpu" "$gpu" "$gen" <<'PY'
import re, sys
a, b, c = (float(re.search(r"-> ([0-9.eE+-]+)", s).group(1)) for s in sys.argv[1:4])
ok = all(abs(a - x) <= 1e-3 * max(abs(a), 1e-6) for x in (b, c))
print("final loss: cpu %.6g, gpu %.6g, gpu without a daemon %.6g: %s"
      % (a, b, c, "agree" if ok else "DIFFER"))
sys.exit(0 if ok else 1)
PY
}
export -f run_train train_vs_cpu
check "neoflow train: cuda against cpu" 420 bash -o pipefail -c train_vs_cpu

echo "== 4. benchmark against PyTorch CUDA"
# (its limit: NF_GPU_BENCH_LIMIT seconds, by default 420 without tuning,
# and 30 s more than the tuning's for each of the six workloads with it)
if [ "${NF_GPU_TUNE_TRIALS:-0}" -gt 0 ]; then
  budget=(--tune-trials "$NF_GPU_TUNE_TRIALS" --tune-seconds "${NF_GPU_TUNE_SECONDS:-20}")
  bench_limit=${NF_GPU_BENCH_LIMIT:-$((420 + 6 * (${NF_GPU_TUNE_SECONDS:-20} + 30)))}
else
  budget=(--compile-only)
  bench_limit=${NF_GPU_BENCH_LIMIT:-420}
fi
check "bench/run --device cuda" "$bench_limit" python3 bench/run --device cuda --threads 1 --rounds 1 \
  "${budget[@]}" --no-plot --python "$(command -v python3)" --out "$out/bench" \
  --json "$out/gpu_bench.json"

echo "== summary"
printf '%s\n' "${summary[@]}"
if [ "$first_fail" -ne 0 ]; then
  echo "gpu-check: some checks FAILED (above); results in $out"
  exit "$first_fail"
fi
echo "gpu-check: all steps passed; results in $out"
