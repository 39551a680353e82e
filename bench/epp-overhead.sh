#!/usr/bin/env bash
# What the endpoint picker adds to Envoy: Envoy alone (round robin over the pool) against Envoy
# with the ext_proc filter asking `prefix-router epp` (deploy/envoy/envoy-override-host.yaml, as
# tested), in front of the same instant mock engines, driven by `prefix-router bench` (closed
# loop), in alternating rounds. Prints each round and the medians, with the ratios
# picker/alone. Loopback only.
#   bench/epp-overhead.sh                       # 3 engines, 8 clients, 3 rounds of 600 requests
#   EPP_ROUNDS=5 EPP_CONCURRENCY=1 EPP_REQUESTS=300 EPP_WORKLOAD=sharegpt bench/epp-overhead.sh
#   EPP_RESPONSE_BODY=NONE bench/epp-overhead.sh   # the picker does not see the answer's chunks
#                                                  # (no usage feedback): what reading them costs
#   EPP_REQUEST_BODY=FULL_DUPLEX_STREAMED bench/epp-overhead.sh   # the request body in full duplex
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=epp-overhead
source bench/lib.sh

ROUNDS=${EPP_ROUNDS:-3}
CONC=${EPP_CONCURRENCY:-8}
REQUESTS=${EPP_REQUESTS:-600}
WORKLOAD=${EPP_WORKLOAD:-sharegpt}
RESPONSE_BODY=${EPP_RESPONSE_BODY:-STREAMED}
REQUEST_BODY=${EPP_REQUEST_BODY:-BUFFERED}
TRAILERS=SKIP
[[ $REQUEST_BODY == FULL_DUPLEX_STREAMED ]] && TRAILERS=SEND
BIN=${EPP_BIN:-target/release/prefix-router}
OUT=${EPP_OUT:-target/epp-overhead}
[[ -x "$BIN" ]] || cargo build --release --locked -p prefix-router
ENVOY=$(tests/envoy/install.sh)
mkdir -p "$OUT"

# Ports: engines 8001-8003 as the checked-in configuration names them; the rest above them.
for p in 8001 8002 8003; do
    "$BIN" mock-engine --instant --listen "127.0.0.1:$p" >"$OUT/engine-$p.log" 2>&1 &
    pids+=($!)
done
for p in 8001 8002 8003; do wait_ready "http://127.0.0.1:$p/health" "mock engine" "$OUT/engine-$p.log"; done
"$BIN" epp --listen 127.0.0.1:19002 --ops-listen 127.0.0.1:19090 --fallbacks 2 \
    --instance http://127.0.0.1:8001 --instance http://127.0.0.1:8002 --instance http://127.0.0.1:8003 \
    >"$OUT/epp.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:19090/ready "the picker" "$OUT/epp.log"

# Envoy with the picker, and Envoy alone: the same file without the ext_proc filter.
sed -e 's/port_value: 10000/port_value: 18000/' -e 's/port_value: 9901/port_value: 18901/' \
    -e 's/port_value: 9002/port_value: 19002/' -e "s/response_body_mode: STREAMED/response_body_mode: $RESPONSE_BODY/" \
    -e "s/request_body_mode: BUFFERED/request_body_mode: $REQUEST_BODY/" -e "s/request_trailer_mode: SKIP/request_trailer_mode: $TRAILERS/" \
    deploy/envoy/envoy-override-host.yaml >"$OUT/envoy-epp.yaml"
sed -e 's/port_value: 10000/port_value: 18001/' -e 's/port_value: 9901/port_value: 18902/' \
    -e '/- name: envoy.filters.http.ext_proc/,/- name: envoy.filters.http.router/{/- name: envoy.filters.http.router/!d}' \
    deploy/envoy/envoy-override-host.yaml >"$OUT/envoy-alone.yaml"
grep -q ext_proc "$OUT/envoy-alone.yaml" && { echo "$BENCH_NAME: could not remove the filter" >&2; exit 1; }
for which in epp alone; do
    "$ENVOY" -c "$OUT/envoy-$which.yaml" --concurrency 2 --disable-hot-restart --log-level warn \
        >"$OUT/envoy-$which.log" 2>&1 &
    pids+=($!)
done
wait_ready http://127.0.0.1:18901/ready "Envoy (with the picker)" "$OUT/envoy-epp.log"
wait_ready http://127.0.0.1:18902/ready "Envoy (alone)" "$OUT/envoy-alone.log"

echo "epp-overhead: $WORKLOAD, $REQUESTS requests, $CONC clients, $ROUNDS rounds, request_body_mode $REQUEST_BODY, response_body_mode $RESPONSE_BODY, envoy $("$ENVOY" --version | grep -o 'version: [^/]*/[0-9.]*' | cut -d/ -f2), $(nproc) cores shared by all"
run() { # which round
    local port=18001
    [[ $1 == epp ]] && port=18000
    "$BIN" bench --target "http://127.0.0.1:$port" --workload "$WORKLOAD" --requests "$REQUESTS" \
        --concurrency "$CONC" --seed "$2" --label "$1" --json "$OUT/$1-$2.json" >"$OUT/$1-$2.txt" 2>&1 \
        || { echo "$BENCH_NAME: bench against $1 failed:" >&2; tail -n 5 "$OUT/$1-$2.txt" >&2; exit 1; }
}
for r in $(seq 1 "$ROUNDS"); do
    # Alternate which goes first, so a slow patch of the machine does not always hit one.
    if (( r % 2 )); then run alone "$r"; run epp "$r"; else run epp "$r"; run alone "$r"; fi
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for which in ("alone", "epp"):
    for r in range(1, rounds + 1):
        res = json.load(open(f"{out}/{which}-{r}.json"))["results"][0]
        assert res["failed"] == 0, f"{which} round {r}: {res['failed']} failed"
        p = res["ttft_percentiles_ms"]
        rows.setdefault(which, []).append((res["throughput_rps"], p[50], p[99]))
print(f"{'round':>5}  {'alone req/s':>11} {'p50 ms':>7} {'p99 ms':>7}   {'+picker req/s':>13} {'p50 ms':>7} {'p99 ms':>7}")
for r in range(rounds):
    a, e = rows["alone"][r], rows["epp"][r]
    print(f"{r + 1:>5}  {a[0]:>11.0f} {a[1]:>7.2f} {a[2]:>7.2f}   {e[0]:>13.0f} {e[1]:>7.2f} {e[2]:>7.2f}")
med = {w: [statistics.median(x[i] for x in rows[w]) for i in range(3)] for w in rows}
a, e = med["alone"], med["epp"]
print(f"median  {a[0]:>11.0f} {a[1]:>7.2f} {a[2]:>7.2f}   {e[0]:>13.0f} {e[1]:>7.2f} {e[2]:>7.2f}")
print(f"picker/alone: throughput {e[0] / a[0]:.2f}x, TTFT p50 +{e[1] - a[1]:.2f} ms ({e[1] / a[1]:.2f}x), p99 +{e[2] - a[2]:.2f} ms ({e[2] / a[2]:.2f}x)")
PY
