"""The simulated node's sysfs and ``/dev/vfio``: a file tree under a test root, and the kernel's answers to writes.

The tree has the kernel's layout (``sys/bus/pci/devices/<address>/{vendor,device,class,driver,driver_override,
iommu_group}``, ``sys/bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind}``, ``sys/kernel/iommu_groups/<n>/devices/``,
``sys/module/{nvidia,vfio_pci}``, ``dev/vfio/{vfio,<n>}``), so the driver's real code
(:mod:`dradriver.nvidia_install.pci_binding`) walks it unchanged. Driver links are symlinks as in sysfs; device
nodes are plain files (a test root cannot hold character devices).

A file tree does not act on writes, so :class:`SimKernel` does what the kernel would and refuses as it does:
``ENODEV`` to unbind a function from a driver that does not hold it or to bind one whose ``driver_override``
names another driver; ``EBUSY`` to bind a function a driver holds already, or to unbind a GPU from ``nvidia``
while a process has it open, NVML's compute processes and any process whose ``fd`` links under the root's ``proc``
name its ``/dev/nvidia<minor>``, and this process while its simulated NVML session is open (the real driver waits
for its clients instead; refusing is the same answer, sooner, and :meth:`SimKernel.hold_unbind` makes an unbind
wait as the real one does);
``ENOENT`` to bind to ``vfio-pci`` before its module is loaded. ``/dev/vfio/<group>`` appears once every function
of the group is bound to ``vfio-pci`` or to no driver, PCI bridges aside (a *viable* group: the kernel refuses to
open the group otherwise) and goes when none is bound to ``vfio-pci``. With IOMMUFD on (``dev/iommu``, written by
``write_tree(iommufd=True)``) a function bound to ``vfio-pci`` also gets its device cdev, the lowest free
``vfio<N>``: ``sys/bus/pci/devices/<address>/vfio-dev/vfio<N>/`` and ``dev/vfio/devices/vfio<N>``.

The tree has the host's ``proc`` too, as the driver reads it: ``proc/1`` (init, holding nothing), ``proc/devices``
(the ``nvidia-frontend`` major), ``proc/driver/nvidia/gpus/<address>/information`` (the GPU's ``Device Minor:``,
:func:`write_gpu_information`) and the processes :func:`hold_open` models. A GPU function has ``sriov_numvfs``
(``0``; :func:`set_sriov_numvfs` enables virtual functions) and, with :func:`add_dri_nodes`, its ``drm/card<N>`` and
``drm/renderD<N>`` as ``nvidia-drm`` makes them.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dradriver.nvidia_install.pci_binding import HoldersUnknown, HostPci

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


def write_tree(
    root: Path, functions: Iterable[SimPciFunction], *, vfio_loaded: bool = True, iommufd: bool = False
) -> Path:
    """Write the tree under ``root`` unless it is there already (it is the node's hardware state: a driver restart
    finds the bindings its predecessor left); ``iommufd`` adds ``dev/iommu``. Returns ``root``."""
    sys = root / "sys"
    _write_proc(root)  # a tree written before the simulated node had a proc gets one too
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
    if iommufd:
        (root / "dev/iommu").touch()
    for function in functions:
        _write_function(sys, function)
    return root


def _write_proc(root: Path) -> None:
    proc = root / "proc"
    (proc / "1/fd").mkdir(parents=True, exist_ok=True)
    (proc / "1/comm").write_text("init\n")
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n226 drm\n")


def write_gpu_information(root: Path, address: str, *, minor: int) -> None:
    """The ``nvidia`` driver's ``/proc/driver/nvidia/gpus/<address>/information`` for a GPU it holds (its minor is
    the one it numbers the GPU with now, which NVML's may not be after GPUs were re-bound in another order)."""
    directory = root / "proc/driver/nvidia/gpus" / address.lower()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "information").write_text(
        f"Bus Type: \t PCIe\nBus Location: \t {address.lower()}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
    )


def set_sriov_numvfs(root: Path, address: str, count: int) -> None:
    """Enable ``count`` SR-IOV virtual functions on the function at ``address`` (what a vGPU host does)."""
    (root / "sys/bus/pci/devices" / address / "sriov_numvfs").write_text(f"{count}\n")


def add_dri_nodes(root: Path, address: str, *, card: int) -> list[str]:
    """Give the GPU at ``address`` the DRI nodes ``nvidia-drm`` makes (``card<card>``, ``renderD<128+card>``: sysfs
    ``drm/`` entries with their ``dev`` numbers, and the nodes under ``dev/dri``). Returns the nodes' paths."""
    paths = []
    for name, minor in ((f"card{card}", card), (f"renderD{128 + card}", 128 + card)):
        entry = root / "sys/bus/pci/devices" / address / "drm" / name
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "dev").write_text(f"226:{minor}\n")
        node = root / "dev/dri" / name
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch()
        paths.append(f"/dev/dri/{name}")
    return paths


def _write_function(sys: Path, function: SimPciFunction) -> None:
    base = sys / "bus/pci/devices" / function.address
    base.mkdir(parents=True)
    (base / "vendor").write_text(f"0x{function.vendor:04x}\n")
    (base / "device").write_text(f"0x{function.device_id:04x}\n")
    (base / "class").write_text(f"0x{function.pci_class:06x}\n")
    (base / "driver_override").write_text("(null)\n")
    if function.pci_class >> 16 == 0x03:  # a GPU: SR-IOV capable, no virtual function enabled
        (base / "sriov_numvfs").write_text("0\n")
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


def open_device_node(root: Path, *, pid: int, command: str, minor: int) -> Path:
    """Model a host process (``nvidia-smi`` in a loop, a monitoring agent) that holds ``/dev/nvidia<minor>`` open
    without a CUDA context, so NVML lists no process: ``proc/<pid>/comm`` and an ``fd`` link to the node under
    ``root``, as ``/proc`` shows it. Returns the process's ``proc`` directory."""
    return hold_open(root, pid=pid, command=command, path=f"/dev/nvidia{minor}")


def hold_open(root: Path, *, pid: int, command: str, path: str) -> Path:
    """Model a host process that holds the device node ``path`` (``/dev/nvidia0``, ``/dev/dri/renderD128``) open:
    ``proc/<pid>/comm`` and an ``fd`` link to the node under ``root``. Returns the process's ``proc`` directory."""
    node = root / path.lstrip("/")
    node.parent.mkdir(parents=True, exist_ok=True)
    node.touch()
    process = root / "proc" / str(pid)
    (process / "fd").mkdir(parents=True, exist_ok=True)
    (process / "comm").write_text(f"{command}\n")
    fd = process / "fd" / str(3 + sum(1 for _ in (process / "fd").iterdir()))
    fd.symlink_to(node)
    return process


def end_process(root: Path, pid: int) -> None:
    """The process ``pid`` of :func:`open_device_node` ends: its ``proc`` entry goes, and its handles with it."""
    shutil.rmtree(root / "proc" / str(pid), ignore_errors=True)


def _gpu_addresses(sys: Path) -> list[str]:
    devices = sys / "bus/pci/devices"
    entries = sorted(devices.iterdir()) if devices.is_dir() else []
    return [e.name for e in entries if (e / "class").read_text().startswith("0x03")]


class SimKernel:
    """What the kernel does on a write to the tree under ``root`` (a :class:`~dradriver.nvidia_install.pci_binding.
    SysfsWriter`). ``holders(address)`` names the PIDs that have the GPU at ``address`` open (the simulated node's
    processes); ``minor_of(address)`` the GPU's ``/dev/nvidia`` minor, whose ``fd`` links under ``root/proc`` hold
    it open too."""

    def __init__(
        self,
        root: Path,
        holders: Callable[[str], list[int]] = lambda _a: [],
        minor_of: Callable[[str], int | None] = lambda _a: None,
    ) -> None:
        self.root = root
        self.sys = root / "sys"
        self._holders = holders
        self._minor_of = minor_of
        for address in _gpu_addresses(self.sys):
            minor = minor_of(address)
            if minor is not None and not (root / "proc/driver/nvidia/gpus" / address / "information").exists():
                write_gpu_information(root, address, minor=minor)  # as the nvidia driver numbered it at its load
        self._held_unbinds: dict[tuple[str, str], threading.Event] = {}  # (address, driver) → its let-go

    def hold_unbind(self, address: str, driver: str = NVIDIA) -> threading.Event:
        """Make the next unbinds of ``address`` from ``driver`` wait, as the real ``nvidia`` driver's remove does
        while a process has the GPU open (and ``vfio-pci``'s while a VFIO user holds it), until the returned event
        is set (a test sets it to let them finish)."""
        return self._held_unbinds.setdefault((address, driver), threading.Event())

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
        if driver == VFIO_PCI:
            self._add_cdev(address)
        self._update_group_node(address)

    def _add_cdev(self, address: str) -> None:
        if not (self.root / "dev/iommu").exists():
            return
        devices = self.root / "dev/vfio/devices"
        devices.mkdir(parents=True, exist_ok=True)
        taken = {e.name for e in devices.iterdir()}
        name = next(f"vfio{n}" for n in range(len(taken) + 1) if f"vfio{n}" not in taken)
        (self._device(address) / "vfio-dev" / name).mkdir(parents=True)
        (devices / name).touch()

    def _remove_cdev(self, address: str) -> None:
        directory = self._device(address) / "vfio-dev"
        for entry in directory.iterdir() if directory.is_dir() else ():
            (self.root / "dev/vfio/devices" / entry.name).unlink(missing_ok=True)
            entry.rmdir()

    def _matches(self, address: str, driver: str) -> bool:
        vendor = (self._device(address) / "vendor").read_text().strip()
        pci_class = (self._device(address) / "class").read_text().strip()
        table = ID_TABLES.get(driver)
        return table is not None and vendor in table[0] and pci_class.startswith(table[1])

    def _unbind(self, address: str, driver: str, path: Path) -> None:
        if self.driver_of(address) != driver:
            raise OSError(errno.ENODEV, f"{address} is not bound to {driver}", str(path))
        held = self._held_unbinds.get((address, driver))
        if held is not None:
            # Bounded only so a test that never sets it cannot hang its process for good.
            held.wait(timeout=600)
            self._held_unbinds.pop((address, driver), None)
        holders = self._open_by(address) if driver == NVIDIA else []
        if holders:
            pids = ", ".join(str(p) for p in holders)
            raise OSError(errno.EBUSY, f"{address} is open by processes {pids}", str(path))
        (self._device(address) / "driver").unlink()
        self._remove_cdev(address)
        self._update_group_node(address)

    def _open_by(self, address: str) -> list[int]:
        live = HostPci(self.root).live_minor(address)  # the nvidia driver's numbering, as its proc file says
        minor = live if live is not None else self._minor_of(address)
        return sorted({*self._holders(address), *(self._fd_holders(address, minor) if minor is not None else [])})

    def _fd_holders(self, address: str, minor: int) -> list[int]:
        """Who holds the GPU's ``/dev/nvidia<minor>`` or DRI nodes by an ``fd`` link (the kernel knows; a process
        whose links the tree does not show counts as one)."""
        if not (self.root / "proc").is_dir():
            return []
        try:
            return [h.pid for h in HostPci(self.root).gpu_node_holders(address, minor)]
        except HoldersUnknown as unknown:
            return list(unknown.pids)

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
