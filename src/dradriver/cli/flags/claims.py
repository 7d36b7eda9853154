"""``--claim-device-status``, ``--device-metadata``, ``--claim-recheck-interval``: what the driver tells about the
claims it prepares, and how often it looks for claims deleted behind the kubelet's back."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import interval_seconds
from dradriver.driver.prepare.recheck import DEFAULT_INTERVAL as DEFAULT_RECHECK_INTERVAL

CLAIM_DEVICE_STATUS = EnvFlag(
    flag="--claim-device-status",
    env="DRADRIVER_CLAIM_DEVICE_STATUS",
    default="true",
    choices=("true", "false"),
    help="write prepared devices into the claims' status.devices (API server 1.33+, feature "
    "DRAResourceClaimDeviceStatus)",
)
DEVICE_METADATA = EnvFlag(
    flag="--device-metadata",
    env="DRADRIVER_DEVICE_METADATA",
    default="false",
    choices=("true", "false"),
    help="give containers KEP-5304 device metadata files under /var/run/kubernetes.io/dra-device-attributes",
)
CLAIM_RECHECK_INTERVAL = EnvFlag(
    flag="--claim-recheck-interval",
    env="DRADRIVER_CLAIM_RECHECK_INTERVAL",
    default=DEFAULT_RECHECK_INTERVAL,
    type=interval_seconds,
    metavar="SECONDS",
    help="how often to look up every prepared claim in the API server and unprepare those deleted behind "
    "the kubelet's back (their MIG instances, MPS daemons and CDI specs freed); 0: only at start-up",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The claims group: status, device metadata, re-check."""
    group = parser.add_argument_group("claims")
    for flag in (CLAIM_DEVICE_STATUS, DEVICE_METADATA, CLAIM_RECHECK_INTERVAL):
        flag.add(group)


@dataclass(frozen=True, kw_only=True)
class ClaimOptions:
    """Whether prepared devices go into the claims' status and KEP-5304 metadata files, and the re-check period
    (0: only at start-up)."""

    device_status: bool = True
    device_metadata: bool = False
    recheck_interval: float = DEFAULT_RECHECK_INTERVAL

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClaimOptions:
        return cls(
            device_status=CLAIM_DEVICE_STATUS.value(args) == "true",
            device_metadata=DEVICE_METADATA.value(args) == "true",
            recheck_interval=CLAIM_RECHECK_INTERVAL.value(args),
        )
