"""A stand-in for NVIDIA Fabric Manager in shared-NVSwitch mode on a simulated HGX node.

Partitions follow FM's table for an HGX baseboard: one of all GPUs, then halves, quarters, … down to one GPU each,
numbered in that order (on 8 GPUs: id 0 = GPUs 1-8, 1-2 = four each, 3-6 = two each, 7-14 = one each), GPUs named by
their module (physical) id 1..n in PCI order. FM's refusals are modelled: an unknown id, activating a partition that
is active or has a GPU in another active partition, deactivating one that is not active. The activation state is
the fabric's, not the driver's: it persists beside the node's state file (``<state>.fabric-manager.json``), so a
partition a killed driver activated is still active when the driver comes back, as on a real node. Tests make FM
refuse a partition with :meth:`SimFabricManager.refuse` (kept in the same file, so a driver process sees it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dradriver.atomic_files import write_atomically
from dradriver.gpu.fabric_manager import FabricManagerError, FabricPartition, PartitionGpu
from dradriver.inputs import path_exists, read_text
from dradriver.sim.node import SimulatedNode

STATE_KIND = "dradriver-simulated-fabric-manager"


def hgx_partitions(gpus: list[PartitionGpu]) -> list[FabricPartition]:
    """FM's partitions of a baseboard of ``gpus`` (in module id order), all inactive; none unless the count is a
    power of two (HGX boards hold 4, 8 or 16 GPUs)."""
    count = len(gpus)
    if count == 0 or count & (count - 1):
        return []
    partitions: list[FabricPartition] = []
    size = count
    while size >= 1:
        for start in range(0, count, size):
            partitions.append(FabricPartition(len(partitions), False, tuple(gpus[start : start + size])))
        size //= 2
    return partitions


class SimFabricManager:
    """Fabric Manager on a simulated NVSwitch node (implements :class:`~dradriver.gpu.fabric_manager.FabricManager`)."""

    def __init__(self, node: SimulatedNode, state_path: Path | None = None) -> None:
        if not node.profile.nvswitch:
            raise FabricManagerError(
                f"node profile {node.profile.name} has no NVSwitch fabric, so Fabric Manager has no partitions; use "
                "an HGX profile (hgx-h100-80gb, hgx-h200)"
            )
        gpus = [PartitionGpu(i + 1, g.pci_bus_id, g.uuid) for i, g in enumerate(node.gpus)]
        self._layout = hgx_partitions(gpus)
        self.state_path = state_path
        self._memory: dict[str, Any] = {"active": [], "refused": {}}

    @classmethod
    def beside(cls, node: SimulatedNode) -> SimFabricManager:
        """The stand-in whose state lives beside ``node``'s state file (in memory when the node has none)."""
        state = node.state_path
        return cls(node, state.with_name(state.name + ".fabric-manager.json") if state is not None else None)

    # --- FM's API ---------------------------------------------------------------------------------------------

    def supported_partitions(self) -> list[FabricPartition]:
        active = set(self._state()["active"])
        return [FabricPartition(p.id, p.id in active, p.gpus) for p in self._layout]

    def activate(self, partition_id: int) -> None:
        state = self._state()
        partition = self._known(partition_id, "fmActivateFabricPartition")
        refused = state["refused"].get(str(partition_id))
        if refused:
            raise FabricManagerError(f"fmActivateFabricPartition({partition_id}): {refused}")
        if partition_id in state["active"]:
            raise FabricManagerError(f"fmActivateFabricPartition({partition_id}): partition is already active")
        busy = [p.id for p in self._layout if p.id in state["active"] and p.pci_bus_ids & partition.pci_bus_ids]
        if busy:
            raise FabricManagerError(
                f"fmActivateFabricPartition({partition_id}): GPUs are in use by active partition {busy[0]}"
            )
        state["active"] = sorted([*state["active"], partition_id])
        self._save(state)

    def deactivate(self, partition_id: int) -> None:
        state = self._state()
        self._known(partition_id, "fmDeactivateFabricPartition")
        if partition_id not in state["active"]:
            raise FabricManagerError(f"fmDeactivateFabricPartition({partition_id}): partition is not active")
        state["active"] = [p for p in state["active"] if p != partition_id]
        self._save(state)

    # --- the simulator's controls -------------------------------------------------------------------------------

    def refuse(self, partition_id: int, reason: str | None) -> None:
        """Make FM refuse to activate ``partition_id`` with ``reason`` (None: accept it again)."""
        state = self._state()
        if reason is None:
            state["refused"].pop(str(partition_id), None)
        else:
            state["refused"][str(partition_id)] = reason
        self._save(state)

    def _known(self, partition_id: int, call: str) -> FabricPartition:
        for partition in self._layout:
            if partition.id == partition_id:
                return partition
        raise FabricManagerError(f"{call}({partition_id}): no such partition (FM supports 0..{len(self._layout) - 1})")

    def _state(self) -> dict[str, Any]:
        if self.state_path is None or not path_exists(self.state_path):
            return {"active": list(self._memory["active"]), "refused": dict(self._memory["refused"])}
        raw = json.loads(read_text(self.state_path))
        if not isinstance(raw, dict) or raw.get("kind") != STATE_KIND:
            raise FabricManagerError(f"{self.state_path} is not a simulated Fabric Manager state file")
        return {"active": [int(i) for i in raw.get("active", [])], "refused": dict(raw.get("refused", {}))}

    def _save(self, state: dict[str, Any]) -> None:
        if self.state_path is None:
            self._memory = state
            return
        write_atomically(self.state_path, json.dumps({"kind": STATE_KIND, **state}, indent=1, sort_keys=True))
