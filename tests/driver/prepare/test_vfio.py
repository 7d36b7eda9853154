"""VFIO passthrough's step on a simulated node: its sysfs tree, its NVML that loses a GPU bound to vfio-pci, and
a checkpoint on disk. A kill at every point of the prepare leaves nothing behind once the recorded undo runs (what
start-up reconciliation does with the record)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from dradriver import faults
from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from dradriver.driver.prepare.transaction import StepFailed, Transaction
from dradriver.driver.prepare.vfio import (
    STEP_VFIO_BIND,
    PassthroughCatalog,
    PassthroughDevice,
    PassthroughSteps,
    nvml_holders,
    nvml_sees,
    passthrough_env,
    recorded_gpus,
    unread_addresses,
    without_passthrough_losses,
)
from dradriver.driver.publish.passthrough import passthrough_slice_specs
from dradriver.errors import DeviceError
from dradriver.gpu.errors import GpuIsLost
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import LostGpu, discover
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.sim.sysfs import FIRST_GROUP, SimPciFunction, gpu_functions, write_tree

GPU0 = "0000:1b:00.0"  # the first GPU of hgx-h100-80gb
COMPANION = "0000:1b:00.1"  # put in its IOMMU group by these tests, as a consumer GPU's audio function is


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs."""


@dataclass
class Node:
    sim: SimulatedNode
    gpulib: GpuLib
    pci: HostPci
    steps: PassthroughSteps
    store: CheckpointStore
    state_dir: Path

    def device(self, address: str = GPU0) -> PassthroughDevice:
        catalog = PassthroughCatalog(self.pci)
        return next(d for d in catalog.devices(discover(self.gpulib)) if d.address == address)

    def transaction(self, uid: str = "claim-1") -> Transaction:
        record = ClaimRecord(uid=uid, namespace="vm", name="gpu", state=ClaimState.PREPARE_STARTED, devices=[])
        kinds = {k.name: k for k in self.steps.kinds()}
        return Transaction(record, self.store, kinds)

    def reopened(self) -> CheckpointStore:
        self.store.close()
        self.store = CheckpointStore.open(self.state_dir)
        return self.store


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield make_node(tmp_path)


BRIDGE = "0000:1a:00.0"  # a switch port in the GPU's group, as on boards whose ACS does not split them


def make_node(tmp_path: Path, *, companion: bool = False, vfio_loaded: bool = True, bridge: bool = False) -> Node:
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    root = tmp_path / "host"
    functions = gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus)
    if companion:
        functions.append(
            SimPciFunction(COMPANION, 0x22A3, pci_class=0x040300, driver="snd_hda_intel", group=FIRST_GROUP)
        )
    if bridge:
        functions.append(
            SimPciFunction(BRIDGE, 0x1000, pci_class=0x060400, vendor=0x1000, driver="pcieport", group=FIRST_GROUP)
        )
    write_tree(root, functions, vfio_loaded=vfio_loaded)
    kernel = sim.attach_sysfs(root)
    gpulib = simulated_gpulib_on(sim)
    pci = HostPci(root, kernel)
    steps = PassthroughSteps(
        pci, nvml_sees=nvml_sees(gpulib), holders=nvml_holders(gpulib), return_timeout_s=5, release=gpulib.released
    )
    state_dir = tmp_path / "state"
    return Node(sim, gpulib, pci, steps, CheckpointStore.open(state_dir), state_dir)


def assert_as_found(node: Node) -> None:
    assert node.pci.function(GPU0).driver == "nvidia"
    assert node.pci.driver_override(GPU0) is None
    assert not node.pci.vfio_group_node(FIRST_GROUP).exists()
    node.gpulib.probe(node.sim.gpus[0].uuid)  # NVML answers for it


def test_every_gpu_is_offered_for_passthrough_with_nvidias_attributes(node: Node) -> None:
    devices = PassthroughCatalog(node.pci).devices(discover(node.gpulib))
    assert devices[0].name == "gpu-0000-1b-00-0-vfio" and len(devices) == 8
    [spec] = passthrough_slice_specs(devices)
    first = spec["devices"][0]
    assert first["attributes"]["type"] == {"string": "vfio"}
    assert first["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": GPU0}
    assert first["attributes"]["iommuGroup"] == {"int": FIRST_GROUP}
    assert first["attributes"]["iommuGroupShared"] == {"bool": False}
    assert first["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert first["capacity"]["addressableMemory"]["value"] == "81559Mi"  # what NVML reports of an H100 80GB


def test_bind_moves_the_group_to_vfio_and_nvml_loses_the_gpu_until_the_undo(tmp_path: Path) -> None:
    node = make_node(tmp_path, companion=True)
    device = node.device()
    assert device.group_shared and device.group_members == (GPU0, COMPANION)
    txn = node.transaction()
    node.steps.expect(txn, device)
    nodes = node.steps.bind(txn, device)
    assert [n.path for n in nodes] == [f"/dev/vfio/{FIRST_GROUP}", "/dev/vfio/vfio"]
    assert node.pci.function(GPU0).driver == node.pci.function(COMPANION).driver == "vfio-pci"
    with pytest.raises(GpuIsLost):  # NVML answers only for what the nvidia driver holds
        node.gpulib.probe(node.sim.gpus[0].uuid)
    assert [a.params["address"] for a in txn.record.actions] == [COMPANION, GPU0]  # the GPU last
    assert passthrough_env(device)[0] == f"PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO={GPU0}"
    # Still offered while bound, described as the claim's record keeps it (NVML cannot see it now).
    again = PassthroughCatalog(node.pci)
    found = again.devices(discover(node.gpulib), [txn.record])
    assert [(d.function.driver, d.uuid) for d in found if d.address == GPU0] == [("vfio-pci", node.sim.gpus[0].uuid)]
    assert txn.rollback() is None
    assert_as_found(node)
    assert node.pci.function(COMPANION).driver == "snd_hda_intel"


def test_a_process_on_the_gpu_refuses_the_claim_and_touches_nothing(node: Node) -> None:
    node.sim.start_process(node.sim.gpus[0].uuid, pid=4242, memory_bytes=1 << 30)
    txn = node.transaction()
    node.steps.expect(txn, node.device())
    with pytest.raises(DeviceError, match=r"processes 4242 use GPU 0000:1b:00\.0"):
        node.steps.bind(txn, node.device())
    node.sim.end_process(4242)
    assert txn.rollback() is None
    assert_as_found(node)


def test_the_kernels_busy_refusal_is_undone_at_once(node: Node) -> None:
    # A holder NVML does not list (a process with /dev/nvidia0 open and no context): the kernel refuses the unbind.
    steps = PassthroughSteps(node.pci, nvml_sees=nvml_sees(node.gpulib), release=node.gpulib.released)
    node.sim.start_process(node.sim.gpus[0].uuid, pid=77, memory_bytes=0)
    record_txn = Transaction(node.transaction().record, node.store, {k.name: k for k in steps.kinds()})
    with pytest.raises(StepFailed, match="cannot leave the nvidia driver: a process has it open"):
        steps.bind(record_txn, node.device())
    assert record_txn.record.actions == []
    node.sim.end_process(77)
    assert_as_found(node)


def test_without_the_vfio_module_the_claim_is_refused(tmp_path: Path) -> None:
    node = make_node(tmp_path, vfio_loaded=False)
    with pytest.raises(DeviceError, match="vfio-pci kernel module is not loaded"):
        node.steps.bind(node.transaction(), node.device())


def test_a_kill_at_every_point_is_repaired_by_the_recorded_undo(tmp_path: Path) -> None:
    points = ["before:vfio-bind", "after:vfio-bind"]
    for index, point in enumerate(points):
        for occurrence in (1, 2):  # the companion's step, then the GPU's
            node = make_node(tmp_path / f"{index}-{occurrence}", companion=True)
            seen = {"n": 0}

            def crash(name: str, *, at: str = point, nth: int = occurrence, count: dict[str, int] = seen) -> None:
                if name == at:
                    count["n"] += 1
                    if count["n"] == nth:
                        raise Crash(name)

            txn = node.transaction()
            node.steps.expect(txn, node.device())
            node.store.put(txn.record)  # the PrepareStarted write: every intent on disk
            faults.observer = crash
            try:
                with pytest.raises(Crash):
                    node.steps.bind(txn, node.device())
            finally:
                faults.observer = None
            [record] = node.reopened().records()  # what a restarted driver finds
            assert [a.step for a in record.actions] == [STEP_VFIO_BIND, STEP_VFIO_BIND]
            kinds = {k.name: k for k in node.steps.kinds()}
            assert Transaction(record, node.store, kinds).rollback() is None, (point, occurrence)
            assert_as_found(node)
            assert node.pci.function(COMPANION).driver == "snd_hda_intel", (point, occurrence)


def test_a_bridge_in_the_group_stays_on_its_driver(tmp_path: Path) -> None:
    node = make_node(tmp_path, bridge=True)
    device = node.device()
    assert device.group_members == (GPU0,) and not device.group_shared
    txn = node.transaction()
    node.steps.expect(txn, device)
    node.steps.bind(txn, device)  # the group is viable with its bridge on pcieport
    assert node.pci.function(BRIDGE).driver == "pcieport"
    assert node.pci.vfio_group_node(FIRST_GROUP).exists()
    assert txn.rollback() is None
    assert_as_found(node)


def test_a_gpu_whose_group_holds_another_display_function_is_not_offered_and_its_bind_is_refused(
    tmp_path: Path,
) -> None:
    vga = "0000:1b:00.1"  # a BMC's VGA function (ASPEED), put in the GPU's group by a board without ACS
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    functions = gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus)
    functions.append(SimPciFunction(vga, 0x2000, pci_class=0x030000, vendor=0x1A03, driver=None, group=FIRST_GROUP))
    write_tree(tmp_path / "host", functions)
    node = make_node(tmp_path)  # on the tree written here
    offered = {d.address for d in PassthroughCatalog(node.pci).devices(discover(node.gpulib))}
    assert GPU0 not in offered and len(offered) == 7
    device = PassthroughDevice("gpu-0000-1b-00-0-vfio", node.pci.function(GPU0), (vga, GPU0), None)
    with pytest.raises(DeviceError, match=f"holds other GPUs \\({vga}\\)"):
        node.steps.bind(node.transaction(), device)
    assert_as_found(node)


def test_a_gpu_this_processs_nvml_does_not_count_is_given_back_without_waiting_for_it(node: Node) -> None:
    # A real NVML counts GPUs at its start: a GPU a VM held then is not counted, here not even once started again.
    steps = PassthroughSteps(
        node.pci,
        nvml_sees=lambda _uuid: False,
        nvml_counts=lambda _uuid: False,
        return_timeout_s=30,
        release=node.gpulib.released,
    )
    txn = Transaction(node.transaction().record, node.store, {k.name: k for k in steps.kinds()})
    steps.expect(txn, node.device())
    steps.bind(txn, node.device())
    started = time.monotonic()
    assert txn.rollback() is None  # not a 30 s wait at every retry of the unprepare
    assert time.monotonic() - started < 5
    assert_as_found(node)


def lost(index: int, name: str | None = None) -> LostGpu:
    return LostGpu(index, name, None if name is None else f"GPU-{index}", "GPU is lost")


def test_a_gpu_never_read_because_a_vm_holds_it_is_not_counted_lost(node: Node) -> None:
    inventory = discover(node.gpulib)
    gpus = inventory.gpus
    addresses = [g.info.pci_bus_id for g in gpus]
    # NVML read every GPU but the first and the fifth, which it counts (by index) but never read.
    unread = replace(inventory, gpus=(*gpus[1:4], *gpus[5:]), lost_gpus=(lost(0), lost(4)))
    assert unread_addresses(unread, addresses) == {0: addresses[0], 4: addresses[4]}
    node.pci.set_driver_override(addresses[0], "vfio-pci")
    with node.gpulib.released():  # this process's NVML holds every GPU open, as a real one does
        node.pci.unbind(addresses[0], "nvidia")
    node.pci.bind(addresses[0], "vfio-pci")
    kept = without_passthrough_losses(unread, node.pci).lost_gpus
    assert kept == (lost(4),)  # the fifth is on nvidia: lost indeed
    # A real NVML does not count a GPU on vfio-pci at its start: the indices shift and nothing is unread.
    assert unread_addresses(replace(inventory, gpus=gpus[1:], lost_gpus=()), addresses) == {}
    # An unread index whose place the order cannot tell (two unread, one sysfs GPU between) stays lost.
    two = replace(inventory, gpus=gpus[2:], lost_gpus=(lost(0), lost(1)))
    assert unread_addresses(two, addresses[1:]) == {}


def test_the_gpus_description_is_recorded_and_read_back_by_a_restarted_catalog(node: Node) -> None:
    device = node.device()
    txn = node.transaction()
    node.steps.expect(txn, device)
    node.steps.bind(txn, device)
    assert device.gpu is not None
    node.store.put(txn.record)
    records = node.reopened().records()  # as a restarted driver reads them, from the JSON on disk
    [(address, described)] = recorded_gpus(records).items()
    assert (address, described.name, described.info) == (GPU0, device.gpu.name, device.gpu.info)
    restarted = PassthroughCatalog(node.pci)  # NVML cannot describe the GPU now
    [again] = [d for d in restarted.devices(discover(node.gpulib), records) if d.address == GPU0]
    assert again.gpu == described and again.function.driver == "vfio-pci"
    # Without the record nothing describes it (as a GPU bound to vfio-pci at boot): not offered, since its claim
    # could not be prepared (test_a_gpu_on_vfio_pci_since_boot_is_not_offered).
    assert [d for d in PassthroughCatalog(node.pci).devices(discover(node.gpulib)) if d.address == GPU0] == []
    kinds = {k.name: k for k in node.steps.kinds()}
    assert Transaction(records[0], node.store, kinds).rollback() is None
    assert_as_found(node)
