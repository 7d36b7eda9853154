"""``--compute-domains`` and ``--cd-*``: the ComputeDomain driver ``dradriver run`` serves beside the GPU driver."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
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


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Whether to serve ComputeDomains, and how."""
    for flag in (COMPUTE_DOMAINS, CD_NAMESPACE, CD_READY_TIMEOUT, CD_FABRIC_INTERVAL, CD_PROC_ROOT):
        flag.add(parser)


@dataclass(frozen=True, kw_only=True)
class ComputeDomainOptions:
    """Whether the ComputeDomain driver runs, the namespace of its daemons, how often the node's clique is read
    again (0: never) and where the node's /proc is read (``--cd-ready-timeout`` is deprecated and ignored)."""

    enabled: bool = False
    namespace: str = DEFAULT_NAMESPACE
    fabric_interval: float = 10.0
    proc_root: Path = Path(DEFAULT_PROC_ROOT)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ComputeDomainOptions:
        return cls(
            enabled=COMPUTE_DOMAINS.value(args) == "true",
            namespace=CD_NAMESPACE.value(args),
            fabric_interval=CD_FABRIC_INTERVAL.value(args),
            proc_root=Path(CD_PROC_ROOT.value(args)),
        )
