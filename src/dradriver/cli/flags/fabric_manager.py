"""``--fabric-manager-partitions``: whether ``run`` publishes Fabric Manager's NVSwitch partitions on whole GPUs and
activates the partition of a claim's GPUs at prepare (HGX systems in shared-NVSwitch mode; docs/partitions.md);
``--fabric-manager-address`` and ``--fabric-manager-timeout``: where a real node's Fabric Manager listens and how
long a connection waits for it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import positive_seconds
from dradriver.errors import ConfigError
from dradriver.gpu.fabric_manager import FabricManagerError
from dradriver.gpu.nvfm import DEFAULT_PORT, DEFAULT_SOCKET, DEFAULT_TIMEOUT_MS, FabricManagerAddress

#: fmConnect takes its timeout in milliseconds as a C unsigned int, which a longer one would silently wrap.
MAX_TIMEOUT_MS = 2**32 - 1


def connect_timeout(text: str) -> float:
    """Seconds above 0 whose milliseconds fit fmConnect's unsigned int (``MAX_TIMEOUT_MS``)."""
    seconds = positive_seconds(text)
    if round(seconds * 1000) > MAX_TIMEOUT_MS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: Fabric Manager takes at most {MAX_TIMEOUT_MS} ms ({MAX_TIMEOUT_MS // 1000} s)"
        )
    return seconds


FABRIC_MANAGER_PARTITIONS = EnvFlag(
    flag="--fabric-manager-partitions",
    env="DRADRIVER_FABRIC_MANAGER_PARTITIONS",
    default="false",
    choices=("true", "false"),
    help="publish each whole GPU's Fabric Manager partitions (attributes gpuModuleID and partition<size>) and "
    "activate the partition whose GPUs equal a claim's at prepare, deactivating it at unprepare; for HGX nodes whose "
    "NVSwitches Fabric Manager runs in shared-NVSwitch mode (what NVIDIA's FabricManagerPartitioning gate does)",
)
FABRIC_MANAGER_ADDRESS = EnvFlag(
    flag="--fabric-manager-address",
    env="DRADRIVER_FABRIC_MANAGER_ADDRESS",
    default="",
    metavar="SOCKET|IPV4[:PORT]",
    help="where Fabric Manager's API listens on a real node: a unix socket's absolute path as this container sees "
    f"it, or a TCP address (port {DEFAULT_PORT} unless given; the host's 127.0.0.1 needs hostNetwork); empty: the "
    f"socket {DEFAULT_SOCKET} under the driver root as this container mounts it (NVIDIA's default)",
)
FABRIC_MANAGER_TIMEOUT = EnvFlag(
    flag="--fabric-manager-timeout",
    env="DRADRIVER_FABRIC_MANAGER_TIMEOUT",
    default=DEFAULT_TIMEOUT_MS / 1000,
    type=connect_timeout,
    metavar="SECONDS",
    help="how long each connection to Fabric Manager waits for it (fmConnect's timeout; NVIDIA's: 1 s)",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("NVSwitch partitions")
    for flag in (FABRIC_MANAGER_PARTITIONS, FABRIC_MANAGER_ADDRESS, FABRIC_MANAGER_TIMEOUT):
        flag.add(group)


@dataclass(frozen=True, kw_only=True)
class FabricManagerOptions:
    """``enabled``: ``--fabric-manager-partitions true``; ``address``: ``--fabric-manager-address`` (None: the
    socket under the driver root); ``timeout``: ``--fabric-manager-timeout`` in seconds."""

    enabled: bool = False
    address: FabricManagerAddress | None = None
    timeout: float = DEFAULT_TIMEOUT_MS / 1000

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FabricManagerOptions:
        """The options; ``ConfigError`` for an address that is neither a socket's path nor a TCP address."""
        address = FABRIC_MANAGER_ADDRESS.value(args)
        try:
            parsed = FabricManagerAddress.parse(address) if address else None
        except FabricManagerError as err:
            raise ConfigError(f"--fabric-manager-address: {err}") from None
        return cls(
            enabled=FABRIC_MANAGER_PARTITIONS.value(args) == "true",
            address=parsed,
            timeout=FABRIC_MANAGER_TIMEOUT.value(args),
        )

    def address_in(self, driver_root: Path) -> FabricManagerAddress:
        """Where to reach FM: the address given, else its socket under ``driver_root`` (as this container sees it)."""
        return self.address or FabricManagerAddress(str(driver_root / DEFAULT_SOCKET), True)

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout * 1000))
