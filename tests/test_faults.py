"""The test hook's entries (faults.py): a point by name fires at every pass, ``<point>#<n>`` only at its n-th pass in
the process, each point counted apart."""

from __future__ import annotations

import pytest

from dradriver import faults


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_passes", {})  # as a new process starts


def test_a_numbered_entry_fires_at_that_pass_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.CRASH_ENV, "sysfs-written#3=fail")
    faults.fault_point("sysfs-written")
    faults.fault_point("other")  # counted apart
    faults.fault_point("sysfs-written")
    with pytest.raises(faults.InjectedFault, match="injected failure at sysfs-written"):
        faults.fault_point("sysfs-written")
    faults.fault_point("sysfs-written")  # the fourth pass: nothing


def test_an_entry_without_a_number_fires_at_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.CRASH_ENV, "before:vfio-bind=fail")
    for _ in range(2):
        with pytest.raises(faults.InjectedFault):
            faults.fault_point("before:vfio-bind")


def test_a_numbered_kill_kills_at_that_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []
    monkeypatch.setattr(faults, "die", lambda: killed.append(1))
    monkeypatch.setenv(faults.CRASH_ENV, "sysfs-written#2=kill")
    faults.fault_point("sysfs-written")
    assert killed == []
    faults.fault_point("sysfs-written")
    assert killed == [1]
