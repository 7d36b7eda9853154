"""The interface between the generic kubelet-plugin layer and a device driver.

A driver implements :class:`DriverHandler` (prepare/unprepare batches of claims) and optionally supplies a
:class:`HealthSource`; the plugin layer does everything that involves the kubelet: sockets, gRPC, fetching and
checking claims, per-claim serialisation and error isolation. Nothing here knows what a GPU is.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it: enough to find it, even after it was deleted."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (UID {self.uid})"


@dataclass(frozen=True)
class DeviceToleration:
    """A toleration the scheduler copied into an allocation result (``resource.k8s.io/v1`` DeviceToleration).

    The scheduler allocates a tainted device only to a request that tolerates the taint, so a driver that
    refuses devices for their condition must let tolerated ones through."""

    key: str = ""  # empty with operator Exists: every key
    operator: str = "Equal"  # or Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """Whether a taint with this key, value and effect is tolerated, by the API's matching rules."""
        if self.effect and self.effect != effect:
            return False
        if self.key and self.key != key:
            return False
        return self.operator == "Exists" or self.value == value


@dataclass(frozen=True)
class AllocatedDevice:
    """One of this driver's entries in the claim's ``status.allocation.devices.results``."""

    request: str  # the request name as allocated, ``req`` or ``req/sub``
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    # KEP-5075: what this share of a multi-allocatable device consumes (capacity name → quantity), sorted by name.
    consumed_capacity: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[DeviceToleration, ...] = ()


@dataclass(frozen=True)
class DeviceConfig:
    """One of this driver's opaque configs from ``status.allocation.devices.config``.

    ``requests`` empty means every request of the claim; ``source`` is ``FromClass`` or ``FromClaim`` (class
    configs come first in the list, as the API orders them); ``parameters`` is the opaque JSON, which only the
    driver knows how to read.
    """

    source: str
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ClaimConsumer:
    """An entry of the claim's ``status.reservedFor``: what the claim is reserved for, usually a pod."""

    resource: str  # "pods" for a pod
    name: str
    uid: str
    api_group: str = ""  # "" for the core group (pods)

    @property
    def is_pod(self) -> bool:
        return self.resource == "pods" and not self.api_group


@dataclass(frozen=True)
class AllocatedClaim:
    """A ResourceClaim as the driver gets it for prepare: parsed and checked once by the plugin layer.

    It carries the kubelet's reference (UID, namespace, name), this driver's allocation results (never empty),
    this driver's opaque configs and whom the claim is reserved for (the pods, for metrics and ``dradriver top``).
    The raw JSON stays at the cluster port.
    """

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    config: tuple[DeviceConfig, ...] = ()
    consumers: tuple[ClaimConsumer, ...] = ()  # status.reservedFor when the claim was fetched

    @property
    def uid(self) -> str:
        return self.ref.uid


@dataclass(frozen=True)
class PreparedDevice:
    """One device prepared for a claim, as reported back to the kubelet.

    ``requests`` are the claim's request names this device serves (a ``req/sub`` name is reduced to ``req`` by
    the plugin layer); empty means every request of the claim. ``share_id`` is only sent over DRA v1.
    ``status_data``, a JSON object of at most 10 KiB, becomes the device's ``data`` in the claim's
    ``status.devices`` when the plugin writes claim device status. ``metadata`` are the device's attributes in
    ``DeviceAttribute`` JSON form (``{"uuid": {"string": "GPU-…"}}``) for the KEP-5304 device metadata file.
    """

    pool: str
    device: str
    requests: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None
    status_data: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PrepareResult:
    """The outcome of preparing one claim: its devices, or an error message (which wins if set)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None


class DriverHandler(Protocol):
    """What a device driver implements so the plugin layer can serve the kubelet.

    Both calls receive a batch and must return an entry for every claim UID in it. Calls for different claims
    may run concurrently; the plugin layer never runs two calls that share a claim UID at the same time.
    If a call raises, the plugin layer retries each claim of the batch on its own so that one bad claim cannot
    fail the others, and reports the exception as that claim's error: both calls must be idempotent (the
    kubelet requires that anyway, since it repeats them after restarts).
    """

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        """Prepare the devices allocated to ``claims`` and return a result per claim UID.

        The plugin layer has fetched each claim, checked that its UID is the one the kubelet asked for, that it
        is allocated and that the allocation has results for this driver, and parsed it into an
        :class:`AllocatedClaim`.
        """
        ...

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        """Undo prepare for ``claims``; return per claim UID an error message or None for success.

        The claims may no longer exist in the API server, and may never have been prepared here (then it is a
        success).
        """
        ...


class HealthStatus(enum.IntEnum):
    """Device health as the kubelet's dra-health API encodes it."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    """The health of one device at ``last_updated`` (Unix seconds).

    ``timeout_seconds`` is how long the kubelet should trust this report (0 = the kubelet's default);
    ``message`` is shown in pod status (the kubelet truncates it beyond 1024 characters).
    """

    pool: str
    device: str
    status: HealthStatus
    last_updated: int
    timeout_seconds: int = 0
    message: str = ""


class HealthSource(Protocol):
    """The current health of every device of a driver, and a way to hear about changes."""

    def device_health(self) -> Sequence[DeviceHealth]:
        """The complete, current list (the kubelet treats devices missing from it as unknown)."""
        ...

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from any thread, quickly) after each change; return an unsubscribe function."""
        ...


class HealthBoard:
    """A thread-safe :class:`HealthSource` that a driver feeds with :meth:`set_devices`."""

    def __init__(self, devices: Iterable[DeviceHealth] = ()) -> None:
        self._lock = threading.Lock()
        self._devices: tuple[DeviceHealth, ...] = tuple(devices)
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next_id = 0

    def device_health(self) -> Sequence[DeviceHealth]:
        with self._lock:
            return self._devices

    def set_devices(self, devices: Iterable[DeviceHealth]) -> None:
        """Replace the complete list and notify subscribers."""
        with self._lock:
            self._devices = tuple(devices)
            subscribers = list(self._subscribers.values())
        for callback in subscribers:
            callback()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._subscribers[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe
