"""Every flag of ``dradriver run``, by group (``cli/flags/``), and :class:`RunOptions`, what they say together."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from dradriver.cli.flags import (
    claims,
    compute_domains,
    device_plugin,
    driver_root,
    fabric_manager,
    gpus,
    health,
    kube_client,
    logs,
    node,
    node_dirs,
    node_labels,
    passthrough,
    publishing,
    sharing,
    status,
)
from dradriver.cli.flags.claims import ClaimOptions
from dradriver.cli.flags.compute_domains import ComputeDomainOptions
from dradriver.cli.flags.device_plugin import DevicePluginOptions
from dradriver.cli.flags.driver_root import DriverRootOptions
from dradriver.cli.flags.fabric_manager import FabricManagerOptions
from dradriver.cli.flags.gpus import GpuOptions
from dradriver.cli.flags.health import HealthOptions
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.cli.flags.node import NodeOptions
from dradriver.cli.flags.node_dirs import NodeDirs
from dradriver.cli.flags.node_labels import NodeLabelOptions
from dradriver.cli.flags.passthrough import PassthroughOptions
from dradriver.cli.flags.publishing import PublishingOptions
from dradriver.cli.flags.sharing import SharingOptions
from dradriver.cli.flags.status import StatusOptions


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``run``: the node, the cluster client, the node's directories, sharing, the status server,
    logging, then the groups with a heading of their own."""
    node.add_flags(parser)
    kube_client.add_flags(parser)
    node_dirs.add_flags(parser)
    sharing.add_flags(parser)
    status.add_flags(parser)
    logs.add_flags(parser)
    gpus.add_flags(parser)
    publishing.add_flags(parser, version_default="", publisher=True)
    driver_root.add_flags(parser, wait=True)
    claims.add_flags(parser)
    health.add_flags(parser)
    compute_domains.add_flags(parser)
    device_plugin.add_flags(parser)
    node_labels.add_flags(parser)
    passthrough.add_flags(parser)
    fabric_manager.add_flags(parser)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``run`` was told, one typed group per concern (logging aside: it is set up before any is read)."""

    publishing: PublishingOptions
    node: NodeOptions
    sharing: SharingOptions
    status: StatusOptions
    dirs: NodeDirs
    gpus: GpuOptions
    kube: KubeClientOptions
    health: HealthOptions
    driver_root: DriverRootOptions
    claims: ClaimOptions
    compute_domains: ComputeDomainOptions
    #: What to do when NVIDIA's device plugin is on the node (checked by ``run`` once connected, and at every rescan).
    device_plugin: DevicePluginOptions = field(default_factory=DevicePluginOptions)
    #: Whether GPU Feature Discovery's labels are kept on the node's Node (``--node-labels``), and their MIG strategy.
    node_labels: NodeLabelOptions = field(default_factory=NodeLabelOptions)
    #: Whether GPUs are offered for VFIO passthrough too (``--passthrough``), and where the host's sysfs is.
    passthrough: PassthroughOptions = field(default_factory=PassthroughOptions)
    #: Whether Fabric Manager's NVSwitch partitions are published and activated (``--fabric-manager-partitions``).
    fabric_manager: FabricManagerOptions = field(default_factory=FabricManagerOptions)

    @property
    def driver_name(self) -> str:
        return self.publishing.driver_name

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """Read every group and refuse a configuration that cannot work before anything is created, bound or
        published (a ConfigError: exit 2). Groups are read and checked one after the other, in this order, so
        of several problems the same one is always named: this host's flags first, then the kubeconfig (loaded,
        which may run its exec plugin). The state file's directory (a file made there for a moment) and the status
        server's address (bound for a moment) are probed by ``run`` once the cluster's release has been checked too,
        last (``GpuOptions.probe_state``, ``StatusOptions.check``)."""
        publishing = PublishingOptions.from_args(args)
        name = publishing.driver_name
        node = NodeOptions.from_args(args)
        node.check()
        sharing = SharingOptions.from_args(args)
        sharing.check()
        status = StatusOptions.from_args(args)
        dirs = NodeDirs.from_args(args, driver_name=name)
        dirs.check()
        gpus = GpuOptions.from_args(args)
        gpus.check()
        health = HealthOptions.from_args(args, taint_domain=name)
        driver_root = DriverRootOptions.from_args(args)
        driver_root.check()
        claims = ClaimOptions.from_args(args)
        compute_domains = ComputeDomainOptions.from_args(args)
        kube = KubeClientOptions.from_args(args)
        kube.check()
        return cls(
            publishing=publishing,
            node=node,
            sharing=sharing,
            status=status,
            dirs=dirs,
            gpus=gpus,
            kube=kube,
            health=health,
            driver_root=driver_root,
            claims=claims,
            compute_domains=compute_domains,
            device_plugin=DevicePluginOptions.from_args(args),
            node_labels=NodeLabelOptions.from_args(args),
            passthrough=PassthroughOptions.from_args(args),
            fabric_manager=FabricManagerOptions.from_args(args),
        )
