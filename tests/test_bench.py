"""The A/B harness: cell specs, renderings, and a short real run."""

from __future__ import annotations

import csv
import io

import pytest
from conftest import requires_model

from promptlookup.measure.bench import Cell, CellError, CellRun, chart, csv_text, parse_cell, summary, table
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


def test_summary_band_and_oracle_share(tmp_path):
    runs = [_run("off", 1, 100, 1.0), _run("ngram", 1, 100, 0.5), _run("ngram", 2, 100, 0.5),
            _run("off", 2, 100, 1.25)]
    text = summary(runs, {"w": 4.0})
    # off runs at 100 and 80 tok/s: median 90; ngram 200 tok/s -> 2.22x, 56% of a 4x oracle
    assert "| w | ngram | 200.00 | 2.22x | 56% | 80.00-100.00 |" in text
    assert "| w | oracle (hindsight, simulated on the plain output) | - | 4.00x | 100% |" in text
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
    runs, oracles = run_bench(real_backend, {"loop": [prompt]},
                              [parse_cell("off"), parse_cell("ngram"), parse_cell("auto")], 2, 12)
    assert [r.cell.name for r in runs] == ["off", "ngram", "auto", "auto", "ngram", "off"]
    assert runs[-1].identical  # plain decoding is deterministic
    assert oracles["loop"] >= 1.0


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
