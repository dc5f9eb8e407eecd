"""What the batch-invariant llama.cpp build costs: the same measurements on two builds, side by side.

Why one script run: on a shared 2-core machine the load drifts by tens of percent within minutes, so
two builds measured in two runs are not comparable. Here each round runs every build once, in a child
process of its own (a build is a Python whose ``llama_cpp`` is that build; this repository's ``src``
goes first on its path), alternating the order from round to round, and the table reports each
figure's median over rounds. Each child measures, on the bundled model or ``--model NAME|PATH``:

- prefill tokens/s (a 480-token prompt, or ``--prefill-tokens``, in one call, median of 3),
- the verify cost curve for 1..9 tokens (ms, after a 128-token context; median of 5),
- plain decode tokens/s (``--speculate off``, 128 tokens on the copy_edit chat prompt),
- with ``--bench``: ``promptlookup bench`` on copy_edit and prose (cells off and auto), whose paired
  ratio of auto to off is reported,

- one forward of 1, 4 and 16 sequences x 1 token (continuous batching's decode step; ms, median of 7),

and with ``--invariance`` the build's bitwise batch invariance
(:func:`~promptlookup.backends.llama_cpp_smoke.invariance_check`).

    python benchmarks/invariant_cost.py --build fast=/work/main/.venv/bin/python \\
        --build invariant=/work/venv23/bin/python --rounds 3 --bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "benchmarks" / "workloads"
PREFILL_TOKENS = 480
DECODE_TOKENS = 128
RESULT = "result: "
BATCH_SEQS = (1, 4, 16)


def child(bench: bool, threads: int | None, first: bool, cpu_time: bool, model_arg: str | None,
          prefill_tokens: int) -> dict:
    """Measure the build this Python imports (runs in the child)."""
    clock = time.process_time if cpu_time else time.perf_counter
    import llama_cpp

    from promptlookup.backends.costs import measure_cost_curve
    from promptlookup.backends.llama_cpp import LlamaCppBackend, invariant_build, system_info
    from promptlookup.backends.llama_cpp_smoke import INVARIANCE_TOKENS, invariance_check, smoke_ids
    from promptlookup.backends.models import resolve_model
    from promptlookup.chat import chat_tokens
    from promptlookup.speculate import generate

    model = resolve_model(model_arg)
    backend = LlamaCppBackend(model, n_ctx=max(2048, prefill_tokens + 16), n_threads=threads)
    info = system_info(llama_cpp)
    out: dict = {"system_info": info, "invariant_build": invariant_build(info), "threads": backend.n_threads}
    ids = smoke_ids(backend, prefill_tokens)
    backend.prefill(ids)  # warm-up
    times = []
    for _ in range(3):
        t0 = clock()
        backend.prefill(ids)
        times.append(clock() - t0)
    out["prefill_tps"] = prefill_tokens / statistics.median(times)
    out["verify_ms"] = [s * 1000 for s in measure_cost_curve(backend, max_tokens=9, clock=clock).seconds]
    prompt = chat_tokens(backend, (WORKLOADS / "copy_edit.txt").read_text(encoding="utf-8"))
    gen = generate(backend, prompt, DECODE_TOKENS, source=None, clock=clock)
    out["decode_tps"] = gen.counters.reported_tps  # generated tokens / decode seconds (prefill apart)
    if first:  # the build's bits do not change between rounds
        out["invariance"] = invariance_check(backend, smoke_ids(backend, INVARIANCE_TOKENS)).line()
    backend.close()
    out["batch_ms"] = batched_forwards(model, threads, clock)
    if bench:
        out["bench"] = run_bench_cli(model, threads)
    return out


def batched_forwards(model: Path, threads: int | None, clock) -> dict[str, float]:
    """ms of one forward of S sequences x 1 token (S in :data:`BATCH_SEQS`, 128 cached positions each,
    every row's logits: continuous batching's decode step), median of 7, the widths interleaved."""
    from promptlookup.backends.base import SeqDecode
    from promptlookup.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(model, n_ctx=512, n_threads=threads, n_seq=max(BATCH_SEQS))
    context = 128
    for s in range(max(BATCH_SEQS)):
        backend.decode_many([SeqDecode(s, [100 + (s * 37 + 11 * i) % 5000 for i in range(context)], "last")])
    samples: dict[int, list[float]] = {s: [] for s in BATCH_SEQS}
    for rep in range(8):
        for n_seq in BATCH_SEQS:
            parts = [SeqDecode(s, [200 + (rep + s) % 3000], "all") for s in range(n_seq)]
            t0 = clock()
            backend.decode_many(parts)
            if rep:  # the first pass warms each width up
                samples[n_seq].append(clock() - t0)
            for s in range(n_seq):
                backend.seq_rollback(s, context)
    backend.close()
    return {str(s): statistics.median(v) * 1000 for s, v in samples.items()}


def run_bench_cli(model: Path, threads: int | None) -> dict[str, float]:
    """``promptlookup bench`` (off and auto, copy_edit and prose) in this Python: auto's paired ratio."""
    cmd = [sys.executable, "-m", "promptlookup", "bench", "-m", str(model), "--cells", "off,auto",
           "--repeat", "2", "-n", "256", "-w", str(WORKLOADS / "copy_edit.txt"), str(WORKLOADS / "prose.txt")]
    if threads:
        cmd += ["-t", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    ratios = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[1] == "auto" and re.fullmatch(r"[0-9.]+x", cells[4]):
            ratios[cells[0]] = float(cells[4][:-1])
    return ratios


def run_child(python: str, bench: bool, threads: int | None, first: bool, cpu_time: bool,
              model: str | None, prefill_tokens: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                    os.environ.get("PYTHONPATH")])))
    cmd = [python, str(Path(__file__).resolve()), "--child"] + (["--bench"] if bench else [])
    cmd += ["--first"] if first else []
    cmd += ["--cpu-time"] if cpu_time else []
    cmd += ["--model", model] if model else []
    cmd += ["--prefill-tokens", str(prefill_tokens)]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"invariant_cost: error: the child for {python} failed: {tail}")
    return json.loads(lines[-1][len(RESULT):])


def table(results: dict[str, list[dict]]) -> str:
    names = list(results)
    def med(name: str, f, bench: bool) -> float:
        return statistics.median(f(r) for r in results[name] if "bench" in r or not bench)

    rows = [("prefill tok/s", lambda r: r["prefill_tps"], "{:.1f}", False),
            ("plain decode tok/s", lambda r: r["decode_tps"], "{:.1f}", False)]
    rows += [(f"verify {n} tokens, ms", lambda r, n=n: r["verify_ms"][n - 1], "{:.1f}", False)
             for n in range(1, 10)]
    rows += [(f"verify {n} / verify 1", lambda r, n=n: r["verify_ms"][n - 1] / r["verify_ms"][0], "{:.2f}",
              False) for n in (2, 5, 9)]
    rows += [(f"{s} sequences x 1 token, ms", lambda r, s=s: r["batch_ms"][str(s)], "{:.1f}", False)
             for s in BATCH_SEQS]
    if all(any("bench" in r for r in rs) for rs in results.values()):
        for w in ("copy_edit", "prose"):
            rows.append((f"bench {w}: auto / off (paired)", lambda r, w=w: r["bench"].get(w, float("nan")),
                         "{:.3f}x", True))
    head = "| measure | " + " | ".join(names) + (f" | {names[1]} / {names[0]} |" if len(names) == 2 else " |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, f, fmt, bench in rows:
        vals = [med(n, f, bench) for n in names]
        ratio = f" {vals[1] / vals[0]:.2f} |" if len(names) == 2 and vals[0] else ""
        out.append(f"| {label} | " + " | ".join(fmt.format(v) for v in vals) + " |" + ratio)
    for n in names:
        out.append(f"\n{n}: {results[n][0]['system_info']}")
        if "invariance" in results[n][0]:
            out.append(f"{n}: {results[n][0]['invariance']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON",
                    help="a build to measure: a name and the Python that imports it (give two or more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", action="store_true", help="also run promptlookup bench (minutes per build)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--invariance", action="store_true",
                    help="also run the bitwise invariance check on each build (first round)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by process CPU time, not wall time (a loaded machine; use with --threads 1)")
    ap.add_argument("--model", "-m", metavar="NAME|PATH", help="the model (default: the bundled one)")
    ap.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS,
                    help=f"the prefill's prompt length (default {PREFILL_TOKENS})")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(child(args.bench, args.threads, args.first, args.cpu_time, args.model,
                                        args.prefill_tokens)), flush=True)
        return 0
    builds = {}
    for b in args.build:
        name, sep, python = b.partition("=")
        if not sep or not name or not Path(python).is_file():
            ap.error(f"--build wants NAME=PYTHON with an existing Python, got {b!r}")
        builds[name] = python
    if len(builds) < 2 or args.rounds < 1:
        ap.error("give at least two --build and --rounds >= 1")
    results: dict[str, list[dict]] = {n: [] for n in builds}
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for name in order:
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            results[name].append(run_child(builds[name], args.bench and r == 0, args.threads,
                                           args.invariance and r == 0, args.cpu_time, args.model,
                                           args.prefill_tokens))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
