"""The ``--ngram`` draft source: draft what followed the longest recent match of the text's last tokens.

The corpus is the prompt plus every confirmed token; the pattern is its suffix. Every position
strictly before the corpus end is a candidate match *end* (so the pattern never matches itself),
and for each the common suffix length is measured, capped at ``max_match``. The longest match
wins; among equal lengths the most recent wins (what a code edit or a repeated quotation wants).
A match may overlap the pattern, which is how a run of one repeated token predicts itself. The
tokens that followed the match become the draft, up to ``k`` of them, clipped at the corpus end.
A best match shorter than ``min_match`` drafts nothing: the gate.

Three implementations with one behaviour: :func:`ngram_match_reference` is the plain statement of
the rule, :func:`ngram_match` a compiled backward scan (O(context) per call, no state), and
:class:`~promptlookup.drafting.ngram.index.NgramIndex` the incremental index the source uses
(O(log max_match) probes per call, about a microsecond at any context length). Tests hold all three
equal, on real text too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from promptlookup.drafting.base import Draft, StepFeedback, TokenBuffer, compiled_entry, make_draft
from promptlookup.drafting.ngram.index import (
    KEYS,
    STATE_MAX_MATCH,
    STATE_MIN_MATCH,
    NgramIndex,
    draft_span,
)
from promptlookup.drafting.spec import DRAFT, Option, Run, SourceSpec, SpecError

DEFAULT_MIN_MATCH = 3
DEFAULT_MAX_MATCH = 16
MAX_MATCH_LIMIT = 1024  # longest max_match accepted: each length has an empty draft kept, and the scan
# above INDEX_MAX_MATCH compares up to max_match tokens per position (10**7 took 2.2 GB and 27 s)
INDEX_MAX_MATCH = 32  # above this the index costs too much memory (max_match entries per token): scan


def ngram_match_reference(corpus: Sequence[int], max_match: int) -> tuple[int, int]:
    """Return ``(match_end, match_len)`` of the best match; ``(-1, 0)`` when there is none.

    Plain Python, quadratic, obviously the rule: kept as the twin the fast path is tested against.
    """
    n = len(corpus)
    best_end, best_len = -1, 0
    for end in range(n - 1):  # every position strictly before the corpus end
        length = 0
        while length < max_match and end - length >= 0 and (
            corpus[end - length] == corpus[n - 1 - length]
        ):
            length += 1
        if length > 0 and length >= best_len:  # later ends overwrite ties: most recent wins
            best_end, best_len = end, length
    return best_end, best_len


@njit(cache=True, nogil=True)
def _ngram_match_scan(corpus: np.ndarray, n: int, max_match: int) -> tuple[int, int]:
    # Scan backward so the first match of a given length is the most recent one; only a strictly
    # longer match may replace it. Stop as soon as a match reaches the cap: nothing beats it.
    best_end = -1
    best_len = 0
    last = corpus[n - 1]
    for end in range(n - 2, -1, -1):
        if corpus[end] != last:
            continue
        length = 1
        while length < max_match and end - length >= 0 and (
            corpus[end - length] == corpus[n - 1 - length]
        ):
            length += 1
        if length > best_len:
            best_len = length
            best_end = end
            if length >= max_match:
                break
    return best_end, best_len


def ngram_match(corpus: np.ndarray, n: int, max_match: int) -> tuple[int, int]:
    """Fast twin of :func:`ngram_match_reference` over ``corpus[:n]`` (an int32 array)."""
    if n < 2 or max_match < 1:
        return -1, 0
    return _ngram_match_scan(corpus, n, max_match)


def ngram_draft_reference(
    corpus: Sequence[int], k: int, min_match: int = DEFAULT_MIN_MATCH,
    max_match: int = DEFAULT_MAX_MATCH,
) -> list[int]:
    """The whole ``--ngram`` draft rule in plain Python: match, gate, then copy what followed."""
    end, length = ngram_match_reference(corpus, max_match)
    if end < 0 or length < min_match:
        return []
    return list(corpus[end + 1 : end + 1 + k])


@njit(cache=True, nogil=True)
def _scan_span(corpus, n, k, tab, state):
    """:func:`~promptlookup.drafting.ngram.index.draft_span`'s twin for the scan (``tab`` unused):
    ``(start, stop, match_len)``, the draft ``corpus[start:stop]`` empty below the gate."""
    if n < 2:
        return 0, 0, 0
    end, length = _ngram_match_scan(corpus, n, state[STATE_MAX_MATCH])
    if end < 0 or length < state[STATE_MIN_MATCH] or k <= 0:
        return 0, 0, length
    return end + 1, min(end + 1 + k, n), length


class NgramSource(TokenBuffer):
    """``--ngram``: a draft source over a growable int32 buffer of the confirmed tokens.

    The index only ever grows with the buffer; ``reset`` empties both, so nothing has to follow the
    KV cache back on a rejected draft (rejected tokens are never appended).

    A drafting call is one compiled call (index the new tokens, match, gate, clip: ``_span``, called
    through its compiled build, see :func:`~promptlookup.drafting.base.compiled_entry`) plus the
    returned :class:`Draft`; empty drafts are built once per match length.
    """

    name = "ngram"

    def __init__(self, min_match: int = DEFAULT_MIN_MATCH, max_match: int = DEFAULT_MAX_MATCH):
        if min_match < 1:
            raise ValueError(f"ngram min-match must be at least 1, got {min_match}")
        if max_match < min_match:
            raise ValueError(
                f"ngram max-match ({max_match}) must be at least min-match ({min_match})"
            )
        if max_match > MAX_MATCH_LIMIT:
            raise ValueError(f"ngram max-match must be at most {MAX_MATCH_LIMIT}, got {max_match}")
        super().__init__()
        self._min_match = min_match
        self._max_match = max_match
        # empty drafts are immutable: one per match length (0 .. max_match)
        self._abstain = [make_draft((), self.name, m) for m in range(max_match + 1)]
        if max_match <= INDEX_MAX_MATCH:
            self._index: NgramIndex | None = NgramIndex(max_match, min_match=min_match)
            self._tab, self._state = self._index.tab, self._index.state
            kernel = draft_span
        else:  # above the index limit: the backward scan, same call shape
            self._index = None
            self._tab = np.zeros(2, dtype=np.int64)
            self._state = np.zeros(KEYS + 1, dtype=np.int64)
            self._state[STATE_MAX_MATCH], self._state[STATE_MIN_MATCH] = max_match, min_match
            kernel = _scan_span
        # compile (or load the cached builds) before any timing; n = 0 changes nothing
        self._span = compiled_entry(kernel, self._buf, 0, 0, self._tab, self._state)
        ngram_match(self._buf, 2, 1)

    @property
    def min_match(self) -> int:
        return self._min_match

    @property
    def max_match(self) -> int:
        return self._max_match

    def reset(self, prompt: Sequence[int]) -> None:
        self._n = 0
        if self._index is not None:
            self._index.reset()
        self.extend(prompt)

    # the index catches up inside the next propose: appending is all there is to do
    extend = TokenBuffer._append

    def propose(self, k: int) -> Draft:
        buf = self._buf
        start, stop, length = self._span(buf, self._n, k, self._tab, self._state)
        if start == stop:
            if length < 0:  # the index's table must grow first
                self._index.grow(buf, self._n)
                self._tab = self._index.tab
                return self.propose(k)
            return self._abstain[length]
        return make_draft(tuple(buf[start:stop].tolist()), self.name, length)

    def commit(self) -> None:
        """Nothing carries over: the next request's ``reset`` starts from its own prompt."""

    def feedback(self, step: StepFeedback) -> None:
        """A fixed rule: what a step cost does not change what it proposes."""


# --- the source vocabulary (promptlookup.drafting.spec): ngram[:draft=N][:min=N][:max=N] ---

# auto always weighs its own ngram (drafting/auto/source.py), ungated: the controller's match buckets
# judge every match, and it measures matches up to AUTO_MAX_MATCH tokens long, since past 16 tokens a
# match is still getting more reliable.
AUTO_WEIGHED = "always"
AUTO_MAX_MATCH = 64
OPTIONS = {
    "draft": DRAFT,
    "min": Option(int, DEFAULT_MIN_MATCH, 1, MAX_MATCH_LIMIT, "--ngram-min-match",
                  "shortest matching run allowed to draft"),
    "max": Option(int, DEFAULT_MAX_MATCH, 1, MAX_MATCH_LIMIT, "--ngram-max-match",
                  "longest suffix compared when matching"),
}


def check(spec: SourceSpec) -> None:
    lo, hi = spec.value("min"), spec.value("max")
    if hi < lo:
        raise SpecError(f"{spec.setting('max')} ({hi}) is below {spec.setting('min')} ({lo})")


def factory(spec: SourceSpec, run: Run) -> Callable[[], NgramSource]:
    lo, hi = spec.value("min"), spec.value("max")
    return lambda: NgramSource(lo, hi)


def auto_factory(spec: SourceSpec, run: Run) -> Callable[[], NgramSource]:
    """The ngram ``auto`` weighs, whatever ``spec`` (auto's) says: ungated, matches up to 64 tokens."""
    return lambda: NgramSource(min_match=1, max_match=AUTO_MAX_MATCH)
