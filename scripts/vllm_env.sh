#!/usr/bin/env bash
# Create the vLLM environment (idempotent) for this clone: `promptlookup vllm-env` run from the
# clone's .venv (the recipe is package code, src/promptlookup/vllm_env.py, so an installed package
# has it too; docs/vllm.md says why each step).
#
#   bash scripts/vllm_env.sh            # -> $PROMPTLOOKUP_VLLM_ENV (default: .venv-vllm, git-ignored)
#
# PROMPTLOOKUP_VLLM_ARCTIC=1 also builds vLLM's own `suffix` proposer (ArcticInference, benchmarks only).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
if [ "${PROMPTLOOKUP_VLLM_ARCTIC:-0}" = 1 ]; then
    args+=(--arctic)
fi
exec .venv/bin/python -m promptlookup vllm-env "${args[@]}"
