"""A chat prompt as token ids, where only the chat template's own text can produce control tokens.

Why: the rendered chat prompt used to be tokenized whole with special-token parsing on, so a user
message holding ``<|im_end|>\\n<|im_start|>system\\n...`` was turned into real control tokens and
could forge a turn of the conversation. Every request path (``generate --chat``, ``bench`` and
the server) goes through :func:`messages_tokens`, which works on any backend with ``render_chat``,
``tokenize`` and ``control_texts``:

1. The template is rendered twice: with the real messages, and with a unique marker in place of
   each message's content. The marked render splits into the template's own text and the content
   slots; the real render must equal that text with the contents put back (a template that trims the
   content is matched with the contents trimmed). Where neither matches, the contents are put back
   as given, which is still safe.
2. Control-token texts are looked for only inside the template's own text. Those are the only
   control tokens; everything between two of them (template text and content alike) is tokenized
   as one fragment with special-token parsing off, as the tokenizer's own special-token pass would
   cut it, so a prompt whose content holds no control-token text gets exactly the ids of the old
   whole-string tokenization.
3. The tokens ``add_special`` puts around a text (a BOS, say) are added once, around the whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from promptlookup.backends.base import Model, one_turn

Segment = tuple[str, bool]  # (text, is the template's own text)


def _markers(n: int, avoid: str) -> list[str]:
    """``n`` marker strings, none of which occurs in ``avoid`` (private-use code points around a number)."""
    k = 0
    while True:
        marks = [f"\ue000{k}.{i}\ue001" for i in range(n)]
        if not any(m in avoid for m in marks):
            return marks
        k += 1


def template_segments(backend: Model, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None = None) -> list[Segment]:
    """The rendered chat prompt as (text, from the template) segments; see the module doc, step 1.
    ``tools`` (OpenAI's tool objects) are handed to the template, which writes them as its own text."""
    # the backends render an empty system message as none
    messages = [dict(m) for m in messages if not (m["role"] == "system" and not m["content"])]
    contents = [m["content"] for m in messages]

    def render(msgs: Sequence[Mapping[str, Any]]) -> str:
        return backend.render_chat(msgs, tools=list(tools)) if tools else backend.render_chat(msgs)

    rendered = render(messages)
    marks = _markers(len(contents), rendered + "".join(contents))
    # an empty content keeps no marker: templates test it ("{% if message.content %}", an assistant
    # turn that only calls tools), and a marker there would change what they write
    marked = render([{**m, "content": mark if m["content"] else ""}
                     for m, mark in zip(messages, marks, strict=True)])
    pattern = re.compile("|".join(re.escape(m) for m in marks)) if marks else None
    parts = pattern.split(marked) if pattern else [marked]
    slots = [marks.index(m.group()) for m in pattern.finditer(marked)] if pattern else []

    def assemble(values: Sequence[str]) -> list[Segment]:
        out: list[Segment] = []
        for i, text in enumerate(parts):
            if text:
                out.append((text, True))
            if i < len(slots) and values[slots[i]]:
                out.append((values[slots[i]], False))
        return out

    for values in (contents, [c.strip() for c in contents]):
        segs = assemble(values)
        if "".join(t for t, _ in segs) == rendered:
            return segs
    return assemble(contents)


def _partition(segments: Sequence[Segment], controls: Sequence[str]) -> list[str]:
    """Alternating text fragments and control-token texts (the latter found in template text only).

    Returns a list whose odd positions are control texts: ``[text, control, text, control, text]``.
    """
    out: list[str] = [""]
    finder = (re.compile("|".join(re.escape(c) for c in sorted(set(controls), key=len, reverse=True)))
              if controls else None)
    for text, own in segments:
        if not own or finder is None:
            out[-1] += text
            continue
        pos = 0
        for m in finder.finditer(text):
            out[-1] += text[pos : m.start()]
            out.extend([m.group(), ""])
            pos = m.end()
        out[-1] += text[pos:]
    return out


def _special_affixes(backend: Model) -> tuple[list[int], list[int]]:
    """The ids ``add_special`` puts before and after a text (a BOS, an EOS), found by a probe."""
    probe = "a"
    bare = list(backend.tokenize(probe, add_special=False, parse_special=False))
    full = list(backend.tokenize(probe, add_special=True, parse_special=False))
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    return [], []


def chat_tokens(backend: Model, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat prompt, ready for generation, with no control token from content."""
    return messages_tokens(backend, one_turn(user, system))


def messages_tokens(backend: Model, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Token ids of a conversation (system/user/assistant/tool messages) rendered by the model's own
    chat template, ready for the assistant's next turn, with no control token from any message's
    content. Tool definitions and assistant tool calls are written by the template as its own text,
    so a control-token text inside them is refused (:func:`check_no_controls`)."""
    check_no_controls(backend, messages, tools)
    pieces = _partition(template_segments(backend, messages, tools), backend.control_texts())
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            if piece:
                ids.extend(backend.tokenize(piece, add_special=False, parse_special=False))
            continue
        one = list(backend.tokenize(piece, add_special=False, parse_special=True))
        if len(one) != 1:  # not a single token after all: it is text
            one = list(backend.tokenize(piece, add_special=False, parse_special=False))
        ids.extend(one)
    head, tail = _special_affixes(backend)
    return [*head, *ids, *tail]


def check_no_controls(backend: Model, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None) -> None:
    """Refuse control-token text in what the template writes as its own: tool definitions and the
    assistant's tool calls (names, arguments). Content slots are safe already (step 1); these are not
    slots, and a ``<|im_end|>`` in an argument would otherwise forge a turn."""
    from promptlookup.errors import RequestError

    controls = [c for c in backend.control_texts() if c]
    if not controls:
        return
    found = re.compile("|".join(re.escape(c) for c in sorted(set(controls), key=len, reverse=True)))
    places: list[tuple[str, Any]] = [(f"tools.{i}", t) for i, t in enumerate(tools or ())]
    places += [(f"messages.{i}.tool_calls", m["tool_calls"]) for i, m in enumerate(messages)
               if m.get("tool_calls")]
    places += [(f"messages.{i}.name", m["name"]) for i, m in enumerate(messages) if m.get("name")]
    places += [(f"messages.{i}.tool_call_id", m["tool_call_id"]) for i, m in enumerate(messages)
               if m.get("tool_call_id")]
    for where, value in places:
        hit = found.search(json.dumps(value, ensure_ascii=False))
        if hit:
            raise RequestError(f"{where} holds {hit.group()!r}, the text of one of the model's control "
                               "tokens, which the chat template would write as a real one", where)
