"""llama.cpp's own n-gram cache files (``common_ngram_cache_save`` / ``_load``): read and write.

So caches move both ways between llama.cpp's tools and ours. The format has no header: it is a
sequence of records, each little-endian int32::

    key[4]        the n-gram, unused slots -1 (a static cache holds 2-grams, a dynamic one 1..4-grams)
    n_followers   > 0
    (token, count) * n_followers, count > 0

llama.cpp asserts (aborts) on a malformed file and silently keeps the first of duplicate keys. Here
every record is checked before it is used and any problem is one :class:`CacheFormatError` naming the
byte offset: truncation, a non-positive count or length, a negative token, bad padding, a token beyond
the vocabulary, duplicate keys or duplicate followers. We write records sorted by key and followers
sorted by token, so a file we write is a deterministic function of its counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numba import njit

from promptlookup.drafting.lookup.cache import NGRAM_MAX, PAD, NgramCache
from promptlookup.drafting.lookup.static_cache import (
    CacheFormatError,
    StaticCache,
    build_static,
)
from promptlookup.errors import InputError
from promptlookup.fileio import atomic_write

I32_MAX = 2**31 - 1

_ERRORS = {
    1: "truncated record header",
    2: "n-gram with no tokens or a negative token",
    3: "n-gram padding is not -1",
    4: "follower count of a record is not positive",
    5: "truncated follower list",
    6: "negative follower token",
    7: "follower count is not positive",
    8: "duplicate follower token within one record",
}


@njit(cache=True)
def _scan(a):
    """Validate the record stream; (error code, int32 position, records, followers)."""
    size = a.shape[0]
    pos = np.int64(0)
    nr = np.int64(0)
    nf = np.int64(0)
    while pos < size:
        if pos + 5 > size:
            return 1, pos, nr, nf
        n = 0
        while n < 4 and a[pos + n] >= 0:
            n += 1
        if n == 0:
            return 2, pos, nr, nf
        for j in range(n, 4):
            if a[pos + j] != -1:
                return 3, pos, nr, nf
        nt = np.int64(a[pos + 4])
        if nt <= 0:
            return 4, pos, nr, nf
        if pos + 5 + 2 * nt > size:
            return 5, pos, nr, nf
        for j in range(nt):
            if a[pos + 5 + 2 * j] < 0:
                return 6, pos, nr, nf
            if a[pos + 6 + 2 * j] <= 0:
                return 7, pos, nr, nf
        toks = np.sort(a[pos + 5 : pos + 5 + 2 * nt : 2])
        for j in range(1, nt):
            if toks[j] == toks[j - 1]:
                return 8, pos, nr, nf
        pos += 5 + 2 * nt
        nr += 1
        nf += nt
    return 0, pos, nr, nf


@njit(cache=True)
def _fill(a, nr, nf):
    keys = np.empty((nr, 4), dtype=np.int32)
    off = np.zeros(nr + 1, dtype=np.int64)
    tok = np.empty(nf, dtype=np.int32)
    cnt = np.empty(nf, dtype=np.int64)
    pos = 0
    p = 0
    for r in range(nr):
        for j in range(4):
            keys[r, j] = a[pos + j]
        nt = a[pos + 4]
        # followers sorted by token inside a record
        order = np.argsort(a[pos + 5 : pos + 5 + 2 * nt : 2], kind="mergesort")
        for j in range(nt):
            tok[p + j] = a[pos + 5 + 2 * order[j]]
            cnt[p + j] = a[pos + 6 + 2 * order[j]]
        p += nt
        off[r + 1] = p
        pos += 5 + 2 * nt
    return keys, off, tok, cnt


@njit(cache=True)
def _pack(keys, off, tok, cnt, order):
    n = order.shape[0]
    out = np.empty(5 * n + 2 * tok.shape[0], dtype=np.int32)
    pos = 0
    for i in range(n):
        r = order[i]
        for j in range(4):
            out[pos + j] = keys[r, j]
        out[pos + 4] = off[r + 1] - off[r]
        pos += 5
        for j in range(off[r], off[r + 1]):
            out[pos] = tok[j]
            out[pos + 1] = cnt[j]
            pos += 2
    return out


Records = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def parse_llamacpp(data: bytes | np.ndarray, name: str = "<bytes>", n_vocab: int | None = None) -> Records:
    """Parse and validate file contents; (keys int32[N,4], offsets int64[N+1], tokens, counts)."""
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if len(raw) % 4:
        raise CacheFormatError(f"{name}: truncated llama.cpp cache ({len(raw)} bytes is not a whole "
                               "number of int32 values)")
    a = raw.view("<i4")
    code, pos, nr, nf = _scan(a)
    if code:
        raise CacheFormatError(f"{name}: not a valid llama.cpp n-gram cache: {_ERRORS[code]} "
                               f"at byte {4 * pos}")
    keys, off, tok, cnt = _fill(a, nr, nf)
    if nr > 1:
        order = np.lexsort(keys.T[::-1])
        sk = keys[order]
        dup = np.flatnonzero(np.all(sk[1:] == sk[:-1], axis=1))
        if len(dup):
            bad = tuple(int(t) for t in sk[dup[0]] if t != PAD)
            raise CacheFormatError(f"{name}: not a valid llama.cpp n-gram cache: n-gram {bad} appears twice")
    if n_vocab is not None:
        top = max(int(keys.max(initial=-1)), int(tok.max(initial=-1)))
        if top >= n_vocab:
            raise CacheFormatError(f"{name}: token id {top} is outside this model's vocabulary "
                                   f"(0..{n_vocab - 1}); was the cache built for another model?")
    return keys, off, tok, cnt


def read_llamacpp(path: str | os.PathLike[str], n_vocab: int | None = None) -> Records:
    """A llama.cpp cache file, parsed and checked; a zero-byte file or a file of another kind is
    refused, naming what it is (a headerless format would otherwise accept it)."""
    from promptlookup.formats import foreign_kind

    path = Path(path)
    kind = foreign_kind(path, own=None)
    if kind is not None:
        raise CacheFormatError(f"{path}: is {kind}, not a llama.cpp n-gram cache")
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise CacheFormatError(f"{path}: cannot read cache: {exc.strerror}") from None
    return parse_llamacpp(data, str(path), n_vocab)


def pack_llamacpp(keys: np.ndarray, off: np.ndarray, tok: np.ndarray, cnt: np.ndarray) -> bytes:
    """Records in llama.cpp's layout, sorted by key; followers must already be sorted by token."""
    if len(cnt) and int(np.max(cnt)) > I32_MAX:
        raise InputError("a count exceeds 2**31 - 1, which llama.cpp's int32 cache format cannot hold")
    keys = np.ascontiguousarray(keys, dtype=np.int32).reshape(-1, NGRAM_MAX)
    order = np.lexsort(keys.T[::-1]) if len(keys) else np.zeros(0, dtype=np.int64)
    out = _pack(keys, np.asarray(off, dtype=np.int64), np.asarray(tok, dtype=np.int32),
                np.asarray(cnt, dtype=np.int64), order.astype(np.int64))
    return out.astype("<i4").tobytes()


def write_llamacpp(path: str | os.PathLike[str], keys: np.ndarray, off: np.ndarray, tok: np.ndarray,
                   cnt: np.ndarray) -> int:
    data = pack_llamacpp(keys, off, tok, cnt)
    atomic_write(path, [data])
    return len(data)


# -- conversions --------------------------------------------------------------------------------
def static_from_records(records: Records, n_vocab: int, fingerprint: str,
                        name: str = "<cache>") -> StaticCache:
    keys, off, tok, cnt = records
    if len(keys) and not (np.all(keys[:, :2] >= 0) and np.all(keys[:, 2:] == PAD)):
        raise CacheFormatError(f"{name}: holds n-grams other than 2-grams, so it is not a static cache "
                               "(a dynamic cache can only be written in llama.cpp's format)")
    per = np.diff(off)
    return build_static(np.repeat(keys[:, 0], per), np.repeat(keys[:, 1], per), tok, cnt, n_vocab,
                        fingerprint)


def records_from_static(cache: StaticCache) -> Records:
    t0, t1, tok, cnt = cache.triples()
    per_key = np.diff(cache.key_off.astype(np.int64))
    starts = cache.key_off[:-1].astype(np.int64)
    keys = np.full((cache.n_keys, NGRAM_MAX), PAD, dtype=np.int32)
    keys[:, 0] = t0[starts] if len(starts) else keys[:, 0]
    keys[:, 1] = t1[starts] if len(starts) else keys[:, 1]
    off = np.concatenate(([0], np.cumsum(per_key))).astype(np.int64)
    return keys, off, tok, cnt


def ngram_cache_from_records(records: Records) -> NgramCache:
    cache = NgramCache(capacity=max(16, len(records[0])))
    cache.add_records(*records)
    return cache


def load_dynamic(path: str | os.PathLike[str], n_vocab: int | None = None) -> NgramCache:
    """A dynamic cache file (llama.cpp format); a missing file is an empty cache, as in llama.cpp."""
    if not Path(path).exists():
        return NgramCache()
    return ngram_cache_from_records(read_llamacpp(path, n_vocab))


def save_dynamic(path: str | os.PathLike[str], cache: NgramCache) -> int:
    """Write a dynamic cache; an empty one is not written (a missing file is the empty cache, and a
    zero-byte file is refused when read), so the size is 0."""
    if not len(cache):
        return 0
    return write_llamacpp(path, *cache.records())


# -- files of either format (for the CLI) ------------------------------------------------------
def open_static_any(path: str | os.PathLike[str], n_vocab: int, fingerprint_fn,
                    verify: bool = False) -> StaticCache:
    """A static cache from our format (mapped, fingerprint checked) or llama.cpp's (parsed, ids checked).

    ``fingerprint_fn()`` gives the tokenizer's fingerprint; it is only called when needed. ``verify``:
    our format's full body check (llama.cpp's format is always parsed and checked whole).
    """
    from promptlookup.drafting.lookup.static_cache import is_static_file, open_static

    path = Path(path)
    if not path.is_file():
        raise CacheFormatError(f"static cache not found: {path}")
    if is_static_file(path):
        cache = open_static(path, fingerprint=fingerprint_fn(), verify=verify)
        if cache.n_vocab != n_vocab:
            raise CacheFormatError(f"{path}: built for a vocabulary of {cache.n_vocab} tokens, "
                                   f"the model has {n_vocab}")
        return cache
    return static_from_records(read_llamacpp(path, n_vocab), n_vocab, fingerprint_fn(), str(path))


def merge_files(inputs: list[str], output: str, fmt: str | None, vocab_fn=None) -> str:
    """Add the counts of ``inputs`` (either format) and write ``output``; returns a summary line.

    ``fmt``: "static" (ours, 2-grams only) or "llamacpp"; default the first input's format.
    ``vocab_fn()`` -> (n_vocab, fingerprint) of a tokenizer, needed only to write our format when no
    input is in our format.
    """
    from promptlookup.drafting.lookup.static_cache import is_static_file, open_static, write_static
    from promptlookup.formats import foreign_kind

    if not inputs:
        raise InputError("merge needs at least one input cache")
    for p in inputs:
        if not Path(p).is_file():
            raise CacheFormatError(f"cache not found: {p}")
    kinds = ["static" if is_static_file(p) else "llamacpp" for p in inputs]
    for p, k in zip(inputs, kinds, strict=True):  # every input's kind before any is parsed
        kind = foreign_kind(p, own=None) if k == "llamacpp" else None
        if kind is not None:
            raise CacheFormatError(f"{p}: is {kind}, not a lookup cache (ours or llama.cpp's)")
    fmt = fmt or kinds[0]
    statics = [open_static(p, verify=True) for p, k in zip(inputs, kinds, strict=True) if k == "static"]
    try:
        fps = {(c.n_vocab, c.fingerprint) for c in statics}
        if len(fps) > 1:
            raise CacheFormatError("the static caches were built for different tokenizers: "
                                   + ", ".join(f"{p} ({c.fingerprint})" for p, c in
                                               zip([p for p, k in zip(inputs, kinds, strict=True)
                                                    if k == "static"], statics, strict=True)))
        n_vocab = next(iter(fps))[0] if fps else None
        parts: list[Records] = []
        names: list[str] = []  # parallel to parts: llama.cpp inputs first, then ours
        for p, k in zip(inputs, kinds, strict=True):
            if k == "llamacpp":
                parts.append(read_llamacpp(p, n_vocab))
                names.append(p)
        parts.extend(records_from_static(c) for c in statics)
        names.extend(p for p, k in zip(inputs, kinds, strict=True) if k == "static")
        if fmt == "static":
            if fps:
                n_vocab, fp = next(iter(fps))
            elif vocab_fn is not None:
                n_vocab, fp = vocab_fn()
            else:
                raise InputError("writing our static format needs a tokenizer fingerprint: give -m MODEL")
            t0s, t1s, toks, cnts = [], [], [], []
            for name, (keys, off, tok, cnt) in zip(names, parts, strict=True):
                if len(keys) and not (np.all(keys[:, :2] >= 0) and np.all(keys[:, 2:] == PAD)):
                    raise CacheFormatError(f"{name}: holds n-grams other than 2-grams; merge it with "
                                           "--format llamacpp")
                per = np.diff(off)
                t0s.append(np.repeat(keys[:, 0], per))
                t1s.append(np.repeat(keys[:, 1], per))
                toks.append(tok)
                cnts.append(cnt)
            merged = build_static(np.concatenate(t0s), np.concatenate(t1s), np.concatenate(toks),
                                  np.concatenate(cnts), n_vocab, fp)
            size = write_static(output, merged)
            return (f"merge: {len(inputs)} caches -> {output} (static format): {merged.n_keys} 2-grams, "
                    f"{merged.n_followers} followers, {size} bytes")
        if fmt != "llamacpp":
            raise InputError(f"unknown cache format {fmt!r} (static or llamacpp)")
        total = NgramCache(capacity=max(16, sum(len(p[0]) for p in parts)))
        for rec in parts:
            total.add_records(*rec)
        if not len(total):
            raise CacheFormatError("the merged cache is empty: nothing to write "
                                   "(a zero-byte file is not a cache)")
        size = save_dynamic(output, total)
        return (f"merge: {len(inputs)} caches -> {output} (llama.cpp format): {len(total)} n-grams, "
                f"{total.n_entries} followers, {size} bytes")
    finally:
        for c in statics:
            c.close()
