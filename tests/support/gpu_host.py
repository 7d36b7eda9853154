"""A GPU node's host files outside the driver root, as fixtures: device nodes, ``/proc`` and ``/sys`` entries.

Built from a simulated node's inventory (its GPUs' minors and PCI addresses, its MIG devices' GPU- and
compute-instance ids), the way the NVIDIA driver lays them out on a real node:

- ``dev/``: ``nvidia<minor>`` per GPU and the control nodes (``nvidiactl``, ``nvidia-modeset``, ``nvidia-uvm``,
  ``nvidia-uvm-tools``), made with ``mknod``; ``nvidia-caps/nvidia-cap<N>`` for the MIG ``config`` and ``monitor``
  capabilities and each existing MIG device's GPU- and compute-instance access; ``dri/card<N>``,
  ``dri/renderD<N>`` per GPU (``nvidia-drm``) and their ``dri/by-path/pci-<address>-{card,render}`` links;
- ``proc/``: ``devices`` (the majors), ``driver/nvidia-caps/mig-minors`` (every capability's minor, as the driver
  numbers them: config 1, monitor 2, then 15 GPU instances of 9 minors per GPU), and
  ``driver/nvidia/capabilities/gpu<M>/mig/gi<G>[/ci<C>]/access`` of the existing MIG devices;
- ``sys/``: ``bus/pci/devices/<address>/drm/{card<N>,renderD<N>}``, how a GPU's DRM nodes are found.

Making device nodes needs root (CAP_MKNOD).
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dradriver.gpu.inventory import Inventory
from support import required

NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 508
DRM_MAJOR = 226
GPU_INSTANCES_PER_GPU = 15
COMPUTE_INSTANCES_PER_GPU_INSTANCE = 8
CONTROL_NODES = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-modeset": (NVIDIA_MAJOR, 254),
                 "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}  # fmt: skip
CAP_FILE = "DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


@dataclass(frozen=True)
class GpuHost:
    """The stand-ins: ``dev_root`` holds ``dev/`` (a dev root in NVIDIA's sense), ``proc`` and ``sys`` stand for
    ``/proc`` and ``/sys``."""

    dev_root: Path
    proc: Path
    sys: Path

    @property
    def dev(self) -> Path:
        return self.dev_root / "dev"


def need_mknod() -> None:
    """Skip (or fail, support/required.py) where device nodes cannot be made (not root, or no CAP_MKNOD)."""
    with tempfile.TemporaryDirectory() as scratch:
        try:
            os.mknod(Path(scratch) / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError as err:
            required.need("the right to make device nodes", f"the host fixture's nodes are made with mknod: {err}",
                          "run the tests as root (`scripts/test` does)")  # fmt: skip


def gi_minor(gpu_minor: int, gpu_instance: int) -> int:
    """The minor of GPU instance ``gpu_instance``'s access capability (``mig-minors``' numbering)."""
    return 3 + gpu_minor * GPU_INSTANCES_PER_GPU * (1 + COMPUTE_INSTANCES_PER_GPU_INSTANCE) + gpu_instance * 9


def build_gpu_host(base: Path, inventory: Inventory) -> GpuHost:
    """Lay out the host files of ``inventory``'s node under ``base`` (see the module docstring)."""
    host = GpuHost(base / "host", base / "proc", base / "sys")
    host.dev.mkdir(parents=True)
    for name, (major, minor) in CONTROL_NODES.items():
        _mknod(host.dev / name, major, minor)
    for index, gpu in enumerate(inventory.gpus):
        _mknod(host.dev / f"nvidia{gpu.info.minor}", NVIDIA_MAJOR, gpu.info.minor)
        _drm(host, gpu.info.pci_bus_id, index)
    _write_proc(host, inventory)
    return host


def _drm(host: GpuHost, pci_bus_id: str, index: int) -> None:
    for kind, name, minor in (
        ("card", f"card{index + 1}", index + 1),
        ("render", f"renderD{128 + index}", 128 + index),
    ):
        _mknod(host.dev / "dri" / name, DRM_MAJOR, minor)
        (host.sys / "bus/pci/devices" / pci_bus_id / "drm" / name).mkdir(parents=True)
        link = host.dev / "dri/by-path" / f"pci-{pci_bus_id}-{kind}"
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(f"../{name}")


def _write_proc(host: GpuHost, inventory: Inventory) -> None:
    _write(host.proc / "devices",
           f"Character devices:\n  1 mem\n{NVIDIA_MAJOR} nvidia-frontend\n{DRM_MAJOR} drm\n{CAPS_MAJOR} nvidia-caps\n"
           f"{UVM_MAJOR} nvidia-uvm\n\nBlock devices:\n  8 sd\n")  # fmt: skip
    lines = ["config 1", "monitor 2"]
    for gpu in sorted(g.info.minor for g in inventory.gpus):
        for gi in range(GPU_INSTANCES_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {gi_minor(gpu, gi) + 1 + ci}" for ci in range(8)]
    _write(host.proc / "driver/nvidia-caps/mig-minors", "\n".join(lines) + "\n")
    capabilities = host.proc / "driver/nvidia/capabilities"
    for name, minor in (("config", 1), ("monitor", 2)):
        _write(capabilities / "mig" / name, CAP_FILE.format(minor=minor))
        _mknod(host.dev / "nvidia-caps" / f"nvidia-cap{minor}", CAPS_MAJOR, minor, mode=0o400)
    for partition in inventory.mig_devices:
        mig = partition.existing
        assert mig is not None
        gpu, gi, ci = partition.parent.info.minor, mig.gpu_instance_id, mig.compute_instance_id
        base = capabilities / f"gpu{gpu}/mig/gi{gi}"
        for access, minor in (
            (base / "access", gi_minor(gpu, gi)),
            (base / f"ci{ci}/access", gi_minor(gpu, gi) + 1 + ci),
        ):
            _write(access, CAP_FILE.format(minor=minor))
            _mknod(host.dev / "nvidia-caps" / f"nvidia-cap{minor}", CAPS_MAJOR, minor, mode=0o444)


def _mknod(path: Path, major: int, minor: int, *, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, mode)  # past the umask


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
