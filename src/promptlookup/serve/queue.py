"""Worker threads run the engine, one per request it runs at once; requests wait their turn in a
bounded FIFO queue.

A :class:`Job` is data: the kind of request (``chat`` or ``completion``), its prompt (messages, text
or ids) and its :class:`~promptlookup.options.RequestOptions`, checked by the route before it was
queued. The worker hands them to the engine itself (``Engine.chat`` / ``Engine.generate``), so a
request's path runs one way: route -> queue -> engine -> loop -> backend, with no call back into the
module that queued it.

Why threads and a queue: the engine runs ``engine.parallel`` requests at once (continuous batching
decodes them together: :mod:`promptlookup.batching`), and a generation is seconds of blocking native
calls, which must never run on the event loop (that would stall every other client, ``/health``
included). So each request becomes a :class:`Job`: the event loop submits it (refused when
``max_queue`` jobs already wait, so the client gets a 503 at once instead of an unbounded wait), one
worker thread per slot takes the oldest waiting job and sends each step's
events back to the loop through ``call_soon_threadsafe``. A job carries a :class:`threading.Event`
that the loop sets when its client disconnects (or on shutdown): a waiting job is dropped from the
queue there and then, a running one ends at its next step (``Options.cancelled``), so its slot is
free for the next request within one step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from promptlookup.errors import InputError, UsageError, UserError
from promptlookup.options import RequestOptions

log = logging.getLogger("promptlookup.serve")


@dataclass
class Event:
    """What the worker tells the loop: ``start`` (the job left the queue), ``chunk`` (a step's text;
    the last one carries the completion), ``error`` (status, type, message, param) or ``end``."""

    kind: str
    chunk: Any = None
    extra: Any = None  # on a chunk: what the worker computed for its response (token texts)
    status: int = 0
    type: str = ""
    message: str = ""
    param: str | None = None


@dataclass(eq=False)
class Job:
    """One request: ``kind`` ("chat": ``prompt`` is messages; "completion": text or token ids) and its
    checked ``options`` (with logprobs asked for, the worker also looks up the texts of each chunk's
    logprob tokens: :class:`TokenTexts`)."""

    kind: str
    prompt: Any
    options: RequestOptions
    loop: asyncio.AbstractEventLoop
    deadline: float | None = None  # time.monotonic() by which the request must be done
    cancel: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None
    completion: Any = None  # the engine's Completion, once the generation finished (or was cancelled)
    events: asyncio.Queue[Event] = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError(f"unknown job kind {self.kind!r}")
        self.events = asyncio.Queue()

    def emit(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class TokenTexts:
    """One request's worker-side lookup of the texts of a chunk's logprob tokens (chosen and top; on
    the last chunk, those of the whole completion too), each token detokenized once: the model is
    the worker's to use, so the response's renderer never touches it."""

    def __init__(self, detokenize: Callable[[list[int]], str]) -> None:
        self.detokenize = detokenize
        self.known: dict[int, str] = {}

    def __call__(self, chunk: Any) -> dict[int, str]:
        lps = [*(chunk.logprobs or ()), *(chunk.completion.logprobs or () if chunk.completion else ())]
        ids = {x.token for x in lps} | {t for x in lps for t, _ in x.top}
        for t in ids - self.known.keys():
            self.known[t] = self.detokenize([t])
        return {t: self.known[t] for t in ids}


def error_event(exc: BaseException) -> Event:
    """The error object a request's failure becomes: the client's mistakes are 400s."""
    if isinstance(exc, InputError | UsageError):
        return Event("error", status=400, type="invalid_request_error", message=str(exc),
                     param=getattr(exc, "param", None))
    if isinstance(exc, UserError):  # a backend that could not decode: the server's problem
        return Event("error", status=500, type="server_error", message=str(exc))
    return Event("error", status=500, type="server_error",
                 message=f"internal error ({type(exc).__name__}); the server logged it")


class Worker:
    """The threads that run jobs on ``engine``, oldest first, ``engine.parallel`` at once; see the
    module docstring."""

    def __init__(self, engine: Any, max_queue: int, on_done: Callable[[Job], None] | None = None) -> None:
        self.engine = engine  # an Engine (or a test double with its chat/generate/detokenize)
        self.max_queue = max_queue
        self.on_done = on_done
        self.parallel = int(getattr(engine, "parallel", 1))
        self._cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: set[Job] = set()
        self._stopping = False
        self.served = 0
        self.service_s = 1.0  # a moving average of how long a request holds a slot (Retry-After)
        self._threads = [threading.Thread(target=self._loop, name=f"promptlookup-engine-{i}", daemon=True)
                         for i in range(self.parallel)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def retry_after(self) -> int:
        """Seconds a refused client might wait before trying again: the queue's expected drain time."""
        return max(1, min(60, round(self.service_s * (self.waiting + self.running) / self.parallel)))

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False when ``max_queue`` jobs wait already (or the server is stopping)."""
        with self._cv:
            if self._stopping or len(self._waiting) >= self.max_queue:
                return False
            self._waiting.append(job)
            self._cv.notify()
            return True

    def withdraw(self, job: Job) -> None:
        """The job's client went away: cancel it, and drop it from the queue if it still waits."""
        job.cancel.set()
        with self._cv, contextlib.suppress(ValueError):
            self._waiting.remove(job)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every job (a running one ends at its next step) and wait for the thread."""
        with self._cv:
            self._stopping = True
            dropped = list(self._waiting)
            self._waiting.clear()
            for job in self._running:
                job.cancel.set()
            self._cv.notify_all()
        for job in dropped:
            job.cancel.set()
            job.emit(Event("error", status=503, type="server_error", message="the server is shutting down"))
        end = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, end - time.monotonic()))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self._running.add(job)
            try:
                if not job.cancel.is_set():
                    self._serve(job)
            finally:
                with self._cv:
                    self._running.discard(job)

    def _serve(self, job: Job) -> None:
        now = time.monotonic()
        job.started = now
        remaining = None if job.deadline is None else job.deadline - now
        if remaining is not None and remaining <= 0:
            job.emit(Event("error", status=503, type="server_error",
                           message="the request timed out waiting in the queue; try again later"))
            return
        completed = False
        try:
            opts = job.options.replace(cancelled=job.cancel.is_set, timeout=remaining)
            if job.kind == "chat":  # tokenizing and the engine's own checks happen here, on the worker
                chunks = self.engine.chat(job.prompt, opts, stream=True)
            else:
                chunks = self.engine.generate(job.prompt, opts, stream=True)
            annotate = TokenTexts(self.engine.detokenize) if opts.logprobs is not None else None
        except Exception as exc:  # a request's failure must never end the worker
            if not isinstance(exc, UserError):
                log.exception("promptlookup serve: a request failed")
            job.emit(error_event(exc))
            return
        job.emit(Event("start"))  # from here the response is 200 (a stream's headers go out)
        try:
            for chunk in chunks:
                extra = annotate(chunk) if annotate is not None else None
                if chunk.completion is not None:
                    job.completion = chunk.completion
                    completed = True
                job.emit(Event("chunk", chunk=chunk, extra=extra))
        except Exception as exc:  # a request's failure must never end the worker
            if not isinstance(exc, UserError):
                log.exception("promptlookup serve: a request failed")
            job.emit(error_event(exc))
        finally:
            job.emit(Event("end"))
        if completed:
            took = time.monotonic() - now
            with self._cv:
                self.service_s = 0.8 * self.service_s + 0.2 * took if self.served else took
                self.served += 1
            if self.on_done is not None:
                try:
                    self.on_done(job)
                except Exception:  # e.g. a history save that failed: logged, served on
                    log.exception("promptlookup serve: after-request hook failed")
