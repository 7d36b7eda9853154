"""The API server's ResourceSlice rules that its OpenAPI schema cannot express, for the API stand-in.

``kubernetes-validate`` checks types, required fields and unknown fields only (see /work/shared/spec/tooling.md
§3). A real API server also checks names, one-of fields, limits, enums and value formats; this module states those
rules as the v1 API documents them (kubelet-api.md §5.1, §5.2, with the limits of §5.6 by release). It is written
apart from ``dradriver.validation.slices`` on purpose: the stand-in grades the driver's writes, so it must
not share the driver's reading of the rules. Cross-slice rules (a pool's slices agreeing) are not the server's.

``slice_errors(obj, minor=...)`` returns one line per broken rule, in the server's ``field: Invalid value: ...``
style, for a 1.<minor> server (34: counter sets beside devices, 4 taints; 35: sets in their own slices, 64 devices
with taints or counters; 36 and later: list attributes count toward the 64 too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(rf"^{_LABEL}$")
DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_ID = r"(0|[1-9][0-9]*)"
_PRE = r"(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
SEMVER = re.compile(rf"^{_ID}\.{_ID}\.{_ID}(-{_PRE}(\.{_PRE})*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")

NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
LIST_ATTRIBUTE_KINDS = ("ints", "bools", "strings", "versions")
ATTRIBUTE_KINDS = ("int", "bool", "string", "version", *LIST_ATTRIBUTE_KINDS)


def _subdomain(value: Any, limit: int = 253) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and bool(DNS_SUBDOMAIN.fullmatch(value))


def _label(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 63 and bool(DNS_LABEL.fullmatch(value))


def _qualified(value: Any) -> bool:
    """``<C identifier ≤32>`` or ``<DNS subdomain ≤63>/<C identifier ≤32>`` (attribute and capacity names)."""
    if not isinstance(value, str):
        return False
    domain, slash, name = value.rpartition("/")
    return (not slash or _subdomain(domain, 63)) and len(name) <= 32 and bool(C_IDENTIFIER.fullmatch(name))


def _label_key(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, slash, name = value.rpartition("/")
    return (not slash or _subdomain(prefix)) and 0 < len(name) <= 63 and bool(LABEL_NAME.fullmatch(name))


def _label_value(value: Any) -> bool:
    return value in (None, "") or (isinstance(value, str) and len(value) <= 63 and bool(LABEL_NAME.fullmatch(value)))


_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1)}
_SUFFIX |= {s: Fraction(1000**i) for i, s in enumerate("kMGTPE", 1)}
_SUFFIX |= {f"{s}i": Fraction(1024**i) for i, s in enumerate("KMGTPE", 1)}


def _quantity(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and bool(QUANTITY.fullmatch(value)))


def _amount(value: Any) -> Fraction:
    """The value of a quantity that ``_quantity`` accepted."""
    text = str(value)
    number = re.match(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", text)
    assert number is not None
    rest = text[number.end() :]
    if rest[:1] in ("e", "E"):
        return Fraction(number.group()) * Fraction(10) ** int(rest[1:])
    return Fraction(number.group()) * _SUFFIX[rest]


class _Judge:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def bad(self, field: str, value: Any, why: str) -> None:
        self.errors.append(f"{field}: Invalid value: {value!r}: {why}")

    def check(self, ok: bool, field: str, value: Any, why: str) -> None:
        if not ok:
            self.bad(field, value, why)

    def too_many(self, field: str, items: Any, limit: int) -> None:
        if items and len(items) > limit:
            self.errors.append(f"{field}: Too many: {len(items)}: must have at most {limit} items")


def slice_errors(obj: Mapping[str, Any], *, minor: int = 37) -> list[str]:
    """Every rule of the v1 API of Kubernetes 1.<minor> that ``obj`` (a ResourceSlice, JSON form) breaks beyond
    the schema."""
    judge = _Judge()
    _metadata(judge, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    judge.check(_subdomain(spec.get("driver"), 63), "spec.driver", spec.get("driver"), "a DNS subdomain of ≤63")
    pool = spec.get("pool") or {}
    name = pool.get("name")
    pool_ok = isinstance(name, str) and len(name) <= 253 and all(_subdomain(p) for p in name.split("/"))
    judge.check(pool_ok, "spec.pool.name", name, "DNS subdomains separated by '/', ≤253")
    judge.check((pool.get("generation") or 0) >= 0, "spec.pool.generation", pool.get("generation"), "must be ≥0")
    count = pool.get("resourceSliceCount")
    judge.check(isinstance(count, int) and count > 0, "spec.pool.resourceSliceCount", count, "must be >0")
    _node_selection(judge, spec, "spec", NODE_SELECTION)
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters") or []
    for i, counter_set in enumerate(counter_sets):
        where = f"spec.sharedCounters[{i}]"
        judge.check(_label(counter_set.get("name")), f"{where}.name", counter_set.get("name"), "a DNS label")
        _counters(judge, counter_set.get("counters") or {}, f"{where}.counters")
    if minor <= 34:
        _limits_1_34(judge, devices, counter_sets)
    else:
        judge.too_many("spec.sharedCounters", counter_sets, 8)
        if devices and counter_sets:
            judge.bad("spec", "devices and sharedCounters", "a slice carries devices or sharedCounters, not both")
        limited = any(
            d.get("taints") or d.get("consumesCounters") or (minor >= 36 and _has_list_attribute(d)) for d in devices
        )
        judge.too_many("spec.devices", devices, 64 if limited else 128)
    seen: set[str] = set()
    for i, device in enumerate(devices):
        judge.check(device.get("name") not in seen, f"spec.devices[{i}].name", device.get("name"), "duplicate")
        seen.add(device.get("name"))
        _device(judge, device, f"spec.devices[{i}]", per_device=spec.get("perDeviceNodeSelection") is True)
        if minor > 34:
            where = f"spec.devices[{i}]"
            consumes = device.get("consumesCounters") or []
            judge.too_many(f"{where}.consumesCounters", consumes, 2)
            sets = [entry.get("counterSet") for entry in consumes]
            judge.check(len(sets) == len(set(sets)), f"{where}.consumesCounters", sets, "one entry per counter set")
        judge.too_many(f"spec.devices[{i}].taints", device.get("taints"), 4 if minor <= 34 else 16)
    return judge.errors


def _limits_1_34(judge: _Judge, devices: list[Any], counter_sets: list[Any]) -> None:
    """1.34: sets beside devices, ≤32 counters over all sets, ≤32 consumed per device and ≤1024 per slice."""
    judge.too_many("spec.devices", devices, 128)
    counters = sum(len(c.get("counters") or {}) for c in counter_sets)
    judge.check(counters <= 32, "spec.sharedCounters", counters, "at most 32 counters over all sets")
    consumed = 0
    for i, device in enumerate(devices):
        mine = sum(len(e.get("counters") or {}) for e in device.get("consumesCounters") or [])
        judge.check(mine <= 32, f"spec.devices[{i}].consumesCounters", mine, "at most 32 counters per device")
        consumed += mine
    judge.check(consumed <= 1024, "spec.devices", consumed, "at most 1024 consumed counters per slice")


def _metadata(judge: _Judge, meta: Mapping[str, Any]) -> None:
    if meta.get("name"):
        judge.check(_subdomain(meta["name"]), "metadata.name", meta["name"], "a DNS subdomain")
    elif meta.get("generateName"):
        prefix = str(meta["generateName"])
        masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix  # a prefix may end in '-'
        judge.check(_subdomain(masked), "metadata.generateName", prefix, "a DNS subdomain prefix")
    else:
        judge.bad("metadata.name", None, "name or generateName is required")


def _node_selection(judge: _Judge, where: Mapping[str, Any], field: str, fields: tuple[str, ...]) -> None:
    present = [f for f in fields if where.get(f) is not None]
    judge.check(len(present) == 1, field, present, f"exactly one of {', '.join(fields)} is required")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if where.get(flag) is not None:
            judge.check(where[flag] is True, f"{field}.{flag}", where[flag], "must be true when set")
    if where.get("nodeName") is not None:
        judge.check(bool(where["nodeName"]), f"{field}.nodeName", where["nodeName"], "must not be empty")
    if where.get("nodeSelector") is not None:
        terms = where["nodeSelector"].get("nodeSelectorTerms") or []
        judge.check(len(terms) == 1, f"{field}.nodeSelector", len(terms), "must have exactly one term")


def _device(judge: _Judge, device: Mapping[str, Any], field: str, *, per_device: bool) -> None:
    judge.check(_label(device.get("name")), f"{field}.name", device.get("name"), "a DNS label")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > 32:
        judge.bad(field, len(attributes) + len(capacity), "at most 32 attributes and capacities together")
    values = 0
    for name, attribute in attributes.items():
        values += _attribute(judge, name, attribute, f"{field}.attributes[{name}]")
    if values > 48:
        judge.bad(f"{field}.attributes", values, "at most 48 attribute list values per device")
    for name, entry in capacity.items():
        _capacity(judge, name, entry, f"{field}.capacity[{name}]", shared=device.get("allowMultipleAllocations"))
    for i, entry in enumerate(device.get("consumesCounters") or []):
        _counters(judge, entry.get("counters") or {}, f"{field}.consumesCounters[{i}].counters")
    for i, taint in enumerate(device.get("taints") or []):
        where = f"{field}.taints[{i}]"
        judge.check(_label_key(taint.get("key")), f"{where}.key", taint.get("key"), "a label key")
        judge.check(_label_value(taint.get("value")), f"{where}.value", taint.get("value"), "a label value")
        judge.check(taint.get("effect") in TAINT_EFFECTS, f"{where}.effect", taint.get("effect"), "unsupported")
    for conditions in ("bindingConditions", "bindingFailureConditions"):
        judge.too_many(f"{field}.{conditions}", device.get(conditions), 4)
    own = [f for f in NODE_SELECTION[:3] if device.get(f) is not None]
    if per_device:
        _node_selection(judge, device, field, NODE_SELECTION[:3])
    elif own:
        judge.bad(f"{field}.{own[0]}", device[own[0]], "only with perDeviceNodeSelection: true on the slice")


def _attribute(judge: _Judge, name: str, attribute: Mapping[str, Any], field: str) -> int:
    judge.check(_qualified(name), field, name, "a C identifier, optionally with a DNS subdomain prefix")
    set_kinds = [k for k in ATTRIBUTE_KINDS if attribute.get(k) is not None]
    judge.check(len(set_kinds) == 1, field, set_kinds, "exactly one value is required")
    strings = [attribute.get("string"), *(attribute.get("strings") or [])]
    for value in filter(None, strings):
        judge.check(len(value) <= 64, field, value, "at most 64 characters")
    for value in [attribute.get("version"), *(attribute.get("versions") or [])]:
        if value is not None:
            judge.check(len(value) <= 64 and bool(SEMVER.fullmatch(value)), field, value, "a semantic version 2.0.0")
    return sum(len(attribute.get(k) or []) for k in LIST_ATTRIBUTE_KINDS)


def _capacity(judge: _Judge, name: str, entry: Mapping[str, Any], field: str, *, shared: Any) -> None:
    judge.check(_qualified(name), field, name, "a C identifier, optionally with a DNS subdomain prefix")
    judge.check(_quantity(entry.get("value")), f"{field}.value", entry.get("value"), "a quantity")
    policy = entry.get("requestPolicy")
    if policy is None:
        return
    judge.check(shared is True, f"{field}.requestPolicy", "set", "needs allowMultipleAllocations: true")
    values, valid_range = policy.get("validValues"), policy.get("validRange")
    judge.check(values is None or valid_range is None, f"{field}.requestPolicy", "both", "validValues or validRange")
    default = policy.get("default")
    if default is not None:
        judge.check(_quantity(default), f"{field}.requestPolicy.default", default, "a quantity")
    if values is not None:
        where = f"{field}.requestPolicy.validValues"
        judge.too_many(where, values, 10)
        if all(map(_quantity, values)):
            amounts = [_amount(v) for v in values]
            judge.check(amounts == sorted(set(amounts)), where, values, "unique and in ascending order")
            if default is not None and _quantity(default):
                judge.check(
                    _amount(default) in amounts, f"{field}.requestPolicy.default", default, "not in validValues"
                )
        else:
            judge.bad(where, values, "quantities")
    if valid_range is not None:
        judge.check(valid_range.get("min") is not None, f"{field}.requestPolicy.validRange.min", None, "required")


def _counters(judge: _Judge, counters: Mapping[str, Any], field: str) -> None:
    judge.too_many(field, counters, 32)
    for name, counter in counters.items():
        judge.check(_label(name), f"{field}[{name}]", name, "a DNS label")
        judge.check(_quantity((counter or {}).get("value")), f"{field}[{name}].value", counter, "a quantity")


def _has_list_attribute(device: Mapping[str, Any]) -> bool:
    return any(
        attribute.get(kind) is not None
        for attribute in (device.get("attributes") or {}).values()
        for kind in LIST_ATTRIBUTE_KINDS
    )
