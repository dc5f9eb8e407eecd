"""Continuous batching on the real llama.cpp backend: requests decoded together get, token for token,
what each gets alone (set-up's invariant build gives bit-identical rows in any batch, separate KV
streams per sequence: tests/test_llama_batch.py), greedy and seeded sampling, with speculation."""

from __future__ import annotations

import threading

import pytest
from conftest import requires_model

pytestmark = [pytest.mark.model, requires_model]

PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog. "
    "the quick brown fox jumps over the lazy dog.",
    "Write a short story about a fox.",
    "List the days of the week, one per line.",
    "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


@pytest.fixture(scope="module")
def engines():
    from promptlookup import Engine

    together = Engine(threads=1, n_ctx=1024, parallel=4, speculate="auto")
    alone = Engine(threads=1, n_ctx=1024, parallel=1, speculate="auto")
    yield together, alone
    together.close()
    alone.close()


def gathered(engine, n: int) -> None:
    """Hold the first forward until ``n`` requests were handed to the loop, so they share forwards
    however threads run."""
    backend = engine.backend
    inner = backend.decode_many
    first = threading.Event()

    def decode_many(parts):
        if not first.is_set():
            first.set()
            wait = threading.Event()
            for _ in range(10_000):
                if engine.loop.running + engine.loop.waiting >= n or wait.wait(0.001):
                    break
        return inner(parts)

    backend.decode_many = decode_many


def together(engine, calls) -> list:
    out: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def work(i: int) -> None:
        start.wait()
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            out[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


@pytest.mark.parametrize("fields", [{"speculate": "auto"}, {"speculate": "ngram"},
                                    {"speculate": "auto", "temperature": 0.8, "seed": 11}],
                         ids=["auto", "ngram", "auto-sampled"])
def test_four_requests_decoded_together_equal_each_alone(engines, fields):
    batch, single = engines
    gathered(batch, 4)
    before = batch.loop.stats.rounds, batch.loop.stats.parts

    def call(engine, prompt):
        return lambda: engine.chat([{"role": "user", "content": prompt}], max_tokens=48, **fields)

    got = together(batch, [call(batch, p) for p in PROMPTS])
    want = [call(single, p)() for p in PROMPTS]
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert [c.text for c in got] == [c.text for c in want]
    rounds = batch.loop.stats.rounds - before[0]
    parts = batch.loop.stats.parts - before[1]
    assert parts > rounds  # forwards were shared
