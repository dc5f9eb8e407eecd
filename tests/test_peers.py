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
    assert set(PEERS) == {"peer-llamacpp", "peer-hf"}
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
