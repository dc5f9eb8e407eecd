"""The A/B harness: every cell back to back in one process on one loaded model.

Seed 000's tables are what make a speculation claim believable: the same workload run plainly and
speculated, in an alternating order, with ``off`` at least twice so its spread is the noise band,
and the effective rate (drafting included) beside acceptance, tokens per verify and coverage. Each
speculated cell also says whether its output is token-identical to the first plain run.

A cell is ``NAME[:key=value...]``: ``off``, ``ngram`` (``draft``, ``min``, ``max``), ``lookup``
(``draft``, ``static=FILE``, ``dynamic=FILE``), ``suffix`` (``draft``) and ``auto`` (``static=FILE``,
``curve=FILE``). Peers (:mod:`promptlookup.peers`) run the engines' own prompt lookup on the same ids:
``peer-llamacpp`` (``pred``: llama-cpp-python's num_pred_tokens, 0 = its plain loop) and ``peer-hf``
(``pld``: transformers' prompt_lookup_num_tokens, 0 = plain generate). A peer is compared with our
plain run when it is the bench backend's engine, else with its own 0 setting (``-`` until that ran).
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promptlookup.drafting.base import DraftSource
from promptlookup.telemetry import Counters

CELL_KEYS = {
    "off": set(),
    "ngram": {"draft", "min", "max"},
    "lookup": {"draft", "static", "dynamic"},
    "suffix": {"draft"},
    "auto": {"static", "curve", "margin", "sources"},
    "peer-llamacpp": {"pred"},
    "peer-hf": {"pld"},
}
# peer cell -> (peers.run_cell name, its setting key, the engine whose plain greedy it should equal)
PEERS = {"peer-llamacpp": ("llamacpp", "pred", "llama.cpp"), "peer-hf": ("hf", "pld", "transformers")}


class CellError(ValueError):
    """A cell specification that names an unknown source or setting."""


@dataclass(frozen=True)
class Cell:
    name: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return ":".join([self.name, *(f"{k}={v}" for k, v in self.options)])

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def int_option(self, key: str, default: int) -> int:
        v = self.get(key)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise CellError(f"cell {self.label}: {key} must be an integer, got {v!r}") from None


def parse_cell(spec: str) -> Cell:
    parts = [p for p in spec.strip().split(":") if p]
    if not parts:
        raise CellError("empty cell specification")
    name = parts[0]
    if name not in CELL_KEYS:
        raise CellError(f"unknown cell source {name!r} (known: {', '.join(CELL_KEYS)})")
    opts = []
    for p in parts[1:]:
        key, sep, value = p.partition("=")
        if not sep or key not in CELL_KEYS[name]:
            allowed = ", ".join(sorted(CELL_KEYS[name])) or "none"
            raise CellError(f"cell {spec!r}: unknown setting {p!r} (allowed for {name}: {allowed})")
        opts.append((key, value))
    return Cell(name, tuple(opts))


@dataclass
class CellRun:
    workload: str
    cell: Cell
    repeat: int
    counters: Counters
    identical: bool | None  # None: nothing to compare with (a peer on another engine)
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def make_source(cell: Cell, backend) -> tuple[DraftSource | None, int]:
    """The draft source and draft length a cell asks for, built fresh (no state across runs)."""
    from promptlookup.drafting.suffix import DEFAULT_MAX_MATCH, DEFAULT_MIN_MATCH, SuffixMatchSource
    from promptlookup.speculate import MAX_DRAFT

    if cell.name == "off":
        return None, 1
    if cell.name == "ngram":
        src = SuffixMatchSource(cell.int_option("min", DEFAULT_MIN_MATCH),
                                cell.int_option("max", DEFAULT_MAX_MATCH))
        return src, cell.int_option("draft", 3)
    from promptlookup.drafting.lookup import make_lookup_source

    if cell.name == "suffix":
        return _suffix_with_history(backend), cell.int_option("draft", 3)

    if cell.name == "lookup":
        return (make_lookup_source(cell.get("static"), cell.get("dynamic"), backend.n_vocab,
                                   backend.fingerprint), cell.int_option("draft", 3))
    # auto
    from promptlookup.costs import CostCurve, cached_cost_curve
    from promptlookup.drafting.controller import AutoDrafter, auto_sources

    curve = CostCurve.load(cell.get("curve")) if cell.get("curve") else cached_cost_curve(backend)
    extra = {"lookup": lambda: make_lookup_source(cell.get("static"), None, backend.n_vocab,
                                                  backend.fingerprint),
             "suffix": lambda: _suffix_with_history(backend)}
    names = cell.get("sources", "ngram+lookup+suffix").split("+")
    sources = auto_sources(*(extra[n]() for n in names if n in extra))
    return (AutoDrafter(sources, curve.relative(MAX_DRAFT + 1), max_draft=MAX_DRAFT,
                        margin=float(cell.get("margin", 0.0))), MAX_DRAFT)


def _suffix_with_history(backend) -> DraftSource:
    """``--suffix`` with an in-memory history, so a multi-request workload's later requests draft
    from the earlier ones (as a --suffix-history file would across processes)."""
    from promptlookup.drafting.history import History
    from promptlookup.drafting.suffix_source import SuffixSource

    return SuffixSource(history=History(), n_vocab=backend.n_vocab)


REQUEST_SEPARATOR = "=== next request ==="


def split_requests(text: str) -> list[str]:
    """A workload file holds one request, or several separated by a line of REQUEST_SEPARATOR: a
    session whose later requests can draft from earlier ones (the dynamic cache's and the suffix
    history's case). Each request is sent fresh; earlier answers are not in its prompt."""
    parts = [p.strip("\n") for p in text.split(f"\n{REQUEST_SEPARATOR}\n")]
    return [p for p in parts if p.strip()]


def oracle_speedup(backend, requests: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> float:
    """The hindsight oracle's speedup on the last request's output, from auto's sources (having
    seen the earlier requests) and the backend's curve: the ceiling any controller could reach on
    this run (simulated, see promptlookup.simulate)."""
    from promptlookup.costs import cached_cost_curve
    from promptlookup.drafting.controller import auto_sources
    from promptlookup.drafting.lookup import make_lookup_source
    from promptlookup.simulate import oracle
    from promptlookup.speculate import MAX_DRAFT

    sources = auto_sources(make_lookup_source(None, None, backend.n_vocab, backend.fingerprint),
                           _suffix_with_history(backend))
    for prompt, out in zip(requests[:-1], outputs[:-1], strict=True):
        for src in sources:
            src.reset([*prompt, *out])
            if hasattr(src, "commit"):
                src.commit()
    return oracle(requests[-1], outputs[-1], sources, MAX_DRAFT, cached_cost_curve(backend)).speedup


def run_bench(backend, workloads: dict[str, list[list[int]]], cells: Sequence[Cell], repeat: int,
              n_predict: int, progress: Callable[[str], None] | None = None,
              make_sampler: Callable[[], Any] | None = None) -> tuple[list[CellRun], dict[str, float]]:
    """Run every (workload, cell) ``repeat`` times, alternating cells within each round; also return
    each workload's oracle speedup on its first plain output.

    ``make_sampler`` gives each request a fresh sampler (same settings and seed for every cell, so a
    speculated cell's "identical" compares it with plain sampling at that seed); None is greedy.

    A workload is a list of requests run in order on one source (committed between requests);
    the reported counters and tokens are the last request's.
    """
    from promptlookup.speculate import generate

    runs: list[CellRun] = []
    oracles: dict[str, float] = {}
    engines: dict[str, Any] = {}  # peers' own loaded models, kept across cells
    total = len(workloads) * len(cells) * repeat
    done = 0
    for wname, requests in workloads.items():
        reference: list[list[int]] | None = None
        peer_refs: dict[str, list[int]] = {}
        for r in range(repeat):
            order = list(cells) if r % 2 == 0 else list(reversed(cells))
            for cell in order:
                done += 1
                if progress:
                    progress(f"[{done}/{total}] {wname} {cell.label} (round {r + 1})")
                if cell.name in PEERS:
                    runs.append(_peer_run(cell, backend, wname, requests[-1], n_predict, r + 1,
                                          reference[-1] if reference else None, peer_refs, engines))
                    continue
                source, draft = make_source(cell, backend)
                outputs = []
                t0 = time.perf_counter()
                for i, prompt in enumerate(requests):
                    gen = generate(backend, prompt, n_predict, source=source, draft=draft,
                                   sampler=make_sampler() if make_sampler else None)
                    outputs.append(gen.tokens)
                    if i < len(requests) - 1 and hasattr(source, "commit"):
                        source.commit()
                wall = time.perf_counter() - t0
                if cell.name == "off" and reference is None:
                    reference = outputs
                extra = {}
                cal = getattr(source, "calibration", None)
                if cal is not None:
                    extra = {"calibration": round(cal.ratio, 3), "auto_steps": cal.chosen_steps}
                runs.append(CellRun(wname, cell, r + 1, gen.counters,
                                    outputs[-1] == reference[-1] if reference is not None else True,
                                    wall, extra))
        if reference is not None:
            oracles[wname] = oracle_speedup(backend, requests, reference)
    return runs, oracles


def _peer_run(cell: Cell, backend, wname: str, prompt: list[int], n_predict: int, round_: int,
              reference: list[int] | None, peer_refs: dict[str, list[int]],
              engines: dict[str, Any]) -> CellRun:
    from promptlookup import peers

    peer, key, engine = PEERS[cell.name]
    setting = cell.int_option(key, 3)
    tokens, counters, wall = peers.run_cell(peer, setting, backend, prompt, n_predict, engines)
    if engine == getattr(backend, "name", ""):
        ref = reference
    else:
        if setting == 0:
            peer_refs.setdefault(engine, tokens)
        ref = peer_refs.get(engine)
    return CellRun(wname, cell, round_, counters, None if ref is None else tokens == ref, wall)


def table(runs: Sequence[CellRun]) -> str:
    head = ("| workload | cell | round | tok/s | effective | acceptance | tok/verify | drafted steps | "
            "decodes | majflt/token | identical to plain |")
    lines = [head, "|" + "---|" * 11]
    for r in runs:
        c = r.counters
        acc = f"{100 * c.acceptance:.1f}%" if c.drafted_tokens else "-"
        cov = f"{100 * c.coverage:.1f}%" if r.cell.name != "off" and r.cell.name not in PEERS else "-"
        lines.append(f"| {r.workload} | {r.cell.label} | {r.repeat} | {c.reported_tps:.2f} | "
                     f"**{c.effective_tps:.2f}** | {acc} | {c.tokens_per_decode:.2f} | {cov} | {c.decodes} | "
                     f"{c.major_faults_per_token:.2f} | {_yes_no(r.identical)} |")
    return "\n".join(lines)


def _yes_no(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def summary(runs: Sequence[CellRun], oracles: dict[str, float] | None = None) -> str:
    """Per workload: the off noise band, each cell's median effective rate against the off median,
    and that speedup as a share of the hindsight oracle's."""
    oracles = oracles or {}
    out = ["| workload | cell | median effective tok/s | vs off (median) | share of oracle | off band |",
           "|---|---|---|---|---|---|"]
    for w in dict.fromkeys(r.workload for r in runs):
        mine = [r for r in runs if r.workload == w]
        off = [r.counters.effective_tps for r in mine if r.cell.name == "off"]
        base = statistics.median(off) if off else 0.0
        band = f"{min(off):.2f}-{max(off):.2f}" if off else "-"
        orc = oracles.get(w)
        for label in dict.fromkeys(r.cell.label for r in mine):
            eff = statistics.median(r.counters.effective_tps for r in mine if r.cell.label == label)
            ratio = f"{eff / base:.2f}x" if base else "-"
            share = f"{100 * eff / base / orc:.0f}%" if base and orc else "-"
            out.append(f"| {w} | {label} | {eff:.2f} | {ratio} | {share} | {band} |")
        if orc:
            out.append(f"| {w} | oracle (hindsight, simulated on the plain output) | - | {orc:.2f}x | 100% | "
                       f"{band} |")
    return "\n".join(out)


def csv_text(runs: Sequence[CellRun]) -> str:
    buf = io.StringIO()
    rows = []
    for r in runs:
        rows.append({"workload": r.workload, "cell": r.cell.label, "round": r.repeat,
                     "identical": r.identical, "wall_s": round(r.wall_s, 4), **r.extra,
                     **r.counters.as_dict()})
    keys = list(dict.fromkeys(k for row in rows for k in row))
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def chart(runs: Sequence[CellRun], path: Path) -> None:
    """A PNG of effective tok/s per cell, with the off runs' band shaded, one panel per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in runs))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        mine = [r for r in runs if r.workload == w]
        labels = list(dict.fromkeys(r.cell.label for r in mine))
        off = [r.counters.effective_tps for r in mine if r.cell.name == "off"]
        if off:
            ax.axhspan(min(off), max(off), color="0.85", label="off band")
        for i, label in enumerate(labels):
            ys = [r.counters.effective_tps for r in mine if r.cell.label == label]
            ax.scatter([i] * len(ys), ys, zorder=3)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(w)
        ax.set_ylabel("effective tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
