"""Manifests written for NVIDIA's DRA driver (examples/nvidia, as NODE_TEST_MANIFESTS lists them), unedited, in
containers on a real kubelet and containerd: a node of its own whose driver runs `dradriver run --compat nvidia`
(driver gpu.nvidia.com, NVIDIA's DeviceClasses). Each manifest's pods become Ready, every container prints what
its claims' CDI specs give it and has their device nodes, and deleting the manifest unprepares every claim.

The node is not the other node tests' (Node localhost): it is Node nvidia-compat for this module alone, so its
driver, its classes and its slices never meet theirs. The API server cannot reach a kubelet by that name for
`kubectl logs` (docs/node-tests.md), so containers' output is read from the kubelet's pod log files."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster_fixtures import running_node
from support.control_plane import ControlPlane
from support.kube_rest import Kube
from support.node_pods import Workloads, cdi_specs_of, claims_of, documents, pod_spec_of, status_devices, unprepared
from support.real_node import RealNode, wait_for
from test_nvidia_examples import NODE_TEST_MANIFESTS

from dradriver.driver.prepare.presets import NVIDIA
from node.test_pods import edits_of, spec_of

NODE = "nvidia-compat"
NAMESPACE = "nvidia-compat"  # the manifests' own namespace (default) holds names the e2e scenarios use too


def slices_with_devices(kube: Kube) -> bool:
    found = kube.list("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
    return any(s["spec"].get("devices") for s in found if s["spec"]["driver"] == NVIDIA.driver_name)


def use(node: RealNode, profile: str, mig_mode: str) -> None:
    """Give the node the simulated GPUs a manifest's ``# Node:`` header names: the driver started again on a fresh
    simulated machine, its old slices gone before the new ones are published (the scheduler must never allocate
    a device of the previous machine)."""
    if (node.profile, node.mig_mode) == (profile, mig_mode) and node.driver.proc.poll() is None:
        return
    for driver in node.drivers:
        if driver.proc.poll() is None:
            node.stop_driver(driver)
    assert node.prepared_claims() == [], f"claims still prepared on {NODE}: {node.prepared_claims()}"
    (node.root / "driver" / "sim.json").unlink(missing_ok=True)
    node.kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
    node.profile, node.mig_mode = profile, mig_mode
    node.start_driver()
    wait_for(f"slices of {NODE} for {profile} --mig-mode {mig_mode}", lambda: slices_with_devices(node.kube), 60)


@pytest.fixture(scope="module")
def compat_node(control_plane: ControlPlane, kube: Kube) -> Iterator[RealNode]:
    # NVIDIA's DeviceClasses, as the chart installs them with compat=nvidia, less the extended resource name (the
    # session's gpu.dradriver.dev maps nvidia.com/gpu, and deleting a second class with that name makes
    # kube-scheduler 1.37 forget the mapping: kubernetes/kubernetes#141103, docs/troubleshooting.md); removed at
    # the end.
    created: list[str] = []
    existing = {c["metadata"]["name"] for c in kube.list("deviceclasses")}
    try:
        for device_class in NVIDIA.device_classes():
            device_class["spec"].pop("extendedResourceName", None)
            if device_class["metadata"]["name"] not in existing:
                kube.create("deviceclasses", device_class)
                created.append(device_class["metadata"]["name"])
        if kube.find("namespaces", NAMESPACE) is None:
            kube.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        _, profile, mig_mode, _ = NODE_TEST_MANIFESTS[0]
        settings = {"profile": profile, "mig_mode": mig_mode, "driver_args": ("--compat", "nvidia")}
        with running_node(control_plane, name=NODE, driver_name=NVIDIA.driver_name, **settings) as node:
            yield node
    finally:
        # After the driver stopped (a running one would publish them again); the Node's deletion would collect them.
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
        for name in created:
            kube.delete("deviceclasses", name)


def container_devices(node: RealNode, pod: dict[str, Any]) -> dict[str, set[str]]:
    """Each container's device nodes among those the pod's CDI specs name, seen in its root file system."""
    pids = node.container_pids()
    wanted = {
        n["path"]
        for claim in claims_of(node.kube, pod)
        for edits in edits_of(spec_of(node, claim["metadata"]["uid"]))
        for n in edits.get("deviceNodes", [])
    }
    seen = {}
    for status in pod["status"]["containerStatuses"]:
        root = Path(f"/proc/{pids[status['containerID'].removeprefix('containerd://')]}/root")
        seen[status["name"]] = {path for path in wanted if (root / path.lstrip("/")).exists()}
    return seen


def claim_env(node: RealNode, claim: dict[str, Any]) -> set[str]:
    """The variables (NAME=value) the claim's CDI spec gives its containers."""
    return {e for edits in edits_of(spec_of(node, claim["metadata"]["uid"])) for e in edits.get("env", [])}


def check_pod(node: RealNode, pod: dict[str, Any], expect: str) -> list[dict[str, Any]]:
    """Every container of ``pod`` printed the manifest's expected line, only variables its claims' CDI specs give,
    and has device nodes they name; the pod's claims are returned."""
    owned = claims_of(node.kube, pod)
    assert owned, f"pod {pod['metadata']['name']} has no claim"
    given = set().union(*(claim_env(node, c) for c in owned))
    devices = container_devices(node, pod)
    output: dict[str, list[str]] = wait_for(
        f"the output of pod {pod['metadata']['name']}'s containers",
        lambda: (out := node.container_output(pod)) and all(out.values()) and out,
        30,
    )
    for container, lines in output.items():
        assert any(re.search(expect, line) for line in lines), (container, expect, lines)
        shown = {line for line in lines if line.startswith(("DRADRIVER_", "CUDA_MPS_"))}
        assert shown and shown <= given, (container, shown - given, given)
        assert devices[container], f"container {container} has none of its CDI specs' device nodes"
    return owned


def in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``doc`` placed in ``namespace`` instead of ``default`` (as `kubectl apply -n` would place a manifest that
    names none): the e2e scenarios, applied to the same control plane meanwhile, use some of the same names."""
    placed = copy.deepcopy(doc)
    placed["metadata"]["namespace"] = namespace
    return placed


@pytest.mark.parametrize("manifest", NODE_TEST_MANIFESTS, ids=[m[0].stem for m in NODE_TEST_MANIFESTS])
def test_an_nvidia_manifest_runs_unedited_in_containers_and_unprepares(
    compat_node: RealNode, kube: Kube, manifest: tuple[Path, str, str, str]
) -> None:
    path, profile, mig_mode, expect = manifest
    use(compat_node, profile, mig_mode)
    workloads = Workloads(compat_node)
    docs = [in_namespace(doc, NAMESPACE) for doc in documents(path)]
    workloads.apply(docs)
    claims: dict[str, dict[str, Any]] = {}
    try:
        pods = [p for doc in docs if pod_spec_of(doc) is not None for p in workloads.wait_running(doc)]
        for pod in pods:
            claims.update({c["metadata"]["uid"]: c for c in check_pod(compat_node, pod, expect)})
        for uid, claim in claims.items():
            devices_in_status = status_devices(kube, claim)
            assert devices_in_status and {d["driver"] for d in devices_in_status} == {NVIDIA.driver_name}
            assert cdi_specs_of(compat_node, uid), f"claim {claim['metadata']['name']} has no CDI spec"
    finally:
        workloads.delete(reversed(docs))
    names = sorted(c["metadata"]["name"] for c in claims.values())
    wait_for(f"the kubelet to unprepare claims {names}",
             lambda: all(unprepared(compat_node, uid) for uid in claims), 90)  # fmt: skip
    wait_for(f"status.devices of claims {names} to be cleared",
             lambda: all(status_devices(kube, claim) == [] for claim in claims.values()), 30)  # fmt: skip
    assert compat_node.prepared_claims() == []
