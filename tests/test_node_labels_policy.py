"""The ValidatingAdmissionPolicy that keeps each node's plugin to its own Node's GFD-compatible labels (the chart's
nodeLabels.enabled), evaluated with our CEL interpreter on UPDATE requests an API server would send it (a PATCH
arrives as an UPDATE of the whole Node): the policy applies when every matchCondition is true; its variables are
evaluated in order; the request is denied when any validation is false, with its messageExpression's text when it
has one. tests/cluster/test_node_labels_policy.py sends the same kinds of patches to the real API server."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
from support.cel_admission import evaluate, evaluate_variable
from support.helm import template

from dradriver.computedomain.api import DOMAIN_LABEL
from dradriver.driver.publish.node_labels import OWNED_LABEL_PREFIXES

PLUGIN = "system:serviceaccount:dradriver:dradriver-kubelet-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
ANNOTATION = "gpu.dradriver.dev/node-labels"
NAME = "dradriver-nodes-own-labels"

# The validations, each by words of its message.
NO_NODE = "names no node"
OWN_NODE = "only change the Node it runs on"
LABELS = "only change the Node labels it owns"
ANNOTATIONS = "only change the Node annotation"
REST = "not its spec"


@functools.cache
def rendered(*values: str) -> tuple[dict[str, Any], ...]:
    """The policy and its binding as the chart renders them with ``values`` (nodeLabels on)."""
    args = ["--set", "nodeLabels.enabled=true", *(a for v in values for a in ("--set", v))]
    return tuple(o for o in template(*args) if o["metadata"]["name"] == NAME)


def policy(*values: str) -> dict[str, Any]:
    [found] = [o for o in rendered(*values) if o["kind"] == "ValidatingAdmissionPolicy"]
    return found


def node(name: str = "node-a", labels: dict[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    """A Node as the API server holds it: a GPU node with a few labels of others, a taint, an annotation."""
    found: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"} if labels is None else labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            **metadata,
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"nodeInfo": {"kubeletVersion": "v1.37.2"}},
    }
    return found


def changed(old: dict[str, Any], **changes: dict[str, str | None]) -> dict[str, Any]:
    """``old`` with a merge patch of metadata.labels / metadata.annotations applied (None removes a key)."""
    new = copy.deepcopy(old)
    for field, patch in changes.items():
        target = new["metadata"].setdefault(field, {})
        for key, value in patch.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return new


def request(user: str = PLUGIN, token_node: str | None = "node-a") -> dict[str, Any]:
    extra = {NODE_CLAIM: [token_node]} if token_node else {}
    return {
        "operation": "UPDATE",
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
    }


def admit(req: dict[str, Any], obj: dict[str, Any], old: dict[str, Any], *values: str) -> list[str]:
    """Denial messages; empty when admitted (also when the policy does not apply)."""
    spec = policy(*values)["spec"]
    bound = {"request": req, "object": obj, "oldObject": old}
    if not all(evaluate(c["expression"], **bound) for c in spec["matchConditions"]):
        return []
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = evaluate_variable(variable["expression"], **bound, variables=variables)
    denials = []
    for validation in spec["validations"]:
        if evaluate(validation["expression"], **bound, variables=variables) is not True:
            message = validation.get("messageExpression")
            denials.append(
                evaluate_variable(message, **bound, variables=variables) if message else validation["message"]
            )
    return denials


def rule(denials: list[str]) -> list[str]:
    """Which validations the ``denials`` came from (by the words of each message)."""
    return [next(w for w in (NO_NODE, OWN_NODE, LABELS, ANNOTATIONS, REST) if w in d) for d in denials]


def test_the_owned_prefixes_are_the_drivers() -> None:
    [variable] = [v for v in policy()["spec"]["variables"] if v["name"] == "ownedPrefixes"]
    assert tuple(evaluate_variable(variable["expression"])) == OWNED_LABEL_PREFIXES


@pytest.mark.parametrize(
    "labels",
    [
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"},  # added
        {"nvidia.com/gpu.present": "false"},  # changed
        {"nvidia.com/gpu.present": None},  # removed
        {"nvidia.com/cuda.driver-version.full": "580.65.06", "nvidia.com/mig.capable": "true"},
        {"nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mps.capable": "false", "nvidia.com/mig.strategy": "mixed"},
    ],
)
def test_the_plugin_may_change_its_own_labels_on_its_own_node(labels: dict[str, str | None]) -> None:
    old = node()
    new = changed(old, labels=labels, annotations={ANNOTATION: ",".join(sorted(labels))})
    assert admit(request(), new, old) == []


def test_the_plugin_may_label_a_node_without_labels_or_annotations_and_remove_them_all() -> None:
    bare = node(labels={})
    del bare["metadata"]["labels"], bare["metadata"]["annotations"]
    labelled = changed(bare, labels={"nvidia.com/gpu.count": "1"}, annotations={ANNOTATION: "nvidia.com/gpu.count"})
    assert admit(request(), labelled, bare) == []
    assert admit(request(), bare, labelled) == []


def test_an_unchanged_node_is_admitted() -> None:
    assert admit(request(), node(), node()) == []


@pytest.mark.parametrize(
    ("labels", "foreign"),
    [
        ({"team": "x"}, "team"),
        ({"kubernetes.io/hostname": "node-b"}, "kubernetes.io/hostname"),
        ({"kubernetes.io/hostname": None}, "kubernetes.io/hostname"),
        ({"nvidia.com/gpu": "present"}, "nvidia.com/gpu"),  # not under a prefix: the prefixes end in "." or "-"
        ({"nvidia.com/gfd.timestamp": "1"}, "nvidia.com/gfd.timestamp"),  # GFD's, but not written by us
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, "feature.node.kubernetes.io/pci-10de.present"),
    ],
)
def test_a_label_the_plugin_does_not_own_is_refused_and_named(labels: dict[str, str | None], foreign: str) -> None:
    old = node()
    new = changed(old, labels={"nvidia.com/gpu.count": "1", **labels})
    denials = admit(request(), new, old)
    assert rule(denials) == [LABELS]
    assert denials[0].endswith(f"nvidia.com/mps.), not {foreign}"), denials


@pytest.mark.parametrize("annotations", [{"team": "x"}, {"node.alpha.kubernetes.io/ttl": None}])
def test_an_annotation_other_than_its_own_is_refused(annotations: dict[str, str | None]) -> None:
    old = node()
    denials = admit(request(), changed(old, annotations=annotations), old)
    assert rule(denials) == [ANNOTATIONS]
    assert denials[0].endswith(f"{ANNOTATION}, not {next(iter(annotations))}"), denials


@pytest.mark.parametrize(
    "change",
    [
        lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoSchedule"}),
        lambda n: n["spec"].pop("taints"),
        lambda n: n["spec"].update(unschedulable=True),
        lambda n: n["metadata"].update(finalizers=["example.com/keep"]),
        lambda n: n["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]),
    ],
    ids=["taint-added", "taints-removed", "unschedulable", "finalizer", "owner-reference"],
)
def test_anything_else_of_the_node_is_refused(change: Any) -> None:
    old = node()
    new = changed(old, labels={"nvidia.com/gpu.count": "1"})
    change(new)
    assert rule(admit(request(), new, old)) == [REST]


def test_another_node_is_refused_even_for_its_own_labels() -> None:
    old = node("node-b")
    assert rule(admit(request(), changed(old, labels={"nvidia.com/gpu.count": "1"}), old)) == [OWN_NODE]


def test_a_token_without_a_node_is_refused() -> None:
    old = node()
    denials = admit(request(token_node=None), changed(old, labels={"nvidia.com/gpu.count": "1"}), old)
    assert rule(denials) == [NO_NODE, OWN_NODE]


def test_the_plugin_account_in_a_renamed_namespace_is_still_covered() -> None:
    old = node()
    user = "system:serviceaccount:gpu-system:dradriver-kubelet-plugin"
    assert rule(admit(request(user=user), changed(old, labels={"team": "x"}), old)) == [LABELS]


@pytest.mark.parametrize(
    "user", ["system:node:node-a", "kubernetes-admin", "system:serviceaccount:x:other", "system:kube-scheduler"]
)
def test_the_kubelet_admins_and_others_are_not_judged_by_this_policy(user: str) -> None:
    old = node("node-b")
    new = changed(old, labels={"team": "x", "kubernetes.io/hostname": None})
    new["spec"]["unschedulable"] = True
    assert admit(request(user=user, token_node=None), new, old) == []


def test_with_compute_domains_the_plugin_may_also_set_the_domain_label_and_no_other() -> None:
    old = node()
    domain = changed(old, labels={DOMAIN_LABEL: "a-uid"})
    assert rule(admit(request(), domain, old)) == [LABELS]  # not without compute domains
    assert admit(request(), domain, old, "computeDomains.enabled=true") == []
    assert admit(request(), old, domain, "computeDomains.enabled=true") == []
    near = changed(old, labels={f"{DOMAIN_LABEL}s": "a-uid"})
    assert rule(admit(request(), near, old, "computeDomains.enabled=true")) == [LABELS]


def test_under_compat_nvidia_the_domain_label_the_plugin_may_set_is_nvidias() -> None:
    """With compat nvidia the node plugin labels Nodes resource.nvidia.com/computeDomain (NVIDIA's name); ours is
    then a label it does not own."""
    values = ("computeDomains.enabled=true", "compat=nvidia")
    old = node()
    nvidia = changed(old, labels={"resource.nvidia.com/computeDomain": "a-uid"})
    assert admit(request(), nvidia, old, *values) == []
    assert admit(request(), old, nvidia, *values) == []
    assert rule(admit(request(), changed(old, labels={DOMAIN_LABEL: "a-uid"}), old, *values)) == [LABELS]


def test_the_policy_renders_whenever_it_is_on_whatever_the_features() -> None:
    """The plugin's account may patch nodes whenever the policy is on (the labels of an earlier nodeLabels run are
    removed after it is turned off; the ComputeDomain node plugin patches nodes too): the policy narrows that in
    every case, and turned off renders none."""
    for values in ([], ["computeDomains.enabled=true"], ["nodeLabels.enabled=false"]):
        objects = template(*(a for v in values for a in ("--set", v)))
        names = [o["kind"] for o in objects if o["metadata"]["name"] == NAME]
        assert sorted(names) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], values
    off = ("computeDomains.enabled=true", "admissionPolicies.ownNodeLabels=false")
    assert [o for o in template(*(a for v in off for a in ("--set", v))) if o["metadata"]["name"] == NAME] == []


def test_a_renamed_driver_owns_its_own_annotation() -> None:
    old = node()
    ours = changed(old, annotations={"gpu.example.com/node-labels": "nvidia.com/gpu.count"})
    assert admit(request(), ours, old, "driverName=gpu.example.com") == []
    assert rule(admit(request(), changed(old, annotations={ANNOTATION: "x"}), old, "driverName=gpu.example.com")) == [
        ANNOTATIONS
    ]


def test_the_policy_matches_updates_of_nodes_and_the_binding_denies() -> None:
    spec = policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    [binding] = [o for o in rendered() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}
