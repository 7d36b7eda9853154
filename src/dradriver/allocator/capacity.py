"""Consumable capacity (DRAConsumableCapacity): what a request takes from a device's capacities.

A device with ``allowMultipleAllocations: true`` can be shared by several requests and claims as long as
each of its capacities covers the sum of what they consume. What one request consumes follows
k8s.io/dynamic-resource-allocation's consumable-capacity helpers: for every capacity of the device, the
request's ``capacity.requests[name]``, else ``requestPolicy.default``, else the whole capacity; rounded up
by ``requestPolicy`` (``validValues``: the smallest valid value at least as large; ``validRange``: at least
``min``, in steps of ``step`` from ``min``) and then checked against it (``validRange.max``, steps,
``validValues``). Devices without ``allowMultipleAllocations`` are checked the same way, which amounts to
"every requested amount fits in the device's capacity".

Arithmetic is exact (fractions); the scheduler rounds fractional steps to milli-units, which agrees for
every quantity a driver publishes in practice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.allocator.errors import AllocationError
from dradriver.allocator.model import Device, DeviceID, Request
from dradriver.quantity import Quantity, QuantityError

_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"))


@dataclass(frozen=True)
class CapacitySpec:
    """One entry of a device's ``capacity`` with its ``requestPolicy``."""

    value: Quantity
    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    minimum: Quantity | None = None
    maximum: Quantity | None = None
    step: Quantity | None = None
    has_policy: bool = False
    has_range: bool = False


@dataclass
class Demand:
    """What one request consumes from one device: an amount per capacity, or why it cannot."""

    amounts: dict[str, Quantity] = field(default_factory=dict)
    requested: dict[str, Quantity] = field(default_factory=dict)  # the amounts the request named
    problem: str | None = None


def _quantity(raw: Any) -> Quantity:
    value = raw.get("value") if isinstance(raw, dict) else raw
    if value is None:
        raise QuantityError("no value")
    return Quantity.parse(str(value))


def _spec(raw: Any) -> CapacitySpec:
    policy = raw.get("requestPolicy") if isinstance(raw, dict) else None
    if not isinstance(policy, dict):
        return CapacitySpec(_quantity(raw))
    valid_range = policy.get("validRange")
    has_range = isinstance(valid_range, dict) and valid_range.get("min") is not None
    rng: dict[str, Any] = dict(valid_range) if has_range and isinstance(valid_range, dict) else {}
    return CapacitySpec(
        value=_quantity(raw),
        default=_quantity(policy["default"]) if policy.get("default") is not None else None,
        valid_values=tuple(_quantity(v) for v in policy.get("validValues") or []),
        minimum=_quantity(rng["min"]) if has_range else None,
        maximum=_quantity(rng["max"]) if rng.get("max") is not None else None,
        step=_quantity(rng["step"]) if rng.get("step") is not None else None,
        has_policy=True,
        has_range=has_range,
    )


def device_capacities(device: Device) -> dict[str, CapacitySpec] | str:
    """The device's capacities by name, or why they cannot be read."""
    specs = {}
    for name, raw in (device.raw.get("capacity") or {}).items():
        try:
            specs[str(name)] = _spec(raw)
        except (QuantityError, TypeError, AttributeError) as err:
            return f"capacity {name} of device {device.label} is not a valid quantity ({err})"
    return specs


def format_like(value: Fraction, reference: Quantity) -> str:
    """``value`` written in the style of ``reference`` (binary suffixes such as Gi, or decimal ones)."""
    if reference.text.endswith(_BINARY_SUFFIXES):
        return Quantity(value).text
    if value.denominator == 1 and value:
        number = int(value)
        for exponent, suffix in _DECIMAL_SUFFIXES:
            if number % 10**exponent == 0:
                return f"{number // 10**exponent}{suffix}"
        return str(number)
    return Quantity(value).text if value else "0"


def consumed_amount(requested: Quantity | None, spec: CapacitySpec) -> Quantity:
    """How much a request for ``requested`` (None: nothing named) takes, before the policy check."""
    if requested is None:
        return spec.default if spec.default is not None else spec.value
    if not spec.has_policy:
        return requested
    if spec.has_range and spec.minimum is not None:
        minimum = spec.minimum
        if requested.value < minimum.value:
            return minimum
        if spec.step is None or spec.step.value <= 0:
            return requested
        steps = -((minimum.value - requested.value) // spec.step.value)  # ceiling division
        rounded = minimum.value + steps * spec.step.value
        return requested if rounded == requested.value else Quantity(rounded, format_like(rounded, spec.step))
    for valid in spec.valid_values:
        if requested.value <= valid.value:
            return valid
    return requested


def policy_violation(amount: Quantity, spec: CapacitySpec) -> str | None:
    """Why ``amount`` is not allowed by the capacity's requestPolicy, or None."""
    if not spec.has_policy:
        return None
    if spec.default is not None and amount.value == spec.default.value:
        return None
    if spec.has_range:
        if spec.maximum is not None and amount.value > spec.maximum.value:
            return f"requestPolicy.validRange allows at most {spec.maximum}"
        step, minimum = spec.step, spec.minimum
        if step is not None and minimum is not None and step.value > 0 and (amount.value - minimum.value) % step.value:
            return f"requestPolicy.validRange allows only {minimum} plus multiples of {step}"
        return None
    if spec.valid_values and all(amount.value != v.value for v in spec.valid_values):
        shown = ", ".join(v.text for v in spec.valid_values)
        return f"requestPolicy.validValues are {shown}"
    return None


def compute_demand(request: Request, specs: dict[str, CapacitySpec] | str, device: Device) -> Demand:
    """What ``request`` would consume from ``device`` with capacities ``specs`` (ignoring other claims)."""
    if isinstance(specs, str):
        return Demand(problem=specs)
    wanted = request.capacity_requests
    unknown = sorted(name for name in wanted if name not in specs)
    if unknown:
        have = ", ".join(sorted(specs)) or "none"
        return Demand(
            requested=dict(wanted),
            problem=f"request asks for capacity {', '.join(unknown)}, which device {device.label} "
            f"does not have (it has: {have})",
        )
    demand = Demand(requested=dict(wanted))
    for name, spec in specs.items():
        requested = wanted.get(name)
        amount = consumed_amount(requested, spec)
        violation = policy_violation(amount, spec)
        if violation is not None:
            asked = _asked(requested, amount, spec)
            demand.problem = f"capacity {name}: {asked}, but {violation} on {device.label}"
            return demand
        demand.amounts[name] = amount
    return demand


class CapacityLedger:
    """Capacity consumed from multi-allocatable devices, by other claims and by the claim being allocated.

    ``shares`` counts the allocations of each multi-allocatable device: its shared counters are taken by
    the first and given back with the last.
    """

    def __init__(self) -> None:
        self.used: dict[DeviceID, dict[str, Fraction]] = {}
        self.shares: dict[DeviceID, int] = {}
        self._demands: dict[tuple[int, int], Demand] = {}
        self._specs: dict[int, dict[str, CapacitySpec] | str] = {}

    def add_allocated(self, device_id: DeviceID, consumed: dict[str, Quantity]) -> None:
        """Record one share of a device held by another claim (its result's ``consumedCapacity``)."""
        used = self.used.setdefault(device_id, {})
        for name, amount in consumed.items():
            used[name] = used.get(name, Fraction(0)) + amount.value
        self.shares[device_id] = self.shares.get(device_id, 0) + 1

    def specs(self, device: Device) -> dict[str, CapacitySpec] | str:
        known = self._specs.get(id(device))
        if known is None:
            known = self._specs[id(device)] = device_capacities(device)
        return known

    def demand(self, request: Request, device: Device) -> Demand:
        """What ``request`` consumes from ``device``; the same every time, so computed once."""
        key = (id(request), id(device))
        known = self._demands.get(key)
        if known is None:
            known = self._demands[key] = compute_demand(request, self.specs(device), device)
        return known

    def shortfall(self, request: Request, device: Device) -> str | None:
        """None if ``request`` fits in what ``device`` has left, else why not."""
        demand = self.demand(request, device)
        if demand.problem is not None:
            return demand.problem
        used = self.used.get(device.id) or {}
        specs = self.specs(device)
        assert not isinstance(specs, str)  # compute_demand reported that already
        for name, amount in demand.amounts.items():
            spec = specs[name]
            taken = used.get(name, Fraction(0))
            if taken + amount.value > spec.value.value:
                left = format_like(max(spec.value.value - taken, Fraction(0)), spec.value)
                asked = _asked(demand.requested.get(name), amount, spec)
                return f"capacity {name}: {asked}, {left} left of {spec.value.text} on {device.label}"
        return None

    def take(self, request: Request, device: Device) -> None:
        self._apply(device, self.demand(request, device), 1)

    def give_back(self, request: Request, device: Device) -> None:
        self._apply(device, self.demand(request, device), -1)

    def _apply(self, device: Device, demand: Demand, sign: int) -> None:
        used = self.used.setdefault(device.id, {})
        for name, amount in demand.amounts.items():
            used[name] = used.get(name, Fraction(0)) + sign * amount.value
        self.shares[device.id] = self.shares.get(device.id, 0) + sign


def _asked(requested: Quantity | None, amount: Quantity, spec: CapacitySpec) -> str:
    """``30Gi requested``, with the rounding or the default that turned it into ``amount``."""
    if requested is None:
        source = "requestPolicy.default" if spec.default is not None else "the whole capacity"
        return f"{amount.text} needed ({source}; the request names no amount)"
    if requested.value != amount.value:
        return f"{requested.text} requested ({amount.text} after requestPolicy rounding)"
    return f"{requested.text} requested"


def consumed_capacity(demand: Demand) -> dict[str, str]:
    """``consumedCapacity`` of a result: every capacity of the device, as quantity strings."""
    return {name: demand.amounts[name].text for name in sorted(demand.amounts)}


def parse_consumed(raw: Any, where: str) -> dict[str, Quantity]:
    """``consumedCapacity`` of an allocated result; ``where`` names it in errors."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise AllocationError(f"{where}.consumedCapacity: must be a map of capacity name to quantity")
    parsed = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = Quantity.parse(str(value))
        except QuantityError as err:
            raise AllocationError(f"{where}.consumedCapacity[{name}]: {err}; use a quantity such as 40Gi") from err
    return parsed
