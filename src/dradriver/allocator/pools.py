"""Gather resource pools from ResourceSlices: newest generation only, node selection, completeness."""

from __future__ import annotations

from typing import Any

from dradriver.allocator.model import Device, Pool, quantity


def node_matches(
    node: str | None,
    labels: dict[str, str],
    node_name: str | None,
    all_nodes: bool,
    selector: dict[str, Any] | None,
) -> bool:
    """Whether a slice (or device) with this node selection is usable on ``node`` (None: any node)."""
    if node is None:
        return True
    if node_name:
        return node_name == node
    if all_nodes:
        return True
    if selector:
        return any(_term_matches(term, node, labels) for term in selector.get("nodeSelectorTerms") or [])
    return False


def _term_matches(term: dict[str, Any], node: str, labels: dict[str, str]) -> bool:
    fields = {"metadata.name": node}
    for requirement in term.get("matchFields") or []:
        if not _requirement_matches(requirement, fields):
            return False
    return all(_requirement_matches(r, labels) for r in term.get("matchExpressions") or [])


def _requirement_matches(requirement: dict[str, Any], values: dict[str, str]) -> bool:
    key, op, wanted = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    present = key in values
    value = values.get(str(key))
    if op == "In":
        return present and value in wanted
    if op == "NotIn":
        return not present or value not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and wanted:
        try:
            a, b = int(str(value)), int(wanted[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _slice_targets(slice_: dict[str, Any], node: str | None, labels: dict[str, str]) -> bool | None:
    """True/False for slice-level node selection; None when each device selects its own nodes."""
    spec = slice_.get("spec") or {}
    if spec.get("perDeviceNodeSelection"):
        return None
    if spec.get("nodeName") or spec.get("allNodes") or spec.get("nodeSelector"):
        return node_matches(node, labels, spec.get("nodeName"), bool(spec.get("allNodes")), spec.get("nodeSelector"))
    # Neither set: a slice that only carries sharedCounters, or an unknown future node selection.
    return False


def gather_pools(slices: list[dict[str, Any]], node: str | None, labels: dict[str, str] | None = None) -> list[Pool]:
    """The pools with at least one slice usable on ``node``, each with the slices of its newest generation.

    Pools come sorted by driver and name, and each pool's slices by name, as the scheduler searches them;
    devices keep the order of ``spec.devices``. A pool is invalid, as in the scheduler, when it names a
    device twice, defines a counter set twice, or has a device consuming a counter set or counter that
    none of its slices defines.
    """
    labels = labels or {}
    pools: dict[tuple[str, str], Pool] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        pool_spec = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool_spec.get("name", "")))
        generation = int(pool_spec.get("generation") or 0)
        pool = pools.get(key)
        if pool is None or generation > pool.generation:
            pool = pools[key] = Pool(key[0], key[1], generation, int(pool_spec.get("resourceSliceCount") or 1))
        elif generation < pool.generation:
            continue
        pool.slices.append(slice_)

    result = []
    for key in sorted(pools):
        pool = pools[key]
        pool.slices.sort(key=lambda s: str((s.get("metadata") or {}).get("name", "")))
        seen: set[str] = set()
        usable = False
        for slice_ in pool.slices:
            for counter_set in (slice_.get("spec") or {}).get("sharedCounters") or []:
                set_name = str(counter_set.get("name"))
                if set_name in pool.counter_sets and pool.invalid is None:
                    pool.invalid = f"duplicate counter set name {set_name}"
                pool.counter_sets[set_name] = {
                    name: quantity(c) for name, c in (counter_set.get("counters") or {}).items()
                }
        for slice_ in pool.slices:
            spec = slice_.get("spec") or {}
            targets = _slice_targets(slice_, node, labels)
            for raw in spec.get("devices") or []:
                name = str(raw.get("name", ""))
                if name in seen and pool.invalid is None:
                    pool.invalid = f"duplicate device name {name}"
                seen.add(name)
                if pool.invalid is None:
                    pool.invalid = _unknown_counters(raw, pool.counter_sets)
                on_node = (
                    targets
                    if targets is not None
                    else node_matches(
                        node, labels, raw.get("nodeName"), bool(raw.get("allNodes")), raw.get("nodeSelector")
                    )
                )
                if on_node:
                    pool.devices.append(Device(pool, raw, slice_))
                    usable = True
        if usable:
            result.append(pool)
    return result


def _unknown_counters(device: dict[str, Any], counter_sets: dict[str, dict[str, Any]]) -> str | None:
    """Why ``device`` consumes counters its pool does not define (the scheduler's wording), or None."""
    for consumption in device.get("consumesCounters") or []:
        set_name = str(consumption.get("counterSet"))
        counters = counter_sets.get(set_name)
        if counters is None:
            return f"counter set {set_name} not found"
        for counter in consumption.get("counters") or {}:
            if counter not in counters:
                return f"counter {counter} not found in counter set {set_name}"
    return None


def all_devices(slices: list[dict[str, Any]]) -> dict[tuple[str, str, str], Device]:
    """Every device of the newest generation of every pool, regardless of node, by (driver, pool, name)."""
    found = {}
    for pool in gather_pools(slices, None):
        for device in pool.devices:
            found[device.id] = device
    return found


class SlicesByNode:
    """The slices, indexed once by the node they serve, for questions asked node by node (explain over a fleet):
    one node's search then reads its own pools' slices, not the whole cluster's.

    :meth:`for_node` gives every slice of each pool with a slice on that node (``spec.nodeName``) or with a slice
    that names no node (``allNodes``, ``nodeSelector``, per-device selection), whole pools and in their order:
    what :func:`gather_pools` would find usable there, and each pool's newest generation decided as over all."""

    def __init__(self, slices: list[dict[str, Any]]) -> None:
        self._slices = slices
        self._by_pool: dict[tuple[str, str], list[int]] = {}
        self._by_node: dict[str, set[tuple[str, str]]] = {}
        self._anywhere: set[tuple[str, str]] = set()
        for position, slice_ in enumerate(slices):
            spec = slice_.get("spec") or {}
            key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
            self._by_pool.setdefault(key, []).append(position)
            if spec.get("nodeName"):
                self._by_node.setdefault(str(spec["nodeName"]), set()).add(key)
            else:
                self._anywhere.add(key)

    def for_node(self, node: str | None) -> list[dict[str, Any]]:
        """The slices a search on ``node`` needs (None: every slice)."""
        if node is None:
            return self._slices
        keys = self._by_node.get(node, set()) | self._anywhere
        return [self._slices[p] for p in sorted(p for key in keys for p in self._by_pool[key])]
