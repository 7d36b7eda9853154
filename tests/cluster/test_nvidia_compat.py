"""Manifests written for NVIDIA's DRA driver (examples/nvidia), unedited, through the real scheduler: nodes run
`dradriver run --compat nvidia`, NVIDIA's DeviceClasses are those the chart installs with compat=nvidia, the scheduler
allocates each claim from the slices published as gpu.nvidia.com, and our plugin prepares it (configs of
resource.nvidia.com/v1beta1 included) and unprepares it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_node import SimNode, remove_nodes
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.driver.prepare.presets import NVIDIA
from dradriver.plugin.kubeletplugin.kubelet_client import Claim

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "examples" / "nvidia").glob("*.yaml"))
# (node, profile, MIG mode): every "# Node:" header of the manifests has one.
NODES = (("nv-mixed-static", "mixed", "static"), ("nv-mixed", "mixed", "none"), ("nv-dgx", "dgx-a100-40gb", "dynamic"))


@pytest.fixture(scope="module")
def nvidia_nodes(control_plane: ControlPlane, kube: Kube) -> Iterator[dict[tuple[str, str], SimNode]]:
    # NVIDIA's DeviceClasses, as the chart installs them with compat=nvidia (tests/test_chart.py checks the two agree),
    # less the extended resource name: the session's gpu.dradriver.dev already maps nvidia.com/gpu, and deleting a
    # second class with that name makes kube-scheduler 1.37 forget the mapping for good (kubernetes/kubernetes#141103,
    # docs/troubleshooting.md), which failed e2e scenario 11's `nvidia.com/gpu: 1` pod after this module.
    created: list[str] = []
    started: dict[tuple[str, str], SimNode] = {}
    try:
        for device_class in NVIDIA.device_classes():
            device_class["spec"].pop("extendedResourceName", None)
            name = device_class["metadata"]["name"]
            if not [c for c in kube.list("deviceclasses") if c["metadata"]["name"] == name]:
                kube.create("deviceclasses", device_class)
                created.append(name)
        for name, profile, mig_mode in NODES:
            started[(profile, mig_mode)] = SimNode.start(
                kube,
                control_plane.kubeconfig,
                control_plane.root / name,
                name,
                profile=profile,
                mig_mode=mig_mode,
                extra=("--compat", "nvidia"),
            )
        yield started
    finally:
        remove_nodes(started.values(), kube, control_plane.logs)
        for name in created:
            kube.delete("deviceclasses", name)


def claim_specs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each claim of a manifest as (name, claim spec), templates and claims alike."""
    found = []
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        if doc["kind"] == "ResourceClaimTemplate":
            found.append((doc["metadata"]["name"], doc["spec"]["spec"]))
        elif doc["kind"] == "ResourceClaim":
            found.append((doc["metadata"]["name"], doc["spec"]))
    return found


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_nvidia_manifests_are_scheduled_and_prepared_unedited(
    path: Path, nvidia_nodes: dict[tuple[str, str], SimNode], kube: Kube
) -> None:
    match = re.search(r"^# Node: (\S+) --mig-mode (\S+)$", path.read_text(), re.M)
    assert match
    node = nvidia_nodes[(match[1], match[2])]
    for index, (name, spec) in enumerate(claim_specs(path)):
        template = f"nv-{path.stem[:2]}-{index}"
        kube.create(
            "resourceclaimtemplates",
            {"metadata": {"name": template, "namespace": NAMESPACE, "labels": {"from": name}}, "spec": {"spec": spec}},
            NAMESPACE,
        )
        pod = GatedPod(kube, f"{template}-pod", template, node=node.name).create()
        try:
            assert pod.release() == "scheduled", pod.get().get("status")
            claim = pod.claim()
            allocated = allocated_devices(claim)
            assert allocated and {driver for driver, _, _ in allocated} == {NVIDIA.driver_name}, allocated
            uid = claim["metadata"]["uid"]
            prepared = node.kubelet.prepare(pod.get())[uid]
            assert prepared.error == "", prepared.error
            assert sorted(d["device_name"] for d in prepared.devices) == sorted(d for _, _, d in allocated)
            assert node.kubelet.unprepare([Claim(NAMESPACE, claim["metadata"]["name"], uid)]) == {uid: ""}
        finally:
            pod.delete()
            kube.delete("resourceclaimtemplates", template, NAMESPACE)
