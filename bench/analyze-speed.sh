#!/usr/bin/env bash
# How long `prefix-router analyze` takes on 100,000 requests (issue 9's target: at least 40
# settings in under 60 s on 2 cores). Writes a generated ShareGPT trace (20 req/s) to a
# temporary folder, then times analyze on it with one thread per core and with one thread,
# so the figure shows how much the sweep's parallelism buys on this machine.
#
#   bash bench/analyze-speed.sh            # 100,000 requests
#   REQUESTS=20000 bash bench/analyze-speed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-100000}
cargo build --release --quiet
B=target/release/prefix-router
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B" simulate --workload sharegpt --requests "$REQUESTS" --rate 20 --write-trace "$T/trace.jsonl"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
for threads in "$(nproc)" 1; do
    start=$(date +%s.%N)
    "$B" analyze "$T/trace.jsonl" --threads "$threads" --json "$T/a.json" > "$T/out.txt" 2> "$T/err.txt"
    end=$(date +%s.%N)
    sims=$(python3 -c "import json; a=json.load(open('$T/a.json')); print(len(a['outcomes']) + len(a['fleet_sizes']))")
    settings=$(python3 -c "import json; a=json.load(open('$T/a.json')); print(len(a['settings']))")
    printf 'threads %s: %s requests, %s settings x rates + fleet sizes = %s simulations in %.1f s\n' \
        "$threads" "$REQUESTS" "$settings" "$sims" "$(echo "$end - $start" | bc)"
done
grep '^Recommendation' "$T/out.txt"
