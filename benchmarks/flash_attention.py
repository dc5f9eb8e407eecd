"""Flash attention on against off, same build, same process, interleaved (docs/exactness.md).

Why: set-up's invariant build patches ggml's CPU flash attention to take one reduction path for
every batch shape (promptlookup.llama_build.recipe), so the backend turns it on by default there. Upstream's
other two paths (a KV split for one query row over 512+ cells, 64-row tiles for prefills) are what
would have made it fast for long contexts and prompts; this measures what the one path costs or
saves against attention without it, on the shapes a server runs:

- a prompt prefill (``--prompt`` tokens in ``n_batch`` chunks),
- a one-token decode and a 9-token verify at a shallow and a deep position (``--depths``; 512+
  cells is where upstream would have split the KV),
- one step of 4 sequences x 1 token and 4 x 4 (continuous batching on separate KV streams).

Each repetition runs every cell with flash attention on, then off (alternating which goes first),
so drift on a shared machine hits both alike; each figure is the median over ``--repeats``.

    python benchmarks/flash_attention.py -t 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable


def filler(seq: int, n: int) -> list[int]:
    """Distinct ordinary token ids (the cost does not depend on which)."""
    return [100 + (seq * 37 + 11 * i) % 5000 for i in range(n)]


def cells(backend, batch, depths: list[int], prompt: int, seqs: int) -> dict[str, Callable[[], float]]:
    """Name -> a function that runs the cell once and returns its seconds (state restored after)."""
    from promptlookup.backends.base import SeqDecode

    def prefill() -> float:
        backend.rollback(0)
        t0 = time.perf_counter()
        backend.prefill(filler(0, prompt))
        return time.perf_counter() - t0

    def verify(depth: int, n: int):
        def run() -> float:
            if backend.n_past != depth:
                backend.rollback(0)
                backend.prefill(filler(0, depth))
            t0 = time.perf_counter()
            backend.verify(filler(1, n))
            dt = time.perf_counter() - t0
            backend.rollback(depth)
            return dt
        return run

    def step(width: int):
        def run() -> float:
            parts = [SeqDecode(s, filler(s + 1, width)) for s in range(seqs)]
            t0 = time.perf_counter()
            batch.decode_many(parts)
            dt = time.perf_counter() - t0
            for s in range(seqs):
                batch.seq_rollback(s, 128)
            return dt
        return run

    out = {f"prefill {prompt} tokens": prefill}
    for d in depths:
        out[f"decode 1 token at {d}"] = verify(d, 1)
        out[f"verify 9 tokens at {d}"] = verify(d, 9)
    out[f"{seqs} seqs x 1 token at 128"] = step(1)
    out[f"{seqs} seqs x 4 tokens at 128"] = step(4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--depths", default="128,700", help="cached positions for the decode cells")
    ap.add_argument("--prompt", type=int, default=1000, help="prefill length (default 1000)")
    ap.add_argument("--seqs", type=int, default=4, help="sequences in the batched cells (default 4)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--model", default=None)
    a = ap.parse_args(argv)
    try:
        depths = [int(x) for x in a.depths.split(",")]
    except ValueError:
        ap.error(f"--depths wants comma-separated integers, got {a.depths!r}")
    if a.repeats < 1 or a.threads < 1 or a.prompt < 1 or a.seqs < 1 or min(depths) < 1:
        ap.error("--repeats, --threads, --prompt, --seqs and --depths must be positive")

    import llama_cpp

    from promptlookup.backends.base import SeqDecode
    from promptlookup.backends.llama_cpp import LlamaCppBackend, one_path_flash_attention, system_info
    from promptlookup.backends.models import bundled_model_path

    model = a.model or bundled_model_path()
    info = system_info(llama_cpp)
    if not one_path_flash_attention(info):
        print("flash_attention: note: this build is not set-up's patched invariant build; its flash "
              "attention is upstream's (not batch-invariant)", file=sys.stderr)
    n_ctx = max(a.prompt, max(depths) + 9)
    runs = {}
    for fa in (True, False):
        single = LlamaCppBackend(model, n_ctx=n_ctx, n_threads=a.threads, flash_attention=fa)
        batch = LlamaCppBackend(model, n_ctx=256, n_threads=a.threads, n_seq=a.seqs, flash_attention=fa)
        batch.decode_many([SeqDecode(s, filler(s, 128), "none") for s in range(a.seqs)])
        runs[fa] = (single, batch, cells(single, batch, depths, a.prompt, a.seqs))
    names = list(runs[True][2])
    times: dict[tuple[bool, str], list[float]] = {(fa, n): [] for fa in runs for n in names}
    for rep in range(a.repeats + 1):  # the first round warms every path up, unrecorded
        order = (True, False) if rep % 2 else (False, True)
        for name in names:
            for fa in order:
                dt = runs[fa][2][name]()
                if rep:
                    times[(fa, name)].append(dt)
    threads = runs[True][0].n_threads
    for single, batch, _ in runs.values():
        single.close()
        batch.close()
    build = "patched: one path" if one_path_flash_attention(info) else "upstream"
    print(f"flash attention on / off, same build ({build}), -t {threads}, median of {a.repeats} (ms)\n")
    print("| cell | on, ms | off, ms | on / off |")
    print("|---|---|---|---|")
    for name in names:
        on, off = (statistics.median(times[(fa, name)]) for fa in (True, False))
        print(f"| {name} | {on * 1e3:.1f} | {off * 1e3:.1f} | {on / off:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
