"""Claim constraints: matchAttribute (same value on every device) and distinctAttribute (all different)."""

from __future__ import annotations

from typing import Any

from dradriver.allocator.model import Device


def lookup_attribute(device: Device, qualified: str) -> tuple[str, Any] | None:
    """The (type, value) of a fully qualified attribute, also found unqualified in the driver's domain."""
    attributes = device.raw.get("attributes") or {}
    raw = attributes.get(qualified)
    if raw is None:
        domain, _, name = qualified.rpartition("/")
        if domain == device.driver:
            raw = attributes.get(name)
    if not isinstance(raw, dict) or len(raw) != 1:
        return None
    ((kind, value),) = raw.items()
    if isinstance(value, list):
        value = tuple(value)
    return (str(kind), value)


class Constraint:
    """Tracks the devices picked for the requests a constraint covers; ``add`` says whether one may join."""

    def __init__(self, index: int, raw: dict[str, Any]) -> None:
        self.index = index
        self.requests = set(raw.get("requests") or [])
        self.distinct = raw.get("distinctAttribute") is not None
        self.attribute = str(raw.get("distinctAttribute") if self.distinct else raw.get("matchAttribute"))
        self.values: list[tuple[str, Any]] = []

    @property
    def label(self) -> str:
        kind = "distinctAttribute" if self.distinct else "matchAttribute"
        scope = ", ".join(sorted(self.requests)) if self.requests else "all requests"
        return f"constraint #{self.index} ({kind} {self.attribute} over {scope})"

    def applies(self, request: str, parent: str | None) -> bool:
        if not self.requests:
            return True
        if parent is None:
            return request in self.requests
        return parent in self.requests or f"{parent}/{request}" in self.requests

    def add(self, device: Device) -> bool:
        value = lookup_attribute(device, self.attribute)
        if value is None:
            return False
        if self.distinct:
            if value in self.values:
                return False
        elif self.values and self.values[0] != value:
            return False
        self.values.append(value)
        return True

    def remove(self) -> None:
        self.values.pop()


def parse_constraints(spec: dict[str, Any]) -> list[Constraint]:
    raw_constraints = (spec.get("devices") or {}).get("constraints") or []
    return [Constraint(i, raw) for i, raw in enumerate(raw_constraints)]
