"""An incremental index for ``--ngram``: the best suffix match in O(log max_match) probes, not O(context).

Why: the backward scan of :func:`promptlookup.drafting.suffix.suffix_match` reads the whole context on
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
16-byte row (key, length and end), so a probe costs one cache line. Indexing is lazy:
a query first indexes the ends added since the last one. Memory: at most 2 * max_match slots of 16
bytes per context token (16 MiB at 32k tokens with max_match 16).
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
def _same(corpus, a, b, length):
    """Do the ``length`` tokens ending at ``a`` equal those ending at ``b``?"""
    for j in range(length):  # noqa: SIM110 (numba: no generators)
        if corpus[a - j] != corpus[b - j]:
            return False
    return True


# A slot is one 16-byte row, so a probe touches one cache line: tab[i, 0] the key (``_mix``, as int64),
# tab[i, 1] = length << 32 | end, or -1 when the slot is empty.
# ``state`` (int64): [0] entries, [1] scratch, [2] max_match, [3] ends indexed, [3 + l] key of length l.
_ENTRIES, _SCRATCH, _MAX_MATCH, _INDEXED, _KEYS = 0, 1, 2, 3, 3


@njit(cache=True, inline="always")
def _touch(tab, state, top, mask):
    """Load the first slot of every level at once: independent loads overlap their cache misses, so
    the probes that follow (one after another) find their lines in cache."""
    acc = np.int64(0)
    for length in range(1, top + 1):
        acc ^= tab[np.int64(np.uint64(state[_KEYS + length]) & np.uint64(mask)), 1]
    state[_SCRATCH] = acc  # keeps the loads


@njit(cache=True)
def _insert_ends(corpus, start, stop, tab, state):
    """Index ends ``start .. stop-1``."""
    mask = tab.shape[0] - 1
    max_match = state[_MAX_MATCH]
    for e in range(start, stop):
        h = np.uint64(0)
        top = min(max_match, e + 1)
        for length in range(1, top + 1):
            h = _step(h, corpus[e - length + 1])
            state[_KEYS + length] = np.int64(_mix(h, length))
        _touch(tab, state, top, mask)
        fresh = False  # once an l-gram is new, every longer one ending at e is new too
        for length in range(1, top + 1):
            ikey = state[_KEYS + length]
            i = np.int64(np.uint64(ikey) & np.uint64(mask))
            val = (np.int64(length) << 32) | e
            while True:
                v = tab[i, 1]
                if v < 0:
                    tab[i, 0] = ikey
                    tab[i, 1] = val
                    state[_ENTRIES] += 1
                    fresh = True
                    break
                if (not fresh and tab[i, 0] == ikey and (v >> 32) == length
                        and _same(corpus, v & 0xFFFFFFFF, e, length)):
                    tab[i, 1] = val
                    break
                i = (i + 1) & mask


@njit(cache=True)
def _lookup(corpus, last, length, ikey, tab):
    """Most recent indexed end of the ``length``-gram ending at ``last`` (table key ``ikey``), or -1."""
    mask = tab.shape[0] - 1
    i = np.int64(np.uint64(ikey) & np.uint64(mask))
    while True:
        v = tab[i, 1]
        if v < 0:
            return -1
        if tab[i, 0] == ikey and (v >> 32) == length and _same(corpus, v & 0xFFFFFFFF, last, length):
            return v & 0xFFFFFFFF
        i = (i + 1) & mask


@njit(cache=True)
def _query(corpus, n, tab, state):
    """(match_end, match_len) for ``corpus[:n]`` with ends ``0..n-2`` indexed; (-1, 0) when none."""
    last = n - 1
    top = min(state[_MAX_MATCH], n - 1)
    h = np.uint64(0)
    for length in range(1, top + 1):
        h = _step(h, corpus[last - length + 1])
        state[_KEYS + length] = np.int64(_mix(h, length))
    _touch(tab, state, top, tab.shape[0] - 1)
    lo, lo_end = 0, np.int64(-1)  # the longest length known to occur, and where
    hi = top  # lengths above hi are known not to occur
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        e = _lookup(corpus, last, mid, state[_KEYS + mid], tab)
        if e >= 0:
            lo, lo_end = mid, e
        else:
            hi = mid - 1
    return lo_end, lo


@njit(cache=True)
def _index_and_query(corpus, n, tab, state):
    """Index the ends up to ``n-2`` not yet in the table, then answer for ``corpus[:n]``: one call."""
    if n - 1 > state[_INDEXED]:
        _insert_ends(corpus, state[_INDEXED], n - 1, tab, state)
        state[_INDEXED] = n - 1
    return _query(corpus, n, tab, state)


@njit(cache=True)
def _rehash(tab, old):
    mask = tab.shape[0] - 1
    for j in range(old.shape[0]):
        if old[j, 1] < 0:
            continue
        i = np.int64(np.uint64(old[j, 0]) & np.uint64(mask))
        while tab[i, 1] >= 0:
            i = (i + 1) & mask
        tab[i, 0] = old[j, 0]
        tab[i, 1] = old[j, 1]


class SuffixIndex:
    """The index over one growing int32 buffer; the owner passes the buffer and its length each call."""

    def __init__(self, max_match: int, capacity: int = 1 << 12) -> None:
        if not 1 <= max_match <= 127:
            raise ValueError(f"max_match must be 1..127, got {max_match}")
        self.max_match = max_match
        cap = 16
        while cap < capacity:
            cap *= 2
        self._tab = np.full((cap, 2), -1, dtype=np.int64)
        self._state = np.zeros(_KEYS + max_match + 1, dtype=np.int64)
        self._state[_MAX_MATCH] = max_match
        # Python mirrors, so the per-call capacity check reads no array
        self._indexed = 0  # ends 0 .. _indexed-1 are in the table
        self._bound = 0  # entries, at most
        self._half = cap // 2

    def reset(self) -> None:
        self._tab[:, 1] = -1
        self._state[_ENTRIES] = self._state[_INDEXED] = 0
        self._indexed = self._bound = 0

    def _grow(self, need: int) -> None:
        cap = len(self._tab)
        while cap < 2 * need:
            cap *= 2
        old = self._tab
        self._tab = np.full((cap, 2), -1, dtype=np.int64)
        _rehash(self._tab, old)
        self._half = cap // 2

    def match(self, corpus: np.ndarray, n: int) -> tuple[int, int]:
        """``(match_end, match_len)`` of ``corpus[:n]``, as :func:`suffix_match_reference` defines it.

        ``corpus[:n]`` must extend what earlier calls saw (call :meth:`reset` when it does not).
        """
        if n < 2:
            return -1, 0
        if n - 1 > self._indexed:
            self._bound += self.max_match * (n - 1 - self._indexed)
            if self._bound > self._half:  # keep the table at most half full
                self._bound = int(self._state[_ENTRIES]) + self.max_match * (n - 1 - self._indexed)
                if self._bound > self._half:
                    self._grow(self._bound)
            self._indexed = n - 1
        return _index_and_query(corpus, n, self._tab, self._state)
