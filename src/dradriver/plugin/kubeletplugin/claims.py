"""Claims as the plugin layer sees them: where they come from, how they are checked and serialised."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from dradriver.plugin.handler import (
    AllocatedClaim,
    AllocatedDevice,
    ClaimConsumer,
    ClaimRef,
    DeviceConfig,
    DeviceToleration,
)
from dradriver.validation.names import is_path_safe_uid


class ClaimSource(Protocol):
    """Read access to ResourceClaims in the API server (the cluster adapter implements it)."""

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as JSON (camelCase); raise if it cannot be read (e.g. not found)."""
        ...


def base_request_name(request: str) -> str:
    """``req/sub`` -> ``req``: the kubelet matches container claim requests against base names only."""
    return request.split("/", 1)[0]


def ref_problem(ref: ClaimRef) -> str | None:
    """What is wrong with a claim reference from the kubelet, or None if it is usable."""
    missing = [field for field in ("uid", "namespace", "name") if not getattr(ref, field)]
    if missing:
        return f"claim {ref} has an empty {' and '.join(missing)}: the kubelet must send uid, namespace and name"
    if not is_path_safe_uid(ref.uid):
        # The UID names the claim's files (CDI spec, MPS and metadata directories): it must not name a path.
        return (
            f"claim {ref.namespace}/{ref.name}: UID {ref.uid[:80]!r} is not a Kubernetes UID (letters, digits, '-', "
            "'.' and '_', at most 253); the kubelet sends the claim's metadata.uid"
        )
    return None


def claim_problem(claim: Any, ref: ClaimRef, driver_name: str) -> str | None:
    """What makes a fetched claim unusable for prepare by ``driver_name``, or None if it can be prepared."""
    if not isinstance(claim, Mapping):
        return f"claim {ref}: the API server returned {type(claim).__name__}, not a ResourceClaim object"
    metadata = claim.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    if uid != ref.uid:
        return (
            f"claim {ref.namespace}/{ref.name} was replaced: UID in the API server is {uid or '(none)'}, "
            f"the kubelet asked for {ref.uid}; the kubelet will retry with the current claim"
        )
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not allocation:
        return f"claim {ref} is not allocated (status.allocation is empty): the scheduler has not allocated it yet"
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return f"claim {ref}: status.allocation.devices.results is missing or not a list"
    ours = [r for r in results if isinstance(r, Mapping) and r.get("driver") == driver_name]
    if not ours:
        drivers = sorted({str(r.get("driver")) for r in results if isinstance(r, Mapping)})
        return (
            f"claim {ref} has no devices allocated by driver {driver_name} in "
            "status.allocation.devices.results "
            f"(drivers there: {', '.join(drivers) or 'none'})"
        )
    for result in ours:
        missing = [key for key in ("request", "pool", "device") if not isinstance(result.get(key), str)]
        if missing:
            return f"claim {ref}: an allocation result of driver {driver_name} lacks {', '.join(missing)}"
    return None


def allocated_claim(claim: Mapping[str, Any], ref: ClaimRef, driver_name: str) -> AllocatedClaim:
    """The typed view of a claim that passed :func:`claim_problem`: ``driver_name``'s results and configs."""
    allocation = claim["status"]["allocation"]
    devices = tuple(
        AllocatedDevice(
            request=result["request"],
            pool=result["pool"],
            device=result["device"],
            admin_access=result.get("adminAccess") is True,
            share_id=result["shareID"] if isinstance(result.get("shareID"), str) else None,
            consumed_capacity=_consumed(result.get("consumedCapacity")),
            tolerations=_tolerations(result.get("tolerations")),
        )
        for result in allocation["devices"]["results"]
        if isinstance(result, Mapping) and result.get("driver") == driver_name
    )
    return AllocatedClaim(
        ref=ref,
        devices=devices,
        config=_configs(allocation["devices"].get("config"), driver_name),
        consumers=consumers(claim["status"].get("reservedFor")),
    )


def consumers(entries: Any) -> tuple[ClaimConsumer, ...]:
    """A claim's ``status.reservedFor`` (entries of no known shape skipped)."""
    if not isinstance(entries, list):
        return ()
    return tuple(
        ClaimConsumer(
            resource=str(entry.get("resource") or ""),
            name=str(entry.get("name") or ""),
            uid=str(entry.get("uid") or ""),
            api_group=str(entry.get("apiGroup") or ""),
        )
        for entry in entries
        if isinstance(entry, Mapping)
    )


def _consumed(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        return ()
    return tuple(sorted((str(name), str(value)) for name, value in raw.items()))


def _tolerations(entries: Any) -> tuple[DeviceToleration, ...]:
    """The tolerations the scheduler copied into one allocation result (entries of no known shape skipped)."""
    if not isinstance(entries, list):
        return ()
    return tuple(
        DeviceToleration(
            key=str(entry.get("key") or ""),
            operator=str(entry.get("operator") or "Equal"),
            value=str(entry.get("value") or ""),
            effect=str(entry.get("effect") or ""),
        )
        for entry in entries
        if isinstance(entry, Mapping)
    )


def _configs(entries: Any, driver_name: str) -> tuple[DeviceConfig, ...]:
    """This driver's opaque configs; entries of other drivers (or of no known shape) are not ours to judge."""
    if not isinstance(entries, list):
        return ()
    configs = []
    for entry in entries:
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver_name:
            continue
        requests = entry.get("requests")
        parameters = opaque.get("parameters")
        configs.append(
            DeviceConfig(
                source=str(entry.get("source", "")),
                requests=tuple(str(r) for r in requests) if isinstance(requests, list) else (),
                parameters=parameters if isinstance(parameters, Mapping) else {},
            )
        )
    return tuple(configs)


class ClaimLocks:
    """Per-claim-UID mutual exclusion: disjoint UID sets run concurrently, overlapping ones in turn.

    A set of UIDs is taken all at once (never one by one), so two batches cannot deadlock on each other.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: set[str] = set()
        self._waiting: Counter[str] = Counter()

    @contextmanager
    def hold(self, uids: Collection[str]) -> Iterator[None]:
        """Block until none of ``uids`` is held by anyone else, then hold them all for the ``with`` block."""
        wanted = set(uids)
        with self._changed:
            self._waiting.update(wanted)
            self._changed.notify_all()
            try:
                self._changed.wait_for(lambda: self._held.isdisjoint(wanted))
            finally:
                self._waiting.subtract(wanted)
                self._waiting += Counter()  # drop zero counts so the counter does not grow without bound
            self._held |= wanted
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._held -= wanted
                self._changed.notify_all()

    def waiting(self, uid: str) -> int:
        """How many callers are currently blocked waiting for ``uid``."""
        with self._changed:
            return self._waiting[uid]

    def wait_until_waiting(self, uid: str, count: int, timeout: float) -> bool:
        """Block until at least ``count`` callers wait for ``uid``; False on timeout. Meant for tests."""
        with self._changed:
            return self._changed.wait_for(lambda: self._waiting[uid] >= count, timeout)
