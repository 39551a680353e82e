#!/usr/bin/env bash
# Instructions per chat-body key extraction, each back end side by side (issue 12): a count,
# not a time, so it holds on a noisy machine. Runs the `extract` bench binary's EXTRACT_LOOP
# mode under valgrind's callgrind at two repeat counts and prints the difference per
# extraction, so building the body and starting the process cancel out. Bodies are the bench's
# (`crates/core/benches/extract.rs`: English prose with escapes, raw CJK, all-escaped CJK);
# prefix 4,096 characters.
#
# Usage: bench/extract-instructions.sh
#   EXTRACT_BACK_ENDS="own_reader serde_json"   EXTRACT_BODIES="english cjk cjk_escaped"
#   EXTRACT_SIZES="4KiB 64KiB"
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (Debian: apt-get install valgrind)" >&2; exit 1; }
BACK_ENDS="${EXTRACT_BACK_ENDS:-own_reader serde_json sonic_rs}"
BODIES="${EXTRACT_BODIES:-english cjk cjk_escaped}"
SIZES="${EXTRACT_SIZES:-4KiB 64KiB}"
cargo bench -p prefix-router-core --bench extract --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1 > target/extract-bench-path
BIN="$(cat target/extract-bench-path)"
[ -x "$BIN" ] || { echo "could not build the extract bench" >&2; exit 1; }
count() { # back end, kind, size, n -> total instructions
    EXTRACT_LOOP="$1 $2 $3 $4" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" 2>&1 \
        | sed -n 's/.*refs: *\([0-9,]*\).*/\1/p' | tr -d ,
}
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)  $(valgrind --version)"
printf '%-12s %-6s' body size
for b in $BACK_ENDS; do printf ' %14s' "$b"; done
printf '\n'
for kind in $BODIES; do
    for size in $SIZES; do
        n=50; [ "$size" = 1MiB ] && n=5
        printf '%-12s %-6s' "$kind" "$size"
        for b in $BACK_ENDS; do
            one=$(count "$b" "$kind" "$size" 1)
            many=$(count "$b" "$kind" "$size" $((n + 1)))
            printf ' %14s' $(( (many - one) / n ))
        done
        printf '\n'
    done
done
