"""ResourceClaims, ResourceClaimTemplates and DeviceClasses checked as the API server checks them (resource.k8s.io/v1),
and ResourceSlices read from files typed field by field before anything reads them.

A claim that the API server would refuse must not be "explained" or demonstrated as if it could exist: two
requests of one name, a count of "two", a request with both ``exactly`` and ``firstAvailable``. The checks also
type every field that dradriver reads, so nothing downstream meets a string where it expects a list. Pure: no
I/O, no CEL (compiling selectors is the caller's business). Limits: shared/spec/kubelet-api.md §5.3-5.4.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dradriver.inputs import type_name
from dradriver.validation.names import (
    DNS_LABEL_HELP,
    DNS_SUBDOMAIN_HELP,
    is_dns_label,
    is_dns_subdomain,
    is_qualified_name,
    is_quantity,
)

MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_SELECTORS = 32
MAX_SUBREQUESTS = 8
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024
MAX_OPAQUE_DRIVER_LENGTH = 63

ALLOCATION_MODES = ("ExactCount", "All")
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


class _Checker:
    """Collects ``path: problem`` lines while walking one object."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, problem: str) -> None:
        self.problems.append(f"{path}: {problem}")

    def typed(self, value: Any, path: str, kind: type, *, required: bool = False) -> bool:
        """Whether ``value`` is a ``kind``; a wrong type (or a missing required value) is a problem."""
        if value is None:
            if required:
                self.add(path, "required; set it")
            return False
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return True
        self.add(path, f"expected {_KIND_NAMES[kind]}, got {type_name(value)}")
        return False

    def mapping(self, value: Any, path: str, *, required: bool = False) -> dict[str, Any]:
        return value if self.typed(value, path, dict, required=required) else {}

    def items(self, value: Any, path: str, limit: int) -> list[Any]:
        if not self.typed(value, path, list):
            return []
        if len(value) > limit:
            self.add(path, f"{len(value)} entries; at most {limit} are allowed")
        return list(value)

    def name(self, value: Any, path: str, check: Callable[[object], bool], what: str) -> None:
        if self.typed(value, path, str, required=True) and not check(value):
            self.add(path, f"{value!r} is not a valid {what}")

    def enum(self, value: Any, path: str, allowed: tuple[str, ...]) -> None:
        if self.typed(value, path, str) and value not in allowed:
            self.add(path, f"{value!r} is not one of {', '.join(allowed)}")


_KIND_NAMES: dict[type, str] = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    int: "a whole number",
    bool: "a boolean (true or false)",
}


def default_namespace(obj: dict[str, Any]) -> None:
    """Give a namespaced object without a namespace the ``default`` one, as kubectl does."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get("namespace") in (None, ""):
        metadata["namespace"] = "default"


def validate_metadata(obj: dict[str, Any], *, namespaced: bool) -> list[str]:
    check = _Checker()
    metadata = check.mapping(obj.get("metadata"), "metadata", required=True)
    if isinstance(obj.get("metadata"), dict):  # an empty mapping still needs a name
        generate = metadata.get("generateName")
        if metadata.get("name") is None and generate is not None:
            # The API server names the object; the prefix may end in '-' (it checks it as apimachinery does).
            if check.typed(generate, "metadata.generateName", str) and not is_dns_subdomain(
                generate[:-1] + "a" if generate.endswith("-") else generate
            ):
                check.add("metadata.generateName", f"{generate!r} is not a valid DNS subdomain prefix")
        else:
            check.name(metadata.get("name"), "metadata.name", is_dns_subdomain, DNS_SUBDOMAIN_HELP)
        if namespaced and metadata.get("namespace") is not None:
            check.name(metadata.get("namespace"), "metadata.namespace", is_dns_label, DNS_LABEL_HELP)
    return check.problems


def validate_claim(obj: dict[str, Any]) -> list[str]:
    """Problems of a ResourceClaim or ResourceClaimTemplate, each ``field.path: what is wrong``."""
    problems = validate_metadata(obj, namespaced=True)
    check = _Checker()
    if obj.get("kind") == "ResourceClaimTemplate":
        template = check.mapping(obj.get("spec"), "spec", required=True)
        _claim_spec(check, template.get("spec"), "spec.spec")
    else:
        _claim_spec(check, obj.get("spec"), "spec")
    return problems + check.problems


def validate_class(obj: dict[str, Any]) -> list[str]:
    """Problems of a DeviceClass: its name, selectors and configs."""
    problems = validate_metadata(obj, namespaced=False)
    check = _Checker()
    spec = check.mapping(obj.get("spec"), "spec", required=True)
    _selectors(check, spec.get("selectors"), "spec.selectors")
    for i, config in enumerate(check.items(spec.get("config"), "spec.config", MAX_CONFIGS)):
        _opaque(check, check.mapping(config, f"spec.config[{i}]").get("opaque"), f"spec.config[{i}].opaque")
    return problems + check.problems


def _claim_spec(check: _Checker, value: Any, path: str) -> None:
    spec = check.mapping(value, path, required=True)
    devices = check.mapping(spec.get("devices"), f"{path}.devices")
    base = f"{path}.devices"
    names: dict[str, set[str]] = {}  # request → its subrequests
    for i, request in enumerate(check.items(devices.get("requests"), f"{base}.requests", MAX_REQUESTS)):
        _request(check, request, f"{base}.requests[{i}]", names)
    for i, constraint in enumerate(check.items(devices.get("constraints"), f"{base}.constraints", MAX_CONSTRAINTS)):
        _constraint(check, constraint, f"{base}.constraints[{i}]", names)
    for i, config in enumerate(check.items(devices.get("config"), f"{base}.config", MAX_CONFIGS)):
        where = f"{base}.config[{i}]"
        entry = check.mapping(config, where, required=True)
        _request_refs(check, entry.get("requests"), f"{where}.requests", names)
        _opaque(check, entry.get("opaque"), f"{where}.opaque", required=True)


def _request(check: _Checker, value: Any, path: str, names: dict[str, set[str]]) -> None:
    request = check.mapping(value, path, required=True)
    if not request:
        return
    name = request.get("name")
    check.name(name, f"{path}.name", is_dns_label, DNS_LABEL_HELP)
    if isinstance(name, str):
        if name in names:
            check.add(f"{path}.name", f"request name {name!r} is used twice; give each request its own name")
        names[name] = set()
    exactly, first = request.get("exactly"), request.get("firstAvailable")
    if (exactly is None) == (first is None):
        check.add(path, "set exactly one of exactly or firstAvailable")
        return
    if exactly is not None:
        _device_request(check, exactly, f"{path}.exactly", exact=True)
        return
    subrequests = check.items(first, f"{path}.firstAvailable", MAX_SUBREQUESTS)
    if isinstance(first, list) and not subrequests:
        check.add(f"{path}.firstAvailable", "empty; list at least one subrequest")
    for j, sub in enumerate(subrequests):
        where = f"{path}.firstAvailable[{j}]"
        sub_name = check.mapping(sub, where).get("name")
        check.name(sub_name, f"{where}.name", is_dns_label, DNS_LABEL_HELP)
        if isinstance(name, str) and isinstance(sub_name, str):
            if sub_name in names[name]:
                check.add(f"{where}.name", f"subrequest name {sub_name!r} is used twice in request {name!r}")
            names[name].add(sub_name)
        _device_request(check, sub, where, exact=False)


def _device_request(check: _Checker, value: Any, path: str, *, exact: bool) -> None:
    request = check.mapping(value, path, required=True)
    if not request:
        return
    check.name(request.get("deviceClassName"), f"{path}.deviceClassName", is_dns_subdomain, DNS_SUBDOMAIN_HELP)
    _selectors(check, request.get("selectors"), f"{path}.selectors")
    mode = request.get("allocationMode")
    check.enum(mode, f"{path}.allocationMode", ALLOCATION_MODES)
    count: Any = request.get("count")
    if mode == "All":
        if count is not None:
            check.add(f"{path}.count", "must be unset with allocationMode All")
    elif check.typed(count, f"{path}.count", int) and not 0 < count < 2**63:
        check.add(f"{path}.count", f"{count} is not a whole number from 1 to 2^63-1; leave it out for one device")
    admin = request.get("adminAccess")
    if admin is not None and not exact:
        check.add(f"{path}.adminAccess", "only allowed in exactly, not in a firstAvailable subrequest")
    check.typed(admin, f"{path}.adminAccess", bool)
    for i, toleration in enumerate(check.items(request.get("tolerations"), f"{path}.tolerations", MAX_TOLERATIONS)):
        _toleration(check, toleration, f"{path}.tolerations[{i}]")
    capacity = check.mapping(request.get("capacity"), f"{path}.capacity")
    for key, quantity in check.mapping(capacity.get("requests"), f"{path}.capacity.requests").items():
        if not is_qualified_name(key):
            check.add(f"{path}.capacity.requests", f"{key!r} is not a capacity name like memory or domain/name")
        elif isinstance(quantity, bool) or not isinstance(quantity, str | int):
            check.add(f"{path}.capacity.requests.{key}", f"expected a quantity like 10Gi, got {type_name(quantity)}")
        elif isinstance(quantity, str) and not is_quantity(quantity):
            check.add(f"{path}.capacity.requests.{key}", f"{quantity!r} is not a quantity like 10Gi or 500M")


def _selectors(check: _Checker, value: Any, path: str) -> None:
    for i, selector in enumerate(check.items(value, path, MAX_SELECTORS)):
        where = f"{path}[{i}]"
        cel = check.mapping(check.mapping(selector, where, required=True).get("cel"), f"{where}.cel", required=True)
        expression: Any = cel.get("expression")
        typed = check.typed(expression, f"{where}.cel.expression", str, required=bool(cel))
        if typed and len(expression) > MAX_CEL_LENGTH:
            check.add(f"{where}.cel.expression", f"{len(expression)} characters; at most {MAX_CEL_LENGTH}")


def _toleration(check: _Checker, value: Any, path: str) -> None:
    toleration = check.mapping(value, path, required=True)
    check.typed(toleration.get("key"), f"{path}.key", str)
    value = toleration.get("value")
    if check.typed(value, f"{path}.value", str) and value and toleration.get("operator") == "Exists":
        check.add(f"{path}.value", "must be empty when operator is Exists (Exists matches any value); remove it")
    check.enum(toleration.get("operator"), f"{path}.operator", TOLERATION_OPERATORS)
    check.enum(toleration.get("effect"), f"{path}.effect", TAINT_EFFECTS)
    seconds = toleration.get("tolerationSeconds")
    check.typed(seconds, f"{path}.tolerationSeconds", int)


def _constraint(check: _Checker, value: Any, path: str, names: dict[str, set[str]]) -> None:
    constraint = check.mapping(value, path, required=True)
    if not constraint:
        return
    _request_refs(check, constraint.get("requests"), f"{path}.requests", names)
    given = [key for key in ("matchAttribute", "distinctAttribute") if constraint.get(key) is not None]
    if len(given) != 1:
        check.add(path, "set exactly one of matchAttribute or distinctAttribute")
    for key in given:
        attribute = constraint[key]
        if check.typed(attribute, f"{path}.{key}", str) and ("/" not in attribute or not is_qualified_name(attribute)):
            check.add(f"{path}.{key}", f"{attribute!r} is not a fully qualified attribute like gpu.dradriver.dev/uuid")


def _request_refs(check: _Checker, value: Any, path: str, names: dict[str, set[str]]) -> None:
    for i, ref in enumerate(check.items(value, path, MAX_REQUESTS)):
        if not check.typed(ref, f"{path}[{i}]", str, required=True):
            continue
        request, _, sub = ref.partition("/")
        if request not in names or (sub and sub not in names[request]):
            check.add(f"{path}[{i}]", f"{ref!r} names no request of this claim")


def _opaque(check: _Checker, value: Any, path: str, *, required: bool = False) -> None:
    opaque = check.mapping(value, path, required=required)
    if not opaque:
        return
    driver = opaque.get("driver")
    check.name(driver, f"{path}.driver", is_dns_subdomain, DNS_SUBDOMAIN_HELP)
    if isinstance(driver, str) and len(driver) > MAX_OPAQUE_DRIVER_LENGTH:
        check.add(f"{path}.driver", f"at most {MAX_OPAQUE_DRIVER_LENGTH} characters")
    check.typed(opaque.get("parameters"), f"{path}.parameters", dict, required=True)


def validate_slice_fields(obj: dict[str, Any]) -> list[str]:
    """The type of every ResourceSlice field dradriver reads; the API server's rules come after (they assume
    JSON of the right shape, as the API server's decoder guarantees)."""
    check = _Checker()
    check.mapping(obj.get("metadata"), "metadata")
    spec = check.mapping(obj.get("spec"), "spec", required=True)
    if not spec:
        return check.problems
    check.typed(spec.get("driver"), "spec.driver", str, required=True)
    pool = check.mapping(spec.get("pool"), "spec.pool", required=True)
    check.typed(pool.get("name"), "spec.pool.name", str, required=bool(pool))
    check.typed(pool.get("generation"), "spec.pool.generation", int)
    check.typed(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", int)
    _node_fields(check, spec, "spec")
    for i, device in enumerate(check.items(spec.get("devices"), "spec.devices", 10_000)):
        _slice_device(check, device, f"spec.devices[{i}]")
    for i, counter_set in enumerate(check.items(spec.get("sharedCounters"), "spec.sharedCounters", 10_000)):
        where = f"spec.sharedCounters[{i}]"
        entry = check.mapping(counter_set, where, required=True)
        check.typed(entry.get("name"), f"{where}.name", str, required=bool(entry))
        _quantities(check, entry.get("counters"), f"{where}.counters")
    return check.problems


def _node_fields(check: _Checker, spec: dict[str, Any], path: str) -> None:
    check.typed(spec.get("nodeName"), f"{path}.nodeName", str)
    check.typed(spec.get("allNodes"), f"{path}.allNodes", bool)
    check.mapping(spec.get("nodeSelector"), f"{path}.nodeSelector")


def _slice_device(check: _Checker, value: Any, path: str) -> None:
    device = check.mapping(value, path, required=True)
    if not device:
        return
    check.typed(device.get("name"), f"{path}.name", str, required=True)
    for name, attribute in check.mapping(device.get("attributes"), f"{path}.attributes").items():
        where = f"{path}.attributes.{name}"
        entry = check.mapping(attribute, where, required=True)
        for key, kind in (("int", int), ("bool", bool), ("string", str), ("version", str)):
            check.typed(entry.get(key), f"{where}.{key}", kind)
    _quantities(check, device.get("capacity"), f"{path}.capacity")
    for j, consumption in enumerate(check.items(device.get("consumesCounters"), f"{path}.consumesCounters", 10_000)):
        where = f"{path}.consumesCounters[{j}]"
        entry = check.mapping(consumption, where, required=True)
        check.typed(entry.get("counterSet"), f"{where}.counterSet", str, required=bool(entry))
        _quantities(check, entry.get("counters"), f"{where}.counters")
    for j, taint in enumerate(check.items(device.get("taints"), f"{path}.taints", 10_000)):
        entry = check.mapping(taint, f"{path}.taints[{j}]", required=True)
        for key in ("key", "value", "effect"):
            check.typed(entry.get(key), f"{path}.taints[{j}].{key}", str)
    check.typed(device.get("allowMultipleAllocations"), f"{path}.allowMultipleAllocations", bool)
    _node_fields(check, device, path)


def _quantities(check: _Checker, value: Any, path: str) -> None:
    """A map of names to ``{value: QUANTITY}`` (counters, capacities)."""
    for name, entry in check.mapping(value, path).items():
        if not check.typed(entry, f"{path}.{name}", dict, required=True):
            continue
        quantity = entry.get("value")
        if isinstance(quantity, bool) or not isinstance(quantity, str | int):
            check.add(f"{path}.{name}.value", f"expected a quantity like 80Gi, got {type_name(quantity)}")
