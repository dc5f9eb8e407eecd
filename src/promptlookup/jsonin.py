"""JSON read from files we did not write ourselves: bounded before Python's parser sees it.

Why: ``json.loads`` turns a 400-digit number into an int that ``float()`` cannot take (OverflowError),
100,000 nested brackets into a RecursionError, and ``1e999`` into ``inf``; none of them is a
ValueError, so each surfaced as a traceback. Here the size, the nesting depth and every number are
checked first, and any problem is one :class:`JSONInputError` naming the file.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from promptlookup.errors import InputError

MAX_BYTES = 1 << 20  # our JSON files (cost curves) are a few hundred bytes
MAX_DEPTH = 32
MAX_NUMBER_CHARS = 40  # a float64 needs at most 17 significant digits plus sign and exponent

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class JSONInputError(InputError):
    """A JSON text that is too big, too deep, malformed or holds a number out of range."""


def _depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a malformed text may give any value; json decides)."""
    depth = top = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        top = max(top, depth)
    return top


def loads_bounded(text: str, name: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` with limits; every number comes back as a finite float or an int."""
    if len(text) > MAX_BYTES:
        raise JSONInputError(f"{name}: {len(text)} characters of JSON, more than the {MAX_BYTES} accepted")
    depth = _depth(text)
    if depth > max_depth:
        raise JSONInputError(f"{name}: JSON nested {depth} deep, more than the {max_depth} accepted")

    def number(s: str) -> float | int:
        if len(s) > MAX_NUMBER_CHARS:
            raise JSONInputError(f"{name}: a number of {len(s)} characters is out of range ({s[:12]}...)")
        value = float(s) if any(c in s for c in ".eE") else int(s)
        if not math.isfinite(value):
            raise JSONInputError(f"{name}: the number {s} is out of range")
        return value

    def constant(s: str) -> float:
        raise JSONInputError(f"{name}: {s} is not a number JSON allows")

    try:
        return json.loads(text, parse_float=number, parse_int=number, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"{name}: not valid JSON ({exc})") from None
    except RecursionError:  # cannot happen under the depth check; never a traceback if it does
        raise JSONInputError(f"{name}: JSON nested too deeply") from None
