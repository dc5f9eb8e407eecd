"""The ``--suffix`` rule (:mod:`promptlookup.drafting.suffix.rule`) compiled: one numba call drafts.

:func:`draft_kernel` catches the request's automaton and the history matcher up with the tokens
appended since the last call, then drafts token by token: back each matcher off to a match with a
follower, search the corpus only where its match could decide, collect the candidates of the
providers whose match decides, pick the best, and step the matchers on it.

Per-call cost. A draft at ``k = 3`` takes a few microseconds, so the fixed cost of one call
matters: the kernel takes each automaton and the corpus index as one NamedTuple of arrays
(:class:`~promptlookup.drafting.suffix.automaton.AutomatonTables`,
:class:`~promptlookup.drafting.suffix.corpus_index.CorpusArrays`: fields by name, resolved when
numba compiles), its parameters and its features as one-row structured arrays
(:data:`PARAMS`, :data:`FEATURES`: named, typed fields, one dispatch argument each) and its
per-token scratch as one matrix; the drafted tokens are read back from the token buffer, and the
``Draft`` is built with :func:`~promptlookup.drafting.base.make_draft`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
    deep_rep,
    extend_tokens,
    match_step,
)
from promptlookup.drafting.suffix.corpus_index import interval, narrow, search_from

# the kernel's parameters (one row, set by the source) and the first drafted token's features (one
# row, written by the kernel), as structured arrays: numba reads and writes the fields by name
PARAMS = np.dtype([("min_match", np.int64), ("min_prob", np.float64), ("local_weight", np.float64),
                   ("corpus_weight", np.float64), ("depth_g", np.int64), ("corpus_cap", np.int64),
                   ("corpus_margin", np.int64)])
FEATURES = np.dtype([("match", np.int64), ("count", np.float64), ("total", np.float64),
                     ("prob", np.float64), ("from_history", np.float64), ("from_corpus", np.float64)])
# scratch rows: score, last seen in the request, last seen in the history, seen flag, touched list
R_SCORE, R_LLAST, R_GLAST, R_SEEN, R_TOUCHED = range(5)
N_SCRATCH_ROWS = 5


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
    lmeta = local.meta
    pos = lmeta[M_POS]
    if pos == n:
        return 0
    new = buf[pos:n]
    for i in range(len(new)):
        if new[i] < 0:
            return -1
    extend_tokens(local.st, local.ed, local.hk, local.hv, lmeta, new)
    v = lmeta[M_GV]
    m = lmeta[M_GM]
    for i in range(len(new)):
        v, m = match_step(glob.st, glob.hk, glob.hv, glob.ed, v, m, new[i])
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
def draft_kernel(local, glob, corpus, buf, n, k, params, feat, scratch):
    """Catch up, then draft up to ``k`` tokens into ``buf[n:]`` (the draft's context too); returns
    how many (-1: a bad token, -2: a corrupt corpus index). ``local`` and ``glob`` are the request's
    and the history's :class:`~promptlookup.drafting.suffix.automaton.AutomatonTables`, ``corpus`` a
    :class:`~promptlookup.drafting.suffix.corpus_index.CorpusArrays`; ``params``
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
    lst, led, lhk, lhv, lmeta = local.st, local.ed, local.hk, local.hv, local.meta
    gst, ged, ghk, ghv = glob.st, glob.ed, glob.hk, glob.hv
    ctok, csa, cbk = corpus.tokens, corpus.sa, corpus.buckets
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
