"""The informer: list once in pages, watch, watch again from where it was, relist on 410 or a failure."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dradriver.plugin.cluster.informer import Informer, Store, key_of, metadata_only, without_managed_fields
from dradriver.plugin.cluster.port import ApiUnavailableError, WatchEvent, WatchExpiredError

DEADLINE = 10.0


def _wait(what: str, condition: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


class _Stream:
    def __init__(self, events: queue.Queue[WatchEvent | None]) -> None:
        self._events = events
        self.closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while not self.closed:
            try:
                event = self._events.get(timeout=0.02)
            except queue.Empty:
                continue
            if event is None:
                self.closed = True
                break
            return event
        raise StopIteration

    def close(self) -> None:
        self.closed = True


class Collection:
    """A collection with resourceVersions, pages and watches; history older than ``compacted`` is gone (410)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a test may write several times under it: no watch sees one write alone
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.history: list[tuple[int, WatchEvent]] = []
        self.compacted = 0
        self.watchers: list[queue.Queue[WatchEvent | None]] = []
        self.pages = 0
        self.watches = 0
        self.timeouts: list[int] = []  # each watch's timeout_seconds

    def write(self, name: str, value: int | None) -> None:
        """Create or change (``value``) or delete (None) object ``name``, telling the watches."""
        with self.lock:
            self.version += 1
            if value is None:
                obj = self.objects.pop(name)
                obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
                kind = "DELETED"
            else:
                kind = "MODIFIED" if name in self.objects else "ADDED"
                obj = {"metadata": {"name": name, "resourceVersion": str(self.version)}, "value": value}
                self.objects[name] = obj
            event = WatchEvent(kind, obj)  # type: ignore[arg-type]
            self.history.append((self.version, event))
            for watcher in self.watchers:
                watcher.put(event)

    def break_watches(self, *, compact: bool) -> None:
        """End every watch; with ``compact``, a watch from before now is refused (410)."""
        with self.lock:
            if compact:
                self.compacted = self.version
            for watcher in self.watchers:
                watcher.put(None)
            self.watchers.clear()

    def list_page(self, *, limit: int, continue_token: str) -> tuple[list[dict[str, Any]], str, str]:
        with self.lock:
            self.pages += 1
            names = sorted(self.objects)
            start = int(continue_token or 0)
            page = [self.objects[n] for n in names[start : start + limit]]
            token = str(start + limit) if start + limit < len(names) else ""
            return page, str(self.version), token

    def watch(self, *, resource_version: str, timeout_seconds: int) -> _Stream:
        with self.lock:
            self.watches += 1
            self.timeouts.append(timeout_seconds)
            since = int(resource_version)
            if since < self.compacted:
                raise WatchExpiredError("too old", status=410)
            events: queue.Queue[WatchEvent | None] = queue.Queue()
            for version, event in self.history:
                if version > since:
                    events.put(event)
            events.put(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": str(self.version)}}))
            self.watchers.append(events)
            return _Stream(events)


@pytest.fixture
def running() -> Iterator[Callable[[Collection], tuple[Informer, list[tuple[str, str]]]]]:
    stops: list[tuple[threading.Event, Informer, threading.Thread]] = []

    def start(
        collection: Collection, page_size: int = 2, watch_timeout: int = 300
    ) -> tuple[Informer, list[tuple[str, str]]]:
        informer = Informer(collection, name="things", page_size=page_size, watch_timeout=watch_timeout)
        seen: list[tuple[str, str]] = []

        def handler(old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            kind = "added" if old is None else "deleted" if new is None else "changed"
            seen.append((kind, key_of(new or old or {})))

        informer.add_handler(handler)
        stop = threading.Event()
        thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
        thread.start()
        stops.append((stop, informer, thread))
        _wait("the first list", informer.synced.is_set)
        return informer, seen

    yield start
    for stop, informer, thread in stops:
        stop.set()
        informer.close()
        thread.join(DEADLINE)
        assert not thread.is_alive()


def test_the_first_list_is_paginated_then_changes_come_from_the_watch(running: Any) -> None:
    things = Collection()
    for name in "abcde":
        things.write(name, 1)
    informer, seen = running(things)
    assert things.pages == 3  # five objects, two a page
    assert sorted(key for _, key in seen) == list("abcde")
    things.write("f", 1)
    things.write("a", 2)
    things.write("b", None)
    _wait("the watch's events", lambda: len(seen) == 8)
    assert seen[5:] == [("added", "f"), ("changed", "a"), ("deleted", "b")]
    assert informer.store.get("a")["value"] == 2 and informer.store.get("b") is None
    assert (things.pages, informer.lists) == (3, 1)  # no list after the first


def test_a_watch_the_server_ends_is_opened_again_without_a_list(running: Any) -> None:
    things = Collection()
    things.write("a", 1)
    informer, seen = running(things)
    _wait("a watch", lambda: things.watches == 1 and things.watchers)
    things.break_watches(compact=False)
    things.write("a", 2)  # while no watch runs: the next watch replays it from the last version seen
    _wait("the change", lambda: ("changed", "a") in seen)
    assert informer.lists == 1 and things.watches >= 2


def test_a_change_missed_while_the_watch_was_too_old_is_repaired_by_the_relist(running: Any) -> None:
    things = Collection()
    for name in "abc":
        things.write(name, 1)
    informer, seen = running(things)
    _wait("a watch", lambda: things.watchers)
    with things.lock:  # the watch breaks, and the server forgets the history meanwhile (410 Gone)
        things.watchers[0].put(None)
        things.watchers.clear()
        # Under the same lock: the re-watch cannot start before the compaction and replay these writes.
        things.write("a", 2)
        things.write("b", None)
        things.write("d", 1)
        things.break_watches(compact=True)
    _wait("the relist's difference", lambda: len(seen) == 6)
    assert sorted(seen[3:]) == [("added", "d"), ("changed", "a"), ("deleted", "b")]
    assert informer.lists == 2
    assert sorted(informer.store.list_keys()) == ["a", "c", "d"]


def test_a_failing_list_is_retried(running: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    things = Collection()
    things.write("a", 1)
    real = things.list_page
    failures = iter([True, True])

    def flaky(**kwargs: Any) -> Any:
        if next(failures, False):
            raise ApiUnavailableError("HTTP 503")
        return real(**kwargs)

    monkeypatch.setattr(things, "list_page", flaky)
    informer, seen = running(things)
    assert seen == [("added", "a")] and informer.lists == 1


def test_a_watch_always_too_old_is_listed_again_with_backoff(running: Any) -> None:
    things = Collection()
    things.write("a", 1)
    things.compacted = 10**9  # every watch is refused (410 Gone)
    started = time.monotonic()
    informer, _ = running(things)
    _wait("three lists", lambda: informer.lists >= 3)
    assert time.monotonic() - started >= 0.2 + 0.4  # backed off before the second list and the third


def test_a_watch_that_ends_at_once_is_opened_again_from_where_it_was_without_a_list(
    running: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    things = Collection()
    things.write("a", 1)
    real = things.watch
    quiet = iter([True, True])

    def ends_at_once(**kwargs: Any) -> Any:
        if next(quiet, False):
            with things.lock:
                things.watches += 1
            ended: queue.Queue[WatchEvent | None] = queue.Queue()
            ended.put(None)
            return _Stream(ended)  # nothing said, and ended at once
        return real(**kwargs)

    monkeypatch.setattr(things, "watch", ends_at_once)
    informer, seen = running(things)
    _wait("a watch that stays", lambda: things.watchers)
    things.write("a", 2)
    _wait("the change", lambda: ("changed", "a") in seen)
    assert informer.lists == 1 and things.watches == 3


def test_each_watch_asks_for_a_timeout_between_once_and_twice_the_setting(running: Any) -> None:
    things = Collection()
    running(things, watch_timeout=300)
    for _ in range(5):
        _wait("a watch", lambda: things.watchers)
        things.break_watches(compact=False)
    _wait("the watches", lambda: len(things.timeouts) >= 5)
    assert all(300 <= t <= 600 for t in things.timeouts), things.timeouts
    assert len(set(things.timeouts)) > 1  # spread: the watches of many informers do not end together


def test_the_store_indexes_objects_and_keys_namespaced_ones_by_namespace() -> None:
    store = Store({"label": lambda o: [o["metadata"].get("labels", {}).get("x", "")]})
    store.put({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}}})
    store.put({"metadata": {"name": "b", "labels": {"x": "1"}}})
    assert [key_of(o) for o in store.by_index("label", "1")] == ["b", "n/a"]
    store.put({"metadata": {"name": "b", "labels": {"x": "2"}}})  # moved to another value
    assert [key_of(o) for o in store.by_index("label", "1")] == ["n/a"]
    store.remove({"metadata": {"name": "a", "namespace": "n"}})
    assert store.by_index("label", "1") == [] and store.get("n/a") is None


def test_a_transform_is_applied_before_objects_are_stored() -> None:
    obj = {"metadata": {"name": "a", "managedFields": [{"manager": "x"}]}, "spec": {}}
    assert without_managed_fields(obj) == {"metadata": {"name": "a"}, "spec": {}}
    assert obj["metadata"]["managedFields"] == [{"manager": "x"}]  # the original is left alone
    things = Collection()
    things.write("a", 1)
    informer = Informer(things, name="things", transform=lambda o: {**o, "seen": True})
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait("the first list", informer.synced.is_set)
        things.write("b", 1)
        _wait("the watch's object", lambda: informer.store.get("b") is not None)
        assert informer.store.get("a")["seen"] and informer.store.get("b")["seen"]
    finally:
        stop.set()
        informer.close()
        thread.join(DEADLINE)


def test_metadata_only_keeps_the_kind_and_metadata_without_managed_fields() -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "7", "managedFields": [{"manager": "x"}]},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {"images": [{"names": ["big"]}] * 50},
    }
    assert metadata_only(node) == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "7"},
    }
    assert "managedFields" in node["metadata"] and "status" in node  # the object itself is left alone
