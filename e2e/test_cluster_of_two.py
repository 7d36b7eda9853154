"""Two kind nodes (a control plane and a worker), made with README's "Try it on kind" commands and one more
node in the config: the plugin pod runs on the worker only (the control plane keeps its taint), reaching the API
server through its service from another node; pods on the worker reach CoreDNS on the control plane over the pod
network scripts/build-kind's node image sets up (no kindnetd); README's scenario runs on the worker. Only on
the kind backend; this module sorts before the others, so its cluster is gone before theirs is made."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kind_backend
import pytest
from kindutil import DAEMONSET, NAMESPACE, Cluster
from support.real_node import wait_for

pytestmark = pytest.mark.e2e
DRIVER = "gpu.dradriver.dev"


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[kind_backend.KindRun]:
    if kind_backend.backend() != "kind":
        pytest.skip("two kind nodes run on the kind backend (E2E_BACKEND=kind)")
    with kind_backend.kind_cluster(Path(tempfile.mkdtemp(prefix="dradriver-kind-")), workers=1) as kind:
        yield kind


def nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The cluster's nodes by role: control-plane, worker."""
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    by_role = {}
    for node in items:
        labels = node["metadata"]["labels"]
        by_role["control-plane" if "node-role.kubernetes.io/control-plane" in labels else "worker"] = node
    return by_role


def test_the_plugin_runs_on_the_worker_and_publishes_its_devices(two_nodes: kind_backend.KindRun) -> None:
    cluster = two_nodes.cluster()
    worker = nodes(cluster)["worker"]["metadata"]["name"]
    pods = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json"))["items"]
    plugin = [p for p in pods if p["metadata"]["name"].startswith(DAEMONSET.split("/")[1])]
    assert [p["spec"]["nodeName"] for p in plugin] == [worker], plugin
    assert not plugin[0]["spec"].get("hostNetwork"), "the chart's defaults: the pod network"
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
    assert {s["spec"]["nodeName"] for s in slices if s["spec"]["driver"] == DRIVER} == {worker}


def test_a_pod_on_the_worker_resolves_names_through_coredns_on_the_control_plane(
    two_nodes: kind_backend.KindRun,
) -> None:
    cluster = two_nodes.cluster()
    by_role = nodes(cluster)
    control_plane, worker = by_role["control-plane"]["metadata"]["name"], by_role["worker"]["metadata"]["name"]
    coredns = json.loads(cluster.kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "json"))
    there = [p["status"]["podIP"] for p in coredns["items"] if p["spec"].get("nodeName") == control_plane]
    assert there, "CoreDNS runs on the control plane (it tolerates its taint and started before the worker)"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lookup", "namespace": "default"},
        "spec": {
            "nodeName": worker,
            "restartPolicy": "Never",
            "containers": [{"name": "lookup", "image": "busybox:1.36",
                            "command": ["busybox", "nslookup", "kubernetes.default.svc.cluster.local", there[0]]}],
        },
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        phase = wait_for("the lookup pod to finish", lambda: finished(cluster, "lookup"), 120, interval=1)
        logs = cluster.kubectl("logs", "lookup")
        assert phase == "Succeeded" and "10.96.0.1" in logs, logs
    finally:
        cluster.kubectl("delete", "pod", "lookup", "--ignore-not-found", "--wait=false")


def finished(cluster: Cluster, pod: str) -> str | None:
    phase = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json"))["status"].get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_the_readme_scenario_runs_on_the_worker(two_nodes: kind_backend.KindRun) -> None:
    rest = kind_backend.quickstart()[len(kind_backend.setup_commands()) :]
    printed = [two_nodes.sh(line, timeout=300) for line in rest]
    assert any("DRADRIVER_DEVICE_" in out and "=GPU-" in out for out in printed), printed
