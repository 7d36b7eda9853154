"""The device nodes of a whole GPU: ``/dev/nvidia<minor>``, plus its DRM nodes where the driver provides them.

Graphics and video workloads (Vulkan, EGL, NVENC through VA-API) open ``/dev/dri/card<N>`` and
``/dev/dri/renderD<N>``; NVIDIA's toolkit adds the ones of each GPU, matched by PCI address through sysfs
(``/sys/bus/pci/devices/<bdf>/drm/``). They exist only where ``nvidia-drm`` is loaded, so each is added only when
the host has it: a runtime fails a container over a node it cannot stat. Programs that pick a GPU by its PCI
address look for udev's ``/dev/dri/by-path/pci-<bdf>-card`` and ``-render`` links, which the spec's hook makes.
"""

from __future__ import annotations

from pathlib import Path

from dradriver.gpu.models import DeviceNode, GpuInfo

SYS_ROOT = Path("/sys")
DEV_ROOT = Path("/dev")


def gpu_device_nodes(info: GpuInfo, *, sys_root: Path = SYS_ROOT, dev_root: Path = DEV_ROOT) -> tuple[DeviceNode, ...]:
    """``/dev/nvidia<minor>`` and the GPU's ``/dev/dri`` nodes present on the host."""
    return (DeviceNode(f"/dev/nvidia{info.minor}"), *dri_nodes(info.pci_bus_id, sys_root=sys_root, dev_root=dev_root))


def dri_by_path_links(pci_bus_id: str, nodes: tuple[DeviceNode, ...] | list[DeviceNode]) -> tuple[tuple[str, str], ...]:
    """udev's ``/dev/dri/by-path`` links of a GPU's DRI ``nodes``: (target, link), e.g. (``../card1``,
    ``/dev/dri/by-path/pci-0000:0f:00.0-card``)."""
    links = []
    for node in nodes:
        name = node.path.removeprefix("/dev/dri/")
        kind = "card" if name.startswith("card") else "render" if name.startswith("renderD") else None
        if kind is not None and "/" not in name:
            links.append((f"../{name}", f"/dev/dri/by-path/pci-{pci_bus_id.lower()}-{kind}"))
    return tuple(links)


def dri_nodes(pci_bus_id: str, *, sys_root: Path = SYS_ROOT, dev_root: Path = DEV_ROOT) -> tuple[DeviceNode, ...]:
    drm = sys_root / "bus/pci/devices" / pci_bus_id.lower() / "drm"
    try:
        names = sorted(entry.name for entry in drm.iterdir())
    except OSError:
        return ()
    return tuple(
        DeviceNode(f"/dev/dri/{name}")
        for name in names
        if name.startswith(("card", "renderD")) and (dev_root / "dri" / name).exists()
    )
