"""End-to-end check of the vLLM proposer, run by tests/test_vllm.py with the vLLM env's python.

    .venv-vllm/bin/python tests/vllm_e2e.py MODEL_DIR OUT.json

Two engines in this process on the converted bundled model, fp32 (bf16 changes near-tied argmaxes
when the verify batch changes shape, so only fp32 is token-identical), eager (about 18 s to start
instead of 60-120 s of torch.compile): plain decoding, and our proposer (default source ``suffix``,
history shared across requests). Writes what test_vllm.py asserts on: token identity on a copy
and a prose prompt and on 8 concurrent requests, and the acceptance counters of a two-request
session (the second request drafts from the first one's output). The second request's acceptance
without the first is replayed through the same :class:`RowTracker` over the same tokens (the
outputs are identical, so the replay drafts exactly what vLLM would see), to show the gain.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "workloads"
K = 8
MAX_TOKENS = 128
SPEC = {"method": "custom_class", "model": "promptlookup.integrations.vllm.PromptLookupProposer",
        "num_speculative_tokens": K}


def setup_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # every core for the model's OpenMP team ("auto" keeps one back, which is half of a 2-core box)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")


def spec_counters(llm) -> dict[str, float]:
    """vLLM's speculative counters so far (cumulative; the caller takes differences)."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value"):
            out[m.name.removeprefix("vllm:spec_decode_num_")] = out.get(m.name, 0) + m.value
    return out


def main(model: str, out_path: str) -> None:
    setup_env()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(model)

    def chat(text: str) -> list[int]:
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)

    copy, prose = (WORK / "copy_edit.txt").read_text(), (WORK / "prose.txt").read_text()
    quote = (WORK / "quote_doc.txt").read_text()
    first, second = [t.strip() for t in (WORK / "two_requests.txt").read_text().split("=== next request ===")]
    batch = [copy, prose, quote, first, second, copy.replace("rgb_to_hls", "rgb_to_hls_fast"),
             "Name three uses of a hash table.", "Describe how rain forms, in one paragraph."]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    def run(llm, texts: list[str]) -> tuple[list[list[int]], dict[str, float]]:
        before = spec_counters(llm)
        outs = llm.generate([TokensPrompt(prompt_token_ids=chat(t)) for t in texts], params, use_tqdm=False)
        after = spec_counters(llm)
        return [list(o.outputs[0].token_ids) for o in outs], {k: after[k] - before.get(k, 0) for k in after}

    kw = dict(model=model, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
              disable_log_stats=False, max_num_seqs=8)
    t0 = time.time()
    spec = LLM(speculative_config=SPEC, **kw)
    r: dict = {"start_s": round(time.time() - t0, 1)}
    s_first, _ = run(spec, [first])  # the session first, so its history holds only the first request
    s_second, c_second = run(spec, [second])
    s_copy, c_copy = run(spec, [copy])
    s_prose, c_prose = run(spec, [prose])
    s_batch, c_batch = run(spec, batch)
    r["history_saved"] = Path(os.environ.get("PROMPTLOOKUP_VLLM_HISTORY", "/nonexistent")).exists()
    del spec
    plain = LLM(**kw)
    p_first, _ = run(plain, [first])
    p_second, _ = run(plain, [second])
    p_copy, _ = run(plain, [copy])
    p_prose, _ = run(plain, [prose])
    p_batch, _ = run(plain, batch)
    r.update(copy_identical=s_copy == p_copy, prose_identical=s_prose == p_prose,
             batch_identical=sum(a == b for a, b in zip(s_batch, p_batch, strict=True)),
             session_identical=(s_first, s_second) == (p_first, p_second),
             copy_accepted=c_copy.get("accepted_tokens", 0), copy_drafted=c_copy.get("draft_tokens", 0),
             prose_accepted=c_prose.get("accepted_tokens", 0), prose_drafted=c_prose.get("draft_tokens", 0),
             batch_accepted=c_batch.get("accepted_tokens", 0), batch_drafted=c_batch.get("draft_tokens", 0),
             session_second_accepted=c_second.get("accepted_tokens", 0),
             session_second_drafted=c_second.get("draft_tokens", 0),
             session_second_alone_accepted=replay_alone(chat(second), p_second[0], len(tok)),
             output_tokens={"copy": len(p_copy[0]), "prose": len(p_prose[0]), "second": len(p_second[0])})
    Path(out_path).write_text(json.dumps(r, indent=1))
    print(json.dumps(r, indent=1))


def replay_alone(prompt: list[int], output: list[int], n_vocab: int) -> int:
    """Accepted drafted tokens for ``prompt`` -> ``output`` with an empty history: the proposer's
    own tracker, fed the steps a greedy verifier would take."""
    import numpy as np

    from promptlookup.drafting.spec import Run, SourceSpec, source_factory
    from promptlookup.integrations.vllm import RowTracker

    make = source_factory(SourceSpec.parse("suffix"), Run(n_vocab, lambda: ""))
    t = RowTracker(make, K, 4096)  # type: ignore[arg-type]
    ids = np.zeros((1, 4096), dtype=np.int32)
    ids[0, : len(prompt)] = prompt
    n, done, accepted, new = len(prompt), 0, 0, [output[0]]
    while True:
        ids[0, n : n + len(new)] = new
        n, done = n + len(new), done + len(new)
        if done >= len(output):
            return accepted
        draft = t.step([new], np.array([n], dtype=np.int32), ids)[0]
        ok = 0
        while ok < len(draft) and done + ok < len(output) and draft[ok] == output[done + ok]:
            ok += 1
        accepted += ok
        new = output[done : done + ok + 1]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
