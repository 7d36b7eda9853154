"""Prometheus metrics, named the Kubernetes way (``<component>_<what>_<unit>``, ``_total`` for counters, base
units): kubelet calls per RPC and outcome, claim errors by reason, prepared devices by type and sharing and the MPS
daemons and which pod holds which device (``dradriver_device_allocation_info``; all read from the checkpoint at
scrape time), device health and GPU events (recorded by
``driver.health``), and whether the last ResourceSlice publish succeeded. docs/reliability.md shows a sample
scrape."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dradriver.driver.observe.allocations import allocations, sharing_label
from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord
from dradriver.driver.prepare.sharing import STEP_MPS_DAEMON
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DriverHandler, PrepareResult

PREPARE_RPC = "NodePrepareResources"
UNPREPARE_RPC = "NodeUnprepareResources"

CLAIMS = Counter("dradriver_claims_total", "Claims handled, by operation and result", ["operation", "result"])
REQUESTS = Counter(
    "dradriver_kubelet_requests_total",
    "Kubelet DRA calls handled, by RPC and outcome (error: at least one claim of the call failed)",
    ["rpc", "outcome"],
)
DURATION = Histogram(
    "dradriver_kubelet_request_duration_seconds",
    "Time to handle one kubelet DRA call, by RPC and outcome",
    ["rpc", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
CLAIM_ERRORS = Counter(
    "dradriver_claim_errors_total",
    "Claims that failed, by RPC and reason (see docs/reliability.md for the reasons)",
    ["rpc", "reason"],
)
DEVICE_HEALTH = Gauge(
    "dradriver_device_health",
    "Health of each published device as the kubelet's health stream says it: 0 unknown, 1 healthy, 2 unhealthy",
    ["device"],
)
DELETED_CLAIMS = Counter(
    "dradriver_deleted_claims_unprepared_total",
    "Prepared claims the periodic re-check found deleted from the API server, and unprepared",
)
XID_ERRORS = Counter(
    "dradriver_device_xid_errors_total",
    "XID errors NVML reported, by GPU UUID and XID (docs/health.md: which XIDs are the application's)",
    ["gpu_uuid", "xid"],
)
GPU_EVENTS = Counter(
    "dradriver_gpu_events_total",
    "GPU health events seen on the node, by kind (xid, ecc, gpu-lost) and XID (empty for other kinds); the same "
    "XIDs per GPU are dradriver_device_xid_errors_total",
    ["kind", "xid"],
)

#: (reason, words any of which in an error's text selects it), first match wins; the texts are our own messages.
_REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("api-unavailable", ("from the API server", "cannot get claim")),
    ("unhealthy-device", ("is unhealthy",)),
    ("device-in-use", ("already prepared for claim", "overlaps")),
    (
        "storage",
        (
            "No space left",
            "cannot write checkpoint",
            "unable to write CDI spec",
            "unable to remove CDI spec",
            "Read-only file system",
        ),
    ),
    ("invalid-claim", ("not allocated", "pool", "not offered by this node", "config")),
    ("hardware", ("step ", "MIG", "NVML", "injected failure")),
)


def error_reason(message: str) -> str:
    """A short, bounded label for a claim's error message (``other`` when none fits)."""
    for reason, words in _REASONS:
        if any(word in message for word in words):
            return reason
    return "other"


class InstrumentedHandler:
    """Counts calls and claims, times calls and classifies errors for the handler it wraps."""

    def __init__(self, handler: DriverHandler) -> None:
        self._handler = handler

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        began = time.perf_counter()
        results = self._handler.prepare_resource_claims(claims)
        errors = [r.error for r in results.values() if r.error]
        _record(PREPARE_RPC, began, len(results), errors)
        return results

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        began = time.perf_counter()
        results = self._handler.unprepare_resource_claims(claims)
        errors = [e for e in results.values() if e]
        _record(UNPREPARE_RPC, began, len(results), errors)
        return results


def _record(rpc: str, began: float, count: int, errors: list[str]) -> None:
    outcome = "error" if errors else "success"
    DURATION.labels(rpc, outcome).observe(time.perf_counter() - began)
    REQUESTS.labels(rpc, outcome).inc()
    operation = "prepare" if rpc == PREPARE_RPC else "unprepare"
    CLAIMS.labels(operation, "ok").inc(count - len(errors))
    for error in errors:
        CLAIMS.labels(operation, "error").inc()
        CLAIM_ERRORS.labels(rpc, error_reason(error)).inc()


class NodeCollector(Collector):
    """Figures read when scraped: prepared devices from the checkpoint, the last publish from the publisher."""

    def __init__(self, checkpoint: CheckpointStore, published: Callable[[], bool]) -> None:
        self._checkpoint = checkpoint
        self._published = published

    def collect(self) -> Iterator[Any]:
        prepared = GaugeMetricFamily(
            "dradriver_prepared_devices",
            "Devices prepared for claims on this node, by type (gpu, mig) and sharing (exclusive, admin-access, "
            "time-slicing, mps, consumable)",
            labels=["type", "sharing"],
        )
        counts = dict.fromkeys(_PREPARED_SERIES, 0)
        daemons = 0
        records = self._checkpoint.records()
        for record in records:
            for device in record.devices:
                key = (device.kind, sharing_label(device))
                counts[key] = counts.get(key, 0) + 1
            daemons += sum(1 for a in record.actions if a.step == STEP_MPS_DAEMON and a.done)
        for (kind, sharing), value in sorted(counts.items()):
            prepared.add_metric([kind, sharing], value)
        yield prepared
        yield allocation_info(records)
        yield GaugeMetricFamily(
            "dradriver_mps_daemons",
            "MPS control daemons this driver runs for prepared claims (one per claim with MPS devices)",
            value=daemons,
        )
        yield GaugeMetricFamily(
            "dradriver_resourceslices_published",
            "1 when the last ResourceSlice publish succeeded, else 0",
            value=1 if self._published() else 0,
        )


#: The series of ``dradriver_prepared_devices`` shown (as 0) before any such device is prepared.
_PREPARED_SERIES = (
    *(("gpu", s) for s in ("exclusive", "admin-access", "time-slicing", "mps", "consumable")),
    *(("mig", s) for s in ("exclusive", "admin-access", "mps")),  # a partition is not time-sliced or shared
)


#: Labels of ``dradriver_device_allocation_info``: ``uuid`` joins with DCGM exporter's ``UUID`` for a whole GPU,
#: ``gpu_uuid`` and ``gpu_instance_id`` with its ``UUID`` and ``GPU_I_ID`` for a MIG device (docs/observability.md).
ALLOCATION_LABELS = (
    "namespace",
    "pod",
    "pod_uid",
    "claim",
    "request",
    "device",
    "uuid",
    "gpu_uuid",
    "gpu_instance_id",
    "mig_profile",
    "sharing",
)


def allocation_info(records: Iterable[ClaimRecord]) -> GaugeMetricFamily:
    """One series of value 1 per prepared device and pod, gone when the claim is unprepared."""
    family = GaugeMetricFamily(
        "dradriver_device_allocation_info",
        "A device prepared for a pod's claim (value 1): which pod holds which GPU or MIG device, by UUID",
        labels=list(ALLOCATION_LABELS),
    )
    for a in allocations(records):
        requests = ",".join(a.requests)
        instance = "" if a.gpu_instance_id is None else str(a.gpu_instance_id)
        values = (a.namespace, a.pod, a.pod_uid, a.claim, requests, a.device, a.uuid, a.gpu_uuid, instance)
        family.add_metric([*values, a.mig_profile, a.sharing], 1)
    return family


def register_node_collector(collector: Collector) -> Callable[[], None]:
    """Register ``collector`` with the default registry; returns its unregister (tests and restarts)."""
    REGISTRY.register(collector)
    return lambda: REGISTRY.unregister(collector)
