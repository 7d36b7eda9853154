"""The simulated Fabric Manager: FM's partition table of an HGX board and FM's refusals, its state shared with
another process through the file beside the node's state; and the partition rules the driver relies on
(gpu/fabric_manager.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.cli.run_assembly import open_fabric_manager
from dradriver.errors import ConfigError
from dradriver.gpu.fabric_manager import (
    FabricManagerError,
    FabricPartition,
    PartitionGpu,
    check_partitions,
    exact_partition,
)
from dradriver.sim.fabric_manager import SimFabricManager, hgx_partitions
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


def hgx(tmp_path: Path | None = None) -> SimulatedNode:
    state = tmp_path / "sim.json" if tmp_path is not None else None
    return SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a", state_path=state)


def test_an_hgx_board_has_fms_fifteen_partitions() -> None:
    layout = SimFabricManager(hgx()).supported_partitions()
    assert [p.size for p in layout] == [8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert [g.physical_id for g in layout[4].gpus] == [3, 4]
    assert layout[4].gpus[0].pci_bus_id == "0000:52:00.0"
    assert not any(p.active for p in layout)
    check_partitions(layout)


def test_fm_refuses_what_it_refuses() -> None:
    fm = SimFabricManager(hgx())
    with pytest.raises(FabricManagerError, match="no such partition"):
        fm.activate(15)
    with pytest.raises(FabricManagerError, match="partition is not active"):
        fm.deactivate(3)
    fm.activate(3)
    with pytest.raises(FabricManagerError, match="already active"):
        fm.activate(3)
    with pytest.raises(FabricManagerError, match="in use by active partition 3"):
        fm.activate(0)
    fm.activate(4)  # no GPU in common
    fm.refuse(5, "FM_ST_GENERIC_ERROR")
    with pytest.raises(FabricManagerError, match="FM_ST_GENERIC_ERROR"):
        fm.activate(5)
    fm.refuse(5, None)
    fm.activate(5)
    assert [p.id for p in fm.supported_partitions() if p.active] == [3, 4, 5]


def test_another_process_sees_the_activation_through_the_file(tmp_path: Path) -> None:
    SimFabricManager.beside(hgx(tmp_path)).activate(6)
    assert [p.id for p in SimFabricManager.beside(hgx(tmp_path)).supported_partitions() if p.active] == [6]


def test_a_node_without_nvswitches_has_no_fabric_manager() -> None:
    node = SimulatedNode(load_node_profile("h100-nvl-pairs"), node_name="node-a")
    with pytest.raises(FabricManagerError, match="has no NVSwitch fabric"):
        SimFabricManager(node)


def test_a_real_node_is_refused_until_its_client_is_written() -> None:
    with pytest.raises(ConfigError, match="simulated nodes only"):
        open_fabric_manager(None)


def gpu(i: int) -> PartitionGpu:
    return PartitionGpu(i, f"0000:0{i}:00.0")


@pytest.mark.parametrize(
    ("partitions", "error"),
    [
        ([FabricPartition(0, False, (gpu(1),)), FabricPartition(0, False, (gpu(2),))], "partition 0 twice"),
        ([FabricPartition(0, False, ())], "without GPUs"),
        ([FabricPartition(0, False, (gpu(1), gpu(1)))], "GPU twice"),
        ([FabricPartition(0, False, (gpu(1), gpu(2))), FabricPartition(1, False, (gpu(2), gpu(3)))], "two partitions"),
    ],
)
def test_a_partition_list_fm_must_never_report_is_refused(partitions: list[FabricPartition], error: str) -> None:
    with pytest.raises(FabricManagerError, match=error):
        check_partitions(partitions)


def test_only_the_exact_gpu_set_matches() -> None:
    layout = hgx_partitions([gpu(i) for i in range(1, 5)])
    assert exact_partition(layout, ["0000:02:00.0", "0000:01:00.0"]) == layout[1]
    assert exact_partition(layout, ["0000:01:00.0", "0000:03:00.0"]) is None
    assert hgx_partitions([gpu(i) for i in range(1, 4)]) == []  # FM's boards hold 4, 8 or 16 GPUs
