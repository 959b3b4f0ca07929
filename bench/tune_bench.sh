#!/usr/bin/env bash
# bench/tune_bench.sh [BUILD_DIR] - the schedule search's figures, run by
# hand (never by the tests; about 30-60 min on a 2-core machine with the
# default budgets):
#
#  1. matmul 1024^3 tuned at 1 and at 2 threads, then codegen_bench runs
#     the tuned kernels next to OpenBLAS sgemm in one run (ratio of
#     GFLOP/s: >= 0.9 is the goal);
#  2. the conv2d workload's convolution (N 8, C 64, 56 x 56, K 64, 3 x 3,
#     pad 1): forward and the gradients of the input and of the weight,
#     each tuned at 1 and 2 threads, then PyTorch's (oneDNN) times for the
#     same three at the same thread counts (bench/conv_torch.py); ratio =
#     PyTorch ms / NeoFlow ms (>= 1: NeoFlow is faster);
#  3. the cost model against random search: the same budget and seed on
#     matmul 512^3 and the conv2d forward, both curves in one SVG.
#
#   TRIALS   trials per tuning run (default 200)
#   SECONDS  wall-time cap per tuning run (default 600)
#   OUT      output directory (default bench-out): schedules, JSON, CSV, SVG
#   PARTS    which of the four parts to run (default "1 2 3 4")
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
NF="$B/client/neoflow"
TRIALS=${TRIALS:-200}
SECONDS_CAP=${SECONDS:-600}
OUT=${OUT:-bench-out}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
export NEOFLOW_LIB="$PWD/lib"
[ -x "$NF" ] || { echo "tune_bench: $NF not built" >&2; exit 1; }

tune() { # name threads args...
  local name=$1 th=$2
  shift 2
  echo "== tuning $name at $th thread(s)" >&2
  "$NF" tune lib/nn.nf "$@" --threads "$th" --trials "$TRIALS" --seconds "$SECONDS_CAP" \
    --json --csv "$OUT/$name.t$th.csv" --svg "$OUT/$name.t$th.svg" \
    -o "$OUT/$name.t$th.sched" | tee "$OUT/$name.t$th.json" >&2
}
PARTS=${PARTS:-1 2 3 4}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
field() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# 1. matmul 1024^3 against OpenBLAS
MM=(matmul --shape A=1024,1024 --shape B=1024,1024)
if part 1; then
  tune matmul1024 1 "${MM[@]}"
  tune matmul1024 2 "${MM[@]}"
  echo "== matmul 1024^3: tuned kernels next to OpenBLAS sgemm (one run)"
  NF_MATMUL_SCHEDULE="$OUT/matmul1024.t1.sched" NF_MATMUL_SCHEDULE_T2="$OUT/matmul1024.t2.sched" \
    "$B/bench/codegen_bench" 10 | grep -E "case|matmul"
fi

# 2. conv2d workload convolution against PyTorch
CV=(conv2d --param pad=1 --shape I=8,64,56,56 --shape W=64,64,3,3)
if part 2; then
for th in 1 2; do
  tune conv_fwd $th "${CV[@]}"
  tune conv_gradI $th "${CV[@]}" --wrt I
  tune conv_gradW $th "${CV[@]}" --wrt W
done
echo "== conv2d workload convolution: NeoFlow tuned vs PyTorch (ms; ratio = torch / neoflow)"
printf "%-10s %8s %12s %12s %12s %8s\n" part threads default_ms neoflow_ms torch_ms ratio
for th in 1 2; do
  OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$th OMP_NUM_THREADS=$th \
    $PY bench/conv_torch.py $th > "$OUT/torch_conv.t$th.json"
  for part in fwd:forward_ms gradI:grad_I_ms gradW:grad_W_ms; do
    p=${part%%:*}
    k=${part#*:}
    nfms=$(field "$OUT/conv_$p.t$th.json" best_ms)
    dms=$(field "$OUT/conv_$p.t$th.json" default_ms)
    tms=$(field "$OUT/torch_conv.t$th.json" "$k")
    printf "%-10s %8s %12.2f %12.2f %12.2f %8.2f\n" "$p" "$th" "$dms" "$nfms" "$tms" \
      "$($PY -c "print($tms / $nfms)")"
  done
done
fi

# 3. the cost model against random search
if part 3; then
echo "== cost model vs random search (same budget and seed)"
"$NF" tune lib/nn.nf matmul --shape A=512,512 --shape B=512,512 --trials "$TRIALS" \
  --seconds "$SECONDS_CAP" --compare-random --json --svg "$OUT/model_vs_random.matmul512.svg" |
  tee "$OUT/model_vs_random.matmul512.json"
"$NF" tune lib/nn.nf "${CV[@]}" --trials "$TRIALS" --seconds "$SECONDS_CAP" --compare-random \
  --json --svg "$OUT/model_vs_random.conv.svg" | tee "$OUT/model_vs_random.conv.json"
fi

# 4. every workload's forward graph (the whole def as one graph: the
#    partitioner that cuts it into subgraphs lands with the client runtime),
#    tuned with a small budget against its default schedule
part 4 || exit 0
WL_TRIALS=${WL_TRIALS:-30}
WL_SECONDS=${WL_SECONDS:-150}
echo "== workloads (forward graphs, $WL_TRIALS trials): default vs tuned, 1 thread"
printf "%-20s %12s %12s %8s\n" workload default_ms best_ms speedup
wl() { # name args...
  local name=$1
  shift
  if ! "$NF" tune examples/workloads.nf "$name" "$@" --trials "$WL_TRIALS" --seconds "$WL_SECONDS" \
    --json > "$OUT/wl_$name.json"; then
    printf "%-20s %s\n" "$name" "(tuning failed: see above)"
    return 0
  fi
  printf "%-20s %12.3f %12.3f %8.2f\n" "$name" "$(field "$OUT/wl_$name.json" default_ms)" \
    "$(field "$OUT/wl_$name.json" best_ms)" "$(field "$OUT/wl_$name.json" speedup)"
}
wl matmul_loss --shape A=1024,1024 --shape B=1024,1024 --shape G=1024,1024
wl conv2d_relu_loss --shape I=8,64,56,56 --shape Wt=64,64,3,3
wl lltm_loss --shape X=8,64,256 --shape H0=64,512 --shape C0=64,512 --shape W=1536,768 --shape b=1536
wl milstm_loss --shape X=8,64,512 --shape H0=64,512 --shape C0=64,512 --shape W=2048,512 \
  --shape U=2048,512 --shape alpha=2048 --shape beta1=2048 --shape beta2=2048 --shape b=2048
wl capsnet_loss --shape u=32,1152,8 --shape W=1152,10,16,8 --shape targets=32,10
wl mobilenet_dws_loss --shape X=16,128,28,28 --shape Wdw=128,1,3,3 --shape Wpw=128,128,1,1
