"""A client that talks to a DRA plugin the way the kubelet does, over real unix sockets (tests, demo, probes).

It does what the kubelet's plugin watcher and DRA manager do: find registration sockets in a directory,
GetInfo, pick the first DRA version it supports in the plugin's order, NotifyRegistrationStatus, then call
NodePrepareResources / NodeUnprepareResources / NodeWatchResources with the kubelet's 45 s deadline. The health
service is picked as a 1.37 kubelet picks it: the newest version the plugin advertises (v1, else v1alpha1),
none when it advertises neither.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dradriver.api.generated import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

# kubelet's defaultClientCallTimeout for DRA calls.
CALL_TIMEOUT = 45.0
# What a 1.34+ kubelet understands, in the kubelet's own terms.
KUBELET_DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# The health services a 1.37 kubelet supports, newest (preferred) first; a 1.34-1.36 kubelet knows v1alpha1 only.
KUBELET_HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_HEALTH_MODULES: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}
_DRA_MODULES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


class RegistrationRejected(Exception):
    """The stand-in refused the plugin (and told it so via NotifyRegistrationStatus)."""


def discover(registry_dir: Path) -> list[Path]:
    """Unix sockets in ``registry_dir`` as the kubelet's plugin watcher sees them (dot-files ignored)."""
    found = []
    for path in sorted(registry_dir.rglob("*")):
        if path.name.startswith("."):
            continue
        try:
            if stat.S_ISSOCK(path.stat().st_mode):
                found.append(path)
        except FileNotFoundError:
            continue
    return found


@dataclass
class Claim:
    namespace: str
    name: str
    uid: str


@dataclass
class PreparedClaim:
    """One entry of a NodePrepareResources response, version-independent."""

    error: str
    devices: list[dict[str, Any]] = field(default_factory=list)


class RegisteredPlugin:
    """A plugin the stand-in has registered: a DRA client for the chosen version plus the health client."""

    def __init__(
        self, info: pluginregistration_v1_pb2.PluginInfo, version: str, health_version: str | None = None
    ) -> None:
        self.info = info
        self.version = version
        self.health_version = health_version
        self._channel = grpc.insecure_channel(f"unix:{info.endpoint}")
        self._pb, pb_grpc = _DRA_MODULES[version]
        self._dra = pb_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RegisteredPlugin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, kind: str, claims: Iterable[Claim]) -> Any:
        message = getattr(self._pb, kind)()
        for claim in claims:
            message.claims.add(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        return message

    def prepare(self, claims: Sequence[Claim], timeout: float = CALL_TIMEOUT) -> dict[str, PreparedClaim]:
        """NodePrepareResources; the response map as plain data, devices as dicts of the proto's fields."""
        response = self._dra.NodePrepareResources(self._request("NodePrepareResourcesRequest", claims), timeout=timeout)
        result = {}
        for uid, entry in response.claims.items():
            devices = []
            for device in entry.devices:
                as_dict: dict[str, Any] = {
                    "request_names": list(device.request_names),
                    "pool_name": device.pool_name,
                    "device_name": device.device_name,
                    "cdi_device_ids": list(device.cdi_device_ids),
                }
                if "share_id" in device.DESCRIPTOR.fields_by_name and device.HasField("share_id"):
                    as_dict["share_id"] = device.share_id
                devices.append(as_dict)
            result[uid] = PreparedClaim(error=entry.error, devices=devices)
        return result

    def prepare_future(self, claims: Sequence[Claim]) -> grpc.Future[Any]:
        """NodePrepareResources started in the background (for concurrency tests)."""
        request = self._request("NodePrepareResourcesRequest", claims)
        future: grpc.Future[Any] = self._dra.NodePrepareResources.future(request, timeout=CALL_TIMEOUT)
        return future

    def unprepare(self, claims: Sequence[Claim], timeout: float = CALL_TIMEOUT) -> dict[str, str]:
        """NodeUnprepareResources; claim UID -> error ("" for success)."""
        response = self._dra.NodeUnprepareResources(
            self._request("NodeUnprepareResourcesRequest", claims), timeout=timeout
        )
        return {uid: entry.error for uid, entry in response.claims.items()}

    def watch_health(self, timeout: float = CALL_TIMEOUT) -> Any:
        """Open NodeWatchResources in the negotiated version; iterate for responses, ``.cancel()`` the result to
        end it."""
        if self.health_version is None:
            raise AssertionError(f"the plugin advertises no health service: {list(self.info.supported_versions)}")
        messages, stubs = _HEALTH_MODULES[self.health_version]
        stub = stubs.DRAResourceHealthStub(self._channel)
        return stub.NodeWatchResources(messages.NodeWatchResourcesRequest(), timeout=timeout)


class KubeletClient:
    """Registers plugins found in ``registry_dir`` the way the kubelet does."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        supported_versions: Sequence[str] = KUBELET_DRA_VERSIONS,
        health_versions: Sequence[str] = KUBELET_HEALTH_VERSIONS,
    ) -> None:
        self.registry_dir = registry_dir
        self.supported_versions = tuple(supported_versions)
        self.health_versions = tuple(health_versions)

    def get_info(self, socket: Path, timeout: float = 5.0) -> pluginregistration_v1_pb2.PluginInfo:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info: pluginregistration_v1_pb2.PluginInfo = stub.GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=timeout
            )
            return info

    def notify(self, socket: Path, registered: bool, error: str = "", timeout: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=timeout
            )

    def register(self, socket: Path | None = None) -> RegisteredPlugin:
        """Run the registration handshake with ``socket`` (default: the only socket in the directory)."""
        if socket is None:
            sockets = discover(self.registry_dir)
            if len(sockets) != 1:
                raise AssertionError(f"expected one socket in {self.registry_dir}, found {sockets}")
            socket = sockets[0]
        info = self.get_info(socket)
        problem = None
        if info.type != "DRAPlugin":
            problem = f"unexpected plugin type {info.type!r}"
        elif not Path(info.endpoint).is_absolute():
            problem = f"endpoint {info.endpoint!r} is not an absolute path"
        version = next((v for v in info.supported_versions if v in self.supported_versions), None)
        if problem is None and version is None:
            problem = (
                f"none of the plugin's versions {list(info.supported_versions)} is supported "
                f"(supported: {list(self.supported_versions)})"
            )
        if problem is not None or version is None:
            self.notify(socket, False, problem or "")
            raise RegistrationRejected(problem)
        self.notify(socket, True)
        health = next((v for v in self.health_versions if v in info.supported_versions), None)
        return RegisteredPlugin(info, version, health)
