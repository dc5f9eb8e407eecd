"""Cost-aware speculation: draft only where drafting pays, judged by the run's own measured time.

Seed 000's lesson was that a drafting step which is not accepted often enough costs more than the
plain decode it replaced, and that tightening a fixed gate converges on "off". So instead of a
fixed draft length, :class:`AutoDrafter` decides per step which source to draft from and how many
tokens to send (0 = a plain decode), by the most confirmed tokens per second. Three things feed it:

* an **acceptance model**: the probability that drafted token ``i`` is accepted given that the ones
  before it were, per (source, match-length bucket, position), learned online. For conditional
  acceptances ``p_1..p_L``, sending ``k`` drafts confirms on average
  ``E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j`` tokens. Learning it needs no exploration: the loop's
  output does not depend on what was drafted, so every proposal (also the ones not sent) is scored
  against the tokens that actually follow.
* **measured step time** (:class:`StepTimes`): after every step the loop reports the seconds of
  its verify (rollback included) and of its drafting (:meth:`AutoDrafter.feedback`). The verify
  cost curve measured at load only gives the shape; the seconds follow the run (context length,
  other load, heat). The drafting seconds (every source is asked, every source is told every
  token) are charged to every step, plain ones included, since a plain step under ``auto`` pays them.
* **realized outcomes** of its own choices: per kind of choice (source, match bucket, length), the
  confirmed tokens and seconds of the steps where it was taken. The prediction of a kind shrinks
  toward its realized rate as its steps accumulate, so a choice the acceptance model likes but
  that does not pay (against plain steps' measured rate) is dropped, and one that pays is kept.

Honest selection. Taking the best of several noisy estimates overestimates the winner (the
winner's curse): each source's predicted accepted tokens are scaled by its own realized/predicted
ratio on the steps it won before sources are compared, and realized rates replace predicted ones
where they exist. Plain steps are still taken now and then (:data:`PLAIN_EVERY`) so the plain
baseline stays measured, and a source that has not won for a while is asked only every
:data:`PROBE_EVERY` steps, since asking costs time too.

It is itself a :class:`~promptlookup.drafting.base.DraftSource` (named ``auto``) wrapping the real
sources, so the speculative loop needs no special case for it. Without feedback (a loop that
reports no times) it decides on the curve and the acceptance model alone; the llama-cpp-python
drop-in reports the time between two calls of its draft model instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from promptlookup.drafting.base import Draft, DraftSource, StepFeedback
from promptlookup.drafting.spec import Option, Run, SourceSpec, options_of, save_state, source_factory

# Lower bounds of the match-length buckets: 1, 2, 3, 4-5, 6-8, 9-15, 16-31, 32+.
MATCH_BUCKETS = (1, 2, 3, 4, 6, 9, 16, 32)
# Prior acceptance per bucket before any evidence: a longer exact match is a safer bet. These only
# seed the estimates (worth ``prior_strength`` observations); the run's own outcomes take over fast.
BUCKET_PRIOR = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93)
MAX_POSITIONS = 16
# Under the controller the suffix matcher drafts from any match (the buckets judge them) and measures
# matches up to 64 tokens long: past 16 tokens a match is still getting more reliable.
AUTO_MAX_MATCH = 64

# How the controller follows measured time (steps are verify steps of the loop).
TIME_ALPHA = 0.1  # weight of one step in the moving time estimates: follows drift over ~10 steps
DRIFT_SHARE = 0.5 * TIME_ALPHA  # how far one width's surprise moves the other widths' estimates
OUTLIER = 1.5  # a step slower than 1.5x its width's estimate (another process ran) counts as 1.5x...
OUTLIER_RUN = 2  # ... unless it is the third such step in a row: then the cost has changed
HALF_LIFE = 128.0  # steps after which a realized outcome weighs half: choices are re-judged as things drift
CALIBRATION_STRENGTH = 4.0  # predicted accepted tokens at the prior ratio in a realized/predicted ratio
AFTERMATH_STEPS = 2  # plain steps after a drafted one that still run slow (see StepTimes)
PLAIN_EVERY = 64  # a plain step is due after this many steps without one (keeps the baseline measured)
MIN_PLAIN = 2  # ... and while fewer than this many plain steps were measured in the run
PROBE_GAIN = 1.5  # a due plain step is taken where the best draft promises less than this gain...
PROBE_WAIT = 16  # ... or once it has been due this many steps
IDLE_AFTER = 16  # a source that won none of the last IDLE_AFTER steps it was asked in...
PROBE_EVERY = 8  # ... is asked only every PROBE_EVERY steps, until it wins again
_DECAY = 0.5 ** (1.0 / HALF_LIFE)
CONSERVATIVE_Z = 1.0  # choices are judged on acceptances this many standard deviations low
CARRY_TRIALS = 8.0  # what one request's acceptance record is worth in the next request


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

    Estimates shrink toward a pooled per-(source, bucket) rate, which shrinks toward a global
    prior, so a bucket seen twice is not trusted like one seen a thousand times. The expected
    tokens of a (source, bucket) are cached until that bucket learns something, because the
    controller asks for them on every step for every source.
    """

    def __init__(self, prior_mean: Sequence[float] | float = BUCKET_PRIOR, prior_strength: float = 2.0,
                 pool_strength: float = 4.0):
        if isinstance(prior_mean, int | float):
            prior_mean = (float(prior_mean),) * len(MATCH_BUCKETS)
        self.prior_mean = tuple(prior_mean)
        self.prior_strength = prior_strength
        self.pool_strength = pool_strength
        self._cells: dict[tuple[str, int, int], _Beta] = {}
        self._pools: dict[tuple[str, int], _Beta] = {}
        self._expected: dict[tuple[str, int], list[float]] = {}

    def _pooled(self, source: str, bucket: int) -> float:
        pool = self._pools.get((source, bucket), _Beta())
        prior = self.prior_mean[bucket]
        return (pool.hits + prior * self.prior_strength) / (pool.trials + self.prior_strength)

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

    def carry_over(self, max_trials: float) -> None:
        """A new request is a new text: keep every estimate's mean, but worth at most
        ``max_trials`` observations, so this request's own outcomes take over within a few drafts
        (a source that drafted well on the last answer can fail on every draft of this one)."""
        for beta in (*self._cells.values(), *self._pools.values()):
            if beta.trials > max_trials:
                f = max_trials / beta.trials
                beta.hits *= f
                beta.trials = max_trials
        self._expected.clear()

    def observe(self, source: str, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """Record a resolved draft: positions 0..n_accepted were tried, the first n_accepted held."""
        bucket = match_bucket(match_len)
        self._expected.pop((source, bucket), None)
        pool = self._pools.setdefault((source, bucket), _Beta())
        for i in range(min(n_accepted + 1, n_drafted)):
            hit = 1.0 if i < n_accepted else 0.0
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


class StepTimes:
    """Seconds of a step by verify width, measured on the run's own steps.

    Each width's estimate is the moving average of its own measured verifies (rollback included).
    A width not measured yet is read off its measured neighbours through the curve's relative
    costs (between two measured widths, the two readings blended by distance); before any
    measurement the curve itself is the estimate (in plain-decode units). The load-time
    curve thus only gives the shape where nothing was measured; a curve timed once at a short
    context can be wrong at the run's context (the bundled model's 3-token verify was 1.66 plain
    decodes on the curve and about 2.0 in a prose run). A wider verify is never expected to be
    cheaper than a narrower one (the estimates are made non-decreasing).

    Drift (context length, other load, heat) shows first in the widths in use: every measurement's
    surprise (measured over expected) also moves the other measured widths, by :data:`DRIFT_SHARE`
    of the weight it has on its own width, so the plain decode's estimate follows while a run drafts
    on every step, and plain steps taken now and then re-anchor it. A slow step (another process
    took the core) is clipped at :data:`OUTLIER` times its width's estimate (a width's first
    measurement is taken as it is), so the estimates follow the typical step, not the spikes of a
    shared machine's load; from the third slow step in a row on, the slow time is taken as it is,
    and weighs half, since a cost that stays high is a new level. A
    measurement of a width not measured for a while weighs as much as the steps it missed would
    have, so a rare plain step re-anchors the baseline at once.

    Drafting also costs after its own step: on llama.cpp the first plain decodes after a wider verify
    run slow (measured on the bundled model, 2 threads: +1.4 ms and +0.8 ms after a 9-token verify,
    +0.75 ms after a 2-token one, on a 9 ms decode), a cost that lands on plain steps and so, unseen,
    makes plain decoding look slower and drafting look cheaper than they are. The excess of the first
    :data:`AFTERMATH_STEPS` plain steps after drafting over a steady plain step is measured
    (:attr:`after`, a moving average per drafting episode), those steps are kept out of the plain
    estimate, and a draft that starts an episode (the step before was plain) is charged it.
    """

    def __init__(self, rel_cost: Sequence[float]) -> None:
        self.rel = [float(c) for c in rel_cost]
        self.own = [0.0] * len(self.rel)  # measured seconds per width (index width - 1)
        self.count = [0] * len(self.rel)
        self.last = [0] * len(self.rel)  # the step each width was last measured at
        self.slow = [0] * len(self.rel)  # slow steps in a row per width (clipped as spikes)
        self.overhead = 0.0  # seconds a step spends drafting (asking, telling, this controller)
        self.after = 0.0  # seconds the first plain steps after drafting take beyond steady ones
        self.episodes = 0  # drafting episodes whose aftermath was measured
        self.prev = 1  # width of the last step observed
        self._after_acc: float | None = None  # excess so far of the episode being measured
        self._after_left = 0  # plain steps of it still to measure
        self.steps = 0
        self._verify = list(self.rel)  # expected seconds per width
        self._dirty = False

    @property
    def measured(self) -> bool:
        return self.steps > 0

    def verify(self, width: int) -> float:
        """Expected seconds of a verify feeding ``width`` tokens (curve units before any step)."""
        if self._dirty:
            self._rebuild()
        return self._verify[min(width, len(self.rel)) - 1]

    def step(self, width: int) -> float:
        """Expected seconds of a whole step: its verify, the drafting every step pays, and for a
        draft after a plain step, the slower plain steps it will leave behind (:attr:`after`)."""
        t = self.verify(width) + self.overhead
        return t + self.after if width > 1 and self.prev == 1 else t

    def _close_episode(self) -> None:
        acc, self._after_acc, self._after_left = self._after_acc, None, 0
        if acc is None:
            return
        weight = max(1.0 / (self.episodes + 1), TIME_ALPHA)
        self.after = max(0.0, self.after + weight * (acc - self.after))
        self.episodes += 1

    def observe(self, width: int, verify_s: float, draft_s: float) -> None:
        i = min(width, len(self.rel)) - 1
        verify_s = max(verify_s, 1e-9)
        prev, self.prev = self.prev, width
        if width > 1:
            if self._after_acc is not None:  # drafting again before the aftermath was all seen
                self._close_episode()
            if prev == 1:
                self._after_acc, self._after_left = 0.0, AFTERMATH_STEPS
        elif self._after_acc is not None and self.count[0]:
            # One of the first plain steps after drafting: its excess is drafting's, not plain's.
            steady = self.verify(1)
            self._after_acc += min(verify_s, OUTLIER * steady) - steady
            self._after_left -= 1
            if self._after_left <= 0:
                self._close_episode()
            self.steps += 1
            return
        if self.steps == 0:
            self.overhead = draft_s
        else:
            draft_s = min(draft_s, 2 * OUTLIER * max(self.overhead, 1e-6))
            self.overhead += TIME_ALPHA * (draft_s - self.overhead)
            expected = self.verify(width)
            # A width's first measurement is taken as it is (the curve may be far off), and so is a
            # slow step after OUTLIER_RUN slow ones in a row: that is a new level, not a spike.
            if self.count[i] and verify_s > OUTLIER * expected:
                self.slow[i] += 1
                if self.slow[i] <= OUTLIER_RUN:
                    verify_s = OUTLIER * expected
            else:
                self.slow[i] = 0
            drift = (verify_s / expected) ** DRIFT_SHARE
            if drift != 1.0:
                for v, n in enumerate(self.count):
                    if n and v != i:
                        self.own[v] *= drift
        n = self.count[i]
        # A plain mean at first, then a moving one; an estimate last measured ``age`` steps ago
        # weighs as if it had decayed all that time, so a rare plain step re-anchors the baseline.
        age = self.steps + 1 - self.last[i]  # steps since this width was last measured, this one included
        weight = max(1.0 / (n + 1), 1.0 - (1.0 - TIME_ALPHA) ** age)
        if self.slow[i] > OUTLIER_RUN:  # a new level: move halfway at each step until it is reached
            weight = max(weight, 0.5)
        self.own[i] += weight * (verify_s - self.own[i])
        self.count[i] = n + 1
        self.steps += 1
        self.last[i] = self.steps
        self._dirty = True

    def _rebuild(self) -> None:
        width = len(self.rel)
        known = [v for v in range(width) if self.count[v]]
        est = list(self.own)
        below = None
        k = 0  # index in known of the first measured width above v
        for v in range(width):
            if self.count[v]:
                below = v
                k += 1
                continue
            above = known[k] if k < len(known) else None
            if below is not None and above is not None:  # the curve's shape scaled by both ends
                t = (v - below) / (above - below)
                est[v] = self.rel[v] * ((1 - t) * self.own[below] / self.rel[below]
                                        + t * self.own[above] / self.rel[above])
            elif below is not None:
                est[v] = self.own[below] * self.rel[v] / self.rel[below]
            else:
                assert above is not None
                est[v] = self.own[above] * self.rel[v] / self.rel[above]
        for v in range(1, width):
            est[v] = max(est[v], est[v - 1])
        self._verify = est
        self._dirty = False


@dataclass
class _Ledger:
    """Realized outcomes of one kind of choice, older steps weighing less (half-life HALF_LIFE)."""

    n: float = 0.0  # steps
    accepted: float = 0.0  # accepted drafts
    predicted: float = 0.0  # accepted drafts the acceptance model predicted
    tokens: float = 0.0  # confirmed tokens of the steps whose time was measured (feedback)
    seconds: float = 0.0  # their step seconds, drafting included
    at: int = 0  # the step the sums are decayed to

    def age(self, now: int) -> _Ledger:
        if now != self.at:
            f = _DECAY ** (now - self.at)
            self.n *= f
            self.tokens *= f
            self.seconds *= f
            self.accepted *= f
            self.predicted *= f
            self.at = now
        return self

    def add(self, now: int, accepted: int, predicted: float) -> None:
        self.age(now)
        self.n += 1
        self.accepted += accepted
        self.predicted += predicted

    def carry_over(self, max_predicted: float) -> None:
        if self.predicted > max_predicted:
            f = max_predicted / self.predicted
            self.accepted *= f
            self.predicted = max_predicted
            self.n *= f

    def timed(self, now: int, tokens: int, seconds: float) -> None:
        self.age(now)
        self.tokens += tokens
        self.seconds += seconds


@dataclass
class _Pending:
    start: int  # index in the confirmed stream of the first token this draft guessed
    draft: Draft


@dataclass
class Calibration:
    """Predicted against realized accepted tokens, over the drafts that were sent to the model."""

    predicted: float = 0.0
    realized: int = 0
    chosen_steps: int = 0
    steps: int = 0
    per_source: dict[str, int] = field(default_factory=dict)
    plain_probes: int = 0  # plain steps taken to keep the plain baseline measured
    asked: int = 0  # proposals asked of the sources (at most sources x steps)

    @property
    def ratio(self) -> float:
        return self.realized / self.predicted if self.predicted > 0 else 0.0


@dataclass
class _Choice:
    """What :meth:`AutoDrafter.propose` decided, kept until the step's feedback arrives."""

    key: tuple[str, int, int] | None  # (source, match bucket, length); None: a plain step


class AutoDrafter:
    """``--speculate auto``: pick the source and draft length per step by measured tokens per second."""

    name = "auto"

    def __init__(self, sources: Sequence[DraftSource], rel_cost: Sequence[float], max_draft: int = 8,
                 model: AcceptanceModel | None = None, margin: float = 0.0) -> None:
        if not sources:
            raise ValueError("auto speculation needs at least one draft source")
        if len(rel_cost) < 2 or rel_cost[0] <= 0:
            raise ValueError("the relative cost curve needs the 1-token cost and at least one more")
        self.sources = list(sources)
        self.rel_cost = [c / rel_cost[0] for c in rel_cost]
        self.max_draft = max_draft
        self.margin = margin
        self.model = model or AcceptanceModel()
        self.calibration = Calibration()
        self.times = StepTimes(self.rel_cost)
        self._arms: dict[tuple[str, int, int], _Ledger] = {}
        self._by_source: dict[str, _Ledger] = {}
        self._idle = [0] * len(self.sources)  # asked steps since each source last won
        self._since_plain = 0
        self._step = 0
        self._last: _Choice | None = None
        self._stream: list[int] = []
        self._told = [0] * len(self.sources)  # tokens of the stream each source has been told
        self._pending: list[_Pending] = []
        # start of the step -> (kind of choice: source, bucket, tokens sent; predicted accepted tokens)
        self._chosen: dict[int, tuple[tuple[str, int, int], float]] = {}

    def reset(self, prompt: Sequence[int]) -> None:
        """A new request: the sources restart; what was learned about time stays, and what was
        learned about acceptance carries over as a prior worth :data:`CARRY_TRIALS` observations."""
        if self._stream:
            self.model.carry_over(CARRY_TRIALS)
            for led in (*self._arms.values(), *self._by_source.values()):
                led.carry_over(CARRY_TRIALS)
        for i, s in enumerate(self.sources):
            self._tell(i)  # a source that records a request when the next one starts sees all of it
            s.reset(prompt)
        self._stream = []
        self._told = [0] * len(self.sources)
        self._pending = []
        self._chosen = {}
        self._last = None

    def commit(self) -> None:
        """End of a request: sources that learn across requests (lookup's dynamic cache) keep it."""
        for i, s in enumerate(self.sources):
            self._tell(i)
            s.commit()

    def extend(self, tokens: Sequence[int]) -> None:
        """The confirmed tokens are kept here and told to each source when it is next asked
        (:meth:`_tell`): a source's proposal depends only on the tokens it has seen, so telling it
        several at once changes nothing but the cost, which is one call per source per step instead
        of two, and one per :data:`PROBE_EVERY` steps for a source that is asked rarely."""
        self._stream.extend(int(t) for t in tokens)
        self._resolve()

    def _tell(self, i: int) -> None:
        told, n = self._told[i], len(self._stream)
        if told < n:
            self.sources[i].extend(self._stream[told:])
            self._told[i] = n

    def _resolve(self) -> None:
        """Score every pending proposal whose outcome the confirmed tokens now decide."""
        n = len(self._stream)
        still: list[_Pending] = []
        for pend in self._pending:
            toks = pend.draft.tokens
            m = 0
            while m < len(toks) and pend.start + m < n and toks[m] == self._stream[pend.start + m]:
                m += 1
            decided = m == len(toks) or pend.start + m < n
            if not decided:
                still.append(pend)
                continue
            self.model.observe(pend.draft.source, pend.draft.match_len, len(toks), m)
            chosen = self._chosen.get(pend.start)
            if chosen is not None and chosen[0][0] == pend.draft.source:
                del self._chosen[pend.start]
                key, predicted = chosen
                accepted = min(m, key[2])
                self.calibration.predicted += predicted
                self.calibration.realized += accepted
                # the realized/predicted ratios that correct the winner's curse (known from the
                # tokens alone, so they work without the loop's feedback too)
                for led in (self._arms.setdefault(key, _Ledger(at=self._step)),
                            self._by_source.setdefault(key[0], _Ledger(at=self._step))):
                    led.add(self._step, accepted, predicted)
        self._pending = still

    # -- what a choice is worth -----------------------------------------------------------------
    def source_ratio(self, source: str) -> float:
        """Realized over predicted accepted drafts on the steps ``source`` won (1 before any),
        shrunk toward 1 by :data:`CALIBRATION_STRENGTH` tokens: the winner's-curse correction."""
        led = self._by_source.get(source)
        if led is None:
            return 1.0
        led.age(self._step)
        return (led.accepted + CALIBRATION_STRENGTH) / (led.predicted + CALIBRATION_STRENGTH)

    def plain_rate(self) -> float:
        """Tokens per second of a plain step (in plain-decode units before any feedback)."""
        return 1.0 / self.times.step(1)

    def choice_ratio(self, source: str, match_len: int, k: int, ratio: float | None = None,
                     bucket: int | None = None) -> float:
        """Realized over predicted accepted drafts on the steps where this kind of choice (source,
        match bucket, length) was taken, shrunk toward its source's ratio: a kind the acceptance
        model overrates is scaled down by its own record, older steps weighing less."""
        if ratio is None:
            ratio = self.source_ratio(source)
        led = self._arms.get((source, match_bucket(match_len) if bucket is None else bucket, k))
        if led is None:
            return ratio
        led.age(self._step)
        return (led.accepted + CALIBRATION_STRENGTH * ratio) / (led.predicted + CALIBRATION_STRENGTH)

    def rate(self, source: str, match_len: int, k: int, expected: float | None = None,
             ratio: float | None = None, bucket: int | None = None) -> float:
        """Expected confirmed tokens per second of sending ``k`` drafts of this source and match
        length: the accepted drafts the acceptance model predicts, scaled by what this kind of
        choice realized (:meth:`choice_ratio`), plus the model's own token, over the measured
        seconds of a step of that width (drafting included). Tokens are judged per kind of choice
        and seconds per width, so a change of cost (drift) shows in every choice at once."""
        if expected is None:
            expected = self.model.expected(source, match_len, k)[k]
        rho = self.choice_ratio(source, match_len, k, ratio, bucket)
        return (1.0 + rho * (expected - 1.0)) / self.times.step(k + 1)

    def realized(self) -> dict[tuple[str, int, int], tuple[float, float]]:
        """Per kind of choice taken: (steps, measured seconds per confirmed token), decayed like
        the ratios; plain steps' seconds per token is ``times.step(1)``."""
        out = {}
        for key, led in self._arms.items():
            led.age(self._step)
            if led.tokens > 0:
                out[key] = (led.n, led.seconds / led.tokens)
        return out

    def _plain_due(self, gain: float) -> bool:
        """Whether to decode plainly although a draft looks better: the plain baseline is what
        every choice is judged against, so it must be measured early (:data:`MIN_PLAIN` steps) and
        again every :data:`PLAIN_EVERY` steps, at a step where the draft promises little."""
        if not self.times.measured:  # no feedback (yet): nothing to measure the baseline for
            return False
        due = self._since_plain - PLAIN_EVERY if self.times.count[0] >= MIN_PLAIN else self._step - 1
        return due >= 0 and (gain < PROBE_GAIN or due >= PROBE_WAIT)

    def _ask(self, i: int) -> bool:
        return self._idle[i] < IDLE_AFTER or (self._step + i) % PROBE_EVERY == 0

    def propose(self, k: int) -> Draft:
        start = len(self._stream)
        self._step += 1
        self._since_plain += 1
        cal = self.calibration
        cal.steps += 1
        plain = self.plain_rate() * (1.0 + self.margin)
        best: Draft | None = None
        best_i, best_k, best_rate, best_pred = -1, 0, plain, 0.0
        depth = min(k, self.max_draft)
        for i, source in enumerate(self.sources):
            if not self._ask(i):
                continue
            cal.asked += 1
            self._idle[i] += 1  # restarts below if this source wins
            self._tell(i)
            d = source.propose(self.max_draft)
            if not d.tokens:
                continue
            self._pending.append(_Pending(start, d))
            top = min(len(d.tokens), depth)
            e = self.model.expected(d.source, d.match_len, top)
            ratio = self.source_ratio(d.source)
            bucket = match_bucket(d.match_len)
            for kk in range(1, top + 1):
                r = self.rate(d.source, d.match_len, kk, e[kk], ratio, bucket)
                if r > best_rate + 1e-12:
                    best, best_i, best_k, best_rate, best_pred = d, i, kk, r, e[kk] - 1.0
        if best_i >= 0:
            self._idle[best_i] = 0
        if best is not None and self._plain_due(best_rate / plain):
            best = None  # a plain step now and then keeps the baseline measured as the curve drifts
            cal.plain_probes += 1
        if best is None:
            self._last = _Choice(None)
            self._since_plain = 0
            return Draft(source=self.name)
        # One chosen draft per step; the pending entry of that source carries the outcome.
        key = (best.source, match_bucket(best.match_len), best_k)
        self._chosen[start] = (key, best_pred)
        self._last = _Choice(key)
        cal.chosen_steps += 1
        cal.per_source[best.source] = cal.per_source.get(best.source, 0) + 1
        return Draft(tokens=best.tokens[:best_k], source=best.source, match_len=best.match_len,
                     features={**best.features, "expected_tokens": best_pred + 1.0, "rate": best_rate})

    def feedback(self, step: StepFeedback) -> None:
        """The step after :meth:`propose` took ``step.verify_s + step.draft_s`` seconds and confirmed
        ``step.confirmed`` tokens: the time model learns what that width costs now, and a drafted
        step's seconds per token are booked to its kind of choice (:meth:`realized`)."""
        choice, self._last = self._last, None
        if choice is None:
            return
        self.times.observe(step.fed, step.verify_s, step.draft_s)
        if choice.key is None:
            self._since_plain = 0
            return
        led = self._arms.setdefault(choice.key, _Ledger(at=self._step))
        led.timed(self._step, step.confirmed, step.verify_s + step.draft_s)


def auto_sources(*extra: DraftSource | None) -> list[DraftSource]:
    """The sources ``auto`` weighs: the suffix matcher, ungated, plus any others the run has."""
    from promptlookup.drafting.ngram.source import NgramSource

    return [NgramSource(min_match=1, max_match=AUTO_MAX_MATCH), *(s for s in extra if s is not None)]


# --- the source vocabulary (promptlookup.drafting.spec): auto[:sources=ngram+lookup+suffix]
# [:curve=FILE][:margin=X] plus the settings of the sources it weighs (static=, history=, corpus=...) ---

WEIGHED = ("lookup", "suffix")  # sources auto can weigh beside its own ungated ngram
OPTIONS = {
    "sources": Option(str, "ngram+lookup+suffix"),
    "curve": Option(str, None, flag="--cost-curve"),  # verify cost curve (JSON) instead of measuring one
    "margin": Option(float, 0.0),  # a draft must beat plain decoding's rate by this fraction
    **{k: v for name in WEIGHED for k, v in options_of(name).items() if k != "draft"},
}


def check(spec: SourceSpec) -> None:
    from promptlookup.drafting.spec import SpecError

    margin = spec.value("margin")
    if not -1.0 < margin <= 10.0:  # also refuses nan
        raise SpecError(f"margin must be a number above -1 and at most 10, got {spec.get('margin')!r}")
    unknown = [n for n in spec.value("sources").split("+") if n not in ("ngram", *WEIGHED)]
    if unknown:
        raise SpecError(f"{spec.label}: auto weighs ngram, {', '.join(WEIGHED)}; not {', '.join(unknown)}")


def weighed_specs(spec: SourceSpec) -> list[SourceSpec]:
    """The specs of the sources ``spec`` weighs beside the ungated ngram, each with its own settings."""
    names = spec.value("sources").split("+")
    return [SourceSpec(n, spec.with_options(options_of(n)), spec.from_flags) for n in names if n in WEIGHED]


def factory(spec: SourceSpec, run: Run) -> Callable[[], AutoDrafter]:
    """The cost curve is read (or measured, through ``run.cost_curve``) once; each drafter gets fresh
    sources."""
    from promptlookup.drafting.base import MAX_DRAFT
    from promptlookup.measure.costs import CostCurve

    makers = [source_factory(s, run) for s in weighed_specs(spec)]
    curve = CostCurve.load(spec.value("curve")) if spec.value("curve") else run.curve()
    rel, margin = curve.relative(MAX_DRAFT + 1), spec.value("margin")
    return lambda: AutoDrafter(auto_sources(*(m() for m in makers)), rel, max_draft=MAX_DRAFT, margin=margin)


def save(spec: SourceSpec, source: AutoDrafter) -> None:
    """End of a run (after commit): every weighed source saves what it learned."""
    for s, src in zip(weighed_specs(spec), source.sources[1:], strict=True):
        save_state(s, src)
