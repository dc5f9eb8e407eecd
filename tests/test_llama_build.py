"""Set-up's llama.cpp step (src/promptlookup/llama_build): which ISA a build gets, the wheelhouse key, and
the fall-back to a conservative build when the smoke test dies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from promptlookup.backends import doctor
from promptlookup.llama_build import installer as li
from promptlookup.llama_build import recipe as lr

SAPPHIRE = frozenset(["fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f",
                      "avx512cd",
                      "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16",
                      "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"])
HASWELL = frozenset(["fpu", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"])


def test_host_build_names_each_extension_and_never_amx():
    args = lr.cmake_args("host", SAPPHIRE, "x86_64", "fast")
    assert args == ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
                    "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                    "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON",
                    "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DLLAVA_BUILD=OFF"]
    assert lr.cmake_args("host", HASWELL, "x86_64", "fast")[-6:] == [
        "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF",
        "-DGGML_AVX512_BF16=OFF", "-DLLAVA_BUILD=OFF"]
    # AVX-512 needs all five of F/CD/VL/DQ/BW; VNNI alone does not switch it on
    partial = (SAPPHIRE - {"avx512dq"})
    assert "-DGGML_AVX512=OFF" in lr.cmake_args("host", partial, "x86_64")
    assert "-DGGML_AVX512_VNNI=OFF" in lr.cmake_args("host", partial, "x86_64")


def test_invariant_kernels_leave_out_tinyblas_on_every_isa():
    """The default build: the host ISA (AMX off) without tinyBLAS; the repack stays (its Q4_K kernels
    patched to round one way, every other type left out by another patch)."""
    for mode in lr.MODES:
        for flags in (SAPPHIRE, HASWELL):
            fast = lr.cmake_args(mode, flags, "x86_64", "fast")
            assert lr.cmake_args(mode, flags, "x86_64") == [
                *fast[:-1], "-DGGML_LLAMAFILE=OFF", "-DLLAVA_BUILD=OFF"]
    assert lr.DEFAULT_KERNELS == "invariant"
    assert lr.cmake_args("host", frozenset(), "aarch64") == [
        "-DGGML_NATIVE=ON", "-DGGML_LLAMAFILE=OFF", "-DLLAVA_BUILD=OFF"]
    with pytest.raises(ValueError, match="unknown kernels 'exact' \\(one of invariant, fast\\)"):
        lr.cmake_args("host", SAPPHIRE, "x86_64", "exact")


def test_the_kernels_come_from_the_flag_else_the_environment(monkeypatch, capsys):
    monkeypatch.delenv(lr.KERNELS_ENV, raising=False)
    assert lr.default_kernels() == "invariant"
    monkeypatch.setenv(lr.KERNELS_ENV, "fast")
    assert lr.default_kernels() == "fast"
    assert li.main(["cmake-args", "host", "--kernels", "invariant"]) == 0
    assert "-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF" in capsys.readouterr().out
    assert li.main(["cmake-args", "host"]) == 0
    assert "LLAMAFILE" not in capsys.readouterr().out
    monkeypatch.setenv(lr.KERNELS_ENV, "exact")
    with pytest.raises(SystemExit, match="PROMPTLOOKUP_LLAMA_KERNELS='exact' is not one of invariant, fast"):
        lr.default_kernels()


def test_conservative_build_is_avx2_fma_f16c_whatever_the_cpu():
    on = [a for a in lr.cmake_args("conservative", SAPPHIRE, "x86_64") if a.endswith("=ON")]
    assert on == ["-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
    assert (lr.cmake_args("conservative", SAPPHIRE, "x86_64")
            == lr.cmake_args("conservative", HASWELL, "x86_64"))


def test_other_architectures_keep_the_native_build():
    assert lr.cmake_args("host", frozenset(), "aarch64", "fast") == ["-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF"]
    with pytest.raises(ValueError, match="unknown build mode 'fast'"):
        lr.cmake_args("fast", SAPPHIRE, "x86_64")


def test_the_wheelhouse_key_covers_flags_compiler_and_version(tmp_path, monkeypatch):
    a = lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64")
    assert a == lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64")
    assert a.key != lr.plan("host", tmp_path, HASWELL, "gcc 12.2", "x86_64").key
    assert a.key != lr.plan("conservative", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64").key
    fast = lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64", "fast")
    assert a.kernels == "invariant" and fast.kernels == "fast" and a.key != fast.key
    assert a.key != lr.plan("host", tmp_path, SAPPHIRE, "gcc 13.1", "x86_64").key
    monkeypatch.setattr(lr, "LLAMA_CPP_PYTHON_VERSION", "0.3.99")
    assert a.key != lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64").key
    assert a.folder == tmp_path / a.key and len(a.key) == 12
    # the old scheme keyed by CPU flags alone: a wheel built with -march=native under the same CPU
    # would have been reused; now the key is a function of the build arguments
    assert lr.wheelhouse_key("0.3.36", ["-DGGML_NATIVE=ON"], "gcc") != lr.wheelhouse_key(
        "0.3.36", lr.cmake_args("host", SAPPHIRE, "x86_64"), "gcc")


def _sigill_smoke(python: str) -> li.SmokeResult:
    """A real child process that dies by SIGILL in its verify step, read the way the doctor reads it."""
    child = ("import os, signal\nprint('step: verify 9 tokens', flush=True)\n"
             "os.kill(os.getpid(), signal.SIGILL)\n")
    out = doctor.run_smoke_child("unused", command=[sys.executable, "-c", child])
    return li.SmokeResult(out.ok, out.summary())


class Recorder:
    def __init__(self, tmp: Path) -> None:
        self.installed: list[str] = []
        self.plans = lambda mode: lr.plan(mode, tmp, SAPPHIRE, "gcc 12.2", "x86_64")

    def install(self, python: str, venv: Path, build) -> None:
        self.installed.append(build.mode)


def test_a_host_build_that_dies_by_sigill_is_replaced_by_the_conservative_one(tmp_path, capsys):
    rec = Recorder(tmp_path)
    smokes = iter([_sigill_smoke, lambda py: li.SmokeResult(True, "passed")])
    build = li.ensure_llama("py", tmp_path, tmp_path, smoke=lambda py: next(smokes)(py),
                            install=rec.install, plans=rec.plans)
    assert build.mode == "conservative" and build.kernels == "invariant"  # the fall-back keeps the kernels
    assert rec.installed == ["host", "conservative"]
    err = capsys.readouterr().err
    assert f"]: host build, invariant kernels (key {rec.plans('host').key}): smoke test failed: " \
           "llama.cpp died by SIGILL " \
           "during step 'verify 9 tokens'" in err
    assert "rebuilding once with the conservative ISA set (AVX, AVX2, F16C, FMA, SSE42)" in err
    host = rec.plans("host")
    assert host.failed and "SIGILL" in (host.folder / lr.FAILED_MARK).read_text()

    # the next set-up remembers: straight to the conservative build, no second crash
    rec2 = Recorder(tmp_path)
    build = li.ensure_llama("py", tmp_path, tmp_path, smoke=lambda py: li.SmokeResult(True, "passed"),
                            install=rec2.install, plans=rec2.plans)
    assert build.mode == "conservative" and rec2.installed == ["conservative"]


def test_set_up_fails_clearly_when_the_conservative_build_dies_too(tmp_path):
    rec = Recorder(tmp_path)
    with pytest.raises(SystemExit) as exc:
        li.ensure_llama("py", tmp_path, tmp_path, smoke=_sigill_smoke, install=rec.install, plans=rec.plans)
    assert rec.installed == ["host", "conservative"]
    msg = str(exc.value)
    assert msg.startswith("setup: error: llama.cpp does not run on this machine even when built for "
                          "AVX, AVX2, F16C, FMA, SSE42 only: smoke test failed: llama.cpp died by SIGILL "
                          "during step")
    assert "promptlookup doctor" in msg


def _killed_smoke(python: str) -> li.SmokeResult:
    """A real child stopped by SIGKILL in its batch-invariance step (as when someone stops set-up, or
    the kernel runs out of memory), read the way the doctor reads it."""
    child = ("import os, signal\nprint('step: batch invariance', flush=True)\n"
             "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = doctor.run_smoke_child("unused", command=[sys.executable, "-c", child])
    return li.SmokeResult(out.ok, out.summary(), stopped=out.stopped_from_outside)


def test_a_smoke_test_stopped_from_outside_stops_set_up_and_condemns_no_build(tmp_path):
    rec = Recorder(tmp_path)
    with pytest.raises(SystemExit) as exc:
        li.ensure_llama("py", tmp_path, tmp_path, smoke=_killed_smoke, install=rec.install, plans=rec.plans)
    host = rec.plans("host")
    assert str(exc.value) == (
        f"setup: error: host build, invariant kernels (key {host.key}): smoke test failed: the smoke test "
        "was stopped by SIGKILL during step 'batch invariance' (from outside: someone stopped it, or the "
        "machine ran out of memory); it says nothing about the build. Run set-up again.")
    assert rec.installed == ["host"]  # no rebuild
    assert not host.failed  # the next set-up tries the host build again
    build = li.ensure_llama("py", tmp_path, tmp_path, smoke=lambda py: li.SmokeResult(True, "ok"),
                            install=rec.install, plans=rec.plans)
    assert build.mode == "host"


@pytest.mark.parametrize(("status", "stopped"), [(0, False), (3, False), (4, True), (-15, True)])
def test_set_up_reads_the_doctors_exit_status(tmp_path, status, stopped):
    """``doctor --smoke-only`` exits 4 when the smoke test was stopped from outside; the doctor itself
    killed by a signal (here SIGTERM) is that too. A stand-in python prints the doctor's line."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'smoke test failed: something'\n"
                    + (f"kill -{-status} $$\n" if status < 0 else f"exit {status}\n"))
    fake.chmod(0o755)
    got = li.run_smoke(str(fake))
    assert (got.ok, got.stopped) == (status == 0, stopped)
    assert got.line.endswith("smoke test failed: something")
    assert doctor.SMOKE_STOPPED_STATUS == 4


def test_a_passing_host_build_is_kept(tmp_path):
    rec = Recorder(tmp_path)
    build = li.ensure_llama("py", tmp_path, tmp_path, smoke=lambda py: li.SmokeResult(True, "ok"),
                            install=rec.install, plans=rec.plans)
    assert build.mode == "host" and rec.installed == ["host"] and not build.failed


def test_the_build_choice_is_made_in_one_place(tmp_path):
    rec = Recorder(tmp_path)
    host, cons = rec.plans("host"), rec.plans("conservative")
    assert lr.builds_to_try(rec.plans) == ([host, cons], [])
    host.folder.mkdir(parents=True)
    (host.folder / lr.FAILED_MARK).write_text("died\n")
    assert lr.builds_to_try(rec.plans) == ([cons], [host])
    cons.folder.mkdir(parents=True)
    (cons.folder / lr.FAILED_MARK).write_text("died\n")
    assert lr.builds_to_try(rec.plans) == ([cons], [host])  # the last one left is tried again
    same = lambda mode: lr.plan("conservative", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64")  # noqa: E731
    assert lr.builds_to_try(same) == ([cons], [])


def test_fast_kernels_are_a_build_of_their_own(tmp_path):
    installed = []
    build = li.ensure_llama("py", tmp_path, tmp_path, smoke=lambda py: li.SmokeResult(True, "ok"),
                            install=lambda py, venv, b: installed.append(b), kernels="fast")
    assert build.kernels == "fast" and installed == [build]
    assert "-DGGML_LLAMAFILE=OFF" not in build.args
    assert build.key != lr.plan("host", tmp_path).key  # the invariant build sits beside it


# -- the invariant build's source patches ----------------------------------------------------------
UPSTREAM_OPS = ("    const bool use_split_kv_path = !use_ref && (neq1 == 1);\n"
                "    const bool use_ref = params->use_ref;\n")
UPSTREAM_FEATURES = ('        features.push_back({ "REPACK", "1" });\n'
                     "        features.push_back({ nullptr, nullptr });\n")
UPSTREAM_X86_QUANTS = "}\n\nvoid ggml_vec_dot_mxfp4_q8_0(int n, float * s);\n"
UPSTREAM_QUANTS_H = ("void ggml_vec_dot_q8_0_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * "
                     "GGML_RESTRICT vx, size_t bx, const void * GGML_RESTRICT vy, size_t by, int nrc);\n")
UPSTREAM_VEC_H = ("void ggml_vec_dot_f16(int n, float * GGML_RESTRICT s, size_t bs, "
                  "ggml_fp16_t * GGML_RESTRICT x, size_t bx, ggml_fp16_t * GGML_RESTRICT y, size_t by, "
                  "int nrc);\n")
UPSTREAM_VEC_CPP = "void ggml_vec_silu_f32(const int n, float * y, const float * x) {\n"
#: the repacked Q4_K gemv's last lines over a super-block (x86) and the repack's type choice
UPSTREAM_X86_REPACK = (
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
    "\n"
    "            }\n"
    "void ggml_gemv_iq4_nl_8x8_q8_0(int n, float * s);\n")
#: the repack's type choice, its matmul's quantization of the token rows and its choice of gemm or gemv
UPSTREAM_REPACK = ("static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type("
                   "const struct ggml_tensor * cur) {\n"
                   "    // instance for Q1_0\n"
                   "template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE> "
                   "class tensor_traits : public tensor_traits_base {\n"
                   "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {\n"
                   "            const int64_t i11_processed = ne11 - ne11 % 4;\n"
                   "        // If there are more than three rows in src1, use gemm; otherwise, use gemv.\n")
UPSTREAM_REPACK_H = ("void ggml_gemv_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * "
                     "GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc);\n")
UPSTREAM_MUL_MAT = ("    float tmp[32];\n\n"
                    "    for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n"
                    "        loop();\n")
# ggml_compute_forward_mul_mat's chunk size, then mul_mat_id's (indented deeper: not to be touched)
UPSTREAM_CHUNKS = ("    if (nr0 == 1 || nr1 == 1) {\n        chunk_size = 64;\n    }\n\n"
                   "    // distribute the work across the inner or outer loop\n")
UPSTREAM_ID_CHUNKS = ("        if (nr0 == 1 || nr1 == 1) {\n            chunk_size = 64;\n        }\n\n"
                      "        // disable for NUMA\n")


def _tree(root: Path, ops: str = UPSTREAM_OPS, features: str = UPSTREAM_FEATURES) -> Path:
    """A source tree holding, for each patched file, the lines the patches expect (upstream's)."""
    # keyed by the end of each patched path (two files are named repack.cpp)
    texts = {"ops.cpp": ops, "ggml-cpu.cpp": features, "quants.c": UPSTREAM_X86_QUANTS,
             "quants.h": UPSTREAM_QUANTS_H, "vec.h": UPSTREAM_VEC_H, "vec.cpp": UPSTREAM_VEC_CPP,
             "ggml-cpu.c": UPSTREAM_MUL_MAT + UPSTREAM_CHUNKS + UPSTREAM_ID_CHUNKS,
             "x86/repack.cpp": UPSTREAM_X86_REPACK,
             "ggml-cpu/repack.cpp": UPSTREAM_REPACK, "repack.h": UPSTREAM_REPACK_H}
    for patch in lr.SOURCE_PATCHES:
        (root / patch.path).parent.mkdir(parents=True, exist_ok=True)
        [text] = [t for tail, t in texts.items() if patch.path.endswith("/" + tail)]
        (root / patch.path).write_text(text, encoding="utf-8")
    return root


def test_only_the_invariant_build_is_patched_and_the_patch_is_in_its_key(tmp_path):
    inv = lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64")
    fast = lr.plan("host", tmp_path, SAPPHIRE, "gcc 12.2", "x86_64", "fast")
    assert inv.patches == lr.SOURCE_PATCHES and fast.patches == ()
    assert [Path(p.path).name for p in inv.patches] == ["ops.cpp", "ggml-cpu.cpp", "quants.c", "quants.h",
                                                         "vec.h", "vec.cpp", "ggml-cpu.c", "ggml-cpu.c",
                                                         "ggml-cpu.cpp",
                                                         "repack.cpp", "repack.cpp", "ggml-cpu.cpp",
                                                         "repack.h", "repack.cpp", "repack.cpp", "repack.cpp",
                                                         "repack.cpp", "repack.cpp", "ggml-cpu.cpp"]
    # the same flags without the patches would be another wheel
    assert inv.key != lr.wheelhouse_key(lr.LLAMA_CPP_PYTHON_VERSION, inv.args, "gcc 12.2")
    assert inv.key == lr.wheelhouse_key(lr.LLAMA_CPP_PYTHON_VERSION, inv.args, "gcc 12.2", inv.patches)


def test_the_patches_force_one_flash_attention_path_and_say_so(tmp_path):
    root = _tree(tmp_path)
    lr.apply_patches(root, lr.SOURCE_PATCHES)
    ops = (root / lr.SOURCE_PATCHES[0].path).read_text(encoding="utf-8")
    assert ops == ("    const bool use_split_kv_path = !use_ref && (neq1 == 1);\n"
                   "    const bool use_ref = true;  // promptlookup: one reduction order for every "
                   "batch shape\n")
    features = (root / lr.SOURCE_PATCHES[1].path).read_text(encoding="utf-8")
    assert features == ('        features.push_back({ "REPACK", "1" });\n'
                        '        features.push_back({ "FA_ONE_PATH", "1" });  // promptlookup: see ops.cpp\n'
                        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))  // promptlookup: "
                        "see x86 quants.c\n"
                        '        features.push_back({ "MUL_MAT_COLS", "2" });\n'
                        "#endif\n"
                        '        features.push_back({ "REPACK_ONE_ORDER", "1" });  // promptlookup: see '
                        "repack.cpp\n"
                        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))  // promptlookup: "
                        "see repack.cpp\n"
                        '        features.push_back({ "REPACK_GEMV_ROWS", "1" });\n'
                        "#endif\n"
                        "        features.push_back({ nullptr, nullptr });\n")
    # what llama.cpp prints for those features is what the backend looks for
    from promptlookup.backends.llama_cpp import FLASH_ATTENTION_ONE_PATH, MUL_MAT_COLS
    assert lr.FA_ONE_PATH_MARK == FLASH_ATTENTION_ONE_PATH == "FA_ONE_PATH = 1"
    assert lr.MUL_MAT_COLS_MARK == MUL_MAT_COLS == "MUL_MAT_COLS = 2"
    from promptlookup.backends.llama_cpp import REPACK_ONE_ORDER
    assert lr.REPACK_ONE_ORDER_MARK == REPACK_ONE_ORDER == "REPACK_ONE_ORDER = 1"


def test_the_patches_make_the_q4_k_gemv_round_as_the_gemm_and_repack_nothing_else(tmp_path):
    root = _tree(tmp_path)
    lr.apply_patches(root, lr.SOURCE_PATCHES)
    gemv = (root / lr.SOURCE_PATCHES[9].path).read_text(encoding="utf-8")
    # what follows the patched gemv is the one-pass gemv (the next test)
    gemv = gemv[: gemv.index("#if defined(__AVX2__)\n// promptlookup: the repacked Q4_K gemv")]
    # one multiply-add per 64 weights inside the loop, none after it
    assert gemv == (
        "                    // promptlookup: one multiply-add per 64 weights, as the gemm does (same "
        "rounding)\n"
        "                    (void) iacc_b; (void) iacc_min_b;\n"
        "                    acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_sb), _mm256_mul_ps("
        "col_scale_f32, row_scale_f32), acc_row);\n"
        "                    acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_sb), "
        "_mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n"
        "                }\n"
        "\n"
        "            }\n")
    choice = (root / lr.SOURCE_PATCHES[10].path).read_text(encoding="utf-8")
    choice = choice[: choice.index("// promptlookup: which matmuls")]  # the gemv_rows patches follow
    assert choice == ("static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type("
                      "const struct ggml_tensor * cur) {\n"
                      "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
                      "    if (cur->type != GGML_TYPE_Q4_K) {  // promptlookup: the one repack made "
                      "invariant\n"
                      "        return nullptr;\n"
                      "    }\n"
                      "#else\n"
                      "    return nullptr;  // promptlookup: no repack made invariant for this CPU\n"
                      "#endif\n"
                      "    // instance for Q1_0\n")


def test_the_patches_send_up_to_16_token_rows_of_a_repacked_q4_k_matmul_through_one_gemv_pass(tmp_path):
    root = _tree(tmp_path)
    lr.apply_patches(root, lr.SOURCE_PATCHES)
    kernel = (lr.PATCH_DIR / "q4_K_gemv_rows.cpp").read_text(encoding="utf-8")
    x86 = (root / lr.SOURCE_PATCHES[9].path).read_text(encoding="utf-8")
    assert x86.endswith("            }\n" + kernel + "\nvoid ggml_gemv_iq4_nl_8x8_q8_0(int n, float * s);\n")
    assert kernel.startswith("#if defined(__AVX2__)\n") and kernel.endswith("#endif\n")
    assert kernel.count("void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * GGML_RESTRICT s, size_t bs, ") == 1
    header = (root / "vendor/llama.cpp/ggml/src/ggml-cpu/repack.h").read_text(encoding="utf-8")
    assert header == UPSTREAM_REPACK_H + (
        "// promptlookup: the gemv above for nr <= 16 rows in one pass over the weights "
        "(arch/x86/repack.cpp)\n"
        "void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * GGML_RESTRICT s, size_t bs, const void * "
        "GGML_RESTRICT vx, "
        "const void * GGML_RESTRICT vy, int nr, int nc);\n")
    repack = (root / lr.SOURCE_PATCHES[10].path).read_text(encoding="utf-8")
    rest = repack[repack.index("// promptlookup: which matmuls"):]
    assert rest == (
        "// promptlookup: which matmuls take ggml_gemv_q4_K_8x8_q8_K_rows (repacked Q4_K, x86 with AVX2, "
        "2 to\n"
        "// 16 token rows; one row keeps upstream's gemv, the same arithmetic); decided from the row\n"
        "// count alone, so the quantization and the kernel agree\n"
        "template <typename T> struct promptlookup_is_q4_K { static constexpr bool value = false; };\n"
        "template <> struct promptlookup_is_q4_K<block_q4_K> { static constexpr bool value = true; };\n"
        "template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>\n"
        "static bool promptlookup_gemv_rows(int64_t nrows) {\n"
        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
        "    return promptlookup_is_q4_K<BLOC_TYPE>::value && INTER_SIZE == 8 && NB_COLS == 8 && "
        "PARAM_TYPE == GGML_TYPE_Q8_K && nrows >= 2 && nrows <= 16;\n"
        "#else\n"
        "    GGML_UNUSED(nrows);\n"
        "    return false;\n"
        "#endif\n"
        "}\n\n"
        "template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE> "
        "class tensor_traits : public tensor_traits_base {\n"
        # the rows of a one-pass gemv are quantized as a decode's row is, none in 4-row groups
        "            // promptlookup: the rows of a one-pass gemv (promptlookup_gemv_rows) are quantized "
        "one by one\n"
        "            const int64_t pl_grouped =\n"
        "                promptlookup_gemv_rows<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne11) ? 0 : "
        "ne11 - ne11 % 4;\n"
        "            for (int64_t i11 = ith * 4; i11 < pl_grouped; i11 += nth * 4) {\n"
        "            const int64_t i11_processed = pl_grouped;  // promptlookup\n"
        # ... and go to the one-pass gemv before upstream's gemm and per-row gemv
        "#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))\n"
        "        if (promptlookup_gemv_rows<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(nrows)) {  // "
        "promptlookup\n"
        "            ggml_gemv_q4_K_8x8_q8_K_rows(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
        "                                         src0_ptr + src0_start * nb01, src1_ptr, (int) nrows, "
        "(int) ncols);\n"
        "            return;\n"
        "        }\n"
        "#endif\n"
        "        // If there are more than three rows in src1, use gemm; otherwise, use gemv.\n")
    assert lr.GEMV_ROWS_MAX == 16


def test_the_patches_put_the_column_matmul_into_ggml_and_call_it_before_the_pair_loop(tmp_path):
    root = _tree(tmp_path)
    lr.apply_patches(root, lr.SOURCE_PATCHES)
    kernel = (lr.PATCH_DIR / "mul_mat_cols.c").read_text(encoding="utf-8")
    quants = (root / lr.SOURCE_PATCHES[2].path).read_text(encoding="utf-8")
    assert quants == "}\n\n" + kernel + "\nvoid ggml_vec_dot_mxfp4_q8_0(int n, float * s);\n"
    header = (root / lr.SOURCE_PATCHES[3].path).read_text(encoding="utf-8")
    assert header.startswith(UPSTREAM_QUANTS_H) and header.endswith("int nc);\n")
    assert header.count("int ggml_mul_mat_cols(enum ggml_type type, int n, const void * GGML_RESTRICT x, "
                        "size_t x_stride, int64_t r0, int64_t r1, ") == 1
    mul_mat = (root / lr.SOURCE_PATCHES[6].path).read_text(encoding="utf-8")
    call = (lr.PATCH_DIR / "mul_mat_cols_call.c").read_text(encoding="utf-8")
    # the call comes first, and upstream's loop stays whole behind it for every other matrix
    rest = UPSTREAM_MUL_MAT.split("\n\n", 1)[1]
    assert mul_mat.startswith("    float tmp[32];\n\n" + call + "\n" + rest)
    assert "ggml_mul_mat_cols(type, (int) ne00, mats[c0], nb01, ir0_start, ir0_end, cols + c0, " in call
    # the kernel and its call are guarded alike: compiled only where AVX2 is
    assert kernel.count("#if defined(__AVX2__)") == 2 and call.startswith("#if defined(__AVX2__)")


def test_the_patches_give_a_verifys_rows_the_chunks_of_one_token_and_leave_mul_mat_id(tmp_path):
    root = _tree(tmp_path)
    lr.apply_patches(root, lr.SOURCE_PATCHES)
    text = (root / lr.SOURCE_PATCHES[7].path).read_text(encoding="utf-8")
    assert text.endswith("    if (nr0 == 1 || nr1 <= 16) {  // promptlookup: a verify's few rows too\n"
                         "        chunk_size = 64;\n    }\n\n"
                         "    // distribute the work across the inner or outer loop\n" + UPSTREAM_ID_CHUNKS)
    assert text.count("nr1 == 1") == 1  # mul_mat_id's own line, untouched


@pytest.mark.parametrize("ops, found", [("    int other;\n", 0), (UPSTREAM_OPS + UPSTREAM_OPS, 2)])
def test_a_source_that_is_not_the_pinned_one_stops_set_up(tmp_path, ops, found):
    root = _tree(tmp_path, ops=ops)
    with pytest.raises(SystemExit) as err:
        lr.apply_patches(root, lr.SOURCE_PATCHES)
    assert str(err.value) == (f"setup: error: cannot patch {lr.SOURCE_PATCHES[0].path}: the line to "
                              f"replace occurs {found} times (expected once): "
                              "'const bool use_ref = params->use_ref;'")
    assert (root / lr.SOURCE_PATCHES[0].path).read_text(encoding="utf-8") == ops  # untouched
    with pytest.raises(SystemExit, match="cannot patch .*missing.cpp"):
        lr.apply_patches(root, [lr.SourcePatch("missing.cpp", "a", "b")])


def test_a_patched_build_compiles_the_patched_source_package(tmp_path, monkeypatch):
    """build_wheel downloads the source package, patches the unpacked tree and builds the wheel from
    that folder (pip stands in: it serves a small source package and checks what it is asked to build)."""
    import tarfile

    pkg = f"llama_cpp_python-{lr.LLAMA_CPP_PYTHON_VERSION}"
    calls = []

    def fake_pip(python, *args, env=None):
        calls.append(args[0])
        if args[0] == "download":
            dest = Path(args[args.index("-d") + 1])
            src = _tree(tmp_path / "pkg" / pkg)
            with tarfile.open(dest / f"{pkg}.tar.gz", "w:gz") as tar:
                tar.add(src, arcname=pkg)
        elif args[0] == "wheel":
            folder, source = Path(args[args.index("-w") + 1]), Path(args[-1])
            patched = (source / lr.SOURCE_PATCHES[1].path).read_text()
            assert source.name == pkg and "FA_ONE_PATH" in patched
            assert env["CMAKE_ARGS"] == " ".join(build.args)
            (folder / f"{pkg}-cp311-cp311-linux_x86_64.whl").write_bytes(b"")

    monkeypatch.setattr(li, "pip", fake_pip)
    build = lr.plan("host", tmp_path / "wheelhouse", SAPPHIRE, "gcc 12.2", "x86_64")
    wheel = li.build_wheel("python", build)
    assert calls == ["download", "wheel"]
    assert wheel == build.folder / f"{pkg}-cp311-cp311-linux_x86_64.whl"
    fast = lr.plan("host", tmp_path / "wheelhouse", SAPPHIRE, "gcc 12.2", "x86_64", "fast")
    calls.clear()
    monkeypatch.setattr(li, "pip", lambda python, *args, env=None: (
        calls.append(args[-1]), (fast.folder / f"{pkg}-x.whl").write_bytes(b"")))
    li.build_wheel("python", fast)
    assert calls == [f"llama-cpp-python=={lr.LLAMA_CPP_PYTHON_VERSION}"]  # upstream's package, as is
