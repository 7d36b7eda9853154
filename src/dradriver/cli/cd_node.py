"""``dradriver run --compute-domains``: the ComputeDomain driver started beside the GPU driver (its flags are
``cli/flags/compute_domains.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.cli.flags.compute_domains import DEFAULT_PROC_ROOT
from dradriver.cli.run_options import RunOptions
from dradriver.gpu.backend import simulated_proc_root
from dradriver.gpu.interface import GpuLib
from dradriver.plugin.cluster.port import Cluster
from dradriver.validation.slices import SliceShape

if TYPE_CHECKING:
    from dradriver.computedomain.plugin import ComputeDomainPlugin


def start(
    options: RunOptions,
    *,
    gpulib: GpuLib,
    simulated: bool,
    cluster: Cluster,
    node_uid: str | None,
    shape: SliceShape,
    imex_binaries: Sequence[tuple[str, str]] = (),
    imex_ctl: Sequence[str] = ("nvidia-imex-ctl",),
) -> ComputeDomainPlugin:
    """Serve and publish; the node's clique and device numbers are read now and every --cd-fabric-interval.
    Its plugin directory (socket, lock, checkpoint, per-domain daemon files) is beside the GPU driver's.
    ``imex_ctl``: the host's ``nvidia-imex-ctl`` command line, asked with ``--imex-mode hostManaged``."""
    from dradriver.computedomain import api
    from dradriver.computedomain.host_imex import HostImex
    from dradriver.computedomain.kube import Rest
    from dradriver.computedomain.plugin import ComputeDomainPlugin, ComputeDomainPluginOptions, read_facts

    domains, node = options.compute_domains, options.node.name
    names = api.names_of(domains.compat)
    plugin_dir = options.dirs.plugin.parent / names.driver_name
    proc = domains.proc_root
    if simulated and proc == Path(DEFAULT_PROC_ROOT):
        proc = simulated_proc_root(plugin_dir / "proc")
    plugin_options = ComputeDomainPluginOptions(
        namespace=domains.namespace,
        registry_dir=options.dirs.registry,
        plugin_dir=plugin_dir,
        cdi_dir=options.dirs.cdi,
        node_uid=node_uid,
        shape=shape,
        pod_uid=options.node.pod_uid,
        refresh_interval=domains.fabric_interval,
        daemon_mounts=[
            {"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "nodev", "bind"]}
            for host, container in imex_binaries
        ],
        host_imex=HostImex(imex_ctl, domains.imex_host_socket) if domains.host_managed else None,
        names=names,
    )
    plugin = ComputeDomainPlugin(
        plugin_options,
        read=lambda: read_facts(gpulib, node, proc, host_managed=domains.host_managed),
        cluster=cluster,
        rest=Rest(options.kube.transport()),
    )
    plugin.start()
    return plugin
