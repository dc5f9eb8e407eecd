"""The acceptance model of ``auto``: how likely each drafted token is to hold, learned online.

For conditional acceptances ``p_1..p_L`` (the probability that drafted token ``i`` is accepted given
that the ones before it were, per source, match-length bucket and position), sending ``k`` drafts
confirms on average ``E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j`` tokens. Learning it needs no
exploration: the loop's output does not depend on what was drafted, so every proposal (also the ones
not sent) is scored against the tokens that actually follow (:mod:`promptlookup.drafting.auto.controller`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Lower bounds of the match-length buckets: 1, 2, 3, 4-5, 6-8, 9-15, 16-31, 32+.
MATCH_BUCKETS = (1, 2, 3, 4, 6, 9, 16, 32)
# Prior acceptance per bucket before any evidence: a longer exact match is a safer bet. These only
# seed the estimates (worth ``prior_strength`` observations); the run's own outcomes take over fast.
BUCKET_PRIOR = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93)
MAX_POSITIONS = 16
CONSERVATIVE_Z = 0.5  # choices are judged on acceptances this many standard deviations low (at 1.0,
# copies were sent 2-4 tokens at a time where 8 held; the controller's realized ratios also guard)


def _bucket_of(match_len: int) -> int:
    b = 0
    for i, lo in enumerate(MATCH_BUCKETS):
        if match_len >= lo:
            b = i
    return b


_BUCKETS = [_bucket_of(n) for n in range(MATCH_BUCKETS[-1] + 1)]  # asked on every step: a table


def match_bucket(match_len: int) -> int:
    return _BUCKETS[match_len] if 0 <= match_len < len(_BUCKETS) else _bucket_of(match_len)


@dataclass
class _Beta:
    hits: float = 0.0
    trials: float = 0.0


class AcceptanceModel:
    """P(drafted token i accepted | tokens before it accepted), per (source, bucket, position).

    Estimates shrink toward a pooled per-(source, bucket) rate, which shrinks toward a prior, so a
    bucket seen twice is not trusted like one seen a thousand times. A bucket's prior is the larger
    of :data:`BUCKET_PRIOR` and the pooled rate of the bucket below it: a draft that follows a longer
    exact match is expected to hold at least as well as one after a shorter match, so what the short
    matches of this text showed reaches the long ones before any long one was scored (a copy's
    match length climbs through every bucket in its first few dozen tokens). The expected
    tokens of a (source, bucket) are cached until that bucket or one below it learns something,
    because the controller asks for them on every step for every source.
    """

    def __init__(self, prior_mean: Sequence[float] | float = BUCKET_PRIOR, prior_strength: float = 2.0,
                 pool_strength: float = 4.0):
        if isinstance(prior_mean, int | float):
            prior_mean = (float(prior_mean),) * len(MATCH_BUCKETS)
        self.prior_mean = tuple(prior_mean)
        self.prior_strength = prior_strength
        self.pool_strength = pool_strength
        self.learning = True
        self._cells: dict[tuple[str, int, int], _Beta] = {}
        self._pools: dict[tuple[str, int], _Beta] = {}
        self._expected: dict[tuple[str, int], list[float]] = {}

    def _pooled(self, source: str, bucket: int) -> float:
        prior = self.prior_mean[0]
        rate = 0.0
        for b in range(bucket + 1):  # each bucket's prior: its own or the rate of the one below
            pool = self._pools.get((source, b), _Beta())
            prior = max(self.prior_mean[b], rate) if b else prior
            rate = (pool.hits + prior * self.prior_strength) / (pool.trials + self.prior_strength)
        return rate

    def _p(self, source: str, bucket: int, position: int, base: float) -> float:
        cell = self._cells.get((source, bucket, min(position, MAX_POSITIONS - 1)), _Beta())
        return (cell.hits + base * self.pool_strength) / (cell.trials + self.pool_strength)

    def _p_low(self, source: str, bucket: int, position: int, base: float) -> float:
        """:meth:`_p` less :data:`CONSERVATIVE_Z` standard deviations of its estimate: what a
        choice among many is judged on (see :meth:`expected`)."""
        cell = self._cells.get((source, bucket, min(position, MAX_POSITIONS - 1)), _Beta())
        n = cell.trials + self.pool_strength
        mean = (cell.hits + base * self.pool_strength) / n
        return max(0.0, mean - CONSERVATIVE_Z * math.sqrt(mean * (1.0 - mean) / (n + 1.0)))

    def p(self, source: str, match_len: int, position: int) -> float:
        """Conditional acceptance of the token at ``position`` (0-based) of a draft."""
        bucket = match_bucket(match_len)
        return self._p(source, bucket, position, self._pooled(source, bucket))

    def expected(self, source: str, match_len: int, depth: int = MAX_POSITIONS) -> list[float]:
        """``E(k)`` for k = 0..depth (see :func:`expected_tokens`), for a draft of this source and
        match length; the list may be longer than asked (callers slice)."""
        bucket = match_bucket(match_len)
        e = self._expected.get((source, bucket))
        if e is None or len(e) <= depth:
            base = self._pooled(source, bucket)
            e = expected_tokens([self._p_low(source, bucket, i, base) for i in range(depth)])
            self._expected[(source, bucket)] = e
        return e

    def frozen(self) -> AcceptanceModel:
        """A copy that learns nothing more: after a whole answer was observed, its rates known
        before the answer starts. ``auto`` judging by it shows what learning the rates costs on that
        answer (``benchmarks/auto_replay.py --foreknown``)."""
        out = copy.deepcopy(self)
        out.learning = False
        return out

    def carry_over(self, max_trials: float) -> None:
        """A new request is a new text: keep every estimate's mean, but worth at most
        ``max_trials`` observations, so this request's own outcomes take over within a few drafts
        (a source that drafted well on the last answer can fail on every draft of this one)."""
        if not self.learning:
            return
        for beta in (*self._cells.values(), *self._pools.values()):
            if beta.trials > max_trials:
                f = max_trials / beta.trials
                beta.hits *= f
                beta.trials = max_trials
        self._expected.clear()

    def observe(self, source: str, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """Record a resolved draft: positions 0..n_accepted were tried, the first n_accepted held."""
        self.observe_span(source, match_len, 0, n_accepted, n_accepted < n_drafted)

    def observe_span(self, source: str, match_len: int, start: int, held: int, missed: bool) -> None:
        """Record part of a draft as the confirmed tokens decide it: positions ``start..held-1``
        held, and with ``missed`` position ``held`` was tried and failed. The controller records a
        pending draft's hits as soon as they are confirmed, not when the whole draft is decided: a
        draft of 8 sent 4 tokens at a time is decided two steps later, and a copy would otherwise
        be judged on what was known two steps ago."""
        if not self.learning:
            return
        bucket = match_bucket(match_len)
        for b in range(bucket, len(MATCH_BUCKETS)):  # this bucket's rate is the prior of those above
            self._expected.pop((source, b), None)
        pool = self._pools.setdefault((source, bucket), _Beta())
        for i in range(start, held + 1 if missed else held):
            hit = 1.0 if i < held else 0.0
            cell = self._cells.setdefault((source, bucket, min(i, MAX_POSITIONS - 1)), _Beta())
            cell.hits += hit
            cell.trials += 1
            pool.hits += hit
            pool.trials += 1


def expected_tokens(p: Sequence[float]) -> list[float]:
    """``E(k)`` for k = 0..len(p): 1 + sum of the chances that the first i drafts all hold."""
    out = [1.0]
    run = 1.0
    for pi in p:
        run *= pi
        out.append(out[-1] + run)
    return out


def best_length(p: Sequence[float], rel_cost: Sequence[float]) -> tuple[int, float]:
    """The draft length (0 = none) with the most expected tokens per unit of verify cost."""
    e = expected_tokens(p)
    best_k, best_rate = 0, e[0] / rel_cost[0]
    for k in range(1, min(len(p), len(rel_cost) - 1) + 1):
        rate = e[k] / rel_cost[k]
        if rate > best_rate + 1e-12:
            best_k, best_rate = k, rate
    return best_k, best_rate
