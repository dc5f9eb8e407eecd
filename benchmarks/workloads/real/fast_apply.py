"""Fast apply: the "apply this edit to this file" request that code editors send.

From two releases of a package (their sdists), every Python file that changed between them is a
candidate: the prompt gives the old file and the unified diff between the two, and asks for the
whole updated file back; the expected answer is the new file. The answer is mostly the file the
prompt holds, which is what prompt lookup drafts from.

Bounds keep an item inside a small model's context and a CPU's patience: the old file at least
``min_old_chars`` (a two-line file is no test), the new one at most ``max_new_chars``, the prompt at
most ``max_prompt_chars``. Items are taken one package at a time (each package's candidates in a
seeded shuffle), so every package is represented.
"""

from __future__ import annotations

import difflib
import tarfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from real.common import WorkloadError, round_robin

INSTRUCTION = ("Apply the edit below to the file `{path}` and reply with the whole updated file in one "
               "```python code block, nothing else.")


@dataclass(frozen=True)
class Bounds:
    min_old_chars: int = 1000
    max_new_chars: int = 7000
    max_prompt_chars: int = 9000


def sdist_sources(path: Path) -> dict[str, str]:
    """The ``.py`` files of an sdist (``.tar.gz`` or ``.zip``), keyed by their path below the
    sdist's top folder; a file that is not UTF-8 is left out (it is no text edit)."""
    raw: dict[str, bytes] = {}
    try:
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path, "r:gz") as tf:
                for m in tf.getmembers():
                    if m.isfile() and m.name.endswith(".py"):
                        f = tf.extractfile(m)
                        if f is not None:
                            raw[m.name] = f.read()
        elif path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    if name.endswith(".py") and not name.endswith("/"):
                        raw[name] = zf.read(name)
        else:
            raise WorkloadError(f"{path}: not an sdist (.tar.gz or .zip)")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise WorkloadError(f"{path}: unreadable sdist ({exc})") from None
    if not raw:
        raise WorkloadError(f"{path}: no .py file in the sdist")
    tops = sorted({name.split("/", 1)[0] for name in raw})
    if len(tops) != 1 or any("/" not in name for name in raw):
        raise WorkloadError(f"{path}: an sdist keeps its files under one top folder; found {tops[:3]}")
    out = {}
    for name, data in raw.items():
        try:
            out[name.split("/", 1)[1]] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def unified_diff(path: str, old: str, new: str) -> str:
    """The diff a developer would send: ``a/`` and ``b/`` paths, three lines of context."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
    out = []
    for line in lines:  # a last line without its newline still ends the diff's line
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def make_prompt(path: str, old: str, diff: str) -> str:
    return (f"{INSTRUCTION.format(path=path)}\n\nCurrent file:\n```python\n{old.rstrip(chr(10))}\n```\n\n"
            f"Edit (unified diff):\n```diff\n{diff}```\n")


def expected_answer(new: str) -> str:
    return f"```python\n{new.rstrip(chr(10))}\n```"


def candidates(package: str, old_sdist: Path, new_sdist: Path, old_version: str, new_version: str,
               bounds: Bounds) -> list[dict[str, Any]]:
    """Every changed file of this package within ``bounds``, as items, in path order."""
    old_files, new_files = sdist_sources(old_sdist), sdist_sources(new_sdist)
    out = []
    for path in sorted(set(old_files) & set(new_files)):
        old, new = old_files[path], new_files[path]
        if old == new or len(old) < bounds.min_old_chars or len(new) > bounds.max_new_chars:
            continue
        diff = unified_diff(path, old, new)
        prompt = make_prompt(path, old, diff)
        if len(prompt) > bounds.max_prompt_chars:
            continue
        out.append({
            "id": f"{package}-{old_version}-{new_version}:{path}",
            "workload": "fast_apply",
            "prompt": prompt,
            "expected": expected_answer(new),
            "meta": {"package": package, "old_version": old_version, "new_version": new_version,
                     "path": path, "old_chars": len(old), "new_chars": len(new), "diff_chars": len(diff),
                     "prompt_chars": len(prompt)},
        })
    return out


def build(pairs: dict[str, tuple[Path, Path]], versions: dict[str, tuple[str, str]], n: int, seed: int,
          bounds: Bounds = Bounds()) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``n`` items (fewer when fewer are in bounds) from the sdist ``pairs`` of each package, and the
    settings the manifest records. No item at all is an error: the bounds or the releases are wrong."""
    groups = {pkg: candidates(pkg, old, new, *versions[pkg], bounds) for pkg, (old, new) in pairs.items()}
    items = round_robin(groups, n, seed)
    if not items:
        raise WorkloadError(f"fast_apply: no changed .py file within the bounds {asdict(bounds)} "
                            f"in {', '.join(sorted(pairs)) or 'no package'}")
    settings = {"seed": seed, "n": n, "bounds": asdict(bounds), "license": "each package's own (see README)",
                "source": {pkg: f"{pkg} {a} -> {b}" for pkg, (a, b) in sorted(versions.items())},
                "candidates": {pkg: len(v) for pkg, v in sorted(groups.items())}}
    return items, settings
