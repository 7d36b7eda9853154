"""Keeping GPU Feature Discovery's labels on the driver's own Node (``run --node-labels gfd``), and taking them
off again (``--node-labels none``, ``dradriver node-labels remove``).

The Node is only ever written with a JSON merge patch of label keys under the owned prefixes and the one
annotation listing them (:mod:`~dradriver.driver.publish.node_labels`), and only when that changes something: an
idle node is never written. A refusal is a WARNING and tried again at the next rescan: labels are a convenience
for schedulers and dashboards, never a reason for the driver not to serve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.driver.publish.node_labels import (
    LabelOptions,
    MigStrategy,
    annotation_key,
    gfd_labels,
    is_owned,
    labels_patch,
    written_keys,
)
from dradriver.gpu.inventory import Inventory
from dradriver.plugin.cluster.port import Cluster, ClusterError, ConflictError, JsonObject

log = logging.getLogger(__name__)

#: Node Feature Discovery's annotation listing the labels it manages (GFD writes through NFD this way).
NFD_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
#: NFD's own label namespace, which its annotation leaves out of the names it lists.
NFD_DEFAULT_NAMESPACE = "feature.node.kubernetes.io"
#: The GPU Operator's label, kept while a GPU has only fallen off the bus (the node still has GPUs).
GPU_PRESENT = "nvidia.com/gpu.present"
#: How many times a write that lost a race with another writer of the Node (HTTP 409: the other pod of a rolling
#: update, the uninstall hook) is recomputed from a fresh read before it is given up as a refusal.
WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class HostFacts:
    """The host facts GFD labels that NVML does not give, read from sysfs (``/sys`` in the driver's pod is the
    host's); ``sysfs`` None where there is no host to read (a simulated node): then both are unknown."""

    sysfs: Path | None = Path("/sys")

    def machine_type(self) -> str | None:
        """The DMI product name (``class/dmi/id/product_name``), None when unreadable."""
        if self.sysfs is None:
            return None
        try:
            return (self.sysfs / "class/dmi/id/product_name").read_text(errors="replace").strip()
        except OSError:
            return None

    def pci_classes(self, bus_ids: Iterable[str]) -> dict[str, int] | None:
        """Each GPU's PCI class (``bus/pci/devices/<bus id>/class``, e.g. 0x030200), None when one is unreadable."""
        if self.sysfs is None:
            return None
        classes: dict[str, int] = {}
        for bus in bus_ids:
            try:
                classes[bus] = int((self.sysfs / "bus/pci/devices" / bus / "class").read_text().strip(), 16)
            except (OSError, ValueError):
                return None
        return classes


@dataclass(frozen=True, kw_only=True)
class NodeLabelerOptions:
    """Whose Node (``node_name``), whose labels (``driver_name``: the annotation's prefix), and what they say."""

    driver_name: str
    node_name: str
    mig_strategy: MigStrategy = MigStrategy.NONE
    mps_sharing: bool = False


def nfd_managed(node: Mapping[str, Any]) -> set[str]:
    """The label keys Node Feature Discovery's annotation says it manages on ``node`` (full names)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    listed = str(annotations.get(NFD_LABELS_ANNOTATION) or "")
    names = (name.strip() for name in listed.split(","))
    return {name if "/" in name else f"{NFD_DEFAULT_NAMESPACE}/{name}" for name in names if name}


def changes_node(node: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the merge ``patch`` of labels and annotations would change ``node``."""
    metadata = node.get("metadata") or {}
    for field in ("labels", "annotations"):
        present = metadata.get(field) or {}
        for key, value in (patch.get("metadata", {}).get(field) or {}).items():
            if (key in present) != (value is not None) or (value is not None and present[key] != value):
                return True
    return False


def patch_read_node(
    cluster: Cluster, node_name: str, make_patch: Callable[[JsonObject], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """Patch Node ``node_name`` with what ``make_patch`` makes of it as read (nothing when it makes None), on
    condition that nobody wrote it in between (its resourceVersion in the patch); when somebody did (409), read
    and make it again, :data:`WRITE_ATTEMPTS` times in all. The patch sent, or None. Raises ClusterError."""
    attempt = 1
    while True:
        node = cluster.get_node(node_name)
        patch = make_patch(node)
        if patch is None:
            return None
        patch["metadata"]["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
        try:
            cluster.patch_node(node_name, patch)
        except ConflictError:
            if attempt >= WRITE_ATTEMPTS:
                raise
            attempt += 1
            continue
        return patch


def remove_written(cluster: Cluster, node_name: str, driver_name: str) -> list[str] | None:
    """Remove from Node ``node_name`` the labels its annotation says the driver wrote, and the annotation; the
    keys removed (None, and no write, when it has no annotation). Raises ClusterError."""
    annotation = annotation_key(driver_name)

    def removal(node: JsonObject) -> dict[str, Any] | None:
        if annotation not in ((node.get("metadata") or {}).get("annotations") or {}):
            return None
        return labels_patch({}, previous=written_keys(node, driver_name), driver_name=driver_name)

    patch = patch_read_node(cluster, node_name, removal)
    return None if patch is None else sorted(patch["metadata"]["labels"])


class NodeLabeler:
    """Keeps this node's Node carrying the labels GFD would write for the inventory (:meth:`update`, at start and
    at every rescan), or removes what an earlier run wrote (:meth:`remove`). Not thread-safe: one caller (the
    rescan thread)."""

    def __init__(self, cluster: Cluster, options: NodeLabelerOptions, *, host: HostFacts) -> None:
        self._cluster = cluster
        self._options = options
        self._host = host
        # The labels of the last successful update, and whether GPUs had fallen off the bus then.
        self._last: tuple[dict[str, str], bool] | None = None
        self._nfd_warned: frozenset[str] = frozenset()
        self._foreign_warned: frozenset[str] = frozenset()

    def wanted(self, inventory: Inventory) -> dict[str, str]:
        """The labels for ``inventory`` on this host."""
        options = LabelOptions(
            mig_strategy=self._options.mig_strategy,
            mps_sharing=self._options.mps_sharing,
            machine_type=self._host.machine_type(),
            pci_classes=self._host.pci_classes(g.info.pci_bus_id for g in inventory.gpus),
        )
        return gfd_labels(inventory, options)

    def update(self, inventory: Inventory) -> bool:
        """Patch the Node if the labels for ``inventory`` differ from those of the last successful call (read from
        the Node at the first: a restart writes nothing when they are there); False when the API server refused
        or could not be reached (a WARNING; the next call tries again)."""
        labels = self.wanted(inventory)
        if (labels, bool(inventory.lost_gpus)) == self._last:
            return True
        name = self._options.node_name
        try:
            patch = patch_read_node(self._cluster, name, lambda node: self._patch_for(labels, node, inventory))
            if patch is not None:
                written = sum(value is not None for value in patch["metadata"]["labels"].values())
                log.info("node labels written node=%s labels=%d", name, written)
        except ClusterError as err:
            log.warning(
                "cannot write GPU Feature Discovery's labels on Node %s; retrying at the next rescan (the chart "
                "grants patch on nodes with nodeLabels.enabled=true) error=%s",
                name,
                err,
            )
            return False
        self._last = (labels, bool(inventory.lost_gpus))
        return True

    def _patch_for(self, labels: dict[str, str], node: JsonObject, inventory: Inventory) -> dict[str, Any] | None:
        """The merge patch that makes ``node`` carry ``labels``, None when it already does. Keys someone else
        keeps are neither written nor removed nor listed: those Node Feature Discovery manages, and owned keys
        that were on the Node before the driver wrote them (an administrator's, the GPU Operator's)."""
        driver = self._options.driver_name
        written = set(written_keys(node, driver))
        left_alone = self._nfd_keys(node) | self._foreign_keys(node, written)
        previous = written - left_alone  # NFD may have taken over a key the driver wrote earlier
        ours = {key: value for key, value in labels.items() if key not in left_alone}
        if inventory.lost_gpus and GPU_PRESENT in previous:
            ours.setdefault(GPU_PRESENT, "true")  # a GPU fallen off the bus is not a node without GPUs
        patch = labels_patch(ours, previous=previous, driver_name=driver)
        return patch if changes_node(node, patch) else None

    def _foreign_keys(self, node: JsonObject, written: set[str]) -> frozenset[str]:
        """The owned keys on ``node`` that its annotation does not list and NFD does not manage: someone else's,
        left alone; a WARNING names them, once per distinct set."""
        present = (node.get("metadata") or {}).get("labels") or {}
        foreign = frozenset(key for key in present if is_owned(key)) - written - nfd_managed(node)
        if foreign and foreign != self._foreign_warned:
            log.warning(
                "some of GPU Feature Discovery's labels on Node %s were not written by this driver (an "
                "administrator's, or the GPU Operator's); leaving them as they are labels=%s",
                self._options.node_name,
                ",".join(sorted(foreign)),
            )
        self._foreign_warned = foreign
        return foreign

    def _nfd_keys(self, node: JsonObject) -> frozenset[str]:
        """The owned keys Node Feature Discovery manages on ``node`` (GFD through NFD still runs): we do not
        fight over them; a WARNING names them, once per distinct set."""
        managed = frozenset(key for key in nfd_managed(node) if is_owned(key))
        if managed and managed != self._nfd_warned:
            log.warning(
                "Node Feature Discovery manages some of GPU Feature Discovery's labels on Node %s (GFD still runs "
                "there); leaving them to it labels=%s",
                self._options.node_name,
                ",".join(sorted(managed)),
            )
        self._nfd_warned = managed
        return managed

    def remove(self) -> None:
        """Best effort: remove the labels an earlier run wrote (listed in the annotation), and the annotation; a
        refusal is a WARNING."""
        name, driver = self._options.node_name, self._options.driver_name
        try:
            removed = remove_written(self._cluster, name, driver)
        except ClusterError as err:
            log.warning(
                "cannot remove the node labels an earlier run wrote on Node %s (remove them with `dradriver "
                "node-labels remove %s`) error=%s",
                name,
                name,
                err,
            )
            return
        if removed:
            log.info("node labels removed node=%s labels=%d", name, len(removed))
