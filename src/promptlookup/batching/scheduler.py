"""The rounds of continuous batching: every running sequence's next decode, in one forward.

How a round forms: each request runs its own speculative loop on its own thread, against a
:class:`SlotDecoder`. A decode call (a prompt chunk, a verify) hands its part to the
:class:`Scheduler` and waits. A sequence is *busy* while its thread computes (drafting, sampling,
text) and stops being busy when it waits for a round, when its request hands a chunk to its consumer
(:meth:`Scheduler.park`), or when the request ends. The round starts as soon as no sequence is busy:
every running sequence that has something to decode is in it, and nobody waits long for a consumer
that is slow to read: a sequence parked when a round could start gets :data:`PARK_GRACE` to come
back and join it (without it, one whose consumer took a moment missed the round and waited a whole
one: 4 streaming clients ran 2.9-3.2 sequences a round with drafting on, 3.7 with it off).
One thread of the scheduler's own runs every forward (``decode_many``) and hands
every part its result; a new request joins at the next round. (A thread of its own rather than
whichever request completed the round: no request's thread is held up by a forward it merely
completed, and the forwards come from one place, as llama.cpp's OpenMP build prefers:
:mod:`promptlookup.backends.compute_thread`.) What a verify accepted is counted by the request's own
loop, which tells the scheduler (:meth:`Scheduler.settled`): the pricing learns acceptance from that.

Prompts are split into chunks of at most ``prefill_chunk`` tokens, one chunk per round, so a long
prompt costs the running sequences one chunk's time per round instead of the whole prompt's.

A prompt that opens like one an earlier running request is still reading waits for that request to
read the shared part and copies it (:meth:`Scheduler.copy_in_flight`) rather than compute it in the
same rounds: requests that arrive together (an agent's parallel calls, users of one system prompt)
then pay for their common opening once.

A part the backend refuses (a context overflow, a bad token) fails alone: when a forward is refused,
each of its parts is decoded alone, so only the part at fault gets the error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from promptlookup.backends.base import BackendError, BatchDecoder, SeqDecode, check_keep, common_prefix
from promptlookup.batching.pricing import BatchCost, DraftPricing
from promptlookup.sampling import Sampler

PARK_GRACE = 0.002  # seconds a round waits for a sequence whose chunk is with its consumer
DEFAULT_PREFILL_CHUNK = 128  # prompt tokens per round: about 4 one-token decodes of the bundled model


@dataclass(eq=False)
class _Ticket:
    part: SeqDecode
    result: list[int] | None = None
    error: BaseException | None = None
    done: bool = False


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


class Scheduler:
    """Rounds over one :class:`~promptlookup.backends.base.BatchDecoder`; see the module docstring.

    ``cost``: seconds of a forward of ``n`` tokens (the backend's cost curve), the prior of the
    batch pricing; None: drafts are never capped. ``clock`` times the rounds (injected by tests)."""

    def __init__(self, backend: BatchDecoder, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 cost: Callable[[int], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter, park_grace: float = PARK_GRACE) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.backend = backend
        self.prefill_chunk = min(prefill_chunk, backend.n_batch)
        self.pricing = (DraftPricing(BatchCost(cost), forwards=backend.forward_sizes)
                        if cost is not None else None)
        self.clock = clock
        self.park_grace = park_grace
        self.stats = RoundStats()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # requests wait here for their part's result
        self._ready = threading.Condition(self._lock)  # the forward thread waits here for a round
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._running: set[int] = set()  # sequences with a request in progress
        self._busy: set[int] = set()  # ... whose thread is computing (a round waits for these)
        self._pending: dict[int, _Ticket] = {}
        self._leading = False
        self._fed: dict[int, tuple[int, str]] = {}  # running seq: (tokens, want) of the last part it fed
        self._prompts: dict[int, tuple[int, Sequence[int]]] = {}  # running seq: (its request's order, prompt)
        self._opened = 0
        self._waiting: set[int] = set()  # running sequences waiting for another's prefix
        self.prefix_waits = 0  # prompts that waited for an earlier request to read their opening
        self.prefix_copies = 0  # prompts that started from another sequence's copied prefix
        self.prefix_copied_tokens = 0

    # -- a request's life on a sequence ---------------------------------------------------------
    def open(self, seq: int, prompt: Sequence[int] = ()) -> None:
        """A request starts on ``seq`` (its thread is busy from now on); ``prompt``: its prompt, which
        later requests may wait for and copy (:meth:`copy_in_flight`)."""
        if not 0 <= seq < self.backend.n_seq:
            raise BackendError(f"sequence {seq} is outside 0..{self.backend.n_seq - 1}")
        with self._cv:
            if seq in self._running:
                raise BackendError(f"sequence {seq} already runs a request")
            self._running.add(seq)
            self._busy.add(seq)
            self._opened += 1
            self._prompts[seq] = (self._opened, prompt)
            if self.pricing is not None:
                self.pricing.start(seq)

    def close(self, seq: int) -> None:
        """The request on ``seq`` ended: the rounds stop waiting for it."""
        with self._cv:
            self._running.discard(seq)
            self._busy.discard(seq)
            self._pending.pop(seq, None)
            self._prompts.pop(seq, None)
            self._fed.pop(seq, None)
            self._wake()
            self._cv.notify_all()  # a request waiting for this one's prefix stops waiting

    def park(self, seq: int) -> None:
        """``seq``'s thread leaves the engine for a while (a chunk handed to its consumer)."""
        with self._cv:
            self._busy.discard(seq)
            self._wake()

    def unpark(self, seq: int) -> None:
        with self._cv:
            if seq in self._running:
                self._busy.add(seq)

    @property
    def running(self) -> int:
        return len(self._running)

    # -- decoding ---------------------------------------------------------------------------------
    def decode(self, part: SeqDecode) -> list[int]:
        """``part`` decoded in the next round (called by its sequence's thread; blocks until done)."""
        ticket = _Ticket(part)
        with self._cv:
            if part.seq not in self._running:
                raise BackendError(f"sequence {part.seq} has no request running (open it first)")
            if part.seq in self._pending:
                raise BackendError(f"sequence {part.seq} already waits for a round")
            if self._stopped:
                raise BackendError("the engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="promptlookup-forward", daemon=True)
                self._thread.start()
            self._pending[part.seq] = ticket
            self._fed[part.seq] = (len(part.ids), part.want)
            self._busy.discard(part.seq)
            self._wake()
            while not ticket.done:
                self._cv.wait()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _wake(self) -> None:
        """Start a round if one is due: no running request computing, some part waiting (lock held)."""
        if not self._busy and self._pending and not self._leading:
            self._ready.notify()

    def _loop(self) -> None:
        """The forward thread: one round whenever one is due, until :meth:`stop`."""
        with self._lock:
            while True:
                graced = False
                while True:
                    while not self._stopped and (self._leading or self._busy or not self._pending):
                        self._ready.wait()
                    if self._stopped or graced or self.park_grace <= 0 or not self._parked():
                        break
                    graced = True  # once per round: a consumer holding its chunk costs a round 2 ms at most
                    self._ready.wait(self.park_grace)
                if self._stopped:
                    for t in self._pending.values():
                        t.error, t.done = BackendError("the engine is closed"), True
                    self._pending.clear()
                    self._cv.notify_all()
                    return
                self._lead()

    def _parked(self) -> bool:
        """Whether a running sequence is neither computing nor waiting: its chunk is with its consumer."""
        return any(s not in self._busy and s not in self._pending and s not in self._waiting
                   for s in self._running)

    def stop(self) -> None:
        """End the forward thread (requests still waiting get a BackendError); idempotent."""
        with self._lock:
            self._stopped = True
            self._ready.notify_all()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(60)

    def _lead(self) -> None:
        """Run one round over every pending part (called with the lock held; releases it meanwhile)."""
        tickets = list(self._pending.values())
        self._pending.clear()
        self._leading = True
        self._cv.release()
        try:
            self._forward(tickets)
        finally:
            self._cv.acquire()
            self._leading = False
            for t in tickets:
                t.done = True
                if t.part.seq in self._running:  # busy from now: the next round waits for its thread
                    self._busy.add(t.part.seq)
            self._cv.notify_all()

    def _forward(self, tickets: list[_Ticket]) -> None:
        parts = [t.part for t in tickets]
        t0 = self.clock()
        try:
            results = self.backend.decode_many(parts)
        except BackendError as exc:
            if len(tickets) == 1:
                tickets[0].error = exc
                return
            for t in tickets:  # the forward was refused whole: find the part at fault
                try:
                    t.result = self.backend.decode_many([t.part])[0]
                except BackendError as exc:
                    t.error = exc
            return
        except BaseException as exc:  # an unexpected failure reaches every part's request
            for t in tickets:
                t.error = exc
            return
        seconds = self.clock() - t0
        tokens = sum(len(p.ids) for p in parts)
        self.stats.add(len(parts), tokens, seconds)
        for t, r in zip(tickets, results, strict=True):
            t.result = r
        if self.pricing is not None:
            layout = tuple(sorted((p.seq, len(p.ids)) for p in parts))
            self.pricing.cost.observe(self.backend.forward_sizes(layout), seconds)

    def rollback(self, seq: int, n_keep: int) -> None:
        """Drop ``seq``'s cached positions from ``n_keep`` on, never while a round runs (rounds run
        with the lock released: this waits for the one in progress, and none starts meanwhile)."""
        with self._cv:
            while self._leading:
                self._cv.wait()
            self.backend.seq_rollback(seq, n_keep)

    def copy_prefix(self, src: int, dst: int, ids: Sequence[int], more_than: int) -> int:
        """Copy into ``dst`` (dropping its cache) the longest prefix of ``ids`` that ``src`` holds, if
        that is more than ``more_than`` positions; never while a round runs (as :meth:`rollback`).
        Returns the positions of ``ids`` that ``dst`` now holds, 0 when nothing was copied (``dst``
        untouched). What ``src`` holds is read here, under the lock: its request may have moved on
        since the caller looked."""
        with self._cv:
            while self._leading:
                self._cv.wait()
            return self._copy_held(src, dst, ids, more_than)

    def _copy_held(self, src: int, dst: int, ids: Sequence[int], more_than: int) -> int:
        """The copy of :meth:`copy_prefix` and :meth:`copy_in_flight`, with the lock held and no round
        running: what ``src`` holds of ``ids`` goes to ``dst`` if it is more than ``more_than``."""
        n = common_prefix(self.backend.seq_tokens(src), ids)
        if n <= more_than:
            return 0
        self.backend.seq_copy(src, dst, n)
        self.prefix_copies += 1
        self.prefix_copied_tokens += n
        return n

    def copy_in_flight(self, dst: int, ids: Sequence[int], more_than: int) -> int | None:
        """If a request opened before ``dst``'s and still running has a prompt that shares more than
        ``more_than`` positions with ``ids``, wait (out of the rounds) until its sequence holds that
        prefix, or its request ends, then copy what it holds of it into ``dst`` (dropping ``dst``'s
        cache) if that is still more than ``more_than``. Returns the positions of ``ids`` that
        ``dst`` now holds; 0 when it waited and copied nothing, None when there was nothing to wait
        for (``dst`` untouched either way: after a wait, another cache may hold more than before).

        Waiting costs ``dst``'s request nothing it would not pay anyway: the earlier request reads
        the shared part one chunk a round, as ``dst`` would, and those rounds are shorter for not
        reading it twice. Only an earlier request is waited for, so two never wait for each other."""
        with self._cv:
            mine = self._prompts.get(dst)
            if mine is None:
                raise BackendError(f"sequence {dst} has no request running (open it first)")
            src, want = -1, more_than
            for seq, (order, prompt) in self._prompts.items():
                if order < mine[0]:
                    n = common_prefix(prompt, ids)
                    if n > want:
                        src, want = seq, n
            if src < 0:
                return None
            order = self._prompts[src][0]
            self.prefix_waits += 1
            self._waiting.add(dst)
            self._busy.discard(dst)
            self._wake()
            try:
                while not self._stopped and self._prompts.get(src, (None,))[0] == order and (
                        self._leading or len(self.backend.seq_tokens(src)) < want
                        or common_prefix(self.backend.seq_tokens(src), ids) < want):
                    self._cv.wait()
                while self._leading:
                    self._cv.wait()
                if self._stopped:
                    raise BackendError("the engine is closed")
            finally:
                self._waiting.discard(dst)
                if dst in self._running:
                    self._busy.add(dst)
            return self._copy_held(src, dst, ids, more_than)

    def settled(self, seq: int, drafted: int, accepted: int) -> None:
        """``seq``'s last verify fed ``drafted`` drafted tokens and the model kept ``accepted`` of them
        (told by its loop, which compared them: :func:`promptlookup.speculate.steps`): the pricing
        learns the sequence's acceptance from it."""
        if self.pricing is None:
            return
        with self._cv:
            if seq in self._running:
                self.pricing.observe(seq, drafted, accepted)

    def draft_cap(self, seq: int) -> int | None:
        """How many tokens ``seq`` may draft for the next round (None: no cap, no other sequence
        decoding), priced against what the others feed it (:meth:`_next_part`,
        :meth:`DraftPricing.best_draft`)."""
        if self.pricing is None:
            return None
        with self._cv:
            decoding = self._running - self._waiting  # a sequence waiting for a prefix feeds nothing
            if len(decoding) <= 1:
                return None
            others = {}
            for s in decoding:
                if s != seq:
                    n, want = self._next_part(s)
                    others[s] = (n, self.pricing.expected(s, n, want))
            return self.pricing.best_draft(seq, others, self.pricing.max_draft)

    def _next_part(self, seq: int) -> tuple[int, str]:
        """(tokens, want) of what ``seq`` feeds the next round, as far as is known (lock held): the part
        it waits with; else, while its thread computes, one like its last (after a prompt's last
        chunk, a one-token step; before any part, one token)."""
        n, want = self._fed.get(seq, (1, "all"))  # what it waits with, once it waits (decode sets it)
        if want == "last" and seq not in self._pending:
            return 1, "all"
        return n, want


class SlotDecoder:
    """The :class:`~promptlookup.backends.base.Decoder` of one sequence of a batched backend: what a
    request's speculative loop runs on. Every decode and rollback goes through the scheduler, so
    nothing touches the backend while a round runs."""

    def __init__(self, scheduler: Scheduler, seq: int) -> None:
        self.scheduler = scheduler
        self.seq = seq
        self.backend = scheduler.backend
        self.n_ctx = int(self.backend.n_ctx)

    @property
    def n_past(self) -> int:
        return len(self.backend.seq_tokens(self.seq))

    @property
    def tokens(self) -> list[int]:
        return list(self.backend.seq_tokens(self.seq))

    def is_eog(self, token: int) -> bool:
        return self.backend.is_eog(token)

    def read(self, ids: Sequence[int], keep: int) -> None:
        """Feed prompt ``ids[keep:]`` (at most ``prefill_chunk`` tokens; the cache holds ``ids[:keep]``)
        with no logits: one of :meth:`prefill`'s rounds, for a caller that looks between them (the
        engine, for a cancel or a deadline)."""
        self._feed(ids, keep, "none", None)

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        chunk = self.scheduler.prefill_chunk
        while len(ids) - keep > chunk:
            self.read(ids[:keep + chunk], keep)
            keep += chunk
        return self._feed(ids, keep, "last", sampler)[-1]

    def _feed(self, ids: Sequence[int], keep: int, want: str, sampler: Sampler | None) -> list[int]:
        """One round of prompt ``ids[keep:]`` on a cache that must hold ``ids[:keep]`` (anything after
        it dropped first)."""
        check_keep(self.backend.seq_tokens(self.seq), ids, keep)
        self.rollback(keep)
        return self.scheduler.decode(SeqDecode(self.seq, list(ids[keep:]), want, sampler))

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        return self.scheduler.decode(SeqDecode(self.seq, list(ids), "all", sampler))

    def rollback(self, n_keep: int) -> None:
        self.scheduler.rollback(self.seq, n_keep)

    def draft_cap(self) -> int | None:
        return self.scheduler.draft_cap(self.seq)

    def settled(self, drafted: int, accepted: int) -> None:
        self.scheduler.settled(self.seq, drafted, accepted)
