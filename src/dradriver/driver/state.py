"""The GPU driver behind the kubelet plugin: prepare and unprepare claims for this node's GPUs.

Prepare reads as its recipe: find our allocated devices in the claim, resolve each to a GPU or MIG device of this
node, write the claim's CDI spec, report the CDI ids. Everything a claim gets is derived from the claim and the
node's stable device names, so a repeated prepare (a kubelet retry, or after a driver restart) returns exactly the
same ids. Carving MIG partitions, sharing and a checkpoint of side effects arrive with dynamic MIG support.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.driver.cdi import CdiWriter, ClaimSpec, cdi_device
from dradriver.driver.device_status import device_metadata_attributes, device_status_data
from dradriver.errors import ClaimError, DradriverError
from dradriver.gpu.inventory import GpuDevice, Inventory, MigMode, MigPartition
from dradriver.gpu.models import DeviceNode
from dradriver.plugin.handler import ClaimRef, PreparedDevice, PrepareResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of ``status.allocation.devices.results`` that belongs to this driver."""

    request: str
    pool: str
    device: str
    admin_access: bool = False


class GpuDriver:
    """Implements the plugin layer's ``DriverHandler`` for NVIDIA GPUs."""

    def __init__(
        self,
        *,
        driver_name: str,
        pool: str,
        inventory: Inventory,
        mig_mode: MigMode,
        cdi: CdiWriter,
        device_problem: Callable[[str], str | None] | None = None,
    ) -> None:
        """``device_problem`` says why a device must not be given to a new claim (its health: cause and time),
        or None when it may; consulted for each device of a claim that is not prepared yet."""
        self.driver_name = driver_name
        self.pool = pool
        self.cdi = cdi
        self._device_problem = device_problem
        self._lock = threading.Lock()
        self._prepare_lock = threading.Lock()
        self._devices: dict[str, GpuDevice | MigPartition] = {}
        self.update_inventory(inventory, mig_mode)

    def update_inventory(self, inventory: Inventory, mig_mode: MigMode) -> None:
        """Use a fresh inventory (after rediscovery) for later prepares."""
        devices = {d.name: d for d in inventory.devices(mig_mode)}
        with self._lock:
            self._devices = devices

    # --- DriverHandler ------------------------------------------------------------------------------------

    def prepare_resource_claims(self, claims: Sequence[Mapping[str, Any]]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            uid = str(claim["metadata"]["uid"])
            try:
                results[uid] = PrepareResult(devices=self.prepare(claim))
            except DradriverError as err:
                log.warning("prepare failed claim=%s error=%s", uid, err)
                results[uid] = PrepareResult(error=str(err))
        return results

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        results: dict[str, str | None] = {}
        for ref in claims:
            try:
                self.unprepare(ref)
                results[ref.uid] = None
            except DradriverError as err:
                log.warning("unprepare failed claim=%s error=%s", ref.uid, err)
                results[ref.uid] = str(err)
        return results

    # --- the recipe ---------------------------------------------------------------------------------------

    def prepare(self, claim: Mapping[str, Any]) -> tuple[PreparedDevice, ...]:
        """Prepare one claim: all of its devices or, on any error, none (nothing is written)."""
        uid = str(claim["metadata"]["uid"])
        name = f"{claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}"
        allocated = self.allocated_devices(claim)
        by_device: dict[str, list[str]] = {}
        for result in allocated:
            by_device.setdefault(result.device, []).append(result.request)
        # A claim prepared before its device turned unhealthy is left alone (a kubelet retry or restart repeats
        # prepare): its pod learns of the fault from the health stream.
        fresh = uid not in self.cdi.prepared_devices()
        resolved = [self._resolve(uid, name, device, check_health=fresh) for device in by_device]
        exclusive = {r.device for r in allocated if not r.admin_access}
        spec = ClaimSpec(
            claim_uid=uid,
            devices=tuple(
                cdi_device(d, _device_nodes(d, f"{name} ({uid})"), admin_access=d.name not in exclusive)
                for d in resolved
            ),
        )
        # Check and write under one lock, so two claims racing for one device cannot both pass the check.
        with self._prepare_lock:
            self._refuse_overlap(uid, name, exclusive)
            cdi_ids = self.cdi.write(spec)
        log.info("prepared claim=%s name=%s devices=%s", uid, name, ",".join(by_device))
        return tuple(
            PreparedDevice(
                pool=self.pool,
                device=device,
                requests=tuple(requests),
                cdi_device_ids=(cdi_id,),
                status_data=device_status_data(found, admin_access=device not in exclusive),
                metadata=device_metadata_attributes(found),
            )
            for (device, requests), cdi_id, found in zip(by_device.items(), cdi_ids, resolved, strict=True)
        )

    def _refuse_overlap(self, uid: str, name: str, devices: set[str]) -> None:
        """A device is prepared for one claim at a time (admin access excepted): after a scheduler race or a
        force-deleted claim, two claims can name the same device, and both must not get it."""
        for other, prepared in self.cdi.prepared_devices().items():
            shared = devices.intersection(prepared) if other != uid else set()
            if shared:
                raise ClaimError(
                    f"claim {name} ({uid}): device {', '.join(sorted(shared))} is already prepared for "
                    f"claim {other}; it is released when that claim is unprepared (if that claim is "
                    "gone, its pod is still being torn down)"
                )

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo prepare: remove the claim's CDI spec (a claim never prepared here is already done)."""
        self.cdi.remove(ref.uid)
        log.info("unprepared claim=%s", ref.uid)

    def allocated_devices(self, claim: Mapping[str, Any]) -> list[AllocatedDevice]:
        """This driver's allocation results, checked to belong to this node's pool."""
        uid = claim["metadata"]["uid"]
        results = claim["status"]["allocation"]["devices"]["results"]
        ours = [
            AllocatedDevice(str(r["request"]), str(r["pool"]), str(r["device"]), bool(r.get("adminAccess")))
            for r in results
            if r.get("driver") == self.driver_name
        ]
        for result in ours:
            if result.pool != self.pool:
                raise ClaimError(
                    f"claim {uid}: device {result.device} was allocated from pool {result.pool}, but "
                    f"this driver serves pool {self.pool} (node {self.pool}); the claim belongs to "
                    "another node's driver"
                )
        return ours

    def _resolve(self, uid: str, name: str, device: str, *, check_health: bool = True) -> GpuDevice | MigPartition:
        with self._lock:
            found = self._devices.get(device)
        problem = self._device_problem(device) if check_health and self._device_problem is not None else None
        if problem is not None:
            raise ClaimError(
                f"claim {name} ({uid}): device {device} is unhealthy: {problem}; delete the claim so the "
                "scheduler allocates a healthy device (the device is tainted until it recovers)"
            )
        if found is None:
            raise ClaimError(
                f"claim {name} ({uid}): device {device} is not offered by this node any more; "
                "delete the claim so the scheduler allocates a device that exists"
            )
        if isinstance(found, MigPartition) and found.existing is None:
            raise ClaimError(
                f"claim {name} ({uid}): MIG partition {device} does not exist yet and this version "
                "does not carve partitions at prepare; run with --mig-mode static and create MIG "
                "devices with nvidia-smi, or request a whole GPU"
            )
        if isinstance(found, GpuDevice) and found.mig_enabled:
            # With MIG on, a GPU runs work only through its MIG devices, and this version does not switch MIG off.
            raise ClaimError(
                f"claim {name} ({uid}): GPU {device} is in MIG mode, so as a whole GPU it cannot run "
                "work and this version does not switch MIG mode at prepare; delete the claim so the "
                "scheduler picks another device, or disable MIG on the GPU (nvidia-smi -i <gpu> -mig 0)"
            )
        return found


def _device_nodes(device: GpuDevice | MigPartition, claim: str) -> tuple[DeviceNode, ...]:
    gpu = device if isinstance(device, GpuDevice) else device.parent
    parent = DeviceNode(f"/dev/nvidia{gpu.info.minor}")
    if isinstance(device, GpuDevice) or device.existing is None:
        return (parent,)
    if not device.existing.capability_nodes:
        raise ClaimError(
            f"claim {claim}: the MIG capability device nodes of {device.name} cannot be read "
            f"(/proc/driver/nvidia/capabilities/gpu{gpu.info.minor}/mig/…); is /proc from the host "
            "and the NVIDIA driver's MIG support available to the driver?"
        )
    return (parent, *device.existing.capability_nodes)
