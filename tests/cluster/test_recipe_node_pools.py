"""The node-pool recipe (docs/recipes/node-pools.md) on a control plane of this module's own (the real API server,
scheduler and controller manager): two GPU pools of simulated nodes served by `dradriver run --node-labels gfd`
(train-1: eight H100 80GB HBM3, infer-1: four H100 NVL), labelled and tainted by the page's commands, a DeviceClass
per pool, and a CPU node with no driver. Each pool's workload is bound to its pool's node with devices of its
product; a claim of the training class stays Pending when the training pool is full, even with free inference GPUs,
and `dradriver explain --pod` says why; a pod without the toleration never lands on a GPU node; a pod with the
toleration and no GPU may, unless the page's affinity keeps it off. Every command of the page runs as written, in
a directory holding the page's files, and must print what the page shows (generated names and ages aside).

Its own control plane: the session's GPU nodes (conftest.py) are not tainted, and a pod without a toleration or
node selector could land on them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.cluster_fixtures import own_plane
from support.cluster_node import SimNode
from support.cluster_pods import allocated_devices
from support.control_plane import ControlPlane, NodeKeeper
from support.kube_rest import Kube
from support.recipe_pages import Console, transcript

REPO = Path(__file__).resolve().parents[2]
PAGE = "node-pools.md"
NAMESPACE = "default"
TIMEOUT = 120.0
DRIVER = "gpu.dradriver.dev"
# The page's GPU nodes: node -> (simulated profile, the product of its GPUs).
GPU_NODES = {
    "train-1": ("hgx-h100-80gb", "NVIDIA H100 80GB HBM3"),
    "infer-1": ("h100-nvl-pairs", "NVIDIA H100 NVL"),
}
CPU_NODE = "cpu-1"
GFD = ("--node-labels", "gfd", "--rescan-interval", "1")
KUBELET_VERSION = "v1.37.2"  # what a kubelet of the control plane's release reports in the Node's status


def normalized(text: str) -> str:
    """Random name suffixes, ages and column padding made one."""
    text = re.sub(r"\b(trainer-gpus|server-gpu|finetune-gpu)-[a-z0-9]{5}\b", r"\1-xxxxx", text)
    text = re.sub(r"(?m)^(\S+ +\S+ +\S*) +\d+[smhd](\d+[smhd])? ", r"\1 AGE ", text)  # kubectl get nodes' AGE
    return re.sub(r" +", " ", text).replace(" \n", "\n").strip()


def either_gpu_node(text: str) -> str:
    """As ``normalized``; also the GPU node ``tolerant`` went to, which the scheduler picks among equal scores."""
    return re.sub(r"(?m)^(tolerant +)(train-1|infer-1)$", r"\1a-gpu-node", normalized(text))


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    yield from own_plane(needed_by="the node-pool recipe", prefix="dra-np-", who="node-pool recipe test")


@pytest.fixture(scope="module")
def pools(plane: ControlPlane) -> Iterator[Path]:
    """The page's cluster, its nodes labelled and tainted and its classes applied by the page's first commands (which
    must print what the page shows); a directory holding the page's files."""
    cpu = NodeKeeper(plane.kube, CPU_NODE)
    started: list[SimNode] = []
    try:
        start_gpu_nodes(plane, started)
        for name in (CPU_NODE, *GPU_NODES):
            plane.kube.patch("nodes", name, {"status": {"nodeInfo": {"kubeletVersion": KUBELET_VERSION}}}, sub="status")
        directory = plane.root / "recipe"
        directory.mkdir()
        shell = Console(directory, plane.kubeconfig, transcript(PAGE, "## Label and taint the GPU nodes"),
                        normalize=normalized)  # fmt: skip
        shell.write_files(PAGE)
        for step in shell.steps:
            shell.next(step.command)
        shell.check()
        yield directory
    finally:
        for node in started:
            (plane.logs / f"dradriver-{node.name}.log").write_text(node.driver.log)
            node.stop()
        cpu.stop()


def start_gpu_nodes(plane: ControlPlane, started: list[SimNode]) -> None:
    """The page's GPU nodes, each served by `dradriver run --node-labels gfd` (appended to ``started`` as they
    start), once their GFD labels and slices are in the API server."""
    kube = plane.kube
    for name, (profile, _) in GPU_NODES.items():
        root = plane.root / name
        started.append(SimNode.start(kube, plane.kubeconfig, root, name, profile=profile, mig_mode="none", extra=GFD))
    for name in GPU_NODES:
        kube.wait(f"GFD's labels on {name}", partial(gpu_present_label, kube, name))
        kube.wait(f"{name}'s slices", partial(kube.list, "resourceslices", fieldSelector=f"spec.nodeName={name}"))


@pytest.fixture
def recipe(plane: ControlPlane, pools: Path) -> Iterator[Path]:
    """The page's cluster for one test; the test's pods, claims and templates go after it, and cpu-1 is uncordoned."""
    yield pools
    kube = plane.kube
    for pod in kube.list("pods", NAMESPACE):
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):  # a bound pod waits for its kubelet to confirm; none runs here
            kube.patch("pods", name, {"status": {"phase": "Succeeded"}}, NAMESPACE, sub="status")
        kube.delete("pods", name, NAMESPACE, gracePeriodSeconds="0")
    kube.wait("the pods to go", lambda: not kube.list("pods", NAMESPACE), TIMEOUT)
    kube.wait("the generated claims to go", lambda: not kube.list("resourceclaims", NAMESPACE), TIMEOUT)
    kube.delete_all("resourceclaimtemplates", NAMESPACE)
    kube.patch("nodes", CPU_NODE, {"spec": {"unschedulable": None}})


def labels_of(kube: Kube, node: str) -> dict[str, str]:
    return dict(kube.get("nodes", node)["metadata"].get("labels") or {})


def gpu_present_label(kube: Kube, node: str) -> str | None:
    return labels_of(kube, node).get("nvidia.com/gpu.present")


def console(
    plane: ControlPlane, directory: Path, section: str, normalize: Callable[[str], str] = normalized
) -> Console:
    return Console(directory, plane.kubeconfig, transcript(PAGE, section), normalize=normalize, timeout=TIMEOUT)


def claim_of(kube: Kube, pod: str) -> dict[str, Any]:
    statuses = kube.get("pods", pod, NAMESPACE).get("status", {}).get("resourceClaimStatuses") or []
    [name] = [s["resourceClaimName"] for s in statuses]
    return kube.get("resourceclaims", name, NAMESPACE)


def products(kube: Kube, claim: dict[str, Any]) -> list[tuple[str, str]]:
    """(node, productName) of each device allocated to ``claim``, read from the ResourceSlices."""
    found = []
    for driver, pool, device in allocated_devices(claim):
        assert driver == DRIVER
        [published] = [
            d
            for s in kube.list("resourceslices", fieldSelector=f"spec.driver={DRIVER}")
            if s["spec"]["pool"]["name"] == pool
            for d in s["spec"].get("devices") or []
            if d["name"] == device
        ]
        found.append((pool, published["attributes"]["productName"]["string"]))
    return found


CORDON_PROBE = "cordon-probe"


def cordon_seen_by_the_scheduler(kube: Kube) -> None:
    """Return once the scheduler's cache has cpu-1 cordoned: ``kubectl cordon`` returns when the Node is written,
    before the scheduler has it, and a pod applied at once could still be placed on cpu-1. A throwaway pod only
    cpu-1 may take (its name as a matchFields affinity) must be reported unschedulable for the cordon; then it goes."""
    only_cpu_1 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [CPU_NODE]}]}
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": CORDON_PROBE, "namespace": NAMESPACE},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [only_cpu_1]}}},
            "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10"}],
        },
    }  # fmt: skip
    kube.create("pods", probe, NAMESPACE)
    try:
        kube.wait("the scheduler to find cpu-1 cordoned", partial(refused_for_the_cordon, kube), TIMEOUT)
    finally:
        kube.delete("pods", CORDON_PROBE, NAMESPACE, gracePeriodSeconds="0")
        kube.wait("the probe pod to go", lambda: kube.find("pods", CORDON_PROBE, NAMESPACE) is None, TIMEOUT)


def refused_for_the_cordon(kube: Kube) -> bool:
    conditions = kube.get("pods", CORDON_PROBE, NAMESPACE).get("status", {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        and "node(s) were unschedulable" in c.get("message", "")
        for c in conditions
    )  # fmt: skip


def test_the_gpu_nodes_carry_the_pool_label_the_taint_and_gfd_labels(plane: ControlPlane, recipe: Path) -> None:
    for name, (_, product) in GPU_NODES.items():
        labels = labels_of(plane.kube, name)
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.product"] == product.replace(" ", "-")
        taints = plane.kube.get("nodes", name)["spec"]["taints"]
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    assert "nvidia.com/gpu.present" not in labels_of(plane.kube, CPU_NODE)


def test_each_pools_workload_lands_in_its_pool(plane: ControlPlane, recipe: Path) -> None:
    shell = console(plane, recipe, "## Each workload lands in its pool")
    shell.next("kubectl apply -f training.yaml")
    shell.next("kubectl apply -f inference.yaml")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")
    shell.next(
        "kubectl get resourceclaims -o custom-columns='CLAIM:.metadata.name,POOL:.status.allocation.devices.results[0]"
        ".pool,DEVICES:.status.allocation.devices.results[*].device'"
    )
    shell.check()
    kube = plane.kube
    assert kube.get("pods", "trainer", NAMESPACE)["spec"]["nodeName"] == "train-1"
    assert products(kube, claim_of(kube, "trainer")) == [("train-1", "NVIDIA H100 80GB HBM3")] * 8
    assert kube.get("pods", "server", NAMESPACE)["spec"]["nodeName"] == "infer-1"
    assert products(kube, claim_of(kube, "server")) == [("infer-1", "NVIDIA H100 NVL")]


def test_a_claim_of_the_full_training_pool_stays_pending_beside_free_inference_gpus(
    plane: ControlPlane, recipe: Path
) -> None:
    shell = console(plane, recipe, "## A full pool does not spill into the other")
    shell.next("kubectl apply -f training.yaml")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")  # trainer bound first
    shell.next("kubectl apply -f finetune.yaml")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")
    assert "cannot allocate all claims" in shell.next(
        "kubectl get pod finetune -o jsonpath='{.status.conditions[0].message}'"
    )
    explained = shell.next("dradriver explain --pod finetune")
    assert "does NOT fit on node infer-1" in explained and 'productName is "NVIDIA H100 NVL" (4)' in explained
    assert "train-1: does not fit: request gpu: 8 matching devices are allocated to other claims" in explained
    shell.next("echo $?")
    shell.check()
    kube = plane.kube
    assert not kube.get("pods", "finetune", NAMESPACE)["spec"].get("nodeName")
    assert not claim_of(kube, "finetune").get("status", {}).get("allocation")
    # infer-1's four GPUs were free all along: no claim holds any of them.
    held = [pool for claim in kube.list("resourceclaims", NAMESPACE) for _, pool, _ in allocated_devices(claim)]
    assert held == ["train-1"] * 8


def test_a_pod_without_the_toleration_waits_rather_than_land_on_a_gpu_node(plane: ControlPlane, recipe: Path) -> None:
    shell = console(plane, recipe, "## CPU pods stay off the GPU nodes")
    shell.next("kubectl cordon cpu-1")
    cordon_seen_by_the_scheduler(plane.kube)
    shell.next("kubectl apply -f web.yaml")
    message = shell.next("kubectl get pod web -o jsonpath='{.status.conditions[0].message}'")
    assert "untolerated taint" in message
    assert not plane.kube.get("pods", "web", NAMESPACE)["spec"].get("nodeName")
    shell.next("kubectl uncordon cpu-1")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")
    shell.check()
    assert plane.kube.get("pods", "web", NAMESPACE)["spec"]["nodeName"] == CPU_NODE


def test_a_pod_with_the_gpu_toleration_and_no_gpu_lands_on_a_gpu_node_unless_its_affinity_keeps_it_off(
    plane: ControlPlane, recipe: Path
) -> None:
    shell = console(plane, recipe, "## A toleration lets a pod in, it does not keep it there", either_gpu_node)
    shell.next("kubectl cordon cpu-1")
    cordon_seen_by_the_scheduler(plane.kube)
    shell.next("kubectl apply -f tolerant.yaml")
    shell.next("kubectl apply -f tolerant-cpu-only.yaml")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")
    shell.next("kubectl uncordon cpu-1")
    shell.next("kubectl get pods -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName")
    shell.check()
    kube = plane.kube
    assert kube.get("pods", "tolerant", NAMESPACE)["spec"]["nodeName"] in GPU_NODES
    assert kube.get("pods", "tolerant-cpu-only", NAMESPACE)["spec"]["nodeName"] == CPU_NODE
