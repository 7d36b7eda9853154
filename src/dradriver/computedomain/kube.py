"""Raw JSON access to any Kubernetes resource, for the ComputeDomain controller, node driver and daemon.

The same client and error mapping as the plugin layer's cluster port (``plugin/cluster/kube.py``), with what
controllers need beside it: any resource path, merge and server-side-apply patches, label selectors. Bodies
stay JSON (never the client's models, which drop fields they do not know). ``writes`` counts mutating requests,
so tests and metrics can show that nothing storms the API server.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from dradriver.plugin.cluster.kube import DEFAULT_REQUEST_TIMEOUT, KubeWatchStream, error_for_status, load_transport
from dradriver.plugin.cluster.port import (
    ApiUnavailableError,
    ConflictError,
    InvalidObjectError,
    JsonObject,
    NotFoundError,
    WatchStream,
)
from dradriver.plugin.cluster.transport import Transport

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the API server takes a JSON body under this type
# One page of a list: its items, the list's resourceVersion, the next page's continue token (empty: the last).
Page = tuple[list[JsonObject], str, str]


def path_of(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """The REST path of a collection or (with ``name``) an object."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{quote(namespace)}" if namespace else ""
    return f"{base}{scope}/{plural}" + (f"/{quote(name)}" if name else "")


def resource_of(path: str) -> str:
    """The resource (plural, with a subresource) a REST path names: ``pods``, ``computedomains/status``."""
    parts = [p for p in path.split("?", maxsplit=1)[0].split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    return parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "") if parts else path


class Rest:
    """Requests to the API server with JSON bodies; errors are the cluster port's ``ClusterError`` subclasses."""

    def __init__(self, transport: Transport, *, timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        self._api = transport
        self._timeout = timeout
        self._count_lock = threading.Lock()
        self.writes: Counter[str] = Counter()  # "VERB plural" -> requests sent
        self.reads: Counter[str] = Counter()  # "GET plural", "LIST plural", "WATCH plural" -> requests sent

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> Rest:
        return cls(load_transport(kubeconfig))

    def close(self) -> None:
        self._api.close()

    def writes_so_far(self) -> dict[str, int]:
        """A copy of :attr:`writes`, taken while no request adds to it."""
        with self._count_lock:
            return dict(self.writes)

    def reads_so_far(self) -> dict[str, int]:
        """A copy of :attr:`reads` (``GET``, ``LIST`` and ``WATCH`` by resource)."""
        with self._count_lock:
            return dict(self.reads)

    def _count_read(self, verb: str, path: str) -> None:
        with self._count_lock:
            self.reads[f"{verb} {resource_of(path)}"] += 1

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        read: str = "GET",
        timeout: tuple[float, float] | None = None,
    ) -> JsonObject:
        """One request; the answer's JSON (``{}`` when empty). ``read``: how a GET is counted (``LIST``);
        ``timeout``: (connect, read) seconds, the client's own when None."""
        what = path
        if method != "GET":
            with self._count_lock:
                self.writes[f"{method} {resource_of(path)}"] += 1
        else:
            self._count_read(read, path)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # Compact, as Go clients write: the API server keeps an opaque config's parameters as the bytes it was sent
        # and refuses a write back of a ResourceClaimTemplate whose bytes differ (its spec is immutable), so a PUT of
        # a template NVIDIA's controller made must send its parameters as compact as they came.
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            response = self._api.request(
                method, path, query=query, headers=headers, body=payload, timeout=timeout or self._timeout
            )
            data = response.read()
        except OSError as exc:  # the transport's: unreachable, TLS, proxy, timeout, no HTTP
            raise ApiUnavailableError(f"{method} {what}: API server unreachable: {exc}") from exc
        if not 200 <= response.status <= 299:
            raise error_for_status(response.status, data or b"", what, method)
        try:
            result: JsonObject = json.loads(data) if data else {}
        except ValueError as exc:
            raise ApiUnavailableError(f"{method} {what}: answer is not JSON: {data[:200]!r}") from exc
        return result

    # -- conveniences ----------------------------------------------------------------------------------

    def get(self, path: str, *, timeout: tuple[float, float] | None = None) -> JsonObject:
        return self.request("GET", path, timeout=timeout)

    def find(self, path: str) -> JsonObject | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(path)
        except NotFoundError:
            return None

    def list(self, path: str, *, labels: str = "", fields: str = "") -> list[JsonObject]:
        query = [("labelSelector", labels)] if labels else []
        query += [("fieldSelector", fields)] if fields else []
        items: list[JsonObject] = self.request("GET", path, query=query, read="LIST").get("items") or []
        return items

    def list_page(self, path: str, *, labels: str = "", limit: int = 500, continue_token: str = "") -> Page:
        """One page of a list: its items, the list's resourceVersion and the next page's token (empty: none)."""
        query = [("labelSelector", labels)] if labels else []
        query += [("limit", str(limit))] + ([("continue", continue_token)] if continue_token else [])
        answer = self.request("GET", path, query=query, read="LIST")
        meta = answer.get("metadata") or {}
        return answer.get("items") or [], str(meta.get("resourceVersion", "")), str(meta.get("continue") or "")

    def watch(self, path: str, *, labels: str = "", resource_version: str, timeout_seconds: int) -> WatchStream:
        """Changes of the collection after ``resource_version``, bookmarks on; the server ends it after about
        ``timeout_seconds`` (a 410 Gone answer raises WatchExpiredError)."""
        query = [("labelSelector", labels)] if labels else []
        query += [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        self._count_read("WATCH", path)
        try:
            # The read timeout outlasts the server's own, so a silently dead connection ends the watch too.
            response = self._api.request(
                "GET",
                path,
                query=query,
                headers={"Accept": "application/json"},
                timeout=(self._timeout[0], timeout_seconds + 30.0),
            )
        except OSError as exc:
            raise ApiUnavailableError(f"watch {path}: API server unreachable: {exc}") from exc
        if not 200 <= response.status <= 299:
            try:
                data = response.read()
            except OSError:
                data = b""
            raise error_for_status(response.status, data, path, "watch")
        return KubeWatchStream(response, path)

    def create(self, path: str, body: JsonObject, *, timeout: tuple[float, float] | None = None) -> JsonObject:
        return self.request("POST", path, body=body, timeout=timeout)

    def update(self, path: str, body: JsonObject, *, timeout: tuple[float, float] | None = None) -> JsonObject:
        return self.request("PUT", path, body=body, timeout=timeout)

    def merge_patch(self, path: str, patch: JsonObject) -> JsonObject:
        return self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    def json_patch(self, path: str, operations: Sequence[JsonObject]) -> JsonObject:
        """A JSON patch. Guarded by a ``test`` of the resourceVersion, its refusal is a :class:`ConflictError`:
        the API server answers a failed test 422, not 409, and an object changed since it was read is a conflict
        (its caller tries again, counting no error)."""
        try:
            return self.request("PATCH", path, body=list(operations), content_type=JSON_PATCH)
        except InvalidObjectError as err:
            if any(op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion" for op in operations):
                raise ConflictError(str(err), status=err.status, reason=err.reason) from err
            raise

    def apply(self, path: str, body: JsonObject, *, manager: str, force: bool = True) -> JsonObject:
        """Server-side apply of ``body`` (the fields ``manager`` owns, and only those) to the object at ``path``."""
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        return self.request("PATCH", path, query=query, body=body, content_type=APPLY_PATCH)

    def delete(self, path: str, *, propagation: str = "Background") -> bool:
        """Delete the object; False when it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        try:
            self.request("DELETE", path, body=body)
        except NotFoundError:
            return False
        return True


class ListsAndWatches(Protocol):
    """What :class:`Collection` needs of a client: :class:`Rest`, or the unit tests' stand-in."""

    def list_page(self, path: str, *, labels: str = "", limit: int = 500, continue_token: str = "") -> Page: ...

    def watch(self, path: str, *, labels: str = "", resource_version: str, timeout_seconds: int) -> WatchStream: ...


@dataclass(frozen=True)
class Collection:
    """One collection (a path and a label selector) as an informer lists and watches it
    (``plugin.cluster.informer.ListWatch``)."""

    client: ListsAndWatches
    path: str
    labels: str = ""

    def list_page(self, *, limit: int, continue_token: str) -> Page:
        return self.client.list_page(self.path, labels=self.labels, limit=limit, continue_token=continue_token)

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self.client.watch(
            self.path, labels=self.labels, resource_version=resource_version, timeout_seconds=timeout_seconds
        )
