"""Claim helpers: request-name reduction, reference checks and per-UID locking."""

from __future__ import annotations

import threading

import pytest

from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import ClaimLocks, base_request_name, ref_problem


def test_base_request_name_drops_the_subrequest() -> None:
    assert base_request_name("gpu/large") == "gpu"
    assert base_request_name("gpu") == "gpu"


def _hold_in_thread(
    locks: ClaimLocks, uids: list[str], entered: threading.Event, release: threading.Event
) -> threading.Thread:
    def run() -> None:
        with locks.hold(uids):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_disjoint_uid_sets_are_held_at_the_same_time() -> None:
    locks = ClaimLocks()
    first_in, release = threading.Event(), threading.Event()
    first = _hold_in_thread(locks, ["a", "b"], first_in, release)
    assert first_in.wait(10)
    with locks.hold(["c"]):
        pass  # would block forever if "c" were serialised with the first holder
    release.set()
    first.join(10)


def test_overlapping_uid_sets_wait_for_each_other() -> None:
    locks = ClaimLocks()
    first_in, first_release = threading.Event(), threading.Event()
    second_in, second_release = threading.Event(), threading.Event()
    first = _hold_in_thread(locks, ["a", "b"], first_in, first_release)
    assert first_in.wait(10)
    second = _hold_in_thread(locks, ["b", "c"], second_in, second_release)
    assert locks.wait_until_waiting("b", 1, timeout=10)
    assert not second_in.is_set()
    first_release.set()
    assert second_in.wait(10)
    assert locks.waiting("b") == 0
    second_release.set()
    first.join(10)
    second.join(10)


def test_a_checked_claim_becomes_a_typed_view_of_this_drivers_devices_and_configs() -> None:
    from dradriver.plugin.handler import AllocatedDevice, ClaimRef, DeviceConfig
    from dradriver.plugin.kubeletplugin.claims import allocated_claim, claim_problem

    ref = ClaimRef("ns", "c", "u1")
    raw = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a/x", "driver": "d", "pool": "p", "device": "g0", "adminAccess": True},
                        {"request": "b", "driver": "d", "pool": "p", "device": "g1", "shareID": "s-1"},
                        {"request": "n", "driver": "nic", "pool": "p", "device": "eth0"},
                    ],
                    "config": [
                        {"source": "FromClass", "opaque": {"driver": "d", "parameters": {"kind": "GpuConfig"}}},
                        {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "nic", "parameters": {}}},
                        {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "d", "parameters": {"x": 1}}},
                    ],
                }
            }
        },
    }
    assert claim_problem(raw, ref, "d") is None
    view = allocated_claim(raw, ref, "d")
    assert view.ref == ref and view.uid == "u1"
    assert view.devices == (
        AllocatedDevice(request="a/x", pool="p", device="g0", admin_access=True),
        AllocatedDevice(request="b", pool="p", device="g1", share_id="s-1"),
    )
    assert view.config == (
        DeviceConfig(source="FromClass", requests=(), parameters={"kind": "GpuConfig"}),
        DeviceConfig(source="FromClaim", requests=("b",), parameters={"x": 1}),
    )


@pytest.mark.parametrize("uid", ["..", ".", "a/b", "../../etc", "a\x00b", "x" * 254, "ü"])
def test_a_uid_that_could_name_a_path_is_refused(uid: str) -> None:
    problem = ref_problem(ClaimRef("default", "c", uid))
    assert problem is not None and "is not a Kubernetes UID" in problem


def test_a_kubernetes_uid_is_accepted() -> None:
    assert ref_problem(ClaimRef("default", "c", "0b6ae0f6-6f43-4b8f-9a0b-62d0c8c6b1f4")) is None
