"""Grammar drafts on the bundled model (llama.cpp, the invariant build: a verify's rows equal single
decodes, so speculative == plain token for token): random small schemas, greedy and seeded, and
forced tool calls alone and decoded together (continuous batching)."""

from __future__ import annotations

import threading

import pytest
from conftest import requires_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import TOOLS
from test_grammar import schemas

pytestmark = [pytest.mark.model, requires_model]

PROMPTS = ["What is the weather in Paris?", "Open src/app.py at line 12."]


@pytest.fixture(scope="module")
def engine(real_backend):
    from promptlookup.api import Engine

    return Engine.from_backend(real_backend, speculate="auto")  # the session's backend: never closed here


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(schema=schemas, sampled=st.booleans(), seed=st.integers(0, 1000))
def test_random_schemas_speculated_with_grammar_drafts_equal_plain(engine, schema, sampled, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    messages = [{"role": "user", "content": "Answer in JSON."}]
    fields = {"temperature": 0.8, "seed": seed} if sampled else {"temperature": 0}
    plain = engine.chat(messages, max_tokens=40, response_format=fmt, speculate="off", **fields)
    for spec in ("auto", "ngram"):
        got = engine.chat(messages, max_tokens=40, response_format=fmt, speculate=spec, **fields)
        assert got.tokens == plain.tokens, spec
        assert got.counters.grammar_tokens <= got.counters.accepted_tokens


@pytest.fixture(scope="module")
def tool_engines():
    from tool_gguf import hermes_gguf

    from promptlookup.api import Engine

    path = hermes_gguf()
    together = Engine(path, threads=1, n_ctx=1024, parallel=2, speculate="auto")
    alone = Engine(path, threads=1, n_ctx=1024, parallel=1, speculate="auto")
    yield together, alone
    together.close()
    alone.close()


def _call(engine, prompt, choice, **fields):
    return engine.chat([{"role": "user", "content": prompt}], max_tokens=60, tools=TOOLS, tool_choice=choice,
                       **fields)


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"temperature": 0.8, "seed": 5}],
                         ids=["greedy", "seeded"])
def test_forced_tool_calls_with_grammar_drafts_alone_and_together_equal_plain(tool_engines, fields):
    batch, single = tool_engines
    choices = ["required", {"type": "function", "function": {"name": "get_weather"}}]
    cases = [(p, c) for p in PROMPTS for c in choices]
    plain = [_call(single, p, c, speculate="off", **fields) for p, c in cases]
    alone = [_call(single, p, c, **fields) for p, c in cases]
    out: list = [None] * len(cases)

    def work(i: int) -> None:
        out[i] = _call(batch, *cases[i], **fields)

    for lo in range(0, len(cases), 2):  # two at a time: the batch's two slots decode them together
        threads = [threading.Thread(target=work, args=(i,)) for i in range(lo, min(lo + 2, len(cases)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert [c.tokens for c in alone] == [c.tokens for c in plain]
    assert [c.tokens for c in out] == [c.tokens for c in plain]
    assert all(c.finish_reason == "tool_calls" for c in plain)
    # the wrapper and the named function are forced: grammar drafts carried part of the calls (auto
    # decides by measured time, so not necessarily on every call: it takes plain steps early)
    assert sum(c.counters.grammar_tokens for c in alone + out) > 0
