"""CPU threads on a shared machine: the OpenMP wait policy as libgomp reads it, the load reading,
and the doctor's oversubscription line. Every input is injected: nothing here reads the real
machine's load."""

from __future__ import annotations

from promptlookup.backends import doctor
from promptlookup.backends.threads import (
    Load,
    busy_elsewhere,
    oversubscription,
    parse_loadavg,
    read_load,
    spin_count,
    wait_policy,
)


def test_spin_count_reads_the_environment_as_libgomp_does():
    assert spin_count({}) == 300_000
    assert spin_count({"OMP_WAIT_POLICY": "passive"}) == 0
    assert spin_count({"OMP_WAIT_POLICY": "ACTIVE"}) == 30_000_000_000
    assert spin_count({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}) == 10_000  # it wins
    assert spin_count({"GOMP_SPINCOUNT": "2k"}) == 2000
    assert spin_count({"GOMP_SPINCOUNT": " 3M "}) == 3_000_000
    assert spin_count({"GOMP_SPINCOUNT": "infinite"}) == 30_000_000_000
    assert spin_count({"GOMP_SPINCOUNT": "lots"}) == 300_000  # ignored, as libgomp ignores it
    assert spin_count({"GOMP_SPINCOUNT": "lots", "OMP_WAIT_POLICY": "passive"}) == 0


def test_wait_policy_describes_whose_setting_it_is():
    assert wait_policy({}) == ("libgomp's default (spin 300000)", 300_000)
    assert wait_policy({"GOMP_SPINCOUNT": "1000"}) == ("GOMP_SPINCOUNT=1000 (set in the environment)", 1000)
    assert wait_policy({"OMP_WAIT_POLICY": "passive"}) == (
        "OMP_WAIT_POLICY=passive (set in the environment)", 0)
    assert wait_policy({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}) == (
        "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000 (set in the environment)", 10_000)


def test_parse_loadavg():
    assert parse_loadavg("2.50 2.19 2.72 3/102 25393\n") == Load(2.5, 3)
    assert parse_loadavg("") is None
    assert parse_loadavg("x y z 1/2 3") is None
    assert parse_loadavg("1.0 1.0 1.0 nothing") is None


def test_read_load_from_a_file(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.96 2.00 2.72 3/104 25202\n")
    assert read_load(f) == Load(0.96, 3)
    assert read_load(tmp_path / "missing") is None


def test_busy_elsewhere_takes_the_smaller_of_average_and_now():
    assert busy_elsewhere(Load(2.5, 3)) == 2.0  # 2 others runnable now (3 less the reader)
    assert busy_elsewhere(Load(0.4, 3)) == 0.4  # a burst that just began
    assert busy_elsewhere(Load(3.0, 1)) == 0.0  # a burst that just ended
    assert busy_elsewhere(Load(0.0, 0)) == 0.0


def test_oversubscription_lines():
    assert oversubscription(None, 2, 2, {}) == "load: unknown (no /proc/loadavg)"
    assert oversubscription(Load(0.1, 1), 2, 2, {}) == (
        "load: 1-minute average 0.10, 0 other tasks runnable now, 2 cores available: "
        "not oversubscribed at -t 2")
    # half a core of slack: a load average is never exact
    assert oversubscription(Load(0.5, 2), 2, 2, {}).endswith("not oversubscribed at -t 2")
    assert oversubscription(Load(1.2, 2), 2, 1, {}).endswith("not oversubscribed at -t 1")
    assert oversubscription(Load(1.2, 2), 2, 2, {}) == (
        "load: 1-minute average 1.20, 1 other task runnable now, 2 cores available: OVERSUBSCRIBED "
        "(about 1.0 cores busy elsewhere + 2 llama.cpp threads); llama.cpp's threads spin 300000 times "
        "at each barrier (libgomp's default (spin 300000)), which collapses decoding beside busy "
        "processes: set GOMP_SPINCOUNT=1000 for this process, or use -t 1")
    assert oversubscription(Load(1.2, 2), 2, 2, {"GOMP_SPINCOUNT": "1000"}) == (
        "load: 1-minute average 1.20, 1 other task runnable now, 2 cores available: OVERSUBSCRIBED "
        "(about 1.0 cores busy elsewhere + 2 llama.cpp threads); llama.cpp's threads spin at most 1000 "
        "times at a barrier, so speed falls with the load rather than collapsing; fewer threads than "
        "cores decode faster beside busy processes, "
        "all of them prefill faster (docs/setup.md, a shared machine)")
    assert oversubscription(Load(3.0, 4), 2, 1, {"OMP_WAIT_POLICY": "PASSIVE"}) == (
        "load: 1-minute average 3.00, 3 other tasks runnable now, 2 cores available: OVERSUBSCRIBED "
        "(about 3.0 cores busy elsewhere + 1 llama.cpp thread); llama.cpp's threads sleep at once at a "
        "barrier, so speed falls with the load rather than collapsing")
    assert oversubscription(Load(2.0, 3), 1, 1, {"OMP_WAIT_POLICY": "ACTIVE"}) == (
        "load: 1-minute average 2.00, 2 other tasks runnable now, 1 core available: OVERSUBSCRIBED "
        "(about 2.0 cores busy elsewhere + 1 llama.cpp thread); llama.cpp's threads spin 30000000000 "
        "times at each barrier (OMP_WAIT_POLICY=ACTIVE (set in the environment)), which collapses "
        "decoding beside busy processes: unset it, or set GOMP_SPINCOUNT=1000, or use -t 1")


def test_the_doctor_prints_the_wait_policy_and_the_load():
    assert doctor.load_report(2, Load(1.2, 2), 2, {}).splitlines() == [
        "openmp wait: libgomp's default (spin 300000)",
        oversubscription(Load(1.2, 2), 2, 2, {}),
    ]
    assert doctor.load_report(1, Load(0.0, 1), 4, {"OMP_WAIT_POLICY": "ACTIVE"}).splitlines() == [
        "openmp wait: OMP_WAIT_POLICY=ACTIVE (set in the environment)",
        "load: 1-minute average 0.00, 0 other tasks runnable now, 4 cores available: "
        "not oversubscribed at -t 1",
    ]
