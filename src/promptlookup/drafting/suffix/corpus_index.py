"""A memory-mapped suffix array over a tokenized corpus: continuations longer than a 2-gram cache's.

Why: the static 2-gram cache (``--lookup``) proposes one token from the last two, so a corpus can
only suggest what follows a 2-gram. A suffix array over the corpus's tokens finds the longest suffix
of the context that occurs anywhere in it (binary search, ``O(L log n)``) and counts its
continuations exactly (the occurrences of a pattern are one SA interval; its width is the count),
so a 30-token match into a library the model is quoting drafts the next tokens as they appear
there. The file is opened with ``mmap`` and never parsed: opening takes milliseconds at any size,
and the pages a lookup touches are all that is read.

File layout (little-endian), written atomically (temp file + ``os.replace``)::

    0    8  magic b"PLSUFIDX"
    8    4  u32 version (1)
    12   4  u32 suffix-array item size (4: int32 positions, 8: int64)
    16  16  tokenizer fingerprint, ASCII, NUL-padded
    32   8  u64 n_vocab
    40   8  u64 n_tokens
    48   8  u64 offset of the tokens       (= 128)
    56   8  u64 offset of the buckets      (after the tokens, 8-aligned)
    64   8  u64 offset of the suffix array (after the buckets)
    72   8  u64 file size
    80   4  u32 crc32 of everything after the header (checked by :meth:`CorpusIndex.verify`)
    84  40  reserved (0)
    124  4  u32 crc32 of bytes 0..124 (the header)
    128     i32[n_tokens] tokens, padding to 8, i64[n_vocab + 1] buckets (the first SA index of the
            suffixes starting with each token; buckets[n_vocab] == n_tokens), i32/i64[n_tokens] SA

The header follows :class:`promptlookup.fileio.BinaryHeader`, the rule every binary file here
shares. Opening checks the header (magic, version, CRC, fingerprint, every offset equal to the one the
sizes imply, the file size) and the buckets (monotone, 0 to ``n_tokens``); the kernels check every
position they read from the suffix array and every token they use as an index, so a corrupt body
gives wrong drafts or an error, never a crash or a read out of bounds. :meth:`CorpusIndex.verify`
is the full check: body CRC, tokens in range, buckets equal to the token histogram, and the suffix
array a sorted permutation (linear time, Burkhardt and Kärkkäinen's rank test).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from promptlookup.errors import UserError
from promptlookup.fileio import BinaryHeader, atomic_write, crc32_of

MAGIC = b"PLSUFIDX"
VERSION = 1
DEFAULT_MAX_MATCH = 32  # longest context suffix searched in the corpus




class CorpusArrays(NamedTuple):
    """:attr:`CorpusIndex.arrays`: the index as one argument of the drafting kernel, read by name
    (numba resolves the fields at compile time)."""

    tokens: np.ndarray  # the corpus (int32)
    sa: np.ndarray  # its suffix array
    buckets: np.ndarray  # the first suffix-array position of each first token (n_vocab + 1)


class CorpusIndexError(UserError, ValueError):
    """A corpus index file that is not ours, not for this tokenizer, truncated or corrupt."""


# promptlookup.fileio's header rule; the format's u32 is the suffix-array item size, its fields
# n_vocab, n_tokens, the three section offsets and the file size
HEADER = BinaryHeader(MAGIC, VERSION, "corpus index", "QQQQQQ", 128,
                      "rebuild it with this model's tokenizer (`promptlookup index`)", CorpusIndexError)


def _layout(n_tokens: int, n_vocab: int, item: int) -> tuple[int, int, int, int]:
    """(tokens, buckets, sa, file size) offsets implied by the sizes."""
    t_off = HEADER.size
    b_off = t_off + 4 * n_tokens
    b_off += -b_off % 8
    s_off = b_off + 8 * (n_vocab + 1)
    return t_off, b_off, s_off, s_off + item * n_tokens


# ----------------------------------------------------------------------------- building
def suffix_array_reference(tokens: Sequence[int]) -> np.ndarray:
    """The suffix array by sorting the suffixes as lists (quadratic memory; tests only)."""
    t = [int(x) for x in tokens]
    return np.array(sorted(range(len(t)), key=lambda i: t[i:]), dtype=np.int64)


def build_suffix_array(tokens: np.ndarray, n_vocab: int) -> np.ndarray:
    """Suffix array of ``tokens`` by prefix doubling in numpy (int32 positions when they fit).

    Start from the first ``w`` tokens packed in one uint64 (``w * bits <= 64``), then double the
    compared length; each round re-sorts only the suffixes still tied with a neighbour, so once the
    short repeats are told apart the rounds cost what the long repeats (duplicated files) leave.
    A group's rank is the SA index of its first member, so ranks are final once a group is alone.
    Memory: the tokens plus about 24 bytes per token at the first sort.
    """
    n = len(tokens)
    idx_t = np.int32 if n < 2**31 - 1 else np.int64
    if n == 0:
        return np.zeros(0, dtype=idx_t)
    bits = max(1, int(n_vocab - 1).bit_length())
    w = max(1, 64 // (bits + 1))  # +1: "past the end" (0) sorts below every token (t + 1)
    t = tokens.astype(np.uint64) + np.uint64(1)
    key = np.zeros(n, dtype=np.uint64)
    for j in range(min(w, n)):
        key[: n - j] |= t[j:] << np.uint64((w - 1 - j) * (bits + 1))
    del t
    sa = np.argsort(key).astype(idx_t)
    ks = key[sa]
    del key
    head = np.empty(n, dtype=bool)  # head[i]: sa[i] starts a new group
    head[0] = True
    np.not_equal(ks[1:], ks[:-1], out=head[1:])
    del ks
    rank = np.empty(n + 1, dtype=idx_t)  # rank[n] = -1: past the end sorts first
    rank[n] = -1
    rank[sa] = np.maximum.accumulate(np.where(head, np.arange(n, dtype=idx_t), 0))
    h = w
    tied = ~head  # SA slots in groups of more than one suffix
    tied[:-1] |= ~head[1:]
    active = np.flatnonzero(tied).astype(idx_t)
    del head, tied
    while len(active):
        pos = sa[active]
        nxt = pos.astype(np.int64)
        nxt += h
        np.minimum(nxt, n, out=nxt)
        key = rank[pos].astype(np.int64) << 32  # (rank of the first h, rank of the next h)
        key |= rank[nxt].astype(np.int64) + 1
        del nxt
        order = np.argsort(key)
        pos = pos[order]
        key = key[order]
        del order
        sa[active] = pos
        new_head = np.empty(len(active), dtype=bool)
        new_head[0] = True
        np.not_equal(key[1:], key[:-1], out=new_head[1:])
        del key
        rank[pos] = np.maximum.accumulate(np.where(new_head, active, 0))
        tied = ~new_head
        tied[:-1] |= ~new_head[1:]
        active = active[tied]
        h *= 2
    return sa


def buckets_of(tokens: np.ndarray, n_vocab: int) -> np.ndarray:
    counts = np.bincount(tokens, minlength=n_vocab)
    out = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def write_index(path: str | os.PathLike[str], tokens: np.ndarray, sa: np.ndarray, n_vocab: int,
                fingerprint: str) -> int:
    """Write tokens + suffix array atomically in the format above; returns the file size."""
    tokens = np.ascontiguousarray(tokens, dtype="<i4")
    n = len(tokens)
    if len(sa) != n:
        raise ValueError("suffix array and tokens differ in length")
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
        raise ValueError(f"token ids must be in 0..{n_vocab - 1}")
    item = 4 if n < 2**31 - 1 else 8
    sa = np.ascontiguousarray(sa, dtype="<i4" if item == 4 else "<i8")
    t_off, b_off, s_off, size = _layout(n, n_vocab, item)
    pad = b"\0" * (b_off - t_off - 4 * n)
    body = [memoryview(tokens).cast("B"), pad, buckets_of(tokens, n_vocab).astype("<i8").tobytes(),
            memoryview(sa).cast("B")]
    head = HEADER.pack(item, fingerprint, (n_vocab, n, t_off, b_off, s_off, size), crc32_of(body))
    atomic_write(path, [head, *body])
    return size


# ----------------------------------------------------------------------------- opening
class CorpusIndex:
    """An opened index: ``tokens``, ``sa`` and ``buckets`` are plain read-only ndarrays over the
    mapping (plain, not ``np.memmap``, so numba's dispatch takes its fast path)."""

    def __init__(self, path: str, tokens: np.ndarray, sa: np.ndarray, buckets: np.ndarray,
                 n_vocab: int, fingerprint: str, crc: int, mm: mmap.mmap | None) -> None:
        self.path = path
        self.tokens = tokens
        self.sa = sa
        self.buckets = buckets
        self.n_vocab = n_vocab
        self.fingerprint = fingerprint
        self.crc = crc
        self._mm = mm
        self._arrays = CorpusArrays(tokens, sa, buckets)  # made once: it costs more than a draft step

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def arrays(self) -> CorpusArrays:
        """The arrays as the drafting kernel takes them: one bundle, fields by name."""
        return self._arrays

    def close(self) -> None:
        # empty arrays of the same types: a source holding a compiled build for them stays sound
        self.tokens, self.sa = _emptied(self.tokens), _emptied(self.sa)
        self._arrays = CorpusArrays(self.tokens, self.sa, self.buckets)
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # a live view keeps the mapping; it goes with it
                self._mm.close()
            self._mm = None

    def verify(self) -> None:
        """The full check (reads the whole file); raises :class:`CorpusIndexError`."""
        def bad(why: str) -> CorpusIndexError:
            return CorpusIndexError(f"{self.path}: corrupt corpus index: {why}")

        if self._mm is not None:
            HEADER.check_body(self._mm, self.crc, self.path)
        n = len(self.tokens)
        if n and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= self.n_vocab):
            raise bad("a token id out of range")
        if not np.array_equal(self.buckets, buckets_of(self.tokens, self.n_vocab)):
            raise bad("buckets do not match the tokens")
        why = _check_sorted(self.tokens, self.sa)
        if why:
            raise bad(["", "a position out of range", "a position repeated",
                       "suffixes out of order"][why])

    # -- convenience wrappers around the kernels (tests, tools) -----------------------
    def interval(self, pattern: Sequence[int]) -> tuple[int, int]:
        """SA interval ``[lo, hi)`` of the suffixes that start with ``pattern``."""
        p = np.asarray(pattern, dtype=np.int32)
        if len(p) == 0:
            return 0, self.n_tokens
        lo, hi = interval(self.tokens, self.sa, self.buckets, p, 0, len(p))
        if lo < 0:
            raise CorpusIndexError(f"{self.path}: corrupt corpus index (a position out of range)")
        return int(lo), int(hi)

    def longest_match(self, context: Sequence[int], cap: int = DEFAULT_MAX_MATCH) -> tuple[int, int, int]:
        """``(L, lo, hi)``: the longest suffix of ``context`` (at most ``cap`` tokens) that occurs
        followed by a token, and its SA interval."""
        c = np.asarray(context, dtype=np.int32)
        state = np.zeros(3, dtype=np.int64)
        if _search(self.tokens, self.sa, self.buckets, c, len(c), min(cap, len(c)), state) < 0:
            raise CorpusIndexError(f"{self.path}: corrupt corpus index (a position out of range)")
        return int(state[2]), int(state[0]), int(state[1])

    def followers(self, lo: int, hi: int, length: int) -> list[tuple[int, int]]:
        """``[(token, count)]`` of what follows the pattern of ``length`` tokens at ``[lo, hi)``."""
        out = np.zeros((max(hi - lo, 1), 2), dtype=np.int64)
        m = _followers(self.tokens, self.sa, lo, hi, length, out)
        if m < 0:
            raise CorpusIndexError(f"{self.path}: corrupt corpus index (a position out of range)")
        return [(int(a), int(b)) for a, b in out[:m]]


def _emptied(a: np.ndarray) -> np.ndarray:
    out = np.zeros(0, a.dtype)
    out.flags.writeable = a.flags.writeable
    return out


def empty_index() -> CorpusIndex:
    """No corpus: every match has length 0."""
    return CorpusIndex("<none>", np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64),
                       0, "", 0, None)


def open_index(path: str | os.PathLike[str], fingerprint: str | None = None, n_vocab: int | None = None,
               verify: bool = False) -> CorpusIndex:
    """Map a corpus index; ``fingerprint`` and ``n_vocab`` (when given) must match the file's."""
    name = str(path)

    def bad(why: str) -> CorpusIndexError:
        return CorpusIndexError(f"{name}: not a usable corpus index: {why}")

    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise CorpusIndexError(f"cannot open corpus index {name}: {exc.strerror or exc}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        head = HEADER.read(fh.read(HEADER.size), name, fingerprint)
        item, fp_text, crc = head.param, head.fingerprint, head.body_crc
        nv, n, t_off, b_off, s_off, fsize = head.fields
        if n_vocab is not None and nv != n_vocab:
            raise bad(f"built for a vocabulary of {nv} tokens, this one has {n_vocab}")
        if item not in (4, 8) or nv < 1 or nv > 1 << 31 or n > size or (item == 4 and n >= 2**31 - 1):
            raise bad("sizes out of range")
        if (t_off, b_off, s_off, fsize) != _layout(n, nv, item) or fsize != size:
            raise bad(f"{size} bytes, the header describes {_layout(n, nv, item)[3]} (truncated?)")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    assert mm is not None
    tokens = np.frombuffer(mm, dtype="<i4", count=n, offset=t_off)
    buckets = np.frombuffer(mm, dtype="<i8", count=nv + 1, offset=b_off).copy()
    sa = np.frombuffer(mm, dtype="<i4" if item == 4 else "<i8", count=n, offset=s_off)
    if buckets[0] != 0 or buckets[-1] != n or (nv and (np.diff(buckets) < 0).any()):
        raise bad("bucket offsets are not monotone from 0 to the token count")
    idx = CorpusIndex(name, tokens, sa, buckets, int(nv), fp_text, int(crc), mm)
    if verify:
        idx.verify()
    return idx


# ----------------------------------------------------------------------------- kernels
@njit(cache=True, nogil=True)
def _check_sorted(tok, sa):
    """0 if ``sa`` is the suffix array of ``tok``; else 1 (range), 2 (repeat), 3 (order).

    Without the GIL: a server checks a corpus it adds while its requests stream (about a second
    per 30M tokens), and holding the GIL that long stalls every request thread."""
    n = len(tok)
    inv = np.full(n + 1, -1, dtype=np.int64)
    for i in range(n):
        p = sa[i]
        if p < 0 or p >= n:
            return 1
        if inv[p] >= 0:
            return 2
        inv[p] = i
    inv[n] = -1  # the empty suffix sorts first
    for i in range(n - 1):
        a = sa[i]
        b = sa[i + 1]
        if tok[a] > tok[b]:
            return 3
        if tok[a] == tok[b] and inv[a + 1] >= inv[b + 1]:
            return 3
    return 0


@njit(cache=True)
def _cmp(tok, n, p, pat, start, end):
    """Compare the suffix at ``p`` with ``pat[start:end]`` from ``start`` on: -1, 0 (prefix), 1."""
    for j in range(start, end):
        q = p + j
        if q >= n:
            return -1
        a = tok[q]
        b = pat[j]
        if a != b:
            return -1 if a < b else 1
    return 0


@njit(cache=True)
def interval(tok, sa, buckets, pat, a, b):
    """SA interval of the suffixes starting with ``pat[a:b]`` (``b > a``); (-1, -1) on a corrupt
    position. The first token's interval comes from the buckets, the rest by binary search."""
    n = len(tok)
    t0 = pat[a]
    if t0 < 0 or t0 + 1 >= len(buckets):
        return 0, 0
    lo = buckets[t0]
    hi = buckets[t0 + 1]
    m = b - a
    if m == 1 or lo >= hi:
        return lo, hi
    sub = pat[a:b]
    # lower bound: first suffix >= sub
    L, R = lo, hi
    while L < R:
        mid = (L + R) >> 1
        p = sa[mid]
        if p < 0 or p >= n:
            return -1, -1
        if _cmp(tok, n, p, sub, 1, m) < 0:
            L = mid + 1
        else:
            R = mid
    first = L
    R = hi
    while L < R:
        mid = (L + R) >> 1
        p = sa[mid]
        if p < 0 or p >= n:
            return -1, -1
        if _cmp(tok, n, p, sub, 1, m) <= 0:
            L = mid + 1
        else:
            R = mid
    return first, L


@njit(cache=True)
def _n_followed(tok, sa, lo, hi, length):
    """Occurrences in ``[lo, hi)`` followed by a token (only the first can end the corpus); -1 bad."""
    if lo >= hi:
        return 0
    p = sa[lo]
    if p < 0 or p >= len(tok):
        return -1
    return hi - lo - (1 if p + length >= len(tok) else 0)


@njit(cache=True)
def narrow(tok, sa, lo, hi, length, t):
    """Sub-interval of ``[lo, hi)`` (a pattern of ``length`` tokens) followed by ``t``."""
    n = len(tok)
    L, R = lo, hi
    while L < R:
        mid = (L + R) >> 1
        p = sa[mid]
        if p < 0 or p >= n:
            return -1, -1
        q = p + length
        if q >= n or tok[q] < t:
            L = mid + 1
        else:
            R = mid
    first = L
    R = hi
    while L < R:
        mid = (L + R) >> 1
        p = sa[mid]
        if p < 0 or p >= n:
            return -1, -1
        q = p + length
        if q >= n or tok[q] <= t:
            L = mid + 1
        else:
            R = mid
    return first, L


@njit(cache=True)
def _bisect(tok, sa, buckets, ctx, n_ctx, good, bad, best_lo, best_hi, state):
    """Binary search on ``L`` in ``(good, bad)`` for the longest suffix of the context followed by a
    token in the corpus (the property is monotone); ``good`` holds, with interval ``[best_lo,
    best_hi)``, ``bad`` does not. Writes ``(lo, hi, L)`` to ``state``; -1 on a corrupt index."""
    while bad - good > 1:
        mid = (good + bad) >> 1
        lo, hi = interval(tok, sa, buckets, ctx, n_ctx - mid, n_ctx)
        if lo < 0:
            return -1
        f = _n_followed(tok, sa, lo, hi, mid)
        if f < 0:
            return -1
        if f > 0:
            good = mid
            best_lo = lo
            best_hi = hi
        else:
            bad = mid
    state[0] = best_lo
    state[1] = best_hi
    state[2] = good
    return 0


@njit(cache=True)
def _search(tok, sa, buckets, ctx, n_ctx, upper, state):
    """Longest ``L <= upper`` with ``ctx[n_ctx-L:n_ctx]`` followed by a token in the corpus."""
    return _bisect(tok, sa, buckets, ctx, n_ctx, 0, upper + 1, 0, 0, state)


@njit(cache=True)
def search_from(tok, sa, buckets, ctx, n_ctx, lower, upper, state):
    """Like :func:`_search`, but only lengths ``>= lower`` matter: one probe at ``lower`` settles
    the usual case (the corpus's match is too short to decide), so ``L = 0`` stands for "< lower"."""
    state[0] = 0
    state[1] = 0
    state[2] = 0
    if lower > upper:
        return 0
    lo, hi = interval(tok, sa, buckets, ctx, n_ctx - lower, n_ctx)
    if lo < 0:
        return -1
    f = _n_followed(tok, sa, lo, hi, lower)
    if f < 0:
        return -1
    if f == 0:
        return 0
    return _bisect(tok, sa, buckets, ctx, n_ctx, lower, upper + 1, lo, hi, state)


@njit(cache=True)
def _followers(tok, sa, lo, hi, length, out):
    """Distinct followers of the pattern at ``[lo, hi)`` with their counts (ascending token)."""
    n = len(tok)
    i = lo
    m = 0
    if i < hi:
        p = sa[i]
        if p < 0 or p >= n:
            return -1
        if p + length >= n:
            i += 1
    while i < hi:
        p = sa[i]
        if p < 0 or p >= n or p + length >= n:
            return -1
        t = tok[p + length]
        # end of this token's run: first index in [i, hi) whose follower is > t
        L, R = i + 1, hi
        while L < R:
            mid = (L + R) >> 1
            q = sa[mid]
            if q < 0 or q >= n:
                return -1
            if q + length < n and tok[q + length] <= t:
                L = mid + 1
            else:
                R = mid
        out[m, 0] = t
        out[m, 1] = L - i
        m += 1
        i = L
    return m


# ----------------------------------------------------------------------------- reference twin
def longest_match_reference(corpus: Sequence[int], context: Sequence[int], cap: int) -> int:
    """Largest ``L <= cap`` such that ``context[-L:]`` occurs in ``corpus`` followed by a token."""
    c = list(corpus)
    ctx = list(context)
    best = 0
    for e in range(len(c) - 1):
        n = 0
        while n < cap and n < len(ctx) and e - n >= 0 and c[e - n] == ctx[-1 - n]:
            n += 1
        best = max(best, n)
    return best


def count_reference(corpus: Sequence[int], pattern: Sequence[int]) -> int:
    """Occurrences of ``pattern`` in ``corpus`` (overlapping)."""
    c, p = list(corpus), list(pattern)
    m = len(p)
    return sum(1 for i in range(len(c) - m + 1) if c[i : i + m] == p)
