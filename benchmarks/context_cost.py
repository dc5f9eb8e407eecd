"""What a larger allocated context costs a short run (backends/context_size.py, docs/cli.md).

Why: the default context is the model's training context (32768 on the Qwen models) where it was
4096. llama.cpp allocates the whole KV cache at load; this measures whether that slows a short run or
only takes memory, on contexts given with ``-c`` (default 4096 and 32768):

- resident memory after loading, and after a short generate, each context in a fresh process;
- loading time, and a 32-token decode (ms a token) after a short prompt, and a prefill of
  ``--prefill`` tokens, with both contexts loaded in one process and timed in turn (alternating which
  goes first), so drift on a shared machine hits both alike; medians over ``--repeats``.

    python benchmarks/context_cost.py -m qwen2.5-coder-0.5b -t 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a Python function that returns the sum of the squares of a list of integers."


def rss_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def one(model: str, n_ctx: int, threads: int) -> None:
    """In a fresh process: RSS after loading and after a 16-token generate, one line."""
    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.models import resolve_model

    b = LlamaCppBackend(resolve_model(model), n_ctx=n_ctx, n_threads=threads)
    loaded = rss_mib()
    tok = b.prefill(b.tokenize(PROMPT))
    for _ in range(16):
        tok = b.verify([tok])[0]
    print(f"n_ctx {n_ctx}: RSS {loaded} MiB after loading, {rss_mib()} MiB after a 16-token generate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-c", "--contexts", default="4096,32768", help="comma-separated contexts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=256, help="prompt tokens to prefill")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child's mode
    args = ap.parse_args()
    if args.one:
        one(args.model, args.one, args.threads)
        return
    ctxs = [int(c) for c in args.contexts.split(",")]
    for c in ctxs:
        out = subprocess.run([sys.executable, __file__, "-m", args.model, "-t", str(args.threads),
                              "--one", str(c)], capture_output=True, text=True, check=True).stdout
        print(out.strip(), flush=True)

    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.models import resolve_model

    path = resolve_model(args.model)
    load: dict[int, list[float]] = {c: [] for c in ctxs}
    for r in range(args.repeats):
        for c in ctxs if r % 2 == 0 else ctxs[::-1]:
            t0 = time.perf_counter()
            LlamaCppBackend(path, n_ctx=c, n_threads=args.threads).close()
            load[c].append(time.perf_counter() - t0)
    backends = {c: LlamaCppBackend(path, n_ctx=c, n_threads=args.threads) for c in ctxs}
    first = backends[ctxs[0]]
    short = first.tokenize(PROMPT)
    long = (first.tokenize(Path(__file__).read_text(encoding="utf-8")) * 8)[: args.prefill]
    decode: dict[int, list[float]] = {c: [] for c in ctxs}
    prefill: dict[int, list[float]] = {c: [] for c in ctxs}
    for r in range(args.repeats):
        for c in ctxs if r % 2 == 0 else ctxs[::-1]:
            b = backends[c]
            b.rollback(0)
            tok = b.prefill(short)
            t0 = time.perf_counter()
            for _ in range(32):
                tok = b.verify([tok])[0]
            decode[c].append((time.perf_counter() - t0) / 32 * 1000)
            b.rollback(0)
            t0 = time.perf_counter()
            b.prefill(long)
            prefill[c].append(time.perf_counter() - t0)
    for c in ctxs:
        print(f"n_ctx {c}: load {statistics.median(load[c]):.2f} s, decode "
              f"{statistics.median(decode[c]):.1f} ms/token (min {min(decode[c]):.1f}), prefill of "
              f"{len(long)} tokens {statistics.median(prefill[c]):.2f} s (min {min(prefill[c]):.2f}); "
              f"medians of {args.repeats}")


if __name__ == "__main__":
    main()
