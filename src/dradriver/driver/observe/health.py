"""Device health from NVML events: the kubelet's health stream (KEP-4680), device taints, refusal and recovery.

Every fault becomes a *condition* on a GPU (or on one GPU instance of it), with one cause: a critical XID, a
double-bit ECC error, the GPU falling off the bus, or health that can no longer be watched. A device's health is
the conditions of its GPU (MIG devices and partitions inherit their parent's; an XID that names one GPU instance
hurts that MIG device and the whole GPU, not the siblings). Each condition is

- a line in the health stream (UNHEALTHY, or UNKNOWN when health is not watched),
- a taint on the published device (``<driver>/<cause>``, the XID or ECC count as value, ``timeAdded`` = first
  seen), which keeps the scheduler away from it,
- a reason for prepare to refuse new claims on the device (``problem``).

Conditions clear without a restart: a GPU whose reset the monitor sees (it answers again after being lost, its
volatile ECC counter went back down, or NVML's recovery action asked for a reset and reads "none" again) and whose
probe is clean is healthy again at the next probe; any other condition clears once ``recovery_period`` seconds
pass without a new event while the GPU answers its probe. When the event wait fails, the monitor registers for
events anew with a growing delay, and ``unmonitored`` clears once that works. The conditions are kept in a small
JSON file, so a restarted driver (and ``dradriver inventory``) still knows them.
See docs/health.md for the policy and why each XID is where it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.atomic_files import sweep_dead_writers, temp_file_for
from dradriver.driver.observe.metrics import DEVICE_HEALTH, GPU_EVENTS, XID_ERRORS
from dradriver.errors import ConfigError
from dradriver.gpu.errors import GpuError, GpuIsLost
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, Inventory, LostGpu, MigMode
from dradriver.gpu.models import GpuEvent, GpuProbe
from dradriver.gpu.products import APPLICATION_XIDS, HARDWARE_XIDS
from dradriver.plugin.handler import DeviceHealth, DeviceToleration, HealthBoard, HealthStatus

log = logging.getLogger(__name__)

# XIDs an application causes add an informational taint (effect None) and nothing else; hardware XIDs always make
# a GPU unhealthy, even when --health-ignore-xids lists them.
DEFAULT_IGNORED_XIDS: dict[int, str] = APPLICATION_XIDS
DEFAULT_FATAL_XIDS: dict[int, str] = HARDWARE_XIDS
DEFAULT_RECOVERY_PERIOD = 600.0
DEFAULT_PROBE_INTERVAL = 5.0
STATE_KIND = "dradriver-health-state"
STATE_VERSION = 1
ALL_GPUS = "*"  # the GPU of a condition that NVML could not attribute to one GPU
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values: none, and those that a GPU reset (or a reboot, which resets it) ends.
RECOVERY_ACTION_NONE = 0
RESET_ACTIONS = frozenset({1, 2, 4, 6, 7})  # GPU reset, node reboot, drain and reset, bus reset, system reboot
DEFAULT_REWATCH_BACKOFF = (5.0, 300.0)  # first and longest delay between tries to register for events again


class Cause(StrEnum):
    """What a condition is about; each cause is one taint key, ``<driver>/<cause>``."""

    XID = "xid"
    ECC = "ecc"
    LOST = "gpu-lost"
    UNMONITORED = "unmonitored"


class TaintEffect(StrEnum):
    """``resource.k8s.io/v1`` DeviceTaint effects; ``None`` only informs, it keeps no pod away."""

    NONE = "None"
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class HealthPolicy:
    """What the monitor makes of events. ``recovery_period`` 0 means conditions clear only after a reset."""

    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    fatal_xids: frozenset[int] = frozenset(DEFAULT_FATAL_XIDS)
    taint_effect: TaintEffect = TaintEffect.NO_SCHEDULE
    recovery_period: float = DEFAULT_RECOVERY_PERIOD
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    taint_domain: str = DEFAULT_DRIVER_NAME

    def __post_init__(self) -> None:
        if self.taint_effect is TaintEffect.NONE:
            raise ConfigError(
                "--health-taint-effect None would keep no pod away from a broken GPU: use NoSchedule or NoExecute"
            )
        if not self.recovery_period >= 0 or self.recovery_period == float("inf"):
            raise ConfigError(
                f"--health-recovery-period {self.recovery_period}: seconds, 0 or more (0: only a reset clears)"
            )
        if not 0 < self.probe_interval < float("inf"):
            raise ConfigError(f"health probe interval {self.probe_interval}: seconds, more than 0")

    def ignores(self, xid: int) -> bool:
        return xid in self.ignored_xids and xid not in self.fatal_xids


def parse_xids(text: str, flag: str) -> frozenset[int]:
    """``"13,31, 43"`` → {13, 31, 43}, or a ConfigError naming ``flag`` and the bad part."""
    xids: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            xid = int(part)
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {part!r} is not an XID number; give a comma-separated list") from None
        if not 1 <= xid <= 999:
            raise ConfigError(f"{flag} {text!r}: XID {xid} is outside 1..999")
        xids.add(xid)
    return frozenset(xids)


@dataclass(frozen=True)
class Condition:
    """One fault on a GPU (``gpu_uuid``; ``ALL_GPUS`` when NVML could not say which), or on one GPU instance."""

    gpu_uuid: str
    cause: Cause
    value: str  # the taint value: the XID, the ECC error count, "" or "unattributed"
    effect: TaintEffect
    since: float  # Unix seconds, first seen
    last_seen: float
    message: str
    count: int = 1
    gpu_instance_id: int | None = None
    ecc_seen: int | None = None  # volatile uncorrectable ECC count last read while the condition held
    reset_pending: bool = False  # NVML's recovery action asked for a reset while the condition held

    @property
    def unhealthy(self) -> bool:
        return self.effect is not TaintEffect.NONE

    @property
    def key(self) -> tuple[str, Cause, bool, int | None]:
        return (self.gpu_uuid, self.cause, self.unhealthy, self.gpu_instance_id)


@dataclass(frozen=True)
class _Device:
    gpu_uuid: str
    gpu_instance_id: int | None  # an existing MIG device's GPU instance; None for a GPU or a partition to carve


@dataclass
class _State:
    devices: dict[str, _Device] = field(default_factory=dict)
    conditions: dict[tuple[str, Cause, bool, int | None], Condition] = field(default_factory=dict)
    # Every GPU seen: NVML index → (UUID, device name), to name a GPU that is lost before it can be read again.
    gpus: dict[int, tuple[str, str]] = field(default_factory=dict)


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GpuHealth:
    """A ``HealthSource`` for the plugin layer (through its ``HealthBoard``), the source of device taints and of
    prepare's refusals, fed by ``handle(event)`` or by its own monitor thread (``start``)."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        mig_mode: MigMode,
        pool: str,
        policy: HealthPolicy | None = None,
        state_path: Path | None = None,
        save_state: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``state_path``: where conditions are kept across restarts (read at start, written on each change
        unless not ``save_state``, as for ``dradriver inventory``, which only reads what the driver saved)."""
        self.pool = pool
        self.policy = policy or HealthPolicy()
        self._state_path = state_path
        self._clock = clock
        self._lock = threading.Lock()
        self._state = _State()
        self._board = HealthBoard()
        self._published: tuple[Any, ...] | None = None  # what subscribers last heard, to tell them only of changes
        self._unreadable: set[int] = set()  # NVML indices of GPUs lost before they could be read
        self._counted: int | None = None  # how many GPUs NVML counted at the last inventory (None: none yet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if state_path is not None:
            self._state.conditions, self._state.gpus = _load_state(state_path)
        # Nothing is written while starting: a second instance that is about to be refused must not touch it.
        self._save_state = False
        self.update_inventory(inventory, mig_mode)
        self._save_state = save_state

    # --- inventory ------------------------------------------------------------------------------------------

    def update_inventory(self, inventory: Inventory, mig_mode: MigMode) -> None:
        """Report the devices of a fresh inventory. Devices of a lost GPU stay listed (unhealthy) with the names
        they had, so pods using them see why; a GPU that discovery found lost gets a ``gpu-lost`` condition."""
        now = self._clock()
        with self._lock:
            devices: dict[str, _Device] = {}
            for device in inventory.devices(mig_mode):
                if isinstance(device, GpuDevice):
                    devices[device.name] = _Device(device.uuid, None)
                else:
                    gi = device.existing.gpu_instance_id if device.existing else None
                    devices[device.name] = _Device(device.parent.uuid, gi)
            self._remember_indices(inventory)
            self._unreadable = {g.index for g in inventory.lost_gpus if g.uuid is None}
            lost = {g.uuid: g for g in self._named(inventory.lost_gpus) if g.uuid is not None}
            for name, known in self._state.devices.items():
                if known.gpu_uuid in lost and name not in devices:
                    devices[name] = known
            for uuid, missing in lost.items():
                if missing.name is not None:
                    devices.setdefault(missing.name, _Device(uuid, None))
                if not any(c.gpu_uuid == uuid and c.cause is Cause.LOST for c in self._state.conditions.values()):
                    message = f"GPU {uuid} is lost: {missing.reason}"
                    self._add(Condition(uuid, Cause.LOST, "", self.policy.taint_effect, now, now, message))
            self._state.devices = devices
        self._changed()

    def _remember_indices(self, inventory: Inventory) -> None:
        """Record which GPU each NVML index names (caller holds the lock). Indices hold within one enumeration only:
        NVML started again (after a release for a passthrough unbind, or a restart) counts the GPUs afresh, and one
        on ``vfio-pci`` then is not counted, so the others shift. Where a GPU read now sits at another index than
        recorded, or an index recorded for another GPU, or the count changed, the old indices are forgotten: a GPU
        lost before it could be read stays unnamed rather than named after the GPU that sat at its index before."""
        seen = {gpu.info.index: (gpu.uuid, gpu.name) for gpu in inventory.gpus}
        seen.update({g.index: (g.uuid, g.name) for g in inventory.lost_gpus if g.uuid is not None and g.name})
        count = 1 + max([*seen, *(g.index for g in inventory.lost_gpus)], default=-1)
        known = self._state.gpus
        where = {uuid: index for index, (uuid, _name) in known.items()}
        moved = any(known.get(i, entry)[0] != entry[0] or where.get(entry[0], i) != i for i, entry in seen.items())
        if moved or (self._counted is not None and count != self._counted):
            self._state.gpus = {}
        self._state.gpus.update(seen)
        self._counted = count

    def _named(self, lost: Iterable[LostGpu]) -> list[LostGpu]:
        return [
            replace(g, uuid=self._state.gpus[g.index][0], name=self._state.gpus[g.index][1])
            if g.uuid is None and g.index in self._state.gpus
            else g
            for g in lost
        ]

    def lost_gpus(self, inventory: Inventory) -> list[LostGpu]:
        """``inventory.lost_gpus``, named where this node's GPU was seen before (at this index)."""
        with self._lock:
            return self._named(inventory.lost_gpus)

    # --- what others read -----------------------------------------------------------------------------------

    def device_health(self) -> Sequence[DeviceHealth]:
        # Stamped now: while the monitor runs, what it reports holds as of this moment.
        now = int(self._clock())
        return [replace(d, last_updated=now) for d in self._board.device_health()]

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self._board.subscribe(callback)

    def taints(self, device: str) -> list[dict[str, Any]]:
        """The device's taints in ``resource.k8s.io/v1`` JSON form, one per (key, effect), most severe first."""
        with self._lock:
            conditions = self._conditions_of(device)
        taints: dict[tuple[str, str], dict[str, Any]] = {}
        for condition in sorted(conditions, key=lambda c: c.last_seen):
            key = self._taint_key(condition)
            taints[(key, condition.effect.value)] = {
                "key": key,
                "value": condition.value,
                "effect": condition.effect.value,
                "timeAdded": _time(condition.since),
            }
        return sorted(taints.values(), key=lambda t: (t["effect"] == TaintEffect.NONE.value, t["key"]))

    def _taint_key(self, condition: Condition) -> str:
        return f"{self.policy.taint_domain}/{condition.cause.value}"

    def status(self, device: str) -> tuple[HealthStatus, str]:
        """The device's health and why (empty when healthy)."""
        with self._lock:
            return self._status_of(device)

    def report(self, device: str) -> dict[str, Any]:
        """The device's health as JSON (``status`` HEALTHY, UNHEALTHY or UNKNOWN, ``message``, ``taints``), as
        ``inventory -o json`` and the status server's /allocations show it."""
        status, message = self.status(device)
        return {"status": status.name, "message": message, "taints": self.taints(device)}

    def problem(self, device: str, tolerations: Sequence[DeviceToleration] = ()) -> str | None:
        """Why a new claim must not get ``device`` (cause and time), or None when it is healthy or the claim's
        allocation tolerates every taint the device carries (the scheduler let it through on purpose)."""
        with self._lock:
            conditions = [
                c
                for c in self._conditions_of(device)
                if c.unhealthy
                and not any(t.tolerates(self._taint_key(c), c.value, c.effect.value) for t in tolerations)
            ]
        if not conditions:
            return None
        return "; ".join(f"{c.message} (since {_time(c.since)})" for c in conditions)

    def _conditions_of(self, name: str) -> list[Condition]:
        device = self._state.devices.get(name)
        if device is None:
            return []
        return [
            c
            for c in self._state.conditions.values()
            if c.gpu_uuid in (device.gpu_uuid, ALL_GPUS)
            and (c.gpu_instance_id is None or device.gpu_instance_id in (None, c.gpu_instance_id))
        ]

    def _status_of(self, name: str) -> tuple[HealthStatus, str]:
        conditions = self._conditions_of(name)
        unhealthy = [c for c in conditions if c.unhealthy]
        if unhealthy:
            return HealthStatus.UNHEALTHY, "; ".join(c.message for c in unhealthy)
        blind = [c for c in conditions if c.cause is Cause.UNMONITORED]
        if blind:
            return HealthStatus.UNKNOWN, blind[0].message
        return HealthStatus.HEALTHY, ""

    # --- events ---------------------------------------------------------------------------------------------

    def handle(self, event: GpuEvent) -> None:
        """Apply one NVML event; subscribers hear about it."""
        now = self._clock()
        effect = self.policy.taint_effect
        if event.gpu_lost:
            GPU_EVENTS.labels("gpu-lost", "").inc()
            condition = Condition(
                event.gpu_uuid, Cause.LOST, "", effect, now, now, f"GPU {event.gpu_uuid} fell off the bus"
            )
        elif event.ecc_double_bit:
            GPU_EVENTS.labels("ecc", "").inc()
            condition = Condition(
                event.gpu_uuid, Cause.ECC, "1", effect, now, now, f"double-bit ECC error on GPU {event.gpu_uuid}"
            )
        elif event.xid is not None:
            ignored = self.policy.ignores(event.xid)
            GPU_EVENTS.labels("xid", str(event.xid)).inc()
            XID_ERRORS.labels(event.gpu_uuid, str(event.xid)).inc()
            where = f"GPU {event.gpu_uuid}" + (
                f" GPU instance {event.gpu_instance_id}" if event.gpu_instance_id is not None else ""
            )
            condition = Condition(
                event.gpu_uuid,
                Cause.XID,
                str(event.xid),
                TaintEffect.NONE if ignored else effect,
                now,
                now,
                f"{'application ' if ignored else ''}XID {event.xid} on {where}",
                gpu_instance_id=event.gpu_instance_id,
            )
        else:
            return
        with self._lock:
            self._add(condition)
        self._changed()

    def _add(self, condition: Condition) -> None:
        """Record ``condition`` (caller holds the lock); a repeat keeps ``since`` and counts up."""
        old = self._state.conditions.get(condition.key)
        if old is not None:
            count = old.count + 1
            value = str(max(count, old.ecc_seen or 0)) if condition.cause is Cause.ECC else condition.value
            condition = replace(
                condition,
                since=old.since,
                count=count,
                value=value,
                ecc_seen=old.ecc_seen,
                reset_pending=old.reset_pending,
            )
        self._state.conditions[condition.key] = condition
        devices = [n for n in self._state.devices if condition in self._conditions_of(n)]
        log.log(
            logging.WARNING if condition.unhealthy else logging.INFO,
            "device %s gpu=%s devices=%s cause=%s value=%s count=%d effect=%s message=%s",
            "unhealthy" if condition.unhealthy else "noted",
            condition.gpu_uuid,
            ",".join(devices),
            condition.cause.value,
            condition.value,
            condition.count,
            condition.effect.value,
            condition.message,
        )

    def lost_unattributed(self, error: Exception) -> None:
        """NVML says a GPU fell off the bus but not which: every device is suspect until the quiet period ends
        with every GPU answering (NVIDIA's plugins mark every device lost too)."""
        now = self._clock()
        GPU_EVENTS.labels("gpu-lost", "").inc()
        with self._lock:
            self._add(
                Condition(
                    ALL_GPUS,
                    Cause.LOST,
                    "unattributed",
                    self.policy.taint_effect,
                    now,
                    now,
                    f"a GPU of this node fell off the bus; NVML cannot say which ({error})",
                )
            )
        self._changed()

    def unmonitored(self, error: Exception) -> None:
        """Events can no longer be read: devices report UNKNOWN and carry an informational taint."""
        now = self._clock()
        with self._lock:
            self._add(
                Condition(
                    ALL_GPUS, Cause.UNMONITORED, "", TaintEffect.NONE, now, now, f"GPU health is not watched: {error}"
                )
            )
        self._changed()

    # --- recovery -------------------------------------------------------------------------------------------

    def check_recovery(self, gpulib: GpuLib) -> None:
        """Probe every GPU with a condition; clear what a reset or the quiet period ended (see the module doc)."""
        with self._lock:
            conditions = list(self._state.conditions.values())
            known = {d.gpu_uuid for d in self._state.devices.values()}
        suspects = {c.gpu_uuid for c in conditions}
        if ALL_GPUS in suspects:
            suspects = (suspects - {ALL_GPUS}) | known
        probes: dict[str, GpuProbe | GpuError] = {}
        for uuid in sorted(suspects):
            try:
                probes[uuid] = gpulib.probe(uuid)
            except GpuError as err:
                probes[uuid] = err
        now = self._clock()
        changed = False
        with self._lock:
            for uuid, probe in probes.items():
                changed |= self._apply_probe(uuid, probe, now)
            changed |= self._clear_unattributed(now)
        if changed:
            self._changed()

    def _apply_probe(self, uuid: str, probe: GpuProbe | GpuError, now: float) -> bool:
        mine = [c for c in self._state.conditions.values() if c.gpu_uuid == uuid]
        if isinstance(probe, GpuError):
            if isinstance(probe, GpuIsLost) and not any(c.cause is Cause.LOST for c in mine):
                self._add(Condition(uuid, Cause.LOST, "", self.policy.taint_effect, now, now, f"GPU {uuid}: {probe}"))
                return True
            return False
        changed = False
        ecc = probe.ecc_uncorrected_volatile
        action = probe.recovery_action
        reset = (
            any(c.cause is Cause.LOST for c in mine)
            or any(c.ecc_seen is not None and ecc is not None and ecc < c.ecc_seen for c in mine)
            # An XID that leaves no ECC trace (74, 119, …): NVML asked for a reset, and no longer does.
            or (action == RECOVERY_ACTION_NONE and any(c.reset_pending for c in mine))
        )
        if action in RESET_ACTIONS:
            changed |= self._mark_reset_pending(mine)
            mine = [c for c in self._state.conditions.values() if c.gpu_uuid == uuid]
        fit = probe.fabric_registered is not False
        for condition in mine:
            if reset and fit:
                why = "the GPU was reset" if condition.cause is not Cause.LOST else "the GPU answers again"
            elif fit and self._quiet(condition, now) and condition.cause is not Cause.LOST:
                why = f"no new event for {self.policy.recovery_period:g}s"
            else:
                if condition.cause is Cause.ECC and ecc is not None and ecc != condition.ecc_seen:
                    value = str(max(ecc, condition.count))
                    self._state.conditions[condition.key] = replace(condition, ecc_seen=ecc, value=value)
                    changed = True
                continue
            del self._state.conditions[condition.key]
            log.info(
                "device condition cleared gpu=%s cause=%s value=%s reason=%s",
                uuid,
                condition.cause.value,
                condition.value,
                why,
            )
            changed = True
        return changed

    def _mark_reset_pending(self, conditions: Iterable[Condition]) -> bool:
        """Remember that NVML asked for a reset while these conditions held (caller holds the lock)."""
        changed = False
        for condition in conditions:
            if not condition.reset_pending and condition.cause is not Cause.UNMONITORED:
                self._state.conditions[condition.key] = replace(condition, reset_pending=True)
                changed = True
        return changed

    def retry_unreadable(self, gpulib: GpuLib) -> bool:
        """Read again the GPUs that were lost before they could ever be read; when one answers now, tell the
        subscribers (the driver rescans and offers it). True when one came back."""
        if gpulib.unreadable_gpus():
            gpulib.gpus()
        missing = {u.index for u in gpulib.unreadable_gpus()}
        with self._lock:
            back = self._unreadable - missing
            self._unreadable = missing
        if not back:
            return False
        log.info("GPU answers again; rescanning gpu_indices=%s", ",".join(map(str, sorted(back))))
        self._board.set_devices(self._board.device_health())  # the same list: a nudge to rescan
        return True

    def _clear_unattributed(self, now: float) -> bool:
        # By now every GPU that does not answer carries its own gpu-lost condition (``_apply_probe``).
        condition = self._state.conditions.get((ALL_GPUS, Cause.LOST, True, None))
        if condition is None or not self._quiet(condition, now):
            return False
        del self._state.conditions[condition.key]
        log.info("unattributed GPU loss cleared reason=no new event for %gs", self.policy.recovery_period)
        return True

    def _quiet(self, condition: Condition, now: float) -> bool:
        period = self.policy.recovery_period
        return period > 0 and now - condition.last_seen >= period

    def note_after_event(self, gpulib: GpuLib, gpu_uuid: str) -> None:
        """Probe a GPU right after an XID or ECC event, so a reset soon after (before the next probe) is still
        recognised: by the drop of the ECC counter read now, or by the recovery action NVML asks for now."""
        try:
            probe = gpulib.probe(gpu_uuid)
        except GpuError:
            return
        ecc = probe.ecc_uncorrected_volatile
        with self._lock:
            condition = self._state.conditions.get((gpu_uuid, Cause.ECC, True, None))
            if condition is not None and ecc is not None:
                self._state.conditions[condition.key] = replace(
                    condition, ecc_seen=ecc, value=str(max(ecc, condition.count))
                )
            if probe.recovery_action in RESET_ACTIONS:
                self._mark_reset_pending([c for c in self._state.conditions.values() if c.gpu_uuid == gpu_uuid])
        self._changed()

    def monitored_again(self) -> None:
        """Events are read again: the ``unmonitored`` condition clears (what happened meanwhile is not known)."""
        with self._lock:
            if self._state.conditions.pop((ALL_GPUS, Cause.UNMONITORED, False, None), None) is None:
                return
        log.info("GPU health is watched again; events raised while it was not are not reported")
        self._changed()

    # --- publishing the state -------------------------------------------------------------------------------

    def _changed(self) -> None:
        """Save and tell subscribers, if the devices or their conditions changed since the last time."""
        with self._lock:
            entries = []
            for name in self._state.devices:
                status, message = self._status_of(name)
                entries.append(
                    DeviceHealth(pool=self.pool, device=name, status=status, last_updated=0, message=message)
                )
                DEVICE_HEALTH.labels(name).set(int(status))
            conditions = list(self._state.conditions.values())
            gpus = dict(self._state.gpus)
            snapshot = (tuple(entries), tuple(sorted(conditions, key=repr)))
            if snapshot == self._published:
                return
            self._published = snapshot
        if self._state_path is not None and self._save_state:
            try:
                _save_state(self._state_path, conditions, gpus)
            except OSError as err:
                log.warning("cannot save device health path=%s error=%s", self._state_path, err)
        self._board.set_devices(entries)

    # --- the monitor thread ---------------------------------------------------------------------------------

    def start(
        self,
        gpulib: GpuLib,
        *,
        poll_seconds: float = 5.0,
        rewatch_backoff: tuple[float, float] = DEFAULT_REWATCH_BACKOFF,
    ) -> None:
        """Watch NVML events and probe GPUs with conditions in a background thread until ``stop``. When the
        event wait fails, registering for events is tried again after ``rewatch_backoff[0]`` seconds, the delay
        doubling up to ``rewatch_backoff[1]``."""
        if self._state_path is not None and self._save_state:
            # Written once now too, so that a GPU lost before the next start is still known by name.
            with self._lock:
                conditions, gpus = list(self._state.conditions.values()), dict(self._state.gpus)
            try:
                for leftover in sweep_dead_writers(self._state_path):
                    log.info("removed a health state write cut short by a crash path=%s", leftover)
                _save_state(self._state_path, conditions, gpus)
            except OSError as err:
                log.warning("cannot save device health path=%s error=%s", self._state_path, err)
        self._thread = threading.Thread(
            target=self._run, args=(gpulib, poll_seconds, rewatch_backoff), name="gpu-health", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the monitor thread, waiting for it at most ``timeout`` seconds (an NVML call may be in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self, gpulib: GpuLib, poll_seconds: float, rewatch_backoff: tuple[float, float]) -> None:
        watching = True
        # An "unmonitored" saved by an earlier run clears once this run has read events (a wait that did not fail).
        confirmed = False
        next_probe = time.monotonic() + self.policy.probe_interval
        rewatch_delay, next_rewatch = rewatch_backoff[0], 0.0
        while not self._stop.is_set():
            if not watching and time.monotonic() >= next_rewatch:
                try:
                    gpulib.rewatch_events()
                except GpuError as err:
                    log.warning("cannot register for GPU events yet retry_in=%gs error=%s", rewatch_delay, err)
                    next_rewatch = time.monotonic() + rewatch_delay
                    rewatch_delay = min(rewatch_delay * 2, rewatch_backoff[1])
                else:
                    watching, rewatch_delay = True, rewatch_backoff[0]
                    self.monitored_again()
            wait = max(0.0, min(poll_seconds, next_probe - time.monotonic()))
            if watching:
                try:
                    event = gpulib.wait_for_event(wait)
                except GpuIsLost as err:
                    log.error("a GPU fell off the bus, NVML cannot say which; every device is unhealthy error=%s", err)
                    self.lost_unattributed(err)
                    self._stop.wait(min(1.0, wait))  # NVML may repeat it at once: do not spin
                except GpuError as err:
                    log.error("cannot read GPU events; health is no longer watched error=%s", err)
                    self.unmonitored(err)
                    watching = False
                    next_rewatch = time.monotonic() + rewatch_delay
                else:
                    if not confirmed:
                        confirmed = True
                        self.monitored_again()
                    if event is not None:
                        self.handle(event)
                        if event.ecc_double_bit or event.xid is not None:
                            self.note_after_event(gpulib, event.gpu_uuid)
            else:
                self._stop.wait(wait)
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self.policy.probe_interval
                try:
                    self.check_recovery(gpulib)
                    self.retry_unreadable(gpulib)
                except Exception:
                    log.exception("GPU health probe failed; trying again at the next interval")


# --- the state file ---------------------------------------------------------------------------------------------


def _save_state(path: Path, conditions: Iterable[Condition], gpus: dict[int, tuple[str, str]]) -> None:
    document = {
        "kind": STATE_KIND,
        "version": STATE_VERSION,
        "conditions": [{**asdict(c), "cause": c.cause.value, "effect": c.effect.value} for c in conditions],
        "gpus": [{"index": i, "uuid": uuid, "name": name} for i, (uuid, name) in sorted(gpus.items())],
    }
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = temp_file_for(path)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=1, sort_keys=True)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _load_state(
    path: Path,
) -> tuple[dict[tuple[str, Cause, bool, int | None], Condition], dict[int, tuple[str, str]]]:
    """The conditions and GPUs saved at ``path``; an unreadable file is logged and ignored (health starts clean)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, {}
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested deeper than json reads
        log.warning("ignoring unreadable device health file path=%s error=%s", path, err)
        return {}, {}
    conditions: dict[tuple[str, Cause, bool, int | None], Condition] = {}
    if not isinstance(raw, dict) or raw.get("kind") != STATE_KIND or raw.get("version") != STATE_VERSION:
        log.warning("ignoring device health file of another kind or version path=%s", path)
        return {}, {}
    gpus: dict[int, tuple[str, str]] = {}
    for entry in _list(raw.get("gpus")):
        with contextlib.suppress(TypeError, ValueError, KeyError):
            gpus[int(entry["index"])] = (str(entry["uuid"]), str(entry["name"]))
    for entry in _list(raw.get("conditions")):
        try:
            condition = _condition(entry)
        except (TypeError, ValueError, KeyError) as err:
            log.warning("ignoring a malformed device health entry path=%s error=%r", path, err)
            continue
        conditions[condition.key] = condition
    return conditions, gpus


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _condition(entry: Any) -> Condition:
    """One saved condition, every field of the type the monitor gives it (a wrong one raises ValueError)."""
    if not isinstance(entry, dict):
        raise TypeError(f"a condition is an object, not {type(entry).__name__}")
    condition = Condition(**{**entry, "cause": Cause(entry["cause"]), "effect": TaintEffect(entry["effect"])})
    optional_int = (type(None), int)
    for name, types in (
        ("gpu_uuid", (str,)),
        ("value", (str,)),
        ("since", (int, float)),
        ("last_seen", (int, float)),
        ("message", (str,)),
        ("count", (int,)),
        ("gpu_instance_id", optional_int),
        ("ecc_seen", optional_int),
    ):
        value = getattr(condition, name)
        if (
            not isinstance(value, types)
            or isinstance(value, bool)
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            raise ValueError(f"{name} {value!r} is not a {' or '.join(t.__name__ for t in types)}")
    return condition


def read_conditions(path: Path) -> list[Condition]:
    """The conditions a running driver saved."""
    return list(_load_state(path)[0].values())
