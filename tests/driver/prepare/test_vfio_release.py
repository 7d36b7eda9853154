"""The unbind of a GPU from ``nvidia`` on a simulated node whose NVML holds every GPU open, as a real one does: the
driver's own NVML session lets go for the unbind (and the health loop's wait pauses meanwhile), and an unbind the
kernel does not return from fails its claim at a deadline, keeps the GPU off limits and is given back later."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from dradriver.driver.prepare.transaction import StepFailed, Transaction
from dradriver.driver.prepare.vfio import (
    PassthroughCatalog,
    PassthroughDevice,
    PassthroughSteps,
    nvml_counts,
    nvml_holders,
    nvml_sees,
)
from dradriver.errors import DeviceError
from dradriver.gpu.errors import GpuIsLost, NotFound, NvmlReleased
from dradriver.gpu.inventory import discover
from dradriver.gpu.models import GpuEvent
from dradriver.gpu.nvml import NvmlGpuLib
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from dradriver.sim.sysfs import SimKernel, gpu_functions, write_tree

GPU0 = "0000:1b:00.0"  # the first GPU of hgx-h100-80gb
GPU1 = "0000:43:00.0"  # its second


@dataclass
class Node:
    sim: SimulatedNode
    kernel: SimKernel
    gpulib: NvmlGpuLib
    pci: HostPci
    store: CheckpointStore

    def steps(self, *, released: bool = True, unbind_timeout_s: float = 30.0) -> PassthroughSteps:
        return PassthroughSteps(
            self.pci,
            nvml_sees=nvml_sees(self.gpulib),
            return_timeout_s=5,
            unbind_timeout_s=unbind_timeout_s,
            **({"release": self.gpulib.released} if released else {}),
        )

    def device(self, address: str = GPU0) -> PassthroughDevice:
        return next(d for d in PassthroughCatalog(self.pci).devices(discover(self.gpulib)) if d.address == address)

    def transaction(self, steps: PassthroughSteps, uid: str = "claim-1") -> Transaction:
        record = ClaimRecord(uid=uid, namespace="vm", name="gpu", state=ClaimState.PREPARE_STARTED, devices=[])
        return Transaction(record, self.store, {k.name: k for k in steps.kinds()})


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    root = tmp_path / "host"
    write_tree(root, gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in sim.gpus))
    kernel = sim.attach_sysfs(root)
    gpulib = simulated_gpulib_on(sim)
    store = CheckpointStore.open(tmp_path / "state")
    yield Node(sim, kernel, gpulib, HostPci(root, kernel), store)
    store.close()
    gpulib.close()


def until(condition: Callable[[], bool], *, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def errno_of(call: Callable[[], object]) -> int | None:
    try:
        call()
    except OSError as err:
        return err.errno
    return None


def test_this_processs_nvml_holds_every_gpu_until_it_lets_go(node: Node) -> None:
    node.gpulib.gpus()
    node.pci.set_driver_override(GPU0, "vfio-pci")
    assert errno_of(lambda: node.pci.unbind(GPU0, "nvidia")) == errno.EBUSY  # our own NVML session holds it
    with node.gpulib.released():
        assert node.sim.nvml_sessions == 0
        node.pci.unbind(GPU0, "nvidia")
    node.pci.bind(GPU0, "vfio-pci")
    # NVML started again: it answers for the other GPUs, and cannot see the one vfio-pci has.
    assert node.gpulib.probe(node.sim.gpus[1].uuid).uuid == node.sim.gpus[1].uuid
    with pytest.raises(GpuIsLost):
        node.gpulib.probe(node.sim.gpus[0].uuid)
    assert [g.pci_bus_id for g in node.gpulib.gpus()][:1] == [GPU1]
    # Given back to nvidia, the next release's fresh NVML reads it again.
    node.pci.unbind(GPU0, "vfio-pci")
    node.pci.set_driver_override(GPU0, None)
    node.pci.bind(GPU0, "nvidia")
    with node.gpulib.released():
        pass
    assert node.gpulib.gpus()[0].pci_bus_id == GPU0


def test_a_prepare_lets_go_of_this_processs_nvml_for_the_unbind_and_health_events_still_come(node: Node) -> None:
    holding = node.steps(released=False)  # as before the fix: the kernel sees this process on the GPU
    txn = node.transaction(holding)
    with pytest.raises(StepFailed, match=f"open by processes {os.getpid()}"):
        holding.bind(txn, node.device())
    assert node.pci.function(GPU0).driver == "nvidia" and txn.record.actions == []
    steps = node.steps()
    txn = node.transaction(steps)
    steps.expect(txn, node.device())
    steps.bind(txn, node.device())
    assert node.pci.function(GPU0).driver == "vfio-pci"
    # The event set was registered anew after NVML started again: an XID on another GPU is reported.
    node.sim.inject_xid(1, 31)
    event = node.gpulib.wait_for_event(5)
    assert event is not None and (event.gpu_uuid, event.xid) == (node.sim.gpus[1].uuid, 31)
    assert txn.rollback() is None
    assert node.pci.function(GPU0).driver == "nvidia"
    node.gpulib.probe(node.sim.gpus[0].uuid)


def test_the_health_loops_event_wait_pauses_while_nvml_is_let_go(node: Node) -> None:
    node.gpulib.gpus()
    got: list[GpuEvent | BaseException | None] = []

    def wait() -> None:
        try:
            got.append(node.gpulib.wait_for_event(30))
        except BaseException as err:  # handed to the test thread
            got.append(err)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    until(lambda: node.gpulib._gate.sharers == 1)  # the wait is in NVML's event wait now
    started = time.monotonic()
    with node.gpulib.released():  # waits for the wait's current slice, not for its 30 s
        assert time.monotonic() - started < 0.5
        assert node.sim.nvml_sessions == 0 and waiter.is_alive()
    node.sim.inject_xid(2, 43)
    waiter.join(10)
    [event] = got
    assert isinstance(event, GpuEvent) and (event.gpu_uuid, event.xid) == (node.sim.gpus[2].uuid, 43)


def test_an_unbind_that_does_not_return_fails_its_claim_at_the_deadline_and_the_gpu_is_given_back_later(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    steps = node.steps(unbind_timeout_s=0.3)
    let_go = node.kernel.hold_unbind(GPU0)  # the nvidia driver's remove waits, as for a process that holds the GPU
    device, other_device = node.device(), node.device(GPU1)
    txn = node.transaction(steps)
    steps.expect(txn, device)
    with pytest.raises(DeviceError, match=f"GPU {GPU0} is stuck leaving the nvidia driver"):
        steps.bind(txn, device)
    assert [a.params["address"] for a in txn.record.actions] == [GPU0]  # the intent stays for the repair
    assert steps.unbinding(GPU0)
    with pytest.raises(DeviceError, match="still leaving its driver"):
        steps.refuse_unusable(device)
    # NVML stays let go while the unbind is in the kernel (started, it would hold the GPU the unbind waits for):
    # every GPU call fails fast with a retryable error, and this process holds no GPU.
    assert node.sim.nvml_sessions == 0
    with pytest.raises(NvmlReleased, match="unbind from the nvidia driver is still in the kernel"):
        node.gpulib.gpus()
    with pytest.raises(NvmlReleased):
        node.gpulib.probe(node.sim.gpus[1].uuid)
    with pytest.raises(NvmlReleased):  # another GPU's claim is refused (and retried), not told "no holder"
        nvml_holders(node.gpulib)(node.sim.gpus[1].uuid)
    assert "still leaving its driver" in (txn.rollback() or "")  # the undo waits for the kernel too
    assert node.sim.nvml_sessions == 0
    with caplog.at_level(logging.INFO, logger="dradriver.driver.prepare.vfio"):
        let_go.set()
        until(lambda: not steps.unbinding(GPU0))
        until(lambda: "late unbind returned" in caplog.text)
    # The late write did unbind the GPU (no NVML of ours was there to make it wait or fail): the rollback binds it.
    assert node.pci.function(GPU0).driver is None
    assert txn.rollback() is None
    assert node.pci.function(GPU0).driver == "nvidia" and node.pci.driver_override(GPU0) is None
    # NVML starts again at the next call and the node serves again: the GPU answers, another goes to vfio-pci.
    assert node.gpulib.probe(node.sim.gpus[0].uuid).uuid == node.sim.gpus[0].uuid
    other = node.transaction(steps, uid="claim-2")
    steps.expect(other, other_device)
    steps.bind(other, other_device)
    assert node.pci.function(GPU1).driver == "vfio-pci"
    assert other.rollback() is None
    assert node.pci.function(GPU1).driver == "nvidia" and node.pci.driver_override(GPU1) is None


def test_a_give_back_whose_unbind_from_vfio_pci_does_not_return_fails_at_the_deadline_and_is_retried(
    node: Node,
) -> None:
    # vfio-pci's remove waits while a VFIO user (the VM) holds the device: the undo, and start-up's repair that
    # replays it, must not hang on it.
    steps = node.steps(unbind_timeout_s=0.3)
    txn = node.transaction(steps)
    steps.expect(txn, node.device())
    steps.bind(txn, node.device())
    let_go = node.kernel.hold_unbind(GPU0, "vfio-pci")
    started = time.monotonic()
    assert f"GPU {GPU0} is stuck leaving the vfio-pci driver" in (txn.rollback() or "")
    assert time.monotonic() - started < 5
    assert steps.unbinding(GPU0) and [a.params["address"] for a in txn.record.actions] == [GPU0]
    assert node.gpulib.probe(node.sim.gpus[1].uuid).uuid == node.sim.gpus[1].uuid  # NVML was never let go for it
    let_go.set()
    until(lambda: not steps.unbinding(GPU0))
    assert txn.rollback() is None
    assert node.pci.function(GPU0).driver == "nvidia" and node.pci.driver_override(GPU0) is None
    assert node.gpulib.probe(node.sim.gpus[0].uuid).uuid == node.sim.gpus[0].uuid


def test_giving_back_a_gpu_this_processs_nvml_did_not_count_starts_nvml_again_and_waits_for_it(node: Node) -> None:
    # A real NVML counts the GPUs the nvidia driver has when it starts: one on vfio-pci then is not counted (its
    # UUID is NOT_FOUND) until NVML starts again, which the unprepare does before it waits for NVML to see the GPU.
    node.sim.nvml_counts_at_init = True
    counts = nvml_counts(node.gpulib)
    steps = PassthroughSteps(
        node.pci,
        nvml_sees=nvml_sees(node.gpulib),
        nvml_counts=counts,
        release=node.gpulib.released,
        return_timeout_s=5,
    )
    gpu0 = node.sim.gpus[0].uuid
    txn = node.transaction(steps)
    steps.expect(txn, node.device())
    steps.bind(txn, node.device())
    # NVML started again after the unbind, with the GPU on vfio-pci: not counted, the others renumbered from 0.
    listed = node.gpulib.gpus()
    assert GPU0 not in [g.pci_bus_id for g in listed] and len(listed) == len(node.sim.gpus) - 1
    assert [g.index for g in listed] == list(range(len(listed)))
    with pytest.raises(NotFound):
        node.gpulib.probe(gpu0)
    assert not counts(gpu0)
    assert txn.rollback() is None
    assert node.pci.function(GPU0).driver == "nvidia"
    assert node.gpulib.gpus()[0].pci_bus_id == GPU0 and counts(gpu0)
    assert node.gpulib.probe(gpu0).uuid == gpu0
