"""The node side assembled: the ComputeDomain driver served to the kubelet, its one slice published.

A second :class:`~dradriver.plugin.kubeletplugin.plugin.KubeletPlugin` beside the GPU driver's, in the same
process, with its own registration socket, plugin directory and checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dradriver.computedomain import api
from dradriver.computedomain.kube import Rest
from dradriver.computedomain.node import ComputeDomainDriver, NodeFacts, slice_devices
from dradriver.plugin.cluster.port import Cluster
from dradriver.plugin.kubeletplugin.lifecycle import StopBudget
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions
from dradriver.plugin.resourceslice.publisher import Publisher, SliceSpec
from dradriver.validation.slices import SliceShape

log = logging.getLogger(__name__)


class ComputeDomainPlugin:
    """Start serves and publishes; stop withdraws nothing (the slice stays for the next instance)."""

    def __init__(
        self,
        *,
        facts: NodeFacts,
        cluster: Cluster,
        rest: Rest,
        namespace: str,
        registry_dir: Path,
        plugin_dir: Path,
        cdi_dir: Path,
        node_uid: str | None,
        shape: SliceShape,
        ready_timeout: float,
    ) -> None:
        self.driver = ComputeDomainDriver(
            facts=facts,
            rest=rest,
            namespace=namespace,
            state_dir=plugin_dir,
            cdi_dir=cdi_dir,
            ready_timeout=ready_timeout,
        )
        self.plugin = KubeletPlugin(
            KubeletPluginOptions(
                driver_name=api.DRIVER_NAME,
                node_name=facts.node_name,
                registry_dir=registry_dir,
                plugin_dir=plugin_dir,
            ),
            handler=self.driver,
            claim_source=cluster,
        )
        self.publisher = Publisher(
            cluster,
            driver=api.DRIVER_NAME,
            node_name=facts.node_name,
            node_uid=node_uid,
            shape=shape,
            pools={facts.node_name: [SliceSpec.of(slice_devices(facts.clique_id))]},
        )
        self.facts = facts

    def start(self) -> None:
        self.plugin.start()
        self.publisher.start()
        log.info(
            "compute domains ready node=%s driver=%s clique=%s",
            self.facts.node_name,
            api.DRIVER_NAME,
            self.facts.clique_id or "(none)",
        )

    def stop(self, budget: StopBudget | None = None) -> None:
        self.plugin.stop(budget)
        self.publisher.stop(budget.left(10.0) if budget else 10.0)
