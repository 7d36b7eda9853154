"""The cluster port over HTTPS to the API server.

Requests go through :mod:`~dradriver.plugin.cluster.transport` (in a pod: the service account; elsewhere: the
``kubernetes`` client's kubeconfig loader, so authentication means what it means to the client), and bodies
are read and written as raw JSON: the client's pydantic models drop fields they do not know, and we never want
to lose a field the API server sent.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from dradriver.errors import ConfigError
from dradriver.plugin.cluster import transport
from dradriver.plugin.cluster.kubeconfig import ClientSource, checked_context, require_source, unusable
from dradriver.plugin.cluster.port import (
    ApiUnavailableError,
    ClusterError,
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    JsonObject,
    NotFoundError,
    WatchEvent,
    WatchExpiredError,
    describe,
)
from dradriver.plugin.cluster.rate_limit import TokenBucket
from dradriver.plugin.cluster.resource_versions import VERSIONS, newest_served, slice_from, slice_to
from dradriver.plugin.cluster.transport import (
    Endpoint,
    Response,
    Timeout,
    Transport,
    from_client_configuration,
    in_cluster,
)

log = logging.getLogger(__name__)


def _lazy_package(name: str) -> None:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__`` yet. A subpackage or submodule
    is imported when first used (``import name.sub``, ``from name import sub`` or ``name.sub``); asking for any
    other attribute (what ``__init__`` defines or re-exports) runs ``__init__`` then, so the package behaves as
    an eagerly imported one would: other threads wait while it runs, and if it fails the next access runs it
    again. Nothing changes when the package was imported already.

    ``kubernetes/__init__`` imports every part of the client: the dynamic client (with jsonschema and
    kubernetes-validate's schemas), watch, stream (websocket), utils, leader election, informers; and
    ``kubernetes/config/__init__`` the kubeconfig loader (oauthlib, requests, dateutil). ``dradriver run`` needs
    ``client`` and one loader; the rest took a large part of its one-second start-up budget
    (docs/reliability.md)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed as a package: the import that follows reports it as usual
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    # Held while __init__ runs, so another thread asking meanwhile waits for it as ``import`` would (re-entrant:
    # __init__ itself may ask the package for a name it has not defined yet, which then is an AttributeError).
    initialising = threading.RLock()
    running = threading.local()

    def __getattr__(attribute: str) -> Any:  # PEP 562: called for names the module does not have (yet)
        if not attribute.startswith("__"):
            try:
                return importlib.import_module(f"{name}.{attribute}")
            except ModuleNotFoundError as err:
                if err.name != f"{name}.{attribute}":
                    raise  # the submodule exists but lacks a dependency: say so
        with initialising:
            if not getattr(running, "active", False) and package.__dict__.get("__getattr__") is __getattr__:
                running.active = True
                try:
                    loader.exec_module(package)  # raises as a failed import would; the next access tries again
                finally:
                    running.active = False
                if package.__dict__.get("__getattr__") is __getattr__:  # not one __init__ defined
                    del package.__dict__["__getattr__"]  # from now on a plain module
        try:
            return package.__dict__[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = package


_lazy_package("kubernetes")
_lazy_package("kubernetes.config")
# ``kubernetes/utils/__init__`` imports YAML object creation, quantities, durations and metrics: the REST layer
# wants only its retry and keepalive helpers.
_lazy_package("kubernetes.utils")


def client_package() -> Any:
    """``kubernetes.client``, imported at the first use (a driver in a pod never imports it: its ``Configuration``
    brings urllib3). Its functions carry no type hints; we call them through Any rather than scatter ignores."""
    return importlib.import_module("kubernetes.client")


def _load_kube_config(**options: Any) -> None:
    """``kubernetes.config.load_kube_config``, importing the kubeconfig loader only when a kubeconfig is used."""
    importlib.import_module("kubernetes.config.kube_config").load_kube_config(**options)


_RESOURCE_GROUP = "/apis/resource.k8s.io"
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
_MERGE_PATCH = "application/merge-patch+json"
# Default per-request timeout (connect, read) in seconds; watches set their own read timeout.
DEFAULT_REQUEST_TIMEOUT = (5.0, 30.0)


def load_transport(kubeconfig: str | None = None, *, context: str | None = None) -> Transport:
    """A :class:`~dradriver.plugin.cluster.transport.Transport` to the API server :func:`load_endpoint` names."""
    return Transport(load_endpoint(kubeconfig, context=context))


def load_endpoint(kubeconfig: str | None = None, *, context: str | None = None) -> Endpoint:
    """Where the API server is and how to reach it, from the first source of the one rule
    (:mod:`~dradriver.plugin.cluster.kubeconfig`: ``kubeconfig``, ``$KUBECONFIG``, in a pod the service account,
    ``~/.kube/config``). A kubeconfig is checked, then read by the ``kubernetes`` client's loader (``context``
    chooses its context, and passes over the service account); the service account is read by
    :func:`~dradriver.plugin.cluster.transport.in_cluster`, without the client.

    Raises :class:`ConfigError` (one line: the source, the file, what is wrong, the fix) when none works."""
    source = require_source(kubeconfig, context=context)
    chosen = checked_context(source, context)
    if chosen is None:  # the in-cluster service account
        try:
            return in_cluster()
        except OSError as exc:
            raise ConfigError(f"cannot load {source}: {exc}") from exc
    return from_client_configuration(_kubeconfig_configuration(source, chosen.name), proxy_url=chosen.proxy_url)


def load_configuration(kubeconfig: str | None = None, *, context: str | None = None) -> Any:
    """The client's ``Configuration`` from the same source as :func:`load_endpoint` (the client's own
    in-cluster loader in a pod), for the client's own requests (tests compare them with ours)."""
    source = require_source(kubeconfig, context=context)
    chosen = checked_context(source, context)
    if chosen is not None:
        return _kubeconfig_configuration(source, chosen.name)
    configuration = client_package().Configuration()
    config_exception = importlib.import_module("kubernetes.config.config_exception").ConfigException
    try:
        in_cluster_config = importlib.import_module("kubernetes.config.incluster_config")
        in_cluster_config.InClusterConfigLoader(  # the files the transport reads (tests point both elsewhere)
            token_filename=transport.SERVICE_ACCOUNT_TOKEN, cert_filename=transport.SERVICE_ACCOUNT_CA
        ).load_and_set(configuration)
    except (config_exception, OSError, ValueError) as exc:
        raise ConfigError(f"cannot load Kubernetes client configuration from {source}: {exc}") from exc
    return configuration


def _kubeconfig_configuration(source: ClientSource, name: str) -> Any:
    """The client's ``Configuration`` from the kubeconfig files of ``source``, merged and read by the client's
    loader with context ``name``, the one :func:`~dradriver.plugin.cluster.kubeconfig.checked_context` chose
    (client-go's: the first file's ``current-context``, where the client would take the last)."""
    configuration = client_package().Configuration()
    config_exception = importlib.import_module("kubernetes.config.config_exception").ConfigException
    try:
        _load_kube_config(
            config_file=os.pathsep.join(str(f) for f in source.files),  # the client merges them itself
            context=name,
            client_configuration=configuration,
            persist_config=False,
        )
    except (config_exception, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # What checked_context does not look at: certificate files, exec plugins, auth providers, value types.
        problem = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise unusable(
            source, f"the Kubernetes client cannot use it: {problem}", fix=f"fix what it names, or {source.fix}"
        ) from exc
    return configuration


def _status_message(body: bytes) -> tuple[str, str, bool]:
    """The ``message`` and ``reason`` of a metav1.Status body (or the raw text when it is not one), and whether
    it names an object (``details.name``)."""
    text = body.decode("utf-8", "replace")
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip()[:500], "", False
    if isinstance(status, dict):
        details = status.get("details")
        named = isinstance(details, dict) and bool(details.get("name"))
        return str(status.get("message", text))[:2000], str(status.get("reason", "")), named
    return text[:500], "", False


def error_for_status(status: int, body: bytes, what: str, verb: str) -> ClusterError:
    """The :class:`ClusterError` subclass for an HTTP error ``status`` answering ``verb`` on ``what``.

    A 404 is "the object is gone" (:class:`NotFoundError`) only when the answer names the object, as
    kube-apiserver's does: a 404 for a path it does not serve (a DRA API version turned off since discovery, a
    skewed API server) must never read as "every claim was deleted", which would unprepare running pods."""
    message, reason, named = _status_message(body)
    text = f"{verb} {what}: HTTP {status}: {message}"
    if status == 404 and not named:
        return ClusterError(
            f"{text} (the API server does not serve this path: is its DRA API version still turned on?)",
            status=status,
            reason=reason,
        )
    kinds: dict[int, type[ClusterError]] = {
        401: ForbiddenError,
        403: ForbiddenError,
        404: NotFoundError,
        409: ConflictError,
        410: WatchExpiredError,
        422: InvalidObjectError,
    }
    if status in kinds:
        return kinds[status](text, status=status, reason=reason)
    if status == 429 or status >= 500:
        return ApiUnavailableError(text, status=status, reason=reason)
    return ClusterError(text, status=status, reason=reason)


class _KubeWatchStream:
    """Watch events read line by line from a streaming response; ``close()`` interrupts a blocked read."""

    def __init__(
        self, response: Response, what: str, convert: Callable[[JsonObject], JsonObject] | None = None
    ) -> None:
        self._response = response
        self._what = what
        self._convert = convert
        self._closed = threading.Event()
        self._lines = self._iter_lines()

    def _iter_lines(self) -> Iterator[bytes]:
        buffer = b""
        while not self._closed.is_set():
            try:
                chunk = self._response.read1(65536)
            except (OSError, ValueError, AttributeError):
                # A dropped connection or our own close(): the watch is over either way.
                return
            if not chunk:
                if buffer.strip():
                    yield buffer
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield line

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        for line in self._lines:
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("watch sent a line that is not JSON what=%s line=%.200r", self._what, line)
                continue
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                self.close()
                raise error_for_status(int(obj.get("code", 500)), json.dumps(obj).encode(), self._what, "watch")
            if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                return WatchEvent(type=kind, object=self._convert(obj) if self._convert and kind != "BOOKMARK" else obj)
            log.warning("watch sent an unknown event type what=%s type=%s", self._what, kind)
        self.close()
        raise StopIteration

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        # shutdown() (SHUT_RD) unblocks a read in progress in another thread; close() then closes the
        # connection, so the server sees the watch end (a watch's connection never goes back to the pool).
        # OSError/ValueError: the socket was closed already (the server ended the watch).
        with contextlib.suppress(AttributeError, OSError, RuntimeError, ValueError):
            self._response.shutdown()
        with contextlib.suppress(AttributeError, OSError, RuntimeError, ValueError):
            self._response.close()


#: Watch events read from a streaming answer, for the other raw-JSON client (``computedomain/kube.py``).
KubeWatchStream = _KubeWatchStream


class KubeCluster:
    """The :class:`~dradriver.plugin.cluster.Cluster` port over a :class:`Transport`."""

    def __init__(
        self,
        transport: Transport,
        *,
        request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT,
        resource_version: str | None = None,
        rate_limit: TokenBucket | None = None,
    ) -> None:
        """``resource_version``: the resource.k8s.io version to speak; unset, API discovery picks the newest the
        server serves (:mod:`~dradriver.plugin.cluster.resource_versions`) at the first call that needs it.
        ``rate_limit`` paces every request (watches included), as client-go's QPS and burst do."""
        self._api = transport
        self._timeout = request_timeout
        self._resource_version = resource_version
        self._rate_limit = rate_limit

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None = None, *, context: str | None = None, qps: float = 0.0, burst: int = 1
    ) -> KubeCluster:
        """A cluster adapter configured by :func:`load_transport`; ``qps`` above 0 limits its requests."""
        limit = TokenBucket(qps, burst) if qps > 0 else None
        return cls(load_transport(kubeconfig, context=context), rate_limit=limit)

    def close(self) -> None:
        """Release the connections."""
        self._api.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        what: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: JsonObject | None = None,
        stream: bool = False,
        timeout: Timeout | None = None,
        content_type: str | None = None,
    ) -> Any:
        if self._rate_limit is not None:
            self._rate_limit.wait()
        headers = {**_JSON_HEADERS, **({"Content-Type": content_type} if content_type else {})}
        try:
            response = self._api.request(
                method,
                path,
                query=query,
                headers=headers,
                body=None if body is None else json.dumps(body).encode(),
                timeout=timeout or self._timeout,
            )
        except OSError as exc:  # the transport's: unreachable, TLS, proxy, timeout, no HTTP
            raise ApiUnavailableError(f"{method} {what}: API server unreachable: {exc}") from exc
        if not 200 <= response.status <= 299 or not stream:
            try:
                data = response.read()
            except OSError as exc:
                raise ApiUnavailableError(f"{method} {what}: reading the answer failed: {exc}") from exc
            if not 200 <= response.status <= 299:
                raise self._failed(response.status, data or b"", what, method)
            try:
                return json.loads(data) if data else {}
            except ValueError as exc:
                raise ApiUnavailableError(f"{method} {what}: answer is not JSON: {data[:200]!r}") from exc
        return response

    def _failed(self, status: int, body: bytes, what: str, method: str) -> ClusterError:
        error = error_for_status(status, body, what, method)
        if status == 404 and not isinstance(error, NotFoundError):
            self._resource_version = None  # a version no longer served: discovery asks again at the next call
        return error

    def resource_version(self) -> str:
        """The resource.k8s.io version this adapter speaks: the newest of v1, v1beta2, v1beta1 the server lists."""
        if self._resource_version is None:
            try:
                group = self._send("GET", _RESOURCE_GROUP, "the resource.k8s.io API group")
            except ClusterError as err:
                if err.status != 404:
                    raise
                # The group is not served at all: 1.32/1.33 as they start by default (DRA is beta and off there).
                group = {}
            found = newest_served(group)
            if found is None:
                listed = ", ".join(str(v.get("version")) for v in group.get("versions") or [])
                serves = f"serves resource.k8s.io {listed}" if listed else "does not serve resource.k8s.io at all"
                raise ClusterError(
                    f"the API server {serves}, none of {', '.join(VERSIONS)}: dynamic resource "
                    "allocation needs Kubernetes 1.32 or newer (with the DynamicResourceAllocation feature gate and "
                    "the resource.k8s.io API enabled before 1.34: kube-apiserver --runtime-config="
                    "resource.k8s.io/v1beta1=true, on 1.33 also resource.k8s.io/v1beta2=true)"
                )
            self._resource_version = found
        return self._resource_version

    def _slices(self) -> str:
        return f"{_RESOURCE_GROUP}/{self.resource_version()}/resourceslices"

    def _to_server(self, obj: JsonObject) -> JsonObject:
        return slice_to(self.resource_version(), obj)

    def _from_server(self, obj: JsonObject) -> JsonObject:
        return slice_from(self.resource_version(), obj)

    # -- the port ----------------------------------------------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        path = f"{_RESOURCE_GROUP}/{self.resource_version()}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        result: JsonObject = self._send("GET", path, describe("ResourceClaim", name, namespace))
        return result

    def update_resource_claim_status(self, claim: JsonObject) -> JsonObject:
        meta = claim.get("metadata", {})
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        path = (
            f"{_RESOURCE_GROUP}/{self.resource_version()}/namespaces/{quote(namespace)}/resourceclaims/"
            f"{quote(name)}/status"
        )
        # A merge patch of status.devices, not a PUT of the whole status: a PUT sends status.allocation back, and
        # the API server compares its opaque config parameters (RawExtension) byte for byte, so JSON re-encoded
        # here (other spacing, key order or escapes) reads as a change: 422 "status.allocation: field cannot be
        # modified once set" for every claim with a config. The resourceVersion keeps it a conditional update.
        patch: JsonObject = {"status": {"devices": claim.get("status", {}).get("devices") or None}}
        if meta.get("resourceVersion"):
            patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        what = describe("ResourceClaim", name, namespace) + " status"
        result: JsonObject = self._send("PATCH", path, what, body=patch, content_type=_MERGE_PATCH)
        return result

    def get_node(self, name: str) -> JsonObject:
        result: JsonObject = self._send("GET", f"/api/v1/nodes/{quote(name)}", describe("Node", name))
        return result

    def patch_node(self, name: str, patch: JsonObject) -> JsonObject:
        path, what = f"/api/v1/nodes/{quote(name)}", describe("Node", name)
        result: JsonObject = self._send("PATCH", path, what, body=patch, content_type=_MERGE_PATCH)
        return result

    def list_nodes(self) -> list[JsonObject]:
        items: list[JsonObject] = []
        query = [("limit", "500")]
        while True:
            result = self._send("GET", "/api/v1/nodes", "Nodes", query=query)
            items.extend(result.get("items") or [])
            token = (result.get("metadata") or {}).get("continue")
            if not token:
                return items
            query = [("limit", "500"), ("continue", str(token))]

    def server_version(self) -> JsonObject:
        result: JsonObject = self._send("GET", "/version", "the API server version")
        return result

    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[JsonObject], str]:
        selector = f"spec.driver={driver},spec.nodeName={node_name}"
        items: list[JsonObject] = []
        query = [("fieldSelector", selector), ("limit", "500")]
        while True:
            result = self._send("GET", self._slices(), f"ResourceSlices of {driver} on {node_name}", query=query)
            items.extend(self._from_server(item) for item in result.get("items") or [])
            metadata = result.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))
            query = [("fieldSelector", selector), ("limit", "500"), ("continue", str(token))]

    def create_resource_slice(self, obj: JsonObject) -> JsonObject:
        meta = obj.get("metadata", {})
        what = describe("ResourceSlice", str(meta.get("name") or meta.get("generateName", "") + "*"))
        result: JsonObject = self._send("POST", self._slices(), what, body=self._to_server(obj))
        return self._from_server(result)

    def update_resource_slice(self, obj: JsonObject) -> JsonObject:
        name = str(obj.get("metadata", {}).get("name", ""))
        path = f"{self._slices()}/{quote(name)}"
        result: JsonObject = self._send("PUT", path, describe("ResourceSlice", name), body=self._to_server(obj))
        return self._from_server(result)

    def delete_resource_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        self._send("DELETE", f"{self._slices()}/{quote(name)}", describe("ResourceSlice", name), body=body)

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_seconds: int
    ) -> _KubeWatchStream:
        what = f"ResourceSlices of {driver} on {node_name}"
        query = [
            ("fieldSelector", f"spec.driver={driver},spec.nodeName={node_name}"),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # The read timeout outlasts the server's own watch timeout, so a silently dead connection ends too.
        response = self._send(
            "GET", self._slices(), what, query=query, stream=True, timeout=(self._timeout[0], timeout_seconds + 30.0)
        )
        return _KubeWatchStream(response, what, self._from_server)
