"""The ComputeDomain controller on informers and a work queue, on the in-memory API server (with watches)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.fake_rest import FakeRest

from dradriver.computedomain import api
from dradriver.computedomain.controller import Controller, ControllerSettings
from dradriver.computedomain.kube import path_of
from dradriver.computedomain.watching import WatchingController

NS = "dradriver"
DEADLINE = 15.0
RECONCILES = "dradriver_computedomain_reconciles_total"
UNSYNCED = "dradriver_computedomain_informer_unsynced"


def _wait(what: str, condition: Callable[[], Any]) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _domain_path(name: str) -> str:
    return path_of(api.API_VERSION, "computedomains", "team", name)


def _daemonset_path(uid: str) -> str:
    return path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{uid}")


def _domain(rest: FakeRest, name: str) -> str:
    uid = f"uid-{name}"
    rest.put(
        _domain_path(name),
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": "team", "uid": uid, "generation": 1},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{name}-ch"}}},
        },
    )
    return uid


def _daemon_pod(rest: FakeRest, uid: str, node: str, *, ready: bool) -> None:
    rest.put(
        path_of("v1", "pods", NS, f"daemon-{node}"),
        {
            "metadata": {
                "name": f"daemon-{node}",
                "namespace": NS,
                "labels": {api.DOMAIN_LABEL: uid, api.CLIQUE_LABEL: ""},
            },
            "spec": {"nodeName": node},
            "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": str(ready)}]},
        },
    )


def _ready(rest: FakeRest, name: str) -> bool:
    return (rest.find(_domain_path(name)) or {}).get("status", {}).get("status") == "Ready"


class Running:
    """A WatchingController in a thread; ``leading`` can be switched."""

    def __init__(
        self, rest: FakeRest, *, resync: float = 600.0, names: api.ComputeDomainNames = api.OURS, **options: Any
    ) -> None:
        self.rest = rest
        settings = ControllerSettings(namespace=NS, image="dradriver:test", names=names)
        self.controller = Controller(rest, settings)  # type: ignore[arg-type]
        self.watching = WatchingController(self.controller, rest, resync=resync, **options)
        self.leading = threading.Event()
        self.leading.set()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.watching.run, args=(self.stop,), kwargs={"leading": self.leading.is_set}
        )
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()

    def settled(self) -> None:
        """Wait until the queue is empty and no worker is busy, twice in a row a little apart."""

        def idle() -> bool:
            session = self.watching.session
            return session is not None and len(session.queue) == 0 and not self.watching._busy

        for _ in range(2):
            _wait("the controller to settle", idle)
            time.sleep(0.2)
        _wait("the controller to settle", idle)


@pytest.fixture
def rest() -> FakeRest:
    return FakeRest()


@pytest.fixture
def start(rest: FakeRest) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(**options: Any) -> Running:
        started.append(Running(rest, **options))
        return started[-1]

    yield run
    for running in started:
        running.end()


def _reads(rest: FakeRest, *verbs: str) -> int:
    return sum(count for key, count in rest.reads.items() if key.split(" ")[0] in verbs)


def test_a_new_domain_gets_its_objects_and_an_idle_controller_sends_no_requests(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    running = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    # Created after the DaemonSet, in the same pass: a loaded machine may show the one before the other.
    template = path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch")
    _wait("the workload's claim template", lambda: rest.find(template))
    _daemon_pod(rest, uid, "node-a", ready=True)
    _wait("the domain Ready", lambda: _ready(rest, "job"))
    running.settled()
    lists = rest.reads.copy()
    assert _reads(rest, "LIST") == 6  # one list per kind, once
    writes = sum(rest.writes.values())
    time.sleep(1.0)  # idle: nothing changes, so nothing may be asked or written
    assert rest.reads == lists and sum(rest.writes.values()) == writes


def test_a_change_to_one_domain_reconciles_only_that_domain(rest: FakeRest, start: Callable[..., Running]) -> None:
    running = start()
    uids = [_domain(rest, name) for name in ("one", "two", "three")]
    for uid in uids:
        _wait("the DaemonSets", lambda uid=uid: rest.find(_daemonset_path(uid)))
    running.settled()
    running.watching.reconciled.clear()
    _daemon_pod(rest, uids[1], "node-b", ready=True)
    _wait("domain two Ready", lambda: _ready(rest, "two"))
    running.settled()
    assert set(running.watching.reconciled) == {"team/two"}
    assert not _ready(rest, "one") and not _ready(rest, "three")


def test_a_change_missed_while_the_watch_was_broken_is_repaired_by_the_relist(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    running = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    running.settled()
    lists = _reads(rest, "LIST")
    with rest._lock:  # no watch sees this: they are broken, and the server forgets the history (410 Gone)
        rest.break_watches()
        rest.delete(_daemonset_path(uid))
        rest.forget_history()
    _wait("the DaemonSet made again", lambda: rest.find(_daemonset_path(uid)))
    assert _reads(rest, "LIST") > lists  # through a relist


def test_a_restarted_controller_converges_what_changed_while_none_ran(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    first = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    first.settled()
    first.end()
    rest.delete(_daemonset_path(uid))
    other = _domain(rest, "later")
    start()
    _wait("both DaemonSets", lambda: rest.find(_daemonset_path(uid)) and rest.find(_daemonset_path(other)))


def test_losing_the_lease_stops_informers_and_workers_and_leading_again_converges(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    running = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    running.leading.clear()
    _wait("the session to end", lambda: running.watching.session is None)
    assert not rest._watchers  # every watch closed
    writes = sum(rest.writes.values())
    rest.delete(_daemonset_path(uid))
    time.sleep(0.3)
    assert not rest.find(_daemonset_path(uid)) and sum(rest.writes.values()) == writes + 1  # our delete only
    running.leading.set()
    _wait("the DaemonSet made again", lambda: rest.find(_daemonset_path(uid)))


def test_the_resync_reconciles_every_domain_again(rest: FakeRest, start: Callable[..., Running]) -> None:
    running = start(resync=0.3)
    _domain(rest, "job")
    _wait("a first reconcile", lambda: "team/job" in running.watching.reconciled)
    running.settled()
    running.watching.reconciled.clear()
    writes = sum(rest.writes.values())
    _wait("a resync", lambda: "team/job" in running.watching.reconciled)
    assert sum(rest.writes.values()) == writes  # converged already: nothing written


def test_what_a_vanished_domain_left_is_swept(rest: FakeRest, start: Callable[..., Running]) -> None:
    running = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    running.settled()
    domain = rest.get(_domain_path("job"))
    rest.put(_domain_path("job"), {**domain, "metadata": {**domain["metadata"], "finalizers": []}})
    rest.delete(_domain_path("job"))  # finalizer forced off: the controller never saw it being deleted
    _wait("the DaemonSet swept", lambda: rest.find(_daemonset_path(uid)) is None)
    assert rest.find(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch")) is None


def test_under_nvidias_names_a_vanished_domains_objects_nvidias_controller_finalized_are_swept(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    """The DaemonSet cache keeps metadata only, finalizers with it: NVIDIA's finalizer comes off the DaemonSet and
    the templates its controller made before the sweep deletes them, so none stays Terminating."""
    rest.finalizing = True
    names, uid = api.NVIDIA, "uid-nvidias"
    made = [
        path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"),
        path_of("resource.k8s.io/v1", "resourceclaimtemplates", NS, f"computedomain-daemon-{uid}"),
        _daemonset_path(uid),
    ]
    for path in made:
        meta = {"name": path.split("/")[-1], "namespace": path.split("/")[-3], "labels": {names.domain_label: uid}}
        rest.put(path, {"metadata": meta | {"finalizers": [names.finalizer]}})
    start(names=names)
    _wait("NVIDIA's objects swept", lambda: not any(rest.find(path) for path in made))


def test_a_failed_reconcile_is_tried_again_with_backoff(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = rest.create
    refusals = iter([True, True])

    def flaky(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["kind"] == "DaemonSet" and next(refusals, False):
            from dradriver.plugin.cluster.port import ApiUnavailableError

            raise ApiUnavailableError(f"POST {path}: HTTP 503")
        return real(path, body)

    monkeypatch.setattr(rest, "create", flaky)
    retries = REGISTRY.get_sample_value(RECONCILES, {"outcome": "retry"}) or 0.0
    start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet after two refusals", lambda: rest.find(_daemonset_path(uid)))
    assert (REGISTRY.get_sample_value(RECONCILES, {"outcome": "retry"}) or 0.0) >= retries + 2


def test_a_restarted_controller_leaves_a_converged_domain_alone(rest: FakeRest, start: Callable[..., Running]) -> None:
    first = start()
    uid = _domain(rest, "job")
    _daemon_pod(rest, uid, "node-a", ready=True)
    _wait("the domain Ready", lambda: _ready(rest, "job"))
    first.settled()
    first.end()
    writes = sum(rest.writes.values())
    second = start()
    _wait("a reconcile of the domain", lambda: "team/job" in second.watching.reconciled)
    second.settled()
    assert sum(rest.writes.values()) == writes  # no worker read a cache before every cache had its first list


def test_a_domain_recreated_under_its_name_while_no_watch_ran_has_the_old_ones_leftovers_swept(
    rest: FakeRest, start: Callable[..., Running]
) -> None:
    running = start()
    old = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(old)))
    running.settled()
    domain = rest.get(_domain_path("job"))
    with rest._lock:  # no watch sees this (410 Gone): the relist finds one domain "job" with another UID
        rest.break_watches()
        rest.put(_domain_path("job"), {**domain, "metadata": {**domain["metadata"], "finalizers": []}})
        rest.delete(_domain_path("job"))  # finalizer forced off
        new = "uid-job-2"
        rest.put(
            _domain_path("job"),
            {**domain, "metadata": {"name": "job", "namespace": "team", "uid": new, "generation": 1}, "status": {}},
        )
        rest.forget_history()
    _wait("the old DaemonSet swept", lambda: rest.find(_daemonset_path(old)) is None)
    _wait("the new domain's DaemonSet", lambda: rest.find(_daemonset_path(new)))
    _wait(
        "the new domain's workload template",
        lambda: (
            (rest.find(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch")) or {})
            .get("metadata", {})
            .get("labels", {})
            .get(api.DOMAIN_LABEL)
            == new
        ),
    )


def test_the_resync_sweeps_leftovers_no_event_named_again(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    leftover = {"metadata": {"name": "computedomain-daemon-uid-gone", "namespace": NS}}
    leftover["metadata"]["labels"] = {api.DOMAIN_LABEL: "uid-gone"}
    rest.put(_daemonset_path("uid-gone"), leftover)
    real, answers = rest.list, iter([True])

    def stale(path: str, **selectors: str) -> list[dict[str, Any]]:
        # The sweep's confirming list answers, once, as if the domain were still there (the only event that
        # named the DaemonSet, its first list, is spent): only the resync can find it again.
        items = real(path, **selectors)
        if path.endswith("/computedomains") and next(answers, False):
            items.append({"metadata": {"name": "gone", "namespace": "team", "uid": "uid-gone"}})
        return items

    monkeypatch.setattr(rest, "list", stale)
    start(resync=0.3)
    _wait("the leftover swept by the resync", lambda: rest.find(_daemonset_path("uid-gone")) is None)


def test_a_new_term_waits_for_the_last_terms_worker_so_no_key_is_worked_on_twice_at_once(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    release, blocked, second = threading.Event(), threading.Event(), threading.Event()
    active: list[str] = []
    overlaps: list[str] = []
    real = Controller.reconcile

    def slow(self: Controller, domain: dict[str, Any], snap: Any) -> bool:
        key = f"{domain['metadata']['namespace']}/{domain['metadata']['name']}"
        if key in active:
            overlaps.append(key)
        if blocked.is_set():
            second.set()
        active.append(key)
        try:
            if not blocked.is_set():
                blocked.set()
                release.wait(DEADLINE)  # a reconcile whose requests are slow: it outlives its term
            return real(self, domain, snap)
        finally:
            active.remove(key)

    monkeypatch.setattr(Controller, "reconcile", slow)
    running = start()
    running.watching.end_deadline = 0.1
    _domain(rest, "job")
    _wait("a reconcile under way", blocked.is_set)
    running.leading.clear()
    _wait("the term to end", lambda: running.watching.session is None)
    running.leading.set()
    # A new term's first list queues the domain at once: with a worker of its own it would reconcile it now.
    second.wait(1.0)
    release.set()
    _wait("the domain reconciled by the new term", second.is_set)
    assert not overlaps


def test_caches_that_never_sync_fail_livez_and_readyz_and_say_which(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dradriver.plugin.cluster.port import ForbiddenError

    real = rest.list_page

    def refused(path: str, **options: Any) -> Any:
        if path.endswith("/computedomaincliques"):  # the controller's RBAC lacks it, say
            raise ForbiddenError(f"GET {path}: HTTP 403: forbidden", status=403)
        return real(path, **options)

    monkeypatch.setattr(rest, "list_page", refused)
    running = start(sync_timeout=0.3)
    _wait("livez to fail", lambda: not running.watching.alive()[0])
    ok, detail = running.watching.ready()
    assert not ok and "cliques" in detail["reason"]
    _wait("the metric", lambda: REGISTRY.get_sample_value(UNSYNCED, {"informer": "cliques"}) == 1)
    assert REGISTRY.get_sample_value(UNSYNCED, {"informer": "pods"}) == 0
    _wait("the log", lambda: "caches not synced" in caplog.text)
    monkeypatch.setattr(rest, "list_page", real)  # the RBAC fixed
    _wait("livez and readyz to pass", lambda: running.watching.alive()[0] and running.watching.ready()[0])
    _wait("the metric gone", lambda: REGISTRY.get_sample_value(UNSYNCED, {"informer": "cliques"}) is None)


class _Lagging:
    """A watch whose events are held until ``release``: its cache lags the others'."""

    def __init__(self, stream: Any, release: threading.Event) -> None:
        self._stream, self._release = stream, release

    def __iter__(self) -> _Lagging:
        return self

    def __next__(self) -> Any:
        event = next(self._stream)
        self._release.wait(DEADLINE)
        return event

    def close(self) -> None:
        self._stream.close()


def _lagging(rest: FakeRest, monkeypatch: pytest.MonkeyPatch, plural: str) -> threading.Event:
    """Hold the events of every watch of ``plural`` from now until the returned event is set."""
    release = threading.Event()
    real = rest.watch

    def watch(path: str, **options: Any) -> Any:
        stream = real(path, **options)
        return _Lagging(stream, release) if path.endswith(f"/{plural}") else stream

    monkeypatch.setattr(rest, "watch", watch)
    return release


def test_a_clique_entry_seen_before_its_daemons_pod_is_kept(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    release = _lagging(rest, monkeypatch, "pods")
    running = start()
    uid = _domain(rest, "job")
    _wait("the DaemonSet", lambda: rest.find(_daemonset_path(uid)))
    running.settled()
    pod = {"name": "daemon-a", "namespace": NS, "labels": {api.DOMAIN_LABEL: uid, api.CLIQUE_LABEL: "c"}}
    rest.put(path_of("v1", "pods", NS, "daemon-a"), {"metadata": pod, "spec": {"nodeName": "node-a"}})
    clique_path = path_of(api.API_VERSION, "computedomaincliques", NS, f"{uid}.c")
    rest.put(
        clique_path,
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomainClique",
            "metadata": {"name": f"{uid}.c", "namespace": NS, "labels": {api.DOMAIN_LABEL: uid, api.CLIQUE_LABEL: "c"}},
            "daemons": [{"nodeName": "node-a", "ipAddress": "10.0.0.1", "cliqueID": "c", "status": "Ready"}],
        },
    )

    def decided() -> bool:
        daemons = rest.get(clique_path).get("daemons") or []
        return not daemons or daemons[0].get("index") is not None

    try:
        _wait("the clique's entry numbered or dropped", decided)
        assert [d["nodeName"] for d in rest.get(clique_path)["daemons"]] == ["node-a"]  # kept, and numbered
    finally:
        release.set()


def test_objects_of_a_domain_the_domain_cache_does_not_know_yet_are_not_swept(
    rest: FakeRest, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    release = _lagging(rest, monkeypatch, "computedomains")
    running = start()
    _wait(
        "the caches synced",
        lambda: running.watching.session is not None and running.watching._synced(running.watching.session),
    )
    uid = _domain(rest, "job")  # its event held: the domain cache lags
    leftover = {"name": f"computedomain-daemon-{uid}", "namespace": NS, "labels": {api.DOMAIN_LABEL: uid}}
    rest.put(_daemonset_path(uid), {"metadata": leftover})  # as if made by another replica a moment ago
    try:
        _wait(
            "the sweep of what looks like a vanished domain's", lambda: f"orphan:{uid}" in running.watching.reconciled
        )
        assert rest.find(_daemonset_path(uid))  # the API server's list said the domain exists: nothing deleted
    finally:
        release.set()
    _wait("the domain Ready to be reconciled", lambda: "team/job" in running.watching.reconciled)
    assert rest.find(_daemonset_path(uid))
