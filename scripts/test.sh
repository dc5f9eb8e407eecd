#!/usr/bin/env bash
# Install everything, then run the linter and the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/python -m pytest -q "$@"
