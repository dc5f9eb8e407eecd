"""Tool calling through the model's own chat template: tools in, OpenAI ``tool_calls`` out.

Why the template decides. A model was trained to see tools and to call them in one textual form;
its GGUF carries the chat template that writes that form. So ``tools`` are handed to the template
(as Hugging Face's ``apply_chat_template(tools=...)`` does) and the reply is parsed in the format the
template teaches. A template whose text never mentions ``tools`` cannot show them to the model: a
request with tools is refused (400, ``param: "tools"``), never answered as if it had none.

Which format (:func:`detect_format`, from the template's text):

- ``hermes`` -- the template holds ``<tool_call>`` (Qwen 2.5/3, Hermes, SmolLM3 and most
  Llama-finetunes with tool support): each call is ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>``, after optional free text.
- ``llama3`` -- otherwise, a template that holds ``"parameters"`` (Llama 3.1/3.2/3.3's JSON-based
  tool calling): the whole reply is ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``), or a JSON list of such objects.
- anything else that mentions tools: refused, since we would not know how to read the reply.

Where a format's tag is one token of the vocabulary (Qwen2.5's ``<tool_call>``, id 151657), a forced
call's grammar asks for that token (:func:`tag_tokens`), and the reply's text writes it even where the
backend writes no text for a special token (:func:`tag_renderer`). Under ``auto``, a reply with no
call in the template's format that is only JSON calls of declared tools, bare or fenced, is calls too
(:mod:`promptlookup.lenient`): what small tool models mostly write.

``tool_choice``: ``auto`` (the default with tools) lets the model answer or call, and a reply that
does not parse as calls is its text (finish reason "stop"), never an error. ``required`` and a
named function are forced by a grammar (:meth:`ToolFormat.grammar`): the format's wrapper around a
JSON schema of ``{name, arguments}`` per allowed tool, so the one call the model makes always parses
and its arguments match the tool's ``parameters``; it is a token mask like ``response_format``
(:mod:`promptlookup.grammar`), exact under speculation for the same reasons. ``none`` still shows
the tools (as vLLM does by default: an agent's prompt, and the prefix cache it reuses, stays the same
from turn to turn) and returns the reply as text, never parsed; on a template without tool support
it leaves them out instead of refusing.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from promptlookup.errors import RequestError
from promptlookup.grammar import JSON_OPTIONS, MAX_SCHEMA_CHARS, Grammar

MAX_TOOLS = 128
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's rule for a function name (dots as vLLM's)
TOOL_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    parameters: Mapping[str, Any]
    description: str | None = None

    def for_template(self) -> dict[str, Any]:
        """OpenAI's tool object, as chat templates read it (``tool.function.name`` ...)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolChoice:
    """``mode``: none, auto, required or named (then ``name`` is the function's)."""

    mode: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        """Whether a grammar forces a call (required, named)."""
        return self.mode in ("required", "named")


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: OpenAI's ``{"id", "type": "function", "function": {"name", "arguments"}}``,
    with ``arguments`` JSON text (as OpenAI sends it)."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def parse_tools(value: Any, param: str = "tools") -> tuple[Tool, ...] | None:
    """OpenAI's ``tools`` list, checked (None or empty: no tools)."""
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(t, Tool) for t in value):
        return tuple(value) or None
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise RequestError(f"{param} must be a list of function tools", param)
    if len(value) > MAX_TOOLS:
        raise RequestError(f"{param}: at most {MAX_TOOLS} tools, got {len(value)}", param)
    tools: list[Tool] = []
    for i, item in enumerate(value):
        where = f"{param}.{i}"
        if not isinstance(item, Mapping) or item.get("type", "function") != "function":
            raise RequestError(f"{where}: only function tools are supported "
                               '({"type": "function", "function": {"name": ...}})', where)
        fn = item.get("function")
        if not isinstance(fn, Mapping):
            raise RequestError(f"{where}.function must be an object with a name", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise RequestError(f"{where}.function.name must be 1-64 letters, digits, _ . or -, got {name!r}",
                               f"{where}.function.name")
        if any(t.name == name for t in tools):
            raise RequestError(f"{where}.function.name: {name!r} is named twice", f"{where}.function.name")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise RequestError(f"{where}.function.parameters must be a JSON schema object",
                               f"{where}.function.parameters")
        if len(json.dumps(params)) > MAX_SCHEMA_CHARS:
            raise RequestError(f"{where}.function.parameters: over {MAX_SCHEMA_CHARS} characters",
                               f"{where}.function.parameters")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise RequestError(f"{where}.function.description must be text", f"{where}.function.description")
        tools.append(Tool(name, dict(params), desc))
    return tuple(tools) or None


def parse_tool_choice(value: Any, tools: Sequence[Tool] | None, param: str = "tool_choice") -> ToolChoice:
    """OpenAI's ``tool_choice`` against the request's tools (absent: auto with tools, none without)."""
    if isinstance(value, ToolChoice):
        choice = value
    elif value is None:
        choice = ToolChoice("auto" if tools else "none")
    elif isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise RequestError(f'{param} must be "none", "auto", "required" or '
                               f'{{"type": "function", "function": {{"name": ...}}}}, got {value!r}', param)
        choice = ToolChoice(value)
    elif isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        name = value["function"].get("name")
        if not isinstance(name, str):
            raise RequestError(f"{param}.function.name must be a function's name", param)
        choice = ToolChoice("named", name)
    else:
        raise RequestError(f'{param} must be "none", "auto", "required" or '
                           '{"type": "function", "function": {"name": ...}}', param)
    if choice.mode == "auto" and not tools:
        return ToolChoice("none")
    if choice.forced and not tools:
        raise RequestError(f"{param}: {choice.mode!r} needs tools, and the request has none", param)
    if choice.mode == "named" and not any(t.name == choice.name for t in tools or ()):
        known = ", ".join(t.name for t in tools or ())
        raise RequestError(f"{param}: no tool is named {choice.name!r} (the tools: {known})", param)
    return choice


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _json_literal(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text)


def _tag(text: str, tag_ids: Mapping[str, int]) -> str:
    """A tag in a lark grammar: its special token by id (llguidance's ``<[id]>``), else its text."""
    return f"<[{int(tag_ids[text])}]>" if text in tag_ids else _json_literal(text)


def _call_schema(tools: Sequence[Tool], args_key: str) -> dict[str, Any]:
    """The JSON schema of one call of any of ``tools``: ``{"name": <const>, args_key: parameters}``."""
    options = [{"type": "object",
                "properties": {"name": {"const": t.name}, args_key: dict(t.parameters)},
                "required": ["name", args_key], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


class ToolFormat(ABC):
    """How one family of templates has the model write a call; see the module doc."""

    name = ""
    args_key = "arguments"
    TAGS: tuple[str, ...] = ()  # the marker texts of a call (each one token in the model's vocabulary?)

    def grammar(self, tools: Sequence[Tool], choice: ToolChoice,
                tag_ids: Mapping[str, int] | None = None) -> Grammar:
        """The grammar of exactly one call of the allowed tool(s), refused by the tool's name when
        its parameters are no schema llguidance can enforce. ``tag_ids``: the format's tags that are
        one special token of the model's vocabulary (:func:`special_tags`), written in the grammar
        as that token, since a special token never matches text."""
        import llguidance

        allowed = [t for t in tools if choice.mode != "named" or t.name == choice.name]
        for i, t in enumerate(tools):  # every allowed schema checked alone, so the error names it
            if t in allowed:
                Grammar.json_schema(t.parameters, kind="tool", param=f"tools.{i}.function.parameters")
        body = "%json " + json.dumps(_call_schema(allowed, self.args_key))
        text = self.lark(body, dict(tag_ids or {}))
        try:
            grammar = llguidance.grammar_from("lark", text)
        except (ValueError, TypeError) as exc:
            raise RequestError(f"tools: {exc}", "tools") from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise RequestError(f"tools: the call's grammar cannot be enforced: {error}", "tools")
        return Grammar(grammar, f"tool_choice {choice.mode}")

    @abstractmethod
    def lark(self, call: str, tag_ids: Mapping[str, int]) -> str:
        """The lark grammar of this format's wrapper around ``call`` (the call's JSON rule), its tags
        in ``tag_ids`` written as their token."""

    @abstractmethod
    def safe_prefix(self, text: str) -> int:
        """How much of a reply's beginning is surely content (streamed as it comes): the rest may
        be the start of a call, and is held until the reply ends."""

    @abstractmethod
    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]] | None:
        """``(content, calls)`` when ``text`` holds calls of known tools in this format and nothing
        else after them; None otherwise (the reply is then plain content). ``content`` is the text
        before the first call, as it was streamed (a prefix of ``text``)."""


def call_of(obj: Any, tools: Sequence[Tool], keys: Sequence[str]) -> ToolCall | None:
    """A :class:`ToolCall` of a decoded ``{"name": ..., key: {...}}``, when it names a known tool."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if not any(t.name == obj["name"] for t in tools):
        return None
    args: Any = {}
    for key in keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


_DECODER = json.JSONDecoder()


class Hermes(ToolFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen, Hermes, ...)."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    TAGS = (OPEN, CLOSE)

    def lark(self, call: str, tag_ids: Mapping[str, int]) -> str:
        nl = _json_literal("\n")
        return (f"start: {_tag(self.OPEN, tag_ids)} {nl} call {nl} {_tag(self.CLOSE, tag_ids)}\n"
                f"call: {call}\n")

    def safe_prefix(self, text: str) -> int:
        at = text.find(self.OPEN)
        if at >= 0:
            return at
        for k in range(min(len(self.OPEN) - 1, len(text)), 0, -1):  # a tail that may begin the tag
            if self.OPEN.startswith(text[-k:]):
                return len(text) - k
        return len(text)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]] | None:
        at = text.find(self.OPEN)
        if at < 0:
            return None
        content, pos, calls = text[:at], at, []
        ws = re.compile(r"\s*")
        while pos < len(text):
            if not text.startswith(self.OPEN, pos):
                return None
            pos = ws.match(text, pos + len(self.OPEN)).end()
            try:
                obj, pos = _DECODER.raw_decode(text, pos)
            except ValueError:
                return None
            call = call_of(obj, tools, ("arguments", "parameters"))
            if call is None:
                return None
            calls.append(call)
            pos = ws.match(text, pos).end()
            if text.startswith(self.CLOSE, pos):
                pos = ws.match(text, pos + len(self.CLOSE)).end()
            elif pos < len(text):
                return None  # the closing tag may only be missing at the very end
        return content, calls


class Llama3(ToolFormat):
    """The whole reply is ``{"name": ..., "parameters": {...}}`` (or a list of them), as Llama 3.x's
    JSON tool calling; ``<|python_tag|>`` before it is allowed."""

    name = "llama3"
    args_key = "parameters"
    TAG = "<|python_tag|>"
    TAGS = (TAG,)

    def lark(self, call: str, tag_ids: Mapping[str, int]) -> str:
        return f"start: call\ncall: {call}\n"

    def safe_prefix(self, text: str) -> int:
        rest = text.lstrip()
        if not rest:
            return 0
        if rest[0] in "{[" or self.TAG.startswith(rest[: len(self.TAG)]) or rest.startswith(self.TAG):
            return 0
        return len(text)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]] | None:
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):].lstrip()
        if not body or body[0] not in "{[":
            return None
        try:
            obj, end = _DECODER.raw_decode(body)
        except ValueError:
            return None
        if body[end:].strip():
            return None
        objs = obj if isinstance(obj, list) else [obj]
        calls = [call_of(o, tools, ("parameters", "arguments")) for o in objs]
        if not calls or any(c is None for c in calls):
            return None
        return "", [c for c in calls if c is not None]


FORMATS: dict[str, ToolFormat] = {"hermes": Hermes(), "llama3": Llama3()}
_MENTIONS_TOOLS = re.compile(r"\btools\b")


def supports_tools(template: str | None) -> bool:
    """Whether a chat template can show tools to the model (its text uses a ``tools`` variable)."""
    return bool(template) and bool(_MENTIONS_TOOLS.search(template or ""))


def detect_format(template: str | None) -> ToolFormat | None:
    """The tool-call format a chat template teaches (None: no tool support we can parse)."""
    if not supports_tools(template):
        return None
    assert template is not None
    if Hermes.OPEN in template:
        return FORMATS["hermes"]
    if '"parameters"' in template:
        return FORMATS["llama3"]
    return None


def template_of(backend: Any) -> str | None:
    """A backend's chat template text (its ``chat_template``), None where it has none or hides it."""
    template = getattr(backend, "chat_template", None)
    return template if isinstance(template, str) else None


def format_for(backend: Any, param: str = "tools") -> ToolFormat:
    """The tool-call format of ``backend``'s chat template, or a 400 that says why there is none."""
    template = template_of(backend)
    if not supports_tools(template):
        name = getattr(backend, "model_path", None)
        label = getattr(name, "name", None) or "this model"
        raise RequestError(f"{param}: the chat template of {label} has no tool support (it never "
                           "mentions tools), so it cannot show tools to the model; send the request "
                           "without tools, or serve a model whose template supports them", param)
    fmt = detect_format(template)
    if fmt is None:
        raise RequestError(f"{param}: the chat template mentions tools, but in no call format this "
                           "server parses (<tool_call> tags, or Llama 3's JSON with \"parameters\")", param)
    return fmt


def tag_tokens(backend: Any, fmt: ToolFormat) -> dict[str, int]:
    """The format's tags that are one token of ``backend``'s vocabulary (Qwen2.5's ``<tool_call>`` is
    151657), by text. Such a tag is what the model was trained to write, so a forced call's grammar
    asks for that token, and the reply's text must show it for the parser."""
    out: dict[str, int] = {}
    for text in fmt.TAGS:
        ids = backend.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1:
            out[text] = int(ids[0])
    return out


def tag_renderer(detokenize: Callable[[Sequence[int]], str], backend: Any,
                 tags: Mapping[str, int]) -> Callable[[Sequence[int]], str]:
    """``detokenize``, less its habit of dropping special tokens' text where a tag is one: llama.cpp
    writes no text for a control token (``special=False``, as for ``<|im_end|>``), and a GGUF may
    mark its tool tags so; then the tag is written back here, so the parser sees the call. Where the
    backend already writes every tag (Qwen2.5's GGUF marks them user-defined), ``detokenize`` itself."""
    render = {t: text for text, t in tags.items() if backend.detokenize([t]) != text}
    if not render:
        return detokenize

    def rendered(ids: Sequence[int]) -> str:
        if render.keys().isdisjoint(ids):
            return detokenize(ids)
        parts, start = [], 0
        for i, t in enumerate(ids):
            if t in render:
                parts += [detokenize(ids[start:i]) if i > start else "", render[t]]
                start = i + 1
        parts.append(detokenize(ids[start:]) if start < len(ids) else "")
        return "".join(parts)

    return rendered
