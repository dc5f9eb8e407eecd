"""What structured output costs per verified position, beside a plain decode (issue 27).

Why this measurement: the grammar's mask is computed on the CPU for every position the sampler
chooses, including every row of a speculative verify batch, and greedy decoding with a mask loses the
backends' bulk argmax. That is the cost to hold under 5% of a decode. Per prompt (agent-like
requests for a tool call, constrained by a typical tool schema), on the bundled SmolLM2 (llama.cpp):

1. ``plain``: the same request unconstrained, ``--speculate off``: seconds per decode (one token).
2. ``json``: constrained, ``--speculate off`` and ``ngram``: every call of the sampler is timed
   (``Sampler.sample``: the grammar sync, the mask, the choice); ``mask/pos`` is that time per
   position it chose (verify rows included), ``% of decode`` its share of a plain decode. It is an
   upper bound of what the grammar adds: it includes the argmax over the vocabulary that the plain
   decode also takes (in bulk, inside the backend).

The tokenizer view llguidance builds once per engine (about a second) is reported apart: it is not
per request. Times are medians over ``--repeat`` runs; the machine's load moves them, the ratio
less. Nothing is asserted (this is not a test)::

    python benchmarks/grammar_cost.py -t 2 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["read_file", "edit_file", "run_tests", "search"]},
        "arguments": {"type": "object", "properties": {
            "path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"},
            "query": {"type": "string"}, "replacement": {"type": "string"}},
            "required": ["path"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
PROMPTS = [
    "Read lines 10 to 40 of src/promptlookup/sampling.py with a tool call, as JSON.",
    "Run the tests in tests/test_grammar.py with a tool call, as JSON.",
    "Search the file README.md for the word 'speculative' with a tool call, as JSON.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF (default: the bundled SmolLM2)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    args = ap.parse_args()

    from promptlookup.api import Engine
    from promptlookup.options import RequestOptions
    from promptlookup.sampling import Sampler

    timed = {"s": 0.0, "n": 0}
    original = Sampler.sample

    def sample(self, logits, tokens, n):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        tok = original(self, logits, tokens, n)
        timed["s"] += time.perf_counter() - t0
        timed["n"] += 1
        return tok

    Sampler.sample = sample  # type: ignore[method-assign]
    engine = Engine(args.model, threads=args.threads, n_ctx=2048, speculate="off", reuse_prefix=False)
    fmt = {"type": "json_schema", "json_schema": {"name": "tool", "schema": TOOL_SCHEMA}}
    t0 = time.perf_counter()
    engine._constraint(RequestOptions(response_format=fmt))
    print(f"grammar tokenizer (once per engine): {time.perf_counter() - t0:.2f} s", flush=True)

    print(f"\n{args.threads} threads, greedy, max {args.max_tokens} tokens, median of {args.repeat}\n")
    print("| prompt | plain decode | speculate | positions | mask/pos | % of decode | tokens | verifies |")
    print("|---|---|---|---|---|---|---|---|")
    for i, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        decode = []
        for _ in range(args.repeat):
            c = engine.chat(messages, max_tokens=args.max_tokens, temperature=0, speculate="off")
            decode.append(c.counters.decode_s / max(1, c.counters.decodes))
        per_decode = statistics.median(decode)
        for spec in ("off", "ngram"):
            per_pos, last = [], None
            for _ in range(args.repeat):
                timed.update(s=0.0, n=0)
                last = engine.chat(messages, max_tokens=args.max_tokens, temperature=0, speculate=spec,
                                   response_format=fmt)
                per_pos.append(timed["s"] / max(1, timed["n"]))
            mask = statistics.median(per_pos)
            assert last is not None
            print(f"| {i + 1} | {per_decode * 1e3:.2f} ms | {spec} | {timed['n']} | {mask * 1e6:.0f} us | "
                  f"{100 * mask / per_decode:.2f}% | {len(last.tokens)} | {last.counters.decodes} |",
                  flush=True)


if __name__ == "__main__":
    main()
