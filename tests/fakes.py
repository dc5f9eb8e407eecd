"""Test doubles shared by several test modules."""

from __future__ import annotations

from collections.abc import Sequence


class FakeModel:
    """A deterministic 'model' whose next token is a hash of the last few tokens.

    Batched and single-token results are identical by construction (each position's argmax is a
    pure function of the prefix), so speculative output must equal plain greedy output exactly.
    Its KV cache is the token list itself; rollback truncates it.
    """

    def __init__(self, n_vocab: int = 50, window: int = 3, eos: int | None = None,
                 n_ctx: int = 4096, seed: int = 0) -> None:
        self.n_vocab = n_vocab
        self.window = window
        self.eos = eos
        self.n_ctx = n_ctx
        self.seed = seed
        self.cache: list[int] = []
        self.verify_calls: list[list[int]] = []

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def next_token(self, prefix: Sequence[int]) -> int:
        tail = tuple(prefix[-self.window:])
        h = hash((self.seed, tail)) & 0xFFFFFFFF
        # Mostly repeat structure (copy from earlier text) so drafts sometimes match.
        return h % self.n_vocab

    def prefill(self, ids: Sequence[int]) -> int:
        self.cache = list(ids)
        return self.next_token(self.cache)

    def verify(self, ids: Sequence[int]) -> list[int]:
        assert len(self.cache) + len(ids) <= self.n_ctx
        self.verify_calls.append(list(ids))
        out = []
        for t in ids:
            self.cache.append(int(t))
            out.append(self.next_token(self.cache))
        return out

    def rollback(self, n_keep: int) -> None:
        assert 0 <= n_keep <= len(self.cache)
        del self.cache[n_keep:]

    def is_eog(self, token: int) -> bool:
        return self.eos is not None and token == self.eos
