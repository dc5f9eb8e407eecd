"""A ``.gitignore`` matcher with git's rules, so ``promptlookup index DIR`` skips what git skips.

Why our own: ``pathspec`` is not a dependency, and the rules needed are few and documented
(gitignore(5)): blank lines and ``#`` comments are skipped; ``\\`` escapes a leading ``#`` or ``!`` and
trailing spaces; ``!`` re-includes; a trailing ``/`` matches directories only; a pattern with a ``/``
at its start or middle is relative to its ``.gitignore``'s directory, one without matches a name at any
depth below it; ``*`` and ``?`` never cross ``/``; ``**`` in ``**/x``, ``x/**`` and ``a/**/b`` spans
directories; ``[...]`` is a character class (``[!...]`` negated). The last matching pattern wins, a
deeper ``.gitignore``'s after its parents', and an excluded directory is not entered (so, as in git, a
file below it cannot be re-included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    base: str  # directory of the .gitignore, relative to the walk's root ("" at the root), no slash
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return self.regex.fullmatch(rel) is not None


def _glob(pat: str) -> str:
    """A gitignore glob (no leading/trailing slash handling) as a regular expression body."""
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(pat[i + 1]))
            i += 2
            continue
        if c == "*":
            if pat.startswith("**", i):
                before_ok = i == 0 or pat[i - 1] == "/"
                j = i + 2
                if before_ok and j < n and pat[j] == "/":  # "**/": zero or more directories
                    out.append("(?:.*/)?")
                    i = j + 1
                    continue
                if before_ok and j == n:  # trailing "/**": everything inside
                    out.append(".*")
                    i = j
                    continue
                out.append("[^/]*")  # any other "**" is two plain stars
                i = j
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < n and pat[j] in "!^":
                j += 1
            if j < n and pat[j] == "]":
                j += 1
            while j < n and pat[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(re.escape(c))
            else:
                body = pat[i + 1 : j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_line(line: str, base: str = "") -> Rule | None:
    """One ``.gitignore`` line as a :class:`Rule` (None for a blank line or a comment)."""
    line = line.rstrip("\r\n")
    # trailing spaces are dropped unless escaped
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate or line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    if dir_only:
        line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _glob(line)
    if not anchored:
        body = "(?:.*/)?" + body
    return Rule(base, re.compile(body, re.DOTALL), negate, dir_only)


def parse(text: str, base: str = "") -> list[Rule]:
    """The rules of a ``.gitignore`` in directory ``base`` (relative to the walk's root)."""
    return [r for r in (parse_line(x, base) for x in text.splitlines()) if r is not None]


def ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    """Whether ``rel`` (a path relative to the walk's root, ``/``-separated) is ignored: the last
    matching rule decides."""
    for rule in reversed(rules):
        if rule.matches(rel, is_dir):
            return not rule.negate
    return False
