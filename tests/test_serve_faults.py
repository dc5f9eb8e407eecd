"""Faults on a real ``promptlookup serve``: kill -9 while the history is being written leaves the old file
or the new one; SIGTERM in the middle of a stream saves the history and exits 0; a corrupt or foreign
history is refused at start in one line (exit 2)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from serving import ServerProcess, server_env, wait_until

from promptlookup.drafting.suffix.history import History

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"


def _ask(client: httpx.Client, text: str, n: int = 2) -> httpx.Response:
    return client.post(CHAT, json={"messages": [{"role": "user", "content": text}], "max_tokens": n,
                                   "temperature": 0})


def _serve_once(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "promptlookup", "serve", "--port", "0", "-t", "1",
                           "-c", "256", *args], capture_output=True, text=True, timeout=120, env=server_env())


def test_kill_9_while_saving_leaves_the_old_or_the_new_history(tmp_path, vocab_tokenizer):
    fp = vocab_tokenizer.fingerprint()
    path = tmp_path / "big.hist"
    h = History(budget=1_000_000, fingerprint=fp)
    rng = np.random.default_rng(7)
    for _ in range(6):  # ~300k tokens: a save writes ~19 MB, long enough to be caught in the act
        h.add(rng.integers(0, 49152, 50_000))
    h.save(path)
    tokens = h.n_tokens
    temp = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    caught = 0
    for _ in range(2):
        seen_before = {e for e in os.listdir(tmp_path) if temp.fullmatch(e)}  # left by the last kill
        with ServerProcess("--history", str(path), "--history-save-every", "1", ctx=512) as server:
            stop = threading.Event()

            def traffic(url=server.url, stop=stop) -> None:
                with httpx.Client(base_url=url, timeout=30) as c:
                    i = 0
                    while not stop.is_set():
                        try:
                            _ask(c, f"Say the number {i}.")
                        except httpx.HTTPError:
                            return
                        i += 1

            t = threading.Thread(target=traffic, daemon=True)
            t.start()
            in_save = wait_until(lambda old=seen_before: any(temp.fullmatch(e) and e not in old
                                                             for e in os.listdir(tmp_path)), 30, every=0.001)
            server.proc.kill()  # SIGKILL, mid-write when in_save
            server.proc.wait(30)
            stop.set()
            t.join(30)
            caught += in_save
        again = History.load(path, fingerprint=fp)  # never a broken file: the old one or a new one
        assert again.n_tokens >= tokens
        tokens = again.n_tokens
    assert caught >= 1, "never saw a save in progress"


def test_sigterm_mid_stream_saves_and_exits_0_and_the_history_loads_again(tmp_path):
    path = tmp_path / "s.hist"
    with ServerProcess("--history", str(path), "--history-save-every", "1000") as server, \
            httpx.Client(base_url=server.url, timeout=60) as c:
        assert _ask(c, "Name a colour.", 8).status_code == 200
        body = {"messages": [{"role": "user", "content": "Count from 1 to 300."}], "max_tokens": 500,
                "temperature": 0, "stream": True}
        with c.stream("POST", CHAT, json=body) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert not path.exists()  # nothing saved yet: --history-save-every 1000
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            rest = list(lines)  # the stream ends at the next step, with its last chunks and [DONE]
        assert server.proc.wait(30) == 0
        assert time.monotonic() - t0 < 15
        assert "data: [DONE]" in rest
    saved = History.load(path)
    assert saved.n_tokens > 0 and len(saved.seqs) == 2
    with ServerProcess("--history", str(path)) as server:  # loads it; SIGINT is a clean stop too
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        assert server.stop(signal.SIGINT) == 0
    assert History.load(path).n_tokens >= saved.n_tokens


def test_corrupt_or_foreign_history_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.hist"
    bad.write_bytes(b"this is not a history file at all" * 10)
    foreign = tmp_path / "foreign.hist"
    h = History(fingerprint="not-this-model")
    h.add([1, 2, 3])
    h.save(foreign)
    for path in (bad, foreign):
        proc = _serve_once("--history", str(path))
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("promptlookup: error: "), proc.stderr
        assert "Traceback" not in proc.stderr and "listening" not in proc.stdout
    proc = _serve_once("--speculate", "warp")
    assert proc.returncode == 2 and "unknown draft source" in proc.stderr
