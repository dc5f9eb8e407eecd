"""The package's import graph: no cycles, and no module imports another's private names.

Why: a cycle (even one hidden in a function-level import) means two modules are one module in two
files, and a private name used across modules is a contract nobody declared. Every import
statement counts, wherever it sits in the file.
"""

from __future__ import annotations

import ast
import pathlib

import promptlookup

ROOT = pathlib.Path(promptlookup.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["promptlookup", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, list[str], int]]:
    """(imported promptlookup module, names taken from it, line) for every import statement."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("promptlookup")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(
                "promptlookup"):
            names = []
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in MODULES:  # ``from promptlookup.pkg import module``
                    out.append((sub, [], node.lineno))
                else:
                    names.append(a.name)
            if names:
                out.append((node.module, names, node.lineno))
    return out


def _module_attributes(path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(module, attribute, line) for every ``alias.name`` where ``alias`` is an imported package module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    aliases[a.asname] = a.name
    return [(aliases[n.value.id], n.attr, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases]


def _graph() -> dict[str, set[str]]:
    return {name: {m for m, _, _ in _imports(name, path) if m in MODULES and m != name}
            for name, path in MODULES.items()}


def test_the_walk_sees_the_package():
    assert {"promptlookup.speculate", "promptlookup.cli", "promptlookup.drafting.spec"} <= set(MODULES)
    assert "promptlookup.drafting.base" in _graph()["promptlookup.speculate"]


def test_no_private_names_cross_modules():
    bad = [f"{MODULES[name].relative_to(ROOT)}:{line}: from {mod} import {n}"
           for name, path in MODULES.items() for mod, names, line in _imports(name, path)
           if mod != name for n in names if n.startswith("_") and not n.startswith("__")]
    bad += [f"{MODULES[name].relative_to(ROOT)}:{line}: {mod}.{attr}"
            for name, path in MODULES.items() for mod, attr, line in _module_attributes(path)
            if mod != name and attr.startswith("_") and not attr.startswith("__")]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_drafting_imports_neither_the_loop_nor_a_backend():
    """Sources are pure code over token ids: the loop imports them, never the other way round (the
    one vocabulary, ``drafting/spec.py``, included; MAX_DRAFT lives in ``drafting/base.py`` for it)."""
    graph = _graph()
    bad = [f"{name} imports {m}" for name in graph if name.startswith("promptlookup.drafting")
           for m in graph[name] if m == "promptlookup.speculate" or m.startswith("promptlookup.backends")]
    assert not bad, "\n".join(bad)


def _unit(module: str) -> str:
    """The package a module belongs to (``promptlookup.drafting.ngram.index`` -> ``drafting``); a
    top-level module (``api``, ``costcurve``...) is a unit of its own, so a cycle through one counts."""
    parts = module.split(".")
    inside = len(parts) > 2 or MODULES[module].name == "__init__.py"
    return parts[1] if inside and len(parts) > 1 else module


def _unit_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, deps in _graph().items():
        unit = _unit(name)
        out.setdefault(unit, set()).update(u for u in map(_unit, deps) if u != unit)
    return out


def _reach(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every unit each unit reaches, directly or through others (a transitive closure)."""
    reach = {u: set(deps) for u, deps in graph.items()}
    changed = True
    while changed:
        changed = False
        for seen in reach.values():
            more = set().union(*(reach.get(v, set()) for v in seen)) - seen
            if more:
                seen |= more
                changed = True
    return reach


def test_drafting_backends_and_measure_form_no_package_cycle():
    """The layers stay layers: ``measure`` replays and times drafting on backends, so neither
    ``drafting`` nor ``backends`` may import ``measure``, nor reach it through another package or a
    top-level module, not even in a function-level import (every import statement counts, see
    :func:`_imports`). What they share (the verify cost curve) lives in a top-level module of its
    own, :mod:`promptlookup.costcurve`."""
    reach = _reach(_unit_graph())
    bad = sorted(f"{p} reaches {q}, which reaches it back" for p in ("drafting", "backends", "measure")
                 for q in reach[p] if q != p and p in reach.get(q, ()))
    assert not bad, "package cycles:\n" + "\n".join(bad)
    assert "measure" not in reach["drafting"] | reach["backends"]
    assert "backends" not in reach["drafting"]


def test_the_package_graph_sees_function_level_imports():
    """The walk counts an import inside a function: ``api`` reaches ``drafting.suffix.history`` only
    from inside ``Engine._bind``; units are packages, or top-level modules on their own."""
    assert "promptlookup.drafting.suffix.history" in _graph()["promptlookup.api"]
    assert _unit("promptlookup.drafting.ngram.index") == "drafting" == _unit("promptlookup.drafting")
    assert _unit("promptlookup.costcurve") == "promptlookup.costcurve"
    assert {"drafting", "backends", "measure"} <= set(_unit_graph())
