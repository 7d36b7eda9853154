"""The ResourceSlice publisher: keeps the API server's slices of one driver on one node as desired.

It mirrors the ``resourceslice`` controller of the Go ``kubeletplugin`` helper and knows nothing about the
devices it publishes. See docs/publishing.md for the rules it follows.

Layout and naming. Each desired pool is a list of :class:`SliceSpec`; slice *i* of a pool becomes one
ResourceSlice created with ``generateName: <i as 5 hex digits>-<driver>-<node>-``. Slices are matched to
desired ones by (``spec.pool.name``, the index at the front of ``metadata.name``): both are immutable, so an
edit by someone else cannot confuse the matching, and the index survives the API server's truncation of long
generated names. A slice of our driver and node that matches nothing is obsolete and is deleted.

Generations. A pool starts from the highest generation among its existing slices; slices of older
generations are deleted. The generation is bumped by one when a slice must be created, a slice of the
current generation must be deleted, or more than one slice must be updated; all slices of a pool then carry
the same ``{name, generation, resourceSliceCount}``.

Writes happen in the order: delete (with uid and resourceVersion preconditions), update, create. Every desired
object is built fresh; only ``metadata.name`` and ``metadata.resourceVersion`` are taken from the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import tenacity

from dradriver.plugin.cluster import (
    RESOURCE_SLICE_API_VERSION,
    ApiUnavailableError,
    Cluster,
    ClusterError,
    JsonObject,
    NotFoundError,
    WatchStream,
)
from dradriver.quantity import parse_quantity
from dradriver.validation.slices import Problem, SliceShape, validate_pool

log = logging.getLogger(__name__)

_INDEX = re.compile(r"^([0-9a-f]{5})-")
# Consecutive passes that may still have to write before the publisher backs off as after a failure; guards
# against someone else who keeps changing what we write (each of our writes would otherwise trigger the next).
_MAX_PASSES = 3


def copy_json(value: Any) -> Any:
    """A deep copy of a value in JSON form: mappings become dicts, lists and tuples lists; anything else is
    immutable there and shared. Three times faster than ``copy.deepcopy``, which dominated publishing a node's
    slices (copies are made for every slice of every pass)."""
    kind = type(value)  # exact type tests first: isinstance against Mapping is slow, and most values are leaves
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [copy_json(item) for item in value]
    if kind in _JSON_SCALARS or not isinstance(value, Mapping):
        return value
    return {key: copy_json(item) for key, item in value.items()}


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


@runtime_checkable
class ClientModel(Protocol):
    """A ``kubernetes`` client model (a pydantic model), known by its method: importing pydantic to recognise one
    would load it into every node driver, which never passes one (docs/reliability.md, memory)."""

    def model_dump(self, *, by_alias: bool, exclude_none: bool, mode: str) -> dict[str, Any]: ...


def to_json_form(obj: Mapping[str, Any] | ClientModel) -> JsonObject:
    """A Kubernetes object or part of one in JSON form: a deep copy of a dict, or a ``kubernetes`` client
    model serialised with its camelCase names and without unset fields."""
    if not isinstance(obj, Mapping) and isinstance(obj, ClientModel):
        dumped: JsonObject = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped
    copied: JsonObject = copy_json(obj)
    return copied


@dataclass(frozen=True)
class SliceSpec:
    """The content of one ResourceSlice: devices (JSON form) and/or shared counter sets (JSON form).

    From Kubernetes 1.35 a slice carries either devices or counter sets, not both: put counter sets in a
    slice of their own in the same pool. ``kubernetes`` client models (``V1Device``, ``V1CounterSet``) are
    accepted and converted.

    Kept as JSON text, decoded into a fresh copy at each use: a node's devices as dicts took several times the
    memory of their text (2.6 MB against about 0.4 for the 208 devices of a dynamic-MIG H100 node), held for
    the driver's whole life, and ``json.loads`` copies faster than :func:`copy_json` (docs/reliability.md)."""

    devices_json: str = "[]"
    shared_counters_json: str = "[]"
    device_count: int = 0

    @classmethod
    def of(
        cls,
        devices: Iterable[Mapping[str, Any] | ClientModel] = (),
        shared_counters: Iterable[Mapping[str, Any] | ClientModel] = (),
    ) -> SliceSpec:
        """A spec from dicts or client models (both converted to an independent JSON form)."""
        listed = [to_json_form(d) for d in devices]
        return cls(
            devices_json=_compact(listed),
            shared_counters_json=_compact([to_json_form(c) for c in shared_counters]),
            device_count=len(listed),
        )

    @property
    def devices(self) -> tuple[JsonObject, ...]:
        """The devices, a fresh copy at each call."""
        return tuple(json.loads(self.devices_json))

    @property
    def shared_counters(self) -> tuple[JsonObject, ...]:
        """The counter sets, a fresh copy at each call."""
        return tuple(json.loads(self.shared_counters_json))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


DesiredPools = Mapping[str, Sequence[SliceSpec]]


@dataclass(frozen=True)
class Backoff:
    """Retry delays: exponential from ``initial`` seconds, doubling, capped at ``maximum``, plus up to
    ``jitter`` seconds of randomness so that many nodes do not retry in step."""

    initial: float = 0.5
    maximum: float = 60.0
    jitter: float = 0.5


@dataclass(frozen=True)
class PublisherStatus:
    """A snapshot of how publishing goes. ``ready``: the last pass succeeded and every pool was valid."""

    ready: bool
    last_error: str | None
    last_success: datetime | None
    last_attempt: datetime | None
    consecutive_failures: int
    invalid_pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    generations: Mapping[str, int] = field(default_factory=dict)
    taints_dropped: bool = False  # the API server stores slices without devices[].taints (gate off)
    counters_dropped: bool = False  # ... without sharedCounters/consumesCounters (DRAPartitionableDevices off)


@dataclass(frozen=True)
class SyncResult:
    """What one reconcile pass did, and the resourceVersion of the list it started from."""

    created: int
    updated: int
    deleted: int
    resource_version: str

    @property
    def writes(self) -> int:
        """How many write requests the pass made."""
        return self.created + self.updated + self.deleted


class _Interrupted(Exception):
    """Internal: a backoff sleep was cut short by stop()."""


class _StillChanging(Exception):
    """Internal: the slices still needed writes after :data:`_MAX_PASSES` passes; back off before the next."""


def slice_index(name: str) -> int | None:
    """The slice index at the front of a name we generated (``0000a-…`` → 10), or None."""
    match = _INDEX.match(name)
    return int(match.group(1), 16) if match else None


def _normalised_spec(spec: Mapping[str, Any]) -> Any:
    """The spec with every quantity replaced by its numeric value, for comparing what we want with what the
    server stored (the server rewrites quantities in canonical form, e.g. ``1024Mi`` as ``1Gi``)."""
    spec = copy_json(spec)

    def fix(value: Any) -> Any:
        parsed = parse_quantity(value)
        return str(parsed) if parsed is not None else value

    def fix_counters(counters: Any) -> None:
        for counter in (counters or {}).values():
            if isinstance(counter, dict) and "value" in counter:
                counter["value"] = fix(counter["value"])

    for counter_set in spec.get("sharedCounters") or []:
        fix_counters(counter_set.get("counters"))
    for device in spec.get("devices") or []:
        for capacity in (device.get("capacity") or {}).values():
            if not isinstance(capacity, dict):
                continue
            capacity["value"] = fix(capacity.get("value"))
            policy = capacity.get("requestPolicy") or {}
            if "default" in policy:
                policy["default"] = fix(policy["default"])
            if "validValues" in policy:
                policy["validValues"] = [fix(v) for v in policy["validValues"]]
            for bound in ("min", "max", "step"):
                if bound in (policy.get("validRange") or {}):
                    policy["validRange"][bound] = fix(policy["validRange"][bound])
        for entry in device.get("consumesCounters") or []:
            fix_counters(entry.get("counters"))
    return spec


def _fingerprint(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _has_taints(spec: Mapping[str, Any]) -> bool:
    return any(device.get("taints") for device in spec.get("devices") or [])


def _has_counters(spec: Mapping[str, Any]) -> bool:
    return bool(spec.get("sharedCounters")) or any(d.get("consumesCounters") for d in spec.get("devices") or [])


def _without_counter_consumers(devices: Iterable[Mapping[str, Any]]) -> list[JsonObject]:
    """``devices`` for a server that drops shared counters: without the devices that consume them. Stripped of
    their counters they would look independent, and the scheduler could hand out a whole GPU and a MIG device
    on it, or two overlapping MIG placements, to different claims."""
    return [copy_json(dict(d)) for d in devices if not d.get("consumesCounters")]


def _without_taints(devices: Iterable[Mapping[str, Any]], *, withdraw: bool) -> list[JsonObject]:
    """``devices`` for a server that drops taints: without them, and without the devices a taint keeps pods
    away from when ``withdraw`` (so new pods avoid those devices either way)."""
    kept: list[JsonObject] = []
    for device in devices:
        taints = device.get("taints") or []
        if withdraw and any(t.get("effect") in BLOCKING_TAINT_EFFECTS for t in taints):
            continue
        kept.append({k: copy_json(v) for k, v in device.items() if k != "taints"})
    return kept


def _carry_taint_times(desired: JsonObject, existing: Mapping[str, Any]) -> None:
    """Keep the server-set ``timeAdded`` of taints whose key, value and effect did not change, as the Go
    helper does; otherwise every pass would see a difference and update."""
    times: dict[tuple[Any, ...], Any] = {}
    for device in (existing.get("spec") or {}).get("devices") or []:
        for taint in device.get("taints") or []:
            key = (device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))
            times[key] = taint.get("timeAdded")
    for device in desired["spec"].get("devices") or []:
        for taint in device.get("taints") or []:
            key = (device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))
            if "timeAdded" not in taint and times.get(key):
                taint["timeAdded"] = times[key]


@dataclass(frozen=True, kw_only=True)
class PublisherOptions:
    """Whose slices a :class:`Publisher` keeps, and how: the driver and node that own them, the Node's UID for
    their owner reference (garbage collection with the Node), the API server's slice layout, retry delays, how
    long one watch lasts, and whether devices with taints are withdrawn where the server drops taints."""

    driver: str
    node_name: str
    node_uid: str | None = None
    shape: SliceShape = SliceShape.V1_35
    backoff: Backoff = field(default_factory=Backoff)
    watch_timeout_seconds: int = 300
    withdraw_tainted_if_dropped: bool = True


class Publisher:
    """Publishes desired pools as ResourceSlices of ``options.driver`` on ``options.node_name`` and keeps them
    there.

    Call :meth:`start` to run in a background thread (it re-publishes after changes by others, seen through
    a watch), or :meth:`reconcile` for one synchronous pass. ``sleep`` (called with the backoff delay in
    seconds) and ``clock`` (monotonic seconds) are seams for tests; the default sleep is cut short by
    :meth:`update`, :meth:`sync_now` and :meth:`stop`.
    """

    def __init__(
        self,
        cluster: Cluster,
        options: PublisherOptions,
        *,
        pools: DesiredPools | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cluster = cluster
        self._driver = options.driver
        self._node_name = options.node_name
        self._node_uid = options.node_uid
        self._shape = options.shape
        self._backoff = options.backoff
        self._sleep = sleep
        self._clock = clock
        self._watch_timeout = options.watch_timeout_seconds
        self._withdraw_tainted = options.withdraw_tainted_if_dropped
        self._taints_dropped = False
        self._counters_dropped = False

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._pools: dict[str, tuple[SliceSpec, ...]] = {}
        self._invalid: dict[str, tuple[Problem, ...]] = {}
        # Bumped by update()/sync_now(); a pass that started after request N and wrote nothing syncs N.
        self._requested = 1
        self._synced = 0
        # (pool, index) -> (fingerprint of what we asked for, fingerprint of what the server kept instead).
        self._adopted: dict[tuple[str, int], tuple[str, str]] = {}
        self._generations: dict[str, int] = {}
        self._last_error: str | None = None
        self._last_success: datetime | None = None
        self._last_attempt: datetime | None = None
        self._failures = 0
        self._set_pools(pools or {})

    # -- public API ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start publishing in a background thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"slice-publisher-{self._driver}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread and wait up to ``timeout`` seconds for it. Slices stay published."""
        self._stopping.set()
        self._interrupt()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def update(self, pools: DesiredPools) -> None:
        """Replace the desired state; the background thread publishes it promptly. Pools that break the
        API server's rules are not published (their slices are left as they are); see :attr:`status`."""
        self._set_pools(pools)
        self.sync_now()

    def sync_now(self) -> None:
        """Ask the background thread for a full pass (list, compare, write) now."""
        with self._lock:
            self._requested += 1
        self._interrupt()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until a pass that started after the latest :meth:`update`/:meth:`sync_now` finished with
        nothing left to write. False if that did not happen within ``timeout`` seconds."""
        with self._lock:
            target = self._requested
            return self._changed.wait_for(lambda: self._synced >= target, timeout)

    @property
    def status(self) -> PublisherStatus:
        """The current :class:`PublisherStatus`."""
        with self._lock:
            return PublisherStatus(
                ready=self._last_error is None and not self._invalid and self._last_success is not None,
                last_error=self._last_error,
                last_success=self._last_success,
                last_attempt=self._last_attempt,
                consecutive_failures=self._failures,
                invalid_pools={k: tuple(str(p) for p in v) for k, v in self._invalid.items()},
                generations=dict(self._generations),
                taints_dropped=self._taints_dropped,
                counters_dropped=self._counters_dropped,
            )

    def reconcile(self) -> SyncResult:
        """One pass: list our slices, then delete, update and create so every valid desired pool is
        published and nothing else is. Raises :class:`ClusterError` if a request fails. For use without
        :meth:`start` (the background thread calls it itself)."""
        with self._lock:
            pools = dict(self._pools)
            invalid = set(self._invalid)
            self._last_attempt = datetime.now(UTC)
        try:
            result = self._reconcile(pools, invalid)
        except Exception as exc:
            # Anything, not only ClusterError: a slice the server sent in an unexpected shape must show up
            # in the status instead of silently ending publishing.
            with self._lock:
                self._last_error = str(exc) if isinstance(exc, ClusterError) else f"{type(exc).__name__}: {exc}"
                self._failures += 1
            raise
        with self._lock:
            self._last_error = None
            self._failures = 0
            self._last_success = datetime.now(UTC)
        return result

    # -- desired state -----------------------------------------------------------------------------------

    def _set_pools(self, pools: DesiredPools) -> None:
        normalised: dict[str, tuple[SliceSpec, ...]] = {}
        invalid: dict[str, tuple[Problem, ...]] = {}
        for name, slices in pools.items():
            specs = tuple(slices) or (SliceSpec(),)
            normalised[name] = specs
            objects = [self._desired(name, i, len(specs), specs[i], generation=1) for i in range(len(specs))]
            problems = validate_pool(objects, shape=self._shape)
            if problems:
                invalid[name] = tuple(problems)
                for problem in problems:
                    log.error(
                        "pool not published: invalid slice pool=%s slice=%s device=%s field=%s rule=%s problem=%s",
                        name,
                        problem.slice,
                        problem.device,
                        problem.field,
                        problem.rule,
                        problem.message,
                    )
        with self._lock:
            self._pools = normalised
            self._invalid = invalid

    def _desired(self, pool: str, index: int, count: int, spec: SliceSpec, *, generation: int) -> JsonObject:
        slice_spec: JsonObject = {
            "driver": self._driver,
            "nodeName": self._node_name,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        }
        devices: list[JsonObject] = json.loads(spec.devices_json)  # a fresh copy, ours to change
        if self._taints_dropped:
            devices = _without_taints(devices, withdraw=self._withdraw_tainted)
        if self._counters_dropped:
            devices = _without_counter_consumers(devices)
        if devices:
            slice_spec["devices"] = devices
        counters: list[JsonObject] = json.loads(spec.shared_counters_json)
        if counters and not self._counters_dropped:
            slice_spec["sharedCounters"] = counters
        return {
            "apiVersion": RESOURCE_SLICE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{index:05x}-{self._driver}-{self._node_name}-",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self._node_name,
                        "uid": self._node_uid or "",
                        "controller": True,
                    }
                ],
            },
            "spec": slice_spec,
        }

    # -- one pass ------------------------------------------------------------------------------------------

    def _owner_ok(self, existing: Mapping[str, Any]) -> bool:
        refs = (existing.get("metadata") or {}).get("ownerReferences") or []
        return any(
            r.get("kind") == "Node" and r.get("uid") == self._node_uid and r.get("controller") is True for r in refs
        )

    def _same(self, pool: str, index: int, desired: JsonObject, existing: Mapping[str, Any]) -> bool:
        if not self._owner_ok(existing):
            return False
        want = _fingerprint(_normalised_spec(desired["spec"]))
        have = _fingerprint(_normalised_spec(existing.get("spec") or {}))
        return want == have or self._adopted.get((pool, index)) == (want, have)

    def _note_stored(self, pool: str, index: int, desired: JsonObject, stored: Mapping[str, Any]) -> None:
        """Remember when the server keeps something other than what we wrote (a feature gate that drops
        fields, defaulting we do not know), so that we do not rewrite the same slice forever."""
        if (
            not self._counters_dropped
            and _has_counters(desired["spec"])
            and not _has_counters(stored.get("spec") or {})
        ):
            # Kubernetes 1.33-1.35 store counters only with the DRAPartitionableDevices gate on. Said once (an
            # error: those devices are not offered); the next pass withdraws them.
            self._counters_dropped = True
            log.error(
                "API server dropped the slices' shared counters: withdrawing the devices that consume them (dynamic "
                "MIG devices, and whole GPUs that can be partitioned), which it could not keep apart; turn the "
                "DRAPartitionableDevices feature gate on (API server and scheduler; Kubernetes 1.33-1.35) and "
                "restart the plugin, or run with --mig-mode static pool=%s",
                pool,
            )
            return
        if not self._taints_dropped and _has_taints(desired["spec"]) and not _has_taints(stored.get("spec") or {}):
            # Said once: from now on taints are left out, and tainted devices withdrawn if so configured (the
            # next pass writes that).
            self._taints_dropped = True
            log.warning(
                "API server dropped devices[].taints (feature gate DRADeviceTaints off?); %s pool=%s",
                "withdrawing tainted devices from the slices instead"
                if self._withdraw_tainted
                else "tainted devices stay offered (withdrawal is switched off)",
                pool,
            )
            return
        want = _fingerprint(_normalised_spec(desired["spec"]))
        have = _fingerprint(_normalised_spec(stored.get("spec") or {}))
        if want != have:
            log.warning(
                "API server stored a different slice than sent (a disabled feature gate?); adopting it "
                "pool=%s slice=%s",
                pool,
                (stored.get("metadata") or {}).get("name"),
            )
            self._adopted[(pool, index)] = (want, have)
        else:
            self._adopted.pop((pool, index), None)

    def _reconcile(self, pools: Mapping[str, tuple[SliceSpec, ...]], invalid: set[str]) -> SyncResult:
        if not self._node_uid:
            node = self._cluster.get_node(self._node_name)
            self._node_uid = str((node.get("metadata") or {}).get("uid") or "")
        existing, resource_version = self._cluster.list_resource_slices(driver=self._driver, node_name=self._node_name)
        by_pool: dict[str, list[JsonObject]] = {}
        for obj in existing:
            name = str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))
            by_pool.setdefault(name, []).append(obj)
        created = updated = deleted = 0
        for pool in sorted(set(by_pool) | set(pools)):
            if pool in invalid:
                continue
            c, u, d = self._sync_pool(pool, pools.get(pool, ()), by_pool.get(pool, []))
            created, updated, deleted = created + c, updated + u, deleted + d
        return SyncResult(created, updated, deleted, resource_version)

    def _sync_pool(self, pool: str, specs: Sequence[SliceSpec], existing: list[JsonObject]) -> tuple[int, int, int]:
        generation = max((_generation(e) for e in existing), default=0)
        obsolete = [e for e in existing if _generation(e) < generation]
        current = sorted((e for e in existing if _generation(e) == generation), key=_name)
        matched: dict[int, JsonObject] = {}
        for obj in current:
            index = slice_index(_name(obj))
            if index is None or index >= len(specs) or index in matched:
                obsolete.append(obj)
            else:
                matched[index] = obj
        obsolete_current = any(_generation(o) == generation for o in obsolete)
        missing = [i for i in range(len(specs)) if i not in matched]

        def want(index: int, gen: int) -> JsonObject:
            desired = self._desired(pool, index, len(specs), specs[index], generation=gen)
            if index in matched:
                _carry_taint_times(desired, matched[index])
            return desired

        changed = [i for i in sorted(matched) if not self._same(pool, i, want(i, generation), matched[i])]
        if missing or obsolete_current or len(changed) > 1:
            generation += 1
            changed = sorted(matched)
        if specs:
            self._generations[pool] = generation
        else:
            self._generations.pop(pool, None)

        for obj in obsolete:
            meta = obj.get("metadata") or {}
            log.info("deleting obsolete slice pool=%s slice=%s", pool, meta.get("name"))
            # Someone else deleting it first is just what we wanted.
            with contextlib.suppress(NotFoundError):
                self._cluster.delete_resource_slice(
                    str(meta.get("name")),
                    uid=str(meta.get("uid")),
                    resource_version=str(meta.get("resourceVersion")),
                )
        for index in changed:
            desired = want(index, generation)
            meta = matched[index]["metadata"]
            desired["metadata"]["name"] = meta["name"]
            desired["metadata"]["resourceVersion"] = meta["resourceVersion"]
            log.info("updating slice pool=%s slice=%s generation=%d", pool, meta["name"], generation)
            stored = self._cluster.update_resource_slice(desired)
            self._note_stored(pool, index, want(index, generation), stored)
        for index in missing:
            desired = want(index, generation)
            stored = self._cluster.create_resource_slice(desired)
            log.info(
                "created slice pool=%s slice=%s generation=%d devices=%d",
                pool,
                _name(stored),
                generation,
                specs[index].device_count,
            )
            self._note_stored(pool, index, desired, stored)
        return len(missing), len(changed), len(obsolete)

    # -- background loop -----------------------------------------------------------------------------------

    def _interrupt(self) -> None:
        self._wake.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def _backoff_sleep(self, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._wake.wait(seconds)
        if self._stopping.is_set():
            raise _Interrupted

    def _run(self) -> None:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            error = outcome.exception() if outcome is not None else None
            delay = state.next_action.sleep if state.next_action else 0.0
            log.log(
                logging.WARNING if isinstance(error, ClusterError) else logging.ERROR,
                "publishing slices failed; retrying driver=%s node=%s attempt=%d delay_s=%.2f error=%s",
                self._driver,
                self._node_name,
                state.attempt_number,
                delay,
                error,
            )

        while not self._stopping.is_set():
            retrying = tenacity.Retrying(
                # Every failure is retried with backoff: the thread must keep publishing, not die.
                retry=tenacity.retry_if_not_exception_type(_Interrupted),
                wait=tenacity.wait_exponential(multiplier=self._backoff.initial, max=self._backoff.maximum)
                + tenacity.wait_random(0, self._backoff.jitter),
                stop=tenacity.stop_when_event_set(self._stopping),
                sleep=self._backoff_sleep,
                before_sleep=before_sleep,
                reraise=True,
            )
            try:
                retrying(self._cycle)
            except Exception:
                if not self._stopping.is_set():
                    log.exception("slice publisher stopped unexpectedly node=%s", self._node_name)
                    raise
        with self._lock:
            self._changed.notify_all()

    def _cycle(self) -> None:
        """Sync until nothing is left to write, then watch until something changes. Returns normally when
        a new pass is due; raises ClusterError when a request failed, or _StillChanging when the slices would not
        settle (the caller backs off)."""
        for _ in range(_MAX_PASSES):
            self._wake.clear()
            with self._lock:
                started_for = self._requested
            result = self.reconcile()
            if result.writes == 0:
                with self._lock:
                    self._synced = max(self._synced, started_for)
                    self._changed.notify_all()
                break
        else:
            # Watching now would start from a list older than our own last writes and wake at once, so
            # back off instead: two writers fighting over the slices must not spin.
            raise _StillChanging(
                f"ResourceSlices of driver {self._driver} on node {self._node_name} still needed writes after "
                f"{_MAX_PASSES} passes: something else keeps changing them (another instance of this driver "
                "with a different plugin directory?); stop the other writer"
            )
        if self._stopping.is_set() or self._wake.is_set():
            return
        self._watch(result.resource_version)

    def _watch(self, resource_version: str) -> None:
        started = self._clock()
        stream = self._cluster.watch_resource_slices(
            driver=self._driver,
            node_name=self._node_name,
            resource_version=resource_version,
            timeout_seconds=self._watch_timeout,
        )
        with self._lock:
            self._stream = stream
        try:
            if self._wake.is_set():
                return
            for event in stream:
                if event.type == "BOOKMARK":
                    continue
                log.info(
                    "slice changed by someone else; re-syncing event=%s slice=%s",
                    event.type,
                    (event.object.get("metadata") or {}).get("name"),
                )
                return
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        if self._wake.is_set() or self._stopping.is_set():
            return
        # A watch the server ends long before its timeout (a dropped connection, a restarting server) is
        # treated as an error so that the next list and watch wait for the backoff instead of spinning.
        if self._clock() - started < self._watch_timeout / 2:
            raise ApiUnavailableError(f"watch of ResourceSlices on {self._node_name} ended early")


def _generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) else 0


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
