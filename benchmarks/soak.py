"""A soak of the default server: many streaming clients for a long while, a share of them hanging up
mid-answer, tool calls and json_schema answers mixed in (issue 42's check; not run in CI).

Starts ``promptlookup serve`` (its defaults: continuous batching on 16 slots, ``auto``) on a free
127.0.0.1 port, on the bundled model with a Hermes tool template (``tests/tool_gguf.py``; ``-m`` for
another), then:

1. **Reference**: every request of a fixed pool (``--pool``, default 24: code edits that copy the
   prompt, prose, forced and free tool calls, json_schema answers; temperature 0) sent alone, one
   after another, streamed; what each answered (content, tool calls, finish reason) is its reference.
2. **Soak**: ``--clients`` (16) threads for ``--minutes`` (30), each sending random requests of the
   pool one after another; a quarter of the streams (``--drop``) are closed by the client after a
   random number of chunks. Every answer that completes must equal its reference; every status is
   counted (a 5xx is a failure, a 503 with ``Retry-After`` is a refusal the client waits out).
3. **Memory**: the server's resident set (``/proc/PID/status`` ``VmRSS``) is sampled every
   ``--sample`` seconds, with the sizes ``/metrics`` gives of the two stores that grow with requests
   by design, each up to its budget: the suffix history (``promptlookup:suffix_history_bytes``,
   ``--suffix-history-budget``, 1M tokens by default) and the slots' lookup dynamic caches
   (``promptlookup:lookup_dynamic_bytes``, ``--lookup-budget``; pass ``--server-arg`` to change
   either). Printed: the resident set's growth from the end of the warm-up (``--warm-up`` minutes) to
   the end, and that growth less what those stores grew meanwhile, which must stay under
   ``--rss-growth`` (5%): more than that is memory nothing accounts for. ``--varied`` makes the edits
   and prose about a different piece of real code each, so the sources keep learning new text.

It prints a summary and exits 1 when any answer differed, any 5xx came back, or memory grew too
much. It stops by itself after the soak (the server is stopped too) and talks only to 127.0.0.1.

    .venv/bin/python benchmarks/soak.py -t 2 --clients 16 --minutes 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SNIPPET = '''def area(width, height):
    """Area of a rectangle."""
    return width * height


def perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)
'''
EDITS = ["rename width to w", "add type hints", "rename area to rect_area", "make the docstrings shorter"]
THINGS = ["lighthouse", "kettle", "lost key", "paper boat"]
READ = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": READ}},
         {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "languages"], "additionalProperties": False}


def stdlib_excerpts(n: int, chars: int = 1200) -> list[str]:
    """``n`` distinct pieces of real code: the opening ``chars`` of the Python installation's sources
    (what ``--varied`` edits and explains, so no two requests share their text)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    texts = [t for t in (f.read_text(errors="replace")[:chars] for f in files) if len(t) == chars]
    if len(texts) < n:
        raise SystemExit(f"soak: --varied needs {n} sources of {chars} characters, found {len(texts)}")
    return texts[:n]


def pool(n: int, max_tokens: int, varied: bool = False) -> list[dict]:
    """``n`` requests, cycling through five kinds: an edit, prose, a forced tool call, a free one, a
    json_schema answer. ``varied``: the edits and the prose are about a different piece of real code
    each (the stdlib's sources), so the slots' sources keep meeting text they have not seen."""
    out = []
    code = stdlib_excerpts(n) if varied else []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            edit = EDITS[i % len(EDITS)]
            source = code[i] if varied else SNIPPET
            text = f"Here is a Python file:\n\n```python\n{source}```\n\nRewrite it and {edit}."
            body: dict = {"messages": [{"role": "user", "content": text}]}
        elif kind == 1 and varied:
            text = f"Explain what this code does:\n\n```python\n{code[i]}```"
            body = {"messages": [{"role": "user", "content": text}]}
        elif kind == 1:
            story = f"Write a short story about a {THINGS[i % len(THINGS)]}."
            body = {"messages": [{"role": "user", "content": story}]}
        elif kind in (2, 3):
            ask = "Read the file setup.py." if i % 2 else "What is the weather in Oslo, in celsius?"
            body = {"messages": [{"role": "user", "content": ask}], "tools": TOOLS,
                    "tool_choice": "required" if kind == 2 else "auto"}
        else:
            ask = f"Invent person number {i}: name, age, languages."
            body = {"messages": [{"role": "user", "content": ask}],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": PERSON}}}
        out.append({**body, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    return out


@dataclass
class Answer:
    status: int = 0
    content: str = ""
    calls: list = field(default_factory=list)
    finish: str | None = None
    dropped: bool = False
    error: str = ""

    def key(self) -> tuple:
        return self.content, json.dumps(self.calls, sort_keys=True), self.finish


def stream(client: httpx.Client, url: str, body: dict, drop_after: int | None) -> Answer:
    """One streamed chat completion; closed by the client after ``drop_after`` chunks when given."""
    a = Answer()
    calls: dict[int, dict] = {}
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            a.status = r.status_code
            if r.status_code != 200:
                r.read()
                a.error = r.text[:200]
                return a
            n = 0
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    a.error = json.dumps(obj["error"])[:200]
                    return a
                for ch in obj.get("choices", ()):
                    delta = ch.get("delta", {})
                    a.content += delta.get("content") or ""
                    for tc in delta.get("tool_calls") or ():
                        c = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                        fn = tc.get("function", {})
                        c["name"] += fn.get("name") or ""
                        c["arguments"] += fn.get("arguments") or ""
                    a.finish = ch.get("finish_reason") or a.finish
                n += 1
                if drop_after is not None and n >= drop_after:
                    a.dropped = True
                    return a  # leaving the block closes the connection mid-answer
    except httpx.HTTPError as exc:
        a.error = f"{type(exc).__name__}: {exc}"[:200]
    a.calls = [calls[k] for k in sorted(calls)]
    return a


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "promptlookup", "serve", "--port", "0", "--host", "127.0.0.1",
           *(["-m", args.model] if args.model else []), *(["-t", str(args.threads)] if args.threads else []),
           *args.server_arg]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("promptlookup serve: listening on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, line.rsplit(" ", 1)[1].strip()
    raise SystemExit(f"soak: the server did not start (exit {proc.wait()})")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# the stores that grow with requests by design, each up to its budget (the server's /metrics gauges)
BY_DESIGN = ("promptlookup:suffix_history_bytes", "promptlookup:lookup_dynamic_bytes")


def bytes_by_design(client: httpx.Client, url: str) -> tuple[int, ...]:
    """The bytes each store of :data:`BY_DESIGN` holds, from the server's /metrics (0 where unread)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = client.get(url + "/metrics").text
    except httpx.HTTPError:
        return (0,) * len(BY_DESIGN)
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return tuple(int(values.get(name, 0)) for name in BY_DESIGN)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", help="model name or GGUF with a tool template (default: the bundled one "
                                         "with a Hermes template, tests/tool_gguf.py: the bundled template "
                                         "cannot show tools)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warm-up", type=float, default=2.0, help="minutes before memory is measured (default 2)")
    p.add_argument("--pool", type=int, default=24, help="distinct requests (default 24)")
    p.add_argument("--varied", action="store_true",
                   help="edits and prose about a different piece of the stdlib's code each (use a larger "
                        "--pool, e.g. 200: each is sent alone first for its reference)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--drop", type=float, default=0.25, help="share of streams closed mid-answer")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples")
    p.add_argument("--rss-growth", type=float, default=0.05, help="most memory growth after warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more argument for promptlookup serve (repeat; e.g. --server-arg=--parallel=8)")
    args = p.parse_args(argv)
    if args.clients < 1 or args.minutes <= 0 or not 0 <= args.drop <= 1:
        p.error("--clients must be at least 1, --minutes above 0, --drop in 0..1")
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tool_gguf import hermes_gguf

        args.model = str(hermes_gguf())
    requests = pool(args.pool, args.max_tokens, args.varied)
    proc, url = start_server(args)
    timeout = httpx.Timeout(600.0, connect=10.0)
    try:
        with httpx.Client(timeout=timeout) as client:
            t0 = time.monotonic()
            refs = []
            for i, body in enumerate(requests):
                a = stream(client, url, body, None)
                if a.status != 200 or a.error:
                    raise SystemExit(f"soak: reference request {i} failed: {a.status} {a.error}")
                refs.append(a.key())
            print(f"# soak: {len(refs)} references in {time.monotonic() - t0:.0f} s", flush=True)

        stats = {"completed": 0, "dropped": 0, "differed": 0, "5xx": 0, "refused": 0, "errors": 0}
        lock = threading.Lock()
        end = time.monotonic() + 60 * args.minutes
        samples: list[tuple[float, int, tuple[int, ...]]] = []  # (seconds, RSS KiB, BY_DESIGN bytes)
        start = time.monotonic()

        every = max(1, round(60 / args.sample))

        def sampler() -> None:
            with httpx.Client(timeout=timeout) as metrics:
                while time.monotonic() < end:
                    held = bytes_by_design(metrics, url)
                    samples.append((time.monotonic() - start, rss_kib(proc.pid), held))
                    if len(samples) % every == 0:  # a line a minute, so a long soak shows it is alive
                        t, kib, _ = samples[-1]
                        with lock:
                            counts = " ".join(f"{k} {v}" for k, v in stats.items())
                        print(f"# {t / 60:.0f} min: {counts}; RSS {kib / 1024:.0f} MiB, suffix history "
                              f"{held[0] / 2**20:.0f} MiB, lookup dynamic caches {held[1] / 2**20:.1f} MiB",
                              flush=True)
                    time.sleep(args.sample)

        def client_loop(c: int) -> None:
            rng = random.Random(args.seed * 1000 + c)
            with httpx.Client(timeout=timeout) as client:
                while time.monotonic() < end:
                    i = rng.randrange(len(requests))
                    drop = rng.randint(1, 12) if rng.random() < args.drop else None
                    a = stream(client, url, requests[i], drop)
                    with lock:
                        if a.status >= 500 and a.status != 503:
                            stats["5xx"] += 1
                        elif a.status == 503:
                            stats["refused"] += 1
                        elif a.error:
                            stats["errors"] += 1
                        elif a.dropped:
                            stats["dropped"] += 1
                        else:
                            stats["completed"] += 1
                            if a.key() != refs[i]:
                                stats["differed"] += 1
                    if a.status == 503:
                        time.sleep(1.0)

        threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(args.clients)]
        watcher = threading.Thread(target=sampler, daemon=True)
        watcher.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    after = [(kib, held) for t, kib, held in samples if t >= 60 * args.warm_up]
    growth = unaccounted = 0.0
    print(f"# soak: {args.clients} clients, {args.minutes:g} min, drop {args.drop:.0%}, pool {args.pool}"
          f"{' varied' if args.varied else ''}")
    print(" ".join(f"{k} {v}" for k, v in stats.items()))
    if len(after) >= 2 and after[0][0]:
        (rss0, held0), (rss1, held1) = after[0], after[-1]
        growth = (rss1 - rss0) / rss0
        unaccounted = (rss1 - rss0 - (sum(held1) - sum(held0)) / 1024) / rss0
        print(f"RSS after warm-up: {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB "
              f"(max {max(k for k, _ in after) / 1024:.0f}), growth {growth:+.1%} over {len(after)} samples")
        print(f"suffix history: {held0[0] / 2**20:.0f} -> {held1[0] / 2**20:.0f} MiB held; lookup dynamic "
              f"caches: {held0[1] / 2**20:.1f} -> {held1[1] / 2**20:.1f} MiB (max "
              f"{max(h[1] for _, h in after) / 2**20:.1f}); RSS growth less theirs: {unaccounted:+.1%}")
    ok = (stats["differed"] == 0 and stats["5xx"] == 0 and stats["errors"] == 0
          and unaccounted < args.rss_growth)
    print("soak: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
