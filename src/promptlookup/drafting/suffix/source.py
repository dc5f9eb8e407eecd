"""``--suffix``: the source over the request, an optional history and an optional corpus index.

The rule is :mod:`promptlookup.drafting.suffix.rule` (with its plain reference twin), its compiled
form :mod:`promptlookup.drafting.suffix.kernel`; this module holds the source (the token buffer,
the request's automaton, the history's matcher, the kernel's arrays) and its spec hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from promptlookup.drafting.base import Draft, StepFeedback, TokenBuffer, compiled_entry, make_draft
from promptlookup.drafting.spec import DRAFT, Option, Run, SourceSpec, SpecError
from promptlookup.drafting.suffix.automaton import M_DEPTH, M_GM, M_GV, M_POS, SuffixAutomaton, match_step
from promptlookup.drafting.suffix.corpus_index import DEFAULT_MAX_MATCH, CorpusIndex, empty_index
from promptlookup.drafting.suffix.kernel import (
    FEATURES,
    N_SCRATCH_ROWS,
    PARAMS,
    R_GLAST,
    R_LLAST,
    draft_kernel,
)
from promptlookup.drafting.suffix.rule import (
    DEFAULT_CORPUS_MARGIN,
    DEFAULT_CORPUS_WEIGHT,
    DEFAULT_LOCAL_WEIGHT,
    DEFAULT_MIN_MATCH,
    DEFAULT_MIN_PROB,
)
from promptlookup.errors import InputError

_EMPTY_HISTORY = None


def _empty_automaton() -> SuffixAutomaton:
    global _EMPTY_HISTORY
    if _EMPTY_HISTORY is None:
        _EMPTY_HISTORY = SuffixAutomaton(capacity=16)
    return _EMPTY_HISTORY


class SuffixSource(TokenBuffer):
    """``--suffix``: the rule of :mod:`promptlookup.drafting.suffix.rule` over the request, an optional
    history and an optional corpus index.

    ``history`` is a :class:`promptlookup.drafting.suffix.history.History` (or ``None``). When
    ``record`` is true, each request is added to it when the next one starts (``reset``) or when
    :meth:`commit` is called. ``corpus`` is an opened
    :class:`promptlookup.drafting.suffix.corpus_index.CorpusIndex` (or ``None``), searched for context
    suffixes of at most ``corpus_max_match`` tokens.
    """

    name = "suffix"

    def __init__(self, history=None, depth: int = 32, min_match: int = DEFAULT_MIN_MATCH,
                 min_prob: float = DEFAULT_MIN_PROB, local_weight: float = DEFAULT_LOCAL_WEIGHT,
                 record: bool = True, n_vocab: int = 1 << 17, corpus: CorpusIndex | None = None,
                 corpus_max_match: int = DEFAULT_MAX_MATCH,
                 corpus_weight: float = DEFAULT_CORPUS_WEIGHT,
                 corpus_margin: int = DEFAULT_CORPUS_MARGIN, factor: float = 0.0) -> None:
        if min_match < 1:
            raise ValueError(f"suffix min-match must be at least 1, got {min_match}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"suffix min-prob must be in 0..1, got {min_prob}")
        if corpus_max_match < 1:
            raise ValueError(f"suffix corpus max-match must be at least 1, got {corpus_max_match}")
        if factor < 0:
            raise ValueError(f"suffix factor must be 0 (no cap) or more, got {factor}")
        self.history = history
        self.depth = depth
        self.min_match = min_match
        self.min_prob = float(min_prob)
        self.factor = float(factor)
        self.local_weight = float(local_weight)
        self.record = record
        self.corpus = corpus
        self.corpus_max_match = corpus_max_match
        self.corpus_weight = float(corpus_weight)
        self.corpus_margin = int(corpus_margin)
        self._index = corpus if corpus is not None else empty_index()
        if corpus is not None and corpus.n_vocab > n_vocab:
            raise InputError(f"the corpus index has a vocabulary of {corpus.n_vocab}, "
                             f"beyond n_vocab {n_vocab}")
        self._own_corpora: list[CorpusIndex] = [corpus] if corpus is not None else []
        self._corpora = self._own_corpora
        self._local = SuffixAutomaton(depth=depth)
        super().__init__()  # the request's tokens, then a draft's scratch
        self.n_vocab = n_vocab
        self._params = np.zeros(1, dtype=PARAMS)
        p = self._params[0]
        p["min_match"], p["min_prob"], p["local_weight"] = self.min_match, self.min_prob, self.local_weight
        p["corpus_weight"], p["corpus_cap"] = self.corpus_weight, self.corpus_max_match
        p["corpus_margin"] = self.corpus_margin
        self._feat = np.zeros(1, dtype=FEATURES)
        self._scratch = np.zeros((N_SCRATCH_ROWS, n_vocab), dtype=np.float64)
        self._scratch[R_LLAST : R_GLAST + 1] = -1.0
        if history is not None and history.max_token >= n_vocab:
            raise InputError(f"the history holds token {history.max_token}, beyond n_vocab {n_vocab}")
        self._committed = True
        self._g_seen: SuffixAutomaton | None = None
        self._g_len = -1
        self.reset([0, 0, 0])
        # compile (or load the cached build) before any timing, and keep the build for these argument
        # types (this source's own arrays, fixed for its life): a call then skips numba's type
        # dispatch, which costs more than a microsecond over these tuples and structured arrays
        self._kernel = compiled_entry(draft_kernel, self._local.tables, self._global().tables,
                                      self._index.arrays, self._buf, self._n, 2, self._params, self._feat,
                                      self._scratch)
        self._kernels = {_kernel_key(self._index.arrays): self._kernel}
        self._committed = True
        self.reset([])

    def use_corpora(self, corpora: Sequence[CorpusIndex] | None) -> None:
        """Draft from ``corpora`` (opened indexes, e.g. a request's named corpora) until the next call;
        None: back to the source's own (``corpus=``). Several: each is searched, and the one whose
        match is longest decides (ties: the first named); their counts do not add."""
        if corpora is None:
            self._corpora = self._own_corpora
            return
        for c in corpora:
            if c.n_vocab > self.n_vocab:
                raise InputError(f"the corpus index {c.path} has a vocabulary of {c.n_vocab}, "
                                 f"beyond n_vocab {self.n_vocab}")
        self._corpora = list(corpora)

    def _kernel_for(self, arrays) -> Callable:  # noqa: ANN001
        """The compiled build for this corpus's array types (an mmap'd index's are read-only, an
        empty one's writable; int32 or int64 positions): the dispatcher until its first call."""
        key = _kernel_key(arrays)
        k = self._kernels.get(key)
        if k is None:
            k = draft_kernel
            try:
                from numba import typeof

                args = (self._local.tables, self._global().tables, arrays, self._buf, self._n, 2,
                        self._params, self._feat, self._scratch)
                k = draft_kernel.overloads[tuple(typeof(a) for a in args)].entry_point
                self._kernels[key] = k
            except (AttributeError, KeyError, TypeError):
                pass
        return k

    @staticmethod
    def _check(got: int, ix: CorpusIndex) -> int:
        if got < 0:
            if got == -1:
                raise ValueError("a negative token id reached the suffix source")
            from promptlookup.drafting.suffix.corpus_index import CorpusIndexError

            raise CorpusIndexError(f"{ix.path}: corrupt corpus index (found while drafting)")
        return got

    def _global(self) -> SuffixAutomaton:
        return self.history.automaton if self.history is not None else _empty_automaton()

    def _rematch(self, g: SuffixAutomaton) -> None:
        """The history changed under a request: match the request's text against it afresh."""
        self._g_seen, self._g_len = g, g.n_tokens
        self._params["depth_g"] = g.meta[M_DEPTH]
        v, m = 0, 0
        for t in self._buf[: int(self._local.meta[M_POS])]:
            v, m = match_step(g.st, g.hk, g.hv, g.ed, v, m, t)
        self._local.meta[M_GV], self._local.meta[M_GM] = v, m

    def commit(self) -> None:
        """Add the current request to the history (once), so later requests can draft from it."""
        if not self._committed and self.record and self.history is not None and self._n:
            self.history.add(self._buf[: self._n])
        self._committed = True

    def feedback(self, step: StepFeedback) -> None:
        """Scores and thresholds are fixed settings: what a step cost does not change a proposal."""

    def reset(self, prompt: Sequence[int]) -> None:
        self.commit()
        self._local.clear()
        self._n = 0
        meta = self._local.meta
        meta[M_GV] = 0
        meta[M_GM] = 0
        g = self._global()
        self._g_seen, self._g_len = g, g.n_tokens
        self._params["depth_g"] = g.meta[M_DEPTH]
        self._committed = False
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        """Record confirmed tokens; the matchers catch up inside the next ``propose`` (one call)."""
        m = len(tokens)
        if m == 1:
            t = tokens[0]
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"token id {t} is outside 0..{self.n_vocab - 1}")
        elif m:
            tokens = np.asarray(tokens, dtype=np.int64)
            if tokens.min() < 0 or tokens.max() >= self.n_vocab:
                raise ValueError(f"token ids must be in 0..{self.n_vocab - 1}")
        self._append(tokens)

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return make_draft((), self.name)
        n = self._n
        self._room(n + k)
        loc = self._local
        if n > loc.cap_tokens:
            loc.reserve(n)
        h = self.history
        g = h.automaton if h is not None else _empty_automaton()
        if g is not self._g_seen or g.meta[M_POS] != self._g_len:
            self._rematch(g)
        corpora = self._corpora
        if len(corpora) <= 1:
            ix = corpora[0] if corpora else self._index
            kernel = self._kernel if ix is self._index else self._kernel_for(ix.arrays)
            got = self._check(kernel(loc.tables, g.tables, ix.arrays, self._buf, n, k, self._params,
                                     self._feat, self._scratch), ix)
            match, count, total, prob, from_history, from_corpus = self._feat.tolist()[0]
        else:  # each corpus searched; the longest corpus match decides (ties: the first named)
            best = None
            for ix in corpora:
                kernel = self._kernel_for(ix.arrays)
                got = self._check(kernel(loc.tables, g.tables, ix.arrays, self._buf, n, k, self._params,
                                         self._feat, self._scratch), ix)
                feat = self._feat.tolist()[0]
                rank = feat[0] if feat[5] else -1.0
                if best is None or rank > best[0]:
                    best = (rank, tuple(self._buf[n : n + got].tolist()), feat)
            assert best is not None
            draft = best[1]
            got = len(draft)
            self._buf[n : n + got] = draft
            match, count, total, prob, from_history, from_corpus = best[2]
        if self.factor > 0:  # SuffixDecoding's cap: a draft no longer than factor x the match behind it
            got = min(got, int(self.factor * match))
        return make_draft(tuple(self._buf[n : n + got].tolist()), "suffix", match,
                          {"count": count, "total": total, "prob": prob, "from_history": from_history,
                           "from_corpus": from_corpus})


def _kernel_key(arrays) -> tuple:  # noqa: ANN001
    return tuple((a.dtype.str, a.flags.writeable) for a in arrays)


# --- the source vocabulary (promptlookup.drafting.spec):
# suffix[:draft=N][:history=FILE][:budget=TOKENS][:corpus=FILE][:min-prob=P][:factor=F] ---

AUTO_WEIGHED = "named"  # auto weighs it when its sources= names it (see drafting/auto/source.py)
OPTIONS = {
    "draft": DRAFT,
    "history": Option(str, None, flag="--suffix-history",
                      help="earlier requests for suffix / auto: loaded at start (a corrupt or foreign "
                           "file is refused), this run's requests added and saved atomically"),
    "budget": Option(int, None, 1, 1 << 32, "--suffix-history-budget",
                     "history memory in tokens; the oldest requests go first"),
    "corpus": Option(str, None, flag="--suffix-corpus",
                     help="corpus suffix-array index (promptlookup index) for suffix / auto: long matches "
                          "into a static corpus"),
    # spec-only: where a drafted token costs its full price (a full batch), a draft stops before the
    # tokens it is unlikely to get accepted (ArcticInference's min_token_prob, 0.1 by default there)
    "min-prob": Option(float, DEFAULT_MIN_PROB, 0.0, 1.0,
                       help="stop a draft before a token that takes its estimated probability below this"),
    # spec-only: SuffixDecoding's max_spec_factor (1.0 in ArcticInference): a draft at most this many
    # times as long as the match it follows, so a short, chance match drafts little
    "factor": Option(float, 0.0, 0.0, 64.0,
                     help="cap a draft at this times the length of its match (0: no cap)"),
}


def factory(spec: SourceSpec, run: Run) -> Callable[[], SuffixSource]:
    """The corpus index is opened once per run and shared. Each source gets the run's shared history
    (:attr:`Run.history`) or its own: from ``history=FILE`` (a missing file starts an empty one that
    :func:`save` creates), else an empty one in memory, so a run's later requests draft from its
    earlier ones."""
    from pathlib import Path

    from promptlookup.drafting.suffix.corpus_index import open_index
    from promptlookup.drafting.suffix.history import DEFAULT_BUDGET, History

    history_path, budget, corpus_path = spec.value("history"), spec.value("budget"), spec.value("corpus")
    min_prob, factor = spec.value("min-prob"), spec.value("factor")
    corpus = (run.shared("corpus", corpus_path,
                         lambda: open_index(corpus_path, fingerprint=run.tokenizer_fingerprint(),
                                            n_vocab=run.n_vocab, verify=run.verify))
              if corpus_path else None)

    if run.history is not None and (history_path is not None or budget is not None):
        raise SpecError(f"{spec.label}: this run keeps one history for every request; its file and "
                        "budget are the run's settings, not the source's")

    def make() -> SuffixSource:
        if run.history is not None:
            history = run.history
        elif history_path is not None and Path(history_path).exists():
            history = History.load(history_path, fingerprint=run.tokenizer_fingerprint(), budget=budget)
        elif history_path is not None:
            history = History(budget=budget or DEFAULT_BUDGET, fingerprint=run.tokenizer_fingerprint())
        else:
            history = History(budget=budget or DEFAULT_BUDGET)
        return SuffixSource(history=history, n_vocab=run.n_vocab, corpus=corpus, min_prob=min_prob,
                            factor=factor)

    return make


def save(spec: SourceSpec, source: SuffixSource) -> None:
    """End of a run (after commit): write the history back atomically."""
    if spec.value("history") and source.history is not None:
        source.history.save(spec.value("history"))
