"""Prefix reuse across sequences: a new request whose prompt opens like what another sequence holds,
or is still reading, starts from a copy of that prefix instead of computing it again.

Why: many requests open with one system prompt, one file, one tool list (an agent's 32 tools are
4,484 tokens of Qwen2.5's template), and requests that arrive together (an agent's parallel calls,
users of one system prompt) would otherwise each read their common opening. The engine loop asks
:func:`plan` once a request has a slot, and either copies at once (:func:`copy_prefix`), or, where an
earlier running request is still reading a longer shared opening, holds the new request out of the
rounds until that sequence holds it (:meth:`PrefixPlan.ready`), then copies. Waiting costs the new
request nothing it would not pay anyway: the earlier request reads the shared part one chunk a round,
as the new one would, and those rounds are shorter for not reading it twice.

Only llama.cpp backends with several sequences copy (``BatchDecoder.seq_copy``); copying a KV stream
costs about what a dozen prompt tokens take to compute (the bundled model, 2048 positions per
sequence: docs/results.md), so shorter shared prefixes are computed (:data:`MIN_PREFIX_COPY`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from promptlookup.backends.base import BatchDecoder, common_prefix

#: positions a copy must add to what a request's own slot keeps
MIN_PREFIX_COPY = 32


@dataclass
class PrefixPlan:
    """Copy into ``dst`` what ``src`` holds of the prompt, once it holds ``want`` positions of it (or
    its request ended: ``src_alive`` says False); ``in_flight``: ``src``'s request is still reading
    them."""

    src: int
    dst: int
    want: int
    in_flight: bool

    def ready(self, backend: BatchDecoder, ids: Sequence[int], src_alive: Callable[[], bool]) -> bool:
        """Whether the copy can be made now: ``src`` holds the prefix, or will never hold more."""
        if not self.in_flight or not src_alive():
            return True
        return common_prefix(backend.seq_tokens(self.src), ids) >= self.want


def plan(ids: Sequence[int], dst: int, keep: int, cached: Mapping[int, Sequence[int]],
         reading: Mapping[int, Sequence[int]]) -> PrefixPlan | None:
    """Where prompt ``ids`` (on sequence ``dst``, which holds ``keep`` of its positions) should copy
    from: a running request's prompt (``reading``: sequence -> prompt) that shares more than any cache,
    by more than :data:`MIN_PREFIX_COPY`, and that its sequence does not hold yet; else the sequence
    (``cached``: sequence -> the ids it holds) that holds most of it, by more than
    :data:`MIN_PREFIX_COPY`. None: compute it."""
    best_cached, held = _longest(ids, dst, cached, 0)
    best_reading, want = _longest(ids, dst, reading, max(keep, held) + MIN_PREFIX_COPY)
    if best_reading is not None:
        return PrefixPlan(best_reading, dst, want, in_flight=True)
    if best_cached is not None and held > keep + MIN_PREFIX_COPY:
        return PrefixPlan(best_cached, dst, held, in_flight=False)
    return None


def _longest(ids: Sequence[int], dst: int, others: Mapping[int, Sequence[int]],
             more_than: int) -> tuple[int | None, int]:
    """The sequence other than ``dst`` whose ids share the longest prefix with ``ids``, if longer
    than ``more_than`` (the first of equals), and that length; else (None, ``more_than``)."""
    best, n_best = None, more_than
    for seq, tokens in others.items():
        if seq != dst:
            n = common_prefix(tokens, ids)
            if n > n_best:
                best, n_best = seq, n
    return best, n_best


def copy_prefix(backend: BatchDecoder, src: int, dst: int, ids: Sequence[int], more_than: int) -> int:
    """The one copy: ``dst`` gets (dropping its cache) the longest prefix of ``ids`` that ``src``
    holds, if that is more than ``more_than`` positions. Returns the positions of ``ids`` that ``dst``
    now holds; 0 when nothing was copied (``dst`` untouched)."""
    n = common_prefix(backend.seq_tokens(src), ids)
    if n <= more_than:
        return 0
    backend.seq_copy(src, dst, n)
    return n
