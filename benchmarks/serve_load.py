"""Latency of ``promptlookup serve`` under concurrent streaming clients (docs/server.md's figures).

Starts ``promptlookup serve`` on a free port (or uses ``--url``), then runs the same requests twice:
one client at a time, and ``--clients`` clients at once, each sending ``--requests`` streaming chat
requests (small edits of one Python snippet, the kind of request prompt lookup speeds up). Prints a
markdown table: requests/s, generated tokens/s, time to first token and end-to-end latency (p50,
p95, max) per phase. One model context serves one request at a time, so under load a request's
latency is mostly its wait in the queue.

    .venv/bin/python benchmarks/serve_load.py -t 2 --clients 16 --requests 4 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SNIPPET = '''def area(width, height):
    """Area of a rectangle."""
    return width * height


def perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)
'''
EDITS = ["rename width to w", "rename height to h", "add type hints", "rename area to rect_area",
         "rename perimeter to rect_perimeter", "make the docstrings end without a period",
         "rename width to x", "rename height to y"]


def prompt(i: int) -> str:
    edit = EDITS[i % len(EDITS)]
    return f"Here is a Python file:\n\n```python\n{SNIPPET}```\n\nRewrite the whole file and {edit}."


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "promptlookup", "serve", "--port", "0", "-c", str(args.ctx),
           "--max-queue", str(max(64, args.clients)), *(["-t", str(args.threads)] if args.threads else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("promptlookup serve: listening on "):
            return proc, line.rsplit(" ", 1)[1].strip()
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def one(client: httpx.Client, i: int, args: argparse.Namespace) -> dict:
    body = {"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if args.speculate:
        body["speculate"] = args.speculate
    t0 = time.monotonic()
    ttft, tokens = None, 0
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if ttft is None and any(c.get("delta", {}).get("content") for c in obj.get("choices") or ()):
                ttft = time.monotonic() - t0
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return {"ttft": ttft or 0.0, "e2e": time.monotonic() - t0, "tokens": tokens}


def phase(url: str, clients: int, requests: int, args: argparse.Namespace) -> tuple[list[dict], float]:
    def run(k: int) -> list[dict]:
        with httpx.Client(base_url=url, timeout=600) as c:
            return [one(c, k * requests + j, args) for j in range(requests)]

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        out = [r for rs in pool.map(run, range(clients)) for r in rs]
    return out, time.monotonic() - t0


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank; NaN when there is none: every request failed)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def row(name: str, rs: list[dict], wall: float) -> str:
    t, e = [r["ttft"] for r in rs], [r["e2e"] for r in rs]
    tok = sum(r["tokens"] for r in rs)
    return (f"| {name} | {len(rs)} | {wall:.1f} | {len(rs) / wall:.2f} | {tok / wall:.1f} | "
            f"{statistics.median(t):.2f} / {pct(t, 0.95):.2f} / {max(t):.2f} | "
            f"{statistics.median(e):.2f} / {pct(e, 0.95):.2f} / {max(e):.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("-t", "--threads", type=int, help="server threads")
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--speculate", help="the requests' speculate field (default: the server's)")
    args = ap.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    try:
        with httpx.Client(base_url=url, timeout=600) as c:
            one(c, 0, args)  # warm-up (auto's first request, page cache)
        seq, seq_wall = phase(url, 1, args.clients * args.requests // 4 or 1, args)
        conc, conc_wall = phase(url, args.clients, args.requests, args)
        print(f"server {url}; {args.clients} clients x {args.requests} streaming requests, max_tokens "
              f"{args.max_tokens}, speculate {args.speculate or 'server default'}\n")
        print("| phase | requests | wall s | req/s | tok/s | TTFT p50 / p95 / max s "
              "| e2e p50 / p95 / max s |")
        print("|---|---|---|---|---|---|---|")
        print(row("one client at a time", seq, seq_wall))
        print(row(f"{args.clients} clients at once", conc, conc_wall))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
