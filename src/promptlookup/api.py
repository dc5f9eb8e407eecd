"""The public Python API: load a model once, then generate from text, token ids or chat messages.

Why one class: the CLI, the server and users all do the same things -- load a backend, build draft
sources from a speculation setting, keep one suffix history across requests, reuse the cached prompt
prefix, stop at stop strings, stream text as it is confirmed -- and each of them used to wire that by
hand. :class:`Engine` does it once::

    from promptlookup import Engine

    engine = Engine()                                  # the bundled SmolLM2, llama.cpp, speculating
    print(engine.generate("Repeat: the cat sat on the mat.", max_tokens=32).text)
    for piece in engine.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece.text, end="", flush=True)

An engine runs ``parallel`` requests at once (default 1); callers beyond that wait for a free slot.
With ``parallel > 1`` on a backend that batches (llama.cpp), concurrent calls (from several threads)
are decoded together, one forward per step for all of them (:mod:`promptlookup.batching`), each
request still speculating with its own sources and getting its own output.
Every request's text joins the engine's suffix history, so later requests draft from earlier ones;
a request whose prompt starts like the previous one's (a conversation re-sent with a new turn) decodes
only what is new. Output is the model's own: speculation never changes a token at temperature 0, and
under sampling each position's random number depends only on (seed, position).
"""

from __future__ import annotations

import json
import numbers
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promptlookup.backends.base import BackendError, BatchDecoder, Model
from promptlookup.backends.compute_thread import is_compute_thread
from promptlookup.backends.costs import cached_cost_curve
from promptlookup.batching.engine_loop import (
    DEFAULT_PREFILL_CHUNK,
    EngineLoop,
    NeedSlot,
    PromptEnded,
    Request,
    Started,
)
from promptlookup.batching.pool import SeqView, Slot
from promptlookup.costcurve import CostCurve
from promptlookup.drafting.base import DraftSource, learned_bytes, report_of, use_corpora
from promptlookup.drafting.forced import GrammarDrafts
from promptlookup.drafting.lookup.source import LONG_LIVED_BUDGET as DEFAULT_LOOKUP_BUDGET
from promptlookup.drafting.spec import OFF, Run, SourceSpec, SpecError, save_state, source_factory
from promptlookup.errors import RequestError, UsageError, check_prompt_fits
from promptlookup.grammar import Constraint, eog_ids, grammar_tokenizer
from promptlookup.lenient import mixed_hold, parse_mixed
from promptlookup.lenient import parse as lenient_parse
from promptlookup.lenient import possible as lenient_possible
from promptlookup.options import MAX_STOP_CHARS, MAX_STOPS, RequestOptions
from promptlookup.sampling import Sampler, TokenLogprob
from promptlookup.speculate import Forward, Generation, step_ops
from promptlookup.telemetry import Counters
from promptlookup.textout import TextTracker
from promptlookup.tools import (
    ToolCall,
    ToolFormat,
    format_for,
    supports_tools,
    tag_renderer,
    tag_tokens,
    template_of,
)

# What speculation does when nobody says: the best setting we measured (docs/results.md).
DEFAULT_SPECULATE = "auto"
MAX_PARALLEL = 64  # requests one engine runs at once
ROLES = ("system", "developer", "user", "assistant", "tool")  # "developer": OpenAI's newer name for system
__all__ = ["DEFAULT_SPECULATE", "MAX_STOPS", "MAX_STOP_CHARS", "ROLES", "Chunk", "Completion", "Engine",
           "Options", "RequestError", "RequestOptions", "check_messages", "load_backend"]


@dataclass
class Completion:
    """One finished generation."""

    text: str  # the generated text (ends before a stop string; no end-of-generation token text)
    tokens: list[int]  # the generated ids (up to the token that completed a stop string)
    prompt_tokens: int
    finish_reason: str  # OpenAI's: "stop" (end of generation or a stop string) or "length"
    stopped_by: str  # eos, stop (a stop string), max_tokens, context, time, cancelled
    counters: Counters
    speculate: str  # the draft source setting used ("off" for plain decoding)
    seed: int | None = None  # the sampler's seed (repeat the request with it; unused when greedy)
    stop: str | None = None  # the stop string that ended the text
    logprobs: list[TokenLogprob] | None = None  # one per token in ``tokens`` when asked for
    source_choices: dict[str, int] = field(default_factory=dict)  # auto: steps drafted by each source
    # the calls parsed from the reply when the request had tools (``text`` is then the content before
    # them, often empty, and ``finish_reason`` "tool_calls"); None: no call
    tool_calls: list[ToolCall] | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens reused from the previous request's cache instead of decoded again."""
        return self.counters.cached_tokens

    @property
    def timings(self) -> dict[str, float | int]:
        """llama-server's ``timings`` object for this generation."""
        return self.counters.timings()


@dataclass
class Chunk:
    """A piece of a streamed generation: new text and the tokens confirmed since the last piece (a
    step whose text is held back passes its tokens on to the next piece); the last one carries the
    :class:`Completion`."""

    text: str
    tokens: list[int]  # the tokens since the previous chunk (all chunks' tokens: the completion's)
    completion: Completion | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token in ``tokens``, when asked for


#: the request settings' old name (one letter from a source's ``Option``); kept for a release
Options = RequestOptions


def load_backend(model: str | Path | None = None, backend: str = "llama.cpp", n_ctx: int | None = None,
                 threads: int | None = None, n_seq: int = 1) -> Model:
    """A loaded backend: ``llama.cpp`` (a GGUF; the build is checked once per install) or
    ``transformers`` (a GGUF dequantized to fp32, or a local model directory). ``model``: a path, or
    a model name (``"qwen2.5-coder-0.5b"``; ``promptlookup models`` lists them); None: the bundled one.

    ``n_seq``: sequences the KV cache holds, ``n_ctx`` positions each (continuous batching; only
    llama.cpp holds more than one). ``n_ctx=None``: sized from the model's training context and the
    memory available (:func:`~promptlookup.backends.context_size.default_context`; one sequence:
    up to 32768, each of several: up to 16384); a given ``n_ctx`` above the training context is
    refused."""
    from promptlookup.backends.context_size import default_context
    from promptlookup.backends.models import resolve_model

    if n_ctx is None:
        n_ctx = default_context(backend, model, parallel=n_seq, slots=n_seq > 1).n_ctx

    if backend == "transformers":
        from promptlookup.backends.transformers import TransformersBackend

        path = Path(model) if model and Path(model).is_dir() else resolve_model(model)
        if n_seq != 1:
            raise UsageError(f"the transformers backend holds one sequence, not {n_seq} (parallel must be 1)")
        return TransformersBackend(path, n_ctx=n_ctx, n_threads=threads)
    if backend != "llama.cpp":
        raise UsageError(f"unknown backend {backend!r} (llama.cpp or transformers)")
    path = resolve_model(model)  # a model that cannot be had is named before llama.cpp is imported
    from promptlookup.backends.doctor import ensure_build_checked
    from promptlookup.backends.llama_cpp import LlamaCppBackend

    ensure_build_checked(path, threads)  # once per installed build, in a child process
    return LlamaCppBackend(path, n_ctx=n_ctx, n_threads=threads, n_seq=n_seq)


class Engine:
    """A loaded model that generates, speculating by prompt lookup; see the module docstring.

    ``speculate``: a draft source setting as in the CLI and bench (``"suffix"``, ``"ngram:draft=4"``,
    ``"auto"``, ``"off"``). ``history``: a suffix history file, loaded now (a corrupt or foreign
    file is refused) and written by :meth:`save_history`; ``history_budget`` its size in tokens
    (the oldest requests go first). ``corpus`` (a ``promptlookup index`` file), ``lookup_static``
    (a static cache) and ``cost_curve`` (auto's verify cost curve, JSON) reach every source that
    can use them. ``corpora``: named corpora (``promptlookup index DIR -o NAME``; a name under
    ``corpus_dir``, default ``~/.cache/promptlookup/corpora``, or a corpus directory / index path)
    opened now and drafted from by every request that names none; a request's ``corpora=[...]``
    names its own from :attr:`corpora` (the registry; ``Engine.corpora.open`` adds one).
    ``reuse_prefix``: keep the cache of the prompt prefix shared with the previous
    request.

    ``parallel``: requests run at once, each with ``n_ctx`` positions of its own (llama.cpp holds
    them in one KV cache of ``parallel * n_ctx`` positions and decodes them together; call the engine
    from several threads). ``prefill_chunk``: prompt tokens read per batched step, so a long prompt
    does not stall the requests already decoding. ``n_ctx=None`` sizes the context from the model
    and the memory (:func:`load_backend`). ``grammar_drafts``: under a grammar (``response_format``, a
    forced tool call) draft the tokens it forces (:mod:`promptlookup.drafting.forced`); a request's
    ``grammar_drafts`` overrides it. ``lookup_budget``: follower entries each slot's lookup dynamic
    cache keeps across requests (it learns from every request the slot serves; over the budget its
    counts are halved, :class:`~promptlookup.drafting.lookup.source.LookupSource`); None: unbounded,
    as llama.cpp's one run.
    """

    def __init__(self, model: str | Path | None = None, backend: str = "llama.cpp", *,
                 threads: int | None = None, n_ctx: int | None = None,
                 speculate: str | SourceSpec = DEFAULT_SPECULATE, history: str | Path | None = None,
                 history_budget: int | None = None, corpus: str | Path | None = None,
                 lookup_static: str | Path | None = None, cost_curve: str | Path | None = None,
                 reuse_prefix: bool = True, parallel: int = 1,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, grammar_drafts: bool = True,
                 corpora: Sequence[str] | None = None, corpus_dir: str | Path | None = None,
                 lookup_budget: int | None = DEFAULT_LOOKUP_BUDGET) -> None:
        settings = {"corpus": corpus, "static": lookup_static, "curve": cost_curve}
        self._init_settings(speculate, history, history_budget, settings, reuse_prefix, parallel,
                            prefill_chunk, grammar_drafts, corpora, corpus_dir, lookup_budget)
        self.backend: Model = load_backend(model, backend, n_ctx, threads, n_seq=parallel)
        self._bind()

    @classmethod
    def from_backend(cls, backend: Model, *, speculate: str | SourceSpec = DEFAULT_SPECULATE,
                     history: str | Path | None = None, history_budget: int | None = None,
                     corpus: str | Path | None = None, lookup_static: str | Path | None = None,
                     cost_curve: str | Path | None = None, reuse_prefix: bool = True,
                     parallel: int = 1, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                     grammar_drafts: bool = True, corpora: Sequence[str] | None = None,
                     corpus_dir: str | Path | None = None,
                     lookup_budget: int | None = DEFAULT_LOOKUP_BUDGET) -> Engine:
        """An engine on a backend already loaded (a transformers model of the caller's, the replay
        backend of tests and simulations); ``parallel > 1`` needs a backend that batches
        (:class:`~promptlookup.backends.base.BatchDecoder`) with that many sequences."""
        self = cls.__new__(cls)
        settings = {"corpus": corpus, "static": lookup_static, "curve": cost_curve}
        self._init_settings(speculate, history, history_budget, settings, reuse_prefix, parallel,
                            prefill_chunk, grammar_drafts, corpora, corpus_dir, lookup_budget)
        self.backend = backend
        self._bind()
        return self

    # -- set-up -----------------------------------------------------------------------------
    def _init_settings(self, speculate, history, history_budget, settings, reuse_prefix, parallel,
                       prefill_chunk, grammar_drafts=True, corpora=None, corpus_dir=None,
                       lookup_budget=DEFAULT_LOOKUP_BUDGET) -> None:
        if corpora is not None and (isinstance(corpora, str) or not all(isinstance(c, str) for c in corpora)):
            raise UsageError("corpora must be a list of corpus names or paths")
        self._corpus_refs = tuple(corpora or ())
        self.corpus_dir = Path(corpus_dir) if corpus_dir is not None else None
        if history_budget is not None and history_budget < 1:
            raise UsageError(f"the history budget must be at least 1 token, got {history_budget}")
        if lookup_budget is not None and (isinstance(lookup_budget, bool)
                                          or not isinstance(lookup_budget, int) or lookup_budget < 1):
            raise UsageError(f"lookup_budget must be a positive integer (follower entries) or None, "
                             f"got {lookup_budget!r}")
        self._lookup_budget = lookup_budget
        if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL:
            raise UsageError(f"parallel must be an integer in 1..{MAX_PARALLEL}, got {parallel!r}")
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise UsageError(f"prefill_chunk must be a positive integer, got {prefill_chunk!r}")
        self.parallel = parallel
        self.prefill_chunk = prefill_chunk
        self.grammar_drafts = bool(grammar_drafts)
        self._settings = {k: str(v) for k, v in settings.items() if v is not None}
        self.history_path = Path(history) if history is not None else None
        self._history_budget = history_budget
        self.reuse_prefix = reuse_prefix
        self._lock = threading.RLock()  # what every slot's sources share (history, caches)
        self._factories: dict[str, Any] = {}
        self._grammar_lock = threading.Lock()
        self._grammar_tokenizer: Any = None  # llguidance's view of the vocabulary, built on first use
        self.requests = 0
        self.default_spec = self.spec(speculate)  # flags are checked before any model loads

    def _bind(self) -> None:
        from promptlookup.drafting.suffix.history import DEFAULT_BUDGET, History

        fp = self.backend.fingerprint()
        budget = self._history_budget
        if self.history_path is not None and self.history_path.exists():
            history = History.load(self.history_path, fingerprint=fp, budget=budget)
        else:
            history = History(budget=budget or DEFAULT_BUDGET, fingerprint=fp)
        self.history = history
        from promptlookup.corpora.registry import Corpora

        self.corpora = Corpora(fp, int(self.backend.n_vocab), root=self.corpus_dir,
                               defaults=self._corpus_refs)
        self.run = Run.for_backend(self.backend, lambda: cached_cost_curve(self.backend))
        self.run.history = history
        self.run.lookup_budget = self._lookup_budget
        cost = None
        batched = isinstance(self.backend, BatchDecoder)
        if self.parallel > 1:
            if not batched or self.backend.n_seq < self.parallel:
                raise UsageError(f"parallel={self.parallel} needs a backend that decodes that many sequences "
                                 f"together; {type(self.backend).__name__} does not (use parallel=1)")
            # the batch's draft pricing starts from the single-sequence cost curve (measured now)
            curve = (CostCurve.load(self._settings["curve"]) if "curve" in self._settings
                     else self.run.curve())
            cost = curve.cost
        slots = [Slot(i, SeqView(self.backend, i) if batched else self.backend)  # type: ignore[arg-type]
                 for i in range(self.parallel)]
        self.loop = EngineLoop(self.backend, slots, self.prefill_chunk, cost=cost,
                               reuse_prefix=self.reuse_prefix)
        self.source_for(self.default_spec)  # open its files (and measure auto's curve) now, not mid-request

    def spec(self, speculate: str | SourceSpec | None) -> SourceSpec:
        """The checked spec of a speculation setting, with the engine's files added where they apply."""
        if speculate is None:
            return self.default_spec
        spec = speculate if isinstance(speculate, SourceSpec) else SourceSpec.parse(str(speculate))
        for key in ("history", "budget"):
            if spec.get(key) is not None:
                raise SpecError(f"{spec.label!r}: the engine keeps one history for every request; "
                                "set it with Engine(history=..., history_budget=...)")
        return spec.with_settings(self._settings)

    def source_for(self, spec: SourceSpec, slot: Slot | None = None) -> DraftSource | None:
        """One source per setting and slot, kept across requests (reset per request; what it learns
        stays); without ``slot``, the first slot's (the one a lone caller's requests run on)."""
        if spec.name == OFF:
            return None
        slot = slot or self.loop.pool.slots[0]
        if spec.label not in slot.sources:
            with self._lock:
                if spec.label not in self._factories:
                    self._factories[spec.label] = source_factory(spec, self.run)
                slot.sources[spec.label] = self._factories[spec.label]()
        return slot.sources[spec.label]

    @property
    def learned_bytes(self) -> int:
        """Bytes the slots' draft sources keep from request to request for themselves: lookup's
        dynamic caches, each bounded by ``lookup_budget`` (the shared suffix history is
        :attr:`history`, with its own budget)."""
        return sum(learned_bytes(s) for slot in self.loop.pool.slots for s in list(slot.sources.values()))

    # -- text ---------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return int(self.backend.n_ctx)

    @property
    def model_name(self) -> str:
        path = self.backend.model_path
        return Path(path).name if path is not None else type(self.backend).__name__

    def tokenize(self, text: str) -> list[int]:
        """Text as token ids (with the model's BOS where it wants one); control-token texts stay text."""
        return list(self.backend.tokenize(text))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.backend.detokenize(list(ids))

    def chat_ids(self, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Any] | None = None) -> list[int]:
        """A conversation as prompt ids through the model's own chat template; message content is
        always text, never control tokens. ``tools`` (checked :class:`~promptlookup.tools.Tool` s or
        OpenAI's tool objects) are shown to the model by its template; tool results and assistant tool
        calls in ``messages`` need a template with tool support (else a 400 naming the message)."""
        from promptlookup.chat import messages_tokens

        checked = check_messages(messages)
        if not supports_tools(template_of(self.backend)):
            for i, m in enumerate(checked):
                if m["role"] == "tool" or m.get("tool_calls"):
                    field = "role" if m["role"] == "tool" else "tool_calls"
                    raise RequestError(f"messages[{i}].{field}: this model's chat template has no tool "
                                       "support, so it cannot show tool calls or results to the model",
                                       f"messages.{i}.{field}")
        rendered = [t.for_template() if hasattr(t, "for_template") else dict(t) for t in tools or ()]
        return messages_tokens(self.backend, checked, rendered or None)

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
                 stream: bool = False, **fields: Any) -> Completion | Iterator[Chunk]:
        """Generate from text or token ids. ``options`` (a :class:`RequestOptions`) or ``fields``, its
        fields as keywords (``max_tokens``, ``temperature``, ``stop``, ``seed``, ``speculate``, ...),
        or both (the keywords replace the options' values). Returns a :class:`Completion`, or with
        ``stream=True`` an iterator of :class:`Chunk` whose last one carries it."""
        return self._call("completion", prompt, _options(options, fields), stream)

    def chat(self, messages: Sequence[Mapping[str, Any]], options: RequestOptions | None = None, *,
             stream: bool = False, **fields: Any) -> Completion | Iterator[Chunk]:
        """The assistant's next turn after ``messages`` (system/user/assistant/tool, as OpenAI's).

        With ``tools=[...]`` (OpenAI's function tools) the model's template shows them to the model
        and its reply is parsed into :attr:`Completion.tool_calls`; ``tool_choice`` is ``"auto"``
        (the default), ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name":
        ...}}``, the last two forced by a grammar (docs/agents.md). A stream holds back the text from
        where a call may begin; the last chunk's completion carries the calls."""
        return self._call("chat", messages, _options(options, fields), stream)

    def submit(self, kind: str, prompt: Any, options: RequestOptions,
               emit: Callable[[str, Any], None], cancel: threading.Event | None = None,
               deadline: float | None = None) -> Request | None:
        """Hand a request to the engine loop without waiting: ``kind`` ``"chat"`` (``prompt``:
        messages) or ``"completion"`` (text or token ids). Its checks, tokenizing included, run on the
        loop; ``emit(kind, payload)`` is called there with ``"start"`` (the checks passed), each
        ``"chunk"``, an ``"error"`` (the exception) and ``"end"``, and must not block. ``cancel``:
        set it to end the request at its next step; ``deadline``: ``time.monotonic()`` by which it
        must be done, waiting for a slot included (a server's); else ``options.timeout`` counts from
        when it gets a slot. None: the loop is stopping or its queue (:attr:`EngineLoop.max_queue`)
        is full."""
        if kind not in ("chat", "completion"):
            raise ValueError(f"unknown request kind {kind!r}")
        req = Request(iter(()), emit, cancel or threading.Event(), deadline, cancelled=options.cancelled)
        req.ops = self._request(kind, prompt, options.replace(cancelled=req.is_cancelled), req)
        return req if self.loop.submit(req) else None

    def _call(self, kind: str, prompt: Any, opts: RequestOptions,
              stream: bool) -> Completion | Iterator[Chunk]:
        """A library call: the request on the loop; this thread waits for its checks (a bad request
        raises here, before a stream is handed out), then reads its chunks."""
        if is_compute_thread():
            raise RuntimeError("an engine cannot be called from its own loop's thread")
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        req = self.submit(kind, prompt, opts, lambda k, p: events.put((k, p)))
        if req is None:
            raise BackendError("the engine is closed")
        first, payload = events.get()
        if first != "start":
            events.get()  # its "end"
            raise payload
        chunks = _read_chunks(events, lambda: self.loop.withdraw(req))
        return chunks if stream else _last(chunks)

    def _request(self, kind: str, prompt: Any, opts: RequestOptions,
                 req: Request) -> Generator[Any, Any, None]:
        """One request as the engine loop runs it (:mod:`promptlookup.batching.engine_loop`): its
        checks, then ``Started``, a slot (``NeedSlot``), its forwards, and its chunks."""
        tools: ToolChunks | None = None
        detokenize: Callable[[Sequence[int]], str] = self.backend.detokenize
        if kind == "completion":
            if opts.tool_choice.mode != "none":
                raise RequestError("tools need a chat (messages through the model's template): use chat()",
                                   "tools")
            ids = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        elif opts.tool_choice.mode == "none":
            # the reply is text, never parsed; the tools are still shown where the template can show
            # them, so an agent's prompt (and the cached prefix it reuses) is the same on every turn
            shown = opts.tools if supports_tools(template_of(self.backend)) else None
            ids = self.chat_ids(prompt, shown)
            opts = opts.replace(tools=None, tool_choice=None)
        else:
            choice = opts.tool_choice
            fmt = format_for(self.backend)
            declared = list(opts.tools or ())
            ids = self.chat_ids(prompt, declared)
            tags = tag_tokens(self.backend, fmt)  # the tags that are one token, as Qwen2.5's <tool_call>
            grammar = None
            if choice.forced:
                special = self._grammar_vocab().is_special_token
                grammar = fmt.grammar(declared, choice, {text: t for text, t in tags.items() if special(t)})
            opts = opts.replace(tools=None, tool_choice=None, response_format=grammar)
            detokenize = tag_renderer(self.backend.detokenize, self.backend, tags)
            tools = ToolChunks(fmt, declared, lenient=choice.mode == "auto")
        # every setting is checked before the first token (and before a stream is handed out)
        if not ids:
            raise RequestError("the prompt is empty: at least one token is needed", "prompt")
        check_prompt_fits(len(ids), self.n_ctx)
        self.corpora.check(opts.corpora)  # an unknown name is a 400 before the first token
        spec = self.spec(opts.speculate)
        self._check_bias(opts)
        sampler = opts.sampler(self._constraint(opts))
        stops = opts.stops()
        yield Started()
        slot, keep = yield NeedSlot(ids)
        if req.deadline is None and opts.timeout is not None:  # a caller's time limit starts now
            req.deadline = time.monotonic() + opts.timeout
        yield from self._run_on(slot, keep, ids, opts, spec, sampler, stops, detokenize, req.deadline,
                                None if tools is None else tools.feed)

    def _check_ids(self, prompt: Sequence[int]) -> list[int]:
        ids = []
        n_vocab = int(self.backend.n_vocab)
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < n_vocab:
                raise RequestError(f"token ids must be integers in 0..{n_vocab - 1}, got {t!r}", "prompt")
            ids.append(int(t))
        return ids

    def _check_bias(self, opts: RequestOptions) -> None:
        n_vocab = int(self.backend.n_vocab)
        for t, _ in opts.logit_bias or ():
            if t >= n_vocab:
                raise RequestError(f"logit_bias: token {t} is outside the vocabulary (0..{n_vocab - 1})",
                                   "logit_bias")

    def _grammar_vocab(self) -> Any:
        """llguidance's view of the model's vocabulary, built on first use (a second on a large one)."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = grammar_tokenizer(self.backend)
            return self._grammar_tokenizer

    def _constraint(self, opts: RequestOptions) -> Constraint | None:
        """The grammar state of ``opts.response_format`` on this model (None: free text)."""
        if opts.response_format is None:
            return None
        vocab = self._grammar_vocab()
        return Constraint(vocab, opts.response_format, eog_ids(self.backend))

    def _drafter(self, source: DraftSource | None, opts: RequestOptions,
                 sampler: Sampler) -> DraftSource | None:
        """What the request's loop drafts with: ``source``, under a grammar wrapped so that it drafts
        the tokens the grammar forces and never past where the grammar refuses
        (:mod:`promptlookup.drafting.forced`; ``grammar_drafts=False`` or ``off`` leave it as it is)."""
        on = self.grammar_drafts if opts.grammar_drafts is None else opts.grammar_drafts
        if source is None or sampler.constraint is None or not on:
            return source
        return GrammarDrafts(source, sampler.constraint)

    def _run_on(self, slot: Slot, keep: int, ids: list[int], opts: RequestOptions, spec: SourceSpec,
                sampler: Sampler, stops: list[str], detokenize: Callable[[Sequence[int]], str],
                deadline: float | None,
                post: Callable[[Chunk], list[Chunk]] | None = None) -> Generator[Any, Any, None]:
        """One request on ``slot`` (its cache view, its sources), ``keep`` cached prompt positions
        reused: yields its forwards (sent back their tokens) and its chunks; its text is
        ``detokenize`` of its tokens (a tool request's writes its tags: :func:`tag_renderer`), and
        ``post`` turns each chunk into the ones handed out (a tool request's: :meth:`ToolChunks.feed`)."""
        def out(chunk: Chunk) -> list[Chunk]:
            return [chunk] if post is None else post(chunk)

        source = self.source_for(spec, slot)
        view = slot.view
        tracker = TextTracker(detokenize, stops)
        ended_by = None
        emitted = 0  # tokens handed out in chunks so far
        slot.cache_valid = False
        seq = slot.seq
        # a request that drafts nothing (``off``) has no draft to price: the pricing's arithmetic, run
        # every step, is then only cost
        priced = self.loop.pricing is not None and source is not None
        limit = (lambda: self.loop.draft_cap(seq)) if priced else None
        settled = (lambda d, a: self.loop.settled(seq, d, a)) if priced else None
        with self.corpora.lease(opts.corpora) as indexes:  # mapped until this request ends
            use_corpora(source, indexes or None)
            try:
                choices_before = _choices(source)
                drafter = self._drafter(source, opts, sampler)
                ops = step_ops(view, ids, opts.max_tokens, drafter, spec.draft, sampler, keep,
                               draft_limit=limit, settled=settled)
                try:
                    item = next(ops)
                    while True:
                        if isinstance(item, Forward):
                            try:
                                reply = yield item
                            except PromptEnded as ended:  # cancelled or out of time while reading the prompt
                                ended_by = ended.why
                                ops.close()
                                name = getattr(drafter, "name", "off")
                                none = Counters(source=name, draft_max=spec.draft, prompt_tokens=len(ids))
                                gen = Generation([], none, ended_by, seed=sampler.seed)
                                break
                            item = ops.send(reply)
                            continue
                        piece = tracker.add(item)
                        if tracker.stopped:
                            ended_by = "stop"
                        elif deadline is not None and time.monotonic() > deadline:
                            ended_by = "time"
                        elif opts.cancelled is not None and opts.cancelled():
                            ended_by = "cancelled"
                        if piece:
                            chunk = self._chunk(piece, tracker.tokens[emitted:], emitted, ids, sampler)
                            emitted = len(tracker.tokens)
                            yield from out(chunk)
                        item = ops.send(ended_by is not None)
                except StopIteration as done:
                    gen = done.value
            except GeneratorExit:  # closed early: the cache still holds what the view says
                slot.cache_valid = True
                raise
            finally:
                use_corpora(source, None)
        slot.cache_valid = True
        gen.counters.cached_tokens = keep
        with self._lock:
            self.requests += 1
            if source is not None and gen.tokens:  # it ran (the loop's first token ends the prefill)
                source.commit()  # this request joins the history (and lookup's dynamic cache)
                save_state(spec, source)
        stopped_by = ended_by or gen.stopped_by
        n = len(tracker.tokens) if tracker.stopped else len(gen.tokens)
        completion = Completion(
            text=tracker.text, tokens=gen.tokens[:n], prompt_tokens=len(ids),
            finish_reason="stop" if stopped_by in ("eos", "stop") else "length",
            stopped_by=stopped_by, counters=gen.counters, speculate=spec.label,
            seed=gen.seed, stop=tracker.stop,
            logprobs=gen.logprobs[:n] if gen.logprobs is not None else None,
            source_choices=_choice_delta(choices_before, _choices(source)))
        last = self._chunk(tracker.finish(), completion.tokens[emitted:], emitted, ids, sampler)
        last.completion = completion
        yield from out(last)

    @staticmethod
    def _chunk(text: str, tokens: list[int], first: int, ids: list[int], sampler: Sampler) -> Chunk:
        """A chunk of ``tokens`` (the ``first``-th generated token on), with their logprobs if asked."""
        lps = None
        if sampler.logprobs is not None:
            lps = [sampler.recorded[len(ids) + first + j] for j in range(len(tokens))]
        return Chunk(text, list(tokens), logprobs=lps)

    # -- memory -------------------------------------------------------------------------------
    def save_history(self, path: str | Path | None = None) -> int | None:
        """Write the suffix history atomically (to ``path`` or the engine's history file); returns
        its size in bytes, or None when there is nowhere to write it."""
        target = Path(path) if path is not None else self.history_path
        if target is None:
            return None
        with self._lock:
            return self.history.save(target)

    def close(self) -> None:
        if getattr(self, "loop", None) is not None:
            self.loop.close()
        if getattr(self, "corpora", None) is not None:
            self.corpora.close()
        self.backend.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI-style chat messages as the plain dicts chat templates read: role and text content
    (text parts joined); an assistant's ``tool_calls`` with their arguments decoded to objects (as
    Hugging Face's templates expect); a tool result's ``tool_call_id`` and ``name``. Anything else
    (images, the legacy ``function`` role) is refused with the message's index."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RequestError(f"messages[{i}] must be an object with role and content", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                               "messages")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, Mapping) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise RequestError(f"messages[{i}].content[{j}]: only text parts are supported",
                                       "messages")
                parts.append(part["text"])
            content = "".join(parts)
        calls = _tool_calls_in(m.get("tool_calls"), i) if role == "assistant" else None
        if content is None and (role == "assistant" or role == "tool"):
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be text, got {type(content).__name__}",
                               "messages")
        if "\x00" in content:
            raise RequestError(f"messages[{i}].content holds a NUL character", "messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        if calls:
            msg["tool_calls"] = calls
        if role == "tool":
            for key in ("tool_call_id", "name"):
                value = m.get(key)
                if value is not None and not isinstance(value, str):
                    raise RequestError(f"messages[{i}].{key} must be text", f"messages.{i}.{key}")
                if value is not None:
                    msg[key] = value
        out.append(msg)
    return out


def _tool_calls_in(calls: Any, i: int) -> list[dict[str, Any]] | None:
    """An assistant message's ``tool_calls`` as templates read them: arguments as an object."""
    if calls is None:
        return None
    where = f"messages.{i}.tool_calls"
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise RequestError(f"{where} must be a list of calls", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}.{j}.function.name must be a function's name",
                               f"{where}.{j}.function.name")
        args: Any = fn.get("arguments", "{}")  # type: ignore[union-attr]
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise RequestError(f"{where}.{j}.function.arguments is not JSON",
                                   f"{where}.{j}.function.arguments") from None
        if not isinstance(args, Mapping):
            raise RequestError(f"{where}.{j}.function.arguments must be a JSON object",
                               f"{where}.{j}.function.arguments")
        entry: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
        call_id = call.get("id")
        if isinstance(call_id, str):
            entry["id"] = call_id
        out.append(entry)
    return out


def _read_chunks(events: queue.SimpleQueue[tuple[str, Any]], withdraw: Callable[[], None]) -> Iterator[Chunk]:
    """A library caller's chunks, as the engine loop emits them (after ``"start"``); a caller that
    stops reading early ends the request at its next step (its slot is freed), not at GC."""
    ended = False
    try:
        while True:
            kind, payload = events.get()
            if kind == "chunk":
                yield payload
            elif kind == "error":
                raise payload
            elif kind == "end":
                ended = True
                return
    finally:
        if not ended:
            withdraw()


def _last(chunks: Iterator[Chunk]) -> Completion:
    """The completion a stream of chunks ends with."""
    last = None
    for last in chunks:  # noqa: B007 - the last chunk carries the completion
        pass
    assert last is not None and last.completion is not None
    return last.completion


class ToolChunks:
    """The chunks of a reply that may call tools, fed one by one (:meth:`feed`): text goes out as
    long as it is surely content (:meth:`~promptlookup.tools.ToolFormat.safe_prefix`); the rest is
    held, with its tokens and logprobs, until the end, where the whole reply is parsed. Parsed calls
    go on the completion (its text then the content before them, finish reason "tool_calls"); a reply
    that does not parse, or that the token limit cut, is text, as without tools.

    ``lenient`` (``tool_choice: "auto"``): a reply that is only JSON calls of the tools, bare or
    fenced (:mod:`promptlookup.lenient`), is calls too, when the format's own parse finds none; the
    whole reply is held while it may still become one, and released from the first character that
    rules that out. Failing that, fenced calls in prose are calls (:func:`~promptlookup.lenient.parse_mixed`)
    and the prose around them the content: prose streams up to the first fence that may be a call.
    Held text depends only on the text so far, never on how it was cut into chunks, so a stream's
    content and calls are the whole answer's."""

    def __init__(self, fmt: ToolFormat, tools: Sequence[Any], lenient: bool = False) -> None:
        self.fmt = fmt
        self.tools = list(tools)
        self.names = [t.name for t in tools]
        self.lenient = lenient
        self.mixed = lenient
        self.text = ""
        self.sent = 0
        self.tokens: list[int] = []
        self.lps: list[TokenLogprob] | None = None

    def feed(self, chunk: Chunk) -> list[Chunk]:
        """What goes out after ``chunk``: nothing, a chunk of safe text, or the last chunk."""
        self.text += chunk.text
        self.tokens.extend(chunk.tokens)
        if chunk.logprobs is not None:
            self.lps = [*(self.lps or ()), *chunk.logprobs]
        c = chunk.completion
        text, sent = self.text, self.sent
        if c is None:
            self.lenient = self.lenient and lenient_possible(text, self.names)
            safe = 0 if self.lenient else self.fmt.safe_prefix(text)
            if self.mixed:
                safe = min(safe, mixed_hold(text, self.names))
            safe = max(sent, safe)
            if safe <= sent:
                return []
            out = Chunk(text[sent:safe], self.tokens, logprobs=self.lps)
            self.sent, self.tokens, self.lps = safe, [], None
            return [out]
        parsed = self.fmt.parse(c.text, self.tools) if c.finish_reason == "stop" else None
        if parsed is None and self.mixed and c.finish_reason == "stop":
            calls = lenient_parse(c.text, self.tools) if self.lenient else None
            parsed = ("", calls) if calls is not None else parse_mixed(c.text, self.tools)
        if parsed is not None:
            content, calls = parsed
            c.text, c.tool_calls, c.finish_reason = content, calls, "tool_calls"
            return [Chunk(content[sent:], self.tokens, completion=c, logprobs=self.lps)]
        return [Chunk(text[sent:], self.tokens, completion=c, logprobs=self.lps)]


def _options(options: RequestOptions | None, fields: Mapping[str, Any]) -> RequestOptions:
    """The request's options: ``options`` with ``fields`` replaced, or built from ``fields``."""
    if options is None:
        return RequestOptions(**fields)
    if not isinstance(options, RequestOptions):
        raise UsageError(f"options must be RequestOptions, got {type(options).__name__}")
    return options.replace(**fields) if fields else options


def _choices(source: Any) -> dict[str, int]:
    """auto's count of steps drafted per source so far (empty for a fixed source)."""
    report = report_of(source)
    return dict(report["per_source"]) if report is not None else {}


def _choice_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
