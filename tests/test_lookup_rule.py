"""The --lookup draft rule pinned on hand-made caches, for the reference and the numba twin alike."""

from __future__ import annotations

import pytest

from promptlookup.drafting.lookup.cache import DictNgramCache, NgramCache
from promptlookup.drafting.lookup.source import (
    CONTEXT_MIN_PERCENT,
    CONTEXT_MIN_SAMPLE,
    DYNAMIC_MIN_PERCENT,
    DYNAMIC_MIN_SAMPLE,
    draft_fast,
    draft_reference,
)
from promptlookup.drafting.lookup.static_cache import build_static

FP = "0123456789abcdef"
SEQ = [10, 11, 12, 13]


def caches(ngrams: dict, cls):
    c = cls()
    for key, part in ngrams.items():
        for tok, cnt in part.items():
            c.add(key, tok, cnt)
    return c


def static(triples: dict):
    t0, t1, y, c = [], [], [], []
    for (a, b), part in triples.items():
        for tok, cnt in part.items():
            t0.append(a), t1.append(b), y.append(tok), c.append(cnt)
    return build_static(t0, t1, y, c, 64, FP)


def draft(seq, k, ctx=None, dyn=None, st=None, impl="fast"):
    st_cache = static(st) if st else None
    if impl == "fast":
        return draft_fast(seq, k, caches(ctx or {}, NgramCache), caches(dyn or {}, NgramCache), st_cache)
    return draft_reference(seq, k, caches(ctx or {}, DictNgramCache), caches(dyn or {}, DictNgramCache),
                           st_cache)


IMPLS = pytest.mark.parametrize("impl", ["fast", "reference"])
WHICH = [("ctx", n, CONTEXT_MIN_SAMPLE[n - 1], CONTEXT_MIN_PERCENT[n - 1]) for n in range(1, 5)] + [
    ("dyn", n, DYNAMIC_MIN_SAMPLE[n - 1], DYNAMIC_MIN_PERCENT[n - 1]) for n in range(1, 5)]


def test_thresholds_are_llama_cpp_s():
    assert CONTEXT_MIN_SAMPLE == (2, 2, 1, 1) and CONTEXT_MIN_PERCENT == (66, 50, 50, 50)
    assert DYNAMIC_MIN_SAMPLE == (4, 3, 2, 2) and DYNAMIC_MIN_PERCENT == (75, 66, 66, 66)


@IMPLS
@pytest.mark.parametrize(("which", "n", "a", "p"), WHICH)
def test_sample_size_at_and_below_boundary(impl, which, n, a, p):
    key = tuple(SEQ[-n:])
    at = {key: {8: a}}
    assert draft(SEQ, 1, **{which: at}, impl=impl) == [8]
    if a > 1:
        assert draft(SEQ, 1, **{which: {key: {8: a - 1}}}, impl=impl) == []


# (best count, total) with 100 * best == p * total exactly, and one more sighting of another token
BOUNDARY = {66: (33, 50), 50: (2, 4), 75: (3, 4)}


@IMPLS
@pytest.mark.parametrize(("which", "n", "a", "p"), WHICH)
def test_percent_at_and_below_boundary(impl, which, n, a, p):
    key = tuple(SEQ[-n:])
    best, total = BOUNDARY[p]
    rest = total - best  # spread over other tokens, each below best
    at = {8: best, **{20 + i: 1 for i in range(rest)}}
    assert sum(at.values()) == total and total >= a
    assert draft(SEQ, 1, **{which: {key: at}}, impl=impl) == [8]
    below = {**at, 40: 1}  # total + 1: now 100 * best < p * total
    assert draft(SEQ, 1, **{which: {key: below}}, impl=impl) == []


@IMPLS
def test_static_weight_x100_changes_the_winner(impl):
    ctx = {(12, 13): {8: 3, 9: 3}}
    assert draft(SEQ, 1, ctx=ctx, impl=impl) == [8]  # tie: lowest id
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {9: 1}}, impl=impl) == [9]
    ctx = {(12, 13): {8: 250, 9: 3}}  # 3 * 100 * 1 = 300 > 250: the minority wins on score...
    # ...then fails p (3/253), n = 1 is absent, and the static fall-back drafts its own best
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {9: 1, 10: 5}}, impl=impl) == [10]
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {9: 1}}, impl=impl) == []  # fall-back total 1 < 2
    ctx = {(12, 13): {8: 199, 9: 200}}
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {8: 2, 9: 1}}, impl=impl) == [8]  # 199*200 > 200*100


@IMPLS
def test_static_weight_uses_the_last_two_tokens_for_every_n(impl):
    ctx = {(11, 12, 13): {8: 1, 9: 1}}
    assert draft(SEQ, 1, ctx=ctx, impl=impl) == [8]
    assert draft(SEQ, 1, ctx=ctx, st={(11, 12): {9: 9}}, impl=impl) == [8]  # not the last 2-gram
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {9: 9, 8: 1}}, impl=impl) == [9]


@IMPLS
def test_static_fallback(impl):
    assert draft(SEQ, 1, st={(12, 13): {8: 1, 9: 1}}, impl=impl) == [8]  # total 2, 50 %: tie, lowest id
    assert draft(SEQ, 1, st={(12, 13): {8: 1}}, impl=impl) == []  # total 1 < 2
    assert draft(SEQ, 1, st={(12, 13): {8: 1, 9: 1, 10: 1}}, impl=impl) == []  # 33 % < 50 %
    assert draft(SEQ, 1, st={(12, 13): {8: 2, 9: 1, 10: 1}}, impl=impl) == [8]  # exactly 50 %
    # only when the context and dynamic caches draft nothing
    assert draft(SEQ, 1, ctx={(13,): {7: 2}}, st={(12, 13): {8: 5}}, impl=impl) == [7]
    assert draft(SEQ, 1, ctx={(13,): {7: 1}}, st={(12, 13): {8: 5}}, impl=impl) == [8]


@IMPLS
def test_ngram_order_longest_first_context_before_dynamic(impl):
    ctx = {(10, 11, 12, 13): {4: 1}, (13,): {1: 5}}
    assert draft(SEQ, 1, ctx=ctx, impl=impl) == [4]
    ctx = {(11, 12, 13): {3: 1}, (12, 13): {2: 9}}
    assert draft(SEQ, 1, ctx=ctx, impl=impl) == [3]
    # the context cache at n = 1 beats the dynamic cache at n = 4
    assert draft(SEQ, 1, ctx={(13,): {1: 2}}, dyn={(10, 11, 12, 13): {4: 9}}, impl=impl) == [1]
    # a failing longer n-gram falls through to a shorter one
    assert draft(SEQ, 1, ctx={(12, 13): {2: 1}, (13,): {1: 2}}, impl=impl) == [1]
    # n longer than the sequence is skipped
    assert draft([12, 13], 1, ctx={(13,): {1: 2}}, impl=impl) == [1]


@IMPLS
def test_drafting_repeats_on_the_extended_sequence(impl):
    ctx = {(13,): {1: 2}, (1,): {2: 2}, (2,): {3: 2}}
    assert draft(SEQ, 5, ctx=ctx, impl=impl) == [1, 2, 3]
    assert draft(SEQ, 2, ctx=ctx, impl=impl) == [1, 2]
    assert draft([13], 5, ctx=ctx, impl=impl) == []  # fewer than 2 tokens: no draft at all


@IMPLS
def test_64_bit_scores(impl):
    # 30000 * 100 * 1000 = 3e9 overflows llama.cpp's int32 score (there neither follower would win).
    ctx = {(12, 13): {8: 30000, 9: 25000}}
    assert draft(SEQ, 1, ctx=ctx, st={(12, 13): {8: 1000, 9: 1000}}, impl=impl) == [8]


@IMPLS
def test_ties_go_to_the_lowest_token_id(impl):
    assert draft(SEQ, 1, ctx={(13,): {9: 2, 5: 2, 7: 2}}, impl=impl) == []  # 33 % fails p
    assert draft(SEQ, 1, ctx={(12, 13): {9: 2, 5: 2}}, impl=impl) == [5]
    assert draft(SEQ, 1, ctx={(12, 13): {9: 2, 5: 2}}, st={(12, 13): {9: 1, 5: 1}}, impl=impl) == [5]


@IMPLS
def test_a_lone_follower_wins_whatever_the_static_weights(impl):
    # the fast twin does not ask the static cache about an n-gram with one follower: same drafts
    st = {(12, 13): {9: 50, 7: 1}}
    assert draft(SEQ, 1, ctx={(12, 13): {8: 2}}, st=st, impl=impl) == [8]
    assert draft(SEQ, 1, ctx={(12, 13): {9: 2}}, st=st, impl=impl) == [9]
    assert draft(SEQ, 1, ctx={(12, 13): {8: 1}}, st=st, impl=impl) == [9]  # 1 < a = 2: the fall-back
    assert draft(SEQ, 1, dyn={(11, 12, 13): {8: 3}}, st=st, impl=impl) == [8]


@IMPLS
def test_the_static_part_is_per_drafted_token(impl):
    # token 1: a two-follower scan weighted by (12, 13); token 2: a lone follower (no static lookup);
    # token 3: the fall-back of (9, 4); then (4, 6) has nothing. A static part carried over from an
    # earlier token would give (12, 13)'s fall-back (total 1: none) or weights of the wrong 2-gram.
    ctx = {(12, 13): {8: 3, 9: 3}, (13, 9): {4: 2}}
    st = {(12, 13): {9: 1}, (9, 4): {6: 3}, (4, 6): {5: 1}}
    assert draft(SEQ, 5, ctx=ctx, st=st, impl=impl) == [9, 4, 6]
    ctx = {(13, 8): {1: 1, 2: 1}}  # token 1: the fall-back of (12, 13); token 2: (13, 8)'s weights
    st = {(12, 13): {8: 2}, (13, 8): {2: 1}}
    assert draft(SEQ, 2, ctx=ctx, st=st, impl=impl) == [8, 2]
    assert draft(SEQ, 2, ctx=ctx, st={(12, 13): {8: 2}}, impl=impl) == [8, 1]  # unweighted: lowest id


def test_static_fallback_reports_its_count_and_total():
    from promptlookup.drafting.lookup.source import ORIGIN_STATIC, LookupSource

    src = LookupSource(static=static({(12, 13): {8: 2, 9: 1, 10: 1}, (13, 8): {9: 1, 4: 3}}))
    src.reset(SEQ)
    d = src.propose(3)
    assert d.tokens == (8, 4) and d.match_len == 2
    assert d.features == {"origin": float(ORIGIN_STATIC), "count": 2.0, "total": 4.0}
