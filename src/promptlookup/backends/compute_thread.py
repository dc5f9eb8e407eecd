"""One thread runs every llama.cpp forward in the process, whichever thread asks for it.

Why: llama.cpp built with OpenMP (set-up's build) gives each thread that calls ``llama_decode`` a team
of worker threads of its own, and a team started while another lives is much slower. Measured on the
2-core development machine (``-t 2``, the bundled model, 128 greedy tokens): the first thread to
decode ran at 71 tok/s, a second thread decoding while the first was alive at 27 tok/s, whether the
first one's team spun or slept (``GOMP_SPINCOUNT=10000``: the same; ``OMP_WAIT_POLICY=PASSIVE``: 23
tok/s everywhere). A server decodes on worker threads, an engine may be called from several threads,
a cost curve may be measured on the main thread first: so every forward is handed to this one
thread, at the cost of a queue round trip (tens of microseconds against milliseconds of forward).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_start_lock = threading.Lock()


def _serve() -> None:
    while True:
        fn, args, done = _jobs.get()
        if not done.set_running_or_notify_cancel():
            continue
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, raised there
            done.set_exception(exc)


def on_compute_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run on the process's compute thread (directly when already on it)."""
    global _thread
    if threading.current_thread() is _thread:
        return fn(*args)
    if _thread is None:
        with _start_lock:
            if _thread is None:
                _thread = threading.Thread(target=_serve, name="promptlookup-compute", daemon=True)
                _thread.start()
    done: Future[T] = Future()
    _jobs.put((fn, args, done))
    return done.result()
