"""Claim device status through the real cluster adapter against the API server stand-in: written after a
prepare, cleared at unprepare, retried on failures, and never a reason for a prepare to fail."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import ApiEnv, api_env
from support.kubelet_plugin_fakes import DRIVER, make_claim

from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, PreparedDevice, PrepareResult
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor

STATUS_PATH = r"/resourceclaims/[^/]+/status$"
DATA = {"uuid": "GPU-1234", "productName": "NVIDIA A100-SXM4-40GB", "sharing": {"strategy": "Exclusive"}}


class DataHandler:
    """Prepares every allocated device of our driver and reports ``DATA`` as its status data."""

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        out = {}
        for claim in claims:
            out[claim.uid] = PrepareResult(
                devices=tuple(
                    PreparedDevice(pool=r.pool, device=r.device, requests=(r.request,), status_data=DATA)
                    for r in claim.devices
                )
            )
        return out

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        return {ref.uid: None for ref in claims}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiEnv]:
    with api_env(tmp_path) as env:
        yield env


@pytest.fixture
def writer(api: ApiEnv) -> Iterator[ClaimStatusWriter]:
    status = ClaimStatusWriter(api.cluster, driver_name=DRIVER, node_name="node-a", backoff=0.01, attempts=4)
    yield status
    status.stop()


@pytest.fixture
def processor(api: ApiEnv, writer: ClaimStatusWriter) -> ClaimProcessor:
    return ClaimProcessor(
        driver_name=DRIVER, handler=DataHandler(), claim_source=api.cluster, locks=ClaimLocks(), claim_status=writer
    )


def stored_claim(api: ApiEnv, *, other_driver_entry: bool = False) -> ClaimRef:
    claim = make_claim(
        "c1",
        "",
        results=[
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
            {"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "eth0"},
        ],
    )
    del claim["metadata"]["uid"]
    if other_driver_entry:
        claim["status"]["devices"] = [{"driver": "nic.example.com", "pool": "node-a", "device": "eth0"}]
    created = api.server.create("resourceclaims", claim)
    return ClaimRef("default", "c1", created["metadata"]["uid"])


def devices_of(api: ApiEnv, driver: str = DRIVER) -> list[dict[str, Any]]:
    claim = api.server.get("resourceclaims", "c1", "default") or {}
    return [d for d in claim.get("status", {}).get("devices", []) if d["driver"] == driver]


def test_prepare_writes_each_device_with_a_ready_condition_and_its_data(
    api: ApiEnv, processor: ClaimProcessor, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api)
    assert processor.prepare([ref])[ref.uid].error is None
    assert writer.wait_idle(10)
    written = devices_of(api)
    assert [(d["pool"], d["device"]) for d in written] == [("node-a", "gpu-0"), ("node-a", "gpu-1")]
    [ready] = written[0]["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert "node-a" in ready["message"]
    assert written[0]["data"] == DATA


def test_unprepare_clears_our_entries_and_keeps_other_drivers(
    api: ApiEnv, processor: ClaimProcessor, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api, other_driver_entry=True)
    processor.prepare([ref])
    assert writer.wait_idle(10)
    assert len(devices_of(api)) == 2 and len(devices_of(api, "nic.example.com")) == 1
    assert processor.unprepare([ref]) == {ref.uid: None}
    assert writer.wait_idle(10)
    assert devices_of(api) == []
    assert devices_of(api, "nic.example.com") == [{"driver": "nic.example.com", "pool": "node-a", "device": "eth0"}]


def test_a_repeated_prepare_writes_nothing_new(
    api: ApiEnv, processor: ClaimProcessor, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api)
    processor.prepare([ref])
    assert writer.wait_idle(10)
    mark = api.server.mark()
    processor.prepare([ref])  # the kubelet repeats prepare after its restart
    assert writer.wait_idle(10)
    assert [r for r in api.server.writes_since(mark) if r.path.endswith("/status")] == []


def test_a_failing_status_write_does_not_fail_the_prepare_and_is_retried(
    api: ApiEnv, processor: ClaimProcessor, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api)
    api.server.fail_next("PATCH", STATUS_PATH, 500, count=2)
    api.server.fail_next("PATCH", STATUS_PATH, 409, count=1)
    result = processor.prepare([ref])[ref.uid]
    assert result.error is None and len(result.devices) == 2
    assert writer.wait_idle(10)
    assert len(devices_of(api)) == 2


def test_a_status_write_that_keeps_failing_is_given_up_and_the_prepare_still_succeeds(
    api: ApiEnv, processor: ClaimProcessor, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api)
    api.server.fail_next("PATCH", STATUS_PATH, 403, count=100, message="forbidden: RBAC")
    assert processor.prepare([ref])[ref.uid].error is None
    assert writer.wait_idle(10)
    patches = [r for r in api.server.requests if r.method == "PATCH" and r.path.endswith("/status")]
    assert len(patches) == 1  # forbidden is not retried: RBAC does not fix itself
    assert devices_of(api) == []


def test_a_deleted_or_replaced_claim_is_left_alone(api: ApiEnv, writer: ClaimStatusWriter) -> None:
    ref = stored_claim(api)
    writer.prepared(ClaimRef(ref.namespace, ref.name, "another-uid"), [PreparedDevice(pool="node-a", device="gpu-0")])
    writer.unprepared(ClaimRef(ref.namespace, "gone", "uid-gone"))
    assert writer.wait_idle(10)
    assert devices_of(api) == []


def test_the_stand_in_rejects_status_for_a_device_that_is_not_allocated(api: ApiEnv, writer: ClaimStatusWriter) -> None:
    ref = stored_claim(api)
    writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-9")])
    assert writer.wait_idle(10)
    assert devices_of(api) == []
    rejected = [r for r in api.server.requests if r.method == "PATCH" and r.status == 422]
    assert len(rejected) == 1


def test_stop_drops_queued_updates_and_a_later_update_starts_the_writer_again(
    api: ApiEnv, writer: ClaimStatusWriter
) -> None:
    ref = stored_claim(api)
    api.server.delay_next("GET", r"/resourceclaims/c1$", 0.5)
    writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-0")])
    writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-1")])
    writer.stop()
    assert writer.wait_idle(1)
    writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-0")])
    assert writer.wait_idle(10)
    assert [d["device"] for d in devices_of(api)] == ["gpu-0"]


class _RecordingWriter(ClaimStatusWriter):
    """Records the order of the plugin layer's calls; the first ``prepared`` waits for ``gate``."""

    def __init__(self, api: ApiEnv) -> None:
        super().__init__(api.cluster, driver_name=DRIVER, node_name="node-a")
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.inside = threading.Event()

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        self.inside.set()
        assert self.gate.wait(10)
        self.calls.append("prepared")

    def unprepared(self, ref: ClaimRef) -> None:
        self.calls.append("unprepared")


def test_a_clear_is_queued_after_the_write_of_the_prepare_before_it(api: ApiEnv) -> None:
    # Queued outside the claim's lock, a prepare's write could be overtaken by the unprepare that follows it,
    # leaving "Ready: prepared" on a claim that is no longer prepared.
    ref = stored_claim(api)
    recorder = _RecordingWriter(api)
    locks = ClaimLocks()
    processor = ClaimProcessor(
        driver_name=DRIVER, handler=DataHandler(), claim_source=api.cluster, locks=locks, claim_status=recorder
    )
    preparing = threading.Thread(target=processor.prepare, args=([ref],))
    preparing.start()
    assert recorder.inside.wait(10)
    unpreparing = threading.Thread(target=processor.unprepare, args=([ref],))
    unpreparing.start()
    locks.wait_until_waiting(ref.uid, 1, 2.0)  # the unprepare waits for the claim (or, wrongly, is done already)
    recorder.gate.set()
    preparing.join(10)
    unpreparing.join(10)
    assert recorder.calls == ["prepared", "unprepared"]


class _HangingPort:
    """The cluster port over the API stand-in; the first GET hangs (an HTTP call that does not return) until
    ``release``. Counts calls in progress at once."""

    def __init__(self, api: ApiEnv) -> None:
        self.api = api
        self.hanging = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self._first = True

    def _enter(self) -> None:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            first, self._first = self._first, False
        if first:
            self.hanging.set()
            assert self.release.wait(10)

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self._enter()
        try:
            return self.api.cluster.get_resource_claim(namespace, name)
        finally:
            self._leave()

    def update_resource_claim_status(self, claim: dict[str, Any]) -> dict[str, Any]:
        self._enter()
        try:
            return self.api.cluster.update_resource_claim_status(claim)
        finally:
            self._leave()


def _status_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "claim-status"]


def test_a_writer_stuck_in_http_at_stop_is_never_joined_by_a_second_one(api: ApiEnv) -> None:
    ref = stored_claim(api)
    port = _HangingPort(api)
    writer = ClaimStatusWriter(port, driver_name=DRIVER, node_name="node-a", backoff=0.01)
    before = len(_status_threads())
    writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-0")])
    assert port.hanging.wait(10)
    writer.stop(timeout=0)  # gives up on the stuck thread at once
    writer.unprepared(ref)  # starts the writer again: its clear must come after the stuck write, not beside it
    assert not writer.wait_idle(0)
    port.release.set()
    assert writer.wait_idle(10)
    assert port.most_active == 1
    assert devices_of(api) == []  # the clear came last
    writer.stop(timeout=10)
    assert len(_status_threads()) == before


def test_a_job_queued_for_a_writer_started_while_a_stop_still_runs_is_written(api: ApiEnv) -> None:
    """A prepare or unprepare finishing on a gRPC thread while the writer stops starts it again: that job belongs to
    the new writer and is written after the stuck one, not dropped with the stopped writer's queue."""
    ref = stored_claim(api)
    port = _HangingPort(api)
    writer = ClaimStatusWriter(port, driver_name=DRIVER, node_name="node-a", backoff=0.01)

    class SubmitDuringStop(logging.Handler):  # runs at the moment stop has given up on the stuck writer
        def emit(self, record: logging.LogRecord) -> None:
            if "still busy" in record.getMessage():
                writer.unprepared(ref)

    handler = SubmitDuringStop()
    status_log = logging.getLogger("dradriver.plugin.cluster.claim_status")
    status_log.addHandler(handler)
    try:
        writer.prepared(ref, [PreparedDevice(pool="node-a", device="gpu-0")])
        assert port.hanging.wait(10)
        writer.stop(timeout=0)
    finally:
        status_log.removeHandler(handler)
    port.release.set()
    assert writer.wait_idle(10)
    assert port.most_active == 1
    assert devices_of(api) == []  # the clear, queued during the stop, came after the stuck write
    writer.stop(timeout=10)
