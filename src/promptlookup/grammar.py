"""Structured output: a grammar (JSON, a JSON schema) as a token mask inside the sampler.

Why llguidance. Of the three maintained engines (xgrammar, llguidance, outlines-core) xgrammar pulls
torch and triton into a CPU install; outlines-core compiles a whole-vocabulary index per schema
(175 ms for a small tool schema on SmolLM2's 49k vocabulary, spikes of 8 ms per token) and covers a
subset of JSON Schema; llguidance (llama.cpp's and vLLM's, Rust, no dependencies) compiles a schema in
about a millisecond and computes a mask lazily, ~10 us median per token on the same schema
(``benchmarks/grammar_cost.py``, docs/agents.md).

Why the state is synced, not pushed. The sampler is called for position ``n`` with the tokens
before it (``tokens[:n]``, drafts included); the grammar state at ``n`` is a pure function of the
constrained tokens ``tokens[start:n]``. :meth:`Constraint.sync` rolls the matcher back to the
longest prefix it shares with them and consumes the rest, so it advances through accepted tokens and
follows every KV-cache rollback without the loop or the backend telling it anything, exactly like
the position-keyed random stream. A drafted token the grammar forbids is never consumed: the masked
choice at its position differs from it, so the verify stops there as at any mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from promptlookup.errors import RequestError

MAX_SCHEMA_CHARS = 100_000  # a response_format's schema, as JSON text
# Whitespace between JSON tokens: llama.cpp's json-schema-to-grammar rule (one space, or a line break
# and up to 20 spaces or tabs). llguidance's default ([ \t\n\r]+) lets a small model pad forever.
JSON_OPTIONS = {"whitespace_pattern": r"(?:\x20|\n{1,2}[\x20\t]{0,20})?"}


@dataclass(frozen=True)
class Grammar:
    """A checked grammar (llguidance's JSON grammar text) and what asked for it, for messages."""

    text: str
    kind: str  # "json_object", "json_schema", ...

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``json_object`` mode)."""
        return cls.json_schema({"type": "object"}, kind="json_object")

    @classmethod
    def json_schema(cls, schema: Any, kind: str = "json_schema", param: str = "response_format") -> Grammar:
        """A JSON value valid against ``schema`` (a dict, or JSON text); refused with ``param``
        named when it is not a schema llguidance can enforce."""
        import llguidance

        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise RequestError(f"{param}: the schema is not JSON ({exc})", param) from None
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, Mapping):
            raise RequestError(f"{param}: a JSON schema must be an object, got {type(schema).__name__}",
                               param)
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            raise RequestError(f"{param}: the schema is {len(text)} characters (at most "
                               f"{MAX_SCHEMA_CHARS})", param)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise RequestError(f"{param}: {exc}", param) from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise RequestError(f"{param}: the schema cannot be enforced: {error}", param)
        return cls(grammar, kind)


def parse_response_format(value: Any, param: str = "response_format") -> Grammar | None:
    """OpenAI's ``response_format`` as a :class:`Grammar` (None for ``{"type": "text"}``)."""
    if value is None or isinstance(value, Grammar):
        return value
    if not isinstance(value, Mapping):
        raise RequestError(f"{param} must be an object with a type, got {type(value).__name__}", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise RequestError(f"{param}: json_schema must be an object with a schema "
                               '({"name": ..., "schema": {...}})', param)
        return Grammar.json_schema(spec.get("schema", {}), param=param)  # no schema: any JSON value
    raise RequestError(f"{param}.type must be text, json_object or json_schema, got {kind!r}", param)


def grammar_tokenizer(backend: Any) -> Any:
    """llguidance's view of ``backend``'s vocabulary (built once per backend: ~1 s on 49k tokens).

    A backend offers ``grammar_tokenizer()`` (llama.cpp: its own vocabulary object) or
    ``token_bytes(id)`` and ``eog_ids`` (the generic wrapper here); any other backend cannot
    constrain its output, and a request for it is refused."""
    own = getattr(backend, "grammar_tokenizer", None)
    if callable(own):
        return own()
    if not hasattr(backend, "token_bytes"):
        raise RequestError(f"the {getattr(backend, 'name', 'this')} backend cannot constrain its output "
                           "(no token bytes)", "response_format")
    import llguidance

    wrapper = _Wrapper(backend)
    return llguidance.LLTokenizer(wrapper, eos_token=wrapper.eog or None)


def eog_ids(backend: Any) -> list[int]:
    """The ids that end ``backend``'s generation (its ``eog_ids``, else found with ``is_eog``)."""
    ids = getattr(backend, "eog_ids", None)
    if ids is None:
        ids = [t for t in range(int(backend.n_vocab)) if backend.is_eog(t)]
    return sorted(int(t) for t in ids)


class _Wrapper:
    """What ``llguidance.LLTokenizer`` reads from a tokenizer (see ``llguidance.TokenizerWrapper``)."""

    def __init__(self, backend: Any) -> None:
        n = int(backend.n_vocab)
        eog = eog_ids(backend)
        controls = set(backend.control_texts())
        self.tokens = [bytes(backend.token_bytes(t)) for t in range(n)]
        self.special_token_ids = [t for t in range(n)
                                  if t in eog or self.tokens[t].decode("utf-8", "replace") in controls]
        self.eos_token_id = eog[0] if eog else n - 1
        self.eog = eog
        self.bos_token_id = None
        self.is_tokenizer_wrapper = True
        self._backend = backend

    def __call__(self, s: bytes | str) -> list[int]:
        text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        return list(self._backend.tokenize(text, add_special=False, parse_special=False))


class Constraint:
    """One generation's grammar state: which tokens may come at a position, given those before it.

    Positions from ``start`` (the prompt's length) on are constrained. The matcher's state follows
    the tokens it is shown (:meth:`sync`); :meth:`allows` and :meth:`allowed` read the synced
    state's mask (computed once per state) and change nothing."""

    def __init__(self, tokenizer: Any, grammar: Grammar, eog: Sequence[int] = ()) -> None:
        import llguidance

        self.grammar = grammar
        self.n_vocab = int(tokenizer.vocab_size)
        self._matcher = llguidance.LLMatcher(tokenizer, grammar.text, log_level=0)
        if self._matcher.is_error():
            raise RequestError(f"{grammar.kind}: {self._matcher.get_error()}", "response_format")
        self._eog = tuple(int(t) for t in eog)
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self._consumed: list[int] = []  # what the matcher has consumed
        self._version = 0  # bumped on every change of state; the mask is computed once per version
        self._bits_for = -1
        self.start = 0
        self.masks = 0  # masks computed (the benchmark's count)

    def end(self, row: np.ndarray) -> int | None:
        """The end-of-generation token the model ranks first in ``row`` (the lowest id on a tie; for
        a chat model its turn's end, as ``<|im_end|>``), None where none is known."""
        ids = [t for t in self._eog if 0 <= t < len(row)]
        if not ids:
            return None
        values = np.asarray(row, dtype=np.float32)[ids]
        return ids[int(np.argmax(values))]

    def reset(self, start: int) -> None:
        self._matcher.reset()
        self._consumed = []
        self._version += 1
        self.start = int(start)

    def sync(self, tokens: Sequence[int], n: int) -> bool:
        """Bring the matcher to the state after ``tokens[start:n]``; False when that prefix is past
        the grammar's end (a row after a drafted end of generation, which the loop never reads)."""
        target = [int(t) for t in tokens[self.start : n]]
        have = self._consumed
        if have == target:
            return True
        if len(have) <= len(target) and have == target[: len(have)]:
            common = len(have)
        else:  # a rollback: the backend's tokens changed at their tail
            common = 0
            limit = min(len(have), len(target))
            while common < limit and have[common] == target[common]:
                common += 1
            if not self._matcher.rollback(len(have) - common):  # past its history: start over
                self._matcher.reset()
                common = 0
            del have[common:]
        self._version += 1
        rest = target[common:]
        ok = self._matcher.validate_tokens(rest) if rest else 0
        if ok:
            self._matcher.consume_tokens(rest[:ok])
            have.extend(rest[:ok])
        # tokens the grammar refuses stay unconsumed (``have`` stays a proper prefix of the target)
        return ok == len(rest)

    # -- what a draft source may read (promptlookup.drafting.forced.GrammarView) -------------------
    def forced(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces after ``tokens`` (the whole confirmed stream,
        prompt included): llguidance's fast-forward tokens, the forced bytes in the tokenizer's own
        tokenization (``{"name": "`` under a schema whose object has one first property). Empty where
        the grammar leaves a choice, or past its end. Reading them changes no state the sampler sees
        (it syncs to its own prefix before every mask)."""
        if limit <= 0 or not self.sync(tokens, len(tokens)) or self._matcher.is_stopped():
            return []
        return [int(t) for t in self._matcher.compute_ff_tokens()[:limit]]

    def valid(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the grammar allows after ``tokens``: a draft is cut
        there, since the masked choice at the first forbidden one differs from it anyway."""
        if not draft:
            return 0
        if not self.sync(tokens, len(tokens)):
            return 0
        return int(self._matcher.validate_tokens([int(t) for t in draft]))

    def _fill(self) -> np.ndarray:
        if self._bits_for != self._version:
            self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self._bits_for = self._version
            self.masks += 1
        return self._bits

    def allows(self, token: int) -> bool:
        """Whether the synced state allows ``token`` next."""
        bits = self._fill()
        t = int(token)
        return 0 <= t < self.n_vocab and bool((int(bits[t >> 5]) >> (t & 31)) & 1)

    def allowed(self, n_vocab: int) -> np.ndarray:
        """The synced state's mask over ``n_vocab`` ids (ids beyond the grammar's vocabulary: never)."""
        bits = self._fill()
        mask = np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)
        if n_vocab != self.n_vocab:
            full = np.zeros(n_vocab, dtype=bool)
            k = min(n_vocab, self.n_vocab)
            full[:k] = mask[:k]
            mask = full
        if not mask.any():  # the grammar is complete or stuck: only the end of generation remains
            for t in self._eog:
                if 0 <= t < n_vocab:
                    mask[t] = True
        return mask


def apply_mask(row: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``row`` with forbidden ids at -inf (a copy)."""
    return np.where(mask, row, np.float32(-np.inf)).astype(np.float32, copy=False)
