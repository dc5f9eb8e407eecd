"""``promptlookup serve`` through the official ``openai`` client, on a real server process.

Chat (plain and streamed), completions, stop strings (one spanning tokens), seed reproducibility,
usage numbers and llama-server's ``timings``; temperature 0 through the server equals ``promptlookup
generate --json`` with the same settings. The server is the session's shared one (conftest
``llama_server``: bundled model, one thread, 1024-token context).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from serving import server_env

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.model

TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second",
           "draft_n", "draft_n_accepted"}
COPY = ("Repeat this line exactly, then stop: the quick brown fox jumps over the lazy dog; "
        "the quick brown fox jumps over the lazy dog.")


@pytest.fixture(scope="module")
def client(llama_server):
    with openai.OpenAI(base_url=llama_server.url + "/v1", api_key="unused", timeout=120, max_retries=0) as c:
        yield c


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_alias(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smol"]


def test_chat_plain_usage_and_timings(client):
    r = client.chat.completions.create(model="smol", messages=_user(COPY), max_tokens=24, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "smol"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert 0 < u.completion_tokens <= 24 and u.prompt_tokens > 20
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    extra = r.model_extra
    timings = extra["timings"]
    assert set(timings) >= TIMINGS
    assert timings["prompt_n"] + timings["cache_n"] == u.prompt_tokens
    assert timings["predicted_n"] >= u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens == timings["cache_n"]
    c = extra["counters"]
    assert {"drafted_steps", "decodes", "source_choices", "accepted_tokens", "stopped_by"} <= set(c)
    assert c["accepted_tokens"] == timings["draft_n_accepted"] <= c["drafted_tokens"] == timings["draft_n"]


def test_chat_stream_equals_plain_and_reports_usage(client):
    kw = dict(model="smol", messages=_user(COPY), max_tokens=24, temperature=0,
              extra_body={"speculate": "off"})
    plain = client.chat.completions.create(**kw)
    pieces, finish, usage, last = [], None, None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.choices:
            d = chunk.choices[0]
            pieces.append(d.delta.content or "")
            finish = d.finish_reason or finish
            if d.finish_reason:
                last = chunk
        elif chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == plain.choices[0].message.content
    assert finish == plain.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
    assert set(last.model_extra["timings"]) >= TIMINGS


def test_follow_up_reuses_the_prefix(client):
    """A conversation re-sent with one more turn decodes only what is new (``cache_n``)."""
    first = _user("Name three colours.")
    r1 = client.chat.completions.create(model="smol", messages=first, max_tokens=12, temperature=0)
    turn2 = [*first, {"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And three animals?"}]
    r2 = client.chat.completions.create(model="smol", messages=turn2, max_tokens=4, temperature=0)
    assert r2.model_extra["timings"]["cache_n"] >= r1.usage.prompt_tokens - 1
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.model_extra["timings"]["cache_n"]


def test_completions_and_logprobs(client):
    r = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6,
                                  temperature=0, logprobs=2)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert all(len(t) <= 2 for t in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    # greedy: each chosen token is the most likely one
    pairs = zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    assert all(abs(max(t.values()) - x) < 1e-6 for t, x in pairs)


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=_user("Say yes."), max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(x.top_logprobs) == 3 and x.logprob <= 0 for x in content)


def test_stop_strings_including_one_spanning_tokens(client):
    kw = dict(model="smol", prompt="Count: one, two, three, four, five, six, seven,", max_tokens=24,
              temperature=0, extra_body={"speculate": "off"})
    free = client.completions.create(logprobs=0, **kw).choices[0]
    text, lp = free.text, free.logprobs
    # a stop string made of the end of one token and the start of the next
    at = next(i for i in range(1, len(lp.tokens)) if len(lp.tokens[i]) >= 2 and lp.text_offset[i] > 4)
    boundary = lp.text_offset[at]
    stop = text[boundary - 1: boundary + 2]  # e.g. ", n": the comma token and the start of " nine"
    r = client.completions.create(stop=[stop, "\u2603never"], **kw).choices[0]
    assert r.finish_reason == "stop"
    assert r.text == text[: text.find(stop)]
    # the same stop with drafting on a copy prompt: the stop string may sit inside an accepted draft
    kw = dict(model="smol", messages=_user(COPY), max_tokens=32, temperature=0,
              extra_body={"speculate": "ngram"})
    copy = client.chat.completions.create(**kw)
    c_text = copy.choices[0].message.content
    assert copy.model_extra["counters"]["accepted_tokens"] > 0 and len(c_text) > 30, c_text
    stop2 = c_text[len(c_text) // 2: len(c_text) // 2 + 4]
    r2 = client.chat.completions.create(stop=stop2, **kw).choices[0]
    assert r2.message.content == c_text[: c_text.find(stop2)] and r2.finish_reason == "stop"
    # a plain string stop, through chat
    s = client.chat.completions.create(model="smol", messages=_user(COPY), max_tokens=24, temperature=0,
                                       stop="fox")
    assert "fox" not in s.choices[0].message.content and s.choices[0].finish_reason == "stop"


def test_seed_repeats_a_sampled_run(client):
    """The same seed repeats a sampled run. On llama.cpp that holds where the verify batches are the
    same too (batched logits differ slightly from single-token ones): so the same cached prefix (a
    warm-up request first) and drafts that depend on the request alone (``ngram``; a shared history's
    drafts change from one request to the next)."""
    kw = dict(model="smol", messages=_user("Write a word."), max_tokens=12, temperature=1.0, top_p=0.9,
              extra_body={"speculate": "ngram"})
    client.chat.completions.create(seed=1, **kw)  # warm-up: the prompt's prefix is cached from here on
    a = client.chat.completions.create(seed=1234, **kw)
    b = client.chat.completions.create(seed=1234, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.model_extra["seed"] == 1234
    # without a seed the response names the one it used, and that seed repeats the run
    c = client.chat.completions.create(**kw)
    d = client.chat.completions.create(seed=c.model_extra["seed"], **kw)
    assert c.choices[0].message.content == d.choices[0].message.content


def test_n_other_than_one_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=_user("hi"), n=2, max_tokens=2)
    assert e.value.status_code == 400 and "n must be 1" in e.value.message


def test_temperature_zero_equals_generate_json(client):
    """The server's greedy tokens are ``promptlookup generate --json``'s with the same settings (plain
    decoding and --ngram: deterministic drafts, so the same verify batches)."""
    prompt = "Write one sentence about a red kite."
    for cli_flag, speculate in (([], "off"), (["--ngram"], "ngram")):
        proc = subprocess.run([sys.executable, "-m", "promptlookup", "generate", "--chat", "-p", prompt,
                               "-n", "20", "-t", "1", "-c", "1024", "--json", *cli_flag],
                              capture_output=True, text=True, timeout=120, env=server_env())
        assert proc.returncode == 0, proc.stderr
        cli = json.loads(proc.stdout)
        r = client.chat.completions.create(model="smol", messages=_user(prompt), max_tokens=20, temperature=0,
                                           extra_body={"speculate": speculate, "return_token_ids": True})
        assert r.choices[0].model_extra["token_ids"] == cli["tokens"], speculate
        assert r.choices[0].message.content == cli["text"]
