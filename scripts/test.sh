#!/usr/bin/env bash
# Install everything, then run the linter and the whole test suite (what CI runs).
# The vLLM environment (scripts/vllm_env.sh: vLLM's CPU build in a venv of its own, ~3.5 min and
# 2.8 GB the first time) is made too, so tests/test_vllm.py runs vLLM end to end;
# PROMPTLOOKUP_SKIP_VLLM=1 leaves it out (that test then skips).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
if [ "${PROMPTLOOKUP_SKIP_VLLM:-0}" != 1 ]; then
    bash scripts/vllm_env.sh
fi
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/python -m pytest -q "$@"
