"""Do a tool model's calls come back as calls? BFCL's first turns through ``serve`` and the openai client.

Why (issue 40): an agent stalls when the model calls a tool and the server hands the call back as
text. Small tool-trained models (Qwen2.5-Coder) write their calls in ``<tool_call>`` tags, in a fenced
```json block or as a bare JSON object; the server must return each as ``tool_calls``. And under
``tool_choice: "required"`` every answer must be a call that validates against its tool.

For each of the first ``--tasks`` BFCL multi-turn tasks (``benchmarks/workloads/real/agents.py``
builds them: 24 tasks, each with the tools of its APIs: a 4-5k-token prompt) the task's first user
turn is sent twice to one ``promptlookup serve`` (started here, greedy, its default ``auto``):

- ``tool_choice: "auto"``: the reply is ``call`` (it came back as ``tool_calls``), ``missed`` (text
  that holds a JSON object naming a declared tool: a call the server failed to return) or ``text``
  (an answer in words);
- ``tool_choice: "required"``: the reply must be ``tool_calls``, each naming a declared tool, its
  arguments JSON that validates against that tool's ``parameters`` (``jsonschema``, the reference
  validator: ``pip install jsonschema``).

The second request carries the same prompt, so the server reuses its prefill. Run::

    .venv/bin/python benchmarks/bfcl_turns.py -m qwen2.5-coder-1.5b -t 2 --tasks 24 --md turns.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "workloads"))
from real.common import read_jsonl, workloads_root  # noqa: E402
from serve_real import OUR_SRC, REQUEST_ERRORS  # noqa: E402


@dataclass
class Turn:
    """One task's first turn, asked both ways."""

    task: str
    tools: int
    prompt_tokens: int = 0
    auto: str = ""  # call | missed | text | error: ...
    auto_calls: list[str] = field(default_factory=list)
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


def ask(client: Any, model: str, task: dict[str, Any], max_tokens: int) -> Turn:
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
        shown = [f"{n}({a})"[:120] for n, a in calls]
        if resp.usage is not None:
            turn.prompt_tokens = resp.usage.prompt_tokens
        if choice == "auto":
            turn.auto_calls = shown or [(msg.content or "")[:120]]
            turn.auto = "call" if calls else ("missed" if declared_call_in_text(msg.content or "", names)
                                              else "text")
        else:
            turn.required_calls = shown or [(msg.content or "")[:120]]
            turn.required = check_required(calls, schemas)
    turn.seconds = time.perf_counter() - t0
    return turn


def table(turns: list[Turn]) -> str:
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


def main(argv: list[str] | None = None) -> int:
    from openai import OpenAI
    from serve_session import RowSpec, Server

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True, help="a model name (promptlookup models) or a GGUF path")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=8192)
    ap.add_argument("--tasks", type=int, default=24, help="the first N tasks (default 24: all)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--speculate", default="auto", help="the server's --speculate (default auto)")
    ap.add_argument("--items", type=Path, help="the agents' items.jsonl (default <workloads>/real/agents)")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--jsonl", type=Path, help="write every turn's record")
    ap.add_argument("--md", type=Path, help="write the table")
    args = ap.parse_args(argv)
    items = args.items or workloads_root() / "real" / "agents" / "items.jsonl"
    if not items.is_file():
        raise SystemExit(f"bfcl_turns: error: {items}: no agent tasks; run "
                         "python benchmarks/workloads/real/build.py --only agents")
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        raise SystemExit("bfcl_turns: error: the required check needs jsonschema: "
                         "pip install jsonschema") from None
    tasks = read_jsonl(items)[: args.tasks or None]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OUR_SRC), *filter(None, [env.get("PYTHONPATH")])])
    argv_ = [sys.executable, "-m", "promptlookup", "serve", "-m", str(args.model), "-t", str(args.threads),
             "-c", str(args.ctx), "--parallel", "1", "--host", "127.0.0.1", "--speculate", args.speculate]
    turns: list[Turn] = []
    row = RowSpec("ours", "ours", argv_, env)
    with tempfile.TemporaryDirectory() as logdir, \
            Server(row, Path(logdir) / "serve.log", args.start_timeout) as server:
        client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", timeout=1800,
                        max_retries=0)
        model = client.models.list().data[0].id
        for i, task in enumerate(tasks, 1):
            turn = ask(client, model, task, args.max_tokens)
            turns.append(turn)
            print(f"[{i}/{len(tasks)}] {turn.task}: auto {turn.auto} {turn.auto_calls[:2]}; "
                  f"required {turn.required} ({turn.seconds:.0f} s)", file=sys.stderr, flush=True)
            if args.jsonl:
                args.jsonl.write_text("".join(json.dumps(asdict(t)) + "\n" for t in turns))
    text = table(turns)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
