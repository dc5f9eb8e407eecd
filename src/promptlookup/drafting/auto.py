"""Cost-aware speculation: draft only when the expected gain beats the measured cost of verifying.

Seed 000's lesson was that a drafting step which is not accepted often enough costs more than the
plain decode it replaced, and that tightening a fixed gate converges on "off". So instead of a
fixed draft length, :class:`AutoDrafter` decides per step, from two measured things:

* the **verify cost curve** ``rel[n]`` (cost of a verify feeding ``n + 1`` tokens, relative to a
  plain decode), measured on the loaded backend; and
* an **acceptance model**: the probability that drafted token ``i`` is accepted given that the ones
  before it were, per (source, match-length bucket, position), learned online.

For a draft whose conditional acceptances are ``p_1..p_L``, feeding ``k`` of them confirms on
average ``E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j`` tokens at cost ``rel[k]``; the drafter picks the
source and ``k`` (0 = plain decode) with the most expected tokens per unit of cost.

Learning needs no exploration: the loop's output does not depend on what was drafted, so every
proposal (also the ones not sent to the model) is scored against the tokens that actually follow,
once they are known. Every step thus teaches the model about every source at every depth.

It is itself a :class:`~promptlookup.drafting.base.DraftSource` (named ``auto``) wrapping the real
sources, so the speculative loop needs no special case for it.
"""

from __future__ import annotations

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


def match_bucket(match_len: int) -> int:
    b = 0
    for i, lo in enumerate(MATCH_BUCKETS):
        if match_len >= lo:
            b = i
    return b


@dataclass
class _Beta:
    hits: float = 0.0
    trials: float = 0.0


class AcceptanceModel:
    """P(drafted token i accepted | tokens before it accepted), per (source, bucket, position).

    Estimates shrink toward a pooled per-(source, bucket) rate, which shrinks toward a global
    prior, so a bucket seen twice is not trusted like one seen a thousand times.
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

    def _pooled(self, source: str, bucket: int) -> float:
        pool = self._pools.get((source, bucket), _Beta())
        prior = self.prior_mean[bucket]
        return (pool.hits + prior * self.prior_strength) / (pool.trials + self.prior_strength)

    def p(self, source: str, match_len: int, position: int) -> float:
        """Conditional acceptance of the token at ``position`` (0-based) of a draft."""
        bucket = match_bucket(match_len)
        base = self._pooled(source, bucket)
        cell = self._cells.get((source, bucket, min(position, MAX_POSITIONS - 1)), _Beta())
        return (cell.hits + base * self.pool_strength) / (cell.trials + self.pool_strength)

    def observe(self, source: str, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """Record a resolved draft: positions 0..n_accepted were tried, the first n_accepted held."""
        bucket = match_bucket(match_len)
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

    @property
    def ratio(self) -> float:
        return self.realized / self.predicted if self.predicted > 0 else 0.0


class AutoDrafter:
    """``--speculate auto``: pick the source and draft length per step from cost and acceptance."""

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
        self._stream: list[int] = []
        self._pending: list[_Pending] = []
        # start of the step -> (source drafted from, tokens sent, predicted accepted tokens)
        self._chosen: dict[int, tuple[str, int, float]] = {}

    def reset(self, prompt: Sequence[int]) -> None:
        for s in self.sources:
            s.reset(prompt)
        self._stream = []
        self._pending = []
        self._chosen = {}

    def commit(self) -> None:
        """End of a request: sources that learn across requests (lookup's dynamic cache) keep it."""
        for s in self.sources:
            s.commit()

    def feedback(self, step: StepFeedback) -> None:
        """Not used yet: the choice rests on the curve and the acceptance model."""

    def extend(self, tokens: Sequence[int]) -> None:
        for s in self.sources:
            s.extend(tokens)
        self._stream.extend(int(t) for t in tokens)
        self._resolve()

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
            if chosen is not None and chosen[0] == pend.draft.source:
                del self._chosen[pend.start]
                self.calibration.predicted += chosen[2]
                self.calibration.realized += min(m, chosen[1])
        self._pending = still

    def propose(self, k: int) -> Draft:
        start = len(self._stream)
        self.calibration.steps += 1
        best: Draft | None = None
        best_k, best_rate = 0, (1.0 + self.margin) / self.rel_cost[0]
        best_pred = 0.0
        depth = min(k, self.max_draft)
        for source in self.sources:
            d = source.propose(self.max_draft)
            if not d.tokens:
                continue
            self._pending.append(_Pending(start, d))
            p = [self.model.p(d.source, d.match_len, i) for i in range(min(len(d.tokens), depth))]
            kk, rate = best_length(p, self.rel_cost)
            if kk > 0 and rate > best_rate + 1e-12:
                best, best_k, best_rate = d, kk, rate
                best_pred = expected_tokens(p)[kk] - 1.0
        if best is None or best_k == 0:
            return Draft(source=self.name)
        # One chosen draft per step; the pending entry of that source carries the outcome.
        self._chosen[start] = (best.source, best_k, best_pred)
        self.calibration.chosen_steps += 1
        self.calibration.per_source[best.source] = self.calibration.per_source.get(best.source, 0) + 1
        return Draft(tokens=best.tokens[:best_k], source=best.source, match_len=best.match_len,
                     features={**best.features, "expected_tokens": best_pred + 1.0, "rate": best_rate})


def auto_sources(*extra: DraftSource | None) -> list[DraftSource]:
    """The sources ``auto`` weighs: the suffix matcher, ungated, plus any others the run has."""
    from promptlookup.drafting.ngram.source import SuffixMatchSource

    return [SuffixMatchSource(min_match=1, max_match=AUTO_MAX_MATCH), *(s for s in extra if s is not None)]


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
    curve = CostCurve.load(spec.value("curve")) if spec.value("curve") else run.cost_curve()
    rel, margin = curve.relative(MAX_DRAFT + 1), spec.value("margin")
    return lambda: AutoDrafter(auto_sources(*(m() for m in makers)), rel, max_draft=MAX_DRAFT, margin=margin)


def save(spec: SourceSpec, source: AutoDrafter) -> None:
    """End of a run (after commit): every weighed source saves what it learned."""
    for s, src in zip(weighed_specs(spec), source.sources[1:], strict=True):
        save_state(s, src)
