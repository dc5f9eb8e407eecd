"""Guesses where the grammar leaves a choice (promptlookup.drafting.grammar_guess and the grammar
layer's :meth:`~promptlookup.drafting.forced.GrammarDrafts.after`): the follower counts against their
plain twin on real text, exact counts and tie-breaks, the scoring of guesses, the continuation a
guess makes with the forced tokens after it, auto's pricing of it, and speculative == plain with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import ByteModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grammar import NAME_OK, PARAMS, constraint
from test_grammar_drafts import Fixed, Strings

from promptlookup.drafting.auto.controller import AutoDrafter
from promptlookup.drafting.forced import FORCED, GRAMMAR, NOTHING, Continuation, GrammarDrafts
from promptlookup.drafting.grammar_guess import (
    OUTPUT_WEIGHT,
    P_MAX,
    FollowerCounts,
    GuessRecord,
    followers_reference,
)
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.sampling import Sampler, SamplingParams
from promptlookup.speculate import generate


# -- follower counts ---------------------------------------------------------------------------------
def test_followers_count_the_prompt_once_and_the_output_heavier():
    f = FollowerCounts()
    f.reset([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert f.followers([1, 2]) == [(3, 2.0, 2), (4, 1.0, 1)]
    assert f.followers([2]) == [(3, 2.0, 2), (4, 1.0, 1)]
    assert f.followers([9]) == []
    f.extend([1, 2])  # the pairs across the prompt's end count as output: 3 -> 1, (2, 3) -> 1
    f.extend([4])
    assert OUTPUT_WEIGHT == 4
    assert f.followers([1, 2]) == [(4, 5.0, 2), (3, 2.0, 2)]  # ranked by weight, both seen twice
    assert f.followers([3]) == [(1, 5.0, 2)]  # 3 -> 1 once in the prompt, once as output
    assert f.followers([2, 3]) == [(1, 5.0, 2)]
    stream = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 4]
    for ctx in ([1, 2], [2], [3], [2, 3], [9]):
        assert f.followers(ctx) == followers_reference(stream, 9, ctx)


def test_ties_go_to_the_lower_id():
    f = FollowerCounts()
    f.reset([5, 9, 5, 7, 5, 8])
    assert f.followers([5]) == [(7, 1.0, 1), (8, 1.0, 1), (9, 1.0, 1)]


def test_a_context_of_another_length_is_refused():
    f = FollowerCounts()
    f.reset([1, 2, 3])
    with pytest.raises(ValueError, match="a context of 3 tokens"):
        f.followers([1, 2, 3])


def test_follower_counts_agree_with_their_plain_twin_on_real_text():
    import json

    text = Path(json.__file__).parent.joinpath("encoder.py").read_bytes()[:6000]
    prompt, output = list(text[:4000]), list(text[4000:])
    f = FollowerCounts()
    f.reset(prompt)
    stream = list(prompt)
    checked = 0
    for at in range(0, len(output), 97):
        chunk = output[at : at + 97]
        f.extend(chunk)
        stream.extend(chunk)
        for ctx in (stream[-1:], stream[-2:], stream[-50:-49], stream[-31:-29], [ord("("), ord("s")]):
            got = f.followers(ctx)
            assert got == followers_reference(stream, len(prompt), ctx)
            checked += bool(got)
    assert checked > 50  # most contexts were seen: the comparison is not of empty lists


# -- the record of guesses ----------------------------------------------------------------------------
def test_guesses_are_scored_only_where_the_draft_before_them_held():
    r = GuessRecord()
    assert r.p(7, 0.5) == pytest.approx(0.5)  # no record: the share it was guessed with
    r.made(3, [5], 7)  # a guess of 7 at position 4, after 5 at position 3
    r.made(3, [6], 7)  # ... and one after 6 there: the same position, the same token, kept once
    r.made(3, [5, 7], 8)  # a guess of 8 at position 5
    r.score([0, 0, 0, 5])  # position 4 not reached: nothing scored
    assert r.trials == {}
    r.score([0, 0, 0, 5, 7, 9])
    assert r.trials == {7: 1.0, 8: 1.0} and r.hits == {7: 1.0, 8: 0.0}
    assert r.p(7, 0.5) == pytest.approx((1 + 0.5 * 2) / (1 + 2))
    assert r.p(8, 0.5) == pytest.approx((0 + 0.5 * 2) / (1 + 2))
    r.made(6, [1], 4)
    r.score([0, 0, 0, 5, 7, 9, 2, 4])  # the draft before it (1) failed: the guess says nothing
    assert r.trials == {7: 1.0, 8: 1.0}
    for _ in range(50):
        r.trials[7] += 1
        r.hits[7] += 1
    assert r.p(7, 1.0) == P_MAX  # never priced as certain


# -- the continuation: forced tokens and guesses --------------------------------------------------------
# after the prompt: 1 2 3, then a choice (4 5 or 6 7 8), then 9 9 forced
SENTENCES = ([1, 2, 3, 4, 5, 9, 9], [1, 2, 3, 6, 7, 8, 9, 9])


def _layer(prompt, source=None):
    g = GrammarDrafts(source or Fixed(), Strings(len(prompt), *SENTENCES))
    g.reset(list(prompt))
    return g


def test_the_guess_is_the_heaviest_allowed_follower_and_the_grammar_forces_after_it():
    g = _layer([0, 3, 6, 3, 6, 3, 5, 3, 5, 3, 5])  # 3 -> 5 thrice (forbidden), 3 -> 6 twice
    g.extend([1, 2, 3])
    assert g.guess([*g._tokens]) == (6, pytest.approx(2 / 3))  # share 2 / (2 + 1) of what is allowed
    c = g.after((), 8)
    assert c.tokens == (6, 7, 8, 9, 9) and c.forced == 0b11110
    assert c.p == (pytest.approx(2 / 3), 1.0, 1.0, 1.0, 1.0)
    assert g.after((), 3).tokens == (6, 7, 8)  # the limit holds
    # from the confirmed 1 2: 3 is forced, then the guess, then the forced again
    g = _layer([0, 3, 6, 3, 6])
    g.extend([1, 2])
    assert g.after((), 8) == Continuation((3, 6, 7, 8, 9, 9), (1.0, pytest.approx(2 / 3), 1.0, 1.0, 1.0, 1.0),
                                          0b111101)


def test_no_guess_without_a_clear_follower():
    g = _layer([0, 3, 6, 3, 4])  # 3 -> 6 once, 3 -> 4 once: a share of 1/3 each
    g.extend([1, 2, 3])
    assert g.guess(g._tokens) is None and g.after((), 8) is NOTHING
    g = _layer([0, 3, 5, 3, 5])  # only a follower the grammar forbids
    g.extend([1, 2, 3])
    assert g.after((), 8) is NOTHING
    g = _layer([0])  # nothing followed 3 anywhere
    g.extend([1, 2, 3])
    assert g.after((), 8) is NOTHING


def test_the_two_token_context_comes_first():
    # after (2, 3) the prompt wrote 4 once; after 3 alone it wrote 6 three times
    g = _layer([0, 2, 3, 4, 3, 6, 3, 6, 3, 6])
    g.extend([1, 2, 3])
    assert g.guess(g._tokens) == (4, pytest.approx(0.5))
    assert g.after((), 8).tokens == (4, 5, 9, 9)


def test_guesses_made_are_scored_as_the_tokens_come():
    g = _layer([0, 3, 6, 3, 6])
    g.extend([1, 2, 3])
    g.after((), 8)
    assert g.guesses.trials == {}
    g.extend([4])  # the model chose 4: the guess of 6 missed
    assert g.guesses.trials == {6: 1.0} and g.guesses.hits == {6: 0.0}
    # the model's own 4 after (2, 3), seen once and nothing else: the guess, at an even chance (the
    # output's weight ranks followers, their sightings price them)
    assert g.guess([0, 3, 6, 3, 6, 1, 2, 3]) == (4, pytest.approx(0.5))
    # after 3 alone: 4 once in the output outweighs 6 twice in the prompt, but holds 1 of 3 sightings
    assert g.followers.followers([3]) == [(4, 4.0, 1), (6, 2.0, 2)]


# -- auto prices the continuation -----------------------------------------------------------------------
def _auto(source, rel=(1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16)):
    return AutoDrafter([source], list(rel), max_draft=8)


def test_auto_sends_a_guess_and_the_forced_tokens_after_it_where_no_source_drafts():
    prompt = [0, 3, 6, 3, 6]
    auto = _auto(Fixed())
    auto.reset(prompt)
    g = _layer(prompt, auto)
    g.extend([1, 2, 3])
    d = g.propose(8)
    assert d.tokens == (6, 7, 8, 9, 9) and d.source == GRAMMAR
    assert d.features[FORCED] == 0b11110  # the guess is not counted as forced
    g.extend([6, 7, 8, 9, 9, 0])
    assert auto.calibration.realized == 5 and g.guesses.hits == {6: 1.0}
    # where a verify of n costs n decodes, a guess of 2/3 is not worth sending
    steep = _auto(Fixed(), rel=tuple(float(n) for n in range(1, 10)))
    steep.reset(prompt)
    s = _layer(prompt, steep)
    s.extend([1, 2, 3])
    assert s.propose(8).tokens == ()


def test_auto_appends_a_guess_after_a_sources_whole_draft():
    # the source drafts 1 2 (3 is forced after them, then the guess 6, then 7 8 9 9 forced)
    prompt = [0, 3, 6, 3, 6, 3, 6]
    auto = _auto(Fixed([1, 2]))
    g = GrammarDrafts(auto, Strings(len(prompt), *SENTENCES))
    g.reset(prompt)
    auto.reset(prompt)
    d = g.propose(8)
    assert d.tokens == (1, 2, 3, 6, 7, 8, 9, 9)
    assert d.features[FORCED] == 0b11110111  # 1 2 3 forced from the start; 6 guessed; 7 8 9 9 forced


# -- exactness -----------------------------------------------------------------------------------------
def _run(model, prompt, schema, params, seed, source=None, draft=4, max_tokens=200):
    c = constraint(model, schema)
    sampler = Sampler(params, seed, constraint=c)
    layer = GrammarDrafts(source, c) if source is not None else None
    return generate(model, prompt, max_tokens, source=layer, draft=draft, sampler=sampler), layer


def test_guesses_are_made_and_held_and_the_output_is_plain_decodings():
    model = ByteModel(window=1)
    plain, _ = _run(model, [1, 2, 3], NAME_OK, SamplingParams(), 0)
    prompt = [1, 2, 3, *plain.tokens[:-1], 10, *plain.tokens[:-1]]  # the model's own JSON, twice
    plain, _ = _run(model, prompt, NAME_OK, SamplingParams(), 0)
    auto = AutoDrafter([NgramSource(min_match=1)], [1.0 + 0.02 * i for i in range(9)])
    spec, layer = _run(model, prompt, NAME_OK, SamplingParams(), 0, source=auto, draft=8)
    assert spec.tokens == plain.tokens
    assert sum(layer.guesses.trials.values()) > 0 and sum(layer.guesses.hits.values()) > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.sampled_from(PARAMS), seed=st.integers(0, 1000), window=st.integers(1, 2),
       draft=st.integers(1, 8), noise=st.binary(max_size=8))
def test_speculation_with_guesses_changes_nothing(params, seed, window, draft, noise):
    model = ByteModel(window=window, seed=seed)
    json_text = list(b'{ "name" : "ab" , "ok" :true } { "name" : "cd" , "ok" :false }')
    prompt = [*noise, *json_text, *noise]  # JSON around: guesses are made
    plain, _ = _run(model, prompt, NAME_OK, params, seed)
    auto = AutoDrafter([NgramSource(min_match=1)], [1.0 + 0.03 * i for i in range(9)])
    spec, _ = _run(model, prompt, NAME_OK, params, seed, source=auto, draft=draft)
    assert spec.tokens == plain.tokens
    assert spec.stopped_by == plain.stopped_by
