"""The ``--suffix`` rule: draft the most frequent continuation of the longest match, over the request, the
history and a static corpus.

Why this rule. ``--ngram`` copies what followed the most recent longest match, which is right when
the text is being copied and wrong when a match is common (``self.`` is followed by a hundred
things). SuffixDecoding counts continuations in a suffix tree but scores every match length and
keeps the best-scoring path, so a short, frequent match often wins over a long, exact one, and it
caps a draft at the match length. Here the longest match always decides, and counts decide within
it; recency only breaks ties. One rule, applied token by token to the text extended with what was
already drafted:

1. For each provider -- the request's own text (a suffix automaton over prompt and output), the
   history (a suffix automaton over earlier requests, see :mod:`promptlookup.drafting.suffix.history`)
   and, optionally, a corpus (a suffix array, see :mod:`promptlookup.drafting.suffix.corpus_index`,
   searched for context suffixes of at most ``corpus_max_match`` tokens) -- find the longest
   suffix ``L*`` of the context that occurs there *followed by a token*.
2. The candidates are the tokens that follow those occurrences. A candidate ``c`` scores the number
   of occurrences of the context plus ``c``, counted on its last ``min(L*+1, depth)`` tokens.
3. The provider with the longest ``L*`` decides; on equal ``L*`` the scores add (the request's
   weighted by ``local_weight``, the corpus's by ``corpus_weight``). The corpus's ``L*`` enters
   this comparison as ``L* - corpus_margin`` (default 4): a margin lets the request and history,
   which predict this text better than a generic corpus, keep deciding on near-equal matches.
4. The highest score wins; ties go to the candidate seen most recently in the request, then most
   recently in the history, then the lowest token id.
5. Its estimated probability is its score over the candidates' total; the draft's probability is
   the product along it. Drafting stops at ``k`` tokens, when ``L*`` falls below ``min_match``, or
   before a token that would take the draft's probability below ``min_prob``.

:func:`draft_reference` states that rule over plain lists by brute force;
:func:`promptlookup.drafting.suffix.kernel.draft_kernel` runs it on the automata and the suffix
array with numba, for :class:`promptlookup.drafting.suffix.source.SuffixSource`. Tests hold them
equal on real text.
"""

from __future__ import annotations

from collections.abc import Sequence

from promptlookup.drafting.suffix.automaton import SEP
from promptlookup.drafting.suffix.corpus_index import DEFAULT_MAX_MATCH

DEFAULT_MIN_MATCH = 1
DEFAULT_MIN_PROB = 0.0
DEFAULT_LOCAL_WEIGHT = 1.0
DEFAULT_CORPUS_WEIGHT = 1.0
DEFAULT_CORPUS_MARGIN = 4  # measured: 0 loses to history alone, 4 wins (docs/suffix.md)


def _common_suffix(text: Sequence[int], end: int, context: Sequence[int], cap: int) -> int:
    """How many tokens ``text[: end + 1]`` and ``context`` share at their ends (at most ``cap``)."""
    n = 0
    while n < cap and end - n >= 0 and n < len(context) and text[end - n] == context[-1 - n]:
        n += 1
    return n


def _longest_with_follower(text: Sequence[int], context: Sequence[int], cap: int | None = None) -> int:
    """Largest ``L`` (at most ``cap``) such that ``context[-L:]`` occurs in ``text`` followed by a
    token (not SEP)."""
    cap = len(context) if cap is None else min(cap, len(context))
    return max((_common_suffix(text, e, context, cap) for e in range(len(text) - 1)
                if text[e + 1] != SEP), default=0)


def _scores(text: Sequence[int], context: Sequence[int], lstar: int,
            depth: int) -> dict[int, tuple[int, int]]:
    """``{candidate: (count, most recent end)}`` for the followers of ``context[-lstar:]``."""
    followers = {text[e + 1] for e in range(len(text) - 1)
                 if text[e + 1] != SEP and _common_suffix(text, e, context, lstar) == lstar}
    out = {}
    n = min(lstar + 1, depth)
    for c in followers:
        ends = [e for e in range(len(text)) if text[e] == c
                and _common_suffix(text, e - 1, context, n - 1) == n - 1]
        out[c] = (len(ends), max(ends))
    return out


def draft_reference(
    local: Sequence[int], history: Sequence[int], k: int, depth: int, min_match: int = DEFAULT_MIN_MATCH,
    min_prob: float = DEFAULT_MIN_PROB, local_weight: float = DEFAULT_LOCAL_WEIGHT,
    corpus: Sequence[int] = (), corpus_max_match: int = DEFAULT_MAX_MATCH,
    corpus_weight: float = DEFAULT_CORPUS_WEIGHT, corpus_margin: int = DEFAULT_CORPUS_MARGIN,
) -> tuple[list[int], list[float], int]:
    """The whole ``--suffix`` rule by brute force: ``(tokens, probabilities, first match length)``.

    ``local`` is the request's text, ``history`` earlier requests joined by :data:`SEP`, ``corpus``
    a static corpus. Quadratic and slow, and obviously the rule: the twin the fast path is tested
    against.
    """
    context = list(local)
    tokens: list[int] = []
    probs: list[float] = []
    first_match = 0
    path = 1.0
    for i in range(k):
        ll = _longest_with_follower(local, context)
        lg = _longest_with_follower(history, context) if history else 0
        lc = _longest_with_follower(corpus, context, corpus_max_match) if len(corpus) else 0
        lc_eff = lc - corpus_margin if lc else 0
        top = max(ll, lg, lc_eff)
        if i == 0:
            first_match = top
        if top < min_match:
            break
        cand: dict[int, list[float]] = {}  # token -> [score, local last, history last]
        if ll == top:
            for c, (n, last) in _scores(local, context, ll, depth).items():
                cand[c] = [local_weight * n, last, -1]
        if lg == top:
            for c, (n, last) in _scores(history, context, lg, depth).items():
                entry = cand.setdefault(c, [0.0, -1, -1])
                entry[0] += n
                entry[2] = last
        if lc and lc_eff == top:
            for c, (n, _) in _scores(corpus, context, lc, depth).items():
                cand.setdefault(c, [0.0, -1, -1])[0] += corpus_weight * n
        total = sum(v[0] for v in cand.values())
        best = min(cand, key=lambda c: (-cand[c][0], -cand[c][1], -cand[c][2], c))
        p = cand[best][0] / total
        if path * p < min_prob:
            break
        path *= p
        tokens.append(best)
        probs.append(p)
        context.append(best)
    return tokens, probs, first_match
