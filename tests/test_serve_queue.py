"""The server's worker and queue without a model: FIFO order, the bounded depth, a withdrawn job
never runs, a failing job never ends the worker, a cancelled job ends at its next step."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")

from promptlookup.api import RequestError  # noqa: E402
from promptlookup.options import RequestOptions  # noqa: E402
from promptlookup.serve.queue import Job, Worker  # noqa: E402


class _Chunk:
    def __init__(self, text: str, completion=None) -> None:
        self.text, self.tokens, self.completion, self.logprobs = text, [], completion, None


class _Engine:
    """The worker's engine: each job's prompt names a script (gate, steps, failure, delay)."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.scripts: dict[str, dict] = {}

    def detokenize(self, ids):
        return ""

    def chat(self, prompt, options, stream):
        raise AssertionError("these jobs are completions")

    def generate(self, name, options, stream):
        script, log = self.scripts[name], self.log
        assert stream and options.cancelled is not None
        if script["fail"] is not None:
            raise script["fail"]

        def chunks():
            for i in range(script["steps"]):
                if script["gate"] is not None:
                    script["gate"].wait(10)
                time.sleep(script["delay"])
                if options.cancelled():
                    log.append(f"{name}:cancelled@{i}")
                    yield _Chunk("", completion=name)
                    return
                yield _Chunk(f"{name}{i}")
            log.append(name)
            yield _Chunk("", completion=name)

        return chunks()


def _job(loop, engine: _Engine, name: str, gate: threading.Event | None = None, steps: int = 1, fail=None,
         delay: float = 0.0):
    engine.scripts[name] = {"gate": gate, "steps": steps, "fail": fail, "delay": delay}
    return Job("completion", name, RequestOptions(max_tokens=steps + 1), loop)


async def _drain(job: Job) -> list[str]:
    kinds = []
    while True:
        ev = await asyncio.wait_for(job.events.get(), 10)
        kinds.append(ev.kind if ev.kind != "error" else f"error:{ev.status}")
        if ev.kind == "end" or ev.kind == "error" and "start" not in kinds:
            return kinds


def test_fifo_bounded_withdraw_failures_and_cancel():
    async def main():
        loop = asyncio.get_running_loop()
        log: list[str] = []
        done: list[str] = []
        engine = _Engine(log)
        w = Worker(engine, max_queue=2, on_done=lambda job: done.append(job.completion))
        gate = threading.Event()
        first = _job(loop, engine, "a", gate=gate, steps=3)
        w.start()
        assert w.submit(first)
        while first.started is None:
            await asyncio.sleep(0.01)
        b, c, d = _job(loop, engine, "b"), _job(loop, engine, "c"), _job(loop, engine, "d")
        assert w.submit(b) and w.submit(c)
        assert not w.submit(d)  # two wait already: the third is refused
        w.withdraw(b)  # its client went away while it waited: it never runs
        bad = _job(loop, engine, "bad", fail=RequestError("no", "prompt"))
        boom = _job(loop, engine, "boom", fail=ZeroDivisionError())
        assert w.submit(bad) and not w.submit(boom)
        gate.set()
        assert await _drain(first) == ["start", "chunk", "chunk", "chunk", "chunk", "end"]
        assert await _drain(c) == ["start", "chunk", "chunk", "end"]
        assert await _drain(bad) == ["error:400"]
        assert w.submit(boom)
        assert await _drain(boom) == ["error:500"]  # a bug in a request is a 500, and the worker lives on
        slow = _job(loop, engine, "slow", steps=1000, delay=0.01)
        assert w.submit(slow)
        # wait for slow itself to start: "the worker is running something" can still be boom, just
        # finished, and withdrawing slow then drops it from the queue before it ever runs
        while slow.started is None:
            await asyncio.sleep(0.01)
        w.withdraw(slow)  # running: it ends at its next step
        slow_events = await _drain(slow)
        assert slow_events[-1] == "end"
        assert log[:2] == ["a", "c"] and log[2].startswith("slow:cancelled@")
        # the hook runs on the worker after the job's "end" event (a history save must not hold up the
        # response): wait for it, up to 60 s (found beside a CPU hog: the worker had not run it yet)
        for _ in range(6000):
            if len(done) == 3:
                break
            await asyncio.sleep(0.01)
        assert done == ["a", "c", "slow"]
        w.stop()

    asyncio.run(main())
