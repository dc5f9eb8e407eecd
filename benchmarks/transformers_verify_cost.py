"""The transformers backend's verify cost curve with and without padding short verify batches.

Why: on a CPU the cost of one forward is not monotone in its width (some widths hit a slow matmul
path), so ``TransformersBackend`` pads such verifies to a cheaper width. This measures both curves
on the loaded model, alternating the two settings so drift hits both alike, and prints the table
that the backend's docstring quotes. Run it under the bench lock::

    flock /tmp/pl-bench.lock .venv/bin/python benchmarks/transformers_verify_cost.py

Not run in CI (it needs torch and takes about a minute).
"""

from __future__ import annotations

import argparse
import statistics

from promptlookup.backends.costs import measure_cost_curve
from promptlookup.backends.models import bundled_model_path
from promptlookup.backends.transformers import DEFAULT_PAD_TO, TransformersBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="GGUF file or model directory (default: the bundled model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of padded and unpadded curves")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each width inside one curve")
    ap.add_argument("--context", type=int, default=128, help="cached tokens before each verify")
    args = ap.parse_args()

    tb = TransformersBackend(args.model or bundled_model_path(), n_ctx=2048, n_threads=args.threads)
    settings = {"plain": {}, "padded": dict(DEFAULT_PAD_TO)}
    curves: dict[str, list[tuple[float, ...]]] = {k: [] for k in settings}
    for _ in range(args.rounds):
        for name, pad in settings.items():
            tb.pad_to = pad
            curves[name].append(measure_cost_curve(tb, args.max_tokens, args.reps, args.context).seconds)
    widths = range(1, args.max_tokens + 1)
    print(f"verify cost (ms), median of {args.rounds} curves x {args.reps} reps, {args.threads} threads, "
          f"{args.context} cached tokens; padding {dict(DEFAULT_PAD_TO)}")
    print("| width | " + " | ".join(str(w) for w in widths) + " |")
    print("|---" * (args.max_tokens + 1) + "|")
    for name, runs in curves.items():
        cells = [statistics.median(run[w - 1] for run in runs) * 1000 for w in widths]
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    for name, runs in curves.items():
        cells = [min(run[w - 1] for run in runs) * 1000 for w in widths]
        print(f"| {name} (best) | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
