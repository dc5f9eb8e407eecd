"""``auto`` against its hindsight oracle, and source sets against each other, in same-text replays
over many models and texts: the controller's yardstick without the machine's noise.

Why: a live bench of ``auto`` on a 1.5B takes half an hour for four 256-token answers, and its
ratios move by a few percent with the hour (docs/results.md); a change to the controller moves them
by less. A replay (:mod:`promptlookup.measure.simulate`) runs the very loop, sources and controller on
a model's plain output, charging each verify the model's measured cost curve, so it is deterministic
and takes seconds: the same text, every variant, every curve. Each (model, workload item) is
generated plainly once (greedy, or ``--temp`` with a fixed seed) and its prompt and output cached
(``~/.cache/promptlookup/replays/``); the table gives per item the hindsight oracle over ``auto``'s
sources and each cell's replayed speedup with its share of that oracle, then per model the geometric
mean and the cost-weighted share, charged three ways: by the model's load-time curve ("own"), by
verify costs timed after each item's prompt and half its answer ("after prompt", as the live steps
ran), and by ``--curve FILE`` (``promptlookup curve -o``: another machine's curve).

    python benchmarks/auto_replay.py -m qwen2.5-coder-1.5b -m qwen2.5-coder-0.5b \\
        --cells auto,auto:sources=ngram+lookup+suffix,suffix:draft=4 -n 256
    W=~/.cache/promptlookup/workloads/real   # benchmarks/workloads/real/build.py
    python benchmarks/auto_replay.py -m qwen2.5-coder-0.5b -w $W/summaries/prompts -n 384 -c 8192 --every 4

A multi-request workload (``=== next request ===``) is replayed in order and the last request
reported, as ``promptlookup bench`` does.

``--foreknown`` adds ``auto`` with its acceptance rates known in advance
(:func:`foreknown_speedup`): what learning them costs, and what is left to the oracle without it.

``--perturb S`` replays each item S more times with ``auto`` told the step times a live run might
measure (:func:`promptlookup.measure.bench.perturbed_speedup`) and reports their mean and range: one
replay is chaotic (an early plain probe moves every later step), so a change to the controller is
judged on the mean. An item's after-prompt curve is the median of three timings; ``--retime`` times
again the curves of a cache written when one timing was kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from promptlookup.chat import chat_tokens  # noqa: E402
from promptlookup.costcurve import CostCurve, median_curve  # noqa: E402
from promptlookup.drafting.auto.controller import AutoDrafter  # noqa: E402
from promptlookup.drafting.spec import Run, SourceSpec, build_source  # noqa: E402
from promptlookup.errors import UsageError  # noqa: E402
from promptlookup.fileio import atomic_write_text  # noqa: E402
from promptlookup.measure import bench  # noqa: E402
from promptlookup.textin import read_prompt_file  # noqa: E402

CACHE = Path.home() / ".cache" / "promptlookup" / "replays"
AFTER_TIMINGS = 3  # timings behind an item's after-prompt curve, their median kept (as bench's oracle)


def median_after(measure: Callable[[], CostCurve], timings: int = AFTER_TIMINGS) -> CostCurve:
    """The median (:func:`promptlookup.costcurve.median_curve`) of ``timings`` calls of ``measure``.

    Why: one timing is a lottery, and a replay charged by it rewards whoever exploits its noise. The
    1.5B's copy_edit curve of one timing read a 2-token verify as 1.025 decodes and a 5-token one
    dearer than a 6-token one (1.767 against 1.576); the hindsight oracle, which knows the charges,
    sends what is cheap by accident, and `auto`'s share of it fell by the oracle's luck."""
    if timings < 1:
        raise ValueError(f"an after-prompt curve needs at least one timing, got {timings}")
    curves = [measure() for _ in range(timings)]
    return median_curve(curves)  # labelled as the first timing


def needs_timing(item: dict, retime: bool) -> bool:
    """Whether a cached item's after-prompt curve is (re)timed: when it has none, and with
    ``retime`` when it was timed fewer than :data:`AFTER_TIMINGS` times (a cache written before
    the median kept one timing)."""
    if "curve_after" not in item:
        return True
    return retime and item.get("curve_after_timings", 1) < AFTER_TIMINGS


FOREKNOWN = "auto, rates foreknown"


def foreknown_speedup(run: Run, curve: CostCurve, requests: list[list[int]], outputs: list[list[int]],
                      told: Callable[[int], float] | None = None) -> float:
    """``auto``'s replay with its acceptance rates known before it starts: a first replay learns
    them over the whole session, a second judges every step by them, frozen
    (:meth:`~promptlookup.drafting.auto.acceptance.AcceptanceModel.frozen`), told the step seconds
    ``told`` (default: what ``curve`` charges). Everything else, the conservative judgement and the
    realized/predicted ratios among it, is the controller's own.

    Why: ``auto`` short of its hindsight oracle is either learning this text's rates too slowly or
    pricing by buckets that cannot tell its good drafts from its bad ones, and the oracle, which
    knows each draft's outcome, cannot say which. Between ``auto`` and this replay lies what
    learning costs; between this and the oracle, what the buckets cannot tell."""
    spec = SourceSpec("auto")
    learner: AutoDrafter = build_source(spec, run)
    bench.replayed_source(learner, spec.draft, curve, requests, outputs)
    drafter: AutoDrafter = build_source(spec, run)  # fresh sources and times, the learner's rates
    drafter.model = learner.model.frozen()
    return bench.replayed_source(drafter, spec.draft, curve, requests, outputs, told)


def label(model: str) -> str:
    """A model's name in the table and the cache: a file's stem, or the name as given."""
    return Path(model).stem if Path(model).expanduser().is_file() else model


def plain_outputs(model: str, files: list[Path], n: int, n_ctx: int, threads: int, temp: float,
                  seed: int, retime: bool = False) -> dict:
    """``{"curve": [...], "n_vocab": V, "items": {name: {"requests": [...], "outputs": [...],
    "curve_after": [...]}}}``, generated once per (model, files, n, temp, seed) and cached.
    ``curve`` is the model's load-time curve (what ``auto`` starts from), ``curve_after`` the verify
    costs timed after the item's prompt and half its answer (what its steps cost there), the median
    of :data:`AFTER_TIMINGS` timings (:func:`median_after`; a cache written before it is completed
    once, and with ``retime`` one timed once is timed again)."""
    from promptlookup.api import load_backend
    from promptlookup.backends.costs import cached_cost_curve, measure_cost_curve_after
    from promptlookup.sampling import Sampler, SamplingParams
    from promptlookup.speculate import generate

    texts = {f: read_prompt_file(f, "workload") for f in files}
    key = hashlib.sha256(json.dumps([model, n, temp, seed, sorted((f.name, hashlib.sha256(
        t.encode()).hexdigest()) for f, t in texts.items())]).encode()).hexdigest()[:16]
    path = CACHE / f"{label(model)}-{key}.json"
    out = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if out is not None and not any(needs_timing(item, retime) for item in out["items"].values()):
        return out
    backend = load_backend(model, "llama.cpp", n_ctx, threads)
    if out is None:
        out = {"curve": list(cached_cost_curve(backend).seconds), "n_vocab": backend.n_vocab, "items": {}}
    for i, f in enumerate(files):
        item = out["items"].get(f.stem)
        t0 = time.perf_counter()
        if item is None:
            requests = [chat_tokens(backend, t) for t in bench.split_requests(texts[f])]
            outputs = []
            for prompt in requests:
                sampler = Sampler(SamplingParams(temp=temp), seed) if temp > 0 else None
                outputs.append(list(generate(backend, prompt, n, sampler=sampler).tokens))
            item = out["items"][f.stem] = {"requests": requests, "outputs": outputs}
        if needs_timing(item, retime):
            context = bench.steps_context(item["requests"], item["outputs"])
            curve = median_after(partial(measure_cost_curve_after, backend, context))
            item["curve_after"] = list(curve.seconds)
            item["curve_after_timings"] = AFTER_TIMINGS
        print(f"auto_replay: {label(model)} [{i + 1}/{len(files)}] {f.stem}: "
              f"{sum(map(len, item['outputs']))} tokens, curve after the prompt (median of "
              f"{item.get('curve_after_timings', 1)} timings), {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    CACHE.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out))
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", required=True, help="model name or GGUF (repeatable)")
    ap.add_argument("-w", "--workload", nargs="+", default=[str(ROOT / "benchmarks" / "workloads")])
    ap.add_argument("--every", type=int, default=1, help="of a folder's prompts, every Nth (default all)")
    ap.add_argument("--cells", default="auto", help="comma-separated source specs to replay (default auto)")
    ap.add_argument("-n", type=int, default=256, help="tokens per answer (default 256)")
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.0, help="sample the plain outputs (seed --seed)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--curve", action="append", default=[],
                    help="replay on this cost curve file too (promptlookup curve -o), besides the model's")
    ap.add_argument("--perturb", type=int, default=0, metavar="S",
                    help="replay each item S more times on perturbed step times; report their mean and range")
    ap.add_argument("--foreknown", action="store_true",
                    help="add auto with its acceptance rates known in advance (what learning them costs)")
    ap.add_argument("--retime", action="store_true",
                    help=f"time again the after-prompt curves that cached items timed fewer than "
                         f"{AFTER_TIMINGS} times (their median is kept)")
    ap.add_argument("--md", help="also write the table to this file")
    args = ap.parse_args()
    if args.perturb < 0:
        ap.error(f"--perturb must be 0 or more replays, got {args.perturb}")
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    specs = {c: SourceSpec.parse(c).check() for c in cells}  # a bad cell fails before any model loads
    curves = [(Path(p).stem, CostCurve.load(p)) for p in args.curve]
    try:
        files = bench.workload_files([Path(w).expanduser() for w in args.workload], max(1, args.every))
    except UsageError as exc:
        raise SystemExit(f"auto_replay: {exc}") from None
    share = "share; range of the perturbed replays" if args.perturb else "share"
    head = "| model | curve | item | oracle | " + " | ".join(f"{c} ({share})" for c in cells)
    columns = [*cells, FOREKNOWN] if args.foreknown else cells
    if args.foreknown:
        head += f" | {FOREKNOWN} ({share})"
    lines = [head + " |", "|" + "---|" * (4 + len(columns))]
    for model in args.model:
        data = plain_outputs(model, files, args.n, args.ctx, args.threads, args.temp, args.seed,
                             args.retime)
        own = CostCurve(tuple(data["curve"]))
        for cname, given in [("own", own), ("after prompt", None), *curves]:
            speeds: dict[str, list[float]] = {c: [] for c in columns}
            costs = {c: 0.0 for c in columns}
            oracle_cost = 0.0
            # "after prompt": each item charged as live, by its curve after its prompt, with auto
            # starting from the load-time curve, as it does live
            run = Run(data["n_vocab"], lambda: "replay", cost_curve=lambda c=given or own: c)
            for name, item in data["items"].items():
                curve = given or CostCurve(tuple(item["curve_after"]))
                orc = bench.oracle_on(run, curve, item["requests"], item["outputs"])
                oracle_cost += orc.cost
                row = [label(model), cname, name, f"{orc.speedup:.3f}x"]
                # each column's replay, told the step seconds the curve charges or perturbed clocks
                texts = (run, curve, item["requests"], item["outputs"])
                replays = {c: partial(bench.replayed_speedup, specs[c], *texts) for c in cells}
                if args.foreknown:
                    replays[FOREKNOWN] = partial(foreknown_speedup, *texts)
                for c, replay in replays.items():
                    xs = [replay(bench.perturbed_clock(run, curve, seed))
                          for seed in range(args.perturb)] or [replay()]
                    x = statistics.mean(xs)
                    speeds[c].append(x)
                    costs[c] += orc.plain_cost / x
                    of_oracle = f"{x / orc.speedup:.0%}"
                    if args.perturb:
                        of_oracle += f"; {min(xs) / orc.speedup:.0%}-{max(xs) / orc.speedup:.0%}"
                    row.append(f"{x:.3f}x ({of_oracle})")
                lines.append("| " + " | ".join(row) + " |")
            summary = [label(model), cname, "**geomean; cost-weighted share**", ""]
            summary += [f"**{geomean(speeds[c]):.3f}x**; {oracle_cost / costs[c]:.1%}" for c in columns]
            lines.append("| " + " | ".join(summary) + " |")
    table = "\n".join(lines)
    print(table)
    if args.md:
        atomic_write_text(Path(args.md), table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
