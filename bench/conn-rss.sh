#!/usr/bin/env bash
# serve's memory per open client connection: one instant mock engine on loopback, `serve` in
# front of it, then N keep-alive connections, each sending one small chat request and reading
# its answer, then held open and idle (as a client pool holds them); 12 s later (past the
# shortest client timeout, 10 s by default, after which an idle connection gives its buffers
# back) a second batch as large. Prints serve's RSS growth per connection: for the first batch
# just answered, for it after the quiet, and for the second batch. The allocator keeps what
# was given back for reuse rather than returning it to the system, so the quiet shows in the
# second batch, whose buffers reuse the first's. With CONN_BASELINE_BIN, an older
# build's `serve` is measured the same way, alternating with this tree's, for a before/after.
#
# Usage: bench/conn-rss.sh                  (defaults below; any CONN_* variable overrides)
#   CONN_COUNT=500       connections per batch (two batches stay within serve's per-client
#                        limit, 1,024 by default)
#   CONN_ROUNDS=2        alternations
#   CONN_BASELINE_BIN=path/to/prefix-router   measure that binary's serve too
#   CONN_HAPROXY=1       measure HAProxy too (Debian's haproxy, installed by bench/peers.sh or
#                        apt-get): round-robin, the request buffered, default buffer size
#   CONN_PORT=18700      router port; the engine on the next one
# Everything listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT="${CONN_COUNT:-500}"
ROUNDS="${CONN_ROUNDS:-2}"
PORT="${CONN_PORT:-18700}"
BIN=target/release/prefix-router
OUT=target/conn-rss
mkdir -p "$OUT"

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo build --release --locked -q -p prefix-router

BENCH_NAME=conn-rss
# shellcheck source=bench/lib.sh
source bench/lib.sh

"$BIN" mock-engine --listen "127.0.0.1:$((PORT + 1))" --instant >"$OUT/engine.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$((PORT + 1))/v1/models" "mock engine" "$OUT/engine.log" 10

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
if [[ -n "${CONN_HAPROXY:-}" ]] && ! command -v haproxy >/dev/null; then
    echo "conn-rss: CONN_HAPROXY needs haproxy (Debian: apt-get install haproxy)" >&2
    exit 2
fi

open_batch() { # flag file: opens COUNT connections, each answered once, and holds them
    rm -f "$1"
    python3 - "$PORT" "$COUNT" "$1" <<'EOF' &
import json, socket, sys, time
port, count, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = json.dumps({"model": "mock-llama", "max_tokens": 4,
                   "messages": [{"role": "user", "content": "hello " * 100}]}).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body)) + body
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(req)
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        if not got:
            sys.exit("conn-rss: serve closed a connection before answering")
        data += got
    head, rest = data.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit("conn-rss: " + head.split(b"\r\n")[0].decode())
    length = [int(l.split(b":")[1]) for l in head.split(b"\r\n")[1:]
              if l.lower().startswith(b"content-length:")]
    while length and len(rest) < length[0]:
        got = s.recv(65536)
        if not got:
            sys.exit("conn-rss: serve closed a connection mid-answer")
        rest += got
    held.append(s)
open(flag, "w").close()
time.sleep(120)
EOF
    local opener=$!
    pids+=("$opener")
    for _ in $(seq 1 600); do
        [[ -e "$1" ]] && break
        kill -0 "$opener" 2>/dev/null || { echo "conn-rss: the client failed" >&2; exit 1; }
        sleep 0.1
    done
    [[ -e "$1" ]] || { echo "conn-rss: $COUNT connections did not open within 60 s" >&2; exit 1; }
    openers+=("$opener")
}

measure() { # label binary (or "haproxy")
    local serve before first quiet second
    openers=()
    if [[ "$2" == haproxy ]]; then
        # Round-robin with the request buffered (as its body hash needs); default buffer size.
        printf '%s\n' global '  nbthread 2' '  maxconn 4096' defaults '  mode http' \
            '  timeout connect 5s' '  timeout client 60s' '  timeout server 60s' \
            frontend\ f "  bind 127.0.0.1:$PORT" '  default_backend b' backend\ b \
            '  http-reuse always' '  option http-buffer-request' \
            "  server s1 127.0.0.1:$((PORT + 1))" >"$OUT/haproxy.cfg"
        haproxy -db -f "$OUT/haproxy.cfg" >"$OUT/serve.log" 2>&1 &
        serve=$!
        pids+=("$serve")
        wait_ready "http://127.0.0.1:$PORT/health" "haproxy" "$OUT/serve.log" 10
    else
        "$2" serve --listen "127.0.0.1:$PORT" --instance "http://127.0.0.1:$((PORT + 1))" \
            >"$OUT/serve.log" 2>&1 &
        serve=$!
        pids+=("$serve")
        wait_ready "http://127.0.0.1:$PORT/ready" "serve ($1)" "$OUT/serve.log" 10
    fi
    # One request first, so that what every process allocates once is in `before`.
    curl -fsS -o /dev/null -H 'content-type: application/json' \
        -d '{"model":"mock-llama","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}' \
        "http://127.0.0.1:$PORT/v1/chat/completions"
    before=$(rss_kib "$serve")
    open_batch "$OUT/open-1"
    sleep 1
    first=$(rss_kib "$serve")
    sleep 11
    quiet=$(rss_kib "$serve")
    open_batch "$OUT/open-2"
    sleep 1
    second=$(rss_kib "$serve")
    kill "${openers[@]}" "$serve" 2>/dev/null || true
    wait "${openers[@]}" "$serve" 2>/dev/null || true
    awk -v l="$1" -v b="$before" -v f="$first" -v q="$quiet" -v s="$second" -v n="$COUNT" \
        'BEGIN { printf "%-14s %d connections: +%.1f KiB each; quiet 12 s: +%.1f KiB each; %d more: +%.1f KiB each\n", l, n, (f - b) / n, (q - b) / n, n, (s - q) / n }'
}

for round in $(seq 1 "$ROUNDS"); do
    measure "prefix-router" "$BIN"
    if [[ -n "${CONN_BASELINE_BIN:-}" ]]; then measure "baseline" "$CONN_BASELINE_BIN"; fi
    if [[ -n "${CONN_HAPROXY:-}" ]]; then measure "haproxy" haproxy; fi
done
