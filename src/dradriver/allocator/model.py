"""Typed views of the v1 objects the allocator reads: requests of a claim, devices of pools, classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.allocator.errors import AllocationError
from dradriver.cel import CelCompileError, Quantity, Selector, compile_selector
from dradriver.quantity import QuantityError

DeviceID = tuple[str, str, str]  # driver, pool, device
MAX_RESULTS = 32  # resource.k8s.io: AllocationResultsMaxSize


def claim_name(claim: dict[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)


def claim_spec(claim: dict[str, Any]) -> dict[str, Any]:
    """``spec`` of a ResourceClaim, or ``spec.spec`` of a ResourceClaimTemplate."""
    spec = claim.get("spec") or {}
    if claim.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    return dict(spec)


def quantity(value: Any) -> Fraction:
    raw = value.get("value") if isinstance(value, dict) else value
    return Quantity.parse(str(raw)).value


@dataclass
class SelectorRef:
    """A compiled selector and where it came from, for messages: ``class gpu.dradriver.dev selector #0``."""

    origin: str
    index: int
    selector: Selector

    @property
    def label(self) -> str:
        return f"{self.origin} selector #{self.index}"


@dataclass
class Request:
    """A request, or one sub-request of a firstAvailable request (``parent`` is then the request's name)."""

    name: str
    parent: str | None
    class_name: str
    class_obj: dict[str, Any]
    selectors: list[SelectorRef]
    all_devices: bool
    count: int
    admin_access: bool
    tolerations: list[dict[str, Any]]
    raw: dict[str, Any]
    capacity_requests: dict[str, Quantity] = field(default_factory=dict)  # capacity.requests

    @property
    def full_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name


@dataclass
class RequestGroup:
    """One entry of ``spec.devices.requests``: one request, or the ordered alternatives of firstAvailable."""

    name: str
    alternatives: list[Request]


def compile_selectors(origin: str, raw_selectors: list[dict[str, Any]] | None) -> list[SelectorRef]:
    refs = []
    for index, raw in enumerate(raw_selectors or []):
        expression = ((raw or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            raise AllocationError(f"{origin} selector #{index}: CEL expression empty (unsupported selector type?)")
        try:
            refs.append(SelectorRef(origin, index, compile_selector(expression)))
        except CelCompileError as err:
            raise AllocationError(f"{origin} selector #{index}: CEL compile error: {err}") from err
    return refs


def parse_requests(claim: dict[str, Any], classes: dict[str, dict[str, Any]]) -> list[RequestGroup]:
    """The requests of a claim (or template), with their classes and selectors compiled."""
    name = claim_name(claim)
    devices = claim_spec(claim).get("devices") or {}
    groups = []
    for raw in devices.get("requests") or []:
        request_name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            alternatives = [_request(name, sub, request_name, classes) for sub in raw["firstAvailable"]]
        elif raw.get("exactly") is not None:
            alternatives = [_request(name, raw["exactly"], None, classes, request_name=request_name)]
        else:
            raise AllocationError(
                f"claim {name}, request {request_name}: neither exactly nor firstAvailable "
                f"is set (unsupported request type?)"
            )
        groups.append(RequestGroup(request_name, alternatives))
    return groups


def _request(
    claim: str,
    raw: dict[str, Any],
    parent: str | None,
    classes: dict[str, dict[str, Any]],
    request_name: str | None = None,
) -> Request:
    name = request_name if request_name is not None else str(raw.get("name", ""))
    shown = f"{parent}/{name}" if parent else name
    class_name = raw.get("deviceClassName")
    if not class_name:
        raise AllocationError(f"claim {claim}, request {shown}: missing device class name")
    class_obj = classes.get(class_name)
    if class_obj is None:
        raise AllocationError(
            f"claim {claim}, request {shown}: device class {class_name} not found; create it or fix deviceClassName"
        )
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise AllocationError(f"claim {claim}, request {shown}: unsupported count mode {mode}")
    count = _count(claim, shown, raw) if mode == "ExactCount" else 0
    return Request(
        name=name,
        parent=parent,
        class_name=class_name,
        class_obj=class_obj,
        selectors=compile_selectors(f"class {class_name}", (class_obj.get("spec") or {}).get("selectors"))
        + compile_selectors(f"request {shown}", raw.get("selectors")),
        all_devices=mode == "All",
        count=count,
        admin_access=bool(raw.get("adminAccess")),
        tolerations=list(raw.get("tolerations") or []),
        raw=raw,
        capacity_requests=_capacity_requests(claim, shown, raw),
    )


def _count(claim: str, shown: str, raw: dict[str, Any]) -> int:
    count = raw.get("count")
    if count is None:
        return 1
    if type(count) is not int or count <= 0:
        raise AllocationError(
            f"claim {claim}, request {shown}: count {count!r} is not a whole number greater than zero; "
            f"leave it out for one device"
        )
    return count


def _capacity_requests(claim: str, shown: str, raw: dict[str, Any]) -> dict[str, Quantity]:
    requests = (raw.get("capacity") or {}).get("requests") or {}
    if not isinstance(requests, dict):
        raise AllocationError(
            f"claim {claim}, request {shown}: capacity.requests must map capacity names to quantities"
        )
    parsed = {}
    for name, value in requests.items():
        try:
            parsed[str(name)] = Quantity.parse(str(value))
        except QuantityError as err:
            raise AllocationError(
                f"claim {claim}, request {shown}: capacity.requests[{name}]: {err}; use a quantity such as 40Gi"
            ) from err
    return parsed


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[dict[str, Any]] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)  # the devices available on the node, in order
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)
    invalid: str | None = None

    @property
    def incomplete(self) -> bool:
        return len(self.slices) != self.slice_count

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.name}"


class Device:
    """One device of a pool, as the search sees it; ``id`` and ``label`` are computed once."""

    __slots__ = ("_consumption", "driver", "id", "label", "multi", "name", "pool", "raw", "slice")

    def __init__(self, pool: Pool, raw: dict[str, Any], slice_: dict[str, Any]) -> None:
        self.pool = pool
        self.raw = raw
        self.slice = slice_
        self.name = str(raw.get("name", ""))
        self.driver = pool.driver
        self.id: DeviceID = (pool.driver, pool.name, self.name)
        self.label = f"{pool.driver}/{pool.name}/{self.name}"
        self.multi = raw.get("allowMultipleAllocations") is True  # shareable (consumable capacity)
        self._consumption: list[tuple[str, dict[str, Fraction]]] | None = None

    def consumption(self) -> list[tuple[str, dict[str, Fraction]]]:
        if self._consumption is None:
            self._consumption = [
                (str(c.get("counterSet")), {k: quantity(v) for k, v in (c.get("counters") or {}).items()})
                for c in self.raw.get("consumesCounters") or []
            ]
        return self._consumption
