"""The ValidatingAdmissionPolicy that keeps each node's plugin to its own node's ResourceSlices, evaluated
with our CEL interpreter on requests an API server would send it (admission semantics: the policy applies
when every matchCondition is true; the request is denied when any validation is false)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cel_admission import evaluate
from support.helm import template

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "system:serviceaccount:dradriver:dradriver-kubelet-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
NAME = "dradriver-resourceslices-own-node"


def policy() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "manifests/driver/admission-policy.yaml").read_text())
    [found] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    return found


def slice_on(node: str | None, driver: str = "gpu.dradriver.dev") -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}


def request(operation: str, user: str = PLUGIN, token_node: str | None = "node-a") -> dict[str, Any]:
    extra = {NODE_CLAIM: [token_node]} if token_node else {}
    return {
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
    }


def rule(fragment: str) -> str:
    """The message of the policy's one validation whose message holds ``fragment``."""
    [message] = [v["message"] for v in policy()["spec"]["validations"] if fragment in v["message"]]
    return message


def admit(
    req: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None, *, spec: dict[str, Any] | None = None
) -> list[str]:
    """Denial messages; empty when admitted (also when the policy does not apply); by ``spec`` (the base manifest's
    policy when None)."""
    spec = spec or policy()["spec"]
    if req["operation"] not in spec["matchConstraints"]["resourceRules"][0]["operations"]:
        return []
    if not all(evaluate(c["expression"], request=req, object=obj, oldObject=old) for c in spec["matchConditions"]):
        return []
    return [
        v["message"]
        for v in spec["validations"]
        if evaluate(v["expression"], request=req, object=obj, oldObject=old) is not True
    ]


@pytest.mark.parametrize(
    ("operation", "obj", "old"),
    [
        ("CREATE", slice_on("node-a"), None),
        ("UPDATE", slice_on("node-a"), slice_on("node-a")),
        ("DELETE", None, slice_on("node-a")),
    ],
)
def test_the_plugin_may_write_its_own_nodes_slices(operation: str, obj: Any, old: Any) -> None:
    assert admit(request(operation), obj, old) == []


@pytest.mark.parametrize(
    ("operation", "obj", "old", "why"),
    [
        ("CREATE", slice_on("node-b"), None, "node it runs on"),
        ("UPDATE", slice_on("node-a"), slice_on("node-b"), "node it runs on"),  # taking over another's slice
        ("UPDATE", slice_on("node-b"), slice_on("node-a"), "node it runs on"),  # moving one away
        ("DELETE", None, slice_on("node-b"), "node it runs on"),
        ("CREATE", slice_on(None), None, "node it runs on"),  # allNodes slices are not ours to write
        ("CREATE", slice_on("node-a", driver="other.example.com"), None, "driver gpu.dradriver.dev"),
        ("DELETE", None, slice_on("node-a", driver="other.example.com"), "driver gpu.dradriver.dev"),
    ],
)
def test_the_plugin_may_not_touch_other_nodes_or_drivers(operation: str, obj: Any, old: Any, why: str) -> None:
    assert admit(request(operation), obj, old) == [rule(why)]


def test_under_compat_nvidia_with_compute_domains_the_plugin_may_write_nvidias_two_drivers_slices() -> None:
    """The chart with compat=nvidia and computeDomains.enabled: gpu.nvidia.com and compute-domain.nvidia.com; ours
    are then other drivers."""
    rendered = template("--set", "computeDomains.enabled=true", "--set", "compat=nvidia")
    [nvidia] = [o for o in rendered if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == NAME]
    spec = nvidia["spec"]
    for driver in ("gpu.nvidia.com", "compute-domain.nvidia.com"):
        assert admit(request("CREATE"), slice_on("node-a", driver=driver), None, spec=spec) == []
    for driver in ("gpu.dradriver.dev", "compute-domain.dradriver.dev"):
        [denial] = admit(request("CREATE"), slice_on("node-a", driver=driver), None, spec=spec)
        assert "ResourceSlices of driver gpu.nvidia.com or compute-domain.nvidia.com" in denial


def test_a_token_without_a_node_is_denied() -> None:
    denials = admit(request("CREATE", token_node=None), slice_on("node-a"), None)
    assert denials == [rule("names no node"), rule("node it runs on")]  # no node in the token matches no slice's


def test_the_plugin_account_in_a_renamed_namespace_is_still_covered() -> None:
    user = "system:serviceaccount:gpu-system:dradriver-kubelet-plugin"
    assert admit(request("CREATE", user=user), slice_on("node-b"), None) == [rule("node it runs on")]


@pytest.mark.parametrize("user", ["system:node:node-a", "kubernetes-admin", "system:serviceaccount:x:other"])
def test_other_users_are_not_judged_by_this_policy(user: str) -> None:
    assert admit(request("DELETE", user=user, token_node=None), None, slice_on("node-b")) == []


def test_the_binding_denies_and_names_the_policy() -> None:
    docs = list(yaml.safe_load_all((ROOT / "manifests/driver/admission-policy.yaml").read_text()))
    [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy()["metadata"]["name"], "validationActions": ["Deny"]}
