"""The protocol every backend implements for the speculative loop.

Logits stay inside the backend: it returns the argmax id of every position it decoded, which is
all the loop needs to accept or reject drafts, instead of tens of thousands of floats per position
through Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from promptlookup.errors import UserError


class BackendError(UserError, RuntimeError):
    """A backend could not do what was asked (model load, decode, context overflow)."""


@runtime_checkable
class Backend(Protocol):
    """Greedy decoding with a KV cache that can be rolled back."""

    n_ctx: int
    n_past: int

    def prefill(self, ids: Sequence[int]) -> int:
        """Clear the cache, decode the prompt, return the argmax after its last token."""

    def verify(self, ids: Sequence[int]) -> list[int]:
        """Decode ``ids`` at positions ``n_past..`` in one batch; argmax after each of them."""

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on; ``n_past`` becomes ``n_keep``."""

    def is_eog(self, token: int) -> bool:
        """True when ``token`` ends generation (EOS, EOT, ...)."""

