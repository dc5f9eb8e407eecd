"""The output's text as tokens are confirmed: what is safe to show yet, and where a stop string ends it.

Why its own module: the CLI streams text to a terminal, the public API yields pieces, the server sends
server-sent events, and all three must agree on two subtle things:

* a character whose UTF-8 bytes are split across tokens is shown once its last byte has arrived
  (a trailing U+FFFD of an incomplete character is held back), and
* a stop string ends the text *before* it, also when it spans several tokens or sits inside an
  accepted draft (several tokens confirmed in one step); text that might be the start of a stop
  string is held back until the next tokens decide.

The whole output is detokenized on every step (detokenizing a prefix is not always a prefix of the
detokenized whole: a leading space, a split character); outputs are at most a context long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextTracker:
    """Feed each step's tokens with :meth:`add`; it returns the text that became safe to show."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], stops: Sequence[str] = ()) -> None:
        self.detokenize = detokenize
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self.tokens: list[int] = []
        self.text = ""
        self.shown = 0  # characters of ``text`` handed out so far
        self.stop: str | None = None  # the stop string that ended the text, once one did
        self._searched = 0  # stop strings were looked for up to here (a match may start before it)

    @property
    def stopped(self) -> bool:
        return self.stop is not None

    def add(self, new: Sequence[int]) -> str:
        """Take one step's confirmed tokens; return the text now safe to show (possibly "").

        After a stop string is found, :attr:`tokens` ends with the token that completed it, the
        text ends before it, and further calls return ""."""
        if self.stopped:
            return ""
        base = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        text = self.detokenize(self.tokens)
        if self.stops:
            at, stop = self._find(text)
            if stop is not None:
                self._cut(text, base, at, stop)
                return self._take(len(self.text))
            longest = max(len(s) for s in self.stops)
            self._searched = max(0, len(text) - longest + 1)
        self.text = text
        return self._take(self._safe_end(text))

    def finish(self) -> str:
        """The rest of the text at the end of generation (an incomplete character included)."""
        return self._take(len(self.text))

    def _find(self, text: str) -> tuple[int, str | None]:
        """The earliest stop string in ``text`` (from where earlier steps could not have seen it)."""
        best, which = len(text) + 1, None
        for s in self.stops:
            i = text.find(s, self._searched)
            if i != -1 and i < best:
                best, which = i, s
        return best, which

    def _cut(self, text: str, base: int, at: int, stop: str) -> None:
        """Keep the tokens up to the one that completes the stop string; the text ends before it."""
        for j in range(base + 1, len(self.tokens) + 1):
            if self.detokenize(self.tokens[:j]).find(stop, self._searched) != -1:
                del self.tokens[j:]
                break
        self.text = text[:at]
        self.stop = stop

    def _safe_end(self, text: str) -> int:
        """Where the showable text ends: before a trailing incomplete character and before a tail
        that could still grow into a stop string."""
        end = len(text.rstrip(REPLACEMENT))
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, end), hold, -1):
                if text.endswith(s[:n], 0, end):
                    hold = n
                    break
        end -= hold
        return max(end, self.shown)

    def _take(self, end: int) -> str:
        piece = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return piece
