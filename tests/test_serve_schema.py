"""schemathesis against the server's own OpenAPI schema: a bounded run of positive (schema-valid) and
negative (schema-breaking) requests per operation finds no 5xx, no undocumented status or content
type, no response that breaks the schema, and no schema-breaking request accepted.

Bounded: a few dozen examples per operation and mode, generation only (no shrinking, no stored
examples), and ``max_tokens`` of a valid request held to at most 4 (the schema allows up to the
context, which would make each example a long generation).
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import checks  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

pytestmark = pytest.mark.model

EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 20}
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance", "negative_data_rejection"]
MAX_TOKENS_LIMIT = 1 << 20


def _small(body, positive: bool):
    """A valid max_tokens (or none) becomes at most 4; an invalid one is left as generated. A valid
    request also gets the settings the server refuses although the schema allows them (random
    ``speculate`` strings, ``n`` other than 1, ...) put right, so that most reach the model, and its
    prompt cut short (the cuts keep it valid: no field has a minimum length above 1)."""
    if not isinstance(body, dict):
        return
    if positive:  # short prompts too: a random 1000-token prompt is seconds of prefill per example
        body.pop("speculate", None)
        body.pop("corpora", None)  # random names are 400s (this server has none loaded)
        for m in body.get("messages") or ():
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                m["content"] = m["content"][:100]
            elif isinstance(m, dict) and isinstance(m.get("content"), list):
                m["content"] = m["content"][:4]
                for part in m["content"]:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part["text"] = part["text"][:50]
        if isinstance(body.get("messages"), list):
            body["messages"] = body["messages"][:8]
        if isinstance(body.get("prompt"), str | list):
            body["prompt"] = body["prompt"][:100]
        for key, ok in (("n", 1), ("best_of", 1), ("echo", False), ("suffix", None)):
            if key in body:
                body[key] = ok
        if body.get("top_logprobs") is not None:
            body["logprobs"] = True
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and 4 < v <= MAX_TOKENS_LIMIT \
                and float(v).is_integer():
            body[key] = 4
    if "max_tokens" not in body:
        body["max_tokens"] = 4


def test_schemathesis_finds_no_5xx_and_no_schema_violation(llama_server):
    url = llama_server.url
    operations = _operations(url)
    labels = {op.label for op in operations}
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "GET /health",
            "GET /metrics"} <= labels
    assert _fuzz(url, operations) >= 60
    import httpx

    assert httpx.get(url + "/health", timeout=30).status_code == 200


def test_schemathesis_on_a_tool_template_finds_no_5xx(tool_server):
    """The chat route again, on a model whose template supports tools: random tools, tool_choice,
    tool calls and tool results reach the template, the grammar and the parser."""
    url = tool_server.url
    chat = [op for op in _operations(url) if op.label == "POST /v1/chat/completions"]
    assert len(chat) == 1
    assert _fuzz(url, chat) == 40


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _fuzz(url: str, operations: list) -> int:
    """Run the bounded positive and negative examples of ``operations``; the number of calls made."""
    chosen = [getattr(checks, name) for name in CHECKS]
    calls = {"n": 0}

    def fuzz(op, mode, n: int) -> None:
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def run(case):
            _small(case.body, mode is GenerationMode.POSITIVE)
            calls["n"] += 1
            case.call_and_validate(base_url=url, checks=chosen, timeout=120)

        run()

    for op in operations:
        for mode, n in EXAMPLES.items():
            if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
                continue  # no parameters to break
            fuzz(op, mode, n)
    return calls["n"]
