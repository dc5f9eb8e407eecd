"""The lenient reading of tool calls under ``tool_choice: "auto"`` (:mod:`promptlookup.lenient`): which
replies are calls, where a stream releases text that cannot become one, and that a stream cut into
any chunks gives the whole answer's content and calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.api import Chunk, Completion, ToolChunks
from promptlookup.lenient import mixed_hold, parse, parse_mixed, possible
from promptlookup.telemetry import Counters
from promptlookup.tools import FORMATS, parse_tools

TOOLS = parse_tools([{"type": "function", "function": {"name": "get_weather"}},
                     {"type": "function", "function": {"name": "read_file"}}])
NAMES = ["get_weather", "read_file"]
QWEN_FENCED = ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n'
               '    "unit": "celsius"\n  }\n}\n```')  # Qwen2.5-Coder 0.5B's own answer, greedy
QWEN_BARE = '{"name": "read_file", "arguments": {"path": "src/app.py", "line": 12}}'


def _calls(text: str):
    got = parse(text, TOOLS)
    return None if got is None else [(c.name, c.arguments) for c in got]


@pytest.mark.parametrize("text, calls", [
    (QWEN_FENCED, [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    (QWEN_BARE, [("read_file", '{"path": "src/app.py", "line": 12}')]),
    ("  \n" + QWEN_BARE + "\n\n", [("read_file", '{"path": "src/app.py", "line": 12}')]),
    ('{"name": "read_file", "parameters": {"path": "a"}}', [("read_file", '{"path": "a"}')]),
    ('{"arguments": {}, "name": "read_file"}', [("read_file", "{}")]),
    ('{"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}', [("read_file", '{"path": "a"}')]),
    ('```{"name":"read_file","arguments":{}}```', [("read_file", "{}")]),
    ('```JSON\n{"name": "read_file", "arguments": {}}\n```', [("read_file", "{}")]),
    ('{"name": "get\\u005fweather", "arguments": {"x": [1, 2.5e-3, true, null]}}',
     [("get_weather", '{"x": [1, 0.0025, true, null]}')]),
    ('```json\n{"name": "read_file", "arguments": {"path": "a"}}\n```\n'
     '```json\n{"name": "get_weather", "arguments": {}}\n```',
     [("read_file", '{"path": "a"}'), ("get_weather", "{}")]),
    ('{"name": "read_file", "arguments": {}} {"name": "get_weather", "arguments": {}}',
     [("read_file", "{}"), ("get_weather", "{}")]),
])
def test_json_calls_of_declared_tools_are_calls(text, calls):
    assert _calls(text) == calls
    assert all(possible(text[:k], NAMES) for k in range(len(text) + 1))


@pytest.mark.parametrize("text, released_at", [
    ('{"name": "rm", "arguments": {}}', 12),  # an undeclared tool: released at its name's "m"
    ('{"name": "read_files", "arguments": {}}', 20),  # a declared name, then its "s"
    ('Sure! {"name": "read_file", "arguments": {}}', 1),  # text before the call
    ('{"name": "read_file", "arguments": {}} Done.', 40),  # text after it
    ('{"name": "read_file", "arguments": {}, "id": 3}', 41),  # another key, at its first letter
    ('{"name": "read_file"}', 21),  # no arguments: ruled out when the object closes
    ('{"name": "read_file", "arguments": [1]}', 36),  # arguments not an object
    ('{"name": 3, "arguments": {}}', 10),
    ('{"name": "read_file", "arguments": {"a": tru}}', 45),  # broken JSON
    ('```python\nprint(1)\n```', 4),  # another language's fence: at its "p"
    ('```json\n{"name": "read_file", "arguments": {}}\n``` and more', 52),  # at the "a"
    ('```json\n{"name": "read_file", "arguments": {}}\n{"x": 1}', 48),  # a second value in a fence
    ('[{"name": "read_file", "arguments": {}}]', 1),  # a list is not the rule's
    ('{"name": "read_file", "arguments": {}, "parameters": 3}', 51),  # both kinds of arguments
    ('{"name": "rm", "name": "read_file", "arguments": {}}', 12),
    ('{"name": "read_file", "arguments": {"x": NaN}}', 42),  # Python's json reads NaN; JSON has none
    ('{"name": "read_file", "name": "read_file", "arguments": {}}', 28),  # a repeated key, once whole
    ("Hello! How can I help?", 1),
])
def test_what_cannot_become_a_call_is_text_and_released_at_the_first_character_that_rules_it_out(
        text, released_at):
    assert _calls(text) is None
    held = [possible(text[:k], NAMES) for k in range(len(text) + 1)]
    assert held.index(False) == released_at
    assert not any(held[released_at:])  # released for good


def test_an_undeclared_name_stays_text_though_it_looks_like_a_call():
    assert parse('{"name": "get_weather", "arguments": {}}', parse_tools(
        [{"type": "function", "function": {"name": "read_file"}}])) is None
    assert not possible('{"name": "g', ["read_file"])
    assert possible('{"name": "r', ["read_file"])
    assert parse("", TOOLS) is None and parse("  \n", TOOLS) is None
    assert possible("", NAMES) and possible("  `", NAMES) and possible("```js", NAMES)


def _completion(text: str, finish: str = "stop") -> Completion:
    return Completion(text=text, tokens=list(range(len(text))), prompt_tokens=1, finish_reason=finish,
                      stopped_by="eos" if finish == "stop" else "max_tokens", counters=Counters(),
                      speculate="off")


def _stream(pieces: list[str], finish: str = "stop", lenient: bool = True):
    """``ToolChunks`` over a reply cut into ``pieces`` (one token per character): the streamed
    texts, the completion's content, its calls, its finish reason, the tokens handed out."""
    text = "".join(pieces)
    chunks = [Chunk(p, list(range(len(p)))) for p in pieces[:-1]]
    chunks.append(Chunk(pieces[-1], list(range(len(pieces[-1]))), completion=_completion(text, finish)))
    out = _tool_chunks(chunks, FORMATS["hermes"], TOOLS, lenient=lenient)
    c = out[-1].completion
    calls = None if c.tool_calls is None else [(x.name, x.arguments) for x in c.tool_calls]
    return [ch.text for ch in out], c.text, calls, c.finish_reason, sum(len(ch.tokens) for ch in out)


def test_a_fenced_call_streams_nothing_and_ends_as_tool_calls():
    texts, content, calls, finish, n = _stream([QWEN_FENCED[:9], QWEN_FENCED[9:40], QWEN_FENCED[40:]])
    assert texts == [""]  # one last chunk, no text: the call was held whole
    assert (content, calls, finish, n) == ("", [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
                                           "tool_calls", len(QWEN_FENCED))


def test_text_streams_from_the_chunk_that_rules_a_call_out():
    texts, content, calls, finish, _ = _stream(["  ", "{\"name\": \"rm", "\", \"arguments\": {}}"])
    assert texts == ["  {\"name\": \"rm", "\", \"arguments\": {}}"]
    assert (content, calls, finish) == ('  {"name": "rm", "arguments": {}}', None, "stop")
    texts, *_ = _stream(["Hello", " world"])
    assert texts == ["Hello", " world"]


def test_the_lenient_rule_is_for_auto_only_and_never_reads_a_cut_reply():
    assert _stream([QWEN_BARE], lenient=False)[2] is None
    _, content, calls, finish, _ = _stream([QWEN_BARE], finish="length")
    assert (content, calls, finish) == (QWEN_BARE, None, "length")


def test_the_template_format_comes_first_and_content_before_tags_streams():
    pieces = ["I will call it.\n<tool",
              '_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>']
    texts, content, calls, finish, _ = _stream(pieces)
    assert texts == ["I will call it.\n", ""]
    assert (content, calls, finish) == ("I will call it.\n", [("read_file", '{"path": "a"}')], "tool_calls")


# Qwen2.5-Coder-1.5B's reply shape once a BFCL conversation holds tool results: the call explained
PROSE_CALL = ('To buy the shares, I will place the order:\n\n```json\n{\n  "name": "read_file",\n'
              '  "arguments": {"path": "a"}\n}\n```\n\nThis places a buy order.')


def _mixed(text: str):
    got = parse_mixed(text, TOOLS)
    return None if got is None else (got[0], [(c.name, c.arguments) for c in got[1]])


@pytest.mark.parametrize("text, expected", [
    (PROSE_CALL, ("To buy the shares, I will place the order:\n\n\n\nThis places a buy order.",
                  [("read_file", '{"path": "a"}')])),
    ('Two: ```json {"name": "read_file", "arguments": {}}``` and ```{"name": "get_weather", '
     '"parameters": {"city": "Oslo"}}```.',
     ("Two:  and .", [("read_file", "{}"), ("get_weather", '{"city": "Oslo"}')])),
    # a code fence first: its closing backticks are not an opening; the call after it is one
    ('```python\nx = 1\n```\nNow: ```json\n{"name": "read_file", "arguments": {}}\n```',
     ("```python\nx = 1\n```\nNow: ", [("read_file", "{}")])),
    ('A result: ```json\n{"name": "rm", "arguments": {}}\n``` then ```json\n{"name": "read_file", '
     '"arguments": {}}\n```', ('A result: ```json\n{"name": "rm", "arguments": {}}\n``` then ',
                               [("read_file", "{}")])),
    ('Like this: {"name": "read_file", "arguments": {}}', None),  # a bare object in prose: text
    ('See ```json\n{"name": "read_file", "arguments": {}}\n', None),  # the fence never closed
    ('```json\n{"name": "read_file", "arguments": {}, "id": 1}\n```', None),  # another key
    ("Hello! ```` ` ``", None),
])
def test_fenced_calls_in_prose_are_calls_and_the_prose_is_the_content(text, expected):
    assert _mixed(text) == expected


@pytest.mark.parametrize("text, hold", [
    ("Hello there", 11),
    ("Run `ls`", 7),  # held: a backtick at the end, until the next character
    ("Run `", 4),  # a backtick at the end may open a fence
    ("Run ``", 4),
    ("Run ```", 4),
    ("Run ```py", 9),  # not a call's fence: released, inside it
    ("Run ```python\nx = 1\n``", 22),  # its closing backticks close it, open nothing
    ("Run ```python\nx = 1\n```\nand ``", 28),
    ("```python\nx = 1\n````", 19),  # after a closing fence, one more backtick may open another
    ('Run ```json\n{"name": "read_f', 4),
    ('Run ```json\n{"name": "rm"', 25),  # an undeclared tool: released
    ('Run ```json\n{"name": "read_file", "arguments": {}}\n``` then more', 4),  # a call: held to the end
    (PROSE_CALL, PROSE_CALL.index("```")),
])
def test_prose_streams_up_to_the_first_fence_that_may_be_a_call(text, hold):
    assert mixed_hold(text, NAMES) == hold


def test_a_call_explained_in_prose_streams_its_prose_and_ends_as_tool_calls():
    cut = PROSE_CALL.index("```") + 5
    texts, content, calls, finish, n = _stream(["To buy the", PROSE_CALL[10:cut], PROSE_CALL[cut:]])
    assert texts == ["To buy the", " shares, I will place the order:\n\n", "\n\nThis places a buy order."]
    assert (content, calls, finish, n) == ("".join(texts), [("read_file", '{"path": "a"}')], "tool_calls",
                                           len(PROSE_CALL))
    assert _stream([PROSE_CALL], lenient=False)[2] is None  # auto only
    _, content, calls, finish, _ = _stream([PROSE_CALL], finish="length")  # cut: all text
    assert (content, calls, finish) == (PROSE_CALL, None, "length")


REPLIES = [PROSE_CALL, '```python\nx = "```"\n```\n```json\n{"name": "get_weather", "arguments": {}}\n``` ok',
           'Say ``` then {"name": "read_file", "arguments": {}}',
           '{"name": "read_file", "arguments": {"a": 1, "a": 2}}',  # a repeated key: text at the end
           '{"name": "read_file", "arguments": {"x": -Infinity}}',  # not JSON: text
           QWEN_FENCED, QWEN_BARE, '{"name": "rm", "arguments": {}}', "Hello! Sure.",
           '```python\nx = 1\n```', '{"name": "read_file", "arguments": {}} Done.',
           'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
           '{"name": "read_file", "arguments": {"path": "\\u00e9\\n"}}  ', '  ```json\n{"name": "read_f',
           '{"name": "read_file", "arguments": {"a": [1, {"b": -0.5e+2}], "c": "x\\"}"}}']


@settings(max_examples=300, deadline=None)
@given(reply=st.sampled_from(REPLIES), cuts=st.lists(st.integers(0, 200), max_size=12),
       finish=st.sampled_from(["stop", "stop", "length"]))
def test_any_chunking_of_a_stream_gives_the_whole_answers_content_and_calls(reply, cuts, finish):
    points = sorted({min(c, len(reply)) for c in cuts} | {0, len(reply)})
    pieces = [reply[a:b] for a, b in zip(points, points[1:], strict=False)] or [""]
    texts, content, calls, fin, n = _stream(pieces, finish)
    whole = _stream([reply], finish)
    assert (content, calls, fin, n) == whole[1:]
    assert "".join(texts) == content  # what streamed is the content, whole, and nothing of a call


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([*NAMES, "rm", "read"]), key=st.sampled_from(["arguments", "parameters", "args"]),
       args=st.dictionaries(st.text(max_size=6), _JSON, max_size=3) | _JSON,
       extra=st.sampled_from([{}, {"id": 1}]), indent=st.sampled_from([None, 2]),
       ascii_only=st.booleans(), fence=st.sampled_from(["", "```", "```json\n", "```JSON "]),
       pad=st.sampled_from(["", " ", "\n\n"]))
def test_every_prefix_of_a_reply_that_parses_may_still_become_a_call(name, key, args, extra, indent,
                                                                      ascii_only, fence, pad):
    """The stream's hold-back is sound: a reply the whole answer reads as calls was never released."""
    body = json.dumps({"name": name, key: args, **extra}, indent=indent, ensure_ascii=ascii_only)
    text = pad + fence + body + ("\n```" if fence else "") + pad
    calls = _calls(text)
    decoded = args
    if isinstance(args, str):  # JSON text of arguments counts when it holds an object
        try:
            decoded = json.loads(args)
        except ValueError:
            decoded = None
    expected = name in NAMES and key != "args" and not extra and isinstance(decoded, dict)
    assert (calls is not None) == expected
    if calls is not None:
        assert calls == [(name, json.dumps(decoded, ensure_ascii=False))]
        assert all(possible(text[:k], NAMES) for k in range(len(text) + 1))


@settings(max_examples=200, deadline=None)
@given(before=st.text(alphabet="ab `\n{}", max_size=12), after=st.text(alphabet="ab `\n{}", max_size=12),
       name=st.sampled_from([*NAMES, "rm"]), fence=st.sampled_from(["```", "```json\n", "```JSON "]),
       cuts=st.lists(st.integers(0, 120), max_size=6))
def test_a_stream_never_releases_a_fenced_call_and_its_hold_never_goes_back(before, after, name, fence, cuts):
    text = before + fence + json.dumps({"name": name, "arguments": {"x": 1}}) + "\n```" + after
    holds = [mixed_hold(text[:k], NAMES) for k in range(len(text) + 1)]
    assert holds == sorted(holds) and all(h <= k for k, h in enumerate(holds))
    got = parse_mixed(text, TOOLS)
    content = text if got is None else got[0]
    assert content.startswith(text[:holds[-1]])  # what a stream released is the content's beginning
    if name in NAMES and "```" not in before and not before.endswith("`"):
        assert got is not None and got[1][0].name == name  # nothing before it opens a fence: a call
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    texts, streamed, calls, *_ = _stream(pieces)
    assert (streamed, calls) == _stream([text])[1:3] and "".join(texts) == streamed


def _tool_chunks(chunks, fmt, tools, lenient=False) -> list[Chunk]:
    """What :class:`ToolChunks` hands out, fed ``chunks`` one by one."""
    feed = ToolChunks(fmt, tools, lenient=lenient).feed
    return [out for chunk in chunks for out in feed(chunk)]
