"""The ComputeDomain controller driven by informers and a work queue keyed by domain.

While this replica leads: one informer per kind the controller reads (domains, cliques, daemon pods, DaemonSets,
claim templates, labelled nodes) lists once, then watches into a local cache; each change queues the key of the
domain it concerns (its own ``namespace/name``, or through the domain-UID label of a clique, pod, DaemonSet,
template or node); workers reconcile one domain at a time from the caches (writes still go to the API server).
An idle cluster costs open watches and nothing else; a change costs work for its domain only.

Level-triggered still: the first list queues every domain (a restart or a failover converges everything), a relist
after a broken watch delivers what it missed, a domain that did not converge is tried again with backoff, and
every ``resync`` seconds every domain is queued again from the cache. Objects whose domain is not in the cache
are a vanished domain's leftovers: swept once a list of domains from the API server confirms it is gone.
Losing the Lease stops the informers and the workers; leading again starts from a fresh list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dradriver.computedomain import metrics
from dradriver.computedomain.controller import STUCK_AFTER_SECONDS, Controller, Snapshot
from dradriver.computedomain.kube import Collection, ListsAndWatches, path_of
from dradriver.plugin.cluster.informer import Informer, key_of, metadata_only, without_managed_fields
from dradriver.plugin.cluster.port import ClusterError, JsonObject
from dradriver.plugin.cluster.workqueue import WorkQueue

log = logging.getLogger(__name__)

RESYNC_SECONDS = 600.0
# Caches whose first list has not succeeded this long after a term began (refused by RBAC, a CRD missing): the
# controller does nothing, so /livez and /readyz fail and the log and a metric say which.
SYNC_TIMEOUT_SECONDS = 120.0
# How long the end of a term waits for its threads before going on (a standby's wait, a clean stop's).
END_DEADLINE = 10.0
WORKERS = 2
BY_UID = "uid"
# A key for the leftovers of domain UID (no domain of that UID in the cache), beside the domains' namespace/name.
ORPHAN = "orphan:"
# A vanished domain's leftovers are looked at this long after the event that showed them: the caches catch up
# with a deletion's own echoes first (a domain let go of by its finalizer has just deleted its objects).
ORPHAN_DELAY = 1.0


@dataclass(frozen=True)
class _DomainUid:
    """The domain UID an object was made for, read from ``label`` (the controller's names' domain label)."""

    label: str

    def of_labelled(self, obj: JsonObject) -> Iterable[str]:
        """An object's domain UID: its label."""
        uid = ((obj.get("metadata") or {}).get("labels") or {}).get(self.label)
        return [uid] if uid else []

    def of_clique(self, obj: JsonObject) -> Iterable[str]:
        """A clique's domain UID: its label, else the first part of its name (``<domain uid>.<clique id>``)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        return self.of_labelled(obj) or ([name.split(".", 1)[0]] if "." in name else [])


def _own_uid(obj: JsonObject) -> Iterable[str]:
    uid = (obj.get("metadata") or {}).get("uid")
    return [uid] if uid else []


@dataclass
class _Session:
    """One term as leader: its informers, queue and threads, all ended together."""

    stop: threading.Event
    informers: dict[str, Informer]
    queue: WorkQueue[str]
    threads: list[threading.Thread]
    started: float = field(default_factory=time.monotonic)
    warned_unsynced: bool = False


class WatchingController:
    """Runs :class:`Controller`'s reconcile of one domain from informers' caches, while leading."""

    def __init__(
        self,
        controller: Controller,
        client: ListsAndWatches,
        *,
        resync: float = RESYNC_SECONDS,
        workers: int = WORKERS,
        watch_timeout: int = 300,
        sync_timeout: float = SYNC_TIMEOUT_SECONDS,
    ) -> None:
        self.controller = controller
        self.sync_timeout = sync_timeout
        self.client = client
        self.resync = resync
        self.workers = workers
        self.watch_timeout = watch_timeout
        self.reconciled: deque[str] = deque(maxlen=1000)  # the last keys reconciled, in order: what tests look at
        self._busy: dict[str, float] = {}  # worker -> when its reconcile began (monotonic)
        self._busy_lock = threading.Lock()
        self.session: _Session | None = None
        self.end_deadline = END_DEADLINE
        self._leftover: list[threading.Thread] = []  # the last session's workers still busy when it ended
        self._domain_uid = _DomainUid(controller.names.domain_label)

    # -- informers -------------------------------------------------------------------------------------

    def _informers(self) -> dict[str, Informer]:
        ns, names = self.controller.ns, self.controller.names
        label, labelled = names.domain_label, self._domain_uid.of_labelled
        sources = {
            "computedomains": (path_of(names.api_version, "computedomains"), "", _own_uid),
            "cliques": (path_of(names.api_version, "computedomaincliques", ns), "", self._domain_uid.of_clique),
            "pods": (path_of("v1", "pods", ns), label, labelled),
            "daemonsets": (path_of("apps/v1", "daemonsets", ns), label, labelled),
            "templates": (path_of("resource.k8s.io/v1", "resourceclaimtemplates"), label, labelled),
            "nodes": (path_of("v1", "nodes"), label, labelled),
        }
        return {
            name: Informer(
                Collection(self.client, path, labels),
                name=name,
                indices={BY_UID: index},
                watch_timeout=self.watch_timeout,
                # The controller never reads managedFields, nor more than the names and labels of Nodes and
                # DaemonSets: memory for nothing.
                transform=metadata_only if name in ("nodes", "daemonsets") else without_managed_fields,
            )
            for name, (path, labels, index) in sources.items()
        }

    def _snapshot(self, informers: dict[str, Informer], uid: str, domains: list[JsonObject]) -> Snapshot:
        """What exists of domain ``uid``, from the caches, as the controller's reconcile reads it."""

        def of(name: str) -> list[JsonObject]:
            return informers[name].store.by_index(BY_UID, uid)

        snap = Snapshot(
            domains=domains,
            cliques=of("cliques"),
            pods=of("pods"),
            daemonsets={d["metadata"]["name"]: d["metadata"] for d in of("daemonsets")},
            templates=of("templates"),
            nodes=of("nodes"),
        )
        snap.by_uid = {d["metadata"]["uid"]: d for d in domains}
        snap.confirm_pods = self._list_daemon_pods
        return snap

    def _list_daemon_pods(self, uid: str) -> list[JsonObject]:
        """Domain ``uid``'s daemon pods as the API server lists them now (by its label)."""
        label = self.controller.names.domain_label
        return self.controller.rest.list(path_of("v1", "pods", self.controller.ns), labels=f"{label}={uid}")

    def _handlers(self, session: _Session) -> None:
        domains = session.informers["computedomains"]

        def on_domain(old: JsonObject | None, new: JsonObject | None) -> None:
            session.queue.add(key_of(new or old or {}))
            gone = (old or {}).get("metadata", {}).get("uid", "")
            if gone and gone != (new or {}).get("metadata", {}).get("uid"):
                # Deleted, or deleted and made again under its name while no watch ran (a relist then says
                # "changed", with a new UID): what the old UID left is swept.
                session.queue.add_after(ORPHAN + gone, ORPHAN_DELAY)

        def on_object(uids_of: Callable[[JsonObject], Iterable[str]]) -> Callable[..., None]:
            def handler(old: JsonObject | None, new: JsonObject | None) -> None:
                for uid in {*uids_of(old or {}), *uids_of(new or {})}:  # a relabelled object concerns both
                    owners = domains.store.by_index(BY_UID, uid)
                    for owner in owners:
                        session.queue.add(key_of(owner))
                    if not owners:
                        session.queue.add_after(ORPHAN + uid, ORPHAN_DELAY)

            return handler

        domains.add_handler(on_domain)
        for name, informer in session.informers.items():
            if name != "computedomains":
                uid_of = self._domain_uid
                informer.add_handler(on_object(uid_of.of_clique if name == "cliques" else uid_of.of_labelled))

    # -- one key ---------------------------------------------------------------------------------------

    def process(self, session: _Session, key: str) -> bool:
        """Reconcile the domain ``key`` (or sweep an orphan's leftovers); whether it is done."""
        informers = session.informers
        if key.startswith(ORPHAN):
            return self._sweep(informers, key.removeprefix(ORPHAN))
        domain = informers["computedomains"].store.get(key)
        if domain is None:
            return True  # deleted: its DELETED event queued its leftovers' sweep
        uid = domain["metadata"]["uid"]
        return self.controller.reconcile(domain, self._snapshot(informers, uid, [domain]))

    def _sweep(self, informers: dict[str, Informer], uid: str) -> bool:
        if not uid or informers["computedomains"].store.by_index(BY_UID, uid):
            return True
        snap = self._snapshot(informers, uid, [])
        # Daemon pods alone are not leftovers: their DaemonSet's deletion removes them (they end gracefully).
        if not (snap.cliques or snap.daemonsets or snap.templates or snap.nodes):
            return True
        # The domain cache may lag the others' (an object made for a domain created a moment ago): the API
        # server says whether the domain is gone. Rare: only for objects of a domain the cache does not know.
        try:
            listed = self.controller.rest.list(path_of(self.controller.names.api_version, "computedomains"))
            if any(d["metadata"].get("uid") == uid for d in listed):
                return True
            self.controller.sweep(uid, snap)
        except ClusterError as err:
            log.warning("sweep failed uid=%s error=%s", uid, err)
            return False
        return True

    def _work(self, session: _Session, leading: Callable[[], bool], name: str) -> None:
        while not session.stop.is_set():
            key = session.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                if not leading():
                    continue
                with self._busy_lock:
                    self._busy[name] = time.monotonic()
                started = time.monotonic()
                done = False
                try:
                    done = self.process(session, key)
                except Exception:  # a fault of one key must not end the worker
                    log.exception("reconcile failed key=%s", key)
                finally:
                    with self._busy_lock:
                        self._busy.pop(name, None)
                metrics.RECONCILES.labels("ok" if done else "retry").inc()
                metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
                self.reconciled.append(key)
                if done:
                    session.queue.forget(key)
                else:
                    session.queue.add_rate_limited(key)
            finally:
                session.queue.done(key)

    # -- leading ---------------------------------------------------------------------------------------

    def _start(self, leading: Callable[[], bool]) -> _Session:
        session = _Session(threading.Event(), self._informers(), WorkQueue(), [])
        self._handlers(session)
        for name, informer in session.informers.items():
            session.threads.append(
                threading.Thread(target=informer.run, args=(session.stop,), name=f"informer-{name}", daemon=True)
            )
        for thread in session.threads:
            thread.start()
        self.session = session
        return session

    def _start_workers(self, session: _Session, leading: Callable[[], bool]) -> None:
        """The workers, once every cache holds its first list: a domain reconciled from a cache still empty
        of its pods or cliques would have its status rewritten as if it had no daemons."""
        for n in range(self.workers):
            worker = threading.Thread(
                target=self._work, args=(session, leading, f"worker-{n}"), name=f"worker-{n}", daemon=True
            )
            session.threads.append(worker)
            worker.start()

    def _end(self, session: _Session) -> None:
        session.stop.set()
        session.queue.shut_down()
        for informer in session.informers.values():
            informer.close()
        # One deadline for all: a list or a request in flight ends with its own timeout (daemon threads).
        deadline = time.monotonic() + self.end_deadline
        for thread in session.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # A worker still in a reconcile: the next session waits for it (see run).
        self._leftover = [t for t in session.threads if t.is_alive() and t.name.startswith("worker-")]
        self.session = None
        metrics.forget_domains()
        metrics.INFORMER_UNSYNCED.clear()

    def _synced(self, session: _Session) -> bool:
        return all(i.synced.is_set() for i in session.informers.values())

    def _walk(self, session: _Session) -> None:
        """Queue every domain of the cache, and a sweep of every domain UID the other caches hold objects of
        that the domain cache lacks (leftovers no event names again); count it as a pass over them."""
        started = time.monotonic()
        domains = session.informers["computedomains"].store
        for key in domains.list_keys():
            session.queue.add(key)
        known = set(domains.index_values(BY_UID))
        for name, informer in session.informers.items():
            if name != "computedomains":
                for uid in set(informer.store.index_values(BY_UID)) - known:
                    session.queue.add(ORPHAN + uid)
        metrics.PASSES.labels("ok").inc()
        metrics.PASS_DURATION.observe(time.monotonic() - started)

    def run(self, stop: threading.Event, *, leading: Callable[[], bool], poll: float = 0.1) -> None:
        """Informers and workers while ``leading()``, until ``stop`` is set."""
        while not stop.is_set():
            if not leading():
                metrics.forget_domains()
                stop.wait(poll)
                continue
            for worker in self._leftover:
                # Never two workers on one key across sessions: the last session's reconcile ends first (each of
                # its requests is bounded, so this wait is too).
                log.info("waiting for the last term's worker to finish thread=%s", worker.name)
                worker.join()
            self._leftover = []
            log.info("leading: starting informers and %d workers", self.workers)
            session = self._start(leading)
            try:
                self._lead(session, stop, leading, poll)
            finally:
                log.info("stopping informers and workers")
                self._end(session)

    def _lead(self, session: _Session, stop: threading.Event, leading: Callable[[], bool], poll: float) -> None:
        walked_at: float | None = None
        counted = -1
        while not stop.is_set() and leading():
            if walked_at is None:
                self._report_unsynced(session)
            if walked_at is None and self._synced(session):
                metrics.INFORMER_UNSYNCED.clear()  # synced, however late
                self._start_workers(session, leading)
                self._walk(session)  # the first lists queued every domain already; the pass is counted here
                walked_at = time.monotonic()
            elif walked_at is not None and time.monotonic() - walked_at >= self.resync:
                self._walk(session)
                walked_at = time.monotonic()
            domains = session.informers["computedomains"].store
            if walked_at is not None and domains.changes != counted:
                counted = domains.changes
                metrics.record_domains(domains.objects())
            stop.wait(poll)

    def unsynced(self) -> list[str]:
        """The informers of this term whose first list has not succeeded ``sync_timeout`` seconds after it began
        (none while not leading, or still within that time)."""
        session = self.session
        if session is None or time.monotonic() - session.started <= self.sync_timeout:
            return []
        return sorted(name for name, informer in session.informers.items() if not informer.synced.is_set())

    def _report_unsynced(self, session: _Session) -> None:
        """Log (once a term) and count the informers :meth:`unsynced` names."""
        names = self.unsynced()
        for name in session.informers:
            metrics.INFORMER_UNSYNCED.labels(name).set(1 if name in names else 0)
        if names and not session.warned_unsynced:
            session.warned_unsynced = True
            log.error(
                "caches not synced after %.0f s, nothing is reconciled informers=%s (their list fails: see the "
                "warnings above; a 403 needs the controller's RBAC, a 404 the ComputeDomain CRDs installed)",
                self.sync_timeout,
                ",".join(names),
            )

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """For /readyz: false while :meth:`unsynced` names an informer."""
        names = self.unsynced()
        if names:
            return False, {"failedCheck": "caches", "reason": f"caches not synced: {', '.join(names)}"}
        return True, {}

    def alive(self) -> tuple[bool, dict[str, Any]]:
        """For /livez: no reconcile has made no progress for :data:`STUCK_AFTER_SECONDS`, and every cache
        synced within ``sync_timeout`` of the term's start (a restart may cure a refusal: new RBAC, a CRD)."""
        ready, detail = self.ready()
        if not ready:
            return ready, detail
        with self._busy_lock:
            oldest = min(self._busy.values(), default=None)
        if oldest is not None and (idle := time.monotonic() - oldest) > STUCK_AFTER_SECONDS:
            return False, {"failedCheck": "reconcile", "reason": f"a reconcile has run for {idle:.0f} s"}
        return True, {}
