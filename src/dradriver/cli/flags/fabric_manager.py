"""``--fabric-manager-partitions``: whether ``run`` publishes Fabric Manager's NVSwitch partitions on whole GPUs and
activates the partition of a claim's GPUs at prepare (HGX systems in shared-NVSwitch mode; docs/partitions.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag

FABRIC_MANAGER_PARTITIONS = EnvFlag(
    flag="--fabric-manager-partitions",
    env="DRADRIVER_FABRIC_MANAGER_PARTITIONS",
    default="false",
    choices=("true", "false"),
    help="publish each whole GPU's Fabric Manager partitions (attributes gpuModuleID and partition<size>) and "
    "activate the partition whose GPUs equal a claim's at prepare, deactivating it at unprepare; for HGX nodes whose "
    "NVSwitches Fabric Manager runs in shared-NVSwitch mode (what NVIDIA's FabricManagerPartitioning gate does)",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("NVSwitch partitions")
    FABRIC_MANAGER_PARTITIONS.add(group)


@dataclass(frozen=True, kw_only=True)
class FabricManagerOptions:
    """``enabled``: ``--fabric-manager-partitions true``."""

    enabled: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FabricManagerOptions:
        return cls(enabled=FABRIC_MANAGER_PARTITIONS.value(args) == "true")
