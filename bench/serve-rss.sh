#!/usr/bin/env bash
# serve's memory over a long run (issue 7, "Memory"): 7 mock engines on loopback, `serve` in
# front of them with a strategy, `bench` sending N requests closed loop, and serve's RSS and open
# file descriptors sampled every SAMPLE seconds. Prints the samples, then RSS at the end of the
# warm-up (the first WARMUP share of the run), the largest RSS after it and the growth between.
#
# Usage: bench/serve-rss.sh                 (defaults below; any RSS_* variable overrides)
#   RSS_REQUESTS=100000   requests bench sends
#   RSS_CONCURRENCY=64    bench's closed-loop clients
#   RSS_WORKLOAD=sharegpt built-in workload (its default parameters)
#   RSS_STRATEGY=cache-aware
#   RSS_PARAMS=""         strategy parameters, e.g. "index-blocks=65536" (space-separated)
#   RSS_TIME_SCALE=0.01   mock engines' wall seconds per engine second
#   RSS_SAMPLE=2          seconds between samples; RSS_WARMUP=0.2 share of samples that is warm-up
#   RSS_PORT=18300        router port; engines on the next 7
# Everything listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${RSS_REQUESTS:-100000}"
CONCURRENCY="${RSS_CONCURRENCY:-64}"
WORKLOAD="${RSS_WORKLOAD:-sharegpt}"
STRATEGY="${RSS_STRATEGY:-cache-aware}"
PARAMS="${RSS_PARAMS:-}"
SCALE="${RSS_TIME_SCALE:-0.01}"
SAMPLE="${RSS_SAMPLE:-2}"
WARMUP="${RSS_WARMUP:-0.2}"
PORT="${RSS_PORT:-18300}"
BIN=target/release/prefix-router
OUT="${RSS_OUT:-target/serve-rss}"
mkdir -p "$OUT"

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo build --release --locked -q -p prefix-router

BENCH_NAME=serve-rss
# shellcheck source=bench/lib.sh
source bench/lib.sh

start_engines $((PORT + 1)) "$OUT" --time-scale "$SCALE"

params=()
for p in $PARAMS; do params+=(--strategy-param "$p"); done
"$BIN" serve --listen "127.0.0.1:$PORT" \
    --strategy "$STRATEGY" "${params[@]}" "${instance_flags[@]}" >"$OUT/serve.log" 2>&1 &
serve=$!
pids+=($serve)
wait_ready "http://127.0.0.1:$PORT/ready" "serve" "$OUT/serve.log" 10

samples="$OUT/samples.csv"
echo "t_s,rss_kib,fds" >"$samples"
(
    start=$(date +%s)
    while kill -0 "$serve" 2>/dev/null; do
        rss=$(awk '/^VmRSS/ {print $2}' "/proc/$serve/status" 2>/dev/null || echo 0)
        fds=$(ls "/proc/$serve/fd" 2>/dev/null | wc -l)
        echo "$(($(date +%s) - start)),$rss,$fds" >>"$samples"
        sleep "$SAMPLE"
    done
) &
sampler=$!
pids+=($sampler)

echo "serve --strategy $STRATEGY ${PARAMS:+($PARAMS) }in front of 7 mock engines (time scale $SCALE);"
echo "bench: $REQUESTS $WORKLOAD requests, $CONCURRENCY clients"
"$BIN" bench --target "http://127.0.0.1:$PORT" --workload "$WORKLOAD" --model mock-llama \
    --requests "$REQUESTS" --concurrency "$CONCURRENCY" --json "$OUT/bench.json" | tail -n 8
sleep "$SAMPLE"
kill "$sampler" 2>/dev/null || true

echo "samples (t s, RSS KiB, open fds): $samples"
python3 - "$samples" "$WARMUP" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["rss_kib"]) > 0]
warm = max(1, int(len(rows) * float(sys.argv[2])))
after = rows[warm:]
if not after:
    sys.exit("serve-rss: too few samples; raise RSS_REQUESTS or lower RSS_SAMPLE")
base = int(rows[warm - 1]["rss_kib"])
peak = max(int(r["rss_kib"]) for r in after)
last = int(after[-1]["rss_kib"])
fds = [int(r["fds"]) for r in after]
print(f"samples: {len(rows)}, warm-up: the first {warm} ({rows[warm - 1]['t_s']} s)")
print(f"RSS after warm-up {base / 1024:.1f} MiB, largest after {peak / 1024:.1f} MiB, "
      f"last {last / 1024:.1f} MiB: growth {100 * (peak - base) / base:+.1f}%")
print(f"open fds after warm-up: {min(fds)}-{max(fds)}")
PY
