"""NVSwitch partitions through Fabric Manager (``--fabric-manager-partitions``): the prepare step that activates the
partition whose GPU set equals a claim's whole GPUs, its undo and drift check, and the ``partitionN`` attributes.

On an HGX node whose Fabric Manager runs in shared-NVSwitch mode, GPUs reach each other over NVLink only inside an
activated partition (:mod:`dradriver.gpu.fabric_manager`). Every whole GPU (and VFIO passthrough GPU) is published
with ``gpuModuleID`` and, for each partition size it belongs to, ``partition<size>`` = that partition's id: NVIDIA's
attribute names (its ``FabricManagerPartitioning`` gate), under our domain. A claim that wants two GPUs with NVLink
between them asks for two with one ``matchAttribute: gpu.dradriver.dev/partition2``.

GPUs are matched to FM's partition members as NVIDIA's driver matches them, by module id (NVML's
``nvmlDeviceGetModuleId`` is FM's physicalId), cross-checked with the PCI address: a GPU whose module id FM places
at another address refuses the partitions (at start and at every rescan), naming both. A GPU NVML gives no module id
(an older driver) is matched by PCI address, a WARNING logged once per GPU: NVIDIA's driver refuses such a GPU.

Step (recorded by the claim's :class:`~dradriver.driver.prepare.transaction.Transaction`, declared with the claim so
a kill at any point is undone at start-up):

- ``fabric-partition``: activate the partition whose GPU set equals the claim's whole GPUs. A claim whose GPUs no
  partition equals is refused before anything changes, with the partitions that would fit. A partition already
  active is accepted (a claim sharing the GPUs activated it; NVIDIA's client does the same).

Undo deactivates the partition when it is active and no other recorded claim declared the same partition (a shared
GPU's other claims still need the fabric; an admin-access claim, which declares none, does not), so an intent
whose activation never happened, a partition deactivated already, or one FM no longer lists (its list "can be fewer
than the max due to hardware availability"; NVIDIA's driver reads it as not active; logged), is nothing to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.driver.prepare.checkpoint import Action, CheckpointStore, ClaimRecord
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.errors import ClaimError
from dradriver.gpu.fabric_manager import (
    UNKNOWN_PCI_BUS_ID,
    FabricManager,
    FabricManagerError,
    FabricPartition,
    PartitionGpu,
    check_partitions,
    partition_gpu,
    partition_of_modules,
)
from dradriver.gpu.inventory import GpuDevice
from dradriver.gpu.models import GpuInfo

log = logging.getLogger(__name__)

STEP_FABRIC_PARTITION = "fabric-partition"
MODULE_ID_ATTRIBUTE = "gpuModuleID"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"


def partition_attribute(size: int) -> str:
    """``partition2``: the attribute naming a GPU's partition of ``size`` GPUs (NVIDIA's name)."""
    return f"partition{size}"


def gpu_attributes(layout: Sequence[FabricPartition]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each GPU's ``gpuModuleID`` and ``partition<size>`` attributes, by PCI address: FM's GPU sets are fixed by the
    baseboard, so a GPU NVML does not see at start (bound to vfio-pci by a claim) gets them too."""
    attributes: dict[str, dict[str, dict[str, Any]]] = {}
    for partition in layout:
        for member in partition.gpus:
            if member.pci_bus_id == UNKNOWN_PCI_BUS_ID:
                continue  # refused by check_partitions at start; never published under no address
            found = attributes.setdefault(member.pci_bus_id, {MODULE_ID_ATTRIBUTE: {"int": member.physical_id}})
            found[partition_attribute(partition.size)] = {"int": partition.id}
    return attributes


def with_gpu_attributes(
    specs: list[dict[str, Any]], attributes: Mapping[str, Mapping[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``specs`` with each device whose PCI address (``resource.kubernetes.io/pciBusID``) is a GPU of ``attributes``
    given that GPU's attributes (VFIO passthrough devices: NVIDIA publishes the partitions on them too)."""
    for spec in specs:
        for device in spec.get("devices", []):
            address = device.get("attributes", {}).get(PCI_BUS_ID_ATTRIBUTE, {}).get("string")
            device["attributes"].update(attributes.get(address, {}) if address else {})
    return specs


class FabricPartitions:
    """Fabric Manager's partitions as the driver uses them: the attributes of each GPU, the partition a claim's
    GPUs form, and the recorded activation. Partitions are read from FM once at start (their GPU sets are fixed by
    the baseboard); the activation state is asked again at every change."""

    def __init__(self, fabric_manager: FabricManager, checkpoint: CheckpointStore, *, domain: str) -> None:
        """``domain``: the driver's name, the domain of the attributes a refusal tells the claim to align on."""
        self.fabric_manager = fabric_manager
        self.domain = domain
        self._checkpoint = checkpoint
        self.layout = fabric_manager.supported_partitions()
        check_partitions(self.layout)
        self._matched_by_address: set[str] = set()  # GPUs NVML gives no module id, logged once each

    def check_gpus(self, gpus: Iterable[GpuInfo]) -> None:
        """Refuse the partitions when NVML's module id of any of ``gpus`` disagrees with FM's physicalId at its PCI
        address (``FabricManagerError`` naming each disagreement); log, once per GPU, those FM lists that NVML
        gives no module id, matched by PCI address instead (a WARNING: NVIDIA's driver refuses them)."""
        disagreements: list[str] = []
        for info in gpus:
            try:
                member = partition_gpu(self.layout, pci_bus_id=info.pci_bus_id, module_id=info.module_id)
            except FabricManagerError as err:
                disagreements.append(str(err))
                continue
            if member is not None and info.module_id is None and info.pci_bus_id not in self._matched_by_address:
                self._matched_by_address.add(info.pci_bus_id)
                log.warning(
                    "NVML reports no module id for the GPU (nvmlDeviceGetModuleId not supported by this driver); "
                    "matched to Fabric Manager's module by PCI address, where NVIDIA's driver refuses the GPU "
                    "gpu=%s module=%d",
                    info.pci_bus_id,
                    member.physical_id,
                )
        if disagreements:
            raise FabricManagerError(
                "Fabric Manager's partitions refused: "
                + "; ".join(disagreements)
                + ". A mis-cabled or misreported baseboard would have NVLink activated between other GPUs than a "
                "claim's: compare each GPU's Module ID in nvidia-smi -q with Fabric Manager's partitions, or run "
                "without --fabric-manager-partitions"
            )

    def kinds(self) -> list[StepKind]:
        return [StepKind(STEP_FABRIC_PARTITION, self.undo, self.drift)]

    # --- publishing -------------------------------------------------------------------------------------------

    def gpu_attributes(self) -> dict[str, dict[str, dict[str, Any]]]:
        """See :func:`gpu_attributes`."""
        return gpu_attributes(self.layout)

    # --- prepare ----------------------------------------------------------------------------------------------

    def expect(self, txn: Transaction, claim: str, gpus: Sequence[GpuDevice]) -> None:
        """Declare the activation of the partition ``gpus`` form (nothing for a claim without whole GPUs); refuse a
        set no partition equals, naming those that would fit."""
        if not gpus:
            return
        partition = self._partition_of(gpus)
        if partition is None:
            raise ClaimError(self._no_partition(claim, gpus))
        self._refuse_overlapping_active(claim, partition)
        txn.expect(
            STEP_FABRIC_PARTITION,
            "",
            {"partitionId": partition.id, "size": partition.size, "gpus": sorted(g.name for g in gpus)},
        )

    def _partition_of(self, gpus: Sequence[GpuDevice]) -> FabricPartition | None:
        """The partition whose GPUs are exactly ``gpus``, FM's members found by module id (PCI address where NVML
        gives none; :func:`~dradriver.gpu.fabric_manager.partition_gpu`)."""
        members: list[PartitionGpu | None] = [
            partition_gpu(self.layout, pci_bus_id=g.info.pci_bus_id, module_id=g.info.module_id) for g in gpus
        ]
        if any(m is None for m in members):
            return None
        return partition_of_modules(self.layout, (m.physical_id for m in members if m is not None))

    def activate(self, txn: Transaction) -> None:
        """Activate the declared partition, if the claim declared one."""
        params = txn.intent(STEP_FABRIC_PARTITION, "")
        if params is not None:
            txn.run(STEP_FABRIC_PARTITION, "", params, self._activate)
            log.info("activated fabric partition claim=%s partition=%s", txn.record.uid, params["partitionId"])

    def _activate(self, params: dict[str, Any]) -> dict[str, Any]:
        partition_id = int(params["partitionId"])
        if self._active(partition_id):
            return {"alreadyActive": True}
        self.fabric_manager.activate(partition_id)
        return {}

    def _refuse_overlapping_active(self, claim: str, partition: FabricPartition) -> None:
        """FM refuses to activate a partition while another active one holds any of its GPUs: refuse the claim
        before anything changes (its GPUs would be bound or carved for nothing), naming that partition."""
        # By module id (FM's own GPU identity): a GPU FM now reports without a PCI address still counts.
        active = [
            p
            for p in self.fabric_manager.supported_partitions()
            if p.active and p.id != partition.id and p.module_ids & partition.module_ids
        ]
        if active:
            raise ClaimError(
                f"claim {claim}: its GPUs form {partition.describe()}, but Fabric Manager "
                f"{', '.join(p.describe() for p in active)} is active and holds some of them; a partition is "
                "activated only while none of its GPUs is in another. The claim is retried once that partition "
                "is deactivated (its claim unprepared, or fmpm -d by whoever activated it)"
            )

    def _no_partition(self, claim: str, gpus: Sequence[GpuDevice]) -> str:
        wanted = {g.info.pci_bus_id for g in gpus}
        holding = [p for p in self.layout if wanted <= p.pci_bus_ids]
        same_size = [p for p in self.layout if p.size == len(gpus) and p.pci_bus_ids & wanted]
        fits = [p.describe() for p in sorted({*holding[-1:], *same_size}, key=lambda p: p.id)]
        return (
            f"claim {claim}: GPUs {', '.join(sorted(g.name for g in gpus))} form no Fabric Manager partition, so "
            f"NVLink between them cannot be activated; partitions that would fit: {', '.join(fits) or 'none'}. "
            f"Ask for GPUs of one partition: a constraint matchAttribute {self.domain}/{partition_attribute(len(gpus))}"
        )

    # --- undo and drift ---------------------------------------------------------------------------------------

    def undo(self, record: ClaimRecord, action: Action) -> None:
        partition_id = int(action.params["partitionId"])
        # Only another claim that declared this same partition needs it (GPUs shared through consumable shares):
        # a claim that merely names one of its GPUs (admin access, no partition step) does not keep it active.
        sharing = [
            str(r)
            for r in self._checkpoint.records()
            if r.uid != record.uid and any(_declares(a, partition_id) for a in r.actions)
        ]
        if sharing:
            log.info("fabric partition stays active for claims %s claim=%s partition=%s", sharing, record, partition_id)
            return
        active = self._reported_active(partition_id)
        if active is None:
            log.warning(
                "Fabric Manager no longer lists the fabric partition (its list can shrink with the hardware "
                "available); nothing to deactivate claim=%s partition=%s",
                record.uid,
                partition_id,
            )
            return
        if not active:
            return  # never activated (a kill before the call), or deactivated already
        self.fabric_manager.deactivate(partition_id)
        log.info("deactivated fabric partition claim=%s partition=%s", record.uid, partition_id)

    def drift(self, record: ClaimRecord, action: Action) -> str | None:
        partition_id = int(action.params["partitionId"])
        if self._active(partition_id):
            return None
        return f"Fabric Manager partition {partition_id} is not active any more"

    def _active(self, partition_id: int) -> bool:
        """Whether FM reports the partition active; ``FabricManagerError`` when FM no longer lists it."""
        active = self._reported_active(partition_id)
        if active is None:
            raise FabricManagerError(f"Fabric Manager no longer reports partition {partition_id}")
        return active

    def _reported_active(self, partition_id: int) -> bool | None:
        """Whether FM reports the partition active, None when FM does not list it."""
        partitions: list[FabricPartition] = self.fabric_manager.supported_partitions()
        found = next((p for p in partitions if p.id == partition_id), None)
        return None if found is None else found.active


def _declares(action: Action, partition_id: int) -> bool:
    """Whether ``action`` is a ``fabric-partition`` step (intent or done) for ``partition_id``."""
    return action.step == STEP_FABRIC_PARTITION and int(action.params.get("partitionId", -1)) == partition_id
