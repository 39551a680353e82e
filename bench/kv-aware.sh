#!/usr/bin/env bash
# kv-aware (routing on the engines' KV-cache events) against cache-aware (inferring them),
# over real HTTP: `demo --kv-events`, mock engines publishing their events over ZeroMQ on
# 127.0.0.1, routers subscribed and tokenizing as the engines do. Each case runs both
# strategies on fresh fleets in one demo; the lines kept are the table's rows and the
# placement summary. Cases:
#   - every built-in workload, one router (hit rate: kv-aware should reach cache-aware's),
#     ROUNDS times each (the second argument, default 1): on two shared cores, one run in a
#     few has an instance take only 3-9% of the requests, for either strategy, and reads 2-6
#     points low (sharegpt most often), so compare the rounds, not one pair;
#   - small caches (the `small` preset's 65,536 tokens, each ~1/8 of a 65-document working set):
#     engines evict often, which cache-aware can only guess;
#   - 10% of event batches dropped by every engine (gaps, replays, recovery);
#   - three router replicas with the load dealt among them, with and without the engines'
#     scraped queues (prefix affinity and the busiest instance over the mean).
# Usage: bench/kv-aware.sh [requests per case, default 1800] [rounds of the workloads, default 1].
# About 12 minutes on 2 cores, and 7 more per extra round.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1800}"
ROUNDS="${2:-1}"
cargo build --release --quiet -p prefix-router
BIN=target/release/prefix-router
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
echo "# bench/kv-aware.sh, $N requests per case, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
run() {
  local title="$1"
  shift
  echo
  echo "## $title"
  "$BIN" demo --kv-events --strategies cache-aware,kv-aware --requests "$N" \
    --plot "$OUT/plot.svg" "$@" 2>"$OUT/err" >"$OUT/out" || { cat "$OUT/err" "$OUT/out"; exit 1; }
  grep -E '^(strategy |cache-aware |kv-aware )|most-used|^Placement|batches applied' "$OUT/out"
}
for round in $(seq 1 "$ROUNDS"); do
  for w in long-context shared-system-prompt rag agent hot-prefix sharegpt; do
    run "workload $w, 7 instances, one router (round $round of $ROUNDS)" --workload "$w"
  done
done
run "small caches: preset small (65,536-token cache), 65 documents of 8,000 tokens (each cache ~1/8 of them)" \
  --preset small --param documents=65
run "10% of event batches dropped (long-context)" --kv-events-drop 0.1
run "3 router replicas, engine queues not scraped (long-context)" --replicas 3
run "3 router replicas, engine queues scraped (long-context)" --replicas 3 --engine-queues
