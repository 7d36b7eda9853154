"""Device health end to end: `dradriver run` as a process on a simulated node, faults raised with `dradriver sim`,
and what the kubelet (health stream, prepare), the scheduler (slice taints) and an admin (`inventory`) see."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.apiserver import FakeApiServer

from dradriver.cli.main import main
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient

from .test_run_process import DRIVER, NODE, TIMEOUT, DriverProcess, allocated_claim, eventually, our_slices

PROFILE = "dgx-a100-40gb"
GPU = {i: f"gpu-0000-{bus}-00-0" for i, bus in enumerate(["07", "0f", "47", "4e", "87", "90", "b7", "bd"])}
BUS = {i: f"0000:{bus}:00.0" for i, bus in enumerate(["07", "0f", "47", "4e", "87", "90", "b7", "bd"])}
UNHEALTHY, HEALTHY = 2, 1


class HealthWatch:
    """The kubelet's side of the health stream, read on a thread: the latest status of every device."""

    def __init__(self, registry: Path) -> None:
        self._registration = KubeletClient(registry).register()
        plugin = self._registration.__enter__()
        self._stream = plugin.watch_health(timeout=300)
        self.plugin = plugin
        self.latest: dict[str, tuple[int, str]] = {}
        self.history: list[dict[str, int]] = []  # every update: device → status
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for update in self._stream:
                self.latest = {d.device.device_name: (d.health, d.message) for d in update.devices}
                self.history.append({name: status for name, (status, _) in self.latest.items()})
        except grpc.RpcError:
            pass

    def status(self, device: str) -> int | None:
        entry = self.latest.get(device)
        return entry[0] if entry else None

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(TIMEOUT)
        self._registration.__exit__(None, None, None)


def start(root: Path, api: FakeApiServer, *extra: str) -> DriverProcess:
    process = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"), "--rescan-interval", "0", *extra)
    process.wait_ready()
    return process


def sim(root: Path, *args: str) -> None:
    command = ["sim", "--sim-profile", PROFILE, "--node-name", NODE, "--sim-state", str(root / "sim.json"), *args]
    assert main(command) == 0


def inventory(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    capsys.readouterr()
    command = ["inventory", "--gpu-backend", "sim", "--sim-profile", PROFILE, "--node-name", NODE]
    command += ["--sim-state", str(root / "sim.json"), "--plugin-dir", str(root / "plugin"), *extra]
    assert main(command) == 0
    out = capsys.readouterr().out
    return json.loads(out) if "-o" in extra else out


def published(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in our_slices(api) for d in s["spec"].get("devices", [])}


def all_taints(api: FakeApiServer) -> dict[str, list[tuple[str, str, str]]]:
    """Every published device's taints as (key, value, effect)."""
    return {
        name: [(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints", [])]
        for name, device in published(api).items()
    }


def taints(api: FakeApiServer, device: str) -> list[tuple[str, str, str]] | None:
    return all_taints(api).get(device)


class Node:
    """A running driver with the kubelet's health stream open, on a simulated node and the API stand-in."""

    def __init__(self, root: Path, api: FakeApiServer, driver: DriverProcess, watch: HealthWatch) -> None:
        self.root, self.api, self.driver, self.watch = root, api, driver, watch

    def prepare_error(self, name: str, device: str) -> str:
        claim = allocated_claim(self.api, name, [device])
        return str(self.watch.plugin.prepare([claim])[claim.uid].error)


def _fatal_xid(node: Node) -> None:
    """A critical XID (62, a micro-controller halt): unhealthy, tainted NoSchedule with the XID, refused at
    prepare."""
    sim(node.root, "xid", BUS[1], "62")
    assert eventually(lambda: node.watch.status(GPU[1]) == UNHEALTHY), node.driver.log
    assert "XID 62" in node.watch.latest[GPU[1]][1]
    assert eventually(lambda: taints(node.api, GPU[1]) == [(f"{DRIVER}/xid", "62", "NoSchedule")]), node.driver.log
    assert published(node.api)[GPU[1]]["taints"][0]["timeAdded"].endswith("Z")
    error = node.prepare_error("on-xid", GPU[1])
    assert "is unhealthy: XID 62" in error and "since 20" in error


def _application_xid(node: Node) -> None:
    """An application XID: informational taint only; the device is still healthy and still given out."""
    sim(node.root, "xid", BUS[2], "31")
    assert eventually(lambda: taints(node.api, GPU[2]) == [(f"{DRIVER}/xid", "31", "None")]), node.driver.log
    assert node.watch.status(GPU[2]) == HEALTHY
    assert node.prepare_error("on-app-xid", GPU[2]) == ""


def _ecc_burst(node: Node) -> None:
    """A burst of double-bit ECC errors: the count is the taint's value."""
    sim(node.root, "ecc", BUS[3], "--count", "5")
    assert eventually(lambda: taints(node.api, GPU[3]) == [(f"{DRIVER}/ecc", "5", "NoSchedule")]), node.driver.log
    assert node.watch.status(GPU[3]) == UNHEALTHY
    assert "double-bit ECC" in node.prepare_error("on-ecc", GPU[3])


def _lost_gpu(node: Node) -> None:
    """A lost GPU: withdrawn from the slice, still unhealthy in the stream, the other GPUs keep serving."""
    sim(node.root, "lose", BUS[4])
    assert eventually(lambda: GPU[4] not in published(node.api) and len(published(node.api)) == 7), node.driver.log
    assert eventually(lambda: node.watch.status(GPU[4]) == UNHEALTHY), node.driver.log
    assert "fell off the bus" in node.prepare_error("on-lost", GPU[4])
    assert node.prepare_error("elsewhere", GPU[5]) == ""


def _inventory_shows_it(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    document = inventory(node.root, capsys, "-o", "json")
    health = document["deviceHealth"]
    assert health[GPU[1]]["status"] == "UNHEALTHY"
    assert health[GPU[1]]["taints"][0]["value"] == "62"
    assert health[GPU[2]]["status"] == "HEALTHY"
    assert [t["effect"] for t in health[GPU[2]]["taints"]] == ["None"]
    assert health[GPU[3]]["taints"][0]["key"] == f"{DRIVER}/ecc"
    assert [g["name"] for g in document["lostGpus"]] == [GPU[4]]
    assert health[GPU[4]]["status"] == "UNHEALTHY"
    table = inventory(node.root, capsys)
    assert "HEALTH" in table and "TAINTS" in table
    row = next(line for line in table.splitlines() if line.startswith(GPU[1]))
    assert "unhealthy" in row and "xid=62:NoSchedule" in row
    assert any(line.startswith(GPU[4]) and "lost" in line for line in table.splitlines())


def _resets_recover(node: Node) -> None:
    """The ECC GPU, the lost one, one with an XID that leaves no ECC trace (119, GSP timeout: NVML's recovery
    action asks for a reset) and one with XID 79 (fallen off the bus, as on hardware: withdrawn until its reset)
    are healthy again within 30 s of their reset, the lost ones under their names."""
    sim(node.root, "xid", BUS[6], "119")
    sim(node.root, "xid", BUS[7], "79")
    assert eventually(lambda: node.watch.status(GPU[6]) == UNHEALTHY), node.driver.log
    assert eventually(lambda: node.watch.status(GPU[7]) == UNHEALTHY), node.driver.log
    assert eventually(lambda: GPU[7] not in published(node.api)), node.driver.log
    assert "fell off the bus" in node.prepare_error("on-xid-79", GPU[7])
    for i in (3, 4, 6, 7):
        sim(node.root, "reset", BUS[i])
    reset_at = time.monotonic()
    assert eventually(
        lambda: (
            all(node.watch.status(GPU[i]) == HEALTHY for i in (3, 4, 6, 7))
            and all(taints(node.api, GPU[i]) == [] for i in (3, 4, 6, 7))
        ),
        timeout=30,
    ), node.driver.log
    assert time.monotonic() - reset_at < 30
    assert node.prepare_error("after-reset", GPU[4]) == ""
    assert node.prepare_error("after-xid-79-reset", GPU[7]) == ""
    # The XID without a reset or a quiet period stays.
    assert taints(node.api, GPU[1]) == [(f"{DRIVER}/xid", "62", "NoSchedule")]
    assert "device unhealthy" in node.driver.log and "cause=ecc" in node.driver.log


def test_each_fault_reaches_the_stream_the_slice_inventory_and_prepare_and_a_reset_recovers(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        driver = start(root, api, "--health-recovery-period", "0")
        watch = HealthWatch(root / "registry")
        node = Node(root, api, driver, watch)
        try:
            assert eventually(lambda: watch.status(GPU[1]) == HEALTHY and len(published(api)) == 8), driver.log
            _fatal_xid(node)
            _application_xid(node)
            _ecc_burst(node)
            _lost_gpu(node)
            _inventory_shows_it(node, capsys)
            _resets_recover(node)
        finally:
            watch.close()
            driver.stop(signal.SIGKILL)


def test_conditions_clear_after_the_quiet_period_and_mig_partitions_follow_their_parent(root: Path) -> None:
    with FakeApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        driver = start(root, api, "--health-recovery-period", "10", "--mig-mode", "dynamic")
        watch = HealthWatch(root / "registry")
        try:
            assert eventually(lambda: any(n.startswith(f"{GPU[1]}-mig-") for n in published(api))), driver.log
            partitions = [n for n in published(api) if n.startswith(f"{GPU[1]}-mig-")]

            sim(root, "xid", BUS[1], "94")
            family = [GPU[1], *partitions]
            xid = [(f"{DRIVER}/xid", "94", "NoSchedule")]
            assert eventually(lambda: all(all_taints(api)[n] == xid for n in family)), driver.log
            assert eventually(lambda: any(all(u.get(n) == UNHEALTHY for n in family) for u in watch.history)), (
                driver.log
            )
            assert taints(api, GPU[2]) == [] and watch.status(GPU[2]) == HEALTHY
            # Ten quiet seconds later, the condition is gone.
            assert eventually(lambda: all(all_taints(api)[n] == [] for n in family)), driver.log
            assert eventually(lambda: all(watch.status(n) == HEALTHY for n in family)), driver.log

            # NVML reports a lost GPU but cannot say which: every device is tainted until the quiet period ends.
            sim(root, "lose", BUS[6], "--unattributable")
            attempts = iter(range(1000))

            def refused() -> bool:
                claim = allocated_claim(api, f"anywhere-{next(attempts)}", [GPU[2]])
                return "NVML cannot say which" in watch.plugin.prepare([claim])[claim.uid].error

            assert eventually(refused), driver.log
            lost = [(f"{DRIVER}/gpu-lost", "unattributed", "NoSchedule")]
            assert eventually(lambda: all(t == lost for t in all_taints(api).values())), driver.log
            assert eventually(lambda: any(set(u.values()) == {UNHEALTHY} for u in watch.history)), driver.log
            assert eventually(lambda: all(t == [] for t in all_taints(api).values())), driver.log
            assert eventually(lambda: {s for s, _ in watch.latest.values()} == {HEALTHY}), driver.log
        finally:
            watch.close()
            driver.stop(signal.SIGKILL)


def test_where_the_api_server_drops_taints_unhealthy_devices_are_withdrawn(root: Path) -> None:
    with FakeApiServer(drop_device_taints=True) as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        driver = start(root, api, "--health-recovery-period", "0")
        try:
            assert eventually(lambda: len(published(api)) == 8), driver.log
            sim(root, "xid", BUS[1], "79")
            assert eventually(lambda: GPU[1] not in published(api)), driver.log
            assert len(published(api)) == 7
            assert all("taints" not in d for d in published(api).values())
            sim(root, "xid", BUS[2], "48")
            assert eventually(lambda: GPU[2] not in published(api)), driver.log
            assert driver.log.count("dropped devices[].taints") == 1
        finally:
            driver.stop(signal.SIGKILL)


def test_a_gpu_lost_before_the_driver_starts_does_not_take_the_node_down(root: Path) -> None:
    sim(root, "lose", BUS[2])
    with FakeApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        driver = start(root, api)
        try:
            assert eventually(lambda: len(published(api)) == 7), driver.log
            assert GPU[2] not in published(api)
            assert "GPU skipped" in driver.log
            sim(root, "reset", BUS[2])
            # Read again at the next probe (no rescan is configured), and offered under its name.
            assert eventually(lambda: GPU[2] in published(api) and len(published(api)) == 8), driver.log
        finally:
            driver.stop(signal.SIGKILL)
