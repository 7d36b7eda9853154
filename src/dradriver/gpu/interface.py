"""The port every GPU backend implements: what the driver needs from NVML, in our own types.

GPUs are addressed by UUID, never by NVML index: indices shift when a GPU drops off the bus. Every method raises
``dradriver.gpu.errors.GpuError`` subclasses that name the device and the NVML call.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from dradriver.gpu.models import (
    ComputeInstance,
    ComputeMode,
    DeviceUsage,
    FabricInfo,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    GpuProbe,
    MigDevice,
    MigModeState,
    MigProfile,
    NvlinkConnection,
    SystemInfo,
    UnreadableGpu,
)


class StillChanging(Exception):
    """Raised out of a ``GpuLib.released`` block that leaves a change of a GPU under way in the kernel (an unbind
    from ``nvidia`` that has not returned): NVML is not started again until ``finished()`` is true, since starting
    it would open that GPU again and the unbind would wait for this process."""

    def __init__(self, *args: object, finished: Callable[[], bool] = lambda: True) -> None:
        super().__init__(*args)
        self.finished = finished


class GpuLib(Protocol):
    def system(self) -> SystemInfo:
        """Driver and CUDA driver versions of the node."""

    def gpus(self) -> list[GpuInfo]:
        """Every physical GPU that can be read, in NVML enumeration order (see ``unreadable_gpus``)."""

    def unreadable_gpus(self) -> list[UnreadableGpu]:
        """GPUs counted but not readable (lost before discovery); each ``gpus()`` call tries them again."""

    def probe(self, gpu_uuid: str) -> GpuProbe:
        """Cheap reads of a GPU's fitness; ``GpuIsLost`` when it fell off the bus."""

    def usage(self, device_uuid: str) -> DeviceUsage:
        """Utilisation, memory, temperature, power, ECC and compute processes of a GPU or MIG device (by UUID);
        what NVML does not report for that device is None. ``GpuIsLost`` when its GPU fell off the bus."""

    def mig_mode(self, gpu_uuid: str) -> MigModeState:
        """Current and pending MIG mode; ``NotSupported`` for GPUs without MIG."""

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> MigModeState:
        """Request a MIG mode; on Ampere the change stays pending until the GPU is reset."""

    def mig_profiles(self, gpu_uuid: str) -> list[MigProfile]:
        """Every GPU-instance profile with its possible placements (empty for GPUs without MIG).

        Works whether or not MIG mode is enabled, so partitions can be advertised before they exist."""

    def gpu_instances(self, gpu_uuid: str) -> list[GpuInstance]:
        """Existing GPU instances with their compute instances (empty when MIG is disabled)."""

    def create_gpu_instance(self, gpu_uuid: str, profile_id: int, placement_start: int) -> GpuInstance:
        """Create a GPU instance at exactly that placement; ``InsufficientResources`` when it is taken."""

    def destroy_gpu_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a GPU instance; ``InUse`` while it still has compute instances."""

    def create_compute_instance(
        self, gpu_uuid: str, gpu_instance_id: int, slice_count: int | None = None
    ) -> ComputeInstance:
        """Create a compute instance in a GPU instance (default: one spanning the whole GPU instance)."""

    def destroy_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        """Destroy one compute instance."""

    def mig_devices(self, gpu_uuid: str) -> list[MigDevice]:
        """Usable MIG devices (GPU instance + compute instance pairs) on a GPU."""

    def mig_device(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> MigDevice:
        """The MIG device of one compute instance (its UUID and capability nodes), read without walking the
        GPU's other MIG devices; ``NotFound`` when the instance is gone."""

    def reset_gpu(self, gpu_uuid: str) -> None:
        """Reset a GPU (what ``nvidia-smi -r`` does), applying a pending MIG mode; fails while it is in use."""

    def compute_mode(self, device_uuid: str) -> ComputeMode:
        """Compute mode of a GPU or MIG device (``GPU-…`` or ``MIG-…`` UUID)."""

    def set_compute_mode(self, device_uuid: str, mode: ComputeMode) -> None:
        """Set the compute mode of a GPU (MIG disabled) or of a MIG device."""

    def set_timeslice(self, gpu_uuid: str, value: int) -> None:
        """Set a whole GPU's time-slice for compute processes: 0 Default, 1 Short, 2 Medium, 3 Long."""

    def nvlinks(self, gpu_uuid: str) -> list[NvlinkConnection]:
        """Active NVLinks and what each one reaches."""

    def fabric_info(self, gpu_uuid: str, *, fresh: bool = False) -> FabricInfo | None:
        """The GPU's NVLink fabric registration; None where NVML says fabric info is not supported (GPUs before
        Hopper, and Hopper GPUs on no NVSwitch fabric, whose state is NOT_SUPPORTED). A settled answer may be
        remembered; ``fresh`` asks NVML again (the fabric manager can re-register a GPU into another clique)."""

    def wait_for_event(self, timeout_s: float) -> GpuEvent | None:
        """The next XID / GPU-lost event, or None when none came within ``timeout_s``."""

    def rewatch_events(self) -> None:
        """Register for events anew after ``wait_for_event`` failed; ``GpuError`` while that still fails."""

    def released(self) -> AbstractContextManager[None]:
        """For the ``with`` block this process holds no GPU open (NVML shut down; other calls wait for its end), so
        a GPU can leave the ``nvidia`` kernel driver; NVML afterwards counts and reads the GPUs afresh (not while a
        :class:`StillChanging` raised out of the block is unfinished: calls fail with ``NvmlReleased`` meanwhile)."""

    def close(self) -> None:
        """Release NVML."""
