"""Earlier requests as one suffix automaton, under a token budget, saved so a new process starts warm.

Why: the text a model wrote for the last request is the best predictor of what it writes for the
next (the same file edited again, the same boilerplate), and SuffixDecoding's global tree is what
lifts it above per-request matching. Here the history is one :class:`SuffixAutomaton` over the
requests joined by :data:`SEP`, so a match never crosses two requests.

Budget and eviction. ``budget`` counts tokens (separators excluded). A request longer than the
budget keeps only its last ``budget`` tokens. When adding a request would exceed the budget, the
oldest requests are dropped until what remains plus the new one fits in ``LOW_WATER`` of the
budget, and the automaton is rebuilt from what is kept: a suffix automaton cannot delete, and
rebuilding only after a quarter of the budget was added keeps the cost amortized O(1) per token.

File layout (little-endian), written atomically (temp file + ``os.replace``)::

    0   8  magic  b"PLSUFHST"
    8   4  u32 version (2)
    12  4  u32 depth
    16 16  tokenizer fingerprint, ASCII, NUL-padded
    32  8  u64 budget
    40  8  u64 n_seqs
    48  8  u64 n_tokens     (tokens of all kept requests, separators excluded)
    56  8  u64 n_states
    64  8  u64 n_edges
    72  8  u64 n_pos        (automaton positions: n_tokens + n_seqs - 1, or 0)
    80  8  u64 last_state
    88  4  u32 crc32 of everything after the header
    92  4  u32 crc32 of bytes 0..91 (the header; version 1 had 0 here, and is refused)
    96     i64[n_seqs] request lengths, i32[n_tokens] tokens,
           i32[n_states * 8] state rows, i32[n_edges * 3] edge rows

The header follows :class:`promptlookup.fileio.BinaryHeader`, the rule every binary file here shares.
Loading checks the magic, version, header CRC, fingerprint, sizes against the file length, the
body checksum, and the automaton's structure (every index in range, links and edge lists acyclic)
before anything is built from it; any failure raises :class:`HistoryFormatError` with the reason.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from promptlookup.drafting.suffix.automaton import (
    E_NEXT,
    E_TO,
    E_TOK,
    FIRST,
    HINT,
    LEN,
    LINK,
    M_EDGES,
    M_LASTSTATE,
    M_POS,
    M_STATES,
    N_META,
    N_STATE_COLS,
    SEP,
    SuffixAutomaton,
)
from promptlookup.errors import UserError
from promptlookup.fileio import BinaryHeader, atomic_write, crc32_of

MAGIC = b"PLSUFHST"
VERSION = 2  # 1 had no header CRC (bytes 92..95 were zero)
LOW_WATER = 0.75
DEFAULT_BUDGET = 1 << 20


class HistoryFormatError(UserError, ValueError):
    """A history file that is not ours, not for this tokenizer, truncated or corrupt."""


# promptlookup.fileio's header rule; the format's u32 is the automaton depth, its fields the budget
# and the sizes of the arrays that follow
HEADER = BinaryHeader(MAGIC, VERSION, "history file", "QQQQQQQ", 96,
                      "delete it: the next run starts a new history and saves it there",
                      HistoryFormatError)


class History:
    """Earlier requests (oldest first) and the automaton over them."""

    def __init__(self, budget: int = DEFAULT_BUDGET, depth: int = 32, fingerprint: str = "") -> None:
        if budget < 1:
            raise ValueError(f"history budget must be at least 1 token, got {budget}")
        if len(fingerprint.encode("ascii")) > 16:
            raise ValueError("a tokenizer fingerprint is at most 16 ASCII characters")
        self.budget = budget
        self.depth = depth
        self.fingerprint = fingerprint
        self.seqs: deque[np.ndarray] = deque()
        self.n_tokens = 0
        self.automaton = SuffixAutomaton(depth=depth)

    def text(self) -> list[int]:
        """The automaton's text: the kept requests joined by :data:`SEP`."""
        out: list[int] = []
        for i, s in enumerate(self.seqs):
            if i:
                out.append(SEP)
            out.extend(int(t) for t in s)
        return out

    def add(self, tokens: Sequence[int]) -> None:
        seq = np.array(tokens, dtype=np.int32)[-self.budget :]
        if len(seq) == 0:
            return
        if self.n_tokens + len(seq) > self.budget:
            while self.seqs and self.n_tokens + len(seq) > LOW_WATER * self.budget:
                self.n_tokens -= len(self.seqs.popleft())
            self.seqs.append(seq)
            self.n_tokens += len(seq)
            self._rebuild()
            return
        if self.seqs:
            self.automaton.extend([SEP])
        self.automaton.extend(seq)
        self.seqs.append(seq)
        self.n_tokens += len(seq)

    def _rebuild(self) -> None:
        sam = SuffixAutomaton(depth=self.depth, capacity=self.n_tokens + len(self.seqs))
        for i, s in enumerate(self.seqs):
            if i:
                sam.extend([SEP])
            sam.extend(s)
        self.automaton = sam

    @property
    def max_token(self) -> int:
        return max((int(s.max()) for s in self.seqs), default=-1)

    @property
    def nbytes(self) -> int:
        return self.automaton.nbytes + 4 * self.n_tokens

    @property
    def bytes_in_use(self) -> int:
        """What the history holds in memory now (:attr:`SuffixAutomaton.bytes_in_use` and the tokens)."""
        return self.automaton.bytes_in_use + 4 * self.n_tokens

    # ------------------------------------------------------------------ file
    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the history atomically; returns the file size in bytes."""
        sam = self.automaton
        ns, ne = sam.n_states, int(sam.meta[M_EDGES])
        lens = np.array([len(s) for s in self.seqs], dtype="<i8")
        toks = (np.concatenate(list(self.seqs)) if self.seqs else np.zeros(0, np.int32)).astype("<i4")
        payload = [lens.tobytes(), toks.tobytes(), sam.st[:ns].astype("<i4").tobytes(),
                   sam.ed[:ne].astype("<i4").tobytes()]
        header = HEADER.pack(self.depth, self.fingerprint, (self.budget, len(lens), len(toks), ns, ne,
                                                            int(sam.meta[M_POS]), int(sam.meta[M_LASTSTATE])),
                             crc32_of(payload))
        atomic_write(path, [header, *payload])
        return len(header) + sum(len(c) for c in payload)

    @classmethod
    def load(cls, path: str | os.PathLike[str], fingerprint: str | None = None,
             budget: int | None = None) -> History:
        """Open a saved history; ``fingerprint`` (when given) must match the file's.

        ``budget`` overrides the saved one; a smaller budget evicts the oldest requests now.
        """
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise HistoryFormatError(f"cannot read history file {path}: {exc.strerror or exc}") from None
        return cls.from_bytes(data, fingerprint, budget, name=str(path))

    @classmethod
    def from_bytes(cls, data: bytes, fingerprint: str | None = None, budget: int | None = None,
                   name: str = "<bytes>") -> History:
        def bad(why: str) -> HistoryFormatError:
            return HistoryFormatError(f"{name}: not a usable history file: {why}")

        head = HEADER.read(data, name, fingerprint)
        depth, fp_text = head.param, head.fingerprint
        saved_budget, n_seqs, n_tokens, ns, ne, n_pos, last = head.fields
        if not 1 <= depth <= 1 << 16 or saved_budget < 1:
            raise bad(f"depth {depth} or budget {saved_budget} out of range")
        limit = len(data)  # no count can exceed the bytes it would need
        if n_seqs > limit or n_tokens > limit or ns > limit or ne > limit:
            raise bad("a count in the header is larger than the file")
        sizes = [8 * n_seqs, 4 * n_tokens, 4 * N_STATE_COLS * ns, 12 * ne]
        if HEADER.size + sum(sizes) != len(data):
            raise bad(f"{len(data)} bytes, the header describes {HEADER.size + sum(sizes)} (truncated?)")
        HEADER.check_body(data, head.body_crc, name)
        off = HEADER.size
        lens = np.frombuffer(data, "<i8", n_seqs, off)
        off += sizes[0]
        toks = np.frombuffer(data, "<i4", n_tokens, off)
        off += sizes[1]
        st = np.frombuffer(data, "<i4", ns * N_STATE_COLS, off).reshape(ns, N_STATE_COLS)
        off += sizes[2]
        ed = np.frombuffer(data, "<i4", ne * 3, off).reshape(ne, 3)
        why = _check_structure(lens, toks, st, ed, n_pos, last)
        if why:
            raise bad(why)
        self = cls(budget=int(saved_budget), depth=int(depth), fingerprint=fp_text)
        starts = np.concatenate([[0], np.cumsum(lens)])
        self.seqs = deque(toks[starts[i] : starts[i + 1]].copy() for i in range(len(lens)))
        self.n_tokens = int(n_tokens)
        meta = np.zeros(N_META, dtype=np.int64)
        meta[M_STATES], meta[M_EDGES], meta[M_POS], meta[M_LASTSTATE] = ns, ne, n_pos, last
        meta[4] = depth
        self.automaton = SuffixAutomaton.from_arrays(int(depth), st, ed, meta, max(int(n_pos), 16))
        if budget is not None and budget != self.budget:
            self.set_budget(budget)
        return self

    def set_budget(self, budget: int) -> None:
        if budget < 1:
            raise ValueError(f"history budget must be at least 1 token, got {budget}")
        self.budget = budget
        if self.n_tokens > budget:
            while self.seqs and self.n_tokens > budget:
                self.n_tokens -= len(self.seqs.popleft())
            self._rebuild()


def _check_structure(lens, toks, st, ed, n_pos, last) -> str | None:
    """Why the saved automaton cannot be trusted, or ``None``: every index the kernels follow."""
    ns, ne = len(st), len(ed)
    if (lens < 1).any() or int(lens.sum()) != len(toks):
        return "request lengths do not add up to the token count"
    if (toks < 0).any():
        return "a negative token id"
    if ns < 1 or st[0, LINK] != -1 or st[0, LEN] != 0:
        return "no root state"
    expect_pos = len(toks) + max(len(lens) - 1, 0)
    if n_pos != expect_pos or ns > 2 * max(n_pos, 1) or ne > 3 * n_pos + 8:
        return "automaton size does not match its text"
    if not 0 <= last < ns or st[last, LEN] != n_pos:
        return "bad last state"
    link = st[1:, LINK]
    if ((link < 0) | (link >= ns)).any():
        return "a suffix link out of range"
    if (st[link, LEN] >= st[1:, LEN]).any():
        return "a suffix link that does not shorten (cycle)"
    if ((st[:, HINT] < 0) | (st[:, HINT] >= ns)).any():
        return "a count hint out of range"
    first = st[:, FIRST]
    if ((first < -1) | (first >= ne)).any():
        return "a transition list head out of range"
    if ne:
        nxt = ed[:, E_NEXT]
        if ((nxt < -1) | (nxt >= np.arange(ne))).any():
            return "a transition list that is not strictly backward (cycle)"
        if ((ed[:, E_TO] < 0) | (ed[:, E_TO] >= ns)).any():
            return "a transition target out of range"
        if ((ed[:, E_TOK] < 0) & (ed[:, E_TOK] != SEP)).any():
            return "a negative transition token"
        if len(toks) and int(ed[:, E_TOK].max()) > int(toks.max()):  # it would be drafted, unchecked
            return "a transition on a token above every token of the text"
    return None
