"""Typed structures of the GPU layer, shared by the NVML port, its implementations and discovery."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

MIB = 1024 * 1024


class ComputeMode(IntEnum):
    """NVML compute modes (``NVML_COMPUTEMODE_*``); EXCLUSIVE_THREAD is no longer supported by drivers."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class NvlinkPeerType(IntEnum):
    """What the far end of an NVLink is (``NVML_NVLINK_DEVICE_TYPE_*``)."""

    GPU = 0
    IBMNPU = 1
    SWITCH = 2
    UNKNOWN = 255


@dataclass(frozen=True)
class Placement:
    """Where a GPU instance sits, in memory slices (``nvmlGpuInstancePlacement_t``)."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable GPU, as ``nvmlDeviceGetGpuInstanceProfileInfo`` reports it."""

    id: int  # the device's profile id (19 for 1g.10gb on A100), not the NVML enum used to look it up
    name: str  # e.g. "1g.10gb", "1g.10gb+me"
    slice_count: int  # compute slices (the "1" in 1g)
    memory_slices: int  # size of every placement, in memory slices
    max_instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[Placement, ...]

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


@dataclass(frozen=True)
class GpuInfo:
    """Identity and fixed properties of one physical GPU."""

    index: int  # NVML enumeration index: not stable, never used in names
    minor: int  # /dev/nvidia<minor>
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str  # normalised "0000:07:00.0"
    pci_device_id: int
    numa_node: int | None
    pcie_root: str | None
    mig_capable: bool


@dataclass(frozen=True)
class MigModeState:
    current: bool
    pending: bool


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_id: int
    slice_count: int


@dataclass(frozen=True)
class GpuInstance:
    """A GPU instance as ``nvmlGpuInstanceGetInfo`` describes it, with its compute instances."""

    id: int
    profile_id: int
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...] = ()


@dataclass(frozen=True)
class MigDevice:
    """A usable MIG device: a compute instance inside a GPU instance, with its own UUID."""

    uuid: str
    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: MigProfile
    placement: Placement


@dataclass(frozen=True)
class NvlinkConnection:
    link: int
    remote_pci_bus_id: str
    remote_type: NvlinkPeerType


@dataclass(frozen=True)
class GpuEvent:
    """A health event: an XID on a GPU (or one of its MIG devices), or the GPU falling off the bus."""

    gpu_uuid: str
    xid: int | None = None
    gpu_lost: bool = False
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # e.g. "580.65.06"
    cuda_driver_version: int  # NVML form, e.g. 13000 for 13.0
    extra: dict[str, str] = field(default_factory=dict)
