"""Peers: llama-cpp-python's own prompt lookup on our ids, and the bench cells that run peers.

Small and fast: 16-token generations on the quantized model. The transformers peer is tested beside
the transformers backend (tests/test_transformers_backend.py), which already has that model loaded.
"""

from __future__ import annotations

import pytest
from conftest import requires_model

from promptlookup.measure.bench import PEERS, CellError, CellRun, parse_cell, table
from promptlookup.measure.peers import PeerRun, _FirstTokenTimer

COPY = "alpha beta gamma delta epsilon zeta eta theta " * 4


def test_peer_cells_parse_and_refuse_foreign_settings():
    assert parse_cell("peer-llamacpp:pred=2").int_option("pred", 3) == 2
    assert parse_cell("peer-hf:pld=10").int_option("pld", 3) == 10
    assert set(PEERS) == {"peer-llamacpp", "peer-hf", "peer-ls"}
    with pytest.raises(CellError, match="unknown setting 'pld=3'"):
        parse_cell("peer-llamacpp:pld=3")
    with pytest.raises(CellError, match="unknown setting 'draft=3'"):
        parse_cell("peer-hf:draft=3")


def test_peer_run_counters_follow_our_timing_convention():
    run = PeerRun("x", [1, 2, 3, 4], prefill_s=0.5, wall_s=2.5, decodes=3)
    assert run.decode_s == 2.0 and run.tps == 2.0
    c = run.counters(prompt_tokens=7)
    assert (c.prompt_tokens, c.generated_tokens, c.decodes) == (7, 4, 3)
    assert c.reported_tps == 2.0 and c.drafted_tokens == 0


def test_first_token_timer_skips_the_prompt():
    t = _FirstTokenTimer()
    t.put("prompt")
    assert t.first is None
    t.put("token")
    first = t.first
    t.put("more")
    assert first is not None and t.first == first


def test_unknown_comparison_renders_as_dash():
    from promptlookup.telemetry import Counters

    run = CellRun("w", parse_cell("peer-hf:pld=3"), 1, Counters(generated_tokens=4, decodes=2,
                                                               decode_s=1.0), None, 1.0)
    row = table([run]).splitlines()[-1]
    assert row.endswith("| - |") and "| - | 2 |" in row  # neither coverage nor identity is claimed


@requires_model
@pytest.mark.model
def test_llamacpp_peer_plain_equals_our_plain_and_lookup_runs(real_backend):
    from promptlookup.measure import peers
    from promptlookup.speculate import generate

    prompt = real_backend.tokenize(COPY)
    ours = generate(real_backend, prompt, 16).tokens
    engines: dict = {}
    plain, c0, wall0 = peers.run_cell("llamacpp", 0, real_backend, prompt, 16, engines)
    assert plain == ours  # the same engine, one token per decode: the same greedy output
    assert c0.generated_tokens == 16 and c0.decodes == 15 and wall0 > 0
    looked, c2, _ = peers.run_cell("llamacpp", 2, real_backend, prompt, 16, engines)
    assert len(looked) == 16 and c2.decodes < 15  # it drafted on this repetitive text
    assert list(engines) == ["llamacpp"]  # loaded once, reused
    again, _, _ = peers.run_cell("llamacpp", 0, real_backend, prompt, 16, engines)
    assert again == plain  # no KV prefix carried over from the previous run


@requires_model
@pytest.mark.model
def test_bench_runs_peer_cells_in_the_same_table(real_backend):
    from promptlookup.measure.bench import run_bench

    prompt = real_backend.tokenize(COPY)
    cells = [parse_cell("off"), parse_cell("peer-llamacpp:pred=0"), parse_cell("peer-llamacpp:pred=2")]
    runs, _ = run_bench(real_backend, {"copy": [prompt]}, cells, 1, 12)
    assert [r.cell.label for r in runs] == ["off", "peer-llamacpp:pred=0", "peer-llamacpp:pred=2"]
    assert runs[1].identical is True  # compared with our plain run: same engine
    assert isinstance(runs[2].identical, bool)
    assert "peer-llamacpp:pred=2" in table(runs)


# -- llama-server ------------------------------------------------------------------------------------
def _llama_server_program():
    """A llama-server built by benchmarks/llama_tools.py (fast kernels first, as users build it)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from importlib.metadata import version

        import llama_tools

        package = f"llama_cpp_python-{version('llama_cpp_python')}"
        unpacked = llama_tools.ROOT / package / "vendor" / "llama.cpp"
        if not unpacked.is_dir():  # never downloaded: nothing built (and bin_dir would download it)
            return None
        for kernels in ("fast", "invariant"):
            path = llama_tools.bin_dir("host", kernels) / "llama-server"
            if path.is_file():
                return path
    except ImportError:  # llama-cpp-python not installed (PackageNotFoundError is an ImportError)
        return None
    finally:
        sys.path.pop(0)
    return None


def test_peer_ls_cell_parses_and_bounds_its_setting():
    assert parse_cell("peer-ls:spec=1").int_option("spec", 0) == 1
    assert PEERS["peer-ls"] == ("llama-server", "spec", "llama-server")
    with pytest.raises(CellError, match="spec must be 0..1, got 2"):
        parse_cell("peer-ls:spec=2")
    with pytest.raises(CellError, match="unknown setting 'pred=1'"):
        parse_cell("peer-ls:pred=1")


def test_llama_server_answer_in_our_units():
    from promptlookup.measure.llama_server_peer import completion_body, parse_answer

    body = (b'{"content": "x", "tokens": [5, 6, 7, 8], "timings": {"prompt_n": 10, "prompt_ms": 250.0, '
            b'"predicted_n": 4, "predicted_ms": 500, "draft_n": 4, "draft_n_accepted": 2}}')
    a = parse_answer(body, "srv")
    assert (a.tokens, a.prompt_tokens, a.prefill_s, a.decode_s, a.drafted, a.accepted) == (
        [5, 6, 7, 8], 10, 0.25, 0.5, 4, 2)
    assert a.decodes == 1  # the first token came with the prompt; 2 of the other 3 were accepted drafts
    plain = parse_answer(b'{"tokens": [1, 2], "timings": {"prompt_n": 3, "prompt_ms": 1, "predicted_ms": 2}}',
                         "srv")
    assert (plain.drafted, plain.accepted, plain.decodes) == (0, 0, 1)
    assert completion_body([3, 4], 9) == {"prompt": [3, 4], "n_predict": 9, "temperature": 0.0, "top_k": 1,
                                          "cache_prompt": True, "return_tokens": True, "stream": False}


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>", "not JSON"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'{"content": "hi", "timings": {}}', "without a list of token ids"),
    (b'{"tokens": [1, true], "timings": {}}', "without a list of token ids"),
    (b'{"tokens": [1]}', "without timings"),
    (b'{"tokens": [1], "timings": {"prompt_n": 1, "prompt_ms": -1, "predicted_ms": 1}}',
     r"timings.prompt_ms = -1, not a number >= 0"),
    (b'{"tokens": [1], "timings": {"prompt_ms": 1, "predicted_ms": 1}}', r"timings.prompt_n = None"),
])
def test_llama_server_answers_that_are_not_completions_are_named(body, message):
    from promptlookup.errors import InputError
    from promptlookup.measure.llama_server_peer import parse_answer

    with pytest.raises(InputError, match=message):
        parse_answer(body, "llama-server")


def test_llama_server_peer_refuses_a_missing_program(tmp_path):
    from promptlookup.errors import InputError
    from promptlookup.measure.llama_server_peer import LlamaServerPeer

    with pytest.raises(InputError, match=r"no llama-server program at .*nope; build llama.cpp's .*ensure_"):
        LlamaServerPeer(tmp_path / "nope", tmp_path / "m.gguf", 512, 1, speculate=False)


def _program(tmp_path, script):
    path = tmp_path / "fake-server"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def test_llama_server_peer_that_exits_reports_status_and_log(tmp_path):
    from promptlookup.errors import InputError
    from promptlookup.measure.llama_server_peer import LlamaServerPeer

    prog = _program(tmp_path, 'echo "error: invalid argument: $7 $8" >&2; exit 3')
    peer = LlamaServerPeer(prog, tmp_path / "m.gguf", 512, 2, speculate=True)
    assert peer.argv(8080)[-3:] == ["--port", "8080", "--spec-default"]
    with pytest.raises(InputError, match=r"did not start on .*m\.gguf \(it exited with status 3\); its log "
                                         r"ends: error: invalid argument: -tb 2"):
        peer.run([[1, 2, 3]], 4)


def test_llama_server_peer_that_never_listens_times_out_and_is_stopped(tmp_path):
    import time

    from promptlookup.errors import InputError
    from promptlookup.measure.llama_server_peer import LlamaServerPeer

    pidfile = tmp_path / "pid"
    prog = _program(tmp_path, f"echo loading; echo $$ > {pidfile}.new; mv {pidfile}.new {pidfile}; "
                              "exec sleep 60")
    ticks = iter(range(0, 1000, 10))  # an injected clock: 10 s per look

    def nap(_: float) -> None:  # no timed wait: only until the program has written its log and pid
        for _ in range(500):
            if pidfile.exists():
                return
            time.sleep(0.01)

    peer = LlamaServerPeer(prog, tmp_path / "m.gguf", 512, 1, speculate=False, start_timeout_s=30,
                           sleep=nap, clock=lambda: next(ticks))
    with pytest.raises(InputError, match=r"was not ready within 30 s; its log ends: loading"):
        peer.run([[1]], 4)
    import os

    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # stopped and reaped: no server left behind
        os.kill(pid, 0)


def test_bench_cli_asks_for_the_llama_server_program(capsys):
    from promptlookup.cli import main

    code = main(["bench", "--cells", "off,peer-ls:spec=1", "-w", "benchmarks/workloads/prose.txt"])
    assert code == 2
    assert "peer-ls cells start llama.cpp's server: give --llama-server PATH" in capsys.readouterr().err
    code = main(["bench", "--cells", "off,peer-ls:spec=1", "-w", "benchmarks/workloads/prose.txt",
                 "--llama-server", "README.md"])  # a file, not a program: refused before the model loads
    assert code == 2
    assert "no llama-server program at README.md; build llama.cpp's" in capsys.readouterr().err


LLAMA_SERVER = _llama_server_program()


@requires_model
@pytest.mark.model
@pytest.mark.skipif(LLAMA_SERVER is None, reason="no llama-server built (benchmarks/llama_tools.py)")
def test_bench_runs_llama_server_rows_beside_ours(real_backend):
    from promptlookup.measure.bench import run_bench

    prompt = real_backend.tokenize(COPY)
    cells = [parse_cell("off"), parse_cell("peer-ls:spec=0"), parse_cell("peer-ls:spec=1")]
    runs, _ = run_bench(real_backend, {"copy": [prompt, prompt]}, cells, 1, 12, llama_server=LLAMA_SERVER)
    assert [r.cell.label for r in runs] == ["off", "peer-ls:spec=0", "peer-ls:spec=1"]
    plain, spec = runs[1], runs[2]
    assert plain.identical is True  # its own plain run is its reference
    assert isinstance(spec.identical, bool)
    for r in (plain, spec):
        c = r.counters
        assert c.generated_tokens == 12 and c.prompt_tokens == len(prompt) and c.decode_s > 0
    assert plain.counters.drafted_tokens == 0 and plain.counters.decodes == 11
