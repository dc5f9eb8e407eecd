"""CPU threads on a shared machine: llama.cpp's OpenMP wait policy, and whether the cores are taken.

Why: our llama.cpp build runs its worker threads as an OpenMP team (``OPENMP = 1`` in its system
info, ``libgomp`` linked by every ``libggml*``), so ggml's own thread-pool ``poll`` setting does not
apply: its barrier is ``#pragma omp barrier``, and how a thread waits there is libgomp's wait policy.
By default libgomp spins up to 300,000 times before it sleeps. On an idle machine that costs nothing;
beside another busy process the thread that arrives first spins through its time slice while the
one it waits for is descheduled, at every one of the hundreds of barriers of a forward pass, and a
2-thread decode fell from tens of tokens per second to about one (``benchmarks/contention.py``, table
in docs/setup.md). With ``OMP_WAIT_POLICY=PASSIVE`` a waiting thread sleeps at once and gives its
core back, so the speed degrades in proportion to the load instead of collapsing.

libgomp reads its environment once, when it is loaded (with the first ``import llama_cpp``), so
:func:`apply_openmp_defaults` must run before that; a user's own ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` always wins. :func:`oversubscription` reads ``/proc/loadavg`` for
``promptlookup doctor``; every function here takes its inputs as arguments so the tests inject them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

#: libgomp's wait-policy variables: a user who sets either has chosen, and we set neither
OMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: what we set when the user has not chosen (see the module docstring and docs/setup.md)
OMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def openmp_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The libgomp variables to set: :data:`OMP_DEFAULTS`, or nothing when the user set either
    wait-policy variable (``GOMP_SPINCOUNT`` alone also decides how long a thread spins, so setting
    ``OMP_WAIT_POLICY`` beside it would change what the user asked for)."""
    if any(k in environ for k in OMP_WAIT_VARS):
        return {}
    return dict(OMP_DEFAULTS)


def apply_openmp_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`openmp_defaults` in ``environ`` (``os.environ``: the C library's environment,
    where libgomp reads it) and return what was set. Call before llama.cpp's library is loaded;
    afterwards it changes nothing libgomp will read."""
    env = os.environ if environ is None else environ
    chosen = openmp_defaults(env)
    env.update(chosen)
    return chosen


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


def wait_policy(environ: Mapping[str, str]) -> tuple[str, bool]:
    """How llama.cpp's threads will wait at their barriers under ``environ``: a description of the
    libgomp settings (the user's, or ours), and whether a waiting thread gives its core back at once
    (passive) rather than spinning."""
    chosen = openmp_defaults(environ)
    env = {**{k: environ[k] for k in OMP_WAIT_VARS if k in environ}, **chosen}
    text = " ".join(f"{k}={env[k]}" for k in OMP_WAIT_VARS if k in env)
    text += " (promptlookup's default)" if chosen else " (set in the environment)"
    spin = env.get("GOMP_SPINCOUNT")
    if spin is not None:
        passive = spin.strip() == "0"
    else:
        passive = env.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
    return text, passive


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
    policy, passive = wait_policy(environ)
    if passive:
        tail = ("llama.cpp's threads wait passively, so speed falls about in proportion to the load; "
                f"-t {cores} takes the largest share of the cores (docs/setup.md, a shared machine)")
    else:
        tail = (f"llama.cpp's threads spin at their barriers ({policy}), which collapses decoding beside "
                "busy processes: unset it or set OMP_WAIT_POLICY=PASSIVE, or use -t 1")
    return (f"{head}: OVERSUBSCRIBED (about {busy:.1f} cores busy elsewhere + {threads} llama.cpp "
            f"thread{'s' if threads != 1 else ''}); {tail}")
