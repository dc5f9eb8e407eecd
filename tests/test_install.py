"""promptlookup in a project of its own: the wheel, a fresh venv outside the clone, ``setup-llama``.

Why: inside a clone ``scripts/setup.sh`` builds the safe llama-cpp-python; a user who adds
promptlookup to their own requirements gets what pip builds (llama.cpp's default kernels, AMX
where the CPU has it). This test is that user: it builds the wheel from the clone, installs it into
a new venv in a temporary folder with llama.cpp's default kernels (the fast wheel from the
wheelhouse, as pip would build them but without the compile), checks that the first generate says in
one line that the build is not the safe one and how to fix it, runs ``promptlookup setup-llama``,
and from a folder that is not the clone checks that the doctor reports batch invariance, generate
writes the same tokens by default and with ``--speculate off``, and serve answers ``/health`` and a
chat completion.

Nothing is compiled: both llama.cpp wheels come from the wheelhouse (``scripts/test.sh`` makes them
once: set-up the safe one, ``python -m promptlookup.llama_build wheel host --kernels fast`` the
other). Installing the dependencies comes from the configured package index (the local mirror here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from promptlookup.backends.llama_cpp import build_warning
from promptlookup.llama_build.recipe import default_wheelhouse, plan

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ("Copy this list exactly: alpha beta gamma delta epsilon zeta eta theta iota kappa. "
          "Again: alpha beta gamma delta epsilon zeta eta theta iota kappa. Again:")
pytestmark = pytest.mark.install


def _env(cache: Path, wheelhouse: Path) -> dict[str, str]:
    """The user's environment, without anything that points into the clone or another venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PROMPTLOOKUP_LLAMA_KERNELS", "PROMPTLOOKUP_API_KEY")}
    env.update(PROMPTLOOKUP_CACHE=str(cache), PROMPTLOOKUP_WHEELHOUSE=str(wheelhouse))
    if not any(k in env for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        env["GOMP_SPINCOUNT"] = "1000"  # as scripts/test.sh: a busy machine must not stall the smoke tests
    return env


def _took(step: str, t0: float) -> None:
    """Each step's seconds on stderr (``pytest -s`` shows them): what the test's runtime is made of."""
    print(f"test_install: {step}: {time.monotonic() - t0:.1f} s", file=sys.stderr)


class Venv:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.cwd = root, env, root.parent

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        proc = subprocess.run([str(self.root / "bin" / "promptlookup"), *args], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"promptlookup {' '.join(args)}: rc={proc.returncode}\n{proc.stderr}"
        _took(f"promptlookup {args[0]}", t0)
        return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    """The wheel installed into a fresh venv with the fast (not safe) llama.cpp build."""
    wheelhouse = default_wheelhouse()
    safe, fast = plan("host", wheelhouse), plan("host", wheelhouse, kernels="fast")
    for build, how in ((safe, "bash scripts/setup.sh"),
                       (fast, "python -m promptlookup.llama_build wheel host --kernels fast")):
        if build.wheel() is None:
            pytest.skip(f"no {build.name} wheel in {wheelhouse} (key {build.key}): run {how} "
                        "(scripts/test.sh does)")
    tmp = tmp_path_factory.mktemp("user-project")
    assert ROOT not in tmp.parents
    dist = tmp / "dist"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("promptlookup-*.whl"))
    _took("python -m build --wheel", t0)
    t0 = time.monotonic()
    env = _env(tmp / "cache", wheelhouse)
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check"]
    proc = subprocess.run([*pip, "--find-links", str(fast.folder), f"{wheel}[server]"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    _took("venv + pip install of the wheel and its dependencies", t0)
    return Venv(tmp / "venv", env)


def _generate(venv: Venv, *flags: str) -> tuple[list[int], str]:
    proc = venv.run("generate", "-p", PROMPT, "-n", "24", "-t", "2", "--json", *flags)
    return json.loads(proc.stdout)["tokens"], proc.stderr


def test_without_setup_llama_the_first_generate_says_the_build_is_not_the_safe_one(venv):
    tokens, err = _generate(venv, "--speculate", "off")
    assert len(tokens) > 0
    warnings = [line for line in err.splitlines() if "not promptlookup's safe build" in line]
    assert warnings == [build_warning("CPU : LLAMAFILE = 1 | REPACK = 1 | ", {})]
    assert warnings[0].endswith("run 'promptlookup setup-llama' to install the exact one")
    # (the doctor's line for such a build: tests/test_doctor.py, without a second full doctor run here)


def test_setup_llama_installs_the_safe_build_and_everything_works_outside_the_clone(venv):
    safe = plan("host", default_wheelhouse())
    setup = venv.run("setup-llama").stderr
    assert f"ready: llama-cpp-python 0.3.36 (host build, invariant kernels {safe.key})" in setup
    assert "building llama-cpp-python" not in setup  # the wheelhouse's wheel, not a compile
    assert (venv.root / "llama-build-key").read_text() == safe.key + "\n"

    doctor = venv.run("doctor").stdout
    assert "batch invariance: yes" in doctor
    assert "llama-cpp-python build: promptlookup's safe build" in doctor
    assert "verdict: healthy" in doctor

    plain, err_plain = _generate(venv, "--speculate", "off")
    spec, err_spec = _generate(venv)
    assert spec == plain and len(plain) == 24
    assert "warning" not in err_plain + err_spec

    _serve_answers(venv)


def _serve_answers(venv: Venv) -> None:
    t0 = time.monotonic()
    proc = subprocess.Popen([str(venv.root / "bin" / "promptlookup"), "serve", "--port", "0", "-t", "1",
                             "-c", "1024"], cwd=venv.cwd, env=venv.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = _ready_url(proc)
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            assert r.status == 200 and json.load(r)["status"] == "ok"
        body = json.dumps({"model": "smollm2-135m", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.load(r)
        assert r.status == 200 and reply["object"] == "chat.completion"
        assert reply["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= reply["usage"]["completion_tokens"] <= 8
        _took("serve: start, /health, one chat completion", t0)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _ready_url(proc: subprocess.Popen[str], timeout: float = 180.0) -> str:
    """The address from serve's ready line (``--port 0`` picks a free port)."""
    found: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("promptlookup serve: listening on "):
                found.append(line.split(" on ", 1)[1].strip())
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    t0 = time.monotonic()
    while not done.wait(1.0) and time.monotonic() - t0 < timeout:
        pass
    if not found:
        proc.kill()
        raise AssertionError(f"serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    return found[0]
