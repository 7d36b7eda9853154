"""MIG capability device nodes: what a container needs, besides the parent GPU's node, to use a MIG device.

NVML does not expose them. The kernel driver lists each GPU instance's and compute instance's capability in
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` (and ``…/gi<G>/ci<C>/access``), whose line
``DeviceFileMinor: N`` names the node ``/dev/nvidia-caps/nvidia-cap<N>``; the major number is that of
``nvidia-caps`` in ``/proc/devices``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from dradriver.gpu.errors import GpuError
from dradriver.gpu.models import DeviceNode

CAPS_DIR = "/dev/nvidia-caps"
# The access files are world-readable (DeviceFileMode: 292 = 0o444); the container opens the node read-only.
CAP_FILE_MODE = 0o444


class MigCapabilities(Protocol):
    def device_nodes(self, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> tuple[DeviceNode, ...]:
        """The GPU-instance and compute-instance capability nodes of one MIG device."""
        ...


class ProcMigCapabilities:
    """``MigCapabilities`` from ``/proc`` on a real node (``proc_root`` is a seam for tests)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._root = proc_root

    def device_nodes(self, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> tuple[DeviceNode, ...]:
        base = self._root / f"driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gpu_instance_id}"
        major = self._major()
        return tuple(
            DeviceNode(
                path=f"{CAPS_DIR}/nvidia-cap{self._minor(access)}",
                major=major,
                minor=self._minor(access),
                file_mode=CAP_FILE_MODE,
            )
            for access in (base / "access", base / f"ci{compute_instance_id}" / "access")
        )

    def _minor(self, access: Path) -> int:
        try:
            text = access.read_text()
        except OSError as err:
            raise GpuError(
                f"cannot read MIG capability {access}: {err}; is the NVIDIA driver loaded with MIG "
                "support, and /proc mounted from the host?"
            ) from err
        match = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text, re.M)
        if match is None:
            raise GpuError(f"{access} has no 'DeviceFileMinor: N' line; this NVIDIA driver's format is not supported")
        return int(match.group(1))

    def _major(self) -> int:
        devices = self._root / "devices"
        try:
            text = devices.read_text()
        except OSError as err:
            raise GpuError(f"cannot read {devices}: {err}") from err
        character = text.split("Block devices:")[0]
        match = re.search(r"^\s*(\d+)\s+nvidia-caps\s*$", character, re.M)
        if match is None:
            raise GpuError(
                f"no nvidia-caps character device in {devices}: load the NVIDIA driver's nvidia-caps "
                "support (nvidia.ko with MIG)"
            )
        return int(match.group(1))
