"""The plugin registration service (``pluginregistration.Registration``) that the kubelet calls on the
registration socket to learn what the plugin is and where its DRA socket is."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from dradriver.api.generated import pluginregistration_v1_pb2 as pb
from dradriver.api.generated import pluginregistration_v1_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_V1 = "v1.DRAPlugin"
DRA_V1BETA1 = "v1beta1.DRAPlugin"
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet last reported through NotifyRegistrationStatus."""

    registered: bool
    error: str


class RegistrationState:
    """The latest registration status, observable from other threads (readiness checks, tests)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._status: RegistrationStatus | None = None
        self._reports = 0

    @property
    def status(self) -> RegistrationStatus | None:
        """The kubelet's last report, or None before the first one."""
        with self._changed:
            return self._status

    @property
    def reports(self) -> int:
        """How many reports the kubelet has sent."""
        with self._changed:
            return self._reports

    def report(self, status: RegistrationStatus) -> None:
        with self._changed:
            self._status = status
            self._reports += 1
            self._changed.notify_all()

    def wait_for_reports(self, count: int, timeout: float) -> RegistrationStatus | None:
        """Block until the kubelet has sent ``count`` reports in all; the latest one, or None on timeout."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._reports >= count, timeout):
                return None
            return self._status


class RegistrationService(pb_grpc.RegistrationServicer):
    """Answers GetInfo with the DRA endpoint and services, and records NotifyRegistrationStatus."""

    def __init__(self, *, driver_name: str, endpoint: str, services: Sequence[str], state: RegistrationState) -> None:
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=list(services)
        )
        self._state = state

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:
        logger.debug("kubelet asked for plugin info endpoint=%s", self._info.endpoint)
        return self._info

    def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        self._state.report(status)
        if status.registered:
            logger.info("kubelet registered the plugin driver=%s endpoint=%s", self._info.name, self._info.endpoint)
        else:
            # The kubelet retries registration from scratch (GetInfo again), so stay up and keep answering.
            logger.error(
                "kubelet rejected the plugin registration driver=%s error=%s; waiting for a retry",
                self._info.name,
                status.error or "(no reason given)",
            )
        return pb.RegistrationStatusResponse()


def add_registration_service(server: grpc.Server, service: RegistrationService) -> None:
    pb_grpc.add_RegistrationServicer_to_server(service, server)
