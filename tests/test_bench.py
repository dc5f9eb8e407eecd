"""The A/B harness: cell specs, renderings, and a short real run."""

from __future__ import annotations

import csv
import io

import pytest
from conftest import requires_model

from promptlookup.measure.bench import (
    CSV_KEYS,
    Cell,
    CellError,
    CellRun,
    CsvRows,
    bootstrap_ci,
    bootstrap_ci_reference,
    chart,
    csv_text,
    geomean,
    paired_ratios,
    parse_cell,
    pooled,
    summary,
    table,
)
from promptlookup.telemetry import Counters


def test_parse_cell():
    assert parse_cell("off") == Cell("off")
    c = parse_cell("ngram:draft=1:min=5")
    assert c.label == "ngram:draft=1:min=5" and c.int_option("draft", 3) == 1
    assert parse_cell("auto:curve=x.json").get("curve") == "x.json"
    with pytest.raises(CellError, match="unknown cell source 'mtp'"):
        parse_cell("mtp")
    with pytest.raises(CellError, match="unknown setting 'k=3'"):
        parse_cell("ngram:k=3")
    with pytest.raises(CellError, match="draft must be an integer"):
        parse_cell("ngram:draft=x").int_option("draft", 3)


def _run(cell: str, rnd: int, tokens: int, decode_s: float) -> CellRun:
    c = Counters(source=cell, generated_tokens=tokens, decodes=tokens - 1, decode_s=decode_s)
    return CellRun("w", parse_cell(cell), rnd, c, True, decode_s)


def test_pooled_row_over_items():
    def run(w: str, cell: str, rnd: int, decode_s: float) -> CellRun:
        counters = Counters(generated_tokens=100, decodes=99, decode_s=decode_s)
        return CellRun(w, parse_cell(cell), rnd, counters, True, decode_s)

    runs = [run("w1", "off", 1, 1.0), run("w1", "ngram", 1, 0.5), run("w1", "ngram", 2, 0.5),
            run("w1", "off", 2, 1.0), run("w2", "off", 1, 1.0), run("w2", "ngram", 1, 1.25)]
    assert pooled(runs[:4]) == ""  # one workload: its summary says it all
    # items: w1 2.0 (both rounds), w2 0.8; geomean sqrt(1.6) = 1.265; a bootstrap over two items lands
    # on 0.8, 1.265 or 2.0. Pooled rate: 300 tokens over 0.5 + 0.5 + 1.25 s = 133.33 tok/s.
    assert pooled(runs).splitlines()[2:] == [
        "| off | 2 | 1.000x | 1.000-1.000 (n=2) | 100.00 | 3/3 |",
        "| ngram | 2 | 1.265x | 0.800-2.000 (n=2) | 133.33 | 3/3 |",
    ]


def test_summary_band_and_oracle_share(tmp_path):
    runs = [_run("off", 1, 100, 1.0), _run("ngram", 1, 100, 0.5), _run("ngram", 2, 100, 0.5),
            _run("off", 2, 100, 1.25)]
    text = summary(runs, {"w": 4.0})
    # off runs at 100 and 80 tok/s: median 90; ngram 200 tok/s -> 2.22x of the median. Paired by
    # round: 200/100 and 200/80 = 2.0 and 2.5, geometric mean sqrt(5) = 2.236, 56% of a 4x oracle;
    # the bootstrap over two rounds can only land on 2.0, 2.236 or 2.5: the interval is 2.0-2.5.
    assert "| w | ngram | 200.00 | 2.22x | 2.236x | 2.000-2.500 (n=2) | 56% | 80.00-100.00 |" in text
    assert "| w | off | 90.00 | 1.00x | 1.000x | 1.000-1.000 (n=2) | 25% | 80.00-100.00 |" in text
    assert "| w | oracle (hindsight, simulated on the plain output) | - | 4.00x | - | - | 100% |" in text
    with_replays = summary(runs, {"w": 4.0}, {("w", "ngram"): 3.0})
    assert ("| w | ngram | 200.00 | 2.22x | 2.236x | 2.000-2.500 (n=2) | 56% | 80.00-100.00 | 3.000x (75%) |"
            in with_replays)
    assert "| w | off | 90.00 | 1.00x | 1.000x | 1.000-1.000 (n=2) | 25% | 80.00-100.00 | - |" in with_replays
    assert "| 100% | 80.00-100.00 | 4.000x (100%) |" in with_replays
    assert with_replays.splitlines()[1] == "|" + "---|" * 9
    assert table(runs).count("\n") == 5
    rows = list(csv.DictReader(io.StringIO(csv_text(runs))))
    assert [r["cell"] for r in rows] == ["off", "ngram", "ngram", "off"]
    png = tmp_path / "chart.png"
    chart(runs, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@requires_model
@pytest.mark.model
def test_short_real_bench(real_backend):
    from promptlookup.measure.bench import run_bench

    prompt = real_backend.tokenize("one two three four one two three four one two three")
    replays: dict = {}
    said: list[str] = []
    runs, oracles = run_bench(real_backend, {"loop": [prompt]},
                              [parse_cell("off"), parse_cell("ngram"), parse_cell("auto")], 2, 12,
                              replays=replays, progress=said.append)
    # the oracle's verify costs were timed after each of the two rounds, the median kept
    charged = [s for s in said if "oracle charged" in s]
    assert len(charged) == 1 and "the median of 2 timings (one after each round) (1:1.00x" in charged[0]
    assert [s for s in said if "timing the verify costs" in s] == [
        f"loop: timing the verify costs after round {r} (for the oracle)" for r in (1, 2)]
    assert [r.cell.name for r in runs] == ["off", "ngram", "auto", "auto", "ngram", "off"]
    assert runs[-1].identical  # plain decoding is deterministic
    assert oracles["loop"] >= 1.0
    # both sources replayed on the plain text; the loop repeats, so the n-gram source drafts and wins
    assert sorted(replays) == [("loop", "auto"), ("loop", "ngram")]
    assert replays[("loop", "ngram")] > 1.0
    assert all(x <= oracles["loop"] + 1e-9 for x in replays.values())  # nothing beats hindsight


@requires_model
@pytest.mark.model
def test_reused_prompt_prefills_once_and_changes_no_token(real_backend):
    from promptlookup.measure.bench import run_bench

    prompt = real_backend.tokenize("red green blue red green blue red green blue red green")
    cells = [parse_cell("off"), parse_cell("ngram")]
    fresh, _ = run_bench(real_backend, {"w": [prompt]}, cells, 2, 12)
    reused, _ = run_bench(real_backend, {"w": [prompt]}, cells, 2, 12, reuse_prompt=True)
    assert [r.counters.cached_tokens for r in fresh] == [0, 0, 0, 0]
    # the fresh bench's last run left this prompt in the cache: every reused run decodes only its
    # last token (whose logits choose the first new one)
    assert [r.counters.cached_tokens for r in reused] == [len(prompt) - 1] * 4
    assert all(r.identical for r in fresh + reused)
    from promptlookup.speculate import generate

    real_backend.rollback(0)
    whole = generate(real_backend, prompt, 12).tokens  # every prompt position decoded
    assert generate(real_backend, prompt, 12, keep=len(prompt) - 1).tokens == whole


def test_split_requests():
    from promptlookup.measure.bench import split_requests

    assert split_requests("one\n") == ["one"]
    assert split_requests("one\n=== next request ===\ntwo\nlines\n") == ["one", "two\nlines"]
    assert split_requests("\n=== next request ===\n") == []


@requires_model
@pytest.mark.model
def test_two_request_session_learns_across_requests(real_backend):
    from promptlookup.measure.bench import run_bench

    first = real_backend.tokenize("alpha beta gamma delta epsilon zeta eta theta")
    second = real_backend.tokenize("Say it again:")
    runs, oracles = run_bench(real_backend, {"s": [first, second]}, [parse_cell("off"), parse_cell("suffix")],
                              1, 10)
    assert [r.cell.name for r in runs] == ["off", "suffix"]
    assert runs[0].counters.prompt_tokens == len(second)  # the last request's counters
    assert oracles["s"] >= 1.0


def test_paired_ratios_pair_each_round_with_its_own_off():
    runs = [_run("off", 1, 100, 1.0), _run("auto", 1, 100, 0.8), _run("auto", 2, 100, 1.0),
            _run("off", 2, 100, 0.5), _run("auto", 3, 100, 1.0)]  # round 3's off never ran
    # round 1: 125 / 100; round 2: 100 / 200 (a slow auto run in a fast round stays a loss)
    assert paired_ratios(runs, "w", "auto") == pytest.approx([1.25, 0.5])
    assert paired_ratios(runs, "w", "off") == pytest.approx([1.0, 1.0])
    assert paired_ratios(runs, "other", "auto") == []
    assert geomean([1.25, 0.8]) == pytest.approx(1.0)


def test_bootstrap_ci_exact_on_fixed_numbers():
    x = [1.02, 0.97, 1.10, 0.99, 1.05]
    # the seeded interval is part of the bench's output: these are its digits for this input
    lo, hi = bootstrap_ci(x)
    assert (round(lo, 6), round(hi, 6)) == (0.987831, 1.067089)
    assert lo < geomean(x) < hi
    assert bootstrap_ci(x) == bootstrap_ci(x)  # seeded: the same table every time
    assert bootstrap_ci([1.3]) == (pytest.approx(1.3), pytest.approx(1.3))
    assert bootstrap_ci([0.9, 0.9, 0.9]) == (pytest.approx(0.9), pytest.approx(0.9))
    lo90, hi90 = bootstrap_ci(x, level=0.90)
    assert lo <= lo90 <= hi90 <= hi
    with pytest.raises(ValueError, match="positive, finite"):
        bootstrap_ci([1.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_ci([])


@pytest.mark.parametrize("x, seed, resamples", [
    ([1.02, 0.97, 1.10, 0.99, 1.05], 20261201, 4000),
    ([0.5, 2.0], 1, 50),
    ([1.1, 1.2, 0.95, 1.3, 1.0, 0.9, 1.05], 7, 999),
])
def test_bootstrap_ci_equals_its_plain_twin(x, seed, resamples):
    assert bootstrap_ci(x, resamples=resamples, seed=seed) == pytest.approx(
        bootstrap_ci_reference(x, resamples=resamples, seed=seed), rel=1e-12, abs=0)


def test_csv_rows_are_written_as_runs_finish(tmp_path):
    path = tmp_path / "runs.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        rows = CsvRows(fh)
        assert path.read_text().splitlines() == [",".join(CSV_KEYS)]  # the header before any run
        rows(_run("off", 1, 100, 1.0))
        # flushed: another process (or the file after a kill) sees the row while the bench runs
        got = list(csv.DictReader(io.StringIO(path.read_text())))
        assert [(r["cell"], r["round"], r["effective_tps"]) for r in got] == [("off", "1", "100.0")]
        auto = _run("auto", 1, 100, 0.5)
        auto.extra.update(calibration=0.9, auto_steps=3, plain_probes=1, asked=40)
        rows(auto)
        got = list(csv.DictReader(io.StringIO(path.read_text())))
        assert got[1]["plain_probes"] == "1" and got[0]["plain_probes"] == ""
        stray = _run("off", 2, 100, 1.0)
        stray.extra["undeclared"] = 1
        with pytest.raises(ValueError, match="not CSV columns"):
            rows(stray)
    assert csv_text([_run("off", 1, 100, 1.0)]).splitlines()[0] == ",".join(CSV_KEYS)


@requires_model
@pytest.mark.model
def test_interrupted_bench_keeps_its_rows(capsys, monkeypatch, tmp_path):
    """A bench interrupted after two runs: both rows are in the CSV, and the summary of what was
    measured is printed before the interrupt's exit status."""
    from promptlookup.cli import main
    from promptlookup.measure import bench

    def two_runs_then_ctrl_c(*a, on_run=None, **k):
        on_run(_run("off", 1, 100, 1.0))
        on_run(_run("ngram", 1, 100, 0.5))
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", two_runs_then_ctrl_c)
    out_csv = tmp_path / "runs.csv"
    code = main(["bench", "--cells", "off,ngram", "-w", "benchmarks/workloads/prose.txt",
                 "--csv", str(out_csv)])
    out = capsys.readouterr().out
    assert code == 130
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(r["cell"], r["effective_tps"]) for r in rows] == [("off", "100.0"), ("ngram", "200.0")]
    assert "| w | ngram | 200.00 | 2.00x | 2.000x | 2.000-2.000 (n=1) | - | 100.00-100.00 |" in out


def test_the_oracle_curve_is_timed_after_the_last_prompt_and_half_its_answer():
    from promptlookup.measure.bench import steps_context

    assert steps_context([[1, 2], [3]], [[9], [4, 5, 6, 7, 8]]) == [3, 4, 5]
    assert steps_context([[1]], [[]]) == [1]
