"""The grammar-drafts benchmark's table (``benchmarks/grammar_drafts.py``): one row per model and set,
in the order they ran, so two models measured in one run read side by side."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "workloads"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import grammar_drafts  # noqa: E402
from grammar_drafts import Run  # noqa: E402


def run(model: str, item: str, kind: str, cell: str, tokens: int, seconds: float, grammar: int = 0,
        same: bool | None = True) -> Run:
    return Run(model, item, kind, cell, tokens, decodes=tokens, grammar_tokens=grammar, accepted_tokens=0,
               drafted_tokens=0, decode_s=seconds, draft_s=0.0, effective_tps=tokens / seconds,
               finish_reason="stop", identical=None if cell == "off" else same)


def test_table_has_a_row_per_model_and_set_in_run_order():
    runs = [
        run("b.gguf", "x", "tool", "grammar", 20, 1.0, grammar=5),
        run("b.gguf", "x", "tool", "nogrammar", 20, 2.0),
        run("b.gguf", "x", "tool", "off", 20, 4.0),
        run("a.gguf", "x", "schema", "grammar", 10, 1.0, same=False),
        run("a.gguf", "x", "schema", "nogrammar", 10, 1.0),
        run("a.gguf", "x", "schema", "off", 10, 2.0),
    ]
    lines = grammar_drafts.table(runs).splitlines()
    assert lines[0].startswith("| model | set | items | grammar vs nogrammar")
    assert lines[1] == "|" + "---|" * 9
    assert lines[2:] == [
        "| b.gguf | tool | 1 | 2.000x (2.000-2.000, n=1) | 4.000x (4.000-4.000, n=1) | "
        "2.000x (2.000-2.000, n=1) | 20.00 / 10.00 / 5.00 | 5/20 (25.0%) | 2/2 |",
        "| a.gguf | schema | 1 | 1.000x (1.000-1.000, n=1) | 2.000x (2.000-2.000, n=1) | "
        "2.000x (2.000-2.000, n=1) | 10.00 / 10.00 / 5.00 | 0/10 (0.0%) | 1/2 |",
    ]


def test_the_median_run_is_one_that_happened():
    tries = [run("m", "x", "tool", "grammar", 10, s) for s in (1.0, 4.0, 2.0)]  # 10, 2.5, 5 tok/s
    assert grammar_drafts.median_run(tries) is tries[2]
    assert grammar_drafts.median_run(tries[:2]) is tries[1]  # of two, the slower
    assert grammar_drafts.median_run(tries[:1]) is tries[0]
    with pytest.raises(ValueError, match="no runs"):
        grammar_drafts.median_run([])


def test_repeats_below_one_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        grammar_drafts.main(["--repeats", "0"])
    assert exit_.value.code == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
