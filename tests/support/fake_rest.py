"""An in-memory stand-in of the API server for ComputeDomain unit tests, by the API's rules for what they use:
resourceVersion preconditions on merge patches (409), JSON patch ``test`` (422), server-side apply merging list
entries by their map key. Fault injection (a conflict on the next write) is a field."""

from __future__ import annotations

import copy
import itertools
import queue
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from dradriver.plugin.cluster.port import (
    ConflictError,
    InvalidObjectError,
    NotFoundError,
    WatchEvent,
    WatchExpiredError,
)

MAP_KEYS = {"daemons": "nodeName", "ownerReferences": "uid", "nodes": "name", "conditions": "type"}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _apply(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _apply(target[key], value)
        elif isinstance(value, list) and key in MAP_KEYS and isinstance(target.get(key), list):
            by_key = {item[MAP_KEYS[key]]: item for item in target[key]}
            for item in value:
                by_key.setdefault(item[MAP_KEYS[key]], {}).update(copy.deepcopy(item))
            target[key] = list(by_key.values())
        else:
            target[key] = copy.deepcopy(value)


def _in_collection(collection_path: str, object_path: str) -> bool:
    """Whether the object at ``object_path`` is listed by ``collection_path`` (a namespace's or every one's)."""
    collection, _, _ = object_path.rpartition("/")
    plural = collection_path.rsplit("/", 1)[-1]
    return collection == collection_path or (
        collection.endswith(f"/{plural}") and "/namespaces/" not in collection_path
    )


def _has_labels(obj: dict[str, Any], labels: str) -> bool:
    if not labels:
        return True
    name, _, value = labels.partition("=")
    have = obj["metadata"].get("labels", {})
    return name in have and (not value or have[name] == value)


class _Stream:
    """A watch: events from a queue until closed."""

    def __init__(self, events: queue.Queue[WatchEvent | None], unsubscribe: Any) -> None:
        self._events = events
        self._unsubscribe = unsubscribe
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while not self._closed.is_set():
            try:
                event = self._events.get(timeout=0.02)
            except queue.Empty:
                continue
            if event is None:
                break
            return event
        self.close()
        raise StopIteration

    def close(self) -> None:
        self._closed.set()
        self._unsubscribe()


class FakeRest:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()  # "GET path", "LIST path", "WATCH path"
        self.conflicts = 0  # the next N writes fail with 409
        # The API's finalizer rule, when True: a DELETE of an object with finalizers only marks it (deletionTimestamp),
        # and the write that leaves a marked object without finalizers removes it.
        self.finalizing = False
        self._versions = itertools.count(1)
        self.version = 0
        self._lock = threading.RLock()
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # (version, type, path, object)
        self._watchers: list[tuple[str, str, queue.Queue[WatchEvent | None]]] = []
        self._compacted = 0  # a watch from before this version is refused (410 Gone)

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` at ``path`` as if created (uid and resourceVersion set)."""
        with self._lock:
            meta = obj.get("metadata") or {}
            if (
                self.finalizing
                and path in self.objects
                and meta.get("deletionTimestamp")
                and not meta.get("finalizers")
            ):
                self._remove(path)
                return copy.deepcopy(obj)
            stored = copy.deepcopy(obj)
            meta = stored.setdefault("metadata", {})
            meta.setdefault("uid", f"uid-{path.rsplit('/', 1)[-1]}")
            self.version = next(self._versions)
            meta["resourceVersion"] = str(self.version)
            self._record("MODIFIED" if path in self.objects else "ADDED", path, stored)
            self.objects[path] = stored
            return copy.deepcopy(stored)

    def _record(self, kind: str, path: str, obj: dict[str, Any]) -> None:
        self._history.append((self.version, kind, path, copy.deepcopy(obj)))
        for collection, labels, events in self._watchers:
            event = self._event(kind, path, obj, collection, labels)
            if event is not None:
                events.put(event)

    @staticmethod
    def _event(kind: str, path: str, obj: dict[str, Any], collection: str, labels: str) -> WatchEvent | None:
        if not _in_collection(collection, path):
            return None
        if not _has_labels(obj, labels):  # no longer selected: a label-selected watch says DELETED
            kind = "DELETED"
        return WatchEvent(kind, copy.deepcopy(obj))  # type: ignore[arg-type]

    def list_page(
        self, path: str, *, labels: str = "", limit: int = 500, continue_token: str = ""
    ) -> tuple[list[dict[str, Any]], str, str]:
        """Every matching object in one page (the fake has no pages), and the current version."""
        with self._lock:
            self.reads[f"LIST {path}"] += 1
            return self._matching(path, labels), str(self.version), ""

    def watch(self, path: str, *, labels: str = "", resource_version: str, timeout_seconds: int) -> _Stream:
        """Changes after ``resource_version`` of the objects ``path`` and ``labels`` select."""
        with self._lock:
            self.reads[f"WATCH {path}"] += 1
            if int(resource_version or 0) < self._compacted:
                raise WatchExpiredError(f"watch {path}: too old resource version {resource_version}", status=410)
            events: queue.Queue[WatchEvent | None] = queue.Queue()
            for version, kind, object_path, obj in self._history:
                if version > int(resource_version or 0):
                    event = self._event(kind, object_path, obj, path, labels)
                    if event is not None:
                        events.put(event)
            entry = (path, labels, events)
            self._watchers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._watchers:
                    self._watchers.remove(entry)

        return _Stream(events, unsubscribe)

    def break_watches(self) -> None:
        """End every watch, as a dropped connection would (each informer watches again from where it was)."""
        with self._lock:
            for _, _, events in self._watchers:
                events.put(None)
            self._watchers.clear()

    def forget_history(self) -> None:
        """Compact: a watch from any version before now is refused with 410 Gone (an informer must list again)."""
        with self._lock:
            self._history.clear()
            self._compacted = self.version

    def _write(self, verb: str, path: str) -> dict[str, Any]:
        self.writes[f"{verb} {path}"] += 1
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError(f"{verb} {path}: HTTP 409: the object has been modified", status=409)
        if path not in self.objects:
            raise NotFoundError(f"{verb} {path}: HTTP 404", status=404)
        return self.objects[path]

    def get(self, path: str, *, timeout: Any = None) -> dict[str, Any]:
        self.reads[f"GET {path}"] += 1
        if path not in self.objects:
            raise NotFoundError(f"GET {path}: HTTP 404", status=404)
        return copy.deepcopy(self.objects[path])

    def find(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def list(self, path: str, *, labels: str = "", fields: str = "") -> list[dict[str, Any]]:
        self.reads[f"LIST {path}"] += 1
        return self._matching(path, labels)

    def _matching(self, path: str, labels: str) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(obj)
                for key, obj in list(self.objects.items())
                if _in_collection(path, key) and _has_labels(obj, labels)
            ]

    def create(self, path: str, body: dict[str, Any], *, timeout: Any = None) -> dict[str, Any]:
        full = f"{path}/{body['metadata']['name']}"
        self.writes[f"POST {path}"] += 1
        if full in self.objects:
            raise ConflictError(f"POST {path}: HTTP 409: already exists", status=409)
        return self.put(full, body)

    def update(self, path: str, body: dict[str, Any], *, timeout: Any = None) -> dict[str, Any]:
        current = self._write("PUT", path)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ConflictError(f"PUT {path}: HTTP 409", status=409)
        return self.put(path, body)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        base = path.removesuffix("/status")
        current = copy.deepcopy(self._write("PATCH", base))
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ConflictError(f"PATCH {path}: HTTP 409: the object has been modified", status=409)
        _merge(current, patch)
        return self.put(base, current)

    def json_patch(self, path: str, operations: Sequence[dict[str, Any]]) -> dict[str, Any]:
        current = copy.deepcopy(self._write("PATCH", path))
        for op in operations:
            parts = [p for p in op["path"].split("/") if p]
            parent: Any = current
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            last = parts[-1]
            if op["op"] == "test":
                value = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if value != op["value"]:
                    raise InvalidObjectError(f"PATCH {path}: HTTP 422: test failed at {op['path']}", status=422)
            elif op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif op["op"] == "add":
                if isinstance(parent, list):
                    parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
                else:
                    parent[last] = op["value"]
        return self.put(path, current)

    def apply(self, path: str, body: dict[str, Any], *, manager: str, force: bool = True) -> dict[str, Any]:
        self.writes[f"APPLY {path}"] += 1
        current = copy.deepcopy(self.objects.get(path) or {"metadata": {}})
        _apply(current, body)
        return self.put(path, current)

    def delete(self, path: str, *, propagation: str = "Background") -> bool:
        self.writes[f"DELETE {path}"] += 1
        with self._lock:
            current = self.objects.get(path)
            if current is None:
                return False
            meta = current["metadata"]
            if self.finalizing and meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):  # marked once; a DELETE again changes nothing
                    self.put(path, {**current, "metadata": {**meta, "deletionTimestamp": "2026-01-01T00:00:00Z"}})
            else:
                self._remove(path)
            return True

    def _remove(self, path: str) -> None:
        with self._lock:
            gone = self.objects.pop(path)
            self.version = next(self._versions)
            self._record(
                "DELETED", path, {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(self.version)}}
            )

    def close(self) -> None:
        pass
