"""The slots of an engine: one per request it can run at once, each with its own decoder and sources.

Why slots: a request's draft sources hold that request's state (its confirmed tokens, its match
positions), so two requests running together need two of each; what they learn across requests (the
suffix history, the caches) is shared by every slot's sources, and a lock (:class:`GuardedSource`)
keeps one slot from reading the history while another adds a finished request to it. A new request
takes the free slot whose cache shares the longest prefix with its prompt (a conversation re-sent
with a new turn lands where its earlier turns are cached); else the slot that keeps the running
sequences' ids consecutive (llama.cpp computes sequences with a gap between their ids in separate
forwards), then an empty one, then the one idle longest.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.backends.base import Decoder, common_prefix
from promptlookup.drafting.base import Draft, DraftSource, StepFeedback


@dataclass(eq=False)
class Slot:
    """One request at a time: ``seq`` (its sequence in the backend), the decoder its loop runs on, its
    sources by spec label, and whether its cache is known to hold ``decoder.tokens``."""

    seq: int
    decoder: Decoder
    sources: dict[str, Any] = field(default_factory=dict)
    cache_valid: bool = False
    last_used: int = 0


class SlotPool:
    """Free slots handed out by prompt affinity; :meth:`acquire` waits while every slot is taken."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        if not slots:
            raise ValueError("a slot pool needs at least one slot")
        self.slots = list(slots)
        self._free = list(slots)
        self._cv = threading.Condition()
        self._tick = itertools.count(1)

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def busy(self) -> int:
        return len(self.slots) - len(self._free)

    def acquire(self, ids: Sequence[int], reuse_prefix: bool = True) -> tuple[Slot, int]:
        """A free slot for prompt ``ids`` and how many of its cached positions the prompt can keep.

        A slot *continues* the prompt when the prompt keeps some of its cache and at least half of it
        (a conversation re-sent with a new turn): the one that keeps the most wins. Else the slot
        whose sequence leaves the fewest runs of consecutive ids among the running ones (each run is
        a forward of its own on llama.cpp: with 4 requests on sequences 0, 2, 5, 7 of 8 every round
        is 4 forwards), then one the prompt *fits* (an empty one, or one it keeps half of: so a prompt
        that shares only the chat template's opening goes to an empty slot rather than overwrite a
        long cached prompt that a later request may re-send), then the one idle longest."""
        with self._cv:
            while not self._free:
                self._cv.wait()
            running = {slot.seq for slot in self.slots if slot not in self._free}
            best, best_key, keep = None, None, 0
            for slot in self._free:
                tokens = slot.decoder.tokens if reuse_prefix and slot.cache_valid else ()
                cached = len(tokens)
                k = common_prefix(tokens, ids) if cached else 0
                fits = 2 * k >= cached
                continues = fits and k > 0
                gaps = runs(running | {slot.seq})
                key = (continues, k if continues else 0, -gaps, fits, k, -slot.last_used)
                if best_key is None or key > best_key:
                    best, best_key, keep = slot, key, k
            assert best is not None
            self._free.remove(best)
            best.last_used = next(self._tick)
            return best, keep

    def best_donor(self, ids: Sequence[int], taker: Slot) -> tuple[Slot | None, int]:
        """The other slot, busy or free, whose cache shares the longest prefix with prompt ``ids``,
        and that length (``taker``'s own is what :meth:`acquire` counted): where it is longer, the
        prefix is copied rather than computed again (many requests open with one system prompt, one
        file, one tool list). Read without the pool's lock: a busy slot's cache only grows or rolls
        back its drafts meanwhile, and :meth:`Scheduler.copy_prefix` reads it again under its own."""
        best, best_n = None, 0
        for slot in self.slots:
            if slot is taker:
                continue
            n = common_prefix(slot.decoder.tokens, ids)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def release(self, slot: Slot) -> None:
        with self._cv:
            if slot not in self._free:
                self._free.append(slot)
            self._cv.notify()


def runs(seqs: set[int]) -> int:
    """Runs of consecutive ids in ``seqs`` ({0, 1, 3}: two)."""
    return sum(1 for s in seqs if s - 1 not in seqs)


class GuardedSource:
    """A slot's draft source, every call made under the lock of what all slots' sources share (the
    suffix history, lookup's caches): one slot's commit never runs while another reads them."""

    def __init__(self, source: DraftSource, lock: threading.RLock) -> None:
        self.inner = source
        self.name = source.name
        self._lock = lock

    def reset(self, prompt: Sequence[int]) -> None:
        with self._lock:
            self.inner.reset(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        with self._lock:
            self.inner.extend(tokens)

    def propose(self, k: int) -> Draft:
        with self._lock:
            return self.inner.propose(k)

    def propose_forced(self, k: int, forced: Sequence[int], valid: Any, after: Any = None) -> Draft | None:
        """The inner source's ``propose_forced`` (``auto``'s, :mod:`promptlookup.drafting.forced`)
        under the lock; None where it has none (the grammar layer then merges a plain proposal)."""
        weigh = getattr(self.inner, "propose_forced", None)
        if weigh is None:
            return None
        with self._lock:
            return weigh(k, forced, valid, after)

    def commit(self) -> None:
        with self._lock:
            self.inner.commit()

    def feedback(self, step: StepFeedback) -> None:
        with self._lock:
            self.inner.feedback(step)

    def report(self) -> dict | None:
        from promptlookup.drafting.base import report_of

        with self._lock:
            return report_of(self.inner)
