"""Tool calling: the formats' parsers and grammars, template detection, the checks of tools and
tool_choice, and the engine's tool calls on the byte test double (batched logits equal single ones,
so a forced call is the same token for token with and without speculation)."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from fakes import ByteModel, RandomDrafts, TagToolModel, ToolByteModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup.api import Chunk, Completion, Engine, ToolChunks
from promptlookup.drafting.base import Draft
from promptlookup.errors import RequestError
from promptlookup.grammar import Constraint, grammar_tokenizer
from promptlookup.options import RequestOptions
from promptlookup.sampling import Sampler, SamplingParams
from promptlookup.speculate import generate
from promptlookup.telemetry import Counters
from promptlookup.tools import (
    FORMATS,
    Tool,
    ToolChoice,
    detect_format,
    format_for,
    parse_tool_choice,
    parse_tools,
    tag_renderer,
    tag_tokens,
)

HERMES, LLAMA3 = FORMATS["hermes"], FORMATS["llama3"]
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 10}},
        "required": ["path"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": READ}},
         {"type": "function", "function": {"name": "run_tests", "parameters": {  # bounded: a small model
             "type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
             "additionalProperties": False}}}]
CHECKED = parse_tools(TOOLS)
SMOLLM2 = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n'}}{% endfor %}")
USER = [{"role": "user", "content": "read it"}]


def _args(call) -> dict:
    return json.loads(call.arguments)


# -- parsing --------------------------------------------------------------------------------------------
def test_hermes_parses_calls_after_content():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
    content, calls = HERMES.parse(text, CHECKED)
    assert content == "Let me look.\n"
    assert [(c.name, _args(c)) for c in calls] == [("read_file", {"path": "a.py"})]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29
    assert calls[0].as_openai() == {"id": calls[0].id, "type": "function",
                                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}


def test_hermes_parses_several_calls_string_arguments_and_a_missing_last_closing_tag():
    text = ('<tool_call>{"name": "run_tests", "arguments": "{\\"k\\": 1}"}</tool_call>\n'
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "b"}}')
    content, calls = HERMES.parse(text, CHECKED)
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [("run_tests", '{"k": 1}'),
                                                      ("read_file", '{"path": "b"}')]


@pytest.mark.parametrize("text", [
    "no call at all",
    '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',  # an unknown tool
    '<tool_call>\n{"name": "read_file", "arguments": [1]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}\n</tool_call> and then some text',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}} trailing </tool_call>',
    '<tool_call>\n{"name": "read_file", "argum',  # cut mid-call
    '<tool_call>\n{"name": "read_file", "arguments": "{not json"}\n</tool_call>',
])
def test_hermes_refuses_what_is_not_calls(text):
    assert HERMES.parse(text, CHECKED) is None


def test_llama3_parses_a_call_a_list_and_the_python_tag():
    content, calls = LLAMA3.parse(' {"name": "read_file", "parameters": {"path": "x"}}\n', CHECKED)
    assert (content, [(c.name, c.arguments) for c in calls]) == ("", [("read_file", '{"path": "x"}')])
    _, calls = LLAMA3.parse('<|python_tag|>[{"name": "run_tests", "parameters": {}}, '
                            '{"name": "read_file", "arguments": {"path": "y"}}]', CHECKED)
    assert [(c.name, c.arguments) for c in calls] == [("run_tests", "{}"), ("read_file", '{"path": "y"}')]
    for text in ('The answer is {"name": "read_file"}', '{"name": "read_file", "parameters": {}} more',
                 '{"name": "nope", "parameters": {}}', "[]", '{"city": "Paris"}'):
        assert LLAMA3.parse(text, CHECKED) is None, text


@pytest.mark.parametrize(("fmt", "text", "safe"), [
    (HERMES, "hello", 5), (HERMES, "hello <", 6), (HERMES, "hello <tool_", 6), (HERMES, "a <b", 4),
    (HERMES, "x<tool_call>{", 1), (HERMES, "x<tool_call>{} <tool_call>", 1), (HERMES, "", 0),
    (LLAMA3, "  ", 0), (LLAMA3, ' {"name"', 0), (LLAMA3, "Hi there", 8), (LLAMA3, "<|py", 0),
    (LLAMA3, "<b>", 3), (LLAMA3, "[1", 0),
])
def test_safe_prefix_holds_back_what_may_begin_a_call(fmt, text, safe):
    assert fmt.safe_prefix(text) == safe


# -- templates --------------------------------------------------------------------------------------------
def test_the_format_is_detected_from_the_template_text():
    from tool_gguf import HERMES_TEMPLATE

    assert detect_format(SMOLLM2) is None
    assert detect_format(None) is None
    assert detect_format(HERMES_TEMPLATE) is HERMES
    assert detect_format('{% if tools %}{"name": function name, "parameters": ...}{% endif %}') is LLAMA3
    assert detect_format("{% for t in tools %}{{ t }}{% endfor %}") is None  # tools, but no known format
    backend = ByteModel()
    backend.chat_template = SMOLLM2
    with pytest.raises(RequestError, match="no tool support") as err:
        format_for(backend)
    assert err.value.param == "tools"
    backend.chat_template = "{{ tools }}"
    with pytest.raises(RequestError, match="no call format") as err:
        format_for(backend)
    assert err.value.param == "tools"


# -- checks ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tools", "param"), [
    ("read_file", "tools"),
    ([{"type": "retrieval"}], "tools.0"),
    ([{"type": "function"}], "tools.0.function"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools.0.function.parameters"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}],
     "tools.1.function.name"),
])
def test_bad_tools_are_refused_by_field(tools, param):
    with pytest.raises(RequestError) as err:
        RequestOptions(tools=tools)
    assert err.value.param == param


@pytest.mark.parametrize(("choice", "tools", "param", "words"), [
    ("sometimes", TOOLS, "tool_choice", "must be"),
    ({"type": "function", "function": {"name": "rm_rf"}}, TOOLS, "tool_choice", "no tool is named 'rm_rf'"),
    ("required", None, "tool_choice", "needs tools"),
    ({"type": "function"}, TOOLS, "tool_choice", "must be"),
])
def test_bad_tool_choice_is_refused(choice, tools, param, words):
    with pytest.raises(RequestError, match=words) as err:
        RequestOptions(tools=tools, tool_choice=choice)
    assert err.value.param == param


def test_tool_choice_defaults_and_response_format_with_tools():
    assert RequestOptions().tool_choice == ToolChoice("none")
    assert RequestOptions(tools=TOOLS).tool_choice == ToolChoice("auto")
    assert RequestOptions(tool_choice="auto").tool_choice == ToolChoice("none")  # no tools: nothing to call
    assert parse_tool_choice({"type": "function", "function": {"name": "read_file"}}, CHECKED) == \
        ToolChoice("named", "read_file")
    assert RequestOptions(tools=TOOLS, tool_choice="none", response_format={"type": "json_object"})
    with pytest.raises(RequestError, match="cannot be combined") as err:
        RequestOptions(tools=TOOLS, response_format={"type": "json_object"})
    assert err.value.param == "response_format"


def test_an_unenforceable_parameters_schema_is_refused_when_forced():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}]
    engine = Engine.from_backend(ToolByteModel(), speculate="off")
    with pytest.raises(RequestError) as err:
        engine.chat(USER, tools=tools, tool_choice="required", max_tokens=5)
    assert err.value.param == "tools.0.function.parameters"


# -- the engine --------------------------------------------------------------------------------------------
def test_required_and_named_calls_on_the_test_double_with_and_without_speculation():
    engine = Engine.from_backend(ToolByteModel(window=2), speculate="off")
    got = []
    for speculate in ("off", "ngram", "suffix"):
        for choice in ("required", {"type": "function", "function": {"name": "read_file"}}):
            c = engine.chat(USER, tools=TOOLS, tool_choice=choice, max_tokens=100, temperature=0,
                            speculate=speculate)
            assert (c.finish_reason, c.text) == ("tool_calls", "")
            got.append([(call.name, call.arguments) for call in c.tool_calls])
    assert got == [[("run_tests", '{"k": 0}')], [("read_file", '{"path": "vmgmeychzn"}')]] * 3


def test_a_streamed_call_carries_its_tokens_and_the_calls_on_the_completion():
    engine = Engine.from_backend(ToolByteModel(window=2), speculate="ngram")
    chunks = list(engine.chat(USER, tools=TOOLS, tool_choice="required", max_tokens=100, temperature=0,
                              stream=True, logprobs=0))
    c = chunks[-1].completion
    assert "".join(ch.text for ch in chunks) == ""
    assert [t for ch in chunks for t in ch.tokens] == c.tokens
    assert sum(len(ch.logprobs) for ch in chunks) == len(c.tokens)
    assert bytes(c.tokens[:-1]).decode() == \
        '<tool_call>\n{ "name" : "run_tests" , "arguments" : { "k" : 0 } }\n</tool_call>'
    assert [(call.name, call.arguments) for call in c.tool_calls] == [("run_tests", '{"k": 0}')]


def test_llama3_style_forced_call():
    engine = Engine.from_backend(ToolByteModel(window=2, style="llama3"), speculate="ngram")
    c = engine.chat(USER, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "read_file"}},
                    max_tokens=100, temperature=0)
    assert bytes(c.tokens[:-1]).decode() == \
        '{ "name" : "read_file" , "parameters" : { "path" : "vmgmeychzn" } }'
    assert [(x.name, x.arguments) for x in c.tool_calls] == [("read_file", '{"path": "vmgmeychzn"}')]


def test_auto_free_text_is_content_and_none_shows_the_tools_but_never_parses():
    model = ToolByteModel(window=2)
    engine = Engine.from_backend(model, speculate="off")
    auto = engine.chat(USER, tools=TOOLS, max_tokens=12, temperature=0)
    assert (auto.tool_calls, auto.finish_reason, len(auto.text)) == (None, "length", 12)
    assert "tools:" in model.rendered[0]
    none = engine.chat(USER, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0)
    assert "tools:" in model.rendered[-1]  # the same prompt as auto's: its cached prefix is reused
    assert (none.tool_calls, none.finish_reason, none.text) == (None, "length", auto.text)
    assert none.cached_tokens == none.prompt_tokens - 1
    # a template without tool support: none answers without them (nothing to refuse)
    plain = Engine.from_backend(ByteModel(window=2), speculate="off")
    assert plain.chat(USER, tools=TOOLS, tool_choice="none", max_tokens=3).finish_reason == "length"
    with pytest.raises(RequestError, match="chat") as err:
        engine.generate("x", tools=TOOLS, max_tokens=3)
    assert err.value.param == "tools"


def _completion(text: str, finish: str = "stop") -> Completion:
    return Completion(text=text, tokens=list(range(len(text))), prompt_tokens=1, finish_reason=finish,
                      stopped_by="eos" if finish == "stop" else "max_tokens", counters=Counters(),
                      speculate="off")


def _feed(pieces: list[str], finish: str = "stop") -> list[Chunk]:
    text = "".join(pieces)
    chunks = [Chunk(p, [0] * len(p)) for p in pieces[:-1]]
    chunks.append(Chunk(pieces[-1], [0] * len(pieces[-1]), completion=_completion(text, finish)))
    return _tool_chunks(chunks, HERMES, CHECKED)


def test_a_malformed_call_under_auto_is_content_with_finish_stop():
    out = _feed(["Sure <tool", '_call>\n{"name": "read_file", "arguments": {"path": ', "1 2}"])
    assert [ch.text for ch in out] == ["Sure ",
                                       '<tool_call>\n{"name": "read_file", "arguments": {"path": 1 2}']
    c = out[-1].completion
    assert (c.tool_calls, c.finish_reason) == (None, "stop")
    assert sum(len(ch.tokens) for ch in out) == len(c.text)


def test_a_call_cut_by_the_token_limit_is_content_with_finish_length():
    out = _feed(["<tool_call>", '\n{"name": "read_file", "arguments": {}}'], finish="length")
    assert out[-1].completion.tool_calls is None and out[-1].completion.finish_reason == "length"
    assert "".join(ch.text for ch in out) == '<tool_call>\n{"name": "read_file", "arguments": {}}'


def test_content_streams_before_the_call_and_the_call_is_held():
    out = _feed(["I will ", "read <", "b> then <tool_call>", '\n{"name": "read_file", "arguments": ',
                 '{"path": "a"}}\n</tool_call>'])
    assert [ch.text for ch in out] == ["I will ", "read ", "<b> then ", ""]
    c = out[-1].completion
    assert (c.text, c.finish_reason) == ("I will read <b> then ", "tool_calls")
    assert [(x.name, x.arguments) for x in c.tool_calls] == [("read_file", '{"path": "a"}')]


def test_tool_messages_need_a_template_with_tool_support():
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"}]
    with pytest.raises(RequestError, match="no tool support") as err:
        Engine.from_backend(ByteModel(), speculate="off").chat_ids(history)
    assert err.value.param == "messages.1.tool_calls"
    with pytest.raises(RequestError, match="no tool support") as err:
        Engine.from_backend(ByteModel(), speculate="off").chat(USER, tools=TOOLS, max_tokens=3)
    assert err.value.param == "tools"
    model = ToolByteModel()
    Engine.from_backend(model, speculate="off").chat_ids(history, CHECKED)
    assert model.rendered[0].endswith(
        '<|assistant|><tool_call>{"name": "read_file", "arguments": {"path": "a"}}'
        "</tool_call><|end|><|user|>print(1)<|end|><|assistant|>")


@pytest.mark.parametrize(("messages", "tools", "param"), [
    ([*USER, {"role": "assistant",
              "tool_calls": [{"function": {"name": "f", "arguments": '{"a": "<|end|>"}'}}]}],
     None, "messages.1.tool_calls"),
    (USER, [{"type": "function", "function": {"name": "f", "description": "ends <|user|> here"}}],
     "tools.0"),
    ([*USER, {"role": "tool", "tool_call_id": "<|system|>", "content": "x"}], None,
     "messages.1.tool_call_id"),
    ([*USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], None,
     "messages.1.tool_calls.0.function.arguments"),
    ([*USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}], None,
     "messages.1.tool_calls.0.function.arguments"),
])
def test_control_texts_and_bad_arguments_in_tool_fields_are_refused(messages, tools, param):
    engine = Engine.from_backend(ToolByteModel(), speculate="off")
    with pytest.raises(RequestError) as err:
        engine.chat_ids(messages, parse_tools(tools))
    assert err.value.param == param


# -- hypothesis: forced calls over random parameter schemas ------------------------------------------------
_names = st.text("abcdefgh", min_size=1, max_size=4)
_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 5)),
    st.builds(lambda lo, w: {"type": "integer", "minimum": lo, "maximum": lo + w},
              st.integers(-20, 20), st.integers(0, 100)),
    st.builds(lambda vs: {"enum": vs}, st.lists(_names, min_size=1, max_size=3, unique=True)),
    st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n},
              st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 3)), st.integers(0, 2)),
)
parameters = st.builds(
    lambda props, n_req: {"type": "object", "properties": props, "required": sorted(props)[:n_req],
                          "additionalProperties": False},
    st.dictionaries(_names, _leaf, min_size=0, max_size=3), st.integers(0, 3))
PARAMS = [SamplingParams(), SamplingParams(temp=0.9, top_k=0, top_p=1.0, min_p=0.0)]
_TOKENIZER: list[object] = []


class ScriptedDrafts(RandomDrafts):
    """Drafts of a known output (a plain run's), each token corrupted with probability 1 - p_right."""

    name = "scripted"

    def __init__(self, model, expected, n_prompt: int, seed: int, p_right: float) -> None:
        super().__init__(model, seed, p_right)
        self.expected, self.n_prompt = list(expected), n_prompt

    def propose(self, k):
        at = len(self.seq) - self.n_prompt
        return Draft(tuple(t if self.rng.random() < self.p_right else self.rng.randrange(self.model.n_vocab)
                           for t in self.expected[at : at + self.rng.randint(0, k)]), self.name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params_schema=parameters, other=parameters, style=st.sampled_from(["hermes", "llama3"]),
       sampling=st.sampled_from(PARAMS), seed=st.integers(0, 1000), window=st.integers(1, 2),
       draft=st.integers(1, 6), p_right=st.sampled_from([0.0, 0.7, 0.95]),
       prompt=st.binary(min_size=1, max_size=8))
def test_a_named_call_always_parses_validates_and_speculation_changes_nothing(
        params_schema, other, style, sampling, seed, window, draft, p_right, prompt):
    model = ToolByteModel(window=window, seed=seed, style=style)
    fmt = FORMATS[style]
    tools = (Tool("pick", params_schema), Tool("other", other))
    grammar = fmt.grammar(tools, ToolChoice("named", "pick"))
    if not _TOKENIZER:
        _TOKENIZER.append(grammar_tokenizer(model))

    def run(source=None):
        sampler = Sampler(sampling, seed, constraint=Constraint(_TOKENIZER[0], grammar, [ByteModel.EOS]))
        return generate(model, list(prompt), 400, source=source, draft=draft, sampler=sampler)

    plain = run()
    assert plain.stopped_by == "eos", bytes(t for t in plain.tokens if t < 256)
    content, calls = fmt.parse(bytes(plain.tokens[:-1]).decode("utf-8"), tools)
    assert content == "" and [c.name for c in calls] == ["pick"]
    assert jsonschema_rs.validator_for(params_schema).is_valid(json.loads(calls[0].arguments))
    for source in (ScriptedDrafts(model, plain.tokens, len(prompt), seed, p_right),
                   RandomDrafts(model, seed, p_right)):
        spec = run(source)
        assert (spec.tokens, spec.stopped_by) == (plain.tokens, plain.stopped_by)


# -- tags that are one special token (Qwen2.5's <tool_call>) ----------------------------------------------
def test_tags_that_are_one_token_are_found_and_written_back_where_the_backend_drops_them():
    model = TagToolModel()
    assert tag_tokens(model, HERMES) == {"<tool_call>": 261, "</tool_call>": 262}
    assert tag_tokens(ToolByteModel(), HERMES) == {}  # eleven byte tokens: the tag is text
    ids = [261, 10, *b'{"a": 1}', 10, 262]
    assert model.detokenize(ids) == '\n{"a": 1}\n'  # a control token has no text, as in llama.cpp
    assert tag_renderer(model.detokenize, model, {"<tool_call>": 261, "</tool_call>": 262})(ids) == \
        '<tool_call>\n{"a": 1}\n</tool_call>'
    plain = ToolByteModel()
    assert tag_renderer(plain.detokenize, plain, {}) == plain.detokenize  # nothing to write back


def test_a_forced_call_writes_the_special_tag_tokens_and_speculation_changes_nothing():
    engine = Engine.from_backend(TagToolModel(window=2), speculate="off")
    got = []
    for speculate in ("off", "ngram", "suffix"):
        for stream in (False, True):
            out = engine.chat(USER, tools=TOOLS, tool_choice="required", max_tokens=100, temperature=0,
                              speculate=speculate, stream=stream)
            c = list(out)[-1].completion if stream else out
            got.append((c.tokens, c.text, c.finish_reason, [(x.name, x.arguments) for x in c.tool_calls]))
    body = b'{ "name" : "run_tests" , "arguments" : { "k" : 0 } }'
    assert got == [([261, 10, *body, 10, 262, 256], "", "tool_calls", [("run_tests", '{"k": 0}')])] * 6


def test_auto_reads_a_call_made_of_special_tags():
    engine = Engine.from_backend(TagToolModel(window=2), speculate="off")
    tokens = [261, 10, *b'{"name": "read_file", "arguments": {"path": "a"}}', 10, 262]
    chunks = [Chunk(engine.detokenize(tokens[:1]), tokens[:1]), Chunk("", tokens[1:])]
    text = tag_renderer(engine.detokenize, engine.backend, tag_tokens(engine.backend, HERMES))(tokens)
    chunks[-1].completion = _completion(text)
    out = _tool_chunks(chunks, HERMES, CHECKED, lenient=True)
    assert [(x.name, x.arguments) for x in out[-1].completion.tool_calls] == [("read_file", '{"path": "a"}')]


def test_a_token_the_grammar_refuses_ends_the_reply_as_a_stop():
    """A sampled token the grammar refuses (a draft's, or one a grammar's mask let through) never
    leads to free text: the next token is the end of generation."""
    model = ToolByteModel()
    grammar = HERMES.grammar(CHECKED, ToolChoice("required"))
    constraint = Constraint(grammar_tokenizer(model), grammar, [ByteModel.EOS])
    sampler = Sampler(SamplingParams(), 0, constraint=constraint)
    sampler.reset(1)  # the prompt is one token
    prompt = [ord("x")]
    assert sampler.sample(model.logits(prompt), prompt, 1) == ord("<")  # the grammar's first byte
    refused = [*prompt, ord("Z")]
    assert sampler.sample(model.logits(refused), refused, 2) == ByteModel.EOS


def _tool_chunks(chunks, fmt, tools, lenient=False) -> list[Chunk]:
    """What :class:`ToolChunks` hands out, fed ``chunks`` one by one."""
    feed = ToolChunks(fmt, tools, lenient=lenient).feed
    return [out for chunk in chunks for out in feed(chunk)]
