"""The port to NVIDIA Fabric Manager's shared-NVSwitch partitions, in our own types.

On HGX systems whose NVSwitches Fabric Manager (FM) runs in shared-NVSwitch mode, GPUs talk over NVLink only inside an
*activated* fabric partition: a fixed set of GPUs FM offers (on an 8-GPU baseboard one of 8, two of 4, four of 2 and
eight of 1). FM's C API (``fmGetSupportedFabricPartitions``, ``fmActivateFabricPartition``,
``fmDeactivateFabricPartition``) reports each partition's id, whether it is active and its GPUs by physical (module)
id and PCI address; :class:`FabricManager` is that API as NVIDIA's DRA driver's client uses it. The simulated node
has a stand-in (``sim/fabric_manager.py``, reached through :mod:`dradriver.gpu.backend`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dradriver.errors import DeviceError


class FabricManagerError(DeviceError):
    """Fabric Manager refused or failed a call; names the call and the partition."""


@dataclass(frozen=True)
class PartitionGpu:
    """One GPU of a partition as FM reports it (``fmFabricPartitionGpuInfo_t``)."""

    physical_id: int  # the GPU's module id on the baseboard (NVML's nvmlDeviceGetModuleId)
    pci_bus_id: str  # normalised "0000:1b:00.0"
    uuid: str = ""


@dataclass(frozen=True)
class FabricPartition:
    """One partition FM supports (``fmFabricPartitionInfo_t``)."""

    id: int
    active: bool
    gpus: tuple[PartitionGpu, ...]

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def pci_bus_ids(self) -> frozenset[str]:
        return frozenset(g.pci_bus_id for g in self.gpus)

    def describe(self) -> str:
        """``partition 3 (GPUs 1,2)``: the id and the GPUs' module ids, as ``nvidia-smi``-style tools list them."""
        return f"partition {self.id} (GPUs {','.join(str(g.physical_id) for g in self.gpus)})"


class FabricManager(Protocol):
    """Fabric Manager's partition API. Every call may raise :class:`FabricManagerError`."""

    def supported_partitions(self) -> list[FabricPartition]:
        """Every partition FM supports now, with its activation state (``fmGetSupportedFabricPartitions``)."""
        ...

    def activate(self, partition_id: int) -> None:
        """Program the NVSwitches for the partition (``fmActivateFabricPartition``); FM refuses an active one, an
        unknown one, and one with a GPU in another active partition."""
        ...

    def deactivate(self, partition_id: int) -> None:
        """Release the partition (``fmDeactivateFabricPartition``); FM refuses one that is not active."""
        ...


def check_partitions(partitions: Sequence[FabricPartition]) -> None:
    """Refuse what FM must never report (a duplicate id, an empty partition, a GPU twice in one partition, two
    partitions of one size sharing a GPU): the driver's attributes and matching rely on each."""
    seen: set[int] = set()
    by_size: dict[tuple[int, str], int] = {}
    for partition in partitions:
        if partition.id in seen:
            raise FabricManagerError(f"Fabric Manager reported partition {partition.id} twice")
        seen.add(partition.id)
        if not partition.gpus:
            raise FabricManagerError(f"Fabric Manager reported partition {partition.id} without GPUs")
        if len(partition.pci_bus_ids) != partition.size:
            raise FabricManagerError(f"Fabric Manager reported a GPU twice in partition {partition.id}")
        for pci in partition.pci_bus_ids:
            other = by_size.setdefault((partition.size, pci), partition.id)
            if other != partition.id:
                raise FabricManagerError(
                    f"GPU {pci} is in two partitions of {partition.size} GPUs ({other} and {partition.id}); "
                    "the partitionN attributes need one per size"
                )


def exact_partition(partitions: Iterable[FabricPartition], pci_bus_ids: Iterable[str]) -> FabricPartition | None:
    """The partition whose GPU set equals ``pci_bus_ids``, or None."""
    wanted = frozenset(pci_bus_ids)
    return next((p for p in partitions if p.pci_bus_ids == wanted), None)
