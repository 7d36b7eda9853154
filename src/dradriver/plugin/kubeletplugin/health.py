"""The DRA resource-health service (``v1alpha1.DRAResourceHealth``): a stream of complete device-health lists.

The kubelet opens one NodeWatchResources stream per driver, marks devices it has not heard about within their
timeout as unknown, and re-opens the stream every few seconds when it ends. So each message carries the
complete list, sent at once, again after every change and again every ``interval`` seconds as a heartbeat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from dradriver.api.generated import dra_health_v1alpha1_pb2 as pb
from dradriver.api.generated import dra_health_v1alpha1_pb2_grpc as pb_grpc
from dradriver.plugin.handler import HealthSource

logger = logging.getLogger(__name__)


class DRAResourceHealthV1alpha1(pb_grpc.DRAResourceHealthServicer):
    """Serves NodeWatchResources from a :class:`HealthSource`."""

    def __init__(self, source: HealthSource, *, interval: float) -> None:
        self._source = source
        self._interval = interval
        self._lock = threading.Lock()
        self._streams: set[threading.Event] = set()
        self._stopping = False

    def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.NodeWatchResourcesResponse]:
        wake = threading.Event()
        with self._lock:
            if self._stopping:
                return
            self._streams.add(wake)
        unsubscribe = self._source.subscribe(wake.set)
        # Ends the wait below as soon as the kubelet goes away, instead of at the next heartbeat.
        context.add_callback(wake.set)
        logger.info("kubelet opened the health stream")
        try:
            while True:
                wake.clear()
                try:
                    response = self._snapshot()
                except Exception as err:
                    logger.exception("cannot read device health; ending the stream")
                    context.abort(grpc.StatusCode.INTERNAL, f"cannot read device health: {err}")
                yield response
                wake.wait(self._interval)
                if self._stopping or not context.is_active():
                    return
        finally:
            unsubscribe()
            with self._lock:
                self._streams.discard(wake)
            logger.info("health stream ended")

    def stop(self) -> None:
        """End every open stream (the server's shutdown would otherwise wait for their next heartbeat)."""
        with self._lock:
            self._stopping = True
            streams = list(self._streams)
        for wake in streams:
            wake.set()

    def _snapshot(self) -> pb.NodeWatchResourcesResponse:
        response = pb.NodeWatchResourcesResponse()
        for health in self._source.device_health():
            response.devices.add(
                device=pb.DeviceIdentifier(pool_name=health.pool, device_name=health.device),
                health=pb.HealthStatus.ValueType(int(health.status)),
                last_updated_time=health.last_updated,
                health_check_timeout_seconds=health.timeout_seconds,
                message=health.message,
            )
        return response


def add_health_service(server: grpc.Server, service: DRAResourceHealthV1alpha1) -> None:
    pb_grpc.add_DRAResourceHealthServicer_to_server(service, server)
