"""A request as the server hands it to the engine loop, and the events that come back.

A :class:`Job` is data: the kind of request (``chat`` or ``completion``), its prompt (messages, text
or ids) and its :class:`~promptlookup.options.RequestOptions`, checked by the route before it was
queued. :meth:`~promptlookup.api.Engine.submit` hands it to the engine loop
(:mod:`promptlookup.batching.engine_loop`), the one thread that owns the model: the request's path
runs one way, route -> engine loop -> backend, and one way back, the loop calling the job's
:meth:`Job.sink`, which passes each event to the event loop (``call_soon_threadsafe``). So a
generation's seconds of native calls never run on the event loop (that would stall every other
client, ``/health`` included), and a client's disconnect reaches its request by its ``cancel`` flag:
a waiting request is dropped, a running one ends at its next step, so its slot is free for the next
request within one step. The loop's queue is bounded (``--max-queue``): a refused job is a 503 at
once instead of an unbounded wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from promptlookup.batching.engine_loop import ShuttingDown
from promptlookup.errors import InputError, UsageError, UserError
from promptlookup.options import RequestOptions

log = logging.getLogger("promptlookup.serve")


@dataclass
class Event:
    """What the engine loop tells the event loop: ``start`` (the checks passed), ``chunk`` (a step's
    text; the last one carries the completion), ``error`` (status, type, message, param) or ``end``."""

    kind: str
    chunk: Any = None
    extra: Any = None  # on a chunk: what the engine loop computed for its response (token texts)
    status: int = 0
    type: str = ""
    message: str = ""
    param: str | None = None


@dataclass(eq=False)
class Job:
    """One request: ``kind`` ("chat": ``prompt`` is messages; "completion": text or token ids) and its
    checked ``options`` (with logprobs asked for, :meth:`sink` also looks up the texts of each chunk's
    logprob tokens, on the engine loop: :class:`TokenTexts`)."""

    kind: str
    prompt: Any
    options: RequestOptions
    loop: asyncio.AbstractEventLoop
    deadline: float | None = None  # time.monotonic() by which the request must be done
    cancel: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.monotonic)
    started: float | None = None
    completion: Any = None  # the engine's Completion, once the generation finished (or was cancelled)
    # the texts of logprob tokens (the engine's detokenize; set when the job asks for logprobs)
    annotate: TokenTexts | None = None
    on_done: Callable[[Job], None] | None = None  # called on the event loop after a completion
    events: asyncio.Queue[Event] = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError(f"unknown job kind {self.kind!r}")
        self.events = asyncio.Queue()

    def emit(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def sink(self, kind: str, payload: Any) -> None:
        """What the engine loop calls (on its thread, so it never blocks): ``"start"`` (the checks
        passed: the response is a 200 from here), ``"chunk"``, ``"error"``, ``"end"``."""
        if kind == "start":
            self.started = time.monotonic()
            self.emit(Event("start"))
        elif kind == "chunk":
            extra = self.annotate(payload) if self.annotate is not None else None
            if payload.completion is not None:
                self.completion = payload.completion
            self.emit(Event("chunk", chunk=payload, extra=extra))
        elif kind == "error":
            if not isinstance(payload, UserError | TimeoutError):
                log.error("promptlookup serve: a request failed", exc_info=payload)
            self.emit(error_event(payload))
        elif kind == "end":
            self.emit(Event("end"))
            if self.completion is not None and self.on_done is not None:
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(self.on_done, self)


class TokenTexts:
    """One request's lookup of the texts of a chunk's logprob tokens (chosen and top; on the last
    chunk, those of the whole completion too), each token detokenized once, on the engine loop: the
    model is the loop's to use, so the response's renderer never touches it."""

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
    """The error object a request's failure becomes: the client's mistakes are 400s; a request that
    waited past its time, or met a server that stops, a 503."""
    if isinstance(exc, TimeoutError):
        return Event("error", status=503, type="server_error", message=str(exc))
    if isinstance(exc, ShuttingDown):
        return Event("error", status=503, type="server_error", message="the server is shutting down")
    if isinstance(exc, InputError | UsageError):
        return Event("error", status=400, type="invalid_request_error", message=str(exc),
                     param=getattr(exc, "param", None))
    if isinstance(exc, UserError):  # a backend that could not decode: the server's problem
        return Event("error", status=500, type="server_error", message=str(exc))
    return Event("error", status=500, type="server_error",
                 message=f"internal error ({type(exc).__name__}); the server logged it")
