"""The manifests in a real API server: every overlay applies with `kubectl apply --server-side`, and the
own-node admission policy really refuses the plugin's token a slice of another node."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cd_cluster import account_token
from support.cluster_node import DRIVER, DriverRun, KubeletStandIn, SimNode
from support.cluster_pods import GatedPod, allocated_devices, kubectl, kubectl_apply
from support.control_plane import ControlPlane, NodeKeeper, write_kubeconfig
from support.kube_rest import ApiError, Credentials, Kube

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (REPO / "manifests" / "overlays").iterdir() if p.is_dir())
NAMESPACE = "dradriver"
ACCOUNT = "dradriver-kubelet-plugin"


def apply(control_plane: ControlPlane, overlay: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(control_plane.kubeconfig), "apply", "--server-side", *extra,
         "-k", str(REPO / "manifests" / "overlays" / overlay)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> None:
    """The sim overlay, installed for real (the other overlays are tried with a server-side dry run on top)."""
    done = apply(control_plane, "sim")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_applies_server_side(installed: None, control_plane: ControlPlane, overlay: str) -> None:
    done = apply(control_plane, overlay, "--dry-run=server")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def plugin_pod(installed: None, nodes: dict[str, SimNode], kube: Kube) -> Iterator[dict[str, Any]]:
    """A pod of the plugin's service account bound to gpu-dgx, as the DaemonSet's pod there would be."""
    pod = kube.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plugin-on-gpu-dgx", "namespace": NAMESPACE},
            "spec": {
                "nodeName": "gpu-dgx",
                "serviceAccountName": ACCOUNT,
                "automountServiceAccountToken": False,
                "containers": [{"name": "plugin", "image": "dradriver:dev"}],
            },
        },
        NAMESPACE,
    )
    yield pod
    kube.delete("pods", pod["metadata"]["name"], NAMESPACE, gracePeriodSeconds="0")


def bound_token(kube: Kube, pod: dict[str, Any]) -> str:
    """A TokenRequest for the plugin's account bound to ``pod`` (so the token carries the pod's node)."""
    return account_token(kube, NAMESPACE, ACCOUNT, pod, expiration_s=600)


def a_slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"policy-test-{node}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": "policy-test", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def first_refusal(admin: Kube, writer: Kube, resource_slice: dict[str, Any]) -> ApiError:
    """The API server's refusal of ``writer``'s slice once the policy is in force: a policy applied moments ago
    takes effect when the API server's informer has it, so a slice admitted before that is removed and retried."""

    def attempt() -> ApiError | None:
        try:
            created = writer.create("resourceslices", resource_slice)
        except ApiError as err:
            return err
        admin.delete("resourceslices", created["metadata"]["name"])
        return None

    return admin.wait("the own-node policy to refuse the slice", attempt)


def test_the_own_node_policy_refuses_the_plugins_token_a_slice_of_another_node(
    plugin_pod: dict[str, Any], control_plane: ControlPlane, kube: Kube
) -> None:
    plugin = Kube(Credentials(control_plane.server, control_plane.pki.ca_cert, token=bound_token(kube, plugin_pod)))
    refused = first_refusal(kube, plugin, a_slice("gpu-nvl"))
    assert refused.status == 403
    assert "may only write ResourceSlices of the node it runs on" in str(refused)
    # Its own node's slice passes RBAC and the policy (then goes: the node's driver owns that node's slices).
    created = plugin.create("resourceslices", a_slice("gpu-dgx"))
    kube.delete("resourceslices", created["metadata"]["name"])


def test_a_token_bound_to_no_pod_names_no_node_and_is_refused(
    installed: None, kube: Kube, control_plane: ControlPlane
) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token"
    token = kube.request("POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                        "spec": {"expirationSeconds": 600}})["status"]["token"]  # fmt: skip
    plugin = Kube(Credentials(control_plane.server, control_plane.pki.ca_cert, token=token))
    refused = first_refusal(kube, plugin, a_slice("gpu-dgx"))
    assert refused.status == 403
    assert "names no node" in str(refused)


def test_the_driver_runs_on_its_own_rbac_under_the_policy(
    installed: None, nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube
) -> None:
    """`dradriver run` with the plugin's bound token instead of admin: the ClusterRole in manifests/ and the
    own-node policy must let it publish, read the claim at prepare and write status.devices (on 1.37 that also
    takes the granular `resourceclaims/driver` rule)."""
    name = "gpu-rbac"
    root = control_plane.root / name
    root.mkdir()
    keeper = NodeKeeper(kube, name)
    pod = kube.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"plugin-on-{name}", "namespace": NAMESPACE},
            "spec": {"nodeName": name, "serviceAccountName": ACCOUNT, "automountServiceAccountToken": False,
                     "containers": [{"name": "plugin", "image": "dradriver:dev"}]},
        },
        NAMESPACE,
    )  # fmt: skip
    kubeconfig = write_kubeconfig(
        root / "plugin.kubeconfig", control_plane.server, control_plane.pki.ca_cert, token=bound_token(kube, pod)
    )
    driver = DriverRun(root, name, kubeconfig, profile="dgx-a100-40gb", mig_mode="none", version="1.35")
    node = SimNode(name, "dgx-a100-40gb", "none", "1.35", root, kubeconfig, keeper, driver,
                   KubeletStandIn(kube, name, root / "registry"))  # fmt: skip
    claim_pod = GatedPod(kube, "rbac-single-gpu", "single-gpu", node=name)
    try:
        kube.wait(
            "slices published with the plugin's token",
            lambda: kube.list("resourceslices", fieldSelector=f"spec.nodeName={name}"),
        )
        kubectl_apply(kubectl(), control_plane.kubeconfig, REPO / "examples" / "claims" / "single-gpu.yaml")
        claim_pod.create()
        assert claim_pod.release() == "scheduled"
        claim = claim_pod.claim()
        prepared = node.kubelet.prepare(claim_pod.get())[claim["metadata"]["uid"]]
        assert prepared.error == ""
        [device] = allocated_devices(claim)
        kube.wait(
            "status.devices written with the plugin's token",
            lambda: (
                [
                    (d["driver"], d["pool"], d["device"])
                    for d in kube.get("resourceclaims", claim["metadata"]["name"], "default")
                    .get("status", {})
                    .get("devices")
                    or []
                ]
                == [device]
            ),
        )
        assert "HTTP 403" not in driver.log and "forbidden" not in driver.log.lower(), driver.log
    finally:
        (control_plane.logs / f"dradriver-{name}.log").write_text(driver.log)
        claim_pod.delete()
        node.stop()
        kube.delete("pods", pod["metadata"]["name"], NAMESPACE, gracePeriodSeconds="0")
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={name}")
        kube.delete("nodes", name)


def claim_with(parameters: dict[str, Any], template: bool) -> dict[str, Any]:
    devices = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}],
        "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}],
    }
    meta = {"generateName": "config-policy-"}
    if template:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": meta,
                "spec": {"spec": {"devices": devices}}}  # fmt: skip
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": {"devices": devices}}


def test_the_config_policy_refuses_malformed_opaque_configs_and_admits_good_ones(installed: None, kube: Kube) -> None:
    """The API server runs the policy's CEL (and accepts its cost) with the verdicts of the pydantic models, each
    bad config refused by the rule it breaks (tests/test_config_admission_policy.py: RULES)."""
    from tests.driver.prepare.config_table import GOOD, gpu
    from tests.test_config_admission_policy import REFUSED, messages

    def refused(parameters: dict[str, Any], template: bool) -> str | None:
        plural = "resourceclaimtemplates" if template else "resourceclaims"
        try:
            created = kube.create(plural, claim_with(parameters, template), "default")
        except ApiError as err:
            assert err.status == 422, err  # the policy's validations name no reason: Invalid (RBAC would be 403)
            return str(err)
        kube.delete(plural, created["metadata"]["name"], "default")
        return None

    # A new policy takes effect once the API server's informer has it: wait for the first refusal.
    message = kube.wait("the config policy", lambda: refused(gpu(computeMode="Exclusive"), False))
    assert "computeMode allows Default, ExclusiveProcess or Prohibited" in message
    for template in (False, True):
        for config, why, rules in REFUSED:
            # The API server's denial names the first validation that failed, in the policy's order.
            message = refused(config, template)
            assert message is not None and messages(*rules)[0] in message, f"{message}; the models say: {why}"
        for config in GOOD:
            assert refused(config, template) is None, config
