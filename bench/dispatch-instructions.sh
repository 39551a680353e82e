#!/usr/bin/env bash
# Instructions per cache-aware dispatch of a 256 KiB prompt (issue 12's largest body): a count,
# not a time, so it holds on a noisy machine. Runs the `cache_aware` bench binary's
# DISPATCH_LOOP mode under valgrind's callgrind at two repeat counts and prints the difference
# per dispatch, so indexing the prompts and starting the process cancel out. The dispatch is
# what the server's decision histogram times: the choice, the index's touch, and (here) the
# ticket's finish. Cases: `revisit` (a prompt sent before, sent again: 2,048 blocks to find
# and restamp) and `new-tail` (the same prompts with a new last block: a known document and a
# new question; its count includes copying the 16 KiB chain to change it), and `grown` (8
# conversations of 512 blocks, built up 4 blocks a turn with their turns interleaved, sent
# again: a chain whose blocks sit in the index's slab in runs of 4, as agents' do).
#
# Usage: bench/dispatch-instructions.sh
#   DISPATCH_CASES="revisit new-tail grown"
#   DISPATCH_BASELINE_BENCH=path/to/cache_aware-bench-binary   adds that build's counts
#       beside this tree's. The mode is this tree's bench file, so build the other library with
#       it: in a checkout of the other commit, copy this tree's
#       crates/core/benches/cache_aware.rs over its own, run `cargo bench -p
#       prefix-router-core --bench cache_aware --no-run` and pass the executable it names.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (Debian: apt-get install valgrind)" >&2; exit 1; }
CASES="${DISPATCH_CASES:-revisit new-tail grown}"
BIN=$(cargo bench --locked -p prefix-router-core --bench cache_aware --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1) \
    || { echo "could not build the cache_aware bench (cargo's error is above)" >&2; exit 1; }
[[ -x "$BIN" ]] || { echo "could not find the cache_aware bench's executable" >&2; exit 1; }
BASE="${DISPATCH_BASELINE_BENCH:-}"
if [[ -n "$BASE" && ! -x "$BASE" ]]; then
    echo "DISPATCH_BASELINE_BENCH=$BASE: not an executable" >&2
    exit 2
fi
count() { # binary, case, n -> total instructions
    local out refs
    out=$(DISPATCH_LOOP="$2 $3" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" 2>&1)
    if ! grep -q "^DISPATCH_LOOP done: $2 $3\$" <<<"$out"; then
        echo "$1 did not run DISPATCH_LOOP='$2 $3' (a bench binary built without that mode?)" >&2
        return 1
    fi
    refs=$(sed -n 's/.*refs: *\([0-9,]*\).*/\1/p' <<<"$out" | tr -d ,)
    [[ "$refs" =~ ^[0-9]+$ ]] || { echo "no instruction count from callgrind for $1" >&2; return 1; }
    echo "$refs"
}
per_dispatch() { # binary, case
    local n=200 one many
    one=$(count "$1" "$2" 1)
    many=$(count "$1" "$2" $((n + 1)))
    echo $(((many - one) / n))
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
        printf ' %14s %8s' "$theirs" "$(awk -v a="$ours" -v b="$theirs" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }')"
    fi
    printf '\n'
done
