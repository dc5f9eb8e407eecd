"""``vllm serve`` with our proposer, asked through the ``openai`` client; run by tests/test_vllm.py.

    .venv-vllm/bin/python tests/vllm_serve_check.py MODEL_DIR OUT.json

Starts ``vllm serve`` on 127.0.0.1 (a free port) with ``--speculative-config`` naming our class,
waits for ``/health`` (bounded), asks one chat completion at temperature 0 that copies text, reads
vLLM's speculative counters from ``/metrics``, and stops the server (its process group) whatever
happens. Writes the reply and the counters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SPEC = {"method": "custom_class", "model": "promptlookup.integrations.vllm.PromptLookupProposer",
        "num_speculative_tokens": 8}
START_LIMIT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(model: str, out_path: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}"}
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "smol", "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "2048", "--max-num-seqs", "4", "--speculative-config", json.dumps(SPEC)]
    log = open(Path(out_path).with_suffix(".log"), "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + START_LIMIT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"vllm serve not up within {START_LIMIT_S} s; see {log.name}")
            time.sleep(2)
        from openai import OpenAI

        client = OpenAI(base_url=base + "/v1", api_key="unused", timeout=300)
        text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
        reply = client.chat.completions.create(
            model="smol", temperature=0, max_tokens=64,
            messages=[{"role": "user", "content": f"Repeat this line exactly three times:\n{text}"}])
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            metrics = r.read().decode()
        counts = {}
        for line in metrics.splitlines():
            metric = line.split("{")[0]
            if metric.startswith("vllm:spec_decode_num_") and metric.endswith("_total"):
                name = metric.removeprefix("vllm:spec_decode_num_").removesuffix("_total")
                counts[name] = counts.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        r = {"content": reply.choices[0].message.content, "finish_reason": reply.choices[0].finish_reason,
             "completion_tokens": reply.usage.completion_tokens, "spec": counts}
        Path(out_path).write_text(json.dumps(r, indent=1))
        print(json.dumps(r, indent=1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
