"""Many users at once: OpenAI-compatible servers under 1, 4 and 16 concurrent streaming clients, side by
side in one run (issue 24's benchmark; not run in CI).

The workload: ``--requests`` (16) streaming chat requests per concurrency level, shared out among the
clients (client ``c`` of ``N`` sends requests ``c``, ``c + N``, ... one after another), half of each of
two kinds: copy-heavy (rewrite a short Python file with one small edit: the answer copies the prompt,
where prompt lookup pays) and prose (a short story about a thing: nothing to copy). ``--mix
alternate`` (the default): each client alternates the kinds. ``--mix blocks``: request ``i`` is
copy-heavy when ``i`` is even, the layout of every table before 2026-12-02 12:00 UTC, which with an
even number of clients gives each client one kind only: where speculation speeds the copy-heavy
requests, their clients finish early and the prose clients' tail runs with half the batch, so the
level's tokens per second measures the tail. Each pass prints when the first and the last client
finished. ``--max-tokens`` 128, temperature 0.

Rows (``--rows``, in that order; for each level a fresh server is started as a subprocess on a free
127.0.0.1 port, warmed up by one tiny untimed request, used, and stopped: no level drafts from, or
reuses the cache of, another level's requests):

- ``ours``         ``promptlookup serve`` as shipped (continuous batching, ``--parallel`` default, auto)
- ``ours-off``     the same, ``--speculate off``
- ``ours-fifo``    ``--parallel 1``: one request at a time, as before continuous batching
- ``ours-nofa``    ``ours`` with flash attention off (``PROMPTLOOKUP_FLASH_ATTENTION=off``)
- ``ours-npN`` / ``ours-npN-off``     ``--parallel N`` (any N), auto / ``--speculate off``
- ``base`` / ``base-off``   ``ours`` / ``ours-off`` run from another source tree (``--base-src DIR``: a
                   checkout of an older commit, the code a change is measured against in the same run)
- ``ls-npN``       llama-server ``-np N`` (any N; continuous batching), plain; built from the same
                   llama.cpp with its own default kernels (``--llama-kernels``)
- ``ls-npN-spec``  the same with its n-gram drafting (``--spec-default``)
- ``lcp``          llama-cpp-python's server (one request at a time; ``--interrupt_requests false``, since by
                   default a new request cuts the running answer short)

Within a level the rows take turns, ``--repeat`` passes (rotated each pass), so a machine whose
speed drifts over minutes drifts under every row alike; the table gives each row's median.

Per row and level: total generated tokens per second (all tokens over the level's wall time), time to
first token and end-to-end latency, p50 and p95, errors. Every server gets the same threads and
context per sequence (llama-server's ``-c`` is the total, split among its slots, so it gets
``ctx * np``).

    .venv/bin/python benchmarks/serve_batch.py -t 2
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import pct  # noqa: E402
from serve_session import RowSpec, Server, machine_line, parse_stream  # noqa: E402

SNIPPET = '''def area(width, height):
    """Area of a rectangle."""
    return width * height


def perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)


def diagonal(width, height):
    """Length of the diagonal of a rectangle."""
    return (width ** 2 + height ** 2) ** 0.5
'''
EDITS = ["rename width to w", "rename height to h", "add type hints", "rename area to rect_area",
         "rename perimeter to rect_perimeter", "make the docstrings end without a period",
         "rename width to x", "rename height to y"]
THINGS = ["lighthouse", "fox", "river", "clock", "garden", "train", "violin", "mountain"]
# the untimed first request of every server: nothing the timed requests ask
WARM_UP = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0,
           "stream": True}
ROWS = ("ours", "ours-off", "ours-fifo", "ours-nofa", "ours-np4", "ours-np8", "ours-np8-off", "ls-np4",
        "ls-np8", "ls-np4-spec", "ls-np8-spec", "lcp")
ROW_NP = re.compile(r"(ours|ls)-np([1-9][0-9]*)(-off|-spec)?")
OUR_SRC = Path(__file__).resolve().parents[1] / "src"


MIXES = ("alternate", "blocks")


def client_requests(c: int, clients: int, requests: int, mix: str) -> list[tuple[int, bool]]:
    """What client ``c`` of ``clients`` sends, in order: (request index, copy-heavy?)."""
    mine = range(c, requests, clients)
    if mix == "blocks":
        return [(i, i % 2 == 0) for i in mine]
    return [(i, (c + k) % 2 == 0) for k, i in enumerate(mine)]


def request(i: int, max_tokens: int, copy: bool | None = None) -> dict:
    """The ``i``-th request: copy-heavy or prose (default: even ones copy-heavy, odd ones prose); ``i``
    picks the edit or the thing."""
    if copy if copy is not None else i % 2 == 0:
        edit = EDITS[(i // 2) % len(EDITS)]
        text = f"Here is a Python file:\n\n```python\n{SNIPPET}```\n\nRewrite the whole file and {edit}."
    else:
        text = f"Write a short story about a {THINGS[(i // 2) % len(THINGS)]}."
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}


def row_spec(key: str, args: argparse.Namespace) -> RowSpec:
    model, t, ctx = str(args.model), str(args.threads), args.ctx
    env = dict(os.environ)
    ours_env = {**env, "PYTHONPATH": os.pathsep.join([str(OUR_SRC), *filter(None, [env.get("PYTHONPATH")])])}
    ours = [sys.executable, "-m", "promptlookup", "serve", "-m", model, "-t", t, "-c", str(ctx),
            "--max-queue", "256"]
    if key == "ours":
        return RowSpec(key, "promptlookup serve", ours, ours_env)
    if key in ("base", "base-off"):
        if not args.base_src:
            raise SystemExit(f"row {key} needs --base-src DIR (a checkout of the code to compare with)")
        base_env = {**env, "PYTHONPATH": os.pathsep.join([str(Path(args.base_src).resolve() / "src"),
                                                          *filter(None, [env.get("PYTHONPATH")])])}
        argv = ours if key == "base" else [*ours, "--speculate", "off"]
        return RowSpec(key, f"promptlookup serve from {args.base_src}" + (" --speculate off" if
                                                                            key == "base-off" else ""),
                       argv, base_env)
    if key == "ours-off":
        return RowSpec(key, "promptlookup serve --speculate off", [*ours, "--speculate", "off"], ours_env)
    if key == "ours-nofa":
        return RowSpec(key, "promptlookup serve, flash attention off", ours,
                       {**ours_env, "PROMPTLOOKUP_FLASH_ATTENTION": "off"})
    if key == "ours-fifo":
        return RowSpec(key, "promptlookup serve --parallel 1", [*ours, "--parallel", "1"], ours_env)
    m = ROW_NP.fullmatch(key)
    if m and m[1] == "ours" and m[3] != "-spec":
        argv, label = [*ours, "--parallel", m[2]], f"promptlookup serve --parallel {m[2]}"
        if m[3]:
            argv, label = [*argv, "--speculate", "off"], label + " --speculate off"
        return RowSpec(key, label, argv, ours_env)
    if m and m[1] == "ls" and m[3] != "-off":
        np_ = int(m[2])
        argv = [str(args.llama_server), "-m", model, "-t", t, "-tb", t, "-c", str(ctx * np_),
                "-np", str(np_), "--host", "127.0.0.1"]
        label = f"llama-server -np {np_}"
        if key.endswith("-spec"):
            argv.append("--spec-default")
            label += " --spec-default"
        return RowSpec(key, label, argv, env)
    if key == "lcp":
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", str(ctx),
                "--n_threads", t, "--n_threads_batch", t, "--host", "127.0.0.1", "--logits_all", "false",
                # its default cuts a running answer short when another request arrives
                "--interrupt_requests", "false"]
        return RowSpec(key, "llama_cpp.server", argv, env, {"repeat_penalty": 1.0}, retokenize=True)
    raise SystemExit(f"serve_batch: error: unknown row {key!r} (rows: {', '.join(ROWS)})")


def round_counters(server: Server) -> dict[str, float] | None:
    """Our server's batching counters from ``/metrics`` (``rounds``, ``parts``, ``tokens``,
    ``seconds``: its forwards' time); None for a peer, or with one slot."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    names = {"promptlookup:batch_rounds_total": "rounds", "promptlookup:batch_round_parts_total": "parts",
             "promptlookup:batch_round_tokens_total": "tokens",
             "promptlookup:batch_forward_seconds_total": "seconds"}
    from prometheus_client.parser import text_string_to_metric_families

    got = {names[s.name]: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name in names}
    return got if len(got) == len(names) else None


def run_level(server: Server, spec: RowSpec, clients: int, args: argparse.Namespace) -> dict:
    """``args.requests`` requests shared out among ``clients`` clients; the level's figures."""
    model = server.model_id()
    results: list = []

    done: list[float] = []

    def client(c: int) -> None:
        for i, copy in client_requests(c, clients, args.requests, args.mix):
            body = {**request(i, args.max_tokens, copy), "model": model, **spec.extra_body}
            try:
                m = parse_stream(server.stream_chat(body, args.request_timeout))
            except Exception as exc:  # noqa: BLE001 - a failed request is a row's error count
                m = parse_stream([])
                m.error = f"{type(exc).__name__}: {exc}"[:200]
            if m.tokens is None and m.text and spec.retokenize:
                try:
                    r = server.post_json("/extras/tokenize/count", {"input": m.text})
                    m.tokens = int(r["count"])
                except Exception:  # noqa: BLE001
                    pass
            results.append(m)
        done.append(time.perf_counter() - t0)

    c0 = round_counters(server)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    c1 = round_counters(server)
    # ours only: the share of the wall clock the model computed (the rest is the server's own work),
    # and the rounds: how many, how wide, how long each took
    rounds = {k: c1[k] - c0[k] for k in c1} if c0 is not None and c1 is not None else None
    ok = [m for m in results if not m.error]
    tokens = sum(m.tokens or 0 for m in ok)
    ttft = [m.ttft for m in ok if m.ttft is not None]
    e2e = [m.wall for m in ok]
    return {"tok_s": tokens / wall, "tokens": tokens, "wall": wall, "ttft50": pct(ttft, 0.5),
            "ttft95": pct(ttft, 0.95), "e2e50": pct(e2e, 0.5), "e2e95": pct(e2e, 0.95),
            "errors": len(results) - len(ok), "first_error": next((m.error for m in results if m.error), ""),
            "rounds": rounds, "first_done": min(done, default=wall)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", help="GGUF (default: the bundled SmolLM2)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-c", "--ctx", type=int, default=2048, help="context per sequence (default 2048)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated (default all: {','.join(ROWS)})")
    p.add_argument("--clients", default="1,4,16", help="concurrency levels (default 1,4,16)")
    p.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    p.add_argument("--repeat", type=int, default=1,
                   help="passes per level, rows taking turns (default 1); the table gives each row's "
                        "median and, with more than one, every pass's tok/s")
    p.add_argument("--mix", choices=MIXES, default="alternate",
                   help="how the two kinds are shared among the clients (default alternate: each client "
                        "alternates them; blocks: even requests copy-heavy, the layout before 2026-12-02)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--base-src", help="the rows base and base-off run the code of this checkout")
    p.add_argument("--llama-server", help="llama-server binary (default: built by benchmarks/llama_tools.py)")
    p.add_argument("--llama-kernels", choices=("fast", "invariant"), default="fast",
                   help="the llama-server that llama_tools.py builds: fast (default) = llama.cpp's own "
                        "CMake defaults, tinyBLAS included, as its users build it; invariant = set-up's "
                        "kernel flags without its source patches (the rows before 2026-12-03)")
    args = p.parse_args(argv)
    if args.model is None:
        from promptlookup.backends.models import bundled_model_path

        args.model = bundled_model_path()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    levels = [int(x) for x in args.clients.split(",")]
    for key in rows:
        row_spec(key, args)  # an unknown row stops here, before llama-server is built or any server runs
    if args.repeat < 1:
        raise SystemExit("serve_batch: error: --repeat must be at least 1")
    peer = ""
    if any(r.startswith("ls-") for r in rows):
        if args.llama_server is None:
            import llama_tools

            args.llama_server = llama_tools.ensure_server(kernels=args.llama_kernels)
            peer = f", llama-server with {args.llama_kernels} kernels"
        peer = f"{peer} ({args.llama_server})"
    print(f"# serve_batch: {machine_line()}; -t {args.threads}, {args.requests} requests per level, "
          f"{args.max_tokens} tokens, ctx {args.ctx} per sequence, {args.repeat} pass(es) per level, "
          f"rows interleaved, --mix {args.mix}{peer}", flush=True)
    logdir = Path(tempfile.mkdtemp(prefix="serve_batch-"))
    specs = {key: row_spec(key, args) for key in rows}  # again: ls- rows need the binary built above
    got: dict[tuple[str, int], list[dict]] = {}
    for clients in levels:
        for rep in range(args.repeat):
            # rows take turns within a level (rotated each pass), so a machine whose speed drifts
            # over minutes drifts under every row alike
            k = rep % len(rows)
            for key in rows[k:] + rows[:k]:
                spec = specs[key]
                # a fresh server per run: no run drafts from, or reuses the cache of, another's requests
                try:
                    with Server(spec, logdir / f"{key}-{clients}-{rep}.log", start_timeout=600) as server:
                        parse_stream(server.stream_chat({**WARM_UP, "model": server.model_id(),
                                                         **spec.extra_body}, 120))  # untimed
                        r = run_level(server, spec, clients, args)
                except RuntimeError as exc:
                    print(f"<!-- {key} x{clients} pass {rep + 1}: failed to start: {exc} -->", flush=True)
                    continue
                got.setdefault((key, clients), []).append(r)
                rd, share = r["rounds"], ""
                if rd and rd["rounds"]:
                    n = rd["rounds"]
                    share = (f", forwards {rd['seconds'] / r['wall']:.0%} of the wall clock: {n:.0f} rounds "
                             f"of {rd['parts'] / n:.2f} sequences, {rd['tokens'] / n:.1f} tokens, "
                             f"{rd['seconds'] / n * 1e3:.1f} ms")
                print(f"<!-- {key} x{clients} pass {rep + 1}: {r['tok_s']:.1f} tok/s{share}; clients "
                      f"done at {r['first_done']:.1f}-{r['wall']:.1f} s, errors {r['errors']} "
                      f"{r['first_error']} -->", flush=True)
    print("| row | clients | tok/s | TTFT p50 | TTFT p95 | e2e p50 | e2e p95 | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for key in rows:
        for clients in levels:
            rs = got.get((key, clients))
            if not rs:
                print(f"| {specs[key].label} | {clients} | failed to start |||||| ")
                continue
            fields = ("tok_s", "ttft50", "ttft95", "e2e50", "e2e95")
            med = {f: statistics.median(r[f] for r in rs) for f in fields}
            tok = "/".join(f"{r['tok_s']:.1f}" for r in rs) if len(rs) > 1 else ""
            print(f"| {specs[key].label} | {clients} | {med['tok_s']:.1f}{f' ({tok})' if tok else ''} | "
                  f"{med['ttft50']:.2f} | {med['ttft95']:.2f} | {med['e2e50']:.2f} | {med['e2e95']:.2f} | "
                  f"{sum(r['errors'] for r in rs)} |")
    print(f"<!-- server logs: {logdir} -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
