"""The controller's REST client as an informer's source, over HTTP to the API server stand-in: paged lists, watches
with bookmarks, a watch opened again from where it was, a relist after 410 Gone, and nothing asked while idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import FakeApiServer

from dradriver.computedomain.kube import Collection, Rest
from dradriver.plugin.cluster.informer import Informer
from dradriver.plugin.cluster.kube import load_transport

DEADLINE = 15.0


def _wait(what: str, condition: Callable[[], Any]) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def informed(api: FakeApiServer, tmp_path: Path) -> Iterator[tuple[Informer, Rest, list[tuple[str, str]]]]:
    """An informer of the Nodes labelled ``domain`` (two to a page), through :class:`Rest`."""
    for i in range(5):
        api.create("nodes", _node(f"node-{i}", domain="a"))
    api.create("nodes", _node("unlabelled"))
    rest = Rest(load_transport(str(api.write_kubeconfig(tmp_path / "kubeconfig"))))
    informer = Informer(Collection(rest, "/api/v1/nodes", "domain"), name="nodes", page_size=2)
    seen: list[tuple[str, str]] = []
    informer.add_handler(
        lambda old, new: seen.append(
            (
                "added" if old is None else "deleted" if new is None else "changed",
                (new or old or {})["metadata"]["name"],
            )
        )
    )
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait("the first list", informer.synced.is_set)
        yield informer, rest, seen
    finally:
        stop.set()
        informer.close()
        thread.join(DEADLINE)
        rest.close()


def test_the_first_list_is_paged_and_the_watch_starts_from_it_with_bookmarks(
    api: FakeApiServer, informed: tuple[Informer, Rest, list[tuple[str, str]]]
) -> None:
    _, rest, seen = informed
    lists = [r for r in api.requests if r.path == "/api/v1/nodes" and not r.watch]
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    assert [bool(r.query.get("continue")) for r in lists] == [False, True, True]
    assert sorted(name for _, name in seen) == [f"node-{i}" for i in range(5)]
    _wait("the watch", lambda: api.active_watches == 1)
    [watch] = [r for r in api.requests if r.watch]
    assert watch.query["allowWatchBookmarks"] == "true" and watch.query["labelSelector"] == "domain"
    api.create("nodes", _node("node-9", domain="b"))
    api.delete("nodes", "node-0")
    _wait("the watch's events", lambda: len(seen) == 7)
    assert seen[5:] == [("added", "node-9"), ("deleted", "node-0")]
    assert rest.reads_so_far() == {"LIST nodes": 3, "WATCH nodes": 1}


def test_an_idle_informer_asks_nothing(
    api: FakeApiServer, informed: tuple[Informer, Rest, list[tuple[str, str]]]
) -> None:
    _wait("the watch", lambda: api.active_watches == 1)
    mark = api.mark()
    time.sleep(1.0)  # the window measured, not a synchronisation
    assert api.requests_since(mark) == []


def test_a_dropped_watch_is_opened_again_from_where_it_was_without_a_list(
    api: FakeApiServer, informed: tuple[Informer, Rest, list[tuple[str, str]]]
) -> None:
    informer, rest, seen = informed
    _wait("the watch", lambda: api.active_watches == 1)
    api.drop_watches()
    api.create("nodes", _node("node-7", domain="a"))
    _wait("the change after the drop", lambda: ("added", "node-7") in seen)
    assert informer.lists == 1 and rest.reads_so_far()["LIST nodes"] == 3


def test_a_deletion_seen_only_by_the_relist_is_delivered(
    api: FakeApiServer, informed: tuple[Informer, Rest, list[tuple[str, str]]]
) -> None:
    informer, _, seen = informed
    _wait("the watch", lambda: api.active_watches == 1)

    def meanwhile() -> None:
        api.delete("nodes", "node-1")
        api.compact()

    # As the informer watches again: node-1 goes, and the history with it (the watch is answered 410 Gone).
    api.before_next("GET", r"^/api/v1/nodes\?.*watch=true", meanwhile)
    api.drop_watches()
    _wait("the deletion", lambda: ("deleted", "node-1") in seen)
    assert informer.lists == 2 and informer.store.get("node-1") is None


class _Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self._body = status, body

    def read(self) -> bytes:
        return self._body


class _Refusing:
    """A transport whose API server answers every request 422, as the real one answers a failed JSON-patch test."""

    def request(self, method: str, path: str, **_: Any) -> _Answer:
        status = b'{"kind":"Status","status":"Failure","reason":"Invalid","code":422,"message":"the test failed"}'
        return _Answer(422, status)

    def close(self) -> None:
        pass


def test_a_failed_resource_version_test_of_a_json_patch_is_a_conflict() -> None:
    from dradriver.plugin.cluster.port import ConflictError, InvalidObjectError

    rest = Rest(_Refusing())  # type: ignore[arg-type]
    guarded = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    with pytest.raises(ConflictError):
        rest.json_patch("/apis/x/v1/namespaces/a/things/b", guarded)
    with pytest.raises(InvalidObjectError):  # unguarded: invalid is invalid
        rest.json_patch("/apis/x/v1/namespaces/a/things/b", guarded[1:])
