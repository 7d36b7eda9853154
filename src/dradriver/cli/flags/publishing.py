"""``--driver-name``, ``--compat``, ``--kubernetes-version`` (how ResourceSlices are named and shaped), and for the
running driver ``--list-attributes`` and ``--rescan-interval`` (what it publishes, and how often it looks again)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import dns_subdomain, interval_seconds
from dradriver.errors import ConfigError


def kubernetes_version(text: str) -> str:
    """A Kubernetes minor version with DRA (1.32 or newer); empty: ask the API server."""
    from dradriver.driver.publish.slices import shape_for

    if text == "":
        return text
    try:
        shape_for(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--kubernetes-version ")) from None
    return text


DRIVER_NAME = EnvFlag(
    flag="--driver-name",
    env="DRADRIVER_DRIVER_NAME",
    default=DEFAULT_DRIVER_NAME,
    type=dns_subdomain("driver name", 63),
    help="DRA driver name (ResourceSlice spec.driver, attribute domain)",
)
COMPAT = EnvFlag(
    flag="--compat",
    env="DRADRIVER_COMPAT",
    default="none",
    choices=("none", "nvidia"),
    help="publish under another driver's names so its manifests work unedited: 'nvidia' runs as "
    "gpu.nvidia.com, the driver name and attribute domain NVIDIA's DeviceClasses and claims select "
    "(docs/nvidia-compatibility.md)",
)
KUBERNETES_VERSION = EnvFlag(
    flag="--kubernetes-version",
    env="DRADRIVER_KUBERNETES_VERSION",
    default="1.35",
    type=kubernetes_version,
    metavar="1.N",
    help="the cluster's Kubernetes minor version (1.32 or newer); up to 1.34 MIG counter sets stay inline "
    "with devices, 1.35 and newer put them in slices of their own ('dradriver run' reads it from the API "
    "server when unset)",
)
LIST_ATTRIBUTES = EnvFlag(
    flag="--list-attributes",
    env="DRADRIVER_LIST_ATTRIBUTES",
    default="false",
    choices=("true", "false"),
    help="publish resource.kubernetes.io/numaNode as a list of ints (KEP-6072), as NVIDIA's driver does with "
    "DRAListTypeAttributes: Kubernetes 1.36+ with that feature gate on (a server without it refuses the devices)",
)
RESCAN_INTERVAL = EnvFlag(
    flag="--rescan-interval",
    env="DRADRIVER_RESCAN_INTERVAL",
    default=60.0,
    type=interval_seconds,
    metavar="SECONDS",
    help="how often to rediscover GPUs and republish slices if they changed "
    "(MIG devices created out of band, a GPU gone); 0: only when device health changes",
)


def add_flags(parser: argparse.ArgumentParser, *, version_default: str = "1.35", publisher: bool = False) -> None:
    """The ResourceSlices group: name and shape (an empty ``version_default`` means: ask the API server), and with
    ``publisher`` the running driver's own (what it publishes, how often it looks again)."""
    group = parser.add_argument_group("ResourceSlices")
    DRIVER_NAME.add(group)
    COMPAT.add(group)
    KUBERNETES_VERSION.add(group, default=version_default)
    if publisher:
        LIST_ATTRIBUTES.add(group)
        RESCAN_INTERVAL.add(group)


def driver_name_of(args: argparse.Namespace) -> str:
    """The driver name to run under: ``--driver-name``, or the ``--compat`` preset's (read after parsing: the flag
    and the variable may come in any order)."""
    from dradriver.driver.prepare.presets import preset_driver_name

    return preset_driver_name(COMPAT.value(args), DRIVER_NAME.value(args))


def apply_compat(args: argparse.Namespace) -> None:
    """Set ``args.driver_name`` from ``--compat`` (see :func:`driver_name_of`)."""
    args.driver_name = driver_name_of(args)


@dataclass(frozen=True, kw_only=True)
class PublishingOptions:
    """The driver name (the ``--compat`` preset's, if one is chosen), the cluster's minor version ("": ask the API
    server), numaNode as a list, and how often to rediscover (0: on health changes only)."""

    driver_name: str = DEFAULT_DRIVER_NAME
    kubernetes_version: str = ""
    list_attributes: bool = False
    rescan_interval: float = 60.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PublishingOptions:
        return cls(
            driver_name=driver_name_of(args),
            kubernetes_version=KUBERNETES_VERSION.value(args),
            list_attributes=LIST_ATTRIBUTES.value(args) == "true",
            rescan_interval=RESCAN_INTERVAL.value(args),
        )
