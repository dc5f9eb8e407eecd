"""The declared backend contract: every backend and test double implements the loop's ``Decoder``
whole, with one signature per method, and the engine's backends implement ``Model``."""

from __future__ import annotations

import inspect

import pytest
from fakes import ByteModel, FakeModel, LogitsFakeModel

from promptlookup.backends.base import Decoder, Model
from promptlookup.backends.llama_cpp import LlamaCppBackend
from promptlookup.backends.text import TextBackend

DECODER_METHODS = ("prefill", "verify", "rollback", "is_eog")
MODEL_METHODS = ("tokenize", "detokenize", "fingerprint", "render_chat", "control_texts", "close")


def _params(fn) -> list[tuple[str, object]]:
    """Parameter names and defaults, ``self`` left out (annotations may differ in spelling)."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _transformers_backend():
    try:
        from promptlookup.backends.transformers import TransformersBackend
    except ImportError:  # pragma: no cover - the [transformers] extra is part of the test install
        pytest.skip("transformers not installed")
    return TransformersBackend


@pytest.mark.parametrize("cls", [TextBackend, FakeModel, LogitsFakeModel, ByteModel, LlamaCppBackend, "hf"])
def test_every_decoder_has_the_protocols_signatures(cls):
    cls = _transformers_backend() if cls == "hf" else cls
    for name in DECODER_METHODS:
        assert _params(getattr(cls, name)) == _params(getattr(Decoder, name)), f"{cls.__name__}.{name}"
    assert isinstance(inspect.getattr_static(cls, "tokens"), property), f"{cls.__name__}.tokens"


@pytest.mark.parametrize("cls", [ByteModel, LlamaCppBackend, "hf"])
def test_every_model_has_the_engines_methods(cls):
    cls = _transformers_backend() if cls == "hf" else cls
    for name in MODEL_METHODS:
        assert _params(getattr(cls, name)) == _params(getattr(Model, name)), f"{cls.__name__}.{name}"


def test_fakes_are_checked_instances():
    assert isinstance(TextBackend([1, 2, 3]), Decoder)
    assert isinstance(FakeModel(), Decoder) and not isinstance(FakeModel(), Model)
    m = ByteModel()
    assert isinstance(m, Model)
    assert (m.name, m.n_threads, m.model_path) == ("bytes", 1, None)


def test_text_backend_keeps_a_prefix_as_the_cache():
    b = TextBackend([5, 6, 7, 8, 9])
    assert b.prefill([5, 6, 7]) == 8
    assert b.tokens == [5, 6, 7]
    assert b.verify([8, 0]) == [9, -1]
    b.rollback(4)
    assert b.prefill([5, 6, 7, 8], None, 3) == 9 and b.tokens == [5, 6, 7, 8]
