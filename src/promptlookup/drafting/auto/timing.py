"""Measured step time for ``auto``: the seconds of a verify by width, followed on the run's own steps."""

from __future__ import annotations

from collections.abc import Sequence

TIME_ALPHA = 0.1  # weight of one step in the moving time estimates: follows drift over ~10 steps
DRIFT_SHARE = 0.5 * TIME_ALPHA  # how far one width's surprise moves the other widths' estimates
OUTLIER = 1.5  # a step slower than 1.5x its width's estimate (another process ran) counts as 1.5x...
OUTLIER_RUN = 2  # ... unless it is the third such step in a row: then the cost has changed
AFTERMATH_STEPS = 2  # plain steps after a drafted one that still run slow (see StepTimes)


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

    @property
    def plain_is_aftermath(self) -> bool:
        """Whether a plain step now would be booked as drafting's aftermath (:attr:`after`), not as
        a sample of the plain decode: one of the first :data:`AFTERMATH_STEPS` plain steps after a
        drafted one, once a steady plain step was measured."""
        return self._after_acc is not None and self.count[0] > 0

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
