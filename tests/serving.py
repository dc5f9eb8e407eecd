"""A real ``promptlookup serve`` process for the server tests: started on 127.0.0.1 on a free port
(``--port 0``; the port is read from the ready line), stopped by signal, never left behind."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")
READY = "promptlookup serve: listening on "

#: two tools the tool-calling server tests declare (the bundled model's and Qwen's), and their
#: parameter schemas by name
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 60},
                                         "line": {"type": "integer", "minimum": 1, "maximum": 9999}},
        "required": ["path"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file of the project",
                                           "parameters": READ}},
         {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
SCHEMAS = {"read_file": READ, "get_weather": WEATHER}


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMPTLOOKUP_API_KEY"}
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


class ServerProcess:
    """``promptlookup serve ARGS`` (defaults: one thread, a 1024-token context) until :meth:`stop`."""

    def __init__(self, *args: str, threads: int = 1, ctx: int = 1024, env: dict[str, str] | None = None,
                 start_timeout: float = 120.0) -> None:
        self.args = ["serve", "--port", "0", "-t", str(threads), "-c", str(ctx), *args]
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([sys.executable, "-m", "promptlookup", *self.args],
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=env or server_env())
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(start_timeout) or not self.url:
            self.kill()
            raise RuntimeError(f"the server did not start: rc={self.proc.poll()}\n{self.err()}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(READY):
                self.url = line[len(READY):].strip()
                self._ready.set()
        self._ready.set()  # it exited

    def err(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit status (killed after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(30)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.stop(timeout=30)
        self.stderr.close()


def wait_until(cond, timeout: float = 30.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def stream_sse(client, path: str, body: dict) -> dict:
    """POST ``body`` with ``stream: true``; the joined text, finish reason, seconds to the first text and
    to the end, and whether the stream ended with ``data: [DONE]``."""
    import json

    t0 = time.monotonic()
    out = {"text": "", "finish_reason": None, "ttft": None, "done": False, "usage": None, "status": None}
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            r.read()
            out["error"] = r.json().get("error")
            out["e2e"] = time.monotonic() - t0
            return out
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            for choice in obj.get("choices") or ():
                piece = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                if piece:
                    if out["ttft"] is None:
                        out["ttft"] = time.monotonic() - t0
                    out["text"] += piece
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
            if obj.get("usage"):
                out["usage"] = obj["usage"]
    out["e2e"] = time.monotonic() - t0
    return out


def metric_values(text: str) -> dict[str, float]:
    """The unlabelled samples of a ``/metrics`` page by name, read by prometheus_client's own parser
    (counters keep their ``_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
