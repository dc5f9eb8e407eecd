"""Tokenize a corpus and count its 2-gram followers into a static cache (``promptlookup create``).

Why this shape: llama.cpp's lookup-create tokenizes the whole corpus in one call on one core and
counts into hash maps of hash maps (about 2x the file in memory, hours-scale for big corpora). Here:

- The corpus files are read as one byte stream (as ``cat`` would join them) in blocks of a few MiB,
  each cut just before a newline that follows a printable ASCII character. Every pre-tokenizer we
  know ends a piece there (a word, number or punctuation run never swallows a newline), so tokenizing
  the blocks separately gives the tokens of the whole text; tests check that on real text.
- Worker processes each load only the model's vocabulary (``vocab_only``), tokenize a block and count
  its (t0, t1, follower) triples with numpy: a triple is one uint64 (21 bits per id), ``np.unique``
  gives sorted keys and counts. The parent merges the sorted runs (numba, a binary-counter stack of
  runs so the total work is N log N), adds the triples that straddle block boundaries, and decodes.
- At most two blocks per worker are in flight, so memory is bounded by the distinct triples, not the
  corpus size. Text is read as is: no escape processing (llama.cpp processes escapes in ``-f`` text
  unless given ``--no-escape``) and the last newline is kept (llama.cpp drops it).

Tokenization is llama.cpp's: ``add_special`` at the start of the stream, ``parse_special`` on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from promptlookup.build.tokenizers import describe_tokenizer, open_tokenizer
from promptlookup.drafting.lookup.static_cache import StaticCache, from_sorted_triples
from promptlookup.errors import InputError, UserError
from promptlookup.textin import check_input_files, repair_utf8, replaced_note

BLOCK = 4 << 20  # bytes per tokenization block
MAX_BLOCK = 64 << 20  # a block with no safe cut by then is cut hard
MAX_VOCAB = 1 << 21  # three ids must fit one uint64


# -- splitting --------------------------------------------------------------------------------
def _safe_cut(buf: bytes | bytearray) -> int:
    """Last position p with buf[p] == '\\n' and buf[p-1] printable non-space ASCII; 0 if none."""
    p = len(buf)
    while True:
        p = buf.rfind(b"\n", 0, p)
        if p <= 0:
            return 0
        if 0x21 <= buf[p - 1] <= 0x7E:
            return p


def iter_blocks(paths: Sequence[str | os.PathLike[str]], block: int = BLOCK) -> Iterator[bytes]:
    """The concatenated files as blocks cut at safe points."""
    pending = bytearray()
    for path in paths:
        with open(path, "rb") as fh:
            while True:
                data = fh.read(block)
                if not data:
                    break
                pending += data
                while len(pending) >= block:
                    cut = _safe_cut(pending)
                    if cut == 0:
                        if len(pending) < MAX_BLOCK:
                            break
                        cut = len(pending)
                    yield bytes(pending[:cut])
                    del pending[:cut]
    if pending:
        yield bytes(pending)


# -- counting ---------------------------------------------------------------------------------
def triple_bits(n_vocab: int) -> int:
    if n_vocab > MAX_VOCAB:
        raise InputError(f"vocabularies above {MAX_VOCAB} tokens are not supported by create "
                         f"(this one has {n_vocab})")
    return max(1, (n_vocab - 1).bit_length())


def count_triples(tokens: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct (t0, t1, follower) keys of a token run and their counts."""
    t = np.asarray(tokens, dtype=np.uint64)
    if len(t) < 3:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32)
    b = np.uint64(bits)
    keys = (t[:-2] << (b + b)) | (t[1:-1] << b) | t[2:]
    keys, counts = np.unique(keys, return_counts=True)
    return keys, counts.astype(np.uint32)


@njit(cache=True)
def _merge_runs(ka, ca, kb, cb):
    out_k = np.empty(ka.shape[0] + kb.shape[0], dtype=np.uint64)
    out_c = np.empty(ka.shape[0] + kb.shape[0], dtype=np.uint32)
    i = j = n = 0
    overflow = False
    while i < ka.shape[0] and j < kb.shape[0]:
        if ka[i] < kb[j]:
            out_k[n] = ka[i]
            out_c[n] = ca[i]
            i += 1
        elif kb[j] < ka[i]:
            out_k[n] = kb[j]
            out_c[n] = cb[j]
            j += 1
        else:
            s = np.uint64(ca[i]) + np.uint64(cb[j])
            if s > np.uint64(4294967295):
                overflow = True
            out_k[n] = ka[i]
            out_c[n] = np.uint32(s)
            i += 1
            j += 1
        n += 1
    while i < ka.shape[0]:
        out_k[n] = ka[i]
        out_c[n] = ca[i]
        i += 1
        n += 1
    while j < kb.shape[0]:
        out_k[n] = kb[j]
        out_c[n] = cb[j]
        j += 1
        n += 1
    return out_k[:n].copy(), out_c[:n].copy(), overflow


class RunStack:
    """Sorted (key, count) runs merged like a binary counter: N log N work, bounded live memory."""

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def push(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self.runs.append((keys, counts))
        while len(self.runs) >= 2 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            self._merge_top()

    def _merge_top(self) -> None:
        kb, cb = self.runs.pop()
        ka, ca = self.runs.pop()
        k, c, overflow = _merge_runs(ka, ca, kb, cb)
        if overflow:
            raise InputError("a 2-gram follower occurs more than 2**32 times: corpus too large")
        self.runs.append((k, c))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        while len(self.runs) >= 2:
            self._merge_top()
        if not self.runs:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32)
        return self.runs.pop()


_WORKER = None  # the worker process's tokenizer
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent_pid: int) -> None:
    """Make this worker process end when the process that started it does, however that ends.

    Why: a pool's workers otherwise outlive a parent killed with SIGKILL (nothing runs in the
    parent to stop them): each holds a vocabulary and hundreds of MB, and keeps the resource
    tracker alive through the pipe it inherited. On Linux the kernel sends SIGKILL when the
    parent dies (``prctl(PR_SET_PDEATHSIG)``); a parent that died before that call, or another
    system, is caught by a daemon thread that polls the parent pid.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def worker_init(model_path: str, kind: str = "memo", parent_pid: int | None = None) -> None:
    global _WORKER
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    _WORKER = open_tokenizer(model_path, kind)


@contextlib.contextmanager
def pool_errors() -> Iterator[None]:
    """A tokenizer pool whose worker died is one clear error, not a BrokenProcessPool traceback."""
    try:
        yield
    except BrokenProcessPool:
        raise UserError("a tokenizer worker process died (killed, or out of memory); nothing was written") \
            from None


def map_blocks(paths: Sequence[str], block: int, model_path: str | os.PathLike[str], tokenizer: str,
               workers: int, absorb: Callable[[Any, int], None], task: Callable[..., Any],
               *args: Any) -> None:
    """Run ``task(data, first, *args)`` on every corpus block in a pool of tokenizer workers and hand
    each result to ``absorb(result, block bytes)`` in block order (``create`` and ``index`` share it).

    Workers are spawned (no fork of a process holding a vocabulary), die with this process
    (:func:`worker_init`), and at most two blocks per worker are in flight, so memory stays bounded
    by the block size whatever the corpus size.
    """
    n = max(1, workers)
    with pool_errors(), ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn"),
                                            initializer=worker_init,
                                            initargs=worker_initargs(model_path, tokenizer)) as pool:
        inflight: deque[tuple[Future, int]] = deque()
        first = True
        for data in iter_blocks(paths, block):
            inflight.append((pool.submit(task, data, first, *args), len(data)))
            first = False
            while len(inflight) >= 2 * n:
                fut, nbytes = inflight.popleft()
                absorb(fut.result(), nbytes)
        while inflight:
            fut, nbytes = inflight.popleft()
            absorb(fut.result(), nbytes)


def worker_initargs(model_path: str | os.PathLike[str], kind: str) -> tuple:
    """``initargs`` of a tokenizer pool: the model, the tokenizer kind, and this (parent) pid."""
    return (str(model_path), kind, os.getpid())


def worker_tokens(data: bytes, add_special: bool) -> tuple[np.ndarray, int]:
    """A block's tokens in a worker process (``add_special`` for the stream's first block), and the
    invalid UTF-8 sequences replaced in it first (:mod:`promptlookup.textin`)."""
    assert _WORKER is not None
    data, n_bad = repair_utf8(data)
    return _WORKER.tokenize(data, add_special=add_special, parse_special=True), n_bad


def _worker_count(data: bytes, add_special: bool, bits: int) -> tuple:
    tokens, n_bad = worker_tokens(data, add_special)
    keys, counts = count_triples(tokens, bits)
    return keys, counts, tokens[:2].copy(), tokens[-2:].copy(), len(tokens), n_bad


@dataclass
class CreateStats:
    n_bytes: int = 0
    n_tokens: int = 0
    n_keys: int = 0
    n_followers: int = 0
    seconds: float = 0.0
    peak_rss_bytes: int = 0  # the parent
    peak_rss_children_bytes: int = 0  # the largest worker
    tokenizer: str = ""
    n_invalid_utf8: int = 0  # invalid UTF-8 sequences replaced by U+FFFD before tokenizing

    def report_lines(self) -> list[str]:
        return [
            f"create: tokens: {self.tokenizer}",
            f"create: {self.n_bytes / 1e6:.1f} MB -> {self.n_tokens} tokens -> {self.n_keys} 2-grams, "
            f"{self.n_followers} followers in {self.seconds:.1f} s",
            f"create: peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB (parent), "
            f"{self.peak_rss_children_bytes / 2**20:.0f} MiB (largest worker)",
            *replaced_note(self.n_invalid_utf8, "create"),
        ]


def build_from_corpus(paths: Sequence[str | os.PathLike[str]], model_path: str | os.PathLike[str],
                      n_vocab: int, fingerprint: str, workers: int = 2, progress: bool = True,
                      block: int = BLOCK, tokenizer: str = "memo") -> tuple[StaticCache, CreateStats]:
    """Tokenize ``paths`` (joined) in ``workers`` processes and build the static cache in memory."""
    from tqdm import tqdm

    check_input_files(paths, "corpus file")
    bits = triple_bits(n_vocab)
    total = sum(Path(p).stat().st_size for p in paths)
    if not total:
        raise InputError("the corpus is empty (0 bytes): nothing to count")
    st = CreateStats(n_bytes=total)
    t_start = time.perf_counter()
    stack = RunStack()
    edge: list[int] = []  # boundary triples, as flat token triples
    tail = np.zeros(0, dtype=np.int32)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="create", disable=not progress, file=sys.stderr)

    def absorb(result: tuple, nbytes: int) -> None:
        nonlocal tail
        keys, counts, head, last, n_tok, n_bad = result
        st.n_invalid_utf8 += n_bad
        if n_tok:
            joint = np.concatenate((tail, head))
            for i in range(len(joint) - 2):
                if i + 2 >= len(tail):  # straddles the boundary
                    edge.extend(int(x) for x in joint[i : i + 3])
            tail = np.concatenate((tail, last if n_tok >= 2 else head))[-2:]
            if len(keys):
                stack.push(keys, counts)
            st.n_tokens += n_tok
        bar.update(nbytes)

    map_blocks(paths, block, model_path, tokenizer, workers, absorb, _worker_count, bits)
    bar.close()
    if edge:
        e = np.asarray(edge, dtype=np.int64).reshape(-1, 3)
        b = np.uint64(bits)
        ek = ((e[:, 0].astype(np.uint64) << (b + b)) | (e[:, 1].astype(np.uint64) << b)
              | e[:, 2].astype(np.uint64))
        k, c = np.unique(ek, return_counts=True)
        stack.push(k, c.astype(np.uint32))
    keys, counts = stack.result()
    if not len(keys):
        raise InputError(f"the corpus has {st.n_tokens} tokens and so no 2-gram with a follower: "
                         "nothing to write")
    b = np.uint64(bits)
    mask = np.uint64((1 << bits) - 1)
    t0 = (keys >> (b + b)).astype(np.int32)
    t1 = ((keys >> b) & mask).astype(np.int32)
    fol = (keys & mask).astype(np.int32)
    del keys
    cache = from_sorted_triples(t0, t1, fol, counts, n_vocab, fingerprint)
    st.n_keys, st.n_followers = cache.n_keys, cache.n_followers
    st.seconds = time.perf_counter() - t_start
    st.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    st.peak_rss_children_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return cache, st


def check_output_path(output: str | os.PathLike[str]) -> None:
    """Refuse an output path that cannot be written before any work is done."""
    p = Path(output)
    if p.is_dir():
        raise InputError(f"output is a directory, not a file: {p}")
    if not p.resolve().parent.is_dir():
        raise InputError(f"output directory does not exist: {p.parent}")


def run_create(paths: Sequence[str], model_path: str | os.PathLike[str], output: str, fmt: str = "static",
               workers: int = 2, progress: bool = True, tokenizer: str = "memo") -> CreateStats:
    """``promptlookup create``: build the static cache of ``paths`` and write it atomically to ``output``."""
    from promptlookup.drafting.lookup.llamacpp_file import records_from_static, write_llamacpp
    from promptlookup.drafting.lookup.static_cache import write_static

    if fmt not in ("static", "llamacpp"):
        raise InputError(f"unknown cache format {fmt!r} (static or llamacpp)")
    check_output_path(output)
    check_input_files(paths, "corpus file")
    tok = open_tokenizer(model_path, tokenizer)
    fp = getattr(tok, "base", tok).fingerprint()
    cache, st = build_from_corpus(paths, model_path, tok.n_vocab, fp, workers=workers, progress=progress,
                                  tokenizer=tokenizer)
    st.tokenizer = describe_tokenizer(tok)
    if fmt == "static":
        write_static(output, cache)
    else:
        write_llamacpp(output, *records_from_static(cache))
    st.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return st
