"""Drafts from the live outputs of the requests running beside this one.

Why: a shared history learns a request when it ends, but requests that run together often write the
same text at the same time: n samples of one prompt, a batch of near-identical agent calls, a
session's next turn sent several times. When one of them is a few steps ahead, the others can copy
its output as it is written. ArcticInference's suffix decoding does this (its global tree takes each
response token by token); a history that commits whole requests cannot.

:class:`LiveOutputs` holds, for one engine step, the outputs so far of every live request (each
preceded by the last :data:`PROMPT_TAIL` tokens of its prompt, so that a follower can copy a leader
from its first output token) in one array, the requests separated by ``-1``. :meth:`LiveOutputs.draft`
finds the longest match of a request's last tokens anywhere in the other requests' text and drafts
what followed it there: at most as many tokens as matched (SuffixDecoding's cap, factor 1, so a
short, chance match drafts little) and at most ``k``. Ties go to the match with the longest
continuation, then to the latest in the pool. :func:`draft_plain` is the same rule in plain Python
(the reference twin the tests compare on real text).

Only requests' own tokens are read: nothing here knows about a backend or an engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: the longest match looked for (also the longest draft, with the factor-1 cap)
MAX_MATCH = 16
#: the shortest match that drafts: below it a match is chance
MIN_MATCH = 4
#: prompt tokens kept before each output: a follower's first output tokens match a leader's
PROMPT_TAIL = MAX_MATCH
#: output tokens kept per request (its latest), at most
WINDOW = 4096
#: tokens in one step's pool, at most: each request searches the whole pool, so a step costs about
#: requests x this many comparisons (measured: 8 requests of 1,000 output tokens, 0.3 ms a step)
POOL_TOKENS = 32768
#: output tokens kept per request, at least, however many requests run
MIN_WINDOW = 64


def window_for(live: int) -> int:
    """Output tokens kept per request when ``live`` requests share the pool."""
    return max(MIN_WINDOW, min(WINDOW, POOL_TOKENS // max(1, live)))


def segment_of(tokens: np.ndarray, start: int, n: int, window: int = WINDOW) -> np.ndarray:
    """The part of one request's tokens ``tokens[:n]`` (its output starting at ``start``) that others
    may copy: the prompt's last :data:`PROMPT_TAIL` tokens and the latest ``window`` output tokens."""
    lo = max(0, min(start, n) - PROMPT_TAIL, n - window - PROMPT_TAIL)
    return tokens[lo:n]


class LiveOutputs:
    """One step's pool of live outputs, searched by each request for a match with the others'."""

    def __init__(self, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.pool = np.full(1, -1, dtype=np.int64)
        self.bounds: list[tuple[int, int]] = []  # each request's [lo, hi) in the pool

    def build(self, segments: Sequence[np.ndarray]) -> None:
        """This step's pool: ``segments[i]`` is request ``i``'s text (see :func:`segment_of`)."""
        total = sum(len(s) for s in segments) + len(segments) + 1
        pool = np.full(total, -1, dtype=np.int64)
        bounds = []
        at = 1
        for s in segments:
            pool[at : at + len(s)] = s
            bounds.append((at, at + len(s)))
            at += len(s) + 1
        self.pool, self.bounds = pool, bounds

    def draft(self, owner: int, context: np.ndarray, k: int) -> tuple[int, np.ndarray]:
        """``(match length, draft)`` for request ``owner`` (an index of :meth:`build`'s segments, or
        -1 for none) whose tokens end with ``context``: the draft copies what followed the longest
        match in another request's text; ``(0, [])`` when no match reaches ``min_match``."""
        nothing = (0, self.pool[:0])
        if k < 1 or len(context) < self.min_match or len(self.bounds) < 1:
            return nothing
        pool = self.pool
        # candidates: where the context's last token is, with a token after it
        cand = np.flatnonzero(pool[:-1] == context[-1])
        cand = cand[pool[cand + 1] >= 0]
        if 0 <= owner < len(self.bounds):
            lo, hi = self.bounds[owner]
            cand = cand[(cand < lo) | (cand >= hi)]
        if cand.size == 0:
            return nothing
        longest = min(self.max_match, len(context))
        length = np.ones(cand.size, dtype=np.int64)
        alive = np.arange(cand.size)
        for d in range(1, longest):  # pool[0] is -1: a match never runs off the front
            if alive.size == 0:
                break
            alive = alive[pool[cand[alive] - d] == context[-1 - d]]
            length[alive] += 1
        best = int(length.max())
        if best < self.min_match:
            return nothing
        cap = min(k, best)
        top = cand[length == best]
        # the continuation of each: up to cap tokens before the next separator
        cont = np.zeros(top.size, dtype=np.int64)
        open_ = np.ones(top.size, dtype=bool)
        for j in range(1, cap + 1):
            open_ &= pool[np.minimum(top + j, len(pool) - 1)] >= 0
            cont += open_
        pick = top[np.flatnonzero(cont == cont.max())[-1]]
        n = int(cont.max())
        return best, pool[pick + 1 : pick + 1 + n]


def draft_plain(segments: Sequence[Sequence[int]], owner: int, context: Sequence[int], k: int,
                min_match: int = MIN_MATCH, max_match: int = MAX_MATCH) -> tuple[int, list[int]]:
    """:meth:`LiveOutputs.draft` in plain Python, position by position: the reference twin."""
    if k < 1 or len(context) < min_match:
        return 0, []
    found = []  # (match length, segment, position) of every position with a token after it
    for i, seg in enumerate(segments):
        if i == owner:
            continue
        for p in range(len(seg) - 1):
            m = 0
            while m < min(max_match, len(context), p + 1) and seg[p - m] == context[-1 - m]:
                m += 1
            found.append((m, i, p))
    best = max((m for m, _, _ in found), default=0)
    if best < min_match:
        return 0, []
    draft: list[int] = []
    for m, i, p in found:  # in pool order: a later tie replaces an earlier one
        if m == best:
            follow = list(segments[i][p + 1 : p + 1 + min(k, best)])
            if len(follow) >= len(draft):
                draft = follow
    return best, draft
