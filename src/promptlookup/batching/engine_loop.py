"""The engine loop: one thread owns the model and every running request.

Why one loop (vLLM's engine core has the same shape): a request used to take three threads on its way
to ``llama_decode`` (a worker thread per slot ran its speculative loop, a scheduler thread gathered
the slots' forwards into rounds, the compute thread called llama.cpp) and as many back, with two
admission gates, locks around every shared draft source and a loop that called back up into the
scheduler. Here a request is a generator (the engine builds it: :meth:`promptlookup.api.Engine.submit`)
that yields what it needs, and this loop, running on the compute thread
(:mod:`promptlookup.backends.compute_thread`), gives it:

- :class:`Started`: the request's checks passed (its response is a 200 from here);
- :class:`NeedSlot`: a slot for its prompt. Admission is here and only here: the free slot whose
  cache keeps most of the prompt (:class:`~promptlookup.batching.pool.SlotPool`), a prefix copied
  from another sequence where that saves more (:mod:`promptlookup.batching.prefix`); the request is
  sent back the slot and the positions its cache holds;
- :class:`~promptlookup.speculate.Forward`: a prompt to read or a draft to verify. Each round, every
  running request is advanced until it yields its next forward (drafting, with the batch's price of a
  drafted token: :mod:`promptlookup.batching.pricing`), the parts go to the backend in one
  ``decode_many`` (a prompt one chunk a round, so it does not stall the others), and each request
  is sent its tokens at the next round;
- anything else is a chunk for its reader: handed to the request's ``emit`` at once, so a slow
  reader never holds up the batch.

A cancelled request (its reader went away, the server stops) ends at its next step, or between two
chunks of its prompt; one still waiting for a slot is dropped. A part the backend refuses (a context
overflow, a bad token) fails alone: a refused round is decoded part by part, and only the part at
fault gets the error, thrown into its request.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.backends import compute_thread
from promptlookup.backends.base import BackendError, BatchDecoder, SeqDecode, check_keep
from promptlookup.batching import prefix
from promptlookup.batching.pool import Slot, SlotPool
from promptlookup.batching.pricing import BatchCost, DraftPricing
from promptlookup.speculate import Forward

log = logging.getLogger("promptlookup.engine")
DEFAULT_PREFILL_CHUNK = 128  # prompt tokens per round: about 4 one-token decodes of the bundled model


@dataclass(frozen=True)
class Started:
    """Yielded by a request once its checks passed: its reader gets ``emit("start")``."""


@dataclass(frozen=True)
class NeedSlot:
    """Yielded by a request for a slot for prompt ``ids``; it is sent ``(slot, kept)``: the slot and
    the positions of ``ids`` its cache holds (its own, or copied from another sequence)."""

    ids: Sequence[int]


class PromptEnded(Exception):  # noqa: N818 - a signal, not an error
    """Thrown into a request whose prompt was being read when it was cancelled (``why``:
    ``"cancelled"``) or ran out of time (``"time"``)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class RoundStats:
    """What the rounds did so far (for reports, tests and the benchmark)."""

    rounds: int = 0
    parts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    widths: list[int] = field(default_factory=list)  # parts per round, the last 1024 rounds

    def add(self, parts: int, tokens: int, seconds: float) -> None:
        self.rounds += 1
        self.parts += parts
        self.tokens += tokens
        self.seconds += seconds
        self.widths.append(parts)
        if len(self.widths) > 1024:
            del self.widths[:512]


@dataclass(eq=False)
class Request:
    """One request in the loop: ``ops`` (its generator), ``emit(kind, payload)`` (``"start"``,
    ``"chunk"`` with a chunk, ``"error"`` with the exception, ``"end"``; called on the loop's
    thread, it must not block), ``cancel`` (set from any thread; ``cancelled``, when given, is asked
    too) and ``deadline`` (``time.monotonic()``)."""

    ops: Generator[Any, Any, None]
    emit: Callable[[str, Any], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None
    cancelled: Callable[[], bool] | None = None
    arrived: float = field(default_factory=time.monotonic)
    admitted: float | None = None  # when it got a slot
    # the loop's own state
    ids: Sequence[int] = ()
    slot: Slot | None = None
    op: Forward | None = None
    read: int = 0  # prompt positions of ``op`` (a prefill) the cache holds
    op_seconds: float = 0.0
    reply: Any = None
    throw: BaseException | None = None
    wait: prefix.PrefixPlan | None = None
    donor: Request | None = None  # the request whose prompt ``wait`` waits for
    done: bool = False

    def is_cancelled(self) -> bool:
        return self.cancel.is_set() or (self.cancelled is not None and bool(self.cancelled()))


class EngineLoop:
    """Requests on the slots of one backend, advanced by one thread; see the module docstring.

    ``slots``: the backend's sequences with their sources (one, or ``parallel``); ``cost``: seconds
    of a forward of ``n`` tokens (the backend's cost curve), the prior of the batch pricing (None:
    drafts are never capped); ``max_queue``: requests that may wait for a slot (None: no bound);
    ``clock`` times the rounds (injected by tests); ``driven=False``: the caller runs :meth:`round`
    itself (tests), the compute thread does not."""

    def __init__(self, backend: Any, slots: Sequence[Slot], prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 cost: Callable[[int], float] | None = None, max_queue: int | None = None,
                 reuse_prefix: bool = True, clock: Callable[[], float] = time.perf_counter,
                 driven: bool = True) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.backend = backend
        self.batched = isinstance(backend, BatchDecoder)
        self.pool = SlotPool(slots)
        n_batch = int(getattr(backend, "n_batch", prefill_chunk) or prefill_chunk)
        # alone, a prompt is read in the backend's largest pieces; beside others, in chunks
        self.prefill_chunk = min(prefill_chunk, n_batch) if len(slots) > 1 else n_batch
        self.pricing = (DraftPricing(BatchCost(cost), forwards=backend.forward_sizes)
                        if cost is not None and len(slots) > 1 and self.batched else None)
        self.max_queue = max_queue
        self.reuse_prefix = reuse_prefix
        self.clock = clock
        self.stats = RoundStats()
        self.served = 0
        self.service_s = 1.0  # a moving average of how long a request holds a slot (Retry-After)
        self.prefix_waits = 0  # prompts that waited for an earlier request to read their opening
        self.prefix_copies = 0  # prompts that started from another sequence's copied prefix
        self.prefix_copied_tokens = 0
        self._lock = threading.Lock()  # guards what other threads touch: the incoming list, the flags
        self._incoming: list[Request] = []
        self._stopping = False
        self._closed = False
        self._stopped = threading.Event()
        self._new: list[Request] = []  # not yet advanced to their slot request
        self._queued: collections.deque[Request] = collections.deque()  # waiting for a slot
        self._running: dict[int, Request] = {}  # by sequence
        self._fed: dict[int, tuple[int, str]] = {}  # running seq: (tokens, want) of the last part it fed
        self._round: dict[int, tuple[int, str]] = {}  # this round's parts so far
        self._fresh: set[Request] = set()  # requests that took their forward this round
        self._driven = driven
        self._attached = not driven  # a loop nobody drives is never attached

    # -- what other threads call ----------------------------------------------------------------
    def submit(self, request: Request) -> bool:
        """Add ``request``; False when ``max_queue`` requests wait already (or the loop is stopping)."""
        with self._lock:
            if self._stopping or self._closed:
                return False
            if self.max_queue is not None and self.waiting >= self.max_queue:
                return False
            self._incoming.append(request)
            attach = not self._attached
            self._attached = True
        if attach:
            compute_thread.attach(self)
        else:
            compute_thread.wake()
        return True

    def withdraw(self, request: Request) -> None:
        """The request's reader went away: it ends at its next step (dropped if it waits for a slot)."""
        request.cancel.set()
        compute_thread.wake()

    def wake(self) -> None:
        """A request's cancel flag was set from outside: the loop looks at it now, not at its next
        request (a waiting one is dropped at once)."""
        compute_thread.wake()

    def stop(self, timeout: float = 30.0) -> bool:
        """Cancel every request (each ends at its next step; those without a slot are refused with
        :class:`ShuttingDown`) and wait up to ``timeout`` seconds for them to end; True when they did.
        Later requests are taken again (a server refuses them itself while it stops)."""
        with self._lock:
            if not self._attached:
                return True
            self._stopping = True
            self._stopped.clear()
        compute_thread.wake()
        if compute_thread.is_compute_thread():
            return False
        return self._stopped.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """:meth:`stop`, and take no request after it."""
        with self._lock:
            self._closed = True
        self.stop(timeout)

    @property
    def waiting(self) -> int:
        """Requests without a slot yet (those whose reader went away are not counted)."""
        return sum(not r.cancel.is_set() for r in (*self._incoming, *self._new, *self._queued))

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def parallel(self) -> int:
        return self.pool.size

    def retry_after(self) -> int:
        """Seconds a refused client might wait before trying again: the queue's expected drain time."""
        return max(1, min(60, round(self.service_s * (self.waiting + self.running) / self.parallel)))

    # -- the compute thread's side ----------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self._incoming or self._new or self._running or self._queued or self._stopping)

    def round(self) -> None:
        """One round: take new requests, admit into free slots, advance every running request to its
        next forward, run them all in one forward."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
            stopping = self._stopping
        self._new.extend(incoming)
        if stopping:
            self._refuse_waiting()
            for req in self._running.values():
                req.cancel.set()  # each ends at its next step
        self._round, self._fresh = {}, set()
        for req in self._new:
            if req.cancel.is_set():
                self._drop(req)
            else:
                self._advance(req, None)
        self._new = []
        self._admit()
        ready: list[Request] = []
        for seq in sorted(self._running):
            req = self._running[seq]
            if req.wait is not None or req in self._fresh:  # waiting, or admitted with its part set
                continue
            if req.op is not None and req.op.kind == "prefill" and req.read < len(req.op.ids):
                # a cancel or a deadline is looked at before each piece but the last (which samples)
                why = self._ended(req) if len(req.op.ids) - req.read > self.prefill_chunk else None
                if why is not None:
                    req.throw, req.op = PromptEnded(why), None
                    ready.append(req)
                else:
                    self._round[seq] = self._prompt_part(req)
            else:
                ready.append(req)
        for req in ready:  # each drafts knowing the parts before it (and the others' last ones)
            if req.throw is not None:
                exc, req.throw = req.throw, None
                self._advance(req, exc=exc)
            else:
                reply, req.reply = req.reply, None
                self._advance(req, reply)
        parts = [(req, self._part(req)) for seq, req in sorted(self._running.items())
                 if req.op is not None and req.wait is None]
        if parts:
            self._forward(parts)
        self._round = {}
        with self._lock:  # idle: off the compute thread's list (an engine nobody uses can be freed)
            if not (self._incoming or self._new or self._queued or self._running):
                self._stopping = False
                if self._driven:
                    self._attached = False
                    compute_thread.detach(self)
                self._stopped.set()

    # -- admission --------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Waiting requests into free slots, oldest first; then the ones waiting for a prefix."""
        while self._queued:
            req = self._queued[0]
            timed_out = req.deadline is not None and time.monotonic() > req.deadline
            if req.cancel.is_set() or timed_out:
                self._queued.popleft()
                self._drop(req, timed_out=timed_out)
                continue
            got = self.pool.choose(req.ids, self.reuse_prefix)
            if got is None:
                break
            self._queued.popleft()
            slot, keep = got
            req.slot, req.admitted = slot, time.monotonic()
            self._running[slot.seq] = req
            if self.pricing is not None:
                self.pricing.start(slot.seq)
            req.wait = self._prefix_plan(req, keep)
            if req.wait is None:
                self._advance(req, (slot, keep))
            else:
                req.reply = keep
        for req in list(self._running.values()):
            plan = req.wait
            if plan is None or not plan.ready(self.backend, req.ids,
                                              lambda p=plan, r=req: self._running.get(p.src) is r.donor):
                continue
            req.wait = None
            keep = req.reply
            got = prefix.copy_prefix(self.backend, plan.src, plan.dst, req.ids, keep + prefix.MIN_PREFIX_COPY)
            if got:
                self.prefix_copies += 1
                self.prefix_copied_tokens += got
            assert req.slot is not None
            req.reply = None
            self._advance(req, (req.slot, got or keep))

    def _prefix_plan(self, req: Request, keep: int) -> prefix.PrefixPlan | None:
        if not (self.reuse_prefix and self.batched and self.pool.size > 1):
            return None
        assert req.slot is not None
        seq = req.slot.seq
        cached = {s.seq: self.backend.seq_tokens(s.seq) for s in self.pool.slots if s.seq != seq}
        # every earlier request still running (one that waits for a prefix reads its own rest after)
        reading = {s: r.ids for s, r in self._running.items() if s != seq}
        plan = prefix.plan(req.ids, seq, keep, cached, reading)
        if plan is not None and plan.in_flight:
            self.prefix_waits += 1
            req.donor = self._running[plan.src]
        return plan

    # -- advancing a request ----------------------------------------------------------------------
    def _advance(self, req: Request, value: Any = None, exc: BaseException | None = None) -> None:
        """Run ``req`` until it needs a forward or a slot, or ends; hand out what it yields meanwhile."""
        try:
            item = req.ops.throw(exc) if exc is not None else req.ops.send(value)
            while True:
                if isinstance(item, Forward):
                    self._take(req, item)
                    return
                if isinstance(item, NeedSlot):
                    req.ids = list(item.ids)
                    self._queued.append(req)
                    return
                if isinstance(item, Started):
                    req.emit("start", None)
                else:
                    req.emit("chunk", item)
                item = req.ops.send(None)
        except StopIteration:
            self._finish(req)
        except Exception as exc:  # a request's failure ends that request only
            self._finish(req, exc)

    def _take(self, req: Request, op: Forward) -> None:
        """``req`` needs ``op``: a prompt starts where its cache holds ``op.keep`` positions."""
        assert req.slot is not None
        req.op, req.op_seconds = op, 0.0
        self._fresh.add(req)
        seq = req.slot.seq
        if op.kind == "prefill":
            if self.batched:
                check_keep(self.backend.seq_tokens(seq), op.ids, op.keep)
                self.backend.seq_rollback(seq, op.keep)
            req.read = op.keep
            why = self._ended(req) if len(op.ids) - op.keep > self.prefill_chunk else None
            if why is not None:  # a prompt read in pieces looks before each one
                req.op, req.throw = None, PromptEnded(why)
                return
            self._round[seq] = self._prompt_part(req)
        else:
            self._round[seq] = (len(op.ids), "all")

    def _prompt_part(self, req: Request) -> tuple[int, str]:
        op = req.op
        assert op is not None
        n = min(self.prefill_chunk, len(op.ids) - req.read)
        return n, "last" if req.read + n == len(op.ids) else "none"

    def _part(self, req: Request) -> SeqDecode:
        op = req.op
        assert op is not None and req.slot is not None
        if op.kind == "verify":
            return SeqDecode(req.slot.seq, list(op.ids), "all", op.sampler)
        n, want = self._prompt_part(req)
        return SeqDecode(req.slot.seq, list(op.ids[req.read:req.read + n]), want,
                         op.sampler if want == "last" else None)

    def _ended(self, req: Request) -> str | None:
        if req.is_cancelled():
            return "cancelled"
        if req.deadline is not None and time.monotonic() > req.deadline:
            return "time"
        return None

    # -- the forward --------------------------------------------------------------------------------
    def _forward(self, parts: list[tuple[Request, SeqDecode]]) -> None:
        t0 = self.clock()
        results: list[list[int] | BaseException]
        if not self.batched:  # one sequence on a backend that decodes one
            req, _ = parts[0]
            assert req.op is not None
            try:
                results = [req.op.run(self.backend)]
            except Exception as exc:
                results = [exc]
            req.read = len(req.op.ids)
        else:
            try:
                results = list(self.backend.decode_many([p for _, p in parts]))
            except BackendError as exc:
                if len(parts) == 1:
                    results = [exc]
                else:
                    results = []
                    for _, p in parts:  # the forward was refused whole: find the part at fault
                        try:
                            results.append(self.backend.decode_many([p])[0])
                        except BackendError as one:
                            results.append(one)
            except Exception as exc:  # an unexpected failure reaches every part's request
                results = [exc] * len(parts)
        seconds = self.clock() - t0
        self.stats.add(len(parts), sum(len(p.ids) for _, p in parts), seconds)
        if self.pricing is not None:
            layout = tuple(sorted((p.seq, len(p.ids)) for _, p in parts))
            self.pricing.cost.observe(self.backend.forward_sizes(layout), seconds)
        for (req, part), result in zip(parts, results, strict=True):
            op = req.op
            assert op is not None
            self._fed[part.seq] = (len(part.ids), part.want)
            req.op_seconds += seconds
            if isinstance(result, BaseException):
                req.op, req.throw = None, result
                continue
            if op.kind == "prefill" and self.batched:
                req.read += len(part.ids)
                if req.read < len(op.ids):
                    continue  # more chunks follow, one a round
                result = result[-1:]
            op.seconds = req.op_seconds
            req.op, req.reply = None, result

    # -- a request's end ------------------------------------------------------------------------------
    def _finish(self, req: Request, exc: BaseException | None = None) -> None:
        if req.done:
            return
        req.done = True
        if exc is not None:
            req.emit("error", exc)
        slot = req.slot
        if slot is not None:
            self._running.pop(slot.seq, None)
            self._fed.pop(slot.seq, None)
            self.pool.release(slot)
            if exc is None:  # a request served: how long it held its slot (Retry-After)
                took = time.monotonic() - (req.admitted or req.arrived)
                self.service_s = 0.8 * self.service_s + 0.2 * took if self.served else took
                self.served += 1
        req.emit("end", None)

    def _drop(self, req: Request, timed_out: bool = False) -> None:
        """A request that never got a slot: its generator closed; a timed-out one is told so."""
        req.ops.close()
        if timed_out:
            req.emit("error", TimeoutError("the request timed out waiting in the queue; try again later"))
        req.done = True
        req.emit("end", None)

    def _refuse_waiting(self) -> None:
        """Stopping: requests that have no slot yet are refused."""
        for req in [*self._new, *self._queued]:
            req.ops.close()
            req.done = True
            req.emit("error", ShuttingDown("the engine is stopping: the request was not started"))
            req.emit("end", None)
        self._new, self._queued = [], collections.deque()

    # -- the batch pricing ------------------------------------------------------------------------------
    def draft_cap(self, seq: int) -> int | None:
        """How many tokens ``seq`` may draft this round (None: no cap, nothing else decoding), priced
        against what the others feed it: this round's parts so far, else each one's last part."""
        if self.pricing is None:
            return None
        decoding = [s for s, r in self._running.items() if r.wait is None]
        if len(decoding) <= 1:
            return None
        others = {}
        for s in decoding:
            if s != seq:
                n, want = self._round.get(s) or self._next_part(s)
                others[s] = (n, self.pricing.expected(s, n, want))
        return self.pricing.best_draft(seq, others, self.pricing.max_draft)

    def _next_part(self, seq: int) -> tuple[int, str]:
        """(tokens, want) of what ``seq`` will feed, as far as is known: one like its last (after a
        prompt's last chunk, a one-token step; before any part, one token)."""
        n, want = self._fed.get(seq, (1, "all"))
        if want == "last":
            return 1, "all"
        return n, want

    def settled(self, seq: int, drafted: int, accepted: int) -> None:
        """``seq``'s last verify fed ``drafted`` drafted tokens and the model kept ``accepted`` of
        them (told by its loop: :func:`promptlookup.speculate.step_ops`): the pricing learns from it."""
        if self.pricing is not None and seq in self._running:
            self.pricing.observe(seq, drafted, accepted)


class ShuttingDown(BackendError):
    """The engine stopped while the request ran or waited."""
