"""The slots of an engine: one per request it can run at once, each with its own sources.

Why slots: a request's draft sources hold that request's state (its confirmed tokens, its match
positions), so two requests running together need two of each; what they learn across requests (the
suffix history, the caches) is shared by every slot's sources. Every slot's sources run on the engine
loop's one thread (:mod:`promptlookup.batching.engine_loop`), so nothing of theirs needs a lock. A
new request takes the free slot whose cache shares the longest prefix with its prompt (a conversation
re-sent with a new turn lands where its earlier turns are cached); else the slot that keeps the
running sequences' ids consecutive (llama.cpp computes sequences with a gap between their ids in
separate forwards), then an empty one, then the one idle longest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.backends.base import BatchDecoder, Decoder, common_prefix


@dataclass(eq=False)
class Slot:
    """One request at a time: ``seq`` (its sequence in the backend), ``view`` (what its loop reads and
    rolls back: :class:`SeqView`, or the backend itself when it holds one sequence), its sources by
    spec label, and whether its cache is known to hold the view's tokens."""

    seq: int
    view: Decoder | SeqView
    sources: dict[str, Any] = field(default_factory=dict)
    cache_valid: bool = False
    last_used: int = 0

    def tokens(self) -> Sequence[int]:
        return self.view.tokens


class SeqView:
    """One sequence of a batched backend, as the speculative loop reads it (``n_ctx``, ``n_past``,
    ``tokens``, ``is_eog``) and rolls it back; its forwards go through the engine loop."""

    def __init__(self, backend: BatchDecoder, seq: int) -> None:
        self.backend = backend
        self.seq = seq
        self.n_ctx = int(backend.n_ctx)

    @property
    def n_past(self) -> int:
        return len(self.backend.seq_tokens(self.seq))

    @property
    def tokens(self) -> list[int]:
        return list(self.backend.seq_tokens(self.seq))

    def is_eog(self, token: int) -> bool:
        return self.backend.is_eog(token)

    def rollback(self, n_keep: int) -> None:
        self.backend.seq_rollback(self.seq, n_keep)


class SlotPool:
    """Free slots handed out by prompt affinity (:meth:`choose`); only the engine loop's thread uses it."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        if not slots:
            raise ValueError("a slot pool needs at least one slot")
        self.slots = list(slots)
        self._free = list(slots)
        self._tick = itertools.count(1)

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def busy(self) -> int:
        return len(self.slots) - len(self._free)

    def choose(self, ids: Sequence[int], reuse_prefix: bool = True) -> tuple[Slot, int] | None:
        """A free slot for prompt ``ids`` and how many of its cached positions the prompt can keep;
        None while every slot is taken.

        A slot *continues* the prompt when the prompt keeps some of its cache and at least half of it
        (a conversation re-sent with a new turn): the one that keeps the most wins. Else the slot
        whose sequence leaves the fewest runs of consecutive ids among the running ones (each run is
        a forward of its own on llama.cpp: with 4 requests on sequences 0, 2, 5, 7 of 8 every round
        is 4 forwards), then one the prompt *fits* (an empty one, or one it keeps half of: so a prompt
        that shares only the chat template's opening goes to an empty slot rather than overwrite a
        long cached prompt that a later request may re-send), then the one idle longest."""
        if not self._free:
            return None
        running = {slot.seq for slot in self.slots if slot not in self._free}
        best, best_key, keep = None, None, 0
        for slot in self._free:
            tokens = slot.tokens() if reuse_prefix and slot.cache_valid else ()
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

    def release(self, slot: Slot) -> None:
        if slot not in self._free:
            self._free.append(slot)


def runs(seqs: set[int]) -> int:
    """Runs of consecutive ids in ``seqs`` ({0, 1, 3}: two)."""
    return sum(1 for s in seqs if s - 1 not in seqs)
