"""The OpenAI request and response shapes the server speaks, as pydantic models.

Why pydantic: FastAPI checks every request body against these models and writes them into the
server's OpenAPI schema, so what the server accepts, what it answers and what the schema says are one
thing (schemathesis holds the server to that schema). Requests are *strict*: ``"5"`` is not a number
and ``1`` is not ``true``, as in OpenAI's API; fields the server does not know (``user``,
``metadata``, ...) are ignored. Extensions beyond OpenAI's fields: ``speculate`` (the draft source
setting for this request), ``top_k``, ``min_p`` and ``repeat_penalty`` (llama.cpp's samplers,
off by default), and in every response ``timings`` (llama-server's object) and ``counters``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field

from promptlookup.errors import RequestError
from promptlookup.options import MAX_STOP_CHARS, MAX_STOPS, RequestOptions

MAX_TOKENS_LIMIT = 1 << 20  # the largest context the CLI loads; a request is also held to the server's
MAX_SEED = 2**64 - 1
MAX_SPECULATE_CHARS = 200
MAX_TOP_LOGPROBS = 20

_StopList = Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)]
StopField = Annotated[
    str | _StopList | None,
    Field(description=f"up to {MAX_STOPS} strings; the text ends before the first one generated"),
]


def _integral(v: Any) -> Any:
    """JSON has one number type and JSON Schema calls 5.0 an integer: so do we (5.5 stays an error)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _int(lo: int, hi: int | None = None) -> Any:
    """An integer in ``lo..hi`` (as JSON Schema's ``minimum``/``maximum``), integral floats included."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(_integral)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    include_usage: bool | None = None


class SamplingFields(_Request):
    """The fields chat and completions share."""

    model: str | None = Field(None, description="ignored: the server serves the model it loaded")
    temperature: float | None = Field(None, ge=0, le=2, description="0: greedy; default 1 (OpenAI's)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling; default 1 (off)")
    top_k: _int(0, 1 << 20) | None = Field(None, description="extension: llama.cpp's top-k; 0 = off")
    min_p: float | None = Field(None, ge=0, le=1, description="extension: llama.cpp's min-p; 0 = off")
    repeat_penalty: float | None = Field(None, gt=0, le=100,
                                         description="extension: llama.cpp's repeat penalty; 1 = off")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: _int(0, MAX_SEED) | None = Field(None,
                             description="sampling seed; the response's `seed` repeats a run without one")
    stop: StopField = None
    n: _int(1, 128) | None = Field(None, description="only 1: one model context, one completion")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    speculate: str | None = Field(
        None, max_length=MAX_SPECULATE_CHARS,
        description="extension: the draft source for this request, e.g. off, suffix, ngram:draft=4, auto "
                    "(default: the server's --speculate); the output is the model's own either way")
    grammar_drafts: bool | None = Field(
        None, description="extension: draft the tokens a response_format or forced tool call's grammar "
                          "forces (default: the server's; --no-grammar-drafts turns them off); the output "
                          "is the model's own either way")
    corpora: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=8)] | None = Field(
        None, description="extension: the named corpora (GET /v1/corpora) the suffix source drafts from "
                          "for this request (default: the server's --corpus); an unknown name is a 400")
    user: str | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="token id (as text) -> bias added to its logit, -100..100 (-100 bans it)")
    return_token_ids: bool | None = Field(False, description="extension (vLLM's): the generated token ids "
                                                              "in choices[0].token_ids (not streamed)")

    # chat and completions name these fields differently: each request class answers for its own
    @abstractmethod
    def new_tokens(self) -> int | None:
        """The most tokens to generate the body asks for (None: until the context is full)."""

    @abstractmethod
    def logprob_count(self) -> int | None:
        """Alternatives per token the body asks logprobs for (None: no logprobs)."""

    def to_options(self, n_ctx: int, speculate: Any = None) -> RequestOptions:
        """This request's settings as the engine's :class:`RequestOptions`, OpenAI's defaults where
        the body is silent (temperature 1, top_p 1; llama.cpp's extensions off), ``max_tokens`` up to
        the context; ``speculate`` is the server's checked spec for the body's ``speculate``."""
        if self.n not in (None, 1):
            raise RequestError(f"n must be 1 (got {self.n}): one model context serves one completion "
                               "per request; send n requests instead", "n")
        max_tokens = self.new_tokens()
        if max_tokens is not None and max_tokens > n_ctx:
            raise RequestError(f"max_tokens is {max_tokens} but the context holds {n_ctx} tokens "
                               "(prompt included)", "max_tokens")
        return RequestOptions(
            max_tokens=n_ctx if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0, min_p=self.min_p or 0.0,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed, stop=self.stop, logprobs=self.logprob_count(), speculate=speculate,
            logit_bias=self.logit_bias, response_format=self.grammar(), grammar_drafts=self.grammar_drafts,
            corpora=self.corpora,
            **self.tool_fields())

    def grammar(self) -> Any:
        """The response format as RequestOptions takes it (None: free text)."""
        return None

    def tool_fields(self) -> dict[str, Any]:
        """``tools`` and ``tool_choice`` as RequestOptions takes them (chat only)."""
        return {}


class TextPart(_Request):
    type: Literal["text"]
    text: str


class Message(_Request):
    role: Literal["system", "developer", "user"]
    content: str | list[TextPart]
    name: str | None = None


class FunctionCallIn(_Request):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="the arguments as JSON text (an object)")


class ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] | None = "function"
    function: FunctionCallIn


class AssistantMessage(_Request):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="the calls this turn made (shown to "
                                                "the model through its chat template)")
    function_call: Any = Field(None, description="the legacy form: not supported (refused)")


class ToolMessage(_Request):
    """A tool's result (``role: "tool"``); the legacy ``"function"`` role is accepted by the schema
    only so that its refusal names it."""

    role: Literal["tool", "function"]
    content: str | list[TextPart] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionSpec(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = Field(None, description="forced calls are always enforced by a grammar")


class ToolSpec(_Request):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class TextFormat(_Request):
    type: Literal["text"]


class JsonObjectFormat(_Request):
    type: Literal["json_object"]


class JsonSchemaSpec(_Request):
    name: str | None = Field(None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema",
                                                  description="the JSON Schema the answer must satisfy")
    strict: bool | None = Field(None, description="always enforced (a grammar masks every token)")


class JsonSchemaFormat(_Request):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Discriminator("type")]


class ChatCompletionRequest(SamplingFields):
    messages: list[Annotated[Message | AssistantMessage | ToolMessage, Discriminator("role")]] = Field(
        min_length=1)
    max_tokens: _int(1, MAX_TOKENS_LIMIT) | None = Field(None,
                                   description="default: until the context is full")
    max_completion_tokens: _int(1, MAX_TOKENS_LIMIT) | None = Field(None,
                                              description="OpenAI's newer name for max_tokens")
    logprobs: bool | None = False
    top_logprobs: _int(0, MAX_TOP_LOGPROBS) | None = Field(None)
    response_format: ResponseFormat | None = Field(
        None, description="json_object or json_schema: the answer is constrained by a grammar, token by "
                          "token (speculation included)")
    tools: list[ToolSpec] | None = Field(
        None, description="function tools, shown to the model through its chat template (400 when the "
                          "template has no tool support)")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="auto (default with tools), none, required or a named function; required and "
                          "named are forced by a grammar")
    parallel_tool_calls: bool | None = Field(None, description="accepted; a forced call is one call")
    # the legacy function-calling fields: refused by name rather than ignored
    functions: list[Any] | None = Field(None, description="not supported: use tools (refused when non-empty)")
    function_call: Any = Field(None, description='not supported: use tool_choice (only "none" or absent)')

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def grammar(self) -> Any:
        self.refuse_unsupported()
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "json_object"}
        schema = fmt.json_schema.schema_
        return {"type": "json_schema", "json_schema": {"schema": {} if schema is None else schema}}

    def tool_fields(self) -> dict[str, Any]:
        return {"tools": [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None,
                "tool_choice": self.tool_choice if isinstance(self.tool_choice, str | None)
                else self.tool_choice.model_dump()}

    def refuse_unsupported(self) -> None:
        """The legacy function-calling fields are refused by name, never answered as if absent."""
        for i, m in enumerate(self.messages):
            if isinstance(m, ToolMessage) and m.role == "function":
                raise RequestError(f'messages[{i}]: role "function" is the legacy form; send the result '
                                   'as role "tool" with its tool_call_id', f"messages.{i}.role")
            if isinstance(m, AssistantMessage) and m.function_call is not None:
                raise RequestError(f"messages[{i}].function_call: the legacy form; use tool_calls",
                                   f"messages.{i}.function_call")
        if self.functions:
            raise RequestError("functions is the legacy form: send tools instead", "functions")
        if self.function_call not in (None, "none"):
            raise RequestError('function_call must be "none" or absent: use tool_choice', "function_call")

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    prompt: (str | Annotated[list[_int(0)], Field(min_length=1)]
             | Annotated[list[str], Field(min_length=1, max_length=1)]
             | Annotated[list[Annotated[list[_int(0)], Field(min_length=1)]],
                         Field(min_length=1, max_length=1)]) = Field(
        description="text or token ids; one prompt per request")
    max_tokens: _int(1, MAX_TOKENS_LIMIT) | None = Field(16, description="default 16 (OpenAI's)")
    logprobs: _int(0, MAX_TOP_LOGPROBS) | None = Field(None,
                                 description="each token's logprob and this many alternatives")
    echo: bool | None = Field(False, description="only false")
    best_of: _int(1, 128) | None = Field(None, description="only 1")
    suffix: str | None = Field(None, description="not supported (only null)")

    def new_tokens(self) -> int | None:
        return self.max_tokens

    def logprob_count(self) -> int | None:
        return self.logprobs

    def prompt_input(self) -> str | list[int]:
        """The one prompt, as text or token ids; what this server cannot do is refused by name."""
        if self.echo:
            raise RequestError("echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise RequestError(f"best_of must be 1 (got {self.best_of})", "best_of")
        if self.suffix is not None:
            raise RequestError("suffix (insertion) is not supported", "suffix")
        prompt: Any = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # one prompt given as a list of one
        if isinstance(prompt, str) and not prompt:
            raise RequestError("the prompt is empty", "prompt")
        return prompt


# -- responses ------------------------------------------------------------------------------------
class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Timings(_Response):
    """llama-server's ``timings``: the prompt part decoded (``cache_n`` positions reused) and generation."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int
    draft_n_accepted: int


class Counters(BaseModel):
    """promptlookup's counters of the request (telemetry.Counters) and auto's choices."""

    model_config = ConfigDict(extra="allow")
    source: str
    decodes: int
    drafted_steps: int
    drafted_tokens: int
    accepted_tokens: int
    grammar_tokens: int = Field(0, description="accepted drafted tokens that the grammar forced")
    generated_tokens: int
    cached_tokens: int
    stopped_by: str
    source_choices: dict[str, int] = Field(description="auto: steps drafted by each source")


class PromptTokensDetails(_Response):
    cached_tokens: int


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class FunctionCallOut(_Response):
    name: str
    arguments: str = Field(description="JSON text")


class ToolCallOut(_Response):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class ChatMessage(_Response):
    role: Literal["assistant"]
    content: str | None = Field(description="null when the turn only calls tools")
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Response):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"]
    token_ids: list[int] | None = None


class _Extensions(_Response):
    """What every response carries beside OpenAI's fields."""

    timings: Timings
    counters: Counters
    seed: int | None = Field(None, description="the sampling seed used (repeat a sampled run with it)")


class ChatCompletion(_Extensions):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"]
    token_ids: list[int] | None = None


class TextCompletion(_Extensions):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(_Response):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    meta: dict[str, Any]


class ModelList(_Response):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Response):
    status: Literal["ok"]
    model: str
    parallel: int = Field(description="requests the server decodes together (--parallel)")
    running: int = Field(description="requests generating now (0..parallel)")
    waiting: int = Field(description="requests queued for a free slot")
    max_queue: int
    requests: int = Field(description="requests served since start")


class ErrorBody(_Response):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Response):
    error: ErrorBody
