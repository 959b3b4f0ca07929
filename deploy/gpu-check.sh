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
# Exit status: 0 when every step passed; the first failing step's status
# otherwise.  Every step's output goes to the terminal and to
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
fi
build/client/neoflow compile --target cuda:sm_90 lib/nn.nf relu --shape X=64,64 -o "$out/relu.cubin" \
  || { echo "gpu-check: NVRTC is missing from this build (meson option gpu_toolkit)"; exit 1; }

echo "== 2. GPU tests"
st=0
NF_TEST_CUDA_EMU="$PWD/tests/cuda_emu.h" build/tests/test_cuda gpu || st=$?
[ "$st" -eq 77 ] && { echo "gpu-check: no usable GPU (test_cuda gpu skipped)"; exit 77; }
[ "$st" -eq 0 ] || exit "$st"
NF_TEST_GPU_REAL=1 CK_RUN_CASE=gpu NEOFLOW_VERIFIED=none \
  NF_NEOFLOWD="${NF_NEOFLOWD:-$PWD/build/daemon/neoflowd}" build/tests/test_session
# cuDNN at tier 0: every convolution form against the interpreter, and
# the CNN example's session against the CPU's
NF_TEST_GPU_REAL=1 NEOFLOW_LIB="$PWD/lib" CK_RUN_CASE=gemm build/tests/test_gemm
NF_TEST_GPU_REAL=1 CK_RUN_CASE=cudnn NEOFLOW_VERIFIED=none build/tests/test_session
# the kernels a session generates itself for the rest (NVRTC loaded at run
# time), without a daemon
NF_TEST_GPU_REAL=1 CK_RUN_CASE=generated NEOFLOW_VERIFIED=none build/tests/test_session
# steps replayed as CUDA graphs, bit-identical to op-by-op steps
NF_TEST_GPU_REAL=1 CK_RUN_CASE=graphs NEOFLOW_VERIFIED=none build/tests/test_session

echo "== 3. training on the GPU against the CPU"
run_train() {
  build/client/neoflow train examples/mlp.nf mlp --data synthetic --steps 30 --batch 64 \
    --optim sgd --lr 0.05 --daemon "$1" --device "$2" --compile-only --wait-kernels 120 \
    --log-every 30 | tail -n 1
}
sock_dir=$(mktemp -d)
build/daemon/neoflowd --socket "$sock_dir/s.sock" --cache "$sock_dir/c.db" &
dpid=$!
sleep 1
cpu=$(run_train none cpu)
gpu=$(run_train "$sock_dir/s.sock" cuda)
kill "$dpid"; wait "$dpid" || true; rm -rf "$sock_dir"
# without a daemon: cuBLAS and the kernels generated in the session
gen=$(run_train none cuda)
echo "cpu: $cpu"; echo "gpu: $gpu"; echo "gpu, no daemon: $gen"
python3 - "$cpu" "$gpu" "$gen" <<'PY'
import re, sys
a, b, c = (float(re.search(r"-> ([0-9.eE+-]+)", s).group(1)) for s in sys.argv[1:4])
ok = all(abs(a - x) <= 1e-3 * max(abs(a), 1e-6) for x in (b, c))
print("final loss: cpu %.6g, gpu %.6g, gpu without a daemon %.6g: %s"
      % (a, b, c, "agree" if ok else "DIFFER"))
sys.exit(0 if ok else 1)
PY

echo "== 4. benchmark against PyTorch CUDA"
if [ "${NF_GPU_TUNE_TRIALS:-0}" -gt 0 ]; then
  budget=(--tune-trials "$NF_GPU_TUNE_TRIALS" --tune-seconds "${NF_GPU_TUNE_SECONDS:-20}")
else
  budget=(--compile-only)
fi
python3 bench/run --device cuda --threads 1 --rounds 1 "${budget[@]}" --no-plot \
  --python "$(command -v python3)" --out "$out/bench" --json "$out/gpu_bench.json"
echo "gpu-check: all steps passed; results in $out"
