"""Claim device status: after a prepare, tell the cluster about the prepared devices in ``status.devices``.

The ResourceClaim's ``status.devices`` (KEP-4817, feature ``DRAResourceClaimDeviceStatus``: beta and on since
1.33, GA in 1.37) lists, per allocated device, conditions and driver-specific ``data`` that users and controllers
read with ``kubectl get resourceclaim -o yaml``. A driver owns the entries with its own driver name and leaves the
others alone. The write goes through the ``resourceclaims/status`` subresource (on 1.36 and later the service
account also needs ``associated-node:patch`` on the synthetic ``resourceclaims/driver`` subresource, see
docs/cdi.md).

Status is information, not part of preparing: writes run on a background thread after the kubelet already has its
answer, are retried with back-off, and a failure is logged, never reported to the kubelet. Jobs run in order, so
the clearing at unprepare always comes after the write of the prepare before it.
"""

from __future__ import annotations

import copy
import json
import logging
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dradriver.plugin.cluster.port import ClusterError, ConflictError, NotFoundError
from dradriver.plugin.handler import ClaimRef, PreparedDevice

logger = logging.getLogger(__name__)

READY = "Ready"
# The API server's limits on an AllocatedDeviceStatus (resource.k8s.io validation).
MAX_DATA_BYTES = 10 * 1024


class ClaimStatusPort(Protocol):
    """The two calls of the cluster port this needs (``plugin.cluster.Cluster`` has both)."""

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def update_resource_claim_status(self, claim: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Job:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...] | None  # None: clear this driver's entries


@dataclass(frozen=True, eq=False)
class _Worker:
    """One writer thread and its own stop signal: a stop ends this thread only, never the one started after it."""

    thread: threading.Thread
    stop: threading.Event


@dataclass(frozen=True, eq=False)
class _StopMark:
    """Wakes the worker of ``stop`` out of its wait for the next job; any other worker passes over it."""

    stop: threading.Event


class ClaimStatusWriter:
    """Writes and clears this driver's entries of ``status.devices``, in the background, retrying with back-off.

    ``attempts`` bounds the tries per job (conflicts re-read the claim and count as tries); ``backoff`` is the
    first wait, doubled up to ``max_backoff``. :meth:`wait_idle` lets tests wait until the queue is drained.
    """

    def __init__(
        self,
        cluster: ClaimStatusPort,
        *,
        driver_name: str,
        node_name: str,
        attempts: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
    ) -> None:
        self._cluster = cluster
        self.driver_name = driver_name
        self.node_name = node_name
        self._attempts = attempts
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._jobs: queue.Queue[_Job | _StopMark] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._worker: _Worker | None = None
        # The last stopped worker, which may still be finishing an API call a stop gave up on: the next one waits
        # for it, so that two never write at once and jobs stay in order.
        self._unfinished: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- the plugin layer's calls ------------------------------------------------------------------------

    def prepared(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        """Queue writing ``devices`` as this driver's entries of the claim's ``status.devices``."""
        self._submit(_Job(ref, tuple(devices)))

    def unprepared(self, ref: ClaimRef) -> None:
        """Queue removing this driver's entries from the claim's ``status.devices``."""
        self._submit(_Job(ref, None))

    def start(self) -> None:
        with self._lock:
            if self._worker is not None:
                return
            previous, self._unfinished = self._unfinished, None
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop, previous), name="claim-status", daemon=True)
            self._worker = _Worker(thread, stop)
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the job in flight, waiting for it at most ``timeout`` seconds; queued jobs are dropped
        (the kubelet repeats prepare after a restart), unless a job submitted meanwhile started a writer again. A
        worker still stuck in an API call after ``timeout`` finishes that call and ends; a writer started again
        meanwhile waits for it before it writes."""
        with self._lock:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            # Set before the join: a writer started while this one still finishes waits for it.
            self._unfinished = worker.thread
        worker.stop.set()
        self._jobs.put(_StopMark(worker.stop))
        worker.thread.join(max(0.0, timeout))
        if worker.thread.is_alive():
            logger.warning("claim status writer still busy after %.1fs at stop (an API call in flight)", timeout)
        dropped, marks = 0, []
        # Under the lock, so no writer starts meanwhile: one started during this stop owns the queue (the jobs
        # submitted since, in order after the stopped writer's), and nothing of it is dropped.
        with self._lock:
            while self._worker is None:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if isinstance(job, _StopMark):
                    marks.append(job)  # its worker may not have reached it yet
                else:
                    dropped += 1
            for mark in marks:
                self._jobs.put(mark)
        with self._idle:
            self._pending -= dropped
            self._idle.notify_all()
        if dropped:
            logger.info("claim status updates dropped at stop count=%d", dropped)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued job is done (or given up); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    # --- the worker --------------------------------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        with self._idle:
            self._pending += 1
        self.start()
        self._jobs.put(job)

    def _run(self, stop: threading.Event, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()  # the worker a stop gave up on: its write in flight comes before ours
        while not stop.is_set():
            job = self._jobs.get()
            if isinstance(job, _StopMark):
                if job.stop is stop:
                    break
                continue
            try:
                self._apply(job, stop)
            except Exception:  # a bug here must not end status writing for the life of the process
                logger.exception("claim status update failed claim=%s", job.ref)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _apply(self, job: _Job, stop: threading.Event) -> None:
        what = "write" if job.devices is not None else "clear"
        delay = self._backoff
        for attempt in range(1, self._attempts + 1):
            try:
                self._try(job)
                return
            except NotFoundError:
                logger.debug("claim status %s skipped: claim is gone claim=%s", what, job.ref)
                return
            except ClusterError as err:
                final = attempt == self._attempts or not (err.retryable or isinstance(err, ConflictError))
                log = logger.warning if final else logger.info
                log(
                    "claim status %s failed claim=%s attempt=%d/%d%s error=%s",
                    what,
                    job.ref,
                    attempt,
                    self._attempts,
                    "" if final else " retrying",
                    err,
                )
                if final:
                    return
            if stop.wait(delay):
                return
            delay = min(delay * 2, self._max_backoff)

    def _try(self, job: _Job) -> None:
        claim = self._cluster.get_resource_claim(job.ref.namespace, job.ref.name)
        if claim.get("metadata", {}).get("uid") != job.ref.uid:
            logger.debug("claim status skipped: claim was replaced claim=%s", job.ref)
            return
        status = claim.setdefault("status", {})
        current = list(status.get("devices") or [])
        if job.devices is None:
            wanted = [entry for entry in current if entry.get("driver") != self.driver_name]
        elif not status.get("allocation"):
            return  # deallocated meanwhile: the API server accepts entries only for allocated devices
        else:
            ours = [self._entry(device, current) for device in job.devices]
            wanted = [entry for entry in current if entry.get("driver") != self.driver_name] + ours
        if wanted == current:
            return
        updated = copy.deepcopy(claim)
        if wanted:
            updated["status"]["devices"] = wanted
        else:
            updated["status"].pop("devices", None)
        self._cluster.update_resource_claim_status(updated)
        logger.info(
            "claim status %s claim=%s devices=%d",
            "cleared" if job.devices is None else "written",
            job.ref,
            len(job.devices or ()),
        )

    def _entry(self, device: PreparedDevice, current: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        key = (self.driver_name, device.pool, device.device, device.share_id)
        before = next((e for e in current if _key(e) == key), None)
        ready = {
            "type": READY,
            "status": "True",
            "reason": "Prepared",
            "message": f"prepared on node {self.node_name}",
            "lastTransitionTime": _now(),
        }
        # An unchanged condition keeps its transition time, so a repeated prepare changes nothing.
        for old in (before or {}).get("conditions") or []:
            if old.get("type") == READY and all(old.get(k) == ready[k] for k in ("status", "reason", "message")):
                ready["lastTransitionTime"] = old.get("lastTransitionTime", ready["lastTransitionTime"])
        entry: dict[str, Any] = {"driver": self.driver_name, "pool": device.pool, "device": device.device}
        if device.share_id is not None:
            entry["shareID"] = device.share_id
        entry["conditions"] = [ready]
        if device.status_data:
            data = dict(device.status_data)
            if len(json.dumps(data, separators=(",", ":"))) > MAX_DATA_BYTES:
                logger.warning("device status data over %d bytes left out device=%s", MAX_DATA_BYTES, device.device)
            else:
                entry["data"] = data
        return entry


def _key(entry: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
