"""What to build: llama-cpp-python's CMake arguments, the ggml patches and the wheelhouse key.

Why this exists: llama-cpp-python ships only as source and compiles llama.cpp for the host. With
``-march=native`` the build switches on every ISA extension the CPU reports, AMX included, and the
AMX matmul of the ggml vendored in llama-cpp-python 0.3.36 dies by SIGILL on the first multi-token
decode (llama.cpp PR #26954). So on x86-64 the build names each extension itself (``GGML_NATIVE``
off), from what the CPU reports, minus those known to be broken upstream (:data:`BROKEN_ISA`).

By default it also leaves out the matmul kernels whose result for a row depends on the batch width
(:data:`INVARIANT_ARGS`: llamafile's tinyBLAS; the CPU repack is kept for Q4_K only, patched to round
one way, ``REPACK_ONE_ORDER = 1``, with a one-pass gemv of ours for 2-16 token rows,
``REPACK_GEMV_ROWS = 1``), so a position's logits are
bit-identical whether it is decoded alone or in a verify batch and speculative output equals plain
decoding (docs/exactness.md: measured ~10% slower prefill, 0-10% dearer verify steps, same decode).
The invariant build also patches one line of ggml's CPU flash attention (:data:`SOURCE_PATCHES`):
upstream picks a KV-split reduction for a one-token decode over 512+ cells and a tiled one for 64+
query rows, so a row's attention would depend on the batch; patched, every batch shape takes the
one per-row path (the reference path upstream keeps for testing), and the build says so in its system
info (``FA_ONE_PATH = 1``), which is how the backend knows it may turn flash attention on. It also adds
a matmul of ours for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K to Q6_K and for attention's F16
rows on x86 (``ggml_patches/``, package data: a weight row against up to 16 tokens at once, every result
bit-identical to upstream's one-pair kernel; ``MUL_MAT_COLS = 2``), and hands a verify's 2-16 token
rows the 64-row chunks of weights that one token gets (upstream: 16; a chunk only says which thread
computes a row, so no result depends on it).
``--kernels fast`` (or ``PROMPTLOOKUP_LLAMA_KERNELS=fast``) keeps llama.cpp's defaults.

The wheel is kept in a wheelhouse keyed by everything that decides its bytes (package version, the
CMake arguments, the compiler, the patches' text), so a wheel built with other flags is never reused.

Standard library only: set-up runs it on the system Python, before promptlookup's dependencies are
installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TORCH_VERSION = "2.13.0"

#: ggml ISA options whose code is broken upstream in the vendored version: always built off.
BROKEN_ISA = ("AMX_TILE", "AMX_INT8", "AMX_BF16")
#: ggml ISA option -> the /proc/cpuinfo flags it needs (all of them).
HOST_ISA: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE42", ("sse4_2",)),
    ("AVX", ("avx",)),
    ("AVX2", ("avx2",)),
    ("FMA", ("fma",)),
    ("F16C", ("f16c",)),
    ("BMI2", ("bmi2",)),
    ("AVX_VNNI", ("avx_vnni",)),
    ("AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("AVX512_VBMI", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi")),
    ("AVX512_VNNI", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni")),
    ("AVX512_BF16", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_bf16")),
)
#: the fall-back when the host build fails its smoke test: what every x86-64 CPU since 2013 has.
CONSERVATIVE_ISA = frozenset({"SSE42", "AVX", "AVX2", "FMA", "F16C"})
MODES = ("host", "conservative")
#: the matmul kernels: ``invariant`` builds llama.cpp without the kernels whose result for a row
#: depends on how many rows share the batch (llamafile's tinyBLAS, taken for 2+ rows; every repacked
#: weight layout but Q4_K's, whose gemv is patched to round as its gemm), so a position's logits are
#: bit-identical whether it is
#: decoded alone, in a verify batch or in a prefill, and speculative output equals plain decoding.
#: ``fast`` keeps them (llama.cpp's defaults).
KERNELS = ("invariant", "fast")
DEFAULT_KERNELS = "invariant"
INVARIANT_ARGS = ("-DGGML_LLAMAFILE=OFF",)
KERNELS_ENV = "PROMPTLOOKUP_LLAMA_KERNELS"


@dataclass(frozen=True)
class SourcePatch:
    """One exact text replacement in the llama-cpp-python source tree: ``old`` must occur exactly
    once in ``path`` (else the pinned version is not the one this was written for, and set-up stops
    rather than build something unproven)."""
    path: str
    old: str
    new: str


#: the invariant build's patches to the vendored ggml (0.3.36). Flash attention on the CPU chooses
#: among three reductions by batch shape: a KV split across threads for one query row over 512+
#: cells, 64-row tiles for 64+ query rows, else one row at a time over every cell in order. The last
#: is the same arithmetic for a row whatever else is in the batch (masked cells are skipped, so the
#: padding of the attended cells does not matter either); ggml keeps it as its reference path
#: (``use_ref``). The patch takes it always, and adds ``FA_ONE_PATH = 1`` to the system info.
FA_ONE_PATH_MARK = "FA_ONE_PATH = 1"
#: The second patch is a faster matmul for the two quant types of the bundled model (Q4_1 layers,
#: Q8_0 embeddings and output), on x86 with AVX2. ggml without its batch-dependent kernels computes a
#: matmul one (row, column) pair at a time (``vec_dot``), unpacking the weight row and converting its
#: scales again for every column, so a batch of tokens costs nearly what the same tokens cost one by
#: one. ``ggml_mul_mat_cols`` (ggml_patches/mul_mat_cols.c, inserted into ggml's x86
#: quants.c) takes a row against up to 16 columns at once and does, for each pair, exactly the
#: operations of upstream's ``vec_dot`` in the same order: every result is bit-identical to
#: upstream's, whatever the batch, and the build says so (``MUL_MAT_COLS = 2``: the second set of types,
#: with Q4_0, Q5_1, Q2_K, Q3_K and Q5_K).
MUL_MAT_COLS_MARK = "MUL_MAT_COLS = 2"
#: The third patch keeps the CPU repack (``GGML_CPU_REPACK``) for Q4_K, the weight type that most
#: K-quant GGUFs are made of, and makes it invariant. The repack interleaves 8 weight rows at load
#: time and has two kernels: a gemm for groups of 4 token rows and a gemv for the rest (a one-token
#: decode, and what is left of a batch). Both compute the same integer sums per 64 weights, exactly;
#: the gemm then multiplies-adds each of the 4 into the float result, while the gemv adds the 4
#: integers first and multiplies-adds once per 256 weights: other rounding, so a row's logits
#: depended on its batch (measured: 734 of 736 rows differ on Qwen2.5-Coder-0.5B). The patch makes
#: the gemv multiply-add per 64 weights as the gemm does; the activations' Q8_K quantization of the
#: two paths (upstream's ``quantize_row_q8_K`` and its 4-row twin) gives the same values for the same
#: row (the one case where they choose another sign for the scale, a largest magnitude seen both
#: positive and negative, negates both the integers and the scale: the same products). Every other
#: type the repack would take (Q4_0, IQ4_NL, Q2_K, MXFP4 on x86) stays in its file layout and takes
#: ggml's plain, invariant kernels (their repacked gemv and gemm were not checked); so does Q4_K on
#: CPUs other than x86 with AVX2, whose repack kernels are other code. The build says so
#: (``REPACK_ONE_ORDER = 1``).
REPACK_ONE_ORDER_MARK = "REPACK_ONE_ORDER = 1"
#: the C sources the patches insert: package data, so an installed promptlookup can build too
PATCH_DIR = Path(__file__).resolve().parent / "ggml_patches"
_FEATURES_END = "        features.push_back({ nullptr, nullptr });\n"
# A verify's few token rows: chunks of 64 weight rows, as for one token, not 16. Upstream's 16-row chunks at
# 2-16 tokens made the Q6_K output matrix (151,936 rows) 9,496 chunks, each claimed through one shared
# counter, and a 2-token verify's Q6_K time twice a decode's. A chunk is rows for one thread; no result
# depends on it.
_SMALL_CHUNKS = ("    if (nr0 == 1 || nr1 == 1) {\n        chunk_size = 64;\n    }\n\n"
                 "    // distribute the work")
_SMALL_CHUNKS_VERIFY = ("    if (nr0 == 1 || nr1 <= 16) {  // promptlookup: a verify's few rows too\n"
                        "        chunk_size = 64;\n    }\n\n    // distribute the work")
_CHUNK_LOOP = "    float tmp[32];\n\n    for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n"
_Q8_0_DECL = ("void ggml_vec_dot_q8_0_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * "
              "GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy, size_t by, int nrc);\n")
_MXFP4_DOT = "void ggml_vec_dot_mxfp4_q8_0(int n,"
_F16_DOT_DECL = ("void ggml_vec_dot_f16(int n, float * GGML_RESTRICT s, size_t bs, "
                 "ggml_fp16_t * GGML_RESTRICT x, size_t bx, ggml_fp16_t * GGML_RESTRICT y, size_t by, "
                 "int nrc);\n")
_F16_COLS_DECL = ("// promptlookup: rows [r0, r1) of an F16 matrix against nc F16 columns, each result as "
                  "ggml_vec_dot_f16's\n"
                  "void ggml_vec_dot_f16_cols(int n, const ggml_fp16_t * GGML_RESTRICT x, size_t x_stride, "
                  "int64_t r0, int64_t r1, const ggml_fp16_t * const * GGML_RESTRICT y, "
                  "float * const * GGML_RESTRICT s, int nc);\n")
_SILU_DEF = "void ggml_vec_silu_f32(const int n, float * y, const float * x) {\n"
#: the repacked Q4_K gemv (x86, AVX2): its accumulation after the loop over 64-weight groups
_Q4_K_GEMV_SUMS = (
    "                    // Accumulate for the complete block\n"
    "                    iacc_b = _mm256_add_epi32(iacc_b, iacc_sb);\n"
    "                    iacc_min_b = _mm256_add_epi32(iacc_min_b, iacc_min_sb);\n"
    "                }\n"
    "\n"
    "                // Multiply-Add with scale values for the complete super block\n"
    "                acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_b), _mm256_mul_ps(col_scale_f32, "
    "row_scale_f32), acc_row);\n"
    "                acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_b), "
    "_mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n"
)
_Q4_K_GEMV_PER_GROUP = (
    "                    // promptlookup: one multiply-add per 64 weights, as the gemm does (same rounding)\n"
    "                    (void) iacc_b; (void) iacc_min_b;\n"
    "                    acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_sb), _mm256_mul_ps(col_scale_f32, "
    "row_scale_f32), acc_row);\n"
    "                    acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_sb), "
    "_mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n"
    "                }\n"
)
#: the guard put first in the repack's choice of layout: Q4_K on x86 with AVX2 (the gemv patched
#: above), nothing elsewhere (other CPUs' Q4_K kernels are not patched, so they repack nothing)
_REPACK_ONLY_Q4_K_ON_X86 = (
    "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
    "    if (cur->type != GGML_TYPE_Q4_K) {  // promptlookup: the one repack made invariant\n"
    "        return nullptr;\n"
    "    }\n"
    "#else\n"
    "    return nullptr;  // promptlookup: no repack made invariant for this CPU\n"
    "#endif\n"
)
_REPACK_CHOICE = ("static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type("
                  "const struct ggml_tensor * cur) {\n")
#: The fourth patch: a repacked Q4_K matmul of 2 to :data:`GEMV_ROWS_MAX` token rows (a verify, a
#: batched round) takes ``ggml_gemv_q4_K_8x8_q8_K_rows`` (ggml_patches/q4_K_gemv_rows.cpp): one pass
#: over the weights for all its rows, each row's float steps those of the patched gemv, where upstream
#: runs the 4-row gemm and then the gemv once per row left over (a verify of 3 read every weight 3
#: times). Its rows are quantized one by one (``quantize_row_q8_K``, as a decode's row is). Measured
#: on Qwen2.5-Coder-1.5B (docs/exactness.md): a 9-token verify 143 ms against 184, bit-identical.
GEMV_ROWS_MAX = 16
_GEMV_DECL = ("void ggml_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, "
              "const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);\n")
_GEMV_ROWS_DECL = ("// promptlookup: the gemv above for nr <= 16 rows in one pass over the weights "
                   "(arch/x86/repack.cpp)\n"
                   "void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * GGML_RESTRICT s, size_t bs, "
                   "const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);\n")
_IQ4_NL_GEMV = "void ggml_gemv_iq4_nl_8x8_q8_0(int n,"
_TRAITS_CLASS = ("template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE> "
                 "class tensor_traits : public tensor_traits_base {\n")
_GEMV_ROWS_CHOICE = (
    "// promptlookup: which matmuls take ggml_gemv_q4_K_8x8_q8_K_rows (repacked Q4_K, x86 with AVX2, 2 to\n"
    f"// {GEMV_ROWS_MAX} token rows; one row keeps upstream's gemv, the same arithmetic); decided from "
    f"the row\n"
    "// count alone, so the quantization and the kernel agree\n"
    "template <typename T> struct promptlookup_is_q4_K { static constexpr bool value = false; };\n"
    "template <> struct promptlookup_is_q4_K<block_q4_K> { static constexpr bool value = true; };\n"
    "template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>\n"
    "static bool promptlookup_gemv_rows(int64_t nrows) {\n"
    "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
    "    return promptlookup_is_q4_K<BLOC_TYPE>::value && INTER_SIZE == 8 && NB_COLS == 8 && "
    f"PARAM_TYPE == GGML_TYPE_Q8_K && nrows >= 2 && nrows <= {GEMV_ROWS_MAX};\n"
    "#else\n"
    "    GGML_UNUSED(nrows);\n"
    "    return false;\n"
    "#endif\n"
    "}\n\n"
)
_QUANT_GROUPS = "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {\n"
_QUANT_GROUPS_ROWS = (
    "            // promptlookup: the rows of a one-pass gemv (promptlookup_gemv_rows) are quantized one "
    "by one\n"
    "            const int64_t pl_grouped =\n"
    "                promptlookup_gemv_rows<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne11) ? 0 : ne11 "
    "- ne11 % 4;\n"
    "            for (int64_t i11 = ith * 4; i11 < pl_grouped; i11 += nth * 4) {\n"
)
_QUANT_REST = "            const int64_t i11_processed = ne11 - ne11 % 4;\n"
_QUANT_REST_ROWS = "            const int64_t i11_processed = pl_grouped;  // promptlookup\n"
_GEMM_OR_GEMV = "        // If there are more than three rows in src1, use gemm; otherwise, use gemv.\n"
_GEMV_ROWS_CALL = (
    "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
    "        if (promptlookup_gemv_rows<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(nrows)) {  // "
    "promptlookup\n"
    "            ggml_gemv_q4_K_8x8_q8_K_rows(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
    "                                         src0_ptr + src0_start * nb01, src1_ptr, (int) nrows, (int) "
    "ncols);\n"
    "            return;\n"
    "        }\n"
    "#endif\n"
)


def _patch_text(name: str) -> str:
    try:
        return (PATCH_DIR / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"setup: error: cannot read the ggml patch {PATCH_DIR / name}: {exc}") from exc


SOURCE_PATCHES = (
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp",
        "    const bool use_ref = params->use_ref;\n",
        "    const bool use_ref = true;  // promptlookup: one reduction order for every batch shape\n",
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.cpp",
        _FEATURES_END,
        '        features.push_back({ "FA_ONE_PATH", "1" });  // promptlookup: see ops.cpp\n' + _FEATURES_END,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/arch/x86/quants.c",
        _MXFP4_DOT,
        _patch_text("mul_mat_cols.c") + "\n" + _MXFP4_DOT,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/quants.h",
        _Q8_0_DECL,
        _Q8_0_DECL + "// promptlookup: rows [r0, r1) of a Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or Q2_K-Q6_K matrix "
        "against nc "
        "columns, each result as vec_dot's; 0 (nothing done) where not available\n"
        "int ggml_mul_mat_cols(enum ggml_type type, int n, const void * GGML_RESTRICT x, "
        "size_t x_stride, int64_t r0, int64_t r1, const void * const * GGML_RESTRICT cols, "
        "float * const * GGML_RESTRICT outs, int nc);\n" + _F16_COLS_DECL,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/vec.h",
        _F16_DOT_DECL,
        _F16_DOT_DECL + _F16_COLS_DECL,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/vec.cpp",
        _SILU_DEF,
        _patch_text("vec_dot_f16_cols.cpp") + "\n" + _SILU_DEF,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
        _CHUNK_LOOP,
        "    float tmp[32];\n\n" + _patch_text("mul_mat_cols_call.c") + "\n"
        "    for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n",
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
        _SMALL_CHUNKS,
        _SMALL_CHUNKS_VERIFY,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.cpp",
        _FEATURES_END,
        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))"
        "  // promptlookup: see x86 quants.c\n"
        '        features.push_back({ "MUL_MAT_COLS", "2" });\n'
        "#endif\n" + _FEATURES_END,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/arch/x86/repack.cpp",
        _Q4_K_GEMV_SUMS,
        _Q4_K_GEMV_PER_GROUP,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp",
        _REPACK_CHOICE,
        _REPACK_CHOICE + _REPACK_ONLY_Q4_K_ON_X86,
    ),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.cpp",
        _FEATURES_END,
        '        features.push_back({ "REPACK_ONE_ORDER", "1" });  // promptlookup: see repack.cpp\n'
        + _FEATURES_END,
    ),
    SourcePatch("vendor/llama.cpp/ggml/src/ggml-cpu/repack.h", _GEMV_DECL, _GEMV_DECL + _GEMV_ROWS_DECL),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/arch/x86/repack.cpp",
        _IQ4_NL_GEMV,
        _patch_text("q4_K_gemv_rows.cpp") + "\n" + _IQ4_NL_GEMV,
    ),
    SourcePatch("vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp", _TRAITS_CLASS,
                _GEMV_ROWS_CHOICE + _TRAITS_CLASS),
    SourcePatch("vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp", _QUANT_GROUPS, _QUANT_GROUPS_ROWS),
    SourcePatch("vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp", _QUANT_REST, _QUANT_REST_ROWS),
    SourcePatch("vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp", _GEMM_OR_GEMV,
                _GEMV_ROWS_CALL + _GEMM_OR_GEMV),
    SourcePatch(
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.cpp",
        _FEATURES_END,
        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))  // promptlookup: see repack.cpp\n"
        '        features.push_back({ "REPACK_GEMV_ROWS", "1" });\n'
        "#endif\n" + _FEATURES_END,
    ),
)


def patches_for(kernels: str) -> tuple[SourcePatch, ...]:
    return SOURCE_PATCHES if kernels == "invariant" else ()


def apply_patches(root: Path, patches: Sequence[SourcePatch]) -> None:
    """Apply ``patches`` to the unpacked source at ``root`` (each file rewritten whole)."""
    for patch in patches:
        target = root / patch.path
        try:
            text = target.read_text(encoding="utf-8")
        except OSError as exc:
            raise SystemExit(f"setup: error: cannot patch {target}: {exc}") from exc
        found = text.count(patch.old)
        if found != 1:
            raise SystemExit(f"setup: error: cannot patch {patch.path}: the line to replace occurs "
                             f"{found} times (expected once): {patch.old.strip()!r}")
        target.write_text(text.replace(patch.old, patch.new), encoding="utf-8")


#: parts of llama-cpp-python we never load, left out of the build: its multimodal library (mtmd, ~23k
#: lines of C++; only its LLaVA-style chat handlers import it, lazily)
UNUSED_PARTS = ("-DLLAVA_BUILD=OFF",)
FAILED_MARK = "SMOKE_FAILED"
INSTALLED_MARK = "llama-build-key"  # in the venv: which wheelhouse key is installed there



# -- what to build ------------------------------------------------------------------------------
def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The ISA flags of the first CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cmake_args(mode: str, flags: frozenset[str], machine: str | None = None,
               kernels: str = DEFAULT_KERNELS) -> list[str]:
    """CMake arguments for llama.cpp: ``host`` (the CPU's extensions minus the broken ones) or
    ``conservative`` (AVX2/FMA/F16C). Off x86-64 the native build is kept (nothing known broken).
    Either way without the parts we never load (:data:`UNUSED_PARTS`), and with ``invariant``
    kernels without the batch-dependent ones (:data:`INVARIANT_ARGS`)."""
    if mode not in MODES:
        raise ValueError(f"unknown build mode {mode!r} (one of {', '.join(MODES)})")
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r} (one of {', '.join(KERNELS)})")
    tail = [*(INVARIANT_ARGS if kernels == "invariant" else ()), *UNUSED_PARTS]
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON", *tail]
    args = ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{name}=OFF" for name in BROKEN_ISA]
    for name, needs in HOST_ISA:
        on = name in CONSERVATIVE_ISA if mode == "conservative" else all(f in flags for f in needs)
        args.append(f"-DGGML_{name}={'ON' if on else 'OFF'}")
    return [*args, *tail]


def compiler_id() -> str:
    """The first line of ``cc --version``: another compiler can emit other instructions."""
    for cc in (os.environ.get("CC"), "cc", "gcc"):
        if not cc:
            continue
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        return out.splitlines()[0].strip() if out else cc
    return "unknown-compiler"


def wheelhouse_key(version: str, args: Sequence[str], compiler: str,
                   patches: Sequence[SourcePatch] = ()) -> str:
    """12 hex digits over everything that decides the wheel's bytes."""
    text = "\n".join([f"llama-cpp-python=={version}", *args, compiler,
                      *(f"patch {p.path}\n{p.old}\n{p.new}" for p in patches)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Build:
    mode: str
    args: tuple[str, ...]
    key: str
    folder: Path
    kernels: str = DEFAULT_KERNELS
    patches: tuple[SourcePatch, ...] = ()

    @property
    def name(self) -> str:
        """What the log calls it: ``host build, invariant kernels``."""
        return f"{self.mode} build, {self.kernels} kernels"

    def wheel(self) -> Path | None:
        found = sorted(self.folder.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}-*.whl"))
        return found[-1] if found else None

    @property
    def failed(self) -> bool:
        return (self.folder / FAILED_MARK).exists()


def plan(mode: str, wheelhouse_root: Path, flags: frozenset[str] | None = None,
         compiler: str | None = None, machine: str | None = None,
         kernels: str = DEFAULT_KERNELS) -> Build:
    args = tuple(cmake_args(mode, cpu_flags() if flags is None else flags, machine, kernels))
    patches = patches_for(kernels)
    key = wheelhouse_key(LLAMA_CPP_PYTHON_VERSION, args, compiler or compiler_id(), patches)
    return Build(mode, args, key, wheelhouse_root / key, kernels, patches)


def builds_to_try(plans: Callable[[str], Build]) -> tuple[list[Build], list[Build]]:
    """The one choice of build: (to try, in order; skipped). The host build, then the conservative
    one where its flags differ; a build that failed its smoke test before is skipped unless it is
    the last one left (then it is tried again, and its failure is what set-up reports)."""
    host, conservative = plans("host"), plans("conservative")
    order = [host] if host.args == conservative.args else [host, conservative]
    skipped = []
    while len(order) > 1 and order[0].failed:
        skipped.append(order.pop(0))
    return order, skipped


def default_wheelhouse() -> Path:
    """``$PROMPTLOOKUP_WHEELHOUSE``, else ``~/.cache/promptlookup/wheelhouse``: shared by every
    environment of this user, so a second venv (or a clone's set-up and ``setup-llama``) reuses the
    wheel instead of compiling llama.cpp again."""
    root = os.environ.get("PROMPTLOOKUP_WHEELHOUSE")
    return Path(root) if root else Path.home() / ".cache" / "promptlookup" / "wheelhouse"


def default_kernels() -> str:
    """``$PROMPTLOOKUP_LLAMA_KERNELS`` (how ``scripts/setup.sh`` is told), else the default."""
    value = os.environ.get(KERNELS_ENV, "").strip() or DEFAULT_KERNELS
    if value not in KERNELS:
        raise SystemExit(f"setup: error: {KERNELS_ENV}={value!r} is not one of {', '.join(KERNELS)}")
    return value
