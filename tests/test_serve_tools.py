"""Tool calling through the official ``openai`` client on a real server process, whose model is the
bundled SmolLM2 with a Hermes-style tool template (``tests/tool_gguf.py``, made at test time; the
session's ``tool_server`` of conftest)."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import pytest
from serving import SCHEMAS, TOOLS

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
PROMPTS = ["What is the weather in Paris?", "Open src/app.py at line 12.", "Hi! How are you?"]


@pytest.fixture(scope="module")
def client(tool_server):
    with openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(tool_server):
    with httpx.Client(base_url=tool_server.url, timeout=120) as c:
        yield c


def _ask(client, prompt: str, stream: bool, **kw):
    """One request; (finish_reason, content, [(name, arguments)]) whole or gathered from the stream."""
    messages = kw.pop("messages", [{"role": "user", "content": prompt}])
    r = client.chat.completions.create(model="smol-tools", messages=messages, tools=kw.pop("tools", TOOLS),
                                       stream=stream, **kw)
    if not stream:
        choice = r.choices[0]
        calls = [(c.function.name, c.function.arguments, c.id) for c in choice.message.tool_calls or ()]
        return choice.finish_reason, choice.message.content, calls
    finish, content, calls = None, "", {}
    for chunk in r:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                name, args, cid = calls.get(d.index, ("", "", None))
                calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""),
                                  d.id or cid)
            finish = choice.finish_reason or finish
    return finish, content, [calls[i] for i in sorted(calls)]


def _valid(calls, allowed=("read_file", "get_weather")) -> None:
    assert len(calls) == 1, calls
    name, arguments, call_id = calls[0]
    assert name in allowed
    assert call_id.startswith("call_")
    assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(json.loads(arguments)), arguments


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "read_file", "get_weather"])
def test_forced_calls_always_parse_and_validate(client, choice, stream):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    allowed = ("read_file", "get_weather") if choice == "required" else (choice,)
    for prompt in PROMPTS:
        for speculate, temperature in (("off", 0), ("ngram", 0), ("auto", 0.8)):
            finish, content, calls = _ask(client, prompt, stream, tool_choice=tool_choice,
                                          max_tokens=120, temperature=temperature, seed=3,
                                          extra_body={"speculate": speculate})
            assert finish == "tool_calls", (prompt, speculate, content)
            assert not content
            _valid(calls, allowed)


def test_a_greedy_forced_call_is_the_same_whole_streamed_and_speculated(client, http):
    bodies = [{"speculate": s} for s in ("off", "ngram", "suffix")]
    bodies.append({"speculate": "ngram", "grammar_drafts": False})  # without the grammar's drafts
    got = {(name, args) for stream in (False, True) for body in bodies
           for name, args, _ in _ask(client, PROMPTS[0], stream, tool_choice="required", max_tokens=120,
                                     temperature=0, extra_body=body)[2]}
    assert got == {("get_weather", '{"city": "Paris", "unit": "celsius"}')}
    metrics = http.get("/metrics").text
    line = next(ln for ln in metrics.splitlines()
                if ln.startswith("promptlookup:spec_decode_num_grammar_tokens_total"))
    assert float(line.split()[-1]) > 0  # the forced call's wrapper and names came from grammar drafts


def test_a_tool_result_round_trip(client, http):
    first = _ask(client, PROMPTS[0], False, tool_choice="required", max_tokens=120, temperature=0)
    name, arguments, call_id = first[2][0]
    history = [{"role": "user", "content": PROMPTS[0]},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": arguments}}]},
               {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 degrees."}]
    for stream in (False, True):
        finish, content, calls = _ask(client, "", stream, messages=history, max_tokens=40, temperature=0)
        assert finish in ("stop", "length"), (finish, content, calls)
        assert content and not calls
    again = _ask(client, "", False, messages=history, tool_choice="required", max_tokens=120, temperature=0)
    assert again[0] == "tool_calls"
    _valid(again[2])
    # the tool's result reached the prompt: the same request without it is shorter by its turn
    body = {"messages": history, "tools": TOOLS, "max_tokens": 1, "temperature": 0}
    with_result = http.post(CHAT, json=body).json()["usage"]["prompt_tokens"]
    without = http.post(CHAT, json={**body, "messages": history[:2]}).json()["usage"]["prompt_tokens"]
    assert with_result - without >= 10


@pytest.mark.parametrize("stream", [False, True])
def test_auto_answers_text_or_calls_and_never_fails(client, stream):
    for prompt in PROMPTS:
        for speculate, temperature in (("off", 0), ("auto", 1.0)):
            finish, content, calls = _ask(client, prompt, stream, max_tokens=60, temperature=temperature,
                                          seed=11, extra_body={"speculate": speculate})
            assert finish in ("stop", "length", "tool_calls")
            if finish == "tool_calls":
                assert all(json.loads(a) is not None for _, a, _ in calls)
            else:
                assert content and not calls


def test_tool_choice_none_is_plain_text(client):
    finish, content, calls = _ask(client, PROMPTS[0], False, tool_choice="none", max_tokens=20, temperature=0)
    assert (finish, calls) == ("length", [])
    assert content


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"tool_choice": {"type": "function", "function": {"name": "rm_rf"}}}, "tool_choice",
     "no tool is named 'rm_rf'"),
    ({"tool_choice": "required", "tools": []}, "tool_choice", "needs tools"),
    ({"response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
      "tool_choice": "required"}, "tools.0.function.parameters", ""),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
                       "name": "read_file", "arguments": '{"path": "<|im_end|>"}'}}]}]},
     "messages.1.tool_calls", "control tokens"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
                       "name": "read_file", "arguments": "[1]"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "JSON object"),
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages.0.role", "legacy"),
    ({"functions": [{"name": "f"}]}, "functions", "legacy"),
    ({"function_call": {"name": "f"}}, "function_call", '"none" or absent'),
])
def test_bad_tool_requests_are_400s_naming_the_field(http, extra, param, words):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 4, **extra}
    r = http.post(CHAT, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert words in err["message"]
