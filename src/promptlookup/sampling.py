"""Sampling that speculation leaves exactly as it is: llama.cpp's samplers, keyed by position.

Why a position-keyed random stream. Speculation verifies a drafted token by sampling the target at
that position and keeping the draft only where the sample equals it ("sample and match", as
llama.cpp and transformers do); the first mismatch emits the sample itself. That is exact in
distribution with any random generator. It is exact *token for token* against plain sampling with
the same seed only if the random number used at a position never depends on how many tokens a
verify batch held or on how many draws came before. So the uniform used to sample absolute
position ``pos`` is a pure function of ``(seed, pos)``: output number ``pos + 1`` of splitmix64
seeded with a hash of the seed (splitmix64 is itself counter based: output ``n`` is
``mix(key + n * golden)``, so any output is computed directly, in about a microsecond of Python).
Then wherever the backend's batched logits equal its single-token logits (transformers in fp32, the
test fakes), a speculative run emits exactly the tokens of a plain run with that seed; on llama.cpp,
whose batched logits differ slightly, it is exact in distribution and the same seed repeats the run.

The chain is llama.cpp's default order and meaning (``common/sampling.cpp``, ``src/llama-sampling.cpp``):

0. **logit bias** (OpenAI's ``logit_bias``: added to the raw logits), and a **grammar**
   (:mod:`promptlookup.grammar`, structured output) that removes the ids it forbids from the
   candidates, as llama.cpp's ``grammar_first``; greedy with a grammar is the argmax of the allowed
   ids, which is the plain argmax whenever that one is allowed (checked first: one bit of the mask);
1. **penalties** over the last ``repeat_last_n`` tokens before the position (prompt and drafts
   included: a draft before the position is the accepted prefix whenever this position's sample is
   used), once per distinct token id: the repeat penalty divides a positive logit and multiplies a
   non-positive one, then ``count * frequency + presence`` is subtracted;
2. **top-k**: the ``k`` highest logits (``0`` = off); ties at the boundary go to the lower token id;
3. **top-p**: softmax over what is left (temperature 1), keep the smallest prefix whose cumulative
   probability is ``>= top_p`` (``1`` = off);
4. **min-p**: keep logits ``>= max + log(min_p)``, i.e. ``p >= min_p * p_max`` (``0`` = off);
5. **temperature** divides the survivors' logits; ``0`` means greedy: the argmax of the penalized
   logits (lowest id on ties), which with no penalties is exactly the argmax every backend already
   returned before sampling existed;
6. **dist**: inverse CDF of the survivors, in (logit descending, id ascending) order, at the
   position's uniform.

Two implementations of steps 1-2: :func:`reference_sample` sorts the whole vocabulary (plain, slow)
and :meth:`Sampler.sample` keeps only candidates within a margin of the max before a partial
partition (no softmax over the whole vocabulary); both feed the same steps 3-6, and a test holds
them equal on real logits.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from promptlookup.errors import InputError
from promptlookup.grammar import apply_mask

if TYPE_CHECKING:
    from promptlookup.grammar import Constraint

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Candidates for top-k are first cut to logits within this much of the max (exact: if fewer than k
# survive, the whole row is partitioned instead). exp(-12) ~ 6e-6 of the max's weight.
_PREFILTER_MARGIN = 12.0


def _mix64(z: int) -> int:
    """splitmix64's output function (Stafford's variant 13)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int) -> int:
    """The splitmix64 state a seed starts from (hashed, so seeds 1 and 2 are unrelated streams)."""
    return _mix64((int(seed) + _GOLDEN) & _MASK)


def uniform(seed: int, pos: int) -> float:
    """The uniform in [0, 1) used to sample absolute position ``pos`` under ``seed``."""
    return _uniform_from_key(stream_key(seed), pos)


def _uniform_from_key(key: int, pos: int) -> float:
    z = _mix64((key + (int(pos) + 1) * _GOLDEN) & _MASK)
    return (z >> 11) * (1.0 / (1 << 53))


def random_seed() -> int:
    """A fresh seed for a run that did not name one (reported, so the run can be repeated)."""
    return secrets.randbelow(1 << 32)


class SamplingError(InputError):
    """A sampler setting out of range (a flag or a request field); the message names it."""


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's sampler settings and defaults, except ``temp``: 0 (greedy) is our default."""

    temp: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        for name in ("temp", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v):
                raise SamplingError(f"--{name.replace('_', '-')} must be a finite number, got {v!r}")
        if self.temp < 0:
            raise SamplingError(f"--temp must be >= 0 (0 = greedy), got {self.temp}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SamplingError(f"--top-k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"--top-p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise SamplingError(f"--min-p must be in [0, 1] (0 = off), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise SamplingError(f"--repeat-penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        if int(self.repeat_last_n) != self.repeat_last_n or self.repeat_last_n < -1:
            raise SamplingError(f"--repeat-last-n must be an integer >= -1 (-1 = all, 0 = off), "
                             f"got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    @property
    def penalties(self) -> bool:
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def describe(self) -> str:
        if self.greedy and not self.penalties:
            return "greedy"
        parts = [f"temp {self.temp:g}"]
        if not self.greedy:
            parts += [f"top-k {self.top_k}", f"top-p {self.top_p:g}", f"min-p {self.min_p:g}"]
        if self.penalties:
            parts += [f"repeat-penalty {self.repeat_penalty:g}", f"repeat-last-n {self.repeat_last_n}",
                      f"presence {self.presence_penalty:g}", f"frequency {self.frequency_penalty:g}"]
        return ", ".join(parts)


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability and the top alternatives at its position.

    Under the model's own distribution: log-softmax of the raw logits at temperature 1, before
    penalties and filters (what OpenAI's ``logprobs`` report and vLLM's default ``raw_logprobs``)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def _window(tokens: Sequence[int], n: int, last_n: int) -> Sequence[int]:
    return tokens[max(0, n - last_n) : n] if last_n > 0 else tokens[:n]


def _penalized(values: np.ndarray, counts: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's penalties on the logits of the tokens seen (float32, like llama.cpp)."""
    rp = np.float32(params.repeat_penalty)
    out = np.where(values <= 0, values * rp, values / rp).astype(np.float32)
    sub = (counts.astype(np.float32) * np.float32(params.frequency_penalty)
           + np.float32(params.presence_penalty))
    return (out - sub).astype(np.float32)


def _cut(ids: np.ndarray, logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Steps 3-4 (top-p, then min-p) on the top-k candidates, sorted by (logit desc, id asc)."""
    lg = logits.astype(np.float64)
    if params.top_p < 1.0 and len(lg) > 1:
        p = np.exp(lg - lg[0])
        p /= p.sum()
        reached = np.cumsum(p) >= params.top_p
        n = int(np.argmax(reached)) + 1 if reached.any() else len(lg)
        ids, lg = ids[:n], lg[:n]
    if params.min_p > 0.0 and len(lg) > 1:
        n = int(np.count_nonzero(lg >= lg[0] + math.log(params.min_p)))
        ids, lg = ids[:n], lg[:n]
    return ids, lg


def _finish(ids: np.ndarray, logits: np.ndarray, params: SamplingParams, u: float) -> int:
    """Steps 3-6: cut, temperature, then the inverse CDF at ``u``."""
    ids, lg = _cut(ids, logits, params)
    cdf = np.cumsum(np.exp((lg - lg[0]) / params.temp))
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(ids[min(i, len(ids) - 1)])


def filtered_distribution(logits: np.ndarray, tokens: Sequence[int], n: int,
                          params: SamplingParams) -> dict[int, float]:
    """The exact distribution position ``n`` is sampled from (for tests): token -> probability."""
    row = penalize(np.asarray(logits, dtype=np.float32), tokens, n, params)
    if params.greedy:
        return {int(np.argmax(row)): 1.0}
    ids, lg = _cut(*_reference_top_k(row, params.top_k), params)
    w = np.exp((lg - lg[0]) / params.temp)
    w /= w.sum()
    return {int(t): float(x) for t, x in zip(ids, w, strict=True)}


def penalize(row: np.ndarray, tokens: Sequence[int], n: int, params: SamplingParams) -> np.ndarray:
    """The logits after llama.cpp's penalties for position ``n`` (reference: a Counter, id by id)."""
    if not params.penalties:
        return row
    counts = Counter(int(t) for t in _window(tokens, n, params.repeat_last_n))
    out = row.copy()
    for tok, c in counts.items():
        out[tok] = _penalized(out[tok : tok + 1], np.array([c]), params)[0]
    return out


def _reference_top_k(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((np.arange(len(row)), -row.astype(np.float64)))
    if 0 < k < len(row):
        order = order[:k]
    return order, row[order]


def reference_sample(logits: np.ndarray, tokens: Sequence[int], n: int, params: SamplingParams,
                     seed: int, logit_bias: Mapping[int, float] | None = None,
                     allowed: np.ndarray | None = None) -> int:
    """The plain implementation: the whole vocabulary biased, penalized, masked (``allowed``, a
    grammar's ids), sorted and cut."""
    row = np.array(logits, dtype=np.float32, copy=True)
    for t, b in (logit_bias or {}).items():
        row[t] = np.float32(row[t] + np.float32(b))
    row = penalize(row, tokens, n, params)
    if allowed is not None:
        row = np.where(allowed, row, -np.inf).astype(np.float32)
    if params.greedy:
        return int(np.argmax(row))
    ids, lg = _reference_top_k(row, params.top_k)
    if allowed is not None:
        keep = np.isfinite(lg)
        ids, lg = ids[keep], lg[keep]
    return _finish(ids, lg, params, uniform(seed, n))


MAX_LOGPROBS = 20  # alternatives per position (OpenAI's limit)


def check_seed_and_logprobs(seed: int | None, logprobs: int | None) -> None:
    """A seed in 0..2**64-1 (None: chosen at random later) and 0..20 alternatives, or a one-line error."""
    if seed is not None and not 0 <= seed <= _MASK:
        raise SamplingError(f"--seed must be in 0..2**64-1, got {seed}")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise SamplingError(f"--logprobs must be in 0..{MAX_LOGPROBS}, got {logprobs}")


class Sampler:
    """One run's sampler: the settings, the seed's stream, and the logprobs it recorded.

    Backends call :meth:`sample_rows` with the logits rows they computed; logits never leave the
    backend. Positions are absolute (index in prompt + output of the token being chosen).
    """

    def __init__(self, params: SamplingParams | None = None, seed: int | None = None,
                 logprobs: int | None = None, logit_bias: Mapping[int, float] | None = None,
                 constraint: Constraint | None = None) -> None:
        self.params = params or SamplingParams()
        self.seed = random_seed() if seed is None else int(seed)
        check_seed_and_logprobs(self.seed, logprobs)
        self.logprobs = logprobs
        self._key = stream_key(self.seed)
        self.recorded: dict[int, TokenLogprob] = {}
        bias = dict(logit_bias or {})
        self._bias_ids = np.array(sorted(bias), dtype=np.int64)
        self._bias = np.array([bias[t] for t in sorted(bias)], dtype=np.float32)
        self.constraint = constraint

    @property
    def argmax_only(self) -> bool:
        """True when every position's choice is its raw argmax (a backend may take it in bulk)."""
        return (self.params.greedy and not self.params.penalties and self.logprobs is None
                and not len(self._bias_ids) and self.constraint is None)

    def reset(self, start: int = 0) -> None:
        """Before a generation whose first generated token is at position ``start`` (the prompt's
        length: where a grammar starts)."""
        self.recorded.clear()
        if self.constraint is not None:
            self.constraint.reset(start)

    def uniform(self, pos: int) -> float:
        return _uniform_from_key(self._key, pos)

    # -- one position -----------------------------------------------------------------------------
    def sample(self, logits: np.ndarray, tokens: Sequence[int], n: int) -> int:
        """The token at position ``n`` given ``tokens[:n]`` and the logits that predict it."""
        params = self.params
        row = logits
        if len(self._bias_ids):  # first in llama.cpp's chain, as OpenAI's logit_bias
            row = np.array(logits, dtype=np.float32, copy=True)
            row[self._bias_ids] += self._bias
        if params.penalties:
            window = _window(tokens, n, params.repeat_last_n)
            if len(window):
                ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
                row = np.array(row, dtype=np.float32, copy=row is logits)
                row[ids] = _penalized(row[ids], counts, params)
        constraint, end = self.constraint, None
        if constraint is not None and not constraint.sync(tokens, n):
            # a token before ``n`` that the grammar refuses: a drafted one (a row the loop never
            # reads) or one its own mask let through; either way the reply ends here, as a stop,
            # never free text after a broken grammar
            constraint, end = None, constraint.end(row)
        if end is not None:
            tok = end
        elif params.greedy:
            tok = int(np.argmax(row))
            # the argmax of the allowed ids is the plain argmax whenever that one is allowed
            if constraint is not None and not constraint.allows(tok):
                tok = int(np.argmax(apply_mask(row, constraint.allowed(len(row)))))
        elif constraint is not None:
            allowed = np.flatnonzero(constraint.allowed(len(row)))
            ids, lg = self._top_k(np.asarray(row, dtype=np.float32)[allowed], params.top_k)
            tok = _finish(allowed[ids], lg, params, self.uniform(n))
        else:
            ids, lg = self._top_k(row, params.top_k)
            tok = _finish(ids, lg, params, self.uniform(n))
        if self.logprobs is not None:
            self.recorded[n] = self._logprob(logits, tok)
        return tok

    @staticmethod
    def _top_k(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-k candidates sorted by (logit descending, id ascending), without a full sort."""
        v = len(row)
        if k <= 0 or k >= v:
            return _reference_top_k(row, k)
        top = row.max()
        cand = np.flatnonzero(row >= top - _PREFILTER_MARGIN)
        if len(cand) < k:
            cand = np.arange(v)
        vals = row[cand]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = cand[vals > kth]
        ties = cand[vals == kth][: k - len(above)]  # cand ascends, so the lowest ids win ties
        ids = np.concatenate((above, ties))
        lg = row[ids]
        order = np.lexsort((ids, -lg.astype(np.float64)))
        return ids[order], lg[order]

    def _logprob(self, logits: np.ndarray, tok: int) -> TokenLogprob:
        row = np.asarray(logits, dtype=np.float64)
        top = row.max()
        lse = top + math.log(float(np.exp(row - top).sum()))
        alts: tuple[tuple[int, float], ...] = ()
        if self.logprobs:
            n = self.logprobs
            part = np.argpartition(row, len(row) - n)[len(row) - n :]
            part = part[np.lexsort((part, -row[part]))]
            alts = tuple((int(t), float(row[t] - lse)) for t in part)
        return TokenLogprob(int(tok), float(row[tok] - lse), alts)

    # -- a verify batch ---------------------------------------------------------------------------
    def sample_rows(self, rows: np.ndarray, tokens: Sequence[int], first: int) -> list[int]:
        """Choose the tokens at positions ``first, first + 1, ...`` from ``rows`` (row ``i``
        predicts ``first + i`` given ``tokens[:first + i]``).

        Stops after the first row whose choice differs from the token already fed at that position
        (a rejected draft): the loop never reads further, and the rows after it were computed from
        a prefix that is about to be rolled back.
        """
        out: list[int] = []
        for i in range(len(rows)):
            pos = first + i
            tok = self.sample(rows[i], tokens, pos)
            out.append(tok)
            if pos < len(tokens) and tokens[pos] != tok:
                break
        return out
