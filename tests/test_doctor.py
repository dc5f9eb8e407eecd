"""promptlookup doctor and the llama.cpp smoke test: the child-process protocol, the once-per-build
stamp, the verdict, the AMX scan, and the smoke test itself on the real model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_model

from promptlookup.backends import doctor
from promptlookup.backends.base import BackendError
from promptlookup.backends.llama_cpp_smoke import SmokeFailure, compare_rows

SIGILL_CHILD = ("import os, signal\n"
                "print('step: prefill 300 tokens', flush=True)\n"
                "print('step: verify 9 tokens', flush=True)\n"
                "os.kill(os.getpid(), signal.SIGILL)\n")


def test_a_child_killed_by_sigill_is_named_with_its_step():
    out = doctor.run_smoke_child("unused.gguf", command=[sys.executable, "-c", SIGILL_CHILD])
    assert not out.ok
    assert out.signal == "SIGILL"
    assert out.step == "verify 9 tokens"
    assert out.line() == "llama.cpp died by SIGILL during step 'verify 9 tokens'"
    assert out.summary() == "smoke test failed: llama.cpp died by SIGILL during step 'verify 9 tokens'"


def test_parse_child_outcomes():
    ok = doctor.parse_child(
        0, 'step: load the model\nresult: {"rows": 9, "argmax_agree": 9, "max_rel_diff": 0.02}\n')
    assert ok.ok and ok.result["rows"] == 9
    assert ok.summary() == ("smoke test passed: prefill, verify of 9 tokens, rollback; batched rows within "
                            "2.0% of single-token rows, argmax agreeing on 9/9")
    wrong = doctor.parse_child(1, 'step: compare batched and single rows\nresult: {"failure": "row 3 off"}\n')
    assert not wrong.ok and wrong.line() == "wrong result: row 3 off"
    died = doctor.parse_child(-11, "step: prefill 300 tokens\n")
    assert died.line() == "llama.cpp died by SIGSEGV during step 'prefill 300 tokens'"
    assert not died.stopped_from_outside
    for sig in (9, 15, 2, 1):  # SIGKILL, SIGTERM, SIGINT, SIGHUP: someone (or the OOM killer) stopped it
        stopped = doctor.parse_child(-sig, "step: batch invariance\n")
        assert stopped.stopped_from_outside and not stopped.ok
    assert stopped.line() == ("the smoke test was stopped by SIGHUP during step 'batch invariance' (from "
                              "outside: someone stopped it, or the machine ran out of memory); it says "
                              "nothing about the build")
    silent = doctor.parse_child(1, "step: load the model\n", "Traceback...\nImportError: no llama_cpp\n")
    assert silent.line() == ("the smoke test exited with status 1 during step 'load the model': "
                             "ImportError: no llama_cpp")
    # exit 0 without a result line is not a pass
    assert not doctor.parse_child(0, "step: load the model\n").ok
    inv = ('result: {"rows": 9, "argmax_agree": 9, "max_rel_diff": 0.0, "invariance": {"bitwise": true, '
           '"rows": 427, "identical": 427, "line": "batch-invariant: all 427 rows bit-identical to '
           'one-token decodes"}}\n')
    assert doctor.parse_child(0, inv).summary() == (
        "smoke test passed: prefill, verify of 9 tokens, rollback; batched rows within 0.0% of single-token "
        "rows, argmax agreeing on 9/9; batch-invariant: all 427 rows bit-identical to one-token decodes")
    not_inv = doctor.parse_child(1, 'step: batch invariance\nresult: {"failure": "built without the '
                                    'batch-dependent kernels, yet not batch-invariant: 3/427 rows differ"}\n')
    assert not_inv.summary() == ("smoke test failed: wrong result: built without the batch-dependent "
                                 "kernels, yet not batch-invariant: 3/427 rows differ")


def test_the_build_is_checked_once_and_a_failure_names_the_doctor(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(doctor, "library_fingerprint", lambda: "0123456789abcdef")
    calls = []

    def failing(model, threads):
        calls.append(model)
        return doctor.parse_child(-4, "step: verify 9 tokens\n")

    with pytest.raises(BackendError) as err:
        doctor.ensure_build_checked("m.gguf", runner=failing)
    assert "died by SIGILL during step 'verify 9 tokens'" in str(err.value)
    assert "promptlookup doctor" in str(err.value)
    assert not list(tmp_path.rglob("*.ok"))  # a failure is never stamped: it is checked again

    def passing(model, threads):
        calls.append(model)
        return doctor.parse_child(0, 'result: {"rows": 9}\n')

    doctor.ensure_build_checked("m.gguf", runner=passing)
    doctor.ensure_build_checked("m.gguf", runner=passing)  # stamped: the runner is not called again
    assert len(calls) == 2
    assert [p.name for p in tmp_path.rglob("*.ok")] == ["llama-cpp-0123456789abcdef.ok"]


def test_verdict_lines():
    assert doctor.verdict([1.0, 1.4, 2.1, 2.0, 2.2, 2.9, 3.7, 3.6, 5.8]) == (
        "a verify of 9 tokens costs 5.8 decodes here: speculation pays only on long accepted drafts "
        "(a 3-token draft pays once it averages more than 2.00 tokens per verify)")
    assert doctor.verdict([1.0] * 9).startswith(
        "a verify of 9 tokens costs 1.0 decodes here: verifying is nearly free")
    assert "mostly accepted" in doctor.verdict([1.0, 1.5, 2.5])


def test_cpu_info_reads_the_first_cpu():
    text = "processor: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 amx_tile\n\nprocessor: 1\n" \
           "model name: other\nflags: sse\n"
    assert doctor.cpu_info(text) == ("Test CPU 9000", ["fpu", "avx2", "amx_tile"])
    assert doctor.cpu_info("") == ("unknown CPU", [])


def test_compare_rows_tolerates_noise_and_rejects_a_broken_kernel():
    rng = np.random.default_rng(0)
    single = [rng.normal(size=64).astype(np.float32) * 5 for _ in range(9)]
    for s in single:
        s[7] = s.max() + 3.0  # a clear argmax
    noisy = [s + rng.normal(scale=0.05, size=64).astype(np.float32) for s in single]
    out = compare_rows(noisy, single)
    assert out["rows"] == 9 and out["argmax_agree"] == 9 and out["max_rel_diff"] < 0.02
    garbage = [rng.normal(size=64).astype(np.float32) * 5 for _ in range(9)]
    with pytest.raises(SmokeFailure, match="verify row 0: batched logits differ"):
        compare_rows(garbage, single)
    nan = [s.copy() for s in single]
    nan[4][0] = np.nan
    with pytest.raises(SmokeFailure, match="non-finite logits at verify row 4"):
        compare_rows(nan, single)


def _assemble(tmp_path: Path, asm: str) -> Path:
    src = tmp_path / "x.s"
    src.write_text(asm)
    obj = tmp_path / "x.o"
    subprocess.run(["as", "-o", str(obj), str(src)], check=True)
    return obj


@pytest.mark.skipif(shutil.which("objdump") is None or shutil.which("as") is None,
                    reason="binutils (objdump, as) not installed")
def test_the_amx_scan_finds_amx_instructions(tmp_path):
    amx = _assemble(tmp_path, ".text\nldtilecfg (%rax)\ntilezero %tmm0\ntdpbssd %tmm2, %tmm1, %tmm0\n"
                              "tilerelease\nvaddps %zmm1, %zmm2, %zmm3\n")
    assert doctor.amx_instruction_count(amx) == 4
    plain = _assemble(tmp_path, ".text\nvaddps %zmm1, %zmm2, %zmm3\nret\n")
    assert doctor.amx_instruction_count(plain) == 0


@requires_model
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump not installed")
def test_the_installed_llama_cpp_holds_no_amx_instruction():
    lib = doctor.cpu_library()
    assert lib is not None and lib.is_file()
    assert doctor.amx_instruction_count(lib) == 0, f"{lib} holds AMX instructions: it can die by SIGILL"


@requires_model
def test_smoke_test_on_the_real_model(real_backend):
    from promptlookup.backends.llama_cpp_smoke import N_PREFILL, N_VERIFY, smoke_test

    steps: list[str] = []
    out = smoke_test(real_backend, steps.append)
    assert steps == [f"prefill {N_PREFILL} tokens", f"verify {N_VERIFY} tokens", "rollback",
                     f"{N_VERIFY} single-token decodes", "compare batched and single rows"]
    assert out["rows"] == N_VERIFY
    assert out["argmax_agree"] >= N_VERIFY - 1
    assert out["max_rel_diff"] < 0.10
    assert real_backend.n_past == 0 and not real_backend.record_logits


@requires_model
def test_smoke_child_on_the_real_model():
    from promptlookup.backends.models import bundled_model_path

    out = doctor.run_smoke_child(bundled_model_path(), threads=2)
    assert out.ok, out.line()
    assert out.result["rows"] == 9 and "AVX" in out.result["system_info"]
    # the bitwise check ran; on the invariant build it must hold (else the child fails, above)
    inv = out.result["invariance"]
    assert inv["rows"] == 666 and inv["bitwise"] == (inv["identical"] == 666)
    assert inv["bitwise"] or not out.result["invariant_build"]


@requires_model
def test_the_cli_reports_a_broken_build_in_one_line(tmp_path, monkeypatch, capsys):
    from promptlookup.cli import main

    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(doctor, "library_fingerprint", lambda: "feedfacefeedface")
    monkeypatch.setattr(doctor, "run_smoke_child",
                        lambda model, threads=None: doctor.parse_child(-4, "step: verify 9 tokens\n"))
    assert main(["generate", "-p", "hello", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("promptlookup: error: this llama.cpp build does not run correctly here (llama.cpp "
                       "died by SIGILL during step 'verify 9 tokens'); run 'promptlookup doctor' for the "
                       "details, and 'promptlookup setup-llama' to rebuild")


def test_a_library_that_cannot_load_is_a_backend_error(monkeypatch):
    from promptlookup.backends.llama_cpp import LlamaCppBackend

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    with pytest.raises(BackendError, match=r"llama.cpp library could not be loaded .*promptlookup doctor"):
        LlamaCppBackend("model.gguf")


@pytest.mark.parametrize(("code", "status"), [(-4, 3), (-9, 4), (0, 0)])
def test_smoke_only_exit_status_tells_a_bad_build_from_a_stopped_test(tmp_path, monkeypatch, capsys, code,
                                                                        status):
    """3: the build is bad (SIGILL); 4: the smoke test was stopped from outside (SIGKILL), which set-up
    must not hold against the build; 0: healthy."""
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(doctor, "library_fingerprint", lambda: "feedfacefeedface")
    child = 'step: verify 9 tokens\n' + ('result: {"rows": 9}\n' if code == 0 else "")
    monkeypatch.setattr(doctor, "run_smoke_child",
                        lambda model, threads=None, curve=False: doctor.parse_child(code, child))
    assert doctor.run_doctor(None, None, smoke_only=True) == status
    assert capsys.readouterr().out.startswith("smoke test " + ("passed" if code == 0 else "failed"))


SAFE_INFO = "CPU : SSE3 = 1 | AVX2 = 1 | FMA = 1 | OPENMP = 1 | FA_ONE_PATH = 1 | MUL_MAT_COLS = 2 | "
UPSTREAM_INFO = "CPU : AVX2 = 1 | FMA = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
WARNING = ("promptlookup: warning: this llama-cpp-python is not promptlookup's safe build ({}): speculative "
           "output may differ from --speculate off, and upstream's build dies by SIGILL on AMX CPUs; run "
           "'promptlookup setup-llama' to install the exact one")


def test_a_build_that_is_not_ours_gets_one_line_saying_what_is_lost_and_the_fix():
    from promptlookup.backends.llama_cpp import build_problem, build_warning

    assert build_problem(SAFE_INFO) is None and build_warning(SAFE_INFO, {}) is None
    assert build_warning(UPSTREAM_INFO, {}) == WARNING.format(
        "its matmul kernels depend on the batch (LLAMAFILE, REPACK)")
    # set-up's build keeps the repack patched to round one way; tinyBLAS beside it is still named
    ours = SAFE_INFO + "REPACK = 1 | REPACK_ONE_ORDER = 1 | "
    assert build_problem(ours) is None
    assert build_problem(ours.replace("OPENMP", "LLAMAFILE = 1 | OPENMP")) == (
        "its matmul kernels depend on the batch (LLAMAFILE)")
    unpatched = "CPU : AVX2 = 1 | OPENMP = 1 | "  # invariant kernels, but upstream's flash attention
    assert build_warning(unpatched, {}) == WARNING.format("its flash attention is not the one-path patch")
    # the fast kernels chosen on purpose (set-up's own variable): nothing to warn about
    assert build_warning(UPSTREAM_INFO, {"PROMPTLOOKUP_LLAMA_KERNELS": " Fast "}) is None
    assert build_warning(UPSTREAM_INFO, {"PROMPTLOOKUP_LLAMA_KERNELS": "invariant"}) is not None


@pytest.mark.parametrize(("info", "line"), [
    (SAFE_INFO, "llama-cpp-python build: promptlookup's safe build (AMX off, batch-invariant kernels, "
                "one-path flash attention)"),
    (UPSTREAM_INFO, "llama-cpp-python build: NOT promptlookup's safe build: its matmul kernels depend on the "
                    "batch (LLAMAFILE, REPACK); speculative output may differ from --speculate off, and "
                    "upstream's build dies by SIGILL on AMX CPUs; 'promptlookup setup-llama' installs the "
                    "exact one"),
])
def test_the_doctor_says_whether_the_build_is_ours(tmp_path, monkeypatch, info, line):
    lines = _doctor_lines(tmp_path, monkeypatch, info)
    assert [x for x in lines if x.startswith("llama-cpp-python build:")] == [line]


def _doctor_lines(tmp_path, monkeypatch, info: str) -> list[str]:
    """What the doctor prints for a healthy smoke test on a build whose system info is ``info``."""
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(doctor, "cpu_library", lambda: tmp_path / "libggml-cpu.so")
    monkeypatch.setattr(doctor, "amx_instruction_count", lambda lib: 0)
    monkeypatch.setattr(doctor, "library_fingerprint", lambda: None)
    result = {"rows": 9, "max_rel_diff": 0.0, "argmax_agree": 9, "system_info": info, "threads": 2}
    monkeypatch.setattr(doctor, "run_smoke_child", lambda model, threads=None, curve=False:
                        doctor.SmokeOutcome(True, "done", result=result))
    lines: list[str] = []
    assert doctor.run_doctor(None, None, False, out=lines.append) == 0
    return lines


@pytest.mark.parametrize(("marks", "line"), [
    ("MUL_MAT_COLS = 2 | ",
     "matmul: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K and F16 rows take up to 16 tokens at once (set-up's "
     "patch), every result bit-identical to ggml's one-pair kernel (docs/exactness.md)"),
    ("MUL_MAT_COLS = 1 | ",
     "matmul: Q4_1, Q5_0, Q8_0, Q4_K, Q6_K and F16 rows take up to 16 tokens at once (an older set-up's "
     "patch: Q4_0, Q5_1, Q2_K, Q3_K and Q5_K weights take ggml's one-pair kernel, exact but verifies "
     "dearer; 'promptlookup setup-llama' rebuilds with their kernels)"),
    ("", None),
])
def test_the_doctor_says_which_weight_types_the_column_matmul_takes(tmp_path, monkeypatch, marks, line):
    """A build from an older set-up has the column matmul without Q4_0, Q5_1, Q2_K, Q3_K and Q5_K: the
    doctor says so and how to rebuild, rather than claiming kernels the library lacks."""
    lines = _doctor_lines(tmp_path, monkeypatch, SAFE_INFO.replace("MUL_MAT_COLS = 2 | ", marks))
    assert [x for x in lines if x.startswith("matmul:")] == ([line] if line else [])
