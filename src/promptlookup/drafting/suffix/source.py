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
matters: the kernel takes each automaton and the corpus index as one tuple of arrays (fields at
``A_*`` and ``X_*``), its parameters and its features as one-row structured arrays
(:data:`PARAMS`, :data:`FEATURES`: named, typed fields, one dispatch argument each) and its
per-token scratch as one matrix; the drafted tokens are read back from the token buffer, and the
:class:`Draft` is built with :func:`~promptlookup.drafting.base.make_draft`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.base import Draft, StepFeedback, TokenBuffer, compiled_entry, make_draft
from promptlookup.drafting.spec import DRAFT, Option, Run, SourceSpec, SpecError
from promptlookup.drafting.suffix.automaton import (
    A_ED,
    A_HK,
    A_HV,
    A_META,
    A_ST,
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
    X_BUCKETS,
    X_SA,
    X_TOKENS,
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

# the kernel's parameters (one row, set by the source) and the first drafted token's features (one
# row, written by the kernel), as structured arrays: numba reads and writes the fields by name
PARAMS = np.dtype([("min_match", np.int64), ("min_prob", np.float64), ("local_weight", np.float64),
                   ("corpus_weight", np.float64), ("depth_g", np.int64), ("corpus_cap", np.int64),
                   ("corpus_margin", np.int64)])
FEATURES = np.dtype([("match", np.int64), ("count", np.float64), ("total", np.float64),
                     ("prob", np.float64), ("from_history", np.float64), ("from_corpus", np.float64)])
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
def _catch_up(local, glob, buf, n):
    """Apply the tokens appended since the last call (``buf[pos:n]``) to the request's automaton
    and the history matcher (the request's ``meta[M_GV], meta[M_GM]``); -1 if a token is negative."""
    lmeta = local[A_META]
    pos = lmeta[M_POS]
    if pos == n:
        return 0
    new = buf[pos:n]
    for i in range(len(new)):
        if new[i] < 0:
            return -1
    extend_tokens(local[A_ST], local[A_ED], local[A_HK], local[A_HV], lmeta, new)
    gst, ged, ghk, ghv = glob[A_ST], glob[A_ED], glob[A_HK], glob[A_HV]
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
def _draft(local, glob, corpus, buf, n, k, params, feat, scratch):
    """Catch up, then draft up to ``k`` tokens into ``buf[n:]`` (the draft's context too); returns
    how many (-1: a bad token, -2: a corrupt corpus index). ``local`` and ``glob`` are the request's
    and the history's ``SuffixAutomaton.tables``, ``corpus`` a ``CorpusIndex.arrays``; ``params``
    and ``feat`` one-row :data:`PARAMS` and :data:`FEATURES` arrays."""
    p = params[0]
    out = feat[0]
    min_match = p["min_match"]
    min_prob = p["min_prob"]
    local_weight = p["local_weight"]
    corpus_weight = p["corpus_weight"]
    depth_g = p["depth_g"]
    cap = p["corpus_cap"]
    margin = p["corpus_margin"]
    lst, led, lhk, lhv, lmeta = local[A_ST], local[A_ED], local[A_HK], local[A_HV], local[A_META]
    gst, ged, ghk, ghv = glob[A_ST], glob[A_ED], glob[A_HK], glob[A_HV]
    ctok, csa, cbk = corpus[X_TOKENS], corpus[X_SA], corpus[X_BUCKETS]
    if _catch_up(local, glob, buf, n) < 0:
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
        lower = max(ml, mg, min_match, 1) + margin
        if use_corpus and lower <= min(cap, n + i):
            if search_from(ctok, csa, cbk, buf, n + i, lower, min(cap, n + i), cs) < 0:
                return -2
            mc = cs[2]
        mc_eff = mc - margin if mc > 0 else 0
        top = max(ml, mg, mc_eff)
        if i == 0:
            out["match"] = top
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
            out["count"] = score[best]
            out["total"] = total
            out["from_history"] = 1.0 if mg == top and ml < top else 0.0
            out["from_corpus"] = 1.0 if mc > 0 and mc_eff == top and ml < top and mg < top else 0.0
        _clear_touched(scratch, nt, score, llast, glast)
        if path * p < min_prob:
            break
        path *= p
        n_out += 1
        buf[n + i] = best
        vl, ml = match_step(lst, lhk, lhv, led, vl, ml, best)
        vg, mg = match_step(gst, ghk, ghv, ged, vg, mg, best)
    out["prob"] = path
    return n_out


_EMPTY_HISTORY = None


def _empty_automaton() -> SuffixAutomaton:
    global _EMPTY_HISTORY
    if _EMPTY_HISTORY is None:
        _EMPTY_HISTORY = SuffixAutomaton(capacity=16)
    return _EMPTY_HISTORY


class SuffixSource(TokenBuffer):
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
        super().__init__()  # the request's tokens, then a draft's scratch
        self.n_vocab = n_vocab
        self._params = np.zeros(1, dtype=PARAMS)
        p = self._params[0]
        p["min_match"], p["min_prob"], p["local_weight"] = self.min_match, self.min_prob, self.local_weight
        p["corpus_weight"], p["corpus_cap"] = self.corpus_weight, self.corpus_max_match
        p["corpus_margin"] = self.corpus_margin
        self._feat = np.zeros(1, dtype=FEATURES)
        self._scratch = np.zeros((5, n_vocab), dtype=np.float64)
        self._scratch[R_LLAST : R_GLAST + 1] = -1.0
        if history is not None and history.max_token >= n_vocab:
            raise InputError(f"the history holds token {history.max_token}, beyond n_vocab {n_vocab}")
        self._committed = True
        self._g_seen: SuffixAutomaton | None = None
        self._g_len = -1
        self.reset([0, 0, 0])
        # compile (or load the cached build) before any timing, and keep the build for these argument
        # types (this source's own arrays, fixed for its life): a call then skips numba's type
        # dispatch, which costs more than a microsecond over these tuples and structured arrays
        self._kernel = compiled_entry(_draft, self._local.tables, self._global().tables, self._index.arrays,
                                      self._buf, self._n, 2, self._params, self._feat, self._scratch)
        self._committed = True
        self.reset([])

    def _global(self) -> SuffixAutomaton:
        return self.history.automaton if self.history is not None else _empty_automaton()

    def _rematch(self, g: SuffixAutomaton) -> None:
        """The history changed under a request: match the request's text against it afresh."""
        self._g_seen, self._g_len = g, g.n_tokens
        self._params["depth_g"] = g.meta[M_DEPTH]
        v, m = 0, 0
        for t in self._buf[: int(self._local.meta[M_POS])]:
            v, m = match_step(g.st, g.hk, g.hv, g.ed, v, m, t)
        self._local.meta[M_GV], self._local.meta[M_GM] = v, m

    def commit(self) -> None:
        """Add the current request to the history (once), so later requests can draft from it."""
        if not self._committed and self.record and self.history is not None and self._n:
            self.history.add(self._buf[: self._n])
        self._committed = True

    def feedback(self, step: StepFeedback) -> None:
        """Scores and thresholds are fixed settings: what a step cost does not change a proposal."""

    def reset(self, prompt: Sequence[int]) -> None:
        self.commit()
        self._local.clear()
        self._n = 0
        meta = self._local.meta
        meta[M_GV] = 0
        meta[M_GM] = 0
        g = self._global()
        self._g_seen, self._g_len = g, g.n_tokens
        self._params["depth_g"] = g.meta[M_DEPTH]
        self._committed = False
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        """Record confirmed tokens; the matchers catch up inside the next ``propose`` (one call)."""
        m = len(tokens)
        if m == 1:
            t = tokens[0]
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"token id {t} is outside 0..{self.n_vocab - 1}")
        elif m:
            tokens = np.asarray(tokens, dtype=np.int64)
            if tokens.min() < 0 or tokens.max() >= self.n_vocab:
                raise ValueError(f"token ids must be in 0..{self.n_vocab - 1}")
        self._append(tokens)

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return make_draft((), self.name)
        n = self._n
        self._room(n + k)
        loc = self._local
        if n > loc.cap_tokens:
            loc.reserve(n)
        h = self.history
        g = h.automaton if h is not None else _empty_automaton()
        if g is not self._g_seen or g.meta[M_POS] != self._g_len:
            self._rematch(g)
        ix = self._index
        got = self._kernel(loc.tables, g.tables, ix.arrays, self._buf, n, k, self._params, self._feat,
                           self._scratch)
        if got < 0:
            if got == -1:
                raise ValueError("a negative token id reached the suffix source")
            from promptlookup.drafting.suffix.corpus_index import CorpusIndexError

            raise CorpusIndexError(f"{ix.path}: corrupt corpus index (found while drafting)")
        match, count, total, prob, from_history, from_corpus = self._feat.tolist()[0]
        return make_draft(tuple(self._buf[n : n + got].tolist()), "suffix", match,
                          {"count": count, "total": total, "prob": prob, "from_history": from_history,
                           "from_corpus": from_corpus})


# --- the source vocabulary (promptlookup.drafting.spec):
# suffix[:draft=N][:history=FILE][:budget=TOKENS][:corpus=FILE] ---

AUTO_WEIGHED = "named"  # auto weighs it when its sources= names it (see drafting/auto/source.py)
OPTIONS = {
    "draft": DRAFT,
    "history": Option(str, None, flag="--suffix-history",
                      help="earlier requests for suffix / auto: loaded at start (a corrupt or foreign "
                           "file is refused), this run's requests added and saved atomically"),
    "budget": Option(int, None, 1, 1 << 32, "--suffix-history-budget",
                     "history memory in tokens; the oldest requests go first"),
    "corpus": Option(str, None, flag="--suffix-corpus",
                     help="corpus suffix-array index (promptlookup index) for suffix / auto: long matches "
                          "into a static corpus"),
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
