"""CPU threads on a shared machine: the OpenMP wait-policy default, the load reading, and the doctor's
oversubscription line. Every input is injected: nothing here reads the real machine's load."""

from __future__ import annotations

from promptlookup.backends import doctor
from promptlookup.backends.threads import (
    Load,
    apply_openmp_defaults,
    busy_elsewhere,
    openmp_defaults,
    oversubscription,
    parse_loadavg,
    read_load,
    wait_policy,
)


def test_passive_waiting_is_the_default_and_a_users_choice_wins():
    assert openmp_defaults({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert openmp_defaults({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert openmp_defaults({"GOMP_SPINCOUNT": "300000"}) == {}  # a spin count alone is a choice too
    assert openmp_defaults({"OMP_NUM_THREADS": "4"}) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_apply_sets_only_what_the_user_left_unset():
    env = {"PATH": "/bin"}
    assert apply_openmp_defaults(env) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "active"}
    assert apply_openmp_defaults(mine) == {}
    assert mine == {"OMP_WAIT_POLICY": "active"}


def test_wait_policy_reads_libgomps_precedence():
    assert wait_policy({}) == ("OMP_WAIT_POLICY=PASSIVE (promptlookup's default)", True)
    assert wait_policy({"OMP_WAIT_POLICY": "passive"}) == ("OMP_WAIT_POLICY=passive (set in the environment)",
                                                           True)
    assert wait_policy({"OMP_WAIT_POLICY": "ACTIVE"}) == ("OMP_WAIT_POLICY=ACTIVE (set in the environment)",
                                                          False)
    # GOMP_SPINCOUNT decides the spinning whatever the policy says
    assert wait_policy({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}) == (
        "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000 (set in the environment)", False)
    assert wait_policy({"GOMP_SPINCOUNT": "0"}) == ("GOMP_SPINCOUNT=0 (set in the environment)", True)


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
        "(about 1.0 cores busy elsewhere + 2 llama.cpp threads); llama.cpp's threads wait passively, "
        "so speed falls about in proportion to the load; -t 2 takes the largest share of the cores "
        "(docs/setup.md, a shared machine)")
    assert oversubscription(Load(2.0, 3), 1, 1, {"GOMP_SPINCOUNT": "300000"}) == (
        "load: 1-minute average 2.00, 2 other tasks runnable now, 1 core available: OVERSUBSCRIBED "
        "(about 2.0 cores busy elsewhere + 1 llama.cpp thread); llama.cpp's threads spin at their "
        "barriers (GOMP_SPINCOUNT=300000 (set in the environment)), which collapses decoding beside "
        "busy processes: unset it or set OMP_WAIT_POLICY=PASSIVE, or use -t 1")


def test_the_doctor_prints_the_wait_policy_and_the_load():
    assert doctor.load_report(2, Load(1.2, 2), 2, {}).splitlines() == [
        "openmp wait: OMP_WAIT_POLICY=PASSIVE (promptlookup's default)",
        oversubscription(Load(1.2, 2), 2, 2, {}),
    ]
    assert doctor.load_report(1, Load(0.0, 1), 4, {"OMP_WAIT_POLICY": "ACTIVE"}).splitlines() == [
        "openmp wait: OMP_WAIT_POLICY=ACTIVE (set in the environment)",
        "load: 1-minute average 0.00, 0 other tasks runnable now, 4 cores available: "
        "not oversubscribed at -t 1",
    ]
