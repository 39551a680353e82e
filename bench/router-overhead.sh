#!/usr/bin/env bash
# The router's own cost on loopback (issue 3, "What must be shown"): an instant-answer upstream,
# the same client driving it directly and through the router, 16 KiB chat bodies; p50/p99/p99.9
# latency at a fixed rate and maximum requests/s both ways, their ratio, and the CPU each
# component (client, router, upstreams) spends per request.
#
# The Rust code is crates/server/benches/overhead.rs; this script is its entry point under bench/.
# Usage: bench/router-overhead.sh            (defaults below; any BENCH_* variable overrides)
#   BENCH_SECONDS=5       seconds per latency run and path
#   BENCH_RATE=2000       fixed rate of the latency runs (requests/s)
#   BENCH_MAX_SECONDS=3   seconds per throughput run; BENCH_ROUNDS=3 direct/router alternations
#   BENCH_WORKERS=2       worker threads of each runtime
#   BENCH_LAYOUT=shared   shared: one runtime runs client, router and upstreams (as published);
#                         split: each on its own runtime, CPU per request per component
#   BENCH_CPUS=0,1        pin the whole benchmark to these CPUs (taskset), when set
set -euo pipefail
cd "$(dirname "$0")/.."
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo bench -p prefix-router-server --bench overhead --no-run >/dev/null 2>&1 \
  || cargo bench -p prefix-router-server --bench overhead --no-run
cmd=(cargo bench -q -p prefix-router-server --bench overhead)
if [[ -n "${BENCH_CPUS:-}" ]]; then
  cmd=(taskset -c "$BENCH_CPUS" "${cmd[@]}")
fi
"${cmd[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
