"""VFIO passthrough through the driver's recipe (``GpuDriver`` with ``passthrough``) on a simulated node with its
sysfs: prepare, unprepare, the refusals, and a kill at every point of prepare and unprepare that start-up
reconciliation repairs, as the MIG fault walk does."""

from __future__ import annotations

import errno
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support import fault_walk
from support.fault_walk import crash_at

from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.driver.prepare.vfio import Passthrough, PassthroughCatalog, PassthroughSteps, nvml_holders, nvml_sees
from dradriver.gpu.errors import GpuIsLost
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.pci_binding import HostPci, SysfsWriter
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.sim.sysfs import (
    FIRST_GROUP,
    add_dri_nodes,
    end_process,
    gpu_functions,
    hold_open,
    open_device_node,
    set_sriov_numvfs,
    write_gpu_information,
    write_tree,
)
from tests.driver.prepare.test_state_mig import DRIVER, claim, ref

GPU0 = "0000:1b:00.0"
WHOLE = "gpu-0000-1b-00-0"
VFIO = "gpu-0000-1b-00-0-vfio"


class VfioNode:
    """A simulated H100 node with its sysfs; ``restart()`` builds a new driver on the same hardware and files."""

    def __init__(self, tmp_path: Path) -> None:
        self.sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
        self.root = tmp_path / "host"
        self.kernel = self.sim.attach_sysfs(self.root)
        self.pci = HostPci(self.root, self.kernel)
        self.cdi_dir = tmp_path / "cdi"
        self.state_dir = tmp_path / "state"
        self.store: CheckpointStore | None = None
        self.gpulib: GpuLib | None = None
        self.driver = self.restart()

    def restart(self) -> GpuDriver:
        if self.store is not None:
            self.store.close()
        if self.gpulib is not None:
            self.gpulib.close()  # the old process's NVML session ends with it
        self.gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(self.state_dir, boot_id="boot-1")
        steps = PassthroughSteps(
            self.pci,
            nvml_sees=nvml_sees(self.gpulib),
            holders=nvml_holders(self.gpulib),
            return_timeout_s=5,
            release=self.gpulib.released,
        )
        self.driver = GpuDriver(
            GpuDriverOptions(
                driver_name=DRIVER,
                pool="node-a",
                mig_mode=MigMode.DYNAMIC,
                features=NodeFeatures(passthrough=Passthrough(PassthroughCatalog(self.pci), steps)),
            ),
            inventory=discover(self.gpulib),
            cdi=CdiWriter(self.cdi_dir),
            gpulib=self.gpulib,
            checkpoint=self.store,
        )
        return self.driver

    def close(self) -> None:
        assert self.store is not None
        self.store.close()

    def assert_as_found(self, where: str = "") -> None:
        assert self.pci.function(GPU0).driver == "nvidia", where
        assert self.pci.driver_override(GPU0) is None, where
        assert not self.pci.vfio_group_node(FIRST_GROUP).exists(), where
        self.gpulib.probe(self.sim.gpus[0].uuid)  # NVML answers for it again
        assert list(self.cdi_dir.glob("*.json")) == [], where
        assert self.driver.checkpoint.records() == [], where


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = VfioNode(tmp_path)
    yield n
    n.close()


def test_a_passthrough_claim_gets_the_vfio_group_and_the_pci_address(node: VfioNode) -> None:
    result = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"]
    assert result.error is None
    [device] = result.devices
    assert device.device == VFIO
    assert device.metadata is not None and device.metadata["type"] == {"string": "vfio"}
    assert device.metadata["resource.kubernetes.io/pciBusID"] == {"string": GPU0}
    spec = json.loads(next(node.cdi_dir.glob("*.json")).read_text())
    [cdi_device] = spec["devices"]
    edits = cdi_device["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [f"/dev/vfio/{FIRST_GROUP}", "/dev/vfio/vfio"]
    assert f"PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO={GPU0}" in edits["env"]
    assert node.pci.function(GPU0).driver == "vfio-pci"
    with pytest.raises(GpuIsLost):
        node.gpulib.probe(node.sim.gpus[0].uuid)
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}
    node.assert_as_found()


def test_the_whole_gpu_and_its_passthrough_device_exclude_each_other(node: VfioNode) -> None:
    assert node.driver.prepare_resource_claims([claim("pod", f"{WHOLE}-mig-1g10gb-0")])["pod"].error is None
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and "overlaps" in error
    assert node.pci.function(GPU0).driver == "nvidia"


def test_a_process_on_the_gpu_refuses_the_claim(node: VfioNode) -> None:
    node.sim.start_process(node.sim.gpus[0].uuid, pid=4242, memory_bytes=1 << 30)
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and "processes 4242 use GPU" in error
    node.sim.end_process(4242)
    node.assert_as_found()


def test_a_process_holding_the_gpus_device_node_refuses_the_claim_touching_nothing(node: VfioNode) -> None:
    # nvidia-smi in a loop has /dev/nvidia0 open without a CUDA context: NVML lists nothing, the unbind would hang.
    recording = RecordingKernel(node.pci.writer)
    node.pci.writer = recording
    open_device_node(node.root, pid=5150, command="nvidia-smi", minor=node.sim.gpus[0].minor)
    open_device_node(node.root, pid=5151, command="dcgm-exporter", minor=node.sim.gpus[1].minor)  # another GPU's
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and "processes 5150 (nvidia-smi) have /dev/nvidia0 open" in error
    assert "5151" not in error
    assert recording.paths == [] and node.driver.checkpoint.records() == []
    end_process(node.root, 5150)
    assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None  # the kubelet's retry
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}
    node.assert_as_found()


def points_of_a_clean_run(node: VfioNode) -> tuple[list[str], list[str]]:
    def prepare() -> None:
        assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None

    def unprepare() -> None:
        assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}

    return fault_walk.points_of_a_clean_run(prepare, unprepare)


def test_a_kill_at_every_point_leaves_nothing_after_the_restart(tmp_path: Path) -> None:
    probe = VfioNode(tmp_path / "probe")
    preparing, unpreparing = points_of_a_clean_run(probe)
    probe.close()
    assert {"before:vfio-bind", "after:vfio-bind", "undone:vfio-bind"} <= {*preparing, *unpreparing}
    for phase, points in (("prepare", preparing), ("unprepare", unpreparing)):
        for i, point in enumerate(points):
            node = VfioNode(tmp_path / f"{phase}-{i}")
            if phase == "unprepare":
                assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None
            if phase == "prepare":
                crash_at(point, node.driver.prepare_resource_claims, [claim("vm", VFIO)])
            else:
                crash_at(point, node.driver.unprepare_resource_claims, [ref("vm")])
            node.restart().reconcile(lambda _ref: False)  # the claim is gone from the API server meanwhile
            node.assert_as_found(f"{phase} killed at {point}")
            node.close()


def test_admin_access_to_a_passthrough_device_is_refused_before_anything_changes(node: VfioNode) -> None:
    assert node.driver.prepare_resource_claims([claim("train", WHOLE)])["train"].error is None
    error = node.driver.prepare_resource_claims([claim("mon", VFIO, admin=True)])["mon"].error
    assert error is not None and VFIO in error and "admin access" in error
    assert node.pci.function(GPU0).driver == "nvidia"
    assert [r.uid for r in node.driver.checkpoint.records()] == ["train"]


def test_a_gpu_sharing_its_iommu_group_with_another_gpu_is_not_offered_nor_prepared(tmp_path: Path) -> None:
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
    functions = gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus)
    functions[1] = replace(functions[1], group=FIRST_GROUP)  # the second GPU in the first GPU's group
    write_tree(tmp_path / "host", functions)
    node = VfioNode(tmp_path)
    try:
        second = node.sim.gpus[1].pci_bus_id
        offered = {d.address for d in node.driver.passthrough_devices()}
        assert GPU0 not in offered and second not in offered
        assert node.sim.gpus[2].pci_bus_id in offered
        error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
        assert error is not None and "not offered" in error
        assert node.pci.function(GPU0).driver == "nvidia" and node.pci.function(second).driver == "nvidia"
    finally:
        node.close()


class RecordingKernel:
    """The simulated kernel, with the sysfs paths written to it kept in order."""

    def __init__(self, kernel: SysfsWriter) -> None:
        self.kernel = kernel
        self.paths: list[str] = []

    def write(self, path: Path, value: str) -> None:
        self.paths.append(str(path))
        self.kernel.write(path, value)


def test_a_refusal_of_any_passthrough_device_comes_before_the_first_bind(node: VfioNode) -> None:
    second = node.sim.gpus[1]
    recording = RecordingKernel(node.pci.writer)
    node.pci.writer = recording
    node.sim.start_process(second.uuid, pid=4343, memory_bytes=1 << 30)
    error = node.driver.prepare_resource_claims([claim("vm", VFIO, f"{node.driver.gpus()[1].name}-vfio")])["vm"].error
    assert error is not None and "processes 4343 use GPU" in error
    assert not [p for p in recording.paths if p.endswith(("/bind", "/unbind"))]  # the first GPU never left nvidia
    node.sim.end_process(4343)
    node.assert_as_found()


class FailingKernel:
    """The simulated kernel, refusing with EIO every bind of ``always`` and the first ``once`` bind of ``once``."""

    def __init__(self, kernel: SysfsWriter, *, always: str, once: str) -> None:
        self.kernel = kernel
        self.always, self.once = f"/drivers/{always}/bind", f"/drivers/{once}/bind"
        self.failed_once = False

    def write(self, path: Path, value: str) -> None:
        if str(path).endswith(self.always):
            raise OSError(errno.EIO, "Input/output error")
        if str(path).endswith(self.once) and not self.failed_once:
            self.failed_once = True
            raise OSError(errno.EIO, "Input/output error")
        self.kernel.write(path, value)


def test_a_bind_whose_own_restore_fails_is_a_claim_error_and_the_rollback_gives_the_gpu_back(node: VfioNode) -> None:
    node.pci.writer = FailingKernel(node.pci.writer, always="vfio-pci", once="nvidia")
    result = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"]
    assert result.error is not None and "prepare failed" in result.error and GPU0 in result.error
    assert "putting it back failed too" in result.error
    assert "everything done for the claim was undone" in result.error  # the kept intent was undone
    node.assert_as_found()


def test_a_gpu_gone_from_sysfs_is_a_claim_error(node: VfioNode) -> None:
    node.driver.update_inventory(discover(node.gpulib), MigMode.DYNAMIC)
    shutil.rmtree(node.root / "sys/bus/pci/devices" / GPU0)  # hot-removed (or the tree unmounted) after the refresh
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and GPU0 in error
    assert node.driver.checkpoint.records() == []


def test_a_gpu_moved_to_vfio_or_back_asks_for_a_rescan(node: VfioNode) -> None:
    asked: list[str] = []
    node.driver.on_passthrough_moved(lambda: asked.append("rescan"))
    assert node.driver.prepare_resource_claims([claim("pod", WHOLE)])["pod"].error is None
    assert node.driver.unprepare_resource_claims([ref("pod")]) == {"pod": None}
    assert asked == []  # a whole GPU never left NVML
    assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None
    assert asked == ["rescan"]  # NVML lost the GPU: it is no longer offered whole
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}
    assert asked == ["rescan", "rescan"]  # NVML sees it again
    node.assert_as_found()


def test_a_proc_the_driver_cannot_list_refuses_the_claim_naming_the_mount(node: VfioNode) -> None:
    # No host /proc where the driver reads it: who holds the GPU is unknown, and an unbind with a holder would hang.
    recording = RecordingKernel(node.pci.writer)
    node.pci.writer = recording
    shutil.rmtree(node.root / "proc")
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and "cannot be listed" in error and "host-proc volume at /host/proc" in error
    assert recording.paths == [] and node.driver.checkpoint.records() == []


def test_the_holder_scan_uses_the_minor_the_nvidia_driver_gives_the_gpu_now(node: VfioNode) -> None:
    # GPUs re-bound in another order: the nvidia driver now numbers the first GPU 5, whatever NVML said at start.
    write_gpu_information(node.root, GPU0, minor=5)
    open_device_node(node.root, pid=6000, command="nvidia-smi", minor=5)
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and "processes 6000 (nvidia-smi) have /dev/nvidia5 open" in error
    end_process(node.root, 6000)
    open_device_node(node.root, pid=6001, command="trainer", minor=0)  # another GPU's node now
    assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}


def test_a_process_on_the_gpus_dri_node_refuses_the_claim(node: VfioNode) -> None:
    # An nvidia-drm client (a display server, a video encoder) holds the GPU as surely as one on /dev/nvidia0.
    card, render = add_dri_nodes(node.root, GPU0, card=1)
    hold_open(node.root, pid=7000, command="Xorg", path=card)
    hold_open(node.root, pid=7001, command="ffmpeg", path=render)
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert (
        error is not None and "processes 7000 (Xorg), 7001 (ffmpeg) have /dev/dri/card1, /dev/dri/renderD129" in error
    )
    assert node.driver.checkpoint.records() == []
    end_process(node.root, 7000)
    end_process(node.root, 7001)
    assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}
    node.assert_as_found()


def test_a_gpu_with_sriov_virtual_functions_is_refused_before_anything(node: VfioNode) -> None:
    recording = RecordingKernel(node.pci.writer)
    node.pci.writer = recording
    set_sriov_numvfs(node.root, GPU0, 4)
    error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
    assert error is not None and f"GPU {GPU0} has 4 SR-IOV virtual functions enabled" in error
    assert recording.paths == [] and node.driver.checkpoint.records() == []
    set_sriov_numvfs(node.root, GPU0, 0)
    assert node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error is None
    assert node.driver.unprepare_resource_claims([ref("vm")]) == {"vm": None}


def test_a_gpu_on_vfio_pci_since_boot_is_not_offered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # vfio-pci.ids= on the kernel command line: the GPU never was the nvidia driver's, so NVML never described it
    # and no claim of ours holds it; a claim on it could not be prepared, so it is not offered (and said once why).
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    functions = gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus)
    write_tree(tmp_path / "host", [replace(f, driver="vfio-pci") if f.address == GPU0 else f for f in functions])
    with caplog.at_level("INFO", logger="dradriver.driver.prepare.vfio"):
        node = VfioNode(tmp_path)
        node.driver.passthrough_devices()
    try:
        offered = [d.name for d in node.driver.passthrough_devices()]
        assert VFIO not in offered and len(offered) == 7
        told = [r.message for r in caplog.records if "bound to vfio-pci before this driver started" in r.message]
        assert len(told) == 1 and GPU0 in told[0]
        error = node.driver.prepare_resource_claims([claim("vm", VFIO)])["vm"].error
        assert error is not None and f"device {VFIO} is not offered by this node" in error
        assert node.pci.function(GPU0).driver == "vfio-pci"
    finally:
        node.close()
