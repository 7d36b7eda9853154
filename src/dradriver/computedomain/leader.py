"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two controller replicas never both write.

The holder renews every ``renew`` seconds; another replica takes over once the Lease has not changed for
``duration`` seconds *as this replica observed it* (its own monotonic clock from the moment it saw the record
change, as client-go does): the renewTime another host wrote is never compared with this host's clock, so clock
skew cannot make two replicas lead. Every write carries the resourceVersion read, so two candidates cannot both
win. A release empties the holder, which lets a standby take over at once.

As client-go's renew deadline: this replica leads only while its last successful renewal is less than
``renew_deadline`` seconds old (shorter than ``duration``), whether or not a request has failed yet, and each Lease
request is bounded well within it; so a replica cut off from the API server stops its work before a standby,
``duration`` after the last renewal it saw, takes over.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from dradriver.computedomain import metrics
from dradriver.computedomain.kube import Rest, path_of
from dradriver.plugin.cluster.port import ClusterError, NotFoundError

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    """Whether this replica leads: set by each successful renewal, and lapsing by itself ``deadline`` seconds
    after the last one (by ``clock``), so no caller can go on believing it leads on a stale renewal."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None

    def set(self, renewed_at: float | None = None) -> None:
        """Renewed (at ``renewed_at``, by the clock; now when None)."""
        with self._lock:
            self._renewed_at = self._clock() if renewed_at is None else renewed_at

    def clear(self) -> None:
        with self._lock:
            self._renewed_at = None

    def is_set(self) -> bool:
        with self._lock:
            renewed_at = self._renewed_at
        return renewed_at is not None and self._clock() - renewed_at < self.deadline


class LeaderElector:
    """Holds (or waits for) the Lease ``namespace/name``; ``leading`` is set while this replica leads."""

    def __init__(
        self,
        rest: Rest,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        renew: float = 2.0,
        renew_deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``renew_deadline``: how long after its last renewal this replica stops leading (two thirds of
        ``duration`` when None: client-go's 10 s of 15)."""
        self.rest = rest
        self.path = path_of("coordination.k8s.io/v1", "leases", namespace, name)
        self.collection = path_of("coordination.k8s.io/v1", "leases", namespace)
        self.namespace, self.name, self.identity = namespace, name, identity
        deadline = min(renew_deadline if renew_deadline is not None else duration * 2 / 3, duration)
        # At least four attempts within the deadline (client-go: every 2 s of 10), so one slow or failed renewal
        # does not end a term: a short lease (the tests' 4 s) is renewed more often than every ``renew``.
        self.duration, self.renew = duration, min(renew, deadline / 4)
        self.leading = Leadership(deadline, clock)
        # Each Lease request bounded within the deadline (a request otherwise may wait 30 s on a read), so a
        # replica cut off tries again, and knows it, well before a standby takes over.
        self._timeout = (min(2.0, deadline / 4), deadline / 2)
        self._clock = clock
        self._observed: tuple[Any, ...] | None = None  # the Lease record as last seen, and when (our clock)
        self._observed_at = 0.0

    def run(self, stop: threading.Event) -> None:
        """Try every ``renew`` seconds until ``stop``; any failure, whatever its kind, steps down (clears
        ``leading``) and is retried, so a replica never goes on believing it leads while it cannot renew."""
        while not stop.is_set():
            started = self._clock()  # every ``renew`` from one attempt's start to the next's, however long it took
            try:
                self.try_acquire()
            except Exception:  # whatever broke, this replica cannot know it still holds the Lease
                log.exception("lease attempt failed, stepping down lease=%s", self.name)
                self._set(False)
            stop.wait(max(0.0, self.renew - (self._clock() - started)))

    def _expired(self, spec: dict[str, Any]) -> bool:
        """Whether the holder has not renewed for the lease's duration, by when this replica saw it change."""
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at > float(spec.get("leaseDurationSeconds") or self.duration)

    def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; whether this replica leads now."""
        started = self._clock()  # renewed as of the attempt's start: the standby saw no later change of ours
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "renewTime": _format(now),
        }
        try:
            try:
                lease = self.rest.get(self.path, timeout=self._timeout)
            except NotFoundError:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _format(now), "leaseTransitions": 0},
                }
                self.rest.create(self.collection, body, timeout=self._timeout)
                return self._set(True, started)
            current = lease.get("spec") or {}
            holder = current.get("holderIdentity")
            expired = self._expired(current)
            if holder and holder != self.identity and not expired:
                return self._set(False)
            if holder != self.identity:
                spec["acquireTime"] = _format(now)
                spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
                log.info("taking over the lease from=%s to=%s", holder, self.identity)
            lease["spec"] = {**current, **spec}
            self.rest.update(self.path, lease, timeout=self._timeout)
            return self._set(True, started)
        except ClusterError as err:
            log.warning("lease renewal failed lease=%s error=%s", self.name, err)
            return self._set(False)

    def _set(self, leading: bool, renewed_at: float | None = None) -> bool:
        if leading and not self.leading.is_set():
            log.info("became leader identity=%s", self.identity)
        if leading:
            self.leading.set(renewed_at)
        else:
            self.leading.clear()
        metrics.LEADING.set(1 if leading else 0)
        return self.leading.is_set()  # an attempt that outlasted the deadline renewed too late to lead

    def release(self) -> None:
        """Give the Lease up (on a clean stop), so a standby takes over at once instead of after ``duration``."""
        if not self.leading.is_set():
            return
        try:
            lease = self.rest.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                # No holder: a standby takes it at its next attempt, whatever its clock says.
                lease["spec"] = {k: v for k, v in lease["spec"].items() if k != "holderIdentity"}
                lease["spec"]["leaseDurationSeconds"] = 1
                self.rest.update(self.path, lease)
        except ClusterError as err:
            log.warning("releasing the lease failed lease=%s error=%s", self.name, err)
        self.leading.clear()
        metrics.LEADING.set(0)
