"""``promptlookup doctor``: is this llama.cpp build safe here, and what do speed figures mean here?

Why: llama.cpp compiles for the host, and a build can die by SIGILL in the multi-token decode that
speculation depends on (ggml's AMX path did). A signal cannot be caught in the process it kills, so
the smoke test (:mod:`promptlookup.backends.llama_cpp_smoke`) always runs in a child process; this
module starts it, names the signal and the step when it dies, and puts what a user needs to trust a
speed figure beside the verdict: CPU model and ISA flags, the ISA llama.cpp was built with, whether
the installed ``libggml-cpu`` holds AMX instructions, threads, and the measured verify cost curve.

The CLI runs the same smoke test once per installed llama.cpp build before its first real use (the
result is stamped in the cache folder), so a broken build gives a one-line reason pointing here
instead of a bare "Illegal instruction".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promptlookup.backends.base import BackendError
from promptlookup.backends.threads import Load, available_cores, oversubscription, read_load, wait_policy
from promptlookup.fileio import cache_dir

SMOKE_TIMEOUT_S = 600.0
#: AMX mnemonics as objdump prints them: tile config, loads/stores and the tile dot products.
AMX_MNEMONICS = ("tilezero", "ldtilecfg", "sttilecfg", "tileloadd", "tileloaddt1", "tilestored",
                 "tilerelease", "tdpbssd", "tdpbsud", "tdpbusd", "tdpbuud", "tdpbf16ps", "tdpfp16ps")
#: CPU flags worth showing (the ones llama.cpp's kernels are built from), in this order.
SHOWN_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw",
               "avx512vl", "avx512vbmi", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
               "amx_int8", "amx_bf16")


# -- running the child ----------------------------------------------------------------------------
#: signals that come from outside (a person, a supervisor, the kernel out of memory), never from a
#: bad build: a smoke test they stop says nothing about the build, and set-up must not condemn it
STOPPED_FROM_OUTSIDE = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP")
SMOKE_STOPPED_STATUS = 4  # ``doctor --smoke-only``'s exit status when the smoke test was stopped so


@dataclass
class SmokeOutcome:
    """What the child did: ``ok``, or how it failed (``signal`` name and ``step``, or ``failure``)."""

    ok: bool
    step: str = ""
    signal: str | None = None
    failure: str | None = None
    returncode: int = 0
    result: dict[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""

    def line(self) -> str:
        """One line saying what happened."""
        if self.ok:
            r = self.result
            line = (f"prefill, verify of {r.get('rows', '?')} tokens, rollback; batched rows within "
                    f"{r.get('max_rel_diff', 0.0):.1%} of single-token rows, argmax agreeing on "
                    f"{r.get('argmax_agree', '?')}/{r.get('rows', '?')}")
            inv = r.get("invariance")
            return f"{line}; {inv['line']}" if isinstance(inv, dict) and "line" in inv else line
        if self.stopped_from_outside:
            return (f"the smoke test was stopped by {self.signal} during step '{self.step}' (from outside: "
                    f"someone stopped it, or the machine ran out of memory); it says nothing about the build")
        if self.signal:
            return f"llama.cpp died by {self.signal} during step '{self.step}'"
        if self.failure:
            return f"wrong result: {self.failure}"
        tail = f": {self.stderr_tail}" if self.stderr_tail else ""
        return f"the smoke test exited with status {self.returncode} during step '{self.step}'{tail}"

    @property
    def stopped_from_outside(self) -> bool:
        """Killed by a signal that a bad build never sends (:data:`STOPPED_FROM_OUTSIDE`)."""
        return self.signal in STOPPED_FROM_OUTSIDE

    def summary(self) -> str:
        """``smoke test passed: ...`` or ``smoke test failed: ...``: what set-up and the doctor print."""
        return f"smoke test {'passed' if self.ok else 'failed'}: {self.line()}"


def parse_child(returncode: int, stdout: str, stderr: str = "") -> SmokeOutcome:
    """Read the child's ``step:`` and ``result:`` lines (see the smoke module)."""
    step, result = "start the child", None
    for line in stdout.splitlines():
        if line.startswith("step: "):
            step = line[6:].strip()
        elif line.startswith("result: "):
            try:
                result = json.loads(line[8:])
            except json.JSONDecodeError:
                result = None
    tail = (stderr.strip().splitlines() or [""])[-1][:300]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return SmokeOutcome(False, step, signal=name, returncode=returncode, stderr_tail=tail)
    if result is not None and "failure" in result:
        return SmokeOutcome(False, step, failure=str(result["failure"]), returncode=returncode,
                            result=result)
    if returncode != 0 or result is None:
        return SmokeOutcome(False, step, returncode=returncode, stderr_tail=tail)
    return SmokeOutcome(True, step, returncode=0, result=result)


def run_smoke_child(model: str | os.PathLike[str], threads: int | None = None, curve: bool = False,
                    timeout: float = SMOKE_TIMEOUT_S, command: list[str] | None = None) -> SmokeOutcome:
    """Run the smoke test in a child process (``command`` replaces it in tests)."""
    cmd = command or [sys.executable, "-m", "promptlookup.backends.llama_cpp_smoke", "--model", str(model)]
    if command is None and threads:
        cmd += ["--threads", str(threads)]
    if command is None and curve:
        cmd.append("--curve")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        o = parse_child(1, out)
        o.failure = f"no answer within {timeout:.0f} s (step '{o.step}')"
        return o
    return parse_child(proc.returncode, proc.stdout, proc.stderr)


# -- what the machine and the build are -----------------------------------------------------------
def cpu_info(cpuinfo: str | None = None) -> tuple[str, list[str]]:
    """The CPU's model name and its flags (all of them)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = "unknown CPU", []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value.split()
    return model, flags


def llama_library_dir() -> Path | None:
    """``llama_cpp/lib`` of the installed llama-cpp-python, found without loading the library."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def library_fingerprint() -> str | None:
    """Names, sizes and mtimes of the installed llama.cpp libraries: a new build, a new print."""
    lib = llama_library_dir()
    if lib is None:
        return None
    parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(lib.glob("*.so*"))
             if p.is_file() and not p.is_symlink()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16] if parts else None


def amx_instruction_count(library: Path) -> int | None:
    """AMX instructions in ``library`` by ``objdump -d`` (None where objdump is missing)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], capture_output=True,
                          text=True, check=True)
    wanted = set(AMX_MNEMONICS)
    count = 0
    for line in proc.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1].split(" ", 1)[0].strip() in wanted:
            count += 1
    return count


def cpu_library() -> Path | None:
    lib = llama_library_dir()
    if lib is None:
        return None
    found = sorted(lib.glob("libggml-cpu*.so*"))
    return found[0] if found else None


# -- the stamp: checked once per build --------------------------------------------------------------
def _stamp_path(fingerprint: str) -> Path:
    return cache_dir() / "health" / f"llama-cpp-{fingerprint}.ok"


def record_healthy() -> None:
    from promptlookup.fileio import atomic_write_text

    fp = library_fingerprint()
    if fp is not None:
        atomic_write_text(_stamp_path(fp), "smoke test passed\n")


def ensure_build_checked(model: str | os.PathLike[str], threads: int | None = None,
                         runner=None) -> None:
    """Before the first use of an installed llama.cpp build, run the smoke test in a child process.

    The test runs on the bundled model where it is installed (it checks the build, not the model),
    else on ``model``. Raises :class:`BackendError` with the reason (and where to look) when the child
    dies or computes wrong logits; a passing build is stamped and never checked again.
    """
    from promptlookup.backends.models import ModelError, bundled_model_path

    fp = library_fingerprint()
    if fp is None:
        raise BackendError("llama-cpp-python is not installed (or has no library folder); "
                           "run 'promptlookup setup-llama', then 'promptlookup doctor'")
    if _stamp_path(fp).is_file():
        return
    print("promptlookup: first use of this llama.cpp build: checking it in a child process "
          "(a few seconds, once)", file=sys.stderr)
    try:
        smoke_model: str | os.PathLike[str] = bundled_model_path()
    except ModelError:
        smoke_model = model
    outcome = (runner or run_smoke_child)(smoke_model, threads)
    if not outcome.ok:
        raise BackendError(f"this llama.cpp build does not run correctly here ({outcome.line()}); "
                           "run 'promptlookup doctor' for the details, and 'promptlookup setup-llama' "
                           "to rebuild")
    record_healthy()


# -- the report ---------------------------------------------------------------------------------------
def verdict(relative: list[float]) -> str:
    """One line from the relative verify costs (``relative[n - 1]`` = cost of n tokens / decode)."""
    n = len(relative)
    widest = relative[-1]
    need3 = relative[3] if n >= 4 else None
    head = f"a verify of {n} tokens costs {widest:.1f} decodes here"
    if widest >= 4.0:
        tail = "speculation pays only on long accepted drafts"
    elif widest >= 2.0:
        tail = "speculation pays where drafts are mostly accepted"
    else:
        tail = "verifying is nearly free: drafting pays almost whenever a draft is offered"
    if need3 is not None:
        tail += f" (a 3-token draft pays once it averages more than {need3:.2f} tokens per verify)"
    return f"{head}: {tail}"


def load_report(threads: int | None, load: Load | None = None, cores: int | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The ``openmp wait`` and ``load`` lines: how llama.cpp's threads will wait, and whether this
    machine is oversubscribed now (a speed figure taken on a busy machine measures the machine).
    Defaults read the machine; the tests inject all four."""
    from promptlookup.backends.llama_cpp import default_threads

    env = os.environ if environ is None else environ
    policy, _ = wait_policy(env)
    line = oversubscription(read_load() if load is None else load,
                            available_cores() if cores is None else cores,
                            threads or default_threads(), env)
    return f"openmp wait: {policy}\n{line}"


def run_doctor(model: str | os.PathLike[str] | None, threads: int | None, smoke_only: bool,
               out=print) -> int:
    """Print the report; 0 when healthy, 3 when the smoke test failed, 2 when it could not run, 4
    (:data:`SMOKE_STOPPED_STATUS`, ``--smoke-only``) when it was stopped from outside."""
    from promptlookup.backends.models import resolve_model

    model_path = resolve_model(model)
    if not smoke_only:
        name, flags = cpu_info()
        shown = [f for f in SHOWN_FLAGS if f in flags]
        out(f"cpu: {name}; {os.cpu_count() or '?'} logical cores, "
            f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} available")
        out(f"cpu ISA flags: {' '.join(shown) or '(none of interest)'}")
        out(load_report(threads))
        lib = cpu_library()
        if lib is None:
            out("llama.cpp library: not installed")
            return 2
        count = amx_instruction_count(lib)
        amx = ("not checked (objdump missing)" if count is None
               else "none" if count == 0 else f"{count} (this build can die by SIGILL in ggml's AMX matmul)")
        out(f"llama.cpp library: {lib}; AMX instructions: {amx}")
    outcome = run_smoke_child(model_path, threads, curve=not smoke_only)
    if smoke_only:
        out(outcome.summary())
        if outcome.ok:
            record_healthy()
        return 0 if outcome.ok else SMOKE_STOPPED_STATUS if outcome.stopped_from_outside else 3
    r = outcome.result
    if r.get("system_info"):
        out(f"llama.cpp built with: {r['system_info']}")
    out(f"{outcome.summary()} (on {model_path.name})")
    inv = r.get("invariance")
    if isinstance(inv, dict):
        exact = ("speculative output equals plain decoding token for token" if inv.get("bitwise") else
                 "speculative output can differ from plain decoding where the top two logits nearly tie; "
                 "'promptlookup setup-llama' builds the invariant kernels by default")
        out(f"batch invariance: {'yes' if inv.get('bitwise') else 'no'} "
            f"({inv.get('identical')}/{inv.get('rows')} rows bit-identical): {exact}")
    if "flash_attention" in r:
        out("flash attention (the smoke test's 1024 positions): " + ("on" if r["flash_attention"] else "off")
            + "; PROMPTLOOKUP_FLASH_ATTENTION=auto turns it on for contexts up to 512 positions on "
              "set-up's patched invariant build (docs/exactness.md)")
    # constants and string checks: llama.cpp stays unloaded in this process
    from promptlookup.backends.llama_cpp import (
        MUL_MAT_COLS,
        MUL_MAT_COLS_OLDER,
        SETUP_COMMAND,
        build_problem,
    )

    if r.get("system_info"):
        problem = build_problem(str(r["system_info"]))
        out("llama-cpp-python build: " + (
            "promptlookup's safe build (AMX off, batch-invariant kernels, one-path flash attention)"
            if problem is None else
            f"NOT promptlookup's safe build: {problem}; speculative output may differ from --speculate off, "
            f"and upstream's build dies by SIGILL on AMX CPUs; '{SETUP_COMMAND}' installs the exact one"))

    info = str(r.get("system_info", ""))
    if MUL_MAT_COLS in info:
        out("matmul: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K and F16 rows take up to 16 tokens at once "
            "(set-up's patch), every result bit-identical to ggml's one-pair kernel (docs/exactness.md)")
    elif MUL_MAT_COLS_OLDER in info:
        out("matmul: Q4_1, Q5_0, Q8_0, Q4_K, Q6_K and F16 rows take up to 16 tokens at once (an older "
            "set-up's patch: Q4_0, Q5_1, Q2_K, Q3_K and Q5_K weights take ggml's one-pair kernel, exact "
            f"but verifies dearer; '{SETUP_COMMAND}' rebuilds with their kernels)")
    if not outcome.ok:
        out("verdict: UNHEALTHY: this llama.cpp build cannot be trusted here; rebuild with "
            "'promptlookup setup-llama' (it falls back to an AVX2-only build when the host build fails)")
        return 3
    record_healthy()
    out(f"threads: {r.get('threads')}")
    seconds = r.get("curve_seconds") or []
    if seconds:
        rel = [s / seconds[0] for s in seconds]
        out("verify cost curve: " + " ".join(f"{i + 1}:{x:.2f}x" for i, x in enumerate(rel)))
        out("verify seconds:    " + " ".join(f"{i + 1}:{s * 1000:.1f}ms" for i, s in enumerate(seconds)))
        out(f"verdict: healthy; {verdict(rel)}")
    else:
        out("verdict: healthy")
    return 0
