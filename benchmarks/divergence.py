"""How often speculative and plain greedy outputs diverge on llama.cpp, and why.

llama.cpp does not compute a position's logits bit-identically when it decodes 1 + N tokens in one
batch instead of one at a time (a different matmul kernel path and reduction order). Where the top
two logits are nearly tied, that tiny difference can flip the argmax, and from there the two
greedy runs continue differently. Both are still exact greedy decodes of the logits they computed.

This script measures both halves:
  1. logits: decode a fixed text once token by token and once in batches of B; report the largest
     logit difference, the number of argmax flips, and the top-2 margin where flips happen;
  2. outputs: generate plain and with --ngram on each workload; report the first divergence.

    .venv/bin/python benchmarks/divergence.py [-n 256] [--batch 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from promptlookup.backends.llama_cpp import LlamaCppBackend
from promptlookup.backends.models import bundled_model_path
from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.speculate import generate

WORKLOADS = Path(__file__).parent / "workloads"


def logits_by(backend: LlamaCppBackend, prompt: list[int], text: list[int], batch: int) -> np.ndarray:
    backend.record_logits = True
    backend.recorded.clear()
    backend.prefill(prompt)
    for i in range(0, len(text), batch):
        backend.verify(text[i : i + batch])
    rows = np.stack([row for _, row in backend.recorded[1:]])  # drop the prefill row
    backend.record_logits = False
    backend.recorded.clear()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=None)
    args = ap.parse_args()
    b = LlamaCppBackend(bundled_model_path(), n_ctx=4096, n_threads=args.threads)

    print("## Batched vs single-token logits")
    print("| workload | positions | max abs diff | argmax flips | median top-2 margin at flips |")
    print("|---|---|---|---|---|")
    prompts = {}
    for path in sorted(WORKLOADS.glob("*.txt")):
        prompt = b.tokenize(b.chat_prompt(path.read_text()), parse_special=True)
        prompts[path.stem] = prompt
        text = generate(b, prompt, args.n).tokens
        single = logits_by(b, prompt, text, 1)
        batched = logits_by(b, prompt, text, args.batch)
        diff = np.abs(single - batched).max()
        a1, a2 = single.argmax(1), batched.argmax(1)
        flips = np.flatnonzero(a1 != a2)
        top2 = np.sort(single, axis=1)[:, -2:]
        margins = (top2[:, 1] - top2[:, 0])[flips]
        med = f"{np.median(margins):.3f}" if len(flips) else "-"
        print(f"| {path.stem} | {len(text)} | {diff:.3f} | {len(flips)} | {med} |")

    print("\n## Plain vs --ngram outputs")
    print("| workload | tokens | identical | first divergence at |")
    print("|---|---|---|---|")
    for name, prompt in prompts.items():
        plain = generate(b, prompt, args.n).tokens
        spec = generate(b, prompt, args.n, source=NgramSource(), draft=3).tokens
        first = next((i for i, (x, y) in enumerate(zip(plain, spec, strict=False)) if x != y), None)
        same = plain == spec
        where = "-" if first is None else str(first)
        print(f"| {name} | {len(plain)} | {'yes' if same else 'no'} | {where} |")


if __name__ == "__main__":
    main()
