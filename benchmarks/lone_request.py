"""What a lone request pays for batching: ``Engine(parallel=1)`` against ``Engine(parallel=N)``.

Issue 24 asks that one client be served no slower with continuous batching than before it. In the
server benchmark (``serve_batch.py``) one client got 53-56 tok/s from ``--parallel 4`` / ``16`` and
66 from ``--parallel 1`` in one pass; that figure mixes HTTP, the slot choice and noise. This takes
the server away: the same requests, one at a time, on engines with 1 and N slots loaded side by side
in one process, interleaved request by request (so a machine that drifts drifts under both), with
``auto`` and with ``off`` (the difference between those two rows is speculation's, the rest is the
batching path's: the pricing, N KV streams, prompt chunks). Per cell: tok/s
over every request (generated tokens / wall), prefill and decode seconds, verify decodes, drafted
and accepted tokens.

    python benchmarks/lone_request.py -t 2 [--parallel 4] [--passes 3] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_batch import request  # noqa: E402  (the server benchmark's requests: copy-heavy and prose)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-c", "--ctx", type=int, default=2048, help="context per sequence (default 2048)")
    p.add_argument("--parallel", type=int, default=4, help="slots of the batching engine (default 4)")
    p.add_argument("--requests", type=int, default=8, help="requests per pass (default 8, alternating kinds)")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--speculate", default="auto,off", help="settings to compare (default auto,off)")
    a = p.parse_args(argv)
    if a.parallel < 2 or a.passes < 1 or a.requests < 1:
        p.error("--parallel must be at least 2, --passes and --requests at least 1")
    from promptlookup.api import Engine

    engines = {1: Engine(n_ctx=a.ctx, threads=a.threads, parallel=1),
               a.parallel: Engine(n_ctx=a.ctx, threads=a.threads, parallel=a.parallel)}
    bodies = [request(i, a.max_tokens) for i in range(a.requests)]
    for body in bodies[:2]:  # untimed: load every kernel, measure auto's curve, fill the caches alike
        for e in engines.values():
            e.chat(body["messages"], max_tokens=8, temperature=0)
    specs = [s.strip() for s in a.speculate.split(",") if s.strip()]
    cells = {(n, s): [] for n in engines for s in specs}
    for k in range(a.passes):
        for i, body in enumerate(bodies):
            order = list(cells) if (k + i) % 2 == 0 else list(reversed(cells))
            for n, s in order:
                t0 = time.perf_counter()
                out = engines[n].chat(body["messages"], max_tokens=a.max_tokens, temperature=0, speculate=s)
                wall = time.perf_counter() - t0
                c = out.counters
                cells[(n, s)].append((wall, c.generated_tokens, c.prefill_s, c.decode_s, c.decodes,
                                      c.drafted_tokens, c.accepted_tokens, c.cached_tokens))
        print(f"# pass {k + 1} of {a.passes} done", file=sys.stderr)
    print(f"\n{platform.processor() or platform.machine()}, -t {a.threads}, ctx {a.ctx} per sequence, "
          f"{a.requests} requests x {a.passes} passes, {a.max_tokens} tokens, one at a time\n")
    print("| engine | speculate | tok/s (median pass) | prefill s | decode s | verify decodes | drafted | "
          "accepted | cached prompt tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    n_req = a.requests
    for (n, s), rows in cells.items():
        per_pass = [rows[i * n_req:(i + 1) * n_req] for i in range(a.passes)]
        rates = [sum(r[1] for r in pp) / sum(r[0] for r in pp) for pp in per_pass]
        tot = [sum(r[j] for r in rows) / a.passes for j in range(8)]
        each = ", ".join(f"{x:.1f}" for x in rates)
        print(f"| parallel {n} | {s} | {statistics.median(rates):.1f} ({each}) "
              f"| {tot[2]:.2f} | {tot[3]:.2f} | {tot[4]:.0f} | {tot[5]:.0f} | {tot[6]:.0f} | {tot[7]:.0f} |")
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
