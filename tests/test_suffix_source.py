"""``--suffix``: the pinned rule (tie-breaks, stopping, back-off); fast == brute-force twin on real text."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from promptlookup.drafting.suffix.automaton import SEP, SuffixAutomaton
from promptlookup.drafting.suffix.history import History
from promptlookup.drafting.suffix.rule import draft_reference
from promptlookup.drafting.suffix.source import SuffixSource


@pytest.fixture(scope="module")
def src() -> SuffixSource:
    return SuffixSource(n_vocab=1 << 12, depth=4)


def _draft(src: SuffixSource, toks, k: int):
    src.reset(toks[:1])
    src.extend(toks[1:])
    return src.propose(k)


def test_most_frequent_continuation_beats_most_recent(src):
    # after "1 2" came 3 twice and 4 once (most recently): frequency decides
    d = _draft(src, [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2], 1)
    assert d.tokens == (3,)
    assert d.match_len == 2
    assert d.features["count"] == 2 and d.features["total"] == 3


def test_tie_goes_to_most_recent(src):
    assert _draft(src, [1, 2, 3, 9, 1, 2, 4, 7, 1, 2], 1).tokens == (4,)
    assert _draft(src, [1, 2, 4, 9, 1, 2, 3, 7, 1, 2], 1).tokens == (3,)


def test_longest_match_decides_over_counts(src):
    # "5 1 2" occurred once, followed by 6; "1 2" is followed by 3 three times
    toks = [1, 2, 3, 1, 2, 3, 1, 2, 3, 5, 1, 2, 6, 0, 5, 1, 2]
    assert _draft(src, toks, 1).tokens == (6,)


def test_draft_continues_through_drafted_tokens_and_backs_off(src):
    # a repeated token predicts itself; a short text drafts the full k by backing off
    assert _draft(src, [7, 7, 7], 5).tokens == (7, 7, 7, 7, 7)
    assert _draft(src, [1, 2, 3, 4, 1], 6).tokens == (2, 3, 4, 1, 2, 3)


def test_no_match_abstains(src):
    d = _draft(src, [1, 2, 3], 3)
    assert d.tokens == () and d.match_len == 0


def test_min_match_and_min_prob_stop():
    s = SuffixSource(n_vocab=64, depth=4, min_match=3)
    assert _draft(s, [1, 2, 3, 1, 2], 2).tokens == ()
    s = SuffixSource(n_vocab=64, depth=4, min_prob=0.5)
    # after 1: 2 (x2), 3 (x1) -> p=2/3 kept; after "1 2": 5 then 6 (tie, p=1/2) -> path 1/3 stops
    d = _draft(s, [1, 2, 5, 1, 2, 6, 1, 3, 0, 1], 3)
    assert d.tokens == (2,)
    assert d.features["prob"] == pytest.approx(2 / 3)


def test_the_spec_sets_min_prob():
    """``suffix:min-prob=P`` (the vLLM proposer's way to stop unlikely drafts): the same draft as the
    source built with ``min_prob=P``; the default drafts on (0)."""
    from promptlookup.drafting.spec import Run, SourceSpec, SpecError, source_factory

    run = Run(64, lambda: "fp")
    toks = [1, 2, 5, 1, 2, 6, 1, 3, 0, 1]
    pruned = source_factory(SourceSpec.parse("suffix:min-prob=0.5"), run)()
    assert pruned.min_prob == 0.5 and _draft(pruned, toks, 3).tokens == (2,)
    plain = source_factory(SourceSpec.parse("suffix"), run)()
    assert plain.min_prob == 0.0 and len(_draft(plain, toks, 3).tokens) == 3
    with pytest.raises(SpecError, match="min-prob must be 0.0..1.0, got 1.5"):
        SourceSpec.parse("suffix:min-prob=1.5")


def test_history_used_and_longer_match_wins():
    h = History(budget=1000)
    h.add([10, 11, 12, 13, 14])
    s = SuffixSource(history=h, n_vocab=64)
    s.reset([9, 10, 11])
    d = s.propose(3)
    assert d.tokens == (12, 13, 14) and d.features["from_history"] == 1.0
    s.extend([12, 20, 10, 11])  # now the request has "10 11" followed by 12 and history too: counts add
    assert s.propose(1).features["count"] == 2


def test_commit_records_request_once():
    h = History(budget=1000)
    s = SuffixSource(history=h, n_vocab=64)
    s.reset([1, 2, 3])
    s.commit()
    s.commit()
    s.reset([4])
    assert h.text() == [1, 2, 3]
    s.reset([5])
    assert h.text() == [1, 2, 3, SEP, 4]


def test_rejects_bad_tokens(src):
    src.reset([1])
    with pytest.raises(ValueError):
        src.extend([-1])
    with pytest.raises(ValueError):
        src.extend([1 << 12])


def test_automaton_counts_are_occurrence_counts():
    text = [1, 2, 1, 2, 3, 1, 2, 1]
    sam = SuffixAutomaton(depth=8)
    sam.extend(text)
    state, length = sam.match_state()
    assert length == 3  # "1 2 1" occurred before
    assert sam.st[state, 2] == 2  # CNT: "1 2 1" ends at positions 2 and 7


@settings(max_examples=150, deadline=None)
@given(hs.lists(hs.integers(0, 3), min_size=1, max_size=40),
       hs.lists(hs.lists(hs.integers(0, 3), min_size=1, max_size=20), max_size=3),
       hs.integers(1, 6), hs.integers(1, 7), hs.sampled_from([0.5, 1.0, 3.0]))
def test_fast_equals_reference_property(toks, hist, depth, k, weight):
    h = History(budget=10_000, depth=depth)
    for seq in hist:
        h.add(seq)
    s = SuffixSource(history=h, depth=depth, n_vocab=8, record=False, local_weight=weight)
    s.reset(toks[:1])
    s.extend(toks[1:])
    d = s.propose(k)
    tokens, _, match = draft_reference(toks, h.text(), k, depth, local_weight=weight)
    assert list(d.tokens) == tokens
    assert d.match_len == match


def _real_tokens(n: int) -> list[int]:
    """Real text as tokens without a model: bytes of stdlib sources (held equal, not the vocab)."""
    root = Path(os.__file__).parent
    data = b"".join(p.read_bytes() for p in sorted(root.glob("json/*.py")))
    return list(data[:n])


def test_fast_equals_reference_on_real_text():
    toks = _real_tokens(2600)
    hist, req = toks[:1400], toks[1400:]
    h = History(budget=10_000, depth=16)
    h.add(hist[:700])
    h.add(hist[700:])
    s = SuffixSource(history=h, depth=16, n_vocab=256, record=False)
    s.reset(req[:1])
    rng = np.random.default_rng(0)
    checked = 0
    i = 1
    while i < len(req):
        step = int(rng.integers(1, 5))
        s.extend(req[i : i + step])
        i += step
        if rng.random() < 0.25:
            k = int(rng.integers(1, 9))
            d = s.propose(k)
            ref, _, match = draft_reference(req[:i], h.text(), k, 16)
            assert list(d.tokens) == ref, i
            assert d.match_len == match
            checked += 1
    assert checked > 100


def test_factor_caps_a_draft_at_a_multiple_of_its_match():
    """``suffix:factor=F`` (SuffixDecoding's max_spec_factor): a draft is at most F times as long as
    the match it follows; 0 (the default) leaves it to ``k``."""
    from promptlookup.drafting.spec import Run, SourceSpec, SpecError, source_factory

    run = Run(64, lambda: "fp")
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # "1 2" seen before: a match of 2, then 3 4 5 ...
    free = source_factory(SourceSpec.parse("suffix"), run)()
    d = _draft(free, toks, 6)
    assert d.match_len == 2 and d.tokens == (3, 4, 5, 6, 7, 8)
    one = source_factory(SourceSpec.parse("suffix:factor=1"), run)()
    assert one.factor == 1.0 and _draft(one, toks, 6).tokens == (3, 4)
    assert _draft(source_factory(SourceSpec.parse("suffix:factor=1.5"), run)(), toks, 6).tokens == (3, 4, 5)
    assert _draft(source_factory(SourceSpec.parse("suffix:factor=0.4"), run)(), toks, 6).tokens == ()
    with pytest.raises(SpecError, match="factor must be 0.0..64.0, got -1.0"):
        SourceSpec.parse("suffix:factor=-1")
    with pytest.raises(ValueError, match="suffix factor must be 0"):
        SuffixSource(n_vocab=64, factor=-0.5)


def test_bytes_in_use_counts_the_states_and_edges_made_not_the_room_ahead():
    """"abab": the root and four states, five edges (root-a, a-b, ab-a, aba-b, root-b), 32-byte state
    rows and 12-byte edge rows, and the whole edge hash (128 int64 keys, 128 int32 values); the
    allocation (room for 16 tokens) is larger. A history adds its tokens, 4 bytes each."""
    a = SuffixAutomaton(capacity=16)
    a.extend([1, 2, 1, 2])
    assert (a.n_states, a.hk.nbytes, a.hv.nbytes) == (5, 1024, 512)
    assert a.bytes_in_use == 5 * 32 + 5 * 12 + 1024 + 512 == 1756 < a.nbytes == 3296
    h = History(budget=100)
    h.add([1, 2, 1, 2])
    assert h.bytes_in_use == h.automaton.bytes_in_use + 16
