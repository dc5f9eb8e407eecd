"""Drafting speed, load time and memory of ``--lookup`` (and ``--ngram``) beside llama.cpp's lookup tools.

Why this script: issue 4's targets are ratios against llama.cpp measured on the same machine, text,
tokenizer and ``-c``, so both tools run here back to back, one at a time, and every figure is the
median of ``--runs`` runs. Real text every machine has: the ``.py`` files of this Python installation
(standard library, then site-packages, sorted paths, deduplicated by content), with one package held
out as the replay text. Corpora of each size are prefixes of that stream cut at a file boundary.

    .venv/bin/python benchmarks/lookup_perf.py     # sizes 0..200 MB and all .py (max), ~45 min on 2 cores
    .venv/bin/python benchmarks/lookup_perf.py --sizes 0 25 --runs 1   # a quick look

llama.cpp's tools come from the llama.cpp vendored in the installed llama-cpp-python's source package,
built once (on the first run, ~11 min on 2 cores) into ``~/.cache/promptlookup/llamacpp`` with set-up's
safe ISA flags (``benchmarks/llama_tools.py``; ``-march=native`` dies by SIGILL on a CPU with AMX). Both tools
read text as is (llama.cpp with ``--no-escape``). Per size and draft length: create time and peak RSS,
cache bytes, load time, drafting microseconds per drafted token (llama.cpp's own ``t_draft / n_drafted``;
ours: replay drafting time including cache updates / n_drafted), replay peak RSS, n_drafted, n_accept.
Output: one markdown table (ours | llama.cpp | ratio) on stdout and in ``OUT/lookup_perf.md``, every
run in ``OUT/lookup_perf.csv``, corpus checksums in ``OUT/corpora.json``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llama_tools

HOLD_OUT = "pydantic"  # the replay text's package: never in any corpus
REPLAY_BYTES = 1_500_000  # whole files of the held-out package up to this size (~340k tokens)
DEFAULT_SIZES = (0, 25, 50, 100, 200)
PY = sys.executable


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- corpora ------------------------------------------------------------------------------------
def python_roots() -> list[Path]:
    import site
    import sysconfig

    roots = [Path(sysconfig.get_paths()["stdlib"])]
    roots += [Path(p) for p in site.getsitepackages()]
    out: list[Path] = []
    for r in roots:
        r = r.resolve()
        if r.is_dir() and r not in out:
            out.append(r)
    return out


def py_files() -> tuple[list[Path], list[Path]]:
    """(corpus files, held-out files): every .py once (first path of each content), in a fixed order."""
    seen: set[bytes] = set()
    corpus: list[Path] = []
    held: list[Path] = []
    for root in python_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                digest = hashlib.sha1(p.read_bytes()).digest()
                rel = p.relative_to(root).parts
                if digest in seen:
                    continue
                seen.add(digest)
                if HOLD_OUT in rel[:-1]:
                    held.append(p)
                    continue
                corpus.append(p)
    # a held-out file's content must not reach a corpus through a copy seen earlier
    held_digests = {hashlib.sha1(p.read_bytes()).digest() for p in held}
    corpus = [p for p in corpus if hashlib.sha1(p.read_bytes()).digest() not in held_digests]
    return corpus, held


def write_stream(files: list[Path], out: Path, limit: int | None) -> tuple[int, str]:
    """Concatenate files into ``out`` until ``limit`` bytes (whole files); (bytes, sha256)."""
    h = hashlib.sha256()
    n = 0
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        for p in files:
            data = p.read_bytes()
            if limit is not None and n + len(data) > limit:
                break
            fh.write(data)
            h.update(data)
            n += len(data)
    tmp.replace(out)
    return n, h.hexdigest()


def make_corpora(work: Path, sizes: list[int | str], save: bool = True) -> dict:
    log("listing .py files")
    corpus, held = py_files()
    total = sum(p.stat().st_size for p in corpus)
    log(f"{len(corpus)} corpus files ({total / 1e6:.1f} MB), {len(held)} held-out files ({HOLD_OUT})")
    info: dict = {"roots": [str(r) for r in python_roots()], "hold_out": HOLD_OUT, "corpora": {}}
    n, sha = write_stream(held, work / "replay.txt", REPLAY_BYTES)
    info["replay"] = {"path": str(work / "replay.txt"), "bytes": n, "sha256": sha, "files": len(held)}
    for s in sizes:
        if str(s) == "0":
            continue
        limit = None if s == "max" else int(s) * 1_000_000
        path = work / f"corpus_{s}.txt"
        n, sha = write_stream(corpus, path, limit)
        info["corpora"][str(s)] = {"path": str(path), "bytes": n, "sha256": sha}
        log(f"corpus {s}: {n / 1e6:.1f} MB sha256 {sha[:16]}")
    if save:
        (work / "corpora.json").write_text(json.dumps(info, indent=1))
    return info


# -- llama.cpp's tools -------------------------------------------------------------------------
LOOKUP_TOOLS = ("llama-lookup-create", "llama-lookup-stats", "llama-lookup-merge")


def ensure_llama_tools(bin_dir: Path | None) -> Path:
    """llama-lookup-create/-stats/-merge: built once with set-up's safe ISA flags (llama_tools.py),
    or taken from ``--llama-bin``."""
    if bin_dir is not None:
        missing = [t for t in LOOKUP_TOOLS if not (bin_dir / t).is_file()]
        if missing:
            sys.exit(f"{bin_dir} lacks llama.cpp's {', '.join(missing)} "
                     "(leave --llama-bin out to build them)")
        return bin_dir
    return llama_tools.ensure_tools(LOOKUP_TOOLS)


# -- measuring ----------------------------------------------------------------------------------
class BenchLock:
    """flock(2) on the shared benchmark lock (the same lock ``flock /tmp/pl-bench.lock CMD`` takes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> BenchLock:
        import fcntl

        self.fh = open(self.path, "a")  # noqa: SIM115
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        wait_quiet()
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _cpu_busy(seconds: float = 1.0) -> float:
    def sample() -> tuple[int, int]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(f), f[3] + f[4]

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(limit_s: float = 30.0) -> None:
    """Two benchmarks on 2 cores ruin each other: wait (a while) until the machine is idle."""
    start = time.time()
    while True:
        busy = _cpu_busy()
        if busy < 0.15:
            return
        if time.time() - start > limit_s:
            log(f"warning: machine still {100 * busy:.0f}% busy; measuring anyway")
            return
        time.sleep(2)


TIME_RE = {"wall": re.compile(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)"),
           "rss": re.compile(r"Maximum resident set size \(kbytes\): (\d+)")}


def timed(cmd: list[str], lock: str) -> tuple[str, float, int]:
    """Run ``cmd`` under /usr/bin/time -v and the lock; (stdout+stderr, wall s, peak RSS bytes)."""
    with BenchLock(lock):
        p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, errors="replace")
    out = p.stdout + p.stderr
    if p.returncode:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    m = TIME_RE["wall"].search(out)
    wall = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))) if m else float("nan")
    rss = int(TIME_RE["rss"].search(out).group(1)) * 1024
    return out, wall, rss


def llama_create(binp: Path, model: str, corpus: str, out: Path, lock: str) -> dict:
    text, wall, rss = timed([str(binp / "llama-lookup-create"), "-m", model, "-f", corpus, "-lcs", str(out),
                             "--no-escape", "-c", "4096"], lock)
    return {"create_s": wall, "create_rss": rss, "cache_bytes": out.stat().st_size}


def ours_create(model: str, corpus: str, out: Path, lock: str, threads: int) -> dict:
    text, wall, rss = timed([PY, "-m", "promptlookup", "create", "-m", model, "-f", corpus, "-o", str(out),
                             "-t", str(threads), "--no-progress"], lock)
    # /usr/bin/time sees the largest single process; the whole tree is at most parent + workers
    m = re.search(r"peak RSS (\d+) MiB \(parent\), (\d+) MiB \(largest worker\)", text)
    tree = (int(m.group(1)) + threads * int(m.group(2))) * 2**20 if m else rss
    return {"create_s": wall, "create_rss": max(rss, tree), "cache_bytes": out.stat().st_size}


LLAMA_STATS = {k: re.compile(v) for k, v in {
    "n_drafted": r"n_drafted\s*=\s*(\d+)", "n_accept": r"n_accept\s*=\s*(\d+)",
    "load_ms": r"t_draft_flat\s*=\s*([\d.]+) ms", "t_draft_ms": r"t_draft\s*=\s*([\d.]+) ms",
    "n_predict": r"n_predict\s*=\s*(\d+)"}.items()}


def llama_stats(binp: Path, model: str, text: str, cache: Path | None, draft: int, lock: str) -> dict:
    cmd = [str(binp / "llama-lookup-stats"), "-m", model, "-f", text, "--no-escape", "-c", "4096",
           "--spec-draft-n-max", str(draft)]
    if cache is not None:
        cmd += ["-lcs", str(cache)]
    out, wall, rss = timed(cmd, lock)
    got = {k: float(r.search(out).group(1)) for k, r in LLAMA_STATS.items()}
    nd = int(got["n_drafted"])
    return {"n_drafted": nd, "n_accept": int(got["n_accept"]), "load_s": got["load_ms"] / 1e3,
            "us_per_drafted": 1e3 * got["t_draft_ms"] / nd if nd else 0.0, "replay_rss": rss}


def ours_stats(model: str, text: str, cache: Path | None, draft: int, lock: str) -> dict:
    cmd = [PY, "-m", "promptlookup", "stats", "-m", model, "-f", text, "-c", "4096", "--draft", str(draft),
           "--json"]
    if cache is not None:
        cmd += ["--lookup-cache-static", str(cache)]
    out, wall, rss = timed(cmd, lock)
    js = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return {"n_drafted": js["n_drafted"], "n_accept": js["n_accept"], "load_s": js["t_load_s"],
            "us_per_drafted": js["us_per_drafted"], "replay_rss": rss}


def ngram_per_call(model: str, text: str, lock: str, context: int = 32768, calls: int = 20000) -> dict:
    """--ngram at a ``context``-token context, then one token per call: the drafting call (``propose``,
    which also indexes the new token) and ``extend`` timed apart; the old backward scan for scale."""
    import numpy as np

    from promptlookup.build.tokenizers import VocabTokenizer
    from promptlookup.drafting.ngram.source import NgramSource, ngram_match

    toks = VocabTokenizer(model).tokenize(Path(text).read_bytes()).tolist()
    if len(toks) < context + calls:
        calls = max(100, len(toks) - context)
    out = {}
    with BenchLock(lock):
        src = NgramSource()
        src.reset(toks[:context])
        src.propose(3)  # indexes the 32k-token prompt once, as a request's prefill would
        perf = time.perf_counter
        drafted = 0
        t_propose = t_extend = 0.0
        for t in toks[context : context + calls]:
            t0 = perf()
            drafted += len(src.propose(3).tokens)
            t1 = perf()
            src.extend([t])
            t_extend += perf() - t1
            t_propose += t1 - t0
        out["ngram_us_per_call"] = 1e6 * t_propose / calls
        out["ngram_extend_us_per_call"] = 1e6 * t_extend / calls
        buf = np.asarray(toks[: context + calls], dtype=np.int32)
        t0 = perf()
        for i in range(context, context + min(calls, 2000)):
            ngram_match(buf, i, 16)
        out["ngram_scan_us_per_call"] = 1e6 * (perf() - t0) / min(calls, 2000)
    out["ngram_calls"], out["ngram_drafted"] = calls, drafted
    return out


# -- the run ------------------------------------------------------------------------------------
METRICS = ("create_s", "create_rss", "cache_bytes", "load_s", "us_d3", "us_d8", "replay_rss",
           "n_drafted_d3", "n_accept_d3", "n_drafted_d8", "n_accept_d8")


def median_of(runs: list[dict]) -> dict:
    keys = {k for r in runs for k in r}
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def measure_size(size: str, info: dict, work: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Median figures of both tools for one corpus size: {"ours": {...}, "llama": {...}}."""
    text = info["replay"]["path"]
    corpus = info["corpora"].get(size, {}).get("path")
    result: dict[str, dict] = {}
    for tool in ("llama", "ours"):
        runs: list[dict] = []
        for r in range(args.runs):
            row: dict = {}
            cache: Path | None = None
            if corpus:
                cache = work / (f"llama_{size}.lcc" if tool == "llama" else f"ours_{size}.plc")
                log(f"{size} MB {tool}: create (run {r + 1}/{args.runs})")
                if tool == "llama":
                    row.update(llama_create(args.llama_bin, args.model, corpus, cache, args.lock))
                else:
                    row.update(ours_create(args.model, corpus, cache, args.lock, args.threads))
            rss = []
            for d in (3, 8):
                log(f"{size} MB {tool}: stats --draft {d} (run {r + 1}/{args.runs})")
                st = (llama_stats(args.llama_bin, args.model, text, cache, d, args.lock) if tool == "llama"
                      else ours_stats(args.model, text, cache, d, args.lock))
                row[f"us_d{d}"] = st["us_per_drafted"]
                row[f"n_drafted_d{d}"] = st["n_drafted"]
                row[f"n_accept_d{d}"] = st["n_accept"]
                row.setdefault("load_s", st["load_s"])
                rss.append(st["replay_rss"])
            row["replay_rss"] = max(rss)
            row.update(size=size, tool=tool, run=r + 1)
            runs.append(row)
            with open(args.out / "lookup_perf_runs.csv", "a", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=["size", "tool", "run", *METRICS])
                if fh.tell() == 0:
                    w.writeheader()
                w.writerow({k: row.get(k, "") for k in w.fieldnames})
        result[tool] = median_of(runs)
    if corpus and args.check_tokens:
        # every optimization keeps the tokens: the reference tokenizer must write the very same cache
        ref = work / f"ours_{size}.reference.plc"
        log(f"{size} MB ours: create --tokenizer llama (the reference; not timed)")
        timed([PY, "-m", "promptlookup", "create", "-m", args.model, "-f", corpus, "-o", str(ref),
               "-t", str(args.threads), "--no-progress", "--tokenizer", "llama"], args.lock)
        same = ref.read_bytes() == (work / f"ours_{size}.plc").read_bytes()
        ref.unlink()
        result["ours"]["same_as_reference"] = same
        log(f"{size} MB: the memo tokenizer's cache {'IS' if same else 'IS NOT'} byte-identical "
            "to the reference's")
    return result


def _fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric.endswith("rss") or metric == "cache_bytes":
        return f"{v / 1e6:.0f} MB" if v < 1e9 else f"{v / 1e9:.2f} GB"
    if metric == "load_s":
        return f"{1e3 * v:.2f} ms" if v < 1 else f"{v:.2f} s"
    if metric == "create_s":
        return f"{v:.1f} s"
    return f"{v:.2f}"


def table(results: dict[str, dict[str, dict]], info: dict) -> str:
    cols = [("create_s", "create"), ("create_rss", "create peak RSS"), ("cache_bytes", "cache file"),
            ("load_s", "load"), ("us_d3", "us/drafted d3"), ("us_d8", "us/drafted d8"),
            ("replay_rss", "replay peak RSS")]
    lines = ["| corpus | " + " | ".join(c for _, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for size, res in results.items():
        mb = info["corpora"].get(size, {}).get("bytes", 0) / 1e6
        cells = []
        for key, _ in cols:
            o, ll = res["ours"].get(key), res["llama"].get(key)
            if o is None or ll is None:
                cells.append("-")
                continue
            ratio = f" ({o / ll:.3g}x)" if ll else ""
            cells.append(f"{_fmt(key, o)} / {_fmt(key, ll)}{ratio}")
        lines.append(f"| {'none' if size == '0' else f'{mb:.0f} MB'} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: ours / llama.cpp (ratio ours:llama.cpp); median of the runs.", "",
              "| corpus | draft | n_drafted ours / llama.cpp | n_accept ours / llama.cpp | accept % ours / "
              "llama.cpp |", "|---|---|---|---|---|"]
    for size, res in results.items():
        mb = info["corpora"].get(size, {}).get("bytes", 0) / 1e6
        for d in (3, 8):
            o, ll = res["ours"], res["llama"]
            od, oa, ld, la = (int(o[f"n_drafted_d{d}"]), int(o[f"n_accept_d{d}"]), int(ll[f"n_drafted_d{d}"]),
                              int(ll[f"n_accept_d{d}"]))
            lines.append(f"| {'none' if size == '0' else f'{mb:.0f} MB'} | {d} | {od} / {ld} | {oa} / {la} | "
                         f"{100 * oa / max(1, od):.2f} / {100 * la / max(1, ld):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from promptlookup.backends.models import bundled_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=[*map(str, DEFAULT_SIZES), "max"],
                    help="corpus sizes in MB, 0 for none, 'max' for every .py file "
                         "(default 0 25 50 100 200 max)")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the median is reported")
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache/promptlookup/bench/lookup_perf",
                    help="results and corpora (outside the repo)")
    ap.add_argument("--llama-bin", type=Path, default=None,
                    help="llama.cpp's build/bin (default: built once with set-up's safe ISA flags)")
    ap.add_argument("--model", default=str(bundled_model_path()), help="GGUF whose tokenizer both tools use")
    ap.add_argument("--threads", type=int, default=2, help="our create's worker processes")
    ap.add_argument("--lock", default="/tmp/pl-bench.lock", help="lock shared by every benchmark here")
    ap.add_argument("--ngram-only", action="store_true", help="only the --ngram per-call figure")
    ap.add_argument("--no-check-tokens", dest="check_tokens", action="store_false",
                    help="skip building each cache once more with --tokenizer llama to compare bytes")
    args = ap.parse_args(argv)
    if args.ngram_only:
        args.out.mkdir(parents=True, exist_ok=True)
        info = make_corpora(args.out, [], save=False)
        print(json.dumps(ngram_per_call(args.model, info["replay"]["path"], args.lock)))
        return 0
    args.llama_bin = ensure_llama_tools(args.llama_bin)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lookup_perf_runs.csv").unlink(missing_ok=True)
    info = make_corpora(args.out, args.sizes)
    log("--ngram at a 32k-token context")
    ngram = ngram_per_call(args.model, info["replay"]["path"], args.lock)
    log(f"--ngram: {ngram['ngram_us_per_call']:.2f} us per call (index), "
        f"{ngram['ngram_scan_us_per_call']:.2f} us (backward scan)")
    results: dict[str, dict[str, dict]] = {}
    for size in args.sizes:
        results[size] = measure_size(size, info, args.out, args)
        md = table(results, info)
        head = (f"`{' '.join(['benchmarks/lookup_perf.py', *(argv if argv is not None else sys.argv[1:])])}`"
                f" on {os.cpu_count()} cores; replay text: {info['replay']['files']} files of {HOLD_OUT} "
                f"({info['replay']['bytes'] / 1e6:.2f} MB, sha256 {info['replay']['sha256'][:16]}); "
                "corpora sha256: " + ", ".join(f"{k} MB {v['sha256'][:16]}"
                                               for k, v in info["corpora"].items() if k in results) + "\n\n"
                f"--ngram at a 32k-token context: {ngram['ngram_us_per_call']:.2f} us per drafting call "
                f"(+ {ngram['ngram_extend_us_per_call']:.2f} us per extend; the old backward scan alone: "
                f"{ngram['ngram_scan_us_per_call']:.2f} us)\n\n"
                "Our cache built with llama.cpp's tokenizer on every byte (`--tokenizer llama`) is "
                "byte-identical to the memo tokenizer's: " + ", ".join(
                    f"{k} MB {'yes' if r['ours'].get('same_as_reference') else 'NO'}"
                    for k, r in results.items() if "same_as_reference" in r["ours"]) + "\n\n")
        (args.out / "lookup_perf.md").write_text(head + md + "\n")
        with open(args.out / "lookup_perf.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["size", "bytes", "sha256", "tool", *METRICS])
            for s, res in results.items():
                c = info["corpora"].get(s, {})
                for tool in ("ours", "llama"):
                    w.writerow([s, c.get("bytes", 0), c.get("sha256", ""), tool,
                                *(res[tool].get(m, "") for m in METRICS)])
        print(md if size == args.sizes[-1] else "", flush=True)
    (args.out / "ngram.json").write_text(json.dumps(ngram, indent=1))
    log(f"wrote {args.out / 'lookup_perf.md'} and {args.out / 'lookup_perf.csv'}")
    print((args.out / "lookup_perf.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
