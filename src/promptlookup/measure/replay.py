"""The lookup-stats replay: a text stands in for the model, so drafting is measured without decoding.

Why a replay: acceptance depends only on the draft source and the token stream, so replaying a text
"as if the model had written it" measures a source in seconds and reproducibly. The protocol is
llama.cpp's ``examples/lookup/lookup-stats.cpp``, step for step, so figures compare with its:

- The tokens are cut into chunks of ``n_ctx``; only whole chunks with at least one token after them
  are replayed (``i_start + n_ctx < n_input``), so a text of exactly ``n_ctx`` tokens replays nothing.
- Each chunk starts a fresh request from its first token (the context cache is reset) and, once the
  chunk is done, the source commits: ``--lookup`` merges its context cache into the dynamic cache, so
  later chunks draft from earlier ones.
- Per round: draft up to ``n_draft`` tokens (every drafted token counts in ``n_drafted``, even past
  the chunk end); accept them while they equal the text and the chunk has room; then append one true
  token (the model's own), if the chunk has room.
- Drafting time counts the draft calls and the cache updates after each confirmed token; loading and
  the per-chunk reset and merge are not counted (llama.cpp's ``t_draft_flat`` is the load time).
- ``n_predict`` is reported as llama.cpp does (``n_input - n_input % n_ctx``), which overstates the
  replayed tokens by one chunk when ``n_ctx`` divides ``n_input``; ``n_replayed`` is the true count.

It works with any DraftSource; its ``commit()`` is called after each chunk.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from promptlookup.drafting.base import DraftSource
from promptlookup.errors import InputError
from promptlookup.textin import read_text_bytes, replaced_note


@dataclass
class ReplayStats:
    source: str = ""
    n_draft: int = 0
    n_ctx: int = 0
    n_input: int = 0
    n_chunks: int = 0
    n_predict: int = 0
    n_replayed: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    t_draft_s: float = 0.0
    t_load_s: float = 0.0
    peak_rss_bytes: int = 0
    n_invalid_utf8: int = 0  # invalid UTF-8 sequences in the text, replaced by U+FFFD before tokenizing

    @property
    def accept(self) -> float:
        return self.n_accept / self.n_drafted if self.n_drafted else 0.0

    @property
    def us_per_drafted(self) -> float:
        return 1e6 * self.t_draft_s / self.n_drafted if self.n_drafted else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(accept_pct=round(100 * self.accept, 3), t_draft_ms=round(1e3 * self.t_draft_s, 3),
                 us_per_drafted=round(self.us_per_drafted, 4), t_load_ms=round(1e3 * self.t_load_s, 3))
        return d

    def to_json(self, **extra: Any) -> str:
        return json.dumps({**extra, **self.as_dict()})

    def report_lines(self) -> list[str]:
        return [
            f"source       = {self.source}",
            f"n_draft      = {self.n_draft}",
            f"n_ctx        = {self.n_ctx}",
            f"n_predict    = {self.n_predict}  ({self.n_replayed} replayed in {self.n_chunks} chunks "
            f"of {self.n_input} input tokens)",
            f"n_drafted    = {self.n_drafted}",
            f"t_draft_flat = {1e3 * self.t_load_s:.2f} ms  (static cache load)",
            f"t_draft      = {1e3 * self.t_draft_s:.2f} ms, {self.us_per_drafted:.2f} us per drafted token",
            f"n_accept     = {self.n_accept}",
            f"accept       = {100 * self.accept:.3f}%",
            f"peak RSS     = {self.peak_rss_bytes / 2**20:.1f} MiB",
            *replaced_note(self.n_invalid_utf8, "note"),
        ]


def replay(tokens: Sequence[int], n_ctx: int, n_draft: int,
           source_factory: Callable[[], DraftSource], t_load_s: float = 0.0) -> ReplayStats:
    """Replay ``tokens`` through one source (made once by ``source_factory``) as lookup-stats does."""
    if n_ctx < 2:
        raise InputError(f"the replay chunk size (-c) must be at least 2, got {n_ctx}")
    if n_draft < 1:
        raise InputError(f"--draft must be at least 1, got {n_draft}")
    toks = [int(t) for t in tokens]
    n_input = len(toks)
    source = source_factory()
    st = ReplayStats(source=source.name, n_draft=n_draft, n_ctx=n_ctx, n_input=n_input,
                     n_predict=n_input - n_input % n_ctx, t_load_s=t_load_s)
    perf = time.perf_counter
    t_draft = 0.0
    n_drafted = n_accept = 0
    i_start = 0
    while i_start + n_ctx < n_input:
        chunk = toks[i_start : i_start + n_ctx]
        source.reset(chunk[:1])
        done = 1
        while done < n_ctx:
            t0 = perf()
            draft = source.propose(n_draft).tokens
            t_draft += perf() - t0
            n_drafted += len(draft)
            for tok in draft:
                if done >= n_ctx or chunk[done] != tok:
                    break
                n_accept += 1
                t0 = perf()
                source.extend(chunk[done : done + 1])
                t_draft += perf() - t0
                done += 1
            if done < n_ctx:
                t0 = perf()
                source.extend(chunk[done : done + 1])
                t_draft += perf() - t0
                done += 1
        source.commit()
        st.n_chunks += 1
        i_start += n_ctx
    st.n_replayed = st.n_chunks * n_ctx
    st.n_drafted, st.n_accept, st.t_draft_s = n_drafted, n_accept, t_draft
    st.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return st


def read_text_tokens(path: str, tokenizer, as_list: bool = True) -> tuple:
    """The replay text, read as is, tokenized as llama.cpp's lookup-stats does (special tokens on);
    ``(tokens, invalid UTF-8 sequences replaced)`` (see :mod:`promptlookup.textin`).

    The tokens are a list of ints, or with ``as_list=False`` the int32 array (a tenth of the memory)."""
    data, n_bad = read_text_bytes(path, "text file")
    if not data.strip():
        raise InputError(f"text file is empty: {path}")
    ids = tokenizer.tokenize(data, add_special=True, parse_special=True)
    return ([int(t) for t in ids] if as_list else ids), n_bad

