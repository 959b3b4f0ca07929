#!/usr/bin/env bash
# deploy/demo.sh - set up, build, and run the main job: check the standard
# library and the example operators, then evaluate the examples with the
# reference interpreter.  (Later issues make this train a model.)
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
ninja -C build >/dev/null
NF=build/client/neoflow
export NEOFLOW_LIB="$PWD/lib"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== neoflow check lib/nn.nf"
$NF check lib/nn.nf
echo
echo "== neoflow check examples/models.nf"
$NF check examples/models.nf
echo
run() { echo "\$ neoflow $*"; $NF "$@"; echo; }
run eval lib/nn.nf conv2d --shape I=2,6,11,11 --shape W=6,2,3,3 \
    --param stride=2 --param pad=1 --param dilation=2 --param groups=3 --out "$out/conv"
run eval examples/models.nf lltm_8 --seed 7
run eval examples/models.nf capsule_routing --seed 7
run eval examples/models.nf mobilenet_block --seed 7
run hash examples/models.nf capsule_routing
echo "== the LLTM cell instantiated as a flat graph (calls expanded)"
$NF print examples/models.nf lltm_cell --shape X=4,16 --shape H=4,32 \
    --shape C=4,32 --shape W=96,48 --shape b=96 | sed -n '1,12p'
echo
echo "== the library against NumPy (tests/numpy_check.py)"
python3 tests/numpy_check.py "$NF" lib/nn.nf | tail -n 4
echo
echo "== the CPU code generator: the same conv2d as a compiled kernel (default schedule)"
run lower lib/nn.nf matmul --shape A=64,64 --shape B=64,64
run compile lib/nn.nf conv2d --shape I=2,6,11,11 --shape W=6,2,3,3 \
    --param stride=2 --param pad=1 --param dilation=2 --param groups=3 -o "$out/conv.so"
run eval lib/nn.nf conv2d --shape I=2,6,11,11 --shape W=6,2,3,3 \
    --param stride=2 --param pad=1 --param dilation=2 --param groups=3 --engine compiled --threads 2
echo "== the schedule search: matmul 256^3 tuned (40 candidates measured in a sandboxed worker)"
run tune lib/nn.nf matmul --shape A=256,256 --shape B=256,256 --trials 40 -o "$out/matmul.sched"
echo "== neoflowd: tuning through the compile daemon; the second request comes from its cache"
NFD=build/daemon/neoflowd
"$NFD" --socket "$out/run/neoflowd.sock" --cache "$out/cache.db" --log-level warn &
nfd_pid=$!
for _ in $(seq 100); do [ -S "$out/run/neoflowd.sock" ] && break; sleep 0.05; done
export NEOFLOW_SOCKET="$out/run/neoflowd.sock"
run tune lib/nn.nf matmul --shape A=128,128 --shape B=128,128 --daemon --trials 20
TIMEFORMAT=%R
time_hit=$( { time $NF tune lib/nn.nf matmul --shape A=128,128 --shape B=128,128 \
    --daemon --trials 20 > "$out/hit.txt"; } 2>&1 )
head -n 1 "$out/hit.txt"
echo "   (answered in ${time_hit} s)"
run status
$NF cache stats --cache "$out/cache.db"
echo "== training: a CNN written wholly in .nf (examples/cnn.nf) on synthetic data; it starts"
echo "   on fallback kernels and the daemon's kernels are swapped in as they arrive"
run train examples/cnn.nf cnn --data synthetic --steps 60 --batch 16 --log-every 10 --tune-trials 8 --tune-seconds 10
kill -TERM $nfd_pid; wait $nfd_pid
unset NEOFLOW_SOCKET
echo "== gradients: capsule routing (3 iterations) with respect to W, as .nf"
$NF grad examples/workloads.nf capsnet_loss --wrt W --shape u=4,32,8 \
    --shape W=32,10,16,8 --shape targets=4,10 | sed -n '1,6p'
echo "   ..."
run grad examples/workloads.nf lltm_loss --wrt W,b --shape X=8,4,16 \
    --shape H0=4,32 --shape C0=4,32 --shape W=96,48 --shape b=96 --out "$out/lltm"
echo "== gradient cost against the forward at the benchmark shapes (bench/grad_flops.sh)"
./bench/grad_flops.sh "$NF" | sed -n '1,7p'
echo
echo "== gradients against PyTorch's autograd (tests/torch_check.py; needs python3-torch)"
set +e
python3 tests/torch_check.py "$NF" lib/nn.nf > "$out/torch.log" 2>&1
st=$?
set -e
if [ $st -eq 77 ]; then echo "(python3-torch is not installed: skipped)"; else tail -n 3 "$out/torch.log"; [ $st -eq 0 ]; fi
echo "demo: done"
