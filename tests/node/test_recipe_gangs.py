"""The gang recipe (docs/recipes/gangs.md) on a real kubelet and containerd: a PodGroup with ``gang.minCount: 4``
and four pods that each need a GPU of our driver, on a node with four simulated GPUs of which one is held by
another pod. With three free GPUs the scheduler places none of the four (no claim allocated, no pod bound, the
PodGroup and every pod say why); once the holder is deleted all four are bound to four different GPUs and start.

The node is this module's own (``running_node``: Node gang-node, h100-nvl-pairs, four GPUs), so no other test's
pod or claim takes one of its GPUs. The manifests are the page's YAML blocks, applied as written (pinned to the
node by support/node_pods.py's ``pin_to``); the commands of the page's two sections that run the gang are run as
written, in a directory holding those files, and must print what the page shows (ages and the claims' random
suffixes aside; the blocks the page calls illustrative are not compared)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_fixtures import running_node
from support.control_plane import ControlPlane
from support.kube_rest import Kube
from support.node_pods import Workloads, cdi_specs_of, claims_of, pin_to, wait_gone
from support.real_node import RealNode, wait_for
from support.recipe_pages import Console, documents, transcript

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "recipes" / "gangs.md"
NODE = "gang-node"
PROFILE = "h100-nvl-pairs"  # four GPUs
NAMESPACE = "gang-demo"
GROUP = "training"
HOLDER = "gpu-holder"
DRIVER = "gpu.dradriver.dev"
TIMEOUT = 120.0
UNTESTED_HEADING = "\n## Kueue: "
PODGROUP_CONDITION = (
    "kubectl -n gang-demo get podgroup training -o jsonpath='{.status.conditions[0].type} "
    "{.status.conditions[0].status} {.status.conditions[0].reason}: {.status.conditions[0].message}'"
)
PODS_AND_NODES = (
    "kubectl -n gang-demo get pods -o custom-columns=NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName"
)


def comparable(text: str) -> str:
    """The generated claims' random suffixes, ages and column padding made one."""
    text = re.sub(r"\b(gpu-holder-gpu|worker-\d-gpu)-[a-z0-9]{5}\b", r"\1-xxxxx", text)
    text = re.sub(r"(?m) +\d+[smhd](\d+[smhd])?$", "", text)
    return re.sub(r" +", " ", text)


def console(node: RealNode, directory: Path, section: str) -> Console:
    return Console(directory, node.control_plane.kubeconfig, transcript(PAGE.name, section), normalize=comparable,
                   timeout=TIMEOUT)  # fmt: skip


def page_blocks() -> list[list[dict[str, Any]]]:
    """The documents of each ```yaml block of the page, in order, up to its Kueue section (which the page says
    no test applies)."""
    tested = PAGE.read_text().split(UNTESTED_HEADING)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```", tested, flags=re.S | re.M)
    return [[doc for doc in yaml.safe_load_all(block) if doc] for block in blocks]


def named(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def podgroup(kube: Kube) -> dict[str, Any]:
    path = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NAMESPACE}/podgroups/{GROUP}"
    found: dict[str, Any] = kube.request("GET", path)
    return found


def group_condition(kube: Kube) -> dict[str, Any] | None:
    """The PodGroup's PodGroupInitiallyScheduled condition, once the scheduler wrote one."""
    conditions = podgroup(kube).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodGroupInitiallyScheduled"), None)


def pod_scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    conditions = pod.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


def node_has_slices(kube: Kube) -> bool:
    found = kube.list("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
    return any(s["spec"].get("devices") for s in found if s["spec"]["driver"] == DRIVER)


@pytest.fixture(scope="module")
def gang_node(control_plane: ControlPlane, device_classes: None) -> Iterator[RealNode]:
    try:
        with running_node(control_plane, name=NODE, profile=PROFILE, mig_mode="none") as node:
            wait_for(f"the slices of {NODE}", lambda: node_has_slices(node.kube), 60)
            yield node
    finally:  # after the driver stopped (a running one publishes them again): no claim may get a gone node's GPU
        control_plane.kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")


@pytest.fixture
def recipe(gang_node: RealNode, tmp_path: Path) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]], Path]]:
    """The page's two blocks: the namespace, template and holder; the PodGroup and its pods; a directory holding
    them as the page's files, pinned to the node. Deleted after."""
    blocks = page_blocks()
    assert len(blocks) == 2, f"{PAGE} should have two YAML blocks, has {len(blocks)}"
    setup, gang = blocks
    workloads = Workloads(gang_node)
    Console(tmp_path, gang_node.control_plane.kubeconfig, []).write_files(
        PAGE.name, rewrite=lambda text: yaml.safe_dump_all([pin_to(doc, NODE) for doc in documents(text)])
    )
    yield setup, gang, tmp_path
    workloads.delete([*reversed(gang), *reversed(setup[1:])])
    workloads.delete(setup[:1])  # the namespace last: its deletion waits for what is left in it


def assert_none_scheduled(workloads: Workloads, pods: list[dict[str, Any]]) -> list[str]:
    """Every pod of the gang unbound and Unschedulable, its claim made but not allocated, the PodGroup
    Unschedulable for its minCount; the pods' PodScheduled messages."""
    kube = workloads.kube
    condition = wait_for("the scheduler's verdict on the gang", lambda: group_condition(kube), TIMEOUT)
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    # As 1.37 words it: "minCount (4) cannot be satisfied: 3 scheduled, 0 remaining, pod group preemption: ...".
    assert condition["message"].startswith("minCount (4) cannot be satisfied: 3 scheduled"), condition
    messages = []
    for doc in pods:
        name = doc["metadata"]["name"]
        pod = wait_for(f"pod {name} to be marked unschedulable",
                       lambda n=name: unschedulable(kube.get("pods", n, NAMESPACE)), TIMEOUT)  # fmt: skip
        assert not pod["spec"].get("nodeName"), f"pod {name} was bound to {pod['spec']['nodeName']}"
        claims = claims_of(kube, pod)
        assert len(claims) == 1, f"pod {name}: {claims}"
        assert not claims[0].get("status", {}).get("allocation"), f"{name}'s claim was allocated: {claims[0]}"
        scheduled = pod_scheduled(pod)
        assert scheduled is not None
        messages.append(scheduled.get("message", ""))
    return messages


def unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    condition = pod_scheduled(pod)
    return pod if condition and (condition["status"], condition.get("reason")) == ("False", "Unschedulable") else None


def allocated_gpu(kube: Kube, pod: dict[str, Any]) -> tuple[str, str]:
    """(pool, device) of the pod's one claim: a GPU of our driver on the gang's node."""
    (claim,) = claims_of(kube, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, NODE), result
    return result["pool"], result["device"]


def explain(node: RealNode, pod: str) -> subprocess.CompletedProcess[str]:
    """`dradriver explain --pod` on one worker, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "dradriver", "explain", "--pod", f"{NAMESPACE}/{pod}",
         "--kubeconfig", str(node.control_plane.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_gang_of_four_waits_for_a_fourth_gpu_then_all_four_start(
    gang_node: RealNode, recipe: tuple[list[dict[str, Any]], list[dict[str, Any]], Path]
) -> None:
    setup, gang, directory = recipe
    workloads = Workloads(gang_node)
    kube = workloads.kube
    assert [p["metadata"]["name"] for p in named(setup, "Pod")] == [HOLDER]
    pods = named(gang, "Pod")
    assert [p["metadata"]["name"] for p in pods] == [f"worker-{i}" for i in range(4)]
    assert named(gang, "PodGroup")[0]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}

    shell = console(gang_node, directory, "## Three free GPUs: none of the four is placed")
    shell.next("kubectl apply -f holder.yaml")
    shell.next("kubectl -n gang-demo wait --for=condition=Ready pod/gpu-holder --timeout=120s")
    shell.next("kubectl apply -f gang.yaml")
    messages = assert_none_scheduled(workloads, pods)
    shell.next("kubectl -n gang-demo get pods")
    shell.next("kubectl -n gang-demo get resourceclaims")
    shell.next(PODGROUP_CONDITION)
    shell.check()
    # The three pods that fitted are turned away for the gang's sake, the fourth for want of a GPU.
    gang_said = "pod group is unschedulable, minCount (4) cannot be satisfied"
    assert any(m.startswith(gang_said) for m in messages), messages
    assert all(m.startswith(gang_said) or "cannot allocate all claims" in m for m in messages), messages
    events = [e for doc in pods for e in workloads.events(kube.get("pods", doc["metadata"]["name"], NAMESPACE))]
    assert any(e.startswith(f"FailedScheduling: {gang_said}") for e in events), events
    # explain judges one pod's claim, not the gang: each worker's GPU alone would fit.
    explained = explain(gang_node, "worker-0")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert f"fits on node {NODE}" in explained.stdout, explained.stdout
    assert "3 not allocated to other claims" in explained.stdout, explained.stdout

    fourth = console(gang_node, directory, "## A fourth GPU: all four start")
    fourth.next("kubectl -n gang-demo delete pod gpu-holder")
    wait_gone(kube, "pods", HOLDER, NAMESPACE)
    running = [workloads.wait_running(doc, TIMEOUT)[0] for doc in pods]
    fourth.next(PODS_AND_NODES)
    fourth.next("kubectl -n gang-demo get resourceclaims")
    fourth.next("kubectl -n gang-demo get podgroup training -o jsonpath='{.status.conditions[0].reason}'")
    fourth.check()
    assert {p["spec"]["nodeName"] for p in running} == {NODE}
    gpus = {allocated_gpu(kube, pod) for pod in running}
    assert len(gpus) == 4, f"four pods, four different GPUs: {gpus}"
    for pod in running:  # prepared by our driver: its CDI spec for the claim is on the node
        (claim,) = claims_of(kube, pod)
        assert cdi_specs_of(gang_node, claim["metadata"]["uid"]), f"no CDI spec for {claim['metadata']['name']}"
    condition = group_condition(kube)
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", "Scheduled"), condition
