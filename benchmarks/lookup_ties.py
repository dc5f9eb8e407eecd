"""Why ``--lookup`` and llama.cpp's lookup-stats draft slightly different counts: ties and int32 overflow.

The rule is the same; two places where llama.cpp's result is an accident of its implementation are not
(docs/lookup.md): among followers with equal best score llama.cpp keeps whichever its unordered_map
iterates first (we keep the lowest id), and it computes ``count * 100 * static_count`` in int32, which
wraps on big corpora. This replays the first chunks of a text with the plain reference rule and counts,
per drafted token, whether the winner was decided by a tie, and whether a score in the winning cache's
scan (or the static fall-back) exceeds int32, i.e. where llama.cpp may have drafted something else.

    .venv/bin/python benchmarks/lookup_ties.py TEXT [STATIC_CACHE] [--chunks 8] [--draft 3]
"""

from __future__ import annotations

import argparse
import sys

from promptlookup.drafting.lookup.cache import NGRAM_MAX, NGRAM_STATIC, DictNgramCache
from promptlookup.drafting.lookup.source import (
    CONTEXT_MIN_PERCENT,
    CONTEXT_MIN_SAMPLE,
    DYNAMIC_MIN_PERCENT,
    DYNAMIC_MIN_SAMPLE,
    STATIC_WEIGHT,
)

I32 = 2**31 - 1


def draft_one(seq, context, dynamic, static, flags):
    """draft_one_reference, noting ties and int32 overflow of the deciding scan in ``flags``."""
    part_s = static.get(tuple(seq[-NGRAM_STATIC:])) if static is not None and len(seq) >= 2 else {}
    for cache, min_a, min_p in ((context, CONTEXT_MIN_SAMPLE, CONTEXT_MIN_PERCENT),
                                (dynamic, DYNAMIC_MIN_SAMPLE, DYNAMIC_MIN_PERCENT)):
        for n in range(NGRAM_MAX, 0, -1):
            if n > len(seq):
                continue
            part = cache.get(tuple(seq[-n:]))
            if not part:
                continue
            scores = {t: c * (STATIC_WEIGHT * part_s[t] if t in part_s else 1) for t, c in part.items()}
            best = max(scores.values())
            tok = min(t for t, v in scores.items() if v == best)
            total = sum(part.values())
            if total >= min_a[n - 1] and 100 * part[tok] >= min_p[n - 1] * total:
                flags["tie"] += sum(v == best for v in scores.values()) > 1
                flags["overflow"] += any(v > I32 for v in scores.values())
                return tok
    if part_s:
        total = sum(part_s.values())
        best = max(part_s.values())
        tok = min(t for t, c in part_s.items() if c == best)
        if total >= 2 and 100 * best >= 50 * total:
            flags["tie"] += sum(c == best for c in part_s.values()) > 1
            return tok
    return -1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("static", nargs="?")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--draft", type=int, default=3)
    ap.add_argument("-c", type=int, default=4096)
    args = ap.parse_args()
    from promptlookup.backends.models import bundled_model_path
    from promptlookup.build.tokenizers import VocabTokenizer
    from promptlookup.drafting.lookup.static_cache import open_static

    with open(args.text, "rb") as fh:
        toks = VocabTokenizer(bundled_model_path()).tokenize(fh.read()).tolist()
    static = open_static(args.static) if args.static else None
    dynamic = DictNgramCache()
    flags = {"tie": 0, "overflow": 0}
    n_drafted = n_accept = 0
    for c in range(args.chunks):
        chunk = toks[c * args.c : (c + 1) * args.c]
        if (c + 1) * args.c >= len(toks):
            break
        out = [chunk[0]]
        context = DictNgramCache()
        while len(out) < args.c:
            draft: list[int] = []
            while len(draft) < args.draft:
                t = draft_one(out + draft, context, dynamic, static, flags)
                if t < 0:
                    break
                draft.append(t)
            n_drafted += len(draft)
            for t in draft:
                if len(out) >= args.c or chunk[len(out)] != t:
                    break
                n_accept += 1
                out.append(t)
                context.update(out, nnew=1)
            if len(out) < args.c:
                out.append(chunk[len(out)])
                context.update(out, nnew=1)
        dynamic.merge(context)
        print(f"chunk {c + 1}: drafted {n_drafted}, accepted {n_accept}, decided by a tie {flags['tie']}, "
              f"int32 overflow in the deciding scan {flags['overflow']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
