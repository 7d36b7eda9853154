"""One contract for the GpuLib port, run against NvmlGpuLib on the fake NVML library (several node profiles) and
against NvmlGpuLib on the real NVML library when this machine has a GPU (else skipped, with the reason).

On real hardware the read-only checks always run; the ones that change MIG layout or compute modes run only with
DRADRIVER_GPU_TESTS_MAY_CHANGE_GPUS=1, and fault injection (XIDs, lost GPUs) is simulator-only.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dradriver.gpu.errors import (
    GpuError,
    GpuIsLost,
    InsufficientResources,
    InUse,
    InvalidArgument,
    LibraryNotFound,
    NoPermission,
    NotFound,
    NotSupported,
)
from dradriver.gpu.models import MIB, NO_CLUSTER_UUID, ComputeMode, FabricInfo, FabricState, GpuEvent, NvlinkPeerType
from dradriver.gpu.nvml import BRAND_NAMES, NvmlGpuLib
from dradriver.gpu.products import ARCHITECTURE_NAMES, FABRIC_ARCHITECTURES, load_products
from dradriver.sim.fakelib import SimPciTopology, fake_pynvml, simulated_gpulib
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

SIM_PROFILES = ["dgx-a100-40gb", "hgx-h100-80gb", "h100-nvl-pairs", "mixed"]
MAY_CHANGE_GPUS = "DRADRIVER_GPU_TESTS_MAY_CHANGE_GPUS"

CLUSTER_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# A100/H100-class GPU-instance profiles: real id → (compute slices, memory slices, placement starts).
MIG_SHAPES = {
    19: (1, 1, [0, 1, 2, 3, 4, 5, 6]),
    20: (1, 1, [0, 1, 2, 3, 4, 5, 6]),
    15: (1, 2, [0, 2, 4, 6]),
    14: (2, 2, [0, 2, 4]),
    9: (3, 4, [0, 4]),
    5: (4, 4, [0]),
    0: (7, 8, [0]),
}
P_1G, P_3G = 19, 9


@dataclass
class Backend:
    lib: NvmlGpuLib
    node: SimulatedNode | None  # None on real hardware


def _real_backend() -> Backend:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        pytest.skip(f"real NVML unavailable on this machine ({err}); the contract ran on the simulator only")
    pynvml.nvmlShutdown()
    return Backend(NvmlGpuLib(), None)


@pytest.fixture(params=[*SIM_PROFILES, pytest.param("real-nvml", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "real-nvml":
        chosen = _real_backend()
    else:
        lib, node = simulated_gpulib(request.param)
        chosen = Backend(lib, node)
    yield chosen
    chosen.lib.close()


def may_change(backend: Backend) -> None:
    if backend.node is None and os.environ.get(MAY_CHANGE_GPUS) != "1":
        pytest.skip(f"changes MIG layout / compute modes of real GPUs; set {MAY_CHANGE_GPUS}=1 to allow")


def simulated(backend: Backend) -> SimulatedNode:
    if backend.node is None:
        pytest.skip("needs fault injection, which only the simulator has")
    return backend.node


def mig_ready_gpu(backend: Backend) -> str:
    """A MIG-capable GPU with MIG enabled and no GPU instances (enabling it on the simulator if needed)."""
    lib = backend.lib
    for gpu in lib.gpus():
        if not gpu.mig_capable or lib.gpu_instances(gpu.uuid):
            continue
        if not lib.mig_mode(gpu.uuid).current:
            if backend.node is None:
                continue
            if not lib.set_mig_mode(gpu.uuid, True).current:
                backend.node.reset_gpu(gpu.index)  # what `nvidia-smi -r` does on Ampere
        assert lib.mig_mode(gpu.uuid).current
        return gpu.uuid
    pytest.skip("no MIG-capable GPU with MIG enabled and free on this node")


def non_mig_gpu(backend: Backend) -> str:
    """A GPU running as a whole (MIG absent or disabled)."""
    for gpu in backend.lib.gpus():
        if not gpu.mig_capable or not backend.lib.mig_mode(gpu.uuid).current:
            return gpu.uuid
    pytest.skip("every GPU has MIG enabled")


# --- identity -------------------------------------------------------------------------------------------------


def test_system_reports_driver_and_cuda_versions(backend: Backend) -> None:
    system = backend.lib.system()
    assert re.match(r"^\d+\.\d+(\.\d+)?$", system.driver_version)
    assert system.cuda_driver_version >= 10000
    if backend.node:
        assert (system.driver_version, system.cuda_driver_version) == (
            backend.node.driver_version,
            backend.node.cuda_driver_version,
        )


def test_gpus_report_identity_as_nvml_does(backend: Backend) -> None:
    gpus = backend.lib.gpus()
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    for gpu in gpus:
        assert UUID.match(gpu.uuid) and BUS_ID.match(gpu.pci_bus_id)
        assert gpu.memory_bytes > 0 and gpu.architecture in ARCHITECTURE_NAMES.values()
        assert gpu.brand in BRAND_NAMES.values()
    if backend.node is None:
        return
    products = load_products()
    for gpu, sim_gpu in zip(gpus, backend.node.gpus, strict=True):
        product = products[sim_gpu.product_name]
        major, minor = (int(part) for part in product.compute_capability.split("."))
        assert gpu.uuid == sim_gpu.uuid
        assert gpu.product_name == sim_gpu.product_name  # verbatim, e.g. "NVIDIA H100 80GB HBM3"
        assert gpu.memory_bytes == product.memory_mib * MIB
        assert (gpu.pci_bus_id, gpu.minor) == (sim_gpu.pci_bus_id, sim_gpu.index)
        assert (gpu.numa_node, gpu.pcie_root) == (sim_gpu.numa_node, sim_gpu.pcie_root)
        assert gpu.cuda_compute_capability == (major, minor)
        assert (gpu.architecture, gpu.brand) == (product.architecture, "Nvidia")
        assert (gpu.pci_device_id, gpu.multiprocessors) == (product.pci_device_id, product.multiprocessors)
        assert gpu.mig_capable == product.mig_capable


def test_the_module_id_is_read_where_nvml_answers_and_none_where_not_supported(backend: Backend) -> None:
    # nvmlDeviceGetModuleId answers on HGX/DGX baseboards (FM's physicalId, from 1); NOT_SUPPORTED, 0, or a driver
    # without the call is None, not an error (the GPU is still read).
    gpus = backend.lib.gpus()
    assert all(g.module_id is None or g.module_id >= 1 for g in gpus)
    if backend.node is not None:
        expected = list(range(1, len(gpus) + 1)) if backend.node.profile.nvswitch else [None] * len(gpus)
        assert [g.module_id for g in gpus] == expected


def test_a_driver_without_the_module_id_call_reads_the_gpus_without_one() -> None:
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    nvml = fake_pynvml(node)
    library = nvml.nvmlLib

    class OlderDriver:  # a libnvidia-ml.so.1 without the symbol: pynvml answers FUNCTION_NOT_FOUND
        def __getattr__(self, name: str) -> Any:
            if name == "nvmlDeviceGetModuleId":
                raise AttributeError(name)
            return getattr(library, name)

    nvml.nvmlLib = OlderDriver()
    gpus = NvmlGpuLib(nvml=nvml, pci_topology=SimPciTopology(node)).gpus()
    assert len(gpus) == len(node.gpus) and {g.module_id for g in gpus} == {None}


def test_each_module_id_read_passes_a_c_uint_of_its_own_not_pynvml_s_shared_default() -> None:
    # pynvml's nvmlDeviceGetModuleId(handle, moduleId=c_uint()) writes into one default object shared by every
    # thread: two rescans at once could read each other's module id.
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    nvml = fake_pynvml(node)
    passed: list[Any] = []
    original = nvml.nvmlDeviceGetModuleId

    def recording(handle: Any, *args: Any) -> Any:
        passed.extend(args)
        return original(handle, *args)

    nvml.nvmlDeviceGetModuleId = recording  # type: ignore[attr-defined]
    gpus = NvmlGpuLib(nvml=nvml, pci_topology=SimPciTopology(node)).gpus()
    assert [g.module_id for g in gpus] == list(range(1, len(node.gpus) + 1))
    assert len(passed) == len(node.gpus) and len({id(p) for p in passed}) == len(passed)
    assert all(type(p) is ctypes.c_uint for p in passed)


def test_a_module_id_of_zero_is_none_as_nvidias_driver_reads_it() -> None:
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    node.gpus[0].module_id = 0  # what nvidia-smi -q shows as "Module ID : 0" on some boards
    gpus = NvmlGpuLib(nvml=fake_pynvml(node), pci_topology=SimPciTopology(node)).gpus()
    assert [g.module_id for g in gpus[:2]] == [None, 2]


def test_mig_mode_is_reported_for_mig_gpus_and_not_supported_elsewhere(backend: Backend) -> None:
    for gpu in backend.lib.gpus():
        if gpu.mig_capable:
            state = backend.lib.mig_mode(gpu.uuid)
            if backend.node:
                sim_gpu = backend.node.gpus[gpu.index]
                assert (state.current, state.pending) == (sim_gpu.mig_current, sim_gpu.mig_pending)
        else:
            with pytest.raises(NotSupported, match=f"nvmlDeviceGetMigMode on {gpu.uuid}"):
                backend.lib.mig_mode(gpu.uuid)


def test_mig_profiles_carry_real_ids_placements_and_names(backend: Backend) -> None:
    for gpu in backend.lib.gpus():
        profiles = backend.lib.mig_profiles(gpu.uuid)
        if not gpu.mig_capable:
            assert profiles == []
            continue
        if gpu.architecture in {"Ampere", "Hopper"}:
            assert {0, 5, 9, 14, 19} <= {p.id for p in profiles} <= set(MIG_SHAPES)
        for profile in profiles:
            assert re.match(r"^\dg\.\d+gb(\+me)?$", profile.name)
            assert all(p.size == profile.memory_slices and p.start + p.size <= 8 for p in profile.placements)
            if profile.id in MIG_SHAPES:
                slices, memory_slices, starts = MIG_SHAPES[profile.id]
                assert (profile.slice_count, profile.memory_slices) == (slices, memory_slices)
                assert [p.start for p in profile.placements] == starts
        if backend.node:
            # Names come from NVML's v2 struct where MIG is on and are derived where it is off: both must read
            # exactly as nvidia-smi prints them.
            specs = {s.id: s for s in backend.node.gpus[gpu.index].product.mig_profiles}
            assert {p.id: p.name for p in profiles} == {i: s.name for i, s in specs.items()}
            for profile in profiles:
                spec = specs[profile.id]
                assert (profile.memory_mib, profile.multiprocessors, profile.max_instances) == (
                    spec.memory_mib,
                    spec.sm,
                    spec.max,
                )
                assert (
                    profile.copy_engines,
                    profile.decoders,
                    profile.encoders,
                    profile.jpeg_engines,
                    profile.ofa_engines,
                ) == (spec.ce, spec.dec, spec.enc, spec.jpeg, spec.ofa)


def test_mig_profiles_read_the_same_before_and_after_enabling_mig() -> None:
    lib, _node = simulated_gpulib("hgx-h100-80gb")
    fresh, _ = simulated_gpulib("hgx-h100-80gb")
    uuid = lib.gpus()[0].uuid
    disabled = lib.mig_profiles(uuid)
    fresh.set_mig_mode(uuid, True)
    assert fresh.mig_profiles(uuid) == disabled


# --- MIG lifecycle --------------------------------------------------------------------------------------------


def test_gpu_and_compute_instances_round_trip_into_mig_devices(backend: Backend) -> None:
    may_change(backend)
    lib = backend.lib
    uuid = mig_ready_gpu(backend)
    gi = lib.create_gpu_instance(uuid, P_3G, 4)
    try:
        assert (gi.profile_id, gi.placement.start, gi.placement.size, gi.compute_instances) == (P_3G, 4, 4, ())
        ci = lib.create_compute_instance(uuid, gi.id)
        assert ci.slice_count == 3
        [listed] = lib.gpu_instances(uuid)
        assert (listed.id, listed.compute_instances) == (gi.id, (ci,))
        [device] = lib.mig_devices(uuid)
        assert MIG_UUID.match(device.uuid)
        assert (device.parent_uuid, device.gpu_instance_id, device.compute_instance_id) == (uuid, gi.id, ci.id)
        assert (device.profile.id, device.placement) == (P_3G, gi.placement)
        lib.destroy_compute_instance(uuid, gi.id, ci.id)
    finally:
        lib.destroy_gpu_instance(uuid, gi.id)
    assert lib.gpu_instances(uuid) == [] and lib.mig_devices(uuid) == []


def test_an_occupied_placement_is_insufficient_resources(backend: Backend) -> None:
    may_change(backend)
    uuid = mig_ready_gpu(backend)
    gi = backend.lib.create_gpu_instance(uuid, P_3G, 4)
    try:
        with pytest.raises(InsufficientResources, match=f"nvmlDeviceCreateGpuInstanceWithPlacement on {uuid}"):
            backend.lib.create_gpu_instance(uuid, P_1G, 5)
        with pytest.raises(InsufficientResources):
            backend.lib.create_gpu_instance(uuid, P_3G, 4)
    finally:
        backend.lib.destroy_gpu_instance(uuid, gi.id)


def test_a_start_the_profile_does_not_offer_is_an_invalid_argument(backend: Backend) -> None:
    may_change(backend)
    uuid = mig_ready_gpu(backend)
    with pytest.raises(InvalidArgument):
        backend.lib.create_gpu_instance(uuid, P_3G, 2)
    with pytest.raises(InvalidArgument, match="no MIG profile id 42; known: 19 "):
        backend.lib.create_gpu_instance(uuid, 42, 0)


def test_a_gpu_instance_with_a_compute_instance_is_in_use(backend: Backend) -> None:
    may_change(backend)
    uuid = mig_ready_gpu(backend)
    gi = backend.lib.create_gpu_instance(uuid, P_1G, 0)
    ci = backend.lib.create_compute_instance(uuid, gi.id)
    try:
        with pytest.raises(InUse, match="nvmlGpuInstanceDestroy"):
            backend.lib.destroy_gpu_instance(uuid, gi.id)
    finally:
        backend.lib.destroy_compute_instance(uuid, gi.id, ci.id)
        backend.lib.destroy_gpu_instance(uuid, gi.id)


def test_a_compute_instance_shape_the_gpu_instance_lacks_is_not_supported(backend: Backend) -> None:
    may_change(backend)
    uuid = mig_ready_gpu(backend)
    gi = backend.lib.create_gpu_instance(uuid, P_3G, 0)
    try:
        with pytest.raises(NotSupported, match="no 4-slice compute instance profile"):
            backend.lib.create_compute_instance(uuid, gi.id, slice_count=4)
        assert backend.lib.create_compute_instance(uuid, gi.id, slice_count=1).slice_count == 1
        assert len(backend.lib.gpu_instances(uuid)[0].compute_instances) == 1
    finally:
        for ci in backend.lib.gpu_instances(uuid)[0].compute_instances:
            backend.lib.destroy_compute_instance(uuid, gi.id, ci.id)
        backend.lib.destroy_gpu_instance(uuid, gi.id)


def test_mig_operations_on_a_gpu_with_mig_disabled_are_not_supported(backend: Backend) -> None:
    lib = backend.lib
    uuid = next((g.uuid for g in lib.gpus() if g.mig_capable and not lib.mig_mode(g.uuid).current), None)
    if uuid is None:
        pytest.skip("no MIG-capable GPU with MIG disabled")
    assert lib.gpu_instances(uuid) == [] and lib.mig_devices(uuid) == []
    assert lib.mig_profiles(uuid)  # advertised before MIG is on
    may_change(backend)
    with pytest.raises(NotSupported, match=uuid):
        lib.create_gpu_instance(uuid, P_1G, 0)


def test_pre_existing_mig_devices_are_found() -> None:
    lib, node = simulated_gpulib("mixed")
    devices = lib.mig_devices(lib.gpus()[0].uuid)
    assert [(d.profile.name, d.placement.start, d.placement.size) for d in devices] == [
        ("3g.20gb", 0, 4),
        ("2g.10gb", 4, 2),
        ("1g.5gb", 6, 1),
    ]
    assert [d.uuid for d in devices] == [ci.uuid for _gi, ci in node.mig_devices(0)]


# --- compute mode ---------------------------------------------------------------------------------------------


def test_compute_mode_round_trips_on_a_whole_gpu(backend: Backend) -> None:
    may_change(backend)
    uuid = non_mig_gpu(backend)
    before = backend.lib.compute_mode(uuid)
    try:
        backend.lib.set_compute_mode(uuid, ComputeMode.PROHIBITED)
        assert backend.lib.compute_mode(uuid) == ComputeMode.PROHIBITED
        with pytest.raises(NotSupported, match="nvmlDeviceSetComputeMode"):
            backend.lib.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_THREAD)
    finally:
        backend.lib.set_compute_mode(uuid, before)


def test_compute_mode_is_set_on_mig_devices_when_mig_is_enabled(backend: Backend) -> None:
    may_change(backend)
    lib = backend.lib
    uuid = mig_ready_gpu(backend)
    gi = lib.create_gpu_instance(uuid, P_1G, 0)
    ci = lib.create_compute_instance(uuid, gi.id)
    try:
        [device] = lib.mig_devices(uuid)
        lib.set_compute_mode(device.uuid, ComputeMode.EXCLUSIVE_PROCESS)
        assert lib.compute_mode(device.uuid) == ComputeMode.EXCLUSIVE_PROCESS
        with pytest.raises(NotSupported, match=uuid):
            lib.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
    finally:
        lib.destroy_compute_instance(uuid, gi.id, ci.id)
        lib.destroy_gpu_instance(uuid, gi.id)


# --- NVLink ---------------------------------------------------------------------------------------------------


def test_nvlinks_report_their_peers(backend: Backend) -> None:
    gpus = backend.lib.gpus()
    bus_ids = {g.pci_bus_id for g in gpus}
    for gpu in gpus:
        links = backend.lib.nvlinks(gpu.uuid)
        assert len({link.link for link in links}) == len(links)
        assert all(0 <= link.link < 36 and BUS_ID.match(link.remote_pci_bus_id) for link in links)
        if backend.node is None:
            continue
        profile = backend.node.profile
        product = backend.node.gpus[gpu.index].product
        if profile.nvswitch:
            assert [link.link for link in links] == list(range(product.nvlinks))
            assert {link.remote_type for link in links} == {NvlinkPeerType.SWITCH}
            assert not {link.remote_pci_bus_id for link in links} & bus_ids
        elif product.nvlinks == 0:
            assert links == []
        else:
            partner = _bridge_partner(backend.node, gpu.pci_bus_id)
            assert len(links) == product.nvlinks
            assert {(link.remote_pci_bus_id, link.remote_type) for link in links} == {(partner, NvlinkPeerType.GPU)}


def _bridge_partner(node: SimulatedNode, bus_id: str) -> str:
    for a, b in node.profile.nvlink_bridges:
        pair = (node.profile.gpus[a].pci_bus_id, node.profile.gpus[b].pci_bus_id)
        if bus_id in pair:
            return pair[1] if bus_id == pair[0] else pair[0]
    raise AssertionError(f"{bus_id} has no bridge partner")


# --- NVLink fabric -------------------------------------------------------------------------------------------

CLIQUE_PROFILE = """\
name: gh200-clique
description: two GPUs of a multi-node NVLink clique
nvswitch: true
fabric: {clusterUuid: 6F1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D, cliqueId: 7}
gpus:
  - {product: NVIDIA H100 80GB HBM3, pciBusId: "0000:1b:00.0"}
  - {product: NVIDIA H100 80GB HBM3, pciBusId: "0000:43:00.0"}
"""
SINGLE_NODE_HGX = FabricInfo(
    cluster_uuid=NO_CLUSTER_UUID, clique_id=0, state=FabricState.COMPLETED, status=0, health_mask=0
)


def test_fabric_info_exists_from_hopper_on_and_reads_as_nvml_reports_it(backend: Backend) -> None:
    for gpu in backend.lib.gpus():
        fabric = backend.lib.fabric_info(gpu.uuid)
        if gpu.architecture not in FABRIC_ARCHITECTURES:
            assert fabric is None  # NOT_SUPPORTED before Hopper
            continue
        if fabric is not None:
            assert CLUSTER_UUID.match(fabric.cluster_uuid)
            assert fabric.state in {FabricState.NOT_STARTED, FabricState.IN_PROGRESS, FabricState.COMPLETED}
        if backend.node is not None:
            # Hopper on an NVSwitch board registers (single node: zero cluster UUID); without NVSwitch: no fabric.
            assert fabric == (SINGLE_NODE_HGX if backend.node.profile.nvswitch else None)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("hgx-h100-80gb", SINGLE_NODE_HGX),
        ("hgx-h200", SINGLE_NODE_HGX),
        ("dgx-a100-80gb", None),  # Ampere: NOT_SUPPORTED
        ("h100-nvl-pairs", None),  # Hopper on bridges only: state NOT_SUPPORTED
    ],
)
def test_fabric_info_of_built_in_profiles(profile: str, expected: FabricInfo | None) -> None:
    lib, _ = simulated_gpulib(profile)
    assert {lib.fabric_info(g.uuid) for g in lib.gpus()} == {expected}


def test_fabric_info_of_a_multi_node_clique_carries_its_cluster_uuid_and_clique(
    profile_file: Callable[[str], str],
) -> None:
    lib, _ = simulated_gpulib(profile_file(CLIQUE_PROFILE))
    for gpu in lib.gpus():
        fabric = lib.fabric_info(gpu.uuid)
        assert fabric == FabricInfo(
            cluster_uuid="6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
            clique_id=7,
            state=FabricState.COMPLETED,
            status=0,
            health_mask=0,
        )
        assert fabric.registered and fabric.multi_node
        assert fabric.clique == "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d.7"


def test_a_registration_in_progress_is_read_again_until_it_completes() -> None:
    lib, node = simulated_gpulib("hgx-h100-80gb")
    uuid = lib.gpus()[3].uuid
    node.set_fabric_state(3, FabricState.IN_PROGRESS)
    fabric = lib.fabric_info(uuid)
    assert fabric is not None and (fabric.state, fabric.registered) == (FabricState.IN_PROGRESS, False)
    node.set_fabric_state(3, FabricState.COMPLETED, status=999)  # registration failed
    fabric = lib.fabric_info(uuid)
    assert fabric is not None and (fabric.state, fabric.status, fabric.registered) == (
        FabricState.COMPLETED,
        999,
        False,
    )
    node.set_fabric_state(3, FabricState.COMPLETED)
    assert lib.fabric_info(uuid) == SINGLE_NODE_HGX


def test_a_driver_without_the_v3_struct_is_asked_with_the_v2_one() -> None:
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    nvml = fake_pynvml(node)
    library = nvml.nvmlLib  # the loaded library: C symbols as attributes, as a ctypes.CDLL has them
    versions: list[int] = []

    def v2_only(handle: Any, info: Any) -> int:
        versions.append(info._obj.version)
        return (
            25 if info._obj.version == nvml.nvmlGpuFabricInfo_v3 else library.nvmlDeviceGetGpuFabricInfoV(handle, info)
        )

    class OlderDriver:
        def __getattr__(self, name: str) -> Any:
            return v2_only if name == "nvmlDeviceGetGpuFabricInfoV" else getattr(library, name)

    nvml.nvmlLib = OlderDriver()
    lib = NvmlGpuLib(nvml=nvml, pci_topology=SimPciTopology(node))
    assert lib.fabric_info(lib.gpus()[0].uuid) == SINGLE_NODE_HGX
    assert versions == [nvml.nvmlGpuFabricInfo_v3, nvml.nvmlGpuFabricInfo_v2]


def test_fabric_info_of_a_lost_gpu_fails_with_the_fix() -> None:
    lib, node = simulated_gpulib("hgx-h100-80gb")
    uuid = lib.gpus()[5].uuid
    node.lose_gpu(5)
    with pytest.raises(GpuError, match=f"nvmlDeviceGetGpuFabricInfoV on {uuid}.*drain the node"):
        lib.fabric_info(uuid)


# --- health events --------------------------------------------------------------------------------------------


def test_no_event_within_the_timeout_is_none(backend: Backend) -> None:
    event = backend.lib.wait_for_event(0.05)
    assert event is None or isinstance(event, GpuEvent)  # a real node may have a genuine event queued
    if backend.node:
        assert event is None


def test_an_xid_is_reported_for_its_gpu(backend: Backend) -> None:
    node = simulated(backend)
    gpus = backend.lib.gpus()
    node.inject_xid(1, 79)
    assert backend.lib.wait_for_event(5) == GpuEvent(gpu_uuid=gpus[1].uuid, xid=79)


def test_an_xid_on_a_mig_device_names_its_instances(backend: Backend) -> None:
    node = simulated(backend)
    gpus = backend.lib.gpus()
    node.inject_xid(0, 48, gpu_instance_id=2, compute_instance_id=0)
    node.inject_xid(0, 31)
    assert backend.lib.wait_for_event(5) == GpuEvent(
        gpu_uuid=gpus[0].uuid, xid=48, gpu_instance_id=2, compute_instance_id=0
    )
    assert backend.lib.wait_for_event(5) == GpuEvent(gpu_uuid=gpus[0].uuid, xid=31)


def test_a_lost_gpu_is_reported_and_then_fails_its_calls(backend: Backend) -> None:
    node = simulated(backend)
    gpus = backend.lib.gpus()
    node.lose_gpu(len(gpus) - 1)
    lost = gpus[-1].uuid
    assert backend.lib.wait_for_event(5) == GpuEvent(gpu_uuid=lost, gpu_lost=True)
    with pytest.raises(GpuIsLost, match="drain the node"):
        backend.lib.compute_mode(lost)
    assert backend.lib.compute_mode(gpus[0].uuid) in set(ComputeMode)


def test_events_before_the_gpus_were_enumerated_are_not_reported() -> None:
    lib, node = simulated_gpulib("dgx-a100-40gb")
    node.inject_xid(0, 79)
    lib.gpus()
    assert lib.wait_for_event(0.05) is None


def test_a_double_bit_ecc_error_is_reported_and_counted(backend: Backend) -> None:
    node = simulated(backend)
    gpus = backend.lib.gpus()
    node.inject_ecc(1, 4)
    assert backend.lib.wait_for_event(5) == GpuEvent(gpu_uuid=gpus[1].uuid, ecc_double_bit=True)
    assert backend.lib.probe(gpus[1].uuid).ecc_uncorrected_volatile == 4
    node.reset_gpu(1)
    assert backend.lib.probe(gpus[1].uuid).ecc_uncorrected_volatile == 0


def test_a_probe_of_a_lost_gpu_fails_and_succeeds_again_after_a_reset() -> None:
    lib, node = simulated_gpulib("dgx-a100-40gb")
    uuid = lib.gpus()[2].uuid
    node.lose_gpu(2)
    assert lib.wait_for_event(5) == GpuEvent(gpu_uuid=uuid, gpu_lost=True)
    with pytest.raises(GpuIsLost):
        lib.probe(uuid)
    node.reset_gpu(2)
    assert lib.probe(uuid).ecc_uncorrected_volatile == 0
    node.lose_gpu(2)  # watched again: a second loss is reported too
    assert lib.wait_for_event(5) == GpuEvent(gpu_uuid=uuid, gpu_lost=True)


def test_a_gpu_lost_before_enumeration_is_skipped_and_read_once_it_answers(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    admin = SimulatedNode(load_node_profile("dgx-a100-40gb"), state_path=state)
    admin.lose_gpu(3)
    lib, _ = simulated_gpulib("dgx-a100-40gb", state_path=state)
    assert len(lib.gpus()) == 7
    assert [u.index for u in lib.unreadable_gpus()] == [3]
    admin.reset_gpu(3)
    assert [g.index for g in lib.gpus()] == list(range(8))
    assert lib.unreadable_gpus() == []
    admin.inject_xid(3, 79)
    assert lib.wait_for_event(5) == GpuEvent(gpu_uuid=lib.gpus()[3].uuid, xid=79)
    lib.close()


def test_an_unattributable_loss_is_a_gpu_is_lost_error() -> None:
    lib, node = simulated_gpulib("dgx-a100-40gb")
    lib.gpus()
    node.lose_gpu(2, attributable=False)
    with pytest.raises(GpuIsLost, match="which one is unknown"):
        lib.wait_for_event(5)


# --- errors ---------------------------------------------------------------------------------------------------


def test_nvml_errors_name_the_device_and_the_call(backend: Backend) -> None:
    missing = "GPU-00000000-0000-0000-0000-000000000000"
    with pytest.raises(NotFound, match=f"nvmlDeviceGetHandleByUUID on {missing}"):
        backend.lib.compute_mode(missing)
    mig_on = next((g.uuid for g in backend.lib.gpus() if g.mig_capable and backend.lib.mig_mode(g.uuid).current), None)
    if mig_on is not None:
        with pytest.raises(NotFound, match=f"nvmlDeviceGetGpuInstanceById on {mig_on}"):
            backend.lib.destroy_gpu_instance(mig_on, 63)


def test_an_unprivileged_caller_gets_no_permission_with_the_fix() -> None:
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"), privileged=False)
    lib = NvmlGpuLib(nvml=fake_pynvml(node), pci_topology=SimPciTopology(node))
    uuid = lib.gpus()[0].uuid
    with pytest.raises(NoPermission, match=r"nvmlDeviceSetMigMode on GPU-.*run the driver as root"):
        lib.set_mig_mode(uuid, True)


def test_real_nvml_without_a_driver_is_library_not_found_with_the_fix() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        if err.value != pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            pytest.skip(f"NVML fails differently here: {err}")
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has libnvidia-ml")
    with pytest.raises(LibraryNotFound) as caught:
        NvmlGpuLib()
    assert "NVML library not found: install the NVIDIA driver or use --gpu-backend sim" in str(caught.value)
    assert "\n" not in str(caught.value)


# --- restart --------------------------------------------------------------------------------------------------


def test_a_restarted_driver_finds_the_mig_devices_and_compute_modes_it_left(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    lib, _ = simulated_gpulib("hgx-h100-80gb", state_path=state)
    uuid = lib.gpus()[2].uuid
    lib.set_mig_mode(uuid, True)
    gi = lib.create_gpu_instance(uuid, P_3G, 0)
    lib.create_compute_instance(uuid, gi.id)
    [device] = lib.mig_devices(uuid)
    lib.set_compute_mode(device.uuid, ComputeMode.PROHIBITED)
    lib.close()

    again, _ = simulated_gpulib("hgx-h100-80gb", state_path=state)
    assert again.mig_devices(uuid) == [device]
    assert again.compute_mode(device.uuid) == ComputeMode.PROHIBITED
    assert again.mig_mode(uuid).current


# --- usage ------------------------------------------------------------------------------------------------------


def test_usage_of_a_whole_gpu_reports_every_figure_as_nvml_does(backend: Backend) -> None:
    uuid = non_mig_gpu(backend)
    usage = backend.lib.usage(uuid)
    assert usage.uuid == uuid
    assert usage.utilization_percent is not None and 0 <= usage.utilization_percent <= 100
    assert usage.memory_total_bytes is not None and usage.memory_used_bytes is not None
    assert 0 < usage.memory_used_bytes <= usage.memory_total_bytes  # the driver itself holds a little
    assert usage.temperature_celsius is not None and 0 < usage.temperature_celsius < 120
    assert usage.power_watts is not None and usage.power_watts > 0
    assert all(p.pid > 0 and p.gpu_instance_id is None for p in usage.processes)


def test_usage_of_a_mig_device_has_memory_but_no_utilization_temperature_or_power(backend: Backend) -> None:
    may_change(backend)
    lib = backend.lib
    uuid = mig_ready_gpu(backend)
    gi = lib.create_gpu_instance(uuid, P_1G, 0)
    try:
        lib.create_compute_instance(uuid, gi.id)
        [device] = lib.mig_devices(uuid)
        usage = lib.usage(device.uuid)
        assert (usage.utilization_percent, usage.temperature_celsius, usage.power_watts) == (None, None, None)
        assert usage.memory_total_bytes is not None and usage.memory_total_bytes > 0
        assert lib.usage(uuid).utilization_percent is None  # a GPU in MIG mode reports none either
        lib.destroy_compute_instance(uuid, gi.id, device.compute_instance_id)
    finally:
        lib.destroy_gpu_instance(uuid, gi.id)
