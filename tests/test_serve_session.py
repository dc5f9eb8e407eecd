"""The server-session benchmark's pure parts (benchmarks/serve_session.py): no servers, no model.

Why: the benchmark runs only by hand (minutes, six servers), so its arithmetic and its tables are
checked here, where a wrong TTFT or a swapped column would otherwise go unnoticed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_session.py"
_spec = importlib.util.spec_from_file_location("serve_session", _SCRIPT)
ss = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("serve_session", ss)
_spec.loader.exec_module(ss)

SOURCE = '''"""A toy module."""


def scale(x, k=2):
    return x * k


def _private(y):
    return y


def shift(v):
    return v + 1
'''


def test_functions_are_public_in_source_order_with_first_parameter() -> None:
    assert ss.functions(SOURCE) == [("scale", "x"), ("shift", "v")]
    # a capped file that ends mid-statement still yields the functions before the cut
    assert ss.functions(SOURCE + "def broken(a,\n") == [("scale", "x"), ("shift", "v")]


def test_session_turns_are_deterministic() -> None:
    users = ss.user_turns("toy.py", SOURCE, 6)
    assert users == ss.user_turns("toy.py", SOURCE, 6)
    assert users[0] == ("Here is the file `toy.py`:\n\n```python\n" + SOURCE.rstrip() + "\n```\n\n"
                        "Rename the function `scale` to `convert_scale` and show the whole file.")
    assert users[1:] == [
        "Now add a one-line docstring to the function `shift` and show the whole file.",
        "Now add type hints to the parameters and the return value of `scale` and show the whole file.",
        "Now add a comment line above the function `shift` saying what it computes, and show the whole file.",
        "Now rename the parameter `x` of `scale` to `x_in` and show the whole file.",
        "Now make `shift` raise ValueError when any argument is negative, and show the whole file.",
    ]


def test_messages_resend_the_whole_conversation() -> None:
    users = ["u1", "u2", "u3"]
    assert ss.messages(users, [], system="S") == [{"role": "system", "content": "S"},
                                                  {"role": "user", "content": "u1"}]
    assert ss.messages(users, ["a1", "a2"], system="S") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}]


def test_cap_lines_and_default_source(tmp_path: Path) -> None:
    assert ss.cap_lines("a\nb\nc\n", 2) == "a\nb\n"
    (tmp_path / "b.py").write_text("x = 1\n" * 200)
    (tmp_path / "a.py").write_text("x = 1\n" * 10)
    assert ss.default_source(tmp_path) == tmp_path / "b.py"
    (tmp_path / "colorsys.py").write_text("x = 1\n")
    assert ss.default_source(tmp_path) == tmp_path / "colorsys.py"


def _data(obj: dict) -> str:
    return "data: " + json.dumps(obj)


# A llama-server-style stream: a role-only chunk, two content chunks, the final chunk with
# finish_reason and timings, the usage chunk, [DONE].
LLAMA_SERVER_STREAM = [
    (0.10, _data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})),
    (0.50, _data({"choices": [{"index": 0, "delta": {"content": "def "}}]})),
    (0.70, ": keep-alive comment"),
    (1.50, _data({"choices": [{"index": 0, "delta": {"content": "f(): pass"}}]})),
    (1.60, _data({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                  "timings": {"prompt_n": 20, "prompt_ms": 300.0, "cache_n": 180, "predicted_n": 11,
                              "predicted_ms": 1100.0, "predicted_per_second": 10.0, "draft_n": 8,
                              "draft_n_accepted": 6}})),
    (1.70, _data({"choices": [], "usage": {"prompt_tokens": 200, "completion_tokens": 11,
                                           "total_tokens": 211}})),
    (2.00, "data: [DONE]"),
]


def test_parse_stream_llama_server_style() -> None:
    m = ss.parse_stream(LLAMA_SERVER_STREAM)
    assert (m.ttft, m.wall, m.text, m.finish_reason) == (0.50, 2.00, "def f(): pass", "length")
    assert (m.tokens, m.tokens_from, m.prompt_n, m.cache_n) == (11, "usage", 200, 180)
    assert (m.draft_n, m.draft_accepted, m.acceptance) == (8, 6, 0.75)
    assert m.tps == pytest.approx(5.5)
    assert m.decode_tps == pytest.approx(10 / 1.5)
    assert not m.error


def test_parse_stream_without_usage_or_timings() -> None:
    # llama-cpp-python's server: no usage in the stream, no timings: tokens stay unknown
    events = [(0.3, _data({"choices": [{"delta": {"role": "assistant"}}]})),
              (0.4, _data({"choices": [{"delta": {"content": "x"}}]})),
              (0.9, _data({"choices": [{"delta": {}, "finish_reason": "stop"}]})),
              (1.0, "data: [DONE]")]
    m = ss.parse_stream(events)
    assert (m.ttft, m.wall, m.text, m.tokens, m.acceptance, m.tps) == (0.4, 1.0, "x", None, None, None)
    # timings alone give the tokens, and prompt_n there counts only the prefilled part
    timed = [*events[:3], (0.95, _data({"choices": [], "timings": {"prompt_n": 5, "cache_n": 7,
                                                                    "predicted_n": 3}})), events[3]]
    m = ss.parse_stream(timed)
    assert (m.tokens, m.tokens_from, m.prompt_n, m.cache_n, m.acceptance) == (3, "timings", 12, 7, None)


def test_parse_stream_error_event() -> None:
    m = ss.parse_stream([(0.2, _data({"error": {"message": "context full", "code": 400}}))])
    assert m.error == "context full"


def test_compare() -> None:
    assert ss.compare("abc", "abc") == "yes"
    assert ss.compare("abd", "abc") == "no @2"
    assert ss.compare("ab", "abc") == "no @2"


def _results() -> tuple[list, list]:
    # A speculates (key "ours"), B is its plain row ("ours-off"), C never started
    a1 = ss.TurnResult("A", 1, ss.parse_stream(LLAMA_SERVER_STREAM), "ref", "ours")
    a2 = ss.TurnResult("A", 2, ss.TurnMetrics(ttft=0.25, wall=1.0, text="y", tokens=4, tokens_from="usage",
                                              draft_n=0, draft_accepted=0), "ref", "ours")
    b1 = ss.TurnResult("B", 1, ss.TurnMetrics(ttft=1.0, wall=4.0, text="def f(): pas", tokens=11,
                                              tokens_from="retokenized"), "no @11", "ours-off")
    b2 = ss.TurnResult("B", 2, ss.TurnMetrics(error="HTTP 500: boom"), "", "ours-off")
    totals = [ss.RowTotal("A", [a1, a2]), ss.RowTotal("B", [b1], error="turn 2: HTTP 500: boom"),
              ss.RowTotal("C", [], error="exited with 1 while starting")]
    results = [a1, a2, b1, b2]
    ss.annotate_plain(results)
    return results, totals


def test_annotate_plain_compares_with_the_engines_plain_row() -> None:
    results, _ = _results()
    assert [r.same_plain for r in results] == ["no @12", "", "plain", ""]


def test_turn_table_exact() -> None:
    results, _ = _results()
    assert ss.turn_table(results) == (
        "| turn | row | prompt | cached | TTFT s | wall s | tokens | tok/s | decode tok/s | accepted "
        "| = row 1 | = plain |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| 1 | A | 200 | 180 | 0.50 | 2.00 | 11 | 5.5 | 6.7 | 75% (6/8) | ref | no @12 |\n"
        "| 1 | B | n/a | n/a | 1.00 | 4.00 | 11 | 2.8 | 3.3 | n/a | no @11 | plain |\n"
        "| 2 | A | n/a | n/a | 0.25 | 1.00 | 4 | 4.0 | 4.0 | 0 drafted | ref |  |\n"
        "| 2 | B | error: HTTP 500: boom |  |  |  |  |  |  |  |  |  |\n")


def test_total_table_exact() -> None:
    _, totals = _results()
    assert ss.total_table(totals) == (
        "| row | turns | TTFT s (sum) | wall s | tokens | tok/s | accepted | = row 1 | = plain "
        "| rel. wall |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| A | 2 | 0.75 | 3.00 | 15 | 5.0 | 75% (6/8) | 2/2 | 0/1 | 1.00 |\n"
        "| B | 1 (error: turn 2: HTTP 500: boom) | 1.00 | 4.00 | 11 | 2.8 | n/a | 0/1 | plain | 1.33 |\n"
        "| C | 0 | error: exited with 1 while starting |  |  |  |  |  |  |  |\n")


def test_csv_rows_carry_raw_numbers() -> None:
    results, totals = _results()
    row = ss.csv_row(results[0])
    assert set(row) <= set(ss.CSV_FIELDS)
    assert (row["ttft_s"], row["wall_s"], row["acceptance"], row["chars"]) == (0.5, 2.0, 0.75, 13)
    assert (row["same"], row["same_plain"]) == ("ref", "no @12")
    tot = ss.csv_total(totals[0])
    assert set(tot) <= set(ss.CSV_FIELDS)
    assert (tot["turn"], tot["tokens"], tot["draft_n"], tot["draft_accepted"], tot["same"]) == (
        "total", 15, 8, 6, 2)


def test_rows_and_spec_arguments() -> None:
    assert ss.parse_rows("1,ls-spec,3") == ["ours", "ls-spec", "lcp"]
    with pytest.raises(Exception, match="unknown row"):
        ss.parse_rows("vllm")
    assert ss.spec_args("ngram-mod") == ("--spec-default",)
    assert ss.spec_args("--spec-type ngram-simple --spec-ngram-simple-size-n 4") == (
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4")
    with pytest.raises(SystemExit):
        ss.spec_args("bogus")


def test_total_draft_counts_only_turns_that_report() -> None:
    # llama-server leaves draft_n out of a turn that drafted nothing
    t = ss.RowTotal("X", [ss.TurnResult("X", 1, ss.TurnMetrics(wall=1.0)),
                          ss.TurnResult("X", 2, ss.TurnMetrics(wall=1.0, draft_n=4, draft_accepted=2))])
    assert t.draft == (2, 4)
    assert ss.RowTotal("Y", [ss.TurnResult("Y", 1, ss.TurnMetrics(wall=1.0))]).draft is None


def test_load_answers(tmp_path: Path) -> None:
    f = tmp_path / "outputs.json"
    f.write_text(json.dumps({"A": ["a1", "a2", "a3"], "B": ["b1"]}))
    assert ss.load_answers(f, None, 3) == ("A", ["a1", "a2", "a3"])
    assert ss.load_answers(f, "B", 2) == ("B", ["b1"])
    with pytest.raises(SystemExit, match="no 2 answers for row 'B'"):
        ss.load_answers(f, "B", 3)
    with pytest.raises(SystemExit, match="no 1 answers for row 'C'"):
        ss.load_answers(f, "C", 2)
