"""A whole GPU's device nodes: its /dev/nvidia<minor>, and its DRM nodes matched through sysfs when present."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from support.nodes import inventory_of

from dradriver.nvidia_install.device_nodes import gpu_device_nodes


def test_a_gpu_gets_its_dri_nodes_by_pci_address_when_the_host_has_them(tmp_path: Path) -> None:
    info = replace(inventory_of("mixed").gpus[0].info, minor=3, pci_bus_id="0000:07:00.0")
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    drm = sys_root / "bus/pci/devices/0000:07:00.0/drm"
    for name in ("card1", "renderD128", "controlD64"):
        (drm / name).mkdir(parents=True)
    (dev_root / "dri").mkdir(parents=True)
    (dev_root / "dri/card1").touch()
    (dev_root / "dri/renderD128").touch()
    nodes = [n.path for n in gpu_device_nodes(info, sys_root=sys_root, dev_root=dev_root)]
    assert nodes == ["/dev/nvidia3", "/dev/dri/card1", "/dev/dri/renderD128"]
    # Without nvidia-drm (no drm/ in sysfs) or without the node in /dev, only the GPU's own node.
    (dev_root / "dri/card1").unlink()
    assert [n.path for n in gpu_device_nodes(info, sys_root=sys_root, dev_root=dev_root)] == [
        "/dev/nvidia3",
        "/dev/dri/renderD128",
    ]
    assert [n.path for n in gpu_device_nodes(info, sys_root=tmp_path / "none")] == ["/dev/nvidia3"]
