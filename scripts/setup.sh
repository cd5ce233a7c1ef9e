#!/usr/bin/env bash
# Create .venv with iron and its test dependencies (torch comes from the machine's local wheel
# store when it has one; the reference-model tests skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]"
