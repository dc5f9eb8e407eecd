"""What one forward costs as sequences are batched into it (continuous batching on llama.cpp).

A scheduler that batches the verify steps of several requests into one ``llama_decode`` wins only as
far as a forward of S sequences x W tokens costs less than S forwards of W tokens. This measures, on
the bundled model (or ``--model``), the seconds of one :meth:`LlamaCppBackend.decode_many` with S
sequences of W tokens each (every sequence ``--context`` positions deep, logits for every token, as a
verify), against:

- the same S x W tokens as ONE sequence's verify on a one-sequence backend (what the forward would
  cost if the tokens were one request's: the price of the sequences being apart), and
- S separate forwards of W tokens on the one-sequence backend (serving the S requests in turn, the
  only choice without batching),

and, with ``--mixed``, sequences of alternating widths 1 and 9 (llama.cpp splits a batch over
separate KV streams into ubatches of equal tokens per sequence, so unequal widths may cost more
forwards than their tokens suggest).

Cells are interleaved within every repetition so that drift on a shared machine hits all alike;
each figure is the median over ``--repeats``. Wall time by default; ``--cpu-time`` (with ``-t 1``)
times the work done on a loaded machine instead of the wait for a core.

    python benchmarks/batch_cost.py -t 1
    python benchmarks/batch_cost.py -t 2 --repeats 9 --mixed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"want positive integers, got {text!r}")
    return vals


def filler(seq: int, n: int) -> list[int]:
    """Distinct ordinary token ids per sequence (the cost does not depend on which)."""
    return [100 + (seq * 37 + 11 * i) % 5000 for i in range(n)]


def measure(args: argparse.Namespace) -> tuple[dict, int]:
    """Median seconds per cell: ``(S, widths) -> (batched, one sequence, S separate)``."""
    from promptlookup.backends.base import SeqDecode
    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.models import bundled_model_path

    clock: Callable[[], float] = time.process_time if args.cpu_time else time.perf_counter
    model = args.model or bundled_model_path()
    n_seq = max(args.seqs)
    cells: list[tuple[int, tuple[int, ...]]] = [(s, (w,) * s) for s in args.seqs for w in args.widths]
    if args.mixed:
        cells += [(s, tuple(1 if i % 2 == 0 else 9 for i in range(s))) for s in args.seqs if s > 1]
    longest = max(sum(ws) for _, ws in cells)
    widest = max(max(ws) for _, ws in cells)
    many = LlamaCppBackend(model, n_ctx=args.context + widest, n_threads=args.threads, n_seq=n_seq)
    one = LlamaCppBackend(model, n_ctx=args.context + longest, n_threads=args.threads,
                          n_batch=max(512, longest))
    contexts = [filler(s, args.context) for s in range(n_seq)]
    many.decode_many([SeqDecode(s, contexts[s], "none") for s in range(n_seq)])
    one.prefill(contexts[0])

    def batched(ws: tuple[int, ...]) -> float:
        parts = [SeqDecode(s, filler(s + 1, w)) for s, w in enumerate(ws)]
        t0 = clock()
        many.decode_many(parts)
        dt = clock() - t0
        for s in range(len(ws)):
            many.seq_rollback(s, args.context)
        return dt

    def alone(n: int) -> float:
        ids = filler(1, n)
        t0 = clock()
        one.verify(ids)
        dt = clock() - t0
        one.rollback(args.context)
        return dt

    widths = sorted({w for _, ws in cells for w in ws})
    samples: dict = {c: ([], []) for c in cells}
    single: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(args.repeats + 1):  # the first round warms every kernel path up, unrecorded
        for cell in cells:
            b, o = batched(cell[1]), alone(sum(cell[1]))
            if rep:
                samples[cell][0].append(b)
                samples[cell][1].append(o)
        for w in widths:
            t = alone(w)
            if rep:
                single[w].append(t)
    med_single = {w: statistics.median(v) for w, v in single.items()}
    out = {}
    for (s, ws), (b, o) in samples.items():
        out[(s, ws)] = (statistics.median(b), statistics.median(o), sum(med_single[w] for w in ws))
    threads = many.n_threads
    many.close()
    one.close()
    return out, threads


def table(results: dict) -> str:
    head = ("| seqs | tokens/seq | tokens | one forward, ms | ms/token | same tokens as one seq, ms | "
            "batched / one seq | seqs apart (S forwards), ms | speed-up over apart |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (s, ws), (b, o, apart) in results.items():
        width = str(ws[0]) if len(set(ws)) == 1 else "/".join(str(w) for w in sorted(set(ws))) + " mixed"
        n = sum(ws)
        lines.append(f"| {s} | {width} | {n} | {b * 1e3:.2f} | {b * 1e3 / n:.3f} | {o * 1e3:.2f} | "
                     f"{b / o:.2f} | {apart * 1e3:.2f} | {apart / b:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=1, help="CPU threads (default 1)")
    ap.add_argument("--seqs", type=_ints, default=[1, 2, 4, 8, 16],
                    help="sequence counts (default 1,2,4,8,16)")
    ap.add_argument("--widths", type=_ints, default=[1, 2, 4, 9],
                    help="tokens per sequence (default 1,2,4,9)")
    ap.add_argument("--context", type=int, default=128, help="cached positions per sequence (default 128)")
    ap.add_argument("--repeats", type=int, default=7, help="repetitions; the median is kept (default 7)")
    ap.add_argument("--mixed", action="store_true", help="also sequences of alternating widths 1 and 9")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by process CPU time, not wall time (a loaded machine; use with -t 1)")
    ap.add_argument("--model", default=None, help="a GGUF (default: the bundled model)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.context < 1 or args.threads < 1:
        ap.error("--repeats, --context and --threads must be positive")
    results, threads = measure(args)
    clock = "CPU time" if args.cpu_time else "wall time"
    print(f"one llama_decode of S sequences x W tokens (logits for all), {args.context} cached per sequence, "
          f"-t {threads}, {clock}, median of {args.repeats}\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
