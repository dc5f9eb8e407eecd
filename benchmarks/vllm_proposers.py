"""vLLM's own proposers beside ours, same engine build, same process, interleaved (docs/vllm.md).

    .venv-vllm/bin/python benchmarks/vllm_proposers.py [--rows plain,ngram,...] [--max-tokens 256]

Rows (one engine each, all alive at once, enforce_eager, bf16 by default):
``plain`` (no speculation), ``ngram`` (vLLM's defaults: lookup 5..5, K=3), ``ngram8`` (its best
fixed setting on copy_edit in our earlier sweep: lookup 2..4, K=8), ``suffix`` (ArcticInference's
suffix trees, K=8; only if ``arctic_inference`` is importable), ``ours`` (the proposer's default
source, K=8: the suffix source with its cross-request history, since 2026-12-02 06:10 with each draft
capped at the length of its match, ``suffix:factor=1``, so ``ours-f1`` below now equals it),
``ours-auto`` (our ``auto`` source: it picks a source
and a draft length per step from measured step times, K=8 at most) and the K sweep of our default
source: ``ours3``, ``ours5``, ``ours12`` (K=3, 5, 12; not in the default rows), and ``ours-p10`` /
``ours-p30``: K=8 with drafts stopped before a token below estimated probability 0.1 / 0.3
(``suffix:min-prob=P``; ArcticInference's ``min_token_prob`` is 0.1); ``ours-f1`` / ``ours-f2`` /
``ours12-f1``: K=8 / 8 / 12 with each draft capped at 1 / 2 / 1 times the length of its match
(``suffix:factor=F``, ArcticInference's ``max_spec_factor``, 1.0 there); ``ours12-solo``: K=12
without drafting from concurrent requests' live outputs (``PROMPTLOOKUP_VLLM_PEERS=off``; every other
``ours`` row drafts from them, the proposer's default since 2026-12-02 08:20).

Workloads: copy_edit, prose, quote_doc (one request each), the two-request session (the second
request is measured; the history-keeping rows have just seen the first), and ``batch8``: 8 different
requests in one ``generate`` call. ``--concurrent N`` adds each workload as N identical requests in one
call (``copy_edit xN``, ...; the session's second request N times after its first); ``--workloads``
picks a subset by name. Every workload runs on every engine before the next workload
starts, in an order rotated per workload, so rows see the same minutes of a shared machine. Before
each workload our proposers forget their history and ArcticInference's ``suffix`` evicts every
response it cached (``LLM.collective_rpc``), so no row drafts from its own earlier run of the same
prompt. (Until 2026-12-02 08:45 ``suffix`` kept its cache: the x8 and batch rows that followed a
workload with the same prompts drafted from remembered answers: session x8 365 tok/s, 7.1 tokens per
step, against 222 for ours.)

Every engine gets the same OpenMP threads (``--threads``, default 1): vLLM's ``ngram`` silently
drops the model to one thread on CPU (numba's OpenMP layer), so equal threads is the only fair
comparison. Timings on a shared machine are noisy; tokens per step and acceptance are not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "workloads"
OURS = "promptlookup.integrations.vllm.PromptLookupProposer"
ROWS = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "ngram8": {"method": "ngram", "num_speculative_tokens": 8,
               "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
    "ours": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours-auto": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours3": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 3},
    "ours5": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 5},
    "ours12": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 12},
    "ours-p10": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours-p30": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours-f1": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours-f2": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 8},
    "ours12-f1": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 12},
    "ours12-solo": {"method": "custom_class", "model": OURS, "num_speculative_tokens": 12},
}
DEFAULT_ROWS = ("plain", "ngram", "ngram8", "suffix", "ours", "ours-auto", "ours3")
# our proposer's settings that vLLM's config cannot carry (docs/vllm.md): the environment of the
# engine's process, set while that engine starts (its engine-core process copies it)
ROW_ENV = {"ours-auto": {"PROMPTLOOKUP_VLLM_SOURCE": "auto"},
           "ours-p10": {"PROMPTLOOKUP_VLLM_SOURCE": "suffix:min-prob=0.1"},
           "ours-p30": {"PROMPTLOOKUP_VLLM_SOURCE": "suffix:min-prob=0.3"},
           "ours-f1": {"PROMPTLOOKUP_VLLM_SOURCE": "suffix:factor=1"},
           "ours-f2": {"PROMPTLOOKUP_VLLM_SOURCE": "suffix:factor=2"},
           "ours12-f1": {"PROMPTLOOKUP_VLLM_SOURCE": "suffix:factor=1"},
           "ours12-solo": {"PROMPTLOOKUP_VLLM_PEERS": "off"}}
BATCH_EXTRA = ["Name three uses of a hash table.", "Describe how rain forms, in one paragraph.",
               "Write a Python function that reverses a linked list.", "What is a mutex? Explain briefly."]


def _forget(worker) -> bool:
    """Run in vLLM's worker: make our proposer, or ArcticInference's suffix cache, forget the earlier
    workloads (see the module docstring)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "forget"):
        drafter.forget()
        return True
    cache = getattr(drafter, "suffix_cache", None)
    if cache is not None:  # vLLM's SuffixDecodingProposer: stop the requests it has not seen end
        for req_id in list(cache.active_requests):  # (the last batch: no step came after it)
            cache.stop_request(req_id)
        for req_id in list(cache.cached_requests):  # and evict every response it cached
            cache.evict_cached_response(req_id)
        return True
    return False


def _peer_stats(worker) -> list[int]:
    """Run in vLLM's worker: our proposer's drafts copied from concurrent requests so far."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None or not hasattr(drafter, "stats"):
        return [0, 0]
    got = drafter.stats()
    return [got.get("peer_drafts", 0), got.get("peer_tokens", 0)]


class SpecCounter:
    """This engine's speculative counters. ``LLM.get_metrics()`` reads the process-wide Prometheus
    registry, where only the engine made last is visible, so each engine gets this recorder in its
    own stat-logger list (vLLM 0.32's ``StatLoggerManager.stat_loggers``)."""

    def __init__(self) -> None:
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0) -> None:
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        if spec is not None:
            self.counts["drafts"] += spec.num_drafts
            self.counts["draft_tokens"] += spec.num_draft_tokens
            self.counts["accepted_tokens"] += spec.num_accepted_tokens

    def __getattr__(self, name):  # log(), log_engine_initialized(), record_sleep_state(): nothing to do
        return lambda *a, **k: None


def counters(llm) -> dict[str, float]:
    return dict(llm._promptlookup_counter.counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / ".venv-vllm" / "smollm2-hf"))
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"any of {', '.join(ROWS)}")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-gb", default="1")
    ap.add_argument("--out", default=None, help="also write the raw results as JSON")
    ap.add_argument("--concurrent", type=int, default=1,
                    help="also run each workload as this many identical requests at once (e.g. 8)")
    ap.add_argument("--workloads", default="", help="comma-separated subset of the workloads (default all)")
    a = ap.parse_args()
    if a.concurrent < 1:
        ap.error(f"--concurrent must be at least 1, got {a.concurrent}")
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=a.kv_gb,
                      VLLM_CPU_OMP_THREADS_BIND=f"0-{a.threads - 1}" if a.threads > 1 else "0",
                      VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # collective_rpc with a function
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    rows = a.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"vllm_proposers: error: unknown row(s) {', '.join(unknown)} "
                         f"(rows: {', '.join(ROWS)})")
    if "suffix" in rows:
        try:
            import arctic_inference  # noqa: F401
        except ImportError:
            print("suffix: arctic_inference is not installed here; row left out", file=sys.stderr)
            rows.remove("suffix")
    tok = AutoTokenizer.from_pretrained(a.model)

    def chat(text: str) -> TokensPrompt:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        return TokensPrompt(prompt_token_ids=ids)

    texts = {w: (WORK / f"{w}.txt").read_text() for w in ("copy_edit", "prose", "quote_doc")}
    first, second = [t.strip() for t in (WORK / "two_requests.txt").read_text().split("=== next request ===")]
    batch = [texts["copy_edit"], texts["prose"], texts["quote_doc"], first, *BATCH_EXTRA]
    workloads = {"copy_edit": [[texts["copy_edit"]]], "prose": [[texts["prose"]]],
                 "quote_doc": [[texts["quote_doc"]]], "session": [[first], [second]], "batch8": [batch]}
    if a.concurrent > 1:  # each workload again as that many identical requests in one generate call
        n = a.concurrent
        workloads.update({f"copy_edit x{n}": [[texts["copy_edit"]] * n],
                          f"prose x{n}": [[texts["prose"]] * n],
                          f"quote_doc x{n}": [[texts["quote_doc"]] * n],
                          f"session x{n}": [[first], [second] * n]})
    if a.workloads:
        unknown = [w for w in a.workloads.split(",") if w not in workloads]
        if unknown:
            raise SystemExit(f"vllm_proposers: error: unknown workload(s) {', '.join(unknown)} "
                             f"(workloads: {', '.join(workloads)})")
        workloads = {w: workloads[w] for w in a.workloads.split(",")}
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    engines = {}
    for name in rows:
        t0 = time.time()
        with mock.patch.dict(os.environ, ROW_ENV.get(name, {})):  # restored once the engine is up
            engines[name] = LLM(model=a.model, dtype=a.dtype, enforce_eager=True, max_model_len=4096,
                                seed=0, disable_log_stats=False, max_num_seqs=8,
                                speculative_config=ROWS[name])
        counter = SpecCounter()
        engines[name].llm_engine.logger_manager.stat_loggers.append(counter)
        engines[name]._promptlookup_counter = counter
        print(f"# {name}: engine up in {time.time() - t0:.0f} s", file=sys.stderr)
    results: list[dict] = []
    tokens: dict[tuple[str, str], list] = {}
    for wi, (wname, calls) in enumerate(workloads.items()):
        order = rows[wi % len(rows):] + rows[: wi % len(rows)]
        for name in order:
            llm = engines[name]
            if name.startswith("ours") or name == "suffix":
                llm.collective_rpc(_forget)
            for ci, call in enumerate(calls):
                before = counters(llm)
                peers_before = llm.collective_rpc(_peer_stats)[0] if name.startswith("ours") else [0, 0]
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                outs = llm.generate([chat(t) for t in call], params, use_tqdm=False)
                wall = time.perf_counter() - t0
                after = counters(llm)
                peers_after = llm.collective_rpc(_peer_stats)[0] if name.startswith("ours") else [0, 0]
                if ci < len(calls) - 1:
                    continue  # the session's first request only fills the history
                c = {k: after[k] - before.get(k, 0) for k in after}
                ids = [list(o.outputs[0].token_ids) for o in outs]
                tokens[(name, wname)] = ids
                n_out = sum(len(x) for x in ids)
                results.append({"row": name, "workload": wname, "tok_s": n_out / wall, "wall_s": wall,
                                "out_tokens": n_out, "drafts": c.get("drafts", 0),
                                "draft_tokens": c.get("draft_tokens", 0),
                                "accepted": c.get("accepted_tokens", 0), "load1": load,
                                "peer_tokens": peers_after[1] - peers_before[1]})
                print(json.dumps(results[-1]), file=sys.stderr)
    print(f"\nvLLM {__import__('vllm').__version__}, {a.dtype}, eager, {a.threads} OpenMP thread(s), "
          f"{a.max_tokens} tokens greedy, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores (shared: see load)\n")
    print("| row | workload | tok/s | out tokens | accepted / drafted | drafted from concurrent requests "
          "| tokens per step | same tokens as plain | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        same = "-"
        if ("plain", r["workload"]) in tokens and r["row"] != "plain":
            a_, b_ = tokens[(r["row"], r["workload"])], tokens[("plain", r["workload"])]
            same = f"{sum(x == y for x, y in zip(a_, b_, strict=True))}/{len(b_)}"
        steps = r["out_tokens"] - r["accepted"]
        per_step = r["out_tokens"] / steps if steps else float("nan")
        acc = f"{r['accepted']:.0f} / {r['draft_tokens']:.0f}" if r["row"] != "plain" else "-"
        peer = str(r["peer_tokens"]) if r["row"].startswith("ours") else "-"
        print(f"| {r['row']} | {r['workload']} | {r['tok_s']:.1f} | {r['out_tokens']} | {acc} | {peer} | "
              f"{per_step:.2f} | {same} | {r['load1']:.1f} |")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
