#!/usr/bin/env bash
# Create .venv with iron installed from this checkout. `scripts/setup.sh test` adds the test
# extra: pytest, and torch 2.13.0 CPU + transformers as the independent reference model (pip
# takes torch from the machine's local wheel store), the serve extra the server tests need, and
# the remote cache and cluster extras with moto's local S3 server, which their tests use, and
# the npu extra (xDSL) the npu designs' verifier needs, and the tuner's charts (plots).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
if [ "${1:-}" = test ]; then
    .venv/bin/pip install -q -e ".[test,serve,remote,cluster,npu,plots]"
else
    .venv/bin/pip install -q -e ".[serve,npu]"  # iron serve, and the npu designs' verifier
fi
if [[ ":$PATH:" != *":$PWD/.venv/bin:"* ]]; then
    echo "set up: run 'source .venv/bin/activate' to put iron, doit and python on your PATH"
fi
