"""llama.cpp's own server as a bench peer: ``llama-server`` on the bench's model file, plain or with
its own n-gram speculation, fed the same prompt ids as our cells.

Why a server and not a library: llama-server is what users of llama.cpp run, and its speculation
(``--spec-default``: the ``ngram-mod`` drafter) exists only in its serving loop. Its rates come from
its own ``timings`` (``prompt_ms`` until the first new token, ``predicted_ms`` for the rest, the
convention of our counters), so HTTP costs nothing in the table.

Every run starts a fresh process and stops it afterwards. ``ngram-mod`` keeps one n-gram table for
the process's lifetime; a kept server would draft round two's answer from round one's, a memory that
our cells, built fresh for every run, do not have. A workload of several requests sends them in order
to one process (its table and slot carry over between them, as our sources commit between them) and
reports the last.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptlookup.errors import InputError

BUILD_HINT = (".venv/bin/python -c \"import sys; sys.path.insert(0, 'benchmarks'); import llama_tools; "
              "print(llama_tools.ensure_server(kernels='fast'))\"")
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 1800.0
LOG_TAIL_CHARS = 600


@dataclass(frozen=True)
class ServerAnswer:
    """One ``/completion`` answer, in the units our counters use."""

    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    drafted: int
    accepted: int

    @property
    def decodes(self) -> int:
        """Forwards after the prompt's: the first token comes with the prompt, and every forward
        after it yields one token more than the drafts it accepted."""
        return max(len(self.tokens) - 1 - self.accepted, 0)


def parse_answer(body: bytes, where: str) -> ServerAnswer:
    """Read a ``/completion`` reply (``return_tokens``); anything else is an error naming the server."""
    try:
        reply = json.loads(body)
    except ValueError:
        raise InputError(f"{where} answered something that is not JSON: {body[:200]!r}") from None
    if not isinstance(reply, dict):
        raise InputError(f"{where} answered a JSON {type(reply).__name__}, not an object")
    tokens, timings = reply.get("tokens"), reply.get("timings")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise InputError(f"{where} answered without a list of token ids (is it older than return_tokens?)")
    if not isinstance(timings, dict):
        raise InputError(f"{where} answered without timings")

    def number(key: str, default: float | None = None) -> float:
        v = timings.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise InputError(f"{where} answered timings.{key} = {v!r}, not a number >= 0")
        return float(v)

    return ServerAnswer(tokens=tokens, prompt_tokens=int(number("prompt_n")),
                        prefill_s=number("prompt_ms") / 1000.0, decode_s=number("predicted_ms") / 1000.0,
                        drafted=int(number("draft_n", 0)), accepted=int(number("draft_n_accepted", 0)))


def completion_body(prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
    """Greedy, the prompt as ids (no template, no BOS added), the ids of the answer returned."""
    return {"prompt": [int(t) for t in prompt], "n_predict": int(max_tokens), "temperature": 0.0,
            "top_k": 1, "cache_prompt": True, "return_tokens": True, "stream": False}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_program(binary: str | os.PathLike[str]) -> Path:
    """``binary`` as a path if this user can run it; else the error that says how to build one."""
    path = Path(binary)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise InputError(f"no llama-server program at {path}; build llama.cpp's (once, ~20 min "
                         f"on 2 cores): {BUILD_HINT}")
    return path


class LlamaServerPeer:
    """Starts ``binary`` on ``model_path`` for each run (``speculate`` adds ``--spec-default``)."""

    def __init__(self, binary: str | os.PathLike[str], model_path: str | os.PathLike[str], n_ctx: int,
                 n_threads: int, speculate: bool, start_timeout_s: float = START_TIMEOUT_S,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.binary = check_program(binary)
        self.model_path = Path(model_path)
        self.n_ctx, self.n_threads, self.speculate = n_ctx, n_threads, speculate
        self.start_timeout_s = start_timeout_s
        self._sleep, self._clock = sleep, clock

    def argv(self, port: int) -> list[str]:
        t = str(self.n_threads)
        argv = [str(self.binary), "-m", str(self.model_path), "-c", str(self.n_ctx), "-t", t, "-tb", t,
                "-np", "1", "--host", "127.0.0.1", "--port", str(port)]
        return [*argv, "--spec-default"] if self.speculate else argv

    def run(self, requests: Sequence[Sequence[int]], max_tokens: int) -> ServerAnswer:
        """A fresh server answers every request in order; the last answer is returned."""
        with tempfile.TemporaryFile() as log:
            port = free_port()
            proc = subprocess.Popen(self.argv(port), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}"
                self._wait_ready(proc, url, log)
                answer = None
                for prompt in requests:
                    answer = self._complete(proc, url, prompt, max_tokens, log)
                assert answer is not None, "a workload has at least one request"
                return answer
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _failure(self, proc: subprocess.Popen, log: Any, what: str) -> InputError:
        log.flush()
        log.seek(0)
        tail = log.read().decode("utf-8", "replace")[-LOG_TAIL_CHARS:].strip()
        code = proc.poll()
        ended = f" (it exited with status {code})" if code is not None else ""
        return InputError(f"llama-server {self.binary} {what}{ended}; its log ends: {tail or '(empty)'}")

    def _wait_ready(self, proc: subprocess.Popen, url: str, log: Any) -> None:
        deadline = self._clock() + self.start_timeout_s
        while True:
            if proc.poll() is not None:
                raise self._failure(proc, log, f"did not start on {self.model_path}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            if self._clock() > deadline:
                raise self._failure(proc, log, f"was not ready within {self.start_timeout_s:.0f} s")
            self._sleep(0.2)

    def _complete(self, proc: subprocess.Popen, url: str, prompt: Sequence[int], max_tokens: int,
                  log: Any) -> ServerAnswer:
        data = json.dumps(completion_body(prompt, max_tokens)).encode()
        req = urllib.request.Request(url + "/completion", data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise InputError(f"llama-server refused a {len(prompt)}-token prompt: "
                             f"HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._failure(proc, log, f"stopped answering ({exc})") from None
        return parse_answer(body, "llama-server")
