"""The contract of a backend: :class:`Decoder` (what the speculative loop needs) and :class:`Model`
(what the public :class:`~promptlookup.api.Engine` needs besides).

Logits stay inside the backend: it returns the chosen id of every position it decoded (the argmax
when greedy, the :class:`~promptlookup.sampling.Sampler`'s choice when sampling), which is all the
loop needs to accept or reject drafts, instead of tens of thousands of floats per position through
Python. A backend that samples keeps the ids in its cache, since penalties read the tokens before a
position, and hands the sampler its logits rows (``Sampler.sample_rows``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from promptlookup.sampling import Sampler

from promptlookup.errors import UserError


class BackendError(UserError, RuntimeError):
    """A backend could not do what was asked (model load, decode, context overflow)."""


@runtime_checkable
class Decoder(Protocol):
    """What the speculative loop needs: decoding with a KV cache that can be rolled back; greedy
    unless given a sampler. Every backend and every test double implements all of it, with these
    exact signatures, so the loop calls each method one way."""

    n_ctx: int
    n_past: int

    @property
    def tokens(self) -> Sequence[int]:
        """The ids the cache holds, position by position (what prefix reuse compares against)."""

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        """Decode the prompt, return the token chosen after its last token.

        The cache is cleared, except its first ``keep`` positions when they hold ``ids[:keep]``
        already (:func:`common_prefix` of :attr:`tokens` and ``ids``): a follow-up request that
        re-sends a conversation then decodes only what is new."""

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        """Decode ``ids`` at positions ``n_past..`` in one batch; the token chosen after each.

        Greedy: the argmax after every one of them. With a sampler the list may end at the first
        position whose choice differs from the next token of ``ids`` (a rejected draft)."""

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on; ``n_past`` becomes ``n_keep``."""

    def is_eog(self, token: int) -> bool:
        """True when ``token`` ends generation (EOS, EOT, ...)."""


@runtime_checkable
class Model(Decoder, Protocol):
    """What :class:`~promptlookup.api.Engine` needs beyond the loop: text in and out, the chat
    template, the vocabulary's identity (files are checked against it), and a name for reports.

    ``model_path`` is the file the weights came from (None for a model handed in by the caller);
    ``n_threads`` the CPU threads it decodes with (a cost curve is measured per thread count)."""

    name: str  # the backend's kind: "llama.cpp", "transformers", ...
    n_vocab: int
    n_threads: int
    model_path: Any

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Text as ids (with BOS where the model wants one); control-token texts stay text unless
        ``parse_special`` (the chat template's own text only)."""

    def detokenize(self, ids: Sequence[int]) -> str:
        """Ids as text (invalid UTF-8 replaced)."""

    def fingerprint(self) -> str:
        """A short id of the tokenizer, written into and checked against every file of token ids."""

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The conversation through the model's chat template, ending where the assistant speaks;
        ``tools`` (OpenAI's tool objects) are handed to the template (promptlookup.tools)."""

    def control_texts(self) -> list[str]:
        """The texts of the control tokens (a message may not smuggle them in)."""

    def close(self) -> None:
        """Free the model (idempotent)."""

    # Optional, for structured output (promptlookup.grammar): ``grammar_tokenizer()`` (llguidance's
    # tokenizer over the vocabulary) or ``token_bytes(id)``; a backend with neither refuses
    # ``response_format``. Not part of the Protocol, so test doubles need not implement it.
    # Optional, for tool calling (promptlookup.tools): ``chat_template``, the template's text, read
    # for its tool support and call format; a backend without it refuses ``tools``.


@dataclass
class SeqDecode:
    """One sequence's share of a batched forward: ``ids`` go at that sequence's next positions.

    ``want``: ``"all"`` -- the token chosen after each of them (a verify: greedy, the argmax after
    every one; with a sampler the list may end at the first choice that rejects the next id, as
    :meth:`Decoder.verify`); ``"last"`` -- the choice after the last one only (the end of a prompt);
    ``"none"`` -- nothing (a prompt chunk that more chunks follow)."""

    seq: int
    ids: Sequence[int]
    want: str = "all"
    sampler: Sampler | None = None


@runtime_checkable
class BatchDecoder(Protocol):
    """A backend that holds ``n_seq`` sequences in one KV cache and decodes several of them in one
    forward (continuous batching, :mod:`promptlookup.batching`). A backend without it serves one
    sequence at a time behind the same API.

    Each sequence has its own positions (``0..n_ctx``) and its own cached ids; one sequence's choices
    never read another's cache. Where batched logits equal single ones (an invariant build, the test
    doubles) a sequence's choices are the ones it gets decoded alone."""

    n_seq: int  # sequences it holds: ids 0..n_seq - 1
    n_ctx: int  # positions per sequence
    n_batch: int  # most tokens one forward takes (decode_many splits a larger batch)

    def seq_tokens(self, seq: int) -> Sequence[int]:
        """The ids sequence ``seq`` holds in the cache, position by position."""

    def decode_many(self, parts: Sequence[SeqDecode]) -> list[list[int]]:
        """Decode every part together, at most one part per sequence; what each part wanted, in order.

        Nothing is decoded when a part does not fit (its sequence's cache would pass ``n_ctx``, a
        token outside the vocabulary): :class:`BackendError` before the forward."""

    def seq_rollback(self, seq: int, n_keep: int) -> None:
        """Drop sequence ``seq``'s cached positions from ``n_keep`` on (0 clears it)."""

    def seq_copy(self, src: int, dst: int, n_keep: int) -> None:
        """Make sequence ``dst`` hold the first ``n_keep`` cached positions of ``src`` (what ``dst``
        held is dropped): a prompt prefix that another sequence computed is copied, not computed
        again. ``src`` is unchanged. The copy equals a computed prefix where batched logits equal
        single ones."""

    def is_eog(self, token: int) -> bool:
        """True when ``token`` ends generation (EOS, EOT, ...)."""

    def forward_sizes(self, parts: tuple[tuple[int, int], ...]) -> Sequence[int]:
        """The token counts of the forwards :meth:`decode_many` computes for ``(seq, tokens)`` parts,
        given in increasing sequence order (what a round costs: the batch pricing sums a forward's
        cost over them). ``[sum of tokens]`` for a backend that decodes any mix in one forward.

        Why a sorted tuple rather than a mapping: the pricing asks for up to nine layouts per
        sequence per step that differ in one part, and builds them from one sorted list; a backend
        may remember the answer per layout (the tuple is its key)."""


def one_turn(user: str, system: str | None = None) -> list[dict[str, str]]:
    """The messages of a one-turn chat: an optional system message, then the user's."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def common_prefix(cached: Sequence[int], ids: Sequence[int]) -> int:
    """Positions of the cache that can be kept for ``ids``: their common prefix, leaving at least the
    last prompt token to decode (its logits choose the first new token)."""
    n = min(len(cached), len(ids) - 1)
    i = 0
    while i < n and cached[i] == ids[i]:
        i += 1
    return max(i, 0)


def check_keep(cached: Sequence[int], ids: Sequence[int], keep: int) -> None:
    """Refuse a ``keep`` that the cache cannot honour (a caller's bug, never a user's)."""
    if not 0 <= keep < len(ids) or keep > len(cached) or list(cached[:keep]) != list(ids[:keep]):
        raise BackendError(f"cannot keep {keep} cached positions for a {len(ids)}-token prompt")
