"""The ``auto`` controller: per step, which source to draft from and how many tokens to send.

:class:`AutoDrafter` decides by the most confirmed tokens per second, from the acceptance model
(:mod:`~promptlookup.drafting.auto.acceptance`) and the measured step times
(:mod:`~promptlookup.drafting.auto.timing`).

Honest selection. Taking the best of several noisy estimates overestimates the winner (the
winner's curse), most where acceptance is low and four sources compete for every step: choices are
judged on acceptances a little low (:data:`~promptlookup.drafting.auto.acceptance.CONSERVATIVE_Z`),
and each kind of choice, a source's drafts after a match of one length bucket, has its predicted
accepted drafts scaled by its realized/predicted ratio on the steps it was sent (:class:`_Ledger`),
shrunk toward its source's. Without such a ratio, in a same-text replay of the 1.5B's prose answer,
`auto` drafted on 117 of 222 steps at 21% acceptance (50 of 230 with it), and live it ran level with
plain decoding (1.007x over 6 rounds). Until 2026-12-06 the kind included the draft's length as
well: learned from the few steps a length was sent, that ratio locked a copy into the length that
happened to go well first (one 7-token draft that held 5 priced 7 at 0.84 for the rest of a
256-token copy, which then went out 5 at a time where 8 held). Plain steps are still taken now and
then (:data:`PLAIN_EVERY`) so the plain baseline stays measured, early in a run only where the
verifies contradict the load-time curve (:meth:`AutoDrafter.curve_holds`), and a source that has not
won for a while is asked only every :data:`PROBE_EVERY` steps until the next request, since asking
costs time too. Where two sources' drafts part, the one after the shorter match is sent only up to
there (:func:`parting`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.drafting.auto.acceptance import AcceptanceModel, match_bucket
from promptlookup.drafting.auto.timing import StepTimes
from promptlookup.drafting.base import Draft, DraftSource, StepFeedback
from promptlookup.drafting.forced import FORCED, GRAMMAR, NOTHING, Continuation

HALF_LIFE = 128.0  # steps after which a realized outcome weighs half: prices are re-judged as things drift
CALIBRATION_STRENGTH = 4.0  # predicted accepted tokens at the prior ratio in a realized/predicted ratio
PLAIN_EVERY = 64  # a plain step is due after this many steps without one (keeps the baseline measured)
MIN_PLAIN = 2  # ... and while fewer than this many plain steps were measured in the run, unless
TRUST = 1.25  # ... the measured verifies read as the curve's plain-decode seconds within this factor
PROBE_GAIN = 1.5  # a due plain step is taken where the best draft promises less than this gain...
PROBE_WAIT = 16  # ... or once it has been due this many steps
IDLE_AFTER = 16  # a source that won none of the last IDLE_AFTER steps it was asked in...
PROBE_EVERY = 8  # ... is asked only every PROBE_EVERY steps, until it wins again
_DECAY = 0.5 ** (1.0 / HALF_LIFE)
CARRY_TRIALS = 8.0  # what one request's acceptance record is worth in the next request


@dataclass
class _Ledger:
    """Realized against predicted accepted drafts of one kind of sent drafts, older steps weighing
    less (half-life HALF_LIFE)."""

    accepted: float = 0.0  # accepted drafts
    predicted: float = 0.0  # accepted drafts the acceptance model predicted
    at: int = 0  # the step the sums are decayed to

    def age(self, now: int) -> _Ledger:
        if now != self.at:
            f = _DECAY ** (now - self.at)
            self.accepted *= f
            self.predicted *= f
            self.at = now
        return self

    def add(self, now: int, accepted: int, predicted: float) -> None:
        self.age(now)
        self.accepted += accepted
        self.predicted += predicted

    def carry_over(self, max_predicted: float) -> None:
        if self.predicted > max_predicted:
            f = max_predicted / self.predicted
            self.accepted *= f
            self.predicted = max_predicted


@dataclass
class _Pending:
    start: int  # index in the confirmed stream of the first token this draft guessed
    draft: Draft
    scored: int = 0  # leading tokens of the draft already recorded as held


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


def parting(draft: Draft, others: Sequence[Draft]) -> int:
    """How many of ``draft``'s tokens it may be sent for: all of them, unless it parts from a draft
    that follows a longer match; then only those before the first token where they differ.

    Why: two sources that read the same text can follow different copies of a short context, and
    the one with the longer match is the more specific reading; their records cannot tell which is
    right here. On the 1.5B's quote, after ``" shall mean"`` the lookup cache (a 4-token match,
    with the better record so far) offered another definition's words, the suffix tree (a 6-token
    match) and align the quoted one's: priced by records alone the lookup draft won and held 1 of 4.
    Over the 36 cached answers of ``auto_replay.py`` the cut moved the mean share of the hindsight
    oracle from 90.42% to 90.85% (load-time curves) and 85.60% to 86.34% (after-prompt curves).
    Each source's whole draft is still scored, so its record is what it would have earned."""
    n = len(draft.tokens)
    for other in others:
        if other.match_len > draft.match_len:
            common = min(n, len(other.tokens))
            for j in range(common):
                if other.tokens[j] != draft.tokens[j]:
                    n = j
                    break
    return n


class AutoDrafter:
    """``--speculate auto``: pick the source and draft length per step by measured tokens per second."""

    name = "auto"

    def __init__(self, sources: Sequence[DraftSource], rel_cost: Sequence[float], max_draft: int = 8,
                 model: AcceptanceModel | None = None, margin: float = 0.0,
                 plain_s: float | None = None) -> None:
        if not sources:
            raise ValueError("auto speculation needs at least one draft source")
        if len(rel_cost) < 2 or rel_cost[0] <= 0:
            raise ValueError("the relative cost curve needs the 1-token cost and at least one more")
        if plain_s is not None and not 0 < plain_s < float("inf"):  # also refuses nan
            raise ValueError(f"the curve's plain decode must be a positive number of seconds, "
                             f"got {plain_s!r}")
        self.sources = list(sources)
        self.rel_cost = [c / rel_cost[0] for c in rel_cost]
        self.max_draft = max_draft
        self.margin = margin
        # the curve's plain decode in seconds, where it was timed on this machine (None: its shape
        # alone is known, as for a curve given in relative units)
        self.plain_s = plain_s
        self.model = model or AcceptanceModel()
        self.calibration = Calibration()
        self.times = StepTimes(self.rel_cost)
        self._by_source: dict[str, _Ledger] = {}
        self._by_kind: dict[tuple[str, int], _Ledger] = {}  # (source, match bucket)
        self._idle = [0] * len(self.sources)  # asked steps since each source last won
        self._since_plain = 0
        self._step = 0
        self._last: bool | None = None  # whether the step awaiting feedback drafted
        self._stream: list[int] = []
        self._told = [0] * len(self.sources)  # tokens of the stream each source has been told
        self._pending: list[_Pending] = []
        # start of the step -> (source, match bucket, tokens sent; predicted accepted tokens; the forced
        # tokens sent after the source's draft)
        self._chosen: dict[int, tuple[tuple[str, int, int], float, tuple[int, ...]]] = {}

    def reset(self, prompt: Sequence[int]) -> None:
        """A new request: the sources restart; what was learned about time stays, and what was
        learned about acceptance carries over as a prior worth :data:`CARRY_TRIALS` observations."""
        if self._stream:
            self.model.carry_over(CARRY_TRIALS)
            for led in (*self._by_kind.values(), *self._by_source.values()):
                led.carry_over(CARRY_TRIALS)
        for i, s in enumerate(self.sources):
            self._tell(i)  # a source that records a request when the next one starts sees all of it
            s.reset(prompt)
        self._idle = [0] * len(self.sources)  # a new text: every source is asked again from its start
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
        """Score every pending proposal against the confirmed tokens: the acceptance model learns
        each drafted token as soon as it is confirmed (:meth:`AcceptanceModel.observe_span`), and a
        proposal leaves the pending list once decided, booking the outcome of a sent draft to the
        calibration and to its kind's and source's ratios."""
        n = len(self._stream)
        still: list[_Pending] = []
        for pend in self._pending:
            toks = pend.draft.tokens
            m = pend.scored
            while m < len(toks) and pend.start + m < n and toks[m] == self._stream[pend.start + m]:
                m += 1
            decided = m == len(toks) or pend.start + m < n
            missed = m < len(toks) and pend.start + m < n
            if m > pend.scored or missed:
                self.model.observe_span(pend.draft.source, pend.draft.match_len, pend.scored, m, missed)
                pend.scored = m
            if not decided:
                still.append(pend)
                continue
            chosen = self._chosen.get(pend.start)
            if chosen is not None and chosen[0][0] == pend.draft.source:
                del self._chosen[pend.start]
                key, predicted, ext = chosen
                accepted = min(m, key[2] - len(ext))
                if ext and accepted == len(toks):  # the source's draft held: then the forced tokens
                    at = pend.start + accepted
                    while accepted < key[2] and at < n and ext[accepted - len(toks)] == self._stream[at]:
                        accepted += 1
                        at += 1
                self.calibration.predicted += predicted
                self.calibration.realized += accepted
                # the realized/predicted ratios that correct the winner's curse (known from the
                # tokens alone, so they work without the loop's feedback too)
                for led in (self._by_kind.setdefault(key[:2], _Ledger(at=self._step)),
                            self._by_source.setdefault(key[0], _Ledger(at=self._step))):
                    led.add(self._step, accepted, predicted)
        self._pending = still

    # -- what a choice is worth -----------------------------------------------------------------
    def source_ratio(self, source: str) -> float:
        """Realized over predicted accepted drafts on the steps ``source`` was sent (1 before any),
        shrunk toward 1 by :data:`CALIBRATION_STRENGTH` tokens."""
        led = self._by_source.get(source)
        if led is None:
            return 1.0
        led.age(self._step)
        return (led.accepted + CALIBRATION_STRENGTH) / (led.predicted + CALIBRATION_STRENGTH)

    def plain_rate(self) -> float:
        """Tokens per second of a plain step (in plain-decode units before any feedback)."""
        return 1.0 / self.times.step(1)

    def choice_ratio(self, source: str, match_len: int) -> float:
        """Realized over predicted accepted drafts on the steps where this kind of choice (source,
        match bucket) was sent, shrunk toward its source's ratio: a kind the acceptance model
        overrates is scaled down by its own record, older steps weighing less. The same for every
        length, so the acceptance model alone decides how many tokens to send."""
        ratio = self.source_ratio(source)
        led = self._by_kind.get((source, match_bucket(match_len)))
        if led is None:
            return ratio
        led.age(self._step)
        return (led.accepted + CALIBRATION_STRENGTH * ratio) / (led.predicted + CALIBRATION_STRENGTH)

    def rate(self, source: str, match_len: int, k: int, expected: float | None = None,
             rho: float | None = None) -> float:
        """Expected confirmed tokens per second of sending ``k`` drafts of this source and match
        length: the accepted drafts the acceptance model predicts, scaled by what this kind of
        choice realized (``rho``, :meth:`choice_ratio`), plus the model's own token, over the
        measured seconds of a step of that width (drafting included). Tokens are judged per kind of
        choice and seconds per width, so a change of cost (drift) shows in every choice at once."""
        if expected is None:
            expected = self.model.expected(source, match_len, k)[k]
        if rho is None:
            rho = self.choice_ratio(source, match_len)
        return (1.0 + rho * (expected - 1.0)) / self.times.step(k + 1)

    def _plain_due(self, gain: float) -> bool:
        """Whether to decode plainly although a draft looks better: the plain baseline is what
        every choice is judged against, so it is measured again every :data:`PLAIN_EVERY` steps, at
        a step where the draft promises little, and early (:data:`MIN_PLAIN` steps) unless the
        verifies measured so far agree with the curve's own seconds (:meth:`curve_holds`). Those
        early probes cost a short answer dearly: on the 1.5B's 66-token quote, where every other
        step drafts, they took 2 of 15 steps and the ramp back to long drafts after them (live, two
        runs of 8 paired rounds each: 2.66x and 2.59x of plain with them, 2.90x and 2.96x without;
        on 12-token prose answers, where the probe replaces a draft that mostly fails, 1.16x with
        them and 1.12-1.13x without; copy_edit and prose at 256 tokens level)."""
        if not self.times.measured:  # no feedback (yet): nothing to measure the baseline for
            return False
        if self.times.count[0] >= MIN_PLAIN or self.curve_holds():
            due = self._since_plain - PLAIN_EVERY
        elif self.times.plain_is_aftermath:  # it would measure drafting's aftermath, not plain: later
            return False
        else:
            due = self._step - 1
        return due >= 0 and (gain < PROBE_GAIN or due >= PROBE_WAIT)

    def curve_holds(self) -> bool:
        """Whether the verifies measured so far read, through the curve's shape, as the plain decode
        the curve timed (within :data:`TRUST`): then the curve is right about this run, and its
        plain decode is believed until a plain step is due anyway (:data:`PLAIN_EVERY`)."""
        if self.plain_s is None:
            return False
        ratio = self.times.verify(1) / self.plain_s
        return 1.0 / TRUST <= ratio <= TRUST

    def _ask(self, i: int) -> bool:
        return self._idle[i] < IDLE_AFTER or (self._step + i) % PROBE_EVERY == 0

    def propose(self, k: int) -> Draft:
        return self._propose(k, (), None, None)

    def propose_forced(self, k: int, forced: Sequence[int], valid: Callable[[Sequence[int]], int],
                       after: Callable[[Sequence[int], int], Continuation] | None = None) -> Draft:
        """:meth:`propose` under a grammar (:mod:`promptlookup.drafting.forced`): ``forced`` are
        the tokens it forces next, priced as certain (acceptance 1, scaled only by what drafts of
        them realized: a forced token in the tokenizer's own tokenization is the masked choice
        unless the model picks another tokenization of the same bytes); a source's draft that
        begins with them is priced as certain up to there and by the acceptance model after. Every
        source's draft is first cut where ``valid`` says it leaves the grammar.

        ``after(draft, limit)``: the :class:`~promptlookup.drafting.forced.Continuation` of a draft,
        what the grammar forces once it is written and, where the grammar leaves a choice (JSON's
        optional whitespace leaves the quote before a property name to the model), the grammar
        layer's guess, each token with its chance of holding. The forced tokens and every source's
        whole draft are offered with each length of their continuation, priced by those chances
        once what comes before held: a guessed ``, "`` brings the property name and ``":`` the
        grammar then forces. The draft's :data:`FORCED` feature marks the forced positions."""
        return self._propose(k, tuple(int(t) for t in forced), valid, after)

    def _propose(self, k: int, forced: tuple[int, ...], valid: Callable[[Sequence[int]], int] | None,
                 after: Callable[[Sequence[int], int], Continuation] | None) -> Draft:
        start = len(self._stream)
        self._step += 1
        self._since_plain += 1
        cal = self.calibration
        cal.steps += 1
        plain = self.plain_rate() * (1.0 + self.margin)
        best: Draft | None = None
        best_i, best_k, best_rate, best_pred = -1, 0, plain, 0.0
        best_ext: tuple[int, ...] = ()  # the continuation sent after the best source's whole draft
        best_ext_forced = 0  # its forced positions
        depth = min(k, self.max_draft)
        f = min(len(forced), depth)
        cont = after(forced[:f], depth - f) if after is not None and f < depth else NOTHING
        if f or cont.tokens:  # the grammar's forced tokens (accepted by construction) and what follows
            g = Draft((*forced[:f], *cont.tokens), GRAMMAR, f,
                      {FORCED: float(cont.forced << f)} if cont.forced else {})
            self._pending.append(_Pending(start, g))
            rho = self.choice_ratio(GRAMMAR, f)
            pred, chance = 0.0, 1.0
            for kk in range(1, len(g.tokens) + 1):
                chance *= 1.0 if kk <= f else cont.p[kk - f - 1]
                pred += chance
                r = self.rate(GRAMMAR, f, kk, 1.0 + pred, rho)
                if r > best_rate + 1e-12:
                    best, best_i, best_k, best_rate, best_pred = g, -1, kk, r, pred
        drafts: list[tuple[int, Draft]] = []
        for i, source in enumerate(self.sources):
            if not self._ask(i):
                continue
            cal.asked += 1
            self._idle[i] += 1  # restarts below if this source wins
            self._tell(i)
            d = source.propose(self.max_draft)
            if d.tokens and valid is not None:
                n = valid(d.tokens)
                if n < len(d.tokens):  # cut where it leaves the grammar
                    d = Draft(d.tokens[:n], d.source, d.match_len, d.features)
            if d.tokens:
                self._pending.append(_Pending(start, d))  # scored in full, whatever is sent of it
                drafts.append((i, d))
        proposed = [d for _, d in drafts]
        for i, d in drafts:
            top = min(parting(d, proposed), depth)
            if not top:
                continue
            rho = self.choice_ratio(d.source, d.match_len)
            # certain up to ``lead`` (the forced tokens it begins with), modelled after
            lead = f if f and top > f and d.tokens[:f] == forced[:f] else 0
            e = self.model.expected(d.source, d.match_len, top - lead)
            for kk in range(lead + 1, top + 1):
                pred = lead + e[kk - lead] - 1.0
                r = self.rate(d.source, d.match_len, kk, 1.0 + pred, rho)
                if r > best_rate + 1e-12:
                    best, best_i, best_k, best_rate, best_pred, best_ext, best_ext_forced = (
                        d, i, kk, r, pred, (), 0)
            ext = (after(d.tokens, depth - top) if after is not None and top == len(d.tokens) < depth
                   else NOTHING)
            # the whole draft, then each length of its continuation, once the draft held
            chance = e[top - lead] - e[top - lead - 1]  # the chance that all of the draft holds
            pred = lead + e[top - lead] - 1.0
            for j in range(1, len(ext.tokens) + 1):
                chance *= ext.p[j - 1]
                pred += chance
                r = self.rate(d.source, d.match_len, top + j, 1.0 + pred, rho)
                if r > best_rate + 1e-12:
                    best, best_i, best_k, best_rate, best_pred = d, i, top + j, r, pred
                    best_ext, best_ext_forced = ext.tokens[:j], ext.forced & ((1 << j) - 1)
        if best_i >= 0:
            self._idle[best_i] = 0
        if best is not None and self._plain_due(best_rate / plain):
            best = None  # a plain step now and then keeps the baseline measured as the curve drifts
            cal.plain_probes += 1
        if best is None:
            self._last = False
            self._since_plain = 0
            return Draft(source=self.name)
        # One chosen draft per step; the pending entry of that source carries the outcome.
        self._chosen[start] = ((best.source, match_bucket(best.match_len), best_k), best_pred, best_ext)
        self._last = True
        cal.chosen_steps += 1
        cal.per_source[best.source] = cal.per_source.get(best.source, 0) + 1
        features = {**best.features, "expected_tokens": best_pred + 1.0, "rate": best_rate}
        if best_ext_forced:  # the forced ones of the appended positions (the grammar layer adds the
            # forced tokens it began with)
            features[FORCED] = float(best_ext_forced << (best_k - len(best_ext)))
        return Draft(tokens=(*best.tokens[:best_k - len(best_ext)], *best_ext), source=best.source,
                     match_len=best.match_len, features=features)

    def feedback(self, step: StepFeedback) -> None:
        """The step after :meth:`propose` took ``step.verify_s + step.draft_s`` seconds and confirmed
        ``step.confirmed`` tokens: the time model learns what that width costs now."""
        drafted, self._last = self._last, None
        if drafted is None:
            return
        self.times.observe(step.fed, step.verify_s, step.draft_s)
        if not drafted:
            self._since_plain = 0

    def report(self) -> dict[str, Any]:
        """What this drafter chose so far (see :func:`promptlookup.drafting.base.report_of`): steps,
        drafted steps per source, predicted against realized accepted tokens, plain probes, proposals
        asked, and ``summary``, the one line the CLI prints after a generation."""
        cal, t = self.calibration, self.times
        proposals = cal.steps * len(self.sources)
        used = ", ".join(f"{k} on {v}" for k, v in sorted(cal.per_source.items())) or "none"
        line = (f"auto: drafted on {cal.chosen_steps} of {cal.steps} steps ({used}); "
                f"predicted {cal.predicted:.1f} accepted tokens, realized {cal.realized} "
                f"(calibration {cal.ratio:.2f})")
        if t.measured:
            line += (f"; measured plain step {1000 * t.step(1):.2f} ms, drafting {1000 * t.overhead:.3f} ms "
                     f"a step, {cal.plain_probes} plain probes, {cal.asked} of {proposals} proposals asked")
        return {"steps": cal.steps, "drafted_steps": cal.chosen_steps, "per_source": dict(cal.per_source),
                "predicted": cal.predicted, "realized": cal.realized, "calibration": cal.ratio,
                "plain_probes": cal.plain_probes, "asked": cal.asked, "proposals": proposals,
                "summary": line}
