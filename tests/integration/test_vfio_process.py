"""VFIO passthrough through the real gRPC path: `dradriver run --passthrough` on a simulated H100 node whose sysfs
tree lives in the test's directory. The passthrough devices are published, a claim's prepare binds the GPU to
vfio-pci and hands out /dev/vfio, unprepare gives it back; a process killed at every step of prepare or unprepare
leaves the GPU on nvidia and nothing else behind once restarted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer
from support.fault_walk import killed_during

from dradriver.driver.prepare.transaction import CRASH_ENV
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from integration.test_run_process import TIMEOUT, DriverProcess, allocated_claim, our_slices

PROFILE = "hgx-h100-80gb"
GPU0 = "0000:1b:00.0"
VFIO = "gpu-0000-1b-00-0-vfio"
GROUP = 20  # the simulated node's IOMMU groups start there (sim/sysfs.py)


def start(
    root: Path, api: FakeApiServer, *extra: str, rescan_interval: str = "0", profile: str = PROFILE
) -> DriverProcess:
    """`dradriver run --passthrough` on the simulated node in ``root`` (its sysfs in ``root/host``); ``extra`` flags
    come last, so they override the ones before."""
    return DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--passthrough",
        "true",
        "--passthrough-host-root",
        str(root / "host"),
        "--rescan-interval",
        rescan_interval,
        *extra,
        profile=profile,
    )


def host(root: Path) -> HostPci:
    return HostPci(root / "host")  # read only: the tree as the driver left it


def vfio_devices(api: FakeApiServer) -> list[dict]:
    """The passthrough devices published, in a slice of their own."""
    devices = [d for s in our_slices(api) for d in s["spec"].get("devices", [])]
    return sorted((d for d in devices if d["attributes"]["type"] == {"string": "vfio"}), key=lambda d: d["name"])


def cdi_files(root: Path) -> list[Path]:
    return sorted((root / "cdi").glob("*.json")) if (root / "cdi").exists() else []


def assert_given_back(root: Path, where: str) -> None:
    pci = host(root)
    assert pci.function(GPU0).driver == "nvidia", where
    assert pci.driver_override(GPU0) is None, where
    assert not pci.vfio_group_node(GROUP).exists(), where
    assert cdi_files(root) == [], where


def test_passthrough_devices_are_published_and_a_claim_binds_the_gpu_to_vfio(root: Path, api: FakeApiServer) -> None:
    driver = start(root, api)
    try:
        driver.wait_ready()
        assert api.wait_until(lambda: len(vfio_devices(api)) == 8, TIMEOUT), driver.log
        vfio = vfio_devices(api)
        assert vfio[0]["name"] == VFIO
        assert vfio[0]["attributes"]["iommuGroup"] == {"int": GROUP}
        claim = allocated_claim(api, "vm", [VFIO])
        with KubeletClient(root / "registry").register() as plugin:
            result = plugin.prepare([claim])[claim.uid]
            assert result.error == "", driver.log
            assert host(root).function(GPU0).driver == "vfio-pci"
            assert host(root).vfio_group_node(GROUP).exists()
            [spec] = cdi_files(root)
            edits = json.loads(spec.read_text())["devices"][0]["containerEdits"]
            assert [n["path"] for n in edits["deviceNodes"]] == [f"/dev/vfio/{GROUP}", "/dev/vfio/vfio"]
            assert f"PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO={GPU0}" in edits["env"]
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert_given_back(root, "after unprepare")
    finally:
        driver.stop()


@pytest.mark.parametrize("point", ["prepare-started", "before:vfio-bind", "after:vfio-bind", "prepare-completing"])
def test_killed_at_any_step_of_prepare_then_restarted_gives_the_gpu_back(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    monkeypatch.setenv(CRASH_ENV, point)
    doomed = start(root, api)
    doomed.wait_ready()
    claim = allocated_claim(api, "crash", [VFIO])
    killed_during(
        doomed.proc, root / "registry", lambda plugin: plugin.prepare([claim], timeout=TIMEOUT), timeout=TIMEOUT
    )
    monkeypatch.delenv(CRASH_ENV)

    driver = start(root, api)
    try:
        driver.wait_ready()
        assert_given_back(root, f"killed at {point}")
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == "", driver.log  # the kubelet's retry succeeds
            assert host(root).function(GPU0).driver == "vfio-pci"
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert_given_back(root, "after the retried claim's unprepare")
    finally:
        driver.stop()


def test_killed_while_giving_the_gpu_back_the_next_unprepare_finishes(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = start(root, api)
    first.wait_ready()
    claim = allocated_claim(api, "back", [VFIO])
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid].error == "", first.log
    first.stop()
    monkeypatch.setenv(CRASH_ENV, "undone:vfio-bind")
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
        assert_given_back(root, "after the repeated unprepare")
    finally:
        driver.stop()


def test_a_gpu_on_vfio_is_not_reported_lost_by_health(root: Path, api: FakeApiServer) -> None:
    driver = start(root, api, rescan_interval="1")
    try:
        driver.wait_ready()
        claim = allocated_claim(api, "vm", [VFIO])
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == "", driver.log
            # The rescan that finds GPU 0 gone from NVML republishes without it (its passthrough device stays).
            assert api.wait_until(lambda: "republishing" in driver.log, TIMEOUT), driver.log
            assert "device unhealthy" not in driver.log
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert_given_back(root, "after unprepare")
    finally:
        driver.stop()


def whole_gpu_published(api: FakeApiServer) -> bool:
    return any(d["name"] == VFIO.removesuffix("-vfio") for s in our_slices(api) for d in s["spec"].get("devices", []))


def test_the_gpu_is_republished_as_it_moves_to_vfio_and_back_without_a_rescan_interval(
    root: Path, api: FakeApiServer
) -> None:
    driver = start(root, api)  # --rescan-interval 0: only the moves themselves ask for a rescan
    try:
        driver.wait_ready()
        assert api.wait_until(lambda: whole_gpu_published(api), TIMEOUT), driver.log
        claim = allocated_claim(api, "vm", [VFIO])
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == "", driver.log
            assert api.wait_until(lambda: not whole_gpu_published(api), TIMEOUT), driver.log
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert api.wait_until(lambda: whole_gpu_published(api), TIMEOUT), driver.log
        assert_given_back(root, "after unprepare")
    finally:
        driver.stop()


def published(api: FakeApiServer) -> dict[str, dict]:
    return {d["name"]: d for s in our_slices(api) for d in s["spec"].get("devices", [])}


def test_a_driver_restarted_while_a_vm_holds_the_gpu_keeps_it_passed_through_and_gives_it_back(
    root: Path, api: FakeApiServer
) -> None:
    first = start(root, api)
    first.wait_ready()
    assert api.wait_until(lambda: VFIO in published(api), TIMEOUT), first.log
    before = published(api)[VFIO]
    claim = allocated_claim(api, "vm", [VFIO])
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid].error == "", first.log
    first.stop()  # an upgrade or a crash: the VM keeps the GPU on vfio-pci meanwhile
    for stale in our_slices(api):  # so what is checked below is what the restarted driver publishes
        api.delete("resourceslices", stale["metadata"]["name"])

    driver = start(root, api)
    try:
        driver.wait_ready()
        assert host(root).function(GPU0).driver == "vfio-pci"  # start-up left the VM's GPU alone
        assert api.wait_until(lambda: VFIO in published(api), TIMEOUT), driver.log
        devices = published(api)
        # Published as before the restart (its UUID and memory remembered), the whole GPU withheld, nothing tainted.
        assert devices[VFIO]["attributes"] == before["attributes"], driver.log
        assert devices[VFIO].get("capacity") == before.get("capacity")
        assert not whole_gpu_published(api)
        assert not [n for n, d in devices.items() if d.get("taints")], driver.log
        # (The simulated NVML still counts the GPU and its adapter logs it unreadable; a real one does not count it.)
        assert "device unhealthy" not in driver.log and "gpu-lost" not in driver.log, driver.log
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == "", driver.log  # the kubelet asks again: the same
            assert plugin.unprepare([claim]) == {claim.uid: ""}, driver.log
        assert_given_back(root, "after the unprepare by the restarted driver")
        assert api.wait_until(lambda: whole_gpu_published(api), TIMEOUT), driver.log
        assert not [n for n, d in published(api).items() if d.get("taints")], driver.log
    finally:
        driver.stop()
