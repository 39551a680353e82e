# Shared by the bench scripts that start servers: source it after setting BENCH_NAME (the
# prefix of their error messages). Every process appended to `pids` is stopped on exit;
# `wait_ready URL WHAT LOG [SECONDS]` waits until URL answers 2xx, or prints the end of LOG and
# exits.
pids=()
bench_cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap bench_cleanup EXIT

wait_ready() { # url what log [seconds]
    local tries=$((${4:-30} * 10))
    for _ in $(seq 1 "$tries"); do
        if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "$BENCH_NAME: $2 did not become ready at $1; the end of $3:" >&2
    tail -n 5 "$3" >&2
    exit 1
}

# `start_engines FIRST_PORT LOG_DIR [mock-engine flags...]`: 7 mock engines on 127.0.0.1, ports
# FIRST_PORT..FIRST_PORT+6, each logging to LOG_DIR/engine-N.log, stopped on exit; returns when
# all answer. Sets `engines` (their pids) and `instance_flags` (`--instance URL` for each).
start_engines() {
    local first="$1" dir="$2" i
    shift 2
    engines=()
    instance_flags=()
    for i in 1 2 3 4 5 6 7; do
        "$BIN" mock-engine --listen "127.0.0.1:$((first + i - 1))" "$@" >"$dir/engine-$i.log" 2>&1 &
        engines+=($!)
        pids+=($!)
        instance_flags+=(--instance "http://127.0.0.1:$((first + i - 1))")
    done
    for i in 1 2 3 4 5 6 7; do
        wait_ready "http://127.0.0.1:$((first + i - 1))/v1/models" "mock engine $i" "$dir/engine-$i.log" 10
    done
}
