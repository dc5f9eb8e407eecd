"""The command line: bad input gets one line naming the problem and exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import requires_model

from promptlookup.cli import main


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_parser(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("draft", ["0", "9", "x"])
def test_draft_out_of_range(capsys, draft):
    code, _, err = run_parser(capsys, "generate", "-p", "hi", "--draft", draft)
    assert code == 2
    assert err.count("\n") == 1 and "--draft" in err


def test_conflicting_prompt_flags(capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hello")
    code, _, err = run_parser(capsys, "generate", "-p", "hi", "-f", str(f))
    assert code == 2 and "not allowed with" in err and err.count("\n") == 1


def test_unknown_flag(capsys):
    code, _, err = run_parser(capsys, "generate", "-p", "hi", "--ngramm")
    assert code == 2 and "--ngramm" in err and err.count("\n") == 1


def test_missing_model_file(capsys, tmp_path):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "-m", str(tmp_path / "nope.gguf"))
    assert code == 2 and "model file not found" in err and err.count("\n") == 1


def test_non_gguf_model_file(capsys, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 definitely a zip")
    code, _, err = run_main(capsys, "generate", "-p", "hi", "-m", str(bad))
    assert code == 2 and "not a GGUF file" in err and err.count("\n") == 1


def test_truncated_gguf_is_a_clear_error(capsys, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    code, _, err = run_main(capsys, "generate", "-p", "hi", "-m", str(bad))
    assert code == 2 and "could not load" in err and err.count("\n") == 1


def test_empty_prompt(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "  \n")
    assert code == 2 and "prompt is empty" in err


def test_missing_prompt_file(capsys, tmp_path):
    code, _, err = run_main(capsys, "generate", "-f", str(tmp_path / "none.txt"))
    assert code == 2 and "prompt file not found" in err


def test_system_without_chat(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--system", "be brief")
    assert code == 2 and "--system only applies with --chat" in err


def test_max_match_below_min_match(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--ngram", "--ngram-min-match", "5",
                            "--ngram-max-match", "4")
    assert code == 2 and "--ngram-max-match (4) is below --ngram-min-match (5)" in err


@requires_model
@pytest.mark.model
def test_prompt_longer_than_context(capsys):
    code, _, err = run_main(capsys, "generate", "-c", "32", "-p", "word " * 600)
    assert code == 2 and "context holds 256" in err and err.count("\n") == 1  # llama.cpp pads to 256


@requires_model
@pytest.mark.model
def test_generate_json_and_csv(capsys, tmp_path):
    csv = tmp_path / "runs.csv"
    code, out, _ = run_main(capsys, "generate", "--ngram", "-n", "24", "--json", "--csv", str(csv),
                            "-p", "a b c d a b c d a b c d a b c d a b")
    assert code == 0
    obj = json.loads(out)
    c = obj["counters"]
    assert len(obj["tokens"]) == c["generated_tokens"] <= 24
    assert isinstance(obj["text"], str)
    for key in ("drafted_steps", "decodes", "acceptance", "effective_tps", "major_faults",
                "peak_rss_bytes", "tokens_per_decode"):
        assert key in c
    row = csv.read_text().strip()
    assert row.count("\n") == 0
    fields = dict(kv.split("=", 1) for kv in row.split(","))
    assert fields["drafted_steps"] == str(c["drafted_steps"])
    assert fields["decodes"] == str(c["decodes"])


@requires_model
@pytest.mark.model
def test_report_lines_and_python_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "promptlookup", "generate", "--ngram", "-n", "16", "-p",
         "one two three one two three one two three"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ngram:")]
    assert len(lines) == 4
    assert "drafts accepted" in lines[0] and "tokens per verify decode" in lines[0]
    assert "tok/s effective" in lines[1]
    assert "the rest decoded plainly" in lines[2]
    assert "major faults per token" in lines[3] and "peak RSS" in lines[3]


@requires_model
@pytest.mark.model
def test_stats_cost_curve_simulation(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n\n" * 60)
    curve = tmp_path / "c.json"
    curve.write_text('{"seconds": [0.01, 0.018, 0.021, 0.025, 0.031, 0.035, 0.039, 0.04, 0.046]}')
    code, out, _ = run_main(capsys, "stats", "-f", str(text), "--source", "ngram", "-c", "128",
                            "--cost-curve", str(curve))
    assert code == 0
    rows = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| ")}
    assert {"ngram draft 3", "auto", "oracle"} <= set(rows)
    speed = {k: float(v.rstrip(" |").rsplit("|", 1)[1].strip().rstrip("x")) for k, v in rows.items()
             if k != "policy" and not k.startswith("---")}
    assert speed["oracle"] >= max(speed.values()) - 1e-9


def test_cost_curve_needs_auto(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--ngram", "--cost-curve", "x.json")
    assert code == 2 and "--cost-curve only applies with --speculate auto" in err
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--speculate", "off", "--cost-curve", "x.json")
    assert code == 2 and "--cost-curve only applies with --speculate auto" in err


def test_generate_defaults_to_auto_and_off_is_a_flag():
    from promptlookup.cli import GENERATE_SOURCES, _spec, build_parser

    def spec(*argv):
        return _spec(build_parser().parse_args(["generate", "-p", "hi", *argv]), GENERATE_SOURCES)

    assert spec().name == "auto"
    assert spec("--speculate", "auto").name == "auto"
    assert spec("--speculate", "off").name == "off"
    assert spec("--ngram").name == "ngram" and spec("--suffix").name == "suffix"
    assert spec("--align").label == "align:draft=3" and spec("--speculate", "align:draft=8").draft == 8
    assert spec("--speculate", "auto", "--lookup-cache-static", "s.plc").get("static") == "s.plc"


@requires_model
@pytest.mark.model
def test_streamed_text_equals_the_json_text(capsys):
    args = ["generate", "--ngram", "-n", "30", "--chat", "-p", "Write three words in French: été, café, déjà"]
    assert main(args + ["--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    assert main(args) == 0
    assert capsys.readouterr().out == text + "\n"


@requires_model
@pytest.mark.model
def test_curve_measures_caches_and_writes(capsys, tmp_path, monkeypatch):
    from promptlookup.costcurve import CostCurve

    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    out_file = tmp_path / "curve.json"
    code, out, _ = run_main(capsys, "curve", "--max-tokens", "3", "-o", str(out_file))
    assert code == 0 and out.startswith("1:1.00x 2:")
    curve = CostCurve.load(out_file)
    assert len(curve.seconds) == 3 and all(s > 0 for s in curve.seconds)
    assert len(list((tmp_path / "cache" / "cost-curves").glob("*.json"))) == 1


@pytest.mark.parametrize("flag, value", [("--temp", "-0.5"), ("--top-p", "0"), ("--top-p", "1.5"),
                                         ("--top-k", "-1"), ("--min-p", "2"), ("--repeat-penalty", "0"),
                                         ("--repeat-last-n", "-3"), ("--temp", "nan")])
def test_bad_sampling_flags_are_one_line_errors(capsys, flag, value):
    code, _, err = run_main(capsys, "generate", "-p", "hi", flag, value)
    assert code == 2 and flag in err and err.count("\n") == 1


@pytest.mark.parametrize("flag, value", [("--temp", "hot"), ("--top-k", "2.5"), ("--seed", "-1")])
def test_unparsable_sampling_flags(capsys, flag, value):
    code, _, err = run_parser(capsys, "generate", "-p", "hi", flag, value)
    assert code == 2 and flag in err and err.count("\n") == 1


def test_logprobs_need_json(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--logprobs", "2")
    assert code == 2 and "--logprobs needs --json" in err


@requires_model
@pytest.mark.model
def test_sampled_generate_repeats_with_its_seed(capsys):
    args = ["generate", "--ngram", "-n", "24", "--json", "--temp", "0.8", "-p",
            "a b c d a b c d a b c d a b c d a b"]
    runs = []
    for _ in range(2):
        code, out, _ = run_main(capsys, *args, "--seed", "7", "--logprobs", "2")
        assert code == 0
        runs.append(json.loads(out))
    assert runs[0]["tokens"] == runs[1]["tokens"] and runs[0]["sampling"]["seed"] == 7
    lps = runs[0]["logprobs"]
    assert [lp["id"] for lp in lps] == runs[0]["tokens"]
    assert all(lp["logprob"] <= 0 and len(lp["top_logprobs"]) == 2 for lp in lps)
    code, out, _ = run_main(capsys, *args)  # no --seed: one is chosen and reported
    assert code == 0 and isinstance(json.loads(out)["sampling"]["seed"], int)


@requires_model
@pytest.mark.model
def test_sampled_report_names_the_seed(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "promptlookup", "generate", "--ngram", "-n", "8", "--temp", "0.8",
         "-p", "one two three one two three"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("sampling:")]
    assert len(line) == 1 and "temp 0.8" in line[0] and "--seed" in line[0]


# -- one vocabulary: --speculate SPEC, shorthands, flags generated from the sources' OPTIONS ----------
def _generate_spec(*argv: str) -> str:
    from promptlookup.cli import GENERATE_SOURCES, _spec, build_parser

    return _spec(build_parser().parse_args(["generate", "-p", "x", *argv]), GENERATE_SOURCES).label


def test_speculate_spec_and_flags_make_one_spec():
    assert _generate_spec() == "auto"
    assert _generate_spec("--ngram") == "ngram:draft=3:min=3:max=16"
    spec = _generate_spec("--speculate", "ngram:draft=4", "--ngram-min-match", "5")
    assert spec == "ngram:draft=4:min=5:max=16"
    assert _generate_spec("--speculate", "off") == "off"
    assert _generate_spec("--suffix", "--suffix-corpus", "c.plsa") == "suffix:draft=3:corpus=c.plsa"


def test_a_setting_given_twice_differently_is_refused(capsys):
    code, _, err = run_main(capsys, "generate", "-p", "x", "--speculate", "ngram:draft=4", "--draft", "5")
    assert code == 2 and err == "promptlookup: error: --draft 5 disagrees with --speculate ngram:draft=4\n"
    code, _, err = run_main(capsys, "generate", "-p", "x", "--speculate", "nope")
    assert code == 2 and "unknown draft source 'nope'" in err
    code, _, err = run_main(capsys, "generate", "-p", "x", "--ngram", "--suffix-corpus", "c.plsa")
    assert code == 2 and err == ("promptlookup: error: --suffix-corpus only applies with --suffix or "
                                 "--speculate auto\n")


def test_source_flags_take_bounds_and_help_from_the_options(capsys):
    from promptlookup.cli import build_parser
    from promptlookup.drafting.ngram.source import OPTIONS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--ngram-min-match", "0"])
    assert "--ngram-min-match must be 1..1024, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lookup-budget", "0"])
    assert "--lookup-budget must be 1..1073741824, got 0" in capsys.readouterr().err
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them here
    helps = {a.option_strings[0]: a.help for a in sub["generate"]._actions if a.option_strings}
    assert helps["--ngram-min-match"] == OPTIONS["min"].describe() == (
        "shortest matching run allowed to draft; 1..1024; default 3")
    serve = {s: a.dest for a in sub["serve"]._actions for s in a.option_strings}
    assert serve["--history"] == serve["--suffix-history"] == "suffix_history"  # the old name, an alias
    assert "--draft" not in serve  # one source's settings go in the server's --speculate SPEC
    stats = build_parser().parse_args(["stats", "-f", "t", "--source", "ngram"])  # the old name
    assert stats.speculate == "ngram"


def test_json_schema_file_problems_are_one_line(capsys, tmp_path):
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--json-schema", str(tmp_path / "none.json"))
    assert code == 2 and "--json-schema" in err and "No such file" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "wat"}')
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--json-schema", str(bad))
    assert code == 2 and "cannot be enforced" in err and "Traceback" not in err
    code, _, err = run_parser(capsys, "generate", "-p", "hi", "--json-schema", str(bad), "--json-object")
    assert code == 2 and "not allowed with" in err


@pytest.mark.model
@requires_model
def test_json_schema_constrains_the_output(capsys, tmp_path):
    schema = {"type": "object", "properties": {"name": {"enum": ["read_file", "edit_file"]},
                                               "path": {"type": "string", "maxLength": 40}},
              "required": ["name", "path"], "additionalProperties": False}
    path = tmp_path / "tool.json"
    path.write_text(json.dumps(schema))
    texts, grammar = [], []
    for speculate in (["--speculate", "off"], ["--ngram"], ["--ngram", "--no-grammar-drafts"]):
        code, out, _ = run_main(capsys, "generate", "--chat", "-p", "Read the file README.md with a tool.",
                                "--json-schema", str(path), "-n", "80", "-t", "1", "--json", *speculate)
        assert code == 0
        texts.append(json.loads(out)["text"])
        grammar.append(json.loads(out)["counters"]["grammar_tokens"])
    assert texts[0] == texts[1] == texts[2]
    assert grammar[0] == grammar[2] == 0 < grammar[1]  # the property names are drafted from the grammar
    obj = json.loads(texts[0])
    assert set(obj) == {"name", "path"} and obj["name"] in ("read_file", "edit_file")


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "maxLength": 40}}, "required": ["path"],
    "additionalProperties": False}}}]


def test_tool_flags_problems_are_one_line(capsys, tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    code, _, err = run_main(capsys, "generate", "-p", "hi", "--tools", str(path))
    assert code == 2 and "need --chat" in err and err.count("\n") == 1
    code, _, err = run_main(capsys, "generate", "--chat", "-p", "hi", "--tools", str(tmp_path / "none.json"))
    assert code == 2 and "--tools" in err and "No such file" in err
    code, _, err = run_main(capsys, "generate", "--chat", "-p", "hi", "--tools", str(path),
                            "--tool-choice", "write_file")
    assert code == 2 and "no tool is named 'write_file'" in err and "Traceback" not in err


@pytest.mark.model
@requires_model
def test_tools_on_the_command_line(capsys, tmp_path):
    from tool_gguf import hermes_gguf

    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": TOOLS}))
    prompt = ["generate", "--chat", "-p", "Open README.md.", "--tools", str(path), "-n", "60", "-t", "1"]
    code, _, err = run_main(capsys, *prompt, "--tool-choice", "required")  # SmolLM2's own template
    assert code == 2 and "no tool support" in err
    calls = []
    for speculate in (["--speculate", "off"], ["--ngram"]):
        code, out, _ = run_main(capsys, *prompt, "-m", str(hermes_gguf()), "--tool-choice", "read_file",
                                "--json", *speculate)
        assert code == 0
        obj = json.loads(out)
        assert (obj["finish_reason"], obj["text"]) == ("tool_calls", "")
        calls.append([(c["function"]["name"], c["function"]["arguments"]) for c in obj["tool_calls"]])
    assert calls == [[("read_file", '{"path": "data.json.json"}')]] * 2  # greedy, 1 thread
    code, out, _ = run_main(capsys, *prompt, "-m", str(hermes_gguf()), "--tool-choice", "required")
    lines = out.splitlines()
    assert code == 0 and lines[0] == ""
    call = json.loads(lines[1])
    assert (call["type"], call["function"]) == ("function", {"name": "read_file",
                                                             "arguments": '{"path": "data.json.json"}'})


@requires_model
def test_serve_decodes_16_requests_together_by_default_fewer_where_their_caches_take_too_much(monkeypatch):
    from promptlookup.backends import models
    from promptlookup.backends.context_size import KV_MEMORY_SHARE, MAX_SLOTS, default_context

    def parallel(backend, model, n_ctx):
        choice = default_context(backend, model, n_ctx=n_ctx, slots=True)
        return choice.parallel, choice.line

    assert (MAX_SLOTS, KV_MEMORY_SHARE) == (16, 0.25)
    _, per_token = models.kv_cache_estimate(models.bundled_model_path())
    assert per_token == 30 * 2 * 3 * 64 * 2  # layers x (K, V) x KV heads x head size x f16
    one_slot = 4096 * per_token  # 90 MiB
    monkeypatch.setattr(models, "available_memory", lambda: 4 * 16 * one_slot)
    assert parallel("llama.cpp", None, 4096) == (16, None)  # exactly a quarter: all 16
    assert parallel("transformers", None, 4096) == (1, None)  # one sequence at a time
    with pytest.raises(models.ModelError, match="nonexistent.gguf"):
        parallel("llama.cpp", "/nonexistent.gguf", 4096)  # named as loading it would
    monkeypatch.setattr(models, "available_memory", lambda: 4 * 16 * one_slot - 1)
    assert parallel("llama.cpp", None, 4096) == (
        15, "--parallel defaults to 15, not 16: the KV caches of 16 x 4096 positions would take 1.4 GiB, "
            "more than 25% of the 5.6 GiB of memory available")
    assert parallel("llama.cpp", None, 1024)[0] == 16  # shorter caches: all fit again
    monkeypatch.setattr(models, "available_memory", lambda: 7 * one_slot)
    assert parallel("llama.cpp", None, 4096)[0] == 1
    monkeypatch.setattr(models, "available_memory", lambda: 1)
    assert parallel("llama.cpp", None, 4096)[0] == 1  # the engine refuses it when it loads
    monkeypatch.setattr(models, "available_memory", lambda: None)  # not Linux: no figure to size by
    assert parallel("llama.cpp", None, 4096) == (16, None)


@requires_model
@pytest.mark.model
def test_generate_and_bench_say_how_the_context_was_sized(capsys, monkeypatch, tmp_path):
    from promptlookup.backends import models

    monkeypatch.setattr(models, "available_memory", lambda: 24 << 30)
    line = "context: 8192 tokens (the model's training context; KV cache 180 MiB of the 24.0 GiB available)"
    code, out, err = run_main(capsys, "generate", "--speculate", "off", "-n", "2", "-t", "1", "-p", "hi")
    assert code == 0 and err.splitlines().count(line) == 1
    code, out, err = run_main(capsys, "generate", "--speculate", "off", "-n", "2", "-t", "1", "-p", "hi",
                              "-c", "1024")
    assert code == 0 and "context:" not in err  # given: nothing to say
    code, out, _ = run_main(capsys, "generate", "--speculate", "off", "-n", "2", "-t", "1", "-p", "hi",
                            "--json")
    assert code == 0 and json.loads(out)["n_ctx"] == 8192
    work = tmp_path / "w.txt"
    work.write_text("one two three")
    code, _, err = run_main(capsys, "bench", "-w", str(work), "--cells", "off", "--repeat", "1", "-n", "2",
                            "-t", "1")
    assert code == 0 and err.splitlines().count(line) == 1


@requires_model
@pytest.mark.model
def test_serve_sizes_context_and_slots_together_and_says_so(capsys, monkeypatch):
    from promptlookup.backends import models
    from promptlookup.serve import server

    loaded = []

    def fake_run_server(engine, settings, host, port):
        loaded.append((engine.n_ctx, engine.parallel))
        return 0

    monkeypatch.setattr(server, "run_server", fake_run_server)
    # a quarter of 1 GiB holds one slot of 8192 (180 MiB), four of 2816: so 2 slots of 4096
    monkeypatch.setattr(models, "available_memory", lambda: 1 << 30)
    code, _, err = run_main(capsys, "serve", "-t", "1", "--speculate", "off")
    assert code == 0 and loaded == [(4096, 2)]
    assert err == ("promptlookup serve: context: 4096 tokens x 2 slots, not 8192 x 16 (the model's training "
                   "context), to keep the KV caches at 180 MiB, within a quarter of the 1.0 GiB of memory "
                   "available\n")
    code, _, err = run_main(capsys, "serve", "-t", "1", "--speculate", "off", "--parallel", "1")
    assert code == 0 and loaded[1] == (8192, 1)
    assert err == ("promptlookup serve: context: 8192 tokens x 1 slot (the model's training context; KV "
                   "caches 180 MiB of the 1.0 GiB available)\n")
def test_version_and_a_missing_server_extra_are_one_line(capsys, monkeypatch):
    import promptlookup
    from promptlookup.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"promptlookup {promptlookup.__version__}\n"
    monkeypatch.delitem(sys.modules, "promptlookup.serve.app", raising=False)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the [server] extra were not installed
    code, _, err = run_main(capsys, "serve")
    assert code == 2 and err == ("promptlookup: error: promptlookup serve needs the server extra (fastapi is "
                                 "missing): pip install 'promptlookup[server]'\n")
