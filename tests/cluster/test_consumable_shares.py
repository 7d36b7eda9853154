"""NVIDIA's consumable shares (`dradriver run --consumable-shares memory|unlimited|N`) through the real scheduler:
in every mode two claims land on one whole GPU and on one MIG device, and our plugin prepares both shares, each
kept apart as its config says (MPS with limits from what it took, TimeSlicing, or nothing), and unprepares them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.cluster_node import SimNode, remove_nodes
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.plugin.kubeletplugin.kubelet_client import Claim

MODES = ("memory", "unlimited", "4")
DOMAIN = "gpu.dradriver.dev"
# One L4 and the one 1g.5gb MIG device of the "mixed" node (static MIG): both claims must share them.
DEVICES = {
    "gpu": ("gpu.dradriver.dev", 'device.attributes["resource.kubernetes.io"].pciBusID == "0000:87:00.0"', "GpuConfig"),
    "mig": ("mig.dradriver.dev", f'device.attributes["{DOMAIN}"].profile == "1g.5gb"', "MigDeviceConfig"),
}
# How each mode's shares are kept apart, per device kind (None: not at all).
STRATEGIES: dict[tuple[str, str], str | None] = {
    ("memory", "gpu"): "MPS",
    ("memory", "mig"): "MPS",
    ("unlimited", "gpu"): None,
    ("unlimited", "mig"): None,
    ("4", "gpu"): "TimeSlicing",
    ("4", "mig"): "MPS",
}


@pytest.fixture(scope="module")
def share_nodes(control_plane: ControlPlane, kube: Kube, device_classes: None) -> Iterator[dict[str, SimNode]]:
    started: dict[str, SimNode] = {}
    try:
        for mode in MODES:
            name = f"shares-{mode}"
            started[mode] = SimNode.start(
                kube,
                control_plane.kubeconfig,
                control_plane.root / name,
                name,
                profile="mixed",
                mig_mode="static",
                extra=("--consumable-shares", mode),
            )
        yield started
    finally:
        remove_nodes(started.values(), kube, control_plane.logs)


def template_spec(mode: str, kind: str) -> dict[str, Any]:
    device_class, selector, config_kind = DEVICES[kind]
    exactly: dict[str, Any] = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]}
    if mode == "memory":
        exactly["capacity"] = {"requests": {"memory": "2Gi"}}  # the default is the whole memory: one claim only
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
    strategy = STRATEGIES[(mode, kind)]
    if strategy is not None:
        parameters = {
            "apiVersion": "gpu.dradriver.dev/v1alpha1",
            "kind": config_kind,
            "sharing": {"strategy": strategy},
        }
        spec["devices"]["config"] = [{"opaque": {"driver": DOMAIN, "parameters": parameters}}]
    return spec


@pytest.mark.parametrize("kind", list(DEVICES))
@pytest.mark.parametrize("mode", MODES)
def test_two_claims_share_one_device_in_every_mode(
    mode: str, kind: str, share_nodes: dict[str, SimNode], kube: Kube
) -> None:
    node = share_nodes[mode]
    template = f"shares-{mode}-{kind}"
    kube.create(
        "resourceclaimtemplates",
        {"metadata": {"name": template, "namespace": NAMESPACE}, "spec": {"spec": template_spec(mode, kind)}},
        NAMESPACE,
    )
    pods = [GatedPod(kube, f"{template}-{i}", template, node=node.name).create() for i in range(2)]
    try:
        assert [p.release() for p in pods] == ["scheduled", "scheduled"], [p.get().get("status") for p in pods]
        claims = [p.claim() for p in pods]
        devices = [allocated_devices(c) for c in claims]
        assert devices[0] == devices[1] and len(devices[0]) == 1, devices
        for pod, claim in zip(pods, claims, strict=True):
            prepared = node.kubelet.prepare(pod.get())[claim["metadata"]["uid"]]
            assert prepared.error == "", prepared.error
        for claim in claims:
            uid = claim["metadata"]["uid"]
            assert node.kubelet.unprepare([Claim(NAMESPACE, claim["metadata"]["name"], uid)]) == {uid: ""}
    finally:
        for pod in pods:
            pod.delete()
        kube.delete("resourceclaimtemplates", template, NAMESPACE)
