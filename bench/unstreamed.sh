#!/usr/bin/env bash
# Batch traffic that does not stream, beside interactive traffic that does: half of the requests
# (spread evenly) go out with `stream: false` (`bench --unstreamed 0.5`), through `serve` with
# its default strategy (cache-aware) in front of 7 mock engines. A request answered whole shows
# the router no first token; counted as queued prefill until its whole answer, it made its
# instance look congested for the whole decode, so revisits of the documents that instance
# holds went elsewhere and were computed again. This tree retires such a request when its first
# token was expected. The script runs this tree's binary and a baseline binary in alternating
# rounds, engines and router started fresh (empty caches) for each run, and prints each run's
# bench line (hit rate, TTFT: for the whole answers, the time to the whole answer) and its
# decision reasons.
#
# Usage: bench/unstreamed.sh BASELINE_BIN    (an older build's prefix-router, say the commit
#                                             before 91c37c0, built with cargo build --release)
#   UNSTREAMED_SHARE=0.5   UNSTREAMED_ROUNDS=2
#   UNSTREAMED_WORKLOAD=long-context
#   UNSTREAMED_PARAMS="documents=100 output_tokens.min=600 output_tokens.max=1000"
#                          (answers of 600-1,000 tokens: a whole one takes seconds)
#   UNSTREAMED_PRESET=small  UNSTREAMED_REQUESTS=400  UNSTREAMED_CONCURRENCY=16
#   UNSTREAMED_TIME_SCALE=0.5   UNSTREAMED_PORT=18900 (router; engines on the next 7)
# Everything listens on 127.0.0.1 and is stopped on exit. About 7 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE="${1:-}"
if [[ -z "$BASELINE" || ! -x "$BASELINE" ]]; then
    echo "unstreamed: give a baseline prefix-router binary, e.g. bench/unstreamed.sh /tmp/old/prefix-router" >&2
    exit 2
fi
SHARE="${UNSTREAMED_SHARE:-0.5}"
ROUNDS="${UNSTREAMED_ROUNDS:-2}"
WORKLOAD="${UNSTREAMED_WORKLOAD:-long-context}"
PARAMS="${UNSTREAMED_PARAMS:-documents=100 output_tokens.min=600 output_tokens.max=1000}"
PRESET="${UNSTREAMED_PRESET:-small}"
REQUESTS="${UNSTREAMED_REQUESTS:-400}"
CONCURRENCY="${UNSTREAMED_CONCURRENCY:-16}"
SCALE="${UNSTREAMED_TIME_SCALE:-0.5}"
PORT="${UNSTREAMED_PORT:-18900}"
BIN=target/release/prefix-router
OUT="${UNSTREAMED_OUT:-target/unstreamed}"
mkdir -p "$OUT"

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo build --release --locked -q -p prefix-router

BENCH_NAME=unstreamed
# shellcheck source=bench/lib.sh
source bench/lib.sh

param_flags=()
for p in $PARAMS; do param_flags+=(--param "$p"); done

run_one() { # label binary
    local serve e
    start_engines $((PORT + 1)) "$OUT" --preset "$PRESET" --time-scale "$SCALE"
    "$2" serve --listen "127.0.0.1:$PORT" "${instance_flags[@]}" >"$OUT/serve-$1.log" 2>&1 &
    serve=$!
    pids+=("$serve")
    wait_ready "http://127.0.0.1:$PORT/ready" "serve ($1)" "$OUT/serve-$1.log" 10
    "$BIN" bench --target "http://127.0.0.1:$PORT" --workload "$WORKLOAD" "${param_flags[@]}" \
        --concurrency "$CONCURRENCY" --requests "$REQUESTS" --unstreamed "$SHARE" --label "$1" \
        >"$OUT/bench-$1.txt" 2>&1 ||
        { echo "unstreamed: bench failed for $1:" >&2; tail -n 5 "$OUT/bench-$1.txt" >&2; exit 1; }
    grep -E "^strategy " "$OUT/bench-$1.txt" | head -1 >"$OUT/header.txt"
    grep -E "^$1 " "$OUT/bench-$1.txt" >>"$OUT/lines.txt"
    echo "  $1: $(curl -fsS "http://127.0.0.1:$PORT/metrics" | grep -E '^prefix_router_decisions_total' |
        sed -E 's/.*reason="([a-z_]+)".*\} ([0-9]+)/\1 \2/' | sort | tr '\n' ' ')" >>"$OUT/decisions.txt"
    for e in "$serve" "${engines[@]}"; do kill "$e" 2>/dev/null || true; done
    for e in "$serve" "${engines[@]}"; do wait "$e" 2>/dev/null || true; done
}

echo "$WORKLOAD ($PARAMS), $REQUESTS requests ($SHARE of them with stream false), $CONCURRENCY clients, 7 x $PRESET mock engines at time scale $SCALE (wall ms)"
: >"$OUT/lines.txt"
: >"$OUT/decisions.txt"
for r in $(seq 1 "$ROUNDS"); do
    run_one "baseline-$r" "$BASELINE"
    run_one "this-tree-$r" "$BIN"
done
cat "$OUT/header.txt" "$OUT/lines.txt"
echo
echo "decisions (reason count):"
cat "$OUT/decisions.txt"
