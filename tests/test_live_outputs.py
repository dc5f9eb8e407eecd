"""Drafting from concurrent requests' live outputs: exact values, the reference twin on real text."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.live_outputs import (
    MAX_MATCH,
    PROMPT_TAIL,
    WINDOW,
    LiveOutputs,
    draft_plain,
    segment_of,
    window_for,
)


def pool(*segments):
    live = LiveOutputs()
    live.build([np.asarray(s, dtype=np.int64) for s in segments])
    return live


def draft(live, owner, context, k):
    m, d = live.draft(owner, np.asarray(context, dtype=np.int64), k)
    return m, d.tolist()


def test_the_longest_match_drafts_what_followed_it_capped_by_the_match():
    live = pool([9, 1, 2, 3, 4, 50, 51], [7, 2, 3, 4, 60, 61, 62, 63, 64, 65])
    # [1, 2, 3, 4] matches 4 tokens in segment 0 and 3 in segment 1: segment 0 wins
    assert draft(live, -1, [0, 1, 2, 3, 4], 8) == (4, [50, 51])
    # k caps it
    assert draft(live, -1, [0, 1, 2, 3, 4], 1) == (4, [50])
    # only 3 tokens match anywhere: below the minimum of 4
    assert draft(live, -1, [8, 2, 3, 4], 8) == (0, [])
    # at most as many tokens as matched (factor 1)
    live = pool([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert draft(live, -1, [1, 2, 3, 4], 8) == (4, [5, 6, 7, 8])


def test_a_requests_own_segment_is_never_searched():
    live = pool([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 7])
    assert draft(live, 0, [1, 2, 3, 4], 4) == (4, [7])
    assert draft(live, 1, [1, 2, 3, 4], 4) == (4, [5, 6])
    assert draft(pool([1, 2, 3, 4, 5]), 0, [1, 2, 3, 4], 4) == (0, [])


def test_ties_go_to_the_longest_continuation_then_the_latest():
    live = pool([1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7], [1, 2, 3, 4, 8, 9])
    assert draft(live, -1, [1, 2, 3, 4], 4) == (4, [8, 9])  # two tokens follow in 1 and 2: the later
    live = pool([1, 2, 3, 4, 6, 7], [1, 2, 3, 4, 5])
    assert draft(live, -1, [1, 2, 3, 4], 4) == (4, [6, 7])  # a longer continuation beats a later one


def test_a_match_never_crosses_a_separator_and_a_segments_end_has_no_continuation():
    live = pool([1, 2], [3, 4, 5])
    assert draft(live, -1, [1, 2, 3, 4], 4) == (0, [])  # [1, 2 | 3, 4] is two segments, not a match
    assert draft(pool([1, 2, 3, 4]), -1, [1, 2, 3, 4], 4) == (0, [])


def test_boundaries_k_context_and_empty_pool():
    live = pool([1, 2, 3, 4, 5])
    assert draft(live, -1, [1, 2, 3, 4], 0) == (0, [])
    assert draft(live, -1, [2, 3, 4], 4) == (0, [])  # a context shorter than the minimum
    assert draft(pool(), -1, [1, 2, 3, 4], 4) == (0, [])
    with pytest.raises(ValueError, match="min_match <= max_match"):
        LiveOutputs(min_match=5, max_match=4)


def test_matches_stop_at_max_match():
    text = list(range(100, 140))
    live = pool(text + [1])
    m, d = draft(live, -1, text, 40)
    assert m == MAX_MATCH and d == [1]


def test_segment_keeps_the_prompt_tail_and_the_latest_output_window():
    tokens = np.arange(100)
    assert segment_of(tokens, 40, 60).tolist() == list(range(40 - PROMPT_TAIL, 60))
    assert segment_of(tokens, 5, 60).tolist() == list(range(0, 60))
    long = np.arange(WINDOW + 200)
    assert segment_of(long, 10, len(long)).tolist() == list(range(200 - PROMPT_TAIL, WINDOW + 200))
    end = len(long)
    assert segment_of(long, 10, end, 100).tolist() == list(range(end - 100 - PROMPT_TAIL, end))


def test_the_pool_shares_its_tokens_among_the_live_requests():
    assert window_for(1) == window_for(8) == WINDOW
    assert window_for(64) == 512
    assert window_for(10_000) == 64


def real_tokens() -> list[int]:
    """Bytes of the standard library's sources: real text, with real repeats."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    names = ("argparse.py", "typing.py", "json/encoder.py")
    data = b"".join((lib / name).read_bytes()[:6000] for name in names)
    return list(data)


def test_the_fast_path_and_its_plain_twin_agree_on_real_text():
    toks = real_tokens()
    rng = random.Random(7)
    live = LiveOutputs()
    drafted = 0
    for _ in range(250):
        segs, starts = [], []
        for _ in range(rng.randint(0, 4)):
            a = rng.randrange(len(toks) - 400)
            segs.append(toks[a : a + rng.randint(0, 300)])
            starts.append(a)
        live.build([np.asarray(s, dtype=np.int64) for s in segs])
        owner = rng.randint(-1, len(segs) - 1) if segs else -1
        # half the contexts end inside a segment's text (a follower), half anywhere
        follower = segs and rng.random() < 0.5
        a = rng.choice(starts) + rng.randrange(300) if follower else rng.randrange(len(toks))
        context = toks[max(0, a - rng.randint(0, 24)) : a]
        k = rng.randint(0, 12)
        fast = draft(live, owner, context, k)
        assert fast == draft_plain(segs, owner, context, k)
        drafted += bool(fast[1])
    assert drafted >= 40  # the comparison covered real drafts, not only empty answers


@settings(max_examples=150, deadline=None)
@given(segs=st.lists(st.lists(st.integers(0, 3), max_size=30), max_size=4),
       context=st.lists(st.integers(0, 3), max_size=20), k=st.integers(0, 8), owner=st.integers(-1, 3))
def test_the_twins_agree_on_any_small_alphabet_pool(segs, context, k, owner):
    live = pool(*segs)
    assert draft(live, owner, context, k) == draft_plain(segs, owner, context, k)
