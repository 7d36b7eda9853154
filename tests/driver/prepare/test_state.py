"""The GPU driver's prepare and unprepare, on a simulated node, without sockets."""

import json
from pathlib import Path

import pytest
from support.nodes import inventory_of

from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.caps import ProcMigCapabilities
from dradriver.gpu.inventory import MigMode, discover
from dradriver.gpu.nvml import NvmlGpuLib
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DeviceToleration
from dradriver.plugin.kubeletplugin.claims import allocated_claim
from dradriver.sim.fakelib import SimPciTopology, fake_pynvml
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

DRIVER = "gpu.dradriver.dev"


def claim(uid: str, *results: tuple[str, str], pool: str = "node-a", admin: bool = False) -> AllocatedClaim:
    """The typed claim the plugin layer hands the driver (parsed from its JSON as the plugin layer does)."""
    raw = raw_claim(uid, *results, pool=pool)
    for result in raw["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = admin
    return typed(raw)


def typed(raw: dict) -> AllocatedClaim:
    meta = raw["metadata"]
    return allocated_claim(raw, ClaimRef(meta["namespace"], meta["name"], meta["uid"]), DRIVER)


def raw_claim(uid: str, *results: tuple[str, str], pool: str = "node-a", driver: str = DRIVER) -> dict:
    return {
        "metadata": {"uid": uid, "name": f"claim-{uid}", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": driver, "pool": pool, "device": device}
                        for request, device in results
                    ]
                }
            }
        },
    }


@pytest.fixture
def driver(tmp_path: Path) -> GpuDriver:
    return GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
    )


def test_prepare_returns_one_cdi_id_per_device_with_its_requests(driver: GpuDriver):
    result = driver.prepare_resource_claims(
        [claim("u1", ("a", "gpu-0000-0f-00-0"), ("b", "gpu-0000-47-00-0"), ("c", "gpu-0000-0f-00-0"))]
    )["u1"]
    assert result.error is None
    assert [(d.device, d.requests) for d in result.devices] == [
        ("gpu-0000-0f-00-0", ("a", "c")),
        ("gpu-0000-47-00-0", ("b",)),
    ]
    assert result.devices[0].cdi_device_ids == ("k8s.gpu.dradriver.dev/claim=u1-gpu-0000-0f-00-0",)


def test_prepare_is_deterministic(driver: GpuDriver):
    first = driver.prepare_resource_claims([claim("u1", ("a", "gpu-0000-0f-00-0"))])
    assert driver.prepare_resource_claims([claim("u1", ("a", "gpu-0000-0f-00-0"))]) == first


def test_existing_mig_devices_get_their_parents_node_and_their_capability_nodes(driver: GpuDriver, tmp_path: Path):
    result = driver.prepare_resource_claims([claim("u2", ("mig", "gpu-0000-07-00-0-mig-3g20gb-0"))])["u2"]
    assert result.error is None
    spec = json.loads((tmp_path / "k8s.gpu.dradriver.dev-claim_u2.json").read_text())
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0"
    assert len(nodes) == 3 and all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in nodes[1:])
    assert any(
        e.startswith("DRADRIVER_DEVICE_GPU_0000_07_00_0_MIG_3G20GB_0=MIG-")
        for e in spec["devices"][0]["containerEdits"]["env"]
    )


def test_a_mig_device_whose_capabilities_cannot_be_read_is_refused(tmp_path: Path):
    node = SimulatedNode(load_node_profile("mixed"))
    gpulib = NvmlGpuLib(
        nvml=fake_pynvml(node),
        pci_topology=SimPciTopology(node),
        mig_capabilities=ProcMigCapabilities(tmp_path / "no-proc"),
    )
    try:
        inventory = discover(gpulib)
    finally:
        gpulib.close()
    blind = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory,
        cdi=CdiWriter(tmp_path / "cdi"),
    )
    result = blind.prepare_resource_claims([claim("u7", ("mig", "gpu-0000-07-00-0-mig-3g20gb-0"))])["u7"]
    assert "MIG capability device nodes" in (result.error or "")
    assert not (tmp_path / "cdi").exists()


def test_other_drivers_results_are_ignored(driver: GpuDriver):
    mixed = raw_claim("u3", ("a", "gpu-0000-0f-00-0"))
    mixed["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "eth0"}
    )
    assert [d.device for d in driver.prepare_resource_claims([typed(mixed)])["u3"].devices] == ["gpu-0000-0f-00-0"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (claim("x", ("a", "gpu-0000-0f-00-0"), pool="node-b"), "pool node-b"),
        (claim("x", ("a", "gpu-0000-ff-00-0")), "not offered by this node"),
        (claim("x", ("a", "gpu-0000-07-00-0")), "not offered by this node"),  # in MIG mode: static leaves it out
    ],
)
def test_bad_allocations_fail_the_claim_and_write_nothing(driver: GpuDriver, tmp_path: Path, bad, message):
    result = driver.prepare_resource_claims([bad])["x"]
    assert message in (result.error or "")
    assert not list(tmp_path.iterdir())


def test_a_partition_not_carved_yet_is_refused_with_the_way_out(tmp_path: Path):
    dynamic = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.DYNAMIC),
        inventory=inventory_of("dgx-a100-80gb"),
        cdi=CdiWriter(tmp_path),
    )
    result = dynamic.prepare_resource_claims([claim("u4", ("m", "gpu-0000-07-00-0-mig-1g10gb-0"))])["u4"]
    assert "--mig-mode static" in (result.error or "")


def test_a_whole_gpu_in_mig_mode_is_refused_with_the_way_out(tmp_path: Path):
    # mixed: the first A100 is in MIG mode; dynamic mode offers it whole, but as a whole GPU it runs no work.
    dynamic = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.DYNAMIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
    )
    result = dynamic.prepare_resource_claims([claim("u5", ("g", "gpu-0000-07-00-0"))])["u5"]
    assert "gpu-0000-07-00-0" in (result.error or "") and "MIG mode" in (result.error or "")
    assert not list(tmp_path.iterdir())
    assert dynamic.prepare_resource_claims([claim("u6", ("g", "gpu-0000-0f-00-0"))])["u6"].error is None


def test_unprepare_removes_the_spec_and_is_idempotent(driver: GpuDriver, tmp_path: Path):
    driver.prepare_resource_claims([claim("u5", ("a", "gpu-0000-0f-00-0"))])
    ref = ClaimRef("default", "claim-u5", "u5")
    assert driver.unprepare_resource_claims([ref]) == {"u5": None}
    assert driver.unprepare_resource_claims([ref, ClaimRef("default", "never", "u6")]) == {"u5": None, "u6": None}
    assert not list(tmp_path.iterdir())


def test_a_device_prepared_for_one_claim_is_refused_to_another(driver: GpuDriver):
    assert driver.prepare_resource_claims([claim("a", ("g", "gpu-0000-0f-00-0"))])["a"].error is None
    refused = driver.prepare_resource_claims([claim("b", ("g", "gpu-0000-0f-00-0"))])["b"]
    assert "gpu-0000-0f-00-0 is already prepared for claim a" in (refused.error or "")
    assert driver.prepare_resource_claims([claim("a", ("g", "gpu-0000-0f-00-0"))])["a"].error is None  # idempotent
    driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")])
    assert driver.prepare_resource_claims([claim("b", ("g", "gpu-0000-0f-00-0"))])["b"].error is None


def test_a_device_the_cluster_gave_to_a_new_claim_is_released_by_its_earlier_claim(tmp_path: Path):
    # The real kubelet removes a pod from the API server before it unprepares the pod's claims, so the scheduler
    # can give the device to a new claim first; the cluster (here: ``released``) says whether the holder lost it.
    asked: list[tuple[str, str]] = []
    released = {"a"}

    def holder_released(ref: ClaimRef, device: str) -> bool:
        asked.append((ref.uid, device))
        return ref.uid in released

    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
        holder_released=holder_released,
    )
    assert driver.prepare_resource_claims([claim("a", ("g", "gpu-0000-0f-00-0"))])["a"].error is None
    assert driver.prepare_resource_claims([claim("b", ("g", "gpu-0000-0f-00-0"))])["b"].error is None
    assert asked == [("a", "gpu-0000-0f-00-0")]
    assert [r.uid for r in driver.checkpoint.records()] == ["b"]
    # The kubelet's own unprepare of the earlier claim comes later and finds nothing to do.
    assert driver.unprepare_resource_claims([ClaimRef("default", "claim-a", "a")]) == {"a": None}
    # A holder the cluster still allocates the device to keeps it.
    refused = driver.prepare_resource_claims([claim("c", ("g", "gpu-0000-0f-00-0"))])["c"]
    assert "gpu-0000-0f-00-0 is already prepared for claim b" in (refused.error or "")
    assert [r.uid for r in driver.checkpoint.records()] == ["b"]


def test_admin_access_may_share_a_prepared_device(driver: GpuDriver):
    assert driver.prepare_resource_claims([claim("a", ("g", "gpu-0000-0f-00-0"))])["a"].error is None
    monitor = claim("m", ("all", "gpu-0000-0f-00-0"), admin=True)
    assert driver.prepare_resource_claims([monitor])["m"].error is None


def test_an_admin_access_claim_does_not_block_a_regular_one(driver: GpuDriver, tmp_path: Path):
    monitor = claim("m", ("all", "gpu-0000-0f-00-0"), admin=True)
    assert driver.prepare_resource_claims([monitor])["m"].error is None
    assert "DRA_ADMIN_ACCESS=true" in (tmp_path / "k8s.gpu.dradriver.dev-claim_m.json").read_text()
    assert driver.prepare_resource_claims([claim("b", ("g", "gpu-0000-0f-00-0"))])["b"].error is None


def test_a_new_claim_on_an_unhealthy_device_is_refused_naming_cause_and_time(tmp_path: Path):
    problems = {"gpu-0000-0f-00-0": "XID 79 on GPU GPU-1 (since 2026-11-23T05:00:00Z)"}
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
        device_problem=lambda name, _tolerations: problems.get(name),
    )
    result = driver.prepare_resource_claims([claim("u1", ("a", "gpu-0000-47-00-0"), ("b", "gpu-0000-0f-00-0"))])["u1"]
    assert result.error is not None
    assert "device gpu-0000-0f-00-0 is unhealthy: XID 79" in result.error
    assert "since 2026-11-23T05:00:00Z" in result.error
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_allocation_tolerations_reach_the_health_check(tmp_path: Path):
    seen: dict[str, tuple] = {}

    def problem(name: str, tolerations) -> str | None:
        seen[name] = tuple(tolerations)
        return None if tolerations else "XID 79 (since 2026-11-23T05:00:00Z)"

    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
        device_problem=problem,
    )
    raw = raw_claim("u1", ("a", "gpu-0000-0f-00-0"))
    raw["status"]["allocation"]["devices"]["results"][0]["tolerations"] = [
        {"key": "gpu.dradriver.dev/xid", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert driver.prepare_resource_claims([typed(raw)])["u1"].error is None
    assert seen["gpu-0000-0f-00-0"] == (
        DeviceToleration(key="gpu.dradriver.dev/xid", operator="Exists", effect="NoSchedule"),
    )
    refused = driver.prepare_resource_claims([claim("u2", ("a", "gpu-0000-47-00-0"))])["u2"]
    assert "is unhealthy: XID 79" in str(refused.error)


def test_a_claim_prepared_before_its_device_turned_unhealthy_is_left_alone(tmp_path: Path):
    problems: dict[str, str] = {}
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path),
        device_problem=lambda name, _tolerations: problems.get(name),
    )
    first = driver.prepare_resource_claims([claim("u1", ("a", "gpu-0000-0f-00-0"))])["u1"]
    problems["gpu-0000-0f-00-0"] = "double-bit ECC error (since 2026-11-23T05:00:00Z)"
    assert driver.prepare_resource_claims([claim("u1", ("a", "gpu-0000-0f-00-0"))])["u1"] == first
    assert "unhealthy" in str(driver.prepare_resource_claims([claim("u2", ("a", "gpu-0000-0f-00-0"))])["u2"].error)
