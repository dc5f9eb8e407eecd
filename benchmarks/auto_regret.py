"""Where ``auto``'s cost above its hindsight oracle goes, step by step, on the cached plain outputs
of ``benchmarks/auto_replay.py``.

Why: a share of the oracle says how far ``auto`` is from the ceiling, not where it loses. Each step
of a same-text replay of ``auto`` (from position ``i`` of the answer, a verify of ``w`` tokens that
confirmed ``a + 1``) is charged its **regret**: its own cost plus the oracle's least cost from where
it left, less the oracle's least cost from where it started (``OraclePlan.cost_to_go``). The regrets
of an answer add up exactly to ``auto``'s cost less the oracle's, so they can be summed by kind:

* **plain where the oracle drafted**: a plain step (a probe, or no draft looked worth it);
* **draft that failed**: fewer tokens held than were sent (wrong source, or sent too far);
* **too short**: every token sent held, and the oracle sent more from there;
* **other**: the rest (a length the oracle would not choose for the cost, ties).

    python benchmarks/auto_replay.py -m qwen2.5-coder-1.5b        # makes the cache (once)
    python benchmarks/auto_regret.py                               # every cached answer, load-time curves
    python benchmarks/auto_regret.py --curve after --item quote_doc --steps

Costs are in plain decodes, charged by the model's load-time curve (``own``, what ``auto`` starts
from) or by each item's curve timed after its prompt (``after``, as its live steps ran).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from auto_replay import CACHE  # noqa: E402

from promptlookup.costcurve import CostCurve  # noqa: E402
from promptlookup.drafting.base import MAX_DRAFT, Draft, DraftSource, StepFeedback  # noqa: E402
from promptlookup.drafting.spec import Run, SourceSpec, build_source  # noqa: E402
from promptlookup.measure.bench import oracle_sources  # noqa: E402
from promptlookup.measure.simulate import oracle_plan, simulate  # noqa: E402

KINDS = ("plain where the oracle drafted", "draft that failed", "too short", "other")


class Recorder:
    """A draft source that hands every call to ``inner`` and records, per proposal, the position
    of the last confirmed token, the draft and how many of its tokens the loop could send."""

    def __init__(self, inner: DraftSource) -> None:
        self.inner, self.name = inner, inner.name
        self.confirmed = 0
        self.proposals: list[tuple[int, Draft, int]] = []

    def reset(self, prompt: Sequence[int]) -> None:
        self.confirmed, self.proposals = 0, []
        self.inner.reset(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.confirmed += len(tokens)
        self.inner.extend(tokens)

    def propose(self, k: int) -> Draft:
        draft = self.inner.propose(k)
        self.proposals.append((self.confirmed - 1, draft, k))
        return draft

    def commit(self) -> None:
        self.inner.commit()

    def feedback(self, step: StepFeedback) -> None:
        self.inner.feedback(step)


@dataclass
class Step:
    at: int  # position of the last confirmed token before the step
    source: str
    sent: int
    held: int
    oracle_sent: int
    regret: float
    kind: str


@dataclass
class ItemRegret:
    name: str
    cost: float  # auto's, in plain decodes
    oracle_cost: float
    steps: list[Step] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.oracle_cost / self.cost if self.cost > 0 else 1.0

    def by_kind(self) -> dict[str, float]:
        out = dict.fromkeys(KINDS, 0.0)
        for s in self.steps:
            out[s.kind] += s.regret
        return out


def kind_of(sent: int, held: int, oracle_sent: int) -> str:
    if sent == 0:
        return KINDS[0] if oracle_sent > 0 else KINDS[3]
    if held < sent:
        return KINDS[1]
    return KINDS[2] if oracle_sent > sent else KINDS[3]


def regret_of(name: str, run: Run, curve: CostCurve, requests: Sequence[Sequence[int]],
              outputs: Sequence[Sequence[int]]) -> ItemRegret:
    """``auto``'s replay of the last request (after the earlier ones, committed, as
    :func:`promptlookup.measure.bench.replayed_speedup` runs it), step by step against the oracle's
    plan on it."""
    rec = Recorder(build_source(SourceSpec("auto"), run))
    for i, (prompt, text) in enumerate(zip(requests, outputs, strict=True)):
        sim = simulate(prompt, text, rec, MAX_DRAFT, curve)
        if i < len(requests) - 1:
            rec.commit()
    plan = oracle_plan(requests[-1], outputs[-1], oracle_sources(run, requests, outputs), MAX_DRAFT, curve)
    text, ctg = outputs[-1], plan.cost_to_go
    item = ItemRegret(name, sim.cost, ctg[0])
    at = 0
    # The loop asks for no draft where one token is left to write: those last steps are plain.
    steps = [*rec.proposals, *((None, Draft(source="plain"), 0) for _ in range(len(text)))]
    for asked_at, draft, k in steps:
        if at >= len(text) - 1:
            break
        if asked_at is not None and asked_at != at:
            raise AssertionError(f"{name}: a draft proposed at {asked_at}, the steps walked to {at}")
        sent = min(len(draft.tokens), k)
        held = 0
        while held < sent and draft.tokens[held] == text[at + 1 + held]:
            held += 1
        nxt = min(at + held + 1, len(text) - 1)
        regret = plan.rel[sent] + ctg[nxt] - ctg[at]
        item.steps.append(Step(at, draft.source if sent else "plain", sent, held, plan.choice[at], regret,
                               kind_of(sent, held, plan.choice[at])))
        at = nxt
    if abs(sum(st.regret for st in item.steps) - (item.cost - item.oracle_cost)) > 1e-6:
        raise AssertionError(f"{name}: the regrets do not add up to auto's cost less the oracle's")
    return item


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", nargs="+", help=f"replay cache files (default every file in {CACHE})")
    ap.add_argument("--curve", choices=("own", "after"), default="own",
                    help="charge by the load-time curve (own, default) or each item's after-prompt curve")
    ap.add_argument("--item", help="only items whose name contains this")
    ap.add_argument("--steps", action="store_true", help="print every step with regret")
    args = ap.parse_args()
    files = [Path(p) for p in args.cache] if args.cache else sorted(CACHE.glob("*.json"))
    if not files:
        raise SystemExit(f"auto_regret: no replay cache in {CACHE}: run benchmarks/auto_replay.py first")
    items: list[ItemRegret] = []
    print("| cache | item | auto (plain decodes) | oracle | share | " + " | ".join(KINDS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(KINDS))
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            own = CostCurve(tuple(data["curve"]))
            run = Run(data["n_vocab"], lambda: "replay", cost_curve=lambda c=own: c)
            entries = data["items"].items()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"auto_regret: {path}: not a replay cache ({exc})") from None
        for name, entry in entries:
            if args.item and args.item not in name:
                continue
            curve = own if args.curve == "own" else CostCurve(tuple(entry["curve_after"]))
            item = regret_of(name, run, curve, entry["requests"], entry["outputs"])
            items.append(item)
            kinds = item.by_kind()
            print(f"| {path.stem} | {name} | {item.cost:.2f} | {item.oracle_cost:.2f} | {item.share:.1%} | "
                  + " | ".join(f"{kinds[k]:.2f}" for k in KINDS) + " |")
            if args.steps:
                for s in item.steps:
                    if abs(s.regret) > 0.005:
                        print(f"    at {s.at:4d} {s.source:7s} sent {s.sent} held {s.held} | oracle sent "
                              f"{s.oracle_sent} | regret {s.regret:+.2f} {s.kind}")
    if not items:
        raise SystemExit("auto_regret: no item matched")
    total = sum(i.cost for i in items)
    sums = dict.fromkeys(KINDS, 0.0)
    for i in items:
        for k, v in i.by_kind().items():
            sums[k] += v
    mean = sum(i.share for i in items) / len(items)
    print(f"\n{len(items)} answers, {args.curve} curves: mean share {mean:.1%}; "
          "regret as a share of auto's cost: "
          + ", ".join(f"{k} {v / total:.1%}" for k, v in sums.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
