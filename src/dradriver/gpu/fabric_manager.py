"""The port to NVIDIA Fabric Manager's shared-NVSwitch partitions, in our own types.

On HGX systems whose NVSwitches Fabric Manager (FM) runs in shared-NVSwitch mode, GPUs talk over NVLink only inside an
*activated* fabric partition: a fixed set of GPUs FM offers (on an 8-GPU baseboard one of 8, two of 4, four of 2 and
eight of 1). FM's C API (``fmGetSupportedFabricPartitions``, ``fmActivateFabricPartition``,
``fmDeactivateFabricPartition``) reports each partition's id, whether it is active and its GPUs by physical (module)
id and PCI address; :class:`FabricManager` is that API as NVIDIA's DRA driver's client uses it. A real node's
client is :mod:`dradriver.gpu.nvfm` (FM's client library, libnvfm); the simulated node has a stand-in
(``sim/fabric_manager.py``, reached through :mod:`dradriver.gpu.backend`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dradriver.errors import DeviceError


class FabricManagerError(DeviceError):
    """Fabric Manager refused or failed a call; names the call and the partition. ``code``: FM's return code
    (``fmReturn_t``), when FM answered one."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class FabricManagerNotReady(FabricManagerError):
    """Fabric Manager is not there yet or still initialising: its unix socket missing, or FM answering
    FM_ST_CONNECTION_NOT_VALID (not reachable), FM_ST_NOT_CONFIGURED (initialising) or FM_ST_NOT_READY. A start waits
    for it as for the NVIDIA driver (``--wait-for-driver``): FM starts beside the driver, often after this pod."""


#: A partition GPU's PCI address when FM reported an empty or unparsable ``pciBusId``: the GPU is still listed
#: (its partition's id, state and module ids stay usable), but nothing is matched to it by address.
UNKNOWN_PCI_BUS_ID = ""


@dataclass(frozen=True)
class PartitionGpu:
    """One GPU of a partition as FM reports it (``fmFabricPartitionGpuInfo_t``)."""

    physical_id: int  # the GPU's module id on the baseboard (NVML's nvmlDeviceGetModuleId)
    pci_bus_id: str  # normalised "0000:1b:00.0" (normalize_pci_bus_id); UNKNOWN_PCI_BUS_ID when FM's was unparsable
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

    @property
    def module_ids(self) -> frozenset[int]:
        return frozenset(g.physical_id for g in self.gpus)

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
    """Refuse what FM must never report (a duplicate id, an empty partition, a GPU without a PCI address, a GPU twice
    in one partition, two partitions of one size sharing a GPU, a module id at two PCI addresses or the reverse):
    the driver's attributes and matching rely on each."""
    seen: set[int] = set()
    by_size: dict[tuple[int, str], int] = {}
    addresses: dict[int, str] = {}
    modules: dict[str, int] = {}
    for partition in partitions:
        if partition.id in seen:
            raise FabricManagerError(f"Fabric Manager reported partition {partition.id} twice")
        seen.add(partition.id)
        if not partition.gpus:
            raise FabricManagerError(f"Fabric Manager reported partition {partition.id} without GPUs")
        _check_addresses_known(partition)
        if len(partition.pci_bus_ids) != partition.size:
            raise FabricManagerError(f"Fabric Manager reported a GPU twice in partition {partition.id}")
        _check_identities(partition, addresses, modules)
        for pci in partition.pci_bus_ids:
            other = by_size.setdefault((partition.size, pci), partition.id)
            if other != partition.id:
                raise FabricManagerError(
                    f"GPU {pci} is in two partitions of {partition.size} GPUs ({other} and {partition.id}); "
                    "the partitionN attributes need one per size"
                )


def _check_addresses_known(partition: FabricPartition) -> None:
    """Refuse a partition with a GPU FM gave no parsable PCI address: the attributes are published by address."""
    unknown = [g.physical_id for g in partition.gpus if g.pci_bus_id == UNKNOWN_PCI_BUS_ID]
    if unknown:
        raise FabricManagerError(
            f"Fabric Manager reported GPU module {unknown[0]} of partition {partition.id} without a PCI address it "
            "could parse (an empty or malformed pciBusId); the GPUs are published and matched by PCI address, so "
            "the partitions are refused: see Fabric Manager's log"
        )


def _check_identities(partition: FabricPartition, addresses: dict[int, str], modules: dict[str, int]) -> None:
    """A GPU is one module at one PCI address in every partition: :func:`partition_gpu` finds FM's GPU by either
    (by module id as NVIDIA does, by address where NVML gives no module id or cannot see the GPU) and gets the same."""
    for gpu in partition.gpus:
        address = addresses.setdefault(gpu.physical_id, gpu.pci_bus_id)
        module = modules.setdefault(gpu.pci_bus_id, gpu.physical_id)
        if address != gpu.pci_bus_id:
            raise FabricManagerError(
                f"Fabric Manager reported GPU module {gpu.physical_id} at {gpu.pci_bus_id} in partition "
                f"{partition.id} and at {address} in another"
            )
        if module != gpu.physical_id:
            raise FabricManagerError(
                f"Fabric Manager reported the GPU at {gpu.pci_bus_id} as module {gpu.physical_id} in partition "
                f"{partition.id} and as module {module} in another"
            )


def normalize_pci_bus_id(bus_id: str) -> str:
    """A PCI address as sysfs, NVML's adapter and Kubernetes spell it (``0000:1b:00.0``), from FM's spelling
    (NVML's ``00000000:1B:00.0``) or one without its domain; ``FabricManagerError`` for what is no PCI address."""
    parts = bus_id.strip().lower().split(":")
    try:
        domain, bus, slot = ("0", *parts) if len(parts) == 2 else parts
        device, function = slot.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        raise FabricManagerError(f"Fabric Manager reported a GPU at {bus_id!r}, which is no PCI address") from None


def partition_of_modules(partitions: Iterable[FabricPartition], module_ids: Iterable[int]) -> FabricPartition | None:
    """The partition whose GPUs' module ids equal ``module_ids``, or None (NVIDIA's ``FindPartitionByModuleIDs``)."""
    wanted = frozenset(module_ids)
    return next((p for p in partitions if p.module_ids == wanted), None)


def partition_gpu(
    partitions: Iterable[FabricPartition], *, pci_bus_id: str, module_id: int | None
) -> PartitionGpu | None:
    """FM's record of the GPU NVML reports at ``pci_bus_id`` (normalised) with ``module_id``, or None where FM lists
    neither. Found by module id where NVML gives one, as NVIDIA's driver matches (NVML's module id is FM's
    physicalId), cross-checked with the PCI address; by PCI address where NVML gives none.
    ``FabricManagerError`` naming both when they disagree: a mis-cabled or misreported baseboard would otherwise
    have the NVLinks of other GPUs than the claim's activated."""
    members = {g.physical_id: g for p in partitions for g in p.gpus}
    at_address = next((g for g in members.values() if g.pci_bus_id == pci_bus_id), None)
    if module_id is None:
        return at_address
    by_module = members.get(module_id)
    if at_address is not None and at_address.physical_id != module_id:
        elsewhere = f" (and module {module_id} at {by_module.pci_bus_id})" if by_module is not None else ""
        raise FabricManagerError(
            f"NVML reports the GPU at {pci_bus_id} as module {module_id}, but Fabric Manager reports module "
            f"{at_address.physical_id} there{elsewhere}"
        )
    if at_address is None and by_module is not None and by_module.pci_bus_id == UNKNOWN_PCI_BUS_ID:
        raise FabricManagerError(
            f"NVML reports the GPU at {pci_bus_id} as module {module_id}, but Fabric Manager reports module "
            f"{module_id} without a PCI address it could parse"
        )
    if at_address is None and by_module is not None:
        raise FabricManagerError(
            f"NVML reports the GPU at {pci_bus_id} as module {module_id}, but Fabric Manager reports module "
            f"{module_id} at {by_module.pci_bus_id}"
        )
    return at_address
