"""The replay and oracle that benchmarks/auto_replay.py tabulates (bench.replayed_speedup,
bench.oracle_on): they agree with the simulation they wrap, and a session's earlier requests are
committed before the last is replayed; the script's own helpers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from promptlookup.costcurve import CostCurve
from promptlookup.drafting.spec import Run, SourceSpec, build_source
from promptlookup.measure import bench
from promptlookup.measure.bench import oracle_on, perturbed_speedup, replayed_speedup
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


def test_perturbed_replay_tells_auto_other_times_and_charges_the_curve(monkeypatch):
    prompt, text = [1, 2, 3, *WORDS[:60], 7, 8, *WORDS[60:100]], [*WORDS[:60], 9, *WORDS[60:100]]
    auto = SourceSpec.parse("auto")
    plain = replayed_speedup(auto, RUN, CURVE, [prompt], [text])
    args = (RUN, CURVE, [prompt], [text])
    assert perturbed_speedup(auto, *args, 3) == perturbed_speedup(auto, *args, 3)
    # a fixed source does not listen to time: any perturbation replays it as it is
    ngram = SourceSpec.parse("ngram:draft=4")
    assert perturbed_speedup(ngram, *args, 5) == pytest.approx(
        replayed_speedup(ngram, RUN, CURVE, [prompt], [text]))
    # told exactly what it is charged, auto replays as the plain replay does
    monkeypatch.setattr(bench, "PERTURB_SCALE", (1.0, 1.0))
    monkeypatch.setattr(bench, "PERTURB_NOISE", 0.0)
    assert perturbed_speedup(auto, *args, 1) == pytest.approx(plain)
    # told that the machine runs 3x slower than its load-time curve (the curve no longer holds), auto
    # probes plain decoding early, and every later step moves (here to a slightly cheaper path)
    monkeypatch.setattr(bench, "PERTURB_SCALE", (3.0, 3.0))
    assert perturbed_speedup(auto, *args, 1) == pytest.approx(2.9585798816568043)
    assert plain == pytest.approx(2.9411764705882355)


def test_benchs_replay_of_auto_is_the_mean_of_its_perturbed_replays():
    prompt, text = [1, 2, 3, *WORDS[:60], 7, 8, *WORDS[60:100]], [*WORDS[:60], 9, *WORDS[60:100]]
    cells = [bench.parse_cell("off"), bench.parse_cell("auto"), bench.parse_cell("ngram")]
    got = bench.replayed_speedups(RUN, CURVE, [prompt], [text], cells)
    auto = SourceSpec.parse("auto")
    want = [perturbed_speedup(auto, RUN, CURVE, [prompt], [text], seed)
            for seed in range(bench.REPLAY_PERTURB)]
    assert sorted(got) == ["auto", "ngram"]
    assert got["auto"] == pytest.approx(sum(want) / len(want))
    ngram = replayed_speedup(SourceSpec.parse("ngram"), RUN, CURVE, [prompt], [text])
    assert got["ngram"] == pytest.approx(ngram)
    orc = oracle_on(RUN, CURVE, [prompt], [text]).speedup
    assert all(x <= orc + 1e-9 for x in want)  # told another clock, still charged by the curve


def test_perturbed_replay_is_the_replay_told_the_perturbed_clock():
    prompt, text = [1, 2, 3, *WORDS[:60], 7, 8, *WORDS[60:100]], [*WORDS[:60], 9, *WORDS[60:100]]
    auto = SourceSpec.parse("auto")
    told = bench.perturbed_clock(RUN, CURVE, 4)
    assert perturbed_speedup(auto, RUN, CURVE, [prompt], [text], 4) == replayed_speedup(
        auto, RUN, CURVE, [prompt], [text], told)


def test_foreknown_rates_price_a_copy_from_its_first_step():
    # The answer copies a passage of the prompt with two edits: learned, auto ramps up from the bucket
    # priors; with the rates of the whole answer known it sends long drafts at once.
    prompt = [1, 2, 3, *WORDS[:100], 4, 5]
    text = [*WORDS[:40], 240, *WORDS[41:80], 241, *WORDS[81:100]]
    args = (RUN, CURVE, [prompt], [text])
    learned = replayed_speedup(SourceSpec.parse("auto"), *args)
    foreknown = auto_replay.foreknown_speedup(*args)
    orc = oracle_on(*args).speedup
    assert learned < foreknown <= orc + 1e-9
    assert (learned, foreknown, orc) == pytest.approx((2.861271676300578, 2.9819277108433724,
                                                       3.193548387096774))
    # told a perturbed clock, still charged by the curve; deterministic for a seed
    told = [auto_replay.foreknown_speedup(*args, bench.perturbed_clock(RUN, CURVE, 2)) for _ in range(2)]
    assert told[0] == told[1] <= orc + 1e-9


def test_geomean_and_labels():
    assert auto_replay.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert auto_replay.label("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"  # not cut at ".5b"
    assert auto_replay.label(str(_SCRIPT)) == "auto_replay"


def test_an_after_prompt_curve_is_the_median_of_its_timings():
    from promptlookup.costcurve import CostCurve

    timings = iter([CostCurve((0.10, 0.11, 0.25), "t1"),  # a noisy, cheap 2-token verify
                    CostCurve((0.20, 0.24, 0.30), "t2"),  # the whole machine slower
                    CostCurve((0.11, 0.132, 0.165), "t3")])
    curve = auto_replay.median_after(lambda: next(timings))
    # plain: the median decode (0.11); each width: the median relative cost (1.2 and 1.5) times it
    assert curve.seconds == pytest.approx((0.11, 0.132, 0.165))
    assert curve.label == "t1"
    assert auto_replay.AFTER_TIMINGS == 3
    with pytest.raises(ValueError, match="at least one timing"):
        auto_replay.median_after(lambda: next(timings), 0)


def test_which_cached_items_are_timed_again():
    assert auto_replay.needs_timing({"outputs": [[1]]}, retime=False)  # no curve yet: always
    once = {"curve_after": [0.1, 0.2]}  # a cache from before the median: one timing
    assert not auto_replay.needs_timing(once, retime=False)
    assert auto_replay.needs_timing(once, retime=True)
    assert not auto_replay.needs_timing({**once, "curve_after_timings": 3}, retime=True)


_REGRET = Path(__file__).resolve().parents[1] / "benchmarks" / "auto_regret.py"
_rspec = importlib.util.spec_from_file_location("auto_regret", _REGRET)
auto_regret = importlib.util.module_from_spec(_rspec)
sys.modules["auto_regret"] = auto_regret  # its dataclasses look their module up there
_rspec.loader.exec_module(auto_regret)


def test_regrets_add_up_to_auto_less_the_oracle_and_walk_the_whole_answer():
    prompt, text = [1, 2, 3, *WORDS[:60]], [*WORDS[:30], 250, 249, *WORDS[30:60]]
    item = auto_regret.regret_of("copy", RUN, CURVE, [prompt], [text])
    assert item.oracle_cost == pytest.approx(oracle_on(RUN, CURVE, [prompt], [text]).cost)
    assert sum(s.regret for s in item.steps) == pytest.approx(item.cost - item.oracle_cost)
    assert item.cost > item.oracle_cost and 0.5 < item.share < 1.0
    steps = item.steps
    assert steps[0].at == 0 and all(steps[j + 1].at == s.at + s.held + 1 for j, s in enumerate(steps[:-1]))
    assert sum(item.by_kind().values()) == pytest.approx(item.cost - item.oracle_cost)


def test_regret_kinds():
    assert auto_regret.kind_of(0, 0, 3) == "plain where the oracle drafted"
    assert auto_regret.kind_of(0, 0, 0) == "other"
    assert auto_regret.kind_of(4, 2, 8) == "draft that failed"
    assert auto_regret.kind_of(4, 4, 8) == "too short"
    assert auto_regret.kind_of(4, 4, 2) == "other"


def test_regret_script_reads_a_cache_and_refuses_a_file_that_is_not_one(tmp_path, monkeypatch, capsys):
    prompt, text = [1, 2, 3, *WORDS[:60]], WORDS[:60]
    cache = tmp_path / "m-0.json"
    cache.write_text(json.dumps({"curve": list(CURVE.seconds), "n_vocab": 300, "items": {
        "copy": {"requests": [prompt], "outputs": [text], "curve_after": list(CURVE.seconds)}}}))
    monkeypatch.setattr(sys, "argv", ["auto_regret", "--cache", str(cache), "--curve", "after", "--steps"])
    assert auto_regret.main() == 0
    out = capsys.readouterr().out
    assert "| m-0 | copy |" in out and "1 answers, after curves: mean share" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setattr(sys, "argv", ["auto_regret", "--cache", str(bad)])
    with pytest.raises(SystemExit, match="not a replay cache"):
        auto_regret.main()
