"""The K-quant mixes other than Q4_K_M stay exact on the invariant build, whole models end to end.

Users run K-quant mixes other than Q4_K_M (Q5_K_M is the next download on most model pages, Q3_K_M
and Q2_K where memory is short). The invariant build has column kernels for Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, the K-quants Q2_K to Q6_K and F16 rows (each pair checked bit for bit against upstream's kernel
in test_mul_mat_cols); the IQ types take ggml's one-pair ``vec_dot`` (llamafile off, the tiled K-quant
matmul off, every repack but Q4_K's off: docs/exactness.md), which computes each (weight row, token)
pair on its own. These tests check whole models on real files: Qwen2.5-Coder-0.5B's Q4_K_M
requantized by llama.cpp's own quantizer (``llama_model_quantize`` through llama-cpp-python, a few
seconds each) into Q5_K_M and Q2_K, whose tensors are Q5_K, Q5_1, Q6_K, Q8_0 and Q3_K, Q4_0, Q5_0
(the 0.5B's 896-wide rows are not a multiple of 256, so the quantizer falls back to the 32-wide types
there). Files are made in the test's temporary folder, never cached or committed.
"""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path

import pytest
from test_batch_invariance import WORKLOADS, requires_invariant

#: name -> (llama.cpp's file type, the tensor types the file must hold: what the test covers)
MIXES = {
    "q5_k_m": (17, {"F32": 121, "Q8_0": 13, "Q5_1": 133, "Q6_K": 12, "Q5_K": 12}),
    "q2_k": (10, {"F32": 121, "Q8_0": 1, "Q4_0": 121, "Q5_0": 24, "Q3_K": 24}),
}
#: verify widths at the kernels' turning points (one row, the first batches, ggml's groups of 4 and
#: chunks of 16, both sides of them) and the widest draft the loop sends with room to spare
WIDTHS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)


def requantize(source: Path, out: Path, file_type: int) -> Path:
    """``source`` rewritten by llama.cpp's quantizer as ``file_type`` (a ``LLAMA_FTYPE_*``)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize returned {rc} for {out.name}"
    return out


def tensor_types(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    return dict(collections.Counter(t.tensor_type.name for t in GGUFReader(path).tensors))


@pytest.fixture(scope="module", params=sorted(MIXES))
def mix(request, tmp_path_factory):
    """(name, path, backend) of the 0.5B requantized into one mix."""
    from conftest import installed_model_path

    from promptlookup.backends.llama_cpp import LlamaCppBackend

    source = installed_model_path("qwen2.5-coder-0.5b")
    file_type, _ = MIXES[request.param]
    path = requantize(source, tmp_path_factory.mktemp("mix") / f"0.5b-{request.param}.gguf", file_type)
    backend = LlamaCppBackend(path, n_ctx=2048)
    try:
        yield request.param, path, backend
    finally:
        backend.close()
        path.unlink()


@requires_invariant
def test_the_mixes_hold_the_types_under_test(mix):
    name, path, _ = mix
    assert tensor_types(path) == MIXES[name][1]


@requires_invariant
def test_every_row_is_bit_identical_in_a_prefill_and_at_each_width(mix):
    from promptlookup.backends.llama_cpp_smoke import INVARIANCE_TOKENS, invariance_check, smoke_ids

    _, _, backend = mix
    ids = smoke_ids(backend, INVARIANCE_TOKENS)
    inv = invariance_check(backend, ids, widths=WIDTHS)
    # 328 prefill rows; per width w: its w rows plus the (33 - w // 2) rows leading up to it; 3 kept
    expected = 328 + sum(w + 33 - w // 2 for w in WIDTHS) + 3
    assert inv.rows == expected == 778
    assert (inv.identical, inv.max_abs_diff, inv.argmax_flips, inv.first) == (expected, 0.0, 0, "")


@requires_invariant
def test_speculative_output_equals_plain_decoding(mix):
    from promptlookup.backends.base import common_prefix
    from promptlookup.chat import chat_tokens
    from promptlookup.measure.bench import make_source, parse_cell
    from promptlookup.speculate import generate

    _, _, backend = mix
    prompt = chat_tokens(backend, (WORKLOADS / "copy_edit.txt").read_text(encoding="utf-8"))
    plain = generate(backend, prompt, 64, source=None).tokens
    assert len(plain) == 64
    # fixed sources: the loop is the one `auto` drives, and they need no timed cost curve (whose
    # timing would clear the cache); wide drafts, and the prompt kept cached (a prefill on these
    # types computes one pair of rows at a time)
    for spec in ("ngram:draft=8", "suffix:draft=8"):
        source, draft = make_source(parse_cell(spec), backend)
        keep = common_prefix(backend.tokens, prompt)
        assert keep >= len(prompt) - 1
        got = generate(backend, prompt, 64, source=source, draft=draft, keep=keep)
        assert got.tokens == plain, spec
        assert got.counters.accepted_tokens > 0, spec  # it did speculate, and drafts held
