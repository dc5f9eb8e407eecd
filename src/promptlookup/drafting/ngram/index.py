"""An incremental index for ``--ngram``: the longest earlier match of the text's end in O(log max_match)
probes, not O(context).

Why: the backward scan of :func:`promptlookup.drafting.ngram.source.ngram_match` reads the whole context on
every call (tens of microseconds at 32k tokens). The rule (longest match, capped at ``max_match``,
most recent among equals, no self-match) only needs, for each length l <= max_match, the most recent
earlier position where the current l-token suffix ended. So every position e is indexed once, under
each of the l-grams that end there (l = 1..max_match), and the table keeps the most recent e per
l-gram. A query is then a binary search on l, since "the l-gram suffix occurred before" is monotone
(an occurrence of length l contains one of length l - 1, ending at the same place):

- the largest l found is the match length (capped at ``max_match``, as the scan caps it);
- the stored end for that l-gram is the most recent end whose match reaches l, which is the scan's
  tie rule: if l < max_match no end reaches further, and at the cap every end that reaches it ties;
- only ends strictly before the corpus end are indexed, so the suffix never matches itself.

The table is open addressing keyed by (l, 64-bit hash); an entry is trusted only after its tokens are
compared with the query's, so a hash collision costs a probe, never a wrong answer. A slot is one
int64 (a 24-bit tag of the key, the length and the end), so a probe reads 8 bytes. Indexing is lazy:
a query first indexes the ends added since the last one, all in one compiled call (:func:`draft_span`
also gates and clips the draft). The table stays at most half full; when it grows it leaves room for
the context to grow by half again, so a long prompt sizes it once and generation rarely stops to
rehash. Memory: at most 6 * max_match slots of 8 bytes per context token (16 MiB at 32k tokens with
max_match 16).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xBF58476D1CE4E5B9)
_K3 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _step(h, tok):
    """Extend the hash of an l-gram by the token before it (hashes are built right to left)."""
    h = (h ^ np.uint64(np.uint32(tok))) * _K2
    h ^= h >> np.uint64(31)
    return h * _K3


@njit(cache=True, inline="always")
def _mix(h, length):
    """The table key of an l-gram: its hash mixed with its length."""
    x = h ^ (np.uint64(length) * _K1)
    return x ^ (x >> np.uint64(29))


@njit(cache=True, inline="always")
def _tag(key, length):
    """A slot's upper half: the key's top 24 bits (its low bits pick the slot) and the length (7 bits).
    31 bits, so a slot (``tag << 32 | end``) is positive, and 0 can mean empty."""
    return (np.int64(np.uint64(key) >> np.uint64(40)) << 7) | length


@njit(cache=True, inline="always")
def _same(corpus, a, b, length):
    """Do the ``length`` tokens ending at ``a`` equal those ending at ``b``?"""
    for j in range(length):  # noqa: SIM110 (numba: no generators)
        if corpus[a - j] != corpus[b - j]:
            return False
    return True


# ``tab`` (int64, a power of two long): 0 when a slot is empty, else ``_tag(key, length) << 32 | end``.
# ``state`` (int64): [0] entries, [1] scratch, [2] max_match, [3] ends indexed, [4] min_match (the
# gate :func:`draft_span` applies), [5] the end whose keys [5 + l] (l = 1..max_match) hold, or -1.
_ENTRIES, _SCRATCH, STATE_MAX_MATCH, _INDEXED, STATE_MIN_MATCH, _HASHED, KEYS = 0, 1, 2, 3, 4, 5, 5
_END = 0xFFFFFFFF
_LEN = 0x7F


@njit(cache=True, inline="always")
def _hash_keys(corpus, last, top, state):
    """Keys of the l-grams ending at ``last``, l = 1..top, into ``state``."""
    h = np.uint64(0)
    for length in range(1, top + 1):
        h = _step(h, corpus[last - length + 1])
        state[KEYS + length] = np.int64(_mix(h, length))
    state[_HASHED] = last


@njit(cache=True, inline="always")
def _touch(tab, state, top, mask):
    """Load the first slot of every level at once: independent loads overlap their cache misses, so
    the probes that follow (one after another) find their lines in cache."""
    acc = np.int64(0)
    for length in range(1, top + 1):
        acc ^= tab[np.int64(np.uint64(state[KEYS + length]) & np.uint64(mask))]
    state[_SCRATCH] = acc  # keeps the loads


@njit(cache=True)
def _index_ends(corpus, stop, tab, state):
    """Index the ends from ``state[_INDEXED]`` up to ``stop - 1``. Stops early, returning False, before
    an end whose l-grams could fill the table past half (the caller grows it and calls again)."""
    mask = tab.shape[0] - 1
    max_match = state[STATE_MAX_MATCH]
    for e in range(state[_INDEXED], stop):
        top = min(max_match, e + 1)
        if 2 * (state[_ENTRIES] + top) > tab.shape[0]:
            return False
        # the last query hashed the l-grams ending at e, unless e < max_match (it stopped at e)
        if e != state[_HASHED] or e < max_match:
            _hash_keys(corpus, e, top, state)
        _touch(tab, state, top, mask)
        fresh = False  # once an l-gram is new, every longer one ending at e is new too
        for length in range(1, top + 1):
            key = state[KEYS + length]
            tag = _tag(key, length)
            i = np.int64(np.uint64(key) & np.uint64(mask))
            val = (tag << 32) | e
            while True:
                v = tab[i]
                if v == 0:
                    tab[i] = val
                    state[_ENTRIES] += 1
                    fresh = True
                    break
                if not fresh and (v >> 32) == tag and _same(corpus, v & _END, e, length):
                    tab[i] = val
                    break
                i = (i + 1) & mask
        state[_INDEXED] = e + 1
    return True


@njit(cache=True)
def _lookup(corpus, last, length, key, tab):
    """Most recent indexed end of the ``length``-gram ending at ``last`` (table key ``key``), or -1."""
    mask = tab.shape[0] - 1
    i = np.int64(np.uint64(key) & np.uint64(mask))
    tag = _tag(key, length)
    while True:
        v = tab[i]
        if v == 0:
            return -1
        if (v >> 32) == tag and _same(corpus, v & _END, last, length):
            return v & _END
        i = (i + 1) & mask


@njit(cache=True)
def _query(corpus, n, tab, state):
    """(match_end, match_len) for ``corpus[:n]`` with ends ``0..n-2`` indexed; (-1, 0) when none."""
    last = n - 1
    top = min(state[STATE_MAX_MATCH], n - 1)
    _hash_keys(corpus, last, top, state)  # the next call indexes ``last`` with them
    _touch(tab, state, top, tab.shape[0] - 1)
    lo, lo_end = 0, np.int64(-1)  # the longest length known to occur, and where
    hi = top  # lengths above hi are known not to occur
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        e = _lookup(corpus, last, mid, state[KEYS + mid], tab)
        if e >= 0:
            lo, lo_end = mid, e
        else:
            hi = mid - 1
    return lo_end, lo


@njit(cache=True)
def _index_and_query(corpus, n, tab, state):
    """Index the ends up to ``n-2`` not yet in the table, then answer for ``corpus[:n]``: one call.
    ``(-1, -1)`` when the table must grow first (some ends may have been indexed)."""
    if n < 2:
        return np.int64(-1), np.int64(0)
    if n - 1 > state[_INDEXED] and not _index_ends(corpus, n - 1, tab, state):
        return np.int64(-1), np.int64(-1)
    return _query(corpus, n, tab, state)


@njit(cache=True)
def draft_span(corpus, n, k, tab, state):
    """The whole drafting call in one compiled call: index the ends up to ``n-2`` not yet in the table,
    find the best match of ``corpus[:n]``, apply the gate and clip the draft.

    Returns ``(start, stop, match_len)``: the draft is ``corpus[start:stop]``, empty (``start == stop``)
    when the match is shorter than ``state[STATE_MIN_MATCH]``, there is none, or ``k <= 0``. Returns
    ``(0, 0, -1)`` when the table must grow first (:meth:`NgramIndex.grow`; some ends may have been
    indexed): the caller grows it and calls again.
    """
    end, length = _index_and_query(corpus, n, tab, state)
    if length < 0:
        return 0, 0, -1
    if end < 0 or length < state[STATE_MIN_MATCH] or k <= 0:
        return 0, 0, length
    return end + 1, min(end + 1 + k, n), length


@njit(cache=True)
def _rehash(corpus, tab, old):
    """Move every entry of ``old`` into the empty ``tab``; the keys are hashed again from the corpus."""
    mask = tab.shape[0] - 1
    for j in range(old.shape[0]):
        v = old[j]
        if v == 0:
            continue
        end = v & _END
        length = (v >> 32) & _LEN
        h = np.uint64(0)
        for l in range(1, length + 1):  # noqa: E741
            h = _step(h, corpus[end - l + 1])
        i = np.int64(_mix(h, length) & np.uint64(mask))
        while tab[i] != 0:
            i = (i + 1) & mask
        tab[i] = v


class NgramIndex:
    """The index over one growing int32 buffer; the owner passes the buffer and its length each call.

    The table (``tab``) is replaced when it grows: a caller that keeps a reference to it refreshes it
    after :meth:`grow`.
    """

    def __init__(self, max_match: int, capacity: int = 1 << 12, min_match: int = 1) -> None:
        if not 1 <= max_match <= 127:
            raise ValueError(f"max_match must be 1..127, got {max_match}")
        self.max_match = max_match
        cap = 16
        while cap < capacity:
            cap *= 2
        self.tab = np.zeros(cap, dtype=np.int64)
        self.state = np.zeros(KEYS + max_match + 1, dtype=np.int64)
        self.state[STATE_MAX_MATCH] = max_match
        self.state[STATE_MIN_MATCH] = min_match
        self.state[_HASHED] = -1

    def reset(self) -> None:
        self.tab[:] = 0
        self.state[_ENTRIES] = self.state[_INDEXED] = 0
        self.state[_HASHED] = -1

    def grow(self, corpus: np.ndarray, n: int) -> None:
        """Double the table at least: room (at most half full) for the ends of ``corpus[:n]`` not yet
        indexed and for half as many tokens again as ``n``, so generation after a long prompt seldom
        has to stop for this."""
        need = int(self.state[_ENTRIES]) + self.max_match * (
            max(0, n - 1 - int(self.state[_INDEXED])) + n // 2
        )
        cap = 2 * len(self.tab)
        while cap < 2 * need:
            cap *= 2
        old = self.tab
        self.tab = np.zeros(cap, dtype=np.int64)
        _rehash(corpus, self.tab, old)

    def draft_span(self, corpus: np.ndarray, n: int, k: int) -> tuple[int, int, int]:
        """``(start, stop, match_len)``: the draft of up to ``k`` tokens for ``corpus[:n]`` is
        ``corpus[start:stop]``, empty when the best match is shorter than ``min_match`` (the gate).

        ``corpus[:n]`` must extend what earlier calls saw (call :meth:`reset` when it does not).
        """
        while True:
            span = draft_span(corpus, n, k, self.tab, self.state)
            if span[2] >= 0:
                return span
            self.grow(corpus, n)

    def match(self, corpus: np.ndarray, n: int) -> tuple[int, int]:
        """``(match_end, match_len)`` of ``corpus[:n]``, as :func:`ngram_match_reference` defines it.

        ``corpus[:n]`` must extend what earlier calls saw (call :meth:`reset` when it does not).
        """
        while True:
            end, length = _index_and_query(corpus, n, self.tab, self.state)
            if length >= 0:
                return end, length
            self.grow(corpus, n)
