"""Prometheus metrics: prepare and unprepare (recorded by wrapping any ``DriverHandler``), device health and GPU
events (recorded by ``driver.health``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DriverHandler, PrepareResult

CLAIMS = Counter("dradriver_claims_total", "Claims handled, by operation and result", ["operation", "result"])
DURATION = Histogram(
    "dradriver_request_duration_seconds",
    "Time to handle one kubelet batch, by operation",
    ["operation"],
    buckets=[0.05 * 2**k for k in range(10)],
)
DEVICE_HEALTH = Gauge(
    "dradriver_device_health",
    "Health of each published device as the kubelet's health stream says it: 0 unknown, 1 healthy, 2 unhealthy",
    ["device"],
)
GPU_EVENTS = Counter(
    "dradriver_gpu_events_total",
    "GPU health events seen, by kind (xid, ecc, gpu-lost) and XID (empty for other kinds)",
    ["kind", "xid"],
)


class InstrumentedHandler:
    """Counts claims (ok / error) and times batches for the handler it wraps."""

    def __init__(self, handler: DriverHandler) -> None:
        self._handler = handler

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        with DURATION.labels("prepare").time():
            results = self._handler.prepare_resource_claims(claims)
        for result in results.values():
            CLAIMS.labels("prepare", "error" if result.error else "ok").inc()
        return results

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        with DURATION.labels("unprepare").time():
            results = self._handler.unprepare_resource_claims(claims)
        for error in results.values():
            CLAIMS.labels("unprepare", "error" if error else "ok").inc()
        return results
