"""The API server's ResourceSlice rules, one by one: a good slice passes, each broken rule is named."""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import kubernetes_validate
import pytest
from support.slice_rules import slice_errors

from dradriver.validation.slices import (
    SliceShape,
    parse_quantity,
    validate_pool,
    validate_slice,
)

Obj = dict[str, Any]


def device(name: str = "gpu-0", **extra: Any) -> Obj:
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "driverVersion": {"version": "580.65.6"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
            "migCapable": {"bool": True},
            "index": {"int": 0},
        },
        "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "108"}},
        **extra,
    }


def slice_obj(devices: list[Obj] | None = None, **spec: Any) -> Obj:
    body: Obj = {
        "driver": "gpu.dradriver.dev",
        "nodeName": "node-1",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "devices": devices if devices is not None else [device()],
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "00000-gpu.dradriver.dev-node-1-"},
        "spec": body,
    }


def counters_slice(sets: list[Obj], *, count: int = 2, name: str = "counters") -> Obj:
    obj = slice_obj(devices=None, sharedCounters=sets)
    del obj["spec"]["devices"]
    obj["metadata"] = {"name": name}
    obj["spec"]["pool"]["resourceSliceCount"] = count
    return obj


def counter_set(name: str = "gpu-0-counters", n: int = 2) -> Obj:
    return {"name": name, "counters": {f"c{i}": {"value": "1"} for i in range(n)}}


def consuming(name: str, set_name: str = "gpu-0-counters", counters: tuple[str, ...] = ("c0",)) -> Obj:
    return device(name, consumesCounters=[{"counterSet": set_name, "counters": {c: {"value": "1"} for c in counters}}])


def rules(obj: Obj, shape: SliceShape = SliceShape.V1_35) -> set[str]:
    return {p.rule for p in validate_slice(obj, shape=shape)}


def test_a_good_slice_has_no_problems_and_passes_kubernetes_validate() -> None:
    obj = slice_obj(
        [
            device("gpu-0"),
            device("gpu-1", taints=[{"key": "example.com/xid", "value": "79", "effect": "NoSchedule"}]),
        ]
    )
    assert validate_slice(obj) == []
    kubernetes_validate.validate(obj, "1.37.0", strict=True)


def _set(path: str, value: Any) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        target: Any = obj
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value

    return mutate


_DELETE = object()

BROKEN: list[tuple[str, Callable[[Obj], None], str]] = [
    ("slice name not a DNS subdomain", _set("metadata", {"name": "Bad_Name"}), "slice-name-dns-subdomain"),
    (
        "generateName not a subdomain prefix",
        _set("metadata", {"generateName": "UPPER-"}),
        "slice-name-dns-subdomain",
    ),
    ("no name at all", _set("metadata", {}), "required"),
    ("driver missing", _set("spec.driver", ""), "required"),
    ("driver upper case", _set("spec.driver", "GPU.example.com"), "driver-name"),
    ("driver too long", _set("spec.driver", "a" * 60 + ".example.com"), "driver-name"),
    ("pool name with bad part", _set("spec.pool.name", "node-1/Bad"), "pool-name"),
    ("pool name missing", _set("spec.pool.name", ""), "required"),
    ("negative generation", _set("spec.pool.generation", -1), "pool-generation"),
    ("zero slice count", _set("spec.pool.resourceSliceCount", 0), "pool-slice-count"),
    ("no node selection", _set("spec.nodeName", _DELETE), "one-node-selection"),
    ("two node selections", _set("spec.allNodes", True), "one-node-selection"),
    ("allNodes false", lambda o: (o["spec"].pop("nodeName"), o["spec"].update(allNodes=False)), "all-nodes"),
    (
        "node selector with two terms",
        lambda o: (o["spec"].pop("nodeName"), o["spec"].update(nodeSelector={"nodeSelectorTerms": [{}, {}]})),
        "node-selector-one-term",
    ),
    ("device name not a DNS label", _set("spec.devices.0.name", "GPU_0"), "device-name-dns-label"),
    ("device name too long", _set("spec.devices.0.name", "g" * 64), "device-name-dns-label"),
    ("duplicate device name", lambda o: o["spec"]["devices"].append(device("gpu-0")), "device-name-unique"),
    (
        "attribute with two values",
        _set("spec.devices.0.attributes.type", {"string": "gpu", "int": 1}),
        "attribute-one-value",
    ),
    ("attribute with no value", _set("spec.devices.0.attributes.type", {}), "attribute-one-value"),
    (
        "string attribute too long",
        _set("spec.devices.0.attributes.type", {"string": "x" * 65}),
        "string-length",
    ),
    ("version not semver", _set("spec.devices.0.attributes.driverVersion", {"version": "580.65"}), "semver"),
    (
        "version with leading zero",
        _set("spec.devices.0.attributes.driverVersion", {"version": "1.02.3"}),
        "semver",
    ),
    (
        "attribute name not a C identifier",
        _set("spec.devices.0.attributes.bad-name", {"int": 1}),
        "attribute-name",
    ),
    ("attribute name too long", _set("spec.devices.0.attributes." + "a" * 33, {"int": 1}), "attribute-name"),
    (
        "attribute domain not a subdomain",
        _set("spec.devices.0.attributes.Bad_Domain/x", {"int": 1}),
        "attribute-name",
    ),
    ("capacity name bad", _set("spec.devices.0.capacity.9lives", {"value": "1"}), "capacity-name"),
    ("capacity not a quantity", _set("spec.devices.0.capacity.memory", {"value": "80 GiB"}), "quantity"),
    (
        "too many attributes and capacities",
        _set("spec.devices.0.attributes", {f"a{i}": {"int": i} for i in range(31)}),
        "max-attributes",
    ),
    (
        "taint effect unknown",
        _set("spec.devices.0.taints", [{"key": "example.com/x", "effect": "Bogus"}]),
        "taint-effect",
    ),
    (
        "taint key invalid",
        _set("spec.devices.0.taints", [{"key": "bad key", "effect": "NoSchedule"}]),
        "taint-key",
    ),
    (
        "taint value invalid",
        _set("spec.devices.0.taints", [{"key": "k", "value": "-bad-", "effect": "NoSchedule"}]),
        "taint-value",
    ),
    (
        "too many taints",
        _set("spec.devices.0.taints", [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]),
        "max-taints",
    ),
    (
        "too many devices",
        lambda o: o["spec"].update(devices=[device(f"gpu-{i}") for i in range(129)]),
        "max-devices",
    ),
    (
        "65 devices when one has taints",
        lambda o: o["spec"].update(
            devices=[device(f"gpu-{i}") for i in range(64)]
            + [device("gpu-64", taints=[{"key": "k", "effect": "NoSchedule"}])]
        ),
        "max-devices",
    ),
    (
        "65 devices when one has a list attribute",
        lambda o: o["spec"].update(
            devices=[device(f"gpu-{i}") for i in range(64)]
            + [device("gpu-64", attributes={"peers": {"strings": ["gpu-0"]}})]
        ),
        "max-devices",
    ),
    (
        "devices and counter sets in one slice",
        _set("spec.sharedCounters", [counter_set()]),
        "devices-or-counters",
    ),
    (
        "three consumesCounters entries",
        _set(
            "spec.devices.0.consumesCounters",
            [{"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)],
        ),
        "max-consumes-counters",
    ),
    (
        "same counter set consumed twice",
        _set("spec.devices.0.consumesCounters", [{"counterSet": "s", "counters": {"c": {"value": "1"}}}] * 2),
        "consumes-counters-unique",
    ),
    (
        "33 consumed counters in one entry",
        _set(
            "spec.devices.0.consumesCounters",
            [{"counterSet": "s", "counters": {f"c{i}": {"value": "1"} for i in range(33)}}],
        ),
        "max-counters",
    ),
    (
        "consumed counter name not a DNS label",
        _set("spec.devices.0.consumesCounters", [{"counterSet": "s", "counters": {"C_0": {"value": "1"}}}]),
        "counter-name-dns-label",
    ),
    (
        "consumed counter value not a quantity",
        _set("spec.devices.0.consumesCounters", [{"counterSet": "s", "counters": {"c": {"value": "lots"}}}]),
        "quantity",
    ),
    (
        "binding conditions over the limit",
        _set("spec.devices.0.bindingConditions", list("abcde")),
        "max-binding-conditions",
    ),
    (
        "per-device node name without perDeviceNodeSelection",
        _set("spec.devices.0.nodeName", "node-1"),
        "device-node-selection",
    ),
    (
        "request policy without allowMultipleAllocations",
        _set("spec.devices.0.capacity.memory", {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}),
        "request-policy",
    ),
]


@pytest.mark.parametrize(("mutate", "rule"), [(m, r) for _, m, r in BROKEN], ids=[b[0] for b in BROKEN])
def test_each_broken_rule_is_reported_by_name(mutate: Callable[[Obj], None], rule: str) -> None:
    obj = slice_obj()
    mutate(obj)
    assert rule in rules(obj)


def _api_server_rejects(obj: Obj) -> bool:
    """The API stand-in's verdict: the upstream schema, then its own rules (written apart from ours)."""
    try:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    except kubernetes_validate.utils.ValidationError:
        return True
    return bool(slice_errors(obj))


@pytest.mark.parametrize("mutate", [m for _, m, _ in BROKEN], ids=[b[0] for b in BROKEN])
def test_the_api_stand_in_independently_rejects_each_broken_slice(mutate: Callable[[Obj], None]) -> None:
    obj = slice_obj()
    mutate(obj)
    assert _api_server_rejects(obj)


@pytest.mark.parametrize(
    "obj",
    [
        slice_obj([device("gpu-0"), device("gpu-1", taints=[{"key": "example.com/xid", "effect": "NoExecute"}])]),
        slice_obj([device(f"gpu-{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(64)]),
        slice_obj([device(f"gpu-{i}") for i in range(128)]),
        counters_slice([counter_set(f"s{i}", 32) for i in range(8)]),
        slice_obj([consuming("gpu-0"), device("gpu-1", attributes={"peers": {"strings": ["gpu-0"]}})]),
        slice_obj(
            [
                device(
                    "shared",
                    allowMultipleAllocations=True,
                    capacity={
                        "memory": {
                            "value": "80Gi",
                            "requestPolicy": {"default": "10Gi", "validValues": ["10Gi", "40Gi"]},
                        }
                    },
                )
            ]
        ),
    ],
    ids=["taints", "64-tainted", "128-plain", "8-counter-sets", "consuming-and-lists", "request-policy"],
)
def test_the_api_stand_in_and_the_validator_both_accept_good_slices(obj: Obj) -> None:
    assert validate_slice(obj) == []
    assert not _api_server_rejects(obj)


def test_sixty_four_devices_with_taints_are_accepted() -> None:
    devices = [device(f"gpu-{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(64)]
    assert validate_slice(slice_obj(devices)) == []


def test_problems_name_the_slice_the_device_and_the_field() -> None:
    obj = slice_obj([device("gpu-0"), device("gpu-1")])
    obj["spec"]["devices"][1]["attributes"]["driverVersion"] = {"version": "banana"}
    [problem] = validate_slice(obj)
    assert problem.device == "gpu-1"
    assert problem.field == "spec.devices[1].attributes[driverVersion].version"
    assert problem.slice == "00000-gpu.dradriver.dev-node-1-*"
    assert "gpu-1" in str(problem) and "semver" in str(problem)


def test_all_problems_are_returned_not_only_the_first() -> None:
    obj = slice_obj([device("Bad_0"), device("bad-1", taints=[{"key": "k", "effect": "Nope"}])])
    obj["spec"]["driver"] = ""
    assert {"device-name-dns-label", "taint-effect", "required"} <= rules(obj)


def test_validate_slice_lists_every_problem_naming_its_device() -> None:
    obj = slice_obj([device("Bad_0"), device("Bad_1")])
    problems = validate_slice(obj)
    assert len(problems) == 2
    shown = "; ".join(str(p) for p in problems)
    assert "Bad_0" in shown and "Bad_1" in shown


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("80Gi", Decimal(80 * 2**30)),
        ("108", Decimal(108)),
        ("500m", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("1.5k", Decimal(1500)),
        (7, Decimal(7)),
        ("1Gi ", None),
        ("Gi", None),
        ("1GB", None),
        (True, None),
    ],
)
def test_quantities_parse_like_the_api_server(value: object, expected: Decimal | None) -> None:
    assert parse_quantity(value) == expected


# -- the 1.34 shape --------------------------------------------------------------------------------------


def test_1_34_shape_allows_counters_inline_with_devices() -> None:
    obj = slice_obj([consuming("gpu-0")], sharedCounters=[counter_set()])
    assert validate_slice(obj, shape=SliceShape.V1_34) == []
    assert "devices-or-counters" in rules(obj)


def test_1_34_shape_checks_counter_references_inside_the_slice() -> None:
    obj = slice_obj(
        [consuming("gpu-0", counters=("nope",)), consuming("gpu-1", set_name="other")],
        sharedCounters=[counter_set()],
    )
    problems = validate_slice(obj, shape=SliceShape.V1_34)
    assert [(p.rule, p.device) for p in problems] == [
        ("counter-reference", "gpu-0"),
        ("counter-reference", "gpu-1"),
    ]


def test_1_34_shape_limits_counters_summed_over_sets() -> None:
    obj = slice_obj([device()], sharedCounters=[counter_set("a", 20), counter_set("b", 20)])
    assert "max-counters" in rules(obj, SliceShape.V1_34)


def test_1_34_shape_allows_only_four_taints_but_128_tainted_devices() -> None:
    five = slice_obj([device(taints=[{"key": f"k{i}", "effect": "None"} for i in range(5)])])
    assert "max-taints" in rules(five, SliceShape.V1_34)
    many = slice_obj([device(f"g-{i}", taints=[{"key": "k", "effect": "None"}]) for i in range(100)])
    assert validate_slice(many, shape=SliceShape.V1_34) == []


def test_the_api_stand_in_judges_a_1_34_server_by_its_own_limits_too() -> None:
    inline = slice_obj([consuming("gpu-0")], sharedCounters=[counter_set()])
    five = slice_obj([device(taints=[{"key": f"k{i}", "effect": "None"} for i in range(5)])])
    many = slice_obj([device(f"g-{i}", taints=[{"key": "k", "effect": "None"}]) for i in range(100)])
    summed = slice_obj([device()], sharedCounters=[counter_set("a", 20), counter_set("b", 20)])
    assert [bool(slice_errors(o, minor=34)) for o in (inline, five, many, summed)] == [False, True, False, True]
    assert [bool(validate_slice(o, shape=SliceShape.V1_34)) for o in (inline, five, many, summed)] == [
        False,
        True,
        False,
        True,
    ]
    assert slice_errors(inline) and slice_errors(many)


def test_1_35_shape_limits_counter_sets_and_counters_per_set() -> None:
    obj = counters_slice([counter_set(f"s{i}") for i in range(9)] + [counter_set("big", 33)])
    assert {"max-counter-sets", "max-counters"} <= rules(obj)


# -- pools ------------------------------------------------------------------------------------------------


def _pool(*slices: Obj) -> list[Obj]:
    for i, obj in enumerate(slices):
        obj["metadata"] = {"name": f"s-{i}"}
        obj["spec"]["pool"]["resourceSliceCount"] = len(slices)
    return list(slices)


def test_a_pool_with_counters_in_their_own_slice_is_valid() -> None:
    pool = _pool(counters_slice([counter_set()]), slice_obj([consuming("gpu-0"), consuming("gpu-1")]))
    assert validate_pool(pool) == []


def test_pool_rejects_counter_references_to_unknown_sets_or_counters() -> None:
    pool = _pool(
        counters_slice([counter_set()]),
        slice_obj([consuming("gpu-0", set_name="missing"), consuming("gpu-1", counters=("c9",))]),
    )
    problems = validate_pool(pool)
    assert [(p.rule, p.device) for p in problems] == [
        ("counter-reference", "gpu-0"),
        ("counter-reference", "gpu-1"),
    ]


def test_pool_rejects_device_names_repeated_across_slices() -> None:
    pool = _pool(slice_obj([device("gpu-0")]), slice_obj([device("gpu-0")]))
    [problem] = validate_pool(pool)
    assert (problem.rule, problem.device, problem.slice) == ("device-name-unique", "gpu-0", "s-1")


def test_pool_rejects_counter_sets_defined_twice() -> None:
    pool = _pool(counters_slice([counter_set()]), counters_slice([counter_set()]))
    assert "counter-set-name-unique" in {p.rule for p in validate_pool(pool)}


def test_pool_rejects_inconsistent_generation_and_slice_count() -> None:
    first, second = _pool(slice_obj([device("a")]), slice_obj([device("b")]))
    second["spec"]["pool"]["generation"] = 2
    first["spec"]["pool"]["resourceSliceCount"] = 3
    found = {p.rule for p in validate_pool([first, second])}
    assert {"pool-consistent", "pool-slice-count"} <= found


def test_validate_pool_lists_every_problem() -> None:
    pool = _pool(slice_obj([device("gpu-0")]), slice_obj([device("gpu-0"), device("X")]))
    assert {p.rule for p in validate_pool(pool)} == {"device-name-unique", "device-name-dns-label"}


def test_validation_does_not_modify_its_input() -> None:
    obj = slice_obj([device("Bad")])
    before = copy.deepcopy(obj)
    validate_pool([obj])
    assert obj == before
