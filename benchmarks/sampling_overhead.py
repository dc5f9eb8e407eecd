"""What sampling costs per emitted token, beside a plain decode's time, on the bundled model.

Why per sample() call: under speculation the backend samples a verify batch's rows in order and
stops at the first rejected draft, so a step samples exactly the tokens it emits (accepted + 1):
the sampling overhead per emitted token is one ``Sampler.sample`` call whatever the draft source.

Two measurements, side by side:
  1. in isolation: a plain greedy run on llama.cpp (``-n`` tokens of each workload) records its
     logits rows; each setting's ``Sampler.sample`` is then timed on every row (median of
     ``--repeat`` passes), beside the greedy decode's median time per token and the argmax it does;
  2. end to end: plain greedy and plain sampled decodes (temp 0.8), interleaved ``--rounds`` times,
     as a sanity check (their difference is within the decode noise).

    .venv/bin/python benchmarks/sampling_overhead.py [-n 128] [-t 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from promptlookup.backends.llama_cpp import LlamaCppBackend
from promptlookup.backends.models import bundled_model_path
from promptlookup.sampling import Sampler, SamplingParams
from promptlookup.speculate import generate

WORKLOADS = Path(__file__).parent / "workloads"
SETTINGS = {
    "temp 0.8 (llama.cpp defaults: top-k 40, top-p 0.95, min-p 0.05)": (SamplingParams(temp=0.8), None),
    "temp 0.8 + repeat/presence/frequency penalties": (
        SamplingParams(temp=0.8, repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5), None),
    "temp 0.8, top-k 0 (whole-vocabulary sort, as llama.cpp)": (SamplingParams(temp=0.8, top_k=0), None),
    "temp 0.8 + logprobs 5": (SamplingParams(temp=0.8), 5),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-w", "--workloads", nargs="+", default=["copy_edit", "prose"])
    args = ap.parse_args()

    backend = LlamaCppBackend(bundled_model_path(), n_ctx=4096, n_threads=args.threads)
    perf = time.perf_counter
    for name in args.workloads:
        text = (WORKLOADS / f"{name}.txt").read_text(encoding="utf-8")
        prompt = backend.tokenize(backend.chat_prompt(text), parse_special=True)
        backend.record_logits = True
        gen = generate(backend, prompt, args.n)
        rows = [row for pos, row in backend.recorded if pos >= len(prompt) - 1]
        backend.record_logits = False
        backend.recorded.clear()
        seq = prompt + gen.tokens
        decode_ms = 1000 * gen.counters.decode_s / max(gen.counters.decodes, 1)
        argmax_us = []
        for _ in range(args.repeat):
            t0 = perf()
            for row in rows:
                int(row.argmax())
            argmax_us.append(1e6 * (perf() - t0) / len(rows))
        print(f"\n{name}: {len(rows)} positions; plain greedy decode {decode_ms:.2f} ms/token "
              f"(its argmax {statistics.median(argmax_us):.1f} us)")
        print("| sampler | us per emitted token (median) | vs a plain decode |")
        print("|---|---|---|")
        for label, (params, logprobs) in SETTINGS.items():
            sampler = Sampler(params, seed=1, logprobs=logprobs)
            per = []
            for _ in range(args.repeat):
                t0 = perf()
                for j, row in enumerate(rows):
                    sampler.sample(row, seq, len(prompt) + j)
                per.append(1e6 * (perf() - t0) / len(rows))
            us = statistics.median(per)
            print(f"| {label} | {us:.1f} | {100 * us / (1000 * decode_ms):.2f}% |")

        tps: dict[str, list[float]] = {"greedy": [], "temp 0.8": []}
        for _ in range(args.rounds):
            for label in tps:
                sampler = None if label == "greedy" else Sampler(SamplingParams(temp=0.8), seed=1)
                g = generate(backend, prompt, args.n, sampler=sampler)
                tps[label].append(g.counters.generated_tokens / g.counters.decode_s)
        print("end to end, plain decode tok/s per round: "
              + "; ".join(f"{k} {' '.join(f'{v:.1f}' for v in vs)} (median {statistics.median(vs):.1f})"
                          for k, vs in tps.items()))
    backend.close()


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
