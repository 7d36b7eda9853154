"""NVSwitch partitions through the real gRPC path: `dradriver run --fabric-manager-partitions` on a simulated HGX H100
node whose Fabric Manager stand-in keeps its state beside the node's. The partition attributes are published, a
claim's prepare activates the partition of exactly its GPUs and unprepare deactivates it, a pair no partition equals
is refused; a process killed at every step of prepare or unprepare leaves no partition active once restarted."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer
from support.fault_walk import killed_during

from dradriver.driver.prepare.transaction import CRASH_ENV
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from integration.test_run_process import TIMEOUT, DriverProcess, allocated_claim, our_slices

PROFILE = "hgx-h100-80gb"
GPUS = [f"gpu-0000-{bus}-00-0" for bus in ("1b", "43", "52", "61", "9d", "c3", "d1", "df")]


def start(root: Path, api: FakeApiServer, *extra: str) -> DriverProcess:
    return DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--fabric-manager-partitions",
        "true",
        "--rescan-interval",
        "0",
        *extra,
        profile=PROFILE,
    )


def active(root: Path) -> list[int]:
    """The partitions the simulated Fabric Manager has active (its state file, as the driver left it)."""
    path = root / "sim.json.fabric-manager.json"
    return json.loads(path.read_text())["active"] if path.exists() else []


def test_partitions_are_published_and_a_claim_activates_exactly_its_own(root: Path, api: FakeApiServer) -> None:
    driver = start(root, api)
    try:
        driver.wait_ready()
        assert api.wait_until(lambda: bool(our_slices(api)), TIMEOUT), driver.log
        devices = {d["name"]: d["attributes"] for s in our_slices(api) for d in s["spec"]["devices"]}
        assert devices[GPUS[2]]["partition2"] == {"int": 4} and devices[GPUS[2]]["gpuModuleID"] == {"int": 3}
        pair = allocated_claim(api, "pair", GPUS[2:4])
        odd = allocated_claim(api, "odd", [GPUS[0], GPUS[7]])
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([pair])[pair.uid].error == "", driver.log
            assert active(root) == [4]
            error = plugin.prepare([odd])[odd.uid].error
            assert "form no Fabric Manager partition" in error and "partition 0 (GPUs 1,2,3,4,5,6,7,8)" in error
            assert active(root) == [4]
            assert plugin.unprepare([pair]) == {pair.uid: ""}
        assert active(root) == []
    finally:
        driver.stop()


@pytest.mark.parametrize("point", ["before:fabric-partition", "after:fabric-partition", "prepare-completing"])
def test_killed_at_any_step_of_prepare_then_restarted_leaves_no_partition_active(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    monkeypatch.setenv(CRASH_ENV, point)
    doomed = start(root, api)
    doomed.wait_ready()
    claim = allocated_claim(api, "crash", GPUS[:2])
    killed_during(
        doomed.proc, root / "registry", lambda plugin: plugin.prepare([claim], timeout=TIMEOUT), timeout=TIMEOUT
    )
    monkeypatch.delenv(CRASH_ENV)

    driver = start(root, api)
    try:
        driver.wait_ready()
        assert active(root) == [], f"killed at {point}"
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == "", driver.log  # the kubelet's retry succeeds
            assert active(root) == [3]
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert active(root) == []
    finally:
        driver.stop()


def test_killed_while_deactivating_the_next_unprepare_finishes(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = start(root, api)
    first.wait_ready()
    claim = allocated_claim(api, "back", GPUS[4:8])
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid].error == "", first.log
    assert active(root) == [2]
    first.stop()
    monkeypatch.setenv(CRASH_ENV, "undone:fabric-partition")
    doomed = start(root, api)
    doomed.wait_ready()
    killed_during(
        doomed.proc, root / "registry", lambda plugin: plugin.unprepare([claim], timeout=TIMEOUT), timeout=TIMEOUT
    )
    monkeypatch.delenv(CRASH_ENV)

    driver = start(root, api)
    try:
        driver.wait_ready()
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.unprepare([claim]) == {claim.uid: ""}, driver.log  # the kubelet sends it again
        assert active(root) == []
    finally:
        driver.stop()


def test_a_board_whose_nvml_module_id_fm_places_elsewhere_stops_the_driver_at_start(
    root: Path, api: FakeApiServer
) -> None:
    board = (files("dradriver.sim.data") / f"nodes/{PROFILE}.yaml").read_text()
    misreported = board.replace('"0000:43:00.0", numaNode: 0, pcieRoot: pci0000:3c}', '"0000:43:00.0", moduleId: 5}')
    assert misreported != board
    (root / "misreported.yaml").write_text(misreported)
    driver = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--fabric-manager-partitions",
        "true",
        profile=str(root / "misreported.yaml"),
    )
    assert driver.proc.wait(TIMEOUT) != 0
    driver.ready.wait(TIMEOUT)  # the log read to its end
    assert (
        "NVML reports the GPU at 0000:43:00.0 as module 5, but Fabric Manager reports module 2 there (and module 5 "
        "at 0000:9d:00.0)" in driver.log
    )
    assert not our_slices(api) and active(root) == []
