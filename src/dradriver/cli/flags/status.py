"""``--metrics-address`` and ``--usage-interval``: the status server (metrics, probes, /allocations) and how often
it samples the GPUs' usage."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import interval_seconds
from dradriver.cli.status_server import check_bindable
from dradriver.driver.observe.usage import DEFAULT_INTERVAL as DEFAULT_USAGE_INTERVAL

# Probes reach the pod's IP, so listen on every interface; the DaemonSet declares the port.
DEFAULT_STATUS_ADDRESS = ":8080"

METRICS_ADDRESS = EnvFlag(
    flag="--metrics-address",
    env="DRADRIVER_METRICS_ADDRESS",
    default=DEFAULT_STATUS_ADDRESS,
    help="HOST:PORT serving /metrics, /livez, /readyz and /healthz, which the DaemonSet's probes call (empty: off)",
)
USAGE_INTERVAL = EnvFlag(
    flag="--usage-interval",
    env="DRADRIVER_USAGE_INTERVAL",
    default=DEFAULT_USAGE_INTERVAL,
    type=interval_seconds,
    metavar="SECONDS",
    help="how often to read each GPU's and MIG device's utilisation, memory, temperature, power and processes "
    "from NVML for /metrics and `dradriver top`; 0: off",
)


def add_flags(parser: argparse.ArgumentParser, *, usage: bool = True) -> None:
    """Where the status server listens, and (``usage``) how often GPU usage is sampled for it."""
    METRICS_ADDRESS.add(parser)
    if usage:
        USAGE_INTERVAL.add(parser)


@dataclass(frozen=True, kw_only=True)
class StatusOptions:
    """``HOST:PORT`` of the status server ("": none) and the usage sampling period (0: none)."""

    address: str = DEFAULT_STATUS_ADDRESS
    usage_interval: float = DEFAULT_USAGE_INTERVAL

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StatusOptions:
        return cls(address=METRICS_ADDRESS.value(args), usage_interval=USAGE_INTERVAL.value(args))

    @property
    def samples_usage(self) -> bool:
        """Usage is sampled only for a status server to show (/metrics, /allocations)."""
        return bool(self.address) and self.usage_interval > 0

    def check(self) -> None:
        """The status server can listen there (a port in use is refused before anything starts)."""
        if self.address:
            check_bindable(METRICS_ADDRESS.flag, self.address)
