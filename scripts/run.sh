#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), build the Llama bundle for the cpu on the embedded SmolLM2
# checkpoint, and generate text from it. Extra arguments go to doit, e.g. prompt="Hello".
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/python -m doit generate "$@"
