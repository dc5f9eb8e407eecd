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
compared with the query's, so a hash collision costs a probe, never a wrong answer. Indexing is lazy:
a query first indexes the ends added since the last one. Memory: about 2 * max_match slots of 16 bytes
per context token (16 MiB at 32k tokens with max_match 16).
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
def _slot(h, length, mask):
    x = h ^ (np.uint64(length) * _K1)
    x ^= x >> np.uint64(29)
    return np.int64(x & np.uint64(mask))


@njit(cache=True, inline="always")
def _same(corpus, a, b, length):
    """Do the ``length`` tokens ending at ``a`` equal those ending at ``b``?"""
    for j in range(length):  # noqa: SIM110 (numba: no generators)
        if corpus[a - j] != corpus[b - j]:
            return False
    return True


@njit(cache=True)
def _insert_ends(corpus, start, stop, max_match, t_hash, t_len, t_end, meta):
    """Index ends ``start .. stop-1``. ``meta[0]`` counts entries."""
    mask = t_end.shape[0] - 1
    for e in range(start, stop):
        h = np.uint64(0)
        fresh = False  # once an l-gram is new, every longer one ending at e is new too
        top = min(max_match, e + 1)
        for length in range(1, top + 1):
            h = _step(h, corpus[e - length + 1])
            i = _slot(h, length, mask)
            while True:
                s_end = t_end[i]
                if s_end < 0:
                    t_hash[i] = h
                    t_len[i] = length
                    t_end[i] = e
                    meta[0] += 1
                    fresh = True
                    break
                if (not fresh and t_len[i] == length and t_hash[i] == h
                        and _same(corpus, s_end, e, length)):
                    t_end[i] = e
                    break
                i = (i + 1) & mask


@njit(cache=True)
def _lookup(corpus, last, length, h, t_hash, t_len, t_end):
    """Most recent indexed end of the ``length``-gram ending at ``last`` (hash ``h``), or -1."""
    mask = t_end.shape[0] - 1
    i = _slot(h, length, mask)
    while True:
        s_end = t_end[i]
        if s_end < 0:
            return -1
        if t_len[i] == length and t_hash[i] == h and _same(corpus, s_end, last, length):
            return s_end
        i = (i + 1) & mask


@njit(cache=True)
def _query(corpus, n, max_match, t_hash, t_len, t_end, hashes):
    """(match_end, match_len) for ``corpus[:n]`` with ends ``0..n-2`` indexed; (-1, 0) when none."""
    last = n - 1
    top = min(max_match, n - 1)
    h = np.uint64(0)
    for length in range(1, top + 1):
        h = _step(h, corpus[last - length + 1])
        hashes[length] = h
    lo, lo_end = 0, -1  # the longest length known to occur, and where
    hi = top  # lengths above hi are known not to occur
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        e = _lookup(corpus, last, mid, hashes[mid], t_hash, t_len, t_end)
        if e >= 0:
            lo, lo_end = mid, e
        else:
            hi = mid - 1
    return lo_end, lo


@njit(cache=True)
def _index_and_query(corpus, n, indexed, max_match, t_hash, t_len, t_end, meta, hashes):
    """Index ends ``indexed .. n-2``, then answer the query for ``corpus[:n]``: one compiled call."""
    if n - 1 > indexed:
        _insert_ends(corpus, indexed, n - 1, max_match, t_hash, t_len, t_end, meta)
    return _query(corpus, n, max_match, t_hash, t_len, t_end, hashes)


@njit(cache=True)
def _rehash(t_hash, t_len, t_end, o_hash, o_len, o_end):
    mask = t_end.shape[0] - 1
    for j in range(o_end.shape[0]):
        if o_end[j] < 0:
            continue
        i = _slot(o_hash[j], o_len[j], mask)
        while t_end[i] >= 0:
            i = (i + 1) & mask
        t_hash[i] = o_hash[j]
        t_len[i] = o_len[j]
        t_end[i] = o_end[j]


class SuffixIndex:
    """The index over one growing int32 buffer; the owner passes the buffer and its length each call."""

    def __init__(self, max_match: int, capacity: int = 1 << 12) -> None:
        if not 1 <= max_match <= 127:
            raise ValueError(f"max_match must be 1..127, got {max_match}")
        self.max_match = max_match
        cap = 16
        while cap < capacity:
            cap *= 2
        self._alloc(cap)
        self._meta = np.zeros(1, dtype=np.int64)
        self._indexed = 0  # ends 0 .. _indexed-1 are in the table
        self._hashes = np.zeros(max_match + 1, dtype=np.uint64)

    def _alloc(self, cap: int) -> None:
        self._hash = np.zeros(cap, dtype=np.uint64)
        self._len = np.zeros(cap, dtype=np.int8)
        self._end = np.full(cap, -1, dtype=np.int32)

    def reset(self) -> None:
        self._end[:] = -1
        self._meta[0] = 0
        self._indexed = 0

    def _room(self, n: int) -> None:
        need = int(self._meta[0]) + self.max_match * (n - 1 - self._indexed)
        if 2 * need > len(self._end):
            cap = len(self._end)
            while cap < 2 * need:
                cap *= 2
            old = (self._hash, self._len, self._end)
            self._alloc(cap)
            _rehash(self._hash, self._len, self._end, *old)

    def match(self, corpus: np.ndarray, n: int) -> tuple[int, int]:
        """``(match_end, match_len)`` of ``corpus[:n]``, as :func:`suffix_match_reference` defines it.

        ``corpus[:n]`` must extend what earlier calls saw (call :meth:`reset` when it does not).
        """
        if n < 2:
            return -1, 0
        indexed = self._indexed
        if n - 1 > indexed:
            self._room(n)
            self._indexed = n - 1
        return _index_and_query(corpus, n, indexed, self.max_match, self._hash, self._len, self._end,
                                self._meta, self._hashes)
