#!/usr/bin/env bash
# Router replicas in the simulator: what three replicas cost against one router, and what the
# engines' scraped queues (their interval and delay) change, for cache-aware and kv-aware on
# long-context, and for least-outstanding and kv-aware on a loaded sharegpt (96 clients).
# Prints markdown rows: case | strategy | hit rate | TTFT P50 / P90 / P99 ms | prefix on home |
# busiest / mean. Deterministic (seeded); about a minute on 2 cores after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p prefix-router
B=target/release/prefix-router
JSON="$(mktemp)"
trap 'rm -f "$JSON" "$JSON.err"' EXIT
row() {
  local label="$1"
  shift
  "$B" simulate "$@" --json "$JSON" >/dev/null 2>"$JSON.err" || { cat "$JSON.err"; exit 1; }
  python3 - "$label" "$JSON" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
for r in d["results"]:
    a = r.get("affinity") or {}
    t = r["ttft_ms"]
    print(f"| {sys.argv[1]} | {r['strategy']} | {r['kv_hit_rate']*100:.1f}% | "
          f"{t['p50']:.1f} / {t['p90']:.1f} / {t['p99']:.1f} | {a.get('on_home', 0)*100:.1f}% | "
          f"{a.get('max_share_over_mean', 0):.2f} |")
PY
}
echo "# bench/replicas-sim.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "| case | strategy | hit rate | TTFT P50 / P90 / P99 ms | prefix on home | busiest / mean |"
echo "| --- | --- | --- | --- | --- | --- |"
S="--strategies cache-aware,kv-aware"
row "1 router" $S
row "3 replicas, queues not scraped" $S --replicas 3
row "3 replicas, scraped every 1 s (default), read 5 ms later" $S --replicas 3 --engine-queues
row "3 replicas, scraped every 100 ms" $S --replicas 3 --engine-queues --scrape-interval-ms 100 --scrape-stale-ms 300
row "3 replicas, scraped every 1 s, read 1 s later" $S --replicas 3 --engine-queues --scrape-delay-ms 1000
row "3 replicas, scraped every 1 s, read 2.5 s later" $S --replicas 3 --engine-queues --scrape-delay-ms 2500
H="--workload sharegpt --requests 3000 --concurrency 96 --strategies least-outstanding,kv-aware"
row "sharegpt x96 clients: 1 router" $H
row "sharegpt x96: 3 replicas, not scraped" $H --replicas 3
row "sharegpt x96: 3 replicas, every 100 ms" $H --replicas 3 --engine-queues --scrape-interval-ms 100 --scrape-stale-ms 300
row "sharegpt x96: 3 replicas, every 1 s" $H --replicas 3 --engine-queues
row "sharegpt x96: 3 replicas, every 1 s, read 2 s later" $H --replicas 3 --engine-queues --scrape-delay-ms 2000 --scrape-stale-ms 5000
