"""A backend's verify cost curve, measured on the loaded model and cached per (model, backend, threads).

Why here and not in ``measure/``: measuring only drives the backend contract (prefill, verify,
rollback), and the backends' own smoke test measures it (``doctor``), while ``measure/`` imports the
backends to replay and compare; the curve type itself is :mod:`promptlookup.costcurve`.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from promptlookup.backends.base import Model, common_prefix
from promptlookup.costcurve import CostCurve, CostCurveError
from promptlookup.fileio import cache_dir


def time_verify_widths(backend: Model, max_tokens: int = 9, reps: int = 5,
                       clock: Callable[[], float] = time.perf_counter) -> tuple[float, ...]:
    """Median seconds of verify steps of 1..max_tokens tokens fed at the cache's current end, rolled
    back after each (the cache ends as it began).

    The widths are interleaved across repetitions so drift (frequency, other load) hits all of them
    alike, and the median of each is kept. ``clock`` is wall time; a benchmark on a loaded machine
    passes ``time.process_time`` (one thread: the work done, not the wait for a core).
    """
    feed = [100 + i for i in range(max_tokens)]
    base = backend.n_past
    samples: list[list[float]] = [[] for _ in range(max_tokens)]
    backend.verify(feed)  # warm-up: first use of each kernel path
    backend.rollback(base)
    for _ in range(reps):
        for n in range(1, max_tokens + 1):
            t0 = clock()
            backend.verify(feed[:n])
            samples[n - 1].append(clock() - t0)
            backend.rollback(base)
    return tuple(statistics.median(s) for s in samples)


def measure_cost_curve(backend: Model, max_tokens: int = 9, reps: int = 5, context: int = 128,
                       clock: Callable[[], float] = time.perf_counter) -> CostCurve:
    """Time verify steps of 1..max_tokens tokens on ``backend`` after ``context`` filler tokens (about
    a second on a small model; see :func:`time_verify_widths`). The backend's cache is cleared
    afterwards."""
    backend.prefill([int(t) for t in range(100, 100 + context)])
    seconds = time_verify_widths(backend, max_tokens, reps, clock)
    backend.rollback(0)
    return CostCurve(seconds, label=f"{getattr(backend, 'name', 'backend')} measured")


def measure_cost_curve_after(backend: Model, context: Sequence[int], max_tokens: int = 9, reps: int = 5,
                             clock: Callable[[], float] = time.perf_counter) -> CostCurve:
    """The curve as a workload's own steps see it: verifies timed after ``context`` (its prompt and
    part of its answer), decoding only what the cache does not hold of it already; the cache ends
    holding ``context``.

    Why not the load-time curve: that one is timed after 128 tokens, and attention over a long
    prompt weighs on a decode more than on a verify, whose tokens share one read of the cache (on
    the 1.5B a 9-token verify cost 2.7 decodes at load and 2.4 after a 1,000-token prompt). A
    hindsight oracle charged by the load-time curve is too low, and shares of it too high.
    """
    if not context:
        raise ValueError("a curve after a context needs at least one context token")
    keep = min(common_prefix(backend.tokens, context), len(context) - 1)
    backend.prefill(context, keep=keep)
    seconds = time_verify_widths(backend, max_tokens, reps, clock)
    return CostCurve(seconds, label=f"{getattr(backend, 'name', 'backend')} measured after "
                                    f"{len(context)} tokens")


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


def cached_cost_curve(backend: Model, max_tokens: int = 9, refresh: bool = False) -> CostCurve:
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
    if not refresh:  # what a long first load (about 17 s on a 1.5B) is doing, said once
        print(f"promptlookup: measuring this model's verify cost curve for auto (once per model, threads "
              f"and build; cached in {path})", file=sys.stderr)
    curve = measure_cost_curve(backend, max_tokens=max_tokens)
    curve.save(path)
    return curve
