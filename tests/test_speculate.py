"""The speculative loop on a deterministic fake model: output must equal plain greedy, always."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fakes import FakeModel, RandomDrafts
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.base import Draft
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.speculate import generate


def plain_greedy(model: FakeModel, prompt: Sequence[int], n: int) -> list[int]:
    seq = list(prompt)
    out: list[int] = []
    while len(out) < n:
        t = model.next_token(seq)
        out.append(t)
        seq.append(t)
        if model.is_eog(t):
            break
    return out


class OracleDrafts(RandomDrafts):
    name = "oracle"

    def __init__(self, model):
        super().__init__(model, 0, 1.0)

    def propose(self, k):
        seq = list(self.seq)
        out = []
        for _ in range(k):
            out.append(self.model.next_token(seq))
            seq.append(out[-1])
        return Draft(tuple(out), self.name)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 19), min_size=1, max_size=30),
    n=st.integers(1, 60),
    draft=st.integers(1, 8),
    seed=st.integers(0, 10_000),
    p_right=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    eos=st.one_of(st.none(), st.integers(0, 19)),
    window=st.integers(1, 3),
)
def test_speculative_equals_plain_greedy_for_any_drafts(prompt, n, draft, seed, p_right, eos, window):
    model = FakeModel(n_vocab=20, window=window, eos=eos, seed=seed)
    expected = plain_greedy(model, prompt, n)
    got = generate(model, prompt, n, source=RandomDrafts(model, seed, p_right), draft=draft)
    assert got.tokens == expected
    c = got.counters
    assert c.generated_tokens == len(expected)
    assert c.accepted_tokens <= c.drafted_tokens
    assert c.drafted_steps <= c.decodes
    # every step confirms accepted + 1 tokens; the first token comes from the prefill
    assert c.generated_tokens == 1 + c.decodes + c.accepted_tokens or got.stopped_by == "eos"
    # the KV cache holds exactly prompt + every token but the last one
    assert model.cache == list(prompt) + expected[:-1] or got.stopped_by == "eos"


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=40), n=st.integers(1, 80),
       draft=st.integers(1, 8), min_match=st.integers(1, 4))
def test_suffix_source_is_exact(prompt, n, draft, min_match):
    model = FakeModel(n_vocab=5, window=2)
    expected = plain_greedy(model, prompt, n)
    got = generate(model, prompt, n, source=NgramSource(min_match=min_match), draft=draft)
    assert got.tokens == expected


def test_abstaining_step_is_a_plain_single_token_decode():
    model = FakeModel()
    got = generate(model, [1, 2, 3], 10)
    assert all(len(call) == 1 for call in model.verify_calls)
    assert got.counters.decodes == 9
    assert got.counters.drafted_steps == 0


def test_oracle_drafts_are_all_accepted_and_counted():
    model = FakeModel()
    got = generate(model, [1, 2, 3], 25, source=OracleDrafts(model), draft=4)
    c = got.counters
    # 1 prefill token + 5 tokens per step; the last step is clipped to the remaining room.
    assert [len(call) for call in model.verify_calls] == [5, 5, 5, 5, 4]
    assert c.decodes == 5 and c.drafted_steps == 5
    assert c.drafted_tokens == 4 * 4 + 3 and c.accepted_tokens == c.drafted_tokens
    assert c.generated_tokens == 25
    assert got.tokens == plain_greedy(model, [1, 2, 3], 25)


def test_first_mismatch_is_replaced_by_model_token_and_cache_rolled_back():
    model = FakeModel()
    prompt = [1, 2, 3]
    truth = plain_greedy(model, prompt, 3)
    wrong = (truth[2] + 1) % 50

    class OneRightThenWrong(RandomDrafts):
        def propose(self, k):
            return Draft((truth[1], wrong, 7), "x")

    got = generate(model, prompt, 5, source=OneRightThenWrong(model, 0, 0), draft=3)
    # first step: pending token + 3 drafts in one batch; draft 1 accepted, draft 2 rejected
    assert model.verify_calls[0] == [truth[0], truth[1], wrong, 7]
    assert got.tokens[:3] == truth
    assert got.counters.accepted_tokens >= 1
    # after the first step the cache was rolled back to prompt + the two confirmed tokens
    assert model.cache[: len(prompt) + 2] == prompt + truth[:2]
    assert got.tokens == plain_greedy(model, prompt, 5)


def test_stops_at_eos_inside_an_accepted_draft():
    model = FakeModel()
    prompt = [1, 2, 3]
    truth = plain_greedy(model, prompt, 10)
    model.eos = truth[2]
    expected = plain_greedy(model, prompt, 10)
    assert expected == truth[:3]
    got = generate(model, prompt, 10, source=OracleDrafts(model), draft=8)
    assert got.tokens == expected
    assert got.stopped_by == "eos"


def test_bad_arguments():
    model = FakeModel()
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(model, [], 5)
    with pytest.raises(ValueError, match="draft length"):
        generate(model, [1], 5, draft=0)
    with pytest.raises(ValueError, match="draft length"):
        generate(model, [1], 5, draft=9)
    small = FakeModel(n_ctx=4)
    from promptlookup.errors import RequestError

    with pytest.raises(RequestError, match="the prompt is 4 tokens but the context holds 4: shorten") as exc:
        generate(small, [1, 2, 3, 4], 5)
    assert exc.value.param == "prompt"  # the one check: the server's 400 names the field


def test_context_limit_stops_generation():
    model = FakeModel(n_ctx=10)
    got = generate(model, [1, 2, 3], 100, source=OracleDrafts(model), draft=8)
    assert got.stopped_by == "context"
    assert model.n_past <= 10
    assert got.tokens == plain_greedy(model, [1, 2, 3], len(got.tokens))


def test_the_loop_yields_its_forwards_and_a_driver_that_times_them_is_believed():
    """``step_ops`` never decodes: it yields each forward (the prefill, then one verify a step) and is
    sent the model's tokens. Driven by hand, with a driver that times each forward itself (as an
    engine loop times a round), the output is ``generate``'s, the counters hold the driver's seconds
    exactly, and the source's feedback is told them (drafting measured on a clock that never moves)."""
    from promptlookup.speculate import Forward, step_ops

    class Told(OracleDrafts):
        def __init__(self, model):
            super().__init__(model)
            self.steps = []

        def feedback(self, step):
            self.steps.append(step)

    model = FakeModel()
    want = generate(FakeModel(), [1, 2, 3], 13, source=OracleDrafts(FakeModel()), draft=3)
    source = Told(model)
    ops = step_ops(model, [1, 2, 3], 13, source, draft=3, clock=lambda: 0.0)
    kinds, tokens = [], []
    try:
        item = next(ops)
        while True:
            if isinstance(item, Forward):
                kinds.append((item.kind, len(item.ids)))
                item.seconds = 0.25 * len(item.ids)  # what the driver measured
                item = ops.send(item.run(model))
            else:
                tokens.extend(item)
                item = ops.send(False)
    except StopIteration as done:
        gen = done.value
    assert gen.tokens == tokens == want.tokens
    assert kinds == [("prefill", 3), ("verify", 4), ("verify", 4), ("verify", 4)]
    assert gen.counters.prefill_s == 0.75 and gen.counters.decode_s == 3.0
    assert [(s.fed, s.confirmed, s.verify_s) for s in source.steps] == [(4, 4, 1.0)] * 3
