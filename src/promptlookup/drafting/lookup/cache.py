"""The context and dynamic n-gram caches of ``--lookup``: n-gram -> follower -> count, mutable, mergeable.

llama.cpp keeps these as ``unordered_map<ngram, unordered_map<token, int32>>`` (``common/ngram-cache``).
An n-gram is 1..4 token ids padded to four slots with -1, so ``(5,)`` and ``(5, -1)`` are the same key
and the n-gram size is part of the key. :meth:`NgramCache.update` is llama.cpp's
``common_ngram_cache_update``: for every size n and every new position i (i >= n, i >= len - nnew),
the n tokens before i gain one sighting of token ``i`` as their follower.

Why two classes: :class:`DictNgramCache` is the plain statement (dicts of dicts) the tests trust;
:class:`NgramCache` is the one the draft loop uses, a numba open-addressing table over numpy arrays
(n-gram ids by hash, followers as a per-n-gram linked list of entries) so that updating and drafting
never touch a Python object per token. Counts are 64-bit (llama.cpp: 32-bit); indices are 32-bit (2**31
n-grams is far beyond any cache held in memory), keeping a stats replay's dynamic cache small. Each n-gram
also keeps its largest follower count, so the draft rule can reject an n-gram whose best follower cannot
reach the threshold (``100 * max <= p * total``) without walking its followers: on a big dynamic cache a
1-gram like a newline has thousands, and this check skips nearly all of them, exactly. Follower order
inside an n-gram is irrelevant to the draft rule, which breaks ties by token id (see ``lookup``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

NGRAM_MIN = 1
NGRAM_MAX = 4
NGRAM_STATIC = 2
PAD = -1  # llama.cpp's LLAMA_TOKEN_NULL in unused key slots

Key = tuple[int, ...]


def _key(ngram: Sequence[int]) -> Key:
    ngram = tuple(int(t) for t in ngram)
    if not 1 <= len(ngram) <= NGRAM_MAX or any(t < 0 for t in ngram):
        raise ValueError(f"an n-gram is 1..{NGRAM_MAX} token ids >= 0, got {ngram}")
    return ngram


class DictNgramCache:
    """Reference twin: the cache as a dict of dicts, obviously llama.cpp's rule."""

    def __init__(self) -> None:
        self.data: dict[Key, dict[int, int]] = {}

    def update(self, tokens: Sequence[int], nnew: int | None = None,
               ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        n = len(tokens)
        nnew = n if nnew is None else nnew
        for size in range(ngram_min, ngram_max + 1):
            for i in range(max(n - nnew, size), n):
                self.add(tokens[i - size : i], tokens[i])

    def add(self, ngram: Sequence[int], token: int, count: int = 1) -> None:
        part = self.data.setdefault(_key(ngram), {})
        part[int(token)] = part.get(int(token), 0) + count

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        return dict(self.data.get(tuple(int(t) for t in ngram), {}))

    def merge(self, other: DictNgramCache | NgramCache) -> None:
        for ngram, part in other.items():
            for tok, cnt in part.items():
                self.add(ngram, tok, cnt)

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        yield from self.data.items()

    def halve(self) -> None:
        """Every count halved, rounded down; a follower left at 0 is forgotten, then an n-gram left
        with none (the aging :class:`~promptlookup.drafting.lookup.source.LookupSource` applies to a
        dynamic cache over its budget: what was seen once goes first)."""
        aged = {key: {t: c // 2 for t, c in part.items() if c // 2} for key, part in self.data.items()}
        self.data = {key: part for key, part in aged.items() if part}

    def clear(self) -> None:
        self.data.clear()

    def __len__(self) -> int:
        return len(self.data)

    @property
    def n_entries(self) -> int:
        return sum(len(part) for part in self.data.values())


# -- the numba table ----------------------------------------------------------------------------
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _hash4(t0, t1, t2, t3):
    h = np.uint64(0x9E3779B97F4A7C15)
    h = (h ^ np.uint64(np.uint32(t0))) * _M1
    h = (h ^ (h >> np.uint64(29)) ^ np.uint64(np.uint32(t1))) * _M2
    h = (h ^ (h >> np.uint64(31)) ^ np.uint64(np.uint32(t2))) * _M1
    h = (h ^ (h >> np.uint64(29)) ^ np.uint64(np.uint32(t3))) * _M2
    return h ^ (h >> np.uint64(32))


class NgramTables(NamedTuple):
    """The table as every kernel takes it (``NgramCache.tables``): one bundle, fields by name.

    numba resolves ``tab.slots`` at compile time, as it did an index into a plain tuple, so the
    bundle costs nothing per call, and adding a field is an edit here and in ``_retab``."""

    slots: np.ndarray  # open addressing: n-gram id per slot (int32, -1: empty), a power of two long
    keys: np.ndarray  # n-gram id -> its 4 tokens (int32, PAD past its size)
    head: np.ndarray  # n-gram id -> its first follower entry (-1: none)
    total: np.ndarray  # n-gram id -> the sum of its followers' counts
    maxc: np.ndarray  # n-gram id -> its largest follower count (prunes the draft scan)
    tok: np.ndarray  # follower entry -> token
    cnt: np.ndarray  # follower entry -> count
    next: np.ndarray  # follower entry -> the n-gram's next entry (-1: last)
    meta: np.ndarray  # [n-grams, follower entries]


@njit(cache=True)
def find_ngram(tab, t0, t1, t2, t3):
    """Id of the n-gram ``(t0..t3)`` or -1; the table is never more than half full, so this ends."""
    slots = tab.slots
    keys = tab.keys
    mask = slots.shape[0] - 1
    i = np.int64(_hash4(t0, t1, t2, t3) & np.uint64(mask))
    while True:
        s = slots[i]
        if s < 0:
            return -1
        if keys[s, 0] == t0 and keys[s, 1] == t1 and keys[s, 2] == t2 and keys[s, 3] == t3:
            return s
        i = (i + 1) & mask


@njit(cache=True)
def _add(tab, t0, t1, t2, t3, tok, cnt):
    slots, keys, head, total, maxc = tab.slots, tab.keys, tab.head, tab.total, tab.maxc
    e_tok, e_cnt, e_next, meta = tab.tok, tab.cnt, tab.next, tab.meta
    mask = slots.shape[0] - 1
    i = np.int64(_hash4(t0, t1, t2, t3) & np.uint64(mask))
    while True:
        s = slots[i]
        if s < 0:
            s = meta[0]
            meta[0] += 1
            keys[s, 0] = t0
            keys[s, 1] = t1
            keys[s, 2] = t2
            keys[s, 3] = t3
            head[s] = -1
            total[s] = 0
            maxc[s] = 0
            slots[i] = s
            break
        if keys[s, 0] == t0 and keys[s, 1] == t1 and keys[s, 2] == t2 and keys[s, 3] == t3:
            break
        i = (i + 1) & mask
    total[s] += cnt
    e = head[s]
    while e >= 0:
        if e_tok[e] == tok:
            e_cnt[e] += cnt
            if e_cnt[e] > maxc[s]:
                maxc[s] = e_cnt[e]
            return
        e = e_next[e]
    e = meta[1]
    meta[1] += 1
    e_tok[e] = tok
    e_cnt[e] = cnt
    e_next[e] = head[s]
    head[s] = e
    if cnt > maxc[s]:
        maxc[s] = cnt


@njit(cache=True)
def update_ngrams(tab, seq, n, nnew, nmin, nmax):
    """llama.cpp's ``common_ngram_cache_update`` over ``seq[:n]``, the last ``nnew`` tokens new."""
    for size in range(nmin, nmax + 1):
        start = max(n - nnew, size)
        for i in range(start, n):
            b = i - size
            t0 = seq[b]
            t1 = seq[b + 1] if size > 1 else -1
            t2 = seq[b + 2] if size > 2 else -1
            t3 = seq[b + 3] if size > 3 else -1
            _add(tab, t0, t1, t2, t3, seq[i], 1)


@njit(cache=True)
def _merge(tab, other, o_n):
    o_keys, o_head, o_tok, o_cnt, o_next = (other.keys, other.head, other.tok, other.cnt,
                                            other.next)
    for s in range(o_n):
        e = o_head[s]
        while e >= 0:
            _add(tab, o_keys[s, 0], o_keys[s, 1], o_keys[s, 2], o_keys[s, 3], o_tok[e], o_cnt[e])
            e = o_next[e]


@njit(cache=True)
def _add_records(tab, r_keys, r_off, r_tok, r_cnt):
    for r in range(r_keys.shape[0]):
        for j in range(r_off[r], r_off[r + 1]):
            _add(tab, r_keys[r, 0], r_keys[r, 1], r_keys[r, 2], r_keys[r, 3], r_tok[j], r_cnt[j])


@njit(cache=True)
def _rehash(slots, keys, n):
    mask = slots.shape[0] - 1
    for s in range(n):
        i = np.int64(_hash4(keys[s, 0], keys[s, 1], keys[s, 2], keys[s, 3]) & np.uint64(mask))
        while slots[i] >= 0:
            i = (i + 1) & mask
        slots[i] = s


@njit(cache=True)
def _records(tab, n, n_entries):
    """Flatten to (offsets, tokens, counts) with each n-gram's followers sorted by token id."""
    head, e_tok, e_cnt, e_next = tab.head, tab.tok, tab.cnt, tab.next
    off = np.zeros(n + 1, dtype=np.int64)
    tok = np.empty(n_entries, dtype=np.int32)
    cnt = np.empty(n_entries, dtype=np.int64)
    p = 0
    for s in range(n):
        start = p
        e = head[s]
        while e >= 0:
            tok[p] = e_tok[e]
            cnt[p] = e_cnt[e]
            p += 1
            e = e_next[e]
        order = np.argsort(tok[start:p], kind="mergesort")
        tok[start:p] = tok[start:p][order]
        cnt[start:p] = cnt[start:p][order]
        off[s + 1] = p
    return off, tok, cnt


class NgramCache:
    """The fast cache: same behaviour as :class:`DictNgramCache`, arrays instead of objects."""

    def __init__(self, capacity: int = 1024) -> None:
        cap = 16
        while cap < 2 * capacity:
            cap *= 2
        self._slots = np.full(cap, -1, dtype=np.int32)
        self._keys = np.full((capacity, 4), PAD, dtype=np.int32)
        self._head = np.full(capacity, -1, dtype=np.int32)
        self._total = np.zeros(capacity, dtype=np.int64)
        self._maxc = np.zeros(capacity, dtype=np.int64)  # largest follower count: prunes the draft scan
        self._e_tok = np.zeros(capacity, dtype=np.int32)
        self._e_cnt = np.zeros(capacity, dtype=np.int64)
        self._e_next = np.full(capacity, -1, dtype=np.int32)
        self._meta = np.zeros(2, dtype=np.int64)  # [n-grams, follower entries]
        self._retab()

    def _retab(self) -> None:
        self._tab = NgramTables(self._slots, self._keys, self._head, self._total, self._maxc, self._e_tok,
                                self._e_cnt, self._e_next, self._meta)

    # -- capacity ---------------------------------------------------------------------------
    @property
    def tables(self) -> NgramTables:
        """Every array, as the compiled kernels take them: one bundle, fields by name; valid until
        the next insert grows them (then a new bundle is made)."""
        return self._tab

    @property
    def meta(self) -> np.ndarray:
        """``[n-grams, follower entries]``, updated in place by the kernels."""
        return self._meta

    def reserve(self, more_ngrams: int, more_entries: int) -> None:
        need_n = int(self._meta[0]) + more_ngrams
        if need_n > len(self._keys):
            size = max(need_n, 2 * len(self._keys))
            self._keys = _grown(self._keys, size, PAD)
            self._head = _grown(self._head, size, -1)
            self._total = _grown(self._total, size, 0)
            self._maxc = _grown(self._maxc, size, 0)
        if 2 * need_n > len(self._slots):
            cap = len(self._slots)
            while cap < 2 * need_n:
                cap *= 2
            self._slots = np.full(cap, -1, dtype=np.int32)
            _rehash(self._slots, self._keys, int(self._meta[0]))
        need_e = int(self._meta[1]) + more_entries
        if need_e > len(self._e_tok):
            size = max(need_e, 2 * len(self._e_tok))
            self._e_tok = _grown(self._e_tok, size, 0)
            self._e_cnt = _grown(self._e_cnt, size, 0)
            self._e_next = _grown(self._e_next, size, -1)
        self._retab()

    # -- the API of the reference -----------------------------------------------------------
    def update(self, tokens: Sequence[int] | np.ndarray, nnew: int | None = None,
               ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX, n: int | None = None) -> None:
        """llama.cpp's ``common_ngram_cache_update`` over ``tokens[:n]`` (the last ``nnew`` are new)."""
        seq = tokens if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 else (
            np.asarray(tokens, dtype=np.int32))
        n = len(seq) if n is None else n
        nnew = n if nnew is None else min(nnew, n)
        if nnew <= 0:
            return
        sizes = ngram_max - ngram_min + 1
        self.reserve(sizes * nnew, sizes * nnew)
        update_ngrams(self._tab, seq, n, nnew, ngram_min, ngram_max)

    def add(self, ngram: Sequence[int], token: int, count: int = 1) -> None:
        k = _key(ngram) + (PAD,) * (NGRAM_MAX - len(ngram))
        self.reserve(1, 1)
        _add(self._tab, k[0], k[1], k[2], k[3], int(token), int(count))

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        k = tuple(int(t) for t in ngram) + (PAD,) * (NGRAM_MAX - len(ngram))
        if len(k) != NGRAM_MAX:
            return {}
        s = find_ngram(self._tab, *k)
        out: dict[int, int] = {}
        if s >= 0:
            e = int(self._head[s])
            while e >= 0:
                out[int(self._e_tok[e])] = int(self._e_cnt[e])
                e = int(self._e_next[e])
        return out

    def merge(self, other: NgramCache | DictNgramCache) -> None:
        """Add every count of ``other`` into this cache (llama.cpp's ``common_ngram_cache_merge``)."""
        if isinstance(other, NgramCache):
            self.reserve(len(other), other.n_entries)
            _merge(self._tab, other.tables, len(other))
        else:
            for ngram, part in other.items():
                for tok, cnt in part.items():
                    self.add(ngram, tok, cnt)

    def add_records(self, keys: np.ndarray, off: np.ndarray, tok: np.ndarray, cnt: np.ndarray) -> None:
        """Bulk add of flattened records: ``keys[r]`` (4 slots) has followers ``tok/cnt[off[r]:off[r+1]]``."""
        self.reserve(len(keys), len(tok))
        _add_records(self._tab, np.ascontiguousarray(keys, dtype=np.int32),
                     np.ascontiguousarray(off, dtype=np.int64), np.ascontiguousarray(tok, dtype=np.int32),
                     np.ascontiguousarray(cnt, dtype=np.int64))

    def records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys int32[N,4], offsets int64[N+1], tokens int32[M], counts int64[M]), in insertion order."""
        n, m = len(self), self.n_entries
        off, tok, cnt = _records(self._tab, n, m)
        return self._keys[:n].copy(), off, tok, cnt

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        keys, off, tok, cnt = self.records()
        for r in range(len(keys)):
            key = tuple(int(t) for t in keys[r] if t != PAD)
            yield key, {int(t): int(c) for t, c in zip(tok[off[r]:off[r + 1]], cnt[off[r]:off[r + 1]],
                                                        strict=True)}

    def halve(self) -> None:
        """:meth:`DictNgramCache.halve` on the arrays: the records rebuilt with halved counts (the
        arrays keep their size, so a cache aged at a budget stops growing there)."""
        keys, off, tok, cnt = self.records()
        cnt = cnt // 2
        kept = cnt > 0
        owner = np.repeat(np.arange(len(keys)), np.diff(off))
        per_ngram = np.bincount(owner[kept], minlength=len(keys))
        alive = per_ngram > 0
        new_off = np.zeros(int(alive.sum()) + 1, dtype=np.int64)
        np.cumsum(per_ngram[alive], out=new_off[1:])
        self.clear()
        self.add_records(keys[alive], new_off, tok[kept], cnt[kept])

    def clear(self) -> None:
        self._slots[:] = -1
        self._meta[:] = 0

    def __len__(self) -> int:
        return int(self._meta[0])

    @property
    def n_entries(self) -> int:
        return int(self._meta[1])

    @property
    def bytes_in_use(self) -> int:
        """Bytes of what the cache holds: its n-grams (key, head, total, largest count: 36 each), its
        follower entries (token, count, next: 16 each) and its whole hash (the slots, kept at most
        half full); the arrays' room ahead, allocated by doubling, is not counted."""
        return 36 * len(self) + 16 * self.n_entries + int(self._slots.nbytes)


def _grown(a: np.ndarray, size: int, fill: int) -> np.ndarray:
    shape = (size,) + a.shape[1:]
    out = np.full(shape, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out
