"""Structured output (response_format) and logit_bias: the mask inside the sampler, exact under
speculation, on the byte test double (batched logits equal single ones, so speculative == plain)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import jsonschema_rs
import numpy as np
import pytest
from fakes import ByteModel, RandomDrafts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup.api import Engine
from promptlookup.drafting.base import Draft
from promptlookup.errors import RequestError
from promptlookup.grammar import Constraint, Grammar, grammar_tokenizer, parse_response_format
from promptlookup.options import RequestOptions
from promptlookup.sampling import Sampler, SamplingParams, reference_sample
from promptlookup.speculate import generate

_TOKENIZERS: dict[int, object] = {}


def tokenizer(model: ByteModel):
    """One llguidance tokenizer for the byte vocabulary (the same for every ByteModel)."""
    if 0 not in _TOKENIZERS:
        _TOKENIZERS[0] = grammar_tokenizer(model)
    return _TOKENIZERS[0]


def constraint(model: ByteModel, schema) -> Constraint:
    return Constraint(tokenizer(model), Grammar.json_schema(schema), [ByteModel.EOS])


class ScriptedDrafts(RandomDrafts):
    """Drafts the tokens of a known output (a plain run's), each one corrupted with probability
    ``1 - p_right``: long accepted runs through the grammar, and forbidden tokens in the middle."""

    name = "scripted"

    def __init__(self, model, expected: Sequence[int], n_prompt: int, seed: int, p_right: float) -> None:
        super().__init__(model, seed, p_right)
        self.expected = list(expected)
        self.n_prompt = n_prompt

    def propose(self, k):
        at = len(self.seq) - self.n_prompt
        out = []
        for t in self.expected[at : at + self.rng.randint(0, k)]:
            out.append(t if self.rng.random() < self.p_right else self.rng.randrange(self.model.n_vocab))
        return Draft(tuple(out), self.name)


# -- small random schemas ----------------------------------------------------------------------------
_names = st.text("abcdefgh", min_size=1, max_size=4)
_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, w: {"type": "integer", "minimum": lo, "maximum": lo + w},
              st.integers(-50, 50), st.integers(0, 200)),
    st.builds(lambda vs: {"enum": vs}, st.lists(_names, min_size=1, max_size=3, unique=True)),
)


def _object(children):
    return st.builds(
        lambda props, n_req: {"type": "object", "properties": props, "required": sorted(props)[:n_req],
                              "additionalProperties": False},
        st.dictionaries(_names, children, min_size=1, max_size=3), st.integers(0, 3))


def _array(children):
    return st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, children,
                     st.integers(0, 3))


schemas = st.recursive(_leaf, lambda ch: st.one_of(_object(ch), _array(ch)), max_leaves=6)
PARAMS = [SamplingParams(), SamplingParams(temp=0.9, top_k=0, top_p=1.0, min_p=0.0),
          SamplingParams(temp=0.7, top_k=5, top_p=0.9, min_p=0.05, repeat_penalty=1.3)]


def _run(model, prompt, schema, params, seed, source=None, draft=4, max_tokens=300):
    sampler = Sampler(params, seed, constraint=constraint(model, schema))
    return generate(model, prompt, max_tokens, source=source, draft=draft, sampler=sampler)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, params=st.sampled_from(PARAMS), seed=st.integers(0, 1000),
       window=st.integers(1, 2), draft=st.integers(1, 6), p_right=st.sampled_from([0.0, 0.6, 0.95]),
       prompt=st.binary(min_size=1, max_size=12))
def test_constrained_output_is_valid_and_speculation_changes_nothing(schema, params, seed, window, draft,
                                                                     p_right, prompt):
    model = ByteModel(window=window, seed=seed)
    ids = list(prompt)
    plain = _run(model, ids, schema, params, seed)
    if plain.stopped_by == "eos":
        text = bytes(t for t in plain.tokens[:-1]).decode("utf-8")
        assert jsonschema_rs.validator_for(schema).is_valid(json.loads(text)), text
    for source in (ScriptedDrafts(model, plain.tokens, len(ids), seed, p_right),
                   RandomDrafts(model, seed, p_right)):
        spec = _run(model, ids, schema, params, seed, source=source, draft=draft)
        assert spec.tokens == plain.tokens
        assert spec.stopped_by == plain.stopped_by


#: a small closed object, and what the window-1 byte model writes under it from [1, 2, 3] (greedy)
NAME_OK = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                            "ok": {"type": "boolean"}},
           "required": ["name", "ok"], "additionalProperties": False}
NAME_OK_TEXT = b'{ "name" : "stfnreee" , "ok" :true }'


def test_scripted_drafts_are_accepted_through_the_grammar():
    model = ByteModel(window=1)
    schema = NAME_OK
    plain = _run(model, [1, 2, 3], schema, SamplingParams(), 0)
    assert bytes(plain.tokens[:-1]) == NAME_OK_TEXT
    spec = _run(model, [1, 2, 3], schema, SamplingParams(), 0,
                source=ScriptedDrafts(model, plain.tokens, 3, 0, 1.0), draft=8)
    assert spec.tokens == plain.tokens
    assert spec.counters.accepted_tokens == spec.counters.drafted_tokens > 20  # rolls forward, no mask miss


def test_a_forbidden_draft_is_rejected_like_any_mismatch():
    model = ByteModel(window=1)
    schema = {"enum": ["abc"]}
    sampler = Sampler(SamplingParams(), 0, constraint=constraint(model, schema))
    model.prefill([1], sampler)
    sampler.reset(1)
    # '"' then 'x' (forbidden: the grammar wants 'a'): the choice after '"' is 'a', and the row stops there
    chosen = model.verify([ord('"'), ord("x"), ord("c")], sampler)
    assert chosen == [ord("a")]
    model.rollback(2)
    assert model.verify([ord("a"), ord("b"), ord("c")], sampler) == [ord("b"), ord("c"), ord('"')]


def test_the_grammar_state_follows_rollbacks():
    model = ByteModel(window=1)
    c = constraint(model, {"enum": ["ab", "xy"]})
    c.reset(2)
    toks = [9, 9, ord('"'), ord("a")]
    assert c.sync(toks, 4) and c.allows(ord("b")) and not c.allows(ord("y"))
    toks = [9, 9, ord('"'), ord("x")]  # rolled back one and took the other branch
    assert c.sync(toks, 4) and c.allows(ord("y")) and not c.allows(ord("b"))
    assert c.sync(toks, 3) and c.allows(ord("a")) and c.allows(ord("x")) and not c.allows(ord("b"))
    # past the grammar's end (a drafted end of generation) the row is unconstrained, never an error
    done = [9, 9, *b'"xy"', ByteModel.EOS, 5]
    assert c.sync(done, 7) and not c.sync(done, 8)
    assert c.sync(toks, 4) and c.allows(ord("y"))


@pytest.mark.parametrize("seed", range(6))
def test_masked_sampler_equals_the_reference(seed):
    rng = np.random.default_rng(seed)
    model = ByteModel(window=1)
    c = constraint(model, {"type": "object", "properties": {"k": {"type": "integer"}}})
    c.reset(0)
    tokens = list(b'{"k": 1')
    bias = {int(t): float(b) for t, b in zip(rng.integers(0, 256, 8), rng.uniform(-5, 5, 8), strict=True)}
    for params in [*PARAMS, SamplingParams(temp=1.2, top_k=3, top_p=1.0, min_p=0.0)]:
        sampler = Sampler(params, seed, logit_bias=bias, constraint=c)
        for pos in range(len(tokens) + 1):
            logits = (rng.standard_normal(model.n_vocab) * 3).astype(np.float32)
            c.sync(tokens, pos)
            allowed = c.allowed(model.n_vocab)
            got = sampler.sample(logits, tokens, pos)
            assert got == reference_sample(logits, tokens, pos, params, seed, bias, allowed)
            assert allowed[got]


def test_logit_bias_bans_and_forces_tokens():
    model = ByteModel(window=1)
    engine = Engine.from_backend(model, speculate="off")
    plain = engine.generate("ab", max_tokens=6, temperature=0).tokens
    banned = engine.generate("ab", max_tokens=6, temperature=0, logit_bias={str(plain[0]): -100}).tokens
    assert banned[0] != plain[0]
    forced = engine.generate("ab", max_tokens=3, temperature=0, logit_bias={ord(";"): 100}).tokens
    assert forced == [ord(";")] * 3
    with pytest.raises(RequestError, match="outside the vocabulary") as err:
        engine.generate("ab", max_tokens=3, logit_bias={100000: 1})
    assert err.value.param == "logit_bias"


@pytest.mark.parametrize("bias", [{"x": 1}, {1: 101}, {1: float("nan")}, {-1: 0}, {1: True}, [1, 2], 7])
def test_bad_logit_bias_is_refused(bias):
    with pytest.raises(RequestError) as err:
        RequestOptions(logit_bias=bias)
    assert err.value.param == "logit_bias"


@pytest.mark.parametrize("fmt, match", [
    ("json", "must be an object"),
    ({"type": "xml"}, "type must be"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": "{not json"}}, "not JSON"),
    ({"type": "json_schema", "json_schema": {"schema": []}}, "must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}}, "cannot be enforced|unknown|type"),
])
def test_bad_response_format_is_refused_by_name(fmt, match):
    with pytest.raises(RequestError, match=match) as err:
        RequestOptions(response_format=fmt)
    assert err.value.param == "response_format"


def test_text_format_is_free_text():
    assert parse_response_format({"type": "text"}) is None
    assert RequestOptions(response_format={"type": "text"}).response_format is None


def test_engine_chat_with_response_format_and_speculation():
    model = ByteModel(window=2)
    engine = Engine.from_backend(model, speculate="ngram")
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["ab", "cd"]},
                                                        "maxItems": 3}},
              "required": ["tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    messages = [{"role": "user", "content": "tags"}]
    out = [engine.chat(messages, max_tokens=200, temperature=0, response_format=fmt, speculate=s)
           for s in ("off", "ngram", "suffix")]
    assert {o.text for o in out} == {out[0].text}
    assert out[0].finish_reason == "stop"
    assert jsonschema_rs.validator_for(schema).is_valid(json.loads(out[0].text))
    obj = engine.chat(messages, max_tokens=200, temperature=0.8, seed=5,
                      response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.text), dict)
