"""Replay benchmark for ``--suffix`` beside ``--ngram``, ``--lookup`` and SuffixDecoding (ArcticInference).

Why: drafting quality is a property of the source and the token stream only, so the lookup-stats
replay (:mod:`promptlookup.measure.replay`, llama.cpp's protocol step for step) compares sources on the same
texts in seconds. SuffixDecoding is the anchor: its suffix tree is driven from Python through the
C++ module built from the arctic-inference sdist (``csrc/suffix_decoding``); pass the directory
holding ``_C*.so`` with ``--arctic`` or ``ARCTIC_SUFFIX_MODULE``; without it those rows are skipped.
SuffixDecoding is run as its cache does: a per-request tree over the chunk so far and, in the
"global" rows, a global tree that receives each chunk once it is done; the higher-scoring draft
of the two wins (the request's on ties); context = the last ``max_depth`` tokens.

Texts (all real, none committed): the .py files of a downloaded trio wheel (``--trio-wheel``),
two stdlib packages (asyncio, email) and the Debian license texts, each joined in sorted path
order and tokenized with the bundled SmolLM2 vocabulary as lookup-stats does.

    flock /tmp/pl-bench.lock .venv/bin/python benchmarks/suffix_quality.py \
        --trio-wheel /tmp/x/trio-*.whl --arctic /path/to/build --csv suffix_quality.csv
"""

from __future__ import annotations

import argparse
import csv
import glob
import importlib.util
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from promptlookup.drafting.base import Draft, StepFeedback
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.drafting.suffix.history import History
from promptlookup.drafting.suffix.source import SuffixSource
from promptlookup.measure.replay import replay

STDLIB = Path(os.__file__).parent


def _join(paths: list[Path]) -> bytes:
    return b"".join(p.read_bytes() for p in paths)


def texts(trio_wheel: str | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    if trio_wheel:
        with zipfile.ZipFile(trio_wheel) as z:
            names = sorted(n for n in z.namelist() if n.endswith(".py"))
            out["trio"] = b"".join(z.read(n) for n in names)
    out["asyncio"] = _join(sorted((STDLIB / "asyncio").glob("*.py")))
    out["email"] = _join(sorted((STDLIB / "email").rglob("*.py")))
    lic = sorted({Path(os.path.realpath(p)) for p in glob.glob("/usr/share/common-licenses/*")})
    if lic:
        out["licenses"] = _join(lic)
    return out


def tokenize_all(raw: dict[str, bytes], cache_dir: Path) -> dict[str, np.ndarray]:
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer

    cache_dir.mkdir(parents=True, exist_ok=True)
    tok = None
    out = {}
    for name, data in raw.items():
        import hashlib

        f = cache_dir / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.npy"
        if f.exists():
            out[name] = np.load(f)
            continue
        if tok is None:
            tok = VocabTokenizer(bundled_model_path())
        ids = np.array(tok.tokenize(data, add_special=True, parse_special=True), dtype=np.int32)
        np.save(f, ids)
        out[name] = ids
    return out


class ArcticSource:
    """SuffixDecoding's two trees behind the DraftSource protocol (see the module docstring)."""

    def __init__(self, module, name: str, use_global: bool, factor: float = 1.0,
                 min_prob: float = 0.1, max_depth: int = 64) -> None:
        self._m = module
        self.name = name
        self.use_global = use_global
        self.factor, self.min_prob, self.max_depth = factor, min_prob, max_depth
        self._global = module.SuffixTree(max_depth)
        self._next_seq = 1
        self._buf = np.zeros(1 << 16, dtype=np.int32)
        self._n = 0
        self._local = None
        self._applied = 0

    def reset(self, prompt) -> None:
        self._local = self._m.SuffixTree(self.max_depth)
        self._n = self._applied = 0
        self.extend(prompt)

    def extend(self, tokens) -> None:
        m = len(tokens)
        self._buf[self._n : self._n + m] = tokens
        self._n += m

    def propose(self, k: int) -> Draft:
        if self._applied < self._n:  # batched like ours: updates are counted in the same call
            self._local.extend_ndarray(0, self._buf[self._applied : self._n])
            self._applied = self._n
        ctx = self._buf[max(0, self._n - self.max_depth) : self._n]
        d = self._local.speculate_ndarray(ctx, k, self.factor, 0.0, self.min_prob, False)
        if self.use_global:
            d2 = self._global.speculate_ndarray(ctx, k, self.factor, 0.0, self.min_prob, False)
            if d2.score > d.score:
                d = d2
        return Draft(tokens=tuple(d.token_ids), source=self.name, match_len=d.match_len)

    def feedback(self, step: StepFeedback) -> None:
        pass

    def commit(self) -> None:
        if self.use_global and self._n:
            self._global.extend_ndarray(self._next_seq, np.ascontiguousarray(self._buf[: self._n]))
            self._next_seq += 1


def load_arctic(path: str | None):
    path = path or os.environ.get("ARCTIC_SUFFIX_MODULE")
    if not path:
        return None
    so = sorted(glob.glob(str(Path(path) / "_C*.so"))) if Path(path).is_dir() else [path]
    if not so:
        print(f"no _C*.so under {path}: SuffixDecoding rows skipped", file=sys.stderr)
        return None
    spec = importlib.util.spec_from_file_location("_C", so[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sources(arctic, n_vocab: int, history_budget: int, which: set[str],
            grid: list[tuple[float, float]] = (), corpus=None, margins: tuple[int, ...] = (0,)):
    """(name, factory) for every source compared; each factory makes a fresh source (fresh history).

    ``grid``: extra ``(min_prob, local_weight)`` settings of ``suffix (with history)``; ``corpus``:
    an opened corpus index, for a ``suffix (history + corpus)`` row.
    """
    out = [
        ("ngram", lambda: NgramSource()),
        ("suffix (request only)", lambda: SuffixSource(n_vocab=n_vocab)),
        ("suffix (with history)",
         lambda: SuffixSource(history=History(budget=history_budget), n_vocab=n_vocab)),
    ]
    for p, w in grid:
        out.append((f"suffix (with history, p{p:g}, w{w:g})",
                    lambda p=p, w=w: SuffixSource(history=History(budget=history_budget), n_vocab=n_vocab,
                                                  min_prob=p, local_weight=w)))
    for m in margins if corpus is not None else ():
        out.append((f"suffix (history + corpus, margin {m})",
                    lambda m=m: SuffixSource(history=History(budget=history_budget), n_vocab=n_vocab,
                                             corpus=corpus, corpus_margin=m)))
    try:
        from promptlookup.drafting.lookup.source import LookupSource

        out.insert(1, ("lookup (no static cache)", lambda: LookupSource()))
    except ImportError:
        pass
    if arctic is not None:
        out += [
            ("SuffixDecoding (request only)", lambda: ArcticSource(arctic, "sd-local", False)),
            ("SuffixDecoding (global)", lambda: ArcticSource(arctic, "sd-global", True)),
            ("SuffixDecoding (global, p0, f2)",
             lambda: ArcticSource(arctic, "sd-best", True, factor=2.0, min_prob=0.0)),
        ]
    return [(n, f) for n, f in out if not which or any(w in n for w in which)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trio-wheel", help="a downloaded trio wheel (pip download --no-deps trio)")
    ap.add_argument("--arctic", help="directory with SuffixDecoding's built _C*.so")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--drafts", default="3,8")
    ap.add_argument("--texts", default="", help="comma-separated subset of text names")
    ap.add_argument("--sources", default="", help="comma-separated substrings of source names")
    ap.add_argument("--max-tokens", type=int, default=0, help="replay at most this many tokens per text")
    ap.add_argument("--history-budget", type=int, default=1 << 20)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache/promptlookup/suffix_bench"))
    ap.add_argument("--csv", help="write every cell here")
    ap.add_argument("--grid", default="",
                    help="extra suffix rows, 'P:W,P:W' = (min_prob, local_weight) pairs, or "
                         "'P1/P2/..:W1/W2/..' for every combination")
    ap.add_argument("--suffix-corpus", help="corpus index (promptlookup index) for history + corpus rows")
    ap.add_argument("--corpus-margins", default="0", help="comma-separated corpus_margin values")
    args = ap.parse_args(argv)
    grid: list[tuple[float, float]] = []
    for cell in filter(None, args.grid.split(",")):
        ps, ws = cell.split(":")
        grid += [(float(p), float(w)) for p in ps.split("/") for w in ws.split("/")]
    corpus = None
    if args.suffix_corpus:
        from promptlookup.drafting.suffix.corpus_index import open_index

        corpus = open_index(args.suffix_corpus)

    raw = texts(args.trio_wheel)
    if args.texts:
        raw = {k: v for k, v in raw.items() if k in args.texts.split(",")}
    toks = tokenize_all(raw, Path(args.cache_dir))
    arctic = load_arctic(args.arctic)
    n_vocab = 1 << 16
    which = {w for w in args.sources.split(",") if w}
    rows = []
    for name, ids in toks.items():
        if args.max_tokens:
            ids = ids[: args.max_tokens]
        for k in (int(x) for x in args.drafts.split(",")):
            for sname, factory in sources(arctic, n_vocab, args.history_budget, which, grid, corpus,
                                            tuple(int(m) for m in args.corpus_margins.split(","))):
                t0 = time.perf_counter()
                st = replay(ids, args.ctx, k, factory)
                wall = time.perf_counter() - t0
                row = dict(text=name, tokens=len(ids), draft=k, source=sname,
                           accept_per_token=st.n_accept / st.n_replayed if st.n_replayed else 0.0,
                           accept_pct=100 * st.accept, us_per_drafted=st.us_per_drafted,
                           n_drafted=st.n_drafted, n_accept=st.n_accept, n_replayed=st.n_replayed,
                           wall_s=wall)
                rows.append(row)
                print(f"{name:9s} k={k} {sname:32s} acc/tok {row['accept_per_token']:.3f} "
                      f"acc {row['accept_pct']:5.1f}% {row['us_per_drafted']:6.2f} us/drafted",
                      file=sys.stderr, flush=True)
    print("| text | source | acc/tok d3 | acc% d3 | us/drafted d3 | acc/tok d8 | acc% d8 | us/drafted d8 |")
    print("|---|---|---|---|---|---|---|---|")
    seen = []
    for r in rows:
        if (r["text"], r["source"]) not in seen:
            seen.append((r["text"], r["source"]))
    for text, source in seen:
        cells = [f"{text} ({rows[[x['text'] for x in rows].index(text)]['tokens']} tok)", source]
        for k in (3, 8):
            r = next((x for x in rows if x["text"] == text and x["source"] == source
                      and x["draft"] == k), None)
            cells += ([f"{r['accept_per_token']:.3f}", f"{r['accept_pct']:.1f}", f"{r['us_per_drafted']:.2f}"]
                      if r else ["", "", ""])
        print("| " + " | ".join(cells) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
