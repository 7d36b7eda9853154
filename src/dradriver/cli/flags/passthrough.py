"""``--passthrough``, ``--passthrough-host-root``: whether ``run`` also offers every GPU for VFIO passthrough to
virtual machines (KubeVirt), and where it finds the host's sysfs and ``/dev/vfio`` (docs/passthrough.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag

PASSTHROUGH = EnvFlag(
    flag="--passthrough",
    env="DRADRIVER_PASSTHROUGH",
    default="false",
    choices=("true", "false"),
    help="also offer every GPU as a VFIO passthrough device (type vfio, DeviceClass vfio.gpu.dradriver.dev): "
    "its prepare binds the GPU's IOMMU group to vfio-pci and gives the container /dev/vfio; needs the IOMMU on and "
    "the vfio-pci module (what NVIDIA's PassthroughSupport gate does)",
)
HOST_ROOT = EnvFlag(
    flag="--passthrough-host-root",
    env="DRADRIVER_PASSTHROUGH_HOST_ROOT",
    default="",
    metavar="DIR",
    help="where the host's /sys and /dev/vfio are seen (the chart mounts them under /host); default: / on a "
    "real node, a sysfs tree of the simulated node's own in the plugin directory with --gpu-backend sim",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("VFIO passthrough")
    PASSTHROUGH.add(group)
    HOST_ROOT.add(group)


@dataclass(frozen=True, kw_only=True)
class PassthroughOptions:
    """``enabled`` (``--passthrough true``) and the host root (None: the backend's default)."""

    enabled: bool = False
    host_root: Path | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PassthroughOptions:
        root = HOST_ROOT.value(args)
        return cls(enabled=PASSTHROUGH.value(args) == "true", host_root=Path(root) if root else None)
