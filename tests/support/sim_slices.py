"""The ResourceSlices `dradriver run` would publish for a simulated node, as the API server stores them."""

from __future__ import annotations

import functools
from typing import Any

from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
from dradriver.gpu.inventory import MigMode
from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec
from support.nodes import inventory_of

DRIVER = "gpu.dradriver.dev"


@functools.cache
def _published(
    profile: str, mig_mode: str, node: str, *, gpu_sharing: str, driver: str, consumable_shares: str | None
) -> tuple[dict[str, Any], ...]:
    inventory = inventory_of(profile, node=node)
    settings = SliceSettings(
        driver=driver, mig_mode=MigMode(mig_mode), gpu_sharing=gpu_sharing, consumable_shares=consumable_shares
    )
    specs = build_slice_specs(inventory, settings)
    cluster = MemoryCluster()
    cluster.add_node(node)
    publisher = Publisher(
        cluster,
        PublisherOptions(driver=driver, node_name=node, node_uid=cluster.get_node(node)["metadata"]["uid"]),
        pools={node: [SliceSpec.of(s.get("devices", ()), s.get("sharedCounters", ())) for s in specs]},
    )
    publisher.reconcile()
    assert not publisher.status.invalid_pools, publisher.status.invalid_pools
    return tuple(cluster.slice_objects())


def published_slices(
    profile: str,
    mig_mode: str = "none",
    node: str | None = None,
    *,
    gpu_sharing: str = "exclusive",
    driver: str = DRIVER,
    consumable_shares: str | None = None,
) -> list[dict[str, Any]]:
    """Fresh copies of the slices of simulated node ``profile`` (named ``node``, default the profile), published
    by driver ``driver``."""
    import copy

    return copy.deepcopy(
        list(
            _published(
                profile,
                mig_mode,
                node or profile,
                gpu_sharing=gpu_sharing,
                driver=driver,
                consumable_shares=consumable_shares,
            )
        )
    )
