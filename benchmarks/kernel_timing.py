"""Kernel timing, before and after: us per drafting call of every source, for two trees in one run.

Why this script: a kernel change (named bundles instead of index constants, a split module) must
not cost speed, and two runs at two times on a shared machine measure the load as much as the code.
So both trees run in the same session, as child processes that alternate round by round (base, tree,
tree, base, ...), each on the same token ids, and the figures are medians over rounds: a load that
comes and goes hits both about alike. It
compares a git commit (its ``src/`` unpacked by ``git archive`` into a temporary folder) with the
working tree.

What is timed: one ``propose(k)`` call of a source built from its spec (``ngram``, ``lookup``,
``suffix``, ``auto`` on a CPU-like cost curve), timed alone, while the text is fed through it token
by token (each step: ``propose(k)`` timed, then ``extend([next token])`` untimed), after a
``--context``-token prompt. The text is this Python's standard library (sorted ``.py`` files),
tokenized with the bundled model's tokenizer (word ids by first appearance if it is missing).

    PYTHONPATH=src .venv/bin/python benchmarks/kernel_timing.py --rounds 8  # against the merge-base with main

Prints, per source: the median over rounds of each round's median us per call, for the base commit
and the tree, and their ratio (tree / base).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCES = ("ngram", "lookup", "suffix", "auto")
# a CPU-like verify cost curve (the bundled model on 2 threads): auto weighs its sources as it does there
CURVE = (1.0, 1.74, 2.08, 2.46, 3.10, 3.53, 3.91, 4.0, 4.65)


def stdlib_text(n_bytes: int) -> bytes:
    out, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        data = path.read_bytes()
        out.append(data)
        size += len(data)
        if size >= n_bytes:
            break
    return b"".join(out)[:n_bytes]


def text_tokens(n_tokens: int) -> tuple[np.ndarray, int, str]:
    """(token ids, vocabulary size, what tokenized them)."""
    text = stdlib_text(8 * n_tokens)
    try:
        from promptlookup.backends.models import bundled_model_path
        from promptlookup.build.tokenizers import open_tokenizer

        tok = open_tokenizer(bundled_model_path())
        ids = np.asarray(tok.tokenize(text, add_special=False, parse_special=False), dtype=np.int32)
        return ids[:n_tokens], int(tok.n_vocab), "the bundled model's tokenizer"
    except Exception as exc:  # no bundled model: word ids, the same repetition structure
        print(f"kernel_timing: bundled tokenizer unavailable ({exc}); word ids instead", file=sys.stderr)
        ids: dict[str, int] = {}
        words = re.findall(r"\w+|[^\w\s]|\n", text.decode("utf-8", "replace"))
        out = [ids.setdefault(w, len(ids)) % 32000 for w in words]
        return np.asarray(out[:n_tokens], dtype=np.int32), 32000, "word ids"


# ----------------------------------------------------------------------------- child: one tree
def child(tokens_path: str, context: int, steps: int, draft: int) -> dict[str, dict[str, float]]:
    """Time every source in the tree on ``PYTHONPATH``; only spec-level names, so any tree runs it."""
    from promptlookup.drafting.spec import Run, SourceSpec, build_source

    try:
        from promptlookup.costcurve import CostCurve
    except ImportError:  # trees before the cost-curve type left measure/
        from promptlookup.measure.costs import CostCurve

    data = np.load(tokens_path)
    n_vocab = int(data[-1])
    toks = data[:-1]
    prompt = toks[:context].tolist()
    follow = toks[context : context + steps].tolist()
    run = Run(n_vocab, lambda: "kernel-timing", cost_curve=lambda: CostCurve(CURVE))
    out = {}
    clock = time.perf_counter_ns
    for name in SOURCES:
        src = build_source(SourceSpec.parse(name), run)  # compiled (or loaded) and warmed by its factory
        src.reset(prompt)
        propose, extend = src.propose, src.extend
        ns = np.empty(len(follow), dtype=np.int64)
        for i, t in enumerate(follow):
            t0 = clock()
            propose(draft)
            ns[i] = clock() - t0
            extend([t])
        out[name] = {"median_us": float(np.median(ns)) / 1e3, "mean_us": float(ns.mean()) / 1e3}
    return out


# ----------------------------------------------------------------------------- parent: both trees
def run_child(tree: Path, script: Path, args: argparse.Namespace, tokens_path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, str(script), "--child", tokens_path, "--context", str(args.context),
           "--steps", str(args.steps), "--draft", str(args.draft)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"child on {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=None,
                    help="git commit to compare with (default: where the tree's branch left main)")
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]),
                    help="the working tree to time (default this script's)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--draft", type=int, default=3)
    ap.add_argument("--child", metavar="TOKENS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.context, args.steps, args.draft)))
        return 0

    tree = Path(args.tree).resolve()
    script = Path(__file__).resolve()
    ids, n_vocab, how = text_tokens(args.context + args.steps)
    git = ["git", "-C", str(tree)]
    base_rev = args.base or subprocess.check_output([*git, "merge-base", "HEAD", "main"], text=True).strip()
    commit = subprocess.check_output([*git, "rev-parse", "--short", base_rev], text=True).strip()
    with tempfile.TemporaryDirectory(prefix="kernel-timing-") as tmp:
        tokens_path = str(Path(tmp) / "tokens.npy")
        np.save(tokens_path, np.append(ids, np.int32(n_vocab)))
        base = Path(tmp) / "base"  # the commit's files (git archive: no worktree left registered)
        base.mkdir()
        archive = subprocess.run([*git, "archive", commit, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        trees = {"base": base, "tree": tree}
        for t in trees.values():  # compile each tree's kernels into its numba cache, untimed
            run_child(t, script, args, tokens_path)
        rounds: dict[str, list[dict]] = {"base": [], "tree": []}
        for r in range(args.rounds):
            order = ("base", "tree") if r % 2 == 0 else ("tree", "base")
            for label in order:
                rounds[label].append(run_child(trees[label], script, args, tokens_path))
    print(f"kernel timing: {len(ids)} tokens of the stdlib's sources ({how}, n_vocab {n_vocab}); "
          f"prompt {args.context}, {args.steps} propose({args.draft}) calls per source per round; "
          f"{args.rounds} rounds alternating base {commit} and the tree {tree}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'source':8} {'base us/call':>13} {'tree us/call':>13} {'tree/base':>10}"
          f" {'base mean':>10} {'tree mean':>10}")
    for name in SOURCES:
        b = statistics.median(x[name]["median_us"] for x in rounds["base"])
        t = statistics.median(x[name]["median_us"] for x in rounds["tree"])
        bm = statistics.median(x[name]["mean_us"] for x in rounds["base"])
        tm = statistics.median(x[name]["mean_us"] for x in rounds["tree"])
        print(f"{name:8} {b:13.3f} {t:13.3f} {t / b:10.3f} {bm:10.3f} {tm:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
