"""llama.cpp's own programs (lookup tools, llama-server), built for the benchmarks' peers.

Why a module: every benchmark that runs llama.cpp's programs beside ours needs them built from the
llama.cpp vendored in the installed llama-cpp-python's source package, with the same safe ISA flags
set-up uses (``promptlookup.llama_build.recipe``: the host's extensions named one by one, never AMX, whose
ggml kernel dies by SIGILL in this version). ``-march=native`` would build llama-lookup-create so that
it dies in its warm-up decode on a CPU with AMX. Builds are cached outside the repository, one build
folder per set of flags, in ``~/.cache/promptlookup/llamacpp``.

llama-server is configured without its web UI (no npm build, no download of prebuilt assets from a
Hugging Face bucket at build time: the benchmarks talk to its HTTP API only) and without OpenSSL
(it listens on 127.0.0.1 over plain HTTP).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path.home() / ".cache" / "promptlookup" / "llamacpp"
# options that only matter to llama-server (and its cpp-httplib); harmless to the lookup tools
_SERVER_ARGS = ("-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_OPENSSL=OFF")


def _llama_build():
    """Set-up's build recipe (package code: ``promptlookup.llama_build.recipe``)."""
    from promptlookup.llama_build import recipe

    return recipe


def _log(msg: str) -> None:
    print(f"[llama_tools] {msg}", file=sys.stderr, flush=True)


def source_dir() -> Path:
    """The vendored llama.cpp of the installed llama-cpp-python version (downloaded and unpacked once)."""
    ver = version("llama_cpp_python")
    src = ROOT / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
    if not src.is_dir():
        ROOT.mkdir(parents=True, exist_ok=True)
        _log(f"downloading the llama-cpp-python {ver} source package")
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={ver}", "--no-binary",
                        ":all:", "--no-deps", "-d", str(ROOT)], check=True)
        subprocess.run(["tar", "xzf", str(ROOT / f"llama_cpp_python-{ver}.tar.gz"), "-C", str(ROOT)],
                       check=True)
    return src


def _key(build) -> str:
    """The build folder's key: the CMake flags only. The tools are built from the unpatched source
    (llama.cpp as its users run it, with set-up's kernel and ISA flags); set-up's source patches
    concern our library's wheel alone."""
    lb = _llama_build()
    return lb.wheelhouse_key(lb.LLAMA_CPP_PYTHON_VERSION, build.args, lb.compiler_id())


def bin_dir(mode: str = "host", kernels: str = "invariant") -> Path:
    """Where the programs of this build mode and kernels live (the folder name carries the flags' key)."""
    lb = _llama_build()
    return source_dir() / f"build-{_key(lb.plan(mode, ROOT, kernels=kernels))}" / "bin"


def ensure_tools(targets: tuple[str, ...], mode: str = "host", kernels: str = "invariant") -> Path:
    """Build ``targets`` (e.g. ``llama-lookup-create``) once; return their bin folder. ``kernels``:
    set-up's ``invariant`` CMake flags (without tinyBLAS and the repacked layouts) or ``fast``
    (llama.cpp's defaults, as its users build it); never set-up's source patches."""
    lb = _llama_build()
    build = lb.plan(mode, ROOT, kernels=kernels)
    out = bin_dir(mode, kernels)
    if all((out / t).is_file() for t in targets):
        return out
    src = source_dir()
    build_dir = out.parent
    _log(f"building {', '.join(targets)} ({mode} ISA, {kernels} kernels, key {_key(build)}; "
         "~10 min on 2 cores)")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", *_SERVER_ARGS, *build.args], check=True)
    subprocess.run(["nice", "cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2), "--target",
                    *targets], check=True)
    return out


def ensure_server(mode: str = "host", kernels: str = "invariant") -> Path:
    """The path of ``llama-server``, built once like the lookup tools (same flags, same folder)."""
    return ensure_tools(("llama-server",), mode, kernels) / "llama-server"
