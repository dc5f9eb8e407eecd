"""The contract between a draft source and the speculative loop.

A source is told every confirmed token (the prompt first, then what the model emits) and, when
asked, proposes up to ``k`` tokens that it guesses come next. It returns the features a
controller needs to judge the guess (how long the match was, which source), never a probability
the model computed: drafting is model-free by design.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Draft:
    """Up to ``k`` proposed token ids plus what the source knew when it proposed them."""

    tokens: tuple[int, ...] = ()
    source: str = ""
    match_len: int = 0
    features: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)


@runtime_checkable
class DraftSource(Protocol):
    """What the speculative loop needs of a source."""

    name: str

    def reset(self, prompt: Sequence[int]) -> None:
        """Forget the previous request and start from ``prompt``."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens the model confirmed (accepted drafts and the model's own token)."""

    def propose(self, k: int) -> Draft:
        """Propose at most ``k`` tokens to follow the confirmed text; an empty draft abstains."""

    def commit(self) -> None:
        """End of a request: keep what should carry over to the next one (a no-op where nothing does)."""


class NoDraft:
    """The plain-decoding source: it always abstains, so every step is a single-token decode."""

    name = "off"

    def reset(self, prompt: Sequence[int]) -> None:
        pass

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, k: int) -> Draft:
        return Draft(source=self.name)

    def commit(self) -> None:
        pass
