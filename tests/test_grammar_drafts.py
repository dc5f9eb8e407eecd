"""Drafts from the grammar (promptlookup.drafting.forced): the layer's exact drafts on a scripted
grammar, llguidance's forced tokens through :class:`~promptlookup.grammar.Constraint`, auto's pricing
of them, and speculative == plain with the layer on (the byte double here; the bundled model in
tests/test_grammar_drafts_real.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fakes import ByteModel, RandomDrafts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grammar import NAME_OK, NAME_OK_TEXT, PARAMS, ScriptedDrafts, constraint, schemas

from promptlookup.drafting.auto.controller import AutoDrafter
from promptlookup.drafting.base import Draft, StepFeedback
from promptlookup.drafting.forced import FORCED, GRAMMAR, GrammarDrafts, forced_count
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.sampling import Sampler, SamplingParams
from promptlookup.serve.metrics import Metrics
from promptlookup.speculate import generate
from promptlookup.telemetry import Counters


class Strings:
    """A grammar whose sentences are a few token strings (after a prompt of ``start`` tokens): a
    token is forced where every sentence still possible agrees on it."""

    def __init__(self, start: int, *sentences: Sequence[int]) -> None:
        self.start = start
        self.sentences = [list(s) for s in sentences]

    def _alive(self, out: Sequence[int]) -> list[list[int]]:
        return [s for s in self.sentences if s[: len(out)] == list(out)]

    def forced(self, tokens: Sequence[int], limit: int) -> list[int]:
        out = list(tokens[self.start :])
        got: list[int] = []
        while len(got) < limit:
            nxt = {s[len(out)] for s in self._alive(out) if len(s) > len(out)}
            if len(nxt) != 1:
                break
            t = nxt.pop()
            got.append(t)
            out.append(t)
        return got

    def valid(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        out = list(tokens[self.start :])
        n = 0
        while n < len(draft) and self._alive([*out, *draft[: n + 1]]):
            n += 1
        return n


class Fixed:
    """A source that proposes one fixed draft (after recording what it is told)."""

    name = "fixed"

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens = tuple(tokens)
        self.seen: list[int] = []
        self.fed: list[StepFeedback] = []

    def reset(self, prompt):
        self.seen = list(prompt)

    def extend(self, tokens):
        self.seen.extend(tokens)

    def propose(self, k):
        return Draft(self.tokens[:k], self.name, 3)

    def commit(self):
        pass

    def feedback(self, step):
        self.fed.append(step)


def layer(grammar, source, prompt=(0,)):
    g = GrammarDrafts(source, grammar)
    g.reset(list(prompt))
    return g


# prompt [0]; sentences: 1 2 3 then 4 5 or 6 7 8 (a choice after 3), then 9 9 forced again
GRAMMAR_1 = Strings(1, [1, 2, 3, 4, 5, 9, 9], [1, 2, 3, 6, 7, 8, 9, 9])


def test_forced_tokens_come_first_when_the_source_abstains():
    d = layer(GRAMMAR_1, Fixed()).propose(8)
    assert d.tokens == (1, 2, 3) and d.source == GRAMMAR and d.features[FORCED] == 0b111


def test_the_lookup_continuation_follows_the_forced_tokens_and_more_forced_after_it():
    d = layer(GRAMMAR_1, Fixed([1, 2, 3, 6])).propose(8)
    # forced 1 2 3, the source's 6 (its draft agreed with them), then 7 8 9 9 forced after it
    assert d.tokens == (1, 2, 3, 6, 7, 8, 9, 9)
    assert d.source == "fixed" and d.match_len == 3
    assert d.features[FORCED] == 0b11110111
    assert forced_count(d.features[FORCED], 4) == 3 and forced_count(d.features[FORCED], 8) == 7


def test_a_source_that_disagrees_with_the_forced_tokens_gives_way():
    assert layer(GRAMMAR_1, Fixed([1, 5, 3, 4])).propose(8).tokens == (1, 2, 3)


def test_a_draft_is_cut_where_it_first_leaves_the_grammar():
    g = layer(GRAMMAR_1, Fixed([4, 5, 7, 7]), prompt=(0, 1, 2, 3))
    d = g.propose(8)
    assert d.tokens == (4, 5, 9, 9) and d.features[FORCED] == 0b1100  # 7 is refused; 9 9 forced after 5
    g = layer(GRAMMAR_1, Fixed([5]), prompt=(0, 1, 2, 3))
    d = g.propose(8)
    assert d.tokens == () and FORCED not in d.features  # refused at once: nothing to send


def test_the_draft_length_caps_every_part():
    assert layer(GRAMMAR_1, Fixed()).propose(2).tokens == (1, 2)
    assert layer(GRAMMAR_1, Fixed([1, 2, 3, 6, 7])).propose(4).tokens == (1, 2, 3, 6)


def test_the_layer_passes_the_stream_and_feedback_through():
    src = Fixed()
    g = layer(GRAMMAR_1, src, prompt=(0,))
    g.extend([1, 2])
    assert src.seen == [0, 1, 2] and g.propose(8).tokens == (3,)
    step = StepFeedback(2, 2, 0.01, 0.0)
    g.feedback(step)
    assert src.fed == [step] and g.name == "fixed" and g.report() is None


def _auto(source, rel=(1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16)):
    return AutoDrafter([source], list(rel), max_draft=8)


def test_auto_prices_forced_tokens_as_certain():
    auto = _auto(Fixed())
    auto.reset([0])
    g = GrammarDrafts(auto, GRAMMAR_1)
    g.reset([0])
    d = g.propose(8)
    assert d.tokens == (1, 2, 3) and d.source == GRAMMAR and d.features[FORCED] == 0b111
    assert auto.calibration.per_source == {GRAMMAR: 1}
    # the same tokens drafted by a source without the grammar's word are not worth a verify at this
    # cost curve to a prior that has seen nothing (auto decodes plainly)
    plain = _auto(Fixed([1, 2, 3]), rel=(1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6, 5.2, 5.8))
    plain.reset([0])
    assert plain.propose(8).tokens == ()
    priced = _auto(Fixed(), rel=(1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6, 5.2, 5.8))
    priced.reset([0])
    assert priced.propose_forced(8, [1, 2, 3], lambda d: len(d)).tokens == (1, 2, 3)


def test_auto_cuts_sources_where_they_leave_the_grammar_and_extends_agreeing_ones():
    auto = _auto(Fixed([1, 2, 3, 6, 7, 8, 9, 9]))
    auto.reset([0])
    d = GrammarDrafts(auto, GRAMMAR_1)
    d.reset([0])
    got = d.propose(8)
    assert got.tokens[:3] == (1, 2, 3) and len(got.tokens) > 3 and got.source == "fixed"
    assert got.features[FORCED] == 0b111  # auto's draft: only the leading forced tokens are counted
    wrong = _auto(Fixed([4, 4, 4]))
    wrong.reset([0])
    w = GrammarDrafts(wrong, GRAMMAR_1)
    w.reset([0])
    assert w.propose(8).tokens == (1, 2, 3)  # the refused draft is cut to nothing; the forced win


def test_auto_sends_what_the_grammar_forces_after_a_sources_whole_draft_and_books_it():
    # after 0 1 2 3 the grammar leaves a choice (4 or 6); the source guesses 4 5, then 7 7, which
    # the grammar refuses: its draft is cut to 4 5, and what the grammar forces after them (9 9)
    # is appended, priced as certain once 4 5 held
    auto = _auto(Fixed([4, 5, 7, 7]))
    g = GrammarDrafts(auto, GRAMMAR_1)
    g.reset([0, 1, 2, 3])
    auto.reset([0, 1, 2, 3])
    d = g.propose(8)
    assert d.tokens == (4, 5, 9, 9) and d.source == "fixed"
    assert d.features[FORCED] == 0b1100  # the appended positions only
    assert auto._chosen[0][0] == ("fixed", 2, 4)  # source, match bucket (match 3: bucket 2), tokens sent
    g.extend([4, 5, 9, 9, 0])  # all four held (then the model's own token)
    assert auto.calibration.realized == 4 and auto.calibration.chosen_steps == 1
    # where the source's draft fails, nothing after it counts
    auto = _auto(Fixed([4, 5, 7, 7]))
    g = GrammarDrafts(auto, GRAMMAR_1)
    g.reset([0, 1, 2, 3])
    auto.reset([0, 1, 2, 3])
    assert g.propose(8).tokens == (4, 5, 9, 9)
    g.extend([4, 4])
    assert auto.calibration.realized == 1
    # without the grammar's word (plain propose) the same source is only cut by nothing: its own draft
    bare = _auto(Fixed([4, 5, 7, 7]))
    bare.reset([0, 1, 2, 3])
    assert bare.propose(8).tokens == (4, 5, 7, 7)


# -- llguidance's forced tokens ------------------------------------------------------------------------
def test_the_constraint_names_forced_tokens_and_valid_prefixes():
    model = ByteModel(window=1)
    c = constraint(model, {"enum": ["abc", "abd"]})
    c.reset(1)
    assert bytes(c.forced([1], 10)) == b'"ab' and bytes(c.forced([1], 2)) == b'"a'
    assert c.valid([1], list(b'"abx')) == 3 and c.valid([1], list(b'"abd"')) == 5
    assert c.forced([1, *b'"ab'], 10) == []  # a choice: c or d
    assert bytes(c.forced([1, *b'"abd'], 10)) == b'"'
    obj = constraint(model, {"type": "object", "properties": {"name": {"type": "string"}},
                             "required": ["name"], "additionalProperties": False})
    obj.reset(1)
    # optional whitespace leaves a choice after '{': nothing is forced until the model writes it
    assert bytes(obj.forced([1], 30)) == b"{" and obj.forced([1, *b"{"], 30) == []
    assert bytes(obj.forced([1, *b'{"'], 30)) == b'name"'


# -- exactness on the byte double (batched logits equal single ones) -------------------------------
def _run(model, prompt, schema, params, seed, source=None, draft=4, max_tokens=200):
    c = constraint(model, schema)
    sampler = Sampler(params, seed, constraint=c)
    if source is not None:
        source = GrammarDrafts(source, c)
    return generate(model, prompt, max_tokens, source=source, draft=draft, sampler=sampler)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, params=st.sampled_from(PARAMS), seed=st.integers(0, 1000),
       window=st.integers(1, 2), draft=st.integers(1, 8), p_right=st.sampled_from([0.0, 0.6, 0.95]),
       prompt=st.binary(min_size=1, max_size=12))
def test_speculation_with_grammar_drafts_changes_nothing(schema, params, seed, window, draft, p_right,
                                                         prompt):
    model = ByteModel(window=window, seed=seed)
    ids = list(prompt)
    plain = _run(model, ids, schema, params, seed)
    for source in (ScriptedDrafts(model, plain.tokens, len(ids), seed, p_right),
                   RandomDrafts(model, seed, p_right), Fixed(),
                   AutoDrafter([NgramSource(min_match=1)], [1.0 + 0.05 * i for i in range(9)])):
        spec = _run(model, ids, schema, params, seed, source=source, draft=draft)
        assert spec.tokens == plain.tokens
        assert spec.stopped_by == plain.stopped_by
        assert 0 <= spec.counters.grammar_tokens <= spec.counters.accepted_tokens


def test_forced_tokens_are_accepted_and_counted():
    model = ByteModel(window=1)
    schema = NAME_OK
    plain = _run(model, [1, 2, 3], schema, SamplingParams(), 0)
    assert bytes(plain.tokens[:-1]) == NAME_OK_TEXT
    spec = _run(model, [1, 2, 3], schema, SamplingParams(), 0, source=Fixed(), draft=8)
    assert spec.tokens == plain.tokens
    c = spec.counters
    # forced after the model's choices of whitespace and text: '"name"', ':', '"', '"' (maxLength 8
    # reached), ',', '"ok"', ':', 'rue', '}': 19 bytes, all accepted, each saving a decode
    assert c.grammar_tokens == c.accepted_tokens == c.drafted_tokens == 19
    assert len(plain.tokens) == 37 and c.decodes == 37 - 1 - 19
    assert c.as_dict()["grammar_share"] == round(19 / 37, 6)
    assert c.report_lines()[-1] == "fixed: 19 of 37 tokens came from grammar drafts (51.4%)"


def test_metrics_count_grammar_tokens():
    m = Metrics(lambda: 0, lambda: 0)
    m.finished(Counters(grammar_tokens=7, generated_tokens=20), "stop")
    text = m.render().decode()
    assert "promptlookup:spec_decode_num_grammar_tokens_total 7.0" in text


@pytest.mark.parametrize("value", ["yes", 1])
def test_grammar_drafts_option_is_checked(value):
    from promptlookup.errors import RequestError
    from promptlookup.options import RequestOptions

    with pytest.raises(RequestError, match="grammar_drafts must be true or false") as err:
        RequestOptions(grammar_drafts=value)
    assert err.value.param == "grammar_drafts"


def test_engine_drafts_from_the_grammar_unless_told_not_to():
    from promptlookup.api import Engine

    model = ByteModel(window=1)
    schema = {"type": "object", "properties": {"colour": {"enum": ["crimson", "cyan"]}},
              "required": ["colour"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    engine = Engine.from_backend(model, speculate="ngram")
    on = engine.generate("pick", max_tokens=60, temperature=0, response_format=fmt)
    off = engine.generate("pick", max_tokens=60, temperature=0, response_format=fmt, grammar_drafts=False)
    plain = engine.generate("pick", max_tokens=60, temperature=0, response_format=fmt, speculate="off")
    assert on.tokens == off.tokens == plain.tokens
    assert on.counters.grammar_tokens > 0 == off.counters.grammar_tokens == plain.counters.grammar_tokens
    quiet = Engine.from_backend(model, speculate="ngram", grammar_drafts=False)
    assert quiet.generate("pick", max_tokens=60, temperature=0,
                          response_format=fmt).counters.grammar_tokens == 0
    assert quiet.generate("pick", max_tokens=60, temperature=0, response_format=fmt,
                          grammar_drafts=True).counters.grammar_tokens == on.counters.grammar_tokens
