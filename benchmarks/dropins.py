"""The drop-ins beside each engine's own prompt lookup, side by side in one process (not run in CI).

llama-cpp-python: one ``Llama`` (``logits_all=True``, as any draft model forces) runs its own
``generate`` loop plain, with its ``LlamaPromptLookupDecoding`` (num_pred_tokens 2 and 10) and with
our ``PromptLookupDraftModel`` (a fresh one per run, so no run drafts from an earlier run's answer;
``auto``'s cost curves are measured before any timed run).
transformers: the bundled GGUF dequantized to fp32, ``model.generate`` plain and with
``prompt_lookup_num_tokens`` 3 and 10, and our ``integrations.transformers.generate``.

Rates are generated tokens over decode time (the wall time after the first new token; for our
transformers drop-in, which takes no streamer, the wall time minus the plain row's prefill time in
the same round: the same prompt through the same forward). Rows alternate order per round; "equal"
says whether a row's tokens equal the same engine's plain run in that round.

    .venv/bin/python benchmarks/dropins.py [-n 256] [--rounds 2] [--workloads copy_edit,prose] \
        [--sources default,suffix,ngram]

The source ``default`` is the one-line change itself: ``PromptLookupDraftModel()`` with no argument
(``auto`` on the prior cost curve: no ``model_path=``) and ``generate(model, ids)`` with no ``source``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from promptlookup.backends.models import bundled_model_path
from promptlookup.backends.transformers import TransformersBackend
from promptlookup.chat import chat_tokens
from promptlookup.integrations.llama_cpp import PromptLookupDraftModel
from promptlookup.integrations.transformers import generate as hf_generate
from promptlookup.integrations.transformers import make_drafter
from promptlookup.measure.peers import LlamaCppPeer, hf_prompt_lookup

WORKLOADS = Path(__file__).parent / "workloads"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", default="copy_edit,prose")
    ap.add_argument("--sources", default="default",
                    help="our source specs, comma-separated; 'default' is each drop-in with no arguments")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    model = bundled_model_path()
    tb = TransformersBackend(model, n_ctx=4096, n_threads=args.threads)
    eos = sorted(tb.eog_ids)
    peer = LlamaCppPeer(model, n_ctx=4096, n_threads=args.threads)
    ours = args.sources.split(",")

    def draft_model(src: str) -> PromptLookupDraftModel:
        return PromptLookupDraftModel() if src == "default" else PromptLookupDraftModel(src, model_path=model)

    def hf_source(src: str) -> dict:
        return {} if src == "default" else {"source": src}

    for src in ours:  # auto's verify cost curve: measured (or read) now, outside the timed runs
        make_drafter(tb.model, **hf_source(src))
        draft_model(src)
    rows: dict[tuple[str, str, str], list[tuple[float, bool]]] = {}

    def note(wl: str, engine: str, row: str, tps: float, equal: bool) -> None:
        rows.setdefault((wl, engine, row), []).append((tps, equal))

    for wl in args.workloads.split(","):
        prompt = chat_tokens(tb, (WORKLOADS / f"{wl}.txt").read_text(encoding="utf-8"))
        for r in range(args.rounds):
            # llama-cpp-python
            cells = [("plain", 0), ("LlamaPromptLookupDecoding 2", 2), ("LlamaPromptLookupDecoding 10", 10),
                     *((f"promptlookup {src}", -1) for src in ours)]
            cells = cells if r % 2 == 0 else cells[::-1]
            runs = {}
            for name, pred in cells:
                dm = draft_model(name.split()[1]) if pred < 0 else None
                runs[name] = peer.run(prompt, args.n, max(pred, 0), draft_model=dm, name=name)
            for name, run in runs.items():
                note(wl, "llama-cpp-python", name, run.tps, run.tokens == runs["plain"].tokens)
            # transformers
            cells = [("plain", 0), ("prompt_lookup_num_tokens 3", 3), ("prompt_lookup_num_tokens 10", 10),
                     *((f"promptlookup {src}", -1) for src in ours)]
            cells = cells if r % 2 == 0 else cells[::-1]
            toks, tps, prefill = {}, {}, None
            for name, pld in cells:
                if pld >= 0:
                    run = hf_prompt_lookup(tb.model, prompt, args.n, pld, eos)
                    toks[name], tps[name] = run.tokens, run.tps
                    if pld == 0:
                        prefill = run.prefill_s
                else:
                    ids = torch.tensor([prompt])
                    t0 = time.perf_counter()
                    out = hf_generate(tb.model, ids, max_new_tokens=args.n, eos_token_id=eos,
                                      **hf_source(name.split()[1]))
                    wall = time.perf_counter() - t0
                    toks[name] = out[0, len(prompt):].tolist()
                    tps[name] = wall  # converted below, once the plain row's prefill is known
            for src in ours:  # our rows hold their wall time so far
                row = f"promptlookup {src}"
                tps[row] = len(toks[row]) / max(tps[row] - (prefill or 0.0), 1e-9)
            for name in toks:
                note(wl, "transformers", name, tps[name], toks[name] == toks["plain"])
            print(f"{wl} round {r + 1} done", flush=True)

    print("\n| workload | engine | row | median tok/s | vs plain | plain band | equal to plain |")
    print("|---|---|---|---|---|---|---|")
    for (wl, engine, row), vals in rows.items():
        plain = [v for v, _ in rows[(wl, engine, "plain")]]
        med = statistics.median(v for v, _ in vals)
        band = f"{min(plain):.2f}-{max(plain):.2f}"
        eq = f"{sum(e for _, e in vals)}/{len(vals)}"
        rel = med / statistics.median(plain)
        print(f"| {wl} | {engine} | {row} | {med:.2f} | {rel:.2f}x | {band} | {eq} |")
    peer.close()
    tb.close()


if __name__ == "__main__":
    main()
