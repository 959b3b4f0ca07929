#!/usr/bin/env bash
# bench/dist_bench.sh [BUILD_DIR] - data-parallel training over MPI
# (docs/distributed.md): samples per second of `neoflow train --data
# synthetic` at 1 rank and at 2 ranks (one thread each, the same batch per
# rank, the daemon's kernels waited for first), and the share of rank 0's
# step spent waiting for the exchanges.  Run by hand; on a 2-core machine
# the 2 ranks share the cores with the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
N=$B/client/neoflow
STEPS=${STEPS:-300}
export NEOFLOW_LIB=$PWD/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for w in "examples/mlp.nf mlp --batch 32" "examples/fashion_cnn.nf cnn --batch 64"; do
  set -- $w
  for ranks in 1 2; do
    cmd=("$N" train "$1" "$2" "$3" "$4" --data synthetic --steps "$STEPS" --threads 1
         --wait-kernels 120 --compile-only)
    [ "$ranks" -gt 1 ] && cmd=(mpirun --oversubscribe -np "$ranks" "${cmd[@]}")
    out=$("${cmd[@]}" 2>/dev/null)
    ms=$(echo "$out" | sed -n 's/.*; \([0-9.]*\) ms\/step (last 10).*/\1/p' | head -1)
    share=$(echo "$out" | sed -n 's/.*waited \([0-9.]*\) ms per step for the exchanges (\([0-9.]*\)%.*/\1 ms (\2%)/p')
    sps=$(awk -v ms="$ms" -v b="$4" -v r="$ranks" 'BEGIN { printf "%.0f", b * r * 1000 / ms }')
    printf "%-28s ranks %d  %8s ms/step  %7s samples/s  exchanges %s\n" "$1 $2 (batch $4)" \
      "$ranks" "$ms" "$sps" "${share:--}"
  done
done
