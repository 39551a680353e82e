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
