"""The A/B harness: every cell back to back in one process on one loaded model.

Tables like these are what make a speculation claim believable: the same workload run plainly and
speculated, in an alternating order, with ``off`` at least twice so its spread is the noise band,
and the effective rate (drafting included) beside acceptance, tokens per verify and coverage. Each
speculated cell also says whether its output is token-identical to the first plain run.

A cell is a draft source spec (``off``, ``ngram:draft=1:min=5``, ``lookup:static=FILE``, ``suffix``,
``auto:curve=FILE``...; each source declares its settings, see :mod:`promptlookup.drafting.spec`).
Peers (:mod:`promptlookup.measure.peers`) run the engines' own prompt lookup on the same ids:
``peer-llamacpp`` (``pred``: llama-cpp-python's num_pred_tokens, 0 = its plain loop), ``peer-hf``
(``pld``: transformers' prompt_lookup_num_tokens, 0 = plain generate) and ``peer-ls`` (``spec``:
llama.cpp's ``llama-server`` on the same file, 0 plain, 1 with its ``--spec-default`` speculation;
:mod:`promptlookup.measure.llama_server_peer`). A peer is compared with our
plain run when it is the bench backend's engine, else with its own 0 setting (``-`` until that ran).

A speed claim is a **paired ratio**: each round's cell against that round's ``off`` (the two ran
minutes apart, under the same load and heat), summarized as the geometric mean over rounds with a
seeded bootstrap confidence interval over rounds (:func:`bootstrap_ci`). A ratio whose interval
includes 1.0 is not a measured difference. Every run's row can be written as soon as the run
finishes (:class:`CsvRows`), so an interrupted bench keeps what it measured.

On llama.cpp a batched verify can round differently from one-token decodes, so a speculated cell's
text may part from the plain text after some tokens (the "identical" column), and two cells then
time two different texts: one text can be easier to copy than another. The summary therefore also
gives each cell's **same-text replay** (:func:`replayed_speedups`): its speedup in the cost
simulation (:mod:`promptlookup.measure.simulate`) on the plain output, the comparison of sources
that no text luck moves. The oracle and the replays are charged by verify costs timed on the loaded
model after the workload's prompt and half its answer (:func:`measure_cost_curve_after`), where its
steps ran, not by the load-time curve timed after 128 tokens; timed once after every round and the
median kept (:func:`~promptlookup.costcurve.median_curve`), since one timing on a shared machine moves
the oracle by several percent.
"""

from __future__ import annotations

import csv
import io
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from promptlookup.backends.base import Model, common_prefix
from promptlookup.backends.costs import cached_cost_curve, measure_cost_curve_after
from promptlookup.costcurve import CostCurve, describe, median_curve
from promptlookup.drafting.base import DraftSource, report_of
from promptlookup.drafting.spec import OFF, SOURCES, Run, SourceSpec, SpecError, build_source
from promptlookup.errors import UsageError
from promptlookup.telemetry import Counters

if TYPE_CHECKING:
    from promptlookup.measure.simulate import SimResult

# peer cell -> its settings (draft sources' settings are declared by the sources, see drafting/spec.py)
PEER_KEYS = {"peer-llamacpp": {"pred"}, "peer-hf": {"pld"}, "peer-ls": {"spec"}}
# peer cell -> (peers.run_cell name, its setting key, the engine whose plain greedy it should equal)
PEERS = {"peer-llamacpp": ("llamacpp", "pred", "llama.cpp"), "peer-hf": ("hf", "pld", "transformers"),
         "peer-ls": ("llama-server", "spec", "llama-server")}


class CellError(SpecError):
    """A cell specification that names an unknown source or setting."""


@dataclass(frozen=True)
class Cell(SourceSpec):
    """A bench cell: a draft source spec (``ngram:draft=1:min=5``), or a peer engine's own lookup."""


# peer settings and their bounds, checked when a cell is parsed (a source's are declared by the source)
PEER_RANGES = {"pred": (0, 64), "pld": (0, 64), "spec": (0, 1)}


def parse_cell(spec: str) -> Cell:
    parts = [p for p in spec.strip().split(":") if p]
    if not parts:
        raise CellError("empty cell specification")
    name = parts[0]
    if name not in PEER_KEYS and name != OFF and name not in SOURCES:
        known = ", ".join([OFF, *SOURCES, *PEER_KEYS])
        raise CellError(f"unknown cell source {name!r} (known: {known})")
    if name not in PEER_KEYS:
        try:
            src = SourceSpec.parse(spec)
        except SpecError as exc:
            raise CellError(f"cell {exc}") from None
        return Cell(src.name, src.options)
    opts = []
    for p in parts[1:]:
        key, sep, value = p.partition("=")
        if not sep or key not in PEER_KEYS[name]:
            allowed = ", ".join(sorted(PEER_KEYS[name]))
            raise CellError(f"cell {spec!r}: unknown setting {p!r} (allowed for {name}: {allowed})")
        opts.append((key, value))
    cell = Cell(name, tuple(opts))
    for key in PEER_KEYS[name]:
        lo, hi = PEER_RANGES[key]
        v = cell.int_option(key, lo)
        if not lo <= v <= hi:
            raise CellError(f"cell {cell.label}: {key} must be {lo}..{hi}, got {v}")
    return cell


def check_cells(cells: Sequence[Cell], backend: Model) -> None:
    """Build every cell's source once before any cell runs, so a bad file in the last cell fails
    at once (a peer's settings are checked by :func:`parse_cell`; its engine loads when it runs)."""
    for cell in cells:
        if cell.name not in PEERS:
            make_source(cell, backend)


@dataclass
class CellRun:
    workload: str
    cell: Cell
    repeat: int
    counters: Counters
    identical: bool | None  # None: nothing to compare with (a peer on another engine)
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def backend_run(backend: Model) -> Run:
    """The run sources are built from on a loaded backend: its curve measured once and cached."""
    return Run.for_backend(backend, lambda: cached_cost_curve(backend))


def make_source(cell: Cell, backend: Model) -> tuple[DraftSource | None, int]:
    """The draft source and draft length a cell asks for, built fresh (no state across runs); a
    ``suffix`` source keeps an in-memory history, so a multi-request workload's later requests draft
    from the earlier ones (as a --suffix-history file would across processes)."""
    source = build_source(cell, backend_run(backend))
    return source, cell.draft if source is not None else 1


REQUEST_SEPARATOR = "=== next request ==="


def split_requests(text: str) -> list[str]:
    """A workload file holds one request, or several separated by a line of REQUEST_SEPARATOR: a
    session whose later requests can draft from earlier ones (the dynamic cache's and the suffix
    history's case). Each request is sent fresh; earlier answers are not in its prompt."""
    parts = [p.strip("\n") for p in text.split(f"\n{REQUEST_SEPARATOR}\n")]
    return [p for p in parts if p.strip()]


def steps_context(requests: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> list[int]:
    """Where a workload's steps ran, on average: its last prompt and the first half of that answer
    (the context the oracle's verify costs are timed after, :func:`measure_cost_curve_after`)."""
    answer = outputs[-1]
    return [*requests[-1], *answer[:len(answer) // 2]]


def oracle_on(run: Run, curve: CostCurve, requests: Sequence[Sequence[int]],
              outputs: Sequence[Sequence[int]]) -> SimResult:
    """The hindsight oracle on the last request's output, from ``auto``'s sources (having seen the
    earlier requests), charged by ``curve``: the ceiling any controller could reach on this run
    (simulated, see :mod:`promptlookup.measure.simulate`)."""
    from promptlookup.drafting.base import MAX_DRAFT
    from promptlookup.measure.simulate import oracle

    return oracle(requests[-1], outputs[-1], oracle_sources(run, requests, outputs), MAX_DRAFT, curve)


def oracle_sources(run: Run, requests: Sequence[Sequence[int]],
                   outputs: Sequence[Sequence[int]]) -> list[DraftSource]:
    """``auto``'s sources, fresh, having seen every request but the last with its answer (committed
    as a session would): what the oracle of :func:`oracle_on` drafts from."""
    sources = build_source(SourceSpec("auto"), run).sources
    for prompt, out in zip(requests[:-1], outputs[:-1], strict=True):
        for src in sources:
            src.reset([*prompt, *out])
            src.commit()
    return sources


REPLAY_PERTURB = 8  # perturbed replays (:func:`perturbed_speedup`) behind auto's same-text replay
PERTURB_SCALE = (0.9, 1.35)  # the machine's speed at replay time over the load-time curve's, drawn once
PERTURB_NOISE = 0.05  # log-normal spread of each step's told time


def replayed_speedups(run: Run, curve: CostCurve, requests: Sequence[Sequence[int]],
                      outputs: Sequence[Sequence[int]], cells: Sequence[Cell]) -> dict[str, float]:
    """Each speculated cell's speedup on the last request, simulated on the plain ``outputs`` and
    charged by ``curve`` (:mod:`promptlookup.measure.simulate`): every source drafts the same
    text, so the figures compare sources where a real run's texts may differ. A fresh source per
    cell, run over the earlier requests first as in the real run (committed between requests).
    ``auto``, which steers by the step times it measures, gets the mean of :data:`REPLAY_PERTURB`
    replays told a live run's clock (:func:`perturbed_speedup`): one replay is chaotic."""
    out: dict[str, float] = {}
    for cell in cells:
        if cell.name == OFF or cell.name in PEERS or cell.label in out:
            continue
        if cell.name == "auto":
            out[cell.label] = statistics.mean(perturbed_speedup(cell, run, curve, requests, outputs, seed)
                                              for seed in range(REPLAY_PERTURB))
        else:
            out[cell.label] = replayed_speedup(cell, run, curve, requests, outputs)
    return out


def replayed_speedup(spec: SourceSpec, run: Run, curve: CostCurve, requests: Sequence[Sequence[int]],
                     outputs: Sequence[Sequence[int]], told: Callable[[int], float] | None = None) -> float:
    """One source spec's same-text replay on the last request (see :func:`replayed_speedups`), from
    what a run has (no backend): a fresh source, run over the earlier requests first. ``told``: the
    seconds the source is told each step took (default: what ``curve`` charges)."""
    source = build_source(spec, run)
    return replayed_source(source, spec.draft if source is not None else 1, curve, requests, outputs, told)


def replayed_source(source: DraftSource | None, draft: int, curve: CostCurve,
                    requests: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                    told: Callable[[int], float] | None = None) -> float:
    """:func:`replayed_speedup` of a source already built (``None``: plain decoding), which keeps
    what it learned over the replay."""
    from promptlookup.measure.simulate import simulate

    speedup = 1.0
    for i, (prompt, text) in enumerate(zip(requests, outputs, strict=True)):
        speedup = simulate(prompt, text, source, draft, curve, told=told).speedup
        if i < len(requests) - 1 and source is not None:
            source.commit()
    return speedup


def perturbed_speedup(spec: SourceSpec, run: Run, curve: CostCurve, requests: Sequence[Sequence[int]],
                      outputs: Sequence[Sequence[int]], seed: int) -> float:
    """A same-text replay (:func:`replayed_speedup`) in which the source is told each step's seconds
    as a live run might measure them: ``curve`` scaled so that its plain decode reads a factor drawn
    from :data:`PERTURB_SCALE` times the run's load-time curve's (what ``auto`` starts from: a live
    run finds the machine faster or slower than when that was timed), and each step by log-normal
    noise (:data:`PERTURB_NOISE`); charged by ``curve`` itself. Deterministic for a seed.

    Why: a replay is chaotic. On the 1.5B's copy_edit, one early plain probe (the steps read more
    than 1.25x slower than the load-time curve) moved every later step and the replay from 84.2% of
    the oracle to 77.5%, with the controller's time estimates at the end within 0.02 decodes of each
    other; a mean over such replays is what a change to the controller is judged on."""
    return replayed_speedup(spec, run, curve, requests, outputs, perturbed_clock(run, curve, seed))


def perturbed_clock(run: Run, curve: CostCurve, seed: int) -> Callable[[int], float]:
    """The step seconds :func:`perturbed_speedup` tells its source, by verify width (one draw of
    the machine's speed, then each step's noise): deterministic for a seed."""
    rng = random.Random(seed)
    scale = rng.uniform(*PERTURB_SCALE) * run.curve().cost(1) / curve.cost(1)

    def told(width: int) -> float:
        return curve.cost(width) * scale * math.exp(rng.gauss(0.0, PERTURB_NOISE))

    return told


def workload_files(paths: Sequence[str | Path], every: int = 1) -> list[Path]:
    """The prompt files ``paths`` name: a file as it is, a directory's ``*.txt`` sorted (every
    ``every``-th of them). A path that is neither, or no file at all, is a :class:`UsageError`."""
    files: list[Path] = []
    for w in paths:
        p = Path(w)
        if p.is_dir():
            files.extend(sorted(p.glob("*.txt"))[::every])
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"workload not found: {p}")
    if not files:
        raise UsageError("no workload prompts found (give -w FILE or a directory of *.txt)")
    return files


def run_bench(backend: Model, workloads: dict[str, list[list[int]]], cells: Sequence[Cell], repeat: int,
              n_predict: int, progress: Callable[[str], None] | None = None,
              make_sampler: Callable[[], Any] | None = None,
              on_run: Callable[[CellRun], None] | None = None,
              replays: dict[tuple[str, str], float] | None = None,
              reuse_prompt: bool = False,
              llama_server: str | Path | None = None) -> tuple[list[CellRun], dict[str, float]]:
    """Run every (workload, cell) ``repeat`` times, alternating cells within each round; also return
    each workload's oracle speedup on its first plain output (charged by verify costs timed after
    the workload's prompt and half that output, see :func:`measure_cost_curve_after`, once after each
    round: the median of those timings). ``on_run`` is called with each run as soon as it finishes
    (the CSV writes its row there). ``replays``, when
    given, is filled with each (workload, cell label)'s same-text replay (:func:`replayed_speedups`;
    under sampling too: a position's random number depends only on the seed and the position, so a
    draft is accepted exactly where it equals the plain sampled text).

    ``make_sampler`` gives each request a fresh sampler (same settings and seed for every cell, so a
    speculated cell's "identical" compares it with plain sampling at that seed); None is greedy.

    A workload is a list of requests run in order on one source (committed between requests);
    the reported counters and tokens are the last request's.

    ``reuse_prompt`` keeps what the cache already holds of each prompt (the previous run's, as a
    server keeps a slot's prefix), so only the first run of an item pays its prefill: on long
    prompts (a file to edit, a paper) that is most of a bench's wall time. The rates reported
    exclude prefill either way; the outputs are the same on a batch-invariant build, where a token's
    logits do not depend on how many tokens its forward held (the "identical" column checks it).

    ``llama_server`` is the program the ``peer-ls`` cells start.
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
        timings: list[CostCurve] = []
        for r in range(repeat):
            order = list(cells) if r % 2 == 0 else list(reversed(cells))
            for cell in order:
                done += 1
                if progress:
                    progress(f"[{done}/{total}] {wname} {cell.label} (round {r + 1})")
                if cell.name in PEERS:
                    runs.append(_peer_run(cell, backend, wname, requests, n_predict, r + 1,
                                          reference[-1] if reference else None, peer_refs, engines,
                                          llama_server))
                    if on_run:
                        on_run(runs[-1])
                    continue
                source, draft = make_source(cell, backend)
                outputs = []
                t0 = time.perf_counter()
                for i, prompt in enumerate(requests):
                    keep = common_prefix(backend.tokens, prompt) if reuse_prompt else 0
                    gen = generate(backend, prompt, n_predict, source=source, draft=draft,
                                   sampler=make_sampler() if make_sampler else None, keep=keep)
                    outputs.append(gen.tokens)
                    if i < len(requests) - 1 and source is not None:
                        source.commit()
                wall = time.perf_counter() - t0
                if cell.name == "off" and reference is None:
                    reference = outputs
                extra = {}
                report = report_of(source)
                if report is not None:
                    extra = {"calibration": round(report["calibration"], 3),
                             "auto_steps": report["drafted_steps"], "plain_probes": report["plain_probes"],
                             "asked": report["asked"]}
                runs.append(CellRun(wname, cell, r + 1, gen.counters,
                                    outputs[-1] == reference[-1] if reference is not None else True,
                                    wall, extra))
                if on_run:
                    on_run(runs[-1])
            if reference is not None:
                # charged as this workload's steps were: verifies timed after its prompt and half its
                # answer, once after every round, the median kept (:func:`median_curve`)
                if progress:  # some seconds on a 1.5B
                    progress(f"{wname}: timing the verify costs after round {r + 1} (for the oracle)")
                timings.append(measure_cost_curve_after(backend, steps_context(requests, reference)))
        if timings and reference is not None:
            curve = median_curve(timings, timings[0].label + (
                f", the median of {len(timings)} timings (one after each round)" if len(timings) > 1 else ""))
            if progress:
                progress(f"{wname}: oracle charged by the verify costs {curve.label} "
                         f"({describe(curve)})")
            run = backend_run(backend)
            oracles[wname] = oracle_on(run, curve, requests, reference).speedup
            if replays is not None:
                for label, x in replayed_speedups(run, curve, requests, reference, cells).items():
                    replays[(wname, label)] = x
    return runs, oracles


def _peer_run(cell: Cell, backend: Model, wname: str, requests: list[list[int]], n_predict: int, round_: int,
              reference: list[int] | None, peer_refs: dict[str, list[int]],
              engines: dict[str, Any], llama_server: str | Path | None) -> CellRun:
    from promptlookup.measure import peers

    peer, key, engine = PEERS[cell.name]
    setting = cell.int_option(key, 3)
    tokens, counters, wall = peers.run_cell(peer, setting, backend, requests[-1], n_predict, engines,
                                            earlier=requests[:-1], llama_server=llama_server)
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


BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20261201  # fixed: the same runs always print the same interval


def paired_ratios(runs: Sequence[CellRun], workload: str, label: str) -> list[float]:
    """Each round's effective rate of cell ``label`` over that round's ``off`` run, in round
    order; a round without both (an interrupted bench) is left out."""
    off = {r.repeat: r.counters.effective_tps for r in runs
           if r.workload == workload and r.cell.name == OFF}
    out = []
    for r in runs:
        if r.workload == workload and r.cell.label == label and off.get(r.repeat, 0.0) > 0:
            out.append(r.counters.effective_tps / off[r.repeat])
    return out


def geomean(values: Sequence[float]) -> float:
    """The geometric mean: the right average of ratios (1.25x and 0.8x average to 1.0x)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def bootstrap_ci(ratios: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean of ``ratios`` (rounds resampled with
    replacement), seeded so a table is reproducible. With one ratio the interval is that ratio:
    one round cannot say how much a ratio moves, so the bench asks for more rounds."""
    r = np.asarray(ratios, dtype=np.float64)
    if r.size == 0 or not np.all((r > 0) & np.isfinite(r)):
        raise ValueError("bootstrap needs at least one positive, finite ratio")
    x = np.log(r)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    means = np.exp(x[idx].mean(axis=1))
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_ci_reference(ratios: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                           seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """:func:`bootstrap_ci` one resample at a time in plain Python (its twin in the tests): the same
    generator draws, row by row, and numpy's default (linear) quantile written out."""
    logs = [math.log(v) for v in ratios]
    n = len(logs)
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(resamples):
        row = rng.integers(0, n, size=n)
        means.append(math.exp(sum(logs[int(i)] for i in row) / n))
    means.sort()

    def quantile(q: float) -> float:
        h = (len(means) - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (h - lo) * (means[hi] - means[lo])

    return quantile((1 - level) / 2), quantile((1 + level) / 2)


def summary(runs: Sequence[CellRun], oracles: dict[str, float] | None = None,
            replays: dict[tuple[str, str], float] | None = None) -> str:
    """Per workload: the off noise band, each cell's median effective rate, its paired ratio to
    off (geometric mean over rounds, with its 95% bootstrap interval), and that ratio as a share of
    the hindsight oracle's speedup; with ``replays``, also each cell's same-text replay and its
    share of the oracle (both simulated on the plain output, so that share is like for like)."""
    oracles = oracles or {}
    head = ("| workload | cell | median effective tok/s | vs off (median) | paired vs off | "
            "95% CI (rounds) | share of oracle | off band |")
    if replays:
        head += f" same-text replay (share of oracle; auto's the mean of {REPLAY_PERTURB} perturbed) |"
    out = [head, "|" + "---|" * head.count(" |")]
    for w in dict.fromkeys(r.workload for r in runs):
        mine = [r for r in runs if r.workload == w]
        off = [r.counters.effective_tps for r in mine if r.cell.name == OFF]
        base = statistics.median(off) if off else 0.0
        band = f"{min(off):.2f}-{max(off):.2f}" if off else "-"
        orc = oracles.get(w)
        for label in dict.fromkeys(r.cell.label for r in mine):
            eff = statistics.median(r.counters.effective_tps for r in mine if r.cell.label == label)
            ratio = f"{eff / base:.2f}x" if base else "-"
            pairs = [x for x in paired_ratios(runs, w, label) if x > 0]
            paired = geomean(pairs) if pairs else None
            if paired is None:
                cell_paired = ci = "-"
            else:
                lo, hi = bootstrap_ci(pairs)
                cell_paired = f"{paired:.3f}x"
                ci = f"{lo:.3f}-{hi:.3f} (n={len(pairs)})"
            share = f"{100 * paired / orc:.0f}%" if paired is not None and orc else "-"
            row = f"| {w} | {label} | {eff:.2f} | {ratio} | {cell_paired} | {ci} | {share} | {band} |"
            if replays:
                rep = replays.get((w, label))
                row += " - |" if rep is None else (f" {rep:.3f}x ({100 * rep / orc:.0f}%) |" if orc
                                                    else f" {rep:.3f}x |")
            out.append(row)
        if orc:
            row = (f"| {w} | oracle (hindsight, simulated on the plain output) | - | {orc:.2f}x | - | "
                   f"- | 100% | {band} |")
            out.append(row + (f" {orc:.3f}x (100%) |" if replays else ""))
    return "\n".join(out)


def pooled(runs: Sequence[CellRun]) -> str:
    """One row per cell over every workload of the run (the items of a suite, e.g. the 30 code
    edits of benchmarks/workloads/real): each item's paired ratio to off (the geometric mean over
    its rounds), their geometric mean with a 95% bootstrap interval **over items** (an item is the
    unit a user's traffic varies by; its rounds are not independent of each other), the pooled rate
    (all the cell's generated tokens over all its decode and drafting seconds: long answers weigh
    more, as in a day's traffic), and how many of its runs gave the plain text. Empty with fewer
    than two workloads: the summary already says it all."""
    workloads = list(dict.fromkeys(r.workload for r in runs))
    if len(workloads) < 2:
        return ""
    head = ("| pooled over workloads | items | paired vs off (geomean of items) | 95% CI (items) | "
            "pooled effective tok/s | identical to plain |")
    out = [head, "|" + "---|" * head.count(" |")]
    for label in dict.fromkeys(r.cell.label for r in runs):
        mine = [r for r in runs if r.cell.label == label]
        per_item = ([x for x in paired_ratios(runs, w, label) if x > 0] for w in workloads)
        items = [geomean(xs) for xs in per_item if xs]
        if items:
            lo, hi = bootstrap_ci(items)
            ratio, ci = f"{geomean(items):.3f}x", f"{lo:.3f}-{hi:.3f} (n={len(items)})"
        else:
            ratio = ci = "-"
        tokens = sum(r.counters.generated_tokens for r in mine)
        spent = sum(r.counters.decode_s + r.counters.draft_s for r in mine)
        known = [r.identical for r in mine if r.identical is not None]
        ident = f"{sum(known)}/{len(known)}" if known else "-"
        n = len({r.workload for r in mine})
        rate = tokens / spent if spent > 0 else 0.0
        out.append(f"| {label} | {n} | {ratio} | {ci} | {rate:.2f} | {ident} |")
    return "\n".join(out)


# Columns of a run's CSV row, fixed before the first run so each row can be written when its run ends.
EXTRA_KEYS = ("calibration", "auto_steps", "plain_probes", "asked")
CSV_KEYS = ("workload", "cell", "round", "identical", "wall_s", *EXTRA_KEYS, *Counters().as_dict())


def csv_row(r: CellRun) -> dict[str, Any]:
    unknown = set(r.extra) - set(EXTRA_KEYS)
    if unknown:  # a column nobody declared would be lost from a streamed file: refuse it here
        raise ValueError(f"run extras {sorted(unknown)} are not CSV columns (bench.EXTRA_KEYS)")
    return {"workload": r.workload, "cell": r.cell.label, "round": r.repeat, "identical": r.identical,
            "wall_s": round(r.wall_s, 4), **r.extra, **r.counters.as_dict()}


class CsvRows:
    """A CSV of runs written as they finish: the header at once, then each row flushed, so a bench
    that is interrupted (or killed) keeps every run it finished."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.writer = csv.DictWriter(fh, fieldnames=list(CSV_KEYS))
        self.writer.writeheader()
        fh.flush()

    def __call__(self, run: CellRun) -> None:
        self.writer.writerow(csv_row(run))
        self.fh.flush()


def csv_text(runs: Sequence[CellRun]) -> str:
    buf = io.StringIO()
    rows = CsvRows(buf)
    for r in runs:
        rows(r)
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
