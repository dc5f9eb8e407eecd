"""Tool calls the template did not teach: a reply that is only JSON calls of declared tools.

Why. Small tool-trained models often answer ``tool_choice: "auto"`` with the call in a fenced block
(```` ```json {"name": "get_weather", "arguments": {...}} ``` ````) or as a bare object, not in their
template's ``<tool_call>`` tags (Qwen2.5-Coder 0.5B and 1.5B do so on most prompts: docs/agents.md).
Returned as text, such a call stalls an agent; llama-server's generic fallback reads it as a call, and
so does this module, under one narrow rule:

- the whole reply, less surrounding whitespace, is one or more *items* separated by whitespace;
- an item is a JSON object, bare or in a fence (three backticks, an optional ``json`` tag, the
  object, three backticks);
- each object has the keys ``name`` (a tool of the request) and one of ``arguments`` or
  ``parameters`` (an object, or JSON text of one), no other key, and no key twice.

Anything else -- an undeclared name, another key, a second value in a fence -- is the model's text.
A stream holds the reply back only while it can still become such a call (:func:`possible`: a prefix
scanner of the rule, which also looks at the keys and the name as they come); from the first
character that rules it out, the text is released, so a plain answer streams from its first word.

**Calls in prose** (:func:`parse_mixed`): the same models, once a conversation has tool results in it,
often explain a call around its block ("I'll list the stocks first: ```json {...}``` This returns
..."; Qwen2.5-Coder-1.5B from the second BFCL turn on: docs/results.md). So a *fenced* item that is a
call (the rule above, for one fence) is a call wherever it stands; the text outside such fences is
the reply's content (before and after, joined as written). A bare object in prose stays text (an
example or a result quoted), as does any other fence (code, a JSON result). A stream releases prose up
to the first fence that may still be a call (:func:`mixed_hold`); from a fence that is one, it holds
the rest until the end, where the content is sent whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from promptlookup.tools import Tool, ToolCall, call_of

FENCE = "```"
LANGS = ("", "json")  # a fence's tag, compared without case
KEYS = ("name", "arguments", "parameters")
ARG_KEYS = ("arguments", "parameters")
_WS = re.compile(r"\s*")
_LANG = re.compile(r"[A-Za-z]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]+|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_CUT_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?")  # an escape the end of the text cut
_WORD = re.compile(r"[A-Za-z0-9+\-.]*")  # a literal or a number


def parse(text: str, tools: Sequence[Tool]) -> list[ToolCall] | None:
    """The calls of a reply that follows the module's rule; None when it does not."""
    calls: list[ToolCall] = []
    pos = _WS.match(text).end()
    if pos == len(text):
        return None
    while pos < len(text):
        fenced = text.startswith(FENCE, pos)
        if fenced:
            lang = _LANG.match(text, pos + len(FENCE))
            if lang.group().lower() not in LANGS:
                return None
            pos = _WS.match(text, lang.end()).end()
        if not text.startswith("{", pos):
            return None
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        call = _call(obj, tools)
        if call is None:
            return None
        calls.append(call)
        pos = _WS.match(text, pos).end()
        if fenced:
            if not text.startswith(FENCE, pos):
                return None
            pos = _WS.match(text, pos + len(FENCE)).end()
    return calls


def _call(obj: Any, tools: Sequence[Tool]) -> ToolCall | None:
    if not isinstance(obj, dict) or not set(obj) <= set(KEYS) or sum(k in obj for k in ARG_KEYS) != 1:
        return None
    return call_of(obj, tools, ARG_KEYS)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict, refused where a key repeats (which value was meant?)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key is repeated")
    return out


def _no_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity; JSON has neither."""
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_no_constant)


def possible(text: str, names: Sequence[str]) -> bool:
    """Whether ``text`` may still grow into a reply :func:`parse` reads as calls of tools named
    ``names`` (True for every prefix of such a reply; False once no continuation can be one)."""
    pos = _WS.match(text).end()
    while pos < len(text):
        rest = text[pos:]
        fenced = rest.startswith(FENCE)
        if not fenced and FENCE.startswith(rest):
            return True  # the beginning of a fence
        if fenced:
            lang = _LANG.match(text, pos + len(FENCE))
            tag = lang.group().lower()
            if lang.end() == len(text):
                return any(x.startswith(tag) for x in LANGS)
            if tag not in LANGS:
                return False
            pos = _WS.match(text, lang.end()).end()
            if pos == len(text):
                return True
        if text[pos] != "{":
            return False
        scan = _scan(text, pos)
        if scan.bad or not _top_ok(scan, names):
            return False
        if scan.end is None:
            return True  # the object goes on
        try:
            obj = _DECODER.decode(text[pos:scan.end])
        except ValueError:
            return False
        if _call(obj, [Tool(n, {}) for n in names]) is None:
            return False
        pos = _WS.match(text, scan.end).end()
        if fenced:
            rest = text[pos:]
            if not rest.startswith(FENCE):
                return FENCE.startswith(rest)  # the closing fence may still come
            pos = _WS.match(text, pos + len(FENCE)).end()
    return True


def fence_at(text: str, p: int, names: Sequence[str]) -> tuple[str, int, int, int]:
    """The fence that opens at ``text[p]`` (three backticks), judged as far as the text goes:
    ``("call", end, a, b)`` when it is a closed fence around one call of a tool named ``names``
    (``end`` after its closing fence, the object at ``text[a:b]``), ``("open", ...)`` while it may
    still become one, ``("text", end, ...)`` once it cannot (``end`` after its closing fence, the
    first one after the opening; ``len(text)`` while it is not closed). "text" is final: no
    continuation makes such a fence a call."""
    n = len(text)

    def other() -> tuple[str, int, int, int]:
        close = text.find(FENCE, p + len(FENCE))
        return "text", (close + len(FENCE) if close >= 0 else n), -1, -1

    lang = _LANG.match(text, p + len(FENCE))
    tag = lang.group().lower()
    if lang.end() == n:
        return ("open", n, -1, -1) if any(x.startswith(tag) for x in LANGS) else other()
    if tag not in LANGS:
        return other()
    a = _WS.match(text, lang.end()).end()
    if a == n:
        return "open", n, -1, -1
    if text[a] != "{":
        return other()
    scan = _scan(text, a)
    if scan.bad or not _top_ok(scan, names):
        return other()
    if scan.end is None:
        return "open", n, -1, -1
    b = scan.end
    try:
        obj = _DECODER.decode(text[a:b])
    except ValueError:
        return other()
    if _call(obj, [Tool(x, {}) for x in names]) is None:
        return other()
    q = _WS.match(text, b).end()
    if text.startswith(FENCE, q):
        return "call", q + len(FENCE), a, b
    if FENCE.startswith(text[q:]):
        return "open", n, a, b
    return other()


def mixed_hold(text: str, names: Sequence[str]) -> int:
    """How much of ``text`` a stream may release as content under :func:`parse_mixed`: all of it up
    to the first fence that is, or may still become, a call of a tool named ``names`` (or backticks at
    the end that may open one). Never goes back as the text grows."""
    i = 0
    while True:
        p = text.find(FENCE, i)
        if p < 0:
            return i + len(text[i:].rstrip("`"))  # one or two backticks at the end may open a fence
        status, end, _, _ = fence_at(text, p, names)
        if status != "text":
            return p
        if end >= len(text):
            return len(text)  # inside a fence that is not a call: its backticks close it
        i = end


def parse_mixed(text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]] | None:
    """A reply's fenced calls wherever they stand, and its content: the text outside them, joined
    as written; None when no fence in it is a call."""
    names = [t.name for t in tools]
    content: list[str] = []
    calls: list[ToolCall] = []
    i = 0
    while True:
        p = text.find(FENCE, i)
        if p < 0:
            content.append(text[i:])
            break
        status, end, a, b = fence_at(text, p, names)
        call = _call(_DECODER.decode(text[a:b]), tools) if status == "call" else None
        if call is None:  # another fence, one still open at the end, or a call the tools refuse
            content.append(text[i:end])
            i = end
            continue
        content.append(text[i:p])
        calls.append(call)
        i = end
    return ("".join(content), calls) if calls else None


def _top_ok(scan: _Scan, names: Sequence[str]) -> bool:
    """Whether the top-level keys and values seen so far may still make a call."""
    if any(k not in KEYS for k in scan.keys) or len(set(scan.keys)) != len(scan.keys):
        return False
    if sum(k in scan.keys for k in ARG_KEYS) > 1:
        return False
    if scan.partial_key is not None and not any(k.startswith(scan.partial_key) for k in KEYS):
        return False
    for key, first in scan.starts.items():
        if key == "name" and first != '"' or key in ARG_KEYS and first not in '{"':
            return False
    if scan.name is not None and scan.name not in names:
        return False
    return scan.partial_name is None or any(n.startswith(scan.partial_name) for n in names)


@dataclass
class _Scan:
    """What :func:`_scan` saw of one JSON object: where it ends (None: not yet), whether it broke
    JSON's syntax, and its top-level keys, the first character of each of their values, and the
    ``name`` value (whole, or the part written so far)."""

    end: int | None = None
    bad: bool = False
    keys: list[str] = field(default_factory=list)
    partial_key: str | None = None
    starts: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    partial_name: str | None = None


def _scan(text: str, pos: int) -> _Scan:
    """Scan the JSON object at ``text[pos]`` (a ``{``) as far as the text goes."""
    out = _Scan()
    stack: list[str] = []
    expect = "value"  # value | key | colon | comma ("key" and "value" also allow a close where legal)
    may_close = False
    key: str | None = None  # the top-level key whose value comes next
    i, n = pos, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        depth = len(stack)
        if expect == "value":
            if may_close and c == "]":
                stack.pop()
                i += 1
                expect, may_close = "comma", False
            elif depth == 0 and c != "{":
                out.bad = True
                return out
            elif c in "{[":
                if depth == 1 and key is not None:
                    out.starts[key] = c
                stack.append(c)
                i += 1
                expect, may_close = ("key", True) if c == "{" else ("value", True)
            elif c == '"':
                if depth == 1 and key is not None:
                    out.starts[key] = c
                end, body, ok = _string(text, i)
                if not ok:
                    out.bad = True
                    return out
                if depth == 1 and key == "name":
                    if end is None:
                        out.partial_name = None if "\\" in body else body
                    else:
                        out.name = _decoded(body)
                if end is None:
                    return out
                i, expect, may_close = end, "comma", False
            else:
                if depth == 1 and key is not None:
                    out.starts[key] = c
                m = _WORD.match(text, i)
                word = m.group()
                if m.end() == n:  # a literal or number still being written
                    if not (_NUMBER_PREFIX.fullmatch(word) or any(w.startswith(word) for w in
                                                                  ("true", "false", "null"))):
                        out.bad = True
                    return out
                if not (word in ("true", "false", "null") or _NUMBER.fullmatch(word)):
                    out.bad = True
                    return out
                i, expect, may_close = m.end(), "comma", False
        elif expect == "key":
            if may_close and c == "}":
                stack.pop()
                i += 1
                expect, may_close = "comma", False
                if not stack:
                    out.end = i
                    return out
                continue
            if c != '"':
                out.bad = True
                return out
            end, body, ok = _string(text, i)
            if not ok:
                out.bad = True
                return out
            if end is None:
                if depth == 1 and "\\" not in body:
                    out.partial_key = body
                return out
            if depth == 1:
                key = _decoded(body) or ""
                out.keys.append(key)
            i, expect = end, "colon"
        elif expect == "colon":
            if c != ":":
                out.bad = True
                return out
            i, expect, may_close = i + 1, "value", False
        else:  # comma or close
            top = stack[-1]
            if c == ",":
                i += 1
                expect, may_close = ("key", False) if top == "{" else ("value", False)
            elif c == ("}" if top == "{" else "]"):
                stack.pop()
                i += 1
                if not stack:
                    out.end = i
                    return out
            else:
                out.bad = True
                return out
            if len(stack) == 1 and top == "{" and expect == "key":
                key = None
    return out


def _string(text: str, i: int) -> tuple[int | None, str, bool]:
    """The JSON string at ``text[i]`` (a quote): (its end, or None if it goes on; its raw body so far,
    less an escape cut by the end; whether it is valid JSON so far). A regular expression walks the
    body, since a call's arguments may be a whole file."""
    j = _STRING_BODY.match(text, i + 1).end()
    if j == len(text):
        return None, text[i + 1:j], True
    if text[j] == '"':
        return j + 1, text[i + 1:j], True
    if _CUT_ESCAPE.fullmatch(text, j):
        return None, text[i + 1:j], True
    return None, "", False  # a bad escape or a control character


def _decoded(raw: str) -> str | None:
    """A JSON string's raw body decoded (None: it cannot be)."""
    if "\\" not in raw:
        return raw
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return None
