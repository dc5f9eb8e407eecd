"""The server's jobs on a real engine loop (the byte double, no model): the bounded queue, a
withdrawn job never runs, a bad request is a 400 and a bug a 500 while the loop lives on, a cancelled
job ends at its next step, and the after-request hook runs for every completion."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")

from fakes import ByteModel  # noqa: E402
from serving import metric_values  # noqa: E402

from promptlookup import Engine  # noqa: E402
from promptlookup.options import RequestOptions  # noqa: E402
from promptlookup.serve.queue import Job  # noqa: E402


async def _drain(job: Job) -> list[str]:
    kinds = []
    while True:
        ev = await asyncio.wait_for(job.events.get(), 30)
        kinds.append(ev.kind if ev.kind != "error" else f"error:{ev.status}")
        if ev.kind == "end":
            return kinds


def test_bounded_queue_withdraw_failures_and_cancel():
    async def main():
        loop = asyncio.get_running_loop()
        model = ByteModel()
        engine = Engine.from_backend(model, speculate="off")
        engine.loop.max_queue = 2
        gate, inside = threading.Event(), threading.Event()
        prefill, verify = model.prefill, model.verify

        def held_prefill(*args, **kwargs):  # the first prompt waits at the gate: the others queue
            inside.set()
            gate.wait(30)
            return prefill(*args, **kwargs)

        def slow_verify(*args, **kwargs):
            time.sleep(0.002)
            return verify(*args, **kwargs)

        model.prefill, model.verify = held_prefill, slow_verify
        tokenize = engine.tokenize
        engine.tokenize = lambda text: 1 // 0 if text == "boom" else tokenize(text)
        done: list[str] = []

        def job(prompt: str, max_tokens: int = 3) -> Job:
            return Job("completion", prompt, RequestOptions(max_tokens=max_tokens), loop,
                       on_done=lambda j: done.append(j.prompt))

        def submit(j: Job) -> bool:
            return engine.submit(j.kind, j.prompt, j.options, j.sink, j.cancel, j.deadline) is not None

        a = job("a")
        assert submit(a)
        assert await asyncio.to_thread(inside.wait, 30)
        b, c, d = job("b"), job("c"), job("d")
        assert submit(b) and submit(c)
        assert not submit(d)  # two wait already: the third is refused
        assert engine.loop.retry_after() >= 1
        b.cancel.set()  # its client went away while it waited: it never runs, and frees its place
        bad, boom = job(""), job("boom")
        assert submit(bad) and not submit(boom)
        gate.set()
        assert (await _drain(a))[0] == "start" and a.completion.tokens
        assert await _drain(b) == ["end"] and b.completion is None
        assert (await _drain(c))[-1] == "end" and c.completion.tokens
        assert await _drain(bad) == ["error:400", "end"]
        assert submit(boom)
        assert await _drain(boom) == ["error:500", "end"]  # a bug is a 500, and the loop lives on
        slow = job("slow", max_tokens=2000)
        assert submit(slow)
        while slow.started is None:
            await asyncio.sleep(0.01)
        slow.cancel.set()  # running: it ends at its next step
        assert (await _drain(slow))[-1] == "end"
        assert slow.completion.stopped_by == "cancelled" and len(slow.completion.tokens) < 2000
        for _ in range(3000):  # the hook runs on the event loop after the "end" event
            if len(done) == 3:
                break
            await asyncio.sleep(0.01)
        assert done == ["a", "c", "slow"]
        engine.close()

    asyncio.run(main())


def test_a_served_request_touches_two_threads_the_event_loop_and_the_engine_loop(monkeypatch):
    """From the route to the backend and back, a request is handed over once each way: its route
    runs on the event loop; its tokenizing, drafting, forwards and text all run on the engine loop's
    thread (the compute thread); its events come back to the event loop."""
    from collections import defaultdict
    from pathlib import Path

    from fakes import BatchByteModel
    from starlette.testclient import TestClient

    from promptlookup.serve import queue as serve_queue
    from promptlookup.serve.app import Settings, create_app

    seen: dict[str, set[str]] = defaultdict(set)

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen[name].add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return wrapped

    model = BatchByteModel(n_seq=2)
    for name in ("tokenize", "decode_many", "detokenize"):
        setattr(model, name, spy(name, getattr(model, name)))
    post_init = serve_queue.Job.__post_init__
    monkeypatch.setattr(serve_queue.Job, "__post_init__", spy("route", post_init))
    emit = serve_queue.Job.emit
    monkeypatch.setattr(serve_queue.Job, "emit", spy("events", emit))
    curve = Path(__file__).resolve().parents[1] / "benchmarks" / "curves" / "smollm2-q4_1-cpu2.json"
    engine = Engine.from_backend(model, speculate="ngram", parallel=2, cost_curve=curve)
    for slot in engine.loop.pool.slots:
        source = engine.source_for(engine.default_spec, slot)
        source.propose = spy("propose", source.propose)
    seen.clear()  # what loading did is not the request's
    with TestClient(create_app(engine, Settings())) as client:
        r = client.post("/v1/completions", json={"prompt": "a b c a b c a b", "max_tokens": 24,
                                                 "stream": True})
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    engine.close()
    for name in ("tokenize", "propose", "decode_many", "detokenize", "events"):
        assert seen[name] == {"promptlookup-compute"}, name
    assert len(seen["route"]) == 1 and seen["route"] != {"promptlookup-compute"}


def test_a_history_save_that_fails_after_a_request_is_logged_and_the_server_serves_on(tmp_path, caplog):
    from starlette.testclient import TestClient

    from promptlookup.serve.app import Settings, create_app

    (tmp_path / "a-file").write_text("not a directory")
    engine = Engine.from_backend(ByteModel(), speculate="suffix", history=tmp_path / "a-file" / "h")
    body = {"prompt": "a b c a b c", "max_tokens": 8}
    with caplog.at_level("ERROR", logger="promptlookup.serve"), \
            TestClient(create_app(engine, Settings(history_save_every=1))) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
        for _ in range(3000):  # the save runs on an executor thread after the response
            if "saving the history after a request failed" in caplog.text:
                break
            time.sleep(0.01)
        assert client.post("/v1/completions", json=body).status_code == 200
    assert "saving the history after a request failed" in caplog.text
    engine.close()


def test_metrics_show_the_suffix_history_growing_with_each_request_up_to_its_budget():
    """The history grows with every request by design, up to its budget: /metrics shows its tokens and
    bytes, so a soak can tell that growth from a leak. Exact, with a budget of 40 tokens."""
    from starlette.testclient import TestClient

    from promptlookup.serve.app import Settings, create_app

    def gauges(text: str) -> tuple[float, float]:
        values = metric_values(text)
        return values["promptlookup:suffix_history_tokens"], values["promptlookup:suffix_history_bytes"]

    engine = Engine.from_backend(ByteModel(), speculate="suffix", history_budget=40)
    with TestClient(create_app(engine, Settings())) as client:
        assert gauges(client.get("/metrics").text) == (0, engine.history.bytes_in_use)
        sizes = []
        for _ in range(3):
            r = client.post("/v1/completions", json={"prompt": "a b c a b c", "max_tokens": 8,
                                                     "temperature": 0})
            usage = r.json()["usage"]
            tokens, nbytes = gauges(client.get("/metrics").text)
            assert nbytes == engine.history.bytes_in_use > 0
            sizes.append((usage["prompt_tokens"] + usage["completion_tokens"], tokens))
    engine.close()
    # a request adds what the source saw: its prompt and answer but the last token (never fed back);
    # the third would make 54 > 40: the oldest go until it fits in three quarters of the budget
    assert sizes == [(19, 18), (19, 36), (19, 18)]


@pytest.mark.parametrize("budget, entries", [(100, [52, 22, 58]), (None, [52, 143, 167])])
def test_metrics_show_the_lookup_dynamic_cache_held_to_its_budget(budget, entries):
    """Each slot's lookup source merges every request it serves into its dynamic cache; past the
    engine's budget its counts are halved. /metrics shows the bytes; without a budget (the negative
    control) the second request leaves 143 entries, with a budget of 100 it leaves 22."""
    from starlette.testclient import TestClient

    from promptlookup.serve.app import Settings, create_app

    engine = Engine.from_backend(ByteModel(), speculate="lookup", lookup_budget=budget)
    source = engine.source_for(engine.default_spec)
    seen = []
    with TestClient(create_app(engine, Settings())) as client:
        for prompt in ("a b c a b c", "the cat sat on the mat", "x y z"):
            r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200
            gauge = metric_values(client.get("/metrics").text)["promptlookup:lookup_dynamic_bytes"]
            assert gauge == engine.learned_bytes == source.dynamic.bytes_in_use > 0
            seen.append(source.dynamic.n_entries)
    engine.close()
    assert seen == entries
