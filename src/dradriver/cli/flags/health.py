"""``--health-*``: what the device health monitor makes of XIDs and ECC errors, and how it marks a bad device
(docs/health.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.driver.observe.health import (
    DEFAULT_FATAL_XIDS,
    DEFAULT_IGNORED_XIDS,
    DEFAULT_RECOVERY_PERIOD,
    HealthPolicy,
    TaintEffect,
    parse_xids,
)

IGNORE_XIDS = EnvFlag(
    flag="--health-ignore-xids",
    env="DRADRIVER_HEALTH_IGNORE_XIDS",
    default=",".join(map(str, sorted(DEFAULT_IGNORED_XIDS))),
    metavar="XID,...",
    help="XIDs applications cause (informational taint only); 'none' for none",
)
FATAL_XIDS = EnvFlag(
    flag="--health-fatal-xids",
    env="DRADRIVER_HEALTH_FATAL_XIDS",
    default=",".join(map(str, sorted(DEFAULT_FATAL_XIDS))),
    metavar="XID,...",
    help="XIDs that always make a GPU unhealthy, even if also ignored; 'none' for none",
)
TAINT_EFFECT = EnvFlag(
    flag="--health-taint-effect",
    env="DRADRIVER_HEALTH_TAINT_EFFECT",
    default=TaintEffect.NO_SCHEDULE.value,
    choices=(TaintEffect.NO_SCHEDULE.value, TaintEffect.NO_EXECUTE.value),
    help="effect of the taints on unhealthy devices (NoExecute also evicts pods that do not tolerate it)",
)
RECOVERY_PERIOD = EnvFlag(
    flag="--health-recovery-period",
    env="DRADRIVER_HEALTH_RECOVERY_PERIOD",
    default=DEFAULT_RECOVERY_PERIOD,
    type=float,
    metavar="SECONDS",
    help="a condition without a GPU reset clears after this long without a new event; 0: only a reset clears",
)
TAINT_FALLBACK = EnvFlag(
    flag="--health-taint-fallback",
    env="DRADRIVER_HEALTH_TAINT_FALLBACK",
    default="withdraw",
    choices=("withdraw", "keep"),
    help="where the API server drops device taints: withdraw unhealthy devices from the slices, or keep offering them",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The device health group."""
    group = parser.add_argument_group("device health (docs/health.md)")
    for flag in (IGNORE_XIDS, FATAL_XIDS, TAINT_EFFECT, RECOVERY_PERIOD, TAINT_FALLBACK):
        flag.add(group)


@dataclass(frozen=True, kw_only=True)
class HealthOptions:
    """The monitor's policy (its taints in the driver's domain), and whether a device with a taint is withdrawn
    from the slices where the API server drops taints (else it is offered still)."""

    policy: HealthPolicy
    withdraw_tainted: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, taint_domain: str) -> HealthOptions:
        """The policy of ``args``; a ConfigError names the flag of an XID list or period that is not valid."""

        def xids(flag: EnvFlag) -> frozenset[int]:
            value: str = flag.value(args)
            return frozenset() if value.strip().lower() == "none" else parse_xids(value, flag.flag)

        policy = HealthPolicy(
            ignored_xids=xids(IGNORE_XIDS),
            fatal_xids=xids(FATAL_XIDS),
            taint_effect=TaintEffect(TAINT_EFFECT.value(args)),
            recovery_period=RECOVERY_PERIOD.value(args),
            taint_domain=taint_domain,
        )
        return cls(policy=policy, withdraw_tainted=TAINT_FALLBACK.value(args) == "withdraw")
