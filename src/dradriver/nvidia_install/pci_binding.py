"""Which kernel driver holds each NVIDIA PCI function, its IOMMU group, and the sysfs writes that move it.

Everything is read from the host's sysfs as the kernel documents it (Documentation/ABI/testing/sysfs-bus-pci,
sysfs-kernel-iommu_groups): ``/sys/bus/pci/devices/<address>/{vendor,device,class,driver,driver_override,
iommu_group}``, ``/sys/bus/pci/drivers/<driver>/{bind,unbind}`` and ``/sys/kernel/iommu_groups/<n>/devices/``.
A ``host_root`` stands for ``/`` so a test root (the simulated node's tree) is walked the same way; the host's
``/proc`` under it tells which processes hold a GPU's ``/dev/nvidia<minor>`` or DRI nodes open (what ``fuser``
reads), and ``/proc/driver/nvidia/gpus/<address>/information`` the GPU's minor as the ``nvidia`` driver numbers it now.

Reads are plain file reads. Writes go through a :class:`SysfsWriter`: on a real host the kernel acts on a write
to an attribute file (:class:`KernelSysfs` only writes it); the simulated node's writer models what the kernel
does and refuses (``dradriver.sim.sysfs``).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dradriver.errors import DeviceError
from dradriver.faults import fault_point

NVIDIA_VENDOR = "0x10de"
NVIDIA_DRIVER = "nvidia"
VFIO_DRIVER = "vfio-pci"
VFIO_MODULE = "vfio_pci"
# PCI class 0x03 is a display controller (VGA 0x0300, 3D 0x0302): the GPU function itself, not its audio function.
DISPLAY_CLASS_PREFIX = "0x03"
BRIDGE_CLASS_PREFIX = "0x0604"
#: The `nvidia` driver's character-device major (`nvidia-frontend` in `/proc/devices`), 195 in its source.
NVIDIA_MAJOR = 195
#: The fault point passed right after each sysfs write (``DRADRIVER_TEST_CRASH_AT=sysfs-written#<n>``).
SYSFS_WRITTEN = "sysfs-written"
_MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


#: What the host's ``/proc/1/ns/pid`` links to: the kernel's initial PID namespace (``PROC_PID_INIT_INO``). A
#: container's own ``/proc`` (``hostPID`` false, no host-proc volume) names another, and sees only its own processes.
HOST_PID_NAMESPACE = "pid:[4026531836]"


class HoldersUnknown(DeviceError):
    """The host's ``/proc`` could not say who holds a device open: ``/proc`` itself cannot be listed (not mounted
    where the driver looks), or the ``fd`` directories of ``pids`` could not be read. Callers refuse rather than
    take silence for "nobody"."""

    def __init__(self, message: str, pids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.pids = pids


@dataclass(frozen=True)
class NodeRef:
    """A device node looked for among open ``fd`` links: by its device number where the link can be followed
    (``rdev``, ``os.makedev(major, minor)``), by its path otherwise (``path``, matched as a suffix of the link)."""

    path: str
    rdev: int | None = None


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
class OpenHandle:
    """A process that holds a device node open: its PID, its command (``/proc/<pid>/comm``), the path its ``fd``
    link names (in its own mount namespace) and the node it leads to, as the host names it (``/dev/nvidia0``)."""

    pid: int
    command: str
    path: str
    node: str


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

    def iommufd_enabled(self) -> bool:
        """Whether the kernel offers IOMMUFD: its API device ``/dev/iommu`` exists (NVIDIA's test), or sysfs lists
        that misc device (``class/misc/iommu``), for a plugin that has the host's ``/sys`` but not its ``/dev``."""
        return (self.root / "dev/iommu").exists() or (self.sys / "class/misc/iommu").exists()

    def vfio_cdev(self, address: str) -> str | None:
        """The name of the function's VFIO device cdev (``vfio<N>``, from sysfs ``vfio-dev/``), which the kernel makes
        while ``vfio-pci`` holds the function and IOMMUFD is on; None otherwise. Its node is
        ``/dev/vfio/devices/vfio<N>``."""
        directory = self.sys / "bus/pci/devices" / address / "vfio-dev"
        names = sorted(e.name for e in directory.iterdir() if e.name.startswith("vfio")) if directory.is_dir() else []
        return names[0] if names else None

    def device_node_holders(self, minor: int) -> list[OpenHandle]:
        """The processes with ``/dev/nvidia<minor>`` open, by PID (:meth:`gpu_node_holders` without DRI nodes)."""
        return processes_holding(self.root / "proc", [self.nvidia_node(minor)])

    def gpu_node_holders(self, address: str, minor: int) -> list[OpenHandle]:
        """The processes with one of the GPU's device nodes open, by PID, as ``fuser`` finds them: its
        ``/dev/nvidia<minor>`` and its DRI nodes (``/dev/dri/card<N>``, ``renderD<N>``: an ``nvidia-drm`` client
        blocks the unbind too), from every ``fd`` link under the host's ``/proc``. :class:`HoldersUnknown` when
        ``/proc`` cannot be listed or a process's links cannot be read: a holder missed is a host that hangs."""
        return processes_holding(self.root / "proc", [self.nvidia_node(minor), *self.dri_nodes(address)])

    def proc_listable(self) -> bool:
        """Whether the host's ``/proc`` is where the driver reads it (the chart mounts it at ``/host/proc``): it lists
        processes, and its init is in the host's initial PID namespace where that can be read (not a container's
        own ``/proc``)."""
        try:
            _pid_dirs(self.root / "proc")
        except HoldersUnknown:
            return False
        return True

    def nvidia_major(self) -> int:
        """The ``nvidia`` driver's character-device major, from the host's ``/proc/devices`` (``nvidia-frontend``;
        ``nvidia`` on older drivers), 195 when it does not say."""
        try:
            lines = (self.root / "proc/devices").read_text().splitlines()
        except OSError:
            return NVIDIA_MAJOR
        for line in lines:
            number, _, name = line.strip().partition(" ")
            if name.strip() in ("nvidia-frontend", "nvidia") and number.isdigit():
                return int(number)
        return NVIDIA_MAJOR

    def nvidia_node(self, minor: int) -> NodeRef:
        return NodeRef(f"/dev/nvidia{minor}", os.makedev(self.nvidia_major(), minor))

    def dri_nodes(self, address: str) -> list[NodeRef]:
        """The GPU's DRI nodes (sysfs ``drm/card<N>``, ``drm/renderD<N>`` with their ``dev`` numbers); none without
        ``nvidia-drm``."""
        directory = self.sys / "bus/pci/devices" / address / "drm"
        found = []
        for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
            if entry.name.startswith(("card", "renderD")):
                found.append(NodeRef(f"/dev/dri/{entry.name}", _dev_number(entry / "dev")))
        return found

    def live_minor(self, address: str) -> int | None:
        """The GPU's minor as the ``nvidia`` driver numbers it now (``Device Minor:`` of the host's
        ``/proc/driver/nvidia/gpus/<address>/information``); None where that file is not readable."""
        try:
            text = (self.root / "proc/driver/nvidia/gpus" / address.lower() / "information").read_text()
        except OSError:
            return None
        match = _MINOR_LINE.search(text)
        return int(match.group(1)) if match else None

    def sriov_numvfs(self, address: str) -> int:
        """How many SR-IOV virtual functions the function has enabled (sysfs ``sriov_numvfs``; 0 without SR-IOV)."""
        try:
            return int(_read(self.sys / "bus/pci/devices" / address / "sriov_numvfs") or "0")
        except (OSError, ValueError):
            return 0

    # --- writes (the kernel's ABI) --------------------------------------------------------------------------

    def set_driver_override(self, address: str, driver: str | None) -> None:
        """Only ``driver`` may bind ``address`` from now on; None (written as a newline) clears the override."""
        self._write(self.sys / "bus/pci/devices" / address / "driver_override", f"{driver or ''}\n")

    def unbind(self, address: str, driver: str) -> None:
        self._write(self.sys / "bus/pci/drivers" / driver / "unbind", address)

    def bind(self, address: str, driver: str) -> None:
        self._write(self.sys / "bus/pci/drivers" / driver / "bind", address)

    def _write(self, path: Path, value: str) -> None:
        self.writer.write(path, value)
        # Tests kill the process right after each write (faults.py), so every state between two writes is walked.
        fault_point(SYSFS_WRITTEN)


def processes_holding(proc: Path, nodes: Iterable[NodeRef]) -> list[OpenHandle]:
    """The processes under ``proc`` (a ``/proc``) with an ``fd`` link to one of ``nodes``, by PID.

    A link is matched by the device number it leads to (``stat`` follows it into its process's mount namespace, so
    a node renamed in a container or deleted since, ``/dev/nvidia0 (deleted)``, counts), and by its path's suffix
    where it leads to no character device. Only a link whose target is under ``/dev/`` or deleted is followed:
    ``readlink`` never blocks, but ``stat`` of a file on a dead NFS or FUSE mount can, for good; a link that cannot
    be followed (``ESTALE``, ``EIO``, ``EACCES``, …) is matched by its path. :class:`HoldersUnknown` when ``proc``
    cannot be listed (or is a container's own), or when a process's ``fd`` directory cannot be read for another
    reason than its end (naming those PIDs)."""
    wanted = list(nodes)
    found, unreadable = [], []
    for entry in _pid_dirs(proc):
        try:
            held = _held(entry / "fd", wanted)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process ended
        except OSError:
            unreadable.append(int(entry.name))
            continue
        if held is not None:
            found.append(OpenHandle(int(entry.name), _command(entry), *held))
    if unreadable:
        pids = tuple(sorted(unreadable))
        raise HoldersUnknown(
            f"the open files of processes {', '.join(str(p) for p in pids)} under {proc} cannot be read, so whether "
            "they hold the GPU is unknown; run the driver with CAP_SYS_PTRACE (privileged, as the chart does)",
            pids,
        )
    return sorted(found, key=lambda h: h.pid)


def _pid_dirs(proc: Path) -> list[Path]:
    try:
        found = [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError as err:
        raise _proc_unknown(proc, err.strerror or str(err)) from err
    if not found:  # a /proc has its init at least: an empty directory is a mount point with nothing mounted
        raise _proc_unknown(proc, "no process in it")
    namespace = _pid_namespace(proc)
    if namespace is not None and namespace != HOST_PID_NAMESPACE:
        raise _proc_unknown(
            proc, f"it is a container's own /proc: its init's PID namespace is {namespace}, not the host's"
        )
    return found


def _pid_namespace(proc: Path) -> str | None:
    """What ``<proc>/1/ns/pid`` links to; None where it cannot be read (no such link, no CAP_SYS_PTRACE)."""
    try:
        return os.readlink(proc / "1/ns/pid")
    except OSError:
        return None


def _proc_unknown(proc: Path, why: str) -> HoldersUnknown:
    return HoldersUnknown(
        f"{proc} cannot be listed ({why}), so which processes hold the GPU is unknown; mount the host's /proc where "
        "the driver reads it (the chart's host-proc volume at /host/proc)"
    )


def _held(fd_dir: Path, wanted: list[NodeRef]) -> tuple[str, str] | None:
    """The first link in ``fd_dir`` to one of ``wanted``: its path and the node's; raises what listing ``fd_dir``
    raised."""
    for link in list(fd_dir.iterdir()):
        try:
            target = os.readlink(link)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the fd was closed between the listing and the read
        rdev = _char_device(link) if _may_be_device(target) else None
        for node in wanted:
            if (rdev is not None and rdev == node.rdev) or (rdev is None and target.endswith(node.path)):
                return target, node.path
    return None


def _may_be_device(target: str) -> bool:
    """Whether an ``fd`` link's target may be a device node: under ``/dev/`` as its process sees it, or deleted."""
    return target.startswith("/dev/") or target.endswith(" (deleted)")


def _char_device(link: Path) -> int | None:
    """The device number of the character device ``link`` leads to; None where it leads to none, nowhere, or
    cannot be followed (a path that does not exist here, a stale mount, no permission): matched by its path."""
    try:
        info = os.stat(link)
    except OSError:
        return None
    return info.st_rdev if stat.S_ISCHR(info.st_mode) else None


def _dev_number(path: Path) -> int | None:
    """``major:minor`` of a sysfs ``dev`` file as a device number; None where it does not read."""
    try:
        major, minor = _read(path).split(":")
        return os.makedev(int(major), int(minor))
    except (OSError, ValueError):
        return None


def _command(pid_dir: Path) -> str:
    try:
        return _read(pid_dir / "comm")
    except OSError:
        return "?"


def _read(path: Path) -> str:
    return path.read_text().strip()
