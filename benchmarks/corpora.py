"""Named corpora at run time (issue 45): (a) what a corpus named buys on code edits, (b) what adding
a large corpus to a running server costs the requests streaming meanwhile.

(a) fast_apply items (``benchmarks/workloads/real``; build them first with ``build.py --only
fast_apply``): each package's repository is its *old* release's source tree (the edited file as it
was, and its neighbours), indexed as a named corpus; every item runs three ways on one backend --
``off``, ``--suffix`` without a corpus, ``--suffix`` with the package's corpus named -- each way on
its own engine (its own suffix history; no prefix reuse, so the ways never share a cache). It
prints accepted tokens per verify, tokens per decode and tok/s (decode plus drafting time) per way,
and checks every output equals ``off`` token for token.

(b) a ``promptlookup serve --parallel N`` process with ``--corpus-root`` on a copy of the Python
installation's ``.py`` files (stdlib, then site-packages; sorted paths, cut at ``--corpus-mb``);
``--clients`` threads stream completions without pause; after ``--warm`` seconds one
``POST /v1/corpora`` indexes the copy. It prints the clients' streamed tok/s (counted from each
chunk's logprobs) before, during and after the add, and per 5 s, failures, the add's wall time,
and whether a request naming the corpus right after the call returns is served (and equals ``off``).

The runs docs/suffix.md and docs/server.md report (2026-12-05, quiet 2-core machine)::

    .venv/bin/python benchmarks/corpora.py a --items 12 --max-tokens 512 -t 2
    .venv/bin/python benchmarks/corpora.py a -m qwen2.5-coder-1.5b --items 8 --max-tokens 384 -t 2
    .venv/bin/python benchmarks/corpora.py b --speculate off --corpus-mb 100 --clients 8 --parallel 8 \
        --warm 60 --after 30 -c 1024 -t 2

(``--speculate off`` keeps the clients' rate level, so a dip shows; with drafting clients their
acceptance grows through the run.) Agent sessions with a corpus: ``serve_real.py --rows
ours-off,ours,ours-corpus``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE / "workloads"))


def workloads_root() -> Path:
    env = os.environ.get("PROMPTLOOKUP_WORKLOADS")
    return Path(env) if env else Path.home() / ".cache" / "promptlookup" / "workloads"


# ------------------------------------------------------------------------------------------ (a)
def part_a(args: argparse.Namespace) -> int:
    from real.fast_apply import sdist_sources

    from promptlookup.api import Engine, load_backend
    from promptlookup.build.tokenizers import open_tokenizer
    from promptlookup.corpora.tree import build_corpus

    root = workloads_root()
    items_file = root / "real" / "fast_apply" / "items.jsonl"
    if not items_file.exists():
        print(f"no {items_file}: run benchmarks/workloads/real/build.py --only fast_apply", file=sys.stderr)
        return 2
    items = [json.loads(x) for x in items_file.read_text().splitlines() if x.strip()][: args.items]
    work = Path(tempfile.mkdtemp(prefix="pl-corpora-a-"))
    try:
        backend = load_backend(args.model, n_ctx=args.ctx, threads=args.threads)
        tok = open_tokenizer(backend.model_path)
        packages = sorted({(it["meta"]["package"], it["meta"]["old_version"]) for it in items})
        for pkg, ver in packages:  # the repository as it was before the edit
            files = sdist_sources(root / "sdists" / f"{pkg}-{ver}.tar.gz")
            for rel, text in files.items():
                p = work / "src" / pkg / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text, encoding="utf-8")
            st = build_corpus([work / "src" / pkg], work / "corpora" / pkg, tok)
            print(f"corpus {pkg} {ver}: {st.files} files, {st.n_tokens} tokens", file=sys.stderr)
        ways = {"off": Engine.from_backend(backend, speculate="off", reuse_prefix=False),
                "suffix": Engine.from_backend(backend, speculate=args.speculate, reuse_prefix=False),
                "suffix+corpus": Engine.from_backend(backend, speculate=args.speculate, reuse_prefix=False,
                                                     corpus_dir=work / "corpora")}
        for pkg, _ in packages:
            ways["suffix+corpus"].corpora.open(pkg)
        totals = {w: {"gen": 0, "acc": 0, "dec": 0, "s": 0.0} for w in ways}
        mismatches = 0
        for it in items:
            pkg = it["meta"]["package"]
            msgs = [{"role": "user", "content": it["prompt"]}]
            outs = {}
            for w, eng in ways.items():
                kw = {"corpora": [pkg]} if w == "suffix+corpus" else {}
                c = eng.chat(msgs, max_tokens=args.max_tokens, temperature=0, **kw)
                outs[w] = c.tokens
                t = totals[w]
                t["gen"] += c.counters.generated_tokens
                t["acc"] += c.counters.accepted_tokens
                t["dec"] += c.counters.decodes
                t["s"] += c.counters.decode_s + c.counters.draft_s
            same = outs["suffix"] == outs["off"] and outs["suffix+corpus"] == outs["off"]
            mismatches += not same
            print(f"{it['id']}: {len(outs['off'])} tokens, identical to off: {same}", file=sys.stderr)
        print(f"\nmodel {Path(str(backend.model_path)).name}, {len(items)} fast_apply items, "
              f"max_tokens {args.max_tokens}, speculate {args.speculate}")
        print("| way | tokens | accepted/verify | tokens/decode | tok/s |")
        print("|---|---|---|---|---|")
        for w, t in totals.items():
            dec = max(t["dec"], 1)
            print(f"| {w} | {t['gen']} | {t['acc'] / dec:.3f} | {t['gen'] / dec:.3f} "
                  f"| {t['gen'] / t['s'] if t['s'] else 0:.1f} |")
        print(f"outputs identical to off: {len(items) - mismatches}/{len(items)}")
        return 1 if mismatches else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------ (b)
def python_sources_copy(dest: Path, mb: float) -> tuple[int, int]:
    """The Python installation's ``.py`` files in sorted path order, copied until ``mb``: the stdlib
    (its site-packages left out) first, then this environment's site-packages (the stdlib alone is
    about 30 MB; with the packages the tests install there are 100+ MB)."""
    paths = sysconfig.get_paths()
    limit, n, size = int(mb * 1e6), 0, 0
    for key, src in (("stdlib", Path(paths["stdlib"])), ("site-packages", Path(paths["purelib"]))):
        for p in sorted(src.rglob("*.py")):
            rel = p.relative_to(src)
            if (key == "stdlib" and "site-packages" in rel.parts) or not p.is_file() or p.is_symlink():
                continue
            s = p.stat().st_size
            if size + s > limit:
                return n, size
            q = dest / key / rel
            q.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, q)
            n, size = n + 1, size + s
    return n, size


def part_b(args: argparse.Namespace) -> int:
    import httpx
    from serving import ServerProcess, server_env

    work = Path(tempfile.mkdtemp(prefix="pl-corpora-b-"))
    try:
        n_files, n_bytes = python_sources_copy(work / "root" / "pysrc", args.corpus_mb)
        print(f"corpus source: {n_files} .py files, {n_bytes / 1e6:.1f} MB", file=sys.stderr)
        if n_bytes < args.corpus_mb * 1e6 * 0.95:
            print(f"note: this installation has only {n_bytes / 1e6:.1f} MB of .py files", file=sys.stderr)
        model = ["-m", args.model] if args.model else []
        with ServerProcess(*model, "--parallel", str(args.parallel), "--speculate", args.speculate,
                           "--corpus-root", str(work / "root"), "--corpus-dir", str(work / "corpora"),
                           threads=args.threads or 2, ctx=args.ctx, env=server_env()) as server:
            return _stream_and_add(server.url, args, httpx, n_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stream_and_add(url: str, args: argparse.Namespace, httpx, n_bytes: int) -> int:  # noqa: ANN001
    stop = threading.Event()
    events: list[tuple[float, int]] = []  # (time, tokens) of every streamed chunk
    failures: list[str] = []
    lock = threading.Lock()
    prompt = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    "
              "return a\n\n\ndef factorial(n):\n")

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as c:
            while not stop.is_set():
                body = {"prompt": prompt + f"# client {i}\n", "max_tokens": 64, "temperature": 0,
                        "stream": True, "logprobs": 0}  # each chunk lists its tokens
                try:
                    with c.stream("POST", "/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            failures.append(f"HTTP {r.status_code}")
                            r.read()
                            continue
                        done = False
                        for line in r.iter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: {"):
                                n = _tokens_in(line[6:])
                                if n:
                                    with lock:
                                        events.append((time.monotonic(), n))
                        if not done:
                            failures.append("stream ended without [DONE]")
                except httpx.HTTPError as exc:
                    failures.append(type(exc).__name__)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.warm)
    t_add = time.monotonic()
    r = httpx.post(url + "/v1/corpora", json={"name": "pysrc", "path": str(Path(args.root) / "pysrc")
                                                if args.root else _root_of(url)}, timeout=3600)
    t_done = time.monotonic()
    ok_after = None
    if r.status_code == 201:
        body = {"prompt": prompt, "max_tokens": 32, "temperature": 0}
        named = httpx.post(url + "/v1/completions", timeout=600,
                           json={**body, "corpora": ["pysrc"], "speculate": "suffix"})
        off = httpx.post(url + "/v1/completions", json={**body, "speculate": "off"}, timeout=600)
        ok_after = (named.status_code == 200 and off.status_code == 200
                    and named.json()["choices"][0]["text"] == off.json()["choices"][0]["text"])
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(600)
    with lock:
        ev = list(events)
    t0 = ev[0][0] if ev else t_add

    def rate(a: float, b: float) -> float:
        return sum(n for t, n in ev if a <= t < b) / (b - a) if b > a else 0.0

    before = rate(max(t0, t_add - args.warm / 2), t_add)  # the warm-up's second half
    during = rate(t_add, t_done)
    after = rate(t_done, t_done + args.after)
    print(f"\n{args.clients} clients streaming, --parallel {args.parallel}, corpus {n_bytes / 1e6:.1f} MB")
    print(f"POST /v1/corpora: HTTP {r.status_code} in {t_done - t_add:.1f} s: {r.text[:300]}")
    print(f"streamed tok/s (all clients): before {before:.1f}, during the add {during:.1f} "
          f"({(during / before - 1) * 100 if before else 0:+.1f}%), after {after:.1f}")
    step = 5.0
    line = []
    t = t_add - args.warm
    while t < t_done + args.after:
        line.append(f"{t - t_add:+.0f}s:{rate(t, t + step):.1f}")
        t += step
    print("tok/s per 5 s from the add (0 = the POST; it returned at "
          f"{t_done - t_add:+.0f}s): " + " ".join(line))
    print(f"failures: {len(failures)} {sorted(set(failures))}")
    verdict = "served, equal to off" if ok_after else ok_after
    print(f"a request naming the corpus right after the call: {verdict}")
    return 0 if r.status_code == 201 and not failures and ok_after else 1


def _tokens_in(data: str) -> int:
    """The tokens one streamed completion chunk carries (its logprobs list them)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return 0
    n = 0
    for choice in obj.get("choices") or ():
        lp = choice.get("logprobs") or {}
        n += len(lp.get("tokens") or ())
    return n


def _root_of(url: str) -> str:
    import httpx

    roots = httpx.get(url + "/v1/corpora", timeout=60).json()["roots"]
    return str(Path(roots[0]) / "pysrc")


def main() -> int:
    sys.path.insert(0, str(HERE.parent / "tests"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("a", "b"))
    p.add_argument("-m", "--model", help="model name or GGUF (default: the bundled one)")
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("-c", "--ctx", type=int, default=4096)
    p.add_argument("--speculate", default="suffix")
    p.add_argument("--items", type=int, default=4, help="(a) fast_apply items")
    p.add_argument("--max-tokens", type=int, default=128, help="(a) tokens per answer at most")
    p.add_argument("--corpus-mb", type=float, default=100.0, help="(b) .py sources to index, MB")
    p.add_argument("--clients", type=int, default=8, help="(b) streaming clients")
    p.add_argument("--parallel", type=int, default=8, help="(b) the server's --parallel")
    p.add_argument("--warm", type=float, default=30.0, help="(b) seconds of streaming before the add")
    p.add_argument("--after", type=float, default=10.0, help="(b) seconds of streaming after it")
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    return part_a(args) if args.part == "a" else part_b(args)


if __name__ == "__main__":
    sys.exit(main())
