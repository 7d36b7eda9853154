"""A real `dradriver run --passthrough` process SIGKILLed right after every single sysfs write of a passthrough
claim's prepare and of its unprepare (``DRADRIVER_TEST_CRASH_AT=sysfs-written#<n>``; the unbind's write runs on a
thread of its own, and the kill takes the whole process there), then started again on the same sysfs tree,
checkpoint and CDI directory: the GPU is back on nvidia with no override and nothing else is left once the kubelet's
next calls come, and the same claim prepares again.

The writes are not listed here: an in-process driver on the same simulated node counts them first, so a write added
later is killed after too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer
from support.fault_walk import killed_during

from dradriver import faults
from dradriver.nvidia_install.pci_binding import SYSFS_WRITTEN
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, RegisteredPlugin
from integration.test_run_process import TIMEOUT, allocated_claim
from integration.test_vfio_process import GPU0, VFIO, assert_given_back, host, start
from tests.driver.prepare.test_state_mig import claim as sim_claim
from tests.driver.prepare.test_state_mig import ref as sim_ref
from tests.driver.prepare.test_state_vfio import VfioNode


def writes_of_a_clean_run(tmp_path: Path) -> tuple[int, int]:
    """How many sysfs writes a prepare, then an unprepare, of a claim on the first GPU's passthrough device make on
    the simulated node the process runs on (the same profile and tree)."""
    node = VfioNode(tmp_path)
    counts = {"prepare": 0, "unprepare": 0}
    phase = "prepare"

    def count(point: str) -> None:
        if point == SYSFS_WRITTEN:
            counts[phase] += 1

    faults.observer = count
    try:
        assert node.driver.prepare_resource_claims([sim_claim("vm", VFIO)])["vm"].error is None
        phase = "unprepare"
        assert node.driver.unprepare_resource_claims([sim_ref("vm")]) == {"vm": None}
    finally:
        faults.observer = None
        node.close()
    return counts["prepare"], counts["unprepare"]


def kubelet_call(phase: str, claim: Claim) -> Callable[[RegisteredPlugin], object]:
    """The kubelet's prepare or unprepare of ``claim``."""
    if phase == "prepare":
        return lambda plugin: plugin.prepare([claim], timeout=TIMEOUT)
    return lambda plugin: plugin.unprepare([claim], timeout=TIMEOUT)


@pytest.mark.parametrize("phase", ["prepare", "unprepare"])
def test_killed_after_every_sysfs_write_then_restarted_leaves_the_gpu_on_nvidia(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, phase: str
) -> None:
    preparing, unpreparing = writes_of_a_clean_run(tmp_path / "count")
    assert preparing >= 3 and unpreparing >= 3  # override, unbind and bind, each way
    for n in range(1, (preparing if phase == "prepare" else unpreparing) + 1):
        where = f"{phase} killed after sysfs write {n}"
        claim = allocated_claim(api, f"vm-{n}", [VFIO])
        if phase == "unprepare":
            first = start(root, api)
            first.wait_ready()
            with KubeletClient(root / "registry").register() as plugin:
                assert plugin.prepare([claim])[claim.uid].error == "", first.log
            first.stop()
        # A fresh process counts its writes from one: the n-th is the n-th of this call.
        monkeypatch.setenv(faults.CRASH_ENV, f"{SYSFS_WRITTEN}#{n}=kill")
        doomed = start(root, api)
        doomed.wait_ready()
        killed_during(doomed.proc, root / "registry", kubelet_call(phase, claim), timeout=TIMEOUT)
        monkeypatch.delenv(faults.CRASH_ENV)
        driver = start(root, api)
        try:
            driver.wait_ready()
            with KubeletClient(root / "registry").register() as plugin:
                if phase == "prepare":
                    assert_given_back(root, where)  # start-up rolled back the prepare the kill cut short
                else:
                    assert plugin.unprepare([claim]) == {claim.uid: ""}, driver.log  # the kubelet sends it again
                    assert_given_back(root, where)
                assert plugin.prepare([claim])[claim.uid].error == "", driver.log  # the same claim again
                assert host(root).function(GPU0).driver == "vfio-pci", where
                assert plugin.unprepare([claim]) == {claim.uid: ""}, driver.log
            assert_given_back(root, where)
        finally:
            driver.stop()
