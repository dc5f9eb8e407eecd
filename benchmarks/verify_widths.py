"""Verify cost by width after a real prompt, two or more llama.cpp builds side by side in one run.

Why beside invariant_cost.py: its cost curve is measured after a 128-token context, where attention is
cheap; a verify in a bench runs after the whole prompt (the copy_edit chat prompt is 966 tokens on
Qwen2.5-Coder). Each round runs every build once, in a child process of its own (a build is a Python
whose ``llama_cpp`` is that build), alternating the order from round to round; a child prefills the
prompt once, then times ``--n`` verifies of each width (feed, then roll back to the prompt), and
reports each width's median. The table gives each build's median over rounds.

    python benchmarks/verify_widths.py --build before=/work/f16py --build after=.venv/bin/python \\
        -m qwen2.5-coder-1.5b --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ROOT / "benchmarks" / "workloads" / "copy_edit.txt"
RESULT = "result: "


def child(model: str, threads: int, n: int, widths: list[int]) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "src"))
    from promptlookup import cli
    from promptlookup.chat import chat_tokens

    args = cli.build_parser().parse_args(["bench", "-m", model, "-t", str(threads)])
    backend = cli._load_backend(args, announce=False)
    ids = chat_tokens(backend, PROMPT.read_text(encoding="utf-8"))
    first = backend.prefill(ids, None, 0)
    base = backend.n_past
    out = {"context": float(base)}
    for w in widths:
        feed = [first, *ids[len(ids) - w + 1:]] if w > 1 else [first]
        for _ in range(3):  # warm-up
            backend.verify(feed)
            backend.rollback(base)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            backend.verify(feed)
            backend.rollback(base)
            times.append(time.perf_counter() - t0)
        out[str(w)] = 1000 * statistics.median(times)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON",
                    help="a build: a name and a Python whose llama_cpp is that build (two or more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=30, help="verifies per width (default 30)")
    ap.add_argument("--widths", default="1,2,3,5,9")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        widths = [int(w) for w in a.widths.split(",")]
    except ValueError:
        ap.error(f"--widths: not a list of integers: {a.widths!r}")
    if any(not 1 <= w <= 16 for w in widths):
        ap.error("--widths: each width must be 1..16")
    if a.child:
        print(RESULT + json.dumps(child(a.model, a.threads, a.n, widths)), flush=True)
        return 0
    builds = []
    for spec in a.build:
        name, sep, python = spec.partition("=")
        if not sep or not name or not Path(python).exists():
            ap.error(f"--build {spec!r}: give NAME=PYTHON with an existing Python")
        builds.append((name, python))
    if len(builds) < 2:
        ap.error("give at least two --build NAME=PYTHON")
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in builds}
    for r in range(a.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, python in order:
            print(f"[round {r + 1}] {name}", file=sys.stderr, flush=True)
            cmd = [python, __file__, "--child", "-m", a.model, "-t", str(a.threads), "--n", str(a.n),
                   "--widths", a.widths]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT)]
            if proc.returncode != 0 or not lines:
                print(proc.stderr[-2000:], file=sys.stderr)
                print(f"verify_widths: error: build {name} failed (status {proc.returncode})",
                      file=sys.stderr)
                return 1
            res = json.loads(lines[-1][len(RESULT):])
            results[name].append(res)
            line = " ".join(f"{w}:{res[str(w)]:.1f}" for w in widths)
            print(f"  {name}: {line}", file=sys.stderr, flush=True)
    context = int(results[builds[0][0]][0]["context"])
    print(f"verify ms by width after a {context}-token prompt ({a.model}, {a.threads} threads; median of "
          f"{a.n} per round, median of {a.rounds} rounds)\n")
    ratio = 1 in widths and 9 in widths
    print("| build | " + " | ".join(str(w) for w in widths) + " |" + (" 9 / 1 |" if ratio else ""))
    print("|---|" + "---|" * (len(widths) + ratio))
    for name, _ in builds:
        med = {w: statistics.median(x[str(w)] for x in results[name]) for w in widths}
        row = f"| {name} | " + " | ".join(f"{med[w]:.1f}" for w in widths) + " |"
        if ratio:
            row += f" {med[9] / med[1]:.2f} |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
