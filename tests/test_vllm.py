"""promptlookup inside vLLM (``promptlookup.integrations.vllm``).

The row tracking runs here without vLLM, on a fake batch laid out as vLLM 0.32 passes it (the
persistent ``token_ids_cpu`` buffer, ``num_tokens_no_spec``, each row's tokens of this step). The
end-to-end test runs vLLM itself in its own environment (``scripts/vllm_env.sh``) in a subprocess,
and is skipped where that environment was not set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from promptlookup.drafting.base import Draft
from promptlookup.drafting.live_outputs import LiveOutputs
from promptlookup.errors import UsageError
from promptlookup.integrations.vllm import (
    ENV_HISTORY,
    ENV_PEERS,
    ENV_SAVE_S,
    ENV_SOURCE,
    PromptLookupProposer,
    RowTracker,
    peers_from_env,
    settings_from_env,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 64


class Recorder:
    """A source that logs what it is told and drafts its name's number (to tell sources apart)."""

    name = "rec"

    def __init__(self, log: list, ident: int) -> None:
        self.log, self.ident = log, ident

    def reset(self, prompt):
        self.log.append((self.ident, "reset", list(prompt)))

    def extend(self, tokens):
        self.log.append((self.ident, "extend", list(tokens)))

    def propose(self, k):
        return Draft(tuple([self.ident] * k), "rec")

    def commit(self):
        self.log.append((self.ident, "commit"))

    def feedback(self, step):
        self.log.append((self.ident, "feedback", step.fed, step.confirmed))


class Batch:
    """vLLM's persistent buffers: rows of tokens, their counts; ``step`` appends and calls."""

    def __init__(self, rows: int = 4) -> None:
        self.ids = np.full((rows, MAX_LEN), -7, dtype=np.int32)  # stale garbage past each row's count
        self.n = np.zeros(rows, dtype=np.int32)

    def put(self, row: int, tokens: list[int]) -> None:
        self.ids[row, : len(tokens)] = tokens
        self.n[row] = len(tokens)

    def add(self, row: int, tokens: list[int]) -> list[int]:
        n = self.n[row]
        self.ids[row, n : n + len(tokens)] = tokens
        self.n[row] = n + len(tokens)
        return tokens

    def move(self, src: int, dst: int) -> None:
        self.ids[dst] = self.ids[src]
        self.n[dst] = self.n[src]


def tracker(k: int = 2, clock=None):
    log: list = []
    made = iter(range(100))
    t = RowTracker(lambda: Recorder(log, next(made)), k, MAX_LEN, clock=clock or (lambda: 0.0))
    return t, log


def test_new_request_then_appends_extend_only_the_new_tokens():
    t, log = tracker()
    b = Batch()
    b.put(0, [5, 6, 7, 8])
    assert t.step([[8]], b.n, b.ids) == [[0, 0]]
    assert t.step([b.add(0, [9, 10])], b.n, b.ids) == [[0, 0]]
    assert log == [(0, "reset", [5, 6, 7, 8]), (0, "feedback", 3, 2), (0, "extend", [9, 10])]
    assert t.stats()["requests"] == 1


def test_empty_sampled_row_gets_no_draft_and_keeps_its_request():
    t, log = tracker()
    b = Batch()
    b.put(0, [1, 2, 3])
    t.step([[3]], b.n, b.ids)
    assert t.step([[]], b.n, b.ids) == [[]]
    assert t.step([b.add(0, [4])], b.n, b.ids) == [[0, 0]]
    assert log == [(0, "reset", [1, 2, 3]), (0, "extend", [4])]  # no feedback: the empty step drafted nothing


def test_a_plain_step_is_fed_back_too():
    """A source asked for a draft that drafted nothing still hears what the plain step cost (fed 1):
    auto measures its plain baseline from those, and without them forced plain steps forever."""
    log: list = []

    class Empty(Recorder):
        def propose(self, k):
            return Draft((), "rec")

    t = RowTracker(lambda: Empty(log, 0), 2, MAX_LEN, clock=lambda: 0.0)
    b = Batch()
    b.put(0, [1, 2, 3])
    assert t.step([[3]], b.n, b.ids) == [[]]
    assert t.step([b.add(0, [4])], b.n, b.ids) == [[]]
    assert log == [(0, "reset", [1, 2, 3]), (0, "feedback", 1, 1), (0, "extend", [4])]


def test_condensed_batch_keeps_each_request_with_its_source():
    t, log = tracker()
    b = Batch()
    b.put(0, [1, 1, 1])
    b.put(1, [2, 2, 2])
    b.put(2, [3, 3, 3])
    assert t.step([[1], [2], [3]], b.n, b.ids) == [[0, 0], [1, 1], [2, 2]]
    # row 0's request ended; vLLM moves the last row into the hole
    b.move(2, 0)
    log.clear()
    assert t.step([b.add(0, [30]), b.add(1, [20])], b.n, b.ids) == [[2, 2], [1, 1]]
    assert (0, "commit") in log
    assert (2, "extend", [30]) in log and (1, "extend", [20]) in log
    assert not [e for e in log if e[1] == "reset"]
    assert t.stats()["moved"] == 1 and t.stats()["committed"] == 1


def test_a_new_request_in_a_reused_row_is_recognised_and_the_old_one_committed_first():
    t, log = tracker()
    b = Batch()
    b.put(0, [4, 4, 4, 4])
    t.step([[4]], b.n, b.ids)
    b.put(0, [9, 8, 7, 6, 5])  # same row, another request (one token longer: a plain append would fit)
    t.step([[5]], b.n, b.ids)
    assert log == [(0, "reset", [4, 4, 4, 4]), (0, "commit"), (0, "reset", [9, 8, 7, 6, 5])]
    assert t.stats() == {"calls": 2, "requests": 2, "committed": 1, "moved": 0, "drafted_tokens": 4,
                         "errors": 0, "live": 1, "peer_drafts": 0, "peer_tokens": 0}


def test_a_request_that_continues_another_takes_it_over():
    """A chat's next turn re-sends the conversation: it extends the ended turn's request."""
    t, log = tracker()
    b = Batch()
    b.put(1, [1, 2, 3])
    t.step([[], [3]], b.n, b.ids)
    b.put(0, [1, 2, 3, 4, 5, 6])  # turn 2 arrives in row 0 after turn 1 ended
    t.step([[6]], b.n, b.ids)
    assert log == [(0, "reset", [1, 2, 3]), (0, "extend", [4, 5, 6])]


def test_draft_stops_at_the_context_end():
    t, _ = tracker(k=5)
    b = Batch()
    b.put(0, list(range(MAX_LEN - 3)))
    assert t.step([[MAX_LEN - 4]], b.n, b.ids) == [[0, 0]]  # MAX_LEN - n - 1 tokens fit


def test_a_follower_copies_a_concurrent_leaders_live_output():
    """Two identical requests, one a few tokens ahead: the follower, whose own source drafts nothing,
    copies what the leader wrote after the follower's last tokens (at most as many as matched), and
    a request alone never does."""
    log: list = []

    class Empty(Recorder):
        def propose(self, k):
            return Draft((), "rec")

    t = RowTracker(lambda: Empty(log, 0), 6, MAX_LEN, clock=lambda: 0.0, peers=LiveOutputs())
    b = Batch()
    prompt = [1, 2, 3, 4, 5]
    b.put(0, prompt + [10, 11, 12, 13, 14, 15, 16])  # the leader: 7 output tokens
    b.put(1, prompt + [10])  # the follower: 1
    # the follower's last 6 tokens [2, 3, 4, 5, 10] + ... match the leader's prompt tail and output
    assert t.step([[16], [10]], b.n, b.ids) == [[], [11, 12, 13, 14, 15, 16]]
    assert t.stats()["peer_drafts"] == 1 and t.stats()["peer_tokens"] == 6
    alone = RowTracker(lambda: Empty(log, 1), 6, MAX_LEN, clock=lambda: 0.0, peers=LiveOutputs())
    b2 = Batch()
    b2.put(0, prompt + [10, 11, 12, 10, 11])
    assert alone.step([[11]], b2.n, b2.ids) == [[]]  # its own text is its source's job, not the peers'


def test_a_peer_draft_is_used_only_where_it_is_longer():
    t, _ = tracker(k=3)  # Recorder drafts k tokens: a peer draft is never longer
    t.peers = LiveOutputs()
    b = Batch()
    b.put(0, [1, 2, 3, 4, 5, 6, 7, 8])
    b.put(1, [1, 2, 3, 4, 5])
    assert t.step([[8], [5]], b.n, b.ids) == [[0, 0, 0], [1, 1, 1]]
    assert t.stats()["peer_drafts"] == 0


def test_peers_setting():
    assert peers_from_env({}) is True
    assert peers_from_env({ENV_PEERS: " OFF "}) is False
    with pytest.raises(UsageError, match="PROMPTLOOKUP_VLLM_PEERS='maybe': must be on or off"):
        peers_from_env({ENV_PEERS: "maybe"})
    p = PromptLookupProposer(fake_config(), env={ENV_PEERS: "off"}, fingerprint=lambda: "f" * 16)
    assert p.tracker.peers is None


def fake_config(k: int = 4, vocab: int = 64):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(get_vocab_size=lambda: vocab, max_model_len=MAX_LEN,
                                                        tokenizer="unused"))


def test_proposer_drafts_the_second_request_from_the_first_ones_output(tmp_path):
    hist = tmp_path / "h.hist"
    env = {ENV_SOURCE: "suffix", ENV_HISTORY: str(hist)}
    p = PromptLookupProposer(fake_config(), env=env, fingerprint=lambda: "f" * 16)
    b = Batch()
    first = [1, 2, 3, 10, 11, 12, 13, 14, 15]
    b.put(0, first)
    p.propose([[15]], b.n, b.ids)
    b.put(0, [4, 5, 10, 11])  # the next request, once the first one ended, quotes its output
    assert p.propose([[11]], b.n, b.ids) == [[12, 13, 14, 15]]
    assert hist.exists()  # saved at the commit
    again = PromptLookupProposer(fake_config(), env=env, fingerprint=lambda: "f" * 16)
    b2 = Batch()
    b2.put(2, [7, 12, 13])
    assert again.propose([[], [], [13]], b2.n, b2.ids) == [[], [], [14, 15]]


def test_forget_empties_the_history():
    p = PromptLookupProposer(fake_config(), env={}, fingerprint=lambda: "f" * 16)
    b = Batch()
    b.put(0, [1, 2, 3, 10, 11, 12, 13, 14, 15])
    p.propose([[15]], b.n, b.ids)
    p.forget()
    b.put(0, [4, 5, 10, 11])
    assert p.propose([[11]], b.n, b.ids) == [[]]  # nothing to match: 10 11 was only in the forgotten one
    assert p.history is not None and p.history.n_tokens == 0


def test_settings_errors_name_their_variable():
    with pytest.raises(UsageError, match=f"^{ENV_SOURCE}='nope': unknown draft source"):
        settings_from_env({ENV_SOURCE: "nope"})
    with pytest.raises(UsageError, match=f"^{ENV_HISTORY} is a setting of the suffix source"):
        settings_from_env({ENV_SOURCE: "ngram", ENV_HISTORY: "x.hist"})
    with pytest.raises(UsageError, match=f"^{ENV_SAVE_S}='soon'"):
        settings_from_env({ENV_SAVE_S: "soon"})
    spec, history, save_s = settings_from_env({})
    assert (spec.label, history, save_s) == ("suffix:factor=1", None, 0.0)
    assert spec.name == "suffix" and spec.value("factor") == 1.0


def test_importing_promptlookup_never_imports_vllm():
    code = "import sys, promptlookup, promptlookup.integrations.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- vLLM end to end
VLLM_ENV = Path(os.environ.get("PROMPTLOOKUP_VLLM_ENV", ROOT / ".venv-vllm"))
VLLM_PY = VLLM_ENV / "bin" / "python"
VLLM_MODEL = Path(os.environ.get("PROMPTLOOKUP_VLLM_MODEL", VLLM_ENV / "smollm2-hf"))


@pytest.mark.skipif(not (VLLM_PY.exists() and (VLLM_MODEL / "model.safetensors").exists()),
                    reason="no vLLM environment: bash scripts/vllm_env.sh")
def test_vllm_end_to_end(tmp_path):
    """vLLM offline, fp32 (bf16's verify changes near-tied argmaxes, see docs/vllm.md): our
    proposer's tokens equal plain decoding's on a copy and a prose prompt and on 8 concurrent
    requests, and a second request drafts from the first one's output."""
    out = tmp_path / "e2e.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), ENV_HISTORY: str(tmp_path / "h.hist")}
    proc = subprocess.run([str(VLLM_PY), str(ROOT / "tests" / "vllm_e2e.py"), str(VLLM_MODEL), str(out)],
                          env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["copy_identical"] and r["prose_identical"]
    assert r["batch_identical"] == 8
    assert r["copy_accepted"] > 100  # most of a copied answer is drafted and accepted
    assert r["session_identical"]
    assert r["session_second_accepted"] > r["session_second_alone_accepted"]  # the first request helped
    assert r["history_saved"]


@pytest.mark.skipif(not (VLLM_PY.exists() and (VLLM_MODEL / "model.safetensors").exists()),
                    reason="no vLLM environment: bash scripts/vllm_env.sh")
def test_vllm_serve_with_the_openai_client(tmp_path):
    """``vllm serve --speculative-config`` loads our class, answers the openai client, and drafts."""
    out = tmp_path / "serve.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    script = ROOT / "tests" / "vllm_serve_check.py"
    proc = subprocess.run([str(VLLM_PY), str(script), str(VLLM_MODEL), str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:] + (out.with_suffix(".log").read_text()[-4000:]
                                                       if out.with_suffix(".log").exists() else "")
    r = json.loads(out.read_text())
    assert r["finish_reason"] in ("stop", "length") and r["completion_tokens"] > 0
    assert r["spec"]["drafts"] > 0 and r["spec"]["accepted_tokens"] > 0


@pytest.mark.skipif(not (VLLM_MODEL / "tokenizer.json").exists(),
                    reason="no converted model: bash scripts/vllm_env.sh")
def test_history_fingerprint_is_the_clis_for_the_same_model(vocab_tokenizer):
    """A history file written by the CLI (llama.cpp's vocabulary) loads in vLLM, and back."""
    transformers = pytest.importorskip("transformers")
    from promptlookup.integrations.vllm import hf_fingerprint

    tok = transformers.AutoTokenizer.from_pretrained(VLLM_MODEL)
    assert hf_fingerprint(tok, vocab_tokenizer.n_vocab) == vocab_tokenizer.fingerprint() == "01f705e3bb6c4611"
