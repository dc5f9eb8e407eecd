#!/usr/bin/env bash
# Install promptlookup into ./.venv (idempotent): `setup.sh core` for the main job, `setup.sh all`
# (the default) adds the test and transformers extras.
#
# llama-cpp-python ships only as source on PyPI and takes 3-5 minutes to compile on 2 cores (without
# its multimodal library: 2:45 for llama.cpp's own kernels on an Intel Xeon, 5:03 for the invariant
# build with our matmul on a slower AMD EPYC; docs/setup.md). It is built without the ISA extensions
# known to be broken upstream (AMX), kept in a wheelhouse outside the repo keyed by its build flags,
# and proven by a smoke test before set-up says ready: all of that is package code,
# src/promptlookup/llama_build (the same code as `promptlookup setup-llama` in any environment). By
# default its matmul kernels are the batch-invariant ones (speculative output equals plain decoding
# bit for bit; docs/exactness.md); PROMPTLOOKUP_LLAMA_KERNELS=fast keeps llama.cpp's default kernels
# instead. Set-up then compiles the drafting kernels (promptlookup compile), so the first run pays no
# compile time.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=${1:-all}
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)" >&2
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
# the build step runs from src/ on the system Python: it needs the standard library only
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m promptlookup.llama_build setup \
    --venv .venv --extras "$extras"
