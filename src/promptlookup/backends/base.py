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

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None) -> int:
        """Clear the cache, decode the prompt, return the token chosen after its last token."""

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        """Decode ``ids`` at positions ``n_past..`` in one batch; the token chosen after each.

        Greedy: the argmax after every one of them. With a sampler the list may end at the first
        position whose choice differs from the next token of ``ids`` (a rejected draft)."""

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on; ``n_past`` becomes ``n_keep``."""

    def is_eog(self, token: int) -> bool:
        """True when ``token`` ends generation (EOS, EOT, ...)."""

