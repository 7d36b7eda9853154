"""A kill right after every single change a passthrough claim makes to the node, in prepare and in unprepare, with
the claim gone from the API server or still there at the restart: every sysfs write of the bind (driver_override,
unbind, bind, for each function of each IOMMU group) and of the give-back, Fabric Manager's activate and deactivate,
and this process's NVML letting go of the GPUs and starting again. The restarted driver, on the same sysfs, fabric,
checkpoint and CDI directory, leaves nothing behind: each function back on its driver with no override (or the claim
wholly passed through, when its record says it completed), no partition active without a claim, no CDI spec
without a record; and the kubelet's next calls work.

The changes are not listed here: a clean prepare and unprepare count them first (wrapped writer, fabric manager and
NVML release), so a write added later is killed after too. A second kill during the restart's own repair, and a kill
during the rollback of a prepare the kernel refused, are walked the same way. These kills fall between the fault
points (``before:``/``after:``/``undone:`` of each step, walked for each feature alone in test_state_vfio.py and
test_partitions.py); the claim here, both features at once, is killed at every point too."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from support.fault_walk import Changes, Crash, crash_at, points_of_a_clean_run

from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimState
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.driver.prepare.vfio import Passthrough, PassthroughCatalog, PassthroughSteps, nvml_holders, nvml_sees
from dradriver.gpu.fabric_manager import FabricManager, FabricPartition
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.pci_binding import HostPci, SysfsWriter
from dradriver.sim.fabric_manager import SimFabricManager
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.sim.sysfs import FIRST_GROUP, SimKernel, SimPciFunction, gpu_functions, write_tree
from tests.driver.prepare.test_state_mig import DRIVER, claim, ref

GPUS = ("0000:1b:00.0", "0000:43:00.0")  # hgx-h100-80gb's first two GPUs: modules 1 and 2, partition 3
COMPANION = "0000:1b:00.1"  # an audio function in the first GPU's IOMMU group, which goes to the VM with it
COMPANION_DRIVER = "snd_hda_intel"
GROUPS = (FIRST_GROUP, FIRST_GROUP + 1)
PARTITION = 3
CLAIM = claim("vm", "gpu-0000-1b-00-0-vfio", "gpu-0000-43-00-0-vfio")


class CountedKernel:
    """The simulated kernel; each write made, then counted."""

    def __init__(self, kernel: SysfsWriter, changes: Changes) -> None:
        self.kernel = kernel
        self.changes = changes

    def write(self, path: Path, value: str) -> None:
        self.changes.before()
        self.kernel.write(path, value)
        self.changes.record(f"{'/'.join(path.parts[-2:])} <- {value.strip()!r}")


class RefusingKernel:
    """The simulated kernel, refusing with EIO a bind to vfio-pci of each address in ``refused`` (a set the test
    empties to let the binds through)."""

    def __init__(self, kernel: SysfsWriter, refused: set[str]) -> None:
        self.kernel = kernel
        self.refused = refused

    def write(self, path: Path, value: str) -> None:
        if path.parts[-2:] == ("vfio-pci", "bind") and value.strip() in self.refused:
            raise OSError(errno.EIO, "Input/output error")
        self.kernel.write(path, value)


class CountedFabricManager:
    """Fabric Manager; each activation and deactivation made, then counted."""

    def __init__(self, fabric_manager: FabricManager, changes: Changes) -> None:
        self.fabric_manager = fabric_manager
        self.changes = changes

    def supported_partitions(self) -> list[FabricPartition]:
        return self.fabric_manager.supported_partitions()

    def activate(self, partition_id: int) -> None:
        self.changes.before()
        self.fabric_manager.activate(partition_id)
        self.changes.record(f"FM activate {partition_id}")

    def deactivate(self, partition_id: int) -> None:
        self.changes.before()
        self.fabric_manager.deactivate(partition_id)
        self.changes.record(f"FM deactivate {partition_id}")


def counted_release(gpulib: GpuLib, changes: Changes) -> Callable[[], AbstractContextManager[None]]:
    """``gpulib.released`` with a kill possible right after NVML let go of the GPUs and right before it starts
    again (after the block's writes)."""

    @contextmanager
    def released() -> Iterator[None]:
        changes.before()
        with gpulib.released():
            changes.record("NVML let go of the GPUs")
            yield
            changes.before()
            changes.record("NVML about to start again")

    return released


class Node:
    """A simulated HGX H100 node with sysfs (the first GPU's group holding an audio function) and Fabric Manager;
    :meth:`start` starts a driver on it, as a new process would, its changes counted when ``changes`` is given."""

    def __init__(self, tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a", state_path=tmp_path / "sim")
        self.root = tmp_path / "host"
        functions = gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in self.sim.gpus)
        companion = SimPciFunction(COMPANION, 0x22A3, pci_class=0x040300, driver=COMPANION_DRIVER, group=FIRST_GROUP)
        write_tree(self.root, [*functions, companion])
        self.kernel: SimKernel = self.sim.attach_sysfs(self.root)
        self.pci = HostPci(self.root, self.kernel)  # the test's own view: reads only
        self.fm = SimFabricManager.beside(self.sim)
        self.cdi_dir = tmp_path / "cdi"
        self.state_dir = tmp_path / "state"
        self.store: CheckpointStore | None = None
        self.gpulib: GpuLib | None = None
        self.changes = Changes()
        self.refused_binds: set[str] = set()  # addresses whose bind to vfio-pci the kernel refuses
        self.driver = self.start(counted=True)

    def start(self, *, counted: bool = False) -> GpuDriver:
        """A driver on the node's hardware and files; the previous one's NVML and checkpoint are closed first."""
        if self.store is not None:
            self.store.close()
        if self.gpulib is not None:
            self.gpulib.close()
        gpulib = self.gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(self.state_dir, boot_id="boot-1")
        fabric_manager: FabricManager = SimFabricManager.beside(self.sim)
        writer: SysfsWriter = RefusingKernel(self.kernel, self.refused_binds)
        release: Callable[[], AbstractContextManager[None]] = gpulib.released
        if counted:
            fabric_manager = CountedFabricManager(fabric_manager, self.changes)
            writer = CountedKernel(writer, self.changes)
            release = counted_release(gpulib, self.changes)
        pci = HostPci(self.root, writer)
        steps = PassthroughSteps(
            pci, nvml_sees=nvml_sees(gpulib), holders=nvml_holders(gpulib), return_timeout_s=5, release=release
        )
        self.driver = GpuDriver(
            GpuDriverOptions(
                driver_name=DRIVER,
                pool="node-a",
                mig_mode=MigMode.NONE,
                features=NodeFeatures(
                    passthrough=Passthrough(PassthroughCatalog(pci), steps), fabric_manager=fabric_manager
                ),
            ),
            inventory=discover(gpulib),
            cdi=CdiWriter(self.cdi_dir),
            gpulib=gpulib,
            checkpoint=self.store,
        )
        return self.driver

    def close(self) -> None:
        assert self.store is not None and self.gpulib is not None
        self.store.close()
        self.gpulib.close()

    def prepare(self) -> None:
        result = self.driver.prepare_resource_claims([CLAIM])[CLAIM.uid]
        assert result.error is None, result.error

    def unprepare(self) -> None:
        assert self.driver.unprepare_resource_claims([ref(CLAIM.uid)]) == {CLAIM.uid: None}

    def active(self) -> list[int]:
        return [p.id for p in self.fm.supported_partitions() if p.active]

    def assert_as_found(self, where: str) -> None:
        """Every function on its own driver with no override, no VFIO group node, NVML answering for both GPUs, no
        partition active, no CDI spec, no record."""
        assert self.gpulib is not None
        for address in GPUS:
            assert self.pci.function(address).driver == "nvidia", where
            assert self.pci.driver_override(address) is None, where
        assert self.pci.function(COMPANION).driver == COMPANION_DRIVER, where
        assert self.pci.driver_override(COMPANION) is None, where
        assert not any(self.pci.vfio_group_node(g).exists() for g in GROUPS), where
        for gpu in self.sim.gpus[:2]:
            self.gpulib.probe(gpu.uuid)  # the restarted driver's NVML counts and answers for it again
        assert self.active() == [], where
        assert list(self.cdi_dir.glob("*.json")) == [], where
        assert self.driver.checkpoint.records() == [], where

    def assert_passed_through(self, where: str) -> None:
        """The claim completed and wholly given to its VM: every function of both groups on vfio-pci, their group
        nodes there, the partition active, the claim's CDI spec and a complete record."""
        for address in (*GPUS, COMPANION):
            assert self.pci.function(address).driver == "vfio-pci", where
        assert all(self.pci.vfio_group_node(g).exists() for g in GROUPS), where
        assert self.active() == [PARTITION], where
        assert [p.name for p in self.cdi_dir.glob("*.json")] == [f"k8s.gpu.dradriver.dev-claim_{CLAIM.uid}.json"], where
        [record] = self.driver.checkpoint.records()
        assert record.state is ClaimState.PREPARE_COMPLETED and record.rollback_error is None, where


def changes_of_a_clean_run(tmp_path: Path) -> tuple[list[str], list[str]]:
    """The changes a clean prepare, then a clean unprepare, make to the node, in order."""
    node = Node(tmp_path)
    try:
        node.prepare()
        node.assert_passed_through("the clean prepare")
        preparing = list(node.changes.made)
        node.changes.arm(None)
        node.unprepare()
        node.assert_as_found("the clean unprepare")
        return preparing, list(node.changes.made)
    finally:
        node.close()


@pytest.mark.parametrize("claim_at_restart", ["gone", "kept"])
@pytest.mark.parametrize("phase", ["prepare", "unprepare"])
def test_a_kill_after_every_change_leaves_nothing_behind_after_the_restart(
    tmp_path: Path, phase: str, claim_at_restart: str
) -> None:
    preparing, unpreparing = changes_of_a_clean_run(tmp_path / "probe")
    # What the walk covers today (later changes add to it): per function the override, the unbind and the bind,
    # both ways; the partition's activation and deactivation; NVML let go of the GPUs and started again.
    assert [c for c in preparing if c.startswith("FM")] == [f"FM activate {PARTITION}"]
    assert [c for c in unpreparing if c.startswith("FM")] == [f"FM deactivate {PARTITION}"]
    for changes in (preparing, unpreparing):
        assert sum("/bind <-" in c for c in changes) == 3, changes  # two GPUs and the companion
        assert sum("/unbind <-" in c for c in changes) == 3, changes
        assert sum("driver_override" in c for c in changes) == 3, changes
    assert "NVML let go of the GPUs" in preparing
    # The partition is activated before the GPUs go to vfio-pci and deactivated after they are back (NVIDIA's order).
    assert preparing[0] == f"FM activate {PARTITION}" and unpreparing[-1] == f"FM deactivate {PARTITION}"
    changes = preparing if phase == "prepare" else unpreparing
    outcomes = set()
    for kill_after, change in enumerate(changes, start=1):
        where = f"{phase} killed after change {kill_after} ({change}), the claim {claim_at_restart} at the restart"
        node = Node(tmp_path / f"{phase}-{kill_after}")
        try:
            outcomes.add(kill_and_restart(node, phase, kill_after, claim_at_restart=claim_at_restart, where=where))
        finally:
            node.close()
    if phase == "unprepare" and claim_at_restart == "kept":
        # Killed before a function left vfio-pci, the claim is kept (its pod may run: only the spec is missing);
        # after, the unprepare is finished.
        assert outcomes == {"kept", "undone"}
    else:
        assert outcomes == {"undone"}


def kill_and_restart(node: Node, phase: str, kill_after: int | str, *, claim_at_restart: str, where: str) -> str:
    """Kill the driver right after change ``kill_after`` of ``phase`` (or at the fault point of that name), restart it
    on the node, and check what start-up left and that the kubelet's next calls work; returns whether start-up kept
    the claim or undid it."""
    if isinstance(kill_after, str):
        if phase == "unprepare":
            node.prepare()
        crash_at(kill_after, node.prepare if phase == "prepare" else node.unprepare)
    else:
        kill(node, phase, kill_after)
    restart(node, claim_exists=claim_at_restart == "kept")
    records = node.driver.checkpoint.records()
    outcome = "kept" if records else "undone"
    if records:
        node.assert_passed_through(where)
        node.unprepare()  # the kubelet's unprepare, once the pod is gone
    assert_clean_and_preparable(node, where)
    return outcome


@pytest.mark.parametrize("claim_at_restart", ["gone", "kept"])
def test_a_kill_at_every_fault_point_of_a_passthrough_claim_in_a_partition_is_repaired(
    tmp_path: Path, claim_at_restart: str
) -> None:
    # The points of both steps and the claim's own (prepare-started, after:cdi-spec, prepare-completing, undone:…),
    # where nothing changes on the node but the record and the spec: between the changes walked above.
    probe = Node(tmp_path / "probe")
    try:
        preparing, unpreparing = points_of_a_clean_run(probe.prepare, probe.unprepare)
    finally:
        probe.close()
    assert {"after:fabric-partition", "after:vfio-bind", "prepare-completing"} <= set(preparing)
    assert {"undone:vfio-bind", "undone:fabric-partition"} <= set(unpreparing)
    for phase, points in (("prepare", preparing), ("unprepare", unpreparing)):
        for point in points:
            where = f"{phase} killed at {point}, the claim {claim_at_restart} at the restart"
            node = Node(tmp_path / f"{phase}-{point.replace(':', '-')}")
            try:
                kill_and_restart(node, phase, point, claim_at_restart=claim_at_restart, where=where)
            finally:
                node.close()


def restart(node: Node, *, claim_exists: bool, counted: bool = False) -> None:
    """A new driver process on the node: start-up reconciliation, then the inventory read again, as ``run`` does
    after reconciling (``reconcile_at_start``: its discovery ran while GPUs were on vfio-pci)."""
    node.start(counted=counted).reconcile(lambda _ref: claim_exists)
    assert node.gpulib is not None
    node.driver.update_inventory(discover(node.gpulib), MigMode.NONE)


def assert_clean_and_preparable(node: Node, where: str) -> None:
    """Nothing of the claim is left, and the same claim (the kubelet's retry, or a new pod) prepares and unprepares."""
    node.assert_as_found(where)
    node.prepare()
    node.assert_passed_through(where)
    node.unprepare()
    node.assert_as_found(where)


def kill(node: Node, phase: str, kill_after: int) -> None:
    """Kill the driver right after change ``kill_after`` of ``phase`` (an unprepare after a clean prepare)."""
    if phase == "unprepare":
        node.prepare()
    node.changes.arm(kill_after)
    with pytest.raises(Crash):
        node.prepare() if phase == "prepare" else node.unprepare()


def repair_changes(tmp_path: Path, phase: str, kill_after: int) -> list[str]:
    """The changes start-up makes to repair a kill right after change ``kill_after`` of ``phase`` (the claim gone)."""
    node = Node(tmp_path)
    try:
        kill(node, phase, kill_after)
        node.changes.arm(None)
        node.start(counted=True).reconcile(lambda _ref: False)
        return list(node.changes.made)
    finally:
        node.close()


@pytest.mark.parametrize("phase", ["prepare", "unprepare"])
def test_a_second_kill_during_the_start_up_repair_is_repaired_by_the_next_start(tmp_path: Path, phase: str) -> None:
    preparing, unpreparing = changes_of_a_clean_run(tmp_path / "probe")
    walked = 0
    for first in range(1, len(preparing if phase == "prepare" else unpreparing) + 1):
        repairing = repair_changes(tmp_path / f"{first}-count", phase, first)
        for second, change in enumerate(repairing, start=1):
            where = f"{phase} killed after change {first}, then start-up killed after its change {second} ({change})"
            node = Node(tmp_path / f"{first}-{second}")
            try:
                kill(node, phase, first)
                node.start(counted=True)
                node.changes.arm(second)
                with pytest.raises(Crash):
                    node.driver.reconcile(lambda _ref: False)
                restart(node, claim_exists=False)
                node.assert_as_found(where)  # that the claim prepares again is walked above: not repeated here
            finally:
                node.close()
            walked += 1
    assert walked > 0


def test_a_kill_during_the_rollback_of_a_failed_prepare_is_repaired_at_the_restart(tmp_path: Path) -> None:
    # The kernel refuses the second GPU's bind to vfio-pci: its own writes are put back, then the claim's rollback
    # gives the first GPU and its audio function back and deactivates the partition. A kill after each of those.
    def failed_prepare_changes(node: Node) -> list[str]:
        node.changes.arm(None)
        error = node.driver.prepare_resource_claims([CLAIM])[CLAIM.uid].error
        assert error is not None and "everything done for the claim was undone" in error, error
        return list(node.changes.made)

    probe = Node(tmp_path / "probe")
    probe.refused_binds.add(GPUS[1])
    try:
        failing = failed_prepare_changes(probe)
        probe.assert_as_found("the failed prepare")
    finally:
        probe.close()
    refused_at = failing.index(f"nvidia/unbind <- {GPUS[1]!r}")
    assert failing[-1] == f"FM deactivate {PARTITION}" and len(failing) > refused_at + 1
    for kill_after in range(refused_at + 1, len(failing) + 1):
        where = f"the failed prepare killed after change {kill_after} ({failing[kill_after - 1]})"
        node = Node(tmp_path / str(kill_after))
        node.refused_binds.add(GPUS[1])
        try:
            node.changes.arm(kill_after)
            with pytest.raises(Crash):
                node.prepare()
            node.refused_binds.clear()  # the kernel lets the bind through now
            restart(node, claim_exists=True)  # the kubelet retries the claim
            assert_clean_and_preparable(node, where)
        finally:
            node.close()
