"""Workloads written for NVIDIA's device plugin on the real kubelet and containerd with our driver (issue #35,
docs/migrating-from-device-plugin.md): `dradriver convert`'s output for a time-sliced Deployment runs both replicas
on one simulated GPU; a pod written for the plugin (limits only, GPU Feature Discovery's labels in its node
selector, the GPU taint's toleration) runs unchanged through the DeviceClass's extendedResourceName with the
driver's `--node-labels gfd`.

The node is this module's own (Node dp-move: `running_node`, its driver started with `--node-labels gfd`), so the
GFD labels and the nvidia.com/gpu taint never reach the other node tests' node. The API server cannot reach a
kubelet by that name for `kubectl logs` (docs/node-tests.md): containers' output is read from the kubelet's pod
log files. As every workload of the node tests, the manifests are pinned to the node (support/node_pods.py:
a hostname selector, the node's test taint tolerated, images never pulled); nothing else of them is changed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_fixtures import running_node
from support.control_plane import ControlPlane
from support.kube_rest import Kube
from support.node_pods import POD_TIMEOUT, Workloads, claims_of, unprepared
from support.real_node import RealNode, wait_for

NODE = "dp-move"
NAMESPACE = "default"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/device-plugin"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# What the simulated `mixed` node's GPUs are, as GFD names the product (docs/node-labels.md).
PRODUCT = "NVIDIA-A100-SXM4-40GB"
# Prints the devices the container was given, then stays up.
REPORT = ["sh", "-c", "env | grep ^DRADRIVER_DEVICE_ | sort; sleep 3600"]


@pytest.fixture(scope="module")
def move_node(control_plane: ControlPlane, device_classes: None) -> Iterator[RealNode]:
    with running_node(control_plane, name=NODE, driver_args=("--node-labels", "gfd")) as node:
        yield node


@pytest.fixture
def moved(move_node: RealNode) -> Workloads:
    return Workloads(move_node)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def devices_seen(node: RealNode, pod: dict[str, Any]) -> list[str]:
    """The DRADRIVER_DEVICE_* lines the pod's container printed (waiting until it printed one)."""

    def printed() -> list[str] | None:
        fresh = node.kube.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        lines = [line for lines in node.container_output(fresh).values() for line in lines]
        return [line for line in lines if line.startswith("DRADRIVER_DEVICE_")] or None

    seen: list[str] = wait_for(f"pod {pod['metadata']['name']} to print its devices", printed, 60)
    return seen


def time_sliced_deployment(name: str) -> dict[str, Any]:
    """The fixture's Deployment (two replicas, nvidia.com/gpu: 1 each), named ``name``, its container reporting."""
    [deployment] = [d for d in yaml.safe_load_all((FIXTURES / "time-sliced-deployment.yaml").read_text()) if d]
    deployment["metadata"]["name"] = name
    deployment["spec"]["selector"]["matchLabels"] = deployment["spec"]["template"]["metadata"]["labels"] = {"app": name}
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    container["command"] = REPORT
    assert deployment["spec"]["replicas"] == 2 and container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    result: dict[str, Any] = deployment
    return result


def convert(tmp_path: Path, *workloads: dict[str, Any]) -> list[dict[str, Any]]:
    """What `dradriver convert` prints for the device plugin's time-slicing config and ``workloads``."""
    (tmp_path / "workloads.yaml").write_text(yaml.safe_dump_all(list(workloads)))
    done = subprocess.run(
        [sys.executable, "-m", "dradriver", "convert", str(FIXTURES / "time-slicing-config.yaml"),
         str(tmp_path / "workloads.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_converts_time_sliced_deployment_runs_two_replicas_on_one_gpu(
    move_node: RealNode, moved: Workloads, kube: Kube, tmp_path: Path
) -> None:
    docs = convert(tmp_path, time_sliced_deployment(unique("notebooks")))
    [claim] = [d for d in docs if d["kind"] == "ResourceClaim"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"
    moved.apply(docs)
    try:
        pods = moved.wait_running(deployment, POD_TIMEOUT)
        assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
        # Both replicas hold the one shared claim, so the one GPU: the same device, the same UUID.
        assert {c["metadata"]["name"] for p in pods for c in claims_of(kube, p)} == {claim["metadata"]["name"]}
        first, second = (devices_seen(move_node, p) for p in pods)
        assert first == second and len(first) == 1 and first[0].split("=", 1)[1].startswith("GPU-"), (first, second)
        uid = kube.get("resourceclaims", claim["metadata"]["name"], NAMESPACE)["metadata"]["uid"]
    finally:
        moved.delete(reversed(docs))
    wait_for("the shared claim to be unprepared", lambda: unprepared(move_node, uid), 90)


def device_plugin_pod(name: str, *, product: str = PRODUCT, tolerate: bool = True) -> dict[str, Any]:
    """A pod as written for NVIDIA's device plugin: one nvidia.com/gpu in its limits, GFD's labels in its node
    selector, the GPU nodes' taint tolerated; no claim."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product},
        "containers": [
            {"name": "app", "image": "busybox:1.36", "command": REPORT, "resources": {"limits": {"nvidia.com/gpu": 1}}}
        ],
    }
    if tolerate:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


@pytest.fixture
def gpu_taint(move_node: RealNode, kube: Kube) -> Iterator[None]:
    """The node tainted as GPU node pools commonly are (nvidia.com/gpu=present:NoSchedule), for the test."""

    def taints() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = kube.get("nodes", NODE)["spec"].get("taints") or []
        return found

    kube.patch("nodes", NODE, {"spec": {"taints": [*taints(), GPU_TAINT]}})
    yield
    kube.patch("nodes", NODE, {"spec": {"taints": [t for t in taints() if t["key"] != GPU_TAINT["key"]]}})


def unschedulable_because(kube: Kube, name: str) -> str:
    """The scheduler's message once it found no node for pod ``name``."""

    def refused() -> str | None:
        conditions = kube.get("pods", name, NAMESPACE).get("status", {}).get("conditions") or []
        said = [c for c in conditions if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]
        return str(said[0].get("message", "")) if said else None

    message: str = wait_for(f"the scheduler to refuse pod {name}", refused, 60)
    return message


def test_a_pod_written_for_the_device_plugin_runs_unchanged_with_gfd_labels(
    move_node: RealNode, moved: Workloads, kube: Kube, gpu_taint: None
) -> None:
    labels = wait_for("the driver's GFD labels on the Node", lambda: gfd_labels(kube), 60)
    assert labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.product"] == PRODUCT, labels
    pod = device_plugin_pod(unique("dp-style"))
    moved.apply([pod])
    try:
        [running] = moved.wait_running(pod, POD_TIMEOUT)
        [seen] = devices_seen(move_node, running)
        assert seen.split("=", 1)[1].startswith("GPU-"), seen
        # The scheduler wrote the claim for the limit from our DeviceClass and allocated one of this node's GPUs.
        claim_name = running["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = kube.get("resourceclaims", claim_name, NAMESPACE)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.dradriver.dev", NODE), result
        uid = claim["metadata"]["uid"]
    finally:
        moved.delete([pod])
    wait_for("the scheduler's claim to be unprepared", lambda: unprepared(move_node, uid), 90)


def test_the_gfd_labels_and_the_taint_are_what_places_such_a_pod(moved: Workloads, kube: Kube, gpu_taint: None) -> None:
    """The check above can fail: another product in the selector, or no toleration of the taint, and the pod stays
    Pending."""
    wait_for("the driver's GFD labels on the Node", lambda: gfd_labels(kube), 60)
    other = device_plugin_pod(unique("dp-h100"), product="NVIDIA-H100-80GB-HBM3")
    untolerated = device_plugin_pod(unique("dp-untolerated"), tolerate=False)
    moved.apply([other, untolerated])
    try:
        assert "didn't match Pod's node affinity/selector" in unschedulable_because(kube, other["metadata"]["name"])
        assert "untolerated taint" in unschedulable_because(kube, untolerated["metadata"]["name"])
    finally:
        moved.delete([other, untolerated])


def gfd_labels(kube: Kube) -> dict[str, str] | None:
    """The Node's labels once the driver wrote GFD's product label on it."""
    labels: dict[str, str] = kube.get("nodes", NODE)["metadata"].get("labels") or {}
    return labels if "nvidia.com/gpu.product" in labels else None
