"""The verify cost curve: how long one verify step takes as a function of how many tokens it feeds.

Whether a draft pays depends on this curve as much as on acceptance. On a CPU a batch of 1 + N
tokens costs far more than one decode (compute-bound matmuls); on a GPU the curve is nearly flat.
The controller reads the curve as relative costs, so the same policy works on either.

Why a module of its own, at the top: the type is what ``auto`` (drafting), the backends' measuring
(:mod:`promptlookup.backends.costs`, measured on the loaded backend in about a second and cached per
model, backend and threads) and the cost simulation (measure) share, so none of those packages has
to import another for it. A curve can also be written to and read from a JSON file (``--cost-curve``).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptlookup.errors import UserError
from promptlookup.fileio import atomic_write_text

MAX_CURVE_TOKENS = 16
MAX_CURVE_LEN = 64  # widths a curve may describe (a verify feeds at most 1 + MAX_DRAFT tokens)
# Physical range of one verify step, in seconds (or in decodes, for a relative curve), and of the
# ratio of any two: [5e-324, 1e308, 1e308] gave infinite relative costs and a 0.00x "speedup".
MIN_SECONDS, MAX_SECONDS, MAX_RATIO = 1e-9, 3600.0, 1e4


class CostCurveError(UserError, ValueError):
    """A cost curve file that is missing, malformed or physically impossible."""


@dataclass(frozen=True)
class CostCurve:
    """``seconds[n - 1]`` is the time of one verify step feeding ``n`` tokens (1 = plain decode)."""

    seconds: tuple[float, ...]
    label: str = ""

    def __post_init__(self) -> None:
        if not self.seconds:
            raise CostCurveError("a cost curve needs at least the cost of a 1-token decode")
        if len(self.seconds) > MAX_CURVE_LEN:
            raise CostCurveError(f"a cost curve describes at most {MAX_CURVE_LEN} widths, "
                                 f"got {len(self.seconds)}")
        for i, s in enumerate(self.seconds):
            if not (isinstance(s, int | float) and s > 0 and s == s and s != float("inf")):
                raise CostCurveError(f"cost of a {i + 1}-token verify must be a positive number, got {s!r}")
            if not MIN_SECONDS <= s <= MAX_SECONDS:
                raise CostCurveError(f"cost of a {i + 1}-token verify is out of range ({s!r}; a verify step "
                                     f"takes {MIN_SECONDS:g} to {MAX_SECONDS:g} s)")
        if max(self.seconds) > MAX_RATIO * min(self.seconds):
            raise CostCurveError(f"cost curve spans more than a factor {MAX_RATIO:g} between widths "
                                 f"({min(self.seconds)!r} to {max(self.seconds)!r} s): not a measured curve")

    def cost(self, n_tokens: int) -> float:
        """Seconds for a verify of ``n_tokens``; past the measured end, extrapolate the last slope."""
        if n_tokens < 1:
            raise ValueError(f"a verify feeds at least one token, got {n_tokens}")
        s = self.seconds
        if n_tokens <= len(s):
            return s[n_tokens - 1]
        slope = s[-1] - s[-2] if len(s) >= 2 else s[-1]
        return s[-1] + max(slope, 0.0) * (n_tokens - len(s))

    def relative(self, max_tokens: int | None = None) -> list[float]:
        """Costs divided by the plain-decode cost, for 1..max_tokens tokens."""
        n = max_tokens or len(self.seconds)
        return [self.cost(i) / self.seconds[0] for i in range(1, n + 1)]

    # -- files ------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"format": "promptlookup-cost-curve", "version": 1, "label": self.label,
                           "seconds": list(self.seconds)}, indent=1)

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_text(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostCurve:
        from promptlookup.jsonin import MAX_BYTES, JSONInputError, loads_bounded

        p = Path(path)
        if p.is_dir():
            raise CostCurveError(f"cost curve file is a directory: {p}")
        try:
            size = p.stat().st_size
            if size > MAX_BYTES:
                raise CostCurveError(f"cost curve file {p} is {size} bytes, "
                                     f"more than the {MAX_BYTES} accepted")
            obj: Any = loads_bounded(p.read_text(encoding="utf-8"), f"cost curve file {p}")
        except FileNotFoundError:
            raise CostCurveError(f"cost curve file not found: {p}") from None
        except UnicodeDecodeError as exc:
            raise CostCurveError(f"cost curve file is not valid JSON: {p} ({exc})") from None
        except JSONInputError as exc:
            raise CostCurveError(str(exc)) from None
        except OSError as exc:
            raise CostCurveError(f"cannot read cost curve file {p}: {exc.strerror or exc}") from None
        if isinstance(obj, list):  # a bare list of seconds (or relative costs) is accepted too
            obj = {"seconds": obj}
        if not isinstance(obj, dict) or not isinstance(obj.get("seconds"), list):
            raise CostCurveError(f"cost curve file {p} has no 'seconds' list")
        try:
            return cls(tuple(float(x) for x in obj["seconds"]), str(obj.get("label", p.stem)))
        except (TypeError, ValueError) as exc:
            raise CostCurveError(f"cost curve file {p}: {exc}") from None

    @classmethod
    def flat(cls, n: int = MAX_CURVE_TOKENS, label: str = "flat") -> CostCurve:
        """A GPU-like curve: a verify of any width costs one decode."""
        return cls(tuple([1.0] * n), label)


def describe(curve: CostCurve, n: int | None = None) -> str:
    rel = curve.relative(n)
    return " ".join(f"{i + 1}:{r:.2f}x" for i, r in enumerate(rel))


def median_curve(curves: Sequence[CostCurve], label: str = "") -> CostCurve:
    """Several timings of one curve made one: at each width the median of their relative costs,
    times the median plain decode (the widths all of them measured).

    Why: one timing on a shared machine is a lottery. Four timings of the 1.5B's verifies after the
    same copy_edit context, minutes apart, read an 8-token verify as 2.07, 2.24, 2.25 and 2.45
    decodes, and the hindsight oracle charged by them as 2.32x, 2.23x, 2.23x and 2.18x. The shapes
    are taken relative so that a timing made while the whole machine ran slower weighs only through
    its shape.
    """
    if not curves:
        raise ValueError("a median of cost curves needs at least one curve")
    n = min(len(c.seconds) for c in curves)
    plain = statistics.median(c.seconds[0] for c in curves)
    shapes = [c.relative(n) for c in curves]
    return CostCurve(tuple(plain * statistics.median(s[i] for s in shapes) for i in range(n)),
                     label or curves[0].label)


def as_curve(values: Sequence[float], label: str = "") -> CostCurve:
    return CostCurve(tuple(float(v) for v in values), label)
