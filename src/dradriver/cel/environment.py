"""The DRA selector environment: the ``device`` variable, its declared type and its value for one device."""

from __future__ import annotations

from typing import Any

from dradriver.cel.checker import ObjectType
from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.interpreter import AttributeMap, DomainMap
from dradriver.cel.semver import Semver, SemverError
from dradriver.quantity import Quantity, QuantityError

DEVICE_TYPE = ObjectType(
    "kubernetes.DRADevice",
    {
        "driver": "string",
        "attributes": ("map", "string", ("map", "string", "dyn")),
        "capacity": ("map", "string", ("map", "string", "Quantity")),
        "allowMultipleAllocations": "bool",
    },
)
VARIABLES: dict[str, Any] = {"device": DEVICE_TYPE}


def split_name(name: str, driver: str) -> tuple[str, str]:
    """(domain, id) of a qualified attribute or capacity name; unqualified names belong to the driver."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def attribute_value(name: str, attribute: Any) -> Any:
    """The CEL value of a ResourceSlice DeviceAttribute (``{"int": 1}``, ``{"version": "1.2.3"}``, …)."""
    if not isinstance(attribute, dict) or len(attribute) != 1:
        raise CelEvaluationError(f"attribute {name}: want exactly one of int, bool, string, version")
    ((kind, value),) = attribute.items()
    try:
        if kind == "int" and type(value) is int:
            return value
        if kind == "bool" and type(value) is bool:
            return value
        if kind == "string" and type(value) is str:
            return value
        if kind == "version" and type(value) is str:
            return Semver.parse(value)
        if kind in ("ints", "bools", "strings") and isinstance(value, list):
            return list(value)
        if kind == "versions" and isinstance(value, list):
            return [Semver.parse(v) for v in value]
    except SemverError as err:
        raise CelEvaluationError(f"attribute {name}: parse semantic version: {err}") from None
    raise CelEvaluationError(f"attribute {name}: unsupported value {attribute!r}")


def capacity_value(name: str, capacity: Any) -> Quantity:
    raw = capacity.get("value") if isinstance(capacity, dict) else capacity
    try:
        return Quantity.parse(str(raw))
    except QuantityError as err:
        raise CelEvaluationError(f"capacity {name}: {err}") from None


def device_value(device: dict[str, Any], driver: str) -> dict[str, Any]:
    """The value of the ``device`` variable for a Device of a ResourceSlice published by ``driver``."""
    attributes = DomainMap()
    for name, raw in (device.get("attributes") or {}).items():
        domain, ident = split_name(name, driver)
        inner = attributes.get(domain)
        if inner is None:
            inner = attributes[domain] = AttributeMap()
            inner.domain = domain
        inner[ident] = attribute_value(name, raw)
    capacity = DomainMap()
    capacity.kind = "capacity"
    for name, raw in (device.get("capacity") or {}).items():
        domain, ident = split_name(name, driver)
        inner = capacity.get(domain)
        if inner is None:
            inner = capacity[domain] = AttributeMap()
            inner.domain, inner.kind = domain, "capacity"
        inner[ident] = capacity_value(name, raw)
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
