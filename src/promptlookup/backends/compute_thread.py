"""One thread runs every llama.cpp forward in the process, whichever thread asks for it, and the
engine loops that drive those forwards.

Why: llama.cpp built with OpenMP (set-up's build) gives each thread that calls ``llama_decode`` a team
of worker threads of its own, and a team started while another lives is much slower. Measured on the
2-core development machine (``-t 2``, the bundled model, 128 greedy tokens): the first thread to
decode ran at 71 tok/s, a second thread decoding while the first was alive at 27 tok/s, whether the
first one's team spun or slept (``GOMP_SPINCOUNT=10000``: the same; ``OMP_WAIT_POLICY=PASSIVE``: 23
tok/s everywhere). A cost curve may be measured on the main thread, a tool may decode from any thread:
so every forward is handed to this one thread (:func:`on_compute_thread`), at the cost of a queue
round trip (tens of microseconds against milliseconds of forward).

An engine loop (:mod:`promptlookup.batching.engine_loop`) runs *on* this thread rather than beside
it: it :func:`attach` es itself as a :class:`Driver`, and the thread gives every busy driver a round
in turn, with the jobs handed in between them. A request's forwards then never change threads.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
log = logging.getLogger("promptlookup.compute")


class Driver(Protocol):
    """What the compute thread runs besides jobs: ``busy()`` (read with the thread's lock held, so
    whoever makes a driver busy calls :func:`wake` after) and ``round()`` (one round of its work)."""

    def busy(self) -> bool: ...

    def round(self) -> None: ...


_jobs: collections.deque[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = collections.deque()
_drivers: list[Driver] = []
_cv = threading.Condition()
_thread: threading.Thread | None = None


def _serve() -> None:
    while True:
        with _cv:
            while not _jobs and not any(d.busy() for d in _drivers):
                _cv.wait()
            job = _jobs.popleft() if _jobs else None
            ready = [d for d in _drivers if d.busy()]
        if job is not None:
            fn, args, done = job
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed back to the caller, raised there
                    done.set_exception(exc)
        for driver in ready:
            try:
                driver.round()
            except Exception:  # a driver's bug must not end the thread every forward runs on
                log.exception("promptlookup: an engine loop's round failed")


def _ensure_thread() -> None:
    """Start the compute thread (lock held)."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name="promptlookup-compute", daemon=True)
        _thread.start()


def on_compute_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run on the process's compute thread (directly when already on it)."""
    if threading.current_thread() is _thread:
        return fn(*args)
    done: Future[T] = Future()
    with _cv:
        _ensure_thread()
        _jobs.append((fn, args, done))
        _cv.notify()
    return done.result()


def is_compute_thread() -> bool:
    return threading.current_thread() is _thread


def attach(driver: Driver) -> None:
    """Give ``driver`` rounds on the compute thread whenever it is busy, until :func:`detach`."""
    with _cv:
        _ensure_thread()
        if driver not in _drivers:
            _drivers.append(driver)
        _cv.notify()


def detach(driver: Driver) -> None:
    with _cv:
        if driver in _drivers:
            _drivers.remove(driver)


def wake() -> None:
    """A driver became busy: the thread looks again (it may be waiting)."""
    with _cv:
        _cv.notify()
