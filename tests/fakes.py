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

    @property
    def tokens(self) -> list[int]:
        return list(self.cache)

    def prefill(self, ids: Sequence[int], sampler=None, keep: int = 0) -> int:
        assert sampler is None or sampler.argmax_only, "FakeModel is greedy: use LogitsFakeModel"
        assert list(self.cache[:keep]) == list(ids[:keep])
        self.cache = list(ids)
        return self.next_token(self.cache)

    def verify(self, ids: Sequence[int], sampler=None) -> list[int]:
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


class LogitsFakeModel:
    """A 'model' with known logits: each position's logits row is a pure function of the last
    ``window`` tokens (a seeded table), so batched and single-token logits are equal by construction.

    It decodes like a real backend: greedy argmax without a sampler, else the sampler's choice from
    its rows (``Sampler.sample_rows``, the call both real backends make), with the cache's tokens as
    the history that penalties read.
    """

    def __init__(self, n_vocab: int = 6, window: int = 2, scale: float = 1.5, eos: int | None = None,
                 n_ctx: int = 4096, seed: int = 0) -> None:
        import numpy as np

        self._np = np
        self.n_vocab = n_vocab
        self.window = window
        self.scale = scale
        self.eos = eos
        self.n_ctx = n_ctx
        self.seed = seed
        self.cache: list[int] = []
        self.verify_calls: list[list[int]] = []
        self._rows: dict[tuple[int, ...], object] = {}

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def logits(self, prefix: Sequence[int]):
        tail = tuple(int(t) for t in prefix[-self.window:])
        row = self._rows.get(tail)
        if row is None:
            rng = self._np.random.default_rng([self.seed, len(tail), *tail])
            row = (rng.standard_normal(self.n_vocab) * self.scale).astype(self._np.float32)
            self._rows[tail] = row
        return row

    def next_token(self, prefix: Sequence[int]) -> int:
        """The greedy choice after ``prefix`` (what an oracle draft proposes)."""
        return int(self.logits(prefix).argmax())

    def _choose(self, start: int, sampler) -> list[int]:
        """Rows for positions start+1..len(cache), chosen as a real backend would."""
        rows = self._np.stack([self.logits(self.cache[: p]) for p in range(start + 1, len(self.cache) + 1)])
        if sampler is None or sampler.argmax_only:
            return [int(t) for t in rows.argmax(axis=1)]
        return sampler.sample_rows(rows, self.cache, start + 1)

    @property
    def tokens(self) -> list[int]:
        return list(self.cache)

    def prefill(self, ids: Sequence[int], sampler=None, keep: int = 0) -> int:
        assert list(self.cache[:keep]) == list(ids[:keep])
        self.cache = [int(t) for t in ids]
        return self._choose(len(self.cache) - 1, sampler)[-1]

    def verify(self, ids: Sequence[int], sampler=None) -> list[int]:
        assert len(self.cache) + len(ids) <= self.n_ctx
        self.verify_calls.append(list(ids))
        start = len(self.cache)
        self.cache.extend(int(t) for t in ids)
        return self._choose(start, sampler)

    def rollback(self, n_keep: int) -> None:
        assert 0 <= n_keep <= len(self.cache)
        del self.cache[n_keep:]

    def is_eog(self, token: int) -> bool:
        return self.eos is not None and token == self.eos


class ByteModel(LogitsFakeModel):
    """:class:`LogitsFakeModel` with the rest of a backend, for the public API: a byte vocabulary
    (ids 0..255 are bytes, 256 ends generation), a chat template with control tokens, prefix reuse.

    It writes lower-case letters, spaces and semicolons; its greedy output soon loops (each position
    depends on the last ``window`` bytes only), so drafts are accepted; and logits are a pure
    function of the prefix, so every way of decoding (speculative or not, a kept prefix or a fresh
    prefill) gives the same tokens. The end-of-generation token is never the greedy choice.
    """

    EOS = 256
    CONTROLS = ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>")
    ALPHABET = b"abcdefghijklmnopqrstuvwxyz ;"

    def __init__(self, window: int = 1, eos: bool = True, n_ctx: int = 4096, seed: int = 0,
                 scale: float = 2.0) -> None:
        super().__init__(n_vocab=257 + len(self.CONTROLS), window=window, scale=scale,
                         eos=self.EOS if eos else None, n_ctx=n_ctx, seed=seed)
        self.model_path = None
        self.name = "bytes"
        self.n_threads = 1
        self.closed = False
        self.prefills: list[tuple[int, int]] = []  # (prompt length, positions kept)

    def logits(self, prefix: Sequence[int]):
        tail = tuple(int(t) for t in prefix[-self.window:])
        row = self._rows.get(tail)
        if row is None:
            np = self._np
            rng = np.random.default_rng([self.seed, len(tail), *tail])
            row = np.full(self.n_vocab, -30.0, dtype=np.float32)
            row[list(self.ALPHABET)] = rng.standard_normal(len(self.ALPHABET)) * self.scale
            if self.eos is not None:
                row[self.EOS] = float(row.max()) - 2.0
            self._rows[tail] = row
        return row

    def prefill(self, ids: Sequence[int], sampler=None, keep: int = 0) -> int:
        assert keep < len(ids)
        self.prefills.append((len(ids), keep))
        return super().prefill(ids, sampler, keep)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if not parse_special:
            return list(text.encode("utf-8"))
        out: list[int] = []
        rest = text
        while rest:
            hit = next((c for c in self.CONTROLS if rest.startswith(c)), None)
            if hit is not None:
                out.append(257 + self.CONTROLS.index(hit))
                rest = rest[len(hit):]
            else:
                out.extend(rest[0].encode("utf-8"))
                rest = rest[1:]
        return out

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes(t for t in ids if t < 256).decode("utf-8", "replace")

    def control_texts(self) -> list[str]:
        return list(self.CONTROLS)

    def token_bytes(self, token: int) -> bytes:
        """What a token stands for (structured output builds its vocabulary from these)."""
        if token < 256:
            return bytes([token])
        return b"<|eos|>" if token == self.EOS else self.CONTROLS[token - 257].encode()

    def fingerprint(self) -> str:
        return "bytes-test"

    def render_chat(self, messages, tools=None) -> str:  # no tool support: tools are never passed
        return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages) + "<|assistant|>"

    def close(self) -> None:
        self.closed = True


class RandomDrafts:
    """An adversarial source: random proposals of random length (0..k), each token the model's own
    greedy choice (``model.next_token``) with probability ``p_right``, else a random id."""

    name = "random"

    def __init__(self, model: FakeModel | LogitsFakeModel, seed: int, p_right: float = 0.5) -> None:
        import random

        self.model = model
        self.rng = random.Random(seed)
        self.p_right = p_right
        self.seq: list[int] = []

    def reset(self, prompt: Sequence[int]) -> None:
        self.seq = list(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.seq.extend(tokens)

    def feedback(self, step: object) -> None:
        pass

    def propose(self, k: int):  # noqa: ANN201 (a Draft)
        from promptlookup.drafting.base import Draft

        seq = list(self.seq)
        out = []
        for _ in range(self.rng.randint(0, k)):
            right = self.rng.random() < self.p_right
            t = self.model.next_token(seq) if right else self.rng.randrange(self.model.n_vocab)
            out.append(t)
            seq.append(t)
        return Draft(tuple(out), self.name)

    def commit(self) -> None:
        pass


class ToolByteModel(ByteModel):
    """:class:`ByteModel` with a chat template that supports tools in the Hermes format (tools listed
    in the system turn, calls as ``<tool_call>{json}</tool_call>``, results in a ``tool`` turn), and
    the template text that :mod:`promptlookup.tools` reads to find that format.

    ``style="llama3"`` switches the template to Llama 3's JSON calls (``{"name", "parameters"}``)."""

    def __init__(self, *args, style: str = "hermes", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.style = style
        self.rendered: list[str] = []
        if style == "hermes":
            self.chat_template = "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %} <tool_call>"
        else:
            self.chat_template = '{% if tools %}{"name": ..., "parameters": ...}{% endif %}'

    def render_chat(self, messages, tools=None) -> str:
        import json

        out = ""
        if tools:
            out += "<|system|>tools:" + json.dumps(tools) + "<|end|>"
        for m in messages:
            body = m["content"]
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                if self.style == "hermes":
                    body += "<tool_call>" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]})
                    body += "</tool_call>"
                else:
                    body += json.dumps({"name": fn["name"], "parameters": fn["arguments"]})
            role = "user" if m["role"] == "tool" else m["role"]
            out += f"<|{role}|>{body}<|end|>"
        out += "<|assistant|>"
        self.rendered.append(out)
        return out


class BatchByteModel(ByteModel):
    """:class:`ByteModel` holding ``n_seq`` sequences that ``decode_many`` decodes together (a
    :class:`~promptlookup.backends.base.BatchDecoder`).

    Each sequence's rows are a pure function of its own prefix, so a sequence's tokens in any batch
    equal its tokens alone, by construction. It records every forward (``rounds``: per call, the
    ``(seq, tokens, want)`` of each part), fails loudly if two threads call it at once, and can be
    told to refuse every part of one sequence (``refuse_seq``) or to run ``on_round`` before each
    forward (tests start requests from there, at a chosen round).
    """

    def __init__(self, n_seq: int = 4, n_batch: int = 512, **kwargs) -> None:
        import threading

        super().__init__(**kwargs)
        self.n_seq = n_seq
        self.n_batch = n_batch
        self.caches: list[list[int]] = [[] for _ in range(n_seq)]
        self.rounds: list[list[tuple[int, int, str]]] = []
        self.copies: list[tuple[int, int, int]] = []  # seq_copy calls: (src, dst, n_keep)
        self.refuse_seq: int | None = None
        self.on_round = None
        self._inside = threading.Lock()

    def seq_tokens(self, seq: int) -> list[int]:
        return self.caches[seq]

    def forward_sizes(self, parts) -> list[int]:
        return [sum(n for _, n in parts)]  # any mix in one forward

    def seq_rollback(self, seq: int, n_keep: int) -> None:
        assert 0 <= n_keep <= len(self.caches[seq])
        del self.caches[seq][n_keep:]

    def seq_copy(self, src: int, dst: int, n_keep: int) -> None:
        assert src != dst and 0 <= n_keep <= len(self.caches[src])
        self.copies.append((src, dst, n_keep))
        self.caches[dst] = list(self.caches[src][:n_keep])

    def decode_many(self, parts) -> list[list[int]]:
        from promptlookup.backends.base import BackendError

        seqs = [p.seq for p in parts]
        if len(set(seqs)) != len(seqs):
            raise BackendError("two parts for one sequence")
        for p in parts:
            if not 0 <= p.seq < self.n_seq or not p.ids or p.want not in ("all", "last", "none"):
                raise BackendError(f"bad part {p!r}")
            if len(self.caches[p.seq]) + len(p.ids) > self.n_ctx:
                raise BackendError(f"context full on sequence {p.seq}")
            if p.seq == self.refuse_seq:
                raise BackendError(f"sequence {p.seq} refused")
        if not self._inside.acquire(blocking=False):
            raise AssertionError("decode_many called from two threads at once")
        try:
            if self.on_round is not None:
                self.on_round(len(self.rounds))
            self.rounds.append([(p.seq, len(p.ids), p.want) for p in parts])
            out = []
            for p in parts:
                cache = self.caches[p.seq]
                start = len(cache)
                cache.extend(int(t) for t in p.ids)
                if p.want == "none":
                    out.append([])
                    continue
                first = start + 1 if p.want == "all" else len(cache)
                rows = self._np.stack([self.logits(cache[:q]) for q in range(first, len(cache) + 1)])
                if p.sampler is None or p.sampler.argmax_only:
                    out.append([int(t) for t in rows.argmax(axis=1)])
                else:
                    out.append(p.sampler.sample_rows(rows, cache, first))
            return out
        finally:
            self._inside.release()


class TagToolModel(ToolByteModel):
    """:class:`ToolByteModel` whose ``<tool_call>`` and ``</tool_call>`` are one control token each
    (ids 261 and 262), as a GGUF may mark them: its ``detokenize`` writes no text for them, as
    llama.cpp writes none for a control token, and structured output sees them as special tokens."""

    CONTROLS = (*ByteModel.CONTROLS, "<tool_call>", "</tool_call>")
    OPEN, CLOSE = 257 + len(ByteModel.CONTROLS), 258 + len(ByteModel.CONTROLS)
