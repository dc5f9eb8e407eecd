"""Compile a source's kernels before anything is timed: the first run must look like the hundredth.

Why: the sources' hot paths are numba functions, compiled on their first call (or loaded from
numba's on-disk cache, which takes time too). Left alone, that first call lands inside the loop's
timed drafting span, so the first report of a fresh process (the demo, a new server) said that
drafting cost 25 ms a step where it costs 0.4 ms, and ``auto`` learned that drafting does not pay.

:func:`warm_up` runs one short synthetic session (two requests over a text that repeats itself, so
every path a real request takes is taken: matches found and missed, drafts accepted and rejected,
history carried across requests) through a throw-away source built from the same spec, before the
real source is handed out. It goes through the :class:`~promptlookup.drafting.base.DraftSource`
protocol only, in the order the speculative loop calls it, so it needs no backend and works for any
source. The throw-away source gets a run of its own (no shared history: nothing the warm-up sees is
remembered), sharing the opened files, so the kernels compile for the very array types the real
source will pass. Once per spec per process: numba keeps what it compiled.

A cache numba cannot use (a read-only install, another CPU) changes how long the warm-up takes, never
where the time lands.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from promptlookup.drafting.base import MAX_DRAFT, DraftSource, StepFeedback

#: specs warmed in this process (their labels less the history settings, which change no kernel)
_warmed: set[str] = set()
#: the settings a warm-up leaves out: it must neither read nor grow the real history
PRIVATE = ("history", "budget")


def synthetic_text(n_vocab: int, n: int = 640, seed: int = 0) -> list[int]:
    """Tokens that repeat themselves the way edited text does: runs of fresh tokens, then copies of
    earlier spans (some altered), so a source finds long and short matches and misses."""
    rng = np.random.default_rng(seed)
    hi = max(2, min(n_vocab, 512))
    out: list[int] = rng.integers(0, hi, 48).tolist()
    while len(out) < n:
        if rng.random() < 0.6:  # copy an earlier span, maybe with one token changed
            start = int(rng.integers(0, len(out) - 8))
            span = out[start : start + int(rng.integers(8, 40))]
            if rng.random() < 0.5:
                span[int(rng.integers(0, len(span)))] = int(rng.integers(0, hi))
            out.extend(span)
        else:
            out.extend(rng.integers(0, hi, int(rng.integers(4, 16))).tolist())
    return out[:n]


def drive(source: DraftSource, text: list[int], prompt_len: int, k: int = MAX_DRAFT) -> int:
    """One request through ``source`` as the speculative loop would run it, the text standing in
    for the model (a drafted token is accepted where it equals the text). Returns the tokens
    accepted from drafts."""
    source.reset(text[:prompt_len])
    n = prompt_len  # text[:n] is confirmed; text[n] is the pending token the next step feeds
    accepted_total = 0
    while n < len(text) - 1:
        source.extend([text[n]])
        n += 1
        room = len(text) - n
        draft = source.propose(min(k, room)).tokens[: min(k, room)]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == text[n + accepted]:
            accepted += 1
        if accepted:
            source.extend(text[n : n + accepted])
            n += accepted
        accepted_total += accepted
        # a plausible CPU step: 10 ms for one token, 3 ms more per drafted token
        source.feedback(StepFeedback(fed=1 + len(draft), confirmed=accepted + 1,
                                     verify_s=0.010 + 0.003 * len(draft), draft_s=2e-5))
    return accepted_total


def warm_source(source: DraftSource, n_vocab: int) -> float:
    """Run the synthetic session through ``source`` (two requests, the second one after a commit,
    so it drafts from the first); returns the seconds it took."""
    t0 = time.perf_counter()
    first, second = synthetic_text(n_vocab, seed=0), synthetic_text(n_vocab, seed=1)
    drive(source, first, prompt_len=len(first) // 2)
    source.commit()
    drive(source, first[:64] + second, prompt_len=len(first) // 4)
    source.commit()
    return time.perf_counter() - t0


def warm_up(label: str, make: Callable[[], DraftSource | None], n_vocab: int) -> float | None:
    """Warm the source ``make`` builds, once per ``label`` in this process; returns the seconds it
    took, or None when it was warm already (or ``make`` builds no source)."""
    if label in _warmed:
        return None
    _warmed.add(label)  # first: a maker that builds its parts through the factory again stops here
    source = make()
    if source is None:
        return None
    return warm_source(source, n_vocab)


def forget() -> None:
    """Forget which specs were warmed (tests)."""
    _warmed.clear()

