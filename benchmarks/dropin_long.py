"""The llama-cpp-python drop-in on a long request: a ~2,000-token prompt, 512 new tokens, streamed and not.

Why: llama-cpp-python sizes its score buffer by ``n_batch`` unless ``logits_all=True``, so the documented
one-line change used to die past 512 positions; this is the check that the documented line (here
through ``speculative_llama``) carries a long prompt and a long answer, beside the same ``Llama``
without a draft model, in one run.

    .venv/bin/python benchmarks/dropin_long.py [--prompt-tokens 2000] [-n 512] [-t 2]

The prompt asks the model to repeat a slice of a standard-library module (a real text, read from this
machine's Python installation), trimmed to ``--prompt-tokens``.
"""

from __future__ import annotations

import argparse
import inspect
import time

GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 0}


def long_prompt(llama, n_tokens: int) -> str:
    import json.decoder
    import json.encoder

    code = inspect.getsource(json.encoder) + "\n" + inspect.getsource(json.decoder)
    ids = llama.tokenize(code.encode(), add_bos=False)[: n_tokens - 40]
    body = llama.detokenize(ids).decode("utf-8", "replace")
    return f"Here is a Python module:\n\n```python\n{body}\n```\n\nRepeat the module above exactly."


def run(llama, prompt: str, n: int, stream: bool) -> tuple[int, float, str]:
    messages = [{"role": "user", "content": prompt}]
    t0 = time.perf_counter()
    out = llama.create_chat_completion(messages, max_tokens=n, stream=stream, **GREEDY)
    if stream:
        text = "".join(c["choices"][0]["delta"].get("content", "") or "" for c in out)
        n_out = len(llama.tokenize(text.encode(), add_bos=False))
    else:
        text = out["choices"][0]["message"]["content"]
        n_out = out["usage"]["completion_tokens"]
    return n_out, time.perf_counter() - t0, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("-n", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    import llama_cpp

    from promptlookup.backends.models import bundled_model_path
    from promptlookup.integrations.llama_cpp import speculative_llama

    path = str(bundled_model_path())
    kw = {"n_ctx": 4096, "n_threads": args.threads, "n_threads_batch": args.threads, "verbose": False}
    plain = llama_cpp.Llama(model_path=path, **kw)
    ours = speculative_llama(path, **kw)
    prompt = long_prompt(plain, args.prompt_tokens)
    n_prompt = len(plain.tokenize(prompt.encode()))
    print(f"prompt: {n_prompt} tokens (text), {args.n} new tokens asked, -t {args.threads}")
    print("| row | stream | new tokens | seconds (prefill included) | new tok/s |")
    print("|---|---|---|---|---|")
    texts = {}
    for name, llama in (("plain Llama", plain), ("speculative_llama (auto)", ours)):
        for stream in (False, True):
            n_out, secs, text = run(llama, prompt, args.n, stream)
            texts[(name, stream)] = text
            print(f"| {name} | {stream} | {n_out} | {secs:.2f} | {n_out / secs:.1f} |", flush=True)
    s = ours.draft_model.stats()
    print(f"draft model: {s['drafted_tokens']} drafted, {s['accepted_tokens']} accepted "
          f"({100 * s['acceptance']:.1f}%), {s['requests']} requests")
    same = texts[("plain Llama", False)] == texts[("speculative_llama (auto)", False)]
    print(f"text equal to plain (not streamed): {same} (llama.cpp's batch numerics: docs/exactness.md)")
    plain.close()
    ours.close()


if __name__ == "__main__":
    main()
