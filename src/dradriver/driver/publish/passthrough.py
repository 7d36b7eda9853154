"""The ResourceSlice devices of VFIO passthrough GPUs (``--passthrough``): NVIDIA's attribute names under our domain.

NVIDIA's driver (``PassthroughSupport``) publishes ``type`` ``vfio``, ``uuid``, ``deviceID``, ``vendorID``,
``productName``, ``iommuFDEnabled``, the standard ``pciBusID``/``pcieRoot``/``numaNode`` and the capacity
``addressableMemory``; we add ``iommuGroup`` and ``iommuGroupShared`` (the group holds other functions, which go
to the VM too). They sit in a slice of their own, so a node without passthrough publishes what it did before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dradriver.driver.prepare.vfio import VFIO_TYPE, PassthroughDevice

STANDARD_DOMAIN = "resource.kubernetes.io"
MAX_DEVICES_PER_SLICE = 128


def passthrough_slice_specs(devices: Sequence[PassthroughDevice], *, iommufd: bool = False) -> list[dict[str, Any]]:
    """The passthrough devices as slice ``spec`` fragments (none when there are none)."""
    built = [passthrough_device(d, iommufd=iommufd) for d in devices]
    return [{"devices": built[i : i + MAX_DEVICES_PER_SLICE]} for i in range(0, len(built), MAX_DEVICES_PER_SLICE)]


def passthrough_device(device: PassthroughDevice, *, iommufd: bool = False) -> dict[str, Any]:
    function = device.function
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": VFIO_TYPE},
        "deviceID": {"string": function.device_id},
        "vendorID": {"string": function.vendor},
        "productName": {"string": device.product_name},
        "iommuFDEnabled": {"bool": iommufd},
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


def _quantity(value: int) -> str:
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20)):
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
