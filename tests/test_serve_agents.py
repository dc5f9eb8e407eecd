"""Structured output through the official ``openai`` client on a real server (the session's shared
one, conftest ``llama_server``), and what the server refuses by name instead of ignoring (tools on a
template without tool support; tool calling itself is tests/test_serve_tools.py)."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
TOOL_SCHEMA = {  # a typical tool call's arguments
    "type": "object",
    "properties": {"name": {"type": "string", "enum": ["read_file", "edit_file", "run_tests"]},
                   "arguments": {"type": "object",
                                 "properties": {"path": {"type": "string", "maxLength": 60},
                                                "line": {"type": "integer", "minimum": 1}},
                                 "required": ["path"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
SCHEMAS = [
    TOOL_SCHEMA,
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                      "population": {"type": "integer"},
                                      "famous_for": {"type": "array", "maxItems": 3,
                                                     "items": {"type": "string", "maxLength": 30}}},
     "required": ["city", "population", "famous_for"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "score": {"type": "integer", "minimum": 0, "maximum": 10}},
     "required": ["ok", "score"], "additionalProperties": False},
]
PROMPTS = ["Open the file src/app.py at line 12 with a tool call, as JSON.",
           "Describe Paris as JSON.", "List some colours as a JSON array.",
           "Is the sky blue? Answer in JSON."]


@pytest.fixture(scope="module")
def client(llama_server):
    with openai.OpenAI(base_url=llama_server.url + "/v1", api_key="unused", timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(llama_server):
    with httpx.Client(base_url=llama_server.url, timeout=120) as c:
        yield c


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_every_answer_parses_and_validates(client, i):
    schema = SCHEMAS[i]
    for speculate, temperature in (("off", 0), ("ngram", 0), ("auto", 0.8)):
        r = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=160,
            temperature=temperature, seed=7, response_format=_fmt(schema),
            extra_body={"speculate": speculate})
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert jsonschema_rs.validator_for(schema).is_valid(json.loads(choice.message.content))


def test_greedy_structured_output_is_the_same_with_and_without_speculation(client):
    texts = {client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=160, temperature=0,
        response_format=_fmt(TOOL_SCHEMA), extra_body={"speculate": s}).choices[0].message.content
        for s in ("off", "ngram", "suffix")}
    assert len(texts) == 1  # llama.cpp's batched logits may differ in the last bits; not on this prompt


def test_json_object_streamed(client):
    stream = client.chat.completions.create(
        model="smol", messages=[{"role": "user",
                                 "content": "Give me a JSON object with the name and age of a cat."}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"}, stream=True)
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert isinstance(json.loads(text), dict)


def test_logit_bias_bans_a_token(client, http):
    plain = http.post(CHAT, json={"messages": USER, "max_tokens": 4, "temperature": 0,
                                  "return_token_ids": True}).json()
    first = plain["choices"][0]["token_ids"][0]
    banned = http.post(CHAT, json={"messages": USER, "max_tokens": 4, "temperature": 0,
                                   "return_token_ids": True, "logit_bias": {str(first): -100}}).json()
    assert banned["choices"][0]["token_ids"][0] != first
    r = client.chat.completions.create(model="smol", messages=USER, max_tokens=3, temperature=0,
                                       logit_bias={"28": 100})  # "," forced
    assert r.choices[0].message.content == ",,,"


@pytest.mark.parametrize(("extra", "param", "words"), [
    # SmolLM2's template never mentions tools: it cannot show them, so tools are refused by name
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools",
     "no tool support"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"functions": [{"name": "f"}]}, "functions", "legacy"),
    ({"function_call": {"name": "f"}}, "function_call", '"none" or absent'),
    ({"messages": [*USER, {"role": "assistant", "content": None,
                           "tool_calls": [{"id": "1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "1", "content": "done"}]}, "messages.1.tool_calls",
     "no tool support"),
    ({"messages": [*USER, {"role": "tool", "tool_call_id": "1", "content": "done"}]}, "messages.1.role",
     "no tool support"),
    ({"response_format": {"type": "xml"}}, "response_format", "does not match"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "Field required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
     "response_format", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
     "response_format.json_schema.schema", ""),
    ({"logit_bias": {"x": 1}}, "logit_bias", "token id"),
    ({"logit_bias": {"1": 500}}, "logit_bias.1", "less than or equal to 100"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "outside the vocabulary"),
])
def test_unsupported_or_bad_agent_fields_are_400s_naming_the_field(http, extra, param, words):
    r = http.post(CHAT, json={"messages": USER, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert words in err["message"]


def test_tool_choice_none_without_tools_is_plain_chat(http):
    r = http.post(CHAT, json={"messages": USER, "max_tokens": 3, "temperature": 0, "tool_choice": "none",
                              "tools": []})
    assert r.status_code == 200, r.text
