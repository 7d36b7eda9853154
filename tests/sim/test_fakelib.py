"""The fake NVML library at pynvml's C boundary: NVML's calling conventions and return codes, seen through pynvml."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

import pynvml
import pytest

from dradriver.gpu.models import MIB
from dradriver.gpu.products import load_products
from dradriver.sim.fakelib import FakeNvmlLibrary, fake_pynvml
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


def loaded(profile: str = "mixed") -> tuple[ModuleType, SimulatedNode]:
    node = SimulatedNode(load_node_profile(profile))
    nvml = fake_pynvml(node)
    nvml.nvmlInit()
    return nvml, node


def code_of(nvml: Any, call: Any) -> int:
    with pytest.raises(nvml.NVMLError) as caught:
        call()
    return int(caught.value.value)


def test_each_copy_is_private_and_the_real_pynvml_is_untouched() -> None:
    a, _ = loaded()
    b, _ = loaded("hgx-h200")
    assert a.nvmlDeviceGetName(a.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A100-SXM4-40GB"
    assert b.nvmlDeviceGetName(b.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H200"
    assert a.NVMLError is not pynvml.NVMLError
    assert pynvml.nvmlLib is None or not hasattr(pynvml.nvmlLib, "node")


def test_calls_before_init_are_uninitialized_as_in_nvml() -> None:
    nvml = fake_pynvml(SimulatedNode(load_node_profile("mixed")))
    assert code_of(nvml, nvml.nvmlDeviceGetCount) == nvml.NVML_ERROR_UNINITIALIZED
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 6
    nvml.nvmlShutdown()
    assert code_of(nvml, nvml.nvmlDeviceGetCount) == nvml.NVML_ERROR_UNINITIALIZED


def test_a_symbol_the_fake_lacks_is_function_not_found() -> None:
    nvml, _ = loaded()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert code_of(nvml, lambda: nvml.nvmlDeviceGetFanSpeed(handle)) == nvml.NVML_ERROR_FUNCTION_NOT_FOUND


def test_pci_info_uses_nvml_spelling_and_handles_are_found_by_either_bus_id_form() -> None:
    nvml, _ = loaded()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    info = nvml.nvmlDeviceGetPciInfo(handle)
    assert (info.busId, info.busIdLegacy, info.bus) == ("00000000:0F:00.0", "0000:0F:00.0", 0x0F)
    assert info.pciDeviceId == 0x20B010DE
    for form in ("00000000:0F:00.0", "0000:0f:00.0"):
        found = nvml.nvmlDeviceGetHandleByPciBusId(form)
        assert nvml.nvmlDeviceGetUUID(found) == nvml.nvmlDeviceGetUUID(handle)


def test_memory_info_totals_the_product_memory() -> None:
    nvml, _ = loaded()
    memory = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(4))
    assert memory.total == load_products()["NVIDIA L4"].memory_mib * MIB
    assert 0 < memory.used < MIB * 16 and memory.free == memory.total - memory.used


def test_mig_mode_on_a_gpu_without_mig_is_not_supported() -> None:
    nvml, _ = loaded()
    l4 = nvml.nvmlDeviceGetHandleByIndex(4)
    assert code_of(nvml, lambda: nvml.nvmlDeviceGetMigMode(l4)) == nvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0)) == [1, 1]


def test_versioned_profile_info_needs_mig_enabled_while_v1_always_answers() -> None:
    nvml, _ = loaded()
    disabled = nvml.nvmlDeviceGetHandleByIndex(1)
    enabled = nvml.nvmlDeviceGetHandleByIndex(0)
    one_slice = nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert (
        code_of(nvml, lambda: nvml.nvmlDeviceGetGpuInstanceProfileInfo(disabled, one_slice))
        == nvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(disabled, one_slice, version=1).id == 19
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(enabled, nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
    assert (info.id, info.name, info.memorySizeMB) == (20, "MIG 1g.5gb+me", 4864)


def test_profile_enums_the_product_lacks_or_past_the_end_are_skippable_errors() -> None:
    nvml, _ = loaded()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert (
        code_of(nvml, lambda: nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE))
        == nvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert (
        code_of(nvml, lambda: nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT))
        == nvml.NVML_ERROR_INVALID_ARGUMENT
    )


def test_placements_answer_a_count_query_and_refuse_a_short_buffer_even_with_mig_disabled() -> None:
    nvml, _ = loaded()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)  # MIG disabled
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 15, None, ctypes.byref(count))
    assert count.value == 4
    short = (nvml.c_nvmlGpuInstancePlacement_t * 2)()
    count = ctypes.c_uint(2)
    assert (
        code_of(nvml, lambda: nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 15, short, ctypes.byref(count)))
        == nvml.NVML_ERROR_INSUFFICIENT_SIZE
    )
    buffer = (nvml.c_nvmlGpuInstancePlacement_t * 8)()
    count = ctypes.c_uint(8)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 15, buffer, ctypes.byref(count))
    assert [(buffer[i].start, buffer[i].size) for i in range(count.value)] == [(0, 2), (2, 2), (4, 2), (6, 2)]


def test_a_destroyed_gpu_instance_handle_is_invalid_even_when_its_id_is_reused() -> None:
    nvml, _ = loaded("hgx-h100-80gb")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, 1)
    placement = nvml.c_nvmlGpuInstancePlacement_t(0, 1)
    old = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
    old_id = nvml.nvmlGpuInstanceGetInfo(old).id
    nvml.nvmlGpuInstanceDestroy(old)
    new = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
    assert nvml.nvmlGpuInstanceGetInfo(new).id == old_id
    assert code_of(nvml, lambda: nvml.nvmlGpuInstanceGetInfo(old)) == nvml.NVML_ERROR_INVALID_ARGUMENT


def test_the_handle_registry_forgets_destroyed_instances_and_their_handles_stay_invalid() -> None:
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    nvml: Any = fake_pynvml(node)
    library = FakeNvmlLibrary(node, nvml, prune_handles_at=16)
    nvml.nvmlLib = library.symbols
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, 1)
    placement = nvml.c_nvmlGpuInstancePlacement_t(0, 1)
    first = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
    nvml.nvmlGpuInstanceDestroy(first)
    for _ in range(200):
        created = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
        nvml.nvmlEventSetFree(nvml.nvmlEventSetCreate())
        nvml.nvmlGpuInstanceDestroy(created)
    assert library.handle_count <= 16
    assert code_of(nvml, lambda: nvml.nvmlGpuInstanceGetInfo(first)) == nvml.NVML_ERROR_INVALID_ARGUMENT
    live = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
    assert nvml.nvmlGpuInstanceGetInfo(live).profileId == 19


def test_mig_device_handles_answer_device_queries_for_the_mig_device() -> None:
    nvml, node = loaded()
    parent = nvml.nvmlDeviceGetHandleByIndex(0)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    gi, ci = node.mig_devices(0)[0]
    assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert nvml.nvmlDeviceGetUUID(mig) == ci.uuid
    assert nvml.nvmlDeviceGetMemoryInfo(mig).total == gi.profile.memory_mib * MIB
    assert nvml.nvmlDeviceGetAttributes(mig).multiprocessorCount == 42
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == node.gpus[0].uuid
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(ci.uuid)) == ci.uuid
    assert code_of(nvml, lambda: nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)) == nvml.NVML_ERROR_NOT_FOUND
    assert code_of(nvml, lambda: nvml.nvmlDeviceGetAttributes(parent)) == nvml.NVML_ERROR_NOT_SUPPORTED


def test_events_need_registration_and_a_lost_gpu_ends_the_wait_with_gpu_is_lost() -> None:
    nvml, node = loaded("dgx-a100-40gb")
    event_set = nvml.nvmlEventSetCreate()
    handle = nvml.nvmlDeviceGetHandleByIndex(5)
    node.inject_xid(5, 13)  # before registration: never delivered
    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    node.inject_xid(4, 13)  # another GPU, not registered
    node.inject_xid(5, 94)
    data = nvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventType, data.eventData, data.gpuInstanceId) == (nvml.nvmlEventTypeXidCriticalError, 94, 0xFFFFFFFF)
    assert nvml.nvmlDeviceGetUUID(data.device) == node.gpus[5].uuid
    assert code_of(nvml, lambda: nvml.nvmlEventSetWait_v2(event_set, 10)) == nvml.NVML_ERROR_TIMEOUT
    node.lose_gpu(5)
    assert code_of(nvml, lambda: nvml.nvmlEventSetWait_v2(event_set, 1000)) == nvml.NVML_ERROR_GPU_IS_LOST
    assert code_of(nvml, lambda: nvml.nvmlDeviceGetUUID(handle)) == nvml.NVML_ERROR_GPU_IS_LOST


def test_fabric_info_fills_the_versioned_struct_and_refuses_an_unknown_version() -> None:
    nvml, _ = loaded("hgx-h100-80gb")
    handle = nvml.nvmlDeviceGetHandleByIndex(2)
    v3 = nvml.c_nvmlGpuFabricInfo_v3_t()  # pynvml's constructor sets version = nvmlGpuFabricInfo_v3
    assert nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v3)) == nvml.NVML_SUCCESS
    assert (bytes(v3.clusterUuid), v3.cliqueId) == (bytes(16), 0)
    assert (v3.state, v3.status, v3.healthMask) == (nvml.NVML_GPU_FABRIC_STATE_COMPLETED, nvml.NVML_SUCCESS, 0)
    v2 = nvml.c_nvmlGpuFabricInfo_v2_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v2))
    assert v2.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
    v2.version = 0x01000024
    assert (
        code_of(nvml, lambda: nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v2)))
        == nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )


def test_fabric_info_is_not_supported_before_hopper_and_a_state_without_nvswitch() -> None:
    ampere, _ = loaded("dgx-a100-80gb")
    info = ampere.c_nvmlGpuFabricInfo_v3_t()
    assert (
        code_of(
            ampere, lambda: ampere.nvmlDeviceGetGpuFabricInfoV(ampere.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
        )
        == ampere.NVML_ERROR_NOT_SUPPORTED
    )
    pairs, _ = loaded("h100-nvl-pairs")
    info = pairs.c_nvmlGpuFabricInfo_v3_t()
    pairs.nvmlDeviceGetGpuFabricInfoV(pairs.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert info.state == pairs.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


def test_an_injected_fault_fails_the_named_call_the_given_number_of_times_and_changes_nothing() -> None:
    from dradriver.gpu.errors import InsufficientResources
    from dradriver.sim.fakelib import simulated_gpulib_on

    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    gpulib = simulated_gpulib_on(node)
    uuid = node.gpus[0].uuid
    gpulib.set_mig_mode(uuid, True)
    node.inject_fault("nvmlDeviceCreateGpuInstanceWithPlacement", 23, times=2)
    for _ in range(2):
        with pytest.raises(InsufficientResources, match="nvmlDeviceCreateGpuInstanceWithPlacement"):
            gpulib.create_gpu_instance(uuid, 19, 3)
    assert node.gpus[0].gpu_instances == {}
    gi = gpulib.create_gpu_instance(uuid, 19, 3)
    ci = gpulib.create_compute_instance(uuid, gi.id)
    mig = gpulib.mig_device(uuid, gi.id, ci.id)
    assert mig.uuid.startswith("MIG-") and mig.placement.start == 3 and len(mig.capability_nodes) == 2
    node.inject_fault("nvmlDeviceGetUUID")
    node.clear_faults()
    assert gpulib.mig_device(uuid, gi.id, ci.id) == mig
    gpulib.close()


def test_a_gpu_reset_applies_a_pending_mig_mode_on_ampere() -> None:
    from dradriver.sim.fakelib import simulated_gpulib_on

    node = SimulatedNode(load_node_profile("dgx-a100-40gb"))
    gpulib = simulated_gpulib_on(node)
    uuid = node.gpus[0].uuid
    state = gpulib.set_mig_mode(uuid, True)
    assert not state.current and state.pending
    gpulib.reset_gpu(uuid)
    assert gpulib.mig_mode(uuid).current
    gpulib.close()
