"""Claims and classes are checked as the API server checks them (shared/spec/kubelet-api.md §5.3-5.4)."""

import copy
from typing import Any

import pytest

from dradriver.validation import default_namespace, validate_claim, validate_class

GOOD: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c"},
    "spec": {
        "devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": 2}},
                {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.dradriver.dev"}]},
            ],
            "constraints": [{"requests": ["a", "b/big"], "matchAttribute": "gpu.dradriver.dev/nvlinkDomain"}],
            "config": [{"requests": ["a"], "opaque": {"driver": "gpu.dradriver.dev", "parameters": {"k": 1}}}],
        }
    },
}


def broken(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the field at dotted ``path`` (list indexes as numbers) set to ``value``."""
    claim = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node: Any = claim
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return claim


def test_a_good_claim_has_no_problems() -> None:
    assert validate_claim(GOOD) == []


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("metadata", None, "metadata: required"),
        ("metadata.name", "Upper_Case", "metadata.name: 'Upper_Case' is not a valid DNS subdomain"),
        ("metadata.name", 5, "metadata.name: expected a string, got a number"),
        ("metadata.namespace", "a.b", "metadata.namespace: 'a.b' is not a valid DNS label"),
        ("spec.devices.requests", 3, "spec.devices.requests: expected a list, got a number"),
        ("spec.devices.requests.0", "gpu", "spec.devices.requests[0]: expected a mapping, got a string"),
        ("spec.devices.requests.1.name", "a", "spec.devices.requests[1].name: request name 'a' is used twice"),
        ("spec.devices.requests.0.name", None, "spec.devices.requests[0].name: required"),
        ("spec.devices.requests.0.name", "GPU", "spec.devices.requests[0].name: 'GPU' is not a valid DNS label"),
        ("spec.devices.requests.0.exactly", None, "spec.devices.requests[0]: set exactly one of exactly or"),
        (
            "spec.devices.requests.0.firstAvailable",
            [{"name": "x", "deviceClassName": "c"}],
            "spec.devices.requests[0]: set exactly one of exactly or firstAvailable",
        ),
        ("spec.devices.requests.1.firstAvailable", [], "firstAvailable: empty"),
        ("spec.devices.requests.1.firstAvailable", [{"name": "s", "deviceClassName": "c"}] * 9, "at most 8"),
        ("spec.devices.requests.0.exactly.count", "two", "exactly.count: expected a whole number, got a string"),
        ("spec.devices.requests.0.exactly.count", 0, "exactly.count: 0 is not a whole number from 1 to 2^63-1"),
        ("spec.devices.requests.0.exactly.count", 2**64, "is not a whole number from 1 to 2^63-1"),
        ("spec.devices.requests.0.exactly.count", True, "exactly.count: expected a whole number, got a boolean"),
        ("spec.devices.requests.0.exactly.selectors", "x", "exactly.selectors: expected a list, got a string"),
        ("spec.devices.requests.0.exactly.selectors", [{"cel": "x"}], "selectors[0].cel: expected a mapping"),
        ("spec.devices.requests.0.exactly.selectors", [{"cel": {}}] * 33, "33 entries; at most 32"),
        (
            "spec.devices.requests.0.exactly.selectors",
            [{"cel": {"expression": "x" * 10241}}],
            "selectors[0].cel.expression: 10241 characters; at most 10240",
        ),
        ("spec.devices.requests.0.exactly.allocationMode", "Some", "allocationMode: 'Some' is not one of"),
        ("spec.devices.requests.0.exactly.adminAccess", "yes", "adminAccess: expected a boolean"),
        ("spec.devices.requests.0.exactly.tolerations", [{"operator": "Maybe"}], "operator: 'Maybe' is not one of"),
        ("spec.devices.requests.0.exactly.tolerations", [{}] * 17, "17 entries; at most 16"),
        (
            "spec.devices.requests.0.exactly.tolerations",
            [{"key": "k", "operator": "Exists", "value": "v"}],
            "tolerations[0].value: must be empty when operator is Exists",
        ),
        ("spec.devices.requests.0.exactly.capacity", {"requests": {"memory": "lots"}}, "'lots' is not a quantity"),
        ("spec.devices.requests.0.exactly.deviceClassName", None, "exactly.deviceClassName: required"),
        ("spec.devices.requests", [{"name": f"r{i}", "exactly": {"deviceClassName": "c"}} for i in range(33)], "33"),
        ("spec.devices.constraints.0.requests", ["zz"], "constraints[0].requests[0]: 'zz' names no request"),
        ("spec.devices.constraints.0.matchAttribute", "uuid", "'uuid' is not a fully qualified attribute"),
        ("spec.devices.constraints.0.distinctAttribute", "a.b/c", "set exactly one of matchAttribute or"),
        ("spec.devices.constraints", [{"matchAttribute": "a.b/c"}] * 33, "constraints: 33 entries; at most 32"),
        ("spec.devices.config.0.opaque.parameters", 5, "opaque.parameters: expected a mapping, got a number"),
        ("spec.devices.config.0.opaque", None, "config[0].opaque: required"),
        ("spec.devices.config", [{"opaque": {"driver": "d", "parameters": {}}}] * 33, "config: 33 entries"),
    ],
)
def test_each_broken_rule_names_its_field(path: str, value: Any, problem: str) -> None:
    problems = validate_claim(broken(path, value))
    assert any(problem in p for p in problems), problems


def test_a_subrequest_may_not_ask_for_admin_access() -> None:
    claim = broken("spec.devices.requests.1.firstAvailable.0.adminAccess", True)
    assert validate_claim(claim) == [
        "spec.devices.requests[1].firstAvailable[0].adminAccess: only allowed in exactly, not in a firstAvailable "
        "subrequest"
    ]


def test_a_template_is_checked_under_spec_spec() -> None:
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": "x"}}
    assert validate_claim(template) == ["spec.spec: expected a mapping, got a string"]


def test_a_missing_namespace_defaults_as_kubectl_does() -> None:
    claim = copy.deepcopy(GOOD)
    default_namespace(claim)
    assert claim["metadata"]["namespace"] == "default"


def test_a_class_selector_must_be_a_list_of_cel_expressions() -> None:
    device_class = {"kind": "DeviceClass", "metadata": {"name": "c"}, "spec": {"selectors": {"cel": "x"}}}
    assert validate_class(device_class) == ["spec.selectors: expected a list, got a mapping"]


def test_a_claim_named_by_generate_name_is_valid_as_kubectl_create_accepts_it() -> None:
    claim = copy.deepcopy(GOOD)
    claim["metadata"] = {"generateName": "train-"}
    assert validate_claim(claim) == []
    claim["metadata"] = {"generateName": "Train_"}
    assert validate_claim(claim) == ["metadata.generateName: 'Train_' is not a valid DNS subdomain prefix"]
    claim["metadata"] = {}
    assert validate_claim(claim) == ["metadata.name: required; set it"]
