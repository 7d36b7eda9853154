"""The node side assembled: the ComputeDomain driver served to the kubelet, its one slice published.

A second :class:`~dradriver.plugin.kubeletplugin.plugin.KubeletPlugin` beside the GPU driver's, in the same
process, with its own registration socket, plugin directory and checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dradriver.computedomain import api
from dradriver.computedomain.fabric import (
    CHANNELS_DEVICE,
    clique_id,
    device_major,
    imex_mgmt_device,
    old_driver_problem,
)
from dradriver.computedomain.host_imex import HostImex
from dradriver.computedomain.kube import Rest
from dradriver.computedomain.node import ComputeDomainDriver, NodeFacts, slice_devices
from dradriver.errors import DeviceError
from dradriver.gpu.interface import GpuLib
from dradriver.plugin.cluster.port import Cluster
from dradriver.plugin.kubeletplugin.lifecycle import StopBudget, exclusive
from dradriver.plugin.kubeletplugin.plugin import SERIALIZE_LOCK_NAME, KubeletPlugin, KubeletPluginOptions
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec
from dradriver.validation.slices import SliceShape

log = logging.getLogger(__name__)


def read_facts(gpulib: GpuLib, node_name: str, proc_root: Path, *, host_managed: bool = False) -> NodeFacts:
    """The node's clique and IMEX device numbers; a fabric that is not registered is a ``problem``, not an
    exception, so the GPU driver beside us keeps serving while ComputeDomains wait for the fabric manager. So is
    a GPU driver too old for driver-managed IMEX daemons (unless ``host_managed``: the host's IMEX serves)."""
    try:
        too_old = "" if host_managed else old_driver_problem(gpulib.system().driver_version)
        if too_old:
            return NodeFacts(node_name, "", 0, None, problem=too_old)
        clique = clique_id(gpulib)
        if not clique:
            return NodeFacts(node_name, "", 0, None)
        try:
            mgmt = imex_mgmt_device(proc_root)
        except DeviceError as err:
            log.warning("no IMEX management capability: daemons get none error=%s", err)
            mgmt = None
        return NodeFacts(node_name, clique, device_major(CHANNELS_DEVICE, proc_root), mgmt)
    except DeviceError as err:
        return NodeFacts(node_name, "", 0, None, problem=str(err))


@dataclass(frozen=True, kw_only=True)
class ComputeDomainPluginOptions:
    """Where the ComputeDomain driver serves and publishes: the namespace of its daemons, the kubelet's
    registration directory, its own plugin directory (socket, lock, checkpoint, per-domain daemon files), the CDI
    directory, the Node's UID and slice layout for its slice, the pod's UID (rolling updates), how often the node's
    facts are read again (0: never), and the host files mounted into its IMEX daemon pods."""

    namespace: str
    registry_dir: Path
    plugin_dir: Path
    cdi_dir: Path
    node_uid: str | None
    shape: SliceShape
    pod_uid: str | None = None
    refresh_interval: float = 10.0
    daemon_mounts: Sequence[Mapping[str, Any]] = ()
    #: ``--imex-mode hostManaged``: the host's IMEX daemon serves the channels (None: one daemon per domain).
    host_imex: HostImex | None = None
    #: ``--compat``'s: the driver name it registers and publishes, and every name of the domains it serves.
    names: api.ComputeDomainNames = api.OURS


class ComputeDomainPlugin:
    """Start serves and publishes; stop withdraws nothing (the slice stays for the next instance).

    Every ``options.refresh_interval`` seconds it reads the node's facts again (``read``): a clique that changed is
    republished, a fabric that is not registered withdraws the devices until it is."""

    def __init__(
        self, options: ComputeDomainPluginOptions, *, read: Callable[[], NodeFacts], cluster: Cluster, rest: Rest
    ) -> None:
        facts = read()
        self._read = read
        self._interval = options.refresh_interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, name="compute-domain-fabric", daemon=True)
        self.driver = ComputeDomainDriver(
            facts=facts,
            rest=rest,
            namespace=options.namespace,
            state_dir=options.plugin_dir,
            cdi_dir=options.cdi_dir,
            daemon_mounts=options.daemon_mounts,
            host_imex=options.host_imex,
            names=options.names,
        )
        self.plugin = KubeletPlugin(
            KubeletPluginOptions(
                driver_name=options.names.driver_name,
                node_name=facts.node_name,
                registry_dir=options.registry_dir,
                plugin_dir=options.plugin_dir,
                # Rolling updates: per-pod sockets, like the GPU driver's, so the new pod starts beside the old.
                pod_uid=options.pod_uid,
            ),
            handler=self.driver,
            claim_source=cluster,
        )
        publishing = PublisherOptions(
            driver=options.names.driver_name, node_name=facts.node_name, node_uid=options.node_uid, shape=options.shape
        )
        self.publisher = Publisher(cluster, publishing, pools=_pools(facts))
        self._driver_name = options.names.driver_name
        # Rolling updates: the other pod's prepares and unprepares hold this lock while they write.
        self._writers_lock = options.plugin_dir / SERIALIZE_LOCK_NAME if options.pod_uid else None
        self._log_facts(facts)

    def start(self) -> None:
        """Take the instance lock, remove what a killed write left, then serve and publish."""
        self.plugin.lock()
        self._remove_interrupted_writes()
        self.plugin.start()
        self.publisher.start()
        if self._interval > 0:
            self._thread.start()

    def _remove_interrupted_writes(self) -> None:
        # Only a prepare or an unprepare writes the checkpoint and the CDI specs, under the instance lock (held
        # now) or, in rolling-update mode, the pods' shared lock as well: with both, no write is in progress.
        with exclusive(self._writers_lock) if self._writers_lock else contextlib.nullcontext():
            try:
                leftovers = self.driver.remove_interrupted_writes()
            except OSError as err:  # a leftover only takes space: never a reason not to serve
                log.warning("cannot remove ComputeDomain temp files a crash left error=%s", err)
                return
        for leftover in leftovers:
            log.info("removed a ComputeDomain file write cut short by a crash path=%s", leftover)

    def stop(self, budget: StopBudget | None = None) -> None:
        self._stop.set()
        self.plugin.stop(budget)
        self.publisher.stop(budget.left(10.0) if budget else 10.0)

    def refresh(self) -> None:
        """Read the node's facts again; republish and hand them to the driver when they changed."""
        facts = self._read()
        if facts == self.driver.facts:
            return
        self.driver.facts = replace(facts)
        self.publisher.update(_pools(facts))
        self._log_facts(facts)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.refresh()

    def _log_facts(self, facts: NodeFacts) -> None:
        if facts.problem:
            log.warning("compute domains unavailable node=%s problem=%s", facts.node_name, facts.problem)
        else:
            log.info(
                "compute domains ready node=%s driver=%s clique=%s",
                facts.node_name,
                self._driver_name,
                facts.clique_id or "(none)",
            )


def _pools(facts: NodeFacts) -> dict[str, list[SliceSpec]]:
    """This node's one pool: the two devices, or nothing while the fabric is not registered."""
    return {facts.node_name: [] if facts.problem else [SliceSpec.of(slice_devices(facts.clique_id))]}
