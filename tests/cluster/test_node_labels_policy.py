"""The chart's ownNodeLabels admission policy in a real API server: with nodeLabels.enabled the plugin's service
account may patch nodes, and the policy lets its token (bound to a pod on one node, so it carries that node) change
only that Node's labels under the prefixes the driver owns and its one annotation; any other change is refused
with the rule's message, while an admin's edit of the same Node is not judged. The driver's own NodeLabeler, on
such a token, has the patches it really sends (labels, nulls for removed keys, its annotation, the resourceVersion
precondition) judged by the policy: it writes, changes and removes its labels, leaves an admin's label under the
owned prefixes alone, recomputes a write that lost a race (a real 409), and is refused another Node (a WARNING).

The chart's plugin ServiceAccount, ClusterRole, binding and the policy are rendered with `helm template` under a
release of their own (``nodelabels``) and applied; two Nodes of this module (tainted, so nothing schedules there)
stand for the plugin's node and another one. tests/test_node_labels_policy.py evaluates the same policy on many
more requests with our CEL interpreter."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from support.cd_cluster import account_token
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane, write_kubeconfig
from support.helm import CHART, run_helm
from support.kube_rest import ApiError, Credentials, Kube
from support.nodes import inventory_of

from dradriver.driver.publish.node_labeler import HostFacts, NodeLabeler, NodeLabelerOptions
from dradriver.driver.publish.node_labels import MigStrategy
from dradriver.plugin.cluster import Cluster, ConflictError
from dradriver.plugin.cluster.kube import KubeCluster

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
    return account_token(kube, NAMESPACE, ACCOUNT, pod, expiration_s=600)


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


MIXED = inventory_of("mixed")
ADMINS = "nvidia.com/gpu.present"  # an administrator's label under the owned prefixes, there before the driver


@pytest.fixture
def plugin_cluster(plugin: Kube, kube: Kube, control_plane: ControlPlane, tmp_path: Path) -> Cluster:
    """The driver's cluster adapter on a token of the plugin's account bound to its pod on ``OWN``."""
    token = bound_token(kube, kube.get("pods", f"plugin-on-{OWN}", NAMESPACE))
    config = write_kubeconfig(tmp_path / "kubeconfig", control_plane.server, control_plane.pki.ca_cert, token=token)
    return KubeCluster.from_kubeconfig(str(config))


@pytest.fixture
def admins_label(kube: Kube) -> Iterator[None]:
    """``OWN`` with an administrator's ``nvidia.com/gpu.present=true``; afterwards as the module left it."""
    kube.patch("nodes", OWN, {"metadata": {"labels": {ADMINS: "true"}}})
    yield
    extra = [key for key in labels_of(kube, OWN) if key != "kubernetes.io/hostname"]
    kube.patch("nodes", OWN, {"metadata": {"labels": dict.fromkeys(extra), "annotations": {ANNOTATION: None}}})


def labeler(cluster: Cluster, node: str) -> NodeLabeler:
    options = NodeLabelerOptions(driver_name="gpu.dradriver.dev", node_name=node, mig_strategy=MigStrategy.MIXED)
    return NodeLabeler(cluster, options, host=HostFacts(None))


def listed(kube: Kube) -> list[str]:
    return str((kube.get("nodes", OWN)["metadata"].get("annotations") or {}).get(ANNOTATION, "")).split(",")


@pytest.mark.usefixtures("admins_label")
def test_the_driver_writes_changes_and_removes_its_labels_as_the_policy_allows(
    plugin_cluster: Cluster, kube: Kube
) -> None:
    labels = labeler(plugin_cluster, OWN)
    assert labels.update(MIXED)
    written = labels_of(kube, OWN)
    assert written["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert written["nvidia.com/mig-3g.20gb.count"] == "1"
    assert "nvidia.com/mig-3g.20gb.count" in listed(kube) and ADMINS not in listed(kube)
    assert labels.update(replace(MIXED, mig_devices=()))  # the MIG devices gone: their keys set to null
    assert not [key for key in labels_of(kube, OWN) if key.startswith("nvidia.com/mig-")]
    labels.remove()  # what --node-labels none does at start
    assert labels_of(kube, OWN) == {"kubernetes.io/hostname": OWN, ADMINS: "true"}
    assert ANNOTATION not in (kube.get("nodes", OWN)["metadata"].get("annotations") or {})


class RacedCluster:
    """The plugin's adapter, but an admin edits the Node between the labeler's first read and its first write."""

    def __init__(self, cluster: Cluster, admin: Kube) -> None:
        self.cluster, self.admin, self.raced, self.conflicts = cluster, admin, False, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if not self.raced:
            self.raced = True
            self.admin.patch("nodes", name, {"metadata": {"labels": {"example.com/raced": "yes"}}})
        try:
            return self.cluster.patch_node(name, patch)
        except ConflictError:
            self.conflicts += 1
            raise


@pytest.mark.usefixtures("admins_label")
def test_a_write_that_lost_a_race_gets_a_409_and_is_recomputed(plugin_cluster: Cluster, kube: Kube) -> None:
    raced = RacedCluster(plugin_cluster, kube)
    assert labeler(cast(Cluster, raced), OWN).update(MIXED)
    assert raced.conflicts == 1
    assert labels_of(kube, OWN)["nvidia.com/gpu.count"] == "4"
    assert labels_of(kube, OWN)["example.com/raced"] == "yes"


def test_another_node_is_refused_with_a_warning(
    plugin_cluster: Cluster, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert not labeler(plugin_cluster, OTHER).update(MIXED)
    assert f"cannot write GPU Feature Discovery's labels on Node {OTHER}" in caplog.text
    assert "may only change the Node it runs on" in caplog.text
    assert "nvidia.com/gpu.product" not in labels_of(kube, OTHER)
