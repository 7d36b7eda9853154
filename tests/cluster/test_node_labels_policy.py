"""The chart's ownNodeLabels admission policy in a real API server: with nodeLabels.enabled the plugin's service
account may patch nodes, and the policy lets its token (bound to a pod on one node, so it carries that node) change
only that Node's labels under the prefixes the driver owns and its one annotation; any other change is refused
with the rule's message, while an admin's edit of the same Node is not judged.

The chart's plugin ServiceAccount, ClusterRole, binding and the policy are rendered with `helm template` under a
release of their own (``nodelabels``) and applied; two Nodes of this module (tainted, so nothing schedules there)
stand for the plugin's node and another one. tests/test_node_labels_policy.py evaluates the same policy on many
more requests with our CEL interpreter."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane
from support.helm import CHART, run_helm
from support.kube_rest import ApiError, Credentials, Kube

RELEASE = "nodelabels"
NAMESPACE = "node-labels-policy"
ACCOUNT = f"{RELEASE}-dradriver-kubelet-plugin"
POLICY = f"{RELEASE}-dradriver-nodes-own-labels"
OWN, OTHER = "labels-node-a", "labels-node-b"
ANNOTATION = "gpu.dradriver.dev/node-labels"
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
         "ValidatingAdmissionPolicyBinding"}  # fmt: skip
TAINT = {"key": "example.com/policy-test", "value": "only", "effect": "NoSchedule"}


def a_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": [TAINT]},
    }


def plugin_objects(path: Path) -> Path:
    """The chart's plugin account, its RBAC and the node-labels policy (nodeLabels on), written to ``path``."""
    done = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "nodeLabels.enabled=true")
    assert done.returncode == 0, done.stderr
    pod_account = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    wanted = [
        d
        for d in yaml.safe_load_all(done.stdout)
        if d
        and d["kind"] in KINDS
        and (d["metadata"]["name"] == POLICY or (d["kind"] in pod_account and d["metadata"]["name"] == ACCOUNT))
    ]
    assert {d["kind"] for d in wanted} == KINDS, wanted
    path.write_text(yaml.safe_dump_all(wanted))
    return path


def plugin_pod_on(node: str) -> dict[str, Any]:
    """A pod of the plugin's account bound to ``node``, as the DaemonSet's pod there would be (never started: no
    kubelet serves these Nodes)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"plugin-on-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": ACCOUNT,
            "automountServiceAccountToken": False,
            "containers": [{"name": "plugin", "image": "dradriver:dev"}],
        },
    }


def bound_token(kube: Kube, pod: dict[str, Any]) -> str:
    """A TokenRequest for the plugin's account bound to ``pod`` (so the token carries the pod's node)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        },
    }  # fmt: skip
    token: str = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token", request)[
        "status"
    ]["token"]
    return token


def refusal(writer: Kube, node: str, patch: dict[str, Any]) -> ApiError | None:
    """The API server's refusal of ``writer``'s merge patch of ``node``; None when it was admitted."""
    try:
        writer.patch("nodes", node, patch)
    except ApiError as err:
        return err
    return None


@pytest.fixture(scope="module")
def plugin(control_plane: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A client on the plugin account's token bound to a pod on ``OWN``, once the policy is in force."""
    objects = plugin_objects(tmp_path_factory.mktemp("node-labels") / "plugin.yaml")
    run = [kubectl(), "--kubeconfig", str(control_plane.kubeconfig)]
    kube.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    try:
        for name in (OWN, OTHER):
            kube.create("nodes", a_node(name))
        applied = subprocess.run([*run, "apply", "--server-side", "-f", str(objects)], capture_output=True,
                                 text=True, timeout=60, check=False)  # fmt: skip
        assert applied.returncode == 0, applied.stdout + applied.stderr
        pod = kube.create("pods", plugin_pod_on(OWN), NAMESPACE)
        writer = Kube(Credentials(control_plane.server, control_plane.pki.ca_cert, token=bound_token(kube, pod)))
        yield wait_for_the_policy(kube, writer)
    finally:
        subprocess.run([*run, "delete", "--ignore-not-found", "-f", str(objects)], capture_output=True, timeout=60,
                       check=False)  # fmt: skip
        for name in (OWN, OTHER):
            kube.delete("nodes", name)
        kube.delete("namespaces", NAMESPACE)


def wait_for_the_policy(admin: Kube, writer: Kube) -> Kube:
    """``writer`` once the policy refuses it a foreign label: RBAC and a policy applied moments ago take effect when
    the API server's informers have them, so a label admitted before that is taken off again and retried."""

    def refused() -> ApiError | None:
        err = refusal(writer, OWN, {"metadata": {"labels": {"team": "x"}}})
        if err is None or err.status != 403 or POLICY not in str(err):
            admin.patch("nodes", OWN, {"metadata": {"labels": {"team": None}}})
            return None
        return err

    admin.wait("the node-labels policy to refuse a foreign label", refused)
    return writer


def labels_of(kube: Kube, node: str) -> dict[str, str]:
    labels: dict[str, str] = kube.get("nodes", node)["metadata"].get("labels") or {}
    return labels


def test_the_plugin_may_write_and_remove_its_labels_and_annotation_on_its_own_node(plugin: Kube, kube: Kube) -> None:
    ours = {
        "nvidia.com/gpu.count": "1",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/mig.capable": "true",
    }
    patched = plugin.patch("nodes", OWN, {"metadata": {"labels": ours, "annotations": {ANNOTATION: ",".join(ours)}}})
    assert patched["metadata"]["annotations"][ANNOTATION] == ",".join(ours)
    assert labels_of(kube, OWN).items() >= ours.items()
    plugin.patch("nodes", OWN, {"metadata": {"labels": dict.fromkeys(ours), "annotations": {ANNOTATION: None}}})
    assert not labels_of(kube, OWN).keys() & ours.keys()
    assert ANNOTATION not in (kube.get("nodes", OWN)["metadata"].get("annotations") or {})


def test_another_node_is_refused(plugin: Kube, kube: Kube) -> None:
    refused = refusal(plugin, OTHER, {"metadata": {"labels": {"nvidia.com/gpu.count": "1"}}})
    assert refused is not None and refused.status == 403, refused
    assert "may only change the Node it runs on" in str(refused)
    assert "nvidia.com/gpu.count" not in labels_of(kube, OTHER)


@pytest.mark.parametrize(
    ("labels", "named"),
    [({"team": "x"}, "team"), ({"kubernetes.io/hostname": "elsewhere"}, "kubernetes.io/hostname")],
)
def test_a_label_it_does_not_own_is_refused_and_named(
    plugin: Kube, kube: Kube, labels: dict[str, str], named: str
) -> None:
    refused = refusal(plugin, OWN, {"metadata": {"labels": {"nvidia.com/gpu.count": "1", **labels}}})
    assert refused is not None and refused.status == 403, refused
    assert "may only change the Node labels it owns" in str(refused) and f"not {named}" in str(refused)
    assert labels_of(kube, OWN) == {"kubernetes.io/hostname": OWN}  # nothing of the patch was written


def test_a_taint_is_refused(plugin: Kube, kube: Kube) -> None:
    taints = [TAINT, {"key": "example.com/evict", "effect": "NoExecute"}]
    refused = refusal(plugin, OWN, {"spec": {"taints": taints}})
    assert refused is not None and refused.status == 403, refused
    assert "not its spec (taints" in str(refused)
    assert "example.com/evict" not in [t["key"] for t in kube.get("nodes", OWN)["spec"]["taints"]]


def test_an_annotation_other_than_its_own_is_refused(plugin: Kube) -> None:
    refused = refusal(plugin, OWN, {"metadata": {"annotations": {"example.com/owner": "me"}}})
    assert refused is not None and refused.status == 403, refused
    assert f"may only change the Node annotation {ANNOTATION}, not example.com/owner" in str(refused)


def test_an_admin_is_not_judged_by_the_policy(plugin: Kube, kube: Kube) -> None:
    kube.patch("nodes", OTHER, {"metadata": {"labels": {"team": "x"}, "annotations": {"example.com/owner": "me"}}})
    kube.patch("nodes", OTHER, {"metadata": {"labels": {"team": None}, "annotations": {"example.com/owner": None}}})
