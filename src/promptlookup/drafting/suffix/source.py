"""``--suffix``: draft the most frequent continuation of the longest match, over the request, the
history and a static corpus.

Why this rule. ``--ngram`` copies what followed the most recent longest match, which is right when
the text is being copied and wrong when a match is common (``self.`` is followed by a hundred
things). SuffixDecoding counts continuations in a suffix tree but scores every match length and
keeps the best-scoring path, so a short, frequent match often wins over a long, exact one, and it
caps a draft at the match length. Here the longest match always decides, and counts decide within
it; recency only breaks ties. One rule, applied token by token to the text extended with what was
already drafted:

1. For each provider -- the request's own text (a suffix automaton over prompt and output), the
   history (a suffix automaton over earlier requests, see :mod:`promptlookup.drafting.suffix.history`)
   and, optionally, a corpus (a suffix array, see :mod:`promptlookup.drafting.suffix.corpus_index`,
   searched for context suffixes of at most ``corpus_max_match`` tokens) -- find the longest
   suffix ``L*`` of the context that occurs there *followed by a token*.
2. The candidates are the tokens that follow those occurrences. A candidate ``c`` scores the number
   of occurrences of the context plus ``c``, counted on its last ``min(L*+1, depth)`` tokens.
3. The provider with the longest ``L*`` decides; on equal ``L*`` the scores add (the request's
   weighted by ``local_weight``, the corpus's by ``corpus_weight``). The corpus's ``L*`` enters
   this comparison as ``L* - corpus_margin`` (default 4): a margin lets the request and history,
   which predict this text better than a generic corpus, keep deciding on near-equal matches.
4. The highest score wins; ties go to the candidate seen most recently in the request, then most
   recently in the history, then the lowest token id.
5. Its estimated probability is its score over the candidates' total; the draft's probability is
   the product along it. Drafting stops at ``k`` tokens, when ``L*`` falls below ``min_match``, or
   before a token that would take the draft's probability below ``min_prob``.

:func:`draft_reference` states that rule over plain lists by brute force; :class:`SuffixSource`
runs it on the automata and the suffix array with numba. Tests hold them equal on real text.

Per-call cost. A draft at ``k = 3`` takes a few microseconds, so the fixed cost of one call
matters: the kernel takes the request's state in one ``meta`` row, its parameters, features and
output in one float array, and its per-token scratch in one matrix, and the :class:`Draft` is
built without the frozen dataclass's per-field ``__setattr__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.base import Draft
from promptlookup.drafting.spec import DRAFT, Option, Run, SourceSpec, SpecError
from promptlookup.drafting.suffix.automaton import (
    CNT,
    E_NEXT,
    E_TO,
    E_TOK,
    FIRST,
    LAST,
    LEN,
    LINK,
    M_CORPUS,
    M_DEPTH,
    M_GM,
    M_GV,
    M_LASTSTATE,
    M_POS,
    OUTDEG,
    SEP,
    SuffixAutomaton,
    deep_rep,
    extend_tokens,
    match_step,
)
from promptlookup.drafting.suffix.corpus_index import (
    DEFAULT_MAX_MATCH,
    CorpusIndex,
    empty_index,
    interval,
    narrow,
    search_from,
)
from promptlookup.errors import InputError

DEFAULT_MIN_MATCH = 1
DEFAULT_MIN_PROB = 0.0
DEFAULT_LOCAL_WEIGHT = 1.0
DEFAULT_CORPUS_WEIGHT = 1.0
DEFAULT_CORPUS_MARGIN = 4  # measured: 0 loses to history alone, 4 wins (docs/suffix.md)

# the kernel's float array: parameters, then features, then the drafted tokens
P_MIN_MATCH, P_MIN_PROB, P_LOCAL_W, P_CORPUS_W, P_DEPTH_G, P_CORPUS_CAP, P_CORPUS_MARGIN = range(7)
IO_FEAT = 8
F_MATCH, F_COUNT, F_TOTAL, F_PROB, F_FROM_HISTORY, F_FROM_CORPUS = range(6)
IO_OUT = 16
# scratch rows: score, last seen in the request, last seen in the history, seen flag, touched list
R_SCORE, R_LLAST, R_GLAST, R_SEEN, R_TOUCHED = range(5)


# ----------------------------------------------------------------------------- reference twin
def _common_suffix(text: Sequence[int], end: int, context: Sequence[int], cap: int) -> int:
    """How many tokens ``text[: end + 1]`` and ``context`` share at their ends (at most ``cap``)."""
    n = 0
    while n < cap and end - n >= 0 and n < len(context) and text[end - n] == context[-1 - n]:
        n += 1
    return n


def _longest_with_follower(text: Sequence[int], context: Sequence[int], cap: int | None = None) -> int:
    """Largest ``L`` (at most ``cap``) such that ``context[-L:]`` occurs in ``text`` followed by a
    token (not SEP)."""
    cap = len(context) if cap is None else min(cap, len(context))
    return max((_common_suffix(text, e, context, cap) for e in range(len(text) - 1)
                if text[e + 1] != SEP), default=0)


def _scores(text: Sequence[int], context: Sequence[int], lstar: int,
            depth: int) -> dict[int, tuple[int, int]]:
    """``{candidate: (count, most recent end)}`` for the followers of ``context[-lstar:]``."""
    followers = {text[e + 1] for e in range(len(text) - 1)
                 if text[e + 1] != SEP and _common_suffix(text, e, context, lstar) == lstar}
    out = {}
    n = min(lstar + 1, depth)
    for c in followers:
        ends = [e for e in range(len(text)) if text[e] == c
                and _common_suffix(text, e - 1, context, n - 1) == n - 1]
        out[c] = (len(ends), max(ends))
    return out


def draft_reference(
    local: Sequence[int], history: Sequence[int], k: int, depth: int, min_match: int = DEFAULT_MIN_MATCH,
    min_prob: float = DEFAULT_MIN_PROB, local_weight: float = DEFAULT_LOCAL_WEIGHT,
    corpus: Sequence[int] = (), corpus_max_match: int = DEFAULT_MAX_MATCH,
    corpus_weight: float = DEFAULT_CORPUS_WEIGHT, corpus_margin: int = DEFAULT_CORPUS_MARGIN,
) -> tuple[list[int], list[float], int]:
    """The whole ``--suffix`` rule by brute force: ``(tokens, probabilities, first match length)``.

    ``local`` is the request's text, ``history`` earlier requests joined by :data:`SEP`, ``corpus``
    a static corpus. Quadratic and slow, and obviously the rule: the twin the fast path is tested
    against.
    """
    context = list(local)
    tokens: list[int] = []
    probs: list[float] = []
    first_match = 0
    path = 1.0
    for i in range(k):
        ll = _longest_with_follower(local, context)
        lg = _longest_with_follower(history, context) if history else 0
        lc = _longest_with_follower(corpus, context, corpus_max_match) if len(corpus) else 0
        lc_eff = lc - corpus_margin if lc else 0
        top = max(ll, lg, lc_eff)
        if i == 0:
            first_match = top
        if top < min_match:
            break
        cand: dict[int, list[float]] = {}  # token -> [score, local last, history last]
        if ll == top:
            for c, (n, last) in _scores(local, context, ll, depth).items():
                cand[c] = [local_weight * n, last, -1]
        if lg == top:
            for c, (n, last) in _scores(history, context, lg, depth).items():
                entry = cand.setdefault(c, [0.0, -1, -1])
                entry[0] += n
                entry[2] = last
        if lc and lc_eff == top:
            for c, (n, _) in _scores(corpus, context, lc, depth).items():
                cand.setdefault(c, [0.0, -1, -1])[0] += corpus_weight * n
        total = sum(v[0] for v in cand.values())
        best = min(cand, key=lambda c: (-cand[c][0], -cand[c][1], -cand[c][2], c))
        p = cand[best][0] / total
        if path * p < min_prob:
            break
        path *= p
        tokens.append(best)
        probs.append(p)
        context.append(best)
    return tokens, probs, first_match


# ----------------------------------------------------------------------------- fast kernel
@njit(cache=True)
def _back_off(st, v, m):
    """Back a match off until the matched string has a follower (an out-transition)."""
    while v != 0 and st[v, OUTDEG] == 0:
        v = st[v, LINK]
        m = st[v, LEN]
    if v == 0 and st[0, OUTDEG] == 0:
        return 0, 0
    return v, m


@njit(cache=True, inline="always")
def _touch(scratch, tok, n_touched):
    if scratch[R_SEEN, tok] == 0.0:
        scratch[R_SEEN, tok] = 1.0
        scratch[R_TOUCHED, n_touched] = tok
        return n_touched + 1
    return n_touched


@njit(cache=True)
def _collect(st, ed, depth, v, weight, last_row, scratch, n_touched):
    e = st[v, FIRST]
    while e >= 0:
        tok = ed[e, E_TOK]
        if tok != SEP:
            w = deep_rep(st, ed[e, E_TO], depth)
            n_touched = _touch(scratch, tok, n_touched)
            scratch[R_SCORE, tok] += weight * st[w, CNT]
            scratch[last_row, tok] = st[w, LAST]
        e = ed[e, E_NEXT]
    return n_touched


@njit(cache=True)
def _collect_corpus(ctok, csa, cbk, buf, n_ctx, lo, hi, m, depth, weight, scratch, n_touched):
    """Candidates of a corpus match of ``m`` tokens at SA ``[lo, hi)``: the follower runs of the
    interval (sorted by follower), each counted on the last ``min(m + 1, depth)`` tokens."""
    n = len(ctok)
    short = m + 1 > depth
    slo = shi = 0
    if short and depth > 1:  # count on the last depth tokens: the interval of the last depth - 1
        slo, shi = interval(ctok, csa, cbk, buf, n_ctx - (depth - 1), n_ctx)
        if slo < 0:
            return -1
    elif short:
        shi = n
    i = lo
    if i < hi:
        p = csa[i]
        if p < 0 or p >= n:
            return -1
        if p + m >= n:
            i += 1
    while i < hi:
        p = csa[i]
        if p < 0 or p + m >= n:
            return -1
        t = ctok[p + m]
        if t < 0 or t >= scratch.shape[1]:
            return -1
        a, b = narrow(ctok, csa, i, hi, m, t)
        if a < 0 or b <= i:
            return -1
        cnt = b - a
        if short:
            a2, b2 = narrow(ctok, csa, slo, shi, depth - 1, t)
            if a2 < 0:
                return -1
            cnt = b2 - a2
        n_touched = _touch(scratch, t, n_touched)
        scratch[R_SCORE, t] += weight * cnt
        i = b
    return n_touched


@njit(cache=True)
def _catch_up(lst, led, lhk, lhv, lmeta, buf, n, gst, ged, ghk, ghv):
    """Apply the tokens appended since the last call (``buf[pos:n]``) to the request's automaton
    and the history matcher (``lmeta[M_GV], lmeta[M_GM]``); -1 if a token is negative."""
    pos = lmeta[M_POS]
    if pos == n:
        return 0
    new = buf[pos:n]
    for i in range(len(new)):
        if new[i] < 0:
            return -1
    extend_tokens(lst, led, lhk, lhv, lmeta, new)
    v = lmeta[M_GV]
    m = lmeta[M_GM]
    for i in range(len(new)):
        v, m = match_step(gst, ghk, ghv, ged, v, m, new[i])
    lmeta[M_GV] = v
    lmeta[M_GM] = m
    return 0


@njit(cache=True, inline="always")
def _clear_touched(scratch, nt, score, llast, glast):
    """Reset the scratch rows of the ``nt`` candidate tokens this step touched, for the next step."""
    for j in range(nt):
        t = np.int64(scratch[R_TOUCHED, j])
        score[t] = 0.0
        scratch[R_SEEN, t] = 0.0
        llast[t] = -1
        glast[t] = -1


@njit(cache=True)
def _draft(lst, led, lhk, lhv, lmeta, buf, n, k, gst, ged, ghk, ghv, ctok, csa, cbk, io, scratch):
    """Catch up, then draft up to ``k`` tokens into ``io[IO_OUT:]`` (and ``buf[n:]``, the draft's
    context); returns how many (-1: a bad token, -2: a corrupt corpus index)."""
    min_match = io[P_MIN_MATCH]
    min_prob = io[P_MIN_PROB]
    local_weight = io[P_LOCAL_W]
    corpus_weight = io[P_CORPUS_W]
    depth_g = np.int64(io[P_DEPTH_G])
    cap = np.int64(io[P_CORPUS_CAP])
    margin = np.int64(io[P_CORPUS_MARGIN])
    if _catch_up(lst, led, lhk, lhv, lmeta, buf, n, gst, ged, ghk, ghv) < 0:
        return -1
    depth_l = lmeta[M_DEPTH]
    vl = lmeta[M_LASTSTATE]
    ml = lst[vl, LEN]
    vg = lmeta[M_GV]
    mg = lmeta[M_GM]
    cs = lmeta[M_CORPUS : M_CORPUS + 3]
    use_corpus = len(ctok) > 0 and cap > 0
    path = 1.0
    n_out = 0
    for i in range(k):
        vl, ml = _back_off(lst, vl, ml)
        vg, mg = _back_off(gst, vg, mg)
        # the corpus is searched only for matches that could decide: at least max(ml, mg,
        # min_match) + margin tokens (one probe when it cannot), never kept between calls
        mc = 0
        lower = max(ml, mg, np.int64(min_match), 1) + margin
        if use_corpus and lower <= min(cap, n + i):
            if search_from(ctok, csa, cbk, buf, n + i, lower, min(cap, n + i), cs) < 0:
                return -2
            mc = cs[2]
        mc_eff = mc - margin if mc > 0 else 0
        top = max(ml, mg, mc_eff)
        if i == 0:
            io[IO_FEAT + F_MATCH] = top
        if top < min_match:
            break
        nt = 0
        if ml == top:
            nt = _collect(lst, led, depth_l, vl, local_weight, R_LLAST, scratch, nt)
        if mg == top:
            nt = _collect(gst, ged, depth_g, vg, 1.0, R_GLAST, scratch, nt)
        if mc > 0 and mc_eff == top:
            nt = _collect_corpus(ctok, csa, cbk, buf, n + i, cs[0], cs[1], mc, depth_l, corpus_weight,
                                 scratch, nt)
            if nt < 0:
                return -2
        best = -1
        total = 0.0
        score = scratch[R_SCORE]
        llast = scratch[R_LLAST]
        glast = scratch[R_GLAST]
        for j in range(nt):
            t = np.int64(scratch[R_TOUCHED, j])
            total += score[t]
            if best < 0:
                best = t
                continue
            if score[t] != score[best]:
                better = score[t] > score[best]
            elif llast[t] != llast[best]:
                better = llast[t] > llast[best]
            elif glast[t] != glast[best]:
                better = glast[t] > glast[best]
            else:
                better = t < best
            if better:
                best = t
        if total <= 0.0:  # only a corrupt corpus index gets here (every candidate occurs)
            _clear_touched(scratch, nt, score, llast, glast)
            return -2
        p = score[best] / total
        if i == 0:
            io[IO_FEAT + F_COUNT] = score[best]
            io[IO_FEAT + F_TOTAL] = total
            io[IO_FEAT + F_FROM_HISTORY] = 1.0 if mg == top and ml < top else 0.0
            io[IO_FEAT + F_FROM_CORPUS] = 1.0 if mc > 0 and mc_eff == top and ml < top and mg < top else 0.0
        _clear_touched(scratch, nt, score, llast, glast)
        if path * p < min_prob:
            break
        path *= p
        io[IO_OUT + n_out] = best
        n_out += 1
        buf[n + i] = best
        vl, ml = match_step(lst, lhk, lhv, led, vl, ml, best)
        vg, mg = match_step(gst, ghk, ghv, ged, vg, mg, best)
    io[IO_FEAT + F_PROB] = path
    return n_out


_EMPTY_HISTORY = None


def _empty_automaton() -> SuffixAutomaton:
    global _EMPTY_HISTORY
    if _EMPTY_HISTORY is None:
        _EMPTY_HISTORY = SuffixAutomaton(capacity=16)
    return _EMPTY_HISTORY


_new = object.__new__


class SuffixSource:
    """``--suffix``: the rule in this module's docstring over the request, an optional history and
    an optional corpus index.

    ``history`` is a :class:`promptlookup.drafting.suffix.history.History` (or ``None``). When
    ``record`` is true, each request is added to it when the next one starts (``reset``) or when
    :meth:`commit` is called. ``corpus`` is an opened
    :class:`promptlookup.drafting.suffix.corpus_index.CorpusIndex` (or ``None``), searched for context
    suffixes of at most ``corpus_max_match`` tokens.
    """

    name = "suffix"

    def __init__(self, history=None, depth: int = 32, min_match: int = DEFAULT_MIN_MATCH,
                 min_prob: float = DEFAULT_MIN_PROB, local_weight: float = DEFAULT_LOCAL_WEIGHT,
                 record: bool = True, n_vocab: int = 1 << 17, corpus: CorpusIndex | None = None,
                 corpus_max_match: int = DEFAULT_MAX_MATCH,
                 corpus_weight: float = DEFAULT_CORPUS_WEIGHT,
                 corpus_margin: int = DEFAULT_CORPUS_MARGIN) -> None:
        if min_match < 1:
            raise ValueError(f"suffix min-match must be at least 1, got {min_match}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"suffix min-prob must be in 0..1, got {min_prob}")
        if corpus_max_match < 1:
            raise ValueError(f"suffix corpus max-match must be at least 1, got {corpus_max_match}")
        self.history = history
        self.depth = depth
        self.min_match = min_match
        self.min_prob = float(min_prob)
        self.local_weight = float(local_weight)
        self.record = record
        self.corpus = corpus
        self.corpus_max_match = corpus_max_match
        self.corpus_weight = float(corpus_weight)
        self.corpus_margin = int(corpus_margin)
        self._index = corpus if corpus is not None else empty_index()
        if corpus is not None and corpus.n_vocab > n_vocab:
            raise InputError(f"the corpus index has a vocabulary of {corpus.n_vocab}, "
                             f"beyond n_vocab {n_vocab}")
        self._local = SuffixAutomaton(depth=depth)
        self._buf = np.zeros(1024, dtype=np.int32)  # the request's tokens, then a draft's scratch
        self._n = 0
        self.n_vocab = n_vocab
        self._io = np.zeros(IO_OUT, dtype=np.float64)
        self._set_params(64)
        self._scratch = np.zeros((5, n_vocab), dtype=np.float64)
        self._scratch[R_LLAST : R_GLAST + 1] = -1.0
        if history is not None and history.max_token >= n_vocab:
            raise InputError(f"the history holds token {history.max_token}, beyond n_vocab {n_vocab}")
        self._committed = True
        self._g_seen: SuffixAutomaton | None = None
        self._g_len = -1
        self.reset([0, 0, 0])
        self.propose(2)  # compile (or load the cached build) before any timing
        self._committed = True
        self.reset([])

    def _set_params(self, k_max: int) -> None:
        io = np.zeros(IO_OUT + k_max, dtype=np.float64)
        io[P_MIN_MATCH], io[P_MIN_PROB], io[P_LOCAL_W] = self.min_match, self.min_prob, self.local_weight
        io[P_CORPUS_W], io[P_CORPUS_CAP] = self.corpus_weight, self.corpus_max_match
        io[P_CORPUS_MARGIN] = self.corpus_margin
        self._io = io

    def _global(self) -> SuffixAutomaton:
        return self.history.automaton if self.history is not None else _empty_automaton()

    @property
    def tokens(self) -> np.ndarray:
        """The request's tokens so far (a view; do not keep it across ``extend``)."""
        return self._buf[: self._n]

    def _rematch(self, g: SuffixAutomaton) -> None:
        """The history changed under a request: match the request's text against it afresh."""
        self._g_seen, self._g_len = g, g.n_tokens
        self._io[P_DEPTH_G] = g.meta[M_DEPTH]
        v, m = 0, 0
        for t in self._buf[: int(self._local.meta[M_POS])]:
            v, m = match_step(g.st, g.hk, g.hv, g.ed, v, m, t)
        self._local.meta[M_GV], self._local.meta[M_GM] = v, m

    def commit(self) -> None:
        """Add the current request to the history (once), so later requests can draft from it."""
        if not self._committed and self.record and self.history is not None and self._n:
            self.history.add(self._buf[: self._n])
        self._committed = True

    def reset(self, prompt: Sequence[int]) -> None:
        self.commit()
        self._local.clear()
        self._n = 0
        meta = self._local.meta
        meta[M_GV] = 0
        meta[M_GM] = 0
        g = self._global()
        self._g_seen, self._g_len = g, g.n_tokens
        self._io[P_DEPTH_G] = g.meta[M_DEPTH]
        self._committed = False
        self.extend(prompt)

    def _grow(self, need: int) -> None:
        grown = np.zeros(max(2 * len(self._buf), need), dtype=np.int32)
        grown[: self._n] = self._buf[: self._n]
        self._buf = grown

    def extend(self, tokens: Sequence[int]) -> None:
        """Record confirmed tokens; the matchers catch up inside the next ``propose`` (one call)."""
        m = len(tokens)
        n = self._n
        if n + m > len(self._buf):
            self._grow(n + m)
        if m == 1:
            t = tokens[0]
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"token id {t} is outside 0..{self.n_vocab - 1}")
            self._buf[n] = t
        elif m:
            arr = np.asarray(tokens, dtype=np.int64)
            if arr.min() < 0 or arr.max() >= self.n_vocab:
                raise ValueError(f"token ids must be in 0..{self.n_vocab - 1}")
            self._buf[n : n + m] = arr
        self._n = n + m

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return Draft(source=self.name)
        n = self._n
        if n + k > len(self._buf):
            self._grow(n + k)
        io = self._io
        if k > len(io) - IO_OUT:
            self._set_params(k)
            io = self._io
            io[P_DEPTH_G] = self._global().meta[M_DEPTH]
        loc = self._local
        if n > loc.cap_tokens:
            loc.reserve(n)
        h = self.history
        g = h.automaton if h is not None else _empty_automaton()
        if g is not self._g_seen or g.meta[M_POS] != self._g_len:
            self._rematch(g)
        ix = self._index
        got = _draft(loc.st, loc.ed, loc.hk, loc.hv, loc.meta, self._buf, n, k, g.st, g.ed, g.hk, g.hv,
                     ix.tokens, ix.sa, ix.buckets, io, self._scratch)
        if got < 0:
            if got == -1:
                raise ValueError("a negative token id reached the suffix source")
            from promptlookup.drafting.suffix.corpus_index import CorpusIndexError

            raise CorpusIndexError(f"{ix.path}: corrupt corpus index (found while drafting)")
        f = io[IO_FEAT : IO_FEAT + 6].tolist()
        d = _new(Draft)  # the frozen dataclass's __init__ costs a __setattr__ call per field
        d.__dict__.update(
            tokens=tuple(self._buf[n : n + got].tolist()), source="suffix", match_len=int(f[F_MATCH]),
            features={"count": f[F_COUNT], "total": f[F_TOTAL], "prob": f[F_PROB],
                      "from_history": f[F_FROM_HISTORY], "from_corpus": f[F_FROM_CORPUS]})
        return d


# --- the source vocabulary (promptlookup.drafting.spec):
# suffix[:draft=N][:history=FILE][:budget=TOKENS][:corpus=FILE] ---

OPTIONS = {
    "draft": DRAFT,
    "history": Option(str, None, flag="--suffix-history"),  # earlier requests: loaded, saved back by save()
    "budget": Option(int, None, 1, None, "--suffix-history-budget"),  # history memory, in tokens
    "corpus": Option(str, None, flag="--suffix-corpus"),  # a corpus suffix array (promptlookup index)
}


def factory(spec: SourceSpec, run: Run) -> Callable[[], SuffixSource]:
    """The corpus index is opened once per run and shared. Each source gets the run's shared history
    (:attr:`Run.history`) or its own: from ``history=FILE`` (a missing file starts an empty one that
    :func:`save` creates), else an empty one in memory, so a run's later requests draft from its
    earlier ones."""
    from pathlib import Path

    from promptlookup.drafting.suffix.corpus_index import open_index
    from promptlookup.drafting.suffix.history import DEFAULT_BUDGET, History

    history_path, budget, corpus_path = spec.value("history"), spec.value("budget"), spec.value("corpus")
    corpus = (run.shared("corpus", corpus_path,
                         lambda: open_index(corpus_path, fingerprint=run.tokenizer_fingerprint(),
                                            n_vocab=run.n_vocab, verify=run.verify))
              if corpus_path else None)

    if run.history is not None and (history_path is not None or budget is not None):
        raise SpecError(f"{spec.label}: this run keeps one history for every request; its file and "
                        "budget are the run's settings, not the source's")

    def make() -> SuffixSource:
        if run.history is not None:
            history = run.history
        elif history_path is not None and Path(history_path).exists():
            history = History.load(history_path, fingerprint=run.tokenizer_fingerprint(), budget=budget)
        elif history_path is not None:
            history = History(budget=budget or DEFAULT_BUDGET, fingerprint=run.tokenizer_fingerprint())
        else:
            history = History(budget=budget or DEFAULT_BUDGET)
        return SuffixSource(history=history, n_vocab=run.n_vocab, corpus=corpus)

    return make


def save(spec: SourceSpec, source: SuffixSource) -> None:
    """End of a run (after commit): write the history back atomically."""
    if spec.value("history") and source.history is not None:
        source.history.save(spec.value("history"))
