"""The cost-aware controller: expected-token arithmetic, learning, and exactness."""

from __future__ import annotations

import pytest
from fakes import FakeModel
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.auto import (
    AcceptanceModel,
    AutoDrafter,
    best_length,
    expected_tokens,
    match_bucket,
)
from promptlookup.drafting.base import Draft
from promptlookup.drafting.ngram.source import SuffixMatchSource
from promptlookup.speculate import generate


def test_expected_tokens_exact():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == [1.0, 1.5, 1.75]
    assert expected_tokens([1.0, 1.0, 0.0]) == [1.0, 2.0, 3.0, 3.0]


def test_best_length_follows_the_cost_curve():
    steep = [1.0, 1.74, 2.08, 2.46, 3.10]
    flat = [1.0] * 5
    p = [0.9] * 4
    # E = 1, 1.9, 2.71, 3.439, 4.0951 -> rates on steep: 1, 1.092, 1.303, 1.398, 1.321
    assert best_length(p, steep)[0] == 3
    assert best_length(p, flat)[0] == 4
    assert best_length([0.5] * 4, steep) == (0, 1.0)  # never worth widening: plain decode
    assert best_length([], steep) == (0, 1.0)


def test_match_buckets():
    assert [match_bucket(n) for n in (0, 1, 2, 3, 4, 5, 6, 8, 9, 15, 16, 31, 32, 99)] == [
        0, 0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]


def test_acceptance_model_shrinks_toward_pool_and_prior():
    m = AcceptanceModel(prior_mean=0.5, prior_strength=2.0, pool_strength=4.0)
    assert m.p("ngram", 3, 0) == pytest.approx(0.5)
    m.observe("ngram", 3, n_drafted=3, n_accepted=3)  # positions 0,1,2 tried, all held
    # pool: 3 hits / 3 trials -> (3 + 1) / (3 + 2) = 0.8; cell 0: (1 + 0.8*4) / (1 + 4) = 0.84
    assert m.p("ngram", 3, 0) == pytest.approx(0.84)
    m.observe("ngram", 3, n_drafted=3, n_accepted=0)  # only position 0 tried, and it failed
    # pool: 3/4 -> (3 + 1)/(4 + 2) = 2/3; cell 0: 1 hit / 2 trials -> (1 + 8/3) / 6
    assert m.p("ngram", 3, 0) == pytest.approx((1 + 4 * 2 / 3) / 6)
    assert m.p("other", 3, 0) == pytest.approx(0.5)  # sources learn separately


class Scripted:
    """A source that replays a fixed list of drafts, one per call."""

    name = "scripted"

    def __init__(self, drafts):
        self.drafts = list(drafts)

    def reset(self, prompt):
        pass

    def extend(self, tokens):
        pass

    def feedback(self, step):
        pass

    def propose(self, k):
        return Draft(tuple(self.drafts.pop(0)) if self.drafts else (), self.name, match_len=5)


def test_auto_learns_from_drafts_it_did_not_send():
    # The text is 0 1 2 3 4 5 ...; every proposal is right, but the steep curve and the pessimistic
    # prior make the first steps plain decodes. Scoring the unsent proposals teaches the model.
    steep = [1.0, 1.74, 2.08, 2.46, 3.10]
    auto = AutoDrafter([Scripted([(i + 1, i + 2, i + 3, i + 4) for i in range(40)])], steep, max_draft=4,
                       model=AcceptanceModel(prior_mean=0.3))
    auto.reset([0])
    sent = []
    stream = [0]
    for _ in range(12):
        d = auto.propose(4)
        sent.append(len(d.tokens))
        stream.append(stream[-1] + 1)
        auto.extend([stream[-1]])
    assert sent[0] == 0
    # Even at certainty, 4 tokens for 2.46 beat 5 for 3.10 on this curve: it settles on 3 drafts.
    assert sent[-1] == 3


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=40), n=st.integers(1, 80),
       flat=st.booleans())
def test_auto_is_exact(prompt, n, flat):
    model = FakeModel(n_vocab=6, window=2)
    curve = [1.0] * 9 if flat else [1.0, 1.74, 2.08, 2.46, 3.1, 3.53, 3.91, 4.0, 4.65]
    expected = generate(FakeModel(n_vocab=6, window=2), prompt, n).tokens
    auto = AutoDrafter([SuffixMatchSource(min_match=1), SuffixMatchSource(min_match=3)], curve)
    assert generate(model, prompt, n, source=auto, draft=8).tokens == expected
    cal = auto.calibration
    assert cal.chosen_steps <= cal.steps


def test_auto_refuses_bad_configuration():
    with pytest.raises(ValueError, match="at least one draft source"):
        AutoDrafter([], [1.0, 2.0])
    with pytest.raises(ValueError, match="cost curve"):
        AutoDrafter([SuffixMatchSource()], [1.0])
