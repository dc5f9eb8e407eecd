"""The fuzz suite that stays: every file format and text input, mutated (seeded, bounded), must end
in a clean error or a valid result; a crash, a traceback of another class or a hang fails the test.

``benchmarks/fuzz_formats.py`` runs the same generators for longer and counts outcomes.
"""

from __future__ import annotations

import collections

import pytest
from conftest import HAVE_MODEL
from fuzz_cases import (
    BINARY_MUTATIONS,
    FORMATS,
    JSON_MUTATIONS,
    TEXT_MUTATIONS,
    Bases,
    cases,
    chat_context,
    check,
)

SEED = 17
N_CASES = {"static": 140, "llamacpp": 140, "history": 140, "index": 140, "curve": 140, "gguf": 140,
           "text": 120}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Bases:
    return Bases(tmp_path_factory.mktemp("fuzzbase"), SEED)


@pytest.fixture(scope="module")
def text_ctx(request) -> dict:
    if not HAVE_MODEL:
        return {}
    from promptlookup.build.memo_tokenizer import MemoTokenizer

    vocab = request.getfixturevalue("vocab_tokenizer")
    ctx = {"vocab": vocab, "memo": MemoTokenizer(vocab)}
    ctx.update(chat_context(request.getfixturevalue("real_backend")))
    ctx["chat_budget"] = 60
    return ctx


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "text"])
def test_fuzz_file_format(fmt, bases, tmp_path):
    outcomes = collections.Counter()
    for kind, data in cases(fmt, bases, N_CASES[fmt], SEED):
        try:
            outcomes[kind, check(fmt, data, tmp_path, {})] += 1
        except Exception as exc:  # noqa: BLE001 - any other exception is the failure being looked for
            raise AssertionError(f"{fmt}/{kind}: {type(exc).__name__}: {exc} on {data[:80]!r}") from exc
    kinds = JSON_MUTATIONS if fmt == "curve" else BINARY_MUTATIONS
    assert {k for k, _ in outcomes} == set(kinds)
    assert sum(outcomes.values()) == N_CASES[fmt]
    # zero length and the deliberately broken headers are refused, whatever else happens
    assert outcomes["zero", "ok"] == 0
    assert outcomes["zero", "error"] > 0
    # the unmutated file is valid (a mutation that leaves it unchanged stays valid)
    assert check(fmt, bases.good[fmt], tmp_path, {}) == "ok"


def test_fuzz_text_inputs(bases, tmp_path, text_ctx):
    outcomes = collections.Counter()
    for kind, data in cases("text", bases, N_CASES["text"], SEED):
        try:
            outcomes[kind, check("text", data, tmp_path, text_ctx)] += 1
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"text/{kind}: {type(exc).__name__}: {exc} on {data[:80]!r}") from exc
    assert {k for k, _ in outcomes} == set(TEXT_MUTATIONS)
    assert outcomes["huge_codepoint", "error"] > 0 and outcomes["special_tokens", "ok"] > 0
    if text_ctx:
        assert text_ctx["chat_budget"] == 0  # the chat check ran on the first 60 cases
