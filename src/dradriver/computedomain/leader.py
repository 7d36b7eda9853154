"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two controller replicas never both write.

The holder renews every ``renew`` seconds; another replica takes over once the Lease has not been renewed for
``duration`` seconds. Every write carries the resourceVersion read, so two candidates cannot both win.
"""

from __future__ import annotations

import datetime
import logging
import threading

from dradriver.computedomain.kube import Rest, path_of
from dradriver.plugin.cluster.port import ClusterError, NotFoundError

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)


class LeaderElector:
    """Holds (or waits for) the Lease ``namespace/name``; ``leading`` is set while this replica leads."""

    def __init__(
        self, rest: Rest, *, namespace: str, name: str, identity: str, duration: float = 15.0, renew: float = 2.0
    ) -> None:
        self.rest = rest
        self.path = path_of("coordination.k8s.io/v1", "leases", namespace, name)
        self.collection = path_of("coordination.k8s.io/v1", "leases", namespace)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration, self.renew = duration, renew
        self.leading = threading.Event()

    def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; whether this replica leads now."""
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "renewTime": _format(now),
        }
        try:
            try:
                lease = self.rest.get(self.path)
            except NotFoundError:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _format(now), "leaseTransitions": 0},
                }
                self.rest.create(self.collection, body)
                return self._set(True)
            current = lease.get("spec") or {}
            holder = current.get("holderIdentity")
            renewed = current.get("renewTime")
            expired = renewed is None or (now - _parse(renewed)).total_seconds() > float(
                current.get("leaseDurationSeconds") or self.duration
            )
            if holder != self.identity and not expired:
                return self._set(False)
            if holder != self.identity:
                spec["acquireTime"] = _format(now)
                spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
                log.info("taking over the lease from=%s to=%s", holder, self.identity)
            lease["spec"] = {**current, **spec}
            self.rest.update(self.path, lease)
            return self._set(True)
        except ClusterError as err:
            log.warning("lease renewal failed lease=%s error=%s", self.name, err)
            return self._set(False)

    def _set(self, leading: bool) -> bool:
        if leading and not self.leading.is_set():
            log.info("became leader identity=%s", self.identity)
        if leading:
            self.leading.set()
        else:
            self.leading.clear()
        return leading

    def release(self) -> None:
        """Give the Lease up (on a clean stop), so a standby takes over at once instead of after ``duration``."""
        if not self.leading.is_set():
            return
        try:
            lease = self.rest.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["renewTime"] = _format(_now() - datetime.timedelta(seconds=self.duration + 1))
                self.rest.update(self.path, lease)
        except ClusterError as err:
            log.warning("releasing the lease failed lease=%s error=%s", self.name, err)
        self.leading.clear()
