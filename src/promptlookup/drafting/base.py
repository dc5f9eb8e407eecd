"""The contract between a draft source and the speculative loop.

A source is told every confirmed token (the prompt first, then what the model emits) and, when
asked, proposes up to ``k`` tokens that it guesses come next. It returns the features a
controller needs to judge the guess (how long the match was, which source), never a probability
the model computed: drafting is model-free by design. After each step it asked for, the loop tells
the source what that step cost and confirmed (:class:`StepFeedback`), so a controller can judge its
choices by measured time; a source that does not adapt ignores it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

MAX_DRAFT = 8  # most tokens drafted per verify: one verify feeds at most MAX_DRAFT + 1 tokens


@dataclass(frozen=True)
class Draft:
    """Up to ``k`` proposed token ids plus what the source knew when it proposed them."""

    tokens: tuple[int, ...] = ()
    source: str = ""
    match_len: int = 0
    features: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)


_new = object.__new__


def make_draft(tokens: tuple[int, ...], source: str, match_len: int = 0,
               features: dict[str, float] | None = None) -> Draft:
    """``Draft(tokens, source, match_len, features)``, built without the frozen dataclass's
    ``__init__``: its one ``object.__setattr__`` call per field costs more than the rest of a
    drafting call (a few microseconds at ``k = 3``). The same fields in the same order, so the result
    is equal to the plainly built one (a test holds them so); every source builds its drafts here."""
    draft = _new(Draft)
    fields = draft.__dict__
    fields["tokens"] = tokens
    fields["source"] = source
    fields["match_len"] = match_len
    fields["features"] = {} if features is None else features
    return draft


def compiled_entry(dispatcher, *args):
    """The compiled build of ``dispatcher`` for the types of ``args``, compiled (or loaded) by calling it
    with them: calling the build skips numba's per-call type dispatch (a few hundred ns with array
    arguments, more with tuples of arrays or structured arrays). Only for arguments of exactly those
    types (the caller's own arrays). Falls back to the dispatcher itself where numba does not expose
    the build (or runs uncompiled: NUMBA_DISABLE_JIT)."""
    dispatcher(*args)
    try:
        from numba import typeof

        return dispatcher.overloads[tuple(typeof(a) for a in args)].entry_point
    except (AttributeError, KeyError, TypeError):
        return dispatcher


class TokenBuffer:
    """A request's confirmed tokens in a growable int32 array, with room after them for a draft.

    Why one class: every source keeps the confirmed tokens contiguous (its compiled kernel reads
    them, and drafts into the room past ``_n``), and each had its own copy of the doubling. Sources
    inherit it: ``_buf`` and ``_n`` stay plain attributes, so a hot path pays no extra call.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._buf = np.zeros(capacity, dtype=np.int32)
        self._n = 0

    @property
    def tokens(self) -> np.ndarray:
        """The confirmed tokens so far (a view; do not keep it across ``extend``)."""
        return self._buf[: self._n]

    def _room(self, need: int) -> None:
        """Make ``_buf`` hold at least ``need`` tokens, keeping the confirmed ones (doubling, so
        appends stay amortized O(1))."""
        if need > len(self._buf):
            grown = np.zeros(max(2 * len(self._buf), need), dtype=np.int32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown

    def _append(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append confirmed tokens (one token, the common case, without building an array)."""
        m = len(tokens)
        n = self._n
        if n + m > len(self._buf):
            self._room(n + m)
        if m == 1:
            self._buf[n] = tokens[0]
        elif m:
            self._buf[n : n + m] = tokens
        self._n = n + m


@dataclass(frozen=True)
class StepFeedback:
    """What one step that followed a proposal cost and gave: the loop's measured seconds.

    ``verify_s`` is the verify call and its rollback (the cost simulation,
    :mod:`promptlookup.measure.simulate`, charges its curve's seconds instead, see
    :func:`promptlookup.speculate.generate`); ``draft_s`` is everything else the step
    spent on the source: being told the pending token, proposing, being told the confirmed tokens,
    and the previous feedback. Both count, because both are time a plain decode would not have
    spent."""

    fed: int  # tokens the verify fed: 1 + the drafted tokens sent
    confirmed: int  # tokens the step confirmed: the accepted drafts + the model's own token
    verify_s: float
    draft_s: float


@runtime_checkable
class DraftSource(Protocol):
    """What the speculative loop needs of a source.

    Two methods are optional, so not declared here (a fixed source has nothing to say):
    ``report() -> dict``, what the source chose so far, with a one-line ``summary``. ``auto``
    answers it (its drafted steps per source, its calibration); callers ask through
    :func:`report_of`, never by the source's class. ``propose_forced(k, forced, valid, after)``: a
    proposal that weighs the tokens a grammar forces (:mod:`promptlookup.drafting.forced`, which
    asks it where the source has it; ``auto`` does)."""

    name: str

    def reset(self, prompt: Sequence[int]) -> None:
        """Forget the previous request and start from ``prompt``."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens the model confirmed (accepted drafts and the model's own token)."""

    def propose(self, k: int) -> Draft:
        """Propose at most ``k`` tokens to follow the confirmed text; an empty draft abstains."""

    def commit(self) -> None:
        """End of a request: keep what should carry over to the next one (a no-op where nothing does)."""

    def feedback(self, step: StepFeedback) -> None:
        """After a step that followed :meth:`propose`: what it cost and confirmed (a no-op for a
        source whose proposals do not depend on time; the controller ``auto`` learns from it)."""


def report_of(source: object) -> dict | None:
    """``source.report()`` where the source has one (``auto``), else None: how the CLI, the bench and
    the API read a controller's choices without knowing its class."""
    report = getattr(source, "report", None)
    return report() if callable(report) else None


class NoDraft:
    """The plain-decoding source: it always abstains, so every step is a single-token decode."""

    name = "off"

    def reset(self, prompt: Sequence[int]) -> None:
        pass

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, k: int) -> Draft:
        return make_draft((), self.name)

    def commit(self) -> None:
        pass

    def feedback(self, step: StepFeedback) -> None:
        pass


def sources_within(source: Any, stop: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """``source`` and every source inside it (a layer's ``inner``, ``auto``'s ``sources``), depth
    first; nothing below a source for which ``stop`` is true is walked."""
    if source is None:
        return
    yield source
    if stop is not None and stop(source):
        return
    inner = getattr(source, "inner", None)
    if inner is not None:
        yield from sources_within(inner, stop)
    for s in getattr(source, "sources", None) or ():
        yield from sources_within(s, stop)


def _takes_corpora(source: Any) -> bool:
    return getattr(source, "use_corpora", None) is not None


def use_corpora(source: Any, corpora: Sequence[Any] | None) -> None:
    """Point every source inside ``source`` that drafts from corpora (the suffix source, alone, in
    ``auto`` or behind a slot's lock) at ``corpora`` -- a request's named corpora, opened indexes --
    or, with None, back at its own. Sources without corpora ignore it; a source that takes corpora
    passes them on itself, so nothing below it is walked."""
    for s in sources_within(source, stop=_takes_corpora):
        if _takes_corpora(s):
            s.use_corpora(corpora)


def learned_bytes(source: Any) -> int:
    """Bytes that ``source`` and every source inside it (in ``auto``, behind a grammar layer) keep
    from one request to the next for themselves: lookup's dynamic cache, which a source declares as
    ``learned_bytes``. A shared suffix history is counted once by its owner, not here."""
    return sum(int(getattr(s, "learned_bytes", 0)) for s in sources_within(source))
