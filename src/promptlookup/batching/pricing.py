"""Draft lengths priced per batch: each sequence, as it comes to its next step, drafts the number of
tokens that maximizes the batch's expected confirmed tokens per second, given what the other
sequences feed the same round.

Why per batch: a drafted token competes with every other sequence's tokens for the same forward. On a
CPU one forward of ``T`` tokens costs about ``a + b*T``: alone, a sequence's draft rides on the fixed
part ``a`` and pays; in a full batch the fixed part is already shared and each drafted token costs
its full ``b``, so only drafts that are likely accepted still pay. Peers switch speculation off above
a hand-set batch size; here the same arithmetic that makes a lone sequence draft makes a full batch
stop, from two things measured as the server runs:

- :class:`BatchCost`: seconds of one forward as a function of its total tokens (the backend's
  measured single-sequence curve as prior, corrected per width bucket by the rounds' measured time),
  summed over the forwards the backend computes a round in (``forwards``: llama.cpp with one KV
  stream per sequence computes a round whose sequences feed different counts in several forwards);
- each sequence's acceptance: per drafted token, the chance it is accepted given the ones before it
  were (a geometric model: a draft of ``k`` tokens confirms ``(1 - p**(k+1)) / (1 - p)`` tokens on
  average, its pending token included), from the sequence's own verifies, shrunk toward the pooled
  rate of all sequences while it has few.

Why each sequence for itself, against what the others actually feed (:meth:`DraftPricing.best_draft`):
a plan made for the whole batch at once assumed every sequence would draft what it was allowed, and
paid for it when one did not. Four sequences each drafting one token make one forward of 8 tokens,
which the costs measured here price as paying at 0.8 acceptance; but a prose request's source
proposes nothing, the round's parts then differ in length, and the drafts ride in a second forward
with its own fixed cost (measured at 4 streaming clients: 85 rounds with drafts at 82 ms against 36
ms without, for 3.1 accepted tokens each). Judged against the parts already waiting for the round
(and, for a sequence still computing, one like the part it fed last, or a one-token step after its
prompt's last chunk), a draft is sent only where it pays in the round it will actually join. With
one sequence there is no cap: the source's own controller (``auto``) decides, as without batching.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from promptlookup.drafting.base import MAX_DRAFT

#: forward widths (total tokens) whose cost is learned separately; a width uses the bucket at or below it
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
COST_ALPHA = 0.1  # weight of one measured round in its bucket's correction
RATIO_RANGE = (0.25, 4.0)  # a round measured outside this ratio to the prior is clipped (a stall, a hog)
HALF_LIFE = 32.0  # a sequence's verifies after which an outcome weighs half
PRIOR_WEIGHT = 4.0  # pseudo-outcomes of the pooled rate in a sequence's estimate
START_ACCEPT = 0.5  # the pooled rate before anything was measured
MIN_GAIN = 1.0005  # a longer draft must raise the rate by this factor (ties go to fewer tokens)
_DECAY = 0.5 ** (1.0 / HALF_LIFE)


class BatchCost:
    """Seconds of one forward of ``tokens`` tokens: ``prior(tokens)`` (the single-sequence cost curve)
    times what measured rounds of that width said of it."""

    def __init__(self, prior: Callable[[int], float]) -> None:
        self.prior = prior
        self.ratio = [1.0] * len(BUCKETS)
        self.rounds = [0] * len(BUCKETS)
        # seconds(n) until the next observe(): every sequence prices its step against the same few
        # widths, 9 round costs a step (``prior`` is a fixed curve, so only observe() changes them)
        self._seconds: dict[int, float] = {}

    @staticmethod
    def bucket(tokens: int) -> int:
        return max(0, bisect.bisect_right(BUCKETS, tokens) - 1)

    def seconds(self, tokens: int) -> float:
        s = self._seconds.get(tokens)
        if s is None:
            s = self._seconds[tokens] = self.prior(max(1, tokens)) * self.ratio[self.bucket(tokens)]
        return s

    def round_seconds(self, forwards: Sequence[int]) -> float:
        """Seconds of a round computed as forwards of these token counts."""
        return sum(self.seconds(n) for n in forwards)

    def observe(self, forwards: Sequence[int], seconds: float) -> None:
        """A round computed as forwards of these token counts took ``seconds`` in all: each forward's
        bucket learns the round's ratio to the prior (a round's forwards are not timed one by one)."""
        forwards = [n for n in forwards if n >= 1]
        if not forwards or not seconds > 0:
            return
        lo, hi = RATIO_RANGE
        r = min(max(seconds / sum(self.prior(n) for n in forwards), lo), hi)
        self._seconds.clear()
        for i in {self.bucket(n) for n in forwards}:
            self.ratio[i] = r if self.rounds[i] == 0 else self.ratio[i] + COST_ALPHA * (r - self.ratio[i])
            self.rounds[i] += 1


@dataclass
class Acceptance:
    """Decayed counts of one sequence's drafted tokens: accepted ones, and drafts that ended in a
    rejection (a draft accepted whole ends in none)."""

    hits: float = 0.0
    misses: float = 0.0

    def add(self, drafted: int, accepted: int) -> None:
        self.hits = self.hits * _DECAY + accepted
        self.misses = self.misses * _DECAY + (1 if accepted < drafted else 0)

    def rate(self, prior: float) -> float:
        return (self.hits + PRIOR_WEIGHT * prior) / (self.hits + self.misses + PRIOR_WEIGHT)


def expected_confirmed(p: float, k: int) -> float:
    """Tokens a verify feeding a ``k``-token draft confirms on average, at per-token acceptance ``p``."""
    return sum(p**j for j in range(k + 1))


def one_forward(parts: tuple[tuple[int, int], ...]) -> list[int]:
    """A round computed in one forward of all its tokens (a backend that mixes counts freely)."""
    return [sum(n for _, n in parts)]


class DraftPricing:
    """Per round, the draft cap of every running sequence; see the module docstring.

    ``forwards``: the token counts of the forwards the backend computes a round in, from the
    ``(seq, tokens)`` parts it feeds in increasing sequence order (the backend's ``forward_sizes``)."""

    def __init__(self, cost: BatchCost, max_draft: int = MAX_DRAFT,
                 forwards: Callable[[tuple[tuple[int, int], ...]], Sequence[int]] = one_forward) -> None:
        self.cost = cost
        self.max_draft = max_draft
        self.forwards = forwards
        self.seqs: dict[int, Acceptance] = {}
        self.pooled = Acceptance()

    def start(self, seq: int) -> None:
        """A new request on ``seq``: its estimate starts from the pooled rate."""
        self.seqs[seq] = Acceptance()

    def observe(self, seq: int, drafted: int, accepted: int) -> None:
        """A verify of ``seq`` fed a ``drafted``-token draft and accepted ``accepted`` of it."""
        if drafted <= 0:
            return
        self.seqs.setdefault(seq, Acceptance()).add(drafted, accepted)
        self.pooled.add(drafted, accepted)

    def rate(self, seq: int) -> float:
        prior = self.pooled.rate(START_ACCEPT)
        own = self.seqs.get(seq)
        return prior if own is None else own.rate(prior)

    def expected(self, seq: int, fed: int, want: str) -> float:
        """Tokens a part of ``seq`` that feeds ``fed`` tokens confirms on average: a verify (``"all"``)
        its pending token and, of its ``fed - 1`` drafted ones, as many as the sequence's rate
        promises; the last chunk of a prompt (``"last"``) one; any other chunk none."""
        if want == "all":
            if fed <= 1:  # a plain step (most parts of a full batch): its pending token, whatever the rate
                return 1.0
            return expected_confirmed(min(self.rate(seq), 0.999), fed - 1)
        return 1.0 if want == "last" else 0.0

    def best_draft(self, seq: int, others: Mapping[int, tuple[int, float]], most: int) -> int:
        """How many tokens (0..``most``) ``seq`` should draft in the round where each other sequence
        ``s`` feeds ``others[s][0]`` tokens and confirms ``others[s][1]`` on average: the number with
        the most expected confirmed tokens per second of the round (ties: fewer).

        Every sequence asks this every step, so it is built for speed: the round's parts are sorted
        once and only ``seq``'s part changes between the lengths tried. Its plain twin,
        :meth:`best_draft_reference`, does the same arithmetic and gives the same answer
        (tests/test_batching.py)."""
        top = min(most, self.max_draft)
        if top <= 0:
            return 0
        gained = sum(e for _, e in others.values())
        layout = sorted([(s, n) for s, (n, _) in others.items()] + [(seq, 1)])
        at = layout.index((seq, 1))
        forwards, round_seconds = self.forwards, self.cost.round_seconds
        best_k, best_rate = 0, (gained + 1.0) / round_seconds(forwards(tuple(layout)))
        p = min(self.rate(seq), 0.999)
        confirmed, run = 1.0, 1.0
        for k in range(1, top + 1):
            run *= p
            confirmed += run
            layout[at] = (seq, 1 + k)
            rate = (gained + confirmed) / round_seconds(forwards(tuple(layout)))
            if rate > best_rate * MIN_GAIN:
                best_k, best_rate = k, rate
        return best_k

    def best_draft_reference(self, seq: int, others: Mapping[int, tuple[int, float]], most: int) -> int:
        """:meth:`best_draft` computed plainly: every length's round laid out and priced afresh."""
        fed = {s: n for s, (n, _) in others.items()}
        gained = sum(e for _, e in others.values())
        p = min(self.rate(seq), 0.999)
        fed[seq] = 1

        def seconds() -> float:
            return self.cost.round_seconds(self.forwards(tuple(sorted(fed.items()))))

        best_k, best_rate = 0, (gained + 1.0) / seconds()
        confirmed, run = 1.0, 1.0
        for k in range(1, min(most, self.max_draft) + 1):
            run *= p
            confirmed += run
            fed[seq] = 1 + k
            rate = (gained + confirmed) / seconds()
            if rate > best_rate * MIN_GAIN:
                best_k, best_rate = k, rate
        return best_k
