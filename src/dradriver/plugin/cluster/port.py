"""The cluster port: everything the plugin layer needs from the Kubernetes API server.

Objects cross this port in their JSON form (camelCase dicts, exactly as the API server sends them), never as
``kubernetes`` client models: those models drop fields they do not know, so a read-modify-write through them
would erase fields a newer API server added. Two adapters implement the port: ``kube.KubeCluster``
(the real ``kubernetes`` client) and ``memory.MemoryCluster`` (a dict-backed fake for the demo and
unit tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from dradriver.errors import DradriverError

JsonObject = dict[str, Any]
WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]

RESOURCE_SLICE_API_VERSION = "resource.k8s.io/v1"


def describe(kind: str, name: str, namespace: str | None = None) -> str:
    """``kind namespace/name``, or ``kind name`` for cluster-scoped objects: how errors and logs name them."""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


class ClusterError(DradriverError):
    """A request to the API server failed. ``status`` is the HTTP status code (0 when none was received)."""

    #: Whether retrying the same request later may succeed.
    retryable = False

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFoundError(ClusterError):
    """The object does not exist (HTTP 404)."""


class ConflictError(ClusterError):
    """The object changed since it was read, or a precondition failed, or it already exists (HTTP 409)."""

    retryable = True


class InvalidObjectError(ClusterError):
    """The API server rejected the object as invalid (HTTP 422); the message lists its reasons."""


class ForbiddenError(ClusterError):
    """The API server refused the request (HTTP 401/403): check the service account's RBAC rules."""


class ApiUnavailableError(ClusterError):
    """The API server could not be reached, timed out, or answered 429/5xx; retry with backoff."""

    retryable = True


class WatchExpiredError(ClusterError):
    """A watch's resourceVersion is too old (HTTP 410 Gone); list again and watch from the new version."""

    retryable = True


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch. ``object`` is the object's JSON form; for BOOKMARK only its resourceVersion."""

    type: WatchEventType
    object: JsonObject

    @property
    def resource_version(self) -> str:
        """The object's ``metadata.resourceVersion`` (empty if absent)."""
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


@runtime_checkable
class WatchStream(Protocol):
    """An iterator of watch events that another thread may ``close()`` to end it promptly.

    Iteration ends when the server ends the watch (timeout, dropped connection) or after ``close()``.
    Errors the server reports inside the stream are raised as :class:`ClusterError` subclasses.
    """

    def __iter__(self) -> Iterator[WatchEvent]: ...

    def __next__(self) -> WatchEvent: ...

    def close(self) -> None:
        """End the stream; safe to call from any thread, more than once."""


class Cluster(Protocol):
    """What the plugin layer needs from the API server. All methods raise :class:`ClusterError` subclasses."""

    def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        """The ResourceClaim (resource.k8s.io/v1) ``namespace/name``."""
        ...

    def update_resource_claim_status(self, claim: JsonObject) -> JsonObject:
        """Write the claim's ``status.devices`` as ``claim`` has them (the rest of the status is the scheduler's
        and stays as stored); ``metadata.resourceVersion`` must be current."""
        ...

    def get_node(self, name: str) -> JsonObject:
        """The Node ``name``."""
        ...

    def patch_node(self, name: str, patch: JsonObject) -> JsonObject:
        """Apply the JSON merge patch ``patch`` (RFC 7386: null removes a key) to the Node ``name``, as a driver
        keeps its labels and annotations there; returns the Node as stored. A ``metadata.resourceVersion`` in the
        patch is a precondition: :class:`ConflictError` when the Node has changed since."""
        ...

    def list_nodes(self) -> list[JsonObject]:
        """Every Node."""
        ...

    def server_version(self) -> JsonObject:
        """The API server's ``/version`` document (``major``, ``minor``, ``gitVersion``, …)."""
        ...

    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[JsonObject], str]:
        """The ResourceSlices with ``spec.driver`` and ``spec.nodeName`` as given, and the list's
        resourceVersion (to start a watch from)."""
        ...

    def create_resource_slice(self, obj: JsonObject) -> JsonObject:
        """Create a ResourceSlice (``metadata.name`` or ``generateName`` set); returns it as stored."""
        ...

    def update_resource_slice(self, obj: JsonObject) -> JsonObject:
        """Replace a ResourceSlice; ``metadata.resourceVersion`` must be current or :class:`ConflictError`."""
        ...

    def delete_resource_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        """Delete a ResourceSlice if its uid and resourceVersion still match, else :class:`ConflictError`."""
        ...

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_seconds: int
    ) -> WatchStream:
        """Watch the ResourceSlices of ``driver`` on ``node_name`` for changes after ``resource_version``.

        The server ends the watch after about ``timeout_seconds``; bookmarks may arrive."""
        ...


def kubernetes_minor_version(info: JsonObject) -> str:
    """``"1.N"`` from a ``/version`` document: ``gitVersion`` (``v1.35.2-gke.1``) first, else ``major`` and
    ``minor`` (which some providers suffix with ``+``); raises :class:`ClusterError` if neither parses."""
    match = re.match(r"v?(\d+)\.(\d+)", str(info.get("gitVersion", "")))
    if match:
        return f"{int(match.group(1))}.{int(match.group(2))}"
    major, minor = str(info.get("major", "")), str(info.get("minor", "")).rstrip("+")
    if major.isdigit() and minor.isdigit():
        return f"{int(major)}.{int(minor)}"
    raise ClusterError(
        f"the API server's /version answer {info!r} names no version; set --kubernetes-version explicitly"
    )
