"""The replay backend: the text itself stands in for the model.

Why a backend: a replay (``stats``' cost simulation, the hindsight oracle, tests) should run the very
loop, sources and controller a real generation runs, so the text is served through the same protocol
(:mod:`promptlookup.backends.base`) a model is. Every verify answers with the text's true next tokens,
so the loop accepts exactly the drafted tokens the text continues with.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextBackend:
    """A 'model' that always predicts the next token of a fixed text."""

    name = "replay"

    def __init__(self, stream: Sequence[int], n_ctx: int | None = None) -> None:
        self.stream = list(stream)
        self.n_ctx = n_ctx or len(self.stream) + 16
        self.n_past = 0
        self.widths: list[int] = []

    def _next(self, pos: int) -> int:
        # Past the end of the text there is nothing to predict; any token will do (never emitted).
        return self.stream[pos + 1] if pos + 1 < len(self.stream) else -1

    @property
    def tokens(self) -> list[int]:
        return self.stream[: self.n_past]

    # A sampler is accepted and ignored: the text is what this "model" says, at any temperature. A kept
    # prefix costs nothing to keep: the text is the cache.
    def prefill(self, ids: Sequence[int], sampler: object = None, keep: int = 0) -> int:
        self.n_past = len(ids)
        self.widths = []
        return self._next(self.n_past - 1)

    def verify(self, ids: Sequence[int], sampler: object = None) -> list[int]:
        start = self.n_past
        self.n_past += len(ids)
        self.widths.append(len(ids))
        return [self._next(start + i) for i in range(len(ids))]

    def rollback(self, n_keep: int) -> None:
        self.n_past = n_keep

    def is_eog(self, token: int) -> bool:
        return False
