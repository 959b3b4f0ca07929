#!/usr/bin/env bash
# bench/client_figures.sh [BUILD_DIR] [WORKLOAD...] - issue 7's figures for
# each public workload (../shared/WORKLOADS.md shapes), through
# `neoflow train --json` on synthetic data:
#   cold   time from `neoflow train` starting to the end of step 1 with an
#          empty cache and no daemon running (the client starts one; its
#          start, the compiles and any bounded wait included)
#   tier0  ms/step with no daemon (OpenBLAS sgemm + the interpreter)
#   tier1  ms/step once every subgraph runs the daemon's default kernel
#   warm   the same as cold for a second session (the daemon running, its
#          cache and the record of verified kernels filled)
#   tuned  ms/step once every subgraph has its tuned kernel (budget:
#          TRIALS trials / SECONDS s per subgraph, default 24 / 40)
# Prints one line per workload and writes bench/client_figures.json.
# Run by hand on an idle machine; it takes long (tier 0 of conv2d alone
# is minutes per step).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}; shift || true
NF=$B/client/neoflow
export NEOFLOW_LIB=$PWD/lib
export NF_NEOFLOWD=${NF_NEOFLOWD:-$PWD/$B/daemon/neoflowd}
TRIALS=${TUNE_TRIALS:-24}
SECONDS_PER=${TUNE_SECONDS:-40}
T0_STEPS=${T0_STEPS:-2}
declare -A ARGS=(
  [matmul]="examples/workloads.nf matmul_loss --shape A=1024,1024 --shape B=1024,1024 --shape G=1024,1024 --params A,B"
  [conv2d]="examples/workloads.nf conv2d_relu_loss --shape I=8,64,56,56 --shape Wt=64,64,3,3 --params Wt"
  [lltm]="examples/workloads.nf lltm_loss --shape X=8,64,256 --shape H0=64,512 --shape C0=64,512 --shape W=1536,768 --shape b=1536 --params W,b"
  [milstm]="examples/workloads.nf milstm_loss --shape X=8,64,512 --shape H0=64,512 --shape C0=64,512 --shape W=2048,512 --shape U=2048,512 --shape alpha=2048 --shape beta1=2048 --shape beta2=2048 --shape b=2048 --params W,U,alpha,beta1,beta2,b"
  [capsnet]="examples/workloads.nf capsnet_loss --shape u=32,1152,8 --shape W=1152,10,16,8 --shape targets=32,10 --params W"
  [mobilenet_dws]="examples/workloads.nf mobilenet_dws_loss --shape X=16,128,28,28 --shape Wdw=128,1,3,3 --shape Wpw=128,128,1,1 --params Wdw,Wpw"
)
WL=("$@")
[ ${#WL[@]} -gt 0 ] || WL=(matmul conv2d lltm milstm capsnet mobilenet_dws)
field() { python3 -c "import json,sys; r=[json.loads(l) for l in sys.stdin if l.startswith('{')]; print(r[$2]['$1'] if r else 'nan')"; }
out=bench/client_figures.json
echo "[" > "$out"
sep=""
for w in "${WL[@]}"; do
  a=${ARGS[$w]}
  tmp=$(mktemp -d); chmod 700 "$tmp"
  export NEOFLOW_SOCKET=$tmp/d/neoflowd.sock NEOFLOW_CACHE=$tmp/cache.db NEOFLOW_VERIFIED=$tmp/verified
  # cold: empty cache, no daemon; the client starts one
  cold_json=$($NF train $a --data synthetic --steps 1 --json --compile-only)
  cold=$(echo "$cold_json" | field elapsed_ms 0)
  first=$(echo "$cold_json" | field first_step_ms 0)
  # tier 1: every default kernel in (the daemon started above keeps running)
  t1=$($NF train $a --data synthetic --steps 4 --json --compile-only --wait-kernels 600 | field ms -1)
  # tuned
  tu_json=$($NF train $a --data synthetic --steps 4 --json --wait-kernels 7200 \
            --tune-trials "$TRIALS" --tune-seconds "$SECONDS_PER")
  tu=$(echo "$tu_json" | field ms -1); tu2=$(echo "$tu_json" | field tier2 -1); k=$(echo "$tu_json" | field kernels -1)
  # warm: a second session finds everything in place
  warm=$($NF train $a --data synthetic --steps 1 --json | field elapsed_ms 0)
  pkill -TERM -f "neoflowd --socket $NEOFLOW_SOCKET" 2>/dev/null || true
  for p in $(pgrep -x neoflowd || true); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "NEOFLOW_SOCKET=$NEOFLOW_SOCKET"; then kill -TERM "$p"; fi
  done
  sleep 1
  # tier 0
  t0=$($NF train $a --data synthetic --steps "$T0_STEPS" --json --daemon none | field ms -1)
  rm -rf "$tmp"
  printf '%-14s cold %8.0f ms (session %6.0f ms)  warm %6.0f ms  tier0 %9.2f ms  tier1 %8.2f ms  tuned %8.2f ms (%s/%s tier 2)\n' \
    "$w" "$cold" "$first" "$warm" "$t0" "$t1" "$tu" "$tu2" "$k"
  printf '%s{"workload":"%s","cold_first_step_ms":%s,"session_first_step_ms":%s,"warm_first_step_ms":%s,"tier0_ms":%s,"tier1_ms":%s,"tuned_ms":%s,"tier2_kernels":%s,"kernels":%s,"tune_trials":%s,"tune_seconds":%s}\n' \
    "$sep" "$w" "$cold" "$first" "$warm" "$t0" "$t1" "$tu" "$tu2" "$k" "$TRIALS" "$SECONDS_PER" >> "$out"
  sep=","
done
echo "]" >> "$out"
