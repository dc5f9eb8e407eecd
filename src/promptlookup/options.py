"""A request's settings, checked once, when they are made: :class:`RequestOptions`.

Why one carrier: the CLI's flags, an HTTP request's body and a Python call all describe the same
things (how many tokens, how to sample, where to stop, which draft source, how long it may take).
They used to become sampler settings in five places and be checked in three. Now each front end
builds one :class:`RequestOptions` (``cli``: from its flags; ``serve``: the request schema's
``to_options``; ``Engine.generate(**fields)``: from keywords), which checks itself in
``__post_init__``, and :meth:`RequestOptions.sampler` is the one conversion to sampler settings.
A bad value is a one-line :class:`~promptlookup.errors.InputError` (a 400 on the server) raised
before any queue or model sees the request.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from promptlookup.errors import RequestError
from promptlookup.grammar import parse_response_format
from promptlookup.sampling import Sampler, SamplingParams, check_seed_and_logprobs
from promptlookup.tools import parse_tool_choice, parse_tools

if TYPE_CHECKING:
    from promptlookup.grammar import Constraint

MAX_STOPS = 16  # stop strings per request (OpenAI allows 4; llama-server any)
MAX_STOP_CHARS = 1000


@dataclass(frozen=True)
class RequestOptions:
    """The per-request settings of :meth:`~promptlookup.api.Engine.generate` and ``chat``.

    ``speculate`` is a draft source setting (``"auto"``, ``"ngram:draft=4"``, a
    :class:`~promptlookup.drafting.spec.SourceSpec`) or None for the engine's own; the engine checks
    it against its files. ``timeout`` (seconds) and ``cancelled`` (polled once per step, and between
    the pieces that read a long prompt on a llama.cpp model) end a
    generation early with finish reason "length" (``stopped_by`` "time" / "cancelled")."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    repeat_penalty: float = 1.0
    repeat_last_n: int = SamplingParams.repeat_last_n
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a random one, reported in the completion
    stop: Sequence[str] | str | None = None  # kept as a tuple of checked strings
    logprobs: int | None = None  # record each token's logprob and this many alternatives (0..20)
    speculate: Any = None  # str | SourceSpec | None (None: the engine's setting)
    timeout: float | None = None
    cancelled: Callable[[], bool] | None = None
    # OpenAI's response_format ({"type": "json_object"}, {"type": "json_schema", "json_schema":
    # {"schema": ...}}) or a grammar.Grammar; kept as the checked Grammar (None: free text)
    response_format: Any = None
    # OpenAI's logit_bias: token id -> bias in -100..100, added to the raw logits; kept as sorted pairs
    logit_bias: Mapping[int | str, float] | Sequence[tuple[int, float]] | None = None
    # OpenAI's tools (a list of {"type": "function", "function": {...}}) and tool_choice ("auto",
    # "none", "required", {"type": "function", "function": {"name": ...}}); kept as tools.Tool's and
    # a tools.ToolChoice. Chat only: the engine renders them through the model's template.
    tools: Any = None
    tool_choice: Any = None
    # draft the tokens the request's grammar forces (drafting.forced); None: the engine's setting
    grammar_drafts: bool | None = None
    # the corpora (names the engine has loaded) the suffix source drafts from; None: the engine's
    # defaults, (): none. Kept as a tuple of names; the engine checks that each is loaded.
    corpora: Sequence[str] | None = None

    def __post_init__(self) -> None:
        mt = self.max_tokens
        if isinstance(mt, bool) or not isinstance(mt, numbers.Integral) or mt < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {mt!r}", "max_tokens")
        object.__setattr__(self, "stop", _checked_stops(self.stop))
        self.sampling_params()  # raises SamplingError (an InputError) on any bad sampler setting
        check_seed_and_logprobs(self.seed, self.logprobs)
        object.__setattr__(self, "response_format", parse_response_format(self.response_format))
        object.__setattr__(self, "logit_bias", _checked_bias(self.logit_bias))
        object.__setattr__(self, "tools", parse_tools(self.tools))
        object.__setattr__(self, "tool_choice", parse_tool_choice(self.tool_choice, self.tools))
        if self.tool_choice.mode != "none" and self.response_format is not None:
            raise RequestError("response_format cannot be combined with tools: a tool call has its own "
                               'format (use tool_choice "required" or a named function to force one)',
                               "response_format")
        if self.grammar_drafts is not None and not isinstance(self.grammar_drafts, bool):
            raise RequestError(f"grammar_drafts must be true or false, got {self.grammar_drafts!r}",
                               "grammar_drafts")
        c = self.corpora
        if c is not None:
            if isinstance(c, str) or not isinstance(c, Sequence) or not all(isinstance(x, str) for x in c):
                raise RequestError("corpora must be a list of corpus names", "corpora")
            object.__setattr__(self, "corpora", tuple(c))
        t = self.timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or math.isnan(t)):
            raise RequestError(f"timeout must be a number of seconds, got {t!r}", "timeout")

    def sampling_params(self) -> SamplingParams:
        """The sampler settings these options ask for (the one place they are converted)."""
        return SamplingParams(temp=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                              repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty)

    def sampler(self, constraint: Constraint | None = None) -> Sampler:
        """A fresh sampler for one generation (a random seed is drawn here when none was given);
        ``constraint`` is the engine's grammar state for :attr:`response_format`."""
        return Sampler(self.sampling_params(), self.seed, logprobs=self.logprobs,
                       logit_bias=dict(self.logit_bias or ()), constraint=constraint)

    def stops(self) -> list[str]:
        return list(self.stop)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> RequestOptions:
        """These options with ``changes`` (checked again)."""
        return replace(self, **changes)


MAX_BIAS = 100.0  # OpenAI's range: -100 bans a token, 100 forces it
MAX_BIASES = 1024


def _checked_bias(bias: Any) -> tuple[tuple[int, float], ...] | None:
    """``logit_bias`` as sorted (id, bias) pairs; ids may come as JSON's strings ("50256")."""
    if bias is None:
        return None
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        pairs = list(items)
    except TypeError:
        raise RequestError("logit_bias must map token ids to numbers", "logit_bias") from None
    if len(pairs) > MAX_BIASES:
        raise RequestError(f"logit_bias: at most {MAX_BIASES} tokens, got {len(pairs)}", "logit_bias")
    out: dict[int, float] = {}
    for pair in pairs:
        if not (isinstance(pair, Sequence) and len(pair) == 2):
            raise RequestError("logit_bias must map token ids to numbers", "logit_bias")
        key, value = pair
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 0:
            raise RequestError(f"logit_bias: a key must be a token id (an integer >= 0), got {key!r}",
                               "logit_bias")
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                or abs(value) > MAX_BIAS):
            raise RequestError(f"logit_bias: the bias of token {key} must be a number in -100..100, "
                               f"got {value!r}", "logit_bias")
        out[int(key)] = float(value)
    return tuple(sorted(out.items())) or None


def _checked_stops(stop: Any) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > MAX_STOPS:
        raise RequestError(f"at most {MAX_STOPS} stop strings, got {len(stops)}", "stop")
    for s in stops:
        if not isinstance(s, str):
            raise RequestError(f"a stop string must be text, got {type(s).__name__}", "stop")
        if len(s) > MAX_STOP_CHARS:
            raise RequestError(f"a stop string is at most {MAX_STOP_CHARS} characters, got {len(s)}", "stop")
    return tuple(stops)
