"""The server's worker and queue without a model: FIFO order, the bounded depth, a withdrawn job
never runs, a failing job never ends the worker, a cancelled job ends at its next step."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")

from promptlookup.api import RequestError  # noqa: E402
from promptlookup.serve.queue import Job, Worker  # noqa: E402


class _Chunk:
    def __init__(self, text: str, completion=None) -> None:
        self.text, self.tokens, self.completion = text, [], completion


def _job(loop, log: list, name: str, gate: threading.Event | None = None, steps: int = 1, fail=None,
         delay: float = 0.0):
    def run(cancelled, timeout):
        if fail is not None:
            raise fail

        def chunks():
            for i in range(steps):
                if gate is not None:
                    gate.wait(10)
                time.sleep(delay)
                if cancelled():
                    log.append(f"{name}:cancelled@{i}")
                    yield _Chunk("", completion=name)
                    return
                yield _Chunk(f"{name}{i}")
            log.append(name)
            yield _Chunk("", completion=name)

        return chunks()

    return Job(run=run, loop=loop)


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
        w = Worker(max_queue=2, on_done=lambda job: done.append(job.completion))
        gate = threading.Event()
        first = _job(loop, log, "a", gate=gate, steps=3)
        w.start()
        assert w.submit(first)
        while w.running == 0:
            await asyncio.sleep(0.01)
        b, c, d = _job(loop, log, "b"), _job(loop, log, "c"), _job(loop, log, "d")
        assert w.submit(b) and w.submit(c)
        assert not w.submit(d)  # two wait already: the third is refused
        w.withdraw(b)  # its client went away while it waited: it never runs
        bad = _job(loop, log, "bad", fail=RequestError("no", "prompt"))
        boom = _job(loop, log, "boom", fail=ZeroDivisionError())
        assert w.submit(bad) and not w.submit(boom)
        gate.set()
        assert await _drain(first) == ["start", "chunk", "chunk", "chunk", "chunk", "end"]
        assert await _drain(c) == ["start", "chunk", "chunk", "end"]
        assert await _drain(bad) == ["error:400"]
        assert w.submit(boom)
        assert await _drain(boom) == ["error:500"]  # a bug in a request is a 500, and the worker lives on
        slow = _job(loop, log, "slow", steps=1000, delay=0.01)
        assert w.submit(slow)
        while w.running == 0:
            await asyncio.sleep(0.01)
        w.withdraw(slow)  # running: it ends at its next step
        slow_events = await _drain(slow)
        assert slow_events[-1] == "end"
        assert log[:2] == ["a", "c"] and log[2].startswith("slow:cancelled@")
        assert done == ["a", "c", "slow"]
        w.stop()

    asyncio.run(main())
