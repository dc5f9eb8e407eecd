"""Verify cost curves: how long one verify step takes as a function of how many tokens it feeds.

Whether a draft pays depends on this curve as much as on acceptance. On a CPU a batch of 1 + N
tokens costs far more than one decode (compute-bound matmuls); on a GPU the curve is nearly flat.
The controller reads the curve as relative costs, so the same policy works on either.

A curve is measured on the loaded backend in about a second and cached per (model, backend,
threads); it can also be written to and read from a JSON file for simulation (``--cost-curve``).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptlookup.errors import UserError
from promptlookup.fileio import atomic_write_text, cache_dir

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


def measure_cost_curve(backend: Any, max_tokens: int = 9, reps: int = 5, context: int = 128,
                       clock: Callable[[], float] = time.perf_counter) -> CostCurve:
    """Time verify steps of 1..max_tokens tokens on ``backend`` (about a second on a small model).

    The widths are interleaved across repetitions so drift (frequency, other load) hits all of them
    alike, and the median of each is kept. The backend's cache is cleared afterwards. ``clock`` is
    wall time; a benchmark on a loaded machine passes ``time.process_time`` (one thread: the work
    done, not the wait for a core).
    """
    filler = [int(t) for t in range(100, 100 + context)]
    backend.prefill(filler)
    base = backend.n_past
    samples: list[list[float]] = [[] for _ in range(max_tokens)]
    backend.verify(filler[:max_tokens])  # warm-up: first use of each kernel path
    backend.rollback(base)
    for _ in range(reps):
        for n in range(1, max_tokens + 1):
            t0 = clock()
            backend.verify(filler[:n])
            samples[n - 1].append(clock() - t0)
            backend.rollback(base)
    backend.rollback(0)
    return CostCurve(tuple(statistics.median(s) for s in samples),
                     label=f"{getattr(backend, 'name', 'backend')} measured")


def curve_cache_path(model_path: str | os.PathLike[str], backend_name: str, threads: int) -> Path:
    """Keyed by the model file, the backend, the threads and, for llama.cpp, the installed build (the
    batch-invariant kernels and the fast ones draw different curves: a curve measured on one must
    not steer ``auto`` on the other)."""
    p = Path(model_path)
    st = p.stat()
    build = ""
    if backend_name == "llama.cpp":
        from promptlookup.backends.doctor import library_fingerprint

        build = f"|{library_fingerprint()}"
    text = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{backend_name}|{threads}{build}"
    key = hashlib.sha256(text.encode())
    return cache_dir() / "cost-curves" / f"{p.stem}-{backend_name}-t{threads}-{key.hexdigest()[:12]}.json"


def cached_cost_curve(backend: Any, max_tokens: int = 9, refresh: bool = False) -> CostCurve:
    """The curve for this (model, backend, threads), measured once and then read from the cache."""
    path = curve_cache_path(backend.model_path, backend.name, backend.n_threads)
    if not refresh and path.is_file():
        try:
            curve = CostCurve.load(path)
            if len(curve.seconds) >= max_tokens:
                return curve
        except CostCurveError as exc:  # a damaged cache entry is measured again
            print(f"promptlookup: warning: cached cost curve unusable, measuring it again ({exc})",
                  file=sys.stderr)
    curve = measure_cost_curve(backend, max_tokens=max_tokens)
    curve.save(path)
    return curve


def describe(curve: CostCurve, n: int | None = None) -> str:
    rel = curve.relative(n)
    return " ".join(f"{i + 1}:{r:.2f}x" for i, r in enumerate(rel))


def as_curve(values: Sequence[float], label: str = "") -> CostCurve:
    return CostCurve(tuple(float(v) for v in values), label)
