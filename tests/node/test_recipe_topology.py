"""The topology recipe (docs/recipes/topology.md) on a real kubelet and containerd: a second DRA driver for NICs
(``scripts/build-nic-driver``, support/nic_driver.py) registered beside ours with the same kubelet, publishing
NICs under the PCIe roots of the session node's simulated ``mixed`` GPUs. A claim with ``matchAttribute:
resource.kubernetes.io/pcieRoot`` across a GPU request and a NIC request gets a GPU and a NIC under one root, one
with ``numaNode`` a GPU and two NICs on one NUMA node; without the constraint the same claim gets a NIC elsewhere,
and NUMA node 0's one NIC cannot make a pair. Each pod's container shows both drivers' CDI edits. The manifests
are the page's ``# file:`` blocks, applied as written (pinned to the node by support/node_pods.py); the commands of
the page's two sections that run pods are run as written, in a directory holding those files, and must print
what the page shows."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.nic_driver import NIC_DRIVER, NICS, NicDriver, running_nic_driver
from support.node_pods import Workloads, claims_of, pin_to, wait_gone
from support.real_node import RealNode, wait_for
from support.recipe_pages import Console, documents, page_files, transcript

PAGE = "topology.md"
GPU_DRIVER = "gpu.dradriver.dev"
ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"
#: The page's listing of every claim's allocated devices.
ALLOCATED_DEVICES = (
    "kubectl get resourceclaim -o jsonpath='{range .items[*].status.allocation.devices.results[*]}{.request} "
    '{.driver} {.device}{"\\n"}{end}\''
)


@pytest.fixture(scope="module")
def nic_driver(node: RealNode) -> Iterator[NicDriver]:
    with running_nic_driver(node) as driver:
        yield driver


@pytest.fixture(scope="module")
def page_directory(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the page's files, their pods pinned to the node."""
    directory = tmp_path_factory.mktemp("topology")
    Console(directory, node.control_plane.kubeconfig, []).write_files(
        PAGE, rewrite=lambda text: yaml.safe_dump_all([pin_to(doc, node.name) for doc in documents(text)])
    )
    return directory


def console(node: RealNode, directory: Path, section: str) -> Console:
    return Console(directory, node.control_plane.kubeconfig, transcript(PAGE, section), timeout=120)


def attributes(node: RealNode) -> dict[tuple[str, str], dict[str, Any]]:
    """(driver, device) -> the device's attributes, from every slice of the node."""
    found = node.kube.list("resourceslices", fieldSelector=f"spec.nodeName={node.name}")
    return {
        (item["spec"]["driver"], device["name"]): device.get("attributes", {})
        for item in found
        for device in item["spec"].get("devices", [])
    }


def value(attribute: dict[str, Any]) -> Any:
    """An attribute's one value (string, int, …)."""
    [only] = attribute.values()
    return only


def file_docs(name: str) -> list[dict[str, Any]]:
    return documents(page_files(PAGE)[name])


def run_pod(workloads: Workloads, docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Apply ``docs``, wait for their pod to run; the allocation's results and the container's output."""
    workloads.apply(docs)
    [pod_doc] = [doc for doc in docs if doc["kind"] == "Pod"]
    [pod] = workloads.wait_running(pod_doc)
    [claim] = claims_of(workloads.kube, pod)
    output = wait_for("the container's report", lambda: workloads.logs(pod) if "NIC_" in workloads.logs(pod) else "")
    return claim["status"]["allocation"]["devices"]["results"], output


@pytest.fixture
def applied(workloads: Workloads) -> Iterator[list[list[dict[str, Any]]]]:
    """What a test applied (append its documents), deleted after it."""
    done: list[list[dict[str, Any]]] = []
    yield done
    for docs in reversed(done):
        workloads.delete(reversed(docs))
        for doc in docs:
            if doc["kind"] == "Pod":
                wait_gone(workloads.kube, "pods", doc["metadata"]["name"], "default")


def test_the_nic_driver_publishes_its_nics_with_the_standard_attributes(node: RealNode, nic_driver: NicDriver) -> None:
    published = attributes(node)
    for nic in NICS:
        attrs = published[(NIC_DRIVER, nic.device_name)]
        assert value(attrs[ROOT]) == nic.pcie_root, attrs
        assert value(attrs[NUMA]) == nic.numa_node, attrs
        assert value(attrs["resource.kubernetes.io/pciBusID"]) == nic.bus_id, attrs
    gpu_roots = {value(a[ROOT]) for (driver, _), a in published.items() if driver == GPU_DRIVER and ROOT in a}
    # Our GPUs publish the same attribute, and two of the NICs' roots are GPU roots: there are aligned pairs.
    assert {nic.pcie_root for nic in NICS} & gpu_roots == {"pci0000:00", "pci0000:80"}, gpu_roots


def test_a_claim_matching_pcie_root_gets_a_gpu_and_a_nic_under_one_root(
    node: RealNode,
    nic_driver: NicDriver,
    workloads: Workloads,
    applied: list[list[dict[str, Any]]],
    page_directory: Path,
) -> None:
    docs = file_docs("gpu-and-nic-same-root.yaml")
    applied.append(docs)  # deleted after the test, should it fail before the page deletes them
    shell = console(node, page_directory, "## A GPU and a NIC on one PCIe root")
    shell.next("kubectl apply -f gpu-and-nic-same-root.yaml")
    shell.next("kubectl wait --for=condition=Ready pod/gpu-and-nic-same-root --timeout=120s")
    shell.next(ALLOCATED_DEVICES)
    output = shell.next("kubectl logs gpu-and-nic-same-root")
    [pod] = workloads.pods_of(docs[-1])
    [claim] = claims_of(workloads.kube, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    by_request = {r["request"]: r for r in results}
    assert sorted(by_request) == ["gpu", "nic"], results
    published = attributes(node)
    gpu = published[(GPU_DRIVER, by_request["gpu"]["device"])]
    nic = published[(NIC_DRIVER, by_request["nic"]["device"])]
    assert by_request["nic"]["driver"] == NIC_DRIVER
    assert value(gpu[ROOT]) == value(nic[ROOT]) == "pci0000:80", (gpu, nic)
    # The container got both: our GPU's variables and the NIC driver's CDI edit.
    assert "NIC_ENS2F0=0000:8c:00.0" in output, output
    assert "DRADRIVER_DEVICE_" in output, output
    # The page frees the pair before its next section, which needs the same L4 and NIC.
    shell.next("kubectl delete -f gpu-and-nic-same-root.yaml")
    shell.check()


def renamed_copy(file: str, name: str, edit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """A copy of the page's ``file`` (a claim template and a pod using it), both renamed ``name``, the template's
    claim spec changed by ``edit``."""
    docs = copy.deepcopy(file_docs(file))
    for doc in docs:
        doc["metadata"]["name"] = name
        if doc["kind"] == "ResourceClaimTemplate":
            edit(doc["spec"]["spec"])
        else:
            doc["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = name
    return docs


def test_without_the_constraint_the_same_claim_gets_a_nic_under_another_root(
    node: RealNode, nic_driver: NicDriver, workloads: Workloads, applied: list[list[dict[str, Any]]]
) -> None:
    """The alignment above is the constraint's doing: the scheduler left to itself takes another NIC."""

    def without_constraints(claim_spec: dict[str, Any]) -> None:
        del claim_spec["devices"]["constraints"]

    docs = renamed_copy("gpu-and-nic-same-root.yaml", "gpu-and-nic-any-root", without_constraints)
    applied.append(docs)
    results, _ = run_pod(workloads, docs)
    by_request = {r["request"]: r for r in results}
    published = attributes(node)
    gpu = published[(GPU_DRIVER, by_request["gpu"]["device"])]
    nic = published[(NIC_DRIVER, by_request["nic"]["device"])]
    assert value(gpu[ROOT]) != value(nic[ROOT]), (gpu, nic)


def test_a_claim_matching_numa_node_gets_a_gpu_and_two_nics_on_one_numa_node(
    node: RealNode,
    nic_driver: NicDriver,
    workloads: Workloads,
    applied: list[list[dict[str, Any]]],
    page_directory: Path,
) -> None:
    docs = file_docs("gpu-and-nics-same-numa.yaml")
    applied.append(docs)
    shell = console(node, page_directory, "## A GPU and two NICs on one NUMA node")
    shell.next("kubectl apply -f gpu-and-nics-same-numa.yaml")
    shell.next("kubectl wait --for=condition=Ready pod/gpu-and-nics-same-numa --timeout=120s")
    shell.next(ALLOCATED_DEVICES)
    output = shell.next("kubectl logs gpu-and-nics-same-numa")
    shell.check()
    [pod] = workloads.pods_of(docs[-1])
    [claim] = claims_of(workloads.kube, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    published = attributes(node)
    devices = [published[(r["driver"], r["device"])] for r in results]
    assert sorted(r["driver"] for r in results) == [GPU_DRIVER, NIC_DRIVER, NIC_DRIVER], results
    assert {value(d[NUMA]) for d in devices} == {1}, devices
    # NUMA is the looser alignment: the two NICs are under two roots, one of them not the GPU's.
    assert {value(d[ROOT]) for d in devices} == {"pci0000:80", "pci0000:c0"}, devices
    assert "NIC_ENS2F0=0000:8c:00.0" in output and "NIC_ENS3F0=0000:c4:00.0" in output, output


def test_a_numa_node_with_one_nic_cannot_make_a_gpu_and_two_nics(
    node: RealNode, nic_driver: NicDriver, workloads: Workloads, applied: list[list[dict[str, Any]]]
) -> None:
    def on_the_a100(claim_spec: dict[str, Any]) -> None:
        [gpu] = [r for r in claim_spec["devices"]["requests"] if r["name"] == "gpu"]
        gpu["exactly"]["selectors"][0]["cel"]["expression"] = (
            'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA A100-SXM4-40GB"'
        )

    docs = renamed_copy("gpu-and-nics-same-numa.yaml", "a100-and-nics-same-numa", on_the_a100)
    applied.append(docs)
    workloads.apply(docs)
    [pod_doc] = [doc for doc in docs if doc["kind"] == "Pod"]

    def unschedulable() -> str:
        pods = workloads.pods_of(pod_doc)
        conditions = pods[0].get("status", {}).get("conditions") or [] if pods else []
        scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return str(scheduled.get("message", "")) if scheduled.get("reason") == "Unschedulable" else ""

    message = wait_for("the scheduler to give up on the pod", unschedulable, 60)
    assert "cannot allocate all claims" in message, message
    [pod] = workloads.pods_of(pod_doc)
    assert not pod["spec"].get("nodeName")
