"""The preemption recipe (docs/recipes/preemption.md) on a real kubelet and containerd: PriorityClasses high and
low; a low-priority pod holds the one free GPU of a node whose other GPUs other high-priority work holds; a
high-priority pod whose claim needs a GPU. The scheduler of the pinned release (1.37) does not preempt for DRA
devices (kubernetes/enhancements#5690): the test asserts what it does instead — the high-priority pod stays Pending
with the scheduler's message, the low-priority pod keeps running with its claim allocated and prepared — and then
the way that works: the low-priority pod deleted, its claim deallocated (deleted) and unprepared by our driver, the
GPU allocated to and prepared for the high-priority pod. The same with a MIG device on one parent (dynamic MIG:
the partition destroyed and carved again).

The node is this module's own (``running_node``: Node preempt-node, h100-nvl-pairs: four H100 NVL, MIG mode
dynamic), so no other test's claim takes one of its GPUs. Every command of the page's sections is run as written,
in a directory holding the page's files with their pods pinned to the node (support/node_pods.py's ``pin_to``),
and must print what the page shows (ages aside)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_fixtures import running_node
from support.control_plane import ControlPlane
from support.kube_rest import Kube
from support.node_pods import Workloads, claims_of, pin_to, unprepared
from support.real_node import RealNode, wait_for
from support.recipe_pages import Console, documents, transcript

PAGE = "preemption.md"
NODE = "preempt-node"
PROFILE = "h100-nvl-pairs"  # four GPUs
DRIVER = "gpu.dradriver.dev"
NAMESPACE = "default"
TIMEOUT = 120.0


BYSTANDER = "preempt-bystander"  # a Node object without a kubelet: the cluster is never this node's alone
#: The scheduler's message (schedule_one.go's FitError): the filters' reasons, then preemption's, each over every
#: Node of the cluster.
SCHEDULER_MESSAGE = re.compile(
    r"(?m)^0/\d+ nodes are available: (?P<filters>.*)\. preemption: 0/\d+ nodes are available: (?P<preemption>.*)\.$"
)


def on_the_node_alone(message: re.Match[str]) -> str:
    """The scheduler's message as it reads in a cluster of the test's node alone: the scheduler counts every Node,
    and a shared control plane (``scripts/test``) has others, which the pinned pod may not use ("N node(s) didn't
    match Pod's node affinity/selector", an untolerated taint, ...) and whose preemption is not helpful either."""
    filters = ", ".join(r for r in message["filters"].split(", ") if " node(s) " not in r)
    preemption = re.sub(r"^\d+ (Preemption is not helpful for scheduling)$", r"1 \1", message["preemption"])
    return f"0/1 nodes are available: {filters}. preemption: 0/1 nodes are available: {preemption}."


def comparable(text: str) -> str:
    """``kubectl get pods`` output without the AGE column's values (the header stays), the generated claims'
    names without their random suffix, and the scheduler's message as on a cluster of the test's node alone."""
    text = re.sub(r"\b(training-gpu)-[a-z0-9]{5}\b", r"\1-xxxxx", text)
    text = SCHEDULER_MESSAGE.sub(on_the_node_alone, text)
    return re.sub(r"(?m) +\d+[smhd](\d+[smhd])?$", "", text)


def pinned(text: str) -> str:
    return yaml.safe_dump_all([pin_to(doc, NODE) for doc in documents(text)])


def node_has_slices(kube: Kube) -> bool:
    found = kube.list("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
    return any(s["spec"].get("devices") for s in found if s["spec"]["driver"] == DRIVER)


def filler(gpus: int) -> list[dict[str, Any]]:
    """Other high-priority work holding ``gpus`` of the node's GPUs (not on the page: the node's "busy" part)."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "busy-gpus", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER,
                                                                                 "count": gpus}}]}}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "busy", "namespace": NAMESPACE},
        "spec": {
            "priorityClassName": "high-priority",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "busy-gpus"}],
            "containers": [{"name": "busy", "image": "busybox:1.36", "command": ["sleep", "infinity"],
                            "resources": {"claims": [{"name": "gpus"}]}}],
        },
    }  # fmt: skip
    return [template, pod]


@pytest.fixture(scope="module")
def bystander(control_plane: ControlPlane) -> Iterator[None]:
    """Another Node in the cluster, as in a full ``scripts/test`` run: the scheduler's message counts it too."""
    control_plane.kube.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": BYSTANDER}})
    try:
        yield
    finally:
        control_plane.kube.delete("nodes", BYSTANDER)


@pytest.fixture(scope="module")
def preempt_node(control_plane: ControlPlane, device_classes: None, bystander: None) -> Iterator[RealNode]:
    try:
        with running_node(control_plane, name=NODE, profile=PROFILE, mig_mode="dynamic") as node:
            wait_for(f"the slices of {NODE}", lambda: node_has_slices(node.kube), 60)
            yield node
    finally:  # after the driver stopped (a running one publishes them again): no claim may get a gone node's GPU
        control_plane.kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")


@pytest.fixture(scope="module")
def busy_node(preempt_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The page's priority classes applied and three of the node's four GPUs held by a high-priority pod; a
    directory holding the page's files, pinned to the node."""
    directory = tmp_path_factory.mktemp("preemption")
    shell = console(preempt_node, directory, "## Priority classes")
    shell.write_files(PAGE, rewrite=pinned)
    shell.next("kubectl apply -f priority-classes.yaml")
    shell.check()
    workloads = Workloads(preempt_node)
    busy = workloads.apply(filler(3))
    try:
        workloads.wait_running(busy[1], TIMEOUT)
        yield directory
    finally:
        workloads.delete(reversed(busy))
        shell.run("kubectl delete -f priority-classes.yaml")


def console(node: RealNode, directory: Path, section: str) -> Console:
    return Console(directory, node.control_plane.kubeconfig, transcript(PAGE, section), normalize=comparable)


@pytest.fixture
def page_pods(preempt_node: RealNode, busy_node: Path) -> Iterator[Path]:
    """The page's pods and templates deleted after each test, and their claims unprepared."""
    yield busy_node
    workloads = Workloads(preempt_node)
    for name in ("notebook", "training", "notebook-mig", "training-mig", "notebook-device-plugin",
                 "training-device-plugin"):  # fmt: skip
        docs = documents((busy_node / f"{name}.yaml").read_text())
        workloads.delete(reversed(docs))
    wait_for("every claim but the busy pod's to be unprepared", lambda: len(preempt_node.prepared_claims()) <= 1, 90)


def only_claim(kube: Kube, pod_name: str) -> dict[str, Any]:
    """The pod's one claim: from its spec.resourceClaims, or the one the scheduler wrote for its extended resource."""
    pod = kube.get("pods", pod_name, NAMESPACE)
    extended = (pod.get("status", {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    [claim] = [kube.get("resourceclaims", extended, NAMESPACE)] if extended else claims_of(kube, pod)
    return claim


def allocated_device(claim: dict[str, Any]) -> str:
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, NODE), result
    return str(result["device"])


def sim_show(node: RealNode) -> str:
    return node.sim("show", "--state-dir", str(node.plugin_dir))


def assert_not_preempted(node: RealNode, low: str, high: str) -> tuple[dict[str, Any], str]:
    """The low-priority pod runs on with its claim allocated and prepared; the high-priority one has no nominated
    node. The low pod's claim and its device."""
    kube = node.kube
    pod = kube.get("pods", low, NAMESPACE)
    assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp"), pod["status"]
    claim = only_claim(kube, low)
    assert claim["metadata"]["uid"] in node.prepared_claims()
    assert not kube.get("pods", high, NAMESPACE)["status"].get("nominatedNodeName")
    return claim, allocated_device(claim)


def assert_handed_over(node: RealNode, victim: dict[str, Any], device: str, high: str) -> dict[str, Any]:
    """The deleted pod's claim is gone (deallocated) and unprepared; the high-priority pod's claim has ``device``
    (or, for MIG, a device of the same parent) and is prepared. That claim."""
    kube = node.kube
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    wait_for(f"claim {name} to be deleted", lambda: kube.find("resourceclaims", name, NAMESPACE) is None, TIMEOUT)
    wait_for(f"claim {name} to be unprepared", lambda: unprepared(node, uid), 90)
    claim = only_claim(kube, high)
    wait_for(f"the claim of {high} to be prepared", lambda: claim["metadata"]["uid"] in node.prepared_claims(), 90)
    given = allocated_device(claim)
    assert given.partition("-mig-")[0] == device.partition("-mig-")[0], (given, device)
    return claim


def test_a_high_priority_pod_waits_for_the_gpu_a_low_priority_pod_holds_until_that_pod_is_deleted(
    preempt_node: RealNode, page_pods: Path
) -> None:
    shell = console(preempt_node, page_pods, "## A training pod that needs it")
    shell.next("kubectl apply -f notebook.yaml")
    shell.next("kubectl wait --for=condition=Ready pod/notebook --timeout=120s")
    shell.next("kubectl apply -f training.yaml")
    shell.next("kubectl get pods notebook training")
    said = shell.next("kubectl get pod training -o jsonpath={.status.conditions[0].message}")
    assert "cannot allocate all claims" in said and "Preemption is not helpful for scheduling" in said, said
    assert not said.startswith("0/1 "), f"the scheduler counted only {NODE}, not {BYSTANDER}: {said}"
    victim, device = assert_not_preempted(preempt_node, "notebook", "training")
    assert "allocated to other claims" in shell.next("dradriver explain --pod default/training")
    shell.next("echo $?")
    shell.check()

    by_hand = console(preempt_node, page_pods, "## Freeing the GPU by hand")
    by_hand.next("kubectl delete pod notebook")
    by_hand.next("kubectl get pods training")
    assert allocated_device(assert_handed_over(preempt_node, victim, device, "training")) == device
    by_hand.check()


def test_the_same_with_a_mig_device_on_one_gpu(preempt_node: RealNode, page_pods: Path) -> None:
    shell = console(preempt_node, page_pods, "## The same with MIG devices on one GPU")
    shell.next("kubectl apply -f notebook-mig.yaml")
    shell.next("kubectl wait --for=condition=Ready pod/notebook-mig --timeout=120s")
    shell.next("kubectl apply -f training-mig.yaml")
    said = shell.next("kubectl get pod training-mig -o jsonpath={.status.conditions[0].message}")
    assert "cannot allocate all claims" in said and "Preemption is not helpful for scheduling" in said, said
    victim, device = assert_not_preempted(preempt_node, "notebook-mig", "training-mig")
    assert "-mig-4g47gb-" in device and victim["metadata"]["uid"] in sim_show(preempt_node)
    shell.next("kubectl delete pod notebook-mig")
    shell.next("kubectl get pods training-mig")
    claim = assert_handed_over(preempt_node, victim, device, "training-mig")
    shown = sim_show(preempt_node)
    assert victim["metadata"]["uid"] not in shown and claim["metadata"]["uid"] in shown, shown
    shell.check()


def test_a_device_plugin_style_pod_is_not_preempted_either(preempt_node: RealNode, page_pods: Path) -> None:
    shell = console(preempt_node, page_pods, "## Device-plugin style pods: preemption that stops working")
    shell.next("kubectl apply -f notebook-device-plugin.yaml")
    shell.next("kubectl wait --for=condition=Ready pod/notebook-dp --timeout=120s")
    shell.next("kubectl apply -f training-device-plugin.yaml")
    said = shell.next("kubectl get pod training-dp -o jsonpath={.status.conditions[0].message}")
    assert "Preemption is not helpful for scheduling" in said, said
    victim, device = assert_not_preempted(preempt_node, "notebook-dp", "training-dp")
    assert victim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    shell.next("kubectl delete pod notebook-dp")
    shell.next("kubectl get pods training-dp")
    assert allocated_device(assert_handed_over(preempt_node, victim, device, "training-dp")) == device
    shell.check()
