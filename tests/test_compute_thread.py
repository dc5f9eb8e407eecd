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
