"""The fuzz suite's generators, run longer: outcome counts per format and mutation.

    .venv/bin/python benchmarks/fuzz_formats.py --cases 2000 --seed 1 [--no-model]

Every case must end as ``ok`` (a valid result, then used) or ``error`` (the format's own clean
error); anything else is counted as ``crash:<exception>`` and makes the exit status 1. A process
abort (llama.cpp's tokenizer on a bad codepoint was one) ends the run, which is a failure too.
The generators and checks are ``tests/fuzz_cases.py`` (``tests/test_fuzz.py`` runs them in CI).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_cases import FORMATS, Bases, cases, chat_context, check  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000, help="cases per format (default 1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--no-model", action="store_true", help="text cases without the bundled tokenizer")
    ap.add_argument("--chat-cases", type=int, default=200, help="text cases also run through chat_tokens")
    args = ap.parse_args()
    ctx: dict = {}
    if not args.no_model and "text" in args.formats:
        from promptlookup.backends.llama_cpp import LlamaCppBackend
        from promptlookup.backends.models import bundled_model_path
        from promptlookup.build.memo_tokenizer import MemoTokenizer
        from promptlookup.build.tokenizers import VocabTokenizer

        vocab = VocabTokenizer(bundled_model_path())
        ctx = {"vocab": vocab, "memo": MemoTokenizer(vocab)}
        ctx.update(chat_context(LlamaCppBackend(bundled_model_path(), n_ctx=1024)))
        ctx["chat_budget"] = args.chat_cases
    counts: dict[str, collections.Counter] = {}
    crashes = 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bases = Bases(tmp, args.seed)
        for fmt in args.formats:
            t0 = time.perf_counter()
            c = counts[fmt] = collections.Counter()
            for kind, data in cases(fmt, bases, args.cases, args.seed):
                try:
                    outcome = check(fmt, data, tmp, ctx)
                except Exception as exc:  # noqa: BLE001 - counted: this is what the run looks for
                    outcome = f"crash:{type(exc).__name__}"
                    crashes += 1
                    print(f"{fmt}/{kind}: {type(exc).__name__}: {exc} on {data[:60]!r}", file=sys.stderr)
                c[kind, outcome] += 1
            print(f"{fmt}: {args.cases} cases in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print("| format | mutation | ok | error | crash |")
    print("|---|---|---|---|---|")
    for fmt, c in counts.items():
        for kind in dict.fromkeys(k for k, _ in c):
            crash = sum(v for (k, o), v in c.items() if k == kind and o.startswith("crash"))
            print(f"| {fmt} | {kind} | {c[kind, 'ok']} | {c[kind, 'error']} | {crash} |")
        ok = sum(v for (_, o), v in c.items() if o == "ok")
        err = sum(v for (_, o), v in c.items() if o == "error")
        print(f"| {fmt} | **all** | {ok} | {err} | {sum(c.values()) - ok - err} |")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
