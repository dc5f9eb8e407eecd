"""Every llama.cpp forward runs on one thread per process (backends/compute_thread.py)."""

from __future__ import annotations

import threading

import pytest

from promptlookup.backends.compute_thread import on_compute_thread


def where() -> str:
    return threading.current_thread().name


def test_calls_from_any_thread_run_on_the_one_compute_thread():
    seen = [on_compute_thread(where)]
    threads = [threading.Thread(target=lambda: seen.append(on_compute_thread(where))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == ["promptlookup-compute"] * 5


def test_results_and_errors_come_back_to_the_caller_and_nested_calls_run_inline():
    assert on_compute_thread(pow, 3, 4) == 81
    with pytest.raises(ZeroDivisionError):
        on_compute_thread(lambda: 1 / 0)
    assert on_compute_thread(lambda: on_compute_thread(where)) == "promptlookup-compute"
    assert on_compute_thread(where) == "promptlookup-compute"  # the thread survived the error


def test_a_busy_driver_gets_rounds_between_jobs_until_it_is_idle_or_detached():
    from promptlookup.backends import compute_thread

    class Driver:
        def __init__(self, rounds: int) -> None:
            self.left = rounds
            self.threads: set[str] = set()
            self.idle = threading.Event()

        def busy(self) -> bool:
            return self.left > 0

        def round(self) -> None:
            self.threads.add(where())
            self.left -= 1
            if self.left == 0:
                self.idle.set()

    d = Driver(50)
    compute_thread.attach(d)
    assert on_compute_thread(pow, 2, 10) == 1024  # a job is served while the driver is busy
    assert d.idle.wait(10) and d.left == 0 and d.threads == {"promptlookup-compute"}
    d.left = 5
    compute_thread.wake()  # busy again: it gets its rounds
    assert on_compute_thread(lambda: True)
    for _ in range(1000):
        if d.left == 0:
            break
        on_compute_thread(lambda: None)
    assert d.left == 0
    compute_thread.detach(d)
    d.left = 3
    compute_thread.wake()
    assert on_compute_thread(lambda: True) and d.left == 3  # detached: no more rounds
