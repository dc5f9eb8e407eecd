"""``--suffix``: draft the most frequent continuation of the longest match, over the request and history.

Why this rule. ``--ngram`` copies what followed the most recent longest match, which is right when
the text is being copied and wrong when a match is common (``self.`` is followed by a hundred
things). SuffixDecoding counts continuations in a suffix tree but scores every match length and
keeps the best-scoring path, so a short, frequent match often wins over a long, exact one, and it
caps a draft at the match length. Here the longest match always decides, and counts decide within
it; recency only breaks ties. One rule, applied token by token to the text extended with what was
already drafted:

1. For the request's own text (a suffix automaton over prompt and output) and the history (a
   suffix automaton over earlier requests, see :mod:`promptlookup.drafting.history`), find the
   longest suffix ``L*`` of the context that occurs there *followed by a token*.
2. The candidates are the tokens that follow those occurrences. A candidate ``c`` scores the number
   of occurrences of the context plus ``c``, counted on its last ``min(L*+1, depth)`` tokens.
3. The source with the longer ``L*`` decides; on equal ``L*`` the two scores add (the request's
   weighted by ``local_weight``).
4. The highest score wins; ties go to the candidate seen most recently in the request, then most
   recently in the history, then the lowest token id.
5. Its estimated probability is its score over the candidates' total; the draft's probability is
   the product along it. Drafting stops at ``k`` tokens, when ``L*`` falls below ``min_match``, or
   before a token that would take the draft's probability below ``min_prob``.

:func:`draft_reference` states that rule over plain lists by brute force; :class:`SuffixSource`
runs it on the automata with numba. Tests hold them equal on real text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.base import Draft
from promptlookup.drafting.suffix_automaton import (
    CNT,
    E_NEXT,
    E_TO,
    E_TOK,
    FIRST,
    LAST,
    LEN,
    LINK,
    M_DEPTH,
    M_GM,
    M_GV,
    M_LASTSTATE,
    M_POS,
    OUTDEG,
    SEP,
    SuffixAutomaton,
    _extend,
    deep_rep,
    match_step,
)

DEFAULT_MIN_MATCH = 1
DEFAULT_MIN_PROB = 0.0
DEFAULT_LOCAL_WEIGHT = 1.0

# feature slots written by the kernel
F_MATCH, F_COUNT, F_TOTAL, F_PROB, F_FROM_HISTORY = range(5)
N_FEAT = 5


# ----------------------------------------------------------------------------- reference twin
def _common_suffix(text: Sequence[int], end: int, context: Sequence[int], cap: int) -> int:
    """How many tokens ``text[: end + 1]`` and ``context`` share at their ends (at most ``cap``)."""
    n = 0
    while n < cap and end - n >= 0 and n < len(context) and text[end - n] == context[-1 - n]:
        n += 1
    return n


def _longest_with_follower(text: Sequence[int], context: Sequence[int]) -> int:
    """Largest ``L`` such that ``context[-L:]`` occurs in ``text`` followed by a token (not SEP)."""
    return max((_common_suffix(text, e, context, len(context)) for e in range(len(text) - 1)
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
) -> tuple[list[int], list[float], int]:
    """The whole ``--suffix`` rule by brute force: ``(tokens, probabilities, first match length)``.

    ``local`` is the request's text, ``history`` earlier requests joined by :data:`SEP`.
    Quadratic and slow, and obviously the rule: the twin the automata are tested against.
    """
    context = list(local)
    tokens: list[int] = []
    probs: list[float] = []
    first_match = 0
    path = 1.0
    for i in range(k):
        ll = _longest_with_follower(local, context)
        lg = _longest_with_follower(history, context) if history else 0
        if i == 0:
            first_match = max(ll, lg)
        if max(ll, lg) < min_match:
            break
        cand: dict[int, list[float]] = {}  # token -> [score, local last, history last]
        if ll >= lg:
            for c, (n, last) in _scores(local, context, ll, depth).items():
                cand[c] = [local_weight * n, last, -1]
        if lg >= ll:
            for c, (n, last) in _scores(history, context, lg, depth).items():
                entry = cand.setdefault(c, [0.0, -1, -1])
                entry[0] += n
                entry[2] = last
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


@njit(cache=True)
def _collect(st, ed, depth, v, weight, is_local, score, llast, glast, seen, touched, n_touched):
    e = st[v, FIRST]
    while e >= 0:
        tok = ed[e, E_TOK]
        if tok != SEP:
            w = deep_rep(st, ed[e, E_TO], depth)
            if seen[tok] == 0.0:
                seen[tok] = 1.0
                touched[n_touched] = tok
                n_touched += 1
            score[tok] += weight * st[w, CNT]
            if is_local:
                llast[tok] = st[w, LAST]
            else:
                glast[tok] = st[w, LAST]
        e = ed[e, E_NEXT]
    return n_touched


@njit(cache=True)
def _catch_up(lst, led, lhk, lhv, lmeta, buf, n, gst, ged, ghk, ghv):
    """Apply the tokens appended since the last call (``buf[pos:n]``) to the request's automaton and
    to the history matcher (kept in ``lmeta[M_GV], lmeta[M_GM]``); -1 if a token is negative."""
    pos = lmeta[M_POS]
    if pos == n:
        return 0
    new = buf[pos:n]
    for i in range(len(new)):
        if new[i] < 0:
            return -1
    _extend(lst, led, lhk, lhv, lmeta, new)
    v = lmeta[M_GV]
    m = lmeta[M_GM]
    for i in range(len(new)):
        v, m = match_step(gst, ghk, ghv, ged, v, m, new[i])
    lmeta[M_GV] = v
    lmeta[M_GM] = m
    return 0


@njit(cache=True)
def _draft(lst, led, lhk, lhv, lmeta, buf, n, gst, ged, ghk, ghv, gmeta,
           k, min_match, min_prob, local_weight, out, feat, scratch, touched):
    """Catch up, then draft up to ``k`` tokens into ``out``; returns how many (-1: bad token)."""
    if _catch_up(lst, led, lhk, lhv, lmeta, buf, n, gst, ged, ghk, ghv) < 0:
        return -1
    score = scratch[0]
    llast = scratch[1]
    glast = scratch[2]
    seen = scratch[3]
    depth_l = lmeta[M_DEPTH]
    depth_g = gmeta[M_DEPTH]
    vl = lmeta[M_LASTSTATE]
    ml = lst[vl, LEN]
    vg = lmeta[M_GV]
    mg = lmeta[M_GM]
    path = 1.0
    n_out = 0
    for i in range(k):
        vl, ml = _back_off(lst, vl, ml)
        vg, mg = _back_off(gst, vg, mg)
        if i == 0:
            feat[F_MATCH] = max(ml, mg)
        if max(ml, mg) < min_match:
            break
        nt = 0
        if ml >= mg:
            nt = _collect(lst, led, depth_l, vl, local_weight, True, score, llast, glast, seen, touched, nt)
        if mg >= ml:
            nt = _collect(gst, ged, depth_g, vg, 1.0, False, score, llast, glast, seen, touched, nt)
        best = -1
        total = 0.0
        for j in range(nt):
            t = touched[j]
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
        p = score[best] / total
        if i == 0:
            feat[F_COUNT] = score[best]
            feat[F_TOTAL] = total
            feat[F_FROM_HISTORY] = 1.0 if mg > ml else 0.0
        for j in range(nt):
            t = touched[j]
            score[t] = 0.0
            seen[t] = 0.0
            llast[t] = -1
            glast[t] = -1
        if path * p < min_prob:
            break
        path *= p
        out[n_out] = best
        n_out += 1
        vl, ml = match_step(lst, lhk, lhv, led, vl, ml, best)
        vg, mg = match_step(gst, ghk, ghv, ged, vg, mg, best)
    feat[F_PROB] = path
    return n_out


_EMPTY_HISTORY = None


def _empty_automaton() -> SuffixAutomaton:
    global _EMPTY_HISTORY
    if _EMPTY_HISTORY is None:
        _EMPTY_HISTORY = SuffixAutomaton(capacity=16)
    return _EMPTY_HISTORY


class SuffixSource:
    """``--suffix``: the rule in this module's docstring over the request and an optional history.

    ``history`` is a :class:`promptlookup.drafting.history.History` (or ``None``). When
    ``record`` is true, each request is added to it when the next one starts (``reset``) or when
    :meth:`commit` is called.
    """

    name = "suffix"

    def __init__(self, history=None, depth: int = 32, min_match: int = DEFAULT_MIN_MATCH,
                 min_prob: float = DEFAULT_MIN_PROB, local_weight: float = DEFAULT_LOCAL_WEIGHT,
                 record: bool = True, n_vocab: int = 1 << 17) -> None:
        if min_match < 1:
            raise ValueError(f"suffix min-match must be at least 1, got {min_match}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"suffix min-prob must be in 0..1, got {min_prob}")
        self.history = history
        self.depth = depth
        self.min_match = min_match
        self.min_prob = float(min_prob)
        self.local_weight = float(local_weight)
        self.record = record
        self._local = SuffixAutomaton(depth=depth)
        self._buf = np.zeros(1024, dtype=np.int32)  # the request's tokens; the automaton catches up
        self._n = 0
        self._out = np.zeros(64, dtype=np.int32)
        self._feat = np.zeros(N_FEAT, dtype=np.float64)
        self.n_vocab = n_vocab
        # per-token scratch rows: score, last seen in the request, last seen in history, seen flag
        self._scratch = np.zeros((4, n_vocab), dtype=np.float64)
        self._scratch[1:3] = -1.0
        self._touched = np.zeros(n_vocab, dtype=np.int64)
        if history is not None and history.max_token >= n_vocab:
            raise ValueError(f"the history holds token {history.max_token}, beyond n_vocab {n_vocab}")
        self._committed = True
        self._g_seen: SuffixAutomaton | None = None
        self._g_len = -1
        self.reset([0, 0, 0])
        self.propose(2)  # compile (or load the cached build) before any timing
        self._committed = True
        self.reset([])

    def _global(self) -> SuffixAutomaton:
        return self.history.automaton if self.history is not None else _empty_automaton()

    @property
    def tokens(self) -> np.ndarray:
        """The request's tokens so far (a view; do not keep it across ``extend``)."""
        return self._buf[: self._n]

    def _rematch(self, g: SuffixAutomaton) -> None:
        """The history changed under a request: match the request's text against it afresh."""
        self._g_seen, self._g_len = g, g.n_tokens
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
        self._local.meta[M_GV] = 0
        self._local.meta[M_GM] = 0
        g = self._global()
        self._g_seen, self._g_len = g, g.n_tokens
        self._committed = False
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        """Record confirmed tokens; the automata catch up inside the next ``propose`` (one call)."""
        m = len(tokens)
        n = self._n
        if n + m > len(self._buf):
            grown = np.zeros(max(2 * len(self._buf), n + m), dtype=np.int32)
            grown[:n] = self._buf[:n]
            self._buf = grown
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
        if k > len(self._out):
            self._out = np.zeros(k, dtype=np.int32)
        loc, g = self._local, self._global()
        if self._n > loc.cap_tokens:
            loc.reserve(self._n)
        if g is not self._g_seen or g.n_tokens != self._g_len:
            self._rematch(g)
        n = _draft(loc.st, loc.ed, loc.hk, loc.hv, loc.meta, self._buf, self._n,
                   g.st, g.ed, g.hk, g.hv, g.meta, k, self.min_match, self.min_prob, self.local_weight,
                   self._out, self._feat, self._scratch, self._touched)
        if n < 0:
            raise ValueError("a negative token id reached the suffix source")
        f = self._feat
        return Draft(
            tokens=tuple(self._out[:n].tolist()),
            source=self.name,
            match_len=int(f[F_MATCH]),
            features={"count": float(f[F_COUNT]), "total": float(f[F_TOTAL]),
                      "prob": float(f[F_PROB]), "from_history": float(f[F_FROM_HISTORY])},
        )


def make_suffix_source(history_path: str | None, n_vocab: int, fingerprint_fn,
                       budget: int | None = None) -> SuffixSource:
    """The ``--suffix`` source of a run: with ``history_path``, earlier requests saved there (a
    missing file starts an empty history that :func:`save_suffix_history` will create)."""
    from pathlib import Path

    from promptlookup.drafting.history import DEFAULT_BUDGET, History

    history = None
    if history_path is not None:
        fp = fingerprint_fn()
        if Path(history_path).exists():
            history = History.load(history_path, fingerprint=fp, budget=budget)
        else:
            history = History(budget=budget or DEFAULT_BUDGET, fingerprint=fp)
    return SuffixSource(history=history, n_vocab=n_vocab)


def save_suffix_history(source: SuffixSource, path: str) -> None:
    """Add the finished request to the history and write it atomically."""
    source.commit()
    if source.history is not None:
        source.history.save(path)
