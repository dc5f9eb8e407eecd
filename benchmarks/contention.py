"""Prefill and decode speed beside busy processes: does a setting degrade with the load or collapse?

Why this script: a server shares its machine. Our llama.cpp build runs its worker threads as an
OpenMP team (``OPENMP = 1`` in its system info; ``libgomp`` is linked by every ``libggml*``), and
ggml's barrier is ``#pragma omp barrier``: a thread that arrives first spins (libgomp's wait policy,
``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``, read once when libgomp is loaded) while its partner may be
descheduled in favour of another process, so every barrier can cost a whole time slice. This script
measures that: for 0, 1 and 2 busy-loop processes (plain Python ``while True: pass`` children,
started here and always killed), and for each setting (threads x libgomp wait policy), a fresh child
process (so that the environment reaches libgomp before it loads) loads the model with
:class:`~promptlookup.backends.llama_cpp.LlamaCppBackend`, prefills a ``--prompt-tokens`` prompt and
decodes ``--decode-tokens`` greedy tokens one at a time (plain decoding, no speculation).

    flock /tmp/promptlookup-bench.lock env PYTHONPATH=src .venv/bin/python benchmarks/contention.py --loads 0

(one load per run keeps a run within a few minutes on 2 cores). Within a load the settings alternate
over ``--rounds`` rounds (reversed every other round), so work that comes and goes on a shared machine
hits them alike; the markdown table gives each cell's median and range over the rounds. ``--json FILE``
writes the raw figures, with ``/proc/loadavg`` read before each child (its runnable count shows any
work other than ours). Each child is bounded by ``--timeout`` and its decode by ``--decode-budget``
seconds (a collapsed setting decodes fewer tokens; the table says how many). The settings are
:data:`SETTINGS`: ``unset`` is promptlookup's own default, the others set libgomp's variables
explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: the libgomp variables a setting controls; a child gets exactly the setting's values of them
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class Setting:
    """Threads and libgomp environment of one child (variables absent from ``env`` are unset)."""

    name: str
    threads: int
    env: dict[str, str] = field(default_factory=dict)


#: ``GOMP_SPINCOUNT=300000`` is libgomp's own default spin count (what an unset environment gives,
#: set explicitly so that the figure is libgomp's default whatever promptlookup itself defaults to)
SETTINGS = {
    "t1": Setting("-t 1", 1, {"GOMP_SPINCOUNT": "300000"}),
    "t2": Setting("-t 2, libgomp default (spin 300k)", 2, {"GOMP_SPINCOUNT": "300000"}),
    "t2-passive": Setting("-t 2, OMP_WAIT_POLICY=PASSIVE", 2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "t2-spin10k": Setting("-t 2, GOMP_SPINCOUNT=10000", 2, {"GOMP_SPINCOUNT": "10000"}),
    "t2-spin3k": Setting("-t 2, GOMP_SPINCOUNT=3000", 2, {"GOMP_SPINCOUNT": "3000"}),
    "t2-spin1k": Setting("-t 2, GOMP_SPINCOUNT=1000", 2, {"GOMP_SPINCOUNT": "1000"}),
    "t2-spin300": Setting("-t 2, GOMP_SPINCOUNT=300", 2, {"GOMP_SPINCOUNT": "300"}),
    "t2-spin100": Setting("-t 2, GOMP_SPINCOUNT=100", 2, {"GOMP_SPINCOUNT": "100"}),
    "t1-passive": Setting("-t 1, OMP_WAIT_POLICY=PASSIVE", 1, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "unset": Setting("promptlookup's default (no -t, no OMP variables)", 0, {}),
}


# -- the child: one setting, one fresh process ------------------------------------------------------
def gomp_mapped() -> bool:
    """Whether libgomp is already in this process (then a later environment change is too late)."""
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def child(threads: int, prompt_tokens: int, decode_tokens: int, decode_budget: float) -> dict:
    """Load, warm up, then time one prefill and ``decode_tokens`` single-token decodes."""
    gomp_before = gomp_mapped()
    from promptlookup.backends.llama_cpp import LlamaCppBackend, system_info
    from promptlookup.backends.models import bundled_model_path

    backend = LlamaCppBackend(bundled_model_path(), n_ctx=2048, n_threads=threads or None)
    text = Path(os.__file__).read_text(encoding="utf-8")
    ids = backend.tokenize(text)[:prompt_tokens]
    if len(ids) < prompt_tokens:
        raise SystemExit(f"the prompt text has only {len(ids)} tokens")
    tok = backend.prefill(ids[:16])  # warm-up: the OpenMP team, the compute buffers
    for _ in range(4):
        tok = backend.verify([tok])[0]
    t0 = time.perf_counter()
    tok = backend.prefill(ids)
    prefill_s = time.perf_counter() - t0
    steps: list[float] = []
    start = time.perf_counter()
    for _ in range(decode_tokens):
        t = time.perf_counter()
        tok = backend.verify([tok])[0]
        steps.append(time.perf_counter() - t)
        if time.perf_counter() - start > decode_budget:
            break
    info = system_info(backend._lib)
    out = {"threads": backend.n_threads, "prompt_tokens": len(ids), "prefill_s": prefill_s,
           "decode_tokens": len(steps), "decode_s": sum(steps),
           "openmp": "OPENMP = 1" in info, "gomp_loaded_before_import": gomp_before,
           "env": {k: os.environ.get(k) for k in OMP_VARS}}
    backend.close()
    return out


# -- the parent: loads x settings -------------------------------------------------------------------
def start_busy(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes, each bounded by its own alarm (a safety net if we die unkilled)."""
    code = "import signal; signal.alarm(900)\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_setting(setting: Setting, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(setting.env)
    cmd = [sys.executable, __file__, "--child", "--threads", str(setting.threads),
           "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens),
           "--decode-budget", str(args.decode_budget)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {args.timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"status {proc.returncode}"])[-1]}
    return json.loads(lines[-1])


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def rate(r: dict, what: str) -> float | None:
    """Tokens per second of one child's ``prefill`` or ``decode`` (None when it failed)."""
    if "error" in r:
        return None
    if what == "prefill":
        return r["prompt_tokens"] / r["prefill_s"]
    return r["decode_tokens"] / r["decode_s"] if r["decode_s"] else 0.0


def cell(values: list[float | None]) -> str:
    """Median over rounds, with the range when there is more than one round."""
    ok = sorted(v for v in values if v is not None)
    failed = len(values) - len(ok)
    if not ok:
        return "failed"
    text = f"{statistics.median(ok):.1f}"
    if len(ok) > 1:
        text += f" ({ok[0]:.1f}-{ok[-1]:.1f})"
    return text + (f", {failed} failed" if failed else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0,1,2", help="numbers of busy processes (default 0,1,2)")
    ap.add_argument("--settings", default="t1,t2,t2-passive,t2-spin1k",
                    help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per load; the settings alternate within a round, so load that "
                         "comes and goes hits them alike (default 3)")
    ap.add_argument("--prompt-tokens", type=int, default=500)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-budget", type=float, default=10.0, help="seconds of decoding at most")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per child at most")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.threads, args.prompt_tokens, args.decode_tokens, args.decode_budget)))
        return 0
    # a SIGTERM (``timeout``, a killed job) unwinds through the ``finally`` that kills the busy loops
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    loads = [int(x) for x in args.loads.split(",")]
    settings = [SETTINGS[s] for s in args.settings.split(",")]
    before = loadavg()
    results = []
    print(f"load average before: {before}; {len(os.sched_getaffinity(0))} cores available; "
          f"median (min-max) over {args.rounds} rounds", flush=True)
    print("| busy processes | setting | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|", flush=True)
    for load in loads:
        busy = start_busy(load)
        got: dict[str, list[dict]] = {s.name: [] for s in settings}
        try:
            time.sleep(1.0)  # let the scheduler see them
            for rnd in range(args.rounds):
                order = settings if rnd % 2 == 0 else settings[::-1]
                for s in order:
                    at = loadavg()
                    r = run_setting(s, args)
                    results.append({"busy": load, "round": rnd, "setting": s.name, "loadavg": at, **r})
                    got[s.name].append(r)
        finally:
            stop_busy(busy)
        for s in settings:
            rs = got[s.name]
            short = [r["decode_tokens"] for r in rs
                     if "error" not in r and r["decode_tokens"] < args.decode_tokens]
            note = f" ({min(short)}-{max(short)} tokens in {args.decode_budget:.0f} s)" if short else ""
            print(f"| {load} | {s.name} | {cell([rate(r, 'prefill') for r in rs])} | "
                  f"{cell([rate(r, 'decode') for r in rs])}{note} |", flush=True)
    print(f"load average after: {loadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"loadavg_before": before, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
