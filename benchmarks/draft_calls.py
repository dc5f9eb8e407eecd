"""Per-call drafting cost of every source, without a model: the before/after check for kernel changes.

Why this script: ``lookup_perf.py`` needs llama.cpp built and a GGUF tokenizer and takes most of an
hour; a change to a kernel's signature or to how a ``Draft`` is built only needs the cost of one
``propose`` + ``extend`` (and the compiled lookup replay) on real text, measured for the tree on
``PYTHONPATH`` and for another tree right after it. The text is this Python's standard library
(sorted ``.py`` files), split into words and punctuation, ids by first appearance (capped at
``--vocab``): not a model's tokens, but the same repetition structure, and identical for both trees.

    PYTHONPATH=src .venv/bin/python benchmarks/draft_calls.py --runs 3
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/draft_calls.py --runs 3   # the other tree

Figures (medians of ``--runs``): us per ``propose(k)`` + ``extend(1)`` step after a ``--context``
token prompt, for ``ngram``, ``lookup`` (empty and corpus-built static cache) and ``suffix`` (with
a history); us per ``propose(k)`` repeated on the final state (``... propose``: the fixed per-call
cost, where a kernel signature or the ``Draft`` builder shows); and the lookup replay's us per
drafted token (``replay_lookup``, the figure ``lookup_perf.py`` reports), with no static cache and
with the corpus one.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sysconfig
import time
from pathlib import Path

import numpy as np


def stdlib_tokens(n_tokens: int, vocab: int) -> np.ndarray:
    ids: dict[str, int] = {}
    out: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        for w in re.findall(r"\w+|[^\w\s]|\n", path.read_text(errors="replace")):
            out.append(ids.setdefault(w, len(ids)) % vocab)
        if len(out) >= n_tokens:
            break
    return np.array(out[:n_tokens], dtype=np.int32)


def per_step_us(make, prompt: np.ndarray, follow: np.ndarray, k: int) -> float:
    src = make()
    src.reset(prompt.tolist())
    steps = follow.tolist()
    propose, extend = src.propose, src.extend
    t0 = time.perf_counter()
    for t in steps:
        propose(k)
        extend([t])
    return 1e6 * (time.perf_counter() - t0) / len(steps)


def propose_us(make, prompt: np.ndarray, follow: np.ndarray, k: int, calls: int = 20000) -> float:
    """The fixed cost of one call: ``propose(k)`` again and again on one state (the best of 5, the
    figure least moved by other work on a shared machine)."""
    src = make()
    src.reset(prompt.tolist())
    src.extend(follow.tolist())
    propose = src.propose
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            propose(k)
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / calls


def main(argv: list[str] | None = None) -> int:
    from promptlookup.drafting.lookup.source import LookupSource
    from promptlookup.drafting.lookup.static_cache import build_static
    from promptlookup.drafting.ngram.source import NgramSource
    from promptlookup.drafting.suffix.history import History
    from promptlookup.drafting.suffix.source import SuffixSource
    from promptlookup.measure.replay_lookup import replay_lookup

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--draft", type=int, default=3)
    args = ap.parse_args(argv)

    toks = stdlib_tokens(2_000_000, args.vocab)
    corpus, text = toks[:1_500_000], toks[1_500_000:]
    static = build_static(corpus[:-2], corpus[1:-1], corpus[2:], np.ones(len(corpus) - 2, np.int64),
                          args.vocab, "0123456789abcdef")
    prompt = text[: args.context]
    follow = text[args.context : args.context + args.steps]
    hist_text = text[args.context + args.steps :]

    def with_history():
        h = History(budget=1 << 20)
        h.add(hist_text.tolist())
        return SuffixSource(history=h, n_vocab=args.vocab)

    cases = {
        "ngram": lambda: NgramSource(),
        "lookup": lambda: LookupSource(),
        "lookup+static": lambda: LookupSource(static=static),
        "suffix+history": with_history,
    }
    figures: dict[str, list[float]] = {name: [] for name in cases}
    figures.update({f"{name} propose": [] for name in cases})
    figures["replay us/drafted"] = []
    figures["replay+static us/drafted"] = []
    for _ in range(args.runs):
        for name, make in cases.items():
            per_step_us(make, prompt[:1000], follow[:200], args.draft)  # warm: compile or load caches
            figures[name].append(per_step_us(make, prompt, follow, args.draft))
            figures[f"{name} propose"].append(propose_us(make, prompt, follow, args.draft))
        for key, st in (("replay us/drafted", None), ("replay+static us/drafted", static)):
            r = replay_lookup(text[:200_000], 4096, args.draft, static=st)
            figures[key].append(1e6 * r.t_draft_s / max(1, r.n_drafted))
    print(json.dumps({k: round(statistics.median(v), 3) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
