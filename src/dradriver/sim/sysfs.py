"""The simulated node's sysfs and ``/dev/vfio``: a file tree under a test root, and the kernel's answers to writes.

The tree has the kernel's layout (``sys/bus/pci/devices/<address>/{vendor,device,class,driver,driver_override,
iommu_group}``, ``sys/bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind}``, ``sys/kernel/iommu_groups/<n>/devices/``,
``sys/module/{nvidia,vfio_pci}``, ``dev/vfio/{vfio,<n>}``), so the driver's real code
(:mod:`dradriver.nvidia_install.pci_binding`) walks it unchanged. Driver links are symlinks as in sysfs; device
nodes are plain files (a test root cannot hold character devices).

A file tree does not act on writes, so :class:`SimKernel` does what the kernel would and refuses as it does:
``ENODEV`` to unbind a function from a driver that does not hold it or to bind one whose ``driver_override``
names another driver; ``EBUSY`` to bind a function a driver holds already, or to unbind a GPU from ``nvidia``
while a process has it open (the real driver waits for its clients instead; refusing is the same answer, sooner);
``ENOENT`` to bind to ``vfio-pci`` before its module is loaded. ``/dev/vfio/<group>`` appears once every function
of the group is bound to ``vfio-pci`` or to no driver, PCI bridges aside (a *viable* group: the kernel refuses to
open the group otherwise) and goes when none is bound to ``vfio-pci``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

NVIDIA = "nvidia"
VFIO_PCI = "vfio-pci"
FIRST_GROUP = 20  # real nodes number IOMMU groups from 0 with the root ports first; GPUs sit higher
# What each driver's ID table claims (vendors, class prefix): nvidia NVIDIA display functions, the HD-audio driver
# audio functions; vfio-pci has no ID table of its own (it binds what driver_override gives it).
ID_TABLES = {NVIDIA: (("0x10de",), "0x03"), "snd_hda_intel": (("0x10de", "0x8086"), "0x0403")}


@dataclass(frozen=True)
class SimPciFunction:
    """A PCI function to put in the tree: a GPU or a companion in its IOMMU group (its audio function, a bridge)."""

    address: str
    device_id: int
    pci_class: int = 0x030200
    vendor: int = 0x10DE
    driver: str | None = NVIDIA
    group: int = 0


def gpu_functions(gpus: Iterable[tuple[str, int]]) -> list[SimPciFunction]:
    """One function per GPU (address, PCI device id), each alone in an IOMMU group, bound to ``nvidia``: what an
    HGX board shows (its GPUs have no audio function)."""
    ordered = sorted(gpus)
    return [SimPciFunction(address, device_id, group=FIRST_GROUP + i) for i, (address, device_id) in enumerate(ordered)]


def write_tree(root: Path, functions: Iterable[SimPciFunction], *, vfio_loaded: bool = True) -> Path:
    """Write the tree under ``root`` unless it is there already (it is the node's hardware state: a driver restart
    finds the bindings its predecessor left). Returns ``root``."""
    sys = root / "sys"
    if (sys / "bus/pci/devices").is_dir():
        return root
    for driver in (NVIDIA, *([VFIO_PCI] if vfio_loaded else [])):
        directory = sys / "bus/pci/drivers" / driver
        directory.mkdir(parents=True, exist_ok=True)
        for attribute in ("bind", "unbind"):
            (directory / attribute).touch()
        (sys / "module" / driver.replace("-", "_")).mkdir(parents=True, exist_ok=True)
    (root / "dev/vfio").mkdir(parents=True, exist_ok=True)
    if vfio_loaded:
        (root / "dev/vfio/vfio").touch()
    for function in functions:
        _write_function(sys, function)
    return root


def _write_function(sys: Path, function: SimPciFunction) -> None:
    base = sys / "bus/pci/devices" / function.address
    base.mkdir(parents=True)
    (base / "vendor").write_text(f"0x{function.vendor:04x}\n")
    (base / "device").write_text(f"0x{function.device_id:04x}\n")
    (base / "class").write_text(f"0x{function.pci_class:06x}\n")
    (base / "driver_override").write_text("(null)\n")
    group = sys / "kernel/iommu_groups" / str(function.group) / "devices"
    group.mkdir(parents=True, exist_ok=True)
    (group / function.address).symlink_to(os.path.relpath(base, group))
    (base / "iommu_group").symlink_to(os.path.relpath(group.parent, base))
    if function.driver is not None:
        (sys / "bus/pci/drivers" / function.driver).mkdir(parents=True, exist_ok=True)
        _link_driver(sys, function.address, function.driver)


def _link_driver(sys: Path, address: str, driver: str) -> None:
    base = sys / "bus/pci/devices" / address
    (base / "driver").symlink_to(os.path.relpath(sys / "bus/pci/drivers" / driver, base))


class SimKernel:
    """What the kernel does on a write to the tree under ``root`` (a :class:`~dradriver.nvidia_install.pci_binding.
    SysfsWriter`). ``holders(address)`` names the PIDs that have the GPU at ``address`` open (the simulated node's
    processes)."""

    def __init__(self, root: Path, holders: Callable[[str], list[int]] = lambda _a: []) -> None:
        self.root = root
        self.sys = root / "sys"
        self._holders = holders

    def write(self, path: Path, value: str) -> None:
        relative = Path(path).relative_to(self.sys)
        parts = relative.parts
        if len(parts) == 5 and parts[:3] == ("bus", "pci", "devices") and parts[4] == "driver_override":
            self._set_override(parts[3], value)
        elif len(parts) == 5 and parts[:3] == ("bus", "pci", "drivers") and parts[4] in ("bind", "unbind"):
            if not (self.sys / "bus/pci/drivers" / parts[3]).is_dir():
                raise OSError(errno.ENOENT, f"no driver {parts[3]} (is its module loaded?)", str(path))
            address = value.strip()
            self._require_device(address, path)
            if parts[4] == "bind":
                self._bind(address, parts[3], path)
            else:
                self._unbind(address, parts[3], path)
        else:
            raise OSError(errno.EACCES, "not a writable attribute of the simulated sysfs", str(path))

    def _device(self, address: str) -> Path:
        return self.sys / "bus/pci/devices" / address

    def _require_device(self, address: str, path: Path) -> None:
        if not address or not self._device(address).is_dir():
            raise OSError(errno.ENODEV, f"no PCI device {address!r}", str(path))

    def driver_of(self, address: str) -> str | None:
        link = self._device(address) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def _set_override(self, address: str, value: str) -> None:
        self._require_device(address, self._device(address))
        name = value.strip()
        (self._device(address) / "driver_override").write_text(f"{name or '(null)'}\n")

    def _bind(self, address: str, driver: str, path: Path) -> None:
        if self.driver_of(address) is not None:
            raise OSError(errno.EBUSY, f"{address} is bound to {self.driver_of(address)}", str(path))
        override = (self._device(address) / "driver_override").read_text().strip()
        if override not in ("(null)", driver):
            raise OSError(errno.ENODEV, f"driver_override of {address} is {override}", str(path))
        if override == "(null)" and not self._matches(address, driver):
            raise OSError(errno.ENODEV, f"{driver} does not claim {address} (set driver_override)", str(path))
        _link_driver(self.sys, address, driver)
        self._update_group_node(address)

    def _matches(self, address: str, driver: str) -> bool:
        vendor = (self._device(address) / "vendor").read_text().strip()
        pci_class = (self._device(address) / "class").read_text().strip()
        table = ID_TABLES.get(driver)
        return table is not None and vendor in table[0] and pci_class.startswith(table[1])

    def _unbind(self, address: str, driver: str, path: Path) -> None:
        if self.driver_of(address) != driver:
            raise OSError(errno.ENODEV, f"{address} is not bound to {driver}", str(path))
        holders = self._holders(address) if driver == NVIDIA else []
        if holders:
            pids = ", ".join(str(p) for p in holders)
            raise OSError(errno.EBUSY, f"{address} is open by processes {pids}", str(path))
        (self._device(address) / "driver").unlink()
        self._update_group_node(address)

    def group_of(self, address: str) -> int:
        return int(os.path.basename(os.readlink(self._device(address) / "iommu_group")))

    def _update_group_node(self, address: str) -> None:
        group = self.group_of(address)
        members = [p.name for p in (self.sys / "kernel/iommu_groups" / str(group) / "devices").iterdir()]
        # Bridges (class 0x0604, on pcieport) do not make a group unviable: the kernel lets them stay.
        members = [m for m in members if not (self._device(m) / "class").read_text().startswith("0x0604")]
        drivers = [self.driver_of(m) for m in members]
        node = self.root / "dev/vfio" / str(group)
        viable = any(d == VFIO_PCI for d in drivers) and all(d in (VFIO_PCI, None) for d in drivers)
        if viable:
            node.touch()
        elif not any(d == VFIO_PCI for d in drivers):
            node.unlink(missing_ok=True)
