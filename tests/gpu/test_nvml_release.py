"""NvmlGpuLib.released() on the simulator, whose NVML ends every handle at its shutdown as a real one does: an
operation that spans a release runs again in the new session, a start that fails leaves no stale inventory, and
what opens the GPUs outside NVML (nvidia-smi) is kept out of the release window."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dradriver.gpu.errors import GpuError, NvmlReleased
from dradriver.gpu.models import DeviceNode
from dradriver.gpu.nvml import NvmlGpuLib
from dradriver.sim.fakelib import SimGpuReset, SimMigCapabilities, SimPciTopology, SimTimeslice, fake_pynvml
from dradriver.sim.node import UNKNOWN, SimulatedNode
from dradriver.sim.profiles import load_node_profile

P_1G = 19  # MIG 1g.10gb on an H100 80GB


class ReleasingCapabilities(SimMigCapabilities):
    """MIG capability nodes that, once armed, let NVML go (a passthrough unbind elsewhere) while they are read:
    between two NVML calls of the method that asks for them."""

    def __init__(self) -> None:
        self.lib: NvmlGpuLib | None = None
        self.releases = 0

    def device_nodes(self, gpu_minor: int, gi_id: int, ci_id: int) -> tuple[DeviceNode, ...]:
        if self.lib is not None and self.releases == 0:
            self.releases += 1
            with self.lib.released():
                pass
        return super().device_nodes(gpu_minor, gi_id, ci_id)


def make_lib(
    node: SimulatedNode,
    *,
    capabilities: SimMigCapabilities | None = None,
    gpu_reset: Callable[[str], None] | None = None,
) -> NvmlGpuLib:
    return NvmlGpuLib(
        nvml=fake_pynvml(node),
        pci_topology=SimPciTopology(node),
        mig_capabilities=capabilities or SimMigCapabilities(),
        gpu_reset=gpu_reset or SimGpuReset(node),
        timeslice_setter=SimTimeslice(node),
    )


@pytest.fixture
def node() -> SimulatedNode:
    return SimulatedNode(load_node_profile("hgx-h100-80gb"))


@pytest.fixture
def lib(node: SimulatedNode) -> Iterator[NvmlGpuLib]:
    lib = make_lib(node)
    yield lib
    lib.close()


def until(condition: Callable[[], bool], *, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_handle_kept_across_a_shutdown_is_refused_by_the_simulated_nvml(node: SimulatedNode) -> None:
    pynvml = fake_pynvml(node)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetUUID(handle)
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == node.gpus[0].uuid
    finally:
        pynvml.nvmlShutdown()


def test_an_operation_that_spans_a_release_runs_again_with_the_new_sessions_handles(node: SimulatedNode) -> None:
    capabilities = ReleasingCapabilities()
    lib = make_lib(node, capabilities=capabilities)
    try:
        uuid = lib.gpus()[0].uuid
        if not lib.set_mig_mode(uuid, True).current:
            node.reset_gpu(0)
        created = [lib.create_gpu_instance(uuid, P_1G, start) for start in (0, 1)]
        for gi in created:
            lib.create_compute_instance(uuid, gi.id)
        expected = lib.mig_devices(uuid)
        assert len(expected) == 2
        capabilities.lib = lib  # the next read of capability nodes lets NVML go, mid-way through mig_devices
        assert lib.mig_devices(uuid) == expected  # not one MIG device short, and no stale handle error
        assert capabilities.releases == 1
        assert lib.usage(uuid).uuid == uuid
    finally:
        lib.close()


def test_a_failed_start_after_a_release_lists_no_stale_gpus_and_the_next_release_and_close_work(
    node: SimulatedNode, lib: NvmlGpuLib
) -> None:
    before = lib.gpus()
    node.inject_fault("nvmlInitWithFlags", UNKNOWN, times=3)  # the restart after the block, and the next two calls'
    with lib.released():
        pass
    with pytest.raises(NvmlReleased, match="could not be started again"):
        lib.gpus()
    with pytest.raises(NvmlReleased):
        lib.probe(before[0].uuid)
    assert node.nvml_sessions == 0
    with lib.released():  # nothing to shut down: NVML is not running
        assert node.nvml_sessions == 0
    assert lib.gpus() == before
    node.inject_fault("nvmlInitWithFlags", UNKNOWN)
    with lib.released():
        pass
    lib.close()  # NVML is not running: closing shuts nothing down, and says nothing
    assert node.nvml_sessions == 0


def test_a_release_nested_in_one_of_the_same_thread_starts_nvml_once_at_the_end(
    node: SimulatedNode, lib: NvmlGpuLib
) -> None:
    lib.gpus()
    with lib.released():
        with lib.released():
            assert node.nvml_sessions == 0
        assert node.nvml_sessions == 0  # the inner block's end does not start NVML within the outer one
        with pytest.raises(NvmlReleased):
            lib.gpus()  # nor does a call of the releasing thread itself
        assert node.nvml_sessions == 0
    assert node.nvml_sessions == 1
    assert len(lib.gpus()) == len(node.gpus)


def test_nvidia_smi_runs_outside_a_release_and_not_while_nvml_is_let_go(node: SimulatedNode) -> None:
    entered, let_finish = threading.Event(), threading.Event()
    in_reset: list[bool] = []
    reset = SimGpuReset(node)

    def slow_reset(uuid: str) -> None:
        in_reset.append(True)
        entered.set()
        let_finish.wait(10)
        reset(uuid)
        in_reset.pop()

    lib = make_lib(node, gpu_reset=slow_reset)
    try:
        uuid = lib.gpus()[1].uuid
        resetting = threading.Thread(target=lib.reset_gpu, args=(uuid,), daemon=True)
        resetting.start()
        assert entered.wait(10)
        seen: list[bool] = []

        def release() -> None:
            with lib.released():
                seen.append(bool(in_reset))

        releasing = threading.Thread(target=release, daemon=True)
        releasing.start()
        releasing.join(0.3)
        assert releasing.is_alive()  # the release waits for nvidia-smi, whose process holds every GPU open
        let_finish.set()
        resetting.join(10)
        releasing.join(10)
        assert seen == [False]
    finally:
        lib.close()


def test_nvidia_smi_is_refused_while_nvml_cannot_start(node: SimulatedNode, lib: NvmlGpuLib) -> None:
    uuid = lib.gpus()[0].uuid
    node.inject_fault("nvmlInitWithFlags", UNKNOWN, times=3)
    with lib.released():
        pass
    with pytest.raises(NvmlReleased):
        lib.reset_gpu(uuid)  # one failed start at the call, then refused: nvidia-smi would open every GPU
    with pytest.raises(NvmlReleased):
        lib.set_timeslice(uuid, 1)


def test_a_release_from_inside_an_nvml_call_of_the_same_thread_is_refused_not_a_deadlock(
    node: SimulatedNode,
) -> None:
    holder: list[NvmlGpuLib] = []
    errors: list[BaseException] = []

    def reset_that_releases(_uuid: str) -> None:
        try:
            with holder[0].released():
                pass
        except RuntimeError as err:
            errors.append(err)

    lib = make_lib(node, gpu_reset=reset_that_releases)
    holder.append(lib)
    try:
        lib.reset_gpu(lib.gpus()[0].uuid)
        [error] = errors
        assert "inside an NVML call" in str(error)
        assert node.nvml_sessions == 1 and lib.gpus()
    finally:
        lib.close()


def test_gpu_errors_stay_gpu_errors(lib: NvmlGpuLib) -> None:
    assert issubclass(NvmlReleased, GpuError)
    with pytest.raises(GpuError):
        lib.probe("GPU-00000000-0000-0000-0000-000000000000")
