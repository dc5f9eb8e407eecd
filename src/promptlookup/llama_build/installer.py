"""Doing the build: compile (or reuse) the wheel, install it, prove it, fall back once.

After install, the smoke test (``promptlookup doctor --smoke-only``: prefill, a 9-token verify,
rollback, batched rows against single-token rows) runs in a child process. If it fails, set-up says
how in one line, rebuilds once with a conservative ISA set (AVX2/FMA/F16C), proves that build, and
fails with a clear message if that dies too. A build that failed its smoke test is remembered in its
wheelhouse folder, so the next set-up goes straight to the conservative one.

Two entry points share all of it: ``scripts/setup.sh`` (``python -m promptlookup.llama_build setup
--venv .venv``: the wheel first, then the clone's project into that venv) and ``promptlookup
setup-llama`` (:func:`setup_here`: the wheel into the running interpreter's environment, for a
promptlookup installed from a registry into a project of its own).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from promptlookup.llama_build.recipe import (
    CONSERVATIVE_ISA,
    DEFAULT_KERNELS,
    FAILED_MARK,
    INSTALLED_MARK,
    KERNELS,
    KERNELS_ENV,
    LLAMA_CPP_PYTHON_VERSION,
    MODES,
    TORCH_VERSION,
    Build,
    apply_patches,
    builds_to_try,
    cmake_args,
    cpu_flags,
    default_kernels,
    default_wheelhouse,
    plan,
)

_T0 = time.monotonic()


def log(msg: str) -> None:
    """One progress line, with the time since set-up started (the slow steps say how slow)."""
    m, sec = divmod(int(time.monotonic() - _T0), 60)
    print(f"setup [{m}:{sec:02d}]: {msg}", file=sys.stderr, flush=True)


def pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    cmd = [python, "-m", "pip", "--disable-pip-version-check", *args]
    subprocess.run(cmd, check=True, env=env)


def build_wheel(python: str, build: Build) -> Path:
    """Compile llama-cpp-python with ``build.args`` (``--no-cache-dir``: pip's wheel cache ignores
    CMAKE_ARGS and would hand back a wheel built with other flags)."""
    build.folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(build.args),
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    log(f"building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} from source, {build.mode} ISA, "
        f"{build.kernels} kernels (once per build key {build.key}; 3-5 min on 2 cores)")
    log(f"  CMAKE_ARGS={shlex.join(build.args)}")
    requirement = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    if not build.patches:
        pip(python, "wheel", "--quiet", "--no-deps", "--no-cache-dir", "-w", str(build.folder),
            requirement, env=env)
    else:
        with tempfile.TemporaryDirectory(prefix="llama-src-") as tmp:
            log(f"  downloading the source package and patching {len(build.patches)} places "
                f"({', '.join(sorted({Path(p.path).name for p in build.patches}))})")
            pip(python, "download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", tmp, requirement)
            sdists = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            if not sdists:
                raise SystemExit("setup: error: pip download wrote no llama-cpp-python source "
                                 f"package into {tmp}")
            with tarfile.open(sdists[0]) as tar:
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links and paths out of tmp
                    tar.extractall(tmp, filter="data")
                else:
                    tar.extractall(tmp)  # noqa: S202 - pip's own download of the pinned package
            root = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
            apply_patches(root, build.patches)
            pip(python, "wheel", "--quiet", "--no-deps", "--no-cache-dir", "-w", str(build.folder),
                str(root), env=env)
    (build.folder / "cmake-args.txt").write_text(" ".join(build.args) + "\n", encoding="utf-8")
    wheel = build.wheel()
    if wheel is None:
        raise SystemExit(f"setup: error: pip wheel wrote no llama-cpp-python wheel into {build.folder}")
    return wheel


def installed_key(venv: Path) -> str | None:
    """The wheelhouse key set-up last installed into ``venv`` (None: none, or not by set-up)."""
    try:
        return (venv / INSTALLED_MARK).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def install_wheel(python: str, venv: Path, build: Build) -> None:
    """Install ``build``'s wheel unless the venv already has exactly that build. The mark is the
    venv's own record; an environment set-up cannot write into (a system Python) just goes without
    it and gets the wheel reinstalled next time."""
    if installed_key(venv) == build.key:
        return
    wheel = build.wheel() or build_wheel(python, build)
    log(f"installing {wheel.name} (build key {build.key})")
    pip(python, "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel))
    try:
        (venv / INSTALLED_MARK).write_text(build.key + "\n", encoding="utf-8")
    except OSError as exc:
        log(f"  (not recording the build in {venv}: {exc.strerror or exc})")


def install_project(python: str, wheelhouse: Path, extras: str) -> None:
    """The clone's package itself: ``core`` for the main job, ``all`` adds the test, server and
    transformers extras (torch goes first and pinned: its CPU build is on local disk, an unpinned one
    pulls CUDA)."""
    if extras == "all":
        log(f"installing torch {TORCH_VERSION} (CPU build)")
        pip(python, "install", "--quiet", f"torch=={TORCH_VERSION}")
        spec = ".[test,server,transformers,bench]"
        pins = [f"torch=={TORCH_VERSION}"]
    else:
        spec, pins = ".[server]", []
    log(f"installing promptlookup (editable, {'core + server' if extras == 'core' else 'every extra'})")
    pip(python, "install", "--quiet", "--find-links", str(wheelhouse),
        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", *pins, "-e", spec)


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    line: str
    stopped: bool = False  # stopped from outside (a signal a bad build never sends): no verdict on the build


def run_smoke(python: str) -> SmokeResult:
    """``promptlookup doctor --smoke-only``: it runs the smoke test in a child of its own and prints
    one line (which signal, which step, or which check failed; for a build without the
    batch-dependent kernels, whether every row was bit-identical to its one-token decode). Exit
    status 4 (``SMOKE_STOPPED_STATUS``): the child was stopped from outside; the doctor itself dying
    by a signal is that too (it never loads llama.cpp)."""
    proc = subprocess.run([python, "-m", "promptlookup", "doctor", "--smoke-only"],
                          capture_output=True, text=True)
    text = (proc.stdout.strip().splitlines() or [""])[-1] or (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode < 0:
        text = f"the smoke test's parent was stopped by signal {-proc.returncode}: {text}"
    return SmokeResult(proc.returncode == 0, text or f"exit status {proc.returncode}",
                       stopped=proc.returncode < 0 or proc.returncode == 4)


def ensure_llama(python: str, venv: Path, wheelhouse_root: Path,
                 smoke: Callable[[str], SmokeResult] = run_smoke,
                 install: Callable[[str, Path, Build], None] = install_wheel,
                 plans: Callable[[str], Build] | None = None, kernels: str = DEFAULT_KERNELS) -> Build:
    """Install a llama.cpp build that passes the smoke test: the host build, else the conservative
    one (both with the same kernels). Raises SystemExit with the reason when neither passes."""
    candidates, skipped = builds_to_try(plans or (lambda mode: plan(mode, wheelhouse_root, kernels=kernels)))
    for build in skipped:
        log(f"the {build.name} (key {build.key}) failed its smoke test before; "
            f"using the {candidates[0].name}")
    last = ""
    for i, build in enumerate(candidates):
        install(python, venv, build)
        result = smoke(python)
        if result.ok:
            log(f"{build.name} (key {build.key}): {result.line}")
            return build
        if result.stopped:  # not the build's fault: nothing is marked, the next set-up tries it again
            raise SystemExit(f"setup: error: {build.name} (key {build.key}): {result.line}. "
                             f"Run set-up again.")
        last = result.line
        log(f"{build.name} (key {build.key}): {result.line}")
        build.folder.mkdir(parents=True, exist_ok=True)
        (build.folder / FAILED_MARK).write_text(result.line + "\n", encoding="utf-8")
        if i + 1 < len(candidates):
            log(f"rebuilding once with the {candidates[i + 1].mode} ISA set "
                f"({', '.join(sorted(CONSERVATIVE_ISA))})")
    raise SystemExit(f"setup: error: llama.cpp does not run on this machine even when built for "
                     f"{', '.join(sorted(CONSERVATIVE_ISA))} only: {last}. "
                     f"Run 'promptlookup doctor' for details.")


def compile_kernels(python: str) -> None:
    """``promptlookup compile``: numba compiles the drafting kernels now and caches them on disk, so
    the first run after set-up loads them instead of compiling them (about 10 s on 2 cores)."""
    log("compiling the drafting kernels (numba; cached on disk for every later run)")
    proc = subprocess.run([python, "-m", "promptlookup", "compile"], capture_output=True, text=True)
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    if proc.returncode != 0:
        raise SystemExit(f"setup: error: compiling the drafting kernels failed: {last}")
    log(last)


def ensure_llama_before_project(python: str, venv: Path, wheelhouse_root: Path, extras: str,
                                kernels: str = DEFAULT_KERNELS) -> Build:
    """Install order: the llama.cpp wheel (so pip never builds one itself), then the project, then
    the proof (the smoke test needs promptlookup installed)."""
    first = builds_to_try(lambda mode: plan(mode, wheelhouse_root, kernels=kernels))[0][0]
    install_wheel(python, venv, first)
    install_project(python, first.folder, extras)
    return ensure_llama(python, venv, wheelhouse_root, kernels=kernels)


def setup_here(kernels: str | None = None, wheelhouse: Path | None = None,
               compile_drafting: bool = True) -> Build:
    """``promptlookup setup-llama``: the safe build into the environment of the running interpreter
    (``sys.executable``; its mark in ``sys.prefix``), proven by the smoke test, then the drafting
    kernels compiled. Where the wheelhouse has the wheel for this key, nothing is compiled."""
    kernels = kernels or default_kernels()
    root = wheelhouse or default_wheelhouse()
    python = sys.executable
    build = ensure_llama(python, Path(sys.prefix), root, kernels=kernels)
    if compile_drafting:
        compile_kernels(python)
    log(f"ready: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({build.name} {build.key}) in {sys.prefix}")
    return build


KERNELS_HELP = (f"matmul kernels (default: ${KERNELS_ENV} or {DEFAULT_KERNELS}): invariant = "
                "bit-identical rows whatever the batch (speculative output equals plain decoding); "
                "fast = llama.cpp's defaults (tinyBLAS, repacked weights)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m promptlookup.llama_build",
                                 description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="install llama.cpp (safe build, proven) and promptlookup into a venv")
    s.add_argument("--venv", type=Path, default=Path(".venv"))
    s.add_argument("--extras", choices=("core", "all"), default="all")
    s.add_argument("--kernels", choices=KERNELS, default=None, help=KERNELS_HELP)
    a = sub.add_parser("cmake-args", help="print the CMake arguments for a build mode")
    a.add_argument("mode", choices=MODES)
    a.add_argument("--kernels", choices=KERNELS, default=None, help=KERNELS_HELP)
    w = sub.add_parser("wheel", help="build the wheel for a build mode into the wheelhouse (nothing "
                                     "installed; a no-op when it is there) and print its path")
    w.add_argument("mode", choices=MODES)
    w.add_argument("--kernels", choices=KERNELS, default=None, help=KERNELS_HELP)
    k = sub.add_parser("key", help="print the wheelhouse key for a build mode")
    k.add_argument("mode", choices=MODES)
    k.add_argument("--kernels", choices=KERNELS, default=None, help=KERNELS_HELP)
    args = ap.parse_args(argv)
    kernels = args.kernels or default_kernels()

    if args.command == "cmake-args":
        print(" ".join(cmake_args(args.mode, cpu_flags(), kernels=kernels)))
        return 0
    if args.command == "key":
        print(plan(args.mode, default_wheelhouse(), kernels=kernels).key)
        return 0
    if args.command == "wheel":
        build = plan(args.mode, default_wheelhouse(), kernels=kernels)
        print(build.wheel() or build_wheel(sys.executable, build))
        return 0
    python = str(args.venv / "bin" / "python")
    build = ensure_llama_before_project(python, args.venv, default_wheelhouse(), args.extras, kernels)
    compile_kernels(python)
    log(f"ready: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({build.name} {build.key}), "
        f"promptlookup installed in {args.venv}")
    return 0
