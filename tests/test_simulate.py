"""Replay simulation with a cost curve, the hindsight oracle, and cost-curve files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.costcurve import CostCurve, CostCurveError
from promptlookup.drafting.auto.controller import AutoDrafter
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.measure.simulate import acceptable_lengths, oracle, oracle_plan, simulate, sweep

STEEP = CostCurve((1.0, 1.74, 2.08, 2.46, 3.10, 3.53, 3.91, 4.0, 4.65))


def test_plain_replay_costs_one_decode_per_token():
    r = simulate([1], [2, 3, 4, 5], None, 3, STEEP)
    assert r.cost == 3.0 and r.plain_cost == 3.0 and r.speedup == 1.0


def test_repeating_text_exact_costs():
    prompt = [1, 2, 3, 4]
    cont = [1, 2, 3, 4, 1, 2, 3, 4]
    # Steps after the first token (1): the match of "4 1" -> drafts 2 3 4 (k=3) all right, then
    # the next token comes with them; width 4 per step.
    r = simulate(prompt, cont, NgramSource(min_match=1), 3, CostCurve.flat())
    assert r.accepted_tokens == r.drafted_tokens
    assert r.steps == 2 and r.cost == 2.0 and r.speedup == pytest.approx(7 / 2)


def test_acceptable_lengths_exact():
    offers = acceptable_lengths([5, 6, 7], [5, 6, 9], NgramSource(min_match=1), 8)
    # q=3 (token 5): match "5" at 0 -> offers 6 7 5, text says 6 9 -> 1 accepted
    # q=4 (token 6): match "5 6" at 1 -> offers 7 5 6, text says 9 -> 0
    # q=5 (token 9): no match
    assert offers == [(3, 1), (3, 0), (0, 0)]


@settings(max_examples=80, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=3, max_size=80), flat=st.booleans())
def test_oracle_is_at_least_every_fixed_length_and_auto(text, flat):
    curve = CostCurve.flat(9) if flat else STEEP
    prompt, cont = text[:2], text[2:]
    best = oracle(prompt, cont, NgramSource(min_match=1), 8, curve)
    for r in sweep(prompt, cont, lambda: NgramSource(min_match=1), curve, (1, 2, 3, 8)):
        assert best.cost <= r.cost + 1e-9
    auto = simulate(prompt, cont, AutoDrafter([NgramSource(min_match=1)], curve.relative(9)), 8,
                    curve)
    assert best.cost <= auto.cost + 1e-9


def test_oracle_plan_exact_on_a_repeating_text():
    # the text repeats "1 2 3 4": from the first token on, ngram offers 3 tokens that all hold
    prompt, cont = [1, 2, 3, 4], [1, 2, 3, 4, 1, 2, 3, 4]
    plan = oracle_plan(prompt, cont, NgramSource(min_match=1), 3, STEEP)
    assert plan.offers[:5] == [(3, 3)] * 5 and plan.offers[5:] == [(3, 2), (3, 1), (3, 0)]
    # 7 tokens to confirm: a step of 2 drafts (2.08) and one of 3 (2.46), 3 + 4 tokens; 3 then 2
    # costs the same, and the tie goes to the shorter first draft
    assert plan.steps() == [(0, 2, 2), (3, 3, 3)]
    assert plan.cost_to_go == pytest.approx([4.54, 4.16, 3.46, 2.46, 2.08, 1.74, 1.0, 0.0])
    assert plan.choice == [2, 2, 0, 3, 2, 1, 0, 0]
    assert plan.rel == [1.0, 1.74, 2.08, 2.46]
    best = oracle(prompt, cont, NgramSource(min_match=1), 3, STEEP)
    assert best.cost == plan.cost_to_go[0] and best.steps == 2 and best.accepted_tokens == 5


@settings(max_examples=40, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=3, max_size=60))
def test_oracle_plan_cost_to_go_is_its_path_and_never_above_plain(text):
    prompt, cont = text[:2], text[2:]
    plan = oracle_plan(prompt, cont, NgramSource(min_match=1), 8, STEEP)
    n = len(cont)
    for i in range(n):
        assert plan.cost_to_go[i] <= n - 1 - i + 1e-9  # plain decoding from there is one way
    assert sum(plan.rel[k] for _, k, _ in plan.steps()) == pytest.approx(plan.cost_to_go[0])


def test_cost_curve_files(tmp_path):
    p = tmp_path / "c.json"
    STEEP.save(p)
    assert CostCurve.load(p).seconds == STEEP.seconds
    assert json.loads(p.read_text())["format"] == "promptlookup-cost-curve"
    (tmp_path / "list.json").write_text("[0.01, 0.02]")
    assert CostCurve.load(tmp_path / "list.json").relative() == [1.0, 2.0]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CostCurveError, match="not valid JSON"):
        CostCurve.load(tmp_path / "bad.json")
    (tmp_path / "neg.json").write_text('{"seconds": [0.01, -1]}')
    with pytest.raises(CostCurveError, match="positive number"):
        CostCurve.load(tmp_path / "neg.json")
    with pytest.raises(CostCurveError, match="not found"):
        CostCurve.load(tmp_path / "missing.json")
    assert CostCurve((1.0, 2.0)).cost(4) == 4.0  # extrapolates the last slope


def test_median_curve_takes_each_widths_median_shape_at_the_median_plain_decode():
    from promptlookup.costcurve import median_curve

    slow = CostCurve((0.2, 0.4, 0.6), "a")  # shape 1, 2, 3: the whole machine ran at half speed
    timings = [CostCurve((0.1, 0.15, 0.3, 0.5), "a"), slow, CostCurve((0.1, 0.3, 0.25), "c")]
    m = median_curve(timings)
    # plain: median(0.1, 0.2, 0.1); width 2: median(1.5, 2, 3); width 3: median(3, 3, 2.5); width 4
    # only one timing measured: left out
    assert m.seconds == pytest.approx((0.1, 0.2, 0.3))
    assert m.label == "a"
    # a slow timing weighs by its shape alone: scaled, it changes nothing
    assert median_curve([*timings[:1], CostCurve((0.05, 0.1, 0.15)), timings[2]]).seconds == pytest.approx(
        m.seconds)
    assert median_curve([slow], "one").seconds == slow.seconds
    with pytest.raises(ValueError, match="at least one curve"):
        median_curve([])


def test_simulate_tells_the_source_told_seconds_and_charges_the_curve():
    class Listening(NgramSource):
        def __init__(self):
            super().__init__()
            self.heard: list[tuple[int, float]] = []

        def feedback(self, step):
            self.heard.append((step.fed, step.verify_s))

    text = [1, 2, 3, 4] * 10
    src = Listening()
    told = simulate(text[:8], text[8:], src, 3, STEEP, told=lambda w: 100.0 + w)
    assert src.heard and all(s == 100.0 + w for w, s in src.heard)
    untold = simulate(text[:8], text[8:], Listening(), 3, STEEP)
    assert told.cost == pytest.approx(untold.cost)  # charged by the curve either way


def test_multi_source_oracle_takes_the_better_offer_each_step():
    prompt, cont = [1, 2, 3, 9, 1, 2, 3, 7, 5], [1, 2, 3, 7, 5, 1, 2]
    one = oracle(prompt, cont, NgramSource(min_match=1), 8, CostCurve.flat())
    both = oracle(prompt, cont, [NgramSource(min_match=1), NgramSource(min_match=3)], 8,
                  CostCurve.flat())
    assert both.cost <= one.cost


def test_simulate_text_chunks_and_labels():
    from promptlookup.measure.simulate import report_table, simulate_text

    tokens = [1, 2, 3, 4] * 30
    res = simulate_text(tokens, 40, CostCurve.flat(9),
                        {"ngram 3": (lambda: NgramSource(min_match=1), 3)},
                        oracle_sources=lambda: [NgramSource(min_match=1)])
    assert [r.label for r in res] == ["ngram 3", "oracle"]
    # two whole chunks of 40 (the third has no token after it), 39 tokens to produce in each
    assert res[0].tokens == 78 and res[0].plain_cost == 76
    assert res[1].cost <= res[0].cost
    table = report_table(res, CostCurve.flat(9))
    assert "| oracle |" in table and "speedup" in table


class _ClockedModel:
    """A FakeModel whose verify advances a virtual clock: 1 unit per token fed plus 0.01 per cached
    position per step (attention over the cache is read once per step, however wide), and records
    how many tokens each prefill decoded."""

    name = "clocked"

    def __init__(self) -> None:
        from fakes import FakeModel

        self.m = FakeModel(n_vocab=300, n_ctx=4096)
        self.now = 0.0
        self.prefilled: list[int] = []

    n_past = property(lambda self: self.m.n_past)
    tokens = property(lambda self: self.m.tokens)

    def clock(self) -> float:
        return self.now

    def prefill(self, ids, sampler=None, keep=0):
        self.prefilled.append(len(ids) - keep)
        return self.m.prefill(ids, sampler, keep)

    def verify(self, ids, sampler=None):
        self.now += len(ids) + 0.01 * self.m.n_past
        return self.m.verify(ids, sampler)

    def rollback(self, n_keep):
        self.m.rollback(n_keep)


def test_curve_after_a_context_is_timed_there_and_decodes_only_what_is_not_cached():
    from promptlookup.backends.costs import measure_cost_curve, measure_cost_curve_after

    model = _ClockedModel()
    short = measure_cost_curve(model, max_tokens=3, reps=3, context=100, clock=model.clock)
    assert short.seconds == pytest.approx((2.0, 3.0, 4.0))  # width + 0.01 * 100
    assert model.tokens == []  # the load-time curve leaves the cache empty
    context = list(range(100, 1100))
    model.prefill(context[:600])
    after = measure_cost_curve_after(model, context, max_tokens=3, reps=3, clock=model.clock)
    assert after.seconds == pytest.approx((11.0, 12.0, 13.0))  # width + 0.01 * 1000
    assert after.label == "clocked measured after 1000 tokens"
    assert model.prefilled[-1] == 400  # the 600 cached tokens were kept
    assert model.tokens == context  # and the cache ends holding the context
    # relative to a decode, a verify is cheaper after a long context (the 9-token case of the 1.5B)
    assert after.relative()[2] < short.relative()[2]
    with pytest.raises(ValueError, match="at least one context token"):
        measure_cost_curve_after(model, [], clock=model.clock)
