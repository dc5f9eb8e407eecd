"""``--lookup``: llama.cpp's lookup-decoding draft rule over the context, dynamic and static caches.

The rule (llama.cpp ``common_ngram_cache_draft``), for each token to draft, on the sequence so far
extended by the tokens already drafted:

1. The static part: the followers of the last 2 tokens in the static cache (maybe none).
2. Context cache, then dynamic cache: for n = 4, 3, 2, 1 (skipping n longer than the sequence),
   look up the last n tokens. Each follower y scores ``count(y) * w(y)`` with ``w(y) = 100 *
   static_count(y)`` when the static part has y, else 1. The best y passes when the n-gram was seen
   at least ``a_n`` times in that cache and ``100 * count(best) >= p_n * total`` (count, not score).
   The first passing n drafts its best; context thresholds are lax, dynamic ones strict.
3. Neither drafted: the static part alone drafts its most frequent follower when the 2-gram was
   seen at least 2 times and that follower holds at least 50 % (``LLAMA_NGRAM_STATIC = 2``).
4. Nothing passed: stop. Otherwise append and repeat, up to k tokens. Fewer than 2 tokens of
   confirmed sequence: no draft at all.

Where we deliberately differ from llama.cpp (behaviour it has by accident, not by design):

- Ties. llama.cpp keeps the first best follower its ``unordered_map`` iterates, an order set by
  hashing and insertion history. We keep the lowest token id among equal scores (and, for the static
  fall-back, among equal counts). Followers are sorted by id, so this is a strict ``>`` scan.
- Overflow. llama.cpp multiplies two int32 (count x 100 x static count), which overflows on large
  corpora and can change the winner. We use 64-bit integers: exact while the product is below 2**63.
- Short sequences. For n longer than the sequence llama.cpp builds its n-gram from memory before the
  buffer (undefined behaviour; in practice a key that matches nothing). We skip that n.

:func:`draft_reference` states the rule in plain Python over any caches with ``get(ngram) -> {token:
count}``; :func:`draft_into` is the numba twin the source uses. Tests hold them equal on real text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.base import Draft, StepFeedback, TokenBuffer, compiled_entry, make_draft
from promptlookup.drafting.lookup.cache import (
    NGRAM_MAX,
    NGRAM_STATIC,
    NgramCache,
    find_ngram,
)
from promptlookup.drafting.lookup.static_cache import (
    STATIC_MIN_PERCENT,
    STATIC_MIN_TOTAL,
    StaticCache,
    empty_static,
    follower_range,
    search_follower,
    static_key,
)
from promptlookup.drafting.spec import DRAFT, Option, Run, SourceSpec

# llama.cpp's thresholds, index n - 1 (ngram-cache.cpp: draft_min_*_lax / _strict)
CONTEXT_MIN_SAMPLE = (2, 2, 1, 1)
CONTEXT_MIN_PERCENT = (66, 50, 50, 50)
DYNAMIC_MIN_SAMPLE = (4, 3, 2, 2)
DYNAMIC_MIN_PERCENT = (75, 66, 66, 66)
STATIC_WEIGHT = 100

ORIGIN_NONE, ORIGIN_CONTEXT, ORIGIN_DYNAMIC, ORIGIN_STATIC = 0, 1, 2, 3
ORIGIN_NAMES = ("none", "context", "dynamic", "static")
# follower entries a source that outlives one request keeps in its dynamic cache (an engine's slot:
# Engine(lookup_budget=...), serve --lookup-budget; the drop-ins; the vLLM proposer's rows): its arrays
# stopped at 4 MiB over 2.8M tokens of varied text (see LookupSource), 30 MiB and growing without it
LONG_LIVED_BUDGET = 65_536


class _Empty:
    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        return {}


def _best(part: dict[int, int], weight) -> tuple[int, int]:
    """(token, count) maximizing count * weight(token); the lowest token id among equal scores."""
    best_tok, best_cnt, best_score = -1, 0, 0
    for tok in sorted(part):
        score = part[tok] * weight(tok)
        if score > best_score:
            best_tok, best_cnt, best_score = tok, part[tok], score
    return best_tok, best_cnt


def draft_one_reference(seq: Sequence[int], context, dynamic, static) -> tuple[int, int, int]:
    """One drafted token for ``seq``: (token or -1, origin, n-gram size)."""
    static_part = static.get(tuple(seq[-NGRAM_STATIC:])) if len(seq) >= NGRAM_STATIC else {}

    def weight(tok: int) -> int:
        return STATIC_WEIGHT * static_part[tok] if tok in static_part else 1

    for cache, origin, min_sample, min_percent in (
        (context, ORIGIN_CONTEXT, CONTEXT_MIN_SAMPLE, CONTEXT_MIN_PERCENT),
        (dynamic, ORIGIN_DYNAMIC, DYNAMIC_MIN_SAMPLE, DYNAMIC_MIN_PERCENT),
    ):
        for n in range(NGRAM_MAX, 0, -1):
            if n > len(seq):
                continue
            part = cache.get(tuple(seq[-n:]))
            if not part:
                continue
            total = sum(part.values())
            tok, cnt = _best(part, weight)
            if total >= min_sample[n - 1] and 100 * cnt >= min_percent[n - 1] * total:
                return tok, origin, n
    if static_part:
        total = sum(static_part.values())
        tok, cnt = _best(static_part, lambda t: 1)
        if total >= STATIC_MIN_TOTAL and 100 * cnt >= STATIC_MIN_PERCENT * total:
            return tok, ORIGIN_STATIC, NGRAM_STATIC
    return -1, ORIGIN_NONE, 0


def draft_reference(seq: Sequence[int], k: int, context=None, dynamic=None, static=None) -> list[int]:
    """The whole rule in plain Python: up to ``k`` tokens to follow ``seq``."""
    context, dynamic, static = context or _Empty(), dynamic or _Empty(), static or _Empty()
    seq = [int(t) for t in seq]
    out: list[int] = []
    if len(seq) < NGRAM_STATIC:
        return out
    while len(out) < k:
        tok, _, _ = draft_one_reference(seq + out, context, dynamic, static)
        if tok < 0:
            break
        out.append(tok)
    return out


# -- the numba twin -----------------------------------------------------------------------------
# The kernels take each cache as one NamedTuple of arrays (``NgramCache.tables``, the static
# cache's ``StaticCache.arrays``), fields by name, and the thresholds as a global array, which numba
# freezes into the compiled code: changing what a cache holds is an edit to its class and its
# constants, never to these signatures or their callers.
LIMITS = np.array([CONTEXT_MIN_SAMPLE, CONTEXT_MIN_PERCENT, DYNAMIC_MIN_SAMPLE, DYNAMIC_MIN_PERCENT],
                  dtype=np.int64)
L_CONTEXT, L_DYNAMIC = 0, 2  # a cache's rows in LIMITS: min sample, then min percent

_NEED_STATIC = -2  # _try_primary: a scan needs the static part, which is not looked up yet


@njit(cache=True)
def _static_part(static, t0, t1):
    """The static cache's answer for the 2-gram (t0, t1): (key or -1, first follower, end of followers)."""
    key = static_key(static.first_off, static.key_second, t0, t1)
    lo, hi = follower_range(static.key_off, static.fol_token.shape[0], key)
    return key, lo, hi


@njit(cache=True)
def _try_primary(buf, m, n_top, tab, row, static, s_lo, s_hi, info):
    """One cache's draft: the best follower of its first passing n-gram, n = n_top .. 1, or -1.

    ``row``: the cache's thresholds in LIMITS. ``s_lo < 0``: the static part is not looked up yet
    (then ``s_hi < 0`` too). A lone follower wins whatever its static weight, so only a scan of two
    or more followers needs it: then this returns _NEED_STATIC with that n in ``info[0]``, to be
    called again from that n with the static part.
    """
    total, maxc, e_tok, e_cnt, e_next = tab.total, tab.maxc, tab.tok, tab.cnt, tab.next
    head = tab.head
    fol_token, fol_count = static.fol_token, static.fol_count
    for n in range(4, 0, -1):  # a constant range: the compiler unrolls it
        if n > m or n > n_top:
            continue
        b = m - n
        t0 = buf[b]
        t1 = buf[b + 1] if n > 1 else -1
        t2 = buf[b + 2] if n > 2 else -1
        t3 = buf[b + 3] if n > 3 else -1
        s = find_ngram(tab, t0, t1, t2, t3)
        if s < 0:
            continue
        tot = total[s]
        min_a = LIMITS[row, n - 1]
        min_p = LIMITS[row + 1, n - 1]
        # Both tests of the rule, decided before the follower scan when they must fail: the best
        # follower's count is at most the largest count, so this rejects exactly what the scan would.
        if tot < min_a or 100 * maxc[s] < min_p * tot:
            continue
        best_tok = -1
        best_cnt = np.int64(0)
        best_score = np.int64(0)
        e = head[s]
        if s_lo < 0 and e >= 0 and e_next[e] >= 0:  # two or more followers: their weights decide
            info[0] = n
            return _NEED_STATIC
        while e >= 0:
            tok = e_tok[e]
            cnt = e_cnt[e]
            w = np.int64(1)
            if s_hi > s_lo:
                sc = search_follower(fol_token, fol_count, s_lo, s_hi, tok)
                if sc > 0:
                    w = 100 * sc
            score = cnt * w
            if score > best_score or (score == best_score and tok < best_tok):
                best_tok = tok
                best_cnt = cnt
                best_score = score
            e = e_next[e]
        if 100 * best_cnt < min_p * tot:
            continue
        info[0] = n
        info[1] = best_cnt
        info[2] = tot
        return best_tok
    return -1


@njit(cache=True)
def draft_core(buf, n, k, ctx, dyn, static, info, sub):
    """Write up to ``k`` drafted tokens at ``buf[n:]`` from the context cache ``ctx``, the dynamic
    cache ``dyn`` (both ``NgramCache.tables``) and ``static`` (``StaticCache.arrays``); return how
    many. ``info`` gets the first's origin, n-gram size, count and total; ``sub`` is scratch (3).

    The static cache is asked about a token's 2-gram only when the answer matters (a scan of two or
    more followers, or the fall-back), and at most once per drafted token."""
    if n < 2:
        return 0
    d = 0
    n_keys = static.key_second.shape[0]
    key_draft, key_total = static.key_draft, static.key_total
    fol_token, fol_count = static.fol_token, static.fol_count
    while d < k:
        m = n + d
        key = np.int64(-1)
        s_lo = np.int64(-1 if n_keys else 0)  # -1: not looked up yet (an empty cache has nothing)
        s_hi = np.int64(-1 if n_keys else 0)
        origin = 1
        tok = _try_primary(buf, m, 4, ctx, L_CONTEXT, static, s_lo, s_hi, sub)
        if tok == _NEED_STATIC:
            key, s_lo, s_hi = _static_part(static, buf[m - 2], buf[m - 1])
            tok = _try_primary(buf, m, sub[0], ctx, L_CONTEXT, static, s_lo, s_hi, sub)
        if tok < 0:
            origin = 2
            tok = _try_primary(buf, m, 4, dyn, L_DYNAMIC, static, s_lo, s_hi, sub)
            if tok == _NEED_STATIC:
                key, s_lo, s_hi = _static_part(static, buf[m - 2], buf[m - 1])
                tok = _try_primary(buf, m, sub[0], dyn, L_DYNAMIC, static, s_lo, s_hi, sub)
        if tok < 0:
            if s_lo < 0:
                key, s_lo, s_hi = _static_part(static, buf[m - 2], buf[m - 1])
            if 0 <= key < n_keys and s_hi > s_lo:
                best = key_draft[key]
                if best >= 0:
                    # key_draft passed these tests when the file was built; they are checked again
                    # (on the rare drafting path only) so that a corrupt file cannot make the fall-back
                    # draft a token that is not among the key's followers.
                    origin = 3
                    tot = np.int64(key_total[key])
                    cnt = search_follower(fol_token, fol_count, s_lo, s_hi, best)
                    if tot >= STATIC_MIN_TOTAL and 100 * cnt >= STATIC_MIN_PERCENT * tot:
                        tok = best
                        sub[0] = 2
                        sub[1] = cnt
                        sub[2] = tot
        if tok < 0:
            break
        if d == 0:
            info[0] = origin
            info[1] = sub[0]
            info[2] = sub[1]
            info[3] = sub[2]
        buf[m] = tok
        d += 1
    return d


@njit(cache=True)
def _draft(buf, n, k, ctx, dyn, static, info):
    """:func:`draft_core` with its scratch made here (one Python-to-numba call per draft)."""
    sub = np.zeros(3, dtype=np.int64)
    return draft_core(buf, n, k, ctx, dyn, static, info, sub)


def draft_into(buf: np.ndarray, n: int, k: int, context: NgramCache, dynamic: NgramCache,
               static: StaticCache, info: np.ndarray | None = None) -> int:
    """Fast twin of :func:`draft_reference`: draft into ``buf[n:n+k]`` (int32, room needed)."""
    if len(buf) < n + k:
        raise ValueError(f"draft buffer holds {len(buf)} tokens, {n + k} needed")
    info = np.zeros(4, dtype=np.int64) if info is None else info
    return int(_draft(buf, n, k, context.tables, dynamic.tables, static.arrays, info))


def draft_fast(seq: Sequence[int], k: int, context: NgramCache | None = None,
               dynamic: NgramCache | None = None, static: StaticCache | None = None) -> list[int]:
    """Convenience: :func:`draft_into` on a copy of ``seq`` (for tests and one-off calls)."""
    buf = np.zeros(len(seq) + k, dtype=np.int32)
    buf[: len(seq)] = seq
    d = draft_into(buf, len(seq), k, context or NgramCache(16), dynamic or NgramCache(16),
                   static or empty_static())
    return [int(t) for t in buf[len(seq) : len(seq) + d]]


class LookupSource(TokenBuffer):
    """``--lookup``: a DraftSource over the context cache (built here), a dynamic and a static cache.

    ``commit()`` merges the context cache into the dynamic one and empties it: llama.cpp does this at
    the end of a run (``lookup``) and after each chunk (``lookup-stats``), and its dynamic cache lives
    for one run. A source an engine keeps for a slot lives for the server's life and merges every
    request it serves, so the engine gives it a ``budget`` of follower entries: a commit that leaves
    more halves every count (:meth:`NgramCache.halve`) until at most three quarters of the budget
    remain, so what was seen once goes first and the memory stops growing. ``budget=None`` (the
    CLI's one run, the stats tools) keeps llama.cpp's unbounded cache.
    """

    name = "lookup"

    def __init__(self, static: StaticCache | None = None, dynamic: NgramCache | None = None,
                 budget: int | None = None) -> None:
        if budget is not None and budget < 1:
            raise ValueError(f"a dynamic cache budget is at least 1 follower entry, got {budget}")
        super().__init__()
        self.budget = budget
        self.static = static if static is not None else empty_static()
        self.dynamic = dynamic if dynamic is not None else NgramCache(16)
        self.context = NgramCache()
        self._info = np.zeros(4, dtype=np.int64)
        # the compiled build for this source's own argument types (fixed for its life: the caches'
        # bundles are rebuilt on growth with the same types): a call skips numba's type dispatch,
        # which for three NamedTuples of arrays costs more than the draft itself
        self._kernel = compiled_entry(_draft, self._buf, 0, 0, self.context.tables, self.dynamic.tables,
                                      self.static.arrays, self._info)

    def reset(self, prompt: Sequence[int]) -> None:
        self.context.clear()
        self._n = 0
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        m = len(tokens)
        if not m:
            return
        self._append(tokens)
        self.context.update(self._buf, nnew=m, n=self._n)

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return make_draft((), self.name)
        self._room(self._n + k)
        self._info[:] = 0
        d = self._kernel(self._buf, self._n, k, self.context.tables, self.dynamic.tables, self.static.arrays,
                         self._info)
        if not d:  # nothing drafted: info stays zero
            return make_draft((), self.name)
        origin, size, count, total = self._info.tolist()
        return make_draft(tuple(self._buf[self._n : self._n + d].tolist()), self.name, size,
                          {"origin": float(origin), "count": float(count), "total": float(total)})

    def commit(self) -> None:
        self.dynamic.merge(self.context)
        self.context.clear()
        if self.budget is not None and self.dynamic.n_entries > self.budget:
            while self.dynamic.n_entries > self.budget * 3 // 4:
                self.dynamic.halve()

    @property
    def learned_bytes(self) -> int:
        """What this source keeps from request to request for itself: its dynamic cache."""
        return self.dynamic.bytes_in_use

    def feedback(self, step: StepFeedback) -> None:
        """llama.cpp's rule is fixed: what a step cost does not change what it proposes."""


# --- the source vocabulary (promptlookup.drafting.spec): lookup[:draft=N][:static=FILE][:dynamic=FILE] ---

AUTO_WEIGHED = "named"  # auto weighs it when its sources= names it (see drafting/auto/source.py)
OPTIONS = {
    "draft": DRAFT,
    "static": Option(str, None, flag="--lookup-cache-static",
                     help="static 2-gram cache for lookup / auto (promptlookup create; either format)"),
    "dynamic": Option(str, None, flag="--lookup-cache-dynamic",
                      help="dynamic cache (llama.cpp format) for lookup: loaded at start, saved at the end"),
}


def factory(spec: SourceSpec, run: Run) -> Callable[[], LookupSource]:
    """The static cache is opened once per run and shared; each source loads the dynamic cache
    afresh (it learns: commit() merges the request into it)."""
    from promptlookup.drafting.lookup.llamacpp_file import load_dynamic, open_static_any

    static_path, dynamic_path = spec.value("static"), spec.value("dynamic")
    static = (run.shared("static", static_path,
                         lambda: open_static_any(static_path, run.n_vocab, run.tokenizer_fingerprint,
                                                 verify=run.verify))
              if static_path else None)

    def make() -> LookupSource:
        dynamic = load_dynamic(dynamic_path, run.n_vocab) if dynamic_path else None
        return LookupSource(static=static, dynamic=dynamic, budget=run.lookup_budget)

    return make


def save(spec: SourceSpec, source: LookupSource) -> None:
    """End of a run (after commit): write the dynamic cache back atomically."""
    from promptlookup.drafting.lookup.llamacpp_file import save_dynamic

    if spec.value("dynamic"):
        save_dynamic(spec.value("dynamic"), source.dynamic)
