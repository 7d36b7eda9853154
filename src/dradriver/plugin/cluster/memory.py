"""An in-memory cluster: the :class:`~dradriver.plugin.cluster.Cluster` port backed by dicts.

For ``dradriver demo`` and unit tests. It behaves like the API server where the plugin layer can tell the
difference: monotonic resourceVersions, generated names and uids, optimistic concurrency on update, delete
preconditions, watch events (with history, so a watch can resume from a resourceVersion), and the
apiserver's ResourceSlice validation rules.
"""

from __future__ import annotations

import copy
import queue
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from dradriver.plugin.cluster.port import (
    ConflictError,
    InvalidObjectError,
    JsonObject,
    NotFoundError,
    WatchEvent,
    WatchEventType,
    WatchExpiredError,
    describe,
)
from dradriver.validation.slices import validate_slice

# The API server truncates generateName to leave room for a 5-character suffix within 63 characters.
_GENERATED_BASE_MAX = 58
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_HISTORY = 1000


def generate_name(prefix: str) -> str:
    """``prefix`` (cut to 58 characters) plus 5 random characters, as the API server's name generator does."""
    return prefix[:_GENERATED_BASE_MAX] + "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))


def now_rfc3339() -> str:
    """The current time as Kubernetes writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _slice_matches(obj: JsonObject, driver: str, node_name: str) -> bool:
    spec = obj.get("spec", {})
    return bool(spec.get("driver") == driver and spec.get("nodeName") == node_name)


def _merge_patch(target: JsonObject, patch: JsonObject) -> None:
    """RFC 7386 in place: null removes a key, an object merges into an object, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class _MemoryWatchStream:
    def __init__(self, events: queue.Queue[WatchEvent | None], unsubscribe: Callable[[], None]) -> None:
        self._events = events
        self._unsubscribe = unsubscribe
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        if self._closed:
            raise StopIteration
        event = self._events.get()
        if event is None:
            self._closed = True
            raise StopIteration
        return event

    def close(self) -> None:
        self._unsubscribe()
        self._events.put(None)


class MemoryCluster:
    """A dict-backed cluster. Thread-safe. ``validate`` applies the ResourceSlice rules on create/update."""

    def __init__(self, *, validate: bool = True) -> None:
        self._lock = threading.Lock()
        self._rv = 0
        self._validate = validate
        self.slices: dict[str, JsonObject] = {}
        self.claims: dict[tuple[str, str], JsonObject] = {}
        self.nodes: dict[str, JsonObject] = {}
        # What /version answers; tests set another release to exercise version detection.
        self.version: JsonObject = {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        self._history: list[tuple[int, WatchEvent]] = []
        self._watchers: list[tuple[str, str, queue.Queue[WatchEvent | None]]] = []

    # -- seeding and inspection (not part of the port) ---------------------------------------------

    def _stamp(self, obj: JsonObject, *, new: bool) -> JsonObject:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        if new:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
        meta["resourceVersion"] = str(self._rv)
        return obj

    def add_node(self, name: str, *, uid: str | None = None) -> JsonObject:
        """Store a Node ``name`` and return it."""
        with self._lock:
            node = self._stamp({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, new=True)
            if uid:
                node["metadata"]["uid"] = uid
            self.nodes[name] = node
            return copy.deepcopy(node)

    def add_resource_claim(self, claim: JsonObject) -> JsonObject:
        """Store a ResourceClaim as given (status included) and return it as stored."""
        with self._lock:
            stored = self._stamp(copy.deepcopy(claim), new=True)
            meta = stored["metadata"]
            self.claims[(meta.get("namespace", "default"), meta["name"])] = stored
            return copy.deepcopy(stored)

    def delete_slice_by_name(self, name: str) -> None:
        """Delete a slice without preconditions, as someone else (the kubelet, a user) would."""
        with self._lock:
            obj = self.slices.pop(name, None)
            if obj is None:
                raise NotFoundError(f"delete {describe('ResourceSlice', name)}: not found", status=404)
            self._stamp(obj, new=False)
            self._notify("DELETED", obj)

    # -- watch plumbing ----------------------------------------------------------------------------

    def _notify(self, kind: WatchEventType, obj: JsonObject) -> None:
        event = WatchEvent(type=kind, object=copy.deepcopy(obj))
        self._history.append((self._rv, event))
        del self._history[:-_HISTORY]
        for driver, node_name, events in self._watchers:
            if _slice_matches(obj, driver, node_name):
                events.put(event)

    # -- the port ----------------------------------------------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        with self._lock:
            claim = self.claims.get((namespace, name))
            if claim is None:
                what = describe("ResourceClaim", name, namespace)
                raise NotFoundError(f"get {what}: not found", status=404)
            return copy.deepcopy(claim)

    def update_resource_claim_status(self, claim: JsonObject) -> JsonObject:
        meta = claim.get("metadata", {})
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        what = describe("ResourceClaim", key[1], key[0])
        with self._lock:
            stored = self.claims.get(key)
            if stored is None:
                raise NotFoundError(f"update {what} status: not found", status=404)
            if meta.get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise ConflictError(f"update {what} status: the object has been modified", status=409)
            # Only status.devices, as the real adapter writes it (the allocation is the scheduler's).
            devices = claim.get("status", {}).get("devices")
            status = stored.setdefault("status", {})
            if devices:
                status["devices"] = copy.deepcopy(devices)
            else:
                status.pop("devices", None)
            self._stamp(stored, new=False)
            return copy.deepcopy(stored)

    def get_node(self, name: str) -> JsonObject:
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                raise NotFoundError(f"get {describe('Node', name)}: not found", status=404)
            return copy.deepcopy(node)

    def patch_node(self, name: str, patch: JsonObject) -> JsonObject:
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                raise NotFoundError(f"patch {describe('Node', name)}: not found", status=404)
            # As the API server: a resourceVersion in the patch is a precondition, not a value to store.
            version = (patch.get("metadata") or {}).get("resourceVersion")
            if version is not None and version != node["metadata"]["resourceVersion"]:
                raise ConflictError(f"patch {describe('Node', name)}: the object has been modified", status=409)
            _merge_patch(node, patch)
            self._stamp(node, new=False)
            return copy.deepcopy(node)

    def list_nodes(self) -> list[JsonObject]:
        with self._lock:
            return [copy.deepcopy(n) for n in self.nodes.values()]

    def server_version(self) -> JsonObject:
        return dict(self.version)

    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[JsonObject], str]:
        with self._lock:
            items = [copy.deepcopy(s) for s in self.slices.values() if _slice_matches(s, driver, node_name)]
            return items, str(self._rv)

    def _check(self, obj: JsonObject, verb: str, what: str) -> None:
        if self._validate:
            problems = validate_slice(obj)
            if problems:
                raise InvalidObjectError(f"{verb} {what}: invalid: " + "; ".join(str(p) for p in problems), status=422)

    def create_resource_slice(self, obj: JsonObject) -> JsonObject:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        with self._lock:
            if not meta.get("name"):
                meta["name"] = generate_name(str(meta.get("generateName", "")))
            what = describe("ResourceSlice", meta["name"])
            self._check(stored, "create", what)
            if meta["name"] in self.slices:
                raise ConflictError(f"create {what}: already exists", status=409, reason="AlreadyExists")
            for key in ("resourceVersion", "uid"):
                meta.pop(key, None)
            self._stamp(stored, new=True)
            self.slices[meta["name"]] = stored
            self._notify("ADDED", stored)
            return copy.deepcopy(stored)

    def update_resource_slice(self, obj: JsonObject) -> JsonObject:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        name = str(meta.get("name", ""))
        what = describe("ResourceSlice", name)
        with self._lock:
            current = self.slices.get(name)
            if current is None:
                raise NotFoundError(f"update {what}: not found", status=404)
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ConflictError(f"update {what}: the object has been modified", status=409)
            self._check(stored, "update", what)
            meta["uid"] = current["metadata"]["uid"]
            meta["creationTimestamp"] = current["metadata"]["creationTimestamp"]
            self._stamp(stored, new=False)
            self.slices[name] = stored
            self._notify("MODIFIED", stored)
            return copy.deepcopy(stored)

    def delete_resource_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        what = describe("ResourceSlice", name)
        with self._lock:
            current = self.slices.get(name)
            if current is None:
                raise NotFoundError(f"delete {what}: not found", status=404)
            meta = current["metadata"]
            if meta["uid"] != uid or meta["resourceVersion"] != resource_version:
                raise ConflictError(f"delete {what}: precondition failed", status=409)
            del self.slices[name]
            self._stamp(current, new=False)
            self._notify("DELETED", current)

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_seconds: int
    ) -> _MemoryWatchStream:
        del timeout_seconds  # a memory watch never times out; close() ends it
        events: queue.Queue[WatchEvent | None] = queue.Queue()
        entry = (driver, node_name, events)
        with self._lock:
            since = int(resource_version or 0)
            if self._history and since < self._history[0][0] - 1 and len(self._history) >= _HISTORY:
                raise WatchExpiredError(f"watch ResourceSlices: resourceVersion {since} is too old", status=410)
            for rv, event in self._history:
                if rv > since and _slice_matches(event.object, driver, node_name):
                    events.put(event)
            self._watchers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._watchers:
                    self._watchers.remove(entry)

        return _MemoryWatchStream(events, unsubscribe)

    def slice_objects(self) -> list[dict[str, Any]]:
        """Copies of all stored slices, for inspection."""
        with self._lock:
            return [copy.deepcopy(s) for s in self.slices.values()]
