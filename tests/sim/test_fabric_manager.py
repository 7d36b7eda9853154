"""The simulated Fabric Manager: FM's partition table of an HGX board and FM's refusals, its state shared with
another process through the file beside the node's state; and the partition rules the driver relies on
(gpu/fabric_manager.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.gpu.fabric_manager import (
    FabricManagerError,
    FabricPartition,
    PartitionGpu,
    check_partitions,
    partition_gpu,
    partition_of_modules,
)
from dradriver.sim.fabric_manager import SimFabricManager, hgx_partitions
from dradriver.sim.fakelib import simulated_gpulib_on
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
    assert partition_of_modules(layout, [2, 1]) == layout[1]
    assert partition_of_modules(layout, [1, 3]) is None
    assert hgx_partitions([gpu(i) for i in range(1, 4)]) == []  # FM's boards hold 4, 8 or 16 GPUs


def test_a_gpu_fm_reports_under_two_identities_is_refused() -> None:
    moved, renamed = PartitionGpu(1, "0000:02:00.0"), PartitionGpu(2, "0000:01:00.0")
    with pytest.raises(FabricManagerError, match=r"module 1 at 0000:02:00.0 in partition 1 and at 0000:01:00.0"):
        check_partitions([FabricPartition(0, False, (gpu(1),)), FabricPartition(1, False, (moved,))])
    with pytest.raises(FabricManagerError, match=r"at 0000:01:00.0 as module 2 in partition 1 and as module 1"):
        check_partitions([FabricPartition(0, False, (gpu(1),)), FabricPartition(1, False, (renamed,))])


def test_the_fake_nvml_numbers_an_hgx_boards_modules_as_fm_does() -> None:
    node = hgx()
    gpus = simulated_gpulib_on(node).gpus()
    members = {g.pci_bus_id: g.physical_id for p in SimFabricManager(node).supported_partitions() for g in p.gpus}
    assert [g.module_id for g in gpus] == list(range(1, 9))
    assert {g.pci_bus_id: g.module_id for g in gpus} == members


@pytest.mark.parametrize("profile", ["h100-nvl-pairs", "mixed"])
def test_a_board_without_nvswitches_has_no_module_ids(profile: str) -> None:
    node = SimulatedNode(load_node_profile(profile), node_name="node-a")
    assert {g.module_id for g in simulated_gpulib_on(node).gpus()} == {None}  # NVML: NOT_SUPPORTED


def test_fm_s_gpu_is_found_by_module_id_cross_checked_with_the_pci_address() -> None:
    layout = hgx_partitions([gpu(i) for i in range(1, 5)])
    assert partition_gpu(layout, pci_bus_id="0000:02:00.0", module_id=2) == gpu(2)
    assert partition_gpu(layout, pci_bus_id="0000:02:00.0", module_id=None) == gpu(2)  # no module id: by address
    assert partition_gpu(layout, pci_bus_id="0000:09:00.0", module_id=9) is None  # a GPU FM does not list


@pytest.mark.parametrize(
    ("pci_bus_id", "module_id", "error"),
    [
        ("0000:02:00.0", 3, "at 0000:02:00.0 as module 3, but Fabric Manager reports module 2 there (and module 3 at "
                            "0000:03:00.0)"),
        ("0000:02:00.0", 7, "at 0000:02:00.0 as module 7, but Fabric Manager reports module 2 there"),
        ("0000:09:00.0", 3, "at 0000:09:00.0 as module 3, but Fabric Manager reports module 3 at 0000:03:00.0"),
    ],
)  # fmt: skip
def test_a_module_id_fm_places_elsewhere_is_refused_naming_both(pci_bus_id: str, module_id: int, error: str) -> None:
    layout = hgx_partitions([gpu(i) for i in range(1, 5)])
    with pytest.raises(FabricManagerError) as refused:
        partition_gpu(layout, pci_bus_id=pci_bus_id, module_id=module_id)
    assert str(refused.value) == f"NVML reports the GPU {error}"
