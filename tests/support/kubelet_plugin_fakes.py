"""In-memory stand-ins for the ports of the kubelet-plugin layer: a claim source and a driver handler."""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.plugin.handler import AllocatedClaim, ClaimRef, PreparedDevice, PrepareResult

DRIVER = "gpu.example.com"
CDI_VENDOR = "k8s.gpu.example.com/device"


def make_claim(
    name: str,
    uid: str,
    *,
    namespace: str = "default",
    driver: str = DRIVER,
    results: Sequence[Mapping[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it (JSON, camelCase), allocated to ``driver`` by default."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {},
    }
    if allocated:
        if results is None:
            results = [{"request": "gpu", "driver": driver, "pool": "node-a", "device": "gpu-0"}]
        claim["status"]["allocation"] = {"devices": {"results": [dict(r) for r in results]}}
    return claim


class FakeClaimSource:
    """A ClaimSource over a dict; a claim name in ``errors`` makes its GET raise that exception."""

    def __init__(self, claims: Sequence[dict[str, Any]] = ()) -> None:
        self._lock = threading.Lock()
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: dict[str, Exception] = {}
        for claim in claims:
            self.add(claim)

    def add(self, claim: dict[str, Any]) -> None:
        with self._lock:
            self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            if name in self.errors:
                raise self.errors[name]
            try:
                return copy.deepcopy(self.claims[(namespace, name)])
            except KeyError:
                raise LookupError(f"resourceclaims {namespace}/{name} not found") from None


class FakeHandler:
    """A DriverHandler that reports each allocated device of its driver with one CDI ID per device.

    Test hooks: ``raise_for`` (claim UIDs whose calls raise), ``unprepare_errors`` (UID -> error),
    ``gates`` (UID -> Event the call waits for before finishing). It tracks which UIDs are inside a call now,
    how many calls were ever inside at the same time, and the most calls ever inside for one UID.
    """

    def __init__(self, driver: str = DRIVER) -> None:
        self.driver = driver
        self.raise_for: set[str] = set()
        self.unprepare_errors: dict[str, str] = {}
        self.gates: dict[str, threading.Event] = {}
        self.prepare_batches: list[list[str]] = []
        self.unprepare_batches: list[list[ClaimRef]] = []
        self.changed = threading.Condition()
        self.inside: Counter[str] = Counter()
        self.max_inside_per_uid = 0
        self.max_calls_inside = 0
        self._calls_inside = 0

    def wait_until_inside(self, uid: str, timeout: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.inside[uid] > 0, timeout)

    def _enter(self, uids: list[str]) -> None:
        with self.changed:
            self.inside.update(uids)
            self._calls_inside += 1
            self.max_calls_inside = max(self.max_calls_inside, self._calls_inside)
            self.max_inside_per_uid = max([self.max_inside_per_uid, *(self.inside[u] for u in uids)])
            self.changed.notify_all()

    def _leave(self, uids: list[str]) -> None:
        with self.changed:
            self.inside.subtract(uids)
            self._calls_inside -= 1
            self.changed.notify_all()

    def _run_gates(self, uids: list[str]) -> None:
        for uid in uids:
            gate = self.gates.get(uid)
            if gate is not None and not gate.wait(30):
                raise TimeoutError(f"test gate for {uid} was never opened")

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        uids = [claim.uid for claim in claims]
        self.prepare_batches.append(uids)
        self._enter(uids)
        try:
            self._run_gates(uids)
            bad = self.raise_for.intersection(uids)
            if bad:
                raise RuntimeError(f"simulated driver failure for {sorted(bad)}")
            results = {}
            for claim, uid in zip(claims, uids, strict=True):
                devices = tuple(
                    PreparedDevice(
                        pool=r.pool,
                        device=r.device,
                        requests=(r.request,),
                        cdi_device_ids=(f"{CDI_VENDOR}={uid}-{r.device}",),
                        share_id=r.share_id,
                    )
                    for r in claim.devices
                )
                results[uid] = PrepareResult(devices=devices)
            return results
        finally:
            self._leave(uids)

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        uids = [claim.uid for claim in claims]
        self.unprepare_batches.append(list(claims))
        self._enter(uids)
        try:
            self._run_gates(uids)
            bad = self.raise_for.intersection(uids)
            if bad:
                raise RuntimeError(f"simulated driver failure for {sorted(bad)}")
            return {uid: self.unprepare_errors.get(uid) for uid in uids}
        finally:
            self._leave(uids)
