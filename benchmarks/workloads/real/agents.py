"""Agents: BFCL's multi-turn tasks (``bfcl-eval``, Apache-2.0), with their tools as OpenAI tools.

A task is several user turns against one or more simulated APIs (a file system, a trading bot, a
travel booking, a vehicle, messaging, tweets, tickets, maths) from an initial state; the agent calls
tools until it answers, each call runs in BFCL's simulator (``eval_checker/multi_turn_eval/
func_source_code``) and its result comes back as a ``role: tool`` message. Every request re-sends
the whole conversation, tool results included: what prompt lookup drafts from in agent traffic.

Two categories: ``multi_turn_base`` and ``multi_turn_miss_func`` (a tool is held out until a later
turn, whose user message is then BFCL's "I have updated some more functions..."; the turn before
it has no ground-truth call, since the model could not make it). The ground truth calls per turn
come from ``data/possible_answer``; BFCL's checker compares the simulators' states after each turn
(see benchmarks/agent_real.py).

Schemas: BFCL's function docs say ``dict`` (and ``float``, ``tuple``, ``any``) where JSON schema
says ``object`` (``number``, ``array``, ``string``), the same mapping as BFCL's own OpenAI handler
(``GORILLA_TO_OPENAPI``); a type outside it is an error naming the function. A doc's ``response``
(what the function returns) is not part of an OpenAI tool and is left out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from real.common import WorkloadError, field, read_jsonl, seeded_pick

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func")
DATA_VERSION = "BFCL_v4"
# class -> its function-doc file (bfcl_eval.constants.executable_backend_config, the multi-turn ones)
FUNC_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
TYPES = {"dict": "object", "object": "object", "float": "number", "number": "number", "integer": "integer",
         "int": "integer", "string": "string", "str": "string", "boolean": "boolean", "bool": "boolean",
         "array": "array", "list": "array", "tuple": "array", "any": "string"}
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


@dataclass(frozen=True)
class Bounds:
    max_tools_chars: int = 17000  # all the task's tools as JSON, held-out ones included


def json_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """A BFCL parameter schema as JSON schema: every ``type`` mapped by :data:`TYPES`, recursively
    through ``properties`` and ``items``; other keys (description, enum, default, required) kept."""
    out = dict(schema)
    if "type" in out:
        t = out["type"]
        if t not in TYPES:
            raise WorkloadError(f"{where}: unknown type {t!r} (known: {', '.join(sorted(TYPES))})")
        out["type"] = TYPES[t]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: json_schema(v, f"{where}.{k}") for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = json_schema(out["items"], f"{where}[]")
    return out


def openai_tool(doc: dict[str, Any], where: str) -> dict[str, Any]:
    name = field(doc, "name", str, where)
    params = field(doc, "parameters", dict, f"{where} {name}")
    fn = {"name": name, "description": field(doc, "description", str, f"{where} {name}"),
          "parameters": {**json_schema(params, f"{where} {name}"), "type": "object"}}
    return {"type": "function", "function": fn}


def load_docs(doc_dir: Path, classes: list[str], where: str) -> list[dict[str, Any]]:
    out = []
    for cls in classes:
        if cls not in FUNC_DOCS:
            raise WorkloadError(f"{where}: unknown class {cls!r} (known: {', '.join(sorted(FUNC_DOCS))})")
        path = doc_dir / FUNC_DOCS[cls]
        out.extend(openai_tool(d, f"{path}:{i}") for i, d in enumerate(read_jsonl(path), 1))
    return out


def task(entry: dict[str, Any], truth: list[Any], doc_dir: Path, where: str) -> dict[str, Any]:
    """One task: its turns, state, tools (those held out moved to the turn that adds them) and the
    ground truth, checked for shape."""
    task_id = field(entry, "id", str, where)
    category = task_id.rsplit("_", 1)[0]
    turns = field(entry, "question", list, where)
    classes = field(entry, "involved_classes", list, where)
    tools = load_docs(doc_dir, classes, f"{where} ({task_id})")
    held_out: dict[str, list[dict[str, Any]]] = {}
    missed = field(entry, "missed_function", dict, where) if "missed_function" in entry else {}
    for turn, names in missed.items():
        if not turn.isdigit() or int(turn) >= len(turns) or turns[int(turn)]:
            raise WorkloadError(f"{where}: missed_function turn {turn!r} is not an empty turn of the task")
        for name in names:
            match = [t for t in tools if t["function"]["name"] == name]
            if not match:
                raise WorkloadError(f"{where}: missed function {name!r} is not among the task's tools")
            tools.remove(match[0])
            held_out.setdefault(turn, []).append(match[0])
    if len(truth) != len(turns):
        raise WorkloadError(f"{where}: {len(truth)} ground-truth turns for {len(turns)} question turns")
    if not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in truth):
        raise WorkloadError(f"{where}: ground truth is not a list of call strings per turn")
    return {"id": task_id, "workload": "agents", "category": category, "turns": turns,
            "initial_config": field(entry, "initial_config", dict, where), "involved_classes": classes,
            "tools": tools, "held_out": held_out, "ground_truth": truth,
            "meta": {"turns": len(turns), "tools": len(tools) + sum(map(len, held_out.values())),
                     "tools_chars": len(json.dumps(tools)) + len(json.dumps(held_out)),
                     "truth_calls": sum(map(len, truth))}}


def build(package: Path, per_category: int, seed: int, bounds: Bounds = Bounds(),
          categories: tuple[str, ...] = CATEGORIES) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``per_category`` tasks of each category within ``bounds`` (id order, then a shuffle seeded
    with the seed and the category, so the categories draw different task numbers),
    from the installed ``bfcl_eval`` package folder."""
    data = package / "data"
    if not data.is_dir():
        raise WorkloadError(f"{data}: no such folder (is bfcl-eval installed in the site?)")
    groups = {}
    for cat in categories:
        qpath = data / f"{DATA_VERSION}_{cat}.json"
        apath = data / "possible_answer" / f"{DATA_VERSION}_{cat}.json"
        truth = {}
        for i, a in enumerate(read_jsonl(apath), 1):
            truth[field(a, "id", str, f"{apath}:{i}")] = field(a, "ground_truth", list, f"{apath}:{i}")
        tasks = []
        for i, entry in enumerate(read_jsonl(qpath), 1):
            where = f"{qpath}:{i}"
            task_id = field(entry, "id", str, where)
            if task_id not in truth:
                raise WorkloadError(f"{where}: {task_id} has no ground truth in {apath}")
            t = task(entry, truth[task_id], data / "multi_turn_func_doc", where)
            if t["meta"]["tools_chars"] <= bounds.max_tools_chars:
                tasks.append(t)
        groups[cat] = sorted(tasks, key=lambda t: t["id"])
    picked = {cat: seeded_pick(ts, per_category, f"{seed}:{cat}") for cat, ts in groups.items()}
    items = [t for cat in categories for t in picked[cat]]
    if not items:
        raise WorkloadError(f"{data}: no task within the bounds {asdict(bounds)}")
    settings = {"seed": seed, "per_category": per_category, "categories": list(categories),
                "bounds": asdict(bounds), "source": "bfcl-eval==2026.3.23", "license": "Apache-2.0",
                "candidates": {cat: len(ts) for cat, ts in groups.items()}}
    return items, settings
