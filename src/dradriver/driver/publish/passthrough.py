"""The ResourceSlice devices of VFIO passthrough GPUs (``--passthrough``): NVIDIA's attribute names under our domain.

NVIDIA's driver (``PassthroughSupport``) publishes ``type`` ``vfio``, ``uuid``, ``deviceID``, ``vendorID``,
``productName``, ``iommuFDEnabled``, the standard ``pciBusID``/``pcieRoot``/``numaNode`` and the capacity
``addressableMemory``; we add ``iommuGroup`` and ``iommuGroupShared`` (the group holds other functions, which go
to the VM too). They sit in slices of their own, so a node without passthrough publishes what it did before.

A passthrough device and its GPU are one piece of hardware: ``share_gpu_counters`` makes them consume the same
counter set (the GPU's dynamic-MIG set, or one made for it), so the scheduler never allocates both at once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from dradriver.driver.prepare.vfio import NAME_SUFFIX, VFIO_TYPE, PassthroughDevice
from dradriver.validation.slices import SliceShape

STANDARD_DOMAIN = "resource.kubernetes.io"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
#: The counter of a set made for a GPU that has none (no dynamic MIG): the whole GPU and its passthrough device
#: consume all of it, each MIG device (static) one.
DEVICES_COUNTER = "devices"


def passthrough_slice_specs(devices: Sequence[PassthroughDevice]) -> list[dict[str, Any]]:
    """The passthrough devices as slice ``spec`` fragments (none when there are none)."""
    built = [passthrough_device(d) for d in devices]
    return [{"devices": built[i : i + MAX_DEVICES_PER_SLICE]} for i in range(0, len(built), MAX_DEVICES_PER_SLICE)]


def passthrough_device(device: PassthroughDevice) -> dict[str, Any]:
    """One passthrough device; ``iommuFDEnabled`` says the node offers IOMMUFD (``/dev/iommu``), which a claim's
    ``VfioDeviceConfig`` may prefer (``iommu.backendPolicy: PreferIommuFD``)."""
    function = device.function
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": VFIO_TYPE},
        "deviceID": {"string": function.device_id},
        "vendorID": {"string": function.vendor},
        "productName": {"string": device.product_name},
        "iommuFDEnabled": {"bool": device.iommufd},
        "iommuGroup": {"int": int(function.iommu_group or 0)},
        "iommuGroupShared": {"bool": device.group_shared},
        f"{STANDARD_DOMAIN}/pciBusID": {"string": device.address},
    }
    result: dict[str, Any] = {"name": device.name, "attributes": attributes}
    if device.gpu is not None:
        info = device.gpu.info
        attributes["uuid"] = {"string": info.uuid}
        if info.pcie_root:
            attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": info.pcie_root}
        if info.numa_node is not None:
            attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": info.numa_node}
        result["capacity"] = {"addressableMemory": {"value": _quantity(info.memory_bytes)}}
    return result


def share_gpu_counters(
    gpu_specs: list[dict[str, Any]], vfio_specs: list[dict[str, Any]], *, shape: SliceShape
) -> list[dict[str, Any]]:
    """The pool's slices with each passthrough device consuming the same counters as its whole GPU.

    A GPU with a dynamic-MIG counter set lends it as it is; any other GPU gets a set ``<gpu>-counters`` with one
    counter, ``devices``, as many as its MIG devices (at least 1), which the whole GPU and the passthrough device
    consume entirely and each MIG device by one. The new sets go in slices of their own, as 1.35 and later keep
    counter sets; slices whose devices now consume counters hold at most 64. Devices shared by several claims
    (``allowMultipleAllocations``) are left as they are. The 1.34 shape (sets inline with their devices) is
    returned unchanged: there prepare alone keeps the two apart. Without passthrough devices nothing changes.
    """
    if not vfio_specs or shape is not SliceShape.V1_35:
        return gpu_specs + vfio_specs
    gpu_specs = copy.deepcopy(gpu_specs)
    by_name = {d["name"]: d for spec in gpu_specs for d in spec.get("devices", ())}
    new_sets: list[dict[str, Any]] = []
    vfio_devices = [copy.deepcopy(d) for spec in vfio_specs for d in spec.get("devices", ())]
    for vfio in vfio_devices:
        gpu_name = vfio["name"].removesuffix(NAME_SUFFIX)
        whole = by_name.get(gpu_name)
        if whole is not None and whole.get("consumesCounters"):
            vfio["consumesCounters"] = copy.deepcopy(whole["consumesCounters"])
            continue
        counter_set = f"{gpu_name}-counters"
        migs = [d for name, d in by_name.items() if name.startswith(f"{gpu_name}-mig-")]
        total = max(1, len(migs))
        new_sets.append({"name": counter_set, "counters": {DEVICES_COUNTER: {"value": str(total)}}})
        for device, amount in [(whole, total), *((m, 1) for m in migs), (vfio, total)]:
            if device is not None and not device.get("allowMultipleAllocations"):
                device["consumesCounters"] = [
                    {"counterSet": counter_set, "counters": {DEVICES_COUNTER: {"value": str(amount)}}}
                ]
    counter_slices = [
        {"sharedCounters": new_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]}
        for i in range(0, len(new_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    return counter_slices + _rechunked(gpu_specs) + _rechunked([{"devices": vfio_devices}])


def _rechunked(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``specs`` with every device slice in which a device consumes counters split to at most 64 devices."""
    result: list[dict[str, Any]] = []
    for spec in specs:
        devices = spec.get("devices")
        if (
            not devices
            or len(devices) <= MAX_DEVICES_WITH_COUNTERS
            or not any(d.get("consumesCounters") for d in devices)
        ):
            result.append(spec)
            continue
        step = MAX_DEVICES_WITH_COUNTERS
        result.extend({**spec, "devices": devices[i : i + step]} for i in range(0, len(devices), step))
    return result


def _quantity(value: int) -> str:
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20)):
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
