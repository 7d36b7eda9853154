"""The API server's rules for resource.k8s.io/v1 ResourceSlices that a JSON schema cannot express.

``kubernetes-validate`` checks types and required fields; the API server additionally checks names, one-of
fields, list limits, value formats and cross references, and rejects a whole slice for one bad device. We
check those rules before publishing so that a bad device is reported by name instead of failing the publish
loop, and so the API server stand-in in the tests answers 422 exactly where a real one would.

Objects are JSON-form dicts (camelCase). Every function returns *all* problems it finds.

Two shapes: :attr:`SliceShape.V1_35` (Kubernetes 1.35 and later, the default) and :attr:`SliceShape.V1_34`
(counter sets inline with the devices that consume them; tighter taint limit).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

from dradriver.quantity import parse_quantity
from dradriver.validation.names import (
    RESOURCE_DOMAIN_MAX_LENGTH,
    RESOURCE_NAME_MAX_LENGTH,
    is_c_identifier,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_semver,
)

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_COUNTERS_TOTAL_1_34 = 32
MAX_CONSUMES_COUNTERS = 2
MAX_CONSUMED_COUNTERS = 32
MAX_CONSUMED_COUNTERS_PER_SLICE_1_34 = 1024
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_LIST_VALUES = 48
MAX_STRING_LENGTH = 64
MAX_TAINTS = 16
MAX_TAINTS_1_34 = 4
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = 10
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
DEVICE_NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes")
ATTRIBUTE_VALUE_FIELDS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")


class SliceShape(StrEnum):
    """Which release's ResourceSlice rules apply."""

    V1_34 = "1.34"
    V1_35 = "1.35"


@dataclass(frozen=True)
class Problem:
    """One broken rule: where (slice, device, field path) and what (rule id, message)."""

    slice: str
    field: str
    rule: str
    message: str
    device: str | None = None

    def __str__(self) -> str:
        device = f" (device {self.device})" if self.device else ""
        return f"ResourceSlice {self.slice}: {self.field}{device}: {self.message} [{self.rule}]"


def slice_label(obj: Mapping[str, Any], index: int | None = None) -> str:
    """How problems name a slice: its name, else ``<generateName>*``, else its position."""
    meta = obj.get("metadata") or {}
    if meta.get("name"):
        return str(meta["name"])
    if meta.get("generateName"):
        return f"{meta['generateName']}*"
    return f"#{index}" if index is not None else "<unnamed>"


class _Checker:
    """Collects problems for one slice."""

    def __init__(self, obj: Mapping[str, Any], label: str, shape: SliceShape) -> None:
        self.obj = obj
        self.label = label
        self.shape = shape
        self.problems: list[Problem] = []

    def add(self, field: str, rule: str, message: str, device: str | None = None) -> None:
        self.problems.append(Problem(self.label, field, rule, message, device))

    # -- names and formats -------------------------------------------------------------------------

    def qualified_name(self, key: object, field: str, rule: str, device: str | None) -> None:
        """Attribute/capacity keys: ``<C identifier ≤32>`` or ``<DNS subdomain ≤63>/<C identifier ≤32>``."""
        if not isinstance(key, str):
            self.add(field, rule, "key must be a string", device)
            return
        domain, _, ident = key.rpartition("/")
        if "/" in key and not is_dns_subdomain(domain, max_length=RESOURCE_DOMAIN_MAX_LENGTH):
            self.add(field, rule, f"domain {domain!r} must be a DNS subdomain of at most 63 characters", device)
        if not is_c_identifier(ident, max_length=RESOURCE_NAME_MAX_LENGTH):
            self.add(
                field,
                rule,
                f"name {ident!r} must be a C identifier (letters, digits, '_', not starting with a digit) "
                "of at most 32 characters",
                device,
            )

    def quantity(self, value: object, field: str, device: str | None) -> Fraction | None:
        parsed = parse_quantity(value)
        if parsed is None:
            self.add(field, "quantity", f"{value!r} is not a quantity (e.g. '80Gi', '108', '500m')", device)
        return parsed

    def counters_map(self, counters: object, field: str, device: str | None, limit: int | None) -> int:
        """A map of DNS-label counter names to ``{value: quantity}``; returns how many entries it has."""
        if not isinstance(counters, Mapping):
            self.add(field, "counters-map", "must be a map of counter name to {value}", device)
            return 0
        if limit is not None and len(counters) > limit:
            self.add(field, "max-counters", f"has {len(counters)} counters, at most {limit} allowed", device)
        for name, counter in counters.items():
            where = f"{field}[{name}]"
            if not is_dns_label(name):
                self.add(where, "counter-name-dns-label", "counter name must be a DNS label", device)
            value = counter.get("value") if isinstance(counter, Mapping) else None
            if value is None:
                self.add(f"{where}.value", "required", "counter value is required", device)
            else:
                self.quantity(value, f"{where}.value", device)
        return len(counters)

    # -- the slice ---------------------------------------------------------------------------------

    def check(self) -> list[Problem]:
        meta = self.obj.get("metadata") or {}
        name, generate = meta.get("name"), meta.get("generateName")
        if name:
            if not is_dns_subdomain(name):
                self.add(
                    "metadata.name",
                    "slice-name-dns-subdomain",
                    "must be a DNS subdomain (lower case, '-', '.', at most 253 characters)",
                )
        elif generate:
            # The API server checks the prefix as a name whose trailing '-' may be completed by the suffix.
            if not is_dns_subdomain(re.sub(r"-$", "a", str(generate))):
                self.add(
                    "metadata.generateName",
                    "slice-name-dns-subdomain",
                    "must be the prefix of a DNS subdomain",
                )
        else:
            self.add("metadata.name", "required", "either name or generateName is required")
        spec = self.obj.get("spec")
        if not isinstance(spec, Mapping):
            self.add("spec", "required", "spec is required")
            return self.problems
        self.driver(spec.get("driver"))
        self.pool(spec.get("pool"))
        self.node_selection(spec)
        self.shared_counters(spec.get("sharedCounters"))
        self.devices(spec)
        return self.problems

    def driver(self, driver: object) -> None:
        if not driver:
            self.add("spec.driver", "required", "driver name is required")
        elif not is_dns_subdomain(driver, max_length=RESOURCE_DOMAIN_MAX_LENGTH):
            self.add(
                "spec.driver",
                "driver-name",
                "must be a lower-case DNS subdomain of at most 63 characters, e.g. gpu.example.com",
            )

    def pool(self, pool: object) -> None:
        if not isinstance(pool, Mapping):
            self.add("spec.pool", "required", "pool is required")
            return
        name = pool.get("name")
        if not name:
            self.add("spec.pool.name", "required", "pool name is required")
        elif (
            not isinstance(name, str) or len(name) > 253 or not all(is_dns_subdomain(part) for part in name.split("/"))
        ):
            self.add(
                "spec.pool.name",
                "pool-name",
                "must be one or more DNS subdomains separated by '/', at most 253 characters",
            )
        generation = pool.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            self.add("spec.pool.generation", "pool-generation", "must be an integer >= 0")
        count = pool.get("resourceSliceCount")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            self.add("spec.pool.resourceSliceCount", "pool-slice-count", "must be an integer > 0")

    def node_selection(self, spec: Mapping[str, Any]) -> None:
        present = [f for f in NODE_SELECTION_FIELDS if spec.get(f) is not None]
        if len(present) != 1:
            self.add(
                "spec",
                "one-node-selection",
                f"exactly one of {', '.join(NODE_SELECTION_FIELDS)} must be set, found {', '.join(present) or 'none'}",
            )
        self.node_selection_values(spec, "spec", None)
        if spec.get("perDeviceNodeSelection") is not None and spec.get("perDeviceNodeSelection") is not True:
            self.add("spec.perDeviceNodeSelection", "per-device-node-selection", "must be true if set")

    def node_selection_values(self, where: Mapping[str, Any], field: str, device: str | None) -> None:
        node_name = where.get("nodeName")
        if node_name is not None and not is_dns_subdomain(node_name):
            self.add(f"{field}.nodeName", "node-name", "must be a non-empty node name (DNS subdomain)", device)
        if where.get("allNodes") is not None and where.get("allNodes") is not True:
            self.add(f"{field}.allNodes", "all-nodes", "must be true if set", device)
        selector = where.get("nodeSelector")
        if selector is not None:
            terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
            if not isinstance(terms, list) or len(terms) != 1:
                self.add(
                    f"{field}.nodeSelector.nodeSelectorTerms",
                    "node-selector-one-term",
                    "must have exactly one term",
                    device,
                )

    def shared_counters(self, sets: object) -> None:
        if sets is None:
            return
        if not isinstance(sets, list):
            self.add("spec.sharedCounters", "type", "must be a list of counter sets")
            return
        if self.shape is SliceShape.V1_35 and len(sets) > MAX_COUNTER_SETS:
            self.add(
                "spec.sharedCounters",
                "max-counter-sets",
                f"has {len(sets)} counter sets, at most {MAX_COUNTER_SETS} allowed per slice",
            )
        seen: set[str] = set()
        total = 0
        for i, counter_set in enumerate(sets):
            field = f"spec.sharedCounters[{i}]"
            if not isinstance(counter_set, Mapping):
                self.add(field, "type", "must be a counter set {name, counters}")
                continue
            name = counter_set.get("name")
            if not is_dns_label(name):
                self.add(f"{field}.name", "counter-set-name-dns-label", "counter set name must be a DNS label")
            elif name in seen:
                self.add(f"{field}.name", "counter-set-name-unique", f"counter set {name} is listed twice")
            else:
                seen.add(str(name))
            limit = MAX_COUNTERS_PER_SET if self.shape is SliceShape.V1_35 else None
            if not counter_set.get("counters"):
                self.add(f"{field}.counters", "required", "a counter set needs at least one counter")
            else:
                total += self.counters_map(counter_set.get("counters"), f"{field}.counters", None, limit)
        if self.shape is SliceShape.V1_34 and total > MAX_COUNTERS_TOTAL_1_34:
            self.add(
                "spec.sharedCounters",
                "max-counters",
                f"has {total} counters over all sets, at most {MAX_COUNTERS_TOTAL_1_34} allowed",
            )

    def devices(self, spec: Mapping[str, Any]) -> None:
        devices = spec.get("devices")
        if devices is None:
            return
        if not isinstance(devices, list):
            self.add("spec.devices", "type", "must be a list of devices")
            return
        if self.shape is SliceShape.V1_35 and devices and spec.get("sharedCounters"):
            self.add(
                "spec",
                "devices-or-counters",
                "a slice carries either devices or sharedCounters, not both: put the counter sets "
                "in a slice of their own in the same pool",
            )
        # Kubernetes 1.36 counts list-type attributes (alpha) as heavy too; they exist only from 1.36.
        heavy = any(
            isinstance(d, Mapping) and (d.get("taints") or d.get("consumesCounters") or _has_list_attribute(d))
            for d in devices
        )
        limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if heavy and self.shape is SliceShape.V1_35 else MAX_DEVICES
        if len(devices) > limit:
            why = " because a device has taints, consumesCounters or list attributes" if limit < MAX_DEVICES else ""
            self.add(
                "spec.devices",
                "max-devices",
                f"has {len(devices)} devices, at most {limit} allowed{why}; split them over more slices",
            )
        seen: set[str] = set()
        consumed_total = 0
        for i, device in enumerate(devices):
            field = f"spec.devices[{i}]"
            if not isinstance(device, Mapping):
                self.add(field, "type", "must be a device object")
                continue
            name = device.get("name")
            label = str(name) if name else None
            if not is_dns_label(name):
                self.add(
                    f"{field}.name",
                    "device-name-dns-label",
                    "device name must be a DNS label (lower case, digits, '-', at most 63 characters)",
                    label,
                )
            elif name in seen:
                self.add(f"{field}.name", "device-name-unique", f"device {name} is listed twice", label)
            else:
                seen.add(str(name))
            consumed_total += self.device(device, field, label, spec)
        if self.shape is SliceShape.V1_34 and consumed_total > MAX_CONSUMED_COUNTERS_PER_SLICE_1_34:
            self.add(
                "spec.devices",
                "max-consumed-counters",
                f"devices consume {consumed_total} counters in total, at most "
                f"{MAX_CONSUMED_COUNTERS_PER_SLICE_1_34} allowed per slice",
            )

    def device(self, device: Mapping[str, Any], field: str, label: str | None, spec: Mapping[str, Any]) -> int:
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            self.add(
                field,
                "max-attributes",
                f"has {len(attributes)} attributes and {len(capacity)} capacities, at most "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES} together",
                label,
            )
        list_values = 0
        for key, attribute in attributes.items():
            list_values += self.attribute(key, attribute, f"{field}.attributes[{key}]", label)
        if list_values > MAX_ATTRIBUTE_LIST_VALUES:
            self.add(
                f"{field}.attributes",
                "max-attribute-values",
                f"list attributes hold {list_values} values, at most {MAX_ATTRIBUTE_LIST_VALUES}",
                label,
            )
        for key, cap in capacity.items():
            self.capacity(key, cap, f"{field}.capacity[{key}]", label, device)
        consumed = self.consumes_counters(device.get("consumesCounters"), field, label, spec)
        self.taints(device.get("taints"), field, label)
        for key in ("bindingConditions", "bindingFailureConditions"):
            conditions = device.get(key) or []
            if len(conditions) > MAX_BINDING_CONDITIONS:
                self.add(
                    f"{field}.{key}",
                    "max-binding-conditions",
                    f"has {len(conditions)} entries, at most {MAX_BINDING_CONDITIONS}",
                    label,
                )
        per_device = [f for f in DEVICE_NODE_SELECTION_FIELDS if device.get(f) is not None]
        if spec.get("perDeviceNodeSelection") is True:
            if len(per_device) != 1:
                self.add(
                    field,
                    "device-node-selection",
                    "with spec.perDeviceNodeSelection each device needs exactly one of "
                    f"{', '.join(DEVICE_NODE_SELECTION_FIELDS)}",
                    label,
                )
            self.node_selection_values(device, field, label)
        elif per_device:
            self.add(
                field,
                "device-node-selection",
                f"{', '.join(per_device)} may only be set when spec.perDeviceNodeSelection is true",
                label,
            )
        return consumed

    def attribute(self, key: object, attribute: object, field: str, device: str | None) -> int:
        self.qualified_name(key, field, "attribute-name", device)
        if not isinstance(attribute, Mapping):
            self.add(field, "attribute-one-value", "must be an object with exactly one value", device)
            return 0
        present = [f for f in ATTRIBUTE_VALUE_FIELDS if attribute.get(f) is not None]
        if len(present) != 1:
            self.add(
                field,
                "attribute-one-value",
                f"must have exactly one of {', '.join(ATTRIBUTE_VALUE_FIELDS)}, found {', '.join(present) or 'none'}",
                device,
            )
        for kind in present:
            raw = attribute[kind]
            values = raw if kind.endswith("s") and isinstance(raw, list) else [raw]
            for value in values:
                if kind.startswith("string") and isinstance(value, str) and len(value) > MAX_STRING_LENGTH:
                    self.add(
                        f"{field}.{kind}",
                        "string-length",
                        f"is {len(value)} characters, at most {MAX_STRING_LENGTH}",
                        device,
                    )
                if kind.startswith("version"):
                    if isinstance(value, str) and len(value) > MAX_STRING_LENGTH:
                        self.add(
                            f"{field}.{kind}",
                            "string-length",
                            f"is {len(value)} characters, at most {MAX_STRING_LENGTH}",
                            device,
                        )
                    if not is_semver(value):
                        self.add(
                            f"{field}.{kind}",
                            "semver",
                            f"{value!r} is not a semantic version 2.0.0 (e.g. '1.2.3')",
                            device,
                        )
        return sum(len(attribute[k]) for k in present if k.endswith("s") and isinstance(attribute[k], list))

    def capacity(self, key: object, cap: object, field: str, device: str | None, owner: Mapping[str, Any]) -> None:
        self.qualified_name(key, field, "capacity-name", device)
        if not isinstance(cap, Mapping) or cap.get("value") is None:
            self.add(f"{field}.value", "required", "capacity value is required", device)
            return
        total = self.quantity(cap["value"], f"{field}.value", device)
        policy = cap.get("requestPolicy")
        if policy is None:
            return
        if owner.get("allowMultipleAllocations") is not True:
            self.add(
                f"{field}.requestPolicy",
                "request-policy",
                "requestPolicy needs allowMultipleAllocations: true on the device",
                device,
            )
        if isinstance(policy, Mapping):
            self.request_policy(policy, total, f"{field}.requestPolicy", device)

    def request_policy(self, policy: Mapping[str, Any], total: Fraction | None, field: str, device: str | None) -> None:
        """A capacity's requestPolicy: one of validValues or validRange, and a default that both allow."""
        values, valid_range = policy.get("validValues"), policy.get("validRange")
        if values is not None and valid_range is not None:
            self.add(field, "request-policy", "set validValues or validRange, not both", device)
        default = (
            self.quantity(policy["default"], f"{field}.default", device) if policy.get("default") is not None else None
        )
        if values is not None:
            self.valid_values(values, default, field, device)
        if isinstance(valid_range, Mapping):
            self.valid_range(valid_range, f"{field}.validRange", device)
        if total is not None and default is not None and default > total:
            self.add(f"{field}.default", "request-policy", "default must not exceed the capacity value", device)

    def valid_values(self, values: Any, default: Fraction | None, field: str, device: str | None) -> None:
        parsed = [self.quantity(v, f"{field}.validValues[{i}]", device) for i, v in enumerate(values)]
        numbers = [p for p in parsed if p is not None]
        if len(values) > MAX_VALID_VALUES:
            self.add(
                f"{field}.validValues",
                "request-policy",
                f"has {len(values)} values, at most {MAX_VALID_VALUES}",
                device,
            )
        if numbers != sorted(set(numbers)):
            self.add(f"{field}.validValues", "request-policy", "values must be unique and in ascending order", device)
        if default is not None and default not in numbers:
            self.add(f"{field}.default", "request-policy", "default must be one of validValues", device)

    def valid_range(self, valid_range: Mapping[str, Any], field: str, device: str | None) -> None:
        if valid_range.get("min") is None:
            self.add(f"{field}.min", "required", "min is required", device)
        for bound in ("min", "max", "step"):
            if valid_range.get(bound) is not None:
                self.quantity(valid_range[bound], f"{field}.{bound}", device)

    def consumes_counters(self, entries: object, field: str, device: str | None, spec: Mapping[str, Any]) -> int:
        if entries is None:
            return 0
        if not isinstance(entries, list):
            self.add(f"{field}.consumesCounters", "type", "must be a list", device)
            return 0
        if self.shape is SliceShape.V1_35 and len(entries) > MAX_CONSUMES_COUNTERS:
            self.add(
                f"{field}.consumesCounters",
                "max-consumes-counters",
                f"has {len(entries)} entries, at most {MAX_CONSUMES_COUNTERS}",
                device,
            )
        sets_here = {s.get("name"): s for s in spec.get("sharedCounters") or [] if isinstance(s, Mapping)}
        seen: set[str] = set()
        total = 0
        for i, entry in enumerate(entries):
            where = f"{field}.consumesCounters[{i}]"
            if not isinstance(entry, Mapping):
                self.add(where, "type", "must be {counterSet, counters}", device)
                continue
            set_name = entry.get("counterSet")
            if not is_dns_label(set_name):
                self.add(
                    f"{where}.counterSet",
                    "counter-set-name-dns-label",
                    "must name a counter set (a DNS label)",
                    device,
                )
            elif set_name in seen:
                self.add(
                    f"{where}.counterSet",
                    "consumes-counters-unique",
                    f"counter set {set_name} is consumed by two entries; merge them",
                    device,
                )
            seen.add(str(set_name))
            limit = MAX_CONSUMED_COUNTERS if self.shape is SliceShape.V1_35 else None
            total += self.counters_map(entry.get("counters"), f"{where}.counters", device, limit)
            # In the 1.34 shape the sets live in the same slice, so the API server checks references.
            if self.shape is SliceShape.V1_34 and is_dns_label(set_name):
                _check_reference(self, sets_here.get(set_name), entry, where, device)
        if self.shape is SliceShape.V1_34 and total > MAX_CONSUMED_COUNTERS:
            self.add(
                f"{field}.consumesCounters",
                "max-consumed-counters",
                f"consumes {total} counters in total, at most {MAX_CONSUMED_COUNTERS} per device",
                device,
            )
        return total

    def taints(self, taints: object, field: str, device: str | None) -> None:
        if taints is None:
            return
        if not isinstance(taints, list):
            self.add(f"{field}.taints", "type", "must be a list", device)
            return
        limit = MAX_TAINTS if self.shape is SliceShape.V1_35 else MAX_TAINTS_1_34
        if len(taints) > limit:
            self.add(f"{field}.taints", "max-taints", f"has {len(taints)} taints, at most {limit}", device)
        for i, taint in enumerate(taints):
            where = f"{field}.taints[{i}]"
            if not isinstance(taint, Mapping):
                self.add(where, "type", "must be {key, value, effect}", device)
                continue
            if not is_label_key(taint.get("key")):
                self.add(
                    f"{where}.key",
                    "taint-key",
                    "must be a label key ([prefix/]name, name of at most 63 characters)",
                    device,
                )
            value = taint.get("value")
            if value and not is_label_value(value):
                self.add(f"{where}.value", "taint-value", "must be a label value (at most 63 characters)", device)
            if taint.get("effect") not in TAINT_EFFECTS:
                self.add(
                    f"{where}.effect",
                    "taint-effect",
                    f"{taint.get('effect')!r} is not one of {', '.join(TAINT_EFFECTS)}",
                    device,
                )


def _has_list_attribute(device: Mapping[str, Any]) -> bool:
    attributes = device.get("attributes")
    if not isinstance(attributes, Mapping):
        return False
    return any(
        isinstance(a, Mapping) and any(a.get(kind) is not None for kind in ("ints", "bools", "strings", "versions"))
        for a in attributes.values()
    )


def _check_reference(
    checker: _Checker,
    counter_set: Mapping[str, Any] | None,
    entry: Mapping[str, Any],
    where: str,
    device: str | None,
) -> None:
    set_name = entry.get("counterSet")
    if counter_set is None:
        checker.add(
            f"{where}.counterSet",
            "counter-reference",
            f"counter set {set_name} is not defined in the pool's sharedCounters",
            device,
        )
        return
    known = counter_set.get("counters") or {}
    for counter in entry.get("counters") or {}:
        if counter not in known:
            checker.add(
                f"{where}.counters[{counter}]",
                "counter-reference",
                f"counter {counter} is not defined in counter set {set_name}",
                device,
            )


def validate_slice(
    obj: Mapping[str, Any], *, shape: SliceShape = SliceShape.V1_35, label: str | None = None
) -> list[Problem]:
    """Every API-server rule one ResourceSlice (JSON form) breaks on its own; empty if it is acceptable."""
    return _Checker(obj, label or slice_label(obj), shape).check()


def validate_pool(slices: Sequence[Mapping[str, Any]], *, shape: SliceShape = SliceShape.V1_35) -> list[Problem]:
    """Every rule the slices of one pool break, alone or together.

    On top of :func:`validate_slice` for each slice: all slices name the same pool and carry the same
    generation and ``resourceSliceCount`` (which equals the number of slices); device names and counter-set
    names are unique across the pool; every counter a device consumes exists in a counter set of the pool."""
    labels = [slice_label(s, i) for i, s in enumerate(slices)]
    problems: list[Problem] = []
    for s, label in zip(slices, labels, strict=True):
        problems.extend(validate_slice(s, shape=shape, label=label))
    problems += _pool_agreement(slices, labels)
    sets, duplicate_sets = _pool_counter_sets(slices, labels)
    problems += duplicate_sets
    problems += _pool_devices(slices, labels, sets, shape)
    return problems


def _pool_agreement(slices: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[Problem]:
    """The slices agree on the pool's name, generation and slice count, and the count is theirs."""
    problems = []
    pools = [(s.get("spec") or {}).get("pool") or {} for s in slices]
    for what, key in (
        ("pool name", "name"),
        ("generation", "generation"),
        ("resourceSliceCount", "resourceSliceCount"),
    ):
        values = {repr(p.get(key)) for p in pools}
        if len(values) > 1:
            problems.append(
                Problem(
                    labels[0],
                    f"spec.pool.{key}",
                    "pool-consistent",
                    f"slices of one pool disagree on the {what}: {', '.join(sorted(values))}",
                )
            )
    for label, pool in zip(labels, pools, strict=True):
        count = pool.get("resourceSliceCount")
        if isinstance(count, int) and count != len(slices):
            problems.append(
                Problem(
                    label,
                    "spec.pool.resourceSliceCount",
                    "pool-slice-count",
                    f"is {count} but the pool has {len(slices)} slices",
                )
            )
    return problems


def _pool_counter_sets(
    slices: Sequence[Mapping[str, Any]], labels: Sequence[str]
) -> tuple[dict[str, Mapping[str, Any]], list[Problem]]:
    """The pool's counter sets by name (the first definition wins), and the names defined twice."""
    problems = []
    sets: dict[str, Mapping[str, Any]] = {}
    for s, label in zip(slices, labels, strict=True):
        spec = s.get("spec") or {}
        for i, counter_set in enumerate(spec.get("sharedCounters") or []):
            name = counter_set.get("name") if isinstance(counter_set, Mapping) else None
            if not isinstance(name, str):
                continue
            if name in sets and sets[name] is not counter_set:
                problems.append(
                    Problem(
                        label,
                        f"spec.sharedCounters[{i}].name",
                        "counter-set-name-unique",
                        f"counter set {name} is defined in more than one slice of the pool",
                    )
                )
            sets.setdefault(name, counter_set)
    return sets, problems


def _pool_devices(
    slices: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    sets: Mapping[str, Mapping[str, Any]],
    shape: SliceShape,
) -> list[Problem]:
    """Device names are unique across the pool; (1.35) the counters they consume exist in its counter sets."""
    problems: list[Problem] = []
    device_owner: dict[str, int] = {}
    for index, (s, label) in enumerate(zip(slices, labels, strict=True)):
        for i, device in enumerate((s.get("spec") or {}).get("devices") or []):
            if not isinstance(device, Mapping):
                continue
            name = device.get("name")
            first = device_owner.setdefault(name, index) if isinstance(name, str) else index
            if first != index:
                problems.append(
                    Problem(
                        label,
                        f"spec.devices[{i}].name",
                        "device-name-unique",
                        f"device {name} is also in slice {labels[first]} of the same pool",
                        name,
                    )
                )
            if shape is SliceShape.V1_35:
                problems.extend(_pool_references(device, sets, label, f"spec.devices[{i}]"))
    return problems


def _pool_references(
    device: Mapping[str, Any], sets: Mapping[str, Mapping[str, Any]], label: str, field: str
) -> Iterable[Problem]:
    checker = _Checker({}, label, SliceShape.V1_35)
    name = device.get("name")
    for i, entry in enumerate(device.get("consumesCounters") or []):
        if isinstance(entry, Mapping) and isinstance(entry.get("counterSet"), str):
            _check_reference(
                checker,
                sets.get(entry["counterSet"]),
                entry,
                f"{field}.consumesCounters[{i}]",
                str(name) if name else None,
            )
    return checker.problems
