"""The lookup-stats replay of ``--lookup`` compiled whole: one numba call per chunk.

Why: :func:`promptlookup.measure.replay.replay` drives any DraftSource through Python, one ``propose`` (a
``Draft`` object) and one ``extend`` per confirmed token. That costs 10-17 us per drafted token, while
the drafting itself is well under one: the measurement would be of the interpreter, not of the rule.
Here the whole per-chunk loop (draft, compare with the text, update the context cache) runs inside
one compiled function over the same arrays and the same numba draft rule the ``--lookup`` source uses;
Python only resets the context cache and merges it into the dynamic one between chunks, as
lookup-stats does outside its timers. :func:`promptlookup.measure.replay.replay` with
:class:`~promptlookup.drafting.lookup.source.LookupSource` stays the reference: tests hold both to identical
``n_drafted`` / ``n_accept`` on real text.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.lookup.cache import NGRAM_MAX, NGRAM_MIN, NgramCache, update_ngrams
from promptlookup.drafting.lookup.source import LookupSource, draft_core
from promptlookup.drafting.lookup.static_cache import StaticCache
from promptlookup.errors import InputError
from promptlookup.measure.replay import ReplayStats


@njit(cache=True)
def _replay_chunk(chunk, n_ctx, n_draft, buf, ctx, dyn, static):
    """lookup-stats' inner loop over one chunk; (n_drafted, n_accept). The context cache ``ctx`` must
    be empty with room for ``4 * n_ctx`` n-grams and entries; ``buf`` holds ``n_ctx + n_draft``
    tokens. The caches are the tuples :func:`draft_core` takes."""
    info = np.zeros(4, dtype=np.int64)
    sub = np.zeros(3, dtype=np.int64)
    buf[0] = chunk[0]
    n = 1
    n_drafted = 0
    n_accept = 0
    while n < n_ctx:
        d = draft_core(buf, n, n_draft, ctx, dyn, static, info, sub)
        n_drafted += d
        # drafted token j sits at buf[n] once j tokens are accepted: compare in place
        for _ in range(d):
            if n >= n_ctx or chunk[n] != buf[n]:
                break
            n += 1
            n_accept += 1
            update_ngrams(ctx, buf, n, 1, NGRAM_MIN, NGRAM_MAX)
        if n < n_ctx:
            buf[n] = chunk[n]
            n += 1
            update_ngrams(ctx, buf, n, 1, NGRAM_MIN, NGRAM_MAX)
    return n_drafted, n_accept


def _run_chunk(chunk: np.ndarray, n_draft: int, buf: np.ndarray, source: LookupSource) -> tuple[int, int]:
    return _replay_chunk(chunk, len(chunk), n_draft, buf, source.context.tables, source.dynamic.tables,
                         source.static.arrays)


def _fresh_context(ctx: NgramCache, n_ctx: int) -> None:
    ctx.clear()
    size = (NGRAM_MAX - NGRAM_MIN + 1) * n_ctx
    ctx.reserve(size, size)


def warm_up(static: StaticCache | None = None) -> None:
    """Load (or compile) the replay before anything is timed: for ``static``'s array types (a mapped
    file's arrays are read-only, a type of their own to numba)."""
    src = LookupSource(static=static)
    _fresh_context(src.context, 8)
    _run_chunk(np.array([1, 2, 1, 2, 1, 2, 1, 2], dtype=np.int32), 2, np.zeros(10, np.int32), src)


def replay_lookup(tokens: Sequence[int] | np.ndarray, n_ctx: int, n_draft: int,
                  static: StaticCache | None = None, dynamic: NgramCache | None = None,
                  t_load_s: float = 0.0) -> ReplayStats:
    """Fast twin of ``replay(tokens, n_ctx, n_draft, lambda: LookupSource(static, dynamic))``."""
    if n_ctx < 2:
        raise InputError(f"the replay chunk size (-c) must be at least 2, got {n_ctx}")
    if n_draft < 1:
        raise InputError(f"--draft must be at least 1, got {n_draft}")
    toks = np.ascontiguousarray(tokens, dtype=np.int32)
    n_input = len(toks)
    warm_up(static)
    source = LookupSource(static=static, dynamic=dynamic)
    st = ReplayStats(source=source.name, n_draft=n_draft, n_ctx=n_ctx, n_input=n_input,
                     n_predict=n_input - n_input % n_ctx, t_load_s=t_load_s)
    buf = np.zeros(n_ctx + n_draft, dtype=np.int32)
    perf = time.perf_counter
    t_draft = 0.0
    i_start = 0
    while i_start + n_ctx < n_input:
        _fresh_context(source.context, n_ctx)
        t0 = perf()
        nd, na = _run_chunk(toks[i_start : i_start + n_ctx], n_draft, buf, source)
        t_draft += perf() - t0
        st.n_drafted += nd
        st.n_accept += na
        source.commit()
        st.n_chunks += 1
        i_start += n_ctx
    st.n_replayed = st.n_chunks * n_ctx
    st.t_draft_s = t_draft
    st.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return st
