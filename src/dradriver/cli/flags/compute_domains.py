"""``--compute-domains`` and ``--cd-*``: the ComputeDomain driver ``dradriver run`` serves beside the GPU driver."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.publishing import COMPAT
from dradriver.cli.flags.values import interval_seconds, non_negative_float

DEFAULT_NAMESPACE = "dradriver"
DEFAULT_PROC_ROOT = "/proc"
# computedomain.api's DRIVER_NAME (tests/cli/test_run.py checks they agree): the ComputeDomain modules, pydantic
# models among them, load only when --compute-domains is on, not in every GPU driver (docs/reliability.md, memory).
DRIVER_NAME = "compute-domain.dradriver.dev"

COMPUTE_DOMAINS = EnvFlag(
    flag="--compute-domains",
    env="DRADRIVER_COMPUTE_DOMAINS",
    default="false",
    choices=("true", "false"),
    help=f"also serve {DRIVER_NAME} (ComputeDomains: IMEX channels for multi-node NVLink jobs)",
)
CD_NAMESPACE = EnvFlag(
    flag="--cd-namespace",
    env="POD_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    help="the driver's namespace, where ComputeDomain daemons and their cliques live",
)
CD_READY_TIMEOUT = EnvFlag(
    flag="--cd-ready-timeout",
    env="DRADRIVER_CD_READY_TIMEOUT",
    default=0.0,
    type=non_negative_float,
    metavar="SECONDS",
    help="deprecated, ignored: a channel prepare no longer waits for this node's IMEX daemon (it looks once "
    "and the kubelet retries), since a wait would hold up the daemon's own prepare",
)
CD_FABRIC_INTERVAL = EnvFlag(
    flag="--cd-fabric-interval",
    env="DRADRIVER_CD_FABRIC_INTERVAL",
    default=10.0,
    type=interval_seconds,
    metavar="SECONDS",
    help="how often to re-read the node's NVLink clique (the fabric manager may re-register GPUs); 0: never",
)
CD_PROC_ROOT = EnvFlag(
    flag="--cd-proc-root",
    env="DRADRIVER_CD_PROC_ROOT",
    default=DEFAULT_PROC_ROOT,
    help="where /proc/devices and the NVIDIA capability files are read (a simulated node writes its own)",
)

# NVIDIA's names (its kubelet plugin's --imex-mode and --imex-host-socket-path; computedomain/host_imex.py's values).
IMEX_MODE = EnvFlag(
    flag="--imex-mode",
    env="DRADRIVER_IMEX_MODE",
    default="driverManaged",
    choices=("driverManaged", "hostManaged"),
    help="who runs nvidia-imex: driverManaged, one daemon per ComputeDomain on the nodes its workloads use (jobs "
    "isolated from each other); hostManaged, the node's own nvidia-imex service serves every domain and channel 0 is "
    "handed out once it answers READY (no isolation between jobs; what NVIDIA's HostManagedIMEXDaemon gate allows)",
)
IMEX_HOST_SOCKET_PATH = EnvFlag(
    flag="--imex-host-socket-path",
    env="DRADRIVER_IMEX_HOST_SOCKET_PATH",
    default="/etc/nvidia-imex/imex_ctrl.sock",
    metavar="PATH",
    help="with --imex-mode hostManaged: the host daemon's control socket (IMEX_CMD_UNIX_DOMAIN_PATH in its config, "
    "with IMEX_CMD_ENABLED=1), under the driver root; nvidia-imex-ctl -q asks it before a channel is handed out",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Whether to serve ComputeDomains, and how."""
    flags = (COMPUTE_DOMAINS, CD_NAMESPACE, CD_READY_TIMEOUT, CD_FABRIC_INTERVAL, CD_PROC_ROOT, IMEX_MODE)
    for flag in (*flags, IMEX_HOST_SOCKET_PATH):
        flag.add(parser)


@dataclass(frozen=True, kw_only=True)
class ComputeDomainOptions:
    """Whether the ComputeDomain driver runs, the namespace of its daemons, how often the node's clique is read
    again (0: never) and where the node's /proc is read (``--cd-ready-timeout`` is deprecated and ignored)."""

    enabled: bool = False
    namespace: str = DEFAULT_NAMESPACE
    fabric_interval: float = 10.0
    proc_root: Path = Path(DEFAULT_PROC_ROOT)
    #: ``--imex-mode``: "driverManaged" or "hostManaged" (the host's IMEX service at ``imex_host_socket``).
    imex_mode: str = "driverManaged"
    imex_host_socket: str = "/etc/nvidia-imex/imex_ctrl.sock"
    #: ``--compat`` (the GPU driver's flag): "nvidia" serves NVIDIA's ComputeDomain names (computedomain.api.NVIDIA).
    compat: str = "none"

    @property
    def host_managed(self) -> bool:
        return self.imex_mode == "hostManaged"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ComputeDomainOptions:
        return cls(
            enabled=COMPUTE_DOMAINS.value(args) == "true",
            namespace=CD_NAMESPACE.value(args),
            fabric_interval=CD_FABRIC_INTERVAL.value(args),
            proc_root=Path(CD_PROC_ROOT.value(args)),
            imex_mode=IMEX_MODE.value(args),
            imex_host_socket=IMEX_HOST_SOCKET_PATH.value(args),
            compat=COMPAT.value(args),
        )
