#!/usr/bin/env bash
# The chaos suite (crates/cli/tests/chaos.rs) on a release build, at a higher rate and longer per
# case than CI's run: real mock-engine and serve processes on 127.0.0.1, an open-loop load, and
# per case an engine SIGKILLed mid-stream and restarted, SIGSTOPped and continued, every engine
# down then back, admin scale-out and scale-in, a SIGHUP reload of the instance list, and
# misbehaving clients. Prints the table RELIABILITY.md quotes.
#
# Usage: bench/chaos.sh            CHAOS_RATE=50 (requests/s) CHAOS_SECONDS=10 (per case)
set -euo pipefail
cd "$(dirname "$0")/.."
export CHAOS_RATE="${CHAOS_RATE:-50}"
export CHAOS_SECONDS="${CHAOS_SECONDS:-10}"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) CPUs  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo test --release --locked -q -p prefix-router --test chaos -- --nocapture 2>&1 \
    | grep -E '^\||^\(|test result|panicked|assert'
