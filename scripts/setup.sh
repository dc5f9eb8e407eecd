#!/usr/bin/env bash
# Install promptlookup and everything its tests need into ./.venv (idempotent).
#
# llama-cpp-python ships only as source on PyPI and takes ~5-10 minutes to compile on 2 cores, so
# the built wheel is kept in a local wheelhouse outside the repo and reused by later set-ups.
# llama.cpp compiles for the host CPU, so the wheelhouse is keyed by the CPU's feature flags.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_PYTHON_VERSION=0.3.36
TORCH_VERSION=2.13.0
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12 || echo generic)
WHEELHOUSE=${PROMPTLOOKUP_WHEELHOUSE:-$HOME/.cache/promptlookup/wheelhouse}/$cpu_key
mkdir -p "$WHEELHOUSE"

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)" >&2
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip

if ! ls "$WHEELHOUSE"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (once; ~5-10 min on 2 cores)" >&2
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) .venv/bin/python -m pip wheel --quiet --no-deps \
        --disable-pip-version-check -w "$WHEELHOUSE" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi

# The transformers backend's tests check exactness on the real model, so CI installs it too. torch
# goes first and pinned: its CPU build is on local disk, an unpinned torch would pull a CUDA build.
echo "setup: installing torch $TORCH_VERSION (CPU build)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"

echo "setup: installing promptlookup (editable) with the test and transformers extras" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --find-links "$WHEELHOUSE" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" "torch==$TORCH_VERSION" -e ".[test,transformers]"
