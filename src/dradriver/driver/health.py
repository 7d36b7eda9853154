"""Device health from NVML events, served to the kubelet's health stream (KEP-4680).

An XID that signals a real fault marks the GPU (or just the MIG device it names) unhealthy; a GPU that falls off
the bus marks every device on it unhealthy. XIDs raised by applications themselves are ignored, as NVIDIA's own
plugins do. Health is reported, not acted on: tainting devices and recovery come with the health issue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dradriver.gpu.errors import GpuError, GpuIsLost
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, Inventory, MigMode
from dradriver.gpu.models import GpuEvent
from dradriver.plugin.handler import DeviceHealth, HealthStatus

log = logging.getLogger(__name__)

# Application-caused XIDs (graphics engine exception, page fault, stopped processing, preemptive cleanup, video
# processor exception, context-switch timeout): the GPU itself is fine.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class _Entry:
    gpu_uuid: str
    gi: int | None  # the MIG device's GPU instance id, None for a whole GPU or a partition not carved yet
    status: HealthStatus = HealthStatus.HEALTHY
    message: str = ""


class GpuHealth:
    """A ``HealthSource`` for the plugin layer, fed by ``handle(event)`` or by its own event thread."""

    def __init__(
        self, *, inventory: Inventory, mig_mode: MigMode, pool: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.pool = pool
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fresh = (HealthStatus.HEALTHY, "")  # what a newly seen device reports
        self.update_inventory(inventory, mig_mode)

    def update_inventory(self, inventory: Inventory, mig_mode: MigMode) -> None:
        """Report the devices of a fresh inventory; a device still there keeps its health."""
        with self._lock:
            entries: dict[str, _Entry] = {}
            for device in inventory.devices(mig_mode):
                if isinstance(device, GpuDevice):
                    fresh = _Entry(device.uuid, None, *self._fresh)
                else:
                    gi = device.existing.gpu_instance_id if device.existing else None
                    fresh = _Entry(device.parent.uuid, gi, *self._fresh)
                kept = self._entries.get(device.name)
                entries[device.name] = kept if kept is not None and kept.gpu_uuid == fresh.gpu_uuid else fresh
            changed = entries.keys() != self._entries.keys()
            self._entries = entries
            subscribers = list(self._subscribers.values()) if changed else []
        for callback in subscribers:
            callback()

    # --- HealthSource ---------------------------------------------------------------------------------------

    def device_health(self) -> Sequence[DeviceHealth]:
        # Stamped now: while the monitor runs, every device it has not flagged is healthy as of this moment (once it
        # stopped, they read UNKNOWN).
        now = int(self._clock())
        with self._lock:
            return [
                DeviceHealth(pool=self.pool, device=name, status=e.status, last_updated=now, message=e.message)
                for name, e in self._entries.items()
            ]

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            key = self._next
            self._next += 1
            self._subscribers[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe

    # --- events ---------------------------------------------------------------------------------------------

    def handle(self, event: GpuEvent) -> None:
        """Apply one NVML event; subscribers hear about it when a device's health changed."""
        if event.xid is not None and event.xid in IGNORED_XIDS:
            log.info("ignoring application XID gpu=%s xid=%d", event.gpu_uuid, event.xid)
            return
        message = (
            f"GPU {event.gpu_uuid} fell off the bus" if event.gpu_lost else f"XID {event.xid} on GPU {event.gpu_uuid}"
        )
        changed = False
        with self._lock:
            for name, entry in self._entries.items():
                if entry.gpu_uuid != event.gpu_uuid or entry.status is HealthStatus.UNHEALTHY:
                    continue
                # An XID naming one GPU instance hurts that MIG device and the whole GPU, not its siblings.
                if event.gpu_instance_id is not None and entry.gi is not None and entry.gi != event.gpu_instance_id:
                    continue
                self._entries[name] = _Entry(entry.gpu_uuid, entry.gi, HealthStatus.UNHEALTHY, message)
                log.warning("device unhealthy device=%s reason=%s", name, message)
                changed = True
            subscribers = list(self._subscribers.values()) if changed else []
        for callback in subscribers:
            callback()

    def _mark_all(self, status: HealthStatus, message: str) -> None:
        """Give every device not already unhealthy ``status``; subscribers hear about it when one changed."""
        with self._lock:
            self._fresh = (status, message)
            changed = False
            for name, entry in self._entries.items():
                if entry.status is HealthStatus.UNHEALTHY or entry.status is status:
                    continue
                self._entries[name] = _Entry(entry.gpu_uuid, entry.gi, status, message)
                changed = True
            subscribers = list(self._subscribers.values()) if changed else []
        for callback in subscribers:
            callback()

    def start(self, gpulib: GpuLib, *, poll_seconds: float = 5.0) -> None:
        """Watch NVML events in a background thread until ``stop``."""
        self._thread = threading.Thread(target=self._run, args=(gpulib, poll_seconds), name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, gpulib: GpuLib, poll_seconds: float) -> None:
        while not self._stop.is_set():
            try:
                event = gpulib.wait_for_event(poll_seconds)
            except GpuIsLost as err:
                # NVML says a GPU fell off the bus but not which one: any device may be on it, so none is trusted
                # (NVIDIA's plugins mark every device lost too).
                log.error("a GPU fell off the bus, NVML cannot say which; every device is unhealthy error=%s", err)
                self._mark_all(HealthStatus.UNHEALTHY, f"a GPU of this node fell off the bus ({err})")
                return
            except GpuError as err:
                # Blind from here on: report UNKNOWN rather than a freshly stamped HEALTHY nobody checks.
                log.error("cannot read GPU events; health is no longer watched error=%s", err)
                self._mark_all(HealthStatus.UNKNOWN, f"GPU health is not watched: {err}")
                return
            if event is not None:
                self.handle(event)
