"""The ``--align`` draft source: follow the place being copied, through the writer's own edits of it.

Why: a model that quotes or reformats text does not copy it token for token. Asked to quote a
definition from a license, Qwen2.5-Coder-1.5B writes it on one line while the prompt wraps it every
70 characters and indents each line (``including\\n      the``): every line end breaks the copy, and
a matcher of the last few tokens (``ngram``, ``lookup``, ``suffix``) needs a token or two to find
the place again, by which time the next line end is near. Papers given with spaces before commas
(``parsers .``) come back as ``parsers.``. The edits are systematic, so they can be learned.

The source holds one **alignment**: the position in the text so far (prompt plus confirmed tokens)
of the token it expects next. Each confirmed token either

* is that token: the alignment moves on (the token was **kept**);
* is the token the source has learned to write in its place (a learned substitution): moves on;
* is found among the next :data:`SKIP` source tokens: the tokens before it were **dropped**, and
  the alignment moves past it;
* is none of these, but the last :data:`ANCHOR` tokens, it included, occur earlier and the
  alignment is young (followed fewer than :data:`YOUNG` tokens): the writer copies from there, and
  the alignment **moves** there (a quote whose first words the question gave goes on as the
  document does, not as the question did);
* is none of these: it is taken as written in place of the expected token, and if the token after
  it continues the source, that **substitution** is learned (``.`` for `` .``); up to
  :data:`MAX_ASTRAY` such tokens in a row, then the alignment is lost.

Without an alignment (at the start, or once lost), the most recent earlier occurrence of the last
:data:`ANCHOR` tokens becomes one. The draft is the source text from the alignment on, with every
token the writer dropped more often than it kept left out and every learned substitution applied;
its ``match_len`` is how many tokens the alignment has followed, so ``auto``'s buckets judge a
long-followed alignment as they judge a long match. Nothing here depends on the model: only the
confirmed tokens, so drafts stay proposals the model verifies, and the output is the model's own.

Edits are learned per request (``reset`` forgets them): each answer is told the text it copies.
Plain Python: a confirmed token costs a few dictionary operations, a proposal ``k`` of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from promptlookup.drafting.base import Draft, StepFeedback, make_draft
from promptlookup.drafting.spec import DRAFT, Run, SourceSpec

SKIP = 4  # source tokens a confirmed token may skip (dropped) and still continue the alignment
ANCHOR = 3  # tokens of the text's end whose earlier occurrence starts an alignment
MAX_ASTRAY = 6  # confirmed tokens in a row that continue nothing before the alignment is lost
YOUNG = 8  # an alignment followed fewer tokens than this moves where a token it cannot place leads
MAX_FOLLOWED = 64  # match_len reported at most (auto's longest bucket starts at 32)


class AlignSource:
    """``--align``: one alignment into the text so far, and the edits the writer makes to it."""

    name = "align"

    def __init__(self) -> None:
        self.reset(())

    def reset(self, prompt: Sequence[int]) -> None:
        self._text: list[int] = []
        self._anchors: dict[tuple[int, ...], int] = {}  # last ANCHOR tokens -> the position after them
        self._at: int | None = None  # position in _text of the token expected next; None: no alignment
        self._followed = 0  # tokens the alignment has followed
        self._astray = 0  # confirmed tokens in a row that continued nothing
        # (expected, written): a substitution, if the next token continues the source
        self._unsure: tuple[int, int] | None = None
        self._kept: dict[int, int] = {}
        self._dropped: dict[int, int] = {}
        self._written_as: dict[int, dict[int, int]] = {}  # source token -> what was written for it, counted
        for t in prompt:  # the prompt is the text to align to, not text that follows an alignment
            self._add(int(t))

    def commit(self) -> None:
        """Nothing carries over: the next request's ``reset`` starts from its own prompt."""

    def feedback(self, step: StepFeedback) -> None:
        """A fixed rule: what a step cost does not change what it proposes."""

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            t = int(t)
            astray, followed = self._astray, self._followed
            if self._at is not None:
                self._follow(t)
            acquired = self._add(t)
            # No alignment, or a young one where this token continues nothing, while the last ANCHOR
            # tokens were seen elsewhere: the writer copies from there now. An alignment followed
            # longer is more likely right and the token an edit (moving every such one cost three
            # ACLSum summaries 1-5 points of their replayed share of the oracle: their writer swaps
            # a word, "can" for "achieves", and goes on with the sentence).
            if acquired is not None and (self._at is None or (self._astray > astray and followed < YOUNG)):
                self._at, self._followed, self._astray, self._unsure = acquired, ANCHOR, 0, None

    def propose(self, k: int) -> Draft:
        at = self._at
        if at is None or self._unsure is not None or k <= 0:
            return make_draft((), self.name, 0)
        text, out = self._text, []
        while len(out) < k and at < len(text):
            t = text[at]
            at += 1
            if self._dropped.get(t, 0) > self._kept.get(t, 0):
                continue
            out.append(self.written_for(t))
        return make_draft(tuple(out), self.name, min(self._followed, MAX_FOLLOWED))

    def written_for(self, t: int) -> int:
        """What the writer is expected to write where the source has ``t``: the token it wrote most
        often in its place, if more often than it kept ``t``; else ``t``. Ties: the earliest learned."""
        seen = self._written_as.get(t)
        if not seen:
            return t
        best, count = max(seen.items(), key=lambda kv: kv[1])
        return best if count > self._kept.get(t, 0) else t

    @property
    def alignment(self) -> int | None:
        """The position in the text so far of the token expected next (None: no alignment)."""
        return self._at

    # -- internals --------------------------------------------------------------------------------
    def _add(self, t: int) -> int | None:
        """Append ``t`` and index the anchor it ends; return the position after that anchor's
        previous occurrence (where an alignment would start), or None."""
        text = self._text
        text.append(t)
        n = len(text)
        if n < ANCHOR:
            return None
        key = tuple(text[n - ANCHOR:])
        before = self._anchors.get(key)
        self._anchors[key] = n
        return before

    def _moved(self, to: int) -> None:
        self._at, self._astray = to, 0
        self._followed += 1

    def _follow(self, t: int) -> None:
        text, at = self._text, self._at
        assert at is not None
        expected = text[at] if at < len(text) else None
        if self._unsure is not None:
            source_token, written = self._unsure
            self._unsure = None
            if expected == t:  # the token before was written in place of the source's
                counts = self._written_as.setdefault(source_token, {})
                counts[written] = counts.get(written, 0) + 1
                self._moved(at + 1)
                return
        if expected is None:
            self._lost()
            return
        if expected == t:
            self._kept[t] = self._kept.get(t, 0) + 1
            self._moved(at + 1)
            return
        if self.written_for(expected) == t:
            counts = self._written_as[expected]
            counts[t] += 1
            self._moved(at + 1)
            return
        for skip in range(1, SKIP + 1):
            if at + skip < len(text) and text[at + skip] == t:
                for d in text[at:at + skip]:
                    self._dropped[d] = self._dropped.get(d, 0) + 1
                self._moved(at + skip + 1)
                return
        self._astray += 1
        if self._astray > MAX_ASTRAY:
            self._lost()
            return
        self._unsure = (expected, t)
        self._at = at + 1

    def _lost(self) -> None:
        self._at, self._followed, self._astray, self._unsure = None, 0, 0, None


# --- the source vocabulary (promptlookup.drafting.spec): align[:draft=N] ---

AUTO_WEIGHED = "named"  # auto weighs it when its sources= names it (see drafting/auto/source.py)
OPTIONS = {"draft": DRAFT}


def factory(spec: SourceSpec, run: Run) -> Callable[[], AlignSource]:
    return AlignSource
