"""The batch-invariant llama.cpp build on the real model: every position's logits are bit-identical
however the positions were batched, so speculative output equals plain decoding token for token.

These tests run only where the installed llama.cpp was built with set-up's ``invariant`` kernels
(``promptlookup.llama_build``; its system info shows neither LLAMAFILE nor REPACK); on a build with the
fast kernels they skip, and ``test_the_fast_build_is_not_invariant`` says what that build does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAVE_MODEL

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "benchmarks" / "workloads"


def _installed_build_is_invariant() -> bool:
    if not HAVE_MODEL:
        return False
    import llama_cpp

    from promptlookup.backends.llama_cpp import invariant_build, system_info

    return invariant_build(system_info(llama_cpp))


INVARIANT = _installed_build_is_invariant()
requires_invariant = pytest.mark.skipif(
    not INVARIANT, reason="the installed llama.cpp is not the batch-invariant build "
                          "(PROMPTLOOKUP_LLAMA_KERNELS=invariant scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def reference(real_backend):
    """The smoke check's tokens, each position decoded alone (one token per llama_decode)."""
    from promptlookup.backends.llama_cpp_smoke import INVARIANCE_TOKENS, reference_rows, smoke_ids

    ids = smoke_ids(real_backend, INVARIANCE_TOKENS)
    return ids, reference_rows(real_backend, ids)


#: the models whose every weight type the invariant build must keep invariant: the bundled SmolLM2
#: (Q4_1, Q8_0), and Qwen2.5-Coder's K-quant mixes (0.5B: Q5_0, Q8_0, Q4_K, Q6_K; 1.5B: Q4_K, Q6_K,
#: in the marked set)
MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.qwen15)]


@pytest.fixture(scope="module", params=MODELS)
def model(request, real_backend, reference):
    """(path, backend on two threads, the smoke tokens, their one-token rows) of each model."""
    if request.param == "smollm2-135m":
        yield real_backend.model_path, real_backend, *reference
        return
    from conftest import installed_model_path

    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.llama_cpp_smoke import INVARIANCE_TOKENS, reference_rows, smoke_ids

    path = installed_model_path(request.param)
    backend = LlamaCppBackend(path, n_ctx=2048)
    try:
        ids = smoke_ids(backend, INVARIANCE_TOKENS)
        yield path, backend, ids, reference_rows(backend, ids)
    finally:
        backend.close()


@requires_invariant
def test_every_row_is_bit_identical_at_every_width_in_a_prefill_and_after_a_kept_prefix(model):
    from promptlookup.backends.llama_cpp_smoke import invariance_check

    _, backend, ids, ref = model
    inv = invariance_check(backend, ids, widths=range(1, 65), reference=ref)
    assert len(ids) == 328
    # 328 prefill rows; per width w: its w rows plus the (33 - w // 2) rows leading up to it; 3 kept
    assert inv.rows == 328 + sum(w + 33 - w // 2 for w in range(1, 65)) + 3 == 3499
    assert (inv.identical, inv.max_abs_diff, inv.argmax_flips, inv.first) == (3499, 0.0, 0, "")
    assert inv.line() == "batch-invariant: all 3499 rows bit-identical to one-token decodes"
    assert backend.n_past == 0


@requires_invariant
def test_the_threads_do_not_change_a_row(model):
    """One thread and two split every matmul differently across threads: same bits."""
    from promptlookup.backends.llama_cpp import LlamaCppBackend
    from promptlookup.backends.llama_cpp_smoke import invariance_check

    path, _, ids, ref = model
    one = LlamaCppBackend(path, n_ctx=2048, n_threads=1)
    try:
        inv = invariance_check(one, ids, widths=(1, 9), reference=ref)
    finally:
        one.close()
    # widths 1 and 9 start from position 251: lead-ins of 5 and 1 rows up to their batches
    assert inv.line() == "batch-invariant: all 347 rows bit-identical to one-token decodes"
    assert inv.rows == 328 + (5 + 1) + (1 + 9) + 3 == 347


@requires_invariant
def test_with_flash_attention_every_row_is_bit_identical_too(reference):
    """Set-up's invariant build patches flash attention to one path for every batch shape, so turning
    it on keeps invariance: the smoke tokens (328: past 256 cached cells, where upstream splits the KV
    of a one-token decode) at widths 1, 9 and 64 (where upstream tiles). Flash attention does reach
    llama.cpp: its rows round differently from the rows without it (the same argmax)."""
    import llama_cpp
    import numpy as np

    from promptlookup.backends.llama_cpp import LlamaCppBackend, one_path_flash_attention, system_info
    from promptlookup.backends.llama_cpp_smoke import invariance_check, reference_rows
    from promptlookup.backends.models import bundled_model_path

    assert one_path_flash_attention(system_info(llama_cpp))
    ids, without = reference
    on = LlamaCppBackend(bundled_model_path(), n_ctx=1024, flash_attention=True)
    try:
        assert on.flash_attention is True
        ref = reference_rows(on, ids)
        inv = invariance_check(on, ids, widths=(1, 9, 64), reference=ref)
    finally:
        on.close()
    # 328 prefill rows; per width w: its w rows plus the (33 - w // 2) rows leading up to it; 3 kept
    assert inv.line() == "batch-invariant: all 468 rows bit-identical to one-token decodes"
    assert inv.rows == 328 + sum(w + 33 - w // 2 for w in (1, 9, 64)) + 3 == 468
    differ = sum(not np.array_equal(a, b) for a, b in zip(ref, without, strict=True))
    assert differ > 0
    assert all(int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(ref[:32], without[:32], strict=True))


def _workload(name: str) -> str:
    return (WORKLOADS / f"{name}.txt").read_text(encoding="utf-8")


@requires_invariant
@pytest.mark.parametrize("workload", ["copy_edit", "prose"])
def test_speculative_output_equals_plain_decoding_for_every_source(model, workload):
    from promptlookup.chat import chat_tokens
    from promptlookup.measure.bench import make_source, parse_cell
    from promptlookup.sampling import Sampler, SamplingParams
    from promptlookup.speculate import generate

    _, backend, _, _ = model
    n = 256 if backend.model_path.name.startswith("SmolLM2") else 128  # the larger models cost more a token
    prompt = chat_tokens(backend, _workload(workload))
    plain = generate(backend, prompt, n, source=None).tokens
    assert len(plain) == n or backend.model_path.name.startswith("qwen") and len(plain) > 32
    for spec in ("auto", "ngram:draft=8", "lookup", "suffix"):
        source, draft = make_source(parse_cell(spec), backend)
        got = generate(backend, prompt, n, source=source, draft=draft)
        assert got.tokens == plain, f"{spec} left plain decoding at token {_first_diff(got.tokens, plain)}"
        # it did speculate: drafts went into verify batches wider than 1 (auto may decline to draft on
        # prose, where its cost curve says drafting loses, as on Qwen2.5-Coder 0.5B); on copy_edit
        # some were accepted too (the 1.5B's prose repeats too little for a fixed source to land one)
        if spec != "auto" or workload == "copy_edit":
            assert got.counters.drafted_tokens > 0, spec
        if workload == "copy_edit":
            assert got.counters.accepted_tokens > 0, spec

    def sampled(spec: str | None) -> list[int]:
        source, draft = make_source(parse_cell(spec), backend) if spec else (None, 1)
        sampler = Sampler(SamplingParams(temp=0.7), seed=1234)
        return generate(backend, prompt, n, source=source, draft=draft, sampler=sampler).tokens

    base = sampled(None)
    for spec in ("auto", "ngram:draft=8"):
        got = sampled(spec)
        assert got == base, f"sampled {spec} left plain sampling at token {_first_diff(got, base)}"


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@requires_invariant
def test_the_cli_generates_the_same_text_with_and_without_speculation(tmp_path):
    """The issue's acceptance command: the default (auto) against --speculate off, 256 tokens."""
    def run(*extra: str) -> str:
        cmd = [sys.executable, "-m", "promptlookup", "generate", "--chat", "-f",
               str(WORKLOADS / "copy_edit.txt"), "-n", "256", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp_path).stdout

    plain = run("--speculate", "off")
    assert len(plain) > 200
    assert run() == plain


@pytest.mark.skipif(INVARIANT or not HAVE_MODEL, reason="needs the fast (default llama.cpp) kernels")
def test_the_fast_build_is_not_invariant(real_backend, reference):
    """What the invariant build fixes: with tinyBLAS, batched rows round differently (measured here:
    nearly every row differs, by up to ~1.7 logits)."""
    from promptlookup.backends.llama_cpp_smoke import invariance_check

    ids, ref = reference
    inv = invariance_check(real_backend, ids, widths=(9,), reference=ref)
    assert not inv.bitwise and inv.line().startswith("not batch-invariant: ")


def test_the_comparison_is_bitwise_and_names_the_first_row_that_differs():
    """No tolerance: one ulp is a difference, -0.0 against 0.0 too (different bits)."""
    import numpy as np

    from promptlookup.backends.llama_cpp_smoke import Invariance

    want = [np.array([1.0, 2.0, 3.0], dtype=np.float32), np.array([0.0, 5.0, 1.0], dtype=np.float32)]
    inv = Invariance()
    inv.add("verify width 2", 10, [w.copy() for w in want], want)
    assert inv.bitwise and inv.line() == "batch-invariant: all 2 rows bit-identical to one-token decodes"
    ulp = np.nextafter(np.float32(3.0), np.float32(4.0))
    inv.add("verify width 3", 20, [np.array([1.0, 2.0, ulp], dtype=np.float32),
                                   np.array([-0.0, 5.0, 1.0], dtype=np.float32),
                                   np.array([1.0, 2.0, 3.0], dtype=np.float32)], [*want, want[0]])
    assert not inv.bitwise
    assert inv.by_case == {"verify width 2": [2, 2], "verify width 3": [3, 1]}
    assert inv.max_abs_diff == float(ulp - np.float32(3.0))
    assert inv.line() == ("not batch-invariant: 2/5 rows differ from one-token decodes (max |diff| "
                          "2.38e-07, 0 argmax flips; first: verify width 3, position 20)")
    assert not Invariance().bitwise  # nothing compared proves nothing


@requires_invariant
def test_the_server_repeats_a_request_whatever_ran_before_it():
    # The same temperature-0 request three times on a fresh server with auto (the default: history,
    # prefix reuse and measured-time choices all change which verify batches run), other requests
    # between them: identical token ids every time, and equal to the same request with speculate off.
    import httpx
    from serving import ServerProcess

    copy = (Path(__file__).resolve().parents[1] / "benchmarks" / "workloads" / "copy_edit.txt").read_text()
    ask = {"messages": [{"role": "user", "content": copy}], "max_tokens": 96, "temperature": 0,
           "return_token_ids": True}
    others = [{"messages": [{"role": "user", "content": t}], "max_tokens": 24, "temperature": 0}
              for t in ("Name three rivers.", "Repeat: one two three four five six.")]
    with ServerProcess() as server, httpx.Client(base_url=server.url, timeout=300) as c:
        def ids(body):
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0].get("token_ids")

        runs = [ids(ask)]
        for other in others:
            ids(other)
            runs.append(ids(ask))
        plain = ids({**ask, "speculate": "off"})
    assert runs[0] == runs[1] == runs[2] == plain and len(plain) > 20
