#!/usr/bin/env bash
# Strategies over real HTTP with separate processes, as an operator would run them (issue 7:
# "bench against 7 mock engines, the same ordering, hit rates within 5 points of simulate"):
# 7 `mock-engine` processes, one `serve` in front of them, `bench` driving it; for each
# strategy the engines and the router are started fresh (empty caches). Then `simulate` runs the
# same workload on the same fleet, and the script prints each strategy's HTTP hit rate beside
# simulate's. The demo does this in one process; this is the same with every part on its own.
#
# Usage: bench/http-strategies.sh   (any HTTP_* variable overrides)
#   HTTP_STRATEGIES=random,prefix-aware,cache-aware
#   HTTP_WORKLOAD=long-context  HTTP_PARAMS="documents=32"  (space-separated workload params)
#   HTTP_PRESET=small           engine preset (small: 65,536 tokens of cache, about 8 of the
#                               8k-token documents, so 32 documents need most of the fleet)
#   HTTP_REQUESTS=400  HTTP_CONCURRENCY=8
#   HTTP_TIME_SCALE=0.5         engines' wall seconds per engine second (TTFTs in the table are
#                               wall time, so scaled by this)
#   HTTP_PORT=18800             router port; engines on the next 7
# Everything listens on 127.0.0.1 and is stopped on exit. About 3 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATEGIES="${HTTP_STRATEGIES:-random,prefix-aware,cache-aware}"
WORKLOAD="${HTTP_WORKLOAD:-long-context}"
PARAMS="${HTTP_PARAMS:-documents=32}"
PRESET="${HTTP_PRESET:-small}"
REQUESTS="${HTTP_REQUESTS:-400}"
CONCURRENCY="${HTTP_CONCURRENCY:-8}"
SCALE="${HTTP_TIME_SCALE:-0.5}"
PORT="${HTTP_PORT:-18800}"
BIN=target/release/prefix-router
OUT="${HTTP_OUT:-target/http-strategies}"
mkdir -p "$OUT"

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo build --release --locked -q -p prefix-router

BENCH_NAME=http-strategies
# shellcheck source=bench/lib.sh
source bench/lib.sh

param_flags=()
for p in $PARAMS; do param_flags+=(--param "$p"); done

run_one() { # strategy
    local serve e
    start_engines $((PORT + 1)) "$OUT" --preset "$PRESET" --time-scale "$SCALE"
    "$BIN" serve --listen "127.0.0.1:$PORT" --strategy "$1" "${instance_flags[@]}" \
        >"$OUT/serve-$1.log" 2>&1 &
    serve=$!
    pids+=("$serve")
    wait_ready "http://127.0.0.1:$PORT/ready" "serve ($1)" "$OUT/serve-$1.log" 10
    "$BIN" bench --target "http://127.0.0.1:$PORT" --workload "$WORKLOAD" "${param_flags[@]}" \
        --concurrency "$CONCURRENCY" --requests "$REQUESTS" --label "$1" \
        --json "$OUT/$1.json" >"$OUT/bench-$1.txt" 2>&1 ||
        { echo "http-strategies: bench failed for $1:" >&2; tail -n 5 "$OUT/bench-$1.txt" >&2; exit 1; }
    curl -fsS "http://127.0.0.1:$PORT/metrics" | grep -E '^prefix_router_decisions_total' \
        >"$OUT/decisions-$1.txt" || true
    for e in "$serve" "${engines[@]}"; do kill "$e" 2>/dev/null || true; done
    for e in "$serve" "${engines[@]}"; do wait "$e" 2>/dev/null || true; done
}

echo "$WORKLOAD ($PARAMS), $REQUESTS requests, $CONCURRENCY clients, 7 x $PRESET mock engines at time scale $SCALE (TTFTs in wall ms)"
IFS=, read -r -a strategies <<<"$STRATEGIES"
for s in "${strategies[@]}"; do run_one "$s"; done
grep -E '^strategy ' "$OUT/bench-${strategies[0]}.txt"
for s in "${strategies[@]}"; do grep -E "^$s " "$OUT/bench-$s.txt"; done

echo
echo "simulate, same workload and fleet (engine ms):"
"$BIN" simulate --workload "$WORKLOAD" "${param_flags[@]}" --preset "$PRESET" --instances 7 \
    --concurrency "$CONCURRENCY" --requests "$REQUESTS" --strategies "$STRATEGIES" \
    --json "$OUT/simulate.json" >"$OUT/simulate.txt" 2>&1
grep -E '^strategy |^(random|round-robin|least-outstanding|prefix-aware|cache-aware|kv-aware) +[0-9]' "$OUT/simulate.txt"

echo
echo "hit rate over HTTP against simulate (points):"
python3 - "$OUT" "${strategies[@]}" <<'EOF'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
sim = {r["strategy"]: r for r in json.load(open(f"{out}/simulate.json"))["results"]}
worst = 0.0
for n in names:
    http = json.load(open(f"{out}/{n}.json"))["results"][0]
    h, s = http["kv_hit_rate"] * 100, sim[n]["kv_hit_rate"] * 100
    worst = max(worst, abs(h - s))
    print(f"  {n:<18} HTTP {h:5.1f}%  simulate {s:5.1f}%  ({h - s:+.1f})")
print(f"  largest difference: {worst:.1f} points")
EOF
