"""An in-memory stand-in of the API server for ComputeDomain unit tests, by the API's rules for what they use:
resourceVersion preconditions on merge patches (409), JSON patch ``test`` (422), server-side apply merging list
entries by their map key. Fault injection (a conflict on the next write) is a field."""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dradriver.plugin.cluster.port import ConflictError, InvalidObjectError, NotFoundError

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


class FakeRest:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: Counter[str] = Counter()
        self.conflicts = 0  # the next N writes fail with 409
        self._versions = itertools.count(1)

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` at ``path`` as if created (uid and resourceVersion set)."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{path.rsplit('/', 1)[-1]}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def _write(self, verb: str, path: str) -> dict[str, Any]:
        self.writes[f"{verb} {path}"] += 1
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError(f"{verb} {path}: HTTP 409: the object has been modified", status=409)
        if path not in self.objects:
            raise NotFoundError(f"{verb} {path}: HTTP 404", status=404)
        return self.objects[path]

    def get(self, path: str) -> dict[str, Any]:
        if path not in self.objects:
            raise NotFoundError(f"GET {path}: HTTP 404", status=404)
        return copy.deepcopy(self.objects[path])

    def find(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def list(self, path: str, *, labels: str = "", fields: str = "") -> list[dict[str, Any]]:
        items = []
        for key, obj in self.objects.items():
            collection, _, _ = key.rpartition("/")
            plural = path.rsplit("/", 1)[-1]
            if not (collection == path or (collection.endswith(f"/{plural}") and "/namespaces/" not in path)):
                continue
            if labels:
                name, _, value = labels.partition("=")
                have = obj["metadata"].get("labels", {})
                if name not in have or (value and have[name] != value):
                    continue
            items.append(copy.deepcopy(obj))
        return items

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        full = f"{path}/{body['metadata']['name']}"
        self.writes[f"POST {path}"] += 1
        if full in self.objects:
            raise ConflictError(f"POST {path}: HTTP 409: already exists", status=409)
        return self.put(full, body)

    def update(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
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
        return self.objects.pop(path, None) is not None

    def close(self) -> None:
        pass
