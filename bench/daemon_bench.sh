#!/usr/bin/env bash
# bench/daemon_bench.sh - neoflowd's cache-hit round trip (p50/p99) for 1
# and 64 concurrent clients and its RSS with 64 clients connected.  Starts
# a daemon of its own on a temporary socket and cache.
#   BUILD (default build), REQUESTS (default 500 per client for 1 client,
#   50 per client for 64)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
ninja -C "$B" daemon/neoflowd bench/daemon_bench >/dev/null
d=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$d"' EXIT
"$B/daemon/neoflowd" --socket "$d/run/s.sock" --cache "$d/cache.db" --log-level warn &
pid=$!
for _ in $(seq 100); do [ -S "$d/run/s.sock" ] && break; sleep 0.05; done
"$B/bench/daemon_bench" --socket "$d/run/s.sock" --clients 1 --requests "${REQUESTS:-500}"
"$B/bench/daemon_bench" --socket "$d/run/s.sock" --clients 64 --requests "${REQUESTS64:-50}"
