"""NVSwitch partitions through Fabric Manager (``GpuDriver`` with ``fabric_manager``) on a simulated HGX node: the
attributes, activation at prepare and deactivation at unprepare, the refusals, and a kill at every point of prepare
and unprepare that start-up reconciliation repairs, as the MIG and VFIO fault walks do."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import fault_walk
from support.fault_walk import crash_at

from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
from dradriver.gpu.fabric_manager import FabricManagerError
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.sim.fabric_manager import SimFabricManager
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from tests.driver.prepare.test_state_mig import DRIVER, claim, ref

# hgx-h100-80gb's GPUs in PCI order: module ids 1..8.
GPUS = [f"gpu-0000-{bus}-00-0" for bus in ("1b", "43", "52", "61", "9d", "c3", "d1", "df")]


class HgxNode:
    """A simulated HGX H100 node with Fabric Manager; ``restart()`` builds a new driver on the same hardware, fabric
    and files (the FM state lives beside the node's state file, as the fabric outlives the driver)."""

    def __init__(self, tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a", state_path=tmp_path / "sim")
        self.fm = SimFabricManager.beside(self.sim)
        self.cdi_dir = tmp_path / "cdi"
        self.state_dir = tmp_path / "state"
        self.store: CheckpointStore | None = None
        self.driver = self.restart()

    def restart(self) -> GpuDriver:
        if self.store is not None:
            self.store.close()
        gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(self.state_dir, boot_id="boot-1")
        self.driver = GpuDriver(
            GpuDriverOptions(
                driver_name=DRIVER,
                pool="node-a",
                mig_mode=MigMode.NONE,
                # A new client, as a new process opens.
                features=NodeFeatures(fabric_manager=SimFabricManager.beside(self.sim)),
            ),
            inventory=discover(gpulib),
            cdi=CdiWriter(self.cdi_dir),
            gpulib=gpulib,
            checkpoint=self.store,
        )
        return self.driver

    def active(self) -> list[int]:
        return [p.id for p in self.fm.supported_partitions() if p.active]

    def close(self) -> None:
        assert self.store is not None
        self.store.close()

    def assert_as_found(self, where: str = "") -> None:
        assert self.active() == [], where
        assert list(self.cdi_dir.glob("*.json")) == [], where
        assert self.driver.checkpoint.records() == [], where


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = HgxNode(tmp_path)
    yield n
    n.close()


def test_every_whole_gpu_carries_its_module_id_and_a_partition_per_size(node: HgxNode) -> None:
    inventory = discover(simulated_gpulib_on(node.sim))
    settings = SliceSettings(driver=DRIVER, mig_mode=MigMode.NONE, gpu_attributes=node.driver.partition_attributes())
    [spec] = build_slice_specs(inventory, settings)
    by_name = {d["name"]: d["attributes"] for d in spec["devices"]}
    first, last = by_name[GPUS[0]], by_name[GPUS[7]]
    assert {k: v for k, v in first.items() if k.startswith(("partition", "gpuModuleID"))} == {
        "gpuModuleID": {"int": 1},
        "partition8": {"int": 0},
        "partition4": {"int": 1},
        "partition2": {"int": 3},
        "partition1": {"int": 7},
    }
    assert last["gpuModuleID"] == {"int": 8} and last["partition2"] == {"int": 6} and last["partition1"] == {"int": 14}


def test_without_the_flag_no_partition_attribute_is_published(node: HgxNode) -> None:
    inventory = discover(simulated_gpulib_on(node.sim))
    [spec] = build_slice_specs(inventory, SliceSettings(driver=DRIVER, mig_mode=MigMode.NONE))
    assert not any(k.startswith("partition") for d in spec["devices"] for k in d["attributes"])


def test_prepare_activates_the_partition_of_exactly_the_claims_gpus_and_unprepare_deactivates_it(
    node: HgxNode,
) -> None:
    assert node.driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error is None
    assert node.active() == [3]
    record = node.driver.checkpoint.get("pair")
    assert record is not None
    [action] = [a for a in record.actions if a.step == "fabric-partition"]
    assert action.done and action.params["partitionId"] == 3 and action.params["gpus"] == sorted(GPUS[:2])
    assert node.driver.prepare_resource_claims([claim("one", GPUS[4])])["one"].error is None
    assert node.active() == [3, 11]
    assert node.driver.unprepare_resource_claims([ref("pair"), ref("one")]) == {"pair": None, "one": None}
    node.assert_as_found()


def test_gpus_no_partition_equals_are_refused_naming_the_partitions_that_would_fit(node: HgxNode) -> None:
    error = node.driver.prepare_resource_claims([claim("odd", GPUS[0], GPUS[2])])["odd"].error
    assert error is not None
    assert f"GPUs {GPUS[0]}, {GPUS[2]} form no Fabric Manager partition" in error
    assert "partition 1 (GPUs 1,2,3,4), partition 3 (GPUs 1,2), partition 4 (GPUs 3,4)" in error
    assert "matchAttribute gpu.dradriver.dev/partition2" in error
    node.assert_as_found()


def test_a_partition_fabric_manager_refuses_fails_the_claim_and_undoes_everything(node: HgxNode) -> None:
    node.fm.refuse(3, "FM_ST_GENERIC_ERROR: NVSwitch link training failed")
    error = node.driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error
    assert error is not None and "step fabric-partition" in error and "link training failed" in error
    node.assert_as_found()


def test_a_partition_deactivated_behind_the_drivers_back_is_reported_as_drift(node: HgxNode) -> None:
    assert node.driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error is None
    node.fm.deactivate(3)
    record = node.driver.checkpoint.get("pair")
    assert record is not None
    [action] = [a for a in record.actions if a.step == "fabric-partition"]
    drift = node.driver.step_kinds["fabric-partition"].drift
    assert drift is not None and drift(record, action) == "Fabric Manager partition 3 is not active any more"
    assert node.driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}
    node.assert_as_found()


def points_of_a_clean_run(node: HgxNode) -> tuple[list[str], list[str]]:
    def prepare() -> None:
        assert node.driver.prepare_resource_claims([claim("pair", *GPUS[:2])])["pair"].error is None

    def unprepare() -> None:
        assert node.driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}

    return fault_walk.points_of_a_clean_run(prepare, unprepare)


def test_a_kill_at_every_point_leaves_no_partition_active_after_the_restart(tmp_path: Path) -> None:
    probe = HgxNode(tmp_path / "probe")
    preparing, unpreparing = points_of_a_clean_run(probe)
    probe.close()
    assert {"before:fabric-partition", "after:fabric-partition", "undone:fabric-partition"} <= {
        *preparing,
        *unpreparing,
    }
    for phase, points in (("prepare", preparing), ("unprepare", unpreparing)):
        for i, point in enumerate(points):
            node = HgxNode(tmp_path / f"{phase}-{i}")
            if phase == "unprepare":
                assert node.driver.prepare_resource_claims([claim("pair", *GPUS[:2])])["pair"].error is None
            if phase == "prepare":
                crash_at(point, node.driver.prepare_resource_claims, [claim("pair", *GPUS[:2])])
            else:
                crash_at(point, node.driver.unprepare_resource_claims, [ref("pair")])
            node.restart().reconcile(lambda _ref: False)  # the claim is gone from the API server meanwhile
            node.assert_as_found(f"{phase} killed at {point}")
            node.close()


def test_the_fabric_outlives_the_driver_in_the_state_file(node: HgxNode) -> None:
    node.fm.activate(5)
    state = json.loads(node.fm.state_path.read_text()) if node.fm.state_path else {}
    assert state["active"] == [5]
    with pytest.raises(FabricManagerError, match="GPUs are in use by active partition 5"):
        node.fm.activate(2)
    node.fm.deactivate(5)


def test_an_admin_claim_on_a_gpu_does_not_keep_its_partition_active(node: HgxNode) -> None:
    assert node.driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error is None
    assert node.driver.prepare_resource_claims([claim("monitor", GPUS[0], admin=True)])["monitor"].error is None
    assert node.driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}
    assert node.active() == []  # the monitoring claim made no partition step: nothing of it needs the fabric
    assert node.driver.unprepare_resource_claims([ref("monitor")]) == {"monitor": None}
    node.assert_as_found()


def test_gpus_held_by_another_active_partition_are_refused_before_anything_changes(node: HgxNode) -> None:
    node.fm.activate(7)  # the first GPU's 1-GPU partition, activated by another tool
    error = node.driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error
    assert error is not None and "partition 7 (GPUs 1) is active" in error and "prepare failed" not in error
    assert node.active() == [7]
    assert node.driver.checkpoint.records() == []


# --- matching by module id (NVML's nvmlDeviceGetModuleId = FM's physicalId) -------------------------------------


def test_a_gpu_whose_nvml_module_id_fm_places_elsewhere_stops_the_driver_at_start_naming_both(node: HgxNode) -> None:
    node.sim.gpus[1].module_id = 5  # a misreported board: FM's module 2 sits at 0000:43:00.0, its module 5 elsewhere
    with pytest.raises(FabricManagerError) as refused:
        node.restart()
    assert str(refused.value).startswith(
        "Fabric Manager's partitions refused: NVML reports the GPU at 0000:43:00.0 as module 5, but Fabric Manager "
        "reports module 2 there (and module 5 at 0000:9d:00.0). A mis-cabled or misreported baseboard"
    )
    assert "without --fabric-manager-partitions" in str(refused.value)
    assert node.active() == []


def test_two_gpus_with_swapped_module_ids_are_both_named(node: HgxNode) -> None:
    node.sim.gpus[0].module_id, node.sim.gpus[1].module_id = 2, 1
    with pytest.raises(FabricManagerError) as refused:
        node.restart()
    assert "GPU at 0000:1b:00.0 as module 2, but Fabric Manager reports module 1 there" in str(refused.value)
    assert "GPU at 0000:43:00.0 as module 1, but Fabric Manager reports module 2 there" in str(refused.value)


def test_without_module_ids_gpus_are_matched_by_pci_address_a_warning_logged_once_each(
    node: HgxNode, caplog: pytest.LogCaptureFixture
) -> None:
    for gpu in node.sim.gpus:
        gpu.module_id = None  # NVML answers NOT_SUPPORTED (a driver older than the call answers alike)
    caplog.set_level(logging.INFO, logger="dradriver.driver.prepare.partitions")
    driver = node.restart()
    driver.update_inventory(discover(simulated_gpulib_on(node.sim)), MigMode.NONE)  # a rescan: not logged again
    records = [r for r in caplog.records if "matched to Fabric Manager's module by PCI address" in r.msg]
    fallbacks = [r.getMessage() for r in records]
    assert len(fallbacks) == 8 and fallbacks[1].endswith("gpu=0000:43:00.0 module=2")
    # A WARNING: NVIDIA's driver refuses a GPU without a module id; this driver matches it by address instead.
    assert {r.levelno for r in records} == {logging.WARNING} and "NVIDIA's driver refuses" in fallbacks[0]
    assert driver.prepare_resource_claims([claim("pair", GPUS[0], GPUS[1])])["pair"].error is None
    assert node.active() == [3]
    assert driver.partition_attributes()["0000:43:00.0"]["gpuModuleID"] == {"int": 2}  # FM's physicalId


def test_a_rescan_that_reads_a_module_id_fm_places_elsewhere_keeps_the_last_inventory(
    node: HgxNode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dradriver.cli import node_loops
    from dradriver.cli.run_assembly import pools_of

    settings = SliceSettings(driver=DRIVER, mig_mode=MigMode.NONE, gpu_attributes=node.driver.partition_attributes())
    inventory = discover(simulated_gpulib_on(node.sim))
    pools = pools_of("node-a", build_slice_specs(inventory, settings))
    monkeypatch.setattr(node_loops, "offered", lambda _options, _cluster, fresh, _watch: fresh)
    node.sim.gpus[1].module_id = 5  # read anew (the GPU back from vfio-pci, or found again): now misreported
    rescanner = node_loops.Rescanner(
        SimpleNamespace(  # type: ignore[arg-type]  # the parts of a NodeDriver a rescan reads
            options=SimpleNamespace(gpus=SimpleNamespace(mig_mode=MigMode.NONE)),
            gpus=SimpleNamespace(lib=simulated_gpulib_on(node.sim), pci=None, inventory=inventory),
            health=SimpleNamespace(update_inventory=lambda *_: None, taints=lambda _device: []),
            driver=node.driver,
            cluster=None,
            plugin_watch=None,
            settings=settings,
            pools=pools,
        ),
        threading.Event(),
    )
    before = node.driver.gpus()
    rescanner.rescan()
    assert any(
        "rediscovery failed; keeping the last inventory" in r.getMessage()
        and "NVML reports the GPU at 0000:43:00.0 as module 5" in r.getMessage()
        for r in caplog.records
    )
    assert node.driver.gpus() is before and rescanner.node.pools is pools
