"""The replay and oracle that benchmarks/auto_replay.py tabulates (bench.replayed_speedup,
bench.oracle_on): they agree with the simulation they wrap, and a session's earlier requests are
committed before the last is replayed; the script's own helpers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from promptlookup.costcurve import CostCurve
from promptlookup.drafting.spec import Run, SourceSpec, build_source
from promptlookup.measure.bench import oracle_on, replayed_speedup
from promptlookup.measure.simulate import simulate

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "auto_replay.py"
_spec = importlib.util.spec_from_file_location("auto_replay", _SCRIPT)
auto_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auto_replay)

CURVE = CostCurve((0.010, 0.012, 0.014, 0.016, 0.018, 0.020, 0.022, 0.024, 0.026))
RUN = Run(300, lambda: "t", cost_curve=lambda: CURVE)
WORDS = [(i * 7919) % 251 for i in range(120)]  # 120 distinct-looking tokens


def test_replay_of_one_request_is_the_simulation():
    prompt, text = [1, 2, 3, *WORDS[:60]], WORDS[:60]  # the answer copies the prompt
    got = replayed_speedup(SourceSpec.parse("ngram:draft=4"), RUN, CURVE, [prompt], [text])
    want = simulate(prompt, text, build_source(SourceSpec.parse("ngram"), RUN), 4, CURVE).speedup
    assert got == pytest.approx(want) and got > 1.5
    assert replayed_speedup(SourceSpec.parse("off"), RUN, CURVE, [prompt], [text]) == pytest.approx(1.0)


def test_a_session_replays_its_last_request_after_the_earlier_ones():
    # The second answer repeats the first; only a source that keeps earlier requests drafts it.
    first, second = [290, 291], [292, 293]
    answer = WORDS[:80]
    suffix = SourceSpec.parse("suffix:draft=8")
    with_history = replayed_speedup(suffix, RUN, CURVE, [first, second], [answer, answer])
    alone = replayed_speedup(suffix, RUN, CURVE, [second], [answer])
    assert with_history > 2.0 and alone < 1.2
    orc = oracle_on(RUN, CURVE, [first, second], [answer, answer])
    assert orc.speedup >= with_history  # the ceiling of auto's sources, suffix among them


def test_geomean_and_labels():
    assert auto_replay.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert auto_replay.label("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"  # not cut at ".5b"
    assert auto_replay.label(str(_SCRIPT)) == "auto_replay"
