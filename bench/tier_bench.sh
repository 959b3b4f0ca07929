#!/usr/bin/env bash
# bench/tier_bench.sh [BUILD_DIR] - a team's cache tier (docs/daemon.md):
# the wall time of `neoflow train examples/mlp.nf --steps 1 --compile-only
# --wait-kernels 120` (every subgraph's kernel asked of the node's daemon
# and waited for) on a fresh node daemon
#   1. alone (it compiles every subgraph),
#   2. naming an upstream whose cache holds them (a lookup each),
#   3. naming an upstream that is down (a failed lookup each, then compiles).
# Run by hand; each node starts with an empty cache.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
D=$(mktemp -d /tmp/nf_tier.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$D"' EXIT
export NEOFLOW_LIB=$PWD/lib NEOFLOW_CONFIG=none NEOFLOW_VERIFIED=none
daemon() { # NAME [UPSTREAM-SOCKET PUBLIC-KEY]
  { printf '[daemon]\nsocket = %s/%s/run/n.sock\n[cache]\ncache = %s/%s/c.db\n' "$D" "$1" "$D" "$1"
    [ $# -gt 1 ] && printf '[upstream]\naddress = %s\npublic_key = %s\ntimeout_ms = 1000\n' "$2" "$3"
  } > "$D/$1.conf"
  mkdir -p "$D/$1"
  "$B/daemon/neoflowd" --config "$D/$1.conf" > "$D/$1.log" 2>&1 &
  for _ in $(seq 100); do [ -S "$D/$1/run/n.sock" ] && break; sleep 0.05; done
}
train() { # SOCKET
  local t0=$(date +%s.%N)
  "$B/client/neoflow" train examples/mlp.nf mlp --data synthetic --batch 32 --steps 1 --threads 1 \
    --daemon "$1" --no-spawn --compile-only --wait-kernels 120 >/dev/null 2>&1
  awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }'
}
daemon up
pk=$("$B/daemon/neoflowd" --config "$D/up.conf" --public-key)
train "$D/up/run/n.sock" >/dev/null   # the upstream's own client fills its cache
daemon alone
daemon tier "$D/up/run/n.sock" "$pk"
daemon down "$D/nothere.sock" "$pk"
printf "node alone (compiles):        %6.2f s\n" "$(train "$D/alone/run/n.sock")"
printf "node with its upstream:       %6.2f s  (%s kernels taken from it)\n" \
  "$(train "$D/tier/run/n.sock")" "$(grep -c 'kernel from the upstream' "$D/tier.log" || true)"
printf "node with its upstream down:  %6.2f s\n" "$(train "$D/down/run/n.sock")"
