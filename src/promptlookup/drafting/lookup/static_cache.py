"""The static cache (2-gram -> follower -> count from a corpus) in a read-only, mmap-able format of our own.

Why a format of our own: llama.cpp stores the static cache as a stream of records that must be parsed
into hash maps of hash maps before the first lookup (seconds and ~2x the file in memory for a large
corpus). Here the file *is* the index: opening it reads a 64-byte header and maps the rest, and the
memory it costs is the pages lookups touch. Seed 001's last two changes are built in: every key's
followers are contiguous and sorted, and the key set is a flat read-only structure.

Layout, version 2, all little-endian, every section 4-byte aligned; the header follows
:class:`promptlookup.fileio.BinaryHeader`, the rule every binary file here shares::

    0   magic        8 bytes  b"PLSTATIC"
    8   version      u32      2
    12  ngram_size   u32      2 (the only size this version stores)
    16  fingerprint  16 bytes tokenizer fingerprint, ASCII hex (promptlookup.fingerprint)
    32  n_vocab      u64      tokens of that vocabulary; every id in the file is below it
    40  n_keys       u64      distinct 2-grams (< 2**32)
    48  n_followers  u64      distinct (2-gram, follower) pairs (< 2**32)
    56  body_crc32   u32      zlib.crc32 of every byte after the header
    60  header_crc32 u32      zlib.crc32 of bytes 0..59
    64  first_off    u32[n_vocab + 1]  keys with first token t are first_off[t] .. first_off[t+1]
        key_second   i32[n_keys]       second token of each key, ascending within a first token
        key_draft    i32[n_keys]       what the static fall-back drafts: the follower of max count (then
                                       min id) when the key passes its thresholds (total >= 2 and that
                                       follower >= 50 % of it), else -1
        key_total    u32[n_keys]       sum of the key's follower counts
        key_off      u32[n_keys + 1]   followers of key k are key_off[k] .. key_off[k+1]
        fol_token    i32[n_followers]  ascending within a key
        fol_count    u32[n_followers]  >= 1

A lookup is one probe (``first_off[t0]``), a binary search for ``t1`` over the few keys that start
with ``t0``, then a contiguous follower range: a binary search for a token's count. The static
fall-back (the draft rule's last resort, tried for every token the context and dynamic caches do not
draft) reads one word, ``key_draft``, and searches the followers only when it drafts: version 1 stored
the best follower whatever its share (``key_best``), so every fall-back searched the followers for
its count, mostly to find that it failed the 50 % test. Version 1 files are refused with a message
to rebuild them (``promptlookup create``).

The size is 64 + 4 (n_vocab + 1) + 16 n_keys + 4 + 8 n_followers bytes; llama.cpp's file is 20 n_keys
+ 8 n_followers, so ours is smaller for any corpus with more than about n_vocab / 4 keys.

Trust, and why the body is not checked at open: :func:`open_static` checks the header (magic,
version, header CRC, sizes, exact file length) and the tokenizer fingerprint, which costs well under a
millisecond whatever the size. Checking the body (its CRC and every structural invariant) means reading
the whole file, about a second per 100 MB; that is :func:`verify_static` (``promptlookup verify CACHE``,
or ``open_static(verify=True)`` / ``stats --verify``), for a file that came from somewhere untrusted or
after a disk scare. Skipping it is safe in one precise sense: every numba lookup bounds-checks every
index it reads, so a corrupt body can yield wrong counts (bad drafts, which the model rejects), never an
out-of-bounds read or a crash; the fuzz tests hold that. Writes go to a temporary file in the same
directory, then ``os.replace``: readers never see half a file, and a mapped file is never modified
under a reader (a new inode replaces it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numba import njit

from promptlookup.errors import InputError, UserError
from promptlookup.fileio import BinaryHeader, atomic_write, crc32_of

MAGIC = b"PLSTATIC"
VERSION = 2
NGRAM_SIZE = 2
HEADER_SIZE = 64
U32_MAX = 2**32 - 1
STATIC_MIN_TOTAL = 2  # llama.cpp: draft_min_sample_size_lax[LLAMA_NGRAM_STATIC - 1]
STATIC_MIN_PERCENT = 50  # llama.cpp: draft_min_percent_lax[LLAMA_NGRAM_STATIC - 1]



class StaticArrays(NamedTuple):
    """``StaticCache.arrays``: the cache as one argument of the compiled draft, fields by name
    (numba resolves them at compile time). The file's arrays, in its order."""

    first_off: np.ndarray  # first token -> its first key (n_vocab + 1 offsets)
    key_second: np.ndarray  # key -> its second token (sorted within a first token)
    key_draft: np.ndarray  # key -> the follower the fall-back drafts (-1: none passes)
    key_total: np.ndarray  # key -> the sum of its followers' counts
    key_off: np.ndarray  # key -> its first follower (n_keys + 1 offsets)
    fol_token: np.ndarray  # follower -> token (sorted within a key)
    fol_count: np.ndarray  # follower -> count


class CacheFormatError(UserError, ValueError):
    """A cache file that cannot be used; the message names the file and the problem."""


# promptlookup.fileio's header rule; the format's u32 is the n-gram size, its fields the three sizes
HEADER = BinaryHeader(MAGIC, VERSION, "static cache", "QQQ", HEADER_SIZE,
                      "rebuild it from its corpus with `promptlookup create`", CacheFormatError)


def _sizes(n_vocab: int, n_keys: int, n_fol: int) -> list[tuple[str, str, int]]:
    return [
        ("first_off", "<u4", n_vocab + 1),
        ("key_second", "<i4", n_keys),
        ("key_draft", "<i4", n_keys),
        ("key_total", "<u4", n_keys),
        ("key_off", "<u4", n_keys + 1),
        ("fol_token", "<i4", n_fol),
        ("fol_count", "<u4", n_fol),
    ]


def file_size(n_vocab: int, n_keys: int, n_fol: int) -> int:
    return HEADER_SIZE + sum(4 * n for _, _, n in _sizes(n_vocab, n_keys, n_fol))


class StaticCache:
    """A read-only 2-gram cache: from a file (mmap) or built in memory. Same arrays either way."""

    def __init__(self, arrays: dict[str, np.ndarray], n_vocab: int, fingerprint: str,
                 path: Path | None = None, mm: mmap.mmap | None = None) -> None:
        self.n_vocab = n_vocab
        self.fingerprint = fingerprint
        self.path = path
        self._mm = mm
        self.first_off = arrays["first_off"]
        self.key_second = arrays["key_second"]
        self.key_draft = arrays["key_draft"]
        self.key_total = arrays["key_total"]
        self.key_off = arrays["key_off"]
        self.fol_token = arrays["fol_token"]
        self.fol_count = arrays["fol_count"]
        self._bundle()

    def _bundle(self) -> None:
        # made once (and again by close): a NamedTuple costs more to build than the draft it feeds
        self._arrays = StaticArrays(self.first_off, self.key_second, self.key_draft, self.key_total,
                                    self.key_off, self.fol_token, self.fol_count)

    @property
    def n_keys(self) -> int:
        return len(self.key_second)

    @property
    def n_followers(self) -> int:
        return len(self.fol_token)

    @property
    def arrays(self) -> StaticArrays:
        """The arrays as the numba draft takes them: one bundle, fields by name."""
        return self._arrays

    def key_index(self, t0: int, t1: int) -> int:
        return int(static_key(self.first_off, self.key_second, t0, t1))

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        """Followers of a 2-gram as ``{token: count}`` (the slow path, for tests and conversions)."""
        if len(ngram) != NGRAM_SIZE:
            return {}
        k = self.key_index(int(ngram[0]), int(ngram[1]))
        if k < 0:
            return {}
        lo, hi = int(self.key_off[k]), int(self.key_off[k + 1])
        return {int(t): int(c) for t, c in zip(self.fol_token[lo:hi], self.fol_count[lo:hi], strict=True)}

    def count(self, t0: int, t1: int, token: int) -> int:
        k = self.key_index(t0, t1)
        if k < 0:
            return 0
        return int(_follower_count(self.key_off, self.fol_token, self.fol_count, k, token))

    def triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every (t0, t1, follower, count) as four flat arrays, sorted by (t0, t1, follower)."""
        t0 = np.repeat(np.arange(self.n_vocab, dtype=np.int32), np.diff(self.first_off.astype(np.int64)))
        per_key = np.diff(self.key_off.astype(np.int64))
        return (np.repeat(t0, per_key), np.repeat(self.key_second, per_key),
                np.asarray(self.fol_token, dtype=np.int32), np.asarray(self.fol_count, dtype=np.int64))

    def close(self) -> None:
        # Arrays viewing the map must go before the map can close. Empty arrays of the same types
        # (read-only stays read-only): a source holding a compiled build for them stays sound.
        for name in StaticArrays._fields:
            old = getattr(self, name)
            empty = np.zeros(0, dtype=old.dtype)
            empty.flags.writeable = old.flags.writeable
            setattr(self, name, empty)
        self._bundle()
        if self._mm is not None:
            # a caller may still hold a view: then the map closes when it is collected
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None


def empty_static() -> StaticCache:
    z32 = np.zeros(0, dtype=np.int32)
    u = np.zeros(1, dtype=np.uint32)
    return StaticCache({"first_off": u, "key_second": z32, "key_draft": z32, "key_total": u[:0],
                        "key_off": u.copy(), "fol_token": z32, "fol_count": u[:0]}, 0, "")


# -- lookups (numba, bounds-checked: a corrupt file can mislead, never crash) ---------------------
@njit(cache=True)
def static_key(first_off, key_second, t0, t1):
    """Index of the key ``(t0, t1)`` or -1."""
    if t0 < 0 or t0 + 1 >= first_off.shape[0]:
        return -1
    lo = np.int64(first_off[t0])
    hi = np.int64(first_off[t0 + 1])
    if hi > key_second.shape[0] or lo > hi:
        return -1
    while lo < hi:
        mid = (lo + hi) >> 1
        if key_second[mid] < t1:
            lo = mid + 1
        else:
            hi = mid
    if lo < np.int64(first_off[t0 + 1]) and key_second[lo] == t1:
        return lo
    return -1


@njit(cache=True)
def follower_range(key_off, n_fol, k):
    """``(lo, hi)`` of key ``k``'s followers, or ``(0, 0)`` when the offsets are out of bounds."""
    if k < 0 or k + 1 >= key_off.shape[0]:
        return 0, 0
    lo = np.int64(key_off[k])
    hi = np.int64(key_off[k + 1])
    if lo > hi or hi > n_fol:
        return 0, 0
    return lo, hi


@njit(cache=True)
def search_follower(fol_token, fol_count, lo, hi, token):
    end = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if fol_token[mid] < token:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and fol_token[lo] == token:
        return np.int64(fol_count[lo])
    return np.int64(0)


@njit(cache=True)
def _follower_count(key_off, fol_token, fol_count, k, token):
    lo, hi = follower_range(key_off, fol_token.shape[0], k)
    if lo >= hi:
        return np.int64(0)
    return search_follower(fol_token, fol_count, lo, hi, token)


# -- building -----------------------------------------------------------------------------------
def build_static(t0: np.ndarray, t1: np.ndarray, fol: np.ndarray, count: np.ndarray,
                 n_vocab: int, fingerprint: str) -> StaticCache:
    """Build from (t0, t1, follower, count) arrays; they may be unsorted and repeat triples (counts add)."""
    t0 = np.asarray(t0, dtype=np.int64)
    t1 = np.asarray(t1, dtype=np.int64)
    fol = np.asarray(fol, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    if not (len(t0) == len(t1) == len(fol) == len(count)):
        raise ValueError("build_static: the four arrays differ in length")
    _check_fingerprint_text(fingerprint)
    if not 1 <= n_vocab <= 2**31 - 1:
        raise ValueError(f"build_static: n_vocab {n_vocab} out of range")
    if len(t0) and (min(t0.min(), t1.min(), fol.min()) < 0 or max(t0.max(), t1.max(), fol.max()) >= n_vocab):
        raise ValueError(f"build_static: a token id is outside the vocabulary (0..{n_vocab - 1})")
    if len(count) and count.min() < 1:
        raise ValueError("build_static: counts must be >= 1")
    order = np.lexsort((fol, t1, t0))
    t0, t1, fol, count = t0[order], t1[order], fol[order], count[order]
    if len(t0):
        new = np.ones(len(t0), dtype=bool)
        new[1:] = (t0[1:] != t0[:-1]) | (t1[1:] != t1[:-1]) | (fol[1:] != fol[:-1])
        starts = np.flatnonzero(new)
        count = np.add.reduceat(count, starts)
        t0, t1, fol = t0[starts], t1[starts], fol[starts]
    return from_sorted_triples(t0, t1, fol, count, n_vocab, fingerprint)


def from_sorted_triples(t0: np.ndarray, t1: np.ndarray, fol: np.ndarray, count: np.ndarray,
                        n_vocab: int, fingerprint: str) -> StaticCache:
    """Build from distinct triples already sorted by (t0, t1, follower), all ids in range, counts >= 1."""
    n_fol = len(fol)
    if n_fol:
        newkey = np.ones(n_fol, dtype=bool)
        newkey[1:] = (t0[1:] != t0[:-1]) | (t1[1:] != t1[:-1])
        kstart = np.flatnonzero(newkey)
    else:
        kstart = np.zeros(0, dtype=np.int64)
    n_keys = len(kstart)
    if n_fol > U32_MAX or n_keys > U32_MAX:
        raise InputError("the corpus is too large for the static cache format (2**32 followers)")
    totals = np.add.reduceat(np.asarray(count, dtype=np.int64), kstart) if n_keys else np.zeros(0, np.int64)
    if n_keys and totals.max() > U32_MAX:
        raise InputError("a 2-gram occurs more than 2**32 times: too large for the static cache format")
    key_off = np.empty(n_keys + 1, dtype=np.uint32)
    key_off[:-1] = kstart
    key_off[-1] = n_fol
    key_t0 = np.asarray(t0)[kstart]
    first_off = np.zeros(n_vocab + 1, dtype=np.uint32)
    first_off[1:] = np.cumsum(np.bincount(key_t0, minlength=n_vocab)[:n_vocab])
    fol_token = np.asarray(fol, dtype=np.int32)
    fol_count = np.asarray(count, dtype=np.uint32)
    arrays = {
        "first_off": first_off,
        "key_second": np.asarray(t1, dtype=np.int32)[kstart],
        "key_draft": _fallback_drafts(key_off, fol_token, fol_count),
        "key_total": totals.astype(np.uint32),
        "key_off": key_off,
        "fol_token": fol_token,
        "fol_count": fol_count,
    }
    return StaticCache(arrays, n_vocab, fingerprint)


@njit(cache=True)
def _fallback_drafts(key_off, fol_token, fol_count):
    """Per key: what the static fall-back drafts, or -1. The candidate is the follower with the highest
    count (the lowest token id among equals); it drafts when the key's total is at least
    STATIC_MIN_TOTAL and its count at least STATIC_MIN_PERCENT % of that total."""
    n = key_off.shape[0] - 1
    draft = np.empty(n, dtype=np.int32)
    for k in range(n):
        b = -1
        bc = np.int64(0)
        tot = np.int64(0)
        for j in range(np.int64(key_off[k]), np.int64(key_off[k + 1])):
            c = np.int64(fol_count[j])
            tot += c
            if c > bc:  # tokens ascend, so a strict > keeps the lowest id among equal counts
                bc = c
                b = fol_token[j]
        passes = tot >= STATIC_MIN_TOTAL and 100 * bc >= STATIC_MIN_PERCENT * tot
        draft[k] = b if passes else -1
    return draft


# -- writing and opening -----------------------------------------------------------------------
def _check_fingerprint_text(fp: str) -> None:
    if len(fp) != 16 or any(c not in "0123456789abcdef" for c in fp):
        raise ValueError(f"a tokenizer fingerprint is 16 lowercase hex digits, got {fp!r}")


def write_static(path: str | os.PathLike[str], cache: StaticCache) -> int:
    """Write ``cache`` atomically; returns the file size."""
    body = [np.ascontiguousarray(getattr(cache, name), dtype=dt)
            for name, dt, _ in _sizes(cache.n_vocab, cache.n_keys, cache.n_followers)]
    head = HEADER.pack(NGRAM_SIZE, cache.fingerprint, (cache.n_vocab, cache.n_keys, cache.n_followers),
                       crc32_of(body))
    atomic_write(path, [head, *(memoryview(b).cast("B") for b in body)])
    return file_size(cache.n_vocab, cache.n_keys, cache.n_followers)


def is_static_file(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as fh:
        return fh.read(len(MAGIC)) == MAGIC


def open_static(path: str | os.PathLike[str], fingerprint: str | None = None,
                verify: bool = False) -> StaticCache:
    """Map a static cache file; refuse it with :class:`CacheFormatError` unless its header is sound.

    ``fingerprint``: the tokenizer's; a file built for another vocabulary is refused.
    ``verify``: also check the body CRC and every invariant (reads the whole file; see the module doc).
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < HEADER_SIZE:
                HEADER.read(fh.read(), str(path))  # raises: too short
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise CacheFormatError(f"{path}: cannot open static cache: {exc.strerror}") from None
    try:
        return _open_mapped(path, mm, size, fingerprint, verify)
    except BaseException:
        with contextlib.suppress(BufferError):  # views may survive in the traceback; GC closes it then
            mm.close()
        raise


def _open_mapped(path: Path, mm: mmap.mmap, size: int, fingerprint: str | None, verify: bool) -> StaticCache:
    head = HEADER.read(mm[:HEADER_SIZE], str(path), fingerprint)
    n_vocab, n_keys, n_fol = head.fields
    if head.param != NGRAM_SIZE:
        raise CacheFormatError(f"{path}: n-gram size {head.param} is not supported "
                               "(static caches hold 2-grams)")
    fp = head.fingerprint
    try:
        _check_fingerprint_text(fp)
    except ValueError:
        raise CacheFormatError(f"{path}: static cache header has a malformed tokenizer fingerprint") from None
    if not 1 <= n_vocab <= 2**31 - 1 or n_keys > U32_MAX or n_fol > U32_MAX or n_keys > n_fol:
        raise CacheFormatError(f"{path}: static cache header has impossible sizes "
                               f"(n_vocab {n_vocab}, keys {n_keys}, followers {n_fol})")
    want = file_size(n_vocab, n_keys, n_fol)
    if size != want:
        what = "truncated" if size < want else "has trailing bytes"
        raise CacheFormatError(f"{path}: static cache is {what} ({size} bytes, header says {want})")
    arrays: dict[str, np.ndarray] = {}
    pos = HEADER_SIZE
    for name, dt, n in _sizes(n_vocab, n_keys, n_fol):
        arrays[name] = np.frombuffer(mm, dtype=dt, count=n, offset=pos)
        pos += 4 * n
    cache = StaticCache(arrays, n_vocab, fp, path=path, mm=mm)
    arrays.clear()
    if verify:
        try:
            HEADER.check_body(mm, head.body_crc, str(path))
            problem = check_structure(cache)
            if problem:
                raise CacheFormatError(f"{path}: static cache is inconsistent: {problem}")
        except CacheFormatError:
            cache.close()
            raise
    return cache


def check_structure(c: StaticCache) -> str | None:
    """Every invariant of the format, vectorized; the first broken one as a phrase, or None."""
    n_keys, n_fol, n_vocab = c.n_keys, c.n_followers, c.n_vocab
    fo = c.first_off.astype(np.int64)
    if fo[0] != 0 or fo[-1] != n_keys or np.any(np.diff(fo) < 0):
        return "first-token offsets are not a partition of the keys"
    ko = c.key_off.astype(np.int64)
    if ko[0] != 0 or ko[-1] != n_fol or np.any(np.diff(ko) <= 0):
        return "follower offsets are not a partition of the followers (or a key has none)"
    ks = c.key_second.astype(np.int64)
    if n_keys and (ks.min() < 0 or ks.max() >= n_vocab):
        return "a key token is outside the vocabulary"
    starts = np.zeros(n_keys, dtype=bool)
    starts[fo[:-1][fo[:-1] < n_keys]] = True
    if n_keys > 1 and np.any((np.diff(ks) <= 0) & ~starts[1:]):
        return "key tokens are not strictly ascending within a first token"
    ft = c.fol_token.astype(np.int64)
    if n_fol and (ft.min() < 0 or ft.max() >= n_vocab):
        return "a follower token is outside the vocabulary"
    fstart = np.zeros(n_fol, dtype=bool)
    fstart[ko[:-1]] = True
    if n_fol > 1 and np.any((np.diff(ft) <= 0) & ~fstart[1:]):
        return "followers are not strictly ascending within a key"
    if n_fol and c.fol_count.min() < 1:
        return "a follower count is zero"
    if n_keys:
        totals = np.add.reduceat(c.fol_count.astype(np.int64), ko[:-1])
        if np.any(totals != c.key_total):
            return "a key total differs from the sum of its follower counts"
        if np.any(_fallback_drafts(c.key_off, c.fol_token, c.fol_count) != c.key_draft):
            return "a key's fall-back draft is not its most frequent follower (or -1 when that fails)"
    return None


def verify_static(path: str | os.PathLike[str], fingerprint: str | None = None) -> StaticCache:
    """Open with the full body check: CRC of every byte and every structural invariant."""
    return open_static(path, fingerprint=fingerprint, verify=True)
