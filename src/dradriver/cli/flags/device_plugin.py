"""``--device-plugin-coexistence``, ``--device-plugins-dir``: what ``run`` does when NVIDIA's device plugin is on
its node (:mod:`dradriver.driver.checks.device_plugin`), and where the kubelet keeps the plugins' sockets."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
from dradriver.driver.checks.settings import DEVICE_PLUGINS_DIR, DevicePluginSettings

REFUSE, WITHHOLD = "refuse", "withhold"
COEXISTENCE = EnvFlag(
    flag="--device-plugin-coexistence",
    env="DRADRIVER_DEVICE_PLUGIN_COEXISTENCE",
    default=REFUSE,
    choices=(REFUSE, WITHHOLD),
    help="when NVIDIA's device plugin is on this node (its kubelet socket, or nvidia.com/gpu* or nvidia.com/mig-* "
    "resources on the Node): "
    "refuse to start (arrived later, none of the GPUs is published until it is gone, with an error), or, while "
    "the node is being migrated, withhold: publish none of the GPUs while it advertises any (which ones it holds "
    "cannot be told) and publish them once it is gone",
)
DEVICE_PLUGINS = EnvFlag(
    flag="--device-plugins-dir",
    env="DRADRIVER_DEVICE_PLUGINS_DIR",
    default=str(DEVICE_PLUGINS_DIR),
    help="the kubelet's device-plugins directory, where NVIDIA's device plugin registers "
    "(nvidia-gpu*.sock, nvidia-mig-*.sock)",
)


def add_flags(parser: argparse.ArgumentParser, *, coexistence: bool = True) -> None:
    """The device-plugins directory and (``coexistence``: for ``run``) what to do when the plugin is there."""
    DEVICE_PLUGINS.add(parser)
    if coexistence:
        COEXISTENCE.add(parser)


@dataclass(frozen=True, kw_only=True)
class DevicePluginOptions:
    """``coexistence`` (refuse or withhold) and ``directory`` (the kubelet's device-plugins directory)."""

    coexistence: str = REFUSE
    directory: Path = DEVICE_PLUGINS_DIR

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DevicePluginOptions:
        return cls(
            coexistence=COEXISTENCE.value(args), directory=Path(DEVICE_PLUGINS.value(args) or DEVICE_PLUGINS_DIR)
        )

    @property
    def withhold(self) -> bool:
        return self.coexistence == WITHHOLD

    def settings(self, node_name: str) -> DevicePluginSettings:
        """What the check reads, for the node ``node_name``."""
        return DevicePluginSettings(device_plugins_dir=self.directory, node_name=node_name)
