"""What a prepared GPU or MIG device tells about itself: its claim's ``status.devices[].data``, and the
attributes of its KEP-5304 device metadata file.

A user sees which physical device a claim got (``kubectl get resourceclaim -o yaml``) without access to the node:
its UUID, product, for a MIG device the profile and the parent GPU, and how the device is shared. A container reads
the same identity from its metadata file, in the ResourceSlice's attribute names and ``DeviceAttribute`` form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.driver.prepare.vfio import PassthroughGpu
from dradriver.gpu.inventory import GpuDevice, MigPartition

STANDARD_DOMAIN = "resource.kubernetes.io"

#: The sharing a device has when its claim configures none: the claim's containers use it, nobody else does.
EXCLUSIVE = {"strategy": "Exclusive"}


def device_status_data(
    device: GpuDevice | MigPartition, *, admin_access: bool = False, sharing: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``data`` object of one device; ``sharing`` is the device's resolved sharing settings, if any."""
    gpu = device if isinstance(device, GpuDevice) else device.parent
    data: dict[str, Any] = {"uuid": device.uuid, "productName": gpu.info.product_name}
    if isinstance(device, MigPartition):
        data["migProfile"] = device.profile.name
        data["parentUUID"] = gpu.uuid
        data["placement"] = {"start": device.placement.start, "size": device.placement.size}
    data["sharing"] = dict(sharing) if sharing is not None else dict(EXCLUSIVE)
    if admin_access:
        data["adminAccess"] = True
    return data


def device_metadata_attributes(device: GpuDevice | MigPartition) -> dict[str, dict[str, Any]]:
    """The device's identity and placement as attributes, named as in our ResourceSlices."""
    gpu = device if isinstance(device, GpuDevice) else device.parent
    info = gpu.info
    attributes: dict[str, dict[str, Any]] = {"type": {"string": "gpu" if device is gpu else "mig"}}
    if isinstance(device, PassthroughGpu):  # KubeVirt finds a passthrough device by its PCI address (below)
        attributes["type"] = {"string": "vfio"}
        attributes["iommuGroup"] = {"int": device.passthrough.function.iommu_group}
    if device.uuid:
        attributes["uuid"] = {"string": device.uuid}
    if isinstance(device, MigPartition):
        attributes["parentUUID"] = {"string": info.uuid}
        attributes["profile"] = {"string": device.profile.name}
        attributes["placementStart"] = {"int": device.placement.start}
    attributes["productName"] = {"string": info.product_name}
    attributes["architecture"] = {"string": info.architecture}
    attributes[f"{STANDARD_DOMAIN}/pciBusID"] = {"string": info.pci_bus_id}
    if info.pcie_root:
        attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": info.pcie_root}
    if info.numa_node is not None:
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": info.numa_node}
    return attributes
