"""Real workloads against OpenAI-compatible servers (issue 41): agent sessions, code edits, summaries.

``--workload fast_apply`` or ``summaries``: each item's prompt is one chat request (temperature 0);
per item the wall seconds, completion tokens, and for fast_apply whether the reply's code block is
exactly the new file (the "checker" column, with the median share of lines that match:
:func:`check_edit`). ``--workload tool_turns``: each BFCL task's first user turn, with
its tools, asked twice: ``tool_choice: "auto"`` (the reply is ``call``: it came back as ``tool_calls``;
``missed``: text holding a JSON object that names a declared tool, a call the server did not return as
one; or ``text``) and ``"required"`` (every reply must be calls to declared tools whose arguments
validate against the tool's ``parameters``, checked with ``jsonschema``, the reference validator).
``--workload agents`` (the default) runs sessions:

Each task (``benchmarks/workloads/real/agents.py`` builds them: ``multi_turn_base`` and
``multi_turn_miss_func`` of ``bfcl-eval``) is run as an agent runs it, through the official
``openai`` client: the task's user turns in order, each request carrying the tools and the whole
conversation so far; every call the model returns is executed in BFCL's own simulator of that API
(a file system, a trading bot, ... loaded with the task's initial state) and its result goes back
as a ``role: tool`` message; a turn ends when the model answers in text (or returns arguments that
are not JSON, as BFCL's handler does), a session after ``--max-steps`` requests in one turn (BFCL's
limit is 20; the session is then "force-terminated" and fails). A held-out tool (miss_func) is added
at its turn, whose user message is BFCL's "I have updated some more functions...".

Per session: wall seconds (the whole session, tools included: what a user waits), requests,
completion and prompt tokens (``usage``), calls made, drafted/accepted tokens where the server
reports them, and **BFCL's checker verdict** (``multi_turn_checker`` of the installed bfcl-eval,
called on the calls made, as ``bfcl evaluate`` does: after every turn the simulators' states must
equal those the ground-truth calls leave, and the ground truth's results must be among the model's).
"identical" says whether a session's every reply (text and calls) equals the first row's: greedy
speculation on our server must give "yes" against ``ours-off``; another engine may differ, and its
checker score is reported as it is.

Rows (``--rows``, in order; each server is started here on a free 127.0.0.1 port, warmed up by one
tiny untimed request, and stopped; or ``--url`` for one server already running, named by ``--label``):

- ``ours-off``  ``python -m promptlookup serve -m MODEL --speculate off --parallel 1``
- ``ours``      the same with ``--speculate auto`` (the default)
- ``ours-corpus`` ``ours`` with a default corpus (``--corpus``, issue 45): for agents, by default the
  tasks' simulator states (each task's initial state of each API, as the simulators print a dict,
  and the simulators' sources), indexed here with ``promptlookup index`` on the row's model
- ``ls``        llama.cpp's ``llama-server --jinja -np 1`` (its template engine and tool-call parser)
- ``ls-spec``   the same with its n-gram speculation (``--spec-default``)

llama-server is built from the llama.cpp that llama-cpp-python vendors, with set-up's ISA flags
(``benchmarks/llama_tools.py``; ~19 min on 2 cores, once):

    .venv/bin/python -c "import sys; sys.path.insert(0, 'benchmarks'); import llama_tools; \\
        print(llama_tools.ensure_server())"

Run (build the workloads first: ``python benchmarks/workloads/real/build.py --only agents``):

    .venv/bin/python benchmarks/serve_real.py \\
        -m ~/.cache/promptlookup/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --rows ours-off,ours,ls,ls-spec [--workload agents|fast_apply|summaries] [--tasks N] \\
        [--jsonl FILE] [--md FILE]

The rows run one after another (a row's server holds the model while its tasks run); --url runs
one row against a server started elsewhere. A speculating peer's row is also paired with its own
plain row (``ls-spec against ls``, a line under the table). ``--table-from FILE`` runs nothing and
remakes the table from the ``--jsonl`` records of an earlier run (for example after merging the
records of items run again).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import inspect
import json
import keyword
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "workloads"))
from real.agents import ADDED_FUNCTIONS_PROMPT  # noqa: E402
from real.common import WorkloadError, read_jsonl, workloads_root  # noqa: E402
from real.sources import site_dir, site_ready  # noqa: E402

OUR_SRC = HERE.parent / "src"
ROW_KEYS = ("ours-off", "ours", "ours-corpus", "ls", "ls-spec")
WORKLOADS = {"agents": 512, "tool_turns": 256, "fast_apply": 2048, "summaries": 384}  # -> default max_tokens
SIM_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# class -> simulator module (bfcl_eval.constants.executable_backend_config.CLASS_FILE_PATH_MAPPING)
SIM_MODULES = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
               "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
               "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
STATELESS = {"MathAPI"}


def _request_errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises: the openai client's API errors (when it is installed)."""
    try:
        import openai
    except ImportError:
        return ()
    return (openai.APIError,)


REQUEST_ERRORS = _request_errors()


def use_site(site: Path | None = None) -> Path:
    """Put the workloads' site (bfcl-eval, mpmath) on sys.path; an error saying how to make it."""
    site = site or site_dir()
    if not site_ready(site):
        raise WorkloadError(f"{site}: the workloads' site is not installed; run "
                            "python benchmarks/workloads/real/build.py --only agents")
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return site


class Simulator:
    """The task's APIs as BFCL runs them: one instance per class, loaded with the initial state;
    a call runs the public method of that name and its result becomes text as in BFCL's
    ``execute_multi_turn_func_call`` (a dict as JSON, an error as "Error during execution: ...")."""

    def __init__(self, task: dict[str, Any]) -> None:
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for cls in task["involved_classes"]:
            module = importlib.import_module(f"{SIM_PREFIX}.{SIM_MODULES[cls]}")
            inst = getattr(module, cls)()
            if cls not in STATELESS:
                inst._load_scenario(copy.deepcopy(task["initial_config"].get(cls, {})), long_context=False)
            self.instances[cls] = inst
            for name, method in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, name: str, args: dict[str, Any]) -> str:
        if name not in self.methods:
            return f"Error during execution: name '{name}' is not defined"
        try:
            result = self.methods[name](**args)
        except Exception as exc:  # the simulator's own error is the tool's answer, as in BFCL
            return f"Error during execution: {exc}"
        if isinstance(result, str):
            return result
        if isinstance(result, dict):
            try:
                return json.dumps(result)
            except (TypeError, ValueError):
                return str(result)
        return str(result)


def call_string(name: str, args: dict[str, Any]) -> str:
    """A call as BFCL's OpenAI handler decodes it (``decode_execute``): ``name(k=repr(v),...)``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def checkable(sim: Simulator, name: str, args: dict[str, Any]) -> bool:
    """Whether a call may go to BFCL's checker, which ``eval``s the call strings: only a simulator
    method with identifier keywords (the values, parsed from JSON, are literals and their ``repr``
    is one). Anything else (``exec``, a keyword holding code) could not have been a valid call: the
    simulator answered it with an error, and the checker never sees it."""
    return name in sim.methods and all(k.isidentifier() and not keyword.iskeyword(k) for k in args)


@dataclass
class Session:
    task: str
    row: str
    wall_s: float = 0.0
    requests: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the server reported as reused from its cache
    calls: int = 0
    drafted: int | None = None
    accepted: int | None = None
    force_quit: bool = False
    failed: str = ""  # a request the server refused or did not answer (the session stopped there)
    valid: bool | None = None
    similarity: float | None = None  # fast_apply: the reply's code block against the new file, by lines
    error_type: str = ""
    identical: bool | None = None
    replies: list[Any] = field(default_factory=list)  # per request: (text, [(name, arguments)])
    decoded: list[list[list[str]]] = field(default_factory=list)  # per turn, per step: call strings


def _drafts(raw: dict[str, Any]) -> tuple[int, int] | None:
    """(drafted, accepted) tokens of one response: our ``counters`` or llama-server's ``timings``."""
    c, t = raw.get("counters") or {}, raw.get("timings") or {}
    if "drafted_tokens" in c:
        return int(c["drafted_tokens"]), int(c.get("accepted_tokens", 0))
    if "draft_n" in t:
        return int(t["draft_n"]), int(t.get("draft_n_accepted", 0))
    return None


def _cached(usage: Any) -> int:
    """``usage.prompt_tokens_details.cached_tokens``, 0 where the server does not say."""
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", 0) or 0)


def run_session(client: Any, model: str, task: dict[str, Any], row: str, max_steps: int, max_tokens: int,
                extra_body: dict[str, Any] | None = None) -> Session:
    """One task, turn by turn, every call executed; the checker is :func:`check`'s."""
    sim = Simulator(task)
    tools = list(task["tools"])
    messages: list[dict[str, Any]] = []
    s = Session(task["id"], row)
    t0 = time.perf_counter()
    for turn, user_msgs in enumerate(task["turns"]):
        if str(turn) in task["held_out"]:
            tools = [*tools, *task["held_out"][str(turn)]]
            user_msgs = [{"role": "user", "content": ADDED_FUNCTIONS_PROMPT}]
        messages.extend(user_msgs)
        steps: list[list[str]] = []
        for step in range(max_steps + 1):
            if step == max_steps:
                s.force_quit = True
                break
            try:
                resp = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                      temperature=0, max_tokens=max_tokens,
                                                      extra_body=extra_body or None)
            except REQUEST_ERRORS as exc:  # e.g. the conversation outgrew the context: record, go on
                s.failed = f"{type(exc).__name__}: {exc}"[:300]
                break
            raw = resp.model_dump()
            s.requests += 1
            if resp.usage is not None:
                s.completion_tokens += resp.usage.completion_tokens
                s.prompt_tokens += resp.usage.prompt_tokens
                s.cached_tokens += _cached(resp.usage)
            d = _drafts(raw)
            if d is not None:
                s.drafted, s.accepted = (s.drafted or 0) + d[0], (s.accepted or 0) + d[1]
            msg = resp.choices[0].message
            calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            s.replies.append([msg.content, calls])
            if not calls:
                messages.append({"role": "assistant", "content": msg.content or ""})
                break
            try:
                parsed = [json.loads(a) if a else {} for _, a in calls]
            except json.JSONDecodeError:
                parsed = None
            messages.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [{"id": c.id, "type": "function",
                                             "function": {"name": c.function.name,
                                                          "arguments": c.function.arguments}}
                                            for c in msg.tool_calls]})
            if parsed is None or not all(isinstance(p, dict) for p in parsed):
                break  # BFCL: a reply that does not decode ends the turn (no result is sent back)
            strings = []
            for c, (name, _), args in zip(msg.tool_calls, calls, parsed, strict=True):
                messages.append({"role": "tool", "tool_call_id": c.id, "content": sim.call(name, args)})
                if checkable(sim, name, args):
                    strings.append(call_string(name, args))
                s.calls += 1
            steps.append(strings)
        s.decoded.append(steps)
        if s.force_quit or s.failed:
            break
    s.wall_s = time.perf_counter() - t0
    return s


def run_prompt(client: Any, model: str, item: dict[str, Any], row: str, max_tokens: int) -> Session:
    """One prompt item as one chat request; ``valid`` says whether a fast_apply reply is exactly
    the expected file (None for summaries: a paraphrase is no error)."""
    s = Session(item["id"], row)
    t0 = time.perf_counter()
    try:
        messages = [{"role": "user", "content": item["prompt"]}]
        resp = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                              max_tokens=max_tokens)
    except REQUEST_ERRORS as exc:
        s.failed, s.valid = f"{type(exc).__name__}: {exc}"[:300], False
        return s
    s.wall_s = time.perf_counter() - t0
    s.requests = 1
    if resp.usage is not None:
        s.completion_tokens, s.prompt_tokens = resp.usage.completion_tokens, resp.usage.prompt_tokens
        s.cached_tokens = _cached(resp.usage)
    d = _drafts(resp.model_dump())
    if d is not None:
        s.drafted, s.accepted = d
    text = resp.choices[0].message.content or ""
    s.replies.append([text, []])
    if item.get("workload") == "fast_apply":
        s.valid, s.similarity = check_edit(text, item["expected"])
    return s


FENCED = re.compile(r"```[^\n`]*\n(.*?)^```", re.S | re.M)


def code_block(reply: str) -> str:
    """The file in a fast_apply reply: the first fenced code block's body (the prompt asks for
    the whole file in one ```python block), or the reply itself when it holds no fence."""
    m = FENCED.search(reply)
    return m.group(1) if m else reply


def check_edit(reply: str, expected: str) -> tuple[bool, float]:
    """(the reply's file is exactly the new file, the share of lines it matches; the expected answer
    is the file in the same fence the prompt asks for): the ratio of
    :class:`difflib.SequenceMatcher` over the two files' lines, 1.0 for the same file. A model that
    drops or rewrites a few lines fails the first and still scores near 1 on the second."""
    got, want = code_block(reply).strip().splitlines(), code_block(expected).strip().splitlines()
    return got == want, difflib.SequenceMatcher(None, got, want, autojunk=False).ratio()


def check(task: dict[str, Any], s: Session) -> tuple[bool, str]:
    """BFCL's verdict on a session: force-terminated fails, else ``multi_turn_checker``."""
    if s.failed:
        return False, "request failed"
    if s.force_quit or len(s.decoded) != len(task["ground_truth"]):
        return False, "multi_turn:force_terminated"
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entry = {"id": task["id"], "initial_config": task["initial_config"],
             "involved_classes": task["involved_classes"]}
    # the checker keeps its simulator instances in globals keyed by this name: one per check
    name = f"serve_real_{uuid.uuid4().hex[:12]}"
    try:
        result = multi_turn_checker(s.decoded, task["ground_truth"], entry, task["category"], name)
    except AssertionError as exc:
        return False, f"checker assertion: {exc}"[:200]
    return bool(result["valid"]), result.get("error_type", "")


# -- tool_turns: do calls come back as calls? --------------------------------------------------
@dataclass
class Turn:
    """One task's first turn, asked both ways."""

    task: str
    tools: int
    prompt_tokens: int = 0
    auto: str = ""  # call | missed | text | error: ...
    auto_calls: list[str] = field(default_factory=list)  # its calls, or its text
    auto_finish: str = ""
    required: str = ""  # valid | invalid: why | error: ...
    required_calls: list[str] = field(default_factory=list)
    seconds: float = 0.0


def declared_call_in_text(text: str, names: set[str]) -> bool:
    """Whether ``text`` holds a JSON object whose ``name`` is a declared tool (a call left as text)."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            obj, _ = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("name") in names:
            return True
    return False


def check_required(calls: list[tuple[str, str]], schemas: dict[str, dict[str, Any]]) -> str:
    """``valid``, or ``invalid: <the first problem>`` for a ``required`` reply's calls."""
    import jsonschema

    if not calls:
        return "invalid: no tool call"
    for name, arguments in calls:
        if name not in schemas:
            return f"invalid: {name!r} is not a declared tool"
        try:
            args = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as exc:
            return f"invalid: {name} arguments are not JSON ({exc.msg})"
        problem = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schemas[name]).iter_errors(args))
        if problem is not None:
            return f"invalid: {name}: {problem.message}"[:200]
    return "valid"


def run_first_turn(client: Any, model: str, task: dict[str, Any], max_tokens: int) -> Turn:
    """A task's first user turn asked with ``tool_choice`` auto, then required (the same prompt: the
    server reuses its prefill)."""
    tools = list(task["tools"])
    names = {t["function"]["name"] for t in tools}
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
    turn = Turn(task["id"], len(tools))
    messages = list(task["turns"][0])
    t0 = time.perf_counter()
    for choice in ("auto", "required"):
        try:
            resp = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                  tool_choice=choice, temperature=0, max_tokens=max_tokens)
        except REQUEST_ERRORS as exc:
            setattr(turn, choice, f"error: {type(exc).__name__}: {exc}"[:200])
            continue
        msg = resp.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        shown = [f"{n}({a})" for n, a in calls] or [msg.content or ""]
        if resp.usage is not None:
            turn.prompt_tokens = resp.usage.prompt_tokens
        if choice == "auto":
            turn.auto_calls, turn.auto_finish = shown, resp.choices[0].finish_reason
            turn.auto = "call" if calls else ("missed" if declared_call_in_text(msg.content or "", names)
                                              else "text")
        else:
            turn.required_calls = shown
            turn.required = check_required(calls, schemas)
    turn.seconds = time.perf_counter() - t0
    return turn


def tool_table(turns: list[Turn]) -> str:
    lines = ["| task | tools | prompt tokens | auto | required | seconds |", "|---|---|---|---|---|---|"]
    for t in turns:
        lines.append(f"| {t.task} | {t.tools} | {t.prompt_tokens} | {t.auto} | {t.required} "
                     f"| {t.seconds:.0f} |")
    n = len(turns)
    calls = sum(t.auto == "call" for t in turns)
    missed = sum(t.auto == "missed" for t in turns)
    valid = sum(t.required == "valid" for t in turns)
    lines.append("")
    lines.append(f"tool_choice auto: {calls} of {n} first turns came back as tool_calls, {missed} calls left "
                 f"as text, {n - calls - missed} answered in words or failed; tool_choice required: "
                 f"{valid} of {n} answers are calls that validate against their tool")
    return "\n".join(lines)


# -- servers ---------------------------------------------------------------------------------------
def row_argv(key: str, args: argparse.Namespace) -> list[str]:
    model, t, ctx = str(args.model), str(args.threads), str(args.ctx)
    ours = [sys.executable, "-m", "promptlookup", "serve", "-m", model, "-t", t, "-c", ctx, "--parallel", "1",
            "--host", "127.0.0.1"]
    if key == "ours-off":
        return [*ours, "--speculate", "off"]
    if key == "ours":
        return [*ours, "--speculate", args.speculate]
    if key == "ours-corpus":
        return [*ours, "--speculate", args.speculate, "--corpus", str(args.corpus_index)]
    server = args.llama_server or _default_llama_server()
    ls = [str(server), "-m", model, "-t", t, "-tb", t, "-c", ctx, "-np", "1", "--jinja",
          "--host", "127.0.0.1"]
    return ls if key == "ls" else [*ls, "--spec-default"]


def write_states(tasks: list[dict[str, Any]], dest: Path, site: Path) -> int:
    """The agents' corpus: per task and API, its initial state as the simulator prints a dict
    (``json.dumps``: what a tool result that returns it looks like), plus the simulators' sources;
    the number of files written."""
    n = 0
    for task in tasks:
        for cls in task["involved_classes"]:
            if cls in STATELESS:
                continue
            f = dest / "states" / task["id"] / f"{cls}.json"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(task["initial_config"].get(cls, {})) + "\n", encoding="utf-8")
            n += 1
    for src in sorted(site.joinpath(*SIM_PREFIX.split(".")).glob("*.py")):
        (dest / "simulators").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / "simulators" / src.name)
        n += 1
    return n


def prepare_corpus(keys: list[str], tasks: list[dict[str, Any]], args: argparse.Namespace,
                   work: Path) -> None:
    """For the ``ours-corpus`` row: ``--corpus states`` indexed on the row's model (``promptlookup
    index``) into ``work``; another value is passed to the server as given."""
    if "ours-corpus" not in keys:
        return
    if args.corpus != "states":
        args.corpus_index = args.corpus
        return
    if args.workload not in ("agents", "tool_turns"):
        raise SystemExit("serve_real: error: --corpus states is for the agent tasks; name a corpus")
    n = write_states(tasks, work / "corpus-src", use_site())
    out = work / "corpus"
    cmd = [sys.executable, "-m", "promptlookup", "index", str(work / "corpus-src"), "-o", str(out), "-m",
           str(args.model), "--no-progress"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OUR_SRC), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise SystemExit(f"serve_real: error: indexing the states failed: {r.stderr.strip()[-400:]}")
    print(f"corpus: {n} files; {r.stderr.strip().splitlines()[-1]}", file=sys.stderr, flush=True)
    args.corpus_index = out


def _default_llama_server() -> Path:
    import llama_tools

    path = llama_tools.bin_dir() / "llama-server"
    if not path.is_file():
        raise SystemExit(f"serve_real: error: no llama-server at {path}; build it (once, ~19 min): "
                         ".venv/bin/python -c \"import sys; sys.path.insert(0, 'benchmarks'); "
                         "import llama_tools; print(llama_tools.ensure_server())\", or pass --llama-server")
    return path


def run_row(key: str, base_url: str | None, tasks: list[dict[str, Any]], args: argparse.Namespace,
            logdir: Path, emit) -> list[Session]:
    from openai import OpenAI

    def go(url: str) -> list[Session]:
        client = OpenAI(base_url=url, api_key="none", timeout=args.request_timeout, max_retries=0)
        model = client.models.list().data[0].id
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0)  # warm-up, untimed
        out = []
        for i, task in enumerate(tasks, 1):
            print(f"[{key}] {i}/{len(tasks)} {task['id']}", file=sys.stderr, flush=True)
            if args.workload == "agents":
                s = run_session(client, model, task, key, args.max_steps, args.max_tokens)
                s.valid, s.error_type = check(task, s)
            elif args.workload == "tool_turns":
                s = run_first_turn(client, model, task, args.max_tokens)
            else:
                s = run_prompt(client, model, task, key, args.max_tokens)
            out.append(s)
            emit(s)
        return out

    if base_url:
        return go(base_url)
    from serve_session import RowSpec, Server

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OUR_SRC), *filter(None, [env.get("PYTHONPATH")])])
    spec = RowSpec(key, key, row_argv(key, args), env)
    with Server(spec, logdir / f"{key}.log", args.start_timeout) as server:
        return go(f"http://127.0.0.1:{server.port}/v1")


# -- report ----------------------------------------------------------------------------------------
def mark_identical(sessions: list[Session]) -> None:
    """Each session's ``identical``: all its replies equal the first row's session of that task (None
    for the first row, and where either session failed: two refused sessions are not a match)."""
    first: dict[str, Session] = {}
    for s in sessions:
        ref = first.setdefault(s.task, s)
        s.identical = None if ref is s or s.failed or ref.failed else s.replies == ref.replies


def table(sessions: list[Session]) -> str:
    rows = list(dict.fromkeys(s.row for s in sessions))
    checked = [s.valid for s in sessions if s.valid is not None]
    head = ("| row | tasks | checker pass | identical to first row | session wall s (sum) | median | "
            f"wall vs {rows[0]} (geomean, 95% CI over tasks) | requests | completion tokens | calls | "
            "tok/s | accepted/drafted |")
    out = [head, "|" + "---|" * head.count(" |")]
    for r in rows:
        mine = [s for s in sessions if s.row == r]
        ident = [s.identical for s in mine if s.identical is not None]
        pairs = paired(sessions, r, rows[0])
        vs = ratio_text(pairs) if r != rows[0] and pairs else "-"
        wall = sum(s.wall_s for s in mine)
        tokens = sum(s.completion_tokens for s in mine)
        drafted = [s for s in mine if s.drafted is not None]
        acc = (f"{sum(s.accepted or 0 for s in drafted)}/{sum(s.drafted or 0 for s in drafted)}"
               if drafted else "-")
        passed = f"{sum(bool(s.valid) for s in mine)}/{len(mine)}" if checked else "-"
        similar = [s.similarity for s in mine if s.similarity is not None]
        if similar:
            passed += f" (lines {statistics.median(similar):.3f})"
        failed = sum(bool(s.failed) for s in mine)
        requests = f"{sum(s.requests for s in mine)}" + (f" ({failed} sessions failed)" if failed else "")
        out.append(f"| {r} | {len(mine)} | {passed} | "
                   f"{f'{sum(ident)}/{len(ident)}' if ident else '-'} | {wall:.1f} | "
                   f"{statistics.median(s.wall_s for s in mine):.1f} | {vs} | "
                   f"{requests} | "
                   f"{tokens} | {sum(s.calls for s in mine)} | {tokens / wall if wall else 0:.2f} | {acc} |")
    for r in rows:  # a speculating peer against its own plain row, as ours are against ours-off
        plain = r.removesuffix("-spec")
        if r.endswith("-spec") and plain in rows and plain != rows[0]:
            out.append("\n" + paired_line(sessions, r, plain))
    return "\n".join(out)


def paired(sessions: list[Session], row: str, base: str) -> list[tuple[Session, Session]]:
    """(base's session, row's session) of every task that both ran to the end (a failed session
    has no wall)."""
    walls = {s.task: s for s in sessions if s.row == base and not s.failed and s.wall_s > 0}
    return [(walls[s.task], s) for s in sessions
            if s.row == row and s.task in walls and not s.failed and s.wall_s > 0]


def ratio_text(pairs: list[tuple[Session, Session]]) -> str:
    """The geometric mean over tasks of the base's wall over the row's, with its bootstrap interval."""
    from promptlookup.measure.bench import bootstrap_ci, geomean

    ratios = [b.wall_s / s.wall_s for b, s in pairs]
    lo, hi = bootstrap_ci(ratios)
    return f"{geomean(ratios):.3f}x ({lo:.3f}-{hi:.3f}, n={len(ratios)})"


def paired_line(sessions: list[Session], row: str, base: str) -> str:
    """``row`` against ``base``: :func:`ratio_text` and the share of tasks whose replies are the
    same in both."""
    pairs = paired(sessions, row, base)
    if not pairs:
        return f"{row} against {base}: no task ran on both"
    same = sum(b.replies == s.replies for b, s in pairs)
    return (f"{row} against {base}: {ratio_text(pairs)}, the geometric mean over tasks of {base}'s "
            f"wall over {row}'s; replies the same in {same}/{len(pairs)}")


def tool_turns(keys: list[str], tasks: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """``--workload tool_turns``: each row's first turns, then :func:`tool_table` per row."""
    from promptlookup.fileio import atomic_write_text

    turns: dict[str, list[Turn]] = {}

    def emit(t: Turn) -> None:
        print(f"  {t.task}: auto {t.auto} ({t.auto_finish}) {[c[:120] for c in t.auto_calls[:2]]}; "
              f"required {t.required} ({t.seconds:.0f} s)",
              file=sys.stderr, flush=True)
        turns.setdefault(key, []).append(t)
        if args.jsonl:
            atomic_write_text(args.jsonl, "".join(json.dumps({"row": k, **asdict(x)}) + "\n"
                                                  for k, ts in turns.items() for x in ts))

    with tempfile.TemporaryDirectory(prefix="serve_real-") as logdir:
        prepare_corpus(keys, tasks, args, Path(logdir))
        for key in keys:
            run_row(key, args.url, tasks, args, Path(logdir), emit)
    md = "\n\n".join(f"**{k}**\n\n{tool_table(ts)}" for k, ts in turns.items())
    print(md)
    if args.md:
        atomic_write_text(args.md, md + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=Path, help="GGUF for the servers started here")
    ap.add_argument("--rows", default="ours-off,ours", help=f"comma-separated, of {', '.join(ROW_KEYS)}")
    ap.add_argument("--url", help="a running server's base URL (http://HOST:PORT/v1) instead of --rows")
    ap.add_argument("--label", default="server", help="the --url row's name")
    ap.add_argument("--workload", choices=WORKLOADS, default="agents")
    ap.add_argument("--items", type=Path, default=None,
                    help="the workload's items.jsonl (default <workloads>/real/WORKLOAD/items.jsonl)")
    ap.add_argument("--tasks", type=int, default=0, help="the first N tasks only (0: all)")
    ap.add_argument("--ids", default="", help="comma-separated task ids to run (instead of --tasks)")
    ap.add_argument("--max-steps", type=int, default=20,
                    help="requests per turn before a force-quit (BFCL: 20)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="max_tokens of every request (default: agents 512, tool_turns 256, fast_apply 2048, "
                         "summaries 384)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=16384, help="context of the servers started here")
    ap.add_argument("--speculate", default="auto", help="the ours row's --speculate (default auto)")
    ap.add_argument("--corpus", default="states",
                    help="the ours-corpus row's corpus: 'states' (the agent tasks' simulator states, "
                         "indexed here) or a corpus name, directory or index")
    ap.add_argument("--llama-server", type=Path, help="llama-server binary (default: llama_tools' build)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--jsonl", type=Path, help="write every session's record (rewritten after each)")
    ap.add_argument("--md", type=Path, help="write the table")
    ap.add_argument("--table-from", type=Path, metavar="JSONL",
                    help="run nothing: remake the table from the --jsonl records of an earlier run "
                         "(fast_apply replies are checked again against the items)")
    args = ap.parse_args(argv)
    args.max_tokens = args.max_tokens or WORKLOADS[args.workload]
    keys = [args.label] if args.url else [k.strip() for k in args.rows.split(",") if k.strip()]
    if not args.url and not args.table_from:
        bad = [k for k in keys if k not in ROW_KEYS]
        if bad or not keys:
            ap.error(f"--rows: unknown row {bad[0] if bad else '(none)'!r} (known: {', '.join(ROW_KEYS)})")
        if args.model is None or not args.model.is_file():
            ap.error(f"--model: no GGUF at {args.model} (the servers started here need one)")
    try:
        if args.workload == "agents":
            use_site()
        folder = "agents" if args.workload == "tool_turns" else args.workload
        items = read_jsonl(args.items or workloads_root() / "real" / folder / "items.jsonl")
    except WorkloadError as exc:
        print(f"serve_real: error: {exc}", file=sys.stderr)
        return 2
    if args.ids:
        wanted = [i.strip() for i in args.ids.split(",") if i.strip()]
        by_id = {t["id"]: t for t in items}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            ap.error(f"--ids: no task {missing[0]!r} in the items")
        items = [by_id[i] for i in wanted]
    elif args.tasks:
        items = items[:args.tasks]
    from promptlookup.fileio import atomic_write_text

    if args.table_from:
        try:
            sessions = sessions_from(args.table_from, items)
        except (OSError, WorkloadError) as exc:
            print(f"serve_real: error: {exc}", file=sys.stderr)
            return 2
        return report(sessions, args)
    if args.workload == "tool_turns":
        return tool_turns(keys, items, args)
    sessions: list[Session] = []

    def emit(s: Session) -> None:
        verdict = ("" if s.valid is None else f", checker {'pass' if s.valid else 'fail'}"
                   + (f" ({s.error_type})" if s.error_type else ""))
        print(f"  {s.task}: {s.wall_s:.1f} s, {s.requests} requests, {s.prompt_tokens} prompt tokens "
              f"({s.cached_tokens} cached), {s.completion_tokens} tokens, "
              f"{s.calls} calls{verdict}" + (f"; {s.failed}" if s.failed else ""), file=sys.stderr,
              flush=True)
        sessions.append(s)
        if args.jsonl:
            atomic_write_text(args.jsonl, "".join(json.dumps(asdict(x)) + "\n" for x in sessions))

    with tempfile.TemporaryDirectory(prefix="serve_real-") as logdir:
        prepare_corpus(keys, items, args, Path(logdir))
        for key in keys:
            run_row(key, args.url, items, args, Path(logdir), emit)
    return report(sessions, args)


def report(sessions: list[Session], args: argparse.Namespace) -> int:
    """Mark the sessions identical or not to the first row's, write the records and the table."""
    from promptlookup.fileio import atomic_write_text

    mark_identical(sessions)
    if args.jsonl:
        atomic_write_text(args.jsonl, "".join(json.dumps(asdict(x)) + "\n" for x in sessions))
    md = table(sessions)
    print(md)
    if args.md:
        atomic_write_text(args.md, md + "\n")
    return 0


def sessions_from(path: Path, items: list[dict[str, Any]]) -> list[Session]:
    """The sessions of a ``--jsonl`` file, each fast_apply reply checked again against its item."""
    by_id = {t["id"]: t for t in items}
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise TypeError(f"a JSON {type(rec).__name__}, not an object")
            s = Session(**rec)
            item = by_id.get(s.task)
            if item is not None and item.get("workload") == "fast_apply" and s.replies and not s.failed:
                s.valid, s.similarity = check_edit(s.replies[0][0], item["expected"])
        except (json.JSONDecodeError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise WorkloadError(f"{path}:{n}: not a session record of serve_real "
                                f"({type(exc).__name__}: {exc})") from None
        out.append(s)
    if not out:
        raise WorkloadError(f"{path}: no session records")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
