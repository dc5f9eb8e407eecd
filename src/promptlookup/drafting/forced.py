"""Drafts from the grammar: under a JSON schema or a forced tool call, the tokens the grammar forces.

Why a layer, not a source. Where a grammar is active (``response_format``, a forced ``tool_choice``,
``--json-schema``), much of the text is decided before the model speaks: the braces, the quotes,
the property names, the tool-call wrapper, the named function. The sampler masks every position
with the grammar, so a token that is the only one the grammar allows is the sampler's choice
whatever the logits are. llguidance names the forced text as tokens (its fast-forward tokens: the
forced bytes in the tokenizer's own tokenization, the last one held back where the next bytes could
join it); the model nearly always writes those bytes that way, but it may write them in another
tokenization the mask also allows, so they are drafts like any other: almost always accepted, and
verified. :class:`GrammarDrafts` wraps the request's draft source (any of them, ``auto`` included)
and

* proposes the forced tokens first, then the wrapped source's continuation while that source's own
  draft agrees with them (its draft is made from the confirmed text, so it continues past the forced
  tokens only where it predicted them too), then what the grammar forces after that, and so on up to
  the draft length (:meth:`GrammarDrafts.interleave`);
* cuts any draft where it first leaves the grammar: the masked choice at a forbidden token differs
  from it, so the verify would reject it there anyway, and the tokens after it only cost width;
* where the grammar leaves a choice that the text around makes one way (JSON's optional whitespace:
  ``":`` after a property name, `` "`` before a string), guesses it from the tokens that followed
  the last ones in the prompt and the output, among those the grammar allows, and goes on with what
  the grammar forces after the guess (:meth:`GrammarDrafts.after`;
  :mod:`promptlookup.drafting.grammar_guess`). ``auto`` prices a guess by how often guesses held.

A source that can weigh the forced tokens itself (``auto``: it prices them as certain when it
decides the draft's length, and what follows a draft, :meth:`GrammarDrafts.after`, by each token's
chance once that draft held) offers ``propose_forced(k, forced, valid, after)``; it is asked that
instead.

Exactness is untouched: a draft is only ever a guess that the loop verifies (grammar drafts are
accepted because the model's masked choice equals them, never on trust). The count of accepted
grammar tokens reaches the counters through the draft's ``forced`` feature (a bit mask of the
draft's positions that the grammar forced); the loop adds the forced ones among the accepted.

No backend and no llguidance here: the grammar comes in as a :class:`GrammarView`
(:class:`promptlookup.grammar.Constraint` is one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from promptlookup.drafting.base import Draft, DraftSource, StepFeedback, make_draft, report_of
from promptlookup.drafting.grammar_guess import MIN_SHARE, FollowerCounts, GuessRecord

FORCED = "forced"  # the draft feature: which of its tokens the grammar forced (bit i: token i)
GRAMMAR = "grammar"  # the source name of a draft made of forced tokens only
MAX_CANDIDATES = 12  # followers of the last tokens the grammar is asked about, heaviest first
MIN_CHAIN = 0.25  # a continuation stops guessing where all its guesses would hold less often than this


class Continuation(NamedTuple):
    """What may follow a draft under the grammar (:meth:`GrammarDrafts.after`): ``tokens``, each
    one's chance ``p`` of holding once the ones before it held (1.0: the grammar forces it; less:
    a guess, :mod:`promptlookup.drafting.grammar_guess`), and ``forced``, the bit mask of the forced
    positions."""

    tokens: tuple[int, ...] = ()
    p: tuple[float, ...] = ()
    forced: int = 0


NOTHING = Continuation()


class GrammarView(Protocol):
    """What the layer reads of a request's grammar; ``tokens`` is the whole confirmed stream."""

    def forced(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (empty: it leaves a choice)."""

    def valid(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the grammar allows next."""


def common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def forced_count(mask: float | int, accepted: int) -> int:
    """How many of the first ``accepted`` drafted tokens the grammar forced, from the draft's
    :data:`FORCED` feature (bit ``i`` set: token ``i`` was forced)."""
    return (int(mask) & ((1 << accepted) - 1)).bit_count()


class GrammarDrafts:
    """A draft source over ``inner`` that drafts what ``grammar`` forces and never past where it
    refuses (module docstring). One per request: the grammar state is the request's."""

    def __init__(self, inner: DraftSource, grammar: GrammarView) -> None:
        self.inner = inner
        self.grammar = grammar
        self.name = inner.name
        self._tokens: list[int] = []
        self.forced_drafted = 0  # forced tokens sent in drafts (accepted ones are in the counters)
        self.followers = FollowerCounts()
        self.guesses = GuessRecord()

    def reset(self, prompt: Sequence[int]) -> None:
        self._tokens = [int(t) for t in prompt]
        self.followers.reset(self._tokens)
        self.guesses = GuessRecord()
        self.inner.reset(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self._tokens.extend(int(t) for t in tokens)
        self.followers.extend(tokens)
        self.guesses.score(self._tokens)
        self.inner.extend(tokens)

    def _valid(self, draft: Sequence[int]) -> int:
        return self.grammar.valid(self._tokens, draft)

    def guess(self, stream: Sequence[int]) -> tuple[int, float] | None:
        """The token to guess after ``stream`` where the grammar forces nothing, with its chance of
        holding: the heaviest follower of the stream's last two tokens (else of its last one) that
        the grammar allows, if it was seen in at least half of the allowed followers' sightings plus
        one (:data:`~promptlookup.drafting.grammar_guess.MIN_SHARE`: a follower seen once and nothing
        else is an even chance, one seen once beside another is no guess). The output's weight ranks
        the followers; their sightings, not that weight, give the chance."""
        for n in (2, 1):
            if len(stream) < n:
                continue
            allowed = [f for f in self.followers.followers(stream[-n:])[:MAX_CANDIDATES]
                       if self.grammar.valid(stream, (f.token,)) == 1]
            if not allowed:
                continue
            top = allowed[0]
            share = top.seen / (sum(f.seen for f in allowed) + 1.0)  # one sighting alone: an even chance
            if share >= MIN_SHARE:
                return top.token, self.guesses.p(top.token, share)
        return None

    def after(self, draft: Sequence[int], limit: int) -> Continuation:
        """Up to ``limit`` tokens after ``draft``: what the grammar forces, and where it leaves a
        choice, a guess (:meth:`guess`) followed by what it forces then, and so on while the
        guesses' joint chance stays at least :data:`MIN_CHAIN`. Every guess made is scored later."""
        stream = [*self._tokens, *draft]
        start = len(self._tokens)
        tokens: list[int] = []
        p: list[float] = []
        mask = 0
        chance = 1.0
        while len(tokens) < limit:
            f = self.grammar.forced(stream, limit - len(tokens))
            if f:
                mask |= ((1 << len(f)) - 1) << len(tokens)
                tokens.extend(f)
                stream.extend(f)
                p.extend([1.0] * len(f))
                continue
            g = self.guess(stream)
            if g is None or chance * g[1] < MIN_CHAIN:
                break
            self.guesses.made(start, stream[start:], g[0])
            chance *= g[1]
            tokens.append(g[0])
            stream.append(g[0])
            p.append(g[1])
        return Continuation(tuple(tokens), tuple(p), mask) if tokens else NOTHING

    def propose(self, k: int) -> Draft:
        forced = self.grammar.forced(self._tokens, k)
        weigh: Callable[..., Draft | None] | None = getattr(self.inner, "propose_forced", None)
        d = weigh(k, forced, self._valid, self.after) if weigh is not None else None
        if d is not None:  # the source priced the forced tokens itself (auto): its length stands
            tokens = tuple(d.tokens[:k])
            tokens = tokens[: self._valid(tokens)]
            mask = ((1 << common(forced, tokens)) - 1) | int(d.features.get(FORCED, 0))
            mask &= (1 << len(tokens)) - 1
            source = d.source
        else:
            d = self.inner.propose(k)
            tokens, mask = self.interleave(forced, d.tokens, k)
            source = d.source if mask != (1 << len(tokens)) - 1 else GRAMMAR
        if not tokens:
            return make_draft((), d.source or self.name)
        self.forced_drafted += mask.bit_count()
        features = {**d.features, FORCED: float(mask)} if mask else d.features
        return make_draft(tokens, source, d.match_len, features)

    def interleave(self, forced: Sequence[int], proposed: Sequence[int],
                   k: int) -> tuple[tuple[int, ...], int]:
        """Up to ``k`` tokens: the forced ones, then ``proposed``'s tokens after them as long as it
        agrees with what is drafted so far and the grammar allows them, then the tokens the grammar
        forces after those, and so on; with the mask of the forced positions. ``forced``: what the
        grammar forces after the confirmed stream (asked once by :meth:`propose`)."""
        out: list[int] = []
        mask = 0
        tokens = self._tokens
        first = True
        while len(out) < k:
            f = list(forced[: k]) if first else self.grammar.forced(tokens + out, k - len(out))
            first = False
            if f:
                mask |= ((1 << len(f)) - 1) << len(out)
                out.extend(f)
                continue
            if len(proposed) <= len(out) or common(proposed, out) < len(out):
                break  # the source has nothing more, or guessed other than what is drafted
            run = proposed[len(out) : k]
            n = self.grammar.valid(tokens + out, run)
            if n == 0:
                break  # refused at once: the grammar was just asked what it forces here
            out.extend(run[:n])
            if n < len(run):  # cut where it leaves the grammar; what the grammar forces may follow
                proposed = ()
        return tuple(out), mask

    def commit(self) -> None:
        self.inner.commit()

    def feedback(self, step: StepFeedback) -> None:
        self.inner.feedback(step)

    def report(self) -> dict | None:
        return report_of(self.inner)
