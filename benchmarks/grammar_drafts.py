"""Grammar drafts (issue 43): tok/s of forced tool calls and json_schema answers with the grammar's
forced tokens drafted, against the same engine without them, and against plain decoding.

Items, from BFCL's multi-turn tasks (``benchmarks/workloads/real``, the ``agents`` items: build them
with ``python benchmarks/workloads/real/build.py agents``):

* **tool**: one user turn of a task with the task's tools and ``tool_choice`` forcing a call: the
  function its first ground-truth call names (``{"type": "function", ...}``), every other item
  ``"required"`` instead;
* **schema**: the same turn answered as JSON under ``response_format`` json_schema, the schema being
  the parameters of that ground-truth function ("reply with the arguments as JSON").

Cells, on one loaded model (one backend, one engine per cell, so no cell drafts from another cell's
answer to the same item through the suffix history): ``grammar`` (``--speculate`` with grammar
drafts, the default), ``nogrammar`` (the same with ``grammar_drafts=False``, i.e. the server's
``--no-grammar-drafts``) and ``off`` (``--speculate off``). Each item runs in every cell, the cells'
order rotating per item (``--repeats N``: N rounds of the cells taking turns, each round on its own
engines, so that no try drafts from an earlier try's answer; each cell's median run kept, every run
checked against plain); the unit of comparison is the item: per item the effective
tok/s (decode and drafting seconds, prefill excluded, as ``bench``) of one cell over another, their
geometric mean with a 95% bootstrap interval over items (``promptlookup.measure.bench``'s ``geomean`` and
``bootstrap_ci``). The share of tokens that came from grammar drafts is reported per cell, and
whether every speculative run gave the plain run's tokens (greedy: it must).

The lead's run (issue 43: 30 + 30 on Qwen2.5-Coder-1.5B and the bundled model, in one run: ``-m``
repeats and ``--hermes-copy`` adds the bundled model, see below; the models run one after another,
each on the same items, and the table has a row per model and set; on a shared 2-core machine use
``GOMP_SPINCOUNT=1000``, docs/setup.md; the BFCL schemas as they are, then closed as OpenAI's strict
mode closes them, where more is forced)::

    GOMP_SPINCOUNT=1000 PYTHONPATH=src .venv/bin/python benchmarks/grammar_drafts.py -m qwen2.5-coder-1.5b \\
        --hermes-copy --tool-items 30 --schema-items 30 -t 2 --md grammar_drafts.md \\
        --jsonl grammar_drafts.jsonl
    GOMP_SPINCOUNT=1000 PYTHONPATH=src .venv/bin/python benchmarks/grammar_drafts.py -m qwen2.5-coder-1.5b \\
        --tool-items 30 --schema-items 30 -t 2 --strict --md grammar_drafts_1.5b_strict.md

The bundled SmolLM2 has no tool template: ``--hermes-copy`` runs on its copy with a Hermes template
(``tests/tool_gguf.py``; the model was never trained on tools, but forced calls always parse)::

    PYTHONPATH=src .venv/bin/python benchmarks/grammar_drafts.py --hermes-copy --tool-items 4 --schema-items 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))

from real.common import WorkloadError, read_jsonl, workloads_root  # noqa: E402

CELLS = ("grammar", "nogrammar", "off")
SCHEMA_SYSTEM = ("Reply with only the JSON arguments of a call to the function `{name}` that does what the "
                 "user asks.")


@dataclass
class Item:
    kind: str  # "tool" or "schema"
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    schema: dict[str, Any] | None = None


@dataclass
class Run:
    model: str
    item: str
    kind: str
    cell: str
    tokens: int
    decodes: int
    grammar_tokens: int
    accepted_tokens: int
    drafted_tokens: int
    decode_s: float
    draft_s: float
    effective_tps: float
    finish_reason: str
    identical: bool | None = None
    ids: tuple[int, ...] = ()


def _first_call(truth: Sequence[Sequence[str]], turn: int) -> str | None:
    calls = truth[turn] if turn < len(truth) else []
    return calls[0].split("(", 1)[0].strip() if calls else None


def strict(schema: Any) -> Any:
    """``schema`` as OpenAI's strict mode wants it: every object closed (``additionalProperties:
    false``) with all its properties required, recursively. BFCL's schemas leave objects open, so a
    small model invents keys where nothing is forced; strict schemas are what structured-output
    users send."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if out.get("type") == "object" and isinstance(out.get("properties"), dict):
        out["additionalProperties"] = False
        out["required"] = sorted(out["properties"])
    return out


def items_from(tasks: list[dict[str, Any]], n_tool: int, n_schema: int, closed: bool = False) -> list[Item]:
    """Up to ``n_tool`` tool items and ``n_schema`` schema items, one per (task, turn with a ground-truth
    call), tasks in file order, turns in order, alternating kinds so that both sets span the tasks;
    ``closed``: every schema (tools' parameters too) made :func:`strict`."""
    from promptlookup.errors import RequestError
    from promptlookup.grammar import Grammar

    pairs = []
    for task in tasks:
        for turn, msgs in enumerate(task["turns"]):
            name = _first_call(task.get("ground_truth") or [], turn)
            user = [m for m in msgs if m.get("role") == "user"]
            if name and user:
                pairs.append((task, turn, name, user[-1]["content"]))
    out: list[Item] = []
    n = {"tool": 0, "schema": 0}
    want = {"tool": n_tool, "schema": n_schema}
    for i, (task, turn, name, text) in enumerate(pairs):
        tools = task["tools"]
        if closed:
            tools = [{**t, "function": {**t["function"], "parameters": strict(t["function"]["parameters"])}}
                     for t in tools]
        by_name = {t["function"]["name"]: t for t in tools}
        for kind in (("tool", "schema") if i % 2 == 0 else ("schema", "tool")):
            if n[kind] >= want[kind]:
                continue
            key = f"{task['id']}#{turn}"
            if kind == "tool":
                choice: Any = ("required" if n["tool"] % 2 else
                               {"type": "function", "function": {"name": name}})
                out.append(Item("tool", key, [{"role": "user", "content": text}], tools=tools,
                                tool_choice=choice))
            else:
                schema = by_name[name]["function"]["parameters"] if name in by_name else None
                if schema is None:
                    continue
                try:
                    Grammar.json_schema(schema)
                except RequestError:
                    continue  # a schema llguidance cannot enforce: not an item
                system = {"role": "system", "content": SCHEMA_SYSTEM.format(name=name)}
                out.append(Item("schema", key, [system, {"role": "user", "content": text}], schema=schema))
            n[kind] += 1
            break
        if n["tool"] >= n_tool and n["schema"] >= n_schema:
            break
    return out


def run_item(engine: Any, item: Item, cell: str, max_tokens: int, sampling: dict[str, Any],
             model: str = "") -> Run:
    fields: dict[str, Any] = dict(max_tokens=max_tokens, **sampling)
    if cell == "off":
        fields["speculate"] = "off"
    if cell == "nogrammar":
        fields["grammar_drafts"] = False
    if item.kind == "tool":
        fields.update(tools=item.tools, tool_choice=item.tool_choice)
    else:
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "args", "schema": item.schema}}
    c = engine.chat(item.messages, **fields)
    k = c.counters
    return Run(model, item.id, item.kind, cell, k.generated_tokens, k.decodes, k.grammar_tokens,
               k.accepted_tokens, k.drafted_tokens, k.decode_s, k.draft_s, k.effective_tps, c.finish_reason,
               ids=tuple(c.tokens))


def median_run(tries: Sequence[Run]) -> Run:
    """The run of median tok/s among one cell's tries of an item (the lower of the middle two for an
    even count: a run that happened, not an average of two)."""
    if not tries:
        raise ValueError("no runs to take the median of")
    ranked = sorted(tries, key=lambda r: r.effective_tps)
    return ranked[(len(ranked) - 1) // 2]


def table(runs: list[Run]) -> str:
    """Per model and set (tool, schema): per-item paired ratios' geometric means with 95% bootstrap
    intervals, each cell's pooled rate and grammar share, and identical-to-plain counts."""
    head = ("| model | set | items | grammar vs nogrammar (95% CI) | grammar vs off (95% CI) | "
            "nogrammar vs off (95% CI) | pooled tok/s grammar / nogrammar / off | "
            "tokens from grammar drafts | identical to plain |")
    out = [head, "|" + "---|" * 9]
    for model in dict.fromkeys(r.model for r in runs):
        for kind in ("tool", "schema"):
            mine = [r for r in runs if r.kind == kind and r.model == model]
            if mine:
                out.append(f"| {model} | {kind} | " + _set_row(mine))
    return "\n".join(out)


def _set_row(mine: list[Run]) -> str:
    """One model's one set, from its items' count to its identical-to-plain count."""
    from promptlookup.measure.bench import bootstrap_ci, geomean

    by = {(r.item, r.cell): r for r in mine}
    items = list(dict.fromkeys(r.item for r in mine))
    cols = []
    for a, b in (("grammar", "nogrammar"), ("grammar", "off"), ("nogrammar", "off")):
        ratios = [by[i, a].effective_tps / by[i, b].effective_tps for i in items
                  if (i, a) in by and (i, b) in by
                  and by[i, a].effective_tps > 0 and by[i, b].effective_tps > 0]
        if ratios:
            lo, hi = bootstrap_ci(ratios)
            cols.append(f"{geomean(ratios):.3f}x ({lo:.3f}-{hi:.3f}, n={len(ratios)})")
        else:
            cols.append("-")
    rates = []
    for cell in CELLS:
        rs = [r for r in mine if r.cell == cell]
        spent = sum(r.decode_s + r.draft_s for r in rs)
        rates.append(f"{sum(r.tokens for r in rs) / spent:.2f}" if spent > 0 else "-")
    g = [r for r in mine if r.cell == "grammar"]
    share = (f"{sum(r.grammar_tokens for r in g)}/{sum(r.tokens for r in g)} "
             f"({100 * sum(r.grammar_tokens for r in g) / max(1, sum(r.tokens for r in g)):.1f}%)")
    known = [r.identical for r in mine if r.identical is not None]
    return (f"{len(items)} | {cols[0]} | {cols[1]} | {cols[2]} | {' / '.join(rates)} | "
            f"{share} | {sum(known)}/{len(known)} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[],
                    help="model name or GGUF, repeatable: the models run one after another in this run "
                         "(default: the bundled one)")
    ap.add_argument("--hermes-copy", action="store_true",
                    help="also (or only) the bundled model with a Hermes tool template (tests/tool_gguf.py), "
                         "after the -m models")
    ap.add_argument("--items", type=Path,
                    help="the agents items.jsonl (default <workloads>/real/agents/items.jsonl)")
    ap.add_argument("--tool-items", type=int, default=30)
    ap.add_argument("--schema-items", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every cell this many times per item and keep its median run: short answers "
                         "take a second or two, and one slow spell of a shared host moves a single run's "
                         "ratio by 30%%")
    ap.add_argument("--strict", action="store_true",
                    help="close every object of the schemas and tools' parameters (OpenAI's strict mode)")
    ap.add_argument("--speculate", default="auto", help="the speculating cells' --speculate (default auto)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=8192)
    ap.add_argument("--md", type=Path, help="write the table (and the command) here")
    ap.add_argument("--jsonl", type=Path, help="write every run here (rewritten after each item)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        tasks = read_jsonl(args.items or workloads_root() / "real" / "agents" / "items.jsonl")
    except WorkloadError as exc:
        print(f"grammar_drafts: error: {exc} (build it: python benchmarks/workloads/real/build.py agents)",
              file=sys.stderr)
        return 2
    items = items_from(tasks, args.tool_items, args.schema_items, args.strict)
    from promptlookup.api import Engine, load_backend
    from promptlookup.errors import RequestError
    from promptlookup.fileio import atomic_write_text

    models: list[str | None] = list(args.model)
    if args.hermes_copy:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from tool_gguf import hermes_gguf

        models.append(str(hermes_gguf()))
    sampling: dict[str, Any] = {"temperature": args.temperature}
    if args.temperature > 0:
        sampling["seed"] = args.seed
    runs: list[Run] = []
    names: list[str] = []
    t0 = time.perf_counter()
    for model in models or [None]:
        backend = load_backend(model, n_ctx=args.ctx, threads=args.threads)
        name = backend.model_path.name
        names.append(f"{name}, {backend.n_threads} threads")
        # one set of engines per round: an engine drafts from its earlier answers, so a cell's second
        # try of an item on the first try's engine would copy its own answer
        rounds = [{cell: Engine.from_backend(backend, speculate=args.speculate if cell != "off" else "off")
                   for cell in CELLS} for _ in range(args.repeats)]
        for n, item in enumerate(items):
            order = CELLS[n % 3 :] + CELLS[: n % 3]  # the cells' order rotates: drift is shared
            tries: dict[str, list[Run]] = {cell: [] for cell in CELLS}
            try:
                for engines in rounds:  # the cells take turns, so a slow spell falls on all of them
                    for cell in order:
                        tries[cell].append(run_item(engines[cell], item, cell, args.max_tokens, sampling,
                                                    name))
            except RequestError as exc:  # a model that cannot take the item (no tool template): say so
                print(f"grammar_drafts: error: {name}: {item.kind} item {item.id}: {exc}", file=sys.stderr)
                backend.close()
                return 2
            got = {cell: median_run(tries[cell]) for cell in CELLS}
            for cell in CELLS:
                r = got[cell]
                r.identical = None if cell == "off" else all(t.ids == got["off"].ids for t in tries[cell])
                runs.append(r)
            g = got["grammar"]
            print(f"[{name} {n + 1}/{len(items)}] {item.kind} {item.id}: {g.tokens} tokens, "
                  f"{g.grammar_tokens} from the grammar; tok/s "
                  + " / ".join(f"{got[c].effective_tps:.1f}" for c in CELLS)
                  + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            if args.jsonl:
                atomic_write_text(args.jsonl, "".join(json.dumps({**asdict(r), "ids": list(r.ids)}) + "\n"
                                                      for r in runs))
        backend.close()  # shared by the engines: closed once, before the next model loads
    text = table(runs)
    print(text)
    if args.md:
        words = sys.argv[1:] if argv is None else list(argv)
        cmd = "PYTHONPATH=src python benchmarks/grammar_drafts.py " + " ".join(words)
        med = statistics.median(r.tokens for r in runs) if runs else 0
        atomic_write_text(args.md, f"{text}\n\n`{cmd}`; models {'; '.join(names)}; median {med:g} tokens "
                                   f"per answer; {time.perf_counter() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
