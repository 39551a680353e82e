#!/usr/bin/env bash
# Instructions per cache-aware dispatch of a 256 KiB prompt (issue 12's largest body): a count,
# not a time, so it holds on a noisy machine. Runs the `cache_aware` bench binary's
# DISPATCH_LOOP mode under valgrind's callgrind at two repeat counts and prints the difference
# per dispatch, so indexing the prompts and starting the process cancel out. The dispatch is
# what the server's decision histogram times: the choice, the index's touch, and (here) the
# ticket's finish. Cases: `revisit` (a prompt sent before, sent again: 2,048 blocks to find
# and restamp) and `new-tail` (the same prompts with a new last block: a known document and a
# new question).
#
# Usage: bench/dispatch-instructions.sh
#   DISPATCH_CASES="revisit new-tail"
#   DISPATCH_BASELINE_BENCH=path/to/cache_aware-bench-binary   adds that build's counts
#       beside this tree's (build it with `cargo bench -p prefix-router-core --bench
#       cache_aware --no-run` at the other commit and copy the executable it names)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (Debian: apt-get install valgrind)" >&2; exit 1; }
CASES="${DISPATCH_CASES:-revisit new-tail}"
cargo bench -p prefix-router-core --bench cache_aware --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1 > target/cache-aware-bench-path
BIN="$(cat target/cache-aware-bench-path)"
[ -x "$BIN" ] || { echo "could not build the cache_aware bench" >&2; exit 1; }
BASE="${DISPATCH_BASELINE_BENCH:-}"
if [[ -n "$BASE" && ! -x "$BASE" ]]; then
    echo "DISPATCH_BASELINE_BENCH=$BASE: not an executable" >&2
    exit 2
fi
count() { # binary, case, n -> total instructions
    DISPATCH_LOOP="$2 $3" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" 2>&1 \
        | sed -n 's/.*refs: *\([0-9,]*\).*/\1/p' | tr -d ,
}
per_dispatch() { # binary, case
    local n=200 one many
    one=$(count "$1" "$2" 1)
    many=$(count "$1" "$2" $((n + 1)))
    echo $(( (many - one) / n ))
}
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)  $(valgrind --version)"
printf '%-10s %14s' case "this tree"
[[ -n "$BASE" ]] && printf ' %14s %8s' baseline ratio
printf '\n'
for c in $CASES; do
    ours=$(per_dispatch "$BIN" "$c")
    printf '%-10s %14s' "$c" "$ours"
    if [[ -n "$BASE" ]]; then
        theirs=$(per_dispatch "$BASE" "$c")
        printf ' %14s %8s' "$theirs" "$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.3f", a / b }')"
    fi
    printf '\n'
done
