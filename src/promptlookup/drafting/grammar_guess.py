"""Guesses where a grammar leaves a choice that the text around makes one way.

Why. JSON's optional whitespace stops llguidance's forced tokens at every separator: after a
property name ``"symbol`` the quote may join the colon (``":``), and after ``":`` any whitespace may
come before the value, so the grammar forces nothing there, and a step is spent on ``":`` and another
on `` "`` (one each time, on every property of every tool call). The model writes them one way: the
way the prompt's JSON (a tool list, a schema) writes them and the way it wrote them a moment ago. So
where the grammar forces nothing, the token that most often followed the last two tokens (else the
last one) in the prompt and the output, among those the grammar allows, is a good guess; and after
a guess the grammar often forces again (the property name after `` "``). :class:`FollowerCounts`
ranks those tokens; :class:`GuessRecord` learns how often guesses held, so the price ``auto`` puts
on one is measured, not assumed. A guess is a draft like any other: verified, never trusted, so
the output stays exact.

No backend and no grammar here: the grammar layer (:mod:`promptlookup.drafting.forced`) asks which
followers the grammar allows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

OUTPUT_WEIGHT = 4  # an output pair ranks as this many prompt pairs: the model's own style under the grammar
MIN_SHARE = 0.5  # a follower with less than this share of the allowed sightings plus one is no guess
PRIOR_STRENGTH = 2.0  # the share is worth this many scored guesses of the same token
P_MAX = 0.98  # a guess is never priced as certain: only forced tokens are


class Follower(NamedTuple):
    """A token that followed a context: ``weight`` ranks it (a sighting in the prompt weighs 1, in the
    output :data:`OUTPUT_WEIGHT`), ``seen`` counts its sightings, which is what its chance rests on:
    measured on the 1.5B's json_schema answers, a pair seen once in the output held 0.39 of the time
    where the weighed share priced it at 0.8, and one seen once in the prompt held 0.75."""

    token: int
    weight: float
    seen: int


def _ranked(in_prompt: dict[int, int], in_output: dict[int, int]) -> list[Follower]:
    """Followers from their sightings in the prompt and in the output, heaviest first, then lowest id:
    the one place where a sighting's weight is decided."""
    tokens = in_prompt.keys() | in_output.keys()
    out = [Follower(t, float(in_prompt.get(t, 0) + OUTPUT_WEIGHT * in_output.get(t, 0)),
                    in_prompt.get(t, 0) + in_output.get(t, 0)) for t in tokens]
    return sorted(out, key=lambda f: (-f.weight, f.token))


def followers_reference(stream: Sequence[int], n_prompt: int, context: Sequence[int]) -> list[Follower]:
    """The plain twin of :meth:`FollowerCounts.followers`: the token after every occurrence of
    ``context`` in ``stream`` (the prompt's first ``n_prompt`` tokens, then the output), weighed 1
    inside the prompt and :data:`OUTPUT_WEIGHT` where that token is output; heaviest first, then
    lowest id."""
    n = len(context)
    in_prompt: Counter[int] = Counter()
    in_output: Counter[int] = Counter()
    for i in range(len(stream) - n):
        if list(stream[i : i + n]) == list(context):
            (in_prompt if i + n < n_prompt else in_output)[int(stream[i + n])] += 1
    return _ranked(in_prompt, in_output)


class FollowerCounts:
    """Which tokens followed one or two tokens in the prompt and the output, and how often.

    The prompt's are counted when asked, in numpy over the prompt's ids (a 4k-token prompt in tens
    of microseconds); the output's are kept in a dict as it grows (its tokens after the last one
    or two tokens before them, the prompt's tail included)."""

    ORDERS = (1, 2)

    def __init__(self) -> None:
        self._prompt = np.zeros(0, dtype=np.int64)
        self._tail: list[int] = []  # the stream's last tokens (the context of the next one)
        self._out: dict[tuple[int, ...], Counter[int]] = {}

    def reset(self, prompt: Sequence[int]) -> None:
        self._prompt = np.asarray(prompt, dtype=np.int64)
        self._tail = [int(t) for t in prompt[-max(self.ORDERS):]]
        self._out = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            t = int(t)
            for n in self.ORDERS:
                if len(self._tail) >= n:
                    self._out.setdefault(tuple(self._tail[-n:]), Counter())[t] += 1
            self._tail = [*self._tail[1 - max(self.ORDERS):], t]

    def followers(self, context: Sequence[int]) -> list[Follower]:
        """Every token that followed ``context`` (one or two tokens), heaviest first, then lowest id
        (:func:`followers_reference` is the plain twin)."""
        key = tuple(int(t) for t in context)
        if len(key) not in self.ORDERS:
            raise ValueError(f"a context of {len(key)} tokens; followers are counted after {self.ORDERS}")
        p = self._prompt
        n = len(key)
        in_prompt: dict[int, int] = {}
        if len(p) > n:
            hit = p[: len(p) - n] == key[0]
            for j in range(1, n):
                hit &= p[j : len(p) - n + j] == key[j]
            nxt = p[n:][hit]
            if len(nxt):
                ids, counts = np.unique(nxt, return_counts=True)
                in_prompt = {int(i): int(c) for i, c in zip(ids, counts, strict=True)}
        return _ranked(in_prompt, self._out.get(key, {}))


class GuessRecord:
    """How often guesses held: per guessed token, shrunk toward the share it was guessed with.

    Every guess made is scored once the confirmed tokens reach its position, if the tokens before it
    (the draft it was made after) held: a conditional acceptance, as ``auto``'s acceptance model
    keeps, learned whether or not the guess was sent (the output does not depend on drafts)."""

    def __init__(self) -> None:
        self.hits: dict[int, float] = {}
        self.trials: dict[int, float] = {}
        self._pending: dict[tuple[int, int], tuple[int, ...]] = {}  # (position, token) -> the prefix

    def p(self, token: int, share: float) -> float:
        """The chance that a guess of ``token`` made with ``share`` holds."""
        hits, trials = self.hits.get(token, 0.0), self.trials.get(token, 0.0)
        return min(P_MAX, (hits + share * PRIOR_STRENGTH) / (trials + PRIOR_STRENGTH))

    def made(self, start: int, prefix: Sequence[int], token: int) -> None:
        """A guess of ``token`` at position ``start + len(prefix)``, after ``prefix`` from ``start``."""
        self._pending.setdefault((start + len(prefix), int(token)), (start, *prefix))

    def score(self, stream: Sequence[int]) -> None:
        """Score every guess whose position ``stream`` (the whole confirmed stream) has reached."""
        n = len(stream)
        done = [key for key in self._pending if key[0] < n]
        for key in done:
            start, *prefix = self._pending.pop(key)
            at, token = key
            if list(stream[start:at]) != prefix:
                continue  # the draft before it failed: says nothing about the guess
            self.trials[token] = self.trials.get(token, 0.0) + 1.0
            self.hits[token] = self.hits.get(token, 0.0) + (1.0 if stream[at] == token else 0.0)
