"""Tool calling on a real tool-trained model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), through the official
``openai`` client on a real server process; skipped where the model is not installed
(``promptlookup models pull qwen2.5-coder-0.5b``).

What the model does, greedy, on these prompts (docs/agents.md): under ``tool_choice: "auto"`` it
answers a weather question with a fenced ```json block and a file request with a bare JSON object,
never in its template's ``<tool_call>`` tags; forced, it writes the ``<tool_call>`` special token
(id 151657) that the grammar asks for. Both come back as ``tool_calls``."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from conftest import installed_model_path
from serving import SCHEMAS, TOOLS

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

WEATHER_Q, FILE_Q, HELLO = "What is the weather in Paris?", "Open src/app.py at line 12.", "Hi! How are you?"


@pytest.fixture(scope="module")
def client():
    from serving import ServerProcess

    path = installed_model_path("qwen2.5-coder-0.5b")
    with ServerProcess("-m", str(path), "--model-alias", "qwen", "--max-queue", "8", ctx=2048) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0) as c:
        yield c


def _ask(client, prompt: str, stream: bool, **kw):
    """(finish_reason, content, [(name, arguments)], token ids) of one greedy request."""
    r = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": prompt}],
                                       tools=TOOLS, stream=stream, max_tokens=kw.pop("max_tokens", 80),
                                       temperature=kw.pop("temperature", 0), **kw)
    if not stream:
        choice = r.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
        return choice.finish_reason, choice.message.content, calls, getattr(choice, "token_ids", None)
    finish, content, calls = None, "", {}
    for chunk in r:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                name, args = calls.get(d.index, ("", ""))
                calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
            finish = choice.finish_reason or finish
    return finish, content or None, [calls[i] for i in sorted(calls)], None


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_the_calls_the_model_writes_as_json(client, stream):
    assert _ask(client, WEATHER_Q, stream)[:3] == (
        "tool_calls", None, [("get_weather", '{"city": "Paris", "unit": "celsius"}')])  # a fenced block
    assert _ask(client, FILE_Q, stream)[:3] == (
        "tool_calls", None, [("read_file", '{"path": "src/app.py", "line": 12}')])  # a bare object
    finish, content, calls, _ = _ask(client, HELLO, stream)
    assert (finish, calls) == ("stop", [])
    assert content.startswith("Hello! I'm just a computer program")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "read_file", "get_weather"])
def test_a_forced_call_always_validates(client, choice, stream):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    for prompt in (WEATHER_Q, HELLO):
        for temperature in (0, 0.8):
            finish, content, calls, _ = _ask(client, prompt, stream, tool_choice=tool_choice, seed=5,
                                             temperature=temperature, extra_body={"speculate": "auto"})
            assert (finish, content, len(calls)) == ("tool_calls", None, 1), (prompt, content)
            name, arguments = calls[0]
            assert name == choice or choice == "required" and name in SCHEMAS
            assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(json.loads(arguments)), arguments


def test_a_forced_call_is_the_same_token_for_token_speculated_or_not(client):
    got = {}
    for speculate in ("off", "auto", "ngram"):
        for prompt in (WEATHER_Q, FILE_Q):
            got[speculate, prompt] = _ask(client, prompt, False, tool_choice="required", extra_body={
                "speculate": speculate, "return_token_ids": True})
    for prompt in (WEATHER_Q, FILE_Q):
        off = got["off", prompt]
        assert off[3][:2] == [151657, 198] and off[3][-3:] == [198, 151658, 151645]  # tags, then <|im_end|>
        assert got["auto", prompt] == got["ngram", prompt] == off
    assert got["off", WEATHER_Q][2] == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    seeded = [_ask(client, HELLO, False, tool_choice="required", temperature=0.8, seed=7,
                   extra_body={"speculate": speculate, "return_token_ids": True})
              for speculate in ("off", "auto")]
    assert seeded[0] == seeded[1] and seeded[0][0] == "tool_calls"
