"""Which kernel driver holds each NVIDIA PCI function, its IOMMU group, and the sysfs writes that move it.

Everything is read from the host's sysfs as the kernel documents it (Documentation/ABI/testing/sysfs-bus-pci,
sysfs-kernel-iommu_groups): ``/sys/bus/pci/devices/<address>/{vendor,device,class,driver,driver_override,
iommu_group}``, ``/sys/bus/pci/drivers/<driver>/{bind,unbind}`` and ``/sys/kernel/iommu_groups/<n>/devices/``.
A ``host_root`` stands for ``/`` so a test root (the simulated node's tree) is walked the same way.

Reads are plain file reads. Writes go through a :class:`SysfsWriter`: on a real host the kernel acts on a write
to an attribute file (:class:`KernelSysfs` only writes it); the simulated node's writer models what the kernel
does and refuses (``dradriver.sim.sysfs``).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

NVIDIA_VENDOR = "0x10de"
NVIDIA_DRIVER = "nvidia"
VFIO_DRIVER = "vfio-pci"
VFIO_MODULE = "vfio_pci"
# PCI class 0x03 is a display controller (VGA 0x0300, 3D 0x0302): the GPU function itself, not its audio function.
DISPLAY_CLASS_PREFIX = "0x03"
BRIDGE_CLASS_PREFIX = "0x0604"


class SysfsWriter(Protocol):
    """Writes one sysfs attribute; raises ``OSError`` with the kernel's errno when the kernel refuses."""

    def write(self, path: Path, value: str) -> None: ...


class KernelSysfs:
    """The host's kernel: the write is the request, the kernel's answer its errno."""

    def write(self, path: Path, value: str) -> None:
        # One write call, unbuffered: sysfs acts on each write(2), and a partial write is a different request.
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it now."""

    address: str  # 0000:07:00.0
    vendor: str  # 0x10de
    device_id: str  # 0x2330
    pci_class: str  # 0x030200
    driver: str | None  # the bound driver's name, None when unbound
    iommu_group: int | None  # None when the IOMMU is off

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class.startswith(DISPLAY_CLASS_PREFIX)

    @property
    def is_bridge(self) -> bool:
        """A PCI-to-PCI bridge (a switch port): VFIO lets it stay with its host driver (pcieport) in a group given
        to a VM, and it must, since the host routes through it."""
        return self.pci_class.startswith(BRIDGE_CLASS_PREFIX)


class HostPci:
    """The host's PCI devices and IOMMU groups under ``host_root`` (``/`` on a node), written through ``writer``."""

    def __init__(self, host_root: Path, writer: SysfsWriter | None = None) -> None:
        self.root = host_root
        self.sys = host_root / "sys"
        self.writer: SysfsWriter = writer if writer is not None else KernelSysfs()

    # --- reads ----------------------------------------------------------------------------------------------

    def iommu_enabled(self) -> bool:
        """Whether the kernel has IOMMU groups (``intel_iommu=on``/``amd_iommu`` and a VT-d/AMD-Vi platform)."""
        groups = self.sys / "kernel/iommu_groups"
        return groups.is_dir() and any(groups.iterdir())

    def vfio_module_loaded(self) -> bool:
        return (self.sys / "module" / VFIO_MODULE).is_dir() and (self.sys / "bus/pci/drivers" / VFIO_DRIVER).is_dir()

    def function(self, address: str) -> PciFunction:
        """One PCI function; ``FileNotFoundError`` when sysfs has no such address."""
        base = self.sys / "bus/pci/devices" / address
        if not base.exists():
            raise FileNotFoundError(errno.ENOENT, f"no PCI device {address} in sysfs", str(base))
        driver_link = base / "driver"
        group_link = base / "iommu_group"
        return PciFunction(
            address=address,
            vendor=_read(base / "vendor"),
            device_id=_read(base / "device"),
            pci_class=_read(base / "class"),
            driver=os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None,
            iommu_group=int(os.path.basename(os.readlink(group_link))) if group_link.is_symlink() else None,
        )

    def gpus(self) -> list[PciFunction]:
        """NVIDIA display functions, bound or not, by address."""
        devices = self.sys / "bus/pci/devices"
        if not devices.is_dir():
            return []
        found = [self.function(entry.name) for entry in sorted(devices.iterdir(), key=lambda e: e.name)]
        return [f for f in found if f.is_gpu]

    def group_members(self, group: int) -> list[str]:
        """Addresses of every function in IOMMU group ``group`` (the kernel assigns them to a VM together)."""
        directory = self.sys / "kernel/iommu_groups" / str(group) / "devices"
        return sorted(entry.name for entry in directory.iterdir()) if directory.is_dir() else []

    def driver_override(self, address: str) -> str | None:
        value = _read(self.sys / "bus/pci/devices" / address / "driver_override")
        return None if value in ("", "(null)") else value

    def vfio_group_node(self, group: int) -> Path:
        """``/dev/vfio/<group>`` under the host root: the group's VFIO character device."""
        return self.root / "dev/vfio" / str(group)

    def vfio_container_node(self) -> Path:
        return self.root / "dev/vfio/vfio"

    # --- writes (the kernel's ABI) --------------------------------------------------------------------------

    def set_driver_override(self, address: str, driver: str | None) -> None:
        """Only ``driver`` may bind ``address`` from now on; None (written as a newline) clears the override."""
        self.writer.write(self.sys / "bus/pci/devices" / address / "driver_override", f"{driver or ''}\n")

    def unbind(self, address: str, driver: str) -> None:
        self.writer.write(self.sys / "bus/pci/drivers" / driver / "unbind", address)

    def bind(self, address: str, driver: str) -> None:
        self.writer.write(self.sys / "bus/pci/drivers" / driver / "bind", address)


def _read(path: Path) -> str:
    return path.read_text().strip()
