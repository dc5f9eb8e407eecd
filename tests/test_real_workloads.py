"""The real workloads' builders (benchmarks/workloads/real) on tiny fixtures made here, and the agent
harness (benchmarks/serve_real.py) on one real BFCL task where the workloads' site is installed.

The fixtures are the smallest data of each source's shape (an sdist pair, an ACLSum split, a BFCL
data folder), so every expected item is written out in full; bad data must give a WorkloadError
naming the file and the problem. The harness test replays a task's ground truth through a fake
OpenAI client: BFCL's own checker must then accept the session, and reject an empty one.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "workloads"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from real import agents, fast_apply, sources, summaries  # noqa: E402
from real.common import WorkloadError, read_jsonl, round_robin, seeded_pick, write_workload  # noqa: E402

OLD = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(3))
NEW = OLD.replace("return 1\n", "return 100\n")


def make_tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def make_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


# -- fast_apply ------------------------------------------------------------------------------------
def sdist_pair(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    old = make_tar(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/pkg/a.py": OLD, "pkg-1.0/pkg/same.py": OLD,
                                                 "pkg-1.0/README": "x", "pkg-1.0/pkg/tiny.py": "a = 1\n"})
    new = make_zip(tmp_path / "pkg-1.1.zip", {"pkg-1.1/pkg/a.py": NEW, "pkg-1.1/pkg/same.py": OLD,
                                              "pkg-1.1/pkg/tiny.py": "a = 2\n", "pkg-1.1/pkg/added.py": NEW})
    return {"pkg": (old, new)}


def test_fast_apply_item_from_an_sdist_pair(tmp_path):
    items, settings = fast_apply.build(sdist_pair(tmp_path), {"pkg": ("1.0", "1.1")}, n=5, seed=0,
                                       bounds=fast_apply.Bounds(min_old_chars=20))
    diff = ("--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -3,7 +3,7 @@\n \n \n def f1():\n"
            "-    return 1\n+    return 100\n \n \n def f2():\n")
    prompt = ("Apply the edit below to the file `pkg/a.py` and reply with the whole updated file in one "
              "```python code block, nothing else.\n\nCurrent file:\n```python\n" + OLD.rstrip("\n")
              + "\n```\n\nEdit (unified diff):\n```diff\n" + diff + "```\n")
    assert items == [{
        "id": "pkg-1.0-1.1:pkg/a.py", "workload": "fast_apply", "prompt": prompt,
        "expected": "```python\n" + NEW.rstrip("\n") + "\n```",
        "meta": {"package": "pkg", "old_version": "1.0", "new_version": "1.1", "path": "pkg/a.py",
                 "old_chars": len(OLD), "new_chars": len(NEW), "diff_chars": len(diff),
                 "prompt_chars": len(prompt)},
    }]
    assert settings["candidates"] == {"pkg": 1}  # same.py unchanged, tiny.py under min_old_chars


def test_fast_apply_bad_sdists_name_the_problem(tmp_path):
    whl = tmp_path / "pkg-1.0-py3-none-any.whl"
    whl.write_bytes(b"PK")
    with pytest.raises(WorkloadError, match=r"pkg-1.0-py3-none-any.whl: not an sdist \(.tar.gz or .zip\)"):
        fast_apply.sdist_sources(whl)
    two = make_tar(tmp_path / "two.tar.gz", {"a-1/x.py": "1", "b-1/y.py": "2"})
    with pytest.raises(WorkloadError, match=r"two.tar.gz: an sdist keeps its files under one top folder; "
                                            r"found \['a-1', 'b-1'\]"):
        fast_apply.sdist_sources(two)
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(WorkloadError, match="broken.tar.gz: unreadable sdist"):
        fast_apply.sdist_sources(broken)
    with pytest.raises(WorkloadError, match="fast_apply: no changed .py file within the bounds"):
        fast_apply.build(sdist_pair(tmp_path), {"pkg": ("1.0", "1.1")}, n=5, seed=0)  # a.py < 1000 chars


# -- summaries -------------------------------------------------------------------------------------
def aclsum_doc(doc_id: str, words: str = "We study X.") -> dict:
    return {"id": doc_id, "title": f"Paper {doc_id}",
            "summary": {"challenge": "X is hard.", "approach": "They use Y.", "outcome": "Y works. "},
            "sentences": {"abstract": [words, "It works."], "introduction": ["X matters."],
                          "conclusion": ["Done."]},
            "highlights": {}}


def test_summaries_items_from_an_aclsum_split(tmp_path):
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(aclsum_doc(i)) + "\n" for i in ("B2", "A1")))
    items, settings = summaries.build(tmp_path, n=1, seed=3)
    body = "Abstract:\nWe study X. It works.\n\nIntroduction:\nX matters.\n\nConclusion:\nDone."
    assert seeded_pick(["A1", "B2"], 1, 3) == ["B2"]  # candidates in id order, then the seeded shuffle
    prompt = f"{summaries.INSTRUCTION}\n\nTitle: Paper B2\n\n{body}\n"
    assert items == [{"id": "B2", "workload": "summaries", "prompt": prompt,
                      "expected": "X is hard. They use Y. Y works.",
                      "meta": {"split": "test", "paper_chars": 76, "prompt_chars": 223,
                               "reference_chars": 31}}]
    assert len(body) == 76 and len(prompt) == 223
    assert settings["candidates"] == 2


def test_summaries_bad_data_names_line_and_field(tmp_path):
    with pytest.raises(WorkloadError, match="test.jsonl: no such file"):
        summaries.build(tmp_path, n=1, seed=0)
    doc = aclsum_doc("A1")
    del doc["summary"]["outcome"]
    (tmp_path / "test.jsonl").write_text(json.dumps(aclsum_doc("A0")) + "\n" + json.dumps(doc) + "\n")
    with pytest.raises(WorkloadError, match=r"test.jsonl:2 summary: no field 'outcome'"):
        summaries.build(tmp_path, n=1, seed=0)
    (tmp_path / "test.jsonl").write_text("{not json\n")
    with pytest.raises(WorkloadError, match=r"test.jsonl:1: not JSON"):
        summaries.build(tmp_path, n=1, seed=0)
    (tmp_path / "test.jsonl").write_text(json.dumps(aclsum_doc("A0", words="w " * 50)) + "\n")
    with pytest.raises(WorkloadError, match="no paper within the bounds"):
        summaries.build(tmp_path, n=1, seed=0, bounds=summaries.Bounds(max_paper_chars=50))


# -- agents ----------------------------------------------------------------------------------------
def bfcl_tree(tmp_path: Path, entry_extra: dict | None = None, truth: list | None = None,
              param_type: str = "dict") -> Path:
    data = tmp_path / "bfcl_eval" / "data"
    (data / "possible_answer").mkdir(parents=True)
    (data / "multi_turn_func_doc").mkdir()
    docs = [{"name": "add", "description": "Add.", "parameters": {"type": "dict", "properties": {
                "a": {"type": "float", "description": "A."},
                "opts": {"type": param_type,
                         "properties": {"xs": {"type": "array", "items": {"type": "tuple"}}}}},
                "required": ["a"]}, "response": {"type": "dict", "properties": {}}},
            {"name": "neg", "description": "Negate.", "parameters": {"type": "dict", "properties": {}}}]
    (data / "multi_turn_func_doc" / "math_api.json").write_text("".join(json.dumps(d) + "\n" for d in docs))
    for cat in agents.CATEGORIES:
        entry = {"id": f"{cat}_0", "question": [[{"role": "user", "content": "add 1"}], []],
                 "initial_config": {}, "involved_classes": ["MathAPI"], **(entry_extra or {})}
        if cat == "multi_turn_miss_func":
            entry.setdefault("missed_function", {"1": ["neg"]})
        (data / f"BFCL_v4_{cat}.json").write_text(json.dumps(entry) + "\n")
        answer = {"id": f"{cat}_0", "ground_truth": truth if truth is not None else [["add(a=1.0)"], []]}
        (data / "possible_answer" / f"BFCL_v4_{cat}.json").write_text(json.dumps(answer) + "\n")
    return tmp_path / "bfcl_eval"


ADD = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number", "description": "A."},
                                     "opts": {"type": "object", "properties": {
                                         "xs": {"type": "array", "items": {"type": "array"}}}}},
    "required": ["a"]}}}
NEG = {"type": "function", "function": {"name": "neg", "description": "Negate.",
                                        "parameters": {"type": "object", "properties": {}}}}


def test_agents_tasks_with_json_schema_tools_and_held_out_functions(tmp_path):
    items, settings = agents.build(bfcl_tree(tmp_path), per_category=1, seed=0)
    base, miss = items
    turns = [[{"role": "user", "content": "add 1"}], []]
    assert base == {"id": "multi_turn_base_0", "workload": "agents", "category": "multi_turn_base",
                    "turns": turns, "initial_config": {}, "involved_classes": ["MathAPI"],
                    "tools": [ADD, NEG],
                    "held_out": {}, "ground_truth": [["add(a=1.0)"], []],
                    "meta": {"turns": 2, "tools": 2, "tools_chars": len(json.dumps([ADD, NEG])) + 2,
                             "truth_calls": 1}}
    assert miss["tools"] == [ADD] and miss["held_out"] == {"1": [NEG]}
    assert miss["meta"]["tools"] == 2
    assert settings["candidates"] == {"multi_turn_base": 1, "multi_turn_miss_func": 1}


def test_agents_bad_data_names_the_problem(tmp_path):
    with pytest.raises(WorkloadError, match="no such folder"):
        agents.build(tmp_path, per_category=1, seed=0)
    with pytest.raises(WorkloadError, match=r"math_api.json:1 add.opts: unknown type 'hashmap'"):
        agents.build(bfcl_tree(tmp_path / "a", param_type="hashmap"), per_category=1, seed=0)
    with pytest.raises(WorkloadError, match="1 ground-truth turns for 2 question turns"):
        agents.build(bfcl_tree(tmp_path / "b", truth=[["add(a=1.0)"]]), per_category=1, seed=0)
    with pytest.raises(WorkloadError, match="missed function 'mul' is not among the task's tools"):
        agents.build(bfcl_tree(tmp_path / "c", {"missed_function": {"1": ["mul"]}}), per_category=1, seed=0)
    with pytest.raises(WorkloadError, match=r"unknown class 'Nope'"):
        agents.build(bfcl_tree(tmp_path / "d", {"involved_classes": ["Nope"]}), per_category=1, seed=0)


# -- shared ----------------------------------------------------------------------------------------
def test_seeded_choices_are_fixed_for_a_seed():
    assert seeded_pick(range(10), 3, 0) == seeded_pick(list(range(10)), 3, 0)
    assert seeded_pick(range(10), 3, "0:a") == seeded_pick(range(10), 3, "0:a")
    assert seeded_pick(range(3), 10, 1) == sorted(seeded_pick(range(3), 10, 1), key=seeded_pick(
        range(3), 10, 1).index)
    picked = round_robin({"b": [1, 2, 3], "a": [10]}, 3, seed=0)
    assert picked[0] == 10 and sorted(picked[1:]) < [4] and len(picked) == 3  # every group first


def test_site_folder_is_named_by_the_pins(tmp_path):
    assert sources.site_dir(tmp_path).name == "site-0526506e6e81"  # the pins of this tree
    assert sources.site_dir(tmp_path, ("x==1",)) != sources.site_dir(tmp_path)
    site = sources.site_dir(tmp_path)
    assert not sources.site_ready(site)
    site.mkdir()
    (site / "PINS.txt").write_text("\n".join(sources.SITE_PINS) + "\n")
    assert sources.site_ready(site)
    with pytest.raises(WorkloadError, match=r"no sdist of pkg==1.0 \(.tar.gz or .zip\)"):
        sources.sdist_path(tmp_path, "pkg", "1.0")


def test_write_workload_writes_items_manifest_and_prompts(tmp_path):
    items = [{"id": "a:b/c.py", "prompt": "P1"}, {"id": "x", "prompt": "P2"}]
    folder = write_workload(tmp_path, "w", items, {"seed": 0}, [{"id": "a:b/c.py"}, {"id": "x"}])
    (folder / "prompts" / "99-stale.txt").write_text("old")
    write_workload(tmp_path, "w", items, {"seed": 0}, [{"id": "a:b/c.py"}, {"id": "x"}])
    assert read_jsonl(folder / "items.jsonl") == items
    assert sorted(p.name for p in (folder / "prompts").iterdir()) == ["00-a_b_c.py.txt", "01-x.txt"]
    assert (folder / "prompts" / "00-a_b_c.py.txt").read_text() == "P1"
    assert json.loads((folder / "manifest.json").read_text())["items"] == [{"id": "a:b/c.py"}, {"id": "x"}]


# -- the harness on a real task (needs the site) ---------------------------------------------------
SITE = sources.site_dir()
needs_site = pytest.mark.skipif(not sources.site_ready(SITE), reason=f"no workloads site at {SITE}; run "
                                "python benchmarks/workloads/real/build.py --only agents")


def truth_calls(sim, call: str) -> tuple[str, dict]:
    """A ground-truth string as (name, keyword arguments), positional ones named by the signature."""
    node = ast.parse(call, mode="eval").body
    name = node.func.id
    params = [p for p in inspect.signature(sim.methods[name]).parameters]
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return name, args


class ReplayClient:
    """A fake OpenAI client whose replies are given in order: a list of calls, or text."""

    def __init__(self, replies: list) -> None:
        self.replies, self.sent = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **kw):
        self.sent.append(kw)
        reply = self.replies.pop(0)
        calls = None if isinstance(reply, str) else [
            SimpleNamespace(id=f"c{i}", function=SimpleNamespace(name=n, arguments=json.dumps(a)))
            for i, (n, a) in enumerate(reply)]
        msg = SimpleNamespace(content=reply if isinstance(reply, str) else None, tool_calls=calls)
        return SimpleNamespace(choices=[SimpleNamespace(message=msg, finish_reason="stop" if calls is None
                                                        else "tool_calls")],
                               usage=SimpleNamespace(completion_tokens=5, prompt_tokens=100),
                               model_dump=lambda: {"counters": {"drafted_tokens": 4, "accepted_tokens": 3}})


@needs_site
def test_ground_truth_replay_passes_bfcl_checker_and_silence_fails():
    import httpx
    import openai
    import serve_real

    serve_real.use_site()
    items, _ = agents.build(SITE / "bfcl_eval", per_category=1, seed=0, categories=("multi_turn_base",))
    task = items[0]
    sim = serve_real.Simulator(task)
    replies = []
    for turn in task["ground_truth"]:
        if turn:
            replies.append([truth_calls(sim, c) for c in turn])
        replies.append("Done.")
    client = ReplayClient(replies)
    s = serve_real.run_session(client, "m", task, "fake", max_steps=5, max_tokens=64)
    assert client.replies == [] and s.requests == len(replies)
    assert s.calls == sum(map(len, task["ground_truth"]))
    n = len(replies)
    assert (s.completion_tokens, s.drafted, s.accepted) == (5 * n, 4 * n, 3 * n)
    assert serve_real.check(task, s) == (True, "")
    last = client.sent[-1]["messages"]
    assert [m["role"] for m in last].count("tool") == s.calls  # every call's result went back
    assert last[0] == task["turns"][0][0] and client.sent[0]["tools"] == task["tools"]

    first_tool = task["tools"][0]["function"]["name"]
    evil = [[("exec", {"source": "import os"}), (first_tool, {"x=__import__('os').getpid()": 1})]]
    probe = ReplayClient(evil + ["No."] * len(task["turns"]))
    tried = serve_real.run_session(probe, "m", task, "fake", 5, 64)
    assert tried.calls == 2 and tried.decoded[0] == [[]]  # both executed (as errors), neither given to eval
    results = [m["content"] for m in probe.sent[1]["messages"] if m["role"] == "tool"]
    assert results[0] == "Error during execution: name 'exec' is not defined"
    assert results[1].startswith("Error during execution: ") and "unexpected keyword" in results[1]

    class Refusing:
        chat = SimpleNamespace(completions=SimpleNamespace(create=lambda **kw: (_ for _ in ()).throw(
            openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:1/v1")))))

    refused = serve_real.run_session(Refusing(), "m", task, "fake", 5, 64)
    assert refused.failed == "APIConnectionError: Connection error." and refused.requests == 0
    assert serve_real.check(task, refused) == (False, "request failed")

    silent = serve_real.run_session(ReplayClient(["No."] * len(task["turns"])), "m", task, "fake", 5, 64)
    assert serve_real.check(task, silent) == (False, "multi_turn:empty_turn_model_response")
    looping = serve_real.run_session(ReplayClient([[(first_tool, {})]] * 3), "m", task, "fake", 2, 64)
    assert looping.force_quit and serve_real.check(task, looping) == (False, "multi_turn:force_terminated")


# -- the harness's report and the build command ------------------------------------------------------
def test_report_marks_identical_sessions_and_pairs_walls():
    import serve_real

    def sess(task: str, row: str, wall: float, reply: str, valid: bool) -> serve_real.Session:
        return serve_real.Session(task, row, wall_s=wall, requests=2, completion_tokens=10, calls=1,
                                  drafted=None if row == "off" else 8, accepted=None if row == "off" else 6,
                                  valid=valid, replies=[[reply, []]])

    sessions = [sess("t1", "off", 4.0, "a", True), sess("t2", "off", 2.0, "b", False),
                sess("t1", "auto", 2.0, "a", True), sess("t2", "auto", 2.0, "c", False)]
    serve_real.mark_identical(sessions)
    assert [s.identical for s in sessions] == [None, None, True, False]
    rows = serve_real.table(sessions).splitlines()[2:]
    # walls: off 4 + 2 = 6 s, auto 2 + 2 = 4 s; off over auto per task 2.0 and 1.0: geomean 1.414,
    # a bootstrap over two tasks lands on 1.0, 1.414 or 2.0; tok/s 20 tokens over the summed walls
    assert rows == [
        "| off | 2 | 1/2 | - | 6.0 | 3.0 | - | 4 | 20 | 2 | 3.33 | - |",
        "| auto | 2 | 1/2 | 1/2 | 4.0 | 2.0 | 1.414x (1.000-2.000, n=2) | 4 | 20 | 2 | 5.00 | 12/16 |"]


def test_report_leaves_failed_sessions_out_of_identity_and_walls():
    import serve_real

    def sess(task: str, row: str, wall: float, failed: str = "") -> serve_real.Session:
        return serve_real.Session(task, row, wall_s=wall, requests=0 if failed else 2, completion_tokens=10,
                                  calls=1, valid=False, replies=[] if failed else [["a", []]], failed=failed)

    refused = "BadRequestError: no tools"
    sessions = [sess("t1", "off", 4.0), sess("t2", "off", 0.01, refused),
                sess("t1", "auto", 2.0), sess("t2", "auto", 0.02, refused)]
    serve_real.mark_identical(sessions)
    assert [s.identical for s in sessions] == [None, None, True, None]  # two refusals are no match
    auto = serve_real.table(sessions).splitlines()[3]
    assert "| 2.000x (2.000-2.000, n=1) |" in auto and "(1 sessions failed)" in auto


def test_fast_apply_checker_compares_the_fenced_files_line_by_line():
    import serve_real

    want = "```python\na = 1\nb = 2\nc = 3\n```\n"  # the items' answers carry the fence the prompt asks for
    assert serve_real.code_block(want) == "a = 1\nb = 2\nc = 3\n"
    assert serve_real.code_block("no fence at all") == "no fence at all"
    # a ``` inside a line does not close the block; the first block wins
    assert serve_real.code_block("Here:\n```py\nx = '```'\n```\n```\nlater\n```") == "x = '```'\n"
    assert serve_real.check_edit("Sure.\n```python\na = 1\nb = 2\nc = 3\n```", want) == (True, 1.0)
    assert serve_real.check_edit("a = 1\nb = 2\nc = 3", want) == (True, 1.0)  # unfenced: the reply itself
    # one line of three rewritten: 2 matching lines of 3 + 3: ratio 2 * 2 / 6
    assert serve_real.check_edit("```python\na = 1\nb = 20\nc = 3\n```", want) == (False, 4 / 6)
    assert serve_real.check_edit("", want) == (False, 0.0)


def test_speculating_peer_is_paired_with_its_plain_row_and_tables_remake_from_records(tmp_path, capsys):
    import serve_real

    def sess(task: str, row: str, wall: float, reply: str) -> serve_real.Session:
        return serve_real.Session(task, row, wall_s=wall, requests=1, completion_tokens=10,
                                  replies=[[reply, []]])

    sessions = [sess("t1", "ours-off", 8.0, "```\nx\n```"), sess("t2", "ours-off", 8.0, "y"),
                sess("t1", "ls", 4.0, "```\nx\n```"), sess("t2", "ls", 6.0, "y"),
                sess("t1", "ls-spec", 2.0, "```\nx\n```"), sess("t2", "ls-spec", 6.0, "z")]
    out = serve_real.table(sessions).splitlines()
    # ls over ls-spec per task: 2.0 and 1.0; the bootstrap over two tasks lands on 1.0, 1.414 or 2.0
    assert out[-1] == ("ls-spec against ls: 1.414x (1.000-2.000, n=2), the geometric mean over tasks of "
                       "ls's wall over ls-spec's; replies the same in 1/2")
    assert len(out) == 2 + 3 + 2  # head, rule, three rows, a blank line, the pairing

    records = tmp_path / "fa.jsonl"
    records.write_text("".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in sessions), encoding="utf-8")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": t, "workload": "fast_apply", "prompt": "p",
                                         "expected": "```python\nx\n```\n"}) + "\n" for t in ("t1", "t2")),
                     encoding="utf-8")
    md = tmp_path / "fa.md"
    assert serve_real.main(["--workload", "fast_apply", "--items", str(items), "--table-from", str(records),
                            "--md", str(md)]) == 0
    rows = md.read_text(encoding="utf-8").splitlines()
    # t1's replies are the file, t2's are another one-line file: half pass, median similarity 0.5
    assert [r.split(" | ")[2] for r in rows[2:5]] == ["1/2 (lines 0.500)"] * 3
    assert [r.split(" | ")[3] for r in rows[2:5]] == ["-", "2/2", "1/2"]
    capsys.readouterr()

    records.write_text(records.read_text(encoding="utf-8") + "[1, 2]\n", encoding="utf-8")
    again = ["--workload", "fast_apply", "--items", str(items), "--table-from", str(records)]
    assert serve_real.main(again) == 2
    assert capsys.readouterr().err == (f"serve_real: error: {records}:7: not a session record of serve_real "
                                       "(TypeError: a JSON list, not an object)\n")
    records.write_text(json.dumps({"task": "t1", "row": "ls", "replies": [7]}) + "\n", encoding="utf-8")
    assert serve_real.main(again) == 2  # a reply that is not [text, calls]
    assert capsys.readouterr().err == (f"serve_real: error: {records}:1: not a session record of serve_real "
                                       "(TypeError: 'int' object is not subscriptable)\n")


def test_agents_corpus_holds_each_tasks_states_as_tools_print_them_and_the_simulators(tmp_path):
    import serve_real

    code = tmp_path.joinpath("site", *serve_real.SIM_PREFIX.split("."))
    code.mkdir(parents=True)
    (code / "trading_bot.py").write_text("class TradingBot:\n    pass\n")
    (code / "notes.txt").write_text("not a source")
    tasks = [{"id": "multi_turn_base_7", "involved_classes": ["TradingBot", "MathAPI"],
              "initial_config": {"TradingBot": {"balance": 35000.0, "stocks": {"AAPL": {"price": 227.16}}}}},
             {"id": "multi_turn_base_8", "involved_classes": ["TicketAPI"], "initial_config": {}}]
    assert serve_real.write_states(tasks, tmp_path / "out", tmp_path / "site") == 3
    files = sorted(str(f.relative_to(tmp_path / "out")) for f in (tmp_path / "out").rglob("*") if f.is_file())
    assert files == ["simulators/trading_bot.py", "states/multi_turn_base_7/TradingBot.json",
                     "states/multi_turn_base_8/TicketAPI.json"]  # MathAPI keeps no state
    assert (tmp_path / "out/states/multi_turn_base_7/TradingBot.json").read_text() == \
        '{"balance": 35000.0, "stocks": {"AAPL": {"price": 227.16}}}\n'
    assert (tmp_path / "out/states/multi_turn_base_8/TicketAPI.json").read_text() == "{}\n"
    args = SimpleNamespace(model=Path("m.gguf"), threads=2, ctx=4096, speculate="auto", corpus_index="/c")
    assert serve_real.row_argv("ours-corpus", args)[-4:] == ["--speculate", "auto", "--corpus", "/c"]


def test_build_command_refuses_an_unknown_workload(capsys):
    # loaded by path under its own name: a module named "build" on sys.path would shadow pypa's
    spec = importlib.util.spec_from_file_location("real_workloads_build",
                                                  ROOT / "benchmarks" / "workloads" / "real" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    with pytest.raises(SystemExit) as exc:
        build.main(["--only", "fast_apply,nope"])
    assert exc.value.code == 2
    assert "--only: unknown workload 'nope' (known: fast_apply, summaries, agents)" in capsys.readouterr().err


def test_tool_turns_sorts_calls_calls_left_as_text_and_words_and_validates_required():
    import serve_real

    names = {"mv", "ls"}
    assert serve_real.declared_call_in_text('```json\n{"name": "mv", "arguments": {}}\n```', names)
    assert serve_real.declared_call_in_text('Sure: {"x": 1} then {"name": "ls"}', names)
    assert not serve_real.declared_call_in_text('{"name": "rm", "arguments": {}}', names)  # not declared
    assert not serve_real.declared_call_in_text("{ not json", names)

    schema = {"type": "object", "properties": {"source": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["source"]}
    schemas = {"mv": schema}
    assert serve_real.check_required([("mv", '{"source": "a", "n": 2}')], schemas) == "valid"
    assert serve_real.check_required([], schemas) == "invalid: no tool call"
    assert serve_real.check_required([("rm", "{}")], schemas) == "invalid: 'rm' is not a declared tool"
    assert serve_real.check_required([("mv", '{"n": 2}')], schemas) == \
        "invalid: mv: 'source' is a required property"
    assert serve_real.check_required([("mv", '{"source": "a", "n": "2"}')], schemas) == \
        "invalid: mv: '2' is not of type 'integer'"
    not_json = serve_real.check_required([("mv", "{")], schemas)
    assert not_json.startswith("invalid: mv arguments are not JSON (")

    tools = [{"type": "function", "function": {"name": "mv", "parameters": schema}}]
    task = {"id": "t", "tools": tools, "turns": [[{"role": "user", "content": "move a"}]]}
    fenced = '```json\n{"name": "mv", "arguments": {"source": "a"}}\n```'
    client = ReplayClient([fenced, [("mv", {"source": "a"})]])
    turn = serve_real.run_first_turn(client, "m", task, 64)
    assert (turn.auto, turn.required, turn.prompt_tokens, turn.tools) == ("missed", "valid", 100, 1)
    assert [kw["tool_choice"] for kw in client.sent] == ["auto", "required"]
    assert client.sent[0]["messages"] == client.sent[1]["messages"] == task["turns"][0]
    turn = serve_real.run_first_turn(ReplayClient([[("mv", {"source": "a"})], "I cannot."]), "m", task, 64)
    assert (turn.auto, turn.auto_finish, turn.required) == ("call", "tool_calls", "invalid: no tool call")
    assert turn.auto_calls == ['mv({"source": "a"})']
    table = serve_real.tool_table([turn])
    assert table.splitlines()[-1] == (
        "tool_choice auto: 1 of 1 first turns came back as tool_calls, 0 calls left as text, 0 answered in "
        "words or failed; tool_choice required: 0 of 1 answers are calls that validate against their tool")
