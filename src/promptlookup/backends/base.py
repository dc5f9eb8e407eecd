"""The protocol every backend implements for the speculative loop.

Logits stay inside the backend: it returns the chosen id of every position it decoded (the argmax
when greedy, the :class:`~promptlookup.sampling.Sampler`'s choice when sampling), which is all the
loop needs to accept or reject drafts, instead of tens of thousands of floats per position through
Python. A backend that samples keeps the ids in its cache, since penalties read the tokens before a
position, and hands the sampler its logits rows (``Sampler.sample_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from promptlookup.sampling import Sampler

from promptlookup.errors import UserError


class BackendError(UserError, RuntimeError):
    """A backend could not do what was asked (model load, decode, context overflow)."""


@runtime_checkable
class Backend(Protocol):
    """Decoding with a KV cache that can be rolled back; greedy unless given a sampler."""

    n_ctx: int
    n_past: int

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        """Decode the prompt, return the token chosen after its last token.

        The cache is cleared, except its first ``keep`` positions when they hold ``ids[:keep]``
        already (:func:`common_prefix` of :attr:`tokens` and ``ids``): a follow-up request that
        re-sends a conversation then decodes only what is new."""

    @property
    def tokens(self) -> Sequence[int]:
        """The ids the cache holds, position by position (what prefix reuse compares against)."""

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        """Decode ``ids`` at positions ``n_past..`` in one batch; the token chosen after each.

        Greedy: the argmax after every one of them. With a sampler the list may end at the first
        position whose choice differs from the next token of ``ids`` (a rejected draft)."""

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on; ``n_past`` becomes ``n_keep``."""

    def is_eog(self, token: int) -> bool:
        """True when ``token`` ends generation (EOS, EOT, ...)."""



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
