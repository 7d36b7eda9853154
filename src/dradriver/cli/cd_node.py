"""``dradriver run --compute-domains``: the flags of the ComputeDomain driver, and its start beside the GPU driver."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.cli.options import add_env_option, interval_seconds, non_negative_float
from dradriver.gpu.backend import simulated_proc_root
from dradriver.gpu.interface import GpuLib
from dradriver.plugin.cluster.port import Cluster
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR
from dradriver.validation.slices import SliceShape

if TYPE_CHECKING:
    from dradriver.computedomain.plugin import ComputeDomainPlugin

DEFAULT_NAMESPACE = "dradriver"
# computedomain.api's DRIVER_NAME (tests/cli/test_run.py checks they agree): the ComputeDomain modules, pydantic
# models among them, load only when --compute-domains is on, not in every GPU driver (docs/reliability.md, memory).
DRIVER_NAME = "compute-domain.dradriver.dev"


def add_options(parser: argparse.ArgumentParser) -> None:
    add_env_option(
        parser,
        "--compute-domains",
        env="DRADRIVER_COMPUTE_DOMAINS",
        default="false",
        choices=("true", "false"),
        help=f"also serve {DRIVER_NAME} (ComputeDomains: IMEX channels for multi-node NVLink jobs)",
    )
    add_env_option(
        parser,
        "--cd-namespace",
        env="POD_NAMESPACE",
        default=DEFAULT_NAMESPACE,
        help="the driver's namespace, where ComputeDomain daemons and their cliques live",
    )
    add_env_option(
        parser,
        "--cd-ready-timeout",
        env="DRADRIVER_CD_READY_TIMEOUT",
        default=0.0,
        type=non_negative_float,
        metavar="SECONDS",
        help="deprecated, ignored: a channel prepare no longer waits for this node's IMEX daemon (it looks once "
        "and the kubelet retries), since a wait would hold up the daemon's own prepare",
    )
    add_env_option(
        parser,
        "--cd-fabric-interval",
        env="DRADRIVER_CD_FABRIC_INTERVAL",
        default=10.0,
        type=interval_seconds,
        metavar="SECONDS",
        help="how often to re-read the node's NVLink clique (the fabric manager may re-register GPUs); 0: never",
    )
    add_env_option(
        parser,
        "--cd-proc-root",
        env="DRADRIVER_CD_PROC_ROOT",
        default="/proc",
        help="where /proc/devices and the NVIDIA capability files are read (a simulated node writes its own)",
    )


def start(
    args: argparse.Namespace,
    *,
    gpulib: GpuLib,
    simulated: bool,
    cluster: Cluster,
    node_uid: str | None,
    shape: SliceShape,
    imex_binaries: Sequence[tuple[str, str]] = (),
) -> ComputeDomainPlugin:
    """Serve and publish; the node's clique and device numbers are read now and every --cd-fabric-interval.
    Its plugin directory (socket, lock, checkpoint, per-domain daemon files) is beside the GPU driver's."""
    from dradriver.computedomain.kube import Rest
    from dradriver.computedomain.plugin import ComputeDomainPlugin, ComputeDomainPluginOptions, read_facts

    base = Path(args.plugin_dir).parent if args.plugin_dir else DEFAULT_PLUGINS_DIR
    plugin_dir = base / DRIVER_NAME
    proc = Path(args.cd_proc_root)
    if simulated and args.cd_proc_root == "/proc":
        proc = simulated_proc_root(plugin_dir / "proc")
    options = ComputeDomainPluginOptions(
        namespace=args.cd_namespace,
        registry_dir=Path(args.registry_dir),
        plugin_dir=plugin_dir,
        cdi_dir=Path(args.cdi_dir),
        node_uid=node_uid,
        shape=shape,
        pod_uid=args.pod_uid or None,
        refresh_interval=args.cd_fabric_interval,
        daemon_mounts=[
            {"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "nodev", "bind"]}
            for host, container in imex_binaries
        ],
    )
    plugin = ComputeDomainPlugin(
        options,
        read=lambda: read_facts(gpulib, args.node_name, proc),
        cluster=cluster,
        rest=Rest.from_kubeconfig(args.kubeconfig),
    )
    plugin.start()
    return plugin
