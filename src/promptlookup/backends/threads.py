"""CPU threads on a shared machine: llama.cpp's OpenMP spin count, and whether the cores are taken.

Why: our llama.cpp build runs its worker threads as an OpenMP team (``OPENMP = 1`` in its system
info, ``libgomp`` linked by every ``libggml*``), so ggml's own thread-pool ``poll`` setting does not
apply: its barrier is ``#pragma omp barrier``, and how a thread waits there is libgomp's wait policy.
By default libgomp spins 300,000 times (a few milliseconds) before it sleeps. On an idle machine that
is the fastest; beside a busy process the thread that arrives first spins through its time slice
while the one it waits for is descheduled, at each of the hundreds of barriers of a forward pass:
on 2 cores beside one busy process a 2-thread decode fell from 59 to 3 tokens per second
(``benchmarks/contention.py``, table in docs/setup.md). Sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) cures that but costs every barrier a futex wake-up: 23 tokens per
second on the idle machine. A short spin, ``GOMP_SPINCOUNT=1000`` (libgomp's own figure for a team
larger than the cores), kept 52 idle and 23 beside one busy process (20 beside two): the best
worst case of the counts measured (0, 100, 300, 1000, 3000, 10000, 300000). But on the same idle
machine an hour later (its cores slower, each op longer) it cost 40% of decoding: 31 tok/s against 52
for libgomp's default, alternated three times. So the default stays libgomp's (fastest where the
cores are free, as on most machines a server owns), and ``promptlookup doctor`` says when the machine
is oversubscribed and what to set (:func:`oversubscription`).

libgomp reads its environment once, when it is loaded (with the first ``import llama_cpp``), so a
user sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` before the process starts; promptlookup sets
neither. :func:`oversubscription` reads ``/proc/loadavg`` for
``promptlookup doctor``; every function here takes its inputs as arguments so the tests inject them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: libgomp's wait-policy variables: a user who sets either has chosen, and we set neither
OMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: what the doctor recommends on an oversubscribed machine
SHORT_SPIN_SETTING = "GOMP_SPINCOUNT=1000"
#: libgomp's spin count when neither variable is set, and for ``OMP_WAIT_POLICY=ACTIVE`` (its
#: "infinite", 3e10)
LIBGOMP_SPIN = 300_000
ACTIVE_SPIN = 30_000_000_000
#: the longest spin count measured not to collapse beside a busy process (10,000 fell to ~5 tok/s)
SHORT_SPIN = 3000


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or ``taskset``
    narrows; ``os.cpu_count()`` would count the whole machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


# -- is the machine oversubscribed? -------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """``/proc/loadavg`` read: the 1-minute load average and the tasks runnable at the moment of
    reading (which counts the reading process itself)."""

    load1: float
    runnable: int


def parse_loadavg(text: str) -> Load | None:
    """``"2.50 2.19 2.72 3/102 25393"`` -> ``Load(2.5, 3)``; None when the text is not that."""
    fields = text.split()
    try:
        return Load(float(fields[0]), int(fields[3].split("/")[0]))
    except (IndexError, ValueError):
        return None


def read_load(path: str | os.PathLike[str] = "/proc/loadavg") -> Load | None:
    """The load now, or None where there is no ``/proc/loadavg`` (not Linux)."""
    try:
        return parse_loadavg(Path(path).read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None


def busy_elsewhere(load: Load) -> float:
    """Cores' worth of other work: the smaller of the 1-minute average and the other tasks runnable
    now (less this process), so that neither a burst that just began nor one that just ended alone
    counts as the machine being busy. The load average includes this process only while it computes;
    the doctor reads it while idle, so it is taken as it is."""
    return max(0.0, min(load.load1, float(load.runnable - 1)))


def spin_count(environ: Mapping[str, str]) -> int:
    """The spin count libgomp will use under ``environ`` as it reads it: ``GOMP_SPINCOUNT`` (a
    number with an optional k/M/G/T suffix, or ``infinite``), else 0 for ``OMP_WAIT_POLICY=PASSIVE``,
    :data:`ACTIVE_SPIN` for ``ACTIVE``, :data:`LIBGOMP_SPIN` when unset or unreadable."""
    raw = environ.get("GOMP_SPINCOUNT")
    if raw is not None:
        text = raw.strip().lower()
        if text in ("infinite", "infinity"):
            return ACTIVE_SPIN
        scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(text[-1:], 1)
        try:
            return int(text[:-1] if scale > 1 else text) * scale
        except ValueError:
            pass  # libgomp ignores a value it cannot read
    policy = environ.get("OMP_WAIT_POLICY", "").strip().upper()
    return {"PASSIVE": 0, "ACTIVE": ACTIVE_SPIN}.get(policy, LIBGOMP_SPIN)


def wait_policy(environ: Mapping[str, str]) -> tuple[str, int]:
    """How llama.cpp's threads will wait at their barriers under ``environ``: a description of the
    libgomp settings (the user's, or libgomp's default) and the spin count they come to."""
    text = " ".join(f"{k}={environ[k]}" for k in OMP_WAIT_VARS if k in environ)
    if not text:
        return f"libgomp's default (spin {LIBGOMP_SPIN})", spin_count(environ)
    return f"{text} (set in the environment)", spin_count(environ)


def oversubscription(load: Load | None, cores: int, threads: int, environ: Mapping[str, str]) -> str:
    """The doctor's ``load:`` line: the load against the cores this process may use, and what it
    means for ``-t``. Oversubscribed when the other work and our ``threads`` together want more
    cores than there are (by more than half a core: a load average is never exact)."""
    if load is None:
        return "load: unknown (no /proc/loadavg)"
    busy = busy_elsewhere(load)
    others = max(0, load.runnable - 1)
    head = (f"load: 1-minute average {load.load1:.2f}, {others} other task{'s' if others != 1 else ''} "
            f"runnable now, {cores} core{'s' if cores != 1 else ''} available")
    if busy + threads <= cores + 0.5:
        return f"{head}: not oversubscribed at -t {threads}"
    policy, spin = wait_policy(environ)
    if spin <= SHORT_SPIN:
        how = "sleep at once" if spin == 0 else f"spin at most {spin} times"
        tail = f"llama.cpp's threads {how} at a barrier, so speed falls with the load rather than collapsing"
        if threads > 1:
            tail += ("; fewer threads than cores decode faster beside busy processes, all of them "
                     "prefill faster (docs/setup.md, a shared machine)")
    else:
        fix = (f"set {SHORT_SPIN_SETTING} for this process" if policy.startswith("libgomp")
               else f"unset it, or set {SHORT_SPIN_SETTING}")
        tail = (f"llama.cpp's threads spin {spin} times at each barrier ({policy}), which collapses "
                f"decoding beside busy processes: {fix}, or use -t 1")
    return (f"{head}: OVERSUBSCRIBED (about {busy:.1f} cores busy elsewhere + {threads} llama.cpp "
            f"thread{'s' if threads != 1 else ''}); {tail}")
