"""Metrics: kubelet calls by RPC and outcome, claim errors by reason, prepared devices from the checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest
from support.nodes import inventory_of

from dradriver.driver.observe.metrics import InstrumentedHandler, NodeCollector, error_reason, register_node_collector
from dradriver.driver.prepare.checkpoint import Action, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, PrepareResult
from tests.driver.prepare.test_state import DRIVER, raw_claim, typed


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Handler:
    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        return {
            c.uid: PrepareResult(error="device gpu-0 is unhealthy: XID 79" if c.uid == "bad" else None) for c in claims
        }

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        return {c.uid: None for c in claims}


def test_calls_are_counted_and_timed_by_rpc_and_outcome_and_errors_by_reason() -> None:
    handler = InstrumentedHandler(Handler())
    rpc = "NodePrepareResources"
    before = {
        "errors": value("dradriver_kubelet_requests_total", rpc=rpc, outcome="error"),
        "ok": value("dradriver_kubelet_requests_total", rpc=rpc, outcome="success"),
        "unhealthy": value("dradriver_claim_errors_total", rpc=rpc, reason="unhealthy-device"),
        "timed": value("dradriver_kubelet_request_duration_seconds_count", rpc=rpc, outcome="error"),
    }
    good = AllocatedClaim(ref=ClaimRef("ns", "a", "good"), devices=())
    bad = AllocatedClaim(ref=ClaimRef("ns", "b", "bad"), devices=())
    handler.prepare_resource_claims([good, bad])
    handler.prepare_resource_claims([good])
    assert value("dradriver_kubelet_requests_total", rpc=rpc, outcome="error") == before["errors"] + 1
    assert value("dradriver_kubelet_requests_total", rpc=rpc, outcome="success") == before["ok"] + 1
    assert value("dradriver_claim_errors_total", rpc=rpc, reason="unhealthy-device") == before["unhealthy"] + 1
    assert value("dradriver_kubelet_request_duration_seconds_count", rpc=rpc, outcome="error") == before["timed"] + 1


def test_error_reasons_are_a_small_fixed_set() -> None:
    assert error_reason("cannot get claim ns/a from the API server: 503") == "api-unavailable"
    assert error_reason("unable to write CDI spec /x: [Errno 28] No space left on device") == "storage"
    assert error_reason("unable to remove CDI spec /x: [Errno 30] Read-only file system: '/x'") == "storage"
    assert error_reason("device gpu-0, step gpu-instance: Insufficient Resources") == "hardware"
    assert error_reason("something new") == "other"


def test_prepared_devices_and_the_last_publish_are_read_when_scraped(tmp_path: Path) -> None:
    store = CheckpointStore.open(tmp_path, boot_id="b")
    published = {"ok": False}
    unregister = register_node_collector(NodeCollector(store, lambda: published["ok"]))
    try:
        store.put(
            ClaimRecord(
                uid="u1",
                namespace="ns",
                name="c",
                state=ClaimState.PREPARE_COMPLETED,
                devices=[
                    DeviceRecord(name="gpu-0-mig-1g10gb-0", requests=["r"], gpu="gpu-0", gpu_uuid="GPU-0", kind="mig"),
                    DeviceRecord(name="gpu-1", requests=["r"], gpu="gpu-1", gpu_uuid="GPU-1", kind="gpu"),
                ],
            )
        )
        assert value("dradriver_prepared_devices", type="mig", sharing="exclusive") == 1
        assert value("dradriver_prepared_devices", type="gpu", sharing="admin-access") == 0
        assert value("dradriver_resourceslices_published") == 0
        published["ok"] = True
        assert "dradriver_resourceslices_published 1.0" in generate_latest().decode()
    finally:
        unregister()
        store.close()


def test_prepared_devices_are_labelled_by_how_they_are_shared_and_mps_daemons_counted(tmp_path: Path) -> None:
    store = CheckpointStore.open(tmp_path, boot_id="b")
    unregister = register_node_collector(NodeCollector(store, lambda: True))

    def device(name: str, kind: str = "gpu", **extra: object) -> DeviceRecord:
        record = DeviceRecord(name=name, requests=["r"], gpu=name, gpu_uuid=f"GPU-{name}", kind=kind)
        record.extra.update(extra)
        return record

    mps = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    sliced = {**mps, "sharing": {"strategy": "TimeSlicing"}}
    watcher = device("gpu-4")
    watcher.admin_access = True
    try:
        assert value("dradriver_mps_daemons") == 0
        assert 'dradriver_prepared_devices{sharing="consumable",type="gpu"} 0.0' in generate_latest().decode()
        store.put(
            ClaimRecord(
                uid="u1",
                namespace="ns",
                name="c",
                state=ClaimState.PREPARE_COMPLETED,
                devices=[
                    device("gpu-0", config=mps),
                    device("gpu-0-mig-1g10gb-0", "mig", config={**mps, "kind": "MigDeviceConfig"}),
                    device("gpu-1", config=sliced),
                    device("gpu-2", config=mps, shareIds=["s1"]),
                    device("gpu-3"),
                    watcher,
                ],
                actions=[Action(step="mps-daemon", device="", params={"pid": 1}, done=True)],
            )
        )
        for kind, sharing in (
            ("gpu", "mps"),
            ("mig", "mps"),
            ("gpu", "time-slicing"),
            ("gpu", "consumable"),
            ("gpu", "exclusive"),
            ("gpu", "admin-access"),
        ):
            assert value("dradriver_prepared_devices", type=kind, sharing=sharing) == 1, (kind, sharing)
        assert value("dradriver_mps_daemons") == 1
    finally:
        unregister()
        store.close()


def test_each_prepared_device_has_one_allocation_series_per_pod_gone_at_unprepare(tmp_path: Path) -> None:
    """Built from the checkpoint and the claims' reservedFor; ``uuid`` is the MIG device's own UUID, ready to join
    with DCGM exporter's series."""
    store = CheckpointStore.open(tmp_path / "state", boot_id="b")
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=CdiWriter(tmp_path / "cdi"),
        checkpoint=store,
    )
    unregister = register_node_collector(NodeCollector(store, lambda: True))
    mig, gpu = "gpu-0000-07-00-0-mig-1g5gb-6", "gpu-0000-0f-00-0"
    mixed = inventory_of("mixed")
    try:
        raw = raw_claim("u1", ("train", mig), ("eval", gpu))
        raw["status"]["reservedFor"] = [
            {"resource": "pods", "name": "trainer-0", "uid": "p0"},
            {"resource": "pods", "name": "trainer-1", "uid": "p1"},
        ]
        assert driver.prepare_resource_claims([typed(raw)])["u1"].error is None
        series = allocation_series()
        assert len(series) == 4  # two devices, two pods
        assert {
            "namespace": "default",
            "pod": "trainer-1",
            "pod_uid": "p1",
            "claim": "claim-u1",
            "request": "train",
            "device": mig,
            "uuid": "MIG-cde5205c-3650-605f-e8cc-6a00cadf0114",
            "gpu_uuid": next(g.uuid for g in inventory_of("mixed").gpus if g.name == "gpu-0000-07-00-0"),
            "gpu_instance_id": str(next(m.existing.gpu_instance_id for m in mixed.mig_devices if m.name == mig)),
            "mig_profile": "1g.5gb",
            "sharing": "exclusive",
        }.items() <= next(s for s in series if s["pod"] == "trainer-1" and s["device"] == mig).items()
        driver.unprepare_resource_claims([ClaimRef("default", "claim-u1", "u1")])
        assert allocation_series() == []
    finally:
        unregister()


def allocation_series() -> list[dict[str, str]]:
    return [
        dict(sample.labels)
        for family in REGISTRY.collect()
        if family.name == "dradriver_device_allocation_info"
        for sample in family.samples
        if sample.value == 1
    ]
