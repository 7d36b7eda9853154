"""Sharing at prepare on a simulated node: compute mode, time-slice and MPS daemons, applied and restored."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.cdi_schema import cdi_problems
from support.mps_daemons import may_mount

from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.sharing import CONFIG_FIELD, STEP_MPS_DAEMON, refuse_conflicts
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.errors import ClaimError
from dradriver.gpu.inventory import GpuDevice, MigMode, discover
from dradriver.gpu.models import ComputeMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef, DeviceConfig
from dradriver.sim import mps_standin
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from tests.driver.prepare.config_table import gpu, mig, nv_gpu, nv_mig

DRIVER = "gpu.dradriver.dev"
GPU0 = "gpu-0000-07-00-0"  # the first two GPUs of dgx-a100-40gb
GPU1 = "gpu-0000-0f-00-0"
STANDIN = mps_standin.command()


def claim(
    uid: str, *devices: str, config: list[dict[str, Any]] | None = None, requests: tuple[str, ...] = ()
) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef("default", f"claim-{uid}", uid),
        devices=tuple(AllocatedDevice(request=f"r{i}", pool="node-a", device=d) for i, d in enumerate(devices)),
        config=tuple(DeviceConfig("FromClaim", requests, c) for c in (config or [])),
    )


class Node:
    def __init__(self, tmp_path: Path, profile: str = "dgx-a100-40gb", mig_mode: MigMode = MigMode.NONE) -> None:
        self.sim = SimulatedNode(load_node_profile(profile), node_name="node-a")
        self.tmp_path = tmp_path
        self.mig_mode = mig_mode
        self.cdi_dir = tmp_path / "cdi"
        self.store: CheckpointStore | None = None
        self.mps = MpsControl(STANDIN, tmp_path / "mps")
        self.driver = self.restart()

    def restart(self) -> GpuDriver:
        if self.store is not None:
            self.store.close()
        gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(self.tmp_path / "state", boot_id="boot-1")
        self.mps = MpsControl(STANDIN, self.tmp_path / "mps")  # a new process knows none of the daemons
        self.driver = GpuDriver(
            GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=self.mig_mode),
            inventory=discover(gpulib),
            cdi=CdiWriter(self.cdi_dir),
            gpulib=gpulib,
            checkpoint=self.store,
            mps=self.mps,
        )
        return self.driver

    def prepare(self, c: AllocatedClaim) -> str | None:
        return self.driver.prepare_resource_claims([c])[c.uid].error

    def unprepare(self, uid: str) -> None:
        assert self.driver.unprepare_resource_claims([ClaimRef("default", f"claim-{uid}", uid)])[uid] is None

    def spec(self, uid: str) -> dict[str, Any]:
        return json.loads((self.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{uid}.json").read_text())

    def daemon(self, uid: str) -> dict[str, Any]:
        record = self.driver.checkpoint.get(uid)
        assert record is not None
        return next(a.params for a in record.actions if a.step == STEP_MPS_DAEMON)

    def mode(self, index: int = 0) -> ComputeMode:
        return ComputeMode(self.sim.gpus[index].compute_mode)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    yield node
    for record in node.driver.checkpoint.records():  # never leave a daemon behind
        node.driver.unprepare(ClaimRef(record.namespace, record.name, record.uid))


def status_sharing(node: Node, uid: str) -> dict[str, Any]:
    record = node.driver.checkpoint.get(uid)
    assert record is not None and record.devices[0].status_data is not None
    return record.devices[0].status_data["sharing"]


@pytest.mark.parametrize("mode", ["ExclusiveProcess", "Prohibited", "Default"])
def test_compute_mode_is_set_and_the_previous_restored(node: Node, mode: str) -> None:
    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED if mode == "Default" else ComputeMode.DEFAULT)
    before = node.mode()
    assert node.prepare(claim("a", GPU0, config=[gpu(computeMode=mode)])) is None
    assert (
        node.mode()
        is {
            "ExclusiveProcess": ComputeMode.EXCLUSIVE_PROCESS,
            "Prohibited": ComputeMode.PROHIBITED,
            "Default": ComputeMode.DEFAULT,
        }[mode]
    )
    node.unprepare("a")
    assert node.mode() is before


def test_a_claim_without_config_changes_nothing_and_reports_exclusive(node: Node) -> None:
    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED)
    assert node.prepare(claim("a", GPU0)) is None
    assert node.mode() is ComputeMode.PROHIBITED
    assert status_sharing(node, "a") == {"strategy": "Exclusive"}


@pytest.mark.parametrize(("interval", "value"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)])
def test_time_slicing_sets_the_interval_and_resets_it(node: Node, interval: str, value: int) -> None:
    node.sim.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS)
    config = gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}})
    assert node.prepare(claim("a", GPU0, config=[config])) is None
    assert node.sim.gpus[0].timeslice == value
    assert node.mode() is ComputeMode.DEFAULT  # time slices are shared between processes
    assert status_sharing(node, "a") == {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}
    node.unprepare("a")
    assert node.sim.gpus[0].timeslice == 0
    assert node.mode() is ComputeMode.EXCLUSIVE_PROCESS


MPS = gpu(
    sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"}}
)


def test_mps_starts_a_daemon_with_the_limits_and_mounts_its_directories(node: Node) -> None:
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    daemon = node.daemon("a")
    uuid = node.sim.gpus[0].uuid
    assert node.mps.alive(daemon)
    assert node.mps.query(daemon, "get_default_active_thread_percentage") == "50.0"
    assert node.mps.query(daemon, f"get_default_device_pinned_mem_limit {uuid}") == "8192M"
    assert node.mode() is ComputeMode.EXCLUSIVE_PROCESS
    edits = node.spec("a")["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps" in edits["env"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts == {
        "/tmp/nvidia-mps": daemon["pipeDir"],
        "/var/log/nvidia-mps": daemon["logDir"],
        "/dev/shm": daemon["shmDir"],  # the daemon's /dev/shm: its marker is there (as root, which may mount)
    }
    assert (Path(daemon["pipeDir"]) / "control").exists()
    if may_mount():
        assert Path(mps_standin.shm_marker(daemon["pid"], daemon["shmDir"])).exists()
    assert cdi_problems(node.spec("a")) == []
    node.unprepare("a")
    assert not node.mps.alive(daemon)
    assert not Path(daemon["pipeDir"]).exists() and not Path(daemon["shmDir"]).exists()
    assert node.mode() is ComputeMode.DEFAULT


def test_per_device_limits_by_index_and_uuid(node: Node) -> None:
    uuid1 = node.sim.gpus[1].uuid
    config = gpu(
        sharing={
            "strategy": "MPS",
            "mps": {
                "defaultPinnedDeviceMemoryLimit": "1Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "2Gi", uuid1: "3Gi"},
            },
        }
    )
    assert node.prepare(claim("a", GPU0, GPU1, config=[config])) is None
    daemon = node.daemon("a")
    assert node.mps.query(daemon, f"get_default_device_pinned_mem_limit {node.sim.gpus[0].uuid}") == "2048M"
    assert node.mps.query(daemon, f"get_default_device_pinned_mem_limit {uuid1}") == "3072M"


def test_a_per_device_key_that_names_no_device_is_refused(node: Node) -> None:
    config = gpu(sharing={"strategy": "MPS", "mps": {"defaultPerDevicePinnedMemoryLimit": {"5": "2Gi"}}})
    error = node.prepare(claim("a", GPU0, config=[config]))
    assert error is not None and "defaultPerDevicePinnedMemoryLimit names '5'" in error
    assert node.driver.checkpoint.records() == [] and node.mode() is ComputeMode.DEFAULT


def test_a_dead_daemon_is_restarted_with_its_limits(node: Node) -> None:
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    os.kill(first["pid"], signal.SIGKILL)
    node.mps._children[first["pid"]].wait(timeout=10)
    assert not node.mps.alive(first)
    node.driver.check_mps_daemons()
    second = node.daemon("a")
    assert second["pid"] != first["pid"] and node.mps.alive(second)
    assert node.mps.query(second, "get_default_active_thread_percentage") == "50.0"


def test_the_mps_check_racing_an_unprepare_never_brings_its_daemon_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The periodic check (rescan thread) fires just as an unprepare forgets the claim: it must wait for the
    # unprepare to finish and then find nothing, not restart the daemon the unprepare stopped.
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    store = node.driver.checkpoint
    forget = store.remove
    check = threading.Thread(target=node.driver.check_mps_daemons)

    def remove(uid: str) -> None:
        check.start()
        check.join(timeout=0.5)  # a window for the race: the check finishes here unless the GPU lock holds it
        forget(uid)

    monkeypatch.setattr(store, "remove", remove)
    node.unprepare("a")
    check.join(timeout=30)
    assert not check.is_alive()
    assert store.get("a") is None
    assert node.mps.claim_uids() == []  # no daemon without its claim


def test_a_daemon_outlives_a_driver_restart_and_is_re_adopted(node: Node) -> None:
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    before = dict(node.daemon("a"))
    node.restart()
    node.driver.reconcile()
    assert node.daemon("a")["pid"] == before["pid"]  # the same daemon, not a new one
    assert node.mps.alive(before)
    node.unprepare("a")
    assert not Path(before["pipeDir"]).exists()


def test_a_failed_daemon_start_leaves_nothing(node: Node, tmp_path: Path) -> None:
    node.mps.command = (str(tmp_path / "no-such-mps-control"),)
    error = node.prepare(claim("a", GPU0, config=[MPS]))
    assert error is not None and "cannot start the MPS control daemon" in error and "step mps-daemon" in error
    assert node.mode() is ComputeMode.DEFAULT and node.driver.checkpoint.records() == []


def test_mps_on_a_mig_device(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-80gb", MigMode.DYNAMIC)
    partition = next(d.name for d in node.driver._devices.values() if d.name.startswith("gpu-0000-1b-00-0-mig-1g"))
    assert (
        node.prepare(
            claim(
                "a", partition, config=[mig(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}})]
            )
        )
        is None
    )
    daemon = node.daemon("a")
    assert node.mps.query(daemon, "get_default_active_thread_percentage") == "25.0"
    record = node.driver.checkpoint.get("a")
    assert record is not None and record.devices[0].mig_uuid in daemon["deviceUUIDs"]
    node.unprepare("a")
    assert not node.mps.alive(daemon)


def test_time_slicing_on_a_mig_device_is_refused_with_the_reason(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-80gb", MigMode.DYNAMIC)
    partition = next(d.name for d in node.driver._devices.values() if "-mig-" in d.name)
    error = node.prepare(claim("a", partition, config=[mig(sharing={"strategy": "TimeSlicing"})]))
    assert error is not None and "time-slicing is not a MIG setting" in error


def test_nvidias_mps_config_with_multi_user_starts_a_multi_user_daemon(node: Node) -> None:
    config = nv_gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40, "multiUser": True}})
    assert node.prepare(claim("a", GPU0, config=[config])) is None
    daemon = node.daemon("a")
    assert daemon["multiUser"] is True
    assert b"-M" in Path(f"/proc/{daemon['pid']}/cmdline").read_bytes().split(b"\0")
    assert node.mps.query(daemon, "get_default_active_thread_percentage") == "40.0"
    node.unprepare("a")
    assert not node.mps.alive(daemon)


def test_nvidias_time_slicing_on_a_mig_device_prepares_and_sets_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-80gb", MigMode.DYNAMIC)
    partition = next(d.name for d in node.driver._devices.values() if "-mig-" in d.name)
    assert node.prepare(claim("a", partition, config=[nv_mig(sharing={"strategy": "TimeSlicing"})])) is None
    assert node.sim.gpus[0].timeslice == 0
    node.unprepare("a")


def test_a_malformed_config_fails_prepare_before_any_change(node: Node) -> None:
    error = node.prepare(claim("a", GPU0, config=[gpu(computeMode="Exclusive")]))
    assert error is not None
    assert "claim default/claim-a" in error and "computeMode: 'Exclusive' is not allowed" in error
    assert node.driver.checkpoint.records() == []


def test_conflicting_settings_on_a_shared_gpu_are_refused_naming_the_other_claim(node: Node) -> None:
    # Shares of one GPU always run MPS in the Default mode, so prepare cannot reach this today; the check guards
    # every path by which two claims hold one GPU (admin access, a scheduler race) with the checkpoint as record.
    first = gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    assert node.prepare(claim("a", GPU0, config=[first])) is None
    other = DeviceRecord(name=GPU0, requests=["r0"], gpu=GPU0, gpu_uuid=node.sim.gpus[0].uuid, kind="gpu")
    other.extra[CONFIG_FIELD] = gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})
    record = ClaimRecord(
        uid="b", namespace="default", name="claim-b", state=ClaimState.PREPARE_STARTED, devices=[other]
    )
    with pytest.raises(ClaimError, match=r"needs time-slice Short, but claim a \(default/claim-a\) already prepared"):
        refuse_conflicts("default/claim-b", record, node.driver.checkpoint.records())
    other.extra[CONFIG_FIELD] = gpu(computeMode="Prohibited")
    with pytest.raises(ClaimError, match=r"needs compute mode Prohibited, but claim a .* runs it with Default"):
        refuse_conflicts("default/claim-b", record, node.driver.checkpoint.records())


def test_two_claims_share_a_gpu_through_consumable_shares_each_with_its_mps_limits(tmp_path: Path) -> None:
    import yaml
    from support.sim_slices import published_slices

    from dradriver.allocator.allocator import allocate
    from dradriver.plugin.kubeletplugin.claims import allocated_claim

    root = Path(__file__).parents[3]
    classes = [
        d for p in (root / "manifests/deviceclasses").glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d
    ]
    slices = published_slices("dgx-a100-40gb", "none", node="node-a", gpu_sharing="consumable")
    node = Node(tmp_path)

    def share(name: str, memory: str, shares: str, allocated: list[dict[str, Any]]) -> dict[str, Any]:
        request = {
            "deviceClassName": "gpu.dradriver.dev",
            "capacity": {"requests": {"memory": memory, "shares": shares}},
        }
        obj: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        }
        obj["status"] = {
            "allocation": allocate(obj, slices=slices, classes=classes, node="node-a", allocated=allocated)
        }
        return obj

    first = share("a", "10Gi", "25", [])
    second = share("b", "20Gi", "50", [first])
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in (first, second)]
    assert results[0]["device"] == results[1]["device"]  # packed onto one GPU
    gpu_uuid = node.driver._devices[results[0]["device"]].uuid
    index = next(i for i, g in enumerate(node.sim.gpus) if g.uuid == gpu_uuid)
    node.sim.set_compute_mode(index, ComputeMode.PROHIBITED)
    for obj in (first, second):
        typed = allocated_claim(obj, ClaimRef("default", obj["metadata"]["name"], obj["metadata"]["uid"]), DRIVER)
        assert node.prepare(typed) is None
    uuid = node.sim.gpus[index].uuid
    for uid, percentage, limit in (("a", "25.0", "10240M"), ("b", "50.0", "20480M")):
        daemon = node.daemon(uid)
        assert node.mps.query(daemon, "get_default_active_thread_percentage") == percentage
        assert node.mps.query(daemon, f"get_default_device_pinned_mem_limit {uuid}") == limit
    assert node.mode(index) is ComputeMode.DEFAULT  # two MPS servers on one GPU need the Default mode
    node.unprepare("a")
    assert node.mps.alive(node.daemon("b"))
    assert node.mode(index) is ComputeMode.DEFAULT  # still in use by b
    node.unprepare("b")
    assert node.mode(index) is ComputeMode.PROHIBITED  # the last share out restores what the first one found


def nvidia_shares(tmp_path: Path, mode: str) -> tuple[Node, Any]:
    """A node run with ``--consumable-shares mode`` and a maker of claims allocated on its slices."""
    import yaml
    from support.sim_slices import published_slices

    from dradriver.allocator.allocator import allocate
    from dradriver.plugin.kubeletplugin.claims import allocated_claim

    root = Path(__file__).parents[3]
    classes = [
        d for p in (root / "manifests/deviceclasses").glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d
    ]
    slices = published_slices("dgx-a100-40gb", "none", node="node-a", consumable_shares=mode)
    node = Node(tmp_path)
    node.driver.consumable_shares = mode
    allocated: list[dict[str, Any]] = []

    def share(name: str, config: dict[str, Any] | None, capacity: dict[str, str] | None = None) -> AllocatedClaim:
        request: dict[str, Any] = {"deviceClassName": "gpu.dradriver.dev"}
        if capacity:
            request["capacity"] = {"requests": capacity}
        devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": request}]}
        if config is not None:
            devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
        obj: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"devices": devices},
        }
        obj["status"] = {
            "allocation": allocate(obj, slices=slices, classes=classes, node="node-a", allocated=allocated)
        }
        allocated.append(obj)
        return allocated_claim(obj, ClaimRef("default", name, name), DRIVER)

    return node, share


def test_consumable_shares_with_time_slicing_keep_the_slice_until_the_last_share_leaves(tmp_path: Path) -> None:
    node, share = nvidia_shares(tmp_path, "4")
    config = gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    first, second = share("a", config), share("b", config)
    assert first.devices[0].device == second.devices[0].device  # one share each of one GPU
    index = next(i for i, g in enumerate(node.sim.gpus) if g.uuid == node.driver._devices[first.devices[0].device].uuid)
    assert node.prepare(first) is None and node.prepare(second) is None
    assert node.sim.gpus[index].timeslice == 3
    node.unprepare("a")
    assert node.sim.gpus[index].timeslice == 3  # b still time-slices
    node.unprepare("b")
    assert node.sim.gpus[index].timeslice == 0


def test_consumable_shares_with_mps_take_their_part_of_the_shares_as_threads(tmp_path: Path) -> None:
    node, share = nvidia_shares(tmp_path, "4")
    claim = share("a", gpu(sharing={"strategy": "MPS"}), {"shares": "2"})
    assert node.prepare(claim) is None
    assert node.mps.query(node.daemon("a"), "get_default_active_thread_percentage") == "50.0"
    node.unprepare("a")


def test_consumable_shares_in_memory_mode_limit_mps_to_the_memory_taken(tmp_path: Path) -> None:
    node, share = nvidia_shares(tmp_path, "memory")
    claim = share("a", gpu(sharing={"strategy": "MPS"}), {"memory": "8Gi"})
    assert node.prepare(claim) is None
    uuid = node.driver._devices[claim.devices[0].device].uuid
    assert node.mps.query(node.daemon("a"), f"get_default_device_pinned_mem_limit {uuid}") == "8192M"
    node.unprepare("a")


def test_unlimited_shares_without_config_change_nothing(tmp_path: Path) -> None:
    node, share = nvidia_shares(tmp_path, "unlimited")
    claims = [share(name, None) for name in "abc"]
    assert len({c.devices[0].device for c in claims}) == 1  # oversubscribed: each takes no memory
    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED)
    for claim in claims:
        assert node.prepare(claim) is None
    assert all(status_sharing(node, uid) == {"strategy": "Exclusive"} for uid in "abc")
    for uid in "abc":
        node.unprepare(uid)


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the crash point runs, and the driver's memory is thrown away."""


@pytest.mark.parametrize(
    "point",
    [
        f"{when}:{step}"
        for step in ("compute-mode", "time-slice", "mps-daemon", "cdi-spec")
        for when in ("before", "after")
    ],
)
def test_a_crash_at_any_sharing_step_is_undone_at_start_up(
    node: Node, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    from dradriver import faults
    from dradriver.driver.prepare import transaction

    def crash() -> None:
        raise Crash(point)

    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED)
    config = (
        MPS
        if "time-slice" not in point
        else gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    )
    monkeypatch.setattr(faults, "die", crash)
    monkeypatch.setenv(transaction.CRASH_ENV, point)
    with pytest.raises(Crash):
        node.driver.prepare(claim("a", GPU0, config=[config]))
    monkeypatch.delenv(transaction.CRASH_ENV)
    pipe, _ = node.mps.dirs("a")
    node.restart()
    node.driver.reconcile()
    assert node.driver.checkpoint.records() == []
    assert node.mode() is ComputeMode.PROHIBITED and node.sim.gpus[0].timeslice == 0
    assert not pipe.exists()  # no daemon left serving
    assert node.prepare(claim("a", GPU0, config=[config])) is None


@pytest.mark.parametrize("step", ["mps-daemon", "compute-mode"])
def test_a_crash_in_the_middle_of_an_unprepare_is_finished_at_start_up(
    node: Node, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Killed after undoing the CDI spec and a hardware step of an MPS claim, the driver's start-up finishes the
    undo (the daemon is not restarted), a re-sent unprepare is a no-op success and a re-sent prepare prepares
    afresh. (Killed right after the spec's removal, the claim is kept: tests/driver/prepare/test_reconcile.py.)"""
    from dradriver import faults

    def crash() -> None:
        raise Crash(step)

    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED)
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    monkeypatch.setattr(faults, "die", crash)
    monkeypatch.setenv(faults.CRASH_ENV, f"undone:{step}=kill")
    with pytest.raises(Crash):
        node.driver.unprepare(ClaimRef("default", "claim-a", "a"))
    monkeypatch.delenv(faults.CRASH_ENV)
    node.restart()
    node.driver.reconcile(lambda _ref: True)  # the API server still has the claim: its pod is being torn down
    assert node.driver.checkpoint.records() == []
    assert not node.mps.alive(first) and not Path(first["pipeDir"]).exists()
    assert node.mode() is ComputeMode.PROHIBITED and not (node.cdi_dir / "k8s.gpu.dradriver.dev-claim_a.json").exists()
    node.unprepare("a")  # the kubelet's re-sent unprepare
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None  # a re-sent prepare: afresh, with a new daemon
    assert node.mps.alive(node.daemon("a")) and node.mode() is ComputeMode.EXCLUSIVE_PROCESS
    assert node.spec("a")["devices"][0]["containerEdits"]["mounts"]


def test_a_failed_unprepare_is_finished_before_a_re_sent_prepare(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    from dradriver import faults

    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    monkeypatch.setenv(faults.CRASH_ENV, "undone:mps-daemon=fail")
    error = node.driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")])["a"]
    assert error is not None and "injected failure at undone:mps-daemon" in error
    monkeypatch.delenv(faults.CRASH_ENV)
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    second = node.daemon("a")
    assert second["pid"] != first["pid"] and node.mps.alive(second)
    assert node.spec("a")["devices"][0]["containerEdits"]["mounts"]


def test_the_periodic_check_never_restarts_the_daemon_of_a_half_unprepared_claim(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dradriver import faults

    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    monkeypatch.setenv(faults.CRASH_ENV, "undone:mps-daemon=fail")
    error = node.driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")])["a"]
    assert error is not None
    monkeypatch.delenv(faults.CRASH_ENV)
    assert not node.mps.alive(first)  # stopped before the injected failure
    node.driver.check_mps_daemons()  # the kubelet's re-sent unprepare finishes the claim; no daemon meanwhile
    assert node.daemon("a")["pid"] == first["pid"] and not node.mps.alive(node.daemon("a"))
    assert node.driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")])["a"] is None
    assert node.driver.checkpoint.records() == []


def test_a_share_is_enforced_with_mps_limits_from_its_consumed_capacity() -> None:
    from dradriver.driver.prepare.config import decode_config
    from dradriver.driver.prepare.sharing import share_config

    plain = share_config("ns/c", "gpu-0", None, [("memory", "10Gi"), ("shares", "25")], True)
    assert plain is not None and plain["sharing"] == {
        "strategy": "MPS",
        "mps": {"defaultPinnedDeviceMemoryLimit": "10Gi", "defaultActiveThreadPercentage": 25},
    }
    # The claim's own smaller limits stay; larger ones are capped by the share.
    own = decode_config(
        gpu(
            sharing={
                "strategy": "MPS",
                "mps": {"defaultActiveThreadPercentage": 10, "defaultPinnedDeviceMemoryLimit": "40Gi"},
            }
        )
    )
    capped = share_config("ns/c", "gpu-0", own, [("memory", "10Gi"), ("shares", "25")], True)
    assert capped is not None and capped["sharing"]["mps"] == {
        "defaultActiveThreadPercentage": 10,
        "defaultPinnedDeviceMemoryLimit": "10Gi",
    }
    with pytest.raises(ClaimError, match="is a consumable share of a GPU, which is enforced with MPS"):
        share_config("ns/c", "gpu-0", decode_config(gpu(sharing={"strategy": "TimeSlicing"})), [], True)
    with pytest.raises(ClaimError, match=r"no TimeSlicing, no computeMode"):
        share_config("ns/c", "gpu-0", decode_config(gpu(computeMode="Prohibited")), [], True)


def test_sharing_steps_cost_no_checkpoint_write_of_their_own(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute modes, a time-slice and an MPS daemon are declared in the PrepareStarted record: a prepare writes
    the checkpoint twice (started, completed) and an unprepare once, whatever the number of steps."""
    real_fsync, writes = os.fsync, []

    def counting(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".tmp") and "/state/" in path:  # a checkpoint data write, not a directory's fsync
            writes.append(path)
        real_fsync(fd)

    slices = gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})
    c = replace(
        claim("a", GPU0, GPU1),
        config=(DeviceConfig("FromClaim", ("r0",), MPS), DeviceConfig("FromClaim", ("r1",), slices)),
    )
    monkeypatch.setattr(os, "fsync", counting)
    assert node.prepare(c) is None
    record = node.driver.checkpoint.get("a")
    assert record is not None
    assert sorted(a.step for a in record.actions) == [
        "cdi-spec",
        "compute-mode",
        "compute-mode",
        "mps-daemon",
        "time-slice",
    ]
    assert len(writes) == 2
    node.unprepare("a")
    assert len(writes) == 3
    assert node.mode(0) is ComputeMode.DEFAULT and node.sim.gpus[1].timeslice == 0


def test_a_daemon_restarted_while_the_checkpoint_cannot_be_written_is_still_stopped_by_unprepare(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.mps_daemons import daemon_processes

    from dradriver.errors import DeviceError

    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    os.kill(first["pid"], signal.SIGKILL)
    node.mps._children[first["pid"]].wait(timeout=10)

    def full(_record: ClaimRecord) -> None:
        raise DeviceError("writing the checkpoint: [Errno 28] No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(node.driver.checkpoint, "put", full)
        node.driver.check_mps_daemons()  # restarts it; the new pid cannot be recorded
    assert node.daemon("a")["pid"] == first["pid"]
    [(uid, second)] = daemon_processes(node.mps.root)
    assert uid == "a" and second != first["pid"]
    (Path(first["pipeDir"]) / mps_standin.SOCKET_NAME).unlink()  # it stops answering
    node.unprepare("a")
    assert daemon_processes(node.mps.root) == []  # the daemon its identity file names was killed


def test_a_control_command_that_cannot_run_never_kills_a_serving_daemon(node: Node, tmp_path: Path) -> None:
    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    daemon = dict(node.daemon("a"))
    command = node.mps.command
    node.mps.command = (str(tmp_path / "no-such-mps-control"),)  # e.g. a fork refused under memory pressure
    node.driver.check_mps_daemons()  # cannot tell whether the daemon answers: it is left alone
    node.mps.command = command
    assert node.daemon("a")["pid"] == daemon["pid"] and node.mps.alive(daemon)


def test_a_daemon_restarted_while_an_unprepare_waits_for_the_gpu_is_what_a_failed_rollback_records(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic check restarts a dead daemon between an unprepare's first read of the claim and its taking the
    GPU's lock: the rollback works from the record as it is then, so when it fails the checkpoint keeps naming the
    daemon that runs, and the re-sent unprepare stops it."""
    from support.mps_daemons import daemon_processes

    from dradriver import faults

    assert node.prepare(claim("a", GPU0, config=[MPS])) is None
    first = dict(node.daemon("a"))
    os.kill(first["pid"], signal.SIGKILL)
    node.mps._children[first["pid"]].wait(timeout=10)
    store = node.driver.checkpoint
    real_get, restarted, armed = store.get, list[int](), [True]

    def get_then_restart(uid: str) -> ClaimRecord | None:
        record = real_get(uid)
        if not armed:
            return record
        armed.clear()  # the unprepare's read, then the periodic check before it takes the locks
        node.driver.check_mps_daemons()
        restarted.append(node.daemon(uid)["pid"])
        return record

    with monkeypatch.context() as patch:
        patch.setattr(store, "get", get_then_restart)
        patch.setenv(faults.CRASH_ENV, "undone:mps-daemon=fail")
        assert node.driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")])["a"] is not None
    [second] = restarted
    assert second != first["pid"]
    assert node.daemon("a")["pid"] == second  # not the dead daemon's pid written back
    node.unprepare("a")
    assert daemon_processes(node.mps.root) == [] and node.driver.checkpoint.records() == []


def test_mps_multi_user_on_a_gpu_before_volta_is_refused_with_the_reason(node: Node) -> None:
    device = node.driver._devices[GPU0]
    assert isinstance(device, GpuDevice)
    node.driver._devices[GPU0] = replace(device, info=replace(device.info, cuda_compute_capability=(6, 1)))
    config = nv_gpu(sharing={"strategy": "MPS", "mpsConfig": {"multiUser": True}})
    error = node.prepare(claim("a", GPU0, config=[config]))
    assert error is not None and "needs a Volta or newer GPU (compute capability 7.0)" in error
    assert node.prepare(claim("b", GPU0, config=[nv_gpu(sharing={"strategy": "MPS"})])) is None
    node.unprepare("b")
