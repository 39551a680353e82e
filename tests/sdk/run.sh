#!/usr/bin/env bash
# The OpenAI Python SDK against the router and mock engines (tests/sdk/openai_sdk_check.py).
# Makes a venv under target/ (kept between runs), installs the openai package from PyPI, builds
# the release binary when it is missing, and runs the check. Non-interactive; fine with CI=true.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${PREFIX_ROUTER_SDK_VENV:-target/sdk-venv}"
OPENAI_SPEC='openai>=1.66,<3'  # 1.66: the Responses API
BIN=target/release/prefix-router

PYTHON="$(command -v python3 || command -v python || true)"
if [ -z "$PYTHON" ]; then
    echo "tests/sdk: no python3 found" >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "== sdk: creating $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if ! "$VENV/bin/python" -c "
import sys
from importlib.metadata import version
major = int(version('openai').split('.')[0]); minor = int(version('openai').split('.')[1])
sys.exit(0 if (major, minor) >= (1, 66) and major < 3 else 1)
" 2>/dev/null; then
    echo "== sdk: installing $OPENAI_SPEC"
    "$VENV/bin/python" -m pip install --quiet "$OPENAI_SPEC" </dev/null
fi

if [ ! -x "$BIN" ]; then
    echo "== sdk: building $BIN"
    cargo build --release --locked -p prefix-router
fi

exec "$VENV/bin/python" tests/sdk/openai_sdk_check.py --binary "$BIN" "$@" </dev/null
