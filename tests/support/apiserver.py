"""A stand-in for the Kubernetes API server, for tests that drive the real ``kubernetes`` client.

A threaded HTTP server on 127.0.0.1 (random port) that serves the few resources the plugin layer and
``explain --pod`` use, with the behaviour they depend on: monotonic resourceVersions, generated names and uids,
optimistic concurrency (409 on a stale resourceVersion), delete preconditions, field and label selectors,
paged lists (``limit``/``continue``), lists across namespaces, streaming
watches with history (resume from a resourceVersion; 410 once compacted), and validation of every written
object with ``kubernetes-validate`` (strict, 1.37.0, the upstream schema) plus, for ResourceSlices, the server's
rules that the schema cannot express (``slice_rules``, written apart from the driver's own validator so that it
can catch the validator's mistakes), answered with 422 and a Status body as a real server does.

Tests reach into it directly to act as "someone else" (:meth:`FakeApiServer.create`, ``replace``,
``delete``), to inject faults (:meth:`fail_next`, :meth:`delay_next`, :meth:`drop_watches`), to read the
request log (:meth:`mark`, :meth:`writes_since`) and to wait for a state (:meth:`wait_until`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import queue
import re
import secrets
import socket
import ssl
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import yaml

from dradriver.plugin.cluster.kube import KubeCluster, load_transport
from dradriver.plugin.kubeletplugin.kubelet_client import Claim
from support.slice_rules import slice_errors

TOKEN = "stand-in-token"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_HISTORY_LIMIT = 10_000


@dataclass(frozen=True)
class Resource:
    """One served resource type."""

    plural: str
    group: str
    version: str
    kind: str
    namespaced: bool
    has_status: bool = False
    field_selectors: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = {
    r.plural: r
    for r in (
        Resource(
            "resourceslices",
            "resource.k8s.io",
            "v1",
            "ResourceSlice",
            False,
            field_selectors=("spec.driver", "spec.nodeName"),
        ),
        Resource("resourceclaims", "resource.k8s.io", "v1", "ResourceClaim", True, has_status=True),
        Resource("resourceclaimtemplates", "resource.k8s.io", "v1", "ResourceClaimTemplate", True),
        Resource("deviceclasses", "resource.k8s.io", "v1", "DeviceClass", False),
        Resource("nodes", "", "v1", "Node", False, has_status=True),
        Resource("pods", "", "v1", "Pod", True, has_status=True, field_selectors=("spec.nodeName",)),
    )
}


class ApiError(Exception):
    """An error answered as a metav1.Status body."""

    def __init__(self, code: int, reason: str, message: str, *, details: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            # As kube-apiserver: an object that is not there is named (name, group, kind); a path it does not
            # serve is not.
            **({"details": self.details} if self.details else {}),
            "code": self.code,
        }


def not_found(plural: str, group: str, name: str) -> ApiError:
    """kube-apiserver's answer for a named object that does not exist."""
    return ApiError(
        404,
        "NotFound",
        f'{plural}.{group or "core"} "{name}" not found',
        details={"name": name, "group": group, "kind": plural},
    )


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    status: int
    authorized: bool
    watch: bool = False

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


@dataclass
class _Fault:
    method: str
    pattern: re.Pattern[str]
    remaining: int
    status: int = 0
    delay: float = 0.0
    message: str = "injected fault"
    action: Callable[[], None] | None = None


@dataclass
class _Watch:
    resource: Resource
    namespace: str | None
    field_selector: list[tuple[str, str, str]]
    label_selector: list[tuple[str, str, tuple[str, ...]]]
    events: queue.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=queue.Queue)


def claim_device_status_problems(claim: dict[str, Any]) -> list[str]:
    """The API server's rules for ``status.devices`` (resource.k8s.io validation of AllocatedDeviceStatus): each
    entry names an allocated device (driver, pool, device, shareID), once; at most 8 conditions; ``data`` a JSON
    object of at most 10 KiB."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    allocated = {(r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")) for r in results}
    problems: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for index, entry in enumerate(status.get("devices") or []):
        where = f"status.devices[{index}]"
        key = (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))
        if key not in allocated:
            problems.append(f"{where}: Invalid value: {key}: must be an allocated device in the claim")
        if key in seen:
            problems.append(f"{where}: Duplicate value: {key}")
        seen.add(key)
        if len(entry.get("conditions") or []) > 8:
            problems.append(f"{where}.conditions: Too many: must have at most 8 items")
        if "data" in entry:
            data = entry["data"]
            if not isinstance(data, dict):
                problems.append(f"{where}.data: Invalid value: must be a JSON object")
            elif len(json.dumps(data, separators=(",", ":"))) > 10 * 1024:
                problems.append(f"{where}.data: Too long: must have at most 10240 bytes")
    return problems


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lookup(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_field_selector(text: str, resource: Resource) -> list[tuple[str, str, str]]:
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)", term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
        key, op, value = match.groups()
        if key not in ("metadata.name", "metadata.namespace", *resource.field_selectors):
            raise ApiError(400, "BadRequest", f'field label not supported: "{key}" for {resource.plural}')
        terms.append((key, "!=" if op == "!=" else "=", value))
    return terms


def _split_outside_parens(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    terms: list[tuple[str, str, tuple[str, ...]]] = []
    for term in _split_outside_parens(text):
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            values = tuple(v.strip() for v in match.group(3).split(","))
            terms.append((match.group(1), match.group(2), values))
        elif match := re.fullmatch(r"([^=!\s]+)\s*(==|!=|=)\s*(\S*)", term):
            terms.append((match.group(1), "notin" if match.group(2) == "!=" else "in", (match.group(3),)))
        elif term.startswith("!"):
            terms.append((term[1:], "absent", ()))
        else:
            terms.append((term, "exists", ()))
    return terms


def _matches(
    obj: dict[str, Any],
    namespace: str | None,
    fields: list[tuple[str, str, str]],
    labels: list[tuple[str, str, tuple[str, ...]]],
) -> bool:
    meta = obj.get("metadata", {})
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    for key, op, value in fields:
        if (_lookup(obj, key) == value) != (op == "="):
            return False
    present = meta.get("labels") or {}
    for key, op, values in labels:
        if op == "in" and present.get(key) not in values:
            return False
        if op == "notin" and key in present and present[key] in values:
            return False
        if op == "exists" and key not in present:
            return False
        if op == "absent" and key in present:
            return False
    return True


class _QuietServer(ThreadingHTTPServer):
    """A client killed mid-request (the soak SIGKILLs the driver) resets its connection: expected, not a
    traceback on stderr. Any other error in a handler is still printed."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class FakeApiServer:
    """The stand-in server. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        *,
        validate: bool = True,
        drop_device_taints: bool = False,
        drop_counters: bool = False,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: a serving certificate and its key: HTTPS, as a real API server (and an in-cluster client,
        which only speaks HTTPS) needs."""
        self.validate = validate
        self.tls = tls
        # As 1.33-1.35 with DRAPartitionableDevices off do (a real 1.33 server, tests/cluster/test_older_api_server.py):
        # sharedCounters and devices[].consumesCounters are accepted and silently not stored.
        self.drop_counters = drop_counters
        # As a server with the DRADeviceTaints gate off (before 1.36, or disabled) does: it accepts a slice with
        # devices[].taints and silently stores it without them.
        self.drop_device_taints = drop_device_taints
        # What GET /version answers: set another release to exercise the driver's version detection.
        self.version: dict[str, str] = {"major": "1", "minor": "35", "gitVersion": "v1.35.0", "platform": "linux/amd64"}
        # The versions of resource.k8s.io that GET /apis/resource.k8s.io lists (newest first, as real servers list
        # them); the objects themselves are served in v1 only.
        self.resource_versions: list[str] = ["v1"]
        self._cond = threading.Condition()
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for r in RESOURCES}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._compacted_rv = 0
        self._watches: list[_Watch] = []
        self._faults: list[_Fault] = []
        self._requests: list[RequestRecord] = []
        self._closing = threading.Event()
        self._httpd: _QuietServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            # The handshake happens at the first read, in the connection's own thread, not in the accept loop.
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        # A short poll interval keeps stop() fast; serve_forever checks for shutdown only that often.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.02,), name="apiserver-stand-in", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self.drop_watches()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._httpd.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig that points at this server (bearer token :data:`TOKEN`) and return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": TOKEN}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- store (also used by tests as "someone else") ----------------------------------------------

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, resource: Resource, kind: str, obj: dict[str, Any]) -> None:
        self._history.append((self._rv, resource.plural, kind, copy.deepcopy(obj)))
        if len(self._history) > _HISTORY_LIMIT:
            self._compacted_rv = self._history[0][0]
            del self._history[0]
        for watch in self._watches:
            if watch.resource is resource and _matches(
                obj, watch.namespace, watch.field_selector, watch.label_selector
            ):
                watch.events.put((kind, copy.deepcopy(obj)))
        self._cond.notify_all()

    def _key(self, resource: Resource, obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata", {})
        return (str(meta.get("namespace", "")) if resource.namespaced else "", str(meta.get("name", "")))

    def _validate(self, resource: Resource, obj: dict[str, Any]) -> None:
        if not self.validate:
            return
        # Imported here: a stand-in that does not validate runs without the package (the GPU acceptance kit's
        # venv leaves it out, tests/support/gpu_acceptance).
        import kubernetes_validate

        # Judge by the release this server claims to be (/version): 1.34 has other slice rules than 1.35+.
        minor = int(self.version.get("minor", "35").rstrip("+"))
        try:
            kubernetes_validate.validate(obj, f"1.{min(max(minor, 34), 37)}.0", strict=True)
        except kubernetes_validate.utils.ValidationError as exc:
            path = ".".join(str(p) for p in getattr(exc, "path", []))
            raise ApiError(422, "Invalid", f"{resource.kind} is invalid: {path}: {exc.message}") from exc
        if resource.plural == "resourceslices":
            problems = slice_errors(obj, minor=minor)
            if problems:
                reasons = "; ".join(map(str, problems))
                raise ApiError(422, "Invalid", f"{resource.kind} is invalid: {reasons}")
        if resource.plural == "resourceclaims":
            problems = claim_device_status_problems(obj)
            if problems:
                raise ApiError(422, "Invalid", f"{resource.kind} is invalid: {'; '.join(problems)}")

    def _fill_slice_defaults(self, obj: dict[str, Any]) -> None:
        if self.drop_counters:
            obj.get("spec", {}).pop("sharedCounters", None)
        # The real server sets a taint's timeAdded when the writer leaves it out.
        for device in obj.get("spec", {}).get("devices") or []:
            if self.drop_counters:
                device.pop("consumesCounters", None)
            if self.drop_device_taints:
                device.pop("taints", None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", _now())

    def create(
        self, plural: str, obj: dict[str, Any], *, namespace: str | None = None, keep_status: bool = True
    ) -> dict[str, Any]:
        """Store a new object (validated) and return it as stored."""
        resource = RESOURCES[plural]
        stored = copy.deepcopy(obj)
        stored.setdefault("apiVersion", resource.api_version)
        stored.setdefault("kind", resource.kind)
        meta = stored.setdefault("metadata", {})
        if resource.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        if not keep_status:
            stored.pop("status", None)
        with self._cond:
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, "Invalid", f"{resource.kind}: name or generateName is required")
                meta["name"] = meta["generateName"][:58] + "".join(
                    secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
                )
            for server_field in ("resourceVersion", "uid", "creationTimestamp"):
                meta.pop(server_field, None)
            self._validate(resource, stored)
            key = self._key(resource, stored)
            if key in self._objects[plural]:
                raise ApiError(409, "AlreadyExists", f'{plural}.{resource.group or "core"} "{key[1]}" already exists')
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=self._bump())
            meta.setdefault("generation", 1)
            if plural == "resourceslices":
                self._fill_slice_defaults(stored)
            self._objects[plural][key] = stored
            self._emit(resource, "ADDED", stored)
            return copy.deepcopy(stored)

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        with self._cond:
            obj = self._objects[plural].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored objects of a resource (in one namespace if given)."""
        with self._cond:
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._objects[plural].items())
                if namespace is None or ns == namespace
            ]

    def replace(self, plural: str, obj: dict[str, Any], *, subresource: str = "") -> dict[str, Any]:
        """Update a stored object; a resourceVersion in ``obj`` must be current (else 409)."""
        resource = RESOURCES[plural]
        with self._cond:
            key = self._key(resource, obj)
            current = self._objects[plural].get(key)
            if current is None:
                raise not_found(plural, resource.group, key[1])
            given_rv = obj.get("metadata", {}).get("resourceVersion")
            if given_rv and given_rv != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural}.{resource.group or "core"} "{key[1]}": the '
                    "object has been modified; please apply your changes to the latest version and try again",
                )
            if subresource == "status":
                updated = copy.deepcopy(current)
                updated["status"] = copy.deepcopy(obj.get("status"))
            else:
                updated = copy.deepcopy(obj)
                updated.setdefault("apiVersion", resource.api_version)
                updated.setdefault("kind", resource.kind)
                if resource.has_status:
                    updated.pop("status", None)
                    if "status" in current:
                        updated["status"] = copy.deepcopy(current["status"])
                self._check_immutable(resource, current, updated)
            meta = updated.setdefault("metadata", {})
            for server_field in ("uid", "creationTimestamp", "namespace"):
                if server_field in current["metadata"]:
                    meta[server_field] = current["metadata"][server_field]
            meta.pop("resourceVersion", None)
            self._validate(resource, updated)
            meta["generation"] = current["metadata"].get("generation", 1) + (
                subresource != "status" and updated.get("spec") != current.get("spec")
            )
            meta["resourceVersion"] = self._bump()
            if plural == "resourceslices":
                self._fill_slice_defaults(updated)
            self._objects[plural][key] = updated
            self._emit(resource, "MODIFIED", updated)
            return copy.deepcopy(updated)

    def _check_immutable(self, resource: Resource, current: dict[str, Any], updated: dict[str, Any]) -> None:
        fields = {
            "resourceslices": ("spec.driver", "spec.pool.name", "spec.nodeName"),
            "resourceclaims": ("spec",),
        }.get(resource.plural, ())
        for dotted in fields:
            if _lookup(current, dotted) != _lookup(updated, dotted):
                raise ApiError(422, "Invalid", f"{resource.kind} is invalid: {dotted}: field is immutable")

    def delete(
        self,
        plural: str,
        name: str,
        namespace: str | None = None,
        *,
        preconditions: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Delete a stored object, honouring ``{uid, resourceVersion}`` preconditions (409 if they fail)."""
        resource = RESOURCES[plural]
        with self._cond:
            key = (namespace or "" if resource.namespaced else "", name)
            current = self._objects[plural].get(key)
            if current is None:
                raise not_found(plural, resource.group, name)
            meta = current["metadata"]
            for field_name in ("uid", "resourceVersion"):
                wanted = (preconditions or {}).get(field_name)
                if wanted and wanted != meta.get(field_name):
                    raise ApiError(
                        409,
                        "Conflict",
                        f"Precondition failed: {field_name} in precondition: {wanted}, "
                        f"{field_name} in object meta: {meta.get(field_name)}",
                    )
            del self._objects[plural][key]
            meta["resourceVersion"] = self._bump()
            self._emit(resource, "DELETED", current)
            return copy.deepcopy(current)

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older resourceVersions now answer 410."""
        with self._cond:
            self._compacted_rv = self._rv
            self._history.clear()

    # -- faults ------------------------------------------------------------------------------------

    def fail_next(
        self, method: str, path_pattern: str, status: int, *, count: int = 1, message: str = "injected fault"
    ) -> None:
        """Answer the next ``count`` requests whose method and path (with query) match with ``status``."""
        with self._cond:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), count, status=status, message=message))

    def delay_next(self, method: str, path_pattern: str, seconds: float, *, count: int = 1) -> None:
        """Hold the next ``count`` matching requests for ``seconds`` before handling them."""
        with self._cond:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), count, delay=seconds))

    def before_next(self, method: str, path_pattern: str, action: Callable[[], None], *, count: int = 1) -> None:
        """Run ``action`` (e.g. another client's write) when the next ``count`` matching requests arrive, before
        they are handled: a race between two writers, made deterministic."""
        with self._cond:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), count, action=action))

    def clear_faults(self) -> None:
        """Forget every fault not yet used up (the outage ends)."""
        with self._cond:
            self._faults.clear()

    def drop_watches(self) -> None:
        """Close every open watch connection abruptly."""
        with self._cond:
            for watch in self._watches:
                watch.events.put(None)

    @property
    def active_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def _take_fault(self, method: str, target: str) -> _Fault | None:
        with self._cond:
            for fault in self._faults:
                if fault.method == method and fault.remaining > 0 and fault.pattern.search(target):
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    # -- request log and waiting -------------------------------------------------------------------

    def _record(self, record: RequestRecord) -> None:
        with self._cond:
            self._requests.append(record)
            self._cond.notify_all()

    @property
    def requests(self) -> list[RequestRecord]:
        with self._cond:
            return list(self._requests)

    def mark(self) -> int:
        """A position in the request log, for :meth:`requests_since` and :meth:`writes_since`."""
        with self._cond:
            return len(self._requests)

    def requests_since(self, mark: int) -> list[RequestRecord]:
        with self._cond:
            return self._requests[mark:]

    def writes_since(self, mark: int) -> list[RequestRecord]:
        """Write requests (POST, PUT, PATCH, DELETE) logged after ``mark``, answered or not."""
        return [r for r in self.requests_since(mark) if r.is_write]

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait (no polling) until ``predicate()`` holds; re-checked on every change and request."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    # -- watches -----------------------------------------------------------------------------------

    def _open_watch(self, watch: _Watch, since: str) -> tuple[list[tuple[str, dict[str, Any]]], str] | ApiError:
        """Register a watch; return the events it must replay first and the resourceVersion they bring it to (or
        the error to send). A bookmark sent after the replay carries that version, never a later one: a change made
        meanwhile is queued to the watch after the bookmark, and a bookmark past it would let a client that resumes
        from the bookmark skip it (as the API server, which bookmarks only versions whose events it sent)."""
        with self._cond:
            replay: list[tuple[str, dict[str, Any]]] = []
            if since in ("", "0"):
                replay = [
                    ("ADDED", copy.deepcopy(o))
                    for o in self._objects[watch.resource.plural].values()
                    if _matches(o, watch.namespace, watch.field_selector, watch.label_selector)
                ]
            else:
                rv = int(since)
                if rv < self._compacted_rv:
                    return ApiError(410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})")
                replay = [
                    (kind, copy.deepcopy(o))
                    for at, plural, kind, o in self._history
                    if at > rv
                    and plural == watch.resource.plural
                    and _matches(o, watch.namespace, watch.field_selector, watch.label_selector)
                ]
            self._watches.append(watch)
            self._cond.notify_all()
            return replay, str(self._rv)

    def _close_watch(self, watch: _Watch) -> None:
        with self._cond:
            if watch in self._watches:
                self._watches.remove(watch)
            self._cond.notify_all()

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Without it Nagle's algorithm and delayed ACKs stall every keep-alive reply by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log holds what tests need."""

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _send_json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        self._body_read = True
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "body must be a JSON object")
        return body

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
            if group == "resource.k8s.io" and version not in self.api.resource_versions:
                # A version this server does not serve: its paths name nothing (kube-apiserver: a bare 404).
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        resource = RESOURCES[rest[0]]
        if (resource.group, resource.version) != (group, version):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and (subresource != "status" or not resource.has_status):
            raise ApiError(404, "NotFound", f"subresource {subresource} not found")
        return resource, namespace, name, subresource

    def _handle(self, method: str) -> None:
        api = self.api
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        # The scheme is case-insensitive (RFC 7235); the in-cluster loader sends "bearer".
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        authorized = scheme.lower() == "bearer" and token == TOKEN
        watch = method == "GET" and query.get("watch") in ("true", "1")
        self._body_read = False
        try:
            fault = api._take_fault(method, self.path)
            if fault is not None and fault.delay:
                api._closing.wait(fault.delay)
            if fault is not None and fault.action is not None:
                fault.action()
            if fault is not None and fault.status:
                raise ApiError(
                    fault.status,
                    {409: "Conflict", 429: "TooManyRequests"}.get(fault.status, "InternalError"),
                    fault.message,
                )
            body = self._read_body()
            if method == "GET" and split.path == "/version":
                # The discovery document real servers answer (any client may read it).
                api._record(RequestRecord(method, split.path, query, 200, authorized))
                self._send_json(200, dict(api.version))
                return
            if method == "GET" and split.path.rstrip("/") == "/apis/resource.k8s.io":
                # The API group's discovery document (any client may read it), as real servers answer it.
                if not api.resource_versions:
                    # DRA off (1.32/1.33 by default): the group is not served at all, and the real server says so
                    # in plain text.
                    api._record(RequestRecord(method, split.path, query, 404, authorized))
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", "19")
                    self.end_headers()
                    self.wfile.write(b"404 page not found\n")
                    return
                api._record(RequestRecord(method, split.path, query, 200, authorized))
                versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in api.resource_versions]
                self._send_json(
                    200,
                    {
                        "kind": "APIGroup",
                        "apiVersion": "v1",
                        "name": "resource.k8s.io",
                        "versions": versions,
                        **({"preferredVersion": versions[0]} if versions else {}),
                    },
                )
                return
            route = self._route(split.path)
            if watch:
                api._record(RequestRecord(method, split.path, query, 200, authorized, watch=True))
                self._watch(route[0], route[1], query)
                return
            status, answer = self._dispatch(method, route, query, body)
        except ApiError as exc:
            status, answer = exc.code, exc.status()
            with contextlib.suppress(OSError):
                self._read_rest()
        # Logged before the answer is sent, so a client that has its answer finds the request in the log.
        api._record(RequestRecord(method, split.path, query, status, authorized))
        with contextlib.suppress(OSError):  # the client may have gone away (timed out)
            self._send_json(status, answer)

    def _read_rest(self) -> None:
        # An error raised before the body was read must still drain it, or keep-alive breaks.
        length = int(self.headers.get("Content-Length") or 0)
        if length and not getattr(self, "_body_read", False):
            self.rfile.read(length)
            self._body_read = True

    def _dispatch(
        self,
        method: str,
        route: tuple[Resource, str | None, str | None, str],
        query: dict[str, str],
        body: dict[str, Any] | None,
    ) -> tuple[int, dict[str, Any]]:
        resource, namespace, name, subresource = route
        api = self.api
        if method == "GET" and name is None:
            fields = _parse_field_selector(query.get("fieldSelector", ""), resource)
            labels = _parse_label_selector(query.get("labelSelector", ""))
            items = [o for o in api.list(resource.plural, namespace) if _matches(o, namespace, fields, labels)]
            metadata = {"resourceVersion": api.resource_version}
            # Paging: our continue token is the offset of the next item (the real one is opaque).
            limit = int(query.get("limit") or 0)
            if limit > 0:
                start = int(query.get("continue") or 0)
                if start + limit < len(items):
                    metadata["continue"] = str(start + limit)
                items = items[start : start + limit]
            return 200, {
                "apiVersion": resource.api_version,
                "kind": f"{resource.kind}List",
                "metadata": metadata,
                "items": items,
            }
        if name is None and method != "POST":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")
        if method == "GET":
            obj = api.get(resource.plural, str(name), namespace)
            if obj is None:
                raise not_found(resource.plural, resource.group, str(name))
            return 200, obj
        if method == "POST":
            if name is not None or body is None:
                raise ApiError(400, "BadRequest", "POST needs a body on the collection path")
            self._check_body(resource, namespace, body)
            return 201, api.create(resource.plural, body, namespace=namespace, keep_status=False)
        if method == "PUT":
            if body is None:
                raise ApiError(400, "BadRequest", "PUT needs a body")
            self._check_body(resource, namespace, body)
            if body.get("metadata", {}).get("name") != name:
                raise ApiError(400, "BadRequest", "the name in the body does not match the name in the URL")
            if resource.namespaced:
                body["metadata"]["namespace"] = namespace
            return 200, api.replace(resource.plural, body, subresource=subresource)
        if method == "PATCH":
            return 200, self._patch(resource, namespace, str(name), subresource, body)
        if method == "DELETE":
            preconditions = (body or {}).get("preconditions")
            return 200, api.delete(resource.plural, str(name), namespace, preconditions=preconditions)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported by the stand-in")

    def _patch(
        self, resource: Resource, namespace: str | None, name: str, subresource: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), as the real API server applies it; a resourceVersion in the patch is a
        precondition (409 when stale). Other patch types are not served."""
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        if kind != "application/merge-patch+json":
            raise ApiError(415, "UnsupportedMediaType", f"the stand-in serves merge patches only, not {kind!r}")
        if body is None:
            raise ApiError(400, "BadRequest", "PATCH needs a body")
        current = self.api.get(resource.plural, name, namespace)
        if current is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        return self.api.replace(resource.plural, merge_patch(current, body), subresource=subresource)

    @staticmethod
    def _check_body(resource: Resource, namespace: str | None, body: dict[str, Any]) -> None:
        if (
            body.get("apiVersion", resource.api_version) != resource.api_version
            or body.get("kind", resource.kind) != resource.kind
        ):
            raise ApiError(
                400,
                "BadRequest",
                f"the body is a {body.get('apiVersion')}/{body.get('kind')}, the URL wants "
                f"{resource.api_version}/{resource.kind}",
            )
        body_ns = body.get("metadata", {}).get("namespace")
        if resource.namespaced and body_ns and body_ns != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the body does not match the URL")

    def _watch(self, resource: Resource, namespace: str | None, query: dict[str, str]) -> None:
        api = self.api
        watch = _Watch(
            resource,
            namespace,
            _parse_field_selector(query.get("fieldSelector", ""), resource),
            _parse_label_selector(query.get("labelSelector", "")),
        )
        opened = api._open_watch(watch, query.get("resourceVersion", ""))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # A watch connection is never reused, which lets a reader thread notice the client hanging up.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        threading.Thread(target=self._await_hangup, args=(watch,), daemon=True).start()
        deadline_s = float(query.get("timeoutSeconds") or 1800)
        clean_end = True
        try:
            if isinstance(opened, ApiError):
                self._chunk({"type": "ERROR", "object": opened.status()})
                return
            replay, replayed_to = opened
            for kind, obj in replay:
                self._chunk({"type": kind, "object": obj})
            if query.get("allowWatchBookmarks") in ("true", "1"):
                self._chunk(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "apiVersion": resource.api_version,
                            "kind": resource.kind,
                            "metadata": {"resourceVersion": replayed_to},
                        },
                    }
                )
            deadline = threading.Event()
            timer = threading.Timer(deadline_s, lambda: (deadline.set(), watch.events.put(None)))
            timer.daemon = True
            timer.start()
            try:
                while True:
                    item = watch.events.get()
                    if item is None:
                        clean_end = deadline.is_set()
                        break
                    self._chunk({"type": item[0], "object": item[1]})
            finally:
                timer.cancel()
        except OSError:
            clean_end = False
        finally:
            api._close_watch(watch)
            if clean_end:
                with contextlib.suppress(OSError):
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
            else:
                # A dropped watch: the connection just goes away, mid-stream.
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

    def _await_hangup(self, watch: _Watch) -> None:
        with contextlib.suppress(OSError):
            while self.connection.recv(4096):
                pass
        watch.events.put(None)

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class ApiEnv(NamedTuple):
    """A running stand-in and a :class:`KubeCluster` that reaches it through the real client."""

    server: FakeApiServer
    cluster: KubeCluster


@contextlib.contextmanager
def api_env(tmp_path: Path, *, request_timeout: tuple[float, float] = (2.0, 5.0)) -> Iterator[ApiEnv]:
    """Start a stand-in and build a :class:`KubeCluster` for it from a kubeconfig file, the way the CLI does.

    The transport's own retry (of a kept-alive connection the server closed) is off, so that injected faults
    reach our code deterministically."""
    with FakeApiServer() as server:
        transport = load_transport(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        transport.retries = 0
        cluster = KubeCluster(transport, request_timeout=request_timeout)
        try:
            yield ApiEnv(server, cluster)
        finally:
            cluster.close()


def allocated_claim(
    api: FakeApiServer,
    name: str,
    devices: list[str],
    *,
    driver: str = "gpu.dradriver.dev",
    node: str = "node-a",
    config: dict[str, Any] | None = None,
    pods: dict[str, str] | None = None,
) -> Claim:
    """A ResourceClaim in ``api`` with ``devices`` of ``node``'s pool allocated, as the scheduler leaves it;
    ``config``: opaque parameters for all of them (in the claim's spec and, as the scheduler copies it, in its
    allocation); ``pods`` (name → UID): whom the scheduler reserved it for (status.reservedFor)."""
    entries = [{"opaque": {"driver": driver, "parameters": config}}] if config is not None else []
    created = api.create(
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpus", "exactly": {"deviceClassName": driver, "count": len(devices)}}],
                    **({"config": entries} if entries else {}),
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpus", "driver": driver, "pool": node, "device": d} for d in devices],
                        **({"config": [{"source": "FromClaim", **e} for e in entries]} if entries else {}),
                    }
                },
                **(
                    {"reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods.items()]}
                    if pods
                    else {}
                ),
            },
        },
        namespace="default",
    )
    return Claim("default", name, created["metadata"]["uid"])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
