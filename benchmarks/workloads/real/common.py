"""What every builder shares: the cache layout, the item format, the seeded choice, and the error.

An item is one JSON object per line (``items.jsonl``): ``id``, ``workload``, ``prompt`` (one user
turn, wrapped in the model's chat template by whoever sends it), ``expected`` (the reference
answer: the new file, the reference summary; the agents' tasks carry their own fields instead) and
``meta`` (where it came from, its sizes). A workload folder also holds ``manifest.json`` (the
settings it was built with and each item's sizes) and ``prompts/NN-<stem>.txt``, one prompt per
file, which ``promptlookup bench -w FOLDER/prompts`` reads as it reads benchmarks/workloads.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from promptlookup.fileio import atomic_write_text, cache_dir

T = TypeVar("T")


class WorkloadError(ValueError):
    """Data a builder cannot use (a missing file, a field that is not there, nothing in bounds):
    one line naming the file and the problem."""


def workloads_root() -> Path:
    """``$PROMPTLOOKUP_WORKLOADS``, else ``<promptlookup cache>/workloads``: downloads, the installed
    site and the built workloads, never in the repository."""
    root = os.environ.get("PROMPTLOOKUP_WORKLOADS")
    return Path(root) if root else cache_dir() / "workloads"


def seeded_pick(items: Sequence[T], n: int, seed: int | str) -> list[T]:
    """``n`` of ``items`` (all when fewer), chosen by a shuffle seeded with ``seed``: the same
    sorted input and seed always give the same items in the same order (a string seed too: Python
    seeds from its SHA-512, not from the per-process string hash)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order[:n]


def round_robin(groups: dict[str, list[T]], n: int, seed: int) -> list[T]:
    """Up to ``n`` items taken one group at a time (groups in sorted order, each group shuffled
    with ``seed``), so every group is represented before any gives a second item."""
    queues = {k: seeded_pick(v, len(v), seed) for k, v in sorted(groups.items())}
    out: list[T] = []
    while len(out) < n and any(queues.values()):
        for k in list(queues):
            if queues[k] and len(out) < n:
                out.append(queues[k].pop(0))
    return out


def stem(index: int, text: str) -> str:
    """A file stem for item ``index``: its number and a filesystem-safe form of ``text``."""
    return f"{index:02d}-" + re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file; a line that is not a JSON object is an error naming it."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read ({exc.strerror})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{path}:{i}: a JSON {type(obj).__name__}, not an object")
        out.append(obj)
    return out


def field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]``, checked to be a ``kind``; else an error naming ``where`` and the field."""
    if key not in obj:
        raise WorkloadError(f"{where}: no field {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise WorkloadError(f"{where}: field {key!r} is a {type(value).__name__}, not a {names}")
    return value


def write_workload(out: Path, name: str, items: Sequence[dict[str, Any]], settings: dict[str, Any],
                   sizes: Iterable[dict[str, Any]]) -> Path:
    """Write ``out/name``: items.jsonl, manifest.json and (for items with a prompt) prompts/*.txt,
    each file atomically; prompts of an earlier build that this one no longer makes are removed.
    Keys keep the order the builder gave them: a tool's JSON is shown to the model as it is stored
    (``type``, then ``function`` with ``name``, ``description``, ``parameters``), not sorted."""
    folder = out / name
    prompts = folder / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "items.jsonl",
                      "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    manifest = {"workload": name, **settings, "items": list(sizes)}
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    keep = set()
    for i, it in enumerate(items):
        if "prompt" in it:
            path = prompts / f"{stem(i, it['id'])}.txt"
            atomic_write_text(path, it["prompt"])
            keep.add(path.name)
    for old in prompts.glob("*.txt"):
        if old.name not in keep:
            old.unlink()
    return folder
