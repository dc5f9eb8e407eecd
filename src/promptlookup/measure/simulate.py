"""The cost simulation: a text run through the real loop, each step charged a cost curve's seconds,
to tell what speculation would buy on a backend with that curve.

The text itself stands in for the model (:class:`~promptlookup.backends.text.TextBackend` answers
every verify with the text's true next tokens), so a simulation runs the very same loop, sources and
controller as a real generation; each verify step is charged the curve's cost for its width.
Plain decoding of the same text costs one 1-token decode per token after the first. The curve is
also the simulation's clock: a source that learns from measured time (``auto``) is told the curve's
seconds for each step, and drafting is charged nothing, as in the oracle, so a simulation is
deterministic.

The **hindsight oracle** knows, at every position, how many tokens of the source's longest draft
the text would accept, and picks the draft length of every step to minimize total cost (a dynamic
program over positions, exact for a source whose proposal depends only on the text so far). Its
speedup is the ceiling for any controller drafting from that source on that text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from promptlookup.backends.text import TextBackend
from promptlookup.costcurve import CostCurve
from promptlookup.drafting.base import DraftSource
from promptlookup.speculate import generate


@dataclass
class SimResult:
    label: str
    tokens: int
    steps: int
    drafted_tokens: int
    accepted_tokens: int
    cost: float  # in units of one plain decode
    plain_cost: float

    @property
    def speedup(self) -> float:
        return self.plain_cost / self.cost if self.cost > 0 else 1.0


def simulate(prompt: Sequence[int], continuation: Sequence[int], source: DraftSource | None,
             draft: int, curve: CostCurve, label: str = "",
             told: Callable[[int], float] | None = None) -> SimResult:
    """Run the loop on the text with ``source`` and charge each verify step by ``curve``.

    ``told(width)``: the seconds the source is told each step took, where they should differ from
    what it is charged (a live run's clock is noisy: ``benchmarks/auto_replay.py --perturb``)."""
    stream = list(prompt) + list(continuation)
    backend = TextBackend(stream)
    gen = generate(backend, prompt, len(continuation), source=source, draft=draft,
                   verify_seconds=told or curve.cost)
    if gen.tokens != list(continuation):  # the loop must reproduce the text exactly
        raise AssertionError("simulation diverged from the text: the loop is not exact")
    unit = curve.cost(1)
    cost = sum(curve.cost(w) for w in backend.widths) / unit
    c = gen.counters
    return SimResult(label or c.source, len(continuation), c.decodes, c.drafted_tokens,
                     c.accepted_tokens, cost, float(max(len(continuation) - 1, 0)))


def acceptable_lengths(prompt: Sequence[int], continuation: Sequence[int], source: DraftSource,
                       max_draft: int) -> list[tuple[int, int]]:
    """For every step position q (index of the last confirmed token, from the prompt's end), the
    longest draft the source offers there and how many of its tokens the text accepts."""
    stream = list(prompt) + list(continuation)
    source.reset(prompt)
    out = []
    for q in range(len(prompt), len(stream)):
        source.extend([stream[q]])
        d = source.propose(max_draft).tokens
        a = 0
        while a < len(d) and q + 1 + a < len(stream) and d[a] == stream[q + 1 + a]:
            a += 1
        out.append((len(d), a))
    return out


@dataclass
class OraclePlan:
    """The hindsight oracle's dynamic program on one text, position by position (index ``i`` of
    the continuation's last confirmed token): the best offer there, the least cost from there to
    the end and the draft length that reaches it. Its cost-to-go is also the yardstick of a real
    controller's steps: a step from ``i`` that confirmed ``a`` tokens with a verify of width ``w``
    regrets ``rel[w - 1] + cost_to_go[i + a] - cost_to_go[i]`` (``benchmarks/auto_regret.py``)."""

    offers: list[tuple[int, int]]  # (tokens the best source offers, tokens of them the text accepts)
    cost_to_go: list[float]  # in plain decodes; 0 at the last position
    choice: list[int]  # draft length of the oracle's step from each position
    rel: list[float]  # verify cost by width (index width - 1), in plain decodes

    def steps(self) -> list[tuple[int, int, int]]:
        """The oracle's path: (position, draft length, accepted) of each of its steps."""
        path, i = [], 0
        while i < len(self.offers) - 1:
            k = self.choice[i]
            a = min(k, self.offers[i][1])
            path.append((i, k, a))
            i += a + 1
        return path


def oracle_plan(prompt: Sequence[int], continuation: Sequence[int],
                source: DraftSource | Sequence[DraftSource], max_draft: int, curve: CostCurve) -> OraclePlan:
    """The hindsight-optimal source and draft length at every position (see :class:`OraclePlan`)."""
    n = len(continuation)
    sources = [source] if isinstance(source, DraftSource) else list(source)
    per_source = [acceptable_lengths(prompt, continuation, s, max_draft) for s in sources]
    offers = [max(((min(o[i][0], max_draft), o[i][1]) for o in per_source), key=_offer_value)
              for i in range(n)]
    unit = curve.cost(1)
    rel = [curve.cost(w) / unit for w in range(1, max_draft + 2)]
    # i = index in the continuation of the last confirmed token; the run ends at i = n - 1.
    inf = float("inf")
    best = [inf] * n
    choice = [0] * n
    if n:
        best[n - 1] = 0.0
    for i in range(n - 2, -1, -1):
        offered, accepted = offers[i]
        top = min(offered, n - 2 - i)
        for k in range(top + 1):
            v = rel[k] + best[i + min(k, accepted) + 1]
            if v < best[i] - 1e-12:
                best[i], choice[i] = v, k
    return OraclePlan(offers, best, choice, rel)


def oracle(prompt: Sequence[int], continuation: Sequence[int], source: DraftSource | Sequence[DraftSource],
           max_draft: int, curve: CostCurve) -> SimResult:
    """The hindsight-optimal source and draft length at every step: the ceiling for any controller
    drafting from these sources."""
    n = len(continuation)
    if n == 0:
        return SimResult("oracle", 0, 0, 0, 0, 0.0, 0.0)
    plan = oracle_plan(prompt, continuation, source, max_draft, curve)
    path = plan.steps()
    return SimResult("oracle", n, len(path), sum(k for _, k, _ in path), sum(a for _, _, a in path),
                     plan.cost_to_go[0], float(n - 1))


def _offer_value(offer: tuple[int, int]) -> tuple[int, int]:
    # In hindsight the best source at a step is the one whose draft the text accepts furthest; among
    # equals the shorter offer, since the oracle never needs to send more than it accepts.
    return offer[1], -offer[0]


def sweep(prompt: Sequence[int], continuation: Sequence[int], make_source: Callable[[], DraftSource],
          curve: CostCurve, drafts: Sequence[int] = (1, 2, 3, 4, 8)) -> list[SimResult]:
    """Fixed draft lengths side by side on one text."""
    return [simulate(prompt, continuation, make_source(), k, curve, label=f"draft {k}") for k in drafts]


def _chunks(tokens: Sequence[int], n_ctx: int) -> list[list[int]]:
    """The lookup-stats replay's chunks (see :mod:`promptlookup.measure.replay`): whole chunks of
    n_ctx tokens."""
    toks = list(tokens)
    return [toks[i : i + n_ctx] for i in range(0, len(toks) - n_ctx, n_ctx)] or (
        [toks] if len(toks) >= 2 else [])


def _total(label: str, parts: Sequence[SimResult]) -> SimResult:
    return SimResult(label, sum(p.tokens for p in parts), sum(p.steps for p in parts),
                     sum(p.drafted_tokens for p in parts), sum(p.accepted_tokens for p in parts),
                     sum(p.cost for p in parts), sum(p.plain_cost for p in parts))


def simulate_text(tokens: Sequence[int], n_ctx: int, curve: CostCurve,
                  policies: dict[str, tuple[Callable[[], DraftSource], int]],
                  oracle_sources: Callable[[], Sequence[DraftSource]] | None = None,
                  max_draft: int = 8) -> list[SimResult]:
    """Every policy (label -> (source factory, draft length)) over the lookup-stats replay's chunks, plus the
    oracle over ``oracle_sources``. One source instance lives across chunks, as in that replay, and
    is committed after each: a source that learns across requests (the lookup caches, the suffix
    history) learns from earlier chunks."""
    chunks = _chunks(tokens, n_ctx)
    results = []
    for label, (factory, draft) in policies.items():
        source = factory()
        parts = []
        for chunk in chunks:
            parts.append(simulate(chunk[:1], chunk[1:], source, draft, curve, label))
            if source is not None:
                source.commit()
        results.append(_total(label, parts))
    if oracle_sources is not None:
        sources = list(oracle_sources())
        parts = []
        for chunk in chunks:
            parts.append(oracle(chunk[:1], chunk[1:], sources, max_draft, curve))
            for s in sources:
                s.commit()
        results.append(_total("oracle", parts))
    return results


def report_table(results: Sequence[SimResult], curve: CostCurve) -> str:
    from promptlookup.costcurve import describe

    lines = [f"cost curve ({curve.label or 'unnamed'}): {describe(curve)}",
             "| policy | steps | drafted | accepted | accept % | cost (plain decodes) | speedup |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        acc = f"{100 * r.accepted_tokens / r.drafted_tokens:.1f}%" if r.drafted_tokens else "-"
        lines.append(f"| {r.label} | {r.steps} | {r.drafted_tokens} | {r.accepted_tokens} | {acc} | "
                     f"{r.cost:.1f} | {r.speedup:.2f}x |")
    return "\n".join(lines)
