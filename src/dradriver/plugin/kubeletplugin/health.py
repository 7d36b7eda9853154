"""The DRA resource-health service (``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth``): a stream of
complete device-health lists.

The kubelet opens one NodeWatchResources stream per driver, marks devices it has not heard about within their
timeout as unknown, and re-opens the stream every few seconds when it ends. So each message carries the
complete list, sent at once, again after every change and again every ``interval`` seconds as a heartbeat.

Kubernetes 1.37 moved the API to v1 (the same messages in proto package ``v1``); a 1.37 kubelet opens v1 when
the plugin advertises it and falls back to v1alpha1, which 1.34-1.36 kubelets use, until 1.40. Both are served
from one :class:`HealthStreams`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import grpc

from dradriver.api.generated import dra_health_v1_pb2, dra_health_v1_pb2_grpc
from dradriver.api.generated import dra_health_v1alpha1_pb2 as pb
from dradriver.api.generated import dra_health_v1alpha1_pb2_grpc as pb_grpc
from dradriver.plugin.handler import HealthSource

logger = logging.getLogger(__name__)
# The advertised names of the versions served (pluginregistration's supported_versions), newest first.
VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class HealthStreams:
    """NodeWatchResources streams from a :class:`HealthSource`, in either API version's messages."""

    def __init__(self, source: HealthSource, *, interval: float) -> None:
        self._source = source
        self._interval = interval
        self._lock = threading.Lock()
        self._streams: set[threading.Event] = set()
        self._stopping = False

    def watch(self, messages: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        """One stream, its responses built from ``messages`` (the generated module of the version served)."""
        wake = threading.Event()
        with self._lock:
            if self._stopping:
                return
            self._streams.add(wake)
        unsubscribe = self._source.subscribe(wake.set)
        # Ends the wait below as soon as the kubelet goes away, instead of at the next heartbeat.
        context.add_callback(wake.set)
        logger.info("kubelet opened the health stream version=%s", messages.DESCRIPTOR.package)
        try:
            while True:
                wake.clear()
                try:
                    response = self._snapshot(messages)
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

    def _snapshot(self, messages: ModuleType) -> Any:
        response = messages.NodeWatchResourcesResponse()
        for health in self._source.device_health():
            response.devices.add(
                device=messages.DeviceIdentifier(pool_name=health.pool, device_name=health.device),
                health=int(health.status),
                last_updated_time=health.last_updated,
                health_check_timeout_seconds=health.timeout_seconds,
                message=health.message,
            )
        return response


class DRAResourceHealthV1(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth`` (Kubernetes 1.37+)."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    def NodeWatchResources(
        self, request: dra_health_v1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        return self._streams.watch(dra_health_v1_pb2, context)


class DRAResourceHealthV1alpha1(pb_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth`` (Kubernetes 1.34-1.36; 1.37-1.39 fall back to it)."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.NodeWatchResourcesResponse]:
        return self._streams.watch(pb, context)


def add_health_services(
    server: grpc.Server,
    streams: HealthStreams,
    versions: Sequence[str] = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
) -> None:
    """The health service in ``versions`` (advertised names) on ``server``, fed by ``streams``."""
    if "v1.DRAResourceHealth" in versions:
        dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1(streams), server)
    if "v1alpha1.DRAResourceHealth" in versions:
        pb_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1alpha1(streams), server)
