"""What a prepared GPU or MIG device reports in its claim's ``status.devices[].data``.

A user sees which physical device a claim got (``kubectl get resourceclaim -o yaml``) without access to the node:
its UUID, product, for a MIG device the profile and the parent GPU, and how the device is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.gpu.inventory import GpuDevice, MigPartition

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
