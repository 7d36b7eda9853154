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


class FabricState(IntEnum):
    """Where a GPU's NVLink fabric registration stands (``NVML_GPU_FABRIC_STATE_*``)."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


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
    # The memory-addressing mode on platforms with coherent CPU-GPU memory (HMM, ATS, or None when supported but
    # inactive); None on the others (NVML reports not supported), as on every discrete GPU of an x86 host.
    addressing_mode: str | None = None
    # The GPU's module (slot) id on an HGX/DGX baseboard (nvmlDeviceGetModuleId), the physicalId Fabric Manager names
    # it by; None where NVML reports none (NOT_SUPPORTED or 0, drivers older than the call).
    module_id: int | None = None


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
class DeviceNode:
    """A device node a container needs; ``major``/``minor`` set when the node must be described exactly."""

    path: str
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """A usable MIG device: a compute instance inside a GPU instance, with its own UUID."""

    uuid: str
    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: MigProfile
    placement: Placement
    capability_nodes: tuple[DeviceNode, ...] = ()  # /dev/nvidia-caps nodes; empty when they cannot be read


@dataclass(frozen=True)
class NvlinkConnection:
    link: int
    remote_pci_bus_id: str
    remote_type: NvlinkPeerType


NO_CLUSTER_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class FabricInfo:
    """A GPU's NVLink fabric registration, as ``nvmlDeviceGetGpuFabricInfoV`` reports it (Hopper and newer).

    ``status`` is an NVML return code and means something only once ``state`` is COMPLETED. An all-zero
    ``cluster_uuid`` means the GPU is not part of a multi-node NVLink system (normal on a single-node HGX)."""

    cluster_uuid: str  # the 16-byte clusterUuid as a UUID string, "00000000-0000-0000-0000-000000000000" when none
    clique_id: int
    state: int  # NVML_GPU_FABRIC_STATE_*: see FabricState
    status: int  # NVML return code (0 = success), valid only when state is COMPLETED
    health_mask: int

    @property
    def registered(self) -> bool:
        """The fabric manager finished registering the GPU, successfully: its NVLinks to switches carry traffic."""
        return self.state == FabricState.COMPLETED and self.status == 0

    @property
    def multi_node(self) -> bool:
        """The GPU belongs to a multi-node NVLink clique (a non-zero cluster UUID)."""
        return self.cluster_uuid != NO_CLUSTER_UUID

    @property
    def clique(self) -> str:
        """The clique key as NVIDIA's DRA driver writes it: ``<clusterUuid>.<cliqueId>``."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class GpuEvent:
    """A health event: an XID on a GPU (or one of its MIG devices), a double-bit (uncorrectable) ECC error, or the
    GPU falling off the bus."""

    gpu_uuid: str
    xid: int | None = None
    gpu_lost: bool = False
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    ecc_double_bit: bool = False


@dataclass(frozen=True)
class GpuProbe:
    """What a few cheap NVML reads say about a GPU that answers: enough to call it healthy again after a fault.

    ``ecc_uncorrected_volatile`` counts uncorrectable ECC errors since the GPU was last reset or the driver
    reloaded (a reset sets it back to zero); None where the GPU has no ECC. ``fabric_registered`` is None where
    the GPU has no NVLink fabric, else whether the fabric manager finished registering it successfully.
    ``recovery_action`` is NVML's recommended recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``: 0 none,
    1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, …); None where NVML cannot say (older drivers)."""

    uuid: str
    ecc_uncorrected_volatile: int | None
    fabric_registered: bool | None
    recovery_action: int | None = None


@dataclass(frozen=True)
class UnreadableGpu:
    """A GPU NVML counts but cannot describe (lost before discovery): no UUID or PCI address is known for it."""

    index: int
    error: str


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # e.g. "580.65.06"
    cuda_driver_version: int  # NVML form, e.g. 13000 for 13.0
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML lists on a device (``nvmlDeviceGetComputeRunningProcesses``): its host PID and the
    device memory it holds (None where NVML cannot say); on a MIG-enabled GPU, the instance it runs in."""

    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class DeviceUsage:
    """How busy a GPU or MIG device is, as NVML reports it; a field is None where NVML does not report it for this
    device (NOT_SUPPORTED): utilisation on a MIG device or a GPU in MIG mode, temperature, power and ECC on a MIG
    device (read its GPU's), ECC on a GPU without it."""

    uuid: str
    utilization_percent: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_celsius: int | None
    power_watts: float | None
    ecc_uncorrected_volatile: int | None
    processes: tuple[GpuProcess, ...] = ()
